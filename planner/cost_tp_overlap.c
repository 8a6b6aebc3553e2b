/* Tensor-parallel communication overlapped with the blocks' GEMMs
 * (--tp-comm-overlap; plan_tp_overlaps says where): the Megatron target's
 * TransformerEngine userbuffers, and under --tp-style dtensor torchtitan's
 * async TP. What each overlapped pair costs beyond its GEMM alone is the
 * collective's exposed time; the GEMMs stay in the block's compute (cost.c),
 * their shapes from plan_block_linear_shapes. */
#include "planner/planner_int.h"

#include <math.h>

/* TransformerEngine's userbuffers (--tp-comm-overlap; plan_tp_overlaps):
 * each sequence-parallel collective of a block runs beside one of its
 * linears' GEMMs, by the methods of TE's defaults (initialize_ub in
 * transformer_engine/pytorch/module/base.py, get_default_config; the same
 * methods as the H100 presets of NeMo and Megatron-Bridge,
 * megatron/bridge/training/comm_overlap.py):
 * - ring_exchange (qkv_fprop, fc1_fprop: the input's all-gather; proj_dgrad,
 *   fc2_dgrad: the output gradient's): the GEMM in tp chunks of m / tp rows,
 *   each computed while the next chunk arrives from the ring neighbour by
 *   copy engine (num_sm 1): the first chunk's GEMM, then tp - 1 steps of
 *   the slower of a chunk's GEMM and its transfer (the all-gather's time /
 *   (tp - 1));
 * - pipeline (proj_fprop, fc2_fprop: the output's reduce-scatter): the GEMM
 *   in num_splits 4 chunks of rows, each chunk reduce-scattered while the
 *   next is computed, the GEMM launched on sm_count - num_sm SMs
 *   (set_sm_margin; num_sm 16), the last chunk's reduce-scatter after it;
 * - bulk (qkv_dgrad, fc1_dgrad: re-gathering the saved input for the weight
 *   gradient beside the input gradient's GEMM; qkv_wgrad, fc1_wgrad: the
 *   input gradient's reduce-scatter beside the weight gradient's GEMM): the
 *   collective on num_sm 16 SMs the whole time, the GEMM on the rest while
 *   it runs: max(comm, gemm + comm x 16 / sm_count).
 * Under FP8 the all-gathers move FP8 (plan_tp_gather_bytes; userbuffers'
 * fp8_buf for the all-gather layers). A GPU file without sm_count: the 132
 * SMs of an H100 SXM. */
#define UB_SPLITS_PIPELINE 4
#define UB_SMS_PIPELINE 16
#define UB_SMS_BULK 16
#define UB_SMS_DEFAULT 132.0

/* The GPU, the blocks' GEMM math and the tp group an overlap prices on (async TP's too). */
typedef struct {
    const cost_gpu *g;
    cost_gemm_math math;
    double sms;
    int tp;
} ub_pricer;

static double ub_gemm(const ub_pricer *u, double m, double n, double k)
{
    return cost_gemm_time_in(u->g, u->math, m, n, k);
}

/* ring_exchange: an all-gather of `comm` seconds into the GEMM (m, n, k). */
static double ub_ring_exposed(const ub_pricer *u, double m, double n, double k, double comm)
{
    double chunk = ub_gemm(u, m / u->tp, n, k), step = comm / (u->tp - 1);
    return fmax(0.0, chunk + (u->tp - 1) * fmax(chunk, step) - ub_gemm(u, m, n, k));
}

/* pipeline: the GEMM (m, n, k) on the SMs the reduce-scatter leaves, chunk by chunk, then the last chunk's. */
static double ub_pipeline_exposed(const ub_pricer *u, double m, double n, double k, double comm)
{
    int c = UB_SPLITS_PIPELINE;
    double chunk = ub_gemm(u, m / c, n, k) * u->sms / (u->sms - UB_SMS_PIPELINE), piece = comm / c;
    return fmax(0.0, chunk + (c - 1) * fmax(chunk, piece) + piece - ub_gemm(u, m, n, k));
}

