/* Shared by the profile tests (test_profile.c, test_profile_gemm16.c). */
#ifndef DHP_TESTS_TEST_PROFILE_H
#define DHP_TESTS_TEST_PROFILE_H

#include "costdb/costdb.h"
#include "planner/planner.h"   /* util/util.h: cJSON */

/* The planner's price of one micro-batch (2 x 256 tokens) of a 4-layer,
 * 16-head (d = 64) LLM on one GPU g, under precision prec and target t. */
int test_profile_llm_micro(const cost_gpu *g, plan_precision prec, plan_target t, plan_time *out, char *err);

/* A GPU file's text with its object `key` (attn_bf16, gemm_bf16, ...) edited
 * by fn, parsed by the loader: its verdict, and its message in err. */
int test_profile_parse_edited(const char *text, const char *key, void (*fn)(cJSON *obj), char *err);

/* The GPU file text gt and cluster file text ct as the loaders read them
 * (g, c), and g again through cost_gpu_to_json (plain): 0 when all load. */
int test_profile_read_back(const char *gt, const char *ct, cost_gpu *g, cost_cluster *c, cost_gpu *plain, char *err);

/* The GPU and cluster files profile p writes (cost_profile_gpu_json with
 * sources, cost_profile_cluster_json) and their printed texts; each NULL
 * where `made` is false (the profile did not derive) or its step fails.
 * test_profile_files_free releases all four. */
void test_profile_files(const cost_profile *p, bool made, cJSON **gj, cJSON **cj, char **gt, char **ct);
void test_profile_files_free(cJSON *gj, cJSON *cj, char *gt, char *ct);

/* A CUDA profile made from known terms (an H100-like device: 132 SMs at
 * 1980 MHz, HBM3 at 2619 MHz on a 5120-bit bus, launch 3 us): a GEMM grid
 * at rate x shape factors of half `half`, attention times from fixed terms
 * plus the call's launch, memory and two all-reduce points. */
void test_profile_fake_cuda(cost_profile *p, double rate, double half);

#endif
