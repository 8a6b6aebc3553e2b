/* The step simulator (planner/simulate.c): its walk, its prices and its pipelines
 * (what it hands out, memory, traces, the plan file: test_simulate_outputs.c). */
#include "tests/test.h"
#include "tests/test_simulate.h"
#include "tests/test_fixture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int test_sim_plan_layers(const char *spec, plan_placement pl, int gpus, int n_micro, int batch, int llm_layers,
                         plan_t *p)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    if (model_load("tiny-vl", &m, err) || cost_cluster_load("8xh100", &c, err)) return UTIL_EINVAL;
    if (llm_layers > 0) m.mod[m.llm].layers = llm_layers;
    plan_workload w = { .global_batch = batch, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 16 };
    int rc = plan_from_strategy(spec, &m, &c, &w, pl, gpus, n_micro, p, err);
    if (rc) fprintf(stderr, "test_sim_plan: %s: %s\n", spec, err);
    return rc;
}

int test_sim_plan(const char *spec, plan_placement pl, int gpus, int n_micro, int batch, plan_t *p)
{
    return test_sim_plan_layers(spec, pl, gpus, n_micro, batch, 0, p);
}

int test_sim_run(const char *spec, plan_placement pl, int gpus, int n_micro, int batch, plan_t *p,
                 plan_sim_result *r)
{
    int rc = test_sim_plan(spec, pl, gpus, n_micro, batch, p);
    if (rc) return rc;
    char err[UTIL_ERR_LEN];
    rc = plan_sim_run(p, NULL, r, err);
    if (rc) fprintf(stderr, "test_sim_run: %s: %s\n", spec, err);
    return rc;
}

int test_sim_case_plan(const test_sim_case *c, plan_t *p)
{
    return test_sim_plan(c->spec, c->pl, c->gpus, c->micro, c->batch, p);
}

/* Round-number costs: encoder forward 1 s, backward 2 s, LLM forward+backward
 * 3 s, gradient sync 0.5 s, norm 0.125 s, optimizer 0.25 s (encoder) / 1 s
 * (LLM), weight gather 0.375 s; activations travel 0.5 s, gradients 0.25 s. */
static plan_sim_cost round_cost(void *ctx, const plan_t *p, int rank, const plan_op *op)
{
    (void)ctx; (void)rank;
    plan_sim_cost c = { 0, 0, 0 };
    switch (op->kind) {
    case PLAN_OP_FORWARD: c.busy_s = 1; break;
    case PLAN_OP_BACKWARD: c.busy_s = 2; break;
    case PLAN_OP_FORWARD_BACKWARD: c.busy_s = 3; break;
    case PLAN_OP_GRAD_SYNC: c.comm_s = 0.5; break;
    case PLAN_OP_GRAD_NORM: c.comm_s = 0.125; break;
    case PLAN_OP_OPTIMIZER: c.busy_s = op->module == p->model.llm ? 1.0 : 0.25; break;
    case PLAN_OP_PARAM_GATHER: c.comm_s = 0.375; break;
    default: break;
    }
    return c;
}

static double round_msg(void *ctx, const plan_t *p, int src, int dst, double bytes)
{
    (void)ctx; (void)dst; (void)bytes;
    plan_coord cd;
    return plan_rank_coord(p, p->model.llm, src, &cd) ? 0.25 : 0.5;
}

static const plan_sim_op *path_op(const plan_sim_result *r, int i) { return &r->rank[r->path[i].rank].ops[r->path[i].op]; }

static const plan_sim_hooks round_hooks = { .op_cost = round_cost, .msg_seconds = round_msg };

/* 1 encoder rank + 1 LLM rank, 2 chunks of one micro-batch each; one
 * replica of each module, so no gradient sync.
 * encoder (rank 0): F0 S0 F1 S1 R0 B0 R1 B1 norm opt
 * LLM (rank 1):     RA0 X0 SG0 RA1 X1 SG1 norm opt
 *   enc F0 [0, 1], S0 at 1 -> arrives 1.5; F1 [1, 2], S1 at 2 -> channel free at 1.5, arrives 2.5
 *   llm RA0 [0, 1.5], X0 [1.5, 4.5], SG0 at 4.5 -> arrives 4.75
 *   llm RA1: arrived 2.5 < 4.5, no wait; X1 [4.5, 7.5], SG1 at 7.5 -> arrives 7.75; joins norm at 7.5
 *   enc R0 [2, 4.75], B0 [4.75, 6.75], R1 [6.75, 7.75], B1 [7.75, 9.75]
 *   norm: last to join is the encoder at 9.75 -> both [.., 9.875]
 *   enc opt [9.875, 10.125]; llm opt [9.875, 10.875]  => step 10.875 s
 * encoder busy 1+1+2+2+0.25 = 6.25, comm 0.25 (R0's message in flight 4.5..4.75) + 0.25 (R1)
 *   + 0.125 = 0.625, idle 10.875 - 6.875 = 4
 * LLM busy 3+3+1 = 7, comm 0.5 (RA0) + 0.125 = 0.625, idle 3.25
 * critical path: enc F0 S0, llm RA0 X0 SG0 RA1 X1 SG1, enc R1 B1 norm, llm opt. */
