/* The executor's layouts as data: a module's parameter tensors and units,
 * its ZeRO buffers and its activations. executor/model*.c lays itself out
 * from these lists and the dhp target's memory model sums them, so the two
 * cannot drift (see planner.h). */
#include "planner/planner.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* GPT-2's initialisation (Radford et al. 2019): N(0, 0.02) for linears and
 * embeddings, the residual-output linears scaled by 1 / sqrt(2 * layers). */
#define INIT_STD 0.02f

/* ---------------------------------------------------------------- tensors */

typedef struct {
    plan_tensor *out;
    int cap, n;
    int tp, tp_rank;
    bool seq_parallel;
    int layer, unit;
    char prefix[32];
    int64_t *unit_elems;      /* a sizing pass (plan_unit_sizes): each tensor's elements added to its unit's, none stored */
    int64_t *largest;         /* where given: the largest tensor's elements so far */
    bool nameless;            /* stored tensors get an empty name (plan_module_tensor_shapes) */
} tensor_list;

/* dst = a then b, cut to n bytes with its terminator. The search lays out
 * every candidate's tensors to size its memory, so this runs millions of
 * times: a copy, where snprintf's format parsing took most of `dhp plan`. */
static void join(char *dst, size_t n, const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > n - 1) la = n - 1;
    if (lb > n - 1 - la) lb = n - 1 - la;
    memcpy(dst, a, la);
    memcpy(dst + la, b, lb);
    dst[la + lb] = '\0';
}

/* "layers.12." for block 12 of an LLM (blk "layers"), as join does it: without printf. */
static void block_prefix(char *dst, size_t n, const char *blk, int b)
{
    char num[16], *q = num + sizeof num;
    unsigned v = b < 0 ? 0u : (unsigned)b;
    *--q = '\0';
    *--q = '.';
    do { *--q = (char)('0' + v % 10); v /= 10; } while (v && q > num + 1);
    *--q = '.';
    join(dst, n, blk, q);
}

_Static_assert(offsetof(plan_tensor, name) == 0, "add() zeroes a tensor after its name");

/* The next tensor, or NULL past the list's capacity (a counting pass). */
static plan_tensor *add(tensor_list *l, const char *name, plan_tensor_role role, int ndim, int64_t d0, int64_t d1,
                        float std, float cst)
{
    int i = l->n++;
    int64_t e = d0 * (ndim > 1 ? d1 : 1);
    if (l->unit_elems) l->unit_elems[l->unit] += e;
    if (l->largest && e > *l->largest) *l->largest = e;
    if (i >= l->cap) return NULL;
    plan_tensor *t = &l->out[i];
    /* the name is the struct's first field and join writes it whole: zero the rest */
    memset((char *)t + sizeof t->name, 0, sizeof *t - sizeof t->name);
    if (l->nameless) t->name[0] = '\0';
    else join(t->name, sizeof t->name, l->prefix, name);
    t->role = role;
    t->layer = l->layer;
    t->unit = l->unit;
    t->ndim = ndim;
    t->shape[0] = t->full[0] = d0;
    t->shape[1] = t->full[1] = ndim > 1 ? d1 : 1;
    t->split_axis = -1;
    t->decay = ndim >= 2;
    t->init_std = std;
    t->init_const = cst;
    return t;
}

/* This rank's slice along axis (0 rows, 1 columns) of a tensor split over the tp group. */
static void split(tensor_list *l, plan_tensor *t, int axis)
{
    if (!t || l->tp <= 1) return;
    t->full[axis] = t->shape[axis] * l->tp;
    t->start[axis] = t->shape[axis] * l->tp_rank;
    t->split_axis = axis;
}

/* Replicated over the tp group but applied to the rows of one rank under
 * sequence parallelism, so its gradient is a partial sum. */
static void seq_partial(tensor_list *l, plan_tensor *t)
{
    if (t && l->tp > 1 && l->seq_parallel) t->seq_partial = true;
}

