/* costdb: hardware cost databases and cluster descriptions.
 *
 * GPU files (costdb/gpus/<NAME>.json, schema "dhp.gpu/1") give peak BF16
 * FLOP/s, an achieved-GEMM-efficiency model as a function of shape, attention
 * and element-wise efficiency, HBM size and bandwidth, and the memory the
 * runtime reserves. Cluster files (costdb/clusters/<preset>.json, schema
 * "dhp.cluster/1") give pools of nodes and their link tiers. Every number in
 * the JSON carries its source next to it. All times are seconds, all sizes
 * bytes, all rates per second. */
#ifndef DHP_COSTDB_H
#define DHP_COSTDB_H

#include <stdbool.h>
#include <stdint.h>
#include "util/util.h"

#define COST_NAME_LEN 64
#define COST_MAX_POOLS 8
#define COST_GEMM_GRID 8

/* Measured GEMM efficiency on a grid of shapes (dhp profile writes it):
 * eff[(i * n_n + j) * n_k + l] is achieved / peak_flops at (m[i], n[j], k[l]),
 * each axis ascending. n_m == 0: no grid (the shipped files). */
typedef struct {
    int n_m, n_n, n_k;
    double m[COST_GEMM_GRID], n[COST_GEMM_GRID], k[COST_GEMM_GRID];
    double eff[COST_GEMM_GRID * COST_GEMM_GRID * COST_GEMM_GRID];
} cost_gemm_grid;

/* The element-wise kernels the executors run (executor/backend.h), each
 * priced at its own rate where the costdb measured one. On a GPU they are all
 * bound by memory; on a CPU the ones with transcendentals (SwiGLU, GELU, the
 * cross-entropy's exp) are bound by compute and run 10-50x slower per byte
 * than an add, which one element-wise figure cannot say. */
typedef enum {
    COST_EW_ZERO = 0,     /* x = 0 */
    COST_EW_COPY,         /* y = x (embedding rows, hand-offs) */
    COST_EW_ADD,          /* y += x (residuals, embedding gradients) */
    COST_EW_BIAS,         /* y[r, :] += b (a linear's bias; its bias init) */
    COST_EW_BIAS_GRAD,    /* db += column sums of dy (a linear's bias gradient) */
    COST_EW_RMSNORM,      /* forward, per element of the normalised rows */
    COST_EW_RMSNORM_BWD,
    COST_EW_ROPE,         /* per element of q or k */
    COST_EW_ROPE_BWD,
    COST_EW_SWIGLU,       /* per element of the gated output */
    COST_EW_SWIGLU_BWD,
    COST_EW_GELU,
    COST_EW_GELU_BWD,
    COST_EW_CE,           /* per logit: row max, exp-sum and gradient passes together */
    COST_EW_SUMSQ,        /* per gradient element: the global norm's local sum of squares */
    COST_EW_ATTN_MERGE,   /* per output element: ring attention's merge of a partial result by its log-sum-exp */
    COST_EW_LAYERNORM,    /* forward, per element of the normalised rows (mean, variance, bias) */
    COST_EW_LAYERNORM_BWD,
    COST_N_EW
} cost_ew;

#define COST_EW_SIZES 2
/* Measured element-wise rates (dhp profile on a CPU writes them):
 * bw[k][i] is kernel k's rate in its nominal bytes (cost_ew_accesses x 4 B
 * per element) per second at elements[i] elements; bw 0 = not measured.
 * n == 0: no table (the shipped files). */
typedef struct {
    int n;
    double elements[COST_EW_SIZES];
    double bw[COST_N_EW][COST_EW_SIZES];
} cost_ew_table;

/* A measured attention kernel's price: fwd = S (score_s + 4 d flop_s) + R
 * row_s, bwd = S (bwd_score_s + COST_ATTN_BWD_FLOPS x 4 d flop_s) + R
 * bwd_row_s (+ kernel_launch_s each), S scores, R query rows x heads, d the
 * head dim; all seconds, >= 0. measured false: the file has none. */
typedef struct {
    bool measured;
    double flop_s, score_s, bwd_score_s, row_s, bwd_row_s;
} cost_attn_terms;

/* A measured GEMM kernel's price: 2mnk / (peak_flops x eff(m,n,k)) +
 * kernel_launch_s, eff interpolated on its own measured grid as
 * cost_gemm_efficiency does on cost_gpu.grid (outside it, the edge value x
 * the fitted s(m) s(n) s(k) ratio). peak_flops: its best measured rate, so
 * eff is each shape's rate / that. measured false: the file has none. */
typedef struct {
    bool measured;
    double peak_flops;
    cost_gemm_grid grid;
} cost_gemm_terms;