TEST(simulate_pipeline_matches_hand_computation)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan("vision:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 2, 2, 4, &p));
    CHECK_EQ_INT(p.mod[0].first_rank, 0);
    CHECK_EQ_INT(p.mod[1].first_rank, 1);
    plan_sim_result r;
    int rc = plan_sim_run(&p, &round_hooks, &r, err);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    CHECK_EQ_INT(r.rank[0].n_ops, 10);
    CHECK_EQ_INT(r.rank[1].n_ops, 8);
    CHECK(r.step_time_s == 10.875);
    CHECK(r.rank[0].busy_s == 6.25 && r.rank[0].comm_s == 0.625 && r.rank[0].idle_s == 4.0);
    CHECK(r.rank[1].busy_s == 7.0 && r.rank[1].comm_s == 0.625 && r.rank[1].idle_s == 3.25);
    CHECK(r.rank[0].ops[4].op.kind == PLAN_OP_RECV_GRAD && r.rank[0].ops[4].start_s == 2 && r.rank[0].ops[4].end_s == 4.75);
    CHECK(r.rank[1].ops[3].op.kind == PLAN_OP_RECV_ACT && r.rank[1].ops[3].end_s == 4.5);
    CHECK(r.rank[1].ops[6].op.kind == PLAN_OP_GRAD_NORM && r.rank[1].ops[6].begin_s == 9.75);
    static const struct { int rank; plan_op_kind kind; } want[] = {
        { 0, PLAN_OP_FORWARD }, { 0, PLAN_OP_SEND_ACT }, { 1, PLAN_OP_RECV_ACT }, { 1, PLAN_OP_FORWARD_BACKWARD },
        { 1, PLAN_OP_SEND_GRAD }, { 1, PLAN_OP_RECV_ACT }, { 1, PLAN_OP_FORWARD_BACKWARD }, { 1, PLAN_OP_SEND_GRAD },
        { 0, PLAN_OP_RECV_GRAD }, { 0, PLAN_OP_BACKWARD }, { 0, PLAN_OP_GRAD_NORM },
        { 1, PLAN_OP_OPTIMIZER },
    };
    int n = (int)(sizeof want / sizeof want[0]);
    CHECK_EQ_INT(r.n_path, n);
    for (int i = 0; i < n; i++) {
        CHECK_MSG(r.path[i].rank == want[i].rank && path_op(&r, i)->op.kind == want[i].kind,
                  "path[%d] = rank %d %s, want rank %d %s", i, r.path[i].rank, plan_op_name(path_op(&r, i)->op.kind),
                  want[i].rank, plan_op_name(want[i].kind));
    }
    CHECK(path_op(&r, 5)->op.chunk == 1 && path_op(&r, 8)->op.chunk == 1);
    plan_sim_free(&r);
}

/* Processors shared (cost_pool.speed) but never faster alone: the
 * time-ordered walk gives the plain walk's timeline op for op. */
