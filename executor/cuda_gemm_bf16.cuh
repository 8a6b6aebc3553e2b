/* bf16-mixed on the CUDA backend (included by cuda_kernels.cu): rounding to
 * bfloat16 and the linears as cublasGemmEx on CUDA_R_16BF A and B with
 * CUBLAS_COMPUTE_32F (fp32 accumulation, fp32 C): the cuBLAS documentation's
 * cublasGemmEx type table, "CUBLAS_COMPUTE_32F: CUDA_R_16BF A/B, CUDA_R_32F C".
 * The same column-major calls as cuda_linear_forward / _backward. */
#include "executor/bf16.h"

static __global__ void to_bf16_kernel(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) dst[i] = ex_bf16_from_f32(src[i]);
}

static void cuda_to_bf16(uint16_t *dst, const float *src, size_t n)
{
    if (n) EX_LAUNCH(to_bf16_kernel, grid_for(n, THREADS), THREADS, dst, src, n);
}

static __global__ void from_bf16_kernel(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) dst[i] = ex_bf16_to_f32(src[i]);
}

static void cuda_from_bf16(float *dst, const uint16_t *src, size_t n)
{
    if (n) EX_LAUNCH(from_bf16_kernel, grid_for(n, THREADS), THREADS, dst, src, n);
}

static void gemm_bf16(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C, int ldc,
                      const char *what)
{
    float one = 1.0f;
    note_blas(cublasGemmEx(h, ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C, CUDA_R_32F,
                           ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              what);
}

static void cuda_linear_forward_bf16(float *out, const uint16_t *inp, const uint16_t *w, const float *b, int n,
                                     int in, int o)
{
    if (n <= 0 || o <= 0) return;
    cublasHandle_t h = blas();
    if (!h) return;
    float beta = 0.0f;
    if (b) {
        EX_LAUNCH(fill_rows_kernel, grid_for((size_t)n * o, THREADS), THREADS, out, b, (size_t)n, o);
        beta = 1.0f;
    }
    int ld = in > 1 ? in : 1;
    gemm_bf16(h, CUBLAS_OP_T, CUBLAS_OP_N, o, n, in, w, ld, inp, ld, beta, out, o,
              "cublasGemmEx (linear_forward_bf16)");
}

static void cuda_linear_backward_bf16(float *dinp, float *dw, float *db, const float *dout, const uint16_t *dout16,
                                      const uint16_t *inp, const uint16_t *w, int n, int in, int o)
{
    if (n <= 0 || o <= 0) return;
    int ld = in > 1 ? in : 1;
    if ((dinp || dw) && in > 0) {
        cublasHandle_t h = blas();
        if (!h) return;
        if (dinp) gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_N, in, n, o, w, ld, dout16, o, 1.0f, dinp, ld,
                            "cublasGemmEx (linear_backward_bf16 dinp)");
        if (dw) gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_T, in, o, n, inp, ld, dout16, o, 1.0f, dw, ld,
                          "cublasGemmEx (linear_backward_bf16 dw)");
    }
    if (db) column_sum(db, dout, NULL, NULL, NULL, n, o);
}
