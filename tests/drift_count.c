/* The drift guard's counting side (tests/test_drift.c): the CPU backend
 * wrapped so that every kernel call is counted as what the cost model prices
 * for it, an in-process communicator whose ranks are threads and which
 * counts every collective, and the run of one micro-batch through both.
 *
 * How each backend call counts (the comments of planner/cost.c and
 * costdb/costdb.h): linear_forward is the GEMM (rows, out, in) plus, with a
 * bias, a BIAS pass over rows x out; linear_backward is dX = (rows, in,
 * out), dW = (in, out, rows) and, with db, a BIAS_GRAD pass over rows x out;
 * the embedding rows and gathered rows are COPY, the embedding gradient and
 * scattered rows ADD; the vocab-parallel cross-entropy's row-max, exp-sum
 * and gradient passes are one CE over the logits ("row max, exp-sum and
 * gradient passes together"), counted at its row-max pass; attention is rows = queries x heads and
 * scores = the keys each query sees x heads; the audio stem's im2col,
 * col2im and the row pooling are COPY of their nominal bytes as
 * planner/cost.c prices them (price_audio_stem, price_audio_head), LayerNorm
 * its own kind. The passes are told apart by
 * the model's unit hooks: a module enters its units with EX_USE_BACKWARD
 * from the first kernel of its backward on (recomputation included). */
#include "tests/drift.h"
#include "executor/backend.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Each rank is a thread with its own tally; the pass follows the unit hooks. */
static _Thread_local drift_tally *tl_tally;
static _Thread_local int tl_pass;

/* ------------------------------------------------------- counting backend */

static const ex_backend *cpu(void) { return ex_backend_cpu(); }

static void count_ew(cost_ew k, double n)
{
    if (!tl_tally) return;
    tl_tally->ew_calls[tl_pass][k] += 1;
    tl_tally->ew_elems[tl_pass][k] += n;
}

static void count_gemm(double m, double n, double k)
{
    drift_tally *t = tl_tally;
    if (!t) return;
    t->gemm_calls[tl_pass] += 1;
    t->gemm_mnk[tl_pass] += m * n * k;
    for (int i = 0; i < t->n_shapes; i++)
        if (t->shape[i].m == m && t->shape[i].n == n && t->shape[i].k == k) { t->shape[i].count[tl_pass] += 1; return; }
    if (t->n_shapes == DRIFT_MAX_SHAPES) { t->overflow = true; return; }
    t->shape[t->n_shapes] = (drift_shape){ .m = m, .n = n, .k = k };
    t->shape[t->n_shapes++].count[tl_pass] = 1;
}

/* kernel 0 forward, 1 backward: rows = queries x heads, scores = keys each query sees x heads. */
static void count_attention(int kernel, const int *cu, int nseq, int H, bool causal)
{
    if (!tl_tally) return;
    double rows = 0, scores = 0;
    for (int s = 0; s < nseq; s++) {
        double len = cu[s + 1] - cu[s];
        rows += len * H;
        scores += (causal ? len * (len + 1) / 2 : len * len) * H;
    }
    tl_tally->att_calls[tl_pass] += 1;
    tl_tally->att_rows[tl_pass][kernel] += rows;
    tl_tally->att_scores[tl_pass][kernel] += scores;
}

static void k_zero(float *x, size_t n) { count_ew(COST_EW_ZERO, (double)n); cpu()->zero(x, n); }
static void k_copy(float *d, const float *s, size_t n) { count_ew(COST_EW_COPY, (double)n); cpu()->copy(d, s, n); }
static void k_add(float *y, const float *x, size_t n) { count_ew(COST_EW_ADD, (double)n); cpu()->add_inplace(y, x, n); }
static void k_bias(float *y, const float *b, int n, int d) { count_ew(COST_EW_BIAS, (double)n * d); cpu()->add_bias(y, b, n, d); }
static void k_scale(float *y, float s, size_t n) { if (tl_tally) tl_tally->unpriced += 1; cpu()->scale_inplace(y, s, n); }
static double k_sumsq(const float *x, size_t n) { count_ew(COST_EW_SUMSQ, (double)n); return cpu()->sumsq(x, n); }

