/* The step simulator: every rank's schedule (planner/schedule.c) walked op by
 * op, each op priced by the cost model (sim_price.c), point-to-point
 * messages (sim_messages.c) and collectives synchronising the ranks; see
 * planner.h for the rules. */
#include "planner/sim_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_collective(const plan_op *op) { return plan_op_props(op->kind)->collective; }

/* ---- collectives ---- */

/* One collective instance: GRAD_NORM over the world, or an op of module k
 * over one of its groups (plan_op_info.group, plan_group_of). */
typedef struct {
    int expected, joined;
    double last_join_s, comm_s;
    int last_rank, last_op;
} collective;

typedef struct {
    collective *c;
    int n, max_groups;
} collective_table;

/* The group an op synchronises (plan_op_info.group): false if the rank is not in one. */
static bool op_group(const plan_t *p, int rank, const plan_op *op, plan_group *g)
{
    switch (plan_op_props(op->kind)->group) {
    case PLAN_GROUP_SHARD: return plan_group_of(p, op->module, PLAN_AX_SHARD, rank, g);
    case PLAN_GROUP_EMBED: return plan_embed_group_of(p, op->module, rank, g);
    default: return false;
    }
}

static int collective_index(const plan_t *p, const collective_table *t, int rank, const plan_op *op)
{
    if (plan_op_props(op->kind)->group == PLAN_GROUP_WORLD) return 0;
    plan_group g = { 0 };
    op_group(p, rank, op, &g);
    return 1 + ((int)op->kind * p->n_modules + op->module) * t->max_groups + g.color;
}

/* One instance per (op kind, module, group): each module's groups number at most its ranks. */
static int build_collectives(const plan_t *p, collective_table *t, char *err)
{
    t->max_groups = 1;
    for (int k = 0; k < p->n_modules; k++)
        if (p->mod[k].n_ranks > t->max_groups) t->max_groups = p->mod[k].n_ranks;
    t->n = 1 + PLAN_NOPS * p->n_modules * t->max_groups;
    t->c = util_calloc((size_t)t->n, sizeof *t->c);
    if (!t->c) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for collectives");
    t->c[0].expected = p->world_size;
    return UTIL_OK;
}

/* The members a collective waits for: its group's size. */
static void expect_members(const plan_t *p, collective *c, int rank, const plan_op *op)
{
    plan_group g;
    if (c->expected == 0) c->expected = op_group(p, rank, op, &g) ? g.size : 1;
}

/* ---- the walk ---- */

typedef struct {
    const plan_t *p;
    const plan_sim_hooks *hooks;
    sim_pricer pr;
    plan_schedule *sched;
    sim_messages msg;
    collective_table coll;
    int *next;                 /* per rank: index of its next op */
    double *now;               /* per rank: end of its last op */
    bool *joined;              /* per rank: joined the collective of its next op */
    plan_sim_result *r;
    /* Processors shared between ranks (cost_pool.speed, set_of): the time-ordered walk. */
    bool shared;
    bool *computing;           /* per rank: in the compute part of its next op */
    bool *computed;            /* per rank: its next op was priced, its compute part started */
    int *set;                  /* per rank: the lowest rank sharing its processors */
    double *work;              /* per rank: compute seconds left at speed 1, as of seg_s */
    double *seg_s, *speed;     /* per rank: since when it runs at speed */
    bool *active;              /* per rank: computing, not held at an exchange by a peer (shared_rates) */
    double *rate, *coupled;    /* per rank: shared_rates' scratch */
    plan_sim_cost *cost;       /* per rank: the price of its next op */
} sim;

static plan_sim_cost op_cost(sim *S, int rank, const plan_op *op)
{
    if (S->hooks && S->hooks->op_cost) return S->hooks->op_cost(S->hooks->ctx, S->p, rank, op);
    return sim_price(&S->pr, rank, op);
}

