/* The pipeline split that counts the embedding and the head as a block each
 * (plan_module.split_ends, `--strategy llm:split=ends`): Megatron-Core's
 * account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split,
 * Llama 3 405B's layout (arXiv 2407.21783 sec. 3.3.2: 126 layers, pp 16,
 * the first chunk the embedding alone, the last the output layer alone). */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"
#include "planner/simulate.h"

#include <string.h>

/* 126 blocks + the embedding + the head over 16 ranks x 8 chunks: 128 slots,
 * one a virtual stage; virtual stage 0 (rank 0's chunk 0) holds the
 * embedding alone and the last (rank 15's chunk 7) the head alone, every
 * other one block, in order. */
TEST(split_ends_llama3_405b_layout)
{
    model_module mm = { .layers = 126 };
    plan_module s = { .pp = 16, .vp = 8, .split_ends = true };
    char err[UTIL_ERR_LEN];
    CHECK_OK(plan_stage_split_check(&mm, &s, err));
    int next = 0;
    for (int g = 0; g < 128; g++) {
        plan_stage v = plan_vstage_of(&mm, &s, g);
        CHECK_EQ_INT(v.count, g == 0 || g == 127 ? 0 : 1);
        CHECK_EQ_INT(v.first, next);
        CHECK(v.stem == (g == 0) && v.head == (g == 127));
        next += v.count;
    }
    CHECK_EQ_INT(next, 126);
    plan_stage first = plan_stage_of(&mm, &s, 0), last = plan_stage_of(&mm, &s, 15), mid = plan_stage_of(&mm, &s, 7);
    CHECK_EQ_INT(first.count, 7);
    CHECK_EQ_INT(last.count, 7);
    CHECK_EQ_INT(mid.count, 8);
    CHECK_EQ_INT(plan_stage_block(&first, 0), 15);   /* chunk 1 of rank 0: virtual stage 16, after blocks 0..14 */
    CHECK_EQ_INT(plan_stage_block(&last, 6), 110);   /* chunk 6 of rank 15: virtual stage 111, after 110 blocks */
    /* without the ends counted, 8 chunks do not fit rank 0's 7 blocks */
    s.split_ends = false;
    CHECK(plan_stage_split_check(&mm, &s, err) == UTIL_EINVAL);
}

/* Without interleaving the 128 slots are 8 a rank: 7 + 14 x 8 + 7 blocks,
 * which is also dhp's own split of 126 over 16; on 30 blocks over 4 ranks
 * the 32 slots give 7 + 8 + 8 + 7 where dhp's own split is 7 + 8 + 8 + 7
 * too, and over 2 chunks each the first chunk of rank 0 is a block short
 * (3 + the embedding) and the last of rank 3 (3 + the head). */
TEST(split_ends_without_and_with_interleaving)
{
    model_module mm = { .layers = 126 };
    plan_module s = { .pp = 16, .split_ends = true }, own = { .pp = 16 };
    for (int i = 0; i < 16; i++) {
        CHECK_EQ_INT(plan_stage_of(&mm, &s, i).count, i == 0 || i == 15 ? 7 : 8);
        CHECK_EQ_INT(plan_stage_of(&mm, &s, i).first, plan_stage_of(&mm, &own, i).first);
    }
    model_module m30 = { .layers = 30 };
    plan_module t = { .pp = 4, .split_ends = true };
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(plan_stage_of(&m30, &t, i).count, i == 0 || i == 3 ? 7 : 8);
    t.vp = 2;
    char err[UTIL_ERR_LEN];
    CHECK_OK(plan_stage_split_check(&m30, &t, err));
    int want[8] = { 3, 4, 4, 4, 4, 4, 4, 3 };   /* virtual stages 0..7 */
    for (int g = 0; g < 8; g++) CHECK_EQ_INT(plan_vstage_of(&m30, &t, g).count, want[g]);
}

/* Refused, naming the rule: slots that pp x vp does not divide (Megatron-Core
 * splits them evenly), one stage, and an explicit stage_layers beside it. */
