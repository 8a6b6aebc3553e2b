/* The Megatron target's framework options (planner.h includes this; its
 * face): whose software a plan exported to another trainer is priced as,
 * option by option. Each is kept in the plan file (planner/planfile.c) and
 * refused under the dhp target where dhp run does otherwise (the checks in
 * planner.h, planner/precision.c). */
#ifndef DHP_PLANNER_FRAMEWORK_H
#define DHP_PLANNER_FRAMEWORK_H

/* How the Megatron target prices ZeRO-3's collectives: one per unit, hidden
 * behind the compute up to `overlap` (FSDP, DeepSpeed since it coalesces a
 * module's gathers; the default), the same with FSDP2's copy of every
 * gathered unit out of its all-gather buffer (PyTorch's fully_shard, as
 * torchtitan runs it; planner/cost_dp.c), or as DeepSpeed issued them in
 * 2021, one per parameter tensor with the device drained before each gather
 * (planner/cost_zero3.c). */
typedef enum { PLAN_ZERO3_UNITS = 0, PLAN_ZERO3_DEEPSPEED_2021, PLAN_ZERO3_FSDP2, PLAN_NZERO3 } plan_zero3;
const char *plan_zero3_name(plan_zero3 z);
int plan_zero3_parse(const char *s, plan_zero3 *out, char *err);

/* How the Megatron target prices the AdamW step: one fused pass over the
 * states (apex FusedAdam, DeepSpeed's, torch's fused=True; the default), or
 * one pass per tensor op (torch.optim.AdamW's foreach path, the default
 * without fused=True, and per-parameter loops like Composer's
 * DecoupledAdamW): planner/cost_optim.c. */
typedef enum { PLAN_ADAMW_FUSED = 0, PLAN_ADAMW_FOREACH, PLAN_NADAMW } plan_adamw;
const char *plan_adamw_name(plan_adamw a);
int plan_adamw_parse(const char *s, plan_adamw *out, char *err);

/* The dtype of the Megatron target's AdamW states under bf16-mixed: fp32 (the
 * default: fp32 master weights, m and v, Megatron-LM's and DeepSpeed's
 * optimizers, 12 B an element) or bf16: Apex's DistributedFusedAdam with
 * dtype=torch.bfloat16 (apex/contrib/optimizers/distributed_fused_adam.py:
 * "dtype: datatype for optimizer state"; store_params, its default, keeps
 * the parameter shard as state in that dtype), as NeMo runs it under
 * optim.name distributed_fused_adam with optim.dtype bf16 (NVIDIA's
 * dgxc-benchmarking nemotron/nemotron4-340b-synth.yaml, its Nemotron-4 340B
 * recipe): master, m and v 2 B each, 6 B an element, the step reading the
 * reduced gradient shard in the dtype it was reduced in (grad_sync_dtype).
 * planner/memory.c, plan_module_state_bytes. dhp run keeps fp32 states:
 * plan_optim_dtype_check. */
typedef enum { PLAN_OPTIM_FP32 = 0, PLAN_OPTIM_BF16, PLAN_NOPTIM_DTYPE } plan_optim_dtype;
const char *plan_optim_dtype_name(plan_optim_dtype d);
int plan_optim_dtype_parse(const char *s, plan_optim_dtype *out, char *err);

/* What the Megatron target's data-parallel gradient reduction (all-reduce,
 * reduce-scatter) sends: the gradients in their own dtype (the default;
 * fp32 under bf16-mixed and -autocast, Megatron-LM's fp32 main_grad, FSDP's
 * reduce_dtype float32), or bf16 (PyTorch FSDP's MixedPrecision with
 * reduce_dtype bf16, or param_dtype bf16 and reduce_dtype unset, which
 * FlatParamHandle._init_param_reduce_dtypes then takes from param_dtype;
 * FSDP2's MixedPrecisionPolicy reduce_dtype bf16; and, being its width, fp16
 * gradients reduced as they are: Megatron-LM's and DeepSpeed's --fp16
 * without fp32 accumulation). Below ZeRO-3 the gradients are held in the
 * dtype they are reduced in (Megatron-Core's gradient buffer, Megatron-LM
 * --grad-reduce-in-bf16; fp16 param.grad); ZeRO-3's gradient shards keep
 * their dtype (FSDP casts the reduced shard back to the parameter's). dhp
 * run reduces in fp32 (executor/dp*.c), so the dhp target refuses bf16:
 * plan_grad_reduce_check. */
