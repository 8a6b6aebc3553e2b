/* Turning module strategies into a whole plan: rank assignment, evaluation,
 * and the search driver (MILP, then the next-best plans by no-good cuts). */
#include "planner/planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Disaggregated groups are packed pool by pool, widest tensor parallelism
 * first, then largest; plan_validate refuses a packing in which a
 * tensor-parallel group would straddle a node boundary. */
static void assign_ranks(plan_t *p)
{
    if (p->placement == PLAN_COLOCATED) {
        for (int k = 0; k < p->n_modules; k++) p->mod[k].first_rank = 0;
        p->world_size = p->mod[0].n_ranks;
        return;
    }
    int next = 0;
    for (int pool = 0; pool < p->cluster.n_pools; pool++) {
        bool placed[MODEL_MAX_MODULES] = { false };
        for (;;) {
            int best = -1;
            for (int k = 0; k < p->n_modules; k++) {
                if (placed[k] || p->mod[k].pool != pool) continue;
                const plan_module *a = &p->mod[k];
                const plan_module *b = best < 0 ? NULL : &p->mod[best];
                if (!b || a->tp > b->tp || (a->tp == b->tp && a->n_ranks > b->n_ranks)) best = k;
            }
            if (best < 0) break;
            placed[best] = true;
            p->mod[best].first_rank = next;
            next += p->mod[best].n_ranks;
        }
    }
    p->world_size = next;
}

void plan_init(plan_t *p, const model_t *m, const cost_cluster *c, const plan_workload *w,
                      const plan_options *o)
{
    memset(p, 0, sizeof *p);
    p->version = PLAN_SCHEMA_VERSION;
    p->model = *m;
    p->cluster = *c;
    p->work = *w;
    p->precision = o->precision;
    p->target = o->target;
    p->zero3 = o->zero3;
    p->adamw = o->adamw;
    p->optim_dtype = o->optim_dtype;
    p->grad_reduce = o->grad_reduce;
    p->tp_style = o->tp_style;
    p->pipe_engine = o->pipe_engine;
    p->grad_accum = o->grad_accum;
    p->fp8 = o->fp8;
    p->tp_comm_overlap = o->tp_comm_overlap;
    p->loss = o->loss;
    p->attention = o->attention;
    p->tf32 = o->tf32;
    p->backend = o->backend;
    p->n_modules = m->n_modules;
    p->n_micro = 1;
}

int plan_assemble(plan_t *p, const plan_options *o, char *err)
{
    for (int k = 0; k < p->n_modules; k++) {
        plan_module *s = &p->mod[k];
        s->module_index = k;
        util_strlcpy(s->module, p->model.mod[k].name, sizeof s->module);
        s->n_ranks = s->dp * s->tp * s->sp * s->pp;
    }
    assign_ranks(p);
    plan_eval ev;
    int rc = plan_evaluate(p, o, &ev, err);
    /* interleaved stages whose micro-batches the plan's passes do not give
     * in whole groups of pp: priced, but not a schedule (the MILP and
     * --strategy cannot see it; dhp run would refuse it with this line) */
    for (int k = 0; !rc && k < p->n_modules; k++)
        if (plan_vp(&p->mod[k]) > 1) return plan_schedule_check(p, err);
    return rc;
}

int plan_from_candidates(const plan_candidates *cs, const int *chosen, const model_t *m, const cost_cluster *c,
                         const plan_workload *w, const plan_options *o, plan_t *p, char *err)
{
    plan_init(p, m, c, w, o);
    const plan_candidate *first = &cs->c[chosen[0]];
    p->placement = first->colocated ? PLAN_COLOCATED : PLAN_DISAGGREGATED;
    p->n_micro = first->colocated ? 1 : first->n_micro;
    for (int k = 0; k < m->n_modules; k++) p->mod[k] = cs->c[chosen[k]].s;
    util_strlcpy(p->label, "dhp", sizeof p->label);
    return plan_assemble(p, o, err);
}

/* Whether two plans run the same strategies (their fields, not their padding). */
static bool same_strategies(const plan_t *a, const plan_t *b)
{
    if (a->placement != b->placement || a->n_micro != b->n_micro || a->n_modules != b->n_modules) return false;
    for (int k = 0; k < a->n_modules; k++) {
        const plan_module *x = &a->mod[k], *y = &b->mod[k];
        if (x->pool != y->pool || x->first_rank != y->first_rank || x->n_ranks != y->n_ranks || x->dp != y->dp
            || x->tp != y->tp || x->sp != y->sp || x->pp != y->pp || x->zero != y->zero
            || x->micro_batch != y->micro_batch || x->recompute != y->recompute
            || x->recompute_layers != y->recompute_layers || x->seq_parallel != y->seq_parallel
            || x->split_ends != y->split_ends || plan_vp(x) != plan_vp(y) || x->cp != y->cp
            || memcmp(x->stage_layers, y->stage_layers, sizeof x->stage_layers))
            return false;
    }
    return true;
}

