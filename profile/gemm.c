/* dhp profile: a grid of GEMMs C[m,n] = A[m,k] B[n,k]^T through the
 * backend's own linear_forward (executor/backend.h: the executor's linear,
 * cblas_sgemm on the CPU, cuBLAS on CUDA) or linear_forward_bf16 (bf16-mixed
 * and -autocast's linear, on bf16 operands), and the fixed cost of a call. */
#include "profile/profile_int.h"

#include <math.h>
#include <string.h>

/* The grid's GEMMs find their operands as the executor's do: the input A in
 * cache (the kernel before it has just written it), the weights B and the
 * output C in memory (each call takes the next B, C of an arena far larger
 * than the cache; a step touches every weight and output once per pass). On
 * this VM, against the same GEMMs timed inside dhp run (m = 1024, n, k = 32 ..
 * 128, the tiny-vl blocks' linears without a bias), timed all in cache they
 * read 28-47% short, all from memory 3-20% over, this way -7% .. +5%. */
#define GEMM_ARENA_BYTES (512.0 * 1048576)
#define GEMM_ARENA_QUICK_BYTES (64.0 * 1048576)

typedef struct {
    const ex_backend *be;
    int m, n, k;
    float *arena;               /* slots of A[m,k] B[n,k] C[m,n], one per call */
    const uint16_t *arena16;    /* NULL, or the arena in bf16: A and B read from it (linear_forward_bf16) */
    size_t arena_n, slot_n, next;
} gemm_arg;

static gemm_arg gemm_shape(const ex_backend *be, float *arena, const uint16_t *arena16, size_t arena_n, int m, int n,
                           int k)
{
    size_t slot = ((size_t)m * k + (size_t)n * k + (size_t)m * n + 15) & ~(size_t)15;
    return (gemm_arg){be, m, n, k, arena, arena16, arena_n, slot, 0};
}

static void run_gemm(void *v)
{
    gemm_arg *g = v;
    if (g->next + g->slot_n > g->arena_n) g->next = 0;
    size_t b = g->next + (size_t)g->m * g->k;
    float *C = g->arena + b + (size_t)g->n * g->k;
    g->next += g->slot_n;
    if (g->arena16) g->be->linear_forward_bf16(C, g->arena16, g->arena16 + b, NULL, g->m, g->k, g->n);
    else g->be->linear_forward(C, g->arena, g->arena + b, NULL, g->m, g->k, g->n);
}

int prof_measure_gemm(const prof_ctx *c, cost_profile *p, const prof_gemm_grid *grid, char *err)
{
    const int *ms = grid->m, *nks = grid->nk;
    int nm = grid->n_m, nnk = grid->n_nk;
    size_t mmax = (size_t)ms[nm - 1], nkmax = (size_t)nks[nnk - 1];
    size_t largest = gemm_shape(c->be, NULL, NULL, 0, (int)mmax, (int)nkmax, (int)nkmax).slot_n;
    double bytes = p->quick ? GEMM_ARENA_QUICK_BYTES : GEMM_ARENA_BYTES;
    if (p->phys_bytes > 0 && bytes > p->phys_bytes / 16) bytes = p->phys_bytes / 16;   /* a small host */
    size_t arena_n = (size_t)(bytes / sizeof(float));
    if (arena_n < 2 * largest) arena_n = 2 * largest;
    if (c->rank != 0) arena_n = 16;   /* only rank 0 times; the others wait */
    float *arena = prof_alloc_filled(c, arena_n, 1, err), *half = NULL;
    if (arena && grid->bf16) {   /* the arena's values rounded to bf16, as bf16-mixed stages a linear's operands */
        half = prof_alloc_filled(c, arena_n / 2 + 1, 0, err);
        if (half) c->be->to_bf16((uint16_t *)half, arena, arena_n);
    }
    int rc = prof_agree(c, arena && (half || !grid->bf16) ? UTIL_OK : UTIL_ENOMEM, err);
    if (rc) goto out;
    p->gemm_arena_bytes = (double)arena_n * sizeof *arena;
    if (c->be == ex_backend_cpu()) {   /* a BLAS call's fixed cost: one slot, the same every call, in cache */
        gemm_arg one = gemm_shape(c->be, arena, NULL, 16, 1, 1, 1);
        if ((rc = prof_alone_time(c, run_gemm, &one, p->quick ? 0.005 : 0.05, 1000, 3, &p->launch_s, err))) goto out;
    }
    /* Passes over the whole grid, best per shape: a burst of load from other
     * processes spoils one pass of a shape, rarely all of them. */
    p->n_gemm = 0;
    for (int pass = 0; pass < grid->passes && !rc; pass++) {
        int idx = 0;
        for (int i = 0; i < nm && !rc; i++)
            for (int j = 0; j < nnk && !rc; j++)
                for (int l = 0; l < nnk && idx < COST_PROFILE_MAX_GEMM && !rc; l++, idx++) {
                    gemm_arg g = gemm_shape(c->be, arena, (const uint16_t *)half, arena_n, ms[i], nks[j], nks[l]);
                    double t;
                    rc = prof_alone_time(c, run_gemm, &g, grid->target_s, 1, grid->batches, &t, err);
                    if (!rc) prof_keep_gemm(p, idx, pass, g.m, g.n, g.k, t);
                }
        p->n_gemm = idx;
    }
out:
    prof_release(c, half);
    prof_release(c, arena);
    return rc;
}
