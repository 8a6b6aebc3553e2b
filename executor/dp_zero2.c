/* ZeRO-2 (DeepSpeed stage 2): as ZeRO-1, and only this rank's gradient
 * pieces are kept: every micro-batch, each unit's gradient is computed into
 * a bucket and reduce-scattered as soon as its backward ends (run_dp_bucket_*);
 * after the update the weights are all-gathered back unit by unit. */
#include "executor/run_internal.h"

static int init(run_dp *d, char *err)
{
    int rc = ex_module_set_shard(d->em, d->k, d->rules.shard, ex_comm_rank(d->comm), true, false, err);
    if (rc) return rc;
    size_t unit = (size_t)d->rules.shard * (size_t)d->buf.max_piece;
    d->staging = d->be->alloc((size_t)d->buf.staging * sizeof(float), UTIL_MEM_COMM);
    d->piece = d->be->alloc((size_t)d->buf.max_piece * sizeof(float), UTIL_MEM_COMM);
    if (!d->staging || !d->piece ||
        run_dp_alloc_slots(d->be, d->bucket, d->buf.bucket_slots, unit, (size_t)d->buf.max_piece, UTIL_MEM_ZERO))
        return util_fail(err, UTIL_ENOMEM, "run: out of memory for ZeRO-2 buffers");
    return UTIL_OK;
}

static int unit_begin(run_dp *d, int unit, ex_unit_use use)
{
    return use == EX_USE_BACKWARD ? run_dp_bucket_begin(d, unit) : UTIL_OK;
}

static int unit_end(run_dp *d, int unit, ex_unit_use use, bool last)
{
    return use == EX_USE_BACKWARD ? run_dp_bucket_end(d, unit, last) : UTIL_OK;
}

const run_dp_ops run_dp_zero2 = { "zero2", init, unit_begin, unit_end, NULL, run_dp_gather_params };