typedef enum { PLAN_REDUCE_GRADS = 0, PLAN_REDUCE_BF16, PLAN_NREDUCE } plan_grad_reduce;
const char *plan_grad_reduce_name(plan_grad_reduce r);
int plan_grad_reduce_parse(const char *s, plan_grad_reduce *out, char *err);

/* Whose tensor parallelism the Megatron target prices (planner/cost_tp.c):
 * Megatron-LM's (the default; [s, b, h] activations, its sequence-parallel
 * collectives along dim 0, each column-parallel input re-gathered in
 * backward), or PyTorch's DTensor styles as torchtitan applies them
 * (ColwiseParallel, RowwiseParallel(output_layouts=Shard(1)),
 * SequenceParallel on [b, s, h]: the collectives along the sequence dim,
 * a copy beside each, the gathered input kept by autograd). dhp run's TP is
 * Megatron's: plan_tp_style_check. */
typedef enum { PLAN_TP_MEGATRON = 0, PLAN_TP_DTENSOR, PLAN_NTP_STYLE } plan_tp_style;
const char *plan_tp_style_name(plan_tp_style t);
int plan_tp_style_parse(const char *s, plan_tp_style *out, char *err);

/* Whose pipeline engine the Megatron target prices (the stage hand-offs and
 * when the data-parallel reduction runs; plan_stage_hop_wire,
 * plan_module_time): Megatron-LM's 1F1B (the default: each send batched with
 * the receive opposite it, both directions scattered over tp, the gradient
 * reduction overlapping the last backward), or DeepSpeed's PipelineEngine
 * (deepspeed/runtime/pipe/engine.py, p2p.py): every send and receive a
 * blocking collective of its own (a broadcast in a two-rank group, later
 * dist.send / dist.recv), so a stage's stream is held for each transfer it
 * sends as well as each it receives; the activation partitioned over tp
 * (is_pipe_partitioned); the gradient sent whole by every tp rank up to
 * v0.5.3 (deepspeed-2021: is_grad_partitioned = False) and partitioned from
 * v0.5.4 (deepspeed: DeepSpeed PR 1407, 2021-09-29); the gradient reduction
 * after the last step of the schedule (TrainSchedule's ReduceGrads, with
 * enable_backward_allreduce off), beside nothing. DeepSpeed's TrainSchedule
 * has no interleaving: plan_validate refuses vp > 1 with it. dhp run's
 * pipeline is its own: plan_pipe_engine_check. */
typedef enum { PLAN_PIPE_MEGATRON = 0, PLAN_PIPE_DEEPSPEED_2021, PLAN_PIPE_DEEPSPEED, PLAN_NPIPE } plan_pipe_engine;
const char *plan_pipe_engine_name(plan_pipe_engine e);
int plan_pipe_engine_parse(const char *s, plan_pipe_engine *out, char *err);
/* What each engine does, declared once (planner/planfile.c, beside the
 * names): the hop's pricing (planner/cost_hop.c), the gradient reduction's
 * overlap (plan_module_time), interleaving (the search, plan_validate). */
typedef struct {
    bool blocking;            /* each send and receive a collective of its own: both ends held for a transfer */
    bool reduce_after_flush;  /* the data-parallel reduction after the schedule's last step, beside nothing */
    bool interleaves;         /* has an interleaved (vp > 1) schedule */
    bool grad_whole;          /* under tp every rank sends the whole gradient back, not its 1/tp */
    int grad_gathers;         /* tp all-gathers on a scattered gradient's arrival */
    /* The highest ZeRO stage it runs beside pp > 1: DeepSpeed's PipelineEngine
     * asserts zero_optimization_stage() < 2 ("ZeRO-2 and ZeRO-3 are
     * incompatible with pipeline parallelism", deepspeed/runtime/pipe/engine.py) */
    int zero_on_stages;
} plan_pipe_props;
const plan_pipe_props *plan_pipe_engine_props(plan_pipe_engine e);

