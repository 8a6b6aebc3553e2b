/* CPU backend: OpenBLAS sgemm for the linears, plain loops for the rest.
 * Shapes and math of each kernel are stated above it; see executor/backend.h
 * for the conventions (row-major, local shard shapes, backward accumulates). */
#include "executor/cpu_int.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------ thread pool
 * The GEMMs thread inside OpenBLAS; the loops here (AdamW, attention, sums of
 * squares, element-wise) run on a pool of as many threads as OpenBLAS is set
 * to use (OPENBLAS_NUM_THREADS, or openblas_set_num_threads, read at each
 * call), the caller being one of them. Work is split into contiguous index
 * ranges whose results do not depend on the split (element ranges, attention
 * units that own their outputs, fixed blocks of a sum), so any thread count
 * gives bit-identical results. Workers sleep on a condition variable between
 * calls (no spinning next to OpenBLAS's own threads). One caller at a time: a
 * second thread calling in while the pool is busy (the in-process
 * tensor-parallel tests) runs its loop itself. */
#define CPU_MAX_THREADS 64
/* Elements per thread below which an element-wise loop stays on the caller:
 * waking a worker costs some microseconds, 32K floats take about as long. */
#define CPU_GRAIN 32768


static struct {
    pthread_mutex_t call;      /* held by the one caller using the pool */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int workers;               /* threads besides the caller */
    unsigned long gen;         /* bumped per parallel call */
    unsigned long start_gen[CPU_MAX_THREADS];
    int pending;               /* workers still running the current call */
    cpu_range_fn fn;
    void *ctx;
    size_t n, chunk;
} pool = { .call = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
           .go = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER };

/* Worker id (1 .. workers) runs range [id * chunk, (id + 1) * chunk) of each call. */
static void *pool_worker(void *arg)
{
    size_t id = (size_t)(uintptr_t)arg;
    pthread_mutex_lock(&pool.mu);
    unsigned long seen = pool.start_gen[id];
    for (;;) {
        while (pool.gen == seen) pthread_cond_wait(&pool.go, &pool.mu);
        seen = pool.gen;
        cpu_range_fn fn = pool.fn;
        void *ctx = pool.ctx;
        size_t lo = id * pool.chunk, hi = lo + pool.chunk < pool.n ? lo + pool.chunk : pool.n;
        pthread_mutex_unlock(&pool.mu);
        if (lo < hi) fn(ctx, lo, hi);
        pthread_mutex_lock(&pool.mu);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done);
    }
    return NULL;
}

/* Starts workers up to threads - 1 (caller holds pool.call; none is running a call).
 * Returns the threads available, caller included. */
static int pool_grow(int threads)
{
    if (threads > CPU_MAX_THREADS) threads = CPU_MAX_THREADS;
    pthread_attr_t attr;
    if (pool.workers + 1 >= threads || pthread_attr_init(&attr)) return pool.workers + 1;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    while (pool.workers + 1 < threads) {
        int id = pool.workers + 1;
        pthread_t t;
        pthread_mutex_lock(&pool.mu);
        pool.start_gen[id] = pool.gen;
        int rc = pthread_create(&t, &attr, pool_worker, (void *)(uintptr_t)id);
        if (!rc) pool.workers = id;
        pthread_mutex_unlock(&pool.mu);
        if (rc) break;
    }
    pthread_attr_destroy(&attr);
    return pool.workers + 1;
}

/* fn(ctx, lo, hi) over [0, n) in contiguous ranges, one per thread (at most
 * n / grain threads); serial with one thread or while another caller holds the pool. */
void ex_cpu_parallel(size_t n, size_t grain, cpu_range_fn fn, void *ctx)
{
    if (n == 0) return;
    size_t t = (size_t)openblas_get_num_threads(), most = n / (grain ? grain : 1);
    if (t > most) t = most;
    if (t < 2 || pthread_mutex_trylock(&pool.call)) {
        fn(ctx, 0, n);
        return;
    }
    size_t have = (size_t)pool_grow((int)(t < CPU_MAX_THREADS ? t : CPU_MAX_THREADS));
    if (t > have) t = have;
    if (t < 2) {
        pthread_mutex_unlock(&pool.call);
        fn(ctx, 0, n);
        return;
    }
    size_t chunk = (n + t - 1) / t;
    pthread_mutex_lock(&pool.mu);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.chunk = chunk;
    pool.pending = pool.workers;
    pool.gen++;
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.mu);
    fn(ctx, 0, chunk);
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.call);
}

