/* Thread scaling of the CPU backend's attention kernels (executor/cpu_kernels.c).
 *
 * For each shape, one sequence and a micro-batch of sequences per call: the
 * forward and backward time at 1 thread (the baseline, measured in the same run)
 * and at `threads` (default: every CPU), and the speed-up of each. One sequence
 * per call is where the units of a call are the heads of that sequence alone,
 * writing neighbouring slices of the same rows.
 *
 * Usage: build/attn_threads [threads]   (make bench builds and runs it) */
#include "executor/backend.h"
#include "util/util.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct { int seq, heads, kv_heads, head_dim; } shape;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) * (1.0 / 16777216.0) - 0.5);
    }
}

typedef struct { double fwd_s, bwd_s; } timing;

/* Best of `reps` calls at `threads` threads. */
static timing time_attention(const ex_backend *be, shape s, int nseq, int threads, int reps)
{
    size_t n = (size_t)s.seq * nseq, nq = n * s.heads * s.head_dim, nkv = n * s.kv_heads * s.head_dim;
    float *buf = util_calloc(4 * nq + 4 * nkv + n * s.heads, sizeof *buf);
    int *cu = util_calloc((size_t)nseq + 1, sizeof *cu);
    timing t = {1e30, 1e30};
    if (!buf || !cu) { util_free(buf); util_free(cu); return t; }
    float *q = buf, *k = q + nq, *v = k + nkv, *dout = v + nkv, *out = dout + nq, *dq = out + nq, *dk = dq + nq,
          *dv = dk + nkv, *lse = dv + nkv;
    fill(buf, 2 * nq + 2 * nkv, 7);
    for (int i = 0; i <= nseq; i++) cu[i] = i * s.seq;
    openblas_set_num_threads(threads);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        be->attention_forward(out, lse, q, k, v, cu, nseq, s.heads, s.kv_heads, s.head_dim, false);
        double t1 = now_s();
        be->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, cu, nseq, s.heads, s.kv_heads, s.head_dim, false);
        double t2 = now_s();
        if (t1 - t0 < t.fwd_s) t.fwd_s = t1 - t0;
        if (t2 - t1 < t.bwd_s) t.bwd_s = t2 - t1;
    }
    util_free(buf);
    util_free(cu);
    return t;
}

int main(int argc, char **argv)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = argc > 1 ? atoi(argv[1]) : (int)(cpus > 0 ? cpus : 1);
    if (threads < 2) {
        fprintf(stderr, "attn_threads: needs 2 threads or more to compare against 1 (got %d)\n", threads);
        return 2;
    }
    /* tiny-vl's ViT (d = 8) and LLM (d = 16, GQA 4/2) heads, a d = 64 model's. */
    const shape shapes[] = {{256, 4, 4, 8}, {256, 4, 2, 16}, {256, 8, 4, 16}, {512, 12, 4, 64}};
    const ex_backend *be = ex_backend_cpu();
    printf("attention, non-causal, best of 10 calls; speed-up = 1-thread time / %d-thread time\n", threads);
    printf("%-22s %5s %12s %12s %8s %12s %12s %8s\n", "shape", "seqs", "fwd 1t ms", "fwd Nt ms", "speedup",
           "bwd 1t ms", "bwd Nt ms", "speedup");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        shape s = shapes[i];
        for (int nseq = 1; nseq <= 8; nseq *= 8) {
            timing one = time_attention(be, s, nseq, 1, 10), many = time_attention(be, s, nseq, threads, 10);
            char name[64];
            snprintf(name, sizeof name, "s=%d H=%d Hkv=%d d=%d", s.seq, s.heads, s.kv_heads, s.head_dim);
            printf("%-22s %5d %12.3f %12.3f %7.2fx %12.3f %12.3f %7.2fx\n", name, nseq, 1e3 * one.fwd_s,
                   1e3 * many.fwd_s, one.fwd_s / many.fwd_s, 1e3 * one.bwd_s, 1e3 * many.bwd_s, one.bwd_s / many.bwd_s);
        }
    }
    return 0;
}
