/* The CUDA backend's attention kernels, included by executor/cuda_kernels.cu
 * (one translation unit, as llm.c's llmc/ headers; the sticky error, the
 * launch macro and the helpers are its own): self-attention over
 * variable-length sequences, and ring attention's pieces over a block of keys
 * with the merge of partial results by their log-sum-exp. In fp32 here; in
 * bf16 on tensor cores (the same entry points, ring attention's pieces
 * included) in cuda_attention16.cuh. */
/* ------------------------------------------------------------ attention
 * Flash-style tiles of TILE query rows x TILE key rows of one (sequence, head),
 * head_dim handled in chunks of TILE columns, so shared memory (3 to 6 tiles
 * of 4 KiB) does not grow with head_dim. A block of THREADS threads owns, for a score tile, the
 * entries (r = t % TILE, j = t / TILE + STEP e), e < PER, and for a tile of
 * outputs / gradients the entries (row = t / TILE + STEP e, column = t % TILE):
 * every output element is written by one thread, in a fixed order.
 * Grids are (nseq, heads, Y): block z takes the tiles z, z + Y, ... of its
 * sequence (the lengths live on the device), Y = ATT_TARGET_BLOCKS / (nseq heads). */
#define TILE 32
#define STEP (THREADS / TILE)
#define PER (TILE / STEP)
typedef float att_tile[TILE][TILE + 1];   /* +1: conflict-free column reads */

/* dst[rr][c] = src[rr * stride + d0 + c] for rr < rows and d0 + c < hd, else 0 */
static __device__ void att_load(att_tile dst, const float *src, int rows, size_t stride, int d0, int hd)
{
    for (int e = threadIdx.x; e < TILE * TILE; e += THREADS) {
        int rr = e / TILE, c = e % TILE;
        dst[rr][c] = rr < rows && d0 + c < hd ? src[(size_t)rr * stride + d0 + c] : 0.0f;
    }
}

/* Scores of a tile, this thread's entries: sc[e] = q[r] . k[j] (the sum over
 * head_dim in ascending order), and if dp != NULL dp[e] = g[r] . v[j]. q, g
 * (query side, row stride qs) and k, v (key side, row stride ks) point at the
 * tile's first row of their head; qt, kt, gt, vt are the staging tiles (gt and
 * vt unused without dp). */
static __device__ void att_scores(float *sc, float *dp, att_tile qt, att_tile kt, att_tile gt, att_tile vt,
                                  const float *q, const float *k, const float *g, const float *v,
                                  int rn, int jn, size_t qs, size_t ks, int hd)
{
    int r = threadIdx.x % TILE, j0 = threadIdx.x / TILE;
    for (int e = 0; e < PER; e++) {
        sc[e] = 0.0f;
        if (dp) dp[e] = 0.0f;
    }
    for (int d0 = 0; d0 < hd; d0 += TILE) {
        att_load(qt, q, rn, qs, d0, hd);
        att_load(kt, k, jn, ks, d0, hd);
        if (dp) {
            att_load(gt, g, rn, qs, d0, hd);
            att_load(vt, v, jn, ks, d0, hd);
        }
        __syncthreads();
        for (int e = 0; e < PER; e++) {
            int j = j0 + STEP * e;
            for (int i = 0; i < TILE; i++) sc[e] += qt[r][i] * kt[j][i];
            if (dp)
                for (int i = 0; i < TILE; i++) dp[e] += gt[r][i] * vt[j][i];
        }
        __syncthreads();
    }
}

/* D[rr] = g[rr] . o[rr] (head_dim ascending) for the tile's rows rr < rn
 * (0 beyond); gt, ot are staging tiles. */
static __device__ void att_row_dots(float *D, att_tile gt, att_tile ot, const float *g, const float *o,
                                    int rn, size_t qs, int hd)
{
    int t = threadIdx.x;
    float s = 0;
    for (int d0 = 0; d0 < hd; d0 += TILE) {
        att_load(gt, g, rn, qs, d0, hd);
        att_load(ot, o, rn, qs, d0, hd);
        __syncthreads();
        if (t < TILE)
            for (int i = 0; i < TILE; i++) s += gt[t][i] * ot[t][i];
        __syncthreads();
    }
    if (t < TILE) D[t] = s;
}

