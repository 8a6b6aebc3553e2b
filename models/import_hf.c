/* Hugging Face config.json -> model_t. Field names, defaults for absent keys
 * and the fixed parts of each architecture (which linears carry biases,
 * which norms exist) follow the transformers configuration and modeling
 * files of each model_type:
 *   src/transformers/models/<type>/configuration_<type>.py, modeling_<type>.py
 * and, for internvl_chat, OpenGVLab/InternVL internvl_chat/internvl/model/
 * {internvl_chat,internlm2}/configuration_*.py and modeling_intern_vit.py. */
#include "models/import_hf_int.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* ---- decoder LLMs ---- */

typedef enum { FAM_LLAMA, FAM_QWEN2, FAM_MISTRAL, FAM_INTERNLM2, FAM_MLLAMA, FAM_GEMMA, FAM_GEMMA3 } llm_family;

/* head_dim 0: hidden / heads. */
typedef struct { long vocab, hidden, ffn, layers, heads, kv_heads, head_dim; bool tied; } llm_defaults;

/* Config class defaults (LlamaConfig, Qwen2Config, MistralConfig,
 * MllamaTextConfig, GemmaConfig, Gemma3TextConfig); InternLM2 is remote code
 * and its configs spell out every size. */
static const llm_defaults family_defaults[] = {
    [FAM_LLAMA] = {32000, 4096, 11008, 32, 32, -1, 0, false},
    [FAM_QWEN2] = {151936, 4096, 22016, 32, 32, 32, 0, false},
    [FAM_MISTRAL] = {32000, 4096, 14336, 32, 32, 8, 0, false},
    [FAM_INTERNLM2] = {-1, -1, -1, -1, -1, -1, 0, false},
    [FAM_MLLAMA] = {128256, 4096, 14336, 40, 32, 8, 0, false},
    [FAM_GEMMA] = {256000, 3072, 24576, 28, 16, 16, 256, true},
    [FAM_GEMMA3] = {262208, 2304, 9216, 26, 8, 4, 256, true},
};

