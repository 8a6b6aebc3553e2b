/* The step schedule: which operations every rank issues, in which order, on
 * which samples. The executor (executor/run.c) runs exactly these lists and
 * the simulator (planner/simulate.c) prices them; see planner.h. */
#include "planner/planner_int.h"

#include <limits.h>
#include <string.h>

static bool trains(const plan_t *p, int k) { return model_trains(&p->model.mod[k]); }

/* Disaggregated modules run on groups of their own: a rank in two would
 * have to run two modules' 1F1B streams at once. */
static int disjoint_groups(const plan_t *p, char *err)
{
    if (p->placement == PLAN_COLOCATED) return UTIL_OK;
    for (int a = 0; a < p->n_modules; a++)
        for (int b = a + 1; b < p->n_modules; b++) {
            const plan_module *x = &p->mod[a], *y = &p->mod[b];
            int lo = x->first_rank > y->first_rank ? x->first_rank : y->first_rank;
            int hi = x->first_rank + x->n_ranks < y->first_rank + y->n_ranks ? x->first_rank + x->n_ranks : y->first_rank + y->n_ranks;
            if (lo < hi)
                return util_fail(err, UTIL_EINVAL, "plan: disaggregated modules %s and %s share rank %d", x->module, y->module, lo);
        }
    return UTIL_OK;
}

/* The LLM's micro-batches that one 1F1B pass of dp rank d runs: the whole
 * step's, or colocated beside encoders one chunk's (plan_schedule_rank). */
static int pass_micros(const plan_t *p, int d, int c0, int c1)
{
    int L = p->model.llm, n = 0;
    for (int c = c0; c < c1; c++) {
        int f, cnt;
        plan_chunk_share(p, L, c, d, &f, &cnt);
        n += plan_micro_ops(p, L, c, cnt);
    }
    return n;
}

/* Interleaved stages (vp > 1): the LLM's, every rank stage's blocks in vp
 * chunks, and each 1F1B pass's micro-batches in whole groups of pp, as
 * Megatron-LM's interleaved schedule asks (its schedule table then pairs
 * the last stage's head forward with its backward). */
static int vp_check(const plan_t *p, int k, char *err)
{
    const plan_module *s = &p->mod[k];
    int vp = plan_vp(s), pp = s->pp;
    if (vp == 1) return UTIL_OK;
    if (k != p->model.llm)
        return util_fail(err, UTIL_EINVAL, "plan: module %s: vp %d: interleaved stages are the LLM's", s->module, vp);
    char why[UTIL_ERR_LEN];
    if (plan_stage_split_check(&p->model.mod[k], s, why)) return util_fail(err, UTIL_EINVAL, "plan: module %s", why);
    bool whole = p->placement != PLAN_COLOCATED || plan_whole_batch_pipeline(&p->model, &p->work);
    int n = plan_chunks(p);
    for (int d = 0; d < s->dp; d++)
        for (int c = 0; c < (whole ? 1 : n); c++) {
            int m = whole ? pass_micros(p, d, 0, n) : pass_micros(p, d, c, c + 1);
            if (m % pp)
                return util_fail(err, UTIL_EINVAL, "plan: module %s: vp %d needs the micro-batches of each pipeline pass in whole groups of pp = %d, not %d", s->module, vp, pp, m);
        }
    return UTIL_OK;
}

