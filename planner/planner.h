/* planner: memory model, cost model, the GLPK mixed-integer search over
 * per-module strategies and placements, the baselines, and the plan file.
 *
 * Layering: util < models < costdb < planner < executor < profile < cli. The plan
 * types below are the contract between planner and executor. */
#ifndef DHP_PLANNER_H
#define DHP_PLANNER_H

#include <stdbool.h>
#include "util/util.h"
#include "models/models.h"
#include "costdb/costdb.h"
#include "planner/backend.h"

#define PLAN_SCHEMA "dhp.plan/1"
#define PLAN_SCHEMA_VERSION 1

typedef enum { PLAN_COLOCATED = 0, PLAN_DISAGGREGATED } plan_placement;
/* OP: torchtitan's per-op selective checkpointing (priced by the Megatron
 * target only; dhp run refuses it): every block keeps its input, the
 * attention's output and every second matmul's output, and re-runs the rest
 * (pytorch/torchtitan, torchtitan/parallelisms/parallelize_llama.py,
 * _save_list: "Saves output of all compute ops, except every second mm"). */
typedef enum { PLAN_RECOMP_NONE = 0, PLAN_RECOMP_SELECTIVE, PLAN_RECOMP_FULL, PLAN_RECOMP_OP } plan_recompute;
/* Mixed: bf16 weights + fp32 master/grad accumulation (Megatron-LM, DeepSpeed).
 * Autocast: fp32 weights and grads, bf16 compute (torch.autocast, as Ray's experiment).
 * Pure: everything bf16 (weights, grads, Adam moments).
 * FP32: everything fp32, activations too (the CPU executor). */
typedef enum { PLAN_OPT_MIXED_FP32 = 0, PLAN_OPT_PURE_BF16, PLAN_OPT_AUTOCAST, PLAN_OPT_FP32, PLAN_NPRECISION } plan_precision;
/* What the plan's memory and time describe: Megatron-LM / DeepSpeed as
 * published (their formulas for model states, activations and buffers), or
 * dhp's own executor (`dhp run`: the buffers it allocates, the kernels and
 * collectives it issues, exactly). */
typedef enum { PLAN_TARGET_MEGATRON = 0, PLAN_TARGET_DHP, PLAN_NTARGET } plan_target;
const char *plan_target_name(plan_target t);
int plan_target_parse(const char *s, plan_target *out, char *err);
/* The target a precision implies when none is given: dhp (what dhp run runs)
 * where dhp run runs the precision, else megatron (planner/precision.c). */
plan_target plan_target_default(plan_precision p);
/* Bytes per parameter of each model state under a precision, and the bytes
 * an AdamW step moves per parameter. */
/* Bytes per element: parameter, gradient, optimizer states, the AdamW
 * step's traffic, an activation, and what a gradient reduction sends (the
 * data-parallel all-reduce / reduce-scatter, the tied embedding's
 * all-reduce; plan_module_state_bytes: the gradient's own dtype unless
 * plan_options.grad_reduce says bf16). */
typedef struct { double param, grad, optim, step_traffic, act, reduce; } plan_state_bytes;
plan_state_bytes plan_precision_bytes(plan_precision p);
const char *plan_precision_name(plan_precision p);
int plan_precision_parse(const char *s, plan_precision *out, char *err);

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

/* Pipeline stages of a module: at most PLAN_MAX_PP. */
#define PLAN_MAX_PP 64
/* Model chunks per pipeline rank (interleaved stages): at most PLAN_MAX_VP. */
#define PLAN_MAX_VP 32

/* How a module's sp ranks attend across the sequence (plan_cp_of, below). */
typedef enum { PLAN_CP_NONE = 0, PLAN_CP_ULYSSES, PLAN_CP_RING } plan_cp;

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
    /* Under full recomputation, the blocks of each model chunk (a stage's
     * blocks, or each of its interleaved chunks) that recompute: the first
     * recompute_layers, the others keeping every activation (Megatron-LM's
     * --recompute-method block --recompute-num-layers N: "recompute the input
     * activations of only a set number of individual Transformer layers per
     * pipeline stage"); 0: all of them. plan_block_recompute owns the rule. */
    int recompute_layers;
    bool seq_parallel;        /* Megatron sequence parallelism on top of tp (LLM) */
    int stage_layers[PLAN_MAX_PP];  /* blocks of each pipeline stage; all 0: plan_stage_of's split */
    /* The embedding and the head count as a block each in the even split
     * (plan_stage_of; Megatron-Core's account_for_embedding/loss_in_pipeline_split). */
    bool split_ends;
    /* Interleaved pipeline: model chunks per pp rank (Megatron-LM's virtual
     * pipeline stages, Narayanan et al. SC'21 sec. 2.2.2); 0 or 1 = none. */
    int vp;
    /* The LLM's context parallelism as asked (--strategy cp=, plan file
     * "cp"): PLAN_CP_ULYSSES or PLAN_CP_RING; PLAN_CP_NONE: plan_cp_of's
     * default (Ulysses where tp * sp divides the heads, else ring). */
    plan_cp cp;
} plan_module;
/* The virtual stages of s (1 when unset). */
static inline int plan_vp(const plan_module *s) { return s->vp > 1 ? s->vp : 1; }