/* The message's transfer, and a scattered stage hop's all-gather once it is in. */
static double msg_cost(sim *S, const sim_message *m)
{
    if (m->src == m->dst) return 0;
    if (S->hooks && S->hooks->msg_seconds)
        return S->hooks->msg_seconds(S->hooks->ctx, S->p, m->src, m->dst, m->bytes) + m->gather_s;
    return plan_sim_msg_seconds(S->p, m->src, m->dst, m->bytes) + m->gather_s;
}

static int check_finite(const plan_t *p, int rank, const plan_op *op, double v, char *err)
{
    if (isfinite(v) && v >= 0) return UTIL_OK;
    char name[96];
    plan_sim_op_label(p, op, name, sizeof name);
    return util_fail(err, UTIL_EINVAL, "simulate: rank %d: %s has no finite cost (%g s): a group placement the cluster cannot hold",
                     rank, name, v);
}

static void finish(sim *S, int rank, plan_sim_op *rec)
{
    S->now[rank] = rec->end_s;
    S->next[rank]++;
    S->joined[rank] = false;
}

static void own_dep(plan_sim_op *rec, int rank, int i)
{
    rec->dep_rank = i > 0 ? rank : -1;
    rec->dep_op = i > 0 ? i - 1 : -1;
}

/* The messages a transfer op moves: the hand-off group's, or its one pipeline hop. */
static bool op_messages(const sim *S, int rank, const plan_op *op, int *first, int *end, bool *hop)
{
    const plan_op_info *in = plan_op_props(op->kind);
    *hop = in->group == PLAN_GROUP_STAGE;
    if (*hop) {
        int m = S->msg.stage_msg[rank][S->next[rank]];
        *first = m;
        *end = m + 1;
        return m >= 0;
    }
    int g = sim_handoff_group(S->p, op->module, op->chunk, in->grad);
    *first = S->msg.group_first[g];
    *end = *first + S->msg.group_n[g];
    return true;
}

/* A send that first frees an earlier chunk's sends (plan_op.retires: a
 * frozen encoder's rows) waits until their receivers took them; false
 * while one has not. *t: when the last of them did, if after *t (the op
 * then depends on that receive). */
static bool retired_taken(const sim *S, int rank, const plan_op *op, double *t, plan_sim_op *rec)
{
    if (op->retires < 0) return true;
    int g = sim_handoff_group(S->p, op->module, op->retires, plan_op_retired_grad(op->kind)), last = -1;
    for (int i = S->msg.group_first[g]; i < S->msg.group_first[g] + S->msg.group_n[g]; i++) {
        const sim_message *m = &S->msg.m[i];
        if (m->src != rank || m->dst == rank) continue;
        if (!m->taken) return false;
        if (last < 0 || m->taken_s > S->msg.m[last].taken_s) last = i;
    }
    if (last >= 0 && S->msg.m[last].taken_s > *t) {
        *t = S->msg.m[last].taken_s;
        rec->dep_rank = S->msg.m[last].dst;
        rec->dep_op = S->msg.m[last].recv_op;
    }
    return true;
}

static int do_send(sim *S, int rank, const plan_op *op, plan_sim_op *rec, bool *progress, char *err)
{
    int first, end;
    bool hop;
    *progress = false;
    if (!op_messages(S, rank, op, &first, &end, &hop)) return util_fail(err, UTIL_EINVAL, "simulate: rank %d: a pipeline send without its message", rank);
    double t = S->now[rank], held = t;
    if (!retired_taken(S, rank, op, &t, rec)) return UTIL_OK;
    for (int i = first; i < end; i++) {
        sim_message *m = &S->msg.m[i];
        if (m->src != rank) continue;
        double d = msg_cost(S, m);
        int rc = check_finite(S->p, rank, op, d, err);
        if (!rc) rc = sim_message_send(S->p, &S->msg, i, t, d, err);
        if (rc) return rc;
        m->send_op = S->next[rank];
        rec->bytes += m->bytes;
        /* a blocking send (DeepSpeed's pipeline engine) holds the sender's
         * stream until its transfer is across; the receiver's readiness is
         * not awaited (a rendezvous would deadlock dhp's 1F1B order, which
         * DeepSpeed avoids by ordering even and odd stages apart); do_recv
         * holds the receiver likewise */
        if (m->held && m->arrive_s - m->gather_s > held) held = m->arrive_s - m->gather_s;
    }
    rec->begin_s = t;
    rec->end_s = held > t ? held : t;
    *progress = true;
    return UTIL_OK;
}

