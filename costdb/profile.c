/* dhp profile: measure the local CPU backend and describe one rank of it in
 * the dhp.gpu/1 format, and the ranks of this host as a one-node
 * dhp.cluster/1 file. The rules that turn measurements into cost-model
 * fields are in costdb/SCHEMA.md ("Measured files") and in each field's
 * source string. costdb sits below the executor, so the executor's kernels
 * timed here (attention, element-wise) come in through cost_profile_opts
 * from the CLI; the STREAM loops are the profile's own. */
#define _GNU_SOURCE   /* sched_getaffinity */
#include "costdb/costdb.h"
#include "costdb/profile_internal.h"

#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_COLL_BYTES (16u << 20)

/* ---- fitting ---- */

int cost_profile_fit_alpha_beta(const double *a, const double *x, const double *t, int n,
                                double *alpha, double *beta, double *rms_rel, char *err)
{
    double saa = 0, sax = 0, sxx = 0, sat = 0, sxt = 0;
    int used = 0;
    for (int i = 0; i < n; i++) {
        if (!(t[i] > 0) || !(a[i] >= 0) || !(x[i] >= 0) || !isfinite(t[i] + a[i] + x[i])) continue;
        double w = 1.0 / (t[i] * t[i]);
        saa += w * a[i] * a[i];
        sax += w * a[i] * x[i];
        sxx += w * x[i] * x[i];
        sat += w * a[i] * t[i];
        sxt += w * x[i] * t[i];
        used++;
    }
    if (used < 2) return util_fail(err, UTIL_EINVAL, "alpha-beta fit: needs 2 usable points (got %d)", used);
    if (!(sxx > 0)) return util_fail(err, UTIL_EINVAL, "alpha-beta fit: every point moves 0 bytes");
    double det = saa * sxx - sax * sax, al, be;
    if (det > 1e-12 * saa * sxx) {
        al = (sat * sxx - sxt * sax) / det;
        be = (saa * sxt - sax * sat) / det;
    } else if (saa == 0) {
        al = 0;
        be = sxt / sxx;
    } else {
        return util_fail(err, UTIL_EINVAL, "alpha-beta fit: latency steps and bytes are proportional; alpha and beta cannot be told apart");
    }
    if (al < 0) { al = 0; be = sxt / sxx; }
    if (!(be > 0) || !isfinite(be))
        return util_fail(err, UTIL_EINVAL, "alpha-beta fit: the bandwidth term is not positive (%g s/B)", be);
    if (rms_rel) {
        double ss = 0;
        for (int i = 0; i < n; i++) {
            if (!(t[i] > 0) || !(a[i] >= 0) || !(x[i] >= 0) || !isfinite(t[i] + a[i] + x[i])) continue;
            double r = (al * a[i] + be * x[i] - t[i]) / t[i];
            ss += r * r;
        }
        *rms_rel = sqrt(ss / used);
    }
    *alpha = al;
    *beta = be;
    return UTIL_OK;
}

/* Solves the k x k normal equations a x = b (row-major, symmetric, k <= 5)
 * by Gaussian elimination with partial pivoting, rows and columns first scaled
 * to a unit diagonal (the unknowns differ by orders of magnitude); false when
 * it is singular, a pivot lost to rounding (below 1e-10 after scaling) too. */
static bool solve_small(double *a, double *b, int k, double *x)
{
    double d[5];
    if (k > 5) return false;
    for (int i = 0; i < k; i++) {
        if (!(a[i * k + i] > 0)) return false;
        d[i] = sqrt(a[i * k + i]);
    }
    for (int i = 0; i < k; i++) {
        b[i] /= d[i];
        for (int j = 0; j < k; j++) a[i * k + j] /= d[i] * d[j];
    }
    const double tiny = 1e-10;
    for (int c = 0; c < k; c++) {
        int piv = c;
        for (int r = c + 1; r < k; r++) if (fabs(a[r * k + c]) > fabs(a[piv * k + c])) piv = r;
        if (!(fabs(a[piv * k + c]) > tiny)) return false;
        for (int j = 0; j < k; j++) { double t = a[c * k + j]; a[c * k + j] = a[piv * k + j]; a[piv * k + j] = t; }
        double t = b[c]; b[c] = b[piv]; b[piv] = t;
        for (int r = c + 1; r < k; r++) {
            double f = a[r * k + c] / a[c * k + c];
            for (int j = c; j < k; j++) a[r * k + j] -= f * a[c * k + j];
            b[r] -= f * b[c];
        }
    }
    for (int c = k - 1; c >= 0; c--) {
        double s = b[c];
        for (int j = c + 1; j < k; j++) s -= a[c * k + j] * x[j];
        x[c] = s / a[c * k + c];
    }
    for (int c = 0; c < k; c++) x[c] /= d[c];
    return true;
}

/* The attention fit's unknowns: fwd and bwd seconds per score, seconds per
 * FLOP, fwd and bwd seconds per row (query row x head). */
enum { ATT_SCORE, ATT_BWD_SCORE, ATT_FLOP, ATT_ROW, ATT_BWD_ROW, ATT_N };

static double attn_scores(const cost_profile_attn *a)
{
    return (double)a->seq * cost_attention_mean_span(a->seq, a->causal) * a->heads;
}

double cost_prof_attn_fwd_flops(const cost_profile_attn *a) { return 4.0 * a->head_dim * attn_scores(a); }

static void attn_rows(const cost_profile_attn *a, bool bwd, double *row, double *t)
{
    double scores = attn_scores(a), flops = cost_prof_attn_fwd_flops(a), rows = (double)a->seq * a->heads;
    row[ATT_SCORE] = bwd ? 0 : scores;
    row[ATT_BWD_SCORE] = bwd ? scores : 0;
    row[ATT_FLOP] = bwd ? COST_ATTN_BWD_FLOPS * flops : flops;
    row[ATT_ROW] = bwd ? 0 : rows;
    row[ATT_BWD_ROW] = bwd ? rows : 0;
    *t = bwd ? a->bwd_s : a->fwd_s;
}

/* Least squares in relative error over the free unknowns (fixed ones keep x[j]). */
static bool attn_solve(const cost_profile_attn *a, int n, const bool *free_, double *x)
{
    double ata[ATT_N * ATT_N] = {0}, atb[ATT_N] = {0}, y[ATT_N] = {0};
    int idx[ATT_N], k = 0;
    for (int j = 0; j < ATT_N; j++) if (free_[j]) idx[k++] = j;
    if (k == 0) return true;
    for (int i = 0; i < 2 * n; i++) {
        double row[ATT_N], t;
        attn_rows(&a[i / 2], i % 2, row, &t);
        if (!(t > 0)) continue;
        double rhs = 1.0;
        for (int j = 0; j < ATT_N; j++) { row[j] /= t; if (!free_[j]) rhs -= row[j] * x[j]; }
        for (int p = 0; p < k; p++) {
            atb[p] += row[idx[p]] * rhs;
            for (int q = 0; q < k; q++) ata[p * k + q] += row[idx[p]] * row[idx[q]];
        }
    }
    if (!solve_small(ata, atb, k, y)) return false;
    for (int p = 0; p < k; p++) x[idx[p]] = y[p];
    return true;
}

/* Solves with the free unknowns, pinning a negative overhead (at 0) or a
 * FLOP cost above the peak rate (at 1 / peak), noise either way, and refitting the rest. */
static bool attn_fit_pinned(const cost_profile_attn *a, int n, double peak_flops, bool *free_, double *x)
{
    bool ok = attn_solve(a, n, free_, x);
    for (int pass = 0; ok && pass < ATT_N; pass++) {
        bool changed = false;
        if (free_[ATT_FLOP] && x[ATT_FLOP] < 1.0 / peak_flops) { x[ATT_FLOP] = 1.0 / peak_flops; free_[ATT_FLOP] = false; changed = true; }
        for (int j = 0; j < ATT_N; j++)
            if (j != ATT_FLOP && free_[j] && x[j] < 0) { x[j] = 0; free_[j] = false; changed = true; }
        if (!changed) break;
        ok = attn_solve(a, n, free_, x);
    }
    return ok;
}

int cost_profile_fit_attention(const cost_profile_attn *a, int n, double peak_flops, cost_attn_fit *out, char *err)
{
    if (n < 2) return util_fail(err, UTIL_EINVAL, "attention fit: needs 2 shapes (got %d)", n);
    if (!(peak_flops > 0)) return util_fail(err, UTIL_EINVAL, "attention fit: peak_flops must be > 0");
    double x[ATT_N] = {0};
    bool free_[ATT_N] = {true, true, true, true, true};
    bool ok = attn_fit_pinned(a, n, peak_flops, free_, x);
    if (!ok) {   /* shapes of one span cannot tell a row's cost from its keys': without the row terms */
        bool no_rows[ATT_N] = {true, true, true, false, false};
        memset(x, 0, sizeof x);
        ok = attn_fit_pinned(a, n, peak_flops, no_rows, x);
    }
    if (!ok) return util_fail(err, UTIL_EINVAL, "attention fit: the shapes do not separate per-score and per-FLOP cost");
    double ss = 0;
    for (int i = 0; i < 2 * n; i++) {
        double row[ATT_N], t, m = 0;
        attn_rows(&a[i / 2], i % 2, row, &t);
        for (int j = 0; j < ATT_N; j++) m += row[j] * x[j];
        ss += (m - t) * (m - t) / (t * t);
    }
    out->score_s = x[ATT_SCORE];
    out->bwd_score_s = x[ATT_BWD_SCORE];
    out->row_s = x[ATT_ROW];
    out->bwd_row_s = x[ATT_BWD_ROW];
    out->attn_eff = fmin(1.0, 1.0 / (x[ATT_FLOP] * peak_flops));
    out->rms_rel = sqrt(ss / (2 * n));
    return UTIL_OK;
}

static double shape_s(double x, double half) { return x / (x + half); }

/* Sum of squared relative errors of rate_i ~ R f_i(half), with R in closed
 * form: g_i = f_i / rate_i, minimise sum (1 - R g_i)^2 -> R = sum g / sum g^2. */
static double gemm_objective(const double *m, const double *n, const double *k, const double *rate,
                             int count, double half, double *R)
{
    double sg = 0, sgg = 0;
    for (int i = 0; i < count; i++) {
        double g = shape_s(m[i], half) * shape_s(n[i], half) * shape_s(k[i], half) / rate[i];
        sg += g;
        sgg += g * g;
    }
    double r = sg / sgg, ss = 0;
    for (int i = 0; i < count; i++) {
        double g = shape_s(m[i], half) * shape_s(n[i], half) * shape_s(k[i], half) / rate[i];
        ss += (1 - r * g) * (1 - r * g);
    }
    *R = r;
    return ss;
}

