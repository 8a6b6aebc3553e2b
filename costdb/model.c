/* costdb cost model: roofline-style compute times and alpha-beta collectives.
 * The derivations of the constants are in costdb/SCHEMA.md. */
#include "costdb/costdb.h"

#include <math.h>
#include <string.h>

/* s(x) = x / (x + gemm_half): fraction of the large-shape rate a GEMM keeps
 * when one of its dimensions is x (tile/wave quantization and the lower
 * arithmetic intensity of a thin dimension, folded into one smooth factor). */
static double shape_factor(double x, double half)
{
    return x / (x + half);
}

double cost_gemm_wave_efficiency(const cost_gpu *g, double m, double n, double k)
{
    double sms = g->sm_count;
    if (!(sms > 0) || !(m > 0 && n > 0 && k > 0)) return 1.0;
    /* tiles of 128 x 128, 256 x 128 and 128 x 256 (the planner asks this for every GEMM it prices:
     * the quotients once) */
    double m1 = ceil(m / 128), m2 = ceil(m / 256), n1 = ceil(n / 128), n2 = ceil(n / 256), split = floor(k / 128);
    const double tiles[3] = { m1 * n1, m2 * n1, m1 * n2 };
    double best = 0;
    for (int i = 0; i < 3; i++) {
        double t = tiles[i];
        if (t < sms) t *= fmax(1.0, fmin(floor(sms / t), split));   /* split-K */
        double e = t / (ceil(t / sms) * sms);
        if (e > best) best = e;
    }
    return best;
}

/* eff(m,n,k) = gemm_eff_max * s(m) * s(n) * s(k) * wave(m,n,k) */
static double formula_efficiency(const cost_gpu *g, double m, double n, double k)
{
    return g->gemm_eff_max * shape_factor(m, g->gemm_half) * shape_factor(n, g->gemm_half)
         * shape_factor(k, g->gemm_half) * cost_gemm_wave_efficiency(g, m, n, k);
}

/* FP8: eff(m,n,k) = gemm_eff_max_fp8 * s(m) * s(n) * s(k), without the
 * bf16 tiles' wave factor: with it, the MAMF FP8 rows of H100 and H200 (one
 * GH100 die) need 0.89 and 1.02 of the peak at their best shapes (1.02 is no
 * efficiency); without, 0.78 and 0.81. Hopper's FP8 GEMMs run other tiles
 * than the three the wave model counts. */
static double fp8_efficiency(const cost_gpu *g, double m, double n, double k)
{
    if (!cost_gpu_has_fp8(g) || !(m > 0 && n > 0 && k > 0)) return 0;
    return g->gemm_eff_max_fp8 * shape_factor(m, g->gemm_half) * shape_factor(n, g->gemm_half)
         * shape_factor(k, g->gemm_half);
}

/* Where x falls on an ascending axis a[0..n), n >= 2, clamped to it:
 * between a[*i] and a[*i + 1] at weight *w (linear in log x). */
static void axis_position(const double *a, int n, double x, int *i, double *w)
{
    if (x <= a[0]) { *i = 0; *w = 0; return; }
    if (x >= a[n - 1]) { *i = n - 2; *w = 1; return; }
    int j = 0;
    while (x > a[j + 1]) j++;
    *i = j;
    *w = log(x / a[j]) / log(a[j + 1] / a[j]);
}

static double clamp_to(const double *a, int n, double x) { return x < a[0] ? a[0] : x > a[n - 1] ? a[n - 1] : x; }

/* Trilinear interpolation of a measured grid G, outside it the edge value
 * scaled by the formula (so thinner or larger shapes than measured follow
 * the fitted shape factors). */
static double grid_efficiency(const cost_gpu *g, const cost_gemm_grid *G, double m, double n, double k)
{
    int i, j, l;
    double wm, wn, wk, e = 0;
    axis_position(G->m, G->n_m, m, &i, &wm);
    axis_position(G->n, G->n_n, n, &j, &wn);
    axis_position(G->k, G->n_k, k, &l, &wk);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 2; c++) {
                double w = (a ? wm : 1 - wm) * (b ? wn : 1 - wn) * (c ? wk : 1 - wk);
                if (w > 0) e += w * G->eff[((i + a) * G->n_n + (j + b)) * G->n_k + (l + c)];
            }
    double cm = clamp_to(G->m, G->n_m, m), cn = clamp_to(G->n, G->n_n, n), ck = clamp_to(G->k, G->n_k, k);
    if (cm == m && cn == n && ck == k) return e;
    return e * formula_efficiency(g, m, n, k) / formula_efficiency(g, cm, cn, ck);
}

