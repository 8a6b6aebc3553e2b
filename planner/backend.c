/* The backend a memory prediction is for, and the bytes it allocates
 * outside the layout (planner/backend.h). */
#include "planner/planner_int.h"

#include <string.h>

static const char *const backend_names[PLAN_NBACKEND] = { "cuda", "cpu" };

const char *plan_backend_name(plan_backend b) { return b >= 0 && b < PLAN_NBACKEND ? backend_names[b] : "?"; }

PLAN_ENUM_PARSE(plan_backend_parse, plan_backend, backend_names, PLAN_NBACKEND)

plan_backend plan_backend_on(plan_backend b, const cost_gpu *g)
{
    if (b != PLAN_BACKEND_DEVICE) return b;
    return cost_gpu_is_cpu(g) ? PLAN_BACKEND_CPU : PLAN_BACKEND_CUDA;
}

plan_backend plan_backend_of(const plan_t *p) { return plan_backend_on(p->backend, &p->cluster.pool[0].gpu); }

double plan_reserved_bytes(const plan_options *o, const cost_gpu *g)
{
    return o->target == PLAN_TARGET_DHP ? g->reserved_bytes - g->reserved_workspace_bytes : g->reserved_bytes;
}

double plan_backend_workspace_bytes(const plan_options *o, const cost_gpu *g)
{
    if (o->target != PLAN_TARGET_DHP || plan_backend_on(o->backend, g) != PLAN_BACKEND_CUDA) return 0;
    return (double)PLAN_CUDA_WORKSPACE_BYTES;
}
