/* The price of each data-parallel strategy (plan_dp_rules_of: replicated,
 * ZeRO-1, -2, -3): the collectives it issues inside a micro-batch and once
 * per step, on the module's shard group (dp x sp replicas of each weight).
 *
 * The Megatron target prices them as DeepSpeed and Megatron-LM issue them,
 * one bucketed collective over the module's state (ZeRO, Rajbhandari et al.,
 * arXiv 1910.02054: stage 3 gathers the weights for the forward and again
 * for the backward and reduce-scatters the gradients, every micro-batch;
 * stage 2 reduce-scatters every micro-batch). The dhp target prices what the
 * executor's strategies (executor/dp_*.c) do: one collective per unit of the
 * module (plan_module_tensors), on pieces padded to equal size
 * (plan_dp_buffers_of), with the local copies around them. */
#include "planner/planner_int.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    const cost_pool *pool;
    int G, per_node;
    double param_bytes, grad_bytes;   /* per element as the strategy moves them (grad: plan_state_bytes.reduce) */
    bool dhp;
    int n_units;
    int64_t *units;                   /* elements of each unit on this stage */
    double local;                     /* Megatron: parameters one rank holds of st before sharding */
    plan_z3_unit *z3;                 /* dhp's bf16-mixed ZeRO-3: each unit's two gathers (precision_zero3.c) */
} dp_pricer;

/* The pricer of the units of stage (or model chunk) st. */
static int dp_pricer_init(dp_pricer *d, const model_module *mm, const plan_module *s, const plan_stage *st,
                          const cost_pool *pool, const plan_options *o)
{
    plan_state_bytes b = plan_module_state_bytes(mm, o);
    int size;
    *d = (dp_pricer){ .pool = pool, .param_bytes = b.param, .grad_bytes = b.reduce, .dhp = o->target == PLAN_TARGET_DHP };
    plan_group_shape(s, PLAN_AX_SHARD, pool->gpus_per_node, &size, &d->per_node);
    d->G = size;
    d->local = plan_stage_params(mm, s, st);
    d->n_units = plan_module_units(mm);
    d->units = malloc((size_t)d->n_units * sizeof *d->units);
    if (!d->units) return UTIL_ENOMEM;
    plan_unit_sizes(mm, s->tp, st, d->units);
    if (d->dhp && plan_zero3_bf16(mm, s, o)) {
        d->z3 = malloc((size_t)d->n_units * sizeof *d->z3);
        if (!d->z3 || plan_zero3_bf16_units(mm, s, st, d->G, d->z3)) {
            free(d->z3);
            free(d->units);
            return UTIL_ENOMEM;
        }
    }
    return UTIL_OK;
}

static void dp_pricer_free(dp_pricer *d)
{
    free(d->units);
    free(d->z3);
}

static double piece(const dp_pricer *d, int u) { return ceil((double)d->units[u] / d->G); }

/* One collective of op over the shard group on a unit's padded elements
 * (dhp), or on the whole module's (Megatron), bytes_per elements each. */
static double unit_coll(const dp_pricer *d, cost_coll op, int u, double bytes_per)
{
    return cost_collective_time(d->pool, op, d->G * piece(d, u) * bytes_per, d->G, d->per_node);
}

/* dhp: unit u's weight all-gather (bf16-mixed ZeRO-3: the bf16 words and the packed fp32 elements). */
static void unit_gather(const dp_pricer *d, int u, bool backward, plan_comm *raw)
{
    if (!d->z3) {
        plan_comm_add(raw, backward, unit_coll(d, COST_ALLGATHER, u, d->param_bytes), 1);
        return;
    }
    plan_comm_add(raw, backward, cost_collective_time(d->pool, COST_ALLGATHER, d->G * d->z3[u].half * 4.0, d->G, d->per_node), 1);
    if (d->z3[u].full)
        plan_comm_add(raw, backward, cost_collective_time(d->pool, COST_ALLGATHER, d->G * d->z3[u].full * 4.0, d->G, d->per_node), 1);
}

