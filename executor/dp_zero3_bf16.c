/* ZeRO-3 under bf16 (the rules and their sizes: planner/precision_zero3.c).
 * Every ZeRO-3 module under bf16-mixed or -autocast registers its gather
 * buffers with the bf16 linears (executor/precision.c), which round the
 * gathered weight they read. Under bf16-mixed the module also keeps, beside
 * its fp32 master shard, a bf16 copy of the shard and a packed copy of the
 * shard's fp32-read elements (norms, biases, embeddings), both rounded or
 * copied from the master before each step's first forward (after the
 * optimizer, a resume or --init-from). A unit's gather then moves those two
 * (two all-gathers, bf16 two elements a word) instead of the fp32 pieces,
 * and once both are in, the bf16 values are widened into the slot's fp32
 * unit and the fp32-read elements copied over them: the unit the model
 * computes with holds bf16(master) where the linears read and the master
 * where anything else reads, what bf16-mixed reads under ZeRO 0-2. */
#include "executor/run_internal.h"
#include "executor/precision.h"

#include <stdio.h>
#include <string.h>

struct run_z3b {
    run_dp *d;
    ex_module *md;
    plan_z3_unit *u;              /* [n_units] piece, half, full */
    size_t *half_at, *full_at;    /* [n_units] each unit's offset (floats) in the two shards */
    int *first;                   /* [n_units + 1] each unit's fp32-read ranges: lo[first[u] .. first[u + 1]) */
    size_t *lo, *hi;              /* unit-relative [lo, hi) */
    size_t *packed;               /* [G] elements packed so far, per rank */
    float *half, *full;           /* the shards: bf16 (as words), fp32-read elements packed */
    float *half_recv[RUN_DP_SLOTS], *full_recv[RUN_DP_SLOTS];
    ex_request *full_req[RUN_DP_SLOTS];
    int slot;                     /* the slot being unpacked */
};

/* Calls fn for each rank r's part [lo, hi) (unit-relative) of unit u's fp32-read
 * ranges, with where it sits among the rank's packed elements; only rank
 * `only` when >= 0. */
static void each_part(run_z3b *z, int u, int only, void (*fn)(run_z3b *, int, int, size_t, size_t, size_t))
{
    size_t p = (size_t)z->u[u].piece;
    int G = z->d->shard->G;
    for (int r = 0; r < G; r++) z->packed[r] = 0;
    for (int i = z->first[u]; p && i < z->first[u + 1]; i++)
        for (size_t r = z->lo[i] / p; r * p < z->hi[i] && (int)r < G; r++) {
            size_t a = z->lo[i] > r * p ? z->lo[i] : r * p, b = z->hi[i] < (r + 1) * p ? z->hi[i] : (r + 1) * p;
            if (only < 0 || (int)r == only) fn(z, u, (int)r, a, b, z->packed[r]);
            z->packed[r] += b - a;
        }
}

static void pack(run_z3b *z, int u, int r, size_t a, size_t b, size_t k)
{
    float *pieces;
    size_t n;
    ex_module_buffer(z->d->em, z->d->k, EX_BUF_PARAMS_SHARD, &pieces, &n);
    size_t p = (size_t)z->u[u].piece;
    z->d->be->copy(z->full + z->full_at[u] + k, pieces + z->d->shard->at[u] + (a - (size_t)r * p), b - a);
}

/* The two shards from the master (ex_precision_refresh's hook). */
static void refresh(void *ctx)
{
    run_z3b *z = ctx;
    float *pieces;
    size_t n;
    ex_module_buffer(z->d->em, z->d->k, EX_BUF_PARAMS_SHARD, &pieces, &n);
    const ex_shard *sh = z->d->shard;
    for (int u = 0; u < sh->n_units; u++) {
        z->d->be->to_bf16((uint16_t *)(z->half + z->half_at[u]), pieces + sh->at[u], sh->piece[u]);
        each_part(z, u, sh->r, pack);
    }
}

