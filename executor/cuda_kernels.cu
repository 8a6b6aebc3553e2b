/* CUDA backend: the kernels of executor/backend.h on device pointers, with the
 * math of executor/cpu_kernels.c (same shapes, accumulate rules, NULL
 * gradients, lse, cu_seqlens / GQA / causal, vocab shards, cross-entropy
 * pieces, AdamW, RoPE layout). Linears are cuBLAS fp32 sgemm; the rest are
 * own kernels. Shapes and math of each kernel are stated above it.
 *
 *  - Every pointer is a device pointer: tensors, and also cu_seqlens (nseq + 1
 *    ints), tokens, targets and the rows of gather_rows / scatter_add_rows.
 *    The attention kernels read cu_seqlens on the
 *    device, so no call waits for the host (the grid strides over the tiles of
 *    each sequence instead of being sized from the lengths).
 *  - Kernels launch asynchronously on the legacy default stream (stream 0);
 *    sumsq and cross_entropy copy their partial sums back (synchronous) and
 *    add them on the host in a fixed order.
 *  - Results do not depend on timing: every output element is owned by one
 *    thread and sums run in a fixed order, except embedding_backward, which
 *    adds with atomicAdd (repeated tokens are summed in an arbitrary order).
 *  - Block reductions go through shared memory (no warp shuffles) and every
 *    thread of a block reaches every __syncthreads, so the same source runs
 *    under the CPU emulator of the tests (tests/cudaemu.h, EX_CUDA_EMU), where
 *    the entry points are named ex_backend_cuda_emu / ex_cuda_sync_emu.
 *  - Failures (a launch, a cuBLAS call, an allocation, a bad shape) are kept
 *    as a sticky first error that ex_cuda_sync reports and clears. */
#ifndef EX_CUDA_EMU
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define EX_LAUNCH_RAW(kernel, grid, block, ...) kernel<<<(grid), (block)>>>(__VA_ARGS__)
#else
#define ex_backend_cuda ex_backend_cuda_emu
#define ex_cuda_sync ex_cuda_sync_emu
#define EX_LAUNCH_RAW(kernel, grid, block, ...) cudaemu_launch(kernel, (grid), (block), __VA_ARGS__)
#endif

extern "C" {
#include "executor/backend.h"
#include "util/util.h"
}

#include <math.h>
#include <mutex>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Threads per block of every kernel. */
#define THREADS 128
/* Grid caps: kernels stride over their elements / rows / tiles, so a grid never
 * needs more blocks than this. The emulator uses small caps so the tests, with
 * their small inputs, run the striding loops too. */
#ifndef EX_CUDA_EMU
#define GRID_CAP 65535
#define SUMSQ_BLOCKS 256
#define CE_BLOCKS 1024
#define ATT_TARGET_BLOCKS 2048
#else
#define GRID_CAP 16
#define SUMSQ_BLOCKS 8
#define CE_BLOCKS 4
#define ATT_TARGET_BLOCKS 24
#endif
/* Doubles of the device scratch buffer (sumsq and cross_entropy partial sums). */
#define SCRATCH_DOUBLES (SUMSQ_BLOCKS > CE_BLOCKS ? SUMSQ_BLOCKS : CE_BLOCKS)
#define SQRT1_2 0.70710678118654752440

/* ------------------------------------------------------------ sticky error */

static struct {
    std::mutex mu;
    bool failed;
    char msg[UTIL_ERR_LEN];
} g_error;

/* Keeps the first failure since the last ex_cuda_sync. */
static void note_failure(const char *what, const char *why)
{
    std::lock_guard<std::mutex> lock(g_error.mu);
    if (g_error.failed) return;
    g_error.failed = true;
    snprintf(g_error.msg, sizeof g_error.msg, "cuda: %s: %s", what, why);
}

static void note_cuda(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) note_failure(what, cudaGetErrorString(e));
}

static void note_blas(cublasStatus_t s, const char *what)
{
    if (s != CUBLAS_STATUS_SUCCESS) note_failure(what, cublasGetStatusString(s));
}

/* Moves the sticky error into msg and clears it; false when there is none. */
static bool take_failure(char *msg, size_t len)
{
    std::lock_guard<std::mutex> lock(g_error.mu);
    if (!g_error.failed) return false;
    snprintf(msg, len, "%s", g_error.msg);
    g_error.failed = false;
    return true;
}

/* Launches kernel<<<grid, block>>>(args...) and notes a launch error. */
#define EX_LAUNCH(kernel, grid, block, ...)                      \
    do {                                                         \
        EX_LAUNCH_RAW(kernel, grid, block, __VA_ARGS__);         \
        note_cuda(cudaGetLastError(), "launch of " #kernel);     \
    } while (0)

/* ------------------------------------------------------------ handles */

static cublasStatus_t g_blas_status;

static cublasHandle_t create_blas(void)
{
    cublasHandle_t h = NULL;
    g_blas_status = cublasCreate(&h);
    return g_blas_status == CUBLAS_STATUS_SUCCESS ? h : NULL;
}

/* The cuBLAS handle, created on first use (on the device current then). */
static cublasHandle_t blas(void)
{
    static cublasHandle_t handle = create_blas();
    if (!handle) note_blas(g_blas_status, "cublasCreate");
    return handle;
}

static double *create_scratch(void)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, SCRATCH_DOUBLES * sizeof(double));
    note_cuda(e, "cudaMalloc of the reduction scratch");
    return e == cudaSuccess ? (double *)p : NULL;
}

/* Device buffer of SCRATCH_DOUBLES doubles, allocated on first use. */
static double *scratch(void)
{
    static double *buf = create_scratch();
    if (!buf) note_failure("reduction scratch", "not allocated");
    return buf;
}

/* ------------------------------------------------------------ helpers */

static __host__ __device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

/* Blocks for items work items at per_block items a block, 1 .. GRID_CAP. */
static unsigned grid_for(size_t items, size_t per_block)
{
    size_t b = (items + per_block - 1) / per_block;
    return b < 1 ? 1 : b > GRID_CAP ? GRID_CAP : (unsigned)b;
}

