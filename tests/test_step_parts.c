/* Where the step goes (plan_step_parts, `dhp plan`'s "where the step goes"):
 * each module's parts add up to its seconds of the step under every
 * placement and schedule, and the GEMM and attention parts are the cost
 * model's own GEMMs and attention cores, recomputed here from costdb. */
#include "tests/test.h"
#include "tests/test_fixture.h"
#include "planner/planner.h"

#include <stdio.h>

/* A text-only LLM of `layers` blocks (hidden 512, 8 heads of 64, 2 KV heads, SwiGLU 1536, vocab 4096). */
static model_t text_llm(int layers)
{
    return test_llm("text_llm", "\"layers\": %d, \"hidden\": 512, \"heads\": 8, \"kv_heads\": 2, \"ffn\": 1536,"
                    " \"ffn_kind\": \"swiglu\", \"norm\": \"rmsnorm\", \"vocab\": 4096", layers);
}

/* The plan of `spec` for dhp run (the dhp target), evaluated: its plan_eval in *ev. */
static int evaluated(const char *spec, const model_t *m, const char *cluster, plan_workload w, plan_placement pl,
                     int gpus, int n_micro, plan_t *p, plan_eval *ev)
{
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    int rc = cost_cluster_load(cluster, &c, err);
    if (!rc) rc = plan_from_strategy_opts(spec, m, &c, &w, pl, gpus, n_micro, &o, p, err);
    if (!rc) rc = plan_evaluate(p, &o, ev, err);
    if (rc) fprintf(stderr, "evaluated(%s): %s\n", spec, err);
    return rc;
}

/* Qwen2.5-VL-7B, batch 8 of one 1,024-token image and 256 text tokens. */
static int vl7b(model_t *vl, plan_workload *w)
{
    char err[UTIL_ERR_LEN];
    *w = (plan_workload){ .global_batch = 8, .images_per_sample = 1, .image_tokens = 1024, .text_tokens = 256 };
    int rc = model_load("qwen2.5-vl-7b", vl, err);
    if (rc) fprintf(stderr, "vl7b: %s\n", err);
    return rc;
}

TEST(step_parts_add_up_to_each_modules_seconds_of_the_step)
{
    static plan_t p;
    static plan_eval ev;
    char err[UTIL_ERR_LEN];
    model_t vl;
    plan_workload w;
    CHECK_OK(vl7b(&vl, &w));
    /* colocated, the LLM pipelined chunk by chunk: bubbles and hand-offs in every chunk */
    CHECK_OK(evaluated("vision:sp=2,rc=full;llm:tp=2,pp=2,mb=2", &vl, "8xh100", w, PLAN_COLOCATED, 8, 1, &p, &ev));
    double sum = 0;
    for (int k = 0; k < p.n_modules; k++) {
        CHECK_NEAR(plan_step_parts_total(&ev.parts[k]), ev.module_step_s[k], 1e-12);
        sum += ev.module_step_s[k];
    }
    CHECK_NEAR(sum, p.pred.analytic_step_time_s, 1e-12);
    const plan_step_parts *llm = &ev.parts[vl.llm];
    CHECK(llm->bubble_s > 0 && llm->micro.hop_s > 0 && llm->micro.tp_comm_s > 0 && llm->micro.gemm_s > 0);
    CHECK(ev.parts[0].micro.recompute_s > 0 && ev.parts[0].bubble_s == 0);
    /* the plan's own options reproduce the evaluation's parts */
    plan_step_parts again[MODEL_MAX_MODULES];
    CHECK_OK(plan_step_parts_of(&p, again, err));
    for (int k = 0; k < p.n_modules; k++) CHECK_NEAR(plan_step_parts_total(&again[k]), ev.module_step_s[k], 1e-12);

    /* disaggregated: the encoder's hand-offs to the LLM are its own part */
    CHECK_OK(evaluated("vision:gpus=2;llm:gpus=6,tp=2,pp=3,mb=1", &vl, "8xh100", w, PLAN_DISAGGREGATED, 8, 4, &p, &ev));
    for (int k = 0; k < p.n_modules; k++) CHECK_NEAR(plan_step_parts_total(&ev.parts[k]), ev.module_step_s[k], 1e-12);
    CHECK(ev.parts[0].transfer_s > 0 && ev.parts[vl.llm].transfer_s == 0);

    /* a whole-batch interleaved pipeline: the bubble is (pp - 1) / vp passes of the stages that
     * do not pace it (plan_time.fill_s: the head makes the last stage the slower here) */
    model_t t = text_llm(8);
    plan_workload tw = { .global_batch = 8, .text_tokens = 512 };
    CHECK_OK(evaluated("llm:pp=2,vp=2,mb=1", &t, "8xh100", tw, PLAN_COLOCATED, 2, 1, &p, &ev));
    CHECK_NEAR(plan_step_parts_total(&ev.parts[0]), ev.module_step_s[0], 1e-12);
    CHECK_NEAR(ev.parts[0].bubble_s, 0.5 * ev.time[0].fill_s, 1e-12);
    CHECK(ev.time[0].fill_s > 0 && ev.time[0].fill_s < plan_pace_s(&ev.time[0], &p.mod[0]));
    CHECK_EQ_INT(ev.parts[0].micros, 8);
}

