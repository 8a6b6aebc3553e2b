/* The step schedule: which operations every rank issues, in which order, on
 * which samples. The executor (executor/run.c) runs exactly these lists and
 * the simulator (planner/simulate.c) prices them; see planner.h. */
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

/* Colocated chunks hold one micro-batch of every LLM dp rank. */
static int colocated_chunk_samples(const plan_t *p)
{
    const plan_module *l = &p->mod[p->model.llm];
    int c = l->dp * (l->micro_batch > 0 ? l->micro_batch : 1);
    return c > 0 ? c : 1;
}

int plan_chunks(const plan_t *p)
{
    int B = p->work.global_batch;
    if (p->placement == PLAN_DISAGGREGATED) return p->n_micro > 0 ? p->n_micro : 1;
    int C = colocated_chunk_samples(p);
    return (B + C - 1) / C;
}

void plan_chunk_range(const plan_t *p, int c, int *first, int *count)
{
    int B = p->work.global_batch;
    if (p->placement == PLAN_DISAGGREGATED) {
        int n = plan_chunks(p);
        *first = (int)((long)c * B / n);
        *count = (int)((long)(c + 1) * B / n) - *first;
        return;
    }
    int C = colocated_chunk_samples(p);
    *first = c * C;
    *count = B - *first < C ? B - *first : C;
}

void plan_chunk_share(const plan_t *p, int k, int c, int dp_i, int *first, int *count)
{
    int f, n, dp = p->mod[k].dp;
    plan_chunk_range(p, c, &f, &n);
    *first = f + (int)((long)dp_i * n / dp);
    *count = f + (int)((long)(dp_i + 1) * n / dp) - *first;
}

int plan_max_share(const plan_t *p, int k)
{
    int most = 0;
    for (int c = 0; c < plan_chunks(p); c++)
        for (int i = 0; i < p->mod[k].dp; i++) {
            int f, n;
            plan_chunk_share(p, k, c, i, &f, &n);
            if (n > most) most = n;
        }
    return most;
}

bool plan_rank_coord(const plan_t *p, int k, int rank, plan_coord *out)
{
    const plan_module *s = &p->mod[k];
    int local = rank - s->first_rank;
    if (local < 0 || local >= s->n_ranks) return false;
    out->tp = local % s->tp;
    local /= s->tp;
    out->sp = local % s->sp;
    local /= s->sp;
    out->dp = local % s->dp;
    out->pp = local / s->dp;
    return true;
}

int plan_coord_rank(const plan_t *p, int k, const plan_coord *c)
{
    const plan_module *s = &p->mod[k];
    return s->first_rank + ((c->pp * s->dp + c->dp) * s->sp + c->sp) * s->tp + c->tp;
}

int plan_rows_per_sample(const plan_t *p, int k)
{
    const model_module *mm = &p->model.mod[k];
    int m2 = mm->merge > 0 ? mm->merge * mm->merge : 1;
    return p->work.images_per_sample * (p->work.image_tokens / m2);
}

static bool is_encoder(const plan_t *p, int k)
{
    return k != p->model.llm && p->work.images_per_sample > 0;
}

static bool trains(const plan_t *p, int k) { return !p->model.mod[k].frozen; }

/* Micro-batch u of a share [first, first + count): samples of micro_batch size. */
static int micro_count(const plan_module *s, int count)
{
    int mb = s->micro_batch > 0 ? s->micro_batch : 1;
    return (count + mb - 1) / mb;
}

/* Micro-batch u of a share; past the share's end an empty one (no samples) at its end. */
static void micro_range(const plan_module *s, int first, int count, int u, int *f, int *n)
{
    int mb = s->micro_batch > 0 ? s->micro_batch : 1, left = count - u * mb;
    *f = left > 0 ? first + u * mb : first + count;
    *n = left <= 0 ? 0 : left < mb ? left : mb;
}

/* Micro-batches module k runs of chunk c on a rank whose share is `count`
 * samples: its own, or where the data-parallel strategy gathers or reduces
 * units inside every micro-batch (ZeRO-2/3), as many as the module's busiest
 * dp rank of the chunk, the extra ones empty, so every collective of the
 * shard group is matched (PyTorch's Join for uneven inputs). */
