/* CPU backend: the attention kernels (see executor/backend.h and the
 * comments above each): self-attention over variable-length sequences, and
 * ring attention's pieces (a block of keys, and the merge of partial results
 * by their log-sum-exp). Both walk the same per-unit loops, the sequences'
 * query and key rows given by cu_seqlens or by a block's geometry. */
#include "executor/cpu_int.h"

#include <math.h>
#include <string.h>

static float dotf(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Transposes rows j0 .. j0+jn-1 of head kvh of x[n, Hkv, hd] into xt[hd, EX_ATT_TILE]
 * (xt[i, jj] = x[j0 + jj, kvh, i]); the unused columns jj >= jn are zero. */
static void att_tile_transpose(float *xt, const float *x, int j0, int jn, int Hkv, int kvh, int hd)
{
    for (int i = 0; i < hd; i++)
        for (int jj = jn; jj < EX_ATT_TILE; jj++) xt[(size_t)i * EX_ATT_TILE + jj] = 0;
    for (int jj = 0; jj < jn; jj++) {
        const float *xj = x + ((size_t)(j0 + jj) * Hkv + kvh) * hd;
        for (int i = 0; i < hd; i++) xt[(size_t)i * EX_ATT_TILE + jj] = xj[i];
    }
}

/* sc[jj] = sum_i a[i] xt[i, jj] for the tile's first n keys (rounded up to 16;
 * a causal row sees only keys up to its own), i ascending: each sc[jj] is
 * bit-identical to dotf(a, x_jj, hd), but the loop runs across 16 keys at a
 * time (independent sums in one register, so it vectorizes without
 * reordering any sum). */
_Static_assert(EX_ATT_TILE % 16 == 0, "attention key tile is a multiple of 16");
static void att_tile_dots(float *restrict sc, const float *restrict a, const float *restrict xt, int hd, int n)
{
    for (int c0 = 0; c0 < n; c0 += 16) {
        float acc[16] = {0};
        for (int i = 0; i < hd; i++) {
            float ai = a[i];
            const float *row = xt + (size_t)i * EX_ATT_TILE + c0;
            for (int jj = 0; jj < 16; jj++) acc[jj] += ai * row[jj];
        }
        for (int jj = 0; jj < 16; jj++) sc[c0 + jj] = acc[jj];
    }
}

/* y[i] += s x[i] */
static void axpyf(float *restrict y, float s, const float *restrict x, int n)
{
    for (int i = 0; i < n; i++) y[i] += s * x[i];
}

/* Attention over variable-length sequences (flash-attention varlen style):
 * sequence i holds rows cu_seqlens[i] .. cu_seqlens[i+1]-1; rows attend only within
 * their sequence (block-diagonal), and if causal only to keys j <= their own row.
 * q[n, H, hd], k/v[n, Hkv, hd]; query head h reads kv head h / (H / Hkv) (GQA).
 * out[r, h] = sum_j softmax_j(q[r,h] . k[j] / sqrt(hd)) v[j];  lse[r, h] = log sum_j exp(score).
 * Online softmax over key tiles of EX_ATT_TILE: only a tile of scores per row is live,
 * never the s x s matrix; out holds each row's running accumulator. Loops run per
 * (sequence, head, block of EX_ATT_TILE query rows, key tile), the key tile transposed
 * once for the block so the scores vectorize; each row sees the same operations in
 * the same order as a row-by-row loop. lse[n, H] is kept for the backward pass. */
typedef struct {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *o, *L;
    const int *cu;            /* self-attention: sequence s is rows cu[s] .. cu[s+1]-1 of q and k */
    int stride, q0, nq, k0, nk;   /* else (a key block): query rows s*stride+q0 .. +nq, key rows s*stride+k0 .. +nk */
    int H, Hkv, hd;
    bool causal;
} att_args;

/* Sequence s's first query and key rows and their counts. */
static void att_rows(const att_args *A, int s, int *qs0, int *qlen, int *ks0, int *klen)
{
    if (A->cu) {
        *qs0 = *ks0 = A->cu[s];
        *qlen = *klen = A->cu[s + 1] - A->cu[s];
        return;
    }
    *qs0 = s * A->stride + A->q0;
    *ks0 = s * A->stride + A->k0;
    *qlen = A->nq;
    *klen = A->nk;
}

/* Forward of one (sequence sq, query head h) unit: its out rows and lse entries. */
static void att_forward_unit(const att_args *A, int sq, int h)
{
    int H = A->H, Hkv = A->Hkv, hd = A->hd, kvh = h / (H / Hkv);
    bool causal = A->causal;
    const float *q = A->q, *v = A->v;
    float *out = A->out;
    float scale = 1.0f / sqrtf((float)hd), sc[EX_ATT_TILE], m[EX_ATT_TILE], l[EX_ATT_TILE];
    float kt[(size_t)hd * EX_ATT_TILE];
    int s0, len, ks0, klen;
    att_rows(A, sq, &s0, &len, &ks0, &klen);
    for (int r0 = 0; r0 < len; r0 += EX_ATT_TILE) {
        int rn = len - r0 < EX_ATT_TILE ? len - r0 : EX_ATT_TILE;
        int kmax = causal ? r0 + rn : klen;   /* keys any row of the block sees */
        for (int rr = 0; rr < rn; rr++) {
            m[rr] = -INFINITY;
            l[rr] = 0;
            float *o = out + ((size_t)(s0 + r0 + rr) * H + h) * hd;
            for (int i = 0; i < hd; i++) o[i] = 0;
        }
        for (int j0 = 0; j0 < kmax; j0 += EX_ATT_TILE) {
            int tn = kmax - j0 < EX_ATT_TILE ? kmax - j0 : EX_ATT_TILE;
            att_tile_transpose(kt, A->k + (size_t)ks0 * Hkv * hd, j0, tn, Hkv, kvh, hd);
            for (int rr = 0; rr < rn; rr++) {
                int r = r0 + rr, kend = causal ? r + 1 : klen;
                if (kend <= j0) continue;
                int jn = kend - j0 < tn ? kend - j0 : tn;
                const float *qr = q + ((size_t)(s0 + r) * H + h) * hd;
                float *acc = out + ((size_t)(s0 + r) * H + h) * hd;
                att_tile_dots(sc, qr, kt, hd, jn);
                float mt = -INFINITY;
                for (int jj = 0; jj < jn; jj++) {
                    sc[jj] *= scale;
                    if (sc[jj] > mt) mt = sc[jj];
                }
                float mnew = m[rr] > mt ? m[rr] : mt, corr = expf(m[rr] - mnew);
                l[rr] *= corr;
                for (int i = 0; i < hd; i++) acc[i] *= corr;
                for (int jj = 0; jj < jn; jj++) {
                    const float *vj = v + ((size_t)(ks0 + j0 + jj) * Hkv + kvh) * hd;
                    float p = expf(sc[jj] - mnew);
                    l[rr] += p;
                    axpyf(acc, p, vj, hd);
                }
                m[rr] = mnew;
            }
        }
        for (int rr = 0; rr < rn; rr++) {
            float *o = out + ((size_t)(s0 + r0 + rr) * H + h) * hd;
            for (int i = 0; i < hd; i++) o[i] /= l[rr];
            A->lse[(size_t)(s0 + r0 + rr) * H + h] = m[rr] + logf(l[rr]);
        }
    }
}

static void att_forward_range(void *c, size_t lo, size_t hi)
{
    const att_args *A = c;
    for (size_t u = lo; u < hi; u++) att_forward_unit(A, (int)(u / (size_t)A->H), (int)(u % (size_t)A->H));
}

/* Units below this many score x head_dim products in all stay on one thread. */
#define ATT_PAR_WORK 262144.0

/* Rough multiply-adds of an attention call: sum over sequences of queries x keys x H x hd. */
static double att_work(const att_args *A, int nseq)
{
    double w = 0;
    for (int i = 0; i < nseq; i++) {
        int qs0, qlen, ks0, klen;
        att_rows(A, i, &qs0, &qlen, &ks0, &klen);
        w += (double)qlen * klen;
    }
    return w * A->H * A->hd;
}

/* Attention over variable-length sequences (flash-attention varlen style):
 * sequence i holds rows cu_seqlens[i] .. cu_seqlens[i+1]-1; rows attend only within
 * their sequence (block-diagonal), and if causal only to keys j <= their own row.
 * q[n, H, hd], k/v[n, Hkv, hd]; query head h reads kv head h / (H / Hkv) (GQA).
 * out[r, h] = sum_j softmax_j(q[r,h] . k[j] / sqrt(hd)) v[j];  lse[r, h] = log sum_j exp(score).
 * Online softmax over key tiles of EX_ATT_TILE: only a tile of scores per row is live,
 * never the s x s matrix; out holds each row's running accumulator. Loops run per
 * (sequence, head) unit (the units are spread over the pool), then per block of
 * EX_ATT_TILE query rows and key tile, the key tile transposed once for the block so
 * the scores vectorize; each row sees the same operations in the same order as a
 * row-by-row loop. lse[n, H] is kept for the backward pass. */
static void att_forward(const att_args *A, int nseq)
{
    size_t units = (size_t)nseq * A->H;
    if (units) ex_cpu_parallel(units, att_work(A, nseq) < ATT_PAR_WORK ? units : 1, att_forward_range, (void *)A);
}

void ex_cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, const int *cu,
                              int nseq, int H, int Hkv, int hd, bool causal)
{
    att_args A = { .out = out, .lse = lse, .q = q, .k = k, .v = v, .cu = cu, .H = H, .Hkv = Hkv,
                   .hd = hd, .causal = causal };
    att_forward(&A, nseq);
}