int cost_profile_fit_gemm(const double *m, const double *n, const double *k, const double *rate,
                          int count, double *rate_max, double *half, double *rms_rel, char *err)
{
    if (count < 2) return util_fail(err, UTIL_EINVAL, "GEMM fit: needs 2 shapes (got %d)", count);
    for (int i = 0; i < count; i++)
        if (!(m[i] > 0 && n[i] > 0 && k[i] > 0 && rate[i] > 0 && isfinite(rate[i])))
            return util_fail(err, UTIL_EINVAL, "GEMM fit: shape %d has a non-positive size or rate", i);
    /* Scan half = 0 and 10^e, e = -1 .. 5 in steps of 0.05, then refine e by golden section. */
    const double e_lo = -1, e_hi = 5, step = 0.05;
    double R, best = gemm_objective(m, n, k, rate, count, 0, &R), best_e = -INFINITY;
    for (double e = e_lo; e <= e_hi + 1e-9; e += step) {
        double v = gemm_objective(m, n, k, rate, count, pow(10, e), &R);
        if (v < best) { best = v; best_e = e; }
    }
    double h = 0;
    if (isfinite(best_e)) {
        const double gr = 0.6180339887498949;
        double lo = fmax(e_lo, best_e - step), hi = fmin(e_hi, best_e + step);
        double c = hi - gr * (hi - lo), d = lo + gr * (hi - lo);
        double fc = gemm_objective(m, n, k, rate, count, pow(10, c), &R);
        double fd = gemm_objective(m, n, k, rate, count, pow(10, d), &R);
        for (int it = 0; it < 200 && hi - lo > 1e-14; it++) {
            if (fc < fd) { hi = d; d = c; fd = fc; c = hi - gr * (hi - lo); fc = gemm_objective(m, n, k, rate, count, pow(10, c), &R); }
            else { lo = c; c = d; fc = fd; d = lo + gr * (hi - lo); fd = gemm_objective(m, n, k, rate, count, pow(10, d), &R); }
        }
        h = pow(10, 0.5 * (lo + hi));
        if (gemm_objective(m, n, k, rate, count, h, &R) > best) h = pow(10, best_e);
    }
    best = gemm_objective(m, n, k, rate, count, h, &R);
    *rate_max = R;
    *half = h;
    if (rms_rel) *rms_rel = sqrt(best / count);
    return UTIL_OK;
}

void cost_profile_op_terms(cost_prof_op op, double bytes, int n, double *steps, double *xbytes)
{
    double k = n > 1 ? n : 1;
    switch (op) {
    case COST_PROF_ALLREDUCE: *steps = 2 * (k - 1); *xbytes = bytes * 2 * (k - 1) / k; return;
    case COST_PROF_ALLGATHER:
    case COST_PROF_REDUCESCATTER:
    case COST_PROF_ALLTOALL: *steps = k - 1; *xbytes = bytes * (k - 1) / k; return;
    case COST_PROF_SENDRECV:
    case COST_PROF_MEMCPY:
    case COST_PROF_NOPS: break;
    }
    *steps = 1;
    *xbytes = bytes;
}

const char *cost_profile_op_name(cost_prof_op op)
{
    switch (op) {
    case COST_PROF_ALLREDUCE: return "all-reduce";
    case COST_PROF_ALLGATHER: return "all-gather";
    case COST_PROF_REDUCESCATTER: return "reduce-scatter";
    case COST_PROF_ALLTOALL: return "all-to-all";
    case COST_PROF_SENDRECV: return "send-recv";
    case COST_PROF_MEMCPY: return "self-memcpy";
    case COST_PROF_NOPS: break;
    }
    return "unknown";
}

/* ---- measuring context: MPI or a lone process ---- */


void cost_prof_barrier(const prof_ctx *c)
{
    if (c->mpi) MPI_Barrier(c->comm);
}

/* The slowest rank's value: every rank gets max over ranks of *v. */
void cost_prof_max(const prof_ctx *c, double *v)
{
    if (c->mpi) MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, c->comm);
}

/* All ranks fail together: the worst result code wins; a rank whose own
 * code is fine but another's is not reports a generic line. */
int cost_prof_agree(const prof_ctx *c, int rc, char *err)
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

/* Best mean seconds per call of fn over `trials` batches; a batch runs at
 * least min_calls calls and until target_s / trials has passed. One warm-up
 * call first (caches, page faults, BLAS thread start-up). */
static double time_calls(void (*fn)(void *), void *arg, double target_s, int min_calls, int trials)
{
    fn(arg);
    double best = INFINITY, per_trial = target_s / trials;
    for (int t = 0; t < trials; t++) {
        int calls = 0;
        double t0 = util_now(), dt;
        do { fn(arg); calls++; dt = util_now() - t0; } while (calls < min_calls || dt < per_trial);
        if (dt / calls < best) best = dt / calls;
    }
    return best;
}

/* Kernel figures describe one rank computing alone: rank 0 times fn while
 * the other ranks wait in MPI_Barrier (as the executor's idle ranks wait in
 * MPI_Wait); how ranks slow each other is measured apart (measure_sharing). */
static double alone_time(const prof_ctx *c, void (*fn)(void *), void *arg, double target_s, int min_calls, int trials)
{
    cost_prof_barrier(c);
    double t = c->rank == 0 ? time_calls(fn, arg, target_s, min_calls, trials) : 0;
    cost_prof_max(c, &t);
    return t;
}

void cost_prof_fill(float *x, size_t n, unsigned seed)
{
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((s >> 8) * (1.0 / 16777216.0) - 0.5);
    }
}

/* ---- host facts ---- */

/* Nominal clock: cpufreq's maximum if the kernel exposes it, else the
 * largest "cpu MHz" of /proc/cpuinfo; 0 if neither exists. */
static double cpu_clock_hz(void)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
    double khz = 0, mhz = 0;
    if (f) {
        if (fscanf(f, "%lf", &khz) != 1) khz = 0;
        fclose(f);
        if (khz > 0) return khz * 1e3;
    }
    if (!(f = fopen("/proc/cpuinfo", "r"))) return 0;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        double v;
        if (!strncmp(line, "cpu MHz", 7) && sscanf(strchr(line, ':') ? strchr(line, ':') + 1 : "", "%lf", &v) == 1 && v > mhz)
            mhz = v;
    }
    fclose(f);
    return mhz * 1e6;
}

/* Bytes in use now: MemTotal - MemAvailable from /proc/meminfo; without it,
 * this process's peak resident size. */
static double memory_in_use(bool *from_meminfo)
{
    FILE *f = fopen("/proc/meminfo", "r");
    double total = -1, avail = -1;
    if (f) {
        char line[256];
        double v;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemTotal: %lf kB", &v) == 1) total = v * 1024;
            if (sscanf(line, "MemAvailable: %lf kB", &v) == 1) avail = v * 1024;
        }
        fclose(f);
    }
    *from_meminfo = total > 0 && avail >= 0 && avail <= total;
    if (*from_meminfo) return total - avail;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) return (double)ru.ru_maxrss * 1024;
    return 0;
}

void cost_prof_host_id(cost_profile *p)
{
    if (gethostname(p->host, sizeof p->host) != 0 || !p->host[0]) util_strlcpy(p->host, "unknown-host", sizeof p->host);
    p->host[sizeof p->host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (!gmtime_r(&now, &tm) || !strftime(p->date, sizeof p->date, "%Y-%m-%dT%H:%M:%SZ", &tm))
        util_strlcpy(p->date, "unknown-date", sizeof p->date);
}

static void host_facts(cost_profile *p)
{
    cost_prof_host_id(p);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    p->cpus = cpus > 0 ? (int)cpus : 1;
    p->blas_threads = openblas_get_num_threads();
    if (p->blas_threads < 1) p->blas_threads = 1;
    p->cpu_hz = cpu_clock_hz();
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    p->phys_bytes = pages > 0 && psize > 0 ? (double)pages * (double)psize : 0;
    p->used_bytes = memory_in_use(&p->used_from_meminfo);
}

/* ---- GEMM: C[m,n] = A[m,k] B[n,k]^T, the executor's linear forward ---- */

/* The grid's GEMMs find their operands as the executor's do: the input A in
 * cache (the kernel before it has just written it), the weights B and the
 * output C in memory (each call takes the next B, C of an arena far larger
 * than the cache; a step touches every weight and output once per pass). On
 * this VM, against the same GEMMs timed inside dhp run (m = 1024, n, k = 32 ..
 * 128, the tiny-vl blocks' linears without a bias), timed all in cache they
 * read 28-47% short, all from memory 3-20% over, this way -7% .. +5%. */
#define GEMM_ARENA_BYTES (512.0 * 1048576)
#define GEMM_ARENA_QUICK_BYTES (64.0 * 1048576)

typedef struct {
    int m, n, k;
    float *arena;               /* slots of A[m,k] B[n,k] C[m,n], one per call */
    size_t arena_n, slot_n, next;
} gemm_arg;

static gemm_arg gemm_shape(float *arena, size_t arena_n, int m, int n, int k)
{
    size_t slot = ((size_t)m * k + (size_t)n * k + (size_t)m * n + 15) & ~(size_t)15;
    return (gemm_arg){m, n, k, arena, arena_n, slot, 0};
}

static void run_gemm(void *v)
{
    gemm_arg *g = v;
    if (g->next + g->slot_n > g->arena_n) g->next = 0;
    const float *A = g->arena, *B = g->arena + g->next + (size_t)g->m * g->k;
    float *C = g->arena + g->next + (size_t)g->m * g->k + (size_t)g->n * g->k;
    g->next += g->slot_n;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->m, g->n, g->k, 1.0f, A, g->k, B, g->k, 0.0f, C, g->n);
}

void cost_prof_keep_gemm(cost_profile *p, int idx, int pass, int m, int n, int k, double t)
{
    cost_profile_gemm *r = &p->gemm[idx];
    if (pass > 0 && r->seconds <= t) return;
    *r = (cost_profile_gemm){m, n, k, t, 2.0 * m * n * k / t};
}

#define GEMM_BATCHES 2   /* timed batches of a shape per pass */
static int gemm_passes(const cost_profile *p) { return p->quick ? 2 : 3; }

static int measure_gemm(const prof_ctx *c, cost_profile *p, char *err)
{
    static const int m_full[] = {64, 256, 1024, 4096}, nk_full[] = {32, 64, 128, 512, 2048};
    static const int m_quick[] = {64, 256, 1024}, nk_quick[] = {32, 256, 1024};
    const int *ms = p->quick ? m_quick : m_full, *nks = p->quick ? nk_quick : nk_full;
    int nm = p->quick ? 3 : 4, nnk = p->quick ? 3 : 5;
    size_t mmax = (size_t)ms[nm - 1], nkmax = (size_t)nks[nnk - 1];
    size_t largest = gemm_shape(NULL, 0, (int)mmax, (int)nkmax, (int)nkmax).slot_n;
    double bytes = p->quick ? GEMM_ARENA_QUICK_BYTES : GEMM_ARENA_BYTES;
    if (p->phys_bytes > 0 && bytes > p->phys_bytes / 16) bytes = p->phys_bytes / 16;   /* a small host */
    size_t arena_n = (size_t)(bytes / sizeof(float));
    if (arena_n < 2 * largest) arena_n = 2 * largest;
    if (c->rank != 0) arena_n = 16;   /* only rank 0 times; the others wait */
    float *arena = util_malloc(arena_n * sizeof *arena);
    int rc = arena ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for the GEMM arena (%.0f MiB)",
                                         (double)arena_n * sizeof *arena / 1048576);
    if ((rc = cost_prof_agree(c, rc, err))) goto out;
    cost_prof_fill(arena, arena_n, 1);
    p->gemm_arena_bytes = (double)arena_n * sizeof *arena;
    gemm_arg one = gemm_shape(arena, 16, 1, 1, 1);   /* one slot, the same every call: in cache */
    p->launch_s = alone_time(c, run_gemm, &one, p->quick ? 0.005 : 0.05, 1000, 3);
    /* Passes over the whole grid, best per shape: a burst of load from other
     * processes spoils one pass of a shape, rarely all of them. */
    double target = p->quick ? 0.003 : 0.015;
    p->n_gemm = 0;
    for (int pass = 0; pass < gemm_passes(p); pass++) {
        int idx = 0;
        for (int i = 0; i < nm; i++)
            for (int j = 0; j < nnk; j++)
                for (int l = 0; l < nnk && idx < COST_PROFILE_MAX_GEMM; l++, idx++) {
                    gemm_arg g = gemm_shape(arena, arena_n, ms[i], nks[j], nks[l]);
                    cost_prof_keep_gemm(p, idx, pass, g.m, g.n, g.k, alone_time(c, run_gemm, &g, target, 1, GEMM_BATCHES));
                }
        p->n_gemm = idx;
    }
