/* The CUDA backend's attention in bf16 on tensor cores (included by
 * executor/cuda_attention.cuh, which launches these kernels instead of its
 * fp32 ones while set_attention_bf16 is on: bf16-mixed and bf16-autocast,
 * executor/precision.c). Same shapes, geometry (att_geom: cu_seqlens or ring
 * attention's key blocks), GQA, causal rule, lse and accumulate rules as the
 * fp32 kernels; the math of FlashAttention-2 (Dao, "FlashAttention-2: Faster
 * Attention with Better Parallelism and Work Partitioning", arXiv 2307.08691,
 * Algorithm 1 forward, Algorithm 2 backward) with its precisions:
 *  - q, k, v and dout are read as fp32 from the executor's buffers and
 *    rounded to bf16 (executor/bf16.h, as the linears round their operands)
 *    into shared memory, head_dim in chunks of A16_DC columns padded with
 *    zeros to a multiple of 16 (a16_load: the one place they are read);
 *  - the products S = Q K^T, P V, dP = dO V^T, dS K, P^T dO and dS^T Q run
 *    on tensor cores through nvcuda::wmma (16x16x16 bf16 fragments, fp32
 *    accumulators), each 16x16 result tile owned by one warp;
 *  - the softmax statistics (row max m, sum l, lse = m + log l), the scale,
 *    D = rowsum(dO o O) and the output / gradient accumulators stay fp32; the
 *    probabilities P (forward and backward) and dS are rounded to bf16
 *    before their products, as FlashAttention-2 does (its kernels convert P
 *    and dS to the input type for the tensor-core GEMMs), while l sums the
 *    fp32 probabilities.
 * Fragments are opaque here: every fragment goes to and from shared memory
 * (a score block's accumulator stays in its warp over the head_dim chunks),
 * and the per-row work (online softmax, the rescaling by
 * exp(m_old - m)) runs on plain threads over shared memory, so nothing
 * depends on the lane layout, and the emulator (tests/cudaemu_wmma.h) runs
 * the same source. The running output and the gradients accumulate in the
 * output buffers in fp32 (as the fp32 kernels do), so shared memory stays
 * under 48 KiB for every head_dim up to EX_MAX_HEAD_DIM.
 * Tiles: A16_T = 32 query rows x 32 key rows; a block of THREADS threads
 * (THREADS / 32 warps). Speed: unmeasured (no GPU has run it). */
#ifndef EX_CUDA_EMU
#include <cuda_bf16.h>
#include <mma.h>
#endif

#define A16_T 32
#define A16_DC 64
#define A16_LD (A16_DC + 8)   /* bf16 row stride of a q/k/v/dout chunk (WMMA ldm: a multiple of 8) */
#define A16_LS (A16_T + 4)    /* fp32 row stride of a score tile (ldm: a multiple of 4) */
#define A16_LP (A16_T + 8)    /* bf16 row stride of a P / dS tile */
#define A16_LO (A16_DC + 4)   /* fp32 row stride of a chunk's product */
#define A16_WARPS (THREADS / 32)

namespace wmma = nvcuda::wmma;

/* every row of these starts 32-byte aligned at rows 0 and 16, as load/store_matrix_sync require */
typedef uint16_t a16_chunk[A16_T][A16_LD];
typedef float a16_stile[A16_T][A16_LS];
typedef uint16_t a16_probs[A16_T][A16_LP];
typedef float a16_out[A16_T][A16_LO];

/* dst[rr][c] = bf16(src[rr * stride + d0 + c]) for rr < rows and d0 + c < hd,
 * else 0, c < A16_DC: the bf16 kernels' one read of q, k, v and dout. */
static __device__ void a16_load(a16_chunk dst, const float *src, int rows, size_t stride, int d0, int hd)
{
    for (int e = threadIdx.x; e < A16_T * A16_DC; e += THREADS) {
        int rr = e / A16_DC, c = e % A16_DC;
        dst[rr][c] = ex_bf16_from_f32(rr < rows && d0 + c < hd ? src[(size_t)rr * stride + d0 + c] : 0.0f);
    }
}

/* offset of element (r, c) of a matrix stored row-major / column-major with
 * leading dimension ld (the layouts are incomplete types: a null pointer tags) */