static int family_of(const char *type, llm_family *fam)
{
    static const struct { const char *type; llm_family fam; } map[] = {
        {"llama", FAM_LLAMA}, {"qwen2", FAM_QWEN2}, {"qwen2_5_vl_text", FAM_QWEN2}, {"qwen2_vl_text", FAM_QWEN2},
        {"qwen2_5_omni_text", FAM_QWEN2}, {"mistral", FAM_MISTRAL},
        {"internlm2", FAM_INTERNLM2}, {"mllama_text_model", FAM_MLLAMA}, {"mllama", FAM_MLLAMA},
        {"gemma", FAM_GEMMA}, {"gemma3_text", FAM_GEMMA3},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (type && strcmp(type, map[i].type) == 0) { *fam = map[i].fam; return UTIL_OK; }
    return UTIL_EUNSUPPORTED;
}

/* Biases: Llama q,k,v,o follow attention_bias, MLP mlp_bias; Qwen2 q,k,v
 * always, o and MLP never; InternLM2 wqkv and wo follow `bias`; Mistral,
 * Mllama text and Gemma none. Gemma's MLP is GeGLU: gate, up and down like
 * SwiGLU (the same shapes; the activation is tanh-GELU). Gemma 3 adds a
 * per-head RMSNorm on q and k and a norm after attention and after the MLP
 * (modeling_gemma3.py Gemma3Attention q_norm/k_norm, Gemma3DecoderLayer
 * post_attention_layernorm / pre_ / post_feedforward_layernorm). */
static int import_llm(const hf_section *s, llm_family fam, const cJSON *root, model_module *mm, char *err)
{
    const llm_defaults *d = &family_defaults[fam];
    hf_init_module(mm, "llm", MODEL_LLM);
    mm->ffn_kind = MODEL_FFN_SWIGLU;
    mm->norm = MODEL_NORM_RMSNORM;
    mm->final_norm = true;
    if (hf_int(s, "vocab_size", d->vocab, &mm->vocab, err) ||
        hf_int(s, "hidden_size", d->hidden, &mm->hidden, err) ||
        hf_int(s, "intermediate_size", d->ffn, &mm->ffn, err) ||
        hf_int(s, "num_hidden_layers", d->layers, &mm->layers, err) ||
        hf_int(s, "num_attention_heads", d->heads, &mm->heads, err))
        return UTIL_EINVAL;
    if (hf_int(s, "num_key_value_heads", d->kv_heads >= 0 ? d->kv_heads : mm->heads, &mm->kv_heads, err))
        return UTIL_EINVAL;
    if (d->head_dim > 0 ? hf_int(s, "head_dim", d->head_dim, &mm->head_dim, err) : hf_set_head_dim(mm, s, err))
        return UTIL_EINVAL;
    /* The composite model's top-level flag decides tying; the sub-config's is the fallback. */
    hf_section top;
    hf_sec(&top, root, s->obj, "", "");
    util_strlcpy(top.ctx, s->ctx, sizeof top.ctx);
    if (hf_bool(&top, "tie_word_embeddings", d->tied, &mm->tied_embeddings, err)) return UTIL_EINVAL;
    if (hf_eps(s, "rms_norm_eps", &mm->norm_eps, err)) return UTIL_EINVAL;
    /* rope_theta: a float in the configs (1000000.0); every config class defaults it to 10000.0 */
    const cJSON *theta = hf_lookup(s, "rope_theta");
    mm->rope_theta = 10000;
    if (theta && (!cJSON_IsNumber(theta) || !(theta->valuedouble >= 1 && theta->valuedouble <= INT_MAX) ||
                  theta->valuedouble != (double)(int)theta->valuedouble))
        return util_fail(err, UTIL_EINVAL, "%s.rope_theta: must be a whole number in [1, %d]", s->ctx, INT_MAX);
    if (theta) mm->rope_theta = (int)theta->valuedouble;
    bool b = false;
    switch (fam) {
    case FAM_LLAMA:
        if (hf_bool(s, "attention_bias", false, &b, err) || hf_bool(s, "mlp_bias", false, &mm->mlp_bias, err))
            return UTIL_EINVAL;
        mm->qkv_bias = mm->out_bias = b;
        break;
    case FAM_QWEN2: mm->qkv_bias = true; break;
    case FAM_INTERNLM2:
        if (hf_bool(s, "bias", false, &b, err)) return UTIL_EINVAL;
        mm->qkv_bias = mm->out_bias = b;
        break;
    case FAM_MLLAMA:
        mm->vocab_extra = 8;   /* MllamaTextModel: nn.Embedding(vocab_size + 8, hidden) */
        if (hf_list(s, "cross_attention_layers", mm->cross_layers, &mm->n_cross_layers, err)) return UTIL_EINVAL;
        break;
    case FAM_GEMMA3: mm->qk_norm_head = mm->post_norms = true; break;
    case FAM_MISTRAL: case FAM_GEMMA: break;
    }
    mm->k_bias = mm->qkv_bias;
    return UTIL_OK;
}

int hf_import_text_config(const cJSON *root, const char *key, const char *dflt_type, bool top_fallback,
                              const char *what, model_module *mm, char *err)
{
    hf_section s;
    const cJSON *tc = hf_sub(root, key);
    hf_sec(&s, tc, NULL, what, key);
    const char *type = hf_str(&s, "model_type");
    if (!type) type = dflt_type;
    llm_family fam;
    if (family_of(type, &fam))
        return util_fail(err, UTIL_EUNSUPPORTED, "%s.model_type: '%s' is not a supported decoder", s.ctx,
                         type ? type : "(none)");
    if (top_fallback || !tc) s.fallback = root;   /* older Qwen2-VL configs keep text keys top-level */
    return import_llm(&s, fam, root, mm, err);
}

/* ---- encoders ---- */

/* Qwen2-VL / Qwen2.5-VL vision tower. window_size is in pixels; our window
 * counts patches: (window_size / patch)^2. */
int hf_import_qwen_vision(const cJSON *root, const char *what, bool v25, model_module *mm, char *err)
{
    hf_section s;
    hf_sec(&s, hf_sub(root, "vision_config"), NULL, what, "vision_config");
    if (!s.obj) return util_fail(err, UTIL_EINVAL, "%s: vision_config: required object is missing", what);
    hf_init_module(mm, "vision", MODEL_VISION);
    mm->qkv_bias = mm->out_bias = mm->mlp_bias = true;
    mm->proj_norm = true;
    int in_chans;
    if (hf_int(&s, "depth", 32, &mm->layers, err) || hf_int(&s, "num_heads", 16, &mm->heads, err) ||
        hf_int(&s, "in_chans", 3, &in_chans, err) || hf_int(&s, "in_channels", in_chans, &mm->in_channels, err) ||
        hf_int(&s, "patch_size", 14, &mm->patch, err) ||
        hf_int(&s, "spatial_merge_size", 2, &mm->merge, err) ||
        hf_int(&s, "temporal_patch_size", 2, &mm->temporal_patch, err))
        return UTIL_EINVAL;
    if (v25) {
        int window_px;
        mm->ffn_kind = MODEL_FFN_SWIGLU;
        mm->norm = MODEL_NORM_RMSNORM;
        if (hf_int(&s, "hidden_size", 1280, &mm->hidden, err) ||
            hf_int(&s, "intermediate_size", 3420, &mm->ffn, err) ||
            hf_int(&s, "out_hidden_size", 3584, &mm->out_hidden, err) ||
            hf_int(&s, "window_size", 112, &window_px, err) ||
            hf_list(&s, "fullatt_block_indexes", mm->full_layers, &mm->n_full_layers, err))
            return UTIL_EINVAL;
        if (mm->patch <= 0 || window_px % mm->patch)
            return util_fail(err, UTIL_EINVAL, "%s.window_size: %d px is not a multiple of patch_size %d", s.ctx,
                             window_px, mm->patch);
        /* 64 bits: window_size 91312 px of 1-px patches squared overflowed an int (found by fuzz_hf_config) */
        int64_t side = window_px / mm->patch;
        if (hf_narrow(side * side, &s, "window (patches)", &mm->window, err)) return UTIL_EINVAL;
        if (mm->window == 0) mm->n_full_layers = 0;
    } else {
        int ratio;
        mm->ffn_kind = MODEL_FFN_GELU;   /* quick_gelu fc1/fc2 */
        mm->norm = MODEL_NORM_LAYERNORM;
        if (hf_int(&s, "embed_dim", 1280, &mm->hidden, err) || hf_int(&s, "mlp_ratio", 4, &ratio, err) ||
            hf_int(&s, "hidden_size", 3584, &mm->out_hidden, err))
            return UTIL_EINVAL;
        if (hf_narrow((int64_t)mm->hidden * ratio, &s, "intermediate size", &mm->ffn, err)) return UTIL_EINVAL;
    }
    mm->kv_heads = mm->heads;
    mm->k_bias = true;
    if (hf_set_head_dim(mm, &s, err)) return UTIL_EINVAL;
    mm->proj_norm_width = mm->hidden;
    mm->proj_norm_kind = mm->norm;
    if (hf_narrow((int64_t)mm->hidden * mm->merge * mm->merge, &s, "merger width", &mm->proj_in, err))
        return UTIL_EINVAL;
    mm->proj_hidden = mm->proj_in;
    return UTIL_OK;
}

/* A tower with a class token and learned positions (CLIP, InternViT,
 * Mllama): images of whole patches, (image_size / patch)^2 patch positions
 * and the class row's. */
static int class_token_positions(model_module *mm, const hf_section *s, char *err)
{
    if (mm->patch <= 0 || mm->image_size % mm->patch)
        return util_fail(err, UTIL_EINVAL, "%s.image_size: %d is not a multiple of patch_size %d", s->ctx,
                         mm->image_size, mm->patch);
    int side = mm->image_size / mm->patch;
    return hf_narrow((int64_t)side * side + 1, s, "positions", &mm->max_positions, err) ? UTIL_EINVAL : UTIL_OK;
}

/* CLIP vision tower (LLaVA): class token, learned positions, pre and post
 * LayerNorm, quick-GELU MLP, biases everywhere but the patch conv. */
int hf_import_clip_vision(const cJSON *root, const char *what, model_module *mm, char *err)
{
    hf_section s;
    hf_sec(&s, hf_sub(root, "vision_config"), NULL, what, "vision_config");
    hf_init_module(mm, "vision", MODEL_VISION);
    /* CLIPVisionConfig hidden_act, default "quick_gelu" (configuration_clip.py) */
    const char *act = hf_str(&s, "hidden_act");
    mm->ffn_kind = !act || strcmp(act, "quick_gelu") == 0 ? MODEL_FFN_QUICK_GELU : MODEL_FFN_GELU;
    mm->norm = MODEL_NORM_LAYERNORM;
    mm->qkv_bias = mm->k_bias = mm->out_bias = mm->mlp_bias = true;
    mm->cls_token = mm->pre_norm = mm->final_norm = true;
    mm->frozen = true;   /* LLaVA-1.5 keeps the CLIP tower frozen in both training stages */
    if (hf_int(&s, "hidden_size", 768, &mm->hidden, err) || hf_int(&s, "intermediate_size", 3072, &mm->ffn, err) ||
        hf_int(&s, "num_hidden_layers", 12, &mm->layers, err) ||
        hf_int(&s, "num_attention_heads", 12, &mm->heads, err) ||
        hf_int(&s, "image_size", 224, &mm->image_size, err) || hf_int(&s, "patch_size", 32, &mm->patch, err) ||
        hf_int(&s, "num_channels", 3, &mm->in_channels, err) || hf_eps(&s, "layer_norm_eps", &mm->norm_eps, err))
        return UTIL_EINVAL;
    if (class_token_positions(mm, &s, err)) return UTIL_EINVAL;
    mm->kv_heads = mm->heads;
    mm->proj_in = mm->hidden;
    return hf_set_head_dim(mm, &s, err);
}

/* InternViT: RMSNorm or LayerNorm blocks, optional q/k norm, layer scales,
 * patch conv with bias, class token, learned positions. */
static int import_internvit(const cJSON *root, const char *what, model_module *mm, char *err)
{
    hf_section s;
    hf_sec(&s, hf_sub(root, "vision_config"), NULL, what, "vision_config");
    if (!s.obj) return util_fail(err, UTIL_EINVAL, "%s: vision_config: required object is missing", what);
    hf_init_module(mm, "vision", MODEL_VISION);
    mm->ffn_kind = MODEL_FFN_GELU;
    mm->out_bias = mm->mlp_bias = mm->patch_bias = true;
    mm->cls_token = mm->layer_scale = true;
    if (hf_int(&s, "hidden_size", -1, &mm->hidden, err) || hf_int(&s, "intermediate_size", -1, &mm->ffn, err) ||
        hf_int(&s, "num_hidden_layers", -1, &mm->layers, err) ||
        hf_int(&s, "num_attention_heads", -1, &mm->heads, err) ||
        hf_int(&s, "image_size", 224, &mm->image_size, err) || hf_int(&s, "patch_size", 14, &mm->patch, err) ||
        hf_int(&s, "num_channels", 3, &mm->in_channels, err) ||
        hf_bool(&s, "qkv_bias", false, &mm->qkv_bias, err) ||
        hf_bool(&s, "qk_normalization", false, &mm->qk_norm, err) || hf_eps(&s, "layer_norm_eps", &mm->norm_eps, err))
        return UTIL_EINVAL;
    const char *norm = hf_str(&s, "norm_type");
    mm->norm = norm && strcmp(norm, "rms_norm") == 0 ? MODEL_NORM_RMSNORM : MODEL_NORM_LAYERNORM;
    mm->k_bias = mm->qkv_bias;
    mm->kv_heads = mm->heads;
    if (class_token_positions(mm, &s, err)) return UTIL_EINVAL;
    return hf_set_head_dim(mm, &s, err);
}

/* Mllama vision: 32 local + 8 gated global blocks, gated tile position
 * embeddings, LayerNorm pre/post, output = concat of the last hidden state
 * and intermediate layers (vision_output_dim), one Linear projector. */
static int import_mllama_vision(const cJSON *root, const char *what, model_module *mm, char *err)
{
    hf_section s;
    hf_sec(&s, hf_sub(root, "vision_config"), NULL, what, "vision_config");
    hf_init_module(mm, "vision", MODEL_VISION);
    mm->ffn_kind = MODEL_FFN_GELU;
    mm->norm = MODEL_NORM_LAYERNORM;
    mm->mlp_bias = true;
    mm->cls_token = mm->pre_norm = mm->final_norm = true;
    int local, global;
    if (hf_int(&s, "hidden_size", 1280, &mm->hidden, err) || hf_int(&s, "intermediate_size", 5120, &mm->ffn, err) ||
        hf_int(&s, "num_hidden_layers", 32, &local, err) || hf_int(&s, "num_global_layers", 8, &global, err) ||
        hf_int(&s, "attention_heads", 16, &mm->heads, err) || hf_int(&s, "image_size", 448, &mm->image_size, err) ||
        hf_int(&s, "patch_size", 14, &mm->patch, err) || hf_int(&s, "num_channels", 3, &mm->in_channels, err) ||
        hf_int(&s, "max_num_tiles", 4, &mm->max_tiles, err) || hf_eps(&s, "norm_eps", &mm->norm_eps, err))
        return UTIL_EINVAL;
    mm->layers = local + global;
    mm->gated_layers = global;
    const cJSON *ratios = hf_lookup(&s, "supported_aspect_ratios");
    mm->aspect_ratios = (cJSON_IsArray(ratios) ? cJSON_GetArraySize(ratios) : 8) + 1;
    int n_inter = 5, inter[MODEL_MAX_LIST];
    if (hf_lookup(&s, "intermediate_layers_indices") &&
        hf_list(&s, "intermediate_layers_indices", inter, &n_inter, err))
        return UTIL_EINVAL;
    int64_t out_dim = (int64_t)mm->hidden * (n_inter + 1);
    if (hf_int(&s, "vision_output_dim", out_dim > MODEL_MAX_WIDTH ? MODEL_MAX_WIDTH : out_dim, &mm->proj_in, err))
        return UTIL_EINVAL;
    if (class_token_positions(mm, &s, err)) return UTIL_EINVAL;
    mm->kv_heads = mm->heads;
    return hf_set_head_dim(mm, &s, err);
}

/* Whisper-style audio encoder: conv stem (kernel 3, bias), blocks with
 * k_proj without bias, final LayerNorm, avg-pool 2, projector one linear.
 * Learned positions (Qwen2-Audio's embed_positions) when learned_positions;
 * Qwen2.5-Omni's are a sinusoidal buffer. */
int hf_import_whisper(const hf_section *s, bool learned_positions, model_module *mm, char *err)
{
    hf_init_module(mm, "audio", MODEL_AUDIO);
    mm->ffn_kind = MODEL_FFN_GELU;
    mm->norm = MODEL_NORM_LAYERNORM;
    mm->qkv_bias = mm->out_bias = mm->mlp_bias = mm->patch_bias = mm->final_norm = true;
    mm->k_bias = false;
    mm->patch = 3;
    mm->pool = 2;
    if (hf_int(s, "d_model", 1280, &mm->hidden, err) || hf_int(s, "encoder_layers", 32, &mm->layers, err) ||
        hf_int(s, "encoder_attention_heads", 20, &mm->heads, err) ||
        hf_int(s, "encoder_ffn_dim", 5120, &mm->ffn, err) || hf_int(s, "num_mel_bins", 128, &mm->in_channels, err) ||
        (learned_positions && hf_int(s, "max_source_positions", 1500, &mm->max_positions, err)))
        return UTIL_EINVAL;
    mm->kv_heads = mm->heads;
    mm->proj_in = mm->hidden;
    return hf_set_head_dim(mm, s, err);
}

/* ---- model types ---- */

void hf_connect(model_t *m, model_module *enc, int proj_hidden)
{
    const model_module *llm = &m->mod[m->llm];
    enc->out_hidden = llm->hidden;
    if (proj_hidden >= 0) enc->proj_hidden = proj_hidden;
    enc->feeds = m->llm;
    if (!enc->proj_norm) {   /* unused then; the schema's defaults */
        enc->proj_norm_width = enc->hidden;
        enc->proj_norm_kind = enc->norm;
    }
}

static int import_qwen_vl(const cJSON *root, const char *what, bool v25, model_t *m, char *err)
{
    m->n_modules = 2;
    m->llm = 1;
    if (hf_import_qwen_vision(root, what, v25, &m->mod[0], err)) return UTIL_EINVAL;
    int rc = hf_import_text_config(root, "text_config", "qwen2", true, what, &m->mod[1], err);
    if (rc) return rc;
    /* rope_scaling {"type": "mrope", "mrope_section": [t, h, w]} (top level, or the text config's) */
    hf_section rs;
    const cJSON *tc = hf_sub(root, "text_config");
    hf_sec(&rs, hf_sub(root, "rope_scaling") ? hf_sub(root, "rope_scaling") : tc ? hf_sub(tc, "rope_scaling") : NULL, NULL,
           what, "rope_scaling");
    if (rs.obj && hf_list(&rs, "mrope_section", m->mod[1].mrope_section, &m->mod[1].n_mrope, err)) return UTIL_EINVAL;
    int out = m->mod[0].out_hidden;
    hf_connect(m, &m->mod[0], -1);
    if (out != m->mod[1].hidden)
        return util_fail(err, UTIL_EINVAL, "%s: vision_config.%s: %d differs from the text hidden_size %d", what,
                         v25 ? "out_hidden_size" : "hidden_size", out, m->mod[1].hidden);
    return UTIL_OK;
}

/* LlavaConfig vision_feature_layer (default -2): the features are
 * hidden_states[k] of the CLIP tower (modeling_llava.py get_image_features),
 * the embeddings then one entry per block, so k < 0 leaves the last -k - 1
 * blocks (and post_layernorm, which hidden_states never passes) unused and
 * k > 0 runs k blocks. Its "default" select strategy drops the class row. */
static int llava_feature_layer(const cJSON *root, const char *what, model_module *v, char *err)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(root, "vision_feature_layer");
    double k = f ? (cJSON_IsNumber(f) ? f->valuedouble : 0) : -2;
    int total = v->layers;
    /* the range first: casting a double outside int's range is undefined */
    if (!(k >= -total && k <= total) || k == 0 || k != (double)(int)k)
        return util_fail(err, UTIL_EINVAL, "%s: vision_feature_layer: must be an integer in [-%d, -1] or [1, %d] "
                         "(one layer of the %d-block tower)", what, total, total, total);
    v->layers = k > 0 ? (int)k : total + (int)k + 1;
    v->unused_layers = total - v->layers;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "vision_feature_select_strategy");
    const char *sel = cJSON_IsString(st) ? st->valuestring : NULL;
    if (sel && strcmp(sel, "default") != 0)
        return util_fail(err, UTIL_EINVAL, "%s: vision_feature_select_strategy: '%s' is not supported (\"default\": "
                         "the class row dropped)", what, sel);
    return UTIL_OK;
}

