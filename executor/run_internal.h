/* executor-internal: the state of one rank of `dhp run`, shared by the
 * driver (run.c), its ops (run_ops.c, run_handoff.c), the data-parallel
 * strategies (dp_*.c) and the checkpoints (run_ckpt.c). */
#ifndef DHP_EXECUTOR_RUN_INTERNAL_H
#define DHP_EXECUTOR_RUN_INTERNAL_H

#include "executor/executor.h"
#include "executor/backend.h"
#include "executor/comm.h"

/* ---- data-parallel strategies ----
 * What replication or a ZeRO stage does at each point of a step, one file
 * each (dp_replicated.c, dp_zero1.c, dp_zero2.c, dp_zero3.c), as the
 * planner's rules say (plan_dp_rules_of) and sized as it prices them
 * (plan_dp_buffers_of). Megatron-Core's _BaseDataParallel keeps the same
 * logic out of its training loop. */
#define RUN_DP_SLOTS 3

typedef struct run_dp run_dp;
typedef struct run_z3b run_z3b;
typedef struct {
    const char *name;
    /* Places the module's state (ex_module_set_shard) and allocates the buffers. */
    int (*init)(run_dp *d, char *err);
    /* Around every use of a unit (NULL: nothing to do), see ex_unit_hooks. */
    int (*unit_begin)(run_dp *d, int unit, ex_unit_use use);
    int (*unit_end)(run_dp *d, int unit, ex_unit_use use, bool last);
    /* The schedule's GRAD_SYNC and PARAM_GATHER ops (NULL where the rules have none). */
    int (*grad_sync)(run_dp *d, char *err);
    int (*param_gather)(run_dp *d, char *err);
} run_dp_ops;

extern const run_dp_ops run_dp_replicated, run_dp_zero1, run_dp_zero2, run_dp_zero3;

/* One in-flight or resident unit buffer: a gathered unit's weights, or a
 * unit's gradient bucket with the piece its reduce-scatter fills. */
typedef struct {
    float *buf, *piece;
    int unit;                 /* -1: free */
    bool in_use;              /* bound to the unit's views */
    ex_request *req;          /* its collective, until waited */
} run_dp_slot;

struct run_dp {
    const run_dp_ops *ops;
    ex_model *em;
    const ex_backend *be;
    int k;                    /* module index */
    ex_comm *comm;            /* the shard group: dp x sp at this rank's tp position */
    plan_dp_rules rules;
    plan_dp_buffers buf;
    const ex_shard *shard;    /* the model's, once init placed the state */
    float *staging, *piece;   /* ZeRO-1/2: one unit padded, one piece */
    run_dp_slot gather[RUN_DP_SLOTS], bucket[RUN_DP_SLOTS];
    /* the model's unit order of a forward and of a backward, and where each pass is */
    int *order[2], n_order[2], cursor[2];
    /* replicated / ZeRO-1: the step's reduction, unit by unit (dp_overlap.c) */
    bool final_pass;          /* the running compute op is its chunk's last backward of the step */
    bool *posted;             /* [n_units] reduction posted this step */
    ex_request **ureq;        /* [n_units] replicated: each unit's all-reduce in flight */
    int step_units;           /* n_units of those arrays */
    ex_request *step_req;     /* ZeRO-1: the reduce-scatter in flight from staging into piece */
    int step_unit;            /* its unit, -1: none */
    int embed_unit;           /* the unit EMBED_SYNC adds into (reduced in GRAD_SYNC), -1: none */
    char err[UTIL_ERR_LEN];   /* what the last failing unit hook saw */
    run_z3b *z3b;             /* ZeRO-3 under bf16-mixed: the bf16 shard and its gathers (dp_zero3_bf16.c) */
};

/* dp.c: the strategy of a module (by its rules), the hooks that call it, and the shared pieces. */
const run_dp_ops *run_dp_ops_of(const plan_dp_rules *r);
int run_dp_init(run_dp *d, ex_model *em, int k, ex_comm *shard_comm, const plan_dp_rules *r,
                const plan_dp_buffers *b, char *err);
