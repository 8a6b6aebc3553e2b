// The emulator's device-pointer guard (tests/cudaemu.h, CUDAEMU_GUARD), as
// dhp-emu builds it: `guard_check device` launches a kernel and copies with
// device pointers (exit 0); `guard_check kernel` hands a kernel a host
// pointer, `guard_check copy` gives cudaMemcpy a device pointer as its host
// source: both must abort naming the call (tests/t_backend.sh). `guard_check
// pinned` copies from page-locked memory (cudaMallocHost) with
// cudaMemcpyAsync and writes the source only after cudaDeviceSynchronize
// (exit 0); `guard_check pinned-race` writes it before: the synchronize
// must abort (tests/cudaemu.h cudaemu_synchronized).
#include <cstdio>
#include <cstring>

static void scale_kernel(float *y, float s, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) y[i] *= s;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "device";
    float host[64];
    for (int i = 0; i < 64; i++) host[i] = (float)i;
    void *dev = nullptr;
    if (cudaMalloc(&dev, sizeof host) != cudaSuccess) return 1;
    cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice);
    if (!strncmp(what, "pinned", 6)) {
        float *pin = nullptr;
        if (cudaMallocHost((void **)&pin, sizeof host) != cudaSuccess) return 1;
        for (int i = 0; i < 64; i++) pin[i] = (float)i;
        cudaMemcpyAsync(dev, pin, sizeof host, cudaMemcpyHostToDevice, 0);
        if (!strcmp(what, "pinned-race")) pin[0] = -1.0f;   /* the copy may not have read it yet */
        cudaemu_launch_named("scale_kernel", scale_kernel, dim3(2), dim3(32), (float *)dev, 2.0f, 64);
        cudaDeviceSynchronize();
        for (int i = 0; i < 64; i++) pin[i] = 0.0f;           /* after the synchronize: the copy is done */
        cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost);
        cudaFreeHost(pin);
        cudaFree(dev);
        for (int i = 0; i < 64; i++)
            if (host[i] != 2.0f * (float)i) return 1;
        std::puts("pinned source written after the synchronize: no complaint");
        return 0;
    }
    if (!strcmp(what, "kernel")) cudaemu_launch_named("scale_kernel", scale_kernel, dim3(2), dim3(32), (float *)host, 2.0f, 64);
    if (!strcmp(what, "copy")) cudaMemcpy(dev, dev, sizeof host, cudaMemcpyHostToDevice);
    cudaemu_launch_named("scale_kernel", scale_kernel, dim3(2), dim3(32), (float *)dev, 2.0f, 64);
    cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost);
    cudaFree(dev);
    for (int i = 0; i < 64; i++)
        if (host[i] != 2.0f * (float)i) return 1;
    std::puts("device pointers only: no complaint");
    return 0;
}