/* multi_modal_projector: Linear(vision hidden -> text hidden), GELU, Linear(text -> text). */
int hf_import_llava(const cJSON *root, const char *what, model_t *m, char *err)
{
    m->n_modules = 2;
    m->llm = 1;
    if (hf_import_clip_vision(root, what, &m->mod[0], err)) return UTIL_EINVAL;
    if (llava_feature_layer(root, what, &m->mod[0], err)) return UTIL_EINVAL;
    int rc = hf_import_text_config(root, "text_config", "llama", false, what, &m->mod[1], err);
    if (rc) return rc;
    hf_connect(m, &m->mod[0], m->mod[1].hidden);
    return UTIL_OK;
}

/* mlp1: LayerNorm(vit * m^2), Linear(vit * m^2 -> llm), GELU, Linear(llm -> llm)
 * with m = 1 / downsample_ratio (pixel shuffle). */
static int import_internvl(const cJSON *root, const char *what, model_t *m, char *err)
{
    m->n_modules = 2;
    m->llm = 1;
    model_module *v = &m->mod[0];
    if (import_internvit(root, what, v, err)) return UTIL_EINVAL;
    const cJSON *lc = hf_sub(root, "llm_config");
    if (!lc) return util_fail(err, UTIL_EINVAL, "%s: llm_config: required object is missing", what);
    int rc = hf_import_text_config(root, "llm_config", NULL, false, what, &m->mod[1], err);
    if (rc) return rc;
    const cJSON *ratio = cJSON_GetObjectItemCaseSensitive(root, "downsample_ratio");
    double r = cJSON_IsNumber(ratio) ? ratio->valuedouble : 0.5;
    if (!(r >= 1.0 / 1024 && r <= 1) || (double)(int)(1.0 / r + 0.5) * r < 0.999 || (double)(int)(1.0 / r + 0.5) * r > 1.001)
        return util_fail(err, UTIL_EINVAL, "%s: downsample_ratio: %g is not 1/integer", what, r);
    v->merge = (int)(1.0 / r + 0.5);
    hf_section vs;
    hf_sec(&vs, hf_sub(root, "vision_config"), NULL, what, "vision_config");
    if (hf_narrow((int64_t)v->hidden * v->merge * v->merge, &vs, "mlp1 width", &v->proj_in, err)) return UTIL_EINVAL;
    v->proj_norm = true;
    v->proj_norm_kind = MODEL_NORM_LAYERNORM;
    v->proj_norm_width = v->proj_in;
    hf_connect(m, v, m->mod[1].hidden);
    return UTIL_OK;
}