/* Stage i (0 .. pp - 1) of a module's pipeline: blocks [first, first +
 * count), the stem (embedding) on the first stage and the head on the last.
 * The split is s->stage_layers where given, else as even as the layers
 * allow with the first and the last stage a block short where pp does not
 * divide them, as Llama 3 was trained (they carry the embedding and the
 * head: 126 layers over 16 stages are 7 + 14 x 8 + 7). pp = 1: the whole
 * module. Interleaved (vp > 1), each stage's blocks are vp chunks as even as
 * its count allows, the first chunks a block longer where vp does not
 * divide it. s->split_ends: the L + 2 blocks, the embedding and the head
 * counted as one each, split evenly over the pp vp virtual stages, so the
 * first chunk of stage 0 and the last of stage pp - 1 hold a block fewer
 * (with one block a chunk, the embedding alone and the head alone). */
typedef struct {
    int first, count;
    bool stem, head;
    /* Interleaved (s->vp > 1): the count blocks are `chunks` model chunks,
     * chunk v the chunk_count[v] blocks from chunk_first[v] (rank stage i
     * holds virtual stages i, i + pp, ...; Narayanan et al. SC'21 sec.
     * 2.2.2); first is chunk 0's. 0 or 1: one contiguous range. */
    int chunks;
    int chunk_first[PLAN_MAX_VP], chunk_count[PLAN_MAX_VP];
} plan_stage;
plan_stage plan_stage_of(const model_module *mm, const plan_module *s, int i);
/* Whether s gives its split block by block (any stage_layers entry set). */
bool plan_stage_layers_given(const plan_module *s);
/* Whether s's split is one: at most PLAN_MAX_PP stages of at least one block
 * each, holding the module's blocks, and under interleaving (vp > 1, pp > 1,
 * at most PLAN_MAX_VP) vp chunks of a block or more a stage (under
 * split_ends the first and the last chunk may hold the embedding or the head
 * alone; the layers + 2 divide by pp vp, and no stage_layers beside it).
 * UTIL_EINVAL naming the rule. */
int plan_stage_split_check(const model_module *mm, const plan_module *s, char *err);
/* The j-th block (0 <= j < st->count) a stage holds. */
int plan_stage_block(const plan_stage *st, int j);
/* Model chunk v of a stage: one contiguous range, the stem on the first
 * chunk of a stem stage, the head on the last chunk of a head stage. */
plan_stage plan_stage_chunk(const plan_stage *st, int v);
/* Virtual stage g (0 .. pp * vp - 1) of the module's pipeline: chunk g / pp
 * of rank stage g % pp; with vp = 1 plan_stage_of(g). */
plan_stage plan_vstage_of(const model_module *mm, const plan_module *s, int g);

/* What block `layer` of stage (or model chunk) st recomputes:
 * s->recompute, except that under full recomputation with
 * s->recompute_layers set only the first recompute_layers blocks of each of
 * st's chunks recompute and the others keep everything (none). The one owner
 * of which blocks recompute: the activation layout, the prices, the memory
 * formulas and the executor ask it. */
plan_recompute plan_block_recompute(const plan_module *s, const plan_stage *st, int layer);
/* How many of stage st's blocks recompute fully (plan_block_recompute). */
int plan_stage_recomputed_blocks(const plan_module *s, const plan_stage *st);
/* The blocks of s's longest model chunk (virtual stage): recompute_layers
 * of that many or more recompute every block, as full recomputation does. */
int plan_longest_chunk(const model_module *mm, const plan_module *s);

/* A rank's position in a module group (see plan_module). */
typedef struct { int dp, tp, sp, pp; } plan_coord;

typedef struct {
    double step_time_s;       /* simulated where the schedule runs the plan (simulated), else analytic */
    double analytic_step_time_s;  /* plan_evaluate's closed form */
    bool simulated;
    double samples_per_s, vision_tokens_per_s, tokens_per_s;
    double mfu;
    double model_flops;       /* one step's model FLOPs, all modules (mfu's numerator) */
    double peak_mem_bytes[MODEL_MAX_MODULES];   /* per GPU of each module group */
    bool fits;
} plan_prediction;

#include "planner/framework.h"   /* the Megatron target's framework options: plan_zero3 ... plan_grad_accum */

