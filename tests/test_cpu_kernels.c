/* CPU backend speed-ups keep results bit-identical: the tiled, vectorized and
 * threaded kernels (attention forward/backward, AdamW, SwiGLU, scale/add) give the
 * same bits as plain row-by-row float loops, at 1, 2 and 3 threads (the pool
 * follows openblas_set_num_threads); the blocked sum of squares gives the same
 * value at every thread count and matches a long-double sum. The Whisper-style
 * kernels: im2col + linear against a written-out conv1d (with the halo of a
 * slice), col2im and the row pooling's backward as adjoints of their
 * forwards (LayerNorm's finite differences: test_executor.c). */
#include "test.h"
#include "executor/backend.h"

#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rs = 7;
static float ur(void)  /* uniform in [-1, 1) */
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rs >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static float *rnd(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = scale * ur();
    return x;
}
static float *dup(const float *x, size_t n)
{
    float *y = malloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}
static bool same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof *a); }

static float dot_ref(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Row by row, head by head, key tiles of EX_ATT_TILE with an online softmax. */
static void att_forward_ref(float *out, float *lse, const float *q, const float *k, const float *v,
                            const int *cu, int nseq, int H, int Hkv, int hd, bool causal)
{
    float scale = 1.0f / sqrtf((float)hd), sc[EX_ATT_TILE], acc[EX_MAX_HEAD_DIM];
    for (int sq = 0; sq < nseq; sq++) {
        int s0 = cu[sq], len = cu[sq + 1] - s0;
        for (int r = 0; r < len; r++)
            for (int h = 0; h < H; h++) {
                const float *qr = q + ((size_t)(s0 + r) * H + h) * hd;
                int kvh = h / (H / Hkv), kend = causal ? r + 1 : len;
                float m = -INFINITY, l = 0;
                for (int i = 0; i < hd; i++) acc[i] = 0;
                for (int j0 = 0; j0 < kend; j0 += EX_ATT_TILE) {
                    int jn = kend - j0 < EX_ATT_TILE ? kend - j0 : EX_ATT_TILE;
                    float mt = -INFINITY;
                    for (int jj = 0; jj < jn; jj++) {
                        sc[jj] = dot_ref(qr, k + ((size_t)(s0 + j0 + jj) * Hkv + kvh) * hd, hd) * scale;
                        if (sc[jj] > mt) mt = sc[jj];
                    }
                    float mnew = m > mt ? m : mt, corr = expf(m - mnew);
                    l *= corr;
                    for (int i = 0; i < hd; i++) acc[i] *= corr;
                    for (int jj = 0; jj < jn; jj++) {
                        const float *vj = v + ((size_t)(s0 + j0 + jj) * Hkv + kvh) * hd;
                        float p = expf(sc[jj] - mnew);
                        l += p;
                        for (int i = 0; i < hd; i++) acc[i] += p * vj[i];
                    }
                    m = mnew;
                }
                float *o = out + ((size_t)(s0 + r) * H + h) * hd;
                for (int i = 0; i < hd; i++) o[i] = acc[i] / l;
                lse[(size_t)(s0 + r) * H + h] = m + logf(l);
            }
    }
}

/* Row by row, head by head, key by key. */
static void att_backward_ref(float *dq, float *dk, float *dv, const float *dout, const float *q,
                             const float *k, const float *v, const float *out, const float *lse,
                             const int *cu, int nseq, int H, int Hkv, int hd, bool causal)
{
    float scale = 1.0f / sqrtf((float)hd);
    for (int sq = 0; sq < nseq; sq++) {
        int s0 = cu[sq], len = cu[sq + 1] - s0;
        for (int r = 0; r < len; r++)
            for (int h = 0; h < H; h++) {
                size_t qo = ((size_t)(s0 + r) * H + h) * hd;
                float D = dot_ref(dout + qo, out + qo, hd), L = lse[(size_t)(s0 + r) * H + h];
                int kvh = h / (H / Hkv), kend = causal ? r + 1 : len;
                for (int j = 0; j < kend; j++) {
                    size_t ko = ((size_t)(s0 + j) * Hkv + kvh) * hd;
                    float p = expf(dot_ref(q + qo, k + ko, hd) * scale - L);
                    float ds = p * (dot_ref(dout + qo, v + ko, hd) - D) * scale;
                    for (int i = 0; i < hd; i++) {
                        dv[ko + i] += p * dout[qo + i];
                        dq[qo + i] += ds * k[ko + i];
                        dk[ko + i] += ds * q[qo + i];
                    }
                }
            }
    }
}

TEST(cpu_kernels_attention_bit_identical_to_row_loops_at_1_2_3_threads)
{
    /* Sequences longer than a tile (online softmax and causal tiles cross), GQA,
     * and enough work for the threaded path; two sequences, then one (its heads
     * split over the threads, each writing its slice of the same dk, dv rows). */
    const int cus[2][3] = { { 0, 150, 220 }, { 0, 220, 220 } }, n = 220, H = 4, Hkv = 2, hd = 16;
    size_t qn = (size_t)n * H * hd, kn = (size_t)n * Hkv * hd, ln = (size_t)n * H;
    float *q = rnd(qn, 2), *k = rnd(kn, 2), *v = rnd(kn, 1), *g = rnd(qn, 1);
    float *o_ref = calloc(qn, 4), *l_ref = calloc(ln, 4), *o = calloc(qn, 4), *l = calloc(ln, 4);
    float *dq_ref = calloc(qn, 4), *dk_ref = calloc(kn, 4), *dv_ref = calloc(kn, 4);
    float *dq = calloc(qn, 4), *dk = calloc(kn, 4), *dv = calloc(kn, 4);
    const ex_backend *be = ex_backend_cpu();
    int saved = openblas_get_num_threads();
    bool ok = true;
    char what[160] = "";
    for (int c = 0; c < 4 && ok; c++) {
        bool causal = c % 2 == 1;
        const int *cu = cus[c / 2], nseq = c < 2 ? 2 : 1;
        att_forward_ref(o_ref, l_ref, q, k, v, cu, nseq, H, Hkv, hd, causal);
        memset(dq_ref, 0, qn * 4); memset(dk_ref, 0, kn * 4); memset(dv_ref, 0, kn * 4);
        att_backward_ref(dq_ref, dk_ref, dv_ref, g, q, k, v, o_ref, l_ref, cu, nseq, H, Hkv, hd, causal);
        for (int t = 1; t <= 3 && ok; t++) {
            openblas_set_num_threads(t);
            be->attention_forward(o, l, q, k, v, cu, nseq, H, Hkv, hd, causal);
            memset(dq, 0, qn * 4); memset(dk, 0, kn * 4); memset(dv, 0, kn * 4);
            be->attention_backward(dq, dk, dv, g, q, k, v, o, l, cu, nseq, H, Hkv, hd, causal);
            ok = same(o, o_ref, qn) && same(l, l_ref, ln) && same(dq, dq_ref, qn) &&
                 same(dk, dk_ref, kn) && same(dv, dv_ref, kn);
            if (!ok) snprintf(what, sizeof what, "%d sequences, causal %d, %d threads: out %d lse %d dq %d dk %d dv %d",
                              nseq, c % 2, t, same(o, o_ref, qn), same(l, l_ref, ln), same(dq, dq_ref, qn),
                              same(dk, dk_ref, kn), same(dv, dv_ref, kn));
        }
    }
    openblas_set_num_threads(saved);
    free(q); free(k); free(v); free(g); free(o_ref); free(l_ref); free(o); free(l);
    free(dq_ref); free(dk_ref); free(dv_ref); free(dq); free(dk); free(dv);
    CHECK_MSG(ok, "differs from the row-by-row loops (1 = same): %s", what);
}

TEST(cpu_kernels_elementwise_bit_identical_to_plain_loops_at_1_2_3_threads)
{
    const size_t n = 200003;   /* several grains, not a multiple of the vector width */
    float *p0 = rnd(n, 1), *g = rnd(n, 1), *m0 = rnd(n, 0.1f), *v0 = rnd(n, 0.1f), *u = rnd(n, 2);
    for (size_t i = 0; i < n; i++) v0[i] = v0[i] * v0[i];
    /* references */
    float *p_ref = dup(p0, n), *m_ref = dup(m0, n), *v_ref = dup(v0, n);
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, c1 = 0.271f, c2 = 0.00399f;
    float step = lr / c1, sc2 = sqrtf(c2);
    for (size_t i = 0; i < n; i++) {
        p_ref[i] *= 1.0f - lr * wd;
        m_ref[i] = b1 * m_ref[i] + (1.0f - b1) * g[i];
        v_ref[i] = b2 * v_ref[i] + (1.0f - b2) * g[i] * g[i];
        p_ref[i] -= step * m_ref[i] / (sqrtf(v_ref[i]) / sc2 + eps);
    }
    float *h_ref = malloc(n * 4), *dg_ref = dup(m0, n), *du_ref = dup(v0, n);
    for (size_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-g[i]));
        h_ref[i] = g[i] * s * u[i];
        du_ref[i] += p0[i] * g[i] * s;
        dg_ref[i] += p0[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
    float *y_ref = dup(u, n);
    for (size_t i = 0; i < n; i++) { y_ref[i] += g[i]; y_ref[i] *= 0.37f; }
    const ex_backend *be = ex_backend_cpu();
    int saved = openblas_get_num_threads();
    char what[96] = "";
    for (int t = 1; t <= 3 && !what[0]; t++) {
        openblas_set_num_threads(t);
        float *p = dup(p0, n), *m = dup(m0, n), *v = dup(v0, n), *h = malloc(n * 4);
        float *dg = dup(m0, n), *du = dup(v0, n), *y = dup(u, n);
        be->adamw(p, g, m, v, n, lr, b1, b2, eps, wd, c1, c2);
        be->swiglu_forward(h, g, u, n);
        be->swiglu_backward(dg, du, p0, g, u, n);
        be->add_inplace(y, g, n);
        be->scale_inplace(y, 0.37f, n);
        if (!same(p, p_ref, n) || !same(m, m_ref, n) || !same(v, v_ref, n)) snprintf(what, sizeof what, "adamw at %d threads", t);
        else if (!same(h, h_ref, n)) snprintf(what, sizeof what, "swiglu_forward at %d threads", t);
        else if (!same(dg, dg_ref, n) || !same(du, du_ref, n)) snprintf(what, sizeof what, "swiglu_backward at %d threads", t);
        else if (!same(y, y_ref, n)) snprintf(what, sizeof what, "add_inplace / scale_inplace at %d threads", t);
        be->zero(y, n);
        for (size_t i = 0; i < n && !what[0]; i++)
            if (y[i] != 0) snprintf(what, sizeof what, "zero at %d threads", t);
        free(p); free(m); free(v); free(h); free(dg); free(du); free(y);
    }
    openblas_set_num_threads(saved);
    free(p0); free(g); free(m0); free(v0); free(u); free(p_ref); free(m_ref); free(v_ref);
    free(h_ref); free(dg_ref); free(du_ref); free(y_ref);
    CHECK_MSG(!what[0], "%s differs from the plain loop", what);
}

/* Rows by index: a gather of scattered rows (a row twice, rows out of
 * order) and the scatter-add back of distinct rows, over more rows than one
 * thread's grain, against the row-by-row copies and adds they replace. */
TEST(cpu_kernels_gather_scatter_rows_match_row_loops_at_1_2_3_threads)
{
    const int N = 3001, n = 2500, d = 67;
    float *src = rnd((size_t)N * d, 1), *dst0 = rnd((size_t)N * d, 1), *g = rnd((size_t)n * d, 1);
    int *gather = malloc(n * sizeof *gather), *scatter = malloc(n * sizeof *scatter);
    for (int i = 0; i < n; i++) {
        gather[i] = (i * 37 + 5) % N;           /* N and 37 coprime: distinct, out of order */
        scatter[i] = gather[i];
    }
    gather[7] = gather[3];                      /* gathering may repeat a row */
    float *got_ref = malloc((size_t)n * d * sizeof *got_ref), *dst_ref = dup(dst0, (size_t)N * d);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) {
            got_ref[(size_t)i * d + j] = src[(size_t)gather[i] * d + j];
            dst_ref[(size_t)scatter[i] * d + j] += g[(size_t)i * d + j];
        }
    const ex_backend *be = ex_backend_cpu();
    int saved = openblas_get_num_threads();
    char what[64] = "";
    for (int t = 1; t <= 3 && !what[0]; t++) {
        openblas_set_num_threads(t);
        float *got = rnd((size_t)n * d, 1), *dst = dup(dst0, (size_t)N * d);
        be->gather_rows(got, src, gather, n, d);
        be->scatter_add_rows(dst, g, scatter, n, d);
        if (!same(got, got_ref, (size_t)n * d)) snprintf(what, sizeof what, "gather_rows at %d threads", t);
        else if (!same(dst, dst_ref, (size_t)N * d)) snprintf(what, sizeof what, "scatter_add_rows at %d threads", t);
        free(got); free(dst);
    }
    openblas_set_num_threads(saved);
    free(src); free(dst0); free(g); free(gather); free(scatter); free(got_ref); free(dst_ref);
    CHECK_MSG(!what[0], "%s differs from the row-by-row loop", what);
}

