/* FP8 linears (--fp8, plan_options.fp8; the Megatron target only): the
 * blocks' linear GEMMs at the GPU's FP8 peak and efficiency, their casts as
 * element-wise passes, what TransformerEngine saves for backward (FP8 inputs)
 * against torchao (bf16 inputs), the refusals and the plan file. Expected
 * figures worked out beside each check from the formulas they test. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

#include <math.h>
#include <string.h>

/* Llama-like: 2 blocks, hidden 1024, 16 heads of 64 over 4 kv heads, SwiGLU 4096. */
static model_t llama(void)
{
    return test_llm("llama", "\"layers\": 2, \"hidden\": 1024, \"heads\": 16, \"kv_heads\": 4, \"ffn\": 4096,"
                    " \"ffn_kind\": \"swiglu\", \"norm\": \"rmsnorm\", \"vocab\": 1000");
}

static plan_options fp8_options(plan_fp8 f)
{
    plan_options o = test_megatron_autocast();
    o.fp8 = f;
    return o;
}

static const plan_module DP8 = { .dp = 8, .tp = 1, .sp = 1, .pp = 1, .zero = 1, .micro_batch = 1, .n_ranks = 8 };

/* The MAMF FP8 rows (stas00/ml-engineering) the costdb fitted: the burst rate
 * at each best shape is the measured one; the GPU without FP8 has none. */
TEST(fp8_gemm_burst_rate_is_the_fitted_mamf_figure)
{
    cost_cluster h100 = test_cluster_load("8xh100"), h200 = test_cluster_load("8xh200");
    cost_cluster a100 = test_cluster_load("8xa100-80g");
    double f1 = 2.0 * 1024 * 9216 * 14336, f2 = 2.0 * 1280 * 4096 * 12032;
    double r1 = f1 / cost_gemm_burst_time_in(&h100.pool[0].gpu, COST_MATH_FP8, 1024, 9216, 14336);
    double r2 = f2 / cost_gemm_burst_time_in(&h200.pool[0].gpu, COST_MATH_FP8, 1280, 4096, 12032);
    CHECK(fabs(r1 / 1402.6e12 - 1) < 1e-3 && fabs(r2 / 1453.4e12 - 1) < 1e-3);
    CHECK(cost_gpu_has_fp8(&h100.pool[0].gpu) && !cost_gpu_has_fp8(&a100.pool[0].gpu));
    CHECK(cost_gemm_time_in(&a100.pool[0].gpu, COST_MATH_FP8, 1024, 1024, 1024) == 0);
    /* FP8 is faster than bf16 on the same shape, by less than the peaks' 2x */
    double b = cost_gemm_time_in(&h100.pool[0].gpu, COST_MATH_BF16, 4096, 4096, 4096);
    double e = cost_gemm_time_in(&h100.pool[0].gpu, COST_MATH_FP8, 4096, 4096, 4096);
    CHECK(e < b && e > b / 2);
}

/* The three GEMMs of a linear Y[m,n] = X[m,k] W[k,n] (forward, input
 * gradient, weight gradient) in one math. */
static double linear_s(const cost_gpu *g, cost_gemm_math math, double m, double n, double k)
{
    return cost_gemm_time_in(g, math, m, n, k) + cost_gemm_time_in(g, math, m, k, n)
         + cost_gemm_time_in(g, math, k, n, m);
}

/* One micro-batch of 2048 tokens: the GEMM part drops by exactly the four
 * block linears' bf16 - FP8 difference per block (the output layer stays
 * bf16); what else grows is the casts: TransformerEngine's delayed scaling
 * transposes a norm-fed input (read 1 + write 1 B), casts and transposes
 * the other inputs and every output gradient (read 2, write 2 B); current
 * scaling reads each of those first for the amax; torchao casts the weights
 * at each use too. */
