/* The communicator interface (executor/comm.h): thin wrappers over an
 * operations table (comm_int.h) with two implementations, MPI (comm_mpi.c)
 * and NCCL (comm_nccl.c). What both share lives here, once: argument checks,
 * the MPI-less 1-rank self communicator, the bytes counters, the timeout and
 * the broken state after one (comm_poll), and the world's set-up — MPI is
 * every implementation's launcher and host transport (splits, NCCL ids).
 * Messages to one's own rank are comm_self.c's.
 *
 * No wait is unbounded: every implementation polls through comm_poll, so a
 * rank that was killed, stopped (SIGSTOP) or is stuck cannot hold the others
 * forever. After ex_comm_set_timeout seconds the wait ends with one line
 * naming this rank, the operation and the ranks that did not answer a ping
 * (comm_diag.c); the communicators are then broken, later calls fail at once,
 * and MPI is not finalized (that would wait again), so the launcher ends the
 * job. */
#include "executor/comm.h"
#include "executor/comm_int.h"
#include "util/util.h"

#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

size_t comm_max_piece(void) { return g_max_piece; }
bool comm_broken(void) { return g_broken; }
void comm_set_broken(void) { g_broken = true; }

static comm_async_fn g_async_check;
void comm_set_async_check(comm_async_fn fn) { g_async_check = fn; }

size_t comm_dtype_size(comm_dtype t)
{
    return t == COMM_F64 ? sizeof(double) : t == COMM_I32 ? sizeof(int) : t == COMM_F32 ? sizeof(float) : t == COMM_BF16 ? 2 : 1;
}

int comm_fail(ex_comm *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return UTIL_ERUNTIME;
}

int comm_check_live(ex_comm *c, const char *call)
{
    return g_broken ? comm_fail(c, "%s: not attempted: an earlier operation timed out", call) : UTIL_OK;
}

const char *comm_mpi_message(int rc, char *s)
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

