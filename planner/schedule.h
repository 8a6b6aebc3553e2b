/* The step's schedule, the op table, the rank groups, the data-parallel
 * strategies' rules and the encoder -> LLM hand-off segments: what every
 * rank does in one step, which the executor runs and the simulator prices
 * (planner/schedule.c, groups.c, dp.c, handoff.c).
 * Part of planner/planner.h, which includes it; it may be included alone. */
/* planner.h first, outside the guard: included alone, this header then
 * reaches its body from planner.h, ahead of the headers that use it. */
#include "planner/planner.h"

#ifndef DHP_PLANNER_SCHEDULE_H
#define DHP_PLANNER_SCHEDULE_H

/* ---- schedule: what every rank does in one step, in order ----
 * The executor runs it and the simulator prices it, from this one code, so
 * the two cannot drift. A step's global batch is cut into chunks that flow
 * encoder -> LLM: disaggregated, p->n_micro chunks of global_batch / n_micro
 * samples; colocated, chunks of the LLM's dp * micro_batch samples. Each
 * module's dp rank i takes samples [c0 + i*C/dp, c0 + (i+1)*C/dp) of chunk
 * [c0, c0 + C) (integer division, so uneven dp splits differ by one) and runs
 * them in micro-batches of micro_batch samples. A module split into pp
 * stages runs each micro-batch through them in turn, rank to rank at the
 * same dp, sp and tp position; every stage keeps a micro-batch's
 * activations in a slot until its gradient returns.
 * Encoder ranks: forward chunks 0..W-1, then per chunk c: receive its
 * gradient, backward, forward chunk c + W (W = 1 colocated or frozen,
 * disaggregated the chunks the LLM's first stage forwards before it sends
 * chunk 0's gradient back: 2 with pp = 1). LLM ranks: each chunk's encoder
 * rows received before its first forward, its gradient sent after its last
 * backward; the micro-batches in 1F1B order (Narayanan et al., PipeDream-
 * Flush, arXiv 2006.09503): stage i forwards pp - 1 - i ahead, then
 * alternates one forward, one backward; the last stage runs each
 * micro-batch's forward and backward as one op. Interleaved (vp > 1): each
 * rank holds vp model chunks (plan_stage_of), a unit is one micro-batch
 * through one chunk, in Megatron-Core's order (groups of pp micro-batches
 * through chunk 0, then chunk 1, ...; backwards with the chunks reversed),
 * stage i forwarding 2 (pp - 1 - i) + (vp - 1) pp units ahead; the last
 * stage's chunk v hands its rows to the first stage's chunk v + 1, and each
 * pass's micro-batches must come in whole groups of pp. Disaggregated LLM ranks
 * pipeline over the whole step's micro-batches, colocated ranks flush after
 * each chunk, interleaving both roles chunk by chunk. Every rank ends with
 * the embedding sync, gradient sync, the global gradient norm and the
 * optimizer. */
typedef enum {
    PLAN_OP_FORWARD = 0,      /* a stage's forward of one micro-batch into `slot` */
    PLAN_OP_SEND_ACT,         /* encoder -> LLM: this rank's merged rows of chunk `chunk` */
    PLAN_OP_RECV_ACT,         /* LLM: every encoder's rows of its samples of chunk `chunk` */
    PLAN_OP_FORWARD_BACKWARD, /* the LLM's last stage: forward + backward of one micro-batch */
    PLAN_OP_SEND_GRAD,        /* LLM (tp rank 0) -> encoder: gradient of those rows */
    PLAN_OP_RECV_GRAD,
    PLAN_OP_BACKWARD,         /* a stage's backward of one micro-batch from `slot` */
    PLAN_OP_GRAD_SYNC,        /* module's gradients over its shard group: all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1) */
    PLAN_OP_GRAD_NORM,        /* global gradient norm, all-reduce over every rank */
    PLAN_OP_OPTIMIZER,        /* module's AdamW on the elements this rank updates */
    PLAN_OP_PARAM_GATHER,     /* ZeRO-1/2: all-gather of the updated weights over the shard group */
    /* Pipeline parallelism: a stage's output rows of one micro-batch to the
     * next stage of the module (and their gradient back), rank to rank at the
     * same dp, sp and tp coordinates; each channel is FIFO. */
    PLAN_OP_SEND_STAGE,
    PLAN_OP_RECV_STAGE,
    PLAN_OP_SEND_STAGE_GRAD,
    PLAN_OP_RECV_STAGE_GRAD,
    PLAN_OP_EMBED_SYNC,       /* a tied LLM embedding split over the first and last stages: their gradients summed */
    PLAN_NOPS
} plan_op_kind;