typedef struct {
    char name[COST_NAME_LEN];     /* "H100-SXM-80GB" */
    double peak_flops;            /* dense BF16 tensor-core peak, FLOP/s */
    /* Dense fp32 GEMM peaks, FLOP/s, where the file gives them (0: not given):
     * on the CUDA cores (cuBLAS's default math) and on TF32 tensor cores
     * (CUBLAS_COMPUTE_32F_FAST_TF32, dhp run --tf32); cost_gemm_peak. */
    double peak_flops_fp32, peak_flops_tf32;
    /* Dense FP8 (E4M3 / E5M2 operands, fp32 accumulation) tensor-core peak,
     * FLOP/s, and its large-shape achieved/peak ratio (fitted to the MAMF of
     * an FP8 GEMM, the bf16 gemm_eff_max's counterpart, over the bf16 shape
     * curve s(m) s(n) s(k) without the wave factor: cost_gemm_efficiency_in);
     * 0: the GPU has no FP8 tensor cores (or the file gives none), and
     * COST_MATH_FP8 is not priced on it. */
    double peak_flops_fp8, gemm_eff_max_fp8;
    /* Achieved GEMM efficiency for C[m,n] = A[m,k] B[k,n]:
     *   eff(m,n,k) = gemm_eff_max * s(m) * s(n) * s(k),  s(x) = x / (x + gemm_half)
     * gemm_eff_max is the large-shape achieved/peak ratio (MAMF); gemm_half is
     * the dimension at which a dimension alone halves throughput. */
    double gemm_eff_max;
    double gemm_half;
    /* Sustained over burst: the fraction of the burst rate above (MAMF,
     * timed in short bursts at the boost clock) a GEMM keeps when the GPU
     * runs matmuls back to back, as a training step does, with its clock
     * settled where the board's power limit holds it (MSMF). It prices
     * the GEMMs of the peak rule (cost_gemm_time_in; a dhp profile
     * measurement, gemm_bf16, is its own); 0 = none measured (1). */
    double gemm_sustained;
    double attn_eff;              /* FlashAttention-2 class: achieved/peak on attention FLOPs, head dim 128 */
    /* Head-dim curve of the fused attention kernels: at head dim d the
     * efficiency is attn_eff * r(d) / r(128), r(d) = d / (d + attn_hd_half)
     * (a tile's softmax work does not shrink with d; FlashAttention-3, Shah
     * et al., arXiv 2407.08608, Fig. 5); 0 = no curve. */
    double attn_hd_half;
    /* Seconds per query-key score that do not scale with head_dim (softmax:
     * max, exp, rescale), forward and backward; 0 when the file has none
     * (attn_eff then carries all of it). FlashAttention-3 (Shah et al.,
     * arXiv 2407.08608, sec. 3) shows the exponentials limiting on H100 too. */
    double attn_score_s;
    double attn_bwd_score_s;
    /* Seconds per query row and head that do not scale with the keys it sees
     * (the online softmax's set-up and final normalization, lse; backward
     * dout . out), forward and backward; 0 when the file has none. They
     * matter where rows see few keys: short or causal sequences. */
    double attn_row_s;
    double attn_bwd_row_s;
    /* The same per-row work as a number of scores: each query row and head
     * also pays the price of attn_row_scores scores of its pass and head dim
     * (a row's Q tile load, softmax set-up and final rescale, its output
     * store), so a row seeing s keys runs at s / (s + attn_row_scores) of
     * the long-sequence rate; 0 = no sequence-length curve. */
    double attn_row_scores;
    /* The backward's own shape, where the GPU's file gives it (0: the
     * forward's): its matmul efficiency as a fraction of the forward's
     * (attn_eff x attn_bwd_eff) and its per-row work as a number of its
     * scores (attn_bwd_row_scores). FlashAttention-2's backward keeps less
     * of the peak than its forward, and loses more on short rows. */
    double attn_bwd_eff;
    double attn_bwd_row_scores;
    /* cuDNN's fused attention (TransformerEngine's FusedAttention, sub-backend
     * F16_arbitrary_seqlen, which TE prefers over FlashAttention on Hopper)
     * as a speed-up over this file's FlashAttention-2 curve, forward and
     * backward alike (COST_ATTN_CUDNN); 0 = none measured. */
    double attn_cudnn_speedup;
    /* Optional: dhp's bf16 attention kernel (executor/cuda_attention16.cuh)
     * as measured by dhp profile on a backend that has it: seconds per FLOP
     * of its products, per score (forward, backward) and per row (forward,
     * backward), the attn_* fit's terms without a peak (cost_attn_terms). */
    cost_attn_terms attn_bf16;
    /* Optional: dhp's bf16 linear's GEMMs (linear_forward_bf16: cuBLASLt on
     * CUDA_R_16BF operands, fp32 accumulation, executor/cuda_gemm.cuh) as
     * dhp profile timed them on a device backend (cost_gemm_terms). */
    cost_gemm_terms gemm_bf16;
    double hbm_bytes;             /* device memory */
    double hbm_bw;                /* peak HBM bandwidth, B/s */
    double mem_eff;               /* achieved/peak bandwidth for element-wise kernels */
    double reserved_bytes;        /* CUDA context + library workspaces not available to tensors */
    /* Of reserved_bytes, a training framework's own library workspace
     * (PyTorch's cuBLAS workspace); 0 where reserved_bytes holds none (a
     * profiled device). The Megatron target keeps it in reserved; the dhp
     * target leaves it out, its CUDA backend allocating and counting its
     * own (plan_reserved_bytes, plan_backend_workspace_bytes). */
    double reserved_workspace_bytes;
    double kernel_launch_s;       /* per-kernel fixed overhead */
    /* Streaming multiprocessors; 0 = no wave model (CPU descriptions). A
     * GEMM runs as output tiles spread over the SMs in waves; the last wave
     * leaves SMs idle (cost_gemm_wave_efficiency). */
    double sm_count;
    /* Optional measured efficiencies: inside the grid the GEMM efficiency
     * is interpolated from them (linear in log m, log n, log k); outside,
     * the grid's edge value times the formula's ratio of shape factors. */
    cost_gemm_grid grid;
    /* Optional measured element-wise rates (cost_elementwise_time). */
    cost_ew_table ew;
} cost_gpu;

