/* executor-internal: the communicator interface. The training driver
 * (executor/run.c) talks to other ranks only through these calls; behind
 * them an operations table (comm_int.h) picks the implementation: MPI
 * (executor/comm_mpi.c) or NCCL (executor/comm_nccl.c, one NCCL
 * communicator per ex_comm, for buffers in device memory).
 *
 * Conventions: every collective is called by all ranks of the communicator
 * in the same order; counts are in floats unless named bytes; chunked
 * collectives use equal chunks (callers pad). Every call returns UTIL_OK or
 * UTIL_ERUNTIME (message in ex_comm_error). Buffers the implementation
 * allocates to hold data are counted as UTIL_MEM_COMM (bookkeeping as
 * UTIL_MEM_OTHER). Bytes moved are counted per
 * communicator (ex_comm_bytes) for the logs and the simulator's checks. */
#ifndef DHP_EXECUTOR_COMM_H
#define DHP_EXECUTOR_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ex_comm ex_comm;
typedef struct ex_request ex_request;

typedef enum { EX_COMM_MPI, EX_COMM_NCCL } ex_comm_kind;
const char *ex_comm_kind_name(ex_comm_kind kind);   /* "mpi", "nccl" */
/* Which implementation a run uses (dhp run --comm): `asked` "mpi", "nccl" or
 * NULL for the default, NCCL when the backend is CUDA and NCCL is built in,
 * else MPI. Fills `line` with the one log line saying which and why;
 * UTIL_EINVAL / UTIL_EUNSUPPORTED with one line in err otherwise. */
int ex_comm_pick(const char *asked, bool cuda_backend, ex_comm_kind *out, char *line, size_t line_len, char *err);
/* Whether this dhp has NCCL (a real one, or the tests' emulation); its version string. */
bool ex_comm_nccl_built(const char **version);

/* The world communicator of `kind`: initialises MPI (MPI_THREAD_FUNNELED)
 * unless it already is — MPI launches every implementation and carries its
 * host data; without mpirun this is a 1-rank world. NCCL first picks this
 * process's GPU (ex_comm_local_rank: one process per GPU). Splits inherit the
 * kind. *out is owned by the caller (ex_comm_free, then ex_comm_finalize
 * once at exit). */
int ex_comm_world(int *argc, char ***argv, ex_comm_kind kind, ex_comm **out, char *err);
ex_comm_kind ex_comm_kind_of(const ex_comm *c);
/* This process's rank among the world's ranks on its node (the GPU it
 * drives): $OMPI_COMM_WORLD_LOCAL_RANK (mpirun), else $SLURM_LOCALID (srun),
 * else its rank in MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) of world. */
int ex_comm_local_rank(const ex_comm *world);
void ex_comm_finalize(void);
/* A 1-rank communicator that needs no MPI (unit tests, the planner-only CLI). */
int ex_comm_self(ex_comm **out, char *err);
int ex_comm_rank(const ex_comm *c);
int ex_comm_size(const ex_comm *c);
/* Collective over c: ranks passing the same color >= 0 form a new
 * communicator ranked by key (ties by rank in c); color < 0 gets *out = NULL. */
int ex_comm_split(ex_comm *c, int color, int key, ex_comm **out, char *err);
void ex_comm_free(ex_comm *c);
/* Last error of c, "" if none. */
const char *ex_comm_error(const ex_comm *c);
/* Total bytes this rank sent through c (collectives counted as the bytes the
 * algorithm sends, point-to-point as the payload). */
uint64_t ex_comm_bytes(const ex_comm *c);

