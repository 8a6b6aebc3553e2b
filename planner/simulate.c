/* The step simulator: every rank's schedule (planner/schedule.c) walked op by
 * op, each op priced by the cost model (planner/cost.c), hand-off messages
 * and collectives synchronising the ranks; see planner.h for the rules. */
#include "planner/planner.h"

#define FP32_BYTES 4.0

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static plan_options plan_opts(const plan_t *p)
{
    plan_options o;
    plan_options_default(&o);
    o.precision = p->precision;
    return o;
}

static bool is_collective_kind(plan_op_kind k)
{
    return k == PLAN_OP_GRAD_SYNC || k == PLAN_OP_GRAD_NORM || k == PLAN_OP_OPTIMIZER;
}

/* ZeRO-1 shards the optimizer over dp x sp and all-gathers the parameters after it. */
static bool optimizer_gathers(const plan_module *s) { return s->zero >= 1 && s->dp * s->sp > 1; }

/* Does rank `rank`'s op synchronise with other ranks (start when the last joins)? */
static bool op_is_collective(const plan_t *p, const plan_op *op)
{
    if (op->kind == PLAN_OP_OPTIMIZER) return optimizer_gathers(&p->mod[op->module]);
    return op->kind == PLAN_OP_GRAD_SYNC || op->kind == PLAN_OP_GRAD_NORM;
}

/* ---- where ranks are ---- */

static int module_of_rank(const plan_t *p, int rank)
{
    for (int k = 0; k < p->n_modules; k++)
        if (rank >= p->mod[k].first_rank && rank < p->mod[k].first_rank + p->mod[k].n_ranks) return k;
    return -1;
}

static int rank_pool(const plan_t *p, int rank)
{
    int k = module_of_rank(p, rank);
    return k < 0 ? 0 : p->mod[k].pool;
}

/* Position of a rank among its pool's GPUs (pools start on node boundaries). */
static int rank_in_pool(const plan_t *p, int rank)
{
    int k = module_of_rank(p, rank);
    return k < 0 ? 0 : plan_pool_offset(p, k) + rank - p->mod[k].first_rank;
}

static int rank_node(const plan_t *p, int rank)
{
    return rank_in_pool(p, rank) / p->cluster.pool[rank_pool(p, rank)].gpus_per_node;
}

double plan_sim_msg_seconds(const plan_t *p, int src, int dst, double bytes)
{
    if (src == dst) return 0;
    int a = rank_pool(p, src), b = rank_pool(p, dst);
    bool same_node = a == b && rank_node(p, src) == rank_node(p, dst);
    return cost_p2p_time(&p->cluster, a, b, same_node, bytes);
}

/* All-reduce of `bytes` over every rank: each pool's ranks (whole nodes of
 * gpus_per_node, the last one rounded up) in parallel, then a ring over the
 * pools on the cross-pool link. */
