/* The one table from dhp's parameter tensors (planner/layout.c,
 * plan_module_tensors: a module kind and a tensor role, per layer) to the
 * Hugging Face checkpoint names and shapes that transformers'
 * save_pretrained writes, per architecture. Read off the modules' attribute
 * names in transformers 4.49.0:
 *   models/qwen2_5_vl/modeling_qwen2_5_vl.py  Qwen2_5_VLForConditionalGeneration
 *     (visual: patch_embed.proj Conv3d without bias, blocks.N.{norm1, norm2,
 *     attn.qkv (rows q; k; v), attn.proj, mlp.{gate,up,down}_proj},
 *     merger.{ln_q, mlp.0, mlp.2}; model: Qwen2-style text model; lm_head)
 *   models/qwen2_audio/modeling_qwen2_audio.py  Qwen2AudioForConditionalGeneration
 *     (audio_tower: conv1, conv2 Conv1d, embed_positions, layers.N.{
 *     self_attn_layer_norm, self_attn.{q,k,v,out}_proj, final_layer_norm, fc1,
 *     fc2}, layer_norm; multi_modal_projector.linear; language_model: a
 *     Qwen2ForCausalLM, so language_model.model.* and language_model.lm_head)
 *   models/llava/modeling_llava.py  LlavaForConditionalGeneration (vision_tower:
 *     a CLIPVisionModel, models/clip/modeling_clip.py: vision_model.embeddings.{
 *     patch_embedding Conv2d without bias, class_embedding, position_embedding},
 *     pre_layrnorm, encoder.layers.N.{layer_norm1, self_attn.{q,k,v,out}_proj,
 *     layer_norm2, mlp.fc1, mlp.fc2}, post_layernorm; multi_modal_projector.{
 *     linear_1, linear_2}; language_model: a LlamaForCausalLM, whose model
 *     has Qwen2Model's names, without biases)
 *   models/qwen2/modeling_qwen2.py  Qwen2Model (embed_tokens, layers.N.{
 *     input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
 *     mlp.{gate,up,down}_proj}, norm). */
#include "executor/executor.h"

#include <stdio.h>
#include <string.h>

enum { WHOLE = 0, PART_Q, PART_K, PART_V };   /* its own tensor, or q / k / v rows of a fused qkv */
enum { SHAPE_DHP = 0, SHAPE_CONV3D, SHAPE_CONV1D, SHAPE_CONV2D };

typedef struct {
    plan_tensor_role role;
    const char *fmt;      /* %d: the layer; LLM rows are relative to the architecture's text prefix */
    int part, shape;
} hf_row;

static const hf_row QWEN25_VISION[] = {
    { PLAN_TW_PATCH_W, "visual.patch_embed.proj.weight", WHOLE, SHAPE_CONV3D },
    { PLAN_TW_LN1, "visual.blocks.%d.norm1.weight", WHOLE, 0 },
    { PLAN_TW_WQ, "visual.blocks.%d.attn.qkv.weight", PART_Q, 0 },
    { PLAN_TW_BQ, "visual.blocks.%d.attn.qkv.bias", PART_Q, 0 },
    { PLAN_TW_WK, "visual.blocks.%d.attn.qkv.weight", PART_K, 0 },
    { PLAN_TW_BK, "visual.blocks.%d.attn.qkv.bias", PART_K, 0 },
    { PLAN_TW_WV, "visual.blocks.%d.attn.qkv.weight", PART_V, 0 },
    { PLAN_TW_BV, "visual.blocks.%d.attn.qkv.bias", PART_V, 0 },
    { PLAN_TW_WO, "visual.blocks.%d.attn.proj.weight", WHOLE, 0 },
    { PLAN_TW_BO, "visual.blocks.%d.attn.proj.bias", WHOLE, 0 },
    { PLAN_TW_LN2, "visual.blocks.%d.norm2.weight", WHOLE, 0 },
    { PLAN_TW_WG, "visual.blocks.%d.mlp.gate_proj.weight", WHOLE, 0 },
    { PLAN_TW_BG, "visual.blocks.%d.mlp.gate_proj.bias", WHOLE, 0 },
    { PLAN_TW_WU, "visual.blocks.%d.mlp.up_proj.weight", WHOLE, 0 },
    { PLAN_TW_BU, "visual.blocks.%d.mlp.up_proj.bias", WHOLE, 0 },
    { PLAN_TW_WD, "visual.blocks.%d.mlp.down_proj.weight", WHOLE, 0 },
    { PLAN_TW_BD, "visual.blocks.%d.mlp.down_proj.bias", WHOLE, 0 },
    { PLAN_TW_MERGE_LN, "visual.merger.ln_q.weight", WHOLE, 0 },
    { PLAN_TW_M0W, "visual.merger.mlp.0.weight", WHOLE, 0 },
    { PLAN_TW_M0B, "visual.merger.mlp.0.bias", WHOLE, 0 },
    { PLAN_TW_M2W, "visual.merger.mlp.2.weight", WHOLE, 0 },
    { PLAN_TW_M2B, "visual.merger.mlp.2.bias", WHOLE, 0 },
};

