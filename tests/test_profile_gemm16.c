/* dhp profile's bf16 GEMMs (linear_forward_bf16, what bf16-mixed and
 * -autocast run): the device profile's times become the GPU file's
 * "gemm_bf16", which loads back and prices the dhp target's bf16 GEMMs, and
 * nothing else; a file without it prices as before. */
#include "test.h"
#include "tests/test_fixture.h"
#include "tests/test_profile.h"
#include "costdb/costdb.h"
#include "planner/planner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define G16_LAUNCH 3e-6

/* A CUDA profile of a full 2 x 2 x 2 GEMM grid, fp32 at 20 TFLOP/s x
 * shape factors; bf16 (bf16_scale > 0) the same shapes at 300 TFLOP/s x
 * other factors, their time less the launch x bf16_scale. */
static void fake_grid_profile(cost_profile *p, double bf16_scale)
{
    test_profile_fake_cuda(p, 2e13, 64);   /* the device, attention, memory and collectives; launch 3 us */
    p->n_gemm = 0;
    static const int ms[] = {1024, 4096}, nks[] = {1024, 8192};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            for (int l = 0; l < 2; l++) {
                double m = ms[i], n = nks[j], k = nks[l], f = 2 * m * n * k;
                double s = f / (2e13 * (m / (m + 64)) * (n / (n + 64)) * (k / (k + 64))) + G16_LAUNCH;
                p->gemm_bf16_s[p->n_gemm] = bf16_scale * f / (3e14 * (m / (m + 900)) * (n / (n + 300)) * (k / (k + 500))) + G16_LAUNCH;
                p->gemm[p->n_gemm++] = (cost_profile_gemm){(int)m, (int)n, (int)k, s, f / s};
            }
    p->gemm_bf16 = bf16_scale > 0;
}

/* The GPU a fake_grid_profile(bf16_scale) derives: 0, or the derivation's error code with err. */
static int derived_gpu(double bf16_scale, cost_gpu *out, char *err)
{
    cost_profile *p = malloc(sizeof *p);
    if (!p) return util_fail(err, UTIL_ENOMEM, "no memory for a profile");
    fake_grid_profile(p, bf16_scale);
    int rc = cost_prof_derive(p, err);
    *out = p->gpu;
    free(p);
    return rc;
}

static bool same_terms(const cost_gemm_terms *a, const cost_gemm_terms *b)
{
    const cost_gemm_grid *x = &a->grid, *y = &b->grid;
    if (a->measured != b->measured || fabs(a->peak_flops - b->peak_flops) > 1e-14 * a->peak_flops || x->n_m != y->n_m
        || x->n_n != y->n_n || x->n_k != y->n_k) return false;
    for (int i = 0; i < x->n_m * x->n_n * x->n_k; i++)
        if (fabs(x->eff[i] - y->eff[i]) > 1e-14) return false;
    return true;
}

static void drop_peak(cJSON *a) { cJSON_DeleteItemFromObjectCaseSensitive(a, "peak_flops"); }
static void zero_peak(cJSON *a) { cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(a, "peak_flops"), 0); }
static void eff_above_one(cJSON *a) { cJSON_SetNumberValue(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(a, "eff"), 2), 1.5); }

/* A device profile with bf16 GEMM times: the file's gemm_bf16 (sourced,
 * its peak the rounded one of the best bf16 rate, each shape's bf16 time and
 * its price under measurements) gives every
 * measured time back as its price, loads back from the GPU and cluster
 * files and the plain form; the loader refuses one without a peak, a zero
 * peak or an efficiency above 1; a profile without bf16 times writes none. */
