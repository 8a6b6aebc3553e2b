/* The CUDA backend's bf16 attention (executor/cuda_attention16.cuh: tensor
 * cores through nvcuda::wmma, emulated by tests/cudaemu_wmma.h) against its
 * fp32 kernels on the same inputs, element by element within a bound derived
 * from the roundings, with u = 2^-8 (bf16's unit roundoff, round to nearest)
 * and g(n) = n 2^-24 / (1 - n 2^-24) (an n-term fp32 sum, either kernel's, in
 * any order: Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
 * Lemma 3.1; the tensor cores' order included):
 *  - a score s = q . k / sqrt(hd) of row r moves by at most
 *    d_r = scale max_j (2u + u^2 + 2 g(hd)) sum_i |q_i k_ji| (q and k rounded);
 *  - forward: the weights p_j / l move by a factor within e^(+-2 d_r), P and V
 *    are rounded (u each) and summed (g(K)), so
 *    |out' - out| <= (e^(2 d_r) (1 + u)^2 (1 + g(K)) - 1 + g(K)) sum_j p_j |v_j|,
 *    |lse' - lse| <= d_r + 2 g(K) + 2^-23 |lse|;
 *  - backward (both kernels given the fp32 forward's out and lse): p moves by
 *    a factor within e^(+-d_r), dp = dout . v by at most
 *    e_j = (2u + u^2 + 2 g(hd)) sum_i |dout_i v_ji|, D = dout . out is the same
 *    fp32 sum in both; ds = p (dp - D) is rounded, and so are k, q, dout:
 *    |dq' - dq| <= scale sum_j T_j |k_j|, |dk' - dk| <= scale sum_r T_rj |q_r|,
 *    |dv' - dv| <= F1 sum_r p_rj |dout_r|, with F1 = e^d (1 + u)^2 (1 + g(K)) - 1
 *    + g(K) and T = p (F1 |dp - D| + (F1 + 1) e_j); K the longest sum (the
 *    keys, or the query rows of a GQA group, plus hd). The gradients
 *    accumulate into pre-filled buffers: + 2^-23 |value|.
 * The bounds are first order in the perturbations (exact for the exp factors).
 * DHP_TEST_SHOW_ERR=1 prints each array's largest |bf16 - fp32| / bound, its
 * largest |bf16 - fp32| over its largest |fp32| and its max relative error
 * (tests/kernel_data.h's, with its 1% floor). */
#include "test.h"
#include "executor/backend.h"
#include "util/util.h"
#include "planner/planner.h"
#include "tests/kernel_data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define U16 (1.0 / 256)

static double gam(double n) { return n * ldexp(1, -24) / (1 - n * ldexp(1, -24)); }

/* Where a call's sequences lie: cu != NULL self-attention over cu[0..nseq]
 * (causal or not); else ring attention's block: query rows s L + q0 .. + nq,
 * keys s L + k0 .. + nk. */
typedef struct {
    const int *cu;
    int nseq, L, q0, nq, k0, nk, H, Hkv, hd;
    bool causal;
} geom;

static int rows_of(const geom *g) { return g->cu ? g->cu[g->nseq] : g->nseq * g->L; }

/* query row i's sequence range: first row, count; its keys: first, count */
static void span(const geom *g, int s, int r, int *qa, int *qn, int *ka, int *kn)
{
    if (g->cu) {
        *qa = *ka = g->cu[s];
        *qn = g->cu[s + 1] - g->cu[s];
        *kn = g->causal ? r + 1 : *qn;
        return;
    }
    *qa = s * g->L + g->q0;
    *qn = g->nq;
    *ka = s * g->L + g->k0;
    *kn = g->nk;
}

typedef struct {
    double *o, *lse, *dq, *dk, *dv;   /* bounds */
} bounds;

