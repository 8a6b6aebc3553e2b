/* dhp profile: the collectives over the ranks of this host, timed through
 * the executor's communicator (executor/comm.h: MPI for the CPU backend,
 * NCCL for CUDA) on buffers of the backend's memory, as dhp run calls them;
 * with one rank, the backend's device-to-device copy. The alpha-beta fits
 * are costdb's (cost_prof_fit_points). */
#include "profile/profile_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const prof_ctx *c;
    cost_prof_op op;
    size_t count;        /* floats per rank chunk (all-gather, reduce-scatter, all-to-all) or whole buffer */
    float *send, *recv;
    int rc;              /* the first failure */
} coll_arg;

/* Every rank sends count floats to rank + 1 while receiving as many from rank - 1. */
static int ring_exchange(ex_comm *w, const float *send, float *recv, size_t count)
{
    int n = ex_comm_size(w), me = ex_comm_rank(w);
    ex_request *rr = NULL, *sr = NULL;
    int rc = ex_comm_irecv(w, recv, count, (me + n - 1) % n, 7, &rr);
    if (!rc) rc = ex_comm_isend(w, send, count, (me + 1) % n, 7, &sr);
    int rs = sr ? ex_comm_wait(w, sr) : UTIL_OK, rq = rr ? ex_comm_wait(w, rr) : UTIL_OK;
    return rc ? rc : rs ? rs : rq;
}

static void run_coll(void *v)
{
    coll_arg *a = v;
    ex_comm *w = a->c->world;
    int rc = UTIL_OK;
    switch (a->op) {
    case COST_PROF_ALLREDUCE: rc = ex_comm_allreduce_sum(w, a->send, a->count); break;
    case COST_PROF_ALLGATHER: rc = ex_comm_allgather(w, a->send, a->recv, a->count); break;
    case COST_PROF_REDUCESCATTER: rc = ex_comm_reduce_scatter(w, a->send, a->recv, a->count); break;
    case COST_PROF_ALLTOALL: rc = ex_comm_alltoall(w, a->send, a->recv, a->count); break;
    case COST_PROF_SENDRECV: rc = ring_exchange(w, a->send, a->recv, a->count); break;
    case COST_PROF_MEMCPY: a->c->be->d2d(a->recv, a->send, a->count * sizeof(float)); break;
    case COST_PROF_NOPS: break;
    }
    if (rc && !a->rc) a->rc = rc;
}

/* Runs reps calls and waits for the backend: every rank's seconds per call, the slowest rank's. */
static int timed_batch(coll_arg *a, int reps, double *per_call, char *err)
{
    const prof_ctx *c = a->c;
    prof_barrier(c);
    double t0 = util_now();
    for (int r = 0; r < reps && !a->rc; r++) run_coll(a);
    int rc = c->be->sync(err);
    double t = (util_now() - t0) / reps;
    if (!rc && a->rc)
        rc = util_fail(err, UTIL_ERUNTIME, "profile: %s of %zu floats failed: %s", cost_profile_op_name(a->op), a->count,
                       c->world ? ex_comm_error(c->world) : "copy");
    if ((rc = prof_agree(c, rc, err))) return rc;
    prof_max(c, &t);
    *per_call = t;
    return UTIL_OK;
}

/* Seconds of one operation on `bytes` of full buffer: calls per trial are
 * set from one timed call (the slowest rank's), so all ranks run the same
 * number; best of 3 trials of the slowest rank's mean. *used gets the bytes
 * actually moved (rounded down to whole floats per rank). */
static int time_coll(const prof_ctx *c, cost_prof_op op, size_t bytes, float *send, float *recv, double target,
                     double *seconds, double *used, char *err)
{
    int n = c->size;
    size_t floats = bytes / sizeof(float);
    bool chunked = op == COST_PROF_ALLGATHER || op == COST_PROF_REDUCESCATTER || op == COST_PROF_ALLTOALL;
    coll_arg a = {c, op, chunked ? floats / (size_t)n : floats, send, recv, UTIL_OK};
    *used = (double)a.count * (chunked ? n : 1) * sizeof(float);
    double one;
    int rc = timed_batch(&a, 1, &one, err);   /* warm-up: connections, buffers registered */
    if (!rc) rc = timed_batch(&a, 1, &one, err);
    double want = target / 3 / (one > 1e-9 ? one : 1e-9), best = INFINITY;
    int reps = want < 1 ? 1 : want > 10000 ? 10000 : (int)want;
    for (int trial = 0; trial < 3 && !rc; trial++) {
        double t;
        rc = timed_batch(&a, reps, &t, err);
        if (!rc && t < best) best = t;
    }
    *seconds = best;
    return rc;
}

int prof_measure_collectives(const prof_ctx *c, cost_profile *p, char *err)
{
    /* CPU: up to 16 MiB; a GPU's NCCL links reach their bandwidth only at hundreds of MiB. */
    static const size_t cpu_full[] = {4u << 10, 16u << 10, 64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20};
    static const size_t cpu_quick[] = {4u << 10, 64u << 10, 1u << 20};
    static const size_t gpu_full[] = {8u << 10, 64u << 10, 512u << 10, 4u << 20, 32u << 20, 256u << 20};
    static const size_t gpu_quick[] = {8u << 10, 512u << 10, 16u << 20};
    const size_t *sizes = p->cuda ? (p->quick ? gpu_quick : gpu_full) : (p->quick ? cpu_quick : cpu_full);
    int ns = p->cuda ? (p->quick ? 3 : 6) : (p->quick ? 3 : 7);
    double target = p->cuda ? (p->quick ? 0.01 : 0.1) : (p->quick ? 0.006 : 0.06);
    size_t max_floats = sizes[ns - 1] / sizeof(float);
    float *send = prof_alloc_filled(c, max_floats, 8, err), *recv = send ? prof_alloc_filled(c, max_floats, 0, err) : NULL;
    int rc = prof_agree(c, send && recv ? UTIL_OK : UTIL_ENOMEM, err);
    bool many = c->world && c->size > 1;
    int first = many ? COST_PROF_ALLREDUCE : COST_PROF_MEMCPY, last = many ? COST_PROF_SENDRECV : COST_PROF_MEMCPY;
    p->n_coll = 0;
    for (int op = first; op <= last && !rc; op++)
        for (int i = 0; i < ns && p->n_coll < COST_PROFILE_MAX_COLL && !rc; i++) {
            cost_profile_coll *r = &p->coll[p->n_coll];
            r->op = (cost_prof_op)op;
            rc = time_coll(c, r->op, sizes[i], send, recv, target, &r->seconds, &r->bytes, err);
            if (!rc) p->n_coll++;
        }
    if (!rc) {
        for (int op = 0; op < COST_PROF_NOPS; op++) cost_prof_fit_points(p, op, c->size, &p->fit[op]);
        cost_prof_fit_points(p, -1, c->size, &p->link);
        if (!p->link.valid) rc = util_fail(err, UTIL_ERUNTIME, "profile: the collective timings do not fit t = alpha + bytes/busbw");
    }
    prof_release(c, send);
    prof_release(c, recv);
    return rc;
}