static double module_coll(const dp_pricer *d, cost_coll op, double bytes_per)
{
    return cost_collective_time(d->pool, op, d->local * bytes_per, d->G, d->per_node);
}

/* ZeRO-3 / FSDP gather each unit (FSDP's wrapped blocks; DeepSpeed's
 * fetch of a submodule's parameters) and reduce-scatter its gradients in a
 * collective of its own: the module's bytes, and each collective's latency,
 * which grows with the ranks (cost_collective_time: (n - 1) ring steps
 * across nodes) and does not hide at 1,000+ ranks. */
static double units_coll(const dp_pricer *d, cost_coll op, double bytes_per)
{
    double t = 0;
    for (int u = 0; u < d->n_units; u++)
        t += cost_collective_time(d->pool, op, (double)d->units[u] * bytes_per, d->G, d->per_node);
    return t;
}

static double ew(const dp_pricer *d, cost_ew k, double n, double bytes)
{
    return n > 0 ? cost_elementwise_time(&d->pool->gpu, k, n, bytes) : 0;
}

/* Every unit's elements copied once, read `from` and written `to` bytes
 * each: one copy kernel per unit (COST_EW_COPY's read and write, at their
 * mean width). The Megatron target's ZeRO-3 around its collectives, on the
 * compute stream, per micro-batch:
 *   - the gradients into the reduce-scatter's flat input, read in the
 *     compute dtype, written in the reduce dtype: FSDP's FlatParameter
 *     gradient is the backward of the split into its parameters' views, a
 *     cat of their gradients (torch/distributed/fsdp/_flat_param.py,
 *     _use_unsharded_views; where the reduce dtype differs, _runtime_utils.py
 *     _post_backward_hook casts it in a second pass, left out, as is the
 *     cast of a bf16-reduced shard back to the parameter's dtype,
 *     _cast_grad_to_param_dtype, 1/G of the unit); FSDP2's
 *     foreach_reduce_scatter_copy_in, a torch.cat into the reduce dtype's
 *     buffer, which the compute stream then waits for
 *     (torch/distributed/_composable/fsdp/_fsdp_collectives.py,
 *     foreach_reduce_scatter: current_stream.wait_event(copy_in_event));
 *     DeepSpeed's contiguous_gradients bucket likewise.
 *   - FSDP2 (PLAN_ZERO3_FSDP2) only: each gathered unit copied out of the
 *     all-gather's rank-major buffer into its parameters
 *     (foreach_all_gather_copy_out, torch.split_with_sizes_copy, on the
 *     compute stream after the gather), read and written in the gather
 *     dtype, at every gather; FSDP1 gathers into the FlatParameter itself. */
static double units_copy(const dp_pricer *d, double from, double to)
{
    double t = 0;
    for (int u = 0; u < d->n_units; u++) t += ew(d, COST_EW_COPY, (double)d->units[u], (from + to) / 2);
    return t;
}

/* The compute slowdown while a collective runs beside it: the collective's
 * kernels hold SMs (NCCL's channels, one thread block each) and HBM
 * bandwidth the GEMMs would use. Lee et al., "Characterizing
 * Compute-Communication Overlap in GPU-Accelerated Distributed Deep
 * Learning: Performance and Power Implications" (arXiv 2507.03114, 2025),
 * measure it on GPT and LLaMA training on A100, H100, MI250 and MI210, and
 * give two averages in the abstract:
 *   - the compute of an overlapped run is 18.9% slower ("an average
 *     computational slowdown of 18.9%, with a maximum of 40.0%") than "the
 *     scenario when no communication was happening with the compute", the
 *     ideal overlap: S = T_comp' / T_comp - 1 = 0.189 of the whole compute
 *     time T_comp, not of the part of it a collective ran beside;
 *   - "performing computation and communication sequentially is, on
 *     average, 10.2% slower than overlapped execution": R = 0.102, with
 *     T_seq = T_comp + T_comm and the overlapped step T_comp' (its
 *     communication hidden).
 * Together they give the communication the slowdown came with,
 * T_comm = ((1 + S)(1 + R) - 1) T_comp = 0.310 T_comp, so the compute
 * loses S / ((1 + S)(1 + R) - 1) = 0.61 s per second of communication it
 * hides (what plan_overlapped_comm_s charges; 0.189 s per hidden second
 * would take the 18.9% for the kernels beside a collective only, which
 * with R = 0.102 leaves the run's compute 2.4% slower, not 18.9%).
 * Averages of ratios combined as ratios: the paper's workloads, not a
 * fit to any published run here. */
