/* `dhp run`: trains the model a plan describes. Every rank builds its
 * module groups' communicators, then each step runs its op list from
 * plan_schedule_rank (planner/schedule.c) — the same list the simulator
 * prices — on the data-parallel shares of the step's global batch. */
#include "executor/run_internal.h"
#include "executor/backend.h"

#include <math.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ex_run_options_default(ex_run_options *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 100;
    o->seed = 1234;
    o->shuffle_seed = 42;
    o->log_every = 1;
    o->comm_timeout_s = -1;
    o->optim = (ex_optim_config){ .lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 10, .total_steps = 100,
                                  .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                  .grad_clip = 1.0f };
}

/* ------------------------------------------------------------ comm hooks */

static int hook_allreduce_sum(void *ctx, float *buf, size_t n)
{
    return ex_comm_allreduce_sum(((run_hooks *)ctx)->tp, buf, n);
}

static int hook_allreduce_max(void *ctx, float *buf, size_t n)
{
    return ex_comm_allreduce_max(((run_hooks *)ctx)->tp, buf, n);
}

static int hook_alltoall(void *ctx, const float *send, float *recv, size_t chunk)
{
    return ex_comm_alltoall(((run_hooks *)ctx)->sp, send, recv, chunk);
}

/* Splits the world so that ranks of module k that share `color` form one
 * communicator; ranks outside the group pass -1 (every rank must call). */
static int split(run_ctx *r, int k, int color, int key, ex_comm **out, char *err)
{
    return ex_comm_split(r->world, r->mod[k].on ? color : -1, key, out, err);
}

static int build_comms(run_ctx *r, char *err)
{
    const plan_t *p = &r->plan;
    for (int k = 0; k < p->n_modules; k++) {
        run_module *m = &r->mod[k];
        const plan_module *s = &p->mod[k];
        m->on = plan_rank_coord(p, k, r->rank, &m->at);
        m->trains = !p->model.mod[k].frozen;
        plan_coord a = m->at;
        int rc = split(r, k, a.dp * s->sp + a.sp, a.tp, &m->tp, err);
        if (!rc) rc = split(r, k, a.dp * s->tp + a.tp, a.sp, &m->sp, err);
        if (!rc) rc = split(r, k, a.tp, a.dp * s->sp + a.sp, &m->grad, err);
        if (!rc) rc = split(r, k, a.dp == 0 && a.sp == 0 ? 0 : -1, a.tp, &m->lead, err);
        if (rc) return rc;
        m->hooks = (run_hooks){ m->tp, m->sp };
    }
    return UTIL_OK;
}

static void free_comms(run_ctx *r)
{
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        run_module *m = &r->mod[k];
        ex_comm_free(m->tp); ex_comm_free(m->sp); ex_comm_free(m->grad); ex_comm_free(m->lead);
        util_free(m->stage); util_free(m->piece);
    }
}

/* ------------------------------------------------------------ validation */

static int check_data(const run_ctx *r, const ex_dataset_info *in, char *err)
{
    const plan_t *p = &r->plan;
    const model_t *m = &p->model;
    const model_module *llm = &m->mod[m->llm];
    if (p->work.global_batch > in->samples)
        return util_fail(err, UTIL_EINVAL, "run: global batch %d is larger than the data set's %d samples", p->work.global_batch, in->samples);
    if (p->work.text_tokens != in->text_tokens)
        return util_fail(err, UTIL_EINVAL, "run: plan has %d text tokens per sample, the data set %d", p->work.text_tokens, in->text_tokens);
    if (llm->vocab < EX_TOK_PAD + 1)
        return util_fail(err, UTIL_EINVAL, "run: module %s: vocab %d is smaller than the data set's byte-level tokens (%d)", llm->name, llm->vocab, EX_TOK_PAD + 1);
    if (r->enc < 0) return UTIL_OK;
    const model_module *v = &m->mod[r->enc];
    if (p->work.images_per_sample != 1)
        return util_fail(err, UTIL_EINVAL, "run: plan has %d images per sample; the data set has one", p->work.images_per_sample);
    if (v->patch != in->patch || v->merge != in->merge || v->window != in->window)
        return util_fail(err, UTIL_EINVAL, "run: module %s has patch %d, merge %d, window %d; the data set %d, %d, %d",
                         v->name, v->patch, v->merge, v->window, in->patch, in->merge, in->window);
    if (v->in_channels * v->temporal_patch * v->patch * v->patch != in->patch_dim)
        return util_fail(err, UTIL_EINVAL, "run: module %s: patch vector of %d values, the data set's has %d", v->name,
                         v->in_channels * v->temporal_patch * v->patch * v->patch, in->patch_dim);
    if (p->work.image_tokens != in->patches)
        return util_fail(err, UTIL_EINVAL, "run: plan has %d vision tokens per image, the data set's images have %d patches", p->work.image_tokens, in->patches);
    return UTIL_OK;
}

static int check_plan(run_ctx *r, char *err)
{
    const plan_t *p = &r->plan;
    int rc = plan_schedule_check(p, err);
    if (rc) return rc;
    if (p->world_size != r->size)
        return util_fail(err, UTIL_EINVAL, "run: the plan needs %d ranks, this run has %d (mpirun -np %d)", p->world_size, r->size, p->world_size);
    r->enc = -1;
    for (int k = 0; k < p->n_modules; k++)
        if (k != p->model.llm && p->work.images_per_sample > 0) r->enc = k;
    return UTIL_OK;
}

