/* The executor's layouts, which the memory and cost models read too: the
 * parameter tensors and units of a module, the data-parallel buffers, the
 * activation lists, the audio stem's segments (planner/layout.c, audio.c,
 * precision.c). dhp run's model (executor/model*.c) lays out its parameters
 * and carves its activations from these lists, so the dhp target's memory
 * model describes exactly what it allocates. planner.h includes this at its
 * place, after the plan and option types it uses; not included alone. */
#ifndef DHP_PLANNER_LAYOUT_H
#define DHP_PLANNER_LAYOUT_H

/* Parameter tensors of one module on one tensor-parallel rank, in the order
 * of the module's flat buffer. Units are contiguous runs of tensors that are
 * used (and, under ZeRO-3, gathered) together: 0 the stem (patch embedding,
 * the audio conv stem and positions, or the token embedding), 1..layers the
 * blocks, layers + 1 the head (the merger, the audio final norm and
 * projector, or the final norm and LM head). Blocks hold norm weights (and
 * biases for LayerNorm), attention, and a SwiGLU MLP (gate, up, down) or a
 * GELU MLP (fc1, fc2: the up and down roles; tensor parallel as Megatron's
 * ParallelMLP, fc1 split by rows, fc2 by columns). */
typedef enum {
    PLAN_TW_PATCH_W = 0, PLAN_TW_PATCH_B, PLAN_TW_WTE,
    PLAN_TW_LN1, PLAN_TW_WQ, PLAN_TW_BQ, PLAN_TW_WK, PLAN_TW_BK, PLAN_TW_WV, PLAN_TW_BV, PLAN_TW_WO, PLAN_TW_BO,
    PLAN_TW_LN2, PLAN_TW_WG, PLAN_TW_BG, PLAN_TW_WU, PLAN_TW_BU, PLAN_TW_WD, PLAN_TW_BD,
    PLAN_TW_MERGE_LN, PLAN_TW_M0W, PLAN_TW_M0B, PLAN_TW_M2W, PLAN_TW_M2B, PLAN_TW_LNF, PLAN_TW_HEAD,
    /* LayerNorm biases (blocks, final norm); the audio stem (two convolutions, positions) and projector */
    PLAN_TW_LN1_B, PLAN_TW_LN2_B, PLAN_TW_LNF_B,
    PLAN_TW_CONV1_W, PLAN_TW_CONV1_B, PLAN_TW_CONV2_W, PLAN_TW_CONV2_B, PLAN_TW_POS, PLAN_TW_PROJ_W, PLAN_TW_PROJ_B,
    /* the CLIP tower's class embedding and pre-LayerNorm (its positions are PLAN_TW_POS) */
    PLAN_TW_CLS, PLAN_TW_PRE_LN, PLAN_TW_PRE_LN_B,
    PLAN_NTW
} plan_tensor_role;
typedef struct {
    char name[80];            /* "blocks.3.attn.q.weight" (the module name is prepended by the executor) */
    plan_tensor_role role;
    int layer;                /* block index, -1 outside the blocks */
    int unit;
    int ndim;
    int64_t shape[2];         /* this rank's shape */
    int64_t full[2], start[2];/* the whole tensor's shape and this shard's first row / column */
    int split_axis;           /* axis split over the tp group (0 rows, 1 columns), -1 replicated */
    bool seq_partial;         /* replicated, but its gradient is a partial sum over the tp group under
                                 Megatron sequence parallelism (norms and row-parallel biases, whose
                                 rows each tp rank holds a slice of) */
    bool decay;               /* AdamW weight decay applies (matrices) */
    bool tied_copy;           /* the last pipeline stage's copy of a tied embedding (named as the embedding) */
    bool unused;              /* held and checkpointed, never read (a CLIP tower's blocks after LLaVA's feature
                                 layer and its post_layernorm): no gradient, no weight decay, so never changed */
    float init_std, init_const;  /* N(0, std) when std > 0, else the constant */
} plan_tensor;
/* The tensors of pipeline stage st (NULL: the whole module) on one tp rank;
 * fills out[0 .. min(n, cap)) and returns n. The last stage of a pipelined
 * LLM whose head is tied to its embedding holds a copy of the embedding
 * (tied_copy), whose gradient is summed with the first stage's (Megatron's
 * embedding group). */
