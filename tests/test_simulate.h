/* Shared by the simulator's and the schedule's tests (test_simulate.c,
 * test_simulate_outputs.c, test_schedule.c). */
#ifndef DHP_TESTS_TEST_SIMULATE_H
#define DHP_TESTS_TEST_SIMULATE_H

#include "planner/planner.h"

/* tiny-vl on 8xh100 from a --strategy spec: 1 image of 64 tokens and 16
 * text tokens a sample, batch samples a step; prints why on failure. */
int test_sim_plan(const char *spec, plan_placement pl, int gpus, int n_micro, int batch, plan_t *p);
/* The same with the LLM llm_layers deep (0: tiny-vl's own depth). */
int test_sim_plan_layers(const char *spec, plan_placement pl, int gpus, int n_micro, int batch, int llm_layers,
                         plan_t *p);

/* test_sim_plan, then the step simulated with the cost model (plan_sim_run
 * without hooks; plan_sim_free r); prints why on failure. */
int test_sim_run(const char *spec, plan_placement pl, int gpus, int n_micro, int batch, plan_t *p,
                 plan_sim_result *r);

/* One row of a table of strategies, planned by test_sim_case_plan. */
typedef struct { const char *spec; plan_placement pl; int gpus, micro, batch; } test_sim_case;
int test_sim_case_plan(const test_sim_case *c, plan_t *p);

#endif