static double world_allreduce_s(const plan_t *p, double bytes)
{
    int per_pool[COST_MAX_POOLS] = { 0 }, pools = 0;
    for (int r = 0; r < p->world_size; r++) per_pool[rank_pool(p, r)]++;
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

/* Memoised plan_micro_time per (module, samples) and plan_module_time per module. */
typedef struct { int module, samples; plan_time t; } micro_entry;
typedef struct {
    const plan_t *p;
    plan_options opt;
    plan_time step[MODEL_MAX_MODULES];
    bool have_step[MODEL_MAX_MODULES];
    micro_entry *micro;
    int n_micro, cap_micro;
    double norm_s;
    bool have_norm;
} pricer;

static const plan_time *step_time(pricer *pr, int k)
{
    if (!pr->have_step[k]) {
        const plan_t *p = pr->p;
        plan_module_time(&p->model, k, &p->mod[k], &p->work, &p->cluster, &pr->opt, &pr->step[k]);
        pr->have_step[k] = true;
    }
    return &pr->step[k];
}

static const plan_time *micro_time(pricer *pr, int k, int samples, plan_time *scratch)
{
    for (int i = 0; i < pr->n_micro; i++)
        if (pr->micro[i].module == k && pr->micro[i].samples == samples) return &pr->micro[i].t;
    const plan_t *p = pr->p;
    plan_micro_time(&p->model, k, &p->mod[k], &p->work, &p->cluster, &pr->opt, samples, scratch);
    if (pr->n_micro == pr->cap_micro) {
        int cap = pr->cap_micro ? 2 * pr->cap_micro : 16;
        micro_entry *m = util_realloc(pr->micro, (size_t)cap * sizeof *m);
        if (!m) return scratch;   /* no memo: still correct */
        pr->micro = m;
        pr->cap_micro = cap;
    }
    pr->micro[pr->n_micro] = (micro_entry){ k, samples, *scratch };
    return &pr->micro[pr->n_micro++].t;
}

/* The rank's part of the gradient norm's local pass: each trained module on
 * it whose gradients it counts (executor/run.c local_grad_sumsq: its ZeRO-1
 * shard, else only on the replica at dp and sp coordinate 0). */
static double norm_busy_s(pricer *pr, int rank)
{
    double s = 0;
    for (int k = 0; k < pr->p->n_modules; k++) {
        plan_coord cd;
        if (!plan_rank_coord(pr->p, k, rank, &cd)) continue;
        if (pr->p->mod[k].zero < 1 && (cd.dp != 0 || cd.sp != 0)) continue;
        s += step_time(pr, k)->norm_s;
    }
    return s;
}

static plan_sim_cost price(pricer *pr, int rank, const plan_op *op)
{
    plan_sim_cost c = { 0, 0, 0 };
    plan_time scratch;
    const plan_time *t;
    switch (op->kind) {
    case PLAN_OP_FORWARD:
        t = micro_time(pr, op->module, op->samples, &scratch);
        c.busy_s = t->fwd_s;
        c.comm_s = t->fwd_comm_s;
        c.syncs = t->fwd_syncs;
        break;
    case PLAN_OP_BACKWARD:
        t = micro_time(pr, op->module, op->samples, &scratch);
        c.busy_s = t->bwd_s + t->recompute_s;
        c.comm_s = plan_time_backward_s(t) - c.busy_s;
        c.syncs = t->bwd_syncs;
        break;
    case PLAN_OP_FORWARD_BACKWARD:
        t = micro_time(pr, op->module, op->samples, &scratch);
        c.busy_s = t->fwd_s + t->bwd_s + t->recompute_s;
        c.comm_s = t->micro_s - c.busy_s;
        c.syncs = t->fwd_syncs + t->bwd_syncs;
        break;
    case PLAN_OP_GRAD_SYNC:
        t = step_time(pr, op->module);
        c.comm_s = pr->p->mod[op->module].zero >= 1 ? t->grad_rs_s : t->dp_comm_s;
        break;
    case PLAN_OP_GRAD_NORM:
        if (!pr->have_norm) { pr->norm_s = world_allreduce_s(pr->p, 8.0); pr->have_norm = true; }
        c.busy_s = norm_busy_s(pr, rank);
        c.comm_s = pr->norm_s;
        break;
    case PLAN_OP_OPTIMIZER:
        t = step_time(pr, op->module);
        c.busy_s = t->optim_s;
        if (optimizer_gathers(&pr->p->mod[op->module])) c.comm_s = t->param_ag_s;
        break;
    default:
        break;
    }
    if (c.comm_s < 0) c.comm_s = 0;   /* rounding of micro_s - busy */
    return c;
}

plan_sim_cost plan_sim_op_cost(const plan_t *p, int rank, const plan_op *op)
{
    pricer pr = { .p = p, .opt = plan_opts(p) };
    plan_sim_cost c = price(&pr, rank, op);
    util_free(pr.micro);
    return c;
}

/* ---- memory ---- */

/* Rows one rank sends (sending) or receives for chunk c of encoder enc, one
 * entry per peer message, in the executor's order (plan_handoff's). */
static int chunk_message_rows(const plan_t *p, int enc, int c, int rank, bool grad, bool sending,
                              double *rows, int cap, int *n_out)
{
    plan_segment *sg;
    int n, m = 0, i, j, peer, nrows;
    char err[UTIL_ERR_LEN];
    *n_out = 0;
    if (plan_handoff(p, enc, c, &sg, &n, err)) return UTIL_EINVAL;
    for (int from = 0; m < cap && plan_handoff_message(sg, n, from, rank, grad, sending, &i, &j, &peer, &nrows); from = j)
        rows[m++] = nrows;
    util_free(sg);
    *n_out = m;
    return UTIL_OK;
}

/* fp32 (the CPU executor, executor/run.c): its hand-off buffers (one chunk
 * of rows, activations and gradients, on each side) plus the peak of the
 * messages along the rank's schedule: a sent message is held until the step
 * ends, a received one only until it is scattered. */
static double executor_handoff_bytes(const plan_t *p, int rank, const plan_schedule *s)
{
    int L = p->model.llm, enc = -1;
    for (int k = 0; k < p->n_modules; k++)
        if (k != L && p->work.images_per_sample > 0) enc = k;
    if (enc < 0) return 0;
    plan_coord cd;
    double d = p->model.mod[L].hidden, R = plan_rows_per_sample(p, enc), buffers = 0;
    if (plan_rank_coord(p, enc, rank, &cd)) buffers += 2 * (double)plan_max_share(p, enc) * R / p->mod[enc].sp * d;
    if (plan_rank_coord(p, L, rank, &cd)) buffers += 2 * (double)plan_max_share(p, L) * R * d;
    double held = 0, peak = 0, rows[64];
    for (int i = 0; i < s->n; i++) {
        const plan_op *o = &s->op[i];
        bool send = o->kind == PLAN_OP_SEND_ACT || o->kind == PLAN_OP_SEND_GRAD;
        bool recv = o->kind == PLAN_OP_RECV_ACT || o->kind == PLAN_OP_RECV_GRAD;
        if (!send && !recv) continue;
        bool grad = o->kind == PLAN_OP_SEND_GRAD || o->kind == PLAN_OP_RECV_GRAD;
        int n;
        if (chunk_message_rows(p, enc, o->chunk, rank, grad, send, rows, 64, &n)) continue;
        for (int j = 0; j < n; j++) {
            if (send) held += rows[j] * d;
            peak = fmax(peak, held + (recv ? rows[j] * d : 0));
        }
    }
    return FP32_BYTES * (buffers + peak);
}

static void rank_memory(const plan_t *p, int rank, const plan_schedule *sched, plan_sim_mem *out)
{
    int slots = sched->slots;
    memset(out, 0, sizeof *out);
    plan_options o = plan_opts(p);
    bool first = true;
    for (int k = 0; k < p->n_modules; k++) {
        plan_coord cd;
        if (!plan_rank_coord(p, k, rank, &cd)) continue;
        const plan_module *s = &p->mod[k];
        bool encoder = k != p->model.llm;
        int in_flight = encoder && slots > 0 ? slots : 1;
        plan_mem m;
        plan_module_memory(&p->model, k, s, &p->work, &p->cluster.pool[s->pool].gpu, &o, in_flight, &m);
        out->params += m.params;
        out->grads += m.grads;
        out->optim += m.optim;
        out->activations += m.activations;
        out->logits += m.logits;
        out->comm += m.comm;
        out->other += m.zero_buffers + m.fragmentation + (first ? m.reserved : 0);
        out->capacity = m.capacity;
        if (encoder) out->slots += in_flight;
        first = false;
    }
    if (p->precision == PLAN_OPT_FP32) out->comm += executor_handoff_bytes(p, rank, sched);
    out->total = out->params + out->grads + out->optim + out->activations + out->logits + out->comm + out->other;
}

int plan_sim_memory(const plan_t *p, int rank, plan_sim_mem *out, char *err)
{
    plan_schedule s;
    int rc = plan_schedule_rank(p, rank, &s, err);
    if (rc) return rc;
    rank_memory(p, rank, &s, out);
    plan_schedule_free(&s);
    return UTIL_OK;
}

/* ---- hand-off messages ---- */

/* One message: the rows one rank sends another for chunk c of encoder k
 * (activations, or their gradients back), the concatenation of its segments. */
typedef struct {
    int src, dst;
    double bytes;
    bool sent;
    double sent_s, start_s, arrive_s;  /* SEND op, channel free, arrival */
    int send_op;                       /* op index on src */
    int prev;                          /* previous message on the same (src, dst) channel, -1 none */
} message;

typedef struct {
    message *m;
    int n, cap;
    int *group_first, *group_n;        /* per group (c * n_modules + k) * 2 + grad */
    int n_groups;
} message_table;

static int group_of(const plan_t *p, int k, int c, bool grad) { return (c * p->n_modules + k) * 2 + (grad ? 1 : 0); }

static int add_message(message_table *t, int src, int dst, double bytes, char *err)
{
    if (t->n && t->m[t->n - 1].src == src && t->m[t->n - 1].dst == dst) { t->m[t->n - 1].bytes += bytes; return UTIL_OK; }
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        message *m = util_realloc(t->m, (size_t)cap * sizeof *m);
        if (!m) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for messages");
        t->m = m;
        t->cap = cap;
    }
    t->m[t->n++] = (message){ .src = src, .dst = dst, .bytes = bytes, .send_op = -1, .prev = -1 };
    return UTIL_OK;
}

