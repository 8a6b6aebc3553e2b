/* Ring attention's kernels (executor/backend.h: attention_part_forward,
 * attention_part_backward, attention_merge) and the Ulysses packing's
 * transpose_blocks: the CPU backend against a naive double-precision
 * reference, and the CUDA backend's source run by the emulator
 * (tests/cudaemu.h) against the CPU backend. Shapes are odd on purpose (rows
 * not multiples of the CPU's 64-key or the CUDA kernels' 32-row tiles). */
#include "test.h"
#include "executor/backend.h"
#include "util/util.h"
#include "tests/kernel_data.h"

#include <stdint.h>
#include <stdlib.h>

/* max |a - ref| / max(|ref|, 1% of max |ref|) */
static double rel_err(const float *a, const double *ref, size_t n)
{
    double scale = 0, worst = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    double fl = scale > 0 ? 0.01 * scale : 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / fmax(fabs(ref[i]), fl);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

/* The geometry of the tests: nseq sequences of L rows, H query and Hkv kv heads of hd. */
enum { NSEQ = 2, L = 37, H = 4, HKV = 2, HD = 16 };
#define QN ((size_t)NSEQ * L * H * HD)
#define KN ((size_t)NSEQ * L * HKV * HD)
#define LN ((size_t)NSEQ * L * H)

/* Naive attention of query rows [q0, q0 + nq) over keys [k0, k0 + nk) of every
 * sequence, non-causal, in double: out, lse of those rows; with dout, the
 * gradients dq, dk, dv of that attention (from its own out and lse). */
static void naive(const float *q, const float *k, const float *v, const float *dout, int q0, int nq, int k0, int nk,
                  double *out, double *lse, double *dq, double *dk, double *dv)
{
    double scale = 1.0 / sqrt((double)HD), p[L];
    for (int s = 0; s < NSEQ; s++)
        for (int r = q0; r < q0 + nq; r++)
            for (int h = 0; h < H; h++) {
                int kvh = h / (H / HKV);
                size_t qo = (((size_t)s * L + r) * H + h) * HD;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j < nk; j++) {
                    size_t ko = (((size_t)s * L + k0 + j) * HKV + kvh) * HD;
                    double dot = 0;
                    for (int i = 0; i < HD; i++) dot += (double)q[qo + i] * k[ko + i];
                    p[j] = dot * scale;
                    m = fmax(m, p[j]);
                }
                for (int j = 0; j < nk; j++) sum += exp(p[j] - m);
                double l = m + log(sum);
                lse[((size_t)s * L + r) * H + h] = l;
                double o[HD] = { 0 };
                for (int j = 0; j < nk; j++) {
                    p[j] = exp(p[j] - l);
                    size_t ko = (((size_t)s * L + k0 + j) * HKV + kvh) * HD;
                    for (int i = 0; i < HD; i++) o[i] += p[j] * v[ko + i];
                }
                for (int i = 0; i < HD; i++) out[qo + i] = o[i];
                if (!dout) continue;
                double D = 0;
                for (int i = 0; i < HD; i++) D += (double)dout[qo + i] * o[i];
                for (int j = 0; j < nk; j++) {
                    size_t ko = (((size_t)s * L + k0 + j) * HKV + kvh) * HD;
                    double dp = 0;
                    for (int i = 0; i < HD; i++) dp += (double)dout[qo + i] * v[ko + i];
                    double ds = p[j] * (dp - D) * scale;
                    for (int i = 0; i < HD; i++) {
                        dv[ko + i] += p[j] * dout[qo + i];
                        dq[qo + i] += ds * k[ko + i];
                        dk[ko + i] += ds * q[qo + i];
                    }
                }
            }
}

/* Every query row over two disjoint key blocks, merged, then the two blocks'
 * backward from the merged out and lse: the whole attention and its gradients. */
static void two_blocks(const ex_backend *be, const float *q, const float *k, const float *v, const float *g, float *out,
                       float *lse, float *dq, float *dk, float *dv)
{
    float *part = rnd(QN, 1), *plse = rnd(LN, 1);
    be->attention_part_forward(out, lse, q, k, v, NSEQ, L, 0, L, 0, 15, H, HKV, HD);
    be->attention_part_forward(part, plse, q, k, v, NSEQ, L, 0, L, 15, L - 15, H, HKV, HD);
    be->attention_merge(out, lse, part, plse, NSEQ, L, 0, L, H, HD);
    be->attention_part_backward(dq, dk, dv, g, q, k, v, out, lse, NSEQ, L, 0, L, 0, 15, H, HKV, HD);
    be->attention_part_backward(dq, dk, dv, g, q, k, v, out, lse, NSEQ, L, 0, L, 15, L - 15, H, HKV, HD);
    free(part);
    free(plse);
}