TEST(cpu_kernels_sumsq_same_at_every_thread_count)
{
    const size_t n = 3000017;
    float *x = rnd(n, 1);
    long double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (long double)x[i] * x[i];
    const ex_backend *be = ex_backend_cpu();
    int saved = openblas_get_num_threads();
    double s[3];
    for (int t = 1; t <= 3; t++) {
        openblas_set_num_threads(t);
        s[t - 1] = be->sumsq(x, n);
    }
    openblas_set_num_threads(saved);
    double small = be->sumsq(x, 5);
    free(x);
    CHECK(s[0] == s[1] && s[0] == s[2]);
    CHECK_NEAR(s[0], (double)ref, 1e-13);
    CHECK(small > 0);
}

/* ---- Whisper-style kernels (executor/cpu_kernels_whisper.c) ---- */

static double dotd(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* conv1d through im2col + linear equals the convolution written out (torch
 * Conv1d: weight [o, C, k], zero padding), at stride 1 and 2, also for an
 * output range that starts inside the sequence over an input slice (the
 * Ulysses halo); col2im is im2col's adjoint. */
TEST(cpu_kernels_im2col_is_conv1d_and_col2im_its_adjoint)
{
    const ex_backend *be = ex_backend_cpu();
    const int T = 13, C = 5, k = 3, pad = 1, O = 4;
    float *x = rnd((size_t)T * C, 1), *w = rnd((size_t)O * C * k, 1), *bias = rnd((size_t)O, 1);
    char what[96] = "";
    for (int stride = 1; stride <= 2 && !what[0]; stride++) {
        int Tout = (T + 2 * pad - k) / stride + 1;
        /* rows [t0, t0 + n) from the input slice [x0, x0 + nx) that covers them */
        int cases[2][2] = { { 0, Tout }, { 2, Tout - 3 } };
        for (int c = 0; c < 2 && !what[0]; c++) {
            int t0 = cases[c][0], n = cases[c][1];
            int x0 = t0 * stride - pad > 0 ? t0 * stride - pad : 0;
            int xe = (t0 + n - 1) * stride - pad + k < T ? (t0 + n - 1) * stride - pad + k : T;
            float *col = calloc((size_t)n * C * k, 4), *y = calloc((size_t)n * O, 4);
            be->im2col1d(col, x + (size_t)x0 * C, n, C, k, stride, pad, t0, x0, xe - x0);
            be->linear_forward(y, col, w, bias, n, C * k, O);
            for (int i = 0; i < n && !what[0]; i++)
                for (int o = 0; o < O; o++) {
                    double ref = bias[o];
                    for (int ch = 0; ch < C; ch++)
                        for (int j = 0; j < k; j++) {
                            int s = (t0 + i) * stride - pad + j;
                            if (s >= 0 && s < T) ref += (double)w[(o * C + ch) * k + j] * x[s * C + ch];
                        }
                    if (fabs(ref - y[i * O + o]) > 1e-5)
                        snprintf(what, sizeof what, "stride %d case %d: out[%d, %d] %g vs %g", stride, c, i, o, y[i * O + o], ref);
                }
            /* adjoint: <im2col(x), r> == <x, col2im(r)> */
            float *r = rnd((size_t)n * C * k, 1), *dx = calloc((size_t)(xe - x0) * C, 4);
            be->col2im1d(dx, r, n, C, k, stride, pad, t0, x0, xe - x0);
            double lhs = dotd(col, r, (size_t)n * C * k), rhs = dotd(x + (size_t)x0 * C, dx, (size_t)(xe - x0) * C);
            if (!what[0] && fabs(lhs - rhs) > 1e-5 * (fabs(lhs) + 1))
                snprintf(what, sizeof what, "stride %d case %d: <im2col x, r> %g != <x, col2im r> %g", stride, c, lhs, rhs);
            free(col); free(y); free(r); free(dx);
        }
    }
    free(x); free(w); free(bias);
    CHECK_MSG(!what[0], "%s", what);
}

TEST(cpu_kernels_avgpool_rows_mean_and_adjoint)
{
    const ex_backend *be = ex_backend_cpu();
    const int m = 6, p = 3, d = 7;
    float *x = rnd((size_t)m * p * d, 1), *y = calloc((size_t)m * d, 4), *r = rnd((size_t)m * d, 1);
    float *dx = calloc((size_t)m * p * d, 4);
    be->avgpool_rows_forward(y, x, m, p, d);
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < d; j++)
            worst = fmax(worst, fabs(y[i * d + j] - (x[(i * p) * d + j] + x[(i * p + 1) * d + j] + x[(i * p + 2) * d + j]) / 3.0));
    be->avgpool_rows_backward(dx, r, m, p, d);
    double lhs = dotd(y, r, (size_t)m * d), rhs = dotd(x, dx, (size_t)m * p * d);
    free(x); free(y); free(r); free(dx);
    CHECK_MSG(worst < 1e-6, "pooled rows differ from the mean by %g", worst);
    CHECK_MSG(fabs(lhs - rhs) < 1e-5 * (fabs(lhs) + 1), "<pool x, r> %g != <x, pool^T r> %g", lhs, rhs);
}

