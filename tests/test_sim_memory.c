/* The dhp target's fits verdict is the run's memory rank by rank (the
 * simulator's, which t_run checks against the runs' allocations): the
 * encoder -> LLM hand-off's buffers and held messages, which no one module's
 * memory sees, count, in a plan's prediction and in the search. */
#include "tests/test.h"
#include "planner/planner.h"

#include <stdio.h>
#include <stdlib.h>

/* Qwen2.5-VL-32B, 16,384 vision tokens, batch 8, on 8 H100 of `hbm_gib` each. */
static int setup(double hbm_gib, model_t *m, cost_cluster *c, plan_workload *w, plan_options *o)
{
    char err[UTIL_ERR_LEN];
    if (model_load("qwen2.5-vl-32b", m, err) || cost_cluster_load("8xh100", c, err)) {
        fprintf(stderr, "%s\n", err);
        return UTIL_EINVAL;
    }
    c->pool[0].gpu.hbm_bytes = hbm_gib * 1024.0 * 1024.0 * 1024.0;
    *w = (plan_workload){ .global_batch = 8, .images_per_sample = 1, .image_tokens = 16384, .text_tokens = 512 };
    plan_options_default(o);
    o->target = PLAN_TARGET_DHP;
    return UTIL_OK;
}

/* dhp plan's default plan: 77.8 GiB a GPU by the module memory, 78.3 on
 * rank 0 with the hand-off (its buffers, and the rows and gradients sent
 * and not yet retired); on GPUs of 78 GiB the first fits and the run
 * does not. */
TEST(sim_memory_the_handoff_decides_a_plans_fit)
{
    static plan_t p;
    model_t m;
    cost_cluster c;
    plan_workload w;
    plan_options o;
    char err[UTIL_ERR_LEN];
    CHECK_OK(setup(78.0, &m, &c, &w, &o));
    CHECK_OK(plan_from_strategy_opts("vision:dp=2,sp=4,zero=3,rc=full;llm:tp=8,rc=full,mb=2", &m, &c, &w,
                                     PLAN_COLOCATED, 8, 1, &o, &p, err));
    CHECK(p.pred.fits);
    double modules = p.pred.peak_mem_bytes[0];
    CHECK_OK(plan_sim_predict(&p, err));
    CHECK(!p.pred.fits);
    plan_sim_mem r0;
    CHECK_OK(plan_sim_memory(&p, 0, &r0, err));
    CHECK_NEAR(p.pred.peak_mem_bytes[0], r0.total, 1e-12);
    CHECK_NEAR(p.pred.peak_mem_bytes[1], r0.total, 1e-12);   /* colocated: every rank holds both */
    CHECK(r0.total > modules + 0.25 * (1 << 30));             /* more than 256 MiB of hand-off on rank 0 */
}

/* The search cuts a plan the hand-off pushes out of memory and solves again:
 * every plan it returns fits rank by rank. */
TEST(sim_memory_the_search_returns_plans_that_fit_rank_by_rank)
{
    static plan_search_result r;
    model_t m;
    cost_cluster c;
    plan_workload w;
    plan_search_options so;
    char err[UTIL_ERR_LEN];
    plan_search_options_default(&so);
    CHECK_OK(setup(78.0, &m, &c, &w, &so.opt));
    so.top_k = 2;
    CHECK_OK(plan_search(&m, &c, &w, &so, &r, err));
    CHECK(r.n_plans >= 1);
    for (int i = 0; i < r.n_plans; i++) {
        CHECK(r.plans[i].pred.simulated && r.plans[i].pred.fits);
        for (int rank = 0; rank < r.plans[i].world_size; rank++) {
            plan_sim_mem mm;
            CHECK_OK(plan_sim_memory(&r.plans[i], rank, &mm, err));
            CHECK_MSG(mm.total <= mm.capacity, "plan %d rank %d: %.3g of %.3g bytes", i, rank, mm.total, mm.capacity);
        }
    }
}

/* A rank frees a hand-off send once an op marked to retire it runs
 * (plan_op.retires): what it holds is a few chunks' rows, not the step's.
 * The default plan at batch 64 (32 chunks) holds on every rank what it
 * holds at batch 8 (4 chunks); kept to the step's end, rank 0 would hold
 * 10.4 GiB at batch 64 (1.67 GiB at 8) and the plan would not fit. The
 * same with the vision encoder frozen, whose rows no gradient retires (its
 * next chunk's send does). */
TEST(sim_memory_the_handoff_held_does_not_grow_with_the_batch)
{
    static plan_t p8, p64;
    model_t m;
    cost_cluster c;
    plan_workload w;
    plan_options o;
    char err[UTIL_ERR_LEN];
    const char *strategy = "vision:dp=2,sp=4,zero=3,rc=full;llm:tp=8,rc=full,mb=2";
    CHECK_OK(setup(80, &m, &c, &w, &o));
    for (int frozen = 0; frozen < 2; frozen++) {
        m.mod[model_find(&m, "vision")].frozen = frozen;
        w.global_batch = 8;
        CHECK_OK(plan_from_strategy_opts(strategy, &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &p8, err));
        w.global_batch = 64;
        CHECK_OK(plan_from_strategy_opts(strategy, &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &p64, err));
        CHECK(plan_chunks(&p64) == 8 * plan_chunks(&p8));
        for (int rank = 0; rank < 8; rank++) {
            plan_sim_mem a, b;
            CHECK_OK(plan_sim_memory(&p8, rank, &a, err));
            CHECK_OK(plan_sim_memory(&p64, rank, &b, err));
            CHECK_NEAR(b.comm, a.comm, 1e-12);
            CHECK(b.comm < 1.0 * (1 << 30));
        }
        CHECK_OK(plan_sim_predict(&p64, err));
        CHECK(p64.pred.fits);
    }
}
