/* The encoder -> LLM hand-off: which rows of an encoder's last pipeline
 * stage go to which rank of the LLM's first stage (see plan_handoff in
 * planner.h). The executor (executor/run_handoff.c) moves them, the
 * simulator (planner/sim_messages.c) prices the same messages. */
#include "planner/planner_int.h"

#include <math.h>
#include <stdlib.h>

int plan_handoff_tag(int k, int c, bool grad) { return ((c * MODEL_MAX_MODULES + k) << 1 | (grad ? 1 : 0)) & ((1 << 20) - 1); }

/* Which rank of a tp group (its tp rank 0 at world rank `first`, `tp`
 * ranks, tp innermost: plan_coord_rank) sends a peer at world rank `peer`
 * the rows every rank of the group holds: the peer's own GPU where it is in
 * the group (a copy, no transfer), else tp rank peer mod tp, so that the
 * group's ranks share the sending (and the holding of what they sent)
 * instead of its tp rank 0 sending every copy. */
static int source_tp(int first, int tp, int peer)
{
    return peer >= first && peer < first + tp ? peer - first : peer % tp;
}

int plan_handoff_copies(const plan_t *p, int k, bool grad)
{
    int enc = p->mod[k].tp, llm = p->mod[p->model.llm].tp, senders = grad ? llm : enc, receivers = grad ? enc : llm;
    return (receivers + senders - 1) / senders;   /* receivers' consecutive ranks mod senders */
}

/* Segments are sorted by (enc_rank, llm_rank): one pair's segments are a
 * contiguous run, and its act / grad flags are the pair's (source_tp of the
 * encoder rank's tp and the LLM rank; of the LLM rank's tp and the encoder
 * rank), so a message is one run whose flag says it goes that way. */
bool plan_handoff_next(const plan_segment *segs, int n, int from, bool grad, plan_handoff_msg *m)
{
    for (int i = from; i < n;) {
        int j = i, rows = 0;
        for (; j < n && segs[j].enc_rank == segs[i].enc_rank && segs[j].llm_rank == segs[i].llm_rank; j++) rows += segs[j].rows;
        if (grad ? segs[i].grad : segs[i].act) {
            *m = (plan_handoff_msg){ .src = grad ? segs[i].llm_rank : segs[i].enc_rank,
                                     .dst = grad ? segs[i].enc_rank : segs[i].llm_rank, .rows = rows, .first = i, .end = j };
            return true;
        }
        i = j;
    }
    return false;
}

bool plan_handoff_message(const plan_segment *segs, int n, int from, int rank, bool grad, bool sending,
                          int *first, int *end, int *peer, int *rows)
{
    plan_handoff_msg m;
    for (; plan_handoff_next(segs, n, from, grad, &m); from = m.end) {
        if ((sending ? m.src : m.dst) != rank) continue;
        *first = m.first;
        *end = m.end;
        *peer = sending ? m.dst : m.src;
        *rows = m.rows;
        return true;
    }
    return false;
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
        && e->act == sg.act && e->grad == sg.grad && e->block == sg.block && e->enc_off + e->rows == sg.enc_off && e->llm_off + e->rows == sg.llm_off) {
        e->rows += sg.rows;
        return UTIL_OK;
    }
    return seg_push(l, sg, err);
}

/* The image geometry the hand-off reorders by: an image's merged tokens are
 * stored in the encoder's (window) order and read by the LLM in raster order
 * (models/geometry.c). Square images of image_tokens patches, as the data
 * shards hold them (executor/data.c). raster == NULL: rows keep their order
 * (not a vision encoder, no windows, or a grid the executor cannot take). */
typedef struct {
    int *raster;     /* [per_image]: raster index of stored row j */
    int per_image;   /* merged rows per image */
    int band;        /* merged rows per window row */
} row_order;

static int image_grid(const plan_t *p)
{
    int g = (int)lround(sqrt((double)p->work.image_tokens));
    return g * g == p->work.image_tokens ? g : 0;
}

