/* bf16-mixed with ZeRO-3 (planner/precision_zero3.c): each unit's two
 * gathers, checked element by element against the layout, and their price. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner_int.h"

#include <stdlib.h>

/* A small LLM with LayerNorm and biases everywhere (fp32-read tensors inside
 * every block, between the linears) and a tied embedding (fp32-read, read by
 * the head's linear too). */
static model_t small_gpt(void)
{
    return test_llm("gpt", "\"layers\": 2, \"hidden\": 64, \"heads\": 4, \"ffn\": 96, \"ffn_kind\": \"gelu\","
                    " \"norm\": \"layernorm\", \"qkv_bias\": true, \"out_bias\": true, \"mlp_bias\": true,"
                    " \"vocab\": 101, \"tied_embeddings\": true");
}

/* Every rank's fp32-read elements of every unit, one element at a time from
 * the tensor list, against plan_zero3_bf16_units: the pieces, the bf16 words
 * (an odd piece padded by one element) and the most any rank packs. */
static void check_units(const model_t *m, const plan_module *s, int G)
{
    const model_module *mm = &m->mod[0];
    int U = plan_module_units(mm);
    plan_z3_unit *u = calloc((size_t)U, sizeof *u);
    plan_stage st = plan_stage_of(mm, s, 0);
    CHECK(plan_zero3_bf16_units(mm, s, &st, G, u) == UTIL_OK);
    int n = plan_module_tensors(mm, s->tp, 0, s->seq_parallel, &st, NULL, 0);
    plan_tensor *t = calloc((size_t)n, sizeof *t);
    plan_module_tensors(mm, s->tp, 0, s->seq_parallel, &st, t, n);
    int64_t *size = calloc((size_t)U, sizeof *size), *count = calloc((size_t)U * G, sizeof *count);
    int odd = 0;
    for (int i = 0; i < n; i++) {
        int64_t e = t[i].shape[0] * t[i].shape[1];
        int k = t[i].unit;
        int64_t p = 0;
        for (int j = 0; j < n; j++) if (t[j].unit == k) p += t[j].shape[0] * t[j].shape[1];
        p = (p + G - 1) / G;
        for (int64_t x = 0; x < e && !plan_tensor_is_gemm_weight(t[i].role); x++) count[(size_t)k * G + (size[k] + x) / p]++;
        size[k] += e;
    }
    for (int k = 0; k < U; k++) {
        int64_t piece = (size[k] + G - 1) / G, most = 0;
        for (int r = 0; r < G; r++) if (count[(size_t)k * G + r] > most) most = count[(size_t)k * G + r];
        CHECK_MSG(u[k].piece == piece && u[k].half == (piece + 1) / 2 && u[k].full == most,
                  "G %d unit %d: piece %lld half %lld full %lld, want %lld %lld %lld", G, k, (long long)u[k].piece,
                  (long long)u[k].half, (long long)u[k].full, (long long)piece, (long long)(piece + 1) / 2, (long long)most);
        CHECK(most > 0);   /* every unit holds a norm or the embedding */
        odd += piece % 2;
    }
    if (G == 3) CHECK_MSG(odd > 0, "G 3: no odd piece to pad");
    free(u); free(t); free(size); free(count);
}

TEST(zero3_bf16_units_pack_what_each_rank_holds)
{
    model_t m = small_gpt();
    for (int G = 1; G <= 8; G++) {
        plan_module s = { .dp = G, .tp = 1, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .n_ranks = G };
        check_units(&m, &s, G);
    }
    plan_module tp2 = { .dp = 3, .tp = 2, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .n_ranks = 6 };
    check_units(&m, &tp2, 3);
}

/* The dhp target prices bf16-mixed ZeRO-3's gathers as the two all-gathers of
 * each unit (bf16 words, packed fp32 elements) and fp32's as one of the fp32
 * pieces; the gradients' reduce-scatter is fp32 in both. Overlap 0, so the
 * figures are the collectives'. */
TEST(zero3_bf16_gathers_are_priced_at_their_bytes)
{
    model_t m = small_gpt();
    const model_module *mm = &m.mod[0];
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_MSG(cost_cluster_load("2x8xh100", &c, err) == UTIL_OK, "%s", err);
    cost_pool pool = c.pool[0];
    pool.has_overlap = false;
    plan_module s = { .dp = 16, .tp = 1, .sp = 1, .pp = 1, .zero = 3, .micro_batch = 1, .n_ranks = 16 };
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    o.overlap = 0;
    plan_comm fp32 = { 0 }, bf16 = { 0 };
    double fbusy, busy;
    o.precision = PLAN_OPT_FP32;
    plan_stage st = plan_stage_of(mm, &s, 0);
    plan_price_dp_micro(mm, &s, &st, &pool, &o, false, 1, 1, &fp32, &fbusy, &busy);
    o.precision = PLAN_OPT_MIXED_FP32;
    CHECK(plan_zero3_bf16(mm, &s, &o));
    plan_price_dp_micro(mm, &s, &st, &pool, &o, false, 1, 1, &bf16, &fbusy, &busy);
    int U = plan_module_units(mm);
    plan_z3_unit *u = calloc((size_t)U, sizeof *u);
    plan_zero3_bf16_units(mm, &s, &st, 16, u);
    double want32 = 0, want16 = 0;
    for (int k = 0; k < U; k++) {
        want32 += cost_collective_time(&pool, COST_ALLGATHER, 16.0 * u[k].piece * 4, 16, 8);
        want16 += cost_collective_time(&pool, COST_ALLGATHER, 16.0 * u[k].half * 4, 16, 8)
                + cost_collective_time(&pool, COST_ALLGATHER, 16.0 * u[k].full * 4, 16, 8);
    }
    CHECK_NEAR(fp32.fwd_s, want32, 1e-12);
    CHECK_NEAR(bf16.fwd_s, want16, 1e-12);
    CHECK(fp32.fwd_syncs == U && bf16.fwd_syncs == 2 * U);
    free(u);
}
