/* The Megatron target's gradient accumulation over micro-batches
 * (--grad-accum, plan_options.grad_accum; planner/cost_grad_accum.c): fused
 * costs nothing, autograd's add (m - 1) adds in the weight's dtype over a
 * step of m micro-batches, DeepSpeed's BF16_Optimizer a cast and an fp32 add
 * every micro-batch; each on the stage's own parameters, its shard under
 * ZeRO-2. Expected figures worked out beside each check. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

#include <string.h>

/* A 4-layer GPT of width 1024, 16 heads. */
static model_t gpt(void)
{
    return test_llm("gpt", "\"layers\": 4, \"hidden\": 1024, \"heads\": 16, \"ffn\": 4096, \"ffn_kind\": \"gelu\","
                    " \"norm\": \"layernorm\", \"vocab\": 1000");
}

static plan_options accum(plan_grad_accum a)
{
    plan_options o;
    plan_options_default(&o);   /* the Megatron target, bf16-mixed: 2-byte weights */
    o.grad_accum = a;
    return o;
}

/* dp 2, tp 2, pp 2, micro-batch 1 and a batch of 8: 4 micro-batches a step;
 * stage 0 holds blocks 0-1 and the embedding, its tp rank half of them. */
TEST(grad_accum_prices_each_micro_batch_share_on_the_stage)
{
    model_t m = gpt();
    cost_cluster c = test_cluster_load("8xa100-80g");
    const cost_gpu *g = &c.pool[0].gpu;
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    plan_module s = { .dp = 2, .tp = 2, .sp = 1, .pp = 2, .micro_batch = 1, .n_ranks = 8 };
    const model_module *mm = &m.mod[0];
    plan_stage st = plan_stage_of(mm, &s, 0);
    double n = ((double)model_layer_params(mm, 0) + (double)model_layer_params(mm, 1) + (double)model_embed_params(mm)) / 2;
    CHECK_NEAR(plan_stage_params(mm, &s, &st), n, 1e-6);
    plan_options fused = accum(PLAN_ACCUM_FUSED), add = accum(PLAN_ACCUM_ADD), bf16 = accum(PLAN_ACCUM_BF16_OPTIMIZER);
    CHECK(plan_grad_accum_s(mm, &s, &st, &w, g, &fused) == 0);
    double a = cost_elementwise_time(g, COST_EW_ADD, n, 2.0);
    CHECK_NEAR(plan_grad_accum_s(mm, &s, &st, &w, g, &add), 3.0 / 4 * a, 1e-15);
    double b = cost_elementwise_time(g, COST_EW_COPY, n, 3.0) + cost_elementwise_time(g, COST_EW_ADD, n, 4.0);
    CHECK_NEAR(plan_grad_accum_s(mm, &s, &st, &w, g, &bf16), b, 1e-15);
    /* a step of one micro-batch adds nothing; the optimizer's cast and add still run */
    plan_workload one = w;
    one.global_batch = 2;
    CHECK(plan_grad_accum_s(mm, &s, &st, &one, g, &add) == 0);
    CHECK_NEAR(plan_grad_accum_s(mm, &s, &st, &one, g, &bf16), b, 1e-15);
    /* the last stage: its blocks and the head */
    plan_stage last = plan_stage_of(mm, &s, 1);
    double nl = ((double)model_layer_params(mm, 2) + (double)model_layer_params(mm, 3) + (double)model_head_params(mm)) / 2;
    CHECK_NEAR(plan_grad_accum_s(mm, &s, &last, &w, g, &add), 3.0 / 4 * cost_elementwise_time(g, COST_EW_ADD, nl, 2.0), 1e-15);
    /* the dhp target accumulates its own way */
    add.target = PLAN_TARGET_DHP;
    CHECK(plan_grad_accum_s(mm, &s, &st, &w, g, &add) == 0);
    add.target = PLAN_TARGET_MEGATRON;
    /* ZeRO-2 keeps only the rank's gradient shard across micro-batches: dp 4, no pipeline */
    plan_module z2 = { .dp = 4, .tp = 2, .sp = 1, .pp = 1, .zero = 2, .micro_batch = 1, .n_ranks = 8 };
    plan_stage whole = plan_stage_of(mm, &z2, 0);
    double nz = plan_stage_params(mm, &z2, &whole) / 4;
    CHECK_NEAR(plan_grad_accum_s(mm, &z2, &whole, &w, g, &add), 1.0 / 2 * cost_elementwise_time(g, COST_EW_ADD, nz, 2.0), 1e-15);
    /* a tied LLM in one stage holds its word embedding once */
    model_t tied = m;
    tied.mod[0].tied_embeddings = true;
    plan_module single = { .dp = 8, .tp = 1, .sp = 1, .pp = 1, .micro_batch = 1, .n_ranks = 8 };
    plan_stage all = plan_stage_of(&tied.mod[0], &single, 0);
    CHECK_NEAR(plan_stage_params(&tied.mod[0], &single, &all), (double)model_module_params(&tied.mod[0]), 1e-6);
    /* in the micro-batch's backward, on the stage's pace */
    plan_time tf, ta;
    plan_stage_micro_time(&m, 0, &s, 0, &w, &c, &fused, 1, &tf);
    plan_stage_micro_time(&m, 0, &s, 0, &w, &c, &add, 1, &ta);
    CHECK_NEAR(ta.bwd_s - tf.bwd_s, 3.0 / 4 * a, 1e-12);
    CHECK_NEAR(ta.fwd_s, tf.fwd_s, 1e-15);
}

/* Names round-trip through the plan file; the dhp target refuses them. */
TEST(grad_accum_names_plan_file_and_refusals)
{
    plan_grad_accum a;
    CHECK(plan_grad_accum_parse("add", &a, NULL) == UTIL_OK && a == PLAN_ACCUM_ADD);
    CHECK(plan_grad_accum_parse("bf16-optimizer", &a, NULL) == UTIL_OK && a == PLAN_ACCUM_BF16_OPTIMIZER);
    CHECK(plan_grad_accum_parse("fused", &a, NULL) == UTIL_OK && a == PLAN_ACCUM_FUSED);
    CHECK(plan_grad_accum_parse("apex", &a, NULL) == UTIL_EINVAL);
    char err[UTIL_ERR_LEN];
    plan_options o = accum(PLAN_ACCUM_ADD);
    CHECK(plan_grad_accum_check(&o, err) == UTIL_OK);
    o.target = PLAN_TARGET_DHP;
    CHECK(plan_grad_accum_check(&o, err) == UTIL_EINVAL && strstr(err, "--target megatron"));
    static plan_t p, back;
    model_t m = gpt();
    cost_cluster c = test_cluster_load("8xa100-80g");
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    o = accum(PLAN_ACCUM_BF16_OPTIMIZER);
    CHECK_OK(plan_from_strategy_opts("llm:pp=2,tp=2,dp=2", &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &p, err));
    CHECK(p.grad_accum == PLAN_ACCUM_BF16_OPTIMIZER && test_plan_json_has(&p, "grad_accum"));
    CHECK_OK(test_plan_json_round_trip(&p, &back, err));
    CHECK(back.grad_accum == PLAN_ACCUM_BF16_OPTIMIZER);
    p.grad_accum = PLAN_ACCUM_FUSED;
    CHECK(!test_plan_json_has(&p, "grad_accum"));
}