int plan_schedule_check(const plan_t *p, char *err)
{
    const model_t *m = &p->model;
    if (m->llm < 0 || m->llm >= p->n_modules)
        return util_fail(err, UTIL_EINVAL, "plan: no LLM module");
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        if (s->dp < 1 || s->tp < 1 || s->sp < 1 || s->pp < 1 || s->micro_batch < 1)
            return util_fail(err, UTIL_EINVAL, "plan: module %s: dp, tp, sp, pp and micro_batch must be >= 1", s->module);
        if (s->pp > PLAN_MAX_PP)
            return util_fail(err, UTIL_EINVAL, "plan: module %s: pp %d exceeds %d stages", s->module, s->pp, PLAN_MAX_PP);
        for (int i = 0; i < s->pp; i++)
            if (plan_stage_of(&m->mod[k], s, i).count < 1)
                return util_fail(err, UTIL_EINVAL, "plan: module %s: pipeline stage %d holds no block", s->module, i);
        int rc = vp_check(p, k, err);
        if (rc) return rc;
        if (k == m->llm) continue;
        if (m->mod[k].kind == MODEL_VISION && m->mod[k].pool > 1)
            return util_fail(err, UTIL_EUNSUPPORTED, "plan: module %s: pooled vision tokens (pool %d) are not implemented by the executor", s->module, m->mod[k].pool);
    }
    int rc = disjoint_groups(p, err);
    if (rc) return rc;
    bool any_trains = false;
    for (int k = 0; k < p->n_modules; k++) any_trains |= trains(p, k);
    if (!any_trains) return util_fail(err, UTIL_EINVAL, "plan: every module of %s is frozen: nothing to train", m->name);
    if (p->placement == PLAN_COLOCATED)
        for (int k = 0; k < p->n_modules; k++)
            if (p->mod[k].first_rank != 0 || p->mod[k].n_ranks != p->world_size)
                return util_fail(err, UTIL_EINVAL, "plan: colocated module %s must use all %d ranks", p->mod[k].module, p->world_size);
    for (int k = 0; k < p->n_modules; k++) {
        if (!plan_encoder_feeds(p, k)) continue;
        const plan_module *s = &p->mod[k];
        const model_module *mm = &m->mod[k];
        int m2 = mm->merge * mm->merge;
        if (mm->kind == MODEL_VISION && p->work.image_tokens % m2)
            return util_fail(err, UTIL_EINVAL, "plan: module %s: %d vision tokens per image are not whole %dx%d merge groups", s->module, p->work.image_tokens, mm->merge, mm->merge);
        /* transformers' CLIPVisionEmbeddings takes images of its image_size only: a position per patch and the class row */
        if (plan_module_clip(mm) && p->work.image_tokens + 1 != mm->max_positions)
            return util_fail(err, UTIL_EINVAL, "plan: module %s: %d vision tokens per image + the class row != its %d learned positions", s->module, p->work.image_tokens, mm->max_positions);
        if (mm->kind == MODEL_AUDIO && (rc = plan_audio_frames_check(mm, p->work.audio_frames, "plan: workload.audio_frames", err)))
            return rc;
        for (int c = 0; c < plan_chunks(p); c++)
            for (int i = 0; i < s->dp; i++) {
                int f, n;
                plan_chunk_share(p, k, c, i, &f, &n);
                for (int u = 0; u < plan_micro_count(s, n); u++) {
                    int uf, un;
                    plan_micro_range(s, f, n, u, &uf, &un);
                    long groups = (long)un * plan_rows_per_sample(p, k);   /* merge or pool groups */
                    if (groups % s->sp)
                        return util_fail(err, UTIL_EINVAL, "plan: module %s: a micro-batch of %d samples has %ld %s groups, not divisible by sp = %d", s->module, un, groups, mm->kind == MODEL_AUDIO ? "pool" : "merge", s->sp);
                }
            }
    }
    return UTIL_OK;
}

static int push(plan_schedule *s, plan_op_kind kind, int module, int chunk, int sample0, int samples,
                int slot, char *err)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        plan_op *op = util_realloc(s->op, (size_t)cap * sizeof *op);
        if (!op) return util_fail(err, UTIL_ENOMEM, "plan: out of memory for the schedule");
        s->op = op;
        s->cap = cap;
    }
    s->op[s->n++] = (plan_op){ kind, module, chunk, sample0, samples, slot, 0, false, -1 };
    return UTIL_OK;
}

/* ---- one module's micro-batches on one rank ---- */

typedef struct { int chunk, sample0, samples; } micro_item;
typedef struct { micro_item *v; int n; } micro_list;

/* Module k's micro-batches of chunks [c0, c1) on dp rank dp_i, in order. */
static int micros_of(const plan_t *p, int k, int dp_i, int c0, int c1, micro_list *l, char *err)
{
    int total = 0;
    for (int c = c0; c < c1; c++) {
        int f, n;
        plan_chunk_share(p, k, c, dp_i, &f, &n);
        total += plan_micro_ops(p, k, c, n);
    }
    l->n = 0;
    l->v = util_malloc((size_t)(total > 0 ? total : 1) * sizeof *l->v);
    if (!l->v) return util_fail(err, UTIL_ENOMEM, "plan: out of memory for the schedule");
    for (int c = c0; c < c1; c++) {
        int f, n;
        plan_chunk_share(p, k, c, dp_i, &f, &n);
        for (int u = 0; u < plan_micro_ops(p, k, c, n); u++) {
            int uf, un;
            plan_micro_range(&p->mod[k], f, n, u, &uf, &un);
            l->v[l->n++] = (micro_item){ c, uf, un };
        }
    }
    return UTIL_OK;
}

/* Forwards a 1F1B stage runs before its first backward: pp - 1 - stage (none
 * on the last); interleaved over vp model chunks, of its n units (micro-batch
 * x chunk), 2 (pp - 1 - stage) + (vp - 1) pp: each group of pp micro-batches
 * through every chunk but the last before the last stage's first backward
 * (Megatron-Core's get_pp_rank_microbatches, microbatch_group_size_per_vp_stage
 * = pp). */
static int warmup_of(int pp, int vp, int stage, int n)
{
    int w = vp > 1 ? 2 * (pp - 1 - stage) + (vp - 1) * pp : pp - 1 - stage;
    return w < n ? w : n;
}