typedef struct {
    int version;
    model_t model;            /* full description, so a plan is self-contained */
    cost_cluster cluster;
    plan_workload work;
    plan_placement placement;
    plan_precision precision;
    plan_target target;
    plan_zero3 zero3;         /* the Megatron target's ZeRO-3 (plan_options.zero3) */
    plan_adamw adamw;         /* the Megatron target's AdamW step (plan_options.adamw) */
    plan_optim_dtype optim_dtype;   /* the Megatron target's AdamW states (plan_options.optim_dtype) */
    plan_grad_reduce grad_reduce;   /* the Megatron target's gradient reduction (plan_options.grad_reduce) */
    plan_tp_style tp_style;   /* the Megatron target's tensor parallelism (plan_options.tp_style) */
    plan_pipe_engine pipe_engine;   /* the Megatron target's pipeline engine (plan_options.pipe_engine) */
    plan_grad_accum grad_accum;     /* the Megatron target's gradient accumulation (plan_options.grad_accum) */
    plan_fp8 fp8;             /* the Megatron target's FP8 linears (plan_options.fp8) */
    bool tp_comm_overlap;     /* the Megatron target's TP communication overlap (plan_options.tp_comm_overlap) */
    plan_loss loss;           /* the Megatron target's cross-entropy (plan_options.loss) */
    plan_attention attention; /* the Megatron target's attention kernel (plan_options.attention) */
    bool tf32;                /* fp32 GEMMs on TF32 tensor cores (plan_options.tf32) */
    plan_backend backend;     /* the backend memory is predicted for (plan_options.backend; not in the file) */
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
/* Where a rank runs (planner/placement.c): pool, node in the pool, GPU in the
 * node, and host = the node's index over the cluster (pools in order). */
typedef struct { int pool, node, gpu, host; } plan_place;
int plan_rank_place(const plan_t *p, int rank, plan_place *out, char *err);
int plan_cluster_nodes(const plan_t *p);

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
/* Of `rows` rows an encoder's blocks run on, the rows it hands on: the class
 * rows dropped (CLIP in LLaVA: vision_feature_select_strategy "default"),
 * merged m x m and pooled (q: plan_module_seq's). */
double plan_encoder_out_rows(const model_module *mm, const plan_seq *q, double rows);
/* Rows encoder k gives one sample's LLM sequence (merged image tokens,
 * pooled audio frames; 0 for the LLM or an encoder the samples carry no
 * input for), and their integer count. */
double plan_encoder_tokens(const model_t *m, const plan_workload *w, int k);
int plan_encoder_rows(const model_t *m, const plan_workload *w, int k);
/* Where encoder k's rows start in a sample's LLM sequence, given the rows
 * each module gives that sample (rows[j]; the LLM's entry is ignored): the
 * encoders in module order, then the text. k = m->n_modules: all the
 * encoders' rows, where the text starts. The executor's LLM stem and loss,
 * the hand-off and the simulator all place rows by it. */
int plan_sample_offset(const model_t *m, const int *rows, int k);
/* Rows the LM head (logits, cross-entropy) runs over for `samples` samples
 * of the LLM's `tokens` local rows: with the fp32 executor, the rows that
 * predict a next text token (executor/model.c, count_predictions); for the
 * Megatron target, every position. */
double plan_head_rows(const plan_workload *w, plan_target t, double samples, double tokens);
int plan_workload_validate(const model_t *m, const plan_workload *w, char *err);
/* Sets image_tokens from a square image side in pixels (patches before merge). */
int plan_image_tokens_from_pixels(const model_t *m, int pixels, int *tokens, char *err);

/* ---- memory model: bytes per GPU of one module group ---- */
typedef struct {
    double params, grads, optim;  /* model states after TP/PP split and ZeRO sharding */
    double zero_buffers;          /* ZeRO-3 gathered units (prefetch), ZeRO-2/3 gradient buckets */
    double activations;           /* saved for backward, all micro-batches in flight */
    /* Of params + grads + optim and of activations: the transformer blocks' own, without the
     * embedding, head and final norm and what they save (Korthikanti et al.'s per-layer terms) */
    double block_states, block_acts;
    double logits;                /* LM head logits + vocab-parallel cross-entropy workspace */
    double comm;                  /* communication buffers */
    double reserved;              /* CUDA context, library workspaces (costdb) */
    double workspace;             /* the backend's own workspaces (plan_backend_workspace_bytes) */
    double fragmentation;         /* allocator fragmentation allowance */
    double total, capacity;
    int stage;                    /* the pipeline stage these are (plan_module_memory: the busiest; 0 when pp = 1) */
} plan_mem;

/* Options shared by the memory and cost models. */
typedef struct {
    plan_precision precision;
    plan_target target;
    plan_zero3 zero3;
    plan_adamw adamw;
    plan_optim_dtype optim_dtype; /* the Megatron target's AdamW states' dtype (plan_optim_dtype_check) */
    plan_grad_reduce grad_reduce; /* the Megatron target's gradient reduction dtype (plan_grad_reduce_check) */
    plan_tp_style tp_style;       /* the Megatron target's tensor parallelism (plan_tp_style_check) */
    plan_pipe_engine pipe_engine; /* the Megatron target's pipeline engine (plan_pipe_engine_check) */
    plan_grad_accum grad_accum;   /* the Megatron target's gradient accumulation (plan_grad_accum_check) */
    plan_fp8 fp8;                 /* the Megatron target's FP8 linears (plan_fp8_check) */
    /* TransformerEngine's userbuffers overlap of the blocks' sequence-parallel
     * collectives with their GEMMs (Megatron-LM --tp-comm-overlap;
     * plan_tp_overlaps says where it applies; plan_tp_comm_overlap_check) */
    bool tp_comm_overlap;
    plan_loss loss;               /* the Megatron target's cross-entropy (plan_loss_check; plan_loss_props_of) */
    plan_attention attention;     /* the Megatron target's attention kernel (plan_attention_check) */
    bool tf32;                    /* precision fp32's GEMMs on TF32 tensor cores (dhp run --tf32; plan_tf32_check) */
    plan_backend backend;         /* the backend memory is predicted for (--backend; default the device's) */
    double fragmentation;         /* fraction of dynamic memory, default 0.10 */
    double overlap;               /* fraction of DP communication hidden behind backward, default 0.8 */
} plan_options;
void plan_options_default(plan_options *o);
/* The same for one module under options o: a frozen one holds its weights
 * only, in bf16 for the Megatron target (frozen towers are kept in the
 * compute dtype), in the precision's weight dtype for dhp's executor. */
plan_state_bytes plan_module_state_bytes(const model_module *mm, const plan_options *o);
/* The options a plan was made under: its precision and target, default allowances. */
plan_options plan_options_of(const plan_t *p);

/* What dhp run runs (planner/precision.c, the one owner): plans of target
 * dhp in fp32, bf16-mixed or bf16-autocast, with every ZeRO stage; else one
 * line naming what it runs. */
int plan_run_check(const plan_t *p, char *err);
/* The executor runs its linears in bf16 under these options (target dhp, precision bf16-mixed or -autocast). */
bool plan_runs_bf16(const plan_options *o);
/* Whether dhp run's activation collectives (tensor/sequence parallel,
 * Ulysses) move bf16 (else fp32), and the bytes per element the cost model
 * prices them at (the Megatron target: its precision's activation bytes). */
bool plan_act_wire_bf16(const plan_options *o);
double plan_act_wire_bytes(const plan_options *o);
const char *plan_backend_name(plan_backend b);
int plan_backend_parse(const char *s, plan_backend *out, char *err);
/* Bytes the backend allocates once per process beside the layout's
 * buffers, under the dhp target: the CUDA backend's own buffers, its
 * cuBLASLt workspace among them (PLAN_CUDA_WORKSPACE_BYTES); the CPU
 * backend's none. The Megatron target's workspace is in reserved. */
double plan_backend_workspace_bytes(const plan_options *o, const cost_gpu *g);
/* The device memory no tensor can use: g's reserved_bytes, less under the
 * dhp target the framework's library workspace it holds
 * (reserved_workspace_bytes), which dhp does not run: its backend's own
 * is plan_backend_workspace_bytes. Each workspace is counted once. */
double plan_reserved_bytes(const plan_options *o, const cost_gpu *g);
/* b, or where b is PLAN_BACKEND_DEVICE the backend device g runs. */
plan_backend plan_backend_on(plan_backend b, const cost_gpu *g);
/* The backend p's memory is predicted for, resolved on its first pool's device (what dhp memory and
 * dhp simulate name). */
plan_backend plan_backend_of(const plan_t *p);
/* What a rank holds once whatever modules it holds: the reservation and the backend's workspaces. */
static inline double plan_mem_once(const plan_mem *m) { return m->reserved + m->workspace; }
/* tf32 asks for TF32 tensor cores on fp32 GEMMs: one line unless the precision is fp32. */
int plan_tf32_check(const plan_options *o, char *err);
/* UTIL_EINVAL where o reduces gradients in bf16 under the dhp target (dhp run reduces in fp32). */
int plan_grad_reduce_check(const plan_options *o, char *err);
/* --optim-dtype bf16 describes a plan exported to Apex's DistributedFusedAdam (NeMo): the Megatron target under
 * bf16-mixed only. */
int plan_optim_dtype_check(const plan_options *o, char *err);
/* --tp-style dtensor describes a plan exported to PyTorch (torchtitan): the Megatron target only. */
int plan_tp_style_check(const plan_options *o, char *err);
/* --pipe-engine deepspeed* describes a plan exported to DeepSpeed's PipelineEngine: the Megatron target only. */
int plan_pipe_engine_check(const plan_options *o, char *err);
/* --grad-accum add / bf16-optimizer describe a plan exported to PyTorch autograd or DeepSpeed: the Megatron target only. */
int plan_grad_accum_check(const plan_options *o, char *err);
/* --fp8 describes a plan exported to TransformerEngine or torchao: the Megatron target only, over a bf16
 * precision, on GPUs with FP8 tensor cores (every pool of c; c NULL: not checked). */
int plan_fp8_check(const plan_options *o, const cost_cluster *c, char *err);
/* --tp-comm-overlap describes a plan exported to Megatron-LM with TransformerEngine's userbuffers (or, under
 * --tp-style dtensor, to torchtitan with async TP): the Megatron target only. */
int plan_tp_comm_overlap_check(const plan_options *o, char *err);
/* Whether module mm under s overlaps its blocks' tensor-parallel collectives with their GEMMs: --tp-comm-overlap
 * where the module runs sequence parallelism over tp > 1 ranks (Megatron-LM asserts sequence_parallel with
 * tp_comm_overlap; Megatron-Bridge turns the overlap off where tp < 2 or sequence_parallel is off). */
bool plan_tp_overlaps(const model_module *mm, const plan_module *s, const plan_options *o);
/* --attention cudnn describes a plan exported to TransformerEngine's (or llm.c's) cuDNN attention: the Megatron
 * target only, on GPUs whose file prices it (every pool of c; c NULL: not checked). */
int plan_attention_check(const plan_options *o, const cost_cluster *c, char *err);
/* Every option check above that needs no cluster, in one pass (the CLI's and the plan file's):
 * UTIL_OK, or the first failing one's code with err filled and *key (NULL: not wanted) its
 * plan-file key. */
int plan_options_check(const plan_options *o, const char **key, char *err);
/* The checks that need the cluster's GPUs (FP8 tensor cores, a cuDNN attention figure) against every pool of c. */
int plan_options_pool_check(const plan_options *o, const cost_cluster *c, char *err);
/* --loss describes a plan exported to another trainer's loss: the Megatron target only. */
int plan_loss_check(const plan_options *o, char *err);
/* The plan's cross-entropy (plan_loss, auto resolved by the precision) and what it holds and computes. */
plan_loss plan_loss_of(const plan_options *o);
const plan_loss_props *plan_loss_props_of(const plan_options *o);
/* The math the cost model prices a linear's GEMMs in (cost_gemm_time_in). */
cost_gemm_math plan_gemm_math(const plan_options *o);
/* The math of the transformer blocks' linears: COST_MATH_FP8 under --fp8, else plan_gemm_math. */
cost_gemm_math plan_block_gemm_math(const plan_options *o);
/* Under TransformerEngine's primary FP8 weights, the step's transposes of the blocks' FP8 weights (planner/cost.c); else 0. */
double plan_fp8_weight_cast_s(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o);
/* The attention kernel the cost model prices (cost_attention_*_time_in): the
 * dhp target's bf16 or fp32 kernel as the precision runs it, Megatron's FlashAttention. */
cost_attn_kernel plan_attention_kernel(const plan_options *o);
/* Bytes per local parameter of the executor's bf16 working copy of the weights (0 without one: fp32, autocast). */
double plan_weight_copy_bytes(const model_module *mm, const plan_options *o);
/* bf16-autocast, and bf16-mixed under ZeRO-3 (planner/precision_zero3.c): bf16 elements of the
 * staging a linear rounds its weight into, the largest weight tensor rank stage `stage` holds; 0 otherwise. */
double plan_weight_cast_elems(const model_module *mm, const plan_module *s, int stage, const plan_options *o);


/* Memory of module `mi` under strategy s on pool gpu g, its worst pipeline
 * stage (each priced apart, plan_stage_memory); `in_flight` = micro-batches whose
 * activations are alive at the peak (1 colocated; pipeline depth when disaggregated). */
void plan_module_memory(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                        const cost_gpu *g, const plan_options *o, int in_flight, plan_mem *out);
/* Units (micro-batch x model chunk; micro-batches without interleaving) the
 * Megatron target's pipeline stage i holds in flight at its peak over the
 * step's micro-batches: min(pp - i, micro-batches) under 1F1B, the
 * interleaved schedule's warm-up and one (plan_pipeline_peak_units). */
int plan_stage_units_in_flight(const plan_module *s, const plan_workload *w, int i);
/* As plan_module_memory, of pipeline stage `stage` of the module (0 when pp = 1). */
void plan_stage_memory(const model_t *m, int mi, const plan_module *s, int stage, const plan_workload *w,
                       const cost_gpu *g, const plan_options *o, int in_flight, plan_mem *out);
/* The same with vslots[v] activation slots of each model chunk v (0 .. vp - 1;
 * plan_schedule.vslots): the dhp target's exact count for interleaved stages. */
void plan_stage_memory_slots(const model_t *m, int mi, const plan_module *s, int stage, const plan_workload *w,
                             const cost_gpu *g, const plan_options *o, const int *vslots, plan_mem *out);
/* Buffers of rank stage `stage`'s pipeline edges (executor/run_stage.c): a
 * send buffer per model chunk with a next virtual stage and, where the
 * module runs a backward, per chunk with a previous one; a receive buffer
 * each way used. */
int plan_stage_edge_buffers(const plan_module *s, int stage, bool backward);
const char *plan_mem_dominant(const plan_mem *mm);
/* Parameters one GPU holds before ZeRO sharding (TP and PP split applied). */
double plan_local_params(const model_module *mm, const plan_module *s);
double plan_local_block_params(const model_module *mm, const plan_module *s);
/* One tp rank's parameters of stage st (plan_stage_of, plan_vstage_of): its
 * blocks, and its ends: the embedding on the stage that takes the input
 * (stem), the head and a tied LLM's copy of the word embedding on the one
 * that ends the module (head), when that is not the first.
 * plan_stage_block_params: the blocks alone. */
double plan_stage_params(const model_module *mm, const plan_module *s, const plan_stage *st);
double plan_stage_block_params(const model_module *mm, const plan_module *s, const plan_stage *st);

/* ---- cost model: seconds for one module group ---- */
/* One micro-batch on the pipeline stage that paces the module (the whole
 * module when pp = 1), by what the seconds go to; they add up to
 * plan_time.stage_max_s. Compute: the GEMMs, the attention cores (flash,
 * unfused or ring), and the rest (element-wise kernels, copies, memory
 * passes); the backward's recomputed forward; the exchanges compute does not
 * hide: TP collectives, SP's (Ulysses, ring), ZeRO units', stage hand-offs. */
typedef struct {
    double gemm_s, attn_s, other_s, recompute_s;
    double tp_comm_s, sp_comm_s, zero_comm_s, hop_s;
} plan_micro_parts;

typedef struct {
    double fwd_s, bwd_s, recompute_s;    /* compute per micro-batch (per dp rank) */
    double tp_comm_s, sp_comm_s;         /* per micro-batch, not overlapped (recomputed forwards included) */
    /* Blocking exchanges inside one micro-batch's forward / backward (TP
     * collectives, Ulysses all-to-alls, ZeRO unit gathers and reductions, as
     * the executor issues them): each is a wait that can hand a shared
     * processor to a set-mate. */
    int fwd_syncs, bwd_syncs;
    /* ZeRO-2/3 per micro-batch: the units' weight gathers and gradient
     * reduce-scatters (plan_dp_rules), the part compute does not hide */
    double zero_comm_s;
    double pp_p2p_s;                     /* per micro-batch stage hand-offs */
    double micro_s;                      /* one micro-batch through the whole module (all pp stages) */
    double stage_max_s;                  /* the busiest pipeline stage's share of micro_s, with its hops */
    plan_micro_parts pace;               /* stage_max_s by what it goes to */
    /* A pipeline's fill and drain, per stage it crosses: the mean of the
     * stages other than the pacing one, each with its hops (the 1F1B step is
     * the pacing stage's m passes plus the others' one each); stage_max_s
     * where the stages are even, 0 without a pipeline. */
    double fill_s;
    double fwd_comm_s;                   /* the forward pass's part of tp + sp + zero + pp communication */
    /* Once per step: the GRAD_SYNC op (all-reduce, or ZeRO-1's unit
     * reduce-scatters), the PARAM_GATHER op (ZeRO-1/2's unit all-gathers),
     * each with the local copies around it (*_busy_s); their part not hidden
     * behind the last backward in the closed form (dp_exposed_s). */
    double grad_sync_s, grad_sync_busy_s, param_gather_s, param_gather_busy_s, dp_exposed_s;
    double optim_s;                      /* optimizer step */
    /* the global gradient norm's pass over this module's gradients on the
     * rank that sums the most (its ZeRO shard, else all its local ones) */
    double norm_s;
    double model_flops;                  /* per step, 6*N*T + attention, no recompute */
} plan_time;

/* Time for one chunk of `chunk_samples` samples through module mi: the dp ranks
 * split it, each in micro-steps of s->micro_batch, with pp bubbles:
 * (*micros + *bubbles) passes of the pacing stage (plan_chunk_units), each
 * plan_pace_s (micro_s, or stage_max_s under a pipeline). */
double plan_chunk_time(const plan_time *t, const plan_module *s, int chunk_samples);
void plan_chunk_units(const plan_time *t, const plan_module *s, int chunk_samples, double *micros, double *bubbles);
double plan_pace_s(const plan_time *t, const plan_module *s);
/* The share of a pacing-stage pass that a chunk's short last micro-batch
 * saves: where micro_batch does not divide the busiest replica's share, its
 * last micro-batch runs the rest (plan_micro_range), priced at its own
 * samples (plan_micro_time); 0 where it divides. t: module k's plan_time. */
double plan_short_micro_saving(const model_t *m, int k, const plan_module *s, const plan_workload *w,
                               const cost_cluster *c, const plan_options *o, const plan_time *t, int chunk_samples);
/* Does module k of m feed the LLM its rows in workload w (an encoder whose
 * inputs the samples carry)? */
bool plan_feeds_llm(const model_t *m, const plan_workload *w, int k);
/* Whether a colocated plan runs the LLM's pipeline over the whole batch at
 * once (Megatron-LM's 1F1B, Narayanan et al. SC'21 sec. 2.2) rather than
 * chunk by chunk in turn with its encoders: when no encoder feeds it (a
 * text-only workload or model). The schedule and the cost model both ask. */
bool plan_whole_batch_pipeline(const model_t *m, const plan_workload *w);
void plan_module_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                      const cost_cluster *c, const plan_options *o, plan_time *out);
/* The per-micro-batch terms of plan_time (fwd_s .. micro_s, fwd_comm_s) for a
 * micro-batch of `samples` samples instead of s->micro_batch; the per-step
 * terms stay 0. plan_module_time is this at s->micro_batch plus those. */
