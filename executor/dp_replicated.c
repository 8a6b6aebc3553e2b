/* Data parallelism without sharding (ZeRO stage 0, PyTorch DDP): every
 * replica keeps the whole state; the step's gradients are all-reduced over
 * the shard group unit by unit as the last micro-batch's backward finishes
 * each unit, and GRAD_SYNC waits for them (dp_overlap.c). */
#include "executor/run_internal.h"

static int init(run_dp *d, char *err)
{
    (void)d;
    (void)err;
    return UTIL_OK;   /* the model's own layout: one shard, the whole module */
}

const run_dp_ops run_dp_replicated = { "replicated", init, NULL, run_dp_step_unit_end, run_dp_step_grad_sync, NULL };