/* First index of a grid-stride loop and its stride. */
static __device__ __forceinline__ size_t gs_first(void) { return (size_t)blockIdx.x * blockDim.x + threadIdx.x; }
static __device__ __forceinline__ size_t gs_stride(void) { return (size_t)gridDim.x * blockDim.x; }

/* Block reduction (THREADS threads): every thread passes v and gets op over
 * the block's values, combined in a fixed tree order. */
template <typename T, typename Op>
static __device__ T block_reduce(T v, Op op)
{
    __shared__ T buf[THREADS];
    int t = threadIdx.x;
    buf[t] = v;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] = op(buf[t], buf[t + s]);
        __syncthreads();
    }
    T r = buf[0];
    __syncthreads();
    return r;
}

struct sum_op { __device__ double operator()(double a, double b) const { return a + b; } };
struct max_op { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };

static __device__ double block_sum(double v) { return block_reduce(v, sum_op()); }
static __device__ float block_max(float v) { return block_reduce(v, max_op()); }

/* ------------------------------------------------------------ element-wise */

/* y[i] += x[i], i < n */
static __global__ void add_kernel(float *y, const float *x, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) y[i] += x[i];
}

/* y[i] *= s, i < n */
static __global__ void scale_kernel(float *y, float s, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) y[i] *= s;
}

/* y[r, j] += b[j], y[n, d] */
static __global__ void add_bias_kernel(float *y, const float *b, size_t n, int d)
{
    for (size_t i = gs_first(); i < n * d; i += gs_stride()) y[i] += b[i % d];
}

/* y[r, j] = b[j], y[n, d] (the bias a linear's sgemm then adds to) */
static __global__ void fill_rows_kernel(float *y, const float *b, size_t n, int d)
{
    for (size_t i = gs_first(); i < n * d; i += gs_stride()) y[i] = b[i % d];
}

static void cuda_zero(float *x, size_t n)
{
    if (n) note_cuda(cudaMemsetAsync(x, 0, n * sizeof *x, 0), "cudaMemsetAsync (zero)");
}

/* dst = src; the two do not overlap (or are the same buffer). */
static void cuda_copy(float *dst, const float *src, size_t n)
{
    if (n && dst != src)
        note_cuda(cudaMemcpyAsync(dst, src, n * sizeof *dst, cudaMemcpyDefault, 0), "cudaMemcpyAsync (copy)");
}

static void cuda_add_inplace(float *y, const float *x, size_t n)
{
    if (n) EX_LAUNCH(add_kernel, grid_for(n, THREADS), THREADS, y, x, n);
}

static void cuda_add_bias(float *y, const float *b, int n, int d)
{
    if (n > 0 && d > 0) EX_LAUNCH(add_bias_kernel, grid_for((size_t)n * d, THREADS), THREADS, y, b, (size_t)n, d);
}

static void cuda_scale_inplace(float *y, float s, size_t n)
{
    if (n) EX_LAUNCH(scale_kernel, grid_for(n, THREADS), THREADS, y, s, n);
}

/* sumsq partials: part[block] = sum of x[i]^2 (double) over the block's
 * grid-stride share of i < n */
static __global__ void sumsq_kernel(double *part, const float *x, size_t n)
{
    double s = 0;
    for (size_t i = gs_first(); i < n; i += gs_stride()) s += (double)x[i] * x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* Adds the first count doubles of the scratch buffer on the host, in order. */
static double sum_partials(const double *part, unsigned count)
{
    double host[SCRATCH_DOUBLES];
    cudaError_t e = cudaMemcpy(host, part, count * sizeof(double), cudaMemcpyDeviceToHost);
    note_cuda(e, "cudaMemcpy of partial sums");
    if (e != cudaSuccess) return NAN;
    double s = 0;
    for (unsigned b = 0; b < count; b++) s += host[b];
    return s;
}

/* sum_i x[i]^2, in double; waits for the device. */
static double cuda_sumsq(const float *x, size_t n)
{
    double *part = scratch();
    if (!part) return NAN;
    if (!n) return 0;
    unsigned blocks = grid_for(n, THREADS);
    if (blocks > SUMSQ_BLOCKS) blocks = SUMSQ_BLOCKS;
    EX_LAUNCH(sumsq_kernel, blocks, THREADS, part, x, n);
    return sum_partials(part, blocks);
}

/* ------------------------------------------------------------ linear */

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

/* linear: out[n, o] = inp[n, i] @ w[o, i]^T + b[o]   (b may be NULL).
 * Column-major view: out^T[o, n] = w^T... i.e. sgemm(T, N, o, n, i, w, i, inp, i, out, o),
 * after filling out's rows with b (beta = 1) when there is a bias. */
static void cuda_linear_forward(float *out, const float *inp, const float *w, const float *b,
                                int n, int in, int o)
{
    if (n <= 0 || o <= 0) return;
    cublasHandle_t h = blas();
    if (!h) return;
    float one = 1.0f, beta = 0.0f;
    if (b) {
        EX_LAUNCH(fill_rows_kernel, grid_for((size_t)n * o, THREADS), THREADS, out, b, (size_t)n, o);
        beta = 1.0f;
    }
    int ld = in > 1 ? in : 1;
    note_blas(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, o, n, in, &one, w, ld, inp, ld, &beta, out, o),
              "cublasSgemm (linear_forward)");
}

/* linear backward: dinp[n, i] += dout[n, o] @ w[o, i];  dw[o, i] += dout^T @ inp;
 * db[o] += sum_n dout[n, o]. Column-major:
 * dinp: sgemm(N, N, i, n, o, w, i, dout, o, beta 1, dinp, i);
 * dw:   sgemm(N, T, i, o, n, inp, i, dout, o, beta 1, dw, i). */
static void cuda_linear_backward(float *dinp, float *dw, float *db, const float *dout,
                                 const float *inp, const float *w, int n, int in, int o)
{
    if (n <= 0 || o <= 0) return;
    float one = 1.0f;
    int ld = in > 1 ? in : 1;
    if (dinp || dw) {
        cublasHandle_t h = blas();
        if (!h) return;
        if (dinp && in > 0)
            note_blas(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in, n, o, &one, w, ld, dout, o, &one, dinp, ld),
                      "cublasSgemm (linear_backward dinp)");
        if (dw && in > 0)
            note_blas(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in, o, n, &one, inp, ld, dout, o, &one, dw, ld),
                      "cublasSgemm (linear_backward dw)");
    }
    if (db) column_sum(db, dout, NULL, NULL, NULL, n, o);
}