TEST(simulate_shared_walk_with_unit_speeds_equals_the_walk)
{
    static plan_t p, q;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan("vision:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 2, 2, 4, &p));
    q = p;
    q.cluster.pool[0].n_speed = 2;
    q.cluster.pool[0].speed[0] = q.cluster.pool[0].speed[1] = 1;
    plan_sim_result a, b;
    CHECK_OK(plan_sim_run(&p, &round_hooks, &a, err));
    CHECK_OK(plan_sim_run(&q, &round_hooks, &b, err));
    CHECK(b.step_time_s == 10.875 && a.step_time_s == b.step_time_s);
    for (int r = 0; r < 2; r++) {
        CHECK(a.rank[r].busy_s == b.rank[r].busy_s && a.rank[r].comm_s == b.rank[r].comm_s);
        for (int i = 0; i < a.rank[r].n_ops; i++) {
            const plan_sim_op *x = &a.rank[r].ops[i], *y = &b.rank[r].ops[i];
            CHECK_MSG(x->start_s == y->start_s && x->begin_s == y->begin_s && x->end_s == y->end_s
                      && x->dep_rank == y->dep_rank && x->dep_op == y->dep_op,
                      "rank %d op %d (%s): [%g %g %g] vs [%g %g %g]", r, i, plan_op_name(x->op.kind),
                      x->start_s, x->begin_s, x->end_s, y->start_s, y->begin_s, y->end_s);
        }
    }
    CHECK_EQ_INT(a.n_path, b.n_path);
    plan_sim_free(&b);
    /* Half speed when two share, but each rank bound to a core of its own: nobody shares. */
    q.cluster.pool[0].speed[1] = 0.5;
    q.cluster.pool[0].has_sets = true;
    for (int i = 0; i < q.cluster.pool[0].gpus_per_node; i++) q.cluster.pool[0].set_of[i] = i;
    CHECK_OK(plan_sim_run(&q, &round_hooks, &b, err));
    CHECK(b.step_time_s == a.step_time_s && b.rank[0].busy_s == a.rank[0].busy_s);
    /* ... and both on one core: they share (the hand-computed 13.625 s below). */
    q.cluster.pool[0].set_of[1] = 0;
    plan_sim_free(&b);
    CHECK_OK(plan_sim_run(&q, &round_hooks, &b, err));
    CHECK(b.step_time_s == 13.625);
    plan_sim_free(&a);
    plan_sim_free(&b);
}

/* Two ranks computing at once on the pool's processors each run at half speed. */
static void share_half(cost_pool *pool)
{
    pool->n_speed = 2;
    pool->speed[0] = 1;
    pool->speed[1] = 0.5;
}

/* r's step time and the two ranks' busy times, exactly. */
#define CHECK_STEP_AND_BUSY(r, step, busy0, busy1)                                                              \
    CHECK_MSG((r).step_time_s == (step) && (r).rank[0].busy_s == (busy0) && (r).rank[1].busy_s == (busy1),     \
              "step %.17g, busy %.17g %.17g", (r).step_time_s, (r).rank[0].busy_s, (r).rank[1].busy_s)

/* The encoder -> LLM pipeline of two ranks (2 micro-batches of 2 samples) on
 * one node whose ranks share processors (share_half). */
static int shared_pipeline(plan_t *p)
{
    int rc = test_sim_plan("vision:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 2, 2, 4, p);
    if (rc == UTIL_OK) share_half(&p->cluster.pool[0]);
    return rc;
}

/* The pipeline above on one node whose ranks share processors: two ranks
 * computing at once each run at half speed (cost_pool.speed = {1, 0.5}):
 *   enc F0 [0, 1], S0 -> 1.5; F1 from 1: alone to 1.5, then with X0 at half speed -> 2.5, S1 -> 3.0
 *   llm RA0 ends 1.5; X0 from 1.5: half speed to 2.5 (0.5 done), alone -> 5.0, SG0 -> 5.25
 *   llm RA1 at 5.0, X1 from 5.0: alone to 5.25 (2.75 left), with B0 at half speed
 *   enc R0 ends 5.25, B0 [5.25, 9.25] at half speed; X1 then has 0.75 left alone -> 10.0, SG1 -> 10.25
 *   llm joins the norm at 10; enc R1 ends 10.25, B1 alone [10.25, 12.25]
 *   norm: last joins at 12.25 -> 12.375; optimizers together at half speed:
 *   enc 0.25 -> 12.875, then the LLM's last 0.75 alone -> 13.625  => step 13.625 s
 * busy: enc 1 + 1.5 + 4 + 2 + 0.5 = 9, llm 3.5 + 5 + 1.25 = 9.75. */
TEST(simulate_shared_processors_match_hand_computation)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(shared_pipeline(&p));
    plan_sim_result r;
    CHECK_MSG(plan_sim_run(&p, &round_hooks, &r, err) == UTIL_OK, "%s", err);
    CHECK_STEP_AND_BUSY(r, 13.625, 9, 9.75);
    CHECK(r.rank[0].ops[2].op.kind == PLAN_OP_FORWARD && r.rank[0].ops[2].end_s == 2.5);
    CHECK(r.rank[0].ops[5].op.kind == PLAN_OP_BACKWARD && r.rank[0].ops[5].start_s == 5.25 && r.rank[0].ops[5].end_s == 9.25);
    CHECK(r.rank[1].ops[4].op.kind == PLAN_OP_FORWARD_BACKWARD && r.rank[1].ops[4].start_s == 5.0 && r.rank[1].ops[4].end_s == 10.0);
    CHECK(r.rank[1].ops[7].op.kind == PLAN_OP_OPTIMIZER && r.rank[1].ops[7].end_s == 13.625);
    CHECK(r.rank[0].ops[9].op.kind == PLAN_OP_OPTIMIZER && r.rank[0].ops[9].end_s == 12.875);
    plan_sim_free(&r);
}

/* round_cost, with the LLM's forward+backward stopping 12 times for an
 * exchange: every 0.25 s of its compute. */
static plan_sim_cost syncing_cost(void *ctx, const plan_t *p, int rank, const plan_op *op)
{
    plan_sim_cost c = round_cost(ctx, p, rank, op);
    if (op->kind == PLAN_OP_FORWARD_BACKWARD) c.syncs = 12;
    return c;
}

/* The shared pipeline above with a handoff time (cost_pool.handoff_s) of
 * 1 s: computing together, the LLM (weight min(0.25, 1)) and the encoder
 * (min(inf, 1)) split the set's 2 x 0.5 by weight: 0.2 and 0.8.
 *   enc F0 [0, 1]; F1 alone to 1.5 (0.5 left), with X0 at 0.8 -> 2.125, S1 -> 2.625
 *   llm X0 from 1.5: 0.125 done by 2.125, 2.875 alone -> 5.0, SG0 -> 5.25
 *   llm X1 from 5.0: alone to 5.25 (2.75 left); enc B0 [5.25, 7.75] at 0.8,
 *   X1 0.5 done with it, 2.25 alone -> 10.0: the LLM's ops end as with even
 *   sharing (the processor does the same work), the encoder's earlier;
 *   then as before (no syncs in the optimizers)  => step 13.625 s
 * busy: enc 1 + 1.125 + 2.5 + 2 + 0.5 = 7.125, llm 3.5 + 5 + 1.25 = 9.75. */
TEST(simulate_shared_processors_with_handoff_match_hand_computation)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(shared_pipeline(&p));
    p.cluster.pool[0].handoff_s = 1;
    const plan_sim_hooks hooks = { .op_cost = syncing_cost, .msg_seconds = round_msg };
    plan_sim_result r;
    CHECK_MSG(plan_sim_run(&p, &hooks, &r, err) == UTIL_OK, "%s", err);
    CHECK_STEP_AND_BUSY(r, 13.625, 7.125, 9.75);
    CHECK(r.rank[0].ops[2].op.kind == PLAN_OP_FORWARD && r.rank[0].ops[2].end_s == 2.125);
    CHECK(r.rank[0].ops[5].op.kind == PLAN_OP_BACKWARD && r.rank[0].ops[5].start_s == 5.25 && r.rank[0].ops[5].end_s == 7.75);
    CHECK(r.rank[1].ops[1].op.kind == PLAN_OP_FORWARD_BACKWARD && r.rank[1].ops[1].end_s == 5.0);
    CHECK(r.rank[1].ops[4].op.kind == PLAN_OP_FORWARD_BACKWARD && r.rank[1].ops[4].end_s == 10.0);
    plan_sim_free(&r);
    /* Without syncs the handoff changes nothing: even sharing, 13.625 s and B0 [5.25, 9.25] as above. */
    CHECK_OK(plan_sim_run(&p, &round_hooks, &r, err));
    CHECK(r.step_time_s == 13.625 && r.rank[0].ops[5].end_s == 9.25);
    plan_sim_free(&r);
}

/* Tensor-parallel peers meet at every exchange inside an op: bound to
 * unequal processors (LLM rank 0 shares the encoder's core, rank 1 has one
 * of its own), they end each forward+backward together, at the shared one's
 * pace; without exchanges the lone one runs ahead. */