/* ---- one 1F1B emitter for every stage of the graph ----
 * A stage (an encoder's stage over chunks, an LLM stage over micro-batches)
 * runs its n units forward `warmup` ahead of the first backward, then
 * alternates one forward, one backward, backwards in forward order
 * (PipeDream-Flush, Narayanan et al., arXiv 2006.09503). Without a backward
 * (a frozen encoder) it only forwards; with no warm-up and a fused op (the
 * LLM's last stage) each unit's forward and backward are one op. */
typedef struct {
    int (*forward)(void *ctx, int i, char *err);
    int (*backward)(void *ctx, int i, char *err);
    int (*fused)(void *ctx, int i, char *err);   /* NULL: forward then backward */
    /* Are forward unit i and backward unit j one unit's fused op? NULL: i == j. */
    bool (*same)(void *ctx, int i, int j);
} stage_ops;

/* Units are what a stage runs in turn; with interleaved virtual stages
 * (Narayanan et al. SC'21 sec. 2.2.2) a unit is one micro-batch through one
 * model chunk, forward unit i and backward unit j mapped to them by the
 * caller (Megatron-Core's schedule table), and the same loop: warm-up
 * forwards, one forward and one backward in turn, the cool-down backwards. */
static int emit_1f1b(int n, int warmup, bool backward, const stage_ops *ops, void *ctx, char *err)
{
    int rc = UTIL_OK;
    if (!backward || warmup > n) warmup = n;
    for (int i = 0; !rc && i < warmup; i++) rc = ops->forward(ctx, i, err);
    for (int j = 0; !rc && backward && j < n; j++) {
        int i = j + warmup;
        if (i < n && ops->fused && (ops->same ? ops->same(ctx, i, j) : i == j)) { rc = ops->fused(ctx, j, err); continue; }
        if (i < n) rc = ops->forward(ctx, i, err);
        if (!rc) rc = ops->backward(ctx, j, err);
    }
    return rc;
}

/* ---- the encoders: chunk by chunk through their stages ---- */

/* Slots of one in-flight chunk: its micro-batches; chunk c uses window c % W. */
static int slot_of(int per_chunk, int W, int c, int u) { return (c % W) * per_chunk + u; }

static int encoder_forward(const plan_t *p, int k, const plan_coord *me, int c, int W, int per_chunk,
                           plan_schedule *s, char *err)
{
    const plan_module *m = &p->mod[k];
    bool first = me->pp == 0, last = me->pp == m->pp - 1;
    int f, n, rc = UTIL_OK;
    plan_chunk_share(p, k, c, me->dp, &f, &n);
    for (int u = 0; !rc && u < plan_micro_ops(p, k, c, n); u++) {
        int uf, un;
        plan_micro_range(m, f, n, u, &uf, &un);
        int slot = un == 0 ? -1 : trains(p, k) ? slot_of(per_chunk, W, c, u) : 0;
        if (!first && un > 0) rc = push(s, PLAN_OP_RECV_STAGE, k, c, uf, un, -1, err);
        if (!rc) rc = push(s, PLAN_OP_FORWARD, k, c, uf, un, slot, err);
        if (!rc && !last && un > 0) rc = push(s, PLAN_OP_SEND_STAGE, k, c, uf, un, -1, err);
    }
    return rc || !last ? rc : push(s, PLAN_OP_SEND_ACT, k, c, f, n, -1, err);
}

static int encoder_backward(const plan_t *p, int k, const plan_coord *me, int c, int W, int per_chunk,
                            plan_schedule *s, char *err)
{
    const plan_module *m = &p->mod[k];
    bool first = me->pp == 0, last = me->pp == m->pp - 1;
    int f, n, rc = UTIL_OK;
    plan_chunk_share(p, k, c, me->dp, &f, &n);
    if (last) rc = push(s, PLAN_OP_RECV_GRAD, k, c, f, n, -1, err);
    for (int u = plan_micro_ops(p, k, c, n) - 1; !rc && u >= 0; u--) {
        int uf, un;
        plan_micro_range(m, f, n, u, &uf, &un);
        if (!last && un > 0) rc = push(s, PLAN_OP_RECV_STAGE_GRAD, k, c, uf, un, -1, err);
        if (!rc) rc = push(s, PLAN_OP_BACKWARD, k, c, uf, un, un == 0 ? -1 : slot_of(per_chunk, W, c, u), err);
        if (!rc && !first && un > 0) rc = push(s, PLAN_OP_SEND_STAGE_GRAD, k, c, uf, un, -1, err);
    }
    return rc;
}

/* An encoder stage's units are chunks. */
typedef struct {
    const plan_t *p;
    int k, W, per_chunk;
    const plan_coord *me;
    plan_schedule *s;
} encoder_stage;

static int encoder_unit_forward(void *ctx, int c, char *err)
{
    encoder_stage *e = ctx;
    return encoder_forward(e->p, e->k, e->me, c, e->W, e->per_chunk, e->s, err);
}

static int encoder_unit_backward(void *ctx, int c, char *err)
{
    encoder_stage *e = ctx;
    return encoder_backward(e->p, e->k, e->me, c, e->W, e->per_chunk, e->s, err);
}

