/* The CUDA entry points of a build without nvcc (make CUDA=0 or no CUDA
 * toolkit): they say so. With CUDA the .cu file defines them. */
#include "executor/backend.h"
#include "util/util.h"

#ifndef DHP_CUDA
const ex_backend *ex_backend_cuda(char *err)
{
    util_fail(err, UTIL_EUNSUPPORTED, "this dhp was built without CUDA (no nvcc at build time; make CUDA=1 NVCC=...)");
    return NULL;
}

int ex_cuda_sync(char *err)
{
    return util_fail(err, UTIL_EUNSUPPORTED, "this dhp was built without CUDA");
}

int ex_cuda_blas_load(const char *library, char *err)
{
    (void)library;
    return util_fail(err, UTIL_EUNSUPPORTED, "this dhp was built without CUDA");
}
#else
typedef int ex_cuda_none_unused;   /* ISO C wants a declaration in every file */
#endif
