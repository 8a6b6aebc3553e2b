/* ZeRO-3 as DeepSpeed issued it in 2021 (plan_options.zero3 =
 * PLAN_ZERO3_DEEPSPEED_2021), the Megatron target's alternative to one
 * bucketed collective per unit (cost_dp.c). DeepSpeed v0.3.13 to v0.4.0
 * (March to June 2021; Narayanan et al.'s ZeRO-3 runs, arXiv 2104.04473 of
 * April 2021, are of that time), deepspeed/runtime/zero/partition_parameters.py:
 *
 * - `_allgather_param`: one torch.distributed.all_gather per parameter
 *   tensor, into a flat buffer made by torch.zeros of the padded size, after
 *   torch.cuda.synchronize(): the device is drained before every gather, so
 *   no gather runs beside the compute or beside another collective (the
 *   backward's gradient all-reduces, on their own stream, are drained too).
 * - PyTorch's ProcessGroupNCCL of the time (torch/lib/c10d/ProcessGroupNCCL.cpp,
 *   allgather) takes the list form DeepSpeed passes: after ncclAllGather it
 *   copies the flat output into each of the n output tensors: n copy kernels
 *   of one piece per gather, each at least a kernel launch (costdb
 *   kernel_launch_s), which at 1,000+ ranks costs as much as the ring's
 *   (n - 1) steps.
 * - The gradients are all-reduced, not reduce-scattered: stage 3's
 *   contiguous_gradients defaults to false (ZERO3_OPTIMIZATION_CONTIGUOUS_
 *   GRADIENTS_DEFAULT, deepspeed/runtime/zero/constants.py, v0.3.13 to
 *   v0.4.0), and stage3.py reduce_ipg_grads then takes
 *   buffered_reduce_fallback, not average_tensor (whose per-parameter
 *   reduce_scatter, reduce_gradients_at_owner, runs only with contiguous
 *   gradients; v0.3.16's reduce_scatter default false makes even that an
 *   all-reduce). reduce_independent_p_g_buckets_and_remove_grads adds each
 *   gradient, as its hook fires in the backward, to a bucket, reducing the
 *   bucket first when the gradient would take it past reduce_bucket_size
 *   (5e8 elements, ZERO_OPTIMIZATION_REDUCE_BUCKET_SIZE_DEFAULT), and the
 *   backward's epilogue reduces the last one; allreduce_and_copy then
 *   flattens the bucket (torch._utils._flatten_dense_tensors: a torch.cat
 *   copy, a view when the bucket holds one tensor), divides it by the ranks
 *   in place (div_), all-reduces it in the gradient's dtype (param.grad;
 *   allreduce_always_fp32 false) and copies each gradient back out of it (on
 *   a one-tensor bucket a copy of the tensor onto itself, which ATen's
 *   copy_ returns early from: "Exit early if self and src are views of the
 *   same data", aten/src/ATen/native/Copy.cpp). partition_previous_reduced_
 *   grads then copies each parameter's own partition of the reduced gradient
 *   into its shard (partition_parameters.py _partition_gradient: one copy of
 *   the piece).
 *
 * - deepspeed/runtime/zero/stage3.py fetch_sub_module issues a submodule's
 *   gathers with async_op and prefetch_next_sub_modules the next ones
 *   (prefetch_bucket_size, 5e7 elements), but each _allgather_param above
 *   first synchronizes the device, and fetch_sub_module waits for all of
 *   them (_synchronize_communication: comm_stream.synchronize() and
 *   torch.cuda.synchronize()) before the submodule runs: at most the last
 *   prefetched gather of a bucket could run beside a submodule's compute,
 *   which this model leaves out (every gather priced unhidden).
 * - stage3_max_reuse_distance (default 1e9 elements, constants.py): when a
 *   submodule finishes (release_sub_module), its parameters stay gathered if
 *   the parameters of the submodules run before their next use add up to
 *   fewer elements than that (_keep_for_later, get_reuse_distance_in_numel
 *   over the traced order); the next use then gathers nothing. Under full
 *   recomputation (Megatron-LM's checkpointed layers) the backward re-runs
 *   each layer's forward, so its submodules are fetched a third time (the
 *   recomputed forward's hooks) unless so kept: the order of one micro-batch
 *   is the forward, then per layer from the last the recomputed forward and
 *   the backward in reverse (zero3_uses below).
 * - stage3_param_persistence_threshold (default 100000,
 *   deepspeed/runtime/zero/constants.py): a parameter of fewer elements
 *   (ds_numel, the tp rank's tensor) is marked ds_persist and never released
 *   after its submodule ran (stage3.py release_sub_module), so it is not
 *   gathered again in the forward and backward; after each optimizer step
 *   stage3.py gathers all of them in one synchronous call
 *   (persistent_parameters[0].all_gather, _allgather_params: one flat
 *   collective). Their gradients are reduced like any other's.
 *
 * The parameter tensors are Megatron-LM's (megatron/model/transformer.py,
 * ParallelAttention.query_key_value): query, key and value are one tensor,
 * and their biases one. */