void plan_micro_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                     const cost_cluster *c, const plan_options *o, double samples, plan_time *out);
/* The per-step terms of plan_time (grad_sync_s .. norm_s) for one pipeline stage. */
void plan_stage_step_time(const model_module *mm, const plan_module *s, int stage, const cost_pool *pool,
                          const plan_options *o, plan_time *out);
/* Of a stage's GRAD_SYNC and PARAM_GATHER seconds (plan_stage_step_time),
 * the share left exposed after the last backward (dp_exposed_s over their
 * sum; 1 when there are none): what the simulator charges each op. */
double plan_step_comm_share(const plan_time *t);
/* The same for one virtual pipeline stage (plan_vstage_of; the rank stage
 * when vp = 1, 0 when pp = 1): its blocks, and the stem and head where it
 * holds them; no hops. */
void plan_stage_micro_time(const model_t *m, int mi, const plan_module *s, int stage, const plan_workload *w,
                           const cost_cluster *c, const plan_options *o, double samples, plan_time *out);
/* The same for sp rank sp_rank's own work, which under the LLM's context
 * parallelism differs between ranks (their share of the text rows and
 * predictions; ring attention's blocks); the stage's price above is the sp
 * group's pace (sp_rank -1): the slowest rank at every point where they meet. */
void plan_cp_micro_time(const model_t *m, int mi, const plan_module *s, int stage, int sp_rank, const plan_workload *w,
                        const cost_cluster *c, const plan_options *o, double samples, plan_time *out);
