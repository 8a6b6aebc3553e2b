/* A pipelined module's stage edges in `dhp run`: the schedule's
 * SEND_STAGE / RECV_STAGE (a micro-batch's rows to the next stage) and
 * SEND_STAGE_GRAD / RECV_STAGE_GRAD (their gradient back), rank to rank at
 * the same dp, sp and tp position on the module's pipeline communicator
 * (plan_group_of over PLAN_AX_PP). Each edge and direction is a FIFO
 * channel (one tag, MPI's non-overtaking order), so a receive takes the
 * sends in the order the sender's schedule made them; a send stays in
 * flight until the next send on its edge, which waits for it before it
 * reuses the edge's buffer (the memory model counts those buffers:
 * planner/memory.c). Interleaved, a rank's chunks hop to the next rank's,
 * the last stage's chunk v to the first stage's chunk v + 1
 * (plan_stage_peer), each edge its own channel.
 *
 * Each channel (an edge and a direction) is a communicator of its two ranks
 * (run_stage_comms), so a wait on a receive waits for that channel's message
 * only. Over NCCL a communicator's sends and receives launch as one group on
 * its stream and complete together: on the stages' one communicator, a
 * receive's wait also waited for this rank's earlier send to be taken, and
 * interleaved stages, whose sends go both ways round the ring, deadlocked
 * (3 ranks, vp 2, on the emulator). With a channel per communicator a send
 * completes when its receiver takes it and a receive when its sender sent,
 * as MPI's requests on one tag do. PyTorch's ProcessGroupNCCL does the same
 * for a send or receive outside a batch: a two-rank communicator per pair of
 * ranks (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, getKeySendRecv);
 * here one per direction too, so a rank only sends or only receives on each
 * (every communicator holds NCCL's own connection buffers: more of them
 * than one per group, not measured without a GPU). */
#include "executor/run_internal.h"

#include <string.h>

/* One tag per edge and direction: the edge's lower virtual stage
 * (plan_hop_edge), activations and gradients apart. */
static int channel_tag(int edge, bool grad) { return 1 + 2 * edge + grad; }
static int edge_tag(const run_ctx *r, const plan_op *o) { return channel_tag(plan_hop_edge(&r->plan, o, r->rank), plan_op_props(o->kind)->grad); }

/* The module runs a backward (model_runs_backward: an encoder that trains,
 * the LLM always; plan_schedule_check refuses a plan where nothing trains). */
static bool backprops(const run_ctx *r, int k) { return model_runs_backward(&r->plan.model.mod[k]); }

/* The op's peer's key in the pipeline communicator (its stage), -1 if none. */
static int peer_key(const run_ctx *r, const plan_op *o, int dir)
{
    plan_coord c;
    int peer = plan_stage_peer(&r->plan, o->module, r->rank, o->vchunk, dir);
    return peer >= 0 && plan_rank_coord(&r->plan, o->module, peer, &c) ? c.pp : -1;
}

/* Does this rank send (1) or receive (0) on channel `tag` of module k, or
 * neither (-1)? Its hops are each chunk's four (plan_hop_edge names their
 * channels); those without a peer do not exist. */
static int channel_role(const run_ctx *r, int k, int tag)
{
    static const plan_op_kind hops[] = { PLAN_OP_SEND_STAGE, PLAN_OP_RECV_STAGE, PLAN_OP_SEND_STAGE_GRAD,
                                         PLAN_OP_RECV_STAGE_GRAD };
    for (int v = 0; v < plan_vp(&r->plan.mod[k]); v++)
        for (size_t i = 0; i < sizeof hops / sizeof hops[0]; i++) {
            plan_op o = { .kind = hops[i], .module = k, .vchunk = v };
            if (peer_key(r, &o, plan_hop_dir(o.kind)) >= 0 && edge_tag(r, &o) == tag) return plan_op_props(o.kind)->sends;
        }
    return -1;
}

/* Every channel of module k's pipeline: a communicator of its sender (rank
 * 0) and its receiver (rank 1), split from the stages' one in the same order
 * on every stage (edges up the virtual stages, activations then gradients). */
