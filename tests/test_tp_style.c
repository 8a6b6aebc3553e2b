/* The Megatron target's tensor parallelism as PyTorch's DTensor runs it
 * (--tp-style dtensor, plan_options.tp_style; torchtitan's apply_tp): each
 * sequence-parallel all-gather and reduce-scatter carries a copy of the
 * gathered rows (torch.cat beside the functional collective on dim 1), and
 * backward re-gathers the blocks' inputs only under per-op checkpointing;
 * Megatron-LM's default is unchanged; the dhp target refuses the style.
 * Expected figures worked out beside each check. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

static model_t llama(void)
{
    return test_llm("llama", "\"layers\": 4, \"hidden\": 1024, \"heads\": 8, \"kv_heads\": 2, \"ffn\": 4096,"
                    " \"ffn_kind\": \"swiglu\", \"norm\": \"rmsnorm\", \"vocab\": 1000");
}

/* tp 8 in one node, sequence parallel, 4 blocks of 2048 rows, 2 B an element:
 * forward 2L all-gathers and 2L reduce-scatters; backward 2L all-gathers of
 * the output gradient, 2L re-gathers (Megatron; DTensor only under per-op
 * checkpointing), 2L reduce-scatters and L norm-gradient all-reduces. Under
 * DTensor each all-gather and reduce-scatter adds a copy of the 2048 x 1024
 * gathered rows. */
TEST(tp_style_dtensor_copies_beside_each_seqpar_collective_and_drops_the_regather)
{
    model_t m = llama();
    cost_cluster c = test_cluster_load("8xh100");
    const cost_pool *pool = &c.pool[0];
    plan_module s = { .dp = 1, .tp = 8, .sp = 1, .pp = 1, .micro_batch = 1, .n_ranks = 8, .seq_parallel = true };
    const int L = 4;
    const double A = 2, t = 2048, h = 1024;
    double ag = cost_collective_time(pool, COST_ALLGATHER, A * t * h, 8, 8);
    double rs = cost_collective_time(pool, COST_REDUCESCATTER, A * t * h, 8, 8);
    double ar = cost_collective_time(pool, COST_ALLREDUCE, 4.0 * 2 * h, 8, 8);
    double copy = cost_elementwise_time(&pool->gpu, COST_EW_COPY, t * h, A);
    CHECK(copy > 0);
    plan_options meg = test_megatron_autocast(), dt = meg;
    meg.tp_style = PLAN_TP_MEGATRON;
    dt.tp_style = PLAN_TP_DTENSOR;
    plan_recompute rcs[] = { PLAN_RECOMP_NONE, PLAN_RECOMP_FULL, PLAN_RECOMP_OP };
    for (int i = 0; i < 3; i++) {
        s.recompute = rcs[i];
        plan_comm cm = { 0 }, fm = { 0 }, cd = { 0 }, fd = { 0 };
        plan_price_tp_blocks(&m.mod[0], &s, L, pool, &meg, A, t, true, true, &cm, &fm);
        plan_price_tp_blocks(&m.mod[0], &s, L, pool, &dt, A, t, true, true, &cd, &fd);
        CHECK_NEAR(fm.fwd_s, 2 * L * ag + 2 * L * rs, 1e-12);
        CHECK_NEAR(cm.bwd_s, 4 * L * ag + 2 * L * rs + L * ar, 1e-12);
        CHECK(fm.fwd_syncs == 4 * L && cm.bwd_syncs == 7 * L);
        CHECK_NEAR(fd.fwd_s, 2 * L * (ag + copy) + 2 * L * (rs + copy), 1e-12);
        int regather = rcs[i] == PLAN_RECOMP_OP ? 2 : 0;
        CHECK_NEAR(cd.bwd_s, (2 + regather) * L * (ag + copy) + 2 * L * (rs + copy) + L * ar, 1e-12);
        CHECK(cd.bwd_syncs == (5 + regather) * L);
    }
    /* without sequence parallelism: all-reduces, no layout copy either way */
    s.seq_parallel = false;
    s.recompute = PLAN_RECOMP_NONE;
    plan_comm cm = { 0 }, fm = { 0 }, cd = { 0 }, fd = { 0 };
    plan_price_tp_blocks(&m.mod[0], &s, L, pool, &meg, A, t, true, true, &cm, &fm);
    plan_price_tp_blocks(&m.mod[0], &s, L, pool, &dt, A, t, true, true, &cd, &fd);
    CHECK(fm.fwd_s == fd.fwd_s && cm.bwd_s == cd.bwd_s);
}

/* The style's names round-trip; the dhp target (dhp run's TP is
 * Megatron's) refuses dtensor. */
TEST(tp_style_names_and_the_dhp_target_refuses_dtensor)
{
    plan_tp_style t;
    CHECK(plan_tp_style_parse("dtensor", &t, NULL) == UTIL_OK && t == PLAN_TP_DTENSOR);
    CHECK(plan_tp_style_parse("megatron", &t, NULL) == UTIL_OK && t == PLAN_TP_MEGATRON);
    CHECK(plan_tp_style_parse("fsdp", &t, NULL) == UTIL_EINVAL);
    CHECK(!strcmp(plan_tp_style_name(PLAN_TP_DTENSOR), "dtensor"));
    char err[UTIL_ERR_LEN];
    plan_options o = test_megatron_autocast();
    o.tp_style = PLAN_TP_DTENSOR;
    CHECK(plan_tp_style_check(&o, err) == UTIL_OK);
    o.target = PLAN_TARGET_DHP;
    CHECK(plan_tp_style_check(&o, err) == UTIL_EINVAL && strstr(err, "--target megatron"));
    o.tp_style = PLAN_TP_MEGATRON;
    CHECK(plan_tp_style_check(&o, err) == UTIL_OK);
}
