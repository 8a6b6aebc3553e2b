/* The communicator's MPI implementation (comm_int.h's operations table):
 * every collective and point-to-point operation is posted non-blocking
 * (MPI-3's MPI_Iallreduce etc.) and polled with MPI_Testall through
 * comm_poll, which owns the timeout. MPI takes int counts: calls above
 * ex_comm_set_max_piece elements are split in pieces. The NCCL
 * implementation uses these operations for data in host memory. */
#include "executor/bf16.h"
#include "executor/comm.h"
#include "executor/comm_int.h"
#include "util/util.h"

#include <mpi.h>
#include <stdio.h>
#include <string.h>

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* UTIL_OK, or UTIL_ERUNTIME with "call: MPI's message" in c->err. */
static int mpi_check(ex_comm *c, int rc, const char *call)
{
    if (rc == MPI_SUCCESS) return UTIL_OK;
    char s[MPI_MAX_ERROR_STRING] = "";
    return comm_fail(c, "%s: %s", call, comm_mpi_message(rc, s));
}

typedef struct {
    int n;
    MPI_Request *reqs;
    MPI_Status *st;
    const char *call;
} mpi_waiting;

static int test_all(ex_comm *c, void *arg, bool *done)
{
    mpi_waiting *w = arg;
    int flag = 0, rc = MPI_Testall(w->n, w->reqs, &flag, w->st ? w->st : MPI_STATUSES_IGNORE);
    *done = flag;
    return mpi_check(c, rc, w->call);
}

/* Polls reqs until all complete (statuses filled if st); `peer` as comm_poll's. */
static int wait_reqs(ex_comm *c, int n, MPI_Request *reqs, MPI_Status *st, int peer, const char *call)
{
    mpi_waiting w = { n, reqs, st, call };
    return comm_poll(c, test_all, &w, peer, call);
}

/* Posted with rc; waited for when posted. */
static int finish(ex_comm *c, int rc, MPI_Request *req, const char *call)
{
    return rc != MPI_SUCCESS ? mpi_check(c, rc, call) : wait_reqs(c, 1, req, NULL, -1, call);
}

static int mpi_barrier(ex_comm *c)
{
    MPI_Request req;
    return finish(c, MPI_Ibarrier(c->mpi, &req), &req, "MPI_Barrier");
}

static MPI_Datatype mpi_type(comm_dtype t)
{
    return t == COMM_F32 ? MPI_FLOAT : t == COMM_F64 ? MPI_DOUBLE : t == COMM_I32 ? MPI_INT : t == COMM_BF16 ? MPI_UINT16_T : MPI_BYTE;
}

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    ex_bf16_sum_into(in, inout, (size_t)*len);
}

/* MPI's op for a sum of t: bf16 sums through a user op (commutative), created once. */
static int sum_op(ex_comm *c, comm_dtype t, MPI_Op *op)
{
    static MPI_Op bf16_op = MPI_OP_NULL;
    *op = MPI_SUM;
    if (t != COMM_BF16) return UTIL_OK;
    if (bf16_op == MPI_OP_NULL) {
        int rc = MPI_Op_create(bf16_sum, 1, &bf16_op);
        if (rc != MPI_SUCCESS) return mpi_check(c, rc, "MPI_Op_create(bf16 sum)");
    }
    *op = bf16_op;
    return UTIL_OK;
}

/* In place, in pieces of max_piece elements. */
static int mpi_allreduce(ex_comm *c, void *buf, size_t n, comm_dtype t, comm_redop op)
{
    static const char *names[2][4] = {
        { "MPI_Allreduce(sum)", "MPI_Allreduce(sum f64)", "MPI_Allreduce(sum int)", "MPI_Allreduce(sum bf16)" },
        { "MPI_Allreduce(max)", "MPI_Allreduce(max f64)", "MPI_Allreduce(max int)", "MPI_Allreduce(max bf16)" } };
    const char *call = names[op == COMM_MAX][t == COMM_F64 ? 1 : t == COMM_I32 ? 2 : t == COMM_BF16 ? 3 : 0];
    size_t esz = comm_dtype_size(t), piece = comm_max_piece();
    MPI_Op mop = MPI_MAX;
    if (t == COMM_BF16 && op == COMM_MAX) return comm_fail(c, "%s: not supported", call);
    if (op == COMM_SUM && sum_op(c, t, &mop)) return UTIL_ERUNTIME;
    for (size_t o = 0; o < n; o += piece) {
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + o * esz, (int)min_sz(piece, n - o), mpi_type(t), mop, c->mpi, &req);
        if ((rc = finish(c, rc, &req, call))) return rc;
    }
    return UTIL_OK;
}

/* l elements of dt whose extent is n elements: one rank's piece inside a
 * buffer of equal n-element chunks, so a piece of every chunk moves per call. */