/* One hop of a micro-batch's activations (or gradients) between two stages:
 * the rows a rank holds at the stage boundary (its sp share, its tp share
 * under sequence parallelism), hidden wide; its bytes and its seconds. */
double plan_stage_hop_bytes(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                            const plan_options *o, double samples);
/* One hop's seconds at each end: the receiver's (the transfer and the
 * all-gather after it, plan_stage_hop_wire) and the sender's (the transfer
 * where the engine's sends block, else 0: an asynchronous send); same_node:
 * over the node's link, else the network's (plan_stage_boundary_in_node
 * says which a stage boundary takes). */
typedef struct { double recv_s, send_s; } plan_hop_time;
plan_hop_time plan_stage_hop_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                                  const cost_cluster *c, const plan_options *o, double samples, bool grad, bool same_node);
/* How a hop of `bytes` (plan_stage_hop_bytes) crosses: what each rank puts on
 * its link and, after it arrives, the seconds of the tp all-gathers that
 * rebuild what the receiver needs. The Megatron target without sequence
 * parallelism scatters it over the tp ranks (each sends bytes / tp; Narayanan
 * et al. SC'21 sec. 4.1, Megatron-LM's scatter_gather_tensors_in_pipeline, on
 * by default; DeepSpeed's pipeline engine partitions the activation likewise,
 * and its gradient as plan_pipe_engine says); else the whole rows go and
 * nothing is gathered. */
