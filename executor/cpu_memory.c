/* The CPU backend's memory: util's counting allocator (so the per-category
 * counters see every tensor), memcpy and memset. Host and "device" are the
 * same memory, so the three copy directions are one memmove. */
#include "executor/cpu_int.h"

#include <string.h>

void *ex_cpu_alloc(size_t bytes, util_mem_cat cat) { return util_calloc_cat(cat, bytes, 1); }

void ex_cpu_release(void *p) { util_free(p); }

void *ex_cpu_alloc_host(size_t bytes) { return util_malloc(bytes ? bytes : 1); }

void ex_cpu_copy_bytes(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) memmove(dst, src, bytes);
}

void ex_cpu_fill(void *p, int byte, size_t bytes)
{
    if (bytes) memset(p, byte, bytes);
}

int ex_cpu_sync(char *err)
{
    (void)err;
    return UTIL_OK;
}