/* ------------------------------------------------------------ model setup */

static int create_model(run_ctx *r, char *err)
{
    const plan_t *p = &r->plan;
    ex_parallel par[MODEL_MAX_MODULES];
    unsigned mask = 0;
    memset(par, 0, sizeof par);
    for (int k = 0; k < p->n_modules; k++) {
        run_module *m = &r->mod[k];
        if (!m->on) continue;
        mask |= 1u << k;
        par[k] = (ex_parallel){ .tp_size = p->mod[k].tp, .tp_rank = m->at.tp, .sp_size = p->mod[k].sp,
                                .sp_rank = m->at.sp, .ctx = &m->hooks, .allreduce_sum = hook_allreduce_sum,
                                .alltoall = hook_alltoall, .allreduce_max = hook_allreduce_max };
    }
    int rc = ex_model_create_per_module(&p->model, r->o->seed, mask, par, &r->em, err);
    if (rc) return rc;
    for (int k = 0; k < p->n_modules; k++) {
        run_module *m = &r->mod[k];
        float *buf;
        if (!m->on || ex_module_buffer(r->em, k, EX_BUF_PARAMS, &buf, &m->n)) continue;
        m->zero1 = p->mod[k].zero == 1 && m->trains && ex_comm_size(m->grad) > 1;
        if (!m->zero1) continue;
        size_t G = (size_t)ex_comm_size(m->grad), me = (size_t)ex_comm_rank(m->grad);
        m->shard = (m->n + G - 1) / G;
        m->lo = me * m->shard < m->n ? me * m->shard : m->n;
        m->hi = m->lo + m->shard < m->n ? m->lo + m->shard : m->n;
        m->stage = util_malloc_cat(UTIL_MEM_COMM, G * m->shard * sizeof(float));
        m->piece = util_malloc_cat(UTIL_MEM_COMM, m->shard * sizeof(float));
        if (!m->stage || !m->piece) return util_fail(err, UTIL_ENOMEM, "run: out of memory for ZeRO-1 buffers");
        if ((rc = ex_optimizer_shard(r->em, k, m->lo, m->hi, err))) return rc;
    }
    return UTIL_OK;
}

/* ------------------------------------------------------------ step data */

typedef struct {
    int n;                    /* samples this rank holds */
    int *row_of;              /* [global_batch] row in the buffers below, -1 if not held */
    float *pixels;            /* [n, patches, patch_dim] */
    int32_t *tokens;          /* [n, T] */
    float *mask;              /* [n, T] */
    int *ones;                /* [global_batch] images per sample (1 each) */
    ex_data_rows one;         /* loader buffer of one row */
    int patches, patch_dim, T, grid;
} step_data;

static int data_init(run_ctx *r, const plan_schedule *s, ex_dataset *ds, step_data *d, char *err)
{
    const ex_dataset_info *in = ex_data_info(ds);
    int B = r->plan.work.global_batch;
    memset(d, 0, sizeof *d);
    d->row_of = util_malloc((size_t)B * sizeof(int));
    d->ones = util_malloc((size_t)B * sizeof(int));
    if (!d->row_of || !d->ones) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
    for (int j = 0; j < B; j++) { d->row_of[j] = -1; d->ones[j] = 1; }
    for (int i = 0; i < s->n; i++) {
        const plan_op *o = &s->op[i];
        if (o->kind == PLAN_OP_FORWARD || o->kind == PLAN_OP_FORWARD_BACKWARD)
            for (int j = o->sample0; j < o->sample0 + o->samples; j++) d->row_of[j] = 0;
    }
    for (int j = 0; j < B; j++)
        if (d->row_of[j] >= 0) d->row_of[j] = d->n++;
    d->patches = in->patches;
    d->patch_dim = in->patch_dim;
    d->T = in->text_tokens;
    d->grid = in->grid;
    size_t rows = d->n > 0 ? (size_t)d->n : 1;
    d->pixels = util_malloc(rows * in->patches * in->patch_dim * sizeof(float));
    d->tokens = util_malloc(rows * in->text_tokens * sizeof(int32_t));
    d->mask = util_malloc(rows * in->text_tokens * sizeof(float));
    if (!d->pixels || !d->tokens || !d->mask) return util_fail(err, UTIL_ENOMEM, "run: out of memory for the step's data");
    return ex_batch_alloc(&d->one, ds, 1, err);
}

static void data_free(step_data *d)
{
    util_free(d->row_of); util_free(d->ones); util_free(d->pixels); util_free(d->tokens); util_free(d->mask);
    ex_batch_free(&d->one);
}

/* Loads this rank's samples of step `step`: global sample j of the step is
 * row j of the dp = 1 batch, so every plan sees the same data. */
