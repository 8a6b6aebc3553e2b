/* The cost and memory terms issue 22's comparison with published runs
 * added (bench/published.py): GEMM wave quantization, the attention
 * head-dim and sequence-length curves, attention without FlashAttention and dropout (Korthikanti
 * et al.'s activation formula), Megatron-LM's selective recomputation, the
 * interleaved and uneven pipeline, ZeRO-3's per-unit collectives, the loss's
 * fp32 logit copies under autocast. Every
 * expected figure is worked out by hand in the comment beside it. */
#include "test.h"
#include "test_fixture.h"
#include "planner/planner.h"

#include <stdlib.h>
#include <string.h>

TEST(calib_gemm_wave_efficiency_by_hand)
{
    cost_gpu g = test_round_gpu();
    CHECK_NEAR(cost_gemm_wave_efficiency(&g, 2048, 4608, 12288), 1.0, 0);   /* no sm_count: no waves */
    g.sm_count = 108;
    /* 2048 x 4608 in 128x128 tiles: 16 x 36 = 576 tiles = 5.33 waves of 108 -> 576 / 648 = 8/9;
     * 256x128 and 128x256: 288 tiles, 2.67 waves -> 288 / 324, the same */
    CHECK_NEAR(cost_gemm_wave_efficiency(&g, 2048, 4608, 12288), 8.0 / 9, 1e-12);
    /* H100's MAMF shape 2048 x 2048: 256 tiles on 132 SMs -> 256 / 264 = 32/33 */
    g.sm_count = 132;
    CHECK_NEAR(cost_gemm_wave_efficiency(&g, 2048, 2048, 13312), 32.0 / 33, 1e-12);
    /* one tile on 100 SMs splits k = 1024 into 8 slices of 128: 8 / 100 */
    g.sm_count = 100;
    CHECK_NEAR(cost_gemm_wave_efficiency(&g, 128, 128, 1024), 0.08, 1e-12);
    /* with a long k it fills the wave: 100 slices -> 1 */
    CHECK_NEAR(cost_gemm_wave_efficiency(&g, 128, 128, 100000), 1.0, 1e-12);
    /* the efficiency carries it: 0.8 s(1000)^3 x 0.96 (1000 x 1000: 8 x 8 = 64 tiles of 128 x 128 plus
     * split-K floor(100 / 64) = 1 -> 64 / 100; 256 x 128: 4 x 8 = 32, split 3 -> 96 / 100) */
    double s = 1000.0 / 1100.0;
    CHECK_NEAR(cost_gemm_efficiency(&g, 1000, 1000, 1000), 0.8 * s * s * s * 0.96, 1e-12);
}

TEST(calib_attention_head_dim_curve_by_hand)
{
    cost_gpu g = test_round_gpu();
    CHECK_NEAR(cost_attention_efficiency(&g, 64), 0.5, 0);            /* no curve */
    g.attn_hd_half = 56;
    CHECK_NEAR(cost_attention_efficiency(&g, 128), 0.5, 1e-12);       /* the reference head dim */
    /* 0.5 x (64 / 120) / (128 / 184) = 0.5 x 0.533333 / 0.695652 = 0.383333 */
    CHECK_NEAR(cost_attention_efficiency(&g, 64), 0.5 * (64.0 / 120) / (128.0 / 184), 1e-12);
    CHECK_NEAR(cost_attention_efficiency(&g, 64), 0.3833333333, 1e-9);
    /* 2e9 scores of d = 64 forward: 2e9 x 256 FLOPs / (1e15 x 0.383333) + launch */
    CHECK_NEAR(cost_attention_forward_time(&g, 1e6, 2e9, 64), 2e9 * 256 / (1e15 * 0.3833333333333) + 1e-5, 1e-9);
}

/* The sequence-length curve: rows seeing s keys each run at s / (s + attn_row_scores)
 * of the long-sequence rate, so the time per score at s over that at 16k follows it. */
TEST(calib_attention_row_scores_give_the_sequence_length_curve)
{
    cost_gpu g = test_round_gpu();
    g.attn_row_scores = 238;
    double H = 16, d = 128, ref = 16384;
    double per_score_ref = cost_attention_forward_time(&g, ref * H, ref * ref * H, d) / (ref * ref * H);
    double seqs[] = { 512, 2048, 8192 };
    for (int i = 0; i < 3; i++) {
        double s = seqs[i], rows = s * H, scores = s * s * H;
        double rate = 1 / (cost_attention_forward_time(&g, rows, scores, d) - g.kernel_launch_s) * scores;
        double rate_ref = 1 / (per_score_ref - g.kernel_launch_s / (ref * ref * H));
        CHECK_NEAR(rate / rate_ref, (s / (s + 238)) / (ref / (ref + 238)), 1e-9);
    }
    /* none by default: the rate does not depend on the keys per row */
    g.attn_row_scores = 0;
    CHECK_NEAR(cost_attention_forward_time(&g, 512 * H, 512 * 512 * H, d) - g.kernel_launch_s,
               (512 * 512 * H) * 4 * d / (g.peak_flops * g.attn_eff), 1e-15);
}

/* cuDNN's fused attention (--attention cudnn): FlashAttention-2's products
 * at attn_eff x attn_cudnn_speedup, forward and backward; a GPU without the
 * figure prices FlashAttention-2's (and the planner refuses the option there). */