/* ---- the LLM: 1F1B over its micro-batches ---- */

typedef struct {
    const plan_t *p;
    plan_schedule *s;
    int L, dp, stage, pp, vp;
    micro_list M;
    int next_recv;            /* the first chunk whose encoder rows are not received yet */
    int *left;                /* per chunk of [c0, c1): backwards still to run before its gradient goes back */
    int c0;
    int *slot;                /* per (micro-batch, model chunk): the slot its forward filled */
    bool *busy;               /* per (slot / vp, model chunk): a slot in use */
    int cap;                  /* slots per model chunk */
} llm_pipe;

/* Unit u of the stage's 1F1B order, micro-batch *mi through model chunk *v:
 * Megatron-Core's schedule table (get_schedule_table, groups of pp
 * micro-batches through chunk 0, then chunk 1, ...), the model chunks in
 * reverse for backwards (get_model_chunk_id). vp = 1: micro-batch u. */
static void table_unit(int pp, int vp, int u, bool forward, int *mi, int *v)
{
    int group = u / (pp * vp), r = u % (pp * vp);
    *v = forward ? r / pp : vp - 1 - r / pp;
    *mi = group * pp + r % pp;
}

static void llm_unit(const llm_pipe *q, int u, bool forward, int *mi, int *v) { table_unit(q->pp, q->vp, u, forward, mi, v); }

int plan_pipeline_peak_units(int pp, int vp, int stage, int units, int *slots)
{
    if (vp < 1) vp = 1;
    int held = warmup_of(pp, vp, stage, units) + 1;
    if (held > units) held = units;
    for (int v = 0; v < vp && v < PLAN_MAX_VP; v++) slots[v] = 0;
    for (int u = 0; u < held; u++) {
        int mi, v;
        table_unit(pp, vp, u, true, &mi, &v);
        if (v < PLAN_MAX_VP) slots[v]++;
    }
    return held > 0 ? held : 0;
}

/* The first and the last virtual stage: the stem (encoder rows in, their gradient out) and the head. */
static bool unit_first(const llm_pipe *q, int v) { return q->stage == 0 && v == 0; }
static bool unit_last(const llm_pipe *q, int v) { return q->stage == q->pp - 1 && v == q->vp - 1; }

/* A slot for micro-batch mi's forward through chunk v: the lowest free one of
 * the chunk's, numbered slot * vp + v so that each slot holds one chunk's
 * activations (vp = 1: forward i in slot i mod the in-flight count, as
 * backwards free them in forward order). */
static int take_slot(llm_pipe *q, int mi, int v)
{
    int k = 0;
    while (k < q->cap - 1 && q->busy[k * q->vp + v]) k++;
    q->busy[k * q->vp + v] = true;
    return q->slot[mi * q->vp + v] = k * q->vp + v;
}

static void free_slot(llm_pipe *q, int mi, int v) { q->busy[q->slot[mi * q->vp + v]] = false; }

static int llm_push(llm_pipe *q, plan_op_kind kind, const micro_item *m, int slot, int v, char *err)
{
    int rc = push(q->s, kind, q->L, m->chunk, m->sample0, m->samples, slot, err);
    if (!rc) q->s->op[q->s->n - 1].vchunk = v;
    return rc;
}

/* The first stage's share of chunk c: the samples its encoder transfers carry. */
static void pipe_share(const llm_pipe *q, int c, int *f, int *n) { plan_chunk_share(q->p, q->L, c, q->dp, f, n); }

static int send_grads(llm_pipe *q, int c, char *err)
{
    int f, n, rc = UTIL_OK;
    pipe_share(q, c, &f, &n);
    for (int k = 0; !rc && k < q->p->n_modules; k++)
        if (plan_encoder_feeds(q->p, k) && trains(q->p, k)) rc = push(q->s, PLAN_OP_SEND_GRAD, k, c, f, n, -1, err);
    return rc;
}

/* The first stage receives every encoder's rows of chunks up to `upto`
 * (a chunk with no micro-batch here sends its empty gradient at once). */
static int receive_chunks(llm_pipe *q, int upto, char *err)
{
    const plan_t *p = q->p;
    int rc = UTIL_OK;
    for (; !rc && q->stage == 0 && q->next_recv <= upto; q->next_recv++) {
        int c = q->next_recv, f, n;
        pipe_share(q, c, &f, &n);
        for (int k = 0; !rc && k < p->n_modules; k++)
            if (plan_encoder_feeds(p, k)) rc = push(q->s, PLAN_OP_RECV_ACT, k, c, f, n, -1, err);
        if (!rc && q->left[c - q->c0] == 0) rc = send_grads(q, c, err);
    }
    return rc;
}

static int llm_input(llm_pipe *q, const micro_item *m, int v, char *err)
{
    if (unit_first(q, v)) return receive_chunks(q, m->chunk, err);
    return llm_push(q, PLAN_OP_RECV_STAGE, m, -1, v, err);
}

