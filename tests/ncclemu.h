/* A thin NCCL + CUDA-runtime emulation over MPI, for the CPU: exactly the
 * nccl* and cuda* calls executor/comm_nccl.c makes, so that file compiles
 * and runs in `make test` without a GPU (make's emulator build: $(BUILD)/
 * dhp-emu and $(BUILD)/comm_check_emu, comm_nccl.c compiled with
 * -DDHP_NCCL -DDHP_NCCL_EMU -include tests/ncclemu.h).
 *
 * What is faithful:
 * - Communicator creation: ncclGetUniqueId names a root (its world rank and
 *   a sequence number); ncclCommInitRankConfig (non-blocking: returns
 *   ncclInProgress, ncclCommGetAsyncError advances it; tests/ncclemu_init.h)
 *   sends (rank, world rank) to the root, which answers every member with
 *   the full table, and the members build an MPI communicator of exactly
 *   those ranks, in NCCL rank order (MPI_Comm_create_group: collective over
 *   the members only, as NCCL's bootstrap is). A wrong id or rank count
 *   stays in progress here as NCCL's would (the caller's timeout ends it).
 * - Semantics of AllReduce (sum, max; float, double, int32; bf16 sum, each
 *   partial sum rounded to bf16), AllGather,
 *   ReduceScatter (recvcount per rank), Broadcast (in place or not),
 *   Send / Recv matched in order per peer (MPI's non-overtaking rule on a
 *   fixed tag), grouped between ncclGroupStart and ncclGroupEnd.
 * - Asynchrony: every operation is posted non-blocking (MPI_I*) when it is
 *   enqueued and completes later; cudaEventRecord marks what was posted on
 *   its stream so far; cudaEventQuery says cudaErrorNotReady until all of it
 *   has completed, so comm_nccl.c's polling, timeout and ncclCommAbort paths
 *   run as on a GPU. ncclCommGetAsyncError reports ncclInvalidUsage when a
 *   receive and its send disagree on the size (MPI truncation), where real
 *   NCCL would hang or corrupt.
 * - Shutdown order: ncclCommFinalize, polled until its operations are
 *   done, before ncclCommDestroy; a destroy out of that order aborts.
 * What is not:
 * - Device memory is host memory: cudaMalloc is malloc, cudaMemcpy* with
 *   any kind is memmove, and cudaPointerGetAttributes calls every pointer
 *   device memory (so the CPU backend's buffers, and the run's host
 *   variables, all go through the emulated NCCL; on a GPU the host ones go
 *   through MPI) - except under dhp-emu's CUDA backend, where it answers as a
 *   GPU does (only cudaMalloc's memory is device memory: host variables take
 *   comm_nccl.c's MPI path) and an NCCL call given host memory aborts.
 * - Stream order is not enforced: operations on one stream start at once
 *   instead of after the previous one finished, and a ncclSend / ncclRecv
 *   outside a group does not block its stream. So a schedule that would
 *   deadlock on a GPU through stream order is not caught here; data order is
 *   kept because comm_nccl.c waits for a blocking operation's event before
 *   the next and never reuses a non-blocking operation's buffers early.
 *   cudaStreamWaitEvent waits on the host for the event. Order against
 *   the compute stream is checked, though: an operation on an NCCL stream
 *   that has not waited for all the compute work issued before it aborts
 *   naming the call (emu_stream_ordered).
 * - The "legacy default stream" (0) is the host: work on it is done when the
 *   call returns, so an event recorded on it is complete at once.
 * - cudaGetDeviceCount says 8 (DHP_EMU_GPUS overrides): the node of one
 *   process per emulated GPU.
 * - Faults on demand: DHP_EMU_NCCL_FAULT (emu_fault) makes one rank's n-th
 *   operation fail asynchronously or hang; a real NCCL fails or hangs
 *   where its network or a peer does. Counts above INT_MAX elements are refused
 *   (ncclInvalidArgument) rather than split. */
