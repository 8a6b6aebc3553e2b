/* The cost model's collectives inside a micro-batch that the model's
 * parallel layout issues (cost.c price_micro calls them): the tensor-parallel
 * regions of the blocks and of the LLM's ends, and Ulysses' all-to-alls;
 * each placed in the node by plan_group_shape. A is the bytes per element
 * the activation collectives move (plan_act_wire_bytes: bf16 under dhp's
 * bf16 runs, as Megatron-LM's); statistics and weight gradients go in fp32. */
#include "planner/planner_int.h"

#include <math.h>

/* One collective of op over module s's group on `axes` (plan_group_shape places it in the node). */
static double group_coll(const cost_pool *pool, const plan_module *s, unsigned axes, cost_coll op, double bytes)
{
    int n, per_node;
    plan_group_shape(s, axes, pool->gpus_per_node, &n, &per_node);
    return cost_collective_time(pool, op, bytes, n, per_node);
}

/* What PyTorch's DTensor tensor parallelism (plan_tp_style dtensor, as
 * torchtitan applies it: torchtitan/models/llama3/parallelize_llama.py
 * apply_tp at 820504e, the commit of benchmarks/asyncTP_llama3_h100_2025-06)
 * adds to each sequence-parallel collective: its activations are [b, s, h]
 * sharded on the sequence dim (SequenceParallel, Shard(1)), and the
 * functional collectives move dim 0, so all_gather_tensor follows each
 * all-gather with torch.cat(torch.chunk(res, group_size, dim=0),
 * dim=gather_dim) and reduce_scatter_tensor precedes each reduce-scatter
 * with torch.cat(torch.chunk(self, group_size, dim=scatter_dim))
 * (torch/distributed/_functional_collectives.py): one copy of the gathered
 * rows, A bytes an element, each. torchtitan PR 437 ("fold batch and
 * sequence dimensions to accelerate Sequence Parallel"): "all-gather and
 * reduce-scatter are performed on dim 1 (sequence dim) instead of dim 0
 * (folded dim), which incurs an extra aten.cat after each collective"; its
 * measurement: the two cats of an FFN took 0.18 ms of its 3 ms at 8k
 * tokens on H100, the copy of 8192 x 8192 bf16 rows at HBM speed. The copy
 * runs on the compute stream between the collective and its consumer, so it
 * is as exposed as the collective and priced with it. Megatron-LM's [s, b, h]
 * gathers along dim 0 and copies nothing. */
static double tp_layout_copy(const cost_pool *pool, const plan_options *o, double A, double elems)
{
    if (o->tp_style != PLAN_TP_DTENSOR) return 0;
    return cost_elementwise_time(&pool->gpu, COST_EW_COPY, elems, A);
}

/* Whether a block's backward gathers its column-parallel inputs again.
 * Megatron-LM saves the sequence-parallel shard and re-gathers it for the
 * weight gradients (LinearWithGradAccumulationAndAsyncCommunication). Under
 * DTensor autograd saves the gathered input the matmul took (or full
 * recomputation re-runs the forward's all-gathers, recompute_comm in
 * cost.c), so nothing is re-gathered; except under torchtitan's per-op
 * checkpointing, whose policy saves mm, attention, reduce_scatter_tensor and
 * max outputs only (_save_list), so the re-run forward issues the two
 * all-gathers again: the same two per block. */
static bool tp_regathers(const plan_module *s, const plan_options *o)
{
    return o->tp_style != PLAN_TP_DTENSOR || s->recompute == PLAN_RECOMP_OP;
}

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
 * What each pair costs beyond its GEMM alone is the collective's exposed
 * time (the GEMMs stay in the block's compute, cost.c). Under FP8 the
 * all-gathers move FP8 (plan_tp_gather_bytes; userbuffers' fp8_buf for the
 * all-gather layers). A GPU file without sm_count: the 132 SMs of an H100 SXM. */
#define UB_SPLITS_PIPELINE 4
#define UB_SMS_PIPELINE 16
#define UB_SMS_BULK 16
#define UB_SMS_DEFAULT 132.0

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
 * ag, rs: the all-gather and reduce-scatter of the block's t rows (ag_fp8:
 * the all-gathers of FP8 buffers). */
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

double plan_tp_gather_bytes(const plan_options *o, double A)
{
    return plan_fp8_props_of(o->fp8)->tp_gathers_fp8 ? 1.0 : A;
}

/* L blocks' sequence-parallel collectives under userbuffers (ub_block), and
 * once per block the norms' partial weight gradients summed, exposed. */
static void tp_overlapped_blocks(const model_module *mm, const plan_module *s, int L, const cost_pool *pool,
                                 const plan_options *o, double A, double t, bool backward, bool weight_grads,
                                 plan_comm *c, plan_comm *fwd)
{
    ub_pricer u = { .g = &pool->gpu, .math = plan_block_gemm_math(o), .tp = s->tp,
                    .sms = pool->gpu.sm_count > 0 ? pool->gpu.sm_count : UB_SMS_DEFAULT };
    plan_gemm_shape lin[PLAN_NLIN];
    plan_block_linear_shapes(mm, s, t, lin);
    double ag = group_coll(pool, s, PLAN_AX_TP, COST_ALLGATHER, plan_tp_gather_bytes(o, A) * t * mm->hidden);
    double rs = group_coll(pool, s, PLAN_AX_TP, COST_REDUCESCATTER, A * t * mm->hidden);
    plan_comm one_fwd = { 0 }, one = { 0 };
    ub_block(&u, lin, ag, rs, backward, weight_grads, &one_fwd, &one);
    fwd->fwd_s += L * one_fwd.fwd_s;
    fwd->fwd_syncs += L * one_fwd.fwd_syncs;
    c->bwd_s += L * one.bwd_s;
    c->bwd_syncs += L * one.bwd_syncs;
    if (backward && weight_grads)
        plan_comm_add(c, true, group_coll(pool, s, PLAN_AX_TP, COST_ALLREDUCE, 4.0 * 2 * mm->hidden), L);
}

