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
 *    after another on the calling thread; within a block each CUDA thread is
 *    a fiber (its own stack; an x86-64 register switch, no system call) and
 *    __syncthreads() switches to the next fiber: a barrier round ends when
 *    every thread of the block waits at a __syncthreads or has returned (as
 *    on the hardware, a returned thread no longer counts), so static "shared
 *    memory" is never clobbered by another block. A kernel whose first launch
 *    calls no __syncthreads runs its later launches as plain loops over the
 *    threads (no fibers); should such a kernel then call __syncthreads the
 *    emulator aborts naming it. Launch configurations a GPU refuses (a zero
 *    dimension, over 1024 threads, grid y / z over 65535) are refused too:
 *    cudaGetLastError() then says cudaErrorInvalidConfiguration;
 *  - atomicAdd on float (std::atomic_ref);
 *  - the runtime calls the kernels' host code uses, on plain host memory
 *    (so "device" pointers are host pointers and AddressSanitizer checks every
 *    kernel access): cudaMalloc / cudaFree / cudaMemcpy[Async] (every kind
 *    is one memmove; an asynchronous one from cudaMallocHost memory queued
 *    on the compute stream, see "the compute stream" below) / cudaMallocHost /
 *    cudaFreeHost / cudaMemset[Async] / cudaMemGetInfo (the host's
 *    MemAvailable, or DHP_EMU_DEVICE_BYTES) / cudaGetLastError /
 *    cudaDeviceSynchronize / cudaGetDeviceCount / cudaGetDevice /
 *    cudaGetDeviceProperties (name, memory) / cudaDriverGetVersion /
 *    cudaRuntimeGetVersion / cudaGetErrorString, with the environment's
 *    fault knobs (no device, an old driver, a small device: below);
 *  - with CUDAEMU_GUARD defined (the dhp-emu binary), a device-pointer guard:
 *    cudaMalloc records each allocation's range, and a pointer that is not
 *    inside one (a host pointer) given as a kernel argument, to cublasLtMatmul,
 *    as the device side of a cudaMemcpy (or a device pointer given as its
 *    host side) or to cudaMemset/cudaFree aborts with the kernel's or call's
 *    name. It catches host memory handed to the device; it does NOT catch the
 *    host reading or writing device memory directly (emulated device memory
 *    is host memory and stays readable);
 *  - cuBLASLt (the backend's linears, fp32, TF32 and bf16, fused bias and
 *    bias gradient) through OpenBLAS cblas_sgemm(CblasColMajor, ...):
 *    tests/cudaemu_lt.h;
 *  - nvcuda::wmma's bf16 fragments (the bf16 attention): tests/cudaemu_wmma.h.
 * Launches are synchronous; one host thread at a time may launch (the static
 * shared memory and the fiber scheduler are process-wide). x86-64 only. Everything here is static or inline, so
 * nothing clashes with the real CUDA runtime linked into the same binary. */
#ifndef DHP_TESTS_CUDAEMU_H
#define DHP_TESTS_CUDAEMU_H

#include <atomic>
#include <sys/mman.h>
#include <unordered_map>
#include <cstdio>
#include <map>
#include <mutex>
#include <type_traits>
#include <cblas.h>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

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

/* ---- fibers: one per CUDA thread of the running block ----
 * cudaemu_swap(save, sp) saves the callee-saved registers on the current
 * stack, stores its pointer in *save and continues on stack sp (System V
 * x86-64: rbx, rbp, r12-r15 are callee-saved). A new fiber's stack holds six
 * zero registers and cudaemu_fiber_main as the return address. */
extern "C" void cudaemu_swap(void **save, void *sp);
asm(R"(
    .text
    .p2align 4
    .type cudaemu_swap, @function
cudaemu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudaemu_swap, .-cudaemu_swap
)");

#define CUDAEMU_STACK ((size_t)256 * 1024)
enum { CUDAEMU_RUN = 0, CUDAEMU_WAIT = 1, CUDAEMU_DONE = 2 };