/* ------------------------------------------------------------ RMSNorm */

/* RMSNorm, a block per row r (rows strided over the grid), inp/out[n, d]:
 * rstd[r] = 1 / sqrt(mean_j x[r, j]^2 + eps) (sum in double);
 * out[r, j] = x[r, j] * rstd[r] * w[j] */
static __global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *inp, const float *w,
                                              int n, int d, float eps)
{
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *x = inp + (size_t)r * d;
        float *y = out + (size_t)r * d;
        double ss = 0;
        for (int j = threadIdx.x; j < d; j += THREADS) ss += (double)x[j] * x[j];
        ss = block_sum(ss);
        float s = (float)(1.0 / sqrt(ss / d + eps));
        if (threadIdx.x == 0) rstd[r] = s;
        for (int j = threadIdx.x; j < d; j += THREADS) y[j] = x[j] * s * w[j];
    }
}

/* RMSNorm backward of the input, a block per row r, xhat = x * rstd, gw = dout * w:
 * dinp[r, j] += rstd[r] * (gw[r, j] - xhat[r, j] * mean_k(gw[r, k] * xhat[r, k]))
 * (the mean summed in double) */
static __global__ void rmsnorm_backward_kernel(float *dinp, const float *dout, const float *inp,
                                               const float *w, const float *rstd, int n, int d)
{
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *x = inp + (size_t)r * d, *g = dout + (size_t)r * d;
        float s = rstd[r];
        double dot = 0;
        for (int j = threadIdx.x; j < d; j += THREADS) dot += (double)g[j] * w[j] * x[j] * s;
        dot = block_sum(dot);
        float mean = (float)(dot / d);
        for (int j = threadIdx.x; j < d; j += THREADS)
            dinp[(size_t)r * d + j] += s * (g[j] * w[j] - x[j] * s * mean);
    }
}

static void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w,
                                 int n, int d, float eps)
{
    if (n > 0 && d > 0) EX_LAUNCH(rmsnorm_forward_kernel, grid_for((size_t)n, 1), THREADS, out, rstd, inp, w, n, d, eps);
}

/* dw[j] += sum_r dout[r, j] * xhat[r, j] (column sums); dinp as the kernel above. */
static void cuda_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                  const float *w, const float *rstd, int n, int d)
{
    if (n <= 0 || d <= 0) return;
    if (dw) column_sum(dw, dout, inp, NULL, rstd, n, d);
    if (dinp) EX_LAUNCH(rmsnorm_backward_kernel, grid_for((size_t)n, 1), THREADS, dinp, dout, inp, w, rstd, n, d);
}

/* ------------------------------------------------------------ LayerNorm, conv stem, pooling */

#include "executor/cuda_kernels_whisper.cuh"

/* ------------------------------------------------------------ RoPE */

/* RoPE, rotate-half pairing, in place on x[n, nh, hd], cos/sin[n, hd/2]; one
 * thread per pair (t, h, i < hd/2): a = x[t, h, i], b = x[t, h, i + hd/2],
 * c = cos[t, i], s = dir * sin[t, i]:  a' = a c - b s;  b' = b c + a s.
 * dir = 1 is the forward rotation, dir = -1 its transpose (the backward:
 * da = ga c + gb s;  db = gb c - ga s). */
static __global__ void rope_kernel(float *x, const float *cos, const float *sin, int n, int nh, int hd,
                                   float dir)
{
    int half = hd / 2;
    size_t pairs = (size_t)n * nh * half;
    for (size_t e = gs_first(); e < pairs; e += gs_stride()) {
        size_t i = e % half, th = e / half, t = th / nh;
        float *v = x + th * hd;
        float c = cos[t * half + i], s = dir * sin[t * half + i];
        float a = v[i], b = v[i + half];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
    }
}

static void rope(float *x, const float *cos, const float *sin, int n, int nh, int hd, float dir)
{
    size_t pairs = (size_t)(n > 0 ? n : 0) * (nh > 0 ? nh : 0) * (hd > 1 ? hd / 2 : 0);
    if (pairs) EX_LAUNCH(rope_kernel, grid_for(pairs, THREADS), THREADS, x, cos, sin, n, nh, hd, dir);
}

static void cuda_rope_forward(float *x, const float *cos, const float *sin, int n, int nh, int hd)
{
    rope(x, cos, sin, n, nh, hd, 1.0f);
}

static void cuda_rope_backward(float *dx, const float *cos, const float *sin, int n, int nh, int hd)
{
    rope(dx, cos, sin, n, nh, hd, -1.0f);
}

/* ------------------------------------------------------------ attention
 * Flash-style tiles of TILE query rows x TILE key rows of one (sequence, head),
 * head_dim handled in chunks of TILE columns, so shared memory (3 to 6 tiles
 * of 4 KiB) does not grow with head_dim. A block of THREADS threads owns, for a score tile, the
 * entries (r = t % TILE, j = t / TILE + STEP e), e < PER, and for a tile of
 * outputs / gradients the entries (row = t / TILE + STEP e, column = t % TILE):
 * every output element is written by one thread, in a fixed order.
 * Grids are (nseq, heads, Y): block z takes the tiles z, z + Y, ... of its
 * sequence (the lengths live on the device), Y = ATT_TARGET_BLOCKS / (nseq heads). */
#define TILE 32
#define STEP (THREADS / TILE)
#define PER (TILE / STEP)
typedef float att_tile[TILE][TILE + 1];   /* +1: conflict-free column reads */

/* dst[rr][c] = src[rr * stride + d0 + c] for rr < rows and d0 + c < hd, else 0 */
static __device__ void att_load(att_tile dst, const float *src, int rows, size_t stride, int d0, int hd)
{
    for (int e = threadIdx.x; e < TILE * TILE; e += THREADS) {
        int rr = e / TILE, c = e % TILE;
        dst[rr][c] = rr < rows && d0 + c < hd ? src[(size_t)rr * stride + d0 + c] : 0.0f;
    }
}

