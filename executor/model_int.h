/* executor-internal: the model's state, shared by the files of the training
 * algorithm (model.c layout and parameters, acts.c activations, block.c the
 * transformer block, vision.c and llm.c the modules, optimizer.c AdamW). */
#ifndef DHP_EXECUTOR_MODEL_INT_H
#define DHP_EXECUTOR_MODEL_INT_H

#include "executor/executor.h"
#include "executor/backend.h"

/* RoPE base: the vision rotary uses theta 10000 (VisionRotaryEmbedding in
 * modeling_qwen2_5_vl.py); models.h has no rope_theta field yet, so the LLM
 * uses 10000 too (the tiny zoo models' value). */
#define EX_ROPE_THETA 10000.0

/* A GELU MLP's fc1 and fc2 are the up (wu, bu) and down (wd, bd) views;
 * ln1b, ln2b are LayerNorm biases. */
typedef struct {
    float *ln1, *ln1b, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo;
    float *ln2, *ln2b, *wg, *bg, *wu, *bu, *wd, *bd;
} ex_block_w;

typedef struct {
    float *patch_w, *patch_b;                 /* vision */
    float *merge_ln, *m0w, *m0b, *m2w, *m2b;  /* vision merger */
    float *wte, *lnf, *head;                  /* llm; head == wte when tied */
    /* audio: conv stem, learned positions (NULL: sinusoids), final norm's bias, projector */
    float *conv1w, *conv1b, *conv2w, *conv2b, *pos, *lnf_b, *proj_w, *proj_b;
    float *cls, *pre_ln, *pre_ln_b;           /* CLIP tower (clip.c); its positions are pos */
    ex_block_w *blk;                          /* [layers] */
} ex_weights;

/* One parameter tensor: plan_module_tensors' description plus where it lives. */
typedef struct {
    plan_tensor d;
    char name[MODEL_NAME_LEN + 96]; /* "<module>.<d.name>" */
    size_t off, numel;         /* in the module's flat layout */
    float **pslot, **gslot;    /* the weight and gradient views to point */
} ex_tensor;

/* Saved activations of one block (see plan_module_acts for their shapes). */
typedef struct {
    float *x, *ln1, *rstd1, *q, *k, *v, *att, *lse, *xmid, *ln2, *rstd2, *g, *u, *h;
    float *mean1, *mean2;      /* LayerNorm */
    float *att_loc;            /* Ulysses layers: attention output in local-row layout (q..lse are all-rows, local-heads) */
    /* bf16 saved tensors (plan_act_saved_bf16): the layer's bf16 copy in the
     * slot and its elements, NULL where the tensor is fp32; the float views
     * above then point at the fp32 copy every block shares (ex_acts_pack) */
    uint16_t *bf[PLAN_NACT_BLOCK];
    size_t bf_n[PLAN_NACT_BLOCK];
} ex_block_acts;

typedef struct {
    ex_block_acts *blk;        /* [layers]; recomputed tensors point at one copy all blocks share */
    float *x_final;            /* last block's output (the norms' rows) */
    float *cos, *sin;          /* [N, hd/2] */
    float *rc_out;             /* full recomputation: the re-run block's output */
    /* vision merger */
    float *mln, *mrstd, *h1, *a1, *vout;
    /* llm head over the n_pred predicting rows: xg = their final hidden
     * states, gath = rmsnorm(xg), ce_mx / ce_st = cross-entropy row max and
     * [sum-exp, target logit]; emb: vocab-parallel embedding rows */
    float *xg, *rstdf, *gath, *logits, *dlogits, *ce_mx, *ce_st, *emb;
    /* backward scratch */
    float *dres, *dln, *dq, *dk, *dv, *datt, *dg, *du, *dh, *dgath, *dxg, *dh1, *da1, *dvis;
    float *sp_pack, *sp_dq, *sp_dk, *sp_dv, *sp_datt;   /* Ulysses */
    float *sp_recv;            /* the LLM's Ulysses: an all-to-all's rows before they are regrouped by sample */
    /* ring attention (ring.c): K/V blocks [2][k, v], their gradients
     * [2][dk, dv], a block's partial output and log-sum-exp */
    float *ring_kv, *ring_dkv, *ring_out, *ring_lse;
    /* Megatron sequence parallelism: all rows gathered, a row-parallel
     * output before its reduce-scatter, the gathered output gradient, and the
     * norms' partial weight gradients [2, d] */
    float *tp_full, *tp_part, *tp_dfull, *tp_grads;
    /* audio (plan_module_acts): the conv stem, pooling, final norm, projector */
    float *c1pre, *c1out, *c2pre, *col, *dcol, *dc1out, *dc1pre;
    float *pooled, *fln, *fmean, *frstd, *aout, *dpooled;
    float *clip_emb, *clip_mean, *clip_rstd;   /* CLIP stem (clip.c): embeddings before pre_layrnorm */
} ex_acts;