TEST(calib_cudnn_attention_at_the_files_speedup)
{
    cost_gpu g = test_round_gpu();
    double rows = 1e6, scores = 2e9, d = 128;
    CHECK(!cost_gpu_has_cudnn_attention(&g));
    CHECK(cost_attention_forward_time_in(&g, COST_ATTN_CUDNN, rows, scores, d)
          == cost_attention_forward_time_in(&g, COST_ATTN_FLASH, rows, scores, d));
    g.attn_cudnn_speedup = 1.6;
    CHECK(cost_gpu_has_cudnn_attention(&g));
    /* 2e9 scores x 512 FLOPs / (1e15 x 0.5 x 1.6) + launch */
    CHECK_NEAR(cost_attention_forward_time_in(&g, COST_ATTN_CUDNN, rows, scores, d),
               2e9 * 512 / (1e15 * 0.5 * 1.6) + g.kernel_launch_s, 1e-12);
    double fb = cost_attention_backward_time_in(&g, COST_ATTN_FLASH, rows, scores, d) - g.kernel_launch_s;
    double cb = cost_attention_backward_time_in(&g, COST_ATTN_CUDNN, rows, scores, d) - g.kernel_launch_s;
    CHECK_NEAR(cb, fb / 1.6, 1e-12);

    char err[UTIL_ERR_LEN];
    plan_options o;
    plan_options_default(&o);
    o.attention = PLAN_ATTN_CUDNN;
    o.target = PLAN_TARGET_DHP;
    CHECK(plan_attention_check(&o, NULL, err) == UTIL_EINVAL && strstr(err, "use --target megatron"));
    o.target = PLAN_TARGET_MEGATRON;
    cost_cluster h100 = test_cluster_load("8xh100"), a100 = test_cluster_load("8xa100-80g");
    CHECK(plan_attention_check(&o, &h100, err) == UTIL_OK);
    CHECK(plan_attention_check(&o, &a100, err) == UTIL_EINVAL && strstr(err, "no measured cuDNN attention"));
    CHECK(plan_attention_kernel(&o) == COST_ATTN_CUDNN);
}

/* A 4-layer GPT (LayerNorm, GELU 4h, MHA) of width 1024, 16 heads. */
static model_t gpt(bool unfused, bool dropout, int layers)
{
    return test_llm("gpt", "\"layers\": %d, \"hidden\": 1024, \"heads\": 16, \"ffn\": 4096, \"ffn_kind\": \"gelu\","
                    " \"norm\": \"layernorm\", \"vocab\": 1000, \"unfused_attention\": %s, \"dropout\": %s",
                    layers, unfused ? "true" : "false", dropout ? "true" : "false");
}

static cost_cluster one_node(void) { return test_cluster_load("8xa100-80g"); }

/* Most tests' start: one_node, a step of `batch` samples of 256 text tokens,
 * the default options. */
static void one_node_step(int batch, cost_cluster *c, plan_workload *w, plan_options *o)
{
    *c = one_node();
    *w = (plan_workload){ .global_batch = batch, .text_tokens = 256 };
    plan_options_default(o);
}

static plan_module strat(int dp, int tp, int pp, int zero, int mb, plan_recompute rc, bool seqpar)
{
    plan_module s = { .dp = dp, .tp = tp, .sp = 1, .pp = pp, .zero = zero, .micro_batch = mb, .recompute = rc,
                      .seq_parallel = seqpar, .n_ranks = dp * tp * pp };
    return s;
}

TEST(calib_model_fields_round_trip)
{
    model_t m = gpt(true, true, 4), back;
    char err[UTIL_ERR_LEN];
    cJSON *j = model_to_json(&m);
    char *t = cJSON_PrintUnformatted(j);
    CHECK(model_parse_json(t, "round trip", &back, err) == UTIL_OK);
    free(t);
    cJSON_Delete(j);
    CHECK(back.mod[0].unfused_attention && back.mod[0].dropout);
    CHECK(!gpt(false, false, 4).mod[0].unfused_attention);
}

/* Korthikanti et al. (arXiv 2205.05198) Table 2, bytes per layer:
 * tensor parallel t, no sequence parallelism: s b h (10 + 24/t + 5 a s / (h t));
 * with sequence parallelism and selective recomputation: 34 s b h / t.
 * Sec. 4.3 adds, with pp = 1, the final norm's and the output layer's inputs (4 s b h / t under
 * sequence parallelism, 4 s b h without), and with dropout the embedding's mask, s b h p / t
 * (s b h p without sequence parallelism), p the first stage's micro-batches in flight. */
