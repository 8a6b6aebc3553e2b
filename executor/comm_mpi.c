/* The communicator interface (executor/comm.h) on MPI, plus the MPI-less
 * 1-rank self communicator. Messages to one's own rank never go through MPI:
 * they are matched by tag against an internal FIFO of pending self sends and
 * self receives, so a blocking send to self (buffered here) cannot hang.
 *
 * No wait is unbounded: every collective and point-to-point operation is
 * posted non-blocking (MPI-3's MPI_Iallreduce etc.) and polled with
 * MPI_Testall, so a rank that was killed, stopped (SIGSTOP) or is stuck
 * cannot hold the others forever. After ex_comm_set_timeout seconds the wait
 * ends with one line naming this rank, the operation and the ranks that did
 * not answer a ping (comm_diag.c); the communicator is then broken, later
 * calls fail at once, and MPI is not finalized (that would wait again), so
 * the launcher ends the job. */
#include "executor/comm.h"
#include "executor/comm_int.h"
#include "util/util.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG_LIMIT (1 << 20)

typedef struct self_msg {
    struct self_msg *next;
    int tag;
    size_t n;
    const float *src;   /* the sender's buffer, or `owned` once the send was waited on */
    float *owned;
    ex_request *sender; /* the send request while it is not yet complete */
} self_msg;

typedef enum { REQ_MPI_SEND, REQ_MPI_RECV, REQ_SELF_SEND, REQ_SELF_RECV, REQ_MPI_COLL, REQ_DONE } req_kind;

struct ex_request {
    req_kind kind;
    int peer, tag;
    float *buf;           /* receives */
    size_t n, got;        /* floats posted / floats delivered (self receives) */
    bool done;            /* self receive delivered */
    self_msg *msg;        /* self send still queued */
    ex_request *next;     /* in the comm's list of pending self receives */
    int npieces;
    size_t piece;         /* max_piece when posted */
    MPI_Request mreq[];   /* one per piece of at most max_piece floats */
};

struct ex_comm {
    bool self;            /* the MPI-less communicator: no MPI call at all */
    MPI_Comm mpi;
    int rank, size;
    uint64_t bytes;
    self_msg *sends;      /* queued sends to self, oldest first */
    ex_request *recvs;    /* posted receives from self, oldest first */
    char err[UTIL_ERR_LEN];
};

static size_t g_max_piece = (size_t)1 << 30;
static bool g_we_initialised;
static double g_timeout_s = -1;   /* < 0: not set yet (DHP_COMM_TIMEOUT, else the default) */
static bool g_broken;             /* a wait timed out: MPI state is unknown */

/* Long enough for any step's compute between two communications of a
 * rank (minutes on a CPU for the largest zoo models' micro-batches). */
#define DEFAULT_TIMEOUT_S 600.0

void ex_comm_set_timeout(double seconds) { g_timeout_s = seconds < 0 ? 0 : seconds; }

double ex_comm_timeout(void)
{
    if (g_timeout_s < 0) {
        const char *v = getenv("DHP_COMM_TIMEOUT");
        char *end = NULL;
        double t = v ? strtod(v, &end) : -1;
        g_timeout_s = v && end != v && !*end && t >= 0 ? t : DEFAULT_TIMEOUT_S;
    }
    return g_timeout_s;
}

void ex_comm_set_max_piece(size_t elems)
{
    g_max_piece = elems == 0 ? 1 : elems > INT_MAX ? (size_t)INT_MAX : elems;
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

__attribute__((format(printf, 2, 3)))
static int comm_fail(ex_comm *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return UTIL_ERUNTIME;
}

/* UTIL_OK, or UTIL_ERUNTIME with "call: MPI's message" in c->err. */
static int mpi_check(ex_comm *c, int rc, const char *call)
{
    if (rc == MPI_SUCCESS) return UTIL_OK;
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, s, &len);
    return comm_fail(c, "%s: %s", call, s);
}

