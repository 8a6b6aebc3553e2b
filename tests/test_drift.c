/* The guard against drift between the executor and the cost model: one
 * micro-batch of a module runs through a backend and a communicator that
 * count every kernel call and collective (tests/drift_count.c), and the
 * counts are compared, pass by pass, with what planner/cost.c prices for
 * the same module, strategy and workload (tests/drift_price.c): per
 * element-wise kernel kind its calls and elements, the GEMMs' number, sum of
 * m n k and every (m, n, k), attention calls, rows and scores, per
 * collective its calls and elements, and the blocking exchanges.
 *
 * Every difference must be listed in the case's `pinned` lines, word for
 * word: a drift found and reported, not yet fixed (a cause tag). A
 * difference not listed fails, and so does a listed one that no longer
 * happens (its fix then removes the line). Known drifts: none. Fixed (the
 * dhp target prices what runs; the Megatron target keeps Megatron-LM's
 * layout): D1 q, k, v and gate, up as separate GEMMs (price_linears); D2 the
 * LLM head's predicting rows gathered and their gradients scatter-added in
 * one call each (gather_rows, scatter_add_rows), the stem's per-sample
 * placement priced per sample (price_llm_stem), under context parallelism
 * per run of text positions a rank holds; D3 the Ulysses packing through the
 * backend's transpose_blocks (priced as COPY, price_ulysses_copies); D4 an
 * encoder's window layers whose ranks hold whole windows kept local by both
 * (plan_cp_layer); D5 a tensor-parallel encoder's patch embedding and merger
 * whole on every rank (encoder_ends_split). */
#include "test.h"
#include "tests/drift.h"

#include <stdarg.h>
#include <stdlib.h>

#define MAX_DIFFS 128
typedef struct { int n; char line[MAX_DIFFS][200]; char prefix[24]; } diffs;