TEST(simulate_exchange_peers_advance_together)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan("vision:gpus=1;llm:gpus=2,tp=2,seqpar=0", PLAN_DISAGGREGATED, 3, 2, 4, &p));
    CHECK_EQ_INT(p.mod[p.model.llm].first_rank, 0);   /* the encoder is rank 2 */
    cost_pool *pool = &p.cluster.pool[0];
    share_half(pool);
    pool->has_sets = true;
    for (int i = 0; i < pool->gpus_per_node; i++) pool->set_of[i] = i;
    pool->set_of[2] = 0;
    const plan_sim_hooks syncing = { .op_cost = syncing_cost, .msg_seconds = round_msg };
    plan_sim_result a, b;
    int rc = plan_sim_run(&p, &syncing, &a, err);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    CHECK_OK(plan_sim_run(&p, &round_hooks, &b, err));
    int together = 0, ahead = 0;
    for (int i = 0; i < a.rank[1].n_ops; i++) {
        /* 0: shares a core, 1: alone */
        const plan_sim_op *x0 = &a.rank[0].ops[i], *x1 = &a.rank[1].ops[i], *y0 = &b.rank[0].ops[i], *y1 = &b.rank[1].ops[i];
        if (x1->op.kind != PLAN_OP_FORWARD_BACKWARD) continue;
        CHECK(x0->op.kind == PLAN_OP_FORWARD_BACKWARD);
        together += x1->end_s == x0->end_s && x0->end_s - x0->start_s > 3;
        ahead += y1->end_s - y1->start_s == 3 && y0->end_s > y1->end_s;
    }
    CHECK_EQ_INT(together, 2);
    CHECK_EQ_INT(ahead, 2);
    plan_sim_free(&a);
    plan_sim_free(&b);
}

/* The cost model counts the exchanges the executor makes: TP's two
 * all-reduces per block each way plus the LLM's ends (embedding, the loss's
 * two statistics forward; head gradient backward); under sequence
 * parallelism per block two all-gathers and two reduce-scatters forward,
 * four all-gathers (two output gradients, two re-gathered norms), two
 * reduce-scatters and the norms' partial gradients backward, and the ends'
 * gathers; Ulysses' four all-to-alls per block each way. */
TEST(simulate_ops_count_their_blocking_exchanges)
{
    static plan_t p;
    CHECK_OK(test_sim_plan("vision:gpus=2,sp=2;llm:gpus=2,tp=2", PLAN_DISAGGREGATED, 4, 2, 4, &p));
    int enc = p.model.llm == 0 ? 1 : 0, L = p.model.llm;
    int enc_layers = p.model.mod[enc].layers, llm_layers = p.model.mod[L].layers;
    plan_op f = { .kind = PLAN_OP_FORWARD, .module = enc, .samples = 2 };
    plan_op b = { .kind = PLAN_OP_BACKWARD, .module = enc, .samples = 2 };
    plan_op x = { .kind = PLAN_OP_FORWARD_BACKWARD, .module = L, .samples = 2 };
    plan_op o = { .kind = PLAN_OP_OPTIMIZER, .module = L };
    CHECK_EQ_INT(plan_sim_op_cost(&p, 0, &f).syncs, 4 * enc_layers);
    CHECK_EQ_INT(plan_sim_op_cost(&p, 0, &b).syncs, 4 * enc_layers);
    CHECK(p.mod[L].seq_parallel);
    CHECK_EQ_INT(plan_sim_op_cost(&p, 2, &x).syncs, (4 + 7) * llm_layers + 6);
    p.mod[L].seq_parallel = false;
    CHECK_EQ_INT(plan_sim_op_cost(&p, 2, &x).syncs, 4 * llm_layers + 4);
    CHECK_EQ_INT(plan_sim_op_cost(&p, 2, &o).syncs, 0);
    static plan_t q;
    CHECK_OK(test_sim_plan("vision:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 2, 2, 4, &q));
    CHECK_EQ_INT(plan_sim_op_cost(&q, 1, &x).syncs, 0);
}

/* The gradient norm's local pass is priced on the ranks that make it
 * (executor/run.c local_grad_sumsq): without ZeRO only the dp rank 0 sums
 * its modules' gradients (plan_time.norm_s, the 8-byte all-reduce after);
 * with ZeRO-1 every rank sums its shard, less than the whole. */
TEST(simulate_gradient_norm_is_priced_where_it_is_summed)
{
    static plan_t p, q;
    CHECK_OK(test_sim_plan("vision:gpus=2,dp=2,zero=0;llm:gpus=2,dp=2,zero=0", PLAN_COLOCATED, 2, 1, 4, &p));
    CHECK_OK(test_sim_plan("vision:gpus=2,dp=2,zero=1;llm:gpus=2,dp=2,zero=1", PLAN_COLOCATED, 2, 1, 4, &q));
    plan_options o;
    plan_options_default(&o);
    o.precision = p.precision;
    double whole = 0;
    for (int k = 0; k < p.n_modules; k++) {
        plan_time t;
        plan_module_time(&p.model, k, &p.mod[k], &p.work, &p.cluster, &o, &t);
        CHECK(t.norm_s > 0);
        whole += t.norm_s;
    }
    plan_op norm = { .kind = PLAN_OP_GRAD_NORM, .module = -1, .chunk = -1 };
    plan_sim_cost r0 = plan_sim_op_cost(&p, 0, &norm), r1 = plan_sim_op_cost(&p, 1, &norm);
    CHECK_MSG(r0.busy_s == whole && r1.busy_s == 0, "%g %g (want %g, 0)", r0.busy_s, r1.busy_s, whole);
    CHECK(r0.comm_s == r1.comm_s && r0.comm_s > 0);
    plan_sim_cost z0 = plan_sim_op_cost(&q, 0, &norm), z1 = plan_sim_op_cost(&q, 1, &norm);
    CHECK_MSG(z0.busy_s == z1.busy_s && z0.busy_s > 0 && z0.busy_s < whole, "%g %g (whole %g)", z0.busy_s, z1.busy_s, whole);
}

/* On one rank nothing waits: the step is the sum of the rank's op costs. */
TEST(simulate_colocated_one_rank_is_the_sum_of_its_ops)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan("", PLAN_COLOCATED, 1, 1, 3, &p));
    plan_sim_result r;
    CHECK_OK(plan_sim_run(&p, &round_hooks, &r, err));
    double sum = 0;
    for (int i = 0; i < r.rank[0].n_ops; i++) {
        plan_sim_cost c = round_cost(NULL, &p, 0, &r.rank[0].ops[i].op);
        sum += c.busy_s + c.comm_s;
    }
    /* 3 chunks of F, X, B, then the norm and the optimizers (one replica: no sync): 3 * 6 + 0.125 + 1.25 */
    CHECK(sum == 3 * 6.0 + 0.125 + 1.25);
    CHECK(r.step_time_s == sum);
    CHECK(r.rank[0].idle_s == 0);
    CHECK_EQ_INT(r.n_path, r.rank[0].n_ops);
    plan_sim_free(&r);
}

