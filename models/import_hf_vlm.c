/* Hugging Face config.json -> model_t for qwen2_5_omni, llava_next,
 * idefics3 (SmolVLM), paligemma and gemma3. As in import_hf.c, field names,
 * defaults for absent keys and the fixed parts of each architecture follow
 * transformers' src/transformers/models/<type>/configuration_<type>.py and
 * modeling_<type>.py (and siglip/ for the SigLIP vision towers). */
#include "models/import_hf_int.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- SigLIP vision towers (paligemma, gemma3, idefics3) ---- */

/* Config class defaults of the vision tower. */
typedef struct { long hidden, ffn, layers, heads, image, patch; bool use_head; } siglip_defaults;
static const siglip_defaults SIGLIP = {768, 3072, 12, 12, 224, 16, true};            /* SiglipVisionConfig */
static const siglip_defaults IDEFICS3_VISION = {1152, 3072, 12, 16, 224, 32, false}; /* Idefics3VisionConfig */

/* SiglipVisionTransformer: patch conv with bias (no class token), learned
 * positions over the (image // patch)^2 grid, pre-norm LayerNorm blocks with
 * biases on every linear, tanh-GELU MLP, post_layernorm; with
 * vision_use_head, SiglipMultiheadAttentionPoolingHead: probe d, an
 * nn.MultiheadAttention (in_proj 3d x d + 3d, out_proj d x d + d), a
 * LayerNorm and an MLP d -> f -> d: 4d^2 + 2df + 7d + f parameters. */
static int import_siglip(const cJSON *root, const char *what, const siglip_defaults *d, model_module *mm,
                         char *err)
{
    hf_section s;
    hf_sec(&s, hf_sub(root, "vision_config"), NULL, what, "vision_config");
    if (!s.obj) return util_fail(err, UTIL_EINVAL, "%s: vision_config: required object is missing", what);
    hf_init_module(mm, "vision", MODEL_VISION);
    mm->ffn_kind = MODEL_FFN_GELU;
    mm->norm = MODEL_NORM_LAYERNORM;
    mm->qkv_bias = mm->k_bias = mm->out_bias = mm->mlp_bias = mm->patch_bias = mm->final_norm = true;
    bool use_head;
    if (hf_int(&s, "hidden_size", d->hidden, &mm->hidden, err) || hf_int(&s, "intermediate_size", d->ffn, &mm->ffn, err) ||
        hf_int(&s, "num_hidden_layers", d->layers, &mm->layers, err) ||
        hf_int(&s, "num_attention_heads", d->heads, &mm->heads, err) ||
        hf_int(&s, "image_size", d->image, &mm->image_size, err) || hf_int(&s, "patch_size", d->patch, &mm->patch, err) ||
        hf_int(&s, "num_channels", 3, &mm->in_channels, err) ||
        hf_bool(&s, "vision_use_head", d->use_head, &use_head, err) || hf_eps(&s, "layer_norm_eps", &mm->norm_eps, err))
        return UTIL_EINVAL;
    /* a valid-padding conv: image_size // patch_size patches a side (SiglipVisionEmbeddings.num_patches) */
    if (mm->patch <= 0 || mm->image_size < mm->patch)
        return util_fail(err, UTIL_EINVAL, "%s.image_size: %d is smaller than patch_size %d", s.ctx,
                         mm->image_size, mm->patch);
    int side = mm->image_size / mm->patch;
    if (hf_narrow((int64_t)side * side, &s, "positions", &mm->max_positions, err)) return UTIL_EINVAL;
    if (use_head) {
        int64_t h = mm->hidden, f = mm->ffn, n = 4 * h * h + 2 * h * f + 7 * h + f;   /* h, f <= 2^20: exact */
        if (n > INT_MAX)
            return util_fail(err, UTIL_EINVAL, "%s: the pooling head's %lld parameters exceed %d", s.ctx,
                             (long long)n, INT_MAX);
        mm->extra_params = (int)n;
    }
    mm->kv_heads = mm->heads;
    mm->proj_in = mm->hidden;
    return hf_set_head_dim(mm, &s, err);
}

/* Text width the projector must reach, checked against the LLM's. */
static int check_width(const char *what, const char *field, int width, const model_module *llm, char *err)
{
    if (width != llm->hidden)
        return util_fail(err, UTIL_EINVAL, "%s: %s: %d differs from the text hidden_size %d", what, field, width,
                         llm->hidden);
    return UTIL_OK;
}

