/* executor: runs a plan for real. One algorithm, two backends (CPU: BLAS +
 * MPI; CUDA: cuBLAS + NCCL + own kernels) behind small kernel and
 * communicator interfaces. Public names are prefixed ex_. */
#ifndef DHP_EXECUTOR_H
#define DHP_EXECUTOR_H

#include "util/util.h"
#include "models/models.h"
#include "planner/planner.h"

/* ---- model, kernels, training step ---- */

/* A trainable instance of a model_t: parameters, gradients, AdamW state and
 * activations of each module, each in one allocation of its util_mem_cat
 * (PARAMS, GRADS, OPTIM, ACTIV) so per-category memory can be reported.
 * Supported: a Qwen2.5-VL style vision encoder (RMSNorm, SwiGLU, 2-D RoPE,
 * optional window attention, merger) and / or a Whisper-style audio encoder
 * (conv stem, absolute positions, LayerNorm, GELU MLP, pooling, projector:
 * Qwen2-Audio, Qwen2.5-Omni) feeding a decoder LLM (RMSNorm, GQA, 1-D RoPE,
 * SwiGLU or GELU MLP, tied or untied LM head). All fp32.
 *
 * Init (deterministic from seed): element j (row-major index in the whole
 * tensor) of tensor NAME is Box-Muller over splitmix64 outputs 2j and 2j+1
 * of the stream seeded seed ^ fnv1a64(NAME): stateless, so every shard draws
 * exactly its slice of the whole tensor. Linear and embedding weights
 * ~ N(0, 0.02); the residual-output linears (attn.o, mlp.down) ~ N(0,
 * 0.02 / sqrt(2 * layers)) (GPT-2, Radford et al. 2019); norm weights 1;
 * biases 0. */
typedef struct ex_model ex_model;

int ex_model_create(const model_t *m, uint64_t seed, ex_model **out, char *err);
/* Only the modules whose bit (1u << index in m->mod) is set, e.g. the vision
 * encoder on its own rank group; init is identical to the full model's. */
int ex_model_create_modules(const model_t *m, uint64_t seed, unsigned modules, ex_model **out,
                            char *err);

/* Parallel layouts inside one instance's modules (data parallelism around
 * them is the caller's gradient all-reduce, see ex_module_buffer).
 * LLM, Megatron tensor parallel: rank tp_rank of tp_size holds heads / tp,
 * kv_heads / tp query / kv heads and ffn / tp MLP columns (q, k, v, gate, up
 * split by rows; o, down by columns; norms and o / down biases replicated;
 * embeddings and LM head vocab-parallel, see ex_model_create_per_module).
 * allreduce_sum sums a buffer in place over the tp group; tp > 1 on the LLM
 * also needs allreduce_max.
 * Vision encoder, Ulysses sequence parallel: rank sp_rank of sp_size holds
 * rows [sp_rank * N / sp, (sp_rank + 1) * N / sp) of the batch's N patches
 * (ex_batch.pixels then points at those rows only; N / sp must be whole merge
 * groups); attention runs on all rows x heads / sp after alltoall, which sends
 * chunk r (`chunk` floats) of send to rank r and receives rank r's into chunk
 * r of recv. vis_out / dvis are then the local merged rows, and the vision
 * weight gradients are partial sums to be all-reduced over the sp group.
 * Every rank of a group calls each step function together. Shards are
 * initialised as slices of the full tensors (same seed). */
/* Point-to-point messages of ring attention between the ranks of the sp
 * group: send[i] (send_n[i] floats) to sp rank `to`, recv[i] (recv_n[i]) from
 * sp rank `from`, with tags tag + i; messages of one tag between two ranks
 * arrive in the order they were posted. */
typedef struct {
    const float *send[4];
    float *recv[4];
    size_t send_n[4], recv_n[4];
    int n_send, n_recv, to, from, tag;
} ex_p2p;

