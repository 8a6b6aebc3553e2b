/* ZeRO-3 as DeepSpeed issued it in 2021 (planner/cost_zero3.c, --zero3
 * deepspeed-2021): one collective per Megatron-LM weight tensor, PyTorch's
 * list-form copies, nothing hidden behind the compute. Every expected figure
 * is worked out beside it. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

#include <math.h>
#include <stdlib.h>

/* A Megatron GPT block of hidden h: LayerNorm, biases on every linear, GELU MLP of 4h, tied embedding. */
static model_t megatron_gpt_h(int layers, int h)
{
    return test_llm("gpt", "\"layers\": %d, \"hidden\": %d, \"heads\": 16, \"ffn\": %d, \"ffn_kind\": \"gelu\","
                    " \"norm\": \"layernorm\", \"qkv_bias\": true, \"out_bias\": true, \"mlp_bias\": true,"
                    " \"vocab\": 1000, \"tied_embeddings\": true", layers, h, 4 * h);
}

static model_t megatron_gpt(int layers) { return megatron_gpt_h(layers, 1024); }

/* 2 nodes of 8 H100s (the shipped preset). */
static cost_cluster two_nodes(void) { return test_cluster_load("2x8xh100"); }

/* ZeRO-3 over dp 16, one sample a micro-batch, under recomputation rc. */
static plan_module zero3_on_16(plan_recompute rc)
{
    return (plan_module){ .dp = 16, .tp = 1, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .recompute = rc, .n_ranks = 16 };
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
    plan_module s = zero3_on_16(PLAN_RECOMP_NONE);
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
 * making the pieces) + AG(16 p x 2 B) + 16 copy(p); a tensor under 100,000
 * elements (the biases and norms here) persists and is not gathered. The
 * whole model (2 x 12.6M elements and the embedding) is under
 * stage3_max_reuse_distance (1e9), so every weight stays gathered from its
 * forward to its backward: the backward gathers nothing. Its gradients, all
 * 26, fit one reduce bucket (5e8 elements): the backward flattens them (one
 * copy of E = every element), divides in place (a copy's traffic), all-reduces
 * E x 2 B, copies each back (E elements, 26 kernels), and copies each
 * tensor's piece into its shard (copy(p) each). None of it hides behind the
 * compute (the default overlap 0.8 applies to units only). */
TEST(zero3_deepspeed_2021_per_tensor_unhidden)
{
    model_t m = megatron_gpt(2);
    cost_cluster c = two_nodes();
    plan_workload w = step_of_16();
    plan_options o;
    plan_options_default(&o);
    plan_module s = zero3_on_16(PLAN_RECOMP_NONE);
    plan_time units, ds;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 1, &units);
    o.zero3 = PLAN_ZERO3_DEEPSPEED_2021;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 1, &ds);
    const cost_pool *P = &c.pool[0];
    double *e = NULL;
    int n = plan_zero3_megatron_tensors(&m.mod[0], &s, &e);
    double want = 0, E = 0;
    for (int i = 0; i < n; i++) {
        double p = ceil(e[i] / 16), copies = 16 * cost_elementwise_time(&P->gpu, COST_EW_COPY, p, 2);
        double ag = cost_elementwise_time(&P->gpu, COST_EW_ZERO, 16 * p, 2) + 16 * 2.26e-6   /* 16 narrow() calls */
                  + cost_collective_time(P, COST_ALLGATHER, 16 * p * 2, 16, 8) + copies;
        want += (e[i] < 100000 ? 0 : ag) + cost_elementwise_time(&P->gpu, COST_EW_COPY, p, 2);
        E += e[i];
    }
    want += 3 * cost_elementwise_time(&P->gpu, COST_EW_COPY, E, 2) + (n - 1) * P->gpu.kernel_launch_s
          + cost_collective_time(P, COST_ALLREDUCE, E * 2, 16, 8);
    int big = 0;
    for (int i = 0; i < n; i++) big += e[i] >= 100000;
    free(e);
    CHECK_NEAR(ds.zero_comm_s, want, 1e-12);
    CHECK(big == 2 * 4 + 1);   /* qkv, dense, h_to_4h, 4h_to_h per block, the embedding */
    CHECK(ds.fwd_syncs == big && ds.bwd_syncs == 1);
    /* each gather pays at least its 15 ring steps and 16 kernel launches */
    CHECK(ds.zero_comm_s > big * (15 * P->inter.alpha_s + 16 * P->gpu.kernel_launch_s));
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
    plan_module s = zero3_on_16(PLAN_RECOMP_NONE);
    double *e = NULL;
    int n = plan_zero3_megatron_tensors(&m.mod[0], &s, &e);
    free(e);
    plan_comm none = { 0 }, full = { 0 };
    CHECK(plan_zero3_deepspeed_2021(&m.mod[0], &s, &c.pool[0], &o, true, true, true, &none) == UTIL_OK);
    s.recompute = PLAN_RECOMP_FULL;
    CHECK(plan_zero3_deepspeed_2021(&m.mod[0], &s, &c.pool[0], &o, true, true, true, &full) == UTIL_OK);
    CHECK(none.fwd_syncs == 9 && full.fwd_syncs == 9);   /* 4 per block and the embedding */
    CHECK(n == 26);
    CHECK(none.bwd_syncs == 8 + 13);   /* the 13 reduce buckets of zero3_deepspeed_2021_reduce_buckets */
    CHECK(full.bwd_syncs == 15 + 13);
    CHECK(full.bwd_s > none.bwd_s && full.fwd_s == none.fwd_s);
}