static void k_linear_fwd(float *out, const float *inp, const float *w, const float *b, int n, int in, int o)
{
    count_gemm(n, o, in);
    if (b) count_ew(COST_EW_BIAS, (double)n * o);
    cpu()->linear_forward(out, inp, w, b, n, in, o);
}

static void k_linear_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                         int n, int in, int o)
{
    if (dinp) count_gemm(n, in, o);
    if (dw) count_gemm(in, o, n);
    if (db) count_ew(COST_EW_BIAS_GRAD, (double)n * o);
    cpu()->linear_backward(dinp, dw, db, dout, inp, w, n, in, o);
}

static void k_rms_fwd(float *out, float *rstd, const float *inp, const float *w, int n, int d, float eps)
{
    count_ew(COST_EW_RMSNORM, (double)n * d);
    cpu()->rmsnorm_forward(out, rstd, inp, w, n, d, eps);
}

static void k_rms_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                      int n, int d)
{
    count_ew(COST_EW_RMSNORM_BWD, (double)n * d);
    cpu()->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, n, d);
}

static void k_rope_fwd(float *x, const float *c, const float *s, int n, int nh, int hd)
{
    count_ew(COST_EW_ROPE, (double)n * nh * hd);
    cpu()->rope_forward(x, c, s, n, nh, hd);
}

static void k_rope_bwd(float *dx, const float *c, const float *s, int n, int nh, int hd)
{
    count_ew(COST_EW_ROPE_BWD, (double)n * nh * hd);
    cpu()->rope_backward(dx, c, s, n, nh, hd);
}

static void k_att_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const int *cu, int nseq,
                      int H, int Hkv, int hd, bool causal)
{
    count_attention(0, cu, nseq, H, causal);
    cpu()->attention_forward(out, lse, q, k, v, cu, nseq, H, Hkv, hd, causal);
}

static void k_att_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                      const float *v, const float *out, const float *lse, const int *cu, int nseq, int H, int Hkv,
                      int hd, bool causal)
{
    count_attention(1, cu, nseq, H, causal);
    cpu()->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, cu, nseq, H, Hkv, hd, causal);
}

/* A block of keys: nseq x nq queries, each seeing nk keys. */
static void count_attention_part(int kernel, int nseq, int nq, int nk, int H)
{
    if (!tl_tally) return;
    tl_tally->att_calls[tl_pass] += 1;
    tl_tally->att_rows[tl_pass][kernel] += (double)nseq * nq * H;
    tl_tally->att_scores[tl_pass][kernel] += (double)nseq * nq * nk * H;
}

static void k_att_part_fwd(float *out, float *lse, const float *q, const float *k, const float *v, int nseq, int stride,
                           int q0, int nq, int k0, int nk, int H, int Hkv, int hd)
{
    count_attention_part(0, nseq, nq, nk, H);
    cpu()->attention_part_forward(out, lse, q, k, v, nseq, stride, q0, nq, k0, nk, H, Hkv, hd);
}

static void k_att_part_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                           const float *v, const float *out, const float *lse, int nseq, int stride, int q0, int nq,
                           int k0, int nk, int H, int Hkv, int hd)
{
    count_attention_part(1, nseq, nq, nk, H);
    cpu()->attention_part_backward(dq, dk, dv, dout, q, k, v, out, lse, nseq, stride, q0, nq, k0, nk, H, Hkv, hd);
}

static void k_att_merge(float *out, float *lse, const float *part, const float *plse, int nseq, int stride, int q0,
                        int nq, int H, int hd)
{
    count_ew(COST_EW_ATTN_MERGE, (double)nseq * nq * H * hd);
    cpu()->attention_merge(out, lse, part, plse, nseq, stride, q0, nq, H, hd);
}

/* The Ulysses packing: a copy of every element. */
static void k_transpose(float *dst, const float *src, int rows, int cols, size_t blk)
{
    count_ew(COST_EW_COPY, (double)rows * cols * blk);
    cpu()->transpose_blocks(dst, src, rows, cols, blk);
}

static void k_swiglu_fwd(float *h, const float *g, const float *u, size_t n)
{
    count_ew(COST_EW_SWIGLU, (double)n);
    cpu()->swiglu_forward(h, g, u, n);
}

static void k_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n)
{
    count_ew(COST_EW_SWIGLU_BWD, (double)n);
    cpu()->swiglu_backward(dg, du, dh, g, u, n);
}