/* Scores of a tile, this thread's entries: sc[e] = q[r] . k[j] (the sum over
 * head_dim in ascending order), and if dp != NULL dp[e] = g[r] . v[j]. q, g
 * (query side, row stride qs) and k, v (key side, row stride ks) point at the
 * tile's first row of their head; qt, kt, gt, vt are the staging tiles (gt and
 * vt unused without dp). */
static __device__ void att_scores(float *sc, float *dp, att_tile qt, att_tile kt, att_tile gt, att_tile vt,
                                  const float *q, const float *k, const float *g, const float *v,
                                  int rn, int jn, size_t qs, size_t ks, int hd)
{
    int r = threadIdx.x % TILE, j0 = threadIdx.x / TILE;
    for (int e = 0; e < PER; e++) {
        sc[e] = 0.0f;
        if (dp) dp[e] = 0.0f;
    }
    for (int d0 = 0; d0 < hd; d0 += TILE) {
        att_load(qt, q, rn, qs, d0, hd);
        att_load(kt, k, jn, ks, d0, hd);
        if (dp) {
            att_load(gt, g, rn, qs, d0, hd);
            att_load(vt, v, jn, ks, d0, hd);
        }
        __syncthreads();
        for (int e = 0; e < PER; e++) {
            int j = j0 + STEP * e;
            for (int i = 0; i < TILE; i++) sc[e] += qt[r][i] * kt[j][i];
            if (dp)
                for (int i = 0; i < TILE; i++) dp[e] += gt[r][i] * vt[j][i];
        }
        __syncthreads();
    }
}

/* D[rr] = g[rr] . o[rr] (head_dim ascending) for the tile's rows rr < rn
 * (0 beyond); gt, ot are staging tiles. */
static __device__ void att_row_dots(float *D, att_tile gt, att_tile ot, const float *g, const float *o,
                                    int rn, size_t qs, int hd)
{
    int t = threadIdx.x;
    float s = 0;
    for (int d0 = 0; d0 < hd; d0 += TILE) {
        att_load(gt, g, rn, qs, d0, hd);
        att_load(ot, o, rn, qs, d0, hd);
        __syncthreads();
        if (t < TILE)
            for (int i = 0; i < TILE; i++) s += gt[t][i] * ot[t][i];
        __syncthreads();
    }
    if (t < TILE) D[t] = s;
}

/* Online-softmax step of one query row over a tile of scaled scores p[TILE]
 * (masked entries -inf): m = max(m, max p), c = exp(m_old - m), l = l c + sum
 * exp(p - m), p = exp(p - m). Rows past the tile's end get p = 0, c = 1. */
static __device__ void att_softmax_row(float *p, float *m, float *l, float *c, bool valid)
{
    if (!valid) {
        for (int j = 0; j < TILE; j++) p[j] = 0.0f;
        *c = 1.0f;
        return;
    }
    float mt = -INFINITY;
    for (int j = 0; j < TILE; j++) mt = fmaxf(mt, p[j]);
    float mnew = fmaxf(*m, mt), corr = expf(*m - mnew), sum = *l * corr;
    for (int j = 0; j < TILE; j++) {
        p[j] = expf(p[j] - mnew);
        sum += p[j];
    }
    *m = mnew;
    *l = sum;
    *c = corr;
}

/* Whether score (query row r0 + r, key j0 + j) of a tile is attended. */
static __device__ __forceinline__ bool att_visible(int r0, int r, int rn, int j0, int j, int jn, bool causal)
{
    return r < rn && j < jn && (!causal || j0 + j <= r0 + r);
}

/* Attention forward, q[n, H, hd], k/v[n, Hkv, hd], out[n, H, hd], lse[n, H]
 * (flash-attention varlen): sequence s holds rows cu[s] .. cu[s+1]-1 and
 * attends within itself (causal: keys j <= row); query head h reads kv head
 * h / (H / Hkv). out[r, h] = sum_j softmax_j(q[r, h] . k[j] / sqrt(hd)) v[j],
 * lse[r, h] = log sum_j exp(score). Block (s, h, z) takes the query tiles z,
 * z + Y, ...; per key tile: scores (chunked over hd), the online-softmax update
 * per row (thread r), then out[rows] = out c + P V chunk by chunk (out holds
 * the running accumulator), and at the end out /= l, lse = m + log l. */
static __global__ void attention_forward_kernel(float *out, float *lse, const float *q, const float *k,
                                                const float *v, const int *cu, int H, int Hkv, int hd,
                                                bool causal)
{
    __shared__ att_tile qt, kt, pt;
    __shared__ float row_m[TILE], row_l[TILE], row_c[TILE];
    int h = blockIdx.y, kvh = h / (H / Hkv), t = threadIdx.x, col = t % TILE;
    int s0 = cu[blockIdx.x], len = cu[blockIdx.x + 1] - s0;
    size_t qs = (size_t)H * hd, ks = (size_t)Hkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    const float *kh = k + (size_t)s0 * ks + (size_t)kvh * hd, *vh = v + (size_t)s0 * ks + (size_t)kvh * hd;
    for (int r0 = blockIdx.z * TILE; r0 < len; r0 += gridDim.z * TILE) {
        int rn = imin(TILE, len - r0), kend = causal ? r0 + rn : len;
        const float *qr = q + (size_t)(s0 + r0) * qs + (size_t)h * hd;
        float *o = out + (size_t)(s0 + r0) * qs + (size_t)h * hd;
        if (t < TILE) {
            row_m[t] = -INFINITY;
            row_l[t] = 0.0f;
        }
        for (int d = col; d < hd; d += TILE)
            for (int e = 0; e < PER; e++) {
                int rr = t / TILE + STEP * e;
                if (rr < rn) o[(size_t)rr * qs + d] = 0.0f;
            }
        for (int j0 = 0; j0 < kend; j0 += TILE) {
            int jn = imin(TILE, kend - j0);
            float sc[PER];
            att_scores(sc, NULL, qt, kt, NULL, NULL, qr, kh + (size_t)j0 * ks, NULL, NULL, rn, jn, qs, ks, hd);
            for (int e = 0; e < PER; e++) {
                int r = col, j = t / TILE + STEP * e;
                pt[r][j] = att_visible(r0, r, rn, j0, j, jn, causal) ? sc[e] * scale : -INFINITY;
            }
            __syncthreads();
            if (t < TILE) att_softmax_row(pt[t], &row_m[t], &row_l[t], &row_c[t], t < rn);
            /* (the barrier after the first V chunk's load publishes pt and row_c) */
            for (int d0 = 0; d0 < hd; d0 += TILE) {
                att_load(kt, vh + (size_t)j0 * ks, jn, ks, d0, hd);
                __syncthreads();
                int d = d0 + col;
                for (int e = 0; e < PER; e++) {
                    int rr = t / TILE + STEP * e;
                    if (rr >= rn || d >= hd) continue;
                    float acc = o[(size_t)rr * qs + d] * row_c[rr];
                    for (int j = 0; j < TILE; j++) acc += pt[rr][j] * kt[j][col];
                    o[(size_t)rr * qs + d] = acc;
                }
                __syncthreads();
            }
        }
        for (int d = col; d < hd; d += TILE)
            for (int e = 0; e < PER; e++) {
                int rr = t / TILE + STEP * e;
                if (rr < rn) o[(size_t)rr * qs + d] /= row_l[rr];
            }
        if (t < rn) lse[(size_t)(s0 + r0 + t) * H + h] = row_m[t] + logf(row_l[t]);
        __syncthreads();
    }
}

