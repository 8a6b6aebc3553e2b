/* planner: memory model, cost model, the GLPK mixed-integer search over
 * per-module strategies and placements, the baselines, and the plan file.
 *
 * Layering: util < models < costdb < planner < executor < cli. The plan
 * types below are the contract between planner and executor. */
#ifndef DHP_PLANNER_H
#define DHP_PLANNER_H

#include <stdbool.h>
#include "util/util.h"
#include "models/models.h"
#include "costdb/costdb.h"

#define PLAN_SCHEMA "dhp.plan/1"
#define PLAN_SCHEMA_VERSION 1

typedef enum { PLAN_COLOCATED = 0, PLAN_DISAGGREGATED } plan_placement;
typedef enum { PLAN_RECOMP_NONE = 0, PLAN_RECOMP_SELECTIVE, PLAN_RECOMP_FULL } plan_recompute;
/* Mixed: bf16 weights + fp32 master/grad accumulation (Megatron-LM, DeepSpeed).
 * Autocast: fp32 weights and grads, bf16 compute (torch.autocast, as Ray's experiment).
 * Pure: everything bf16 (weights, grads, Adam moments).
 * FP32: everything fp32, activations too (the CPU executor). */
typedef enum { PLAN_OPT_MIXED_FP32 = 0, PLAN_OPT_PURE_BF16, PLAN_OPT_AUTOCAST, PLAN_OPT_FP32, PLAN_NPRECISION } plan_precision;
/* Bytes per parameter of each model state under a precision, and the bytes
 * an AdamW step moves per parameter. */
typedef struct { double param, grad, optim, step_traffic, act; } plan_state_bytes;
plan_state_bytes plan_precision_bytes(plan_precision p);
/* The same for one module: a frozen one holds bf16 weights only. */
plan_state_bytes plan_module_state_bytes(const model_module *mm, plan_precision p);
const char *plan_precision_name(plan_precision p);
int plan_precision_parse(const char *s, plan_precision *out);

/* What one training step processes. Sequence lengths per sample:
 * vision encoder sees images_per_sample * image_tokens patches; the LLM sees
 * images_per_sample * image_tokens / merge^2 (+ audio) + text_tokens. */
typedef struct {
    int global_batch;         /* samples per optimizer step */
    int images_per_sample;    /* 0 for no images */
    int image_tokens;         /* vision tokens (patches) per image, before the merger */
    int audio_frames;         /* audio encoder frames per sample (after the conv stem); 0 = none */
    int text_tokens;          /* text tokens per sample */
} plan_workload;

/* One module's strategy. Ranks of the module group are the contiguous global
 * ranks [first_rank, first_rank + n_ranks) with n_ranks = dp*tp*sp*pp, laid out
 *   local = ((pp_i * dp + dp_i) * sp + sp_i) * tp + tp_i     (tp fastest). */
typedef struct {
    char module[MODEL_NAME_LEN];
    int module_index;         /* index into model_t.mod */
    int pool;                 /* cluster pool index */
    int first_rank, n_ranks;
    int dp, tp, sp, pp;
    int zero;                 /* ZeRO stage 0..3 across the dp group */
    int micro_batch;          /* samples per micro-batch per dp rank */
    plan_recompute recompute;
    bool seq_parallel;        /* Megatron sequence parallelism on top of tp (LLM) */
} plan_module;

typedef struct {
    double step_time_s;       /* simulated where the schedule runs the plan (simulated), else analytic */
    double analytic_step_time_s;  /* plan_evaluate's closed form */
    bool simulated;
    double samples_per_s, vision_tokens_per_s, tokens_per_s;
    double mfu;
    double peak_mem_bytes[MODEL_MAX_MODULES];   /* per GPU of each module group */
    bool fits;
} plan_prediction;

typedef struct {
    int version;
    model_t model;            /* full description, so a plan is self-contained */
    cost_cluster cluster;
    plan_workload work;
    plan_placement placement;
    plan_precision precision;
    int world_size;           /* total ranks the plan uses */
    int n_micro;              /* micro-batches per step flowing between module groups */
    int n_modules;            /* one entry per model module, same order as model.mod */
    plan_module mod[MODEL_MAX_MODULES];
    plan_prediction pred;
    char label[64];           /* "dhp", "zero3", "tp", "homogeneous", ... */
} plan_t;

