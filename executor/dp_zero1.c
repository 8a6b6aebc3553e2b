/* ZeRO-1 (Megatron-LM's distributed optimizer): the AdamW moments and the
 * update cover this rank's piece of every unit; after the last micro-batch
 * each unit's gradient is reduce-scattered over the shard group (into this
 * rank's range of the flat gradients), and after the update the weights are
 * all-gathered back, unit by unit, through one padded staging buffer. */
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

static int grad_sync(run_dp *d, char *err)
{
    float *g;
    size_t n;
    if (ex_module_buffer(d->em, d->k, EX_BUF_GRADS, &g, &n)) return UTIL_OK;
    const ex_shard *sh = ex_module_get_shard(d->em, d->k);
    for (int u = 0; u < sh->n_units; u++) {
        size_t nu = sh->off[u + 1] - sh->off[u], padded = (size_t)sh->G * sh->piece[u], lo, hi;
        d->be->copy(d->staging, g + sh->off[u], nu);
        d->be->zero(d->staging + nu, padded - nu);
        if (ex_comm_reduce_scatter(d->comm, d->staging, d->piece, sh->piece[u]))
            return util_fail(err, UTIL_ERUNTIME, "run: unit %d gradient reduce-scatter failed: %s", u, ex_comm_error(d->comm));
        ex_shard_range(sh, u, &lo, &hi);
        d->be->copy(g + lo, d->piece, hi - lo);
    }
    return UTIL_OK;
}

const run_dp_ops run_dp_zero1 = { "zero1", init, NULL, NULL, grad_sync, run_dp_gather_params };