#ifndef DHP_TESTS_NCCLEMU_H
#define DHP_TESTS_NCCLEMU_H

#include <limits.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "executor/bf16.h"

/* ---- CUDA runtime ---- */

typedef enum {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100, cudaErrorNotReady = 600
} cudaError_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
enum cudaMemoryType { cudaMemoryTypeUnregistered, cudaMemoryTypeHost, cudaMemoryTypeDevice, cudaMemoryTypeManaged };
struct cudaPointerAttributes { enum cudaMemoryType type; int device; void *devicePointer, *hostPointer; };
#define cudaStreamNonBlocking 1u
#define cudaEventDisableTiming 2u

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;

/* What a stream has posted: MPI requests, completed in any order; a
 * receive's entry keeps its count to check the message's. */
struct emu_nccl;
typedef struct { MPI_Request r; MPI_Datatype t; int want; } emu_req;
struct emu_stream {
    emu_req *reqs;
    int n, cap;
    unsigned long posted, completed_upto;   /* requests posted; all below this index are complete */
    struct emu_nccl *owner;                 /* the communicator whose async error a bad receive sets */
    bool stalled;                           /* an injected hang (DHP_EMU_NCCL_FAULT): nothing completes */
    unsigned long compute_seen;             /* compute-stream work ordered before this stream's next operation */
};
struct emu_event {
    cudaStream_t stream;                    /* NULL: recorded on the host stream (or never) */
    unsigned long upto;                     /* complete when the stream's first `upto` requests are */
    unsigned long compute;                  /* the compute-stream work ordered before the event */
};
static void emu_bad_receive(struct emu_nccl *c);

static int emu_device = 0;

static inline const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorNotReady: return "device not ready";
    }
    return "unknown error";
}
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaGetDeviceCount(int *n)
{
    const char *v = getenv("DHP_EMU_GPUS");
    *n = v && atoi(v) >= 0 ? atoi(v) : 8;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d)
{
    int n;
    cudaGetDeviceCount(&n);
    if (d < 0 || d >= n) return cudaErrorInvalidDevice;
    emu_device = d;
    return cudaSuccess;
}
/* The device queries dhp profile makes (profile/device_facts.c): the
 * emulated device is the CPU, so it names itself "cuda-emu", and its clocks
 * and bus are not known (cudaErrorInvalidValue: the profile then takes its
 * peak from the best measured GEMM rate and hbm_bw from the copy); memory is
 * the host's (sysconf). Its multiProcessorCount is plainly 1, the CPU as one
 * multiprocessor: the profile writes sm_count 1, whose GEMM wave term is 1
 * at every shape (costdb/model.c), and its peak is one unit's rate. */
enum cudaDeviceAttr { cudaDevAttrClockRate = 13, cudaDevAttrMemoryClockRate = 36, cudaDevAttrGlobalMemoryBusWidth = 37 };
struct cudaDeviceProp { char name[256]; int major, minor, multiProcessorCount; };
static inline cudaError_t cudaGetDevice(int *d) { *d = emu_device; return cudaSuccess; }
static inline cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    (void)d;
    memset(p, 0, sizeof *p);
    strcpy(p->name, "cuda-emu");
    p->multiProcessorCount = 1;
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
    (void)a; (void)d;
    *v = 0;
    return cudaErrorInvalidValue;
}
static inline cudaError_t cudaRuntimeGetVersion(int *v) { *v = 0; return cudaSuccess; }
static inline cudaError_t cudaDriverGetVersion(int *v) { *v = 0; return cudaSuccess; }
static inline cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    *total_b = pages > 0 && size > 0 ? (size_t)pages * (size_t)size : 0;
    *free_b = avail > 0 && size > 0 ? (size_t)avail * (size_t)size : 0;
    return cudaSuccess;
}
static inline cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
/* Stream order against the compute stream (DHP_EMU_DROP_STREAM_WAITS, below,
 * drops the waits on demand). tests/cudaemu.h runs kernels at
 * once, so data written by a kernel is there before any NCCL call reads it
 * whatever the events say; on a GPU the NCCL stream may run ahead of the
 * compute stream unless it waited, through an event recorded on the compute
 * stream after that kernel. So every operation an NCCL stream takes (a
 * collective, a send or receive, a copy on it) must come after a
 * cudaStreamWaitEvent that covers all the compute work issued so far
 * (cudaemu_compute_ops: tests/cudaemu.h counts it; weak, so without the CUDA
 * emulation, the CPU backend's buffers, nothing is checked); else abort,
 * naming the call: a missing event wait is a test failure, not a silent
 * race. dhp orders every NCCL operation after all the compute before it
 * (executor/comm_nccl.c begin / launch_group), so the rule is exact for it. */
