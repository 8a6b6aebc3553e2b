/* fp32 linears on TF32 tensor cores (dhp run --tf32): the rounding to TF32
 * (10 mantissa bits, to nearest, ties to even: executor/tf32.h), and the CUDA
 * backend's linears under set_tf32 through the emulator (tests/cudaemu_lt.h)
 * against the CPU's fp32 linears on the operands rounded first (a product of
 * two TF32 values, 11-bit significands, is exact in fp32, so both compute
 * the same sums up to order: judged like every emulated GEMM, 1e-4 relative,
 * tests/test_cuda_kernels.c); the bias gradient stays the fp32 dout's sum.
 * Then the unfused path: the same linears where cuBLASLt has no kernel for
 * the bias epilogues (DHP_EMU_LT_EPILOGUES=0). Registered after the kernel
 * tests: the backend remembers a refused epilogue for the process. */
#include "test.h"
#include "executor/tf32.h"
#include "tests/kernel_data.h"
#include "planner/planner.h"
#include "util/util.h"

#include <float.h>
#include <stdio.h>

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }
static uint32_t f_bits(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return u; }

TEST(tf32_rounds_to_nearest_even)
{
    CHECK(ex_tf32_round(1.0f) == 1.0f);
    CHECK(f_bits(ex_tf32_round(-0.0f)) == 0x80000000u);
    /* 1 + 2^-11 is half an ulp of 10 mantissa bits: a tie, to even (1); 1 + 3 * 2^-11 to 1 + 2^-9 */
    CHECK(ex_tf32_round(1.0f + 0x1p-11f) == 1.0f);
    CHECK(ex_tf32_round(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);
    CHECK(f_bits(ex_tf32_round(bits_f(0x3f801001u))) == 0x3f802000u);   /* above the tie: up */
    CHECK(f_bits(ex_tf32_round(bits_f(0x3f800fffu))) == 0x3f800000u);   /* below: down */
    CHECK(ex_tf32_round(FLT_MAX) == INFINITY);
    CHECK(ex_tf32_round(-INFINITY) == -INFINITY);
    CHECK(isnan(ex_tf32_round(NAN)));
    CHECK(isnan(ex_tf32_round(bits_f(0x7f800001u))));   /* payload in the dropped bits: still a NaN */
    double worst = 0;
    for (int i = 0; i < 100000; i++) {
        float x = ur() * 1e3f;
        if (x == 0) continue;
        CHECK((f_bits(ex_tf32_round(x)) & 0x1fffu) == 0);
        worst = fmax(worst, fabs((double)ex_tf32_round(x) - x) / fabs(x));
    }
    CHECK_MSG(worst <= 0x1p-11, "worst relative rounding error %.3g > 2^-11", worst);
}

static float *rounded(const float *x, size_t n, bool tf32)
{
    float *y = dup(x, n);
    for (size_t i = 0; tf32 && i < n; i++) y[i] = ex_tf32_round(y[i]);
    return y;
}

/* The emulated backend's fp32 linears (tf32 on or off) against the CPU's on operands rounded as the GEMMs read them. */
static void linear_case(const ex_backend *be, bool tf32, int n, int in, int o, bool bias)
{
    const ex_backend *cpu = ex_backend_cpu();
    size_t ni = (size_t)n * in, nw = (size_t)o * in, nd = (size_t)n * o;
    float *inp = rnd(ni, 1), *w = rnd(nw, 0.5f), *b = rnd((size_t)o, 1), *dout = rnd(nd, 1);
    float *inp_r = rounded(inp, ni, tf32), *w_r = rounded(w, nw, tf32), *dout_r = rounded(dout, nd, tf32);
    float *out = rnd(nd, 9), *out_ref = rnd(nd, 9), *out_fp32 = rnd(nd, 9);
    float *dinp = rnd(ni, 1), *dw = rnd(nw, 1), *db = rnd((size_t)o, 1);
    float *dinp_ref = dup(dinp, ni), *dw_ref = dup(dw, nw), *db_ref = dup(db, (size_t)o);
    be->set_tf32(tf32);
    be->linear_forward(out, inp, w, bias ? b : NULL, n, in, o);
    be->linear_backward(dinp, dw, db, dout, inp, w, n, in, o);
    be->set_tf32(false);
    cpu->linear_forward(out_ref, inp_r, w_r, bias ? b : NULL, n, in, o);
    cpu->linear_forward(out_fp32, inp, w, bias ? b : NULL, n, in, o);
    cpu->linear_backward(dinp_ref, dw_ref, NULL, dout_r, inp_r, w_r, n, in, o);
    cpu->linear_backward(NULL, NULL, db_ref, dout, inp, w, n, in, o);
    char err[UTIL_ERR_LEN] = "";
    CHECK_MSG(be->sync(err) == 0, "sync: %s", err);
    char what[96];
    snprintf(what, sizeof what, "tf32 %d linear %dx%d->%d bias %d", tf32, n, in, o, bias);
    double e;
    CHECK_MSG((e = max_rel_err(out, out_ref, nd)) <= 1e-4, "%s forward: max rel err %.3g", what, e);
    CHECK_MSG((e = max_rel_err(dinp, dinp_ref, ni)) <= 1e-4, "%s dinp: max rel err %.3g", what, e);
    CHECK_MSG((e = max_rel_err(dw, dw_ref, nw)) <= 1e-4, "%s dw: max rel err %.3g", what, e);
    CHECK_MSG((e = max_rel_err(db, db_ref, (size_t)o)) <= 1e-4, "%s db: max rel err %.3g", what, e);
    /* TF32 is not fp32: the rounding shows (sums of several rounded products) */
    if (tf32) CHECK_MSG(max_rel_err(out, out_fp32, nd) > 1e-5, "%s: no TF32 rounding seen", what);
    free(inp); free(w); free(b); free(dout); free(inp_r); free(w_r); free(dout_r); free(out); free(out_ref);
    free(out_fp32); free(dinp); free(dw); free(db); free(dinp_ref); free(dw_ref); free(db_ref);
}

TEST(tf32_cuda_emu_linears_match_fp32_on_rounded_operands)
{
    char err[UTIL_ERR_LEN] = "";
    const ex_backend *be = ex_backend_cuda_emu(err);
    CHECK_MSG(be != NULL, "%s", err);
    if (!be) return;
    CHECK_MSG(ex_backend_cpu()->set_tf32 == NULL, "the CPU backend has no TF32 mode");
    linear_case(be, true, 37, 29, 23, true);
    linear_case(be, true, 19, 50, 600, false);
    linear_case(be, true, 5, 3, 7, true);
}

TEST(cuda_emu_linears_unfused_where_cublaslt_refuses_the_epilogue)
{
    char err[UTIL_ERR_LEN] = "";
    const ex_backend *be = ex_backend_cuda_emu(err);
    CHECK_MSG(be != NULL, "%s", err);
    if (!be) return;
    setenv("DHP_EMU_LT_EPILOGUES", "0", 1);
    linear_case(be, false, 37, 29, 45, true);
    linear_case(be, false, 19, 50, 33, true);
    unsetenv("DHP_EMU_LT_EPILOGUES");
}

/* The dhp target prices precision fp32's linears at the GPU's fp32 peak
 * (CUDA cores: H100 SXM 67 TFLOPS) and with tf32 at its TF32 peak (494.5
 * dense), both below bf16's 989: a micro-batch's forward orders so, and a
 * GEMM's time scales by the peaks' ratio. A tf32 plan file keeps the flag;
 * tf32 with a bf16 precision is one line. */
TEST(tf32_prices_fp32_gemms_at_the_tf32_peak)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_MSG(!model_load("tiny-vl", &m, err) && !cost_cluster_load("8xh100", &c, err), "%s", err);
    const cost_gpu *g = &c.pool[0].gpu;
    CHECK_NEAR(cost_gemm_peak(g, COST_MATH_FP32), 67e12, 1e-12);
    CHECK_NEAR(cost_gemm_peak(g, COST_MATH_TF32), 494.5e12, 1e-12);
    CHECK_NEAR(cost_gemm_peak(g, COST_MATH_BF16), g->peak_flops, 1e-12);
    double big = 4096, launch = g->kernel_launch_s;
    CHECK_NEAR(cost_gemm_time_in(g, COST_MATH_FP32, big, big, big) - launch,
               (cost_gemm_time_in(g, COST_MATH_TF32, big, big, big) - launch) * 494.5 / 67, 1e-9);
    plan_options o;
    plan_options_default(&o);
    o.precision = PLAN_OPT_FP32;
    o.target = PLAN_TARGET_DHP;
    CHECK(plan_gemm_math(&o) == COST_MATH_FP32);
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 48 };
    int li = model_find_kind(&m, MODEL_LLM);
    /* full recomputation: the three forwards run the same kernels but bf16's packing of the blocks'
     * inputs (executor/acts.c; one call a block, where saving every tensor would be eleven launches a
     * block, which outweigh this tiny model's GEMMs) */
    plan_module s = { .dp = 1, .tp = 1, .sp = 1, .pp = 1, .micro_batch = 2, .n_ranks = 1, .recompute = PLAN_RECOMP_FULL };
    plan_time fp32, tf32, bf16;
    plan_micro_time(&m, li, &s, &w, &c, &o, 2, &fp32);
    o.tf32 = true;
    CHECK(plan_gemm_math(&o) == COST_MATH_TF32 && plan_tf32_check(&o, err) == 0);
    plan_micro_time(&m, li, &s, &w, &c, &o, 2, &tf32);
    o.tf32 = false;
    o.precision = PLAN_OPT_MIXED_FP32;
    plan_micro_time(&m, li, &s, &w, &c, &o, 2, &bf16);
    CHECK_MSG(fp32.fwd_s > tf32.fwd_s && tf32.fwd_s > bf16.fwd_s, "forward fp32 %.3g, tf32 %.3g, bf16 %.3g s",
              fp32.fwd_s, tf32.fwd_s, bf16.fwd_s);
    o.tf32 = true;
    CHECK(plan_tf32_check(&o, err) == UTIL_EINVAL && strstr(err, "precision bf16-mixed"));
    /* the Megatron target keeps its published pricing */
    o.precision = PLAN_OPT_FP32;
    o.target = PLAN_TARGET_MEGATRON;
    CHECK(plan_gemm_math(&o) == COST_MATH_BF16);
}