/* Block b's tensors (l->layer and l->unit set by the caller). */
static void block(tensor_list *l, const model_module *mm, int b)
{
    int d = mm->hidden, qd = mm->heads / l->tp * mm->head_dim, kd = mm->kv_heads / l->tp * mm->head_dim;
    int f = mm->ffn / l->tp;
    float std_out = INIT_STD / sqrtf(2.0f * (float)mm->layers);
    const char *blk = mm->kind == MODEL_LLM ? "layers" : "blocks";
    bool ln = mm->norm == MODEL_NORM_LAYERNORM, swiglu = mm->ffn_kind == MODEL_FFN_SWIGLU;
    if (l->n < l->cap && !l->nameless) block_prefix(l->prefix, sizeof l->prefix, blk, b);   /* only for names stored */
    seq_partial(l, add(l, "norm1.weight", PLAN_TW_LN1, 1, d, 1, 0, 1));
    if (ln) seq_partial(l, add(l, "norm1.bias", PLAN_TW_LN1_B, 1, d, 1, 0, 0));
    split(l, add(l, "attn.q.weight", PLAN_TW_WQ, 2, qd, d, INIT_STD, 0), 0);
    if (mm->qkv_bias) split(l, add(l, "attn.q.bias", PLAN_TW_BQ, 1, qd, 1, 0, 0), 0);
    split(l, add(l, "attn.k.weight", PLAN_TW_WK, 2, kd, d, INIT_STD, 0), 0);
    if (mm->k_bias) split(l, add(l, "attn.k.bias", PLAN_TW_BK, 1, kd, 1, 0, 0), 0);
    split(l, add(l, "attn.v.weight", PLAN_TW_WV, 2, kd, d, INIT_STD, 0), 0);
    if (mm->qkv_bias) split(l, add(l, "attn.v.bias", PLAN_TW_BV, 1, kd, 1, 0, 0), 0);
    split(l, add(l, "attn.o.weight", PLAN_TW_WO, 2, d, qd, std_out, 0), 1);
    if (mm->out_bias) seq_partial(l, add(l, "attn.o.bias", PLAN_TW_BO, 1, d, 1, 0, 0));
    seq_partial(l, add(l, "norm2.weight", PLAN_TW_LN2, 1, d, 1, 0, 1));
    if (ln) seq_partial(l, add(l, "norm2.bias", PLAN_TW_LN2_B, 1, d, 1, 0, 0));
    if (swiglu) {
        split(l, add(l, "mlp.gate.weight", PLAN_TW_WG, 2, f, d, INIT_STD, 0), 0);
        if (mm->mlp_bias) split(l, add(l, "mlp.gate.bias", PLAN_TW_BG, 1, f, 1, 0, 0), 0);
    }
    split(l, add(l, swiglu ? "mlp.up.weight" : "mlp.fc1.weight", PLAN_TW_WU, 2, f, d, INIT_STD, 0), 0);
    if (mm->mlp_bias) split(l, add(l, swiglu ? "mlp.up.bias" : "mlp.fc1.bias", PLAN_TW_BU, 1, f, 1, 0, 0), 0);
    split(l, add(l, swiglu ? "mlp.down.weight" : "mlp.fc2.weight", PLAN_TW_WD, 2, d, f, std_out, 0), 1);
    if (mm->mlp_bias)
        seq_partial(l, add(l, swiglu ? "mlp.down.bias" : "mlp.fc2.bias", PLAN_TW_BD, 1, d, 1, 0, 0));
    l->prefix[0] = 0;
}

/* The stage's blocks. A pass that stores nothing (cap 0: counting, or
 * sizing units or the largest tensor) lists the first block's tensors and
 * credits each later block with the same count and elements: block() reads
 * only the module's shapes, never b but for names, so every block holds the
 * same tensors. The search sizes every candidate this way. */
static void blocks(tensor_list *l, const model_module *mm, const plan_stage *st)
{
    int per_block_n = -1;
    int64_t per_block_elems = 0;
    for (int j = 0; j < st->count; j++) {
        int b = plan_stage_block(st, j);
        l->layer = b;
        l->unit = 1 + b;
        if (l->cap == 0 && per_block_n >= 0) {
            l->n += per_block_n;
            if (l->unit_elems) l->unit_elems[l->unit] += per_block_elems;
            continue;
        }
        int n0 = l->n;
        int64_t before = l->unit_elems ? l->unit_elems[l->unit] : 0;
        block(l, mm, b);
        if (l->cap == 0) {
            per_block_n = l->n - n0;
            per_block_elems = l->unit_elems ? l->unit_elems[l->unit] - before : 0;
        }
    }
    l->layer = -1;
    l->unit = mm->layers + 1;
    l->prefix[0] = 0;
}

/* The Whisper-style audio encoder as Qwen2-Audio holds it (modeling_qwen2_audio.py,
 * Qwen2AudioEncoder), stage st's part: conv1 C -> d and conv2 d -> d (kernel
 * k, torch Conv1d weights [d, C, k] viewed as [d, C k]) and learned
 * positions [max_positions, d] when the model has them (Qwen2.5-Omni's are a
 * fixed sinusoid table, no parameter) on the first stage, the blocks, the
 * final LayerNorm and the projector (Qwen2-Audio's multi_modal_projector,
 * Qwen2.5-Omni's proj) on the last. Qwen2AudioPreTrainedModel initialises
 * Conv1d and Embedding weights N(0, init_std = 0.02). */
