/* The communicator's NCCL implementation (comm_int.h's operations table).
 * Every ex_comm (the world and every ex_comm_split: TP, SP, DP / ZeRO shard,
 * pipeline neighbours, hand-off pairs) gets its own NCCL communicator,
 * created from its MPI communicator: rank 0 calls ncclGetUniqueId, MPI
 * broadcasts the id, every member calls ncclCommInitRankConfig, non-blocking
 * and bounded by the timeout (init_comm; after ncclCommInitRank in NCCL's documented
 * MPI bootstrap, docs.nvidia.com/deeplearning/nccl/user-guide/docs/examples.html
 * "Example 2: One Device per Process or Thread"), and its own CUDA stream.
 *
 * Where data goes: buffers in device memory through NCCL; buffers in host
 * memory (the run's verdicts, counters and loss sums: bcast, f64 sums)
 * through the MPI operations on the same members (cudaPointerGetAttributes
 * says which); the int all-reduce that ranks use to agree on errors and
 * gather_bytes / barrier always through MPI, so ranks can still agree after
 * an NCCL failure. Point-to-point messages in host memory (a checkpoint's
 * tensors) go through MPI too; the non-blocking collectives need device
 * buffers. Before any host (MPI) operation the sends and receives collected
 * for NCCL are launched, so a peer blocked on one of them gets it.
 *
 * Ordering: the communication stream first waits for an event recorded on
 * the compute stream (the legacy default stream), so an operation sees what
 * the kernels before it wrote. A blocking operation then waits for its own
 * completion event; iallgather / ireduce_scatter return with an event that
 * ex_comm_wait waits for. isend / irecv are collected per communicator and
 * launched as one ncclGroupStart / ncclGroupEnd when a wait needs them (every
 * communicator's at once) or before the next collective on that
 * communicator (NCCL runs one communicator's operations in issue order), so
 * a pair that exchanges, a ring, or an all-to-all cannot deadlock
 * (docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/p2p.html).
 *
 * No wait is unbounded: waits poll cudaEventQuery and ncclCommGetAsyncError
 * through comm_poll (the timeout's owner); an asynchronous NCCL error or the
 * timeout ends with ncclCommAbort and one line naming this rank and the
 * operation (docs .../usage/communicators.html, "Error handling and
 * communicator abort"). */
#include "executor/comm.h"
#include "executor/comm_int.h"
#include "util/util.h"

#ifndef DHP_NCCL

const ex_comm_ops *comm_nccl_ops(char *err)
{
    util_fail(err, UTIL_EUNSUPPORTED, "this dhp was built without NCCL (no nccl.h at build time): use --comm mpi");
    return NULL;
}

bool ex_comm_nccl_built(const char **version)
{
    if (version) *version = NULL;
    return false;
}

bool comm_nccl_emulated(void) { return false; }

#else

#ifndef DHP_NCCL_EMU
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif
#include <stdio.h>
#include <string.h>

typedef struct nccl_state {
    ex_comm *c;
    ncclComm_t nccl;
    cudaStream_t stream;
    cudaEvent_t ready, done;       /* the compute stream's point; a blocking operation's end */
    ex_request *pending;           /* isend / irecv not launched yet, oldest first (linked by next) */
    ex_request **tail;
    bool aborted;
    struct nccl_state *next;       /* every live communicator, for flushing them all */
} nccl_state;

/* One launch of grouped sends and receives, shared by its requests. */
typedef struct {
    cudaEvent_t done;
    int refs;
    bool failed;       /* the launch failed: its requests fail too */
} nccl_group;

static nccl_state *g_live;
static bool g_device_set;

#ifdef DHP_NCCL_EMU
bool comm_nccl_emulated(void) { return true; }
#else
bool comm_nccl_emulated(void) { return false; }
#endif

bool ex_comm_nccl_built(const char **version)
{
    static char v[32];
    int code = 0;
    if (ncclGetVersion(&code) == ncclSuccess)
        snprintf(v, sizeof v, "%d.%d.%d", code / 10000, code / 100 % 100, code % 100);
    if (version) *version = v[0] ? v : "unknown";
    return true;
}

