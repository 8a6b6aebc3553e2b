/* dhp profile: the fits (alpha-beta of the collectives, the attention and
 * GEMM efficiency curves) and the derivation of the cost-model fields from a
 * profile's measurements, either backend (taken by profile/cpu.c, profile/device.c).
 * The rules are in costdb/SCHEMA.md ("Measured files"). */
#include "costdb/costdb.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

double cost_prof_attn_scores(const cost_profile_attn *a)
{
    return (double)a->seq * cost_attention_mean_span(a->seq, a->causal) * a->heads;
}

double cost_prof_attn_fwd_flops(const cost_profile_attn *a) { return 4.0 * a->head_dim * cost_prof_attn_scores(a); }

static void attn_rows(const cost_profile_attn *a, bool bwd, double *row, double *t)
{
    double scores = cost_prof_attn_scores(a), flops = cost_prof_attn_fwd_flops(a), rows = (double)a->seq * a->heads;
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
 * FLOP cost above the peak rate (at 1 / peak; at 0 without a peak), noise
 * either way, and refitting the rest. */
static bool attn_fit_pinned(const cost_profile_attn *a, int n, double peak_flops, bool *free_, double *x)
{
    bool ok = attn_solve(a, n, free_, x);
    double least = isfinite(peak_flops) ? 1.0 / peak_flops : 0;
    for (int pass = 0; ok && pass < ATT_N; pass++) {
        bool changed = false;
        if (free_[ATT_FLOP] && x[ATT_FLOP] < least) { x[ATT_FLOP] = least; free_[ATT_FLOP] = false; changed = true; }
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
    out->flop_s = x[ATT_FLOP];
    out->score_s = x[ATT_SCORE];
    out->bwd_score_s = x[ATT_BWD_SCORE];
    out->row_s = x[ATT_ROW];
    out->bwd_row_s = x[ATT_BWD_ROW];
    out->attn_eff = isfinite(peak_flops) ? fmin(1.0, 1.0 / (x[ATT_FLOP] * peak_flops)) : 0;
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
static void measured_grid(const cost_profile *p, const double *rate, double peak, cost_gemm_grid *G)
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
        G->eff[(a * G->n_n + b) * G->n_k + c] = fmin(1.0, rate[i] / peak);
    }
}

/* A measured call's time as the cost model's terms see it: the model adds
 * kernel_launch_s to every GEMM and attention call it prices
 * (costdb/model.c), so their fits take that one launch off the time they
 * fit, or it would be counted twice (kept whole where the launch would be
 * half the call or more: then it is the launch measurement's noise). The
 * element-wise rates are taken whole: measured on calls where one launch is
 * about 1% (the CPU's 25K-element calls of ~10 us against its 0.1 us call
 * cost) to 2% (a GPU's 256 MiB arrays, ~230 us against ~5 us). */
static double less_launch(double t, double launch)
{
    double u = t - launch;
    return u > 0.5 * t ? u : t;
}

/* The attention shapes' per-sequence times less the launch of the call
 * they were timed in (a call holds seqs sequences: one launch for all). */
static void attn_less_launch(cost_profile_attn *a, int n, double launch)
{
    for (int i = 0; i < n; i++) {
        double seqs = a[i].seqs > 0 ? a[i].seqs : 1;
        a[i].fwd_s = less_launch(a[i].fwd_s * seqs, launch) / seqs;
        a[i].bwd_s = less_launch(a[i].bwd_s * seqs, launch) / seqs;
    }
}

/* peak_flops_tf32 from the TF32 grid (dhp profile --tf32). The planner
 * prices a TF32 GEMM at 2mnk / (peak_flops_tf32 eff(m,n,k)) +
 * kernel_launch_s with the fp32 grid's efficiency (cost_gemm_time_in); the
 * peak that fits the TF32 times T_i best in relative error: with a_i = 2mnk /
 * eff_i, L the launch cost and x = 1 / peak, minimising sum ((a_i x + L -
 * T_i) / T_i)^2 gives x = sum a_i (T_i - L) / T_i^2 / sum a_i^2 / T_i^2. */
static int fit_tf32_peak(cost_profile *p, char *err)
{
    cost_gpu *gpu = &p->gpu;
    double num = 0, den = 0, x, sq = 0;
    for (int i = 0; i < p->n_gemm; i++) {
        const cost_profile_gemm *g = &p->gemm[i];
        double eff = cost_gemm_efficiency(gpu, g->m, g->n, g->k), T = p->gemm_tf32_s[i];
        if (!(eff > 0 && T > 0)) continue;
        double a = 2.0 * g->m * g->n * g->k / eff;
        num += a * (T - gpu->kernel_launch_s) / (T * T);
        den += a * a / (T * T);
    }
    if (!(num > 0 && den > 0)) return util_fail(err, UTIL_EINVAL, "profile: no usable TF32 GEMM times to fit peak_flops_tf32");
    x = num / den;
    gpu->peak_flops_tf32 = 1 / x;
    for (int i = 0; i < p->n_gemm; i++) {
        const cost_profile_gemm *g = &p->gemm[i];
        double r = cost_gemm_time_in(gpu, COST_MATH_TF32, g->m, g->n, g->k) / p->gemm_tf32_s[i] - 1;
        sq += r * r;
    }
    p->tf32_fit_rms = sqrt(sq / p->n_gemm);
    return UTIL_OK;
}

/* A unit's peak from a measured rate: FLOP/cycle x clock x units (a CPU
 * rank's cores, a GPU's SMs), the FLOP/cycle per unit of `rate` rounded up
 * to a power of two (*fpc; 0 and the rate itself where no clock is known). */
static double rounded_peak(const cost_profile *p, double rate, double *fpc)
{
    double hz = p->cuda ? p->dev.clock_hz : p->cpu_hz;
    double units = p->cuda ? p->dev.sms : fmin((double)p->blas_threads, (double)p->cpus);
    *fpc = hz > 0 && units > 0 ? pow(2, ceil(log2(rate / (hz * units)))) : 0;
    return *fpc > 0 ? *fpc * hz * units : rate;
}

/* gpu.gemm_bf16 from the grid's times through linear_forward_bf16 (bf16-mixed
 * and -autocast's linears): peak_flops the tensor cores' peak by the fp32
 * peak's rule from the best of their rates (what MFU is quoted against:
 * cost_gpu_mfu_peak), each shape's efficiency its rate / that, on the grid's
 * axes; the planner prices the dhp target's bf16 GEMMs from them
 * (costdb/model.c). No fit: the grid gives each measured shape's time back,
 * whatever the peak. Not a full grid: no gemm_bf16 (as no gemm_grid). */
static int fit_gemm_bf16(cost_profile *p, char *err)
{
    double y[COST_PROFILE_MAX_GEMM], best = 0;
    for (int i = 0; i < p->n_gemm; i++) {
        if (!(p->gemm_bf16_s[i] > 0)) return util_fail(err, UTIL_EINVAL, "profile: no bf16 GEMM time for shape %d", i);
        const cost_profile_gemm *g = &p->gemm[i];
        y[i] = 2.0 * g->m * g->n * g->k / less_launch(p->gemm_bf16_s[i], p->launch_s);
        best = fmax(best, y[i]);
    }
    cost_gemm_terms *t = &p->gpu.gemm_bf16;
    double fpc;
    p->gemm_bf16_best = best;
    t->peak_flops = rounded_peak(p, best, &fpc);
    measured_grid(p, y, t->peak_flops, &t->grid);
    t->measured = t->grid.n_m > 0 && best > 0;
    return UTIL_OK;
}

/* gpu.attn_bf16 from the bf16 kernel's times of the attention shapes: the
 * attn_* fit without a peak (the tensor cores' bf16 rate is not measured:
 * the seconds per FLOP only pinned at >= 0), which is how the planner prices
 * the dhp target's attention under bf16-mixed and -autocast. */
static int fit_attn_bf16(cost_profile *p, char *err)
{
    cost_profile_attn a[COST_PROFILE_MAX_ATTN];
    for (int i = 0; i < p->n_attn; i++) {
        a[i] = p->attn[i];
        a[i].fwd_s = p->attn_bf16_fwd_s[i];
        a[i].bwd_s = p->attn_bf16_bwd_s[i];
    }
    attn_less_launch(a, p->n_attn, p->launch_s);
    cost_attn_fit f;
    char why[UTIL_ERR_LEN];
    int rc = cost_profile_fit_attention(a, p->n_attn, HUGE_VAL, &f, why);
    if (rc) return util_fail(err, rc, "profile: the bf16 attention's times: %s", why);
    p->gpu.attn_bf16 = (cost_attn_terms){true, f.flop_s, f.score_s, f.bwd_score_s, f.row_s, f.bwd_row_s};
    p->attn_bf16_fit_rms = f.rms_rel;
    return UTIL_OK;
}

int cost_prof_derive(cost_profile *p, char *err)
{
    double m[COST_PROFILE_MAX_GEMM], n[COST_PROFILE_MAX_GEMM], k[COST_PROFILE_MAX_GEMM], y[COST_PROFILE_MAX_GEMM];
    double y_wave[COST_PROFILE_MAX_GEMM];
    cost_gpu *gpu = &p->gpu;
    memset(gpu, 0, sizeof *gpu);
    /* A GPU's SMs: the cost model's wave term (costdb/model.c), which
     * multiplies gemm_eff_max s(m) s(n) s(k); the fit takes each measured
     * rate over its shape's wave term so that the model gives it back. */
    gpu->sm_count = p->cuda && p->dev.sms > 0 ? p->dev.sms : 0;
    for (int i = 0; i < p->n_gemm; i++) {
        const cost_profile_gemm *g = &p->gemm[i];
        m[i] = g->m; n[i] = g->n; k[i] = g->k;
        y[i] = 2.0 * g->m * g->n * g->k / less_launch(g->seconds, p->launch_s);
        y_wave[i] = y[i] / cost_gemm_wave_efficiency(gpu, m[i], n[i], k[i]);
    }
    int rc = cost_profile_fit_gemm(m, n, k, y_wave, p->n_gemm, &p->gemm_rate_max, &gpu->gemm_half, &p->gemm_fit_rms, err);
    if (rc) return rc;
    /* The peak (rounded_peak) of the fitted large-shape rate or of the best
     * measured shape, whichever is higher. */
    double best = p->gemm_rate_max;
    for (int i = 0; i < p->n_gemm; i++) best = fmax(best, y[i]);
    p->core_share = p->cuda ? p->dev.sms : fmin((double)p->blas_threads, (double)p->cpus);
    gpu->peak_flops = rounded_peak(p, best, &p->flops_per_cycle);
    gpu->gemm_eff_max = fmin(1.0, p->gemm_rate_max / gpu->peak_flops);
    cost_attn_fit af;
    cost_profile_attn attn[COST_PROFILE_MAX_ATTN];
    memcpy(attn, p->attn, (size_t)p->n_attn * sizeof *attn);
    attn_less_launch(attn, p->n_attn, p->launch_s);
    if ((rc = cost_profile_fit_attention(attn, p->n_attn, gpu->peak_flops, &af, err))) return rc;
    gpu->attn_eff = af.attn_eff;
    gpu->attn_score_s = af.score_s;
    gpu->attn_bwd_score_s = af.bwd_score_s;
    gpu->attn_row_s = af.row_s;
    gpu->attn_bwd_row_s = af.bwd_row_s;
    p->attn_fit_rms = af.rms_rel;
    if (p->attn_bf16 && (rc = fit_attn_bf16(p, err))) return rc;
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
        snprintf(gpu->name, sizeof gpu->name, COST_CPU_DEVICE_PREFIX "%.59s", p->host);
    }
    gpu->mem_eff = fmin(1.0, p->ew_bw / gpu->hbm_bw);
    gpu->kernel_launch_s = p->launch_s;
    measured_grid(p, y, gpu->peak_flops, &gpu->grid);
    gpu->ew = p->ew;
    if (p->tf32 && (rc = fit_tf32_peak(p, err))) return rc;
    if (p->gemm_bf16 && (rc = fit_gemm_bf16(p, err))) return rc;
    return cost_gpu_validate(gpu, "profile", err);
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
