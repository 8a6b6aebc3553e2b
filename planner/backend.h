/* The backend a memory prediction is for (dhp memory / simulate / plan
 * --backend; dhp run: the one it picked), and what that backend allocates
 * beside the buffers planner/layout.c lists. Included by planner.h, and by
 * executor/cuda_gemm.cuh for the workspace's size (one owner). */
#ifndef DHP_PLANNER_BACKEND_H
#define DHP_PLANNER_BACKEND_H

/* The CUDA backend's own device buffers, one allocation per process on its
 * first GEMM or reduction (executor/cuda_kernels.cu backend_workspace),
 * charged to category workspace, PLAN_CUDA_WORKSPACE_BYTES in all:
 *  - cuBLASLt's workspace: cuBLAS's recommended size for Hopper (cuBLAS
 *    documentation, cublasSetWorkspace: "32 MiB for Hopper"), enough for
 *    Ampere's 4 MiB;
 *  - the reductions' partial sums (sumsq, cross_entropy): a double per block,
 *    at most 1,024 blocks;
 *  - the bias gradient that cuBLASLt's BGRADB epilogue stores before it is
 *    added into db: a float per output of the linear, up to 65,536 outputs
 *    (the zoo's widest biased linear has 12,800: InternViT-6B's MLP); a wider
 *    linear sums its bias gradient in a pass of its own instead. */
#define PLAN_CUDA_LT_WORKSPACE_BYTES ((size_t)32 << 20)
#define PLAN_CUDA_REDUCE_BYTES ((size_t)1024 * sizeof(double))
#define PLAN_CUDA_BGRAD_FLOATS 65536
#define PLAN_CUDA_WORKSPACE_BYTES \
    (PLAN_CUDA_LT_WORKSPACE_BYTES + PLAN_CUDA_REDUCE_BYTES + (size_t)PLAN_CUDA_BGRAD_FLOATS * sizeof(float))

/* The backends dhp run has; PLAN_BACKEND_DEVICE (the default where --backend
 * is not given) is the one the pool's device runs: cpu for a CPU description
 * (dhp profile's on a CPU), cuda for a GPU (plan_backend_on). */
typedef enum { PLAN_BACKEND_CUDA = 0, PLAN_BACKEND_CPU, PLAN_NBACKEND, PLAN_BACKEND_DEVICE = PLAN_NBACKEND } plan_backend;

#endif
