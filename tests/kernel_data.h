/* What the kernel tests share (tests/test_cuda_kernels.c, test_ring_kernels.c):
 * the emulated CUDA backend's entry points, random arrays and the relative
 * error they are judged by. */
#ifndef DHP_TESTS_KERNEL_DATA_H
#define DHP_TESTS_KERNEL_DATA_H

#include "executor/backend.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The emulated build of executor/cuda_kernels.cu (build/obj/tests/cuda_kernels_emu.o). */
const ex_backend *ex_backend_cuda_emu(char *err);
int ex_cuda_sync_emu(char *err);

static uint64_t rs = 11;   /* each test file draws its own stream */
static inline float ur(void)  /* uniform in [-1, 1) */
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rs >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static inline float *rnd(size_t n, float scale)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = scale * ur();
    return x;
}
static inline float *dup(const float *x, size_t n)
{
    float *y = malloc((n ? n : 1) * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* max_i |a[i] - ref[i]| / max(|ref[i]|, 0.01 max_k |ref[k]|) */
static inline double max_rel_err(const float *a, const float *ref, size_t n)
{
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)ref[i]));
    double floor_ = scale > 0 ? 0.01 * scale : 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / fmax(fabs((double)ref[i]), floor_);
        if (!(e <= worst)) worst = e;   /* NaN counts as worst */
    }
    return worst;
}

#endif