#define OVERLAP_SLOWDOWN_OF_COMPUTE 0.189   /* S */
#define OVERLAP_SEQUENTIAL_SLOWER 0.102     /* R */
#define OVERLAP_COMPUTE_SLOWDOWN \
    (OVERLAP_SLOWDOWN_OF_COMPUTE / ((1.0 + OVERLAP_SLOWDOWN_OF_COMPUTE) * (1.0 + OVERLAP_SEQUENTIAL_SLOWER) - 1.0))

/* Seconds a collective of `comm` seconds adds to a pass whose compute can
 * hide up to `hideable` seconds of it: the part it does not hide, and, with
 * `contention`, the slowdown of the compute that ran beside the part it
 * hid: OVERLAP_COMPUTE_SLOWDOWN seconds per second hidden. The Megatron
 * target's published runs pay the contention; the dhp target's overlap
 * is dhp profile's measurement on the pool (or the same allowance), which
 * the drift guard pins. */
double plan_overlapped_comm_s(double comm, double hideable, bool contention)
{
    double hidden = fmin(fmax(comm, 0.0), fmax(hideable, 0.0));
    return fmax(0.0, comm - hideable) + (contention ? OVERLAP_COMPUTE_SLOWDOWN * hidden : 0.0);
}

void plan_price_dp_micro(const model_module *mm, const plan_module *s, const plan_stage *st, const cost_pool *pool,
                         const plan_options *o, bool backward, double fwd_compute, double bwd_compute, plan_comm *comm,
                         double *fwd_busy, double *bwd_busy)
{
    plan_dp_rules r = plan_dp_rules_of(mm, s);
    *fwd_busy = *bwd_busy = 0;
    if (!r.unit_param_gather && !r.unit_grad_reduce) return;
    dp_pricer d;
    if (dp_pricer_init(&d, mm, s, st, pool, o)) return;
    bool reduce = r.unit_grad_reduce && backward;
    bool gather_back = r.unit_param_gather && backward;
    plan_comm raw = { 0 };
    if (d.dhp) {
        for (int u = 0; u < d.n_units; u++) {
            if (r.unit_param_gather) unit_gather(&d, u, false, &raw);
            if (gather_back) unit_gather(&d, u, true, &raw);
            if (!reduce) continue;
            plan_comm_add(&raw, true, unit_coll(&d, COST_REDUCESCATTER, u, d.grad_bytes), 1);
            /* the bucket zeroed before the unit's backward, its reduced piece added to the shard */
            *bwd_busy += ew(&d, COST_EW_ZERO, d.G * piece(&d, u), d.grad_bytes) + ew(&d, COST_EW_ADD, piece(&d, u), d.grad_bytes);
        }
    } else if (plan_zero3_deepspeed_applies(mm, s, o)) {
        if (plan_zero3_deepspeed_2021(mm, s, pool, o, r.unit_param_gather, gather_back, reduce, &raw)) raw = (plan_comm){ 0 };
    } else {
        int U = plan_module_units(mm);
        /* FSDP gathers the weights in the compute dtype: MixedPrecision's
         * param_dtype casts each shard before the all-gather (PyTorch FSDP,
         * torch.distributed.fsdp.MixedPrecision; FSDP2's MixedPrecisionPolicy
         * likewise), so bf16 even where fp32 weights are kept (bf16-autocast) */
        double gather = plan_module_state_bytes(mm, o).act;
        bool copy_out = o->zero3 == PLAN_ZERO3_FSDP2;
        if (r.unit_param_gather) {
            raw.fwd_s = units_coll(&d, COST_ALLGATHER, gather);
            raw.fwd_syncs = U;
            if (copy_out) *fwd_busy += units_copy(&d, gather, gather);
        }
        if (gather_back) {
            raw.bwd_s += units_coll(&d, COST_ALLGATHER, gather);
            raw.bwd_syncs += U;
            if (copy_out) *bwd_busy += units_copy(&d, gather, gather);
        }
        if (reduce) {
            raw.bwd_s += units_coll(&d, COST_REDUCESCATTER, d.grad_bytes);
            raw.bwd_syncs += U;
            if (r.stage == 3) *bwd_busy += units_copy(&d, gather, d.grad_bytes);
        }
    }
    dp_pricer_free(&d);
    /* Prefetched gathers and bucketed reductions run beside the compute: as
     * much as the pool measures for dhp's executor (dhp profile), else the
     * planner's allowance. */
    double overlap = d.dhp && pool->has_overlap ? pool->overlap : o->overlap;
    if (plan_zero3_deepspeed_applies(mm, s, o)) overlap = 0;   /* cost_zero3.c */
    comm->fwd_s += plan_overlapped_comm_s(raw.fwd_s, overlap * fwd_compute, !d.dhp);
    comm->bwd_s += plan_overlapped_comm_s(raw.bwd_s, overlap * bwd_compute, !d.dhp);
    comm->fwd_syncs += raw.fwd_syncs;
    comm->bwd_syncs += raw.bwd_syncs;
}

