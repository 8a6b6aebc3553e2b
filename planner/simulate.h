/* The planner's simulator and trace writer: one step of a plan's schedule,
 * op by op, priced by the cost model (planner/simulate.c, sim_*.c, trace.c).
 * Part of planner/planner.h, which includes it; it may be included alone. */
#ifndef DHP_PLANNER_SIMULATE_H
#define DHP_PLANNER_SIMULATE_H

#include "planner/planner.h"

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
 * head and cross-entropy; zero_buffers: ZeRO-3's gathered units and ZeRO-2/3's
 * gradient buckets; workspace: the backend's own (plan_backend_workspace_bytes,
 * once); other: reservation, fragmentation. */
typedef struct {
    double params, grads, optim, zero_buffers, activations, logits, comm, workspace, other, total, capacity;
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
 * is set), and for the dhp target the simulated memory per rank its peak
 * memory and fits verdict (pred.peak_mem_bytes, pred.fits: the hand-off's
 * buffers included). Returns the schedule's refusal (pred untouched) for plans it does not run. */
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
typedef struct {
    int rank;
    plan_trace_lane lane;
    char name[64];
    double start_s, end_s;
    int chunk, samples;       /* args; -1 leaves them out */
    double bytes;             /* args; < 0 leaves it out */
} plan_trace_event;
/* Writes n events atomically; process r is named names[r] ("rank r" if names or names[r] is NULL). */
int plan_trace_write(const char *path, const plan_trace_event *ev, int n, int world_size,
                     const char *const *names, char *err);
/* The simulated step as a trace: one event per op, compute ops on the compute
 * lane, hand-offs and collectives on the comm lane. */
int plan_sim_write_trace(const char *path, const plan_t *p, const plan_sim_result *r, char *err);

#endif
