/* simulator-internal: what the step simulator's files share. simulate.c
 * walks the ranks' schedules; sim_price.c prices each op from the cost
 * model; sim_messages.c lays out the point-to-point messages (the encoder ->
 * LLM hand-off and the pipeline stages' hops); sim_memory.c sizes each
 * rank's memory; sim_output.c writes results. */
#ifndef DHP_PLANNER_SIM_INT_H
#define DHP_PLANNER_SIM_INT_H

#include "planner/planner_int.h"

#define FP32_BYTES 4.0

/* ---- where ranks are (sim_price.c) ---- */
int sim_rank_pool(const plan_t *p, int rank);
int sim_rank_in_pool(const plan_t *p, int rank);   /* position among its pool's GPUs */
int sim_rank_node(const plan_t *p, int rank);

/* ---- op prices (sim_price.c) ----
 * Memoised per (module, pipeline stage, samples) and per (module, stage). */
typedef struct { int module, stage, samples; plan_time t; } sim_micro_entry;
typedef struct {
    const plan_t *p;
    plan_options opt;
    plan_time step[MODEL_MAX_MODULES][PLAN_MAX_PP];
    bool have_step[MODEL_MAX_MODULES][PLAN_MAX_PP];
    sim_micro_entry *micro;
    int n_micro, cap_micro;
    double norm_s;
    bool have_norm;
} sim_pricer;
plan_sim_cost sim_price(sim_pricer *pr, int rank, const plan_op *op);
void sim_pricer_free(sim_pricer *pr);
/* One pipeline hop of module k's micro-batch of `samples` (activations, or
 * their gradient: grad): the bytes each rank sends, the all-gathers after it
 * and whether the send holds its sender (plan_stage_hop_wire). */
plan_hop_wire sim_stage_hop(const plan_t *p, int k, int samples, bool grad);

/* ---- memory (sim_memory.c) ----
 * The hand-off's messages each rank sends and receives, chunk by chunk,
 * built once for all ranks (sim_handoff_table_build); a rank's memory reads it. */
typedef struct sim_handoff_table sim_handoff_table;
int sim_handoff_table_build(const plan_t *p, sim_handoff_table **out, char *err);
void sim_handoff_table_free(sim_handoff_table *t);
void sim_rank_memory(const plan_t *p, int rank, const plan_schedule *sched, const sim_handoff_table *handoff,
                     plan_sim_mem *out);

/* ---- messages (sim_messages.c) ----
 * One message: the rows one rank sends another, for a hand-off (chunk c of
 * encoder k, activations or their gradients back: the concatenation of its
 * segments) or one pipeline hop of a micro-batch. */
typedef struct {
    int src, dst;
    double bytes;
    double gather_s;                   /* a scattered stage hop's tp all-gathers on arrival (plan_stage_hop_wire) */
    bool held;                         /* a stage hop whose send holds the sender until it is across (plan_hop_wire.held) */
    bool recv_waits;                   /* ... whose receiver waits out its transfer (plan_hop_wire.recv_waits) */
    bool sent, taken;
    double sent_s, start_s, arrive_s;  /* SEND op, channel free, arrival */
    double taken_s;                    /* the receive that took it ended (dst's RECV op recv_op) */
    int send_op, recv_op;              /* op index on src, on dst */
    int prev;                          /* the message before it on the same (src, dst) channel, -1 none */
} sim_message;

typedef struct { int dst, last; } sim_channel;   /* the last message sent on (src, dst) */

typedef struct {
    sim_message *m;
    int n, cap;
    int *group_first, *group_n;        /* hand-off groups: (c * n_modules + k) * 2 + grad */
    int n_groups;
    int **stage_msg;                   /* per rank, per op: the stage hop it sends or receives, -1 none */
    sim_channel **chan;                /* per source rank: its channels so far */
    int *n_chan, *cap_chan;
} sim_messages;

int sim_handoff_group(const plan_t *p, int k, int c, bool grad);
int sim_build_messages(const plan_t *p, const plan_schedule *sched, sim_messages *t, char *err);
void sim_free_messages(const plan_t *p, sim_messages *t);
/* Message i leaves src at t: it starts when its channel is free (the
 * previous message on it arrived) and arrives `seconds` later. */
int sim_message_send(const plan_t *p, sim_messages *t, int i, double t_s, double seconds, char *err);

#endif
