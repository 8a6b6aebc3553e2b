/* The drift guard's parts (tests/test_drift.c): what one micro-batch of a
 * module does, counted by the executor's own calls (tests/drift_count.c) or
 * read off the cost model's prices (tests/drift_price.c), in one shape. */
#ifndef DHP_TESTS_DRIFT_H
#define DHP_TESTS_DRIFT_H

#include "executor/executor.h"

/* The two passes of a micro-batch; recomputation belongs to the backward. */
enum { DRIFT_FWD = 0, DRIFT_BWD, DRIFT_NPH };
/* The collectives as the cost model names them (allreduce_max is an all-reduce),
 * and ring attention's point-to-point messages (DRIFT_P2P: calls are messages). */
enum { DRIFT_AR = 0, DRIFT_AG, DRIFT_RS, DRIFT_A2A, DRIFT_P2P, DRIFT_NCOLL };

/* The micro-batch: 2 samples of 1 image of 8 x 8 patches (or one audio clip
 * of 16 mel frames) and 10 text tokens each (a case's text overrides; at
 * most DRIFT_MAX_TEXT). */
enum { DRIFT_SAMPLES = 2, DRIFT_IMAGES = 2, DRIFT_GRID = 8, DRIFT_PATCHES = 64, DRIFT_TEXT = 10, DRIFT_MAX_TEXT = 32,
       DRIFT_MAX_RANKS = 2, DRIFT_MEL_FRAMES = 16 };

#define DRIFT_MAX_SHAPES 64

/* GEMMs of one (m, n, k): C[m, n] = A[m, k] B[k, n], as planner/cost.c names them. */
typedef struct { double m, n, k, count[DRIFT_NPH]; } drift_shape;

typedef struct {
    double ew_calls[DRIFT_NPH][COST_N_EW], ew_elems[DRIFT_NPH][COST_N_EW];
    double gemm_calls[DRIFT_NPH], gemm_mnk[DRIFT_NPH];   /* mnk: the sum of m n k */
    int n_shapes;
    drift_shape shape[DRIFT_MAX_SHAPES];
    bool overflow;             /* more shapes (or values on an axis) than the arrays hold */
    /* attention: [0] forward kernel, [1] backward kernel; rows = queries x
     * heads, scores = the keys each query sees x heads */
    double att_calls[DRIFT_NPH], att_rows[DRIFT_NPH][2], att_scores[DRIFT_NPH][2];
    /* collectives: elements of the full buffer (cost_collective_time's bytes / 4) */
    double coll_calls[DRIFT_NPH][DRIFT_NCOLL], coll_elems[DRIFT_NPH][DRIFT_NCOLL];
    double syncs[DRIFT_NPH];   /* blocking exchanges (plan_time.fwd_syncs, bwd_syncs) */
    /* executor only: the logits of the cross-entropy's exp-sum and gradient
     * passes (2 x the CE elements when they go with its row-max pass), and
     * calls of kernels no micro-batch price covers (scale, AdamW) */
    double ce_passes[DRIFT_NPH];
    double unpriced;
} drift_tally;

typedef struct {
    const char *name;
    const char *model;         /* zoo name */
    bool vision;               /* the vision encoder, else the LLM */
    bool audio;                /* the audio encoder */
    int tp, sp;                /* >= 1 */
    bool seqpar, frozen;
    bool biases;               /* attention-output and MLP biases on (the zoo's tiny-vl LLM has none) */
    plan_recompute recompute;
    int recompute_layers;     /* plan_module.recompute_layers */
    int heads, kv_heads;       /* > 0: the module's head counts instead of the zoo's */
    int text;                  /* > 0: text tokens per sample instead of DRIFT_TEXT */
    int layers;                /* > 0: the module's blocks instead of the zoo's */
    int pp, stage;             /* pp > 1: stage `stage` of a pipeline of pp (plan_stage_of) */
    int vp;                    /* > 1: interleaved, `stage` the virtual stage (plan_vstage_of) */
    bool split_ends;           /* the embedding and the head a block each in the split (plan_module.split_ends) */
} drift_case;

/* Runs one micro-batch (forward and backward) of module `module` of m (of
 * its stage dc->stage when dc->pp > 1) on dc->tp x dc->sp ranks (threads,
 * rank r = sp_rank * tp + tp_rank) with the counting backend and
 * communicator; t[r] gets rank r's counts. UTIL_OK, or a rank's failure
 * with err naming it. The LLM's sp ranks take the encoder rows of the
 * positions they hold (plan_cp_span_of). */
int drift_count(const drift_case *dc, const model_t *m, int module, drift_tally *t, char *err);

/* What the cost model (target dhp, fp32) prices for the same micro-batch
 * (of its stage when dc->pp > 1) on sp rank sp_rank (plan_cp_micro_time),
 * read off its prices on made-up devices (see drift_price.c); UTIL_OK or
 * UTIL_ENOMEM. */
int drift_price(const drift_case *dc, const model_t *m, int module, int sp_rank, drift_tally *t);
/* Text tokens per sample of the case. */
static inline int drift_text(const drift_case *dc) { return dc->text > 0 ? dc->text : DRIFT_TEXT; }

#endif