#include "planner/planner_int.h"

#include <math.h>
#include <stdlib.h>

#define DS_PERSISTENCE_THRESHOLD 100000.0   /* stage3_param_persistence_threshold's default, elements */

/* Key and value weights (biases) are part of the query's weight (bias):
 * the role they join, or -1. */
static int fused_into(plan_tensor_role r)
{
    if (r == PLAN_TW_WK || r == PLAN_TW_WV) return PLAN_TW_WQ;
    if (r == PLAN_TW_BK || r == PLAN_TW_BV) return PLAN_TW_BQ;
    return -1;
}

/* Megatron-LM's parameter tensors of the whole module (no pipeline under
 * ZeRO-3) on one tp rank: elements of each, fused as above, and (layer not
 * NULL) the block each is in (-1 outside the blocks); returns their count,
 * -1 when out of memory. */
static int megatron_tensors(const model_module *mm, const plan_module *s, double **elems, int **layer)
{
    plan_stage st = plan_stage_of(mm, s, 0);
    int n = plan_module_tensor_shapes(mm, s->tp, 0, false, &st, NULL, 0);
    plan_tensor *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    double *e = malloc((size_t)(n > 0 ? n : 1) * sizeof *e);
    int *l = layer ? malloc((size_t)(n > 0 ? n : 1) * sizeof *l) : NULL;
    if (!t || !e || (layer && !l)) {
        free(t);
        free(e);
        free(l);
        return -1;
    }
    plan_module_tensor_shapes(mm, s->tp, 0, false, &st, t, n);
    int k = 0, at[2] = { -1, -1 };   /* this block's query weight and bias */
    for (int i = 0; i < n; i++) {
        double x = (double)t[i].shape[0] * (double)t[i].shape[1];
        int into = fused_into(t[i].role), j = into == PLAN_TW_WQ ? at[0] : into == PLAN_TW_BQ ? at[1] : -1;
        if (j >= 0) {
            e[j] += x;
            continue;
        }
        if (t[i].role == PLAN_TW_WQ) at[0] = k;
        if (t[i].role == PLAN_TW_BQ) at[1] = k;
        if (l) l[k] = t[i].layer;
        e[k++] = x;
    }
    free(t);
    *elems = e;
    if (layer) *layer = l;
    return k;
}

int plan_zero3_megatron_tensors(const model_module *mm, const plan_module *s, double **elems)
{
    return megatron_tensors(mm, s, elems, NULL);
}

/* DeepSpeed's gather buffer under ZeRO-3: 4 bytes (the fp16 weight
 * gathered and its fp16 gradient) per element of the largest module's own
 * parameters, `largest_layer_memory = 4 * largest_layer_params` in
 * deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs,
 * where model_to_params takes each module's parameters with recurse=False:
 * one Linear (Megatron-LM's fused QKV, fc1, ...) or the embedding, never a
 * whole transformer block, since DeepSpeed fetches a submodule's parameters
 * at a time. The largest Megatron-LM tensor on this tp rank; the Linear's
 * bias (one row of it) is left out. 0 when out of memory. */
double plan_zero3_deepspeed_buffer_bytes(const model_module *mm, const plan_module *s)
{
    double *e, best = 0;
    int n = plan_zero3_megatron_tensors(mm, s, &e);
    if (n < 0) return 0;
    for (int i = 0; i < n; i++)
        if (e[i] > best) best = e[i];
    free(e);
    return 4.0 * best;
}

/* The reduce bucket under DeepSpeed v0.3.13's stage 3: contiguous_gradients
 * defaults to false there (ZERO3_OPTIMIZATION_CONTIGUOUS_GRADIENTS_DEFAULT,
 * deepspeed/runtime/zero/constants.py), so stage3.py allocates no ipg_buffer
 * (its backward() makes one only under contiguous_gradients): the gradients
 * waiting for reduction stay in param.grad. reduce_independent_p_g_buckets_
 * and_remove_grads reduces the bucket before a gradient that would overflow
 * reduce_bucket_size joins it, and a tensor larger than the bucket is
 * reduced alone, so the gradients waiting are at most the larger of the
 * bucket and the largest tensor's, whose gradient the gather buffer above
 * (4 B per element: its weight and its gradient) already holds: what the
 * bucket (bucket_bytes) adds beyond that. */