/* Work w (seconds alone) started at `start`, running beside the compute
 * until `until` at `overlap` of its speed (the fraction the pool measures a
 * collective keeps beside compute), alone after it: when it ends. */
static double finish_at(double start, double w, double until, double overlap)
{
    if (start >= until || w <= 0) return start + fmax(w, 0.0);
    double beside = (until - start) * overlap;
    if (beside >= w) return start + w / overlap;
    return until + (w - beside);
}

/* dhp: what is left of the step's gradient reduction (replicated DP or
 * ZeRO-1, one collective per unit) when the last micro-batch's backward
 * ends, as executor/dp_overlap.c runs it: units finish in backward order
 * (the head first, the stem last), each after its share of the stage's
 * backward (bwd_s: its parameters' share; a linear layer's backward costs
 * 4 flops per parameter and token); a unit's collective is posted when its
 * backward ends and runs after the previous one (one communicator, issue
 * order); replicated posts need no buffer, ZeRO-1's one staging slot makes
 * each post wait for the previous collective (the compute stalls). The
 * first collective cannot start before the first unit's backward ends and
 * the last one (the stem's) runs after the backward. The unit holding a
 * pipeline stage's copy of a tied embedding (`deferred`: the stem on the
 * first stage, the head on the last; EMBED_SYNC adds into it first) is
 * reduced in GRAD_SYNC, after everything. c[u]: unit u's collective, 0 for
 * units not on the stage. */
static double reduction_exposed(const dp_pricer *d, const double *c, double bwd_s, bool one_slot, int deferred,
                                double overlap)
{
    double total = 0;
    for (int u = 0; u < d->n_units; u++) total += (double)d->units[u];
    if (total <= 0) return 0;
    double t = 0, end = 0, stall = 0, pending = 0;   /* compute clock, last collective's end; ZeRO-1's unit in flight */
    for (int u = d->n_units - 1; u >= 0; u--) {
        if (d->units[u] <= 0) continue;
        double b = bwd_s * (double)d->units[u] / total;
        bool post = u != deferred;
        if (one_slot) {
            double done = finish_at(t, pending, t + b, overlap);   /* the previous unit's, beside this backward */
            t += b;
            if (post && done > t) { stall += done - t; t = done; }
            if (post) pending = c[u];
            else stall += fmax(0.0, done - t), pending = 0;
        } else {
            t += b;
            if (post) end = finish_at(fmax(t, end), c[u], bwd_s, overlap);
        }
    }
    double rest = one_slot ? stall + pending : fmax(0.0, end - t);
    return rest + (deferred >= 0 && d->units[deferred] > 0 ? c[deferred] : 0);
}

