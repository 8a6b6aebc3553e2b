/* executor tests: each kernel's backward vs central finite differences, flash
 * attention vs naive attention, window attention vs per-window attention,
 * patch order, LR schedule, model-level checks, and (driven by
 * tests/t_torch_ref.sh) loss, gradients and 5 AdamW steps vs PyTorch. */
#include "test.h"
#include "executor/executor.h"
#include "executor/backend.h"
#include "tests/test_ex.h"

#include <stdlib.h>

/* ------------------------------------------------------------ helpers */

static uint64_t rng_state = 42;
static float urand(void)  /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static void fill(float *x, size_t n, float scale) { for (size_t i = 0; i < n; i++) x[i] = scale * urand(); }
static float *rnd(size_t n, float scale) { float *x = malloc(n * sizeof *x); fill(x, n, scale); return x; }
static float *zeros(size_t n) { return calloc(n, sizeof(float)); }

static double dot_d(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* Norm-wise relative error ||a - b|| / ||b||. */
static double rel_err(const float *a, const double *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) { d += (a[i] - b[i]) * (a[i] - b[i]); r += b[i] * b[i]; }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* Central differences of loss() in each element of x; returns ||num - g|| / ||num||. */
typedef double (*loss_fn)(void);
static double fd_rel_err(loss_fn loss, float *x, const float *g, size_t n, float eps)
{
    double *num = calloc(n ? n : 1, sizeof *num);
    for (size_t i = 0; i < n; i++) {
        float old = x[i];
        x[i] = old + eps;
        double lp = loss();
        x[i] = old - eps;
        double lm = loss();
        x[i] = old;
        num[i] = (lp - lm) / (2.0 * eps);
    }
    double e = rel_err(g, num, n);
    free(num);
    return e;
}

#define FD_EPS 1e-2f
#define FD_TOL 1e-2

/* --------------------------------------------------- kernel gradients */

static struct { int n, in, o; float *x, *w, *b, *r, *out; } L;
static double loss_linear(void)
{
    ex_backend_cpu()->linear_forward(L.out, L.x, L.w, L.b, L.n, L.in, L.o);
    return dot_d(L.out, L.r, (size_t)L.n * L.o);
}

TEST(executor_linear_backward_matches_finite_differences)
{
    L.n = 5; L.in = 7; L.o = 6;
    L.x = rnd(35, 1); L.w = rnd(42, 1); L.b = rnd(6, 1); L.r = rnd(30, 1); L.out = zeros(30);
    float *dx = zeros(35), *dw = zeros(42), *db = zeros(6);
    ex_backend_cpu()->linear_backward(dx, dw, db, L.r, L.x, L.w, L.n, L.in, L.o);
    double ex = fd_rel_err(loss_linear, L.x, dx, 35, FD_EPS);
    double ew = fd_rel_err(loss_linear, L.w, dw, 42, FD_EPS);
    double eb = fd_rel_err(loss_linear, L.b, db, 6, FD_EPS);
    free(L.x); free(L.w); free(L.b); free(L.r); free(L.out); free(dx); free(dw); free(db);
    CHECK_MSG(ex < FD_TOL && ew < FD_TOL && eb < FD_TOL, "rel err x %g w %g b %g", ex, ew, eb);
}

static struct { int n, d; float *x, *w, *r, *out, *rstd; } R;
static double loss_rmsnorm(void)
{
    ex_backend_cpu()->rmsnorm_forward(R.out, R.rstd, R.x, R.w, R.n, R.d, 1e-6f);
    return dot_d(R.out, R.r, (size_t)R.n * R.d);
}

TEST(executor_rmsnorm_backward_matches_finite_differences)
{
    R.n = 4; R.d = 9;
    R.x = rnd(36, 1); R.w = rnd(9, 1); R.r = rnd(36, 1); R.out = zeros(36); R.rstd = zeros(4);
    loss_rmsnorm();
    float *dx = zeros(36), *dw = zeros(9);
    ex_backend_cpu()->rmsnorm_backward(dx, dw, R.r, R.x, R.w, R.rstd, R.n, R.d);
    double ex = fd_rel_err(loss_rmsnorm, R.x, dx, 36, FD_EPS);
    double ew = fd_rel_err(loss_rmsnorm, R.w, dw, 9, FD_EPS);
    free(R.x); free(R.w); free(R.r); free(R.out); free(R.rstd); free(dx); free(dw);
    CHECK_MSG(ex < FD_TOL && ew < FD_TOL, "rel err x %g w %g", ex, ew);
}

static struct { int n, d; float *x, *w, *b, *r, *out, *mean, *rstd; } LN;
static double loss_layernorm(void)
{
    ex_backend_cpu()->layernorm_forward(LN.out, LN.mean, LN.rstd, LN.x, LN.w, LN.b, LN.n, LN.d, 1e-5f);
    return dot_d(LN.out, LN.r, (size_t)LN.n * LN.d);
}

/* LayerNorm (the audio encoder's): the forward against the definition
 * (torch.nn.LayerNorm, biased variance) in double, the backward against
 * central differences; NULL gradients leave the others unchanged. */
TEST(executor_layernorm_matches_definition_and_finite_differences)
{
    LN.n = 5; LN.d = 11;
    size_t nd = (size_t)LN.n * LN.d;
    LN.x = rnd(nd, 2); LN.w = rnd((size_t)LN.d, 1); LN.b = rnd((size_t)LN.d, 1); LN.r = rnd(nd, 1);
    LN.out = zeros(nd); LN.mean = zeros((size_t)LN.n); LN.rstd = zeros((size_t)LN.n);
    loss_layernorm();
    double worst = 0;
    for (int r = 0; r < LN.n; r++) {
        double mu = 0, var = 0;
        for (int j = 0; j < LN.d; j++) mu += LN.x[r * LN.d + j];
        mu /= LN.d;
        for (int j = 0; j < LN.d; j++) var += (LN.x[r * LN.d + j] - mu) * (LN.x[r * LN.d + j] - mu);
        var /= LN.d;
        for (int j = 0; j < LN.d; j++) {
            double y = (LN.x[r * LN.d + j] - mu) / sqrt(var + 1e-5) * LN.w[j] + LN.b[j];
            worst = fmax(worst, fabs(y - LN.out[r * LN.d + j]));
        }
    }
    float *dx = zeros(nd), *dw = zeros((size_t)LN.d), *db = zeros((size_t)LN.d), *dx2 = zeros(nd), *db2 = zeros((size_t)LN.d);
    const ex_backend *be = ex_backend_cpu();
    be->layernorm_backward(dx, dw, db, LN.r, LN.x, LN.w, LN.mean, LN.rstd, LN.n, LN.d);
    be->layernorm_backward(dx2, NULL, NULL, LN.r, LN.x, LN.w, LN.mean, LN.rstd, LN.n, LN.d);
    be->layernorm_backward(NULL, NULL, db2, LN.r, LN.x, LN.w, LN.mean, LN.rstd, LN.n, LN.d);
    double ex = fd_rel_err(loss_layernorm, LN.x, dx, nd, FD_EPS);
    double ew = fd_rel_err(loss_layernorm, LN.w, dw, (size_t)LN.d, FD_EPS);
    double eb = fd_rel_err(loss_layernorm, LN.b, db, (size_t)LN.d, FD_EPS);
    bool nulls = !memcmp(dx, dx2, nd * 4) && !memcmp(db, db2, (size_t)LN.d * 4);
    free(LN.x); free(LN.w); free(LN.b); free(LN.r); free(LN.out); free(LN.mean); free(LN.rstd);
    free(dx); free(dw); free(db); free(dx2); free(db2);
    CHECK_MSG(worst < 1e-5, "forward differs from the definition by %g", worst);
    CHECK_MSG(ex < FD_TOL && ew < FD_TOL && eb < FD_TOL, "rel err x %g w %g b %g", ex, ew, eb);
    CHECK_MSG(nulls, "NULL gradients changed the others");
}

static struct { int n, nh, hd; float *x, *cos, *sin, *r, *tmp; } Q;
static double loss_rope(void)
{
    size_t sz = (size_t)Q.n * Q.nh * Q.hd;
    memcpy(Q.tmp, Q.x, sz * sizeof(float));
    ex_backend_cpu()->rope_forward(Q.tmp, Q.cos, Q.sin, Q.n, Q.nh, Q.hd);
    return dot_d(Q.tmp, Q.r, sz);
}

TEST(executor_rope_backward_matches_finite_differences)
{
    Q.n = 3; Q.nh = 2; Q.hd = 8;
    size_t sz = 48;
    Q.x = rnd(sz, 1); Q.r = rnd(sz, 1); Q.tmp = zeros(sz);
    Q.cos = zeros(12); Q.sin = zeros(12);
    for (int i = 0; i < 12; i++) { float a = 3.0f * urand(); Q.cos[i] = cosf(a); Q.sin[i] = sinf(a); }
    float *dx = malloc(sz * sizeof *dx);
    memcpy(dx, Q.r, sz * sizeof *dx);
    ex_backend_cpu()->rope_backward(dx, Q.cos, Q.sin, Q.n, Q.nh, Q.hd);
    double e = fd_rel_err(loss_rope, Q.x, dx, sz, FD_EPS);
    free(Q.x); free(Q.r); free(Q.tmp); free(Q.cos); free(Q.sin); free(dx);
    CHECK_MSG(e < FD_TOL, "rel err %g", e);
}

static struct { int n; float *g, *u, *r, *h; } S;
static double loss_swiglu(void)
{
    ex_backend_cpu()->swiglu_forward(S.h, S.g, S.u, (size_t)S.n);
    return dot_d(S.h, S.r, (size_t)S.n);
}
static double loss_gelu(void)
{
    ex_backend_cpu()->gelu_forward(S.h, S.g, (size_t)S.n);
    return dot_d(S.h, S.r, (size_t)S.n);
}

TEST(executor_swiglu_and_gelu_backward_match_finite_differences)
{
    S.n = 40;
    S.g = rnd(40, 3); S.u = rnd(40, 2); S.r = rnd(40, 1); S.h = zeros(40);
    float *dg = zeros(40), *du = zeros(40), *dx = zeros(40);
    ex_backend_cpu()->swiglu_backward(dg, du, S.r, S.g, S.u, 40);
    double eg = fd_rel_err(loss_swiglu, S.g, dg, 40, FD_EPS);
    double eu = fd_rel_err(loss_swiglu, S.u, du, 40, FD_EPS);
    ex_backend_cpu()->gelu_backward(dx, S.r, S.g, 40);
    double ex = fd_rel_err(loss_gelu, S.g, dx, 40, FD_EPS);
    free(S.g); free(S.u); free(S.r); free(S.h); free(dg); free(du); free(dx);
    CHECK_MSG(eg < FD_TOL && eu < FD_TOL && ex < FD_TOL, "rel err swiglu g %g u %g gelu %g", eg, eu, ex);
}

static struct { int n, V; float *z; int32_t *t; } C;
static double loss_ce(void) { return ex_backend_cpu()->cross_entropy(NULL, C.z, C.t, C.n, C.V, 1.0f); }

TEST(executor_cross_entropy_backward_matches_finite_differences)
{
    C.n = 3; C.V = 11;
    C.z = rnd(33, 2);
    int32_t t[3] = { 4, 0, 10 };
    C.t = t;
    float *dz = zeros(33);
    double l1 = ex_backend_cpu()->cross_entropy(dz, C.z, C.t, C.n, C.V, 0.5f);
    for (int i = 0; i < 33; i++) dz[i] *= 2.0f;
    double e = fd_rel_err(loss_ce, C.z, dz, 33, FD_EPS);
    double l2 = loss_ce();
    free(C.z); free(dz);
    CHECK_NEAR(l1, l2, 1e-12);
    CHECK_MSG(e < FD_TOL, "rel err %g", e);
}

static struct { int n, H, Hkv, hd, nseq; bool causal; const int *cu; float *q, *k, *v, *r, *out, *lse; } A;
static double loss_att(void)
{
    ex_backend_cpu()->attention_forward(A.out, A.lse, A.q, A.k, A.v, A.cu, A.nseq, A.H, A.Hkv, A.hd, A.causal);
    return dot_d(A.out, A.r, (size_t)A.n * A.H * A.hd);
}

static void att_fd_case(bool causal, double *eq, double *ek, double *ev)
{
    static const int cu[3] = { 0, 5, 12 };
    A.n = 12; A.H = 4; A.Hkv = 2; A.hd = 8; A.nseq = 2; A.causal = causal; A.cu = cu;
    size_t qn = 12 * 4 * 8, kn = 12 * 2 * 8;
    A.q = rnd(qn, 1); A.k = rnd(kn, 1); A.v = rnd(kn, 1); A.r = rnd(qn, 1);
    A.out = zeros(qn); A.lse = zeros(12 * 4);
    loss_att();
    float *dq = zeros(qn), *dk = zeros(kn), *dv = zeros(kn);
    ex_backend_cpu()->attention_backward(dq, dk, dv, A.r, A.q, A.k, A.v, A.out, A.lse, cu, 2, 4, 2, 8, causal);
    *eq = fd_rel_err(loss_att, A.q, dq, qn, FD_EPS);
    *ek = fd_rel_err(loss_att, A.k, dk, kn, FD_EPS);
    *ev = fd_rel_err(loss_att, A.v, dv, kn, FD_EPS);
    free(A.q); free(A.k); free(A.v); free(A.r); free(A.out); free(A.lse); free(dq); free(dk); free(dv);
}

TEST(executor_attention_backward_matches_finite_differences)
{
    for (int c = 0; c < 2; c++) {
        double eq, ek, ev;
        att_fd_case(c == 1, &eq, &ek, &ev);
        CHECK_MSG(eq < FD_TOL && ek < FD_TOL && ev < FD_TOL, "causal %d: rel err q %g k %g v %g", c, eq, ek, ev);
    }
}

/* ------------------------------------------------------ attention kernels */

/* Naive reference: materialises each sequence's score matrix, in double. */
static void naive_attention(double *out, double *lse, const float *q, const float *k, const float *v,
                            const int *cu, int nseq, int H, int Hkv, int hd, bool causal)
{
    for (int s = 0; s < nseq; s++) {
        int s0 = cu[s], len = cu[s + 1] - s0;
        double *sc = malloc((size_t)len * sizeof *sc);
        for (int r = 0; r < len; r++)
            for (int h = 0; h < H; h++) {
                const float *qr = q + ((size_t)(s0 + r) * H + h) * hd;
                int kv = h / (H / Hkv), kend = causal ? r + 1 : len;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < kend; j++) {
                    const float *kj = k + ((size_t)(s0 + j) * Hkv + kv) * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)qr[i] * kj[i];
                    sc[j] = d / sqrt((double)hd);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j < kend; j++) sum += exp(sc[j] - mx);
                double *o = out + ((size_t)(s0 + r) * H + h) * hd;
                for (int i = 0; i < hd; i++) o[i] = 0;
                for (int j = 0; j < kend; j++) {
                    const float *vj = v + ((size_t)(s0 + j) * Hkv + kv) * hd;
                    double p = exp(sc[j] - mx) / sum;
                    for (int i = 0; i < hd; i++) o[i] += p * vj[i];
                }
                lse[(size_t)(s0 + r) * H + h] = mx + log(sum);
            }
        free(sc);
    }
}

