/* The ops of `dhp run`'s step schedule (plan_schedule_rank), one handler per
 * op kind (the planner's op table names them): the modules' compute, the
 * hand-off transfers, and the data-parallel strategy's ops. */
#include "executor/run_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* A failing op's line, with what the module's strategy saw when a unit hook failed. */
static int op_failed(run_ctx *r, int k, int rc, char *err)
{
    run_dp *d = &r->mod[k].dp;
    if (!d->err[0]) return rc;
    char why[UTIL_ERR_LEN];
    util_strlcpy(why, err, sizeof why);
    util_fail(err, rc, "%s (%s)", why, d->err);
    d->err[0] = 0;
    return rc;
}

/* The batch of samples [s0, s0 + n): the images and clips of the encoders
 * that feed the LLM; vision ranks see their sp slice of the patches, audio
 * ranks every clip whole (the stem's halo; executor/audio.c). */
static ex_batch make_batch(const run_data *d, int s0, int n, int sp, int sp_rank)
{
    int row = d->row_of[s0];
    size_t per_image = (size_t)d->patches * d->patch_dim, N = (size_t)n * d->patches;
    const float *px = d->pixels + (size_t)row * per_image + (size_t)sp_rank * (N / (size_t)sp) * d->patch_dim;
    ex_batch b = { .n_images = d->images ? n : 0, .patches = d->patches, .grid_h = d->grid, .grid_w = d->grid,
                   .pixels = px, .batch = n, .text_tokens = d->T, .tokens = d->tokens + (size_t)row * d->T,
                   .images_per_sample = d->images ? d->ones : NULL, .loss_mask = d->mask + (size_t)row * d->T,
                   .n_audio = d->audio ? n : 0, .mel_frames = d->mel_frames,
                   .mel = d->audio ? d->mel + (size_t)row * d->mel_frames * d->mel_bins : NULL,
                   .audio_per_sample = d->audio ? d->ones : NULL };
    return b;
}

static int share_first(const run_ctx *r, int k, int c)
{
    int f, n;
    plan_chunk_share(&r->plan, k, c, r->mod[k].at.dp, &f, &n);
    return f;
}

/* Where a micro-batch's merged rows sit in the chunk's hand-off buffers:
 * the encoder's packed rows (its sp slice), the LLM's input rows (every
 * encoder's it holds). */
static size_t handoff_offset(const run_ctx *r, const run_handoff *h, const plan_op *o)
{
    bool llm = o->module == r->plan.model.llm;
    size_t samples = (size_t)(o->sample0 - share_first(r, o->module, o->chunk));
    return (llm ? samples * h->llm_rows : samples * h->enc[o->module].rows / r->plan.mod[o->module].sp) * h->d;
}

/* The LLM backpropagates when it trains or a trained encoder waits for its input's gradient. */
static bool llm_backward(const run_ctx *r)
{
    return r->mod[r->plan.model.llm].rules.trains || run_encoder_trains(r);
}

static ex_batch op_batch(const run_ctx *r, const plan_op *o, const run_data *d, const run_stats *st)
{
    const run_module *m = &r->mod[o->module];
    bool llm = o->module == r->plan.model.llm;
    ex_batch b = make_batch(d, o->sample0, o->samples, llm ? 1 : r->plan.mod[o->module].sp, llm ? 0 : m->at.sp);
    if (llm) b.loss_denominator = st->denominator;
    return b;
}

/* The op's model chunk is the module's first virtual stage (it reads the
 * batch) or its last (it gives the module's output). */
static bool op_first(const run_ctx *r, const plan_op *o) { return r->mod[o->module].first && o->vchunk == 0; }
static bool op_last(const run_ctx *r, const plan_op *o)
{
    return r->mod[o->module].last && o->vchunk == plan_vp(&r->plan.mod[o->module]) - 1;
}

/* A stage's forward of one micro-batch into the op's slot: its input from
 * the previous stage (received by the RECV_STAGE before it), the LLM's
 * first stage's from the encoders' hand-off; its output kept for the
 * SEND_STAGE after it, an encoder's last stage's packed for the hand-off,
 * the LLM's last stage's loss counted (tp rank 0). */
static int stage_forward(run_ctx *r, const plan_op *o, const ex_batch *b, run_handoff *h, run_stats *st, char *err)
{
    int k = o->module, L = r->plan.model.llm;
    run_module *m = &r->mod[k];
    bool first = op_first(r, o), last = op_last(r, o);
    ex_stage_io io = { .in = first ? NULL : m->st.act_in, .backward = o->kind == PLAN_OP_FORWARD_BACKWARD && llm_backward(r) };
    if (k == L && first && h->act_in) io.enc_in = h->act_in + handoff_offset(r, h, o);
    int rc = ex_stage_forward(r->em, k, b, &io, err);
    if (rc) return rc;
    if (k == L && last && m->at.tp == 0) st->loss += io.loss;
    if (!last) m->st.pending = io.out;
    else if (k != L) r->be->d2d(h->enc[k].act_pack + handoff_offset(r, h, o), io.out, (size_t)io.out_rows * h->d * sizeof(float));
    return UTIL_OK;
}

