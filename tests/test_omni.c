/* Several encoders feeding one LLM (tiny-omni: vision and audio, as
 * Qwen2.5-Omni's thinker): where each encoder's rows sit in a sample's
 * sequence (plan_sample_offset), the hand-off of both into the LLM's one
 * input buffer, and the schedule of N encoder stages. */
#include "tests/test.h"
#include "tests/test_ex.h"
#include "planner/planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tiny-omni (frozen_audio: its audio encoder frozen) on 8xh100: 64 vision
 * tokens (16 merged rows) and 32 audio frames (16 pooled rows) per sample. */
static int omni_plan(const char *spec, plan_placement pl, int gpus, int n_micro, bool frozen_audio, plan_t *p)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    if (model_load("tiny-omni", &m, err) || cost_cluster_load("8xh100", &c, err)) return UTIL_EINVAL;
    int a = model_find_kind(&m, MODEL_AUDIO);
    if (frozen_audio) m.mod[a].frozen = true;
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 64, .audio_frames = 32, .text_tokens = 48 };
    int rc = plan_from_strategy(spec, &m, &c, &w, pl, gpus, n_micro, p, err);
    if (rc) fprintf(stderr, "omni_plan: %s\n", err);
    return rc;
}

TEST(omni_sample_layout_is_vision_then_audio_then_text)
{
    static plan_t p;
    CHECK_OK(omni_plan("vision:dp=1;audio:dp=1;llm:dp=1", PLAN_COLOCATED, 1, 1, false, &p));
    int v = model_find_kind(&p.model, MODEL_VISION), a = model_find_kind(&p.model, MODEL_AUDIO);
    CHECK_EQ_INT(plan_rows_per_sample(&p, v), 16);
    CHECK_EQ_INT(plan_rows_per_sample(&p, a), 16);
    CHECK_EQ_INT(plan_encoder_offset(&p, v), 0);
    CHECK_EQ_INT(plan_encoder_offset(&p, a), 16);
    CHECK_EQ_INT(plan_encoder_offset(&p, p.n_modules), 32);
    /* a sample without an image starts with its audio */
    int rows[MODEL_MAX_MODULES] = { 0 };
    rows[a] = 5;
    CHECK_EQ_INT(plan_sample_offset(&p.model, rows, a), 0);
    CHECK_EQ_INT(plan_sample_offset(&p.model, rows, p.n_modules), 5);
    plan_seq q;
    plan_module_seq(&p.model, p.model.llm, &p.work, &q);
    CHECK_EQ_INT((int)q.seq, 32 + 48);
}

/* Every LLM first-stage rank's input buffer (every encoder's rows it holds,
 * sample after sample) is written exactly once by the two encoders'
 * segments together, each encoder's rows at its own positions. */
static void check_both_encoders_fill_the_buffer(const plan_t *p)
{
    char err[UTIL_ERR_LEN];
    int L = p->model.llm, E = plan_encoder_offset(p, p->n_modules);
    plan_seq q;
    plan_module_seq(&p->model, L, &p->work, &q);
    for (int c = 0; c < plan_chunks(p); c++)
        for (int r = 0; r < p->world_size; r++) {
            plan_coord lc;
            if (!plan_rank_coord(p, L, r, &lc) || lc.pp != 0) continue;
            int f, cnt, Ej = plan_cp_encoder_rows(p, -1, r);
            plan_chunk_share(p, L, c, lc.dp, &f, &cnt);
            plan_cp_span span = plan_cp_span_of(plan_cp_of(&p->model.mod[L], &p->mod[L]), (int)q.seq, p->mod[L].sp, lc.sp);
            CHECK_EQ_INT(Ej, plan_cp_held(&span, 0, E));
            int *hit = calloc((size_t)cnt * Ej + 1, sizeof(int)), held = 0;
            for (int k = 0; k < p->n_modules; k++) {
                if (!plan_feeds_llm(&p->model, &p->work, k)) continue;
                held += plan_cp_encoder_rows(p, k, r);
                int off = plan_encoder_offset(p, k), R = plan_rows_per_sample(p, k), n;
                plan_segment *sg;
                CHECK_OK(plan_handoff(p, k, c, &sg, &n, err));
                for (int i = 0; i < n; i++) {
                    if (sg[i].llm_rank != r || !sg[i].act) continue;
                    for (int j = 0; j < sg[i].rows; j++) {
                        int at = sg[i].llm_off + j, pos = plan_cp_position(&span, at % Ej);
                        hit[at]++;
                        CHECK_MSG(pos >= off && pos < off + R, "rank %d chunk %d: module %d's row at position %d", r, c, k, pos);
                    }
                }
                util_free(sg);
            }
            CHECK_EQ_INT(held, Ej);
            for (int j = 0; j < cnt * Ej; j++) CHECK_EQ_INT(hit[j], 1);
            free(hit);
        }
}