void plan_price_dp_step(const model_module *mm, const plan_module *s, int stage, const cost_pool *pool,
                        const plan_options *o, double bwd_window_s, plan_time *out)
{
    plan_dp_rules r = plan_dp_rules_of(mm, s);
    out->grad_sync_s = out->grad_sync_busy_s = out->param_gather_s = out->param_gather_busy_s = 0;
    /* DeepSpeed's persistent parameters, gathered once after the step (cost_zero3.c); the
     * closed form lets the last backward hide it like the others: one small collective */
    if (plan_zero3_deepspeed_applies(mm, s, o))
        out->param_gather_s = plan_zero3_persistent_gather_s(mm, s, pool, o);
    if (!r.step_grad_sync && !r.step_param_gather) return;
    dp_pricer d;
    plan_stage st = plan_stage_of(mm, s, stage);
    if (dp_pricer_init(&d, mm, s, &st, pool, o)) return;
    if (!d.dhp) {
        if (r.step_grad_sync)
            out->grad_sync_s = module_coll(&d, r.stage == 0 ? COST_ALLREDUCE : COST_REDUCESCATTER, d.grad_bytes);
        if (r.step_param_gather) out->param_gather_s = module_coll(&d, COST_ALLGATHER, d.param_bytes);
        dp_pricer_free(&d);
        return;
    }
    double *c = calloc((size_t)d.n_units, sizeof *c);
    if (!c) { dp_pricer_free(&d); return; }
    for (int u = 0; u < d.n_units; u++) {
        double n = (double)d.units[u], mine = piece(&d, u);   /* the busiest rank's piece */
        if (r.step_grad_sync && r.stage == 0 && n > 0)
            c[u] = cost_collective_time(pool, COST_ALLREDUCE, n * d.grad_bytes, d.G, d.per_node);
        if (r.step_grad_sync && r.stage == 1 && n > 0) {
            /* the unit's gradient into the padded staging buffer, reduce-scatter, this rank's piece back */
            c[u] = unit_coll(&d, COST_REDUCESCATTER, u, d.grad_bytes);
            out->grad_sync_busy_s += ew(&d, COST_EW_COPY, n, d.grad_bytes) + ew(&d, COST_EW_ZERO, d.G * piece(&d, u) - n, d.grad_bytes)
                                   + ew(&d, COST_EW_COPY, mine, d.grad_bytes);
        }
        if (r.step_param_gather) {
            /* this rank's updated piece out, all-gather, the unit's weights back */
            out->param_gather_s += unit_coll(&d, COST_ALLGATHER, u, d.param_bytes);
            out->param_gather_busy_s += ew(&d, COST_EW_COPY, mine, d.param_bytes) + ew(&d, COST_EW_COPY, n, d.param_bytes);
        }
    }
    if (r.step_grad_sync) {
        double overlap = pool->has_overlap ? pool->overlap : o->overlap;
        int deferred = !r.step_embed_sync ? -1 : st.stem ? 0 : st.head ? d.n_units - 1 : -1;
        out->grad_sync_s = reduction_exposed(&d, c, fmax(0.0, bwd_window_s), r.stage == 1, deferred, overlap);
    }
    free(c);
    dp_pricer_free(&d);
}

double plan_embed_sync_s(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o,
                         int per_node)
{
    plan_dp_rules r = plan_dp_rules_of(mm, s);
    if (!r.step_embed_sync) return 0;
    int64_t *units = malloc((size_t)plan_module_units(mm) * sizeof *units);
    if (!units) return 0;
    plan_stage first = plan_stage_of(mm, s, 0);
    plan_unit_sizes(mm, s->tp, &first, units);
    double elems = (double)units[0];   /* unit 0: the stem, the embedding alone */
    free(units);
    return cost_collective_time(pool, COST_ALLREDUCE, elems * plan_module_state_bytes(mm, o).reduce, 2, per_node);
}
