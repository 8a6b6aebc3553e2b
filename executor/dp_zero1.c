/* ZeRO-1 (Megatron-LM's distributed optimizer): the AdamW moments and the
 * update cover this rank's piece of every unit; in the last micro-batch's
 * backward each unit's gradient is reduce-scattered over the shard group
 * (into this rank's range of the flat gradients) as the unit finishes
 * (dp_overlap.c), and after the update the weights are all-gathered back,
 * unit by unit, through one padded staging buffer. */
#include "executor/run_internal.h"

static int init(run_dp *d, char *err)
{
    int rc = ex_module_set_shard(d->em, d->k, d->rules.shard, ex_comm_rank(d->comm), false, false, err);
    if (rc) return rc;
    d->staging = d->be->alloc((size_t)d->buf.staging * sizeof(float), UTIL_MEM_COMM);
    d->piece = d->be->alloc((size_t)d->buf.max_piece * sizeof(float), UTIL_MEM_COMM);
    if (!d->staging || !d->piece) return util_fail(err, UTIL_ENOMEM, "run: out of memory for ZeRO-1 buffers");
    return UTIL_OK;
}

const run_dp_ops run_dp_zero1 = { "zero1", init, NULL, run_dp_step_unit_end, run_dp_step_grad_sync, run_dp_gather_params };