static int data_load(run_ctx *r, ex_dataset *ds, long step, step_data *d, char *err)
{
    int B = r->plan.work.global_batch;
    size_t px = (size_t)d->patches * d->patch_dim;
    for (int j = 0; j < B; j++) {
        int row = d->row_of[j];
        if (row < 0) continue;
        int rc = ex_data_batch(ds, r->o->shuffle_seed, step, B, j, B, &d->one, err);
        if (rc) return rc;
        memcpy(d->pixels + (size_t)row * px, d->one.pixels, px * sizeof(float));
        memcpy(d->tokens + (size_t)row * d->T, d->one.tokens, (size_t)d->T * sizeof(int32_t));
        memcpy(d->mask + (size_t)row * d->T, d->one.loss_mask, (size_t)d->T * sizeof(float));
    }
    return UTIL_OK;
}

/* ------------------------------------------------------------ hand-off */

typedef struct { ex_request *req; float *buf; } pending;

typedef struct {
    plan_segment **seg;       /* [chunks] encoder -> LLM segments */
    int *nseg;
    int chunks;
    int rows;                 /* merged rows per sample */
    int d;                    /* row width (LLM hidden = encoder out_hidden) */
    float *act_pack, *grad_pack;  /* encoder: this rank's rows of the current chunk */
    float *act_in, *grad_out;     /* LLM: its share's rows of the current chunk */
    pending *pend;
    int n_pend, cap_pend;
} handoff;

static int handoff_init(run_ctx *r, handoff *h, char *err)
{
    const plan_t *p = &r->plan;
    memset(h, 0, sizeof *h);
    if (r->enc < 0) return UTIL_OK;
    h->chunks = plan_chunks(p);
    h->rows = plan_rows_per_sample(p, r->enc);
    h->d = p->model.mod[p->model.llm].hidden;
    h->seg = util_calloc((size_t)h->chunks, sizeof *h->seg);
    h->nseg = util_calloc((size_t)h->chunks, sizeof *h->nseg);
    if (!h->seg || !h->nseg) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
    for (int c = 0; c < h->chunks; c++) {
        int rc = plan_handoff(p, r->enc, c, &h->seg[c], &h->nseg[c], err);
        if (rc) return rc;
    }
    if (r->mod[r->enc].on) {
        size_t n = (size_t)plan_max_share(p, r->enc) * h->rows / p->mod[r->enc].sp * h->d;
        h->act_pack = util_malloc_cat(UTIL_MEM_COMM, (n ? n : 1) * sizeof(float));
        h->grad_pack = util_malloc_cat(UTIL_MEM_COMM, (n ? n : 1) * sizeof(float));
        if (!h->act_pack || !h->grad_pack) return util_fail(err, UTIL_ENOMEM, "run: out of memory for hand-off buffers");
    }
    if (r->mod[p->model.llm].on) {
        size_t n = (size_t)plan_max_share(p, p->model.llm) * h->rows * h->d;
        h->act_in = util_malloc_cat(UTIL_MEM_COMM, (n ? n : 1) * sizeof(float));
        h->grad_out = util_malloc_cat(UTIL_MEM_COMM, (n ? n : 1) * sizeof(float));
        if (!h->act_in || !h->grad_out) return util_fail(err, UTIL_ENOMEM, "run: out of memory for hand-off buffers");
    }
    return UTIL_OK;
}

static int handoff_wait_all(run_ctx *r, handoff *h, char *err)
{
    int rc = UTIL_OK;
    for (int i = 0; i < h->n_pend; i++) {
        if (ex_comm_wait(r->world, h->pend[i].req) && !rc)
            rc = util_fail(err, UTIL_ERUNTIME, "run: hand-off send failed: %s", ex_comm_error(r->world));
        util_free(h->pend[i].buf);
    }
    h->n_pend = 0;
    return rc;
}

static void handoff_free(run_ctx *r, handoff *h)
{
    char err[UTIL_ERR_LEN];
    handoff_wait_all(r, h, err);
    for (int c = 0; c < h->chunks; c++) util_free(h->seg[c]);
    util_free(h->seg); util_free(h->nseg); util_free(h->pend);
    util_free(h->act_pack); util_free(h->grad_pack); util_free(h->act_in); util_free(h->grad_out);
}

/* Sends this rank's rows of chunk c: one message per peer, the
 * concatenation of its segments in plan order, packed from src (rows of
 * width d at the segment's own-side offset). Messages complete by step end. */
static int handoff_send(run_ctx *r, handoff *h, int c, bool grad, const float *src, char *err)
{
    const plan_segment *sg = h->seg[c];
    int n = h->nseg[c], tag = plan_handoff_tag(r->enc, c, grad);
    size_t d = (size_t)h->d;
    int i, j, peer, nrows;
    for (int from = 0; plan_handoff_message(sg, n, from, r->rank, grad, true, &i, &j, &peer, &nrows); from = j) {
        size_t rows = (size_t)nrows;
        float *msg = util_malloc_cat(UTIL_MEM_COMM, (rows ? rows : 1) * d * sizeof(float));
        if (!msg) return util_fail(err, UTIL_ENOMEM, "run: out of memory for a hand-off message");
        size_t at = 0;
        for (int q = i; q < j; q++) {
            int off = grad ? sg[q].llm_off : sg[q].enc_off;
            memcpy(msg + at * d, src + (size_t)off * d, (size_t)sg[q].rows * d * sizeof(float));
            at += sg[q].rows;
        }
        if (h->n_pend == h->cap_pend) {
            int cap = h->cap_pend ? 2 * h->cap_pend : 16;
            pending *pn = util_realloc(h->pend, (size_t)cap * sizeof *pn);
            if (!pn) { util_free(msg); return util_fail(err, UTIL_ENOMEM, "run: out of memory"); }
            h->pend = pn;
            h->cap_pend = cap;
        }
        ex_request *req;
        if (ex_comm_isend(r->world, msg, rows * d, peer, tag, &req)) {
            util_free(msg);
            return util_fail(err, UTIL_ERUNTIME, "run: hand-off send to rank %d failed: %s", peer, ex_comm_error(r->world));
        }
        h->pend[h->n_pend++] = (pending){ req, msg };
    }
    return UTIL_OK;
}