static __device__ __forceinline__ size_t a16_at(const wmma::row_major *, int r, int c, unsigned ld) { return (size_t)r * ld + c; }
static __device__ __forceinline__ size_t a16_at(const wmma::col_major *, int r, int c, unsigned ld) { return (size_t)c * ld + r; }

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> a16_acc;

/* c += sum over k < kt of the 16x16 blocks A(i, k) B(k, j): A[m][k] at a +
 * a16_at(LA, m, k, lda), B[k][n] at b + a16_at(LB, k, n, ldb), both bf16. */
template <typename LA, typename LB>
static __device__ void a16_mma(a16_acc &c, int i, int j, int kt, const uint16_t *a, unsigned lda, const uint16_t *b,
                               unsigned ldb)
{
    for (int k = 0; k < kt; k++) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LB> fb;
        wmma::load_matrix_sync(fa, (const __nv_bfloat16 *)(a + a16_at((const LA *)NULL, 16 * i, 16 * k, lda)), lda);
        wmma::load_matrix_sync(fb, (const __nv_bfloat16 *)(b + a16_at((const LB *)NULL, 16 * k, 16 * j, ldb)), ldb);
        wmma::mma_sync(c, fa, fb, c);
    }
}

/* out = A B over a 16 mt x 16 nt result (row-major fp32, row stride ldo),
 * the sum over 16 kt (see a16_mma). Warp w takes the 16x16 tiles w, w +
 * A16_WARPS, ... (A warp's fragments never go through memory it writes in the
 * same phase: the lanes of a real warp load together, the emulator's one after
 * another.) */
template <typename LA, typename LB>
static __device__ void a16_gemm(float *out, unsigned ldo, int mt, int nt, int kt, const uint16_t *a, unsigned lda,
                                const uint16_t *b, unsigned ldb)
{
    for (int tile = threadIdx.x / 32; tile < mt * nt; tile += A16_WARPS) {
        int i = tile / nt, j = tile % nt;
        a16_acc c;
        wmma::fill_fragment(c, 0.0f);
        a16_mma<LA, LB>(c, i, j, kt, a, lda, b, ldb);
        wmma::store_matrix_sync(out + (size_t)16 * i * ldo + 16 * j, c, ldo, wmma::mem_row_major);
    }
}

/* 16-column blocks of the chunk at d0 of a head_dim hd */
static __device__ __forceinline__ int a16_blocks(int d0, int hd) { return (imin(A16_DC, hd - d0) + 15) / 16; }

/* st = Q K^T (unscaled fp32) of a tile, q rows (stride qs) and k rows (stride
 * ks) from the tile's first, and if dpt != NULL dpt = dO V^T (g rows: dout,
 * v rows); qt, kt, gt, vt are the staging chunks. Warp w owns the 16x16 score
 * block w (and its dP block), accumulating over the head_dim chunks in its
 * fragments. Ends at a barrier. */
static __device__ void a16_scores_of(a16_stile st, a16_stile dpt, a16_chunk qt, a16_chunk kt, a16_chunk gt,
                                     a16_chunk vt, const float *q, const float *k, const float *g, const float *v,
                                     int rn, int jn, size_t qs, size_t ks, int hd)
{
    static_assert((A16_T / 16) * (A16_T / 16) == A16_WARPS, "one 16x16 score block per warp");
    int i = threadIdx.x / 32 / (A16_T / 16), j = threadIdx.x / 32 % (A16_T / 16);
    a16_acc cs, cd;
    wmma::fill_fragment(cs, 0.0f);
    wmma::fill_fragment(cd, 0.0f);
    for (int d0 = 0; d0 < hd; d0 += A16_DC) {
        a16_load(qt, q, rn, qs, d0, hd);
        a16_load(kt, k, jn, ks, d0, hd);
        if (dpt) {
            a16_load(gt, g, rn, qs, d0, hd);
            a16_load(vt, v, jn, ks, d0, hd);
        }
        __syncthreads();
        int kb = a16_blocks(d0, hd);
        a16_mma<wmma::row_major, wmma::col_major>(cs, i, j, kb, &qt[0][0], A16_LD, &kt[0][0], A16_LD);
        if (dpt) a16_mma<wmma::row_major, wmma::col_major>(cd, i, j, kb, &gt[0][0], A16_LD, &vt[0][0], A16_LD);
        __syncthreads();
    }
    wmma::store_matrix_sync(&st[16 * i][16 * j], cs, A16_LS, wmma::mem_row_major);
    if (dpt) wmma::store_matrix_sync(&dpt[16 * i][16 * j], cd, A16_LS, wmma::mem_row_major);
    __syncthreads();
}

