/* executor: runs a plan for real. One algorithm, two backends (CPU: BLAS +
 * MPI; CUDA: cuBLAS + NCCL + own kernels) behind small kernel and
 * communicator interfaces. Public names are prefixed ex_. */
#ifndef DHP_EXECUTOR_H
#define DHP_EXECUTOR_H

#include "util/util.h"
#include "models/models.h"
#include "planner/planner.h"

/* ---- model, kernels, training step ---- */

/* ---- data set and checkpoints ---- */

#endif