/* Appends "<what>: cost model X, executor Y" when the two differ. */
static void differ(diffs *d, double model, double counted, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void differ(diffs *d, double model, double counted, const char *fmt, ...)
{
    if (fabs(model - counted) <= 1e-6 * fmax(1.0, fabs(counted)) || d->n == MAX_DIFFS) return;
    char what[120];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(d->line[d->n++], sizeof d->line[0], "%s%s: cost model %.10g, executor %.10g", d->prefix, what, model,
             counted);
}

static const drift_shape *shape_of(const drift_tally *t, const drift_shape *s)
{
    for (int i = 0; i < t->n_shapes; i++)
        if (t->shape[i].m == s->m && t->shape[i].n == s->n && t->shape[i].k == s->k) return &t->shape[i];
    return NULL;
}

static void compare(const drift_tally *mt, const drift_tally *ct, diffs *d)
{
    static const char *const pass_name[DRIFT_NPH] = { "fwd", "bwd" };
    static const char *const coll_name[DRIFT_NCOLL] = { "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                                        "p2p message" };
    for (int ph = 0; ph < DRIFT_NPH; ph++) {
        const char *p = pass_name[ph];
        for (int k = 0; k < COST_N_EW; k++) {
            differ(d, mt->ew_calls[ph][k], ct->ew_calls[ph][k], "%s %s calls", p, cost_ew_name(k));
            differ(d, mt->ew_elems[ph][k], ct->ew_elems[ph][k], "%s %s elements", p, cost_ew_name(k));
        }
        differ(d, 2 * ct->ew_elems[ph][COST_EW_CE], ct->ce_passes[ph], "%s cross-entropy exp-sum + gradient logits", p);
        differ(d, mt->gemm_calls[ph], ct->gemm_calls[ph], "%s GEMM calls", p);
        differ(d, mt->gemm_mnk[ph], ct->gemm_mnk[ph], "%s GEMM sum of m*n*k", p);
        for (int i = 0; i < mt->n_shapes + ct->n_shapes; i++) {   /* every shape either has, once */
            const drift_shape *s = i < mt->n_shapes ? &mt->shape[i] : &ct->shape[i - mt->n_shapes];
            if (i >= mt->n_shapes && shape_of(mt, s)) continue;
            const drift_shape *in_m = shape_of(mt, s), *in_c = shape_of(ct, s);
            differ(d, in_m ? in_m->count[ph] : 0, in_c ? in_c->count[ph] : 0, "%s GEMM (%g, %g, %g) calls", p, s->m,
                   s->n, s->k);
        }
        differ(d, mt->att_calls[ph], ct->att_calls[ph], "%s attention calls", p);
        for (int kernel = 0; kernel < 2; kernel++) {
            const char *kn = kernel ? "attention_backward" : "attention_forward";
            differ(d, mt->att_rows[ph][kernel], ct->att_rows[ph][kernel], "%s %s rows", p, kn);
            differ(d, mt->att_scores[ph][kernel], ct->att_scores[ph][kernel], "%s %s scores", p, kn);
        }
        for (int op = 0; op < DRIFT_NCOLL; op++) {
            differ(d, mt->coll_calls[ph][op], ct->coll_calls[ph][op], "%s %s calls", p, coll_name[op]);
            differ(d, mt->coll_elems[ph][op], ct->coll_elems[ph][op], "%s %s elements", p, coll_name[op]);
        }
        differ(d, mt->syncs[ph], ct->syncs[ph], "%s blocking exchanges (syncs)", p);
    }
    differ(d, 0, ct->unpriced, "kernels outside any micro-batch price (scale, adamw)");
}

static bool listed(const char *const *lines, const char *line)
{
    for (int k = 0; lines && lines[k]; k++)
        if (!strcmp(lines[k], line)) return true;
    return false;
}

/* Runs the case and compares it with the cost model; the differences must
 * be exactly the pinned lines (NULL-terminated). Each difference not pinned
 * and each pinned line not seen is printed. The LLM's sp ranks hold
 * different shares of its text and predictions (and of ring attention's
 * blocks): each is compared with the cost model's price of its own sp rank
 * (plan_cp_micro_time), its lines prefixed "rank r: "; other ranks run the
 * same calls. */
static void drift_check(const drift_case *in, const char *const *pinned)
{
    drift_case c = *in, *dc = &c;
    dc->tp = dc->tp > 1 ? dc->tp : 1;
    dc->sp = dc->sp > 1 ? dc->sp : 1;
    char err[UTIL_ERR_LEN] = "";
    model_t m;
    CHECK_MSG(model_load(dc->model, &m, err) == UTIL_OK, "%s", err);
    int module = dc->vision ? model_find_kind(&m, MODEL_VISION) : dc->audio ? model_find_kind(&m, MODEL_AUDIO) : m.llm;
    CHECK(module >= 0);
    model_module *mm = &m.mod[module];
    mm->frozen = dc->frozen;
    if (dc->layers > 0) mm->layers = dc->layers;
    if (dc->biases) mm->out_bias = mm->mlp_bias = true;
    if (dc->heads) mm->heads = dc->heads;
    if (dc->kv_heads) mm->kv_heads = dc->kv_heads;
    int n_ranks = dc->tp * dc->sp;
    bool per_rank = !dc->vision && dc->sp > 1;
    drift_tally *t = calloc(2 * DRIFT_MAX_RANKS, sizeof *t), *mt = t + DRIFT_MAX_RANKS;
    diffs *d = calloc(1, sizeof *d);
    CHECK(t && d);
    int rc = drift_count(dc, &m, module, t, err);
    bool symmetric = true, overflow = false;
    for (int r = 0; !rc && r < (per_rank ? n_ranks : 1); r++) {
        rc = drift_price(dc, &m, module, r / dc->tp, &mt[r]);
        overflow |= mt[r].overflow;
        if (per_rank) snprintf(d->prefix, sizeof d->prefix, "rank %d: ", r);
        if (!rc) compare(&mt[r], &t[r], d);
    }
    for (int r = 0; r < n_ranks; r++) {
        int same_as = per_rank ? r - r % dc->tp : 0;   /* the ranks ran the same calls (per sp rank) */
        symmetric &= !memcmp(&t[same_as], &t[r], sizeof *t);
        overflow |= t[r].overflow;
    }
    int unexpected = 0, gone = 0;
    for (int i = 0; i < d->n; i++)
        if (!listed(pinned, d->line[i])) {
            printf("# %s: not pinned: %s\n", dc->name, d->line[i]);
            unexpected++;
        }
    for (int k = 0; pinned && pinned[k]; k++) {
        bool seen = false;
        for (int i = 0; i < d->n; i++) seen |= !strcmp(pinned[k], d->line[i]);
        if (!seen) {
            printf("# %s: pinned but not seen (fixed? remove the line): %s\n", dc->name, pinned[k]);
            gone++;
        }
    }
    int n = d->n;
    free(t);
    free(d);
    CHECK_MSG(rc == UTIL_OK, "%s: rc %d: %s", dc->name, rc, err);
    CHECK_MSG(!overflow, "%s: more GEMM shapes than the tallies hold", dc->name);
    CHECK_MSG(symmetric, "%s: the ranks counted different calls", dc->name);
    CHECK_MSG(n < MAX_DIFFS, "%s: %d differences or more", dc->name, MAX_DIFFS);
    CHECK_MSG(unexpected == 0 && gone == 0, "%s: %d differences from the cost model not pinned, %d pinned not seen (of %d)",
              dc->name, unexpected, gone, n);
}

#define CASE(...) (&(const drift_case){ __VA_ARGS__ })

/* tiny-vl's LLM on one rank: 52 rows (2 x (16 vision + 10 text)), q 64 and
 * k, v 32 wide, SwiGLU 128, 2 blocks, 18 predicting rows. */
TEST(drift_llm)
{
    drift_check(CASE(.name = "llm", .model = "tiny-vl"), NULL);
}

TEST(drift_llm_selective_recompute)
{
    drift_check(CASE(.name = "llm selective", .model = "tiny-vl", .recompute = PLAN_RECOMP_SELECTIVE), NULL);
}

TEST(drift_llm_full_recompute)
{
    drift_check(CASE(.name = "llm full", .model = "tiny-vl", .recompute = PLAN_RECOMP_FULL), NULL);
}

/* Partial full recomputation (rc_layers): the first of the 2 blocks re-runs
 * its forward in backward, the second keeps everything. */
TEST(drift_llm_partial_recompute)
{
    drift_check(CASE(.name = "llm full:1", .model = "tiny-vl", .recompute = PLAN_RECOMP_FULL, .recompute_layers = 1), NULL);
}

/* No weight gradients: only the input gradients' GEMMs backward. */
TEST(drift_llm_frozen)
{
    drift_check(CASE(.name = "llm frozen", .model = "tiny-vl", .frozen = true), NULL);
}

/* tiny-vl's vision encoder on one rank: 128 patch rows, q, k, v 32 wide,
 * SwiGLU 64, 2 blocks, 32 merged rows. */
TEST(drift_vision)
{
    drift_check(CASE(.name = "vision", .model = "tiny-vl", .vision = true), NULL);
}

TEST(drift_vision_selective_recompute)
{
    drift_check(CASE(.name = "vision selective", .model = "tiny-vl", .vision = true,
                     .recompute = PLAN_RECOMP_SELECTIVE), NULL);
}

TEST(drift_vision_full_recompute)
{
    drift_check(CASE(.name = "vision full", .model = "tiny-vl", .vision = true, .recompute = PLAN_RECOMP_FULL), NULL);
}

/* A frozen encoder runs no backward at all. */
TEST(drift_vision_frozen)
{
    drift_check(CASE(.name = "vision frozen", .model = "tiny-vl", .vision = true, .frozen = true), NULL);
}

/* 4 blocks, 2 of them window attention (16 patches) */
TEST(drift_vision_window_attention)
{
    drift_check(CASE(.name = "vision window", .model = "tiny-vl-window", .vision = true), NULL);
}

/* The first 3 of the 4 blocks recompute: window and full attention mixed. */
TEST(drift_vision_window_partial_recompute)
{
    drift_check(CASE(.name = "vision window full:3", .model = "tiny-vl-window", .vision = true,
                     .recompute = PLAN_RECOMP_FULL, .recompute_layers = 3), NULL);
}

/* The LLM's blocks split over 2 ranks (q 32, k, v 16, SwiGLU 64 each), with
 * attention-output and MLP biases; the collectives agree. */
TEST(drift_llm_tp2)
{
    drift_check(CASE(.name = "llm tp2", .model = "tiny-vl", .tp = 2, .biases = true), NULL);
}

TEST(drift_llm_tp2_sequence_parallel)
{
    drift_check(CASE(.name = "llm tp2 seqpar", .model = "tiny-vl", .tp = 2, .seqpar = true, .biases = true), NULL);
}

TEST(drift_llm_tp2_sequence_parallel_full_recompute)
{
    drift_check(CASE(.name = "llm tp2 seqpar full", .model = "tiny-vl", .tp = 2, .seqpar = true, .biases = true,
                     .recompute = PLAN_RECOMP_FULL), NULL);
}

/* The recomputed block's tensor-parallel exchanges issued again, the other's not. */
TEST(drift_llm_tp2_sequence_parallel_partial_recompute)
{
    drift_check(CASE(.name = "llm tp2 seqpar full:1", .model = "tiny-vl", .tp = 2, .seqpar = true, .biases = true,
                     .recompute = PLAN_RECOMP_FULL, .recompute_layers = 1), NULL);
}

/* Ulysses over 2 ranks: 64 patch rows each. */
TEST(drift_vision_ulysses_sp2)
{
    drift_check(CASE(.name = "vision sp2", .model = "tiny-vl", .vision = true, .sp = 2), NULL);
}

TEST(drift_vision_window_ulysses_sp2)
{
    drift_check(CASE(.name = "vision window sp2", .model = "tiny-vl-window", .vision = true, .sp = 2), NULL);
}

/* Full recomputation re-runs the all-to-all blocks' packing copies in backward. */
TEST(drift_vision_window_ulysses_sp2_full_recompute)
{
    drift_check(CASE(.name = "vision window sp2 full", .model = "tiny-vl-window", .vision = true, .sp = 2,
                     .recompute = PLAN_RECOMP_FULL), NULL);
}

/* Of the recomputed blocks (the first 2) only the all-to-all ones exchange again. */
TEST(drift_vision_window_ulysses_sp2_partial_recompute)
{
    drift_check(CASE(.name = "vision window sp2 full:2", .model = "tiny-vl-window", .vision = true, .sp = 2,
                     .recompute = PLAN_RECOMP_FULL, .recompute_layers = 2), NULL);
}

/* The encoder's blocks split over 2 ranks; its patch embedding and merger whole on each. */
TEST(drift_vision_tp2)
{
    drift_check(CASE(.name = "vision tp2", .model = "tiny-vl", .vision = true, .tp = 2), NULL);
}

/* Pipeline stages: tiny-vl's LLM with 3 blocks in 3 stages of one block
 * each, plan_stage_micro_time against ex_stage_forward / ex_stage_backward:
 * the first holds the stem, the last the head, and the middle one neither
 * (the previous stage's rows copied in forward, the next one's gradient in
 * backward). */
TEST(drift_llm_pipeline_stages)
{
    drift_check(CASE(.name = "llm stage 0 of 3", .model = "tiny-vl", .layers = 3, .pp = 3, .stage = 0), NULL);
    drift_check(CASE(.name = "llm stage 1 of 3", .model = "tiny-vl", .layers = 3, .pp = 3, .stage = 1), NULL);
    drift_check(CASE(.name = "llm stage 2 of 3", .model = "tiny-vl", .layers = 3, .pp = 3, .stage = 2), NULL);
}

/* The same under tensor and sequence parallelism: the boundary holds this
 * rank's N / tp rows. */
TEST(drift_llm_pipeline_middle_stage_tp2_sequence_parallel)
{
    drift_check(CASE(.name = "llm stage 1 of 3 tp2 seqpar", .model = "tiny-vl", .layers = 3, .pp = 3, .stage = 1,
                     .tp = 2, .seqpar = true, .biases = true), NULL);
}

/* Interleaved stages: a 4-block LLM on 2 ranks of 2 one-block chunks; the
 * second rank's first chunk, the first rank's second chunk (fed by the last
 * rank's first chunk) and the head chunk, each priced as its virtual stage. */
TEST(drift_llm_interleaved_chunks)
{
    drift_check(CASE(.name = "llm virtual stage 1 of 4", .model = "tiny-vl", .layers = 4, .pp = 2, .vp = 2, .stage = 1), NULL);
    drift_check(CASE(.name = "llm virtual stage 2 of 4", .model = "tiny-vl", .layers = 4, .pp = 2, .vp = 2, .stage = 2), NULL);
    drift_check(CASE(.name = "llm virtual stage 3 of 4", .model = "tiny-vl", .layers = 4, .pp = 2, .vp = 2, .stage = 3), NULL);
}

/* 8 blocks over 2 ranks of 2 chunks of 2: the first block of each chunk recomputes. */
TEST(drift_llm_interleaved_chunks_partial_recompute)
{
    drift_check(CASE(.name = "llm virtual stage 1 of 4, full:1", .model = "tiny-vl", .layers = 8, .pp = 2, .vp = 2,
                     .stage = 1, .recompute = PLAN_RECOMP_FULL, .recompute_layers = 1), NULL);
    drift_check(CASE(.name = "llm virtual stage 2 of 4, full:1", .model = "tiny-vl", .layers = 8, .pp = 2, .vp = 2,
                     .stage = 2, .recompute = PLAN_RECOMP_FULL, .recompute_layers = 1), NULL);
}

/* split=ends: a 4-block LLM on 2 ranks of 3 one-slot chunks; virtual stage 0
 * holds the embedding alone (its output sent on, the gradient's rows
 * copied in), virtual stage 5 the head alone (the rows copied in, the
 * gradient sent back), and virtual stage 2 one block between them. */
TEST(drift_llm_split_ends_chunks)
{
    drift_check(CASE(.name = "llm embedding-alone chunk", .model = "tiny-vl", .layers = 4, .pp = 2, .vp = 3, .stage = 0,
                     .split_ends = true), NULL);
    drift_check(CASE(.name = "llm block chunk, split ends", .model = "tiny-vl", .layers = 4, .pp = 2, .vp = 3, .stage = 2,
                     .split_ends = true), NULL);
    drift_check(CASE(.name = "llm head-alone chunk", .model = "tiny-vl", .layers = 4, .pp = 2, .vp = 3, .stage = 5,
                     .split_ends = true), NULL);
}

/* The first and last stages of a vision pipeline: the patch embedding with
 * the boundary's gradient copy, and the merger with its input copy. */
TEST(drift_vision_pipeline_end_stages)
{
    drift_check(CASE(.name = "vision stage 0 of 2", .model = "tiny-vl", .vision = true, .pp = 2, .stage = 0), NULL);
    drift_check(CASE(.name = "vision stage 1 of 2", .model = "tiny-vl", .vision = true, .pp = 2, .stage = 1), NULL);
}

/* tiny-audio's audio encoder on one rank: 2 clips of 16 mel frames, 16 rows
 * after the conv stem, q, k, v 32 wide, a GELU MLP of 64, 2 LayerNorm
 * blocks, 8 pooled rows. The conv stem, positions, pooling, final norm and
 * projector agree call for call. */
TEST(drift_audio)
{
    drift_check(CASE(.name = "audio", .model = "tiny-audio", .audio = true), NULL);
}

/* Qwen2.5-Omni's sinusoids (through the backend's add, as the learned
 * table's rows) and every block re-run from its input in backward. */
TEST(drift_audio_sinusoids_full_recompute)
{
    drift_check(CASE(.name = "audio omni full", .model = "tiny-omni", .audio = true, .recompute = PLAN_RECOMP_FULL), NULL);
}

/* A frozen encoder runs no backward. */
TEST(drift_audio_frozen)
{
    drift_check(CASE(.name = "audio frozen", .model = "tiny-audio", .audio = true, .frozen = true), NULL);
}

/* Ulysses over 2 ranks of one clip each: the stem's segments, the
 * re-sharding copies and the pooling per rank. */
TEST(drift_audio_ulysses_sp2)
{
    drift_check(CASE(.name = "audio sp2", .model = "tiny-audio", .audio = true, .sp = 2), NULL);
}

/* Tensor parallel: heads and the GELU MLP's columns split; the stem, the
 * final norm and the projector whole on every rank, as priced. */
TEST(drift_audio_tp2)
{
    drift_check(CASE(.name = "audio tp2", .model = "tiny-audio", .audio = true, .tp = 2), NULL);
}

/* The LLM's context parallelism over 2 ranks, Ulysses: 26 positions per
 * sample, rank 0 holds 0..12 (13 vision rows), rank 1 13..25 (3 vision rows,
 * the 10 text rows, 9 predictions each); two samples: each all-to-all's rows
 * are regrouped by sample too. */
TEST(drift_llm_ulysses_sp2)
{
    drift_check(CASE(.name = "llm ulysses sp2", .model = "tiny-vl", .sp = 2), NULL);
}

TEST(drift_llm_ulysses_sp2_full_recompute)
{
    drift_check(CASE(.name = "llm ulysses sp2 full", .model = "tiny-vl", .sp = 2, .recompute = PLAN_RECOMP_FULL), NULL);
}

/* Ring attention: 3 heads, 1 kv head (2 does not divide them), 12 text
 * tokens: 28 positions per sample in 4 chunks of 7, rank 0 holds chunks 0
 * and 3, rank 1 chunks 1 and 2. */
TEST(drift_llm_ring_sp2)
{
    drift_check(CASE(.name = "llm ring sp2", .model = "tiny-vl", .sp = 2, .heads = 3, .kv_heads = 1, .text = 12), NULL);
}

/* The recomputed block's ring passes its K/V blocks again, the other's not. */
TEST(drift_llm_ring_sp2_partial_recompute)
{
    drift_check(CASE(.name = "llm ring sp2 full:1", .model = "tiny-vl", .sp = 2, .heads = 3, .kv_heads = 1, .text = 12,
                     .recompute = PLAN_RECOMP_FULL, .recompute_layers = 1), NULL);
}

/* tiny-omni's LLM: each sample's 16 vision rows, then its clip's 4 pooled
 * audio rows (16 mel frames), then 10 text tokens: 30 positions; under
 * Ulysses over 2 ranks, rank 0 holds 15 encoder rows, rank 1 the other 5 and
 * the text. */
TEST(drift_llm_omni_vision_and_audio_rows)
{
    drift_check(CASE(.name = "llm omni", .model = "tiny-omni"), NULL);
}

TEST(drift_llm_omni_ulysses_sp2)
{
    drift_check(CASE(.name = "llm omni ulysses sp2", .model = "tiny-omni", .sp = 2), NULL);
}

/* Ring attention over 2 ranks (3 heads, 1 kv head), 12 text tokens: 32
 * positions in 4 chunks of 8; rank 1's chunks 1 and 2 cut through the
 * vision rows, the audio rows and the text. */
TEST(drift_llm_omni_ring_sp2)
{
    drift_check(CASE(.name = "llm omni ring sp2", .model = "tiny-omni", .sp = 2, .heads = 3, .kv_heads = 1, .text = 12), NULL);
}

/* Selective recomputation re-runs ring attention in backward: its K/V passes too. */
TEST(drift_llm_ring_sp2_selective_recompute)
{
    drift_check(CASE(.name = "llm ring sp2 selective", .model = "tiny-vl", .sp = 2, .heads = 3, .kv_heads = 1, .text = 12,
                     .recompute = PLAN_RECOMP_SELECTIVE), NULL);
}