typedef struct {
    int tp_size, tp_rank;
    int sp_size, sp_rank;
    void *ctx;
    int (*allreduce_sum)(void *ctx, float *buf, size_t n);
    int (*alltoall)(void *ctx, const float *send, float *recv, size_t chunk);
    /* element-wise max over the tp group, in place (vocab-parallel cross-entropy) */
    int (*allreduce_max)(void *ctx, float *buf, size_t n);
    /* Megatron sequence parallelism of the LLM's tp group (seq_parallel): the
     * norms and the residual stream hold rows [tp_rank * N / tp, ...) of the
     * N rows; all = [tp][n] from every rank's n, and recv[n] = the sum of
     * every rank's send[tp_rank * n ..) */
    bool seq_parallel;
    int (*allgather)(void *ctx, const float *send, float *all, size_t n);
    int (*reduce_scatter)(void *ctx, const float *send, float *recv, size_t n);
    /* The activation collectives on a bf16 wire (planner/precision.c
     * plan_act_wire_bf16; executor/tp_wire.c): the tp regions' all-reduces,
     * all-gathers and reduce-scatters and Ulysses' all-to-alls move bf16
     * (the gathers and all-to-alls two elements a float word through
     * allgather and alltoall; the sums through these, each partial sum
     * rounded to bf16). Needs allreduce_sum_bf16 where tp > 1 and
     * reduce_scatter_bf16 under seq_parallel; false: everything fp32. */
    bool wire_bf16;
    int (*allreduce_sum_bf16)(void *ctx, uint16_t *buf, size_t n);
    int (*reduce_scatter_bf16)(void *ctx, const uint16_t *send, uint16_t *recv, size_t n);
    /* Activation recomputation (plan_recompute): none keeps every block
     * activation for backward; selective re-runs the attention core and the
     * MLP activation in backward; full keeps each block's input only and
     * re-runs the block's forward inside its backward (plan_module_acts);
     * under full, recompute_layers > 0 recomputes only the first that many
     * blocks of each model chunk (plan_block_recompute). */
    plan_recompute recompute;
    int recompute_layers;
    /* Pipeline parallelism: this instance holds stage pp_rank of pp_size
     * (plan_stage_of over stage_layers): its blocks, the stem on the first
     * stage, the head on the last. pp_size 0 or 1: the whole module. */
    int pp_size, pp_rank;
    int stage_layers[PLAN_MAX_PP];
    bool split_ends;   /* plan_module.split_ends */
    /* Interleaved: vp model chunks (plan_stage_of's), one run at a time
     * (ex_module_set_chunk); 0 or 1: none. */
    int vp;
    /* The LLM's context parallelism (plan_cp_of over plan_module.cp, the
     * variant the plan asked for): Ulysses uses alltoall,
     * ring attention these. p2p_start posts m's messages without waiting,
     * adding them to *req (a new request when *req is NULL); p2p_wait
     * completes every message of a request and frees it. */
    int (*p2p_start)(void *ctx, const ex_p2p *m, void **req);
    int (*p2p_wait)(void *ctx, void *req);
    plan_cp cp;
} ex_parallel;
int ex_model_create_parallel(const model_t *m, uint64_t seed, unsigned modules,
                             const ex_parallel *par, ex_model **out, char *err);
/* The same with one layout per module: par[k] for module k of m (NULL = no
 * parallelism anywhere), so a vision encoder can be sp- and/or tp-parallel
 * on its own communicators while the LLM is tp-parallel on others.
 * LLM tensor parallel is Megatron's with a vocab-parallel embedding, LM head
 * and cross-entropy: rank t holds vocab rows [t*V/tp, (t+1)*V/tp) of wte and
 * head (V % tp must be 0), embeddings are summed over the group, and the
 * cross-entropy combines the shards' max and sum-of-exp (allreduce_max and
 * allreduce_sum). The embedding's backward is local (this rank's rows).
 * A vision encoder may be tensor parallel the same way (heads, kv heads and
 * ffn split; patch embedding and merger replicated), sequence parallel, or
 * both at once: then rank (tp_rank, sp_rank) holds heads / (tp * sp) during
 * attention (heads and kv_heads must be multiples of tp * sp), allreduce_sum
 * acts on its tp group and alltoall on its sp group. An audio encoder too
 * (its GELU MLP's fc1 split by rows, fc2 by columns; the conv stem,
 * positions, final norm and projector replicated); under sp its rank holds
 * rows [sp_rank * N / sp, ...) of the batch's N frames after the stem, which
 * it computes from the whole clips' mel frames (ex_batch.mel), so N / sp must
 * be whole pool groups. ex_model_create_parallel is this with par's tp part
 * on the LLM and its sp part on the encoders.
 * The LLM's sequence may be split over sp ranks too (context parallelism,
 * plan_cp_of): each rank holds the positions plan_cp_span_of gives of every
 * sample (which must all have one length), the vision rows of those
 * positions in enc_in / denc, and the loss of the predictions it holds;
 * Ulysses needs alltoall, ring attention p2p_start and p2p_wait.
 * be is the backend the model allocates every tensor with and computes on
 * (the run driver picks it: ex_backend_pick); ex_model_create,
 * ex_model_create_modules and ex_model_create_parallel are this on the CPU
 * backend (tests, tools). */
struct ex_backend;
int ex_model_create_per_module(const struct ex_backend *be, const model_t *m, uint64_t seed, unsigned modules,
                               const ex_parallel *par, ex_model **out, char *err);
void ex_model_free(ex_model *em);

/* ---- units, shards and the hooks data-parallel strategies run at ----
 * A module's parameters are units used together (plan_module_tensors): 0 the
 * stem, 1..layers the blocks, layers + 1 the head; each is a contiguous run
 * of the flat buffers. Forward uses units in order, backward in reverse; the
 * tied LLM head uses the stem's embedding too. Around every use the model
 * calls the module's hooks, where ZeRO-3 gathers a unit's weights and ZeRO-2/3
 * bind and reduce its gradient bucket (executor/dp_*.c). */
typedef enum { EX_USE_FORWARD = 0, EX_USE_BACKWARD } ex_unit_use;
typedef struct {
    void *ctx;
    /* before unit u of module k is used: its weight views must be readable,
     * and in backward its gradient views writable */
    int (*begin)(void *ctx, int module, int unit, ex_unit_use use);
    /* after it; last: the unit's last backward use of the micro-batch (its gradient is complete) */
    int (*end)(void *ctx, int module, int unit, ex_unit_use use, bool last);
} ex_unit_hooks;
int ex_model_set_unit_hooks(ex_model *em, int module_index, const ex_unit_hooks *h);
/* The order a pass uses the units in (the forward's, or the backward's):
 * 0 .. layers + 1 forward, the reverse backward, and for an LLM whose head is
 * tied to its embedding the stem once more right after the head. Writes at
 * most cap entries, returns how many the pass has. */