/* After micro-batch m's backward: its input's gradient to the previous stage, or on the first stage the chunk's encoder gradients once its last backward ran. */
static int llm_input_grad(llm_pipe *q, const micro_item *m, int v, char *err)
{
    if (!unit_first(q, v)) return llm_push(q, PLAN_OP_SEND_STAGE_GRAD, m, -1, v, err);
    return --q->left[m->chunk - q->c0] == 0 ? send_grads(q, m->chunk, err) : UTIL_OK;
}

static int llm_forward(void *ctx, int i, char *err)
{
    llm_pipe *q = ctx;
    int mi, v;
    llm_unit(q, i, true, &mi, &v);
    const micro_item *m = &q->M.v[mi];
    int rc = llm_input(q, m, v, err);
    if (!rc) rc = llm_push(q, PLAN_OP_FORWARD, m, take_slot(q, mi, v), v, err);
    if (!rc) rc = llm_push(q, PLAN_OP_SEND_STAGE, m, -1, v, err);
    return rc;
}

static int llm_backward(void *ctx, int j, char *err)
{
    llm_pipe *q = ctx;
    int mi, v;
    llm_unit(q, j, false, &mi, &v);
    const micro_item *m = &q->M.v[mi];
    int rc = llm_push(q, PLAN_OP_RECV_STAGE_GRAD, m, -1, v, err);
    if (!rc) rc = llm_push(q, PLAN_OP_BACKWARD, m, q->slot[mi * q->vp + v], v, err);
    free_slot(q, mi, v);
    return rc ? rc : llm_input_grad(q, m, v, err);
}

/* The head (the last stage's last chunk): forward and backward of one
 * micro-batch as one op, in a slot of its own when it shares the rank with
 * other chunks (else -1: the module's slot 0). */
static int llm_fused(void *ctx, int j, char *err)
{
    llm_pipe *q = ctx;
    int mi, v;
    llm_unit(q, j, false, &mi, &v);
    const micro_item *m = &q->M.v[mi];
    int rc = llm_input(q, m, v, err), slot = -1;
    if (q->vp > 1) {
        slot = take_slot(q, mi, v);
        free_slot(q, mi, v);
    }
    if (!rc) rc = llm_push(q, PLAN_OP_FORWARD_BACKWARD, m, slot, v, err);
    return rc ? rc : llm_input_grad(q, m, v, err);
}

/* Forward unit i and backward unit j fuse where they are the head's pass of one micro-batch. */
static bool llm_same(void *ctx, int i, int j)
{
    llm_pipe *q = ctx;
    int fi, fv, bi, bv;
    llm_unit(q, i, true, &fi, &fv);
    llm_unit(q, j, false, &bi, &bv);
    return fi == bi && fv == bv && unit_last(q, fv);
}

/* Chunks [c0, c1) of the LLM on this rank's stage: stage i forwards
 * pp - 1 - i micro-batches ahead (interleaved: warmup_of's units), then one
 * forward, one backward; each forward's activations in a slot the backward
 * of the same unit frees. */
static int llm_chunks(const plan_t *p, const plan_coord *me, int c0, int c1, plan_schedule *s, char *err)
{
    int L = p->model.llm;
    llm_pipe q = { .p = p, .s = s, .L = L, .dp = me->dp, .stage = me->pp, .pp = p->mod[L].pp,
                   .vp = plan_vp(&p->mod[L]), .c0 = c0, .next_recv = c0 };
    int rc = micros_of(p, L, me->dp, c0, c1, &q.M, err);
    int n = q.M.n * q.vp, w = warmup_of(q.pp, q.vp, q.stage, n);
    q.cap = w + 1;
    q.left = rc ? NULL : util_calloc((size_t)(c1 - c0), sizeof *q.left);
    q.slot = rc ? NULL : util_calloc((size_t)(n > 0 ? n : 1), sizeof *q.slot);
    q.busy = rc ? NULL : util_calloc((size_t)q.cap * q.vp, sizeof *q.busy);
    if (!rc && (!q.left || !q.slot || !q.busy)) rc = util_fail(err, UTIL_ENOMEM, "plan: out of memory for the schedule");
    for (int i = 0; !rc && i < q.M.n; i++) q.left[q.M.v[i].chunk - c0]++;
    static const stage_ops ops = { llm_forward, llm_backward, llm_fused, llm_same };
    if (!rc) rc = emit_1f1b(n, w, true, &ops, &q, err);
    if (!rc) rc = receive_chunks(&q, c1 - 1, err);   /* chunks with no micro-batch after the last one */
    util_free(q.M.v);
    util_free(q.left);
    util_free(q.slot);
    util_free(q.busy);
    return rc;
}

