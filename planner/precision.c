/* What `dhp run` runs under each precision, and what that costs in memory:
 * the one owner of the executor's precision rules (the dhp target's memory
 * model, the executor's layout and the run's refusal read them here).
 *
 * dhp run runs fp32, bf16-mixed and bf16-autocast. bf16-mixed is Megatron-LM's --bf16 with
 * its distributed optimizer off (megatron/core/optimizer: Float16OptimizerWithFloat16Params
 * keeps fp32 main params and Adam state, main_grad accumulates in fp32,
 * the bf16 model params are copied from the main params after each step;
 * DeepSpeed's bf16 mode the same, deepspeed/runtime/bf16_optimizer.py): the
 * executor keeps its fp32 weights as the master, AdamW moments and gradients
 * in fp32 as under fp32, and adds one bf16 working copy of the weights
 * (one allocation with a view per tensor, as llm.c's params_memory) that the
 * linears read, refreshed from the master before each step's first forward.
 * bf16-autocast (torch.autocast(dtype=torch.bfloat16) over fp32 weights,
 * as torchtitan's mixed_precision_param float32 without FSDP's bf16 cast):
 * the same linears, but no persistent copy: each linear rounds its weight
 * into a staging buffer of the rank's largest weight tensor (autocast's
 * per-op cast), counted with the activations. The weights do not change
 * within a step, so autocast's roundings are bf16-mixed's and both give the
 * same losses; they differ in memory only.
 * Each linear rounds its activation operand (and, backward, the incoming
 * gradient) to bf16 in a staging buffer of the module's largest linear
 * operand (its largest activation tensor, or a vision stem's pixels), two of
 * them (operand and gradient), which the dhp target counts as activations.
 * Both save the block tensors a backward reads in bf16, as Megatron-LM's
 * bf16 modules do (their activations are params_dtype tensors; the norms'
 * and the flash attention's statistics stay fp32: TransformerEngine's
 * rmsnorm saves rsigma in fp32, flash-attention's softmax_lse is fp32):
 * the forward computes each layer in fp32 and packs it (plan_module_acts),
 * so a forward's outputs and the loss are fp32's; the backward reads the
 * rounded tensors. The rest (the stems', heads' and mergers' tensors, the
 * scratch) stays fp32.
 * Under ZeRO-3 both gather each unit before use (planner/precision_zero3.c:
 * bf16-mixed keeps a bf16 copy of the rank's shard, not of the module, and
 * gathers its linears' weights in bf16) and the linears round the gathered
 * weight into autocast's staging. */
#include "planner/planner.h"

#include <math.h>


#define BF16 2.0
#define FP32 4.0

/* The precisions dhp run runs (under the dhp target). */
static bool precision_runs(plan_precision p) { return p != PLAN_OPT_PURE_BF16; }

/* A plan is made for what dhp run runs unless asked otherwise (--target megatron
 * prices Megatron-LM's kernels and memory for a plan exported to it): dhp plan's
 * choice must be one dhp run can run. bf16-pure is planned for Megatron only. */
plan_target plan_target_default(plan_precision p)
{
    return precision_runs(p) ? PLAN_TARGET_DHP : PLAN_TARGET_MEGATRON;
}

bool plan_runs_bf16(const plan_options *o)
{
    return o->target == PLAN_TARGET_DHP && (o->precision == PLAN_OPT_MIXED_FP32 || o->precision == PLAN_OPT_AUTOCAST);
}

bool plan_saves_bf16(const plan_options *o) { return plan_runs_bf16(o); }

bool plan_act_saved_bf16(plan_act_id id)
{
    switch (id) {
    case PLAN_ACT_RSTD1: case PLAN_ACT_RSTD2: case PLAN_ACT_MEAN1: case PLAN_ACT_MEAN2: case PLAN_ACT_LSE: return false;
    default: return id < PLAN_NACT_BLOCK;
    }
}

int plan_run_check(const plan_t *p, char *err)
{
    if (p->target != PLAN_TARGET_DHP)
        return util_fail(err, UTIL_EUNSUPPORTED,
                         "plan: target %s prices %s, not what dhp run does: make the plan with --target dhp "
                         "(dhp run runs precision fp32, bf16-mixed and bf16-autocast)",
                         plan_target_name(p->target), p->target == PLAN_TARGET_MEGATRON ? "Megatron-LM" : "another executor");
    if (!precision_runs(p->precision))
        return util_fail(err, UTIL_EUNSUPPORTED, "plan: precision %s is planned, not run: dhp run runs fp32, bf16-mixed and bf16-autocast",
                         plan_precision_name(p->precision));
    return UTIL_OK;
}