static const hf_row QWEN2_AUDIO[] = {
    { PLAN_TW_CONV1_W, "audio_tower.conv1.weight", WHOLE, SHAPE_CONV1D },
    { PLAN_TW_CONV1_B, "audio_tower.conv1.bias", WHOLE, 0 },
    { PLAN_TW_CONV2_W, "audio_tower.conv2.weight", WHOLE, SHAPE_CONV1D },
    { PLAN_TW_CONV2_B, "audio_tower.conv2.bias", WHOLE, 0 },
    { PLAN_TW_POS, "audio_tower.embed_positions.weight", WHOLE, 0 },
    { PLAN_TW_LN1, "audio_tower.layers.%d.self_attn_layer_norm.weight", WHOLE, 0 },
    { PLAN_TW_LN1_B, "audio_tower.layers.%d.self_attn_layer_norm.bias", WHOLE, 0 },
    { PLAN_TW_WQ, "audio_tower.layers.%d.self_attn.q_proj.weight", WHOLE, 0 },
    { PLAN_TW_BQ, "audio_tower.layers.%d.self_attn.q_proj.bias", WHOLE, 0 },
    { PLAN_TW_WK, "audio_tower.layers.%d.self_attn.k_proj.weight", WHOLE, 0 },
    { PLAN_TW_BK, "audio_tower.layers.%d.self_attn.k_proj.bias", WHOLE, 0 },
    { PLAN_TW_WV, "audio_tower.layers.%d.self_attn.v_proj.weight", WHOLE, 0 },
    { PLAN_TW_BV, "audio_tower.layers.%d.self_attn.v_proj.bias", WHOLE, 0 },
    { PLAN_TW_WO, "audio_tower.layers.%d.self_attn.out_proj.weight", WHOLE, 0 },
    { PLAN_TW_BO, "audio_tower.layers.%d.self_attn.out_proj.bias", WHOLE, 0 },
    { PLAN_TW_LN2, "audio_tower.layers.%d.final_layer_norm.weight", WHOLE, 0 },
    { PLAN_TW_LN2_B, "audio_tower.layers.%d.final_layer_norm.bias", WHOLE, 0 },
    { PLAN_TW_WU, "audio_tower.layers.%d.fc1.weight", WHOLE, 0 },
    { PLAN_TW_BU, "audio_tower.layers.%d.fc1.bias", WHOLE, 0 },
    { PLAN_TW_WD, "audio_tower.layers.%d.fc2.weight", WHOLE, 0 },
    { PLAN_TW_BD, "audio_tower.layers.%d.fc2.bias", WHOLE, 0 },
    { PLAN_TW_LNF, "audio_tower.layer_norm.weight", WHOLE, 0 },
    { PLAN_TW_LNF_B, "audio_tower.layer_norm.bias", WHOLE, 0 },
    { PLAN_TW_PROJ_W, "multi_modal_projector.linear.weight", WHOLE, 0 },
    { PLAN_TW_PROJ_B, "multi_modal_projector.linear.bias", WHOLE, 0 },
};