int ex_module_unit_order(ex_model *em, int module_index, ex_unit_use use, int *order, int cap);
/* The units' flat offsets (offsets[0 .. n_units], the last is the module's size). */
int ex_module_units(ex_model *em, int module_index, const size_t **offsets, int *n_units);
/* Points unit u's weight (EX_BUF_PARAMS) or gradient (EX_BUF_GRADS) views
 * at base, which holds the unit's elements in flat order; NULL points them
 * back at the module's flat buffer, or nowhere if it was released. */
int ex_unit_bind(ex_model *em, int module_index, int unit, int kind, float *base);

/* The one shard function (llm.c's zero.cuh): every unit of n_u elements is
 * cut into G pieces of ceil(n_u / G), rank r owning flat elements
 * [off_u + r * piece_u, min(off_u + (r + 1) * piece_u, off_u + n_u)); its
 * pieces sit one after another in its shard buffers, at[u] .. at[u] + piece_u
 * (padded with zeros past the unit's end). G = 1 is the whole module. */
typedef struct {
    int G, r;
    int n_units;
    size_t *off;               /* [n_units + 1] the units' flat offsets */
    size_t *piece;             /* [n_units] */
    size_t *at;                /* [n_units + 1] offsets of this rank's pieces in its shard buffers */
} ex_shard;
int ex_shard_init(ex_shard *s, const size_t *unit_off, int n_units, int G, int r, char *err);
void ex_shard_free(ex_shard *s);
/* Flat elements [*lo, *hi) of unit u that rank r owns (empty when *lo == *hi). */
void ex_shard_range(const ex_shard *s, int u, size_t *lo, size_t *hi);

/* ZeRO state of module k (ex_shard_init over its units, G ranks, this one r):
 * the AdamW moments, and so the update and the clip norm's share, cover only
 * this rank's pieces; shard_grads (ZeRO-2/3) frees the flat gradient buffer
 * and keeps an accumulator of this rank's gradient pieces
 * (EX_BUF_GRADS_SHARD); shard_params (ZeRO-3) frees the flat weight buffer
 * and keeps this rank's weight pieces (EX_BUF_PARAMS_SHARD): the strategy
 * binds every unit's views before use. Existing moments are kept where the
 * old and new pieces overlap. */
int ex_module_set_shard(ex_model *em, int module_index, int G, int r, bool shard_grads, bool shard_params,
                        char *err);
const ex_shard *ex_module_get_shard(ex_model *em, int module_index);
/* The sum of squares of the gradients this rank updates (its pieces), over
 * the tensors it counts for the tp group (tp-split ones on every tp rank,
 * replicated ones on tp rank 0). */
double ex_module_grad_sumsq(ex_model *em, int module_index);
/* The backend the model computes with and whose memory its buffers are (for
 * strategies that copy them, and the boundaries that read them on the host). */
const struct ex_backend *ex_model_backend(const ex_model *em);

/* One batch. Images all have grid_h x grid_w patches (patches == grid_h *
 * grid_w), stored in the window / merge order of model_patch_order (models.h): every
 * merge^2 consecutive patches are one merge group and every `window`
 * consecutive patches one attention window. pixels is [n_images, patches,
 * in_channels * temporal_patch * patch^2]. Sample b's LLM sequence is the
 * merged tokens of its images_per_sample[b] images (taken in order), the
 * pooled rows of its audio_per_sample[b] clips, then its text_tokens tokens
 * (plan_sample_offset: the encoders in module order); position t of the text predicts text token t+1;
 * the loss is over the predictions loss_mask keeps (all batch *
 * (text_tokens - 1) without one). Only the kept rows reach the final norm,
 * LM head and cross-entropy. */
typedef struct {
    int n_images, patches, grid_h, grid_w;
    const float *pixels;
    int batch, text_tokens;
    const int32_t *tokens;              /* [batch, text_tokens] */
    const int *images_per_sample;       /* [batch], sums to n_images; NULL if n_images == 0 */
    /* [batch, text_tokens]: position t's prediction of token t+1 counts iff
     * loss_mask[t] != 0 (t = text_tokens - 1 never counts); NULL: all count. */
    const float *loss_mask;
    /* The loss is (sum of counted predictions' cross-entropy) / loss_denominator,
     * and so are the gradients: pass the global batch's count so micro-batches
     * and data-parallel ranks sum to the global mean. 0: this batch's count. */
    double loss_denominator;
    /* Audio clips (a model with an audio encoder): n_audio clips of
     * mel_frames log-mel frames each (even: the stride-2 conv stem leaves
     * mel_frames / 2 rows, a multiple of the encoder's pool), mel
     * [n_audio, mel_frames, mel_bins] frame-major (a frame's in_channels bins
     * contiguous; the transpose of Whisper's input_features), every clip whole
     * on every rank of the encoder's sp group; sample b owns the next
     * audio_per_sample[b] clips (sums to n_audio; NULL if n_audio == 0). */
    int n_audio, mel_frames;
    const float *mel;
    const int *audio_per_sample;
} ex_batch;

/* Forward + backward of one batch; gradients ACCUMULATE into the model's
 * gradient buffers (zeroed at create and by ex_optimizer_step / ex_zero_grads),
 * so micro-batches can be summed. *loss gets the batch loss (sum of the kept
 * predictions' cross-entropy / loss_denominator). The batch's
 * arrays must stay valid until the call returns. */