/* The encoder-LLM loop on one LLM replica running n chunks of m
 * micro-batches each: the LLM's first stage sends chunk c's gradient after
 * the backward of its last micro-batch there (through model chunk 0), by
 * which time it has forwarded w more units (the 1F1B warm-up), possibly of
 * later chunks whose rows the encoder must have sent. Per chunk
 * (plan_chunk_loop), each the most over the replicas: its first forward
 * unit, the backward units before it, and need and reach (reach of the most
 * need). In closed form over the schedule's unit order (table_unit), so a
 * step of 2^28 micro-batches costs n steps, not 2^28. */
static void note_need(plan_chunk_loop *l, int nd, int r)
{
    if (nd > l->need) { l->need = nd; l->reach = 0; }
    if (nd == l->need && r > l->reach) l->reach = r;
}

/* The unit that runs micro-batch mi through model chunk v, forward or
 * backward (the inverse of table_unit). */
static long unit_of(int pp, int vp, long mi, int v, bool forward)
{
    return (mi / pp) * pp * vp + (long)(forward ? v : vp - 1 - v) * pp + mi % pp;
}

static void replica_loop(int pp, int vp, int n, int m, plan_chunk_loop *per_chunk)
{
    if (m <= 0) return;
    long N = (long)n * m, U = N * vp, w = warmup_of(pp, vp, 0, U > INT_MAX ? INT_MAX : (int)U);
    for (int c = 0; c < n; c++) {
        plan_chunk_loop *l = &per_chunk[c];
        long first = unit_of(pp, vp, (long)c * m, 0, true);
        if (first > l->first_unit) l->first_unit = first;
        if (first - w > l->backs) l->backs = first - w;   /* forward u follows backward u - w - 1 */
        long j = unit_of(pp, vp, (long)c * m + m - 1, 0, false), ahead = j + w < U ? j + w : U - 1;
        /* the latest micro-batch into model chunk 0 among forward units 0..ahead (none past the step's) */
        long g = ahead / ((long)pp * vp), r = ahead % ((long)pp * vp);
        long most = g * pp + (r < pp ? r : pp - 1);
        if (most > N - 1) most = N - 1;
        long dep = most / m;
        note_need(l, (int)(dep - c + 1), (int)(ahead - unit_of(pp, vp, dep * m, 0, true) + 1));
    }
}

/* Per-chunk needs -> the loop: a window of 2 chunks at least, so the
 * encoder's next chunk overlaps the LLM; at most the step's chunks. */
static plan_encoder_loop loop_of(const plan_chunk_loop *per_chunk, int n_chunks)
{
    plan_chunk_loop all = { 0 };   /* the most need over the chunks, with its reach */
    for (int c = 0; c < n_chunks; c++) note_need(&all, per_chunk[c].need, per_chunk[c].reach);
    int most = all.need;
    plan_encoder_loop l = { most > 2 ? most : 2, most >= 2 ? all.reach : 0 };
    if (l.window >= n_chunks) { l.window = n_chunks; if (most > n_chunks) l.reach = 0; }
    return l;
}

int plan_encoder_loop_even(int pp, int vp, int n_chunks, int micros_per_chunk, plan_encoder_loop *out, char *err)
{
    *out = (plan_encoder_loop){ 1, 0 };
    if (n_chunks <= 1 || micros_per_chunk <= 0) return UTIL_OK;
    plan_chunk_loop *l = util_calloc((size_t)n_chunks, sizeof *l);
    if (!l) return util_fail(err, UTIL_ENOMEM, "plan: out of memory for the schedule");
    replica_loop(pp, vp, n_chunks, micros_per_chunk, l);
    *out = loop_of(l, n_chunks);
    util_free(l);
    return UTIL_OK;
}

/* Every chunk of a disaggregated step has global_batch / n_micro samples, so
 * an LLM replica runs the same micro-batches of each (its share, which
 * replicas differ in by one sample at most). */
void plan_llm_chunk_loops(const plan_t *p, plan_chunk_loop *per_chunk)
{
    int n_chunks = plan_chunks(p), L = p->model.llm, done[2] = { -1, -1 };
    memset(per_chunk, 0, sizeof *per_chunk * (size_t)n_chunks);
    for (int d = 0; d < p->mod[L].dp; d++) {
        int f, count;
        plan_chunk_share(p, L, 0, d, &f, &count);
        int m = plan_micro_ops(p, L, 0, count);
        if (m == done[0] || m == done[1]) continue;
        done[done[0] < 0 ? 0 : 1] = m;
        replica_loop(p->mod[L].pp, plan_vp(&p->mod[L]), n_chunks, m, per_chunk);
    }
}

/* Colocated, frozen or with one chunk there is no loop: window 1. */
static bool has_loop(const plan_t *p, int enc)
{
    return p->placement != PLAN_COLOCATED && trains(p, enc) && plan_chunks(p) > 1;
}

plan_encoder_loop plan_encoder_loop_in(const plan_t *p, int enc, const plan_chunk_loop *per_chunk)
{
    return has_loop(p, enc) ? loop_of(per_chunk, plan_chunks(p)) : (plan_encoder_loop){ 1, 0 };
}