static int cuda_fail(ex_comm *c, const char *call, cudaError_t e)
{
    return comm_fail(c, "%s: rank %d: %s", call, c->rank, cudaGetErrorString(e));
}

static int nccl_fail(ex_comm *c, const char *call, ncclResult_t r)
{
    return comm_fail(c, "%s: rank %d: %s", call, c->rank, ncclGetErrorString(r));
}

static nccl_state *state(ex_comm *c) { return c->impl; }

/* After a timeout or an asynchronous error: NCCL's kernels are stopped and
 * the communicator unusable; MPI is left to the launcher (comm_broken). */
static void abort_comm(nccl_state *s)
{
    if (s->aborted) return;
    s->aborted = true;
    ncclCommAbort(s->nccl);
}

/* ---- device selection and set-up ---- */

/* One process per GPU: device = node-local rank. */
static int select_device(ex_comm *world, char *err)
{
    int count = 0, local = ex_comm_local_rank(world);
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return util_fail(err, UTIL_EUNSUPPORTED, "comm: rank %d: no CUDA device for NCCL (%s)", world->rank,
                         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    if (local < 0 || local >= count)
        return util_fail(err, UTIL_EINVAL, "comm: rank %d is rank %d on its node, which has %d GPU%s: "
                         "run one process per GPU", world->rank, local, count, count == 1 ? "" : "s");
    if ((e = cudaSetDevice(local)) != cudaSuccess)
        return util_fail(err, UTIL_ERUNTIME, "comm: rank %d: cudaSetDevice(%d): %s", world->rank, local, cudaGetErrorString(e));
    g_device_set = true;
    return UTIL_OK;
}

static void free_state(nccl_state *s)
{
    if (s->stream) cudaStreamDestroy(s->stream);
    if (s->ready) cudaEventDestroy(s->ready);
    if (s->done) cudaEventDestroy(s->done);
    util_free(s);
}

static int check_async(ex_comm *c, const char *call);

/* Communicators are non-blocking (ncclConfig_t.blocking = 0): a call NCCL is
 * still working on (the set-up, a first use's connections, a group's
 * launch) returns ncclInProgress, and the communicator's state is then
 * ncclCommGetAsyncError's until it leaves ncclInProgress (docs
 * .../usage/communicators.html, "Creating a communicator with options" and
 * "Fault Tolerance"). settle waits for that through comm_poll, so a peer that
 * hangs or died during the set-up ends in the timeout, naming it, instead
 * of a blocking ncclCommInitRank that never returns. */
typedef struct {
    ncclComm_t comm;
    ncclResult_t state;
} nccl_settle_arg;

static int test_settled(ex_comm *c, void *arg, bool *done)
{
    (void)c;
    nccl_settle_arg *a = arg;
    ncclResult_t r = ncclCommGetAsyncError(a->comm, &a->state);
    if (r != ncclSuccess) a->state = r;
    *done = a->state != ncclInProgress;
    return UTIL_OK;
}

/* *r as returned by a call on comm; ncclInProgress becomes the final state. */
static int settle(ex_comm *c, ncclComm_t comm, ncclResult_t *r, const char *call)
{
    if (*r != ncclInProgress) return UTIL_OK;
    nccl_settle_arg a = { comm, ncclInProgress };
    int rc = comm_poll(c, test_settled, &a, -1, call);
    *r = a.state;
    return rc;
}

/* This rank's member of c's NCCL communicator, non-blocking, its set-up bounded by the timeout. */
static int init_comm(ex_comm *c, nccl_state *s, ncclUniqueId id, char *err)
{
    const char *call = "ncclCommInitRankConfig";
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    s->nccl = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&s->nccl, c->size, id, c->rank, &config);
    int rc = s->nccl ? settle(c, s->nccl, &r, call) : UTIL_OK;
    if (!rc && r == ncclSuccess) return UTIL_OK;
    if (s->nccl) ncclCommAbort(s->nccl);
    if (rc) return util_fail(err, UTIL_ERUNTIME, "comm: %s", c->err);
    return util_fail(err, UTIL_ERUNTIME, "comm: rank %d: %s (%d ranks): %s", c->rank, call, c->size, ncclGetErrorString(r));
}

