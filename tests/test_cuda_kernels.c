/* The CUDA backend's kernels (executor/cuda_kernels.cu), run on the CPU by the
 * emulator (tests/cudaemu.h: the same source compiled as C++ with each launch's
 * blocks run one after another, a fiber per CUDA thread), against the
 * CPU backend on small random inputs. Sizes are odd on purpose (not multiples
 * of the 128-thread blocks or the 32-row attention tiles), and the emulated
 * build caps its grids low, so the grid-stride and tile-stride loops run too.
 * Emulated "device" memory is host memory, so the tests pass host arrays.
 *
 * Tolerances are relative, per element, against max(|ref|, 1% of the largest
 * |ref|) (entries that cancel to near zero are judged on the array's scale):
 * 1e-6 for element-wise kernels (the same float operations as the CPU loops;
 * 0 seen) and 1e-4 for everything that sums (GEMMs, column sums, attention,
 * where the kernels add in lanes, trees or other tiles than the CPU's
 * one-by-one float loops; up to 1.8e-5 seen, on entries near the floor).
 * DHP_TEST_SHOW_ERR=1 prints every measured error to stderr. */
#include "test.h"
#include "executor/backend.h"
#include "planner/backend.h"
#include "util/util.h"
#include "tests/kernel_data.h"

#include <stdint.h>
#include <stdlib.h>

static void show_err(const char *what, double e)
{
    if (getenv("DHP_TEST_SHOW_ERR")) fprintf(stderr, "  %-44s max rel err %.3g\n", what, e);
}

/* Checks a[n] against ref[n] within tol (see max_rel_err). */
#define CHECK_CLOSE(a, ref, n, tol, what) do { double _e = max_rel_err((a), (ref), (n)); show_err((what), _e); \
    CHECK_MSG(_e <= (tol), "%s: max rel err %.3g > %g", (what), _e, (double)(tol)); } while (0)

#define CHECK_SYNC() do { char _err[UTIL_ERR_LEN] = ""; int _rc = ex_cuda_sync_emu(_err); \
    CHECK_MSG(_rc == 0, "ex_cuda_sync_emu returned %d: %s", _rc, _err); } while (0)

static const ex_backend *emu(void)
{
    char err[UTIL_ERR_LEN] = "";
    return ex_backend_cuda_emu(err);
}

TEST(cuda_kernels_emu_table_complete_and_sync_reports_errors)
{
    const ex_backend *be = emu();
    CHECK(be != NULL);
    CHECK(!strcmp(be->name, "cuda-emu"));
    CHECK(be->zero && be->copy && be->add_inplace && be->add_bias && be->scale_inplace && be->sumsq);
    CHECK(be->linear_forward && be->linear_backward && be->rmsnorm_forward && be->rmsnorm_backward);
    CHECK(be->rope_forward && be->rope_backward && be->attention_forward && be->attention_backward);
    CHECK(be->swiglu_forward && be->swiglu_backward && be->gelu_forward && be->gelu_backward);
    CHECK(be->embedding_forward && be->embedding_backward && be->cross_entropy);
    CHECK(be->gather_rows && be->scatter_add_rows);
    CHECK(be->ce_row_max && be->ce_exp_sum && be->ce_grad && be->adamw);
    CHECK(be->layernorm_forward && be->layernorm_backward && be->im2col1d && be->col2im1d);
    CHECK(be->avgpool_rows_forward && be->avgpool_rows_backward);
    CHECK_SYNC();
    /* A bad shape is a sticky error: the next sync reports it, the one after is clean. */
    const int cu[2] = { 0, 1 };
    float buf[4] = { 0 };
    be->attention_forward(buf, buf, buf, buf, buf, cu, 1, 1, 1, EX_MAX_HEAD_DIM + 1, false);
    be->attention_forward(buf, buf, buf, buf, buf, cu, 1, 3, 2, 8, false);   /* H % Hkv != 0: not the first */
    char err[UTIL_ERR_LEN] = "";
    int rc = ex_cuda_sync_emu(err);
    CHECK_MSG(rc != 0 && strstr(err, "attention") && strstr(err, "head_dim 513"), "rc %d, err '%s'", rc, err);
    CHECK_SYNC();
}

