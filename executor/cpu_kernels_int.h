/* executor-internal: CPU kernels defined outside cpu_kernels.c, which puts
 * them into the backend table (conventions: executor/backend.h). */
#ifndef DHP_EXECUTOR_CPU_KERNELS_INT_H
#define DHP_EXECUTOR_CPU_KERNELS_INT_H

#include <stddef.h>

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

#endif