/* ---- the op table: what each kind of op is, declared once ----
 * The executor runs ops by kind, the simulator prices them and the trace
 * writers place them by these properties (sqlite declares its opcodes'
 * properties the same way, beside the opcodes). */
typedef enum {
    PLAN_GROUP_NONE = 0,      /* this rank alone */
    PLAN_GROUP_SHARD,         /* the op's module's shard group: dp x sp at one tp (and pp) position */
    PLAN_GROUP_WORLD,         /* every rank of the plan */
    PLAN_GROUP_HANDOFF,       /* point-to-point between an encoder's and the LLM's ranks */
    PLAN_GROUP_STAGE,         /* point-to-point between neighbouring pipeline stages of the op's module */
    PLAN_GROUP_EMBED          /* the first and the last pipeline stage of the LLM (plan_embed_group_of) */
} plan_op_group;
typedef enum { PLAN_TRACE_COMPUTE = 0, PLAN_TRACE_COMM, PLAN_TRACE_NLANES } plan_trace_lane;
typedef struct {
    const char *name;
    plan_trace_lane lane;     /* the trace lane it is drawn on */
    bool compute;             /* runs kernels on the rank (a busy part before any exchange) */
    bool collective;          /* starts when the last member of its group joins, ends together */
    bool transfer;            /* hand-off messages */
    bool sends;               /* transfer: sends (else receives) */
    bool grad;                /* transfer: gradients, LLM -> encoder (else activations) */
    plan_op_group group;
} plan_op_info;
const plan_op_info *plan_op_props(plan_op_kind k);
/* The direction of the hand-off sends an op of kind k retires
 * (plan_op.retires): its own side's, gradients on the LLM's side (RECV_ACT,
 * SEND_GRAD), rows on an encoder's (SEND_ACT, RECV_GRAD). */
bool plan_op_retired_grad(plan_op_kind k);

/* ---- rank groups: who is in a TP, SP, DP or PP group, in one place ----
 * A group of module k is the set of its ranks that differ only in the
 * coordinates named by `axes` (Megatron-Core's HyperCommGrid). color numbers
 * the groups of module k (0 .. n_groups - 1, over the other coordinates),
 * key is the rank's index inside its group (tp fastest, then sp, dp, pp),
 * per_node how many members of the group share a node (the module's ranks are
 * laid out from a node boundary of its pool). The executor builds its
 * communicators from it, the simulator its collectives, the cost model the
 * placement of each collective. */
enum { PLAN_AX_TP = 1, PLAN_AX_SP = 2, PLAN_AX_DP = 4, PLAN_AX_PP = 8 };
#define PLAN_AX_SHARD (PLAN_AX_DP | PLAN_AX_SP)   /* every replica of a weight shard */
typedef struct { int color, key, size, n_groups, per_node; } plan_group;
/* Rank's group of module k over `axes`; false when the rank is not in module k. */
bool plan_group_of(const plan_t *p, int k, unsigned axes, int rank, plan_group *g);
/* Global rank of member `key` of module k's group `color` over `axes`. */
int plan_group_member(const plan_t *p, int k, unsigned axes, int color, int key);
/* The LLM's embedding group (Megatron's): the first and the last pipeline
 * stage at one dp, sp and tp position, where a tied embedding is split over
 * them (plan_dp_rules.step_embed_sync); false for other ranks. */
