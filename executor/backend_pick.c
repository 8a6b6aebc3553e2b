/* Which backend a run uses (dhp run --backend): chosen once by the driver
 * and handed to the model, so nothing below picks its own. */
#include "executor/backend.h"
#include "executor/executor.h"

#include <stdio.h>
#include <string.h>

static const char *const backend_names[] = { "cpu", "cuda", "auto" };

bool ex_backend_name_ok(const char *want, char *err)
{
    return !want || util_name_index(want, backend_names, 3, err) >= 0;
}

const ex_backend *ex_backend_pick(const char *want, char *why, size_t why_len, char *err)
{
    bool any = !want || !strcmp(want, "auto");
    char bad[UTIL_ERR_LEN];
    if (!ex_backend_name_ok(want, bad)) {
        util_fail(err, UTIL_EINVAL, "--backend: %s", bad);
        return NULL;
    }
    if (!any && !strcmp(want, "cpu")) {
        snprintf(why, why_len, "backend: cpu (asked with --backend cpu)");
        return ex_backend_cpu();
    }
    char cuda_err[UTIL_ERR_LEN] = "";
    const ex_backend *be = ex_backend_cuda(cuda_err);
    if (be) {
        bool emu = ex_backend_emulated(be);
        snprintf(why, why_len, "backend: %s (%s%s)", be->name, any ? "a CUDA device is visible" : "asked with --backend cuda",
                 emu ? "; emulated on the CPU" : "");
        return be;
    }
    if (!any) {
        util_fail(err, UTIL_EUNSUPPORTED, "--backend cuda: %s", cuda_err);
        return NULL;
    }
    snprintf(why, why_len, "backend: cpu (%s)", cuda_err);
    return ex_backend_cpu();
}

int ex_backend_tf32(const ex_backend *be, bool on, char *err)
{
    if (be->set_tf32) be->set_tf32(on);
    else if (on)
        return util_fail(err, UTIL_EUNSUPPORTED, "--tf32: backend %s has no TF32 mode (a tensor-core format; it computes "
                         "fp32 GEMMs exactly): run on a GPU (--backend cuda), or without --tf32", be->name);
    return UTIL_OK;
}