TEST(cuda_kernels_emu_elementwise_match_cpu)
{
    const size_t n = 4099;   /* > the emulated grid cap x 128 threads: grid-stride loops */
    const ex_backend *be = emu(), *cpu = ex_backend_cpu();
    CHECK(be != NULL);
    float *x = rnd(n, 2), *y0 = rnd(n, 1), *g = rnd(n, 3), *u = rnd(n, 2), *dh = rnd(n, 1);
    float *a = dup(y0, n), *b = dup(y0, n);
    /* zero, copy, add, scale */
    be->zero(a, n);
    for (size_t i = 0; i < n; i++) CHECK_MSG(a[i] == 0.0f, "zero left a[%zu] = %g", i, a[i]);
    be->copy(a, x, n);
    CHECK(!memcmp(a, x, n * sizeof *a));
    memcpy(a, y0, n * sizeof *a);
    be->add_inplace(a, x, n);
    be->scale_inplace(a, 0.37f, n);
    cpu->add_inplace(b, x, n);
    cpu->scale_inplace(b, 0.37f, n);
    CHECK_SYNC();
    CHECK_CLOSE(a, b, n, 1e-6, "add_inplace + scale_inplace");
    /* add_bias over 37 rows of 110 (the tail of the buffers stays) */
    memcpy(a, y0, n * sizeof *a);
    memcpy(b, y0, n * sizeof *b);
    be->add_bias(a, x, 37, 110);
    cpu->add_bias(b, x, 37, 110);
    CHECK_SYNC();
    CHECK_CLOSE(a, b, n, 1e-6, "add_bias");
    /* SwiGLU forward, backward accumulating into pre-filled gradients, NULL du */
    be->swiglu_forward(a, g, u, n);
    cpu->swiglu_forward(b, g, u, n);
    CHECK_SYNC();
    CHECK_CLOSE(a, b, n, 1e-6, "swiglu_forward");
    float *dg = dup(y0, n), *du = dup(x, n), *dg_ref = dup(y0, n), *du_ref = dup(x, n), *dg2 = dup(y0, n);
    be->swiglu_backward(dg, du, dh, g, u, n);
    be->swiglu_backward(dg2, NULL, dh, g, u, n);
    cpu->swiglu_backward(dg_ref, du_ref, dh, g, u, n);
    CHECK_SYNC();
    CHECK_CLOSE(dg, dg_ref, n, 1e-6, "swiglu_backward dg (+=)");
    CHECK_CLOSE(du, du_ref, n, 1e-6, "swiglu_backward du (+=)");
    CHECK_CLOSE(dg2, dg_ref, n, 1e-6, "swiglu_backward dg, du NULL");
    /* GELU and quick GELU forward, backward (+=) */
    CHECK(be->quick_gelu_forward && be->quick_gelu_backward);
    typedef void (*act_fwd)(float *out, const float *inp, size_t n);
    typedef void (*act_bwd)(float *dinp, const float *dout, const float *inp, size_t n);
    const struct { const char *fwd_name, *bwd_name; act_fwd fwd, fwd_ref; act_bwd bwd, bwd_ref; } acts[] = {
        { "gelu_forward", "gelu_backward (+=)", be->gelu_forward, cpu->gelu_forward, be->gelu_backward,
          cpu->gelu_backward },
        { "quick_gelu_forward", "quick_gelu_backward (+=)", be->quick_gelu_forward, cpu->quick_gelu_forward,
          be->quick_gelu_backward, cpu->quick_gelu_backward },
    };
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
        acts[i].fwd(a, g, n);
        acts[i].fwd_ref(b, g, n);
        CHECK_SYNC();
        CHECK_CLOSE(a, b, n, 1e-6, acts[i].fwd_name);
        memcpy(a, y0, n * sizeof *a);
        memcpy(b, y0, n * sizeof *b);
        acts[i].bwd(a, dh, g, n);
        acts[i].bwd_ref(b, dh, g, n);
        CHECK_SYNC();
        CHECK_CLOSE(a, b, n, 1e-6, acts[i].bwd_name);
    }
    /* AdamW (two steps, so m and v are non-trivial) */
    float *p = dup(x, n), *m = rnd(n, 0.1f), *v = rnd(n, 0.1f);
    for (size_t i = 0; i < n; i++) v[i] *= v[i];
    float *p_ref = dup(p, n), *m_ref = dup(m, n), *v_ref = dup(v, n);
    for (int step = 1; step <= 2; step++) {
        float c1 = 1.0f - powf(0.9f, (float)step), c2 = 1.0f - powf(0.999f, (float)step);
        be->adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, c1, c2);
        cpu->adamw(p_ref, g, m_ref, v_ref, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, c1, c2);
    }
    CHECK_SYNC();
    CHECK_CLOSE(p, p_ref, n, 1e-6, "adamw p");
    CHECK_CLOSE(m, m_ref, n, 1e-6, "adamw m");
    CHECK_CLOSE(v, v_ref, n, 1e-6, "adamw v");
    free(x); free(y0); free(g); free(u); free(dh); free(a); free(b);
    free(dg); free(du); free(dg_ref); free(du_ref); free(dg2);
    free(p); free(m); free(v); free(p_ref); free(m_ref); free(v_ref);
}