extern unsigned long cudaemu_compute_ops(void) __attribute__((weak));
static inline void emu_stream_ordered(cudaStream_t s, const char *call)
{
    if (!s || !cudaemu_compute_ops) return;
    unsigned long issued = cudaemu_compute_ops();
    if (s->compute_seen >= issued) return;
    fprintf(stderr, "ncclemu stream order: %s on an NCCL stream that did not wait for the compute stream "
            "(%lu of its operations not covered by a cudaStreamWaitEvent): on a GPU it could read data "
            "before the kernels that write it finish\n", call, issued - s->compute_seen);
    fflush(stderr);
    abort();
}

static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k)
{
    (void)k;
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k, cudaStream_t s)
{
    emu_stream_ordered(s, "cudaMemcpyAsync");
    return cudaMemcpy(dst, src, bytes, k);
}
/* Strict pointers: when dhp-emu's CUDA backend is in use, tests/cudaemu.h
 * (its device-pointer guard) answers which pointers are emulated device
 * memory: 1 or 0; -1 when the CUDA backend is not in use (the CPU backend's
 * buffers then count as device memory, as above). Weak: comm_check_emu and
 * dhp-emu define it, a build without tests/cudaemu.h does not. */
extern int cudaemu_strict_is_device(const void *p) __attribute__((weak));
static inline int emu_strict_device(const void *p)
{
    return cudaemu_strict_is_device ? cudaemu_strict_is_device(p) : -1;
}

/* NCCL moves device memory only: under strict pointers a host buffer handed
 * to an NCCL call aborts naming it, as the guard does for kernels. */
static inline void emu_nccl_buffer(const char *call, const char *which, const void *p)
{
    if (p && emu_strict_device(p) == 0) {
        fprintf(stderr, "ncclemu guard: %s: %s %p is not device memory (a host buffer handed to NCCL)\n", call, which, p);
        fflush(stderr);
        abort();
    }
}

static inline cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    memset(a, 0, sizeof *a);
    /* CUDA 11+ answers cudaSuccess and "unregistered" for plain host memory */
    a->type = emu_strict_device(p) == 0 ? cudaMemoryTypeUnregistered : cudaMemoryTypeDevice;
    a->device = emu_device;
    a->devicePointer = (void *)p;
    return cudaSuccess;
}

