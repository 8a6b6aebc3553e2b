/* What the data-parallel strategies share: choosing one, hooking it to the
 * model's units, unit buffers and gradient buckets, the per-unit collectives
 * over the shard group, and moving a module's whole state in and out of its
 * shards for checkpoints. The strategies themselves are dp_replicated.c,
 * dp_zero1.c, dp_zero2.c and dp_zero3.c. */
#include "executor/run_internal.h"

#include <stdio.h>
#include <string.h>

const run_dp_ops *run_dp_ops_of(const plan_dp_rules *r)
{
    switch (r->stage) {
    case 1: return &run_dp_zero1;
    case 2: return &run_dp_zero2;
    case 3: return &run_dp_zero3;
    default: return &run_dp_replicated;
    }
}

static int hook_begin(void *ctx, int module, int unit, ex_unit_use use)
{
    (void)module;
    run_dp *d = ctx;
    return d->ops->unit_begin ? d->ops->unit_begin(d, unit, use) : UTIL_OK;
}

static int hook_end(void *ctx, int module, int unit, ex_unit_use use, bool last)
{
    (void)module;
    run_dp *d = ctx;
    return d->ops->unit_end ? d->ops->unit_end(d, unit, use, last) : UTIL_OK;
}

static int load_order(run_dp *d, char *err)
{
    for (int use = 0; use < 2; use++) {
        int n = ex_module_unit_order(d->em, d->k, (ex_unit_use)use, NULL, 0);
        d->order[use] = util_malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
        if (!d->order[use]) return util_fail(err, UTIL_ENOMEM, "run: out of memory for the unit order");
        d->n_order[use] = ex_module_unit_order(d->em, d->k, (ex_unit_use)use, d->order[use], n);
    }
    return UTIL_OK;
}

int run_dp_init(run_dp *d, ex_model *em, int k, ex_comm *shard_comm, const plan_dp_rules *r,
                const plan_dp_buffers *b, char *err)
{
    memset(d, 0, sizeof *d);
    for (int i = 0; i < RUN_DP_SLOTS; i++) d->gather[i].unit = d->bucket[i].unit = -1;
    d->ops = run_dp_ops_of(r);
    d->em = em;
    d->be = ex_model_backend(em);
    d->k = k;
    d->comm = shard_comm;
    d->rules = *r;
    d->buf = *b;
    if (ex_comm_size(shard_comm) != (r->shard > 0 ? r->shard : 1))
        return util_fail(err, UTIL_EINVAL, "run: module %d: a shard group of %d ranks for %d replicas", k,
                         ex_comm_size(shard_comm), r->shard);
    int rc = load_order(d, err);
    if (!rc) rc = d->ops->init(d, err);
    if (rc) return rc;
    d->shard = ex_module_get_shard(em, k);
    if ((rc = run_dp_step_init(d, err))) return rc;
    if (d->ops->unit_begin || d->ops->unit_end) {
        ex_unit_hooks h = { d, hook_begin, hook_end };
        ex_model_set_unit_hooks(em, k, &h);
    }
    return UTIL_OK;
}

static void free_slots(run_dp *d, run_dp_slot *s)
{
    for (int i = 0; i < RUN_DP_SLOTS; i++) {
        if (s[i].req) ex_comm_wait(d->comm, s[i].req);
        d->be->release(s[i].buf);
        d->be->release(s[i].piece);
        memset(&s[i], 0, sizeof s[i]);
    }
}

void run_dp_free(run_dp *d)
{
    if (!d->ops) return;
    run_dp_step_free(d);   /* waits for what is still in flight first */
    run_z3b_free(d);
    free_slots(d, d->gather);
    free_slots(d, d->bucket);
    d->be->release(d->staging);
    d->be->release(d->piece);
    util_free(d->order[0]);
    util_free(d->order[1]);
    memset(d, 0, sizeof *d);
}

int run_dp_alloc_slots(const ex_backend *be, run_dp_slot *s, int slots, size_t floats, size_t piece_floats,
                       util_mem_cat cat)
{
    for (int i = 0; i < slots && i < RUN_DP_SLOTS; i++) {
        s[i].unit = -1;
        s[i].buf = be->alloc((floats ? floats : 1) * sizeof(float), cat);
        if (piece_floats) s[i].piece = be->alloc(piece_floats * sizeof(float), UTIL_MEM_COMM);
        if (!s[i].buf || (piece_floats && !s[i].piece)) return UTIL_ENOMEM;
    }
    return UTIL_OK;
}

