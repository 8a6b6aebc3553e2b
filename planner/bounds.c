/* How much a plan makes the simulator and the schedule allocate and compute,
 * estimated from its sizes before anything is built, so that a large plan is
 * refused up front with the number that makes it large instead of eating
 * memory and time first (a global batch of 2^28 samples of tiny-vl on 4 CPU
 * ranks took 6.7 GB and 29 s before). The estimates are upper bounds of the
 * loops of planner/schedule.c and planner/simulate.c; the limits hold a
 * simulation to about 2 GB and, measured on a 2-core VM, half a minute. */
#include "planner/planner.h"

#include <math.h>
#include <stdio.h>

static double ceil_div(double a, double b) { return b > 0 ? ceil(a / b) : a; }

static bool is_encoder(const plan_t *p, int k) { return k != p->model.llm && p->work.images_per_sample > 0; }

void plan_sim_size(const plan_t *p, double *ops, double *work)
{
    double n = plan_chunks(p), world = p->world_size, B = p->work.global_batch;
    /* per step: sync, norm, optimizer, gather, embedding sync */
    double chunk = ceil_div(B, n), per_rank = 4.0 * p->n_modules + 1, checks = 0, seg_cost = 0;
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        double micro = ceil_div(ceil_div(chunk, s->dp), s->micro_batch > 0 ? s->micro_batch : 1);
        /* per micro-batch a pipeline stage receives, runs forward, sends, and the same backward;
         * per chunk the hand-off's send and receive */
        per_rank += n * (6 * micro + 3);
        checks += n * s->dp * (is_encoder(p, k) ? micro + 1 : 1);
        if (is_encoder(p, k)) {
            const plan_module *l = &p->mod[p->model.llm];
            seg_cost += (double)s->n_ranks * micro * (l->dp + l->tp);
        }
    }
    /* hand-off segments: built per chunk and direction for the message table,
     * and per hand-off op of every rank for the executor's buffers (fp32) */
    double handoffs = (p->precision == PLAN_OPT_FP32 ? world * 2 * n : 0) + 2 * n;
    *ops = world * per_rank;
    *work = *ops + world * checks + handoffs * seg_cost;
}

int plan_sim_check_size(const plan_t *p, char *err)
{
    double ops, work;
    plan_sim_size(p, &ops, &work);
    if (ops > PLAN_SIM_MAX_OPS)
        return util_fail(err, UTIL_EINVAL, "simulate: %d ranks x %d chunks make %.3g ops, above the simulator's limit of %.3g "
                         "(fewer chunks: a larger dp x micro_batch, or a smaller global batch)",
                         p->world_size, plan_chunks(p), ops, (double)PLAN_SIM_MAX_OPS);
    if (work > PLAN_SIM_MAX_WORK)
        return util_fail(err, UTIL_EINVAL, "simulate: %d ranks x %d chunks need about %.3g steps of scheduling, above the "
                         "simulator's limit of %.3g", p->world_size, plan_chunks(p), work, (double)PLAN_SIM_MAX_WORK);
    return UTIL_OK;
}