void run_dp_free(run_dp *d);
/* Allocates `slots` unit buffers of `floats` (category cat), with pieces when piece_floats > 0. */
int run_dp_alloc_slots(const ex_backend *be, run_dp_slot *s, int slots, size_t floats, size_t piece_floats,
                       util_mem_cat cat);
/* The unit that follows `unit` in a pass of `use` (-1 at the pass's end), advancing the pass's cursor. */
int run_dp_next_unit(run_dp *d, int unit, ex_unit_use use);
/* Unit u's elements over the shard group: every rank's piece (padded) into
 * all[G * piece] from mine[piece]; or the sum of every rank's all[] into this
 * rank's piece. Blocking. */
int run_dp_gather_unit(run_dp *d, int u, const float *mine, float *all, char *err);
/* ZeRO-1/2's step all-gather of the updated weights, unit by unit, through the staging buffer. */
int run_dp_gather_params(run_dp *d, char *err);
/* ZeRO-2/3: bind unit u's gradient bucket (its first backward use), and
 * after its last one reduce-scatter it into this rank's gradient shard. */
int run_dp_bucket_begin(run_dp *d, int u);
int run_dp_bucket_end(run_dp *d, int u, bool last);
/* dp_overlap.c: replicated / ZeRO-1's step reduction: buffers (after the
 * shard is placed), the unit hook that posts a finished unit in the last
 * micro-batch, and GRAD_SYNC (posts the rest, waits for all). */
int run_dp_step_init(run_dp *d, char *err);
void run_dp_step_free(run_dp *d);
int run_dp_step_unit_end(run_dp *d, int unit, ex_unit_use use, bool last);
int run_dp_step_grad_sync(run_dp *d, char *err);
/* The module's whole state of this tp rank (EX_BUF_PARAMS, EX_BUF_ADAM_M,
 * EX_BUF_ADAM_V) as one flat buffer[n_params], from wherever the strategy
 * keeps it; and the inverse (every rank passes the whole buffer). flat is
 * host memory (staged through a backend buffer). Collective over the shard
 * group where the state is sharded. */
int run_dp_gather_state(run_dp *d, ex_buffer_kind kind, float *flat, char *err);
int run_dp_scatter_state(run_dp *d, ex_buffer_kind kind, const float *flat, char *err);
/* dp_zero3_bf16.c: ZeRO-3 under bf16 (after the gather slots exist); unit u's
 * gather into gather slot `slot` (bf16 words and fp32 elements), and once
 * the slot's request is waited, the fp32 unit from them; free. */
int run_z3b_init(run_dp *d, char *err);
int run_z3b_issue(run_dp *d, int u, int slot);
int run_z3b_finish(run_dp *d, int u, int slot);
void run_z3b_free(run_dp *d);

/* ---- the rank ---- */

/* The collectives a module's layout calls, on its own communicators. */
typedef struct { ex_comm *tp, *sp; } run_hooks;

/* One stage edge and direction: a FIFO channel with one sender and one
 * receiver, on a communicator of its own (run_stage.c run_stage_comms). */
typedef struct {
    int tag;                  /* the edge and direction (run_stage.c edge_tag) */
    ex_comm *c;               /* its sender (rank 0) and its receiver (rank 1) */
} run_stage_channel;

/* A send in flight on its channel's communicator. */
typedef struct {
    ex_request *req;
    ex_comm *c;
} run_stage_inflight;

/* A pipelined module's stage edges on this rank (run_stage.c): a receive
 * buffer per direction, a send buffer per model chunk and direction (one
 * chunk without interleaving; plan_stage_edge_buffers counts them), each
 * send left in flight until the next one on its edge (or the step's end)
 * waits for it. */
typedef struct {
    ex_comm *pp;              /* the module's ranks that differ only in the stage: key = stage */
    run_stage_channel chan[4 * PLAN_MAX_VP];   /* each chunk's edges in and out, activations and gradients */
    int n_chan;
    float *act_in, *grad_in;  /* from the previous / the next virtual stage */
    float *act_out[PLAN_MAX_VP], *grad_out[PLAN_MAX_VP];   /* each chunk's to the next / the previous */
    size_t cap;               /* floats of each buffer */
    run_stage_inflight act_req[PLAN_MAX_VP], grad_req[PLAN_MAX_VP];   /* each chunk's last send down / up */
    const float *pending;     /* the last compute op's output for the next SEND_STAGE(_GRAD), NULL after a failure */
} run_stage;

