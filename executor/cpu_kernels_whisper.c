/* CPU kernels a Whisper-style encoder adds to the backend (Whisper-large-v3
 * as Qwen2-Audio uses it, huggingface/transformers
 * src/transformers/models/qwen2_audio/modeling_qwen2_audio.py): LayerNorm
 * with bias, the conv stem's im2col / col2im, and average pooling of rows.
 * Shapes and math of each kernel are in executor/backend.h; conventions
 * (row-major, backward accumulates, NULL = not needed) as there. */
#include "executor/cpu_int.h"

#include <math.h>
#include <string.h>

void ex_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                              const float *b, int n, int d, float eps)
{
    for (int r = 0; r < n; r++) {
        const float *x = inp + (size_t)r * d;
        float *y = out + (size_t)r * d;
        double s = 0;
        for (int j = 0; j < d; j++) s += x[j];
        float mu = (float)(s / d);
        double v = 0;
        for (int j = 0; j < d; j++) v += (double)(x[j] - mu) * (x[j] - mu);
        float rs = (float)(1.0 / sqrt(v / d + eps));
        mean[r] = mu;
        rstd[r] = rs;
        for (int j = 0; j < d; j++) y[j] = (x[j] - mu) * rs * w[j] + b[j];
    }
}

void ex_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                               const float *w, const float *mean, const float *rstd, int n, int d)
{
    for (int r = 0; r < n; r++) {
        const float *x = inp + (size_t)r * d, *g = dout + (size_t)r * d;
        float mu = mean[r], rs = rstd[r];
        double sg = 0, sgx = 0;
        for (int j = 0; j < d; j++) {
            double gw = (double)g[j] * w[j];
            sg += gw;
            sgx += gw * ((x[j] - mu) * rs);
        }
        float mg = (float)(sg / d), mgx = (float)(sgx / d);
        for (int j = 0; j < d; j++) {
            float xhat = (x[j] - mu) * rs;
            if (dw) dw[j] += g[j] * xhat;
            if (db) db[j] += g[j];
            if (dinp) dinp[(size_t)r * d + j] += rs * (g[j] * w[j] - mg - xhat * mgx);
        }
    }
}

void ex_cpu_im2col1d(float *col, const float *x, int n, int C, int k, int stride, int pad, int t0, int x0,
                     int nx)
{
    for (int i = 0; i < n; i++) {
        float *row = col + (size_t)i * C * k;
        int s0 = (t0 + i) * stride - pad;
        for (int c = 0; c < C; c++)
            for (int j = 0; j < k; j++) {
                int s = s0 + j - x0;
                row[c * k + j] = s >= 0 && s < nx ? x[(size_t)s * C + c] : 0.0f;
            }
    }
}

/* Gathered per input element (s, c) over the taps j in order, as the CUDA kernel does. */
void ex_cpu_col2im1d(float *dx, const float *dcol, int n, int C, int k, int stride, int pad, int t0, int x0,
                     int nx)
{
    for (int s = 0; s < nx; s++)
        for (int c = 0; c < C; c++) {
            float acc = 0;
            for (int j = 0; j < k; j++) {
                int num = s + x0 + pad - j;   /* (t0 + i) * stride */
                if (num < 0 || num % stride) continue;
                int i = num / stride - t0;
                if (i >= 0 && i < n) acc += dcol[(size_t)i * C * k + c * k + j];
            }
            dx[(size_t)s * C + c] += acc;
        }
}

void ex_cpu_avgpool_rows_forward(float *out, const float *inp, int m, int p, int d)
{
    for (int r = 0; r < m; r++)
        for (int j = 0; j < d; j++) {
            float s = 0;
            for (int i = 0; i < p; i++) s += inp[((size_t)r * p + i) * d + j];
            out[(size_t)r * d + j] = s / (float)p;
        }
}

void ex_cpu_avgpool_rows_backward(float *dinp, const float *dout, int m, int p, int d)
{
    for (int r = 0; r < m; r++)
        for (int i = 0; i < p; i++)
            for (int j = 0; j < d; j++) dinp[((size_t)r * p + i) * d + j] += dout[(size_t)r * d + j] / (float)p;
}