/* With the cost model on one GPU, the simulated step is the analytic one:
 * both add every micro-batch, the optimizer and nothing else. */
TEST(simulate_one_gpu_equals_the_analytic_model)
{
    static plan_t p;
    plan_sim_result r;
    CHECK_OK(test_sim_run("", PLAN_COLOCATED, 1, 1, 4, &p, &r));
    CHECK_NEAR(r.step_time_s, p.pred.step_time_s, 1e-12);
    CHECK(r.rank[0].busy_s > 0);
    plan_sim_free(&r);
}

/* The cost model prices the ops from plan_micro_time: an encoder forward and
 * backward add up to its micro-batch, an LLM op is its micro-batch. */
TEST(simulate_op_prices_come_from_the_cost_model)
{
    static plan_t p;
    CHECK_OK(test_sim_plan("vision:gpus=2,sp=2;llm:gpus=2,tp=2,seqpar=0", PLAN_DISAGGREGATED, 4, 2, 8, &p));
    plan_options o;
    plan_options_default(&o);
    o.precision = p.precision;
    plan_time t;
    plan_micro_time(&p.model, 0, &p.mod[0], &p.work, &p.cluster, &o, 4, &t);
    plan_op f = { PLAN_OP_FORWARD, 0, 0, 0, 4, 0, 0, false, -1 }, b = f, x = { PLAN_OP_FORWARD_BACKWARD, 1, 0, 0, 3, -1, 0, false, -1 };
    b.kind = PLAN_OP_BACKWARD;
    plan_sim_cost cf = plan_sim_op_cost(&p, 0, &f), cb = plan_sim_op_cost(&p, 0, &b);
    CHECK(cf.comm_s > 0);   /* Ulysses all-to-alls */
    CHECK_NEAR(cf.busy_s + cf.comm_s + cb.busy_s + cb.comm_s, t.micro_s, 1e-12);
    plan_time tl;
    plan_micro_time(&p.model, 1, &p.mod[1], &p.work, &p.cluster, &o, 3, &tl);
    plan_sim_cost cx = plan_sim_op_cost(&p, 2, &x);
    CHECK(cx.comm_s > 0);   /* TP all-reduces */
    CHECK_NEAR(cx.busy_s + cx.comm_s, tl.micro_s, 1e-12);
    /* a micro-batch of 4 costs more than one of 1 */
    plan_micro_time(&p.model, 0, &p.mod[0], &p.work, &p.cluster, &o, 1, &tl);
    CHECK(tl.micro_s < t.micro_s);
    /* messages: 16 merged rows of 64 bf16 values per sample */
    double bytes = 2.0 * 16 * 64 * 2;
    CHECK_NEAR(plan_sim_msg_seconds(&p, 0, 2, bytes),
               cost_p2p_time(&p.cluster, 0, 0, true, bytes), 1e-12);
    CHECK(plan_sim_msg_seconds(&p, 1, 1, bytes) == 0);
}

/* Invariants on multi-rank plans priced by the cost model. */
static void check_invariants(const plan_t *p)
{
    char err[UTIL_ERR_LEN];
    plan_sim_result r;
    int rc = plan_sim_run(p, NULL, &r, err);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    CHECK(r.step_time_s > 0);
    double norm_end = -1;
    for (int i = 0; i < r.world_size; i++) {
        const plan_sim_rank *rk = &r.rank[i];
        CHECK_NEAR(rk->busy_s + rk->comm_s + rk->idle_s, r.step_time_s, 1e-9);
        double t = 0;
        for (int j = 0; j < rk->n_ops; j++) {
            const plan_sim_op *o = &rk->ops[j];
            CHECK(o->start_s == t && o->begin_s >= o->start_s && o->end_s >= o->begin_s);
            CHECK(o->busy_s + o->comm_s <= o->end_s - o->start_s + 1e-12);
            t = o->end_s;
            if (o->op.kind == PLAN_OP_GRAD_NORM) {
                if (norm_end < 0) norm_end = o->end_s;
                CHECK(o->end_s == norm_end);   /* a collective ends together */
            }
        }
        CHECK(rk->mem.total > 0 && rk->mem.params > 0);
    }
    /* The critical path starts at 0, runs without gaps other than transfers, and ends the step. */
    CHECK(r.n_path > 0);
    CHECK(path_op(&r, 0)->start_s == 0);
    CHECK(path_op(&r, r.n_path - 1)->end_s == r.step_time_s);
    for (int i = 1; i < r.n_path; i++) {
        const plan_sim_op *a = path_op(&r, i - 1), *b = path_op(&r, i);
        CHECK_MSG(b->begin_s >= a->end_s - 1e-12, "path %d: begins %.9g before %.9g", i, b->begin_s, a->end_s);
        if (r.path[i].rank == r.path[i - 1].rank) CHECK(b->start_s == a->end_s);
    }
    plan_sim_free(&r);
}