static int strided_type(ex_comm *c, size_t l, size_t n, MPI_Datatype dt, size_t esz, MPI_Datatype *out)
{
    MPI_Datatype t0;
    int rc = MPI_Type_contiguous((int)l, dt, &t0);
    if (rc != MPI_SUCCESS) return mpi_check(c, rc, "MPI_Type_contiguous");
    rc = MPI_Type_create_resized(t0, 0, (MPI_Aint)(n * esz), out);
    MPI_Type_free(&t0);
    if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(out)) != MPI_SUCCESS) MPI_Type_free(out);
    return mpi_check(c, rc, "MPI_Type_create_resized");
}

typedef enum { CH_ALLGATHER, CH_ALLTOALL, CH_GATHER } chunked_op;

/* Allgather / alltoall / gather of equal n-element chunks (recv used at root
 * only for gather). Above max_piece, each call moves one piece of every chunk. */
static int chunked(ex_comm *c, chunked_op op, const void *send, void *recv, size_t n,
                   MPI_Datatype dt, size_t esz, int root, const char *call)
{
    size_t piece = comm_max_piece();
    for (size_t o = 0; o < n; o += piece) {
        size_t l = min_sz(piece, n - o);
        MPI_Datatype t = dt;
        int tc = (int)l, rc;
        if (l < n) {
            if ((rc = strided_type(c, l, n, dt, esz, &t)) != UTIL_OK) return rc;
            tc = 1;
        }
        const char *s = (const char *)send + o * esz;
        char *r = recv ? (char *)recv + o * esz : NULL;
        MPI_Request req;
        if (op == CH_ALLGATHER) rc = MPI_Iallgather(s, (int)l, dt, r, tc, t, c->mpi, &req);
        else if (op == CH_ALLTOALL) rc = MPI_Ialltoall(s, tc, t, r, tc, t, c->mpi, &req);
        else rc = MPI_Igather(s, (int)l, dt, r, tc, t, root, c->mpi, &req);
        rc = finish(c, rc, &req, call);
        if (t != dt) MPI_Type_free(&t);
        if (rc != UTIL_OK) return rc;
    }
    return UTIL_OK;
}

static int mpi_allgather(ex_comm *c, const float *send, float *recv, size_t n)
{
    return chunked(c, CH_ALLGATHER, send, recv, n, MPI_FLOAT, sizeof(float), 0, "MPI_Allgather");
}

static int mpi_alltoall(ex_comm *c, const float *send, float *recv, size_t chunk)
{
    return chunked(c, CH_ALLTOALL, send, recv, chunk, MPI_FLOAT, sizeof(float), 0, "MPI_Alltoall");
}

static int mpi_gather_bytes(ex_comm *c, const void *send, void *recv, size_t bytes, int root)
{
    return chunked(c, CH_GATHER, send, recv, bytes, MPI_BYTE, 1, root, "MPI_Gather");
}

/* Reduce-scatter of equal chunks; above max_piece, one MPI_Reduce per piece
 * and root (MPI's predefined sums do not take the strided derived type). */
static int mpi_reduce_scatter(ex_comm *c, const void *send, void *recv, size_t n, comm_dtype t)
{
    const char *call = t == COMM_BF16 ? "MPI_Reduce_scatter_block(bf16)" : "MPI_Reduce_scatter_block";
    size_t piece = comm_max_piece(), esz = comm_dtype_size(t);
    MPI_Request req;
    MPI_Op op;
    if (sum_op(c, t, &op)) return UTIL_ERUNTIME;
    if (n <= piece) return finish(c, MPI_Ireduce_scatter_block(send, recv, (int)n, mpi_type(t), op, c->mpi, &req), &req, call);
    int rc = UTIL_OK;
    for (size_t o = 0; o < n && rc == UTIL_OK; o += piece)
        for (int r = 0; r < c->size && rc == UTIL_OK; r++)
            rc = finish(c, MPI_Ireduce((const char *)send + ((size_t)r * n + o) * esz, r == c->rank ? (char *)recv + o * esz : NULL,
                                       (int)min_sz(piece, n - o), mpi_type(t), op, r, c->mpi, &req), &req, call);
    return rc;
}

static int mpi_bcast(ex_comm *c, void *buf, size_t bytes, int root)
{
    size_t piece = comm_max_piece();
    for (size_t o = 0; o < bytes; o += piece) {
        MPI_Request req;
        int rc = MPI_Ibcast((char *)buf + o, (int)min_sz(piece, bytes - o), MPI_BYTE, root, c->mpi, &req);
        if ((rc = finish(c, rc, &req, "MPI_Bcast"))) return rc;
    }
    return UTIL_OK;
}

/* ---- point-to-point: one MPI request per piece of at most max_piece floats
 * (same tag, so MPI's non-overtaking order matches the pieces) ---- */

typedef struct {
    int npieces;
    size_t piece;         /* max_piece when posted */
    MPI_Request mreq[];
} mpi_req;

