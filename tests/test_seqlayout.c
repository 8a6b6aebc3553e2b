/* The LLM's context parallelism layout (planner/seqlayout.c): which variant
 * runs, which positions each sp rank holds, and what the strategy check,
 * the activation slot and the encoder window layers make of it. */
#include "tests/test.h"
#include "planner/planner.h"

#include <stdlib.h>

static plan_module strat(int tp, int sp) { return (plan_module){ .dp = 1, .tp = tp, .sp = sp, .pp = 1, .micro_batch = 1 }; }

TEST(seqlayout_variant_is_ulysses_where_the_heads_divide_else_ring)
{
    model_t m;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("tiny-vl", &m, err));   /* LLM: 4 heads, 2 kv heads */
    const model_module *llm = &m.mod[m.llm], *vis = &m.mod[model_find_kind(&m, MODEL_VISION)];
    plan_module s = strat(1, 1);
    CHECK_EQ_INT(plan_cp_of(llm, &s), PLAN_CP_NONE);
    s = strat(1, 2);
    CHECK_EQ_INT(plan_cp_of(llm, &s), PLAN_CP_ULYSSES);
    s = strat(2, 2);   /* 4 does not divide 2 kv heads */
    CHECK_EQ_INT(plan_cp_of(llm, &s), PLAN_CP_RING);
    s = strat(1, 4);
    CHECK_EQ_INT(plan_cp_of(llm, &s), PLAN_CP_RING);
    CHECK_EQ_INT(plan_cp_of(vis, &s), PLAN_CP_ULYSSES);   /* an encoder's sp is always Ulysses */
    CHECK(!strcmp(plan_cp_name(PLAN_CP_RING), "ring") && !strcmp(plan_cp_name(PLAN_CP_ULYSSES), "ulysses"));
}

/* plan_module.cp (--strategy cp=, the plan file's "cp") asks for a variant:
 * ring where Ulysses would run, Ulysses where the heads divide; the strategy
 * check refuses what cannot run (Ulysses over heads tp x sp does not divide,
 * a ring in an encoder, a variant without sp). */
TEST(seqlayout_the_asked_variant_runs_and_the_check_refuses_what_cannot)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("tiny-vl", &m, err));   /* LLM: 4 heads, 2 kv heads */
    CHECK_OK(cost_cluster_load("8xh100", &c, err));
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 16 };
    int L = m.llm, V = model_find_kind(&m, MODEL_VISION);
    const model_module *llm = &m.mod[L];
    plan_module s = strat(1, 2);
    s.cp = PLAN_CP_RING;   /* Ulysses by default here */
    CHECK_EQ_INT(plan_cp_of(llm, &s), PLAN_CP_RING);
    CHECK_OK(plan_strategy_check(&m, L, &s, &w, &c, err));
    s.cp = PLAN_CP_ULYSSES;
    CHECK_EQ_INT(plan_cp_of(llm, &s), PLAN_CP_ULYSSES);
    s = strat(2, 2);       /* ring by default: tp x sp = 4 does not divide 2 kv heads */
    s.cp = PLAN_CP_ULYSSES;
    CHECK_EQ_INT(plan_strategy_check(&m, L, &s, &w, &c, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "tp*sp = 4 must divide heads 4 and kv_heads 2"), "%s", err);
    s = strat(1, 1);
    s.cp = PLAN_CP_RING;
    CHECK_EQ_INT(plan_cp_of(llm, &s), PLAN_CP_NONE);
    CHECK_EQ_INT(plan_strategy_check(&m, L, &s, &w, &c, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "cp=ring") && strstr(err, "needs sp > 1"), "%s", err);
    s = strat(1, 2);
    s.cp = PLAN_CP_RING;
    CHECK_EQ_INT(plan_cp_of(&m.mod[V], &s), PLAN_CP_ULYSSES);
    CHECK_EQ_INT(plan_strategy_check(&m, V, &s, &w, &c, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "ring attention runs in the language model"), "%s", err);
    plan_cp k;
    CHECK(plan_cp_parse("ring", &k) && k == PLAN_CP_RING && plan_cp_parse("auto", &k) && k == PLAN_CP_NONE);
    CHECK(plan_cp_parse("ulysses", &k) && k == PLAN_CP_ULYSSES && !plan_cp_parse("p2p", &k));
}

/* Every position once over the ranks, S / sp on each; position and local row inverse. */
static void check_partition(plan_cp k, int S, int sp)
{
    int *seen = calloc((size_t)S, sizeof *seen);
    for (int j = 0; j < sp; j++) {
        plan_cp_span s = plan_cp_span_of(k, S, sp, j);
        CHECK_EQ_INT(plan_cp_rows(&s), S / sp);
        CHECK_EQ_INT(plan_cp_held(&s, 0, S), S / sp);
        for (int row = 0; row < S / sp; row++) {
            int p = plan_cp_position(&s, row);
            CHECK(p >= 0 && p < S);
            CHECK_EQ_INT(plan_cp_local(&s, p), row);
            if (row > 0) CHECK(p > plan_cp_position(&s, row - 1));   /* local rows in position order */
            seen[p]++;
        }
        CHECK_EQ_INT(plan_cp_position(&s, S / sp), -1);
    }
    for (int p = 0; p < S; p++) CHECK_EQ_INT(seen[p], 1);
    free(seen);
}

