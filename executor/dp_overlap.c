/* Replicated data parallelism and ZeRO-1: the step's gradient reduction,
 * unit by unit, overlapped with the last micro-batch's backward, as PyTorch
 * DDP runs it (Li et al., "PyTorch Distributed: Experiences on Accelerating
 * Data Parallel Training", VLDB 2020, sections 3.2.3 and 3.2.4: gradients
 * in buckets, each bucket's all-reduce launched asynchronously as soon as
 * its gradients are ready, no communication on the accumulating
 * micro-batches (no_sync), and the backward's end waiting for all of them).
 *
 * A bucket is a unit (plan_module_tensors' units, the ones the ZeRO-2/3
 * buckets of dp.c use). After a unit's last backward use in the step's last
 * micro-batch of its model chunk (plan_op.last_backward, which run_op hands
 * over as run_dp.final_pass) its gradient is final:
 *  - replicated: the unit's range of the flat gradients is all-reduced in
 *    place, without waiting (one request per unit; no buffer);
 *  - ZeRO-1: the unit is staged, padded, in the staging buffer and
 *    reduce-scattered into the piece buffer, without waiting; the staging
 *    buffer is the one slot, so the next unit's post (or GRAD_SYNC) first
 *    waits for it and copies the piece into this rank's range.
 * GRAD_SYNC posts, in unit order, what was not posted (the unit holding a
 * pipeline's tied embedding, whose EMBED_SYNC must come first; a backward
 * that did not run on this rank) and waits for everything: the optimizer
 * reads finished gradients.
 *
 * Summation order: every element is reduced by the same MPI call as before
 * (MPI_Iallreduce, MPI_Ireduce_scatter_block over the same ranks, ordered by
 * rank), only in a message of one unit instead of the whole module: on the
 * MPI communicator the results are bit-identical to the one step all-reduce
 * (tests/t_overlap.sh checks it against the blocking form). NCCL's ring
 * splits by message size, so on GPUs the last bits may differ. */
#include "executor/run_internal.h"

#include <stdio.h>

/* The unit holding this stage's copy of a tied embedding (the stem on the
 * first stage, the head on the last): EMBED_SYNC adds the other stage's
 * gradient into it first, so GRAD_SYNC reduces it. -1: none. */
static int embed_unit(run_dp *d)
{
    float *g, *e;
    size_t n, ne;
    if (!d->rules.step_embed_sync || ex_module_buffer(d->em, d->k, EX_BUF_GRADS, &g, &n)) return -1;
    if (!(e = ex_module_embedding_grad(d->em, d->k, &ne)) || e < g || e >= g + n) return -1;
    for (int u = 0; u < d->shard->n_units; u++)
        if ((size_t)(e - g) >= d->shard->off[u] && (size_t)(e - g) < d->shard->off[u + 1]) return u;
    return -1;
}

/* ZeRO-1: the unit in flight done, its reduced piece into this rank's range. */
static int zero1_finish(run_dp *d)
{
    if (d->step_unit < 0) return UTIL_OK;
    int u = d->step_unit, rc = ex_comm_wait(d->comm, d->step_req);
    d->step_req = NULL;
    d->step_unit = -1;
    if (rc) {
        snprintf(d->err, sizeof d->err, "unit %d gradient reduce-scatter failed: %s", u, ex_comm_error(d->comm));
        return UTIL_ERUNTIME;
    }
    float *g;
    size_t n, lo, hi;
    ex_module_buffer(d->em, d->k, EX_BUF_GRADS, &g, &n);
    ex_shard_range(d->shard, u, &lo, &hi);
    d->be->copy(g + lo, d->piece, hi - lo);
    return UTIL_OK;
}

