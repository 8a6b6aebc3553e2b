/* The bf16 wire of a module's activation collectives under `dhp run`
 * (executor/tp_wire.c): whether the plan's precision puts them on it
 * (planner/precision.c plan_act_wire_bf16) and the bf16 sums on the
 * module's tp communicator. */
#include "executor/run_internal.h"

static int allreduce_sum_bf16(void *ctx, uint16_t *buf, size_t n)
{
    return ex_comm_allreduce_sum_bf16(((run_hooks *)ctx)->tp, buf, n);
}

static int reduce_scatter_bf16(void *ctx, const uint16_t *send, uint16_t *recv, size_t n)
{
    return ex_comm_reduce_scatter_bf16(((run_hooks *)ctx)->tp, send, recv, n);
}

void run_wire_hooks(ex_parallel *par, const plan_options *o)
{
    par->wire_bf16 = plan_act_wire_bf16(o);
    par->allreduce_sum_bf16 = allreduce_sum_bf16;
    par->reduce_scatter_bf16 = reduce_scatter_bf16;
}