TEST(executor_flash_attention_matches_naive_attention)
{
    /* Sequences longer than EX_ATT_TILE so the online softmax crosses tiles. */
    const int cu[3] = { 0, 150, 220 }, n = 220, H = 4, Hkv = 2, hd = 8;
    size_t qn = (size_t)n * H * hd, kn = (size_t)n * Hkv * hd;
    float *q = rnd(qn, 2), *k = rnd(kn, 2), *v = rnd(kn, 1), *out = zeros(qn), *lse = zeros((size_t)n * H);
    double *ro = malloc(qn * sizeof *ro), *rl = malloc((size_t)n * H * sizeof *rl);
    double worst_o = 0, worst_l = 0;
    for (int c = 0; c < 2; c++) {
        ex_backend_cpu()->attention_forward(out, lse, q, k, v, cu, 2, H, Hkv, hd, c == 1);
        naive_attention(ro, rl, q, k, v, cu, 2, H, Hkv, hd, c == 1);
        double eo = rel_err(out, ro, qn), el = rel_err(lse, rl, (size_t)n * H);
        if (eo > worst_o) worst_o = eo;
        if (el > worst_l) worst_l = el;
    }
    free(q); free(k); free(v); free(out); free(lse); free(ro); free(rl);
    CHECK_MSG(worst_o < 1e-5 && worst_l < 1e-5, "rel err out %g lse %g", worst_o, worst_l);
}