struct cudaemu_sched {
    void *main_sp;
    std::vector<void *> sp, stack, fake;
    std::vector<char> state;
    unsigned cur, n;
    void (*body)(void *);       /* the block's kernel call for the current thread */
    void *body_ctx;
    bool synced;                /* a __syncthreads was called in this launch */
    bool sequential;            /* plain loops: a __syncthreads is an error */
    const char *name;
    const void *main_bottom;    /* the launching stack (AddressSanitizer's fiber annotations) */
    size_t main_size;
};
static cudaemu_sched &cudaemu_s(void)
{
    static cudaemu_sched s;
    return s;
}

static inline void cudaemu_to_main(bool dying)
{
    cudaemu_sched &s = cudaemu_s();
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(dying ? nullptr : &s.fake[s.cur], s.main_bottom, s.main_size);
#else
    (void)dying;
#endif
    cudaemu_swap(&s.sp[s.cur], s.main_sp);
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(s.fake[s.cur], &s.main_bottom, &s.main_size);
#endif
}

static void cudaemu_fiber_main(void)
{
    cudaemu_sched &s = cudaemu_s();
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom, &s.main_size);
#endif
    s.body(s.body_ctx);
    s.state[s.cur] = CUDAEMU_DONE;
    cudaemu_to_main(true);
    std::abort();   /* a finished fiber is never resumed */
}

static inline void cudaemu_run_fiber(unsigned t)
{
    cudaemu_sched &s = cudaemu_s();
    s.cur = t;
#if defined(__SANITIZE_ADDRESS__)
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, s.stack[t], CUDAEMU_STACK);
#endif
    cudaemu_swap(&s.main_sp, s.sp[t]);
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

static inline void __syncthreads(void)
{
    cudaemu_sched &s = cudaemu_s();
    s.synced = true;
    if (s.sequential) {
        std::fprintf(stderr, "cudaemu: kernel %s called __syncthreads, which its first launch did not: emulated wrongly\n",
                     s.name);
        std::abort();
    }
    s.state[s.cur] = CUDAEMU_WAIT;
    cudaemu_to_main(false);
}

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
    cudaErrorInsufficientDriver = 35,
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
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
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

/* ---- the compute stream (the legacy default stream) ----
 * Work issued on it (every launch, copy, memset and GEMM here) is counted:
 * tests/ncclemu.h refuses an NCCL operation whose stream has not waited,
 * through an event, for all of it (cudaemu_compute_ops). Page-locked host
 * memory (cudaMallocHost) is tracked, and a cudaMemcpyAsync from it is
 * queued, not done: it runs, reading its source then as a GPU's DMA does,
 * when later work on the stream runs (a launch, a copy, a memset, a GEMM, a
 * free, a synchronize, an event recorded on it). So a program that writes
 * a pinned source before its copy is ordered computes on the new data here,
 * as it may on a GPU; one that writes it before the host synchronized
 * aborts at the synchronize (cudaemu_synchronized). */
static unsigned long cudaemu_ops;
struct cudaemu_copy { void *dst; const void *src; size_t bytes; };
static std::vector<cudaemu_copy> &cudaemu_queued(void)
{
    static std::vector<cudaemu_copy> q;
    return q;
}
static std::map<const char *, size_t> &cudaemu_pinned(void)
{
    static std::map<const char *, size_t> m;   /* start -> bytes */
    return m;
}
/* A pinned source copied since the last synchronize, with a hash of its
 * bytes when the copy was issued: on a GPU the copy may still read it until
 * the host synchronizes, so the host must not write it before (the step's
 * double-buffered data, executor/run_data.c). cudaDeviceSynchronize and the
 * device-to-host cudaMemcpy (which waits for the stream) check it. */
struct cudaemu_flight { const void *src; size_t bytes; unsigned long long hash; };
static std::vector<cudaemu_flight> &cudaemu_in_flight(void)
{
    static std::vector<cudaemu_flight> f;
    return f;
}
static unsigned long long cudaemu_hash(const void *p, size_t bytes)
{
    unsigned long long h = 1469598103934665603ull;   /* FNV-1a */
    for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}
