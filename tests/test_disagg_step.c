/* The disaggregated step as the schedule runs it: the encoder-LLM loop
 * (plan_encoder_loops, _even, plan_llm_chunk_loops) and plan_evaluate's
 * chunk-by-chunk step beside the simulated schedule. The LLM runs one 1F1B
 * over all chunks (its pipeline fills and drains once) and a training
 * encoder's next forward waits for a gradient that can wait for the
 * encoder's own latest chunk; pricing a fill per chunk, no loop and whole
 * micro-batches was 6 to 11% off the simulation on the plans below. */
#include "tests/test.h"
#include "planner/planner.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>

/* `spec` of zoo `model` on 8xh100, disaggregated over n_micro chunks: its
 * analytic step in *analytic, then simulated into p. */
static int simulated(const char *model, plan_workload w, const char *spec, int n_micro, plan_t *p, double *analytic)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;   /* what dhp run allocates and issues, as `dhp plan` prices it */
    int rc = model_load(model, &m, err);
    if (!rc) rc = cost_cluster_load("8xh100", &c, err);
    if (!rc) rc = plan_from_strategy_opts(spec, &m, &c, &w, PLAN_DISAGGREGATED, 8, n_micro, &o, p, err);
    if (!rc) *analytic = p->pred.step_time_s;
    if (!rc) rc = plan_sim_predict(p, err);
    if (rc) fprintf(stderr, "%s %s: %s\n", model, spec, err);
    return rc;
}

/* In 1F1B the LLM's first stage forwards pp - 1 (interleaved: 2 (pp - 1) +
 * (vp - 1) pp units) ahead of its first backward: chunk c's gradient
 * leaves after forwards of the chunks after it. */
TEST(disagg_loop_counts_the_chunks_a_gradient_waits_for)
{
    char err[UTIL_ERR_LEN];
    plan_encoder_loop l;
    const struct { int pp, vp, n, m, window, reach; } cases[] = {
        { 3, 1, 4, 2, 2, 2 },    /* c's last backward follows forwards 2c+2, 2c+3, both of chunk c+1 */
        { 3, 1, 8, 1, 3, 1 },    /* c's backward follows forward c+2: 3 chunks in flight, one unit of the last */
        { 2, 2, 16, 1, 4, 2 },   /* 4 units ahead over groups of pp micro-batches per model chunk */
        { 1, 1, 4, 2, 2, 0 },    /* no pipeline: it waits for nothing later; still 2 in flight to overlap */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(plan_encoder_loop_even(cases[i].pp, cases[i].vp, cases[i].n, cases[i].m, &l, err));
        CHECK_MSG(l.window == cases[i].window && l.reach == cases[i].reach, "pp %d vp %d, %d chunks of %d: %d %d",
                  cases[i].pp, cases[i].vp, cases[i].n, cases[i].m, l.window, l.reach);
    }
    /* the plan's own chunks give the same loop, and the schedule forwards `window` chunks first */
    static plan_t p;
    double analytic;
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 1024, .text_tokens = 256 };
    CHECK_OK(simulated("qwen2.5-vl-7b", w, "vision:gpus=2,dp=1,tp=2;llm:gpus=6,tp=2,pp=3,mb=1", 8, &p, &analytic));
    plan_encoder_loop loops[MODEL_MAX_MODULES];
    CHECK_OK(plan_encoder_loops(&p, loops, err));
    CHECK_EQ_INT(loops[0].window, 3);
    CHECK_EQ_INT(loops[0].reach, 1);
    CHECK_EQ_INT(loops[p.model.llm].window, 1);
    plan_schedule s;
    CHECK_OK(plan_schedule_rank(&p, 6, &s, err));
    int forwards = 0;
    for (int i = 0; i < s.n && s.op[i].kind != PLAN_OP_BACKWARD; i++) forwards += s.op[i].kind == PLAN_OP_FORWARD;
    CHECK_EQ_INT(forwards, 3);
    CHECK_EQ_INT(s.slots[0], 3);
    plan_schedule_free(&s);
}

/* The loop by brute force: every backward unit of the first stage in 1F1B
 * order (Megatron-Core's table: groups of pp micro-batches through model
 * chunk 0, then 1, ...; backwards with the chunks reversed), the forward
 * units swept up to warm-up w ahead of it. */
static void table(int pp, int vp, int u, bool forward, int *mi, int *v)
{
    int group = u / (pp * vp), r = u % (pp * vp);
    *v = forward ? r / pp : vp - 1 - r / pp;
    *mi = group * pp + r % pp;
}