TEST(executor_window_attention_equals_per_window_full_attention)
{
    const int n = 64, W = 16, H = 2, hd = 8;
    int cu[5];
    for (int i = 0; i <= n / W; i++) cu[i] = i * W;
    size_t qn = (size_t)n * H * hd;
    float *q = rnd(qn, 1), *k = rnd(qn, 1), *v = rnd(qn, 1), *r = rnd(qn, 1);
    float *o1 = zeros(qn), *l1 = zeros((size_t)n * H), *o2 = zeros(qn), *l2 = zeros((size_t)n * H);
    float *dq1 = zeros(qn), *dk1 = zeros(qn), *dv1 = zeros(qn), *dq2 = zeros(qn), *dk2 = zeros(qn), *dv2 = zeros(qn);
    const ex_backend *be = ex_backend_cpu();
    be->attention_forward(o1, l1, q, k, v, cu, n / W, H, H, hd, false);
    be->attention_backward(dq1, dk1, dv1, r, q, k, v, o1, l1, cu, n / W, H, H, hd, false);
    const int one[2] = { 0, W };
    for (int w = 0; w < n / W; w++) {
        size_t off = (size_t)w * W * H * hd;
        be->attention_forward(o2 + off, l2 + (size_t)w * W * H, q + off, k + off, v + off, one, 1, H, H, hd, false);
        be->attention_backward(dq2 + off, dk2 + off, dv2 + off, r + off, q + off, k + off, v + off,
                               o2 + off, l2 + (size_t)w * W * H, one, 1, H, H, hd, false);
    }
    /* And it differs from full attention over all 64 rows. */
    const int all[2] = { 0, n };
    float *o3 = zeros(qn), *l3 = zeros((size_t)n * H);
    be->attention_forward(o3, l3, q, k, v, all, 1, H, H, hd, false);
    bool same = !memcmp(o1, o2, qn * 4) && !memcmp(l1, l2, (size_t)n * H * 4) && !memcmp(dq1, dq2, qn * 4) &&
                !memcmp(dk1, dk2, qn * 4) && !memcmp(dv1, dv2, qn * 4);
    bool differs = memcmp(o1, o3, qn * 4) != 0;
    free(q); free(k); free(v); free(r); free(o1); free(l1); free(o2); free(l2); free(o3); free(l3);
    free(dq1); free(dk1); free(dv1); free(dq2); free(dk2); free(dv2);
    CHECK(same);
    CHECK(differs);
}