TEST(cuda_kernels_emu_rope_match_cpu)
{
    const ex_backend *be = emu(), *cpu = ex_backend_cpu();
    CHECK(be != NULL);
    const int n = 37, nh = 3, hds[2] = { 10, 7 };   /* 7: odd, the last column stays */
    for (int c = 0; c < 2; c++) {
        int hd = hds[c], half = hd / 2;
        size_t nx = (size_t)n * nh * hd;
        float *x = rnd(nx, 1), *cs = rnd((size_t)n * half, 1), *sn = rnd((size_t)n * half, 1);
        float *a = dup(x, nx), *b = dup(x, nx);
        be->rope_forward(a, cs, sn, n, nh, hd);
        cpu->rope_forward(b, cs, sn, n, nh, hd);
        CHECK_SYNC();
        CHECK_CLOSE(a, b, nx, 1e-6, hd == 10 ? "rope_forward hd 10" : "rope_forward hd 7");
        be->rope_backward(a, cs, sn, n, nh, hd);
        cpu->rope_backward(b, cs, sn, n, nh, hd);
        CHECK_SYNC();
        CHECK_CLOSE(a, b, nx, 1e-6, hd == 10 ? "rope_backward hd 10" : "rope_backward hd 7");
        free(x); free(cs); free(sn); free(a); free(b);
    }
}

TEST(cuda_kernels_emu_sumsq_matches_cpu)
{
    const ex_backend *be = emu(), *cpu = ex_backend_cpu();
    CHECK(be != NULL);
    const size_t n = 100003;
    float *x = rnd(n, 1);
    double s = be->sumsq(x, n), ref = cpu->sumsq(x, n), small = be->sumsq(x, 5), none = be->sumsq(x, 0);
    double small_ref = cpu->sumsq(x, 5);
    free(x);
    CHECK_SYNC();
    show_err("sumsq (100003, double)", fabs(s - ref) / ref);
    CHECK_NEAR(s, ref, 1e-12);
    CHECK_NEAR(small, small_ref, 1e-15);
    CHECK(none == 0);
}

/* One linear case: forward with or without bias; backward with the given
 * gradients (1 = wanted, 0 = NULL), pre-filled. */
static void linear_case(const ex_backend *be, int n, int in, int o, bool bias, bool want_dinp, bool want_dw,
                        bool want_db)
{
    const ex_backend *cpu = ex_backend_cpu();
    float *inp = rnd((size_t)n * in, 1), *w = rnd((size_t)o * in, 0.5f), *b = rnd((size_t)o, 1);
    float *out = rnd((size_t)n * o, 9), *out_ref = rnd((size_t)n * o, 9), *dout = rnd((size_t)n * o, 1);
    float *dinp = rnd((size_t)n * in, 1), *dw = rnd((size_t)o * in, 1), *db = rnd((size_t)o, 1);
    float *dinp_ref = dup(dinp, (size_t)n * in), *dw_ref = dup(dw, (size_t)o * in), *db_ref = dup(db, (size_t)o);
    be->linear_forward(out, inp, w, bias ? b : NULL, n, in, o);
    cpu->linear_forward(out_ref, inp, w, bias ? b : NULL, n, in, o);
    be->linear_backward(want_dinp ? dinp : NULL, want_dw ? dw : NULL, want_db ? db : NULL, dout, inp, w, n, in, o);
    cpu->linear_backward(want_dinp ? dinp_ref : NULL, want_dw ? dw_ref : NULL, want_db ? db_ref : NULL, dout, inp,
                         w, n, in, o);
    char what[96];
    CHECK_SYNC();
    snprintf(what, sizeof what, "linear_forward %dx%d->%d bias %d", n, in, o, bias);
    CHECK_CLOSE(out, out_ref, (size_t)n * o, 1e-4, what);
    snprintf(what, sizeof what, "linear_backward dinp (+=) want %d", want_dinp);
    CHECK_CLOSE(dinp, dinp_ref, (size_t)n * in, 1e-4, what);
    snprintf(what, sizeof what, "linear_backward dw (+=) want %d", want_dw);
    CHECK_CLOSE(dw, dw_ref, (size_t)o * in, 1e-4, what);
    snprintf(what, sizeof what, "linear_backward db (+=) want %d", want_db);
    CHECK_CLOSE(db, db_ref, (size_t)o, 1e-4, what);
    free(inp); free(w); free(b); free(out); free(out_ref); free(dout);
    free(dinp); free(dw); free(db); free(dinp_ref); free(dw_ref); free(db_ref);
}

TEST(cuda_kernels_emu_linear_match_cpu)
{
    const ex_backend *be = emu();
    CHECK(be != NULL);
    linear_case(be, 37, 29, 23, true, true, true, true);
    linear_case(be, 37, 29, 45, false, true, true, true);   /* db over two 32-column blocks */
    linear_case(be, 19, 50, 600, true, true, false, true); /* more column blocks than the grid cap */
    linear_case(be, 19, 50, 33, true, false, true, false);
    linear_case(be, 5, 3, 7, true, false, false, true);
}