/* The bounds above for inputs q, k, v, dout and the fp32 forward's out, lse. */
static bounds bounds_of(const geom *g, const float *q, const float *k, const float *v, const float *dout,
                        const float *out, const float *lse)
{
    int n = rows_of(g), H = g->H, hd = g->hd, grp = H / g->Hkv;
    size_t qn = (size_t)n * H * hd, kn = (size_t)n * g->Hkv * hd;
    bounds b = { calloc(qn, sizeof(double)), calloc((size_t)n * H, sizeof(double)), calloc(qn, sizeof(double)),
                 calloc(kn, sizeof(double)), calloc(kn, sizeof(double)) };
    double scale = 1 / sqrt((double)hd), dot = 2 * U16 + U16 * U16 + 2 * gam(hd), gK = gam(grp * n + hd);
    double *p = malloc((size_t)n * sizeof *p), *dpd = malloc((size_t)n * sizeof *dpd), *ej = malloc((size_t)n * sizeof *ej);
    for (int s = 0; s < g->nseq; s++)
        for (int h = 0; h < H; h++) {
            int kvh = h / grp, qa, qcount, ka, kcount;
            span(g, s, 0, &qa, &qcount, &ka, &kcount);
            for (int r = 0; r < qcount; r++) {
                span(g, s, r, &qa, &qcount, &ka, &kcount);
                size_t qi = ((size_t)(qa + r) * H + h) * hd;
                double amax = 0, L = lse[(size_t)(qa + r) * H + h], D = 0;
                for (int i = 0; i < hd; i++) D += (double)dout[qi + i] * out[qi + i];
                for (int j = 0; j < kcount; j++) {
                    size_t ki = ((size_t)(ka + j) * g->Hkv + kvh) * hd;
                    double sc = 0, a = 0, dp = 0, e = 0;
                    for (int i = 0; i < hd; i++) {
                        sc += (double)q[qi + i] * k[ki + i];
                        a += fabs((double)q[qi + i] * k[ki + i]);
                        dp += (double)dout[qi + i] * v[ki + i];
                        e += fabs((double)dout[qi + i] * v[ki + i]);
                    }
                    amax = fmax(amax, a);
                    p[j] = exp(sc * scale - L);
                    dpd[j] = fabs(dp - D);
                    ej[j] = dot * e;
                }
                double d = scale * dot * amax, F2 = exp(2 * d) * (1 + U16) * (1 + U16) * (1 + gK) - 1 + gK;
                double F1 = exp(d) * (1 + U16) * (1 + U16) * (1 + gK) - 1 + gK;
                b.lse[(size_t)(qa + r) * H + h] = d + 2 * gK + ldexp(fabs(L), -23);
                for (int j = 0; j < kcount; j++) {
                    size_t ki = ((size_t)(ka + j) * g->Hkv + kvh) * hd;
                    double T = p[j] * (F1 * dpd[j] + (F1 + 1) * ej[j]);
                    for (int i = 0; i < hd; i++) {
                        b.o[qi + i] += F2 * p[j] * fabs(v[ki + i]);
                        b.dq[qi + i] += scale * T * fabs(k[ki + i]);
                        b.dk[ki + i] += scale * T * fabs(q[qi + i]);
                        b.dv[ki + i] += F1 * p[j] * fabs(dout[qi + i]);
                    }
                }
            }
        }
    free(p); free(dpd); free(ej);
    return b;
}

/* the largest |a - ref| / (bound + 2^-23 |ref|) */
static double worst_ratio(const float *a, const float *ref, const double *bound, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double r = fabs((double)a[i] - ref[i]) / (bound[i] + ldexp(fabs(ref[i]), -23) + 1e-30);
        if (!(r <= w)) w = r;   /* NaN counts as worst */
    }
    return w;
}

static void forward(const ex_backend *be, const geom *g, float *o, float *l, const float *q, const float *k, const float *v)
{
    if (g->cu) be->attention_forward(o, l, q, k, v, g->cu, g->nseq, g->H, g->Hkv, g->hd, g->causal);
    else be->attention_part_forward(o, l, q, k, v, g->nseq, g->L, g->q0, g->nq, g->k0, g->nk, g->H, g->Hkv, g->hd);
}

static void backward(const ex_backend *be, const geom *g, float *dq, float *dk, float *dv, const float *dout,
                     const float *q, const float *k, const float *v, const float *o, const float *l)
{
    if (g->cu) be->attention_backward(dq, dk, dv, dout, q, k, v, o, l, g->cu, g->nseq, g->H, g->Hkv, g->hd, g->causal);
    else be->attention_part_backward(dq, dk, dv, dout, q, k, v, o, l, g->nseq, g->L, g->q0, g->nq, g->k0, g->nk, g->H,
                                     g->Hkv, g->hd);
}

static void check(const char *name, const geom *g, const float *a, const float *ref, const double *bound, size_t n,
                  bool nonzero)
{
    double w = worst_ratio(a, ref, bound, n), e = max_rel_err(a, ref, n), diff = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - ref[i]));
        top = fmax(top, fabs((double)ref[i]));
    }
    if (getenv("DHP_TEST_SHOW_ERR"))
        fprintf(stderr, "  bf16 attention %-4s H %d/%d hd %3d %s: |bf16 - fp32| / bound %.3f, max |diff| / max |fp32| %.2e, "
                "max rel err %.3g\n", name, g->H, g->Hkv, g->hd, g->cu ? (g->causal ? "causal" : "full  ") : "ring  ", w,
                diff / top, e);
    CHECK_MSG(w <= 1, "%s H %d/%d hd %d causal %d: |bf16 - fp32| reaches %.3g of its bound", name, g->H, g->Hkv, g->hd,
              g->causal, w);
    /* and it is not the fp32 kernel: the rounding shows */
    if (nonzero) CHECK_MSG(e > 1e-5, "%s hd %d: max rel err %.3g: no bf16 rounding seen", name, g->hd, e);
}

