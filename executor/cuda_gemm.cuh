/* The CUDA backend's GEMMs (included by executor/cuda_kernels.cu after its
 * helpers): every linear, fp32 and bf16, through cublasLtMatmul with fp32
 * accumulation (CUBLAS_COMPUTE_32F; fp32 with --tf32:
 * CUBLAS_COMPUTE_32F_FAST_TF32, "allows down-converting inputs to TF32",
 * cublas_api.h), fp32 C and D, and the column sums the linears and the
 * norms share. The math is executor/cpu_kernels.c's (shapes in
 * executor/backend.h); row-major tensors are seen column-major:
 *   forward  out^T[o, n] = w^T ... : D = op_T(w [in, o]) inp [in, n],   m o, n n, k in
 *   dinp     dinp^T[in, n]        : D = w [in, o] dout^T [o, n],        m in, n n, k o, beta 1
 *   dw       dw^T[in, o]          : D = inp [in, n] op_T(dout [o, n]),  m in, n o, k n, beta 1
 * Fused where the epilogue fits the layout (cuBLASLt's cublasLtEpilogue_t,
 * cublasLt.h): the forward's bias is CUBLASLT_EPILOGUE_BIAS (a vector of D's
 * rows, o, broadcast over the columns: no fill of out before the GEMM), and
 * exact fp32's bias gradient is CUBLASLT_EPILOGUE_BGRADB on the dw GEMM (the sum of
 * B = dout over k = n, a vector of D's columns, o: no second pass over
 * dout). BGRADB stores, and the kernels' rule is to accumulate, so it lands
 * in a device vector that one add puts into db (the backend's own, of
 * PLAN_CUDA_BGRAD_FLOATS floats: a linear of more outputs runs unfused). bf16 and TF32 keep their
 * bias gradient on the fp32 dout (executor/backend.h): the GEMM's B is the
 * bf16 copy, or read as TF32, whose sum would be a different gradient. A combination cuBLASLt has
 * no kernel for (CUBLAS_STATUS_NOT_SUPPORTED) is remembered and runs unfused:
 * the bias filled into out before the GEMM (beta 1), the column sum after. */

/* The workspace and the bias-gradient vector are parts of the backend's own
 * buffers (backend_workspace; sizes in planner/backend.h, whose memory model
 * counts them, category workspace, for the CUDA backend). */

static void note_blas(cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS) note_failure(what, lt_api.cublasLtGetStatusString(s));
}

static struct {
    std::once_flag once;
    cublasLtHandle_t handle;
    cublasStatus_t status;
    void *workspace;                /* backend_workspace's first part; NULL after a failed allocation (noted) */
    size_t workspace_bytes;
    unsigned refused;               /* fused combinations cuBLASLt has no kernel for (lt_key bits) */
    bool tf32;                      /* fp32 GEMMs on TF32 tensor cores (dhp run --tf32) */
} g_lt;

/* The cuBLASLt handle and workspace, created on first use (on the device
 * current then). */
static cublasLtHandle_t lt(void)
{
    std::call_once(g_lt.once, [] {
        g_lt.status = lt_api.cublasLtCreate(&g_lt.handle);
        if (g_lt.status != CUBLAS_STATUS_SUCCESS) return;
        g_lt.workspace = backend_workspace();
        g_lt.workspace_bytes = g_lt.workspace ? PLAN_CUDA_LT_WORKSPACE_BYTES : 0;
    });
    if (g_lt.status != CUBLAS_STATUS_SUCCESS) note_blas(g_lt.status, "cublasLtCreate");
    return g_lt.status == CUBLAS_STATUS_SUCCESS ? g_lt.handle : NULL;
}

static void cuda_set_tf32(bool on) { g_lt.tf32 = on; }

/* One GEMM: D[m, n] = op(A)[m, k] op(B)[k, n] + beta D, column-major, A and
 * B of type ab (CUDA_R_32F or CUDA_R_16BF), D fp32 with leading dimension m;
 * epi with its vector (BIAS: reads bias[m]; BGRADB: writes bias[n]). */
typedef struct {
    cublasOperation_t ta, tb;
    int m, n, k;
    cudaDataType ab;
    const void *A, *B;
    int lda, ldb;
    float beta;
    float *D;
    cublasLtEpilogue_t epi;
    void *bias;
} lt_gemm;