int plan_tf32_check(const plan_options *o, char *err)
{
    if (o->tf32 && o->precision != PLAN_OPT_FP32)
        return util_fail(err, UTIL_EINVAL, "--tf32 puts fp32 GEMMs on TF32 tensor cores; precision %s has none "
                         "(its linears are bf16): use --precision fp32", plan_precision_name(o->precision));
    return UTIL_OK;
}

int plan_tp_style_check(const plan_options *o, char *err)
{
    if (o->tp_style == PLAN_TP_DTENSOR && o->target != PLAN_TARGET_MEGATRON)
        return util_fail(err, UTIL_EINVAL, "--tp-style dtensor describes a plan exported to PyTorch's DTensor tensor "
                         "parallelism (torchtitan): use --target megatron; dhp run's is Megatron's");
    return UTIL_OK;
}

int plan_pipe_engine_check(const plan_options *o, char *err)
{
    if (o->pipe_engine != PLAN_PIPE_MEGATRON && o->target != PLAN_TARGET_MEGATRON)
        return util_fail(err, UTIL_EINVAL, "--pipe-engine %s describes a plan exported to DeepSpeed's pipeline engine: "
                         "use --target megatron; dhp run's pipeline is its own", plan_pipe_engine_name(o->pipe_engine));
    return UTIL_OK;
}

int plan_grad_accum_check(const plan_options *o, char *err)
{
    if (o->grad_accum != PLAN_ACCUM_FUSED && o->target != PLAN_TARGET_MEGATRON)
        return util_fail(err, UTIL_EINVAL, "--grad-accum %s describes a plan exported to another trainer: use --target "
                         "megatron; dhp run accumulates its own way", plan_grad_accum_name(o->grad_accum));
    return UTIL_OK;
}

int plan_optim_dtype_check(const plan_options *o, char *err)
{
    if (o->optim_dtype == PLAN_OPTIM_FP32) return UTIL_OK;
    if (o->target != PLAN_TARGET_MEGATRON)
        return util_fail(err, UTIL_EINVAL, "--optim-dtype %s describes a plan exported to Apex's DistributedFusedAdam "
                         "(NeMo's optim.dtype): use --target megatron; dhp run keeps fp32 AdamW states",
                         plan_optim_dtype_name(o->optim_dtype));
    if (o->precision != PLAN_OPT_MIXED_FP32)
        return util_fail(err, UTIL_EINVAL, "--optim-dtype %s keeps the master weights in the bf16 weights' own dtype: "
                         "use --precision bf16-mixed (bf16 weights), not %s", plan_optim_dtype_name(o->optim_dtype),
                         plan_precision_name(o->precision));
    return UTIL_OK;
}

int plan_grad_reduce_check(const plan_options *o, char *err)
{
    if (o->grad_reduce == PLAN_REDUCE_BF16 && o->target != PLAN_TARGET_MEGATRON)
        return util_fail(err, UTIL_EINVAL, "--grad-reduce bf16 describes a plan exported to PyTorch FSDP (reduce_dtype "
                         "bf16): use --target megatron; dhp run reduces its gradients in fp32");
    return UTIL_OK;
}

int plan_tp_comm_overlap_check(const plan_options *o, char *err)
{
    if (!o->tp_comm_overlap) return UTIL_OK;
    if (o->target != PLAN_TARGET_MEGATRON)
        return util_fail(err, UTIL_EINVAL, "--tp-comm-overlap describes a plan exported to Megatron-LM with "
                         "TransformerEngine's userbuffers or to torchtitan with async TP: use --target megatron; "
                         "dhp run's tensor-parallel collectives wait for their GEMMs");
    return UTIL_OK;
}

/* The first pool of c whose GPU lacks what has() asks of it, or NULL (c NULL: none checked). */
static const cost_pool *pool_without(const cost_cluster *c, bool (*has)(const cost_gpu *g))
{
    for (int i = 0; c && i < c->n_pools; i++)
        if (!has(&c->pool[i].gpu)) return &c->pool[i];
    return NULL;
}

