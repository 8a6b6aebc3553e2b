/* Hugging Face checkpoint directories (executor/hf_weights.c, `dhp run
 * --init-from`): the input is model.safetensors.index.json beside one valid
 * shard; ex_hf_open parses its weight_map (shard names are file names in the
 * directory, nothing else), opens the shards it names and checks them
 * against a micro Qwen2.5-VL, then every tensor is read. */
#include "tests/fuzz/fuzz.h"
#include "executor/executor.h"

static const char *CONFIG =
    "{\"model_type\": \"qwen2_5_vl\", \"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 16,"
    " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"rope_theta\": 1000000.0,"
    " \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [1, 0, 1]},"
    " \"vision_config\": {\"depth\": 1, \"hidden_size\": 8, \"intermediate_size\": 16, \"num_heads\": 2,"
    " \"patch_size\": 2, \"spatial_merge_size\": 2, \"temporal_patch_size\": 1, \"window_size\": 4,"
    " \"out_hidden_size\": 8}}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char dir[128], path[200];
    static model_t m;
    char err[UTIL_ERR_LEN];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/hf", fuzz_dir());
        if (util_mkdir_p(dir, err) || model_import_hf(CONFIG, "config.json", &m, err)) abort();
        /* one shard holding two of the model's tensors (the others are missing: a refusal) */
        float w[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
        ex_named_tensor t[2] = { { "model.norm.weight", EX_DT_F32, 1, { 8 }, w },
                                 { "visual.blocks.0.norm1.weight", EX_DT_BF16, 1, { 8 }, w } };
        snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
        const char *meta[] = { "format", "pt" };
        if (ex_ckpt_write(path, t, 2, meta, 1, err)) abort();
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    }
    fuzz_write(path, data, size);
    ex_hf *h;
    if (ex_hf_open(dir, &m, &h, err) != UTIL_OK) return 0;
    for (int k = 0; k < m.n_modules; k++) {
        int n = plan_module_tensors(&m.mod[k], 1, 0, false, NULL, NULL, 0);
        plan_tensor *pt = util_calloc((size_t)n, sizeof *pt);
        if (!pt) abort();
        plan_module_tensors(&m.mod[k], 1, 0, false, NULL, pt, n);
        for (int i = 0; i < n; i++) {
            size_t numel = (size_t)(pt[i].full[0] * (pt[i].ndim > 1 ? pt[i].full[1] : 1));
            float *buf = util_malloc(numel * sizeof *buf);
            if (!buf) abort();
            (void)ex_hf_read(h, k, pt[i].name, buf, numel, err);
            util_free(buf);
        }
        util_free(pt);
    }
    ex_hf_close(h);
    return 0;
}