/* Online-softmax step of one query row over a tile of scaled scores p[TILE]
 * (masked entries -inf): m = max(m, max p), c = exp(m_old - m), l = l c + sum
 * exp(p - m), p = exp(p - m). Rows past the tile's end get p = 0, c = 1. */
static __device__ void att_softmax_row(float *p, float *m, float *l, float *c, bool valid)
{
    if (!valid) {
        for (int j = 0; j < TILE; j++) p[j] = 0.0f;
        *c = 1.0f;
        return;
    }
    float mt = -INFINITY;
    for (int j = 0; j < TILE; j++) mt = fmaxf(mt, p[j]);
    float mnew = fmaxf(*m, mt), corr = expf(*m - mnew), sum = *l * corr;
    for (int j = 0; j < TILE; j++) {
        p[j] = expf(p[j] - mnew);
        sum += p[j];
    }
    *m = mnew;
    *l = sum;
    *c = corr;
}

/* Whether score (query row r0 + r, key j0 + j) of a tile is attended. */
static __device__ __forceinline__ bool att_visible(int r0, int r, int rn, int j0, int j, int jn, bool causal)
{
    return r < rn && j < jn && (!causal || j0 + j <= r0 + r);
}

/* A call's sequences: self-attention over cu (device cu_seqlens: sequence s
 * is rows cu[s] .. cu[s+1]-1 of q and k), or, cu NULL, ring attention's
 * block of keys: query rows s * stride + q0 .. + nq, key rows
 * s * stride + k0 .. + nk (not causal). */
struct att_geom {
    const int *cu;
    int stride, q0, nq, k0, nk;
};

static __device__ __forceinline__ void att_seq(const att_geom &g, int s, int *qs0, int *qlen, int *ks0, int *klen)
{
    if (g.cu) {
        *qs0 = *ks0 = g.cu[s];
        *qlen = *klen = g.cu[s + 1] - g.cu[s];
        return;
    }
    *qs0 = s * g.stride + g.q0;
    *ks0 = s * g.stride + g.k0;
    *qlen = g.nq;
    *klen = g.nk;
}

/* What a (sequence, query head) block of the forward and dq kernels reads:
 * its sequence's query and key rows, the row strides of q and k/v, the
 * score scale and its kv head's first k and v row. */
struct att_view {
    int s0, len, ks0, klen;
    size_t qs, ks;
    float scale;
    const float *kh, *vh;
};

static __device__ att_view att_view_of(const att_geom &g, const float *k, const float *v, int H, int Hkv, int hd)
{
    att_view a;
    int kvh = blockIdx.y / (H / Hkv);
    att_seq(g, blockIdx.x, &a.s0, &a.len, &a.ks0, &a.klen);
    a.qs = (size_t)H * hd;
    a.ks = (size_t)Hkv * hd;
    a.scale = 1.0f / sqrtf((float)hd);
    a.kh = k + (size_t)a.ks0 * a.ks + (size_t)kvh * hd;
    a.vh = v + (size_t)a.ks0 * a.ks + (size_t)kvh * hd;
    return a;
}

/* The same for a (sequence, kv head) block of the dk/dv kernels (kh, vh unused). */
static __device__ att_view att_kv_view_of(const att_geom &g, int H, int Hkv, int hd)
{
    att_view a = {};
    att_seq(g, blockIdx.x, &a.s0, &a.len, &a.ks0, &a.klen);
    a.qs = (size_t)H * hd;
    a.ks = (size_t)Hkv * hd;
    a.scale = 1.0f / sqrtf((float)hd);
    return a;
}