out:
    util_free(arena);
    return rc;
}

/* ---- attention: the backend's kernels (cost_profile_opts), causal or not ---- */

/* Each timed call holds enough sequences of a shape for ATTN_CALL_ROWS rows,
 * as the executor's calls hold a micro-batch's: one short sequence alone falls
 * below the kernels' threading threshold and spreads the call's fixed cost
 * over few rows, neither as the executor's calls run (on 2 threads the 9-shape fit
 * was 6.6% rms with one sequence per call, 2.4% with these). */
#define ATTN_CALL_ROWS 1024
#define ATTN_MAX_SEQS 16

cost_profile_attn cost_prof_attn_of(cost_prof_attn_shape s)
{
    return (cost_profile_attn){.seq = s.seq, .heads = s.heads, .kv_heads = s.kv_heads, .head_dim = s.head_dim,
                               .causal = s.causal, .seqs = 1};
}

static int attn_call_seqs(int seq)
{
    int n = (ATTN_CALL_ROWS + seq - 1) / seq;
    return n < 1 ? 1 : n > ATTN_MAX_SEQS ? ATTN_MAX_SEQS : n;
}

typedef struct {
    const cost_profile_opts *o;
    int n, H, Hkv, hd;
    const float *q, *k, *v, *dout;
    float *out, *lse, *dq, *dk, *dv;
    int cu[ATTN_MAX_SEQS + 1], nseq;
    bool causal;
} attn_arg;

static void attn_forward(void *arg)
{
    attn_arg *a = arg;
    a->o->attention_forward(a->out, a->lse, a->q, a->k, a->v, a->cu, a->nseq, a->H, a->Hkv, a->hd, a->causal);
}

static void attn_backward(void *arg)
{
    attn_arg *a = arg;
    a->o->attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out, a->lse, a->cu, a->nseq,
                             a->H, a->Hkv, a->hd, a->causal);
}

/* Buffers: q, k, v, dout, out, dq, dk, dv, lse, one after another. */
static int measure_one_attention(const prof_ctx *c, cost_profile_attn *r, double target, char *err)
{
    int ns = r->seqs = attn_call_seqs(r->seq);
    size_t nq = (size_t)ns * r->seq * r->heads * r->head_dim, nkv = (size_t)ns * r->seq * r->kv_heads * r->head_dim;
    float *buf = util_calloc(4 * nq + 4 * nkv + (size_t)ns * r->seq * r->heads, sizeof *buf);
    int rc = buf ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for attention buffers");
    if ((rc = cost_prof_agree(c, rc, err))) { util_free(buf); return rc; }
    attn_arg a = {c->o, r->seq, r->heads, r->kv_heads, r->head_dim, buf, buf + nq, buf + nq + nkv,
                  buf + nq + 2 * nkv, buf + 2 * nq + 2 * nkv, buf + 4 * nq + 4 * nkv,
                  buf + 3 * nq + 2 * nkv, buf + 4 * nq + 2 * nkv, buf + 4 * nq + 3 * nkv, {0}, ns, r->causal};
    for (int i = 0; i <= ns; i++) a.cu[i] = i * r->seq;
    cost_prof_fill(buf, 2 * nq + 2 * nkv, 3);     /* q, k, v, dout */
    r->fwd_s = alone_time(c, attn_forward, &a, target, 1, 2);
    r->bwd_s = alone_time(c, attn_backward, &a, target * COST_ATTN_BWD_FLOPS, 1, 2);
    r->fwd_s /= ns;
    r->bwd_s /= ns;
    r->fwd_flops = cost_prof_attn_fwd_flops(r);
    util_free(buf);
    return UTIL_OK;
}

/* Head shapes of the tiny-vl ViT (d=8) and LLM (d=16) and the dhp-100m LLM
 * and ViT (d=64, models/zoo), at short and long sequences, so the fit can
 * tell the per-score cost from the per-FLOP cost; the LLMs' shapes causal
 * too, as their layers run (a causal row's fixed costs spread over half the
 * keys). */
static int measure_attention(const prof_ctx *c, cost_profile *p, char *err)
{
    static const cost_prof_attn_shape full[] = {
        {64, 4, 4, 8, false},   {256, 4, 4, 8, false},  {64, 4, 2, 16, false},
        {256, 4, 2, 16, false}, {512, 12, 4, 64, false}, {512, 6, 6, 64, false},
        {64, 4, 2, 16, true},   {256, 4, 2, 16, true},  {512, 12, 4, 64, true}};
    static const cost_prof_attn_shape quick[] = {{64, 4, 4, 8, false}, {128, 4, 2, 16, false},
                                                 {128, 12, 4, 64, false}, {128, 4, 2, 16, true}};
    const cost_prof_attn_shape *shapes = p->quick ? quick : full;
    p->n_attn = p->quick ? 4 : 9;
    /* Passes over all shapes, best per shape (as for the GEMM grid). */
    int passes = p->quick ? 2 : 6;
    for (int pass = 0; pass < passes; pass++)
        for (int i = 0; i < p->n_attn; i++) {
            cost_profile_attn r = cost_prof_attn_of(shapes[i]);
            int rc = measure_one_attention(c, &r, p->quick ? 0.005 : 0.04, err);
            if (rc) return rc;
            if (pass == 0) p->attn[i] = r;
            p->attn[i].fwd_s = fmin(p->attn[i].fwd_s, r.fwd_s);
            p->attn[i].bwd_s = fmin(p->attn[i].bwd_s, r.bwd_s);
        }
    return UTIL_OK;
}

/* ---- memory: the STREAM kernels ---- */

typedef struct { float *a, *b, *c; size_t n; const cost_profile_opts *o; } stream_arg;

static void k_copy(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->c[i] = s->a[i]; }
static void k_scale(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->b[i] = 3.0f * s->c[i]; }
static void k_add(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->c[i] = s->a[i] + s->b[i]; }
static void k_triad(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->a[i] = s->b[i] + 3.0f * s->c[i]; }
/* The backend's y += x (the residual add): 12 B per element */
static void k_add_inplace(void *v) { stream_arg *s = v; s->o->add_inplace(s->c, s->b, s->n); }

static double stream_time(const prof_ctx *c, void (*fn)(void *), stream_arg *s, int trials)
{
    return alone_time(c, fn, s, 0, 1, trials);
}

/* Floats per STREAM array: at least 4x the last-level cache (STREAM's own
 * rule; 32 MiB here), 128 MiB, or 32 MiB when quick. */
static size_t stream_floats(const cost_profile *p) { return p->quick ? (8u << 20) : (32u << 20); }

static int measure_memory(const prof_ctx *c, cost_profile *p, char *err)
{
    size_t n = stream_floats(p);
    stream_arg s = {util_malloc(n * sizeof(float)), util_malloc(n * sizeof(float)), util_malloc(n * sizeof(float)), n, c->o};
    int rc = (s.a && s.b && s.c) ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for STREAM arrays");
    if (!(rc = cost_prof_agree(c, rc, err))) {
        cost_prof_fill(s.a, n, 4); cost_prof_fill(s.b, n, 5); cost_prof_fill(s.c, n, 6);
        int trials = p->quick ? 3 : 6;
        double b = (double)n * sizeof(float);
        p->stream_bytes = b;
        p->copy_bw = 2 * b / stream_time(c, k_copy, &s, trials);
        p->scale_bw = 2 * b / stream_time(c, k_scale, &s, trials);
        p->add_bw = 3 * b / stream_time(c, k_add, &s, trials);
        p->triad_bw = 3 * b / stream_time(c, k_triad, &s, trials);
    }
    util_free(s.a); util_free(s.b); util_free(s.c);
    return rc;
}

/* ---- element-wise kernels one by one, at two sizes (cost_ew_table) ---- */

#define EW_ROW 768            /* rows of RMSNorm and the bias kernels: dhp-100m's hidden size */
#define EW_HEADS 8            /* RoPE rows of 8 heads x 64 */
#define EW_HEAD_DIM 64
#define EW_VOCAB 1024         /* cross-entropy rows */
#define EW_SMALL 24576        /* 96 KiB per array: a kernel's arrays stay in a core's L2 */
#define EW_UNIT (3 * 1024)    /* sizes are multiples of every row length above */

/* Passes over the kernels, best per kernel and size. */
static int ew_passes(const cost_profile *p) { return p->quick ? 2 : 3; }

/* mem_eff's inputs, from the table's large size: the residual add, SwiGLU
 * and RMSNorm, and the three together (total bytes / total time). */
static void derive_ew_rates(cost_profile *p)
{
    const cost_ew_table *T = &p->ew;
    p->ew_add_bw = T->bw[COST_EW_ADD][1];
    p->ew_swiglu_bw = T->bw[COST_EW_SWIGLU][1];
    p->ew_rmsnorm_bw = T->bw[COST_EW_RMSNORM][1];
    double ba = cost_ew_accesses(COST_EW_ADD), bs = cost_ew_accesses(COST_EW_SWIGLU), br = cost_ew_accesses(COST_EW_RMSNORM);
    p->ew_bw = (ba + bs + br) / (ba / p->ew_add_bw + bs / p->ew_swiglu_bw + br / p->ew_rmsnorm_bw);
}

typedef struct {
    const cost_profile_opts *o;
    cost_ew k;
    size_t n;
    float *x[5], *w, *db, *rstd, *st, *cs, *sn, *mean, *db2;
    int32_t *targets;
    double sum;           /* sumsq's result, kept */
} ew_arg;

/* One call of kernel a->k over a->n elements, on the arrays the executor would pass. */
static void run_ew(void *v)
{
    ew_arg *a = v;
    const cost_profile_opts *o = a->o;
    float *const *x = a->x;
    int rows = (int)(a->n / EW_ROW), rope_rows = (int)(a->n / (EW_HEADS * EW_HEAD_DIM)), ce_rows = (int)(a->n / EW_VOCAB);
    switch (a->k) {
    case COST_EW_ZERO: o->zero(x[4], a->n); break;
    case COST_EW_COPY: o->copy(x[1], x[0], a->n); break;
    case COST_EW_ADD: o->add_inplace(x[1], x[0], a->n); break;
    case COST_EW_BIAS: o->add_bias(x[1], a->w, rows, EW_ROW); break;
    case COST_EW_BIAS_GRAD: o->linear_backward(NULL, NULL, a->db, x[0], NULL, NULL, rows, 1, EW_ROW); break;
    case COST_EW_RMSNORM: o->rmsnorm_forward(x[1], a->rstd, x[0], a->w, rows, EW_ROW, 1e-6f); break;
    case COST_EW_RMSNORM_BWD: o->rmsnorm_backward(x[2], a->db, x[1], x[0], a->w, a->rstd, rows, EW_ROW); break;
    case COST_EW_ROPE: o->rope_forward(x[0], a->cs, a->sn, rope_rows, EW_HEADS, EW_HEAD_DIM); break;
    case COST_EW_ROPE_BWD: o->rope_backward(x[0], a->cs, a->sn, rope_rows, EW_HEADS, EW_HEAD_DIM); break;
    case COST_EW_SWIGLU: o->swiglu_forward(x[2], x[0], x[1], a->n); break;
    case COST_EW_SWIGLU_BWD: o->swiglu_backward(x[3], x[4], x[2], x[0], x[1], a->n); break;
    case COST_EW_GELU: o->gelu_forward(x[1], x[0], a->n); break;
    case COST_EW_GELU_BWD: o->gelu_backward(x[2], x[1], x[0], a->n); break;
    case COST_EW_CE:
        o->ce_row_max(a->rstd, x[0], ce_rows, EW_VOCAB);
        o->ce_exp_sum(x[1], a->st, x[0], a->rstd, a->targets, ce_rows, EW_VOCAB, 0);
        o->ce_grad(x[1], a->st, a->targets, ce_rows, EW_VOCAB, 0, 1.0f);
        break;
    case COST_EW_SUMSQ: a->sum += o->sumsq(x[0], a->n); break;
    case COST_EW_LAYERNORM: o->layernorm_forward(x[1], a->mean, a->rstd, x[0], a->w, a->w, rows, EW_ROW, 1e-5f); break;
    case COST_EW_LAYERNORM_BWD:
        o->layernorm_backward(x[2], a->db, a->db2, x[1], x[0], a->w, a->mean, a->rstd, rows, EW_ROW);
        break;
    case COST_EW_ATTN_MERGE:   /* rows of 8 heads x 64: part x[0] and its lse x[3] into out x[1], lse x[2] */
        o->attention_merge(x[1], x[2], x[0], x[3], 1, rope_rows, 0, rope_rows, EW_HEADS, EW_HEAD_DIM);
        break;
    case COST_N_EW: break;
    }
}

