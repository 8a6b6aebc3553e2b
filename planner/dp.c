/* Data-parallel strategies: what replication and each ZeRO stage
 * (Rajbhandari et al., arXiv 1910.02054; DeepSpeed stages 1-3, PyTorch FSDP
 * for stage 3) do at each point of a step, declared once. The schedule, the
 * simulator, the cost and memory models and the executor's strategies
 * (executor/dp_*.c) all read these rules. */
#include "planner/planner.h"

plan_dp_rules plan_dp_rules_of(const model_module *mm, const plan_module *s)
{
    plan_dp_rules r = { 0 };
    r.shard = s->dp * s->sp;
    r.trains = model_trains(mm);
    r.stage = r.shard > 1 ? s->zero : 0;
    if (r.stage < 0 || (!r.trains && r.stage < 3)) r.stage = 0;   /* nothing to shard but weights */
    r.shard_params = r.stage >= 3;
    r.unit_param_gather = r.shard_params;
    if (!r.trains) return r;
    r.shard_optim = r.stage >= 1;
    r.shard_grads = r.stage >= 2;
    r.step_grad_sync = r.shard > 1 && r.stage <= 1;
    r.unit_grad_reduce = r.stage >= 2;
    r.step_param_gather = r.stage == 1 || r.stage == 2;
    /* Megatron-LM keeps a tied word embedding on the first stage and a copy
     * as the head on the last, and all-reduces their gradients over its
     * embedding group before the data-parallel sync (so both copies take the
     * same update). */
    r.step_embed_sync = mm->kind == MODEL_LLM && mm->tied_embeddings && s->pp > 1;
    return r;
}

bool plan_dp_counts_norm(const plan_dp_rules *r, const plan_coord *c)
{
    if (!r->trains) return false;
    return r->stage >= 1 || (c->dp == 0 && c->sp == 0);
}
