/* Rows between a packed buffer and a permuted one (ex_move_permuted_rows,
 * executor/backend.h): the encoder -> LLM hand-off's raster order
 * (executor/run_handoff.c) and the one-process shuffle of encoder rows
 * (executor/llm.c). All n rows move in one backend gather_rows (one kernel
 * launch on a GPU, where a copy per row was a launch per row) through an
 * index list on the backend: packed -> permuted gathers permuted row j from
 * packed row r where j = q(r); back, packed row r from permuted row q(r),
 * q(r) = r - r % block + order[r % block]. The lists are built on the host
 * once per (n, block, order, direction) and kept, a few at a time, on the
 * backend (UTIL_MEM_OTHER, as the LM head's row list: not a planned
 * category; a handful of ints per row). Without an order the rows are in
 * place: one copy. */
#include "executor/backend.h"

#include <string.h>

#define KEPT 8   /* index lists kept: a step's distinct (n, block, order) shapes */

static struct kept {
    const ex_backend *be;
    int *idx;          /* on the backend, n ints */
    int *order;        /* host copy of the order, block ints */
    size_t n, block;
    bool to_permuted;
    unsigned long long used;
} g_kept[KEPT];
static unsigned long long g_tick;

static bool same(const struct kept *e, const ex_backend *be, size_t n, const int *order, size_t block, bool to_permuted)
{
    return e->idx && e->be == be && e->n == n && e->block == block && e->to_permuted == to_permuted &&
           !memcmp(e->order, order, block * sizeof *order);
}

static void drop(struct kept *e)
{
    if (e->idx && e->be) e->be->release(e->idx);
    util_free(e->order);
    memset(e, 0, sizeof *e);
}

/* The gather list of the move, or NULL (out of memory, or an order that is
 * not a permutation of a block or maps a row past n: the caller copies row
 * by row, as before). */
static const int *index_of(const ex_backend *be, size_t n, const int *order, size_t block, bool to_permuted)
{
    struct kept *victim = &g_kept[0];
    for (int i = 0; i < KEPT; i++) {
        if (same(&g_kept[i], be, n, order, block, to_permuted)) {
            g_kept[i].used = ++g_tick;
            return g_kept[i].idx;
        }
        if (g_kept[i].used < victim->used) victim = &g_kept[i];
    }
    if (n > (size_t)INT32_MAX || block == 0) return NULL;
    int *host = util_malloc(n * sizeof *host), *copy = util_calloc(block, sizeof *copy);
    bool ok = host && copy;
    for (size_t j = 0; ok && j < block; j++)   /* a permutation of 0 .. block-1 (copy counts each value) */
        ok = order[j] >= 0 && (size_t)order[j] < block && !copy[order[j]]++;
    for (size_t r = 0; ok && r < n; r++) {   /* then distinct targets, all below n, cover every row */
        size_t q = r - r % block + (size_t)order[r % block];
        if (q >= n) ok = false;
        else if (to_permuted) host[q] = (int)r;
        else host[r] = (int)q;
    }
    int *idx = ok ? be->alloc(n * sizeof *idx, UTIL_MEM_OTHER) : NULL;
    if (!idx) {
        util_free(host);
        util_free(copy);
        return NULL;
    }
    be->h2d(idx, host, n * sizeof *host);
    util_free(host);
    memcpy(copy, order, block * sizeof *copy);
    drop(victim);
    *victim = (struct kept){ be, idx, copy, n, block, to_permuted, ++g_tick };
    return idx;
}

void ex_move_permuted_rows(const ex_backend *be, float *packed, float *permuted, size_t n, size_t d, const int *order,
                           size_t block, bool to_permuted)
{
    if (!n || !d) return;
    if (!order) {
        if (to_permuted) be->d2d(permuted, packed, n * d * sizeof(float));
        else be->d2d(packed, permuted, n * d * sizeof(float));
        return;
    }
    const int *idx = d <= (size_t)INT32_MAX ? index_of(be, n, order, block, to_permuted) : NULL;
    if (idx) {
        if (to_permuted) be->gather_rows(permuted, packed, idx, (int)n, (int)d);
        else be->gather_rows(packed, permuted, idx, (int)n, (int)d);
        return;
    }
    for (size_t r = 0; r < n; r++) {   /* no list: a copy per row */
        size_t q = r - r % block + (size_t)order[r % block];
        if (to_permuted) be->d2d(permuted + q * d, packed + r * d, d * sizeof(float));
        else be->d2d(packed + r * d, permuted + q * d, d * sizeof(float));
    }
}