/* The fp32-read ranges of the module's tensors, unit by unit (its flat layout). */
static int load_ranges(run_z3b *z)
{
    ex_module *md = z->md;
    z->first = util_calloc((size_t)md->n_units + 1, sizeof *z->first);
    z->lo = util_calloc((size_t)md->n_tensors + 1, sizeof *z->lo);
    z->hi = util_calloc((size_t)md->n_tensors + 1, sizeof *z->hi);
    if (!z->first || !z->lo || !z->hi) return UTIL_ENOMEM;
    int n = 0;
    for (int u = 0; u < md->n_units; u++) {
        z->first[u] = n;
        for (int i = 0; i < md->n_tensors; i++) {
            const ex_tensor *t = &md->t[i];
            if (t->d.unit != u || !t->numel || plan_tensor_is_gemm_weight(t->d.role)) continue;
            z->lo[n] = t->off - md->unit_off[u];
            z->hi[n++] = t->off - md->unit_off[u] + t->numel;
        }
    }
    z->first[md->n_units] = n;
    return UTIL_OK;
}

static void *alloc_floats(const ex_backend *be, int64_t n, util_mem_cat cat, int *rc)
{
    if (n <= 0) return NULL;
    float *p = be->alloc((size_t)n * sizeof(float), cat);
    if (!p) *rc = UTIL_ENOMEM;
    else be->zero(p, (size_t)n);   /* an odd piece's padding element: defined */
    return p;
}

static int init_copy(run_z3b *z, char *err)
{
    const ex_shard *sh = z->d->shard;
    int U = sh->n_units, rc = UTIL_OK;
    z->u = util_calloc((size_t)U, sizeof *z->u);
    z->half_at = util_calloc((size_t)U, sizeof *z->half_at);
    z->full_at = util_calloc((size_t)U, sizeof *z->full_at);
    z->packed = util_calloc((size_t)sh->G, sizeof *z->packed);
    if (!z->u || !z->half_at || !z->full_at || !z->packed || load_ranges(z) ||
        plan_zero3_bf16_units(&z->md->mm, &z->md->strat, &z->md->held, sh->G, z->u))
        return util_fail(err, UTIL_ENOMEM, "run: out of memory for the bf16 ZeRO-3 layout");
    int64_t half = 0, full = 0, most_half = 0, most_full = 0;
    for (int u = 0; u < U; u++) {
        if ((size_t)z->u[u].piece != sh->piece[u])
            return util_fail(err, UTIL_EINVAL, "run: module %s unit %d: a piece of %zu elements, planned %lld",
                             z->md->mm.name, u, sh->piece[u], (long long)z->u[u].piece);
        z->half_at[u] = (size_t)half, z->full_at[u] = (size_t)full;
        half += z->u[u].half, full += z->u[u].full;
        if (z->u[u].half > most_half) most_half = z->u[u].half;
        if (z->u[u].full > most_full) most_full = z->u[u].full;
    }
    /* as plan_zero3_bf16_buffers sizes them */
    const ex_backend *be = z->d->be;
    z->half = alloc_floats(be, half, UTIL_MEM_PARAMS, &rc);
    z->full = alloc_floats(be, full, UTIL_MEM_PARAMS, &rc);
    for (int i = 0; i < z->d->buf.gather_slots && i < RUN_DP_SLOTS; i++) {
        z->half_recv[i] = alloc_floats(be, (int64_t)sh->G * most_half, UTIL_MEM_ZERO, &rc);
        z->full_recv[i] = alloc_floats(be, (int64_t)sh->G * most_full, UTIL_MEM_ZERO, &rc);
    }
    if (rc) return util_fail(err, UTIL_ENOMEM, "run: out of memory for the bf16 ZeRO-3 shards and gathers");
    if (ex_precision_on_refresh(refresh, z))
        return util_fail(err, UTIL_ENOMEM, "run: too many bf16 ZeRO-3 modules");
    return UTIL_OK;
}

