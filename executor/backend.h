/* executor-internal: the kernel interface. The training algorithm
 * (executor/model.c) calls kernels only through an ex_backend table, so a
 * CUDA backend (cuBLAS + own kernels) can replace the CPU one (OpenBLAS +
 * loops, executor/cpu_kernels.c) without touching the algorithm.
 *
 * Conventions for every kernel:
 *  - row-major, token-major tensors: x[n, d] is n rows of d floats;
 *    attention q is [n, H, hd], k/v are [n, Hkv, hd] (the linear outputs).
 *  - every shape argument is a LOCAL shard shape (local heads, local kv heads,
 *    local ffn columns, local rows), so tensor / sequence parallel code calls
 *    the same kernels with a collective between them.
 *  - *_backward kernels ACCUMULATE (+=) into every gradient they produce
 *    (input and parameter gradients, as in llm.c); callers zero buffers.
 *    A NULL gradient pointer means "not needed" (e.g. no bias, frozen input).
 *
 * Memory: every tensor the algorithm uses (parameters, gradients, moments,
 * ZeRO buffers, activations, stage and hand-off buffers, comm staging, and
 * the int32 indices the kernels read: tokens, targets, cu_seqlens, rows) is
 * allocated by the backend's alloc and touched only by its kernels and
 * copies; the host reads or writes one only through d2h / h2d (the loss and
 * grad-norm come back as return values). */
#ifndef DHP_EXECUTOR_BACKEND_H
#define DHP_EXECUTOR_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "util/util.h"

/* Upper bound on head_dim the attention kernels handle (per-row accumulators
 * live on the stack). */
#define EX_MAX_HEAD_DIM 512
/* Key tile of the flash-style attention kernels. */
#define EX_ATT_TILE 64