/* Attention backward of q, recomputing probabilities from lse:
 * p = exp(q.k / sqrt(hd) - lse[r]), D[r] = dout[r] . out[r],
 * ds = p (dout[r] . v[j] - D[r]) / sqrt(hd);  dq[r] += sum_j ds k[j].
 * Block (s, h, z) takes the query tiles z, z + Y, ... of sequence s, head h,
 * and walks the key tiles it sees. */
static __global__ void attention_backward_dq_kernel(float *dq, const float *dout, const float *q,
                                                    const float *k, const float *v, const float *out,
                                                    const float *lse, const int *cu, int H, int Hkv,
                                                    int hd, bool causal)
{
    __shared__ att_tile qt, kt, gt, vt, dst;
    __shared__ float row_D[TILE], row_L[TILE];
    int h = blockIdx.y, kvh = h / (H / Hkv), t = threadIdx.x, col = t % TILE;
    int s0 = cu[blockIdx.x], len = cu[blockIdx.x + 1] - s0;
    size_t qs = (size_t)H * hd, ks = (size_t)Hkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    const float *kh = k + (size_t)s0 * ks + (size_t)kvh * hd, *vh = v + (size_t)s0 * ks + (size_t)kvh * hd;
    for (int r0 = blockIdx.z * TILE; r0 < len; r0 += gridDim.z * TILE) {
        int rn = imin(TILE, len - r0), kend = causal ? r0 + rn : len;
        size_t qo = (size_t)(s0 + r0) * qs + (size_t)h * hd;
        if (t < TILE) row_L[t] = t < rn ? lse[(size_t)(s0 + r0 + t) * H + h] : 0.0f;
        att_row_dots(row_D, qt, gt, dout + qo, out + qo, rn, qs, hd);
        for (int j0 = 0; j0 < kend; j0 += TILE) {
            int jn = imin(TILE, kend - j0);
            float sc[PER], dp[PER];
            att_scores(sc, dp, qt, kt, gt, vt, q + qo, kh + (size_t)j0 * ks, dout + qo, vh + (size_t)j0 * ks,
                       rn, jn, qs, ks, hd);
            for (int e = 0; e < PER; e++) {
                int r = col, j = t / TILE + STEP * e;
                float p = att_visible(r0, r, rn, j0, j, jn, causal) ? expf(sc[e] * scale - row_L[r]) : 0.0f;
                dst[r][j] = p * (dp[e] - row_D[r]) * scale;
            }
            /* (the barrier after the first K chunk's load publishes dst) */
            for (int d0 = 0; d0 < hd; d0 += TILE) {
                att_load(kt, kh + (size_t)j0 * ks, jn, ks, d0, hd);
                __syncthreads();
                int d = d0 + col;
                for (int e = 0; e < PER; e++) {
                    int rr = t / TILE + STEP * e;
                    if (rr >= rn || d >= hd) continue;
                    float acc = 0.0f;
                    for (int j = 0; j < TILE; j++) acc += dst[rr][j] * kt[j][col];
                    dq[qo + (size_t)rr * qs + d] += acc;
                }
                __syncthreads();
            }
        }
    }
}

/* Attention backward of k and v (same p, D, ds as the dq kernel):
 * dv[j] += sum_r p dout[r];  dk[j] += sum_r ds q[r], over the query rows r
 * (and heads h of the GQA group of kv head kvh) that see key j. Block
 * (s, kvh, z) takes the key tiles z, z + Y, ... of sequence s; for each, the
 * group's heads and the query tiles that see it (causal: from the key tile on).
 * dk or dv may be NULL. */