/* Receives chunk c's rows from every peer and scatters them into dst. */
static int handoff_recv(run_ctx *r, handoff *h, int c, bool grad, float *dst, char *err)
{
    const plan_segment *sg = h->seg[c];
    int n = h->nseg[c], tag = plan_handoff_tag(r->enc, c, grad);
    size_t d = (size_t)h->d;
    int i, j, peer, nrows;
    for (int from = 0; plan_handoff_message(sg, n, from, r->rank, grad, false, &i, &j, &peer, &nrows); from = j) {
        size_t rows = (size_t)nrows;
        float *msg = util_malloc_cat(UTIL_MEM_COMM, (rows ? rows : 1) * d * sizeof(float));
        if (!msg) return util_fail(err, UTIL_ENOMEM, "run: out of memory for a hand-off message");
        if (ex_comm_recv(r->world, msg, rows * d, peer, tag)) {
            util_free(msg);
            return util_fail(err, UTIL_ERUNTIME, "run: hand-off receive from rank %d failed: %s", peer, ex_comm_error(r->world));
        }
        size_t at = 0;
        for (int q = i; q < j; q++) {
            int off = grad ? sg[q].enc_off : sg[q].llm_off;
            memcpy(dst + (size_t)off * d, msg + at * d, (size_t)sg[q].rows * d * sizeof(float));
            at += sg[q].rows;
        }
        util_free(msg);
    }
    return UTIL_OK;
}

/* ------------------------------------------------------------ ops */

typedef struct {
    double loss;              /* this rank's share of the global mean loss (LLM tp rank 0) */
    double denominator;       /* counted predictions of the global batch */
    double grad_norm;
    float lr;
    double op_s[PLAN_NOPS];   /* seconds per op kind on this rank */
} step_stats;

/* The batch of samples [s0, s0 + n): encoder ranks see their sp slice of the patches. */
static ex_batch make_batch(const run_ctx *r, const step_data *d, int s0, int n, int sp, int sp_rank)
{
    int row = d->row_of[s0];
    size_t per_image = (size_t)d->patches * d->patch_dim, N = (size_t)n * d->patches;
    const float *px = d->pixels + (size_t)row * per_image + (size_t)sp_rank * (N / (size_t)sp) * d->patch_dim;
    ex_batch b = { .n_images = r->enc >= 0 ? n : 0, .patches = d->patches, .grid_h = d->grid, .grid_w = d->grid,
                   .pixels = px, .batch = n, .text_tokens = d->T, .tokens = d->tokens + (size_t)row * d->T,
                   .images_per_sample = r->enc >= 0 ? d->ones : NULL, .loss_mask = d->mask + (size_t)row * d->T };
    return b;
}

static int share_first(const run_ctx *r, int k, int c)
{
    int f, n;
    plan_chunk_share(&r->plan, k, c, r->mod[k].at.dp, &f, &n);
    return f;
}

static int op_forward(run_ctx *r, const plan_op *o, const step_data *d, handoff *h, char *err)
{
    const run_module *m = &r->mod[o->module];
    int sp = r->plan.mod[o->module].sp, rc = ex_vision_set_slot(r->em, o->slot, err);
    if (rc) return rc;
    ex_batch b = make_batch(r, d, o->sample0, o->samples, sp, m->at.sp);
    const float *out;
    int rows;
    if ((rc = ex_vision_forward(r->em, &b, &out, &rows, err))) return rc;
    size_t off = (size_t)(o->sample0 - share_first(r, o->module, o->chunk)) * h->rows / sp;
    memcpy(h->act_pack + off * h->d, out, (size_t)rows * h->d * sizeof(float));
    return UTIL_OK;
}

static int op_backward(run_ctx *r, const plan_op *o, const step_data *d, handoff *h, char *err)
{
    const run_module *m = &r->mod[o->module];
    int sp = r->plan.mod[o->module].sp, rc = ex_vision_set_slot(r->em, o->slot, err);
    if (rc) return rc;
    ex_batch b = make_batch(r, d, o->sample0, o->samples, sp, m->at.sp);
    size_t off = (size_t)(o->sample0 - share_first(r, o->module, o->chunk)) * h->rows / sp;
    return ex_vision_backward(r->em, &b, h->grad_pack + off * h->d, err);
}