typedef struct ex_backend {
    const char *name;
    /* true where the backend's memory is host memory (the CPU backend, the
     * kernel tests' CUDA emulator): the MPI communicator may then read and
     * write its buffers directly. False on a GPU and in dhp-emu, which takes
     * a GPU's paths: device buffers over NCCL only. */
    bool host_memory;
    /* bytes zeroed bytes, charged to cat (the util counters the memory report
     * and the planner's exact predictions read); NULL when out of memory
     * (a CUDA failure also lands in the sticky error sync reports). */
    void *(*alloc)(size_t bytes, util_mem_cat cat);
    void (*release)(void *p);                                         /* NULL: nothing */
    /* Host memory the backend copies from without staging (CUDA: page-locked,
     * cudaMallocHost; the CPU: util_malloc); NULL when out of memory. */
    void *(*alloc_host)(size_t bytes);
    void (*release_host)(void *p);
    /* host -> backend, ordered after the kernels before it; from alloc_host
     * memory it may return before the copy is done (CUDA: cudaMemcpyAsync on
     * the compute stream), so such a source stays unchanged until the next sync */
    void (*h2d)(void *dst, const void *src, size_t bytes);
    void (*d2h)(void *dst, const void *src, size_t bytes);            /* backend -> host (after the kernels before it) */
    void (*d2d)(void *dst, const void *src, size_t bytes);            /* backend -> backend */
    void (*fill)(void *p, int byte, size_t bytes);                    /* memset */
    /* Waits for the kernels and reports the first failure since the last
     * call (UTIL_OK, or UTIL_ERUNTIME with err filled). */
    int (*sync)(char *err);
    void (*zero)(float *x, size_t n);
    void (*copy)(float *dst, const float *src, size_t n);
    void (*add_inplace)(float *y, const float *x, size_t n);         /* y += x */
    void (*add_bias)(float *y, const float *b, int n, int d);         /* y[r, :] += b */
    void (*scale_inplace)(float *y, float s, size_t n);              /* y *= s */
    double (*sumsq)(const float *x, size_t n);                       /* sum x^2 */

    void (*linear_forward)(float *out, const float *inp, const float *w, const float *b,
                           int n, int in, int out_dim);
    void (*linear_backward)(float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, int n, int in, int out_dim);
    /* bf16-mixed (executor/precision.c): dst[i] = src[i] rounded to bfloat16
     * (round to nearest, ties to even: executor/bf16.h), and the linears on
     * bf16 operands with fp32 accumulation and fp32 outputs (cublasLtMatmul
     * with CUDA_R_16BF A and B, CUBLAS_COMPUTE_32F). The same shapes and sums as
     * linear_forward / linear_backward; the bias gradient sums the fp32 dout,
     * the GEMMs read its bf16 copy dout16. */
    void (*to_bf16)(uint16_t *dst, const float *src, size_t n);
    /* dst[i] = src[i] widened to fp32 (exact): bf16-mixed ZeRO-3's gathered weights (dp_zero3_bf16.c) */
    void (*from_bf16)(float *dst, const uint16_t *src, size_t n);
    void (*linear_forward_bf16)(float *out, const uint16_t *inp, const uint16_t *w, const float *b,
                                int n, int in, int out_dim);
    void (*linear_backward_bf16)(float *dinp, float *dw, float *db, const float *dout, const uint16_t *dout16,
                                 const uint16_t *inp, const uint16_t *w, int n, int in, int out_dim);
    /* fp32 linears on TF32 tensor cores from now on (on: cuBLASLt's
     * CUBLAS_COMPUTE_32F_FAST_TF32, operands rounded to TF32, executor/tf32.h;
     * off: exact fp32, the default). NULL where the backend has no TF32 mode
     * (the CPU backend: --tf32 refuses it, ex_backend_tf32). */
    void (*set_tf32)(bool on);
    /* the attention entries below in bf16 from now on (on: q, k, v, dout
     * rounded to bf16, products on tensor cores, fp32 statistics and
     * accumulators, executor/cuda_attention16.cuh; off: fp32, the default):
     * bf16-mixed and -autocast (executor/precision.c). NULL where the
     * backend's attention is fp32 only (the CPU backend). */
    void (*set_attention_bf16)(bool on);
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *w,
                            int n, int d, float eps);
    void (*rmsnorm_backward)(float *dinp, float *dw, const float *dout, const float *inp,
                             const float *w, const float *rstd, int n, int d);
    void (*rope_forward)(float *x, const float *cos, const float *sin, int n, int nh, int hd);
    void (*rope_backward)(float *dx, const float *cos, const float *sin, int n, int nh, int hd);
    void (*attention_forward)(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int *cu_seqlens, int nseq,
                              int H, int Hkv, int hd, bool causal);
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const int *cu_seqlens,
                               int nseq, int H, int Hkv, int hd, bool causal);
    /* Ring attention's pieces (executor/ring.c). A block of keys: sequence
     * s's query rows s * stride + q0 .. + nq attend, not causally, to key
     * rows s * stride + k0 .. + nk of k/v (the same row layout of stride
     * rows per sequence); part_forward writes that partial attention and its
     * log-sum-exp into those rows of out and lse (other rows untouched);
     * part_backward accumulates their gradients into dq (the query rows) and
     * dk, dv (the key rows), from the final (merged) out and lse. */
    void (*attention_part_forward)(float *out, float *lse, const float *q, const float *k, const float *v,
                                   int nseq, int stride, int q0, int nq, int k0, int nk, int H, int Hkv, int hd);
    void (*attention_part_backward)(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *out, const float *lse,
                                    int nseq, int stride, int q0, int nq, int k0, int nk, int H, int Hkv, int hd);
    /* Merges a partial attention (part, part_lse) of the same queries over
     * other keys into (out, lse), rows s * stride + q0 .. + nq, every head:
     * lse' = log(e^lse + e^part_lse), out' = out e^(lse - lse') + part e^(part_lse - lse'). */
    void (*attention_merge)(float *out, float *lse, const float *part, const float *part_lse, int nseq,
                            int stride, int q0, int nq, int H, int hd);
    /* dst[c, r, :] = src[r, c, :] for blocks of blk floats: src [rows, cols, blk]
     * -> dst [cols, rows, blk] (the Ulysses all-to-alls' packing). */
    void (*transpose_blocks)(float *dst, const float *src, int rows, int cols, size_t blk);
    void (*swiglu_forward)(float *h, const float *g, const float *u, size_t n);
    void (*swiglu_backward)(float *dg, float *du, const float *dh, const float *g,
                            const float *u, size_t n);
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *dout, const float *inp, size_t n);
    /* CLIP's quick GELU (transformers activations.py QuickGELUActivation):
     * out = x sigmoid(1.702 x); backward dinp += dout s (1 + 1.702 x (1 - s)), s = sigmoid(1.702 x). */
    void (*quick_gelu_forward)(float *out, const float *inp, size_t n);
    void (*quick_gelu_backward)(float *dinp, const float *dout, const float *inp, size_t n);
    /* LayerNorm with bias (torch.nn.LayerNorm): mean[r] = mean_j x[r, j],
     * rstd[r] = 1 / sqrt(mean_j (x[r, j] - mean[r])^2 + eps) (the biased
     * variance; sums in double), out[r, j] = (x[r, j] - mean[r]) rstd[r] w[j] + b[j]. */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int n, int d, float eps);
    /* xhat = (x - mean) rstd, g = dout w:  dw[j] += sum_r dout xhat;  db[j] += sum_r dout;
     * dinp[r, j] += rstd[r] (g[r, j] - mean_k g[r, k] - xhat[r, j] mean_k(g[r, k] xhat[r, k])) */
    void (*layernorm_backward)(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int n, int d);
    /* A 1-D convolution as im2col + linear. x[nx, C] holds frames [x0, x0 + nx)
     * of one sequence (frame-major); output frame t0 + i (i < n) reads input
     * frames s = (t0 + i) stride - pad + j, j < k:
     *   col[i, c k + j] = x[s - x0, c] if x0 <= s < x0 + nx, else 0 (the padding),
     * so col[n, C k] times a torch Conv1d weight [out, C, k] viewed as
     * [out, C k] is the convolution. */
    void (*im2col1d)(float *col, const float *x, int n, int C, int k, int stride, int pad, int t0, int x0,
                     int nx);
    /* Its backward: dx[s - x0, c] += dcol[i, c k + j] over the same (i, j, s). */
    void (*col2im1d)(float *dx, const float *dcol, int n, int C, int k, int stride, int pad, int t0, int x0,
                     int nx);
    /* Average pooling of consecutive rows (torch AvgPool1d(p, stride p) along
     * the rows): out[r, :] = sum_{i < p} inp[r p + i, :] / p, r < m;
     * backward dinp[r p + i, :] += dout[r, :] / p. */
    void (*avgpool_rows_forward)(float *out, const float *inp, int m, int p, int d);
    void (*avgpool_rows_backward)(float *dinp, const float *dout, int m, int p, int d);
    /* Embeddings over a vocabulary shard: wte holds rows [v0, v0 + vn) of the
     * full table; tokens outside it give zero rows (forward) and nothing (backward). */
    void (*embedding_forward)(float *out, const float *wte, const int32_t *tokens, int n, int d,
                              int v0, int vn);
    void (*embedding_backward)(float *dwte, const float *dout, const int32_t *tokens, int n, int d,
                               int v0, int vn);
    /* Rows picked by index, d wide, i < n: gather_rows dst[i, :] = src[rows[i], :];
     * scatter_add_rows dst[rows[i], :] += src[i, :], the rows distinct. One call
     * for a batch's scattered rows (the LLM head's predicting rows, executor/llm.c)
     * rather than a copy or add per row, which on a GPU is a launch per row. */
    void (*gather_rows)(float *dst, const float *src, const int *rows, int n, int d);
    void (*scatter_add_rows)(float *dst, const float *src, const int *rows, int n, int d);
    /* Fused cross-entropy of one whole-vocabulary shard (see cpu_kernels.c). */
    double (*cross_entropy)(float *dlogits, const float *logits, const int32_t *targets,
                            int n, int vocab, float dscale);
    /* Vocab-parallel cross-entropy in three pieces, logits[n, vocab] holding
     * columns [v0, v0 + vocab) of the full vocabulary, with the group's
     * collectives between them (Megatron-LM vocab_parallel_cross_entropy):
     *   ce_row_max:  mx[r] = max_c logits[r, c]                      (then allreduce_max)
     *   ce_exp_sum:  st[r] = sum_c exp(logits[r, c] - mx[r]),
     *                st[n + r] = logits[r, targets[r] - v0] if that column is local, else 0;
     *                if probs != NULL, probs[r, c] = exp(logits[r, c] - mx[r])  (then allreduce_sum of st[2n])
     *   ce_grad:     dlogits[r, c] = dscale * (dlogits[r, c] / st[r] - [c == targets[r] - v0]),
     *                in place over the probs ce_exp_sum wrote.
     * The loss of row r is mx[r] + log(st[r]) - st[n + r]. */
    void (*ce_row_max)(float *mx, const float *logits, int n, int vocab);
    void (*ce_exp_sum)(float *probs, float *st, const float *logits, const float *mx,
                       const int32_t *targets, int n, int vocab, int v0);
    void (*ce_grad)(float *dlogits, const float *st, const int32_t *targets, int n, int vocab,
                    int v0, float dscale);
    void (*adamw)(float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay,
                  float bias_c1, float bias_c2);
} ex_backend;

