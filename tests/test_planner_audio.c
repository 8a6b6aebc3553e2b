/* The planner with audio encoders: tiny-audio and tiny-omni plan on the CPU
 * cluster, the strategy check keeps a rank's frames in whole pool groups,
 * LayerNorm is priced at its own rate (falling back to RMSNorm's where a
 * costdb predates it), and the audio stem's GEMMs are the executor's. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner.h"

#include <stdlib.h>

static plan_workload audio_work(int frames)
{
    return (plan_workload){ .global_batch = 8, .images_per_sample = 1, .image_tokens = 64, .audio_frames = frames,
                            .text_tokens = 48 };
}

/* A zoo model on 8xh100 under the fp32 executor's target, a step of
 * audio_work(32); its audio module. */
static int fp32_case(const char *name, model_t *m, cost_cluster *c, plan_workload *w, plan_options *o)
{
    char err[UTIL_ERR_LEN];
    if (model_load(name, m, err) || cost_cluster_load("8xh100", c, err)) return -1;
    *w = audio_work(32);
    *o = test_dhp_fp32();
    return model_find_kind(m, MODEL_AUDIO);
}

/* Both tiny models plan on cpu-4 under the executor's fp32 target; the omni
 * plan has a group for each of its three modules and validates. */
TEST(planner_plans_tiny_audio_and_tiny_omni_on_cpu_4)
{
    const char *names[] = { "tiny-audio", "tiny-omni" };
    char err[UTIL_ERR_LEN];
    cost_cluster c;
    CHECK_OK(cost_cluster_load("cpu-4", &c, err));
    for (int i = 0; i < 2; i++) {
        model_t m;
        CHECK_OK(model_load(names[i], &m, err));
        plan_workload w = audio_work(32);
        if (model_find_kind(&m, MODEL_VISION) < 0) w.images_per_sample = w.image_tokens = 0;
        plan_search_options so;
        plan_search_options_default(&so);
        so.opt.precision = PLAN_OPT_FP32;
        so.opt.target = PLAN_TARGET_DHP;
        so.top_k = 2;
        plan_search_result *r = malloc(sizeof *r);
        int rc = plan_search(&m, &c, &w, &so, r, err);
        bool ok = !rc && r->n_plans >= 1 && r->plans[0].pred.fits && r->plans[0].n_modules == m.n_modules;
        int vrc = ok ? plan_validate(&r->plans[0], err) : -1;
        int ai = model_find_kind(&m, MODEL_AUDIO);
        double mem = ok ? r->plans[0].pred.peak_mem_bytes[ai] : 0;
        free(r);
        CHECK_MSG(rc == 0, "%s: %s", names[i], err);
        CHECK_MSG(ok, "%s: no plan that fits", names[i]);
        CHECK_MSG(vrc == 0, "%s: %s", names[i], err);
        CHECK(mem > 0);
    }
}

/* Ulysses splits the audio frames; each rank pools its own, so its share is
 * whole pool groups; the workload's frames are whole groups too. */
TEST(planner_audio_sp_keeps_whole_pool_groups)
{
    char err[UTIL_ERR_LEN];
    model_t m;
    cost_cluster c;
    CHECK_OK(model_load("tiny-audio", &m, err));
    CHECK_OK(cost_cluster_load("cpu-4", &c, err));
    int ai = model_find_kind(&m, MODEL_AUDIO);
    plan_module s = { .dp = 1, .tp = 1, .sp = 2, .pp = 1, .micro_batch = 1, .n_ranks = 2 };
    plan_workload w = audio_work(6);
    w.images_per_sample = w.image_tokens = 0;
    int split = plan_strategy_check(&m, ai, &s, &w, &c, err);
    bool named = strstr(err, "pool") != NULL && !strchr(err, '\n');
    w.audio_frames = 8;
    int whole = plan_strategy_check(&m, ai, &s, &w, &c, err);
    w.audio_frames = 31;
    int odd = plan_workload_validate(&m, &w, err);
    bool field = strstr(err, "workload.audio_frames") != NULL;
    CHECK_EQ_INT(split, UTIL_EINVAL);
    CHECK(named);
    CHECK_OK(whole);
    CHECK_EQ_INT(odd, UTIL_EINVAL);
    CHECK(field);
}

/* A clip longer than the learned positions' rows cannot run (tiny-audio:
 * 64); sinusoids (tiny-omni) have no such bound; the default workload is
 * the positions' rows, else Whisper's 1500. */
TEST(planner_audio_frames_fit_the_learned_positions)
{
    char err[UTIL_ERR_LEN];
    model_t m, omni;
    CHECK_OK(model_load("tiny-audio", &m, err));
    CHECK_OK(model_load("tiny-omni", &omni, err));
    plan_workload w = audio_work(66);
    w.images_per_sample = w.image_tokens = 0;
    int over = plan_workload_validate(&m, &w, err);
    bool named = strstr(err, "workload.audio_frames: 66") && strstr(err, "max_positions 64") && !strchr(err, '\n');
    w.audio_frames = 64;
    int fits = plan_workload_validate(&m, &w, err);
    plan_workload wo = audio_work(66);
    CHECK_EQ_INT(over, UTIL_EINVAL);
    CHECK(named);
    CHECK_OK(fits);
    CHECK_OK(plan_workload_validate(&omni, &wo, err));
    CHECK_EQ_INT(plan_audio_default_frames(&m.mod[model_find_kind(&m, MODEL_AUDIO)]), 64);
    CHECK_EQ_INT(plan_audio_default_frames(&omni.mod[model_find_kind(&omni, MODEL_AUDIO)]), 1500);
}