/* D[rr] = g[rr] . o[rr] in fp32 (head_dim ascending) for rr < rn, 0 beyond
 * (FlashAttention-2's D = rowsum(dO o O), from the fp32 buffers). */
static __device__ void a16_row_dots(float *D, const float *g, const float *o, int rn, size_t qs, int hd)
{
    int t = threadIdx.x;
    if (t >= A16_T) return;
    float s = 0.0f;
    if (t < rn)
        for (int i = 0; i < hd; i++) s += g[(size_t)t * qs + i] * o[(size_t)t * qs + i];
    D[t] = s;
}

/* Online softmax of query row r over a tile of scores s (unscaled; key j
 * visible when vis(j)): m = max(m, max scaled s), c = exp(m_old - m), l = l c +
 * sum exp(s scale - m) (fp32), p[j] = bf16(exp(s scale - m)). Rows past the
 * tile's end get p = 0, c = 1. */
static __device__ void a16_softmax_row(uint16_t *p, const float *s, float scale, int r0, int r, int rn, int j0, int jn,
                                       bool causal, float *m, float *l, float *c)
{
    if (r >= rn) {
        for (int j = 0; j < A16_T; j++) p[j] = 0;
        *c = 1.0f;
        return;
    }
    float mt = -INFINITY;
    for (int j = 0; j < A16_T; j++)
        if (att_visible(r0, r, rn, j0, j, jn, causal)) mt = fmaxf(mt, s[j] * scale);
    float mnew = fmaxf(*m, mt), corr = *m == -INFINITY ? 0.0f : expf(*m - mnew), sum = *l * corr;
    for (int j = 0; j < A16_T; j++) {
        float e = att_visible(r0, r, rn, j0, j, jn, causal) ? expf(s[j] * scale - mnew) : 0.0f;
        sum += e;
        p[j] = ex_bf16_from_f32(e);
    }
    *m = mnew;
    *l = sum;
    *c = corr;
}

/* Forward (the fp32 kernel's contract): block (s, h, z) takes the query tiles
 * z, z + Y, ... of sequence s, head h; per key tile: S on tensor cores, the
 * online-softmax step per row, then per head_dim chunk the product P V on
 * tensor cores and out = out c + P V (out holds the running fp32
 * accumulator); at the end out /= l, lse = m + log l. */
static __global__ void attention16_forward_kernel(float *out, float *lse, const float *q, const float *k,
                                                  const float *v, att_geom g, int H, int Hkv, int hd, bool causal)
{
    __shared__ __align__(32) a16_chunk qt, kt;
    __shared__ __align__(32) a16_stile st;
    __shared__ __align__(32) a16_probs pt;
    __shared__ __align__(32) a16_out ot;
    __shared__ float row_m[A16_T], row_l[A16_T], row_c[A16_T];
    int h = blockIdx.y, t = threadIdx.x;
    const att_view a = att_view_of(g, k, v, H, Hkv, hd);
    for (int r0 = blockIdx.z * A16_T; r0 < a.len; r0 += gridDim.z * A16_T) {
        int rn = imin(A16_T, a.len - r0), kend = causal ? r0 + rn : a.klen;
        const float *qr = q + (size_t)(a.s0 + r0) * a.qs + (size_t)h * hd;
        float *o = out + (size_t)(a.s0 + r0) * a.qs + (size_t)h * hd;
        if (t < A16_T) {
            row_m[t] = -INFINITY;
            row_l[t] = 0.0f;
        }
        for (int j0 = 0; j0 < kend; j0 += A16_T) {
            int jn = imin(A16_T, kend - j0);
            a16_scores_of(st, NULL, qt, kt, NULL, NULL, qr, a.kh + (size_t)j0 * a.ks, NULL, NULL, rn, jn, a.qs, a.ks, hd);
            if (t < A16_T) a16_softmax_row(pt[t], st[t], a.scale, r0, t, rn, j0, jn, causal, &row_m[t], &row_l[t], &row_c[t]);
            /* (the barrier after the first V chunk's load publishes pt and row_c) */
            for (int d0 = 0; d0 < hd; d0 += A16_DC) {
                a16_load(kt, a.vh + (size_t)j0 * a.ks, jn, a.ks, d0, hd);
                __syncthreads();
                a16_gemm<wmma::row_major, wmma::row_major>(&ot[0][0], A16_LO, A16_T / 16, a16_blocks(d0, hd),
                                                           A16_T / 16, &pt[0][0], A16_LP, &kt[0][0], A16_LD);
                __syncthreads();
                for (int e = t; e < rn * A16_DC; e += THREADS) {
                    int rr = e / A16_DC, c = e % A16_DC;
                    if (d0 + c >= hd) continue;
                    float *x = o + (size_t)rr * a.qs + d0 + c;
                    *x = j0 == 0 ? ot[rr][c] : *x * row_c[rr] + ot[rr][c];
                }
                /* (the next chunk's load touches kt only; its barrier orders ot) */
            }
        }
        __syncthreads();
        for (int e = t; e < rn * hd; e += THREADS) o[(size_t)(e / hd) * a.qs + e % hd] /= row_l[e / hd];
        if (t < rn) lse[(size_t)(a.s0 + r0 + t) * H + h] = row_m[t] + logf(row_l[t]);
        __syncthreads();
    }
}