TEST(calib_unfused_attention_activations_are_korthikanti)
{
    model_t m = gpt(true, true, 4);
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(2, &c, &w, &o);
    double s = 256, b = 2, h = 1024, a = 16, t = 4, L = 4;
    plan_mem mem;
    plan_module none = strat(1, 4, 1, 0, 2, PLAN_RECOMP_NONE, false);
    plan_module_memory(&m, 0, &none, &w, &c.pool[0].gpu, &o, 1, &mem);
    /* + the head's rows (pp = 1): the final norm's and the output layer's inputs, 2 x 2 s b h, and the
     * embedding's dropout mask, s b h (no sequence parallelism: neither is split) */
    CHECK_NEAR(mem.activations, L * s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) + 4 * s * b * h + s * b * h,
               1e-12);
    /* the blocks' own (their figure 1 and Eq. 5 count the layers alone, sec. 4.3): without the head's rows */
    CHECK_NEAR(mem.block_acts, L * s * b * h * (10 + 24 / t + 5 * a * s / (h * t)), 1e-12);
    /* and of the model states, 18 bytes of each block parameter on this tp rank: no embedding */
    CHECK_NEAR(mem.block_states, 18.0 * (double)model_blocks_params(&m.mod[0]) / t, 1e-12);
    CHECK(mem.params + mem.grads + mem.optim > mem.block_states * 1.001);
    plan_module sel = strat(1, 4, 1, 0, 2, PLAN_RECOMP_SELECTIVE, true);
    plan_module_memory(&m, 0, &sel, &w, &c.pool[0].gpu, &o, 1, &mem);
    /* sequence parallelism splits the head's rows and the mask too: 4 s b h / t + s b h / t */
    CHECK_NEAR(mem.activations, L * 34 * s * b * h / t + 4 * s * b * h / t + s * b * h / t, 1e-12);
    CHECK_NEAR(mem.block_acts, L * 34 * s * b * h / t, 1e-12);
    /* pp = 2, 4 micro-batches of 2 (global batch 8): the first stage holds 2 of them, 2 layers each,
     * and their 2 masks; no head */
    plan_workload w8 = { .global_batch = 8, .text_tokens = 256 };
    plan_module sel2 = strat(1, 4, 2, 0, 2, PLAN_RECOMP_SELECTIVE, true);
    plan_module_memory(&m, 0, &sel2, &w8, &c.pool[0].gpu, &o, 1, &mem);
    CHECK_NEAR(mem.activations, 2 * 2 * 34 * s * b * h / t + 2 * s * b * h / t, 1e-12);
    CHECK_NEAR(mem.block_acts, 2 * 2 * 34 * s * b * h / t, 1e-12);
    /* FlashAttention, no dropout: no score matrix, an fp32 log-sum-exp per head: 8 + 24/t + 16 a/(h t) */
    model_t f = gpt(false, false, 4);
    plan_module_memory(&f, 0, &none, &w, &c.pool[0].gpu, &o, 1, &mem);
    CHECK_NEAR(mem.activations, L * s * b * h * (8 + 24 / t + 4 * a / (h * t)) + 4 * s * b * h, 1e-12);
}

/* dhp's executor target splits the same way: each block's state bytes (fp32: 4 + 4 + 8 a parameter) and
 * saved tensors; twice the layers, twice the blocks' share and the same stem and head. */
TEST(calib_executor_block_share)
{
    model_t m4 = gpt(false, false, 4), m8 = gpt(false, false, 8);
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(2, &c, &w, &o);
    o.target = PLAN_TARGET_DHP;
    o.precision = PLAN_OPT_FP32;
    plan_module s = strat(1, 1, 1, 0, 2, PLAN_RECOMP_NONE, false);
    plan_mem a, b;
    plan_module_memory(&m4, 0, &s, &w, &c.pool[0].gpu, &o, 1, &a);
    plan_module_memory(&m8, 0, &s, &w, &c.pool[0].gpu, &o, 1, &b);
    CHECK_NEAR(a.block_states, 16.0 * (double)model_blocks_params(&m4.mod[0]), 1e-12);
    CHECK_NEAR(b.block_states, 2 * a.block_states, 1e-12);
    CHECK_NEAR(b.params + b.grads + b.optim - b.block_states, a.params + a.grads + a.optim - a.block_states, 1e-12);
    CHECK(a.block_acts > 0 && a.block_acts < a.activations);
    CHECK_NEAR(b.block_acts, 2 * a.block_acts, 1e-12);
    CHECK_NEAR(b.activations - b.block_acts, a.activations - a.block_acts, 1e-12);
}

TEST(calib_pipeline_depth_interleaving_and_live_block)
{
    model_t m = gpt(false, false, 16);
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(8, &c, &w, &o);
    plan_mem one, four, inter, few, full1, full4;
    plan_module s1 = strat(1, 1, 1, 0, 1, PLAN_RECOMP_NONE, false);
    /* pp = 1 adds the head's rows, 4 s b h = 4 x 256 x 1024 */
    plan_module_memory(&m, 0, &s1, &w, &c.pool[0].gpu, &o, 1, &one);
    double per_mb = one.activations - 4 * 256 * 1024.0;
    plan_module s4 = strat(1, 1, 4, 0, 1, PLAN_RECOMP_NONE, false);
    plan_module_memory(&m, 0, &s4, &w, &c.pool[0].gpu, &o, 1, &four);
    /* 1F1B: 4 layers per stage, 4 micro-batches in flight = all 16 layers' worth */
    CHECK_NEAR(four.activations, per_mb, 1e-12);
    /* interleaved, vp 2: x (1 + 3/8) */
    s4.vp = 2;
    plan_module_memory(&m, 0, &s4, &w, &c.pool[0].gpu, &o, 1, &inter);
    CHECK_NEAR(inter.activations, per_mb * 1.375, 1e-12);
    /* a step of 2 micro-batches keeps 2 in flight */
    s4.vp = 1;
    plan_workload w2 = { .global_batch = 2, .text_tokens = 256 };
    plan_module_memory(&m, 0, &s4, &w2, &c.pool[0].gpu, &o, 1, &few);
    CHECK_NEAR(few.activations, per_mb / 2, 1e-12);
    /* full recomputation: the one live block counts once, however many micro-batches are in flight */
    plan_module r1 = strat(1, 1, 4, 0, 1, PLAN_RECOMP_FULL, false);
    plan_stage_memory(&m, 0, &r1, 0, &w2, &c.pool[0].gpu, &o, 1, &full1);
    plan_stage_memory(&m, 0, &r1, 0, &w, &c.pool[0].gpu, &o, 1, &full4);
    /* on the first stage, 2 -> 4 micro-batches adds 2 x 4 layers x 2 s b h (the saved block inputs) and nothing else */
    CHECK_NEAR(full4.activations - full1.activations, 2 * 4 * 2 * 256 * 1024.0, 1e-12);
}