static cublasStatus_t lt_matmul(const lt_gemm *g)
{
    cublasLtHandle_t h = lt();
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasComputeType_t compute = g->ab == CUDA_R_32F && g_lt.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasStatus_t s = lt_api.cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F);
    uint32_t epi = g->epi;
    if (!s) s = lt_api.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g->ta, sizeof g->ta);
    if (!s) s = lt_api.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g->tb, sizeof g->tb);
    if (!s) s = lt_api.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (!s && g->bias) s = lt_api.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias);
    bool an = g->ta == CUBLAS_OP_N, bn = g->tb == CUBLAS_OP_N;
    if (!s) s = lt_api.cublasLtMatrixLayoutCreate(&la, g->ab, an ? g->m : g->k, an ? g->k : g->m, g->lda);
    if (!s) s = lt_api.cublasLtMatrixLayoutCreate(&lb, g->ab, bn ? g->k : g->n, bn ? g->n : g->k, g->ldb);
    if (!s) s = lt_api.cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, g->m, g->n, g->m);
    float one = 1.0f;
    if (!s)
        s = lt_api.cublasLtMatmul(h, desc, &one, g->A, la, g->B, lb, &g->beta, g->D, ld, g->D, ld, NULL, g_lt.workspace,
                           g_lt.workspace_bytes, 0);
    if (ld) lt_api.cublasLtMatrixLayoutDestroy(ld);
    if (lb) lt_api.cublasLtMatrixLayoutDestroy(lb);
    if (la) lt_api.cublasLtMatrixLayoutDestroy(la);
    if (desc) lt_api.cublasLtMatmulDescDestroy(desc);
    return s;
}

/* The bit of g's fused combination (epilogue, operand type, compute) in g_lt.refused. */
static unsigned lt_key(const lt_gemm *g)
{
    return 1u << ((g->epi == CUBLASLT_EPILOGUE_BIAS ? 0 : 4) + (g->ab == CUDA_R_16BF ? 2 : 0) + (g_lt.tf32 ? 1 : 0));
}

/* Runs g fused; false (nothing done) where cuBLASLt has no kernel for its
 * combination, which is then not tried again. */
static bool lt_fused(const lt_gemm *g, const char *what)
{
    if (g_lt.refused & lt_key(g)) return false;
    cublasStatus_t s = lt_matmul(g);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
        g_lt.refused |= lt_key(g);
        return false;
    }
    note_blas(s, what);
    return true;
}

/* The device vector of o floats for BGRADB's stored bias gradient: the last
 * part of the backend's own buffers; NULL for a linear of more outputs than
 * it holds (PLAN_CUDA_BGRAD_FLOATS), or when out of memory (noted). */
static float *bgrad_buffer(int o)
{
    if (o > PLAN_CUDA_BGRAD_FLOATS) return NULL;
    char *ws = backend_workspace();
    return ws ? (float *)(ws + PLAN_CUDA_LT_WORKSPACE_BYTES + PLAN_CUDA_REDUCE_BYTES) : NULL;
}

/* Column sums over rows: dst[j] += sum_r a[r, j] * (x ? xhat[r, j] : 1), a[n, d],
 * xhat = x * rstd (RMSNorm) or (x - mean) * rstd (LayerNorm, mean given).
 * A block takes 32 columns; its 4 row lanes sum rows lane, lane + 4, ...
 * and lane 0 adds the 4 partials in order. (Linear db; the norms' dw.) */
#define COL_WIDTH 32
#define COL_LANES (THREADS / COL_WIDTH)
static __global__ void column_sum_kernel(float *dst, const float *a, const float *x, const float *mean,
                                         const float *rstd, int n, int d)
{
    __shared__ float part[COL_LANES][COL_WIDTH];
    int c = threadIdx.x % COL_WIDTH, lane = threadIdx.x / COL_WIDTH;
    for (int j0 = blockIdx.x * COL_WIDTH; j0 < d; j0 += gridDim.x * COL_WIDTH) {
        int j = j0 + c;
        float s = 0;
        if (j < d)
            for (int r = lane; r < n; r += COL_LANES) {
                size_t o = (size_t)r * d + j;
                s += x ? a[o] * ((mean ? x[o] - mean[r] : x[o]) * rstd[r]) : a[o];
            }
        part[lane][c] = s;
        __syncthreads();
        if (lane == 0 && j < d) {
            float total = 0;
            for (int l = 0; l < COL_LANES; l++) total += part[l][c];
            dst[j] += total;
        }
        __syncthreads();
    }
}

static void column_sum(float *dst, const float *a, const float *x, const float *mean, const float *rstd, int n,
                       int d)
{
    EX_LAUNCH(column_sum_kernel, grid_for((size_t)d, COL_WIDTH), THREADS, dst, a, x, mean, rstd, n, d);
}