int run_dp_next_unit(run_dp *d, int unit, ex_unit_use use)
{
    int *c = &d->cursor[use], n = d->n_order[use];
    if (n == 0 || d->order[use][*c] != unit) return -1;
    if (++*c == n) { *c = 0; return -1; }
    return d->order[use][*c];
}

int run_dp_gather_unit(run_dp *d, int u, const float *mine, float *all, char *err)
{
    if (ex_comm_allgather(d->comm, mine, all, d->shard->piece[u]))
        return util_fail(err, UTIL_ERUNTIME, "run: unit %d all-gather failed: %s", u, ex_comm_error(d->comm));
    return UTIL_OK;
}

/* This rank's piece of unit u of a flat buffer, zero padded to the piece's size. */
static void take_piece(run_dp *d, int u, const float *flat, float *piece)
{
    size_t lo, hi;
    ex_shard_range(d->shard, u, &lo, &hi);
    d->be->copy(piece, flat + lo, hi - lo);
    d->be->zero(piece + (hi - lo), d->shard->piece[u] - (hi - lo));
}

int run_dp_gather_params(run_dp *d, char *err)
{
    float *p;
    size_t n;
    if (ex_module_buffer(d->em, d->k, EX_BUF_PARAMS, &p, &n))
        return util_fail(err, UTIL_EINVAL, "run: module %d has no flat weights to gather", d->k);
    for (int u = 0; u < d->shard->n_units; u++) {
        take_piece(d, u, p, d->piece);
        int rc = run_dp_gather_unit(d, u, d->piece, d->staging, err);
        if (rc) return rc;
        d->be->copy(p + d->shard->off[u], d->staging, d->shard->off[u + 1] - d->shard->off[u]);
    }
    return UTIL_OK;
}

/* Where the strategy keeps one kind of state: the flat buffer, or this rank's pieces. */
static int state_of(run_dp *d, ex_buffer_kind kind, float **flat, float **pieces)
{
    size_t n;
    *flat = *pieces = NULL;
    if (kind == EX_BUF_PARAMS) {
        if (!ex_module_buffer(d->em, d->k, EX_BUF_PARAMS, flat, &n)) return UTIL_OK;
        return ex_module_buffer(d->em, d->k, EX_BUF_PARAMS_SHARD, pieces, &n);
    }
    return ex_module_buffer(d->em, d->k, kind, pieces, &n);
}

static int gather_state(run_dp *d, ex_buffer_kind kind, float *flat, char *err)
{
    float *src, *pieces;
    if (state_of(d, kind, &src, &pieces)) return util_fail(err, UTIL_EINVAL, "run: module %d has no such state", d->k);
    const ex_shard *sh = d->shard;
    if (src || sh->G == 1) {   /* whole, and in flat order (one piece per unit is the unit) */
        d->be->copy(flat, src ? src : pieces, sh->off[sh->n_units]);
        return UTIL_OK;
    }
    size_t most = 0;
    for (int u = 0; u < sh->n_units; u++) if (sh->piece[u] > most) most = sh->piece[u];
    float *all = d->be->alloc((size_t)sh->G * (most ? most : 1) * sizeof(float), UTIL_MEM_OTHER);
    if (!all) return util_fail(err, UTIL_ENOMEM, "run: out of memory gathering module %d's state", d->k);
    int rc = UTIL_OK;
    for (int u = 0; !rc && u < sh->n_units; u++) {
        rc = run_dp_gather_unit(d, u, pieces + sh->at[u], all, err);
        if (!rc) d->be->copy(flat + sh->off[u], all, sh->off[u + 1] - sh->off[u]);
    }
    d->be->release(all);
    return rc;
}

static int scatter_state(run_dp *d, ex_buffer_kind kind, const float *flat, char *err)
{
    float *dst, *pieces;
    if (state_of(d, kind, &dst, &pieces)) return util_fail(err, UTIL_EINVAL, "run: module %d has no such state", d->k);
    const ex_shard *sh = d->shard;
    if (dst || sh->G == 1) {
        d->be->copy(dst ? dst : pieces, flat, sh->off[sh->n_units]);
        return UTIL_OK;
    }
    for (int u = 0; u < sh->n_units; u++) take_piece(d, u, flat, pieces + sh->at[u]);
    return UTIL_OK;
}

/* The module's whole flat state staged in a backend buffer: the host side
 * of a checkpoint or of --init-from meets the strategy's shards there. */
