/* The simulator and the cost model on plans with the LLM's context
 * parallelism (planner/cost_cp.c, plan_cp_micro_time): every sp rank's op
 * is priced at the group's pace, ring attention's K/V passes by hand. */
#include "tests/test.h"
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

/* tiny-vl (heads / kv_heads of its LLM where > 0) on 8xh100: 16 merged rows and 16 text tokens per sample. */
static int cp_plan(const char *spec, int gpus, int heads, int kv_heads, plan_t *p)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    if (model_load("tiny-vl", &m, err) || cost_cluster_load("8xh100", &c, err)) return UTIL_EINVAL;
    if (heads > 0) m.mod[m.llm].heads = heads;
    if (kv_heads > 0) m.mod[m.llm].kv_heads = kv_heads;
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 16 };
    int rc = plan_from_strategy(spec, &m, &c, &w, PLAN_COLOCATED, gpus, 1, p, err);
    if (rc) fprintf(stderr, "cp_plan: %s\n", err);
    return rc;
}

/* The LLM's FORWARD_BACKWARD on every rank is its stage's price (the pace),
 * no sp rank's own work exceeds it, and the sp ranks hold the same memory. */
static void check_pace(const plan_t *p, plan_cp want)
{
    char err[UTIL_ERR_LEN];
    int L = p->model.llm;
    const plan_module *s = &p->mod[L];
    CHECK_EQ_INT(plan_cp_of(&p->model.mod[L], s), want);
    plan_sim_result r;
    int rc = plan_sim_run(p, NULL, &r, err);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    plan_options o = plan_options_of(p);
    plan_time pace, own;
    double samples = -1, most = 0, least = 1e300;
    for (int rank = 0; rank < p->world_size; rank++)
        for (int i = 0; i < r.rank[rank].n_ops; i++) {
            const plan_sim_op *op = &r.rank[rank].ops[i];
            if (op->op.kind != PLAN_OP_FORWARD_BACKWARD || op->op.module != L || op->op.samples <= 0) continue;
            if (samples < 0) samples = op->op.samples;
            CHECK_EQ_INT(op->op.samples, samples);
            plan_stage_micro_time(&p->model, L, s, 0, &p->work, &p->cluster, &o, samples, &pace);
            CHECK_NEAR(op->busy_s + op->comm_s, pace.micro_s, 1e-9);
        }
    plan_sim_free(&r);
    CHECK(samples > 0);
    for (int j = 0; j < s->sp; j++) {
        plan_cp_micro_time(&p->model, L, s, 0, j, &p->work, &p->cluster, &o, samples, &own);
        CHECK(own.micro_s <= pace.micro_s * (1 + 1e-12));
        if (own.micro_s > most) most = own.micro_s;
        if (own.micro_s < least) least = own.micro_s;
    }
    CHECK(least < most);   /* the ranks' shares of the text and the predictions differ */
    plan_sim_mem m0, m1;
    CHECK_OK(plan_sim_memory(p, s->first_rank, &m0, err));
    CHECK_OK(plan_sim_memory(p, s->first_rank + s->tp, &m1, err));   /* sp rank 1 */
    CHECK_NEAR(m0.activations + m0.logits, m1.activations + m1.logits, 1e-12);
}

TEST(simulate_llm_context_parallel_ranks_run_at_the_group_pace)
{
    static plan_t p;
    CHECK_OK(cp_plan("vision:sp=2;llm:sp=2", 2, 0, 0, &p));
    check_pace(&p, PLAN_CP_ULYSSES);
    CHECK_OK(cp_plan("vision:dp=4;llm:sp=2,tp=2,seqpar=0", 4, 0, 0, &p));
    check_pace(&p, PLAN_CP_RING);
    CHECK_OK(cp_plan("vision:dp=2;llm:sp=2", 2, 3, 1, &p));
    check_pace(&p, PLAN_CP_RING);
}

/* Ring attention's passes, on a link of X seconds per step's exchange (two
 * messages, K and V: 2 (alpha + bytes / busbw)) that compute hides entirely
 * (overlap 1) or not at all (overlap 0): per layer, forward sp - 1 passes
 * behind the blocks' compute; backward sp - 1 passes of the blocks behind
 * their compute and sp of their gradients after it. */
TEST(simulate_ring_passes_and_their_overlap_match_hand_computation)
{
    static plan_t p;
    CHECK_OK(cp_plan("vision:dp=2;llm:sp=2", 2, 3, 1, &p));   /* 3 heads, 1 kv head: ring */
    int L = p.model.llm, layers = p.model.mod[L].layers, sp = 2;
    plan_module *s = &p.mod[L];
    s->recompute = PLAN_RECOMP_NONE;
    cost_pool *pool = &p.cluster.pool[s->pool];
    pool->intra = (cost_link){ 1e-9, 1e15 };   /* far below any kernel's time */
    plan_options o = plan_options_of(&p);
    o.target = PLAN_TARGET_DHP;
    double A = plan_act_wire_bytes(&o), samples = 1;   /* the K/V blocks' wire (bf16 under bf16 runs) */
    double bytes = A * samples * 32.0 / sp * 1 * p.model.mod[L].head_dim;   /* its 16 rows' K (1 kv head) */
    double X = 2 * (1e-9 + bytes / 1e15);
    plan_time none, all;
    pool->has_overlap = true;
    pool->overlap = 0;
    plan_stage_micro_time(&p.model, L, s, 0, &p.work, &p.cluster, &o, samples, &none);
    pool->overlap = 1;
    plan_stage_micro_time(&p.model, L, s, 0, &p.work, &p.cluster, &o, samples, &all);
    CHECK_NEAR(none.fwd_comm_s, layers * (sp - 1) * X, 1e-9);
    CHECK_NEAR(none.sp_comm_s, layers * ((sp - 1) * X + (2 * sp - 1) * X), 1e-9);
    CHECK_NEAR(all.fwd_comm_s, 0, 1e-9);
    CHECK_NEAR(all.sp_comm_s, layers * sp * X, 1e-9);
    CHECK_EQ_INT(none.fwd_syncs, layers * (sp - 1));
    CHECK_EQ_INT(none.bwd_syncs, layers * sp);
    /* selective recomputation re-runs the attention core: its forward passes again */
    s->recompute = PLAN_RECOMP_SELECTIVE;
    plan_time sel;
    pool->overlap = 0;
    plan_stage_micro_time(&p.model, L, s, 0, &p.work, &p.cluster, &o, samples, &sel);
    CHECK_NEAR(sel.sp_comm_s, none.sp_comm_s + layers * (sp - 1) * X, 1e-9);
    CHECK_EQ_INT(sel.bwd_syncs, layers * sp + layers * (sp - 1));
}