static int micro_ops(const plan_t *p, int k, int c, int count)
{
    const plan_module *s = &p->mod[k];
    int n = micro_count(s, count);
    plan_dp_rules r = plan_dp_rules_of(&p->model.mod[k], s);
    if (!r.unit_param_gather && !r.unit_grad_reduce) return n;
    for (int i = 0; i < s->dp; i++) {
        int f, share;
        plan_chunk_share(p, k, c, i, &f, &share);
        if (micro_count(s, share) > n) n = micro_count(s, share);
    }
    return n;
}

/* The most micro-batches module k runs of any chunk (activation slots per chunk). */
static int max_micro_per_share(const plan_t *p, int k)
{
    int most = 0;
    for (int c = 0; c < plan_chunks(p); c++)
        for (int i = 0; i < p->mod[k].dp; i++) {
            int f, n;
            plan_chunk_share(p, k, c, i, &f, &n);
            int m = micro_ops(p, k, c, n);
            if (m > most) most = m;
        }
    return most;
}

int plan_schedule_check(const plan_t *p, char *err)
{
    const model_t *m = &p->model;
    if (m->llm < 0 || m->llm >= p->n_modules)
        return util_fail(err, UTIL_EINVAL, "plan: no LLM module");
    int encoders = 0;
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        if (s->pp != 1)
            return util_fail(err, UTIL_EUNSUPPORTED, "plan: module %s: pipeline parallelism (pp = %d) is not implemented by the executor", s->module, s->pp);
        if (s->dp < 1 || s->tp < 1 || s->sp < 1 || s->micro_batch < 1)
            return util_fail(err, UTIL_EINVAL, "plan: module %s: dp, tp, sp and micro_batch must be >= 1", s->module);
        if (k == m->llm) continue;
        if (m->mod[k].kind != MODEL_VISION)
            return util_fail(err, UTIL_EUNSUPPORTED, "plan: module %s: only vision encoders are implemented by the executor", s->module);
        if (m->mod[k].pool > 1)
            return util_fail(err, UTIL_EUNSUPPORTED, "plan: module %s: pooled vision tokens (pool %d) are not implemented by the executor", s->module, m->mod[k].pool);
        encoders++;
    }
    if (encoders > 1)
        return util_fail(err, UTIL_EUNSUPPORTED, "plan: %d encoders: the executor runs one vision encoder and one LLM", encoders);
    bool any_trains = false;
    for (int k = 0; k < p->n_modules; k++) any_trains |= trains(p, k);
    if (!any_trains) return util_fail(err, UTIL_EINVAL, "plan: every module of %s is frozen: nothing to train", m->name);
    if (p->placement == PLAN_COLOCATED)
        for (int k = 0; k < p->n_modules; k++)
            if (p->mod[k].first_rank != 0 || p->mod[k].n_ranks != p->world_size)
                return util_fail(err, UTIL_EINVAL, "plan: colocated module %s must use all %d ranks", p->mod[k].module, p->world_size);
    for (int k = 0; k < p->n_modules; k++) {
        if (!is_encoder(p, k)) continue;
        const plan_module *s = &p->mod[k];
        const model_module *mm = &m->mod[k];
        int m2 = mm->merge * mm->merge;
        if (p->work.image_tokens % m2)
            return util_fail(err, UTIL_EINVAL, "plan: module %s: %d vision tokens per image are not whole %dx%d merge groups", s->module, p->work.image_tokens, mm->merge, mm->merge);
        for (int c = 0; c < plan_chunks(p); c++)
            for (int i = 0; i < s->dp; i++) {
                int f, n;
                plan_chunk_share(p, k, c, i, &f, &n);
                for (int u = 0; u < micro_count(s, n); u++) {
                    int uf, un;
                    micro_range(s, f, n, u, &uf, &un);
                    long groups = (long)un * p->work.images_per_sample * p->work.image_tokens / m2;
                    if (groups % s->sp)
                        return util_fail(err, UTIL_EINVAL, "plan: module %s: a micro-batch of %d samples has %ld merge groups, not divisible by sp = %d", s->module, un, groups, s->sp);
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
    s->op[s->n++] = (plan_op){ kind, module, chunk, sample0, samples, slot };
    return UTIL_OK;
}

/* Slots of one in-flight chunk: its micro-batches; chunk c uses window c % W. */
static int slot_of(int per_chunk, int W, int c, int u) { return (c % W) * per_chunk + u; }

static int encoder_forward(const plan_t *p, int k, const plan_coord *me, int c, int W, int per_chunk,
                           plan_schedule *s, char *err)
{
    const plan_module *m = &p->mod[k];
    int f, n, rc = UTIL_OK;
    plan_chunk_share(p, k, c, me->dp, &f, &n);
    for (int u = 0; !rc && u < micro_ops(p, k, c, n); u++) {
        int uf, un;
        micro_range(m, f, n, u, &uf, &un);
        int slot = un == 0 ? -1 : trains(p, k) ? slot_of(per_chunk, W, c, u) : 0;
        rc = push(s, PLAN_OP_FORWARD, k, c, uf, un, slot, err);
    }
    return rc ? rc : push(s, PLAN_OP_SEND_ACT, k, c, f, n, -1, err);
}

static int encoder_backward(const plan_t *p, int k, const plan_coord *me, int c, int W, int per_chunk,
                            plan_schedule *s, char *err)
{
    const plan_module *m = &p->mod[k];
    int f, n;
    plan_chunk_share(p, k, c, me->dp, &f, &n);
    int rc = push(s, PLAN_OP_RECV_GRAD, k, c, f, n, -1, err);
    for (int u = micro_ops(p, k, c, n) - 1; !rc && u >= 0; u--) {
        int uf, un;
        micro_range(m, f, n, u, &uf, &un);
        rc = push(s, PLAN_OP_BACKWARD, k, c, uf, un, un == 0 ? -1 : slot_of(per_chunk, W, c, u), err);
    }
    return rc;
}

/* The LLM's part of chunk c: receive every encoder's rows, run the micro-batches, send gradients. */
static int llm_chunk(const plan_t *p, const plan_coord *me, int c, plan_schedule *s, char *err)
{
    int L = p->model.llm, f, n, rc = UTIL_OK;
    const plan_module *m = &p->mod[L];
    plan_chunk_share(p, L, c, me->dp, &f, &n);
    for (int k = 0; !rc && k < p->n_modules; k++)
        if (is_encoder(p, k)) rc = push(s, PLAN_OP_RECV_ACT, k, c, f, n, -1, err);
    for (int u = 0; !rc && u < micro_ops(p, L, c, n); u++) {
        int uf, un;
        micro_range(m, f, n, u, &uf, &un);
        rc = push(s, PLAN_OP_FORWARD_BACKWARD, L, c, uf, un, -1, err);
    }
    for (int k = 0; !rc && k < p->n_modules; k++)
        if (is_encoder(p, k) && trains(p, k)) rc = push(s, PLAN_OP_SEND_GRAD, k, c, f, n, -1, err);
    return rc;
}

/* After the last micro-batch, as each module's data-parallel strategy says
 * (plan_dp_rules_of): the gradient sync, the global norm, the update, the
 * gather of the updated weights. */
static int step_tail(const plan_t *p, const bool *on, plan_schedule *s, char *err)
{
    int rc = UTIL_OK;
    plan_dp_rules dp[MODEL_MAX_MODULES];
    for (int k = 0; k < p->n_modules; k++) dp[k] = plan_dp_rules_of(&p->model.mod[k], &p->mod[k]);
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

/* The activation slots this rank's forwards fill, each allocated at its first
 * use (an empty micro-batch fills none). */
static int count_slots(plan_schedule *s, char *err)
{
    int most = -1;
    for (int i = 0; i < s->n; i++)
        if (s->op[i].kind == PLAN_OP_FORWARD && s->op[i].slot > most) most = s->op[i].slot;
    if (most < 0) return UTIL_OK;
    bool *used = util_calloc((size_t)most + 1, sizeof *used);
    if (!used) return util_fail(err, UTIL_ENOMEM, "plan: out of memory for the schedule");
    for (int i = 0; i < s->n; i++)
        if (s->op[i].kind == PLAN_OP_FORWARD && s->op[i].slot >= 0 && !used[s->op[i].slot]) {
            used[s->op[i].slot] = true;
            s->slots++;
        }
    util_free(used);
    return UTIL_OK;
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
    int enc = -1, L = p->model.llm, n = plan_chunks(p);
    for (int k = 0; k < p->n_modules; k++) {
        on[k] = plan_rank_coord(p, k, rank, &me[k]);
        if (is_encoder(p, k)) enc = k;
    }
    bool colocated = p->placement == PLAN_COLOCATED;
    int W = !colocated && n > 1 ? 2 : 1;
    if (enc >= 0 && !trains(p, enc)) W = 1;
    int per_chunk = enc >= 0 ? max_micro_per_share(p, enc) : 0;
    if (colocated) {
        for (int c = 0; !rc && c < n; c++) {
            if (enc >= 0) rc = encoder_forward(p, enc, &me[enc], c, W, per_chunk, s, err);
            if (!rc) rc = llm_chunk(p, &me[L], c, s, err);
            if (!rc && enc >= 0 && trains(p, enc)) rc = encoder_backward(p, enc, &me[enc], c, W, per_chunk, s, err);
        }
    } else if (on[L]) {
        for (int c = 0; !rc && c < n; c++) rc = llm_chunk(p, &me[L], c, s, err);
    } else if (enc >= 0 && on[enc]) {
        bool back = trains(p, enc);
        int ahead = back ? W : n;
        for (int c = 0; !rc && c < ahead && c < n; c++) rc = encoder_forward(p, enc, &me[enc], c, W, per_chunk, s, err);
        for (int c = 0; back && !rc && c < n; c++) {
            rc = encoder_backward(p, enc, &me[enc], c, W, per_chunk, s, err);
            if (!rc && c + W < n) rc = encoder_forward(p, enc, &me[enc], c + W, W, per_chunk, s, err);
        }
    }
    if (!rc) rc = step_tail(p, on, s, err);
    if (!rc) rc = count_slots(s, err);
    if (rc) plan_schedule_free(s);
    return rc;
}

void plan_schedule_free(plan_schedule *s)
{
    util_free(s->op);
    s->op = NULL;
    s->n = s->cap = 0;
}

int plan_handoff_tag(int k, int c, bool grad) { return ((c * MODEL_MAX_MODULES + k) << 1 | (grad ? 1 : 0)) & ((1 << 20) - 1); }

/* Activations go from enc_tp 0 to every LLM tp rank, gradients from llm_tp 0 to every encoder tp rank. */
static bool segment_moves(const plan_segment *s, int rank, bool grad, bool sending)
{
    if (grad) return sending ? s->llm_rank == rank && s->llm_tp == 0 : s->enc_rank == rank && s->llm_tp == 0;
    return sending ? s->enc_rank == rank && s->enc_tp == 0 : s->llm_rank == rank && s->enc_tp == 0;
}

static int segment_peer(const plan_segment *s, bool grad, bool sending)
{
    return sending != grad ? s->llm_rank : s->enc_rank;
}

/* Segments are sorted by (enc_rank, llm_rank), so one peer's segments are a contiguous run. */
bool plan_handoff_message(const plan_segment *segs, int n, int from, int rank, bool grad, bool sending,
                          int *first, int *end, int *peer, int *rows)
{
    int i = from;
    while (i < n && !segment_moves(&segs[i], rank, grad, sending)) i++;
    if (i >= n) return false;
    int pr = segment_peer(&segs[i], grad, sending), j = i, total = 0;
    for (; j < n && segment_moves(&segs[j], rank, grad, sending) && segment_peer(&segs[j], grad, sending) == pr; j++)
        total += segs[j].rows;
    *first = i;
    *end = j;
    *peer = pr;
    *rows = total;
    return true;
}

static int segment_order(const void *a, const void *b)
{
    const plan_segment *x = a, *y = b;
    if (x->enc_rank != y->enc_rank) return x->enc_rank < y->enc_rank ? -1 : 1;
    if (x->llm_rank != y->llm_rank) return x->llm_rank < y->llm_rank ? -1 : 1;
    return x->enc_off < y->enc_off ? -1 : x->enc_off > y->enc_off;
}

typedef struct { plan_segment *v; int n, cap; } seg_list;

static int seg_push(seg_list *l, plan_segment s, char *err)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        plan_segment *v = util_realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return util_fail(err, UTIL_ENOMEM, "plan: out of memory for the hand-off");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = s;
    return UTIL_OK;
}

/* Appends a segment, extending the previous one when it continues it on both sides. */
static int seg_append(seg_list *l, plan_segment sg, char *err)
{
    plan_segment *e = l->n ? &l->v[l->n - 1] : NULL;
    if (e && e->enc_rank == sg.enc_rank && e->enc_tp == sg.enc_tp && e->llm_rank == sg.llm_rank && e->llm_tp == sg.llm_tp
        && e->enc_off + e->rows == sg.enc_off && e->llm_off + e->rows == sg.llm_off) {
        e->rows += sg.rows;
        return UTIL_OK;
    }
    return seg_push(l, sg, err);
}

/* Rows [g0, g0 + rows) of the step (merged-row index, R per sample) held by
 * one encoder rank at offset enc_off: split them over the LLM dp shares and,
 * under the LLM's sequence parallelism, over the sp ranks: rank j of sp holds
 * positions [j S / sp, (j + 1) S / sp) of each sample's S-token sequence,
 * whose first R are the encoder's rows (R_j of them on rank j, kept sample
 * after sample in its input buffer). */
static int route_rows(const plan_t *p, int k, int c, const plan_coord *ec, int g0, int rows, int enc_off,
                      seg_list *l, char *err)
{
    int L = p->model.llm, R = plan_rows_per_sample(p, k);
    const plan_module *lm = &p->mod[L];
    plan_seq q;
    plan_module_seq(&p->model, L, &p->work, &q);
    long S = (long)q.seq;
    int rc = UTIL_OK;
    for (int t = 0; !rc && t < lm->tp; t++)
    for (int d = 0; !rc && d < lm->dp; d++) {
        int f, n;
        plan_chunk_share(p, L, c, d, &f, &n);
        for (int i = f; !rc && i < f + n; i++) {
            long a = (long)i * R > g0 ? (long)i * R : g0, b = (long)(i + 1) * R < (long)g0 + rows ? (long)(i + 1) * R : (long)g0 + rows;
            if (a >= b) continue;
            a -= (long)i * R;
            b -= (long)i * R;
            for (int j = 0; !rc && j < lm->sp; j++) {
                long s0 = j * S / lm->sp, s1 = (j + 1) * S / lm->sp;
                long lo = a > s0 ? a : s0, hi = b < s1 ? b : s1;
                if (lo >= hi) continue;
                long r0 = s0 < R ? s0 : R, r1 = s1 < R ? s1 : R;   /* the encoder rows rank j holds */
                {
                    plan_coord lc = { .dp = d, .tp = t, .sp = j, .pp = 0 };
                    plan_segment sg = { .enc_rank = plan_coord_rank(p, k, ec), .enc_tp = ec->tp,
                                        .llm_rank = plan_coord_rank(p, L, &lc), .llm_tp = t, .rows = (int)(hi - lo),
                                        .enc_off = enc_off + (int)((long)i * R + lo - g0),
                                        .llm_off = (int)((long)(i - f) * (r1 - r0) + (lo - r0)) };
                    rc = seg_append(l, sg, err);
                }
            }
        }
    }
    return rc;
}

int plan_handoff(const plan_t *p, int k, int c, plan_segment **segs, int *n_out, char *err)
{
    *segs = NULL;
    *n_out = 0;
    if (k < 0 || k >= p->n_modules || !is_encoder(p, k))
        return util_fail(err, UTIL_EINVAL, "plan: module %d is not an encoder that feeds the LLM", k);
    const plan_module *e = &p->mod[k];
    int R = plan_rows_per_sample(p, k);
    seg_list l = { 0 };
    int rc = UTIL_OK;
    for (int i = 0; !rc && i < e->dp; i++) {
        int f, n;
        plan_chunk_share(p, k, c, i, &f, &n);
        for (int j = 0; !rc && j < e->sp; j++)
            for (int t = 0; !rc && t < e->tp; t++) {
                plan_coord ec = { .dp = i, .tp = t, .sp = j, .pp = 0 };
                int off = 0;
                for (int u = 0; !rc && u < micro_count(e, n); u++) {
                    int uf, un;
                    micro_range(e, f, n, u, &uf, &un);
                    int rows = un * R / e->sp;
                    rc = route_rows(p, k, c, &ec, uf * R + j * rows, rows, off, &l, err);
                    off += rows;
                }
            }
    }
    if (rc) { util_free(l.v); return rc; }
    qsort(l.v, (size_t)l.n, sizeof *l.v, segment_order);
    *segs = l.v;
    *n_out = l.n;
    return UTIL_OK;
}