int plan_attention_check(const plan_options *o, const cost_cluster *c, char *err)
{
    if (o->attention == PLAN_ATTN_FLASH2) return UTIL_OK;
    if (o->target != PLAN_TARGET_MEGATRON)
        return util_fail(err, UTIL_EINVAL, "--attention %s describes a plan exported to TransformerEngine's cuDNN "
                         "attention: use --target megatron; dhp run's attention is its own", plan_attention_name(o->attention));
    const cost_pool *lacks = pool_without(c, cost_gpu_has_cudnn_attention);
    if (lacks)
        return util_fail(err, UTIL_EINVAL, "--attention cudnn: pool %s's %s has no measured cuDNN attention (its GPU "
                         "file gives no attn_cudnn_speedup)", lacks->name, lacks->gpu.name);
    return UTIL_OK;
}

int plan_loss_check(const plan_options *o, char *err)
{
    if (o->loss != PLAN_LOSS_AUTO && o->target != PLAN_TARGET_MEGATRON)
        return util_fail(err, UTIL_EINVAL, "--loss %s describes a plan exported to another trainer's cross-entropy: "
                         "use --target megatron; dhp run computes its own", plan_loss_name(o->loss));
    return UTIL_OK;
}

bool plan_tp_overlaps(const model_module *mm, const plan_module *s, const plan_options *o)
{
    return o->tp_comm_overlap && o->target == PLAN_TARGET_MEGATRON && s->tp > 1 && plan_seqpar_split(mm, s) > 1;
}

int plan_fp8_check(const plan_options *o, const cost_cluster *c, char *err)
{
    if (!plan_fp8_props_of(o->fp8)->on) return UTIL_OK;
    if (o->target != PLAN_TARGET_MEGATRON)
        return util_fail(err, UTIL_EINVAL, "--fp8 %s describes a plan exported to TransformerEngine or torchao (FP8 "
                         "linears): use --target megatron; dhp run's linears are bf16 or fp32", plan_fp8_name(o->fp8));
    if (o->precision == PLAN_OPT_FP32)
        return util_fail(err, UTIL_EINVAL, "--fp8 runs the linears in FP8 over bf16 activations: use a bf16 precision "
                         "(bf16-mixed, bf16-autocast or bf16-pure), not fp32");
    const cost_pool *lacks = pool_without(c, cost_gpu_has_fp8);
    if (lacks)
        return util_fail(err, UTIL_EINVAL, "--fp8: pool %s's %s has no FP8 tensor cores (its GPU file gives no "
                         "peak_flops_fp8)", lacks->name, lacks->gpu.name);
    return UTIL_OK;
}

int plan_options_check(const plan_options *o, const char **key, char *err)
{
    int rc;
    const char *k = NULL;
    if ((rc = plan_tf32_check(o, err))) k = "tf32";
    else if ((rc = plan_grad_reduce_check(o, err))) k = "grad_reduce";
    else if ((rc = plan_optim_dtype_check(o, err))) k = "optim_dtype";
    else if ((rc = plan_tp_style_check(o, err))) k = "tp_style";
    else if ((rc = plan_pipe_engine_check(o, err))) k = "pipe_engine";
    else if ((rc = plan_grad_accum_check(o, err))) k = "grad_accum";
    else if ((rc = plan_fp8_check(o, NULL, err))) k = "fp8";
    else if ((rc = plan_tp_comm_overlap_check(o, err))) k = "tp_comm_overlap";
    else if ((rc = plan_loss_check(o, err))) k = "loss";
    else if ((rc = plan_attention_check(o, NULL, err))) k = "attention";
    if (key) *key = k;
    return rc;
}

int plan_options_pool_check(const plan_options *o, const cost_cluster *c, char *err)
{
    int rc = plan_fp8_check(o, c, err);
    return rc ? rc : plan_attention_check(o, c, err);
}

/* What the dhp target's executor runs a linear in: bf16 operands (bf16-mixed,
 * -autocast: its linear_forward_bf16, priced from what dhp profile measured
 * of it where the GPU file has that, else at the bf16 peak: COST_MATH_BF16_DHP),
 * or fp32 through cuBLASLt with CUBLAS_COMPUTE_32F (the CUDA cores) or, with
 * --tf32, CUBLAS_COMPUTE_32F_FAST_TF32 (executor/cuda_gemm.cuh). The Megatron
 * target keeps its published pricing: every GEMM at the bf16 peak. */