static void k_gelu_fwd(float *out, const float *inp, size_t n) { count_ew(COST_EW_GELU, (double)n); cpu()->gelu_forward(out, inp, n); }

static void k_gelu_bwd(float *dinp, const float *dout, const float *inp, size_t n)
{
    count_ew(COST_EW_GELU_BWD, (double)n);
    cpu()->gelu_backward(dinp, dout, inp, n);
}

static void k_emb_fwd(float *out, const float *wte, const int32_t *tok, int n, int d, int v0, int vn)
{
    count_ew(COST_EW_COPY, (double)n * d);
    cpu()->embedding_forward(out, wte, tok, n, d, v0, vn);
}

static void k_emb_bwd(float *dwte, const float *dout, const int32_t *tok, int n, int d, int v0, int vn)
{
    count_ew(COST_EW_ADD, (double)n * d);
    cpu()->embedding_backward(dwte, dout, tok, n, d, v0, vn);
}

static void k_gather_rows(float *dst, const float *src, const int *rows, int n, int d)
{
    count_ew(COST_EW_COPY, (double)n * d);
    cpu()->gather_rows(dst, src, rows, n, d);
}

static void k_scatter_add_rows(float *dst, const float *src, const int *rows, int n, int d)
{
    count_ew(COST_EW_ADD, (double)n * d);
    cpu()->scatter_add_rows(dst, src, rows, n, d);
}

/* The fused cross-entropy: all three passes in one call. */
static double k_ce(float *dl, const float *logits, const int32_t *t, int n, int vocab, float dscale)
{
    count_ew(COST_EW_CE, (double)n * vocab);
    if (tl_tally) tl_tally->ce_passes[tl_pass] += 2.0 * n * vocab;
    return cpu()->cross_entropy(dl, logits, t, n, vocab, dscale);
}

/* The row-max pass stands for the CE call; the other two passes go with it. */
static void k_ce_max(float *mx, const float *logits, int n, int vocab)
{
    count_ew(COST_EW_CE, (double)n * vocab);
    cpu()->ce_row_max(mx, logits, n, vocab);
}

static void k_ce_exp(float *p, float *st, const float *logits, const float *mx, const int32_t *t, int n, int vocab, int v0)
{
    if (tl_tally) tl_tally->ce_passes[tl_pass] += (double)n * vocab;
    cpu()->ce_exp_sum(p, st, logits, mx, t, n, vocab, v0);
}

static void k_ce_grad(float *dl, const float *st, const int32_t *t, int n, int vocab, int v0, float dscale)
{
    if (tl_tally) tl_tally->ce_passes[tl_pass] += (double)n * vocab;
    cpu()->ce_grad(dl, st, t, n, vocab, v0, dscale);
}

static void k_ln_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int n, int d,
                     float eps)
{
    count_ew(COST_EW_LAYERNORM, (double)n * d);
    cpu()->layernorm_forward(out, mean, rstd, inp, w, b, n, d, eps);
}

static void k_ln_bwd(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                     const float *mean, const float *rstd, int n, int d)
{
    count_ew(COST_EW_LAYERNORM_BWD, (double)n * d);
    cpu()->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, n, d);
}

/* im2col reads and writes n x C k; col2im reads n x C k and updates nx x C */
static void k_im2col(float *col, const float *x, int n, int C, int k, int stride, int pad, int t0, int x0, int nx)
{
    count_ew(COST_EW_COPY, (double)n * C * k);
    cpu()->im2col1d(col, x, n, C, k, stride, pad, t0, x0, nx);
}

static void k_col2im(float *dx, const float *dcol, int n, int C, int k, int stride, int pad, int t0, int x0, int nx)
{
    count_ew(COST_EW_COPY, (double)n * C * k / 2 + (double)nx * C);
    cpu()->col2im1d(dx, dcol, n, C, k, stride, pad, t0, x0, nx);
}

/* pooling reads p rows per output row and writes one; backward reads one and updates p */
static void k_pool_fwd(float *out, const float *inp, int m, int p, int d)
{
    count_ew(COST_EW_COPY, (double)m * d * (p + 1) / 2);
    cpu()->avgpool_rows_forward(out, inp, m, p, d);
}