static inline void cudaemu_drain(void)
{
    std::vector<cudaemu_copy> &q = cudaemu_queued();
    for (const cudaemu_copy &c : q) std::memmove(c.dst, c.src, c.bytes);
    q.clear();
}
/* The host waits for the stream: every copy is done, and its source must not have changed meanwhile. */
static inline void cudaemu_synchronized(const char *call)
{
    cudaemu_drain();
    for (const cudaemu_flight &f : cudaemu_in_flight())
        if (cudaemu_hash(f.src, f.bytes) != f.hash) {
            std::fprintf(stderr, "cudaemu stream order: %s: the page-locked source %p of a cudaMemcpyAsync (%zu bytes) was "
                         "written by the host before the copy was synchronized: on a GPU the copy may read the new data\n",
                         call, f.src, f.bytes);
            std::fflush(stderr);
            std::abort();
        }
    cudaemu_in_flight().clear();
}
/* Work on the stream: what was queued before it runs first. */
static inline void cudaemu_issue(void)
{
    cudaemu_drain();
    cudaemu_ops++;
}
static bool cudaemu_is_pinned(const void *p, size_t bytes)
{
    std::map<const char *, size_t> &m = cudaemu_pinned();
    const char *c = (const char *)p;
    auto it = m.upper_bound(c);
    if (it == m.begin()) return false;
    --it;
    return c + bytes <= it->first + it->second;
}
static inline cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    *p = std::malloc(bytes ? bytes : 1);
    if (!*p) return cudaErrorMemoryAllocation;
    cudaemu_pinned()[(const char *)*p] = bytes ? bytes : 1;
    return cudaSuccess;
}
static inline cudaError_t cudaFreeHost(void *p)
{
    cudaemu_synchronized("cudaFreeHost");   /* waits, as the runtime's does */
    if (p && !cudaemu_pinned().erase((const char *)p)) return cudaErrorInvalidValue;
    std::free(p);
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void)
{
    cudaemu_synchronized("cudaDeviceSynchronize");
    return cudaSuccess;
}

/* ---- the emulated machine, from the environment (the tests' fault knobs):
 * DHP_EMU_GPUS     devices (default 1; 0: cudaErrorNoDevice, as a machine
 *                  with a driver and no GPU);
 * DHP_EMU_CUDA_DRIVER  the driver's CUDA version, 1000 * major + 10 * minor
 *                  (default: the emulated runtime's; 0: no driver installed;
 *                  below the runtime's: cudaGetDeviceCount says
 *                  cudaErrorInsufficientDriver, as the real runtime does);
 * DHP_EMU_DEVICE_BYTES the device memory (bytes, or with a K, M or G suffix:
 *                  powers of 1024); cudaMalloc beyond it fails with
 *                  cudaErrorMemoryAllocation and cudaMemGetInfo reports it
 *                  (default: no cap, the host's memory). */
#define CUDAEMU_RUNTIME_VERSION 12080   /* the CUDA 12.8 runtime API */

static inline long long cudaemu_env_num(const char *name, long long dflt)
{
    const char *v = std::getenv(name);
    char *end = nullptr;
    if (!v || !*v) return dflt;
    long long n = std::strtoll(v, &end, 10);
    if (end == v || n < 0) return dflt;
    switch (*end) {
    case 'k': case 'K': n <<= 10; end++; break;
    case 'm': case 'M': n <<= 20; end++; break;
    case 'g': case 'G': n <<= 30; end++; break;
    }
    return *end ? dflt : n;
}

static inline cudaError_t cudaDriverGetVersion(int *v)
{
    *v = (int)cudaemu_env_num("DHP_EMU_CUDA_DRIVER", CUDAEMU_RUNTIME_VERSION);
    return cudaSuccess;
}

static inline cudaError_t cudaRuntimeGetVersion(int *v)
{
    *v = CUDAEMU_RUNTIME_VERSION;
    return cudaSuccess;
}

