/* The CUDA backend checked against the CPU backend on the device itself:
 * the kernels dhp profile times and the executor's hardest ones run on the
 * same random inputs through both tables, and the largest difference is
 * reported. The tests run the CUDA source on the CPU (tests/cudaemu.h); this
 * is the check that needs a real GPU (threads really concurrent, shared
 * memory and launch limits real). Device buffers come from the CUDA
 * backend's own alloc / h2d / d2h (the emulator build checks its emulated
 * kernels the same way); a build without CUDA has no backend to check. */
#include "executor/backend.h"
#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define CHECK_MAX_BUFS 32

typedef struct {
    const ex_backend *cpu, *gpu;
    void *dev[CHECK_MAX_BUFS];
    float *host[CHECK_MAX_BUFS];
    int n_dev, n_host;
    double worst;
    char what[96];
    char *err;
    int rc;
} checker;

static float *host_buf(checker *c, size_t n, unsigned seed, float scale)
{
    float *h = c->n_host < CHECK_MAX_BUFS ? util_calloc(n ? n : 1, sizeof *h) : NULL;
    if (!h) { if (!c->rc) c->rc = util_fail(c->err, UTIL_ENOMEM, "cuda check: out of host memory"); return NULL; }
    c->host[c->n_host++] = h;
    unsigned s = seed * 2654435761u + 7;
    for (size_t i = 0; seed && i < n; i++) {
        s = s * 1664525u + 1013904223u;
        h[i] = scale * (float)((s >> 8) * (1.0 / 16777216.0) - 0.5);
    }
    return h;
}

/* A device copy of n elements of size el at src. */
static void *dev_copy(checker *c, const void *src, size_t n, size_t el)
{
    if (c->rc) return NULL;
    size_t bytes = n * el > 0 ? n * el : 1;
    void *d = c->n_dev < CHECK_MAX_BUFS ? c->gpu->alloc(bytes, UTIL_MEM_OTHER) : NULL;
    if (!d) {
        char e2[UTIL_ERR_LEN] = "out of buffers";
        if (c->n_dev < CHECK_MAX_BUFS) c->gpu->sync(e2);
        c->rc = util_fail(c->err, UTIL_ERUNTIME, "cuda check: allocating %zu bytes: %s", bytes, e2);
        return NULL;
    }
    c->dev[c->n_dev++] = d;
    c->gpu->h2d(d, src, n * el);
    return d;
}

static float *dev_f(checker *c, const float *src, size_t n) { return dev_copy(c, src, n, sizeof(float)); }

/* Compares n floats on the device with the CPU's; the largest difference
 * relative to the reference's largest magnitude is kept with its name. */
static void compare(checker *c, const char *name, const float *dev, const float *ref, size_t n)
{
    if (c->rc) return;
    char e2[UTIL_ERR_LEN];
    float *h = util_malloc(n * sizeof *h);
    if (!h) { c->rc = util_fail(c->err, UTIL_ENOMEM, "cuda check: out of host memory"); return; }
    c->gpu->d2h(h, dev, n * sizeof *h);
    if (c->gpu->sync(e2)) { util_free(h); c->rc = util_fail(c->err, UTIL_ERUNTIME, "cuda check: %s: %s", name, e2); return; }
    double scale = 1e-30, diff = 0;
    for (size_t i = 0; i < n; i++) {
        scale = fmax(scale, fabs(ref[i]));
        diff = fmax(diff, isfinite(h[i]) ? fabs((double)h[i] - ref[i]) : INFINITY);
    }
    util_free(h);
    if (diff / scale > c->worst || !isfinite(diff)) {
        c->worst = isfinite(diff) ? diff / scale : INFINITY;
        snprintf(c->what, sizeof c->what, "%s", name);
    }
}

static void release(checker *c)
{
    for (int i = 0; i < c->n_dev; i++) c->gpu->release(c->dev[i]);
    for (int i = 0; i < c->n_host; i++) util_free(c->host[i]);
    c->n_dev = c->n_host = 0;
}

