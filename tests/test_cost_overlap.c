/* The dhp target's price of the replicated and ZeRO-1 step reduction
 * (planner/cost_dp.c reduction_exposed), as executor/dp_overlap.c runs it:
 * one collective per unit, posted as the last micro-batch's backward
 * finishes the unit (the head first, the stem last). Checked at the ends
 * where the figure is worked out by hand: no backward to hide behind (every
 * collective exposed), a long backward beside which collectives keep their
 * full speed (only the stem's, posted after the backward, is left), and
 * collectives that make no progress beside the compute (all exposed). */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

#include <math.h>

static model_t gpt(void)
{
    return test_llm("gpt", "\"layers\": 3, \"hidden\": 512, \"heads\": 8, \"ffn\": 2048, \"vocab\": 1000");
}

typedef struct { double each[8], sum; int n; } unit_colls;

/* Every unit's collective alone on dp 8 of one node, as priced for the executor. */
static unit_colls colls_of(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o)
{
    unit_colls u = { .n = plan_module_units(mm) };
    int64_t units[8];
    plan_stage st = plan_stage_of(mm, s, 0);
    plan_unit_sizes(mm, s->tp, &st, units);
    double g = plan_module_state_bytes(mm, o).grad;
    for (int i = 0; i < u.n; i++) {
        double n = (double)units[i];
        u.each[i] = s->zero == 1 ? cost_collective_time(pool, COST_REDUCESCATTER, 8 * ceil(n / 8) * g, 8, 8)
                                 : cost_collective_time(pool, COST_ALLREDUCE, n * g, 8, 8);
        u.sum += u.each[i];
    }
    return u;
}

static double exposed(const model_module *mm, const plan_module *s, cost_pool *pool, const plan_options *o, double window,
                      double overlap)
{
    pool->has_overlap = true;
    pool->overlap = overlap;
    plan_time t = { 0 };
    plan_price_dp_step(mm, s, 0, pool, o, window, &t);
    return t.grad_sync_s;
}

TEST(dhp_step_reduction_hides_behind_the_last_backward_but_the_stem)
{
    model_t m = gpt();
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK(cost_cluster_load("8xh100", &c, err) == UTIL_OK);
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    for (int zero = 0; zero <= 1; zero++) {
        plan_module s = { .dp = 8, .tp = 1, .sp = 1, .pp = 1, .zero = zero, .micro_batch = 1, .n_ranks = 8 };
        cost_pool *pool = &c.pool[0];
        unit_colls u = colls_of(&m.mod[0], &s, pool, &o);
        CHECK(u.n == 5 && u.each[0] > 0 && u.sum > u.each[0]);
        /* no backward: every collective after it, one after another */
        CHECK_NEAR(exposed(&m.mod[0], &s, pool, &o, 0, 1), u.sum, 1e-12);
        /* a long backward, collectives at full speed beside it: the stem's alone is left */
        CHECK_NEAR(exposed(&m.mod[0], &s, pool, &o, 1e3, 1), u.each[0], 1e-6);
        /* collectives that do not progress beside compute: all of them */
        CHECK_NEAR(exposed(&m.mod[0], &s, pool, &o, 1e3, 0), u.sum, 1e-6);
        /* in between, the longer the backward the less is left, never below the stem's */
        double prev = u.sum + 1;
        for (double w = 0; w <= 16 * u.sum; w += u.sum / 4) {
            double e = exposed(&m.mod[0], &s, pool, &o, w, 0.5);
            CHECK(e <= prev + 1e-15 && e >= u.each[0] - 1e-15);
            prev = e;
        }
    }
}

/* The Megatron target's contention charge (planner/cost_dp.c
 * plan_overlapped_comm_s) reproduces both averages of Lee et al. (arXiv
 * 2507.03114) it is derived from: a run whose communication, 0.310 of its
 * compute, hides entirely has its compute 18.9% slower, and that step is
 * 10.2% faster than computing and communicating one after the other. Past
 * what the compute can hide, the rest is exposed at full price. */
TEST(megatron_overlap_contention_reproduces_lee_et_al_averages)
{
    double comp = 1.0, comm = (1.189 * 1.102 - 1.0) * comp;
    double step = comp + plan_overlapped_comm_s(comm, comp, true);
    CHECK_NEAR(step, 1.189 * comp, 1e-12);
    CHECK_NEAR((comp + comm) / step, 1.102, 1e-12);
    CHECK_NEAR(plan_overlapped_comm_s(comm, comp, false), 0.0, 1e-12);
    /* half of it hidden: the other half exposed, the contention on the half hidden */
    double half = plan_overlapped_comm_s(comm, comm / 2, true);
    CHECK_NEAR(half, comm / 2 + 0.189 * comp / 2, 1e-12);
}