/* ------------------------------------------------------------ element-wise */

typedef struct { float *y; const float *x; float s; } ew_args;

static void zero_range(void *c, size_t lo, size_t hi) { ew_args *a = c; memset(a->y + lo, 0, (hi - lo) * sizeof(float)); }
static void add_range(void *c, size_t lo, size_t hi)
{
    ew_args *a = c;
    for (size_t i = lo; i < hi; i++) a->y[i] += a->x[i];
}
static void scale_range(void *c, size_t lo, size_t hi)
{
    ew_args *a = c;
    for (size_t i = lo; i < hi; i++) a->y[i] *= a->s;
}

static void cpu_zero(float *x, size_t n) { ew_args a = { x, NULL, 0 }; ex_cpu_parallel(n, 4 * CPU_GRAIN, zero_range, &a); }
static void cpu_copy(float *dst, const float *src, size_t n) { if (n) memmove(dst, src, n * sizeof *dst); }
static void cpu_add_inplace(float *y, const float *x, size_t n) { ew_args a = { y, x, 0 }; ex_cpu_parallel(n, CPU_GRAIN, add_range, &a); }
static void cpu_add_bias(float *y, const float *b, int n, int d)
{
    for (int r = 0; r < n; r++)
        for (int j = 0; j < d; j++) y[(size_t)r * d + j] += b[j];
}
static void cpu_scale_inplace(float *y, float s, size_t n) { ew_args a = { y, NULL, s }; ex_cpu_parallel(n, CPU_GRAIN, scale_range, &a); }

/* dst[c, r, :] = src[r, c, :], blocks of blk floats (the Ulysses re-sharding around its all-to-alls). */
typedef struct { float *dst; const float *src; size_t rows, cols, blk; } tr_args;

static void transpose_range(void *c, size_t lo, size_t hi)
{
    const tr_args *a = c;
    for (size_t i = lo; i < hi; i++) {   /* i = r * cols + col: source block order */
        size_t r = i / a->cols, col = i % a->cols;
        memcpy(a->dst + (col * a->rows + r) * a->blk, a->src + i * a->blk, a->blk * sizeof(float));
    }
}

static void cpu_transpose_blocks(float *dst, const float *src, int rows, int cols, size_t blk)
{
    tr_args a = { dst, src, (size_t)(rows > 0 ? rows : 0), (size_t)(cols > 0 ? cols : 0), blk };
    if (blk) ex_cpu_parallel(a.rows * a.cols, CPU_GRAIN / blk + 1, transpose_range, &a);
}

/* sum_i x[i]^2 in double, in 8 interleaved partial sums (lane l takes i = l mod 8),
 * so the adds are independent and vectorize; the lanes are summed pairwise. */
