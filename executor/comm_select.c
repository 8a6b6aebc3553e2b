/* Which communicator a run uses (dhp run --comm) and which GPU a process
 * drives: one process per GPU, the GPU being the process's rank among the
 * ranks on its node. */
#include "executor/comm.h"
#include "executor/comm_int.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ex_comm_pick(const char *asked, bool cuda_backend, ex_comm_kind *out, char *line, size_t line_len, char *err)
{
    const char *version = NULL;
    bool nccl = ex_comm_nccl_built(&version);
    static const char *const names[] = { "mpi", "nccl" };
    char bad[UTIL_ERR_LEN];
    if (asked && util_name_index(asked, names, 2, bad) < 0) return util_fail(err, UTIL_EINVAL, "--comm: %s", bad);
    if (asked && !strcmp(asked, "nccl") && !nccl) {
        char why[UTIL_ERR_LEN];
        comm_nccl_ops(why);
        return util_fail(err, UTIL_EUNSUPPORTED, "--comm nccl: %s", why);
    }
    /* the tests' emulation's device memory is host memory: there the CPU
     * backend's buffers are NCCL's, which is how NCCL runs without a GPU */
    if (asked && !strcmp(asked, "nccl") && !cuda_backend && !comm_nccl_emulated())
        return util_fail(err, UTIL_EINVAL, "--comm nccl moves device memory: it needs the CUDA backend");
    *out = asked ? (!strcmp(asked, "nccl") ? EX_COMM_NCCL : EX_COMM_MPI)
                 : cuda_backend && nccl ? EX_COMM_NCCL : EX_COMM_MPI;
    const char *why = asked ? "--comm" : *out == EX_COMM_NCCL ? "default with the CUDA backend"
                    : !cuda_backend ? "default with the CPU backend" : "default: this dhp was built without NCCL";
    if (*out == EX_COMM_NCCL)
        snprintf(line, line_len, "comm: nccl %s (%s; one NCCL communicator per rank group)", version, why);
    else
        snprintf(line, line_len, "comm: mpi (%s)", why);
    return UTIL_OK;
}

static int env_rank(const char *name)
{
    const char *v = getenv(name);
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : -1;
    return v && end != v && !*end && x >= 0 && x < (1 << 20) ? (int)x : -1;
}

int ex_comm_local_rank(const ex_comm *world)
{
    int local = env_rank("OMPI_COMM_WORLD_LOCAL_RANK");
    if (local < 0) local = env_rank("SLURM_LOCALID");
    if (local >= 0 || world->self) return local >= 0 ? local : 0;
    MPI_Comm node;
    if (MPI_Comm_split_type(world->mpi, MPI_COMM_TYPE_SHARED, world->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) return -1;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    return local;
}
