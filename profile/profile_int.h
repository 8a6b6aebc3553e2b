/* profile-internal: what the files of dhp profile share: the ranks'
 * context (profile/host.c), the timing rules, and each part's measurement
 * (cpu.c, sharing.c, cuda.c, coll.c). The fits and the derivation of the
 * cost-model fields are costdb's (costdb/profile_fit.c, profile_json.c). */
#ifndef DHP_PROFILE_INT_H
#define DHP_PROFILE_INT_H

#include "costdb/costdb.h"
#include "executor/backend.h"
#include "executor/comm.h"
#include "profile/profile.h"

#include <mpi.h>

/* The ranks: MPI_COMM_WORLD carries the measuring protocol's host messages
 * (barriers, the slowest rank's time, error agreement); the timed
 * collectives go through `world`, the executor's communicator. */
typedef struct {
    bool mpi;
    MPI_Comm comm;
    int rank, size;
    const prof_opts *o;
    const ex_backend *be;
    ex_comm *world;
} prof_ctx;

void prof_barrier(const prof_ctx *c);
/* The slowest rank's value: every rank gets max over ranks of *v. */
void prof_max(const prof_ctx *c, double *v);
/* All ranks fail together: the worst result code wins. */
int prof_agree(const prof_ctx *c, int rc, char *err);
/* Under mpirun (or with MPI initialised) opens the world communicator of
 * `kind` (MPI for the CPU backend, NCCL for CUDA; it initialises MPI if
 * needed) that the collectives are timed through; a lone process has none.
 * Fails unless all ranks share this host. prof_close undoes it. */
int prof_init_mpi(prof_ctx *c, ex_comm_kind kind, char *err);
void prof_close(prof_ctx *c);
/* p->host and p->date (UTC, ISO 8601). */
void prof_host_id(cost_profile *p);
/* Rank 0's host facts for everybody. */
void prof_share_host_facts(const prof_ctx *c, cost_profile *p);
/* Deterministic values in [-0.5, 0.5). */
void prof_fill(float *x, size_t n, unsigned seed);
/* n floats of backend memory, filled as prof_fill (seed) or zeroed (seed 0); NULL with err. */
float *prof_alloc_filled(const prof_ctx *c, size_t n, unsigned seed, char *err);
void prof_release(const prof_ctx *c, void *x);
/* Best mean seconds per call of fn over `trials` batches on rank 0 while
 * the other ranks wait (every rank gets the figure); a batch runs at least
 * min_calls calls and until target_s / trials has passed, then waits for
 * the backend (be->sync): a CUDA kernel's time is its batch's, launches
 * overlapping. A backend failure in a batch fails it (err). */
int prof_alone_time(const prof_ctx *c, void (*fn)(void *), void *arg, double target_s, int min_calls, int trials,
                    double *seconds, char *err);
/* Keeps t seconds as GEMM idx's time (m x n x k) if it is the first pass or
 * faster than the passes before: the best of the passes over the grid. */
void prof_keep_gemm(cost_profile *p, int idx, int pass, int m, int n, int k, double t);
/* A GEMM grid (every m x n x k of m[] x nk[] x nk[]), timed through the
 * backend's linear_forward (bf16: its linear_forward_bf16 on the values
 * rounded to bf16), best of `passes` passes of `batches` batches
 * per shape; on the CPU backend also the fixed cost of a call
 * (p->launch_s: a 1x1x1 GEMM). */
typedef struct {
    const int *m; int n_m;
    const int *nk; int n_nk;
    double target_s;
    int passes, batches;
    bool bf16;
} prof_gemm_grid;
int prof_measure_gemm(const prof_ctx *c, cost_profile *p, const prof_gemm_grid *grid, char *err);
/* An attention shape to time; prof_attn_of makes its measurement record. */
typedef struct { int seq, heads, kv_heads, head_dim; bool causal; } prof_attn_shape;
/* The attention shapes, timed seqs_per_call(seq) sequences to a call
 * (best of `passes` passes per shape) with the backend's kernels. */
int prof_measure_attention(const prof_ctx *c, cost_profile *p, const prof_attn_shape *shapes, int n, int passes,
                           double target, int (*seqs_per_call)(int seq), char *err);
/* The collectives over c's ranks at every message size of the profile
 * (profile/coll.c), through the executor's communicator on backend memory:
 * p->coll's times and their alpha-beta points. */
int prof_measure_collectives(const prof_ctx *c, cost_profile *p, char *err);
/* CPU only (sharing.c): how ranks sharing cores slow each other, and the
 * overlap of a non-blocking all-gather with compute. */
int prof_measure_sharing(const prof_ctx *c, cost_profile *p, char *err);
int prof_measure_overlap(const prof_ctx *c, cost_profile *p, char *err);
/* The ranks' processor sets from their CPU binding (p->set_of, n_sets, bound_cpu). */
void prof_find_sets(const prof_ctx *c, cost_profile *p);

/* The two kinds of profile (profile/cpu.c, device.c), and a device's facts
 * from its runtime (device_facts.c; fills p->dev, phys_bytes, used_bytes). */
int prof_measure_cpu(const prof_opts *o, cost_profile *p, char *err);
int prof_measure_device(const prof_opts *o, cost_profile *p, char *err);
int prof_device_facts(const prof_ctx *c, cost_profile *p, char *err);

#endif
