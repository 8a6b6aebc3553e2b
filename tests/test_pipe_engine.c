/* The Megatron target's pipeline engine (--pipe-engine, plan_options.pipe_engine):
 * Megatron-LM's 1F1B, or DeepSpeed's PipelineEngine, whose sends block the
 * sender, whose gradient goes whole up to v0.5.3 (deepspeed-2021) and
 * partitioned after (deepspeed, one more all-gather on arrival), and whose
 * gradient reduction runs after the flush. Expected figures worked out
 * beside each check. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

#include <string.h>

/* A 4-layer GPT of width 1024, 16 heads. */
static model_t gpt(void)
{
    return test_llm("gpt", "\"layers\": 4, \"hidden\": 1024, \"heads\": 16, \"ffn\": 4096, \"ffn_kind\": \"gelu\","
                    " \"norm\": \"layernorm\", \"vocab\": 1000");
}

static plan_options engine(plan_pipe_engine e)
{
    plan_options o;
    plan_options_default(&o);   /* the Megatron target */
    o.pipe_engine = e;
    return o;
}

/* tp 4, pp 2 in one node: a hop is one sample's bf16 rows, 2 x 256 x 1024
 * bytes; scattered, each tp rank sends a quarter and a tp all-gather of the
 * whole rebuilds it. */
TEST(pipe_engine_deepspeed_hops_hold_the_sender_and_send_gradients_as_the_version_did)
{
    model_t m = gpt();
    cost_cluster c = test_cluster_load("8xa100-80g");
    const cost_pool *pool = &c.pool[0];
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    plan_module s = { .dp = 1, .tp = 4, .sp = 1, .pp = 2, .micro_batch = 1, .n_ranks = 8 };
    plan_options meg = engine(PLAN_PIPE_MEGATRON), ds21 = engine(PLAN_PIPE_DEEPSPEED_2021), ds = engine(PLAN_PIPE_DEEPSPEED);
    double bytes = plan_stage_hop_bytes(&m, 0, &s, &w, &meg, 1);
    CHECK_NEAR(bytes, 2.0 * 256 * 1024, 1e-9);
    double gather = cost_collective_time(pool, COST_ALLGATHER, bytes, 4, 4);
    CHECK(gather > 0);
    struct { const plan_options *o; bool grad; double wire, gathers; bool held; } want[] = {
        { &meg, false, bytes / 4, 1, false }, { &meg, true, bytes / 4, 1, false },
        { &ds21, false, bytes / 4, 1, true }, { &ds21, true, bytes, 1, true },   /* the gradient whole; the output rebuilt */
        { &ds, false, bytes / 4, 1, true }, { &ds, true, bytes / 4, 2, true },     /* the gradient and the output rebuilt */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        plan_hop_wire h = plan_stage_hop_wire(&m.mod[0], &s, pool, want[i].o, bytes, want[i].grad);
        CHECK_NEAR(h.wire_bytes, want[i].wire, 1e-9);
        CHECK_NEAR(h.gather_s, want[i].gathers * gather, 1e-15);
        CHECK(h.held == want[i].held);
        plan_hop_time t = plan_stage_hop_time(&m, 0, &s, &w, &c, want[i].o, 1, want[i].grad, true);
        double p2p = cost_p2p_time(&c, 0, 0, true, want[i].wire);
        CHECK_NEAR(t.recv_s, p2p + want[i].gathers * gather, 1e-15);
        CHECK_NEAR(t.send_s, want[i].held ? p2p : 0, 1e-15);
    }
    /* A stage's hops: the first stage sends each activation and receives its
     * gradient, the last receives the activation and sends the gradient back;
     * the head's stage paces. */
    plan_time tm, td;
    plan_micro_time(&m, 0, &s, &w, &c, &meg, 1, &tm);
    plan_micro_time(&m, 0, &s, &w, &c, &ds21, 1, &td);
    plan_hop_time mf = plan_stage_hop_time(&m, 0, &s, &w, &c, &meg, 1, false, true);
    plan_hop_time mb = plan_stage_hop_time(&m, 0, &s, &w, &c, &meg, 1, true, true);
    plan_hop_time df = plan_stage_hop_time(&m, 0, &s, &w, &c, &ds21, 1, false, true);
    plan_hop_time db = plan_stage_hop_time(&m, 0, &s, &w, &c, &ds21, 1, true, true);
    plan_pipeline_hops hm, hd;
    plan_pipeline_hops_of(&m, 0, &s, &w, &c, &meg, 1, &hm);
    plan_pipeline_hops_of(&m, 0, &s, &w, &c, &ds21, 1, &hd);
    CHECK_NEAR(hm.stage_s[0], mf.send_s + mb.recv_s, 1e-15);
    CHECK_NEAR(hm.stage_s[1], mf.recv_s + mb.send_s, 1e-15);
    CHECK_NEAR(hd.stage_s[0], df.send_s + db.recv_s, 1e-15);
    CHECK_NEAR(hd.stage_s[1], df.recv_s + db.send_s, 1e-15);
    CHECK_NEAR(tm.pace.hop_s, hm.stage_s[1], 1e-15);
    CHECK_NEAR(td.pace.hop_s, hd.stage_s[1], 1e-15);
    CHECK_NEAR(td.stage_max_s - tm.stage_max_s, td.pace.hop_s - tm.pace.hop_s, 1e-12);
    /* the hops along the pipeline: one each way (pp - 1), the receivers' time */
    CHECK_NEAR(td.pp_p2p_s, df.recv_s + db.recv_s, 1e-15);
    /* sequence parallelism: the rows are already the rank's shard, nothing is
     * gathered, and DeepSpeed's sends still block */
    plan_module sp = s;
    sp.seq_parallel = true;
    plan_hop_wire h = plan_stage_hop_wire(&m.mod[0], &sp, pool, &ds21, bytes / 4, true);
    CHECK(h.wire_bytes == bytes / 4 && h.gather_s == 0 && h.held);
}