static inline cudaError_t cudaGetDeviceCount(int *count)
{
    int driver = 0;
    cudaDriverGetVersion(&driver);
    *count = 0;
    if (driver < CUDAEMU_RUNTIME_VERSION) return cudaemu_fail(cudaErrorInsufficientDriver);
    *count = (int)cudaemu_env_num("DHP_EMU_GPUS", 1);
    return *count > 0 ? cudaSuccess : cudaemu_fail(cudaErrorNoDevice);
}

static inline cudaError_t cudaGetDevice(int *device)
{
    *device = 0;
    return cudaSuccess;
}

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
};

static inline cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device)
{
    std::memset(prop, 0, sizeof *prop);
    std::snprintf(prop->name, sizeof prop->name, "cuda-emu %d (the CPU)", device);
    size_t free_b = 0;
    return cudaMemGetInfo(&free_b, &prop->totalGlobalMem);
}

/* Device memory in use (every live cudaMalloc allocation's bytes), and the
 * cap DHP_EMU_DEVICE_BYTES puts on it. */
struct cudaemu_budget {
    std::mutex mu;
    size_t cap, used;
    std::unordered_map<const void *, size_t> size;
};
static cudaemu_budget &cudaemu_dev_budget(void)
{
    static cudaemu_budget b;
    static std::once_flag once;
    std::call_once(once, [] { b.cap = (size_t)cudaemu_env_num("DHP_EMU_DEVICE_BYTES", 0); });
    return b;
}

/* ---- the device-pointer guard (CUDAEMU_GUARD): live allocations by start */
struct cudaemu_ranges {
    std::mutex mu;
    std::map<const char *, size_t> live;   /* start -> bytes */
};
static cudaemu_ranges &cudaemu_mem(void)
{
    static cudaemu_ranges r;
    return r;
}

/* Whether p lies in (or one past the end of) an emulated device allocation. */
[[maybe_unused]] static bool cudaemu_is_device(const void *p)
{
    cudaemu_ranges &r = cudaemu_mem();
    std::lock_guard<std::mutex> lock(r.mu);
    const char *c = (const char *)p;
    auto it = r.live.upper_bound(c);
    if (it == r.live.begin()) return false;
    --it;
    return c <= it->first + it->second;
}

[[noreturn]] static void cudaemu_guard_fail(const char *what, const char *which, const void *p)
{
    std::fprintf(stderr, "cudaemu guard: %s: %s %p is not device memory (a host buffer handed to the device)\n", what,
                 which, p);
    std::fflush(stderr);
    std::abort();
}

#ifdef CUDAEMU_GUARD
#define CUDAEMU_GUARD_ON 1
#else
#define CUDAEMU_GUARD_ON 0
#endif

/* Strict pointers (tests/ncclemu.h): once dhp-emu's CUDA backend is in use
 * (cudaemu_strict_on, from its backend table), the emulated NCCL and
 * cudaPointerGetAttributes tell device memory from host memory as a GPU
 * does: 1 for a live cudaMalloc allocation, 0 otherwise; -1 before. */
#ifdef CUDAEMU_GUARD
static bool cudaemu_strict;
[[maybe_unused]] static void cudaemu_strict_on(void) { cudaemu_strict = true; }
extern "C" int cudaemu_strict_is_device(const void *p)
{
    return cudaemu_strict ? (int)cudaemu_is_device(p) : -1;
}
#endif

/* p (if not NULL) must be device memory (want true) or host memory (want false). */
static inline void cudaemu_guard(const char *what, const char *which, const void *p, bool want = true)
{
    if (CUDAEMU_GUARD_ON && p && cudaemu_is_device(p) != want) {
        if (want) cudaemu_guard_fail(what, which, p);
        std::fprintf(stderr, "cudaemu guard: %s: %s %p is device memory where host memory was said\n", what, which, p);
        std::fflush(stderr);
        std::abort();
    }
}

