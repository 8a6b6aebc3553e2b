/* CUDA backend: the kernels of executor/backend.h on device pointers, with the
 * math of executor/cpu_kernels.c (same shapes, accumulate rules, NULL
 * gradients, lse, cu_seqlens / GQA / causal, vocab shards, cross-entropy
 * pieces, AdamW, RoPE layout). Linears are cuBLASLt GEMMs (cuda_gemm.cuh); the
 * rest are own kernels, by job in the cuda_*.cuh files it includes. Shapes and math of each kernel are stated above it.
 * cuBLASLt is opened when the backend is first asked for (cuda_lt_api.cuh says why).
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
 *    the entry points are named ex_backend_cuda_emu / ex_cuda_sync_emu (in
 *    the unit tests, next to the real ones) or, with EX_CUDA_EMU_AS_CUDA (the
 *    dhp-emu binary, which has no real CUDA backend), ex_backend_cuda /
 *    ex_cuda_sync themselves.
 *  - Failures (a launch, a cuBLAS call, an allocation, a bad shape) are kept
 *    as a sticky first error that ex_cuda_sync reports and clears. */
#ifndef EX_CUDA_EMU
#include <cublasLt.h>
#include <cuda_runtime.h>
#define EX_LAUNCH_RAW(kernel, grid, block, ...) kernel<<<(grid), (block)>>>(__VA_ARGS__)
#else
#ifndef EX_CUDA_EMU_AS_CUDA
#define ex_backend_cuda ex_backend_cuda_emu
#define ex_cuda_sync ex_cuda_sync_emu
#endif
#define EX_LAUNCH_RAW(kernel, grid, block, ...) cudaemu_launch_named(#kernel, kernel, (grid), (block), __VA_ARGS__)
#endif

extern "C" {
#include "executor/backend.h"
#include "planner/backend.h"   /* the sizes of the backend's own buffers, which the memory model counts */
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
    int code;   /* UTIL_ENOMEM for a failed allocation (the run adds its prediction), else UTIL_ERUNTIME */
    char msg[UTIL_ERR_LEN];
} g_error;

/* Keeps the first failure since the last ex_cuda_sync, with the code sync returns. */
static void note_failure_code(int code, const char *what, const char *why)
{
    std::lock_guard<std::mutex> lock(g_error.mu);
    if (g_error.failed) return;
    g_error.failed = true;
    g_error.code = code;
    snprintf(g_error.msg, sizeof g_error.msg, "cuda: %s: %s", what, why);
}

static void note_failure(const char *what, const char *why) { note_failure_code(UTIL_ERUNTIME, what, why); }

static void note_cuda(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) note_failure(what, cudaGetErrorString(e));
}

/* Moves the sticky error into msg and clears it; its code, UTIL_OK when there is none. */
static int take_failure(char *msg, size_t len)
{
    std::lock_guard<std::mutex> lock(g_error.mu);
    if (!g_error.failed) return UTIL_OK;
    snprintf(msg, len, "%s", g_error.msg);
    g_error.failed = false;
    return g_error.code;
}

