/* dhp profile: the ranks (MPI or a lone process), the communicator the
 * collectives are timed through, the timing rule every kernel figure
 * follows, and the host's identity. */
#include "profile/profile_int.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void prof_barrier(const prof_ctx *c)
{
    if (c->mpi) MPI_Barrier(c->comm);
}

void prof_max(const prof_ctx *c, double *v)
{
    if (c->mpi) MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, c->comm);
}

/* A rank whose own code is fine but another's is not reports a generic line. */
int prof_agree(const prof_ctx *c, int rc, char *err)
{
    if (!c->mpi) return rc;
    int worst = rc;
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, c->comm);
    if (worst && !rc) return util_fail(err, worst, "profile: another rank failed (code %d)", worst);
    return worst;
}

static bool launched_by_mpirun(void)
{
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}

/* Best mean seconds per call over `trials` batches, each ending with the
 * backend's sync. One warm-up call first (caches, page faults, BLAS thread
 * start-up, CUDA module loading). */
static int time_calls(const prof_ctx *c, void (*fn)(void *), void *arg, double target_s, int min_calls, int trials,
                      double *best, char *err)
{
    fn(arg);
    int rc = c->be->sync(err);
    *best = INFINITY;
    double per_trial = target_s / trials;
    for (int t = 0; t < trials && !rc; t++) {
        int calls = 0;
        double t0 = util_now(), dt;
        do { fn(arg); calls++; dt = util_now() - t0; } while (calls < min_calls || dt < per_trial);
        rc = c->be->sync(err);
        dt = util_now() - t0;
        if (dt / calls < *best) *best = dt / calls;
    }
    return rc;
}

/* Kernel figures describe one rank computing alone: rank 0 times fn while
 * the other ranks wait in MPI_Barrier (as the executor's idle ranks wait in
 * MPI_Wait); how ranks slow each other is measured apart (sharing.c). */
int prof_alone_time(const prof_ctx *c, void (*fn)(void *), void *arg, double target_s, int min_calls, int trials,
                    double *seconds, char *err)
{
    prof_barrier(c);
    double t = 0;
    int rc = c->rank == 0 ? time_calls(c, fn, arg, target_s, min_calls, trials, &t, err) : UTIL_OK;
    if ((rc = prof_agree(c, rc, err))) return rc;
    prof_max(c, &t);
    *seconds = t;
    return UTIL_OK;
}

void prof_fill(float *x, size_t n, unsigned seed)
{
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((s >> 8) * (1.0 / 16777216.0) - 0.5);
    }
}

/* Filled on the host in pieces and copied over (the backend's memory may be a device's). */
float *prof_alloc_filled(const prof_ctx *c, size_t n, unsigned seed, char *err)
{
    float *x = c->be->alloc(n * sizeof(float), UTIL_MEM_OTHER);
    if (!x) {
        util_fail(err, UTIL_ENOMEM, "profile: %s: out of memory for %.0f MiB of buffers", c->be->name,
                  (double)n * sizeof(float) / 1048576);
        return NULL;
    }
    if (!seed) return x;   /* alloc zeroes */
    enum { PIECE = 1 << 20 };
    float *h = util_malloc(PIECE * sizeof *h);
    if (!h) { c->be->release(x); util_fail(err, UTIL_ENOMEM, "profile: out of memory"); return NULL; }
    for (size_t at = 0; at < n; at += PIECE) {
        size_t k = n - at < PIECE ? n - at : PIECE;
        prof_fill(h, k, seed + (unsigned)(at / PIECE));
        c->be->h2d(x + at, h, k * sizeof *h);
    }
    util_free(h);
    if (c->be->sync(err)) { c->be->release(x); return NULL; }
    return x;
}

void prof_release(const prof_ctx *c, void *x)
{
    if (x && c->be->release) c->be->release(x);
}

void prof_keep_gemm(cost_profile *p, int idx, int pass, int m, int n, int k, double t)
{
    cost_profile_gemm *r = &p->gemm[idx];
    if (pass > 0 && r->seconds <= t) return;
    *r = (cost_profile_gemm){m, n, k, t, 2.0 * m * n * k / t};
}

void prof_host_id(cost_profile *p)
{
    if (gethostname(p->host, sizeof p->host) != 0 || !p->host[0]) util_strlcpy(p->host, "unknown-host", sizeof p->host);
    p->host[sizeof p->host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (!gmtime_r(&now, &tm) || !strftime(p->date, sizeof p->date, "%Y-%m-%dT%H:%M:%SZ", &tm))
        util_strlcpy(p->date, "unknown-date", sizeof p->date);
}

int prof_init_mpi(prof_ctx *c, ex_comm_kind kind, char *err)
{
    int inited = 0;
    MPI_Initialized(&inited);
    c->world = NULL;
    if (!inited && !launched_by_mpirun()) return UTIL_OK;   /* a lone process: no MPI at all */
    int rc = ex_comm_world(NULL, NULL, kind, &c->world, err);
    if (rc) return rc;
    c->mpi = true;
    c->comm = MPI_COMM_WORLD;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    MPI_Comm local;
    int local_size = 0;
    if (MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_size(local, &local_size);
        MPI_Comm_free(&local);
    }
    if (local_size != c->size)
        return util_fail(err, UTIL_EINVAL, "profile: measures one host; %d of the %d ranks share this one (run all ranks on one node)",
                         local_size, c->size);
    return UTIL_OK;
}

/* Rank 0's host facts for everybody (the date string and memory in use may differ by rank). */
void prof_share_host_facts(const prof_ctx *c, cost_profile *p)
{
    if (!c->mpi) return;
    MPI_Bcast(p->host, sizeof p->host, MPI_CHAR, 0, c->comm);
    MPI_Bcast(p->date, sizeof p->date, MPI_CHAR, 0, c->comm);
    double d[3] = {p->cpu_hz, p->phys_bytes, p->used_bytes};
    MPI_Bcast(d, 3, MPI_DOUBLE, 0, c->comm);
    p->cpu_hz = d[0]; p->phys_bytes = d[1]; p->used_bytes = d[2];
    int b = p->used_from_meminfo;
    MPI_Bcast(&b, 1, MPI_INT, 0, c->comm);
    p->used_from_meminfo = b;
}

void prof_close(prof_ctx *c)
{
    if (c->world) ex_comm_free(c->world);
    c->world = NULL;
    ex_comm_finalize();   /* only if ex_comm_world initialised MPI */
}
