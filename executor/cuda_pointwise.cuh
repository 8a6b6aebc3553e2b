/* CUDA kernels of the backend's point-wise and row jobs: the activations
 * (SwiGLU, GELU, quick GELU), embeddings, rows by index (gather, scatter-add)
 * and AdamW, with the math of executor/cpu_kernels.c (shapes in
 * executor/backend.h). Included by executor/cuda_kernels.cu after its
 * helpers (THREADS, grid_for, gs_first, EX_LAUNCH); every output element is
 * owned by one thread (embedding_backward adds with atomicAdd). */

/* ------------------------------------------------------------ activations */

static __device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* SwiGLU: h = silu(g) * u, silu(g) = g * sigmoid(g); elementwise over n */
static __global__ void swiglu_forward_kernel(float *h, const float *g, const float *u, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) h[i] = g[i] * sigmoid(g[i]) * u[i];
}

/* SwiGLU backward: du += dh g sigmoid(g);  dg += dh u sigmoid(g) (1 + g (1 - sigmoid(g)))
 * (either may be NULL) */
static __global__ void swiglu_backward_kernel(float *dg, float *du, const float *dh, const float *g,
                                              const float *u, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) {
        float s = sigmoid(g[i]);
        if (du) du[i] += dh[i] * g[i] * s;
        if (dg) dg[i] += dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
}

/* GELU, exact erf form: out = 0.5 x (1 + erf(x / sqrt 2)) */
static __global__ void gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride())
        out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * (float)SQRT1_2));
}

/* GELU backward: dinp += dout (0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)) */
static __global__ void gelu_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n)
{
    const float inv_sqrt_2pi = 0.3989422804014327f;
    for (size_t i = gs_first(); i < n; i += gs_stride()) {
        float x = inp[i];
        float d = 0.5f * (1.0f + erff(x * (float)SQRT1_2)) + x * expf(-0.5f * x * x) * inv_sqrt_2pi;
        dinp[i] += dout[i] * d;
    }
}

/* Quick GELU (CLIP): out = x sigmoid(1.702 x); dinp += dout s (1 + 1.702 x (1 - s)) */
static __global__ void quick_gelu_forward_kernel(float *out, const float *inp, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) out[i] = inp[i] / (1.0f + expf(-1.702f * inp[i]));
}

static __global__ void quick_gelu_backward_kernel(float *dinp, const float *dout, const float *inp, size_t n)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) {
        float x = inp[i], s = 1.0f / (1.0f + expf(-1.702f * x));
        dinp[i] += dout[i] * s * (1.0f + 1.702f * x * (1.0f - s));
    }
}

static void cuda_swiglu_forward(float *h, const float *g, const float *u, size_t n)
{
    if (n) EX_LAUNCH(swiglu_forward_kernel, grid_for(n, THREADS), THREADS, h, g, u, n);
}

static void cuda_swiglu_backward(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n)
{
    if (n && (dg || du)) EX_LAUNCH(swiglu_backward_kernel, grid_for(n, THREADS), THREADS, dg, du, dh, g, u, n);
}

static void cuda_gelu_forward(float *out, const float *inp, size_t n)
{
    if (n) EX_LAUNCH(gelu_forward_kernel, grid_for(n, THREADS), THREADS, out, inp, n);
}

static void cuda_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
    if (n && dinp) EX_LAUNCH(gelu_backward_kernel, grid_for(n, THREADS), THREADS, dinp, dout, inp, n);
}

static void cuda_quick_gelu_forward(float *out, const float *inp, size_t n)
{
    if (n) EX_LAUNCH(quick_gelu_forward_kernel, grid_for(n, THREADS), THREADS, out, inp, n);
}

static void cuda_quick_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
    if (n && dinp) EX_LAUNCH(quick_gelu_backward_kernel, grid_for(n, THREADS), THREADS, dinp, dout, inp, n);
}

/* ------------------------------------------------------------ embeddings */

/* Embedding over vocab rows [v0, v0 + vn) held in wte[vn, d], out[n, d]:
 * out[t, j] = wte[tokens[t] - v0, j] if the token is in range, else 0 */