double plan_zero3_deepspeed_bucket_bytes(const model_module *mm, const plan_module *s, double bucket_bytes)
{
    return fmax(0.0, bucket_bytes - plan_zero3_deepspeed_buffer_bytes(mm, s) / 2);
}

/* n copy kernels of one piece (`piece` elements of `bytes` each). */
static double list_copies(const cost_pool *pool, int n, double piece, double bytes)
{
    return n * cost_elementwise_time(&pool->gpu, COST_EW_COPY, piece, bytes);
}

/* The host's time for one eager view op called from Python: PyTorch's
 * operator micro-benchmark of torch.split on a small tensor, 2.26 us per call
 * (pytorch/pytorch PR 32194, "reimplement __torch_function__ overrides for
 * torch.functional", with the PR; 3.3 us before it, on CPU and CUDA alike:
 * the time is the host's, not the kernel's). */
#define PY_VIEW_OP_S 2.26e-6

/* One parameter's gather: the zeroed flat buffer, the all-gather, the copies
 * out; and before the all-gather, with the device drained by the
 * torch.cuda.synchronize() above, _allgather_param's Python loop over the G
 * ranks making each rank's piece (flat_tensor.narrow, a view op per rank):
 * host time the GPU waits through. */
static double gather_s(const cost_pool *pool, int G, int per_node, double piece, double bytes)
{
    return cost_elementwise_time(&pool->gpu, COST_EW_ZERO, G * piece, bytes) + G * PY_VIEW_OP_S
         + cost_collective_time(pool, COST_ALLGATHER, G * piece * bytes, G, per_node) + list_copies(pool, G, piece, bytes);
}

#define DS_REDUCE_BUCKET 5e8   /* reduce_bucket_size's default, elements */

/* One reduce bucket of k gradients, `elems` elements in all (header): the
 * flattening copy and the copies back where it holds more than one, the
 * division in place (a copy's traffic: read and write each element), the
 * all-reduce over the G ranks. */
static double bucket_s(const cost_pool *pool, int G, int per_node, int k, double elems, double bytes)
{
    double t = cost_elementwise_time(&pool->gpu, COST_EW_COPY, elems, bytes)
             + cost_collective_time(pool, COST_ALLREDUCE, elems * bytes, G, per_node);
    if (k > 1) t += 2 * cost_elementwise_time(&pool->gpu, COST_EW_COPY, elems, bytes) + (k - 1) * pool->gpu.kernel_launch_s;
    return t;
}

/* The backward's gradient reductions (header): gradients become ready in
 * reverse module order; each bucket one all-reduce, each parameter's piece
 * copied into its shard after. Adds them to the backward of *raw. */
static void reduce_grads(const cost_pool *pool, int G, int per_node, const double *e, int n, double bytes, plan_comm *raw)
{
    double elems = 0;
    int k = 0;
    for (int i = n - 1; i >= -1; i--) {
        if (k > 0 && (i < 0 || elems + e[i] > DS_REDUCE_BUCKET)) {
            plan_comm_add(raw, true, bucket_s(pool, G, per_node, k, elems, bytes), 1);
            elems = 0, k = 0;
        }
        if (i < 0) break;
        elems += e[i], k++;
        raw->bwd_s += cost_elementwise_time(&pool->gpu, COST_EW_COPY, ceil(e[i] / G), bytes);
    }
}

#define DS_MAX_REUSE_DISTANCE 1e9   /* stage3_max_reuse_distance's default, elements */

/* The tensor uses of one micro-batch in DeepSpeed's order (header): the
 * forward in module order; the backward in reverse, each block that full
 * recomputation re-runs (plan_block_recompute over st, the module's one
 * stage: ZeRO-3 runs without pipelining) first re-running its forward.
 * use[k] is the tensor, bwd[k] whether the use is in the backward pass;
 * returns the count (at most 3n). */
static int zero3_uses(int n, const int *layer, const plan_module *s, const plan_stage *st, int *use, bool *bwd)
{
    int k = 0;
    for (int i = 0; i < n; i++) use[k] = i, bwd[k++] = false;
    for (int i = n - 1; i >= 0; i--) {
        bool recompute = layer[i] >= 0 && plan_block_recompute(s, st, layer[i]) == PLAN_RECOMP_FULL;
        if (recompute && (i == n - 1 || layer[i + 1] != layer[i])) {   /* a block's last tensor */
            int first = i;
            while (first > 0 && layer[first - 1] == layer[i]) first--;
            for (int j = first; j <= i; j++) use[k] = j, bwd[k++] = true;
        }
        use[k] = i, bwd[k++] = true;
    }
    return k;
}