/* Plan file I/O (atomic write). plan_read validates against the model it
 * carries: degrees multiply to n_ranks, groups disjoint (disaggregated) or
 * identical (colocated), tp divides heads, sequence divisible by sp, etc. */
int plan_write(const char *path, const plan_t *p, char *err);
int plan_read(const char *path, plan_t *p, char *err);
cJSON *plan_to_json(const plan_t *p);
cJSON *plan_module_to_json(const plan_module *s);
int plan_from_json(const cJSON *root, const char *what, plan_t *p, char *err);
int plan_validate(const plan_t *p, char *err);
/* Rank of module k's first GPU counted from its pool's first rank (pools start on node boundaries). */
int plan_pool_offset(const plan_t *p, int k);
/* dp * tp * sp * pp of a module strategy, overflow-checked (false: it does
 * not fit in 64 bits; the degrees come from files and options). */
bool plan_module_ranks(const plan_module *s, int64_t *out);

/* ---- workload: sequence lengths each module sees ---- */
typedef struct {
    double samples_units;     /* units the module batches over per sample (images for vision) */
    double seq;               /* tokens per unit (per image, per audio clip, per LLM sample) */
    double tokens_per_sample; /* = samples_units * seq */
    double attn_span_full;    /* keys each query attends to in full layers (causal: (seq + 1) / 2) */
    double attn_span_window;  /* in window layers */
    double cross_span;        /* LLM cross-attention layers: encoder tokens per sample */
} plan_seq;
int plan_module_seq(const model_t *m, int module, const plan_workload *w, plan_seq *out);
/* Rows the LM head (logits, cross-entropy) runs over for `samples` samples
 * of the LLM's `tokens` local rows: with the fp32 executor, the rows that
 * predict a next text token (executor/model.c, count_predictions); under the
 * bf16 precisions, which describe Megatron-LM, every position. */
double plan_head_rows(const plan_workload *w, plan_precision pr, double samples, double tokens);
int plan_workload_validate(const model_t *m, const plan_workload *w, char *err);
/* Sets image_tokens from a square image side in pixels (patches before merge). */
int plan_image_tokens_from_pixels(const model_t *m, int pixels, int *tokens, char *err);

/* ---- memory model: bytes per GPU of one module group ---- */
typedef struct {
    double params, grads, optim;  /* model states after TP/PP split and ZeRO sharding */
    double zero_buffers;          /* ZeRO-3 gathered-layer buffers (prefetch) */
    double activations;           /* saved for backward, all micro-batches in flight */
    double logits;                /* LM head logits + vocab-parallel cross-entropy workspace */
    double comm;                  /* communication buffers */
    double reserved;              /* CUDA context, library workspaces (costdb) */
    double fragmentation;         /* allocator fragmentation allowance */
    double total, capacity;
} plan_mem;

/* Options shared by the memory and cost models. */
typedef struct {
    plan_precision precision;
    double fragmentation;         /* fraction of dynamic memory, default 0.10 */
    double overlap;               /* fraction of DP communication hidden behind backward, default 0.8 */
} plan_options;
void plan_options_default(plan_options *o);

/* Memory of module `mi` under strategy s on pool gpu g; `in_flight` = micro-batches whose
 * activations are alive at the peak (1 colocated; pipeline depth when disaggregated). */
void plan_module_memory(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                        const cost_gpu *g, const plan_options *o, int in_flight, plan_mem *out);
const char *plan_mem_dominant(const plan_mem *mm);
/* Parameters one GPU holds before ZeRO sharding (TP and PP split applied). */
double plan_local_params(const model_module *mm, const plan_module *s);

