/* The simulator's memory per rank: each module stage's memory model
 * (plan_stage_memory) with the activation slots the rank's schedule fills,
 * and the executor's hand-off buffers and messages along the schedule. */
#include "planner/sim_int.h"

#include <math.h>
#include <string.h>

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
 * of rows, activations and gradients: on each encoder's side its own, on the
 * LLM's side one pair every encoder's rows share) plus the peak of the
 * messages along the rank's schedule: a sent message is held until the step
 * ends, a received one only until it is scattered. */
static double executor_handoff_bytes(const plan_t *p, int rank, const plan_schedule *s)
{
    int L = p->model.llm;
    bool any = false;
    plan_coord cd;
    double d = p->model.mod[L].hidden, buffers = 0;
    /* (a buffer of no rows still takes one float) */
    for (int k = 0; k < p->n_modules; k++) {
        if (!plan_encoder_feeds(p, k)) continue;
        any = true;
        if (plan_rank_coord(p, k, rank, &cd))
            buffers += 2 * fmax(1, (double)plan_max_share(p, k) * plan_rows_per_sample(p, k) / p->mod[k].sp * d);
    }
    if (!any) return 0;
    if (plan_rank_coord(p, L, rank, &cd)) buffers += 2 * fmax(1, (double)plan_max_share(p, L) * plan_cp_encoder_rows(p, -1, rank) * d);
    double held = 0, peak = 0, rows[64];
    for (int i = 0; i < s->n; i++) {
        const plan_op *o = &s->op[i];
        bool send = o->kind == PLAN_OP_SEND_ACT || o->kind == PLAN_OP_SEND_GRAD;
        bool recv = o->kind == PLAN_OP_RECV_ACT || o->kind == PLAN_OP_RECV_GRAD;
        if (!send && !recv) continue;
        bool grad = o->kind == PLAN_OP_SEND_GRAD || o->kind == PLAN_OP_RECV_GRAD;
        int n;
        if (chunk_message_rows(p, o->module, o->chunk, rank, grad, send, rows, 64, &n)) continue;
        for (int j = 0; j < n; j++) {
            if (send) held += rows[j] * d;
            peak = fmax(peak, held + (recv ? rows[j] * d : 0));
        }
    }
    return FP32_BYTES * (buffers + peak);
}

/* Each module's stage on the rank with the activation slots its schedule fills. */
void sim_rank_memory(const plan_t *p, int rank, const plan_schedule *sched, plan_sim_mem *out)
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
        if (p->target == PLAN_TARGET_DHP && plan_vp(s) > 1) {
            plan_stage_memory_slots(&p->model, k, s, cd.pp, &p->work, g, &o, sched->vslots, &m);
        } else if (p->target == PLAN_TARGET_DHP) {
            plan_stage_memory(&p->model, k, s, cd.pp, &p->work, g, &o, in_flight, &m);
        } else {
            /* Megatron's formulas take the worst stage with its 1F1B micro-batches (plan_module_memory) */
            if (k == p->model.llm && in_flight > 1) in_flight = 1;
            plan_module_memory(&p->model, k, s, &p->work, g, &o, in_flight, &m);
        }
        if (in_flight == 0) m.activations = m.logits = 0;   /* no forward of the module runs here */
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
    if (p->target == PLAN_TARGET_DHP) out->comm += executor_handoff_bytes(p, rank, sched);
    out->total = out->params + out->grads + out->optim + out->zero_buffers + out->activations + out->logits + out->comm
               + out->workspace + out->other;
}

int plan_sim_memory(const plan_t *p, int rank, plan_sim_mem *out, char *err)
{
    plan_schedule s;
    int rc = plan_schedule_rank(p, rank, &s, err);
    if (rc) return rc;
    sim_rank_memory(p, rank, &s, out);
    plan_schedule_free(&s);
    return UTIL_OK;
}