TEST(cuda_kernels_emu_rmsnorm_match_cpu)
{
    const ex_backend *be = emu(), *cpu = ex_backend_cpu();
    CHECK(be != NULL);
    const int n = 19, d = 150;   /* rows > the grid cap; d > one block of threads */
    const size_t nd = (size_t)n * d;
    float *x = rnd(nd, 2), *w = rnd((size_t)d, 1), *dout = rnd(nd, 1);
    float *out = rnd(nd, 1), *out_ref = rnd(nd, 1), *rstd = rnd((size_t)n, 1), *rstd_ref = rnd((size_t)n, 1);
    be->rmsnorm_forward(out, rstd, x, w, n, d, 1e-5f);
    cpu->rmsnorm_forward(out_ref, rstd_ref, x, w, n, d, 1e-5f);
    CHECK_SYNC();
    CHECK_CLOSE(out, out_ref, nd, 1e-6, "rmsnorm_forward out");
    CHECK_CLOSE(rstd, rstd_ref, (size_t)n, 1e-6, "rmsnorm_forward rstd");
    float *dinp = rnd(nd, 1), *dw = rnd((size_t)d, 1);
    float *dinp_ref = dup(dinp, nd), *dw_ref = dup(dw, (size_t)d), *dinp2 = dup(dinp, nd), *dw2 = dup(dw, (size_t)d);
    be->rmsnorm_backward(dinp, dw, dout, x, w, rstd_ref, n, d);
    be->rmsnorm_backward(dinp2, NULL, dout, x, w, rstd_ref, n, d);
    be->rmsnorm_backward(NULL, dw2, dout, x, w, rstd_ref, n, d);
    cpu->rmsnorm_backward(dinp_ref, dw_ref, dout, x, w, rstd_ref, n, d);
    CHECK_SYNC();
    CHECK_CLOSE(dinp, dinp_ref, nd, 1e-4, "rmsnorm_backward dinp (+=)");
    CHECK_CLOSE(dw, dw_ref, (size_t)d, 1e-4, "rmsnorm_backward dw (+=)");
    CHECK_CLOSE(dinp2, dinp_ref, nd, 1e-4, "rmsnorm_backward dinp, dw NULL");
    CHECK_CLOSE(dw2, dw_ref, (size_t)d, 1e-4, "rmsnorm_backward dw, dinp NULL");
    free(x); free(w); free(dout); free(out); free(out_ref); free(rstd); free(rstd_ref);
    free(dinp); free(dw); free(dinp_ref); free(dw_ref); free(dinp2); free(dw2);
}

/* One attention case on sequences cu[0..nseq]: forward (out, lse) and backward
 * into pre-filled gradients (both from the CPU's out and lse); with nulls, also
 * the backward with dq NULL and with dk, dv NULL. */
static void attention_case(const ex_backend *be, const int *cu, int nseq, int H, int Hkv, int hd, bool causal,
                           bool nulls)
{
    const ex_backend *cpu = ex_backend_cpu();
    int n = cu[nseq];
    size_t qn = (size_t)n * H * hd, kn = (size_t)n * Hkv * hd, ln = (size_t)n * H;
    float *q = rnd(qn, 2), *k = rnd(kn, 2), *v = rnd(kn, 1), *g = rnd(qn, 1);
    float *o = rnd(qn, 5), *l = rnd(ln, 5), *o_ref = rnd(qn, 5), *l_ref = rnd(ln, 5);
    float *dq = rnd(qn, 1), *dk = rnd(kn, 1), *dv = rnd(kn, 1);
    float *dq_ref = dup(dq, qn), *dk_ref = dup(dk, kn), *dv_ref = dup(dv, kn);
    float *dq2 = dup(dq, qn), *dk2 = dup(dk, kn), *dv2 = dup(dv, kn);
    be->attention_forward(o, l, q, k, v, cu, nseq, H, Hkv, hd, causal);
    cpu->attention_forward(o_ref, l_ref, q, k, v, cu, nseq, H, Hkv, hd, causal);
    be->attention_backward(dq, dk, dv, g, q, k, v, o_ref, l_ref, cu, nseq, H, Hkv, hd, causal);
    if (nulls) {
        be->attention_backward(NULL, dk2, dv2, g, q, k, v, o_ref, l_ref, cu, nseq, H, Hkv, hd, causal);
        be->attention_backward(dq2, NULL, NULL, g, q, k, v, o_ref, l_ref, cu, nseq, H, Hkv, hd, causal);
    }
    cpu->attention_backward(dq_ref, dk_ref, dv_ref, g, q, k, v, o_ref, l_ref, cu, nseq, H, Hkv, hd, causal);
    char what[96];
    CHECK_SYNC();
#define ATT_CHECK(a, ref, cnt, name) snprintf(what, sizeof what, "attention %s H %d/%d hd %d causal %d", name, H, \
                                          Hkv, hd, causal); CHECK_CLOSE(a, ref, cnt, 1e-4, what)
    ATT_CHECK(o, o_ref, qn, "out");
    ATT_CHECK(l, l_ref, ln, "lse");
    ATT_CHECK(dq, dq_ref, qn, "dq (+=)");
    ATT_CHECK(dk, dk_ref, kn, "dk (+=)");
    ATT_CHECK(dv, dv_ref, kn, "dv (+=)");
    if (nulls) {
        ATT_CHECK(dq2, dq_ref, qn, "dq, dk/dv NULL");
        ATT_CHECK(dk2, dk_ref, kn, "dk, dq NULL");
        ATT_CHECK(dv2, dv_ref, kn, "dv, dq NULL");
    }