/* ----------------------------------------------------------- patch order */

TEST(executor_patch_positions_follow_window_and_merge_order)
{
    model_t m;
    test_tiny_vl(&m, true);
    int rows[64], cols[64];
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_patch_order(&m.mod[0], 8, 8, rows, cols, err));
    /* First merge group is the top-left 2x2 in raster order. */
    CHECK(rows[0] == 0 && cols[0] == 0 && rows[1] == 0 && cols[1] == 1 && rows[2] == 1 && cols[2] == 0 && rows[3] == 1 && cols[3] == 1);
    /* Second merge group is the next 2x2 to the right inside the first 4x4 window. */
    CHECK(rows[4] == 0 && cols[4] == 2);
    int seen[64] = { 0 };
    for (int i = 0; i < 64; i++) {
        seen[rows[i] * 8 + cols[i]]++;
        int w = i / 16, g = i / 4;
        CHECK_MSG(rows[i] / 4 == w / 2 && cols[i] / 4 == w % 2, "patch %d (%d,%d) outside window %d", i, rows[i], cols[i], w);
        CHECK_MSG(rows[i] / 2 == rows[g * 4] / 2 && cols[i] / 2 == cols[g * 4] / 2, "patch %d outside merge group %d", i, g);
    }
    for (int i = 0; i < 64; i++) CHECK_EQ_INT(seen[i], 1);
    CHECK_EQ_INT(model_patch_order(&m.mod[0], 8, 6, rows, cols, err), UTIL_EINVAL);
    CHECK(strstr(err, "grid 8x6") != NULL);
}