static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    *s = calloc(1, sizeof **s);
    return *s ? cudaSuccess : cudaErrorMemoryAllocation;
}
/* A stream's requests, tested; frees the prefix that completed. */
static inline cudaError_t emu_stream_progress(cudaStream_t s)
{
    int done = 0;
    while (done < s->n) {
        int flag = 0, count = 0;
        MPI_Status st;
        emu_req *q = &s->reqs[done];
        if (MPI_Test(&q->r, &flag, &st) != MPI_SUCCESS) { flag = 1; emu_bad_receive(s->owner); }
        if (!flag) break;
        if (q->want >= 0 && (MPI_Get_count(&st, q->t, &count) != MPI_SUCCESS || count != q->want))
            emu_bad_receive(s->owner);
        done++;
    }
    if (done) {
        memmove(s->reqs, s->reqs + done, (size_t)(s->n - done) * sizeof *s->reqs);
        s->n -= done;
        s->completed_upto += (unsigned long)done;
    }
    return cudaSuccess;
}
static inline cudaError_t emu_stream_add(cudaStream_t s, MPI_Request r, MPI_Datatype t, int want)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        emu_req *q = realloc(s->reqs, (size_t)cap * sizeof *q);
        if (!q) return cudaErrorMemoryAllocation;
        s->reqs = q;
        s->cap = cap;
    }
    s->reqs[s->n++] = (emu_req){ r, t, want };
    s->posted++;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    while (s && s->n) emu_stream_progress(s);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (s) free(s->reqs);
    free(s);
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    (void)flags;
    *e = calloc(1, sizeof **e);
    return *e ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    e->stream = s;
    e->upto = s ? s->posted : 0;
    e->compute = s ? s->compute_seen : cudaemu_compute_ops ? cudaemu_compute_ops() : 0;
    return cudaSuccess;
}
static inline cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!e->stream) return cudaSuccess;
    if (e->stream->stalled) return cudaErrorNotReady;
    emu_stream_progress(e->stream);
    return e->stream->completed_upto >= e->upto ? cudaSuccess : cudaErrorNotReady;
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)flags;
    while (cudaEventQuery(e) == cudaErrorNotReady) {}
    /* DHP_EMU_DROP_STREAM_WAITS=1: the wait orders nothing, as if it were
     * missing (tests/t_backend.sh: the stream-order check must catch it) */
    static int drop = -1;
    if (drop < 0) drop = getenv("DHP_EMU_DROP_STREAM_WAITS") && atoi(getenv("DHP_EMU_DROP_STREAM_WAITS")) == 1;
    if (s && !drop && e->compute > s->compute_seen) s->compute_seen = e->compute;
    return cudaSuccess;
}

/* ---- NCCL ---- */

typedef enum {
    ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
    ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7
} ncclResult_t;
typedef enum { ncclInt32 = 2, ncclUint8 = 1, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclMax = 3 } ncclRedOp_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

#define EMU_COMM_STREAMS 8
struct emu_nccl {
    MPI_Comm comm;
    int rank, size;
    bool aborted;
    ncclResult_t async;
    struct emu_boot *boot;                  /* the set-up while in progress (tests/ncclemu_init.h) */
    int finalize;                           /* 0: not asked; 1: ncclCommFinalize in progress; 2: quiescent */
    cudaStream_t streams[EMU_COMM_STREAMS]; /* the streams its operations were posted on (the first few) */
    int n_streams;
};
typedef struct emu_nccl *ncclComm_t;

#define EMU_NCCL_VERSION 22304   /* the API this emulates: NCCL 2.23's */
#define EMU_MAGIC 0x6e63636cu     /* "nccl" */
#define EMU_TAG_BOOT 30000        /* bootstrap tags on MPI_COMM_WORLD: EMU_TAG_BOOT + 2 * (seq % 1000) (+1) */
#define EMU_TAG_P2P 7

typedef struct { uint32_t magic; int root; int seq; } emu_id;

static inline ncclResult_t ncclGetVersion(int *v) { *v = EMU_NCCL_VERSION; return ncclSuccess; }
static inline const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage (emulation: a receive and its send disagree on the size)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static int seq;
    emu_id e = { EMU_MAGIC, 0, seq++ };
    if (MPI_Comm_rank(MPI_COMM_WORLD, &e.root) != MPI_SUCCESS) return ncclSystemError;
    memset(id, 0, sizeof *id);
    memcpy(id->internal, &e, sizeof e);
    return ncclSuccess;
}

#include "tests/ncclemu_init.h"

/* Shutdown in NCCL >= 2.14's documented order: ncclCommFinalize (on a
 * non-blocking communicator ncclInProgress, ncclCommGetAsyncError then
 * ncclInProgress until every operation posted on it has completed: here
 * its streams' MPI requests), then ncclCommDestroy once the state is
 * ncclSuccess. A destroy without the finalize, or before it completed
 * (operations still outstanding), aborts naming which, as the other guards
 * do; ncclCommAbort needs neither. */