static double sumsq_serial(const float *x, size_t n)
{
    double a[8] = { 0 };
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) a[l] += (double)x[i + l] * x[i + l];
    for (; i < n; i++) a[0] += (double)x[i] * x[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

#define SUMSQ_BLOCKS 256
typedef struct { const float *x; size_t n, block; double part[SUMSQ_BLOCKS]; } sumsq_args;

static void sumsq_range(void *c, size_t lo, size_t hi)
{
    sumsq_args *A = c;
    for (size_t b = lo; b < hi; b++) {
        size_t i0 = b * A->block, i1 = i0 + A->block < A->n ? i0 + A->block : A->n;
        A->part[b] = i0 < i1 ? sumsq_serial(A->x + i0, i1 - i0) : 0;
    }
}

/* sum_i x[i]^2: blocks of a size that depends on n only (at most SUMSQ_BLOCKS of
 * them, at least CPU_GRAIN elements), each summed by sumsq_serial on some thread,
 * then the block sums added in order, so the result does not depend on the
 * thread count. */
static double cpu_sumsq(const float *x, size_t n)
{
    sumsq_args A = { .x = x, .n = n };
    A.block = (n + SUMSQ_BLOCKS - 1) / SUMSQ_BLOCKS;
    if (A.block < CPU_GRAIN) A.block = CPU_GRAIN;
    size_t nb = (n + A.block - 1) / A.block;
    ex_cpu_parallel(nb, 1, sumsq_range, &A);
    double s = 0;
    for (size_t b = 0; b < nb; b++) s += A.part[b];
    return s;
}

/* linear: out[n, o] = inp[n, i] @ w[o, i]^T + b[o]   (b may be NULL) */
static void cpu_linear_forward(float *out, const float *inp, const float *w, const float *b,
                               int n, int in, int o)
{
    if (n <= 0 || o <= 0) return;
    float beta = 0.0f;
    if (b) {
        for (int r = 0; r < n; r++) memcpy(out + (size_t)r * o, b, (size_t)o * sizeof *b);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, in, 1.0f, inp, in, w, in,
                beta, out, o);
}

/* linear backward: dinp[n, i] += dout[n, o] @ w[o, i];  dw[o, i] += dout^T @ inp;
 * db[o] += sum_n dout[n, o] */
static void cpu_linear_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, int n, int in, int o)
{
    if (n <= 0 || o <= 0) return;
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, o, 1.0f, dout, o, w, in,
                    1.0f, dinp, in);
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, in, n, 1.0f, dout, o, inp, in,
                    1.0f, dw, in);
    if (db)
        for (int r = 0; r < n; r++)
            for (int j = 0; j < o; j++) db[j] += dout[(size_t)r * o + j];
}

/* RMSNorm: rstd[r] = 1 / sqrt(mean_j x[r, j]^2 + eps);  out[r, j] = x[r, j] * rstd[r] * w[j] */
static void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w,
                                int n, int d, float eps)
{
    for (int r = 0; r < n; r++) {
        const float *x = inp + (size_t)r * d;
        float *y = out + (size_t)r * d;
        double ss = 0;
        for (int j = 0; j < d; j++) ss += (double)x[j] * x[j];
        float s = (float)(1.0 / sqrt(ss / d + eps));
        rstd[r] = s;
        for (int j = 0; j < d; j++) y[j] = x[j] * s * w[j];
    }
}

/* RMSNorm backward, xhat = x * rstd, gw = dout * w:
 * dw[j] += sum_r dout[r, j] * xhat[r, j];
 * dinp[r, j] += rstd[r] * (gw[r, j] - xhat[r, j] * mean_k(gw[r, k] * xhat[r, k])) */
static void cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp,
                                 const float *w, const float *rstd, int n, int d)
{
    for (int r = 0; r < n; r++) {
        const float *x = inp + (size_t)r * d, *g = dout + (size_t)r * d;
        float s = rstd[r];
        double dot = 0;
        for (int j = 0; j < d; j++) dot += (double)g[j] * w[j] * x[j] * s;
        float mean = (float)(dot / d);
        for (int j = 0; j < d; j++) {
            float xhat = x[j] * s;
            if (dw) dw[j] += g[j] * xhat;
            if (dinp) dinp[(size_t)r * d + j] += s * (g[j] * w[j] - xhat * mean);
        }
    }
}

/* RoPE, rotate-half (NeoX / Hugging Face) pairing, in place on x[n, nh, hd]:
 * with a = x[.., i], b = x[.., i + hd/2], c = cos[t, i], s = sin[t, i] (cos/sin are [n, hd/2]):
 * a' = a c - b s;  b' = b c + a s */
