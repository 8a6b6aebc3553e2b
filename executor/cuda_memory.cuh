/* The CUDA backend's memory (included by executor/cuda_kernels.cu): device
 * buffers from cudaMalloc, zeroed, charged to util's per-category counters
 * (a host-side table keeps each buffer's size and category for the free),
 * so the memory report and the planner's exact predictions count device
 * memory as they count the CPU backend's; the copies are cudaMemcpy, which on
 * the legacy default stream waits for the kernels queued before it. A
 * failed allocation is a sticky error naming the bytes asked, the bytes free
 * and the category. */
#include <unordered_map>
#include <utility>

static struct {
    std::mutex mu;
    std::unordered_map<void *, std::pair<size_t, util_mem_cat>> live;
} g_mem;

static void *cuda_alloc(size_t bytes, util_mem_cat cat)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        char why[200];
        snprintf(why, sizeof why, "%s: %zu bytes asked, %zu of %zu free (%s)", cudaGetErrorString(e), bytes, free_b,
                 total_b, util_mem_cat_name(cat));
        note_failure("cudaMalloc", why);
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

static void cuda_h2d(void *dst, const void *src, size_t bytes)
{
    if (bytes) note_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
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
