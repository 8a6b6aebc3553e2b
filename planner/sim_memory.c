/* The simulator's memory per rank: each module stage's memory model
 * (plan_stage_memory) with the activation slots the rank's schedule fills,
 * and the executor's hand-off buffers and messages along the schedule. */
#include "planner/sim_int.h"

#include <math.h>
#include <string.h>

/* ---- memory ---- */

/* The hand-off's messages by rank (sim_handoff_table): for each chunk c
 * and feeding encoder k, what each rank sends in all (activations, and
 * gradients back) and the largest single message it receives, from the
 * chunk's messages (plan_handoff_next). */
enum { ACT_SENT, ACT_RECV_MAX, GRAD_SENT, GRAD_RECV_MAX, HANDOFF_NQ };

struct sim_handoff_table {
    int chunks, world;
    double *rows;             /* [(c * n_modules + k) * HANDOFF_NQ + q][rank], NULL: no encoder feeds */
};

static double *table_row(const sim_handoff_table *t, const plan_t *p, int k, int c, int q)
{
    return t->rows + ((size_t)(c * p->n_modules + k) * HANDOFF_NQ + (size_t)q) * (size_t)t->world;
}

/* Chunk c's messages of encoder k in both directions. */
static void add_messages(const sim_handoff_table *t, const plan_t *p, int k, int c, const plan_segment *sg, int n)
{
    for (int grad = 0; grad < 2; grad++) {
        plan_handoff_msg m;
        for (int from = 0; plan_handoff_next(sg, n, from, grad, &m); from = m.end) {
            table_row(t, p, k, c, grad ? GRAD_SENT : ACT_SENT)[m.src] += m.rows;
            double *most = &table_row(t, p, k, c, grad ? GRAD_RECV_MAX : ACT_RECV_MAX)[m.dst];
            *most = fmax(*most, m.rows);
        }
    }
}

int sim_handoff_table_build(const plan_t *p, sim_handoff_table **out, char *err)
{
    *out = NULL;
    sim_handoff_table *t = util_calloc(1, sizeof *t);
    if (!t) return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for the hand-off table");
    t->chunks = plan_chunks(p);
    t->world = p->world_size;
    bool any = false;
    for (int k = 0; k < p->n_modules; k++) any |= plan_encoder_feeds(p, k);
    if (any && t->chunks > 0 && t->world > 0) {
        t->rows = util_calloc((size_t)t->chunks * (size_t)p->n_modules * HANDOFF_NQ * (size_t)t->world, sizeof *t->rows);
        if (!t->rows) {
            util_free(t);
            return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for the hand-off table of %d ranks", p->world_size);
        }
    }
    for (int c = 0; t->rows && c < t->chunks; c++)
        for (int k = 0; k < p->n_modules; k++) {
            if (!plan_encoder_feeds(p, k)) continue;
            plan_segment *sg;
            int n;
            int rc = plan_handoff(p, k, c, &sg, &n, err);
            if (rc) {
                sim_handoff_table_free(t);
                return rc;
            }
            add_messages(t, p, k, c, sg, n);
            util_free(sg);
        }
    *out = t;
    return UTIL_OK;
}

void sim_handoff_table_free(sim_handoff_table *t)
{
    if (!t) return;
    util_free(t->rows);
    util_free(t);
}

/* fp32 (the CPU executor, executor/run.c): its hand-off buffers (one chunk
 * of rows, and of their gradients where an encoder trains: on each
 * encoder's side its own, on the LLM's side one every encoder's rows share;
 * executor/run_handoff.c) plus the peak of the messages along the rank's
 * schedule: a sent message is held until an op retires it (plan_op.retires)
 * or the step ends, a received one only until it is scattered. */