static int by_step_time(const void *a, const void *b)
{
    const plan_t *x = a, *y = b;
    if (x->pred.step_time_s != y->pred.step_time_s) return x->pred.step_time_s < y->pred.step_time_s ? -1 : 1;
    if (x->pred.analytic_step_time_s != y->pred.analytic_step_time_s)
        return x->pred.analytic_step_time_s < y->pred.analytic_step_time_s ? -1 : 1;
    return 0;
}

int plan_search(const model_t *m, const cost_cluster *c, const plan_workload *w,
                const plan_search_options *o, plan_search_result *r, char *err)
{
    memset(r, 0, sizeof *r);
    double t0 = util_now();
    int rc = plan_workload_validate(m, w, err);
    if (rc) return rc;
    plan_candidates cs;
    if ((rc = plan_candidates_build(m, c, w, o, &cs, err))) return rc;
    r->n_candidates = cs.n;
    int K = m->n_modules;
    int want = 1 + (o->top_k < 0 ? 0 : o->top_k);
    if (want > (int)(sizeof r->plans / sizeof r->plans[0])) want = (int)(sizeof r->plans / sizeof r->plans[0]);
    /* Every solution found, valid or not, becomes a no-good cut for the next solve. */
    int max_cuts = want + 64;
    int *cuts = util_malloc(sizeof(int) * (size_t)(K * max_cuts));
    if (!cuts) { plan_candidates_free(&cs); return util_fail(err, UTIL_ENOMEM, "planner: out of memory"); }
    int n_cuts = 0;
    plan_t *fallback = util_malloc(sizeof *fallback);
    bool have_fallback = false;
    if (!fallback) { util_free(cuts); plan_candidates_free(&cs); return util_fail(err, UTIL_ENOMEM, "planner: out of memory"); }
    while (r->n_plans < want && n_cuts < max_cuts) {
        util_progress("plan: MILP solves for the plan and its alternatives", r->n_plans, want);
        double obj;
        char e[UTIL_ERR_LEN];
        int *sol = cuts + n_cuts * K;
        if (o->exhaustive)
            rc = n_cuts == 0 ? plan_exhaustive_solve(&cs, 2e8, sol, &obj, e) : UTIL_EINFEASIBLE;
        else
            rc = plan_milp_solve(&cs, cuts, n_cuts, o->time_limit_s, sol, &obj, &r->n_milp_vars, &r->n_milp_rows, e);
        r->milp_solves++;
        if (rc) {
            if (r->n_plans == 0 && !have_fallback) { util_free(cuts); util_free(fallback); plan_candidates_free(&cs);
                return util_fail(err, rc, "%s: %s on cluster '%s'", m->name, e, c->name); }
            break;
        }
        n_cuts++;
        plan_t *q = &r->plans[r->n_plans];
        rc = plan_from_candidates(&cs, sol, m, c, w, &o->opt, q, e);
        if (rc == UTIL_EINVAL && !o->exhaustive) continue;   /* a packing the MILP cannot see: cut, solve again */
        if (rc) { util_free(cuts); util_free(fallback); plan_candidates_free(&cs); return util_fail(err, rc, "planner: %s", e); }
        /* Recomputing as few blocks as fit (the candidates price a quarter's
         * steps), where the simulated peak below agrees (else as chosen). The
         * MILP prices hand-offs without knowing the neighbour's placement and
         * the closed form does not see the schedule's waits: the final order is
         * by the simulated step where the schedule runs the plan, else by the
         * full evaluation (pred.analytic_step_time_s keeps it for all). The
         * simulation also sizes each rank's hand-off buffers, which no one
         * module's candidate holds: a plan they push out of memory is cut too
         * (the first kept, should no plan fit). */
        static plan_t chosen;
        chosen = *q;
        if ((rc = plan_trim_recompute(q, &o->opt, e))) {
            util_free(cuts); util_free(fallback); plan_candidates_free(&cs); return util_fail(err, rc, "planner: %s", e); }
        bool fit = q->pred.fits, trimmed = !same_strategies(q, &chosen);
        plan_sim_predict(q, NULL);
        if (trimmed && fit && !q->pred.fits) {
            *q = chosen;
            plan_sim_predict(q, NULL);
        }
        /* trimmed into a plan already found (an alternative that recomputed what it need not) */
        bool again = false;
        for (int i = 0; trimmed && i < r->n_plans; i++) again = again || same_strategies(&r->plans[i], q);
        if (again) continue;
        if (fit && !q->pred.fits && !o->exhaustive) {
            if (!have_fallback) { *fallback = *q; have_fallback = true; }
            continue;
        }
        r->n_plans++;
    }
    if (r->n_plans == 0 && have_fallback) r->plans[r->n_plans++] = *fallback;
    util_free(fallback);
    util_progress("plan: MILP solves for the plan and its alternatives", want, want);
    util_free(cuts);
    plan_candidates_free(&cs);
    qsort(r->plans, (size_t)r->n_plans, sizeof r->plans[0], by_step_time);
    r->search_s = util_now() - t0;
    return UTIL_OK;
}
