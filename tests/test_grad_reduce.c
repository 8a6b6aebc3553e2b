/* The Megatron target's gradient reduction in bf16 (--grad-reduce bf16,
 * plan_options.grad_reduce): PyTorch FSDP's reduce_dtype bf16, as Composer
 * 0.16.3's mixed_precision DEFAULT leaves it (param_dtype bf16, reduce_dtype
 * unset). The collectives send 2 B an element; the gradient shards, the
 * norm and the optimizer keep their dtype; the dhp target refuses it (dhp
 * run reduces in fp32). Expected figures worked out beside each check. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

#include <math.h>
#include <stdlib.h>

static model_t gpt(void)
{
    return test_llm("gpt", "\"layers\": 2, \"hidden\": 1024, \"heads\": 16, \"ffn\": 4096, \"ffn_kind\": \"gelu\","
                    " \"norm\": \"layernorm\", \"vocab\": 1000");
}

static plan_options megatron_autocast(plan_grad_reduce r)
{
    plan_options o = test_megatron_autocast();
    o.grad_reduce = r;
    return o;
}

/* bf16-autocast keeps fp32 gradients (4 B); reduced in bf16 the wire carries
 * 2 B of each, the rest of the states unchanged. bf16-pure's gradients are
 * bf16 already. A frozen module reduces nothing. The dhp target ignores the
 * option's bytes and refuses the option. */
TEST(grad_reduce_bf16_sends_two_bytes_and_keeps_the_states)
{
    model_t m = gpt();
    plan_options d = megatron_autocast(PLAN_REDUCE_GRADS), b = megatron_autocast(PLAN_REDUCE_BF16);
    plan_state_bytes sd = plan_module_state_bytes(&m.mod[0], &d), sb = plan_module_state_bytes(&m.mod[0], &b);
    CHECK(sd.reduce == 4 && sd.grad == 4);
    CHECK(sb.reduce == 2 && sb.grad == 4 && sb.param == sd.param && sb.optim == sd.optim && sb.act == sd.act);
    b.precision = PLAN_OPT_PURE_BF16;
    CHECK(plan_module_state_bytes(&m.mod[0], &b).reduce == 2);
    b.precision = PLAN_OPT_AUTOCAST;
    m.mod[0].frozen = true;
    CHECK(plan_module_state_bytes(&m.mod[0], &b).reduce == 0);
    m.mod[0].frozen = false;
    char err[UTIL_ERR_LEN];
    CHECK(plan_grad_reduce_check(&b, err) == UTIL_OK && plan_grad_reduce_check(&d, err) == UTIL_OK);
    b.target = PLAN_TARGET_DHP;
    CHECK(plan_grad_reduce_check(&b, err) == UTIL_EINVAL && strstr(err, "dhp run reduces its gradients in fp32"));
    CHECK(plan_module_state_bytes(&m.mod[0], &b).reduce == plan_module_state_bytes(&m.mod[0], &b).grad);
}

/* ZeRO-1 on dp 8 of one node: the step's one reduce-scatter over the
 * module's local parameters, 4 B an element by default, 2 B reduced in
 * bf16; the parameters' all-gather stays in the parameter dtype. The
 * gradients are held as they are reduced (Megatron-Core's gradient buffer
 * without grad_reduce_in_fp32): bf16's 2 B instead of fp32's 4; ZeRO-3's
 * shards keep fp32. */
TEST(grad_reduce_bf16_prices_the_megatron_reduce_scatter_at_two_bytes)
{
    model_t m = gpt();
    cost_cluster c = test_cluster_load("8xh100");
    const cost_pool *pool = &c.pool[0];
    plan_module s = { .dp = 8, .tp = 1, .sp = 1, .pp = 1, .zero = 1, .micro_batch = 1, .n_ranks = 8 };
    double local = plan_local_params(&m.mod[0], &s);
    plan_options d = megatron_autocast(PLAN_REDUCE_GRADS), b = megatron_autocast(PLAN_REDUCE_BF16);
    plan_time td = { 0 }, tb = { 0 };
    plan_price_dp_step(&m.mod[0], &s, 0, pool, &d, 1.0, &td);
    plan_price_dp_step(&m.mod[0], &s, 0, pool, &b, 1.0, &tb);
    CHECK_NEAR(td.grad_sync_s, cost_collective_time(pool, COST_REDUCESCATTER, local * 4, 8, 8), 1e-15);
    CHECK_NEAR(tb.grad_sync_s, cost_collective_time(pool, COST_REDUCESCATTER, local * 2, 8, 8), 1e-15);
    CHECK(tb.grad_sync_s < td.grad_sync_s);
    CHECK_NEAR(tb.param_gather_s, td.param_gather_s, 1e-15);
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    plan_mem md, mb;
    plan_module_memory(&m, 0, &s, &w, &pool->gpu, &d, 1, &md);
    plan_module_memory(&m, 0, &s, &w, &pool->gpu, &b, 1, &mb);
    CHECK(md.grads > 0 && mb.grads == md.grads / 2 && mb.params == md.params && mb.optim == md.optim);
    s.zero = 3;
    plan_module_memory(&m, 0, &s, &w, &pool->gpu, &d, 1, &md);
    plan_module_memory(&m, 0, &s, &w, &pool->gpu, &b, 1, &mb);
    CHECK_NEAR(mb.grads, md.grads, 1e-6);
}