/* 0 for an empty GEMM. */
double cost_gemm_efficiency(const cost_gpu *g, double m, double n, double k)
{
    if (!(m > 0 && n > 0 && k > 0)) return 0;
    if (g->grid.n_m > 0) return grid_efficiency(g, &g->grid, m, n, k);
    return formula_efficiency(g, m, n, k);
}

double cost_gemm_efficiency_in(const cost_gpu *g, cost_gemm_math math, double m, double n, double k)
{
    return math == COST_MATH_FP8 ? fp8_efficiency(g, m, n, k) : cost_gemm_efficiency(g, m, n, k);
}

double cost_gemm_peak(const cost_gpu *g, cost_gemm_math math)
{
    if (math == COST_MATH_FP8) return g->peak_flops_fp8;
    double p = math == COST_MATH_FP32 ? g->peak_flops_fp32 : math == COST_MATH_TF32 ? g->peak_flops_tf32 : 0;
    return p > 0 ? p : g->peak_flops;
}

bool cost_gpu_has_fp8(const cost_gpu *g) { return g->peak_flops_fp8 > 0 && g->gemm_eff_max_fp8 > 0; }
bool cost_gpu_has_cudnn_attention(const cost_gpu *g) { return g->attn_cudnn_speedup > 0; }

/* The measured figures that price dhp's own bf16 kernels on g (dhp_bf16:
 * the kernel priced is one, COST_ATTN_BF16 or COST_MATH_BF16_DHP), the one
 * owner of which measured term prices what: the bf16 attention from
 * attn_bf16, the bf16 linear's GEMMs from gemm_bf16, each where the file has
 * it (dhp profile timed that kernel). NULL: none, or another kernel; the
 * caller then prices it by a peak rule (attention_time, cost_gemm_time_in). */
typedef struct { const cost_attn_terms *attn; const cost_gemm_terms *gemm; } measured;
static measured measured_terms(const cost_gpu *g, bool dhp_bf16)
{
    measured m = {NULL, NULL};
    if (dhp_bf16 && g->attn_bf16.measured) m.attn = &g->attn_bf16;
    if (dhp_bf16 && g->gemm_bf16.measured) m.gemm = &g->gemm_bf16;
    return m;
}

/* The burst rates gemm_eff_max and a costdb gemm_grid describe hold the
 * boost clock; back to back, bf16 matmuls draw the board to its power limit
 * and the clock settles lower (gemm_sustained, the GPU file's source). The
 * fp32 (CUDA-core) and TF32 maths have no sustained measurement; dhp
 * profile's gemm_bf16 is its own measurement. */
double cost_gemm_sustained(const cost_gpu *g, cost_gemm_math math)
{
    if (math != COST_MATH_BF16 && math != COST_MATH_BF16_DHP && math != COST_MATH_FP8) return 1.0;
    if (math == COST_MATH_BF16_DHP && measured_terms(g, true).gemm) return 1.0;
    return g->gemm_sustained > 0 ? g->gemm_sustained : 1.0;
}

/* t = 2mnk / (peak * eff(m,n,k) * sustained) + kernel_launch_s, peak =
 * cost_gemm_peak(g, math), eff cost_gemm_efficiency, sustained
 * cost_gemm_sustained (1 for a burst); measured: peak and eff those of its
 * own grid. */
static double gemm_time(const cost_gpu *g, cost_gemm_math math, double m, double n, double k, bool burst)
{
    const cost_gemm_terms *t = measured_terms(g, math == COST_MATH_BF16_DHP).gemm;
    if (t && !(m > 0 && n > 0 && k > 0)) return 0;
    double eff = t ? grid_efficiency(g, &t->grid, m, n, k) : cost_gemm_efficiency_in(g, math, m, n, k);
    if (eff <= 0) return 0;
    double rate = (t ? t->peak_flops : cost_gemm_peak(g, math)) * eff * (burst ? 1.0 : cost_gemm_sustained(g, math));
    return 2.0 * m * n * k / rate + g->kernel_launch_s;
}

double cost_gpu_mfu_peak(const cost_gpu *g)
{
    return g->gemm_bf16.measured ? g->gemm_bf16.peak_flops : g->peak_flops;
}

double cost_gemm_time_in(const cost_gpu *g, cost_gemm_math math, double m, double n, double k)
{
    return gemm_time(g, math, m, n, k, false);
}

double cost_gemm_burst_time_in(const cost_gpu *g, cost_gemm_math math, double m, double n, double k)
{
    return gemm_time(g, math, m, n, k, true);
}