static int nccl_attach(ex_comm *c, char *err)
{
    if (!g_device_set) {
        int rc = select_device(c, err);
        if (rc) return rc;
    }
    nccl_state *s = util_calloc(1, sizeof *s);
    if (!s) return util_fail(err, UTIL_ENOMEM, "comm: out of memory");
    s->c = c;
    s->tail = &s->pending;
    cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free_state(s);
        return util_fail(err, UTIL_ERUNTIME, "comm: rank %d: CUDA stream for NCCL: %s", c->rank, cudaGetErrorString(e));
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = c->rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    /* every member takes part in the broadcast, and learns whether rank 0 got an id */
    int ok = r == ncclSuccess, mrc = MPI_Bcast(&ok, 1, MPI_INT, 0, c->mpi);
    if (mrc == MPI_SUCCESS && ok) mrc = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, c->mpi);
    if (mrc != MPI_SUCCESS || !ok) {
        char m[MPI_MAX_ERROR_STRING];
        free_state(s);
        return util_fail(err, UTIL_ERUNTIME, "comm: rank %d: NCCL id: %s", c->rank,
                         mrc != MPI_SUCCESS ? comm_mpi_message(mrc, m) : "ncclGetUniqueId failed on rank 0");
    }
    int rc = init_comm(c, s, id, err);
    if (rc) {
        free_state(s);
        return rc;
    }
    s->next = g_live;
    g_live = s;
    c->impl = s;
    comm_set_async_check(check_async);   /* MPI's waits (host data) poll NCCL's errors too */
    return UTIL_OK;
}

/* A clean shutdown: ncclCommFinalize flushes the communicator's operations
 * and (non-blocking) leaves it ncclInProgress until it is quiescent; then
 * ncclCommDestroy frees what is local (NCCL >= 2.14, docs .../api/comms.html,
 * ncclCommFinalize and ncclCommDestroy: "users should guarantee that the
 * state of the communicator become ncclSuccess before calling
 * ncclCommDestroy"). A finalize that fails or does not settle within the
 * timeout ends in ncclCommAbort, as every failure does. */
static void finalize_comm(ex_comm *c, nccl_state *s)
{
    ncclResult_t r = ncclCommFinalize(s->nccl);
    int rc = settle(c, s->nccl, &r, "ncclCommFinalize");
    if (rc || r != ncclSuccess) abort_comm(s);
    else ncclCommDestroy(s->nccl);
}

static void nccl_detach(ex_comm *c)
{
    nccl_state *s = state(c);
    if (!s) return;
    for (nccl_state **p = &g_live; *p; p = &(*p)->next)
        if (*p == s) { *p = s->next; break; }
    if (!comm_broken() && !s->aborted) {
        cudaStreamSynchronize(s->stream);
        finalize_comm(c, s);
    }
    free_state(s);
    c->impl = NULL;
}

/* ---- waiting ---- */

typedef struct {
    nccl_state *s;
    cudaEvent_t ev;
    const char *call;
} nccl_wait_arg;

/* s reported an asynchronous error while this rank waited in `call` on c:
 * s is aborted, and the job ends (comm_set_broken), since its peers may wait
 * on this rank's part forever. */
static int async_failure(ex_comm *c, nccl_state *s, ncclResult_t async, const char *call)
{
    abort_comm(s);
    comm_set_broken();
    int world = -1;
    char who[320] = "";
    MPI_Comm_rank(MPI_COMM_WORLD, &world);
    if (s->c->size > 1) comm_diag_missing(s->c->mpi, who, sizeof who);
    return comm_fail(c, "%s: rank %d: NCCL asynchronous error on %s group's communicator (its rank %d of %d): %s; "
                     "communicator aborted%s", call, world, s->c == c ? "this" : "another", s->c->rank, s->c->size,
                     ncclGetErrorString(async), who);
}