static void attention16_case(const ex_backend *be, const geom *g)
{
    int n = rows_of(g);
    size_t qn = (size_t)n * g->H * g->hd, kn = (size_t)n * g->Hkv * g->hd, ln = (size_t)n * g->H;
    float *q = rnd(qn, 2), *k = rnd(kn, 2), *v = rnd(kn, 1), *dout = rnd(qn, 1);
    float *o = rnd(qn, 1), *l = rnd(ln, 1), *o16 = dup(o, qn), *l16 = dup(l, ln);
    float *dq = rnd(qn, 1), *dk = rnd(kn, 1), *dv = rnd(kn, 1);
    float *dq16 = dup(dq, qn), *dk16 = dup(dk, kn), *dv16 = dup(dv, kn);
    be->set_attention_bf16(false);
    forward(be, g, o, l, q, k, v);
    backward(be, g, dq, dk, dv, dout, q, k, v, o, l);
    be->set_attention_bf16(true);
    forward(be, g, o16, l16, q, k, v);
    backward(be, g, dq16, dk16, dv16, dout, q, k, v, o, l);   /* the fp32 forward's out and lse, as the bounds */
    be->set_attention_bf16(false);
    char err[UTIL_ERR_LEN] = "";
    int rc = ex_cuda_sync_emu(err);
    CHECK_MSG(rc == 0, "sync: %s", err);
    /* the ring block's rows outside q0 .. q0 + nq are untouched: their bounds stay 0 */
    bounds b = bounds_of(g, q, k, v, dout, o, l);
    check("out", g, o16, o, b.o, qn, true);
    check("lse", g, l16, l, b.lse, ln, false);
    check("dq", g, dq16, dq, b.dq, qn, true);
    check("dk", g, dk16, dk, b.dk, kn, true);
    check("dv", g, dv16, dv, b.dv, kn, true);
    free(b.o); free(b.lse); free(b.dq); free(b.dk); free(b.dv);
    free(q); free(k); free(v); free(dout); free(o); free(l); free(o16); free(l16);
    free(dq); free(dk); free(dv); free(dq16); free(dk16); free(dv16);
}

TEST(cuda_emu_attention_bf16_within_its_bound_of_fp32)
{
    char err[UTIL_ERR_LEN] = "";
    const ex_backend *be = ex_backend_cuda_emu(err);
    CHECK_MSG(be && be->set_attention_bf16, "%s", err);
    CHECK_MSG(ex_backend_cpu()->set_attention_bf16 == NULL, "the CPU backend's attention is fp32 only");
    if (!be || !be->set_attention_bf16) return;
    /* Lengths 37 (two 32-row tiles) and 5 (less than one); GQA 4 / 2 and
     * MHA; the zoo's head dims (8 .. 128: padded to 16-column blocks, chunks
     * of 64); causal (the LLM's) and full (the encoders' windows are such
     * sequences); a ring attention block (keys 7 .. 41 of 48-row chunks). The
     * emulator runs every lane's product, so the cases are few and short. */
    const int cu[3] = { 0, 37, 42 };
    const struct { int H, Hkv, hd; bool causal; } cases[] = {
        { 4, 2, 8, true }, { 2, 2, 16, false }, { 2, 1, 64, true }, { 2, 1, 80, false }, { 1, 1, 128, true },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0] && !test_failed_now(); c++) {
        geom g = { cu, 2, 0, 0, 0, 0, 0, cases[c].H, cases[c].Hkv, cases[c].hd, cases[c].causal };
        attention16_case(be, &g);
    }
    geom ring = { NULL, 2, 48, 0, 48, 7, 34, 2, 1, 64, false };
    if (!test_failed_now()) attention16_case(be, &ring);
}

/* The dhp target prices the attention kernel the precision runs: the bf16
 * one under bf16-mixed and -autocast, the fp32 one under fp32 (with or
 * without --tf32); the Megatron target FlashAttention. */
TEST(attention_priced_in_the_precision_that_runs_it)
{
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    o.precision = PLAN_OPT_MIXED_FP32;
    CHECK(plan_attention_kernel(&o) == COST_ATTN_BF16);
    o.precision = PLAN_OPT_AUTOCAST;
    CHECK(plan_attention_kernel(&o) == COST_ATTN_BF16);
    o.precision = PLAN_OPT_FP32;
    CHECK(plan_attention_kernel(&o) == COST_ATTN_FP32);
    o.tf32 = true;
    CHECK(plan_attention_kernel(&o) == COST_ATTN_FP32);
    o.target = PLAN_TARGET_MEGATRON;
    CHECK(plan_attention_kernel(&o) == COST_ATTN_FLASH);
}
