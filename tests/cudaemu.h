/* tests/cudaemu.h: a small CUDA emulator, so executor/cuda_kernels.cu compiles
 * as C++20 with g++ and its kernels run on the CPU in the unit tests (the
 * Makefile force-includes this header and defines EX_CUDA_EMU).
 *
 * What it provides, and how faithful it is:
 *  - the qualifiers (__global__, __device__, __host__, __forceinline__,
 *    __restrict__) as nothing or their C++ meaning; __shared__ as `static`,
 *    which is exact because launches run one block at a time;
 *  - dim3, threadIdx / blockIdx / blockDim / gridDim as thread_local;
 *  - cudaemu_launch(kernel, grid, block, args...): the kernel's blocks run one
 *    after another on blockDim.x*y*z std::threads created once per launch
 *    (the caller is thread 0); each thread loops over the blocks and the
 *    block's threads meet at a std::barrier after each block, so static
 *    "shared memory" is never clobbered by the next block. __syncthreads() is
 *    that barrier, so a kernel where some thread skips a __syncthreads
 *    deadlocks here (as it is undefined on a GPU). Launch configurations a GPU
 *    refuses (a zero dimension, over 1024 threads, grid y / z over 65535) are
 *    refused too: cudaGetLastError() then says cudaErrorInvalidConfiguration;
 *  - atomicAdd on float (std::atomic_ref);
 *  - the runtime calls the kernels' host code uses, on plain host memory
 *    (so "device" pointers are host pointers and AddressSanitizer checks every
 *    kernel access): cudaMalloc / cudaFree / cudaMemcpy[Async] /
 *    cudaMemset[Async] / cudaGetLastError / cudaDeviceSynchronize /
 *    cudaGetDeviceCount (always one device) / cudaGetErrorString;
 *  - cuBLAS: cublasCreate and cublasSgemm (column-major, with cuBLAS's
 *    argument checks) through OpenBLAS cblas_sgemm(CblasColMajor, ...).
 * Launches are synchronous; one host thread at a time may launch (the static
 * shared memory is process-wide). Everything here is static or inline, so
 * nothing clashes with the real CUDA runtime linked into the same binary. */
#ifndef DHP_TESTS_CUDAEMU_H
#define DHP_TESTS_CUDAEMU_H

#include <atomic>
#include <barrier>
#include <cblas.h>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

[[maybe_unused]] static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
/* The barrier of the block the calling thread belongs to (set per launch). */
static thread_local std::barrier<> *cudaemu_block_barrier;

static inline void __syncthreads(void) { cudaemu_block_barrier->arrive_and_wait(); }

/* Returns the old value, as CUDA's does. */
static inline float atomicAdd(float *address, float val)
{
    return std::atomic_ref<float>(*address).fetch_add(val);
}

/* ------------------------------------------------------------ runtime */

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

typedef struct cudaemu_stream *cudaStream_t;

/* The error cudaGetLastError reports (and clears). */
static cudaError_t cudaemu_last_error = cudaSuccess;

static inline cudaError_t cudaemu_fail(cudaError_t e)
{
    cudaemu_last_error = e;
    return e;
}

static inline const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    }
    return "unrecognized error code";
}

static inline cudaError_t cudaGetLastError(void)
{
    cudaError_t e = cudaemu_last_error;
    cudaemu_last_error = cudaSuccess;
    return e;
}

static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

static inline cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return cudaSuccess;
}

static inline cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = std::malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaemu_fail(cudaErrorMemoryAllocation);
}

static inline cudaError_t cudaFree(void *p)
{
    std::free(p);
    return cudaSuccess;
}

static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    (void)kind;
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}

static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                          cudaMemcpyKind kind, cudaStream_t stream = nullptr)
{
    (void)stream;
    return cudaMemcpy(dst, src, bytes, kind);
}

static inline cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    if (bytes) std::memset(p, value, bytes);
    return cudaSuccess;
}

static inline cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t stream = nullptr)
{
    (void)stream;
    return cudaMemset(p, value, bytes);
}

/* ------------------------------------------------------------ launches */

static inline bool cudaemu_config_ok(dim3 grid, dim3 block)
{
    unsigned long threads = (unsigned long)block.x * block.y * block.z;
    return grid.x && grid.y && grid.z && grid.y <= 65535 && grid.z <= 65535 && threads &&
           threads <= 1024 && block.z <= 64;
}

/* kernel<<<grid, block>>>(args...), synchronously: see the header comment. */
template <typename Kernel, typename... Args>
static void cudaemu_launch(Kernel kernel, dim3 grid, dim3 block, const Args &...args)
{
    if (!cudaemu_config_ok(grid, block)) {
        cudaemu_fail(cudaErrorInvalidConfiguration);
        return;
    }
    unsigned threads = block.x * block.y * block.z;
    std::barrier<> bar((std::ptrdiff_t)threads);
    auto thread_main = [&](unsigned t) {
        cudaemu_block_barrier = &bar;
        blockDim = block;
        gridDim = grid;
        threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
        for (unsigned z = 0; z < grid.z; z++)
            for (unsigned y = 0; y < grid.y; y++)
                for (unsigned x = 0; x < grid.x; x++) {
                    blockIdx = dim3(x, y, z);
                    kernel(args...);
                    bar.arrive_and_wait();
                }
        cudaemu_block_barrier = nullptr;
    };
    std::vector<std::thread> others;
    others.reserve(threads - 1);
    for (unsigned t = 1; t < threads; t++) others.emplace_back(thread_main, t);
    thread_main(0);
    for (std::thread &th : others) th.join();
}

/* ------------------------------------------------------------ cuBLAS */

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

struct cudaemu_blas { int unused; };
typedef struct cudaemu_blas *cublasHandle_t;

static inline cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    static cudaemu_blas the_handle;
    *handle = &the_handle;
    return CUBLAS_STATUS_SUCCESS;
}

static inline const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    }
    return "unknown error";
}

static inline int cudaemu_max1(int a) { return a > 1 ? a : 1; }

/* C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C, column-major as cuBLAS. */
static inline cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         const float *B, int ldb, const float *beta, float *C,
                                         int ldc)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || lda < cudaemu_max1(ta == CUBLAS_OP_N ? m : k) ||
        ldb < cudaemu_max1(tb == CUBLAS_OP_N ? k : n) || ldc < cudaemu_max1(m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                tb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, m, n, k, *alpha, A, lda, B, ldb,
                *beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

#endif