TEST(profile_gemm_bf16_round_trips_through_the_files)
{
    cost_profile *p = malloc(sizeof *p);
    CHECK(p);
    fake_grid_profile(p, 1);
    char err[UTIL_ERR_LEN] = "", e1[UTIL_ERR_LEN] = "", e2[UTIL_ERR_LEN] = "", e3[UTIL_ERR_LEN] = "";
    int rc = cost_prof_derive(p, err);
    cJSON *gj, *cj;
    char *gt, *ct;
    test_profile_files(p, rc == 0, &gj, &cj, &gt, &ct);
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(gj, "gemm_bf16"), "source");
    bool sourced = cJSON_IsString(src) && !strncmp(src->valuestring, "measured by dhp profile on testhost 2025-01-01T00:00:00Z, ", 58)
        && strstr(src->valuestring, "linear_forward_bf16");
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(
        gj, "measurements"), "gemm"), "shapes");
    int given_back = 0;
    for (int i = 0; i < cJSON_GetArraySize(rows); i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "bf16_seconds"), *m = cJSON_GetObjectItemCaseSensitive(r, "bf16_model_seconds");
        given_back += cJSON_IsNumber(t) && t->valuedouble == p->gemm_bf16_s[i] && cJSON_IsNumber(m)
                      && fabs(m->valuedouble - t->valuedouble) <= 1e-12 * t->valuedouble;
    }
    cost_gpu g, plain;
    cost_cluster c;
    int rl = test_profile_read_back(gt, ct, &g, &c, &plain, err);
    int r1 = gt ? test_profile_parse_edited(gt, "gemm_bf16", drop_peak, e1) : -1, r2 = gt ? test_profile_parse_edited(gt, "gemm_bf16", zero_peak, e2) : -1;
    int r3 = gt ? test_profile_parse_edited(gt, "gemm_bf16", eff_above_one, e3) : -1;
    test_profile_files_free(gj, cj, gt, ct);
    cost_profile want = *p;
    fake_grid_profile(p, 0);   /* no bf16 times (the CPU backend's profile): nothing written */
    int r0 = cost_prof_derive(p, err);
    cJSON *none = r0 ? NULL : cost_profile_gpu_json(p, true);
    char *nt = none ? cJSON_Print(none) : NULL;
    bool silent = nt && !strstr(nt, "gemm_bf16") && !strstr(nt, "bf16_seconds");
    cJSON_free(nt);
    cJSON_Delete(none);
    free(p);
    CHECK_MSG(rc == 0 && rl == 0 && r0 == 0, "%s", err);
    const cost_gemm_terms *t = &want.gpu.gemm_bf16;
    CHECK(t->measured && t->grid.n_m == 2 && t->grid.n_n == 2 && t->grid.n_k == 2);
    double best = 0;
    for (int i = 0; i < want.n_gemm; i++) {
        const cost_profile_gemm *s = &want.gemm[i];
        best = fmax(best, 2.0 * s->m * s->n * s->k / (want.gemm_bf16_s[i] - G16_LAUNCH));
    }
    /* the tensor cores' peak by the fp32 peak's rule: FLOP/cycle per SM rounded up to a power of two */
    double per_sm_cycle = want.dev.clock_hz * want.dev.sms;
    CHECK_NEAR(want.gemm_bf16_best, best, 1e-12);
    CHECK_NEAR(t->peak_flops, pow(2, ceil(log2(best / per_sm_cycle))) * per_sm_cycle, 1e-12);
    CHECK(t->peak_flops >= best && t->peak_flops < 2 * best);
    CHECK(sourced);
    CHECK_EQ_INT(given_back, want.n_gemm);
    CHECK(same_terms(&g.gemm_bf16, t) && same_terms(&c.pool[0].gpu.gemm_bf16, t) && same_terms(&plain.gemm_bf16, t));
    CHECK(silent);
    CHECK_MSG(r1 == UTIL_EINVAL && strstr(e1, "gemm_bf16.peak_flops"), "%s", e1);
    CHECK_MSG(r2 == UTIL_EINVAL && strstr(e2, "gemm_bf16.peak_flops: must be > 0"), "%s", e2);
    CHECK_MSG(r3 == UTIL_EINVAL && strstr(e3, "gemm_bf16.eff[2]"), "%s", e3);
}

/* The dhp target's bf16-mixed and -autocast GEMMs are priced from
 * gemm_bf16: twice the measured times (less the launch) double each bf16
 * GEMM's price, in the grid and outside it, and slow those plans; fp32 plans
 * and the Megatron target's do not move. Without gemm_bf16 a bf16 GEMM is
 * priced exactly as before, at peak_flops. */