#define CLIP "vision_tower.vision_model."
static const hf_row LLAVA_VISION[] = {
    { PLAN_TW_PATCH_W, CLIP "embeddings.patch_embedding.weight", WHOLE, SHAPE_CONV2D },
    { PLAN_TW_CLS, CLIP "embeddings.class_embedding", WHOLE, 0 },
    { PLAN_TW_POS, CLIP "embeddings.position_embedding.weight", WHOLE, 0 },
    { PLAN_TW_PRE_LN, CLIP "pre_layrnorm.weight", WHOLE, 0 },
    { PLAN_TW_PRE_LN_B, CLIP "pre_layrnorm.bias", WHOLE, 0 },
    { PLAN_TW_LN1, CLIP "encoder.layers.%d.layer_norm1.weight", WHOLE, 0 },
    { PLAN_TW_LN1_B, CLIP "encoder.layers.%d.layer_norm1.bias", WHOLE, 0 },
    { PLAN_TW_WQ, CLIP "encoder.layers.%d.self_attn.q_proj.weight", WHOLE, 0 },
    { PLAN_TW_BQ, CLIP "encoder.layers.%d.self_attn.q_proj.bias", WHOLE, 0 },
    { PLAN_TW_WK, CLIP "encoder.layers.%d.self_attn.k_proj.weight", WHOLE, 0 },
    { PLAN_TW_BK, CLIP "encoder.layers.%d.self_attn.k_proj.bias", WHOLE, 0 },
    { PLAN_TW_WV, CLIP "encoder.layers.%d.self_attn.v_proj.weight", WHOLE, 0 },
    { PLAN_TW_BV, CLIP "encoder.layers.%d.self_attn.v_proj.bias", WHOLE, 0 },
    { PLAN_TW_WO, CLIP "encoder.layers.%d.self_attn.out_proj.weight", WHOLE, 0 },
    { PLAN_TW_BO, CLIP "encoder.layers.%d.self_attn.out_proj.bias", WHOLE, 0 },
    { PLAN_TW_LN2, CLIP "encoder.layers.%d.layer_norm2.weight", WHOLE, 0 },
    { PLAN_TW_LN2_B, CLIP "encoder.layers.%d.layer_norm2.bias", WHOLE, 0 },
    { PLAN_TW_WU, CLIP "encoder.layers.%d.mlp.fc1.weight", WHOLE, 0 },
    { PLAN_TW_BU, CLIP "encoder.layers.%d.mlp.fc1.bias", WHOLE, 0 },
    { PLAN_TW_WD, CLIP "encoder.layers.%d.mlp.fc2.weight", WHOLE, 0 },
    { PLAN_TW_BD, CLIP "encoder.layers.%d.mlp.fc2.bias", WHOLE, 0 },
    { PLAN_TW_LNF, CLIP "post_layernorm.weight", WHOLE, 0 },
    { PLAN_TW_LNF_B, CLIP "post_layernorm.bias", WHOLE, 0 },
    { PLAN_TW_M0W, "multi_modal_projector.linear_1.weight", WHOLE, 0 },
    { PLAN_TW_M0B, "multi_modal_projector.linear_1.bias", WHOLE, 0 },
    { PLAN_TW_M2W, "multi_modal_projector.linear_2.weight", WHOLE, 0 },
    { PLAN_TW_M2B, "multi_modal_projector.linear_2.bias", WHOLE, 0 },
};