bool plan_embed_group_of(const plan_t *p, int k, int rank, plan_group *g);
/* The rank at the same dp, sp and tp position that model chunk v of module
 * k on `rank` exchanges with in direction dir (+1: the next virtual stage,
 * -1: the previous): stage pp + dir, wrapping around between chunks when
 * interleaved (the last stage's chunk v feeds the first stage's chunk v + 1);
 * -1 if none. */
int plan_stage_peer(const plan_t *p, int k, int rank, int v, int dir);
/* Size and members per node of a group over `axes` of strategy s on nodes
 * of gpus_per_node (the group holding the module's first rank). */
void plan_group_shape(const plan_module *s, unsigned axes, int gpus_per_node, int *size, int *per_node);
/* Whether every rank of pipeline stage `stage` and its peer on stage
 * (stage + 1) % pp (plan_stage_peer: the same dp, sp and tp position) share
 * a node of gpus_per_node, the module's ranks placed from a node's start as
 * plan_group_shape takes them. */
bool plan_stage_boundary_in_node(const plan_module *s, int gpus_per_node, int stage);

/* ---- data-parallel strategies: what each ZeRO stage does, in one place ----
 * The stage of a module whose shard group (dp x sp) has one rank is 0: there
 * is nothing to shard or reduce. A frozen module keeps no gradients or
 * optimizer state; under ZeRO-3 its weights are still sharded and gathered. */
typedef struct {
    int stage;                /* effective ZeRO stage, 0..3 */
    int shard;                /* ranks sharing each weight shard (dp x sp) */
    bool trains;              /* the module has gradients and an optimizer */
    bool shard_optim;         /* AdamW moments (and the update) on 1/shard of the elements (ZeRO-1) */
    bool shard_grads;         /* only this rank's gradient shard is kept across micro-batches (ZeRO-2) */
    bool shard_params;        /* only this rank's weight shard is kept between uses (ZeRO-3) */
    bool step_grad_sync;      /* GRAD_SYNC after the last micro-batch (all-reduce, or ZeRO-1's reduce-scatter) */
    bool unit_grad_reduce;    /* each unit's gradient reduce-scattered as its backward ends, every micro-batch */
    bool unit_param_gather;   /* each unit's weights all-gathered before its forward and its backward */
    bool step_param_gather;   /* PARAM_GATHER after the optimizer */
    bool step_embed_sync;     /* EMBED_SYNC before GRAD_SYNC: a tied embedding on two pipeline stages */
} plan_dp_rules;
plan_dp_rules plan_dp_rules_of(const model_module *mm, const plan_module *s);
/* Does the rank at coordinate c of module s count its gradients in the
 * global clip norm? Every shard is distinct under ZeRO; otherwise the shard
 * group's replicas hold the same sum and the first one counts it. */
bool plan_dp_counts_norm(const plan_dp_rules *r, const plan_coord *c);

typedef struct {
    plan_op_kind kind;
    int module;               /* index in model.mod; -1 for PLAN_OP_GRAD_NORM */
    int chunk;                /* -1 for per-step ops */
    int sample0, samples;     /* this rank's samples of the step (compute ops, send/recv of its share) */
    int slot;                 /* activation slot of a FORWARD or BACKWARD, -1 if none */
    int vchunk;               /* model chunk (interleaved pipeline, 0 .. vp - 1) of a compute or hop op; else 0 */
    bool last_backward;       /* the last BACKWARD / FORWARD_BACKWARD of its module's chunk in the step (plan_mark_last_backward) */
    /* The chunk of the same encoder whose hand-off sends from this rank
     * the op frees (the direction plan_op_retired_grad says: an encoder's
     * rows, the LLM's gradients of them). RECV_GRAD / RECV_ACT free them
     * once their own messages are in: every receiver has taken them by
     * then, so nothing waits. A frozen encoder's SEND_ACT frees its
     * previous chunk's before its own sends, waiting for the receivers
     * that have not taken them yet (a wait the simulator prices). Why
     * these ops: mark_retires in schedule.c. -1: none; the rest are freed
     * when the step ends. */
    int retires;
} plan_op;

