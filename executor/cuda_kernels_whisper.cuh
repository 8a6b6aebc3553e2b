/* CUDA kernels a Whisper-style encoder adds to the backend: LayerNorm with
 * bias, the conv stem's im2col / col2im and average pooling of rows, with
 * the math of executor/cpu_kernels_whisper.c (shapes in executor/backend.h).
 * Included by executor/cuda_kernels.cu after its helpers (THREADS,
 * grid_for, block_sum, column_sum, EX_LAUNCH), as llm.c's llmc/ headers are
 * included by its train_gpt2.cu; every output element is owned by one
 * thread, so results do not depend on timing. */

/* LayerNorm, a block per row r (rows strided over the grid), inp/out[n, d]:
 * mean[r], then the biased variance around it (two passes, sums in double),
 * rstd[r] = 1 / sqrt(var + eps); out = (x - mean) rstd w + b */
static __global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                                const float *w, const float *b, int n, int d, float eps)
{
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *x = inp + (size_t)r * d;
        float *y = out + (size_t)r * d;
        double s = 0;
        for (int j = threadIdx.x; j < d; j += THREADS) s += x[j];
        s = block_sum(s);
        float mu = (float)(s / d);
        double v = 0;
        for (int j = threadIdx.x; j < d; j += THREADS) v += (double)(x[j] - mu) * (x[j] - mu);
        v = block_sum(v);
        float rs = (float)(1.0 / sqrt(v / d + eps));
        if (threadIdx.x == 0) {
            mean[r] = mu;
            rstd[r] = rs;
        }
        for (int j = threadIdx.x; j < d; j += THREADS) y[j] = (x[j] - mu) * rs * w[j] + b[j];
    }
}

/* LayerNorm backward of the input, a block per row, xhat = (x - mean) rstd, g = dout w:
 * dinp[r, j] += rstd (g[r, j] - mean_k g - xhat[r, j] mean_k(g xhat)) (the means summed in double) */
static __global__ void layernorm_backward_kernel(float *dinp, const float *dout, const float *inp, const float *w,
                                                 const float *mean, const float *rstd, int n, int d)
{
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *x = inp + (size_t)r * d, *g = dout + (size_t)r * d;
        float mu = mean[r], rs = rstd[r];
        double sg = 0, sgx = 0;
        for (int j = threadIdx.x; j < d; j += THREADS) {
            double gw = (double)g[j] * w[j];
            sg += gw;
            sgx += gw * ((x[j] - mu) * rs);
        }
        sg = block_sum(sg);
        sgx = block_sum(sgx);
        float mg = (float)(sg / d), mgx = (float)(sgx / d);
        for (int j = threadIdx.x; j < d; j += THREADS)
            dinp[(size_t)r * d + j] += rs * (g[j] * w[j] - mg - (x[j] - mu) * rs * mgx);
    }
}

static void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                   const float *b, int n, int d, float eps)
{
    if (n > 0 && d > 0)
        EX_LAUNCH(layernorm_forward_kernel, grid_for((size_t)n, 1), THREADS, out, mean, rstd, inp, w, b, n, d, eps);
}

/* dw[j] += sum_r dout[r, j] xhat[r, j], db[j] += sum_r dout[r, j] (column sums); dinp as the kernel above. */
static void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                    const float *w, const float *mean, const float *rstd, int n, int d)
{
    if (n <= 0 || d <= 0) return;
    if (dw) column_sum(dw, dout, inp, mean, rstd, n, d);
    if (db) column_sum(db, dout, NULL, NULL, NULL, n, d);
    if (dinp)
        EX_LAUNCH(layernorm_backward_kernel, grid_for((size_t)n, 1), THREADS, dinp, dout, inp, w, mean, rstd, n, d);
}

/* im2col, one thread per col element (i, c, j) of col[n, C k]:
 * col[i, c k + j] = x[s - x0, c], s = (t0 + i) stride - pad + j, if x0 <= s < x0 + nx, else 0 */
