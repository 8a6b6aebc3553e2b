/* Parameter counting from the architecture description. Every weight
 * matrix, bias, norm, embedding, gate and projector that the published
 * checkpoints hold is counted; buffers (rotary inverse frequencies) are not.
 * Layouts follow the Hugging Face transformers modeling files:
 *   src/transformers/models/{qwen2_5_vl,qwen2_vl,clip,llava,mllama,
 *   qwen2_audio,whisper,llama,qwen2}/modeling_*.py and
 *   OpenGVLab/InternVL internvl_chat/internvl/model/internvl_chat/modeling_intern_vit.py */
#include "models.h"

int64_t model_norm_params(model_norm_kind k, int64_t width)
{
    return k == MODEL_NORM_LAYERNORM ? 2 * width : width;   /* gamma (+ beta) */
}

/* y = x W^T (+ b): W is out x in. */
int64_t model_linear_params(int64_t in, int64_t out, bool bias)
{
    return in * out + (bias ? out : 0);
}

bool model_layer_is_full_attention(const model_module *mm, int layer)
{
    if (mm->window <= 0) return true;
    for (int i = 0; i < mm->n_full_layers; i++)
        if (mm->full_layers[i] == layer) return true;
    return false;
}

bool model_layer_is_cross(const model_module *mm, int layer)
{
    for (int i = 0; i < mm->n_cross_layers; i++)
        if (mm->cross_layers[i] == layer) return true;
    return false;
}

/* q: d x H*hd, k and v: d x KV*hd, o: H*hd x d. */
static int64_t attention_params(const model_module *mm)
{
    int64_t d = mm->hidden, q = (int64_t)mm->heads * mm->head_dim, kv = (int64_t)mm->kv_heads * mm->head_dim;
    return model_linear_params(d, q, mm->qkv_bias) + model_linear_params(d, kv, mm->k_bias) +
           model_linear_params(d, kv, mm->qkv_bias) + model_linear_params(q, d, mm->out_bias);
}

/* GELU: up d->f, down f->d. SwiGLU: gate d->f, up d->f, down f->d. */
static int64_t mlp_params(const model_module *mm)
{
    int64_t d = mm->hidden, f = mm->ffn;
    int64_t up = model_linear_params(d, f, mm->mlp_bias);
    int64_t down = model_linear_params(f, d, mm->mlp_bias);
    return (mm->ffn_kind == MODEL_FFN_SWIGLU ? 2 * up : up) + down;
}

/* Pre-norm block: norm, attention, norm, MLP (+ qk norms, post norms, layer scales, gates). */
static int64_t self_block_params(const model_module *mm, int layer)
{
    int64_t d = mm->hidden;
    int64_t p = 2 * model_norm_params(mm->norm, d) + attention_params(mm) + mlp_params(mm);
    if (mm->qk_norm)
        p += model_norm_params(mm->norm, (int64_t)mm->heads * mm->head_dim) +
             model_norm_params(mm->norm, (int64_t)mm->kv_heads * mm->head_dim);
    if (mm->qk_norm_head) p += 2 * model_norm_params(mm->norm, mm->head_dim);   /* q_norm, k_norm */
    if (mm->post_norms) p += 2 * model_norm_params(mm->norm, d);
    if (mm->layer_scale) p += 2 * d;                    /* ls1, ls2 */
    if (layer >= mm->layers - mm->gated_layers) p += 2; /* gate_attn, gate_ffn */
    return p;
}

/* Mllama gated cross-attention block: norm, cross attention (k,v read the
 * projected vision states of width d) with per-head RMSNorm on q and k,
 * tanh attention gate, norm, MLP, tanh MLP gate. */
static int64_t cross_block_params(const model_module *mm)
{
    return 2 * model_norm_params(mm->norm, mm->hidden) + attention_params(mm) +
           2 * model_norm_params(MODEL_NORM_RMSNORM, mm->head_dim) + mlp_params(mm) + 2;
}

