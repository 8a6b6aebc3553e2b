/* Whether this process can use a CUDA device (included by
 * executor/cuda_kernels.cu): one line saying why not. The runtime reports a
 * missing driver and a driver older than itself with the same error,
 * cudaErrorInsufficientDriver; cudaDriverGetVersion tells them apart (it
 * gives 0 when no driver is installed: CUDA Runtime API, "Version
 * Management", docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART____VERSION.html).
 * Versions are 1000 * major + 10 * minor. */

static void cuda_version_text(int v, char *buf, size_t n) { snprintf(buf, n, "%d.%d", v / 1000, v % 1000 / 10); }

/* true when a device is usable; else err holds the one line. */
static bool cuda_device_usable(char *err)
{
    int count = 0, driver = 0, runtime = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count > 0) return true;
    (void)cudaGetLastError();   /* not a sticky error of the kernels */
    if (e == cudaErrorInsufficientDriver) {
        char d[16], rt[16];
        if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
        if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
        cuda_version_text(runtime, rt, sizeof rt);
        if (driver <= 0) {
            util_fail(err, UTIL_ERUNTIME, "no CUDA device: no NVIDIA driver is installed (libcuda.so.1 not found; "
                      "this dhp's CUDA runtime is %s)", rt);
        } else {
            cuda_version_text(driver, d, sizeof d);
            util_fail(err, UTIL_ERUNTIME, "the NVIDIA driver supports CUDA %s, older than this dhp's CUDA runtime %s: "
                      "update the driver (or build dhp with a CUDA toolkit <= %s)", d, rt, d);
        }
        return false;
    }
    util_fail(err, UTIL_ERUNTIME, "no CUDA device: %s", cudaGetErrorString(e != cudaSuccess ? e : cudaErrorNoDevice));
    return false;
}