static bool ew_kernels_given(const cost_profile_opts *o)
{
    return o->zero && o->copy && o->add_inplace && o->add_bias && o->linear_backward && o->rmsnorm_forward
        && o->rmsnorm_backward && o->rope_forward && o->rope_backward && o->swiglu_forward && o->swiglu_backward
        && o->gelu_forward && o->gelu_backward && o->ce_row_max && o->ce_exp_sum && o->ce_grad && o->sumsq
        && o->layernorm_forward && o->layernorm_backward && o->attention_merge;
}

/* Every kernel at EW_SMALL elements (cache-resident) and at the STREAM
 * arrays' size (memory), best of a few passes: a pass in one of the host's
 * slow moments spoils that pass only. */
static int measure_elementwise(const prof_ctx *c, cost_profile *p, char *err)
{
    size_t big = stream_floats(p) / EW_UNIT * EW_UNIT;
    ew_arg a = {.o = c->o, .w = util_malloc(EW_ROW * sizeof(float)), .db = util_malloc(EW_ROW * sizeof(float)),
                .rstd = util_malloc((big / EW_ROW + 1) * sizeof(float)), .st = util_malloc((2 * big / EW_VOCAB + 2) * sizeof(float)),
                .cs = util_malloc(big / EW_HEADS / 2 * sizeof(float)), .sn = util_malloc(big / EW_HEADS / 2 * sizeof(float)),
                .targets = util_malloc((big / EW_VOCAB + 1) * sizeof(int32_t)),
                .mean = util_malloc((big / EW_ROW + 1) * sizeof(float)), .db2 = util_malloc(EW_ROW * sizeof(float))};
    bool ok = a.w && a.db && a.rstd && a.st && a.cs && a.sn && a.targets && a.mean && a.db2;
    for (int i = 0; i < 5; i++) ok = (a.x[i] = util_malloc(big * sizeof(float))) && ok;
    int rc = ok ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for the element-wise arrays");
    if (!(rc = cost_prof_agree(c, rc, err))) {
        for (int i = 0; i < 5; i++) cost_prof_fill(a.x[i], big, 11 + (unsigned)i);
        cost_prof_fill(a.w, EW_ROW, 16);
        /* A rotation, so that RoPE called again and again keeps its values' size (no denormals). */
        for (size_t i = 0; i < big / EW_HEADS / 2; i++) {
            a.cs[i] = (float)cos(0.001 * (double)i);
            a.sn[i] = (float)sin(0.001 * (double)i);
        }
        cost_prof_fill(a.rstd, big / EW_ROW + 1, 17);
        cost_prof_fill(a.mean, big / EW_ROW + 1, 18);
        memset(a.db, 0, EW_ROW * sizeof(float));
        memset(a.db2, 0, EW_ROW * sizeof(float));
        for (size_t r = 0; r <= big / EW_VOCAB; r++) a.targets[r] = (int32_t)(r * 7919 % EW_VOCAB);
        cost_ew_table *T = &p->ew;
        memset(T, 0, sizeof *T);
        T->n = 2;
        T->elements[0] = EW_SMALL;
        T->elements[1] = (double)big;
        for (int pass = 0; pass < ew_passes(p); pass++)
            for (int k = 0; k < COST_N_EW; k++)
                for (int s = 0; s < 2; s++) {
                    a.k = (cost_ew)k;
                    a.n = s ? big : EW_SMALL;
                    /* In-place kernels start from the same values each call; the accumulating ones drift slowly. */
                    double t = s ? alone_time(c, run_ew, &a, 0, 1, 2) : alone_time(c, run_ew, &a, p->quick ? 0.002 : 0.006, 3, 2);
                    double bw = (double)a.n * cost_ew_accesses(a.k) * sizeof(float) / t;
                    if (bw > T->bw[k][s]) T->bw[k][s] = bw;
                }
        derive_ew_rates(p);
    }
    for (int i = 0; i < 5; i++) util_free(a.x[i]);
    util_free(a.w); util_free(a.db); util_free(a.rstd); util_free(a.st); util_free(a.cs); util_free(a.sn); util_free(a.targets);
    util_free(a.mean); util_free(a.db2);
    return rc;
}

/* ---- compute sharing: how ranks on this host slow each other ---- */

/* One unit of executor-like work: a GEMM, an attention forward and a
 * residual add, in the proportions of a small transformer layer. */
typedef struct {
    gemm_arg g;
    attn_arg a;
    stream_arg s;
} mix_arg;

static void run_mix(void *v)
{
    mix_arg *m = v;
    run_gemm(&m->g);
    attn_forward(&m->a);
    k_add_inplace(&m->s);
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
        cost_prof_barrier(c);
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
        cost_prof_max(c, &late);
        if (late && tries < 4) continue;
        if (c->mpi) MPI_Allreduce(MPI_IN_PLACE, &rate, 1, MPI_DOUBLE, MPI_SUM, c->comm);
        return rate / k;
    }
}

#define SHARING_TRIALS 8

/* Median of x[0..n) (n <= SHARING_TRIALS), x reordered. */
static double median(double *x, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j - 1] > x[j]; j--) { double t = x[j]; x[j] = x[j - 1]; x[j - 1] = t; }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static int measure_handoff(const prof_ctx *c, cost_profile *p, mix_arg *m);

static int measure_sharing(const prof_ctx *c, cost_profile *p, char *err)
{
    enum { GM = 256, GN = 256, GK = 64, SEQ = 128, H = 4, D = 16, ADD = 1 << 18 };
    size_t nq = (size_t)SEQ * H * D;
    float *buf = util_calloc((size_t)GM * GK + GN * GK + GM * GN + 5 * nq + SEQ * H + 2 * ADD, sizeof *buf);
    int rc = buf ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for the sharing benchmark");
    if ((rc = cost_prof_agree(c, rc, err))) { util_free(buf); return rc; }
    float *q = buf + (size_t)GM * GK + GN * GK + GM * GN, *add = q + 5 * nq + SEQ * H;
    mix_arg m = {gemm_shape(buf, (size_t)GM * GK + GN * GK + GM * GN, GM, GN, GK),   /* one slot: in cache */
                 {c->o, SEQ, H, H, D, q, q + nq, q + 2 * nq, q + 3 * nq, q + 4 * nq, q + 5 * nq,
                  NULL, NULL, NULL, {0, SEQ}, 1, false},
                 {add, add + ADD, add, ADD, c->o}};
    cost_prof_fill(buf, (size_t)GM * GK + GN * GK, 8);
    cost_prof_fill(q, 4 * nq, 9);
    cost_prof_fill(add, 2 * ADD, 10);
    /* Windows of 40 ms, quick too: many scheduler time slices, so the
     * sharing is seen, not one slice's luck. */
    double unit = alone_time(c, run_mix, &m, 0.02, 3, 2);
    double window = 0.04;
    int n = 0;
    for (int r = 0; r < p->ranks && r < COST_MAX_SPEED; r++) n += p->set_of[r] == 0;
    /* Each trial measures k = 2 .. n in adjacent windows between two windows
     * of k = 1 and keeps the ratios to the mean of those two: adjacent
     * windows see the same state of the host (this VM's speed changes by up
     * to 1.4x every few seconds, which a ratio of rates measured seconds
     * apart would carry), and the one after cancels a drift the one before
     * alone would read as sharing; the median over the trials. */
    double ratio[COST_MAX_SPEED][SHARING_TRIALS], rate[COST_MAX_SPEED + 1];
    int trials = p->quick ? SHARING_TRIALS / 2 : SHARING_TRIALS;
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
 * Measured as the executor meets it: rank 0 computes HANDOFF_WORK_S, then a
 * round trip with a rank bound elsewhere, over and over, while rank 0's
 * set-mate computes without a pause, and again while the mate waits too;
 * the difference of the mean round trips is the time the processor takes to
 * come back (cost_pool.handoff_s). */
#define HANDOFF_WORK_S 100e-6
#define HANDOFF_TRIALS 3

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
        spin_for(HANDOFF_WORK_S);
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
    cost_prof_barrier(c);
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
    double window = p->quick ? 0.15 : 0.3, busy[HANDOFF_TRIALS], idle[HANDOFF_TRIALS];
    int trials = p->quick ? 1 : HANDOFF_TRIALS;
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
 * all-gather of OVERLAP_BYTES per rank, computes for as long as the
 * all-gather alone takes without any MPI call (as BLAS and the kernels
 * run), then waits. Best of OVERLAP_TRIALS for the slowest rank of each:
 * the collective alone, the compute alone, both; overlap = (collective +
 * compute - both) / collective, within [0, 1] (cost_pool.overlap). */
#define OVERLAP_BYTES (64u << 10)
#define OVERLAP_TRIALS 7

static double overlap_trial(const prof_ctx *c, const float *send, float *recv, int count, double compute_s, int mode)
{
    cost_prof_barrier(c);
    double t0 = util_now();
    MPI_Request req = MPI_REQUEST_NULL;
    if (mode != 1) MPI_Iallgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, c->comm, &req);
    if (mode != 0) spin_for(compute_s);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    double t = util_now() - t0;
    cost_prof_max(c, &t);
    return t;
}