int64_t model_layer_params(const model_module *mm, int layer)
{
    if (mm->kind == MODEL_LLM && model_layer_is_cross(mm, layer)) return cross_block_params(mm);
    return self_block_params(mm, layer);
}

int64_t model_blocks_params(const model_module *mm)
{
    int64_t p = 0;
    for (int l = 0; l < mm->layers; l++) p += model_layer_params(mm, l);
    return p;
}

int64_t model_largest_layer_params(const model_module *mm)
{
    int64_t best = 0;
    for (int l = 0; l < mm->layers; l++) {
        int64_t p = model_layer_params(mm, l);
        if (p > best) best = p;
    }
    return best;
}

/* Vision: conv patch embed C*tp*p*p -> d, class token d, learned positions
 * P x d; Mllama adds a position gate, tile positions A x (T*P*d) and gated
 * pre/post tile embeddings A x (T*d) + 1 each. */
static int64_t vision_embed_params(const model_module *mm)
{
    int64_t d = mm->hidden;
    int64_t kernel = (int64_t)mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    int64_t p = model_linear_params(kernel, d, mm->patch_bias);
    if (mm->cls_token) p += d;
    p += (int64_t)mm->max_positions * d;
    if (mm->max_tiles > 0) {
        int64_t a = mm->aspect_ratios, t = mm->max_tiles;
        p += 1 + a * t * mm->max_positions * d;   /* gated_positional_embedding gate, tile_embedding */
        p += 2 * (a * t * d + 1);                 /* pre/post tile positional embeddings + gates */
    }
    return p;
}

/* Audio (Whisper): conv1 C -> d kernel k, conv2 d -> d kernel k stride 2,
 * learned positions P x d. */
static int64_t audio_embed_params(const model_module *mm)
{
    int64_t d = mm->hidden, k = mm->patch;
    return model_linear_params((int64_t)mm->in_channels * k, d, mm->patch_bias) +
           model_linear_params(d * k, d, mm->patch_bias) + (int64_t)mm->max_positions * d;
}

int64_t model_embed_params(const model_module *mm)
{
    int64_t p;
    switch (mm->kind) {
    case MODEL_LLM: return ((int64_t)mm->vocab + mm->vocab_extra) * mm->hidden;
    case MODEL_VISION: p = vision_embed_params(mm); break;
    default: p = audio_embed_params(mm); break;
    }
    if (mm->pre_norm) p += model_norm_params(mm->norm, mm->hidden);
    return p;
}

/* Encoder: final norm, projector norm, Linear(in->h) GELU Linear(h->out) or
 * one Linear(in->out). LLM: final norm + LM head d x vocab unless tied.
 * Both: extra_params. */
int64_t model_head_params(const model_module *mm)
{
    int64_t p = (mm->final_norm ? model_norm_params(mm->norm, mm->hidden) : 0) + mm->extra_params;
    /* the blocks after the feature layer, held by the checkpoint (their index continues after `layers`) */
    for (int l = 0; l < mm->unused_layers; l++) p += model_layer_params(mm, mm->layers + l);
    if (mm->kind == MODEL_LLM)
        return p + (mm->tied_embeddings ? 0 : (int64_t)mm->vocab * mm->hidden);
    if (mm->proj_norm) p += model_norm_params(mm->proj_norm_kind, mm->proj_norm_width);
    if (mm->proj_hidden > 0)
        p += model_linear_params(mm->proj_in, mm->proj_hidden, mm->proj_bias) +
             model_linear_params(mm->proj_hidden, mm->out_hidden, mm->proj_bias);
    else
        p += model_linear_params(mm->proj_in, mm->out_hidden, mm->proj_bias);
    return p;
}

int64_t model_module_params(const model_module *mm)
{
    return model_embed_params(mm) + model_blocks_params(mm) + model_head_params(mm);
}

int64_t model_total_params(const model_t *m)
{
    int64_t p = 0;
    for (int i = 0; i < m->n_modules; i++) p += model_module_params(&m->mod[i]);
    return p;
}