/* The gradients' reduction under DeepSpeed v0.3.13-v0.4.0's defaults
 * (contiguous_gradients false: stage3.py buffered_reduce_fallback): buckets
 * of reduce_bucket_size (5e8) elements, each flushed before the gradient that
 * would overflow it, each one fp16 all-reduce (not a reduce-scatter per
 * tensor). Hidden 16384, 2 blocks; tensors in module order: the embedding
 * (16,384,000), per block ln1 w, b (16384 each), qkv w (805,306,368), qkv b
 * (49152), dense w (268,435,456), dense b, ln2 w, b (16384 each), h_to_4h w
 * (1,073,741,824), b (65536), 4h_to_h w (1,073,741,824), b (16384); the final
 * norm (16384). The backward hands them over in reverse:
 *   {final norm, 4h_to_h b} 32768 | {4h_to_h w} | {h_to_4h b} | {h_to_4h w} |
 *   {ln2 b, w, dense b, w, qkv b} 268,533,760 | {qkv w} |
 *   {ln1 b, w, block 0's 4h_to_h b} 49152 | {4h_to_h w} | {h_to_4h b} |
 *   {h_to_4h w} | {ln2 .. qkv b} 268,533,760 | {qkv w} |
 *   {ln1 b, w, the embedding} 16,416,768
 * 13 buckets. One bucket of k gradients, E elements: div_ (a copy's
 * traffic) + AR(E x 2 B), and for k > 1 the flattening copy and the copies
 * back (E elements twice, k - 1 more launches); every tensor's piece copied
 * into its shard after. */
static double bucket_want(const cost_pool *P, int k, double E)
{
    double t = cost_elementwise_time(&P->gpu, COST_EW_COPY, E, 2) + cost_collective_time(P, COST_ALLREDUCE, E * 2, 16, 8);
    return k > 1 ? t + 2 * cost_elementwise_time(&P->gpu, COST_EW_COPY, E, 2) + (k - 1) * P->gpu.kernel_launch_s : t;
}