static int op_forward_backward(run_ctx *r, const plan_op *o, const step_data *d, handoff *h,
                               step_stats *st, char *err)
{
    ex_batch b = make_batch(r, d, o->sample0, o->samples, 1, 0);
    b.loss_denominator = st->denominator;
    const float *vis_in = NULL, *dvis = NULL;
    size_t off = 0;
    if (r->enc >= 0) {
        off = (size_t)(o->sample0 - share_first(r, o->module, o->chunk)) * h->rows * h->d;
        vis_in = h->act_in + off;
    }
    float loss;
    int rc = ex_llm_forward_backward(r->em, &b, vis_in, true, &loss, &dvis, err);
    if (rc) return rc;
    if (r->mod[o->module].at.tp == 0) st->loss += loss;
    if (dvis && r->enc >= 0 && r->mod[r->enc].trains)
        memcpy(h->grad_out + off, dvis, (size_t)o->samples * h->rows * h->d * sizeof(float));
    return UTIL_OK;
}

static int op_grad_sync(run_ctx *r, int k, char *err)
{
    run_module *m = &r->mod[k];
    float *g;
    size_t n;
    if (ex_module_buffer(r->em, k, EX_BUF_GRADS, &g, &n) || ex_comm_size(m->grad) == 1) return UTIL_OK;
    if (!m->zero1) {
        if (ex_comm_allreduce_sum(m->grad, g, n))
            return util_fail(err, UTIL_ERUNTIME, "run: gradient all-reduce failed: %s", ex_comm_error(m->grad));
        return UTIL_OK;
    }
    size_t G = (size_t)ex_comm_size(m->grad);
    memcpy(m->stage, g, n * sizeof(float));
    memset(m->stage + n, 0, (G * m->shard - n) * sizeof(float));
    if (ex_comm_reduce_scatter(m->grad, m->stage, m->piece, m->shard))
        return util_fail(err, UTIL_ERUNTIME, "run: gradient reduce-scatter failed: %s", ex_comm_error(m->grad));
    memcpy(g + m->lo, m->piece, (m->hi - m->lo) * sizeof(float));
    return UTIL_OK;
}

/* Sum of squared gradients this rank is responsible for: tp-sharded tensors
 * on every tp rank, replicated ones on tp rank 0; without ZeRO-1 only the
 * first dp x sp replica counts (all hold the synced sum), with ZeRO-1 every
 * rank counts its own range. */
static double local_grad_sumsq(run_ctx *r)
{
    double ss = 0;
    ex_param t;
    for (int i = 0; i < ex_param_count(r->em); i++) {
        if (ex_param_get(r->em, i, &t)) continue;
        const run_module *m = &r->mod[t.module_index];
        if (!m->trains || (!t.sharded && m->at.tp != 0)) continue;
        size_t lo = t.offset, hi = t.offset + (size_t)t.numel;
        if (m->zero1) {
            lo = lo > m->lo ? lo : m->lo;
            hi = hi < m->hi ? hi : m->hi;
        } else if (m->at.dp != 0 || m->at.sp != 0) continue;
        if (lo < hi) ss += ex_backend_cpu()->sumsq(t.grad + (lo - t.offset), hi - lo);
    }
    return ss;
}

/* One all-reduce over the world agrees on the gradient norm, the loss and
 * whether any rank failed this step. */
static int op_grad_norm(run_ctx *r, step_stats *st, int failed, char *err)
{
    double v[3] = { failed ? 0 : local_grad_sumsq(r), st->loss, failed ? 1 : 0 };
    if (ex_comm_allreduce_sum_f64(r->world, v, 3))
        return util_fail(err, UTIL_ERUNTIME, "run: gradient-norm all-reduce failed: %s", ex_comm_error(r->world));
    if (v[2] > 0)
        return failed ? failed : util_fail(err, UTIL_ERUNTIME, "run: step %d failed on %g other rank(s)", r->step, v[2]);
    st->grad_norm = sqrt(v[0]);
    st->loss = v[1];
    if (!isfinite(st->loss) || !isfinite(st->grad_norm))
        return util_fail(err, UTIL_ERUNTIME, "run: step %d: loss %g, gradient norm %g: training diverged (no checkpoint written for this step)",
                         r->step + 1, st->loss, st->grad_norm);
    return UTIL_OK;
}

static int op_optimizer(run_ctx *r, int k, bool *applied, step_stats *st, char *err)
{
    if (!*applied) {
        ex_optimizer_begin(r->em);
        *applied = true;
    }
    int rc = ex_optimizer_apply_module(r->em, &r->optim, r->step, st->grad_norm, k, &st->lr, err);
    if (rc) return rc;
    run_module *m = &r->mod[k];
    if (!m->zero1) return UTIL_OK;
    float *p;
    size_t n;
    ex_module_buffer(r->em, k, EX_BUF_PARAMS, &p, &n);
    memset(m->piece, 0, m->shard * sizeof(float));
    memcpy(m->piece, p + m->lo, (m->hi - m->lo) * sizeof(float));
    if (ex_comm_allgather(m->grad, m->piece, m->stage, m->shard))
        return util_fail(err, UTIL_ERUNTIME, "run: parameter all-gather failed: %s", ex_comm_error(m->grad));
    memcpy(p, m->stage, n * sizeof(float));
    return UTIL_OK;
}

/* Predictions the global batch's loss averages over: each LLM dp rank
 * counts its samples, summed over the dp group. */