/* The Megatron target prices a 1F1B pipeline stage by stage: the first
 * holds the embedding and pp micro-batches, the last the head's inputs, the
 * logits and (tied embeddings) the word-embedding copy, and the module's
 * memory is its worst stage's, not the sum of each stage's largest part. */
TEST(calib_megatron_memory_stage_by_stage)
{
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(8, &c, &w, &o);
    const cost_gpu *g = &c.pool[0].gpu;
    plan_module s = strat(1, 1, 4, 0, 1, PLAN_RECOMP_NONE, false), one = strat(1, 1, 1, 0, 1, PLAN_RECOMP_NONE, false);
    model_t m = gpt(false, false, 16), tied = m;
    tied.mod[0].tied_embeddings = true;
    plan_mem st[4], whole, flat;
    for (int i = 0; i < 4; i++) plan_stage_memory(&m, 0, &s, i, &w, g, &o, 1, &st[i]);
    plan_module_memory(&m, 0, &s, &w, g, &o, 1, &whole);
    plan_module_memory(&m, 0, &one, &w, g, &o, 1, &flat);
    double blocks4 = 4.0 * (double)model_layer_params(&m.mod[0], 0), bytes = 18;   /* bf16-mixed: 18 B a parameter */
    CHECK_NEAR(st[0].params + st[0].grads + st[0].optim, bytes * (blocks4 + (double)model_embed_params(&m.mod[0])), 1e-12);
    CHECK_NEAR(st[1].params + st[1].grads + st[1].optim, bytes * blocks4, 1e-12);
    CHECK_NEAR(st[3].params + st[3].grads + st[3].optim, bytes * (blocks4 + (double)model_head_params(&m.mod[0])), 1e-12);
    /* 4, 3, 2, 1 micro-batches in flight of 4 blocks each; the logits only where the output layer runs */
    CHECK_NEAR(st[0].block_acts, 4 * st[3].block_acts, 1e-12);
    CHECK_NEAR(st[1].block_acts, 3 * st[3].block_acts, 1e-12);
    CHECK(st[0].logits == 0 && st[2].logits == 0);
    CHECK_NEAR(st[3].logits, flat.logits, 1e-12);
    /* the last stage saves the head's inputs, 4 s b h, as the whole model does with pp = 1 */
    CHECK_NEAR(st[3].activations - st[3].block_acts, flat.activations - flat.block_acts, 1e-12);
    double worst = 0;
    for (int i = 0; i < 4; i++) worst = fmax(worst, st[i].total);
    CHECK_NEAR(whole.total, worst, 1e-12);
    CHECK(whole.total < st[0].total + st[3].logits);
    /* tied embeddings: the last stage keeps the word embeddings' copy for the output layer */
    plan_mem t3;
    plan_stage_memory(&tied, 0, &s, 3, &w, g, &o, 1, &t3);
    CHECK_NEAR(t3.params + t3.grads + t3.optim,
               bytes * (blocks4 + (double)model_head_params(&tied.mod[0]) + 1000.0 * 1024), 1e-12);
}

/* Each stage's data-parallel gradient buckets follow its own parameters
 * (PyTorch DDP's, 25 MB, here: two of them, or the stage's gradients where
 * fewer): a narrow model with a wide vocabulary has its ends' stages over
 * the bucket and its middle ones far under it. */
TEST(calib_megatron_stage_buckets_follow_the_stage)
{
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(8, &c, &w, &o);
    const cost_gpu *g = &c.pool[0].gpu;
    model_t m = test_llm("narrow", "\"layers\": 8, \"hidden\": 128, \"heads\": 2, \"ffn\": 512, \"ffn_kind\": \"gelu\","
                         " \"norm\": \"layernorm\", \"vocab\": 150000");
    plan_module s = strat(2, 1, 4, 0, 1, PLAN_RECOMP_NONE, false);
    plan_mem first, middle;
    plan_stage_memory(&m, 0, &s, 0, &w, g, &o, 1, &first);
    plan_stage_memory(&m, 0, &s, 1, &w, g, &o, 1, &middle);
    const double A = 2, bucket = 25e6;   /* bf16 gradients in DDP's 25 MB buckets */
    plan_stage s0 = plan_stage_of(&m.mod[0], &s, 0), s1 = plan_stage_of(&m.mod[0], &s, 1);
    double p0 = plan_stage_params(&m.mod[0], &s, &s0), p1 = plan_stage_params(&m.mod[0], &s, &s1);
    CHECK(A * p0 > bucket && A * p1 < bucket);
    CHECK_NEAR(first.comm - middle.comm, 2 * bucket - 2 * A * p1, 1e-6);
}