static plan_encoder_loop swept(int pp, int vp, int n_chunks, int m)
{
    int N = n_chunks * m, U = N * vp, w = vp > 1 ? 2 * (pp - 1) + (vp - 1) * pp : pp - 1, need = 0, reach = 0;
    if (w > U) w = U;
    for (int j = 0; j < U; j++) {
        int mi, v, ahead = j + w < U ? j + w : U - 1, most = -1, first = 0;
        table(pp, vp, j, false, &mi, &v);
        if (v != 0 || mi >= N || (mi + 1) % m != 0) continue;   /* a chunk's last backward into chunk 0 */
        for (int a = 0; a <= ahead; a++) {
            int ami, av;
            table(pp, vp, a, true, &ami, &av);
            if (av != 0 || ami >= N || ami <= most) continue;
            if (most < 0 || ami / m != most / m) first = a;
            most = ami;
        }
        int nd = most / m - mi / m + 1, r = ahead - first + 1;
        if (nd > need) { need = nd; reach = 0; }
        if (nd == need && r > reach) reach = r;
    }
    plan_encoder_loop l = { need > 2 ? need : 2, need >= 2 ? reach : 0 };
    if (l.window >= n_chunks) { l.window = n_chunks; if (need > n_chunks) l.reach = 0; }
    return l;
}

/* The closed form the planner uses equals the sweep, pipelines of 1 to 8
 * stages, 1 to 3 model chunks each, 1 to 9 micro-batches a chunk (whole
 * groups of pp where interleaved, as the schedule requires). */
TEST(disagg_loop_closed_form_equals_the_sweep)
{
    char err[UTIL_ERR_LEN];
    int checked = 0;
    for (int pp = 1; pp <= 8; pp++)
        for (int vp = 1; vp <= (pp > 1 ? 3 : 1); vp++)
            for (int n = 2; n <= 12; n += 5)
                for (int m = 1; m <= 9; m++) {
                    if (vp > 1 && (n * m) % pp) continue;
                    plan_encoder_loop got, want = swept(pp, vp, n, m);
                    CHECK_OK(plan_encoder_loop_even(pp, vp, n, m, &got, err));
                    CHECK_MSG(got.window == want.window && got.reach == want.reach,
                              "pp %d vp %d %d chunks of %d: window %d reach %d, swept %d %d", pp, vp, n, m,
                              got.window, got.reach, want.window, want.reach);
                    checked++;
                }
    CHECK(checked > 300);
}

/* plan_evaluate's step within 3% of the simulated schedule where the loop
 * paces the encoder (window 2 and 3), where the LLM paces (its fill once),
 * with two encoders beside an interleaved LLM, and where a replica's last
 * micro-batch is short (plan_short_micro_saving). */
TEST(disagg_step_tracks_the_simulated_schedule)
{
    static plan_t p;
    double analytic;
    plan_workload big = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 16384, .text_tokens = 512 };
    plan_workload small = { .global_batch = 32, .images_per_sample = 1, .image_tokens = 1024, .text_tokens = 256 };
    plan_workload omni = { .global_batch = 16, .images_per_sample = 1, .image_tokens = 16384, .text_tokens = 512 };
    plan_workload llava = { .global_batch = 256, .images_per_sample = 1, .image_tokens = 576, .text_tokens = 512 };
    const struct { const char *model; plan_workload w; const char *spec; int n; } cases[] = {
        { "qwen2.5-vl-7b", big, "vision:gpus=2;llm:gpus=6,tp=2,pp=3,mb=1", 4 },
        { "qwen2.5-vl-7b", big, "vision:gpus=2,dp=1,tp=2;llm:gpus=6,tp=2,pp=3,mb=1", 8 },
        { "qwen2.5-vl-7b", small, "vision:gpus=2;llm:gpus=6,tp=2,pp=3,mb=1", 8 },
        { "qwen2.5-omni-7b", omni, "vision:gpus=2,sp=2;audio:gpus=1;llm:gpus=4,tp=2,pp=2,vp=2,mb=1", 16 },
        /* 256 samples over 7 replicas: 37 on the busiest, its last micro-batch 5 of 8 (priced whole: +7%) */
        { "llava-1.5-7b", llava, "vision:gpus=1,mb=256;llm:gpus=7,dp=7,zero=3,mb=8", 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(simulated(cases[i].model, cases[i].w, cases[i].spec, cases[i].n, &p, &analytic));
        double err = analytic / p.pred.step_time_s - 1;
        CHECK_MSG(fabs(err) < 0.03, "%s %s n %d: analytic %.4f s, simulated %.4f s (%+.1f%%)", cases[i].model,
                  cases[i].spec, cases[i].n, analytic, p.pred.step_time_s, 100 * err);
    }
}

/* A training encoder holds its window's chunks: the memory model keeps as
 * many activation slots as the schedule fills (3 here, not 2). */
TEST(disagg_encoder_memory_holds_its_window)
{
    static plan_t p;
    static plan_eval ev;
    double analytic;
    char err[UTIL_ERR_LEN];
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 16384, .text_tokens = 512 };
    CHECK_OK(simulated("qwen2.5-vl-7b", w, "vision:gpus=2,dp=1,tp=2;llm:gpus=6,tp=2,pp=3,mb=1", 8, &p, &analytic));
    plan_options o = plan_options_of(&p);
    CHECK_OK(plan_evaluate(&p, &o, &ev, err));
    plan_sim_mem r6;
    CHECK_OK(plan_sim_memory(&p, 6, &r6, err));
    CHECK_EQ_INT(r6.slots, 3);
    CHECK_NEAR(ev.mem[0].activations, r6.activations, 1e-6 * r6.activations);
}