/* What Megatron sequence parallelism divides the module's hidden-state rows
 * by: its blocks' norm and residual inputs and dropout masks, the final
 * norm's and output layer's inputs, the embedding's dropout mask, the rows
 * handed between pipeline stages (Korthikanti et al., arXiv 2205.05198,
 * sec. 4.2.2 and 4.3). tp for the LLM under seq_parallel with tp > 1, else 1.
 * Encoders run without it, as Megatron-LM runs its vision encoder and
 * projection (examples/multimodal/model.py: vision_config.sequence_parallel
 * = False, "Vision model and projection do not use SP/CP yet");
 * plan_strategy_check refuses seqpar for them. */
double plan_seqpar_split(const model_module *mm, const plan_module *s);
int plan_module_tensors(const model_module *mm, int tp, int tp_rank, bool seq_parallel, const plan_stage *st,
                        plan_tensor *out, int cap);
/* The same without names (each name empty): what sizing and sharding read, at a fraction of the cost. */
int plan_module_tensor_shapes(const model_module *mm, int tp, int tp_rank, bool seq_parallel, const plan_stage *st,
                              plan_tensor *out, int cap);
static inline int plan_module_units(const model_module *mm) { return mm->layers + 2; }
/* Whether the module's attention uses rotary positions (vision 2-D, LLM 1-D);
 * the audio encoder and a vision tower with learned positions (CLIP) add
 * absolute positions to their input instead. */
/* A CLIP-style vision tower (LLaVA's, executor/clip.c): a class row per
 * image, learned positions, pre-LayerNorm, the class row dropped before the
 * projector. */
static inline bool plan_module_clip(const model_module *mm) { return mm->kind == MODEL_VISION && mm->cls_token; }
static inline bool plan_module_rotary(const model_module *mm)
{
    return mm->kind == MODEL_LLM || (mm->kind == MODEL_VISION && mm->max_positions == 0);
}
/* Elements of each unit of stage st (NULL: all) on one tp rank (units[plan_module_units], 0 for the
 * units another stage holds); returns the stage's total. */
int64_t plan_unit_sizes(const model_module *mm, int tp, const plan_stage *st, int64_t *units);
/* The largest tensor of stage st on one tp rank, elements. */
int64_t plan_largest_tensor(const model_module *mm, int tp, bool seq_parallel, const plan_stage *st);

/* The ZeRO buffers of one module under the executor's strategies
 * (executor/dp_*.c), in elements: units of n_u elements are split in `shard`
 * pieces of ceil(n_u / shard), padded; the largest piece sets the buffers. */
typedef struct {
    int64_t local;            /* elements of the module on this tp rank (all units) */
    int64_t block_local;      /* of them, the blocks' units' (the stem and head apart) */
    int64_t shard_elems;      /* this rank's pieces of every unit, padded: sum ceil(n_u / shard) */
    int64_t max_piece;        /* the largest unit's piece */
    int gather_slots;         /* ZeRO-3: gathered units live at once (in use + prefetched) */
    int bucket_slots;         /* ZeRO-2/3: units' gradient buckets live at once */
    int64_t staging;          /* ZeRO-1/2: a unit's padded gradient (reduce-scatter) or weights (all-gather) */
    int64_t pieces;           /* reduce-scatter results and gather sends */
} plan_dp_buffers;
plan_dp_buffers plan_dp_buffers_of(const model_module *mm, const plan_module *s, int stage);

/* Activations of one forward of a module on `rows` rows (a micro-batch's
 * tokens on this rank, after the Ulysses split): what the forward saves for
 * its backward (one copy per activation slot) and the scratch every slot
 * shares, tensor by tensor in the executor's carving order, each padded to
 * 16 elements. Block tensors belong to one layer, or (layer -1) are one copy
 * every block shares: the recomputed ones. Under bf16 (plan_act_rows.bf16)
 * a block tensor kept per layer that plan_act_saved_bf16 names is saved in
 * bf16, and one fp32 copy every block shares (layer -1, scratch) holds it
 * while its layer runs: the forward computes into it and packs it into the
 * slot, the backward unpacks it first (executor/acts.c); odd layers' input
 * has a copy of its own (X_ODD), as a layer's output is the next layer's
 * input. */