typedef struct {
    double wire_bytes, gather_s;
    bool held;                /* the send holds the sender's stream for the transfer (DeepSpeed's blocking sends) */
    /* The receiver waits out the transfer from when it posts its receive,
     * whenever the message was sent: the Megatron target's engines wait
     * each exchange before the next compute (Megatron-LM's
     * p2p_communication._communicate: batch_isend_irecv, every request
     * waited; overlap_p2p_comm off, as in the non-interleaved schedule and
     * NeMo's base megatron_gpt_config.yaml; DeepSpeed's blocking recv).
     * plan_stage_hop_time's recv_s, which paces the closed form's stages, is
     * that wait. Megatron-LM's interleaved schedule overlaps them by default
     * and NeMo's performance configs turn overlap_p2p_comm on: not modelled,
     * the hops of such a run are over-estimated. */
    bool recv_waits;
} plan_hop_wire;
/* grad: the gradient's hop back (the engine may treat the two directions
 * apart: plan_pipe_engine). */
plan_hop_wire plan_stage_hop_wire(const model_module *mm, const plan_module *s, const cost_pool *pool,
                                  const plan_options *o, double bytes, bool grad);
/* Seconds of the schedule's encoder FORWARD op (compute + forward half of its
 * in-op communication) and BACKWARD op (recompute + backward + the rest);
 * they add up to micro_s, the LLM's FORWARD_BACKWARD. */