TEST(simulate_invariants_on_pipelines_and_colocated_groups)
{
    static plan_t p;
    const test_sim_case cases[] = {
        { "vision:sp=2;llm:tp=2,seqpar=0", PLAN_COLOCATED, 2, 1, 4 },
        { "vision:dp=4;llm:tp=2,dp=2,seqpar=0", PLAN_COLOCATED, 4, 1, 8 },
        { "vision:gpus=1;llm:gpus=2,tp=2,seqpar=0", PLAN_DISAGGREGATED, 3, 4, 8 },
        { "vision:gpus=2,dp=2;llm:gpus=1", PLAN_DISAGGREGATED, 3, 2, 6 },
        { "vision:gpus=2,sp=2,mb=2;llm:gpus=2,dp=2,zero=1", PLAN_DISAGGREGATED, 4, 2, 8 },
        { "vision:gpus=4,dp=4,zero=1;llm:gpus=4,dp=2,tp=2,seqpar=0,zero=1", PLAN_DISAGGREGATED, 8, 4, 16 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(test_sim_case_plan(&cases[i], &p));
        int before = test_failed_now();
        check_invariants(&p);
        if (!before && test_failed_now()) { fprintf(stderr, "case %zu: %s\n", i, cases[i].spec); return; }
    }
    /* a frozen encoder only runs forward, ahead of the LLM */
    CHECK_OK(test_sim_plan("vision:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 2, 4, 8, &p));
    p.model.mod[0].frozen = true;
    check_invariants(&p);
    /* colocated, LLM micro-batches of 2 samples fed by 4 encoder replicas */
    CHECK_OK(test_sim_plan("vision:dp=4,mb=1;llm:dp=2,tp=2,seqpar=0,mb=2", PLAN_COLOCATED, 4, 1, 8, &p));
    check_invariants(&p);
    /* text-only samples: the encoder group idles to its optimizer */
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("tiny-vl", &m, err));
    CHECK_OK(cost_cluster_load("8xh100", &c, err));
    plan_workload w = { .global_batch = 4, .images_per_sample = 0, .text_tokens = 16 };
    CHECK_OK(plan_from_strategy("vision:gpus=1;llm:gpus=2,dp=2", &m, &c, &w, PLAN_DISAGGREGATED, 0, 2, &p, err));
    check_invariants(&p);
}

/* The hand-off bytes are the plan_handoff rows: every LLM rank receives its
 * samples' merged rows (16 per sample of 64 values, bf16) once per chunk. */
TEST(simulate_handoff_bytes_follow_the_segments)
{
    static plan_t p;
    plan_sim_result r;
    CHECK_OK(test_sim_run("vision:gpus=2,dp=2;llm:gpus=2,tp=2,seqpar=0", PLAN_DISAGGREGATED, 4, 2, 8, &p, &r));
    double row = 64 * plan_precision_bytes(p.precision).act;
    int L = p.model.llm;
    for (int rank = p.mod[L].first_rank; rank < p.mod[L].first_rank + p.mod[L].n_ranks; rank++) {
        double got = 0;
        for (int j = 0; j < r.rank[rank].n_ops; j++)
            if (r.rank[rank].ops[j].op.kind == PLAN_OP_RECV_ACT) got += r.rank[rank].ops[j].bytes;
        CHECK_NEAR(got, 8 * 16 * row, 1e-12);
    }
    /* gradients come back from llm tp rank 0 only */
    double sent = 0;
    for (int rank = p.mod[L].first_rank; rank < p.mod[L].first_rank + p.mod[L].n_ranks; rank++)
        for (int j = 0; j < r.rank[rank].n_ops; j++)
            if (r.rank[rank].ops[j].op.kind == PLAN_OP_SEND_GRAD) sent += r.rank[rank].ops[j].bytes;
    CHECK_NEAR(sent, 8 * 16 * row, 1e-12);
    plan_sim_free(&r);
}

/* ZeRO-1: the optimizer step is followed by the weight all-gather, a
 * collective of the dp group; ZeRO-0 steps locally. */
TEST(simulate_zero1_optimizer_synchronises_its_group)
{
    static plan_t p;
    plan_sim_result r;
    CHECK_OK(test_sim_run("vision:gpus=1;llm:gpus=2,dp=2,zero=1", PLAN_DISAGGREGATED, 3, 2, 4, &p, &r));
    int l0 = p.mod[1].first_rank, v = p.mod[0].first_rank;
    CHECK_EQ_INT(p.mod[1].zero, 1);
    const plan_sim_op *a = &r.rank[l0].ops[r.rank[l0].n_ops - 1], *b = &r.rank[l0 + 1].ops[r.rank[l0 + 1].n_ops - 1];
    CHECK(a->op.kind == PLAN_OP_PARAM_GATHER && b->op.kind == PLAN_OP_PARAM_GATHER);
    CHECK(a->end_s == b->end_s && a->comm_s > 0);
    CHECK(a[-1].op.kind == PLAN_OP_OPTIMIZER && a[-1].busy_s > 0 && a[-1].comm_s == 0);
    const plan_sim_op *e = &r.rank[v].ops[r.rank[v].n_ops - 1];
    CHECK(e->op.kind == PLAN_OP_OPTIMIZER && e->comm_s == 0 && e->busy_s > 0);
    CHECK_NEAR(e->end_s - e->start_s, e->busy_s, 1e-9);
    plan_sim_free(&r);
}

/* The LLM's stages at round costs, every other op free: forward 1 s,
 * backward 2 s, the last stage's forward+backward 3 s. */
static plan_sim_cost pipe_cost(void *ctx, const plan_t *p, int rank, const plan_op *op)
{
    (void)ctx; (void)rank;
    plan_sim_cost c = { 0, 0, 0 };
    if (op->module != p->model.llm) return c;
    if (op->kind == PLAN_OP_FORWARD) c.busy_s = 1;
    if (op->kind == PLAN_OP_BACKWARD) c.busy_s = 2;
    if (op->kind == PLAN_OP_FORWARD_BACKWARD) c.busy_s = 3;
    return c;
}

static double free_msg(void *ctx, const plan_t *p, int src, int dst, double bytes)
{
    (void)ctx; (void)p; (void)src; (void)dst; (void)bytes;
    return 0;
}

/* 1F1B's makespan with uniform stages (Narayanan et al., arXiv 2104.04473,
 * sec. 2.2): (m + pp - 1) (f + b) for m micro-batches on pp stages, the
 * bubble (pp - 1) (f + b). The schedule and the simulator give it exactly. */
TEST(simulate_pipeline_makespan_is_1f1b)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    const plan_sim_hooks hooks = { .op_cost = pipe_cost, .msg_seconds = free_msg };
    const int pps[] = { 2, 4 }, micros[] = { 2, 4, 8 };
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            char spec[96];
            snprintf(spec, sizeof spec, "vision:gpus=1;llm:gpus=%d,pp=%d,mb=1", pps[a], pps[a]);
            CHECK_OK(test_sim_plan_layers(spec, PLAN_DISAGGREGATED, 1 + pps[a], micros[b], 8, 8, &p));
            plan_sim_result r;
            CHECK_OK(plan_sim_run(&p, &hooks, &r, err));
            int pp = pps[a], M = 8;   /* 8 samples, one per micro-batch, whatever the chunks */
            CHECK_NEAR(r.step_time_s, (M + pp - 1) * 3.0, 1e-9);
            plan_sim_free(&r);
        }
}

