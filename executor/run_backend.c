/* `dhp run --backend cpu|cuda|auto`: the backend is chosen once, here, and
 * handed to the model (ex_model_create_per_module) and to every buffer the
 * driver allocates. A backend whose memory is not host memory (a GPU; dhp-emu
 * takes the same paths) needs the NCCL communicator on more than one rank:
 * MPI would be handed device pointers (dhp does not assume a CUDA-aware MPI). */
#include "executor/run_internal.h"
#include "executor/precision.h"

#include <stdio.h>
#include <string.h>

/* --tf32, or a plan made with it: precision fp32's linears on TF32 tensor
 * cores (planner/precision.c's rule for the precision, ex_backend_tf32's
 * for the backend: the CPU's has none). */
static int pick_tf32(run_ctx *r, const ex_backend *be, char *why, size_t why_len, char *err)
{
    plan_options po = plan_options_of(&r->plan);
    po.tf32 = po.tf32 || r->o->tf32;
    int rc = po.tf32 ? plan_tf32_check(&po, err) : UTIL_OK;
    if (!rc) rc = ex_backend_tf32(be, po.tf32, err);
    if (rc) {
        if (r->rank != 0) err[0] = '\0';   /* one line: rank 0's */
        return rc;
    }
    if (!po.tf32) return UTIL_OK;
    size_t len = strlen(why);
    snprintf(why + len, why_len - len, "; fp32 linears on TF32 tensor cores (--tf32)");
    return UTIL_OK;
}

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
    int rc = pick_tf32(r, be, why, sizeof why, err);
    if (rc) return rc;
    /* what the plan's memory model predicts for this run (planner/backend.h: the CUDA backend's workspace) */
    r->plan.backend = be == ex_backend_cpu() ? PLAN_BACKEND_CPU : PLAN_BACKEND_CUDA;
    plan_options po = plan_options_of(&r->plan);
    r->be = ex_precision_backend(be, &po);   /* bf16-mixed / -autocast: the linears on bf16 operands */
    if (r->rank == 0) {
        bool stdout_busy = r->o->log_json || (r->o->trace_path && !strcmp(r->o->trace_path, "-"));
        fprintf(stdout_busy ? stderr : stdout, "%s\n", why);
        fflush(stdout_busy ? stderr : stdout);
    }
    return UTIL_OK;
}

/* "; the plan predicts rank R's peak at ... (dhp memory PLAN)" after an
 * out-of-memory line: what the plan's memory model said this rank needs,
 * beside what the device had. */
static void append_prediction(run_ctx *r, char *err)
{
    plan_sim_mem pred;
    char ignored[UTIL_ERR_LEN];
    if (plan_sim_memory(&r->plan, r->rank, &pred, ignored) != UTIL_OK) return;
    char peak[24], cap[24];
    util_fmt_bytes(pred.total, peak, sizeof peak);
    util_fmt_bytes(pred.capacity, cap, sizeof cap);
    size_t len = strlen(err);
    snprintf(err + len, UTIL_ERR_LEN - len, "; the plan predicts rank %d's peak at %s of the %s per GPU it assumed "
             "(dhp memory %s)", r->rank, peak, cap, r->o->plan_path);
}

/* A caller that sees a NULL from the backend's alloc says "out of memory"
 * in its own words; the CUDA backend kept the failure's details (device,
 * bytes asked and free, category) as its sticky error, which sync hands
 * over. */
int run_backend_explain(run_ctx *r, int rc, const char *doing, char *err)
{
    if (!rc || !r->be || !r->be->sync) return rc;
    char why[UTIL_ERR_LEN];
    int sync_rc = r->be->sync(why);
    if (sync_rc == UTIL_OK) return rc;
    size_t at = doing ? (size_t)snprintf(err, UTIL_ERR_LEN, "%s: ", doing) : 0;
    util_strlcpy(err + (at < UTIL_ERR_LEN ? at : 0), why, UTIL_ERR_LEN - (at < UTIL_ERR_LEN ? at : 0));
    if (rc == UTIL_ENOMEM || sync_rc == UTIL_ENOMEM) append_prediction(r, err);
    return rc;
}

/* The step's end: the backend's queued work done, a failure it kept
 * returned; an allocation that failed inside a kernel's call (the cuBLASLt
 * workspace, made on the first GEMM) reaches the run only here, and gets the
 * same prediction as one a caller saw. */
int run_backend_sync(run_ctx *r, char *err)
{
    int rc = r->be->sync(err);
    if (rc == UTIL_ENOMEM) append_prediction(r, err);
    return rc;
}