TEST(executor_lr_schedule_warmup_then_cosine_to_min)
{
    ex_optim_config c = { .lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 4, .total_steps = 14 };
    CHECK_NEAR(ex_lr_at(&c, 0), 2.5e-4, 1e-6);
    CHECK_NEAR(ex_lr_at(&c, 3), 1e-3, 1e-6);
    CHECK_NEAR(ex_lr_at(&c, 4), 1e-3, 1e-6);
    CHECK_NEAR(ex_lr_at(&c, 9), 5.5e-4, 1e-5);
    CHECK_NEAR(ex_lr_at(&c, 14), 1e-4, 1e-5);
    CHECK_NEAR(ex_lr_at(&c, 100), 1e-4, 1e-5);
}

/* ----------------------------------------------------------- model level */

TEST(executor_model_memory_is_accounted_per_category)
{
    model_t m;
    test_tiny_vl(&m, false);
    size_t p0 = util_mem_current(UTIL_MEM_PARAMS), g0 = util_mem_current(UTIL_MEM_GRADS), o0 = util_mem_current(UTIL_MEM_OPTIM);
    ex_model *em;
    char err[UTIL_ERR_LEN];
    CHECK_OK(ex_model_create(&m, 1, &em, err));
    size_t n = (size_t)ex_model_num_params(em);
    int64_t sum = 0;
    for (int i = 0; i < ex_param_count(em); i++) { ex_param p; ex_param_get(em, i, &p); sum += p.numel; }
    bool ok = util_mem_current(UTIL_MEM_PARAMS) - p0 == n * 4 && util_mem_current(UTIL_MEM_GRADS) - g0 == n * 4 &&
              util_mem_current(UTIL_MEM_OPTIM) - o0 == n * 8 && sum == (int64_t)n;
    ex_model_free(em);
    CHECK(ok);
    CHECK(util_mem_current(UTIL_MEM_PARAMS) == p0);
}