static void audio_tensors(tensor_list *l, const model_module *mm, const plan_stage *st)
{
    int d = mm->hidden, k = mm->patch;
    if (st->stem) {
        add(l, "conv1.weight", PLAN_TW_CONV1_W, 2, d, (int64_t)mm->in_channels * k, INIT_STD, 0);
        if (mm->patch_bias) add(l, "conv1.bias", PLAN_TW_CONV1_B, 1, d, 1, 0, 0);
        add(l, "conv2.weight", PLAN_TW_CONV2_W, 2, d, (int64_t)d * k, INIT_STD, 0);
        if (mm->patch_bias) add(l, "conv2.bias", PLAN_TW_CONV2_B, 1, d, 1, 0, 0);
        /* frozen, as transformers holds it (executor/audio.c): no weight decay */
        plan_tensor *pos = mm->max_positions > 0 ? add(l, "embed_positions.weight", PLAN_TW_POS, 2, mm->max_positions, d,
                                                        INIT_STD, 0) : NULL;
        if (pos) pos->decay = false;
    }
    blocks(l, mm, st);
    if (!st->head) return;
    if (mm->final_norm) {
        add(l, "layer_norm.weight", PLAN_TW_LNF, 1, d, 1, 0, 1);
        if (mm->norm == MODEL_NORM_LAYERNORM) add(l, "layer_norm.bias", PLAN_TW_LNF_B, 1, d, 1, 0, 0);
    }
    add(l, "proj.weight", PLAN_TW_PROJ_W, 2, mm->out_hidden, mm->proj_in, INIT_STD, 0);
    if (mm->proj_bias) add(l, "proj.bias", PLAN_TW_PROJ_B, 1, mm->out_hidden, 1, 0, 0);
}

/* A CLIP tower's blocks after LLaVA's feature layer and its post_layernorm,
 * in the head's unit: the checkpoint holds them (transformers' CLIPVisionModel
 * has every block), so --init-from reads them and export-weights writes them
 * back, unchanged (executor/clip.c never reads them). */
static void clip_unused(tensor_list *l, const model_module *mm)
{
    int n0 = l->n;
    for (int j = 0; j < mm->unused_layers; j++) {
        l->layer = mm->layers + j;
        block(l, mm, mm->layers + j);
    }
    l->layer = -1;
    if (mm->final_norm) {
        add(l, "post_norm.weight", PLAN_TW_LNF, 1, mm->hidden, 1, 0, 1);
        add(l, "post_norm.bias", PLAN_TW_LNF_B, 1, mm->hidden, 1, 0, 0);
    }
    for (int i = n0; i < l->n && i < l->cap; i++) {
        l->out[i].unused = true;
        l->out[i].decay = false;
    }
}

double plan_seqpar_split(const model_module *mm, const plan_module *s)
{
    return mm->kind == MODEL_LLM && s->seq_parallel && s->tp > 1 ? s->tp : 1.0;
}

static int module_tensors(tensor_list *lp, const model_module *mm, const plan_stage *stage);

int plan_module_tensors(const model_module *mm, int tp, int tp_rank, bool seq_parallel, const plan_stage *stage,
                        plan_tensor *out, int cap)
{
    tensor_list l = { .out = out, .cap = cap, .tp = tp > 0 ? tp : 1, .tp_rank = tp_rank,
                      .seq_parallel = seq_parallel && mm->kind == MODEL_LLM, .layer = -1, .unit = 0 };
    return module_tensors(&l, mm, stage);
}

int plan_module_tensor_shapes(const model_module *mm, int tp, int tp_rank, bool seq_parallel, const plan_stage *stage,
                              plan_tensor *out, int cap)
{
    tensor_list l = { .out = out, .cap = cap, .tp = tp > 0 ? tp : 1, .tp_rank = tp_rank,
                      .seq_parallel = seq_parallel && mm->kind == MODEL_LLM, .layer = -1, .unit = 0, .nameless = true };
    return module_tensors(&l, mm, stage);
}