/* out[n, o] = inp[n, i] W[o, i]^T + b, and its backward into pre-filled gradients. */
static void check_linear(checker *c)
{
    enum { N = 37, I = 70, O = 45 };
    float *x = host_buf(c, N * I, 1, 2), *w = host_buf(c, O * I, 2, 0.4f), *b = host_buf(c, O, 3, 1);
    float *dy = host_buf(c, N * O, 4, 1), *y = host_buf(c, N * O, 0, 0), *dx = host_buf(c, N * I, 5, 1);
    float *dw = host_buf(c, O * I, 6, 1), *db = host_buf(c, O, 7, 1);
    if (c->rc) return;
    float *Dx = dev_f(c, x, N * I), *Dw = dev_f(c, w, O * I), *Db = dev_f(c, b, O), *Ddy = dev_f(c, dy, N * O);
    float *Dy = dev_f(c, y, N * O), *Ddx = dev_f(c, dx, N * I), *Ddw = dev_f(c, dw, O * I), *Ddb = dev_f(c, db, O);
    if (c->rc) return;
    c->cpu->linear_forward(y, x, w, b, N, I, O);
    c->gpu->linear_forward(Dy, Dx, Dw, Db, N, I, O);
    compare(c, "linear_forward", Dy, y, N * O);
    c->cpu->linear_backward(dx, dw, db, dy, x, w, N, I, O);
    c->gpu->linear_backward(Ddx, Ddw, Ddb, Ddy, Dx, Dw, N, I, O);
    compare(c, "linear_backward dinp", Ddx, dx, N * I);
    compare(c, "linear_backward dw", Ddw, dw, O * I);
    compare(c, "linear_backward db", Ddb, db, O);
}

static void check_rmsnorm_swiglu(checker *c)
{
    enum { N = 29, D = 200 };
    float *x = host_buf(c, N * D, 1, 2), *w = host_buf(c, D, 2, 1), *y = host_buf(c, N * D, 0, 0);
    float *r = host_buf(c, N, 0, 0), *dy = host_buf(c, N * D, 3, 1), *dx = host_buf(c, N * D, 4, 1);
    float *dw = host_buf(c, D, 5, 1), *h = host_buf(c, N * D, 0, 0), *dg = host_buf(c, N * D, 6, 1);
    float *du = host_buf(c, N * D, 7, 1);
    if (c->rc) return;
    float *Dx = dev_f(c, x, N * D), *Dw = dev_f(c, w, D), *Dy = dev_f(c, y, N * D), *Dr = dev_f(c, r, N);
    float *Ddy = dev_f(c, dy, N * D), *Ddx = dev_f(c, dx, N * D), *Ddw = dev_f(c, dw, D), *Dh = dev_f(c, h, N * D);
    float *Ddg = dev_f(c, dg, N * D), *Ddu = dev_f(c, du, N * D);
    if (c->rc) return;
    c->cpu->rmsnorm_forward(y, r, x, w, N, D, 1e-6f);
    c->gpu->rmsnorm_forward(Dy, Dr, Dx, Dw, N, D, 1e-6f);
    compare(c, "rmsnorm_forward", Dy, y, N * D);
    compare(c, "rmsnorm_forward rstd", Dr, r, N);
    c->cpu->rmsnorm_backward(dx, dw, dy, x, w, r, N, D);
    c->gpu->rmsnorm_backward(Ddx, Ddw, Ddy, Dx, Dw, Dr, N, D);
    compare(c, "rmsnorm_backward dinp", Ddx, dx, N * D);
    compare(c, "rmsnorm_backward dw", Ddw, dw, D);
    c->cpu->swiglu_forward(h, x, dy, N * D);
    c->gpu->swiglu_forward(Dh, Dx, Ddy, N * D);
    compare(c, "swiglu_forward", Dh, h, N * D);
    c->cpu->swiglu_backward(dg, du, y, x, dy, N * D);
    c->gpu->swiglu_backward(Ddg, Ddu, Dy, Dx, Ddy, N * D);
    compare(c, "swiglu_backward dg", Ddg, dg, N * D);
    compare(c, "swiglu_backward du", Ddu, du, N * D);
    c->cpu->quick_gelu_forward(h, x, N * D);
    c->gpu->quick_gelu_forward(Dh, Dx, N * D);
    compare(c, "quick_gelu_forward", Dh, h, N * D);
    c->cpu->quick_gelu_backward(dg, dy, x, N * D);
    c->gpu->quick_gelu_backward(Ddg, Ddy, Dx, N * D);
    compare(c, "quick_gelu_backward", Ddg, dg, N * D);
    c->cpu->add_inplace(y, x, N * D);
    c->gpu->add_inplace(Dy, Dx, N * D);
    compare(c, "add_inplace", Dy, y, N * D);
}

