/* TransformerEngine's userbuffers TP overlap (--tp-comm-overlap,
 * plan_options.tp_comm_overlap; the Megatron target only): each
 * sequence-parallel collective of a block priced beside its linear's GEMM
 * by TE's default method (planner/cost_tp.c), what it needs (seqpar over
 * tp > 1), the refusals and the plan file. Expected figures worked out beside each
 * check from the formulas they test. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

#include <math.h>
#include <string.h>

/* Llama-like: 2 blocks, hidden 4096, 32 heads of 128 over 8 kv heads, SwiGLU 14336. */
static model_t llama(void)
{
    return test_llm("llama", "\"layers\": 2, \"hidden\": 4096, \"heads\": 32, \"kv_heads\": 8, \"ffn\": 14336,"
                    " \"ffn_kind\": \"swiglu\", \"norm\": \"rmsnorm\", \"vocab\": 1000");
}

static plan_options overlap_options(bool on)
{
    plan_options o = test_megatron_autocast();
    o.tp_comm_overlap = on;
    return o;
}

static const plan_module TP4 = { .dp = 2, .tp = 4, .sp = 1, .pp = 1, .zero = 1, .micro_batch = 1, .n_ranks = 8,
                                 .seq_parallel = true };

/* One micro-batch of t = 8192 tokens on TP4 of one H100 node, without the
 * overlap (*a) and with it (*b), under TP style `style`. */
static void micro_without_and_with(const model_t *m, const cost_cluster *c, plan_tp_style style, plan_time *a,
                                   plan_time *b)
{
    plan_workload w = { .global_batch = 2, .text_tokens = 8192 };
    plan_options off = overlap_options(false), on = overlap_options(true);
    off.tp_style = on.tp_style = style;
    plan_micro_time(m, 0, &TP4, &w, c, &off, 1, a);
    plan_micro_time(m, 0, &TP4, &w, c, &on, 1, b);
}

/* One block's overlapped collectives on t = 8192 rows, worked out from
 * TE's methods: ring_exchange, the GEMM in tp chunks of t / tp rows beside
 * the all-gather's tp - 1 steps; pipeline, the GEMM in 4 chunks on 132 - 16
 * SMs, then the last quarter of the reduce-scatter; bulk, max(comm, gemm +
 * comm x 16 / 132). The blocks' GEMMs themselves do not change. */
TEST(tp_overlap_prices_each_collective_beside_its_gemm)
{
    model_t m = llama();
    cost_cluster c = test_cluster_load("8xh100");
    const cost_gpu *g = &c.pool[0].gpu;
    plan_time a, b;
    micro_without_and_with(&m, &c, PLAN_TP_MEGATRON, &a, &b);
    CHECK(a.fwd_s == b.fwd_s && a.bwd_s == b.bwd_s && a.pace.gemm_s == b.pace.gemm_s);
    CHECK(a.fwd_syncs == b.fwd_syncs && a.bwd_syncs == b.bwd_syncs);   /* the same collectives, hidden */
    CHECK(b.tp_comm_s > 0 && b.tp_comm_s < 0.5 * a.tp_comm_s);

    double t = 8192, h = 4096, A = 2, sms = g->sm_count;
    double ag = cost_collective_time(&c.pool[0], COST_ALLGATHER, A * t * h, 4, 4);
    double rs = cost_collective_time(&c.pool[0], COST_REDUCESCATTER, A * t * h, 4, 4);
    double qkv = (32 + 2 * 8) * 128 / 4, attn = 32 * 128 / 4, fc1 = 2 * 14336 / 4, fc2 = 14336 / 4;
#define G(m_, n_, k_) cost_gemm_time_in(g, COST_MATH_BF16, (m_), (n_), (k_))
#define RING(m_, n_, k_) (G((m_) / 4, n_, k_) + 3 * fmax(G((m_) / 4, n_, k_), ag / 3) - G(m_, n_, k_))
#define PIPE(m_, n_, k_) (G((m_) / 4, n_, k_) * sms / (sms - 16) + 3 * fmax(G((m_) / 4, n_, k_) * sms / (sms - 16), rs / 4) \
                          + rs / 4 - G(m_, n_, k_))