TEST(executor_model_rejects_unsupported_shapes_with_one_line)
{
    model_t m;
    ex_model *em;
    char err[UTIL_ERR_LEN];
    test_tiny_vl(&m, false);
    m.mod[1].kv_heads = 3;
    CHECK_EQ_INT(ex_model_create(&m, 1, &em, err), UTIL_EINVAL);
    CHECK(strstr(err, "kv_heads 3") != NULL && !strchr(err, '\n'));
    test_tiny_vl(&m, false);
    m.mod[0].norm = MODEL_NORM_LAYERNORM;   /* the merger and the LLM head are RMSNorm models */
    CHECK_EQ_INT(ex_model_create(&m, 1, &em, err), UTIL_EUNSUPPORTED);
    test_tiny_vl(&m, false);
    m.mod[0].out_hidden = 32;
    CHECK_EQ_INT(ex_model_create(&m, 1, &em, err), UTIL_EINVAL);
    CHECK(strstr(err, "out_hidden 32") != NULL);
}

TEST(executor_model_init_loss_is_log_vocab_and_deterministic)
{
    model_t m;
    test_batch tb;
    test_tiny_vl_batch(&m, true, &tb);
    ex_model *a, *b;
    char err[UTIL_ERR_LEN];
    CHECK_OK(ex_model_create(&m, 7, &a, err));
    CHECK_OK(ex_model_create(&m, 7, &b, err));
    float la, lb;
    int rc1 = ex_step_forward_backward(a, &tb.b, &la, err);
    int rc2 = ex_step_forward_backward(b, &tb.b, &lb, err);
    ex_param pa, pb;
    ex_param_get(a, 3, &pa);
    ex_param_get(b, 3, &pb);
    bool same = !memcmp(pa.grad, pb.grad, (size_t)pa.numel * 4);
    ex_model_free(a); ex_model_free(b); test_free_batch(&tb);
    CHECK(rc1 == 0 && rc2 == 0);
    CHECK(la == lb && same);
    CHECK_NEAR(la, log(272.0), 0.02);
}

TEST(executor_model_adamw_overfits_one_batch_and_raw_roundtrips)
{
    model_t m;
    test_batch tb;
    test_tiny_vl_batch(&m, false, &tb);
    ex_model *em;
    char err[UTIL_ERR_LEN];
    CHECK_OK(ex_model_create(&m, 3, &em, err));
    ex_optim_config c = { .lr = 3e-3f, .min_lr = 3e-4f, .warmup_steps = 3, .total_steps = 30,
                          .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f };
    float first = 0, loss = 0, gn;
    int rc = 0;
    for (int s = 0; s < 30 && !rc; s++) {
        rc = ex_step_forward_backward(em, &tb.b, &loss, err);
        if (!rc) rc = ex_optimizer_step(em, &c, s, &gn, NULL, err);
        if (s == 0) first = loss;
    }
    char dir[] = "/tmp/dhp-exec-XXXXXX", path[300];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/p.bin", dir);
    float l1 = 0, l2 = 0;
    if (!rc) rc = ex_params_save_raw(em, path, err);
    if (!rc) rc = ex_step_forward(em, &tb.b, &l1, err);
    ex_model *em2 = NULL;
    if (!rc) rc = ex_model_create(&m, 99, &em2, err);
    if (!rc) rc = ex_params_load_raw(em2, path, err);
    if (!rc) rc = ex_step_forward(em2, &tb.b, &l2, err);
    CHECK(test_rm_tree(dir) == 0);
    ex_model_free(em); ex_model_free(em2); test_free_batch(&tb);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_MSG(loss < 0.5f * first, "loss %g after 30 steps, first %g", loss, first);
    CHECK(l1 == l2);
}

/* The encoder and the LLM on separate instances (as on separate rank groups),
 * joined by ex_vision_forward / ex_encoder_rows_to_llm / ex_llm_forward_backward /
 * ex_encoder_rows_from_llm / ex_vision_backward,
 * give exactly the whole-model step: same loss, same gradients. */
