/* `dhp run --backend cpu|cuda|auto`: the backend is chosen once, here, and
 * handed to the model (ex_model_create_per_module) and to every buffer the
 * driver allocates. A backend whose memory is not host memory (a GPU; dhp-emu
 * takes the same paths) needs the NCCL communicator on more than one rank:
 * MPI would be handed device pointers (dhp does not assume a CUDA-aware MPI). */
#include "executor/run_internal.h"

#include <stdio.h>
#include <string.h>

int run_pick_backend(run_ctx *r, char *err)
{
    const char *want = r->o->backend;
    char why[UTIL_ERR_LEN + 64] = "";
    const ex_backend *be = ex_backend_pick(want, why, sizeof why, err);
    if (!be) {
        if (r->rank != 0) err[0] = '\0';   /* one line: rank 0's */
        return UTIL_EUNSUPPORTED;
    }
    if (!be->host_memory && r->size > 1 && ex_comm_kind_of(r->world) != EX_COMM_NCCL) {
        if (want && !strcmp(want, "cuda")) {
            if (r->rank == 0)
                return util_fail(err, UTIL_EUNSUPPORTED, "--backend cuda: %d ranks over MPI would hand it device memory; use --comm nccl (or --backend cpu)", r->size);
            err[0] = '\0';
            return UTIL_EUNSUPPORTED;
        }
        be = ex_backend_cpu();
        snprintf(why, sizeof why, "backend: cpu (a CUDA device is visible, but the communicator is MPI: %d ranks need --comm nccl to run on it)", r->size);
    }
    r->be = be;
    if (r->rank == 0) {
        bool stdout_busy = r->o->log_json || (r->o->trace_path && !strcmp(r->o->trace_path, "-"));
        fprintf(stdout_busy ? stderr : stdout, "%s\n", why);
        fflush(stdout_busy ? stderr : stdout);
    }
    return UTIL_OK;
}
