/* The simulator's prices: each op of a rank's schedule from the cost model
 * (planner/cost.c, cost_dp.c) for the module stage the rank holds, and the
 * time of a message between two ranks from where they are. */
#include "planner/sim_int.h"

#include <math.h>
#include <string.h>

/* ---- where ranks are ---- */

static int module_of_rank(const plan_t *p, int rank)
{
    for (int k = 0; k < p->n_modules; k++)
        if (rank >= p->mod[k].first_rank && rank < p->mod[k].first_rank + p->mod[k].n_ranks) return k;
    return -1;
}

int sim_rank_pool(const plan_t *p, int rank)
{
    int k = module_of_rank(p, rank);
    return k < 0 ? 0 : p->mod[k].pool;
}

/* Position of a rank among its pool's GPUs (pools start on node boundaries). */
int sim_rank_in_pool(const plan_t *p, int rank)
{
    int k = module_of_rank(p, rank);
    return k < 0 ? 0 : plan_pool_offset(p, k) + rank - p->mod[k].first_rank;
}

int sim_rank_node(const plan_t *p, int rank)
{
    return sim_rank_in_pool(p, rank) / p->cluster.pool[sim_rank_pool(p, rank)].gpus_per_node;
}

double plan_sim_msg_seconds(const plan_t *p, int src, int dst, double bytes)
{
    if (src == dst) return 0;
    int a = sim_rank_pool(p, src), b = sim_rank_pool(p, dst);
    bool same_node = a == b && sim_rank_node(p, src) == sim_rank_node(p, dst);
    return cost_p2p_time(&p->cluster, a, b, same_node, bytes);
}

/* All-reduce of `bytes` over every rank: each pool's ranks (whole nodes of
 * gpus_per_node, the last one rounded up) in parallel, then a ring over the
 * pools on the cross-pool link. */
static double world_allreduce_s(const plan_t *p, double bytes)
{
    int per_pool[COST_MAX_POOLS] = { 0 }, pools = 0;
    for (int r = 0; r < p->world_size; r++) per_pool[sim_rank_pool(p, r)]++;
    double t = 0;
    for (int i = 0; i < p->cluster.n_pools; i++) {
        int n = per_pool[i];
        if (n == 0) continue;
        pools++;
        const cost_pool *pool = &p->cluster.pool[i];
        int gpn = pool->gpus_per_node;
        double ti = n <= gpn ? cost_collective_time(pool, COST_ALLREDUCE, bytes, n, n)
                             : cost_collective_time(pool, COST_ALLREDUCE, bytes, (n + gpn - 1) / gpn * gpn, gpn);
        if (ti > t) t = ti;
    }
    if (pools > 1) {
        cost_pool ring = { .nodes = 1, .gpus_per_node = pools, .intra = p->cluster.cross_pool };
        t += cost_collective_time(&ring, COST_ALLREDUCE, bytes, pools, pools);
    }
    return t;
}

/* ---- op prices ---- */

static int stage_of(const plan_t *p, int k, int rank)
{
    plan_coord cd;
    return plan_rank_coord(p, k, rank, &cd) ? cd.pp : 0;
}

/* Module k's per-step terms on pipeline stage `stage` (plan_stage_step_time). */
static const plan_time *step_time(sim_pricer *pr, int k, int stage)
{
    if (!pr->have_step[k][stage]) {
        const plan_t *p = pr->p;
        /* the micro-batch's backward: the window the step reduction overlaps */
        plan_micro_time(&p->model, k, &p->mod[k], &p->work, &p->cluster, &pr->opt, p->mod[k].micro_batch, &pr->step[k][stage]);
        plan_stage_step_time(&p->model.mod[k], &p->mod[k], stage, &p->cluster.pool[p->mod[k].pool], &pr->opt,
                             &pr->step[k][stage]);
        pr->have_step[k][stage] = true;
    }
    return &pr->step[k][stage];
}

/* One micro-batch of `samples` through stage `stage` of module k: its compute and in-op communication, no hops. */
static const plan_time *micro_time(sim_pricer *pr, int k, int stage, int samples, plan_time *scratch)
{
    for (int i = 0; i < pr->n_micro; i++)
        if (pr->micro[i].module == k && pr->micro[i].stage == stage && pr->micro[i].samples == samples)
            return &pr->micro[i].t;
    const plan_t *p = pr->p;
    plan_stage_micro_time(&p->model, k, &p->mod[k], stage, &p->work, &p->cluster, &pr->opt, samples, scratch);
    if (pr->n_micro == pr->cap_micro) {
        int cap = pr->cap_micro ? 2 * pr->cap_micro : 16;
        sim_micro_entry *m = util_realloc(pr->micro, (size_t)cap * sizeof *m);
        if (!m) return scratch;   /* no memo: still correct */
        pr->micro = m;
        pr->cap_micro = cap;
    }
    pr->micro[pr->n_micro] = (sim_micro_entry){ k, stage, samples, *scratch };
    return &pr->micro[pr->n_micro++].t;
}