int run_stage_comms(run_ctx *r, int k, char *err)
{
    run_module *m = &r->mod[k];
    const plan_module *s = &r->plan.mod[k];
    run_stage *st = &m->st;
    if (!m->on || s->pp <= 1) return UTIL_OK;
    int edges = s->pp * plan_vp(s) - 1, dirs = backprops(r, k) ? 2 : 1;
    for (int e = 0; e < edges; e++)
        for (int grad = 0; grad < dirs; grad++) {
            int tag = channel_tag(e, grad), role = channel_role(r, k, tag);
            ex_comm *c = NULL;
            int rc = ex_comm_split(st->pp, role >= 0 ? 0 : -1, role == 1 ? 0 : 1, &c, err);
            if (rc) return rc;
            if (!c) continue;
            int size = ex_comm_size(c);
            if (size != 2 || st->n_chan == (int)(sizeof st->chan / sizeof st->chan[0])) {
                ex_comm_free(c);
                return util_fail(err, UTIL_ERUNTIME, "run: module %s: pipeline channel %d has %d ranks, not its sender "
                                 "and its receiver", s->module, tag, size);
            }
            st->chan[st->n_chan++] = (run_stage_channel){ tag, c };
        }
    return UTIL_OK;
}

/* The channel of a hop op, NULL if this rank has none. */
static ex_comm *channel_of(const run_ctx *r, const plan_op *o)
{
    const run_stage *st = &r->mod[o->module].st;
    int tag = edge_tag(r, o);
    for (int i = 0; i < st->n_chan; i++)
        if (st->chan[i].tag == tag) return st->chan[i].c;
    return NULL;
}

/* Floats of the largest micro-batch's rows at a stage boundary (plan_stage_hop_bytes at the executor's fp32). */
static size_t edge_floats(const run_ctx *r, int k)
{
    const plan_t *p = &r->plan;
    plan_options o = plan_options_of(p);
    o.precision = PLAN_OPT_FP32;
    double bytes = plan_stage_hop_bytes(&p->model, k, &p->mod[k], &p->work, &o, p->mod[k].micro_batch);
    return (size_t)(bytes / sizeof(float) + 0.5);
}

static int edge_buffer(const run_ctx *r, float **b, size_t bytes, char *err)
{
    *b = r->be->alloc(bytes, UTIL_MEM_COMM);
    return *b ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "run: out of memory for pipeline buffers");
}

/* As plan_stage_edge_buffers counts them: a send buffer for each chunk
 * with a next (previous) virtual stage, a receive buffer each way used. */
int run_stage_init(run_ctx *r, int k, char *err)
{
    run_module *m = &r->mod[k];
    run_stage *st = &m->st;
    const plan_module *s = &r->plan.mod[k];
    if (s->pp <= 1) return UTIL_OK;
    bool back = backprops(r, k);
    st->cap = edge_floats(r, k);
    size_t bytes = (st->cap ? st->cap : 1) * sizeof(float);
    int rc = UTIL_OK;
    bool down = false, up = false;
    for (int v = 0; !rc && v < plan_vp(s); v++) {
        if (plan_stage_peer(&r->plan, k, r->rank, v, +1) >= 0) {
            down = true;
            rc = edge_buffer(r, &st->act_out[v], bytes, err);
        }
        if (!rc && plan_stage_peer(&r->plan, k, r->rank, v, -1) >= 0) {
            up = true;
            if (back) rc = edge_buffer(r, &st->grad_out[v], bytes, err);
        }
    }
    if (!rc && up) rc = edge_buffer(r, &st->act_in, bytes, err);
    if (!rc && down && back) rc = edge_buffer(r, &st->grad_in, bytes, err);
    return rc;
}

static int wait_edge(run_stage_inflight *s, char *err)
{
    if (!s->req) return UTIL_OK;
    int rc = ex_comm_wait(s->c, s->req);
    s->req = NULL;
    return rc ? util_fail(err, UTIL_ERUNTIME, "run: a pipeline send failed: %s", ex_comm_error(s->c)) : UTIL_OK;
}

