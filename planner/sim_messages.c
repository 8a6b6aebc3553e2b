/* The simulator's point-to-point messages: the encoder -> LLM hand-off of
 * each chunk (the messages plan_handoff_message gives the executor,
 * executor/run_handoff.c) and each pipeline hop of a micro-batch between
 * neighbouring stages (executor/run_stage.c), matched send to receive in
 * each channel's order as MPI matches them. A channel (src, dst) carries one
 * message at a time. */
#include "planner/sim_int.h"

#include <stdlib.h>
#include <string.h>

int sim_handoff_group(const plan_t *p, int k, int c, bool grad) { return (c * p->n_modules + k) * 2 + (grad ? 1 : 0); }

static int add_message(sim_messages *t, int src, int dst, double bytes, bool merge, char *err)
{
    if (merge && t->n && t->m[t->n - 1].src == src && t->m[t->n - 1].dst == dst) {
        t->m[t->n - 1].bytes += bytes;
        return UTIL_OK;
    }
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        sim_message *m = util_realloc(t->m, (size_t)cap * sizeof *m);
        if (!m) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for messages");
        t->m = m;
        t->cap = cap;
    }
    t->m[t->n++] = (sim_message){ .src = src, .dst = dst, .bytes = bytes, .send_op = -1, .recv_op = -1, .prev = -1 };
    return UTIL_OK;
}

/* ---- the hand-off ---- */

/* Every message of chunk c of encoder k in one direction (one per pair of
 * ranks: each channel carries one of the group). */
static int chunk_messages(const plan_t *p, int k, int c, bool grad, sim_messages *t, char *err)
{
    plan_segment *sg;
    int n, rc = plan_handoff(p, k, c, &sg, &n, err);
    if (rc) return rc;
    plan_options po = plan_options_of(p);
    double row_bytes = p->model.mod[k].out_hidden * plan_module_state_bytes(&p->model.mod[k], &po).act;
    plan_handoff_msg m;
    for (int from = 0; !rc && plan_handoff_next(sg, n, from, grad, &m); from = m.end)
        rc = add_message(t, m.src, m.dst, m.rows * row_bytes, false, err);
    util_free(sg);
    return rc;
}

static int handoff_messages(const plan_t *p, sim_messages *t, char *err)
{
    int chunks = plan_chunks(p);
    t->n_groups = chunks * p->n_modules * 2;
    t->group_first = util_calloc((size_t)t->n_groups, sizeof(int));
    t->group_n = util_calloc((size_t)t->n_groups, sizeof(int));
    if (!t->group_first || !t->group_n) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for messages");
    int rc = UTIL_OK;
    for (int c = 0; !rc && c < chunks; c++)
        for (int k = 0; !rc && k < p->n_modules; k++)
            for (int grad = 0; !rc && grad < 2; grad++) {
                int g = sim_handoff_group(p, k, c, grad);
                t->group_first[g] = t->n;
                if (plan_encoder_feeds(p, k) && (!grad || model_trains(&p->model.mod[k]))) rc = chunk_messages(p, k, c, grad, t, err);
                t->group_n[g] = t->n - t->group_first[g];
            }
    return rc;
}

/* ---- pipeline hops ----
 * Each SEND_STAGE(_GRAD) op sends one message to the neighbouring stage;
 * the n-th receive a rank posts from a peer for a module and direction takes
 * the n-th such message the peer sent (the executor's FIFO channels). */

typedef struct { int src, dst, module, edge, grad, seq, rank, op, msg; } hop_end;

/* Compares the channels (and the order on them: seq, when with_seq). */
static int hop_cmp(const hop_end *x, const hop_end *y, bool with_seq)
{
    int kx[6] = { x->src, x->dst, x->module, x->edge, x->grad, x->seq };
    int ky[6] = { y->src, y->dst, y->module, y->edge, y->grad, y->seq };
    for (int i = 0; i < (with_seq ? 6 : 5); i++)
        if (kx[i] != ky[i]) return kx[i] < ky[i] ? -1 : 1;
    return 0;
}

static int by_hop(const void *a, const void *b) { return hop_cmp(a, b, true); }

static bool is_hop(plan_op_kind k) { return plan_op_props(k)->group == PLAN_GROUP_STAGE; }

/* The hops of every rank's schedule: sends (sending) or receives, with the
 * sequence number of each on its channel and direction. */
static int collect_hops(const plan_t *p, const plan_schedule *sched, bool sending, hop_end **out, int *n_out, char *err)
{
    int n = 0;
    for (int r = 0; r < p->world_size; r++)
        for (int i = 0; i < sched[r].n; i++) {
            const plan_op *o = &sched[r].op[i];
            n += is_hop(o->kind) && plan_op_props(o->kind)->sends == sending;
        }
    hop_end *h = util_malloc((size_t)(n ? n : 1) * sizeof *h);
    if (!h) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for pipeline messages");
    int m = 0;
    for (int r = 0; r < p->world_size; r++)
        for (int i = 0; i < sched[r].n; i++) {
            const plan_op *o = &sched[r].op[i];
            const plan_op_info *in = plan_op_props(o->kind);
            if (!is_hop(o->kind) || in->sends != sending) continue;
            int peer = plan_stage_peer(p, o->module, r, o->vchunk, plan_hop_dir(o->kind));
            if (peer < 0)
                return util_free(h), util_fail(err, UTIL_EINVAL, "simulate: rank %d: %s of module %s has no neighbouring stage",
                                               r, in->name, p->mod[o->module].module);
            /* one rank's end of a channel: its op index is its program order */
            h[m++] = (hop_end){ .src = sending ? r : peer, .dst = sending ? peer : r, .module = o->module,
                                .edge = plan_hop_edge(p, o, r), .grad = in->grad, .seq = i, .rank = r, .op = i, .msg = -1 };
        }
    qsort(h, (size_t)m, sizeof *h, by_hop);
    *out = h;
    *n_out = m;
    return UTIL_OK;
}