/* Attention forward, q[n, H, hd], k/v[n, Hkv, hd], out[n, H, hd], lse[n, H]
 * (flash-attention varlen): sequence s holds rows cu[s] .. cu[s+1]-1 and
 * attends within itself (causal: keys j <= row); query head h reads kv head
 * h / (H / Hkv). out[r, h] = sum_j softmax_j(q[r, h] . k[j] / sqrt(hd)) v[j],
 * lse[r, h] = log sum_j exp(score). Block (s, h, z) takes the query tiles z,
 * z + Y, ...; per key tile: scores (chunked over hd), the online-softmax update
 * per row (thread r), then out[rows] = out c + P V chunk by chunk (out holds
 * the running accumulator), and at the end out /= l, lse = m + log l. */
static __global__ void attention_forward_kernel(float *out, float *lse, const float *q, const float *k,
                                                const float *v, att_geom g, int H, int Hkv, int hd,
                                                bool causal)
{
    __shared__ att_tile qt, kt, pt;
    __shared__ float row_m[TILE], row_l[TILE], row_c[TILE];
    int h = blockIdx.y, t = threadIdx.x, col = t % TILE;
    const att_view a = att_view_of(g, k, v, H, Hkv, hd);
    const int s0 = a.s0, len = a.len, klen = a.klen;
    const size_t qs = a.qs, ks = a.ks;
    const float scale = a.scale, *kh = a.kh, *vh = a.vh;
    for (int r0 = blockIdx.z * TILE; r0 < len; r0 += gridDim.z * TILE) {
        int rn = imin(TILE, len - r0), kend = causal ? r0 + rn : klen;
        const float *qr = q + (size_t)(s0 + r0) * qs + (size_t)h * hd;
        float *o = out + (size_t)(s0 + r0) * qs + (size_t)h * hd;
        if (t < TILE) {
            row_m[t] = -INFINITY;
            row_l[t] = 0.0f;
        }
        for (int d = col; d < hd; d += TILE)
            for (int e = 0; e < PER; e++) {
                int rr = t / TILE + STEP * e;
                if (rr < rn) o[(size_t)rr * qs + d] = 0.0f;
            }
        for (int j0 = 0; j0 < kend; j0 += TILE) {
            int jn = imin(TILE, kend - j0);
            float sc[PER];
            att_scores(sc, NULL, qt, kt, NULL, NULL, qr, kh + (size_t)j0 * ks, NULL, NULL, rn, jn, qs, ks, hd);
            for (int e = 0; e < PER; e++) {
                int r = col, j = t / TILE + STEP * e;
                pt[r][j] = att_visible(r0, r, rn, j0, j, jn, causal) ? sc[e] * scale : -INFINITY;
            }
            __syncthreads();
            if (t < TILE) att_softmax_row(pt[t], &row_m[t], &row_l[t], &row_c[t], t < rn);
            /* (the barrier after the first V chunk's load publishes pt and row_c) */
            for (int d0 = 0; d0 < hd; d0 += TILE) {
                att_load(kt, vh + (size_t)j0 * ks, jn, ks, d0, hd);
                __syncthreads();
                int d = d0 + col;
                for (int e = 0; e < PER; e++) {
                    int rr = t / TILE + STEP * e;
                    if (rr >= rn || d >= hd) continue;
                    float acc = o[(size_t)rr * qs + d] * row_c[rr];
                    for (int j = 0; j < TILE; j++) acc += pt[rr][j] * kt[j][col];
                    o[(size_t)rr * qs + d] = acc;
                }
                __syncthreads();
            }
        }
        for (int d = col; d < hd; d += TILE)
            for (int e = 0; e < PER; e++) {
                int rr = t / TILE + STEP * e;
                if (rr < rn) o[(size_t)rr * qs + d] /= row_l[rr];
            }
        if (t < rn) lse[(size_t)(s0 + r0 + t) * H + h] = row_m[t] + logf(row_l[t]);
        __syncthreads();
    }
}

/* Attention backward of q, recomputing probabilities from lse:
 * p = exp(q.k / sqrt(hd) - lse[r]), D[r] = dout[r] . out[r],
 * ds = p (dout[r] . v[j] - D[r]) / sqrt(hd);  dq[r] += sum_j ds k[j].
 * Block (s, h, z) takes the query tiles z, z + Y, ... of sequence s, head h,
 * and walks the key tiles it sees. */