static const char *mpi_message(int rc, char *s)
{
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
    return s;
}

static bool yield_when_idle(void)
{
    static int yield = -1;
    if (yield < 0) {
        const char *y = getenv("OMPI_MCA_mpi_yield_when_idle"), *o = getenv("OMPI_MCA_mpi_oversubscribe");
        yield = y ? atoi(y) != 0 : o ? atoi(o) != 0 : 0;
    }
    return yield;
}

/* Polls reqs until all complete (statuses filled if st), answering other
 * ranks' pings meanwhile; after the timeout, one line names what is missing. */
static int wait_reqs(ex_comm *c, int n, MPI_Request *reqs, MPI_Status *st, int peer, const char *call)
{
    double start = util_now(), limit = ex_comm_timeout();
    for (unsigned spin = 1;; spin++) {
        int done = 0, rc = MPI_Testall(n, reqs, &done, st ? st : MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_check(c, rc, call);
        if (done) return UTIL_OK;
        if (spin % 64) continue;
        comm_diag_serve();
        double waited = util_now() - start;
        if (limit > 0 && waited > limit) {
            g_broken = true;
            char why[UTIL_ERR_LEN];
            comm_diag_timeout(c->mpi, peer, waited, why, sizeof why);
            return comm_fail(c, "%s: %s", call, why);
        }
        /* a waiting rank gives its core away where Open MPI's own waits do: on a host
         * with more ranks than cores (mpi_yield_when_idle follows mpi_oversubscribe) */
        if (yield_when_idle()) sched_yield();
    }
}

/* Refuses every call after a timeout (its operations are still posted). */
static int check_live(ex_comm *c, const char *call)
{
    return g_broken ? comm_fail(c, "%s: not attempted: an earlier operation timed out", call) : UTIL_OK;
}

/* Bookkeeping (communicators, requests, self-message nodes) is OTHER memory;
 * UTIL_MEM_COMM counts only buffers that carry data. */
static ex_comm *comm_alloc(void)
{
    return util_calloc(1, sizeof(ex_comm));
}

/* Takes ownership of m (freed on failure): errors return, rank and size cached. */
static int wrap_mpi(MPI_Comm m, ex_comm **out, char *err)
{
    char s[MPI_MAX_ERROR_STRING];
    int rc = MPI_Comm_set_errhandler(m, MPI_ERRORS_RETURN);
    ex_comm *c = rc == MPI_SUCCESS ? comm_alloc() : NULL;
    if (!c) {
        MPI_Comm_free(&m);
        return rc ? util_fail(err, UTIL_ERUNTIME, "comm: MPI_Comm_set_errhandler: %s", mpi_message(rc, s))
                  : util_fail(err, UTIL_ERUNTIME, "comm: out of memory");
    }
    c->mpi = m;
    MPI_Comm_rank(m, &c->rank);
    MPI_Comm_size(m, &c->size);
    *out = c;
    return UTIL_OK;
}

int ex_comm_world(int *argc, char ***argv, ex_comm **out, char *err)
{
    char s[MPI_MAX_ERROR_STRING];
    int inited = 0, finalized = 0, provided = 0, rc;
    *out = NULL;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return util_fail(err, UTIL_ERUNTIME, "comm: MPI was already finalized");
    if (!inited) {
        /* Open MPI's non-blocking all-reduce (coll/libnbc) reduces to a root and
         * broadcasts back for in-place calls and fewer than 4 ranks
         * (ompi/mca/coll/libnbc/nbc_iallreduce.c); recursive doubling takes
         * half the rounds and moves no more data: measured on this project's
         * 2-rank runs, 64K-float all-reduces went from 2.3x to 0.9-1.4x the
         * blocking call's time. A value the user set is kept. */
        setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "4", 0);
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return util_fail(err, UTIL_ERUNTIME, "comm: MPI_Init_thread: %s", mpi_message(rc, s));
        g_we_initialised = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_FUNNELED)
        return util_fail(err, UTIL_ERUNTIME, "comm: MPI gives thread level %d, need MPI_THREAD_FUNNELED", provided);
    MPI_Comm dup;
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    if (rc != MPI_SUCCESS) return util_fail(err, UTIL_ERUNTIME, "comm: MPI_Comm_dup: %s", mpi_message(rc, s));
    if ((rc = comm_diag_init()) != MPI_SUCCESS) {
        MPI_Comm_free(&dup);
        return util_fail(err, UTIL_ERUNTIME, "comm: MPI_Comm_dup: %s", mpi_message(rc, s));
    }
    return wrap_mpi(dup, out, err);
}