TEST(omni_handoff_places_each_encoders_rows_at_its_positions)
{
    static plan_t p;
    const struct { const char *spec; plan_placement pl; int gpus, micro; } cases[] = {
        { "vision:gpus=1;audio:gpus=1;llm:gpus=2,tp=2,seqpar=0", PLAN_DISAGGREGATED, 4, 4 },
        { "vision:gpus=2,sp=2;audio:gpus=2,dp=2;llm:gpus=2,dp=2", PLAN_DISAGGREGATED, 6, 2 },
        /* Ulysses over 2: sp rank 0 holds every encoder row; ring over tp 2 x sp 2: chunks of 20 cut the audio rows */
        { "vision:gpus=1;audio:gpus=1;llm:gpus=2,sp=2", PLAN_DISAGGREGATED, 4, 4 },
        { "vision:dp=4;audio:dp=2,sp=2;llm:sp=2,tp=2,seqpar=1", PLAN_COLOCATED, 4, 1 },
        { "vision:dp=2;audio:sp=2;llm:pp=2", PLAN_COLOCATED, 2, 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK_OK(omni_plan(cases[i].spec, cases[i].pl, cases[i].gpus, cases[i].micro, false, &p));
        check_both_encoders_fill_the_buffer(&p);
    }
}

/* The ops of module k on a rank, in order: F forward, B backward, X fused,
 * S send rows, R receive rows, G send gradient, r receive gradient. */
static void module_ops(const plan_schedule *s, int k, char *out)
{
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        const plan_op *o = &s->op[i];
        if (o->module != k) continue;
        const char *l = o->kind == PLAN_OP_FORWARD ? "F" : o->kind == PLAN_OP_BACKWARD ? "B" : o->kind == PLAN_OP_FORWARD_BACKWARD ? "X"
                      : o->kind == PLAN_OP_SEND_ACT ? "S" : o->kind == PLAN_OP_RECV_ACT ? "R" : o->kind == PLAN_OP_SEND_GRAD ? "G"
                      : o->kind == PLAN_OP_RECV_GRAD ? "r" : "";
        n += sprintf(out + n, "%s", l);
    }
}