/* bulk: a collective on UB_SMS_BULK SMs beside the GEMM (m, n, k). */
static double ub_bulk_exposed(const ub_pricer *u, double m, double n, double k, double comm)
{
    double g = ub_gemm(u, m, n, k);
    return fmax(comm, g + comm * UB_SMS_BULK / u->sms) - g;
}

/* One block's overlapped collectives, priced as ub_*_exposed, into fwd (the
 * forward's, which full recomputation issues again) and c (backward's);
 * ag, rs: the all-gather and reduce-scatter of the block's t rows. */
static void ub_block(const ub_pricer *u, const plan_gemm_shape lin[PLAN_NLIN], double ag, double rs, bool backward,
                     bool weight_grads, plan_comm *fwd, plan_comm *c)
{
    const plan_gemm_shape *qkv = &lin[PLAN_LIN_QKV], *proj = &lin[PLAN_LIN_PROJ], *fc1 = &lin[PLAN_LIN_FC1],
                          *fc2 = &lin[PLAN_LIN_FC2];
    plan_comm_add(fwd, false, ub_ring_exposed(u, qkv->m, qkv->n, qkv->k, ag), 1);
    plan_comm_add(fwd, false, ub_pipeline_exposed(u, proj->m, proj->n, proj->k, rs), 1);
    plan_comm_add(fwd, false, ub_ring_exposed(u, fc1->m, fc1->n, fc1->k, ag), 1);
    plan_comm_add(fwd, false, ub_pipeline_exposed(u, fc2->m, fc2->n, fc2->k, rs), 1);
    if (!backward) return;
    /* input gradients dX[m,k] = dY[m,n] W^T: the GEMM (m, k, n); weight gradients dW = X^T dY: (k, n, m) */
    plan_comm_add(c, true, ub_ring_exposed(u, proj->m, proj->k, proj->n, ag), 1);
    plan_comm_add(c, true, ub_ring_exposed(u, fc2->m, fc2->k, fc2->n, ag), 1);
    plan_comm_add(c, true, ub_bulk_exposed(u, qkv->m, qkv->k, qkv->n, ag), 1);
    plan_comm_add(c, true, ub_bulk_exposed(u, fc1->m, fc1->k, fc1->n, ag), 1);
    if (weight_grads) {
        plan_comm_add(c, true, ub_bulk_exposed(u, qkv->k, qkv->n, qkv->m, rs), 1);
        plan_comm_add(c, true, ub_bulk_exposed(u, fc1->k, fc1->n, fc1->m, rs), 1);
    } else {
        plan_comm_add(c, true, rs, 2);   /* no weight-gradient GEMM to hide them */
    }
}

/* torchtitan's async TP (--tp-comm-overlap under --tp-style dtensor:
 * [parallelism] enable_async_tensor_parallel with torch.compile): Inductor's
 * micro_pipeline_tp pass (torch/_inductor/fx_passes/micro_pipeline_tp.py)
 * replaces
 * - an all-gather whose result is the left operand of matmuls by
 *   fused_all_gather_matmul: the local shard copied into symmetric memory,
 *   then each peer's shard pulled by copy engine while the previous one is
 *   multiplied (_pipelined_all_gather_and_consume; no SMs taken): priced as
 *   ring_exchange (ub_ring_exposed) plus the local shard's copy;
 * - a reduce-scatter of a matmul's output by fused_matmul_reduce_scatter:
 *   each peer's rows multiplied and pushed while the next are
 *   (_pipelined_produce_and_all2all), then the tp partial chunks summed in
 *   one pass (read tp chunks, write one): the ring plus that pass.
 * Forward, the four pairs (the attention and MLP inputs' all-gathers into
 * their projections, the two outputs' reduce-scatters). Backward, the
 * output gradients' all-gathers feed the input-gradient matmuls as their left
 * operand (fused); the input gradients' reduce-scatters take a sum of
 * matmuls (query, key and value; gate and up), not a matmul, and stay
 * exposed with their layout copies, as do per-op checkpointing's
 * re-gathers. Its symmetric-memory workspace: memory.c comm_bytes. */