TEST(split_ends_refusals)
{
    model_module mm = { .layers = 125 };
    plan_module s = { .pp = 16, .vp = 8, .split_ends = true };
    char err[UTIL_ERR_LEN];
    CHECK(plan_stage_split_check(&mm, &s, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "divide by pp x vp = 128") != NULL, "%s", err);
    mm.layers = 126;
    plan_module one = { .pp = 1, .split_ends = true };
    CHECK(plan_stage_split_check(&mm, &one, err) == UTIL_EINVAL);
    /* more virtual stages than slots: refused, and no stage is priced with fewer than no blocks */
    model_module tiny = { .layers = 4 };
    plan_module wide = { .pp = 4, .vp = 8, .split_ends = true };
    CHECK(plan_stage_split_check(&tiny, &wide, err) == UTIL_EINVAL);
    for (int i = 0; i < 4; i++) CHECK(plan_stage_of(&tiny, &wide, i).count >= 0);
    s.stage_layers[0] = 7;
    CHECK(plan_stage_split_check(&mm, &s, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "two splits") != NULL, "%s", err);
}

/* Pipeline stages take ZeRO-1, -2 and -3 (ZeRO-3 gathers each stage's units
 * per micro-batch and frees them after it), but not DeepSpeed 2021's ZeRO-3
 * (its pipeline engine refuses it), and ZeRO-2 not beside a tied embedding
 * split over the first and the last stage (its copies sync whole gradients):
 * one line each. */
TEST(pipeline_zero_stages)
{
    model_t m = test_model_load("tiny-vl");
    cost_cluster c = test_cluster_load("8xh100");
    m.mod[m.llm].layers = 4;
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 16 };
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(plan_from_strategy("vision:dp=4,pp=2,zero=2;llm:pp=2,dp=4,zero=2", &m, &c, &w, PLAN_COLOCATED, 8, 0, &p, err));
    CHECK_OK(plan_from_strategy("vision:dp=4,pp=2,zero=3;llm:pp=2,dp=4,zero=3", &m, &c, &w, PLAN_COLOCATED, 8, 0, &p, err));
    CHECK(p.pred.fits && p.pred.step_time_s > 0);
    plan_options ds;
    plan_options_default(&ds);
    ds.zero3 = PLAN_ZERO3_DEEPSPEED_2021;
    CHECK(plan_from_strategy_opts("vision:dp=8;llm:pp=2,dp=4,zero=3", &m, &c, &w, PLAN_COLOCATED, 8, 0, &ds, &p, err) ==
          UTIL_EINVAL);
    CHECK_MSG(strstr(err, "zero 3 with pp 2") && strstr(err, "PipelineEngine"), "%s", err);
    CHECK_OK(plan_from_strategy_opts("vision:dp=8;llm:dp=8,zero=3", &m, &c, &w, PLAN_COLOCATED, 8, 0, &ds, &p, err));
    m.mod[m.llm].tied_embeddings = true;
    CHECK(plan_from_strategy("vision:dp=8;llm:pp=2,dp=4,zero=2", &m, &c, &w, PLAN_COLOCATED, 8, 0, &p, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "untied embeddings") != NULL, "%s", err);
    CHECK_OK(plan_from_strategy("vision:dp=8;llm:pp=2,dp=4,zero=1", &m, &c, &w, PLAN_COLOCATED, 8, 0, &p, err));
}

/* ZeRO-3's and -2's collectives inside a micro-batch move the units of the
 * stage priced: a stage of one block gathers and reduces less than one of
 * three, and its own units' sum, not the first stage's. */
TEST(pipeline_zero3_prices_each_stages_units)
{
    model_t m = test_model_load("tiny-vl");
    cost_cluster c = test_cluster_load("8xh100");
    model_module *mm = &m.mod[m.llm];
    mm->layers = 4;
    plan_module s = { .dp = 4, .tp = 1, .sp = 1, .pp = 2, .zero = 3, .micro_batch = 1, .n_ranks = 8 };
    s.stage_layers[0] = 3, s.stage_layers[1] = 1;
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    o.overlap = 0;
    double t[2];
    for (int i = 0; i < 2; i++) {
        plan_stage st = plan_stage_of(mm, &s, i);
        plan_comm comm = { 0 };
        double fbusy, bbusy;
        plan_price_dp_micro(mm, &s, &st, &c.pool[0], &o, true, 1, 1, &comm, &fbusy, &bbusy);
        t[i] = comm.fwd_s + comm.bwd_s;
        CHECK(comm.fwd_syncs > 0 && comm.bwd_syncs > comm.fwd_syncs);   /* gathers; gathers and reductions */
    }
    CHECK_MSG(t[1] < t[0], "stage 1 (1 block) %.3g s, stage 0 (3 blocks) %.3g s", t[1], t[0]);
}