/* The audio encoder's kernels: LayerNorm, the conv stem's im2col / col2im
 * (stride 2, an output range starting inside the sequence) and row pooling. */
static void check_whisper(checker *c)
{
    enum { N = 29, D = 200, C = 24, K = 3, NX = 40, R = 17 };
    float *x = host_buf(c, N * D, 1, 2), *w = host_buf(c, D, 2, 1), *b = host_buf(c, D, 3, 1);
    float *y = host_buf(c, N * D, 0, 0), *mu = host_buf(c, N, 0, 0), *r = host_buf(c, N, 0, 0);
    float *dy = host_buf(c, N * D, 4, 1), *dx = host_buf(c, N * D, 5, 1), *dw = host_buf(c, D, 6, 1);
    float *db = host_buf(c, D, 7, 1), *col = host_buf(c, R * C * K, 0, 0), *dxc = host_buf(c, NX * C, 8, 1);
    float *pool = host_buf(c, N / 2 * D, 0, 0);
    if (c->rc) return;
    float *Dx = dev_f(c, x, N * D), *Dw = dev_f(c, w, D), *Db = dev_f(c, b, D), *Dy = dev_f(c, y, N * D);
    float *Dmu = dev_f(c, mu, N), *Dr = dev_f(c, r, N), *Ddy = dev_f(c, dy, N * D), *Ddx = dev_f(c, dx, N * D);
    float *Ddw = dev_f(c, dw, D), *Ddb = dev_f(c, db, D), *Dcol = dev_f(c, col, R * C * K);
    float *Ddxc = dev_f(c, dxc, NX * C), *Dpool = dev_f(c, pool, N / 2 * D);
    if (c->rc) return;
    c->cpu->layernorm_forward(y, mu, r, x, w, b, N, D, 1e-5f);
    c->gpu->layernorm_forward(Dy, Dmu, Dr, Dx, Dw, Db, N, D, 1e-5f);
    compare(c, "layernorm_forward", Dy, y, N * D);
    compare(c, "layernorm_forward rstd", Dr, r, N);
    c->cpu->layernorm_backward(dx, dw, db, dy, x, w, mu, r, N, D);
    c->gpu->layernorm_backward(Ddx, Ddw, Ddb, Ddy, Dx, Dw, Dmu, Dr, N, D);
    compare(c, "layernorm_backward dinp", Ddx, dx, N * D);
    compare(c, "layernorm_backward dw", Ddw, dw, D);
    compare(c, "layernorm_backward db", Ddb, db, D);
    c->cpu->im2col1d(col, x, R, C, K, 2, 1, 2, 3, NX);
    c->gpu->im2col1d(Dcol, Dx, R, C, K, 2, 1, 2, 3, NX);
    compare(c, "im2col1d", Dcol, col, R * C * K);
    c->cpu->col2im1d(dxc, dy, R, C, K, 2, 1, 2, 3, NX);
    c->gpu->col2im1d(Ddxc, Ddy, R, C, K, 2, 1, 2, 3, NX);
    compare(c, "col2im1d", Ddxc, dxc, NX * C);
    c->cpu->avgpool_rows_forward(pool, x, N / 2, 2, D);
    c->gpu->avgpool_rows_forward(Dpool, Dx, N / 2, 2, D);
    compare(c, "avgpool_rows_forward", Dpool, pool, N / 2 * D);
    c->cpu->avgpool_rows_backward(dx, pool, N / 2, 2, D);
    c->gpu->avgpool_rows_backward(Ddx, Dpool, N / 2, 2, D);
    compare(c, "avgpool_rows_backward", Ddx, dx, N * D);
}