TEST(executor_split_modules_reproduce_the_whole_step)
{
    model_t m;
    test_batch tb;
    test_tiny_vl_batch(&m, true, &tb);
    ex_model *whole = NULL, *vis = NULL, *llm = NULL;
    char err[UTIL_ERR_LEN] = "";
    float lw = 0, ls = 0;
    const float *vout, *dvis;
    int rows = 0;
    int rc = ex_model_create(&m, 5, &whole, err);
    if (!rc) rc = ex_model_create_modules(&m, 5, 1u << 0, &vis, err);
    if (!rc) rc = ex_model_create_modules(&m, 5, 1u << 1, &llm, err);
    if (!rc) rc = ex_step_forward_backward(whole, &tb.b, &lw, err);
    float *enc = NULL, *dv = NULL;
    if (!rc) rc = ex_vision_forward(vis, &tb.b, &vout, &rows, err);
    size_t nrow = (size_t)rows * m.mod[m.llm].hidden;
    if (!rc && (!(enc = malloc(nrow * sizeof *enc)) || !(dv = malloc(nrow * sizeof *dv)))) rc = UTIL_ENOMEM;
    if (!rc) rc = ex_encoder_rows_to_llm(vis, &tb.b, (const float *const[2]){ vout, NULL }, enc, err);
    if (!rc) rc = ex_llm_forward_backward(llm, &tb.b, enc, true, &ls, &dvis, err);
    if (!rc) rc = ex_encoder_rows_from_llm(vis, &tb.b, dvis, (float *const[2]){ dv, NULL }, err);
    if (!rc) rc = ex_vision_backward(vis, &tb.b, dv, err);
    free(enc);
    free(dv);
    bool same = !rc && lw == ls && test_same_buffer(whole, vis, 0, EX_BUF_GRADS) && test_same_buffer(whole, llm, 1, EX_BUF_GRADS) &&
                test_same_buffer(whole, vis, 0, EX_BUF_PARAMS) && test_same_buffer(whole, llm, 1, EX_BUF_PARAMS);
    float *p;
    size_t n;
    int missing = llm ? ex_module_buffer(llm, 0, EX_BUF_GRADS, &p, &n) : 0;
    float l3;
    int whole_step = llm ? ex_step_forward_backward(llm, &tb.b, &l3, err) : 0;
    ex_model_free(whole); ex_model_free(vis); ex_model_free(llm); test_free_batch(&tb);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(rows, 3 * 16);
    CHECK(same);
    CHECK_EQ_INT(missing, UTIL_ENOTFOUND);
    CHECK_EQ_INT(whole_step, UTIL_EINVAL);
}

TEST(executor_frozen_encoder_keeps_its_weights_and_has_no_optimizer_state)
{
    model_t m;
    test_tiny_vl(&m, false);
    m.mod[0].frozen = true;
    test_batch tb;
    test_make_batch(&tb, &m);
    char err[UTIL_ERR_LEN] = "";
    size_t o0 = util_mem_current(UTIL_MEM_OPTIM);
    ex_model *em = NULL;
    int rc = ex_model_create(&m, 2, &em, err);
    size_t optim = util_mem_current(UTIL_MEM_OPTIM) - o0;
    float *vp, *lp, loss;
    size_t vn = 0, ln = 0;
    float *v0 = NULL, *l0 = NULL;
    if (!rc) {
        ex_module_buffer(em, 0, EX_BUF_PARAMS, &vp, &vn);
        ex_module_buffer(em, 1, EX_BUF_PARAMS, &lp, &ln);
        v0 = malloc(vn * 4); l0 = malloc(ln * 4);
        memcpy(v0, vp, vn * 4); memcpy(l0, lp, ln * 4);
        ex_optim_config c = { .lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 1, .total_steps = 2,
                              .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f };
        rc = ex_step_forward_backward(em, &tb.b, &loss, err);
        if (!rc) rc = ex_optimizer_step(em, &c, 0, NULL, NULL, err);
    }
    bool vis_same = !rc && !memcmp(v0, vp, vn * 4), llm_moved = !rc && memcmp(l0, lp, ln * 4) != 0;
    float *mp;
    size_t mn;
    int no_moments = em ? ex_module_buffer(em, 0, EX_BUF_ADAM_M, &mp, &mn) : 0;
    int no_grads = em ? ex_module_buffer(em, 0, EX_BUF_GRADS, &mp, &mn) : 0;
    free(v0); free(l0);
    ex_model_free(em); test_free_batch(&tb);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(optim, ln * 8);
    CHECK_EQ_INT(no_moments, UTIL_ENOTFOUND);
    CHECK_EQ_INT(no_grads, UTIL_ENOTFOUND);
    CHECK(vis_same);
    CHECK(llm_moved);
}

/* --------------------------------------------------- PyTorch reference */

static void json_module(char *s, size_t cap, const char *key, const model_module *mm)
{
    char fl[256] = "";
    size_t n = 0;
    for (int i = 0; i < mm->n_full_layers; i++)
        n += (size_t)snprintf(fl + n, sizeof fl - n, "%s%d", i ? "," : "", mm->full_layers[i]);
    size_t len = strlen(s);
    snprintf(s + len, cap - len,
             "\"%s\": {\"layers\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"merge\": %d, "
             "\"window\": %d, \"full_layers\": [%s], \"proj_in\": %d, \"tied_embeddings\": %s},\n",
             key, mm->layers, mm->heads, mm->kv_heads, mm->head_dim, mm->merge, mm->window, fl,
             mm->proj_in, mm->tied_embeddings ? "true" : "false");
}