void ex_comm_finalize(void)
{
    int finalized = 0;
    if (!g_we_initialised) return;
    /* after a timeout MPI_Finalize would wait for the lost rank too: leave it
     * to the launcher, which ends the job when this process exits */
    if (g_broken) return;
    MPI_Finalized(&finalized);
    if (!finalized) {
        comm_diag_free();
        MPI_Finalize();
    }
    g_we_initialised = false;
}

int ex_comm_self(ex_comm **out, char *err)
{
    ex_comm *c = comm_alloc();
    if (!c) return util_fail(err, UTIL_ERUNTIME, "comm: out of memory");
    c->self = true;
    c->size = 1;
    *out = c;
    return UTIL_OK;
}

int ex_comm_rank(const ex_comm *c) { return c->rank; }
int ex_comm_size(const ex_comm *c) { return c->size; }
const char *ex_comm_error(const ex_comm *c) { return c ? c->err : ""; }
uint64_t ex_comm_bytes(const ex_comm *c) { return c->bytes; }

int ex_comm_split(ex_comm *c, int color, int key, ex_comm **out, char *err)
{
    *out = NULL;
    if (c->self) return color < 0 ? UTIL_OK : ex_comm_self(out, err);
    MPI_Comm m;
    int rc = MPI_Comm_split(c->mpi, color < 0 ? MPI_UNDEFINED : color, key, &m);
    if (rc != MPI_SUCCESS) {
        mpi_check(c, rc, "MPI_Comm_split");
        return util_fail(err, UTIL_ERUNTIME, "comm: %s", c->err);
    }
    return m == MPI_COMM_NULL ? UTIL_OK : wrap_mpi(m, out, err);
}

void ex_comm_free(ex_comm *c)
{
    if (!c) return;
    while (c->sends) {
        self_msg *m = c->sends;
        c->sends = m->next;
        util_free(m->owned);
        util_free(m);
    }
    if (!c->self && !g_broken) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&c->mpi);
    }
    util_free(c);
}

/* ---- collectives ---- */

int ex_comm_barrier(ex_comm *c)
{
    if (c->self) return UTIL_OK;
    if (check_live(c, "MPI_Barrier")) return UTIL_ERUNTIME;
    MPI_Request req;
    int rc = MPI_Ibarrier(c->mpi, &req);
    return rc != MPI_SUCCESS ? mpi_check(c, rc, "MPI_Barrier") : wait_reqs(c, 1, &req, NULL, -1, "MPI_Barrier");
}

/* In-place allreduce of n elements of esz bytes in pieces of max_piece;
 * counted as a ring allreduce: each rank sends 2(p-1)/p of the data. */
static int allreduce(ex_comm *c, void *buf, size_t n, MPI_Datatype dt, size_t esz, MPI_Op op, const char *call)
{
    if (n && !buf) return comm_fail(c, "%s: NULL buffer", call);
    if (c->self) return UTIL_OK;
    if (check_live(c, call)) return UTIL_ERUNTIME;
    for (size_t o = 0; o < n; o += g_max_piece) {
        MPI_Request req;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + o * esz, (int)min_sz(g_max_piece, n - o), dt, op, c->mpi, &req);
        if (rc != MPI_SUCCESS) return mpi_check(c, rc, call);
        if ((rc = wait_reqs(c, 1, &req, NULL, -1, call))) return rc;
    }
    c->bytes += (uint64_t)n * esz * 2 * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return UTIL_OK;
}