static inline ncclResult_t ncclCommFinalize(ncclComm_t c)
{
    if (!c || c->aborted || c->boot || c->finalize) return ncclInvalidUsage;
    /* DHP_EMU_DROP_FINALIZE=1: the call is lost, as if comm_nccl.c never made
     * it (tests/t_comm_nccl.sh: the destroy's check must catch it) */
    static int drop = -1;
    if (drop < 0) drop = getenv("DHP_EMU_DROP_FINALIZE") && atoi(getenv("DHP_EMU_DROP_FINALIZE")) == 1;
    if (drop) return ncclSuccess;
    c->finalize = 1;
    return ncclInProgress;
}
static inline bool emu_quiescent(ncclComm_t c)
{
    for (int i = 0; i < c->n_streams; i++) {
        if (c->streams[i]->stalled) return false;
        emu_stream_progress(c->streams[i]);
        if (c->streams[i]->n) return false;
    }
    return true;
}
static inline ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c) return ncclSuccess;
    if (!c->aborted && !c->boot && c->finalize != 2) {
        fprintf(stderr, "ncclemu shutdown: ncclCommDestroy of a communicator (rank %d of %d) %s: NCCL >= 2.14 asks for "
                "ncclCommFinalize, its state polled to ncclSuccess, first\n", c->rank, c->size,
                c->finalize ? "whose ncclCommFinalize has not completed (operations outstanding)" : "never finalized");
        fflush(stderr);
        abort();
    }
    if (!c->aborted && !c->boot) MPI_Comm_free(&c->comm);
    emu_boot_free(c->boot);
    free(c);
    return ncclSuccess;
}
/* Posted operations are left behind (MPI cannot cancel collectives); the
 * process is expected to end, as after a real abort. */
static inline ncclResult_t ncclCommAbort(ncclComm_t c)
{
    c->aborted = true;
    return ncclSuccess;
}
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *r)
{
    if (c->finalize == 1 && !c->aborted && c->async == ncclSuccess) {
        if (emu_quiescent(c)) c->finalize = 2;
        *r = c->finalize == 2 ? ncclSuccess : ncclInProgress;
        return ncclSuccess;
    }
    if (c->boot && !c->aborted && c->async == ncclSuccess) {
        ncclResult_t b = emu_boot_progress(c);
        if (b != ncclInProgress) c->async = b;
        *r = b;
        return ncclSuccess;
    }
    *r = c->async;
    return ncclSuccess;
}

static inline MPI_Datatype emu_type(ncclDataType_t t)
{
    return t == ncclFloat32 ? MPI_FLOAT : t == ncclFloat64 ? MPI_DOUBLE : t == ncclInt32 ? MPI_INT
         : t == ncclBfloat16 ? MPI_UINT16_T : MPI_BYTE;
}
static inline size_t emu_size(ncclDataType_t t)
{
    return t == ncclFloat32 || t == ncclInt32 ? 4 : t == ncclFloat64 ? 8 : t == ncclBfloat16 ? 2 : 1;
}
static void emu_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    ex_bf16_sum_into(in, inout, (size_t)*len);
}
/* MPI's op for op over t: a bf16 sum adds in fp32 and rounds each partial sum
 * to bf16 as NCCL does, through the same user op as the MPI communicator's
 * (ex_bf16_sum_into), so emulated NCCL and MPI give the same bits. */