/* A pipeline hop op's channel: the lower virtual stage of the edge it
 * crosses (activations go from it to the next, gradients come back), so
 * each edge and direction is one FIFO channel. */
int plan_hop_edge(const plan_t *p, const plan_op *o, int rank);
/* Where a pipeline hop op's peer is: +1 the next virtual stage (activations
 * sent, gradients received), -1 the previous (the other two). */
int plan_hop_dir(plan_op_kind kind);

typedef struct {
    int rank;
    int n, cap;
    plan_op *op;
    int slots[MODEL_MAX_MODULES];   /* activation slots each module's forwards fill on this rank */
    int vslots[PLAN_MAX_VP];        /* of the LLM's slots, those each model chunk fills (interleaved) */
} plan_schedule;

/* Chunks of one step and the samples of chunk c ([*first, *first + *count)). */
int plan_chunks(const plan_t *p);
void plan_chunk_range(const plan_t *p, int c, int *first, int *count);
/* Module k's dp rank dp_i's share of chunk c. */
void plan_chunk_share(const plan_t *p, int k, int c, int dp_i, int *first, int *count);
/* The largest share of any chunk over module k's dp ranks (sizes hand-off buffers). */
int plan_max_share(const plan_t *p, int k);
/* Position of a global rank in module k's group; false if the rank is not in it. */
bool plan_rank_coord(const plan_t *p, int k, int rank, plan_coord *out);
int plan_coord_rank(const plan_t *p, int k, const plan_coord *c);
/* Merged encoder rows (LLM input rows) per sample of encoder k (plan_encoder_rows). */
int plan_rows_per_sample(const plan_t *p, int k);
/* Where they start in each sample's LLM sequence (plan_sample_offset). */
int plan_encoder_offset(const plan_t *p, int k);
/* The disaggregated encoder-LLM loop of a training encoder: window, the
 * chunks it forwards before its first backward (its activations in flight;
 * 1 colocated, frozen or with one chunk), and reach, the LLM first-stage
 * units (micro-batch x model chunk) of the window's last chunk forwarded
 * before a chunk's gradient leaves: chunk c + window's forward waits for
 * chunk c's gradient, which waits for those units of chunk c + window - 1
 * (0: for none of it). Of the plan's chunks, or of n_chunks even ones of
 * micros_per_chunk micro-batches on an LLM replica (the search's). */
typedef struct { int window, reach; } plan_encoder_loop;
/* Every module's (out has p->n_modules; window 1 where none, the LLM's too). */
int plan_encoder_loops(const plan_t *p, plan_encoder_loop *out, char *err);
int plan_encoder_loop_even(int pp, int vp, int n_chunks, int micros_per_chunk, plan_encoder_loop *out, char *err);
/* Each chunk of a disaggregated plan on the LLM's first stage, the most over
 * its replicas: first_unit, the forward unit (in 1F1B order) that starts
 * it, after backs backward units; its gradient leaves after reach forward
 * units of chunk c + need - 1 from that chunk's first one (need 1: its
 * own). per_chunk holds plan_chunks(p). */
typedef struct { long first_unit, backs; int need, reach; } plan_chunk_loop;
void plan_llm_chunk_loops(const plan_t *p, plan_chunk_loop *per_chunk);
/* Encoder enc's loop from the loops plan_llm_chunk_loops filled (plan_encoder_loops, evaluate.c). */
plan_encoder_loop plan_encoder_loop_in(const plan_t *p, int enc, const plan_chunk_loop *per_chunk);
/* The units (micro-batch x model chunk) a 1F1B pipeline stage holds in
 * flight at its peak, of the `units` it runs: its warm-up forwards and the
 * one before its first backward, as the schedule runs them (Megatron-Core's
 * order: interleaved, groups of pp micro-batches through chunk 0, then chunk
 * 1, ...). slots[v] (vp of them): those of model chunk v; returns their sum,
 * min(pp - stage, units) without interleaving, min(2 (pp - 1 - stage) +
 * (vp - 1) pp + 1, units) with it. */