static __global__ void attention_backward_dq_kernel(float *dq, const float *dout, const float *q,
                                                    const float *k, const float *v, const float *out,
                                                    const float *lse, att_geom g, int H, int Hkv,
                                                    int hd, bool causal)
{
    __shared__ att_tile qt, kt, gt, vt, dst;
    __shared__ float row_D[TILE], row_L[TILE];
    int h = blockIdx.y, t = threadIdx.x, col = t % TILE;
    const att_view a = att_view_of(g, k, v, H, Hkv, hd);
    const int s0 = a.s0, len = a.len, klen = a.klen;
    const size_t qs = a.qs, ks = a.ks;
    const float scale = a.scale, *kh = a.kh, *vh = a.vh;
    for (int r0 = blockIdx.z * TILE; r0 < len; r0 += gridDim.z * TILE) {
        int rn = imin(TILE, len - r0), kend = causal ? r0 + rn : klen;
        size_t qo = (size_t)(s0 + r0) * qs + (size_t)h * hd;
        if (t < TILE) row_L[t] = t < rn ? lse[(size_t)(s0 + r0 + t) * H + h] : 0.0f;
        att_row_dots(row_D, qt, gt, dout + qo, out + qo, rn, qs, hd);
        for (int j0 = 0; j0 < kend; j0 += TILE) {
            int jn = imin(TILE, kend - j0);
            float sc[PER], dp[PER];
            att_scores(sc, dp, qt, kt, gt, vt, q + qo, kh + (size_t)j0 * ks, dout + qo, vh + (size_t)j0 * ks,
                       rn, jn, qs, ks, hd);
            for (int e = 0; e < PER; e++) {
                int r = col, j = t / TILE + STEP * e;
                float p = att_visible(r0, r, rn, j0, j, jn, causal) ? expf(sc[e] * scale - row_L[r]) : 0.0f;
                dst[r][j] = p * (dp[e] - row_D[r]) * scale;
            }
            /* (the barrier after the first K chunk's load publishes dst) */
            for (int d0 = 0; d0 < hd; d0 += TILE) {
                att_load(kt, kh + (size_t)j0 * ks, jn, ks, d0, hd);
                __syncthreads();
                int d = d0 + col;
                for (int e = 0; e < PER; e++) {
                    int rr = t / TILE + STEP * e;
                    if (rr >= rn || d >= hd) continue;
                    float acc = 0.0f;
                    for (int j = 0; j < TILE; j++) acc += dst[rr][j] * kt[j][col];
                    dq[qo + (size_t)rr * qs + d] += acc;
                }
                __syncthreads();
            }
        }
    }
}

/* Attention backward of k and v (same p, D, ds as the dq kernel):
 * dv[j] += sum_r p dout[r];  dk[j] += sum_r ds q[r], over the query rows r
 * (and heads h of the GQA group of kv head kvh) that see key j. Block
 * (s, kvh, z) takes the key tiles z, z + Y, ... of sequence s; for each, the
 * group's heads and the query tiles that see it (causal: from the key tile on).
 * dk or dv may be NULL. */