double cost_gemm_burst_time(const cost_gpu *g, double m, double n, double k)
{
    return cost_gemm_burst_time_in(g, COST_MATH_BF16, m, n, k);
}

double cost_gemm_time(const cost_gpu *g, double m, double n, double k)
{
    return cost_gemm_time_in(g, COST_MATH_BF16, m, n, k);
}

double cost_attention_efficiency(const cost_gpu *g, double head_dim)
{
    double hh = g->attn_hd_half;
    if (!(hh > 0) || !(head_dim > 0)) return g->attn_eff;
    return g->attn_eff * (head_dim / (head_dim + hh)) / (128.0 / (128.0 + hh));
}

/* Measured (measured_terms): t = scores * (score_s + F flop_s) + rows * row_s + kernel_launch_s.
 * Otherwise t = scores * (score_s + c) + rows * (row_s + attn_row_scores * c)
 * + kernel_launch_s, c = F / (peak * eff(d)), the matmul price of one score.
 * F = flops per score, 4 d (backward COST_ATTN_BWD_FLOPS times that); the
 * backward's c at attn_bwd_eff of eff(d) and its rows at attn_bwd_row_scores
 * where the file gives them (0: the forward's). */
static double attention_time(const cost_gpu *g, cost_attn_kernel k, bool bwd, double rows, double scores,
                             double head_dim)
{
    double flops_per_score = (bwd ? COST_ATTN_BWD_FLOPS : 1.0) * 4.0 * head_dim;
    if (!(scores > 0) || !(flops_per_score > 0)) return 0;
    /* otherwise the products at a peak (FlashAttention's and an unmeasured
     * bf16 kernel's the bf16 one, dhp's fp32 kernel the fp32 one) x cost_attention_efficiency */
    const cost_attn_terms *m = measured_terms(g, k == COST_ATTN_BF16).attn;
    if (m)
        return scores * ((bwd ? m->bwd_score_s : m->score_s) + flops_per_score * m->flop_s)
             + fmax(rows, 0) * (bwd ? m->bwd_row_s : m->row_s) + g->kernel_launch_s;
    double peak = cost_gemm_peak(g, k == COST_ATTN_FP32 ? COST_MATH_FP32 : COST_MATH_BF16);
    double eff = cost_attention_efficiency(g, head_dim), row_scores = g->attn_row_scores;
    if (bwd && g->attn_bwd_eff > 0) eff *= g->attn_bwd_eff;
    if (bwd && g->attn_bwd_row_scores > 0) row_scores = g->attn_bwd_row_scores;
    if (k == COST_ATTN_CUDNN && cost_gpu_has_cudnn_attention(g)) eff *= g->attn_cudnn_speedup;
    double c = flops_per_score / (peak * eff);
    return scores * ((bwd ? g->attn_bwd_score_s : g->attn_score_s) + c)
         + fmax(rows, 0) * ((bwd ? g->attn_bwd_row_s : g->attn_row_s) + row_scores * c) + g->kernel_launch_s;
}

double cost_attention_forward_time_in(const cost_gpu *g, cost_attn_kernel k, double rows, double scores,
                                      double head_dim)
{
    return attention_time(g, k, false, rows, scores, head_dim);
}

double cost_attention_backward_time_in(const cost_gpu *g, cost_attn_kernel k, double rows, double scores,
                                       double head_dim)
{
    return attention_time(g, k, true, rows, scores, head_dim);
}

double cost_attention_forward_time(const cost_gpu *g, double rows, double scores, double head_dim)
{
    return cost_attention_forward_time_in(g, COST_ATTN_FLASH, rows, scores, head_dim);
}

double cost_attention_backward_time(const cost_gpu *g, double rows, double scores, double head_dim)
{
    return cost_attention_backward_time_in(g, COST_ATTN_FLASH, rows, scores, head_dim);
}

double cost_attention_mean_span(double seq, bool causal) { return causal ? (seq + 1) / 2 : seq; }

/* t = bytes / (hbm_bw * mem_eff) + kernel_launch_s. */
double cost_memory_time(const cost_gpu *g, double bytes)
{
    if (!(bytes > 0)) return 0;
    return bytes / (g->hbm_bw * g->mem_eff) + g->kernel_launch_s;
}