static inline cudaError_t cudaMalloc(void **p, size_t bytes)
{
    cudaemu_budget &b = cudaemu_dev_budget();
    *p = nullptr;
    {
        std::lock_guard<std::mutex> lock(b.mu);
        if (b.cap && bytes > b.cap - b.used) return cudaemu_fail(cudaErrorMemoryAllocation);
        *p = std::malloc(bytes ? bytes : 1);
        if (*p) { b.used += bytes; b.size[*p] = bytes; }
    }
    if (!*p) return cudaemu_fail(cudaErrorMemoryAllocation);
    if (CUDAEMU_GUARD_ON) {
        std::lock_guard<std::mutex> lock(cudaemu_mem().mu);
        cudaemu_mem().live[(const char *)*p] = bytes;
    }
    return cudaSuccess;
}

static inline cudaError_t cudaFree(void *p)
{
    cudaemu_drain();
    if (CUDAEMU_GUARD_ON && p) {
        std::lock_guard<std::mutex> lock(cudaemu_mem().mu);
        if (!cudaemu_mem().live.erase((const char *)p)) cudaemu_guard_fail("cudaFree", "pointer", p);
    }
    cudaemu_budget &b = cudaemu_dev_budget();
    if (p) {
        std::lock_guard<std::mutex> lock(b.mu);
        auto it = b.size.find(p);
        if (it != b.size.end()) { b.used -= it->second; b.size.erase(it); }
    }
    std::free(p);
    return cudaSuccess;
}

/* The emulated device's bytes in use: what the unit tests hold against the
 * bytes the CUDA backend charged to its memory categories
 * (tests/test_cuda_kernels.c). One binary links one object of this header. */
extern "C" size_t cudaemu_device_bytes(void)
{
    cudaemu_budget &b = cudaemu_dev_budget();
    std::lock_guard<std::mutex> lock(b.mu);
    return b.used;
}

/* Free and total memory: the cap's (DHP_EMU_DEVICE_BYTES), else the host's
 * (the emulated device's memory is the host's). */
static inline cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = *total_bytes = 0;
    cudaemu_budget &b = cudaemu_dev_budget();
    if (b.cap) {
        std::lock_guard<std::mutex> lock(b.mu);
        *total_bytes = b.cap;
        *free_bytes = b.cap - b.used;
        return cudaSuccess;
    }
    FILE *f = std::fopen("/proc/meminfo", "r");
    if (!f) return cudaSuccess;
    char key[64];
    unsigned long long kb;
    while (std::fscanf(f, "%63s %llu kB", key, &kb) == 2) {
        if (!std::strcmp(key, "MemTotal:")) *total_bytes = (size_t)kb * 1024;
        if (!std::strcmp(key, "MemAvailable:")) *free_bytes = (size_t)kb * 1024;
    }
    std::fclose(f);
    return cudaSuccess;
}

#ifdef CUDAEMU_GUARD
/* tests/ncclemu.h's view of the compute stream, at an event recorded on it
 * (or an NCCL call): the queued copies are done by then, and the work issued so far. */
extern "C" unsigned long cudaemu_compute_ops(void)
{
    cudaemu_drain();
    return cudaemu_ops;
}
#endif

static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    cudaemu_issue();
    if (kind == cudaMemcpyDeviceToHost) cudaemu_synchronized("cudaMemcpy device to host");
    if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice) cudaemu_guard("cudaMemcpy", "destination", dst);
    if (kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice) cudaemu_guard("cudaMemcpy", "source", src);
    if (kind == cudaMemcpyDeviceToHost) cudaemu_guard("cudaMemcpy", "destination", dst, false);
    if (kind == cudaMemcpyHostToDevice) cudaemu_guard("cudaMemcpy", "source", src, false);
    if (bytes) std::memmove(dst, src, bytes);
    return cudaSuccess;
}

static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                          cudaMemcpyKind kind, cudaStream_t stream = nullptr)
{
    (void)stream;
    if (!bytes || kind != cudaMemcpyHostToDevice || !cudaemu_is_pinned(src, bytes)) return cudaMemcpy(dst, src, bytes, kind);
    cudaemu_guard("cudaMemcpyAsync", "destination", dst);
    cudaemu_ops++;
    cudaemu_queued().push_back({ dst, src, bytes });   /* runs with the stream's next work */
    cudaemu_in_flight().push_back({ src, bytes, cudaemu_hash(src, bytes) });
    return cudaSuccess;
}