int ex_step_forward_backward(ex_model *em, const ex_batch *b, float *loss, char *err);
/* Forward only (evaluation); does not touch gradients. */
int ex_step_forward(ex_model *em, const ex_batch *b, float *loss, char *err);
void ex_zero_grads(ex_model *em);

/* The module-level pieces a step is made of, for running the encoders and
 * the LLM on different rank groups. A step of a vision model is exactly:
 *   ex_vision_forward -> vis_out [vis_rows, llm hidden] (merged tokens of all
 *     images, each image's in the encoder's stored (window) order)
 *   ex_encoder_rows_to_llm -> enc [vis_rows, llm hidden] (each image's in raster order)
 *   ex_llm_forward_backward(enc_in = enc) -> loss, denc (the same layout)
 *   ex_encoder_rows_from_llm(denc) -> dvis (vis_out's layout)
 *   ex_vision_backward(dvis).
 * With an audio encoder too, ex_audio_forward's rows join them: enc_in holds
 * each sample's encoder rows in plan_sample_offset's order (its images',
 * then its clips'), and denc comes back in the same layout. `dhp run` moves
 * the same rows between rank groups with the planner's hand-off segments
 * (plan_handoff), which put them in the same order.
 * Returned pointers are owned by em and valid until the next call of the same
 * function (vis_out: until the next ex_vision_forward into the same slot).
 * ex_vision_backward needs the batch of the last ex_vision_forward. */
int ex_vision_forward(ex_model *em, const ex_batch *b, const float **vis_out, int *vis_rows,
                      char *err);
int ex_llm_forward_backward(ex_model *em, const ex_batch *b, const float *enc_in, bool backward,
                            float *loss, const float **denc, char *err);
int ex_vision_backward(ex_model *em, const ex_batch *b, const float *dvis, char *err);
/* The encoders' output rows (out[0] vision, out[1] audio, NULL where absent;
 * each sample after sample) into the LLM's input enc, and back: the LLM's
 * gradient denc into grad[0] / grad[1]. Rows of the LLM's hidden width; an
 * image's merged tokens go from the encoder's stored order to raster order
 * (models/geometry.c), as Qwen2.5-VL's vision tower returns them. */
int ex_encoder_rows_to_llm(const ex_model *em, const ex_batch *b, const float *const out[2], float *enc, char *err);
int ex_encoder_rows_from_llm(const ex_model *em, const ex_batch *b, const float *denc, float *const grad[2], char *err);
/* A micro-batch of no samples on this rank while the others of its shard
 * group run one: only the unit hooks, in the order a real pass calls them, so
 * a ZeRO-2/3 strategy's collectives are matched (PyTorch's Join). */
int ex_vision_empty_pass(ex_model *em, ex_unit_use use, char *err);
int ex_llm_empty_pass(ex_model *em, bool backward, char *err);
/* ---- one pipeline stage of any module ----
 * A stage's pass reads and gives: the first stage reads the batch (the
 * LLM's also its encoders' rows, enc_in), the others the previous stage's
 * output rows (in); the last stage gives the module's output (an encoder's
 * merged rows, the LLM's loss), the others their rows for the next stage.
 * Backward mirrors it: the last stage starts from the module's output
 * gradient (an encoder's: in = the LLM's gradient of its rows; the LLM's:
 * its loss), the others from the next stage's gradient (in); every stage but
 * the first gives its input's gradient (out), the LLM's first stage the
 * gradient of its encoder rows (out). Rows are the stage boundary's: all the
 * micro-batch's rows this rank holds (N / tp under sequence parallelism),
 * the hidden width wide. Pointers returned are the model's, valid until the
 * module's next pass. */
typedef struct {
    const float *in;          /* see above; NULL where the stage reads the batch or starts at its loss */
    /* the LLM's first stage: every encoder's rows it holds, sample after
     * sample in the order of its local rows (each sample's encoders in
     * plan_sample_offset's order); backward gives their gradient (out) the same way */
    const float *enc_in;
    bool backward;            /* the LLM's last stage, forward: a backward follows (the loss's gradient is computed) */
    const float *out;         /* see above */
    int out_rows;
    float loss;               /* the LLM's last stage */
} ex_stage_io;
int ex_stage_forward(ex_model *em, int module_index, const ex_batch *b, ex_stage_io *io, char *err);
int ex_stage_backward(ex_model *em, int module_index, const ex_batch *b, ex_stage_io *io, char *err);
/* The unit hooks of a pass with no samples (see ex_vision_empty_pass). */
int ex_stage_empty_pass(ex_model *em, int module_index, ex_unit_use use, char *err);
/* The activation slot the module's next forward fills and backward reads (see ex_vision_set_slot). */
int ex_module_set_slot(ex_model *em, int module_index, int slot, char *err);
/* The model chunk (0 .. vp - 1) the module's next passes run, before its
 * slot is set: a slot holds one chunk's activations (plan_schedule_rank). */
int ex_module_set_chunk(ex_model *em, int module_index, int chunk, char *err);
/* This instance's stage of the module (plan_stage_of), and its rows at the
 * stage boundary for a batch (the size of in / out above), and whether the
 * module has a stage before (first == false) or after (last == false). */
int ex_module_stage(ex_model *em, int module_index, plan_stage *st, bool *first, bool *last);
int ex_stage_rows(ex_model *em, int module_index, const ex_batch *b);
/* The gradient of a tied embedding on this stage (the first stage's, or the
 * last stage's copy under the head), this tp rank's vocabulary rows:
 * NULL where the stage holds neither or the module keeps no gradients. */