/* A stage's backward of the micro-batch in the op's slot: from the next
 * stage's gradient (received before it), an encoder's last stage's from
 * the LLM's hand-off; its input's gradient kept for the SEND_STAGE_GRAD
 * after it, the LLM's first stage's encoder rows' gradient packed for the
 * hand-off back. */
static int stage_backward(run_ctx *r, const plan_op *o, const ex_batch *b, run_handoff *h, char *err)
{
    int k = o->module, L = r->plan.model.llm;
    run_module *m = &r->mod[k];
    ex_stage_io io = { .in = !op_last(r, o) ? m->st.grad_in : k != L ? h->enc[k].grad_pack + handoff_offset(r, h, o) : NULL };
    int rc = ex_stage_backward(r->em, k, b, &io, err);
    if (rc) return rc;
    if (!op_first(r, o)) m->st.pending = io.out;
    else if (k == L && run_encoder_trains(r))
        r->be->d2d(h->grad_out + handoff_offset(r, h, o), io.out, (size_t)io.out_rows * h->d * sizeof(float));
    return UTIL_OK;
}

/* FORWARD, BACKWARD or (the LLM's last stage) FORWARD_BACKWARD of one micro-batch. */
static int op_compute(run_ctx *r, const plan_op *o, const run_data *d, run_handoff *h, run_stats *st, char *err)
{
    int rc = ex_module_set_chunk(r->em, o->module, o->vchunk, err);
    if (!rc) rc = ex_module_set_slot(r->em, o->module, o->slot >= 0 ? o->slot : 0, err);
    if (rc) return rc;
    ex_batch b = op_batch(r, o, d, st);
    if (o->kind != PLAN_OP_BACKWARD) rc = stage_forward(r, o, &b, h, st, err);
    if (!rc && (o->kind == PLAN_OP_BACKWARD || (o->kind == PLAN_OP_FORWARD_BACKWARD && llm_backward(r))))
        rc = stage_backward(r, o, &b, h, err);
    return rc;
}

/* SEND_STAGE(_GRAD) of the last compute op's output; RECV_STAGE(_GRAD) into
 * the edge's buffer, which the next compute op reads. Rows are the
 * micro-batch's at the stage boundary. */
static int op_hop(run_ctx *r, const plan_op *o, const run_data *d, run_stats *st, char *err)
{
    const plan_op_info *in = plan_op_props(o->kind);
    run_module *m = &r->mod[o->module];
    ex_batch b = op_batch(r, o, d, st);
    int rows = ex_stage_rows(r->em, o->module, &b);
    if (in->sends) {
        int rc = run_stage_send(r, o, m->st.pending, rows, err);
        m->st.pending = NULL;
        return rc;
    }
    const float *buf;
    return run_stage_recv(r, o, rows, &buf, err);
}

/* A tied embedding's gradient summed between the first and the last stage. */
static int op_embed_sync(run_ctx *r, int k, char *err)
{
    run_module *m = &r->mod[k];
    size_t n;
    float *g = ex_module_embedding_grad(r->em, k, &n);
    if (!g || !m->embed) return util_fail(err, UTIL_EINVAL, "run: module %s: no tied embedding on this stage to sync", r->plan.mod[k].module);
    if (ex_comm_allreduce_sum(m->embed, g, n))
        return util_fail(err, UTIL_ERUNTIME, "run: module %s: embedding all-reduce failed: %s", r->plan.mod[k].module, ex_comm_error(m->embed));
    return UTIL_OK;
}

/* Sum of squared gradients this rank counts (plan_dp_counts_norm for the
 * data-parallel replicas, ex_module_grad_sumsq for the tp group). */
static double local_grad_sumsq(run_ctx *r)
{
    double ss = 0;
    for (int k = 0; k < r->plan.n_modules; k++) {
        const run_module *m = &r->mod[k];
        if (m->on && plan_dp_counts_norm(&m->rules, &m->at)) ss += ex_module_grad_sumsq(r->em, k);
    }
    return ss;
}

/* One all-reduce over the world agrees on the gradient norm, the loss and
 * whether any rank failed this step. */
static int op_grad_norm(run_ctx *r, run_stats *st, int failed, char *err)
{
    double v[3] = { failed ? 0 : local_grad_sumsq(r), st->loss, failed ? 1 : 0 };
    if (ex_comm_allreduce_sum_f64(r->world, v, 3))
        return util_fail(err, UTIL_ERUNTIME, "run: gradient-norm all-reduce failed: %s", ex_comm_error(r->world));
    if (v[2] > 0)
        return failed ? failed : util_fail(err, UTIL_ERUNTIME, "run: the step failed on %g other rank(s) (their message is above)", v[2]);
    st->grad_norm = sqrt(v[0]);
    st->loss = v[1];
    if (!isfinite(st->loss) || !isfinite(st->grad_norm))
        return util_fail(err, UTIL_ERUNTIME, "run: step %d: loss %g, gradient norm %g: training diverged (no checkpoint written for this step)",
                         r->step + 1, st->loss, st->grad_norm);
    return UTIL_OK;
}

