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
 * word: a drift found and reported, not yet fixed (the cause tags D1..D5
 * below). A difference not listed fails, and so does a listed one that no
 * longer happens (its fix then removes the line). Known drifts:
 *  D1  the executor runs q, k, v as three GEMMs and SwiGLU's gate and up as
 *      two (executor/block.c); the cost model prices one fused GEMM each,
 *      n = (H + 2 KV) hd / tp and 2 ffn / tp, forward and both backward
 *      (planner/cost.c price_block): the same m n k; per block 3 GEMMs
 *      more forward, 6 more backward and 3 more again where a full
 *      recomputation re-runs the forward.
 *  D2  call counts of the LLM's ends: the executor copies each predicting
 *      row's final hidden state to the head one call at a time (n_pred calls
 *      of hidden) and adds each one's gradient back one at a time, and places
 *      each sample's vision rows and text rows (its embedding lookup) in
 *      calls of their own, and backward copies each sample's vision rows'
 *      gradient and adds its text rows' to the embedding per sample
 *      (executor/llm.c); the cost model prices one call for each
 *      (price_llm_ends). Elements agree.
 *  D3  Ulysses re-sharding: the executor packs and unpacks around its
 *      all-to-alls with memcpy (block.c sp_heads_to_rows, sp_rows_to_heads),
 *      outside the backend; the cost model prices 4 COPY calls per
 *      all-to-all layer forward and 4 backward (price_ulysses_copies).
 *  D4  Ulysses window layers: the cost model keeps window-attention layers
 *      local when every rank holds whole windows (window_layers_local); the
 *      executor runs the all-to-alls in every layer.
 *  D5  a tensor-parallel vision encoder: the executor keeps the patch
 *      embedding and the merger whole on every rank (plan_module_tensors);
 *      the cost model prices them split over tp (price_encoder_ends: hidden
 *      / tp, proj_hidden / tp): their GEMMs, biases, GELU and the merger's
 *      zeroed gradients. */
#include "test.h"
#include "tests/drift.h"

#include <stdarg.h>
#include <stdlib.h>

#define MAX_DIFFS 128
typedef struct { int n; char line[MAX_DIFFS][200]; } diffs;

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
    snprintf(d->line[d->n++], sizeof d->line[0], "%s: cost model %.10g, executor %.10g", what, model, counted);
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
    static const char *const coll_name[DRIFT_NCOLL] = { "all-reduce", "all-gather", "reduce-scatter", "all-to-all" };
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
 * and each pinned line not seen is printed. */