/* The module's tensors into l, in the order of its flat buffer; their count. */
static int module_tensors(tensor_list *lp, const model_module *mm, const plan_stage *stage)
{
    tensor_list l = *lp;
    plan_stage whole = plan_stage_of(mm, NULL, 0), *st = stage ? (plan_stage *)stage : &whole;
    int d = mm->hidden;
    if (mm->kind == MODEL_LLM) {
        int vocab_n = mm->vocab / l.tp;
        if (st->stem) split(&l, add(&l, "embed_tokens.weight", PLAN_TW_WTE, 2, vocab_n, d, INIT_STD, 0), 0);
        blocks(&l, mm, st);
        if (!st->head) return l.n;
        add(&l, "norm.weight", PLAN_TW_LNF, 1, d, 1, 0, 1);
        if (!mm->tied_embeddings) {
            split(&l, add(&l, "lm_head.weight", PLAN_TW_HEAD, 2, vocab_n, d, INIT_STD, 0), 0);
        } else if (!st->stem) {
            plan_tensor *t = add(&l, "embed_tokens.weight", PLAN_TW_HEAD, 2, vocab_n, d, INIT_STD, 0);
            split(&l, t, 0);
            if (t) t->tied_copy = true;
        }
        return l.n;
    }
    if (mm->kind == MODEL_AUDIO) {
        audio_tensors(&l, mm, st);
        return l.n;
    }
    int cpp = mm->in_channels * mm->temporal_patch * mm->patch * mm->patch;
    if (st->stem) {
        add(&l, "patch_embed.weight", PLAN_TW_PATCH_W, 2, d, cpp, INIT_STD, 0);
        if (mm->patch_bias) add(&l, "patch_embed.bias", PLAN_TW_PATCH_B, 1, d, 1, 0, 0);
        if (plan_module_clip(mm)) {   /* executor/clip.c */
            add(&l, "class_embedding", PLAN_TW_CLS, 1, d, 1, INIT_STD, 0);
            add(&l, "position_embedding.weight", PLAN_TW_POS, 2, mm->max_positions, d, INIT_STD, 0);
            add(&l, "pre_norm.weight", PLAN_TW_PRE_LN, 1, d, 1, 0, 1);
            add(&l, "pre_norm.bias", PLAN_TW_PRE_LN_B, 1, d, 1, 0, 0);
        }
    }
    blocks(&l, mm, st);
    if (!st->head) return l.n;
    if (mm->proj_norm) add(&l, "merger.norm.weight", PLAN_TW_MERGE_LN, 1, d, 1, 0, 1);
    add(&l, "merger.fc1.weight", PLAN_TW_M0W, 2, mm->proj_hidden, mm->proj_in, INIT_STD, 0);
    add(&l, "merger.fc1.bias", PLAN_TW_M0B, 1, mm->proj_hidden, 1, 0, 0);
    add(&l, "merger.fc2.weight", PLAN_TW_M2W, 2, mm->out_hidden, mm->proj_hidden, INIT_STD, 0);
    add(&l, "merger.fc2.bias", PLAN_TW_M2B, 1, mm->out_hidden, 1, 0, 0);
    if (plan_module_clip(mm)) clip_unused(&l, mm);
    return l.n;
}

int64_t plan_unit_sizes(const model_module *mm, int tp, const plan_stage *st, int64_t *units)
{
    int U = plan_module_units(mm);
    for (int u = 0; u < U; u++) units[u] = 0;
    tensor_list l = { .tp = tp > 0 ? tp : 1, .layer = -1, .unit = 0, .unit_elems = units };
    module_tensors(&l, mm, st);
    int64_t total = 0;
    for (int u = 0; u < U; u++) total += units[u];
    return total;
}

int64_t plan_largest_tensor(const model_module *mm, int tp, bool seq_parallel, const plan_stage *st)
{
    int64_t largest = 0;
    tensor_list l = { .tp = tp > 0 ? tp : 1, .seq_parallel = seq_parallel && mm->kind == MODEL_LLM, .layer = -1,
                      .largest = &largest };
    module_tensors(&l, mm, st);
    return largest;
}

/* ---------------------------------------------------------------- ZeRO buffers */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

plan_dp_buffers plan_dp_buffers_of(const model_module *mm, const plan_module *s, int stage)
{
    plan_dp_buffers b = { 0 };
    plan_dp_rules r = plan_dp_rules_of(mm, s);
    int U = plan_module_units(mm), G = r.shard > 0 ? r.shard : 1;
    int64_t *u = util_malloc((size_t)U * sizeof *u);
    if (!u) return b;
    plan_stage st = plan_stage_of(mm, s, stage);
    b.local = plan_unit_sizes(mm, s->tp, &st, u);
    for (int i = 1; i < U - 1; i++) b.block_local += u[i];   /* unit 0 the stem, U - 1 the head */
    for (int i = 0; i < U; i++) {
        int64_t piece = ceil_div(u[i], G);
        b.shard_elems += piece;
        if (piece > b.max_piece) b.max_piece = piece;
    }
    util_free(u);
    if (r.stage == 0) b.shard_elems = b.local;
    /* The tied LLM's head uses the stem's embedding too: one more unit live
     * while the head runs, and its gradient bucket held until the embedding's
     * backward ends the micro-batch. */
    int tied = mm->kind == MODEL_LLM && mm->tied_embeddings && st.stem && st.head;
    if (r.unit_param_gather) b.gather_slots = 2 + tied;      /* gathers go straight from the weight shard */
    if (r.unit_grad_reduce) {
        b.bucket_slots = 2 + tied;                            /* the unit computing, the one reducing */
        b.pieces += b.bucket_slots * b.max_piece;             /* each reduce-scatter's result */
    }
    if (r.step_param_gather) {                               /* ZeRO-1 and -2 (ZeRO-1 reduce-scatters through it too) */
        b.staging = G * b.max_piece;                          /* one unit, padded */
        b.pieces += b.max_piece;                              /* its reduced piece, or the piece sent */
    }
    return b;
}