static int mpi_post(ex_comm *c, ex_request *r)
{
    size_t piece = comm_max_piece();
    int npieces = r->n == 0 ? 1 : (int)((r->n + piece - 1) / piece);
    mpi_req *m = util_calloc(1, sizeof *m + (size_t)npieces * sizeof(MPI_Request));
    if (!m) return comm_fail(c, "comm: out of memory for a request");
    m->npieces = npieces;
    m->piece = piece;
    for (int i = 0; i < npieces; i++) {
        size_t o = (size_t)i * piece;
        int l = (int)min_sz(piece, r->n - o), rc;
        float *b = r->buf ? r->buf + o : NULL;
        rc = r->send ? MPI_Isend(b, l, MPI_FLOAT, r->peer, r->tag, c->mpi, &m->mreq[i])
                     : MPI_Irecv(b, l, MPI_FLOAT, r->peer, r->tag, c->mpi, &m->mreq[i]);
        if (rc != MPI_SUCCESS) {
            while (i-- > 0) MPI_Request_free(&m->mreq[i]);
            util_free(m);
            return mpi_check(c, rc, r->send ? "MPI_Isend" : "MPI_Irecv");
        }
    }
    r->impl = m;
    return UTIL_OK;
}

/* Waits for every piece; a receive must get exactly the floats it posted. */
static int wait_p2p(ex_comm *c, ex_request *r, mpi_req *m)
{
    char what[64];
    snprintf(what, sizeof what, "MPI_Wait(%s %d, tag %d)", r->send ? "send to" : "recv from", r->peer, r->tag);
    if (comm_check_live(c, what)) return UTIL_ERUNTIME;
    for (int i = 0; i < m->npieces; i++) {
        MPI_Status st;
        int rc = wait_reqs(c, 1, &m->mreq[i], &st, r->peer, what), count = 0;
        if (rc == UTIL_OK && !r->send) {
            size_t want = min_sz(m->piece, r->n - (size_t)i * m->piece);
            MPI_Get_count(&st, MPI_FLOAT, &count);
            if ((size_t)count != want)
                rc = comm_fail(c, "MPI_Wait(recv from %d, tag %d): got %d floats, posted %zu", r->peer, r->tag, count, want);
        }
        if (rc != UTIL_OK) {
            if (!comm_broken())
                while (++i < m->npieces) MPI_Request_free(&m->mreq[i]);
            return UTIL_ERUNTIME;
        }
    }
    return UTIL_OK;
}

/* A non-blocking collective: one MPI request, or a request already done
 * where the call is above max_piece (the blocking form ran). */
static const char *coll_call(const ex_request *r)
{
    return r->allreduce ? "MPI_Iallreduce(sum)" : r->reduce ? "MPI_Ireduce_scatter_block" : "MPI_Iallgather";
}

static int mpi_post_coll(ex_comm *c, ex_request *r, const float *send, float *recv, size_t n)
{
    if (n > comm_max_piece()) {
        r->kind = REQ_DONE;
        return r->allreduce ? mpi_allreduce(c, recv, n, COMM_F32, COMM_SUM)
             : r->reduce    ? mpi_reduce_scatter(c, send, recv, n, COMM_F32) : mpi_allgather(c, send, recv, n);
    }
    mpi_req *m = util_calloc(1, sizeof *m + sizeof(MPI_Request));
    if (!m) return comm_fail(c, "comm: out of memory for a request");
    m->npieces = 1;
    m->piece = n;
    int rc = r->allreduce ? MPI_Iallreduce(MPI_IN_PLACE, recv, (int)n, MPI_FLOAT, MPI_SUM, c->mpi, &m->mreq[0])
           : r->reduce    ? MPI_Ireduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, c->mpi, &m->mreq[0])
                          : MPI_Iallgather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, c->mpi, &m->mreq[0]);
    if (rc != MPI_SUCCESS) { util_free(m); return mpi_check(c, rc, coll_call(r)); }
    r->impl = m;
    return UTIL_OK;
}

static int mpi_wait(ex_comm *c, ex_request *r)
{
    mpi_req *m = r->impl;
    int rc = UTIL_OK;
    if (!r->coll) rc = wait_p2p(c, r, m);
    else if (!(rc = comm_check_live(c, "MPI_Wait")))
        rc = wait_reqs(c, 1, &m->mreq[0], NULL, -1, coll_call(r));
    util_free(m);
    r->impl = NULL;
    return rc;
}

/* Host memory: messages to self are plain copies, buffered sends COMM memory. */
static int host_copy(void *dst, const void *src, size_t bytes)
{
    memmove(dst, src, bytes);
    return UTIL_OK;
}

static void *host_alloc(size_t bytes) { return util_malloc_cat(UTIL_MEM_COMM, bytes); }

static void host_release(void *p, size_t bytes)
{
    (void)bytes;   /* util_free knows the size and the category */
    util_free(p);
}

const ex_comm_ops comm_mpi_ops = {
    .name = "mpi",
    .barrier = mpi_barrier,
    .allreduce = mpi_allreduce,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .alltoall = mpi_alltoall,
    .bcast = mpi_bcast,
    .gather_bytes = mpi_gather_bytes,
    .post = mpi_post,
    .post_coll = mpi_post_coll,
    .wait = mpi_wait,
    .copy = host_copy,
    .alloc = host_alloc,
    .release = host_release,
};
