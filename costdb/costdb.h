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
#include "util/util.h"

#define COST_NAME_LEN 64
#define COST_MAX_POOLS 8

typedef struct {
    char name[COST_NAME_LEN];     /* "H100-SXM-80GB" */
    double peak_flops;            /* dense BF16 tensor-core peak, FLOP/s */
    /* Achieved GEMM efficiency for C[m,n] = A[m,k] B[k,n]:
     *   eff(m,n,k) = gemm_eff_max * s(m) * s(n) * s(k),  s(x) = x / (x + gemm_half)
     * gemm_eff_max is the large-shape achieved/peak ratio (MAMF); gemm_half is
     * the dimension at which a dimension alone halves throughput. */
    double gemm_eff_max;
    double gemm_half;
    double attn_eff;              /* FlashAttention-2 class: achieved/peak on attention FLOPs */
    double hbm_bytes;             /* device memory */
    double hbm_bw;                /* peak HBM bandwidth, B/s */
    double mem_eff;               /* achieved/peak bandwidth for element-wise kernels */
    double reserved_bytes;        /* CUDA context + library workspaces not available to tensors */
    double kernel_launch_s;       /* per-kernel fixed overhead */
} cost_gpu;

/* One link tier in the alpha-beta model: a step costs alpha, and a collective
 * moving S bytes of full buffer over n ranks costs S/busbw times the
 * nccl-tests factor (doc/PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather,
 * reduce-scatter and all-to-all (n-1)/n. */
typedef struct {
    double alpha_s;               /* latency per ring step */
    double busbw;                 /* achieved bus bandwidth, B/s */
} cost_link;

typedef struct {
    char name[COST_NAME_LEN];     /* "h100" */
    cost_gpu gpu;
    int nodes;
    int gpus_per_node;
    cost_link intra;              /* within a node (NVLink / PCIe) */
    cost_link inter;              /* per GPU across nodes (one NIC per GPU) */
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

/* Loading. Names are matched case-insensitively against the shipped files. */
int cost_gpu_load(const char *name, cost_gpu *g, char *err);
int cost_gpu_count(void);
const char *cost_gpu_name(int i);
/* A preset name ("8xh100", "2x8xh100", "128x8xh100", "8xa100-80g", "mixed-h100-a100", ...)
 * or a path to a cluster JSON file. */
int cost_cluster_load(const char *name_or_path, cost_cluster *c, char *err);
int cost_cluster_parse_json(const char *text, const char *what, cost_cluster *c, char *err);
int cost_cluster_validate(const cost_cluster *c, char *err);
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

/* Compute. Every kernel also pays g->kernel_launch_s; sizes <= 0 cost 0. */
double cost_gemm_efficiency(const cost_gpu *g, double m, double n, double k);
double cost_gemm_time(const cost_gpu *g, double m, double n, double k); /* 2mnk FLOPs */
double cost_attention_time(const cost_gpu *g, double flops);
double cost_memory_time(const cost_gpu *g, double bytes);   /* element-wise traffic */

/* Communication. A group of n ranks placed per_node to a node (n/per_node
 * nodes) of pool p. Inside one node: ring over intra. Across nodes:
 * hierarchical (intra reduce-scatter, inter all-reduce of 1/per_node of the
 * buffer over each GPU's NIC, intra all-gather) for all-reduce, the analogous
 * two-level form for all-gather / reduce-scatter; all-to-all sends the
 * off-node fraction (n - per_node)/n through each GPU's NIC. n == 1 costs 0.
 * An impossible placement (per_node < 1 or not dividing n, more than
 * gpus_per_node per node, more nodes than the pool has) returns INFINITY. */
double cost_collective_time(const cost_pool *p, cost_coll op, double bytes, int n, int per_node);
/* Point-to-point transfer of bytes between two GPUs: same node, across nodes
 * of one pool, or across pools (same_node is ignored then). Bad pool indices
 * return INFINITY. */
double cost_p2p_time(const cost_cluster *c, int pool_a, int pool_b, bool same_node, double bytes);

const char *cost_coll_name(cost_coll op);

#endif