/* ---------------------------------------------------------------- activations */

static size_t pad16(double elems) { return (size_t)ceil(elems / 16.0) * 16; }

/* A byte-summing pass (plan_module_act_bytes): each tensor added to its
 * class as it is listed, none stored. */
typedef struct {
    double fp32_bytes, saved, block_saved, scratch, logits;
    double largest;           /* the largest tensor's elements */
} act_sums;

typedef struct {
    plan_act *out;
    int cap, n;
    act_sums *sums;
} act_list;

static void act_sum(act_sums *m, plan_act a)
{
    double bytes = (double)a.elems * (a.bf16 ? 2.0 : m->fp32_bytes);
    if (a.id == PLAN_ACT_LOGITS || a.id == PLAN_ACT_DLOGITS) m->logits += bytes;
    else if (a.saved) m->saved += bytes;
    else m->scratch += bytes;
    if (a.saved && a.layer >= 0) m->block_saved += bytes;
    if ((double)a.elems > m->largest) m->largest = (double)a.elems;
}

static void act_typed(act_list *l, plan_act_id id, int layer, bool saved, bool bf16, double elems)
{
    int i = l->n++;
    plan_act a = { id, layer, saved, bf16, pad16(elems) };
    if (l->sums) act_sum(l->sums, a);
    if (i < l->cap) l->out[i] = a;
}

static void act(act_list *l, plan_act_id id, int layer, bool saved, double elems)
{
    act_typed(l, id, layer, saved, false, elems);
}

/* Which block tensors a forward keeps per layer: all of them; under
 * selective recomputation all but the attention's log-sum-exp and the MLP
 * activation's output (the attention core and the activation are re-run in
 * backward, Korthikanti et al., arXiv 2205.05198, sec. 5); under full
 * recomputation only the block's input; with no backward to run (a frozen
 * encoder) none: every block runs in the copies all blocks share, its input
 * too, which its output overwrites once the block has read it
 * (ex_block_forward reads x before it writes out). */
static bool kept_per_layer(const model_module *mm, plan_act_id id, plan_recompute rc)
{
    if (!model_runs_backward(mm)) return false;
    if (rc == PLAN_RECOMP_FULL) return id == PLAN_ACT_X;
    if (rc == PLAN_RECOMP_SELECTIVE) return id != PLAN_ACT_LSE && id != PLAN_ACT_H;
    return true;
}

/* The recomputations stage st's blocks run (plan_block_recompute): s's
 * own, or under partial full recomputation full and none. Their number. */
static int stage_recompute_modes(const plan_module *s, const plan_stage *st, plan_recompute modes[2])
{
    int rc = plan_stage_recomputed_blocks(s, st), n = 0;
    if (s->recompute != PLAN_RECOMP_FULL || rc == st->count) {
        modes[0] = s->recompute;
        return 1;
    }
    if (rc > 0) modes[n++] = PLAN_RECOMP_FULL;
    modes[n++] = PLAN_RECOMP_NONE;
    return n;
}

/* Does any block of stage st exchange its rows by Ulysses all-to-alls (plan_cp_layer)? */
static bool stage_ulysses(const model_module *mm, const plan_module *s, const plan_stage *st, double N)
{
    for (int j = 0; j < st->count; j++)
        if (plan_cp_layer(mm, s, plan_stage_block(st, j), N) == PLAN_CP_ULYSSES) return true;
    return false;
}

/* Block tensors of layer `layer`, or (-1) the copies all blocks share; att_loc
 * (the attention output back in this rank's rows) where the layer, or for
 * the shared copy any layer of the stage, runs Ulysses. */