int comm_poll(ex_comm *c, comm_test_fn test, void *arg, int peer, const char *call)
{
    double start = util_now(), limit = ex_comm_timeout();
    for (unsigned spin = 1;; spin++) {
        bool done = false;
        int rc = test(c, arg, &done);
        if (rc != UTIL_OK) return rc;
        if (done) return UTIL_OK;
        if (spin % 64) continue;
        comm_diag_serve();
        if (g_async_check && (rc = g_async_check(c, call)) != UTIL_OK) return rc;
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

/* Bookkeeping (communicators, requests, self-message nodes) is OTHER memory;
 * UTIL_MEM_COMM counts only buffers that carry data. */
int comm_wrap(const ex_comm_ops *ops, MPI_Comm m, ex_comm **out, char *err)
{
    char s[MPI_MAX_ERROR_STRING];
    int rc = MPI_Comm_set_errhandler(m, MPI_ERRORS_RETURN);
    ex_comm *c = rc == MPI_SUCCESS ? util_calloc(1, sizeof(ex_comm)) : NULL;
    if (!c) {
        MPI_Comm_free(&m);
        return rc ? util_fail(err, UTIL_ERUNTIME, "comm: MPI_Comm_set_errhandler: %s", comm_mpi_message(rc, s))
                  : util_fail(err, UTIL_ERUNTIME, "comm: out of memory");
    }
    c->ops = ops;
    c->mpi = m;
    MPI_Comm_rank(m, &c->rank);
    MPI_Comm_size(m, &c->size);
    if (ops->attach && (rc = ops->attach(c, err)) != UTIL_OK) {
        MPI_Comm_free(&c->mpi);
        util_free(c);
        return rc;
    }
    *out = c;
    return UTIL_OK;
}

const char *ex_comm_kind_name(ex_comm_kind kind) { return kind == EX_COMM_NCCL ? "nccl" : "mpi"; }

static const ex_comm_ops *ops_of(ex_comm_kind kind, char *err)
{
    return kind == EX_COMM_NCCL ? comm_nccl_ops(err) : &comm_mpi_ops;
}

int ex_comm_world(int *argc, char ***argv, ex_comm_kind kind, ex_comm **out, char *err)
{
    char s[MPI_MAX_ERROR_STRING];
    int inited = 0, finalized = 0, provided = 0, rc;
    *out = NULL;
    const ex_comm_ops *ops = ops_of(kind, err);
    if (!ops) return UTIL_EUNSUPPORTED;
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
        if (rc != MPI_SUCCESS) return util_fail(err, UTIL_ERUNTIME, "comm: MPI_Init_thread: %s", comm_mpi_message(rc, s));
        g_we_initialised = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_FUNNELED)
        return util_fail(err, UTIL_ERUNTIME, "comm: MPI gives thread level %d, need MPI_THREAD_FUNNELED", provided);
    MPI_Comm dup;
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    if (rc != MPI_SUCCESS) return util_fail(err, UTIL_ERUNTIME, "comm: MPI_Comm_dup: %s", comm_mpi_message(rc, s));
    if ((rc = comm_diag_init()) != MPI_SUCCESS) {
        MPI_Comm_free(&dup);
        return util_fail(err, UTIL_ERUNTIME, "comm: MPI_Comm_dup: %s", comm_mpi_message(rc, s));
    }
    return comm_wrap(ops, dup, out, err);
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
    ex_comm *c = util_calloc(1, sizeof(ex_comm));
    if (!c) return util_fail(err, UTIL_ERUNTIME, "comm: out of memory");
    c->ops = &comm_mpi_ops;
    c->self = true;
    c->size = 1;
    *out = c;
    return UTIL_OK;
}

int ex_comm_rank(const ex_comm *c) { return c->rank; }
int ex_comm_size(const ex_comm *c) { return c->size; }
const char *ex_comm_error(const ex_comm *c) { return c ? c->err : ""; }
uint64_t ex_comm_bytes(const ex_comm *c) { return c->bytes; }
ex_comm_kind ex_comm_kind_of(const ex_comm *c) { return c->ops == &comm_mpi_ops ? EX_COMM_MPI : EX_COMM_NCCL; }

int ex_comm_split(ex_comm *c, int color, int key, ex_comm **out, char *err)
{
    *out = NULL;
    if (c->self) {
        int rc = color < 0 ? UTIL_OK : ex_comm_self(out, err);
        if (*out) (*out)->ops = c->ops;
        return rc;
    }
    if (comm_check_live(c, "MPI_Comm_split")) return util_fail(err, UTIL_ERUNTIME, "comm: %s", c->err);
    MPI_Comm m;
    char s[MPI_MAX_ERROR_STRING];
    int rc = MPI_Comm_split(c->mpi, color < 0 ? MPI_UNDEFINED : color, key, &m);
    if (rc != MPI_SUCCESS) return util_fail(err, UTIL_ERUNTIME, "comm: MPI_Comm_split: %s", comm_mpi_message(rc, s));
    return m == MPI_COMM_NULL ? UTIL_OK : comm_wrap(c->ops, m, out, err);
}

void ex_comm_free(ex_comm *c)
{
    if (!c) return;
    comm_self_free(c);
    if (!c->self) {
        if (c->ops->detach) c->ops->detach(c);
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!g_broken && !finalized) MPI_Comm_free(&c->mpi);
    }
    util_free(c);
}

/* ---- collectives: checks, the self communicator, counting ---- */

static int need_bufs(ex_comm *c, size_t n, const void *a, const void *b, const char *call)
{
    return n && (!a || !b) ? comm_fail(c, "%s: NULL buffer", call) : UTIL_OK;
}

static int copy(ex_comm *c, void *dst, const void *src, size_t bytes)
{
    return bytes && dst != src ? c->ops->copy(dst, src, bytes) : UTIL_OK;
}