static double async_rs_exposed(const ub_pricer *u, double A, double m, double n, double k, double comm)
{
    double reduce = cost_elementwise_time(u->g, COST_EW_COPY, m * n * (1.0 + 1.0 / u->tp) / 2, A);
    return ub_ring_exposed(u, m, n, k, comm) + reduce;
}

/* One block's async-TP pairs into fwd and c: ag, rs the collectives;
 * shard_copy the local shard into symmetric memory; rs_exposed an unfused
 * reduce-scatter with its layout copy, regather_s an unfused all-gather. */
static void async_block(const ub_pricer *u, double A, const plan_gemm_shape lin[PLAN_NLIN],
                        double ag, double rs, double shard_copy, double rs_exposed, double regather_s, int regathers,
                        bool backward, plan_comm *fwd, plan_comm *c)
{
    const plan_gemm_shape *qkv = &lin[PLAN_LIN_QKV], *proj = &lin[PLAN_LIN_PROJ], *fc1 = &lin[PLAN_LIN_FC1],
                          *fc2 = &lin[PLAN_LIN_FC2];
    plan_comm_add(fwd, false, ub_ring_exposed(u, qkv->m, qkv->n, qkv->k, ag) + shard_copy, 1);
    plan_comm_add(fwd, false, async_rs_exposed(u, A, proj->m, proj->n, proj->k, rs), 1);
    plan_comm_add(fwd, false, ub_ring_exposed(u, fc1->m, fc1->n, fc1->k, ag) + shard_copy, 1);
    plan_comm_add(fwd, false, async_rs_exposed(u, A, fc2->m, fc2->n, fc2->k, rs), 1);
    if (!backward) return;
    plan_comm_add(c, true, ub_ring_exposed(u, proj->m, proj->k, proj->n, ag) + shard_copy, 1);
    plan_comm_add(c, true, ub_ring_exposed(u, fc2->m, fc2->k, fc2->n, ag) + shard_copy, 1);
    plan_comm_add(c, true, rs_exposed, 2);
    plan_comm_add(c, true, regather_s, regathers);
}

void plan_price_tp_overlap_blocks(const model_module *mm, const plan_module *s, int L, const cost_pool *pool,
                                  const plan_options *o, double A, double t, bool backward, bool weight_grads,
                                  plan_comm *c, plan_comm *fwd)
{
    ub_pricer u = { .g = &pool->gpu, .math = plan_block_gemm_math(o), .tp = s->tp,
                    .sms = pool->gpu.sm_count > 0 ? pool->gpu.sm_count : UB_SMS_DEFAULT };
    plan_gemm_shape lin[PLAN_NLIN];
    plan_block_linear_shapes(mm, s, t, lin);
    double h = mm->hidden, G = plan_tp_gather_bytes(o, A);
    double ag = plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLGATHER, G * t * h);
    double rs = plan_group_coll_s(pool, s, PLAN_AX_TP, COST_REDUCESCATTER, A * t * h);
    plan_comm one_fwd = { 0 }, one = { 0 };
    if (o->tp_style == PLAN_TP_DTENSOR) {
        double shard_copy = cost_elementwise_time(&pool->gpu, COST_EW_COPY, t / s->tp * h, G);
        double rs_exposed = rs + plan_tp_layout_copy_s(pool, o, A, t * h);
        double regather_s = ag + plan_tp_layout_copy_s(pool, o, G, t * h);
        /* per-op checkpointing re-runs the forward's two all-gathers (plan_tp_regathers) */
        int regathers = plan_tp_regathers(s, o) ? 2 : 0;
        async_block(&u, A, lin, ag, rs, shard_copy, rs_exposed, regather_s, regathers, backward, &one_fwd, &one);
    } else {
        ub_block(&u, lin, ag, rs, backward, weight_grads, &one_fwd, &one);
    }
    fwd->fwd_s += L * one_fwd.fwd_s;
    fwd->fwd_syncs += L * one_fwd.fwd_syncs;
    c->bwd_s += L * one.bwd_s;
    c->bwd_syncs += L * one.bwd_syncs;
    if (backward && weight_grads)
        plan_comm_add(c, true, plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLREDUCE, 4.0 * 2 * h), L);
}