/* Every live communicator's asynchronous error: NCCL reports a failed
 * operation on its own communicator, which may not be the one this rank
 * waits on (a send on one, then a wait on another whose peer needs it). */
static int check_async(ex_comm *c, const char *call)
{
    for (nccl_state *s = g_live; s; s = s->next) {
        ncclResult_t async = ncclSuccess;
        if (s->aborted) continue;
        ncclResult_t r = ncclCommGetAsyncError(s->nccl, &async);
        if (r != ncclSuccess) return nccl_fail(c, call, r);
        if (async != ncclSuccess && async != ncclInProgress) return async_failure(c, s, async, call);
    }
    return UTIL_OK;
}

static int test_event(ex_comm *c, void *arg, bool *done)
{
    nccl_wait_arg *w = arg;
    cudaError_t e = cudaEventQuery(w->ev);
    if (e == cudaSuccess) { *done = true; return UTIL_OK; }
    if (e != cudaErrorNotReady) return cuda_fail(c, w->call, e);
    return check_async(c, w->call);
}

static int launch_all(ex_comm *c);

/* Waits for ev on s's stream, bounded by the timeout; after a timeout or an
 * error the communicator is aborted. Every communicator's collected sends
 * and receives are launched first: a peer may need them to reach this
 * operation (MPI would have progressed them meanwhile). */
static int wait_event(ex_comm *c, nccl_state *s, cudaEvent_t ev, int peer, const char *call)
{
    nccl_wait_arg w = { s, ev, call };
    int rc = launch_all(c);
    if (!rc) rc = comm_poll(c, test_event, &w, peer, call);
    if (rc != UTIL_OK && comm_broken()) abort_comm(s);
    return rc;
}

/* ---- launching ---- */

static int launch_group(nccl_state *s);

/* Before an operation on s: its stream waits for the compute stream, and
 * point-to-point operations posted earlier on s go first. */
static int begin(ex_comm *c, const char *call)
{
    nccl_state *s = state(c);
    if (s->aborted) return comm_fail(c, "%s: not attempted: this NCCL communicator was aborted", call);
    int rc = s->pending ? launch_group(s) : UTIL_OK;
    if (rc) return rc;
    cudaError_t e = cudaEventRecord(s->ready, 0);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s->stream, s->ready, 0);
    return e == cudaSuccess ? UTIL_OK : cuda_fail(c, call, e);
}

/* A blocking operation: r is what enqueueing it returned. */
static int finish(ex_comm *c, ncclResult_t r, const char *call)
{
    nccl_state *s = state(c);
    int rc = settle(c, s->nccl, &r, call);
    if (rc) return rc;
    if (r != ncclSuccess) return nccl_fail(c, call, r);
    cudaError_t e = cudaEventRecord(s->done, s->stream);
    return e != cudaSuccess ? cuda_fail(c, call, e) : wait_event(c, s, s->done, -1, call);
}

