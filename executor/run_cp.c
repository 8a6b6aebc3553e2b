/* The LLM's ring attention under `dhp run` (executor/ring.c): its messages
 * (ex_parallel.p2p_start, p2p_wait) as non-blocking sends and receives on
 * the module's sp communicator, whose keys are the sp ranks. */
#include "executor/run_internal.h"

#define P2P_MAX 16

typedef struct {
    int n;
    ex_request *req[P2P_MAX];
} p2p_request;

static int p2p_start(void *ctx, const ex_p2p *m, void **out)
{
    ex_comm *c = ((run_hooks *)ctx)->sp;
    p2p_request *r = *out;
    if (!r && !(r = util_calloc(1, sizeof *r))) return UTIL_ENOMEM;
    *out = r;
    if (r->n + m->n_recv + m->n_send > P2P_MAX) return UTIL_EINVAL;
    /* receives first, so a send to oneself finds its receive posted */
    for (int i = 0; i < m->n_recv; i++)
        if (ex_comm_irecv(c, m->recv[i], m->recv_n[i], m->from, m->tag + i, &r->req[r->n++])) { r->n--; return UTIL_ERUNTIME; }
    for (int i = 0; i < m->n_send; i++)
        if (ex_comm_isend(c, m->send[i], m->send_n[i], m->to, m->tag + i, &r->req[r->n++])) { r->n--; return UTIL_ERUNTIME; }
    return UTIL_OK;
}

static int p2p_wait(void *ctx, void *req)
{
    ex_comm *c = ((run_hooks *)ctx)->sp;
    p2p_request *r = req;
    int rc = UTIL_OK;
    for (int i = 0; i < r->n; i++)
        if (ex_comm_wait(c, r->req[i]) && !rc) rc = UTIL_ERUNTIME;
    util_free(r);
    return rc;
}

void run_cp_hooks(ex_parallel *par)
{
    par->p2p_start = p2p_start;
    par->p2p_wait = p2p_wait;
}
