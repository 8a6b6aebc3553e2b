/* The planner's search: candidates priced analytically per module, a GLPK
 * MILP choosing one per module (planner/search.c; plan_from_candidates in
 * planner/assemble.c).
 * Part of planner/planner.h, which includes it; it may be included alone. */
#ifndef DHP_PLANNER_SEARCH_H
#define DHP_PLANNER_SEARCH_H

#include "planner/planner.h"

/* ---- search: candidates priced analytically, a GLPK MILP chooses ---- */
typedef struct {
    int module;
    bool colocated;
    int pool, gpus;
    int samples_per_step;     /* colocated family key: dp * micro_batch (same for every module) */
    int n_micro;              /* disaggregated: chunks per step (same for every module) */
    plan_module s;
    double time;              /* colocated: module's whole step share; disaggregated: one chunk */
    /* disaggregated, a chunk once the groups pipeline: the LLM's m micro-batches
     * at its pace (its fill and drain come once, in time), an encoder's time;
     * loop: the LLM's part of a training encoder's period (plan_encoder_loop:
     * reach units of the encoder's own latest chunk before a gradient leaves) */
    double steady, loop;
    bool trains;              /* disaggregated encoder: takes its gradient back (the loop binds it) */
    double tail;              /* disaggregated: exposed DP communication + optimizer step */
    double mem;               /* colocated: bytes without the runtime reservation; else total */
} plan_candidate;

typedef struct {
    int n, cap;
    plan_candidate *c;
    int n_modules;
    int llm;                  /* index of the LLM module */
    double reserved[COST_MAX_POOLS], capacity[COST_MAX_POOLS];
    int pool_gpus[COST_MAX_POOLS];
    int n_pools;
} plan_candidates;
typedef struct {
    plan_options opt;
    int top_k;                /* alternatives to report besides the best */
    bool allow_colocated, allow_disaggregated;
    int max_pp;               /* 0 = default 8 */
    double time_limit_s;      /* per MILP solve */
    bool exhaustive;          /* enumerate combinations instead of the MILP (small cases only) */
    bool verbose;
} plan_search_options;
void plan_search_options_default(plan_search_options *o);

int plan_candidates_build(const model_t *m, const cost_cluster *c, const plan_workload *w,
                          const plan_search_options *o, plan_candidates *out, char *err);
void plan_candidates_free(plan_candidates *cs);
/* The MILP's objective for one candidate per module (chosen[k] indexes cs->c),
 * evaluated directly; returns false when the choice violates a constraint.
 * Used to check the MILP against brute force. */
bool plan_candidates_objective(const plan_candidates *cs, const int *chosen, double *objective);
/* Solves the MILP over cs; excluded holds n_excluded earlier solutions
 * (n_modules candidate indices each) to cut off. */
int plan_milp_solve(const plan_candidates *cs, const int *excluded, int n_excluded, double time_limit_s,
                    int *chosen, double *objective, int *n_vars, int *n_rows, char *err);
/* Enumerates every combination instead (the benchmark's baseline). */
int plan_exhaustive_solve(const plan_candidates *cs, double max_combos, int *chosen, double *objective, char *err);
/* Turns a candidate choice into a plan (ranks assigned) and evaluates it. */
int plan_from_candidates(const plan_candidates *cs, const int *chosen, const model_t *m, const cost_cluster *c,
                         const plan_workload *w, const plan_options *o, plan_t *p, char *err);

typedef struct {
    int n_plans;
    plan_t plans[16];          /* best first */
    int n_candidates;          /* candidates priced before the MILP */
    int n_milp_vars, n_milp_rows;
    int milp_solves;
    double search_s;
} plan_search_result;
int plan_search(const model_t *m, const cost_cluster *c, const plan_workload *w,
                const plan_search_options *o, plan_search_result *r, char *err);

#endif