static bool on_device(const void *p)
{
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();   /* older runtimes fail on plain host pointers; clear it */
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* Host data goes through MPI on the same members. Collected sends and
 * receives are launched first: a peer blocked on one of them could not
 * reach the MPI operation otherwise (a deadlock no NCCL timeout sees). */
static int host_path(ex_comm *c) { return launch_all(c); }

static int host_barrier(ex_comm *c)
{
    int rc = host_path(c);
    return rc ? rc : comm_mpi_ops.barrier(c);
}

static int host_gather_bytes(ex_comm *c, const void *send, void *recv, size_t bytes, int root)
{
    int rc = host_path(c);
    return rc ? rc : comm_mpi_ops.gather_bytes(c, send, recv, bytes, root);
}

static ncclDataType_t nccl_type(comm_dtype t)
{
    return t == COMM_F32 ? ncclFloat32 : t == COMM_F64 ? ncclFloat64 : t == COMM_I32 ? ncclInt32 : t == COMM_BF16 ? ncclBfloat16 : ncclUint8;
}

static int nccl_allreduce(ex_comm *c, void *buf, size_t n, comm_dtype t, comm_redop op)
{
    /* the ranks' agreement on errors: through MPI even after a failed launch */
    if (t == COMM_I32) return (void)host_path(c), comm_mpi_ops.allreduce(c, buf, n, t, op);
    if (!on_device(buf)) return host_path(c) ? UTIL_ERUNTIME : comm_mpi_ops.allreduce(c, buf, n, t, op);
    const char *call = op == COMM_MAX ? (t == COMM_F64 ? "ncclAllReduce(max f64)" : "ncclAllReduce(max)")
                                      : (t == COMM_F64 ? "ncclAllReduce(sum f64)" : "ncclAllReduce(sum)");
    int rc = begin(c, call);
    if (rc) return rc;
    nccl_state *s = state(c);
    return finish(c, ncclAllReduce(buf, buf, n, nccl_type(t), op == COMM_MAX ? ncclMax : ncclSum, s->nccl, s->stream), call);
}

static int nccl_allgather(ex_comm *c, const float *send, float *recv, size_t n)
{
    if (!on_device(recv)) return host_path(c) ? UTIL_ERUNTIME : comm_mpi_ops.allgather(c, send, recv, n);
    int rc = begin(c, "ncclAllGather");
    nccl_state *s = state(c);
    return rc ? rc : finish(c, ncclAllGather(send, recv, n, ncclFloat32, s->nccl, s->stream), "ncclAllGather");
}

static int nccl_reduce_scatter(ex_comm *c, const void *send, void *recv, size_t n, comm_dtype t)
{
    if (!on_device(recv)) return host_path(c) ? UTIL_ERUNTIME : comm_mpi_ops.reduce_scatter(c, send, recv, n, t);
    int rc = begin(c, "ncclReduceScatter");
    nccl_state *s = state(c);
    return rc ? rc : finish(c, ncclReduceScatter(send, recv, n, nccl_type(t), ncclSum, s->nccl, s->stream), "ncclReduceScatter");
}

/* All-to-all as grouped sends and receives, one pair per other rank; the
 * own chunk is a copy on the same stream. */
static int nccl_alltoall(ex_comm *c, const float *send, float *recv, size_t chunk)
{
    const char *call = "all-to-all (grouped ncclSend/ncclRecv)";
    if (!on_device(recv)) return host_path(c) ? UTIL_ERUNTIME : comm_mpi_ops.alltoall(c, send, recv, chunk);
    int rc = begin(c, call);
    if (rc) return rc;
    nccl_state *s = state(c);
    cudaError_t e = cudaMemcpyAsync(recv + (size_t)c->rank * chunk, send + (size_t)c->rank * chunk, chunk * sizeof(float),
                                    cudaMemcpyDefault, s->stream);
    if (e != cudaSuccess) return cuda_fail(c, call, e);
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < c->size && r == ncclSuccess; q++) {
        if (q == c->rank) continue;
        r = ncclSend(send + (size_t)q * chunk, chunk, ncclFloat32, q, s->nccl, s->stream);
        if (r == ncclSuccess) r = ncclRecv(recv + (size_t)q * chunk, chunk, ncclFloat32, q, s->nccl, s->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    return finish(c, r != ncclSuccess ? r : end, call);
}

static int nccl_bcast(ex_comm *c, void *buf, size_t bytes, int root)
{
    if (!on_device(buf)) return host_path(c) ? UTIL_ERUNTIME : comm_mpi_ops.bcast(c, buf, bytes, root);
    int rc = begin(c, "ncclBroadcast");
    nccl_state *s = state(c);
    return rc ? rc : finish(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, s->nccl, s->stream), "ncclBroadcast");
}

/* ---- point-to-point: collected, launched grouped ---- */

static int need_device(ex_comm *c, const void *buf, size_t n, const char *call)
{
    return !n || on_device(buf) ? UTIL_OK
         : comm_fail(c, "%s: rank %d: the buffer is in host memory; NCCL moves device memory (--comm mpi)", call, c->rank);
}

/* A message in host memory (a checkpoint's tensors on their way to the
 * writer) goes through MPI, as host collectives do; both ends must hold it
 * in host memory (a mismatch ends in the timeout, naming the peer). */
static int nccl_post(ex_comm *c, ex_request *r)
{
    const char *call = r->send ? "ncclSend" : "ncclRecv";
    nccl_state *s = state(c);
    r->host = r->n && !on_device(r->buf);
    if (r->host) return comm_mpi_ops.post(c, r);
    if (s->aborted) return comm_fail(c, "%s: not attempted: this NCCL communicator was aborted", call);
    r->impl = NULL;   /* set to its group once launched */
    r->next = NULL;
    *s->tail = r;
    s->tail = &r->next;
    return UTIL_OK;
}

static void group_unref(nccl_group *g)
{
    if (--g->refs > 0) return;
    cudaEventDestroy(g->done);
    util_free(g);
}

/* Launches s's pending sends and receives as one group with one event. */
static int launch_group(nccl_state *s)
{
    ex_comm *c = s->c;
    const char *call = "ncclGroupEnd (grouped ncclSend/ncclRecv)";
    nccl_group *g = util_calloc(1, sizeof *g);
    if (!g) return comm_fail(c, "comm: out of memory for a request");
    cudaError_t e = cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming);
    if (e != cudaSuccess) { util_free(g); return cuda_fail(c, call, e); }
    ex_request *list = s->pending;
    s->pending = NULL;
    s->tail = &s->pending;
    e = cudaEventRecord(s->ready, 0);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s->stream, s->ready, 0);
    ncclResult_t r = e == cudaSuccess ? ncclGroupStart() : ncclSuccess;
    for (ex_request *q = list; q && e == cudaSuccess && r == ncclSuccess; q = q->next) {
        r = q->send ? ncclSend(q->buf, q->n, ncclFloat32, q->peer, s->nccl, s->stream)
                    : ncclRecv(q->buf, q->n, ncclFloat32, q->peer, s->nccl, s->stream);
    }
    int rc = UTIL_OK;
    if (e == cudaSuccess) {
        ncclResult_t end = ncclGroupEnd();
        if (r == ncclSuccess) r = end;
        rc = settle(c, s->nccl, &r, call);
    }
    if (e == cudaSuccess && r == ncclSuccess && !rc) e = cudaEventRecord(g->done, s->stream);
    g->failed = e != cudaSuccess || r != ncclSuccess || rc;
    for (ex_request *q = list, *next; q; q = next) {
        next = q->next;
        q->next = NULL;
        q->impl = g;
        g->refs++;
    }
    if (rc) return rc;
    if (e != cudaSuccess) return cuda_fail(c, call, e);
    return r != ncclSuccess ? nccl_fail(c, call, r) : UTIL_OK;
}

