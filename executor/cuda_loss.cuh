/* CUDA kernels of the loss: the fused cross-entropy of a whole-vocabulary
 * shard and the vocab-parallel pieces (row max, exp-sum, gradient), with the
 * math of executor/cpu_kernels.c (shapes in executor/backend.h). Included by
 * executor/cuda_kernels.cu after its helpers (THREADS, grid_for, block_sum,
 * block_max, scratch, sum_partials, EX_LAUNCH). */


/* ce_row_max, a block per row: mx[r] = max_c logits[r, c], logits[n, vocab] */
static __global__ void ce_row_max_kernel(float *mx, const float *logits, int n, int vocab)
{
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *z = logits + (size_t)r * vocab;
        float m = -INFINITY;
        for (int c = threadIdx.x; c < vocab; c += THREADS) m = fmaxf(m, z[c]);
        m = block_max(m);
        if (threadIdx.x == 0) mx[r] = m;
    }
}

/* ce_exp_sum, a block per row: st[r] = sum_c exp(z[r, c] - mx[r]) (in double),
 * st[n + r] = z[r, targets[r] - v0] if that column is local (else 0),
 * probs[r, c] = exp(z[r, c] - mx[r]) when probs != NULL */
static __global__ void ce_exp_sum_kernel(float *probs, float *st, const float *logits, const float *mx,
                                         const int32_t *targets, int n, int vocab, int v0)
{
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *z = logits + (size_t)r * vocab;
        float m = mx[r];
        int tc = targets[r] - v0;
        float zt = tc >= 0 && tc < vocab ? z[tc] : 0.0f;
        double sum = 0;
        for (int c = threadIdx.x; c < vocab; c += THREADS) {
            float p = expf(z[c] - m);
            if (probs) probs[(size_t)r * vocab + c] = p;
            sum += p;
        }
        sum = block_sum(sum);
        if (threadIdx.x == 0) {
            st[r] = (float)sum;
            st[n + r] = zt;
        }
    }
}

/* ce_grad: dlogits[r, c] = dscale * (probs[r, c] / st[r] - [c == targets[r] - v0]),
 * in place over the probs, dlogits[n, vocab] */
static __global__ void ce_grad_kernel(float *dlogits, const float *st, const int32_t *targets, int n, int vocab,
                                      int v0, float dscale)
{
    for (size_t i = gs_first(); i < (size_t)n * vocab; i += gs_stride()) {
        size_t r = i / vocab;
        int c = (int)(i % vocab);
        float p = dlogits[i] * (dscale / st[r]);
        dlogits[i] = c == targets[r] - v0 ? p - dscale : p;
    }
}

/* Fused cross-entropy over logits[n, vocab] (the whole vocabulary), a block per
 * row (rows strided over the grid): mx = max, st = (float) sum exp(z - mx)
 * (double), loss_r = mx + log(st) - z[target] (0 for a target out of range),
 * part[block] = sum of its rows' losses (double); if dlogits != NULL,
 * dlogits[r, c] = dscale * (exp(z - mx) / st - [c == target]). */
static __global__ void cross_entropy_kernel(double *part, float *dlogits, const float *logits,
                                            const int32_t *targets, int n, int vocab, float dscale)
{
    double total = 0;
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float *z = logits + (size_t)r * vocab;
        float *dl = dlogits ? dlogits + (size_t)r * vocab : NULL;
        int tc = targets[r];
        float zt = tc >= 0 && tc < vocab ? z[tc] : 0.0f, m = -INFINITY;
        for (int c = threadIdx.x; c < vocab; c += THREADS) m = fmaxf(m, z[c]);
        m = block_max(m);
        double sum = 0;
        for (int c = threadIdx.x; c < vocab; c += THREADS) {
            float p = expf(z[c] - m);
            if (dl) dl[c] = p;
            sum += p;
        }
        float st = (float)block_sum(sum);
        total += (double)m + log((double)st) - zt;
        if (dl) {
            float s = dscale / st;
            for (int c = threadIdx.x; c < vocab; c += THREADS) dl[c] = c == tc ? dl[c] * s - dscale : dl[c] * s;
        }
    }
    if (threadIdx.x == 0) part[blockIdx.x] = total;
}

static void cuda_ce_row_max(float *mx, const float *logits, int n, int vocab)
{
    if (n > 0 && vocab > 0) EX_LAUNCH(ce_row_max_kernel, grid_for((size_t)n, 1), THREADS, mx, logits, n, vocab);
}

static void cuda_ce_exp_sum(float *probs, float *st, const float *logits, const float *mx,
                            const int32_t *targets, int n, int vocab, int v0)
{
    if (n > 0 && vocab > 0)
        EX_LAUNCH(ce_exp_sum_kernel, grid_for((size_t)n, 1), THREADS, probs, st, logits, mx, targets, n, vocab, v0);
}

static void cuda_ce_grad(float *dlogits, const float *st, const int32_t *targets, int n, int vocab, int v0,
                         float dscale)
{
    if (n > 0 && vocab > 0)
        EX_LAUNCH(ce_grad_kernel, grid_for((size_t)n * vocab, THREADS), THREADS, dlogits, st, targets, n, vocab,
                  v0, dscale);
}

/* Returns sum_r loss_r (the caller divides); waits for the device. */
static double cuda_cross_entropy(float *dlogits, const float *logits, const int32_t *targets, int n, int vocab,
                                 float dscale)
{
    double *part = scratch();
    if (!part) return NAN;
    if (n <= 0 || vocab <= 0) return 0;
    unsigned blocks = grid_for((size_t)n, 1);
    if (blocks > CE_BLOCKS) blocks = CE_BLOCKS;
    EX_LAUNCH(cross_entropy_kernel, blocks, THREADS, part, dlogits, logits, targets, n, vocab, dscale);
    return sum_partials(part, blocks);
}

