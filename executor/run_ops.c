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

/* The batch of samples [s0, s0 + n): encoder ranks see their sp slice of the patches. */
static ex_batch make_batch(const run_ctx *r, const run_data *d, int s0, int n, int sp, int sp_rank)
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

/* An encoder micro-batch's forward into its slot, its merged rows packed for the hand-off. */
static int op_forward(run_ctx *r, const plan_op *o, const run_data *d, run_handoff *h, char *err)
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

static int op_backward(run_ctx *r, const plan_op *o, const run_data *d, run_handoff *h, char *err)
{
    const run_module *m = &r->mod[o->module];
    int sp = r->plan.mod[o->module].sp, rc = ex_vision_set_slot(r->em, o->slot, err);
    if (rc) return rc;
    ex_batch b = make_batch(r, d, o->sample0, o->samples, sp, m->at.sp);
    size_t off = (size_t)(o->sample0 - share_first(r, o->module, o->chunk)) * h->rows / sp;
    return ex_vision_backward(r->em, &b, h->grad_pack + off * h->d, err);
}

/* The LLM backpropagates when it trains or a trained encoder waits for its input's gradient. */
static bool llm_backward(const run_ctx *r)
{
    return r->mod[r->plan.model.llm].trains || (r->enc >= 0 && r->mod[r->enc].trains);
}

static int op_forward_backward(run_ctx *r, const plan_op *o, const run_data *d, run_handoff *h, run_stats *st,
                               char *err)
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
    int rc = ex_llm_forward_backward(r->em, &b, vis_in, llm_backward(r), &loss, &dvis, err);
    if (rc) return rc;
    if (r->mod[o->module].at.tp == 0) st->loss += loss;
    if (dvis && r->enc >= 0 && r->mod[r->enc].trains)
        memcpy(h->grad_out + off, dvis, (size_t)o->samples * h->rows * h->d * sizeof(float));
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
        return failed ? failed : util_fail(err, UTIL_ERUNTIME, "run: step %d failed on %g other rank(s)", r->step, v[2]);
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
    if (o->kind == PLAN_OP_FORWARD_BACKWARD) return ex_llm_empty_pass(r->em, llm_backward(r), err);
    return ex_vision_empty_pass(r->em, o->kind == PLAN_OP_FORWARD ? EX_USE_FORWARD : EX_USE_BACKWARD, err);
}

int run_op(run_ctx *r, const plan_op *o, const run_data *d, run_handoff *h, run_stats *st, bool *applied,
           int *failed, char *err)
{
    int rc = UTIL_OK;
    if (plan_op_props(o->kind)->compute && o->module >= 0 && o->kind != PLAN_OP_OPTIMIZER) {
        if (*failed) {
            char ignored[UTIL_ERR_LEN];
            empty_pass(r, o, ignored);
            return UTIL_OK;
        }
        if (o->samples == 0) rc = empty_pass(r, o, err);
        else if (o->kind == PLAN_OP_FORWARD) rc = op_forward(r, o, d, h, err);
        else if (o->kind == PLAN_OP_BACKWARD) rc = op_backward(r, o, d, h, err);
        else rc = op_forward_backward(r, o, d, h, st, err);
        if (rc) *failed = op_failed(r, o->module, rc, err);
        return UTIL_OK;
    }
    switch (o->kind) {
    case PLAN_OP_SEND_ACT: return run_handoff_send(r, h, o->chunk, false, h->act_pack, err);
    case PLAN_OP_RECV_ACT: return run_handoff_recv(r, h, o->chunk, false, h->act_in, err);
    case PLAN_OP_SEND_GRAD: return run_handoff_send(r, h, o->chunk, true, h->grad_out, err);
    case PLAN_OP_RECV_GRAD: return run_handoff_recv(r, h, o->chunk, true, h->grad_pack, err);
    case PLAN_OP_GRAD_SYNC:
    case PLAN_OP_PARAM_GATHER: return op_dp(r, o, err);
    case PLAN_OP_GRAD_NORM: return op_grad_norm(r, st, *failed, err);
    case PLAN_OP_OPTIMIZER: return op_optimizer(r, o->module, applied, st, err);
    default: return util_fail(err, UTIL_EINVAL, "run: unknown op %d", (int)o->kind);
    }
}
