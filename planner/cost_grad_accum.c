/* How the Megatron target's weight gradients accumulate over a step's
 * micro-batches (plan_options.grad_accum), priced as each micro-batch's
 * share of the step's passes, on the stage's own parameters (its shard of
 * them where ZeRO-2/3 keeps only that across micro-batches).
 *
 * fused: Megatron-LM's gradient_accumulation_fusion (commit 83b1e42f,
 *   2022-02-13, on by default with fp32 accumulation): the weight-gradient
 *   GEMM adds into main_grad itself (fused_weight_gradient_dense), nothing
 *   beside it; and a step of one micro-batch accumulates nothing.
 * add: PyTorch autograd's AccumulateGrad: the first micro-batch's gradient
 *   becomes param.grad, each later one is added in place (param.grad += new:
 *   read both, write one, in the weight's dtype). Megatron-LM of 2021 with
 *   its fp16 defaults (no --accumulate-allreduce-grads-in-fp32, no
 *   contiguous buffers: megatron/model/distributed.py leaves param.grad to
 *   autograd and all-reduces it at the end), DeepSpeed's fp16 engines.
 * bf16-optimizer: DeepSpeed's BF16_Optimizer under its pipeline engine
 *   (deepspeed/runtime/pipe/engine.py _exec_backward_pass, PR 1801,
 *   2022-04): clear_lp_grads before every backward, then update_hp_grads,
 *   hp_grad.add_(lp.grad.to(fp32)): a cast of the bf16 gradient to fp32 (2
 *   bytes read, 4 written) and an fp32 add, after every micro-batch. */
#include "planner/planner_int.h"

#include <math.h>

double plan_step_micro_batches(const plan_module *s, const plan_workload *w)
{
    return ceil((double)w->global_batch / ((double)s->dp * s->micro_batch));
}

double plan_grad_accum_s(const model_module *mm, const plan_module *s, const plan_stage *st, const plan_workload *w,
                         const cost_gpu *g, const plan_options *o)
{
    if (o->target != PLAN_TARGET_MEGATRON || o->grad_accum == PLAN_ACCUM_FUSED || !model_trains(mm)) return 0;
    plan_dp_rules r = plan_dp_rules_of(mm, s);
    double n = plan_stage_params(mm, s, st) / (r.shard_grads ? r.shard : 1);
    double m = plan_step_micro_batches(s, w);
    if (o->grad_accum == PLAN_ACCUM_ADD)
        return m > 1 ? (m - 1) / m * cost_elementwise_time(g, COST_EW_ADD, n, plan_module_state_bytes(mm, o).param) : 0;
    /* the cast: a copy's two accesses of 3 bytes on average; the add in fp32 */
    return cost_elementwise_time(g, COST_EW_COPY, n, 3.0) + cost_elementwise_time(g, COST_EW_ADD, n, 4.0);
}