/* One link tier in the alpha-beta model: a step costs alpha, and a collective
 * moving S bytes of full buffer over n ranks costs S/busbw times the
 * nccl-tests factor (doc/PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather,
 * reduce-scatter and all-to-all (n-1)/n. */
typedef struct {
    double alpha_s;               /* latency per ring step */
    double busbw;                 /* achieved bus bandwidth, B/s */
} cost_link;

#define COST_MAX_SPEED 64
/* Collective kinds with a link of their own (cost_coll: all-reduce ..
 * broadcast). */
#define COST_N_COLL 5

typedef struct {
    char name[COST_NAME_LEN];     /* "h100" */
    cost_gpu gpu;
    int nodes;
    int gpus_per_node;
    cost_link intra;              /* within a node (NVLink / PCIe) */
    cost_link inter;              /* per GPU across nodes (one NIC per GPU) */
    /* Ranks that share a node's processors (dhp profile on a CPU host):
     * speed[k-1] is one rank's compute speed while k of the node's ranks
     * compute at once, relative to one computing alone (the condition the
     * gpu figures were measured in), so speed[0] = 1, all in (0, 1]. n_speed
     * 0: each rank has a device of its own (every GPU pool). */
    int n_speed;
    double speed[COST_MAX_SPEED];
    /* Which ranks of a node share processors: set_of[i] is the lowest local
     * rank of local rank i's set (ranks bound to one core); has_sets false:
     * all of a node's ranks share all its processors. */
    bool has_sets;
    int set_of[COST_MAX_SPEED];
    /* Mean seconds a rank that waited in MPI (polling, yielding the
     * processor) takes to get its processor back from a computing set-mate:
     * the scheduler runs the mate to the end of its time slice. 0: not
     * measured; ranks then share a processor evenly (speed). See
     * cost_share_weight. */
    double handoff_s;
    /* Fraction of a non-blocking collective's time that concurrent compute
     * hides (dhp's ZeRO prefetch and bucketed reductions; dhp profile measures
     * it as the executor issues them); has_overlap false: the planner's
     * plan_options.overlap. */
    bool has_overlap;
    double overlap;
    /* Optional per-collective fits of the intra link (dhp profile measures
     * each): intra_op[op] prices op inside one node where has_intra_op[op];
     * the other operations, and the intra-node steps of multi-node groups,
     * use intra. */
    bool has_intra_op[COST_N_COLL];
    cost_link intra_op[COST_N_COLL];
} cost_pool;

typedef struct {
    char name[COST_NAME_LEN];
    int n_pools;
    cost_pool pool[COST_MAX_POOLS];
    cost_link cross_pool;         /* between pools (per GPU); the slower of their inter links if unset */
} cost_cluster;

typedef enum {
    COST_ALLREDUCE = 0,
    COST_ALLGATHER,
    COST_REDUCESCATTER,
    COST_ALLTOALL,
    COST_BROADCAST
} cost_coll;

/* dhp profile names a CPU it measured COST_CPU_DEVICE_PREFIX + host: a
 * description of the CPU backend's ranks, not of a GPU. */
#define COST_CPU_DEVICE_PREFIX "CPU-"
bool cost_gpu_is_cpu(const cost_gpu *g);

/* Loading. Names are matched case-insensitively against the shipped files. */
int cost_gpu_load(const char *name, cost_gpu *g, char *err);
int cost_gpu_count(void);
const char *cost_gpu_name(int i);
/* A preset name ("8xh100", "2x8xh100", "128x8xh100", "8xa100-80g", "mixed-h100-a100", ...)
 * or a path to a cluster JSON file. */