static __global__ void attention_backward_dkdv_kernel(float *dk, float *dv, const float *dout, const float *q,
                                                      const float *k, const float *v, const float *out,
                                                      const float *lse, att_geom g, int H, int Hkv,
                                                      int hd, bool causal)
{
    __shared__ att_tile qt, kt, gt, vt, pt, dst;
    __shared__ float row_D[TILE], row_L[TILE];
    int kvh = blockIdx.y, group = H / Hkv, t = threadIdx.x, col = t % TILE;
    const att_view kv = att_kv_view_of(g, H, Hkv, hd);
    const int s0 = kv.s0, len = kv.len, ks0 = kv.ks0, klen = kv.klen;
    const size_t qs = kv.qs, ks = kv.ks;
    const float scale = kv.scale;
    for (int j0 = blockIdx.z * TILE; j0 < klen; j0 += gridDim.z * TILE) {
        int jn = imin(TILE, klen - j0);
        size_t ko = (size_t)(ks0 + j0) * ks + (size_t)kvh * hd;
        for (int h = kvh * group; h < (kvh + 1) * group; h++)
            for (int r0 = causal ? j0 / TILE * TILE : 0; r0 < len; r0 += TILE) {
                int rn = imin(TILE, len - r0);
                size_t qo = (size_t)(s0 + r0) * qs + (size_t)h * hd;
                if (t < TILE) row_L[t] = t < rn ? lse[(size_t)(s0 + r0 + t) * H + h] : 0.0f;
                att_row_dots(row_D, qt, gt, dout + qo, out + qo, rn, qs, hd);
                float sc[PER], dp[PER];
                att_scores(sc, dp, qt, kt, gt, vt, q + qo, k + ko, dout + qo, v + ko, rn, jn, qs, ks, hd);
                for (int e = 0; e < PER; e++) {
                    int r = col, j = t / TILE + STEP * e;
                    float p = att_visible(r0, r, rn, j0, j, jn, causal) ? expf(sc[e] * scale - row_L[r]) : 0.0f;
                    pt[r][j] = p;
                    dst[r][j] = p * (dp[e] - row_D[r]) * scale;
                }
                /* (the barrier after the first chunk's loads publishes pt and dst) */
                for (int d0 = 0; d0 < hd; d0 += TILE) {
                    att_load(qt, q + qo, rn, qs, d0, hd);
                    att_load(gt, dout + qo, rn, qs, d0, hd);
                    __syncthreads();
                    int d = d0 + col;
                    for (int e = 0; e < PER; e++) {
                        int jj = t / TILE + STEP * e;
                        if (jj >= jn || d >= hd) continue;
                        float a = 0.0f, b = 0.0f;
                        for (int r = 0; r < TILE; r++) {
                            a += pt[r][jj] * gt[r][col];
                            b += dst[r][jj] * qt[r][col];
                        }
                        if (dv) dv[ko + (size_t)jj * ks + d] += a;
                        if (dk) dk[ko + (size_t)jj * ks + d] += b;
                    }
                    __syncthreads();
                }
            }
    }
}

#include "executor/cuda_attention16.cuh"

/* bf16 attention on tensor cores (cuda_attention16.cuh) instead of fp32:
 * on under bf16-mixed and bf16-autocast (executor/precision.c sets it; one
 * process runs one precision). */
static bool g_att_bf16;

static void cuda_set_attention_bf16(bool on) { g_att_bf16 = on; }

/* Attention shapes the kernels take; notes a failure otherwise. */
static bool att_shape_ok(int nseq, int H, int Hkv, int hd)
{
    if (Hkv > 0 && H >= Hkv && H % Hkv == 0 && H <= 65535 && hd > 0 && hd <= EX_MAX_HEAD_DIM) return true;
    char why[128];
    snprintf(why, sizeof why, "unsupported shape nseq %d H %d Hkv %d head_dim %d", nseq, H, Hkv, hd);
    note_failure("attention", why);
    return false;
}

/* Grid (nseq, heads, Y) with about ATT_TARGET_BLOCKS blocks in all. */
static dim3 att_grid(int nseq, int heads)
{
    long units = (long)nseq * heads, y = (ATT_TARGET_BLOCKS + units - 1) / units;
    return dim3((unsigned)nseq, (unsigned)heads, (unsigned)(y < 1 ? 1 : y > 65535 ? 65535 : y));
}

static void att_forward(float *out, float *lse, const float *q, const float *k, const float *v, att_geom g, int nseq,
                        int H, int Hkv, int hd, bool causal)
{
    if (nseq <= 0 || !att_shape_ok(nseq, H, Hkv, hd)) return;
    if (g_att_bf16)
        EX_LAUNCH(attention16_forward_kernel, att_grid(nseq, H), THREADS, out, lse, q, k, v, g, H, Hkv, hd, causal);
    else
        EX_LAUNCH(attention_forward_kernel, att_grid(nseq, H), THREADS, out, lse, q, k, v, g, H, Hkv, hd, causal);
}

