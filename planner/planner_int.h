/* planner-internal: what the planner's files share (the cost model's, the
 * schedule's and the simulator's). */
#ifndef DHP_PLANNER_INT_H
#define DHP_PLANNER_INT_H

#include "planner/planner.h"

/* Defines a *_parse of an enum from its name table (plan_precision_parse,
 * plan_backend_parse, ...): UTIL_OK with *out set, or UTIL_EINVAL with err
 * saying what the table holds (util_name_index). */
#define PLAN_ENUM_PARSE(fn, type, names, count)                  \
    int fn(const char *s, type *out, char *err)                  \
    {                                                            \
        int i = util_name_index(s, names, count, err);           \
        if (i < 0) return UTIL_EINVAL;                           \
        *out = (type)i;                                          \
        return UTIL_OK;                                          \
    }

/* The communication inside one micro-batch's forward and backward, and the
 * blocking exchanges it makes (plan_time.fwd_syncs, bwd_syncs). */
typedef struct {
    double fwd_s, bwd_s;
    int fwd_syncs, bwd_syncs;
} plan_comm;

/* Adds `count` exchanges of `seconds` each to the forward or the backward. */
void plan_comm_add(plan_comm *c, bool backward, double seconds, int count);

/* cost_dp.c: the data-parallel strategy's price (plan_dp_rules_of).
 * Per micro-batch of stage (or model chunk) st, inside the compute ops:
 * ZeRO-3's gathers and ZeRO-2/3's reduce-scatters of st's units, the part
 * the micro-batch's forward and backward compute (fwd_compute,
 * bwd_compute) do not hide, into *comm; the
 * strategy's own element-wise work (zeroing buckets, accumulating shards,
 * the Megatron target's copies into and out of the collectives' flat
 * buffers) into *fwd_busy and *bwd_busy. backward: the module runs a
 * backward. */
void plan_price_dp_micro(const model_module *mm, const plan_module *s, const plan_stage *st, const cost_pool *pool,
                         const plan_options *o, bool backward, double fwd_compute, double bwd_compute, plan_comm *comm,
                         double *fwd_busy, double *bwd_busy);
/* Per step: the GRAD_SYNC and PARAM_GATHER ops of pipeline stage `stage`
 * (plan_time.grad_sync_s .. param_gather_busy_s). The dhp target's
 * grad_sync_s is what the op waits for: the part of the unit reductions the
 * last micro-batch's backward (bwd_window_s on this stage) does not hide. */
void plan_price_dp_step(const model_module *mm, const plan_module *s, int stage, const cost_pool *pool,
                        const plan_options *o, double bwd_window_s, plan_time *out);

/* cost_zero3.c: ZeRO-3 as DeepSpeed issued it in 2021 (PLAN_ZERO3_DEEPSPEED_2021):
 * one all-gather per Megatron-LM parameter tensor for the forward
 * (gather_fwd) and the backward (gather_bwd: full recomputation's forward
 * again, then the backward, less what stage3_max_reuse_distance keeps
 * gathered), each with PyTorch's list-form copies, and the gradients'
 * all-reduces in reduce_bucket_size buckets (reduce: contiguous_gradients'
 * default fallback); the raw seconds and collectives into *raw (none of
 * them overlaps anything). */
/* Whether module mm under strategy s is DeepSpeed 2021's ZeRO-3: the
 * Megatron target with --zero3 deepspeed-2021 on a module whose weights ZeRO-3
 * shards (plan_dp_rules_of's stage 3). The one test of cost_zero3.c's terms,
 * in time (cost_dp.c, cost.c) and memory (memory.c). */
bool plan_zero3_deepspeed_applies(const model_module *mm, const plan_module *s, const plan_options *o);
/* UTIL_EINVAL (one line in err) where s puts DeepSpeed 2021's ZeRO-3 beside
 * pipeline stages, which DeepSpeed does not run; every other ZeRO-3 takes them. */
int plan_zero3_pipeline_check(const model_module *mm, const plan_module *s, const plan_options *o, char *err);
int plan_zero3_deepspeed_2021(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o,
                              bool gather_fwd, bool gather_bwd, bool reduce, plan_comm *raw);
/* Megatron-LM's parameter tensors of the module on one tp rank (query, key
 * and value one tensor, their biases one): *elems (malloc'd) gets each one's
 * elements; returns their count, -1 when out of memory. */