static void k_pool_bwd(float *dinp, const float *dout, int m, int p, int d)
{
    count_ew(COST_EW_COPY, (double)m * d * (2 * p + 1) / 2);
    cpu()->avgpool_rows_backward(dinp, dout, m, p, d);
}

static void k_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2, float eps,
                    float wd, float c1, float c2)
{
    if (tl_tally) tl_tally->unpriced += 1;
    cpu()->adamw(p, g, m, v, n, lr, b1, b2, eps, wd, c1, c2);
}

/* Memory is the CPU backend's, not counted (the cost model prices no allocation or copy). */
static void *k_alloc(size_t bytes, util_mem_cat cat) { return cpu()->alloc(bytes, cat); }
static void k_release(void *p) { cpu()->release(p); }
static void k_copy_bytes(void *dst, const void *src, size_t bytes) { cpu()->d2d(dst, src, bytes); }
static void k_fill(void *p, int byte, size_t bytes) { cpu()->fill(p, byte, bytes); }
static int k_sync(char *err) { return cpu()->sync(err); }

static const ex_backend counting_backend = {
    .name = "counting", .host_memory = true, .alloc = k_alloc, .release = k_release, .h2d = k_copy_bytes,
    .d2h = k_copy_bytes, .d2d = k_copy_bytes, .fill = k_fill, .sync = k_sync, .zero = k_zero, .copy = k_copy, .add_inplace = k_add, .add_bias = k_bias,
    .scale_inplace = k_scale, .sumsq = k_sumsq, .linear_forward = k_linear_fwd, .linear_backward = k_linear_bwd,
    .rmsnorm_forward = k_rms_fwd, .rmsnorm_backward = k_rms_bwd, .rope_forward = k_rope_fwd,
    .rope_backward = k_rope_bwd, .attention_forward = k_att_fwd, .attention_backward = k_att_bwd,
    .attention_part_forward = k_att_part_fwd, .attention_part_backward = k_att_part_bwd,
    .attention_merge = k_att_merge, .transpose_blocks = k_transpose,
    .swiglu_forward = k_swiglu_fwd, .swiglu_backward = k_swiglu_bwd, .gelu_forward = k_gelu_fwd,
    .gelu_backward = k_gelu_bwd, .embedding_forward = k_emb_fwd, .embedding_backward = k_emb_bwd,
    .gather_rows = k_gather_rows, .scatter_add_rows = k_scatter_add_rows,
    .cross_entropy = k_ce, .ce_row_max = k_ce_max, .ce_exp_sum = k_ce_exp, .ce_grad = k_ce_grad, .adamw = k_adamw,
    .layernorm_forward = k_ln_fwd, .layernorm_backward = k_ln_bwd, .im2col1d = k_im2col, .col2im1d = k_col2im,
    .avgpool_rows_forward = k_pool_fwd, .avgpool_rows_backward = k_pool_bwd,
};

static int hook_begin(void *ctx, int module, int unit, ex_unit_use use)
{
    (void)ctx; (void)module; (void)unit;
    tl_pass = use == EX_USE_BACKWARD ? DRIFT_BWD : DRIFT_FWD;
    return 0;
}

static int hook_end(void *ctx, int module, int unit, ex_unit_use use, bool last)
{
    (void)ctx; (void)module; (void)unit; (void)use; (void)last;
    return 0;
}

/* ------------------------------------- counting in-process communicator
 * The ranks of a group are threads; each collective posts its buffer, waits
 * for the others, reads theirs, and waits again before anyone moves on.
 * Elements are counted as the cost model sizes a collective: the full
 * buffer (all-gather: the gathered one, reduce-scatter: the input,
 * all-to-all: every chunk). */

/* A message in flight (ring attention's p2p): buffered at the send. */
typedef struct msg { struct msg *next; int from, to, tag; size_t n; float *data; } msg;

typedef struct {
    pthread_barrier_t bar;
    int size;
    const float *buf[DRIFT_MAX_RANKS];
    pthread_mutex_t mu;        /* the mailbox */
    pthread_cond_t arrived;
    msg *head;
} group;
typedef struct { group *g; int rank; } member;

/* Counts the collective, posts this rank's buffer and returns everyone's
 * once all have posted; exchange_done waits until all have read them. */