/* How the Megatron target's weight gradients accumulate over a step's
 * micro-batches (planner/cost_grad_accum.c): fused (the default: Megatron-LM's
 * gradient_accumulation_fusion, since 2022-02, the weight-gradient GEMM adding
 * into the fp32 main_grad; or one micro-batch a step), add (PyTorch
 * autograd's AccumulateGrad, param.grad += new in the weight's dtype from a
 * step's second micro-batch: Megatron-LM before the fusion with its fp16
 * defaults, DeepSpeed's fp16 engines) or bf16-optimizer (DeepSpeed's
 * BF16_Optimizer under its pipeline engine, update_hp_grads after every
 * backward: the bf16 gradient cast to fp32 and added into the fp32 one).
 * dhp run's is its own: plan_grad_accum_check. */
typedef enum { PLAN_ACCUM_FUSED = 0, PLAN_ACCUM_ADD, PLAN_ACCUM_BF16_OPTIMIZER, PLAN_NACCUM } plan_grad_accum;
const char *plan_grad_accum_name(plan_grad_accum a);
int plan_grad_accum_parse(const char *s, plan_grad_accum *out, char *err);

/* FP8 linears (the Megatron target only): whose FP8 recipe runs the
 * transformer blocks' linears (query/key/value, attention output, the MLP's),
 * their forward, input-gradient and weight-gradient GEMMs at the GPU's FP8
 * peak (COST_MATH_FP8, costdb peak_flops_fp8); the attention core, the
 * embedding and the output layer stay in the precision's bf16 (Megatron-Core's
 * TE spec makes only the layers' linears TE modules; torchao's
 * Float8LinearConfig leaves torchtitan's "output" out). The recipes:
 * - delayed: TransformerEngine's DelayedScaling (Megatron-LM --fp8-format
 *   hybrid --fp8-recipe delayed; NeMo's default through 2024): each scale from
 *   an amax history, the amax taken by the cast kernel itself;
 * - tensorwise: TransformerEngine's Float8CurrentScaling (Megatron-LM
 *   --fp8-recipe tensorwise): each tensor's amax read first, then the cast;
 * - torchao: torchao's Float8Linear with tensorwise dynamic scaling, as
 *   torchtitan converts its linears (model.converters
 *   ["quantize.linear.float8"], torchtitan 0.2.2).
 * What each does is declared once (plan_fp8_props, planner/planfile.c). dhp
 * run's linears are bf16 or fp32: plan_fp8_check. */
typedef enum { PLAN_FP8_NONE = 0, PLAN_FP8_DELAYED, PLAN_FP8_TENSORWISE, PLAN_FP8_TORCHAO, PLAN_NFP8 } plan_fp8;
const char *plan_fp8_name(plan_fp8 f);
int plan_fp8_parse(const char *s, plan_fp8 *out, char *err);
typedef struct {
    bool on;                  /* the blocks' linears run in FP8 */
    const char *what;         /* whose FP8 it is, as the plan table says */
    /* TransformerEngine's modules (transformer_engine/pytorch/module/linear.py,
     * _Linear.forward): what the forward saves for backward is the input's FP8
     * cast (and its transpose, for the weight gradient), 1 B an element;
     * torchao's Float8Linear saves the bf16 input. */
    bool saves_fp8_inputs;
    /* The blocks' linear weights held in FP8 (TransformerEngine's primary FP8
     * weights, Megatron-LM's --fp8-param-gather, which NeMo's and Megatron-
     * Bridge's FP8 precision recipes set: bf16_with_fp8_mixed,
     * bf16_with_fp8_current_scaling_mixed): 1 B each and its transpose, 1 B,
     * kept from a step's first micro-batch (is_first_microbatch) in place of
     * bf16's 2 B; the optimizer writes them from the fp32 master, and each step
     * transposes them once. torchao keeps bf16 weights and casts at each use. */
    bool primary_fp8_weights;
    bool amax_pass;           /* each cast first reads its tensor for the amax (current scaling) */
    /* TransformerEngine's LayerNormLinear writes the norm's output in FP8 in
     * the norm kernel itself (no cast of its own) for the linears a norm feeds:
     * query/key/value and the MLP's input projection. */
    bool norm_casts;
    /* The sequence-parallel all-gathers of the linears' inputs and output
     * gradients move FP8, 1 B an element: TransformerEngine gathers the
     * quantized tensor (layernorm_linear.py, linear.py: gather_along_first_dim
     * with the input quantizer; TE 1.x's LayerNormLinear gathered its FP8
     * norm output), as its userbuffers do (fp8_buf); torchtitan's Float8 TP
     * styles (torchao float8_tensor_parallel: PrepareFloat8ModuleInput casts
     * before the all-gather, NoopFwToFloat8BwDynamic casts the output gradient
     * before its backward all-gather). The reduce-scatters stay bf16. */
    bool tp_gathers_fp8;
} plan_fp8_props;
const plan_fp8_props *plan_fp8_props_of(plan_fp8 f);