TEST(profile_gemm_bf16_prices_the_bf16_precisions)
{
    char err[UTIL_ERR_LEN] = "";
    cost_gpu g1, g2;
    int rc = derived_gpu(1, &g1, err);
    if (!rc) rc = derived_gpu(2, &g2, err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) return;
    cost_gpu g0 = g1;
    g0.gemm_bf16.measured = false;
    static const double shapes[][3] = {{1024, 1024, 1024}, {4096, 8192, 1024}, {2048, 3000, 5000}, {512, 100, 20000}};
    for (int i = 0; i < 4; i++) {
        double m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
        CHECK_NEAR(cost_gemm_time_in(&g2, COST_MATH_BF16_DHP, m, n, k) - G16_LAUNCH,
                   2 * (cost_gemm_time_in(&g1, COST_MATH_BF16_DHP, m, n, k) - G16_LAUNCH), 1e-9);
        CHECK(cost_gemm_time_in(&g0, COST_MATH_BF16_DHP, m, n, k) == cost_gemm_time_in(&g0, COST_MATH_BF16, m, n, k));
        CHECK(cost_gemm_time_in(&g1, COST_MATH_BF16, m, n, k) == cost_gemm_time_in(&g0, COST_MATH_BF16, m, n, k));
    }
    const plan_precision bf16[] = {PLAN_OPT_MIXED_FP32, PLAN_OPT_AUTOCAST};
    for (int i = 0; i < 2; i++) {
        plan_time t0, t1, t2;
        CHECK_OK(test_profile_llm_micro(&g0, bf16[i], PLAN_TARGET_DHP, &t0, err));
        CHECK_OK(test_profile_llm_micro(&g1, bf16[i], PLAN_TARGET_DHP, &t1, err));
        CHECK_OK(test_profile_llm_micro(&g2, bf16[i], PLAN_TARGET_DHP, &t2, err));
        CHECK_MSG(t2.fwd_s > t1.fwd_s && t2.bwd_s > t1.bwd_s && t1.fwd_s != t0.fwd_s, "fwd %g %g %g", t0.fwd_s, t1.fwd_s, t2.fwd_s);
    }
    plan_time f1, f2, m1, m2;
    CHECK_OK(test_profile_llm_micro(&g1, PLAN_OPT_FP32, PLAN_TARGET_DHP, &f1, err));
    CHECK_OK(test_profile_llm_micro(&g2, PLAN_OPT_FP32, PLAN_TARGET_DHP, &f2, err));
    CHECK(f1.fwd_s == f2.fwd_s && f1.bwd_s == f2.bwd_s);
    CHECK_OK(test_profile_llm_micro(&g1, PLAN_OPT_MIXED_FP32, PLAN_TARGET_MEGATRON, &m1, err));
    CHECK_OK(test_profile_llm_micro(&g0, PLAN_OPT_MIXED_FP32, PLAN_TARGET_MEGATRON, &m2, err));
    CHECK(m1.fwd_s == m2.fwd_s && m1.bwd_s == m2.bwd_s);
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    o.precision = PLAN_OPT_AUTOCAST;
    CHECK(plan_gemm_math(&o) == COST_MATH_BF16_DHP);
}

/* A plan's MFU is quoted against the GPU's dense BF16 peak whatever the
 * precision: on a profiled GPU that timed the bf16 GEMMs, gemm_bf16's peak,
 * not the fp32 peak peak_flops holds there (against that, this bf16-mixed
 * plan's MFU read 147%); elsewhere peak_flops. */
TEST(profile_mfu_is_quoted_against_the_bf16_peak)
{
    char err[UTIL_ERR_LEN] = "";
    cost_gpu g;
    int rc = derived_gpu(1, &g, err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc) return;
    cost_gpu none = g;
    none.gemm_bf16.measured = false;
    CHECK(g.gemm_bf16.peak_flops > 5 * g.peak_flops);   /* the fake device: ~300 TFLOP/s bf16, 20 fp32 */
    CHECK(cost_gpu_mfu_peak(&g) == g.gemm_bf16.peak_flops);
    CHECK(cost_gpu_mfu_peak(&none) == none.peak_flops);
    /* a bf16-mixed plan of an LLM on it: MFU = its model FLOPs / (step x that peak) */
    model_t m = test_llm("llm-mfu", "\"layers\": 4, \"hidden\": 1024, \"heads\": 16, \"kv_heads\": 16, \"ffn\": 4096, "
                         "\"ffn_kind\": \"swiglu\", \"norm\": \"rmsnorm\", \"vocab\": 1024");
    cost_cluster c = test_cluster_load("8xh100");
    c.pool[0].gpu = g;
    plan_workload w = { .global_batch = 8, .text_tokens = 1024 };
    static plan_t plan;
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    o.precision = PLAN_OPT_MIXED_FP32;
    rc = plan_from_strategy_opts("llm:dp=1", &m, &c, &w, PLAN_COLOCATED, 1, 1, &o, &plan, err);
    CHECK_MSG(!rc, "%s", err);
    if (rc) return;
    plan_eval ev;
    CHECK_OK(plan_evaluate(&plan, &o, &ev, err));
    double flops = ev.time[0].model_flops, step = plan.pred.step_time_s;
    CHECK_MSG(flops > 0 && fabs(plan.pred.mfu - flops / (step * g.gemm_bf16.peak_flops)) <= 1e-12 * plan.pred.mfu,
              "mfu %g, flops %g, step %g", plan.pred.mfu, flops, step);
    CHECK(plan.pred.mfu < 1);
    CHECK(plan.pred.model_flops == flops);   /* the numerator the plan file carries (prediction.model_flops) */
}
