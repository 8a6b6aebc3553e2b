/* Partial full recomputation (plan_module.recompute_layers, --strategy
 * rc_layers=N; Megatron-LM's --recompute-method block): which blocks
 * recompute (plan_block_recompute), and that memory and time move block by
 * block between no recomputation and full. The executor's side: the drift
 * cases "full:N" (tests/test_drift.c), and tests/t_run.sh, where rc_layers=1
 * trains bit for bit as the plain run. */
#include "test.h"
#include "tests/test_ex.h"
#include "tests/test_fixture.h"

#include <string.h>

static plan_module llm_strategy(int tp, int pp, int vp, int rc_layers)
{
    plan_module s = { .dp = 1, .tp = tp, .sp = 1, .pp = pp, .vp = vp, .micro_batch = 1, .n_ranks = tp * pp,
                      .recompute = PLAN_RECOMP_FULL, .recompute_layers = rc_layers, .seq_parallel = tp > 1 };
    return s;
}

/* 28 blocks over 2 stages of 2 chunks of 7: the first 3 of each chunk recompute. */
TEST(recompute_layers_are_the_first_of_each_chunk)
{
    model_t m = test_model_load("qwen2.5-vl-7b");
    const model_module *mm = &m.mod[m.llm];
    CHECK(mm->layers == 28);
    plan_module s = llm_strategy(1, 2, 2, 3);
    for (int i = 0; i < 2; i++) {
        plan_stage st = plan_stage_of(mm, &s, i);
        CHECK(plan_stage_recomputed_blocks(&s, &st) == 6);
        for (int v = 0; v < st.chunks; v++)
            for (int j = 0; j < st.chunk_count[v]; j++) {
                int l = st.chunk_first[v] + j;
                CHECK_MSG(plan_block_recompute(&s, &st, l) == (j < 3 ? PLAN_RECOMP_FULL : PLAN_RECOMP_NONE),
                          "stage %d block %d", i, l);
                plan_stage c = plan_stage_chunk(&st, v);   /* the same asked of the chunk alone */
                CHECK(plan_block_recompute(&s, &c, l) == plan_block_recompute(&s, &st, l));
            }
    }
    /* as many as a chunk holds, or more: every block; unset: every block; other modes: unchanged */
    s.recompute_layers = 7;
    plan_stage st = plan_stage_of(mm, &s, 1);
    CHECK(plan_stage_recomputed_blocks(&s, &st) == 14);
    s.recompute_layers = 0;
    CHECK(plan_stage_recomputed_blocks(&s, &st) == 14);
    s.recompute = PLAN_RECOMP_SELECTIVE;
    CHECK(plan_block_recompute(&s, &st, st.first) == PLAN_RECOMP_SELECTIVE && plan_stage_recomputed_blocks(&s, &st) == 0);
}

/* Each recomputed block adds one block's forward to the backward and trades
 * its saved tensors for its input: with 28 like blocks, 7, 14 and 21 of them
 * step the recomputation time and the blocks' activations in equal parts,
 * and all 28 are full recomputation, under both targets. */
TEST(recompute_layers_step_memory_and_time_block_by_block)
{
    model_t m = test_model_load("qwen2.5-vl-7b");
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 1024, .text_tokens = 512 };
    const plan_target targets[] = { PLAN_TARGET_DHP, PLAN_TARGET_MEGATRON };
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        plan_options o;
        plan_options_default(&o);
        o.target = targets[i];
        double acts[5], rc_s[5];
        int n[5] = { 0, 7, 14, 21, 28 };
        for (int k = 0; k < 5; k++) {
            plan_module s = llm_strategy(2, 1, 1, n[k]);
            if (n[k] == 0) s.recompute = PLAN_RECOMP_NONE;
            plan_mem mem;
            plan_time t;
            plan_module_memory(&m, m.llm, &s, &w, &c.pool[0].gpu, &o, 1, &mem);
            plan_micro_time(&m, m.llm, &s, &w, &c, &o, 1, &t);
            acts[k] = mem.block_acts;
            rc_s[k] = t.recompute_s;
        }
        plan_module full = llm_strategy(2, 1, 1, 0);
        plan_mem fm;
        plan_time ft;
        plan_module_memory(&m, m.llm, &full, &w, &c.pool[0].gpu, &o, 1, &fm);
        plan_micro_time(&m, m.llm, &full, &w, &c, &o, 1, &ft);
        CHECK_MSG(acts[4] == fm.block_acts && rc_s[4] == ft.recompute_s, "target %d: 28 of 28 is full", o.target);
        CHECK_MSG(acts[0] > acts[1] && acts[1] > acts[2] && acts[2] > acts[3] && acts[3] > acts[4], "target %d", o.target);
        CHECK_NEAR(acts[1] - acts[2], acts[2] - acts[3], 1e-9 * acts[1]);
        CHECK_NEAR(acts[2] - acts[3], acts[3] - acts[4], 1e-9 * acts[1]);
        CHECK(rc_s[0] == 0);
        for (int k = 1; k < 5; k++) CHECK_NEAR(rc_s[k], rc_s[4] * n[k] / 28.0, 1e-9 * rc_s[4]);
    }
}