static __global__ void im2col1d_kernel(float *col, const float *x, int n, int C, int k, int stride, int pad, int t0,
                                       int x0, int nx)
{
    size_t ck = (size_t)C * k, total = (size_t)n * ck;
    for (size_t e = gs_first(); e < total; e += gs_stride()) {
        int i = (int)(e / ck), c = (int)(e % ck) / k, j = (int)(e % ck) % k;
        int s = (t0 + i) * stride - pad + j - x0;
        col[e] = s >= 0 && s < nx ? x[(size_t)s * C + c] : 0.0f;
    }
}

/* col2im, one thread per input element (s, c) of dx[nx, C], gathering its taps j in order:
 * dx[s, c] += sum_j dcol[i, c k + j] where (t0 + i) stride = s + x0 + pad - j, 0 <= i < n */
static __global__ void col2im1d_kernel(float *dx, const float *dcol, int n, int C, int k, int stride, int pad, int t0,
                                       int x0, int nx)
{
    size_t total = (size_t)nx * C;
    for (size_t e = gs_first(); e < total; e += gs_stride()) {
        int s = (int)(e / C), c = (int)(e % C);
        float acc = 0;
        for (int j = 0; j < k; j++) {
            int num = s + x0 + pad - j;
            if (num < 0 || num % stride) continue;
            int i = num / stride - t0;
            if (i >= 0 && i < n) acc += dcol[(size_t)i * C * k + (size_t)c * k + j];
        }
        dx[e] += acc;
    }
}

static void cuda_im2col1d(float *col, const float *x, int n, int C, int k, int stride, int pad, int t0, int x0, int nx)
{
    if (n <= 0 || C <= 0 || k <= 0) return;
    if (stride <= 0) { note_failure("im2col1d", "stride must be > 0"); return; }
    EX_LAUNCH(im2col1d_kernel, grid_for((size_t)n * C * k, THREADS), THREADS, col, x, n, C, k, stride, pad, t0, x0, nx);
}

static void cuda_col2im1d(float *dx, const float *dcol, int n, int C, int k, int stride, int pad, int t0, int x0,
                          int nx)
{
    if (n <= 0 || C <= 0 || k <= 0 || nx <= 0) return;
    if (stride <= 0) { note_failure("col2im1d", "stride must be > 0"); return; }
    EX_LAUNCH(col2im1d_kernel, grid_for((size_t)nx * C, THREADS), THREADS, dx, dcol, n, C, k, stride, pad, t0, x0, nx);
}

/* Average pooling of rows, one thread per out element (r, j): out[r, j] = sum_{i < p} inp[r p + i, j] / p */
static __global__ void avgpool_rows_forward_kernel(float *out, const float *inp, int m, int p, int d)
{
    size_t total = (size_t)m * d;
    for (size_t e = gs_first(); e < total; e += gs_stride()) {
        size_t r = e / d, j = e % d;
        float s = 0;
        for (int i = 0; i < p; i++) s += inp[(r * p + i) * d + j];
        out[e] = s / (float)p;
    }
}

/* One thread per dinp element (row, j) of dinp[m p, d]: dinp[row, j] += dout[row / p, j] / p */
static __global__ void avgpool_rows_backward_kernel(float *dinp, const float *dout, int m, int p, int d)
{
    size_t total = (size_t)m * p * d;
    for (size_t e = gs_first(); e < total; e += gs_stride()) {
        size_t row = e / d, j = e % d;
        dinp[e] += dout[(row / p) * d + j] / (float)p;
    }
}

static void cuda_avgpool_rows_forward(float *out, const float *inp, int m, int p, int d)
{
    if (m > 0 && p > 0 && d > 0)
        EX_LAUNCH(avgpool_rows_forward_kernel, grid_for((size_t)m * d, THREADS), THREADS, out, inp, m, p, d);
}

static void cuda_avgpool_rows_backward(float *dinp, const float *dout, int m, int p, int d)
{
    if (m > 0 && p > 0 && d > 0 && dinp)
        EX_LAUNCH(avgpool_rows_backward_kernel, grid_for((size_t)m * p * d, THREADS), THREADS, dinp, dout, m, p, d);
}
