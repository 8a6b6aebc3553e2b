/* `dhp export-weights CKPT -o DIR`: a dhp checkpoint (run_ckpt.c: one
 * safetensors file per module, whole tensors named "<module>.<tensor>", plus
 * AdamW moments) written back in the Hugging Face layout: the weights under
 * their transformers names (hf_names.c), q / k / v fused back where the
 * architecture fuses them, in out/model.safetensors with the
 * {"format": "pt"} metadata transformers' loader requires
 * (modeling_utils.py, load_state_dict), and out/config.json. */
#include "executor/executor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CKPT_FORMAT "dhp.ckpt/1"   /* run_ckpt.c's */

typedef struct {
    ex_named_tensor *t;
    int n, cap;
} out_set;

static void out_free(out_set *o)
{
    for (int i = 0; i < o->n; i++) { util_free((char *)o->t[i].name); util_free(o->t[i].data); }
    util_free(o->t);
}

/* The output tensor `r` names (created zeroed on first use). */
static ex_named_tensor *out_tensor(out_set *o, const ex_hf_ref *r)
{
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->t[i].name, r->name)) return &o->t[i];
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 64;
        ex_named_tensor *t = util_realloc(o->t, (size_t)cap * sizeof *t);
        if (!t) return NULL;
        o->t = t;
        o->cap = cap;
    }
    int64_t numel = 1;
    for (int d = 0; d < r->ndim; d++) numel *= r->shape[d];
    ex_named_tensor *t = &o->t[o->n];
    memset(t, 0, sizeof *t);
    t->name = util_strdup(r->name);
    t->data = util_calloc((size_t)(numel > 0 ? numel : 1), sizeof(float));
    if (!t->name || !t->data) { util_free((char *)t->name); util_free(t->data); return NULL; }
    t->dtype = EX_DT_F32;
    t->ndim = r->ndim;
    memcpy(t->shape, r->shape, sizeof t->shape);
    o->n++;
    return t;
}

/* CKPT/latest's step directory, or CKPT itself. */
static int step_dir(const char *ckpt, char *out, size_t n, char *err)
{
    char path[4096 + 16], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/latest", ckpt);
    struct stat st;
    if (stat(path, &st) != 0) {
        if (snprintf(out, n, "%s", ckpt) >= (int)n) return util_fail(err, UTIL_EINVAL, "%s: path too long", ckpt);
        return UTIL_OK;
    }
    int rc = util_read_file(path, &text, &len, err);
    if (rc) return rc;
    char step[64] = "";
    if (sscanf(text, "%63s", step) != 1 || strncmp(step, "step-", 5) || strchr(step, '/'))
        rc = util_fail(err, UTIL_EINVAL, "%s: does not name a step directory", path);
    util_free(text);
    if (!rc && snprintf(out, n, "%s/%s", ckpt, step) >= (int)n) rc = util_fail(err, UTIL_EINVAL, "%s: path too long", ckpt);
    return rc;
}

/* Module k's weights from its checkpoint file into the output tensors. */
static int export_module(const char *dir, const model_t *m, int k, out_set *o, char *err)
{
    const model_module *mm = &m->mod[k];
    char path[4096 + 128];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, mm->name);
    ex_ckpt *c;
    int rc = ex_ckpt_open(path, &c, err);
    if (rc) return rc;
    const char *f = ex_ckpt_meta(c, "format"), *model = ex_ckpt_meta(c, "model");
    if (!f || strcmp(f, CKPT_FORMAT)) rc = util_fail(err, UTIL_EINVAL, "%s: not a dhp checkpoint (%s)", path, CKPT_FORMAT);
    else if (!model || strcmp(model, m->name))
        rc = util_fail(err, UTIL_EINVAL, "%s: holds model %s, not %s", path, model ? model : "?", m->name);
    int n = plan_module_tensors(mm, 1, 0, false, NULL, NULL, 0);
    plan_tensor *t = util_calloc((size_t)(n > 0 ? n : 1), sizeof *t);
    if (!rc && !t) rc = util_fail(err, UTIL_ENOMEM, "out of memory");
    if (!rc) plan_module_tensors(mm, 1, 0, false, NULL, t, n);
    for (int i = 0; !rc && i < n; i++) {
        ex_hf_ref r;
        char name[256];
        snprintf(name, sizeof name, "%s.%s", mm->name, t[i].name);
        const ex_ckpt_entry *e = ex_ckpt_find(c, name);
        int64_t rows = t[i].full[0], cols = t[i].ndim > 1 ? t[i].full[1] : 1;
        if (!e) { rc = util_fail(err, UTIL_EINVAL, "%s: tensor %s is missing", path, name); break; }
        if (e->ndim != t[i].ndim || e->shape[0] != rows || (t[i].ndim > 1 && e->shape[1] != cols)) {
            rc = util_fail(err, UTIL_EINVAL, "%s: tensor %s has another shape than model %s's", path, name, m->name);
            break;
        }
        rc = ex_hf_ref_of(m, mm, &t[i], &r, err);
        ex_named_tensor *dst = rc ? NULL : out_tensor(o, &r);
        if (!rc && !dst) rc = util_fail(err, UTIL_ENOMEM, "out of memory");
        if (!rc) rc = ex_ckpt_read_f32(c, e, dst->data + r.row0 * cols, (size_t)(rows * cols), err);
    }
    util_free(t);
    ex_ckpt_close(c);
    return rc;
}