/* The attention kernel of a Megatron-target plan's trainer (--attention;
 * plan_attention_kernel): flash2 (FlashAttention-2, the default: the GPU
 * file's attention curve) or cudnn (cuDNN's fused attention, which
 * TransformerEngine prefers over FlashAttention on Hopper, so Megatron-Core
 * with TE and NeMo run it there; llm.c's cuDNN build too): the curve times
 * the file's attn_cudnn_speedup, refused on GPUs without one
 * (plan_attention_check). */
typedef enum { PLAN_ATTN_FLASH2 = 0, PLAN_ATTN_CUDNN, PLAN_NATTN } plan_attention;
const char *plan_attention_name(plan_attention a);
int plan_attention_parse(const char *s, plan_attention *out, char *err);

/* The LLM's cross-entropy as the trainer a Megatron-target plan is exported
 * to runs it (--loss; what each holds and computes: plan_loss_props):
 * - vocab-parallel: Megatron-LM's _VocabParallelCrossEntropy
 *   (megatron/core/tensor_parallel/cross_entropy.py): the logits cast to one
 *   fp32 copy, its exp, softmax and gradient written in place;
 * - torch: F.cross_entropy(logits.float(), labels) as torchtitan calls it
 *   (torchtitan 9dec370 train.py loss_fn): log_softmax then nll_loss
 *   (torch.nn.functional.cross_entropy docs) in fp32 (torch.amp docs, "CUDA
 *   Ops that can autocast to float32": cross_entropy, log_softmax), each a
 *   new [t, V] tensor, log_softmax's output saved for its backward, where
 *   nll_loss's gradient is a dense [t, V] too; the logits freed before
 *   backward (its train step's `del pred`). Over tp > 1 ranks it is
 *   PyTorch's loss_parallel (torch/distributed/tensor/parallel/loss.py,
 *   torchtitan's default under TP), whose decomposed _log_softmax keeps the
 *   fp32 input, the shifted logits and their exp beside each other, and whose
 *   fused nll_loss / log_softmax backward builds (zeros + exp(x)) * grad
 *   beside the saved output: one more fp32 [t, V / tp] each way;
 * - fused: flash-attn's fused cross entropy (flash_attn.losses.cross_entropy,
 *   llm-foundry's default loss_fn fused_crossentropy): one kernel on the bf16
 *   logits keeping them and an fp32 log-sum-exp a row, its gradient a new
 *   tensor of the logits' dtype (inplace_backward False, the default);
 * - auto (the default): torch under bf16-autocast (FSDP's bf16 compute with
 *   fp32 weights, as torchtitan trains), else vocab-parallel. */
typedef enum { PLAN_LOSS_AUTO = 0, PLAN_LOSS_VOCAB_PARALLEL, PLAN_LOSS_TORCH, PLAN_LOSS_FUSED, PLAN_NLOSS } plan_loss;
const char *plan_loss_name(plan_loss l);
int plan_loss_parse(const char *s, plan_loss *out, char *err);
typedef struct {
    bool in_fp32;             /* its passes read and write fp32 logits, a cast in and the gradient's cast back */
    /* Bytes per logit element at the loss's peak, the larger of its forward
     * and its backward, beyond what the logits' own dtype (A) holds: fp32
     * tensors (fp32_copies; *_tp: with the vocabulary split over tp > 1
     * ranks), and the logits' gradient in their dtype (grad_copy). */
    double fp32_copies_fwd, fp32_copies_bwd, fp32_copies_fwd_tp, fp32_copies_bwd_tp;
    bool logits_kept_in_bwd, grad_copy;
} plan_loss_props;

#endif
