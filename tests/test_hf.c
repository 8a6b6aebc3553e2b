/* Hugging Face checkpoints: the oracle against transformers' own
 * Qwen2.5-VL (driven by tests/t_hf_oracle.sh, which runs
 * tests/ref/hf_oracle.py first): its checkpoint loaded through ex_hf_open /
 * ex_hf_read into a whole (tp 1) model, dhp's loss and every parameter
 * gradient on the same batch against transformers'. */
#include "tests/test.h"
#include "executor/executor.h"
#include "tests/test_ex.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int json_int(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key)->valueint; }

/* Every parameter of em from checkpoint dir, into the weights (grads: into the gradients). */
static int load_all(ex_model *em, const model_t *m, const char *dir, bool grads, char *err)
{
    ex_hf *h;
    int rc = ex_hf_open(dir, m, &h, err);
    for (int i = 0; !rc && i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        const char *name = p.name + strlen(m->mod[p.module_index].name) + 1;
        rc = ex_hf_read(h, p.module_index, name, grads ? p.grad : p.data, (size_t)p.numel, err);
    }
    ex_hf_close(h);
    return rc;
}

static int64_t param_numel(ex_model *em, int i)
{
    ex_param p;
    ex_param_get(em, i, &p);
    return p.numel;
}

/* max |a - b| over max |b| of every tensor's gradient, worst tensor in *worst.
 * A gradient that vanishes in exact arithmetic is rounding noise on both
 * sides (a key bias without rotary positions, CLIP's: softmax ignores a
 * shift every key shares, so transformers' is ~1e-10): each tensor's scale
 * is at least 1e-4 of the model's largest gradient entry. */
static double grad_error(ex_model *em, const float *ref, const char *skip, char *worst, size_t n)
{
    double e = 0, floor = 0;
    int64_t total = ex_model_num_params(em);
    for (int64_t j = 0; j < total; j++) floor = fmax(floor, 1e-4 * fabs((double)ref[j]));
    size_t at = 0;
    for (int i = 0; i < ex_param_count(em); i++, at += (size_t)param_numel(em, i - 1)) {
        ex_param p;
        ex_param_get(em, i, &p);
        if (skip && !strcmp(p.name, skip)) continue;
        double d = 0, s = fmax(floor, 1e-12);
        for (int64_t j = 0; j < p.numel; j++) {
            d = fmax(d, fabs((double)p.grad[j] - ref[at + j]));
            s = fmax(s, fabs((double)ref[at + j]));
        }
        if (d / s > e) { e = d / s; snprintf(worst, n, "%s", p.name); }
    }
    return e;
}

/* dhp's gradients (in em) against transformers' in checkpoint dir grads:
 * the worst tensor's max |diff| / max |grad| (skip: a tensor left out). */
static int compare_grads(ex_model *em, const model_t *m, const char *grads, const char *skip, char *worst, size_t n,
                         double *gerr, char *err)
{
    int64_t total = ex_model_num_params(em);
    float *mine = malloc((size_t)total * sizeof *mine), *ref = malloc((size_t)total * sizeof *ref);
    for (size_t i = 0, at = 0; i < (size_t)ex_param_count(em); at += (size_t)param_numel(em, (int)i++)) {
        ex_param p;
        ex_param_get(em, (int)i, &p);
        memcpy(mine + at, p.grad, (size_t)p.numel * sizeof *mine);
    }
    int rc = load_all(em, m, grads, true, err);
    /* ref <- transformers', the gradients <- dhp's again */
    for (size_t i = 0, at = 0; !rc && i < (size_t)ex_param_count(em); at += (size_t)param_numel(em, (int)i++)) {
        ex_param p;
        ex_param_get(em, (int)i, &p);
        memcpy(ref + at, p.grad, (size_t)p.numel * sizeof *ref);
        memcpy(p.grad, mine + at, (size_t)p.numel * sizeof *mine);
    }
    *gerr = rc ? 1 : grad_error(em, ref, skip, worst, n);
    free(mine);
    free(ref);
    return rc;
}