#undef ATT_CHECK
    free(q); free(k); free(v); free(g); free(o); free(l); free(o_ref); free(l_ref);
    free(dq); free(dk); free(dv); free(dq_ref); free(dk_ref); free(dv_ref); free(dq2); free(dk2); free(dv2);
}

TEST(cuda_kernels_emu_attention_match_cpu)
{
    const ex_backend *be = emu();
    CHECK(be != NULL);
    /* Lengths 70 (three 32-row tiles; more than the CPU's 64-key tile), 45 and
     * 6 (shorter than a tile); GQA H 4 / Hkv 2; head_dim below, at, between and
     * above the kernels' 32-column chunks; causal and not. (Each emulated
     * __syncthreads costs a round of 128 fiber switches, so the cases are few.) */
    const int cu[4] = { 0, 70, 115, 121 };
    const struct { int hd; bool causal, nulls; } cases[5] = {
        { 8, true, false }, { 16, false, false }, { 24, true, true }, { 24, false, false }, { 40, true, false },
    };
    for (int c = 0; c < 5 && !test_failed_now(); c++)
        attention_case(be, cu, 3, 4, 2, cases[c].hd, cases[c].causal, cases[c].nulls);
    /* Two sequences, one kv head for three query heads. */
    if (!test_failed_now()) attention_case(be, cu, 2, 3, 1, 16, false, true);
}

TEST(cuda_kernels_emu_embedding_match_cpu)
{
    const ex_backend *be = emu(), *cpu = ex_backend_cpu();
    CHECK(be != NULL);
    const int n = 40, d = 133, v0 = 5, vn = 11;   /* tokens 0..24: below, in and above the shard, repeated */
    int32_t tokens[40];
    for (int t = 0; t < n; t++) tokens[t] = (t * 7 + 3) % 25;
    float *wte = rnd((size_t)vn * d, 1), *dout = rnd((size_t)n * d, 1);
    float *out = rnd((size_t)n * d, 3), *out_ref = rnd((size_t)n * d, 3);
    float *dwte = rnd((size_t)vn * d, 1), *dwte_ref = dup(dwte, (size_t)vn * d);
    be->embedding_forward(out, wte, tokens, n, d, v0, vn);
    cpu->embedding_forward(out_ref, wte, tokens, n, d, v0, vn);
    be->embedding_backward(dwte, dout, tokens, n, d, v0, vn);
    cpu->embedding_backward(dwte_ref, dout, tokens, n, d, v0, vn);
    CHECK_SYNC();
    CHECK(!memcmp(out, out_ref, (size_t)n * d * sizeof *out));
    CHECK_CLOSE(dwte, dwte_ref, (size_t)vn * d, 1e-6, "embedding_backward (+=, shard v0 5)");
    free(wte); free(dout); free(out); free(out_ref); free(dwte); free(dwte_ref);
}

TEST(cuda_kernels_emu_gather_scatter_rows_match_cpu)
{
    const ex_backend *be = emu(), *cpu = ex_backend_cpu();
    CHECK(be != NULL);
    const int N = 50, n = 41, d = 131;   /* n x d > the emulated grid cap x 128 threads */
    int rows[41];
    for (int i = 0; i < n; i++) rows[i] = (i * 13 + 7) % N;   /* distinct, out of order */
    float *src = rnd((size_t)N * d, 1), *g = rnd((size_t)n * d, 1);
    float *got = rnd((size_t)n * d, 3), *got_ref = rnd((size_t)n * d, 3);
    float *dst = rnd((size_t)N * d, 1), *dst_ref = dup(dst, (size_t)N * d);
    be->gather_rows(got, src, rows, n, d);
    cpu->gather_rows(got_ref, src, rows, n, d);
    be->scatter_add_rows(dst, g, rows, n, d);
    cpu->scatter_add_rows(dst_ref, g, rows, n, d);
    CHECK_SYNC();
    CHECK(!memcmp(got, got_ref, (size_t)n * d * sizeof *got));
    CHECK(!memcmp(dst, dst_ref, (size_t)N * d * sizeof *dst));
    free(src); free(g); free(got); free(got_ref); free(dst); free(dst_ref);
}