/* ---- cost model: seconds for one module group ---- */
typedef struct {
    double fwd_s, bwd_s, recompute_s;    /* compute per micro-batch (per dp rank) */
    double tp_comm_s, sp_comm_s;         /* per micro-batch, not overlapped */
    /* Blocking exchanges inside one micro-batch's forward / backward (TP
     * all-reduces, Ulysses all-to-alls, as the executor issues them): each
     * is a wait that can hand a shared processor to a set-mate. */
    int fwd_syncs, bwd_syncs;
    double zero_comm_s;                  /* ZeRO-3 param gathers + grad reduce-scatter per micro-batch, exposed */
    double pp_p2p_s;                     /* per micro-batch stage hand-offs */
    double micro_s;                      /* one micro-batch through the whole module (all pp stages) */
    double fwd_comm_s;                   /* the forward pass's part of tp + sp + zero + pp communication */
    double dp_comm_s, dp_exposed_s;      /* gradient reduction once per step, and its exposed part */
    double grad_rs_s, param_ag_s;        /* its reduce-scatter and all-gather halves (ZeRO-1), once per step */
    double optim_s;                      /* optimizer step */
    /* the global gradient norm's pass over this module's gradients on the
     * rank that sums the most (its ZeRO-1 shard, else all its local ones) */
    double norm_s;
    double model_flops;                  /* per step, 6*N*T + attention, no recompute */
} plan_time;

/* Time for one chunk of `chunk_samples` samples through module mi: the dp ranks
 * split it, each in micro-steps of s->micro_batch, with pp bubbles. */
double plan_chunk_time(const plan_time *t, const plan_module *s, int chunk_samples);
void plan_module_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                      const cost_cluster *c, const plan_options *o, plan_time *out);
/* The per-micro-batch terms of plan_time (fwd_s .. micro_s, fwd_comm_s) for a
 * micro-batch of `samples` samples instead of s->micro_batch; the per-step
 * terms stay 0. plan_module_time is this at s->micro_batch plus those. */
void plan_micro_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                     const cost_cluster *c, const plan_options *o, double samples, plan_time *out);
/* Seconds of the schedule's encoder FORWARD op (compute + forward half of its
 * in-op communication) and BACKWARD op (recompute + backward + the rest);
 * they add up to micro_s, the LLM's FORWARD_BACKWARD. */
double plan_time_forward_s(const plan_time *t);
double plan_time_backward_s(const plan_time *t);
/* Once per step after the last micro-batch: the exposed gradient reduction,
 * the gradient norm's local pass and the optimizer. */
double plan_time_tail_s(const plan_time *t);
/* Strategy feasibility independent of memory (divisibility, TP within a node, ...).
 * Returns UTIL_OK or UTIL_EINVAL with the reason. */
int plan_strategy_check(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                        const cost_cluster *c, char *err);

/* ---- whole-plan evaluation (the same cost model for the MILP result and baselines) ---- */
typedef struct {
    plan_mem mem[MODEL_MAX_MODULES];     /* per GPU of each module group */
    plan_time time[MODEL_MAX_MODULES];
    double module_step_s[MODEL_MAX_MODULES];
    double transfer_s;                   /* encoder -> LLM activation hand-off per step */
    double peak_mem;                     /* worst GPU: colocated sums the modules */
    double capacity;
} plan_eval;
int plan_evaluate(plan_t *p, const plan_options *o, plan_eval *ev, char *err);

/* ---- search: candidates priced analytically, a GLPK MILP chooses ---- */
typedef struct {
    int module;
    bool colocated;
    int pool, gpus;
    int samples_per_step;     /* colocated family key: dp * micro_batch (same for every module) */
    int n_micro;              /* disaggregated: chunks per step (same for every module) */
    plan_module s;
    double time;              /* colocated: module's whole step share; disaggregated: one chunk */
    double tail;              /* disaggregated: exposed DP communication + optimizer step */
    double mem;               /* colocated: bytes without the runtime reservation; else total */
} plan_candidate;

typedef struct {
    int n, cap;
    plan_candidate *c;
    int n_modules;
    int llm;                  /* index of the LLM module */
    double reserved[COST_MAX_POOLS], capacity[COST_MAX_POOLS];
    int pool_gpus[COST_MAX_POOLS];
    int n_pools;
} plan_candidates;
typedef struct {
    plan_options opt;
    int top_k;                /* alternatives to report besides the best */
    bool allow_colocated, allow_disaggregated;
    int max_pp;               /* 0 = default 8 */
    double time_limit_s;      /* per MILP solve */
    bool exhaustive;          /* enumerate combinations instead of the MILP (small cases only) */
    bool verbose;
} plan_search_options;
void plan_search_options_default(plan_search_options *o);