static __global__ void attention_backward_dkdv_kernel(float *dk, float *dv, const float *dout, const float *q,
                                                      const float *k, const float *v, const float *out,
                                                      const float *lse, const int *cu, int H, int Hkv,
                                                      int hd, bool causal)
{
    __shared__ att_tile qt, kt, gt, vt, pt, dst;
    __shared__ float row_D[TILE], row_L[TILE];
    int kvh = blockIdx.y, group = H / Hkv, t = threadIdx.x, col = t % TILE;
    int s0 = cu[blockIdx.x], len = cu[blockIdx.x + 1] - s0;
    size_t qs = (size_t)H * hd, ks = (size_t)Hkv * hd;
    float scale = 1.0f / sqrtf((float)hd);
    for (int j0 = blockIdx.z * TILE; j0 < len; j0 += gridDim.z * TILE) {
        int jn = imin(TILE, len - j0);
        size_t ko = (size_t)(s0 + j0) * ks + (size_t)kvh * hd;
        for (int h = kvh * group; h < (kvh + 1) * group; h++)
            for (int r0 = causal ? j0 / TILE * TILE : 0; r0 < len; r0 += TILE) {
                int rn = imin(TILE, len - r0);
                size_t qo = (size_t)(s0 + r0) * qs + (size_t)h * hd;
                if (t < TILE) row_L[t] = t < rn ? lse[(size_t)(s0 + r0 + t) * H + h] : 0.0f;
                att_row_dots(row_D, qt, gt, dout + qo, out + qo, rn, qs, hd);
                float sc[PER], dp[PER];
                att_scores(sc, dp, qt, kt, gt, vt, q + qo, k + ko, dout + qo, v + ko, rn, jn, qs, ks, hd);
                for (int e = 0; e < PER; e++) {
                    int r = col, j = t / TILE + STEP * e;
                    float p = att_visible(r0, r, rn, j0, j, jn, causal) ? expf(sc[e] * scale - row_L[r]) : 0.0f;
                    pt[r][j] = p;
                    dst[r][j] = p * (dp[e] - row_D[r]) * scale;
                }
                /* (the barrier after the first chunk's loads publishes pt and dst) */
                for (int d0 = 0; d0 < hd; d0 += TILE) {
                    att_load(qt, q + qo, rn, qs, d0, hd);
                    att_load(gt, dout + qo, rn, qs, d0, hd);
                    __syncthreads();
                    int d = d0 + col;
                    for (int e = 0; e < PER; e++) {
                        int jj = t / TILE + STEP * e;
                        if (jj >= jn || d >= hd) continue;
                        float a = 0.0f, b = 0.0f;
                        for (int r = 0; r < TILE; r++) {
                            a += pt[r][jj] * gt[r][col];
                            b += dst[r][jj] * qt[r][col];
                        }
                        if (dv) dv[ko + (size_t)jj * ks + d] += a;
                        if (dk) dk[ko + (size_t)jj * ks + d] += b;
                    }
                    __syncthreads();
                }
            }
    }
}

/* Attention shapes the kernels take; notes a failure otherwise. */
static bool att_shape_ok(int nseq, int H, int Hkv, int hd)
{
    if (Hkv > 0 && H >= Hkv && H % Hkv == 0 && H <= 65535 && hd > 0 && hd <= EX_MAX_HEAD_DIM) return true;
    char why[128];
    snprintf(why, sizeof why, "unsupported shape nseq %d H %d Hkv %d head_dim %d", nseq, H, Hkv, hd);
    note_failure("attention", why);
    return false;
}

/* Grid (nseq, heads, Y) with about ATT_TARGET_BLOCKS blocks in all. */
static dim3 att_grid(int nseq, int heads)
{
    long units = (long)nseq * heads, y = (ATT_TARGET_BLOCKS + units - 1) / units;
    return dim3((unsigned)nseq, (unsigned)heads, (unsigned)(y < 1 ? 1 : y > 65535 ? 65535 : y));
}

static void cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                   const int *cu, int nseq, int H, int Hkv, int hd, bool causal)
{
    if (nseq <= 0 || !att_shape_ok(nseq, H, Hkv, hd)) return;
    EX_LAUNCH(attention_forward_kernel, att_grid(nseq, H), THREADS, out, lse, q, k, v, cu, H, Hkv, hd, causal);
}

static void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *out, const float *lse,
                                    const int *cu, int nseq, int H, int Hkv, int hd, bool causal)
{
    if (nseq <= 0 || !att_shape_ok(nseq, H, Hkv, hd)) return;
    if (dq)
        EX_LAUNCH(attention_backward_dq_kernel, att_grid(nseq, H), THREADS, dq, dout, q, k, v, out, lse, cu,
                  H, Hkv, hd, causal);
    if (dk || dv)
        EX_LAUNCH(attention_backward_dkdv_kernel, att_grid(nseq, Hkv), THREADS, dk, dv, dout, q, k, v, out,
                  lse, cu, H, Hkv, hd, causal);
}

/* ------------------------------------------------------------ activations */

static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* SwiGLU: h = silu(g) * u, silu(g) = g * sigmoid(g); elementwise over n */
static __global__ void swiglu_forward_kernel(float *h, const float *g, const float *u, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

/* SwiGLU backward: du += dh g sigmoid(g);  dg += dh u sigmoid(g) (1 + g (1 - sigmoid(g)))
 * (either may be NULL) */
static __global__ void swiglu_backward_kernel(float *dg, float *du, const float *dh, const float *g,
                                              const float *u, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) {
        float s = sigmoid(g[i]);
        if (du) du[i] += dh[i] * g[i] * s;
        if (dg) dg[i] += dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
}

/* GELU, exact erf form: out = 0.5 x (1 + erf(x / sqrt 2)) */
static __global__ void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride())
        out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * (float)SQRT1_2));
}

/* GELU backward: dinp += dout (0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)) */
static __global__ void gelu_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n)
{
    const float inv_sqrt_2pi = 0.3989422804014327f;
    for (size_t i = gs_first(); i < n; i += gs_stride()) {
        float x = inp[i];
        float d = 0.5f * (1.0f + erff(x * (float)SQRT1_2)) + x * expf(-0.5f * x * x) * inv_sqrt_2pi;
        dinp[i] += dout[i] * d;
    }
}

static void cuda_swiglu_forward(float *h, const float *g, const float *u, size_t n)
{
    if (n) EX_LAUNCH(swiglu_forward_kernel, grid_for(n, THREADS), THREADS, h, g, u, n);
}

static void cuda_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n)
{
    if (n && (dg || du)) EX_LAUNCH(swiglu_backward_kernel, grid_for(n, THREADS), THREADS, dg, du, dh, g, u, n);
}

static void cuda_gelu_forward(float *out, const float *inp, size_t n)
{
    if (n) EX_LAUNCH(gelu_forward_kernel, grid_for(n, THREADS), THREADS, out, inp, n);
}

static void cuda_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
    if (n && dinp) EX_LAUNCH(gelu_backward_kernel, grid_for(n, THREADS), THREADS, dinp, dout, inp, n);
}

/* ------------------------------------------------------------ embeddings */