/* The plan of `spec` for `m` on `cluster` (gpus GPUs, placed pl, n_micro
 * chunks where disaggregated), its closed form in *ev; checks that the
 * simulator's step is within 1% of it. */
static void check_closed_form_is_simulated(const char *cluster, const model_t *m, plan_workload w, const char *spec,
                                           plan_placement pl, int gpus, int n_micro, plan_eval *ev)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    cost_cluster c;
    CHECK_OK(cost_cluster_load(cluster, &c, err));
    CHECK_OK(plan_from_strategy(spec, m, &c, &w, pl, gpus, n_micro, &p, err));
    plan_options o = plan_options_of(&p);
    CHECK_OK(plan_evaluate(&p, &o, ev, err));
    plan_sim_result r;
    CHECK_OK(plan_sim_run(&p, NULL, &r, err));
    CHECK_MSG(fabs(r.step_time_s / p.pred.analytic_step_time_s - 1) < 0.01, "%s: simulated %.6f s, closed form %.6f s",
              spec, r.step_time_s, p.pred.analytic_step_time_s);
    plan_sim_free(&r);
}

/* Uneven stages: a 150k-token head makes the last stage the slowest, and
 * the 1F1B step is its m passes plus one of each other stage, not
 * (m + pp - 1) of the slowest (plan_chunk_units). The closed form and the
 * schedule the simulator walks, both at the cost model's prices, agree. */
TEST(simulate_uneven_pipeline_matches_the_closed_form)
{
    model_t m = test_llm("wide_head", "\"layers\": %d, \"hidden\": 512, \"heads\": 8, \"kv_heads\": 2, \"ffn\": 1536,"
                         " \"ffn_kind\": \"swiglu\", \"norm\": \"rmsnorm\", \"vocab\": 150000", 8);
    plan_eval ev;
    check_closed_form_is_simulated("8xh100", &m, (plan_workload){ .global_batch = 8, .text_tokens = 1024 },
                                   "llm:pp=4,mb=1", PLAN_COLOCATED, 4, 1, &ev);
    CHECK(ev.time[0].fill_s < 0.8 * ev.time[0].stage_max_s);   /* the head's stage paces it */
}

/* dp 4 x pp 4 on two nodes of 8: stages 0 and 1 share the first node, 2
 * and 3 the second, so of the boundaries (the last one the chunks' wrap
 * under interleaving) 0 and 2 stay in a node and 1 and 3 cross; a stage of
 * a whole node (tp 8) crosses at every boundary, a module of one node at
 * none. The closed form prices each boundary's hop on its own link, as the
 * simulator prices each message between the two ranks it joins. */
TEST(simulate_node_spanning_pipeline_matches_the_closed_form)
{
    plan_module s = { .dp = 4, .tp = 1, .sp = 1, .pp = 4 };
    const bool in_node[] = { true, false, true, false };
    for (int i = 0; i < 4; i++) CHECK(plan_stage_boundary_in_node(&s, 8, i) == in_node[i]);
    s.dp = 1, s.tp = 8;
    for (int i = 0; i < 4; i++) CHECK(!plan_stage_boundary_in_node(&s, 8, i));
    s.tp = 2;
    for (int i = 0; i < 4; i++) CHECK(plan_stage_boundary_in_node(&s, 8, i));

    model_t m = test_llm("deep", "\"layers\": %d, \"hidden\": 2048, \"heads\": 16, \"kv_heads\": 4, \"ffn\": 5632,"
                         " \"ffn_kind\": \"swiglu\", \"norm\": \"rmsnorm\", \"vocab\": 32000", 16);
    plan_workload w = { .global_batch = 32, .text_tokens = 4096 };
    plan_eval ev;
    check_closed_form_is_simulated("2x8xh100", &m, w, "llm:dp=4,pp=4,mb=1", PLAN_COLOCATED, 16, 1, &ev);
    check_closed_form_is_simulated("2x8xh100", &m, w, "llm:dp=4,pp=4,vp=2,mb=1", PLAN_COLOCATED, 16, 1, &ev);
}

/* Disaggregated, an encoder's backward of chunk c waits for the LLM's
 * gradient of it, which leaves the first stage no sooner than the pacing
 * stage has run chunks 0..c between one fill and one drain
 * (disaggregated_step): the encoder's last backward follows that, not the
 * chunk's own latency alone. Qwen2-Audio's 642M encoder on one GPU beside a
 * pipelined LLM, two chunks: the first plan 9.0% apart while the bound held
 * only for the step's end. */