const ex_backend *ex_backend_cpu(void);

/* Whether be is the CUDA backend's source emulated on the CPU (dhp-emu,
 * tests/cudaemu.h): its kernels are a GPU's, its speed a CPU thread's. */
static inline bool ex_backend_emulated(const ex_backend *be) { return be && be->name && !strcmp(be->name, "cuda-emu"); }

/* Rows between a packed buffer (rows in order) and a permuted one: in
 * consecutive blocks of `block` rows, packed row j of a block is permuted
 * row order[j] of it (order NULL: the same order), n rows of d floats;
 * to_permuted: packed -> permuted, else back. One gather_rows over all n
 * rows through an index list kept on the backend (executor/rows_permuted.c;
 * the encoder -> LLM hand-off's raster order, models/geometry.c). */
void ex_move_permuted_rows(const ex_backend *be, float *packed, float *permuted, size_t n, size_t d,
                           const int *order, size_t block, bool to_permuted);

/* The backend `dhp run --backend` names (executor/backend_pick.c): "cpu",
 * "cuda", or NULL / "auto" for cuda where a device is usable, else cpu.
 * *why gets the one log line saying which and why; NULL with err when
 * "cuda" was asked and no device is usable, or the name is unknown. */
const ex_backend *ex_backend_pick(const char *want, char *why, size_t why_len, char *err);
/* --tf32 (dhp run, dhp profile): be's fp32 linears on TF32 tensor cores (on)
 * or exact fp32; a backend without a TF32 mode (the CPU's) refuses on, in
 * one line, rather than compute exact fp32 under a TF32 name. */