int cost_cluster_load(const char *name_or_path, cost_cluster *c, char *err);
int cost_cluster_parse_json(const char *text, const char *what, cost_cluster *c, char *err);
int cost_cluster_validate(const cost_cluster *c, char *err);
/* What an unset cross_pool means: the slowest inter link of all pools. */
cost_link cost_cluster_default_cross_pool(const cost_cluster *c);
int cost_preset_count(void);
const char *cost_preset_name(int i);
int cost_cluster_gpus(const cost_cluster *c);
int cost_pool_gpus(const cost_pool *p);
cJSON *cost_cluster_to_json(const cost_cluster *c);
/* A GPU description in the dhp.gpu/1 format (each field a number or
 * {"value": x, "source": "..."}); what names the text in errors. */
int cost_gpu_parse_json(const char *text, const char *what, cost_gpu *g, char *err);
int cost_gpu_validate(const cost_gpu *g, const char *ctx, char *err);
/* The GPU as a dhp.gpu/1 object with plain numbers (sources stay in the shipped file). */
cJSON *cost_gpu_to_json(const cost_gpu *g);
/* Adds G as "gemm_grid" to o (with "source" unless NULL); false when out of memory. */
bool cost_gemm_grid_add(cJSON *o, const cost_gemm_grid *G, const char *source);
/* Adds t as "attn_bf16" ({"flop_s", "score_s", "bwd_score_s", "row_s",
 * "bwd_row_s"}, with "source" unless NULL) to o; false when out of memory. */
bool cost_attn_bf16_add(cJSON *o, const cost_attn_terms *t, const char *source);
/* Adds t as "gemm_bf16" ({"peak_flops", "m", "n", "k", "eff"}, with "source"
 * unless NULL) to o; false when out of memory. */
bool cost_gemm_bf16_add(cJSON *o, const cost_gemm_terms *t, const char *source);

/* FlashAttention-2 backward runs 5 matmuls per tile against 2 forward
 * (Dao, arXiv 2307.08691, sec. 3.1): 2.5x the forward FLOPs. */
#define COST_ATTN_BWD_FLOPS 2.5

/* Keys one query of a sequence of seq tokens attends to, on average: seq, or
 * with a causal mask (row r sees keys 0..r) (seq + 1) / 2. Scores = queries x
 * this x heads, as the kernels compute them. */
double cost_attention_mean_span(double seq, bool causal);

/* Compute. Every kernel also pays g->kernel_launch_s; sizes <= 0 cost 0.
 * cost_gemm_efficiency is the formula above, or the measured grid where the
 * GPU has one (cost_gemm_grid). */
double cost_gemm_efficiency(const cost_gpu *g, double m, double n, double k);
/* The fraction of the SMs' time a GEMM's output tiles keep busy: with T
 * tiles of a cuBLAS/CUTLASS tile shape (128x128, 256x128 or 128x256, the
 * best of them), T / (ceil(T / sm_count) sm_count); a GEMM with fewer tiles
 * than SMs splits k (split-K, slices of at least 128) to fill one wave.
 * NVIDIA Deep Learning Performance Guide, "Matrix Multiplication
 * Background", sections Tile Quantization and Wave Quantization. 1 when the
 * GPU has no sm_count. Part of cost_gemm_efficiency's formula. */
double cost_gemm_wave_efficiency(const cost_gpu *g, double m, double n, double k);
double cost_gemm_time(const cost_gpu *g, double m, double n, double k); /* 2mnk FLOPs */
/* The math a GEMM runs in: bf16 operands on tensor cores, fp32 on the CUDA
 * cores, or fp32 operands read as TF32 by the tensor cores; BF16_DHP is
 * dhp's own bf16 linear (linear_forward_bf16, what dhp run's bf16-mixed and
 * -autocast run), priced from the GPU file's gemm_bf16 where it has one
 * (dhp profile timed that kernel), else as BF16 (costdb/model.c
 * measured_terms, the one owner of that choice). */
typedef enum { COST_MATH_BF16 = 0, COST_MATH_FP32, COST_MATH_TF32, COST_MATH_BF16_DHP, COST_MATH_FP8 } cost_gemm_math;
/* Whether g prices COST_MATH_FP8 (its file gives peak_flops_fp8 and gemm_eff_max_fp8). */
bool cost_gpu_has_fp8(const cost_gpu *g);
/* The peak a GEMM in that math is priced at: peak_flops for bf16, and for
 * fp32 / TF32 the file's peak_flops_fp32 / _tf32, or peak_flops where the
 * file has none (a measured profile: its rate is the fp32 GEMM's); FP8 its
 * peak_flops_fp8 (0 where the GPU has none). */
double cost_gemm_peak(const cost_gpu *g, cost_gemm_math math);
/* The rate a plan's MFU is quoted against: the GPU's dense BF16 peak, as
 * published figures quote it whatever the precision. A profile that timed
 * the bf16 GEMMs (gemm_bf16) derives its own from them; otherwise
 * peak_flops: the datasheet's dense BF16 figure in the shipped files, the
 * fp32 peak of a profile that timed none (a CPU's, whose bf16 linear is
 * sgemm on widened operands). */