static int row_order_of(const plan_t *p, int k, row_order *o, char *err)
{
    *o = (row_order){ 0 };
    const model_module *mm = &p->model.mod[k];
    int G = image_grid(p), m = mm->merge > 0 ? mm->merge : 1;
    if (mm->kind != MODEL_VISION || G <= 0 || G % m || model_merged_order_is_raster(mm, G)) return UTIL_OK;
    int per = (G / m) * (G / m);
    char ignored[UTIL_ERR_LEN];
    if (!(o->raster = util_malloc((size_t)per * sizeof *o->raster))) return util_fail(err, UTIL_ENOMEM, "plan: out of memory for the hand-off");
    if (model_merged_raster(mm, G, G, o->raster, ignored)) {   /* not a whole number of windows: the executor refuses such data */
        util_free(o->raster);
        o->raster = NULL;
        return UTIL_OK;
    }
    o->per_image = per;
    o->band = model_window_band_rows(mm, G);
    return UTIL_OK;
}

int plan_handoff_block_order(const plan_t *p, int k, int block, int *raster, char *err)
{
    const model_module *mm = &p->model.mod[k];
    int G = image_grid(p), m = mm->merge > 0 ? mm->merge : 1;
    if (mm->kind != MODEL_VISION || G <= 0 || G % m || block <= 0 || block % (G / m))
        return util_fail(err, UTIL_EINVAL, "plan: a hand-off block of %d rows is not whole rows of a %s image", block, mm->name);
    return model_merged_raster(mm, block / (G / m) * m, G, raster, err);
}

/* Where one sample's rows go: sample i (the f-th.. of LLM dp rank d's share)
 * of the step, positions [a, b) of its sequence, the first of them encoder
 * row ra of the sample (rows in order from there, or one block of stored
 * rows whose positions are [a, b) in raster order: block = b - a). The
 * encoder rank holds the step's rows from g0 at its offset enc_off. Under
 * the LLM's context parallelism sp rank j holds the positions
 * plan_cp_span_of gives; rank j's input buffer keeps, sample after sample,
 * the E_j encoder positions it holds in the order of its local rows. */
typedef struct {
    const plan_t *p;
    int k, g0, enc_off, R, E, S, t, d, f;
    plan_cp cp;
    const plan_coord *ec;
    int enc_rank, enc_first;  /* ec's world rank, and its tp group's tp rank 0's */
    seg_list *l;
} route;

static int route_positions(const route *rt, int i, long a, long b, long ra, int block, char *err)
{
    const plan_t *p = rt->p;
    const plan_module *lm = &p->mod[p->model.llm];
    int rc = UTIL_OK;
    for (int j = 0; !rc && j < lm->sp; j++) {
        plan_cp_span span = plan_cp_span_of(rt->cp, rt->S, lm->sp, j);
        int Ej = plan_cp_held(&span, 0, rt->E);   /* the encoder rows rank j holds */
        plan_coord lc0 = { .dp = rt->d, .tp = 0, .sp = j, .pp = 0 }, lc = lc0;   /* the LLM's first stage */
        lc.tp = rt->t;
        int llm_first = plan_coord_rank(p, p->model.llm, &lc0), llm_rank = plan_coord_rank(p, p->model.llm, &lc);
        /* the encoder's tp ranks hold the same rows, the LLM's the same gradient of them */
        bool act = source_tp(rt->enc_first, p->mod[rt->k].tp, llm_rank) == rt->ec->tp;
        bool grad = source_tp(llm_first, lm->tp, rt->enc_rank) == rt->t;
        for (int r = 0; !rc && r < span.n; r++) {
            long lo = a > span.lo[r] ? a : span.lo[r], hi = b < span.hi[r] ? b : span.hi[r];
            if (lo >= hi) continue;
            plan_segment sg = { .enc_rank = rt->enc_rank, .enc_tp = rt->ec->tp, .llm_rank = llm_rank, .llm_tp = rt->t,
                                .act = act, .grad = grad, .rows = (int)(hi - lo),
                                .enc_off = rt->enc_off + (int)((long)i * rt->R + ra + (lo - a) - rt->g0),
                                .llm_off = (int)((long)(i - rt->f) * Ej + plan_cp_local(&span, (int)lo)), .block = block };
            rc = seg_append(rt->l, sg, err);
        }
    }
    return rc;
}

/* Whether positions [a, b) lie in one range of one LLM sp rank. */
static bool one_piece(const route *rt, long a, long b)
{
    const plan_module *lm = &rt->p->mod[rt->p->model.llm];
    for (int j = 0; j < lm->sp; j++) {
        plan_cp_span span = plan_cp_span_of(rt->cp, rt->S, lm->sp, j);
        for (int r = 0; r < span.n; r++)
            if (span.lo[r] <= a && b <= span.hi[r]) return true;
    }
    return false;
}