int ex_backend_tf32(const ex_backend *be, bool on, char *err);

/* The CUDA backend (executor/cuda_kernels.cu): the same kernels and
 * conventions on device pointers, cuBLASLt for the linears (executor/cuda_gemm.cuh), own
 * kernels for the rest, launched asynchronously on the current device's
 * default stream; sumsq and cross_entropy wait for their result. NULL, with
 * err saying why, when dhp was built without CUDA (no nvcc) or no device is
 * usable. */
const ex_backend *ex_backend_cuda(char *err);
/* Opens the cuBLASLt library (NULL: the one dhp was built against, which
 * ex_backend_cuda opens on first use rather than at start-up) and resolves
 * the entry points the GEMMs call, into a table of its own: UTIL_OK, or
 * UTIL_ERUNTIME with err naming the library and what is missing
 * (UTIL_EUNSUPPORTED without CUDA). */
int ex_cuda_blas_load(const char *library, char *err);
/* Waits for the device and reports the first failure (a kernel launch, a
 * cuBLAS call, an allocation) since the previous call: UTIL_OK or
 * UTIL_ERUNTIME with err filled. */
int ex_cuda_sync(char *err);
/* The CUDA backend against the CPU backend on the device (executor/cuda_check.c):
 * linear, RMSNorm, SwiGLU, add, LayerNorm, im2col / col2im, row pooling,
 * attention (GQA, two sequences, causal and not), ring attention's pieces and
 * transpose_blocks, cross-entropy, AdamW, sumsq and the gather / scatter-add
 * of rows on the same random inputs; *worst =
 * the largest |cuda - cpu| / max |cpu| over their outputs, `what` its name;
 * and the bf16 attention against the device's fp32 one (a failure past its
 * own tolerance, 2^-5 of the largest value). */
int ex_cuda_check(double *worst, char *what, size_t what_len, char *err);

#endif