/* The strategy key and the plan file carry it; other modes refuse it. */
TEST(recompute_layers_parse_round_trip_and_refusals)
{
    model_t m = test_model_load("qwen2.5-vl-7b");
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 1024, .text_tokens = 512 };
    plan_t p, back;
    char err[UTIL_ERR_LEN];
    int rc = plan_from_strategy("vision:dp=8;llm:tp=2,pp=2,dp=2,rc=full,rc_layers=5", &m, &c, &w, PLAN_COLOCATED, 8, 1,
                                &p, err);
    CHECK_MSG(!rc, "%s", err);
    if (rc) return;
    CHECK(p.mod[m.llm].recompute_layers == 5 && p.mod[m.llm].recompute == PLAN_RECOMP_FULL);
    rc = test_plan_json_round_trip(&p, &back, err);
    CHECK_MSG(!rc, "%s", err);
    CHECK(!rc && back.mod[m.llm].recompute_layers == 5);
    char label[24];
    CHECK(!strcmp(plan_recompute_label(&p.mod[m.llm], label, sizeof label), "full:5"));
    CHECK(plan_from_strategy("vision:dp=8;llm:dp=8,rc=selective,rc_layers=5", &m, &c, &w, PLAN_COLOCATED, 8, 1, &p, err)
          == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "rc_layers 5") && strstr(err, "applies to rc=full"), "%s", err);
    CHECK(plan_from_strategy("vision:dp=8;llm:dp=8,rc=full,rc_layers=0", &m, &c, &w, PLAN_COLOCATED, 8, 1, &p, err)
          == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "rc_layers must be >= 1"), "%s", err);
}

/* The executor: tiny-vl-window's encoder (4 blocks, window and full
 * attention) and LLM (2 blocks) recomputing their first block only train
 * bit for bit as without recomputation. Three encoder blocks keep their
 * activations: each must hold its own, apart from the copies the recomputed
 * block runs in (executor/acts.c binds those last). */
TEST(recompute_layers_executor_step_is_bit_identical)
{
    model_t m;
    test_batch tb;
    test_tiny_vl_batch(&m, true, &tb);
    CHECK(m.mod[0].layers == 4);
    ex_parallel par = { .recompute = PLAN_RECOMP_FULL, .recompute_layers = 1 };
    ex_model *plain = NULL, *part = NULL;
    char err[UTIL_ERR_LEN] = "";
    float lp = 0, lr = 0;
    unsigned all = (1u << m.n_modules) - 1;
    int rc = ex_model_create(&m, 5, &plain, err);
    if (!rc) rc = ex_model_create_parallel(&m, 5, all, &par, &part, err);
    for (int step = 0; !rc && step < 2; step++) {   /* the second step reuses the slots the first laid out */
        rc = ex_step_forward_backward(plain, &tb.b, &lp, err);
        if (!rc) rc = ex_step_forward_backward(part, &tb.b, &lr, err);
    }
    bool same = !rc && lp == lr;
    for (int k = 0; !rc && k < m.n_modules; k++)
        same = same && test_same_buffer(plain, part, k, EX_BUF_GRADS);
    ex_model_free(plain);
    ex_model_free(part);
    test_free_batch(&tb);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_MSG(same, "losses %.9g and %.9g, or the gradients, differ", lp, lr);
}

/* dhp memory's suggestion beside an OOM verdict (plan_fit_by_recompute):
 * Llama 3 8B at 64k tokens on 8 H100s, tp 2 x sp 4, ZeRO-3, keeping every
 * activation, is over 80 GB; the fewest recomputed blocks that fit, and one
 * fewer does not. */
TEST(recompute_layers_least_recomputation_that_fits)
{
    model_t m = test_llm("llama3-8b", "\"layers\": 32, \"hidden\": 4096, \"heads\": 32, \"kv_heads\": 8, "
                         "\"ffn\": 14336, \"ffn_kind\": \"swiglu\", \"norm\": \"rmsnorm\", \"vocab\": 128256");
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 16, .text_tokens = 65536 };
    static plan_t p, f, less;
    char err[UTIL_ERR_LEN];
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;   /* what dhp run allocates, as dhp memory's default */
    int rc = plan_from_strategy_opts("llm:tp=2,sp=4,zero=3,rc=none", &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &p, err);
    CHECK_MSG(!rc, "%s", err);
    if (rc) return;
    plan_eval ev;
    CHECK(!plan_evaluate(&p, &o, &ev, err) && ev.peak_mem > ev.capacity);
    unsigned changed = 0;
    CHECK_MSG(!plan_fit_by_recompute(&p, &o, &f, &changed, err), "%s", err);
    CHECK(changed == 1u);
    if (changed != 1u) return;
    int n = f.mod[0].recompute_layers;
    CHECK_MSG(f.mod[0].recompute == PLAN_RECOMP_FULL && n >= 2 && n < 32, "rc_layers %d", n);
    CHECK(!plan_evaluate(&f, &o, &ev, err) && ev.peak_mem <= ev.capacity);
    less = f;
    less.mod[0].recompute_layers = n - 1;
    CHECK(!plan_evaluate(&less, &o, &ev, err) && ev.peak_mem > ev.capacity);
    CHECK(f.pred.step_time_s > p.pred.step_time_s);
    /* a plan full recomputation cannot save: nothing to suggest */
    w.global_batch = 16;
    w.text_tokens = 1 << 20;
    rc = plan_from_strategy_opts("llm:tp=2,sp=4,zero=3,rc=none", &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &p, err);
    CHECK_MSG(!rc, "%s", err);
    CHECK(!rc && !plan_fit_by_recompute(&p, &o, &f, &changed, err) && changed == 0);
}