static void cpu_rope_forward(float *x, const float *cos, const float *sin, int n, int nh, int hd)
{
    int half = hd / 2;
    for (int t = 0; t < n; t++) {
        const float *c = cos + (size_t)t * half, *s = sin + (size_t)t * half;
        for (int h = 0; h < nh; h++) {
            float *v = x + ((size_t)t * nh + h) * hd;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}

/* RoPE backward, in place on dx[n, nh, hd] (the transpose rotation):
 * da = ga c + gb s;  db = gb c - ga s */
static void cpu_rope_backward(float *dx, const float *cos, const float *sin, int n, int nh, int hd)
{
    int half = hd / 2;
    for (int t = 0; t < n; t++) {
        const float *c = cos + (size_t)t * half, *s = sin + (size_t)t * half;
        for (int h = 0; h < nh; h++) {
            float *v = dx + ((size_t)t * nh + h) * hd;
            for (int i = 0; i < half; i++) {
                float ga = v[i], gb = v[i + half];
                v[i] = ga * c[i] + gb * s[i];
                v[i + half] = gb * c[i] - ga * s[i];
            }
        }
    }
}


static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* SwiGLU: h = silu(g) * u, silu(g) = g * sigmoid(g); elementwise over n */
typedef struct { float *y, *y2; const float *a, *b, *c; } act_args;

static void swiglu_fwd_range(void *ctx, size_t lo, size_t hi)
{
    act_args *A = ctx;
    for (size_t i = lo; i < hi; i++) A->y[i] = A->a[i] * sigmoidf(A->a[i]) * A->b[i];
}

static void cpu_swiglu_forward(float *h, const float *g, const float *u, size_t n)
{
    act_args A = { .y = h, .a = g, .b = u };
    ex_cpu_parallel(n, CPU_GRAIN, swiglu_fwd_range, &A);
}

/* SwiGLU backward: du += dh silu(g);  dg += dh u sigmoid(g) (1 + g (1 - sigmoid(g))) */
static void swiglu_bwd_range(void *ctx, size_t lo, size_t hi)
{
    act_args *A = ctx;
    float *dg = A->y, *du = A->y2;
    const float *dh = A->a, *g = A->b, *u = A->c;
    for (size_t i = lo; i < hi; i++) {
        float s = sigmoidf(g[i]);
        du[i] += dh[i] * g[i] * s;
        dg[i] += dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
}

static void cpu_swiglu_backward(float *dg, float *du, const float *dh, const float *g,
                                const float *u, size_t n)
{
    act_args A = { .y = dg, .y2 = du, .a = dh, .b = g, .c = u };
    ex_cpu_parallel(n, CPU_GRAIN, swiglu_bwd_range, &A);
}

/* GELU, exact erf form (torch.nn.GELU() default, the Qwen2.5-VL merger's activation):
 * out = 0.5 x (1 + erf(x / sqrt 2)) */
static void cpu_gelu_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * (float)M_SQRT1_2));
}

/* Quick GELU (CLIP's hidden_act, transformers activations.py QuickGELUActivation):
 * out = x sigmoid(1.702 x); dinp += dout s (1 + 1.702 x (1 - s)). */
static void cpu_quick_gelu_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = inp[i] / (1.0f + expf(-1.702f * inp[i]));
}

static void cpu_quick_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], s = 1.0f / (1.0f + expf(-1.702f * x));
        dinp[i] += dout[i] * s * (1.0f + 1.702f * x * (1.0f - s));
    }
}

/* GELU backward: dinp += dout (0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)) */
static void cpu_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
    const float inv_sqrt_2pi = 0.3989422804014327f;
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float d = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2)) + x * expf(-0.5f * x * x) * inv_sqrt_2pi;
        dinp[i] += dout[i] * d;
    }
}

/* Embedding over vocab rows [v0, v0 + vn) held in wte[vn, d]:
 * out[t, :] = wte[tokens[t] - v0, :] if the token is in range, else 0 */
static void cpu_embedding_forward(float *out, const float *wte, const int32_t *tokens, int n, int d,
                                  int v0, int vn)
{
    for (int t = 0; t < n; t++) {
        int r = tokens[t] - v0;
        if (r >= 0 && r < vn) memcpy(out + (size_t)t * d, wte + (size_t)r * d, (size_t)d * sizeof *wte);
        else memset(out + (size_t)t * d, 0, (size_t)d * sizeof *out);
    }
}