TEST(cuda_kernels_emu_cross_entropy_match_cpu)
{
    const ex_backend *be = emu(), *cpu = ex_backend_cpu();
    CHECK(be != NULL);
    /* Vocab-parallel pieces on a shard [50, 350) of the vocabulary. */
    const int n = 7, vocab = 300, v0 = 50;
    const int32_t targets[7] = { 50, 349, 10, 200, 351, 120, 0 };   /* in, in, out, in, out, in, out */
    const size_t nv = (size_t)n * vocab;
    float *z = rnd(nv, 4), *mx = rnd(n, 1), *mx_ref = rnd(n, 1), *st = rnd(2 * n, 1), *st_ref = rnd(2 * n, 1);
    float *st2 = rnd(2 * n, 1), *probs = rnd(nv, 1), *probs_ref = rnd(nv, 1);
    be->ce_row_max(mx, z, n, vocab);
    cpu->ce_row_max(mx_ref, z, n, vocab);
    be->ce_exp_sum(probs, st, z, mx_ref, targets, n, vocab, v0);
    be->ce_exp_sum(NULL, st2, z, mx_ref, targets, n, vocab, v0);
    cpu->ce_exp_sum(probs_ref, st_ref, z, mx_ref, targets, n, vocab, v0);
    CHECK_SYNC();
    CHECK(!memcmp(mx, mx_ref, n * sizeof *mx));
    CHECK_CLOSE(st, st_ref, 2 * (size_t)n, 1e-6, "ce_exp_sum st (sum, target logit)");
    CHECK_CLOSE(st2, st_ref, 2 * (size_t)n, 1e-6, "ce_exp_sum st, probs NULL");
    CHECK_CLOSE(probs, probs_ref, nv, 1e-6, "ce_exp_sum probs");
    memcpy(probs, probs_ref, nv * sizeof *probs);
    be->ce_grad(probs, st_ref, targets, n, vocab, v0, 0.25f);
    cpu->ce_grad(probs_ref, st_ref, targets, n, vocab, v0, 0.25f);
    CHECK_SYNC();
    CHECK_CLOSE(probs, probs_ref, nv, 1e-6, "ce_grad");
    /* Fused, whole vocabulary: 9 rows (> the emulated grid cap), one target out of range. */
    const int n2 = 9;
    const int32_t t2[9] = { 0, 299, 5, 150, 77, 300, 3, 298, 42 };
    float *z2 = rnd((size_t)n2 * vocab, 5), *dl = rnd((size_t)n2 * vocab, 1), *dl_ref = rnd((size_t)n2 * vocab, 1);
    double loss = be->cross_entropy(dl, z2, t2, n2, vocab, 0.5f);
    double loss_nograd = be->cross_entropy(NULL, z2, t2, n2, vocab, 0.5f);
    double loss_ref = cpu->cross_entropy(dl_ref, z2, t2, n2, vocab, 0.5f);
    CHECK_SYNC();
    show_err("cross_entropy loss", fabs(loss - loss_ref) / fabs(loss_ref));
    CHECK_NEAR(loss, loss_ref, 1e-6);
    CHECK_NEAR(loss_nograd, loss_ref, 1e-6);
    CHECK_CLOSE(dl, dl_ref, (size_t)n2 * vocab, 1e-6, "cross_entropy dlogits");
    free(z); free(mx); free(mx_ref); free(st); free(st_ref); free(st2); free(probs); free(probs_ref);
    free(z2); free(dl); free(dl_ref);
}

/* The real entry point (the nvcc object, or executor/cuda_none.c without nvcc):
 * a table and a clean sync where a GPU is usable, else NULL and a reason. */
TEST(cuda_backend_entry_point_gives_table_or_reason)
{
    char err[UTIL_ERR_LEN] = "";
    const ex_backend *be = ex_backend_cuda(err);
    if (!be) {
        CHECK_MSG(strstr(err, "CUDA") != NULL, "no table and err '%s'", err);
        return;
    }
    CHECK(!strcmp(be->name, "cuda"));
    CHECK_OK(ex_cuda_sync(err));
}

/* cuBLASLt is opened when the CUDA backend is first asked for, not linked:
 * the library dhp was built against resolves every entry point the GEMMs
 * call, and an absent one fails in one line that names it. Without CUDA
 * both say so. */