/* Returns false while a message for it is still unsent. */
static bool do_recv(sim *S, int rank, const plan_op *op, plan_sim_op *rec)
{
    int first, end, last = -1;
    bool hop;
    double bytes = 0, t = S->now[rank], held = t;
    if (!op_messages(S, rank, op, &first, &end, &hop)) return false;
    for (int i = first; i < end; i++) {
        const sim_message *m = &S->msg.m[i];
        if (m->dst != rank) continue;
        if (!m->sent) return false;
        bytes += m->bytes;
        if (last < 0 || m->arrive_s > S->msg.m[last].arrive_s) last = i;
        /* a blocking transfer (DeepSpeed's pipeline engine, plan_hop_wire.held;
         * the Megatron target's waited exchanges, recv_waits) holds the
         * receiver for its own duration too, from when it posts */
        if ((m->held || m->recv_waits) && t + (m->arrive_s - m->start_s) > held) held = t + (m->arrive_s - m->start_s);
    }
    rec->bytes = bytes;
    rec->begin_s = rec->end_s = t;
    if (last >= 0 && S->msg.m[last].arrive_s > t) rec->begin_s = rec->end_s = S->msg.m[last].arrive_s;
    bool own = held > rec->end_s;   /* the receiver's own hold outlasts the wait for the message */
    if (own) {
        rec->begin_s = t;
        rec->end_s = held;
        rec->comm_s = held - t;
    }
    for (int i = first; i < end; i++) {   /* taken: a sender waiting to free them may go on (retired_taken) */
        sim_message *m = &S->msg.m[i];
        if (m->dst != rank) continue;
        m->taken = true;
        m->taken_s = rec->end_s;
        m->recv_op = S->next[rank];
    }
    if (own || last < 0 || S->msg.m[last].arrive_s <= t) return true;
    const sim_message *m = &S->msg.m[last];
    rec->comm_s = m->arrive_s - (m->start_s > t ? m->start_s : t);
    /* The chain: a message that waited for its channel waited for the previous one. */
    while (m->prev >= 0 && m->start_s > m->sent_s && S->msg.m[m->prev].arrive_s == m->start_s) m = &S->msg.m[m->prev];
    rec->dep_rank = m->src;
    rec->dep_op = m->send_op;
    return true;
}

static void join_collective(sim *S, int rank, collective *c, double join_s, double comm_s)
{
    if (c->joined == 0 || join_s > c->last_join_s) {
        c->last_join_s = join_s;
        c->last_rank = rank;
        c->last_op = S->next[rank];
    }
    if (comm_s > c->comm_s) c->comm_s = comm_s;
    c->joined++;
    S->joined[rank] = true;
}

/* Joins the collective once (after its compute part, busy_s); returns
 * false until every participant has. */
static int do_collective(sim *S, int rank, const plan_op *op, plan_sim_op *rec, bool *done, char *err)
{
    collective *c = &S->coll.c[collective_index(S->p, &S->coll, rank, op)];
    expect_members(S->p, c, rank, op);
    *done = false;
    if (!S->joined[rank]) {
        plan_sim_cost cost = op_cost(S, rank, op);
        int rc = check_finite(S->p, rank, op, cost.busy_s + cost.comm_s, err);
        if (rc) return rc;
        rec->busy_s = cost.busy_s;
        join_collective(S, rank, c, S->now[rank] + cost.busy_s, cost.comm_s);
    }
    if (c->joined < c->expected) return UTIL_OK;
    rec->begin_s = c->last_join_s;
    rec->comm_s = c->comm_s;
    rec->end_s = c->last_join_s + c->comm_s;
    if (c->last_rank != rank) { rec->dep_rank = c->last_rank; rec->dep_op = c->last_op; }
    *done = true;
    return UTIL_OK;
}