TEST(fp8_prices_the_block_linears_in_fp8_and_their_casts)
{
    model_t m = llama();
    cost_cluster c = test_cluster_load("8xh100");
    const cost_gpu *g = &c.pool[0].gpu;
    plan_workload w = { .global_batch = 8, .text_tokens = 2048 };
    plan_options b16 = fp8_options(PLAN_FP8_NONE), del = fp8_options(PLAN_FP8_DELAYED);
    plan_options cur = fp8_options(PLAN_FP8_TENSORWISE), tao = fp8_options(PLAN_FP8_TORCHAO);
    plan_time tb, td, tc, tt;
    plan_micro_time(&m, 0, &DP8, &w, &c, &b16, 1, &tb);
    plan_micro_time(&m, 0, &DP8, &w, &c, &del, 1, &td);
    plan_micro_time(&m, 0, &DP8, &w, &c, &cur, 1, &tc);
    plan_micro_time(&m, 0, &DP8, &w, &c, &tao, 1, &tt);
    double t = 2048, h = 1024, qkv = (16 + 2 * 4) * 64, f = 4096;
    const double shapes[4][2] = { { qkv, h }, { h, h }, { 2 * f, h }, { h, f } };   /* n, k */
    double saved = 0;
    for (int i = 0; i < 4; i++)
        saved += linear_s(g, COST_MATH_BF16, t, shapes[i][0], shapes[i][1])
               - linear_s(g, COST_MATH_FP8, t, shapes[i][0], shapes[i][1]);
    CHECK(fabs((tb.pace.gemm_s - td.pace.gemm_s) - 2 * saved) < 1e-9 * tb.pace.gemm_s);
    CHECK(td.pace.gemm_s == tc.pace.gemm_s && td.pace.gemm_s == tt.pace.gemm_s);
    double casts = 0;
    for (int i = 0; i < 4; i++) {
        bool norm_fed = i == 0 || i == 2;
        double in = t * shapes[i][1], out = t * shapes[i][0];
        casts += cost_memory_time(g, norm_fed ? 2 * in : 4 * in) + cost_memory_time(g, 4 * out);
    }
    CHECK(fabs((td.pace.other_s - tb.pace.other_s) - 2 * casts) < 1e-9 * tb.pace.other_s);
    CHECK(tc.pace.other_s > td.pace.other_s && tt.pace.other_s > tc.pace.other_s);
    CHECK(td.pace.attn_s == tb.pace.attn_s);
    /* once a step, the primary FP8 weights' transposes (read 1, write 1 B) */
    CHECK(plan_fp8_weight_cast_s(&m.mod[0], &DP8, &c.pool[0], &del)
          == cost_memory_time(g, 2.0 * plan_local_block_params(&m.mod[0], &DP8)));
    CHECK(plan_fp8_weight_cast_s(&m.mod[0], &DP8, &c.pool[0], &tao) == 0);
}

/* Saved for backward per token and block, A = 2 B: TransformerEngine keeps
 * the FP8 cast of the query/key/value and MLP inputs (h each) and of the
 * second MLP linear's input (f) instead of bf16, and the attention core's
 * bf16 output beside the output projection's FP8 input (+ H d): (A - 1)(2 h +
 * f) - H d = 2048 + 4096 - 1024 = 5120 B less; torchao saves bf16 as before.
 * The weights' bytes do not change (primary FP8 weight and its transpose: 2 B). */
TEST(fp8_transformer_engine_saves_fp8_inputs_torchao_bf16)
{
    model_t m = llama();
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 8, .text_tokens = 2048 };
    plan_options b16 = fp8_options(PLAN_FP8_NONE), del = fp8_options(PLAN_FP8_DELAYED), tao = fp8_options(PLAN_FP8_TORCHAO);
    plan_mem mb, md, mt;
    plan_module_memory(&m, 0, &DP8, &w, &c.pool[0].gpu, &b16, 1, &mb);
    plan_module_memory(&m, 0, &DP8, &w, &c.pool[0].gpu, &del, 1, &md);
    plan_module_memory(&m, 0, &DP8, &w, &c.pool[0].gpu, &tao, 1, &mt);
    CHECK(mb.block_acts - md.block_acts == 2 * 2048 * 5120.0);
    CHECK(mt.block_acts == mb.block_acts && mt.params == mb.params && md.params == mb.params);
    /* full recomputation keeps each block's input alone, in bf16 either way;
     * the one block live again in the backward saves its FP8 inputs */
    plan_module rc = DP8;
    rc.recompute = PLAN_RECOMP_FULL;
    plan_module_memory(&m, 0, &rc, &w, &c.pool[0].gpu, &b16, 1, &mb);
    plan_module_memory(&m, 0, &rc, &w, &c.pool[0].gpu, &del, 1, &md);
    CHECK(mb.block_acts - md.block_acts == 2048 * 5120.0);
}