static int measure_overlap(const prof_ctx *c, cost_profile *p, char *err)
{
    p->has_overlap = false;
    if (!c->mpi || c->size < 2) return UTIL_OK;
    int count = (int)(OVERLAP_BYTES / sizeof(float));
    float *send = util_calloc_cat(UTIL_MEM_COMM, (size_t)count, sizeof(float));
    float *recv = util_calloc_cat(UTIL_MEM_COMM, (size_t)count * (size_t)c->size, sizeof(float));
    int rc = cost_prof_agree(c, send && recv ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory"), err);
    double best[3] = { INFINITY, INFINITY, INFINITY };   /* collective, compute, both */
    for (int t = 0; !rc && t < OVERLAP_TRIALS; t++) {
        double coll = overlap_trial(c, send, recv, count, 0, 0);
        if (coll < best[0]) best[0] = coll;
        for (int mode = 1; mode <= 2; mode++) {
            double v = overlap_trial(c, send, recv, count, best[0], mode);
            if (v < best[mode]) best[mode] = v;
        }
    }
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

static int measure_collectives(const prof_ctx *c, cost_profile *p, char *err)
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

/* ---- from measurements to the cost model's fields ---- */

/* Position of v in a[0..*n), appended if new (the grid's axes in measuring order). */
static int axis_index(double *a, int *n, double v)
{
    for (int i = 0; i < *n; i++)
        if (a[i] == v) return i;
    if (*n >= COST_GEMM_GRID) return -1;
    a[*n] = v;
    return (*n)++;
}

/* The measured GEMM grid: rate[i] (launch cost removed, as the fit saw it) /
 * peak at each measured shape; none unless the shapes form a full grid with
 * ascending axes (how measure_gemm runs them). */
static void measured_grid(const cost_profile *p, const double *rate, cost_gemm_grid *G)
{
    memset(G, 0, sizeof *G);
    int nm = 0, nn = 0, nk = 0;
    for (int i = 0; i < p->n_gemm; i++)
        if (axis_index(G->m, &nm, p->gemm[i].m) < 0 || axis_index(G->n, &nn, p->gemm[i].n) < 0
            || axis_index(G->k, &nk, p->gemm[i].k) < 0) { memset(G, 0, sizeof *G); return; }
    bool ascending = nm >= 2 && nn >= 2 && nk >= 2 && nm * nn * nk == p->n_gemm;
    for (int i = 1; ascending && i < nm; i++) ascending = G->m[i] > G->m[i - 1];
    for (int i = 1; ascending && i < nn; i++) ascending = G->n[i] > G->n[i - 1];
    for (int i = 1; ascending && i < nk; i++) ascending = G->k[i] > G->k[i - 1];
    if (!ascending) { memset(G, 0, sizeof *G); return; }
    G->n_m = nm; G->n_n = nn; G->n_k = nk;
    for (int i = 0; i < p->n_gemm; i++) {
        const cost_profile_gemm *g = &p->gemm[i];
        int a = axis_index(G->m, &nm, g->m), b = axis_index(G->n, &nn, g->n), c = axis_index(G->k, &nk, g->k);
        G->eff[(a * G->n_n + b) * G->n_k + c] = fmin(1.0, rate[i] / p->gpu.peak_flops);
    }
}

int cost_prof_derive(cost_profile *p, char *err)
{
    double m[COST_PROFILE_MAX_GEMM], n[COST_PROFILE_MAX_GEMM], k[COST_PROFILE_MAX_GEMM], y[COST_PROFILE_MAX_GEMM];
    for (int i = 0; i < p->n_gemm; i++) {
        const cost_profile_gemm *g = &p->gemm[i];
        double t = g->seconds - p->launch_s;   /* the model adds kernel_launch_s itself */
        m[i] = g->m; n[i] = g->n; k[i] = g->k;
        y[i] = 2.0 * g->m * g->n * g->k / (t > 0.5 * g->seconds ? t : g->seconds);
    }
    cost_gpu *gpu = &p->gpu;
    memset(gpu, 0, sizeof *gpu);
    int rc = cost_profile_fit_gemm(m, n, k, y, p->n_gemm, &p->gemm_rate_max, &gpu->gemm_half, &p->gemm_fit_rms, err);
    if (rc) return rc;
    /* Peak = FLOP/cycle x clock x units (a CPU rank's cores, a GPU's SMs),
     * FLOP/cycle per unit being that of the fitted large-shape rate or of the
     * best measured shape, whichever is higher, rounded up to a power of two. */
    double hz = p->cuda ? p->dev.clock_hz : p->cpu_hz, best = p->gemm_rate_max;
    for (int i = 0; i < p->n_gemm; i++) best = fmax(best, y[i]);
    double units = p->cuda ? p->dev.sms : fmin((double)p->blas_threads, (double)p->cpus);
    p->core_share = units;
    if (hz > 0 && units > 0) {
        double fpc = best / (hz * units);
        p->flops_per_cycle = pow(2, ceil(log2(fpc)));
        gpu->peak_flops = p->flops_per_cycle * hz * units;
    } else {
        p->flops_per_cycle = 0;
        gpu->peak_flops = best;
    }
    gpu->gemm_eff_max = fmin(1.0, p->gemm_rate_max / gpu->peak_flops);
    cost_attn_fit af;
    if ((rc = cost_profile_fit_attention(p->attn, p->n_attn, gpu->peak_flops, &af, err))) return rc;
    gpu->attn_eff = af.attn_eff;
    gpu->attn_score_s = af.score_s;
    gpu->attn_bwd_score_s = af.bwd_score_s;
    gpu->attn_row_s = af.row_s;
    gpu->attn_bwd_row_s = af.bwd_row_s;
    p->attn_fit_rms = af.rms_rel;
    if (p->cuda) {
        /* The device's theoretical rate, as the shipped files give it: memory
         * clock x 2 (double data rate) x bus width; the copy when unknown. */
        double theory = p->dev.mem_clock_hz * 2 * p->dev.bus_bits / 8;
        gpu->hbm_bw = theory > 0 ? theory : p->dev.d2d_bw;
        gpu->hbm_bytes = p->phys_bytes;
        gpu->reserved_bytes = p->used_bytes;
        util_strlcpy(gpu->name, p->dev.name, sizeof gpu->name);
    } else {
        gpu->hbm_bw = fmax(fmax(p->copy_bw, p->scale_bw), fmax(p->add_bw, p->triad_bw));
        gpu->hbm_bytes = p->phys_bytes / p->ranks;
        gpu->reserved_bytes = p->used_bytes / p->ranks;
        snprintf(gpu->name, sizeof gpu->name, "CPU-%.59s", p->host);
    }
    gpu->mem_eff = fmin(1.0, p->ew_bw / gpu->hbm_bw);
    gpu->kernel_launch_s = p->launch_s;
    measured_grid(p, y, &gpu->grid);
    gpu->ew = p->ew;
    return cost_gpu_validate(gpu, "profile", err);
}

int cost_prof_init_mpi(prof_ctx *c, bool *we_init, char *err)
{
    int inited = 0;
    MPI_Initialized(&inited);
    *we_init = false;
    if (!inited) {
        if (!launched_by_mpirun()) return UTIL_OK;
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS) return util_fail(err, UTIL_ERUNTIME, "profile: MPI_Init failed");
        *we_init = true;
    }
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
void cost_prof_share_host_facts(const prof_ctx *c, cost_profile *p)
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
static void find_sets(const prof_ctx *c, cost_profile *p)
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

int cost_profile_measure(const cost_profile_opts *o, cost_profile *p, char *err)
{
    memset(p, 0, sizeof *p);
    if (!o || !o->attention_forward || !o->attention_backward || !ew_kernels_given(o))
        return util_fail(err, UTIL_EINVAL, "profile: the backend's attention and element-wise kernels are required (cost_profile_opts)");
    p->quick = o->quick;
    prof_ctx c = {false, MPI_COMM_NULL, 0, 1, o};
    bool we_init;
    int rc = cost_prof_init_mpi(&c, &we_init, err);
    if (!rc) {
        p->rank = c.rank;
        p->ranks = c.size;
        p->mpi = c.mpi && c.size > 1;
        cost_prof_barrier(&c);
        host_facts(p);
        cost_prof_share_host_facts(&c, p);
        find_sets(&c, p);
        if (!(rc = measure_gemm(&c, p, err)) && !(rc = measure_attention(&c, p, err)) && !(rc = measure_memory(&c, p, err))
            && !(rc = measure_elementwise(&c, p, err)))
            rc = measure_collectives(&c, p, err);
        if (!rc) rc = measure_overlap(&c, p, err);
        if (!rc) rc = measure_sharing(&c, p, err);
        if (!rc) rc = cost_prof_derive(p, err);
    }
    if (we_init) MPI_Finalize();
    return rc;
}

/* ---- JSON ---- */

static bool add_field(cJSON *o, const cost_profile *p, const char *key, double v, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* {"value": v, "source": "measured by dhp profile on HOST DATE, <how>"} */
static bool add_field(cJSON *o, const cost_profile *p, const char *key, double v, const char *fmt, ...)
{
    char how[1024], src[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(how, sizeof how, fmt, ap);
    va_end(ap);
    snprintf(src, sizeof src, "measured by dhp profile on %s %s, %s", p->host, p->date, how);
    cJSON *f = cJSON_CreateObject();
    if (!f || !cJSON_AddNumberToObject(f, "value", v) || !cJSON_AddStringToObject(f, "source", src)
        || !cJSON_AddItemToObject(o, key, f)) {
        cJSON_Delete(f);
        return false;
    }
    return true;
}

static const char *shape_list(const cost_profile *p, char *buf, size_t n)
{
    /* The distinct m and the distinct n (= k) values of the measured grid. */
    int ms[COST_PROFILE_MAX_GEMM], ns[COST_PROFILE_MAX_GEMM], nm = 0, nn = 0;
    for (int i = 0; i < p->n_gemm; i++) {
        bool seen = false;
        for (int j = 0; j < nm; j++) seen = seen || ms[j] == p->gemm[i].m;
        if (!seen) ms[nm++] = p->gemm[i].m;
        seen = false;
        for (int j = 0; j < nn; j++) seen = seen || ns[j] == p->gemm[i].n;
        if (!seen) ns[nn++] = p->gemm[i].n;
    }
    size_t u = 0;
    u += (size_t)snprintf(buf + u, n - u, "m in {");
    for (int j = 0; j < nm && u < n; j++) u += (size_t)snprintf(buf + u, n - u, "%s%d", j ? "," : "", ms[j]);
    if (u < n) u += (size_t)snprintf(buf + u, n - u, "} x n,k in {");
    for (int j = 0; j < nn && u < n; j++) u += (size_t)snprintf(buf + u, n - u, "%s%d", j ? "," : "", ns[j]);
    if (u < n) snprintf(buf + u, n - u, "}");
    return buf;
}

static const char *who(const cost_profile *p, char *buf, size_t n)
{
    snprintf(buf, n, "%d rank%s on %d CPUs, %d OpenBLAS thread%s per rank%s", p->ranks, p->ranks > 1 ? "s" : "",
             p->cpus, p->blas_threads, p->blas_threads > 1 ? "s" : "",
             p->ranks > 1 ? ", rank 0 measuring while the others wait in MPI_Barrier (compute_speed says how ranks computing "
                            "at once slow each other)" : "");
    return buf;
}

static const char *attn_shape_list(const cost_profile *p, char *buf, size_t n)
{
    size_t u = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n_attn && u < n; i++)
        u += (size_t)snprintf(buf + u, n - u, "%s %d x s=%d H=%d Hkv=%d d=%d%s", i ? "," : "", p->attn[i].seqs,
                              p->attn[i].seq, p->attn[i].heads, p->attn[i].kv_heads, p->attn[i].head_dim,
                              p->attn[i].causal ? " causal" : "");
    return buf;
}

/* gemm_half and the attention fit's fields, the same fit for both backends;
 * `kernels` names the attention kernels timed, `w` who measured. */
static bool add_fit_fields(cJSON *o, const cost_profile *p, const char *kernels, const char *w)
{
    const cost_gpu *g = &p->gpu;
    char at[768];
    attn_shape_list(p, at, sizeof at);
    return add_field(o, p, "gemm_half", g->gemm_half, "same least-squares fit as gemm_eff_max, s(x) = x / (x + gemm_half)")
        && add_field(o, p, "attn_eff", g->attn_eff,
                     "%s, timed calls of (sequences x shape)%s, the times per sequence; least-squares fit (relative "
                     "error, rms %.1f%%) of fwd = S "
                     "(attn_score_s + 4 d / (peak_flops attn_eff)) + R attn_row_s, bwd = S (attn_bwd_score_s + 2.5 x 4 d "
                     "/ (peak_flops attn_eff)) + R attn_bwd_row_s, S = s^2 H scores, causal s (s + 1) / 2 H, R = s H "
                     "rows; %s", kernels, at, 100 * p->attn_fit_rms, w)
        && add_field(o, p, "attn_score_s", g->attn_score_s,
                     "same fit as attn_eff: forward seconds per score that do not scale with d (max, exp, rescale)")
        && add_field(o, p, "attn_bwd_score_s", g->attn_bwd_score_s,
                     "same fit as attn_eff: backward seconds per score that do not scale with d (exp recomputed, dS)")
        && add_field(o, p, "attn_row_s", g->attn_row_s,
                     "same fit as attn_eff: forward seconds per query row and head that do not scale with the keys "
                     "(online-softmax set-up, final normalization, lse)")
        && add_field(o, p, "attn_bwd_row_s", g->attn_bwd_row_s,
                     "same fit as attn_eff: backward seconds per query row and head that do not scale with the keys "
                     "(dout . out, the row's loads)");
}

/* The fields of a CUDA profile (cost_profile_measure_cuda): one rank's GPU. */
static bool add_gpu_fields_cuda(cJSON *o, const cost_profile *p)
{
    const cost_gpu *g = &p->gpu;
    const cost_profile_device *d = &p->dev;
    char shapes[256], w[256];
    shape_list(p, shapes, sizeof shapes);
    snprintf(w, sizeof w, "%s (sm_%d%d, %d SMs), CUDA runtime %d, driver %d, rank 0 of %d timing with CUDA events while "
             "the others wait", d->name, d->cc_major, d->cc_minor, d->sms, d->runtime_version, d->driver_version, p->ranks);
    const char *kern = d->gemm_fp32 ? "fp32 cublasSgemm" : "BF16 cublasGemmEx (FP32 accumulate)";
    bool ok;
    if (d->clock_hz > 0)
        ok = add_field(o, p, "peak_flops", g->peak_flops,
                       "%s peak = %g FLOP/cycle/SM x %.0f MHz (cudaDevAttrClockRate) x %d SMs; rule: the higher of the fitted "
                       "large-shape %s rate (%.4g FLOP/s, see gemm_eff_max) and the best measured shape's, / (clock x SMs), "
                       "rounded up to a power of two FLOP/cycle; %s",
                       d->gemm_fp32 ? "fp32" : "dense BF16 tensor-core", p->flops_per_cycle, d->clock_hz / 1e6, d->sms,
                       kern, p->gemm_rate_max, w);
    else
        ok = add_field(o, p, "peak_flops", g->peak_flops,
                       "the best measured %s rate (the device gives no clock, so no theoretical peak); %s", kern, w);
    ok = ok && add_field(o, p, "gemm_eff_max", g->gemm_eff_max,
                         "fitted large-shape rate %.4g FLOP/s / peak_flops; least-squares fit (relative error, rms %.1f%%) of "
                         "rate = peak_flops * gemm_eff_max * s(m) s(n) s(k) to %s (row-major A[m,k] B[n,k]^T, the "
                         "executor's linear) over %d shapes %s, time less kernel_launch_s, best of 2 batches%s; %s",
                         p->gemm_rate_max, 100 * p->gemm_fit_rms, kern, p->n_gemm, shapes, p->quick ? "" : " in 2 passes", w);
    ok = ok && add_fit_fields(o, p, "the CUDA backend's own fp32 attention kernels (executor/cuda_kernels.cu, passed in by "
                                    "the CLI), forward and backward", w);
    ok = ok && add_field(o, p, "hbm_bytes", g->hbm_bytes, "device memory (cudaMemGetInfo total) of %s", d->name);
    if (d->mem_clock_hz > 0 && d->bus_bits > 0)
        ok = ok && add_field(o, p, "hbm_bw", g->hbm_bw,
                             "theoretical: memory clock %.0f MHz (cudaDevAttrMemoryClockRate) x 2 (double data rate) x "
                             "%d-bit bus (cudaDevAttrGlobalMemoryBusWidth) / 8; a device-to-device cudaMemcpy of %.0f MiB "
                             "moved %.4g GB/s (read + written)", d->mem_clock_hz / 1e6, d->bus_bits,
                             p->stream_bytes / 1048576.0, d->d2d_bw / 1e9);
    else
        ok = ok && add_field(o, p, "hbm_bw", g->hbm_bw,
                             "a device-to-device cudaMemcpy of %.0f MiB, bytes read + written per second (the device "
                             "reports no memory clock)", p->stream_bytes / 1048576.0);
    ok = ok && add_field(o, p, "mem_eff", g->mem_eff,
                         "the CUDA backend's element-wise kernels over fp32 arrays of %.0f MiB (residual add 12 B/element "
                         "%.4g GB/s, SwiGLU 12 B/element %.4g GB/s, RMSNorm d=%d 8 B/element %.4g GB/s): total bytes / "
                         "total time %.4g GB/s, / hbm_bw",
                         p->stream_bytes / 1048576.0, p->ew_add_bw / 1e9, p->ew_swiglu_bw / 1e9, COST_PROF_GPU_RMSNORM_DIM, p->ew_rmsnorm_bw / 1e9,
                         p->ew_bw / 1e9);
    ok = ok && add_field(o, p, "reserved_bytes", g->reserved_bytes,
                         "device memory in use once the CUDA context, cuBLAS%s exist, before any buffer (cudaMemGetInfo "
                         "total - free; includes other processes on the GPU)", p->mpi ? " and NCCL" : "");
    ok = ok && add_field(o, p, "kernel_launch_s", g->kernel_launch_s,
                         "mean time per launch of back-to-back one-element add_inplace kernels (the backend's), CUDA "
                         "events, best of 3 batches");
    return ok;
}

static bool add_gpu_fields_cpu(cJSON *o, const cost_profile *p)
{
    const cost_gpu *g = &p->gpu;
    char shapes[256], w[320];
    shape_list(p, shapes, sizeof shapes);
    who(p, w, sizeof w);
    bool ok;
    if (p->cpu_hz > 0)
        ok = add_field(o, p, "peak_flops", g->peak_flops,
                       "fp32 peak of one rank = %g FLOP/cycle x %.0f MHz x %.3g cores; rule: the higher of the fitted "
                       "large-shape cblas_sgemm rate (%.4g FLOP/s, see gemm_eff_max) and the best measured shape's, / (clock "
                       "x cores), rounded up to a power of two FLOP/cycle; cores = min(BLAS threads, CPUs); %s",
                       p->flops_per_cycle, p->cpu_hz / 1e6, p->core_share, p->gemm_rate_max, w);
    else
        ok = add_field(o, p, "peak_flops", g->peak_flops,
                       "the best measured cblas_sgemm rate (the OS gives no clock, so no theoretical peak); %s", w);
    ok = ok && add_field(o, p, "gemm_eff_max", g->gemm_eff_max,
                         "fitted large-shape rate %.4g FLOP/s / peak_flops; least-squares fit (relative error, rms %.1f%%) "
                         "of rate = peak_flops * gemm_eff_max * s(m) s(n) s(k) to fp32 cblas_sgemm (A[m,k] B[n,k]^T, the "
                         "executor's linear) over %d shapes %s, A in cache, B and C the next slot of a %.0f MiB arena each call "
                         "(from memory, as a step's weights and outputs come), time less kernel_launch_s, best of %d batches "
                         "in %d passes over the grid; %s",
                         p->gemm_rate_max, 100 * p->gemm_fit_rms, p->n_gemm, shapes, p->gemm_arena_bytes / 1048576,
                         GEMM_BATCHES * gemm_passes(p), gemm_passes(p), w);
    ok = ok && add_fit_fields(o, p, "flash-style attention forward and backward, the executor's own kernels "
                                    "(executor/cpu_kernels.c, passed in by the CLI)", w);
    ok = ok && add_field(o, p, "hbm_bytes", g->hbm_bytes,
                         "physical memory (sysconf _SC_PHYS_PAGES x _SC_PAGESIZE) %.4g GiB / %d rank%s on this host",
                         p->phys_bytes / 1073741824.0, p->ranks, p->ranks > 1 ? "s" : "");
    ok = ok && add_field(o, p, "hbm_bw", g->hbm_bw,
                         "best per-rank bandwidth of the STREAM kernels over 3 fp32 arrays of %.0f MiB (copy %.3g, scale "
                         "%.3g, add %.3g, triad %.3g GB/s; bytes read + written, best of several passes); the DRAM's "
                         "theoretical rate is not visible to the tool; %s",
                         p->stream_bytes / 1048576.0, p->copy_bw / 1e9, p->scale_bw / 1e9, p->add_bw / 1e9,
                         p->triad_bw / 1e9, w);
    ok = ok && add_field(o, p, "mem_eff", g->mem_eff,
                         "three of the executor's element-wise kernels (executor/cpu_kernels.c, passed in by the CLI) at "
                         "the elementwise table's large size, %.0f MiB per array (residual add 12 B/element %.3g GB/s, "
                         "SwiGLU 12 B/element %.3g GB/s, RMSNorm d=%d 8 B/element %.3g GB/s): total bytes / total time "
                         "%.3g GB/s, / hbm_bw",
                         g->ew.elements[1] * sizeof(float) / 1048576.0, p->ew_add_bw / 1e9, p->ew_swiglu_bw / 1e9, EW_ROW,
                         p->ew_rmsnorm_bw / 1e9, p->ew_bw / 1e9);
    ok = ok && add_field(o, p, "reserved_bytes", g->reserved_bytes,
                         p->used_from_meminfo
                             ? "memory in use before the benchmark buffers (MemTotal - MemAvailable of /proc/meminfo: the OS, "
                               "other processes, the ranks' libraries and MPI) / ranks on this host"
                             : "this process's peak resident size before the benchmark buffers (getrusage; /proc/meminfo "
                               "was not readable)");
    ok = ok && add_field(o, p, "kernel_launch_s", g->kernel_launch_s,
                         "mean time of one 1x1x1 cblas_sgemm call (the fixed cost of a BLAS call), best of 3 batches");
    return ok;
}

static bool add_gpu_fields(cJSON *o, const cost_profile *p)
{
    if (!(p->cuda ? add_gpu_fields_cuda(o, p) : add_gpu_fields_cpu(o, p))) return false;
    char src[600];
    if (p->gpu.grid.n_m > 0) {
        snprintf(src, sizeof src, "measured by dhp profile on %s %s, the GEMM shapes of gemm_eff_max's fit: each shape's "
                 "rate (time less kernel_launch_s) / peak_flops, k fastest; the cost model interpolates them linearly in "
                 "log m, log n, log k and, outside the grid, scales the edge value by the fitted s(m) s(n) s(k)",
                 p->host, p->date);
        if (!cost_gemm_grid_add(o, &p->gpu.grid, src)) return false;
    }
    if (p->gpu.ew.n == 0) return true;
    if (p->cuda)
        snprintf(src, sizeof src, "measured by dhp profile on %s %s: the CUDA backend's LayerNorm forward and backward "
                 "(executor/cuda_kernels_whisper.cuh, passed in by the CLI), rows of %d, over fp32 arrays of `elements` "
                 "elements, nominal bytes (costdb/model.c ew_kernels, x 4 B) / time; the other element-wise kernels, all "
                 "bound by memory on a GPU, are priced at hbm_bw x mem_eff", p->host, p->date, COST_PROF_GPU_RMSNORM_DIM);
    else
        snprintf(src, sizeof src, "measured by dhp profile on %s %s: each of the executor's element-wise kernels "
                 "(executor/cpu_kernels.c, passed in by the CLI) over fp32 arrays of `elements` elements, its nominal bytes "
                 "(tensor elements read + written per element, costdb/model.c ew_kernels, x 4 B) / time, best of %d passes; "
                 "rows of %d (RMSNorm, LayerNorm, bias), %d heads x %d (RoPE), vocabulary %d (cross-entropy); the cost model "
                 "interpolates in log bytes between the two sizes", p->host, p->date, ew_passes(p), EW_ROW, EW_HEADS,
                 EW_HEAD_DIM, EW_VOCAB);
    return cost_ew_table_add(o, &p->gpu.ew, src);
}

static bool add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v) != NULL; }

static bool add_obj(cJSON *parent, const char *key, cJSON *child)
{
    if (!child) return false;
    if (!cJSON_AddItemToObject(parent, key, child)) { cJSON_Delete(child); return false; }
    return true;
}

static cJSON *gemm_measurements(const cost_profile *p)
{
    cJSON *o = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    const char *kernel = !p->cuda ? "cblas_sgemm RowMajor NoTrans x Trans, fp32"
                         : p->dev.gemm_fp32 ? "cublasSgemm OP_T x OP_N (row-major A[m,k] B[n,k]^T), fp32"
                                            : "cublasGemmEx OP_T x OP_N (row-major A[m,k] B[n,k]^T), BF16 in and out, FP32 compute";
    bool ok = o && rows && cJSON_AddStringToObject(o, "kernel", kernel)
        && add_num(o, "rate_max", p->gemm_rate_max) && add_num(o, "gemm_half", p->gpu.gemm_half)
        && add_num(o, "fit_rms_rel", p->gemm_fit_rms);
    for (int i = 0; ok && i < p->n_gemm; i++) {
        const cost_profile_gemm *g = &p->gemm[i];
        cJSON *r = cJSON_CreateObject();
        ok = r && add_num(r, "m", g->m) && add_num(r, "n", g->n) && add_num(r, "k", g->k)
            && add_num(r, "seconds", g->seconds) && add_num(r, "flops_per_s", g->rate)
            && add_num(r, "model_seconds", cost_gemm_time(&p->gpu, g->m, g->n, g->k));
        if (!ok || !cJSON_AddItemToArray(rows, r)) { cJSON_Delete(r); ok = false; }
    }
    if (ok && add_obj(o, "shapes", rows)) return o;
    if (!ok) cJSON_Delete(rows);
    cJSON_Delete(o);
    return NULL;
}

static cJSON *attn_measurements(const cost_profile *p)
{
    cJSON *rows = cJSON_CreateArray();
    bool ok = rows != NULL;
    for (int i = 0; ok && i < p->n_attn; i++) {
        const cost_profile_attn *a = &p->attn[i];
        cJSON *r = cJSON_CreateObject();
        ok = r && add_num(r, "seq", a->seq) && add_num(r, "heads", a->heads) && add_num(r, "kv_heads", a->kv_heads)
            && add_num(r, "head_dim", a->head_dim) && cJSON_AddBoolToObject(r, "causal", a->causal)
            && add_num(r, "sequences_per_call", a->seqs)
            && add_num(r, "fwd_flops", a->fwd_flops)
            && add_num(r, "fwd_seconds", a->fwd_s) && add_num(r, "bwd_seconds", a->bwd_s)
            && add_num(r, "fwd_flops_per_s", a->fwd_flops / a->fwd_s) && add_num(r, "bwd_over_fwd", a->bwd_s / a->fwd_s)
            && add_num(r, "model_fwd_seconds", cost_attention_forward_time(&p->gpu, (double)a->seq * a->heads, attn_scores(a), a->head_dim))
            && add_num(r, "model_bwd_seconds", cost_attention_backward_time(&p->gpu, (double)a->seq * a->heads, attn_scores(a), a->head_dim));
        if (!ok || !cJSON_AddItemToArray(rows, r)) { cJSON_Delete(r); ok = false; }
    }
    if (ok) return rows;
    cJSON_Delete(rows);
    return NULL;
}

static cJSON *device_measurements(const cost_profile *p)
{
    const cost_profile_device *d = &p->dev;
    cJSON *o = cJSON_CreateObject(), *ew = cJSON_CreateObject(), *mem = cJSON_CreateObject();
    bool ok = o && ew && mem && cJSON_AddStringToObject(o, "host", p->host) && cJSON_AddStringToObject(o, "date", p->date)
        && cJSON_AddBoolToObject(o, "quick", p->quick) && add_num(o, "ranks", p->ranks)
        && cJSON_AddStringToObject(o, "device", d->name) && add_num(o, "compute_capability", d->cc_major * 10 + d->cc_minor)
        && add_num(o, "sms", d->sms) && add_num(o, "devices", d->devices) && add_num(o, "clock_hz", d->clock_hz)
        && add_num(o, "mem_clock_hz", d->mem_clock_hz) && add_num(o, "bus_bits", d->bus_bits)
        && add_num(o, "cuda_runtime", d->runtime_version) && add_num(o, "driver", d->driver_version)
        && add_num(o, "nccl", d->nccl_version) && add_num(o, "flops_per_cycle_per_sm", p->flops_per_cycle)
        && add_num(o, "kernel_launch_s", p->launch_s) && add_num(o, "d2d_copy_bw", d->d2d_bw)
        && add_num(ew, "array_bytes", p->stream_bytes) && add_num(ew, "add_inplace_bw", p->ew_add_bw)
        && add_num(ew, "swiglu_bw", p->ew_swiglu_bw) && add_num(ew, "rmsnorm_bw", p->ew_rmsnorm_bw)
        && add_num(ew, "combined_bw", p->ew_bw) && add_num(ew, "layernorm_bw", p->ew.bw[COST_EW_LAYERNORM][0])
        && add_num(ew, "layernorm_bwd_bw", p->ew.bw[COST_EW_LAYERNORM_BWD][0])
        && add_num(mem, "total_bytes", p->phys_bytes) && add_num(mem, "used_at_start_bytes", p->used_bytes);
    if (ok) { ok = add_obj(o, "elementwise", ew); ew = NULL; }
    if (ok) { ok = add_obj(o, "memory", mem); mem = NULL; }
    ok = ok && add_obj(o, "gemm", gemm_measurements(p)) && add_obj(o, "attention", attn_measurements(p));
    cJSON_Delete(ew); cJSON_Delete(mem);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

static cJSON *gpu_measurements(const cost_profile *p)
{
    if (p->cuda) return device_measurements(p);
    cJSON *o = cJSON_CreateObject(), *st = cJSON_CreateObject(), *ew = cJSON_CreateObject(), *mem = cJSON_CreateObject();
    bool ok = o && st && ew && mem && cJSON_AddStringToObject(o, "host", p->host) && cJSON_AddStringToObject(o, "date", p->date)
        && cJSON_AddBoolToObject(o, "quick", p->quick) && add_num(o, "ranks", p->ranks) && add_num(o, "cpus", p->cpus)
        && add_num(o, "blas_threads", p->blas_threads) && add_num(o, "cpu_hz", p->cpu_hz)
        && add_num(o, "core_share", p->core_share) && add_num(o, "flops_per_cycle", p->flops_per_cycle)
        && add_num(o, "kernel_launch_s", p->launch_s)
        && add_num(st, "array_bytes", p->stream_bytes) && add_num(st, "copy_bw", p->copy_bw)
        && add_num(st, "scale_bw", p->scale_bw) && add_num(st, "add_bw", p->add_bw) && add_num(st, "triad_bw", p->triad_bw)
        && add_num(ew, "add_inplace_bw", p->ew_add_bw) && add_num(ew, "swiglu_bw", p->ew_swiglu_bw)
        && add_num(ew, "rmsnorm_bw", p->ew_rmsnorm_bw) && add_num(ew, "combined_bw", p->ew_bw)
        && add_num(mem, "phys_bytes", p->phys_bytes) && add_num(mem, "used_at_start_bytes", p->used_bytes)
        && cJSON_AddStringToObject(mem, "used_from", p->used_from_meminfo ? "/proc/meminfo" : "getrusage");
    if (ok) { ok = add_obj(o, "stream", st); st = NULL; }
    if (ok) { ok = add_obj(o, "elementwise", ew); ew = NULL; }
    if (ok) { ok = add_obj(o, "memory", mem); mem = NULL; }
    ok = ok && add_obj(o, "gemm", gemm_measurements(p)) && add_obj(o, "attention", attn_measurements(p));
    cJSON_Delete(st); cJSON_Delete(ew); cJSON_Delete(mem);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

cJSON *cost_profile_gpu_json(const cost_profile *p, bool with_measurements)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddStringToObject(o, "schema", "dhp.gpu/1") && cJSON_AddStringToObject(o, "name", p->gpu.name)
        && add_gpu_fields(o, p);
    if (ok && with_measurements) ok = add_obj(o, "measurements", gpu_measurements(p));
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

static const char *sizes_text(const cost_profile *p, char *buf, size_t n)
{
    double lo = INFINITY, hi = 0;
    for (int i = 0; i < p->n_coll; i++) { lo = fmin(lo, p->coll[i].bytes); hi = fmax(hi, p->coll[i].bytes); }
    snprintf(buf, n, "S = %.0f B .. %.0f B (%d sizes)", p->n_coll ? lo : 0, hi, p->n_coll ? p->n_coll / (p->mpi ? 5 : 1) : 0);
    return buf;
}

static cJSON *link_json(const cost_profile *p, bool intra)
{
    char how[1024], src[1400], sz[96];
    sizes_text(p, sz, sizeof sz);
    if (!intra)
        snprintf(how, sizeof how, "not measured: dhp profile sees one host; a copy of intra so that the 1-node file "
                                  "loads (a 1-node pool never uses its inter link)");
    else if (p->mpi && p->cuda)
        snprintf(how, sizeof how, "%d GPUs of this host, one rank each: weighted least-squares fit (relative error, rms "
                 "%.1f%%) of t = steps * alpha_s + S * factor / busbw (nccl-tests factors: all-reduce 2(n-1) steps, "
                 "2(n-1)/n; all-gather, reduce-scatter, all-to-all n-1, (n-1)/n; send/recv 1, 1) jointly over "
                 "ncclAllReduce, ncclAllGather, ncclReduceScatter, grouped ncclSend/ncclRecv all-to-all and ring "
                 "exchange (NCCL %d), %s, CUDA events, slowest rank, best of 3 trials; per-operation fits and the raw "
                 "table under measurements", p->ranks, 100 * p->link.rms_rel, p->dev.nccl_version, sz);
    else if (p->cuda)
        snprintf(how, sizeof how, "1 process (not under mpirun): a device-to-device cudaMemcpyAsync of %s stands in "
                 "for a send to oneself, least-squares fit (relative error, rms %.1f%%) of t = alpha_s + S / busbw; no "
                 "link between GPUs measured (run one rank per GPU under mpirun)", sz, 100 * p->link.rms_rel);
    else if (p->mpi)
        snprintf(how, sizeof how, "%d ranks on this host: weighted least-squares fit (relative error, rms %.1f%%) of "
                 "t = steps * alpha_s + S * factor / busbw (nccl-tests factors: all-reduce 2(n-1) steps, 2(n-1)/n; "
                 "all-gather, reduce-scatter, all-to-all n-1, (n-1)/n; send/recv 1, 1) jointly over MPI_Allreduce, "
                 "MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall and a ring MPI_Sendrecv, %s, slowest rank, "
                 "best of 3 trials; per-operation fits and the raw table under measurements",
                 p->ranks, 100 * p->link.rms_rel, sz);
    else
        snprintf(how, sizeof how, "1 process (not under mpirun): a send/recv to oneself, measured as memcpy of %s, "
                 "least-squares fit (relative error, rms %.1f%%) of t = alpha_s + S / busbw; no inter-process link measured",
                 sz, 100 * p->link.rms_rel);
    snprintf(src, sizeof src, "measured by dhp profile on %s %s, %s", p->host, p->date, how);
    cJSON *o = cJSON_CreateObject();
    if (o && add_num(o, "busbw", p->link.busbw) && add_num(o, "alpha_s", p->link.alpha_s)
        && cJSON_AddStringToObject(o, "source", src))
        return o;
    cJSON_Delete(o);
    return NULL;
}

static cJSON *fit_json(const cost_profile_fit *f)
{
    cJSON *o = cJSON_CreateObject();
    if (o && add_num(o, "alpha_s", f->alpha_s) && add_num(o, "busbw", f->busbw) && add_num(o, "rms_rel", f->rms_rel)
        && add_num(o, "points", f->points))
        return o;
    cJSON_Delete(o);
    return NULL;
}

static const char *coll_method(const cost_profile *p)
{
    if (p->cuda)
        return p->mpi ? "NCCL collectives between the ranks' GPUs, CUDA events, slowest rank, best of 3 trials"
                      : "device-to-device cudaMemcpyAsync in one process, CUDA events, best of 3 trials";
    return p->mpi ? "MPI collectives on MPI_COMM_WORLD, slowest rank, best of 3 trials"
                  : "memcpy in one process, best of 3 trials";
}

static cJSON *coll_measurements(const cost_profile *p)
{
    cJSON *o = cJSON_CreateObject(), *rows = cJSON_CreateArray(), *fits = cJSON_CreateObject();
    bool ok = o && rows && fits && add_num(o, "ranks", p->ranks)
        && cJSON_AddStringToObject(o, "method", coll_method(p));
    for (int i = 0; ok && i < p->n_coll; i++) {
        const cost_profile_coll *c = &p->coll[i];
        double steps, x;
        cost_profile_op_terms(c->op, c->bytes, p->ranks, &steps, &x);
        cJSON *r = cJSON_CreateObject();
        ok = r && cJSON_AddStringToObject(r, "op", cost_profile_op_name(c->op)) && add_num(r, "bytes", c->bytes)
            && add_num(r, "seconds", c->seconds) && add_num(r, "algbw", c->bytes / c->seconds)
            && add_num(r, "busbw", x / c->seconds);
        if (!ok || !cJSON_AddItemToArray(rows, r)) { cJSON_Delete(r); ok = false; }
    }
    for (int op = 0; ok && op < COST_PROF_NOPS; op++)
        if (p->fit[op].valid) ok = add_obj(fits, cost_profile_op_name((cost_prof_op)op), fit_json(&p->fit[op]));
    ok = ok && add_obj(fits, "joint", fit_json(&p->link));
    if (ok) { ok = add_obj(o, "collectives", rows); rows = NULL; }
    if (ok) { ok = add_obj(o, "fits", fits); fits = NULL; }
    cJSON_Delete(rows);
    cJSON_Delete(fits);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* {"value": [speed with 1..ranks computing], "source": ...} */
static cJSON *speed_json(const cost_profile *p)
{
    char who_[320];
    who(p, who_, sizeof who_);
    cJSON *o = cJSON_CreateObject();
    char src[1400];
    snprintf(src, sizeof src,
             "measured by dhp profile on %s %s, one rank's compute speed while k = 1..%d ranks of its processor set "
             "(compute_sets; without it, the host) compute at once, relative to one alone (the condition of the gpu "
             "figures): k ranks run units of an executor-like mix (a 256x256x64 cblas_sgemm, the executor's attention "
             "forward s=128 H=4 d=16, a residual add of 2^18 floats; one unit %.3g ms on rank 0 alone) for one common %.0f ms window (its start "
             "sent ahead by rank 0, the busy ranks sleeping until it), the others wait in MPI_Allreduce as the executor's "
             "idle ranks wait in MPI_Wait; mean rate of the busy ranks over the rate of "
             "one alone in the windows just before and after (the same state of the host), median of %d trials, capped at 1; %s",
             p->host, p->date, p->n_speed, 1e3 * p->sharing_unit_s, 40.0, p->quick ? SHARING_TRIALS / 2 : SHARING_TRIALS, who_);
    if (o && cJSON_AddItemToObject(o, "value", cJSON_CreateDoubleArray(p->speed, p->n_speed))
        && cJSON_AddStringToObject(o, "source", src)) return o;
    cJSON_Delete(o);
    return NULL;
}

/* {"value": seconds, "source": ...} (cost_pool.handoff_s) */
static cJSON *handoff_json(const cost_profile *p)
{
    char src[900];
    snprintf(src, sizeof src,
             "measured by dhp profile on %s %s, the time a rank that waited in MPI (polling, yielding its CPU) takes to "
             "get its CPU back from a set-mate that computes: rank 0 computes %.0f us then exchanges 8 bytes with rank "
             "%d (bound elsewhere), over and over, while its set-mate rank %d runs the compute_speed mix without a "
             "pause (mean round trip %.3f ms over %d exchanges, median of %d windows) and while the mate waits in MPI "
             "too (%.4f ms); the difference. The simulator gives a rank that waits every interval of compute "
             "min(interval, this) of a shared CPU against a mate's min(its interval, this)",
             p->host, p->date, 1e6 * HANDOFF_WORK_S, p->handoff_partner, p->handoff_mate, 1e3 * p->handoff_busy_rtt_s,
             p->handoff_exchanges, p->quick ? 1 : HANDOFF_TRIALS, 1e3 * p->handoff_idle_rtt_s);
    cJSON *o = cJSON_CreateObject();
    if (o && add_num(o, "value", p->handoff_s) && cJSON_AddStringToObject(o, "source", src)) return o;
    cJSON_Delete(o);
    return NULL;
}

/* {"value": fraction, "source": ...} (cost_pool.overlap) */
static cJSON *overlap_json(const cost_profile *p)
{
    char src[700];
    snprintf(src, sizeof src,
             "measured by dhp profile on %s %s over %d ranks: an MPI_Iallgather of %u KiB per rank, compute without "
             "MPI calls for as long as the all-gather alone takes (%.1f us), then MPI_Wait, as dhp's ZeRO strategies "
             "prefetch a unit: alone %.1f us, compute alone %.1f us, both %.1f us (best of %d, slowest rank); the "
             "fraction of the collective hidden",
             p->host, p->date, p->ranks, OVERLAP_BYTES >> 10, 1e6 * p->overlap_coll_s, 1e6 * p->overlap_coll_s,
             1e6 * p->overlap_compute_s, 1e6 * p->overlap_both_s, OVERLAP_TRIALS);
    cJSON *o = cJSON_CreateObject();
    if (o && add_num(o, "value", p->overlap) && cJSON_AddStringToObject(o, "source", src)) return o;
    cJSON_Delete(o);
    return NULL;
}

/* {"value": [lowest rank of each rank's processor set], "source": ...} */
static cJSON *sets_json(const cost_profile *p)
{
    char src[512], cpus[256] = "";
    size_t u = 0;
    for (int r = 0; r < p->ranks && r < COST_MAX_SPEED && u < sizeof cpus; r++)
        u += (size_t)snprintf(cpus + u, sizeof cpus - u, "%s%d", r ? "," : "", p->bound_cpu[r]);
    snprintf(src, sizeof src, "measured by dhp profile on %s %s, each rank's CPU binding (sched_getaffinity: %s; -1 "
             "unbound): ranks bound to one CPU share it, the others share the host", p->host, p->date, cpus);
    int v[COST_MAX_SPEED];
    for (int r = 0; r < p->ranks && r < COST_MAX_SPEED; r++) v[r] = p->set_of[r];
    cJSON *o = cJSON_CreateObject();
    if (o && cJSON_AddItemToObject(o, "value", cJSON_CreateIntArray(v, p->ranks < COST_MAX_SPEED ? p->ranks : COST_MAX_SPEED))
        && cJSON_AddStringToObject(o, "source", src)) return o;
    cJSON_Delete(o);
    return NULL;
}

/* The per-operation fits as the pool's intra_ops (cost_pool.intra_op): each
 * collective priced by its own alpha and busbw inside the node. */
static cJSON *intra_ops_json(const cost_profile *p)
{
    static const struct { cost_prof_op prof; cost_coll op; } map[] = {
        {COST_PROF_ALLREDUCE, COST_ALLREDUCE}, {COST_PROF_ALLGATHER, COST_ALLGATHER},
        {COST_PROF_REDUCESCATTER, COST_REDUCESCATTER}, {COST_PROF_ALLTOALL, COST_ALLTOALL}};
    char src[512];
    snprintf(src, sizeof src, "measured by dhp profile on %s %s, each collective's own weighted least-squares fit of "
             "t = steps * alpha_s + S * factor / busbw over its sizes (the per-operation fits under measurements); the "
             "cost model prices these operations inside a node with them, the rest with intra", p->host, p->date);
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddStringToObject(o, "source", src);
    for (size_t i = 0; ok && i < sizeof map / sizeof *map; i++) {
        const cost_profile_fit *f = &p->fit[map[i].prof];
        if (!f->valid) continue;
        cJSON *l = cJSON_CreateObject();
        ok = l && add_num(l, "busbw", f->busbw) && add_num(l, "alpha_s", f->alpha_s)
            && cJSON_AddItemToObject(o, cost_coll_name(map[i].op), l);
        if (!ok) cJSON_Delete(l);
    }
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

cJSON *cost_profile_cluster_json(const cost_profile *p)
{
    char name[COST_NAME_LEN];
    snprintf(name, sizeof name, "%s-%d", p->cuda ? "cuda" : "cpu", p->ranks);
    cJSON *o = cJSON_CreateObject(), *pools = cJSON_CreateArray(), *pool = cJSON_CreateObject();
    bool ok = o && pools && pool && cJSON_AddStringToObject(o, "schema", "dhp.cluster/1") && cJSON_AddStringToObject(o, "name", name)
        && cJSON_AddStringToObject(pool, "name", p->cuda ? "cuda" : "cpu") && add_obj(pool, "gpu", cost_profile_gpu_json(p, false))
        && add_num(pool, "nodes", 1) && add_num(pool, "gpus_per_node", p->ranks)
        && add_obj(pool, "intra", link_json(p, true)) && add_obj(pool, "inter", link_json(p, false))
        && (p->n_speed == 0 || add_obj(pool, "compute_speed", speed_json(p)))
        && (p->n_sets <= 1 || add_obj(pool, "compute_sets", sets_json(p)))
        && (!(p->handoff_s > 0) || p->n_speed == 0 || add_obj(pool, "compute_handoff_s", handoff_json(p)))
        && (!p->has_overlap || add_obj(pool, "collective_overlap", overlap_json(p)))
        && (!p->mpi || add_obj(pool, "intra_ops", intra_ops_json(p)));
    if (ok) { ok = cJSON_AddItemToArray(pools, pool); if (ok) pool = NULL; }
    if (ok) { ok = add_obj(o, "pools", pools); pools = NULL; }
    ok = ok && add_obj(o, "measurements", coll_measurements(p));
    cJSON_Delete(pool);
    cJSON_Delete(pools);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* Serialise, parse back with the loader (kind 'g' GPU, 'c' cluster), write atomically. */
static int write_checked(cJSON *doc, char kind, const char *path, char *err)
{
    if (!doc) return util_fail(err, UTIL_ENOMEM, "%s: out of memory building the JSON", path);
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    if (!text) return util_fail(err, UTIL_ENOMEM, "%s: out of memory serialising the JSON", path);
    size_t len = strlen(text);
    char *buf = util_malloc(len + 2);
    int rc = buf ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    if (!rc) {
        memcpy(buf, text, len);
        buf[len] = '\n';
        buf[len + 1] = '\0';
        cost_gpu g;
        cost_cluster c;
        rc = kind == 'g' ? cost_gpu_parse_json(buf, path, &g, err) : cost_cluster_parse_json(buf, path, &c, err);
        if (!rc) rc = util_write_atomic(path, buf, len + 1, err);
    }
    util_free(buf);
    cJSON_free(text);
    return rc;
}

int cost_profile_write(const cost_profile *p, const char *gpu_path, const char *cluster_path, char *err)
{
    int rc = UTIL_OK;
    if (gpu_path) rc = write_checked(cost_profile_gpu_json(p, true), 'g', gpu_path, err);
    if (!rc && cluster_path) rc = write_checked(cost_profile_cluster_json(p), 'c', cluster_path, err);
    return rc;
}
