/* dhp profile on a CPU host: how the ranks that share its processors slow
 * each other (compute_speed, compute_sets), how long a shared processor
 * takes to come back to a rank that waited (compute_handoff_s), and how much
 * of a non-blocking all-gather compute hides (overlap). The work is the
 * executor's kernels through the backend table; the pings are the
 * protocol's own MPI messages; the all-gather is the executor's
 * communicator's (ex_comm_iallgather), as dhp's ZeRO strategies issue it. */
#define _GNU_SOURCE   /* sched_getaffinity */
#include "profile/profile_int.h"

#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

/* ---- compute sharing: how ranks on this host slow each other ---- */

/* One unit of executor-like work: a GEMM, an attention forward and a
 * residual add, in the proportions of a small transformer layer, through the
 * backend's kernels on buffers that stay in cache. */
enum { GM = 256, GN = 256, GK = 64, SEQ = 128, H = 4, D = 16, ADD = 1 << 18 };
typedef struct {
    const ex_backend *be;
    float *A, *B, *C, *q, *k, *v, *out, *lse, *add;
    int cu[2];
} mix_arg;

static void run_mix(void *v)
{
    mix_arg *m = v;
    m->be->linear_forward(m->C, m->A, m->B, NULL, GM, GK, GN);
    m->be->attention_forward(m->out, m->lse, m->q, m->k, m->v, m->cu, 1, H, H, D, false);
    m->be->add_inplace(m->add, m->add + ADD, ADD);
}

/* Units per second one of ranks 0..k-1 runs, mean over the k, while they
 * all compute in one common window of wall time and the others wait in
 * MPI_Allreduce (polling, as the executor's idle ranks do in MPI_Wait). A
 * fixed window, not fixed work: no rank finishes early and leaves the others
 * the processors.
 *
 * The window is common to the k: rank 0 sends a start time a little ahead
 * (CLOCK_MONOTONIC, one clock for the ranks of a host, and the set is rank
 * 0's host), the busy ranks sleep until it and become runnable together.
 * Were each window opened when its rank first ran after a barrier, it would
 * skip the slices its set-mates ran first and run on after some of them had
 * stopped: the k windows then cover 40 ms plus k-1 first slices of CPU time,
 * and the speeds came out high by that much (four ranks on one CPU read 0.28
 * each, 1.12 in all). A window whose start some busy rank learnt of too late
 * is run again with more lead. */
static double shared_rate(const prof_ctx *c, const cost_profile *p, mix_arg *m, int k, double window_s)
{
    /* busy: the first k ranks of rank 0's processor set */
    int pos = -1;
    for (int r = 0, seen = 0; r <= c->rank && r < p->ranks && r < COST_MAX_SPEED; r++)
        if (p->set_of[r] == 0) { if (r == c->rank) pos = seen; seen++; }
    bool busy = pos >= 0 && pos < k;
    double lead = 0.005;
    for (int tries = 0;; tries++, lead *= 2) {
        prof_barrier(c);
        double start = util_now() + lead, rate = 0, late = 0;
        if (c->mpi) MPI_Bcast(&start, 1, MPI_DOUBLE, 0, c->comm);
        if (busy) {
            late = util_now() > start;
            util_sleep_until(start);
            long units = 0;
            double dt;
            do { run_mix(m); units++; dt = util_now() - start; } while (dt < window_s);
            rate = units / dt;
        }
        prof_max(c, &late);
        if (late && tries < 4) continue;
        if (c->mpi) MPI_Allreduce(MPI_IN_PLACE, &rate, 1, MPI_DOUBLE, MPI_SUM, c->comm);
        return rate / k;
    }
}


/* Median of x[0..n) (n <= COST_PROF_SHARING_TRIALS), x reordered. */
static double median(double *x, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j - 1] > x[j]; j--) { double t = x[j]; x[j] = x[j - 1]; x[j - 1] = t; }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static int measure_handoff(const prof_ctx *c, cost_profile *p, mix_arg *m);

