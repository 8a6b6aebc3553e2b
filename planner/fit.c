/* What makes a plan that does not fit fit, by recomputation alone: the
 * least full recomputation of one module (plan_module.recompute_layers,
 * plan_block_recompute) that brings the worst GPU under its capacity, as
 * `dhp memory` suggests it beside an OOM verdict. */
#include "planner/planner.h"

#include <math.h>

int plan_fit_by_recompute(const plan_t *p, const plan_options *o, plan_t *out, int *module, char *err)
{
    static plan_t q;   /* a plan is large: one scratch copy, as the CLI holds its own */
    double best = INFINITY;
    *module = -1;
    for (int k = 0; k < p->n_modules; k++) {
        const model_module *mm = &p->model.mod[k];
        const plan_module *s = &p->mod[k];
        if (!model_runs_backward(mm) || (s->recompute == PLAN_RECOMP_FULL && s->recompute_layers == 0)) continue;
        int longest = plan_longest_chunk(mm, s);
        int n = s->recompute == PLAN_RECOMP_FULL ? s->recompute_layers + 1 : 1;
        for (; n <= longest; n++) {   /* each more recomputed block saves memory and costs time */
            q = *p;
            q.mod[k].recompute = PLAN_RECOMP_FULL;
            q.mod[k].recompute_layers = n < longest ? n : 0;
            plan_eval ev;
            int rc = plan_evaluate(&q, o, &ev, err);
            if (rc) return rc;
            if (ev.peak_mem > ev.capacity) continue;
            if (q.pred.step_time_s < best) {
                best = q.pred.step_time_s;
                *out = q;
                *module = k;
            }
            break;
        }
    }
    return UTIL_OK;
}

/* Module k of p recomputing m blocks a stage (m of its longest chunk's: full
 * recomputation of them all; 0: none) into q, evaluated; whether it fits. */
static int with_blocks(const plan_t *p, const plan_options *o, int k, int m, int longest, plan_t *q, bool *fits,
                       char *err)
{
    *q = *p;
    q->mod[k].recompute = m > 0 ? PLAN_RECOMP_FULL : PLAN_RECOMP_NONE;
    q->mod[k].recompute_layers = m > 0 && m < longest ? m : 0;
    plan_eval ev;
    int rc = plan_evaluate(q, o, &ev, err);
    *fits = !rc && ev.peak_mem <= ev.capacity;
    return rc;
}

int plan_trim_recompute(plan_t *p, const plan_options *o, char *err)
{
    static plan_t q, best;
    for (int k = 0; k < p->n_modules; k++) {
        const model_module *mm = &p->model.mod[k];
        if (p->mod[k].recompute != PLAN_RECOMP_FULL || !model_runs_backward(mm)) continue;
        int longest = plan_longest_chunk(mm, &p->mod[k]);
        /* the memory falls as blocks recompute: bisect for the fewest that fit, below the chosen hi */
        int lo = -1, hi = p->mod[k].recompute_layers > 0 ? p->mod[k].recompute_layers : longest;
        bool found = false;
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2, rc;
            bool fits;
            if ((rc = with_blocks(p, o, k, mid, longest, &q, &fits, err))) return rc;
            if (fits) {
                hi = mid;
                best = q;
                found = true;
            } else {
                lo = mid;
            }
        }
        if (found) *p = best;
    }
    return UTIL_OK;
}