int plan_zero3_megatron_tensors(const model_module *mm, const plan_module *s, double **elems);
double plan_zero3_deepspeed_buffer_bytes(const model_module *mm, const plan_module *s);
/* The reduce bucket's bytes beyond the gather buffer's gradient (no bucket of its own in v0.3.13). */
double plan_zero3_deepspeed_bucket_bytes(const model_module *mm, const plan_module *s, double bucket_bytes);
double plan_zero3_persistent_gather_s(const model_module *mm, const plan_module *s, const cost_pool *pool,
                                      const plan_options *o);
/* DeepSpeed v0.3.13 stage 3's optimizer step around the fused Adam: the overflow check, the
 * per-piece fp64 norm (out->norm_s), the fp32 gradient's flattening and unscaling, the fp16
 * copy of the master (added to out->optim_s); nothing unless --zero3 deepspeed-2021 applies. */
void plan_zero3_deepspeed_step(const model_module *mm, const plan_module *s, const cost_pool *pool,
                               const plan_options *o, plan_time *out);
/* cost_optim.c: bytes per updated element the AdamW step moves (b.step_traffic when fused). */
double plan_adamw_step_bytes(const plan_state_bytes *b, const plan_options *o);
/* cost_grad_accum.c: micro-batches of the step on each data-parallel rank,
 * ceil(global_batch / (dp micro_batch)) (the gradient accumulation's count
 * and the Megatron target's pipeline memory's). */
double plan_step_micro_batches(const plan_module *s, const plan_workload *w);
/* A micro-batch's share of its step's gradient accumulation on stage st (plan_options.grad_accum; cost_grad_accum.c). */
double plan_grad_accum_s(const model_module *mm, const plan_module *s, const plan_stage *st, const plan_workload *w,
                         const cost_gpu *g, const plan_options *o);
/* cost_tp.c: the TP regions of the blocks and of the LLM's ends, Ulysses' all-to-alls (fwd: what full recomputation repeats) */
void plan_price_tp_blocks(const model_module *mm, const plan_module *s, int L, const cost_pool *pool,
                          const plan_options *o, double A, double t, bool backward, bool weight_grads, plan_comm *c,
                          plan_comm *fwd);
void plan_price_tp_llm_ends(const model_module *mm, const plan_module *s, const plan_stage *st, const cost_pool *pool,
                            double A, double t, double text_rows, double head_rows, bool backward, plan_comm *c);
/* cost_tp.c: one collective of op over module s's group on `axes` (plan_group_shape places it in the
 * node); the layout copy DTensor adds beside a sequence-parallel collective of elems elements (0 under
 * Megatron's TP); whether a block's backward gathers its column-parallel inputs again. */
double plan_group_coll_s(const cost_pool *pool, const plan_module *s, unsigned axes, cost_coll op, double bytes);
double plan_tp_layout_copy_s(const cost_pool *pool, const plan_options *o, double A, double elems);
bool plan_tp_regathers(const plan_module *s, const plan_options *o);
/* cost_tp_overlap.c: L blocks' tensor-parallel collectives where plan_tp_overlaps (TransformerEngine's
 * userbuffers, or torchtitan's async TP under --tp-style dtensor): what the GEMMs leave exposed into c
 * (fwd: the forward's, which full recomputation issues again). */
void plan_price_tp_overlap_blocks(const model_module *mm, const plan_module *s, int L, const cost_pool *pool,
                                  const plan_options *o, double A, double t, bool backward, bool weight_grads,
                                  plan_comm *c, plan_comm *fwd);
/* Bytes per element of the blocks' sequence-parallel all-gathers: 1 under FP8 linears (plan_fp8_props.tp_gathers_fp8), else A. */
double plan_tp_gather_bytes(const plan_options *o, double A);
void plan_price_ulysses(const model_module *mm, const plan_module *s, const cost_pool *pool, double A, double t,
                        int layers, bool backward, plan_comm *fwd, plan_comm *c);
/* cost.c: the four linears of a self-attention block on t rows as the
 * Megatron target runs them (fused query/key/value, attention output, the
 * MLP's input projection(s) fused, its output projection), Y[m,n] = X[m,k]
 * W[k,n] on one tp rank; price_block prices them, cost_tp_overlap.c pairs them with
 * the collectives TransformerEngine's userbuffers overlap (a cross-attention
 * block's too, whose gathered rows feed its query projection alone: the
 * pairing takes the self-attention shapes for it, approximately). */
typedef enum { PLAN_LIN_QKV = 0, PLAN_LIN_PROJ, PLAN_LIN_FC1, PLAN_LIN_FC2, PLAN_NLIN } plan_block_linear;
typedef struct { double m, n, k; } plan_gemm_shape;
void plan_block_linear_shapes(const model_module *mm, const plan_module *s, double t, plan_gemm_shape out[PLAN_NLIN]);
/* cost_dp.c: what `comm` seconds beside `hideable` seconds of compute add (with the contention slowdown) */
double plan_overlapped_comm_s(double comm, double hideable, bool contention);

