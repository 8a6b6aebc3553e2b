/* cuBLASLt's entry points, the ones the GEMMs (cuda_gemm.cuh) call, in one
 * table (included by executor/cuda_kernels.cu before cuda_gemm.cuh).
 *
 * Why a table and not a link-time dependency: libcublasLt's static
 * initialisers run at the start of every process that links it, whether or
 * not it ever multiplies a matrix. Measured on this project's 2-core CI
 * machine: an empty main linked with dhp's other libraries starts in 27 ms,
 * with -lcublasLt added in 229 ms (50 runs each, CUDA 13.0). dhp plan, dhp
 * memory, dhp simulate and every rank of a CPU run paid that. So the library
 * is opened (dlopen) when the CUDA backend is first asked for
 * (ex_backend_cuda) and the calls go through lt_api; the CUDA runtime and
 * NCCL stay linked (a few ms each, and the kernels' registration needs the
 * runtime at start-up).
 *
 * Under the CPU emulator of the tests (EX_CUDA_EMU) the table holds the
 * emulator's stand-ins (tests/cudaemu_lt.h), so the GEMMs run the same calls. */

#define LT_ENTRY_POINTS(X)              \
    X(cublasLtCreate)                   \
    X(cublasLtGetStatusString)          \
    X(cublasLtMatmulDescCreate)         \
    X(cublasLtMatmulDescSetAttribute)   \
    X(cublasLtMatmulDescDestroy)        \
    X(cublasLtMatrixLayoutCreate)       \
    X(cublasLtMatrixLayoutDestroy)      \
    X(cublasLtMatmul)

/* Each field is named and typed as the function it stands for. */
typedef struct {
#define LT_FIELD(f) decltype(&::f) f;
    LT_ENTRY_POINTS(LT_FIELD)
#undef LT_FIELD
} lt_entry_points;

static lt_entry_points lt_api;   /* filled by lt_api_ready before the backend's table is handed out */

#ifndef EX_CUDA_EMU
#include <dlfcn.h>

#define LT_STR_(x) #x
#define LT_STR(x) LT_STR_(x)
/* The soname of the cuBLASLt dhp was compiled against (its major version:
 * cublas_api.h's CUBLAS_VER_MAJOR); the executable's run path (the Makefile's
 * -rpath to the CUDA toolkit) is searched first, then LD_LIBRARY_PATH and the
 * system's. */
#define LT_LIBRARY "libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR)

/* Opens library (NULL: LT_LIBRARY) and fills *api with its entry points;
 * UTIL_ERUNTIME with err naming the library and what failed. The library
 * stays open for the life of the process. */
static int lt_api_resolve(const char *library, lt_entry_points *api, char *err)
{
    if (!library) library = LT_LIBRARY;
    void *lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return util_fail(err, UTIL_ERUNTIME, "the CUDA backend's GEMMs need cuBLASLt, which could not be loaded: %s "
                         "(install the CUDA toolkit's cuBLAS %d, or put its lib64 on LD_LIBRARY_PATH)", dlerror(),
                         CUBLAS_VER_MAJOR);
#define LT_RESOLVE(f)                                                                                        \
    if (!(api->f = (decltype(api->f))dlsym(lib, #f)))                                                        \
        return util_fail(err, UTIL_ERUNTIME, "%s has no %s: a cuBLASLt older than the %d.%d dhp was built with", \
                         library, #f, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR);
    LT_ENTRY_POINTS(LT_RESOLVE)
#undef LT_RESOLVE
    return UTIL_OK;
}

/* The check of lt_api_resolve on a given library, without touching lt_api
 * (tests: the toolkit's library resolves; an absent one is named). */
extern "C" int ex_cuda_blas_load(const char *library, char *err)
{
    lt_entry_points scratch;
    return lt_api_resolve(library, &scratch, err);
}
#else
static int lt_api_resolve(const char *library, lt_entry_points *api, char *err)
{
    (void)library;
    (void)err;
#define LT_EMULATED(f) api->f = &::f;
    LT_ENTRY_POINTS(LT_EMULATED)
#undef LT_EMULATED
    return UTIL_OK;
}
#endif

/* lt_api filled from LT_LIBRARY, once per process (the outcome, and its
 * message, kept for later calls); false with err saying why. */
static bool lt_api_ready(char *err)
{
    static char failure[UTIL_ERR_LEN];
    static const int code = lt_api_resolve(NULL, &lt_api, failure);
    if (code) util_fail(err, code, "%s", failure);
    return code == UTIL_OK;
}