typedef struct {
    bool on;                  /* this rank is in the module's group */
    bool first, last;         /* its first / last pipeline stage (both without pipelining) */
    plan_coord at;
    ex_comm *tp, *sp;         /* ranks of one replica that differ only in tp / sp */
    ex_comm *shard;           /* dp x sp ranks with the same tp (and stage) index: gradient sync, ZeRO shards */
    ex_comm *lead;            /* each stage's first replica's tp group (dp = sp = 0): checkpoint gathers */
    ex_comm *stage_leads;     /* those groups' tp rank 0 of every stage: the checkpoint's writer gathers them */
    ex_comm *embed;           /* the first and the last stage of a tied LLM (plan_embed_group_of) */
    run_hooks hooks;
    plan_dp_rules rules;
    run_dp dp;
    run_stage st;
    size_t n;                 /* flat parameters on this rank */
} run_module;

typedef struct {
    const ex_run_options *o;
    plan_t plan;
    ex_comm *world;
    int rank, size;
    run_module mod[MODEL_MAX_MODULES];
    const ex_backend *be;     /* the run's backend (ex_backend_pick): every tensor buffer is its memory */
    ex_model *em;
    ex_optim_config optim;
    int step;                 /* steps done */
    /* CLOCK_REALTIME - util_now() on this rank: the trace's op times are
     * wall-clock times, which every process of a host reads from one clock
     * and NTP keeps close across hosts, so ranks line up. (Each rank's own
     * step start does not: the ranks of a step start apart, by whatever the
     * previous step left between them; nor does the exit of a start-up
     * collective, which a rank descheduled right after it misses by a time
     * slice.) */
    double wall_offset;
} run_ctx;

/* dp_overlap.c, at a step's end: whatever a step that ended early left in flight. */
int run_dp_step_wait_all(run_ctx *r, char *err);

/* The run's backend from --backend (run_backend.c): r->be, and its one log line on rank 0. */
int run_pick_backend(run_ctx *r, char *err);
/* After rc failed: the backend's own first failure since its last sync
 * (a device allocation, a launch) is the cause, so it replaces err
 * (prefixed with `doing` unless NULL). */
int run_backend_explain(run_ctx *r, int rc, const char *doing, char *err);
/* The backend's sync at a step's end; an out-of-memory failure it kept (an
 * allocation inside a kernel's call) gets the plan's prediction appended. */
int run_backend_sync(run_ctx *r, char *err);

/* Checkpoints: DIR/step-NNNNNNNN/<module>.safetensors with every parameter
 * as a whole tensor and its AdamW moments ("adam_m." / "adam_v." + name),
 * metadata step, adam_t, seed, shuffle_seed; DIR/latest names the newest
 * complete step directory. Whole tensors make a checkpoint independent of
 * the plan's layout. Collective over the world. */
int run_ckpt_save(run_ctx *r, char *err);
/* Loads DIR/latest into every rank's shards; sets r->step. */
int run_ckpt_load(run_ctx *r, char *err);
/* This rank's tp slice of tensor t out of the whole tensor. */
void run_ckpt_take_shard(const ex_param *t, const float *whole, float *local);
/* --init-from (run_init.c): the Hugging Face checkpoint in r->o->init_from into every rank's shards. */
int run_init_from(run_ctx *r, char *err);
/* DIR/step-NNNNNNNN of a step into out. */
int run_ckpt_step_dir(const run_ctx *r, long long step, char *out, size_t n);

/* The step every rank resumes from (executor/run_resume.c): rank 0 reads
 * DIR/latest and checks that its step directory holds every module's file,
 * each a dhp checkpoint with checksums at that step (a missing, foreign or
 * other-step file is named), then every rank gets the step or the refusal
 * before any work. Collective over the world. */