int prof_measure_sharing(const prof_ctx *c, cost_profile *p, char *err)
{
    size_t nq = (size_t)SEQ * H * D;
    float *buf = util_calloc((size_t)GM * GK + GN * GK + GM * GN + 5 * nq + SEQ * H + 2 * ADD, sizeof *buf);
    int rc = buf ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for the sharing benchmark");
    if ((rc = prof_agree(c, rc, err))) { util_free(buf); return rc; }
    float *q = buf + (size_t)GM * GK + GN * GK + GM * GN, *add = q + 5 * nq + SEQ * H;
    mix_arg m = {c->be, buf, buf + (size_t)GM * GK, buf + (size_t)GM * GK + GN * GK, q, q + nq, q + 2 * nq, q + 3 * nq,
                 q + 4 * nq, add, {0, SEQ}};
    prof_fill(buf, (size_t)GM * GK + GN * GK, 8);
    prof_fill(q, 3 * nq, 9);
    prof_fill(add, 2 * ADD, 10);
    /* Windows of 40 ms, quick too: many scheduler time slices, so the
     * sharing is seen, not one slice's luck. */
    double unit;
    if ((rc = prof_alone_time(c, run_mix, &m, 0.02, 3, 2, &unit, err))) { util_free(buf); return rc; }
    double window = 0.04;
    int n = 0;
    for (int r = 0; r < p->ranks && r < COST_MAX_SPEED; r++) n += p->set_of[r] == 0;
    /* Each trial measures k = 2 .. n in adjacent windows between two windows
     * of k = 1 and keeps the ratios to the mean of those two: adjacent
     * windows see the same state of the host (this VM's speed changes by up
     * to 1.4x every few seconds, which a ratio of rates measured seconds
     * apart would carry), and the one after cancels a drift the one before
     * alone would read as sharing; the median over the trials. */
    double ratio[COST_MAX_SPEED][COST_PROF_SHARING_TRIALS], rate[COST_MAX_SPEED + 1];
    int trials = p->quick ? COST_PROF_SHARING_TRIALS / 2 : COST_PROF_SHARING_TRIALS;
    for (int t = 0; t < trials; t++) {
        for (int k = 1; k <= n; k++) rate[k] = shared_rate(c, p, &m, k, window);
        double alone = 0.5 * (rate[1] + shared_rate(c, p, &m, 1, window));
        for (int k = 2; k <= n; k++) ratio[k - 1][t] = rate[k] / alone;
    }
    p->n_speed = n;
    p->speed[0] = 1.0;
    for (int k = 2; k <= n; k++) p->speed[k - 1] = fmin(1.0, median(ratio[k - 1], trials));
    p->sharing_unit_s = unit;
    rc = measure_handoff(c, p, &m);
    util_free(buf);
    return rc;
}

/* ---- handing a shared processor back ----
 *
 * A rank that waits in MPI polls and yields its processor (the executor's
 * ranks run with mpi_yield_when_idle); a set-mate that computes then keeps
 * it to the end of the scheduler's time slice, which can be milliseconds
 * (on this kind of host, HZ=250 ticks: up to 4 ms). A rank that exchanges
 * every layer (tensor or sequence parallel) loses its processor at nearly
 * every exchange, far more than the even split compute_speed measures.
 * Measured as the executor meets it: rank 0 computes COST_PROF_HANDOFF_WORK_S, then a
 * round trip with a rank bound elsewhere, over and over, while rank 0's
 * set-mate computes without a pause, and again while the mate waits too;
 * the difference of the mean round trips is the time the processor takes to
 * come back (cost_pool.handoff_s). */

enum { HANDOFF_PING = 11, HANDOFF_STOP = 12 };

static void spin_for(double s)
{
    double t0 = util_now();
    while (util_now() - t0 < s) {}
}

/* Rank 0's side: exchanges until the window is all but over; returns the
 * mean round trip (0 if none), *n their count. */