static void oracle_case(const char *sub, const char *prefix)
{
    const char *dir = getenv("DHP_HF_ORACLE_DIR");
    if (!dir) { test_skip("driven by tests/t_hf_oracle.sh (needs DHP_HF_ORACLE_DIR)"); return; }
    char err[UTIL_ERR_LEN] = "", path[600];
    size_t n;
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    char file[3][64];
    snprintf(file[0], sizeof file[0], "%sbatch.json", prefix);
    snprintf(file[1], sizeof file[1], "%spixels.bin", prefix);
    snprintf(file[2], sizeof file[2], "%stokens.bin", prefix);
    char *cfg = test_read_all(path, "config.json", &n), *bj = test_read_all(dir, file[0], &n);
    float *pixels = test_read_all(dir, file[1], &n);
    int32_t *tokens = test_read_all(dir, file[2], &n);
    CHECK(cfg && bj && pixels && tokens);
    model_t m;
    CHECK_OK(model_import_hf(cfg, "config.json", &m, err));
    /* LLaVA-1.5's recipe freezes the CLIP tower (models/import_hf.c); transformers computes every gradient */
    for (int k = 0; k < m.n_modules; k++) m.mod[k].frozen = false;
    cJSON *b = cJSON_Parse(bj);
    CHECK(b != NULL);
    int B = json_int(b, "batch"), ipb[8];
    for (int s = 0; s < B && s < 8; s++) ipb[s] = 1;
    ex_batch batch = { .n_images = json_int(b, "n_images"), .patches = json_int(b, "patches"),
                       .grid_h = json_int(b, "grid_h"), .grid_w = json_int(b, "grid_w"), .pixels = pixels,
                       .batch = B, .text_tokens = json_int(b, "text_tokens"), .tokens = tokens,
                       .images_per_sample = ipb };
    double ref_loss = cJSON_GetObjectItemCaseSensitive(b, "loss")->valuedouble;
    ex_model *em;
    CHECK_OK(ex_model_create(&m, 1, &em, err));
    int rc = load_all(em, &m, path, false, err);
    float loss = 0;
    if (!rc) rc = ex_step_forward_backward(em, &batch, &loss, err);
    snprintf(path, sizeof path, "%s/%sgrads", dir, prefix);
    char worst[200] = "";
    double gerr = 1;
    if (!rc) rc = compare_grads(em, &m, path, NULL, worst, sizeof worst, &gerr, err);
    printf("hf_oracle %s: dhp loss %.9g, transformers %.9g (diff %.3g); gradients: worst %s, max |diff| / max |grad| %.3g\n",
           sub, (double)loss, ref_loss, fabs(loss - ref_loss), worst, gerr);
    ex_model_free(em);
    cJSON_Delete(b);
    util_free(cfg); util_free(bj); util_free(pixels); util_free(tokens);
    CHECK_MSG(rc == 0, "%s", err);
    /* fp32 both sides, different summation orders: agreement to a few ulps of the loss */
    CHECK_MSG(fabs(loss - ref_loss) <= 2e-5 * fabs(ref_loss), "loss %.9g vs transformers %.9g", (double)loss, ref_loss);
    CHECK_MSG(gerr <= 1e-4, "gradient of %s differs from transformers' by %.3g of its largest entry", worst, gerr);
}

TEST_DRIVEN(hf_oracle_qwen2_5_vl) { oracle_case("model", ""); }
/* the same weights in the shards save_pretrained writes with model.safetensors.index.json */
TEST_DRIVEN(hf_oracle_qwen2_5_vl_sharded) { oracle_case("sharded", ""); }
/* window attention (4 windows an image, layer 1 full): the true model, which
 * hands the merged tokens to the LLM in raster order (tests/ref/hf_oracle.py) */
TEST_DRIVEN(hf_oracle_qwen2_5_vl_windows) { oracle_case("window", "window_"); }

/* LLaVA: the CLIP tower read at layer -2 with the class row dropped, the
 * two-linear projector, a Llama LLM (executor/clip.c; tests/ref/hf_oracle.py) */
TEST_DRIVEN(hf_oracle_llava) { oracle_case("llava", "llava_"); }

/* Qwen2-Audio's audio tower and projector (transformers' Qwen2AudioEncoder,
 * multi_modal_projector) against dhp's audio encoder loaded through the
 * qwen2_audio names: the output rows, and every audio parameter's gradient
 * of sum(output * dout). */