/* multi_modal_projector: Linear(vision_output_dim -> text hidden, bias). */
static int import_mllama(const cJSON *root, const char *what, model_t *m, char *err)
{
    m->n_modules = 2;
    m->llm = 1;
    if (import_mllama_vision(root, what, &m->mod[0], err)) return UTIL_EINVAL;
    int rc = hf_import_text_config(root, "text_config", "mllama_text_model", false, what, &m->mod[1], err);
    if (rc) return rc;
    hf_connect(m, &m->mod[0], 0);
    return UTIL_OK;
}

/* multi_modal_projector: Linear(d_model -> text hidden, bias). */
static int import_qwen2_audio(const cJSON *root, const char *what, model_t *m, char *err)
{
    m->n_modules = 2;
    m->llm = 1;
    hf_section s;
    hf_sec(&s, hf_sub(root, "audio_config"), NULL, what, "audio_config");
    if (hf_import_whisper(&s, true, &m->mod[0], err)) return UTIL_EINVAL;
    int rc = hf_import_text_config(root, "text_config", "qwen2", false, what, &m->mod[1], err);
    if (rc) return rc;
    hf_connect(m, &m->mod[0], 0);
    return UTIL_OK;
}

/* The model's name: the file's, unless it is the usual config.json of a
 * model directory: then the directory's (.../Qwen2.5-VL-7B/config.json), or
 * for a URL or a bare config.json the config's own _name_or_path (its last
 * part), else its model_type. */