TEST(omni_schedule_runs_each_encoder_as_its_own_stage)
{
    static plan_t p;
    char err[UTIL_ERR_LEN], ops[512];
    plan_schedule s;
    /* colocated, one chunk: both encoders forward, the LLM, their backwards in reverse */
    CHECK_OK(omni_plan("vision:dp=1;audio:dp=1;llm:dp=1", PLAN_COLOCATED, 1, 1, false, &p));
    int v = model_find_kind(&p.model, MODEL_VISION), a = model_find_kind(&p.model, MODEL_AUDIO), L = p.model.llm;
    CHECK_OK(plan_schedule_check(&p, err));
    CHECK_OK(plan_schedule_rank(&p, 0, &s, err));
    int first[3] = { -1, -1, -1 }, lastb[3] = { -1, -1, -1 }, mods[3] = { v, a, L };
    for (int i = 0; i < s.n; i++)
        for (int j = 0; j < 3; j++) {
            if (s.op[i].module != mods[j]) continue;
            if (first[j] < 0 && (s.op[i].kind == PLAN_OP_FORWARD || s.op[i].kind == PLAN_OP_FORWARD_BACKWARD)) first[j] = i;
            if (s.op[i].kind == PLAN_OP_BACKWARD || s.op[i].kind == PLAN_OP_FORWARD_BACKWARD) lastb[j] = i;
        }
    CHECK(first[0] < first[1] && first[1] < first[2]);
    CHECK(lastb[2] < lastb[1] && lastb[1] < lastb[0]);
    plan_schedule_free(&s);

    /* disaggregated, the audio encoder frozen: it forwards and sends, nothing comes back */
    CHECK_OK(omni_plan("vision:gpus=1;audio:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 3, 4, true, &p));
    for (int r = 0; r < p.world_size; r++) {
        CHECK_OK(plan_schedule_rank(&p, r, &s, err));
        module_ops(&s, a, ops);
        plan_coord cd;
        if (plan_rank_coord(&p, a, r, &cd)) CHECK_MSG(!strcmp(ops, "FSFSFSFS"), "audio rank: %s", ops);
        if (plan_rank_coord(&p, L, r, &cd)) CHECK_MSG(!strcmp(ops, "RRRR"), "llm rank, audio ops: %s", ops);
        if (plan_rank_coord(&p, v, r, &cd)) {
            module_ops(&s, v, ops);
            CHECK_MSG(!strcmp(ops, "FSFSrBFSrBFSrBrB"), "vision rank: %s", ops);
        }
        plan_schedule_free(&s);
    }
}

TEST(omni_schedule_refuses_disaggregated_groups_that_share_a_rank)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(omni_plan("vision:gpus=1;audio:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 3, 4, false, &p));
    int a = model_find_kind(&p.model, MODEL_AUDIO), v = model_find_kind(&p.model, MODEL_VISION);
    p.mod[a].first_rank = p.mod[v].first_rank;
    CHECK_EQ_INT(plan_schedule_check(&p, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "share rank") && !strchr(err, '\n'), "%s", err);
}

/* The executor's whole-model step of tiny-omni (ex_step_forward_backward)
 * is exactly its module-level calls with each sample's LLM input laid out
 * by hand: its image's 16 merged rows, then its clip's 4 pooled rows (16
 * mel frames), then its text: same loss, same gradients, bit for bit. */
TEST(omni_whole_step_places_each_samples_vision_then_audio_rows)
{
    model_t m;
    char err[UTIL_ERR_LEN] = "";
    CHECK_OK(model_load("tiny-omni", &m, err));
    int a = model_find_kind(&m, MODEL_AUDIO), d = m.mod[m.llm].hidden;
    enum { B = 2, T = 6, MEL = 16 };
    int ones[B] = { 1, 1 };
    int32_t tokens[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)((i * 37 + 11) % m.mod[m.llm].vocab);
    float *pix = test_rnd((size_t)B * 64 * 48, 1), *mel = test_rnd((size_t)B * MEL * m.mod[a].in_channels, 1);
    ex_batch b = { .n_images = B, .patches = 64, .grid_h = 8, .grid_w = 8, .pixels = pix, .batch = B, .text_tokens = T,
                   .tokens = tokens, .images_per_sample = ones, .n_audio = B, .mel_frames = MEL, .mel = mel,
                   .audio_per_sample = ones };
    ex_model *whole = NULL, *parts = NULL;
    CHECK_OK(ex_model_create(&m, 5, &whole, err));
    CHECK_OK(ex_model_create(&m, 5, &parts, err));
    float l1 = 0, l2 = 0;
    int rc = ex_step_forward_backward(whole, &b, &l1, err);
    const float *vo, *ao, *denc = NULL;
    int vr = 0, ar = 0;
    if (!rc) rc = ex_vision_forward(parts, &b, &vo, &vr, err);
    if (!rc) rc = ex_audio_forward(parts, &b, &ao, &ar, err);
    int V = vr / B, A = ar / B;   /* rows per sample: 16 and 4 */
    float *enc = calloc((size_t)(vr + ar) * d, sizeof(float)), *dv = calloc((size_t)vr * d + 1, sizeof(float));
    float *da = calloc((size_t)ar * d + 1, sizeof(float));
    for (int s = 0; !rc && s < B; s++) {
        memcpy(enc + (size_t)s * (V + A) * d, vo + (size_t)s * V * d, (size_t)V * d * sizeof(float));
        memcpy(enc + ((size_t)s * (V + A) + V) * d, ao + (size_t)s * A * d, (size_t)A * d * sizeof(float));
    }
    if (!rc) rc = ex_llm_forward_backward(parts, &b, enc, true, &l2, &denc, err);
    for (int s = 0; !rc && s < B; s++) {
        memcpy(dv + (size_t)s * V * d, denc + (size_t)s * (V + A) * d, (size_t)V * d * sizeof(float));
        memcpy(da + (size_t)s * A * d, denc + ((size_t)s * (V + A) + V) * d, (size_t)A * d * sizeof(float));
    }
    if (!rc) rc = ex_vision_backward(parts, &b, dv, err);
    if (!rc) rc = ex_audio_backward(parts, &b, da, err);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    CHECK_EQ_INT(V, 16);
    CHECK_EQ_INT(A, 4);
    CHECK(l1 == l2 && l1 > 0);
    for (int k = 0; !rc && k < m.n_modules; k++) {
        float *g1, *g2;
        size_t n1, n2;
        CHECK_OK(ex_module_buffer(whole, k, EX_BUF_GRADS, &g1, &n1));
        CHECK_OK(ex_module_buffer(parts, k, EX_BUF_GRADS, &g2, &n2));
        CHECK(n1 == n2 && n1 > 0 && !memcmp(g1, g2, n1 * sizeof(float)));
    }
    ex_model_free(whole);
    ex_model_free(parts);
    free(pix); free(mel); free(enc); free(dv); free(da);
}
