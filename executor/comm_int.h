/* executor-internal: the communicator's operations table and what its
 * implementations share. executor/comm.c owns the ex_comm_* names (thin
 * wrappers: argument checks, the 1-rank self communicator, messages to one's
 * own rank, byte counting, the timeout and the "broken" state); an
 * implementation (comm_mpi.c, comm_nccl.c) only moves data between distinct
 * ranks — the design of redis's ConnectionType behind connWrite()
 * (redis/src/connection.h) and sqlite's sqlite3_io_methods behind
 * sqlite3OsRead() (sqlite/src/os.c). */
#ifndef DHP_EXECUTOR_COMM_INT_H
#define DHP_EXECUTOR_COMM_INT_H

#include "executor/comm.h"
#include "util/util.h"

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

/* COMM_BF16: bfloat16 (executor/bf16.h); its sum rounds every partial sum to
 * bf16 (ex_bf16_sum_into), as NCCL's ncclBfloat16 does. */
typedef enum { COMM_F32, COMM_F64, COMM_I32, COMM_BYTE, COMM_BF16 } comm_dtype;
typedef enum { COMM_SUM, COMM_MAX } comm_redop;
size_t comm_dtype_size(comm_dtype t);

typedef struct self_msg self_msg;
typedef enum { REQ_SELF_SEND, REQ_SELF_RECV, REQ_DONE, REQ_IMPL } req_kind;

/* A request. REQ_IMPL requests belong to the implementation that posted them
 * (impl: its state, freed by its wait); the others are comm.c's. */
struct ex_request {
    req_kind kind;
    bool send;            /* point-to-point: send or receive */
    bool coll;            /* a non-blocking collective (else point-to-point) */
    bool reduce;          /* the collective is a reduce-scatter (else an all-gather) */
    bool allreduce;       /* the collective is an in-place sum all-reduce of buf (reduce false) */
    int peer, tag;
    float *buf;           /* receives */
    size_t n, got;        /* floats posted / floats delivered (self receives) */
    bool done;            /* self receive delivered */
    self_msg *msg;        /* self send still queued */
    ex_request *next;     /* in the comm's list of pending self receives */
    bool host;            /* posted through MPI by an implementation for device memory (host data) */
    void *impl;
};

typedef struct ex_comm_ops {
    const char *name;     /* "mpi", "nccl" */
    /* Builds the implementation's state for c (c->mpi, rank and size are set;
     * collective over c); detach frees it. */
    int (*attach)(ex_comm *c, char *err);
    void (*detach)(ex_comm *c);
    /* Collectives over c (not the self communicator), arguments checked; each
     * names its own calls in errors (MPI_Allgather, ncclAllGather). */
    int (*barrier)(ex_comm *c);
    int (*allreduce)(ex_comm *c, void *buf, size_t n, comm_dtype t, comm_redop op);
    int (*allgather)(ex_comm *c, const float *send, float *recv, size_t n);
    int (*reduce_scatter)(ex_comm *c, const void *send, void *recv, size_t n, comm_dtype t);   /* COMM_F32 or COMM_BF16 sums */
    int (*alltoall)(ex_comm *c, const float *send, float *recv, size_t chunk);
    int (*bcast)(ex_comm *c, void *buf, size_t bytes, int root);
    int (*gather_bytes)(ex_comm *c, const void *send, void *recv, size_t bytes, int root);
    /* Point-to-point with another rank: r is a REQ_IMPL request with send,
     * buf, n, peer and tag set; post fills r->impl, wait completes it (a
     * receive must get exactly n floats) and frees r->impl. */
    int (*post)(ex_comm *c, ex_request *r);
    /* Non-blocking all-gather (reduce false), reduce-scatter or in-place
     * sum all-reduce (allreduce: recv == send) into r. */
    int (*post_coll)(ex_comm *c, ex_request *r, const float *send, float *recv, size_t n);
    int (*wait)(ex_comm *c, ex_request *r);
    /* Optional: starts the point-to-point operations post collected but has
     * not begun (NULL where post begins them, as MPI's). */
    int (*start)(ex_comm *c);
    /* Where messages to one's own rank are copied and buffered: host memory
     * (MPI) or wherever the buffers live (NCCL: cudaMemcpyDefault). */
    int (*copy)(void *dst, const void *src, size_t bytes);
    /* A buffer of bytes there, counted as UTIL_MEM_COMM until released (release gets the same bytes). */
    void *(*alloc)(size_t bytes);
    void (*release)(void *p, size_t bytes);
} ex_comm_ops;