/* Whether use k gathers: its tensor is not persistent and was released
 * after its previous use, that is, the elements of the uses between them
 * reach stage3_max_reuse_distance (or there was no previous use in the
 * micro-batch: the previous step is further than the whole model). */
static bool use_gathers(const double *e, const int *use, int k)
{
    if (e[use[k]] < DS_PERSISTENCE_THRESHOLD) return false;
    double between = 0;
    for (int j = k - 1; j >= 0; j--) {
        if (use[j] == use[k]) return between >= DS_MAX_REUSE_DISTANCE;
        between += e[use[j]];
        if (between >= DS_MAX_REUSE_DISTANCE) return true;
    }
    return true;
}

bool plan_zero3_deepspeed_applies(const model_module *mm, const plan_module *s, const plan_options *o)
{
    return o->target == PLAN_TARGET_MEGATRON && o->zero3 == PLAN_ZERO3_DEEPSPEED_2021 && plan_dp_rules_of(mm, s).stage == 3;
}

/* deepspeed/runtime/pipe/engine.py (PipelineEngine.__init__) asserts "ZeRO-2
 * and ZeRO-3 are incompatible with pipeline parallelism"; this file's tensors
 * are the whole module's (megatron_tensors: no stages). */
int plan_zero3_pipeline_check(const model_module *mm, const plan_module *s, const plan_options *o, char *err)
{
    if (s->pp > 1 && plan_zero3_deepspeed_applies(mm, s, o))
        return util_fail(err, UTIL_EINVAL, "%s: zero 3 with pp %d: DeepSpeed's ZeRO-3 (--zero3 %s) does not run beside "
                         "pipeline stages (its PipelineEngine refuses ZeRO-2 and -3)", mm->name, s->pp,
                         plan_zero3_name(o->zero3));
    return UTIL_OK;
}

int plan_zero3_deepspeed_2021(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o,
                              bool gather_fwd, bool gather_bwd, bool reduce, plan_comm *raw)
{
    int G, per_node;
    plan_group_shape(s, PLAN_AX_SHARD, pool->gpus_per_node, &G, &per_node);
    double bytes = plan_module_state_bytes(mm, o).param;   /* the gradient is in the parameter's dtype */
    double *e;
    int *layer;
    int n = megatron_tensors(mm, s, &e, &layer);
    if (n < 0) return UTIL_ENOMEM;
    int *use = malloc((size_t)(3 * n + 1) * sizeof *use);
    bool *bwd = malloc((size_t)(3 * n + 1) * sizeof *bwd);
    if (!use || !bwd) {
        free(e), free(layer), free(use), free(bwd);
        return UTIL_ENOMEM;
    }
    plan_stage whole = plan_stage_of(mm, s, 0);
    int uses = zero3_uses(n, layer, s, &whole, use, bwd);
    for (int k = 0; k < uses; k++) {
        if (!(bwd[k] ? gather_bwd : gather_fwd) || !use_gathers(e, use, k)) continue;
        double piece = ceil(e[use[k]] / G);   /* each rank's partition, the tensor padded to G of them */
        plan_comm_add(raw, bwd[k], gather_s(pool, G, per_node, piece, bytes), 1);
    }
    if (reduce) reduce_grads(pool, G, per_node, e, n, bytes, raw);
    free(e), free(layer), free(use), free(bwd);
    return UTIL_OK;
}

/* The step's one gather of every persistent parameter (above): a flat
 * buffer zeroed, one all-gather of the padded pieces, the copies out.
 * 0 when none persists or out of memory. */
double plan_zero3_persistent_gather_s(const model_module *mm, const plan_module *s, const cost_pool *pool,
                                      const plan_options *o)
{
    int G, per_node;
    plan_group_shape(s, PLAN_AX_SHARD, pool->gpus_per_node, &G, &per_node);
    double *e, piece = 0;
    int n = plan_zero3_megatron_tensors(mm, s, &e), count = 0;
    if (n < 0) return 0;
    for (int i = 0; i < n; i++)
        if (e[i] < DS_PERSISTENCE_THRESHOLD) { piece += ceil(e[i] / G); count++; }
    free(e);
    if (count == 0 || G <= 1) return 0;
    double bytes = plan_module_state_bytes(mm, o).param;
    return cost_elementwise_time(&pool->gpu, COST_EW_ZERO, G * piece, bytes)
         + cost_collective_time(pool, COST_ALLGATHER, G * piece * bytes, G, per_node)
         + count * cost_elementwise_time(&pool->gpu, COST_EW_COPY, piece / count * G, bytes);
}

