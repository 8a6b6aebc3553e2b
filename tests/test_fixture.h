/* Shared by the model, cost and planner tests: the models, clusters, GPUs
 * and options a test starts from. */
#ifndef DHP_TESTS_TEST_FIXTURE_H
#define DHP_TESTS_TEST_FIXTURE_H

#include "planner/planner.h"

/* A fixture that does not load is a broken test binary, not a failed check:
 * these print the loader's message and abort. */

/* A shipped model or cluster by name (model_load, cost_cluster_load). */
model_t test_model_load(const char *name);
cost_cluster test_cluster_load(const char *name);

/* A one-module model: {"schema": "dhp.model/1", "name": name, "modules":
 * [{"name": "llm", "kind": "llm", FIELDS}]}, FIELDS printed from fmt. */
model_t test_llm(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A GPU of round numbers for figures worked out by hand: 1e15 FLOP/s peak,
 * GEMMs at most 0.8 of it (gemm_half 100), attention 0.5, 1e11 B of HBM at
 * 1e12 B/s (mem_eff 0.5), 1e9 B reserved, 10 us a kernel launch. */
cost_gpu test_round_gpu(void);

/* The default options with dhp run's target and precision (the fp32 executor). */
plan_options test_dhp_fp32(void);

/* The default options with the Megatron target under bf16-autocast. */
plan_options test_megatron_autocast(void);

/* These return the code and fill err: what they do is under test. */

/* tests/data/hf/FILE through the Hugging Face importer (model_import_hf). */
int test_import_hf(const char *file, model_t *m, char *err);

/* m through model_to_json and model_from_json into back. */
int test_model_json_round_trip(const model_t *m, model_t *back, char *err);

/* p through plan_to_json and plan_from_json into back. */
int test_plan_json_round_trip(const plan_t *p, plan_t *back, char *err);
/* Whether p's plan file (plan_to_json) writes the top-level key. */
bool test_plan_json_has(const plan_t *p, const char *key);

#endif
