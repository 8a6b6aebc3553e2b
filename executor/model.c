/* The training algorithm: a Qwen2.5-VL style vision encoder + merger feeding
 * a decoder LLM, forward and backward, over kernels of an ex_backend.
 * Architecture reference: Hugging Face transformers
 * src/transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py (vision blocks,
 * VisionRotaryEmbedding, PatchMerger) and models/qwen2/modeling_qwen2.py (LLM).
 * Every layer works on LOCAL shapes held in ex_module (d, H, Hkv, hd, f), so
 * tensor/sequence parallel code can reuse it with collectives in between. */
#include "executor/executor.h"
#include "executor/backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Qwen2.5-VL config.json "rms_norm_eps": 1e-06 (vision and text),
 * https://huggingface.co/Qwen/Qwen2.5-VL-7B-Instruct/blob/main/config.json */
#define EX_NORM_EPS 1e-6f
/* RoPE base: the vision rotary uses theta 10000 (VisionRotaryEmbedding in
 * modeling_qwen2_5_vl.py); models.h has no rope_theta field yet, so the LLM
 * uses 10000 too (the tiny zoo models' value). */
#define EX_ROPE_THETA 10000.0
#define EX_INIT_STD 0.02f

typedef struct {
    float *ln1, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
    float *ln2, *wg, *bg, *wu, *bu, *wd, *bd;
} ex_block_w;

typedef struct {
    float *patch_w, *patch_b;                 /* vision */
    float *merge_ln, *m0w, *m0b, *m2w, *m2b;  /* vision merger */
    float *wte, *lnf, *head;                  /* llm; head == wte when tied */
    ex_block_w *blk;                          /* [layers] */
} ex_weights;

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];          /* local shard shape */
    int64_t full[2], start[2]; /* the full tensor's shape and this shard's first row / column */
    bool sharded;              /* split over the tensor-parallel group (else replicated) */
    int split_axis;            /* sharded: 0 rows, 1 columns */
    size_t off, numel;
    bool decay;
    float init_std;          /* 0: constant init_const */
    float init_const;
    float **pslot, **gslot;  /* view pointers to set */
} ex_tensor;

/* Saved activations of one block (all [N, .] with N local rows). */
typedef struct {
    float *x, *ln1, *rstd1, *q, *k, *v, *att, *lse, *xmid, *ln2, *rstd2, *g, *u, *h;
    float *att_loc;            /* sp > 1: attention output in local-row layout (q..lse are all-rows, local-heads) */
} ex_block_acts;

/* Activations: "saved" ones (S) are what a forward leaves for its backward and
 * live in the module's current slot; the rest (X) are scratch shared by all
 * slots (backward temporaries, the sp all-to-all buffers). */
typedef struct {
    ex_block_acts *blk;        /* [layers]; blk[l].x is layer l's input (all S) */
    float *x_final;            /* [N, d] last block's output */
    float *cos, *sin;          /* [N, hd/2] */
    /* vision merger */
    float *mln, *mrstd, *h1, *a1, *vout;
    /* llm head (S), over the n_pred predicting rows: xg = their final hidden
     * states, gath = rmsnorm(xg), ce_mx / ce_st = cross-entropy row max and
     * [sum-exp, target logit]; emb (X): vocab-parallel embedding rows [batch * text_tokens, d] */
    float *xg, *rstdf, *gath, *logits, *dlogits, *ce_mx, *ce_st, *emb;
    /* backward scratch (X) */
    float *dres, *dln, *dq, *dk, *dv, *datt, *dg, *du, *dh, *dgath, *dxg, *dh1, *da1, *dvis;
    float *sp_pack, *sp_dq, *sp_dk, *sp_dv, *sp_datt;   /* sp > 1 only */
} ex_acts;

/* One forward's saved activations and geometry (a vision slot, or the LLM's only one). */
typedef struct {
    float *mem;
    size_t cap;                /* floats */
    int *cu, *cu_win;          /* cu_seqlens: per sequence / per window */
    int n_cu_cap;
    int n_rows, m_rows, n_pred, emb_rows, n_seq, n_win;
    bool filled;               /* a forward ran in it */
} ex_slot;

typedef struct {
    model_module mm;
    int d, H, Hkv, hd, f;      /* local shard shapes */
    int vocab0, vocab_n;       /* llm: this rank's vocab rows [vocab0, vocab0 + vocab_n) */
    int tp, tp_rank;           /* tensor-parallel group size and rank (1, 0 = none) */
    int sp, sp_rank;           /* Ulysses sequence-parallel group size and rank (1, 0 = none) */
    ex_parallel par;
    int comm_rc;               /* first failing collective's code, 0 if none */
    int n_tensors, cap_tensors;
    ex_tensor *t;
    size_t n_params;
    float *params, *grads, *m, *v;
    size_t m_lo, m_hi;         /* AdamW moments m, v hold elements [m_lo, m_hi) (ZeRO-1) */
    ex_weights w, g;
    ex_acts a;                 /* views into slot[cur] and scratch */
    ex_slot slot[EX_MAX_SLOTS];
    int cur;                   /* bound slot */
    float *scratch;
    size_t scratch_cap;        /* floats */
    /* the bound slot's geometry (copies of its fields) */
    int *cu, *cu_win;
    int n_rows, n_seq, n_win;  /* n_rows is the local row count */
} ex_module;

struct ex_model {
    model_t m;
    const ex_backend *be;
    ex_module vis, llm;
    bool has_vis, has_llm;     /* modules instantiated on this rank */
    int vis_index;             /* vision module in m, -1 if the model has none */
    int adam_t;
    /* last forward's batch geometry */
    int merged_per_image, n_pred;
    int32_t *targets;
    int *pred_rows;
    int targets_cap;
};

/* ---------------------------------------------------------------- layout */