TEST(simulate_disaggregated_pipeline_matches_the_closed_form)
{
    model_t m;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("qwen2-audio-7b", &m, err));
    plan_workload w = { .global_batch = 16, .text_tokens = 512, .audio_frames = 1500 };   /* 30 s, dhp's default */
    plan_eval ev;
    check_closed_form_is_simulated("2x8xh100", &m, w, "audio:gpus=1;llm:gpus=4,pp=4,mb=1", PLAN_DISAGGREGATED, 5, 2, &ev);
    w.global_batch = 4;
    check_closed_form_is_simulated("2x8xh100", &m, w, "audio:gpus=1;llm:gpus=4,tp=2,pp=2,vp=2,mb=1", PLAN_DISAGGREGATED, 5, 2,
                                   &ev);
}

/* Each disaggregated group reduces its gradients after its own last
 * backward, the LLM's beside the encoder's last backward; only the gradient
 * norm spans every rank, and the optimizer and the parameter all-gathers
 * follow it (plan_time_reduction_tail_s). Qwen2.5-VL 7B's LLM under ZeRO-1
 * over dp 2 beside a 4-GPU vision group, one chunk: 4.5% apart while the
 * whole tail waited for the last group's backward. */
TEST(simulate_disaggregated_reductions_overlap_the_other_groups)
{
    model_t m;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("qwen2.5-vl-7b", &m, err));
    plan_workload w = { .global_batch = 4, .images_per_sample = 1, .image_tokens = 4096, .text_tokens = 512 };
    plan_eval ev;
    check_closed_form_is_simulated("2x8xh100", &m, w, "vision:gpus=4;llm:gpus=4,dp=2,pp=2,vp=2,mb=1,zero=1",
                                   PLAN_DISAGGREGATED, 8, 1, &ev);
    CHECK(plan_time_reduction_tail_s(&ev.time[m.llm]) > 0);
}

/* Pipelines of every kind simulate without deadlock, each hop carrying
 * plan_stage_hop_bytes (the Megatron target's scattered over tp: 1/tp of
 * it); a tied LLM's stages sync their embedding. */
TEST(simulate_pipelines_run_to_the_end_and_price_their_hops)
{
    static plan_t p;
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("tiny-vl", &m, err));
    CHECK_OK(cost_cluster_load("8xh100", &c, err));
    m.mod[m.llm].layers = 4;
    m.mod[m.llm].tied_embeddings = true;
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 16 };
    const struct { const char *spec; plan_placement pl; int gpus, micro; } cases[] = {
        { "vision:gpus=2,pp=2;llm:gpus=4,pp=2,dp=2,zero=1", PLAN_DISAGGREGATED, 6, 4 },
        { "vision:gpus=1;llm:gpus=4,pp=4,mb=2", PLAN_DISAGGREGATED, 5, 2 },
        { "vision:pp=2,dp=2;llm:pp=4", PLAN_COLOCATED, 4, 1 },
        { "vision:dp=4;llm:pp=2,tp=2,seqpar=1", PLAN_COLOCATED, 4, 1 },
    };
    plan_options o = { 0 };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = plan_from_strategy(cases[i].spec, &m, &c, &w, cases[i].pl, cases[i].gpus, cases[i].micro, &p, err);
        CHECK_MSG(rc == UTIL_OK, "%s: %s", cases[i].spec, err);
        if (rc) continue;
        o = plan_options_of(&p);
        plan_sim_result r;
        rc = plan_sim_run(&p, NULL, &r, err);
        CHECK_MSG(rc == UTIL_OK, "%s: %s", cases[i].spec, err);
        if (rc) continue;
        CHECK(r.step_time_s > 0);
        int hops = 0, syncs = 0;
        for (int q = 0; q < r.world_size; q++)
            for (int j = 0; j < r.rank[q].n_ops; j++) {
                const plan_sim_op *op = &r.rank[q].ops[j];
                syncs += op->op.kind == PLAN_OP_EMBED_SYNC;
                if (op->op.kind != PLAN_OP_SEND_STAGE && op->op.kind != PLAN_OP_RECV_STAGE_GRAD) continue;
                hops++;
                int k = op->op.module;
                CHECK_NEAR(op->bytes, plan_stage_hop_bytes(&p.model, k, &p.mod[k], &p.work, &o, op->op.samples), 1e-9);
            }
        CHECK(hops > 0);
        /* the LLM's first and last stage in each of its dp x tp pipelines */
        CHECK_EQ_INT(syncs, 2 * p.mod[p.model.llm].dp * p.mod[p.model.llm].tp);
        plan_sim_free(&r);
    }
    /* the Megatron target scatters a hop over tp without sequence parallelism
     * (plan_stage_hop_wire): each rank's message carries 1/tp of the rows */
    CHECK_OK(plan_from_strategy("vision:dp=4;llm:pp=2,tp=2,seqpar=0", &m, &c, &w, PLAN_COLOCATED, 4, 1, &p, err));
    p.target = PLAN_TARGET_MEGATRON;
    o = plan_options_of(&p);
    plan_sim_result r;
    CHECK_OK(plan_sim_run(&p, NULL, &r, err));
    int k = p.model.llm, hops = 0;
    double rows = plan_stage_hop_bytes(&p.model, k, &p.mod[k], &p.work, &o, p.mod[k].micro_batch);
    for (int q = 0; q < r.world_size; q++)
        for (int j = 0; j < r.rank[q].n_ops; j++) {
            const plan_sim_op *op = &r.rank[q].ops[j];
            if (op->op.kind != PLAN_OP_SEND_STAGE || op->op.module != k) continue;
            hops++;
            CHECK_NEAR(op->bytes, rows / 2, 1e-9);
        }
    CHECK(hops > 0);
    plan_sim_free(&r);
}
