/* planner-internal: what the planner's files share (the cost model's, the
 * schedule's and the simulator's). */
#ifndef DHP_PLANNER_INT_H
#define DHP_PLANNER_INT_H

#include "planner/planner.h"

/* The communication inside one micro-batch's forward and backward, and the
 * blocking exchanges it makes (plan_time.fwd_syncs, bwd_syncs). */
typedef struct {
    double fwd_s, bwd_s;
    int fwd_syncs, bwd_syncs;
} plan_comm;

/* Adds `count` exchanges of `seconds` each to the forward or the backward. */
void plan_comm_add(plan_comm *c, bool backward, double seconds, int count);

/* cost_dp.c: the data-parallel strategy's price (plan_dp_rules_of).
 * Per micro-batch, inside the compute ops: ZeRO-3's unit gathers and
 * ZeRO-2/3's unit reduce-scatters, the part the micro-batch's forward and
 * backward compute (fwd_compute, bwd_compute) do not hide, into *comm; the
 * strategy's own element-wise work (zeroing buckets, accumulating shards)
 * into *bwd_busy. backward: the module runs a backward. */
void plan_price_dp_micro(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o,
                         bool backward, double fwd_compute, double bwd_compute, plan_comm *comm, double *bwd_busy);
/* Per step: the GRAD_SYNC and PARAM_GATHER ops of pipeline stage `stage`
 * (plan_time.grad_sync_s .. param_gather_busy_s). */
void plan_price_dp_step(const model_module *mm, const plan_module *s, int stage, const cost_pool *pool,
                        const plan_options *o, plan_time *out);

/* cost_dp.c: the EMBED_SYNC op: the tied embedding's gradient (this tp
 * rank's vocabulary rows) all-reduced between the first and the last stage,
 * per_node of the two on one node. */
double plan_embed_sync_s(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o,
                         int per_node);

/* schedule.c: does encoder k feed the LLM its rows (an encoder of a workload with images)? */
bool plan_encoder_feeds(const plan_t *p, int k);
/* Micro-batches of a dp share of `count` samples, and micro-batch u's samples
 * [*f, *f + *n) of the share starting at `first` (past its end: empty, at its end). */
int plan_micro_count(const plan_module *s, int count);
void plan_micro_range(const plan_module *s, int first, int count, int u, int *f, int *n);

#endif