/* ZeRO-3 (FSDP): every unit's reduce-scatter in the backward of each
 * micro-batch. With nothing hidden (overlap 0) the backward's
 * communication falls by each unit's reduce-scatter at 4 B less the same at
 * 2 B; the gathers (bf16 under autocast) are unchanged. */
TEST(grad_reduce_bf16_halves_the_fsdp_unit_reduce_scatters)
{
    model_t m = gpt();
    cost_cluster c = test_cluster_load("8xh100");
    const cost_pool *pool = &c.pool[0];
    plan_module s = { .dp = 8, .tp = 1, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .n_ranks = 8 };
    plan_options d = megatron_autocast(PLAN_REDUCE_GRADS), b = megatron_autocast(PLAN_REDUCE_BF16);
    d.overlap = b.overlap = 0;
    plan_comm cd = { 0 }, cb = { 0 };
    double fd, bd, fb, bb;
    plan_stage st = plan_stage_of(&m.mod[0], &s, 0);
    plan_price_dp_micro(&m.mod[0], &s, &st, pool, &d, true, 1, 1, &cd, &fd, &bd);
    plan_price_dp_micro(&m.mod[0], &s, &st, pool, &b, true, 1, 1, &cb, &fb, &bb);
    int n = plan_module_units(&m.mod[0]);
    int64_t *units = malloc((size_t)n * sizeof *units);
    CHECK(units != NULL);
    plan_unit_sizes(&m.mod[0], 1, &st, units);
    double saved = 0;
    for (int u = 0; u < n; u++)
        saved += cost_collective_time(pool, COST_REDUCESCATTER, (double)units[u] * 4, 8, 8)
               - cost_collective_time(pool, COST_REDUCESCATTER, (double)units[u] * 2, 8, 8);
    free(units);
    CHECK(saved > 0);
    CHECK_NEAR(cd.bwd_s - cb.bwd_s, saved, 1e-12);
    CHECK_NEAR(cd.fwd_s, cb.fwd_s, 1e-15);
    CHECK(bb < bd);   /* the gradients copied into the reduce-scatter's input, written in bf16 */
}

/* The option travels with the plan file (dhp simulate re-prices a plan):
 * the default leaves the key out; a plan file asking for it under the dhp
 * target is refused, as --grad-reduce bf16 --target dhp is. */
TEST(grad_reduce_travels_with_the_plan)
{
    model_t m = gpt();
    cost_cluster c = test_cluster_load("8xh100");
    char err[UTIL_ERR_LEN];
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    plan_options o = megatron_autocast(PLAN_REDUCE_GRADS);
    plan_t grads, bf16, back;
    CHECK(plan_from_strategy_opts("llm:dp=8,zero=3", &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &grads, err) == UTIL_OK);
    o.grad_reduce = PLAN_REDUCE_BF16;
    CHECK(plan_from_strategy_opts("llm:dp=8,zero=3", &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &bf16, err) == UTIL_OK);
    CHECK(bf16.pred.step_time_s < grads.pred.step_time_s);
    CHECK(!test_plan_json_has(&grads, "grad_reduce"));
    cJSON *j = plan_to_json(&bf16);
    CHECK(plan_from_json(j, "plan", &back, err) == UTIL_OK);
    CHECK(back.grad_reduce == PLAN_REDUCE_BF16 && plan_options_of(&back).grad_reduce == PLAN_REDUCE_BF16);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "target", cJSON_CreateString("dhp"));
    CHECK(plan_from_json(j, "plan", &back, err) == UTIL_EINVAL && strstr(err, "grad_reduce"));
    cJSON_Delete(j);
    plan_grad_reduce r;
    CHECK(plan_grad_reduce_parse("bf16", &r, NULL) == UTIL_OK && r == PLAN_REDUCE_BF16);
    CHECK(plan_grad_reduce_parse("grads", &r, NULL) == UTIL_OK && r == PLAN_REDUCE_GRADS);
    CHECK(plan_grad_reduce_parse("fp16", &r, NULL) != UTIL_OK);
    CHECK(!strcmp(plan_grad_reduce_name(PLAN_REDUCE_BF16), "bf16"));
}