/* Embedding over vocab rows [v0, v0 + vn) held in wte[vn, d], out[n, d]:
 * out[t, j] = wte[tokens[t] - v0, j] if the token is in range, else 0 */
static __global__ void embedding_forward_kernel(float *out, const float *wte, const int32_t *tokens, int n,
                                                int d, int v0, int vn)
{
    for (size_t i = gs_first(); i < (size_t)n * d; i += gs_stride()) {
        int r = tokens[i / d] - v0;
        out[i] = r >= 0 && r < vn ? wte[(size_t)r * d + i % d] : 0.0f;
    }
}

/* Embedding backward: dwte[tokens[t] - v0, j] += dout[t, j] for in-range tokens
 * (atomicAdd: a repeated token's rows add in an arbitrary order) */
static __global__ void embedding_backward_kernel(float *dwte, const float *dout, const int32_t *tokens, int n,
                                                 int d, int v0, int vn)
{
    for (size_t i = gs_first(); i < (size_t)n * d; i += gs_stride()) {
        int r = tokens[i / d] - v0;
        if (r >= 0 && r < vn) atomicAdd(&dwte[(size_t)r * d + i % d], dout[i]);
    }
}

static void cuda_embedding_forward(float *out, const float *wte, const int32_t *tokens, int n, int d,
                                   int v0, int vn)
{
    if (n > 0 && d > 0)
        EX_LAUNCH(embedding_forward_kernel, grid_for((size_t)n * d, THREADS), THREADS, out, wte, tokens, n, d, v0, vn);
}

static void cuda_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int n, int d,
                                    int v0, int vn)
{
    if (n > 0 && d > 0 && dwte)
        EX_LAUNCH(embedding_backward_kernel, grid_for((size_t)n * d, THREADS), THREADS, dwte, dout, tokens, n, d,
                  v0, vn);
}

/* ------------------------------------------------------------ rows by index */

/* gather_rows: dst[i, j] = src[rows[i], j], dst[n, d] */
static __global__ void gather_rows_kernel(float *dst, const float *src, const int *rows, int n, int d)
{
    for (size_t i = gs_first(); i < (size_t)n * d; i += gs_stride()) dst[i] = src[(size_t)rows[i / d] * d + i % d];
}

/* scatter_add_rows: dst[rows[i], j] += src[i, j]; the rows are distinct, so
 * every element of dst has one owner (no atomics) */
static __global__ void scatter_add_rows_kernel(float *dst, const float *src, const int *rows, int n, int d)
{
    for (size_t i = gs_first(); i < (size_t)n * d; i += gs_stride()) dst[(size_t)rows[i / d] * d + i % d] += src[i];
}

static void cuda_gather_rows(float *dst, const float *src, const int *rows, int n, int d)
{
    if (n > 0 && d > 0) EX_LAUNCH(gather_rows_kernel, grid_for((size_t)n * d, THREADS), THREADS, dst, src, rows, n, d);
}

static void cuda_scatter_add_rows(float *dst, const float *src, const int *rows, int n, int d)
{
    if (n > 0 && d > 0)
        EX_LAUNCH(scatter_add_rows_kernel, grid_for((size_t)n * d, THREADS), THREADS, dst, src, rows, n, d);
}

/* ------------------------------------------------------------ cross-entropy */

/* ce_row_max, a block per row: mx[r] = max_c logits[r, c], logits[n, vocab] */
static __global__ void ce_row_max_kernel(float *mx, const float *logits, int n, int vocab)
{
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *z = logits + (size_t)r * vocab;
        float m = -INFINITY;
        for (int c = threadIdx.x; c < vocab; c += THREADS) m = fmaxf(m, z[c]);
        m = block_max(m);
        if (threadIdx.x == 0) mx[r] = m;
    }
}

/* ce_exp_sum, a block per row: st[r] = sum_c exp(z[r, c] - mx[r]) (in double),
 * st[n + r] = z[r, targets[r] - v0] if that column is local (else 0),
 * probs[r, c] = exp(z[r, c] - mx[r]) when probs != NULL */
static __global__ void ce_exp_sum_kernel(float *probs, float *st, const float *logits, const float *mx,
                                         const int32_t *targets, int n, int vocab, int v0)
{
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *z = logits + (size_t)r * vocab;
        float m = mx[r];
        int tc = targets[r] - v0;
        float zt = tc >= 0 && tc < vocab ? z[tc] : 0.0f;
        double sum = 0;
        for (int c = threadIdx.x; c < vocab; c += THREADS) {
            float p = expf(z[c] - m);
            if (probs) probs[(size_t)r * vocab + c] = p;
            sum += p;
        }
        sum = block_sum(sum);
        if (threadIdx.x == 0) {
            st[r] = (float)sum;
            st[n + r] = zt;
        }
    }
}

/* ce_grad: dlogits[r, c] = dscale * (probs[r, c] / st[r] - [c == targets[r] - v0]),
 * in place over the probs, dlogits[n, vocab] */
static __global__ void ce_grad_kernel(float *dlogits, const float *st, const int32_t *targets, int n, int vocab,
                                      int v0, float dscale)
{
    for (size_t i = gs_first(); i < (size_t)n * vocab; i += gs_stride()) {
        size_t r = i / vocab;
        int c = (int)(i % vocab);
        float p = dlogits[i] * (dscale / st[r]);
        dlogits[i] = c == targets[r] - v0 ? p - dscale : p;
    }
}

/* Fused cross-entropy over logits[n, vocab] (the whole vocabulary), a block per
 * row (rows strided over the grid): mx = max, st = (float) sum exp(z - mx)
 * (double), loss_r = mx + log(st) - z[target] (0 for a target out of range),
 * part[block] = sum of its rows' losses (double); if dlogits != NULL,
 * dlogits[r, c] = dscale * (exp(z - mx) / st - [c == target]). */