static void name_from_what(model_t *m, const cJSON *root, const char *what)
{
    const char *base = strrchr(what, '/');
    base = base ? base + 1 : what;
    util_strlcpy(m->name, base, sizeof m->name);
    size_t n = strlen(m->name);
    if (n > 5 && strcmp(m->name + n - 5, ".json") == 0) m->name[n - 5] = '\0';
    util_strlcpy(m->source, what, sizeof m->source);
    if (strcmp(m->name, "config")) return;
    if (!strstr(what, "://") && base > what) {
        const char *end = base - 1, *dir = end;
        while (dir > what && dir[-1] != '/') dir--;
        if (end > dir && !(end - dir == 1 && *dir == '.') && !(end - dir == 2 && !strncmp(dir, "..", 2))) {
            snprintf(m->name, sizeof m->name, "%.*s", (int)(end - dir), dir);
            return;
        }
    }
    const cJSON *own = cJSON_GetObjectItemCaseSensitive(root, "_name_or_path");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(own) && own->valuestring[0]) {
        const char *slash = strrchr(own->valuestring, '/');
        util_strlcpy(m->name, slash && slash[1] ? slash + 1 : own->valuestring, sizeof m->name);
    } else if (cJSON_IsString(type)) {
        util_strlcpy(m->name, type->valuestring, sizeof m->name);
    }
}