double cost_gpu_mfu_peak(const cost_gpu *g);
/* cost_gemm_time at that peak (the same efficiency curve, measured for bf16:
 * assumed for the other maths, as no fp32 / TF32 curve is published; FP8's
 * cost_gemm_efficiency_in);
 * BF16_DHP from gemm_bf16's own peak and grid where the file has it. */
double cost_gemm_time_in(const cost_gpu *g, cost_gemm_math math, double m, double n, double k);
/* The fraction of its burst rate a tensor-core GEMM in `math` keeps in a
 * training step (gemm_sustained, for the bf16 maths and FP8; 1 where the
 * file gives none, for fp32 and TF32, and for a measured gemm_bf16). FP8's
 * is taken as bf16's: the same tensor cores under the same power limit, no
 * FP8 MSMF measurement published. */
double cost_gemm_sustained(const cost_gpu *g, cost_gemm_math math);
/* cost_gemm_time at the burst rate (without cost_gemm_sustained): the GEMM
 * as a short benchmark such as MAMF times it. */
double cost_gemm_burst_time(const cost_gpu *g, double m, double n, double k);
double cost_gemm_burst_time_in(const cost_gpu *g, cost_gemm_math math, double m, double n, double k);
/* The efficiency a GEMM in `math` is priced at: cost_gemm_efficiency, or for
 * FP8 gemm_eff_max_fp8 x s(m) s(n) s(k) (no wave factor, no measured grid;
 * 0 on a GPU without FP8). */
double cost_gemm_efficiency_in(const cost_gpu *g, cost_gemm_math math, double m, double n, double k);
/* Attention of `rows` query rows x heads over `scores` query-key pairs of
 * head_dim d: the forward runs 4 d FLOPs per score, the backward
 * COST_ATTN_BWD_FLOPS times that; each row also pays attn_row_s (backward
 * attn_bwd_row_s) and the price of attn_row_scores scores of its pass. */
/* attn_eff at head dim d, with the GPU's head-dim curve (attn_hd_half). */
double cost_attention_efficiency(const cost_gpu *g, double head_dim);
/* The attention kernel a price is for (the planner's plan_attention_kernel
 * picks it): FlashAttention on bf16 tensor cores (the Megatron target),
 * dhp's bf16 kernel (executor/cuda_attention16.cuh: bf16-mixed, -autocast)
 * or dhp's fp32 kernel (executor/cuda_attention.cuh). */
typedef enum { COST_ATTN_FLASH = 0, COST_ATTN_BF16, COST_ATTN_FP32, COST_ATTN_CUDNN } cost_attn_kernel;
/* Whether g's file prices cuDNN's fused attention (attn_cudnn_speedup). */
bool cost_gpu_has_cudnn_attention(const cost_gpu *g);
/* The price of kernel k on g, the one owner of which figures price it:
 * COST_ATTN_BF16 from g->attn_bf16 where the GPU file has it (dhp profile
 * timed that kernel), else as FLASH; FLASH with the products at
 * cost_gemm_peak(g, COST_MATH_BF16) x cost_attention_efficiency, FP32 at
 * cost_gemm_peak(g, COST_MATH_FP32) x the same, CUDNN as FLASH with that
 * efficiency times attn_cudnn_speedup (FLASH's where the file has none); the
 * plain forms are FLASH's. */
double cost_attention_forward_time_in(const cost_gpu *g, cost_attn_kernel k, double rows, double scores,
                                      double head_dim);
double cost_attention_backward_time_in(const cost_gpu *g, cost_attn_kernel k, double rows, double scores,
                                       double head_dim);
double cost_attention_forward_time(const cost_gpu *g, double rows, double scores, double head_dim);
double cost_attention_backward_time(const cost_gpu *g, double rows, double scores, double head_dim);
double cost_memory_time(const cost_gpu *g, double bytes);   /* element-wise traffic */
/* One call of element-wise kernel k over `elements` elements of elem_bytes
 * each: its nominal bytes (elements x cost_ew_accesses(k) x elem_bytes) at
 * the kernel's measured rate, interpolated between the table's sizes
 * (linear in log bytes and log rate, clamped to the ends), or at hbm_bw x mem_eff where
 * the GPU has none for k; plus kernel_launch_s. A table written before
 * LayerNorm was measured prices it at RMSNorm's rate (the same nominal bytes
 * per element; LayerNorm passes over each row once more, in cache); a GPU
 * file without a table (the shipped ones) at hbm_bw x mem_eff, as every
 * kernel: all bound by memory there. */
double cost_elementwise_time(const cost_gpu *g, cost_ew k, double elements, double elem_bytes);
/* Tensor elements kernel k reads plus writes per element it processes. */
double cost_ew_accesses(cost_ew k);
/* "add", "swiglu_bwd", ...: the key of kernel k in the JSON (NULL outside the enum). */
const char *cost_ew_name(cost_ew k);
/* Adds T as "elementwise" to o (with "source" unless NULL); false when out of memory. */
bool cost_ew_table_add(cJSON *o, const cost_ew_table *T, const char *source);