/* Every message of chunk c of encoder k in one direction, sender by sender,
 * each the one plan_handoff_message gives the executor (executor/run.c). */
static int chunk_messages(const plan_t *p, int k, int c, bool grad, message_table *t, char *err)
{
    plan_segment *sg;
    int n, rc = plan_handoff(p, k, c, &sg, &n, err);
    if (rc) return rc;
    double row_bytes = p->model.mod[k].out_hidden * plan_precision_bytes(p->precision).act;
    const plan_module *senders = &p->mod[grad ? p->model.llm : k];
    for (int r = senders->first_rank; !rc && r < senders->first_rank + senders->n_ranks; r++) {
        int i, j, peer, rows;
        for (int from = 0; !rc && plan_handoff_message(sg, n, from, r, grad, true, &i, &j, &peer, &rows); from = j)
            rc = add_message(t, r, peer, rows * row_bytes, err);
    }
    util_free(sg);
    return rc;
}

static bool encoder_feeds(const plan_t *p, int k) { return k != p->model.llm && p->work.images_per_sample > 0; }

typedef struct { int src, dst, i; } channel_key;
static int by_channel(const void *a, const void *b)
{
    const channel_key *x = a, *y = b;
    if (x->src != y->src) return x->src < y->src ? -1 : 1;
    if (x->dst != y->dst) return x->dst < y->dst ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Messages in group order, which is each sender's order (chunk by chunk,
 * activations before gradients); prev links each channel's FIFO. */