/* The Megatron target only, over bf16, on GPUs with FP8; kept in the plan file. */
TEST(fp8_refusals_and_plan_file)
{
    model_t m = llama();
    cost_cluster h100 = test_cluster_load("8xh100"), a100 = test_cluster_load("8xa100-80g");
    char err[UTIL_ERR_LEN];
    plan_options o = fp8_options(PLAN_FP8_DELAYED);
    CHECK(plan_fp8_check(&o, &h100, err) == UTIL_OK);
    CHECK(plan_fp8_check(&o, &a100, err) == UTIL_EINVAL && strstr(err, "has no FP8 tensor cores"));
    o.target = PLAN_TARGET_DHP;
    CHECK(plan_fp8_check(&o, &h100, err) == UTIL_EINVAL && strstr(err, "use --target megatron"));
    o = fp8_options(PLAN_FP8_TORCHAO);
    o.precision = PLAN_OPT_FP32;
    CHECK(plan_fp8_check(&o, NULL, err) == UTIL_EINVAL && strstr(err, "not fp32"));
    plan_fp8 f;
    CHECK(plan_fp8_parse("tensorwise", &f, err) == UTIL_OK && f == PLAN_FP8_TENSORWISE);
    CHECK(plan_fp8_parse("e4m3", &f, err) != UTIL_OK);

    plan_workload w = { .global_batch = 8, .text_tokens = 2048 };
    plan_t plain, fp8, back;
    o = fp8_options(PLAN_FP8_NONE);
    CHECK(plan_from_strategy_opts("llm:dp=8,zero=1", &m, &h100, &w, PLAN_COLOCATED, 8, 1, &o, &plain, err) == UTIL_OK);
    o.fp8 = PLAN_FP8_DELAYED;
    CHECK(plan_from_strategy_opts("llm:dp=8,zero=1", &m, &h100, &w, PLAN_COLOCATED, 8, 1, &o, &fp8, err) == UTIL_OK);
    CHECK(fp8.pred.step_time_s < plain.pred.step_time_s);
    CHECK(!test_plan_json_has(&plain, "fp8") && test_plan_json_has(&fp8, "fp8"));
    CHECK(test_plan_json_round_trip(&fp8, &back, err) == UTIL_OK);
    CHECK(back.fp8 == PLAN_FP8_DELAYED && plan_options_of(&back).fp8 == PLAN_FP8_DELAYED);
    char why[UTIL_ERR_LEN];
    CHECK(plan_run_check(&fp8, why) == UTIL_EUNSUPPORTED);   /* the Megatron target: dhp run refuses it */
}

/* The sequence-parallel all-gathers of the blocks move FP8 (TransformerEngine
 * gathers the quantized input and output gradient; torchtitan's Float8 TP
 * styles cast before gathering): per block 2 forward and 4 backward
 * all-gathers (Megatron re-gathers the saved input) of t x h elements at 1 B
 * instead of 2; the reduce-scatters stay bf16. */
TEST(fp8_sequence_parallel_all_gathers_move_fp8)
{
    model_t m = llama();
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 2, .text_tokens = 2048 };
    plan_module tp4 = { .dp = 2, .tp = 4, .sp = 1, .pp = 1, .zero = 1, .micro_batch = 1, .n_ranks = 8,
                        .seq_parallel = true };
    plan_options b16 = fp8_options(PLAN_FP8_NONE), del = fp8_options(PLAN_FP8_DELAYED);
    plan_time tb, td;
    plan_micro_time(&m, 0, &tp4, &w, &c, &b16, 1, &tb);
    plan_micro_time(&m, 0, &tp4, &w, &c, &del, 1, &td);
    double elems = 2048.0 * 1024;
    double ag2 = cost_collective_time(&c.pool[0], COST_ALLGATHER, 2 * elems, 4, 4);
    double ag1 = cost_collective_time(&c.pool[0], COST_ALLGATHER, 1 * elems, 4, 4);
    CHECK(ag1 < ag2);
    CHECK(fabs((tb.tp_comm_s - td.tp_comm_s) - 2 * 6 * (ag2 - ag1)) < 1e-9 * tb.tp_comm_s);
    CHECK(plan_tp_gather_bytes(&del, 2) == 1 && plan_tp_gather_bytes(&b16, 2) == 2);
}