static double handoff_pings(const prof_ctx *c, int partner, double until, long *n)
{
    double buf = 0, sum = 0;
    *n = 0;
    while (util_now() < until) {
        spin_for(COST_PROF_HANDOFF_WORK_S);
        double t = util_now();
        MPI_Send(&buf, 1, MPI_DOUBLE, partner, HANDOFF_PING, c->comm);
        MPI_Recv(&buf, 1, MPI_DOUBLE, partner, HANDOFF_PING, c->comm, MPI_STATUS_IGNORE);
        sum += util_now() - t;
        ++*n;
    }
    MPI_Send(&buf, 1, MPI_DOUBLE, partner, HANDOFF_STOP, c->comm);
    return *n ? sum / *n : 0;
}

static void handoff_echo(const prof_ctx *c)
{
    for (;;) {
        double buf;
        MPI_Status st;
        MPI_Recv(&buf, 1, MPI_DOUBLE, 0, MPI_ANY_TAG, c->comm, &st);
        if (st.MPI_TAG == HANDOFF_STOP) return;
        MPI_Send(&buf, 1, MPI_DOUBLE, 0, HANDOFF_PING, c->comm);
    }
}

/* One window of window_s, its start sent ahead by rank 0 (as shared_rate's):
 * rank 0's mean round trip, every rank gets it; *n the exchanges. */
static double handoff_window(const prof_ctx *c, const cost_profile *p, mix_arg *m, bool mate_busy, double window_s,
                             long *n)
{
    prof_barrier(c);
    double start = util_now() + 0.005, rtt = 0;
    *n = 0;
    MPI_Bcast(&start, 1, MPI_DOUBLE, 0, c->comm);
    if (c->rank == p->handoff_mate && mate_busy) {
        util_sleep_until(start);
        while (util_now() < start + window_s) run_mix(m);
    } else if (c->rank == 0) {
        util_sleep_until(start + 0.1 * window_s);   /* the mate has the processor */
        rtt = handoff_pings(c, p->handoff_partner, start + 0.9 * window_s, n);
    } else if (c->rank == p->handoff_partner) {
        handoff_echo(c);
    }
    double cnt = (double)*n;
    MPI_Bcast(&rtt, 1, MPI_DOUBLE, 0, c->comm);
    MPI_Bcast(&cnt, 1, MPI_DOUBLE, 0, c->comm);
    *n = (long)cnt;
    return rtt;
}

/* Rank 0's set-mate (the next rank bound to its CPU) and a rank bound to
 * another set; false if the host has no such pair. */
static bool handoff_ranks(cost_profile *p)
{
    p->handoff_mate = p->handoff_partner = -1;
    for (int r = 1; r < p->ranks && r < COST_MAX_SPEED; r++) {
        if (p->set_of[r] == 0 && p->handoff_mate < 0) p->handoff_mate = r;
        if (p->set_of[r] != 0 && p->handoff_partner < 0) p->handoff_partner = r;
    }
    return p->mpi && p->n_sets > 1 && p->handoff_mate > 0 && p->handoff_partner > 0;
}

static int measure_handoff(const prof_ctx *c, cost_profile *p, mix_arg *m)
{
    p->handoff_s = p->handoff_busy_rtt_s = p->handoff_idle_rtt_s = 0;
    p->handoff_exchanges = 0;
    if (!handoff_ranks(p)) return UTIL_OK;
    /* Windows of hundreds of time slices; trials adjacent in time, the median. */
    double window = p->quick ? 0.15 : 0.3, busy[COST_PROF_HANDOFF_TRIALS], idle[COST_PROF_HANDOFF_TRIALS];
    int trials = p->quick ? 1 : COST_PROF_HANDOFF_TRIALS;
    long n;
    for (int t = 0; t < trials; t++) {
        busy[t] = handoff_window(c, p, m, true, window, &n);
        p->handoff_exchanges += (int)n;
        idle[t] = handoff_window(c, p, m, false, 0.25 * window, &n);
    }
    p->handoff_busy_rtt_s = median(busy, trials);
    p->handoff_idle_rtt_s = median(idle, trials);
    p->handoff_s = fmax(0.0, p->handoff_busy_rtt_s - p->handoff_idle_rtt_s);
    return UTIL_OK;
}