/* Copies rows j0 .. j0+jn-1 of head kvh of x[n, Hkv, hd] to or from the
 * contiguous tile xs[jn, hd]. */
static void att_rows_load(float *xs, const float *x, int j0, int jn, int Hkv, int kvh, int hd)
{
    for (int jj = 0; jj < jn; jj++)
        memcpy(xs + (size_t)jj * hd, x + ((size_t)(j0 + jj) * Hkv + kvh) * hd, (size_t)hd * sizeof *xs);
}

static void att_rows_store(float *x, const float *xs, int j0, int jn, int Hkv, int kvh, int hd)
{
    for (int jj = 0; jj < jn; jj++)
        memcpy(x + ((size_t)(j0 + jj) * Hkv + kvh) * hd, xs + (size_t)jj * hd, (size_t)hd * sizeof *xs);
}

/* Backward of one (sequence sq, kv head kvh) unit: its dk, dv rows and the dq rows
 * of the query heads reading kvh. The key tile's dk, dv rows are accumulated in a
 * contiguous local copy and written back once per tile: the units of one sequence
 * own interleaved hd-float slices of the same dk, dv rows, and threads adding into
 * neighbouring slices for every (row, key) ran 2 threads 2-2.3x slower than 1
 * (bench/attn_threads: s=256, H=4 and 8, Hkv=2 and 4, hd=16). The same additions
 * in the same order: the same bits. */