/* Communication. A group of n ranks placed per_node to a node (n/per_node
 * nodes) of pool p. Inside one node: ring over intra. Across nodes:
 * hierarchical (intra reduce-scatter, inter all-reduce of 1/per_node of the
 * buffer over each GPU's NIC, intra all-gather) for all-reduce, the analogous
 * two-level form for all-gather / reduce-scatter; all-to-all sends the
 * off-node fraction (n - per_node)/n through each GPU's NIC. n == 1 costs 0.
 * An impossible placement (per_node < 1 or not dividing n, more than
 * gpus_per_node per node, more nodes than the pool has) returns INFINITY. */
/* One rank's compute speed on pool p while `busy` of a node's ranks compute
 * (cost_pool.speed; beyond the table the processors are shared evenly);
 * 1 for pools without the table. */
double cost_compute_speed(const cost_pool *p, int busy);
/* The share weight of a rank computing on a processor it shares with
 * set-mates that compute too, when it stops to wait in a blocking exchange
 * every `interval_s` of its compute (INFINITY: never): min(interval_s,
 * handoff_s). Each wait hands the processor to a mate for handoff_s on
 * average and wins it back for about as long, so a rank that waits more
 * often than handoff_s gets interval / (interval + handoff) of the
 * processor against a mate that never waits; two ranks that both wait
 * rarely share evenly. handoff_s 0: weight 1 (even sharing). */
double cost_share_weight(const cost_pool *p, double interval_s);
double cost_collective_time(const cost_pool *p, cost_coll op, double bytes, int n, int per_node);
/* Point-to-point transfer of bytes between two GPUs: same node, across nodes
 * of one pool, or across pools (same_node is ignored then). Bad pool indices
 * return INFINITY. */
double cost_p2p_time(const cost_cluster *c, int pool_a, int pool_b, bool same_node, double bytes);

const char *cost_coll_name(cost_coll op);

/* ---- dhp profile: the measurements (taken by profile/), their fits and files ----
 *
 * profile/ (prof_measure, above the executor) times the backend's GEMMs, its
 * attention and element-wise kernels, STREAM kernels
 * on rank 0 while the other ranks wait (one rank computing alone), then how
 * ranks bound to the same processors slow each other (compute_speed,
 * compute_sets) and, under mpirun, MPI collectives between all the ranks.
 * The results become a dhp.gpu/1 description of one rank
 * (cost_profile_gpu_json) and a one-node dhp.cluster/1 file whose intra link
 * is fitted to the collectives (cost_profile_cluster_json). The
 * derivation rules are in costdb/SCHEMA.md, section "Measured files". */

#define COST_PROFILE_MAX_GEMM 128
#define COST_PROFILE_MAX_ATTN 12
#define COST_PROFILE_MAX_COLL 64

typedef enum {
    COST_PROF_ALLREDUCE = 0,
    COST_PROF_ALLGATHER,
    COST_PROF_REDUCESCATTER,
    COST_PROF_ALLTOALL,
    COST_PROF_SENDRECV,           /* ring exchange: every rank sends S to rank+1 while receiving from rank-1 */
    COST_PROF_MEMCPY,             /* 1 rank: a send/recv to itself is a memcpy of S bytes */
    COST_PROF_NOPS
} cost_prof_op;

typedef struct { int m, n, k; double seconds, rate; } cost_profile_gemm;   /* rate = 2mnk / seconds */
typedef struct {
    int seq, heads, kv_heads, head_dim;
    double fwd_flops;             /* 4 head_dim x scores (cost_attention_mean_span) */
    double fwd_s, bwd_s;          /* per sequence: a timed call's time / seqs */
    bool causal;
    int seqs;                     /* sequences of seq tokens in each timed call */
} cost_profile_attn;
typedef struct { cost_prof_op op; double bytes, seconds; } cost_profile_coll;   /* bytes: full buffer S */
typedef struct { bool valid; double alpha_s, busbw, rms_rel; int points; } cost_profile_fit;

/* How dhp profile measures (profile/), which the files it writes state
 * beside the figures (costdb/profile_json.c). */
#define COST_PROF_GPU_RMSNORM_DIM 5120   /* hidden size of a CUDA profile's norm rows: Qwen2.5-32B's LLM */
#define COST_PROF_GEMM_BATCHES 2         /* timed batches of a GEMM shape per pass */
#define COST_PROF_EW_ROW 768             /* rows of RMSNorm and the bias kernels: dhp-100m's hidden size */
#define COST_PROF_EW_HEADS 8             /* RoPE rows of 8 heads x 64 */
#define COST_PROF_EW_HEAD_DIM 64
#define COST_PROF_EW_VOCAB 1024          /* cross-entropy rows */
#define COST_PROF_SHARING_TRIALS 8       /* windows per rank count of the compute-sharing benchmark */
#define COST_PROF_HANDOFF_WORK_S 100e-6  /* work between the pings of the hand-back benchmark */
#define COST_PROF_HANDOFF_TRIALS 3
#define COST_PROF_OVERLAP_BYTES (64u << 10)   /* the all-gather of the overlap benchmark */
#define COST_PROF_OVERLAP_TRIALS 7