/* p = exp(s scale - L[r]) of a visible score (0 otherwise) and ds = p (dp -
 * D[r]), for the tile's entries, rounded to bf16 into pt (if not NULL) and
 * dst. Ends at a barrier. */
static __device__ void a16_probs_of(a16_probs pt, a16_probs dst, const a16_stile st, const a16_stile dpt,
                                    const float *L, const float *D, float scale, int r0, int rn, int j0, int jn,
                                    bool causal)
{
    for (int e = threadIdx.x; e < A16_T * A16_T; e += THREADS) {
        int r = e / A16_T, j = e % A16_T;
        float p = att_visible(r0, r, rn, j0, j, jn, causal) ? expf(st[r][j] * scale - L[r]) : 0.0f;
        if (pt) pt[r][j] = ex_bf16_from_f32(p);
        dst[r][j] = ex_bf16_from_f32(p * (dpt[r][j] - D[r]));
    }
    __syncthreads();
}

/* Backward of q (the fp32 dq kernel's contract): dq[r] += scale sum_j ds k[j],
 * dS K on tensor cores per head_dim chunk. */
static __global__ void attention16_backward_dq_kernel(float *dq, const float *dout, const float *q, const float *k,
                                                      const float *v, const float *out, const float *lse, att_geom g,
                                                      int H, int Hkv, int hd, bool causal)
{
    __shared__ __align__(32) a16_chunk qt, kt, gt, vt;
    __shared__ __align__(32) a16_stile st, dpt;
    __shared__ __align__(32) a16_probs dst;
    __shared__ __align__(32) a16_out ot;
    __shared__ float row_D[A16_T], row_L[A16_T];
    int h = blockIdx.y, t = threadIdx.x;
    const att_view a = att_view_of(g, k, v, H, Hkv, hd);
    for (int r0 = blockIdx.z * A16_T; r0 < a.len; r0 += gridDim.z * A16_T) {
        int rn = imin(A16_T, a.len - r0), kend = causal ? r0 + rn : a.klen;
        size_t qo = (size_t)(a.s0 + r0) * a.qs + (size_t)h * hd;
        if (t < A16_T) row_L[t] = t < rn ? lse[(size_t)(a.s0 + r0 + t) * H + h] : 0.0f;
        a16_row_dots(row_D, dout + qo, out + qo, rn, a.qs, hd);
        for (int j0 = 0; j0 < kend; j0 += A16_T) {
            int jn = imin(A16_T, kend - j0);
            const float *kj = a.kh + (size_t)j0 * a.ks;
            a16_scores_of(st, dpt, qt, kt, gt, vt, q + qo, kj, dout + qo, a.vh + (size_t)j0 * a.ks, rn, jn, a.qs, a.ks, hd);
            a16_probs_of(NULL, dst, st, dpt, row_L, row_D, a.scale, r0, rn, j0, jn, causal);
            for (int d0 = 0; d0 < hd; d0 += A16_DC) {
                a16_load(kt, kj, jn, a.ks, d0, hd);
                __syncthreads();
                a16_gemm<wmma::row_major, wmma::row_major>(&ot[0][0], A16_LO, A16_T / 16, a16_blocks(d0, hd),
                                                           A16_T / 16, &dst[0][0], A16_LP, &kt[0][0], A16_LD);
                __syncthreads();
                for (int e = t; e < rn * A16_DC; e += THREADS) {
                    int rr = e / A16_DC, c = e % A16_DC;
                    if (d0 + c < hd) dq[qo + (size_t)rr * a.qs + d0 + c] += a.scale * ot[rr][c];
                }
            }
            __syncthreads();
        }
    }
}