static int count_predictions(run_ctx *r, const plan_schedule *s, const step_data *d, step_stats *st, char *err)
{
    int L = r->plan.model.llm;
    if (!r->mod[L].on) return UTIL_OK;
    double cnt = 0;
    for (int i = 0; i < s->n; i++) {
        const plan_op *o = &s->op[i];
        if (o->kind != PLAN_OP_FORWARD_BACKWARD) continue;
        for (int j = o->sample0; j < o->sample0 + o->samples; j++)
            for (int t = 0; t + 1 < d->T; t++) cnt += d->mask[(size_t)d->row_of[j] * d->T + t] != 0;
    }
    if (ex_comm_allreduce_sum_f64(r->mod[L].grad, &cnt, 1))
        return util_fail(err, UTIL_ERUNTIME, "run: all-reduce failed: %s", ex_comm_error(r->mod[L].grad));
    st->denominator = cnt > 0 ? cnt : 1;
    return UTIL_OK;
}

/* Trace of the last step: one event per op, seconds from the step's start. */
typedef struct { plan_op op; double t0, t1; } op_event;

/* Runs one op; compute errors are remembered in *failed so that the rank
 * still takes part in every communication of the step. */
static int run_op(run_ctx *r, const plan_op *o, const step_data *d, handoff *h, step_stats *st,
                  bool *applied, int *failed, char *err)
{
    int rc = UTIL_OK;
    bool skip_compute = *failed != 0;
    switch (o->kind) {
    case PLAN_OP_FORWARD:
        if (!skip_compute) rc = op_forward(r, o, d, h, err);
        break;
    case PLAN_OP_BACKWARD:
        if (!skip_compute) rc = op_backward(r, o, d, h, err);
        break;
    case PLAN_OP_FORWARD_BACKWARD:
        if (!skip_compute) rc = op_forward_backward(r, o, d, h, st, err);
        break;
    case PLAN_OP_SEND_ACT: return handoff_send(r, h, o->chunk, false, h->act_pack, err);
    case PLAN_OP_RECV_ACT: return handoff_recv(r, h, o->chunk, false, h->act_in, err);
    case PLAN_OP_SEND_GRAD: return handoff_send(r, h, o->chunk, true, h->grad_out, err);
    case PLAN_OP_RECV_GRAD: return handoff_recv(r, h, o->chunk, true, h->grad_pack, err);
    case PLAN_OP_GRAD_SYNC: return op_grad_sync(r, o->module, err);
    case PLAN_OP_GRAD_NORM: return op_grad_norm(r, st, *failed, err);
    case PLAN_OP_OPTIMIZER: return op_optimizer(r, o->module, applied, st, err);
    default: return util_fail(err, UTIL_EINVAL, "run: unknown op %d", (int)o->kind);
    }
    if (rc) *failed = rc;
    return UTIL_OK;
}

static int run_step(run_ctx *r, const plan_schedule *s, ex_dataset *ds, step_data *d, handoff *h,
                    step_stats *st, op_event *ev, char *err)
{
    memset(st, 0, sizeof *st);
    int rc = data_load(r, ds, r->step, d, err);
    if (!rc) rc = count_predictions(r, s, d, st, err);
    if (rc) return rc;
    bool applied = false;
    int failed = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        double t0 = util_now();
        rc = run_op(r, &s->op[i], d, h, st, &applied, &failed, err);
        double t1 = util_now();
        st->op_s[s->op[i].kind] += t1 - t0;
        if (ev) ev[i] = (op_event){ s->op[i], t0 + r->wall_offset, t1 + r->wall_offset };
    }
    char werr[UTIL_ERR_LEN];
    int wrc = handoff_wait_all(r, h, werr);
    if (!rc && wrc) rc = util_fail(err, wrc, "%s", werr);
    return rc;
}

/* ------------------------------------------------------------ logging */

static const util_mem_cat log_cats[5] = { UTIL_MEM_PARAMS, UTIL_MEM_GRADS, UTIL_MEM_OPTIM, UTIL_MEM_ACTIV, UTIL_MEM_COMM };
static const char *const log_cat_keys[5] = { "params", "grads", "optim", "activations", "comm" };

typedef struct { double step_s; double mem[5]; } rank_report;

static void fmt_mib(double bytes, char *buf, size_t n) { snprintf(buf, n, "%.2fM", bytes / (1024.0 * 1024.0)); }