TEST(cpu_kernels_ring_attention_pieces_match_a_naive_reference)
{
    const ex_backend *cpu = ex_backend_cpu();
    CHECK(cpu->attention_part_forward && cpu->attention_part_backward && cpu->attention_merge);
    float *q = rnd(QN, 2), *k = rnd(KN, 2), *v = rnd(KN, 1), *g = rnd(QN, 1);
    float *out = rnd(QN, 1), *lse = rnd(LN, 1);
    float *dq = calloc(QN, sizeof *dq), *dk = calloc(KN, sizeof *dk), *dv = calloc(KN, sizeof *dv);
    double *rout = calloc(QN, sizeof *rout), *rlse = calloc(LN, sizeof *rlse);
    double *rdq = calloc(QN, sizeof *rdq), *rdk = calloc(KN, sizeof *rdk), *rdv = calloc(KN, sizeof *rdv);
    two_blocks(cpu, q, k, v, g, out, lse, dq, dk, dv);
    naive(q, k, v, g, 0, L, 0, L, rout, rlse, rdq, rdk, rdv);
    /* fp32 sums against double ones: the whole-sequence kernel is itself up to
     * 1.6e-5 off on these inputs (entries near the 1% floor) */
    CHECK_MSG(rel_err(out, rout, QN) < 1e-4, "merged out: %.3g", rel_err(out, rout, QN));
    CHECK_MSG(rel_err(lse, rlse, LN) < 1e-5, "merged lse: %.3g", rel_err(lse, rlse, LN));
    CHECK_MSG(rel_err(dq, rdq, QN) < 1e-4, "dq: %.3g", rel_err(dq, rdq, QN));
    CHECK_MSG(rel_err(dk, rdk, KN) < 1e-4, "dk: %.3g", rel_err(dk, rdk, KN));
    CHECK_MSG(rel_err(dv, rdv, KN) < 1e-4, "dv: %.3g", rel_err(dv, rdv, KN));
    /* A block of some query rows (the ring's later chunk over all keys) leaves the other rows as they were. */
    float *o2 = rnd(QN, 1), *l2 = rnd(LN, 1), *o2_before = dup(o2, QN);
    cpu->attention_part_forward(o2, l2, q, k, v, NSEQ, L, 20, 11, 3, 30, H, HKV, HD);
    naive(q, k, v, NULL, 20, 11, 3, 30, rout, rlse, NULL, NULL, NULL);
    for (int s = 0; s < NSEQ; s++)
        for (int r = 0; r < L; r++) {
            size_t at = ((size_t)s * L + r) * H * HD;
            bool in = r >= 20 && r < 31;
            double e = in ? rel_err(o2 + at, rout + at, (size_t)H * HD) : max_rel_err(o2 + at, o2_before + at, (size_t)H * HD);
            CHECK_MSG(e < 1e-4, "sequence %d row %d (%s the block): %.3g", s, r, in ? "in" : "outside", e);
        }
    free(q); free(k); free(v); free(g); free(out); free(lse); free(dq); free(dk); free(dv);
    free(rout); free(rlse); free(rdq); free(rdk); free(rdv); free(o2); free(l2); free(o2_before);
}

TEST(cpu_kernels_transpose_blocks_swaps_the_block_grid)
{
    const ex_backend *cpu = ex_backend_cpu();
    enum { ROWS = 5, COLS = 3, BLK = 7 };
    float *src = rnd(ROWS * COLS * BLK, 1), *dst = rnd(ROWS * COLS * BLK, 1);
    cpu->transpose_blocks(dst, src, ROWS, COLS, BLK);
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < COLS; c++)
            for (int e = 0; e < BLK; e++)
                CHECK(dst[((size_t)c * ROWS + r) * BLK + e] == src[((size_t)r * COLS + c) * BLK + e]);
    /* a transpose and its inverse give the source back */
    float *back = rnd(ROWS * COLS * BLK, 1);
    cpu->transpose_blocks(back, dst, COLS, ROWS, BLK);
    CHECK(!memcmp(back, src, sizeof(float) * ROWS * COLS * BLK));
    free(src); free(dst); free(back);
}

TEST(cuda_kernels_emu_ring_attention_pieces_and_transpose_match_cpu)
{
    char err[UTIL_ERR_LEN] = "";
    const ex_backend *emu = ex_backend_cuda_emu(err), *cpu = ex_backend_cpu();
    CHECK_MSG(emu != NULL, "%s", err);
    CHECK(emu->attention_part_forward && emu->attention_part_backward && emu->attention_merge && emu->transpose_blocks);
    float *q = rnd(QN, 2), *k = rnd(KN, 2), *v = rnd(KN, 1), *g = rnd(QN, 1);
    float *out = rnd(QN, 1), *lse = rnd(LN, 1), *ro = dup(out, QN), *rl = dup(lse, LN);
    float *dq = rnd(QN, 1), *dk = rnd(KN, 1), *dv = rnd(KN, 1);
    float *rdq = dup(dq, QN), *rdk = dup(dk, KN), *rdv = dup(dv, KN);
    two_blocks(emu, q, k, v, g, out, lse, dq, dk, dv);
    two_blocks(cpu, q, k, v, g, ro, rl, rdq, rdk, rdv);
    CHECK_OK(ex_cuda_sync_emu(err));
    struct { const char *name; const float *a, *b; size_t n; } cmp[] = {
        { "out", out, ro, QN }, { "lse", lse, rl, LN }, { "dq (+=)", dq, rdq, QN }, { "dk (+=)", dk, rdk, KN },
        { "dv (+=)", dv, rdv, KN },
    };
    for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
        double e = max_rel_err(cmp[i].a, cmp[i].b, cmp[i].n);
        CHECK_MSG(e < 1e-4, "%s: max rel err %.3g", cmp[i].name, e);
    }
    /* transpose: an exact copy, with a grid-stride loop past the emulated grid cap */
    enum { ROWS = 9, COLS = 4, BLK = 61 };
    float *src = rnd(ROWS * COLS * BLK, 1), *a = rnd(ROWS * COLS * BLK, 1), *b = dup(a, ROWS * COLS * BLK);
    emu->transpose_blocks(a, src, ROWS, COLS, BLK);
    cpu->transpose_blocks(b, src, ROWS, COLS, BLK);
    CHECK_OK(ex_cuda_sync_emu(err));
    CHECK(!memcmp(a, b, sizeof(float) * ROWS * COLS * BLK));
    free(q); free(k); free(v); free(g); free(out); free(lse); free(ro); free(rl);
    free(dq); free(dk); free(dv); free(rdq); free(rdk); free(rdv); free(src); free(a); free(b);
}
