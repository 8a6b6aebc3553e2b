/* Data parallelism without sharding (ZeRO stage 0, PyTorch DDP): every
 * replica keeps the whole state; the step's gradients are all-reduced over
 * the shard group once, after the last micro-batch. */
#include "executor/run_internal.h"

static int init(run_dp *d, char *err)
{
    (void)d;
    (void)err;
    return UTIL_OK;   /* the model's own layout: one shard, the whole module */
}

static int grad_sync(run_dp *d, char *err)
{
    float *g;
    size_t n;
    if (ex_module_buffer(d->em, d->k, EX_BUF_GRADS, &g, &n)) return UTIL_OK;
    if (ex_comm_allreduce_sum(d->comm, g, n))
        return util_fail(err, UTIL_ERUNTIME, "run: gradient all-reduce failed: %s", ex_comm_error(d->comm));
    return UTIL_OK;
}

const run_dp_ops run_dp_replicated = { "replicated", init, NULL, NULL, grad_sync, NULL };