/* One forward's saved activations and geometry (a vision slot, or the LLM's only one). */
typedef struct {
    void *mem;                 /* the saved tensors, fp32 and bf16 (plan_module_acts) */
    size_t cap;                /* bytes */
    int *cu, *cu_win;          /* cu_seqlens: per sequence / per window (host, written by the module) */
    int *cu_dev, *cu_win_dev;  /* their backend copies, which the kernels read */
    int n_cu_cap;
    /* the batch's inputs this slot's passes read, copied to the backend
     * (tokens: int32; pixels or mel frames: float), and their capacities in bytes */
    void *in_dev, *tok_dev;
    size_t in_cap, tok_cap;
    int n_rows, m_rows, n_pred, emb_rows, n_seq, n_win;
    bool filled;               /* a forward ran in it */
} ex_slot;

typedef struct {
    const ex_backend *be;      /* the model's backend: every buffer below is its memory */
    bool on;                   /* instantiated on this rank */
    int index;                 /* in model_t.mod */
    model_module mm;
    int d, H, Hkv, hd, f;      /* local shard shapes */
    int vocab0, vocab_n;       /* llm: this rank's vocab rows [vocab0, vocab0 + vocab_n) */
    int tp, tp_rank;           /* tensor-parallel group size and rank (1, 0 = none) */
    int sp, sp_rank;           /* sequence-parallel group size and rank (1, 0 = none): Ulysses, or the LLM's ring (plan_cp_of) */
    bool seqpar;               /* Megatron sequence parallelism (tp > 1, LLM) */
    plan_recompute recompute;
    bool rope;                 /* rotary positions in attention (plan_module_rotary) */
    plan_module strat;         /* tp, sp, pp, stage_layers, seq_parallel, recompute as the planner describes them */
    int stage_index;           /* the virtual pipeline stage being run (plan_vstage_of; the stage when vp = 1) */
    plan_stage stage;          /* its blocks, and whether it holds the stem and the head */
    plan_stage held;           /* every block of the rank's stage (all its model chunks): the layout's */
    ex_parallel par;
    int comm_rc;               /* first failing collective's (or unit hook's) code, 0 if none */
    int n_tensors;
    ex_tensor *t;
    int n_units;
    size_t *unit_off;          /* [n_units + 1] flat offsets of the units */
    size_t n_params;           /* flat elements on this rank */
    float *params, *grads;     /* flat buffers; NULL once a ZeRO strategy shards them away */
    /* ZeRO: this rank's pieces of the units (shard; G = 1 without ZeRO) and
     * the state kept on them: AdamW moments, and where sharded the weights
     * (pshard) and the gradient accumulator (gshard) */
    ex_shard shard;
    float *m, *v, *pshard, *gshard;
    /* bf16 (executor/precision.c): the weights' bf16 copy (mixed: n_params,
     * params' layout) or autocast's weight cast (wcast_cap), and the
     * linears' staging: operand | gradient, stage_cap each */
    bool bf16;
    uint16_t *w16, *wcast16, *stage16;
    size_t wcast_cap, stage_cap;
    ex_weights w, g;
    ex_unit_hooks hooks;
    ex_acts a;                 /* views into slot[cur] and scratch */
    ex_slot slot[EX_MAX_SLOTS];
    int cur;                   /* bound slot */
    void *scratch;
    size_t scratch_cap;        /* bytes */
    float *host_rope;          /* host staging of the rotary tables: [cos | sin], host_rope_cap floats */
    size_t host_rope_cap;
    /* the bound slot's geometry (copies of its fields; cu, cu_win host, *_dev the backend's) */
    int *cu, *cu_win, *cu_dev, *cu_win_dev;
    int n_rows, n_seq, n_win;  /* n_rows: the block rows (all rows of the micro-batch on this rank) */
} ex_module;

struct ex_model {
    model_t m;
    const ex_backend *be;
    ex_module mod[MODEL_MAX_MODULES];
    int vis_index;             /* vision module in m, -1 if the model has none */
    int aud_index;             /* audio module in m, -1 if the model has none */
    int adam_t;
    /* last LLM forward's batch geometry */
    int n_pred;
    int32_t *targets;          /* host */
    int *pred_rows;
    int targets_cap;
    int32_t *targets_dev;      /* their backend copies */
    int *pred_rows_dev;
    float *host_ce;            /* host copies of the cross-entropy's row max and [sum-exp, target logit]: 3 targets_cap */
};