static const hf_row QWEN2_TEXT[] = {
    { PLAN_TW_WTE, "embed_tokens.weight", WHOLE, 0 },
    { PLAN_TW_LN1, "layers.%d.input_layernorm.weight", WHOLE, 0 },
    { PLAN_TW_WQ, "layers.%d.self_attn.q_proj.weight", WHOLE, 0 },
    { PLAN_TW_BQ, "layers.%d.self_attn.q_proj.bias", WHOLE, 0 },
    { PLAN_TW_WK, "layers.%d.self_attn.k_proj.weight", WHOLE, 0 },
    { PLAN_TW_BK, "layers.%d.self_attn.k_proj.bias", WHOLE, 0 },
    { PLAN_TW_WV, "layers.%d.self_attn.v_proj.weight", WHOLE, 0 },
    { PLAN_TW_BV, "layers.%d.self_attn.v_proj.bias", WHOLE, 0 },
    { PLAN_TW_WO, "layers.%d.self_attn.o_proj.weight", WHOLE, 0 },
    { PLAN_TW_LN2, "layers.%d.post_attention_layernorm.weight", WHOLE, 0 },
    { PLAN_TW_WG, "layers.%d.mlp.gate_proj.weight", WHOLE, 0 },
    { PLAN_TW_WU, "layers.%d.mlp.up_proj.weight", WHOLE, 0 },
    { PLAN_TW_WD, "layers.%d.mlp.down_proj.weight", WHOLE, 0 },
    { PLAN_TW_LNF, "norm.weight", WHOLE, 0 },
};

#define N_OF(a) (int)(sizeof a / sizeof a[0])

typedef struct {
    ex_hf_arch id;
    const char *model_type, *architecture;
    model_kind encoder;
    const hf_row *rows;
    int n_rows;
    const char *text_prefix, *head;   /* the text model's prefix; the untied LM head's name */
} hf_arch;

static const hf_arch ARCHS[] = {
    { EX_HF_QWEN2_5_VL, "qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", MODEL_VISION, QWEN25_VISION,
      N_OF(QWEN25_VISION), "model.", "lm_head.weight" },
    { EX_HF_QWEN2_AUDIO, "qwen2_audio", "Qwen2AudioForConditionalGeneration", MODEL_AUDIO, QWEN2_AUDIO,
      N_OF(QWEN2_AUDIO), "language_model.model.", "language_model.lm_head.weight" },
    { EX_HF_LLAVA, "llava", "LlavaForConditionalGeneration", MODEL_VISION, LLAVA_VISION, N_OF(LLAVA_VISION),
      "language_model.model.", "language_model.lm_head.weight" },
};

/* What of the layer's module the table does not express: Qwen2.5-VL's
 * patch embedding has no bias, its text attention output none either. */
static int check_fit(const hf_arch *a, const model_t *m, char *err)
{
    bool llama = a->id == EX_HF_LLAVA;   /* LLaVA-1.5's Vicuna: a Llama without biases */
    for (int k = 0; k < m->n_modules; k++) {
        const model_module *mm = &m->mod[k];
        if (mm->kind == MODEL_LLM && (mm->out_bias || mm->mlp_bias || mm->qkv_bias != !llama ||
                                      mm->norm != MODEL_NORM_RMSNORM || mm->ffn_kind != MODEL_FFN_SWIGLU))
            return util_fail(err, UTIL_EINVAL, "model %s: module %s is not a %s text model (RMSNorm, SwiGLU, %s), "
                             "which %s holds", m->name, mm->name, llama ? "Llama" : "Qwen2",
                             llama ? "no biases" : "biases on q/k/v only", a->model_type);
        if (llama && mm->kind == MODEL_VISION && !plan_module_clip(mm))
            return util_fail(err, UTIL_EINVAL, "model %s: module %s is not a CLIP vision tower (cls_token), which %s holds",
                             m->name, mm->name, a->model_type);
        if (a->id == EX_HF_QWEN2_5_VL && mm->kind == MODEL_VISION &&
            (mm->norm != MODEL_NORM_RMSNORM || mm->ffn_kind != MODEL_FFN_SWIGLU || mm->cls_token || mm->max_positions))
            return util_fail(err, UTIL_EINVAL, "model %s: module %s is not a Qwen2.5-VL vision tower (RMSNorm, SwiGLU, rotary "
                             "positions), which %s holds", m->name, mm->name, a->model_type);
        if (a->id == EX_HF_QWEN2_5_VL && mm->kind == MODEL_VISION && mm->patch_bias)
            return util_fail(err, UTIL_EINVAL, "model %s: module %s has a patch embedding bias; %s's has none (patch_bias: false)",
                             m->name, mm->name, a->model_type);
    }
    return UTIL_OK;
}