static __global__ void cross_entropy_kernel(double *part, float *dlogits, const float *logits,
                                            const int32_t *targets, int n, int vocab, float dscale)
{
    double total = 0;
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *z = logits + (size_t)r * vocab;
        float *dl = dlogits ? dlogits + (size_t)r * vocab : NULL;
        int tc = targets[r];
        float zt = tc >= 0 && tc < vocab ? z[tc] : 0.0f, m = -INFINITY;
        for (int c = threadIdx.x; c < vocab; c += THREADS) m = fmaxf(m, z[c]);
        m = block_max(m);
        double sum = 0;
        for (int c = threadIdx.x; c < vocab; c += THREADS) {
            float p = expf(z[c] - m);
            if (dl) dl[c] = p;
            sum += p;
        }
        float st = (float)block_sum(sum);
        total += (double)m + log((double)st) - zt;
        if (dl) {
            float s = dscale / st;
            for (int c = threadIdx.x; c < vocab; c += THREADS) dl[c] = c == tc ? dl[c] * s - dscale : dl[c] * s;
        }
    }
    if (threadIdx.x == 0) part[blockIdx.x] = total;
}

static void cuda_ce_row_max(float *mx, const float *logits, int n, int vocab)
{
    if (n > 0 && vocab > 0) EX_LAUNCH(ce_row_max_kernel, grid_for((size_t)n, 1), THREADS, mx, logits, n, vocab);
}

static void cuda_ce_exp_sum(float *probs, float *st, const float *logits, const float *mx,
                            const int32_t *targets, int n, int vocab, int v0)
{
    if (n > 0 && vocab > 0)
        EX_LAUNCH(ce_exp_sum_kernel, grid_for((size_t)n, 1), THREADS, probs, st, logits, mx, targets, n, vocab, v0);
}

static void cuda_ce_grad(float *dlogits, const float *st, const int32_t *targets, int n, int vocab, int v0,
                         float dscale)
{
    if (n > 0 && vocab > 0)
        EX_LAUNCH(ce_grad_kernel, grid_for((size_t)n * vocab, THREADS), THREADS, dlogits, st, targets, n, vocab,
                  v0, dscale);
}

/* Returns sum_r loss_r (the caller divides); waits for the device. */
static double cuda_cross_entropy(float *dlogits, const float *logits, const int32_t *targets, int n, int vocab,
                                 float dscale)
{
    double *part = scratch();
    if (!part) return NAN;
    if (n <= 0 || vocab <= 0) return 0;
    unsigned blocks = grid_for((size_t)n, 1);
    if (blocks > CE_BLOCKS) blocks = CE_BLOCKS;
    EX_LAUNCH(cross_entropy_kernel, blocks, THREADS, part, dlogits, logits, targets, n, vocab, dscale);
    return sum_partials(part, blocks);
}

/* ------------------------------------------------------------ AdamW */

/* AdamW (torch.optim.AdamW), elementwise over n, step = lr / bias_c1,
 * sqrt_c2 = sqrt(bias_c2):  p *= 1 - lr wd;  m = b1 m + (1 - b1) g;
 * v = b2 v + (1 - b2) g^2;  p -= step m / (sqrt(v) / sqrt_c2 + eps) */
static __global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                                    float b2, float eps, float wd, float step, float sqrt_c2)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) {
        p[i] *= 1.0f - lr * wd;
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        p[i] -= step * m[i] / (sqrtf(v[i]) / sqrt_c2 + eps);
    }
}

static void cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                       float eps, float weight_decay, float bias_c1, float bias_c2)
{
    if (n)
        EX_LAUNCH(adamw_kernel, grid_for(n, THREADS), THREADS, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay,
                  lr / bias_c1, sqrtf(bias_c2));
}

/* ------------------------------------------------------------ entry points */

static ex_backend make_table(void)
{
    ex_backend t;
    memset(&t, 0, sizeof t);
#ifdef EX_CUDA_EMU
    t.name = "cuda-emu";
#else
    t.name = "cuda";
#endif
    t.zero = cuda_zero;
    t.copy = cuda_copy;
    t.add_inplace = cuda_add_inplace;
    t.add_bias = cuda_add_bias;
    t.scale_inplace = cuda_scale_inplace;
    t.sumsq = cuda_sumsq;
    t.linear_forward = cuda_linear_forward;
    t.linear_backward = cuda_linear_backward;
    t.rmsnorm_forward = cuda_rmsnorm_forward;
    t.rmsnorm_backward = cuda_rmsnorm_backward;
    t.rope_forward = cuda_rope_forward;
    t.rope_backward = cuda_rope_backward;
    t.attention_forward = cuda_attention_forward;
    t.attention_backward = cuda_attention_backward;
    t.swiglu_forward = cuda_swiglu_forward;
    t.swiglu_backward = cuda_swiglu_backward;
    t.gelu_forward = cuda_gelu_forward;
    t.gelu_backward = cuda_gelu_backward;
    t.layernorm_forward = cuda_layernorm_forward;
    t.layernorm_backward = cuda_layernorm_backward;
    t.im2col1d = cuda_im2col1d;
    t.col2im1d = cuda_col2im1d;
    t.avgpool_rows_forward = cuda_avgpool_rows_forward;
    t.avgpool_rows_backward = cuda_avgpool_rows_backward;
    t.embedding_forward = cuda_embedding_forward;
    t.embedding_backward = cuda_embedding_backward;
    t.gather_rows = cuda_gather_rows;
    t.scatter_add_rows = cuda_scatter_add_rows;
    t.cross_entropy = cuda_cross_entropy;
    t.ce_row_max = cuda_ce_row_max;
    t.ce_exp_sum = cuda_ce_exp_sum;
    t.ce_grad = cuda_ce_grad;
    t.adamw = cuda_adamw;
    return t;
}

extern "C" const ex_backend *ex_backend_cuda(char *err)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();   /* not a sticky error of the kernels */
        util_fail(err, UTIL_ERUNTIME, "no CUDA device: %s",
                  cudaGetErrorString(e != cudaSuccess ? e : cudaErrorNoDevice));
        return NULL;
    }
    static const ex_backend table = make_table();
    return &table;
}

extern "C" int ex_cuda_sync(char *err)
{
    note_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    note_cuda(cudaGetLastError(), "asynchronous error");
    char msg[UTIL_ERR_LEN];
    if (take_failure(msg, sizeof msg)) return util_fail(err, UTIL_ERUNTIME, "%s", msg);
    return UTIL_OK;
}
