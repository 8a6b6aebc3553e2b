/* Recomputation against memory, plan by plan: the least full recomputation
 * (plan_module.recompute_layers, plan_block_recompute) that brings a plan's
 * worst GPU under its capacity, as `dhp memory` suggests it beside an OOM
 * verdict, and the search's trim of its plans to the fewest recomputed
 * blocks that fit. */
#include "planner/planner.h"

#include <stdbool.h>

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

/* Module k of p, recomputing fully, down to the fewest blocks a stage that
 * fit (none at all where that fits): bisected on plan_evaluate's memory (the
 * modules'), which falls as blocks recompute, then up a block at a time to
 * where the plan's own verdict agrees (the simulator's where it runs the
 * plan: the dhp target adds the hand-off's buffers, plan_sim_predict). p
 * changes only to a count that fits so, then evaluated and simulated. */
static int trim_module(plan_t *p, const plan_options *o, int k, char *err)
{
    static plan_t q;
    int longest = plan_longest_chunk(&p->model.mod[k], &p->mod[k]);
    int now = p->mod[k].recompute_layers > 0 ? p->mod[k].recompute_layers : longest, lo = -1, hi = now;
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2, rc;
        bool fits;
        if ((rc = with_blocks(p, o, k, mid, longest, &q, &fits, err))) return rc;
        if (fits) hi = mid;
        else lo = mid;
    }
    for (int m = hi; m <= now; m++) {
        bool fits;
        int rc = with_blocks(p, o, k, m, longest, &q, &fits, err);
        if (rc) return rc;
        plan_sim_predict(&q, NULL);   /* a plan the schedule does not run keeps plan_evaluate's verdict */
        if (q.pred.fits) {
            *p = q;
            break;
        }
    }
    return UTIL_OK;
}

/* q = p with the modules of `mask` trimmed in turn (trim_module), `first`
 * first and the others in order, then evaluated and simulated afresh. */
static int trim_in_order(const plan_t *p, const plan_options *o, unsigned mask, int first, plan_t *q, char *err)
{
    *q = *p;
    int rc = UTIL_OK;
    for (int i = 0; !rc && i < p->n_modules; i++) {
        int k = i == 0 ? first : i <= first ? i - 1 : i;
        if (mask >> k & 1) rc = trim_module(q, o, k, err);
    }
    plan_eval ev;
    if (!rc) rc = plan_evaluate(q, o, &ev, err);
    if (!rc) plan_sim_predict(q, NULL);
    return rc;
}

/* The fastest plan that fits of trimming the modules of `mask` with each of
 * them first once (the first trimmed takes back the memory the others then
 * cannot), into *best; *found false where none fits. */
static int trim_fastest(const plan_t *p, const plan_options *o, unsigned mask, plan_t *best, bool *found, char *err)
{
    static plan_t q;
    *found = false;
    for (int first = 0; first < p->n_modules; first++) {
        if (!(mask >> first & 1)) continue;
        int rc = trim_in_order(p, o, mask, first, &q, err);
        if (rc) return rc;
        if (q.pred.fits && (!*found || q.pred.step_time_s < best->pred.step_time_s)) {
            *best = q;
            *found = true;
        }
    }
    return UTIL_OK;
}

int plan_trim_recompute(plan_t *p, const plan_options *o, char *err)
{
    static plan_t best;
    unsigned mask = 0;
    for (int k = 0; k < p->n_modules; k++)
        if (p->mod[k].recompute == PLAN_RECOMP_FULL && model_runs_backward(&p->model.mod[k])) mask |= 1u << k;
    bool found = false;
    int rc = mask ? trim_fastest(p, o, mask, &best, &found, err) : UTIL_OK;
    if (!rc && found) *p = best;
    return rc;
}

/* Whether module k of p could recompute more than it does: it runs a
 * backward and does not recompute every block already. */
static bool can_recompute_more(const plan_t *p, int k)
{
    const plan_module *s = &p->mod[k];
    return model_runs_backward(&p->model.mod[k]) && !(s->recompute == PLAN_RECOMP_FULL && s->recompute_layers == 0);
}

/* q = p with the modules of `mask` recomputing every block, evaluated; whether it fits. */
static int all_blocks(const plan_t *p, const plan_options *o, unsigned mask, plan_t *q, bool *fits, char *err)
{
    *q = *p;
    for (int k = 0; k < p->n_modules; k++)
        if (mask >> k & 1) {
            q->mod[k].recompute = PLAN_RECOMP_FULL;
            q->mod[k].recompute_layers = 0;
        }
    plan_eval ev;
    int rc = plan_evaluate(q, o, &ev, err);
    *fits = !rc && ev.peak_mem <= ev.capacity;
    return rc;
}

/* p with the modules of `mask` recomputing every block, then each down to
 * its fewest blocks in turn (trim_fastest), into *out; *found false where
 * even every block recomputed does not fit. */
static int recompute_to_fit(const plan_t *p, const plan_options *o, unsigned mask, plan_t *out, bool *found,
                            char *err)
{
    static plan_t q;
    bool fits;
    *found = false;
    int rc = all_blocks(p, o, mask, &q, &fits, err);
    if (rc || !fits) return rc;
    return trim_fastest(&q, o, mask, out, found, err);
}

int plan_fit_by_recompute(const plan_t *p, const plan_options *o, plan_t *out, unsigned *changed, char *err)
{
    static plan_t q;
    unsigned every = 0;
    bool any = false;
    *changed = 0;
    for (int k = 0; k < p->n_modules; k++) {   /* one module: the fastest of each's fewest blocks that fit */
        if (!can_recompute_more(p, k)) continue;
        every |= 1u << k;
        bool found;
        int rc = recompute_to_fit(p, o, 1u << k, &q, &found, err);
        if (rc) return rc;
        if (found && (!any || q.pred.step_time_s < out->pred.step_time_s)) {
            *out = q;
            any = true;
        }
    }
    if (!any && every) {   /* none alone: all of them */
        int rc = recompute_to_fit(p, o, every, out, &any, err);
        if (rc) return rc;
    }
    for (int k = 0; any && k < p->n_modules; k++)
        if (out->mod[k].recompute != p->mod[k].recompute || out->mod[k].recompute_layers != p->mod[k].recompute_layers)
            *changed |= 1u << k;
    return UTIL_OK;
}