int run_ckpt_resume_step(run_ctx *r, char *dir, size_t n, long long *step, char *err);

/* Output paths and checkpoint directories (executor/run_paths.c). Before
 * step 1: --ckpt DIR is created and must take files, --trace FILE must be
 * writable, temp files a killed run left in DIR are removed; every rank
 * agrees. Collective over the world. */
int run_paths_prepare(run_ctx *r, char *err);
/* --ckpt-keep N: removes all but the N newest step directories up to the
 * current step (rank 0, after DIR/latest moved). */
void run_ckpt_retain(run_ctx *r);

/* SIGTERM, SIGINT, SIGUSR1 (executor/run_signals.c): the first asks the run
 * to stop after the current step, write a checkpoint and exit 0 (Slurm
 * sends SIGTERM before preempting a job); a second one ends the process. */
void run_signals_install(void);
void run_signals_restore(void);
/* After each step: whether any rank got a stop signal (a tiny all-reduce
 * over the world, so all stop after the same step); *sig is the signal. */
int run_signals_agree_stop(run_ctx *r, bool *stop, int *sig, char *err);
/* Rank 0's line on stderr after a stop: the signal, the step, the checkpoint. */
void run_signals_note(const run_ctx *r, int sig);

/* ---- one step's ops (run_ops.c, run_handoff.c) ---- */

/* One set of a step's host buffers (the backend's alloc_host memory). */
typedef struct { float *pixels, *mel, *mask; int32_t *tokens; } run_data_set;

/* This rank's samples of the step, double-buffered (run_data.c). */
typedef struct {
    int n;                    /* samples this rank holds */
    int *row_of;              /* [global_batch] row in the buffers below, -1 if not held */
    float *pixels;            /* [n, patches, patch_dim]    (the current set's) */
    float *mel;               /* [n, mel_frames, mel_bins] (audio sets) */
    int32_t *tokens;          /* [n, T] */
    float *mask;              /* [n, T] */
    int *ones;                /* [global_batch] images / clips per sample (1 each) */
    ex_data_rows one;         /* loader buffer of one row */
    int patches, patch_dim, T, grid, mel_frames, mel_bins;
    bool images, audio;       /* the samples' images / clips feed the LLM (plan_encoder_feeds) */
    const ex_backend *be;     /* whose host memory the sets are */
    run_data_set set[2];
    long loaded[2];           /* the step each set holds, -1: none */
    int cur;                  /* the set the step computes on */
} run_data;

/* run_data.c: the buffers (two sets) for the rank's schedule; step `step`'s
 * samples in the current set (prefetched, or read now); and, once a step's
 * ops are issued and before its sync, step `step`'s samples into the other
 * set (nothing past the run's last step). */
int run_data_init(run_ctx *r, const plan_schedule *s, ex_dataset *ds, run_data *d, char *err);
void run_data_free(run_data *d);
int run_data_load(run_ctx *r, ex_dataset *ds, long step, run_data *d, char *err);
int run_data_prefetch(run_ctx *r, ex_dataset *ds, long step, run_data *d, char *err);

/* A hand-off send in flight: encoder k's chunk c, its rows or (grad) their gradients. */
typedef struct { ex_request *req; float *buf; ex_comm *c; int k, c_chunk; bool grad; } run_pending;
/* One direction between two ranks of the hand-off: a communicator of the
 * sender (its rank 0) and the receiver (rank 1). */
typedef struct { int from, to; ex_comm *c; } run_handoff_channel;
/* This rank's part in one world split that makes hand-off channels: its
 * pair's color (-1: in none this round) and the pair. */
typedef struct { int color, from, to; } run_handoff_split;

/* One encoder's side of the hand-off: its segments per chunk and (on its
 * ranks) the packed rows of the current chunk. */
typedef struct {
    plan_segment **seg;       /* [chunks] encoder -> LLM segments */
    int *nseg;
    int rows;                 /* merged rows per sample */
    float *act_pack, *grad_pack;  /* encoder: this rank's rows of the current chunk */
    int *order, order_block;  /* LLM: plan_handoff_block_order of the last block size seen */
} run_handoff_enc;