static inline MPI_Op emu_op(ncclRedOp_t op, ncclDataType_t t)
{
    static MPI_Op bf16_sum = MPI_OP_NULL;
    if (op == ncclMax) return MPI_MAX;
    if (t != ncclBfloat16) return MPI_SUM;
    if (bf16_sum == MPI_OP_NULL) MPI_Op_create(emu_bf16_sum, 1, &bf16_sum);
    return bf16_sum;
}
static void emu_bad_receive(struct emu_nccl *c)
{
    if (c) c->async = ncclInvalidUsage;
}
/* rc: the MPI call that posted r; want: a receive's count, else -1. */
static inline ncclResult_t emu_post_recv(ncclComm_t c, cudaStream_t s, int rc, MPI_Request r, MPI_Datatype t, int want)
{
    if (rc != MPI_SUCCESS) return ncclSystemError;
    s->owner = c;
    bool known = false;
    for (int i = 0; i < c->n_streams; i++) known = known || c->streams[i] == s;
    if (!known && c->n_streams < EMU_COMM_STREAMS) c->streams[c->n_streams++] = s;
    return emu_stream_add(s, r, t, want) == cudaSuccess ? ncclSuccess : ncclSystemError;
}
static inline ncclResult_t emu_post(ncclComm_t c, cudaStream_t s, int rc, MPI_Request r)
{
    return emu_post_recv(c, s, rc, r, MPI_BYTE, -1);
}
static inline ncclResult_t emu_check(ncclComm_t c, size_t count)
{
    if (!c || c->aborted) return ncclInvalidUsage;
    return count > INT_MAX ? ncclInvalidArgument : ncclSuccess;
}

/* Injected faults, for the tests: DHP_EMU_NCCL_FAULT=RANK:OP:KIND makes
 * the process of world rank RANK fail its OP-th NCCL operation (1-based,
 * counting every collective and every send and receive as it is posted):
 * the operation is left unposted and its stream never completes again;
 * KIND `error` also sets its communicator's asynchronous error to
 * ncclSystemError (as NCCL reports a failed proxy or network transfer),
 * `stall` does not (a hung kernel: the process stays alive and answers).
 * Returns whether the operation must not be posted. */
static inline bool emu_fault(ncclComm_t c, cudaStream_t s)
{
    static int parsed, op;
    static long count;
    static char kind[16];
    if (!parsed) {
        parsed = 1;
        const char *v = getenv("DHP_EMU_NCCL_FAULT");
        int rank = -1, me = -2;
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        if (!v || sscanf(v, "%d:%d:%15s", &rank, &op, kind) != 3 || rank != me || op < 1) op = 0;
    }
    if (!op || ++count != op) return false;
    s->stalled = true;   /* a failed operation does not complete either */
    if (strcmp(kind, "stall")) c->async = ncclSystemError;
    return true;
}

static inline ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                         ncclComm_t c, cudaStream_t s)
{
    ncclResult_t e = emu_check(c, count);
    if (e) return e;
    emu_stream_ordered(s, "ncclAllReduce");
    emu_nccl_buffer("ncclAllReduce", "send buffer", send);
    emu_nccl_buffer("ncclAllReduce", "receive buffer", recv);
    if (emu_fault(c, s)) return ncclSuccess;
    MPI_Request r;
    int rc = MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, emu_type(t), emu_op(op, t), c->comm, &r);
    return emu_post(c, s, rc, r);
}
static inline ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c,
                                         cudaStream_t s)
{
    ncclResult_t e = emu_check(c, count);
    if (e) return e;
    emu_stream_ordered(s, "ncclAllGather");
    emu_nccl_buffer("ncclAllGather", "send buffer", send);
    emu_nccl_buffer("ncclAllGather", "receive buffer", recv);
    if (emu_fault(c, s)) return ncclSuccess;
    bool in_place = (const char *)send == (const char *)recv + (size_t)c->rank * count * emu_size(t);
    MPI_Request r;
    int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, (int)count, emu_type(t), recv, (int)count, emu_type(t),
                            c->comm, &r);
    return emu_post(c, s, rc, r);
}
static inline ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t,
                                             ncclRedOp_t op, ncclComm_t c, cudaStream_t s)
{
    ncclResult_t e = emu_check(c, count);
    if (e) return e;
    emu_stream_ordered(s, "ncclReduceScatter");
    emu_nccl_buffer("ncclReduceScatter", "send buffer", send);
    emu_nccl_buffer("ncclReduceScatter", "receive buffer", recv);
    if (emu_fault(c, s)) return ncclSuccess;
    bool in_place = (const char *)send + (size_t)c->rank * count * emu_size(t) == (const char *)recv;
    MPI_Request r;
    int rc = MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : send, recv, (int)count, emu_type(t), emu_op(op, t),
                                       c->comm, &r);
    return emu_post(c, s, rc, r);
}
static inline ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                                         ncclComm_t c, cudaStream_t s)
{
    ncclResult_t e = emu_check(c, count);
    if (e) return e;
    if (root < 0 || root >= c->size) return ncclInvalidArgument;
    emu_stream_ordered(s, "ncclBroadcast");
    emu_nccl_buffer("ncclBroadcast", "send buffer", send);
    emu_nccl_buffer("ncclBroadcast", "receive buffer", recv);
    if (emu_fault(c, s)) return ncclSuccess;
    if (c->rank == root && send != recv) memmove(recv, send, count * emu_size(t));
    MPI_Request r;
    int rc = MPI_Ibcast(recv, (int)count, emu_type(t), root, c->comm, &r);
    return emu_post(c, s, rc, r);
}