/* The record of rank's op i, reached now: it depends on the rank's previous op. */
static void open_record(const sim *S, int rank, int i, plan_sim_op *rec)
{
    memset(rec, 0, sizeof *rec);
    rec->op = S->sched[rank].op[i];
    rec->start_s = S->now[rank];
    own_dep(rec, rank, i);
}

/* Runs rank's next op if it can; *progress tells whether it did. */
static int step_rank(sim *S, int rank, bool *progress, char *err)
{
    *progress = false;
    const plan_schedule *s = &S->sched[rank];
    int i = S->next[rank];
    if (i >= s->n) return UTIL_OK;
    const plan_op *op = &s->op[i];
    plan_sim_op *rec = &S->r->rank[rank].ops[i];
    if (!S->joined[rank]) open_record(S, rank, i, rec);
    int rc = UTIL_OK;
    switch (op->kind) {
    default:
        if (plan_op_props(op->kind)->transfer && plan_op_props(op->kind)->sends) {
            rc = do_send(S, rank, op, rec, progress, err);
        } else if (plan_op_props(op->kind)->transfer) {
            *progress = do_recv(S, rank, op, rec);
        } else if (is_collective(op)) {
            rc = do_collective(S, rank, op, rec, progress, err);
        } else {
            plan_sim_cost c = op_cost(S, rank, op);
            rc = check_finite(S->p, rank, op, c.busy_s + c.comm_s, err);
            rec->busy_s = c.busy_s;
            rec->comm_s = c.comm_s;
            rec->begin_s = rec->start_s;
            rec->end_s = rec->start_s + c.busy_s + c.comm_s;
            *progress = !rc;
        }
        break;
    }
    if (!rc && *progress) finish(S, rank, rec);
    return rc;
}

static int deadlock(const sim *S, char *err)
{
    for (int r = 0; r < S->p->world_size; r++)
        if (S->next[r] < S->sched[r].n) {
            char name[96];
            plan_sim_op_label(S->p, &S->sched[r].op[S->next[r]], name, sizeof name);
            return util_fail(err, UTIL_EINVAL, "simulate: the schedule deadlocks: rank %d waits forever at op %d (%s)",
                             r, S->next[r], name);
        }
    return util_fail(err, UTIL_EINVAL, "simulate: the schedule deadlocks");
}

static int walk(sim *S, char *err)
{
    int world = S->p->world_size;
    for (;;) {
        bool any = false, all_done = true;
        for (int r = 0; r < world; r++) {
            bool moved = true;
            while (moved) {
                int rc = step_rank(S, r, &moved, err);
                if (rc) return rc;
                any |= moved;
            }
            if (S->next[r] < S->sched[r].n) all_done = false;
        }
        if (all_done) return UTIL_OK;
        if (!any) return deadlock(S, err);
    }
}

/* ---- the time-ordered walk: processors shared between a node's ranks ----
 *
 * On a host whose ranks share cores (cost_pool.speed, measured by dhp
 * profile), a rank computes faster while others wait: its compute part
 * (busy_s, priced for a rank computing alone) advances at
 * cost_compute_speed(pool, ranks of its processor set computing now). Ops therefore
 * run in time order: at each instant every rank that can move does, then
 * time jumps to the next compute end, message arrival or collective end. */

/* Every op but a hand-off transfer has a part the rank computes before it exchanges (busy_s, possibly 0). */
static bool op_has_compute(plan_op_kind k) { return !plan_op_props(k)->transfer; }

static double compute_end(const sim *S, int r)
{
    return S->speed[r] > 0 ? S->seg_s[r] + S->work[r] / S->speed[r] : INFINITY;   /* 0: held by a peer */
}