/* Launches kernel<<<grid, block>>>(args...) and notes a launch error. */
#define EX_LAUNCH(kernel, grid, block, ...)                      \
    do {                                                         \
        EX_LAUNCH_RAW(kernel, grid, block, __VA_ARGS__);         \
        note_cuda(cudaGetLastError(), "launch of " #kernel);     \
    } while (0)

/* ------------------------------------------------------------ the backend's own buffers */

static void *cuda_alloc(size_t bytes, util_mem_cat cat);   /* executor/cuda_memory.cuh */

static_assert(SCRATCH_DOUBLES * sizeof(double) <= PLAN_CUDA_REDUCE_BYTES, "the reductions' partial sums fit their part");

/* The backend's own device buffers (planner/backend.h), one allocation from
 * its allocator in category workspace, so the run counts them as the memory
 * model predicts them, made on the first GEMM or reduction (on the device
 * current then): cuBLASLt's workspace, then the reductions' partial sums,
 * then BGRADB's bias-gradient vector. NULL after a failed allocation (noted
 * as any tensor's: the device, the bytes, category workspace). */
static char *backend_workspace(void)
{
    static std::once_flag once;
    static char *base;
    std::call_once(once, [] { base = (char *)cuda_alloc(PLAN_CUDA_WORKSPACE_BYTES, UTIL_MEM_WORKSPACE); });
    return base;
}

/* Device buffer of SCRATCH_DOUBLES doubles: the reductions' partial sums. */
static double *scratch(void)
{
    char *ws = backend_workspace();
    if (!ws) note_failure("reduction scratch", "not allocated");
    return ws ? (double *)(ws + PLAN_CUDA_LT_WORKSPACE_BYTES) : NULL;
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

/* dst[c, r, :] = src[r, c, :], blocks of blk floats; one thread per element of src */
static __global__ void transpose_blocks_kernel(float *dst, const float *src, size_t rows, size_t cols, size_t blk)
{
    size_t n = rows * cols * blk;
    for (size_t i = gs_first(); i < n; i += gs_stride()) {
        size_t b = i / blk, r = b / cols, c = b % cols;
        dst[(c * rows + r) * blk + i % blk] = src[i];
    }
}

static void cuda_transpose_blocks(float *dst, const float *src, int rows, int cols, size_t blk)
{
    size_t n = (size_t)(rows > 0 ? rows : 0) * (cols > 0 ? cols : 0) * blk;
    if (n) EX_LAUNCH(transpose_blocks_kernel, grid_for(n, THREADS), THREADS, dst, src, (size_t)rows, (size_t)cols, blk);
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

#include "executor/cuda_lt_api.cuh"
#include "executor/cuda_gemm.cuh"

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

#include "executor/cuda_attention.cuh"

#include "executor/cuda_pointwise.cuh"
#include "executor/cuda_loss.cuh"

/* ------------------------------------------------------------ memory */

#include "executor/cuda_memory.cuh"
#include "executor/cuda_device.cuh"

/* ------------------------------------------------------------ entry points */

extern "C" int ex_cuda_sync(char *err);

static ex_backend make_table(void)
{
    ex_backend t;
    memset(&t, 0, sizeof t);
#if defined(EX_CUDA_EMU) && defined(CUDAEMU_GUARD)
    /* dhp-emu: host memory underneath, but every path taken as on a GPU
     * (device pointers guarded, NCCL told host from device memory) */
    t.name = "cuda-emu";
    t.host_memory = false;
    cudaemu_strict_on();
#elif defined(EX_CUDA_EMU)
    t.name = "cuda-emu";
    t.host_memory = true;   /* emulated device memory is host memory (tests/cudaemu.h) */
#else
    t.name = "cuda";
    t.host_memory = false;
#endif
    t.alloc = cuda_alloc;
    t.release = cuda_release;
    t.alloc_host = cuda_alloc_host;
    t.release_host = cuda_release_host;
    t.h2d = cuda_h2d;
    t.d2h = cuda_d2h;
    t.d2d = cuda_d2d;
    t.fill = cuda_fill;
    t.sync = ex_cuda_sync;
    t.zero = cuda_zero;
    t.copy = cuda_copy;
    t.add_inplace = cuda_add_inplace;
    t.add_bias = cuda_add_bias;
    t.scale_inplace = cuda_scale_inplace;
    t.sumsq = cuda_sumsq;
    t.linear_forward = cuda_linear_forward;
    t.linear_backward = cuda_linear_backward;
    t.to_bf16 = cuda_to_bf16;
    t.from_bf16 = cuda_from_bf16;
    t.linear_forward_bf16 = cuda_linear_forward_bf16;
    t.linear_backward_bf16 = cuda_linear_backward_bf16;
    t.set_tf32 = cuda_set_tf32;
    t.rmsnorm_forward = cuda_rmsnorm_forward;
    t.rmsnorm_backward = cuda_rmsnorm_backward;
    t.rope_forward = cuda_rope_forward;
    t.rope_backward = cuda_rope_backward;
    t.set_attention_bf16 = cuda_set_attention_bf16;
    t.attention_forward = cuda_attention_forward;
    t.attention_backward = cuda_attention_backward;
    t.attention_part_forward = cuda_attention_part_forward;
    t.attention_part_backward = cuda_attention_part_backward;
    t.attention_merge = cuda_attention_merge;
    t.transpose_blocks = cuda_transpose_blocks;
    t.swiglu_forward = cuda_swiglu_forward;
    t.swiglu_backward = cuda_swiglu_backward;
    t.gelu_forward = cuda_gelu_forward;
    t.gelu_backward = cuda_gelu_backward;
    t.quick_gelu_forward = cuda_quick_gelu_forward;
    t.quick_gelu_backward = cuda_quick_gelu_backward;
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
    if (!cuda_device_usable(err) || !lt_api_ready(err)) return NULL;
    static const ex_backend table = make_table();
    return &table;
}

extern "C" int ex_cuda_sync(char *err)
{
    note_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    note_cuda(cudaGetLastError(), "asynchronous error");
    char msg[UTIL_ERR_LEN];
    int code = take_failure(msg, sizeof msg);
    if (code) return util_fail(err, code, "%s", msg);
    return UTIL_OK;
}