static int whole_step_pass(void *ctx, ex_model *em, float *loss, char *err)
{
    return ex_step_forward_backward(em, ctx, loss, err);
}

/* tied: tied embeddings and a sample without images (images_per_sample {0, 3});
 * mask: the loss mask of the batch (NULL: none), den its loss_denominator. */
static void torch_ref_case(bool window, bool tied, const float *mask, double den)
{
    const char *script = getenv("DHP_TORCH_REF_SCRIPT");
    if (!script) { test_skip("driven by tests/t_torch_ref.sh (needs DHP_TORCH_REF_SCRIPT)"); return; }
    model_t m;
    test_tiny_vl(&m, window);
    m.mod[1].tied_embeddings = tied;
    if (tied) strcpy(m.name, "tiny-vl-tied");
    test_batch tb;
    test_make_batch(&tb, &m);
    if (tied) { tb.ipb[0] = 0; tb.ipb[1] = 3; }
    tb.b.loss_mask = mask;
    tb.b.loss_denominator = den;
    char mask_json[200] = "null";
    for (int i = 0, n = 0; mask && i < 20; i++)
        n += snprintf(mask_json + n, sizeof mask_json - (size_t)n, "%s%g%s", i ? ", " : "[", (double)mask[i], i == 19 ? "]" : "");
    ex_model *em;
    char err[UTIL_ERR_LEN], dir[] = "/tmp/dhp-torchref-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(ex_model_create(&m, 1234, &em, err));
    test_perturb_vectors(em, urand);
    float *p0 = test_params_copy(em);
    float loss;
    CHECK_OK(ex_step_forward_backward(em, &tb.b, &loss, err));
    ex_optim_config oc = test_ref_optim(test_grad_norm(em));
    char cfg[4096], optim[512];
    test_ref_optim_json(optim, sizeof optim, &oc);
    snprintf(cfg, sizeof cfg, "{\n");
    json_module(cfg, sizeof cfg, "vision", &m.mod[0]);
    json_module(cfg, sizeof cfg, "llm", &m.mod[1]);
    size_t len = strlen(cfg);
    snprintf(cfg + len, sizeof cfg - len,
             "\"batch\": {\"n_images\": %d, \"patches\": %d, \"grid_h\": %d, \"grid_w\": %d, \"batch\": %d, "
             "\"text_tokens\": %d, \"images_per_sample\": [%d, %d], \"merged_per_image\": %d, "
             "\"loss_mask\": %s, \"loss_denominator\": %.17g},\n%s\n}\n",
             tb.b.n_images, tb.b.patches, tb.b.grid_h, tb.b.grid_w, tb.b.batch, tb.b.text_tokens, tb.ipb[0],
             tb.ipb[1], tb.b.patches / (m.mod[0].merge * m.mod[0].merge), mask_json, den, optim);
    char path[400];
    snprintf(path, sizeof path, "%s/params.bin", dir);
    int cpp = 3 * 16;
    CHECK_OK(ex_params_save_raw(em, path, err));
    CHECK_OK(test_write_file(dir, "config.json", cfg, strlen(cfg)));
    CHECK_OK(test_write_file(dir, "pixels.bin", tb.pixels, (size_t)3 * 64 * cpp * 4));
    CHECK_OK(test_write_file(dir, "tokens.bin", tb.tokens, 20 * 4));
    test_ref_result r;
    test_torch_compare(em, script, dir, loss, p0, &oc, whole_step_pass, &tb.b, &r, err);
    char why[UTIL_ERR_LEN];
    bool ok = test_ref_verdict("torch_ref", m.name, loss, &r, err, why, sizeof why);
    free(p0);
    ex_model_free(em);
    test_free_batch(&tb);
    CHECK_MSG(ok, "%s", why);
}

TEST_DRIVEN(executor_torch_ref_tiny_vl) { torch_ref_case(false, false, NULL, 0); }
/* masked: the loss counts 14 of the 18 predictions and divides by their count */
TEST_DRIVEN(executor_torch_ref_tiny_vl_window_masked) { torch_ref_case(true, false, test_batch_mask, 0); }
/* masked with an explicit denominator (as a micro-batch of a larger global batch) */
TEST_DRIVEN(executor_torch_ref_tiny_vl_tied_text_only_sample_masked) { torch_ref_case(false, true, test_batch_mask, 25); }