/* dp 2 x pp 2 x tp 2: Megatron-LM hides the gradient reduction behind the
 * last backward (o.overlap of a stage's backward), DeepSpeed's engine runs it
 * after the flush, beside nothing; without a pipeline the engine is not in
 * play. */
TEST(pipe_engine_deepspeed_reduces_gradients_after_the_flush)
{
    model_t m = gpt();
    cost_cluster c = test_cluster_load("8xa100-80g");
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    plan_module s = { .dp = 2, .tp = 2, .sp = 1, .pp = 2, .micro_batch = 1, .n_ranks = 8 };
    plan_options meg = engine(PLAN_PIPE_MEGATRON), ds = engine(PLAN_PIPE_DEEPSPEED);
    plan_time tm, td;
    plan_module_time(&m, 0, &s, &w, &c, &meg, &tm);
    plan_module_time(&m, 0, &s, &w, &c, &ds, &td);
    double comm = td.grad_sync_s + td.grad_sync_busy_s + td.param_gather_s + td.param_gather_busy_s;
    CHECK(comm > 0);
    CHECK_NEAR(td.dp_exposed_s, comm, 1e-15);
    CHECK_NEAR(tm.dp_exposed_s, plan_overlapped_comm_s(comm, meg.overlap * tm.bwd_s / 2, true), 1e-15);
    CHECK(td.dp_exposed_s > tm.dp_exposed_s);
    s.pp = 1;
    s.dp = 4;
    plan_module_time(&m, 0, &s, &w, &c, &meg, &tm);
    plan_module_time(&m, 0, &s, &w, &c, &ds, &td);
    CHECK_NEAR(td.dp_exposed_s, tm.dp_exposed_s, 1e-15);
}

/* Names round-trip through the plan file; the dhp target refuses a
 * DeepSpeed engine, and a plan with one refuses interleaving. */