/* Two sequences (one longer than a key tile), GQA 4/2, causal and not. */
static void check_attention(checker *c, bool causal)
{
    enum { N = 150, H = 4, HKV = 2, HD = 24 };
    const int cu[3] = {0, 97, N};
    size_t qn = (size_t)N * H * HD, kn = (size_t)N * HKV * HD;
    float *q = host_buf(c, qn, 1, 2), *k = host_buf(c, kn, 2, 2), *v = host_buf(c, kn, 3, 1);
    float *g = host_buf(c, qn, 4, 1), *o = host_buf(c, qn, 0, 0), *l = host_buf(c, (size_t)N * H, 0, 0);
    float *dq = host_buf(c, qn, 5, 1), *dk = host_buf(c, kn, 6, 1), *dv = host_buf(c, kn, 7, 1);
    if (c->rc) return;
    float *Dq = dev_f(c, q, qn), *Dk = dev_f(c, k, kn), *Dv = dev_f(c, v, kn), *Dg = dev_f(c, g, qn);
    float *Do = dev_f(c, o, qn), *Dl = dev_f(c, l, (size_t)N * H), *Ddq = dev_f(c, dq, qn);
    float *Ddk = dev_f(c, dk, kn), *Ddv = dev_f(c, dv, kn);
    int *Dcu = dev_copy(c, cu, 3, sizeof(int));
    if (c->rc) return;
    c->cpu->attention_forward(o, l, q, k, v, cu, 2, H, HKV, HD, causal);
    c->gpu->attention_forward(Do, Dl, Dq, Dk, Dv, Dcu, 2, H, HKV, HD, causal);
    compare(c, causal ? "attention_forward causal" : "attention_forward", Do, o, qn);
    compare(c, "attention_forward lse", Dl, l, (size_t)N * H);
    c->cpu->attention_backward(dq, dk, dv, g, q, k, v, o, l, cu, 2, H, HKV, HD, causal);
    c->gpu->attention_backward(Ddq, Ddk, Ddv, Dg, Dq, Dk, Dv, Do, Dl, Dcu, 2, H, HKV, HD, causal);
    compare(c, "attention_backward dq", Ddq, dq, qn);
    compare(c, "attention_backward dk", Ddk, dk, kn);
    compare(c, "attention_backward dv", Ddv, dv, kn);
}

/* The bf16 attention (set_attention_bf16: executor/cuda_attention16.cuh, WMMA
 * on tensor cores) against the device's fp32 one on check_attention's inputs,
 * forward and backward, causal and not. The emulator checks its rounding
 * element by element within a derived bound (tests/test_attention16.c:
 * largest |bf16 - fp32| / largest |fp32| 4.0e-3 there, about u = 2^-8); on
 * the device only the tensor cores' summation order differs (2^-23-sized), so
 * what this adds is the real fragment lane layout, warps and barriers, whose
 * faults show as errors of the order of the values: allowed 2^-5 of the
 * largest value (8 times the emulator's largest), reported apart from the
 * fp32 kernels' worst. */
#define ATT16_CHECK_TOLERANCE 0.03125

static void compare16(checker *c, const char *name, const float *dev16, const float *dev32, size_t n)
{
    float *ref = host_buf(c, n, 0, 0);
    if (c->rc) return;
    c->gpu->d2h(ref, dev32, n * sizeof *ref);
    double keep = c->worst;
    char keep_what[sizeof c->what];
    memcpy(keep_what, c->what, sizeof keep_what);
    c->worst = 0;
    compare(c, name, dev16, ref, n);
    if (!c->rc && !(c->worst <= ATT16_CHECK_TOLERANCE))
        c->rc = util_fail(c->err, UTIL_ERUNTIME, "cuda check: bf16 %s differs from the fp32 kernel by %.3g of its largest "
                          "value (allowed %g)", name, c->worst, ATT16_CHECK_TOLERANCE);
    c->worst = keep;
    memcpy(c->what, keep_what, sizeof keep_what);
}

static void check_attention16(checker *c, bool causal)
{
    enum { N = 150, H = 4, HKV = 2, HD = 80 };
    const int cu[3] = {0, 97, N};
    size_t qn = (size_t)N * H * HD, kn = (size_t)N * HKV * HD, ln = (size_t)N * H;
    float *q = host_buf(c, qn, 1, 2), *k = host_buf(c, kn, 2, 2), *v = host_buf(c, kn, 3, 1);
    float *g = host_buf(c, qn, 4, 1), *z = host_buf(c, qn, 0, 0);
    if (c->rc || !c->gpu->set_attention_bf16) return;
    float *Dq = dev_f(c, q, qn), *Dk = dev_f(c, k, kn), *Dv = dev_f(c, v, kn), *Dg = dev_f(c, g, qn);
    float *D[2][5];   /* [fp32, bf16][out, lse, dq, dk, dv] */
    for (int i = 0; i < 2; i++) {
        D[i][0] = dev_f(c, z, qn);
        D[i][1] = dev_f(c, z, ln);
        D[i][2] = dev_f(c, z, qn);
        D[i][3] = dev_f(c, z, kn);
        D[i][4] = dev_f(c, z, kn);
    }
    int *Dcu = dev_copy(c, cu, 3, sizeof(int));
    if (c->rc) return;
    for (int i = 0; i < 2; i++) {
        c->gpu->set_attention_bf16(i == 1);
        c->gpu->attention_forward(D[i][0], D[i][1], Dq, Dk, Dv, Dcu, 2, H, HKV, HD, causal);
        /* both backwards from the fp32 forward's out and lse */
        c->gpu->attention_backward(D[i][2], D[i][3], D[i][4], Dg, Dq, Dk, Dv, D[0][0], D[0][1], Dcu, 2, H, HKV, HD, causal);
    }
    c->gpu->set_attention_bf16(false);
    const char *names[5] = { "attention_forward", "attention_forward lse", "attention_backward dq",
                             "attention_backward dk", "attention_backward dv" };
    size_t sizes[5] = { qn, ln, qn, kn, kn };
    for (int a = 0; a < 5; a++) compare16(c, names[a], D[1][a], D[0][a], sizes[a]);
}