/* LayerNorm is its own kernel: slowing it alone in the table adds its bytes
 * x (1/new - 1/old) per call: two per block and the final norm over the
 * pooled rows, forward; the RMSNorm LLM does not move. */
TEST(cost_prices_layernorm_at_its_own_rate)
{
    model_t m; cost_cluster c; plan_workload w; plan_options o;
    int ai = fp32_case("tiny-omni", &m, &c, &w, &o);
    CHECK(ai >= 0);
    plan_module s = { .dp = 1, .tp = 1, .sp = 1, .pp = 1, .micro_batch = 4, .n_ranks = 1 };
    const model_module *am = &m.mod[ai];
    cost_gpu *g = &c.pool[0].gpu;
    double old_rate = g->hbm_bw * g->mem_eff, samples = 4, t = samples * 32, M = t / am->pool;
    plan_time a0, a1, l0, l1;
    plan_micro_time(&m, ai, &s, &w, &c, &o, samples, &a0);
    plan_micro_time(&m, m.llm, &s, &w, &c, &o, samples, &l0);
    g->ew.n = 1;
    g->ew.elements[0] = 1e6;
    g->ew.bw[COST_EW_LAYERNORM][0] = 1e9;
    plan_micro_time(&m, ai, &s, &w, &c, &o, samples, &a1);
    plan_micro_time(&m, m.llm, &s, &w, &c, &o, samples, &l1);
    double bytes = (2.0 * am->layers * t + M) * am->hidden * 2 * 4.0;   /* read x, write out; fp32 */
    CHECK_NEAR(a1.fwd_s - a0.fwd_s, bytes * (1 / 1e9 - 1 / old_rate), 1e-12);
    CHECK_NEAR(a1.bwd_s, a0.bwd_s, 1e-12);
    CHECK_NEAR(l1.fwd_s, l0.fwd_s, 1e-15);
}

/* A table written before LayerNorm was measured prices it at RMSNorm's rate
 * (the same nominal bytes); one with its own rate uses that. */
TEST(costdb_layernorm_falls_back_to_the_rmsnorm_rate)
{
    cost_gpu g = { .hbm_bw = 1e11, .mem_eff = 0.5, .kernel_launch_s = 1e-6 };
    double none = cost_elementwise_time(&g, COST_EW_LAYERNORM, 1e5, 4);
    CHECK_NEAR(none, 1e5 * 2 * 4 / (1e11 * 0.5) + 1e-6, 1e-12);
    g.ew.n = 1;
    g.ew.elements[0] = 1e5;
    g.ew.bw[COST_EW_RMSNORM][0] = 2e9;
    g.ew.bw[COST_EW_RMSNORM_BWD][0] = 3e9;
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_LAYERNORM, 1e5, 4), cost_elementwise_time(&g, COST_EW_RMSNORM, 1e5, 4), 1e-15);
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_LAYERNORM_BWD, 1e5, 4),
               cost_elementwise_time(&g, COST_EW_RMSNORM_BWD, 1e5, 4), 1e-15);
    g.ew.bw[COST_EW_LAYERNORM][0] = 1e9;
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_LAYERNORM, 1e5, 4), 1e5 * 2 * 4 / 1e9 + 1e-6, 1e-12);
    CHECK(!strcmp(cost_ew_name(COST_EW_LAYERNORM_BWD), "layernorm_bwd"));
}

/* The audio stem's GEMMs as the executor runs them: conv1 over 2 t rows of
 * C k inputs, conv2 over t rows of d k; so the stem's share of the forward
 * grows with the mel bins (conv1's input) and nothing else does. */
TEST(cost_prices_the_audio_conv_stem)
{
    model_t m; cost_cluster c; plan_workload w; plan_options o;
    int ai = fp32_case("tiny-audio", &m, &c, &w, &o);
    CHECK(ai >= 0);
    w.images_per_sample = w.image_tokens = 0;
    plan_module s = { .dp = 1, .tp = 1, .sp = 1, .pp = 1, .micro_batch = 2, .n_ranks = 1 };
    plan_time a, b;
    plan_micro_time(&m, ai, &s, &w, &c, &o, 2, &a);
    m.mod[ai].in_channels *= 4;
    plan_micro_time(&m, ai, &s, &w, &c, &o, 2, &b);
    const cost_gpu *g = &c.pool[0].gpu;
    double t = 2 * 32, R1 = 2 * t, h = m.mod[ai].hidden, k = m.mod[ai].patch, C = m.mod[ai].in_channels;
    cost_gemm_math math = plan_gemm_math(&o);   /* fp32 on the dhp target: the GPU's fp32 peak */
    double gemm = cost_gemm_time_in(g, math, R1, h, C * k) - cost_gemm_time_in(g, math, R1, h, C / 4 * k);
    double im2col = cost_elementwise_time(g, COST_EW_COPY, R1 * C * k, 4) - cost_elementwise_time(g, COST_EW_COPY, R1 * C / 4 * k, 4);
    CHECK_NEAR(b.fwd_s - a.fwd_s, gemm + im2col, 1e-9);
}