int plan_encoder_loops(const plan_t *p, plan_encoder_loop *out, char *err)
{
    plan_chunk_loop *l = NULL;   /* the LLM's loop, filled once for every encoder that has one */
    for (int k = 0; k < p->n_modules; k++) {
        bool loop = plan_encoder_feeds(p, k) && has_loop(p, k);
        if (loop && !l) {
            if (!(l = util_calloc((size_t)plan_chunks(p), sizeof *l)))
                return util_fail(err, UTIL_ENOMEM, "plan: out of memory for the schedule");
            plan_llm_chunk_loops(p, l);
        }
        out[k] = loop ? plan_encoder_loop_in(p, k, l) : (plan_encoder_loop){ 1, 0 };
    }
    util_free(l);
    return UTIL_OK;
}

/* After the last micro-batch, as each module's data-parallel strategy says
 * (plan_dp_rules_of): the tied embedding's sync, the gradient sync, the
 * global norm, the update, the gather of the updated weights. */
static int step_tail(const plan_t *p, int rank, const bool *on, plan_schedule *s, char *err)
{
    int rc = UTIL_OK;
    plan_dp_rules dp[MODEL_MAX_MODULES];
    for (int k = 0; k < p->n_modules; k++) dp[k] = plan_dp_rules_of(&p->model.mod[k], &p->mod[k]);
    for (int k = 0; !rc && k < p->n_modules; k++) {
        plan_group g;
        if (on[k] && plan_embed_group_of(p, k, rank, &g)) rc = push(s, PLAN_OP_EMBED_SYNC, k, -1, 0, 0, -1, err);
    }
    for (int k = 0; !rc && k < p->n_modules; k++)
        if (on[k] && dp[k].step_grad_sync) rc = push(s, PLAN_OP_GRAD_SYNC, k, -1, 0, 0, -1, err);
    if (!rc) rc = push(s, PLAN_OP_GRAD_NORM, -1, -1, 0, 0, -1, err);
    for (int k = 0; !rc && k < p->n_modules; k++) {
        if (!on[k] || !dp[k].trains) continue;
        rc = push(s, PLAN_OP_OPTIMIZER, k, -1, 0, 0, -1, err);
        if (!rc && dp[k].step_param_gather) rc = push(s, PLAN_OP_PARAM_GATHER, k, -1, 0, 0, -1, err);
    }
    return rc;
}

/* The activation slots each module's forwards fill on this rank, each
 * allocated at its first use (an empty micro-batch fills none; the LLM's
 * last stage fills slot 0). */
static int count_slots(plan_schedule *s, int llm, char *err)
{
    int most = -1;
    for (int i = 0; i < s->n; i++)
        if (s->op[i].slot > most) most = s->op[i].slot;
    bool *used = util_calloc((size_t)(most + 2) * MODEL_MAX_MODULES, sizeof *used);
    if (!used) return util_fail(err, UTIL_ENOMEM, "plan: out of memory for the schedule");
    for (int i = 0; i < s->n; i++) {
        const plan_op *o = &s->op[i];
        bool fills = (o->kind == PLAN_OP_FORWARD && o->slot >= 0) || (o->kind == PLAN_OP_FORWARD_BACKWARD && o->samples > 0);
        if (!fills) continue;
        int slot = o->slot >= 0 ? o->slot : 0;
        bool *u = &used[(size_t)o->module * (most + 2) + slot];
        if (!*u) {
            *u = true;
            s->slots[o->module]++;
            if (o->module == llm && o->vchunk >= 0 && o->vchunk < PLAN_MAX_VP) s->vslots[o->vchunk]++;
        }
    }
    util_free(used);
    return UTIL_OK;
}

/* The step's last backward of each module's model chunk: after it, a
 * unit's gradient is final when the unit's backward ends (the executor's
 * replicated and ZeRO-1 reductions start there, executor/dp_overlap.c). */
static void mark_last_backward(plan_schedule *s)
{
    bool seen[MODEL_MAX_MODULES][PLAN_MAX_VP] = { { false } };
    for (int i = s->n - 1; i >= 0; i--) {
        plan_op *o = &s->op[i];
        if ((o->kind != PLAN_OP_BACKWARD && o->kind != PLAN_OP_FORWARD_BACKWARD) || o->module < 0) continue;
        if (o->module >= MODEL_MAX_MODULES || o->vchunk < 0 || o->vchunk >= PLAN_MAX_VP) continue;
        o->last_backward = !seen[o->module][o->vchunk];
        seen[o->module][o->vchunk] = true;
    }
}