int run_stage_send(run_ctx *r, const plan_op *o, const float *src, int rows, char *err)
{
    int k = o->module, v = o->vchunk;
    bool grad = plan_op_props(o->kind)->grad;
    run_stage *st = &r->mod[k].st;
    int stage = peer_key(r, o, plan_hop_dir(o->kind));
    ex_comm *ch = channel_of(r, o);
    float *buf = v >= 0 && v < PLAN_MAX_VP ? (grad ? st->grad_out[v] : st->act_out[v]) : NULL;
    run_stage_inflight *in = grad ? &st->grad_req[v] : &st->act_req[v];
    size_t n = (size_t)rows * (size_t)r->plan.model.mod[k].hidden;
    if (stage < 0 || !ch || !buf) return util_fail(err, UTIL_EINVAL, "run: module %s: no pipeline stage to send to", r->plan.mod[k].module);
    if (n > st->cap) return util_fail(err, UTIL_EINVAL, "run: module %s: %d rows exceed the pipeline buffer", r->plan.mod[k].module, rows);
    int rc = wait_edge(in, err);
    if (rc) return rc;
    if (src) r->be->d2d(buf, src, n * sizeof(float));
    in->c = ch;
    /* to the channel's receiver, started now: on NCCL a send held until
     * this rank's next wait would also wait for the compute issued before
     * that wait (the stream waits for an event recorded at launch) */
    if (ex_comm_isend(ch, buf, n, 1, edge_tag(r, o), &in->req) || ex_comm_start(ch))
        return util_fail(err, UTIL_ERUNTIME, "run: module %s: pipeline send to stage %d failed: %s", r->plan.mod[k].module, stage,
                         ex_comm_error(ch));
    return UTIL_OK;
}

int run_stage_recv(run_ctx *r, const plan_op *o, int rows, const float **out, char *err)
{
    int k = o->module;
    bool grad = plan_op_props(o->kind)->grad;
    run_stage *st = &r->mod[k].st;
    int stage = peer_key(r, o, plan_hop_dir(o->kind));
    ex_comm *ch = channel_of(r, o);
    float *buf = grad ? st->grad_in : st->act_in;
    size_t n = (size_t)rows * (size_t)r->plan.model.mod[k].hidden;
    if (stage < 0 || !ch || !buf) return util_fail(err, UTIL_EINVAL, "run: module %s: no pipeline stage to receive from", r->plan.mod[k].module);
    if (n > st->cap) return util_fail(err, UTIL_EINVAL, "run: module %s: %d rows exceed the pipeline buffer", r->plan.mod[k].module, rows);
    if (ex_comm_recv(ch, buf, n, 0, edge_tag(r, o)))   /* the channel's sender */
        return util_fail(err, UTIL_ERUNTIME, "run: module %s: pipeline receive from stage %d failed: %s", r->plan.mod[k].module, stage,
                         ex_comm_error(ch));
    *out = buf;
    return UTIL_OK;
}

int run_stage_wait_all(run_ctx *r, char *err)
{
    int rc = UTIL_OK;
    for (int k = 0; k < r->plan.n_modules; k++) {
        run_stage *st = &r->mod[k].st;
        for (int v = 0; v < PLAN_MAX_VP; v++) {
            char e[UTIL_ERR_LEN];
            int a = wait_edge(&st->act_req[v], e), b = wait_edge(&st->grad_req[v], e);
            if (!rc && (a || b)) rc = util_fail(err, UTIL_ERUNTIME, "%s", e);
        }
    }
    return rc;
}

void run_stage_free(run_ctx *r, int k)
{
    run_stage *st = &r->mod[k].st;
    char err[UTIL_ERR_LEN];
    for (int v = 0; v < PLAN_MAX_VP; v++) {
        wait_edge(&st->act_req[v], err);
        wait_edge(&st->grad_req[v], err);
        if (r->be) { r->be->release(st->act_out[v]); r->be->release(st->grad_out[v]); }
    }
    if (r->be) { r->be->release(st->act_in); r->be->release(st->grad_in); }
    for (int i = 0; i < st->n_chan; i++) ex_comm_free(st->chan[i].c);
    ex_comm_free(st->pp);
    memset(st, 0, sizeof *st);
}