/* PaliGemma: SigLIP (no head in the published configs), projector
 * Linear(vision hidden -> projection_dim, bias) (PaliGemmaMultiModalProjector),
 * Gemma text model with tied embeddings. */
static int import_paligemma(const cJSON *root, const char *what, model_t *m, char *err)
{
    m->n_modules = 2;
    m->llm = 1;
    model_module *v = &m->mod[0];
    if (import_siglip(root, what, &SIGLIP, v, err)) return UTIL_EINVAL;
    int rc = hf_import_text_config(root, "text_config", "gemma", false, what, &m->mod[1], err);
    if (rc) return rc;
    hf_section s;
    hf_sec(&s, hf_sub(root, "vision_config"), root, what, "vision_config");
    int proj;
    if (hf_int(&s, "projection_dim", 2048, &proj, err) ||
        check_width(what, "vision_config.projection_dim", proj, &m->mod[1], err))
        return UTIL_EINVAL;
    hf_connect(m, v, 0);
    return UTIL_OK;
}

/* Gemma 3: SigLIP without head; Gemma3MultiModalProjector average-pools the
 * (image/patch)^2 grid to mm_tokens_per_image tokens (AvgPool2d of side
 * patches_per_side / tokens_per_side), RMS-normalises them
 * (mm_soft_emb_norm, width vision hidden) and multiplies by
 * mm_input_projection_weight (vision hidden x text hidden, no bias). */
static int import_gemma3(const cJSON *root, const char *what, model_t *m, char *err)
{
    m->n_modules = 2;
    m->llm = 1;
    model_module *v = &m->mod[0];
    static const siglip_defaults gemma3_vision = {1152, 4304, 27, 16, 896, 14, false};  /* Gemma3Config's default */
    if (import_siglip(root, what, &gemma3_vision, v, err)) return UTIL_EINVAL;
    int rc = hf_import_text_config(root, "text_config", "gemma3_text", false, what, &m->mod[1], err);
    if (rc) return rc;
    hf_section top;
    hf_sec(&top, root, NULL, what, "config");
    int tokens;
    if (hf_int(&top, "mm_tokens_per_image", 256, &tokens, err)) return UTIL_EINVAL;
    int side = v->image_size / v->patch, tside = (int)lround(sqrt((double)tokens));
    if (tokens < 1 || tside * tside != tokens || side % tside)
        return util_fail(err, UTIL_EINVAL, "%s: mm_tokens_per_image: %d is not a square whose side divides the "
                         "%dx%d patch grid", what, tokens, side, side);
    int64_t pool_side = side / tside;
    if (hf_narrow(pool_side * pool_side, &top, "pooling window", &v->pool, err)) return UTIL_EINVAL;
    v->proj_norm = true;
    v->proj_norm_kind = MODEL_NORM_RMSNORM;
    v->proj_norm_width = v->hidden;
    v->proj_bias = false;
    hf_connect(m, v, 0);
    return UTIL_OK;
}

/* Idefics3 (SmolVLM): Idefics3 vision tower (SigLIP layout, no head), the
 * connector's pixel shuffle joins scale_factor^2 neighbouring tokens
 * (our merge) and Idefics3SimpleMLP is one Linear(hidden * scale^2 -> text
 * hidden, bias=False); Llama text model. */
static int import_idefics3(const cJSON *root, const char *what, model_t *m, char *err)
{
    m->n_modules = 2;
    m->llm = 1;
    model_module *v = &m->mod[0];
    if (import_siglip(root, what, &IDEFICS3_VISION, v, err)) return UTIL_EINVAL;
    int rc = hf_import_text_config(root, "text_config", "llama", false, what, &m->mod[1], err);
    if (rc) return rc;
    hf_section top;
    hf_sec(&top, root, NULL, what, "config");
    if (hf_int(&top, "scale_factor", 2, &v->merge, err)) return UTIL_EINVAL;
    int side = v->image_size / v->patch;
    if (v->merge < 1 || side % v->merge)
        return util_fail(err, UTIL_EINVAL, "%s: scale_factor: %d does not divide the %dx%d patch grid", what,
                         v->merge, side, side);
    if (hf_narrow((int64_t)v->hidden * v->merge * v->merge, &top, "connector width", &v->proj_in, err))
        return UTIL_EINVAL;
    v->proj_bias = false;
    hf_connect(m, v, 0);
    return UTIL_OK;
}