TEST(calib_interleaved_pipeline_time)
{
    plan_time t = { .micro_s = 8, .stage_max_s = 2, .fill_s = 2 };
    plan_module s = strat(1, 1, 4, 0, 1, PLAN_RECOMP_NONE, false);
    /* 8 micro-batches of a 2 s stage: (8 + 3) x 2 */
    CHECK_NEAR(plan_chunk_time(&t, &s, 8), 22, 1e-12);
    s.vp = 2;    /* the bubble shrinks to 3/2 stage times: (8 + 1.5) x 2 */
    CHECK_NEAR(plan_chunk_time(&t, &s, 8), 19, 1e-12);
    /* the other stages at 1 s each: the pacing stage's 8 passes and theirs once, 8 x 2 + 3 x 1 */
    s.vp = 1;
    t.fill_s = 1;
    CHECK_NEAR(plan_chunk_time(&t, &s, 8), 19, 1e-12);
    /* 4 stages x 2 chunks hand off 7 times each way instead of 3 */
    model_t m = gpt(false, false, 16);
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(8, &c, &w, &o);
    plan_module u = strat(1, 1, 4, 0, 1, PLAN_RECOMP_NONE, false);
    plan_time a, b;
    plan_micro_time(&m, 0, &u, &w, &c, &o, 1, &a);
    u.vp = 2;
    plan_micro_time(&m, 0, &u, &w, &c, &o, 1, &b);
    CHECK(a.pp_p2p_s > 0);
    CHECK_NEAR(b.pp_p2p_s, a.pp_p2p_s * 7 / 3, 1e-12);
}

/* Megatron-LM's scatter/gather of stage hand-offs (Narayanan et al. SC'21
 * sec. 4.1, on by default): without sequence parallelism each of the tp
 * ranks sends 1/tp of the rows and an all-gather over the tp group rebuilds
 * them; under sequence parallelism the rows are already the rank's shard;
 * dhp's executor sends the whole rows. The simulator's stage messages
 * carry the same wire bytes and all-gather. */
TEST(calib_megatron_scatters_stage_handoffs_over_tp)
{
    model_t m = gpt(false, false, 16);
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(8, &c, &w, &o);
    const cost_pool *pool = &c.pool[0];
    plan_module s = strat(1, 4, 2, 0, 1, PLAN_RECOMP_NONE, false);
    double bytes = plan_stage_hop_bytes(&m, 0, &s, &w, &o, 1);
    CHECK_NEAR(bytes, 2.0 * 256 * 1024, 1e-9);   /* bf16 rows of one sample, hidden wide */
    plan_hop_wire h = plan_stage_hop_wire(&m.mod[0], &s, pool, &o, bytes, false);
    CHECK_NEAR(h.wire_bytes, bytes / 4, 1e-9);
    CHECK_NEAR(h.gather_s, cost_collective_time(pool, COST_ALLGATHER, bytes, 4, 4), 1e-15);
    CHECK_NEAR(plan_stage_hop_time(&m, 0, &s, &w, &c, &o, 1, false, true).recv_s, cost_p2p_time(&c, 0, 0, true, bytes / 4) + h.gather_s, 1e-15);
    CHECK(plan_stage_hop_time(&m, 0, &s, &w, &c, &o, 1, true, true).send_s == 0);   /* Megatron's sends do not hold the sender */
    plan_module sp = strat(1, 4, 2, 0, 1, PLAN_RECOMP_NONE, true);
    double shard = plan_stage_hop_bytes(&m, 0, &sp, &w, &o, 1);
    CHECK_NEAR(shard, bytes / 4, 1e-9);
    h = plan_stage_hop_wire(&m.mod[0], &sp, pool, &o, shard, false);
    CHECK(h.wire_bytes == shard && h.gather_s == 0);
    o.target = PLAN_TARGET_DHP;
    h = plan_stage_hop_wire(&m.mod[0], &s, pool, &o, bytes, false);
    CHECK(h.wire_bytes == bytes && h.gather_s == 0);
}

TEST(calib_strategy_check_interleaving_and_uneven_stages)
{
    cost_cluster c = one_node();
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    char err[UTIL_ERR_LEN];
    model_t m10 = gpt(false, false, 10), m16 = gpt(false, false, 16);
    plan_module s = strat(1, 1, 4, 0, 1, PLAN_RECOMP_NONE, false);
    CHECK(plan_strategy_check(&m10, 0, &s, &w, &c, err) == UTIL_OK);           /* 2, 3, 3, 2 */
    s.vp = 2;   /* uneven chunks: stage 1's 3 blocks are chunks of 2 and 1 */
    CHECK(plan_strategy_check(&m10, 0, &s, &w, &c, err) == UTIL_OK);
    s.vp = 3;   /* stage 0's 2 blocks cannot make 3 chunks */
    CHECK(plan_strategy_check(&m10, 0, &s, &w, &c, err) == UTIL_EINVAL);
    CHECK(strstr(err, "vp 3") != NULL && strstr(err, "stage 0 holds 2") != NULL);
    s.vp = 2;
    CHECK(plan_strategy_check(&m16, 0, &s, &w, &c, err) == UTIL_OK);
    plan_module p1 = strat(4, 1, 1, 0, 1, PLAN_RECOMP_NONE, false);
    p1.vp = 2;
    CHECK(plan_strategy_check(&m16, 0, &p1, &w, &c, err) == UTIL_EINVAL);      /* vp without pp */
    plan_module deep = strat(1, 1, 8, 0, 1, PLAN_RECOMP_NONE, false);
    model_t m4 = gpt(false, false, 4);
    CHECK(plan_strategy_check(&m4, 0, &deep, &w, &c, err) == UTIL_EINVAL);     /* more stages than layers */
}