/* out[n, o] = inp[n, in] @ w[o, in]^T + b[o] (b may be NULL), operands of type ab. */
static void linear_forward_lt(float *out, const void *inp, const void *w, const float *b, int n, int in, int o,
                              cudaDataType ab, const char *what)
{
    if (n <= 0 || o <= 0) return;
    int ld = in > 1 ? in : 1;
    lt_gemm g = {CUBLAS_OP_T, CUBLAS_OP_N, o, n, in, ab, w, inp, ld, ld, 0.0f, out, CUBLASLT_EPILOGUE_BIAS, (void *)b};
    if (b && in > 0 && lt_fused(&g, what)) return;
    g.epi = CUBLASLT_EPILOGUE_DEFAULT;
    g.bias = NULL;
    if (b) {
        EX_LAUNCH(fill_rows_kernel, grid_for((size_t)n * o, THREADS), THREADS, out, b, (size_t)n, o);
        g.beta = 1.0f;
    }
    if (in > 0) note_blas(lt_matmul(&g), what);
    else if (!b) cuda_zero(out, (size_t)n * o);
}

/* dinp[n, in] += dout[n, o] @ w[o, in];  dw[o, in] += dout^T @ inp;  db[o] += sum_n dout
 * (the GEMMs read dout_ab, of type ab; db sums the fp32 dout, fused into the
 * dw GEMM where dout_ab is dout itself). */
static void linear_backward_lt(float *dinp, float *dw, float *db, const float *dout, const void *dout_ab,
                               const void *inp, const void *w, int n, int in, int o, cudaDataType ab,
                               const char *what_dinp, const char *what_dw)
{
    if (n <= 0 || o <= 0) return;
    int ld = in > 1 ? in : 1;
    if (dinp && in > 0) {
        lt_gemm g = {CUBLAS_OP_N, CUBLAS_OP_N, in, n, o, ab, w, dout_ab, ld, o, 1.0f, dinp, CUBLASLT_EPILOGUE_DEFAULT, NULL};
        note_blas(lt_matmul(&g), what_dinp);
    }
    if (dw && in > 0) {
        lt_gemm g = {CUBLAS_OP_N, CUBLAS_OP_T, in, o, n, ab, inp, dout_ab, ld, o, 1.0f, dw, CUBLASLT_EPILOGUE_BGRADB, NULL};
        float *bg = db && dout_ab == (const void *)dout && !g_lt.tf32 ? bgrad_buffer(o) : NULL;
        if (bg) {
            g.bias = bg;
            if (lt_fused(&g, what_dw)) {
                cuda_add_inplace(db, bg, (size_t)o);
                return;
            }
        }
        g.epi = CUBLASLT_EPILOGUE_DEFAULT;
        g.bias = NULL;
        note_blas(lt_matmul(&g), what_dw);
    }
    if (db) column_sum(db, dout, NULL, NULL, NULL, n, o);
}

static void cuda_linear_forward(float *out, const float *inp, const float *w, const float *b, int n, int in, int o)
{
    linear_forward_lt(out, inp, w, b, n, in, o, CUDA_R_32F, "cublasLtMatmul (linear_forward)");
}

static void cuda_linear_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                 const float *w, int n, int in, int o)
{
    linear_backward_lt(dinp, dw, db, dout, dout, inp, w, n, in, o, CUDA_R_32F, "cublasLtMatmul (linear_backward dinp)",
                       "cublasLtMatmul (linear_backward dw)");
}

/* ------------------------------------------------------------ bf16 */

/* bf16-mixed: rounding to bfloat16 (executor/bf16.h) and the linears on
 * CUDA_R_16BF A and B with CUBLAS_COMPUTE_32F and fp32 C/D (cuBLASLt's
 * cublasLtMatmul data-type table: "CUBLAS_COMPUTE_32F, CUDA_R_32F scale,
 * CUDA_R_16BF A/B, CUDA_R_32F C/D"). */
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

static void cuda_linear_forward_bf16(float *out, const uint16_t *inp, const uint16_t *w, const float *b, int n,
                                     int in, int o)
{
    linear_forward_lt(out, inp, w, b, n, in, o, CUDA_R_16BF, "cublasLtMatmul (linear_forward_bf16)");
}

static void cuda_linear_backward_bf16(float *dinp, float *dw, float *db, const float *dout, const uint16_t *dout16,
                                      const uint16_t *inp, const uint16_t *w, int n, int in, int o)
{
    linear_backward_lt(dinp, dw, db, dout, dout16, inp, w, n, in, o, CUDA_R_16BF,
                       "cublasLtMatmul (linear_backward_bf16 dinp)", "cublasLtMatmul (linear_backward_bf16 dw)");
}