/* Stored rows [x0, x1) of image im of sample i, its encoder's rows starting
 * at position off, as runs that stay consecutive in raster order. */
static int route_runs(const route *rt, const row_order *o, int i, int off, int im, int x0, int x1, char *err)
{
    long base = (long)im * o->per_image;
    int rc = UTIL_OK;
    for (int r = x0; !rc && r < x1;) {
        int e = r + 1;
        while (e < x1 && o->raster[e] == o->raster[e - 1] + 1) e++;
        rc = route_positions(rt, i, off + base + o->raster[r], off + base + o->raster[r] + (e - r), base + r, 0, err);
        r = e;
    }
    return rc;
}

/* Stored rows [x0, x1) of image im: each whole window row (a band, stored in
 * window order, a contiguous raster range) whose positions one LLM rank
 * holds goes as a block (consecutive ones merge into one segment); the rest
 * as raster runs. */
static int route_image(const route *rt, const row_order *o, int i, int off, int im, int x0, int x1, char *err)
{
    long base = (long)im * o->per_image;
    int B = o->band, rc = UTIL_OK;
    for (int x = x0; !rc && x < x1;) {
        int end = (x / B + 1) * B < x1 ? (x / B + 1) * B : x1;
        if (x % B == 0 && end - x == B && one_piece(rt, off + base + x, off + base + end))
            rc = route_positions(rt, i, off + base + x, off + base + end, base + x, B, err);
        else
            rc = route_runs(rt, o, i, off, im, x, end, err);
        x = end;
    }
    return rc;
}

/* Rows [g0, g0 + rows) of the step (merged-row index, R per sample) held by
 * one encoder rank at offset enc_off: split them over the LLM dp shares and
 * sp ranks (route_positions), image by image where the LLM reads them in
 * another order (route_image). */
static int route_rows(const plan_t *p, int k, int c, const plan_coord *ec, int g0, int rows, int enc_off,
                      const row_order *o, seg_list *l, char *err)
{
    int L = p->model.llm, off = plan_encoder_offset(p, k);
    const plan_module *lm = &p->mod[L];
    plan_seq q;
    plan_module_seq(&p->model, L, &p->work, &q);
    route rt = { .p = p, .k = k, .g0 = g0, .enc_off = enc_off, .R = plan_rows_per_sample(p, k),
                 .E = plan_encoder_offset(p, p->n_modules), .S = (int)q.seq, .cp = plan_cp_of(&p->model.mod[L], lm),
                 .ec = ec, .enc_rank = plan_coord_rank(p, k, ec), .l = l };
    plan_coord ec0 = *ec;
    ec0.tp = 0;
    rt.enc_first = plan_coord_rank(p, k, &ec0);
    int R = rt.R, rc = UTIL_OK;
    for (int t = 0; !rc && t < lm->tp; t++)
    for (int d = 0; !rc && d < lm->dp; d++) {
        int f, n;
        plan_chunk_share(p, L, c, d, &f, &n);
        rt.t = t;
        rt.d = d;
        rt.f = f;
        for (int i = f; !rc && i < f + n; i++) {
            long a = (long)i * R > g0 ? (long)i * R : g0, b = (long)(i + 1) * R < (long)g0 + rows ? (long)(i + 1) * R : (long)g0 + rows;
            if (a >= b) continue;
            a -= (long)i * R;   /* the sample's rows */
            b -= (long)i * R;
            if (!o->raster) {
                rc = route_positions(&rt, i, off + a, off + b, a, 0, err);
                continue;
            }
            for (long im = a / o->per_image; !rc && im * o->per_image < b; im++) {
                long lo = im * o->per_image > a ? im * o->per_image : a, hi = (im + 1) * o->per_image < b ? (im + 1) * o->per_image : b;
                rc = route_image(&rt, o, i, off, (int)im, (int)(lo - im * o->per_image), (int)(hi - im * o->per_image), err);
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
    row_order o;
    int rc = row_order_of(p, k, &o, err);
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
                    rc = route_rows(p, k, c, &ec, uf * R + j * rows, rows, off, &o, &l, err);
                    off += rows;
                }
            }
    }
    util_free(o.raster);
    if (rc) { util_free(l.v); return rc; }
    qsort(l.v, (size_t)l.n, sizeof *l.v, segment_order);
    *segs = l.v;
    *n_out = l.n;
    return UTIL_OK;
}