static const struct { const char *name; double accesses; } ew_kernels[COST_N_EW] = {
    [COST_EW_ZERO] = {"zero", 1},               /* write x */
    [COST_EW_COPY] = {"copy", 2},               /* read x, write y */
    [COST_EW_ADD] = {"add", 3},                 /* read x and y, write y */
    [COST_EW_BIAS] = {"bias", 2},               /* read and write y (b stays in cache) */
    [COST_EW_BIAS_GRAD] = {"bias_grad", 1},     /* read dy (db stays in cache) */
    [COST_EW_RMSNORM] = {"rmsnorm", 2},         /* read x, write out */
    [COST_EW_RMSNORM_BWD] = {"rmsnorm_bwd", 4}, /* read dout and x, read and write dinp */
    [COST_EW_ROPE] = {"rope", 2},               /* x in place */
    [COST_EW_ROPE_BWD] = {"rope_bwd", 2},
    [COST_EW_SWIGLU] = {"swiglu", 3},           /* read g and u, write h */
    [COST_EW_SWIGLU_BWD] = {"swiglu_bwd", 7},   /* read dh, g, u, read and write dg, du */
    [COST_EW_GELU] = {"gelu", 2},
    [COST_EW_GELU_BWD] = {"gelu_bwd", 4},       /* read dout and x, read and write dinp */
    [COST_EW_CE] = {"cross_entropy", 5},        /* max: read; exp-sum: read, write p; grad: p in place */
    [COST_EW_SUMSQ] = {"sumsq", 1},             /* read x */
    [COST_EW_ATTN_MERGE] = {"attn_merge", 3},   /* read out and part, write out (the per-row lse aside) */
    [COST_EW_LAYERNORM] = {"layernorm", 2},     /* read x, write out */
    [COST_EW_LAYERNORM_BWD] = {"layernorm_bwd", 4}, /* read dout and x, read and write dinp */
};

double cost_ew_accesses(cost_ew k) { return k >= 0 && k < COST_N_EW ? ew_kernels[k].accesses : 0; }
const char *cost_ew_name(cost_ew k) { return k >= 0 && k < COST_N_EW ? ew_kernels[k].name : NULL; }

/* Kernel k's rate at `bytes` nominal bytes from the table; 0 when it has none. */
static double ew_table_rate(const cost_ew_table *T, cost_ew k, double bytes)
{
    if (T->n == 0) return 0;
    const double *bw = T->bw[k];
    for (int i = 0; i < T->n; i++)
        if (!(bw[i] > 0)) return 0;
    double per = ew_kernels[k].accesses * 4.0;   /* the table's bytes per element (fp32) */
    if (T->n == 1 || bytes <= T->elements[0] * per) return bw[0];
    if (bytes >= T->elements[T->n - 1] * per) return bw[T->n - 1];
    int j = 0;
    while (bytes > T->elements[j + 1] * per) j++;
    double w = log(bytes / (T->elements[j] * per)) / log(T->elements[j + 1] / T->elements[j]);
    return exp((1 - w) * log(bw[j]) + w * log(bw[j + 1]));
}

/* t = elements x accesses x elem_bytes / rate + kernel_launch_s. */
double cost_elementwise_time(const cost_gpu *g, cost_ew k, double elements, double elem_bytes)
{
    if (!(elements > 0) || k < 0 || k >= COST_N_EW) return 0;
    double bytes = elements * ew_kernels[k].accesses * elem_bytes;
    double rate = ew_table_rate(&g->ew, k, bytes);
    /* A table from before LayerNorm was measured: RMSNorm's rate (costdb.h). */
    if (!(rate > 0) && (k == COST_EW_LAYERNORM || k == COST_EW_LAYERNORM_BWD))
        rate = ew_table_rate(&g->ew, k == COST_EW_LAYERNORM ? COST_EW_RMSNORM : COST_EW_RMSNORM_BWD, bytes);
    if (!(rate > 0)) rate = g->hbm_bw * g->mem_eff;
    return bytes / rate + g->kernel_launch_s;
}

/* Ring over k ranks of one tier, S = full buffer (nccl-tests doc/PERFORMANCE.md):
 *   all-reduce      2(k-1) alpha + S/B * 2(k-1)/k
 *   all-gather, reduce-scatter, all-to-all  (k-1) alpha + S/B * (k-1)/k
 *   broadcast       (k-1) alpha + S/B        (pipelined chain, busbw = algbw)
 * k <= 1 costs 0. */
static double ring_time(const cost_link *l, cost_coll op, double bytes, int k)
{
    if (k <= 1) return 0;
    double steps = k - 1, frac = (double)(k - 1) / k;
    switch (op) {
    case COST_ALLREDUCE: return 2 * steps * l->alpha_s + bytes / l->busbw * 2 * frac;
    case COST_ALLGATHER:
    case COST_REDUCESCATTER:
    case COST_ALLTOALL: return steps * l->alpha_s + bytes / l->busbw * frac;
    case COST_BROADCAST: return steps * l->alpha_s + bytes / l->busbw;
    }
    return INFINITY;
}