/* The encoders -> LLM hand-off of the step's chunks: every encoder's
 * segments route its rows into the LLM's one input buffer, where each
 * sample's rows of all encoders sit in sequence order (plan_sample_offset). */
typedef struct {
    run_handoff_enc enc[MODEL_MAX_MODULES];   /* by module index; seg NULL where the module feeds nothing */
    int chunks;
    int llm_rows;             /* every encoder's rows per sample this rank's LLM sp rank takes in (plan_cp_encoder_rows) */
    int d;                    /* row width (LLM hidden = encoder out_hidden) */
    float *act_in, *grad_out;     /* LLM: its share's rows of the current chunk */
    run_pending *pend;
    int n_pend, cap_pend;
    run_handoff_split *split;     /* the world splits that make the channels (run_handoff_init) */
    int n_split;
    run_handoff_channel *chan;    /* the pairs this rank sends to or receives from (run_handoff_comms) */
    int n_chan;
} run_handoff;

typedef struct {
    double loss;              /* this rank's share of the global mean loss (LLM tp rank 0) */
    double denominator;       /* counted predictions of the global batch */
    double grad_norm;
    float lr;
    double op_s[PLAN_NOPS];   /* seconds per op kind on this rank */
} run_stats;

/* run_stage.c: a pipelined module's stage edges. init allocates the buffers
 * of module k on this rank; send (the hop op o: SEND_STAGE or
 * SEND_STAGE_GRAD of its module's chunk o->vchunk) sends `rows` rows (hidden
 * wide) from src (NULL: whatever the edge's buffer holds, after a failed
 * compute op) down the pipeline (activations) or up it (gradients); recv
 * receives them into the edge's buffer and returns it. wait_all completes
 * every send of the step. */
int run_stage_comms(run_ctx *r, int k, char *err);
int run_stage_init(run_ctx *r, int k, char *err);
void run_stage_free(run_ctx *r, int k);
int run_stage_send(run_ctx *r, const plan_op *o, const float *src, int rows, char *err);
int run_stage_recv(run_ctx *r, const plan_op *o, int rows, const float **out, char *err);
int run_stage_wait_all(run_ctx *r, char *err);

int run_handoff_init(run_ctx *r, run_handoff *h, char *err);
/* Collective over the world, after run_handoff_init succeeded on every rank:
 * a communicator for each direction between two ranks that messages take
 * (the splits run_handoff_init planned). */
int run_handoff_comms(run_ctx *r, run_handoff *h, char *err);
void run_handoff_free(run_ctx *r, run_handoff *h);
int run_handoff_wait_all(run_ctx *r, run_handoff *h, char *err);
/* Chunk c's rows of encoder k, one way (grad: their gradients back). */
int run_handoff_send(run_ctx *r, run_handoff *h, int k, int c, bool grad, const float *src, char *err);
int run_handoff_recv(run_ctx *r, run_handoff *h, int k, int c, bool grad, float *dst, char *err);
/* Completes and frees this rank's sends of chunk c of encoder k in
 * direction grad (the op's plan_op.retires: their receivers have them). */
int run_handoff_retire(run_ctx *r, run_handoff *h, int k, int c, bool grad, char *err);
/* Does encoder k feed the LLM its rows, and does it train? (any: some encoder) */
bool run_feeds(const run_ctx *r, int k);
bool run_encoder_trains(const run_ctx *r);

/* run_cp.c: the ring attention's point-to-point hooks of a module's layout (on its run_hooks' sp communicator). */
void run_cp_hooks(ex_parallel *par);
/* run_wire.c: the activation collectives' bf16 wire as the plan's options say (plan_act_wire_bf16). */
void run_wire_hooks(ex_parallel *par, const plan_options *o);

/* Runs one op of the schedule; a compute failure is kept in *failed so the
 * rank still takes part in every exchange of the step. */
int run_op(run_ctx *r, const plan_op *o, const run_data *d, run_handoff *h, run_stats *st, bool *applied,
           int *failed, char *err);

#endif