/* Every communicator's pending sends and receives, launched. */
static int launch_all(ex_comm *c)
{
    for (nccl_state *s = g_live; s; s = s->next)
        if (s->pending && !s->aborted && launch_group(s) != UTIL_OK) {
            if (s->c != c) snprintf(c->err, sizeof c->err, "%s", s->c->err);
            return UTIL_ERUNTIME;
        }
    return UTIL_OK;
}

/* ex_comm_start: c's collected sends and receives, launched now. */
static int nccl_start(ex_comm *c)
{
    nccl_state *s = state(c);
    if (s->aborted) return comm_fail(c, "ncclGroupEnd: not attempted: this NCCL communicator was aborted");
    return s->pending ? launch_group(s) : UTIL_OK;
}

/* ---- non-blocking collectives: an event each ---- */

static const char *coll_call(const ex_request *r)
{
    return r->allreduce ? "ncclAllReduce" : r->reduce ? "ncclReduceScatter" : "ncclAllGather";
}

static int nccl_post_coll(ex_comm *c, ex_request *r, const float *send, float *recv, size_t n)
{
    const char *call = coll_call(r);
    if (need_device(c, recv, n, call) || begin(c, call)) return UTIL_ERUNTIME;
    nccl_state *s = state(c);
    nccl_group *g = util_calloc(1, sizeof *g);
    if (!g) return comm_fail(c, "comm: out of memory for a request");
    g->refs = 1;
    cudaError_t e = cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming);
    if (e != cudaSuccess) { util_free(g); return cuda_fail(c, call, e); }
    ncclResult_t res = r->allreduce ? ncclAllReduce(recv, recv, n, ncclFloat32, ncclSum, s->nccl, s->stream)
                     : r->reduce    ? ncclReduceScatter(send, recv, n, ncclFloat32, ncclSum, s->nccl, s->stream)
                                    : ncclAllGather(send, recv, n, ncclFloat32, s->nccl, s->stream);
    int rc = settle(c, s->nccl, &res, call);
    if (res == ncclSuccess && !rc) e = cudaEventRecord(g->done, s->stream);
    if (rc || res != ncclSuccess || e != cudaSuccess) {
        group_unref(g);
        if (rc) return rc;
        return res != ncclSuccess ? nccl_fail(c, call, res) : cuda_fail(c, call, e);
    }
    r->impl = g;
    return UTIL_OK;
}

