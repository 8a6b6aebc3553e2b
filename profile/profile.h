/* dhp profile: measures a backend of this host and writes what the planner
 * and the simulator read (costdb's dhp.gpu/1 and dhp.cluster/1). It sits
 * above the executor (layers util < models < costdb < planner < executor <
 * profile < cli) so that it times the executor's own kernels through the
 * backend table (executor/backend.h) and its collectives through the
 * communicator (executor/comm.h), the interfaces `dhp run` uses; the fits
 * and the derivation of the cost-model fields stay in costdb
 * (costdb/profile_fit.c, profile_json.c; rules in costdb/SCHEMA.md). */
#ifndef DHP_PROFILE_H
#define DHP_PROFILE_H

#include "costdb/costdb.h"
#include "executor/backend.h"

typedef struct {
    bool quick;                   /* a few seconds instead of about a minute */
    const ex_backend *be;         /* required: the backend timed (ex_backend_pick) */
    bool tf32;                    /* also the GEMM grid on TF32 tensor cores (--tf32: peak_flops_tf32) */
    /* optional: run once the rank's device is chosen, before any timing
     * (the CLI checks the CUDA kernels against the CPU backend); a failure
     * stops the profile with its message. */
    int (*check_kernels)(char *err);
} prof_opts;

/* Measures this host with o->be: the CPU backend (prof_measure_cpu: GEMM
 * grid, attention, STREAM, element-wise kernels, compute sharing, MPI
 * collectives) or a device backend (one device per rank: its GEMMs, attention, element-wise kernels, copies, launch cost, device
 * memory and NCCL collectives). Under mpirun (MPI not yet initialised) it
 * initialises MPI and finalises it before returning; every rank calls it and
 * gets the same result (p->rank differs). Fills p->gpu, p->fit and p->link. */
int prof_measure(const prof_opts *o, cost_profile *p, char *err);

#endif
