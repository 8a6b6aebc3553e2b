/* The cost model's once-a-step terms of a pipeline stage (plan_time's
 * grad_sync_s .. norm_s): the data-parallel strategy's GRAD_SYNC and
 * PARAM_GATHER (cost_dp.c), the part of them the last backward leaves
 * exposed, which the closed form and the simulator both charge, the
 * gradient norm's pass and the optimizer's. */
#include "planner/planner_int.h"

/* The step's GRAD_SYNC and PARAM_GATHER seconds, their copies included. */
static double step_comm_s(const plan_time *t)
{
    return t->grad_sync_s + t->grad_sync_busy_s + t->param_gather_s + t->param_gather_busy_s;
}

/* Of the step's GRAD_SYNC and PARAM_GATHER (with their copies), the seconds
 * left exposed: the Megatron target's bucketed reduction overlaps the last
 * micro-batch's backward on the stage (overlap of bwd_s / pp), paying the
 * contention for what it hides (plan_overlapped_comm_s); DeepSpeed's
 * pipeline engine reduces after its schedule's last step
 * (plan_pipe_engine_props), beside nothing; the dhp target's grad_sync_s is
 * already the part left exposed (cost_dp.c reduction_exposed), and its
 * PARAM_GATHER runs after the optimizer, beside nothing. */
static double step_comm_exposed(const plan_module *s, const plan_options *o, const plan_time *t)
{
    bool after_flush = plan_pipe_engine_props(o->pipe_engine)->reduce_after_flush && s->pp > 1;
    double hidden = o->target == PLAN_TARGET_DHP || after_flush ? 0 : o->overlap * t->bwd_s / s->pp;
    return plan_overlapped_comm_s(step_comm_s(t), hidden, o->target == PLAN_TARGET_MEGATRON);
}

double plan_step_comm_share(const plan_time *t)
{
    double step_comm = step_comm_s(t);
    return step_comm > 0 ? t->dp_exposed_s / step_comm : 1.0;
}

double plan_time_reduction_tail_s(const plan_time *t)
{
    return plan_step_comm_share(t) * (t->grad_sync_s + t->grad_sync_busy_s);
}

/* Once per step, for pipeline stage `stage`: the data-parallel strategy's
 * GRAD_SYNC and PARAM_GATHER, the gradient norm's pass and the optimizer.
 * out comes with the module's micro-batch time (plan_micro_time): a stage's
 * share of its backward is what the dhp target's step reduction overlaps. */
void plan_stage_step_time(const model_module *mm, const plan_module *s, int stage, const cost_pool *pool,
                          const plan_options *o, plan_time *out)
{
    plan_price_dp_step(mm, s, stage, pool, o, plan_time_backward_s(out) / (s->pp > 1 ? s->pp : 1), out);
    out->dp_exposed_s = step_comm_exposed(s, o, out);
    plan_dp_rules r = plan_dp_rules_of(mm, s);
    out->optim_s = out->norm_s = 0;
    if (!r.trains) return;
    plan_state_bytes b = plan_module_state_bytes(mm, o);
    plan_stage st = plan_stage_of(mm, s, stage);
    double updated = o->target == PLAN_TARGET_DHP ? (double)plan_dp_buffers_of(mm, s, stage).shard_elems
                                                  : plan_stage_params(mm, s, &st) / (r.shard_optim ? r.shard : 1);
    /* AdamW is one fused streaming pass over its state: STREAM-class
     * bandwidth (hbm_bw), not the element-wise mix that mem_eff describes;
     * or one such pass per op (plan_adamw_step_bytes, cost_optim.c). */
    out->optim_s = updated * plan_adamw_step_bytes(&b, o) / pool->gpu.hbm_bw + pool->gpu.kernel_launch_s;
    /* The clip's norm: a sum of squares over the gradients the rank
     * counts (plan_dp_counts_norm): its shard with ZeRO, else all of them. */
    out->norm_s = cost_elementwise_time(&pool->gpu, COST_EW_SUMSQ, updated, b.grad);
    plan_zero3_deepspeed_step(mm, s, pool, o, out);   /* DeepSpeed 2021's step around its Adam (cost_zero3.c) */
    out->optim_s += plan_fp8_weight_cast_s(mm, s, pool, o);
}