/* The dk/dv kernel's products share shared memory with the score tiles,
 * which are dead by then. */
union a16_kv_scratch {
    struct {
        a16_stile s, dp;
    } sc;
    a16_out o[2];
};

/* Backward of k and v (the fp32 dkdv kernel's contract): dv[j] += sum_r p
 * dout[r], dk[j] += scale sum_r ds q[r] over the GQA group's heads and the
 * query tiles that see key tile j; P^T dO and dS^T Q on tensor cores per
 * head_dim chunk. dk or dv may be NULL. */
static __global__ void attention16_backward_dkdv_kernel(float *dk, float *dv, const float *dout, const float *q,
                                                        const float *k, const float *v, const float *out,
                                                        const float *lse, att_geom g, int H, int Hkv, int hd,
                                                        bool causal)
{
    __shared__ __align__(32) a16_chunk qt, kt, gt, vt;
    __shared__ __align__(32) a16_kv_scratch u;
    __shared__ __align__(32) a16_probs pt, dst;
    __shared__ float row_D[A16_T], row_L[A16_T];
    int kvh = blockIdx.y, group = H / Hkv, t = threadIdx.x;
    const att_view kv = att_kv_view_of(g, H, Hkv, hd);
    const int s0 = kv.s0, len = kv.len, ks0 = kv.ks0, klen = kv.klen;
    const size_t qs = kv.qs, ks = kv.ks;
    const float scale = kv.scale;
    for (int j0 = blockIdx.z * A16_T; j0 < klen; j0 += gridDim.z * A16_T) {
        int jn = imin(A16_T, klen - j0);
        size_t ko = (size_t)(ks0 + j0) * ks + (size_t)kvh * hd;
        for (int h = kvh * group; h < (kvh + 1) * group; h++)
            for (int r0 = causal ? j0 / A16_T * A16_T : 0; r0 < len; r0 += A16_T) {
                int rn = imin(A16_T, len - r0);
                size_t qo = (size_t)(s0 + r0) * qs + (size_t)h * hd;
                if (t < A16_T) row_L[t] = t < rn ? lse[(size_t)(s0 + r0 + t) * H + h] : 0.0f;
                a16_row_dots(row_D, dout + qo, out + qo, rn, qs, hd);
                a16_scores_of(u.sc.s, u.sc.dp, qt, kt, gt, vt, q + qo, k + ko, dout + qo, v + ko, rn, jn, qs, ks, hd);
                a16_probs_of(pt, dst, u.sc.s, u.sc.dp, row_L, row_D, scale, r0, rn, j0, jn, causal);
                for (int d0 = 0; d0 < hd; d0 += A16_DC) {
                    a16_load(qt, q + qo, rn, qs, d0, hd);
                    a16_load(gt, dout + qo, rn, qs, d0, hd);
                    __syncthreads();
                    int nb = a16_blocks(d0, hd);
                    /* P^T and dS^T: the [query][key] tiles read column-major */
                    a16_gemm<wmma::col_major, wmma::row_major>(&u.o[0][0][0], A16_LO, A16_T / 16, nb, A16_T / 16,
                                                               &pt[0][0], A16_LP, &gt[0][0], A16_LD);
                    a16_gemm<wmma::col_major, wmma::row_major>(&u.o[1][0][0], A16_LO, A16_T / 16, nb, A16_T / 16,
                                                               &dst[0][0], A16_LP, &qt[0][0], A16_LD);
                    __syncthreads();
                    for (int e = t; e < jn * A16_DC; e += THREADS) {
                        int jj = e / A16_DC, c = e % A16_DC;
                        if (d0 + c >= hd) continue;
                        size_t at = ko + (size_t)jj * ks + d0 + c;
                        if (dv) dv[at] += u.o[0][jj][c];
                        if (dk) dk[at] += scale * u.o[1][jj][c];
                    }
                }
                __syncthreads();
            }
    }
}