int ex_comm_allreduce_sum(ex_comm *c, float *buf, size_t n)
{ return allreduce(c, buf, n, MPI_FLOAT, sizeof(float), MPI_SUM, "MPI_Allreduce(sum)"); }
int ex_comm_allreduce_max(ex_comm *c, float *buf, size_t n)
{ return allreduce(c, buf, n, MPI_FLOAT, sizeof(float), MPI_MAX, "MPI_Allreduce(max)"); }
int ex_comm_allreduce_sum_f64(ex_comm *c, double *buf, size_t n)
{ return allreduce(c, buf, n, MPI_DOUBLE, sizeof(double), MPI_SUM, "MPI_Allreduce(sum f64)"); }
int ex_comm_allreduce_max_int(ex_comm *c, int *buf, size_t n)
{ return allreduce(c, buf, n, MPI_INT, sizeof(int), MPI_MAX, "MPI_Allreduce(max int)"); }

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
    if (check_live(c, call)) return UTIL_ERUNTIME;
    for (size_t o = 0; o < n; o += g_max_piece) {
        size_t l = min_sz(g_max_piece, n - o);
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
        rc = rc != MPI_SUCCESS ? mpi_check(c, rc, call) : wait_reqs(c, 1, &req, NULL, -1, call);
        if (t != dt) MPI_Type_free(&t);
        if (rc != UTIL_OK) return rc;
    }
    return UTIL_OK;
}

static void copy_bytes(void *dst, const void *src, size_t bytes)
{
    if (bytes && dst != src) memmove(dst, src, bytes);
}

int ex_comm_allgather(ex_comm *c, const float *send, float *recv, size_t n)
{
    if (n && (!send || !recv)) return comm_fail(c, "MPI_Allgather: NULL buffer");
    if (c->self) { copy_bytes(recv, send, n * sizeof(float)); return UTIL_OK; }
    int rc = chunked(c, CH_ALLGATHER, send, recv, n, MPI_FLOAT, sizeof(float), 0, "MPI_Allgather");
    if (rc == UTIL_OK) c->bytes += (uint64_t)(c->size - 1) * n * sizeof(float);
    return rc;
}

int ex_comm_alltoall(ex_comm *c, const float *send, float *recv, size_t chunk)
{
    if (chunk && (!send || !recv)) return comm_fail(c, "MPI_Alltoall: NULL buffer");
    if (c->self) { copy_bytes(recv, send, chunk * sizeof(float)); return UTIL_OK; }
    int rc = chunked(c, CH_ALLTOALL, send, recv, chunk, MPI_FLOAT, sizeof(float), 0, "MPI_Alltoall");
    if (rc == UTIL_OK) c->bytes += (uint64_t)(c->size - 1) * chunk * sizeof(float);
    return rc;
}

/* Reduce-scatter of equal chunks; above max_piece, one MPI_Reduce per piece
 * and root (MPI's predefined sums do not take the strided derived type). */
int ex_comm_reduce_scatter(ex_comm *c, const float *send, float *recv, size_t n)
{
    if (n && (!send || !recv)) return comm_fail(c, "MPI_Reduce_scatter_block: NULL buffer");
    if (c->self) { copy_bytes(recv, send, n * sizeof(float)); return UTIL_OK; }
    const char *call = "MPI_Reduce_scatter_block";
    if (check_live(c, call)) return UTIL_ERUNTIME;
    int rc = UTIL_OK;
    MPI_Request req;
    if (n <= g_max_piece) {
        rc = MPI_Ireduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, c->mpi, &req);
        rc = rc != MPI_SUCCESS ? mpi_check(c, rc, call) : wait_reqs(c, 1, &req, NULL, -1, call);
    } else {
        for (size_t o = 0; o < n && rc == UTIL_OK; o += g_max_piece)
            for (int r = 0; r < c->size && rc == UTIL_OK; r++) {
                rc = MPI_Ireduce(send + (size_t)r * n + o, r == c->rank ? recv + o : NULL,
                                 (int)min_sz(g_max_piece, n - o), MPI_FLOAT, MPI_SUM, r, c->mpi, &req);
                rc = rc != MPI_SUCCESS ? mpi_check(c, rc, call) : wait_reqs(c, 1, &req, NULL, -1, call);
            }
    }
    if (rc != UTIL_OK) return rc;
    c->bytes += (uint64_t)(c->size - 1) * n * sizeof(float);
    return UTIL_OK;
}