TEST(zero3_deepspeed_2021_reduce_buckets)
{
    model_t m = megatron_gpt_h(2, 16384);
    cost_cluster c = two_nodes();
    const cost_pool *P = &c.pool[0];
    plan_options o;
    plan_options_default(&o);
    o.zero3 = PLAN_ZERO3_DEEPSPEED_2021;
    plan_module s = zero3_on_16(PLAN_RECOMP_FULL);
    plan_comm r = { 0 };
    CHECK(plan_zero3_deepspeed_2021(&m.mod[0], &s, P, &o, false, false, true, &r) == UTIL_OK);
    const double W4 = 1073741824, Q = 805306368, MID = 268533760;
    const struct { int k; double E; } b[] = { { 2, 32768 }, { 1, W4 }, { 1, 65536 }, { 1, W4 }, { 5, MID }, { 1, Q },
                                              { 3, 49152 }, { 1, W4 }, { 1, 65536 }, { 1, W4 }, { 5, MID }, { 1, Q },
                                              { 3, 16416768 } };
    double want = 0, all = 0;
    int k = 0;
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) want += bucket_want(P, b[i].k, b[i].E), all += b[i].E, k += b[i].k;
    double *e = NULL;
    int n = plan_zero3_megatron_tensors(&m.mod[0], &s, &e);
    double total = 0;
    for (int i = 0; i < n; i++) want += cost_elementwise_time(&P->gpu, COST_EW_COPY, ceil(e[i] / 16), 2), total += e[i];
    free(e);
    CHECK(k == n && all == total);   /* every gradient in exactly one bucket */
    CHECK(r.bwd_syncs == 13 && r.fwd_syncs == 0 && r.fwd_s == 0);
    CHECK_NEAR(r.bwd_s, want, 1e-12);
    /* an all-reduce moves twice a reduce-scatter's bytes: more than one per tensor would on the big ones */
    CHECK(r.bwd_s > 2 * (2 * W4 + Q) * 2 / 16 / P->inter.busbw);
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
    plan_module s = zero3_on_16(PLAN_RECOMP_NONE);
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
    CHECK(plan_zero3_parse("deepspeed-2021", &z, NULL) == UTIL_OK && z == PLAN_ZERO3_DEEPSPEED_2021);
    CHECK(plan_zero3_parse("units", &z, NULL) == UTIL_OK && z == PLAN_ZERO3_UNITS);
    CHECK(plan_zero3_parse("fsdp2", &z, NULL) == UTIL_OK && z == PLAN_ZERO3_FSDP2);
    CHECK(!strcmp(plan_zero3_name(PLAN_ZERO3_FSDP2), "fsdp2"));
    CHECK(plan_zero3_parse("deepspeed", &z, NULL) != UTIL_OK);
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
    CHECK(!test_plan_json_has(&units, "zero3"));
    CHECK(test_plan_json_round_trip(&ds, &back, err) == UTIL_OK);
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
    plan_module s = zero3_on_16(PLAN_RECOMP_NONE);
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

/* DeepSpeed v0.3.13 stage 3's step around its fused Adam (cost_zero3.c
 * plan_zero3_deepspeed_step), 16 ranks on 2 nodes, a 2-block GPT of 26
 * tensors, each rank's fp16 piece p = ceil(e / 16) of each, P in all:
 * the overflow check casts each piece to fp32 (2 + 4 B: a copy's traffic
 * at 3 B) and sums it (a 4 B read), then all-reduces a one-byte flag; the
 * norm casts each piece to fp64 (2 + 8 B) and takes its norm (an 8 B read);
 * the fp32 gradient is one torch.cat of the 26 pieces (2 B copy, under
 * 128 inputs: one launch) cast to fp32 (3 B), unscaled in place (4 B), and
 * after the Adam the fp32 master's read for its fp16 copy (4 B: a 2 B
 * copy's traffic). The per-unit ZeRO-3 keeps the fused step alone. */
TEST(zero3_deepspeed_2021_step_around_adam)
{
    model_t m = megatron_gpt(2);
    cost_cluster c = two_nodes();
    const cost_pool *P = &c.pool[0];
    const cost_gpu *g = &P->gpu;
    plan_options o;
    plan_options_default(&o);
    plan_module s = zero3_on_16(PLAN_RECOMP_NONE);
    plan_time units = { 0 }, ds = { 0 };
    plan_stage_step_time(&m.mod[0], &s, 0, P, &o, &units);
    o.zero3 = PLAN_ZERO3_DEEPSPEED_2021;
    plan_stage_step_time(&m.mod[0], &s, 0, P, &o, &ds);
    double *e = NULL;
    int n = plan_zero3_megatron_tensors(&m.mod[0], &s, &e);
    CHECK(n == 26);
    double all = 0, overflow = 0, norm = 0;
    for (int i = 0; i < n; i++) {
        double p = ceil(e[i] / 16);
        all += p;
        overflow += cost_elementwise_time(g, COST_EW_COPY, p, 3) + cost_elementwise_time(g, COST_EW_SUMSQ, p, 4);
        norm += cost_elementwise_time(g, COST_EW_COPY, p, 5) + cost_elementwise_time(g, COST_EW_SUMSQ, p, 8);
    }
    free(e);
    double around = overflow + cost_collective_time(P, COST_ALLREDUCE, 1, 16, 8)
                  + cost_elementwise_time(g, COST_EW_COPY, all, 2) + cost_elementwise_time(g, COST_EW_COPY, all, 3)
                  + cost_elementwise_time(g, COST_EW_COPY, all, 4) + cost_elementwise_time(g, COST_EW_COPY, all, 2);
    CHECK(units.optim_s > 0);
    CHECK_NEAR(ds.optim_s, units.optim_s + around, 1e-15);
    CHECK_NEAR(ds.norm_s, norm, 1e-15);
    /* the flag's all-reduce crosses the nodes: at least its ring steps */
    CHECK(ds.optim_s - units.optim_s > 2 * P->inter.alpha_s);
}