/* Ten blocks on 4 stages of 2 chunks (2, 3, 3, 2 blocks a stage): round 0
 * takes chunks of 1, 2, 2, 1 blocks (blocks 0, 1-2, 3-4, 5), round 1 one
 * block each (6, 7, 8, 9), as Megatron-LM lays virtual stages out in order. */
TEST(calib_interleaved_chunks_of_an_uneven_split)
{
    model_t m10 = gpt(false, false, 10);
    plan_module s = strat(1, 1, 4, 0, 1, PLAN_RECOMP_NONE, false);
    s.vp = 2;
    int first[8] = { 0, 1, 3, 5, 6, 7, 8, 9 }, count[8] = { 1, 2, 2, 1, 1, 1, 1, 1 };
    for (int g = 0; g < 8; g++) {
        plan_stage v = plan_vstage_of(&m10.mod[0], &s, g);
        CHECK_EQ_INT(v.first, first[g]);
        CHECK_EQ_INT(v.count, count[g]);
        CHECK(v.stem == (g == 0) && v.head == (g == 7));
    }
    plan_stage st = plan_stage_of(&m10.mod[0], &s, 1);
    CHECK_EQ_INT(st.count, 3);
    int held[3] = { 1, 2, 7 };
    for (int j = 0; j < 3; j++) CHECK_EQ_INT(plan_stage_block(&st, j), held[j]);
}

TEST(calib_strategy_keys_keep_the_old_ones_and_add_vp)
{
    model_t m = gpt(false, false, 16);
    cost_cluster c = one_node();
    plan_workload w = { .global_batch = 8, .text_tokens = 256 };
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_MSG(plan_from_strategy("llm:dp=1,tp=2,sp=1,pp=4,vp=2,zero=1,mb=1,rc=selective,seqpar=1,pool=0,gpus=8", &m,
                                 &c, &w, PLAN_COLOCATED, 8, 1, &p, err) == UTIL_OK, "%s", err);
    CHECK_EQ_INT(p.mod[0].vp, 2);
    CHECK_EQ_INT(p.mod[0].pp, 4);
    CHECK(p.mod[0].seq_parallel);
    /* the plan file keeps vp */
    static plan_t back;
    CHECK_MSG(test_plan_json_round_trip(&p, &back, err) == UTIL_OK, "%s", err);
    CHECK_EQ_INT(back.mod[0].vp, 2);
    CHECK(plan_from_strategy("llm:tp=2,vq=2", &m, &c, &w, PLAN_COLOCATED, 8, 1, &back, err) == UTIL_EINVAL);
    CHECK(strstr(err, "vp") != NULL);
}

/* Megatron-LM's selective recomputation re-runs the attention core only:
 * its recompute time is the layers' attention forward, nothing else. */
TEST(calib_megatron_selective_recomputes_the_attention_core)
{
    model_t m = gpt(false, false, 4);
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(2, &c, &w, &o);
    const cost_gpu *g = &c.pool[0].gpu;
    plan_module s = strat(1, 1, 1, 0, 2, PLAN_RECOMP_SELECTIVE, false);
    plan_time t;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 2, &t);
    /* 512 rows x 16 heads, causal: 512 x 16 x (257 / 2) scores of d = 64 per layer */
    double rows = 512.0 * 16, scores = rows * 128.5;
    CHECK_NEAR(t.recompute_s, 4 * cost_attention_forward_time(g, rows, scores, 64), 1e-12);
}

/* Unfused attention: per layer two GEMMs over the whole 256 x 256 score
 * matrix and the softmax's pass (read + write, 2 bytes each) forward;
 * dropout adds its pass over the scores (2 + 2 + 1 bytes) and over the
 * block's two hidden outputs. */
TEST(calib_unfused_attention_and_dropout_time_by_hand)
{
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(2, &c, &w, &o);
    const cost_gpu *g = &c.pool[0].gpu;
    plan_module s = strat(1, 1, 1, 0, 2, PLAN_RECOMP_NONE, false);
    model_t flash = gpt(false, false, 4), unf = gpt(true, false, 4), drop = gpt(true, true, 4);
    plan_time tf, tu, td;
    plan_micro_time(&flash, 0, &s, &w, &c, &o, 2, &tf);
    plan_micro_time(&unf, 0, &s, &w, &c, &o, 2, &tu);
    plan_micro_time(&drop, 0, &s, &w, &c, &o, 2, &td);
    double rows = 512.0 * 16, scores = rows * 256;
    double unfused = cost_gemm_time(g, rows, 256, 64) + cost_gemm_time(g, rows, 64, 256) + cost_memory_time(g, scores * 4);
    double fa = cost_attention_forward_time(g, rows, rows * 128.5, 64);
    CHECK_NEAR(tu.fwd_s - tf.fwd_s, 4 * (unfused - fa), 1e-9);
    /* dropout: the softmax and dropout pass reads and writes 4 + 5 bytes per score in one call instead of
     * 4, and the attention and MLP outputs' dropouts move 5 bytes per element of 512 x 1024 each */
    double dropout = cost_memory_time(g, scores * 9) - cost_memory_time(g, scores * 4)
                   + 2 * cost_memory_time(g, 512.0 * 1024 * 5);
    CHECK_NEAR(td.fwd_s - tu.fwd_s, 4 * dropout, 1e-9);
}