/* model.c */
ex_module *ex_module_at(ex_model *em, int module_index);
bool ex_module_trains(const ex_module *md);
/* Points every tensor view of KIND (EX_BUF_PARAMS / EX_BUF_GRADS) at the flat buffer (model.c). */
void ex_module_bind_all(ex_module *md, int kind);
/* Unit hooks around the use of unit u (no-ops without hooks); failures land in md->comm_rc. */
void ex_unit_begin(ex_module *md, int u, ex_unit_use use);
void ex_unit_end(ex_module *md, int u, ex_unit_use use, bool last);

/* acts.c */
int ex_acts_ensure(ex_module *md, int n, int m_rows, int n_pred, int reserve_pred, int emb_rows, int n_cu, char *err);
void ex_slot_bind(ex_module *md);
void ex_slot_filled(ex_module *md);
void ex_acts_free(ex_module *md);
/* bf16 saved activations (plan_act_saved_bf16): layer l's tensors rounded
 * from their fp32 copy into the slot after its forward, and widened back
 * into that copy before its backward (no-ops for fp32 tensors). */
void ex_acts_pack(ex_module *md, int l);
void ex_acts_unpack(ex_module *md, int l);
/* Copies the host cu_seqlens the module just wrote (n_seq + 1 and n_win + 1
 * entries of md->cu, md->cu_win; n_win < 0: no windows) to the bound slot's backend copies. */
void ex_cu_upload(ex_module *md, int n_seq, int n_win);
/* The bound slot's backend copy of a batch input: bytes from src (host),
 * into the slot's input buffer (pixels, mel) or token buffer (tok); NULL
 * when out of memory (err filled). */
void *ex_slot_input(ex_module *md, const void *src, size_t bytes, bool tok, char *err);
/* Host staging for the rotary tables of n rows of hd / 2 pairs: *cos, *sin;
 * ex_rope_upload copies them to md->a.cos / md->a.sin. */
int ex_rope_host(ex_module *md, size_t n, float **cos, float **sin, char *err);
void ex_rope_upload(ex_module *md, size_t n);
/* Grows a backend buffer of the model's backend to bytes (contents not kept). */
int ex_dev_reserve(const ex_backend *be, void **buf, size_t *cap, size_t bytes, util_mem_cat cat);

/* block.c: the rows the norms and the residual stream hold (N / tp under
 * sequence parallelism), and one transformer block forward / backward over
 * the stage's blocks. */
int ex_norm_rows(const ex_module *md);
/* Where the stage's (chunk's) input rows go: its first block's input, or,
 * on a chunk of no block (plan_module.split_ends: the embedding alone or
 * the head alone), x_final, the rows its head reads or it sends on. */
float *ex_stage_input(ex_module *md);
/* The module's block norm (RMSNorm, or LayerNorm with bias b and row means) over n rows. */
void ex_norm_forward(const ex_backend *be, const ex_module *md, float *out, float *mean, float *rstd, const float *x,
                     const float *w, const float *b, int n);
void ex_norm_backward(const ex_backend *be, const ex_module *md, float *dinp, float *dw, float *db, const float *dout,
                      const float *x, const float *w, const float *mean, const float *rstd, int n);
void ex_block_forward(const ex_backend *be, ex_module *md, int l, float *out, const int *cu, int nseq, bool causal);
void ex_block_backward(const ex_backend *be, ex_module *md, int l, float *dres, const int *cu, int nseq, bool causal);
/* The blocks of a module forward from md->a.blk[0].x, and backward from md->a.dres, each block inside its unit hooks. */
void ex_blocks_forward(const ex_backend *be, ex_module *md, const int *cu, const int *cu_win, bool causal);
void ex_blocks_backward(const ex_backend *be, ex_module *md, const int *cu, const int *cu_win, bool causal);
/* ring.c: ring attention of one block over the sp group (plan_cp_of is
 * PLAN_CP_RING): a's q, k, v of this rank's rows (nseq samples of equal
 * length, cu their local rows) to a->att and a->lse; backward from datt into
 * md->a.dq, dk, dv. */
void ex_ring_forward(const ex_backend *be, ex_module *md, ex_block_acts *a, const int *cu, int nseq);
void ex_ring_backward(const ex_backend *be, ex_module *md, const ex_block_acts *a, const float *datt, const int *cu,
                      int nseq);