/* The Megatron target's per-step ZeRO-1 reduce-scatter and all-gather of a
 * stage move that stage's parameters, and its optimizer updates them: the
 * first stage's (the embedding and three blocks) take longer than the
 * second's (one block and the head). */
TEST(pipeline_step_sync_and_update_move_each_stages_parameters)
{
    model_t m = test_model_load("tiny-vl");
    cost_cluster c = test_cluster_load("8xh100");
    model_module *mm = &m.mod[m.llm];
    mm->layers = 4;
    mm->tied_embeddings = false;
    plan_module s = { .dp = 4, .tp = 1, .sp = 1, .pp = 2, .zero = 1, .micro_batch = 1, .n_ranks = 8 };
    s.stage_layers[0] = 3, s.stage_layers[1] = 1;
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_MEGATRON;
    plan_time t[2];
    for (int i = 0; i < 2; i++) {
        memset(&t[i], 0, sizeof t[i]);
        plan_stage_step_time(mm, &s, i, &c.pool[0], &o, &t[i]);
        CHECK(t[i].grad_sync_s > 0 && t[i].param_gather_s > 0 && t[i].optim_s > 0);
    }
    CHECK_MSG(t[1].grad_sync_s < t[0].grad_sync_s && t[1].param_gather_s < t[0].param_gather_s &&
              t[1].optim_s < t[0].optim_s, "stage 1 %.3g / %.3g / %.3g s, stage 0 %.3g / %.3g / %.3g s",
              t[1].grad_sync_s, t[1].param_gather_s, t[1].optim_s, t[0].grad_sync_s, t[0].param_gather_s,
              t[0].optim_s);
}

/* From --strategy to the plan file and back; the plan priced, its schedule
 * simulated (a chunk of the embedding alone and one of the head alone), and
 * a split that does not divide refused in one line. */
TEST(split_ends_strategy_plan_file)
{
    model_t m = test_model_load("tiny-vl");
    cost_cluster c = test_cluster_load("8xh100");
    m.mod[m.llm].layers = 4;   /* 4 + 2 slots over 2 ranks x 3 chunks */
    plan_workload w = { .global_batch = 4, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 16 };
    static plan_t p, back;
    char err[UTIL_ERR_LEN];
    CHECK_OK(plan_from_strategy("vision:gpus=1;llm:gpus=2,pp=2,vp=3,split=ends,mb=1", &m, &c, &w, PLAN_DISAGGREGATED, 3, 4,
                                &p, err));
    const plan_module *s = &p.mod[m.llm];
    CHECK(s->split_ends && s->pp == 2 && s->vp == 3);
    CHECK(p.pred.step_time_s > 0 && p.pred.fits);
    CHECK_OK(plan_sim_predict(&p, err));
    CHECK(p.pred.simulated && p.pred.step_time_s > 0);
    plan_stage st0 = plan_stage_of(&m.mod[m.llm], s, 0);
    CHECK(st0.stem && st0.chunk_count[0] == 0 && st0.count == 2);
    CHECK_OK(test_plan_json_round_trip(&p, &back, err));
    CHECK(back.mod[m.llm].split_ends);
    m.mod[m.llm].layers = 5;   /* 7 slots over 6 virtual stages */
    CHECK(plan_from_strategy("vision:gpus=1;llm:gpus=2,pp=2,vp=3,split=ends,mb=1", &m, &c, &w, PLAN_DISAGGREGATED, 3, 4, &p,
                             err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "split_ends") != NULL, "%s", err);
}
