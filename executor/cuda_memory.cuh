/* The CUDA backend's memory (included by executor/cuda_kernels.cu): device
 * buffers from cudaMalloc, zeroed, charged to util's per-category counters
 * (a host-side table keeps each buffer's size and category for the free),
 * so the memory report and the planner's exact predictions count device
 * memory as they count the CPU backend's; the copies are on the legacy
 * default stream, after the kernels queued before it (h2d asynchronous). A
 * failed allocation is a sticky error naming the device, the bytes asked,
 * the bytes free and the category (note_alloc_failure), which sync returns
 * as UTIL_ENOMEM. */
#include <unordered_map>
#include <utility>

static struct {
    std::mutex mu;
    std::unordered_map<void *, std::pair<size_t, util_mem_cat>> live;
} g_mem;

/* The one line of a failed cudaMalloc: the device (index and name), the
 * bytes asked and for which category, the bytes free of the device's total
 * (cudaMemGetInfo, after the failure). */
static void note_alloc_failure(cudaError_t e, size_t bytes, util_mem_cat cat)
{
    (void)cudaGetLastError();
    int dev = -1;
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(prop.name, sizeof prop.name, "unknown");
    }
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    char asked[24], fr[24], tot[24], why[UTIL_ERR_LEN];
    util_fmt_bytes((double)bytes, asked, sizeof asked);
    util_fmt_bytes((double)free_b, fr, sizeof fr);
    util_fmt_bytes((double)total_b, tot, sizeof tot);
    if (e == cudaErrorMemoryAllocation)
        snprintf(why, sizeof why, "out of device memory on GPU %d (%s): %zu bytes (%s) asked for %s, %zu bytes (%s) free of %s",
                 dev, prop.name, bytes, asked, util_mem_cat_name(cat), free_b, fr, tot);
    else
        snprintf(why, sizeof why, "%s on GPU %d (%s): %zu bytes (%s) asked for %s, %zu bytes (%s) free of %s",
                 cudaGetErrorString(e), dev, prop.name, bytes, asked, util_mem_cat_name(cat), free_b, fr, tot);
    note_failure_code(e == cudaErrorMemoryAllocation ? UTIL_ENOMEM : UTIL_ERUNTIME, "cudaMalloc", why);
}

static void *cuda_alloc(size_t bytes, util_mem_cat cat)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        note_alloc_failure(e, bytes, cat);
        return NULL;
    }
    note_cuda(cudaMemset(p, 0, bytes ? bytes : 1), "cudaMemset of a new buffer");
    {
        std::lock_guard<std::mutex> lock(g_mem.mu);
        g_mem.live[p] = std::make_pair(bytes, cat);
    }
    util_mem_charge(cat, bytes);
    return p;
}

static void cuda_release(void *p)
{
    if (!p) return;
    {
        std::lock_guard<std::mutex> lock(g_mem.mu);
        auto it = g_mem.live.find(p);
        if (it == g_mem.live.end()) {
            note_failure("cudaFree", "a pointer the backend did not allocate");
            return;
        }
        util_mem_discharge(it->second.second, it->second.first);
        g_mem.live.erase(it);
    }
    note_cuda(cudaFree(p), "cudaFree");
}

/* Page-locked host memory: copies from it need no staging, so h2d from
 * it returns at once (the step's data, executor/run_data.c). */
static void *cuda_alloc_host(size_t bytes)
{
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_release_host(void *p)
{
    if (p) note_cuda(cudaFreeHost(p), "cudaFreeHost");
}

/* Queued on the compute stream (the legacy default stream, after the
 * kernels before it): from page-locked memory the call returns before the
 * copy is done; from pageable memory once the source is staged (CUDA
 * runtime API, "API synchronization behavior": memcpy), so a pageable
 * source may change as soon as it returns. */
static void cuda_h2d(void *dst, const void *src, size_t bytes)
{
    if (bytes) note_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, 0), "cudaMemcpyAsync host to device");
}

static void cuda_d2h(void *dst, const void *src, size_t bytes)
{
    if (bytes) note_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
}

static void cuda_d2d(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) note_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy device to device");
}

static void cuda_fill(void *p, int byte, size_t bytes)
{
    if (bytes) note_cuda(cudaMemset(p, byte, bytes), "cudaMemset");
}
