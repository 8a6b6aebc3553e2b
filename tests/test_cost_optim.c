/* The Megatron target's AdamW step, fused or one pass per op
 * (planner/cost_optim.c, --adamw). Expected bytes worked out beside each. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

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