static int op_optimizer(run_ctx *r, int k, bool *applied, run_stats *st, char *err)
{
    if (!*applied) {
        ex_optimizer_begin(r->em);
        *applied = true;
    }
    return ex_optimizer_apply_module(r->em, &r->optim, r->step, st->grad_norm, k, &st->lr, err);
}

static int op_dp(run_ctx *r, const plan_op *o, char *err)
{
    run_dp *d = &r->mod[o->module].dp;
    int (*fn)(run_dp *, char *) = o->kind == PLAN_OP_GRAD_SYNC ? d->ops->grad_sync : d->ops->param_gather;
    if (!fn) return util_fail(err, UTIL_EINVAL, "run: module %s's %s strategy has no %s op", r->plan.mod[o->module].module,
                              d->ops->name, plan_op_name(o->kind));
    return fn(d, err);
}

/* A compute op this rank has no samples for, or skips after a failure: only
 * the module's unit hooks, so that its shard group's collectives still match. */
static int empty_pass(run_ctx *r, const plan_op *o, char *err)
{
    int rc = ex_module_set_chunk(r->em, o->module, o->vchunk, err);
    if (!rc && o->kind != PLAN_OP_BACKWARD) rc = ex_stage_empty_pass(r->em, o->module, EX_USE_FORWARD, err);
    if (!rc && (o->kind == PLAN_OP_BACKWARD || (o->kind == PLAN_OP_FORWARD_BACKWARD && llm_backward(r))))
        rc = ex_stage_empty_pass(r->em, o->module, EX_USE_BACKWARD, err);
    return rc;
}

/* The sends the op frees (plan_op.retires), waiting for those a receiver has not taken. */
static int handoff_retire(run_ctx *r, run_handoff *h, const plan_op *o, char *err)
{
    return o->retires < 0 ? UTIL_OK : run_handoff_retire(r, h, o->module, o->retires, plan_op_retired_grad(o->kind), err);
}

/* SEND_ACT / SEND_GRAD: the earlier chunk's sends the op retires, then this chunk's. */
static int handoff_send(run_ctx *r, run_handoff *h, const plan_op *o, bool grad, float *src, char *err)
{
    int rc = handoff_retire(r, h, o, err);
    return rc ? rc : run_handoff_send(r, h, o->module, o->chunk, grad, src, err);
}

/* RECV_ACT / RECV_GRAD: the messages in, then the sends the op retires. */
static int handoff_recv(run_ctx *r, run_handoff *h, const plan_op *o, bool grad, float *dst, char *err)
{
    int rc = run_handoff_recv(r, h, o->module, o->chunk, grad, dst, err);
    return rc ? rc : handoff_retire(r, h, o, err);
}

int run_op(run_ctx *r, const plan_op *o, const run_data *d, run_handoff *h, run_stats *st, bool *applied,
           int *failed, char *err)
{
    int rc = UTIL_OK;
    if (plan_op_props(o->kind)->compute && o->module >= 0 && o->kind != PLAN_OP_OPTIMIZER) {
        r->mod[o->module].dp.final_pass = o->last_backward;   /* dp_overlap.c: units reduced as they finish */
        if (*failed) {
            char ignored[UTIL_ERR_LEN];
            empty_pass(r, o, ignored);
            r->mod[o->module].st.pending = NULL;
            return UTIL_OK;
        }
        rc = o->samples == 0 ? empty_pass(r, o, err) : op_compute(r, o, d, h, st, err);
        if (rc) {
            *failed = op_failed(r, o->module, rc, err);
            r->mod[o->module].st.pending = NULL;
        }
        return UTIL_OK;
    }
    switch (o->kind) {
    case PLAN_OP_SEND_ACT: return handoff_send(r, h, o, false, h->enc[o->module].act_pack, err);
    case PLAN_OP_RECV_ACT: return handoff_recv(r, h, o, false, h->act_in, err);
    case PLAN_OP_SEND_GRAD: return handoff_send(r, h, o, true, h->grad_out, err);
    case PLAN_OP_RECV_GRAD: return handoff_recv(r, h, o, true, h->enc[o->module].grad_pack, err);
    case PLAN_OP_SEND_STAGE:
    case PLAN_OP_RECV_STAGE:
    case PLAN_OP_SEND_STAGE_GRAD:
    case PLAN_OP_RECV_STAGE_GRAD: return op_hop(r, o, d, st, err);
    case PLAN_OP_EMBED_SYNC: return op_embed_sync(r, o->module, err);
    case PLAN_OP_GRAD_SYNC:
    case PLAN_OP_PARAM_GATHER: return op_dp(r, o, err);
    case PLAN_OP_GRAD_NORM: return op_grad_norm(r, st, *failed, err);
    case PLAN_OP_OPTIMIZER: return op_optimizer(r, o->module, applied, st, err);
    default: return util_fail(err, UTIL_EINVAL, "run: unknown op %d", (int)o->kind);
    }
}