static int nccl_wait(ex_comm *c, ex_request *r)
{
    if (r->host) {   /* the peer may first need what this rank has collected */
        int rc = host_path(c);
        return rc ? rc : comm_mpi_ops.wait(c, r);
    }
    char what[80];
    if (r->coll) snprintf(what, sizeof what, "%s (wait)", coll_call(r));
    else snprintf(what, sizeof what, "%s(%s %d, tag %d)", r->send ? "ncclSend" : "ncclRecv", r->send ? "to" : "from", r->peer, r->tag);
    nccl_state *s = state(c);
    int rc = comm_check_live(c, what);
    if (!rc && !r->impl) rc = launch_all(c);
    nccl_group *g = r->impl;
    if (!rc && (!g || g->failed)) rc = comm_fail(c, "%s: its group's launch failed", what);
    if (!rc) rc = wait_event(c, s, g->done, r->coll ? -1 : r->peer, what);
    if (g && !comm_broken()) group_unref(g);
    r->impl = NULL;
    return rc;
}

/* ---- messages to self and buffers: device memory ---- */

static int device_copy(void *dst, const void *src, size_t bytes)
{
    return cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) == cudaSuccess ? UTIL_OK : UTIL_ERUNTIME;
}

/* Device memory, counted as UTIL_MEM_COMM as the MPI implementation's host
 * buffers are (executor/comm.h). */
static void *device_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return NULL;
    util_mem_charge(UTIL_MEM_COMM, bytes);
    return p;
}

static void device_free(void *p, size_t bytes)
{
    if (!p) return;
    util_mem_discharge(UTIL_MEM_COMM, bytes);
    cudaFree(p);
}

static const ex_comm_ops nccl_ops = {
    .name = "nccl",
    .attach = nccl_attach,
    .detach = nccl_detach,
    .barrier = host_barrier,  /* host synchronisation: MPI's */
    .allreduce = nccl_allreduce,
    .allgather = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .alltoall = nccl_alltoall,
    .bcast = nccl_bcast,
    .gather_bytes = host_gather_bytes,   /* host data: MPI's */
    .post = nccl_post,
    .post_coll = nccl_post_coll,
    .wait = nccl_wait,
    .start = nccl_start,
    .copy = device_copy,
    .alloc = device_alloc,
    .release = device_free,
};

const ex_comm_ops *comm_nccl_ops(char *err)
{
    (void)err;
    return &nccl_ops;
}

#endif