static int build_messages(const plan_t *p, message_table *t, char *err)
{
    memset(t, 0, sizeof *t);
    int chunks = plan_chunks(p);
    t->n_groups = chunks * p->n_modules * 2;
    t->group_first = util_calloc((size_t)t->n_groups, sizeof(int));
    t->group_n = util_calloc((size_t)t->n_groups, sizeof(int));
    if (!t->group_first || !t->group_n) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for messages");
    int rc = UTIL_OK;
    for (int c = 0; !rc && c < chunks; c++)
        for (int k = 0; !rc && k < p->n_modules; k++)
            for (int grad = 0; !rc && grad < 2; grad++) {
                int g = group_of(p, k, c, grad);
                t->group_first[g] = t->n;
                if (encoder_feeds(p, k) && (!grad || !p->model.mod[k].frozen)) rc = chunk_messages(p, k, c, grad, t, err);
                t->group_n[g] = t->n - t->group_first[g];
            }
    if (rc || t->n == 0) return rc;
    channel_key *key = util_malloc((size_t)t->n * sizeof *key);
    if (!key) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for messages");
    for (int i = 0; i < t->n; i++) key[i] = (channel_key){ t->m[i].src, t->m[i].dst, i };
    qsort(key, (size_t)t->n, sizeof *key, by_channel);
    for (int i = 1; i < t->n; i++)
        if (key[i].src == key[i - 1].src && key[i].dst == key[i - 1].dst && key[i].src != key[i].dst)
            t->m[key[i].i].prev = key[i - 1].i;
    util_free(key);
    return UTIL_OK;
}

