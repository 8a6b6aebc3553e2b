/* costdb-internal: what the files of dhp profile share: the CPU
 * measurements (costdb/profile.c), the CUDA ones (profile_cuda.c), the
 * collectives (profile_coll.c), the fits and the derivation of the
 * cost-model fields (profile_fit.c) and the files written
 * (profile_json.c): the MPI context of the ranks and the host's identity.
 * Not part of the module's face (costdb.h). */
#ifndef DHP_COSTDB_PROFILE_INTERNAL_H
#define DHP_COSTDB_PROFILE_INTERNAL_H

#include "costdb/costdb.h"

#include <mpi.h>

/* Hidden size of the RMSNorm rows a CUDA profile times: Qwen2.5-32B's LLM (models/zoo). */
#define COST_PROF_GPU_RMSNORM_DIM 5120

typedef struct {
    bool mpi;
    MPI_Comm comm;
    int rank, size;
    const cost_profile_opts *o;
} prof_ctx;

/* How the CPU profile measures (costdb/profile.c), which the files it
 * writes state beside the figures (profile_json.c). */
#define GEMM_BATCHES 2        /* timed batches of a GEMM shape per pass */
#define EW_ROW 768            /* rows of RMSNorm and the bias kernels: dhp-100m's hidden size */
#define EW_HEADS 8            /* RoPE rows of 8 heads x 64 */
#define EW_HEAD_DIM 64
#define EW_VOCAB 1024         /* cross-entropy rows */
#define SHARING_TRIALS 8      /* windows per rank count of the compute-sharing benchmark */
#define HANDOFF_WORK_S 100e-6 /* work between the pings of the hand-back benchmark */
#define HANDOFF_TRIALS 3
#define OVERLAP_BYTES (64u << 10)   /* the all-reduce of the overlap benchmark */
#define OVERLAP_TRIALS 7
/* Passes over the GEMM grid and over the element-wise kernels, best of them per shape. */
static inline int gemm_passes(const cost_profile *p) { return p->quick ? 2 : 3; }
static inline int ew_passes(const cost_profile *p) { return p->quick ? 2 : 3; }
/* Score entries one sequence's attention computes (causal: about half). */
double cost_prof_attn_scores(const cost_profile_attn *a);

void cost_prof_barrier(const prof_ctx *c);
/* The slowest rank's value: every rank gets max over ranks of *v. */
void cost_prof_max(const prof_ctx *c, double *v);
/* All ranks fail together: the worst result code wins. */
int cost_prof_agree(const prof_ctx *c, int rc, char *err);
/* Under mpirun (MPI not yet initialised) initialises MPI (*we_init tells
 * the caller to finalise it); fails unless all ranks share this host. */
int cost_prof_init_mpi(prof_ctx *c, bool *we_init, char *err);
/* p->host and p->date (UTC, ISO 8601). */
void cost_prof_host_id(cost_profile *p);
/* Rank 0's host facts for everybody. */
void cost_prof_share_host_facts(const prof_ctx *c, cost_profile *p);
/* Deterministic values in [-0.5, 0.5). */
void cost_prof_fill(float *x, size_t n, unsigned seed);
/* Alpha-beta fit of the measured operations op (-1: all of them) over ranks. */
void cost_prof_fit_points(const cost_profile *p, int op, int ranks, cost_profile_fit *f);
/* Keeps t seconds as GEMM idx's time (m x n x k) if it is the first pass or
 * faster than the passes before: the best of the passes over the grid. */
void cost_prof_keep_gemm(cost_profile *p, int idx, int pass, int m, int n, int k, double t);
/* An attention shape to time; cost_prof_attn_of makes its measurement record. */
typedef struct { int seq, heads, kv_heads, head_dim; bool causal; } cost_prof_attn_shape;
cost_profile_attn cost_prof_attn_of(cost_prof_attn_shape s);
/* One sequence's attention forward FLOPs, 4 head_dim x scores (cost_profile_attn.fwd_flops). */
double cost_prof_attn_fwd_flops(const cost_profile_attn *a);
/* The collectives over c's ranks at every message size of the profile
 * (costdb/profile_coll.c): p->coll's times and their alpha-beta points. */
int cost_prof_measure_collectives(const prof_ctx *c, cost_profile *p, char *err);
/* The cost-model fields (p->gpu) from the measurements, either backend. */
int cost_prof_derive(cost_profile *p, char *err);

#endif
