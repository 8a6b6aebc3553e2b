/* The CPU backend's bf16-mixed entries: rounding to bfloat16 and the linears
 * on bf16 operands. OpenBLAS has no bf16 GEMM in every build (sbgemm is
 * optional, BUILD_BFLOAT16), so the operands are widened (exactly) to fp32
 * in host temporaries, as a BLAS library's own packing buffers, and go
 * through the same sgemm calls as the fp32 linears: every product of two
 * bf16 values is exact in fp32 and the sums accumulate in fp32, which is
 * what cuBLAS computes with CUDA_R_16BF inputs and CUBLAS_COMPUTE_32F (up to
 * summation order). The emulated CUDA backend (tests/cudaemu.h) does the
 * same, so both backends agree. */
#include "executor/bf16.h"
#include "executor/cpu_int.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

void ex_cpu_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = ex_bf16_from_f32(src[i]);
}

void ex_cpu_from_bf16(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = ex_bf16_to_f32(src[i]);
}

/* fp32 copies of bf16 operands, one allocation; NULL when out of memory. */
static float *widen(const uint16_t *a, size_t na, const uint16_t *b, size_t nb)
{
    float *f = malloc((na + nb ? na + nb : 1) * sizeof *f);
    if (!f) return NULL;
    for (size_t i = 0; i < na; i++) f[i] = ex_bf16_to_f32(a[i]);
    for (size_t i = 0; i < nb; i++) f[na + i] = ex_bf16_to_f32(b[i]);
    return f;
}

/* out[n, o] = inp[n, in] @ w[o, in]^T + b[o] */
void ex_cpu_linear_forward_bf16(float *out, const uint16_t *inp, const uint16_t *w, const float *b, int n, int in,
                                int o)
{
    if (n <= 0 || o <= 0) return;
    size_t ni = (size_t)n * (in > 0 ? in : 0), nw = (size_t)o * (in > 0 ? in : 0);
    float beta = 0.0f;
    if (b) {
        for (int r = 0; r < n; r++) memcpy(out + (size_t)r * o, b, (size_t)o * sizeof *b);
        beta = 1.0f;
    }
    float *f = widen(inp, ni, w, nw);
    if (f) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, in, 1.0f, f, in, f + ni, in, beta, out, o);
        free(f);
        return;
    }
    /* no memory for the temporaries (a kernel has no error path): the same sums, widening on the fly */
    for (int r = 0; r < n; r++)
        for (int j = 0; j < o; j++) {
            float acc = 0;
            for (int k = 0; k < in; k++)
                acc += ex_bf16_to_f32(inp[(size_t)r * in + k]) * ex_bf16_to_f32(w[(size_t)j * in + k]);
            out[(size_t)r * o + j] = beta * out[(size_t)r * o + j] + acc;
        }
}

/* dinp[n, in] += dout[n, o] @ w[o, in];  dw[o, in] += dout^T @ inp;  db[o] += sum_n dout (fp32) */
void ex_cpu_linear_backward_bf16(float *dinp, float *dw, float *db, const float *dout, const uint16_t *dout16,
                                 const uint16_t *inp, const uint16_t *w, int n, int in, int o)
{
    if (n <= 0 || o <= 0) return;
    size_t nd = (size_t)n * o, ni = (size_t)n * (in > 0 ? in : 0), nw = (size_t)o * (in > 0 ? in : 0);
    if (dinp && in > 0) {
        float *f = widen(dout16, nd, w, nw);
        if (f) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, o, 1.0f, f, o, f + nd, in, 1.0f, dinp, in);
        else
            for (int r = 0; r < n; r++)
                for (int k = 0; k < in; k++) {
                    float acc = 0;
                    for (int j = 0; j < o; j++)
                        acc += ex_bf16_to_f32(dout16[(size_t)r * o + j]) * ex_bf16_to_f32(w[(size_t)j * in + k]);
                    dinp[(size_t)r * in + k] += acc;
                }
        free(f);
    }
    if (dw && in > 0) {
        float *f = widen(dout16, nd, inp, ni);
        if (f) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, in, n, 1.0f, f, o, f + nd, in, 1.0f, dw, in);
        else
            for (int j = 0; j < o; j++)
                for (int k = 0; k < in; k++) {
                    float acc = 0;
                    for (int r = 0; r < n; r++)
                        acc += ex_bf16_to_f32(dout16[(size_t)r * o + j]) * ex_bf16_to_f32(inp[(size_t)r * in + k]);
                    dw[(size_t)j * in + k] += acc;
                }
        free(f);
    }
    if (db)
        for (int r = 0; r < n; r++)
            for (int j = 0; j < o; j++) db[j] += dout[(size_t)r * o + j];
}