TEST(cuda_blas_is_loaded_on_demand_and_a_missing_library_is_named)
{
    char err[UTIL_ERR_LEN] = "";
#ifdef DHP_CUDA
    CHECK_OK(ex_cuda_blas_load(NULL, err));
    CHECK(ex_cuda_blas_load("libdhp-no-such-cublasLt.so", err) == UTIL_ERUNTIME);
    CHECK_MSG(strstr(err, "libdhp-no-such-cublasLt.so") && strstr(err, "cuBLASLt") && !strchr(err, '\n'), "err '%s'",
              err);
    /* a library that is there but is not cuBLASLt: the missing entry point is named */
    CHECK(ex_cuda_blas_load("libm.so.6", err) == UTIL_ERUNTIME);
    CHECK_MSG(strstr(err, "libm.so.6 has no cublasLtCreate"), "err '%s'", err);
#else
    CHECK(ex_cuda_blas_load(NULL, err) == UTIL_EUNSUPPORTED);
    CHECK_MSG(strstr(err, "without CUDA") != NULL, "err '%s'", err);
#endif
}

TEST(cuda_kernels_emu_layernorm_match_cpu)
{
    const ex_backend *be = emu(), *cpu = ex_backend_cpu();
    CHECK(be != NULL);
    CHECK(be->layernorm_forward && be->layernorm_backward && be->im2col1d && be->col2im1d);
    CHECK(be->avgpool_rows_forward && be->avgpool_rows_backward);
    const int n = 19, d = 150;   /* rows > the grid cap; d > one block of threads */
    const size_t nd = (size_t)n * d;
    float *x = rnd(nd, 2), *w = rnd((size_t)d, 1), *b = rnd((size_t)d, 1), *dout = rnd(nd, 1);
    for (size_t i = 0; i < nd; i++) x[i] += 3.0f;   /* a mean far from 0 */
    float *out = rnd(nd, 1), *out_ref = rnd(nd, 1), *mean = rnd((size_t)n, 1), *mean_ref = rnd((size_t)n, 1);
    float *rstd = rnd((size_t)n, 1), *rstd_ref = rnd((size_t)n, 1);
    be->layernorm_forward(out, mean, rstd, x, w, b, n, d, 1e-5f);
    cpu->layernorm_forward(out_ref, mean_ref, rstd_ref, x, w, b, n, d, 1e-5f);
    CHECK_SYNC();
    CHECK_CLOSE(out, out_ref, nd, 1e-5, "layernorm_forward out");
    CHECK_CLOSE(mean, mean_ref, (size_t)n, 1e-6, "layernorm_forward mean");
    CHECK_CLOSE(rstd, rstd_ref, (size_t)n, 1e-6, "layernorm_forward rstd");
    float *dinp = rnd(nd, 1), *dw = rnd((size_t)d, 1), *db = rnd((size_t)d, 1);
    float *dinp_ref = dup(dinp, nd), *dw_ref = dup(dw, (size_t)d), *db_ref = dup(db, (size_t)d);
    float *dinp2 = dup(dinp, nd), *dw2 = dup(dw, (size_t)d), *db2 = dup(db, (size_t)d);
    be->layernorm_backward(dinp, dw, db, dout, x, w, mean_ref, rstd_ref, n, d);
    be->layernorm_backward(dinp2, NULL, NULL, dout, x, w, mean_ref, rstd_ref, n, d);
    be->layernorm_backward(NULL, dw2, db2, dout, x, w, mean_ref, rstd_ref, n, d);
    cpu->layernorm_backward(dinp_ref, dw_ref, db_ref, dout, x, w, mean_ref, rstd_ref, n, d);
    CHECK_SYNC();
    CHECK_CLOSE(dinp, dinp_ref, nd, 1e-4, "layernorm_backward dinp (+=)");
    CHECK_CLOSE(dw, dw_ref, (size_t)d, 1e-4, "layernorm_backward dw (+=)");
    CHECK_CLOSE(db, db_ref, (size_t)d, 1e-4, "layernorm_backward db (+=)");
    CHECK_CLOSE(dinp2, dinp_ref, nd, 1e-4, "layernorm_backward dinp, dw db NULL");
    CHECK_CLOSE(dw2, dw_ref, (size_t)d, 1e-4, "layernorm_backward dw, dinp NULL");
    CHECK_CLOSE(db2, db_ref, (size_t)d, 1e-4, "layernorm_backward db, dinp NULL");
    free(x); free(w); free(b); free(dout); free(out); free(out_ref); free(mean); free(mean_ref); free(rstd);
    free(rstd_ref); free(dinp); free(dw); free(db); free(dinp_ref); free(dw_ref); free(db_ref);
    free(dinp2); free(dw2); free(db2);
}