static void log_step(const run_ctx *r, const step_stats *st, const rank_report *rep, double eta_s)
{
    const plan_t *p = &r->plan;
    double step_s = 0;
    for (int q = 0; q < r->size; q++) if (rep[q].step_s > step_s) step_s = rep[q].step_s;
    plan_seq lq;
    plan_module_seq(&p->model, p->model.llm, &p->work, &lq);
    double llm_tokens = lq.tokens_per_sample * p->work.global_batch;
    double vis_tokens = (double)p->work.images_per_sample * p->work.image_tokens * p->work.global_batch;
    if (r->o->log_json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "step", r->step);
        cJSON_AddNumberToObject(j, "steps", r->o->steps);
        cJSON_AddNumberToObject(j, "loss", st->loss);
        cJSON_AddNumberToObject(j, "grad_norm", st->grad_norm);
        cJSON_AddNumberToObject(j, "lr", st->lr);
        cJSON_AddNumberToObject(j, "step_s", step_s);
        cJSON_AddNumberToObject(j, "tokens_per_s", llm_tokens / step_s);
        cJSON_AddNumberToObject(j, "vision_tokens_per_s", vis_tokens / step_s);
        cJSON_AddNumberToObject(j, "samples_per_s", p->work.global_batch / step_s);
        cJSON *ranks = cJSON_AddArrayToObject(j, "ranks");
        for (int q = 0; q < r->size; q++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "rank", q);
            cJSON_AddNumberToObject(o, "step_s", rep[q].step_s);
            cJSON *mem = cJSON_AddObjectToObject(o, "peak_bytes");
            for (int c = 0; c < 5; c++) cJSON_AddNumberToObject(mem, log_cat_keys[c], rep[q].mem[c]);
            cJSON_AddItemToArray(ranks, o);
        }
        char *text = cJSON_PrintUnformatted(j);
        if (text) printf("%s\n", text);
        cJSON_free(text);
        cJSON_Delete(j);
        fflush(stdout);
        return;
    }
    if (r->o->progress) fprintf(stderr, "\r\033[K");
    printf("step %d/%d  loss %.4f  gnorm %.3f  lr %.2e  %.3f s  %.0f tok/s  mem",
           r->step, r->o->steps, st->loss, st->grad_norm, st->lr, step_s, llm_tokens / step_s);
    int shown = r->size <= 4 ? r->size : 1;
    for (int q = 0; q < shown; q++) {
        char b[5][24];
        for (int c = 0; c < 5; c++) fmt_mib(rep[q].mem[c], b[c], sizeof b[c]);
        printf("%s r%d P %s G %s O %s A %s C %s", q ? " |" : "", q, b[0], b[1], b[2], b[3], b[4]);
    }
    if (shown < r->size) printf(" (rank 0 of %d; --log-json has all)", r->size);
    printf("\n");
    fflush(stdout);
    if (r->o->progress) {
        int done = r->step, total = r->o->stop_after > 0 ? r->o->stop_after : r->o->steps, width = 30;
        int fill = total > 0 ? width * done / total : width;
        fprintf(stderr, "[%.*s%*s] %d/%d  ETA %.0f s", fill, "==============================", width - fill, "", done, total, eta_s);
        fflush(stderr);
    }
}

static int gather_report(run_ctx *r, double step_s, rank_report *all, char *err)
{
    rank_report me = { .step_s = step_s };
    for (int c = 0; c < 5; c++) me.mem[c] = (double)util_mem_peak(log_cats[c]);
    if (ex_comm_gather_bytes(r->world, &me, all, sizeof me, 0))
        return util_fail(err, UTIL_ERUNTIME, "run: gathering the step report failed: %s", ex_comm_error(r->world));
    return UTIL_OK;
}

/* The last step's measured ops as a Chrome trace, written by rank 0 with
 * the simulator's writer and labels, so predicted and measured timelines
 * line up event for event. */
static int write_trace(run_ctx *r, const plan_schedule *s, const op_event *ev, char *err)
{
    int most = s->n;
    if (ex_comm_allreduce_max_int(r->world, &most, 1)) return util_fail(err, UTIL_ERUNTIME, "run: trace: %s", ex_comm_error(r->world));
    op_event *mine = util_calloc((size_t)most, sizeof *mine), *all = NULL;
    if (!mine) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
    memcpy(mine, ev, (size_t)s->n * sizeof *ev);
    for (int i = s->n; i < most; i++) mine[i].op.kind = PLAN_NOPS;
    if (r->rank == 0) all = util_malloc((size_t)most * r->size * sizeof *all);
    int rc = ex_comm_gather_bytes(r->world, mine, all, (size_t)most * sizeof *mine, 0)
           ? util_fail(err, UTIL_ERUNTIME, "run: trace: %s", ex_comm_error(r->world)) : UTIL_OK;
    plan_trace_event *te = !rc && r->rank == 0 ? util_calloc((size_t)most * r->size, sizeof *te) : NULL;
    if (!rc && r->rank == 0 && !te) rc = util_fail(err, UTIL_ENOMEM, "run: out of memory");
    if (te) {
        double first = INFINITY;   /* the step's first op on any rank is the trace's time 0 */
        for (size_t i = 0; i < (size_t)most * r->size; i++)
            if (all[i].op.kind != PLAN_NOPS && all[i].t0 < first) first = all[i].t0;
        int n = 0;
        for (int q = 0; q < r->size; q++)
            for (int i = 0; i < most; i++) {
                const op_event *e = &all[(size_t)q * most + i];
                if (e->op.kind == PLAN_NOPS) continue;
                plan_trace_event *t = &te[n++];
                t->rank = q;
                t->lane = plan_op_lane(e->op.kind);
                plan_sim_op_label(&r->plan, &e->op, t->name, sizeof t->name);
                t->start_s = e->t0 - first;
                t->end_s = e->t1 - first;
                t->chunk = e->op.chunk;
                t->samples = e->op.chunk >= 0 ? e->op.samples : -1;
                t->bytes = -1;
            }
        rc = plan_trace_write(r->o->trace_path, te, n, r->size, NULL, err);
    }
    util_free(te);
    util_free(mine);
    util_free(all);
    return rc;
}