int plan_candidates_build(const model_t *m, const cost_cluster *c, const plan_workload *w,
                          const plan_search_options *o, plan_candidates *out, char *err);
void plan_candidates_free(plan_candidates *cs);
/* The MILP's objective for one candidate per module (chosen[k] indexes cs->c),
 * evaluated directly; returns false when the choice violates a constraint.
 * Used to check the MILP against brute force. */
bool plan_candidates_objective(const plan_candidates *cs, const int *chosen, double *objective);
/* Solves the MILP over cs; excluded holds n_excluded earlier solutions
 * (n_modules candidate indices each) to cut off. */
int plan_milp_solve(const plan_candidates *cs, const int *excluded, int n_excluded, double time_limit_s,
                    int *chosen, double *objective, int *n_vars, int *n_rows, char *err);
/* Enumerates every combination instead (the benchmark's baseline). */
int plan_exhaustive_solve(const plan_candidates *cs, double max_combos, int *chosen, double *objective, char *err);
/* Turns a candidate choice into a plan (ranks assigned) and evaluates it. */
int plan_from_candidates(const plan_candidates *cs, const int *chosen, const model_t *m, const cost_cluster *c,
                         const plan_workload *w, const plan_options *o, plan_t *p, char *err);

typedef struct {
    int n_plans;
    plan_t plans[16];          /* best first */
    int n_candidates;          /* candidates priced before the MILP */
    int n_milp_vars, n_milp_rows;
    int milp_solves;
    double search_s;
} plan_search_result;
int plan_search(const model_t *m, const cost_cluster *c, const plan_workload *w,
                const plan_search_options *o, plan_search_result *r, char *err);

/* ---- baselines, evaluated on the same cost model ---- */
typedef enum { PLAN_BASE_ZERO3 = 0, PLAN_BASE_TP, PLAN_BASE_HOMOGENEOUS, PLAN_BASE_SP_TP, PLAN_NBASE } plan_baseline;
/* Fills p with the baseline (best recompute / micro-batch that fits; if none fits,
 * the least-memory variant with pred.fits = false). Returns UTIL_OK, or
 * UTIL_EINFEASIBLE if the baseline cannot even be formed (e.g. TP not dividing heads). */
int plan_baseline_make(plan_baseline b, const model_t *m, const cost_cluster *c, const plan_workload *w,
                       const plan_options *o, plan_t *p, char *err);
const char *plan_baseline_name(plan_baseline b);

/* Builds a plan from explicit per-module strategies, e.g.
 * "vision:sp=8;llm:tp=8" (keys dp,tp,sp,pp,zero,mb,rc=none|selective|full,seqpar=0|1,pool=N;
 * absent dp = GPUs / (tp*sp*pp)); placement colocated uses all GPUs of pool 0 for every module. */
int plan_from_strategy(const char *spec, const model_t *m, const cost_cluster *c, const plan_workload *w,
                       plan_placement pl, int gpus, int n_micro, plan_t *p, char *err);
/* The same under explicit options (precision, fragmentation, overlap). */
int plan_from_strategy_opts(const char *spec, const model_t *m, const cost_cluster *c, const plan_workload *w,
                            plan_placement pl, int gpus, int n_micro, const plan_options *o, plan_t *p, char *err);

/* Fills names, n_ranks and ranks of p->mod[] from their degrees and pools,
 * then evaluates (pred filled). */
int plan_assemble(plan_t *p, const plan_options *o, char *err);
/* Empty plan for m on c with workload w (no strategies yet). */
void plan_init(plan_t *p, const model_t *m, const cost_cluster *c, const plan_workload *w, const plan_options *o);

