/* ZeRO-3 as DeepSpeed issued it in 2021 (planner/cost_zero3.c, --zero3
 * deepspeed-2021): one collective per Megatron-LM weight tensor, PyTorch's
 * list-form copies, nothing hidden behind the compute. Every expected figure
 * is worked out beside it. */
#include "test.h"
#include "planner/planner_int.h"

#include <math.h>
#include <stdlib.h>

/* A Megatron GPT block of hidden h: LayerNorm, biases on every linear, GELU MLP of 4h, tied embedding. */
static model_t megatron_gpt_h(int layers, int h)
{
    char text[512], err[UTIL_ERR_LEN];
    snprintf(text, sizeof text,
             "{\"schema\": \"dhp.model/1\", \"name\": \"g\", \"modules\": [{\"name\": \"llm\", \"kind\": \"llm\","
             " \"layers\": %d, \"hidden\": %d, \"heads\": 16, \"ffn\": %d, \"ffn_kind\": \"gelu\","
             " \"norm\": \"layernorm\", \"qkv_bias\": true, \"out_bias\": true, \"mlp_bias\": true,"
             " \"vocab\": 1000, \"tied_embeddings\": true}]}",
             layers, h, 4 * h);
    model_t m;
    if (model_parse_json(text, "gpt", &m, err)) { fprintf(stderr, "%s\n", err); abort(); }
    return m;
}

static model_t megatron_gpt(int layers) { return megatron_gpt_h(layers, 1024); }

/* 2 nodes of 8 H100s (the shipped preset). */
static cost_cluster two_nodes(void)
{
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    if (cost_cluster_load("2x8xh100", &c, err)) { fprintf(stderr, "%s\n", err); abort(); }
    return c;
}

/* 16 samples of 256 tokens: one per rank of dp 16. */
static plan_workload step_of_16(void) { return (plan_workload){ .global_batch = 16, .text_tokens = 256 }; }

/* Megatron-LM's ParallelTransformerLayer holds 12 tensors: input_layernorm
 * weight and bias, query_key_value weight and bias, dense weight and bias,
 * post_attention_layernorm weight and bias, dense_h_to_4h and dense_4h_to_h
 * weights and biases; dhp's layout (plan_module_tensors) adds the embedding
 * and the final norm's weight (the head is tied; Megatron's learned positions
 * and final LayerNorm bias, two more tensors, are not in dhp's LLM).
 * query_key_value holds 3 x 1024 x 1024 elements. */
TEST(zero3_megatron_tensors_fuse_qkv)
{
    model_t m = megatron_gpt(2);
    plan_module s = { .dp = 16, .tp = 1, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .n_ranks = 16 };
    double *e = NULL;
    int n = plan_zero3_megatron_tensors(&m.mod[0], &s, &e);
    CHECK(n == 2 * 12 + 2);
    double total = 0, qkv = 0;
    for (int i = 0; i < n; i++) {
        total += e[i];
        if (e[i] == 3.0 * 1024 * 1024) qkv++;
    }
    CHECK(qkv == 2);
    double layer = 12.0 * 1024 * 1024 + 9.0 * 1024 + 4096;   /* 12 h^2, biases 3h + h + f + h, norms 4h */
    CHECK_NEAR(total, 2 * layer + 1000.0 * 1024 + 1024, 1e-6);
    free(e);
}

/* 16 ranks on 2 nodes of 8, bf16-mixed (fp16/bf16 weights and gradients as
 * DeepSpeed reduces param.grad): each tensor of e elements, piece p = ceil(e / 16),
 * costs in the forward zero(16 p) + 16 host view ops of 2.26 us (the Python loop
 * making the pieces) + AG(16 p x 2 B) + 16 copy(p), in the backward
 * 16 copy(p) + RS(16 p x 2 B); a tensor under 100,000 elements (the biases and
 * norms here) persists: its reduce-scatter only. The whole model (2 x 12.6M
 * elements and the embedding) is under stage3_max_reuse_distance (1e9), so
 * every weight stays gathered from its forward to its backward: the backward
 * gathers nothing. None of it hides behind the compute (the default overlap
 * 0.8 applies to units only). */