static const float *const *exchange(member *c, int op, double elems, const float *mine)
{
    if (tl_tally) {
        tl_tally->coll_calls[tl_pass][op] += 1;
        tl_tally->coll_elems[tl_pass][op] += elems;
        tl_tally->syncs[tl_pass] += 1;
    }
    c->g->buf[c->rank] = mine;
    pthread_barrier_wait(&c->g->bar);
    return c->g->buf;
}

static void exchange_done(member *c) { pthread_barrier_wait(&c->g->bar); }

static int reduce(void *ctx, float *x, size_t n, bool max)
{
    member *c = ctx;
    float *acc = malloc((n ? n : 1) * sizeof *acc);
    const float *const *all = exchange(c, DRIFT_AR, (double)n, x);
    for (size_t i = 0; acc && i < n; i++) {
        float a = all[0][i];
        for (int r = 1; r < c->g->size; r++) a = max ? fmaxf(a, all[r][i]) : a + all[r][i];
        acc[i] = a;
    }
    exchange_done(c);
    if (!acc) return UTIL_ENOMEM;
    memcpy(x, acc, n * sizeof *acc);
    free(acc);
    return 0;
}

static int g_allreduce_sum(void *ctx, float *x, size_t n) { return reduce(ctx, x, n, false); }
static int g_allreduce_max(void *ctx, float *x, size_t n) { return reduce(ctx, x, n, true); }

static int g_allgather(void *ctx, const float *send, float *all, size_t n)
{
    member *c = ctx;
    const float *const *in = exchange(c, DRIFT_AG, (double)n * c->g->size, send);
    for (int r = 0; r < c->g->size; r++) memcpy(all + r * n, in[r], n * sizeof(float));
    exchange_done(c);
    return 0;
}

static int g_reduce_scatter(void *ctx, const float *send, float *recv, size_t n)
{
    member *c = ctx;
    const float *const *in = exchange(c, DRIFT_RS, (double)n * c->g->size, send);
    for (size_t i = 0; i < n; i++) {
        float a = 0;
        for (int r = 0; r < c->g->size; r++) a += in[r][c->rank * n + i];
        recv[i] = a;
    }
    exchange_done(c);
    return 0;
}

static int g_alltoall(void *ctx, const float *send, float *recv, size_t chunk)
{
    member *c = ctx;
    const float *const *in = exchange(c, DRIFT_A2A, (double)chunk * c->g->size, send);
    for (int r = 0; r < c->g->size; r++) memcpy(recv + r * chunk, in[r] + c->rank * chunk, chunk * sizeof(float));
    exchange_done(c);
    return 0;
}

/* Point-to-point: sends are copied into the mailbox at once (and counted:
 * a message each, its floats); a wait (one blocking exchange) takes each
 * receive's message from its sender, in the order they were sent. */
typedef struct { int n; float *buf[8]; size_t cnt[8]; int from[8], tag[8]; } p2p_req;

static int g_p2p_start(void *ctx, const ex_p2p *m, void **out)
{
    member *c = ctx;
    p2p_req *r = *out ? *out : calloc(1, sizeof(p2p_req));
    if (!r) return UTIL_ENOMEM;
    *out = r;
    for (int i = 0; i < m->n_recv; i++) {
        if (r->n == 8) return UTIL_EINVAL;
        r->buf[r->n] = m->recv[i];
        r->cnt[r->n] = m->recv_n[i];
        r->from[r->n] = m->from;
        r->tag[r->n++] = m->tag + i;
    }
    for (int i = 0; i < m->n_send; i++) {
        msg *x = malloc(sizeof *x);
        float *d = malloc((m->send_n[i] ? m->send_n[i] : 1) * sizeof *d);
        if (!x || !d) { free(x); free(d); return UTIL_ENOMEM; }
        memcpy(d, m->send[i], m->send_n[i] * sizeof *d);
        *x = (msg){ NULL, c->rank, m->to, m->tag + i, m->send_n[i], d };
        if (tl_tally) {
            tl_tally->coll_calls[tl_pass][DRIFT_P2P] += 1;
            tl_tally->coll_elems[tl_pass][DRIFT_P2P] += (double)m->send_n[i];
        }
        pthread_mutex_lock(&c->g->mu);
        msg **tail = &c->g->head;
        while (*tail) tail = &(*tail)->next;
        *tail = x;
        pthread_cond_broadcast(&c->g->arrived);
        pthread_mutex_unlock(&c->g->mu);
    }
    return 0;
}