/* The device a CUDA profile measured (rank 0's; all ranks must have the same kind). */
typedef struct {
    char name[COST_NAME_LEN];     /* cudaDeviceProp.name */
    int cc_major, cc_minor, sms, devices;
    double clock_hz;              /* peak SM clock (cudaDevAttrClockRate) */
    double mem_clock_hz;          /* peak memory clock (cudaDevAttrMemoryClockRate) */
    int bus_bits;                 /* cudaDevAttrGlobalMemoryBusWidth */
    double d2d_bw;                /* cudaMemcpy device to device, bytes read + written per second */
    char backend[32];             /* the backend whose kernels were timed (ex_backend.name: "cuda", "cuda-emu") */
    int runtime_version, driver_version, nccl_version;
} cost_profile_device;

typedef struct {
    /* where and how */
    char host[COST_NAME_LEN], date[32];   /* date: UTC, ISO 8601 */
    bool quick;
    bool cuda;                    /* measured on the CUDA backend: device below, no CPU facts */
    cost_profile_device dev;
    int rank, ranks;              /* MPI rank and ranks on this host (0 and 1 without mpirun) */
    bool mpi;                     /* collectives measured through MPI */
    int cpus, blas_threads;       /* online CPUs; OpenBLAS threads per rank */
    double cpu_hz;                /* nominal clock (0 when the OS does not say) */
    /* GEMM (forward layout of the executor: A[m,k] B[n,k]^T) and its fit */
    int n_gemm;
    cost_profile_gemm gemm[COST_PROFILE_MAX_GEMM];
    double gemm_arena_bytes;      /* where the grid's B and C come from (rank 0's) */
    double gemm_rate_max;         /* fitted large-shape rate, FLOP/s per rank */
    double gemm_fit_rms;          /* rms relative error of the fit */
    /* --tf32 (device backends): the same grid's best times with fp32 operands
     * read as TF32, and the fit of peak_flops_tf32 to them */
    bool tf32;
    double gemm_tf32_s[COST_PROFILE_MAX_GEMM];
    double tf32_fit_rms;
    /* on a device backend: the same grid's best times through the backend's
     * linear_forward_bf16 (bf16-mixed's linears), gpu.gemm_bf16's grid */
    bool gemm_bf16;
    double gemm_bf16_s[COST_PROFILE_MAX_GEMM];
    double gemm_bf16_best;        /* the best of their rates, FLOP/s (gpu.gemm_bf16.peak_flops: its rounded peak) */
    double flops_per_cycle;       /* per core, rounded up to a power of two (0 if no clock) */
    double core_share;            /* cores the measuring rank uses: min(blas_threads, cpus) */
    /* attention, memory, element-wise, launch */
    int n_attn;
    cost_profile_attn attn[COST_PROFILE_MAX_ATTN];
    double attn_fit_rms;          /* rms relative error of cost_profile_fit_attention */
    /* on a backend with a bf16 attention (set_attention_bf16): the same
     * shapes' best times with it on, and the rms of their fit (gpu.attn_bf16) */
    bool attn_bf16;
    double attn_bf16_fwd_s[COST_PROFILE_MAX_ATTN], attn_bf16_bwd_s[COST_PROFILE_MAX_ATTN];
    double attn_bf16_fit_rms;
    /* compute sharing between the ranks of this host (see cost_pool.speed) */
    int n_speed;
    double speed[COST_MAX_SPEED];
    double sharing_unit_s;        /* one unit of the mixed kernel on rank 0 alone */
    int n_sets, set_of[COST_MAX_SPEED], bound_cpu[COST_MAX_SPEED];   /* processor sets from the CPU binding */
    /* cost_pool.handoff_s and what it came from: rank 0's mean exchange round
     * trip with a rank of another set while its set-mate computes, and while
     * the mate waits too; 0 where no set holds two ranks or none is outside */
    double handoff_s, handoff_busy_rtt_s, handoff_idle_rtt_s;
    int handoff_mate, handoff_partner, handoff_exchanges;
    /* a non-blocking all-gather beside compute (cost_pool.overlap): its time
     * alone, the compute's, both together, and the fraction hidden */
    double overlap_coll_s, overlap_compute_s, overlap_both_s, overlap;
    bool has_overlap;
    double stream_bytes;          /* size of each STREAM array */
    double copy_bw, scale_bw, add_bw, triad_bw;   /* B/s per rank */
    double ew_add_bw, ew_swiglu_bw, ew_rmsnorm_bw, ew_bw;  /* ew_bw: all three, total bytes / total time */
    /* every element-wise kernel at two sizes (CPU); LayerNorm forward and
     * backward at the STREAM arrays' size, alone (CUDA) */
    cost_ew_table ew;
    double launch_s;              /* one 1x1x1 sgemm call */
    double phys_bytes, used_bytes;        /* host memory; in use at start (MemTotal - MemAvailable) */
    bool used_from_meminfo;       /* false: used_bytes is this process's peak RSS */
    /* collectives */
    int n_coll;
    cost_profile_coll coll[COST_PROFILE_MAX_COLL];
    cost_profile_fit fit[COST_PROF_NOPS];
    cost_profile_fit link;        /* joint fit over all measured operations */
    /* the derived description of one rank */
    cost_gpu gpu;
} cost_profile;