TEST(zero3_deepspeed_2021_per_tensor_unhidden)
{
    model_t m = megatron_gpt(2);
    cost_cluster c = two_nodes();
    plan_workload w = step_of_16();
    plan_options o;
    plan_options_default(&o);
    plan_module s = { .dp = 16, .tp = 1, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .recompute = PLAN_RECOMP_NONE,
                      .n_ranks = 16 };
    plan_time units, ds;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 1, &units);
    o.zero3 = PLAN_ZERO3_DEEPSPEED_2021;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 1, &ds);
    const cost_pool *P = &c.pool[0];
    double *e = NULL;
    int n = plan_zero3_megatron_tensors(&m.mod[0], &s, &e);
    double want = 0;
    for (int i = 0; i < n; i++) {
        double p = ceil(e[i] / 16), copies = 16 * cost_elementwise_time(&P->gpu, COST_EW_COPY, p, 2);
        double ag = cost_elementwise_time(&P->gpu, COST_EW_ZERO, 16 * p, 2) + 16 * 2.26e-6   /* 16 narrow() calls */
                  + cost_collective_time(P, COST_ALLGATHER, 16 * p * 2, 16, 8) + copies;
        double rs = copies + cost_collective_time(P, COST_REDUCESCATTER, 16 * p * 2, 16, 8);
        want += (e[i] < 100000 ? 0 : ag) + rs;
    }
    int big = 0;
    for (int i = 0; i < n; i++) big += e[i] >= 100000;
    free(e);
    CHECK_NEAR(ds.zero_comm_s, want, 1e-12);
    CHECK(big == 2 * 4 + 1);   /* qkv, dense, h_to_4h, 4h_to_h per block, the embedding */
    CHECK(ds.fwd_syncs == big && ds.bwd_syncs == n);
    /* each collective pays at least its 15 ring steps and 16 kernel launches */
    CHECK(ds.zero_comm_s > (big + n) * (15 * P->inter.alpha_s + 16 * P->gpu.kernel_launch_s));
    /* the persistent ones in one gather after the step */
    plan_time step = ds;
    plan_stage_step_time(&m.mod[0], &s, 0, P, &o, &step);
    CHECK_NEAR(step.param_gather_s, plan_zero3_persistent_gather_s(&m.mod[0], &s, P, &o), 1e-15);
    CHECK(step.param_gather_s > 15 * P->inter.alpha_s && step.param_gather_s < ds.zero_comm_s / big);
    /* the per-unit price hides most of its 3 x 4 collectives behind the compute */
    CHECK(ds.zero_comm_s > units.zero_comm_s);
    /* the same compute, but for the units' copy of their gradients into the flat reduce-scatter input
     * (cost_dp.c units_copy), which DeepSpeed's list-form reduce-scatters price as their copies in */
    CHECK_NEAR(ds.fwd_s, units.fwd_s, 1e-12);
    CHECK_NEAR(ds.recompute_s, units.recompute_s, 1e-12);
    CHECK(units.bwd_s > ds.bwd_s);
}

/* Which uses gather when the weights exceed stage3_max_reuse_distance (1e9
 * elements): hidden 16384, 2 blocks; per block qkv 3h^2 = 8.05e8, dense h^2 =
 * 2.68e8, h_to_4h and 4h_to_h 4h^2 = 1.07e9 each, the embedding 1000 h.
 * Without recomputation the backward (final norm, then each block's tensors
 * in reverse) finds the last block's 4h_to_h still gathered (only the final
 * norm ran between) and gathers the other 3 of that block, the 4 of the
 * first and the embedding: 8. Under full recomputation each block's forward
 * runs again first (4 gathers: its forward is more than 1e9 elements back),
 * then its backward finds 4h_to_h just used (kept) and gathers the other 3:
 * 2 x (4 + 3) + 1 = 15. Every gradient is reduce-scattered once (n). */
TEST(zero3_deepspeed_2021_recompute_and_reuse_distance)
{
    model_t m = megatron_gpt_h(2, 16384);
    cost_cluster c = two_nodes();
    plan_options o;
    plan_options_default(&o);
    o.zero3 = PLAN_ZERO3_DEEPSPEED_2021;
    plan_module s = { .dp = 16, .tp = 1, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .recompute = PLAN_RECOMP_NONE,
                      .n_ranks = 16 };
    double *e = NULL;
    int n = plan_zero3_megatron_tensors(&m.mod[0], &s, &e);
    free(e);
    plan_comm none = { 0 }, full = { 0 };
    CHECK(plan_zero3_deepspeed_2021(&m.mod[0], &s, &c.pool[0], &o, true, true, true, &none) == UTIL_OK);
    s.recompute = PLAN_RECOMP_FULL;
    CHECK(plan_zero3_deepspeed_2021(&m.mod[0], &s, &c.pool[0], &o, true, true, true, &full) == UTIL_OK);
    CHECK(none.fwd_syncs == 9 && full.fwd_syncs == 9);   /* 4 per block and the embedding */
    CHECK(none.bwd_syncs == 8 + n);
    CHECK(full.bwd_syncs == 15 + n);
    CHECK(full.bwd_s > none.bwd_s && full.fwd_s == none.fwd_s);
}

/* DeepSpeed's ZeRO-3 gather buffer is 4 bytes per element of its largest
 * module (estimate_zero3_model_states_mem_needs: 4 x largest_layer_params,
 * one Linear's own parameters): here dense_h_to_4h, 1024 x 4096 (the fused
 * QKV is 3 x 1024 x 1024, the embedding 1000 x 1024); the per-unit (FSDP)
 * choice keeps two bf16 copies of a whole block. */
