/* The Megatron target's AdamW step, fused or one pass per op
 * (planner/cost_optim.c, --adamw). Expected bytes worked out beside each. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

#include <math.h>
#include <stdlib.h>

/* Per updated element: fused reads the gradient and reads and writes the
 * weight, m and v (6 S + G, plus bf16-mixed's bf16 copy written: 2); foreach
 * moves 18 S + 3 G (torch's _multi_tensor_adamw, 8 passes). bf16-autocast
 * S = G = 4: 28 -> 84; bf16-mixed (fp32 master, m, v; fp32 gradient): 30 ->
 * 30 + 48 + 8 = 86; bf16-pure S = G = 2: 14 -> 42. The dhp target keeps its
 * executor's step. */
TEST(adamw_foreach_moves_one_pass_per_op)
{
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_MEGATRON;
    plan_state_bytes a = plan_precision_bytes(PLAN_OPT_AUTOCAST), m = plan_precision_bytes(PLAN_OPT_MIXED_FP32),
                     p = plan_precision_bytes(PLAN_OPT_PURE_BF16);
    CHECK_NEAR(plan_adamw_step_bytes(&a, &o), 28, 1e-12);
    o.adamw = PLAN_ADAMW_FOREACH;
    o.precision = PLAN_OPT_AUTOCAST;
    CHECK_NEAR(plan_adamw_step_bytes(&a, &o), 84, 1e-12);
    o.precision = PLAN_OPT_MIXED_FP32;
    CHECK_NEAR(plan_adamw_step_bytes(&m, &o), 86, 1e-12);
    o.precision = PLAN_OPT_PURE_BF16;
    CHECK_NEAR(plan_adamw_step_bytes(&p, &o), 42, 1e-12);
    o.target = PLAN_TARGET_DHP;
    CHECK_NEAR(plan_adamw_step_bytes(&a, &o), a.step_traffic, 1e-12);
}

/* The choice travels with the plan file (dhp simulate re-prices a plan),
 * costs only the optimizer step, and a plan under the default leaves the key out. */
TEST(adamw_choice_travels_with_the_plan)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    cost_cluster c;
    const char *text = "{\"schema\": \"dhp.model/1\", \"name\": \"g\", \"modules\": [{\"name\": \"llm\","
                       " \"kind\": \"llm\", \"layers\": 2, \"hidden\": 1024, \"heads\": 16, \"ffn\": 4096,"
                       " \"ffn_kind\": \"gelu\", \"norm\": \"layernorm\", \"vocab\": 1000, \"tied_embeddings\": true}]}";
    CHECK(model_parse_json(text, "gpt", &m, err) == UTIL_OK);
    CHECK(cost_cluster_load("2x8xh100", &c, err) == UTIL_OK);
    plan_workload w = { .global_batch = 16, .text_tokens = 256 };
    plan_options o;
    plan_options_default(&o);
    o.precision = PLAN_OPT_AUTOCAST;
    plan_t fused, foreach, back;
    CHECK(plan_from_strategy_opts("llm:dp=16,zero=3", &m, &c, &w, PLAN_COLOCATED, 16, 1, &o, &fused, err) == UTIL_OK);
    o.adamw = PLAN_ADAMW_FOREACH;
    CHECK(plan_from_strategy_opts("llm:dp=16,zero=3", &m, &c, &w, PLAN_COLOCATED, 16, 1, &o, &foreach, err) == UTIL_OK);
    CHECK(foreach.pred.step_time_s > fused.pred.step_time_s);
    CHECK(!test_plan_json_has(&fused, "adamw"));
    CHECK(test_plan_json_round_trip(&foreach, &back, err) == UTIL_OK);
    CHECK(back.adamw == PLAN_ADAMW_FOREACH && plan_options_of(&back).adamw == PLAN_ADAMW_FOREACH);
    plan_adamw a;
    CHECK(plan_adamw_parse("foreach", &a, NULL) == UTIL_OK && a == PLAN_ADAMW_FOREACH);
    CHECK(plan_adamw_parse("fused", &a, NULL) == UTIL_OK && a == PLAN_ADAMW_FUSED);
    CHECK(plan_adamw_parse("unfused", &a, NULL) != UTIL_OK);
}

/* A 2-layer GPT with LayerNorm and a GELU MLP (untied). */
static model_t gpt(void)
{
    return test_llm("gpt", "\"layers\": 2, \"hidden\": 1024, \"heads\": 16, \"ffn\": 4096, \"ffn_kind\": \"gelu\","
                    " \"norm\": \"layernorm\", \"vocab\": 1000");
}

/* --optim-dtype bf16 (Apex's DistributedFusedAdam with dtype bf16, as NeMo
 * runs it): under bf16-mixed the master copy, m and v are 2 B each, 6 B an
 * element against fp32's 12; the step reads the reduced gradient (4 B, or
 * 2 B under --grad-reduce bf16), reads and writes the three states (12 B)
 * and writes the bf16 weight (2 B): 18 and 16 B against fp32's 30. The
 * weights and gradients keep their bytes; the dhp target, and any
 * precision but bf16-mixed, refuse it. */