static void free_messages(message_table *t)
{
    util_free(t->m);
    util_free(t->group_first);
    util_free(t->group_n);
    memset(t, 0, sizeof *t);
}

/* ---- collectives ---- */

/* One collective instance: GRAD_NORM, or GRAD_SYNC / gathering OPTIMIZER of
 * module k among the ranks of one tp position (all dp x sp replicas). */
typedef struct {
    int expected, joined;
    double last_join_s, comm_s;
    int last_rank, last_op;
} collective;

typedef struct {
    collective *c;
    int n, max_tp;
} collective_table;

static int collective_index(const plan_t *p, const collective_table *t, int rank, const plan_op *op)
{
    if (op->kind == PLAN_OP_GRAD_NORM) return 0;
    plan_coord cd = { 0 };
    plan_rank_coord(p, op->module, rank, &cd);
    int which = op->kind == PLAN_OP_OPTIMIZER ? 1 : 0;
    return 1 + ((which * p->n_modules + op->module) * t->max_tp + cd.tp);
}

static int build_collectives(const plan_t *p, collective_table *t, char *err)
{
    t->max_tp = 1;
    for (int k = 0; k < p->n_modules; k++) if (p->mod[k].tp > t->max_tp) t->max_tp = p->mod[k].tp;
    t->n = 1 + 2 * p->n_modules * t->max_tp;
    t->c = util_calloc((size_t)t->n, sizeof *t->c);
    if (!t->c) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for collectives");
    t->c[0].expected = p->world_size;
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        for (int which = 0; which < 2; which++)
            for (int tp = 0; tp < s->tp; tp++)
                t->c[1 + ((which * p->n_modules + k) * t->max_tp + tp)].expected = s->dp * s->sp * s->pp;
    }
    return UTIL_OK;
}

/* ---- the walk ---- */

typedef struct {
    const plan_t *p;
    const plan_sim_hooks *hooks;
    pricer pr;
    plan_schedule *sched;
    message_table msg;
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
    return price(&S->pr, rank, op);
}