/* Least squares of t_i ~ alpha * a_i + beta * x_i with relative weights
 * 1/t_i^2 (times span decades). a_i counts latency steps, x_i the bytes the
 * bandwidth term moves (nccl-tests factor included). alpha < 0 is refitted
 * with alpha = 0. Fails (UTIL_EINVAL) with fewer than 2 usable points, a
 * singular system or beta <= 0. rms_rel may be NULL. */
int cost_profile_fit_alpha_beta(const double *a, const double *x, const double *t, int n,
                                double *alpha, double *beta, double *rms_rel, char *err);
/* Fits rate_i ~ rate_max * s(m_i) s(n_i) s(k_i), s(x) = x / (x + half) (the
 * cost model's GEMM efficiency), minimising the relative error: rate_max in
 * closed form for each half, half by a log-scale scan of [0, 1e5] refined by
 * golden section. */
/* Attention times (fwd_s, bwd_s of each shape) fitted as
 * fwd = S (score_s + 4 d / (peak attn_eff)) + R row_s, bwd = S (bwd_score_s +
 * 2.5 x 4 d / (peak attn_eff)) + R bwd_row_s, S = seq x
 * cost_attention_mean_span x heads scores (seq^2 heads, causal seq (seq + 1)
 * / 2 heads), R = seq x heads rows, by least squares in relative error;
 * negative terms are pinned at 0 (attn_eff at 1) and the rest refitted; shapes
 * that cannot tell rows from scores (one span) are fitted without row terms.
 * flop_s = 1 / (peak attn_eff), the seconds per FLOP. peak_flops HUGE_VAL:
 * no peak known (the bf16 kernel's tensor cores), flop_s only pinned at >= 0
 * and attn_eff 0. */
typedef struct { double attn_eff, flop_s, score_s, bwd_score_s, row_s, bwd_row_s, rms_rel; } cost_attn_fit;
int cost_profile_fit_attention(const cost_profile_attn *a, int n, double peak_flops, cost_attn_fit *out, char *err);
int cost_profile_fit_gemm(const double *m, const double *n, const double *k, const double *rate,
                          int count, double *rate_max, double *half, double *rms_rel, char *err);
/* The latency steps and bandwidth bytes of op on S bytes over n ranks
 * (all-reduce 2(n-1) and S 2(n-1)/n; all-gather, reduce-scatter, all-to-all
 * n-1 and S (n-1)/n; send/recv and memcpy 1 and S). */
void cost_profile_op_terms(cost_prof_op op, double bytes, int n, double *steps, double *xbytes);
const char *cost_profile_op_name(cost_prof_op op);
/* Score entries one sequence's attention computes (causal: about half), and
 * its forward FLOPs, 4 head_dim x scores (cost_profile_attn.fwd_flops). */
double cost_prof_attn_scores(const cost_profile_attn *a);
double cost_prof_attn_fwd_flops(const cost_profile_attn *a);
/* Alpha-beta fit of the measured operations op (-1: all of them) over ranks. */
void cost_prof_fit_points(const cost_profile *p, int op, int ranks, cost_profile_fit *f);
/* The cost-model fields (p->gpu) from the measurements, either backend. */
int cost_prof_derive(cost_profile *p, char *err);
/* Passes over the GEMM grid and over the element-wise kernels, best of them per shape. */
static inline int cost_prof_gemm_passes(const cost_profile *p) { return p->quick ? 2 : 3; }
static inline int cost_prof_ew_passes(const cost_profile *p) { return p->quick ? 2 : 3; }
/* dhp.gpu/1 object: every field {"value", "source"}; with_measurements adds
 * the raw tables under "measurements" (the loader ignores it). */
cJSON *cost_profile_gpu_json(const cost_profile *p, bool with_measurements);
/* dhp.cluster/1 object "cpu-<ranks>" ("cuda-<ranks>" for a CUDA profile): one pool, 1 node x ranks, the GPU
 * object inline, intra = the joint fit, plus "measurements". */
cJSON *cost_profile_cluster_json(const cost_profile *p);
/* Serialises, checks that the costdb loader accepts the text, writes
 * atomically. Either path may be NULL. */
int cost_profile_write(const cost_profile *p, const char *gpu_path, const char *cluster_path, char *err);

#endif