static void att_backward_unit(const att_args *A, int sq, int kvh)
{
    int H = A->H, Hkv = A->Hkv, hd = A->hd, group = H / Hkv;
    bool causal = A->causal;
    const float *q = A->q, *k = A->k, *dout = A->dout;
    float scale = 1.0f / sqrtf((float)hd), sc[EX_ATT_TILE], dp[EX_ATT_TILE];
    float kt[(size_t)hd * EX_ATT_TILE], vt[(size_t)hd * EX_ATT_TILE];
    float dkt[(size_t)hd * EX_ATT_TILE], dvt[(size_t)hd * EX_ATT_TILE];
    int s0, len, ks0, klen;
    att_rows(A, sq, &s0, &len, &ks0, &klen);
    float *dk = A->dk + (size_t)ks0 * Hkv * hd, *dv = A->dv + (size_t)ks0 * Hkv * hd;
    for (int j0 = 0; j0 < klen; j0 += EX_ATT_TILE) {
        int tn = klen - j0 < EX_ATT_TILE ? klen - j0 : EX_ATT_TILE;
        att_tile_transpose(kt, k + (size_t)ks0 * Hkv * hd, j0, tn, Hkv, kvh, hd);
        att_tile_transpose(vt, A->v + (size_t)ks0 * Hkv * hd, j0, tn, Hkv, kvh, hd);
        att_rows_load(dkt, dk, j0, tn, Hkv, kvh, hd);
        att_rows_load(dvt, dv, j0, tn, Hkv, kvh, hd);
        for (int r = causal ? j0 : 0; r < len; r++) {
            int kend = causal ? r + 1 : klen, jn = kend - j0 < tn ? kend - j0 : tn;
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                size_t qo = ((size_t)(s0 + r) * H + h) * hd;
                const float *qr = q + qo, *dor = dout + qo;
                float D = dotf(dor, A->o + qo, hd), L = A->L[(size_t)(s0 + r) * H + h];
                att_tile_dots(sc, qr, kt, hd, jn);
                att_tile_dots(dp, dor, vt, hd, jn);
                for (int jj = 0; jj < jn; jj++) {
                    size_t ko = ((size_t)(ks0 + j0 + jj) * Hkv + kvh) * hd;
                    float p = expf(sc[jj] * scale - L);
                    float ds = p * (dp[jj] - D) * scale;
                    axpyf(dvt + (size_t)jj * hd, p, dor, hd);
                    axpyf(A->dq + qo, ds, k + ko, hd);
                    axpyf(dkt + (size_t)jj * hd, ds, qr, hd);
                }
            }
        }
        att_rows_store(dk, dkt, j0, tn, Hkv, kvh, hd);
        att_rows_store(dv, dvt, j0, tn, Hkv, kvh, hd);
    }
}

