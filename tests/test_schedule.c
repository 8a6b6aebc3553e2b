/* The step schedule and the encoder -> LLM hand-off (planner/schedule.c). */
#include "tests/test.h"
#include "tests/test_simulate.h"
#include "planner/planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tiny-vl (its LLM with llm_layers blocks where > 0) on 8xh100. */
/* The ops of one rank as a string of letters (per-step ops y n o P;
 * pipeline hops T t (activations out, in) U u (gradients), embedding sync e). */
static void op_string(const plan_schedule *s, char *out)
{
    static const char letter[PLAN_NOPS] = { 'F', 'S', 'R', 'X', 'G', 'r', 'B', 'y', 'n', 'o', 'P', 'T', 't', 'U', 'u', 'e' };
    for (int i = 0; i < s->n; i++) out[i] = letter[s->op[i].kind];
    out[s->n] = 0;
}

TEST(schedule_disaggregated_encoder_runs_1f1b_two_chunks_ahead)
{
    static plan_t p;
    char err[UTIL_ERR_LEN], ops[256];
    CHECK_OK(test_sim_plan("vision:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 2, 4, 8, &p));
    plan_schedule s;
    CHECK_OK(plan_schedule_rank(&p, 0, &s, err));
    op_string(&s, ops);
    /* 4 chunks of 2 samples, one micro-batch each: forward + send, gradient + backward;
     * one replica: no gradient sync */
    CHECK_MSG(!strcmp(ops, "FSFSrBFSrBFSrBrBno"), "vision ops %s", ops);
    int chunk_of_first_recv = -1;
    for (int i = 0; i < s.n; i++)
        if (s.op[i].kind == PLAN_OP_RECV_GRAD && chunk_of_first_recv < 0) chunk_of_first_recv = s.op[i].chunk;
    CHECK_EQ_INT(chunk_of_first_recv, 0);
    CHECK_EQ_INT(s.op[s.n - 1].kind, PLAN_OP_OPTIMIZER);
    CHECK(s.slots[0] >= 2);
    plan_schedule_free(&s);
    CHECK_OK(plan_schedule_rank(&p, 1, &s, err));
    op_string(&s, ops);
    for (int i = 0; i < s.n; i++) CHECK(s.op[i].kind != PLAN_OP_FORWARD && s.op[i].kind != PLAN_OP_BACKWARD);
    CHECK_EQ_INT(s.op[0].kind, PLAN_OP_RECV_ACT);
    plan_schedule_free(&s);
}

/* Every sample of the step is run forward (and backward) exactly once per dp
 * replica of each module, whatever the dp split. */
static void check_sample_coverage(const plan_t *p)
{
    char err[UTIL_ERR_LEN];
    for (int k = 0; k < p->n_modules; k++) {
        int *seen = calloc((size_t)p->work.global_batch, sizeof(int));
        for (int r = 0; r < p->world_size; r++) {
            plan_coord cd;
            if (!plan_rank_coord(p, k, r, &cd) || cd.tp || cd.sp || cd.pp) continue;
            plan_schedule s;
            int rc = plan_schedule_rank(p, r, &s, err);
            CHECK_MSG(rc == UTIL_OK, "rank %d: %s", r, err);
            for (int i = 0; i < s.n; i++) {
                const plan_op *o = &s.op[i];
                bool compute = o->kind == PLAN_OP_FORWARD || o->kind == PLAN_OP_FORWARD_BACKWARD;
                if (o->module != k || !compute) continue;
                for (int j = o->sample0; j < o->sample0 + o->samples; j++) seen[j]++;
            }
            plan_schedule_free(&s);
        }
        for (int j = 0; j < p->work.global_batch; j++) CHECK_EQ_INT(seen[j], 1);
        free(seen);
    }
}

/* Each LLM rank's input rows of a chunk (its sp rank's share of each
 * sample's, plan_cp_encoder_rows, the shares adding up to the sample's) come
 * exactly once (from one of the encoder's tp ranks), each encoder rank's
 * packed rows get their gradient exactly once (from one of the LLM's tp
 * ranks), and a rank that holds both ends of a row takes it from itself. */
static void check_handoff(const plan_t *p)
{
    char err[UTIL_ERR_LEN];
    int L = p->model.llm, all = 0;
    for (int j = 0; j < p->mod[L].sp; j++) all += plan_cp_encoder_rows(p, 0, p->mod[L].first_rank + j * p->mod[L].tp);
    CHECK_EQ_INT(all, plan_rows_per_sample(p, 0));
    for (int c = 0; c < plan_chunks(p); c++) {
        plan_segment *sg;
        int n;
        CHECK_OK(plan_handoff(p, 0, c, &sg, &n, err));
        for (int r = 0; r < p->world_size; r++) {
            plan_coord lc;
            if (!plan_rank_coord(p, L, r, &lc) || lc.pp != 0) continue;   /* the LLM's first stage takes the rows */
            int f, cnt, R = plan_cp_encoder_rows(p, 0, r);
            plan_chunk_share(p, L, c, lc.dp, &f, &cnt);
            int *hit = calloc((size_t)cnt * R + 1, sizeof(int));
            for (int i = 0; i < n; i++)
                if (sg[i].llm_rank == r && sg[i].act)
                    for (int j = 0; j < sg[i].rows; j++) hit[sg[i].llm_off + j]++;
            for (int j = 0; j < cnt * R; j++) CHECK_EQ_INT(hit[j], 1);
            free(hit);
        }
        for (int r = 0; r < p->world_size; r++) {
            plan_coord ec;
            if (!plan_rank_coord(p, 0, r, &ec) || ec.pp != p->mod[0].pp - 1) continue;   /* the encoder's last stage sends them */
            int packed = 0, *grads = calloc((size_t)p->work.global_batch * plan_rows_per_sample(p, 0) + 1, sizeof(int));
            for (int i = 0; i < n; i++) {
                if (sg[i].enc_rank != r) continue;
                packed = packed > sg[i].enc_off + sg[i].rows ? packed : sg[i].enc_off + sg[i].rows;
                if (sg[i].grad) for (int j = 0; j < sg[i].rows; j++) grads[sg[i].enc_off + j]++;
                bool mine = false;   /* a row this rank also takes in as the LLM comes from here */
                for (int q = 0; q < n; q++) mine |= sg[q].enc_rank == r && sg[q].llm_rank == r;
                if (mine && sg[i].llm_rank == r) CHECK(sg[i].act && sg[i].grad);
            }
            for (int j = 0; j < packed; j++) CHECK_EQ_INT(grads[j], 1);
            free(grads);
        }
        for (int i = 1; i < n; i++) CHECK(sg[i - 1].enc_rank <= sg[i].enc_rank);
        util_free(sg);
    }
}

TEST(schedule_covers_every_sample_once_and_handoff_routes_every_row_once)
{
    static plan_t p;
    const test_sim_case cases[] = {
        { "vision:sp=2;llm:tp=2,seqpar=0", PLAN_COLOCATED, 2, 1, 4 },
        { "vision:dp=4;llm:tp=2,dp=2,seqpar=0", PLAN_COLOCATED, 4, 1, 8 },
        { "vision:gpus=1;llm:gpus=2,tp=2,seqpar=0", PLAN_DISAGGREGATED, 3, 2, 4 },
        { "vision:gpus=2,dp=2;llm:gpus=1", PLAN_DISAGGREGATED, 3, 2, 6 },
        { "vision:gpus=3,dp=3;llm:gpus=1,mb=2", PLAN_DISAGGREGATED, 4, 2, 8 },
        { "vision:gpus=2,sp=2,mb=2;llm:gpus=2,dp=2", PLAN_DISAGGREGATED, 4, 2, 8 },
        /* the LLM's context parallelism: Ulysses (sp rank 0 holds every encoder
         * row), ring attention (chunks 0 and 3 on rank 0: half of them each) */
        { "vision:sp=2;llm:sp=2", PLAN_COLOCATED, 2, 1, 4 },
        { "vision:gpus=1;llm:gpus=2,sp=2", PLAN_DISAGGREGATED, 3, 2, 4 },
        { "vision:gpus=2,dp=2;llm:gpus=4,sp=2,tp=2,seqpar=0", PLAN_DISAGGREGATED, 6, 2, 8 },
        { "vision:dp=4;llm:sp=2,dp=2", PLAN_COLOCATED, 4, 1, 8 },
        /* tp on both sides: a colocated rank takes its rows from itself */
        { "vision:tp=2;llm:tp=2,seqpar=0", PLAN_COLOCATED, 2, 1, 4 },
        { "vision:tp=2,dp=2;llm:dp=4", PLAN_COLOCATED, 4, 1, 8 },
        { "vision:gpus=2,tp=2;llm:gpus=4,tp=2,dp=2,seqpar=0", PLAN_DISAGGREGATED, 6, 2, 8 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(test_sim_case_plan(&cases[i], &p));
        check_sample_coverage(&p);
        check_handoff(&p);
    }
}

/* Whether rank r runs module 0's op of kind k and chunk c before (at an
 * index below) its op of kind k2 and chunk c2. */
static bool runs_before(const plan_t *p, int r, plan_op_kind k, int c, plan_op_kind k2, int c2)
{
    char err[UTIL_ERR_LEN];
    plan_schedule s;
    if (plan_schedule_rank(p, r, &s, err)) return false;
    int a = -1, b = -1;
    for (int i = 0; i < s.n; i++) {
        if (s.op[i].module != 0) continue;
        if (a < 0 && s.op[i].kind == k && s.op[i].chunk == c) a = i;
        if (b < 0 && s.op[i].kind == k2 && s.op[i].chunk == c2) b = i;
    }
    plan_schedule_free(&s);
    return a >= 0 && b >= 0 && a < b;
}

/* The ops that free hand-off sends (plan_op.retires) come after every
 * receiver took them: an encoder's RECV_GRAD of chunk c retires its chunk-c
 * rows; the LLM's RECV_ACT of chunk c retires the gradients of a chunk each
 * encoder rank received (RECV_GRAD) before it sent chunk c. A frozen
 * encoder's SEND_ACT of chunk c retires chunk c - 1, waiting for its
 * receivers: the simulator, which stops on a wait that never ends, walks
 * the schedule through. The last chunks' sends are never retired early. */
static void check_retires(plan_t *p, bool frozen)
{
    char err[UTIL_ERR_LEN];
    int retired = 0;
    for (int r = 0; r < p->world_size; r++) {
        plan_schedule s;
        CHECK_OK(plan_schedule_rank(p, r, &s, err));
        for (int i = 0; i < s.n; i++) {
            const plan_op *o = &s.op[i];
            if (o->kind == PLAN_OP_RECV_GRAD) CHECK_EQ_INT(o->retires, o->chunk);
            else if (o->kind == PLAN_OP_SEND_ACT) CHECK_EQ_INT(o->retires, frozen && o->chunk > 0 ? o->chunk - 1 : -1);
            else if (o->kind != PLAN_OP_RECV_ACT) CHECK_EQ_INT(o->retires, -1);
            else if (frozen) CHECK_EQ_INT(o->retires, -1);
            else if (o->retires >= 0) {
                retired++;
                CHECK(o->retires < o->chunk);
                for (int e = 0; e < p->world_size; e++) {
                    plan_coord ec;
                    if (!plan_rank_coord(p, 0, e, &ec) || ec.pp != p->mod[0].pp - 1) continue;
                    CHECK_MSG(runs_before(p, e, PLAN_OP_RECV_GRAD, o->retires, PLAN_OP_SEND_ACT, o->chunk),
                              "rank %d retires chunk %d's gradients at chunk %d; encoder rank %d", r, o->retires, o->chunk, e);
                }
            }
        }
        plan_schedule_free(&s);
    }
    CHECK(frozen || plan_chunks(p) < 3 || retired > 0);
    CHECK_MSG(plan_sim_predict(p, err) == UTIL_OK, "%s", err);
}

TEST(schedule_retires_handoff_sends_after_their_receivers_took_them)
{
    static plan_t p;
    const test_sim_case cases[] = {
        { "vision:sp=2;llm:tp=2,seqpar=0", PLAN_COLOCATED, 2, 1, 8 },
        { "vision:gpus=1;llm:gpus=2,tp=2,seqpar=0", PLAN_DISAGGREGATED, 3, 2, 8 },
        { "vision:gpus=2,dp=2;llm:gpus=2,pp=2", PLAN_DISAGGREGATED, 4, 2, 16 },
        { "vision:gpus=2,pp=2;llm:gpus=1", PLAN_DISAGGREGATED, 3, 2, 8 },
        { "vision:dp=4;llm:dp=2,pp=2", PLAN_COLOCATED, 4, 1, 16 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_OK(test_sim_case_plan(&cases[i], &p));
        check_retires(&p, false);
        p.model.mod[0].frozen = true;
        check_retires(&p, true);
    }
}

TEST(schedule_refuses_what_the_executor_does_not_run)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan("vision:sp=2;llm:tp=2,seqpar=0", PLAN_COLOCATED, 2, 1, 4, &p));
    p.mod[1].pp = 2;
    CHECK_OK(plan_schedule_check(&p, err));
    p.mod[1].stage_layers[0] = p.model.mod[1].layers;   /* the second stage would hold no block */
    p.mod[1].stage_layers[1] = 0;
    CHECK(plan_schedule_check(&p, err) == UTIL_EINVAL && strstr(err, "stage 1 holds no block"));
    memset(p.mod[1].stage_layers, 0, sizeof p.mod[1].stage_layers);
    p.mod[1].pp = 1;
    p.mod[1].zero = 3;
    p.mod[1].recompute = PLAN_RECOMP_FULL;
    p.mod[1].seq_parallel = true;
    CHECK_OK(plan_schedule_check(&p, err));
    p.mod[0].sp = 32;    /* 16 merge groups per image cannot split 32 ways */
    CHECK(plan_schedule_check(&p, err) == UTIL_EINVAL && strstr(err, "sp = 32"));
    p.mod[0].sp = 2;
    p.model.mod[0].frozen = p.model.mod[1].frozen = true;
    CHECK(plan_schedule_check(&p, err) == UTIL_EINVAL && strstr(err, "nothing to train"));
}

/* Each strategy's per-step ops: a replicated module syncs its gradients,
 * ZeRO-1 reduce-scatters them and gathers the updated weights, ZeRO-2 only
 * gathers (its gradients were reduced unit by unit), ZeRO-3 does neither. */
TEST(schedule_step_ops_follow_the_data_parallel_strategy)
{
    static plan_t p;
    char err[UTIL_ERR_LEN], ops[256];
    const char *tails[4] = { "ynoo", "ynoPoP", "noPoP", "noo" };
    for (int zero = 0; zero <= 3; zero++) {
        char spec[96];
        snprintf(spec, sizeof spec, "vision:dp=2,zero=%d;llm:dp=2,zero=%d", zero, zero);
        CHECK_OK(test_sim_plan(spec, PLAN_COLOCATED, 2, 1, 4, &p));
        plan_schedule s;
        CHECK_OK(plan_schedule_rank(&p, 1, &s, err));
        op_string(&s, ops);
        const char *tail = ops + strlen(ops) - strlen(tails[zero]);
        /* zero 0: one grad_sync per module */
        if (zero == 0) tail = ops + strlen(ops) - 5;
        CHECK_MSG(!strcmp(tail, zero == 0 ? "yynoo" : tails[zero]), "zero %d: ops %s", zero, ops);
        plan_schedule_free(&s);
    }
}

/* Under ZeRO-3 every rank of a shard group gathers each unit in every
 * micro-batch: a replica with fewer samples runs empty micro-batches so the
 * groups' collectives match (PyTorch's Join). */
TEST(schedule_zero3_gives_uneven_replicas_empty_micro_batches)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    /* chunks of 4 samples over 3 vision replicas: shares of 1, 1 and 2 */
    CHECK_OK(test_sim_plan("vision:gpus=3,dp=3,zero=3,mb=1;llm:gpus=1,mb=1", PLAN_DISAGGREGATED, 4, 2, 8, &p));
    int fwd[3] = { 0 }, empty[3] = { 0 };
    for (int r = 0; r < 3; r++) {
        plan_schedule s;
        CHECK_OK(plan_schedule_rank(&p, p.mod[0].first_rank + r, &s, err));
        for (int i = 0; i < s.n; i++)
            if (s.op[i].kind == PLAN_OP_FORWARD || s.op[i].kind == PLAN_OP_BACKWARD) {
                fwd[r]++;
                empty[r] += s.op[i].samples == 0;
                CHECK(s.op[i].samples > 0 || s.op[i].slot == -1);
            }
        plan_schedule_free(&s);
    }
    CHECK(fwd[0] == fwd[1] && fwd[1] == fwd[2] && fwd[0] == 8);
    CHECK(empty[0] == 4 && empty[1] == 4 && empty[2] == 0);
    check_sample_coverage(&p);
}

/* 1F1B on the LLM's stages (PipeDream-Flush): stage i forwards pp - 1 - i
 * micro-batches ahead, then alternates; the last stage fuses each
 * micro-batch's forward and backward; the first stage receives each chunk's
 * encoder rows before its first forward and sends their gradient after its
 * last backward; stage i keeps pp - i micro-batches' activations. */
TEST(schedule_llm_pipeline_runs_1f1b)
{
    static plan_t p;
    char err[UTIL_ERR_LEN], ops[512];
    /* 4 chunks of 2 samples, one micro-batch of 2 each; the LLM on 4 stages of 1 rank */
    CHECK_OK(test_sim_plan_layers("vision:gpus=1;llm:gpus=4,pp=4,mb=2", PLAN_DISAGGREGATED, 5, 4, 8, 8, &p));
    const char *want[4] = {
        "RFTRFTRFTRFTuBGuBGuBGuBGno",   /* stage 0: 3 forwards ahead, then the 4th before the 1st backward */
        "tFTtFTtFTuBUtFTuBUuBUuBUno",
        "tFTtFTuBUtFTuBUtFTuBUuBUno",
        "tXUtXUtXUtXUno",               /* the last stage */
    };
    for (int st = 0; st < 4; st++) {
        plan_schedule s;
        plan_coord at = { .pp = st };
        CHECK_OK(plan_schedule_rank(&p, plan_coord_rank(&p, 1, &at), &s, err));
        op_string(&s, ops);
        CHECK_MSG(!strcmp(ops, want[st]), "stage %d: %s", st, ops);
        CHECK_EQ_INT(s.slots[1], 4 - st);
        plan_schedule_free(&s);
    }
    /* the encoder runs 4 chunks ahead: chunk 0's gradient leaves the LLM after its 4th forward */
    plan_schedule s;
    CHECK_OK(plan_schedule_rank(&p, p.mod[0].first_rank, &s, err));
    op_string(&s, ops);
    CHECK_MSG(!strcmp(ops, "FSFSFSFSrBrBrBrBno"), "vision: %s", ops);
    CHECK_EQ_INT(s.slots[0], 4);
    plan_schedule_free(&s);
    check_sample_coverage(&p);
    check_handoff(&p);
}

/* An encoder on stages: each micro-batch through them, the last stage
 * sending the chunk's rows to the LLM and receiving their gradient; a tied
 * LLM split over stages syncs its embedding between the first and the last. */
TEST(schedule_encoder_stages_and_tied_embedding_sync)
{
    static plan_t p;
    char err[UTIL_ERR_LEN], ops[512];
    CHECK_OK(test_sim_plan("vision:gpus=2,pp=2;llm:gpus=2,pp=2", PLAN_DISAGGREGATED, 4, 2, 4, &p));
    const char *want[2] = { "FTFTuBuBno", "tFStFSrBUrBUno" };
    for (int st = 0; st < 2; st++) {
        plan_schedule s;
        plan_coord at = { .pp = st };
        CHECK_OK(plan_schedule_rank(&p, plan_coord_rank(&p, 0, &at), &s, err));
        op_string(&s, ops);
        CHECK_MSG(!strcmp(ops, want[st]), "vision stage %d: %s", st, ops);
        plan_schedule_free(&s);
    }
    check_sample_coverage(&p);
    check_handoff(&p);
    p.model.mod[1].tied_embeddings = true;
    for (int st = 0; st < 2; st++) {
        plan_schedule s;
        plan_coord at = { .pp = st };
        CHECK_OK(plan_schedule_rank(&p, plan_coord_rank(&p, 1, &at), &s, err));
        op_string(&s, ops);
        CHECK_MSG(strstr(ops, "eno") != NULL, "llm stage %d: %s", st, ops);
        plan_schedule_free(&s);
    }
}