#define BULK(comm, m_, n_, k_) (fmax(comm, G(m_, n_, k_) + (comm) * 16 / sms) - G(m_, n_, k_))
    double fwd = RING(t, qkv, h) + PIPE(t, h, attn) + RING(t, fc1, h) + PIPE(t, h, fc2);
    double bwd = RING(t, attn, h) + RING(t, fc2, h) + BULK(ag, t, h, qkv) + BULK(ag, t, h, fc1)
               + BULK(rs, h, qkv, t) + BULK(rs, h, fc1, t);
#undef G
#undef RING
#undef PIPE
#undef BULK
    /* two blocks, against their collectives exposed (2 all-gathers and 2
     * reduce-scatters forward; backward 4 and 2, and the norms' sum alike);
     * the LLM's ends (the head's gather, the loss's sums) as they were */
    double raw = 6 * ag + 4 * rs;
    CHECK(fabs((a.tp_comm_s - b.tp_comm_s) - 2 * (raw - fwd - bwd)) < 1e-9 * a.tp_comm_s);
}

/* Megatron's overlap needs sequence parallelism over tp > 1 ranks: without
 * it the flag changes nothing; the dhp target and DTensor TP refuse it. */
TEST(tp_overlap_needs_sequence_parallelism_and_the_megatron_target)
{
    model_t m = llama();
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 2, .text_tokens = 8192 };
    plan_options off = overlap_options(false), on = overlap_options(true);
    plan_module nosp = TP4;
    nosp.seq_parallel = false;
    plan_time a, b;
    plan_micro_time(&m, 0, &nosp, &w, &c, &off, 1, &a);
    plan_micro_time(&m, 0, &nosp, &w, &c, &on, 1, &b);
    CHECK(a.tp_comm_s == b.tp_comm_s && a.micro_s == b.micro_s);
    CHECK(plan_tp_overlaps(&m.mod[0], &TP4, &on) && !plan_tp_overlaps(&m.mod[0], &nosp, &on));
    CHECK(!plan_tp_overlaps(&m.mod[0], &TP4, &off));

    char err[UTIL_ERR_LEN];
    CHECK(plan_tp_comm_overlap_check(&on, err) == UTIL_OK && plan_tp_comm_overlap_check(&off, err) == UTIL_OK);
    plan_options dhp = on;
    dhp.target = PLAN_TARGET_DHP;
    CHECK(plan_tp_comm_overlap_check(&dhp, err) == UTIL_EINVAL && strstr(err, "use --target megatron"));
    plan_options dt = on;
    dt.tp_style = PLAN_TP_DTENSOR;   /* torchtitan's async TP */
    CHECK(plan_tp_comm_overlap_check(&dt, err) == UTIL_OK && plan_tp_overlaps(&m.mod[0], &TP4, &dt));
}

/* torchtitan's async TP (--tp-style dtensor): the forward's four pairs as
 * ring exchanges, each all-gather with its local shard's copy into symmetric
 * memory (t / tp rows), each reduce-scatter with its final sum of the tp
 * partial chunks (read t x n, write t x n / tp); backward the two output
 * gradients' all-gathers fused with the input-gradient GEMMs, the two
 * input-gradient reduce-scatters exposed with DTensor's layout copy, as
 * without the overlap. */
TEST(tp_overlap_async_tp_under_dtensor)
{
    model_t m = llama();
    cost_cluster c = test_cluster_load("8xh100");
    const cost_gpu *g = &c.pool[0].gpu;
    plan_time a, b;
    micro_without_and_with(&m, &c, PLAN_TP_DTENSOR, &a, &b);
    CHECK(a.fwd_s == b.fwd_s && a.bwd_s == b.bwd_s && b.tp_comm_s < a.tp_comm_s);
    double t = 8192, h = 4096, A = 2;
    double ag = cost_collective_time(&c.pool[0], COST_ALLGATHER, A * t * h, 4, 4);
    double rs = cost_collective_time(&c.pool[0], COST_REDUCESCATTER, A * t * h, 4, 4);
    double copy = cost_elementwise_time(g, COST_EW_COPY, t * h, A);   /* DTensor's torch.cat */
    double shard = cost_elementwise_time(g, COST_EW_COPY, t / 4 * h, A);
    double qkv = (32 + 2 * 8) * 128 / 4, attn = 32 * 128 / 4, fc1 = 2 * 14336 / 4, fc2 = 14336 / 4;
#define G(m_, n_, k_) cost_gemm_time_in(g, COST_MATH_BF16, (m_), (n_), (k_))
#define RING(m_, n_, k_, c_) (G((m_) / 4, n_, k_) + 3 * fmax(G((m_) / 4, n_, k_), (c_) / 3) - G(m_, n_, k_))
#define SUM(n_) cost_elementwise_time(g, COST_EW_COPY, t * (n_) * (1 + 0.25) / 2, A)
    double fwd = RING(t, qkv, h, ag) + shard + RING(t, h, attn, rs) + SUM(h) + RING(t, fc1, h, ag) + shard
               + RING(t, h, fc2, rs) + SUM(h);
    double bwd = RING(t, attn, h, ag) + shard + RING(t, fc2, h, ag) + shard + 2 * (rs + copy);
#undef G
#undef RING
#undef SUM
    /* without: forward 2 (all-gather + copy) + 2 (reduce-scatter + copy); backward the same (no re-gathers) */
    double raw = 4 * (ag + copy) + 4 * (rs + copy);
    CHECK(fabs((a.tp_comm_s - b.tp_comm_s) - 2 * (raw - fwd - bwd)) < 1e-9 * a.tp_comm_s);
}