int run_z3b_init(run_dp *d, char *err)
{
    if (!ex_precision_is_mixed(d->be)) return UTIL_OK;
    ex_module *md = ex_module_at(d->em, d->k);
    size_t unit = (size_t)d->rules.shard * (size_t)d->buf.max_piece;
    int rc = ex_precision_gathered(md, err);
    if (rc) return rc;
    for (int i = 0; i < d->buf.gather_slots && i < RUN_DP_SLOTS; i++)
        if (ex_precision_add_weights(md, d->gather[i].buf, unit))
            return util_fail(err, UTIL_ENOMEM, "run: too many ZeRO-3 gather buffers for the bf16 linears");
    if (!ex_precision_keeps_copy(d->be)) return UTIL_OK;   /* autocast: fp32 gathers */
    run_z3b *z = util_calloc(1, sizeof *z);
    if (!z) return util_fail(err, UTIL_ENOMEM, "run: out of memory for the bf16 ZeRO-3 state");
    z->d = d;
    z->md = md;
    d->z3b = z;
    if (!d->shard) d->shard = ex_module_get_shard(d->em, d->k);   /* run_dp_init sets it after init */
    return init_copy(z, err);
}

int run_z3b_issue(run_dp *d, int u, int slot)
{
    run_z3b *z = d->z3b;
    if (ex_comm_iallgather(d->comm, z->half + z->half_at[u], z->half_recv[slot], (size_t)z->u[u].half, &d->gather[slot].req) ||
        (z->u[u].full && ex_comm_iallgather(d->comm, z->full + z->full_at[u], z->full_recv[slot], (size_t)z->u[u].full,
                                             &z->full_req[slot]))) {
        snprintf(d->err, sizeof d->err, "unit %d bf16 weight all-gather failed: %s", u, ex_comm_error(d->comm));
        return UTIL_ERUNTIME;
    }
    return UTIL_OK;
}

static void unpack(run_z3b *z, int u, int r, size_t a, size_t b, size_t k)
{
    z->d->be->copy(z->d->gather[z->slot].buf + a, z->full_recv[z->slot] + (size_t)r * (size_t)z->u[u].full + k, b - a);
}

int run_z3b_finish(run_dp *d, int u, int slot)
{
    run_z3b *z = d->z3b;
    if (z->full_req[slot]) {
        int rc = ex_comm_wait(d->comm, z->full_req[slot]);
        z->full_req[slot] = NULL;
        if (rc) {
            snprintf(d->err, sizeof d->err, "unit %d fp32 weight all-gather failed: %s", u, ex_comm_error(d->comm));
            return UTIL_ERUNTIME;
        }
    }
    size_t p = (size_t)z->u[u].piece, words = (size_t)z->u[u].half;
    int G = d->shard->G;
    const uint16_t *h = (const uint16_t *)z->half_recv[slot];
    float *unit = d->gather[slot].buf;
    if (2 * words == p) d->be->from_bf16(unit, h, (size_t)G * p);   /* the pieces sit back to back */
    else
        for (int r = 0; r < G; r++) d->be->from_bf16(unit + (size_t)r * p, h + (size_t)r * 2 * words, p);
    z->slot = slot;
    each_part(z, u, -1, unpack);
    return UTIL_OK;
}

void run_z3b_free(run_dp *d)
{
    run_z3b *z = d->z3b;
    if (!z) return;
    ex_precision_on_refresh(NULL, z);
    for (int i = 0; i < RUN_DP_SLOTS; i++) {
        if (z->full_req[i]) ex_comm_wait(d->comm, z->full_req[i]);
        d->be->release(z->half_recv[i]);
        d->be->release(z->full_recv[i]);
    }
    d->be->release(z->half);
    d->be->release(z->full);
    util_free(z->u);
    util_free(z->half_at);
    util_free(z->full_at);
    util_free(z->first);
    util_free(z->lo);
    util_free(z->hi);
    util_free(z->packed);
    util_free(z);
    d->z3b = NULL;
}