/* Rank r's weight in sharing its processors (cost_share_weight): its
 * compute seconds between blocking exchanges. */
static double share_weight(const sim *S, int r)
{
    const plan_sim_cost *c = &S->cost[r];
    double interval = c->syncs > 0 ? c->busy_s / c->syncs : INFINITY;
    return cost_share_weight(&S->p->cluster.pool[sim_rank_pool(S->p, r)], interval);
}

/* Rank r's speed while `busy` ranks of its set compute, of total weight
 * `weight`: the set's throughput, busy x compute_speed(busy), split by
 * weight; at most one processor's worth. */
static double shared_speed(const sim *S, int r, int busy, double weight)
{
    double even = cost_compute_speed(&S->p->cluster.pool[sim_rank_pool(S->p, r)], busy);
    if (busy < 2) return even;
    double v = busy * even * share_weight(S, r) / weight;
    return v < 1 ? v : 1;
}

static bool same_group(const plan_t *p, int k, unsigned axes, int r, int q)
{
    plan_group a, b;
    return plan_group_of(p, k, axes, r, &a) && plan_group_of(p, k, axes, q, &b) && a.color == b.color;
}

/* Does q exchange with r inside r's next op? Its tensor- and
 * sequence-parallel peers (the same module replica) do, and under ZeRO-2/3
 * the ranks of its shard group, whose units it gathers or reduces with. */
static bool exchange_peer(const sim *S, int r, int q)
{
    if (q == r || S->cost[r].syncs <= 0) return false;
    int k = S->sched[r].op[S->next[r]].module;
    if (same_group(S->p, k, PLAN_AX_TP | PLAN_AX_SP, r, q)) return true;
    plan_dp_rules dp = plan_dp_rules_of(&S->p->model.mod[k], &S->p->mod[k]);
    return (dp.unit_param_gather || dp.unit_grad_reduce) && same_group(S->p, k, PLAN_AX_SHARD, r, q);
}

/* Rank r's op exchanges with a peer that has not reached its compute: r
 * waits at its first exchange (a module's peers run the same list of ops). */
static bool waits_for_peer(const sim *S, int r)
{
    for (int q = 0; q < S->p->world_size; q++)
        if (exchange_peer(S, r, q) && (S->next[q] < S->next[r] || (S->next[q] == S->next[r] && !S->computed[q])))
            return true;
    return false;
}

/* Every computing rank's speed now, in S->rate: its set's share among the
 * ranks not held by a peer, then an op with exchanges at its slowest peer's
 * (the peers meet at every exchange). */
static void shared_rates(sim *S)
{
    int world = S->p->world_size;
    for (int r = 0; r < world; r++) S->active[r] = S->computing[r] && !waits_for_peer(S, r);
    for (int r = 0; r < world; r++) {
        S->rate[r] = 0;
        if (!S->active[r]) continue;
        int busy = 0;
        double weight = 0;
        for (int q = 0; q < world; q++)
            if (S->active[q] && S->set[q] == S->set[r]) { busy++; weight += share_weight(S, q); }
        S->rate[r] = shared_speed(S, r, busy, weight);
    }
    for (int r = 0; r < world; r++) {
        S->coupled[r] = S->rate[r];
        if (!S->active[r]) continue;
        for (int q = 0; q < world; q++)
            if (S->active[q] && S->next[q] == S->next[r] && exchange_peer(S, r, q) && S->rate[q] < S->coupled[r])
                S->coupled[r] = S->rate[q];
    }
    for (int r = 0; r < world; r++) S->rate[r] = S->coupled[r];
}

/* Re-rates every computing rank for the ranks computing on its processors now. */
static void update_speeds(sim *S, double t)
{
    shared_rates(S);
    for (int r = 0; r < S->p->world_size; r++) {
        if (!S->computing[r]) continue;
        double v = S->rate[r];
        if (v == S->speed[r]) continue;
        S->work[r] -= (t - S->seg_s[r]) * S->speed[r];
        if (S->work[r] < 0) S->work[r] = 0;
        S->seg_s[r] = t;
        S->speed[r] = v;
    }
}

