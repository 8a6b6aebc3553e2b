/* The one shard function of the ZeRO strategies (see executor.h, ex_shard):
 * llm.c's multi_gpu_get_shard_offset (llmc/zero.cuh) per unit, so that a
 * unit's gather or reduce-scatter is one equal-chunk collective. */
#include "executor/executor.h"

#include <string.h>

int ex_shard_init(ex_shard *s, const size_t *unit_off, int n_units, int G, int r, char *err)
{
    memset(s, 0, sizeof *s);
    if (n_units < 1 || G < 1 || r < 0 || r >= G)
        return util_fail(err, UTIL_EINVAL, "shard: %d units over %d ranks, rank %d", n_units, G, r);
    s->G = G;
    s->r = r;
    s->n_units = n_units;
    s->off = util_malloc((size_t)(n_units + 1) * sizeof *s->off);
    s->piece = util_malloc((size_t)n_units * sizeof *s->piece);
    s->at = util_malloc((size_t)(n_units + 1) * sizeof *s->at);
    if (!s->off || !s->piece || !s->at) {
        ex_shard_free(s);
        return util_fail(err, UTIL_ENOMEM, "shard: out of memory");
    }
    memcpy(s->off, unit_off, (size_t)(n_units + 1) * sizeof *s->off);
    s->at[0] = 0;
    for (int u = 0; u < n_units; u++) {
        size_t n = unit_off[u + 1] - unit_off[u];
        s->piece[u] = (n + (size_t)G - 1) / (size_t)G;
        s->at[u + 1] = s->at[u] + s->piece[u];
    }
    return UTIL_OK;
}

void ex_shard_free(ex_shard *s)
{
    util_free(s->off);
    util_free(s->piece);
    util_free(s->at);
    memset(s, 0, sizeof *s);
}

void ex_shard_range(const ex_shard *s, int u, size_t *lo, size_t *hi)
{
    size_t end = s->off[u + 1], a = s->off[u] + (size_t)s->r * s->piece[u], b = a + s->piece[u];
    *lo = a < end ? a : end;
    *hi = b < end ? b : end;
}