float *ex_module_embedding_grad(ex_model *em, int module_index, size_t *n);

/* Activation slots of the vision encoder, for pipelined schedules that keep
 * several micro-batches alive: ex_vision_forward fills the selected slot and
 * ex_vision_backward reads it (pass the batch of that slot's forward).
 * 0 <= slot < EX_MAX_SLOTS; a slot's memory is allocated on first use and
 * kept (UTIL_MEM_ACTIV). The default slot is 0. A slot holds what a forward
 * leaves for its backward (activations, sequence offsets, rotary tables);
 * backward temporaries are one scratch shared by all slots. */
#define EX_MAX_SLOTS 64
int ex_vision_set_slot(ex_model *em, int slot, char *err);

/* The audio encoder, the same way (executor/audio.c): ex_audio_forward runs
 * the conv stem, blocks, pooling, final norm and projector of the batch's
 * clips and returns aud_out [aud_rows, llm hidden]: clip after clip (in
 * batch order), each clip's mel_frames / 2 / pool pooled rows in time order
 * (ex_audio_rows_per_clip), so sample b's rows follow its audio_per_sample
 * count; under sp > 1 this rank's contiguous 1 / sp of those rows (rank r
 * holds rows [r * R / sp, (r + 1) * R / sp) of the R), whose encoder weight
 * gradients are then partial sums over the sp group, as the vision
 * encoder's. ex_audio_backward takes dL/d(aud_out) in the same layout.
 * Slots, frozen modules and empty passes as the vision calls. */
int ex_audio_forward(ex_model *em, const ex_batch *b, const float **aud_out, int *aud_rows, char *err);
int ex_audio_backward(ex_model *em, const ex_batch *b, const float *daud, char *err);
int ex_audio_set_slot(ex_model *em, int slot, char *err);
int ex_audio_empty_pass(ex_model *em, ex_unit_use use, char *err);
/* Pooled rows each clip gives the LLM (mel_frames / 2 / pool; 0 without audio). */
int ex_audio_rows_per_clip(const ex_model *em, const ex_batch *b);
/* The batch's audio fields against the model: UTIL_OK without clips;
 * clips for a model without an audio encoder, odd mel_frames, rows that are
 * no multiple of pool or exceed learned positions are refused by name. */
int ex_check_audio(const ex_model *em, const ex_batch *b, char *err);
/* The frame rules alone: mel_frames clips for audio module am. */
int ex_audio_check_frames(const model_module *am, int mel_frames, char *err);

/* One module's flat parameter or gradient buffer (module_index into m->mod),
 * e.g. for a data-parallel all-reduce of the gradients; EX_BUF_ADAM_M / _V:
 * the AdamW moments this rank holds (its shard's pieces after
 * ex_module_set_shard, *n = the shard's size). UTIL_ENOTFOUND if the module
 * is not on this instance, the buffer was sharded away, or (moments) the
 * module is frozen. */
typedef enum { EX_BUF_PARAMS = 0, EX_BUF_GRADS, EX_BUF_ADAM_M, EX_BUF_ADAM_V, EX_BUF_PARAMS_SHARD,
               EX_BUF_GRADS_SHARD } ex_buffer_kind;
int ex_module_buffer(ex_model *em, int module_index, ex_buffer_kind kind, float **ptr, size_t *n);
/* AdamW's step count t (bias correction), for checkpoints. */
int ex_optimizer_get_t(const ex_model *em);
void ex_optimizer_set_t(ex_model *em, int t);

/* AdamW with global gradient-norm clipping and a linear-warmup + cosine LR.
 * Weight decay applies to matrices only (tensors with 2 dimensions: linear
 * weights, patch embedding, token embedding, LM head), never to biases or
 * norm weights. Clipping follows torch.nn.utils.clip_grad_norm_: grads are
 * multiplied by min(1, grad_clip / (norm + 1e-6)); grad_clip <= 0 disables it. */
typedef struct {
    float lr, min_lr;
    int warmup_steps, total_steps;
    float beta1, beta2, eps, weight_decay, grad_clip;
} ex_optim_config;

/* lr(step), step counted from 0: lr * (step + 1) / warmup while step < warmup,
 * then min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2 with
 * p = min(1, (step - warmup) / max(1, total - warmup)). */
float ex_lr_at(const ex_optim_config *c, int step);

/* Clips, applies one AdamW update with ex_lr_at(c, step) to every trainable
 * (not frozen) module, then zeroes the gradients. grad_norm / lr may be NULL. */
int ex_optimizer_step(ex_model *em, const ex_optim_config *c, int step, float *grad_norm,
                      float *lr, char *err);
/* The same in two halves, for parallel runs: the local sum of squares of the
 * trainable gradients (to be summed over the ranks holding distinct shards),
 * then clipping with the global norm, the update and zeroing. */
/* Each tensor is counted on one rank of the groups it is replicated over
 * (tp-sharded: every tp rank of its module; replicated: tp rank 0; vision:
 * sp rank 0, after the caller's sp all-reduce of its partial gradients; a
 * vision encoder without tp of its own next to a tp-parallel LLM: the LLM's
 * tp rank 0), so summing the results over all model-parallel ranks gives the
 * global squared norm. ex_optimizer_step sums it over the LLM's tp group (or
 * the vision encoder's when only it is tp-parallel) and nothing else. ZeRO-1
 * callers compute the norm themselves from the reduce-scattered gradients. */
