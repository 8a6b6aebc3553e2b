/* The AdamW step's memory traffic under the Megatron target (plan_options.adamw).
 *
 * Fused (apex FusedAdam, DeepSpeed's FusedAdam, torch.optim.AdamW(fused=True);
 * the default): one pass reads the gradient (G bytes) and reads and writes
 * the weight being updated, m and v (S bytes each): plan_state_bytes'
 * step_traffic, 6 S + G (and the low-precision copy's write where there is one).
 *
 * Foreach: torch.optim.AdamW's multi-tensor path (torch/optim/adamw.py
 * _multi_tensor_adamw, what AdamW runs without fused=True, e.g. torchtitan's
 * build_optimizers with optimizer.fused false) makes one pass per tensor op:
 *   param.mul_(1 - lr wd)              r/w S
 *   exp_avg.lerp_(grad, 1 - beta1)     r/w S, r G
 *   exp_avg_sq.mul_(beta2)             r/w S
 *   exp_avg_sq.addcmul_(grad, grad)    r/w S, r 2G
 *   denom = exp_avg_sq.sqrt()          r S, w S
 *   denom.div_(bias_correction2_sqrt)  r/w S
 *   denom.add_(eps)                    r/w S
 *   param.addcdiv_(exp_avg, denom)     r/w S, r 2S
 * 18 S + 3 G in all, 12 S + 2 G more than the fused pass. Composer 0.16's
 * DecoupledAdamW (composer/optim/decoupled_weight_decay.py, adamw: a Python
 * loop over the parameters, llm-foundry's decoupled_adamw) runs the same ops
 * one parameter at a time, exp_avg.mul_(beta1).add_(grad) for the lerp: with
 * llm-foundry's weight_decay 0 (no param.mul_) again 18 S + 3 G. */
#include "planner/planner_int.h"

double plan_adamw_step_bytes(const plan_state_bytes *b, const plan_options *o)
{
    if (o->target != PLAN_TARGET_MEGATRON || o->adamw != PLAN_ADAMW_FOREACH || b->optim <= 0) return b->step_traffic;
    /* S: one state element (bf16-mixed's optimizer bytes are the fp32 master, m and v) */
    double S = b->optim / (o->precision == PLAN_OPT_MIXED_FP32 ? 3 : 2);
    return b->step_traffic + 12 * S + 2 * b->grad;
}
