/* tests/cudaemu_lt.h (included by tests/cudaemu.h): the cuBLASLt calls of
 * the CUDA backend's GEMMs (executor/cuda_gemm.cuh), through OpenBLAS.
 *
 *  - cublasLtCreate, cublasLtMatmulDescCreate / SetAttribute (TRANSA,
 *    TRANSB, EPILOGUE, BIAS_POINTER) / Destroy, cublasLtMatrixLayoutCreate /
 *    Destroy and cublasLtMatmul (column-major, D = alpha op(A) op(B) + beta C,
 *    with the library's argument checks: layouts that match the shapes,
 *    compute CUBLAS_COMPUTE_32F or _32F_FAST_TF32 with an fp32 scale);
 *  - operands: CUDA_R_16BF A and B are widened exactly to fp32; CUDA_R_32F
 *    ones are used as they are, or, under CUBLAS_COMPUTE_32F_FAST_TF32,
 *    rounded to TF32 first (executor/tf32.h), as the tensor cores read them;
 *    then one cblas_sgemm (fp32 products of bf16 or TF32 values are exact;
 *    the sums accumulate in fp32, as on the GPU up to order). C and D are
 *    CUDA_R_32F or CUDA_R_16BF (read widened; D rounded to bf16 at the end,
 *    executor/bf16.h);
 *  - epilogues: DEFAULT; BIAS (D[i, j] += bias[i], i < m, after the sums);
 *    BGRADB (bias[j] = sum_k op(B)[k, j] of the operands as read, fp32,
 *    stored). With DHP_EMU_LT_EPILOGUES=0 every epilogue but DEFAULT is
 *    CUBLAS_STATUS_NOT_SUPPORTED (a library without such a kernel: the
 *    backend's unfused path);
 *  - the device-pointer guard (CUDAEMU_GUARD) on A, B, C, D and the bias. */
#ifndef DHP_TESTS_CUDAEMU_LT_H
#define DHP_TESTS_CUDAEMU_LT_H

#include "executor/bf16.h"
#include "executor/tf32.h"

typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

struct cudaemu_lt { int unused; };
typedef struct cudaemu_lt *cublasLtHandle_t;
struct cudaemu_lt_desc {
    cublasComputeType_t compute;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    void *bias = nullptr;
};
typedef struct cudaemu_lt_desc *cublasLtMatmulDesc_t;
struct cudaemu_lt_layout {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};
typedef struct cudaemu_lt_layout *cublasLtMatrixLayout_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;

static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    static cudaemu_lt the_handle;
    *handle = &the_handle;
    return CUBLAS_STATUS_SUCCESS;
}

static inline const char *cublasLtGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    }
    return "unknown error";
}

static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                                      cudaDataType scale)
{
    if ((compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) || scale != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *desc = new cudaemu_lt_desc{compute};
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                            cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                            size_t size)
{
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        if (size != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        int32_t op;
        std::memcpy(&op, buf, sizeof op);
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? desc->ta : desc->tb) = (cublasOperation_t)op;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        std::memcpy(&desc->epilogue, buf, sizeof desc->epilogue);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (size != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        std::memcpy(&desc->bias, buf, sizeof desc->bias);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_INVALID_VALUE;
}

static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                                        uint64_t rows, uint64_t cols, int64_t ld)
{
    if (type != CUDA_R_32F && type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < (int64_t)(rows > 1 ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = new cudaemu_lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

/* A column-major matrix as fp32 (ld kept): bf16 widened, fp32 copied or rounded to TF32. */
static inline std::vector<float> cudaemu_lt_read(const void *p, const cudaemu_lt_layout *l, bool tf32)
{
    size_t n = l->rows && l->cols ? (size_t)l->ld * (l->cols - 1) + l->rows : 0;
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++)
        f[i] = l->type == CUDA_R_16BF ? ex_bf16_to_f32(((const uint16_t *)p)[i])
               : tf32                 ? ex_tf32_round(((const float *)p)[i])
                                      : ((const float *)p)[i];
    return f;
}

static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                                            const void *A, cublasLtMatrixLayout_t la, const void *B,
                                            cublasLtMatrixLayout_t lb, const void *beta, const void *C,
                                            cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld,
                                            const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                                            cudaStream_t stream)
{
    (void)algo; (void)workspace; (void)workspace_bytes; (void)stream;
    if (!handle || !desc || !la || !lb || !lc || !ld) return CUBLAS_STATUS_NOT_INITIALIZED;
    bool an = desc->ta == CUBLAS_OP_N, bn = desc->tb == CUBLAS_OP_N;
    uint64_t m = an ? la->rows : la->cols, k = an ? la->cols : la->rows;
    uint64_t n = bn ? lb->cols : lb->rows, kb = bn ? lb->rows : lb->cols;
    if (kb != k || lc->rows != m || lc->cols != n || ld->rows != m || ld->cols != n || la->type != lb->type ||
        lc->type != ld->type)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (lc->ld != ld->ld) return CUBLAS_STATUS_NOT_SUPPORTED;   /* the emulator's one limit: C and D share ld */
    uint32_t epi = desc->epilogue;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT && epi != CUBLASLT_EPILOGUE_BIAS && epi != CUBLASLT_EPILOGUE_BGRADB)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT && cudaemu_env_num("DHP_EMU_LT_EPILOGUES", 1) == 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT && !desc->bias) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    cudaemu_issue();   /* work on the compute stream: queued copies first, counted (cudaemu.h) */
    cudaemu_guard("cublasLtMatmul", "A", A);
    cudaemu_guard("cublasLtMatmul", "B", B);
    cudaemu_guard("cublasLtMatmul", "C", C);
    cudaemu_guard("cublasLtMatmul", "D", D);
    if (desc->bias) cudaemu_guard("cublasLtMatmul", "bias", desc->bias);
    bool tf32 = desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && la->type == CUDA_R_32F;
    std::vector<float> a = cudaemu_lt_read(A, la, tf32), b = cudaemu_lt_read(B, lb, tf32);
    std::vector<float> d = C ? cudaemu_lt_read(C, lc, false) : std::vector<float>((size_t)ld->ld * (n - 1) + m);
    cblas_sgemm(CblasColMajor, an ? CblasNoTrans : CblasTrans, bn ? CblasNoTrans : CblasTrans, (int)m, (int)n, (int)k,
                *(const float *)alpha, a.data(), (int)la->ld, b.data(), (int)lb->ld, *(const float *)beta, d.data(),
                (int)ld->ld);
    if (epi == CUBLASLT_EPILOGUE_BIAS)
        for (uint64_t j = 0; j < n; j++)
            for (uint64_t i = 0; i < m; i++) d[j * ld->ld + i] += ((const float *)desc->bias)[i];
    if (epi == CUBLASLT_EPILOGUE_BGRADB)
        for (uint64_t j = 0; j < n; j++) {
            float s = 0;
            for (uint64_t q = 0; q < k; q++) s += bn ? b[j * lb->ld + q] : b[q * lb->ld + j];
            ((float *)desc->bias)[j] = s;
        }
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            size_t at = j * ld->ld + i;
            if (ld->type == CUDA_R_16BF) ((uint16_t *)D)[at] = ex_bf16_from_f32(d[at]);
            else ((float *)D)[at] = d[at];
        }
    return CUBLAS_STATUS_SUCCESS;
}

#endif