/* The rank's part of the gradient norm's local pass: each trained module on
 * it whose gradients it counts (plan_dp_counts_norm). */
static double norm_busy_s(sim_pricer *pr, int rank)
{
    double s = 0;
    for (int k = 0; k < pr->p->n_modules; k++) {
        plan_coord cd;
        if (!plan_rank_coord(pr->p, k, rank, &cd)) continue;
        plan_dp_rules r = plan_dp_rules_of(&pr->p->model.mod[k], &pr->p->mod[k]);
        if (plan_dp_counts_norm(&r, &cd)) s += step_time(pr, k, cd.pp)->norm_s;
    }
    return s;
}

plan_sim_cost sim_price(sim_pricer *pr, int rank, const plan_op *op)
{
    plan_sim_cost c = { 0, 0, 0 };
    plan_time scratch;
    const plan_time *t;
    const plan_t *p = pr->p;
    int stage = op->module >= 0 ? stage_of(p, op->module, rank) : 0;
    int vstage = op->module >= 0 ? op->vchunk * p->mod[op->module].pp + stage : 0;   /* the op's model chunk */
    switch (op->kind) {
    case PLAN_OP_FORWARD:
        t = micro_time(pr, op->module, vstage, op->samples, &scratch);
        c.busy_s = t->fwd_s;
        c.comm_s = t->fwd_comm_s;
        c.syncs = t->fwd_syncs;
        break;
    case PLAN_OP_BACKWARD:
        t = micro_time(pr, op->module, vstage, op->samples, &scratch);
        c.busy_s = t->bwd_s + t->recompute_s;
        c.comm_s = plan_time_backward_s(t) - c.busy_s;
        c.syncs = t->bwd_syncs;
        break;
    case PLAN_OP_FORWARD_BACKWARD:
        t = micro_time(pr, op->module, vstage, op->samples, &scratch);
        c.busy_s = t->fwd_s + t->bwd_s + t->recompute_s;
        c.comm_s = t->micro_s - c.busy_s;
        c.syncs = t->fwd_syncs + t->bwd_syncs;
        break;
    /* the part the last backward does not hide (plan_step_comm_share: the
     * Megatron target's overlapped buckets; 1 on the dhp target, whose
     * grad_sync_s is already what is left) */
    case PLAN_OP_GRAD_SYNC:
        t = step_time(pr, op->module, stage);
        c.busy_s = t->grad_sync_busy_s * plan_step_comm_share(t);
        c.comm_s = t->grad_sync_s * plan_step_comm_share(t);
        break;
    case PLAN_OP_PARAM_GATHER:
        t = step_time(pr, op->module, stage);
        c.busy_s = t->param_gather_busy_s * plan_step_comm_share(t);
        c.comm_s = t->param_gather_s * plan_step_comm_share(t);
        break;
    case PLAN_OP_EMBED_SYNC: {
        const plan_module *s = &p->mod[op->module];
        plan_group g;
        int per_node = plan_embed_group_of(p, op->module, rank, &g) ? g.per_node : 1;
        c.comm_s = plan_embed_sync_s(&p->model.mod[op->module], s, &p->cluster.pool[s->pool], &pr->opt, per_node);
        break;
    }
    case PLAN_OP_GRAD_NORM:
        if (!pr->have_norm) { pr->norm_s = world_allreduce_s(p, 8.0); pr->have_norm = true; }
        c.busy_s = norm_busy_s(pr, rank);
        c.comm_s = pr->norm_s;
        break;
    case PLAN_OP_OPTIMIZER:
        c.busy_s = step_time(pr, op->module, stage)->optim_s;
        break;
    default:
        break;
    }
    if (c.comm_s < 0) c.comm_s = 0;   /* rounding of micro_s - busy */
    return c;
}

void sim_pricer_free(sim_pricer *pr)
{
    util_free(pr->micro);
    pr->micro = NULL;
    pr->n_micro = pr->cap_micro = 0;
}

plan_sim_cost plan_sim_op_cost(const plan_t *p, int rank, const plan_op *op)
{
    sim_pricer pr = { .p = p, .opt = plan_options_of(p) };
    plan_sim_cost c = sim_price(&pr, rank, op);
    sim_pricer_free(&pr);
    return c;
}

plan_hop_wire sim_stage_hop(const plan_t *p, int k, int samples, bool grad)
{
    plan_options o = plan_options_of(p);
    const plan_module *s = &p->mod[k];
    return plan_stage_hop_wire(&p->model.mod[k], s, &p->cluster.pool[s->pool], &o,
                               plan_stage_hop_bytes(&p->model, k, s, &p->work, &o, samples), grad);
}