/* im2col / col2im at stride 1 and 2 over a slice of frames (output rows
 * starting inside the sequence), and the row pooling, forward and backward. */
TEST(cuda_kernels_emu_conv_stem_and_pooling_match_cpu)
{
    const ex_backend *be = emu(), *cpu = ex_backend_cpu();
    CHECK(be != NULL);
    const int C = 37, k = 3, pad = 1, nx = 41;
    float *x = rnd((size_t)nx * C, 1);
    for (int stride = 1; stride <= 2; stride++) {
        int t0 = stride == 1 ? 3 : 2, x0 = t0 * stride - pad, n = (nx - 2) / stride;
        size_t nc = (size_t)n * C * k;
        float *col = rnd(nc, 1), *col_ref = rnd(nc, 1);
        be->im2col1d(col, x, n, C, k, stride, pad, t0, x0, nx);
        cpu->im2col1d(col_ref, x, n, C, k, stride, pad, t0, x0, nx);
        float *dcol = rnd(nc, 1), *dx = rnd((size_t)nx * C, 1), *dx_ref = dup(dx, (size_t)nx * C);
        be->col2im1d(dx, dcol, n, C, k, stride, pad, t0, x0, nx);
        cpu->col2im1d(dx_ref, dcol, n, C, k, stride, pad, t0, x0, nx);
        CHECK_SYNC();
        CHECK_CLOSE(col, col_ref, nc, 1e-6, stride == 1 ? "im2col1d stride 1" : "im2col1d stride 2");
        CHECK_CLOSE(dx, dx_ref, (size_t)nx * C, 1e-6, stride == 1 ? "col2im1d stride 1 (+=)" : "col2im1d stride 2 (+=)");
        free(col); free(col_ref); free(dcol); free(dx); free(dx_ref);
    }
    const int m = 23, p = 2, d = 45;
    float *in = rnd((size_t)m * p * d, 1), *y = rnd((size_t)m * d, 1), *y_ref = rnd((size_t)m * d, 1);
    be->avgpool_rows_forward(y, in, m, p, d);
    cpu->avgpool_rows_forward(y_ref, in, m, p, d);
    float *din = rnd((size_t)m * p * d, 1), *din_ref = dup(din, (size_t)m * p * d);
    be->avgpool_rows_backward(din, y_ref, m, p, d);
    cpu->avgpool_rows_backward(din_ref, y_ref, m, p, d);
    CHECK_SYNC();
    CHECK_CLOSE(y, y_ref, (size_t)m * d, 1e-6, "avgpool_rows_forward");
    CHECK_CLOSE(din, din_ref, (size_t)m * p * d, 1e-6, "avgpool_rows_backward (+=)");
    free(x); free(in); free(y); free(y_ref); free(din); free(din_ref);
}

/* The emulated device's bytes in use (tests/cudaemu.h). */
size_t cudaemu_device_bytes(void);

/* The device memory the CUDA backend allocates for itself is charged to a
 * category, as the memory model predicts it: its own buffers (cuBLASLt's
 * workspace, the reductions' partial sums, BGRADB's bias-gradient vector),
 * one allocation on the first GEMM or reduction, are category workspace,
 * PLAN_CUDA_WORKSPACE_BYTES (the tensors here are the test's host arrays, so
 * every emulated device byte is the backend's own). A linear wider than the
 * bias-gradient vector sums its bias gradient unfused, to the same result. */
TEST(cuda_backend_own_buffers_are_charged_as_workspace)
{
    const ex_backend *be = emu();
    CHECK(be != NULL);
    size_t dev0 = cudaemu_device_bytes(), ws0 = util_mem_current(UTIL_MEM_WORKSPACE);
    float *x = rnd(1000, 1);
    double s = be->sumsq(x, 1000);                                 /* the reductions' partial sums */
    free(x);
    linear_case(be, 5, 3, 4099, true, true, true, true);          /* a GEMM; BGRADB's vector, wider than the other tests' */
    linear_case(be, 2, 1, PLAN_CUDA_BGRAD_FLOATS + 1, true, false, true, true);   /* wider than the vector */
    CHECK_SYNC();
    CHECK(s > 0);
    size_t dev = cudaemu_device_bytes() - dev0, ws = util_mem_current(UTIL_MEM_WORKSPACE) - ws0;
    CHECK_MSG(dev == ws, "the backend took %zu device bytes, charged %zu to category workspace", dev, ws);
    CHECK_MSG(util_mem_current(UTIL_MEM_WORKSPACE) >= PLAN_CUDA_WORKSPACE_BYTES, "workspace %zu B, the model's %zu B",
              util_mem_current(UTIL_MEM_WORKSPACE), (size_t)PLAN_CUDA_WORKSPACE_BYTES);
}