/* Two-level forms, g = per_node ranks on each of m nodes, S = full buffer:
 *   all-reduce:     intra RS(S) + inter AR(S/g over m) + intra AG(S)
 *   all-gather, reduce-scatter: the bandwidth of inter AG(S/g over m) + intra AG(S),
 *                   the latency of one ring over all n ranks, (n-1) alpha_e
 *   broadcast:      (m-1) alpha_e + (g-1) alpha_i + S / min(B_e, B_i)   (one pipelined chain)
 *   all-to-all:     each rank sends S(g-1)/n over NVLink and S(n-g)/n over its NIC at the
 *                   same time: max of the two + (g-1) alpha_i + (n-g) alpha_e. */
static double hierarchical_time(const cost_pool *p, cost_coll op, double bytes, int n, int g)
{
    int m = n / g;
    const cost_link *in = &p->intra, *ex = &p->inter;
    switch (op) {
    case COST_ALLREDUCE:
        return ring_time(in, COST_REDUCESCATTER, bytes, g) + ring_time(ex, COST_ALLREDUCE, bytes / g, m)
             + ring_time(in, COST_ALLGATHER, bytes, g);
    case COST_ALLGATHER:
    case COST_REDUCESCATTER:
        /* NCCL runs both as one ring through all n ranks (it has no tree
         * for them: NVIDIA/nccl src/graph/tuning.cc, ring latency
         * (nRanks - 1) steps), each step paced by its network hop, so the
         * latency grows with the ranks, not the nodes: (n - 1) alpha_e.
         * The bandwidth terms are the two-level ones (each of a node's NICs
         * carries 1/g of the buffer). */
        return (n - 1) * ex->alpha_s + bytes / g / ex->busbw * (m - 1) / m + bytes / in->busbw * (g - 1) / g;
    case COST_BROADCAST: {
        double bw = (g > 1 && in->busbw < ex->busbw) ? in->busbw : ex->busbw;
        return (m - 1) * ex->alpha_s + (g - 1) * in->alpha_s + bytes / bw;
    }
    case COST_ALLTOALL: {
        double t_in = bytes * (g - 1) / n / in->busbw, t_ex = bytes * (n - g) / n / ex->busbw;
        return (t_in > t_ex ? t_in : t_ex) + (g - 1) * in->alpha_s + (n - g) * ex->alpha_s;
    }
    }
    return INFINITY;
}

double cost_collective_time(const cost_pool *p, cost_coll op, double bytes, int n, int per_node)
{
    if (n <= 1) return 0;
    if (per_node < 1 || n % per_node != 0 || per_node > p->gpus_per_node || n / per_node > p->nodes)
        return INFINITY;
    if (!(bytes > 0)) return 0;
    if (n == per_node) return ring_time(p->has_intra_op[op] ? &p->intra_op[op] : &p->intra, op, bytes, n);
    return hierarchical_time(p, op, bytes, n, per_node);
}

/* t = alpha + bytes / busbw of the link the two GPUs share. */
double cost_p2p_time(const cost_cluster *c, int pool_a, int pool_b, bool same_node, double bytes)
{
    if (pool_a < 0 || pool_b < 0 || pool_a >= c->n_pools || pool_b >= c->n_pools) return INFINITY;
    if (!(bytes > 0)) return 0;
    const cost_link *l;
    if (pool_a != pool_b) l = &c->cross_pool;
    else if (same_node) l = &c->pool[pool_a].intra;
    else l = &c->pool[pool_a].inter;
    return l->alpha_s + bytes / l->busbw;
}

const char *cost_coll_name(cost_coll op)
{
    switch (op) {
    case COST_ALLREDUCE: return "all-reduce";
    case COST_ALLGATHER: return "all-gather";
    case COST_REDUCESCATTER: return "reduce-scatter";
    case COST_ALLTOALL: return "all-to-all";
    case COST_BROADCAST: return "broadcast";
    }
    return "unknown";
}

double cost_share_weight(const cost_pool *p, double interval_s)
{
    if (!(p->handoff_s > 0)) return 1.0;
    return interval_s < p->handoff_s ? interval_s : p->handoff_s;
}

double cost_compute_speed(const cost_pool *p, int busy)
{
    if (p->n_speed <= 0 || busy < 1) return 1.0;
    if (busy <= p->n_speed) return p->speed[busy - 1];
    return p->speed[p->n_speed - 1] * p->n_speed / busy;
}

bool cost_gpu_is_cpu(const cost_gpu *g)
{
    return !strncmp(g->name, COST_CPU_DEVICE_PREFIX, strlen(COST_CPU_DEVICE_PREFIX));
}