static float *staged_state(run_dp *d, size_t *n, char *err)
{
    *n = d->shard->off[d->shard->n_units];
    float *dev = d->be->alloc((*n ? *n : 1) * sizeof(float), UTIL_MEM_OTHER);
    if (!dev) util_fail(err, UTIL_ENOMEM, "run: out of memory staging module %d's state", d->k);
    return dev;
}

int run_dp_gather_state(run_dp *d, ex_buffer_kind kind, float *flat, char *err)
{
    size_t n;
    float *dev = staged_state(d, &n, err);
    if (!dev) return UTIL_ENOMEM;
    int rc = gather_state(d, kind, dev, err);
    if (!rc) d->be->d2h(flat, dev, n * sizeof(float));
    d->be->release(dev);
    return rc;
}

int run_dp_scatter_state(run_dp *d, ex_buffer_kind kind, const float *flat, char *err)
{
    size_t n;
    float *dev = staged_state(d, &n, err);
    if (!dev) return UTIL_ENOMEM;
    d->be->h2d(dev, flat, n * sizeof(float));
    int rc = scatter_state(d, kind, dev, err);
    d->be->release(dev);
    return rc;
}

/* ---- ZeRO-2/3 gradient buckets ----
 * A unit's gradient accumulates in a bucket (the unit padded to G pieces)
 * bound at its first backward use of the micro-batch; after its last one the
 * bucket is reduce-scattered over the shard group, without waiting, and this
 * rank's reduced piece is added to its gradient shard once the collective is
 * done: when the bucket is needed again, or at the end of the backward pass:
 * its last unit, the stem on a module's first pipeline stage, else the first
 * block of the rank's first model chunk (run last in a step's 1F1B). */

static int bucket_finish(run_dp *d, run_dp_slot *b)
{
    if (!b->req) return UTIL_OK;
    int rc = ex_comm_wait(d->comm, b->req);
    b->req = NULL;
    if (rc) {
        snprintf(d->err, sizeof d->err, "unit %d gradient reduce-scatter failed: %s", b->unit, ex_comm_error(d->comm));
        return UTIL_ERUNTIME;
    }
    float *g;
    size_t n;
    ex_module_buffer(d->em, d->k, EX_BUF_GRADS_SHARD, &g, &n);
    d->be->add_inplace(g + d->shard->at[b->unit], b->piece, d->shard->piece[b->unit]);
    b->unit = -1;
    return UTIL_OK;
}

int run_dp_bucket_begin(run_dp *d, int u)
{
    int slots = d->buf.bucket_slots, free_i = -1;
    for (int i = 0; i < slots; i++) {
        if (d->bucket[i].unit == u && d->bucket[i].in_use) return UTIL_OK;   /* the tied stem, bound at the head */
        if (free_i < 0 && d->bucket[i].unit < 0) free_i = i;
    }
    for (int i = 0; free_i < 0 && i < slots; i++)
        if (!d->bucket[i].in_use) {
            int rc = bucket_finish(d, &d->bucket[i]);
            if (rc) return rc;
            free_i = i;
        }
    if (free_i < 0) {
        snprintf(d->err, sizeof d->err, "no free gradient bucket for unit %d (%d in use)", u, slots);
        return UTIL_EINVAL;
    }
    run_dp_slot *b = &d->bucket[free_i];
    d->be->zero(b->buf, (size_t)d->shard->G * d->shard->piece[u]);
    b->unit = u;
    b->in_use = true;
    return ex_unit_bind(d->em, d->k, u, EX_BUF_GRADS, b->buf);
}

int run_dp_bucket_end(run_dp *d, int u, bool last)
{
    if (!last) return UTIL_OK;
    int slots = d->buf.bucket_slots, rc = UTIL_OK;
    for (int i = 0; i < slots; i++) {
        run_dp_slot *b = &d->bucket[i];
        if (b->unit != u || !b->in_use) continue;
        b->in_use = false;
        ex_unit_bind(d->em, d->k, u, EX_BUF_GRADS, NULL);
        if (ex_comm_ireduce_scatter(d->comm, b->buf, b->piece, d->shard->piece[u], &b->req)) {
            snprintf(d->err, sizeof d->err, "unit %d gradient reduce-scatter failed: %s", u, ex_comm_error(d->comm));
            return UTIL_ERUNTIME;
        }
    }
    int n = d->n_order[EX_USE_BACKWARD], pass_end = n > 0 ? d->order[EX_USE_BACKWARD][n - 1] : 0;
    for (int i = 0; u == pass_end && !rc && i < slots; i++)
        if (!d->bucket[i].in_use) rc = bucket_finish(d, &d->bucket[i]);
    return rc;
}