/* The part of an op after its compute, which ended at S->now[rank]. */
static int after_compute(sim *S, int rank, const plan_op *op, plan_sim_op *rec, bool *progress, char *err)
{
    const plan_sim_cost *c = &S->cost[rank];
    if (!S->joined[rank]) rec->busy_s = S->now[rank] - rec->start_s;
    if (is_collective(op)) {
        collective *cl = &S->coll.c[collective_index(S->p, &S->coll, rank, op)];
        expect_members(S->p, cl, rank, op);
        if (!S->joined[rank]) join_collective(S, rank, cl, S->now[rank], c->comm_s);
        return do_collective(S, rank, op, rec, progress, err);
    }
    rec->comm_s = c->comm_s;
    rec->begin_s = rec->start_s;
    rec->end_s = S->now[rank] + c->comm_s;
    *progress = true;
    return UTIL_OK;
}

/* Moves rank's next op at S->now[rank] if it can: starts its compute part,
 * or finishes it; *progress tells whether anything changed. */
static int step_rank_shared(sim *S, int rank, bool *progress, char *err)
{
    *progress = false;
    const plan_schedule *s = &S->sched[rank];
    int i = S->next[rank];
    if (i >= s->n) return UTIL_OK;
    const plan_op *op = &s->op[i];
    if (!op_has_compute(op->kind)) return step_rank(S, rank, progress, err);
    plan_sim_op *rec = &S->r->rank[rank].ops[i];
    int rc = UTIL_OK;
    if (!S->computed[rank]) {
        open_record(S, rank, i, rec);
        S->cost[rank] = op_cost(S, rank, op);
        if ((rc = check_finite(S->p, rank, op, S->cost[rank].busy_s + S->cost[rank].comm_s, err))) return rc;
        S->computed[rank] = true;
        if (S->cost[rank].busy_s > 0) {
            S->computing[rank] = true;
            S->work[rank] = S->cost[rank].busy_s;
            S->seg_s[rank] = S->now[rank];
            S->speed[rank] = 0;      /* rated by update_speeds */
            *progress = true;
            return UTIL_OK;
        }
    }
    rc = after_compute(S, rank, op, rec, progress, err);
    if (!rc && *progress) { finish(S, rank, rec); S->computed[rank] = false; }
    return rc;
}

static int walk_shared(sim *S, char *err)
{
    int world = S->p->world_size;
    double t = 0;
    for (;;) {
        for (bool moved = true; moved;) {
            moved = false;
            for (int r = 0; r < world; r++)
                for (bool m = true; m && !S->computing[r] && S->now[r] <= t;) {
                    int rc = step_rank_shared(S, r, &m, err);
                    if (rc) return rc;
                    moved |= m;
                }
        }
        update_speeds(S, t);
        double next = INFINITY;
        bool all_done = true;
        for (int r = 0; r < world; r++) {
            if (S->next[r] >= S->sched[r].n) continue;
            all_done = false;
            if (S->computing[r]) next = fmin(next, compute_end(S, r));
            else if (S->now[r] > t) next = fmin(next, S->now[r]);
        }
        if (all_done) return UTIL_OK;
        if (!isfinite(next)) return deadlock(S, err);
        t = next;
        for (int r = 0; r < world; r++)
            if (S->computing[r] && compute_end(S, r) <= t) {
                S->computing[r] = false;
                S->now[r] = t;
            }
    }
}

static bool same_collective(const plan_sim_op *a, const plan_sim_op *b)
{
    return plan_op_props(a->op.kind)->collective && a->op.kind == b->op.kind && a->op.module == b->op.module
        && a->end_s == b->end_s;
}