/* ZeRO-3 under the Megatron target: each unit gathered twice (forward,
 * backward) and its gradient reduce-scattered, a collective of its own. */
TEST(calib_zero3_collectives_per_unit)
{
    model_t m = gpt(false, false, 4);
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK(cost_cluster_load("2x8xh100", &c, err) == UTIL_OK);
    plan_workload w = { .global_batch = 16, .text_tokens = 256 };
    plan_options o;
    plan_options_default(&o);
    o.overlap = 0;   /* nothing hidden: the raw collectives */
    plan_module s = strat(16, 1, 1, 3, 1, PLAN_RECOMP_NONE, false);
    plan_time t;
    plan_micro_time(&m, 0, &s, &w, &c, &o, 1, &t);
    int64_t units[8];
    int n = plan_module_units(&m.mod[0]);
    plan_stage whole = plan_stage_of(&m.mod[0], &s, 0);
    plan_unit_sizes(&m.mod[0], 1, &whole, units);
    double want = 0;
    for (int u = 0; u < n; u++)   /* bf16 weights gathered, fp32 gradients reduced (bf16-mixed) */
        want += 2 * cost_collective_time(&c.pool[0], COST_ALLGATHER, 2.0 * units[u], 16, 8)
              + cost_collective_time(&c.pool[0], COST_REDUCESCATTER, 4.0 * units[u], 16, 8);
    CHECK_NEAR(t.zero_comm_s, want, 1e-12);
    /* each of the 3 x 6 collectives pays 15 ring steps across the nodes */
    CHECK(t.zero_comm_s > 3 * n * 15 * c.pool[0].inter.alpha_s);
}

/* A Llama-style block: RMSNorm, SwiGLU, GQA (16 heads, 4 kv heads of 64), no biases. */
static model_t llama(int layers)
{
    return test_llm("llama", "\"layers\": %d, \"hidden\": 1024, \"heads\": 16, \"kv_heads\": 4, \"ffn\": 2816,"
                    " \"vocab\": 1000", layers);
}

/* torchtitan's per-op checkpointing keeps, per token of a block, its input
 * [h], wq's [H d], wv's [KV d], w1's [f], w2's [h] outputs and the attention
 * output [H d] (2 bytes each) plus the fp32 log-sum-exp [H]; during backward
 * one block's full activations are live again. */
TEST(calib_torchtitan_op_checkpointing_memory_and_recompute)
{
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(2, &c, &w, &o);
    const cost_gpu *g = &c.pool[0].gpu;
    model_t m = llama(4);
    double t = 512, h = 1024, stem = 4 * t * h;
    plan_mem none, op;
    plan_module sn = strat(1, 1, 1, 0, 2, PLAN_RECOMP_NONE, false), so = strat(1, 1, 1, 0, 2, PLAN_RECOMP_OP, false);
    plan_module_memory(&m, 0, &sn, &w, &c.pool[0].gpu, &o, 1, &none);
    plan_module_memory(&m, 0, &so, &w, &c.pool[0].gpu, &o, 1, &op);
    double per_token = 2 * (1024 + 1024 + 256 + 2816 + 1024 + 1024) + 4 * 16;   /* 14392 bytes */
    CHECK_NEAR(op.activations, 4 * t * per_token + stem + (none.activations - stem) / 4, 1e-12);
    /* recompute: each block's forward less its attention core and the saved wq, wv, w1, w2 GEMMs;
     * a block's forward is what a second layer adds */
    model_t m1 = llama(1), m2 = llama(2);
    plan_time t1, t2;
    plan_micro_time(&m1, 0, &so, &w, &c, &o, 2, &t1);
    plan_micro_time(&m2, 0, &so, &w, &c, &o, 2, &t2);
    double block = t2.fwd_s - t1.fwd_s;
    double core = cost_attention_forward_time(g, t * 16, t * 16 * 128.5, 64);
    double saved = cost_gemm_time(g, t, 1024, 1024) + cost_gemm_time(g, t, 256, 1024) + cost_gemm_time(g, t, 2816, 1024)
                 + cost_gemm_time(g, t, 1024, 2816);
    CHECK_NEAR(t2.recompute_s, 2 * (block - core - saved), 1e-9);
    CHECK(t2.recompute_s > 0);
}

/* The logits' bytes of module 0 on one A100 node, batch 2 of 256 text tokens. */
static double logits_under(const model_t *m, const plan_module *s, plan_precision precision, plan_loss loss)
{
    cost_cluster c; plan_workload w; plan_options o;
    one_node_step(2, &c, &w, &o);
    o.precision = precision;
    o.loss = loss;
    plan_mem mem;
    plan_module_memory(m, 0, s, &w, &c.pool[0].gpu, &o, 1, &mem);
    return mem.logits;
}

/* The loss's logits at the larger of its forward and backward (plan_loss):
 * Megatron's vocab-parallel cross-entropy holds the bf16 logits and one fp32
 * copy (6 B each); PyTorch's F.cross_entropy (bf16-autocast's default) the
 * bf16 logits, the fp32 input and log_softmax's fp32 output forward (10 B),
 * three fp32 tensors backward with the logits freed (12 B), and as
 * loss_parallel over tp 2 one more fp32 each way (max(14, 16) = 16 B of
 * 1000 / 2 columns); flash-attn's fused loss the bf16 logits and their bf16
 * gradient (4 B). mb 2 x 256 positions = 512 head rows x vocab 1000. */