static void block_acts(act_list *l, const model_module *mm, const plan_module *s, const plan_stage *st, double N,
                       bool bf16, int layer)
{
    double tp = s->tp, d = mm->hidden, hd = mm->head_dim, H = mm->heads / tp, f = mm->ffn / tp;
    double qd = H * hd, kd = mm->kv_heads / tp * hd;
    double Nl = N / plan_seqpar_split(mm, s);   /* the norms' and residual's rows */
    double size[PLAN_NACT_BLOCK] = {
        [PLAN_ACT_X] = Nl * d, [PLAN_ACT_LN1] = Nl * d, [PLAN_ACT_RSTD1] = Nl,
        [PLAN_ACT_Q] = N * qd, [PLAN_ACT_K] = N * kd, [PLAN_ACT_V] = N * kd,
        [PLAN_ACT_ATT] = N * qd, [PLAN_ACT_LSE] = N * H,
        [PLAN_ACT_XMID] = Nl * d, [PLAN_ACT_LN2] = Nl * d, [PLAN_ACT_RSTD2] = Nl,
        [PLAN_ACT_G] = N * f, [PLAN_ACT_U] = N * f, [PLAN_ACT_H] = N * f,
        [PLAN_ACT_ATT_LOC] = N * qd, [PLAN_ACT_MEAN1] = Nl, [PLAN_ACT_MEAN2] = Nl,
    };
    bool ulysses = layer >= 0 ? plan_cp_layer(mm, s, layer, N) == PLAN_CP_ULYSSES : stage_ulysses(mm, s, st, N);
    /* what the block recomputes; for the shared copies, what any block of the stage does */
    plan_recompute modes[2];
    int n_modes = layer >= 0 ? 1 : stage_recompute_modes(s, st, modes);
    if (layer >= 0) modes[0] = plan_block_recompute(s, st, layer);
    for (int id = 0; id < PLAN_NACT_BLOCK; id++) {
        if (id == PLAN_ACT_ATT_LOC && !ulysses) continue;
        if ((id == PLAN_ACT_MEAN1 || id == PLAN_ACT_MEAN2) && mm->norm != MODEL_NORM_LAYERNORM) continue;
        if (id == PLAN_ACT_U && mm->ffn_kind != MODEL_FFN_SWIGLU) continue;
        bool shared = false, packed_any = false;
        for (int k = 0; k < n_modes; k++) {
            bool per_layer = kept_per_layer(mm, (plan_act_id)id, modes[k]);
            bool packed = per_layer && bf16 && plan_act_saved_bf16((plan_act_id)id);
            if (layer >= 0 && per_layer) act_typed(l, (plan_act_id)id, layer, true, packed, size[id]);
            shared |= !per_layer || packed;
            packed_any |= packed;
        }
        if (layer >= 0) continue;
        /* the shared fp32 copy: recomputed, or the layer being run of a bf16 one (odd layers' input has its own) */
        if (shared) act(l, (plan_act_id)id, -1, false, size[id]);
        if (packed_any && id == PLAN_ACT_X) act(l, PLAN_ACT_X_ODD, -1, false, size[id]);
    }
}

/* The audio stem's tensors on the first stage (executor/audio.c): conv1 on
 * R1 rows and conv2 on N, each before and after its GELU (conv2's after is
 * the first block's input), the im2col rows and the stem's gradients; the
 * head's on the last: the N / pool pooled rows, their final LayerNorm and
 * the projector's output. */
static void audio_acts(act_list *l, const model_module *mm, const plan_module *s, const plan_stage *st, double N)
{
    double d = mm->hidden, k = mm->patch, C = mm->in_channels, R1 = plan_audio_conv1_rows(mm, s, N);
    double M = floor(N / (mm->pool > 0 ? mm->pool : 1));
    if (st->stem) {
        act(l, PLAN_ACT_C1PRE, -1, true, R1 * d);
        act(l, PLAN_ACT_C1OUT, -1, true, R1 * d);
        act(l, PLAN_ACT_C2PRE, -1, true, N * d);
    }
    if (st->head) {
        act(l, PLAN_ACT_POOLED, -1, true, M * d);
        act(l, PLAN_ACT_FLN, -1, true, M * d);
        act(l, PLAN_ACT_FMEAN, -1, true, M);
        act(l, PLAN_ACT_FRSTD, -1, true, M);
        act(l, PLAN_ACT_AOUT, -1, true, M * mm->out_hidden);
    }
    if (st->stem) {
        act(l, PLAN_ACT_COL, -1, false, fmax(R1 * C * k, N * d * k));
        act(l, PLAN_ACT_DCOL, -1, false, N * d * k);
        act(l, PLAN_ACT_DC1OUT, -1, false, R1 * d);
        act(l, PLAN_ACT_DC1PRE, -1, false, R1 * d);
    }
    if (st->head) act(l, PLAN_ACT_DPOOLED, -1, false, M * d);
}