/* When a hand-off send may be freed (plan_op.retires). A send completes
 * when its receiver takes it; the executor keeps it until then, so a rank
 * that held every send to the step's end would hold all chunks' rows: more
 * with every chunk of the batch. Each retiring op below comes after every
 * receiver has taken the sends it retires, so waiting for them costs
 * nothing:
 * - an encoder's RECV_GRAD of chunk c retires its chunk-c rows: its
 *   gradients come from an LLM tp rank of every (dp, sp) group its rows
 *   went to (plan_handoff), after that group's forward of chunk c, whose
 *   tensor-parallel collectives each tp rank joins only after its RECV_ACT
 *   of chunk c;
 * - the LLM's RECV_ACT of chunk c + W retires its chunk-c gradients: an
 *   encoder sends chunk c + W after its RECV_GRAD of chunk c (the encoder
 *   runs W chunks ahead: plan_encoder_loops; colocated, chunk after chunk, 1).
 * A frozen encoder gets no gradients: nothing it runs comes after its
 * receivers took its rows. Its SEND_ACT of chunk c + 1 therefore waits for
 * them to take chunk c, then frees it, before sending: one chunk held, the
 * encoder at most a chunk ahead of the LLM's first stage, which it would
 * only wait for while it is faster. No cycle: a receiver takes chunk c at
 * its RECV_ACT of c, which needs only chunks up to c sent (colocated, the
 * rank's own chunk-c forward and its wait for chunk c - 1 come first; the
 * LLM never waits for a frozen encoder otherwise). The last chunks'
 * gradients and a frozen encoder's last chunk are freed when the step
 * ends. */
static void mark_retires(const plan_t *p, const int *window, plan_schedule *s)
{
    for (int i = 0; i < s->n; i++) {
        plan_op *o = &s->op[i];
        if (o->module < 0 || o->module >= p->n_modules) continue;
        if (o->kind == PLAN_OP_RECV_GRAD) o->retires = o->chunk;
        else if (o->kind == PLAN_OP_RECV_ACT && trains(p, o->module) && o->chunk >= window[o->module])
            o->retires = o->chunk - window[o->module];
        else if (o->kind == PLAN_OP_SEND_ACT && !trains(p, o->module) && o->chunk >= 1)
            o->retires = o->chunk - 1;
    }
}

int plan_schedule_rank(const plan_t *p, int rank, plan_schedule *s, char *err)
{
    memset(s, 0, sizeof *s);
    s->rank = rank;
    int rc = plan_schedule_check(p, err);
    if (rc) return rc;
    if (rank < 0 || rank >= p->world_size)
        return util_fail(err, UTIL_EINVAL, "plan: rank %d outside the plan's %d ranks", rank, p->world_size);
    bool on[MODEL_MAX_MODULES] = { false };
    plan_coord me[MODEL_MAX_MODULES];
    int L = p->model.llm, n = plan_chunks(p);
    encoder_stage enc[MODEL_MAX_MODULES];
    int n_enc = 0, window[MODEL_MAX_MODULES] = { 0 };
    plan_encoder_loop loop[MODEL_MAX_MODULES];
    if ((rc = plan_encoder_loops(p, loop, err))) return rc;
    for (int k = 0; k < p->n_modules; k++) {
        on[k] = plan_rank_coord(p, k, rank, &me[k]);
        if (!plan_encoder_feeds(p, k)) continue;
        int W = window[k] = loop[k].window;
        enc[n_enc++] = (encoder_stage){ p, k, W, plan_max_micro_per_share(p, k), &me[k], s };
    }
    if (p->placement == PLAN_COLOCATED && plan_whole_batch_pipeline(&p->model, &p->work)) {
        rc = llm_chunks(p, &me[L], 0, n, s, err);
    } else if (p->placement == PLAN_COLOCATED) {
        /* chunk by chunk: every encoder's forward, the LLM's, the encoders' backwards in reverse */
        for (int c = 0; !rc && c < n; c++) {
            for (int e = 0; !rc && e < n_enc; e++) rc = encoder_unit_forward(&enc[e], c, err);
            if (!rc) rc = llm_chunks(p, &me[L], c, c + 1, s, err);
            for (int e = n_enc - 1; !rc && e >= 0; e--)
                if (trains(p, enc[e].k)) rc = encoder_unit_backward(&enc[e], c, err);
        }
    } else if (on[L]) {
        rc = llm_chunks(p, &me[L], 0, n, s, err);
    } else {
        /* each encoder its own group: W chunks in flight, W - 1 forwards before the first backward */
        static const stage_ops ops = { encoder_unit_forward, encoder_unit_backward, NULL, NULL };
        for (int e = 0; !rc && e < n_enc; e++)
            if (on[enc[e].k]) rc = emit_1f1b(n, enc[e].W - 1, trains(p, enc[e].k), &ops, &enc[e], err);
    }
    if (!rc) rc = step_tail(p, rank, on, s, err);
    if (!rc) rc = count_slots(s, p->model.llm, err);
    if (!rc) mark_last_backward(s);
    if (!rc) mark_retires(p, window, s);
    if (rc) plan_schedule_free(s);
    return rc;
}

void plan_schedule_free(plan_schedule *s)
{
    util_free(s->op);
    s->op = NULL;
    s->n = s->cap = 0;
}