/* Point-to-point: inside a group, collected and posted together at ncclGroupEnd. */
typedef struct { bool send; void *buf; size_t count; ncclDataType_t t; int peer; ncclComm_t c; cudaStream_t s; } emu_p2p;
static int emu_group_depth;
static emu_p2p *emu_group_ops;
static int emu_group_n, emu_group_cap;

/* A receive whose message is longer (MPI's truncation error) or shorter
 * than its count sets the communicator's asynchronous error when it completes. */
static inline ncclResult_t emu_p2p_post(const emu_p2p *o)
{
    ncclResult_t e = emu_check(o->c, o->count);
    if (e) return e;
    if (o->peer < 0 || o->peer >= o->c->size) return ncclInvalidArgument;
    emu_stream_ordered(o->s, o->send ? "ncclSend" : "ncclRecv");
    emu_nccl_buffer(o->send ? "ncclSend" : "ncclRecv", "buffer", o->buf);
    if (emu_fault(o->c, o->s)) return ncclSuccess;
    MPI_Request r;
    int rc = o->send ? MPI_Isend(o->buf, (int)o->count, emu_type(o->t), o->peer, EMU_TAG_P2P, o->c->comm, &r)
                     : MPI_Irecv(o->buf, (int)o->count, emu_type(o->t), o->peer, EMU_TAG_P2P, o->c->comm, &r);
    return emu_post_recv(o->c, o->s, rc, r, emu_type(o->t), o->send ? -1 : (int)o->count);
}
static inline ncclResult_t emu_p2p_add(emu_p2p o)
{
    if (!emu_group_depth) return emu_p2p_post(&o);
    if (emu_group_n == emu_group_cap) {
        int cap = emu_group_cap ? 2 * emu_group_cap : 16;
        emu_p2p *q = realloc(emu_group_ops, (size_t)cap * sizeof *q);
        if (!q) return ncclSystemError;
        emu_group_ops = q;
        emu_group_cap = cap;
    }
    emu_group_ops[emu_group_n++] = o;
    return ncclSuccess;
}
static inline ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    return emu_p2p_add((emu_p2p){ true, (void *)buf, count, t, peer, c, s });
}
static inline ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t s)
{
    return emu_p2p_add((emu_p2p){ false, buf, count, t, peer, c, s });
}
static inline ncclResult_t ncclGroupStart(void) { emu_group_depth++; return ncclSuccess; }
static inline ncclResult_t ncclGroupEnd(void)
{
    if (emu_group_depth <= 0) return ncclInvalidUsage;
    if (--emu_group_depth) return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    for (int i = 0; i < emu_group_n && r == ncclSuccess; i++) r = emu_p2p_post(&emu_group_ops[i]);
    emu_group_n = 0;
    return r;
}

#endif