static inline cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    cudaemu_issue();
    cudaemu_guard("cudaMemset", "pointer", p);
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

/* Fiber t's stack, ready to start cudaemu_fiber_main. */
static inline void cudaemu_fiber_init(unsigned t)
{
    cudaemu_sched &s = cudaemu_s();
    void **top = (void **)((char *)s.stack[t] + CUDAEMU_STACK);
    top[-1] = nullptr;                          /* cudaemu_fiber_main's return address: never used */
    top[-2] = (void *)cudaemu_fiber_main;       /* where cudaemu_swap's ret goes */
    for (int i = 3; i <= 8; i++) top[-i] = nullptr;   /* rbp, rbx, r12-r15 */
    s.sp[t] = top - 8;
    s.state[t] = CUDAEMU_RUN;
}

static inline bool cudaemu_fibers(unsigned n)
{
    cudaemu_sched &s = cudaemu_s();
    while (s.stack.size() < n) {
        void *p = mmap(nullptr, CUDAEMU_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return false;
        s.stack.push_back(p);
    }
    if (s.sp.size() < n) {
        s.sp.resize(n);
        s.fake.resize(n);
        s.state.resize(n);
    }
    return true;
}

/* kernel<<<grid, block>>>(args...), synchronously: see the header comment. */
template <typename Kernel, typename... Args>
static void cudaemu_launch(Kernel kernel, dim3 grid, dim3 block, const Args &...args)
{
    if (!cudaemu_config_ok(grid, block)) {
        cudaemu_fail(cudaErrorInvalidConfiguration);
        return;
    }
    cudaemu_issue();
    static std::unordered_map<const void *, bool> syncs;   /* kernel -> its first launch called __syncthreads */
    cudaemu_sched &s = cudaemu_s();
    unsigned threads = block.x * block.y * block.z;
    auto it = syncs.find((const void *)kernel);
    s.sequential = it != syncs.end() && !it->second;
    s.synced = false;
    if (!s.sequential && !cudaemu_fibers(threads)) {
        cudaemu_fail(cudaErrorMemoryAllocation);
        return;
    }
    auto call = [&]() { kernel(args...); };
    s.body = [](void *c) { (*(decltype(call) *)c)(); };
    s.body_ctx = &call;
    blockDim = block;
    gridDim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = dim3(x, y, z);
                if (s.sequential) {
                    for (unsigned t = 0; t < threads; t++) {
                        threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
                        call();
                    }
                    continue;
                }
                for (unsigned t = 0; t < threads; t++) cudaemu_fiber_init(t);
                bool waited;
                do {   /* a round: every runnable thread up to its next __syncthreads or its end */
                    waited = false;
                    for (unsigned t = 0; t < threads; t++) {
                        if (s.state[t] != CUDAEMU_RUN) continue;
                        threadIdx = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
                        cudaemu_run_fiber(t);
                    }
                    for (unsigned t = 0; t < threads; t++)
                        if (s.state[t] == CUDAEMU_WAIT) { s.state[t] = CUDAEMU_RUN; waited = true; }
                } while (waited);
            }
    if (it == syncs.end()) syncs.emplace((const void *)kernel, s.synced);
    s.sequential = false;
}

/* The launch, after the guard's look at every pointer argument. */
template <typename Kernel, typename... Args>
static void cudaemu_launch_named(const char *name, Kernel kernel, dim3 grid, dim3 block, const Args &...args)
{
    cudaemu_s().name = name;
    if (CUDAEMU_GUARD_ON) {
        auto check = [&](const auto &a) {
            if constexpr (std::is_pointer_v<std::decay_t<decltype(a)>>) cudaemu_guard(name, "argument", (const void *)a);
        };
        (check(args), ...);
    }
    cudaemu_launch(kernel, grid, block, args...);
}

/* ------------------------------------------------------------ cuBLAS(Lt) types */

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
/* The values of library_types.h the GEMMs use. */
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;

#include "tests/cudaemu_lt.h"
#include "tests/cudaemu_wmma.h"

#endif