/* Embedding backward: dwte[tokens[t] - v0, :] += dout[t, :] for in-range tokens */
static void cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int n, int d,
                                   int v0, int vn)
{
    for (int t = 0; t < n; t++) {
        int r = tokens[t] - v0;
        if (r < 0 || r >= vn) continue;
        float *row = dwte + (size_t)r * d;
        const float *g = dout + (size_t)t * d;
        for (int j = 0; j < d; j++) row[j] += g[j];
    }
}

/* Rows by index: gather dst[i, :] = src[rows[i], :]; scatter-add
 * dst[rows[i], :] += src[i, :] (distinct rows, so the ranges of rows the
 * threads take never write the same row). */
static void cpu_gather_rows(float *dst, const float *src, const int *rows, int n, int d)
{
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * d, src + (size_t)rows[i] * d, (size_t)d * sizeof *dst);
}

typedef struct { float *dst; const float *src; const int *rows; int d; } rows_args;

static void scatter_add_range(void *c, size_t lo, size_t hi)
{
    rows_args *a = c;
    for (size_t i = lo; i < hi; i++) {
        float *y = a->dst + (size_t)a->rows[i] * a->d;
        const float *x = a->src + i * a->d;
        for (int j = 0; j < a->d; j++) y[j] += x[j];
    }
}

static void cpu_scatter_add_rows(float *dst, const float *src, const int *rows, int n, int d)
{
    if (n <= 0 || d <= 0) return;
    rows_args a = { dst, src, rows, d };
    ex_cpu_parallel((size_t)n, CPU_GRAIN / (size_t)d + 1, scatter_add_range, &a);
}

/* ce_row_max: mx[r] = max_c logits[r, c] */
static void cpu_ce_row_max(float *mx, const float *logits, int n, int vocab)
{
    for (int r = 0; r < n; r++) {
        const float *z = logits + (size_t)r * vocab;
        float m = -INFINITY;
        for (int c = 0; c < vocab; c++) m = z[c] > m ? z[c] : m;
        mx[r] = m;
    }
}

/* ce_exp_sum: st[r] = sum_c exp(z[r, c] - mx[r]) (summed in double), st[n + r] = the
 * target's logit if local (else 0), probs[r, c] = exp(z[r, c] - mx[r]) when wanted. */
static void cpu_ce_exp_sum(float *probs, float *st, const float *logits, const float *mx,
                           const int32_t *targets, int n, int vocab, int v0)
{
    for (int r = 0; r < n; r++) {
        const float *z = logits + (size_t)r * vocab;
        float m = mx[r];
        double sum = 0;
        if (probs) {
            float *p = probs + (size_t)r * vocab;
            for (int c = 0; c < vocab; c++) { p[c] = expf(z[c] - m); sum += p[c]; }
        } else {
            for (int c = 0; c < vocab; c++) sum += expf(z[c] - m);
        }
        int t = targets[r] - v0;
        st[r] = (float)sum;
        st[n + r] = t >= 0 && t < vocab ? z[t] : 0.0f;
    }
}

/* ce_grad: dlogits[r, c] = dscale * (probs[r, c] / st[r] - [c == targets[r] - v0]), in place */
static void cpu_ce_grad(float *dlogits, const float *st, const int32_t *targets, int n, int vocab,
                        int v0, float dscale)
{
    for (int r = 0; r < n; r++) {
        float *p = dlogits + (size_t)r * vocab, s = dscale / st[r];
        for (int c = 0; c < vocab; c++) p[c] *= s;
        int t = targets[r] - v0;
        if (t >= 0 && t < vocab) p[t] -= dscale;
    }
}

/* Cross-entropy, fused forward + backward over logits[n, vocab] (the whole vocabulary):
 * returns sum_r (logsumexp(logits[r]) - logits[r, targets[r]]) (the caller divides);
 * if dlogits != NULL: dlogits[r, c] = dscale * (softmax(logits[r])[c] - [c == targets[r]]).
 * The three vocab-parallel pieces with a group of one. */