TEST(optim_dtype_bf16_holds_and_moves_two_bytes_a_state)
{
    model_t m = gpt();
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_MEGATRON;
    o.precision = PLAN_OPT_MIXED_FP32;
    plan_state_bytes f = plan_module_state_bytes(&m.mod[0], &o);
    o.optim_dtype = PLAN_OPTIM_BF16;
    plan_state_bytes b = plan_module_state_bytes(&m.mod[0], &o);
    CHECK(f.optim == 12 && f.step_traffic == 30);
    CHECK(b.optim == 6 && b.step_traffic == 18 && b.param == f.param && b.grad == f.grad && b.act == f.act);
    o.grad_reduce = PLAN_REDUCE_BF16;
    CHECK(plan_module_state_bytes(&m.mod[0], &o).step_traffic == 16);
    o.adamw = PLAN_ADAMW_FOREACH;   /* S = 2: 16 + 12 x 2 + 2 x 2 (the held gradient, bf16 under --grad-reduce bf16) */
    plan_state_bytes fe = plan_module_state_bytes(&m.mod[0], &o);
    CHECK_NEAR(plan_adamw_step_bytes(&fe, &o), 16 + 24 + 2 * fe.grad, 1e-12);
    o.adamw = PLAN_ADAMW_FUSED;
    char err[UTIL_ERR_LEN];
    CHECK(plan_optim_dtype_check(&o, err) == UTIL_OK && plan_options_check(&o, NULL, err) == UTIL_OK);
    o.precision = PLAN_OPT_AUTOCAST;
    CHECK(plan_optim_dtype_check(&o, err) == UTIL_EINVAL && strstr(err, "--precision bf16-mixed"));
    o.precision = PLAN_OPT_MIXED_FP32;
    o.grad_reduce = PLAN_REDUCE_GRADS;
    o.target = PLAN_TARGET_DHP;
    const char *key = NULL;
    CHECK(plan_options_check(&o, &key, err) == UTIL_EINVAL && key && !strcmp(key, "optim_dtype"));
    CHECK(strstr(err, "dhp run keeps fp32 AdamW states"));
    CHECK(plan_module_state_bytes(&m.mod[0], &o).optim == plan_precision_bytes(PLAN_OPT_FP32).optim);
    plan_optim_dtype d;
    CHECK(plan_optim_dtype_parse("bf16", &d, NULL) == UTIL_OK && d == PLAN_OPTIM_BF16);
    CHECK(plan_optim_dtype_parse("fp32", &d, NULL) == UTIL_OK && d == PLAN_OPTIM_FP32);
    CHECK(plan_optim_dtype_parse("fp16", &d, NULL) != UTIL_OK);
}

/* A ZeRO-1 plan (dp 16) under bf16 states: the optimizer's memory halves,
 * nothing else's; the step's update is shorter; the plan file keeps the
 * choice (dhp simulate and dhp memory re-price it) and leaves the key out
 * under the default. */
TEST(optim_dtype_bf16_halves_the_optimizer_memory_and_travels_with_the_plan)
{
    char err[UTIL_ERR_LEN];
    model_t m = gpt();
    cost_cluster c;
    CHECK(cost_cluster_load("2x8xh100", &c, err) == UTIL_OK);
    plan_workload w = { .global_batch = 16, .text_tokens = 256 };
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_MEGATRON;
    o.precision = PLAN_OPT_MIXED_FP32;
    plan_t f32, b16, back;
    CHECK(plan_from_strategy_opts("llm:dp=16,zero=1", &m, &c, &w, PLAN_COLOCATED, 16, 1, &o, &f32, err) == UTIL_OK);
    o.optim_dtype = PLAN_OPTIM_BF16;
    CHECK(plan_from_strategy_opts("llm:dp=16,zero=1", &m, &c, &w, PLAN_COLOCATED, 16, 1, &o, &b16, err) == UTIL_OK);
    plan_options of = plan_options_of(&f32), ob = plan_options_of(&b16);
    plan_mem mf, mb;
    plan_module_memory(&f32.model, 0, &f32.mod[0], &w, &c.pool[0].gpu, &of, 1, &mf);
    plan_module_memory(&b16.model, 0, &b16.mod[0], &w, &c.pool[0].gpu, &ob, 1, &mb);
    CHECK(mf.optim > 0 && fabs(mb.optim - mf.optim / 2) < 1e-6 * mf.optim);
    CHECK(mb.params == mf.params && mb.grads == mf.grads && mb.activations == mf.activations);
    CHECK(b16.pred.peak_mem_bytes[0] < f32.pred.peak_mem_bytes[0]);
    CHECK(b16.pred.step_time_s < f32.pred.step_time_s);
    CHECK(!test_plan_json_has(&f32, "optim_dtype"));
    CHECK(test_plan_json_round_trip(&b16, &back, err) == UTIL_OK);
    CHECK(back.optim_dtype == PLAN_OPTIM_BF16 && plan_options_of(&back).optim_dtype == PLAN_OPTIM_BF16);
}
