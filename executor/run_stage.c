/* A pipelined module's stage edges in `dhp run`: the schedule's
 * SEND_STAGE / RECV_STAGE (a micro-batch's rows to the next stage) and
 * SEND_STAGE_GRAD / RECV_STAGE_GRAD (their gradient back), rank to rank at
 * the same dp, sp and tp position on the module's pipeline communicator
 * (plan_group_of over PLAN_AX_PP). Each edge and direction is a FIFO
 * channel (one tag, MPI's non-overtaking order), so a receive takes the
 * sends in the order the sender's schedule made them; a send stays in
 * flight until the next send on its edge, which waits for it before it
 * reuses the edge's buffer (the memory model counts those buffers:
 * planner/memory.c). */
#include "executor/run_internal.h"

#include <string.h>

enum { TAG_ACT = 1, TAG_GRAD = 2 };

/* The module runs a backward: an encoder that trains, the LLM always
 * (plan_schedule_check refuses a plan where nothing trains). */
static bool backprops(const run_ctx *r, int k) { return k == r->plan.model.llm || r->mod[k].trains; }

/* Floats of the largest micro-batch's rows at a stage boundary (plan_stage_hop_bytes at the executor's fp32). */
static size_t edge_floats(const run_ctx *r, int k)
{
    const plan_t *p = &r->plan;
    plan_options o = plan_options_of(p);
    o.precision = PLAN_OPT_FP32;
    double bytes = plan_stage_hop_bytes(&p->model, k, &p->mod[k], &p->work, &o, p->mod[k].micro_batch);
    return (size_t)(bytes / sizeof(float) + 0.5);
}

int run_stage_init(run_ctx *r, int k, char *err)
{
    run_module *m = &r->mod[k];
    run_stage *st = &m->st;
    int pp = r->plan.mod[k].pp;
    st->prev = m->at.pp > 0 ? m->at.pp - 1 : -1;
    st->next = m->at.pp < pp - 1 ? m->at.pp + 1 : -1;
    if (pp <= 1) return UTIL_OK;
    bool back = backprops(r, k);
    st->cap = edge_floats(r, k);
    size_t bytes = (st->cap ? st->cap : 1) * sizeof(float);
    if (st->prev >= 0) {
        st->act_in = r->be->alloc(bytes, UTIL_MEM_COMM);
        if (back) st->grad_out = r->be->alloc(bytes, UTIL_MEM_COMM);
        if (!st->act_in || (back && !st->grad_out)) return util_fail(err, UTIL_ENOMEM, "run: out of memory for pipeline buffers");
    }
    if (st->next >= 0) {
        st->act_out = r->be->alloc(bytes, UTIL_MEM_COMM);
        if (back) st->grad_in = r->be->alloc(bytes, UTIL_MEM_COMM);
        if (!st->act_out || (back && !st->grad_in)) return util_fail(err, UTIL_ENOMEM, "run: out of memory for pipeline buffers");
    }
    return UTIL_OK;
}

static int wait_edge(run_stage *st, ex_request **req, char *err)
{
    if (!*req) return UTIL_OK;
    int rc = ex_comm_wait(st->pp, *req);
    *req = NULL;
    return rc ? util_fail(err, UTIL_ERUNTIME, "run: a pipeline send failed: %s", ex_comm_error(st->pp)) : UTIL_OK;
}

int run_stage_send(run_ctx *r, int k, bool grad, const float *src, int rows, char *err)
{
    run_stage *st = &r->mod[k].st;
    int peer = grad ? st->prev : st->next;
    float *buf = grad ? st->grad_out : st->act_out;
    ex_request **req = grad ? &st->grad_req : &st->act_req;
    size_t n = (size_t)rows * (size_t)r->plan.model.mod[k].hidden;
    if (peer < 0 || !buf) return util_fail(err, UTIL_EINVAL, "run: module %s: no pipeline stage to send to", r->plan.mod[k].module);
    if (n > st->cap) return util_fail(err, UTIL_EINVAL, "run: module %s: %d rows exceed the pipeline buffer", r->plan.mod[k].module, rows);
    int rc = wait_edge(st, req, err);
    if (rc) return rc;
    if (src) r->be->d2d(buf, src, n * sizeof(float));
    if (ex_comm_isend(st->pp, buf, n, peer, grad ? TAG_GRAD : TAG_ACT, req))
        return util_fail(err, UTIL_ERUNTIME, "run: module %s: pipeline send to stage %d failed: %s", r->plan.mod[k].module, peer,
                         ex_comm_error(st->pp));
    return UTIL_OK;
}

int run_stage_recv(run_ctx *r, int k, bool grad, int rows, const float **out, char *err)
{
    run_stage *st = &r->mod[k].st;
    int peer = grad ? st->next : st->prev;
    float *buf = grad ? st->grad_in : st->act_in;
    size_t n = (size_t)rows * (size_t)r->plan.model.mod[k].hidden;
    if (peer < 0 || !buf) return util_fail(err, UTIL_EINVAL, "run: module %s: no pipeline stage to receive from", r->plan.mod[k].module);
    if (n > st->cap) return util_fail(err, UTIL_EINVAL, "run: module %s: %d rows exceed the pipeline buffer", r->plan.mod[k].module, rows);
    if (ex_comm_recv(st->pp, buf, n, peer, grad ? TAG_GRAD : TAG_ACT))
        return util_fail(err, UTIL_ERUNTIME, "run: module %s: pipeline receive from stage %d failed: %s", r->plan.mod[k].module, peer,
                         ex_comm_error(st->pp));
    *out = buf;
    return UTIL_OK;
}

int run_stage_wait_all(run_ctx *r, char *err)
{
    int rc = UTIL_OK;
    for (int k = 0; k < r->plan.n_modules; k++) {
        run_stage *st = &r->mod[k].st;
        char e[UTIL_ERR_LEN];
        int a = wait_edge(st, &st->act_req, e), b = wait_edge(st, &st->grad_req, e);
        if (!rc && (a || b)) rc = util_fail(err, UTIL_ERUNTIME, "%s", e);
    }
    return rc;
}

void run_stage_free(run_ctx *r, int k)
{
    run_stage *st = &r->mod[k].st;
    char err[UTIL_ERR_LEN];
    wait_edge(st, &st->act_req, err);
    wait_edge(st, &st->grad_req, err);
    if (r->be) { r->be->release(st->act_in); r->be->release(st->grad_out); r->be->release(st->act_out); r->be->release(st->grad_in); }
    ex_comm_free(st->pp);
    memset(st, 0, sizeof *st);
}