static int add_tensor(ex_module *md, const char *name, int ndim, int64_t d0, int64_t d1,
                      float **pslot, float **gslot, float std, float cst, char *err)
{
    if (md->n_tensors == md->cap_tensors) {
        int cap = md->cap_tensors ? 2 * md->cap_tensors : 64;
        ex_tensor *t = util_realloc(md->t, (size_t)cap * sizeof *t);
        if (!t) return util_fail(err, UTIL_ENOMEM, "executor: out of memory for tensor table");
        md->t = t;
        md->cap_tensors = cap;
    }
    ex_tensor *t = &md->t[md->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s.%s", md->mm.name, name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 1;
    t->numel = (size_t)(d0 * t->shape[1]);
    t->full[0] = t->shape[0];
    t->full[1] = t->shape[1];
    t->off = md->n_params;
    t->decay = ndim >= 2;
    t->init_std = std;
    t->init_const = cst;
    t->pslot = pslot;
    t->gslot = gslot;
    md->n_params += t->numel;
    return UTIL_OK;
}

/* Marks the last tensor as this rank's tp slice along axis (0 rows, 1 columns). */
static void shard_last(ex_module *md, int axis)
{
    ex_tensor *t = &md->t[md->n_tensors - 1];
    if (md->tp <= 1) return;
    t->full[axis] = t->shape[axis] * md->tp;
    t->start[axis] = t->shape[axis] * md->tp_rank;
    t->sharded = true;
    t->split_axis = axis;
}

#define ADD_MAT(nm, o, i, field, std) \
    do { int _rc = add_tensor(md, nm, 2, o, i, &W->field, &G->field, std, 0, err); if (_rc) return _rc; } while (0)
#define ADD_VEC(nm, n, field, cst) \
    do { int _rc = add_tensor(md, nm, 1, n, 1, &W->field, &G->field, 0, cst, err); if (_rc) return _rc; } while (0)
#define ADD_MAT_SHARD(nm, o, i, field, std, axis) do { ADD_MAT(nm, o, i, field, std); shard_last(md, axis); } while (0)
#define ADD_VEC_SHARD(nm, n, field, cst) do { ADD_VEC(nm, n, field, cst); shard_last(md, 0); } while (0)

static int layout_blocks(ex_module *md, char *err)
{
    const model_module *mm = &md->mm;
    int d = md->d, qd = md->H * md->hd, kd = md->Hkv * md->hd, f = md->f;
    float std_out = EX_INIT_STD / sqrtf(2.0f * (float)mm->layers);
    const char *blk = mm->kind == MODEL_LLM ? "layers" : "blocks";
    char nm[80];
    for (int l = 0; l < mm->layers; l++) {
        ex_block_w *W = &md->w.blk[l], *G = &md->g.blk[l];
#define N_(s) (snprintf(nm, sizeof nm, "%s.%d.%s", blk, l, s), nm)
        ADD_VEC(N_("norm1.weight"), d, ln1, 1.0f);
        ADD_MAT_SHARD(N_("attn.q.weight"), qd, d, wq, EX_INIT_STD, 0);
        if (mm->qkv_bias) ADD_VEC_SHARD(N_("attn.q.bias"), qd, bq, 0.0f);
        ADD_MAT_SHARD(N_("attn.k.weight"), kd, d, wk, EX_INIT_STD, 0);
        if (mm->qkv_bias) ADD_VEC_SHARD(N_("attn.k.bias"), kd, bk, 0.0f);
        ADD_MAT_SHARD(N_("attn.v.weight"), kd, d, wv, EX_INIT_STD, 0);
        if (mm->qkv_bias) ADD_VEC_SHARD(N_("attn.v.bias"), kd, bv, 0.0f);
        ADD_MAT_SHARD(N_("attn.o.weight"), d, qd, wo, std_out, 1);
        if (mm->out_bias) ADD_VEC(N_("attn.o.bias"), d, bo, 0.0f);
        ADD_VEC(N_("norm2.weight"), d, ln2, 1.0f);
        ADD_MAT_SHARD(N_("mlp.gate.weight"), f, d, wg, EX_INIT_STD, 0);
        if (mm->mlp_bias) ADD_VEC_SHARD(N_("mlp.gate.bias"), f, bg, 0.0f);
        ADD_MAT_SHARD(N_("mlp.up.weight"), f, d, wu, EX_INIT_STD, 0);
        if (mm->mlp_bias) ADD_VEC_SHARD(N_("mlp.up.bias"), f, bu, 0.0f);
        ADD_MAT_SHARD(N_("mlp.down.weight"), d, f, wd, std_out, 1);
        if (mm->mlp_bias) ADD_VEC(N_("mlp.down.bias"), d, bd, 0.0f);
#undef N_
    }
    return UTIL_OK;
}

static int layout_vision(ex_module *md, char *err)
{
    const model_module *mm = &md->mm;
    ex_weights *W = &md->w, *G = &md->g;
    int cpp = mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    ADD_MAT("patch_embed.weight", md->d, cpp, patch_w, EX_INIT_STD);
    ADD_VEC("patch_embed.bias", md->d, patch_b, 0.0f);
    int rc = layout_blocks(md, err);
    if (rc) return rc;
    ADD_VEC("merger.norm.weight", md->d, merge_ln, 1.0f);
    ADD_MAT("merger.fc1.weight", mm->proj_hidden, mm->proj_in, m0w, EX_INIT_STD);
    ADD_VEC("merger.fc1.bias", mm->proj_hidden, m0b, 0.0f);
    ADD_MAT("merger.fc2.weight", mm->out_hidden, mm->proj_hidden, m2w, EX_INIT_STD);
    ADD_VEC("merger.fc2.bias", mm->out_hidden, m2b, 0.0f);
    return UTIL_OK;
}

static int layout_llm(ex_module *md, char *err)
{
    const model_module *mm = &md->mm;
    ex_weights *W = &md->w, *G = &md->g;
    ADD_MAT_SHARD("embed_tokens.weight", md->vocab_n, md->d, wte, EX_INIT_STD, 0);
    int rc = layout_blocks(md, err);
    if (rc) return rc;
    ADD_VEC("norm.weight", md->d, lnf, 1.0f);
    if (!mm->tied_embeddings) ADD_MAT_SHARD("lm_head.weight", md->vocab_n, md->d, head, EX_INIT_STD, 0);
    return UTIL_OK;
}

/* ------------------------------------------------------------------ init */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Element j of a tensor's N(0, 1) stream: Box-Muller over the 53-bit uniforms
 * of splitmix64 outputs 2j and 2j+1 from state s0 (stateless, so any shard
 * draws exactly its slice of the full tensor). */
static double rng_normal_at(uint64_t s0, uint64_t j)
{
    uint64_t a = s0 + 2 * j * 0x9E3779B97F4A7C15ull, b = a + 0x9E3779B97F4A7C15ull;
    double u1 = ((splitmix64(&a) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = ((splitmix64(&b) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static void init_module(ex_module *md, uint64_t seed)
{
    for (int i = 0; i < md->n_tensors; i++) {
        ex_tensor *t = &md->t[i];
        float *p = md->params + t->off;
        if (t->init_std == 0) {
            for (size_t j = 0; j < t->numel; j++) p[j] = t->init_const;
            continue;
        }
        uint64_t s0 = seed ^ fnv1a64(t->name);
        for (int64_t r = 0; r < t->shape[0]; r++)
            for (int64_t c = 0; c < t->shape[1]; c++) {
                uint64_t j = (uint64_t)((t->start[0] + r) * t->full[1] + t->start[1] + c);
                p[r * t->shape[1] + c] = (float)(t->init_std * rng_normal_at(s0, j));
            }
    }
}

/* -------------------------------------------------------------- validate */

static int check_common(const model_module *mm, char *err)
{
    const char *n = mm->name;
    if (mm->layers <= 0 || mm->hidden <= 0 || mm->heads <= 0 || mm->kv_heads <= 0 ||
        mm->head_dim <= 0 || mm->ffn <= 0)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: layers, hidden, heads, kv_heads, head_dim, ffn must be > 0", n);
    if (mm->heads % mm->kv_heads)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: kv_heads %d does not divide heads %d", n, mm->kv_heads, mm->heads);
    int rot = mm->kind == MODEL_VISION ? 4 : 2;   /* 2-D rotary splits head_dim / 2 pairs in two */
    if (mm->head_dim % rot || mm->head_dim > EX_MAX_HEAD_DIM)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: head_dim %d must be a multiple of %d and <= %d", n, mm->head_dim, rot, EX_MAX_HEAD_DIM);
    if (mm->ffn_kind != MODEL_FFN_SWIGLU)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: ffn_kind gelu is not implemented (swiglu only)", n);
    if (mm->norm != MODEL_NORM_RMSNORM)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: layernorm is not implemented (rmsnorm only)", n);
    if (mm->qk_norm || mm->layer_scale || mm->n_cross_layers || mm->cls_token || mm->max_positions ||
        mm->qk_norm_head || mm->post_norms || mm->extra_params)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: qk norms, post norms, layer_scale, cross layers, cls_token, learned positions and extra parameters are not implemented", n);
    return UTIL_OK;
}

static int check_vision(const model_module *mm, const model_module *llm, char *err)
{
    const char *n = mm->name;
    int m = mm->merge;
    if (mm->in_channels <= 0 || mm->patch <= 0 || mm->temporal_patch <= 0 || m <= 0)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: in_channels, patch, temporal_patch, merge must be > 0", n);
    if (mm->proj_hidden <= 0)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: proj_hidden 0 (single linear projector) is not implemented", n);
    if (mm->proj_in != mm->hidden * m * m)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: proj_in %d != hidden %d * merge^2", n, mm->proj_in, mm->hidden);
    if (mm->out_hidden != llm->hidden)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: out_hidden %d != llm hidden %d", n, mm->out_hidden, llm->hidden);
    if (!mm->proj_norm)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: merger without proj_norm is not implemented", n);
    if (mm->window > 0) {
        int side = (int)lround(sqrt((double)mm->window));
        if (side * side != mm->window || side % m)
            return util_fail(err, UTIL_EINVAL, "executor: module %s: window %d is not a square of a multiple of merge %d", n, mm->window, m);
    }
    return UTIL_OK;
}

/* ---------------------------------------------------------------- create */

static void module_free(ex_module *md)
{
    util_free(md->t);
    util_free(md->params);
    util_free(md->grads);
    util_free(md->m);
    util_free(md->v);
    util_free(md->w.blk);
    util_free(md->g.blk);
    util_free(md->a.blk);
    for (int i = 0; i < EX_MAX_SLOTS; i++) {
        util_free(md->slot[i].mem);
        util_free(md->slot[i].cu);
        util_free(md->slot[i].cu_win);
    }
    util_free(md->scratch);
    memset(md, 0, sizeof *md);
}

/* Checks one module's parallel layout: tp over heads / kv heads / ffn (and the
 * vocabulary for the LLM), sp (vision only) over heads of the local tp shard. */
static int check_layout(const ex_module *md, const ex_parallel *par, char *err)
{
    const model_module *mm = &md->mm;
    const char *n = mm->name;
    if (mm->kind == MODEL_LLM && md->sp > 1)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: sequence parallelism of the LLM is not implemented (sp_size %d)", n, md->sp);
    if (md->sp > 1 && (md->sp_rank < 0 || md->sp_rank >= md->sp || !par->alltoall))
        return util_fail(err, UTIL_EINVAL, "executor: module %s: sp_rank %d outside sp_size %d or no alltoall", n, md->sp_rank, md->sp);
    if (md->tp > 1 && (md->tp_rank < 0 || md->tp_rank >= md->tp || !par->allreduce_sum))
        return util_fail(err, UTIL_EINVAL, "executor: module %s: tp_rank %d outside tp_size %d or no allreduce_sum", n, md->tp_rank, md->tp);
    if (mm->heads % (md->tp * md->sp) || mm->kv_heads % (md->tp * md->sp))
        return util_fail(err, UTIL_EINVAL, "executor: module %s: tp_size %d x sp_size %d does not divide heads %d and kv_heads %d", n, md->tp, md->sp, mm->heads, mm->kv_heads);
    if (mm->ffn % md->tp)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: tp_size %d does not divide ffn %d", n, md->tp, mm->ffn);
    if (mm->kind == MODEL_LLM && md->tp > 1) {
        if (mm->vocab % md->tp)
            return util_fail(err, UTIL_EINVAL, "executor: module %s: vocab %d is not a multiple of tp_size %d (vocab-parallel embedding and LM head; pad the vocabulary)", n, mm->vocab, md->tp);
        if (!par->allreduce_max)
            return util_fail(err, UTIL_EINVAL, "executor: module %s: tp_size %d needs allreduce_max (vocab-parallel cross-entropy)", n, md->tp);
    }
    return UTIL_OK;
}

static int module_create(ex_module *md, const model_module *mm, uint64_t seed,
                         const ex_parallel *par, char *err)
{
    memset(md, 0, sizeof *md);
    md->mm = *mm;
    md->tp = par && par->tp_size > 1 ? par->tp_size : 1;
    md->tp_rank = md->tp > 1 ? par->tp_rank : 0;
    if (par) md->par = *par;
    md->sp = par && par->sp_size > 1 ? par->sp_size : 1;
    md->sp_rank = md->sp > 1 ? par->sp_rank : 0;
    int rc = check_layout(md, par, err);
    if (rc) return rc;
    md->d = mm->hidden;
    md->H = mm->heads / md->tp;
    md->Hkv = mm->kv_heads / md->tp;
    md->hd = mm->head_dim;
    md->f = mm->ffn / md->tp;
    if (mm->kind == MODEL_LLM) {
        md->vocab_n = mm->vocab / md->tp;
        md->vocab0 = md->tp_rank * md->vocab_n;
    }
    md->w.blk = util_calloc((size_t)mm->layers, sizeof(ex_block_w));
    md->g.blk = util_calloc((size_t)mm->layers, sizeof(ex_block_w));
    md->a.blk = util_calloc((size_t)mm->layers, sizeof(ex_block_acts));
    if (!md->w.blk || !md->g.blk || !md->a.blk)
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory", mm->name);
    rc = mm->kind == MODEL_LLM ? layout_llm(md, err) : layout_vision(md, err);
    if (rc) return rc;
    size_t bytes = md->n_params * sizeof(float);
    md->params = util_malloc_cat(UTIL_MEM_PARAMS, bytes);
    md->grads = util_calloc_cat(UTIL_MEM_GRADS, md->n_params, sizeof(float));
    if (!mm->frozen) {
        md->m = util_calloc_cat(UTIL_MEM_OPTIM, md->n_params, sizeof(float));
        md->v = util_calloc_cat(UTIL_MEM_OPTIM, md->n_params, sizeof(float));
        md->m_hi = md->n_params;
    }
    if (!md->params || !md->grads || (!mm->frozen && (!md->m || !md->v)))
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for %zu parameters", mm->name, md->n_params);
    for (int i = 0; i < md->n_tensors; i++) {
        *md->t[i].pslot = md->params + md->t[i].off;
        *md->t[i].gslot = md->grads + md->t[i].off;
    }
    if (mm->kind == MODEL_LLM && mm->tied_embeddings) {
        md->w.head = md->w.wte;
        md->g.head = md->g.wte;
    }
    init_module(md, seed);
    return UTIL_OK;
}

int ex_model_create(const model_t *m, uint64_t seed, ex_model **out, char *err)
{
    return ex_model_create_per_module(m, seed, ~0u, NULL, out, err);
}

int ex_model_create_modules(const model_t *m, uint64_t seed, unsigned modules, ex_model **out,
                            char *err)
{
    return ex_model_create_per_module(m, seed, modules, NULL, out, err);
}

/* One layout for the whole instance: its tp part goes to the LLM, its sp part
 * to the vision encoder. */
int ex_model_create_parallel(const model_t *m, uint64_t seed, unsigned modules,
                             const ex_parallel *par, ex_model **out, char *err)
{
    if (!par) return ex_model_create_per_module(m, seed, modules, NULL, out, err);
    ex_parallel pm[MODEL_MAX_MODULES];
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        pm[k] = *par;
        if (k == m->llm) pm[k].sp_size = 1;
        else pm[k].tp_size = 1;
    }
    return ex_model_create_per_module(m, seed, modules, pm, out, err);
}

int ex_model_create_per_module(const model_t *m, uint64_t seed, unsigned modules,
                               const ex_parallel *par, ex_model **out, char *err)
{
    *out = NULL;
    if (m->n_modules < 1 || m->n_modules > MODEL_MAX_MODULES)
        return util_fail(err, UTIL_EINVAL, "executor: model %s: %d modules", m->name, m->n_modules);
    if (m->llm < 0 || m->llm >= m->n_modules || m->mod[m->llm].kind != MODEL_LLM)
        return util_fail(err, UTIL_EINVAL, "executor: model %s: no LLM module", m->name);
    const model_module *llm = &m->mod[m->llm];
    int rc = check_common(llm, err);
    if (rc) return rc;
    if (llm->vocab <= 0) return util_fail(err, UTIL_EINVAL, "executor: module %s: vocab must be > 0", llm->name);
    int vis = -1;
    for (int i = 0; i < m->n_modules; i++) {
        if (i == m->llm) continue;
        if (m->mod[i].kind != MODEL_VISION || vis >= 0)
            return util_fail(err, UTIL_EUNSUPPORTED, "executor: model %s: module %s: only one vision encoder + one LLM is implemented", m->name, m->mod[i].name);
        vis = i;
    }
    if (vis >= 0) {
        if ((rc = check_common(&m->mod[vis], err)) || (rc = check_vision(&m->mod[vis], llm, err))) return rc;
    }
    ex_model *em = util_calloc(1, sizeof *em);
    if (!em) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    em->m = *m;
    em->be = ex_backend_cpu();
    em->vis_index = vis;
    em->has_vis = vis >= 0 && (modules >> vis & 1u);
    em->has_llm = modules >> m->llm & 1u;
    if (!em->has_vis && !em->has_llm) rc = util_fail(err, UTIL_EINVAL, "executor: model %s: no module selected", m->name);
    if (!rc && em->has_llm) rc = module_create(&em->llm, llm, seed, par ? &par[m->llm] : NULL, err);
    if (!rc && em->has_vis) rc = module_create(&em->vis, &m->mod[vis], seed, par ? &par[vis] : NULL, err);
    if (rc) { ex_model_free(em); return rc; }
    *out = em;
    return UTIL_OK;
}

void ex_model_free(ex_model *em)
{
    if (!em) return;
    module_free(&em->vis);
    module_free(&em->llm);
    util_free(em->targets);
    util_free(em->pred_rows);
    util_free(em);
}

/* ----------------------------------------------------------- activations */

/* Carves a module's activations for n local rows (vision: m_rows merged rows;
 * llm: m_rows vision-token rows, n_pred predicted rows, emb_rows text rows of
 * the vocab-parallel embedding) out of saved (the slot) and scratch; with NULL
 * bases it only counts floats into *n_saved / *n_scratch. */
static void acts_layout(ex_module *md, float *saved, float *scratch, int n, int m_rows, int n_pred,
                        int emb_rows, size_t *n_saved, size_t *n_scratch)
{
    const model_module *mm = &md->mm;
    size_t os = 0, ox = 0, N = (size_t)n;
    size_t d = md->d, qd = (size_t)md->H * md->hd, kd = (size_t)md->Hkv * md->hd, f = md->f;
    ex_acts *a = &md->a;
#define TAKE_(base, off, ptr, count) do { size_t _c = (count); (ptr) = base ? base + off : NULL; off += (_c + 15) & ~(size_t)15; } while (0)
#define S(ptr, count) TAKE_(saved, os, ptr, count)
#define X(ptr, count) TAKE_(scratch, ox, ptr, count)
    for (int l = 0; l < mm->layers; l++) {
        ex_block_acts *b = &a->blk[l];
        S(b->x, N * d); S(b->ln1, N * d); S(b->rstd1, N);
        S(b->q, N * qd); S(b->k, N * kd); S(b->v, N * kd);
        S(b->att, N * qd); S(b->lse, N * md->H);
        S(b->xmid, N * d); S(b->ln2, N * d); S(b->rstd2, N);
        S(b->g, N * f); S(b->u, N * f); S(b->h, N * f);
        b->att_loc = NULL;
        if (md->sp > 1) S(b->att_loc, N * qd);
    }
    if (md->sp > 1) {
        X(a->sp_pack, N * (qd > kd ? qd : kd));
        X(a->sp_dq, N * qd); X(a->sp_dk, N * kd); X(a->sp_dv, N * kd); X(a->sp_datt, N * qd);
    }
    S(a->x_final, N * d);
    S(a->cos, N * md->hd / 2); S(a->sin, N * md->hd / 2);
    X(a->dres, N * d); X(a->dln, N * d);
    X(a->dq, N * qd); X(a->dk, N * kd); X(a->dv, N * kd); X(a->datt, N * qd);
    X(a->dg, N * f); X(a->du, N * f); X(a->dh, N * f);
    if (mm->kind == MODEL_VISION) {
        size_t M = (size_t)m_rows, ph = mm->proj_hidden, oh = mm->out_hidden;
        S(a->mln, N * d); S(a->mrstd, N);
        S(a->h1, M * ph); S(a->a1, M * ph); S(a->vout, M * oh);
        X(a->dh1, M * ph); X(a->da1, M * ph);
    } else {
        size_t P = (size_t)n_pred, V = md->vocab_n;
        S(a->xg, P * d); S(a->rstdf, P);
        S(a->gath, P * d); S(a->logits, P * V); S(a->dlogits, P * V);
        S(a->ce_mx, P); S(a->ce_st, 2 * P);
        X(a->emb, (size_t)emb_rows * d);
        X(a->dgath, P * d); X(a->dxg, P * d); X(a->dvis, (size_t)m_rows * d);
    }
#undef S
#undef X
#undef TAKE_
    if (n_saved) *n_saved = os;
    if (n_scratch) *n_scratch = ox;
}

/* Points md->a and the geometry at the current slot's activations. */
static void slot_bind(ex_module *md)
{
    ex_slot *s = &md->slot[md->cur];
    acts_layout(md, s->mem, md->scratch, s->n_rows, s->m_rows, s->n_pred, s->emb_rows, NULL, NULL);
    md->cu = s->cu;
    md->cu_win = s->cu_win;
    md->n_rows = s->n_rows;
    md->n_seq = s->n_seq;
    md->n_win = s->n_win;
}

/* Grows *buf (floats, UTIL_MEM_ACTIV) to hold need; the contents are not kept. */
static int grow_floats(float **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf) return UTIL_OK;
    util_free(*buf);
    *cap = 0;
    *buf = util_malloc_cat(UTIL_MEM_ACTIV, need * sizeof(float));
    if (!*buf) return UTIL_ENOMEM;
    *cap = need;
    return UTIL_OK;
}

/* Sizes the current slot (allocated on first use, grown when a batch needs
 * more) and the shared scratch for a forward, then binds them. The LLM
 * sizes its head for reserve_pred predictions (every text position) however
 * many the loss mask counts, so its memory does not depend on the data. */
static int acts_ensure(ex_module *md, int n, int m_rows, int n_pred, int reserve_pred, int emb_rows, int n_cu,
                       char *err)
{
    ex_slot *s = &md->slot[md->cur];
    size_t ns, nx;
    acts_layout(md, NULL, NULL, n, m_rows, n_pred > reserve_pred ? n_pred : reserve_pred, emb_rows, &ns, &nx);
    s->filled = false;
    if (grow_floats(&s->mem, &s->cap, ns) || grow_floats(&md->scratch, &md->scratch_cap, nx))
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for activations (%zu floats)", md->mm.name, ns + nx);
    if (n_cu + 1 > s->n_cu_cap) {
        util_free(s->cu);
        util_free(s->cu_win);
        s->cu = util_malloc_cat(UTIL_MEM_ACTIV, (size_t)(n_cu + 1) * sizeof(int));
        s->cu_win = util_malloc_cat(UTIL_MEM_ACTIV, (size_t)(n_cu + 1) * sizeof(int));
        s->n_cu_cap = s->cu && s->cu_win ? n_cu + 1 : 0;
        if (!s->n_cu_cap) return util_fail(err, UTIL_ENOMEM, "executor: out of memory for sequence offsets");
    }
    s->n_rows = n;
    s->m_rows = m_rows;
    s->n_pred = n_pred;
    s->emb_rows = emb_rows;
    s->n_seq = s->n_win = 0;
    slot_bind(md);
    return UTIL_OK;
}

/* Records the sequence counts of the forward that just filled the current slot. */
static void slot_filled(ex_module *md)
{
    ex_slot *s = &md->slot[md->cur];
    s->n_seq = md->n_seq;
    s->n_win = md->n_win;
    s->filled = true;
}

int ex_vision_set_slot(ex_model *em, int slot, char *err)
{
    if (!em->has_vis) return util_fail(err, UTIL_EINVAL, "executor: ex_vision_set_slot: no vision module on this model instance");
    if (slot < 0 || slot >= EX_MAX_SLOTS)
        return util_fail(err, UTIL_EINVAL, "executor: ex_vision_set_slot: slot %d outside 0..%d", slot, EX_MAX_SLOTS - 1);
    em->vis.cur = slot;
    return UTIL_OK;
}

/* ---------------------------------------------------------------- blocks */

/* Megatron tensor parallel: sums partial results over the tp group (the
 * row-parallel output in forward, the column-parallel input grad in backward). */
static void tp_allreduce(ex_module *md, float *x, size_t n)
{
    if (md->tp > 1 && !md->comm_rc) md->comm_rc = md->par.allreduce_sum(md->par.ctx, x, n);
}

/* Element-wise max over the tp group (vocab-parallel cross-entropy). */
static void tp_allreduce_max(ex_module *md, float *x, size_t n)
{
    if (md->tp > 1 && !md->comm_rc) md->comm_rc = md->par.allreduce_max(md->par.ctx, x, n);
}

static const char *comm_what(const ex_module *md)
{
    return md->sp > 1 && md->tp > 1 ? "tensor/sequence-parallel collective"
           : md->sp > 1           ? "sequence-parallel alltoall"
                                  : "tensor-parallel allreduce";
}

/* Ulysses all-to-all, local rows / all heads -> all rows / local heads:
 * src [Nl, nh, hd] (this rank's rows) -> dst [sp * Nl, nh / sp, hd]. */
static void sp_heads_to_rows(ex_module *md, float *dst, const float *src, int nh)
{
    int Nl = md->n_rows, sp = md->sp, nhl = nh / sp, hd = md->hd;
    size_t chunk = (size_t)Nl * nhl * hd;
    for (int r = 0; r < sp; r++)
        for (int t = 0; t < Nl; t++)
            memcpy(md->a.sp_pack + r * chunk + (size_t)t * nhl * hd,
                   src + ((size_t)t * nh + (size_t)r * nhl) * hd, (size_t)nhl * hd * sizeof(float));
    if (!md->comm_rc) md->comm_rc = md->par.alltoall(md->par.ctx, md->a.sp_pack, dst, chunk);
}

/* The inverse: src [sp * Nl, nh / sp, hd] -> dst [Nl, nh, hd]. */
static void sp_rows_to_heads(ex_module *md, float *dst, const float *src, int nh)
{
    int Nl = md->n_rows, sp = md->sp, nhl = nh / sp, hd = md->hd;
    size_t chunk = (size_t)Nl * nhl * hd;
    if (!md->comm_rc) md->comm_rc = md->par.alltoall(md->par.ctx, src, md->a.sp_pack, chunk);
    for (int r = 0; r < sp; r++)
        for (int t = 0; t < Nl; t++)
            memcpy(dst + ((size_t)t * nh + (size_t)r * nhl) * hd,
                   md->a.sp_pack + r * chunk + (size_t)t * nhl * hd, (size_t)nhl * hd * sizeof(float));
}

/* Pre-norm transformer block over N local rows, weights of layer l:
 *   xmid = x + Wo attn(rope(Wq n1 + bq), rope(Wk n1 + bk), Wv n1 + bv) + bo,  n1 = rmsnorm(x) w1
 *   out  = xmid + Wd (silu(Wg n2 + bg) * (Wu n2 + bu)) + bd,                   n2 = rmsnorm(xmid) w2
 * q [N, H*hd], k/v [N, Hkv*hd], attention per sequence of cu (nseq), causal or not.
 * With tp > 1, H, Hkv and f are this rank's slice (q/k/v/gate/up split by rows,
 * o/down by columns) and the o and down outputs are summed over the group
 * before their (replicated) bias and the residual. With sp > 1 (Ulysses), rows are
 * this rank's slice of the sequence; q, k, v go through an all-to-all to all rows x
 * H/sp heads for attention (cu then counts all rows) and the output comes back. */
static void block_forward(const ex_backend *be, ex_module *md, int l, float *out,
                          const int *cu, int nseq, bool causal)
{
    const ex_block_w *w = &md->w.blk[l];
    ex_block_acts *a = &md->a.blk[l];
    int N = md->n_rows, d = md->d, qd = md->H * md->hd, kd = md->Hkv * md->hd, f = md->f;
    be->rmsnorm_forward(a->ln1, a->rstd1, a->x, w->ln1, N, d, EX_NORM_EPS);
    bool sp = md->sp > 1;
    float *q = sp ? md->a.dq : a->q, *k = sp ? md->a.dk : a->k, *v = sp ? md->a.dv : a->v;
    be->linear_forward(q, a->ln1, w->wq, w->bq, N, d, qd);
    be->linear_forward(k, a->ln1, w->wk, w->bk, N, d, kd);
    be->linear_forward(v, a->ln1, w->wv, w->bv, N, d, kd);
    be->rope_forward(q, md->a.cos, md->a.sin, N, md->H, md->hd);
    be->rope_forward(k, md->a.cos, md->a.sin, N, md->Hkv, md->hd);
    if (sp) {
        sp_heads_to_rows(md, a->q, q, md->H);
        sp_heads_to_rows(md, a->k, k, md->Hkv);
        sp_heads_to_rows(md, a->v, v, md->Hkv);
    }
    be->attention_forward(a->att, a->lse, a->q, a->k, a->v, cu, nseq, md->H / md->sp,
                          md->Hkv / md->sp, md->hd, causal);
    if (sp) sp_rows_to_heads(md, a->att_loc, a->att, md->H);
    be->linear_forward(a->xmid, sp ? a->att_loc : a->att, w->wo, NULL, N, qd, d);
    tp_allreduce(md, a->xmid, (size_t)N * d);
    if (w->bo) be->add_bias(a->xmid, w->bo, N, d);
    be->add_inplace(a->xmid, a->x, (size_t)N * d);
    be->rmsnorm_forward(a->ln2, a->rstd2, a->xmid, w->ln2, N, d, EX_NORM_EPS);
    be->linear_forward(a->g, a->ln2, w->wg, w->bg, N, d, f);
    be->linear_forward(a->u, a->ln2, w->wu, w->bu, N, d, f);
    be->swiglu_forward(a->h, a->g, a->u, (size_t)N * f);
    be->linear_forward(out, a->h, w->wd, NULL, N, f, d);
    tp_allreduce(md, out, (size_t)N * d);
    if (w->bd) be->add_bias(out, w->bd, N, d);
    be->add_inplace(out, a->xmid, (size_t)N * d);
}

/* Block backward: dres [N, d] holds dL/d(out) on entry and dL/d(x) on return;
 * weight gradients accumulate into the module's gradient views of layer l. */
static void block_backward(const ex_backend *be, ex_module *md, int l, float *dres,
                           const int *cu, int nseq, bool causal)
{
    const ex_block_w *w = &md->w.blk[l];
    ex_block_w *gw = &md->g.blk[l];
    ex_block_acts *a = &md->a.blk[l];
    ex_acts *s = &md->a;
    int N = md->n_rows, d = md->d, qd = md->H * md->hd, kd = md->Hkv * md->hd, f = md->f;
    size_t Nd = (size_t)N * d, Nf = (size_t)N * f;
    be->zero(s->dh, Nf);
    be->linear_backward(s->dh, gw->wd, gw->bd, dres, a->h, w->wd, N, f, d);
    be->zero(s->dg, Nf);
    be->zero(s->du, Nf);
    be->swiglu_backward(s->dg, s->du, s->dh, a->g, a->u, Nf);
    be->zero(s->dln, Nd);
    be->linear_backward(s->dln, gw->wg, gw->bg, s->dg, a->ln2, w->wg, N, d, f);
    be->linear_backward(s->dln, gw->wu, gw->bu, s->du, a->ln2, w->wu, N, d, f);
    tp_allreduce(md, s->dln, Nd);
    be->rmsnorm_backward(dres, gw->ln2, s->dln, a->xmid, w->ln2, a->rstd2, N, d);
    bool sp = md->sp > 1;
    be->zero(s->datt, (size_t)N * qd);
    be->linear_backward(s->datt, gw->wo, gw->bo, dres, sp ? a->att_loc : a->att, w->wo, N, qd, d);
    if (sp) sp_heads_to_rows(md, s->sp_datt, s->datt, md->H);
    float *dq = sp ? s->sp_dq : s->dq, *dk = sp ? s->sp_dk : s->dk, *dv = sp ? s->sp_dv : s->dv;
    be->zero(dq, (size_t)N * qd);
    be->zero(dk, (size_t)N * kd);
    be->zero(dv, (size_t)N * kd);
    be->attention_backward(dq, dk, dv, sp ? s->sp_datt : s->datt, a->q, a->k, a->v, a->att, a->lse,
                           cu, nseq, md->H / md->sp, md->Hkv / md->sp, md->hd, causal);
    if (sp) {
        sp_rows_to_heads(md, s->dq, dq, md->H);
        sp_rows_to_heads(md, s->dk, dk, md->Hkv);
        sp_rows_to_heads(md, s->dv, dv, md->Hkv);
    }
    be->rope_backward(s->dq, s->cos, s->sin, N, md->H, md->hd);
    be->rope_backward(s->dk, s->cos, s->sin, N, md->Hkv, md->hd);
    be->zero(s->dln, Nd);
    be->linear_backward(s->dln, gw->wq, gw->bq, s->dq, a->ln1, w->wq, N, d, qd);
    be->linear_backward(s->dln, gw->wk, gw->bk, s->dk, a->ln1, w->wk, N, d, kd);
    be->linear_backward(s->dln, gw->wv, gw->bv, s->dv, a->ln1, w->wv, N, d, kd);
    tp_allreduce(md, s->dln, Nd);
    be->rmsnorm_backward(dres, gw->ln1, s->dln, a->x, w->ln1, a->rstd1, N, d);
}

static float *block_out(ex_module *md, int l)
{
    return l + 1 < md->mm.layers ? md->a.blk[l + 1].x : md->a.x_final;
}

/* ---------------------------------------------------------------- vision */

int ex_patch_positions(const model_module *mm, int gh, int gw, int *rows, int *cols, char *err)
{
    int m = mm->merge > 0 ? mm->merge : 1;
    int side = mm->window > 0 ? (int)lround(sqrt((double)mm->window)) : m;
    if (side <= 0 || side % m)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: window %d is not a square of a multiple of merge %d", mm->name, mm->window, m);
    if (gh <= 0 || gw <= 0 || gh % side || gw % side)
        return util_fail(err, UTIL_EINVAL, "executor: batch: grid %dx%d is not a multiple of the %s window/merge side %d", gh, gw, mm->name, side);
    int i = 0;
    for (int wr = 0; wr < gh / side; wr++)
        for (int wc = 0; wc < gw / side; wc++)
            for (int ur = 0; ur < side / m; ur++)
                for (int uc = 0; uc < side / m; uc++)
                    for (int mr = 0; mr < m; mr++)
                        for (int mc = 0; mc < m; mc++) {
                            rows[i] = wr * side + ur * m + mr;
                            cols[i] = wc * side + uc * m + mc;
                            i++;
                        }
    return UTIL_OK;
}

/* Qwen2-VL vision rotary: rotary pairs i < hd/4 rotate by row * theta^(-4i/hd),
 * pairs hd/4 <= i < hd/2 by col * theta^(-4(i - hd/4)/hd). cos/sin [n, hd/2]. */
static void vision_rope_tables(ex_module *md, const int *rows, const int *cols, int patches,
                               int row0, int n)
{
    int half = md->hd / 2, quarter = md->hd / 4;
    double inv[EX_MAX_HEAD_DIM / 4];
    for (int i = 0; i < quarter; i++) inv[i] = pow(EX_ROPE_THETA, -2.0 * i / (double)half);
    for (int t = 0; t < n; t++) {
        float *c = md->a.cos + (size_t)t * half, *sn = md->a.sin + (size_t)t * half;
        if (t >= patches) {   /* the same patch of the previous image */
            memcpy(c, c - (size_t)patches * half, (size_t)half * sizeof *c);
            memcpy(sn, sn - (size_t)patches * half, (size_t)half * sizeof *sn);
            continue;
        }
        int p = (row0 + t) % patches;
        for (int i = 0; i < half; i++) {
            double ang = (i < quarter ? rows[p] * inv[i] : cols[p] * inv[i - quarter]);
            c[i] = (float)cos(ang);
            sn[i] = (float)sin(ang);
        }
    }
}

static bool layer_is_window(const model_module *mm, int l)
{
    if (mm->window <= 0) return false;
    for (int i = 0; i < mm->n_full_layers; i++)
        if (mm->full_layers[i] == l) return false;
    return true;
}

/* Vision forward: x0 = pixels[N, cpp] Wp^T + bp, blocks (full attention per image,
 * window attention in the other layers), then the merger:
 * vout[N/m^2, out] = fc2(gelu(fc1(rmsnorm(xL) viewed as [N/m^2, m^2 d]))). */
static int vision_forward(ex_model *em, const ex_batch *b, char *err)
{
    ex_module *md = &em->vis;
    const model_module *mm = &md->mm;
    const ex_backend *be = em->be;
    int P = b->patches, N = b->n_images * P, mm2 = mm->merge * mm->merge;
    int n_win = mm->window > 0 ? N / mm->window : 0;
    if (N % md->sp || (N / md->sp) % mm2)
        return util_fail(err, UTIL_EINVAL, "executor: batch: %d patches do not split into sp_size %d parts of whole merge groups", N, md->sp);
    int Nl = N / md->sp, Mr = Nl / mm2;
    int rc = acts_ensure(md, Nl, Mr, 0, 0, 0, (b->n_images > n_win ? b->n_images : n_win), err);
    if (rc) return rc;
    int *rows = util_malloc((size_t)P * 2 * sizeof(int));
    if (!rows) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    rc = ex_patch_positions(mm, b->grid_h, b->grid_w, rows, rows + P, err);
    if (!rc) vision_rope_tables(md, rows, rows + P, P, md->sp_rank * Nl, Nl);
    util_free(rows);
    if (rc) return rc;
    for (int i = 0; i <= b->n_images; i++) md->cu[i] = i * P;
    for (int i = 0; i <= n_win; i++) md->cu_win[i] = i * mm->window;
    md->n_seq = b->n_images;
    md->n_win = n_win;
    int cpp = mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    md->comm_rc = 0;
    be->linear_forward(md->a.blk[0].x, b->pixels, md->w.patch_w, md->w.patch_b, Nl, cpp, md->d);
    for (int l = 0; l < mm->layers; l++) {
        bool win = layer_is_window(mm, l);
        block_forward(be, md, l, block_out(md, l), win ? md->cu_win : md->cu,
                      win ? n_win : md->n_seq, false);
    }
    ex_acts *a = &md->a;
    be->rmsnorm_forward(a->mln, a->mrstd, a->x_final, md->w.merge_ln, Nl, md->d, EX_NORM_EPS);
    be->linear_forward(a->h1, a->mln, md->w.m0w, md->w.m0b, Mr, mm->proj_in, mm->proj_hidden);
    be->gelu_forward(a->a1, a->h1, (size_t)Mr * mm->proj_hidden);
    be->linear_forward(a->vout, a->a1, md->w.m2w, md->w.m2b, Mr, mm->proj_hidden, mm->out_hidden);
    slot_filled(md);
    return UTIL_OK;
}

/* Vision backward from dvout [N/m^2, out] down to the patch embedding weights. */
static void vision_backward(ex_model *em, const ex_batch *b, const float *dvout)
{
    ex_module *md = &em->vis;
    const model_module *mm = &md->mm;
    const ex_backend *be = em->be;
    ex_acts *a = &md->a;
    int N = md->n_rows, Mr = N / (mm->merge * mm->merge);
    size_t Mph = (size_t)Mr * mm->proj_hidden;
    be->zero(a->da1, Mph);
    be->linear_backward(a->da1, md->g.m2w, md->g.m2b, dvout, a->a1, md->w.m2w, Mr, mm->proj_hidden, mm->out_hidden);
    be->zero(a->dh1, Mph);
    be->gelu_backward(a->dh1, a->da1, a->h1, Mph);
    be->zero(a->dln, (size_t)N * md->d);
    be->linear_backward(a->dln, md->g.m0w, md->g.m0b, a->dh1, a->mln, md->w.m0w, Mr, mm->proj_in, mm->proj_hidden);
    be->zero(a->dres, (size_t)N * md->d);
    be->rmsnorm_backward(a->dres, md->g.merge_ln, a->dln, a->x_final, md->w.merge_ln, a->mrstd, N, md->d);
    for (int l = mm->layers - 1; l >= 0; l--) {
        bool win = layer_is_window(mm, l);
        block_backward(be, md, l, a->dres, win ? md->cu_win : md->cu, win ? md->n_win : md->n_seq, false);
    }
    int cpp = mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    be->linear_backward(NULL, md->g.patch_w, md->g.patch_b, a->dres, b->pixels, md->w.patch_w, N, cpp, md->d);
}

/* ------------------------------------------------------------------- llm */

/* 1-D RoPE at position p within each sample: pair i rotates by p * theta^(-2i/hd). */
static void llm_rope_tables(ex_module *md)
{
    int half = md->hd / 2, longest = 0;
    double inv[EX_MAX_HEAD_DIM / 2];
    for (int i = 0; i < half; i++) inv[i] = pow(EX_ROPE_THETA, -2.0 * i / (double)md->hd);
    for (int s = 1; s < md->n_seq; s++)
        if (md->cu[s + 1] - md->cu[s] > md->cu[longest + 1] - md->cu[longest]) longest = s;
    float *c0 = md->a.cos + (size_t)md->cu[longest] * half, *s0 = md->a.sin + (size_t)md->cu[longest] * half;
    for (int p = 0; p < md->cu[longest + 1] - md->cu[longest]; p++)
        for (int i = 0; i < half; i++) {
            double ang = p * inv[i];
            c0[(size_t)p * half + i] = (float)cos(ang);
            s0[(size_t)p * half + i] = (float)sin(ang);
        }
    /* every other sample's positions 0..len-1 are a prefix of the longest one's */
    for (int s = 0; s < md->n_seq; s++) {
        if (s == longest) continue;
        size_t n = (size_t)(md->cu[s + 1] - md->cu[s]) * half;
        memcpy(md->a.cos + (size_t)md->cu[s] * half, c0, n * sizeof *c0);
        memcpy(md->a.sin + (size_t)md->cu[s] * half, s0, n * sizeof *s0);
    }
}

static int merged_per_image(const ex_model *em, const ex_batch *b)
{
    if (b->n_images == 0 || em->vis_index < 0) return 0;
    int m = em->m.mod[em->vis_index].merge;
    return b->patches / (m * m);
}

/* Predictions the loss counts: position t < T-1 of sample s predicts token
 * t+1 iff loss_mask[s*T + t] != 0 (all of them without a mask). */
static int count_predictions(const ex_batch *b)
{
    int T = b->text_tokens, n = 0;
    for (int s = 0; s < b->batch; s++)
        for (int t = 0; t + 1 < T; t++) n += !b->loss_mask || b->loss_mask[(size_t)s * T + t] != 0;
    return n;
}

/* Token embeddings of every text row into x0 (row t0 of sample s is cu[s] +
 * its vision rows). Vocab-parallel (tp > 1): each rank looks up the tokens of
 * its vocab rows (others zero) into emb, one allreduce_sum over the group
 * completes the rows (Megatron VocabParallelEmbedding). */
static void llm_embed(ex_model *em, const ex_batch *b, const float *vis_in)
{
    ex_module *md = &em->llm;
    const ex_backend *be = em->be;
    int T = b->text_tokens, B = b->batch, mpi = em->merged_per_image, d = md->d;
    float *x0 = md->a.blk[0].x, *emb = md->a.emb;
    bool vp = md->tp > 1;
    if (vp) {
        be->embedding_forward(emb, md->w.wte, b->tokens, B * T, d, md->vocab0, md->vocab_n);
        tp_allreduce(md, emb, (size_t)B * T * d);
    }
    int img = 0;
    md->cu[0] = 0;
    for (int s = 0; s < B; s++) {
        int nimg = b->images_per_sample ? b->images_per_sample[s] : 0, r0 = md->cu[s];
        if (nimg) be->copy(x0 + (size_t)r0 * d, vis_in + (size_t)img * mpi * d, (size_t)nimg * mpi * d);
        img += nimg;
        float *xt = x0 + (size_t)(r0 + nimg * mpi) * d;
        if (vp) be->copy(xt, emb + (size_t)s * T * d, (size_t)T * d);
        else be->embedding_forward(xt, md->w.wte, b->tokens + (size_t)s * T, T, d, 0, md->vocab_n);
        md->cu[s + 1] = r0 + nimg * mpi + T;
    }
}

/* Vocab-parallel cross-entropy over logits[Np, vocab_n] (this rank's vocab
 * columns): global row max (allreduce_max), then sum-exp and target logit
 * (one allreduce_sum of [2 Np]); loss_r = max + log(sum) - target logit.
 * With backward, dlogits = dscale (softmax - onehot) on the local columns
 * (no collective). Returns the sum of the rows' losses. */
static double llm_cross_entropy(ex_model *em, bool backward, float dscale)
{
    ex_module *md = &em->llm;
    const ex_backend *be = em->be;
    ex_acts *a = &md->a;
    int Np = em->n_pred, V = md->vocab_n;
    be->ce_row_max(a->ce_mx, a->logits, Np, V);
    tp_allreduce_max(md, a->ce_mx, (size_t)Np);
    be->ce_exp_sum(backward ? a->dlogits : NULL, a->ce_st, a->logits, a->ce_mx, em->targets, Np, V, md->vocab0);
    tp_allreduce(md, a->ce_st, (size_t)2 * Np);
    double total = 0;
    for (int i = 0; i < Np; i++) total += a->ce_mx[i] + log((double)a->ce_st[i]) - a->ce_st[Np + i];
    if (backward) be->ce_grad(a->dlogits, a->ce_st, em->targets, Np, V, md->vocab0, dscale);
    return total;
}

/* LLM forward: x0 = [vision tokens of sample b's images, wte[text tokens]] per sample,
 * causal blocks, then only for the Np counted predicting rows: final rmsnorm,
 * logits[Np, V] = head(.), loss = sum CE(logits, next text token) / denominator
 * (loss_denominator, or Np when it is 0; 0 if Np is 0). vis_in [n_images * mpi, d]. */
static int llm_forward(ex_model *em, const ex_batch *b, const float *vis_in, bool backward,
                       float *loss, char *err)
{
    ex_module *md = &em->llm;
    const ex_backend *be = em->be;
    int T = b->text_tokens, B = b->batch, mpi = em->merged_per_image, d = md->d, N = 0;
    int Np = count_predictions(b);
    for (int s = 0; s < B; s++) N += (b->images_per_sample ? b->images_per_sample[s] : 0) * mpi + T;
    int rc = acts_ensure(md, N, b->n_images * mpi, Np, B * (T - 1), md->tp > 1 ? B * T : 0, B, err);
    if (rc) return rc;
    if (Np > em->targets_cap) {
        util_free(em->targets);
        util_free(em->pred_rows);
        em->targets = util_malloc((size_t)Np * sizeof(int32_t));
        em->pred_rows = util_malloc((size_t)Np * sizeof(int));
        em->targets_cap = em->targets && em->pred_rows ? Np : 0;
        if (!em->targets_cap) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    }
    md->n_seq = B;
    llm_embed(em, b, vis_in);
    int k = 0;
    for (int s = 0; s < B; s++) {
        int t0 = md->cu[s + 1] - T;
        for (int j = 0; j + 1 < T; j++)
            if (!b->loss_mask || b->loss_mask[(size_t)s * T + j] != 0) {
                em->pred_rows[k] = t0 + j;
                em->targets[k++] = b->tokens[(size_t)s * T + j + 1];
            }
    }
    em->n_pred = Np;
    llm_rope_tables(md);
    for (int l = 0; l < md->mm.layers; l++)
        block_forward(be, md, l, block_out(md, l), md->cu, B, true);
    ex_acts *a = &md->a;
    *loss = 0;
    slot_filled(md);
    if (Np == 0) return UTIL_OK;
    for (int i = 0; i < Np; i++)
        be->copy(a->xg + (size_t)i * d, a->x_final + (size_t)em->pred_rows[i] * d, (size_t)d);
    be->rmsnorm_forward(a->gath, a->rstdf, a->xg, md->w.lnf, Np, d, EX_NORM_EPS);
    be->linear_forward(a->logits, a->gath, md->w.head, NULL, Np, d, md->vocab_n);
    double den = b->loss_denominator > 0 ? b->loss_denominator : (double)Np;
    *loss = (float)(llm_cross_entropy(em, backward, (float)(1.0 / den)) / den);
    return UTIL_OK;
}

/* LLM backward from dlogits; writes dL/d(vision tokens) into a->dvis [n_images * mpi, d].
 * Vocab-parallel: the head's input gradient is summed over the tp group; the
 * embedding gradient stays local (rows of this rank's vocab only). */
static void llm_backward(ex_model *em, const ex_batch *b)
{
    ex_module *md = &em->llm;
    const ex_backend *be = em->be;
    ex_acts *a = &md->a;
    int T = b->text_tokens, mpi = em->merged_per_image, d = md->d, N = md->n_rows, Np = em->n_pred;
    if (Np == 0) {   /* nothing counted: the loss is 0 and has no gradient */
        be->zero(a->dvis, (size_t)b->n_images * mpi * d);
        return;
    }
    be->zero(a->dgath, (size_t)Np * d);
    be->linear_backward(a->dgath, md->g.head, NULL, a->dlogits, a->gath, md->w.head, Np, d, md->vocab_n);
    tp_allreduce(md, a->dgath, (size_t)Np * d);
    be->zero(a->dxg, (size_t)Np * d);
    be->rmsnorm_backward(a->dxg, md->g.lnf, a->dgath, a->xg, md->w.lnf, a->rstdf, Np, d);
    be->zero(a->dres, (size_t)N * d);
    for (int i = 0; i < Np; i++)
        be->add_inplace(a->dres + (size_t)em->pred_rows[i] * d, a->dxg + (size_t)i * d, (size_t)d);
    for (int l = md->mm.layers - 1; l >= 0; l--)
        block_backward(be, md, l, a->dres, md->cu, md->n_seq, true);
    int img = 0;
    for (int s = 0; s < md->n_seq; s++) {
        int nimg = b->images_per_sample ? b->images_per_sample[s] : 0, r0 = md->cu[s];
        if (nimg) be->copy(a->dvis + (size_t)img * mpi * d, a->dres + (size_t)r0 * d, (size_t)nimg * mpi * d);
        img += nimg;
        be->embedding_backward(md->g.wte, a->dres + (size_t)(r0 + nimg * mpi) * d,
                               b->tokens + (size_t)s * T, T, d, md->vocab0, md->vocab_n);
    }
}

/* ------------------------------------------------------------------ step */

static int check_images(const ex_model *em, const ex_batch *b, char *err)
{
    if (b->n_images < 0) return util_fail(err, UTIL_EINVAL, "executor: batch: n_images %d < 0", b->n_images);
    if (b->n_images == 0) return UTIL_OK;
    if (em->vis_index < 0) return util_fail(err, UTIL_EINVAL, "executor: batch: %d images but the model has no vision encoder", b->n_images);
    const model_module *vm = &em->m.mod[em->vis_index];
    if (!b->pixels || !b->images_per_sample)
        return util_fail(err, UTIL_EINVAL, "executor: batch: images without pixels or images_per_sample");
    if (b->patches != b->grid_h * b->grid_w)
        return util_fail(err, UTIL_EINVAL, "executor: batch: patches %d != grid %dx%d", b->patches, b->grid_h, b->grid_w);
    if (vm->window > 0 && b->patches % vm->window)
        return util_fail(err, UTIL_EINVAL, "executor: batch: patches %d not a multiple of window %d", b->patches, vm->window);
    if (b->patches % (vm->merge * vm->merge))
        return util_fail(err, UTIL_EINVAL, "executor: batch: patches %d not a multiple of merge^2 %d", b->patches, vm->merge * vm->merge);
    return UTIL_OK;
}

static int check_text(const ex_model *em, const ex_batch *b, char *err)
{
    const model_module *llm = &em->m.mod[em->m.llm];
    if (b->batch <= 0 || b->text_tokens < 2 || !b->tokens)
        return util_fail(err, UTIL_EINVAL, "executor: batch: needs batch > 0, text_tokens >= 2 and tokens");
    for (int64_t i = 0; i < (int64_t)b->batch * b->text_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= llm->vocab)
            return util_fail(err, UTIL_EINVAL, "executor: batch: tokens[%lld] = %d outside vocab %d", (long long)i, (int)b->tokens[i], llm->vocab);
    if (!(b->loss_denominator >= 0) || !isfinite(b->loss_denominator))
        return util_fail(err, UTIL_EINVAL, "executor: batch: loss_denominator %g must be finite and >= 0", b->loss_denominator);
    int rc = check_images(em, b, err);
    if (rc || b->n_images == 0) return rc;
    int sum = 0;
    for (int s = 0; s < b->batch; s++) {
        if (b->images_per_sample[s] < 0) return util_fail(err, UTIL_EINVAL, "executor: batch: images_per_sample[%d] < 0", s);
        sum += b->images_per_sample[s];
    }
    if (sum != b->n_images)
        return util_fail(err, UTIL_EINVAL, "executor: batch: images_per_sample sums to %d, n_images is %d", sum, b->n_images);
    return UTIL_OK;
}

int ex_vision_forward(ex_model *em, const ex_batch *b, const float **vis_out, int *vis_rows, char *err)
{
    if (!em->has_vis) return util_fail(err, UTIL_EINVAL, "executor: ex_vision_forward: no vision module on this model instance");
    int rc = check_images(em, b, err);
    if (rc) return rc;
    if (b->n_images == 0) return util_fail(err, UTIL_EINVAL, "executor: ex_vision_forward: batch has no images");
    if ((rc = vision_forward(em, b, err))) return rc;
    if (em->vis.comm_rc)
        return util_fail(err, UTIL_ERUNTIME, "executor: vision %s failed with %d", comm_what(&em->vis), em->vis.comm_rc);
    *vis_out = em->vis.a.vout;
    if (vis_rows) *vis_rows = b->n_images * merged_per_image(em, b) / em->vis.sp;
    return UTIL_OK;
}

int ex_vision_backward(ex_model *em, const ex_batch *b, const float *dvis, char *err)
{
    if (!em->has_vis) return util_fail(err, UTIL_EINVAL, "executor: ex_vision_backward: no vision module on this model instance");
    ex_module *md = &em->vis;
    if (!md->slot[md->cur].filled)
        return util_fail(err, UTIL_EINVAL, "executor: ex_vision_backward: slot %d holds no forward", md->cur);
    slot_bind(md);
    if (md->n_rows * md->sp != b->n_images * b->patches)
        return util_fail(err, UTIL_EINVAL, "executor: ex_vision_backward: batch differs from slot %d's ex_vision_forward", md->cur);
    md->comm_rc = 0;
    if (!md->mm.frozen) vision_backward(em, b, dvis);
    if (md->comm_rc)
        return util_fail(err, UTIL_ERUNTIME, "executor: vision %s failed with %d", comm_what(md), md->comm_rc);
    return UTIL_OK;
}

int ex_llm_forward_backward(ex_model *em, const ex_batch *b, const float *vis_in, bool backward,
                            float *loss, const float **dvis, char *err)
{
    if (!em->has_llm) return util_fail(err, UTIL_EINVAL, "executor: ex_llm_forward_backward: no LLM module on this model instance");
    int rc = check_text(em, b, err);
    if (rc) return rc;
    if (b->n_images > 0 && !vis_in) return util_fail(err, UTIL_EINVAL, "executor: ex_llm_forward_backward: batch has images but vis_in is NULL");
    em->merged_per_image = merged_per_image(em, b);
    em->llm.comm_rc = 0;
    if ((rc = llm_forward(em, b, vis_in, backward, loss, err))) return rc;
    if (backward) llm_backward(em, b);
    if (em->llm.comm_rc)
        return util_fail(err, UTIL_ERUNTIME, "executor: llm tensor-parallel collective failed with %d", em->llm.comm_rc);
    if (!isfinite(*loss)) return util_fail(err, UTIL_ERUNTIME, "executor: loss is %g", (double)*loss);
    if (dvis) *dvis = backward ? em->llm.a.dvis : NULL;
    return UTIL_OK;
}

static int step(ex_model *em, const ex_batch *b, bool backward, float *loss, char *err)
{
    if (!em->has_llm || (em->vis_index >= 0 && !em->has_vis) || (em->has_vis && em->vis.sp > 1))
        return util_fail(err, UTIL_EINVAL, "executor: a whole step needs every module on this instance and no sequence parallelism (use the module-level calls)");
    int rc = check_text(em, b, err);
    if (rc) return rc;
    const float *vis_out = NULL, *dvis = NULL;
    if (b->n_images > 0 && (rc = ex_vision_forward(em, b, &vis_out, NULL, err))) return rc;
    if ((rc = ex_llm_forward_backward(em, b, vis_out, backward, loss, &dvis, err))) return rc;
    if (backward && b->n_images > 0) rc = ex_vision_backward(em, b, dvis, err);
    return rc;
}

int ex_step_forward_backward(ex_model *em, const ex_batch *b, float *loss, char *err)
{
    return step(em, b, true, loss, err);
}

int ex_step_forward(ex_model *em, const ex_batch *b, float *loss, char *err)
{
    return step(em, b, false, loss, err);
}

void ex_zero_grads(ex_model *em)
{
    if (em->has_llm) em->be->zero(em->llm.grads, em->llm.n_params);
    if (em->has_vis) em->be->zero(em->vis.grads, em->vis.n_params);
}

/* ------------------------------------------------------------- optimizer */

float ex_lr_at(const ex_optim_config *c, int step)
{
    if (step < c->warmup_steps) return c->lr * (float)(step + 1) / (float)c->warmup_steps;
    int span = c->total_steps - c->warmup_steps;
    double p = (double)(step - c->warmup_steps) / (double)(span > 1 ? span : 1);
    if (p > 1) p = 1;
    return (float)(c->min_lr + (c->lr - c->min_lr) * 0.5 * (1.0 + cos(M_PI * p)));
}

static bool trainable(const ex_module *md) { return md->params && !md->mm.frozen; }

/* Counts each tensor on exactly one rank of the groups it is replicated over:
 * tp-sharded tensors on every tp rank of their module, replicated ones on tp
 * rank 0, vision tensors (replicated over the sp group once all-reduced) on
 * sp rank 0; a vision encoder without tp of its own on an instance whose LLM
 * is tp-parallel is replicated over the LLM's group, so counted on its rank 0. */
double ex_grad_sumsq(const ex_model *em)
{
    const ex_module *mods[2] = { &em->vis, &em->llm };
    double ss = 0;
    for (int i = 0; i < 2; i++) {
        const ex_module *md = mods[i];
        if (!trainable(md)) continue;
        bool over_llm_group = md == &em->vis && md->tp == 1 && em->has_llm && em->llm.tp_rank != 0;
        if (md->sp_rank != 0 || over_llm_group) continue;
        for (int j = 0; j < md->n_tensors; j++)
            if (md->t[j].sharded || md->tp_rank == 0)
                ss += em->be->sumsq(md->grads + md->t[j].off, md->t[j].numel);
    }
    return ss;
}

/* AdamW over the elements [lo, hi) of one module's flat buffer that this rank
 * holds moments for (all of them unless ZeRO-1 sharded), tensor by tensor so
 * each element keeps its tensor's weight-decay flag. */
static void adamw_module(const ex_backend *be, ex_module *md, const ex_optim_config *c, float lr,
                         float bc1, float bc2)
{
    size_t lo = md->m_lo, hi = md->m_hi;
    for (int j = 0; j < md->n_tensors; j++) {
        const ex_tensor *t = &md->t[j];
        size_t a = t->off > lo ? t->off : lo, z = t->off + t->numel < hi ? t->off + t->numel : hi;
        if (a >= z) continue;
        be->adamw(md->params + a, md->grads + a, md->m + (a - lo), md->v + (a - lo), z - a, lr,
                  c->beta1, c->beta2, c->eps, t->decay ? c->weight_decay : 0.0f, bc1, bc2);
    }
}

static ex_module *module_at(ex_model *em, int module_index)
{
    if (module_index == em->m.llm && em->has_llm) return &em->llm;
    if (module_index == em->vis_index && em->has_vis) return &em->vis;
    return NULL;
}

static int check_optim(const ex_optim_config *c, double grad_norm, char *err)
{
    if (!(c->lr >= 0) || !(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1) || !(c->eps > 0))
        return util_fail(err, UTIL_EINVAL, "executor: optimizer: need lr >= 0, 0 <= beta1, beta2 < 1, eps > 0");
    if (!isfinite(grad_norm)) return util_fail(err, UTIL_ERUNTIME, "executor: gradient norm is %g", grad_norm);
    return UTIL_OK;
}

/* Clip with the global norm, one AdamW update at the step count em->adam_t,
 * zero the gradients: one module. */
static void update_module(ex_model *em, ex_module *md, const ex_optim_config *c, float lr, double grad_norm)
{
    const ex_backend *be = em->be;
    if (trainable(md)) {
        if (c->grad_clip > 0) {
            float coef = c->grad_clip / ((float)grad_norm + 1e-6f);
            if (coef < 1.0f) be->scale_inplace(md->grads + md->m_lo, coef, md->m_hi - md->m_lo);
        }
        float bc1 = 1.0f - powf(c->beta1, (float)em->adam_t), bc2 = 1.0f - powf(c->beta2, (float)em->adam_t);
        adamw_module(be, md, c, lr, bc1, bc2);
    }
    be->zero(md->grads, md->n_params);
}

void ex_optimizer_begin(ex_model *em) { em->adam_t++; }

int ex_optimizer_apply_module(ex_model *em, const ex_optim_config *c, int step, double grad_norm,
                              int module_index, float *lr_out, char *err)
{
    int rc = check_optim(c, grad_norm, err);
    if (rc) return rc;
    ex_module *md = module_at(em, module_index);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: optimizer: module %d is not on this instance", module_index);
    float lr = ex_lr_at(c, step);
    update_module(em, md, c, lr, grad_norm);
    if (lr_out) *lr_out = lr;
    return UTIL_OK;
}

int ex_optimizer_apply(ex_model *em, const ex_optim_config *c, int step, double grad_norm,
                       float *lr_out, char *err)
{
    int rc = check_optim(c, grad_norm, err);
    if (rc) return rc;
    float lr = ex_lr_at(c, step);
    ex_optimizer_begin(em);
    if (em->has_vis) update_module(em, &em->vis, c, lr, grad_norm);
    if (em->has_llm) update_module(em, &em->llm, c, lr, grad_norm);
    if (lr_out) *lr_out = lr;
    return UTIL_OK;
}

/* The global norm for one instance's group: the LLM's tp group if it is
 * tp-parallel, else the vision encoder's (sp partial gradients are the
 * caller's to all-reduce first). */
int ex_optimizer_step(ex_model *em, const ex_optim_config *c, int step, float *grad_norm,
                      float *lr_out, char *err)
{
    double ss = ex_grad_sumsq(em);
    const ex_module *md = em->has_llm && em->llm.tp > 1 ? &em->llm : em->has_vis && em->vis.tp > 1 ? &em->vis : NULL;
    if (md) {
        float f = (float)ss;
        int rc = md->par.allreduce_sum(md->par.ctx, &f, 1);
        if (rc) return util_fail(err, UTIL_ERUNTIME, "executor: tensor-parallel allreduce_sum failed with %d", rc);
        ss = f;
    }
    double norm = sqrt(ss);
    if (grad_norm) *grad_norm = (float)norm;
    return ex_optimizer_apply(em, c, step, norm, lr_out, err);
}

int ex_module_buffer(ex_model *em, int module_index, ex_buffer_kind kind, float **ptr, size_t *n)
{
    ex_module *md = module_at(em, module_index);
    if (!md) return UTIL_ENOTFOUND;
    switch (kind) {
    case EX_BUF_PARAMS: *ptr = md->params; *n = md->n_params; return UTIL_OK;
    case EX_BUF_GRADS: *ptr = md->grads; *n = md->n_params; return UTIL_OK;
    case EX_BUF_ADAM_M:
    case EX_BUF_ADAM_V:
        if (!trainable(md)) return UTIL_ENOTFOUND;
        *ptr = kind == EX_BUF_ADAM_M ? md->m : md->v;
        *n = md->m_hi - md->m_lo;
        return UTIL_OK;
    }
    return UTIL_EINVAL;
}

/* Replaces the moments with ones for [lo, hi), keeping the values of the
 * elements the old and new ranges share (zero elsewhere). */
int ex_optimizer_shard(ex_model *em, int module_index, size_t lo, size_t hi, char *err)
{
    ex_module *md = module_at(em, module_index);
    if (!md) return util_fail(err, UTIL_ENOTFOUND, "executor: ex_optimizer_shard: module %d is not on this instance", module_index);
    if (!trainable(md)) return util_fail(err, UTIL_EINVAL, "executor: ex_optimizer_shard: module %s is frozen (no optimizer state)", md->mm.name);
    if (lo > hi || hi > md->n_params)
        return util_fail(err, UTIL_EINVAL, "executor: ex_optimizer_shard: range [%zu, %zu) outside module %s's %zu elements", lo, hi, md->mm.name, md->n_params);
    float *m = util_calloc_cat(UTIL_MEM_OPTIM, hi - lo, sizeof(float));
    float *v = util_calloc_cat(UTIL_MEM_OPTIM, hi - lo, sizeof(float));
    if (!m || !v) {
        util_free(m);
        util_free(v);
        return util_fail(err, UTIL_ENOMEM, "executor: out of memory for %zu optimizer elements", hi - lo);
    }
    size_t a = lo > md->m_lo ? lo : md->m_lo, z = hi < md->m_hi ? hi : md->m_hi;
    if (a < z) {
        memcpy(m + (a - lo), md->m + (a - md->m_lo), (z - a) * sizeof(float));
        memcpy(v + (a - lo), md->v + (a - md->m_lo), (z - a) * sizeof(float));
    }
    util_free(md->m);
    util_free(md->v);
    md->m = m;
    md->v = v;
    md->m_lo = lo;
    md->m_hi = hi;
    return UTIL_OK;
}

int ex_optimizer_get_t(const ex_model *em) { return em->adam_t; }
void ex_optimizer_set_t(ex_model *em, int t) { em->adam_t = t; }

/* ------------------------------------------------------------ parameters */

int ex_param_count(const ex_model *em)
{
    return em->vis.n_tensors + em->llm.n_tensors;
}

int64_t ex_model_num_params(const ex_model *em)
{
    return (int64_t)(em->vis.n_params + em->llm.n_params);
}

int ex_param_get(ex_model *em, int i, ex_param *out)
{
    ex_module *md = &em->vis;
    int module_index = em->vis_index;
    if (i >= md->n_tensors) { i -= md->n_tensors; md = &em->llm; module_index = em->m.llm; }
    if (i < 0 || i >= md->n_tensors) return UTIL_EINVAL;
    const ex_tensor *t = &md->t[i];
    out->name = t->name;
    out->ndim = t->ndim;
    out->shape[0] = t->shape[0];
    out->shape[1] = t->shape[1];
    out->full_shape[0] = t->full[0];
    out->full_shape[1] = t->full[1];
    out->start[0] = t->start[0];
    out->start[1] = t->start[1];
    out->sharded = t->sharded;
    out->numel = (int64_t)t->numel;
    out->data = md->params + t->off;
    out->grad = md->grads + t->off;
    out->decay = t->decay;
    out->module_index = module_index;
    out->offset = t->off;
    out->split_axis = t->sharded ? t->split_axis : 0;
    return UTIL_OK;
}

static int names_text(ex_model *em, char **out, size_t *len, char *err)
{
    /* A line is at most 95 (name) + 3 + 2 * 20 (int64) + 2 characters. */
    size_t cap = 160 * (size_t)(ex_param_count(em) + 1), n = 0;
    char *s = util_malloc(cap);
    if (!s) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    for (int i = 0; i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        if (p.ndim == 2) n += (size_t)snprintf(s + n, cap - n, "%s 2 %lld %lld\n", p.name, (long long)p.shape[0], (long long)p.shape[1]);
        else n += (size_t)snprintf(s + n, cap - n, "%s 1 %lld\n", p.name, (long long)p.shape[0]);
    }
    *out = s;
    *len = n;
    return UTIL_OK;
}

int ex_params_save_raw(ex_model *em, const char *path, char *err)
{
    size_t total = (size_t)ex_model_num_params(em);
    float *buf = util_malloc(total * sizeof(float) + 1);
    if (!buf) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    size_t off = 0;
    for (int i = 0; i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        memcpy(buf + off, p.data, (size_t)p.numel * sizeof(float));
        off += (size_t)p.numel;
    }
    int rc = util_write_atomic(path, buf, total * sizeof(float), err);
    util_free(buf);
    if (rc) return rc;
    char *names, npath[1024];
    size_t nlen;
    if ((rc = names_text(em, &names, &nlen, err))) return rc;
    snprintf(npath, sizeof npath, "%s.names", path);
    rc = util_write_atomic(npath, names, nlen, err);
    util_free(names);
    return rc;
}

int ex_params_load_raw(ex_model *em, const char *path, char *err)
{
    char npath[1024], *names = NULL, *mine = NULL, *data = NULL;
    size_t nlen, mlen, dlen;
    snprintf(npath, sizeof npath, "%s.names", path);
    int rc = util_read_file(npath, &names, &nlen, err);
    if (!rc) rc = names_text(em, &mine, &mlen, err);
    if (!rc && (nlen != mlen || memcmp(names, mine, nlen)))
        rc = util_fail(err, UTIL_EINVAL, "%s: tensor names or shapes differ from this model", npath);
    if (!rc) rc = util_read_file(path, &data, &dlen, err);
    if (!rc && dlen != (size_t)ex_model_num_params(em) * sizeof(float))
        rc = util_fail(err, UTIL_EINVAL, "%s: %zu bytes, expected %lld", path, dlen, (long long)ex_model_num_params(em) * 4);
    if (!rc) {
        size_t off = 0;
        for (int i = 0; i < ex_param_count(em); i++) {
            ex_param p;
            ex_param_get(em, i, &p);
            memcpy(p.data, data + off, (size_t)p.numel * sizeof(float));
            off += (size_t)p.numel * sizeof(float);
        }
    }
    util_free(names);
    util_free(mine);
    util_free(data);
    return rc;
}