/* LLaVA-NeXT: LLaVA's CLIP tower and two-layer projector plus image_newline,
 * one learned vector of the text width. The vision tower is trained in
 * LLaVA-NeXT's fine-tuning stage (LLaVA-NeXT scripts/train: --mm_vision_tower_lr=2e-6),
 * unlike LLaVA-1.5's. The tower's last layer is held in the checkpoint and
 * counted although vision_feature_layer -2 reads the one before it. */
static int import_llava_next(const cJSON *root, const char *what, model_t *m, char *err)
{
    int rc = hf_import_llava(root, what, m, err);
    if (rc) return rc;
    model_module *v = &m->mod[0];
    v->frozen = false;
    hf_section top;
    hf_sec(&top, root, NULL, what, "config");
    if (hf_bool(&top, "multimodal_projector_bias", true, &v->proj_bias, err)) return UTIL_EINVAL;
    v->extra_params = m->mod[1].hidden;
    return UTIL_OK;
}

/* Qwen2.5-Omni's audio tower (Qwen2_5OmniAudioEncoder): Whisper's conv stem
 * and blocks (k_proj without bias), sinusoidal positions held as a buffer
 * (no parameters), ln_post, AvgPool1d(2), proj Linear(d_model -> output_dim)
 * and audio_bos_eos_token, an nn.Embedding(2, output_dim). */
static int import_omni_audio(const cJSON *thinker, const char *what, model_module *mm, char *err)
{
    hf_section s;
    hf_sec(&s, hf_sub(thinker, "audio_config"), NULL, what, "thinker_config.audio_config");
    if (!s.obj) return util_fail(err, UTIL_EINVAL, "%s: thinker_config.audio_config: required object is missing", what);
    int out;
    if (hf_import_whisper(&s, false, mm, err) || hf_int(&s, "output_dim", 3584, &out, err)) return UTIL_EINVAL;
    mm->extra_params = 2 * out;
    mm->out_hidden = out;
    return UTIL_OK;
}

/* Qwen2.5-Omni: the Thinker (Qwen2.5-VL vision tower, the audio tower above,
 * a Qwen2 text model) is what dhp plans. The Talker and Token2Wav (speech
 * output) are left out: they are not part of the thinker's training step. */
static int import_qwen2_5_omni(const cJSON *root, const char *type, const char *what, model_t *m, char *err)
{
    const cJSON *thinker = strcmp(type, "qwen2_5_omni_thinker") ? hf_sub(root, "thinker_config") : root;
    if (!thinker) return util_fail(err, UTIL_EINVAL, "%s: thinker_config: required object is missing", what);
    m->n_modules = 3;
    m->llm = 2;
    if (hf_import_qwen_vision(thinker, what, true, &m->mod[0], err) ||
        import_omni_audio(thinker, what, &m->mod[1], err))
        return UTIL_EINVAL;
    int rc = hf_import_text_config(thinker, "text_config", "qwen2", false, what, &m->mod[2], err);
    if (rc) return rc;
    const model_module *llm = &m->mod[2];
    if (check_width(what, "thinker_config.vision_config.out_hidden_size", m->mod[0].out_hidden, llm, err) ||
        check_width(what, "thinker_config.audio_config.output_dim", m->mod[1].out_hidden, llm, err))
        return UTIL_EINVAL;
    hf_connect(m, &m->mod[0], -1);
    hf_connect(m, &m->mod[1], 0);
    return UTIL_OK;
}

int hf_import_vlm(const cJSON *root, const char *type, const char *what, model_t *m, char *err)
{
    if (!strcmp(type, "qwen2_5_omni") || !strcmp(type, "qwen2_5_omni_thinker"))
        return import_qwen2_5_omni(root, type, what, m, err);
    if (!strcmp(type, "llava_next")) return import_llava_next(root, what, m, err);
    if (!strcmp(type, "idefics3")) return import_idefics3(root, what, m, err);
    if (!strcmp(type, "paligemma")) return import_paligemma(root, what, m, err);
    if (!strcmp(type, "gemma3")) return import_gemma3(root, what, m, err);
    return UTIL_ENOTFOUND;
}