double ex_grad_sumsq(const ex_model *em);
int ex_optimizer_apply(ex_model *em, const ex_optim_config *c, int step, double grad_norm,
                       float *lr, char *err);
/* ex_optimizer_apply one module at a time, as the schedule's OPTIMIZER ops
 * run (each module's ZeRO-1 all-gather can then follow its own update):
 * ex_optimizer_begin once per step (AdamW's step count), then
 * ex_optimizer_apply_module for each trained module this instance holds,
 * which clips, updates and zeroes that module's gradients only. */
void ex_optimizer_begin(ex_model *em);
int ex_optimizer_apply_module(ex_model *em, const ex_optim_config *c, int step, double grad_norm,
                              int module_index, float *lr, char *err);

/* Named parameter tensors, for checkpoints and tests. Names look like
 * "vision.blocks.0.attn.q.weight", "llm.layers.1.mlp.down.weight". */
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[2];          /* this instance's (shard) shape */
    int64_t full_shape[2];     /* the whole tensor's shape */
    int64_t start[2];          /* the shard's first row and column in the whole tensor */
    bool sharded;              /* split over the tensor-parallel group; else replicated */
    int64_t numel;
    float *data;
    float *grad;
    bool decay;        /* AdamW weight decay applies */
    int module_index;  /* module of m that holds it */
    size_t offset;     /* first element in that module's flat buffer (ex_module_buffer) */
    int split_axis;    /* sharded: the axis split over the tp group (0 rows, 1 columns); else 0 */
    bool tied_copy;    /* a pipeline's last stage's copy of the tied embedding (same name; checkpoints keep the first stage's) */
} ex_param;

int ex_param_count(const ex_model *em);
int ex_param_get(ex_model *em, int i, ex_param *out);
int64_t ex_model_num_params(const ex_model *em);

/* Raw fp32 hand-off: `path` gets every parameter's data in ex_param order,
 * `path`.names one line per tensor "name ndim d0 [d1]". Load checks the names
 * and sizes match this model. (Checkpoints proper are executor/checkpoint.c.) */
int ex_params_save_raw(ex_model *em, const char *path, char *err);
int ex_params_load_raw(ex_model *em, const char *path, char *err);

/* ---- data set and checkpoints ---- */

/* Synthetic image-caption data set (format: executor/DATASET.md), with
 * optional synthetic audio (log-mel-like frames of tones, chirps and noise
 * bursts) whose sound the caption describes too.
 * Text is byte-level: token = byte value 0..255, plus the specials below;
 * EX_VOCAB ids are reserved (259..271 unused). */
#define EX_TOK_BOS 256
#define EX_TOK_EOS 257
#define EX_TOK_PAD 258
#define EX_VOCAB 272
#define EX_DATA_CHANNELS 3
#define EX_DATA_CAPTION_MAX 64   /* caption bytes stored per sample */

typedef struct {
    int samples;      /* total samples, >= 1 */
    int image_size;   /* S: images are S x S RGB; 0 = no images (audio only) */
    int patch;        /* P: S % P == 0 */
    int merge;        /* M: patch-merger side, (S/P) % M == 0 */
    int window;       /* patches per attention window (a square, side % M == 0), 0 = none */
    int text_tokens;  /* T: token row length incl. BOS/EOS, >= 3 */
    int shards;       /* 1..samples */
    uint64_t seed;
    bool audio;       /* every sample has a clip (format version 2) */
    int mel_bins;     /* B: bins per frame (the audio encoder's in_channels) */
    int mel_frames;   /* F: frames per clip, even (the encoder's stride-2 stem halves it) */
} ex_synth_cfg;

/* Defaults used by `dhp data synth` when an option is not given. */
void ex_synth_defaults(ex_synth_cfg *cfg);
/* Checks shapes (names the offending option) without writing anything. */
int ex_synth_validate(const ex_synth_cfg *cfg, char *err);
/* Renders the data set into dir (created if missing): shard-NNNNN.bin files
 * then manifest.json, each written atomically. */
int ex_data_synth(const char *dir, const ex_synth_cfg *cfg, char *err);

typedef struct {
    int samples, image_size, channels, patch, merge, window, text_tokens, shards;
    int grid;          /* S / P patches per side (0 without images) */
    int patches;       /* grid * grid patches per image (0 without images) */
    int patch_dim;     /* C * P * P */
    uint64_t seed;     /* the synth seed (not the shuffle seed) */
    int version;       /* format version: 1 images only, 2 with the audio section */
    int mel_bins, mel_frames;   /* each sample's clip; 0 = no audio */
} ex_dataset_info;

typedef struct ex_dataset ex_dataset;

/* Opens and fully validates a data set directory (manifest, every shard's
 * header, size and CRC32); shards are loaded into memory. */
int ex_data_open(const char *dir, ex_dataset **out, char *err);
void ex_data_close(ex_dataset *ds);
const ex_dataset_info *ex_data_info(const ex_dataset *ds);
/* Caption text of global sample i (NUL-terminated), NULL if out of range. */
const char *ex_data_caption(const ex_dataset *ds, int i);

/* Position of patch (row y, col x) in the model's patch order, for a grid
 * g x g, merge m and window w (patches, 0 = the whole image); see DATASET.md. */
int ex_patch_order(int y, int x, int grid, int merge, int window);