static int g_p2p_wait(void *ctx, void *req)
{
    member *c = ctx;
    p2p_req *r = req;
    int rc = 0;
    if (tl_tally) tl_tally->syncs[tl_pass] += 1;
    for (int i = 0; i < r->n; i++) {
        pthread_mutex_lock(&c->g->mu);
        msg **at;
        for (;;) {
            for (at = &c->g->head; *at; at = &(*at)->next)
                if ((*at)->to == c->rank && (*at)->from == r->from[i] && (*at)->tag == r->tag[i]) break;
            if (*at) break;
            pthread_cond_wait(&c->g->arrived, &c->g->mu);
        }
        msg *x = *at;
        *at = x->next;
        pthread_mutex_unlock(&c->g->mu);
        if (x->n != r->cnt[i]) rc = UTIL_EINVAL;
        else memcpy(r->buf[i], x->data, x->n * sizeof(float));
        free(x->data);
        free(x);
    }
    free(r);
    return rc;
}

/* ------------------------------------------------------------------ run */

typedef struct {
    const drift_case *dc;
    const model_t *m;
    int module;
    ex_batch b;
    ex_parallel par;
    const float *vis_in, *dvis;
    const float *rows;         /* a pipeline stage's input rows, and its output's gradient */
    drift_tally *t;
    int rc;
    char err[UTIL_ERR_LEN];
} rank_job;

/* One pipeline stage's forward and backward: the input rows from the
 * previous stage (or the batch), the output's gradient from the next stage
 * (or the module's own: an encoder's merged rows', the LLM's loss). All of
 * ex_stage_backward is the backward pass, its first copy included. */
static int run_stage(rank_job *j, ex_model *em)
{
    plan_stage st;
    bool first, last;
    int rc = ex_module_stage(em, j->module, &st, &first, &last);
    ex_stage_io fwd = { .in = st.stem ? NULL : j->rows, .enc_in = j->vis_in, .backward = true };
    if (!rc) rc = ex_stage_forward(em, j->module, &j->b, &fwd, j->err);
    tl_pass = DRIFT_BWD;
    ex_stage_io bwd = { .in = !st.head ? j->rows : j->dc->vision ? j->dvis : NULL };
    if (!rc) rc = ex_stage_backward(em, j->module, &j->b, &bwd, j->err);
    return rc;
}

static void *run_rank(void *arg)
{
    rank_job *j = arg;
    ex_parallel per[MODEL_MAX_MODULES];
    memset(per, 0, sizeof per);
    per[j->module] = j->par;
    if (j->dc->pp > 1) {
        per[j->module].pp_size = j->dc->pp;
        per[j->module].pp_rank = j->dc->stage % j->dc->pp;   /* interleaved: the rank of virtual stage `stage` */
        per[j->module].vp = j->dc->vp;
        per[j->module].split_ends = j->dc->split_ends;
    }
    ex_model *em = NULL;
    j->rc = ex_model_create_per_module(&counting_backend, j->m, 7, 1u << j->module, per, &em, j->err);
    if (!j->rc && j->dc->pp > 1) j->rc = ex_module_set_chunk(em, j->module, j->dc->stage / j->dc->pp, j->err);
    ex_unit_hooks hooks = { NULL, hook_begin, hook_end };
    if (!j->rc) j->rc = ex_model_set_unit_hooks(em, j->module, &hooks);
    memset(j->t, 0, sizeof *j->t);
    tl_tally = j->t;
    tl_pass = DRIFT_FWD;
    if (!j->rc && j->dc->pp > 1) {
        j->rc = run_stage(j, em);
    } else if (!j->rc && (j->dc->vision || j->dc->audio)) {
        const float *out;
        int rows;
        j->rc = j->dc->audio ? ex_audio_forward(em, &j->b, &out, &rows, j->err)
                             : ex_vision_forward(em, &j->b, &out, &rows, j->err);
        if (!j->rc) j->rc = j->dc->audio ? ex_audio_backward(em, &j->b, j->dvis, j->err)
                                         : ex_vision_backward(em, &j->b, j->dvis, j->err);
    } else if (!j->rc) {
        float loss;
        const float *dvis;
        j->rc = ex_llm_forward_backward(em, &j->b, j->vis_in, true, &loss, &dvis, j->err);
    }
    tl_tally = NULL;
    ex_model_free(em);
    return NULL;
}