static double msg_cost(sim *S, const message *m)
{
    if (m->src == m->dst) return 0;
    if (S->hooks && S->hooks->msg_seconds) return S->hooks->msg_seconds(S->hooks->ctx, S->p, m->src, m->dst, m->bytes);
    return plan_sim_msg_seconds(S->p, m->src, m->dst, m->bytes);
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

static int do_send(sim *S, int rank, const plan_op *op, plan_sim_op *rec, char *err)
{
    int g = group_of(S->p, op->module, op->chunk, op->kind == PLAN_OP_SEND_GRAD);
    double t = S->now[rank];
    for (int i = S->msg.group_first[g]; i < S->msg.group_first[g] + S->msg.group_n[g]; i++) {
        message *m = &S->msg.m[i];
        if (m->src != rank) continue;
        double d = msg_cost(S, m);
        int rc = check_finite(S->p, rank, op, d, err);
        if (rc) return rc;
        m->sent = true;
        m->sent_s = t;
        m->start_s = m->prev >= 0 && S->msg.m[m->prev].sent && S->msg.m[m->prev].arrive_s > t ? S->msg.m[m->prev].arrive_s : t;
        m->arrive_s = m->start_s + d;
        m->send_op = S->next[rank];
        rec->bytes += m->bytes;
    }
    rec->begin_s = rec->end_s = t;
    return UTIL_OK;
}

/* Returns false while a message for it is still unsent. */
static bool do_recv(sim *S, int rank, const plan_op *op, plan_sim_op *rec)
{
    int g = group_of(S->p, op->module, op->chunk, op->kind == PLAN_OP_RECV_GRAD);
    int last = -1;
    double bytes = 0;
    for (int i = S->msg.group_first[g]; i < S->msg.group_first[g] + S->msg.group_n[g]; i++) {
        const message *m = &S->msg.m[i];
        if (m->dst != rank) continue;
        if (!m->sent) return false;
        bytes += m->bytes;
        if (last < 0 || m->arrive_s > S->msg.m[last].arrive_s) last = i;
    }
    double t = S->now[rank];
    rec->bytes = bytes;
    rec->begin_s = rec->end_s = t;
    if (last < 0 || S->msg.m[last].arrive_s <= t) return true;
    const message *m = &S->msg.m[last];
    rec->begin_s = rec->end_s = m->arrive_s;
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
    case PLAN_OP_SEND_ACT:
    case PLAN_OP_SEND_GRAD:
        rc = do_send(S, rank, op, rec, err);
        *progress = !rc;
        break;
    case PLAN_OP_RECV_ACT:
    case PLAN_OP_RECV_GRAD:
        *progress = do_recv(S, rank, op, rec);
        break;
    default:
        if (op_is_collective(S->p, op)) {
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

static bool op_has_compute(plan_op_kind k)
{
    return k != PLAN_OP_SEND_ACT && k != PLAN_OP_SEND_GRAD && k != PLAN_OP_RECV_ACT && k != PLAN_OP_RECV_GRAD;
}

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
    return cost_share_weight(&S->p->cluster.pool[rank_pool(S->p, r)], interval);
}

/* Rank r's speed while `busy` ranks of its set compute, of total weight
 * `weight`: the set's throughput, busy x compute_speed(busy), split by
 * weight; at most one processor's worth. */
static double shared_speed(const sim *S, int r, int busy, double weight)
{
    double even = cost_compute_speed(&S->p->cluster.pool[rank_pool(S->p, r)], busy);
    if (busy < 2) return even;
    double v = busy * even * share_weight(S, r) / weight;
    return v < 1 ? v : 1;
}

/* Does q exchange with r inside r's next op (a rank of the same module
 * replica: its tensor- and sequence-parallel peers)? */
static bool exchange_peer(const sim *S, int r, int q)
{
    if (q == r || S->cost[r].syncs <= 0) return false;
    int k = S->sched[r].op[S->next[r]].module;
    plan_coord a, b;
    return plan_rank_coord(S->p, k, r, &a) && plan_rank_coord(S->p, k, q, &b) && a.dp == b.dp && a.pp == b.pp;
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
    if (op_is_collective(S->p, op)) {
        collective *cl = &S->coll.c[collective_index(S->p, &S->coll, rank, op)];
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
    return is_collective_kind(a->op.kind) && a->op.kind == b->op.kind && a->op.module == b->op.module
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
    free_messages(&S->msg);
    util_free(S->coll.c);
    util_free(S->next);
    util_free(S->now);
    util_free(S->joined);
    util_free(S->pr.micro);
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
    int pa = rank_pool(p, a);
    if (pa != rank_pool(p, b) || rank_node(p, a) != rank_node(p, b)) return false;
    const cost_pool *pool = &p->cluster.pool[pa];
    if (!pool->has_sets) return true;
    int la = rank_in_pool(p, a) % pool->gpus_per_node, lb = rank_in_pool(p, b) % pool->gpus_per_node;
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
    for (int i = 0; i < world; i++) {
        util_progress("simulate: scheduling ranks", i, world);
        int rc = plan_schedule_rank(p, i, &S->sched[i], err);
        if (rc) return rc;
        r->rank[i].n_ops = S->sched[i].n;
        r->rank[i].ops = util_calloc((size_t)(S->sched[i].n ? S->sched[i].n : 1), sizeof(plan_sim_op));
        if (!r->rank[i].ops) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for rank %d's ops", i);
        rank_memory(p, i, &S->sched[i], &r->rank[i].mem);
    }
    util_progress("simulate: scheduling ranks", world, world);
    int rc = build_messages(p, &S->msg, err);
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
    sim S = { .p = p, .hooks = hooks, .r = r, .pr = { .p = p, .opt = plan_opts(p) } };
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

/* ---- output ---- */

void plan_sim_op_label(const plan_t *p, const plan_op *op, char *buf, size_t n)
{
    const char *mod = op->module >= 0 && op->module < p->n_modules ? p->mod[op->module].module : "";
    if (op->chunk < 0) snprintf(buf, n, "%s%s%s", plan_op_name(op->kind), *mod ? " " : "", mod);
    else snprintf(buf, n, "%s %s c%d s%d+%d", plan_op_name(op->kind), mod, op->chunk, op->sample0, op->samples);
}

static cJSON *mem_json(const plan_sim_mem *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "params", m->params);
    cJSON_AddNumberToObject(o, "grads", m->grads);
    cJSON_AddNumberToObject(o, "optim", m->optim);
    cJSON_AddNumberToObject(o, "activations", m->activations);
    cJSON_AddNumberToObject(o, "slots", m->slots);
    cJSON_AddNumberToObject(o, "logits", m->logits);
    cJSON_AddNumberToObject(o, "comm", m->comm);
    cJSON_AddNumberToObject(o, "other", m->other);
    cJSON_AddNumberToObject(o, "total", m->total);
    cJSON_AddNumberToObject(o, "capacity", m->capacity);
    return o;
}

static cJSON *op_json(const plan_t *p, int rank, const plan_sim_op *o)
{
    char name[96];
    plan_sim_op_label(p, &o->op, name, sizeof name);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "rank", rank);
    cJSON_AddStringToObject(j, "op", plan_op_name(o->op.kind));
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddNumberToObject(j, "start_s", o->start_s);
    cJSON_AddNumberToObject(j, "end_s", o->end_s);
    return j;
}

cJSON *plan_sim_to_json(const plan_t *p, const plan_sim_result *r)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddNumberToObject(doc, "step_time_s", r->step_time_s);
    cJSON_AddNumberToObject(doc, "world_size", r->world_size);
    cJSON *ranks = cJSON_AddArrayToObject(doc, "ranks");
    for (int i = 0; i < r->world_size; i++) {
        const plan_sim_rank *rk = &r->rank[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", i);
        cJSON *mods = cJSON_AddArrayToObject(o, "modules");
        for (int k = 0; k < p->n_modules; k++) {
            plan_coord cd;
            if (plan_rank_coord(p, k, i, &cd)) cJSON_AddItemToArray(mods, cJSON_CreateString(p->mod[k].module));
        }
        cJSON_AddNumberToObject(o, "ops", rk->n_ops);
        cJSON_AddNumberToObject(o, "end_s", rk->end_s);
        cJSON_AddNumberToObject(o, "busy_s", rk->busy_s);
        cJSON_AddNumberToObject(o, "comm_s", rk->comm_s);
        cJSON_AddNumberToObject(o, "idle_s", rk->idle_s);
        cJSON_AddItemToObject(o, "memory", mem_json(&rk->mem));
        cJSON_AddItemToArray(ranks, o);
    }
    cJSON *path = cJSON_AddArrayToObject(doc, "critical_path");
    for (int i = 0; i < r->n_path; i++) {
        const plan_sim_ref *x = &r->path[i];
        cJSON_AddItemToArray(path, op_json(p, x->rank, &r->rank[x->rank].ops[x->op]));
    }
    return doc;
}

plan_trace_lane plan_op_lane(plan_op_kind k)
{
    switch (k) {
    case PLAN_OP_FORWARD:
    case PLAN_OP_BACKWARD:
    case PLAN_OP_FORWARD_BACKWARD:
    case PLAN_OP_OPTIMIZER: return PLAN_TRACE_COMPUTE;
    default: return PLAN_TRACE_COMM;
    }
}

int plan_sim_write_trace(const char *path, const plan_t *p, const plan_sim_result *r, char *err)
{
    int total = 0;
    for (int i = 0; i < r->world_size; i++) total += r->rank[i].n_ops;
    plan_trace_event *ev = util_calloc((size_t)(total ? total : 1), sizeof *ev);
    char (*names)[96] = util_calloc((size_t)(r->world_size ? r->world_size : 1), sizeof *names);
    const char **np = util_calloc((size_t)(r->world_size ? r->world_size : 1), sizeof *np);
    if (!ev || !names || !np) {
        util_free(ev); util_free(names); util_free(np);
        return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for the trace");
    }
    int n = 0;
    for (int i = 0; i < r->world_size; i++) {
        int len = snprintf(names[i], sizeof names[i], "rank %d", i);
        for (int k = 0; k < p->n_modules; k++) {
            plan_coord cd;
            if (plan_rank_coord(p, k, i, &cd) && len < (int)sizeof names[i])
                len += snprintf(names[i] + len, sizeof names[i] - (size_t)len, " %s", p->mod[k].module);
        }
        np[i] = names[i];
        for (int j = 0; j < r->rank[i].n_ops; j++) {
            const plan_sim_op *o = &r->rank[i].ops[j];
            plan_trace_event *e = &ev[n++];
            e->rank = i;
            e->lane = plan_op_lane(o->op.kind);
            plan_sim_op_label(p, &o->op, e->name, sizeof e->name);
            e->start_s = o->start_s;
            e->end_s = o->end_s;
            e->chunk = o->op.chunk;
            e->samples = o->op.chunk >= 0 ? o->op.samples : -1;
            bool transfer = o->op.kind == PLAN_OP_SEND_ACT || o->op.kind == PLAN_OP_SEND_GRAD
                         || o->op.kind == PLAN_OP_RECV_ACT || o->op.kind == PLAN_OP_RECV_GRAD;
            e->bytes = transfer ? o->bytes : -1;
        }
    }
    int rc = plan_trace_write(path, ev, n, r->world_size, np, err);
    util_free(ev);
    util_free(names);
    util_free(np);
    return rc;
}

int plan_sim_predict(plan_t *p, char *err)
{
    plan_sim_result r;
    int rc = plan_sim_run(p, NULL, &r, err);
    if (rc) return rc;
    plan_prediction *pr = &p->pred;
    double sim = r.step_time_s;
    plan_sim_free(&r);
    if (!(sim > 0)) return util_fail(err, UTIL_EINVAL, "simulate: the step takes no time");
    /* Rates are work per step over the step time: rescale them to the simulated step. */
    double scale = pr->step_time_s / sim;
    pr->analytic_step_time_s = pr->step_time_s;
    pr->step_time_s = sim;
    pr->samples_per_s *= scale;
    pr->vision_tokens_per_s *= scale;
    pr->tokens_per_s *= scale;
    pr->mfu *= scale;
    pr->simulated = true;
    return UTIL_OK;
}
