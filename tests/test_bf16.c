/* bf16-mixed's kernels: rounding to bfloat16 (round to nearest, ties to
 * even) and the linears on bf16 operands with fp32 accumulation, on the CPU
 * backend and on the CUDA backend's source through the emulator
 * (tests/cudaemu_lt.h's cublasLtMatmul), against the fp32 linears on the same
 * operands rounded first. A product of two bf16 values (8-bit significands)
 * is exact in fp32 (24 bits), so the bf16 GEMM and the fp32 GEMM of the
 * rounded operands compute the same sums: the CPU backend widens and calls
 * the same sgemm, so it matches bit for bit (tolerance 0); the emulated
 * cuBLAS sums in another layout (column-major), so it is judged like every
 * emulated GEMM (1e-4 relative, tests/test_cuda_kernels.c). */
#include "test.h"
#include "executor/backend.h"
#include "executor/bf16.h"
#include "planner/planner.h"
#include "tests/kernel_data.h"
#include "util/util.h"

#include <float.h>

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, sizeof f); return f; }

TEST(bf16_rounds_to_nearest_even)
{
    /* exact values stay */
    CHECK(ex_bf16_from_f32(1.0f) == 0x3f80);
    CHECK(ex_bf16_from_f32(-2.0f) == 0xc000);
    CHECK(ex_bf16_from_f32(0.0f) == 0x0000);
    CHECK(ex_bf16_from_f32(-0.0f) == 0x8000);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1; 1 + 3 * 2^-8 to the even 1 + 2^-6 */
    CHECK(ex_bf16_from_f32(1.0f + 0x1p-8f) == 0x3f80);
    CHECK(ex_bf16_from_f32(1.0f + 3 * 0x1p-8f) == 0x3f82);
    /* just above halfway rounds up, just below down */
    CHECK(ex_bf16_from_f32(bits_f(0x3f808001u)) == 0x3f81);
    CHECK(ex_bf16_from_f32(bits_f(0x3f807fffu)) == 0x3f80);
    /* the largest finite float rounds to infinity (as __float2bfloat16_rn); infinities and NaN stay */
    CHECK(ex_bf16_from_f32(FLT_MAX) == 0x7f80);
    CHECK(ex_bf16_from_f32(INFINITY) == 0x7f80);
    CHECK(ex_bf16_from_f32(-INFINITY) == 0xff80);
    ex_bf16 nan = ex_bf16_from_f32(NAN);
    CHECK((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
    /* a NaN whose payload sits in the dropped bits stays a NaN (not infinity) */
    CHECK((ex_bf16_from_f32(bits_f(0x7f800001u)) & 0x7f) != 0);
    /* widening is exact, and the relative rounding error is at most u = 2^-8 (half an ulp of 8 significant bits) */
    double worst = 0;
    for (int i = 0; i < 100000; i++) {
        float x = ur() * 1e3f;
        if (x == 0) continue;
        worst = fmax(worst, fabs((double)ex_bf16_to_f32(ex_bf16_from_f32(x)) - x) / fabs(x));
    }
    CHECK_MSG(worst <= 0x1p-8, "worst relative rounding error %.3g > 2^-8", worst);
}

/* to_bf16 of a backend, element by element, against ex_bf16_from_f32. */
static void check_to_bf16(const ex_backend *be)
{
    size_t n = 1001;
    float *x = rnd(n, 100);
    x[0] = NAN; x[1] = INFINITY; x[2] = 1.0f + 0x1p-8f;
    uint16_t *b = malloc(n * sizeof *b);
    be->to_bf16(b, x, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += b[i] != ex_bf16_from_f32(x[i]);
    CHECK_MSG(bad == 0, "%s: %zu of %zu roundings differ", be->name, bad, n);
    /* and back: from_bf16 widens exactly */
    float *w = malloc(n * sizeof *w);
    be->from_bf16(w, b, n);
    bad = 0;
    for (size_t i = 2; i < n; i++) bad += w[i] != ex_bf16_to_f32(b[i]) || ex_bf16_from_f32(w[i]) != b[i];
    CHECK_MSG(bad == 0 && isnan(w[0]) && isinf(w[1]), "%s: %zu of %zu widenings differ", be->name, bad, n);
    free(x); free(b); free(w);
}

/* One linear case: the backend's bf16 entries against the CPU's fp32 linears on the rounded operands. */
static void bf16_linear_case(const ex_backend *be, int n, int in, int o, bool bias, double tol)
{
    const ex_backend *cpu = ex_backend_cpu();
    size_t ni = (size_t)n * in, nw = (size_t)o * in, nd = (size_t)n * o;
    float *inp = rnd(ni, 1), *w = rnd(nw, 0.5f), *b = rnd((size_t)o, 1), *dout = rnd(nd, 1);
    uint16_t *inp16 = malloc(ni * 2), *w16 = malloc(nw * 2), *dout16 = malloc(nd * 2);
    cpu->to_bf16(inp16, inp, ni);
    cpu->to_bf16(w16, w, nw);
    cpu->to_bf16(dout16, dout, nd);
    float *inp_r = malloc(ni * 4), *w_r = malloc(nw * 4), *dout_r = malloc(nd * 4);
    for (size_t i = 0; i < ni; i++) inp_r[i] = ex_bf16_to_f32(inp16[i]);
    for (size_t i = 0; i < nw; i++) w_r[i] = ex_bf16_to_f32(w16[i]);
    for (size_t i = 0; i < nd; i++) dout_r[i] = ex_bf16_to_f32(dout16[i]);
    float *out = rnd(nd, 9), *out_ref = rnd(nd, 9), *out_fp32 = rnd(nd, 9);
    float *dinp = rnd(ni, 1), *dw = rnd(nw, 1), *db = rnd((size_t)o, 1);
    float *dinp_ref = dup(dinp, ni), *dw_ref = dup(dw, nw), *db_ref = dup(db, (size_t)o);
    be->linear_forward_bf16(out, inp16, w16, bias ? b : NULL, n, in, o);
    be->linear_backward_bf16(dinp, dw, db, dout, dout16, inp16, w16, n, in, o);
    cpu->linear_forward(out_ref, inp_r, w_r, bias ? b : NULL, n, in, o);
    cpu->linear_forward(out_fp32, inp, w, bias ? b : NULL, n, in, o);
    /* the bias gradient sums the fp32 dout; the GEMMs read its bf16 copy */
    cpu->linear_backward(dinp_ref, dw_ref, NULL, dout_r, inp_r, w_r, n, in, o);
    cpu->linear_backward(NULL, NULL, db_ref, dout, inp, w, n, in, o);
    char err[UTIL_ERR_LEN] = "";
    CHECK_MSG(be->sync(err) == 0, "%s: sync: %s", be->name, err);
    char what[96];
    snprintf(what, sizeof what, "%s bf16 linear_forward %dx%d->%d", be->name, n, in, o);
    double e = max_rel_err(out, out_ref, nd);
    CHECK_MSG(e <= tol, "%s: max rel err %.3g > %g", what, e, tol);
    e = max_rel_err(dinp, dinp_ref, ni);
    CHECK_MSG(e <= tol, "%s dinp: max rel err %.3g > %g", what, e, tol);
    e = max_rel_err(dw, dw_ref, nw);
    CHECK_MSG(e <= tol, "%s dw: max rel err %.3g > %g", what, e, tol);
    e = max_rel_err(db, db_ref, (size_t)o);
    CHECK_MSG(e <= tol, "%s db: max rel err %.3g > %g", what, e, tol);
    /* and it is not the fp32 GEMM: the rounding shows (in > 4: sums of several rounded products) */
    if (in > 4) CHECK_MSG(max_rel_err(out, out_fp32, nd) > 1e-5, "%s: no bf16 rounding seen", what);
    free(inp); free(w); free(b); free(dout); free(inp16); free(w16); free(dout16); free(inp_r); free(w_r); free(dout_r);
    free(out); free(out_ref); free(out_fp32); free(dinp); free(dw); free(db); free(dinp_ref); free(dw_ref); free(db_ref);
}

TEST(bf16_cpu_kernels_match_fp32_on_rounded_operands)
{
    const ex_backend *cpu = ex_backend_cpu();
    check_to_bf16(cpu);
    bf16_linear_case(cpu, 37, 29, 23, true, 0);
    bf16_linear_case(cpu, 19, 50, 600, false, 0);
    bf16_linear_case(cpu, 5, 3, 7, true, 0);
}

TEST(bf16_cuda_emu_kernels_match_fp32_on_rounded_operands)
{
    char err[UTIL_ERR_LEN] = "";
    const ex_backend *be = ex_backend_cuda_emu(err);
    CHECK_MSG(be != NULL, "%s", err);
    if (!be) return;
    check_to_bf16(be);
    bf16_linear_case(be, 37, 29, 23, true, 1e-4);
    bf16_linear_case(be, 37, 29, 45, false, 1e-4);
    bf16_linear_case(be, 19, 50, 600, true, 1e-4);   /* more column blocks than the emulator's grid cap */
    bf16_linear_case(be, 5, 3, 7, true, 1e-4);
}

/* The activation collectives' wire (planner/precision.c): bf16 where dhp run
 * runs bf16 linears, fp32 under fp32, the precision's activations under the
 * Megatron target. A bf16 sum's step (executor/bf16.h) rounds each partial
 * sum: 1 + 1.5 * 2^-8 is 1 + 2^-7, plus 1.5 * 2^-8 again 1 + 2^-6; and 2^-8
 * added to 1 twice stays 1 (each partial sum ties to the even 1), where
 * summing in fp32 and rounding once would give 1 + 2^-7. */
TEST(bf16_wire_rule_and_sum)
{
    plan_options o = { .target = PLAN_TARGET_DHP, .precision = PLAN_OPT_MIXED_FP32 };
    CHECK(plan_act_wire_bf16(&o) && plan_act_wire_bytes(&o) == 2);
    o.precision = PLAN_OPT_AUTOCAST;
    CHECK(plan_act_wire_bf16(&o) && plan_act_wire_bytes(&o) == 2);
    o.precision = PLAN_OPT_FP32;
    CHECK(!plan_act_wire_bf16(&o) && plan_act_wire_bytes(&o) == 4);
    o.target = PLAN_TARGET_MEGATRON;
    CHECK(!plan_act_wire_bf16(&o) && plan_act_wire_bytes(&o) == 4);
    o.precision = PLAN_OPT_MIXED_FP32;
    CHECK(!plan_act_wire_bf16(&o) && plan_act_wire_bytes(&o) == 2);

    ex_bf16 acc[2] = { ex_bf16_from_f32(1.0f), ex_bf16_from_f32(1.0f) };
    ex_bf16 add[2] = { ex_bf16_from_f32(1.5f * 0x1p-8f), ex_bf16_from_f32(0x1p-8f) };
    ex_bf16_sum_into(add, acc, 2);
    CHECK(ex_bf16_to_f32(acc[0]) == 1.0f + 0x1p-7f);
    CHECK(ex_bf16_to_f32(acc[1]) == 1.0f);
    ex_bf16_sum_into(add, acc, 2);
    CHECK(ex_bf16_to_f32(acc[0]) == 1.0f + 0x1p-6f);
    CHECK(ex_bf16_to_f32(acc[1]) == 1.0f);   /* fp32 accumulation would give 1 + 2^-7 */
}