/* Ring attention's pieces: two sequences of 75 rows, every query over two
 * key blocks (0..29, 30..74) merged, their backward from the merged result;
 * and the Ulysses packing's transpose. */
static void check_ring(checker *c)
{
    enum { S = 2, L = 75, H = 4, HKV = 2, HD = 24, K0 = 30 };
    size_t qn = (size_t)S * L * H * HD, kn = (size_t)S * L * HKV * HD, ln = (size_t)S * L * H;
    float *q = host_buf(c, qn, 1, 2), *k = host_buf(c, kn, 2, 2), *v = host_buf(c, kn, 3, 1), *g = host_buf(c, qn, 4, 1);
    float *o = host_buf(c, qn, 0, 0), *l = host_buf(c, ln, 0, 0), *po = host_buf(c, qn, 0, 0), *pl = host_buf(c, ln, 0, 0);
    float *dq = host_buf(c, qn, 5, 1), *dk = host_buf(c, kn, 6, 1), *dv = host_buf(c, kn, 7, 1), *t = host_buf(c, kn, 0, 0);
    if (c->rc) return;
    float *Dq = dev_f(c, q, qn), *Dk = dev_f(c, k, kn), *Dv = dev_f(c, v, kn), *Dg = dev_f(c, g, qn);
    float *Do = dev_f(c, o, qn), *Dl = dev_f(c, l, ln), *Dpo = dev_f(c, po, qn), *Dpl = dev_f(c, pl, ln);
    float *Ddq = dev_f(c, dq, qn), *Ddk = dev_f(c, dk, kn), *Ddv = dev_f(c, dv, kn), *Dt = dev_f(c, t, kn);
    if (c->rc) return;
    const ex_backend *be[2] = { c->cpu, c->gpu };
    float *buf[2][11] = { { o, l, po, pl, q, k, v, g, dq, dk, dv }, { Do, Dl, Dpo, Dpl, Dq, Dk, Dv, Dg, Ddq, Ddk, Ddv } };
    for (int i = 0; i < 2; i++) {
        float **x = buf[i];
        be[i]->attention_part_forward(x[0], x[1], x[4], x[5], x[6], S, L, 0, L, 0, K0, H, HKV, HD);
        be[i]->attention_part_forward(x[2], x[3], x[4], x[5], x[6], S, L, 0, L, K0, L - K0, H, HKV, HD);
        be[i]->attention_merge(x[0], x[1], x[2], x[3], S, L, 0, L, H, HD);
        be[i]->attention_part_backward(x[8], x[9], x[10], x[7], x[4], x[5], x[6], x[0], x[1], S, L, 0, L, 0, K0, H, HKV, HD);
        be[i]->attention_part_backward(x[8], x[9], x[10], x[7], x[4], x[5], x[6], x[0], x[1], S, L, 0, L, K0, L - K0, H,
                                       HKV, HD);
    }
    compare(c, "attention_part_forward + merge", Do, o, qn);
    compare(c, "attention_merge lse", Dl, l, ln);
    compare(c, "attention_part_backward dq", Ddq, dq, qn);
    compare(c, "attention_part_backward dk", Ddk, dk, kn);
    compare(c, "attention_part_backward dv", Ddv, dv, kn);
    c->cpu->transpose_blocks(t, k, S * L, HKV, HD);
    c->gpu->transpose_blocks(Dt, Dk, S * L, HKV, HD);
    compare(c, "transpose_blocks", Dt, t, kn);
}

