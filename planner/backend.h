/* The backend a memory prediction is for (dhp memory / simulate / plan
 * --backend; dhp run: the one it picked), and what that backend allocates
 * beside the buffers planner/layout.c lists. Included by planner.h, and by
 * executor/cuda_gemm.cuh for the workspace's size (one owner). */
#ifndef DHP_PLANNER_BACKEND_H
#define DHP_PLANNER_BACKEND_H

/* The CUDA backend's cuBLASLt workspace, allocated once per process on its
 * first GEMM: cuBLAS's recommended size for Hopper (cuBLAS documentation,
 * cublasSetWorkspace: "32 MiB for Hopper"), enough for Ampere's 4 MiB. */
#define PLAN_CUDA_LT_WORKSPACE_BYTES ((size_t)32 << 20)

/* The backends dhp run has; PLAN_BACKEND_DEVICE (the default where --backend
 * is not given) is the one the pool's device runs: cpu for a CPU description
 * (dhp profile's on a CPU), cuda for a GPU (plan_backend_on). */
typedef enum { PLAN_BACKEND_CUDA = 0, PLAN_BACKEND_CPU, PLAN_NBACKEND, PLAN_BACKEND_DEVICE = PLAN_NBACKEND } plan_backend;

#endif