TEST_DRIVEN(hf_oracle_qwen2_audio_encoder)
{
    const char *dir = getenv("DHP_HF_ORACLE_DIR");
    if (!dir) { test_skip("driven by tests/t_hf_oracle.sh (needs DHP_HF_ORACLE_DIR)"); return; }
    char err[UTIL_ERR_LEN] = "", path[600];
    size_t n, n_out;
    snprintf(path, sizeof path, "%s/audio", dir);
    char *cfg = test_read_all(path, "config.json", &n), *bj = test_read_all(dir, "audio_batch.json", &n);
    float *mel = test_read_all(dir, "audio_mel.bin", &n), *dout = test_read_all(dir, "audio_dout.bin", &n),
          *ref_out = test_read_all(dir, "audio_out.bin", &n_out);
    CHECK(cfg && bj && mel && dout && ref_out);
    model_t m;
    CHECK_OK(model_import_hf(cfg, "config.json", &m, err));
    int a = model_find_kind(&m, MODEL_AUDIO);
    CHECK(a >= 0);
    cJSON *b = cJSON_Parse(bj);
    CHECK(b != NULL);
    int clips = json_int(b, "n_audio"), aps[2] = { 1, clips - 1 };
    ex_batch batch = { .n_audio = clips, .mel_frames = json_int(b, "mel_frames"), .mel = mel, .audio_per_sample = aps,
                       .batch = 2 };
    ex_model *em;
    CHECK_OK(ex_model_create_modules(&m, 1, 1u << a, &em, err));
    int rc = load_all(em, &m, path, false, err), rows = 0;
    const float *out = NULL;
    if (!rc) rc = ex_audio_forward(em, &batch, &out, &rows, err);
    double oerr = 0, omax = 1e-12;
    size_t width = (size_t)m.mod[a].out_hidden;
    bool shape = !rc && (size_t)rows * width * sizeof(float) == n_out;
    for (size_t i = 0; shape && i < (size_t)rows * width; i++) {
        oerr = fmax(oerr, fabs((double)out[i] - ref_out[i]));
        omax = fmax(omax, fabs((double)ref_out[i]));
    }
    if (!rc) rc = ex_audio_backward(em, &batch, dout, err);
    /* transformers freezes the learned positions, and so does dhp (executor/audio.c): both gradients are 0 */
    const cJSON *fz = cJSON_GetObjectItemCaseSensitive(b, "frozen");
    bool positions_frozen = cJSON_GetArraySize(fz) == 1 && !strcmp(fz->child->valuestring, "audio_tower.embed_positions.weight");
    snprintf(path, sizeof path, "%s/audio_grads", dir);
    char worst[200] = "";
    double gerr = 1;
    if (!rc) rc = compare_grads(em, &m, path, NULL, worst, sizeof worst, &gerr, err);
    printf("hf_oracle audio: output max |diff| / max |out| %.3g over %d rows; gradients: worst %s, max |diff| / max |grad| %.3g\n",
           oerr / omax, rows, worst, gerr);
    ex_model_free(em);
    cJSON_Delete(b);
    util_free(cfg); util_free(bj); util_free(mel); util_free(dout); util_free(ref_out);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_MSG(positions_frozen, "transformers freezes other audio tensors than embed_positions");
    CHECK_MSG(shape, "dhp's %d rows x %zu do not match transformers' %zu bytes", rows, width, n_out);
    CHECK_MSG(oerr / omax <= 1e-5, "output differs from transformers' by %.3g of its largest entry", oerr / omax);
    CHECK_MSG(gerr <= 1e-4, "gradient of %s differs from transformers' by %.3g of its largest entry", worst, gerr);
}

/* The whole tiny Qwen2-Audio against transformers' loss: each sample's clip
 * (its pooled rows where the processor puts the expanded audio tokens), then
 * its text; dhp's loss and every parameter's gradient on the same batch. */
TEST_DRIVEN(hf_oracle_qwen2_audio)
{
    const char *dir = getenv("DHP_HF_ORACLE_DIR");
    if (!dir) { test_skip("driven by tests/t_hf_oracle.sh (needs DHP_HF_ORACLE_DIR)"); return; }
    char err[UTIL_ERR_LEN] = "", path[600];
    size_t n;
    snprintf(path, sizeof path, "%s/audio", dir);
    char *cfg = test_read_all(path, "config.json", &n), *bj = test_read_all(dir, "audio_llm_batch.json", &n);
    float *mel = test_read_all(dir, "audio_llm_mel.bin", &n);
    int32_t *tokens = test_read_all(dir, "audio_llm_tokens.bin", &n);
    CHECK(cfg && bj && mel && tokens);
    model_t m;
    CHECK_OK(model_import_hf(cfg, "config.json", &m, err));
    cJSON *b = cJSON_Parse(bj);
    CHECK(b != NULL);
    int B = json_int(b, "batch"), aps[8];
    for (int s = 0; s < B && s < 8; s++) aps[s] = 1;
    ex_batch batch = { .n_audio = B, .mel_frames = json_int(b, "mel_frames"), .mel = mel, .audio_per_sample = aps,
                       .batch = B, .text_tokens = json_int(b, "text_tokens"), .tokens = tokens };
    double ref_loss = cJSON_GetObjectItemCaseSensitive(b, "loss")->valuedouble;
    int want_rows = json_int(b, "audio_rows");
    ex_model *em;
    CHECK_OK(ex_model_create(&m, 1, &em, err));
    int rc = load_all(em, &m, path, false, err);
    float loss = 0;
    if (!rc) rc = ex_step_forward_backward(em, &batch, &loss, err);
    int rows = rc ? -1 : ex_audio_rows_per_clip(em, &batch);
    snprintf(path, sizeof path, "%s/audio_llm_grads", dir);
    char worst[200] = "";
    double gerr = 1;
    if (!rc) rc = compare_grads(em, &m, path, NULL, worst, sizeof worst, &gerr, err);
    printf("hf_oracle audio+llm: dhp loss %.9g, transformers %.9g (diff %.3g); gradients: worst %s, max |diff| / max |grad| %.3g\n",
           (double)loss, ref_loss, fabs(loss - ref_loss), worst, gerr);
    ex_model_free(em);
    cJSON_Delete(b);
    util_free(cfg); util_free(bj); util_free(mel); util_free(tokens);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(rows, want_rows);
    CHECK_MSG(fabs(loss - ref_loss) <= 2e-5 * fabs(ref_loss), "loss %.9g vs transformers %.9g", (double)loss, ref_loss);
    CHECK_MSG(gerr <= 1e-4, "gradient of %s differs from transformers' by %.3g of its largest entry", worst, gerr);
}