static void att_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, const float *out, const float *lse, att_geom g, int nseq, int H, int Hkv,
                         int hd, bool causal)
{
    if (nseq <= 0 || !att_shape_ok(nseq, H, Hkv, hd)) return;
    if (dq && g_att_bf16)
        EX_LAUNCH(attention16_backward_dq_kernel, att_grid(nseq, H), THREADS, dq, dout, q, k, v, out, lse, g,
                  H, Hkv, hd, causal);
    else if (dq)
        EX_LAUNCH(attention_backward_dq_kernel, att_grid(nseq, H), THREADS, dq, dout, q, k, v, out, lse, g,
                  H, Hkv, hd, causal);
    if ((dk || dv) && g_att_bf16)
        EX_LAUNCH(attention16_backward_dkdv_kernel, att_grid(nseq, Hkv), THREADS, dk, dv, dout, q, k, v, out,
                  lse, g, H, Hkv, hd, causal);
    else if (dk || dv)
        EX_LAUNCH(attention_backward_dkdv_kernel, att_grid(nseq, Hkv), THREADS, dk, dv, dout, q, k, v, out,
                  lse, g, H, Hkv, hd, causal);
}

static void cuda_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                   const int *cu, int nseq, int H, int Hkv, int hd, bool causal)
{
    att_forward(out, lse, q, k, v, att_geom{ cu, 0, 0, 0, 0, 0 }, nseq, H, Hkv, hd, causal);
}

static void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *out, const float *lse,
                                    const int *cu, int nseq, int H, int Hkv, int hd, bool causal)
{
    att_backward(dq, dk, dv, dout, q, k, v, out, lse, att_geom{ cu, 0, 0, 0, 0, 0 }, nseq, H, Hkv, hd, causal);
}

/* ---- ring attention's pieces (see backend.h) ---- */

static void cuda_attention_part_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                        int nseq, int stride, int q0, int nq, int k0, int nk, int H, int Hkv, int hd)
{
    if (nq > 0 && nk > 0)
        att_forward(out, lse, q, k, v, att_geom{ NULL, stride, q0, nq, k0, nk }, nseq, H, Hkv, hd, false);
}

static void cuda_attention_part_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                         const float *k, const float *v, const float *out, const float *lse,
                                         int nseq, int stride, int q0, int nq, int k0, int nk, int H, int Hkv,
                                         int hd)
{
    if (nq > 0 && nk > 0)
        att_backward(dq, dk, dv, dout, q, k, v, out, lse, att_geom{ NULL, stride, q0, nq, k0, nk }, nseq, H, Hkv,
                     hd, false);
}

/* The merge by log-sum-exp, one thread per (row, head) of the nseq x nq rows:
 * lse' = m + log(e^(lse - m) + e^(plse - m)), m the larger; out' = out
 * e^(lse - lse') + part e^(plse - lse') over the head's hd values. */
static __global__ void attention_merge_kernel(float *out, float *lse, const float *part, const float *plse,
                                              int nseq, int stride, int q0, int nq, int H, int hd)
{
    size_t pairs = (size_t)nseq * nq * H;
    for (size_t e = gs_first(); e < pairs; e += gs_stride()) {
        size_t u = e / H, h = e % H, row = (u / nq) * stride + q0 + u % nq, at = row * H + h;
        float a = lse[at], b = plse[at], m = fmaxf(a, b);
        float l = m + logf(expf(a - m) + expf(b - m)), wa = expf(a - l), wb = expf(b - l);
        float *o = out + at * hd;
        const float *p = part + at * hd;
        for (int i = 0; i < hd; i++) o[i] = o[i] * wa + p[i] * wb;
        lse[at] = l;
    }
}

static void cuda_attention_merge(float *out, float *lse, const float *part, const float *part_lse, int nseq,
                                 int stride, int q0, int nq, int H, int hd)
{
    size_t pairs = (size_t)(nseq > 0 ? nseq : 0) * (nq > 0 ? nq : 0) * (H > 0 ? H : 0);
    if (pairs)
        EX_LAUNCH(attention_merge_kernel, grid_for(pairs, THREADS), THREADS, out, lse, part, part_lse, nseq, stride,
                  q0, nq, H, hd);
}