double plan_time_forward_s(const plan_time *t);
double plan_time_backward_s(const plan_time *t);
/* Once per step after the last micro-batch: the exposed gradient reduction,
 * the gradient norm's local pass and the optimizer. */
double plan_time_tail_s(const plan_time *t);
/* Of that tail, what runs before the step's gradient norm: the exposed share
 * of GRAD_SYNC (plan_step_comm_share, as the simulator charges it), which a
 * disaggregated group starts after its own last backward; the norm's pass,
 * the optimizer and PARAM_GATHER follow the norm, which spans every rank. */
double plan_time_reduction_tail_s(const plan_time *t);
/* Strategy feasibility independent of memory (divisibility, TP within a node, ...).
 * Returns UTIL_OK or UTIL_EINVAL with the reason. */
int plan_strategy_check(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                        const cost_cluster *c, char *err);

#include "planner/layout.h"   /* the executor's layouts: tensors, units, dp buffers, activations */

/* ---- context parallelism (sp > 1) of the LLM: planner/seqlayout.c ----
 * Ulysses (DeepSpeed-Ulysses, Jacobs et al., arXiv 2309.14509) where tp * sp
 * divides the heads and the kv heads: sp rank j holds positions
 * [j S / sp, (j + 1) S / sp) of every sample's S-token sequence, and
 * all-to-alls swap heads and sequence around attention. Otherwise ring
 * attention with load-balanced causal chunks (Megatron-Core's context
 * parallelism; Liu et al., arXiv 2310.01889): the sequence cut in 2 sp
 * chunks, rank j holds chunks j and 2 sp - 1 - j, the K/V blocks travel the
 * ring sp - 1 times and the partial results merge by their log-sum-exp.
 * plan_module.cp asks for either (ring where Ulysses would split the heads
 * too: Megatron-Core's default cp_comm_type p2p, torchtitan's CP).
 * An encoder's sp is Ulysses over its micro-batch's rows (executor/block.c). */
plan_cp plan_cp_of(const model_module *mm, const plan_module *s);
const char *plan_cp_name(plan_cp k);
/* "ulysses", "ring", or "auto" (PLAN_CP_NONE: plan_cp_of's default); false for anything else. */
bool plan_cp_parse(const char *name, plan_cp *out);
/* Equal parts the variant cuts a sequence into: sp (Ulysses), 2 sp (ring). */
int plan_cp_chunks(plan_cp k, int sp);
/* The positions of a sample's S-token sequence that sp rank j holds, as at
 * most two ranges [lo, hi) in the order of its local rows. */
typedef struct { int n; int lo[2], hi[2]; } plan_cp_span;
plan_cp_span plan_cp_span_of(plan_cp k, int S, int sp, int j);
int plan_cp_rows(const plan_cp_span *s);                      /* positions held */
int plan_cp_held(const plan_cp_span *s, int a, int b);        /* of positions [a, b) */
int plan_cp_position(const plan_cp_span *s, int row);         /* local row -> position (-1 past the end) */
int plan_cp_local(const plan_cp_span *s, int pos);            /* position -> local row, -1 if not held */
/* The LLM's activation slot for `samples` samples of S positions, T of them
 * text (the encoders' rows first): rows on this rank, and the encoder rows,
 * predictions and text rows sized for the sp rank that holds the most. */
