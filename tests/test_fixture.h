/* Shared by the planner's tests (test_planner.c, test_calibration.c,
 * test_cost_*.c, test_grad_reduce.c, test_precision_zero3.c,
 * test_tp_style.c): the models, clusters and options a test starts from.
 * A fixture that does not load is a broken test binary, not a failed check:
 * these print the loader's message and abort. */
#ifndef DHP_TESTS_TEST_FIXTURE_H
#define DHP_TESTS_TEST_FIXTURE_H

#include "planner/planner.h"

/* A shipped model or cluster by name (model_load, cost_cluster_load). */
model_t test_model_load(const char *name);
cost_cluster test_cluster_load(const char *name);

/* A one-module model: {"schema": "dhp.model/1", "name": name, "modules":
 * [{"name": "llm", "kind": "llm", FIELDS}]}, FIELDS printed from fmt. */
model_t test_llm(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The default options with the Megatron target under bf16-autocast. */
plan_options test_megatron_autocast(void);

#endif
