/* executor-internal: what the CPU backend's files share (cpu_kernels.c, the
 * table and the element-wise kernels; cpu_attention.c, the attention
 * kernels; cpu_kernels_whisper.c, the audio encoder's). */
#ifndef DHP_EXECUTOR_CPU_INT_H
#define DHP_EXECUTOR_CPU_INT_H

#include "executor/backend.h"

/* fn(ctx, lo, hi) over [0, n) in contiguous ranges, one per thread of the
 * pool (at most n / grain threads); see cpu_kernels.c. */
typedef void (*cpu_range_fn)(void *ctx, size_t lo, size_t hi);
void ex_cpu_parallel(size_t n, size_t grain, cpu_range_fn fn, void *ctx);

/* cpu_attention.c: the ex_backend attention entries (see backend.h). */
void ex_cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                              const int *cu, int nseq, int H, int Hkv, int hd, bool causal);
void ex_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                               const float *v, const float *out, const float *lse, const int *cu, int nseq, int H,
                               int Hkv, int hd, bool causal);
void ex_cpu_attention_part_forward(float *out, float *lse, const float *q, const float *k, const float *v, int nseq,
                                   int stride, int q0, int nq, int k0, int nk, int H, int Hkv, int hd);
void ex_cpu_attention_part_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                    const float *k, const float *v, const float *out, const float *lse, int nseq,
                                    int stride, int q0, int nq, int k0, int nk, int H, int Hkv, int hd);
void ex_cpu_attention_merge(float *out, float *lse, const float *part, const float *part_lse, int nseq, int stride,
                            int q0, int nq, int H, int hd);

/* cpu_bf16.c: the bf16-mixed entries (see backend.h). */
void ex_cpu_to_bf16(uint16_t *dst, const float *src, size_t n);
void ex_cpu_from_bf16(float *dst, const uint16_t *src, size_t n);
void ex_cpu_linear_forward_bf16(float *out, const uint16_t *inp, const uint16_t *w, const float *b, int n, int in,
                                int o);
void ex_cpu_linear_backward_bf16(float *dinp, float *dw, float *db, const float *dout, const uint16_t *dout16,
                                 const uint16_t *inp, const uint16_t *w, int n, int in, int o);

/* cpu_kernels_whisper.c: LayerNorm, the conv stem's im2col / col2im and
 * average pooling of rows (a Whisper-style audio encoder). */
void ex_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int n, int d, float eps);
void ex_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int n, int d);
void ex_cpu_im2col1d(float *col, const float *x, int n, int C, int k, int stride, int pad, int t0, int x0,
                     int nx);
void ex_cpu_col2im1d(float *dx, const float *dcol, int n, int C, int k, int stride, int pad, int t0, int x0,
                     int nx);
void ex_cpu_avgpool_rows_forward(float *out, const float *inp, int m, int p, int d);
void ex_cpu_avgpool_rows_backward(float *dinp, const float *dout, int m, int p, int d);

/* cpu_memory.c: the CPU backend's memory entries (util's counting
 * allocator and memcpy / memset; see backend.h). */
void *ex_cpu_alloc(size_t bytes, util_mem_cat cat);
void *ex_cpu_alloc_host(size_t bytes);
void ex_cpu_release(void *p);
void ex_cpu_copy_bytes(void *dst, const void *src, size_t bytes);
void ex_cpu_fill(void *p, int byte, size_t bytes);
int ex_cpu_sync(char *err);

#endif