static void add_ints(cJSON *o, const char *key, const int *v, int n)
{
    cJSON *a = cJSON_AddArrayToObject(o, key);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
}

/* o[key] = {"model_type": type}, a nested config (transformers' text_config, vision_config, audio_config). */
static cJSON *sub_config(cJSON *o, const char *key, const char *type)
{
    cJSON *c = cJSON_AddObjectToObject(o, key);
    cJSON_AddStringToObject(c, "model_type", type);
    return c;
}

/* The text model's fields (transformers Qwen2Config). */
static void text_config(cJSON *o, const model_module *l)
{
    cJSON_AddNumberToObject(o, "vocab_size", l->vocab);
    cJSON_AddNumberToObject(o, "hidden_size", l->hidden);
    cJSON_AddNumberToObject(o, "intermediate_size", l->ffn);
    cJSON_AddNumberToObject(o, "num_hidden_layers", l->layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", l->heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", l->kv_heads);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "rms_norm_eps", model_norm_eps(l));
    cJSON_AddNumberToObject(o, "rope_theta", l->rope_theta);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", l->tied_embeddings);
}

/* transformers' LlavaConfig: a Llama text_config, CLIPVisionConfig (all its
 * blocks: the ones after the feature layer are not written, transformers
 * initialises them and never reads them), the feature layer and the
 * "default" selection (the class row dropped). */
static void llava_config(cJSON *o, const model_module *l, const model_module *e)
{
    text_config(sub_config(o, "text_config", "llama"), l);
    cJSON *v = sub_config(o, "vision_config", "clip_vision_model");
    cJSON_AddNumberToObject(v, "hidden_size", e->hidden);
    cJSON_AddNumberToObject(v, "intermediate_size", e->ffn);
    cJSON_AddNumberToObject(v, "num_hidden_layers", e->layers + e->unused_layers);
    cJSON_AddNumberToObject(v, "num_attention_heads", e->heads);
    cJSON_AddNumberToObject(v, "num_channels", e->in_channels);
    cJSON_AddNumberToObject(v, "image_size", e->image_size);
    cJSON_AddNumberToObject(v, "patch_size", e->patch);
    cJSON_AddStringToObject(v, "hidden_act", e->ffn_kind == MODEL_FFN_QUICK_GELU ? "quick_gelu" : "gelu");
    cJSON_AddNumberToObject(v, "layer_norm_eps", model_norm_eps(e));
    cJSON_AddNumberToObject(o, "vision_feature_layer", -1 - e->unused_layers);
    cJSON_AddStringToObject(o, "vision_feature_select_strategy", "default");
    cJSON_AddStringToObject(o, "projector_hidden_act", "gelu");
}

/* The special token ids each architecture's config names (transformers'
 * Qwen2_5_VLConfig, Qwen2AudioConfig, LlavaConfig). */
static const struct { ex_hf_arch arch; model_token token; const char *key; } token_keys[] = {
    { EX_HF_QWEN2_5_VL, MODEL_TOK_IMAGE, "image_token_id" },
    { EX_HF_QWEN2_5_VL, MODEL_TOK_VIDEO, "video_token_id" },
    { EX_HF_QWEN2_5_VL, MODEL_TOK_VISION_START, "vision_start_token_id" },
    { EX_HF_QWEN2_5_VL, MODEL_TOK_VISION_END, "vision_end_token_id" },
    { EX_HF_QWEN2_AUDIO, MODEL_TOK_AUDIO, "audio_token_index" },
    { EX_HF_LLAVA, MODEL_TOK_IMAGE, "image_token_index" },
};

static void add_tokens(cJSON *o, const model_t *m, ex_hf_arch arch)
{
    for (size_t i = 0; i < sizeof token_keys / sizeof *token_keys; i++)
        if (token_keys[i].arch == arch && m->tokens[token_keys[i].token] >= 0)
            cJSON_AddNumberToObject(o, token_keys[i].key, m->tokens[token_keys[i].token]);
}