static int check_root(ex_comm *c, int root, const char *call)
{
    return root >= 0 && root < c->size ? UTIL_OK : comm_fail(c, "%s: root %d not in [0, %d)", call, root, c->size);
}

/* Counted as (p-1)/p of the bytes per rank: a pipelined ring's share. */
int ex_comm_bcast(ex_comm *c, void *buf, size_t bytes, int root)
{
    if (check_root(c, root, "MPI_Bcast") != UTIL_OK) return UTIL_ERUNTIME;
    if (bytes && !buf) return comm_fail(c, "MPI_Bcast: NULL buffer");
    if (c->self) return UTIL_OK;
    if (check_live(c, "MPI_Bcast")) return UTIL_ERUNTIME;
    for (size_t o = 0; o < bytes; o += g_max_piece) {
        MPI_Request req;
        int rc = MPI_Ibcast((char *)buf + o, (int)min_sz(g_max_piece, bytes - o), MPI_BYTE, root, c->mpi, &req);
        if (rc != MPI_SUCCESS) return mpi_check(c, rc, "MPI_Bcast");
        if ((rc = wait_reqs(c, 1, &req, NULL, -1, "MPI_Bcast"))) return rc;
    }
    c->bytes += (uint64_t)bytes * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return UTIL_OK;
}

int ex_comm_gather_bytes(ex_comm *c, const void *send, void *recv, size_t bytes, int root)
{
    if (check_root(c, root, "MPI_Gather") != UTIL_OK) return UTIL_ERUNTIME;
    if (bytes && (!send || (c->rank == root && !recv))) return comm_fail(c, "MPI_Gather: NULL buffer");
    if (c->self) { copy_bytes(recv, send, bytes); return UTIL_OK; }
    int rc = chunked(c, CH_GATHER, send, c->rank == root ? recv : NULL, bytes, MPI_BYTE, 1, root, "MPI_Gather");
    if (rc == UTIL_OK && c->rank != root) c->bytes += bytes;
    return rc;
}

/* ---- point-to-point ---- */

static int check_p2p(ex_comm *c, const void *buf, size_t n, int peer, int tag, ex_request **req, const char *call)
{
    if (req) *req = NULL;
    if (tag < 0 || tag >= TAG_LIMIT) return comm_fail(c, "%s: tag %d not in [0, %d)", call, tag, TAG_LIMIT);
    if (peer < 0 || peer >= c->size) return comm_fail(c, "%s: peer %d not in [0, %d)", call, peer, c->size);
    if (n && !buf) return comm_fail(c, "%s: NULL buffer", call);
    return UTIL_OK;
}

static ex_request *req_new(ex_comm *c, req_kind kind, size_t n, int peer, int tag, int npieces)
{
    ex_request *r = util_calloc(1, sizeof(ex_request) + (size_t)npieces * sizeof(MPI_Request));
    if (!r) { comm_fail(c, "comm: out of memory for a request"); return NULL; }
    r->kind = kind;
    r->n = n;
    r->peer = peer;
    r->tag = tag;
    r->npieces = npieces;
    r->piece = g_max_piece;
    return r;
}