static __global__ void embedding_forward_kernel(float *out, const float *wte, const int32_t *tokens, int n,
                                                int d, int v0, int vn)
{
    for (size_t i = gs_first(); i < (size_t)n * d; i += gs_stride()) {
        int r = tokens[i / d] - v0;
        out[i] = r >= 0 && r < vn ? wte[(size_t)r * d + i % d] : 0.0f;
    }
}

/* Embedding backward: dwte[tokens[t] - v0, j] += dout[t, j] for in-range tokens
 * (atomicAdd: a repeated token's rows add in an arbitrary order) */
static __global__ void embedding_backward_kernel(float *dwte, const float *dout, const int32_t *tokens, int n,
                                                 int d, int v0, int vn)
{
    for (size_t i = gs_first(); i < (size_t)n * d; i += gs_stride()) {
        int r = tokens[i / d] - v0;
        if (r >= 0 && r < vn) atomicAdd(&dwte[(size_t)r * d + i % d], dout[i]);
    }
}

static void cuda_embedding_forward(float *out, const float *wte, const int32_t *tokens, int n, int d,
                                   int v0, int vn)
{
    if (n > 0 && d > 0)
        EX_LAUNCH(embedding_forward_kernel, grid_for((size_t)n * d, THREADS), THREADS, out, wte, tokens, n, d, v0, vn);
}

static void cuda_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int n, int d,
                                    int v0, int vn)
{
    if (n > 0 && d > 0 && dwte)
        EX_LAUNCH(embedding_backward_kernel, grid_for((size_t)n * d, THREADS), THREADS, dwte, dout, tokens, n, d,
                  v0, vn);
}

/* ------------------------------------------------------------ rows by index */

/* gather_rows: dst[i, j] = src[rows[i], j], dst[n, d] */
static __global__ void gather_rows_kernel(float *dst, const float *src, const int *rows, int n, int d)
{
    for (size_t i = gs_first(); i < (size_t)n * d; i += gs_stride()) dst[i] = src[(size_t)rows[i / d] * d + i % d];
}

/* scatter_add_rows: dst[rows[i], j] += src[i, j]; the rows are distinct, so
 * every element of dst has one owner (no atomics) */
static __global__ void scatter_add_rows_kernel(float *dst, const float *src, const int *rows, int n, int d)
{
    for (size_t i = gs_first(); i < (size_t)n * d; i += gs_stride()) dst[(size_t)rows[i / d] * d + i % d] += src[i];
}

static void cuda_gather_rows(float *dst, const float *src, const int *rows, int n, int d)
{
    if (n > 0 && d > 0) EX_LAUNCH(gather_rows_kernel, grid_for((size_t)n * d, THREADS), THREADS, dst, src, rows, n, d);
}

static void cuda_scatter_add_rows(float *dst, const float *src, const int *rows, int n, int d)
{
    if (n > 0 && d > 0)
        EX_LAUNCH(scatter_add_rows_kernel, grid_for((size_t)n * d, THREADS), THREADS, dst, src, rows, n, d);
}

/* ------------------------------------------------------------ AdamW */

/* AdamW (torch.optim.AdamW), elementwise over n, step = lr / bias_c1,
 * sqrt_c2 = sqrt(bias_c2):  p *= 1 - lr wd;  m = b1 m + (1 - b1) g;
 * v = b2 v + (1 - b2) g^2;  p -= step m / (sqrt(v) / sqrt_c2 + eps) */
static __global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                                    float b2, float eps, float wd, float step, float sqrt_c2)
{
    for (size_t i = gs_first(); i < n; i += gs_stride()) {
        p[i] *= 1.0f - lr * wd;
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        p[i] -= step * m[i] / (sqrtf(v[i]) / sqrt_c2 + eps);
    }
}

static void cuda_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                       float eps, float weight_decay, float bias_c1, float bias_c2)
{
    if (n)
        EX_LAUNCH(adamw_kernel, grid_for(n, THREADS), THREADS, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay,
                  lr / bias_c1, sqrtf(bias_c2));
}