/* The data set's audio against a model before anything is allocated: clips
 * for a model without an audio encoder, an encoder without clips, mel_bins
 * other than its in_channels and frames it cannot take (ex_check_audio's
 * rules) are refused, naming the field. */
int ex_data_check_audio(const ex_dataset_info *in, const model_t *m, char *err);

/* One rank's batch. Layouts (row-major):
 *   pixels    [n, patches, patch_dim]  float in [0,1], patch vector index c*P*P + py*P + px
 *   mel       [n, mel_frames, mel_bins] float in [-1, 1] (audio sets; NULL otherwise):
 *             sample row's clip, frame-major, as ex_batch.mel takes it
 *   tokens    [n, T]  BOS, caption bytes (truncated to T-2), EOS, PAD...
 *   targets   [n, T]  targets[t] = tokens[t+1]; PAD at t = T-1
 *   loss_mask [n, T]  1 where targets[t] != PAD, else 0
 *   lengths   [n]     tokens that are not PAD (BOS..EOS)
 *   sample_ids[n]     global sample index of each row */
typedef struct {
    int n, patches, patch_dim, text_tokens;
    float *pixels;
    int32_t *tokens, *targets;
    float *loss_mask;
    int32_t *lengths, *sample_ids;
    int mel_frames, mel_bins;
    float *mel;
} ex_data_rows;

int ex_batch_alloc(ex_data_rows *b, const ex_dataset *ds, int n, char *err);
void ex_batch_free(ex_data_rows *b);

/* Full global batches per epoch (the tail that does not fill one is dropped). */
long ex_data_steps_per_epoch(const ex_dataset *ds, int global_batch);

/* Fills b with rank `rank` of `dp`'s slice of global batch number `step`
 * (counted from 0 across epochs: epoch = step / steps_per_epoch). The epoch's
 * order is a Fisher-Yates shuffle driven by splitmix64 seeded from
 * (shuffle_seed, epoch); rank r gets positions [r*L, (r+1)*L) of the global
 * batch, L = global_batch / dp, so the ranks' rows concatenated in rank order
 * are exactly the dp = 1 batch. b must hold L rows. The only state a resume
 * needs is (shuffle_seed, step). */
int ex_data_batch(ex_dataset *ds, uint64_t shuffle_seed, long step, int global_batch,
                  int rank, int dp, ex_data_rows *b, char *err);

/* Safetensors checkpoints (https://github.com/huggingface/safetensors):
 * u64 LE header length N, N bytes of JSON, then the raw LE tensor bytes. */
typedef enum { EX_DT_F32 = 0, EX_DT_BF16 = 1 } ex_dtype;
#define EX_CKPT_MAX_DIMS 8

/* A named F32 tensor in memory. dtype is the dtype on disk: F32, or BF16
 * (written round-to-nearest-even, widened back to F32 on read). */
typedef struct {
    const char *name;
    ex_dtype dtype;
    int ndim;
    int64_t shape[EX_CKPT_MAX_DIMS];
    float *data;
} ex_named_tensor;

/* Writes tensors (in order) and metadata pairs meta_kv[2i] = key,
 * meta_kv[2i+1] = value, via temp file + fsync + rename: on failure the old
 * file at path (if any) is untouched and no temp file remains. The metadata
 * also gets checksums (executor/checkpoint.c): "crc32:<name>" per tensor and
 * "meta_crc32"; keys of that form the caller passes are recomputed. */
int ex_ckpt_write(const char *path, const ex_named_tensor *t, int n,
                  const char *const *meta_kv, int n_meta, char *err);

/* Reads into caller-allocated tensors; the file must hold exactly these
 * names with these shapes (any mismatch names the tensor). The on-disk
 * dtype may be F32 or BF16 whatever t[i].dtype says. */
int ex_ckpt_read_into(const char *path, const ex_named_tensor *t, int n, char *err);

/* Generic validated view of a checkpoint file. */
typedef struct {
    char *name;
    char dtype[8];       /* as in the file: "F32", "BF16", ... */
    int ndim;
    int64_t shape[EX_CKPT_MAX_DIMS];
    uint64_t begin, end; /* data_offsets, relative to the data section */
    bool has_crc;        /* the metadata holds "crc32:<name>", verified by every read */
    uint32_t crc;
} ex_ckpt_entry;

typedef struct ex_ckpt ex_ckpt;

/* Validates header length, JSON, dtypes, shapes, offsets (inside the data
 * section, no overlaps, no holes: the header describes exactly the bytes on
 * disk), names, and the metadata checksum if there is one. */
int ex_ckpt_open(const char *path, ex_ckpt **out, char *err);
void ex_ckpt_close(ex_ckpt *c);
int ex_ckpt_count(const ex_ckpt *c);
const ex_ckpt_entry *ex_ckpt_entry_at(const ex_ckpt *c, int i);
const ex_ckpt_entry *ex_ckpt_find(const ex_ckpt *c, const char *name);
/* Metadata value for key, NULL if absent. */
const char *ex_ckpt_meta(const ex_ckpt *c, const char *key);
int ex_ckpt_meta_count(const ex_ckpt *c);
void ex_ckpt_meta_at(const ex_ckpt *c, int i, const char **key, const char **value);
/* Reads entry e (F32, BF16 or F16 on disk) as floats into out[numel]; a tensor
 * with a checksum is verified (a mismatch names the file and the tensor). */