int plan_block_bf16_elems(const model_module *mm, const plan_module *s, const plan_stage *st, int layer, double N,
                          double *elems)
{
    plan_act a[PLAN_NACT_BLOCK];
    act_list l = { a, PLAN_NACT_BLOCK, 0, NULL };
    block_acts(&l, mm, s, st, N, true, layer);
    int n = 0;
    for (int i = 0; i < l.n && i < l.cap; i++)
        if (a[i].bf16) elems[n++] = (double)a[i].elems;
    return n;
}

static int module_acts(act_list *lp, const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows);

void plan_stage_block_kinds(const model_module *mm, const plan_module *s, const plan_stage *st, double N,
                            int first[PLAN_BLOCK_KINDS], int count[PLAN_BLOCK_KINDS])
{
    for (int k = 0; k < PLAN_BLOCK_KINDS; k++) {
        count[k] = 0;
        first[k] = -1;
    }
    for (int j = 0; j < st->count; j++) {
        int b = plan_stage_block(st, j), u = plan_cp_layer(mm, s, b, N) == PLAN_CP_ULYSSES;
        int k = u + 2 * (plan_block_recompute(s, st, b) != s->recompute);
        if (first[k] < 0) first[k] = b;
        count[k]++;
    }
}

/* A summing pass over the stage's blocks: a block's list depends on the
 * layer only through its kind (plan_stage_block_kinds), so one block of
 * each kind is listed and counted as many times as the stage has. */
static void per_layer_sums(act_list *l, const model_module *mm, const plan_module *s, const plan_stage *st, double N,
                           bool bf16)
{
    int count[PLAN_BLOCK_KINDS], first[PLAN_BLOCK_KINDS];
    plan_stage_block_kinds(mm, s, st, N, first, count);
    for (int u = 0; u < PLAN_BLOCK_KINDS; u++) {
        if (!count[u]) continue;
        act_sums one = { .fp32_bytes = l->sums->fp32_bytes };
        act_list t = { NULL, 0, 0, &one };
        block_acts(&t, mm, s, st, N, bf16, first[u]);
        act_sums *m = l->sums;
        m->saved += count[u] * one.saved;
        m->block_saved += count[u] * one.block_saved;
        m->scratch += count[u] * one.scratch;
        m->logits += count[u] * one.logits;
        m->largest = fmax(m->largest, one.largest);
        l->n += count[u] * t.n;
    }
}

int plan_module_acts(const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows, plan_act *out,
                     int cap)
{
    act_list l = { out, cap, 0, NULL };
    return module_acts(&l, mm, s, stage, rows);
}