/* cost_dp.c: the EMBED_SYNC op: the tied embedding's gradient (this tp
 * rank's vocabulary rows) all-reduced between the first and the last stage,
 * per_node of the two on one node. */
double plan_embed_sync_s(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o,
                         int per_node);

/* cost.c: the running price of one module stage (its forward and backward
 * seconds, what its backward computes), and its steps: a GEMM Y[m,n] =
 * X[m,k] W[k,n] with its backward (dX only where input_grad and the module
 * passes gradients back), `calls` calls of element-wise kernel k over n
 * elements in all in a pass (PLAN_PASS_WGRAD: a backward call only where
 * the weights train). */
typedef struct plan_pricer plan_pricer;
typedef enum { PLAN_PASS_FWD, PLAN_PASS_BWD, PLAN_PASS_WGRAD } plan_pass;
void plan_price_gemm(plan_pricer *p, double m, double n, double k, bool input_grad);
void plan_price_ew(plan_pricer *p, plan_pass pass, cost_ew k, double calls, double n);

/* cost_fp8.c: the FP8 casts around one of the blocks' linears (m rows, k in,
 * n out; norm_fed: its input comes from a norm), seconds in the forward and
 * the backward; 0 without FP8 (plan_fp8_props). */
void plan_fp8_casts_s(const plan_fp8_props *f, const cost_gpu *g, double A, double m, double n, double k,
                      bool norm_fed, double *fwd, double *bwd);

/* cost_audio.c: the audio encoder's stem (first stage) and head (last
 * stage) on t rows of `samples` clips of F frames after the stem, sp ranks. */
void plan_price_audio_ends(plan_pricer *p, const model_module *mm, const plan_stage *st, double samples, double F,
                           int sp, double t);

/* cost_hop.c: a pipeline's hops in one micro-batch, each boundary over the
 * node's link or the network's as its two stages sit (plan_stage_boundary_in_node):
 * fwd_s, bwd_s the receives of all pp vp - 1 hand-offs each way (what the
 * micro-batch waits through the pipeline), stage_s[i] stage i's own (its
 * chunks' receives and blocking sends, none before the first or after the last). */
typedef struct { double fwd_s, bwd_s, stage_s[PLAN_MAX_PP]; } plan_pipeline_hops;
void plan_pipeline_hops_of(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                           const cost_cluster *c, const plan_options *o, double samples, plan_pipeline_hops *out);

/* cost_cp.c: one block's ring attention (executor/ring.c) on sp rank
 * sp_rank (-1: the group's pace, which rank sp - 1's is: every step's block
 * the slowest) for `samples` samples of S positions: its attention kernels
 * and merges, and the part of its K/V passes (and backward their gradients')
 * compute does not hide, with the waits. A bytes per element. */
typedef struct {
    double fwd_s, bwd_s, fwd_comm_s, bwd_comm_s;
    int fwd_syncs, bwd_syncs;
} plan_ring_price;
void plan_price_ring_block(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o,
                           double A, double samples, double S, int sp_rank, bool backward, plan_ring_price *out);
/* The LLM's text rows (its embedding's) and head rows (plan_head_rows) that
 * sp rank sp_rank holds of `samples` samples of S positions, and in how many
 * runs of positions per sample its text comes (the executor places a run per call). */
void plan_cp_end_rows(const model_module *mm, const plan_module *s, const plan_workload *w, plan_target target,
                      double samples, double S, int sp_rank, double *text, double *head, int *text_runs);

/* chunks.c: does encoder k feed the LLM its rows (an encoder of a workload with images)? */
bool plan_encoder_feeds(const plan_t *p, int k);
/* Micro-batches of a dp share of `count` samples, and micro-batch u's samples
 * [*f, *f + *n) of the share starting at `first` (past its end: empty, at its end). */
int plan_micro_count(const plan_module *s, int count);
void plan_micro_range(const plan_module *s, int first, int count, int u, int *f, int *n);
/* Micro-batches module k runs of chunk c on a rank whose share is `count`
 * samples: its own, or where the data-parallel strategy gathers or reduces
 * units inside every micro-batch (ZeRO-2/3), as many as the module's busiest
 * dp rank of the chunk, the extra ones empty, so every collective of the
 * shard group is matched (PyTorch's Join for uneven inputs). */
int plan_micro_ops(const plan_t *p, int k, int c, int count);
/* The most micro-batches module k runs of any chunk (activation slots per chunk). */
int plan_max_micro_per_share(const plan_t *p, int k);

#endif