/* ---- schedule: what every rank does in one step, in order ----
 * The executor runs it and the simulator prices it, from this one code, so
 * the two cannot drift. A step's global batch is cut into chunks that flow
 * encoder -> LLM: disaggregated, p->n_micro chunks of global_batch / n_micro
 * samples; colocated, chunks of the LLM's dp * micro_batch samples. Each
 * module's dp rank i takes samples [c0 + i*C/dp, c0 + (i+1)*C/dp) of chunk
 * [c0, c0 + C) (integer division, so uneven dp splits differ by one) and runs
 * them in micro-batches of micro_batch samples. An encoder keeps each
 * micro-batch's activations in a slot until its gradient returns.
 * Encoder ranks (1F1B): forward chunks 0..W-1 (W = 2 disaggregated with
 * n_micro > 1, else 1), then per chunk c: receive its gradient, backward,
 * forward chunk c + W. LLM ranks, per chunk: receive, forward+backward of each
 * micro-batch, send the gradient back. Colocated ranks interleave both roles
 * chunk by chunk. Every rank ends with gradient sync, the global gradient
 * norm and the optimizer. */
typedef enum {
    PLAN_OP_FORWARD = 0,      /* encoder forward of one micro-batch into `slot` */
    PLAN_OP_SEND_ACT,         /* encoder -> LLM: this rank's merged rows of chunk `chunk` */
    PLAN_OP_RECV_ACT,         /* LLM: every encoder's rows of its samples of chunk `chunk` */
    PLAN_OP_FORWARD_BACKWARD, /* LLM forward + backward of one micro-batch */
    PLAN_OP_SEND_GRAD,        /* LLM (tp rank 0) -> encoder: gradient of those rows */
    PLAN_OP_RECV_GRAD,
    PLAN_OP_BACKWARD,         /* encoder backward of one micro-batch from `slot` */
    PLAN_OP_GRAD_SYNC,        /* module's gradient all-reduce over dp x sp (ZeRO-1: reduce-scatter) */
    PLAN_OP_GRAD_NORM,        /* global gradient norm, all-reduce over every rank */
    PLAN_OP_OPTIMIZER,        /* module's AdamW (ZeRO-1: on its shard, then all-gather) */
    PLAN_NOPS
} plan_op_kind;

typedef struct {
    plan_op_kind kind;
    int module;               /* index in model.mod; -1 for PLAN_OP_GRAD_NORM */
    int chunk;                /* -1 for per-step ops */
    int sample0, samples;     /* this rank's samples of the step (compute ops, send/recv of its share) */
    int slot;                 /* encoder activation slot, -1 if none */
} plan_op;

typedef struct {
    int rank;
    int n, cap;
    plan_op *op;
    int slots;                /* encoder activation slots this rank needs */
} plan_schedule;

/* Chunks of one step and the samples of chunk c ([*first, *first + *count)). */
int plan_chunks(const plan_t *p);
void plan_chunk_range(const plan_t *p, int c, int *first, int *count);
/* Module k's dp rank dp_i's share of chunk c. */
void plan_chunk_share(const plan_t *p, int k, int c, int dp_i, int *first, int *count);
/* The largest share of any chunk over module k's dp ranks (sizes hand-off buffers). */
int plan_max_share(const plan_t *p, int k);
/* Position of a global rank in module k's group; false if the rank is not in it. */
typedef struct { int dp, tp, sp, pp; } plan_coord;
bool plan_rank_coord(const plan_t *p, int k, int rank, plan_coord *out);
int plan_coord_rank(const plan_t *p, int k, const plan_coord *c);
/* Merged encoder rows (LLM input rows) per sample of encoder k. */
int plan_rows_per_sample(const plan_t *p, int k);
/* Checks that the executor can run p as scheduled (sp slices whole merge
 * groups in every micro-batch, one LLM, pp == 1, ...); UTIL_EUNSUPPORTED or
 * UTIL_EINVAL with the reason. */
int plan_schedule_check(const plan_t *p, char *err);
int plan_schedule_rank(const plan_t *p, int rank, plan_schedule *s, char *err);
void plan_schedule_free(plan_schedule *s);
const char *plan_op_name(plan_op_kind k);