/* The stage's activations into l (plan_module_acts); their count. */
static int module_acts(act_list *lp, const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows)
{
    act_list l = *lp;
    plan_stage st = plan_vstage_of(mm, s, stage);
    double tp = s->tp, N = rows->rows, d = mm->hidden, hd = mm->head_dim, H = mm->heads / tp, f = mm->ffn / tp;
    double qd = H * hd, kd = mm->kv_heads / tp * hd;
    double split = plan_seqpar_split(mm, s);
    bool seqpar = split > 1;
    double Nl = N / split;
    if (l.sums) per_layer_sums(&l, mm, s, &st, N, rows->bf16);
    else for (int b = st.first; b < st.first + st.count; b++) block_acts(&l, mm, s, &st, N, rows->bf16, b);
    block_acts(&l, mm, s, &st, N, rows->bf16, -1);
    if (stage_ulysses(mm, s, &st, N)) {
        act(&l, PLAN_ACT_SP_PACK, -1, false, N * fmax(qd, kd));
        act(&l, PLAN_ACT_SP_DQ, -1, false, N * qd);
        act(&l, PLAN_ACT_SP_DK, -1, false, N * kd);
        act(&l, PLAN_ACT_SP_DV, -1, false, N * kd);
        act(&l, PLAN_ACT_SP_DATT, -1, false, N * qd);
        /* the LLM's ranks hold a slice of every sample: the all-to-all's rows come back rank-major and are regrouped */
        if (mm->kind == MODEL_LLM) act(&l, PLAN_ACT_SP_RECV, -1, false, N * fmax(qd, kd));
    }
    if (plan_cp_of(mm, s) == PLAN_CP_RING) {   /* executor/ring.c: two K/V blocks in flight, their gradients too */
        act(&l, PLAN_ACT_RING_KV, -1, false, 4 * N * kd);
        act(&l, PLAN_ACT_RING_DKV, -1, false, 4 * N * kd);
        act(&l, PLAN_ACT_RING_OUT, -1, false, N * qd);
        act(&l, PLAN_ACT_RING_LSE, -1, false, N * H);
    }
    if (seqpar) {
        act(&l, PLAN_ACT_TP_FULL, -1, false, N * d);
        act(&l, PLAN_ACT_TP_PART, -1, false, N * d);
        act(&l, PLAN_ACT_TP_DFULL, -1, false, N * d);
        act(&l, PLAN_ACT_TP_GRADS, -1, false, 4 * d);
    }
    act(&l, PLAN_ACT_X_FINAL, -1, true, Nl * d);
    if (plan_module_rotary(mm)) {
        act(&l, PLAN_ACT_COS, -1, true, N * hd / 2);
        act(&l, PLAN_ACT_SIN, -1, true, N * hd / 2);
    }
    if (plan_stage_recomputed_blocks(s, &st) > 0 && model_runs_backward(mm)) act(&l, PLAN_ACT_RC_OUT, -1, false, Nl * d);
    act(&l, PLAN_ACT_DRES, -1, false, Nl * d);
    act(&l, PLAN_ACT_DLN, -1, false, Nl * d);
    act(&l, PLAN_ACT_DQ, -1, false, N * qd);
    act(&l, PLAN_ACT_DK, -1, false, N * kd);
    act(&l, PLAN_ACT_DV, -1, false, N * kd);
    act(&l, PLAN_ACT_DATT, -1, false, N * qd);
    act(&l, PLAN_ACT_DG, -1, false, N * f);
    if (mm->ffn_kind == MODEL_FFN_SWIGLU) act(&l, PLAN_ACT_DU, -1, false, N * f);
    act(&l, PLAN_ACT_DH, -1, false, N * f);
    if (mm->kind == MODEL_AUDIO) {
        audio_acts(&l, mm, s, &st, N);
        return l.n;
    }
    if (mm->kind != MODEL_LLM) {
        if (st.stem && plan_module_clip(mm)) {
            act(&l, PLAN_ACT_CLIP_EMB, -1, true, N * d);
            act(&l, PLAN_ACT_CLIP_MEAN, -1, true, N);
            act(&l, PLAN_ACT_CLIP_RSTD, -1, true, N);
        }
        if (!st.head) return l.n;   /* the merger is the last stage's */
        double M = rows->merged_rows, ph = mm->proj_hidden, oh = mm->out_hidden;
        if (mm->proj_norm) {
            act(&l, PLAN_ACT_MLN, -1, true, N * d);
            act(&l, PLAN_ACT_MRSTD, -1, true, N);
        } else {   /* CLIP: the kept rows, the projector's input */
            act(&l, PLAN_ACT_MLN, -1, true, M * d);
        }
        act(&l, PLAN_ACT_H1, -1, true, M * ph);
        act(&l, PLAN_ACT_A1, -1, true, M * ph);
        act(&l, PLAN_ACT_VOUT, -1, true, M * oh);
        act(&l, PLAN_ACT_DH1, -1, false, M * ph);
        act(&l, PLAN_ACT_DA1, -1, false, M * ph);
        return l.n;
    }
    double P = rows->pred_rows, V = mm->vocab / tp;
    if (st.head) {   /* the final norm, the LM head and the cross-entropy: the last stage's */
        act(&l, PLAN_ACT_XG, -1, true, P * d);
        act(&l, PLAN_ACT_RSTDF, -1, true, P);
        act(&l, PLAN_ACT_GATH, -1, true, P * d);
        act(&l, PLAN_ACT_LOGITS, -1, true, P * V);
        act(&l, PLAN_ACT_DLOGITS, -1, true, P * V);
        act(&l, PLAN_ACT_CE_MX, -1, true, P);
        act(&l, PLAN_ACT_CE_ST, -1, true, 2 * P);
    }
    if (st.stem) act(&l, PLAN_ACT_EMB, -1, false, s->tp > 1 ? (double)rows->emb_rows * d : 0);
    if (st.head) {
        act(&l, PLAN_ACT_DGATH, -1, false, P * d);
        act(&l, PLAN_ACT_DXG, -1, false, P * d);
    }
    if (st.stem) act(&l, PLAN_ACT_DVIS, -1, false, (double)rows->merged_rows * d);
    return l.n;
}

void plan_module_act_bytes(const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows,
                           double fp32_bytes, double *saved, double *block_saved, double *scratch, double *logits)
{
    act_sums m = { .fp32_bytes = fp32_bytes };
    act_list l = { NULL, 0, 0, &m };
    module_acts(&l, mm, s, stage, rows);
    *saved = m.saved;
    *block_saved = m.block_saved;
    *scratch = m.scratch;
    *logits = m.logits;
}

double plan_largest_act(const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows)
{
    act_sums m = { .fp32_bytes = 4 };
    act_list l = { NULL, 0, 0, &m };
    module_acts(&l, mm, s, stage, rows);
    return m.largest;
}
