/* dhp profile: the facts of the device this rank drives (name, compute
 * capability, SMs, clocks, memory bus, memory, runtime and driver
 * versions), from the CUDA runtime. The emulator build (make's dhp-emu)
 * compiles this file with -DDHP_PROFILE_EMU against tests/ncclemu.h, whose
 * runtime answers for the CPU; a build without CUDA has no device. */
#include "profile/profile_int.h"

#include <stdio.h>
#include <string.h>

#if defined(DHP_CUDA) || defined(DHP_PROFILE_EMU)
#ifndef DHP_PROFILE_EMU
#include <cuda_runtime_api.h>
#endif

#define CUDA_TRY(call, what)                                                                                      \
    do {                                                                                                          \
        cudaError_t e_ = (call);                                                                                  \
        if (e_ != cudaSuccess) return util_fail(err, UTIL_ERUNTIME, "profile: %s: %s", what, cudaGetErrorString(e_)); \
    } while (0)

/* An attribute, 0 where the runtime does not know it. */
static int attribute(enum cudaDeviceAttr a, int dev)
{
    int v = 0;
    return cudaDeviceGetAttribute(&v, a, dev) == cudaSuccess ? v : 0;
}

int prof_device_facts(const prof_ctx *c, cost_profile *p, char *err)
{
    int count = 0, dev = 0;
    CUDA_TRY(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (count < 1) return util_fail(err, UTIL_ERUNTIME, "profile: no CUDA device");
    if (c->size > count)
        return util_fail(err, UTIL_EINVAL, "profile: %d ranks but %d GPU%s on this host (one rank per GPU)", c->size, count,
                         count > 1 ? "s" : "");
    CUDA_TRY(cudaGetDevice(&dev), "cudaGetDevice");   /* the communicator chose it: the rank on its node */
    struct cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    cost_profile_device *d = &p->dev;
    util_strlcpy(d->name, prop.name, sizeof d->name);
    d->cc_major = prop.major;
    d->cc_minor = prop.minor;
    d->sms = prop.multiProcessorCount;
    d->devices = count;
    d->clock_hz = attribute(cudaDevAttrClockRate, dev) * 1e3;
    d->mem_clock_hz = attribute(cudaDevAttrMemoryClockRate, dev) * 1e3;
    d->bus_bits = attribute(cudaDevAttrGlobalMemoryBusWidth, dev);
    if (cudaRuntimeGetVersion(&d->runtime_version) != cudaSuccess) d->runtime_version = 0;
    if (cudaDriverGetVersion(&d->driver_version) != cudaSuccess) d->driver_version = 0;
    const char *v = NULL;
    int a = 0, b = 0, n = 0;
    d->nccl_version = ex_comm_nccl_built(&v) && v && sscanf(v, "%d.%d.%d", &a, &b, &n) == 3 ? a * 10000 + b * 100 + n : 0;
    util_strlcpy(d->backend, c->be->name, sizeof d->backend);
    /* memory in use once the context and the communicator exist: what the
     * runtime keeps from tensors (and what other processes hold) */
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    p->phys_bytes = (double)total_b;
    p->used_bytes = (double)(total_b - free_b);
    p->used_from_meminfo = true;
    return UTIL_OK;
}
#else
int prof_device_facts(const prof_ctx *c, cost_profile *p, char *err)
{
    (void)c; (void)p;
    return util_fail(err, UTIL_EUNSUPPORTED, "profile: this dhp was built without CUDA");
}
#endif