int ex_comm_barrier(ex_comm *c);
int ex_comm_allreduce_sum(ex_comm *c, float *buf, size_t n);          /* in place */
int ex_comm_allreduce_max(ex_comm *c, float *buf, size_t n);          /* in place */
int ex_comm_allreduce_sum_f64(ex_comm *c, double *buf, size_t n);     /* in place */
int ex_comm_allreduce_max_int(ex_comm *c, int *buf, size_t n);        /* in place, error agreement */
/* recv[r * n .. (r+1) * n) = rank r's send[0 .. n) */
int ex_comm_allgather(ex_comm *c, const float *send, float *recv, size_t n);
/* recv[0 .. n) = sum over ranks of their send[rank * n .. (rank+1) * n) */
int ex_comm_reduce_scatter(ex_comm *c, const float *send, float *recv, size_t n);
/* The same sums over bfloat16 elements (executor/bf16.h): every partial sum
 * rounded to bf16, as NCCL's ncclBfloat16 (MPI: a user op of ex_bf16_sum_into);
 * the activation collectives under bf16 (executor/tp_wire.c). */
int ex_comm_allreduce_sum_bf16(ex_comm *c, uint16_t *buf, size_t n);
int ex_comm_reduce_scatter_bf16(ex_comm *c, const uint16_t *send, uint16_t *recv, size_t n);
/* chunk r of send goes to rank r; chunk r of recv comes from rank r */
int ex_comm_alltoall(ex_comm *c, const float *send, float *recv, size_t chunk);
int ex_comm_bcast(ex_comm *c, void *buf, size_t bytes, int root);
/* Non-blocking ex_comm_allgather and ex_comm_reduce_scatter: ex_comm_wait
 * completes the request; both buffers must stay untouched until then. */
int ex_comm_iallgather(ex_comm *c, const float *send, float *recv, size_t n, ex_request **req);
int ex_comm_ireduce_scatter(ex_comm *c, const float *send, float *recv, size_t n, ex_request **req);
/* Non-blocking ex_comm_allreduce_sum, in place: buf untouched until ex_comm_wait. */
int ex_comm_iallreduce_sum(ex_comm *c, float *buf, size_t n, ex_request **req);
/* Gathers `bytes` from every rank to root's recv[r * bytes ..]; recv unused elsewhere. */
int ex_comm_gather_bytes(ex_comm *c, const void *send, void *recv, size_t bytes, int root);

/* Point-to-point. Tags >= 0 and < 1<<20. isend / irecv return a request that
 * ex_comm_wait completes and frees; the buffer must stay valid until then.
 * Sends to and receives from one's own rank work. */
int ex_comm_isend(ex_comm *c, const float *buf, size_t n, int peer, int tag, ex_request **req);
int ex_comm_irecv(ex_comm *c, float *buf, size_t n, int peer, int tag, ex_request **req);
int ex_comm_wait(ex_comm *c, ex_request *req);
/* Starts the sends and receives posted on c so far now, where the
 * implementation would otherwise hold them until a wait (NCCL launches what
 * it collected as one group, so a pair that exchanges cannot deadlock): for
 * a communicator whose messages all go one way (a pipeline channel), so the
 * peer need not wait for this rank's next wait. MPI has begun them already. */
int ex_comm_start(ex_comm *c);
int ex_comm_send(ex_comm *c, const float *buf, size_t n, int peer, int tag);
int ex_comm_recv(ex_comm *c, float *buf, size_t n, int peer, int tag);

/* No wait is unbounded: an operation that cannot complete for `seconds`
 * (a rank killed, stopped or hung) fails with a message naming this rank,
 * the operation and the ranks that do not answer; every later call then
 * fails at once and ex_comm_finalize leaves MPI to the launcher. 0: wait
 * forever. Default: $DHP_COMM_TIMEOUT, else 600 s. */
void ex_comm_set_timeout(double seconds);
double ex_comm_timeout(void);

/* Messages to one's own rank go through an internal queue (a blocking send to
 * self is buffered; a receive from self with no matching send fails instead
 * of hanging); sender and receiver must agree on n. Point-to-point bytes
 * count the payload on the sender, self-sends included.
 * Testing hook: the largest element count one MPI call is given (default
 * 1<<30); bigger calls are split in pieces. Set it small to test splitting. */
void ex_comm_set_max_piece(size_t elems);

#endif