typedef enum {
    PLAN_ACT_X = 0, PLAN_ACT_LN1, PLAN_ACT_RSTD1, PLAN_ACT_Q, PLAN_ACT_K, PLAN_ACT_V, PLAN_ACT_ATT, PLAN_ACT_LSE,
    PLAN_ACT_XMID, PLAN_ACT_LN2, PLAN_ACT_RSTD2, PLAN_ACT_G, PLAN_ACT_U, PLAN_ACT_H, PLAN_ACT_ATT_LOC,
    PLAN_ACT_MEAN1, PLAN_ACT_MEAN2,   /* LayerNorm's row means */
    PLAN_NACT_BLOCK,
    PLAN_ACT_X_FINAL = PLAN_NACT_BLOCK, PLAN_ACT_COS, PLAN_ACT_SIN, PLAN_ACT_RC_OUT,
    PLAN_ACT_SP_PACK, PLAN_ACT_SP_DQ, PLAN_ACT_SP_DK, PLAN_ACT_SP_DV, PLAN_ACT_SP_DATT, PLAN_ACT_SP_RECV,
    PLAN_ACT_RING_KV, PLAN_ACT_RING_DKV, PLAN_ACT_RING_OUT, PLAN_ACT_RING_LSE,
    PLAN_ACT_TP_FULL, PLAN_ACT_TP_PART, PLAN_ACT_TP_DFULL, PLAN_ACT_TP_GRADS,
    PLAN_ACT_DRES, PLAN_ACT_DLN, PLAN_ACT_DQ, PLAN_ACT_DK, PLAN_ACT_DV, PLAN_ACT_DATT, PLAN_ACT_DG, PLAN_ACT_DU,
    PLAN_ACT_DH,
    PLAN_ACT_MLN, PLAN_ACT_MRSTD, PLAN_ACT_H1, PLAN_ACT_A1, PLAN_ACT_VOUT, PLAN_ACT_DH1, PLAN_ACT_DA1,
    PLAN_ACT_XG, PLAN_ACT_RSTDF, PLAN_ACT_GATH, PLAN_ACT_LOGITS, PLAN_ACT_DLOGITS, PLAN_ACT_CE_MX, PLAN_ACT_CE_ST,
    PLAN_ACT_EMB, PLAN_ACT_DGATH, PLAN_ACT_DXG, PLAN_ACT_DVIS,
    /* audio: conv1 and conv2 outputs before GELU and conv1's after it (saved),
     * the im2col rows and the stem's gradients (scratch); the pooled rows,
     * the final LayerNorm's output and statistics, the projector's output
     * (saved) and the pooled rows' gradient (scratch) */
    PLAN_ACT_C1PRE, PLAN_ACT_C1OUT, PLAN_ACT_C2PRE, PLAN_ACT_COL, PLAN_ACT_DCOL, PLAN_ACT_DC1OUT, PLAN_ACT_DC1PRE,
    PLAN_ACT_POOLED, PLAN_ACT_FLN, PLAN_ACT_FMEAN, PLAN_ACT_FRSTD, PLAN_ACT_AOUT, PLAN_ACT_DPOOLED,
    /* CLIP stem (saved): the embeddings before pre_layrnorm, its row means and 1/std */
    PLAN_ACT_CLIP_EMB, PLAN_ACT_CLIP_MEAN, PLAN_ACT_CLIP_RSTD,
    PLAN_ACT_X_ODD,   /* bf16: the fp32 input of the odd layers (even ones use X's shared copy) */
    PLAN_NACT
} plan_act_id;
typedef struct {
    plan_act_id id;
    int layer;                /* block tensors: the layer, or -1 for the copy all blocks share */
    bool saved;               /* kept per activation slot (else scratch) */
    bool bf16;                /* 2-byte elements (plan_act_saved_bf16), else fp32 */
    size_t elems;             /* padded to 16 */
} plan_act;
typedef struct {
    int rows;                 /* token rows of the micro-batch on this rank (after the Ulysses split) */
    int merged_rows;          /* vision: merged rows out of the merger; LLM: encoder-token rows in
                                 (audio: the rows / pool pooled rows, whatever this says) */
    int pred_rows;            /* LLM: rows the head is sized for (every text position's prediction) */
    int emb_rows;             /* LLM with tp > 1: text rows of the vocab-parallel embedding */
    bool bf16;                /* the run saves its block tensors in bf16 (plan_saves_bf16) */
} plan_act_rows;
/* The executor saves its block activations in bf16 under these options
 * (target dhp, bf16-mixed or -autocast: planner/precision.c). */