static float *random_floats(size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((seed >> 40) * (1.0 / 16777216.0)) - 0.5f;
    }
    return x;
}

/* Encoder rows [n_samples x merged] of vis that an LLM sp rank takes in: per
 * sample those of the positions it holds, in the order of its rows. */
static float *held_vision_rows(const float *vis, const model_module *lm, const plan_module *s, int S, int merged,
                               int sp_rank)
{
    int d = lm->hidden;
    float *out = malloc((size_t)DRIFT_SAMPLES * merged * d * sizeof *out);
    plan_cp_span span = plan_cp_span_of(plan_cp_of(lm, s), S, s->sp, sp_rank);
    int k = 0;
    for (int smp = 0; out && smp < DRIFT_SAMPLES; smp++)
        for (int i = 0; i < span.n; i++)
            for (int p = span.lo[i]; p < span.hi[i] && p < merged; p++, k++)
                memcpy(out + (size_t)k * d, vis + ((size_t)smp * merged + p) * d, (size_t)d * sizeof *out);
    return out;
}

/* drift_count's inputs and rank jobs, and every rank's held rows. */
static void free_inputs(float *mel, float *pixels, float *vis, float *rows, rank_job *jobs, float **held)
{
    free(mel);
    free(pixels);
    free(vis);
    free(rows);
    free(jobs);
    for (int r = 0; r < DRIFT_MAX_RANKS; r++) free(held[r]);
}

/* The batch every rank runs: under Ulysses rank r holds the r-th part of the
 * patch rows (pixels) and of the merged rows' gradient (dvis); the LLM's
 * ranks take the encoder rows of the positions they hold (vis_in; an omni
 * model's LLM its images' and clips' rows). An audio encoder's ranks read
 * every clip's mel frames and the r-th part of the pooled rows' gradient. */