/* The search's trim (plan_trim_recompute): full recomputation of every block
 * comes down to the fewest blocks that fit, the same as dhp memory's
 * suggestion from the other side; and the search's own plan there recomputes
 * no block more than fits. */
TEST(recompute_layers_trim_to_the_fewest_that_fit)
{
    model_t m = test_llm("llama3-8b", "\"layers\": 32, \"hidden\": 4096, \"heads\": 32, \"kv_heads\": 8, "
                         "\"ffn\": 14336, \"ffn_kind\": \"swiglu\", \"norm\": \"rmsnorm\", \"vocab\": 128256");
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 16, .text_tokens = 65536 };
    static plan_t full, none, f, less;
    static plan_search_result r;
    char err[UTIL_ERR_LEN];
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    int rc = plan_from_strategy_opts("llm:tp=2,sp=4,zero=3,rc=full", &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &full, err);
    if (!rc) rc = plan_from_strategy_opts("llm:tp=2,sp=4,zero=3,rc=none", &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &none, err);
    CHECK_MSG(!rc, "%s", err);
    if (rc) return;
    unsigned changed;
    CHECK(!plan_fit_by_recompute(&none, &o, &f, &changed, err) && changed == 1u);
    CHECK(!plan_trim_recompute(&full, &o, err));
    CHECK_MSG(full.mod[0].recompute == PLAN_RECOMP_FULL && full.mod[0].recompute_layers == f.mod[0].recompute_layers,
              "trimmed to %d, least that fits %d", full.mod[0].recompute_layers, f.mod[0].recompute_layers);
    CHECK(full.pred.step_time_s == f.pred.step_time_s);
    plan_search_options so;
    plan_search_options_default(&so);
    so.opt = o;
    so.top_k = 0;
    CHECK_MSG(!plan_search(&m, &c, &w, &so, &r, err), "%s", err);
    const plan_module *s = &r.plans[0].mod[0];
    CHECK_MSG(s->recompute == PLAN_RECOMP_FULL && s->recompute_layers > 0, "search: %s, rc_layers %d",
              plan_recompute_name(s->recompute), s->recompute_layers);
    if (s->recompute_layers <= 1) return;
    less = r.plans[0];
    less.mod[0].recompute_layers--;
    plan_eval ev;
    CHECK(!plan_evaluate(&less, &o, &ev, err) && ev.peak_mem > ev.capacity);
}

/* Where no one module's recomputation fits the plan (Qwen2.5-VL-32B at 65,536
 * vision tokens, sp 8 and tp 8, keeping everything): both modules recompute,
 * and neither could recompute a block less. */
TEST(recompute_layers_least_recomputation_of_several_modules)
{
    model_t m = test_model_load("qwen2.5-vl-32b");
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 2, .images_per_sample = 1, .image_tokens = 65536, .text_tokens = 512 };
    static plan_t p, f, less;
    char err[UTIL_ERR_LEN];
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    o.precision = PLAN_OPT_AUTOCAST;
    int rc = plan_from_strategy_opts("vision:sp=8;llm:tp=8", &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &p, err);
    CHECK_MSG(!rc, "%s", err);
    if (rc) return;
    unsigned changed = 0;
    CHECK_MSG(!plan_fit_by_recompute(&p, &o, &f, &changed, err), "%s", err);
    CHECK_MSG(changed == 3u, "changed %#x", changed);
    if (changed != 3u) return;
    CHECK(f.pred.fits);
    for (int k = 0; k < 2; k++) {
        less = f;
        int n = less.mod[k].recompute_layers > 0 ? less.mod[k].recompute_layers : plan_longest_chunk(&m.mod[k], &less.mod[k]);
        less.mod[k].recompute = n > 1 ? PLAN_RECOMP_FULL : PLAN_RECOMP_NONE;
        less.mod[k].recompute_layers = n > 1 ? n - 1 : 0;
        plan_eval ev;
        CHECK(!plan_evaluate(&less, &o, &ev, err));
        plan_sim_predict(&less, NULL);
        CHECK_MSG(!less.pred.fits, "module %d fits with a block fewer recomputed (%d)", k, n - 1);
    }
}