static int stage_messages(const plan_t *p, const plan_schedule *sched, sim_messages *t, char *err)
{
    int world = p->world_size;
    t->stage_msg = util_calloc((size_t)world, sizeof *t->stage_msg);
    if (!t->stage_msg) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for pipeline messages");
    for (int r = 0; r < world; r++) {
        t->stage_msg[r] = util_malloc((size_t)(sched[r].n ? sched[r].n : 1) * sizeof(int));
        if (!t->stage_msg[r]) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for pipeline messages");
        for (int i = 0; i < sched[r].n; i++) t->stage_msg[r][i] = -1;
    }
    /* One message per send, in each sender's program order. */
    int rc = UTIL_OK;
    for (int r = 0; !rc && r < world; r++)
        for (int i = 0; !rc && i < sched[r].n; i++) {
            const plan_op *o = &sched[r].op[i];
            if (!is_hop(o->kind) || !plan_op_props(o->kind)->sends) continue;
            int dst = plan_stage_peer(p, o->module, r, o->vchunk, plan_hop_dir(o->kind));
            if (dst < 0) return util_fail(err, UTIL_EINVAL, "simulate: rank %d: a pipeline send has no neighbouring stage", r);
            plan_hop_wire h = sim_stage_hop(p, o->module, o->samples, plan_op_props(o->kind)->grad);
            rc = add_message(t, r, dst, h.wire_bytes, false, err);
            if (!rc) {
                t->m[t->n - 1].gather_s = h.gather_s;
                t->m[t->n - 1].held = h.held;
                t->m[t->n - 1].recv_waits = h.recv_waits;
                t->m[t->n - 1].send_op = i;
                t->stage_msg[r][i] = t->n - 1;
            }
        }
    if (rc) return rc;
    /* Match the n-th receive on each (src, dst, module, direction) with the n-th send. */
    hop_end *snd = NULL, *rcv = NULL;
    int ns = 0, nr = 0;
    rc = collect_hops(p, sched, true, &snd, &ns, err);
    if (!rc) rc = collect_hops(p, sched, false, &rcv, &nr, err);
    if (!rc && ns != nr)
        rc = util_fail(err, UTIL_EINVAL, "simulate: the schedules send %d pipeline messages and receive %d", ns, nr);
    for (int i = 0; !rc && i < ns; i++) {
        if (hop_cmp(&snd[i], &rcv[i], false) != 0)
            rc = util_fail(err, UTIL_EINVAL, "simulate: rank %d sends module %s's pipeline messages that rank %d does not receive in turn",
                           snd[i].src, p->mod[snd[i].module].module, snd[i].dst);
        else
            t->stage_msg[rcv[i].rank][rcv[i].op] = t->stage_msg[snd[i].rank][snd[i].op];
    }
    util_free(snd);
    util_free(rcv);
    return rc;
}

int sim_build_messages(const plan_t *p, const plan_schedule *sched, sim_messages *t, char *err)
{
    memset(t, 0, sizeof *t);
    int world = p->world_size, rc = handoff_messages(p, t, err);
    if (!rc) rc = stage_messages(p, sched, t, err);
    if (rc) return rc;
    t->chan = util_calloc((size_t)world, sizeof *t->chan);
    t->n_chan = util_calloc((size_t)world, sizeof *t->n_chan);
    t->cap_chan = util_calloc((size_t)world, sizeof *t->cap_chan);
    if (!t->chan || !t->n_chan || !t->cap_chan) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for messages");
    return UTIL_OK;
}

void sim_free_messages(const plan_t *p, sim_messages *t)
{
    for (int r = 0; r < p->world_size; r++) {
        if (t->stage_msg) util_free(t->stage_msg[r]);
        if (t->chan) util_free(t->chan[r]);
    }
    util_free(t->stage_msg);
    util_free(t->chan);
    util_free(t->n_chan);
    util_free(t->cap_chan);
    util_free(t->m);
    util_free(t->group_first);
    util_free(t->group_n);
    memset(t, 0, sizeof *t);
}

/* The channel (src, dst): its index in src's list, added when new. */
static int channel_of(sim_messages *t, int src, int dst, char *err)
{
    for (int i = 0; i < t->n_chan[src]; i++)
        if (t->chan[src][i].dst == dst) return i;
    if (t->n_chan[src] == t->cap_chan[src]) {
        int cap = t->cap_chan[src] ? 2 * t->cap_chan[src] : 4;
        sim_channel *c = util_realloc(t->chan[src], (size_t)cap * sizeof *c);
        if (!c) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for channels"), -1;
        t->chan[src] = c;
        t->cap_chan[src] = cap;
    }
    t->chan[src][t->n_chan[src]] = (sim_channel){ dst, -1 };
    return t->n_chan[src]++;
}

int sim_message_send(const plan_t *p, sim_messages *t, int i, double t_s, double seconds, char *err)
{
    (void)p;
    sim_message *m = &t->m[i];
    m->sent = true;
    m->sent_s = t_s;
    m->start_s = t_s;
    m->prev = -1;
    if (m->src != m->dst) {
        int c = channel_of(t, m->src, m->dst, err);
        if (c < 0) return UTIL_ENOMEM;
        int last = t->chan[m->src][c].last;
        if (last >= 0 && t->m[last].arrive_s > t_s) m->start_s = t->m[last].arrive_s;
        m->prev = last;
        t->chan[m->src][c].last = i;
    }
    m->arrive_s = m->start_s + seconds;
    return UTIL_OK;
}