/* The disaggregated hand-off's part: each direction as long as its busiest
 * end (planner/evaluate.c transfer_time). Vision on 2 ranks (dp 2, one
 * sample of a 2-sample chunk each), the LLM on 4 (tp 4): each vision rank
 * sends its sample to all 4 LLM tp ranks, each LLM rank takes the chunk's 2
 * samples and sends their gradient back to one vision rank each: 4 and 2
 * samples' rows through the busiest NIC. A frozen encoder gets no gradient. */
TEST(step_parts_the_handoff_is_as_long_as_its_busiest_end)
{
    static plan_t p;
    static plan_eval ev;
    model_t vl;
    plan_workload w;
    CHECK_OK(vl7b(&vl, &w));
    for (int frozen = 0; frozen < 2; frozen++) {
        vl.mod[0].frozen = frozen;
        CHECK_OK(evaluated("vision:gpus=2,dp=2;llm:gpus=4,tp=4", &vl, "8xh100", w, PLAN_DISAGGREGATED, 6, 4, &p, &ev));
        double sample = (double)plan_rows_per_sample(&p, 0) * vl.mod[0].out_hidden * plan_precision_bytes(p.precision).act;
        double act = cost_p2p_time(&p.cluster, 0, 0, true, 4 * sample), grad = cost_p2p_time(&p.cluster, 0, 0, true, 2 * sample);
        CHECK_NEAR(ev.parts[0].transfer_s, 4 * (act + (frozen ? 0 : grad)), 1e-12);
    }
}

/* One block, tp 1, one sample of 512 tokens on one H100 (dhp target): the
 * GEMMs are q, k, v, o, gate, up, down and the LM head (on the 511 rows with
 * a next token, plan_head_rows), each forward, input gradient and weight
 * gradient; the attention core is FlashAttention's
 * forward and backward over the causal mean span (cost_attention_mean_span). */
TEST(step_parts_gemm_and_attention_are_the_blocks_own)
{
    static plan_t p;
    static plan_eval ev;
    model_t m = text_llm(1);
    plan_workload w = { .global_batch = 1, .text_tokens = 512 };
    CHECK_OK(evaluated("llm:gpus=1,mb=1", &m, "8xh100", w, PLAN_COLOCATED, 1, 1, &p, &ev));
    plan_options o = plan_options_of(&p);
    const cost_gpu *g = &p.cluster.pool[0].gpu;
    cost_gemm_math math = plan_gemm_math(&o);
    double t = 512, h = 512, q = 8 * 64, kv = 2 * 64, f = 1536, V = 4096;
    double shapes[][3] = { { t, q, h }, { t, kv, h }, { t, kv, h }, { t, h, q }, { t, f, h }, { t, f, h }, { t, h, f },
                           { t - 1, V, h } };
    double gemm = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
        gemm += cost_gemm_time_in(g, math, M, N, K) + cost_gemm_time_in(g, math, M, K, N)
              + cost_gemm_time_in(g, math, K, N, M);
    }
    CHECK_NEAR(ev.parts[0].micro.gemm_s, gemm, 1e-12);
    double rows = t * 8, scores = rows * cost_attention_mean_span(t, true);
    cost_attn_kernel kern = plan_attention_kernel(&o);
    double attn = cost_attention_forward_time_in(g, kern, rows, scores, 64)
                + cost_attention_backward_time_in(g, kern, rows, scores, 64);
    CHECK_NEAR(ev.parts[0].micro.attn_s, attn, 1e-12);
    CHECK(ev.parts[0].micro.other_s > 0 && ev.parts[0].micro.recompute_s == 0 && ev.parts[0].bubble_s == 0);
}
