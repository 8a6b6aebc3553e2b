/* dhp profile: the collectives over the ranks of this host, timed with MPI
 * at message sizes up to MAX_COLL_BYTES, and their alpha-beta points. */
#include "costdb/costdb.h"
#include "costdb/profile_internal.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_COLL_BYTES (16u << 20)

/* ---- collectives ---- */

typedef struct {
    const prof_ctx *c;
    cost_prof_op op;
    int count;           /* floats per rank chunk (all-gather, reduce-scatter, all-to-all) or whole buffer */
    float *send, *recv;
    int mpi_rc;
} coll_arg;

static void run_coll(void *v)
{
    coll_arg *a = v;
    MPI_Comm comm = a->c->comm;
    int rc = MPI_SUCCESS, next = (a->c->rank + 1) % a->c->size, prev = (a->c->rank + a->c->size - 1) % a->c->size;
    switch (a->op) {
    case COST_PROF_ALLREDUCE: rc = MPI_Allreduce(a->send, a->recv, a->count, MPI_FLOAT, MPI_SUM, comm); break;
    case COST_PROF_ALLGATHER: rc = MPI_Allgather(a->send, a->count, MPI_FLOAT, a->recv, a->count, MPI_FLOAT, comm); break;
    case COST_PROF_REDUCESCATTER: rc = MPI_Reduce_scatter_block(a->send, a->recv, a->count, MPI_FLOAT, MPI_SUM, comm); break;
    case COST_PROF_ALLTOALL: rc = MPI_Alltoall(a->send, a->count, MPI_FLOAT, a->recv, a->count, MPI_FLOAT, comm); break;
    case COST_PROF_SENDRECV:
        rc = MPI_Sendrecv(a->send, a->count, MPI_FLOAT, next, 7, a->recv, a->count, MPI_FLOAT, prev, 7, comm, MPI_STATUS_IGNORE);
        break;
    case COST_PROF_MEMCPY: memcpy(a->recv, a->send, (size_t)a->count * sizeof(float)); break;
    case COST_PROF_NOPS: break;
    }
    if (rc != MPI_SUCCESS && a->mpi_rc == MPI_SUCCESS) a->mpi_rc = rc;
}

/* Seconds of one operation on `bytes` of full buffer: calls per trial are
 * set from one timed call (the slowest rank's), so all ranks run the same
 * number; best of 3 trials of the slowest rank's mean. *used gets the bytes
 * actually moved (rounded down to whole floats per rank). */
static int time_coll(const prof_ctx *c, cost_prof_op op, size_t bytes, float *send, float *recv,
                     double target, double *seconds, double *used, char *err)
{
    int n = c->size;
    size_t floats = bytes / sizeof(float);
    bool chunked = op == COST_PROF_ALLGATHER || op == COST_PROF_REDUCESCATTER || op == COST_PROF_ALLTOALL;
    coll_arg a = {c, op, (int)(chunked ? floats / (size_t)n : floats), send, recv, MPI_SUCCESS};
    *used = (double)a.count * (chunked ? n : 1) * sizeof(float);
    run_coll(&a);
    cost_prof_barrier(c);
    double t0 = util_now();
    run_coll(&a);
    double t1 = util_now() - t0;
    cost_prof_max(c, &t1);
    double want = target / 3 / (t1 > 1e-9 ? t1 : 1e-9);
    int reps = want < 1 ? 1 : want > 10000 ? 10000 : (int)want;
    double best = INFINITY;
    for (int trial = 0; trial < 3; trial++) {
        cost_prof_barrier(c);
        t0 = util_now();
        for (int r = 0; r < reps; r++) run_coll(&a);
        double t = (util_now() - t0) / reps;
        cost_prof_max(c, &t);
        if (t < best) best = t;
    }
    if (a.mpi_rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(a.mpi_rc, msg, &len);
        return util_fail(err, UTIL_ERUNTIME, "profile: %s of %zu bytes failed: %s", cost_profile_op_name(op), bytes, msg);
    }
    *seconds = best;
    return UTIL_OK;
}

void cost_prof_fit_points(const cost_profile *p, int op, int ranks, cost_profile_fit *f)
{
    double a[COST_PROFILE_MAX_COLL], x[COST_PROFILE_MAX_COLL], t[COST_PROFILE_MAX_COLL], beta;
    int n = 0;
    for (int i = 0; i < p->n_coll; i++) {
        if (op >= 0 && (int)p->coll[i].op != op) continue;
        cost_profile_op_terms(p->coll[i].op, p->coll[i].bytes, ranks, &a[n], &x[n]);
        t[n++] = p->coll[i].seconds;
    }
    memset(f, 0, sizeof *f);
    f->points = n;
    char ignored[UTIL_ERR_LEN];
    if (n && cost_profile_fit_alpha_beta(a, x, t, n, &f->alpha_s, &beta, &f->rms_rel, ignored) == UTIL_OK) {
        f->busbw = 1.0 / beta;
        f->valid = true;
    }
}

int cost_prof_measure_collectives(const prof_ctx *c, cost_profile *p, char *err)
{
    static const size_t full[] = {4u << 10, 16u << 10, 64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20};
    static const size_t quick[] = {4u << 10, 64u << 10, 1u << 20};
    const size_t *sizes = p->quick ? quick : full;
    int ns = p->quick ? 3 : 7;
    float *send = util_malloc_cat(UTIL_MEM_COMM, MAX_COLL_BYTES), *recv = util_malloc_cat(UTIL_MEM_COMM, MAX_COLL_BYTES);
    int rc = (send && recv) ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for message buffers");
    if ((rc = cost_prof_agree(c, rc, err))) goto out;
    cost_prof_fill(send, MAX_COLL_BYTES / sizeof(float), 8);
    memset(recv, 0, MAX_COLL_BYTES);
    int first = c->mpi && c->size > 1 ? COST_PROF_ALLREDUCE : COST_PROF_MEMCPY;
    int last = c->mpi && c->size > 1 ? COST_PROF_SENDRECV : COST_PROF_MEMCPY;
    p->n_coll = 0;
    for (int op = first; op <= last; op++)
        for (int i = 0; i < ns && p->n_coll < COST_PROFILE_MAX_COLL; i++) {
            cost_profile_coll *r = &p->coll[p->n_coll];
            r->op = (cost_prof_op)op;
            rc = time_coll(c, r->op, sizes[i], send, recv, p->quick ? 0.006 : 0.06, &r->seconds, &r->bytes, err);
            if ((rc = cost_prof_agree(c, rc, err))) goto out;
            p->n_coll++;
        }
    for (int op = 0; op < COST_PROF_NOPS; op++) cost_prof_fit_points(p, op, c->size, &p->fit[op]);
    cost_prof_fit_points(p, -1, c->size, &p->link);
    if (!p->link.valid) rc = util_fail(err, UTIL_ERUNTIME, "profile: the collective timings do not fit t = alpha + bytes/busbw");
out:
    util_free(send);
    util_free(recv);
    return rc;
}