/* Torch's cat copies at most this many inputs per kernel launch
 * (CAT_ARRAY_BATCH_SIZE, aten/src/ATen/native/cuda/Shape.cu, PyTorch 1.8). */
#define TORCH_CAT_BATCH 128

/* DeepSpeed v0.3.13's stage-3 optimizer step (deepspeed/runtime/zero/stage3.py
 * step(), without cpu_offload; v0.3.16's has the same calls) over this rank's
 * fp16 gradient partitions (averaged_gradients: each parameter's piece,
 * ceil(e / G) elements, P in all), one sub-group (sub_group_size default
 * 1e12, constants.py):
 *
 * - _overflow_check_and_loss_scale_update -> has_overflow: under
 *   overlap_comm (stage 3's default true) a one-element check of gpu_sum,
 *   then has_overflow_partitioned_grads_serial: per piece _has_inf_or_nan,
 *   `float(x.float().sum())`: a cast to fp32 (read 2 B, write 4 B) and a sum
 *   (read 4 B); then one all_reduce of a one-byte flag (ReduceOp.MAX) over the
 *   dp group. (update_overflow_tracker_for_param_grad's full-gradient
 *   `param.grad.data.float().sum()` runs only on the cpu_offload path,
 *   partition_previous_reduced_grads, so not here.)
 * - _get_norm_groups -> get_grad_norm_direct: per piece
 *   `g.data.double().norm(2)`: a cast to fp64 (read 2 B, write 8 B) and the
 *   norm (read 8 B); the norm's all_reduce is the GRAD_NORM op's. This is
 *   the step's gradient-norm pass (*norm_s), in place of one sum of squares
 *   over fp32 gradients.
 * - _prepare_fp32_grad_for_sub_group: `_flatten_dense_tensors(pieces)` (one
 *   torch.cat: P fp16 elements copied, a launch per TORCH_CAT_BATCH inputs)
 *   `.to(fp32)` (read 2 B, write 4 B).
 * - unscale_and_clip_grads: `grad.data.mul_(1. / combined_scale)` on the
 *   fp32 flat gradient (read and write 4 B).
 * - _optimizer_step: the fused Adam (optim_s), then
 *   `fp16_param.data.copy_(fp32_param.data)`: the fused pass's step_traffic
 *   already writes the 2 B copy; the copy adds its read of the fp32 master
 *   (4 B) and a launch.
 * A cast or copy of x B in and y B out per element moves a copy's traffic
 * at (x + y) / 2 B; a sum or norm reads once, a sum of squares' traffic.
 * Adds to out->optim_s, sets out->norm_s; nothing unless the Megatron
 * target's ZeRO-3 is PLAN_ZERO3_DEEPSPEED_2021. */
void plan_zero3_deepspeed_step(const model_module *mm, const plan_module *s, const cost_pool *pool,
                               const plan_options *o, plan_time *out)
{
    if (!plan_zero3_deepspeed_applies(mm, s, o)) return;
    int G, per_node;
    plan_group_shape(s, PLAN_AX_SHARD, pool->gpus_per_node, &G, &per_node);
    double *e;
    int n = plan_zero3_megatron_tensors(mm, s, &e);
    if (n < 0) return;
    const cost_gpu *g = &pool->gpu;
    double P = 0, overflow = 0, norm = 0;
    for (int i = 0; i < n; i++) {
        double p = ceil(e[i] / G);
        P += p;
        overflow += cost_elementwise_time(g, COST_EW_COPY, p, (2.0 + 4.0) / 2) + cost_elementwise_time(g, COST_EW_SUMSQ, p, 4.0);
        norm += cost_elementwise_time(g, COST_EW_COPY, p, (2.0 + 8.0) / 2) + cost_elementwise_time(g, COST_EW_SUMSQ, p, 8.0);
    }
    free(e);
    overflow += cost_collective_time(pool, COST_ALLREDUCE, 1.0, G, per_node);
    double prepare = cost_elementwise_time(g, COST_EW_COPY, P, 2.0) + (ceil((double)n / TORCH_CAT_BATCH) - 1) * g->kernel_launch_s
                   + cost_elementwise_time(g, COST_EW_COPY, P, (2.0 + 4.0) / 2);
    double unscale = cost_elementwise_time(g, COST_EW_COPY, P, 4.0);
    double fp16_copy = cost_elementwise_time(g, COST_EW_COPY, P, 4.0 / 2);
    out->optim_s += overflow + prepare + unscale + fp16_copy;
    out->norm_s = norm;
}