int ex_comm_barrier(ex_comm *c)
{
    if (c->self) return UTIL_OK;
    return comm_check_live(c, "barrier") ? UTIL_ERUNTIME : c->ops->barrier(c);
}

/* Counted as a ring all-reduce: each rank sends 2(p-1)/p of the data. */
static int allreduce(ex_comm *c, void *buf, size_t n, comm_dtype t, comm_redop op, const char *call)
{
    if (need_bufs(c, n, buf, buf, call)) return UTIL_ERUNTIME;
    if (c->self) return UTIL_OK;
    if (comm_check_live(c, call)) return UTIL_ERUNTIME;
    int rc = c->ops->allreduce(c, buf, n, t, op);
    if (rc == UTIL_OK) c->bytes += (uint64_t)n * comm_dtype_size(t) * 2 * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return rc;
}

int ex_comm_allreduce_sum(ex_comm *c, float *buf, size_t n)
{ return allreduce(c, buf, n, COMM_F32, COMM_SUM, "allreduce(sum)"); }
int ex_comm_allreduce_max(ex_comm *c, float *buf, size_t n)
{ return allreduce(c, buf, n, COMM_F32, COMM_MAX, "allreduce(max)"); }
int ex_comm_allreduce_sum_f64(ex_comm *c, double *buf, size_t n)
{ return allreduce(c, buf, n, COMM_F64, COMM_SUM, "allreduce(sum f64)"); }
int ex_comm_allreduce_max_int(ex_comm *c, int *buf, size_t n)
{ return allreduce(c, buf, n, COMM_I32, COMM_MAX, "allreduce(max int)"); }
int ex_comm_allreduce_sum_bf16(ex_comm *c, uint16_t *buf, size_t n)
{ return allreduce(c, buf, n, COMM_BF16, COMM_SUM, "allreduce(sum bf16)"); }

typedef int (*chunked_fn)(ex_comm *c, const float *send, float *recv, size_t n);

/* All-gather, reduce-scatter, all-to-all: (p-1) chunks of n floats leave each rank. */
static int chunked(ex_comm *c, chunked_fn fn, const float *send, float *recv, size_t n, const char *call)
{
    if (need_bufs(c, n, send, recv, call)) return UTIL_ERUNTIME;
    if (c->self) return copy(c, recv, send, n * sizeof(float));
    if (comm_check_live(c, call)) return UTIL_ERUNTIME;
    int rc = fn(c, send, recv, n);
    if (rc == UTIL_OK) c->bytes += (uint64_t)(c->size - 1) * n * sizeof(float);
    return rc;
}

int ex_comm_allgather(ex_comm *c, const float *send, float *recv, size_t n)
{ return chunked(c, c->ops->allgather, send, recv, n, "allgather"); }
static int reduce_scatter(ex_comm *c, const void *send, void *recv, size_t n, comm_dtype t, const char *call)
{
    size_t esz = comm_dtype_size(t);
    if (need_bufs(c, n, send, recv, call)) return UTIL_ERUNTIME;
    if (c->self) return copy(c, recv, send, n * esz);
    if (comm_check_live(c, call)) return UTIL_ERUNTIME;
    int rc = c->ops->reduce_scatter(c, send, recv, n, t);
    if (rc == UTIL_OK) c->bytes += (uint64_t)(c->size - 1) * n * esz;
    return rc;
}

int ex_comm_reduce_scatter(ex_comm *c, const float *send, float *recv, size_t n)
{ return reduce_scatter(c, send, recv, n, COMM_F32, "reduce_scatter"); }
int ex_comm_reduce_scatter_bf16(ex_comm *c, const uint16_t *send, uint16_t *recv, size_t n)
{ return reduce_scatter(c, send, recv, n, COMM_BF16, "reduce_scatter(bf16)"); }
int ex_comm_alltoall(ex_comm *c, const float *send, float *recv, size_t chunk)
{ return chunked(c, c->ops->alltoall, send, recv, chunk, "alltoall"); }