cost_gemm_math plan_gemm_math(const plan_options *o)
{
    if (plan_runs_bf16(o)) return COST_MATH_BF16_DHP;
    if (o->target != PLAN_TARGET_DHP || o->precision != PLAN_OPT_FP32) return COST_MATH_BF16;
    return o->tf32 ? COST_MATH_TF32 : COST_MATH_FP32;
}

/* The transformer blocks' linears: in FP8 under --fp8 (plan_fp8, the
 * Megatron target), else as every linear (plan_gemm_math). */
cost_gemm_math plan_block_gemm_math(const plan_options *o)
{
    return plan_fp8_props_of(o->fp8)->on ? COST_MATH_FP8 : plan_gemm_math(o);
}

/* The activation collectives (the tensor-parallel regions' all-reduces,
 * Megatron sequence parallelism's all-gathers and reduce-scatters, the
 * vocab-parallel embedding's sum, the head input's gradient, Ulysses'
 * all-to-alls, ring attention's K/V blocks and their gradients) move what
 * the activations are in: Megatron-LM under --bf16
 * runs its model in bf16, so its tensor_parallel/mappings.py reduces and
 * gathers bf16 tensors (NCCL's ncclBfloat16: each partial sum rounded to
 * bf16). dhp run does the same under bf16-mixed and -autocast (executor/
 * tp_wire.c: rounded into the linears' bf16 staging, moved, widened back);
 * the cross-entropy's statistics and every weight gradient stay fp32. */
bool plan_act_wire_bf16(const plan_options *o) { return plan_runs_bf16(o); }

double plan_act_wire_bytes(const plan_options *o)
{
    if (o->target != PLAN_TARGET_DHP) return plan_precision_bytes(o->precision).act;
    return plan_act_wire_bf16(o) ? BF16 : FP32;
}

/* What the dhp target's attention runs in, the precision's rule: under
 * bf16-mixed and -autocast executor/cuda_attention16.cuh (q, k, v rounded to
 * bf16, the products on tensor cores through WMMA, fp32 statistics and
 * accumulators: FlashAttention-2's precisions, Dao, arXiv 2307.08691);
 * under fp32 executor/cuda_attention.cuh's flash-style tiles multiply fp32
 * on the CUDA cores (--tf32 does not change them). The Megatron target runs
 * FlashAttention-2, or cuDNN's fused attention under --attention cudnn. costdb prices each (cost_attention_*_time_in): the bf16
 * kernel by its own times where `dhp profile --backend cuda` measured them
 * (the GPU file's attn_bf16), else as FlashAttention at the bf16 peak; the
 * fp32 kernel at the fp32 peak, with the file's attn_eff (a profile's: the
 * fp32 kernel's measured fraction of its fp32 GEMMs' rate). */
cost_attn_kernel plan_attention_kernel(const plan_options *o)
{
    if (o->target != PLAN_TARGET_DHP) return o->attention == PLAN_ATTN_CUDNN ? COST_ATTN_CUDNN : COST_ATTN_FLASH;
    return plan_runs_bf16(o) ? COST_ATTN_BF16 : COST_ATTN_FP32;
}

double plan_weight_copy_bytes(const model_module *mm, const plan_options *o)
{
    (void)mm;
    return plan_runs_bf16(o) && o->precision == PLAN_OPT_MIXED_FP32 ? BF16 : 0;
}

double plan_weight_cast_elems(const model_module *mm, const plan_module *s, int stage, const plan_options *o)
{
    if (!plan_runs_bf16(o) || (o->precision != PLAN_OPT_AUTOCAST && !plan_zero3_bf16(mm, s, o))) return 0;
    plan_stage st = plan_stage_of(mm, s, stage);
    return (double)plan_largest_tensor(mm, s->tp, s->seq_parallel, &st);
}

double plan_gemm_staging_elems(const model_module *mm, const plan_module *s, int stage, const plan_act_rows *rows)
{
    double most = plan_largest_act(mm, s, stage, rows);
    /* the patch embedding's input, the pixels (not an activation of the list) */
    if (mm->kind == MODEL_VISION && plan_vstage_of(mm, s, stage).stem)
        most = fmax(most, (double)rows->rows * mm->in_channels * mm->temporal_patch * mm->patch * mm->patch);
    return most;
}
