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
 * optional window attention, merger) feeding a decoder LLM (RMSNorm, GQA,
 * 1-D RoPE, SwiGLU, tied or untied LM head). All fp32.
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
 * split by rows; o, down by columns; norms, o / down biases, embeddings and
 * LM head replicated). allreduce_sum sums a buffer in place over the tp group.
 * Vision encoder, Ulysses sequence parallel: rank sp_rank of sp_size holds
 * rows [sp_rank * N / sp, (sp_rank + 1) * N / sp) of the batch's N patches
 * (ex_batch.pixels then points at those rows only; N / sp must be whole merge
 * groups); attention runs on all rows x heads / sp after alltoall, which sends
 * chunk r (`chunk` floats) of send to rank r and receives rank r's into chunk
 * r of recv. vis_out / dvis are then the local merged rows, and the vision
 * weight gradients are partial sums to be all-reduced over the sp group.
 * Every rank of a group calls each step function together. Shards are
 * initialised as slices of the full tensors (same seed). */
typedef struct {
    int tp_size, tp_rank;
    int sp_size, sp_rank;
    void *ctx;
    int (*allreduce_sum)(void *ctx, float *buf, size_t n);
    int (*alltoall)(void *ctx, const float *send, float *recv, size_t chunk);
} ex_parallel;
int ex_model_create_parallel(const model_t *m, uint64_t seed, unsigned modules,
                             const ex_parallel *par, ex_model **out, char *err);
void ex_model_free(ex_model *em);

/* One batch. Images all have grid_h x grid_w patches (patches == grid_h *
 * grid_w), stored in the window / merge order of ex_patch_positions: every
 * merge^2 consecutive patches are one merge group and every `window`
 * consecutive patches one attention window. pixels is [n_images, patches,
 * in_channels * temporal_patch * patch^2]. Sample b's LLM sequence is the
 * merged tokens of its images_per_sample[b] images (taken in order) followed
 * by its text_tokens tokens; position t of the text predicts text token t+1,
 * and the loss is the mean over batch * (text_tokens - 1) predictions. */
typedef struct {
    int n_images, patches, grid_h, grid_w;
    const float *pixels;
    int batch, text_tokens;
    const int32_t *tokens;              /* [batch, text_tokens] */
    const int *images_per_sample;       /* [batch], sums to n_images; NULL if n_images == 0 */
} ex_batch;

/* The (row, col) of each stored patch of a grid_h x grid_w image in the
 * order above: windows in raster order, merge groups in raster order inside
 * a window, patches in raster order inside a group (window side =
 * sqrt(window) patches; window 0 = merge groups only). */
int ex_patch_positions(const model_module *mm, int grid_h, int grid_w, int *rows, int *cols,
                       char *err);

/* Forward + backward of one batch; gradients ACCUMULATE into the model's
 * gradient buffers (zeroed at create and by ex_optimizer_step / ex_zero_grads),
 * so micro-batches can be summed. *loss gets the batch mean loss. The batch's
 * arrays must stay valid until the call returns. */
int ex_step_forward_backward(ex_model *em, const ex_batch *b, float *loss, char *err);
/* Forward only (evaluation); does not touch gradients. */
int ex_step_forward(ex_model *em, const ex_batch *b, float *loss, char *err);
void ex_zero_grads(ex_model *em);

/* The module-level pieces a step is made of, for running the encoder and the
 * LLM on different rank groups. A step is exactly:
 *   ex_vision_forward -> vis_out [vis_rows, llm hidden] (merged tokens of all images)
 *   ex_llm_forward_backward(vis_in = vis_out) -> loss, dvis [vis_rows, llm hidden]
 *   ex_vision_backward(dvis).
 * Returned pointers are owned by em and valid until the next call of the same
 * function. ex_vision_backward needs the batch of the last ex_vision_forward. */
int ex_vision_forward(ex_model *em, const ex_batch *b, const float **vis_out, int *vis_rows,
                      char *err);
int ex_llm_forward_backward(ex_model *em, const ex_batch *b, const float *vis_in, bool backward,
                            float *loss, const float **dvis, char *err);
int ex_vision_backward(ex_model *em, const ex_batch *b, const float *dvis, char *err);

/* One module's flat parameter or gradient buffer (module_index into m->mod),
 * e.g. for a data-parallel all-reduce of the gradients. UTIL_ENOTFOUND if the
 * module is not on this instance. */
typedef enum { EX_BUF_PARAMS = 0, EX_BUF_GRADS } ex_buffer_kind;
int ex_module_buffer(ex_model *em, int module_index, ex_buffer_kind kind, float **ptr, size_t *n);

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
 * (tp-sharded: every tp rank; replicated: tp rank 0; vision: sp rank 0, after
 * the caller's sp all-reduce of its partial gradients), so summing the
 * results over all model-parallel ranks gives the global squared norm. */
double ex_grad_sumsq(const ex_model *em);
int ex_optimizer_apply(ex_model *em, const ex_optim_config *c, int step, double grad_norm,
                       float *lr, char *err);

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

#endif