static int post(run_dp *d, int u)
{
    float *g;
    size_t n;
    if (ex_module_buffer(d->em, d->k, EX_BUF_GRADS, &g, &n)) return UTIL_OK;
    const ex_shard *sh = d->shard;
    size_t nu = sh->off[u + 1] - sh->off[u];
    d->posted[u] = true;
    if (nu == 0) return UTIL_OK;   /* a unit on another pipeline stage */
    if (d->rules.stage == 0) {
        if (!ex_comm_iallreduce_sum(d->comm, g + sh->off[u], nu, &d->ureq[u])) return UTIL_OK;
        snprintf(d->err, sizeof d->err, "unit %d gradient all-reduce failed: %s", u, ex_comm_error(d->comm));
        return UTIL_ERUNTIME;
    }
    int rc = zero1_finish(d);
    if (rc) return rc;
    size_t padded = (size_t)sh->G * sh->piece[u];
    d->be->copy(d->staging, g + sh->off[u], nu);
    d->be->zero(d->staging + nu, padded - nu);
    if (ex_comm_ireduce_scatter(d->comm, d->staging, d->piece, sh->piece[u], &d->step_req)) {
        snprintf(d->err, sizeof d->err, "unit %d gradient reduce-scatter failed: %s", u, ex_comm_error(d->comm));
        return UTIL_ERUNTIME;
    }
    d->step_unit = u;
    return UTIL_OK;
}

int run_dp_step_init(run_dp *d, char *err)
{
    d->step_unit = -1;
    if (!d->rules.step_grad_sync) return UTIL_OK;
    d->embed_unit = embed_unit(d);
    int n = d->shard->n_units > 0 ? d->shard->n_units : 1;
    d->step_units = d->shard->n_units;   /* kept: run_dp_free may come after the model (and its shard) is freed */
    d->posted = util_calloc((size_t)n, sizeof *d->posted);
    d->ureq = util_calloc((size_t)n, sizeof *d->ureq);
    if (!d->posted || !d->ureq) return util_fail(err, UTIL_ENOMEM, "run: out of memory for the gradient buckets");
    return UTIL_OK;
}

void run_dp_step_free(run_dp *d)
{
    for (int u = 0; d->ureq && u < d->step_units; u++)
        if (d->ureq[u]) ex_comm_wait(d->comm, d->ureq[u]);
    if (d->step_req) ex_comm_wait(d->comm, d->step_req);
    util_free(d->ureq);
    util_free(d->posted);
    d->ureq = NULL;
    d->posted = NULL;
    d->step_req = NULL;
}

/* What a step that ended early (an op failed before GRAD_SYNC) left in
 * flight: waited at the step's end, while the gradients it writes exist. */
int run_dp_step_wait_all(run_ctx *r, char *err)
{
    int rc = UTIL_OK;
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        run_dp *d = &r->mod[k].dp;
        for (int u = 0; d->ureq && u < d->step_units; u++) {
            if (d->posted) d->posted[u] = false;
            if (d->ureq[u] && ex_comm_wait(d->comm, d->ureq[u]) && !rc)
                rc = util_fail(err, UTIL_ERUNTIME, "run: unit %d gradient all-reduce failed: %s", u, ex_comm_error(d->comm));
            d->ureq[u] = NULL;
        }
        if (d->step_req && ex_comm_wait(d->comm, d->step_req) && !rc)
            rc = util_fail(err, UTIL_ERUNTIME, "run: unit %d gradient reduce-scatter failed: %s", d->step_unit, ex_comm_error(d->comm));
        d->step_req = NULL;
        d->step_unit = -1;
    }
    return rc;
}

int run_dp_step_unit_end(run_dp *d, int unit, ex_unit_use use, bool last)
{
    if (use != EX_USE_BACKWARD || !last || !d->final_pass || !d->posted || unit == d->embed_unit || d->posted[unit])
        return UTIL_OK;
    return post(d, unit);
}

int run_dp_step_grad_sync(run_dp *d, char *err)
{
    int rc = UTIL_OK;
    if (!d->posted) return UTIL_OK;
    for (int u = 0; !rc && u < d->shard->n_units; u++)
        if (!d->posted[u]) rc = post(d, u);
    for (int u = 0; u < d->shard->n_units; u++) {
        d->posted[u] = false;
        if (!d->ureq[u]) continue;
        int wrc = ex_comm_wait(d->comm, d->ureq[u]);
        d->ureq[u] = NULL;
        if (wrc && !rc) {
            snprintf(d->err, sizeof d->err, "unit %d gradient all-reduce failed: %s", u, ex_comm_error(d->comm));
            rc = UTIL_ERUNTIME;
        }
    }
    int zrc = zero1_finish(d);
    if (!rc) rc = zrc;
    return rc ? util_fail(err, rc, "run: %s", d->err) : UTIL_OK;
}