/* The encoder -> LLM hand-off of chunk c of encoder k as row segments: rows
 * [enc_off, enc_off + rows) of encoder rank enc_rank's packed chunk buffer
 * (its micro-batches' local merged rows, in order) go to rows [llm_off, ...)
 * of LLM rank llm_rank's chunk input (its samples' rows, in order). Every LLM
 * tp rank receives the rows; gradients go back from llm_tp == 0 only.
 * Segments are ordered by (enc_rank, llm_rank, enc_off): one message per
 * (enc_rank, llm_rank) pair is the concatenation of its segments.
 * Transfer ops name the encoder in plan_op.module; their message tags are
 * plan_handoff_tag(k, c, grad). *segs is freed with util_free. */
/* Encoder tp ranks hold the same rows: activations go from enc_tp == 0 to
 * every llm_tp; gradients from llm_tp == 0 to every enc_tp. */
typedef struct { int enc_rank, enc_tp, llm_rank, llm_tp, rows, enc_off, llm_off; } plan_segment;
int plan_handoff(const plan_t *p, int k, int c, plan_segment **segs, int *n, char *err);
int plan_handoff_tag(int k, int c, bool grad);
/* The next message rank sends (sending) or receives in direction grad among
 * segs[from..n): sets *first, *end (its segments are segs[*first..*end)),
 * *peer and *rows and returns true; false when there is none. */
bool plan_handoff_message(const plan_segment *segs, int n, int from, int rank, bool grad, bool sending,
                          int *first, int *end, int *peer, int *rows);

/* ---- simulator: one step of the schedule, op by op, priced by the cost model ----
 * Every rank walks its plan_schedule_rank list in order. Compute ops take
 * their cost-model time (plan_micro_time at the op's sample count, in-op
 * TP/SP communication included). SEND_* does not block: each message (one
 * per sender/receiver pair of the plan_handoff segments, rows * out_hidden *
 * activation bytes) travels for cost_p2p_time, after the previous message
 * between the same pair (one FIFO channel per pair; a rank's message to
 * itself is a local copy and costs nothing). RECV_* waits for every message
 * addressed to it. GRAD_SYNC (all-reduce, or ZeRO-1 reduce-scatter over the
 * module's dp x sp group), GRAD_NORM (the rank's sum of squares over the
 * gradients it counts, plan_time.norm_s, then an 8-byte all-reduce over the world) and a
 * ZeRO-1 OPTIMIZER (AdamW on the shard, then the parameter all-gather) are
 * collectives: they start when the last participant joins and end together.
 * No other resource is shared, so the result is exact for these rules. */
/* syncs: the blocking exchanges inside the compute part (plan_time.fwd_syncs);
 * on processors shared between ranks they set the rank's share
 * (cost_share_weight). */
typedef struct { double busy_s, comm_s; int syncs; } plan_sim_cost;
typedef struct {
    /* Replacements for the cost model, NULL for the cost model's own
     * (plan_sim_op_cost, plan_sim_msg_seconds). op_cost prices one op of a
     * rank: compute ops run busy then comm; for GRAD_SYNC, GRAD_NORM and a
     * ZeRO-1 OPTIMIZER busy is the rank's local work before it joins the
     * collective and comm the collective (the longest of its participants');
     * SEND/RECV ops are ignored (msg_seconds prices their messages, src != dst). */
    plan_sim_cost (*op_cost)(void *ctx, const plan_t *p, int rank, const plan_op *op);
    double (*msg_seconds)(void *ctx, const plan_t *p, int src, int dst, double bytes);
    void *ctx;
} plan_sim_hooks;

typedef struct {
    plan_op op;
    double start_s;           /* the rank reached it (its previous op ended) */
    double begin_s;           /* what it waited for was there: messages arrived, last participant joined */
    double end_s;
    double busy_s, comm_s;    /* inside [start_s, end_s]; the rest is idle */
    double bytes;             /* send / recv: bytes of its messages */
    int dep_rank, dep_op;     /* the op whose end decided begin_s (this rank's previous op unless it
                                 waited for a message or a collective); -1 for none */
} plan_sim_op;

/* Peak bytes of one rank per category, from the memory model (colocated ranks
 * sum their modules, the runtime reservation once). activations: saved for
 * backward in `slots` live encoder slots (1 per LLM micro-batch); logits: LM
 * head and cross-entropy; other: ZeRO-3 buffers, reservation, fragmentation. */