/* From the op that ends last, back through whatever each op waited for. */
static int critical_path(plan_sim_result *r, char *err)
{
    int rank = -1;
    for (int i = 0; i < r->world_size; i++)
        if (r->rank[i].n_ops && (rank < 0 || r->rank[i].end_s > r->rank[rank].end_s)) rank = i;
    if (rank < 0) return UTIL_OK;
    int total = 0;
    for (int i = 0; i < r->world_size; i++) total += r->rank[i].n_ops;
    r->path = util_malloc((size_t)total * sizeof *r->path);
    if (!r->path) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for the critical path");
    int op = r->rank[rank].n_ops - 1;
    while (rank >= 0 && r->n_path < total) {
        const plan_sim_op *cur = &r->rank[rank].ops[op];
        int dr = cur->dep_rank, dop = cur->dep_op;
        bool skip = dr >= 0 && dr != rank && same_collective(cur, &r->rank[dr].ops[dop]);
        if (!skip) r->path[r->n_path++] = (plan_sim_ref){ rank, op };
        rank = dr;
        op = dop;
    }
    for (int i = 0, j = r->n_path - 1; i < j; i++, j--) {
        plan_sim_ref t = r->path[i];
        r->path[i] = r->path[j];
        r->path[j] = t;
    }
    return UTIL_OK;
}

static void totals(plan_sim_result *r)
{
    r->step_time_s = 0;
    for (int i = 0; i < r->world_size; i++) {
        plan_sim_rank *rk = &r->rank[i];
        for (int j = 0; j < rk->n_ops; j++) {
            rk->busy_s += rk->ops[j].busy_s;
            rk->comm_s += rk->ops[j].comm_s;
            if (rk->ops[j].end_s > rk->end_s) rk->end_s = rk->ops[j].end_s;
        }
        if (rk->end_s > r->step_time_s) r->step_time_s = rk->end_s;
    }
    for (int i = 0; i < r->world_size; i++) {
        plan_sim_rank *rk = &r->rank[i];
        rk->idle_s = fmax(0.0, r->step_time_s - rk->busy_s - rk->comm_s);
    }
}

static void free_sim(sim *S)
{
    if (S->sched)
        for (int i = 0; i < S->p->world_size; i++) plan_schedule_free(&S->sched[i]);
    util_free(S->sched);
    sim_free_messages(S->p, &S->msg);
    util_free(S->coll.c);
    util_free(S->next);
    util_free(S->now);
    util_free(S->joined);
    sim_pricer_free(&S->pr);
    util_free(S->computing);
    util_free(S->computed);
    util_free(S->set);
    util_free(S->work);
    util_free(S->seg_s);
    util_free(S->speed);
    util_free(S->active);
    util_free(S->rate);
    util_free(S->coupled);
    util_free(S->cost);
}

static bool pools_share_processors(const plan_t *p)
{
    for (int i = 0; i < p->cluster.n_pools; i++)
        if (p->cluster.pool[i].n_speed > 0) return true;
    return false;
}

/* Do ranks a and b share processors (same node, same set of it)? */
static bool same_processors(const plan_t *p, int a, int b)
{
    int pa = sim_rank_pool(p, a);
    if (pa != sim_rank_pool(p, b) || sim_rank_node(p, a) != sim_rank_node(p, b)) return false;
    const cost_pool *pool = &p->cluster.pool[pa];
    if (!pool->has_sets) return true;
    int la = sim_rank_in_pool(p, a) % pool->gpus_per_node, lb = sim_rank_in_pool(p, b) % pool->gpus_per_node;
    return la < COST_MAX_SPEED && lb < COST_MAX_SPEED && pool->set_of[la] == pool->set_of[lb];
}