bool plan_saves_bf16(const plan_options *o);
/* Whether block tensor id, kept per layer, is saved in bf16 where the run
 * saves bf16: all but the fp32 statistics (the norms' 1/rms and means, the
 * attention's log-sum-exp). */
bool plan_act_saved_bf16(plan_act_id id);
/* bf16 elements of each of the executor's two GEMM staging buffers under
 * bf16-mixed (a linear's activation operand and its incoming gradient,
 * rounded to bf16; planner/precision.c): the module's largest activation
 * tensor of plan_module_acts, or a vision stem's pixels if larger. */
double plan_gemm_staging_elems(const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows);
/* The audio encoder's conv stem geometry (planner/audio.c): a rank holds
 * rows [lo, lo + rows) of the batch's clips of F rows each (2F mel frames);
 * its segment of clip c is the clip's rows [t0, t0 + n) at the rank's row
 * `row`, whose conv2 reads the clip's conv1 frames [s0, s0 + ns) (clipped to
 * the clip: the rest is padding). plan_audio_segment is false where the
 * rank holds none of clip c; plan_audio_clips gives the clips [c0, c1) its
 * rows touch. */
typedef struct { int t0, n, row, s0, ns; } plan_audio_seg;
bool plan_audio_segment(const model_module *mm, int F, int lo, int rows, int clip, plan_audio_seg *s);
void plan_audio_clips(int F, int lo, int rows, int *c0, int *c1);
/* The conv1 rows and segments of the rank of `sp` computing the most conv1
 * rows, for `samples` clips of F rows (the cost model's). */
void plan_audio_stem_work(const model_module *mm, int samples, int F, int sp, double *conv1_rows, double *segments);
/* The conv1 rows a slot holds for N rows after the stem: at least every
 * rank's (the layout's). */
double plan_audio_conv1_rows(const model_module *mm, const plan_module *s, double N);
/* A clip's F frames after the conv stem fit the encoder: whole pool groups
 * (AvgPool1d(pool, pool) would drop a remainder), at most its learned
 * positions' rows. `what` names the caller's field in the error. */
int plan_audio_frames_check(const model_module *mm, int F, const char *what, char *err);
/* The frames after the stem a workload defaults to: the learned positions'
 * rows, else Whisper's 30 s window (3000 mel frames at 10 ms, halved by the
 * stem: openai/whisper audio.py N_FRAMES, model.py AudioEncoder). */
int plan_audio_default_frames(const model_module *mm);
/* Of virtual pipeline stage `stage` (plan_vstage_of: its blocks, the stem's
 * and the head's tensors where it holds them; with vp = 1 the rank stage);
 * fills out[0 .. min(n, cap)) and returns n. */
int plan_module_acts(const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows, plan_act *out,
                     int cap);
/* The elements of each tensor layer `layer` of stage st saves in bf16 where
 * the run saves bf16 (the list's), into elems[0 .. n) (n <= PLAN_NACT_BLOCK). */
int plan_block_bf16_elems(const model_module *mm, const plan_module *s, const plan_stage *st, int layer, double N,
                          double *elems);
/* A block's activations depend on its layer only through whether it runs
 * Ulysses (plan_cp_layer) and what it recomputes (plan_block_recompute):
 * kind u + 2 r with u = 1 where it runs Ulysses and r = 1 where it keeps
 * everything under partial full recomputation (s->recompute_layers). Of
 * stage st's blocks on N rows, count[k] are of kind k, first[k] the first
 * (-1: none). */
#define PLAN_BLOCK_KINDS 4
void plan_stage_block_kinds(const model_module *mm, const plan_module *s, const plan_stage *st, double N,
                            int first[PLAN_BLOCK_KINDS], int count[PLAN_BLOCK_KINDS]);
/* The same summed in bytes, fp32 elements at fp32_bytes each and bf16 ones
 * at 2: saved and scratch, and the LM head's logits part of the saved ones;
 * block_saved: of the saved ones, the blocks' own (one layer's each). */
void plan_module_act_bytes(const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows,
                           double fp32_bytes, double *saved, double *block_saved, double *scratch, double *logits);
/* The largest activation of the list (plan_module_acts), elements. */
double plan_largest_act(const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows);

#endif