TEST(pipe_engine_names_plan_file_and_refusals)
{
    plan_pipe_engine e;
    CHECK(plan_pipe_engine_parse("deepspeed-2021", &e, NULL) == UTIL_OK && e == PLAN_PIPE_DEEPSPEED_2021);
    CHECK(plan_pipe_engine_parse("deepspeed", &e, NULL) == UTIL_OK && e == PLAN_PIPE_DEEPSPEED);
    CHECK(plan_pipe_engine_parse("megatron", &e, NULL) == UTIL_OK && e == PLAN_PIPE_MEGATRON);
    CHECK(plan_pipe_engine_parse("gpipe", &e, NULL) == UTIL_EINVAL);
    CHECK(!strcmp(plan_pipe_engine_name(PLAN_PIPE_DEEPSPEED_2021), "deepspeed-2021"));
    char err[UTIL_ERR_LEN];
    plan_options o = engine(PLAN_PIPE_DEEPSPEED);
    CHECK(plan_pipe_engine_check(&o, err) == UTIL_OK);
    o.target = PLAN_TARGET_DHP;
    CHECK(plan_pipe_engine_check(&o, err) == UTIL_EINVAL && strstr(err, "--target megatron"));

    static plan_t p, back;
    model_t m = gpt();
    cost_cluster c = test_cluster_load("8xa100-80g");
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    o = engine(PLAN_PIPE_DEEPSPEED);
    CHECK_OK(plan_from_strategy_opts("llm:pp=2,tp=2,dp=2", &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &p, err));
    CHECK(p.pipe_engine == PLAN_PIPE_DEEPSPEED && test_plan_json_has(&p, "pipe_engine"));
    CHECK_OK(test_plan_json_round_trip(&p, &back, err));
    CHECK(back.pipe_engine == PLAN_PIPE_DEEPSPEED);
    p.mod[0].vp = 2;
    CHECK(plan_validate(&p, err) == UTIL_EINVAL && strstr(err, "interleaved"));
    p.pipe_engine = PLAN_PIPE_MEGATRON;
    CHECK_OK(plan_validate(&p, err));
    CHECK(!test_plan_json_has(&p, "pipe_engine"));
}

/* dhp simulate of the same pipeline: under DeepSpeed's engine each stage
 * send lasts until its transfer is across (at least the link's time for its
 * wire bytes; more where it queues behind the one before on its channel),
 * each receive at least its transfer and all-gathers,
 * the gradient's carrying the whole rows (deepspeed-2021); Megatron-LM's
 * sends take no time of the sender. */
TEST(pipe_engine_simulate_holds_deepspeed_senders)
{
    static plan_t p;
    model_t m = gpt();
    cost_cluster c = test_cluster_load("8xa100-80g");
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    char err[UTIL_ERR_LEN];
    double step[2];
    for (int e = 0; e < 2; e++) {
        plan_options o = engine(e ? PLAN_PIPE_DEEPSPEED_2021 : PLAN_PIPE_MEGATRON);
        CHECK_OK(plan_from_strategy_opts("llm:pp=2,tp=2,dp=2,seqpar=0", &m, &c, &w, PLAN_COLOCATED, 8, 4, &o, &p, err));
        plan_sim_result r;
        CHECK_OK(plan_sim_run(&p, NULL, &r, err));
        /* sends: the wire bytes, held for the transfer under DeepSpeed; receives
         * (DeepSpeed): held for the transfer and the all-gathers after it from
         * when posted, where Megatron-LM's waits only for a message not yet in */
        int sends = 0, recvs = 0;
        for (int q = 0; q < r.world_size; q++)
            for (int j = 0; j < r.rank[q].n_ops; j++) {
                const plan_sim_op *op = &r.rank[q].ops[j];
                const plan_op_info *in = plan_op_props(op->op.kind);
                if (in->group != PLAN_GROUP_STAGE || (!e && !in->sends)) continue;
                double rows = plan_stage_hop_bytes(&p.model, 0, &p.mod[0], &p.work, &o, op->op.samples);
                plan_hop_wire h = plan_stage_hop_wire(&p.model.mod[0], &p.mod[0], &c.pool[0], &o, rows, in->grad);
                CHECK_NEAR(h.wire_bytes, e && in->grad ? rows : rows / 2, 1e-9);
                double p2p = cost_p2p_time(&c, 0, 0, true, h.wire_bytes);
                if (in->sends) {
                    sends++;
                    CHECK_NEAR(op->bytes, h.wire_bytes, 1e-9);
                    if (e) CHECK(op->end_s - op->begin_s >= p2p * (1 - 1e-12));
                    else CHECK(op->end_s == op->begin_s);
                } else {
                    recvs++;
                    double posted = j > 0 ? r.rank[q].ops[j - 1].end_s : 0;   /* the rank's previous op's end */
                    CHECK(op->end_s - posted >= (p2p + h.gather_s) * (1 - 1e-12));
                }
            }
        CHECK(sends > 0 && (!e || recvs > 0));
        step[e] = r.step_time_s;
        plan_sim_free(&r);
    }
    CHECK(step[1] > step[0]);
}