/* vision.c: the batch's images checked against the model, merged rows per image. */
int ex_check_images(const ex_model *em, const ex_batch *b, char *err);
int ex_merged_per_image(const ex_model *em, const ex_batch *b);
/* ex_vision_* / ex_audio_*'s whole-encoder calls on module k (encoder.c);
 * call and kind name them in the error when this instance does not hold k. */
int ex_encoder_forward(ex_model *em, int k, const char *call, const char *kind, const ex_batch *b, const float **out,
                       int *rows, char *err);
int ex_encoder_backward(ex_model *em, int k, const char *call, const char *kind, const ex_batch *b, const float *dout,
                        char *err);
int ex_encoder_empty_pass(ex_model *em, int k, const char *call, const char *kind, ex_unit_use use, char *err);
/* encoder.c: a vision head's two-linear GELU projector over M rows (into a->vout; backward: din = dL/d(in)),
 * and an encoder stage pass's end (a forward's slot filled; a failed collective or hook as the error). */
void ex_projector_forward(const ex_backend *be, ex_module *md, const float *in, int M);
void ex_projector_backward(const ex_backend *be, ex_module *md, const float *in, const float *dout, float *din, int M);
int ex_encoder_pass_end(ex_module *md, bool forward, char *err);
/* encoder.c: a stage backward's start (the slot holds a forward of `rows` rows, bound; an output gradient in). */
int ex_encoder_backward_begin(ex_module *md, int rows, ex_stage_io *io, char *err);
int ex_vision_stage_forward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err);
int ex_vision_stage_backward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err);
int ex_vision_rows(const ex_module *md, const ex_batch *b);
/* clip.c: LLaVA's CLIP tower (plan_module_clip), the same calls as vision.c's. */
int ex_check_clip_module(const model_module *mm, const model_module *llm, char *err);
int ex_clip_stage_forward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err);
int ex_clip_stage_backward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err);
int ex_clip_rows(const ex_module *md, const ex_batch *b);
/* audio.c: what the executor supports of an audio module; a stage's passes
 * and its rows at the stage boundary (as vision.c's). */
int ex_check_audio_module(const model_module *mm, const model_module *llm, char *err);
int ex_audio_stage_forward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err);
int ex_audio_stage_backward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err);
int ex_audio_rows(const ex_module *md, const ex_batch *b);
/* llm.c */
int ex_llm_stage_forward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err);
int ex_llm_stage_backward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err);
int ex_llm_rows(const ex_model *em, const ex_module *md, const ex_batch *b);

/* tp_wire.c: collectives of the tensor-parallel group (the sums no-ops at
 * tp = 1), Ulysses' all-to-all of the sp group, ring attention's messages; failures land in
 * md->comm_rc. The activation collectives move bf16 under par.wire_bf16:
 * ex_tp_allreduce, ex_tp_allgather, ex_tp_reduce_scatter, ex_sp_alltoall
 * (their results are then bf16 values widened); ex_tp_allreduce_f32 (the
 * cross-entropy's statistics, weight gradients) and _max stay fp32. */
void ex_tp_allreduce(ex_module *md, float *x, size_t n);
void ex_tp_allreduce_f32(ex_module *md, float *x, size_t n);
void ex_tp_allreduce_max(ex_module *md, float *x, size_t n);
void ex_tp_allgather(ex_module *md, const float *x, float *all, size_t n);
void ex_tp_reduce_scatter(ex_module *md, const float *x, float *mine, size_t n);
void ex_sp_alltoall(ex_module *md, const float *send, float *recv, size_t chunk);
/* Ring attention's messages (executor/ring.c): ex_wire_p2p posts m into
 * *req (p2p_start), on the bf16 wire packed into the staging's slot `slot`
 * (two slots: a K/V pass and a gradient pass may be in flight together),
 * its receives noted in u; once req is waited for, ex_wire_p2p_unpack
 * widens them into m's receive buffers (a no-op off the wire). */
typedef struct {
    int n;
    float *dst[4];
    const uint16_t *src[4];
    size_t len[4];
} ex_wire_recv;
void ex_wire_p2p(ex_module *md, const ex_p2p *m, int slot, ex_wire_recv *u, void **req);
void ex_wire_p2p_unpack(ex_module *md, ex_wire_recv *u);
/* The hooks a bf16 wire needs (model.c's layout check). */
int ex_wire_check(const ex_module *md, const ex_parallel *par, char *err);
const char *ex_comm_what(const ex_module *md);

#endif