plan_act_rows plan_llm_act_rows(const model_module *mm, const plan_module *s, int samples, int S, int T);
/* How layer `layer` of module mm attends across its sp ranks when each holds
 * `rows` rows of a micro-batch: PLAN_CP_NONE (on the rank alone: no sp, or
 * an encoder's window layer whose ranks hold whole windows, where Ulysses
 * needs no all-to-all), PLAN_CP_ULYSSES or PLAN_CP_RING. */
plan_cp plan_cp_layer(const model_module *mm, const plan_module *s, int layer, double rows);
/* Rows per sample of encoder k that LLM rank `rank` takes in (its sp rank's
 * share of them); k < 0: of every encoder's (the LLM's input buffer). */
int plan_cp_encoder_rows(const plan_t *p, int k, int rank);
/* The LLM's sequence of `seq` tokens splits as the variant needs; UTIL_EINVAL naming the field otherwise. */
int plan_cp_check(const model_module *mm, const plan_module *s, double seq, char *err);

/* ---- whole-plan evaluation (the same cost model for the MILP result and baselines) ---- */
/* Where a module's seconds of the step (plan_eval.module_step_s) go: its
 * pacing stage's micro-batches by part, the pipeline's fill and drain, a
 * disaggregated encoder's hand-offs to the LLM, and the step's tail (the
 * exposed gradient reduction, the gradient norm's pass, the optimizer). */
typedef struct {
    plan_micro_parts micro;
    double micros;                       /* the micro-batches in micro */
    double bubble_s, transfer_s, dp_sync_s, norm_s, optim_s;
} plan_step_parts;
double plan_step_parts_total(const plan_step_parts *sp);

typedef struct {
    plan_mem mem[MODEL_MAX_MODULES];     /* per GPU of each module group */
    plan_time time[MODEL_MAX_MODULES];
    double module_step_s[MODEL_MAX_MODULES];
    plan_step_parts parts[MODEL_MAX_MODULES];
    double transfer_s;                   /* encoder -> LLM activation hand-off per step */
    double peak_mem;                     /* worst GPU: colocated sums the modules */
    double capacity;
} plan_eval;
int plan_evaluate(plan_t *p, const plan_options *o, plan_eval *ev, char *err);
/* For a plan whose worst GPU is over its capacity: the least full
 * recomputation that fits it (rc=full with the fewest rc_layers,
 * plan_module.recompute_layers): of one module, the fastest such over the
 * modules; where none alone does, of every module that could recompute more,
 * each down to its fewest blocks in turn. Into *out (evaluated: out->pred),
 * the modules it changes in the bit mask *changed; 0 where nothing fits
 * (planner/fit.c). */
int plan_fit_by_recompute(const plan_t *p, const plan_options *o, plan_t *out, unsigned *changed, char *err);
/* The other way: in each module of p that recomputes fully, as few blocks a
 * stage as still fit (none at all where that fits; by the plan's own verdict,
 * the simulator's where it runs the plan), module by module; p is
 * re-evaluated and simulated where it changes (planner/fit.c). The search
 * trims its plans so, having priced full recomputation only at a chunk's
 * quarters. */
int plan_trim_recompute(plan_t *p, const plan_options *o, char *err);
/* Each module's plan_step_parts (out[p->n_modules]) under the plan's own
 * options (plan_options_of); p is left as it is. */
int plan_step_parts_of(const plan_t *p, plan_step_parts *out, char *err);

/* ---- baselines, evaluated on the same cost model ---- */
typedef enum { PLAN_BASE_ZERO3 = 0, PLAN_BASE_TP, PLAN_BASE_HOMOGENEOUS, PLAN_BASE_SP_TP, PLAN_NBASE } plan_baseline;
/* Fills p with the baseline (best recompute / micro-batch that fits; if none fits,
 * the least-memory variant with pred.fits = false). Returns UTIL_OK, or
 * UTIL_EINFEASIBLE if the baseline cannot even be formed (e.g. TP not dividing heads). */
int plan_baseline_make(plan_baseline b, const model_t *m, const cost_cluster *c, const plan_workload *w,
                       const plan_options *o, plan_t *p, char *err);
const char *plan_baseline_name(plan_baseline b);
/* A baseline by name: UTIL_OK, or UTIL_EINVAL with err (may be NULL) naming them. */
int plan_baseline_parse(const char *s, plan_baseline *out, char *err);

/* Builds a plan from explicit per-module strategies, e.g.
 * "vision:sp=8;llm:tp=8" (keys dp,tp,sp,pp,zero,mb,rc=none|selective|full,rc_layers=N,seqpar=0|1,pool=N;
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

const char *plan_placement_name(plan_placement p);
const char *plan_recompute_name(plan_recompute r);
/* s's recomputation as the plan table shows it: the mode's name, "full:N"
 * where only N blocks of each chunk recompute (plan_module.recompute_layers). */
const char *plan_recompute_label(const plan_module *s, char *buf, size_t n);
/* An enum from its name (the *_name tables in planner/planfile.c): UTIL_OK, or
 * UTIL_EINVAL with err (UTIL_ERR_LEN; may be NULL) naming the choices. The
 * option enums' parsers above take the same err. */
int plan_placement_parse(const char *s, plan_placement *out, char *err);
int plan_recompute_parse(const char *s, plan_recompute *out, char *err);

/* the schedule, the search and the simulator with the trace writer: their own headers, part of this one */
#include "planner/schedule.h"
#include "planner/search.h"
#include "planner/simulate.h"
#include "planner/precision_zero3.h"

#endif