/* ---- overlap ----
 * How much of a non-blocking collective concurrent compute hides, as dhp's
 * ZeRO strategies issue them (executor/dp_zero3.c prefetches a unit's
 * MPI_Iallgather, the unit's kernels run, MPI_Wait): every rank starts an
 * all-gather of COST_PROF_OVERLAP_BYTES per rank, computes for as long as the
 * all-gather alone takes without any MPI call (as BLAS and the kernels
 * run), then waits. Best of COST_PROF_OVERLAP_TRIALS for the slowest rank of each:
 * the collective alone, the compute alone, both; overlap = (collective +
 * compute - both) / collective, within [0, 1] (cost_pool.overlap). */

/* mode 0: the all-gather alone, 1: the compute alone, 2: both. *rc keeps the first failure. */
static double overlap_trial(const prof_ctx *c, const float *send, float *recv, int count, double compute_s, int mode,
                            int *rc)
{
    prof_barrier(c);
    double t0 = util_now();
    ex_request *req = NULL;
    int r = mode != 1 ? ex_comm_iallgather(c->world, send, recv, (size_t)count, &req) : UTIL_OK;
    if (mode != 0) spin_for(compute_s);
    if (req && ex_comm_wait(c->world, req) && !r) r = UTIL_ERUNTIME;
    double t = util_now() - t0;
    if (r && !*rc) *rc = r;
    prof_max(c, &t);
    return t;
}

int prof_measure_overlap(const prof_ctx *c, cost_profile *p, char *err)
{
    p->has_overlap = false;
    if (!c->mpi || c->size < 2) return UTIL_OK;
    int count = (int)(COST_PROF_OVERLAP_BYTES / sizeof(float));
    float *send = util_calloc_cat(UTIL_MEM_COMM, (size_t)count, sizeof(float));
    float *recv = util_calloc_cat(UTIL_MEM_COMM, (size_t)count * (size_t)c->size, sizeof(float));
    int rc = prof_agree(c, send && recv ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory"), err);
    double best[3] = { INFINITY, INFINITY, INFINITY };   /* collective, compute, both */
    for (int t = 0; !rc && t < COST_PROF_OVERLAP_TRIALS; t++) {
        double coll = overlap_trial(c, send, recv, count, 0, 0, &rc);
        if (coll < best[0]) best[0] = coll;
        for (int mode = 1; mode <= 2; mode++) {
            double v = overlap_trial(c, send, recv, count, best[0], mode, &rc);
            if (v < best[mode]) best[mode] = v;
        }
    }
    if (rc == UTIL_ERUNTIME && c->world) util_fail(err, rc, "profile: overlap all-gather: %s", ex_comm_error(c->world));
    if (!rc) {
        p->overlap_coll_s = best[0];
        p->overlap_compute_s = best[1];
        p->overlap_both_s = best[2];
        double hidden = (best[0] + best[1] - best[2]) / best[0];
        p->overlap = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;
        p->has_overlap = true;
    }
    util_free(send);
    util_free(recv);
    return rc;
}

/* The CPU this process is bound to, -1 when it may run on several. */
static int bound_cpu(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1) return -1;
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &set)) return i;
    return -1;
}

/* Ranks bound to the same CPU (mpirun --bind-to core) share it; unbound
 * ranks share all of the host's. set_of[r] = the lowest rank of r's set. */
void prof_find_sets(const prof_ctx *c, cost_profile *p)
{
    int n = p->ranks < COST_MAX_SPEED ? p->ranks : COST_MAX_SPEED, cpu[COST_MAX_SPEED], mine = bound_cpu();
    if (c->mpi && c->size <= COST_MAX_SPEED) MPI_Allgather(&mine, 1, MPI_INT, cpu, 1, MPI_INT, c->comm);
    else for (int r = 0; r < n; r++) cpu[r] = -1;
    p->n_sets = 0;
    for (int r = 0; r < n; r++) {
        p->set_of[r] = r;
        for (int q = 0; q < r; q++)
            if (cpu[q] == cpu[r]) { p->set_of[r] = q; break; }
        if (p->set_of[r] == r) p->n_sets++;
        p->bound_cpu[r] = cpu[r];
    }
}