TEST(zero3_deepspeed_2021_buffer_is_largest_module)
{
    model_t m = megatron_gpt(2);
    plan_workload w = step_of_16();
    plan_options o;
    plan_options_default(&o);
    plan_module s = { .dp = 16, .tp = 1, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .recompute = PLAN_RECOMP_NONE,
                      .n_ranks = 16 };
    cost_cluster c = two_nodes();
    plan_mem units, ds;
    plan_module_memory(&m, 0, &s, &w, &c.pool[0].gpu, &o, 1, &units);
    o.zero3 = PLAN_ZERO3_DEEPSPEED_2021;
    plan_module_memory(&m, 0, &s, &w, &c.pool[0].gpu, &o, 1, &ds);
    CHECK_NEAR(ds.zero_buffers, 4.0 * 1024 * 4096, 1e-6);
    CHECK_NEAR(units.zero_buffers, 4.0 * (double)model_largest_layer_params(&m.mod[0]), 1e-6);
    /* v0.3.13's stage 3 has no reduce bucket of its own (contiguous_gradients false): the
     * gradients waiting in param.grad beyond the largest one the gather buffer holds */
    CHECK_NEAR(units.comm - ds.comm, 2.0 * 1024 * 4096, 1e-3);
}

/* The choice travels with the plan file; a plan without it is "units". */
TEST(zero3_choice_names)
{
    plan_zero3 z;
    CHECK(plan_zero3_parse("deepspeed-2021", &z) == UTIL_OK && z == PLAN_ZERO3_DEEPSPEED_2021);
    CHECK(plan_zero3_parse("units", &z) == UTIL_OK && z == PLAN_ZERO3_UNITS);
    CHECK(plan_zero3_parse("fsdp2", &z) == UTIL_OK && z == PLAN_ZERO3_FSDP2);
    CHECK(!strcmp(plan_zero3_name(PLAN_ZERO3_FSDP2), "fsdp2"));
    CHECK(plan_zero3_parse("deepspeed", &z) != UTIL_OK);
    CHECK(!strcmp(plan_zero3_name(PLAN_ZERO3_DEEPSPEED_2021), "deepspeed-2021"));
}

/* A plan made under deepspeed-2021 says so in its file and prices the same
 * after the round trip (dhp simulate re-prices a plan file); a plan made
 * under the default leaves the key out. */
TEST(zero3_choice_travels_with_the_plan)
{
    model_t m = megatron_gpt(2);
    cost_cluster c = two_nodes();
    char err[UTIL_ERR_LEN];
    plan_workload w = step_of_16();
    plan_options o;
    plan_options_default(&o);
    plan_t units, ds, back;
    CHECK(plan_from_strategy_opts("llm:dp=16,zero=3", &m, &c, &w, PLAN_COLOCATED, 16, 1, &o, &units, err) == UTIL_OK);
    o.zero3 = PLAN_ZERO3_DEEPSPEED_2021;
    CHECK(plan_from_strategy_opts("llm:dp=16,zero=3", &m, &c, &w, PLAN_COLOCATED, 16, 1, &o, &ds, err) == UTIL_OK);
    CHECK(ds.zero3 == PLAN_ZERO3_DEEPSPEED_2021 && ds.pred.step_time_s > units.pred.step_time_s);
    cJSON *j = plan_to_json(&units);
    CHECK(!cJSON_GetObjectItemCaseSensitive(j, "zero3"));
    cJSON_Delete(j);
    j = plan_to_json(&ds);
    CHECK(plan_from_json(j, "plan", &back, err) == UTIL_OK);
    cJSON_Delete(j);
    CHECK(back.zero3 == PLAN_ZERO3_DEEPSPEED_2021);
    plan_options ob = plan_options_of(&back);
    CHECK(ob.zero3 == PLAN_ZERO3_DEEPSPEED_2021);
}

/* FSDP2 (fully_shard) copies every gathered unit out of its all-gather
 * buffer, on the compute stream: the forward gains one copy of each unit's
 * gathered weights (read and write, bf16: 4 B an element of the rank's
 * layers), the backward another per gather; the collectives are the same.
 * Both ZeRO-3 forms copy the gradients into the reduce-scatter's input. */
TEST(zero3_fsdp2_copies_out_each_gather)
{
    model_t m = megatron_gpt(2);
    cost_cluster c = two_nodes();
    plan_workload w = step_of_16();
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_MEGATRON;
    plan_module s = { .dp = 16, .tp = 1, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .n_ranks = 16 };
    plan_time units, fsdp2, zero2;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 1, &units);
    o.zero3 = PLAN_ZERO3_FSDP2;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 1, &fsdp2);
    CHECK(fsdp2.fwd_s > units.fwd_s && fsdp2.bwd_s > units.bwd_s);
    CHECK_NEAR(fsdp2.zero_comm_s, units.zero_comm_s, 1e-12);
    CHECK_NEAR(fsdp2.recompute_s, units.recompute_s, 1e-12);
    /* ZeRO-2 gathers nothing and reduce-scatters without the ZeRO-3 copy: fsdp2 changes nothing there */
    s.zero = 2;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 1, &zero2);
    o.zero3 = PLAN_ZERO3_UNITS;
    plan_time zero2_units;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 1, &zero2_units);
    CHECK_NEAR(zero2.micro_s, zero2_units.micro_s, 1e-12);
}
