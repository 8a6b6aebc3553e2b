/* Shared by the simulator's tests (test_simulate.c, test_simulate_outputs.c). */
#ifndef DHP_TESTS_TEST_SIMULATE_H
#define DHP_TESTS_TEST_SIMULATE_H

#include "planner/planner.h"

/* tiny-vl on 8xh100 from a --strategy spec: 1 image of 64 tokens and 16
 * text tokens a sample, batch samples a step; prints why on failure. */
int test_sim_plan(const char *spec, plan_placement pl, int gpus, int n_micro, int batch, plan_t *p);

#endif