const char *ex_hf_missing_token(const model_t *m)
{
    ex_hf_arch arch;
    const char *type, *architecture;
    char err[UTIL_ERR_LEN];
    if (ex_hf_arch_of(m, &arch, &type, &architecture, err)) return NULL;
    for (size_t i = 0; i < sizeof token_keys / sizeof *token_keys; i++)
        if (token_keys[i].arch == arch && m->tokens[token_keys[i].token] < 0) return token_keys[i].key;
    return NULL;
}

/* config.json (transformers' Qwen2_5_VLConfig / Qwen2AudioConfig / LlavaConfig fields; the model_type is what
 * models/import_hf.c reads back). */
static char *config_text(const model_t *m, ex_hf_arch arch, const char *type, const char *architecture)
{
    cJSON *o = cJSON_CreateObject();
    add_ints(o, "architectures", NULL, 0);
    cJSON_AddItemToArray(cJSON_GetObjectItem(o, "architectures"), cJSON_CreateString(architecture));
    cJSON_AddStringToObject(o, "model_type", type);
    cJSON_AddStringToObject(o, "torch_dtype", "float32");
    add_tokens(o, m, arch);
    const model_module *l = &m->mod[m->llm], *e = NULL;
    for (int k = 0; k < m->n_modules; k++)
        if (k != m->llm) e = &m->mod[k];
    if (arch == EX_HF_QWEN2_5_VL) {
        text_config(o, l);
        if (l->n_mrope) {
            cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
            cJSON_AddStringToObject(rs, "type", "mrope");
            add_ints(rs, "mrope_section", l->mrope_section, l->n_mrope);
        }
        cJSON *v = cJSON_AddObjectToObject(o, "vision_config");
        cJSON_AddNumberToObject(v, "depth", e->layers);
        cJSON_AddNumberToObject(v, "hidden_size", e->hidden);
        cJSON_AddNumberToObject(v, "intermediate_size", e->ffn);
        cJSON_AddNumberToObject(v, "num_heads", e->heads);
        cJSON_AddNumberToObject(v, "in_channels", e->in_channels);
        cJSON_AddNumberToObject(v, "patch_size", e->patch);
        cJSON_AddNumberToObject(v, "spatial_merge_size", e->merge);
        cJSON_AddNumberToObject(v, "temporal_patch_size", e->temporal_patch);
        cJSON_AddNumberToObject(v, "out_hidden_size", e->out_hidden);
        cJSON_AddStringToObject(v, "hidden_act", "silu");
        /* window in patches back to pixels: its side is sqrt(window) patches */
        int side = 0;
        while ((side + 1) * (side + 1) <= e->window) side++;
        cJSON_AddNumberToObject(v, "window_size", side * e->patch);
        add_ints(v, "fullatt_block_indexes", e->full_layers, e->n_full_layers);
    } else if (arch == EX_HF_LLAVA) {
        llava_config(o, l, e);
    } else {
        text_config(sub_config(o, "text_config", "qwen2"), l);
        cJSON *a = sub_config(o, "audio_config", "qwen2_audio_encoder");
        cJSON_AddNumberToObject(a, "d_model", e->hidden);
        cJSON_AddNumberToObject(a, "encoder_layers", e->layers);
        cJSON_AddNumberToObject(a, "encoder_attention_heads", e->heads);
        cJSON_AddNumberToObject(a, "encoder_ffn_dim", e->ffn);
        cJSON_AddNumberToObject(a, "num_mel_bins", e->in_channels);
        cJSON_AddNumberToObject(a, "max_source_positions", e->max_positions);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

int ex_hf_export(const char *ckpt, const model_t *m, const char *out_dir, char *err)
{
    ex_hf_arch arch;
    const char *type, *architecture;
    char dir[4096 + 64];
    int rc = ex_hf_arch_of(m, &arch, &type, &architecture, err);
    if (!rc) rc = step_dir(ckpt, dir, sizeof dir, err);
    out_set o = { 0 };
    for (int k = 0; !rc && k < m->n_modules; k++) rc = export_module(dir, m, k, &o, err);
    if (!rc) rc = util_mkdir_p(out_dir, err);
    char path[4096 + 64];
    if (!rc) {
        snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
        const char *meta[] = { "format", "pt" };
        rc = ex_ckpt_write(path, o.t, o.n, meta, 1, err);
    }
    char *cfg = rc ? NULL : config_text(m, arch, type, architecture);
    if (!rc && !cfg) rc = util_fail(err, UTIL_ENOMEM, "out of memory");
    if (!rc) {
        snprintf(path, sizeof path, "%s/config.json", out_dir);
        size_t len = strlen(cfg);
        cfg[len] = '\n';   /* cJSON_Print's NUL becomes the file's last newline */
        rc = util_write_atomic(path, cfg, len + 1, err);
    }
    free(cfg);
    out_free(&o);
    return rc;
}