/* Memory: TransformerEngine's ten userbuffers of the micro-batch's whole
 * rows [t, h] (not divided by tp), bf16: 10 x 2 B = 20 B a row element; under
 * TE's FP8 recipes the six all-gathers' are FP8: 6 x 1 + 4 x 2 = 14 B. Async
 * TP's symmetric memory instead: two output chunks of t / tp rows. */
TEST(tp_overlap_userbuffers_memory)
{
    model_t m = llama();
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 2, .text_tokens = 8192 };
    plan_options off = overlap_options(false), on = overlap_options(true), fp8 = on;
    fp8.fp8 = PLAN_FP8_DELAYED;
    plan_mem a, b, f;
    plan_module_memory(&m, 0, &TP4, &w, &c.pool[0].gpu, &off, 1, &a);
    plan_module_memory(&m, 0, &TP4, &w, &c.pool[0].gpu, &on, 1, &b);
    plan_module_memory(&m, 0, &TP4, &w, &c.pool[0].gpu, &fp8, 1, &f);
    double rows = 8192.0 * 4096;
    CHECK(b.comm - a.comm == 20 * rows);
    CHECK(b.activations == a.activations && b.params == a.params);
    plan_options fp8_off = fp8;
    fp8_off.tp_comm_overlap = false;
    plan_module_memory(&m, 0, &TP4, &w, &c.pool[0].gpu, &fp8_off, 1, &a);
    CHECK(f.comm - a.comm == 14 * rows);
    /* torchtitan's async TP: the symmetric-memory workspace, two chunks of rows / tp at 2 B */
    plan_options dt_off = off, dt_on = on;
    dt_off.tp_style = dt_on.tp_style = PLAN_TP_DTENSOR;
    plan_module_memory(&m, 0, &TP4, &w, &c.pool[0].gpu, &dt_off, 1, &a);
    plan_module_memory(&m, 0, &TP4, &w, &c.pool[0].gpu, &dt_on, 1, &b);
    CHECK(b.comm - a.comm == 2 * 2 * rows / 4);
}

/* Kept in the plan file (and left out of it when off); a faster plan. */
TEST(tp_overlap_plan_file)
{
    model_t m = llama();
    cost_cluster c = test_cluster_load("8xh100");
    plan_workload w = { .global_batch = 8, .text_tokens = 8192 };
    char err[UTIL_ERR_LEN];
    plan_t plain, ub, back;
    plan_options o = overlap_options(false);
    const char *strategy = "llm:tp=4,dp=2,zero=1,seqpar=1";
    CHECK(plan_from_strategy_opts(strategy, &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &plain, err) == UTIL_OK);
    o.tp_comm_overlap = true;
    CHECK(plan_from_strategy_opts(strategy, &m, &c, &w, PLAN_COLOCATED, 8, 1, &o, &ub, err) == UTIL_OK);
    CHECK(ub.pred.step_time_s < plain.pred.step_time_s);
    CHECK(!test_plan_json_has(&plain, "tp_comm_overlap") && test_plan_json_has(&ub, "tp_comm_overlap"));
    CHECK(test_plan_json_round_trip(&ub, &back, err) == UTIL_OK);
    CHECK(back.tp_comm_overlap && plan_options_of(&back).tp_comm_overlap);
    CHECK(fabs(back.pred.step_time_s - ub.pred.step_time_s) <= 1e-9 * ub.pred.step_time_s);
}