typedef struct {
    double params, grads, optim, activations, logits, comm, other, total, capacity;
    int slots;
} plan_sim_mem;

typedef struct {
    int n_ops;
    plan_sim_op *ops;         /* the rank's schedule, timed */
    double end_s;             /* its last op's end */
    double busy_s, comm_s, idle_s;   /* idle counts up to the step end */
    plan_sim_mem mem;
} plan_sim_rank;

typedef struct { int rank, op; } plan_sim_ref;

typedef struct {
    double step_time_s;       /* the last op's end over all ranks */
    int world_size;
    plan_sim_rank *rank;
    int n_path;
    plan_sim_ref *path;       /* critical path, first op first: each op's begin is its predecessor's end */
} plan_sim_result;

/* The simulator's size for p (planner/bounds.c), estimated before anything
 * is built: ops of every rank's schedule, and the elementary steps of
 * building and walking them. plan_sim_run refuses a plan above the limits
 * (one line with the sizes) instead of running out of memory or time. */
#define PLAN_SIM_MAX_OPS (1 << 23)
#define PLAN_SIM_MAX_WORK (1 << 30)
void plan_sim_size(const plan_t *p, double *ops, double *work);
int plan_sim_check_size(const plan_t *p, char *err);
/* Simulates one step of p (plan_schedule_check must accept it); hooks may be NULL.
 * Free r with plan_sim_free (also after a failure). */
int plan_sim_run(const plan_t *p, const plan_sim_hooks *hooks, plan_sim_result *r, char *err);
void plan_sim_free(plan_sim_result *r);
/* The cost model's price of one op of a rank, and of one message. */
plan_sim_cost plan_sim_op_cost(const plan_t *p, int rank, const plan_op *op);
double plan_sim_msg_seconds(const plan_t *p, int src, int dst, double bytes);
/* Simulates p and makes the simulated step its prediction (pred.step_time_s
 * and the rates; pred.analytic_step_time_s keeps plan_evaluate's, pred.simulated
 * is set). Returns the schedule's refusal (pred untouched) for plans it does not run. */
int plan_sim_predict(plan_t *p, char *err);
/* Memory of one rank with its schedule's activation slots. */
int plan_sim_memory(const plan_t *p, int rank, plan_sim_mem *out, char *err);
/* {"step_time_s", "ranks": [{rank, busy_s, comm_s, idle_s, memory}], "critical_path": [...]} */
cJSON *plan_sim_to_json(const plan_t *p, const plan_sim_result *r);
/* "forward vision c1 s4+2" style name of a simulated op, for traces and listings. */
void plan_sim_op_label(const plan_t *p, const plan_op *op, char *buf, size_t n);

/* ---- traces in the Chrome trace event format (chrome://tracing, Perfetto) ----
 * A JSON array of complete events {"name", "ph": "X", "ts", "dur" (us), "pid":
 * rank, "tid": lane, "args"} plus process_name / thread_name metadata; the
 * simulator and the executor write the same events. */
typedef enum { PLAN_TRACE_COMPUTE = 0, PLAN_TRACE_COMM, PLAN_TRACE_NLANES } plan_trace_lane;
typedef struct {
    int rank;
    plan_trace_lane lane;
    char name[64];
    double start_s, end_s;
    int chunk, samples;       /* args; -1 leaves them out */
    double bytes;             /* args; < 0 leaves it out */
} plan_trace_event;
/* Compute ops (forward, backward, optimizer) on the compute lane, the rest on the comm lane. */
plan_trace_lane plan_op_lane(plan_op_kind k);
/* Writes n events atomically; process r is named names[r] ("rank r" if names or names[r] is NULL). */
int plan_trace_write(const char *path, const plan_trace_event *ev, int n, int world_size,
                     const char *const *names, char *err);
/* The simulated step as a trace: one event per op, compute ops on the compute
 * lane, hand-offs and collectives on the comm lane. */
int plan_sim_write_trace(const char *path, const plan_t *p, const plan_sim_result *r, char *err);

const char *plan_placement_name(plan_placement p);
const char *plan_recompute_name(plan_recompute r);

#endif