int drift_count(const drift_case *dc, const model_t *m, int module, drift_tally *t, char *err)
{
    int vi = model_find_kind(m, MODEL_VISION), ai = model_find_kind(m, MODEL_AUDIO);
    const model_module *vm = &m->mod[vi >= 0 ? vi : module], *lm = &m->mod[m->llm];
    int n_ranks = dc->tp * dc->sp, cpp = vm->in_channels * vm->temporal_patch * vm->patch * vm->patch;
    int merged = DRIFT_PATCHES / (vm->merge * vm->merge), T = drift_text(dc);
    if (dc->audio) merged = DRIFT_MEL_FRAMES / 2 / m->mod[ai].pool;   /* a clip's pooled rows stand where an image's merged rows do */
    /* the LLM of a model with both encoders: each sample's clip rows follow its image's (plan_sample_offset) */
    bool omni_llm = !dc->vision && !dc->audio && vi >= 0 && ai >= 0;
    if (omni_llm) merged += DRIFT_MEL_FRAMES / 2 / m->mod[ai].pool;
    if (n_ranks > DRIFT_MAX_RANKS || T > DRIFT_MAX_TEXT) return util_fail(err, UTIL_EINVAL, "%s: %d ranks, %d text tokens", dc->name, n_ranks, T);
    int aps[DRIFT_SAMPLES];
    for (int s = 0; s < DRIFT_SAMPLES; s++) aps[s] = 1;
    float *mel = ai >= 0 ? random_floats((size_t)DRIFT_SAMPLES * DRIFT_MEL_FRAMES * m->mod[ai].in_channels, 3) : NULL;
    int ipb[DRIFT_SAMPLES];
    for (int s = 0; s < DRIFT_SAMPLES; s++) ipb[s] = DRIFT_IMAGES / DRIFT_SAMPLES;
    int32_t tokens[DRIFT_SAMPLES * DRIFT_MAX_TEXT];
    for (int i = 0; i < DRIFT_SAMPLES * T; i++) tokens[i] = (int32_t)((i * 37 + 11) % lm->vocab);
    float *pixels = random_floats((size_t)DRIFT_IMAGES * DRIFT_PATCHES * cpp, 1);
    float *vis = random_floats((size_t)DRIFT_IMAGES * merged * lm->hidden, 2);
    size_t llm_rows = (size_t)DRIFT_SAMPLES * T + (size_t)DRIFT_IMAGES * merged;
    size_t stage_rows = dc->vision ? (size_t)DRIFT_IMAGES * DRIFT_PATCHES * vm->hidden : llm_rows * lm->hidden;
    float *rows = random_floats(stage_rows, 3);
    float *held[DRIFT_MAX_RANKS] = { NULL };
    plan_module ls = { .tp = dc->tp, .sp = dc->sp, .dp = 1, .pp = 1 };
    bool llm_cp = !dc->vision && !dc->audio && dc->sp > 1;
    for (int r = 0; r < n_ranks && llm_cp; r++)
        held[r] = held_vision_rows(vis, lm, &ls, merged + T, merged, r / dc->tp);
    rank_job *jobs = calloc(DRIFT_MAX_RANKS, sizeof *jobs);
    bool ok = pixels && vis && rows && jobs && (ai < 0 || mel);
    for (int r = 0; r < n_ranks && llm_cp; r++) ok = ok && held[r];
    if (!ok) {
        free_inputs(mel, pixels, vis, rows, jobs, held);
        return util_fail(err, UTIL_ENOMEM, "%s: out of memory", dc->name);
    }
    group g = { .size = n_ranks };
    pthread_barrier_init(&g.bar, NULL, (unsigned)n_ranks);
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.arrived, NULL);
    member mem[DRIFT_MAX_RANKS];
    int part_rows = DRIFT_IMAGES * DRIFT_PATCHES / dc->sp, part_merged = DRIFT_IMAGES * merged / dc->sp;
    for (int r = 0; r < n_ranks; r++) {
        mem[r] = (member){ &g, r };
        int spr = r / dc->tp, tpr = r % dc->tp;
        jobs[r] = (rank_job){
            .dc = dc, .m = m, .module = module, .t = &t[r], .vis_in = held[r] ? held[r] : vis, .rows = rows,
            .dvis = vis + (size_t)spr * part_merged * lm->hidden,
            .b = { .n_images = DRIFT_IMAGES, .patches = DRIFT_PATCHES, .grid_h = DRIFT_GRID, .grid_w = DRIFT_GRID,
                   .pixels = pixels + (size_t)spr * part_rows * cpp, .batch = DRIFT_SAMPLES,
                   .text_tokens = T, .tokens = tokens, .images_per_sample = ipb },
            .par = { .tp_size = dc->tp, .tp_rank = tpr, .sp_size = dc->sp, .sp_rank = spr,
                     .ctx = &mem[r], .allreduce_sum = g_allreduce_sum, .alltoall = g_alltoall,
                     .allreduce_max = g_allreduce_max, .seq_parallel = dc->seqpar, .allgather = g_allgather,
                     .reduce_scatter = g_reduce_scatter, .recompute = dc->recompute, .recompute_layers = dc->recompute_layers,
                     .p2p_start = g_p2p_start, .p2p_wait = g_p2p_wait },
        };
    }
    for (int r = 0; omni_llm && r < n_ranks; r++) {
        jobs[r].b.n_audio = DRIFT_SAMPLES;
        jobs[r].b.mel_frames = DRIFT_MEL_FRAMES;
        jobs[r].b.mel = mel;
        jobs[r].b.audio_per_sample = aps;
    }
    for (int r = 0; dc->audio && r < n_ranks; r++) {
        jobs[r].b = (ex_batch){ .n_audio = DRIFT_SAMPLES, .mel_frames = DRIFT_MEL_FRAMES, .mel = mel,
                                .audio_per_sample = aps, .batch = DRIFT_SAMPLES, .text_tokens = T,
                                .tokens = tokens };
    }
    pthread_t th[DRIFT_MAX_RANKS];
    for (int r = 0; r < n_ranks; r++) pthread_create(&th[r], NULL, run_rank, &jobs[r]);
    for (int r = 0; r < n_ranks; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g.bar);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.arrived);
    while (g.head) {
        msg *x = g.head;
        g.head = x->next;
        free(x->data);
        free(x);
    }
    int rc = UTIL_OK;
    for (int r = 0; r < n_ranks && !rc; r++)
        if (jobs[r].rc) rc = util_fail(err, jobs[r].rc, "%s: rank %d: %s", dc->name, r, jobs[r].err);
    free_inputs(mel, pixels, vis, rows, jobs, held);
    return rc;
}
