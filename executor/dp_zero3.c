/* ZeRO-3 (DeepSpeed stage 3, PyTorch FSDP): each rank keeps only its piece
 * of every unit's weights (and, training, gradients and moments). Before a
 * unit's forward, and again before its backward, its weights are
 * all-gathered into a gather buffer, and the next unit of the pass is
 * gathered before this one computes (FSDP's forward / backward prefetch);
 * the buffer is released after use. Gradients go through buckets as under
 * ZeRO-2; a frozen module gathers and never reduces. */
#include "executor/run_internal.h"

#include <stdio.h>

static int init(run_dp *d, char *err)
{
    int rc = ex_module_set_shard(d->em, d->k, d->rules.shard, ex_comm_rank(d->comm), d->rules.trains, true, err);
    if (rc) return rc;
    size_t unit = (size_t)d->rules.shard * (size_t)d->buf.max_piece;
    if (run_dp_alloc_slots(d->be, d->gather, d->buf.gather_slots, unit, 0, UTIL_MEM_ZERO) ||
        run_dp_alloc_slots(d->be, d->bucket, d->buf.bucket_slots, unit, (size_t)d->buf.max_piece, UTIL_MEM_ZERO))
        return util_fail(err, UTIL_ENOMEM, "run: out of memory for ZeRO-3 buffers");
    return run_z3b_init(d, err);
}

static run_dp_slot *resident(run_dp *d, int unit)
{
    for (int i = 0; i < d->buf.gather_slots; i++)
        if (d->gather[i].unit == unit) return &d->gather[i];
    return NULL;
}

/* Starts gathering unit u's weights into a free buffer. */
static int issue(run_dp *d, int u, run_dp_slot **out)
{
    run_dp_slot *s = NULL;
    for (int i = 0; !s && i < d->buf.gather_slots; i++)
        if (d->gather[i].unit < 0) s = &d->gather[i];
    if (!s) {
        snprintf(d->err, sizeof d->err, "no free gather buffer for unit %d (%d in use)", u, d->buf.gather_slots);
        return UTIL_EINVAL;
    }
    float *pieces;
    size_t n;
    ex_module_buffer(d->em, d->k, EX_BUF_PARAMS_SHARD, &pieces, &n);
    if (d->z3b) {   /* bf16-mixed: the bf16 shard and the fp32-read elements */
        int rc = run_z3b_issue(d, u, (int)(s - d->gather));
        if (rc) return rc;
    } else if (ex_comm_iallgather(d->comm, pieces + d->shard->at[u], s->buf, d->shard->piece[u], &s->req)) {
        snprintf(d->err, sizeof d->err, "unit %d weight all-gather failed: %s", u, ex_comm_error(d->comm));
        return UTIL_ERUNTIME;
    }
    s->unit = u;
    if (out) *out = s;
    return UTIL_OK;
}

static int unit_begin(run_dp *d, int unit, ex_unit_use use)
{
    run_dp_slot *s = resident(d, unit);
    int rc = s ? UTIL_OK : issue(d, unit, &s);
    if (!rc && s->req) {
        rc = ex_comm_wait(d->comm, s->req);
        s->req = NULL;
        if (rc) snprintf(d->err, sizeof d->err, "unit %d weight all-gather failed: %s", unit, ex_comm_error(d->comm));
        else if (d->z3b) rc = run_z3b_finish(d, unit, (int)(s - d->gather));
    }
    if (rc) return rc;
    s->in_use = true;
    ex_unit_bind(d->em, d->k, unit, EX_BUF_PARAMS, s->buf);
    int next = run_dp_next_unit(d, unit, use);
    if (next >= 0 && !resident(d, next) && (rc = issue(d, next, NULL))) return rc;
    return use == EX_USE_BACKWARD && d->rules.trains ? run_dp_bucket_begin(d, unit) : UTIL_OK;
}

static int unit_end(run_dp *d, int unit, ex_unit_use use, bool last)
{
    run_dp_slot *s = resident(d, unit);
    if (s && s->in_use) {
        s->in_use = false;
        s->unit = -1;
        ex_unit_bind(d->em, d->k, unit, EX_BUF_PARAMS, NULL);
    }
    return use == EX_USE_BACKWARD && d->rules.trains ? run_dp_bucket_end(d, unit, last) : UTIL_OK;
}

const run_dp_ops run_dp_zero3 = { "zero3", init, unit_begin, unit_end, NULL, NULL };