TEST(seqlayout_spans_partition_every_sample)
{
    for (int sp = 1; sp <= 4 && !test_failed_now(); sp++) {
        check_partition(PLAN_CP_ULYSSES, 48, sp);
        check_partition(PLAN_CP_RING, 48, sp);
    }
    /* Ulysses: one contiguous slice; ring: chunks j and 2 sp - 1 - j */
    plan_cp_span u = plan_cp_span_of(PLAN_CP_ULYSSES, 48, 3, 1), r = plan_cp_span_of(PLAN_CP_RING, 48, 3, 1);
    CHECK(u.n == 1 && u.lo[0] == 16 && u.hi[0] == 32);
    CHECK(r.n == 2 && r.lo[0] == 8 && r.hi[0] == 16 && r.lo[1] == 32 && r.hi[1] == 40);
    CHECK_EQ_INT(plan_cp_held(&r, 10, 35), 6 + 3);
    /* the ring's point: every rank's causal work (keys its queries see) is the same; Ulysses' grows with j */
    long ring0 = -1, uly0 = -1;
    for (int j = 0; j < 4; j++) {
        plan_cp_span a = plan_cp_span_of(PLAN_CP_RING, 48, 4, j), b = plan_cp_span_of(PLAN_CP_ULYSSES, 48, 4, j);
        long wa = 0, wb = 0;
        for (int row = 0; row < 12; row++) {
            wa += plan_cp_position(&a, row) + 1;
            wb += plan_cp_position(&b, row) + 1;
        }
        if (j == 0) { ring0 = wa; uly0 = wb; }
        CHECK_EQ_INT(wa, ring0);
        if (j > 0) CHECK(wb > uly0);
    }
}

TEST(seqlayout_slot_is_sized_for_the_busiest_rank)
{
    model_t m;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("tiny-vl", &m, err));
    const model_module *llm = &m.mod[m.llm];
    /* 32 positions: 16 encoder rows, 16 text tokens (15 predictions) */
    plan_module s = strat(1, 1);
    plan_act_rows r = plan_llm_act_rows(llm, &s, 3, 32, 16);
    CHECK(r.rows == 96 && r.merged_rows == 48 && r.pred_rows == 45 && r.emb_rows == 0);
    s = strat(1, 2);   /* Ulysses: rank 0 holds every encoder row, rank 1 every prediction */
    r = plan_llm_act_rows(llm, &s, 3, 32, 16);
    CHECK(r.rows == 48 && r.merged_rows == 48 && r.pred_rows == 45 && r.emb_rows == 0);
    s = strat(2, 2);   /* ring: rank 0 chunks 0 and 3 (8 encoder rows, 7 predictions), rank 1 chunks 1 and 2 (8, 8) */
    r = plan_llm_act_rows(llm, &s, 3, 32, 16);
    CHECK(r.rows == 48 && r.merged_rows == 24 && r.pred_rows == 24 && r.emb_rows == 24);
}

TEST(seqlayout_strategy_check_lets_ring_through_and_names_what_does_not_split)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("tiny-vl", &m, err));
    CHECK_OK(cost_cluster_load("8xh100", &c, err));
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 16 };   /* 32 positions */
    int L = m.llm, V = model_find_kind(&m, MODEL_VISION);
    plan_module s = strat(2, 2);
    s.module_index = L;
    int rc = plan_strategy_check(&m, L, &s, &w, &c, err);
    CHECK_MSG(rc == UTIL_OK, "%s", err);   /* ring: 4 chunks of 8 */
    s.sp = 4;                                                  /* ring over 8 chunks of 4 */
    CHECK_OK(plan_strategy_check(&m, L, &s, &w, &c, err));
    w.text_tokens = 20;                                        /* 36 positions: not 8 chunks */
    CHECK_EQ_INT(plan_strategy_check(&m, L, &s, &w, &c, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "sp 4: ring context parallelism needs the sequence (36 tokens) divisible by 8"), "%s", err);
    s = strat(4, 2);                                           /* ring, but tp 4 does not divide 2 kv heads */
    w.text_tokens = 16;
    CHECK_EQ_INT(plan_strategy_check(&m, L, &s, &w, &c, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "tp 4 must divide heads 4 and kv_heads 2"), "%s", err);
    s = strat(1, 8);                                           /* an encoder's sp needs the heads to divide */
    CHECK_EQ_INT(plan_strategy_check(&m, V, &s, &w, &c, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "tp*sp = 8 must divide heads 4"), "%s", err);
}

TEST(seqlayout_encoder_window_layers_stay_local_on_whole_windows)
{
    model_t m;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("tiny-vl-window", &m, err));
    const model_module *vis = &m.mod[model_find_kind(&m, MODEL_VISION)];
    plan_module s = strat(1, 2);
    int win = -1, full = -1;
    for (int l = 0; l < vis->layers; l++) *(model_layer_is_full_attention(vis, l) ? &full : &win) = l;
    CHECK(win >= 0 && full >= 0);
    CHECK_EQ_INT(plan_cp_layer(vis, &s, win, 4.0 * vis->window), PLAN_CP_NONE);
    CHECK_EQ_INT(plan_cp_layer(vis, &s, win, 4.0 * vis->window + 4), PLAN_CP_ULYSSES);   /* a window split over ranks */
    CHECK_EQ_INT(plan_cp_layer(vis, &s, full, 4.0 * vis->window), PLAN_CP_ULYSSES);
    s.sp = 1;
    CHECK_EQ_INT(plan_cp_layer(vis, &s, full, 64), PLAN_CP_NONE);
}