int ex_ckpt_read_f32(ex_ckpt *c, const ex_ckpt_entry *e, float *out, size_t numel, char *err);
/* Every tensor and the metadata carry checksums (files dhp writes do). */
bool ex_ckpt_checksummed(const ex_ckpt *c);
/* Reads every checksummed F32 / BF16 tensor once; *verified counts them. */
int ex_ckpt_verify(ex_ckpt *c, int *verified, char *err);
int64_t ex_ckpt_numel(const ex_ckpt_entry *e);

/* ---- Hugging Face checkpoints (executor/hf_names.c, hf_weights.c, hf_export.c) ----
 * The safetensors layout transformers' save_pretrained writes: model.safetensors,
 * or shards listed in model.safetensors.index.json ("weight_map": name -> file),
 * beside config.json. */
typedef enum { EX_HF_QWEN2_5_VL = 0, EX_HF_QWEN2_AUDIO, EX_HF_LLAVA } ex_hf_arch;
typedef struct {
    char name[160];                    /* the Hugging Face tensor name */
    int ndim;
    int64_t shape[EX_CKPT_MAX_DIMS];   /* the whole Hugging Face tensor's shape */
    int64_t row0;                      /* first row of the dhp tensor in it (q, k or v of a fused qkv) */
} ex_hf_ref;
/* Which Hugging Face architecture holds model m (one encoder feeding the LLM), or an error. */
int ex_hf_arch_of(const model_t *m, ex_hf_arch *out, const char **model_type, const char **architecture, char *err);
/* Where dhp tensor t (plan_module_tensors of module mm, whole: tp 1) lives in a Hugging Face checkpoint. */
int ex_hf_ref_of(const model_t *m, const model_module *mm, const plan_tensor *t, ex_hf_ref *out, char *err);

typedef struct ex_hf ex_hf;
/* Opens the checkpoint in dir and checks it holds model m: config.json (when
 * present) describes m's shapes, every tensor of m is there with its shape
 * and an F32, BF16 or F16 dtype, and there is no other tensor. */
int ex_hf_open(const char *dir, const model_t *m, ex_hf **out, char *err);
/* The whole tensor `name` (plan_module_tensors' name) of module k as floats. */
int ex_hf_read(ex_hf *h, int k, const char *name, float *out, size_t numel, char *err);
void ex_hf_close(ex_hf *h);
/* Writes dhp checkpoint ckpt (a `dhp run --ckpt` directory: its latest step,
 * or one step-N directory) of model m as out_dir/model.safetensors and
 * out_dir/config.json in the Hugging Face layout; creates out_dir. */
int ex_hf_export(const char *ckpt, const model_t *m, const char *out_dir, char *err);
/* The first special-token key the exported config.json leaves out because m
 * records no id for it (model_t.tokens; transformers then uses its default),
 * NULL if none. */
const char *ex_hf_missing_token(const model_t *m);

/* ---- dhp run: the training driver (executor/run.c) ----
 * Every rank of `mpirun -np N dhp run` calls ex_run with the same options.
 * The plan's module groups become communicators; each rank runs its
 * plan_schedule_rank op list every step (see planner.h), so what runs is
 * what the simulator prices. */
/* Whether want (NULL: auto) names a backend dhp run --backend takes; err
 * (UTIL_ERR_LEN; may be NULL) lists them if not (executor/backend_pick.c). */
bool ex_backend_name_ok(const char *want, char *err);

typedef struct {
    const char *plan_path;
    const char *data_dir;
    int steps;                 /* length of the run (the LR schedule's total) */
    int stop_after;            /* stop once this many steps are done (0 = steps), e.g. to test resume */
    ex_optim_config optim;     /* total_steps is set from steps */
    uint64_t seed;             /* weight init */
    uint64_t shuffle_seed;     /* data order */
    const char *ckpt_dir;      /* NULL: no checkpoints */
    int ckpt_every;            /* steps between checkpoints; 0: only at the end */
    bool resume;               /* continue from ckpt_dir's latest checkpoint */
    const char *init_from;     /* a Hugging Face checkpoint directory to start from (ex_hf_open), NULL: seed init */
    bool log_json;             /* one JSON object per step on stdout instead of text */
    bool progress;             /* progress bar with ETA on stderr (rank 0, a terminal) */
    int log_every;             /* text log line every N steps (default 1) */
    const char *trace_path;    /* Chrome trace of the last step's measured ops, NULL: none */
    int ckpt_keep;             /* keep the newest N step directories; 0: all */
    double comm_timeout_s;     /* a communicator wait longer than this ends the run; 0: none, < 0: the
                                  default (DHP_COMM_TIMEOUT, else ex_comm_set_timeout's) */
    const char *backend;       /* "cpu", "cuda", NULL / "auto": cuda where a device is visible (ex_backend_pick) */
    const char *comm;          /* "mpi", "nccl", NULL: the default (ex_comm_pick) */
    bool tf32;                 /* fp32 linears on TF32 tensor cores (--tf32; also a plan made with --tf32) */
} ex_run_options;
void ex_run_options_default(ex_run_options *o);
/* Runs the training; returns UTIL_OK or an error code with err filled on
 * every rank that saw it (ranks agree on failures such as a NaN loss). A
 * verdict rank 0 reached for all (a bad --ckpt or --trace, a checkpoint
 * that cannot be resumed) leaves err empty on the other ranks: one line. */
int ex_run(const ex_run_options *o, int *argc, char ***argv, char *err);

#endif
