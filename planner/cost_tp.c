/* The cost model's collectives inside a micro-batch that the model's
 * parallel layout issues (cost.c price_micro calls them): the tensor-parallel
 * regions of the blocks and of the LLM's ends, and Ulysses' all-to-alls;
 * each placed in the node by plan_group_shape. A is the bytes per element
 * the activation collectives move (plan_act_wire_bytes: bf16 under dhp's
 * bf16 runs, as Megatron-LM's); statistics and weight gradients go in fp32. */
#include "planner/planner_int.h"

double plan_group_coll_s(const cost_pool *pool, const plan_module *s, unsigned axes, cost_coll op, double bytes)
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
double plan_tp_layout_copy_s(const cost_pool *pool, const plan_options *o, double A, double elems)
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
bool plan_tp_regathers(const plan_module *s, const plan_options *o)
{
    return o->tp_style != PLAN_TP_DTENSOR || s->recompute == PLAN_RECOMP_OP;
}

double plan_tp_gather_bytes(const plan_options *o, double A)
{
    return plan_fp8_props_of(o->fp8)->tp_gathers_fp8 ? 1.0 : A;
}

/* The tensor-parallel regions of the blocks (executor/block.c): per block,
 * the attention and the MLP each enter (column-parallel) and leave
 * (row-parallel) one. Without sequence parallelism leaving is an all-reduce
 * forward and entering one backward; with it, an all-gather entering and a
 * reduce-scatter leaving forward, and backward an all-gather of the output
 * gradient, an all-gather re-gathering the saved norm rows (plan_tp_regathers), a
 * reduce-scatter of the input gradient, and once per block the norms'
 * partial weight gradients summed; each with its layout copy
 * (plan_tp_layout_copy_s). t rows per micro-batch. fwd gets the forward's, which
 * full recomputation issues again in backward. */
void plan_price_tp_blocks(const model_module *mm, const plan_module *s, int L, const cost_pool *pool,
                          const plan_options *o, double A, double t, bool backward, bool weight_grads, plan_comm *c,
                          plan_comm *fwd)
{
    if (s->tp <= 1) return;
    double rows = A * t * mm->hidden;
    if (plan_tp_overlaps(mm, s, o)) {
        plan_price_tp_overlap_blocks(mm, s, L, pool, o, A, t, backward, weight_grads, c, fwd);
        return;
    }
    if (plan_seqpar_split(mm, s) > 1) {
        double G = plan_tp_gather_bytes(o, A);   /* FP8 under FP8 linears */
        double ag = plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLGATHER, G * t * mm->hidden)
                  + plan_tp_layout_copy_s(pool, o, G, t * mm->hidden);
        double rs = plan_group_coll_s(pool, s, PLAN_AX_TP, COST_REDUCESCATTER, rows)
                  + plan_tp_layout_copy_s(pool, o, A, t * mm->hidden);
        plan_comm_add(fwd, false, ag, 2 * L);
        plan_comm_add(fwd, false, rs, 2 * L);
        if (!backward) return;
        plan_comm_add(c, true, ag, (plan_tp_regathers(s, o) ? 4 : 2) * L);
        plan_comm_add(c, true, rs, 2 * L);
        if (weight_grads) plan_comm_add(c, true, plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLREDUCE, 4.0 * 2 * mm->hidden), L);
        return;
    }
    double ar = plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLREDUCE, rows);
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
    double h = mm->hidden, ag = plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLGATHER, A * t * h);
    bool seqpar = plan_seqpar_split(mm, s) > 1;
    if (st->stem) {
        plan_comm_add(c, false, plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLREDUCE, A * text_rows * h), 1);
        if (seqpar && backward) plan_comm_add(c, true, ag, 1);
    }
    if (!st->head) return;
    plan_comm_add(c, false, plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLREDUCE, 4.0 * head_rows), 1);
    plan_comm_add(c, false, plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLREDUCE, 4.0 * 2 * head_rows), 1);
    if (backward) plan_comm_add(c, true, plan_group_coll_s(pool, s, PLAN_AX_TP, COST_ALLREDUCE, A * head_rows * h), 1);
    if (seqpar) plan_comm_add(c, false, ag, 1);
}

/* Ulysses: q, k, v and the output re-sharded forward, one all-to-all each,
 * and their gradients backward, in every layer that crosses ranks. */
void plan_price_ulysses(const model_module *mm, const plan_module *s, const cost_pool *pool, double A, double t,
                        int layers, bool backward, plan_comm *fwd, plan_comm *c)
{
    if (s->sp <= 1) return;
    double q = A * t * mm->heads * mm->head_dim / s->tp, kv = A * t * mm->kv_heads * mm->head_dim / s->tp;
    double aq = plan_group_coll_s(pool, s, PLAN_AX_SP, COST_ALLTOALL, q), akv = plan_group_coll_s(pool, s, PLAN_AX_SP, COST_ALLTOALL, kv);
    plan_comm_add(fwd, false, aq, 2 * layers);
    plan_comm_add(fwd, false, akv, 2 * layers);
    if (!backward) return;
    plan_comm_add(c, true, aq, 2 * layers);
    plan_comm_add(c, true, akv, 2 * layers);
}
