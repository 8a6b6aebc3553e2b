/* Point-to-point (executor/comm.h): checks, counting and the messages to one's
 * own rank, for every implementation. Messages to self never reach the
 * implementation: they are matched by tag against the communicator's FIFO of
 * pending self sends and self receives, so a blocking send to self (buffered
 * here, in the implementation's memory: host for MPI, the device's for NCCL)
 * cannot hang. Messages to other ranks are the implementation's requests. */
#include "executor/comm.h"
#include "executor/comm_int.h"
#include "util/util.h"

#include <stdio.h>

#define TAG_LIMIT (1 << 20)

struct self_msg {
    struct self_msg *next;
    int tag;
    size_t n;
    const float *src;   /* the sender's buffer, or `owned` once the send was waited on */
    float *owned;
    ex_request *sender; /* the send request while it is not yet complete */
};

void comm_self_free(ex_comm *c)
{
    while (c->sends) {
        self_msg *m = c->sends;
        c->sends = m->next;
        if (m->owned) c->ops->release(m->owned, m->n * sizeof(float));
        util_free(m);
    }
}

static int check_p2p(ex_comm *c, const void *buf, size_t n, int peer, int tag, ex_request **req, const char *call)
{
    if (req) *req = NULL;
    if (tag < 0 || tag >= TAG_LIMIT) return comm_fail(c, "%s: tag %d not in [0, %d)", call, tag, TAG_LIMIT);
    if (peer < 0 || peer >= c->size) return comm_fail(c, "%s: peer %d not in [0, %d)", call, peer, c->size);
    if (n && !buf) return comm_fail(c, "%s: NULL buffer", call);
    if (!req) return comm_fail(c, "%s: NULL request", call);
    return UTIL_OK;
}

/* A receive completed from src (a sender's buffer or a buffered copy). */
static int deliver(ex_comm *c, ex_request *recv, const float *src, size_t n)
{
    recv->got = n;
    recv->done = true;
    return n == recv->n && n ? c->ops->copy(recv->buf, src, n * sizeof(float)) : UTIL_OK;
}

/* A send to self: completes the oldest matching posted receive, else queues. */
static int self_send(ex_comm *c, ex_request *r, const float *buf)
{
    for (ex_request **p = &c->recvs; *p; p = &(*p)->next) {
        if ((*p)->tag != r->tag) continue;
        ex_request *recv = *p;
        *p = recv->next;
        return deliver(c, recv, buf, r->n);
    }
    self_msg *m = util_calloc(1, sizeof *m);
    if (!m) return comm_fail(c, "comm: out of memory for a self send");
    *m = (self_msg){ .tag = r->tag, .n = r->n, .src = buf, .sender = r };
    self_msg **tail = &c->sends;
    while (*tail) tail = &(*tail)->next;
    *tail = m;
    r->msg = m;
    return UTIL_OK;
}

/* A receive from self: takes the oldest matching queued send, else is posted. */
static int self_recv(ex_comm *c, ex_request *r)
{
    for (self_msg **p = &c->sends; *p; p = &(*p)->next) {
        if ((*p)->tag != r->tag) continue;
        self_msg *m = *p;
        *p = m->next;
        int rc = deliver(c, r, m->src, m->n);
        if (m->sender) m->sender->msg = NULL;
        if (m->owned) c->ops->release(m->owned, m->n * sizeof(float));
        util_free(m);
        return rc;
    }
    ex_request **tail = &c->recvs;
    while (*tail) tail = &(*tail)->next;
    *tail = r;
    return UTIL_OK;
}

static int post(ex_comm *c, float *buf, size_t n, int peer, int tag, ex_request **req, bool send)
{
    const char *call = send ? "isend" : "irecv";
    if (check_p2p(c, buf, n, peer, tag, req, call) != UTIL_OK) return UTIL_ERUNTIME;
    bool to_self = peer == c->rank;
    if (!to_self && comm_check_live(c, call)) return UTIL_ERUNTIME;
    ex_request *r = util_calloc(1, sizeof *r);
    if (!r) return comm_fail(c, "comm: out of memory for a request");
    *r = (ex_request){ .kind = to_self ? (send ? REQ_SELF_SEND : REQ_SELF_RECV) : REQ_IMPL,
                       .send = send, .peer = peer, .tag = tag, .buf = buf, .n = n };
    int rc = !to_self ? c->ops->post(c, r) : send ? self_send(c, r, buf) : self_recv(c, r);
    if (rc != UTIL_OK) { util_free(r); return rc; }
    if (send) c->bytes += (uint64_t)n * sizeof(float);
    *req = r;
    return UTIL_OK;
}

int ex_comm_isend(ex_comm *c, const float *buf, size_t n, int peer, int tag, ex_request **req)
{
    return post(c, (float *)buf, n, peer, tag, req, true);
}

int ex_comm_irecv(ex_comm *c, float *buf, size_t n, int peer, int tag, ex_request **req)
{
    return post(c, buf, n, peer, tag, req, false);
}

/* A self send still queued takes a private copy of its payload (so the
 * caller's buffer is free again); a self receive must have been matched. */
static int wait_self(ex_comm *c, ex_request *r)
{
    if (r->kind == REQ_SELF_SEND) {
        self_msg *m = r->msg;
        if (!m) return UTIL_OK;
        m->sender = NULL;
        if (m->n && !(m->owned = c->ops->alloc(m->n * sizeof(float)))) {
            m->src = NULL;
            m->n = 0;
            return comm_fail(c, "send to self: out of memory buffering %zu floats", r->n);
        }
        int rc = m->n ? c->ops->copy(m->owned, m->src, m->n * sizeof(float)) : UTIL_OK;
        m->src = m->owned;
        return rc == UTIL_OK ? UTIL_OK : comm_fail(c, "send to self: buffering %zu floats failed", r->n);
    }
    if (!r->done) {
        ex_request **p = &c->recvs;
        while (*p && *p != r) p = &(*p)->next;
        if (*p) *p = r->next;
        return comm_fail(c, "recv from own rank %d, tag %d: no matching send (would deadlock)", c->rank, r->tag);
    }
    if (r->got != r->n)
        return comm_fail(c, "recv from own rank %d, tag %d: message of %zu floats, receive of %zu",
                         c->rank, r->tag, r->got, r->n);
    return UTIL_OK;
}

int ex_comm_wait(ex_comm *c, ex_request *req)
{
    if (!req) return comm_fail(c, "ex_comm_wait: NULL request");
    int rc = req->kind == REQ_DONE ? UTIL_OK
           : req->kind == REQ_IMPL ? c->ops->wait(c, req) : wait_self(c, req);
    util_free(req);
    return rc;
}

int ex_comm_start(ex_comm *c)
{
    if (!c) return UTIL_ERUNTIME;
    if (c->self || !c->ops->start) return UTIL_OK;
    return comm_check_live(c, "start") ? UTIL_ERUNTIME : c->ops->start(c);
}

int ex_comm_send(ex_comm *c, const float *buf, size_t n, int peer, int tag)
{
    ex_request *r;
    int rc = ex_comm_isend(c, buf, n, peer, tag, &r);
    return rc == UTIL_OK ? ex_comm_wait(c, r) : rc;
}

int ex_comm_recv(ex_comm *c, float *buf, size_t n, int peer, int tag)
{
    ex_request *r;
    int rc = ex_comm_irecv(c, buf, n, peer, tag, &r);
    return rc == UTIL_OK ? ex_comm_wait(c, r) : rc;
}