static void deliver(ex_request *recv, const float *src, size_t n)
{
    recv->got = n;
    recv->done = true;
    if (n == recv->n) copy_bytes(recv->buf, src, n * sizeof(float));
}

/* A send to self: completes the oldest matching posted receive, else queues. */
static int self_send(ex_comm *c, ex_request *r, const float *buf)
{
    for (ex_request **p = &c->recvs; *p; p = &(*p)->next) {
        if ((*p)->tag != r->tag) continue;
        ex_request *recv = *p;
        *p = recv->next;
        deliver(recv, buf, r->n);
        return UTIL_OK;
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
static void self_recv(ex_comm *c, ex_request *r)
{
    for (self_msg **p = &c->sends; *p; p = &(*p)->next) {
        if ((*p)->tag != r->tag) continue;
        self_msg *m = *p;
        *p = m->next;
        deliver(r, m->src, m->n);
        if (m->sender) m->sender->msg = NULL;
        util_free(m->owned);
        util_free(m);
        return;
    }
    ex_request **tail = &c->recvs;
    while (*tail) tail = &(*tail)->next;
    *tail = r;
}

/* Posts one MPI request per piece of at most max_piece floats (same tag, so
 * MPI's non-overtaking order matches the pieces). */
static int post_mpi(ex_comm *c, ex_request *r, float *buf, bool send)
{
    for (int i = 0; i < r->npieces; i++) {
        size_t o = (size_t)i * r->piece;
        int l = (int)min_sz(r->piece, r->n - o), rc;
        float *b = buf ? buf + o : NULL;
        rc = send ? MPI_Isend(b, l, MPI_FLOAT, r->peer, r->tag, c->mpi, &r->mreq[i])
                  : MPI_Irecv(b, l, MPI_FLOAT, r->peer, r->tag, c->mpi, &r->mreq[i]);
        if (rc != MPI_SUCCESS) {
            while (i-- > 0) MPI_Request_free(&r->mreq[i]);
            return mpi_check(c, rc, send ? "MPI_Isend" : "MPI_Irecv");
        }
    }
    return UTIL_OK;
}

static int post(ex_comm *c, float *buf, size_t n, int peer, int tag, ex_request **req, bool send)
{
    const char *call = send ? "MPI_Isend" : "MPI_Irecv";
    if (check_p2p(c, buf, n, peer, tag, req, call) != UTIL_OK) return UTIL_ERUNTIME;
    if (!req) return comm_fail(c, "%s: NULL request", call);
    if (!c->self && check_live(c, call)) return UTIL_ERUNTIME;
    bool to_self = peer == c->rank;
    int npieces = to_self ? 0 : n == 0 ? 1 : (int)((n + g_max_piece - 1) / g_max_piece);
    ex_request *r = req_new(c, to_self ? (send ? REQ_SELF_SEND : REQ_SELF_RECV) : (send ? REQ_MPI_SEND : REQ_MPI_RECV),
                            n, peer, tag, npieces);
    if (!r) return UTIL_ERUNTIME;
    r->buf = buf;
    int rc = UTIL_OK;
    if (to_self && send) rc = self_send(c, r, buf);
    else if (to_self) self_recv(c, r);
    else rc = post_mpi(c, r, buf, send);
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

/* Waits for every piece; a receive must get exactly the floats it posted. */
static int wait_mpi(ex_comm *c, ex_request *r)
{
    char what[64];
    snprintf(what, sizeof what, "MPI_Wait(%s %d, tag %d)", r->kind == REQ_MPI_RECV ? "recv from" : "send to", r->peer, r->tag);
    if (check_live(c, what)) return UTIL_ERUNTIME;
    for (int i = 0; i < r->npieces; i++) {
        MPI_Status st;
        int rc = wait_reqs(c, 1, &r->mreq[i], &st, r->peer, what), count = 0;
        if (rc == UTIL_OK && r->kind == REQ_MPI_RECV) {
            size_t want = min_sz(r->piece, r->n - (size_t)i * r->piece);
            MPI_Get_count(&st, MPI_FLOAT, &count);
            if ((size_t)count != want)
                rc = comm_fail(c, "MPI_Wait(recv from %d, tag %d): got %d floats, posted %zu",
                               r->peer, r->tag, count, want);
        }
        if (rc != UTIL_OK) {
            if (!g_broken)
                while (++i < r->npieces) MPI_Request_free(&r->mreq[i]);
            return UTIL_ERUNTIME;
        }
    }
    return UTIL_OK;
}

/* A self send still queued takes a private copy of its payload (so the
 * caller's buffer is free again); a self receive must have been matched. */
static int wait_self(ex_comm *c, ex_request *r)
{
    if (r->kind == REQ_SELF_SEND) {
        self_msg *m = r->msg;
        if (!m) return UTIL_OK;
        if (m->n && !(m->owned = util_malloc_cat(UTIL_MEM_COMM, m->n * sizeof(float)))) {
            m->sender = NULL;
            m->src = NULL;
            m->n = 0;
            return comm_fail(c, "send to self: out of memory buffering %zu floats", r->n);
        }
        copy_bytes(m->owned, m->src, m->n * sizeof(float));
        m->src = m->owned;
        m->sender = NULL;
        return UTIL_OK;
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

/* A non-blocking collective: its one MPI request. */
static int wait_coll(ex_comm *c, ex_request *r)
{
    return mpi_check(c, MPI_Wait(&r->mreq[0], MPI_STATUS_IGNORE), r->tag ? "MPI_Ireduce_scatter_block" : "MPI_Iallgather");
}

int ex_comm_wait(ex_comm *c, ex_request *req)
{
    if (!req) return comm_fail(c, "ex_comm_wait: NULL request");
    int rc = req->kind == REQ_DONE ? UTIL_OK
           : req->kind == REQ_MPI_COLL ? wait_coll(c, req)
           : req->kind == REQ_SELF_SEND || req->kind == REQ_SELF_RECV ? wait_self(c, req) : wait_mpi(c, req);
    util_free(req);
    return rc;
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

/* ---- non-blocking collectives ----
 * One MPI request each; a call above max_piece, or on the self communicator,
 * runs the blocking form and hands back a request that is already done. */

static int post_coll(ex_comm *c, bool reduce, const float *send, float *recv, size_t n, ex_request **req)
{
    const char *call = reduce ? "MPI_Ireduce_scatter_block" : "MPI_Iallgather";
    if (!req) return comm_fail(c, "%s: NULL request", call);
    *req = NULL;
    if (n && (!send || !recv)) return comm_fail(c, "%s: NULL buffer", call);
    bool blocking = c->self || n > g_max_piece;
    ex_request *r = req_new(c, blocking ? REQ_DONE : REQ_MPI_COLL, n, 0, reduce, blocking ? 0 : 1);
    if (!r) return UTIL_ERUNTIME;
    int rc;
    if (blocking) {
        rc = reduce ? ex_comm_reduce_scatter(c, send, recv, n) : ex_comm_allgather(c, send, recv, n);
    } else {
        rc = reduce ? MPI_Ireduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, c->mpi, &r->mreq[0])
                    : MPI_Iallgather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, c->mpi, &r->mreq[0]);
        rc = mpi_check(c, rc, call);
        if (rc == UTIL_OK) c->bytes += (uint64_t)(c->size - 1) * n * sizeof(float);
    }
    if (rc != UTIL_OK) { util_free(r); return rc; }
    *req = r;
    return UTIL_OK;
}

int ex_comm_iallgather(ex_comm *c, const float *send, float *recv, size_t n, ex_request **req)
{
    return post_coll(c, false, send, recv, n, req);
}

int ex_comm_ireduce_scatter(ex_comm *c, const float *send, float *recv, size_t n, ex_request **req)
{
    return post_coll(c, true, send, recv, n, req);
}