static int check_root(ex_comm *c, int root, const char *call)
{
    return root >= 0 && root < c->size ? UTIL_OK : comm_fail(c, "%s: root %d not in [0, %d)", call, root, c->size);
}

/* Counted as (p-1)/p of the bytes per rank: a pipelined ring's share. */
int ex_comm_bcast(ex_comm *c, void *buf, size_t bytes, int root)
{
    if (check_root(c, root, "bcast") || need_bufs(c, bytes, buf, buf, "bcast")) return UTIL_ERUNTIME;
    if (c->self) return UTIL_OK;
    if (comm_check_live(c, "bcast")) return UTIL_ERUNTIME;
    int rc = c->ops->bcast(c, buf, bytes, root);
    if (rc == UTIL_OK) c->bytes += (uint64_t)bytes * (uint64_t)(c->size - 1) / (uint64_t)c->size;
    return rc;
}

int ex_comm_gather_bytes(ex_comm *c, const void *send, void *recv, size_t bytes, int root)
{
    if (check_root(c, root, "gather") || need_bufs(c, bytes, send, c->rank == root ? recv : send, "gather"))
        return UTIL_ERUNTIME;
    if (c->self) return copy(c, recv, send, bytes);
    if (comm_check_live(c, "gather")) return UTIL_ERUNTIME;
    int rc = c->ops->gather_bytes(c, send, c->rank == root ? recv : NULL, bytes, root);
    if (rc == UTIL_OK && c->rank != root) c->bytes += bytes;
    return rc;
}

/* ---- non-blocking collectives ----
 * A request of the implementation's; on the self communicator, the blocking
 * form's copy and a request that is already done. */

typedef enum { COLL_ALLGATHER, COLL_REDUCE_SCATTER, COLL_ALLREDUCE } coll_kind;

static int post_coll(ex_comm *c, coll_kind kind, const float *send, float *recv, size_t n, ex_request **req)
{
    static const char *calls[] = { "iallgather", "ireduce_scatter", "iallreduce(sum)" };
    const char *call = calls[kind];
    if (!req) return comm_fail(c, "%s: NULL request", call);
    *req = NULL;
    if (need_bufs(c, n, send, recv, call)) return UTIL_ERUNTIME;
    if (!c->self && comm_check_live(c, call)) return UTIL_ERUNTIME;
    ex_request *r = util_calloc(1, sizeof *r);
    if (!r) return comm_fail(c, "comm: out of memory for a request");
    *r = (ex_request){ .kind = c->self ? REQ_DONE : REQ_IMPL, .coll = true, .reduce = kind == COLL_REDUCE_SCATTER,
                       .allreduce = kind == COLL_ALLREDUCE, .n = n };
    int rc = c->self ? copy(c, recv, send, n * sizeof(float)) : c->ops->post_coll(c, r, send, recv, n);
    if (rc != UTIL_OK) { util_free(r); return rc; }
    if (!c->self)   /* counted as the blocking forms are */
        c->bytes += kind == COLL_ALLREDUCE ? (uint64_t)n * sizeof(float) * 2 * (uint64_t)(c->size - 1) / (uint64_t)c->size
                                           : (uint64_t)(c->size - 1) * n * sizeof(float);
    *req = r;
    return UTIL_OK;
}

int ex_comm_iallgather(ex_comm *c, const float *send, float *recv, size_t n, ex_request **req)
{
    return post_coll(c, COLL_ALLGATHER, send, recv, n, req);
}

int ex_comm_ireduce_scatter(ex_comm *c, const float *send, float *recv, size_t n, ex_request **req)
{
    return post_coll(c, COLL_REDUCE_SCATTER, send, recv, n, req);
}

int ex_comm_iallreduce_sum(ex_comm *c, float *buf, size_t n, ex_request **req)
{
    return post_coll(c, COLL_ALLREDUCE, buf, buf, n, req);
}