/* ------------------------------------------------------------ driver */

static double wall_minus_monotonic(void)
{
    struct timespec w;
    double m = util_now();
    clock_gettime(CLOCK_REALTIME, &w);
    return (double)w.tv_sec + 1e-9 * (double)w.tv_nsec - m;
}

static int agree(run_ctx *r, int rc, char *err)
{
    int v = rc;
    if (ex_comm_allreduce_max_int(r->world, &v, 1)) return rc ? rc : UTIL_ERUNTIME;
    if (v && !rc) return util_fail(err, v, "run: another rank failed during set-up (its message is above)");
    return rc;
}

static int train(run_ctx *r, ex_dataset *ds, char *err)
{
    plan_schedule s;
    step_data d;
    handoff h;
    memset(&d, 0, sizeof d);
    memset(&h, 0, sizeof h);
    int rc = plan_schedule_rank(&r->plan, r->rank, &s, err);
    if (!rc) rc = data_init(r, &s, ds, &d, err);
    if (!rc) rc = handoff_init(r, &h, err);
    rc = agree(r, rc, err);
    r->wall_offset = wall_minus_monotonic();
    op_event *ev = rc ? NULL : util_calloc((size_t)s.n + 1, sizeof *ev);
    rank_report *rep = util_calloc((size_t)r->size, sizeof *rep);
    int stop = r->o->stop_after > 0 && r->o->stop_after < r->o->steps ? r->o->stop_after : r->o->steps;
    double t_begin = util_now();
    int first = r->step;
    while (!rc && r->step < stop) {
        step_stats st;
        double t0 = util_now();
        if ((rc = run_step(r, &s, ds, &d, &h, &st, ev, err))) {
            char why[UTIL_ERR_LEN];
            util_strlcpy(why, err, sizeof why);
            util_fail(err, rc, "step %d: %s", r->step + 1, why);
            break;
        }
        r->step++;
        double dt = util_now() - t0;
        if ((rc = gather_report(r, dt, rep, err))) break;
        bool halt = false;   /* SIGTERM / SIGINT / SIGUSR1 on any rank: this step is the last */
        int sig = 0;
        if ((rc = run_signals_agree_stop(r, &halt, &sig, err))) break;
        double eta = (util_now() - t_begin) / (r->step - first) * (stop - r->step);
        bool last = r->step == stop || halt;
        if (r->rank == 0 && (last || r->o->log_json || r->step % (r->o->log_every > 0 ? r->o->log_every : 1) == 0))
            log_step(r, &st, rep, eta);
        bool ckpt = r->o->ckpt_dir && (last || (r->o->ckpt_every > 0 && r->step % r->o->ckpt_every == 0));
        if (ckpt) rc = run_ckpt_save(r, err);
        if (!rc && last && r->o->trace_path) rc = write_trace(r, &s, ev, err);
        if (!rc && halt) { run_signals_note(r, sig); break; }
    }
    if (r->rank == 0 && r->o->progress && !r->o->log_json) fprintf(stderr, "\n");
    util_free(ev);
    util_free(rep);
    handoff_free(r, &h);
    data_free(&d);
    plan_schedule_free(&s);
    return rc;
}

int ex_run(const ex_run_options *o, int *argc, char ***argv, char *err)
{
    run_ctx *r = util_calloc(1, sizeof *r);
    if (!r) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
    r->o = o;
    r->optim = o->optim;
    r->optim.total_steps = o->steps;
    if (o->comm_timeout_s >= 0) ex_comm_set_timeout(o->comm_timeout_s);
    int rc = ex_comm_world(argc, argv, &r->world, err);
    if (rc) { util_free(r); return rc; }
    run_signals_install();
    r->rank = ex_comm_rank(r->world);
    r->size = ex_comm_size(r->world);
    ex_dataset *ds = NULL;
    if (o->steps < 1) rc = util_fail(err, UTIL_EINVAL, "run: --steps must be >= 1");
    if (!rc) rc = plan_read(o->plan_path, &r->plan, err);
    if (!rc) rc = check_plan(r, err);
    if (!rc) rc = ex_data_open(o->data_dir, &ds, err);
    if (!rc) rc = check_data(r, ex_data_info(ds), err);
    if (!rc && o->resume && !o->ckpt_dir) rc = util_fail(err, UTIL_EINVAL, "run: --resume needs --ckpt DIR");
    if (!rc) rc = run_paths_prepare(r, err);
    /* set-up checks are identical on every rank, so communicators are built only when all passed */
    if (!rc) rc = build_comms(r, err);
    if (!rc) rc = agree(r, create_model(r, err), err);
    /* the log reports the training steps' peaks, not the set-up's (ZeRO-1
     * frees the moments the model first allocates whole) */
    util_mem_reset_peaks();
    if (!rc && o->resume) rc = agree(r, run_ckpt_load(r, err), err);
    if (!rc) rc = train(r, ds, err);
    ex_model_free(r->em);
    ex_data_close(ds);
    free_comms(r);
    ex_comm_free(r->world);
    util_free(r);
    ex_comm_finalize();
    run_signals_restore();
    return rc;
}