static double cpu_cross_entropy(float *dlogits, const float *logits, const int32_t *targets,
                                int n, int vocab, float dscale)
{
    double total = 0;
    for (int r = 0; r < n; r++) {
        float mx, st[2];
        size_t o = (size_t)r * vocab;
        cpu_ce_row_max(&mx, logits + o, 1, vocab);
        cpu_ce_exp_sum(dlogits ? dlogits + o : NULL, st, logits + o, &mx, targets + r, 1, vocab, 0);
        total += mx + log((double)st[0]) - st[1];
        if (dlogits) cpu_ce_grad(dlogits + o, st, targets + r, 1, vocab, 0, dscale);
    }
    return total;
}

/* AdamW, the torch.optim.AdamW update (decoupled weight decay):
 * p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 * p -= (lr / bias_c1) m / (sqrt(v) / sqrt(bias_c2) + eps), bias_cX = 1 - bX^t */
typedef struct { float *p, *m, *v; const float *g; float lr, beta1, beta2, eps, wd, step, sqrt_c2; } adamw_args;

static void adamw_range(void *ctx, size_t lo, size_t hi)
{
    const adamw_args *A = ctx;
    float *p = A->p, *m = A->m, *v = A->v, lr = A->lr, b1 = A->beta1, b2 = A->beta2;
    const float *g = A->g;
    for (size_t i = lo; i < hi; i++) {
        p[i] *= 1.0f - lr * A->wd;
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        p[i] -= A->step * m[i] / (sqrtf(v[i]) / A->sqrt_c2 + A->eps);
    }
}

static void cpu_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr,
                      float beta1, float beta2, float eps, float weight_decay,
                      float bias_c1, float bias_c2)
{
    adamw_args A = { .p = p, .m = m, .v = v, .g = g, .lr = lr, .beta1 = beta1, .beta2 = beta2,
                     .eps = eps, .wd = weight_decay, .step = lr / bias_c1, .sqrt_c2 = sqrtf(bias_c2) };
    ex_cpu_parallel(n, CPU_GRAIN, adamw_range, &A);
}

static const ex_backend cpu_backend = {
    .name = "cpu",
    .host_memory = true,
    .alloc = ex_cpu_alloc,
    .release = ex_cpu_release,
    .alloc_host = ex_cpu_alloc_host,
    .release_host = ex_cpu_release,
    .h2d = ex_cpu_copy_bytes,
    .d2h = ex_cpu_copy_bytes,
    .d2d = ex_cpu_copy_bytes,
    .fill = ex_cpu_fill,
    .sync = ex_cpu_sync,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .add_inplace = cpu_add_inplace,
    .add_bias = cpu_add_bias,
    .scale_inplace = cpu_scale_inplace,
    .sumsq = cpu_sumsq,
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .to_bf16 = ex_cpu_to_bf16,
    .from_bf16 = ex_cpu_from_bf16,
    .linear_forward_bf16 = ex_cpu_linear_forward_bf16,
    .linear_backward_bf16 = ex_cpu_linear_backward_bf16,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = ex_cpu_attention_forward,
    .attention_backward = ex_cpu_attention_backward,
    .attention_part_forward = ex_cpu_attention_part_forward,
    .attention_part_backward = ex_cpu_attention_part_backward,
    .attention_merge = ex_cpu_attention_merge,
    .transpose_blocks = cpu_transpose_blocks,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .quick_gelu_forward = cpu_quick_gelu_forward,
    .quick_gelu_backward = cpu_quick_gelu_backward,
    .layernorm_forward = ex_cpu_layernorm_forward,
    .layernorm_backward = ex_cpu_layernorm_backward,
    .im2col1d = ex_cpu_im2col1d,
    .col2im1d = ex_cpu_col2im1d,
    .avgpool_rows_forward = ex_cpu_avgpool_rows_forward,
    .avgpool_rows_backward = ex_cpu_avgpool_rows_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .cross_entropy = cpu_cross_entropy,
    .ce_row_max = cpu_ce_row_max,
    .ce_exp_sum = cpu_ce_exp_sum,
    .ce_grad = cpu_ce_grad,
    .adamw = cpu_adamw,
};

const ex_backend *ex_backend_cpu(void) { return &cpu_backend; }