static void att_backward_range(void *c, size_t lo, size_t hi)
{
    const att_args *A = c;
    for (size_t u = lo; u < hi; u++) att_backward_unit(A, (int)(u / (size_t)A->Hkv), (int)(u % (size_t)A->Hkv));
}

/* Attention backward, recomputing scores per key from q, k and lse (no s x s matrix):
 * p = exp(q.k/sqrt(hd) - lse), D[r] = dout[r] . out[r],
 * dv[j] += p dout[r];  ds = p (dout[r] . v[j] - D[r]);
 * dq[r] += ds k[j] / sqrt(hd);  dk[j] += ds q[r] / sqrt(hd).
 * Units (sequence, kv head) own disjoint gradient rows and are spread over the pool;
 * within one, loops run per key tile with the tile's k and v transposed once, then
 * over rows r and the group's query heads h: every gradient element receives its
 * terms in the order of a loop over r, h, j (dk, dv: r-major then h; dq: j ascending). */
static void att_backward(const att_args *A, int nseq)
{
    size_t units = (size_t)nseq * A->Hkv;
    if (units) ex_cpu_parallel(units, att_work(A, nseq) < ATT_PAR_WORK ? units : 1, att_backward_range, (void *)A);
}

void ex_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                               const float *v, const float *out, const float *lse, const int *cu, int nseq, int H,
                               int Hkv, int hd, bool causal)
{
    att_args A = { .dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dout = dout, .o = out,
                   .L = lse, .cu = cu, .H = H, .Hkv = Hkv, .hd = hd, .causal = causal };
    att_backward(&A, nseq);
}


/* ------------------------------------------------------------ ring attention */

/* Partial attention of a block of keys (non-causal), see backend.h. */
void ex_cpu_attention_part_forward(float *out, float *lse, const float *q, const float *k, const float *v, int nseq,
                                   int stride, int q0, int nq, int k0, int nk, int H, int Hkv, int hd)
{
    att_args A = { .out = out, .lse = lse, .q = q, .k = k, .v = v, .stride = stride, .q0 = q0, .nq = nq,
                   .k0 = k0, .nk = nk, .H = H, .Hkv = Hkv, .hd = hd };
    att_forward(&A, nseq);
}

/* Its backward from the final out and lse, accumulating into dq (the block's
 * query rows) and dk, dv (its key rows). */
void ex_cpu_attention_part_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *out, const float *lse, int nseq,
                                    int stride, int q0, int nq, int k0, int nk, int H, int Hkv, int hd)
{
    att_args A = { .dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dout = dout, .o = out, .L = lse,
                   .stride = stride, .q0 = q0, .nq = nq, .k0 = k0, .nk = nk, .H = H, .Hkv = Hkv, .hd = hd };
    att_backward(&A, nseq);
}

typedef struct {
    float *out, *lse;
    const float *part, *plse;
    int stride, q0, nq, H, hd;
} merge_args;

/* Rows [lo, hi) of the nseq x nq merged (row u is sequence u / nq, query u % nq). */
static void merge_range(void *c, size_t lo, size_t hi)
{
    const merge_args *A = c;
    for (size_t u = lo; u < hi; u++) {
        size_t row = (size_t)(u / (size_t)A->nq) * A->stride + A->q0 + u % (size_t)A->nq;
        for (int h = 0; h < A->H; h++) {
            size_t e = row * A->H + h;
            float a = A->lse[e], b = A->plse[e], m = a > b ? a : b;
            float lse = m + logf(expf(a - m) + expf(b - m)), wa = expf(a - lse), wb = expf(b - lse);
            float *o = A->out + e * A->hd;
            const float *p = A->part + e * A->hd;
            for (int i = 0; i < A->hd; i++) o[i] = o[i] * wa + p[i] * wb;
            A->lse[e] = lse;
        }
    }
}

/* The merge of two attentions of the same queries over disjoint keys, by
 * their log-sum-exp (Milakov & Gimelshein's online softmax, arXiv
 * 1805.02867; flash-attention's split-KV combine): for rows
 * s * stride + q0 .. + nq and every head, lse' = log(e^lse + e^plse),
 * out' = out e^(lse - lse') + part e^(plse - lse'). */
void ex_cpu_attention_merge(float *out, float *lse, const float *part, const float *part_lse, int nseq, int stride,
                            int q0, int nq, int H, int hd)
{
    merge_args A = { out, lse, part, part_lse, stride, q0, nq, H, hd };
    size_t rows = (size_t)(nseq > 0 ? nseq : 0) * (nq > 0 ? nq : 0);
    ex_cpu_parallel(rows, (size_t)(4096 / (H * hd > 0 ? H * hd : 1)) + 1, merge_range, &A);
}
