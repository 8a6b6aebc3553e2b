/* The encoder -> LLM hand-off: which rows of an encoder's last pipeline
 * stage go to which rank of the LLM's first stage (see plan_handoff in
 * planner.h). The executor (executor/run_handoff.c) moves them, the
 * simulator (planner/sim_messages.c) prices the same messages. */
#include "planner/planner_int.h"

#include <stdlib.h>

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
 * under the LLM's context parallelism, over its sp ranks: rank j holds the
 * positions plan_cp_span_of gives of each sample's S-token sequence, whose
 * first R are the encoder's rows (R_j of them on rank j, in the order of its
 * local rows, kept sample after sample in its input buffer). */
static int route_rows(const plan_t *p, int k, int c, const plan_coord *ec, int g0, int rows, int enc_off,
                      seg_list *l, char *err)
{
    int L = p->model.llm, R = plan_rows_per_sample(p, k);
    const plan_module *lm = &p->mod[L];
    plan_seq q;
    plan_module_seq(&p->model, L, &p->work, &q);
    plan_cp cp = plan_cp_of(&p->model.mod[L], lm);
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
                plan_cp_span span = plan_cp_span_of(cp, (int)q.seq, lm->sp, j);
                int Rj = plan_cp_held(&span, 0, R);   /* the encoder rows rank j holds */
                for (int r = 0; !rc && r < span.n; r++) {
                    long lo = a > span.lo[r] ? a : span.lo[r], hi = b < span.hi[r] ? b : span.hi[r];
                    if (lo >= hi) continue;
                    plan_coord lc = { .dp = d, .tp = t, .sp = j, .pp = 0 };   /* the LLM's first stage */
                    plan_segment sg = { .enc_rank = plan_coord_rank(p, k, ec), .enc_tp = ec->tp,
                                        .llm_rank = plan_coord_rank(p, L, &lc), .llm_tp = t, .rows = (int)(hi - lo),
                                        .enc_off = enc_off + (int)((long)i * R + lo - g0),
                                        .llm_off = (int)((long)(i - f) * Rj + plan_cp_local(&span, (int)lo)) };
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
    if (k < 0 || k >= p->n_modules || !plan_encoder_feeds(p, k))
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
                plan_coord ec = { .dp = i, .tp = t, .sp = j, .pp = e->pp - 1 };   /* the encoder's last stage */
                int off = 0;
                for (int u = 0; !rc && u < plan_micro_count(e, n); u++) {
                    int uf, un;
                    plan_micro_range(e, f, n, u, &uf, &un);
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