static int setup_sharing(sim *S, char *err)
{
    const plan_t *p = S->p;
    int world = p->world_size;
    S->shared = pools_share_processors(p);
    if (!S->shared) return UTIL_OK;
    S->computing = util_calloc((size_t)world, sizeof *S->computing);
    S->computed = util_calloc((size_t)world, sizeof *S->computed);
    S->set = util_calloc((size_t)world, sizeof *S->set);
    S->work = util_calloc((size_t)world, sizeof *S->work);
    S->seg_s = util_calloc((size_t)world, sizeof *S->seg_s);
    S->speed = util_calloc((size_t)world, sizeof *S->speed);
    S->cost = util_calloc((size_t)world, sizeof *S->cost);
    S->active = util_calloc((size_t)world, sizeof *S->active);
    S->rate = util_calloc((size_t)world, sizeof *S->rate);
    S->coupled = util_calloc((size_t)world, sizeof *S->coupled);
    if (!S->computing || !S->computed || !S->set || !S->work || !S->seg_s || !S->speed || !S->cost || !S->active
        || !S->rate || !S->coupled)
        return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for %d ranks", world);
    for (int r = 0; r < world; r++) {
        S->set[r] = r;
        for (int q = 0; q < r; q++)
            if (same_processors(p, q, r)) { S->set[r] = q; break; }
    }
    return UTIL_OK;
}

static int setup(sim *S, char *err)
{
    const plan_t *p = S->p;
    int world = p->world_size;
    plan_sim_result *r = S->r;
    S->sched = util_calloc((size_t)world, sizeof *S->sched);
    S->next = util_calloc((size_t)world, sizeof *S->next);
    S->now = util_calloc((size_t)world, sizeof *S->now);
    S->joined = util_calloc((size_t)world, sizeof *S->joined);
    r->rank = util_calloc((size_t)world, sizeof *r->rank);
    if (!S->sched || !S->next || !S->now || !S->joined || !r->rank)
        return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for %d ranks", world);
    r->world_size = world;
    sim_handoff_table *handoff;
    int rc = sim_handoff_table_build(p, &handoff, err);
    if (rc) return rc;
    for (int i = 0; !rc && i < world; i++) {
        util_progress("simulate: scheduling ranks", i, world);
        if ((rc = plan_schedule_rank(p, i, &S->sched[i], err))) break;
        r->rank[i].n_ops = S->sched[i].n;
        r->rank[i].ops = util_calloc((size_t)(S->sched[i].n ? S->sched[i].n : 1), sizeof(plan_sim_op));
        if (!r->rank[i].ops) rc = util_fail(err, UTIL_ENOMEM, "simulate: out of memory for rank %d's ops", i);
        else sim_rank_memory(p, i, &S->sched[i], handoff, &r->rank[i].mem);
    }
    sim_handoff_table_free(handoff);
    if (rc) return rc;
    util_progress("simulate: scheduling ranks", world, world);
    rc = sim_build_messages(p, S->sched, &S->msg, err);
    if (!rc) rc = build_collectives(p, &S->coll, err);
    return rc ? rc : setup_sharing(S, err);
}

int plan_sim_run(const plan_t *p, const plan_sim_hooks *hooks, plan_sim_result *r, char *err)
{
    memset(r, 0, sizeof *r);
    int rc = plan_sim_check_size(p, err);
    if (!rc) rc = plan_schedule_check(p, err);
    if (rc) return rc;
    if (p->world_size < 1) return util_fail(err, UTIL_EINVAL, "simulate: the plan has no ranks");
    sim S = { .p = p, .hooks = hooks, .r = r, .pr = { .p = p, .opt = plan_options_of(p) } };
    rc = setup(&S, err);
    if (!rc) rc = S.shared ? walk_shared(&S, err) : walk(&S, err);
    free_sim(&S);
    if (!rc) {
        totals(r);
        rc = critical_path(r, err);
    }
    if (rc) plan_sim_free(r);
    return rc;
}

void plan_sim_free(plan_sim_result *r)
{
    if (r->rank)
        for (int i = 0; i < r->world_size; i++) util_free(r->rank[i].ops);
    util_free(r->rank);
    util_free(r->path);
    memset(r, 0, sizeof *r);
}