static void check_cross_entropy_adamw(checker *c)
{
    enum { N = 13, V = 1000 };
    float *logits = host_buf(c, N * V, 1, 8), *dl = host_buf(c, N * V, 0, 0);
    int32_t t[N];
    for (int r = 0; r < N; r++) t[r] = (r * 389 + 17) % V;
    if (c->rc) return;
    float *Dlog = dev_f(c, logits, N * V), *Ddl = dev_f(c, dl, N * V);
    int32_t *Dt = dev_copy(c, t, N, sizeof *t);
    if (c->rc) return;
    double ref = c->cpu->cross_entropy(dl, logits, t, N, V, 0.25f);
    double got = c->gpu->cross_entropy(Ddl, Dlog, Dt, N, V, 0.25f);
    compare(c, "cross_entropy dlogits", Ddl, dl, N * V);
    float lref = (float)ref, lgot = (float)got;
    float *Dl = dev_f(c, &lgot, 1);
    compare(c, "cross_entropy loss", Dl, &lref, 1);
    enum { P = 5003 };
    float *p = host_buf(c, P, 2, 1), *g = host_buf(c, P, 3, 1), *m = host_buf(c, P, 4, 0.1f), *v = host_buf(c, P, 5, 0.1f);
    if (c->rc) return;
    for (int i = 0; i < P; i++) v[i] *= v[i];
    float *Dp = dev_f(c, p, P), *Dg = dev_f(c, g, P), *Dm = dev_f(c, m, P), *Dv = dev_f(c, v, P);
    if (c->rc) return;
    c->cpu->adamw(p, g, m, v, P, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.271f, 0.00399f);
    c->gpu->adamw(Dp, Dg, Dm, Dv, P, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.271f, 0.00399f);
    compare(c, "adamw p", Dp, p, P);
    compare(c, "adamw m", Dm, m, P);
    compare(c, "adamw v", Dv, v, P);
    double sref = c->cpu->sumsq(g, P), sgot = c->gpu->sumsq(Dg, P);
    float fref = (float)sref, fgot = (float)sgot;
    float *Ds = dev_f(c, &fgot, 1);
    compare(c, "sumsq", Ds, &fref, 1);
}

/* The LLM head's rows: gathered, and their gradient scatter-added back. */
static void check_rows(checker *c)
{
    enum { N = 300, R = 257, D = 96 };
    int rows[R];
    for (int i = 0; i < R; i++) rows[i] = (i * 7 + 3) % N;   /* distinct, out of order */
    float *src = host_buf(c, N * D, 1, 2), *got = host_buf(c, R * D, 0, 0), *g = host_buf(c, R * D, 2, 1);
    float *dst = host_buf(c, N * D, 3, 1);
    if (c->rc) return;
    float *Dsrc = dev_f(c, src, N * D), *Dgot = dev_f(c, got, R * D), *Dg = dev_f(c, g, R * D), *Ddst = dev_f(c, dst, N * D);
    int *Drows = dev_copy(c, rows, R, sizeof *rows);
    if (c->rc) return;
    c->cpu->gather_rows(got, src, rows, R, D);
    c->gpu->gather_rows(Dgot, Dsrc, Drows, R, D);
    compare(c, "gather_rows", Dgot, got, R * D);
    c->cpu->scatter_add_rows(dst, g, rows, R, D);
    c->gpu->scatter_add_rows(Ddst, Dg, Drows, R, D);
    compare(c, "scatter_add_rows", Ddst, dst, N * D);
}

int ex_cuda_check(double *worst, char *what, size_t what_len, char *err)
{
    checker c = {ex_backend_cpu(), ex_backend_cuda(err), {0}, {0}, 0, 0, 0, "", err, UTIL_OK};
    if (!c.gpu) return UTIL_ERUNTIME;
    check_linear(&c);
    release(&c);
    check_rmsnorm_swiglu(&c);
    release(&c);
    check_whisper(&c);
    release(&c);
    check_attention(&c, false);
    release(&c);
    check_attention(&c, true);
    release(&c);
    check_attention16(&c, false);
    release(&c);
    check_attention16(&c, true);
    release(&c);
    check_ring(&c);
    release(&c);
    check_cross_entropy_adamw(&c);
    release(&c);
    check_rows(&c);
    release(&c);
    *worst = c.worst;
    if (what && what_len) snprintf(what, what_len, "%s", c.what[0] ? c.what : "none");
    return c.rc;
}