struct ex_comm {
    const ex_comm_ops *ops;
    bool self;            /* the MPI-less 1-rank communicator: no implementation call at all */
    MPI_Comm mpi;         /* every implementation's host communicator: splits, NCCL ids, host data */
    void *impl;           /* the implementation's state (NCCL: its communicator and stream) */
    int rank, size;
    uint64_t bytes;
    self_msg *sends;      /* queued sends to self, oldest first */
    ex_request *recvs;    /* posted receives from self, oldest first */
    char err[UTIL_ERR_LEN];
};

extern const ex_comm_ops comm_mpi_ops;
/* The NCCL table, or NULL with err saying why (a build without NCCL). */
const ex_comm_ops *comm_nccl_ops(char *err);
/* Whether the NCCL built in is the tests' emulation (tests/ncclemu.h). */
bool comm_nccl_emulated(void);

/* ---- shared by the implementations (comm.c) ---- */
__attribute__((format(printf, 2, 3)))
int comm_fail(ex_comm *c, const char *fmt, ...);
/* A wait timed out somewhere: every later call fails at once, MPI is not finalized. */
bool comm_broken(void);
/* Marks the communicators broken (an aborted NCCL communicator: peers may
 * wait on this rank forever), so this process exits without MPI_Finalize
 * and the launcher ends the job. */
void comm_set_broken(void);
/* Refuses `call` after a timeout (UTIL_ERUNTIME with the message in c). */
int comm_check_live(ex_comm *c, const char *call);
/* The largest element count one MPI call is given (ex_comm_set_max_piece). */
size_t comm_max_piece(void);
/* Polls test(arg, &done) until done, answering other ranks' pings meanwhile;
 * after the timeout, marks the communicators broken and fails with one line
 * naming this rank, `call` and the members of c (only `peer`, if >= 0) that
 * did not answer. test returns UTIL_OK or fails with its message in c. */
typedef int (*comm_test_fn)(ex_comm *c, void *arg, bool *done);
int comm_poll(ex_comm *c, comm_test_fn test, void *arg, int peer, const char *call);
/* A check comm_poll runs now and then while any wait polls (NCCL's
 * asynchronous errors, which MPI's waits on host data must see too): non-zero
 * ends the wait with c's message. */
typedef int (*comm_async_fn)(ex_comm *c, const char *call);
void comm_set_async_check(comm_async_fn fn);
/* A wrapped communicator over m (taken over, freed on failure) with ops'
 * state attached. */
int comm_wrap(const ex_comm_ops *ops, MPI_Comm m, ex_comm **out, char *err);
/* Frees c's queued self messages (comm_p2p.c). */
void comm_self_free(ex_comm *c);

/* ---- timeout diagnosis (comm_diag.c) ---- */
/* A private duplicate of MPI_COMM_WORLD for pings; an MPI return code. */
int comm_diag_init(void);
void comm_diag_free(void);
/* Answers the pings other ranks sent this one (called while it waits). */
void comm_diag_serve(void);
/* After a wait on c timed out: pings the members of c (only `peer`, its rank
 * in c, if >= 0) and writes into why which world ranks did not answer. */
void comm_diag_timeout(MPI_Comm c, int peer, double waited, char *why, size_t n);
/* After a failure that does not say which rank is gone (NCCL's
 * ncclRemoteError): "; no answer from rank(s) ..." for c's members that do
 * not answer a ping within a few seconds, else that every other one does. */
void comm_diag_missing(MPI_Comm c, char *why, size_t n);

/* MPI's message for an MPI return code (s: MPI_MAX_ERROR_STRING bytes). */
const char *comm_mpi_message(int rc, char *s);

#endif