int plan_pipeline_peak_units(int pp, int vp, int stage, int units, int *slots);
/* Checks that the executor can run p as scheduled (sp slices whole merge
 * groups in every micro-batch, one LLM, ...); UTIL_EUNSUPPORTED or
 * UTIL_EINVAL with the reason. */
int plan_schedule_check(const plan_t *p, char *err);
int plan_schedule_rank(const plan_t *p, int rank, plan_schedule *s, char *err);
void plan_schedule_free(plan_schedule *s);
const char *plan_op_name(plan_op_kind k);

/* The encoder -> LLM hand-off of chunk c of encoder k as row segments: rows
 * [enc_off, enc_off + rows) of encoder rank enc_rank's packed chunk buffer
 * (its micro-batches' local merged rows, in order) go to rows [llm_off, ...)
 * of LLM rank llm_rank's chunk input (its samples' rows, in order). Every LLM
 * tp rank receives the rows (from one of the encoder's tp ranks) and every
 * encoder tp rank their gradient (from one of the LLM's).
 * Segments are ordered by (enc_rank, llm_rank, enc_off): one message per
 * (enc_rank, llm_rank) pair is the concatenation of its segments.
 * Transfer ops name the encoder in plan_op.module; their message tags are
 * plan_handoff_tag(k, c, grad). *segs is freed with util_free. */
/* Encoder tp ranks hold the same rows, LLM tp ranks the same gradient of
 * them: a segment is listed for every (encoder tp rank, LLM tp rank) pair,
 * and act / grad say whether its rows go that way (this encoder tp rank
 * sends this LLM rank the rows; this LLM tp rank sends this encoder rank
 * their gradient): one source per receiver, the receiver's own GPU where it
 * holds them, else spread over the group's tp ranks (planner/handoff.c).
 * block > 0: the rows are consecutive blocks of `block` rows, each a band of
 * whole window rows of an image, in the encoder's stored order on its side
 * and in raster order on the LLM's (the LLM side moves row j of a block to
 * row raster[j] of it, plan_handoff_block_order; models/geometry.c). */
typedef struct {
    int enc_rank, enc_tp, llm_rank, llm_tp, rows, enc_off, llm_off, block;
    bool act, grad;
} plan_segment;
/* raster[j] for j < block: where stored row j of a hand-off block of encoder
 * k sits in the LLM's (raster) order of the block. */
int plan_handoff_block_order(const plan_t *p, int k, int block, int *raster, char *err);
int plan_handoff(const plan_t *p, int k, int c, plan_segment **segs, int *n, char *err);
int plan_handoff_tag(int k, int c, bool grad);
/* Disaggregated (no receiver on a sender's GPU): the most copies of one row
 * a sending rank of encoder k's hand-off sends in direction grad, one for
 * each receiving tp rank it is the source of (source_tp in handoff.c): an
 * encoder tp rank feeds ceil(llm tp / encoder tp) LLM tp ranks with the
 * rows, an LLM tp rank ceil(encoder tp / llm tp) encoder tp ranks with
 * their gradient. */
int plan_handoff_copies(const plan_t *p, int k, bool grad);
/* One message of a chunk's hand-off: one (encoder rank, LLM rank) pair's
 * segments segs[first..end) that go in its direction, `rows` in all, from
 * src to dst (the LLM rank to the encoder rank for the gradient). */
typedef struct { int src, dst, rows, first, end; } plan_handoff_msg;
/* The next message in direction grad among segs[from..n), whoever sends
 * it (the executor, the simulator's timing and memory all walk messages
 * through it); false when there is none. Walk with from = m->end. */
bool plan_handoff_next(const plan_segment *segs, int n, int from, bool grad, plan_handoff_msg *m);
/* The next such message rank sends (sending) or receives: sets *first,
 * *end, *peer and *rows and returns true; false when there is none. */
bool plan_handoff_message(const plan_segment *segs, int n, int from, int rank, bool grad, bool sending,
                          int *first, int *end, int *peer, int *rows);

#endif