/* CLIP's quick GELU against its formula x sigmoid(1.702 x) (transformers
 * QuickGELUActivation) and its backward against central differences. */
TEST(cpu_kernels_quick_gelu_formula_and_derivative)
{
    const ex_backend *be = ex_backend_cpu();
    const size_t n = 257;
    float *x = rnd(n, 4), *y = calloc(n, 4), *dy = rnd(n, 1), *dx = calloc(n, 4);
    be->quick_gelu_forward(y, x, n);
    be->quick_gelu_backward(dx, dy, x, n);
    double worst_f = 0, worst_b = 0;
    for (size_t i = 0; i < n; i++) {
        double xi = x[i], h = 1e-3;
        worst_f = fmax(worst_f, fabs(y[i] - xi / (1 + exp(-1.702 * xi))));
        double num = ((xi + h) / (1 + exp(-1.702 * (xi + h))) - (xi - h) / (1 + exp(-1.702 * (xi - h)))) / (2 * h);
        worst_b = fmax(worst_b, fabs(dx[i] - dy[i] * num));
    }
    free(x); free(y); free(dy); free(dx);
    CHECK_MSG(worst_f < 1e-5, "forward differs from x sigmoid(1.702 x) by %g", worst_f);
    CHECK_MSG(worst_b < 1e-4, "backward differs from the central difference by %g", worst_b);
}