/* The tensor-parallel regions of the blocks (executor/block.c): per block,
 * the attention and the MLP each enter (column-parallel) and leave
 * (row-parallel) one. Without sequence parallelism leaving is an all-reduce
 * forward and entering one backward; with it, an all-gather entering and a
 * reduce-scatter leaving forward, and backward an all-gather of the output
 * gradient, an all-gather re-gathering the saved norm rows (tp_regathers), a
 * reduce-scatter of the input gradient, and once per block the norms'
 * partial weight gradients summed; each with its layout copy
 * (tp_layout_copy). t rows per micro-batch. fwd gets the forward's, which
 * full recomputation issues again in backward. */
void plan_price_tp_blocks(const model_module *mm, const plan_module *s, int L, const cost_pool *pool,
                          const plan_options *o, double A, double t, bool backward, bool weight_grads, plan_comm *c,
                          plan_comm *fwd)
{
    if (s->tp <= 1) return;
    double rows = A * t * mm->hidden;
    if (plan_tp_overlaps(mm, s, o)) {
        tp_overlapped_blocks(mm, s, L, pool, o, A, t, backward, weight_grads, c, fwd);
        return;
    }
    if (plan_seqpar_split(mm, s) > 1) {
        double G = plan_tp_gather_bytes(o, A);   /* FP8 under FP8 linears */
        double ag = group_coll(pool, s, PLAN_AX_TP, COST_ALLGATHER, G * t * mm->hidden)
                  + tp_layout_copy(pool, o, G, t * mm->hidden);
        double rs = group_coll(pool, s, PLAN_AX_TP, COST_REDUCESCATTER, rows) + tp_layout_copy(pool, o, A, t * mm->hidden);
        plan_comm_add(fwd, false, ag, 2 * L);
        plan_comm_add(fwd, false, rs, 2 * L);
        if (!backward) return;
        plan_comm_add(c, true, ag, (tp_regathers(s, o) ? 4 : 2) * L);
        plan_comm_add(c, true, rs, 2 * L);
        if (weight_grads) plan_comm_add(c, true, group_coll(pool, s, PLAN_AX_TP, COST_ALLREDUCE, 4.0 * 2 * mm->hidden), L);
        return;
    }
    double ar = group_coll(pool, s, PLAN_AX_TP, COST_ALLREDUCE, rows);
    plan_comm_add(fwd, false, ar, 2 * L);
    if (backward) plan_comm_add(c, true, ar, 2 * L);
}

/* The LLM's ends under tensor parallelism (executor/llm.c): forward, the
 * vocab-parallel embedding's all-reduce of the text rows and the
 * cross-entropy's row maxima and [sum-exp, target logit] (fp32); backward,
 * the head's input gradient. Under sequence parallelism the final hidden
 * rows are all-gathered for the head, and the blocks' input gradient for the
 * embedding's backward. */
void plan_price_tp_llm_ends(const model_module *mm, const plan_module *s, const plan_stage *st, const cost_pool *pool,
                            double A, double t, double text_rows, double head_rows, bool backward, plan_comm *c)
{
    if (s->tp <= 1 || mm->kind != MODEL_LLM) return;
    double h = mm->hidden, ag = group_coll(pool, s, PLAN_AX_TP, COST_ALLGATHER, A * t * h);
    bool seqpar = plan_seqpar_split(mm, s) > 1;
    if (st->stem) {
        plan_comm_add(c, false, group_coll(pool, s, PLAN_AX_TP, COST_ALLREDUCE, A * text_rows * h), 1);
        if (seqpar && backward) plan_comm_add(c, true, ag, 1);
    }
    if (!st->head) return;
    plan_comm_add(c, false, group_coll(pool, s, PLAN_AX_TP, COST_ALLREDUCE, 4.0 * head_rows), 1);
    plan_comm_add(c, false, group_coll(pool, s, PLAN_AX_TP, COST_ALLREDUCE, 4.0 * 2 * head_rows), 1);
    if (backward) plan_comm_add(c, true, group_coll(pool, s, PLAN_AX_TP, COST_ALLREDUCE, A * head_rows * h), 1);
    if (seqpar) plan_comm_add(c, false, ag, 1);
}

/* Ulysses: q, k, v and the output re-sharded forward, one all-to-all each,
 * and their gradients backward, in every layer that crosses ranks. */
void plan_price_ulysses(const model_module *mm, const plan_module *s, const cost_pool *pool, double A, double t,
                        int layers, bool backward, plan_comm *fwd, plan_comm *c)
{
    if (s->sp <= 1) return;
    double q = A * t * mm->heads * mm->head_dim / s->tp, kv = A * t * mm->kv_heads * mm->head_dim / s->tp;
    double aq = group_coll(pool, s, PLAN_AX_SP, COST_ALLTOALL, q), akv = group_coll(pool, s, PLAN_AX_SP, COST_ALLTOALL, kv);
    plan_comm_add(fwd, false, aq, 2 * layers);
    plan_comm_add(fwd, false, akv, 2 * layers);
    if (!backward) return;
    plan_comm_add(c, true, aq, 2 * layers);
    plan_comm_add(c, true, akv, 2 * layers);
}