static const hf_arch *arch_of(const model_t *m, char *err)
{
    int enc = -1, n_enc = 0;
    for (int k = 0; k < m->n_modules; k++)
        if (m->mod[k].kind != MODEL_LLM) { enc = k; n_enc++; }
    for (size_t i = 0; n_enc == 1 && i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (ARCHS[i].encoder == m->mod[enc].kind && (ARCHS[i].id == EX_HF_LLAVA) == plan_module_clip(&m->mod[enc]))
            return check_fit(&ARCHS[i], m, err) ? NULL : &ARCHS[i];
    util_fail(err, UTIL_EINVAL, "model %s: no Hugging Face layout for its %d encoder(s); supported: one vision encoder "
              "(qwen2_5_vl, or a CLIP tower: llava) or one audio encoder (qwen2_audio) feeding the LLM", m->name, n_enc);
    return NULL;
}

int ex_hf_arch_of(const model_t *m, ex_hf_arch *out, const char **model_type, const char **architecture, char *err)
{
    const hf_arch *a = arch_of(m, err);
    if (!a) return UTIL_EINVAL;
    if (out) *out = a->id;
    if (model_type) *model_type = a->model_type;
    if (architecture) *architecture = a->architecture;
    return UTIL_OK;
}

static void hf_shape(const model_module *mm, const plan_tensor *t, int kind, ex_hf_ref *r)
{
    r->ndim = t->ndim;
    r->shape[0] = t->full[0];
    r->shape[1] = t->full[1];
    if (kind == SHAPE_CONV3D) {        /* Conv3d [d, C, T, P, P] */
        int64_t s[5] = { t->full[0], mm->in_channels, mm->temporal_patch, mm->patch, mm->patch };
        r->ndim = 5;
        memcpy(r->shape, s, sizeof s);
    } else if (kind == SHAPE_CONV2D) { /* Conv2d [d, C, P, P] */
        int64_t s[4] = { t->full[0], mm->in_channels, mm->patch, mm->patch };
        r->ndim = 4;
        memcpy(r->shape, s, sizeof s);
    } else if (kind == SHAPE_CONV1D) { /* Conv1d [d, C_in, k] */
        r->ndim = 3;
        r->shape[1] = t->full[1] / mm->patch;
        r->shape[2] = mm->patch;
    }
}

int ex_hf_ref_of(const model_t *m, const model_module *mm, const plan_tensor *t, ex_hf_ref *out, char *err)
{
    const hf_arch *a = arch_of(m, err);
    if (!a) return UTIL_EINVAL;
    memset(out, 0, sizeof *out);
    const hf_row *rows = mm->kind == MODEL_LLM ? QWEN2_TEXT : a->rows;
    int n = mm->kind == MODEL_LLM ? N_OF(QWEN2_TEXT) : a->n_rows;
    const char *prefix = mm->kind == MODEL_LLM ? a->text_prefix : "";
    if (mm->kind == MODEL_LLM && t->role == PLAN_TW_HEAD) {
        if (t->tied_copy) snprintf(out->name, sizeof out->name, "%sembed_tokens.weight", prefix);
        else util_strlcpy(out->name, a->head, sizeof out->name);
        hf_shape(mm, t, SHAPE_DHP, out);
        return UTIL_OK;
    }
    for (int i = 0; i < n; i++) {
        if (rows[i].role != t->role) continue;
        char local[160];
        snprintf(local, sizeof local, rows[i].fmt, t->layer);
        snprintf(out->name, sizeof out->name, "%s%s", prefix, local);
        hf_shape(mm, t, rows[i].shape, out);
        if (rows[i].part != WHOLE) {   /* rows q; k; v of the fused projection */
            int64_t qd = (int64_t)mm->heads * mm->head_dim, kd = (int64_t)mm->kv_heads * mm->head_dim;
            out->row0 = rows[i].part == PART_Q ? 0 : rows[i].part == PART_K ? qd : qd + kd;
            out->shape[0] = qd + 2 * kd;
        }
        return UTIL_OK;
    }
    return util_fail(err, UTIL_EINVAL, "model %s: tensor %s.%s has no %s counterpart", m->name, mm->name, t->name,
                     a->model_type);
}