static void drift_check(const drift_case *in, const char *const *pinned)
{
    drift_case c = *in, *dc = &c;
    dc->tp = dc->tp > 1 ? dc->tp : 1;
    dc->sp = dc->sp > 1 ? dc->sp : 1;
    char err[UTIL_ERR_LEN] = "";
    model_t m;
    CHECK_MSG(model_load(dc->model, &m, err) == UTIL_OK, "%s", err);
    int module = dc->vision ? model_find_kind(&m, MODEL_VISION) : m.llm;
    CHECK(module >= 0);
    model_module *mm = &m.mod[module];
    mm->frozen = dc->frozen;
    if (dc->biases) mm->out_bias = mm->mlp_bias = true;
    int n_ranks = dc->tp * dc->sp;
    drift_tally *t = calloc(DRIFT_MAX_RANKS + 1, sizeof *t), *mt = t + DRIFT_MAX_RANKS;
    diffs *d = calloc(1, sizeof *d);
    CHECK(t && d);
    int rc = drift_count(dc, &m, module, t, err);
    if (!rc) rc = drift_price(dc, &m, module, mt);
    bool symmetric = true, overflow = mt->overflow;
    for (int r = 0; r < n_ranks; r++) {
        symmetric &= !memcmp(&t[0], &t[r], sizeof *t);   /* the ranks ran the same calls */
        overflow |= t[r].overflow;
    }
    if (!rc) compare(mt, &t[0], d);
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
#define LLM_FWD                                                         \
    "fwd copy calls: cost model 2, executor 22",                  /* D2 */ \
    "fwd GEMM calls: cost model 9, executor 15",                  /* D1 */ \
    "fwd GEMM (52, 64, 64) calls: cost model 2, executor 4",      /* D1 */ \
    "fwd GEMM (52, 128, 64) calls: cost model 2, executor 4",     /* D1 */ \
    "fwd GEMM (52, 256, 64) calls: cost model 2, executor 0",     /* D1 */ \
    "fwd GEMM (52, 32, 64) calls: cost model 0, executor 4"       /* D1 */
#define LLM_BWD                                                         \
    "bwd copy calls: cost model 1, executor 2",                   /* D2 */ \
    "bwd add calls: cost model 2, executor 20",                   /* D2 */ \
    "bwd GEMM calls: cost model 18, executor 30",                 /* D1 */ \
    "bwd GEMM (52, 64, 64) calls: cost model 2, executor 4",      /* D1 */ \
    "bwd GEMM (52, 64, 128) calls: cost model 2, executor 4",     /* D1 */ \
    "bwd GEMM (52, 64, 256) calls: cost model 2, executor 0",     /* D1 */ \
    "bwd GEMM (64, 64, 52) calls: cost model 2, executor 4",      /* D1 */ \
    "bwd GEMM (64, 128, 52) calls: cost model 2, executor 4",     /* D1 */ \
    "bwd GEMM (64, 256, 52) calls: cost model 2, executor 0",     /* D1 */ \
    "bwd GEMM (52, 64, 32) calls: cost model 0, executor 4",      /* D1 */ \
    "bwd GEMM (64, 32, 52) calls: cost model 0, executor 4"       /* D1 */

TEST(drift_llm)
{
    static const char *const pinned[] = { LLM_FWD, LLM_BWD, NULL };
    drift_check(CASE(.name = "llm", .model = "tiny-vl"), pinned);
}

TEST(drift_llm_selective_recompute)
{
    static const char *const pinned[] = { LLM_FWD, LLM_BWD, NULL };
    drift_check(CASE(.name = "llm selective", .model = "tiny-vl", .recompute = PLAN_RECOMP_SELECTIVE), pinned);
}

TEST(drift_llm_full_recompute)
{
    static const char *const pinned[] = {
        LLM_FWD,
        "bwd copy calls: cost model 1, executor 2",                   /* D2 */
        "bwd add calls: cost model 6, executor 24",                   /* D2 */
        "bwd GEMM calls: cost model 26, executor 44",                 /* D1 */
        "bwd GEMM (52, 64, 64) calls: cost model 4, executor 8",      /* D1 */
        "bwd GEMM (52, 64, 128) calls: cost model 4, executor 6",     /* D1 */
        "bwd GEMM (52, 64, 256) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (52, 128, 64) calls: cost model 4, executor 6",     /* D1 */
        "bwd GEMM (52, 256, 64) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (64, 64, 52) calls: cost model 2, executor 4",      /* D1 */
        "bwd GEMM (64, 128, 52) calls: cost model 2, executor 4",     /* D1 */
        "bwd GEMM (64, 256, 52) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (52, 32, 64) calls: cost model 0, executor 4",      /* D1 */
        "bwd GEMM (52, 64, 32) calls: cost model 0, executor 4",      /* D1 */
        "bwd GEMM (64, 32, 52) calls: cost model 0, executor 4",      /* D1 */
        NULL
    };
    drift_check(CASE(.name = "llm full", .model = "tiny-vl", .recompute = PLAN_RECOMP_FULL), pinned);
}

/* No weight gradients: only the input gradients' GEMMs backward. */
TEST(drift_llm_frozen)
{
    static const char *const pinned[] = {
        LLM_FWD,
        "bwd copy calls: cost model 1, executor 2",                   /* D2 */
        "bwd add calls: cost model 1, executor 18",                   /* D2 */
        "bwd GEMM calls: cost model 9, executor 15",                  /* D1 */
        "bwd GEMM (52, 64, 64) calls: cost model 2, executor 4",      /* D1 */
        "bwd GEMM (52, 64, 128) calls: cost model 2, executor 4",     /* D1 */
        "bwd GEMM (52, 64, 256) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (52, 64, 32) calls: cost model 0, executor 4",      /* D1 */
        NULL
    };
    drift_check(CASE(.name = "llm frozen", .model = "tiny-vl", .frozen = true), pinned);
}

/* tiny-vl's vision encoder on one rank: 128 patch rows, q, k, v 32 wide,
 * SwiGLU 64, 2 blocks, 32 merged rows. */
#define VISION_FWD                                                      \
    "fwd GEMM calls: cost model 11, executor 17",                 /* D1 */ \
    "fwd GEMM (128, 32, 32) calls: cost model 2, executor 8",     /* D1 */ \
    "fwd GEMM (128, 64, 32) calls: cost model 0, executor 4",     /* D1 */ \
    "fwd GEMM (128, 96, 32) calls: cost model 2, executor 0",     /* D1 */ \
    "fwd GEMM (128, 128, 32) calls: cost model 2, executor 0"     /* D1 */
#define VISION_BWD                                                      \
    "bwd GEMM calls: cost model 21, executor 33",                 /* D1 */ \
    "bwd GEMM (32, 32, 128) calls: cost model 2, executor 8",     /* D1 */ \
    "bwd GEMM (32, 64, 128) calls: cost model 0, executor 4",     /* D1 */ \
    "bwd GEMM (32, 96, 128) calls: cost model 2, executor 0",     /* D1 */ \
    "bwd GEMM (32, 128, 128) calls: cost model 3, executor 1",    /* D1 */ \
    "bwd GEMM (128, 32, 32) calls: cost model 2, executor 8",     /* D1 */ \
    "bwd GEMM (128, 32, 64) calls: cost model 0, executor 4",     /* D1 */ \
    "bwd GEMM (128, 32, 96) calls: cost model 2, executor 0",     /* D1 */ \
    "bwd GEMM (128, 32, 128) calls: cost model 2, executor 0"     /* D1 */

TEST(drift_vision)
{
    static const char *const pinned[] = { VISION_FWD, VISION_BWD, NULL };
    drift_check(CASE(.name = "vision", .model = "tiny-vl", .vision = true), pinned);
}

TEST(drift_vision_selective_recompute)
{
    static const char *const pinned[] = { VISION_FWD, VISION_BWD, NULL };
    drift_check(CASE(.name = "vision selective", .model = "tiny-vl", .vision = true,
                     .recompute = PLAN_RECOMP_SELECTIVE), pinned);
}

TEST(drift_vision_full_recompute)
{
    static const char *const pinned[] = {
        VISION_FWD,
        "bwd GEMM calls: cost model 29, executor 47",                 /* D1 */
        "bwd GEMM (32, 32, 128) calls: cost model 2, executor 8",     /* D1 */
        "bwd GEMM (32, 64, 128) calls: cost model 0, executor 4",     /* D1 */
        "bwd GEMM (32, 96, 128) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (32, 128, 128) calls: cost model 3, executor 1",    /* D1 */
        "bwd GEMM (128, 32, 32) calls: cost model 4, executor 16",    /* D1 */
        "bwd GEMM (128, 32, 64) calls: cost model 2, executor 6",     /* D1 */
        "bwd GEMM (128, 32, 96) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (128, 32, 128) calls: cost model 2, executor 0",    /* D1 */
        "bwd GEMM (128, 64, 32) calls: cost model 3, executor 7",     /* D1 */
        "bwd GEMM (128, 96, 32) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (128, 128, 32) calls: cost model 3, executor 1",    /* D1 */
        NULL
    };
    drift_check(CASE(.name = "vision full", .model = "tiny-vl", .vision = true, .recompute = PLAN_RECOMP_FULL),
                pinned);
}

/* A frozen encoder runs no backward at all. */
TEST(drift_vision_frozen)
{
    static const char *const pinned[] = { VISION_FWD, NULL };
    drift_check(CASE(.name = "vision frozen", .model = "tiny-vl", .vision = true, .frozen = true), pinned);
}

/* 4 blocks, 2 of them window attention (16 patches) */
TEST(drift_vision_window_attention)
{
    static const char *const pinned[] = {
        "fwd GEMM calls: cost model 19, executor 31",                 /* D1 */
        "fwd GEMM (128, 32, 32) calls: cost model 4, executor 16",    /* D1 */
        "fwd GEMM (128, 64, 32) calls: cost model 0, executor 8",     /* D1 */
        "fwd GEMM (128, 96, 32) calls: cost model 4, executor 0",     /* D1 */
        "fwd GEMM (128, 128, 32) calls: cost model 4, executor 0",    /* D1 */
        "bwd GEMM calls: cost model 37, executor 61",                 /* D1 */
        "bwd GEMM (32, 32, 128) calls: cost model 4, executor 16",    /* D1 */
        "bwd GEMM (32, 64, 128) calls: cost model 0, executor 8",     /* D1 */
        "bwd GEMM (32, 96, 128) calls: cost model 4, executor 0",     /* D1 */
        "bwd GEMM (32, 128, 128) calls: cost model 5, executor 1",    /* D1 */
        "bwd GEMM (128, 32, 32) calls: cost model 4, executor 16",    /* D1 */
        "bwd GEMM (128, 32, 64) calls: cost model 0, executor 8",     /* D1 */
        "bwd GEMM (128, 32, 96) calls: cost model 4, executor 0",     /* D1 */
        "bwd GEMM (128, 32, 128) calls: cost model 4, executor 0",    /* D1 */
        NULL
    };
    drift_check(CASE(.name = "vision window", .model = "tiny-vl-window", .vision = true), pinned);
}

/* The LLM's blocks split over 2 ranks (q 32, k, v 16, SwiGLU 64 each), with
 * attention-output and MLP biases; the collectives agree. */
#define LLM_TP2_FWD_GEMMS                                               \
    "fwd GEMM calls: cost model 9, executor 15",                  /* D1 */ \
    "fwd GEMM (52, 32, 64) calls: cost model 0, executor 2",      /* D1 */ \
    "fwd GEMM (52, 64, 64) calls: cost model 4, executor 6",      /* D1 */ \
    "fwd GEMM (52, 128, 64) calls: cost model 2, executor 0",     /* D1 */ \
    "fwd GEMM (52, 16, 64) calls: cost model 0, executor 4"       /* D1 */
#define LLM_TP2_BWD_GEMMS                                               \
    "bwd GEMM calls: cost model 18, executor 30",                 /* D1 */ \
    "bwd GEMM (52, 64, 32) calls: cost model 0, executor 2",      /* D1 */ \
    "bwd GEMM (52, 64, 64) calls: cost model 4, executor 6",      /* D1 */ \
    "bwd GEMM (52, 64, 128) calls: cost model 2, executor 0",     /* D1 */ \
    "bwd GEMM (64, 64, 52) calls: cost model 4, executor 6",      /* D1 */ \
    "bwd GEMM (64, 128, 52) calls: cost model 2, executor 0",     /* D1 */ \
    "bwd GEMM (64, 32, 52) calls: cost model 0, executor 2",      /* D1 */ \
    "bwd GEMM (52, 64, 16) calls: cost model 0, executor 4",      /* D1 */ \
    "bwd GEMM (64, 16, 52) calls: cost model 0, executor 4"       /* D1 */

TEST(drift_llm_tp2)
{
    static const char *const pinned[] = {
        LLM_TP2_FWD_GEMMS,
        LLM_TP2_BWD_GEMMS,
        "fwd copy calls: cost model 3, executor 23",                  /* D2 */
        "bwd copy calls: cost model 1, executor 2",                   /* D2 */
        "bwd add calls: cost model 2, executor 20",                   /* D2 */
        NULL
    };
    drift_check(CASE(.name = "llm tp2", .model = "tiny-vl", .tp = 2, .biases = true), pinned);
}

TEST(drift_llm_tp2_sequence_parallel)
{
    static const char *const pinned[] = {
        LLM_TP2_FWD_GEMMS,
        LLM_TP2_BWD_GEMMS,
        "fwd copy calls: cost model 4, executor 24",                  /* D2 */
        "bwd copy calls: cost model 2, executor 3",                   /* D2 */
        "bwd add calls: cost model 6, executor 24",                   /* D2 */
        NULL
    };
    drift_check(CASE(.name = "llm tp2 seqpar", .model = "tiny-vl", .tp = 2, .seqpar = true, .biases = true), pinned);
}

TEST(drift_llm_tp2_sequence_parallel_full_recompute)
{
    static const char *const pinned[] = {
        LLM_TP2_FWD_GEMMS,
        "fwd copy calls: cost model 4, executor 24",                  /* D2 */
        "bwd copy calls: cost model 2, executor 3",                   /* D2 */
        "bwd add calls: cost model 10, executor 28",                  /* D2 */
        "bwd GEMM calls: cost model 26, executor 44",                 /* D1 */
        "bwd GEMM (52, 32, 64) calls: cost model 2, executor 4",      /* D1 */
        "bwd GEMM (52, 64, 32) calls: cost model 2, executor 4",      /* D1 */
        "bwd GEMM (52, 64, 64) calls: cost model 8, executor 12",     /* D1 */
        "bwd GEMM (52, 64, 128) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (52, 128, 64) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (64, 64, 52) calls: cost model 4, executor 6",      /* D1 */
        "bwd GEMM (64, 128, 52) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (52, 16, 64) calls: cost model 0, executor 4",      /* D1 */
        "bwd GEMM (64, 32, 52) calls: cost model 0, executor 2",      /* D1 */
        "bwd GEMM (52, 64, 16) calls: cost model 0, executor 4",      /* D1 */
        "bwd GEMM (64, 16, 52) calls: cost model 0, executor 4",      /* D1 */
        NULL
    };
    drift_check(CASE(.name = "llm tp2 seqpar full", .model = "tiny-vl", .tp = 2, .seqpar = true, .biases = true,
                     .recompute = PLAN_RECOMP_FULL), pinned);
}

/* Ulysses over 2 ranks: 64 patch rows each. */
#define ULYSSES_COPIES                                                  \
    "fwd copy calls: cost model 8, executor 0",                   /* D3 */ \
    "fwd copy elements: cost model 16384, executor 0",            /* D3 */ \
    "bwd copy calls: cost model 8, executor 0",                   /* D3 */ \
    "bwd copy elements: cost model 16384, executor 0"             /* D3 */

TEST(drift_vision_ulysses_sp2)
{
    static const char *const pinned[] = {
        ULYSSES_COPIES,
        "fwd GEMM calls: cost model 11, executor 17",                 /* D1 */
        "fwd GEMM (64, 32, 32) calls: cost model 2, executor 8",      /* D1 */
        "fwd GEMM (64, 64, 32) calls: cost model 0, executor 4",      /* D1 */
        "fwd GEMM (64, 96, 32) calls: cost model 2, executor 0",      /* D1 */
        "fwd GEMM (64, 128, 32) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM calls: cost model 21, executor 33",                 /* D1 */
        "bwd GEMM (32, 32, 64) calls: cost model 2, executor 8",      /* D1 */
        "bwd GEMM (32, 96, 64) calls: cost model 2, executor 0",      /* D1 */
        "bwd GEMM (32, 128, 64) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (64, 32, 32) calls: cost model 2, executor 8",      /* D1 */
        "bwd GEMM (64, 32, 64) calls: cost model 2, executor 6",      /* D1 */
        "bwd GEMM (64, 32, 96) calls: cost model 2, executor 0",      /* D1 */
        "bwd GEMM (64, 32, 128) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (32, 64, 64) calls: cost model 0, executor 4",      /* D1 */
        NULL
    };
    drift_check(CASE(.name = "vision sp2", .model = "tiny-vl", .vision = true, .sp = 2), pinned);
}

TEST(drift_vision_window_ulysses_sp2)
{
    static const char *const pinned[] = {
        ULYSSES_COPIES,
        "fwd all-to-all calls: cost model 8, executor 16",            /* D4 */
        "fwd all-to-all elements: cost model 16384, executor 32768",  /* D4 */
        "fwd blocking exchanges (syncs): cost model 8, executor 16",  /* D4 */
        "bwd all-to-all calls: cost model 8, executor 16",            /* D4 */
        "bwd all-to-all elements: cost model 16384, executor 32768",  /* D4 */
        "bwd blocking exchanges (syncs): cost model 8, executor 16",  /* D4 */
        "fwd GEMM calls: cost model 19, executor 31",                 /* D1 */
        "fwd GEMM (64, 32, 32) calls: cost model 4, executor 16",     /* D1 */
        "fwd GEMM (64, 64, 32) calls: cost model 0, executor 8",      /* D1 */
        "fwd GEMM (64, 96, 32) calls: cost model 4, executor 0",      /* D1 */
        "fwd GEMM (64, 128, 32) calls: cost model 4, executor 0",     /* D1 */
        "bwd GEMM calls: cost model 37, executor 61",                 /* D1 */
        "bwd GEMM (32, 32, 64) calls: cost model 4, executor 16",     /* D1 */
        "bwd GEMM (32, 96, 64) calls: cost model 4, executor 0",      /* D1 */
        "bwd GEMM (32, 128, 64) calls: cost model 4, executor 0",     /* D1 */
        "bwd GEMM (64, 32, 32) calls: cost model 4, executor 16",     /* D1 */
        "bwd GEMM (64, 32, 64) calls: cost model 4, executor 12",     /* D1 */
        "bwd GEMM (64, 32, 96) calls: cost model 4, executor 0",      /* D1 */
        "bwd GEMM (64, 32, 128) calls: cost model 4, executor 0",     /* D1 */
        "bwd GEMM (32, 64, 64) calls: cost model 0, executor 8",      /* D1 */
        NULL
    };
    drift_check(CASE(.name = "vision window sp2", .model = "tiny-vl-window", .vision = true, .sp = 2), pinned);
}

/* The encoder's blocks split over 2 ranks; its patch embedding and merger whole on each. */
TEST(drift_vision_tp2)
{
    static const char *const pinned[] = {
        "fwd bias elements: cost model 51200, executor 55296",        /* D5 */
        "fwd gelu elements: cost model 2048, executor 4096",          /* D5 */
        "bwd zero elements: cost model 69632, executor 73728",        /* D5 */
        "bwd bias_grad elements: cost model 51200, executor 55296",   /* D5 */
        "bwd gelu_bwd elements: cost model 2048, executor 4096",      /* D5 */
        "fwd GEMM calls: cost model 11, executor 17",                 /* D1 */
        "fwd GEMM sum of m*n*k: cost model 1802240, executor 2293760", /* D5 */
        "fwd GEMM (32, 64, 64) calls: cost model 1, executor 0",      /* D5 */
        "fwd GEMM (32, 128, 128) calls: cost model 0, executor 1",    /* D5 */
        "fwd GEMM (128, 16, 48) calls: cost model 1, executor 0",     /* D5 */
        "fwd GEMM (128, 32, 48) calls: cost model 0, executor 1",     /* D5 */
        "fwd GEMM (128, 16, 32) calls: cost model 0, executor 6",     /* D1 */
        "fwd GEMM (128, 32, 32) calls: cost model 2, executor 6",     /* D1 */
        "fwd GEMM (128, 48, 32) calls: cost model 2, executor 0",     /* D1 */
        "fwd GEMM (128, 64, 32) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM calls: cost model 21, executor 33",                 /* D1 */
        "bwd GEMM sum of m*n*k: cost model 3506176, executor 4390912", /* D5 */
        "bwd GEMM (32, 64, 64) calls: cost model 1, executor 0",      /* D5 */
        "bwd GEMM (64, 64, 32) calls: cost model 1, executor 0",      /* D5 */
        "bwd GEMM (48, 16, 128) calls: cost model 1, executor 0",     /* D5 */
        "bwd GEMM (32, 128, 128) calls: cost model 0, executor 1",    /* D5 */
        "bwd GEMM (128, 128, 32) calls: cost model 0, executor 1",    /* D5 */
        "bwd GEMM (48, 32, 128) calls: cost model 0, executor 1",     /* D5 */
        "bwd GEMM (32, 32, 128) calls: cost model 2, executor 6",     /* D1 */
        "bwd GEMM (32, 48, 128) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (32, 64, 128) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (128, 32, 16) calls: cost model 0, executor 6",     /* D1 */
        "bwd GEMM (128, 32, 32) calls: cost model 2, executor 6",     /* D1 */
        "bwd GEMM (128, 32, 48) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (128, 32, 64) calls: cost model 2, executor 0",     /* D1 */
        "bwd GEMM (32, 16, 128) calls: cost model 0, executor 6",     /* D1 */
        NULL
    };
    drift_check(CASE(.name = "vision tp2", .model = "tiny-vl", .vision = true, .tp = 2), pinned);
}