static double executor_handoff_bytes(const plan_t *p, int rank, const plan_schedule *s, const sim_handoff_table *t)
{
    int L = p->model.llm;
    plan_coord cd;
    double d = p->model.mod[L].hidden, buffers = 0;
    bool grads = false;   /* some encoder trains: the LLM keeps its rows' gradient for it */
    if (!t || !t->rows) return 0;
    /* (a buffer of no rows still takes one float) */
    for (int k = 0; k < p->n_modules; k++) {
        if (!plan_encoder_feeds(p, k)) continue;
        bool trains = model_trains(&p->model.mod[k]);
        grads |= trains;
        if (plan_rank_coord(p, k, rank, &cd))
            buffers += (trains ? 2 : 1) * fmax(1, (double)plan_max_share(p, k) * plan_rows_per_sample(p, k) / p->mod[k].sp * d);
    }
    if (plan_rank_coord(p, L, rank, &cd))
        buffers += (grads ? 2 : 1) * fmax(1, (double)plan_max_share(p, L) * plan_cp_encoder_rows(p, -1, rank) * d);
    double held = 0, peak = 0;
    for (int i = 0; i < s->n; i++) {
        const plan_op *o = &s->op[i];
        const plan_op_info *in = plan_op_props(o->kind);
        if (in->group != PLAN_GROUP_HANDOFF || o->chunk < 0 || o->chunk >= t->chunks || o->module < 0 || o->module >= p->n_modules)
            continue;
        int q = in->sends ? (in->grad ? GRAD_SENT : ACT_SENT) : (in->grad ? GRAD_RECV_MAX : ACT_RECV_MAX);
        double rows = table_row(t, p, o->module, o->chunk, q)[rank];
        double freed = o->retires >= 0 && o->retires < t->chunks   /* the op frees its side's sends of that chunk */
                     ? table_row(t, p, o->module, o->retires, plan_op_retired_grad(o->kind) ? GRAD_SENT : ACT_SENT)[rank] * d : 0;
        if (in->sends) held += rows * d - freed;   /* a send frees before it sends (run_ops.c) */
        peak = fmax(peak, held + (in->sends ? 0 : rows * d));
        if (!in->sends) held -= freed;             /* a receive after its messages are in */
    }
    return FP32_BYTES * (buffers + peak);
}

/* Each module's stage on the rank with the activation slots its schedule fills. */
void sim_rank_memory(const plan_t *p, int rank, const plan_schedule *sched, const sim_handoff_table *handoff,
                     plan_sim_mem *out)
{
    memset(out, 0, sizeof *out);
    plan_options o = plan_options_of(p);
    bool first = true;
    for (int k = 0; k < p->n_modules; k++) {
        plan_coord cd;
        if (!plan_rank_coord(p, k, rank, &cd)) continue;
        const plan_module *s = &p->mod[k];
        int in_flight = sched->slots[k];
        plan_mem m;
        const cost_gpu *g = &p->cluster.pool[s->pool].gpu;
        bool dhp = p->target == PLAN_TARGET_DHP;
        /* the Megatron target counts an LLM stage's 1F1B units itself (plan_stage_units_in_flight) */
        if (!dhp && k == p->model.llm && in_flight > 1) in_flight = 1;
        if (dhp && plan_vp(s) > 1)
            plan_stage_memory_slots(&p->model, k, s, cd.pp, &p->work, g, &o, sched->vslots, &m);
        else   /* the rank's own stage */
            plan_stage_memory(&p->model, k, s, cd.pp, &p->work, g, &o, in_flight, &m);
        if (in_flight == 0) m.activations = m.logits = 0;   /* no forward of the module runs here */
        if (!dhp && s->pp > 1) in_flight *= plan_stage_units_in_flight(s, &p->work, cd.pp);   /* the stage's units, for `slots` */
        out->params += m.params;
        out->grads += m.grads;
        out->optim += m.optim;
        out->activations += m.activations;
        out->logits += m.logits;
        out->comm += m.comm;
        out->zero_buffers += m.zero_buffers;
        out->other += m.fragmentation + (first ? m.reserved : 0);
        out->workspace += first ? m.workspace : 0;
        out->capacity = m.capacity;
        out->slots += in_flight;
        first = false;
    }
    if (p->target == PLAN_TARGET_DHP) out->comm += executor_handoff_bytes(p, rank, sched, handoff);
    out->total = out->params + out->grads + out->optim + out->zero_buffers + out->activations + out->logits + out->comm
               + out->workspace + out->other;
}

int plan_sim_memory(const plan_t *p, int rank, plan_sim_mem *out, char *err)
{
    plan_schedule s;
    sim_handoff_table *t;
    int rc = plan_schedule_rank(p, rank, &s, err);
    if (rc) return rc;
    if (!(rc = sim_handoff_table_build(p, &t, err))) sim_rank_memory(p, rank, &s, t, out);
    sim_handoff_table_free(t);
    plan_schedule_free(&s);
    return rc;
}