/* The special token ids, under the names transformers' configs use for
 * them (at the top or in a Qwen2.5-Omni thinker_config). */
static int import_tokens(const cJSON *root, const char *what, model_t *m, char *err)
{
    static const char *const keys[MODEL_NTOKENS][2] = {
        { "image_token_id", "image_token_index" }, { "video_token_id", "video_token_index" },
        { "vision_start_token_id", NULL }, { "vision_end_token_id", NULL }, { "audio_token_index", "audio_token_id" },
    };
    const cJSON *places[2] = { root, hf_sub(root, "thinker_config") };
    for (int t = 0; t < MODEL_NTOKENS; t++) {
        m->tokens[t] = -1;
        for (int p = 0; p < 2 && m->tokens[t] < 0; p++)
            for (int k = 0; k < 2 && places[p] && keys[t][k] && m->tokens[t] < 0; k++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(places[p], keys[t][k]);
                if (!v || cJSON_IsNull(v)) continue;
                if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT_MAX || v->valuedouble != (int)v->valuedouble)
                    return util_fail(err, UTIL_EINVAL, "%s: %s: must be a non-negative integer", what, keys[t][k]);
                m->tokens[t] = (int)v->valuedouble;
            }
    }
    return UTIL_OK;
}

static int import_root(const cJSON *root, const char *what, model_t *m, char *err)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(t)) return util_fail(err, UTIL_EINVAL, "%s: model_type: required string is missing", what);
    const char *type = t->valuestring;
    if (strcmp(type, "qwen2_5_vl") == 0) return import_qwen_vl(root, what, true, m, err);
    if (strcmp(type, "qwen2_vl") == 0) return import_qwen_vl(root, what, false, m, err);
    if (strcmp(type, "llava") == 0) return hf_import_llava(root, what, m, err);
    if (strcmp(type, "internvl_chat") == 0) return import_internvl(root, what, m, err);
    if (strcmp(type, "mllama") == 0) return import_mllama(root, what, m, err);
    if (strcmp(type, "qwen2_audio") == 0) return import_qwen2_audio(root, what, m, err);
    int rc = hf_import_vlm(root, type, what, m, err);
    if (rc != UTIL_ENOTFOUND) return rc;
    llm_family fam;
    if (family_of(type, &fam) == UTIL_OK && fam != FAM_MLLAMA) {
        hf_section s;
        hf_sec(&s, root, NULL, what, "config");
        m->n_modules = 1;
        m->llm = 0;
        return import_llm(&s, fam, root, &m->mod[0], err);
    }
    return util_fail(err, UTIL_EUNSUPPORTED, "%s: model_type: '%s' is not supported (supported: %s)", what, type,
                     model_import_hf_types());
}

const char *model_import_hf_types(void)
{
    return "qwen2_5_vl, qwen2_vl, qwen2_5_omni, llava, llava_next, idefics3, paligemma, gemma3, internvl_chat, "
           "mllama, qwen2_audio, llama, qwen2, mistral, internlm2, gemma, gemma3_text";
}

int model_import_hf(const char *config_json_text, const char *what, model_t *m, char *err)
{
    cJSON *root;
    if (util_json_parse(config_json_text, what, &root, err)) return UTIL_EINVAL;
    memset(m, 0, sizeof *m);
    int rc = cJSON_IsObject(root) ? import_root(root, what, m, err)
                                  : util_fail(err, UTIL_EINVAL, "%s: top level must be an object", what);
    if (!rc) name_from_what(m, root, what);
    if (!rc) rc = import_tokens(root, what, m, err);
    cJSON_Delete(root);
    if (rc) return rc;
    /* Through our schema once: validates, and gives the fields the importer
     * leaves unset for a kind the same defaults a loaded file gets. */
    cJSON *ours = model_to_json(m);
    if (!ours) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", what);
    rc = model_from_json(ours, what, m, err);
    cJSON_Delete(ours);
    return rc;
}