TEST(calib_loss_holds_its_logit_tensors)
{
    model_t m = gpt(false, false, 4);
    plan_module s = strat(1, 1, 1, 0, 2, PLAN_RECOMP_NONE, false);
    double rows = 512.0;
    CHECK_NEAR(logits_under(&m, &s, PLAN_OPT_MIXED_FP32, PLAN_LOSS_AUTO), rows * 1000 * (2 + 4), 1e-9);
    CHECK_NEAR(logits_under(&m, &s, PLAN_OPT_AUTOCAST, PLAN_LOSS_AUTO), rows * 1000 * 12, 1e-9);
    CHECK_NEAR(logits_under(&m, &s, PLAN_OPT_AUTOCAST, PLAN_LOSS_VOCAB_PARALLEL), rows * 1000 * (2 + 4), 1e-9);
    CHECK_NEAR(logits_under(&m, &s, PLAN_OPT_AUTOCAST, PLAN_LOSS_FUSED), rows * 1000 * (2 + 2), 1e-9);
    CHECK_NEAR(logits_under(&m, &s, PLAN_OPT_MIXED_FP32, PLAN_LOSS_TORCH), rows * 1000 * 12, 1e-9);
    plan_module tp2 = strat(1, 2, 1, 0, 2, PLAN_RECOMP_NONE, false);
    CHECK_NEAR(logits_under(&m, &tp2, PLAN_OPT_AUTOCAST, PLAN_LOSS_AUTO), rows * 500 * 16, 1e-9);
    CHECK_NEAR(logits_under(&m, &tp2, PLAN_OPT_MIXED_FP32, PLAN_LOSS_AUTO), rows * 500 * (2 + 4), 1e-9);

    char err[UTIL_ERR_LEN];
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    o.loss = PLAN_LOSS_FUSED;
    CHECK(plan_loss_check(&o, err) == UTIL_EINVAL && strstr(err, "use --target megatron"));
    o.target = PLAN_TARGET_MEGATRON;
    CHECK(plan_loss_check(&o, err) == UTIL_OK);
    plan_loss l;
    CHECK(plan_loss_parse("vocab-parallel", &l, err) == UTIL_OK && l == PLAN_LOSS_VOCAB_PARALLEL);
    CHECK(plan_loss_parse("xent", &l, err) != UTIL_OK);
}

/* Megatron's sequence parallelism splits the LLM's hidden rows only
 * (plan_seqpar_split): an encoder runs without it (Megatron-LM's vision
 * encoder and projection: vision_config.sequence_parallel = False;
 * plan_strategy_check refuses seqpar there), so a tp 2 vision module
 * marked seq_parallel (a plan the check would refuse) is priced and sized
 * exactly as without the mark: its blocks' norm and residual rows, its
 * final norm's and merger's inputs, its compute and the rows it hands on
 * stay whole, with no head term split alone. The LLM beside it does split. */
TEST(calib_encoders_keep_their_rows_whole_under_the_seqpar_rule)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK(model_load("qwen2.5-vl-7b", &m, err) == UTIL_OK);
    CHECK(cost_cluster_load("8xh100", &c, err) == UTIL_OK);
    plan_workload w = { .global_batch = 2, .images_per_sample = 1, .image_tokens = 1024, .text_tokens = 256 };
    plan_options o;
    plan_options_default(&o);
    int vi = model_find_kind(&m, MODEL_VISION), li = m.llm;
    plan_module plain = strat(1, 2, 1, 0, 1, PLAN_RECOMP_NONE, false), marked = strat(1, 2, 1, 0, 1, PLAN_RECOMP_NONE, true);
    CHECK(plan_seqpar_split(&m.mod[vi], &marked) == 1 && plan_seqpar_split(&m.mod[li], &marked) == 2);
    plan_mem a, b;
    plan_module_memory(&m, vi, &plain, &w, &c.pool[0].gpu, &o, 1, &a);
    plan_module_memory(&m, vi, &marked, &w, &c.pool[0].gpu, &o, 1, &b);
    CHECK(a.activations > 0);
    CHECK_NEAR(b.activations, a.activations, 1e-12);
    CHECK_NEAR(b.block_acts, a.block_acts, 1e-12);
    plan_time ta, tb;
    plan_micro_time(&m, vi, &plain, &w, &c, &o, 1, &ta);
    plan_micro_time(&m, vi, &marked, &w, &c, &o, 1, &tb);
    CHECK_NEAR(tb.fwd_s, ta.fwd_s, 1e-12);
    CHECK_NEAR(tb.bwd_s, ta.bwd_s, 1e-12);
    CHECK_NEAR(plan_stage_hop_bytes(&m, vi, &marked, &w, &o, 1), plan_stage_hop_bytes(&m, vi, &plain, &w, &o, 1), 1e-12);
    plan_module_memory(&m, li, &plain, &w, &c.pool[0].gpu, &o, 1, &a);
    plan_module_memory(&m, li, &marked, &w, &c.pool[0].gpu, &o, 1, &b);
    CHECK(b.activations < a.activations);
}
