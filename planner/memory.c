/* Memory model: bytes per GPU of one module group under one strategy.
 *
 * Model states follow the mixed-precision AdamW accounting of Rajbhandari et
 * al., "ZeRO" (arXiv 1910.02054) as Megatron-LM implements it
 * (megatron/training/theoretical_memory_usage.py): bf16 parameter 2 B, fp32
 * gradient accumulation buffer 4 B, fp32 master weight + Adam m + v 12 B =
 * 18 B per parameter; the distributed optimizer (ZeRO-1) gives 6 + 12/DP.
 * ZeRO-3 adds DeepSpeed's gathered-layer allowance of 4 B x largest layer
 * (deepspeed/runtime/zero/stage3.py, estimate_zero3_model_states_mem_needs).
 * Activations are itemised per saved tensor following Korthikanti et al.,
 * "Reducing Activation Recomputation in Large Transformer Models"
 * (arXiv 2205.05198), with FlashAttention (no s^2 term, arXiv 2307.08691). */
#include "planner/planner_int.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#define BF16 2.0
#define FP32 4.0

/* NCCL allocates NCCL_BUFFSIZE (default 4 MiB) per channel and peer
 * (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-buffsize);
 * a ring has 2 peers; we assume 8 channels per communicator. */
#define NCCL_BUFFSIZE (4.0 * 1024 * 1024)
#define NCCL_CHANNELS 8.0
/* DeepSpeed ZeRO-2/3 reduce_bucket_size default 5e8 elements
 * (https://www.deepspeed.ai/docs/config-json/#zero-optimizations-for-fp16-training). */
#define ZERO_REDUCE_BUCKET 5e8
/* PyTorch DDP bucket_cap_mb default 25 MB (torch.nn.parallel.DistributedDataParallel docs). */
#define DDP_BUCKET_BYTES (25.0 * 1e6)

void plan_options_default(plan_options *o)
{
    o->precision = PLAN_OPT_MIXED_FP32;
    o->target = PLAN_TARGET_MEGATRON;
    o->zero3 = PLAN_ZERO3_UNITS;
    o->adamw = PLAN_ADAMW_FUSED;
    o->optim_dtype = PLAN_OPTIM_FP32;
    o->grad_reduce = PLAN_REDUCE_GRADS;
    o->tp_style = PLAN_TP_MEGATRON;
    o->pipe_engine = PLAN_PIPE_MEGATRON;
    o->grad_accum = PLAN_ACCUM_FUSED;
    o->fp8 = PLAN_FP8_NONE;
    o->tp_comm_overlap = false;
    o->loss = PLAN_LOSS_AUTO;
    o->attention = PLAN_ATTN_FLASH2;
    o->tf32 = false;
    o->backend = PLAN_BACKEND_DEVICE;
    /* PyTorch's caching allocator rounds and splits blocks; 10% of the
     * dynamic (activation) memory is the allowance we keep for that. */
    o->fragmentation = 0.10;
    o->overlap = 0.8;
}

/* Parameters held by one GPU before ZeRO sharding: TP splits every matrix
 * (norm vectors are replicated, a small overestimate we accept), PP splits
 * the blocks; with pp > 1 the worst stage holds the larger of embedding/head. */
double plan_local_params(const model_module *mm, const plan_module *s)
{
    double embed = (double)model_embed_params(mm), head = (double)model_head_params(mm);
    double edge = s->pp > 1 ? fmax(embed, head) : embed + head;
    return plan_local_block_params(mm, s) + edge / s->tp;
}

/* Of plan_local_params: the worst stage's transformer blocks alone. */
double plan_local_block_params(const model_module *mm, const plan_module *s)
{
    double blocks = (double)model_blocks_params(mm);
    return blocks * ceil((double)mm->layers / s->pp) / mm->layers / s->tp;
}

/* Mixed: bf16 param 2 + fp32 grad 4 + fp32 master, m, v 12 = 18 (Megatron-LM).
 * Autocast and fp32: fp32 param 4 + fp32 grad 4 + m, v 8 = 16. Pure bf16: 2 + 2 + 4 = 8.
 * Activations are bf16 except in fp32 mode.
 * An AdamW step reads the gradient and reads/writes master (or param), m, v,
 * and writes the bf16 copy where there is one. */
plan_state_bytes plan_precision_bytes(plan_precision p)
{
    plan_state_bytes b;
    switch (p) {
    case PLAN_OPT_PURE_BF16: b = (plan_state_bytes){ BF16, BF16, 2 * BF16, BF16 + 3 * 2 * BF16, BF16, 0 }; break;
    case PLAN_OPT_AUTOCAST: b = (plan_state_bytes){ FP32, FP32, 2 * FP32, FP32 + 3 * 2 * FP32, BF16, 0 }; break;
    case PLAN_OPT_FP32: b = (plan_state_bytes){ FP32, FP32, 2 * FP32, FP32 + 3 * 2 * FP32, FP32, 0 }; break;
    default: b = (plan_state_bytes){ BF16, FP32, 3 * FP32, FP32 + 3 * 2 * FP32 + BF16, BF16, 0 }; break;
    }
    b.reduce = b.grad;   /* the gradients reduced in their own dtype */
    return b;
}

plan_state_bytes plan_module_state_bytes(const model_module *mm, const plan_options *o)
{
    /* dhp's executor keeps fp32 states and computes its activations in fp32
     * under bf16-mixed and -autocast, bf16-mixed's weight copy apart and the
     * blocks' saved tensors in bf16 (planner/precision.c, plan_module_acts);
     * the step also writes that copy */
    plan_state_bytes b = plan_precision_bytes(plan_runs_bf16(o) ? PLAN_OPT_FP32 : o->precision);
    b.step_traffic += plan_weight_copy_bytes(mm, o);
    /* an FSDP reduce_dtype of bf16 (plan_grad_reduce): what the collectives send */
    if (o->target == PLAN_TARGET_MEGATRON && o->grad_reduce == PLAN_REDUCE_BF16) b.reduce = fmin(b.grad, BF16);
    /* bf16 AdamW states (plan_optim_dtype): the master copy, m and v 2 B
     * each; the step reads the reduced gradient shard (b.reduce B), reads
     * and writes the three states and writes the bf16 weight */
    if (o->target == PLAN_TARGET_MEGATRON && o->optim_dtype == PLAN_OPTIM_BF16) {
        b.optim = 3 * BF16;
        b.step_traffic = b.reduce + 3 * 2 * BF16 + BF16;
    }
    if (model_trains(mm)) return b;
    if (o->target == PLAN_TARGET_MEGATRON) b.param = BF16;
    b.grad = 0;
    b.reduce = 0;
    b.optim = 0;
    b.step_traffic = 0;
    return b;
}

double plan_stage_block_params(const model_module *mm, const plan_module *s, const plan_stage *st)
{
    double p = 0;
    for (int j = 0; j < st->count; j++) p += (double)model_layer_params(mm, plan_stage_block(st, j));
    return p / s->tp;
}

double plan_stage_params(const model_module *mm, const plan_module *s, const plan_stage *st)
{
    double ends = 0;
    if (st->stem) ends += (double)model_embed_params(mm);
    if (st->head) {
        ends += (double)model_head_params(mm);
        /* its own copy of a tied word embedding, unless it holds the embedding itself */
        if (mm->kind == MODEL_LLM && mm->tied_embeddings && !st->stem) ends += (double)mm->vocab * mm->hidden;
    }
    return plan_stage_block_params(mm, s, st) + ends / s->tp;
}

/* The Megatron target's model states of stage `own` (its blocks and ends,
 * with tied embeddings the last stage's copy: plan_stage_params); returns
 * the rank's parameters they were priced on, before ZeRO's sharding. */
static double model_state_bytes(const model_module *mm, const plan_module *s, const plan_options *o,
                                const plan_stage *own, plan_mem *out)
{
    double p = plan_stage_params(mm, s, own), blocks = plan_stage_block_params(mm, s, own);
    double shard = (double)s->dp * s->sp;   /* ZeRO shards over every replica of the weights */
    plan_state_bytes b = plan_module_state_bytes(mm, o);
    /* Under TransformerEngine's primary FP8 weights (plan_fp8_props) the blocks'
     * bf16 weights become an FP8 weight and its FP8 transpose: 2 B, as before. */
    out->params = p * b.param / (s->zero >= 3 ? shard : 1);
    /* Below ZeRO-3 the gradients are held in the dtype they are reduced in:
     * Megatron-Core's gradient buffer is fp32 under grad_reduce_in_fp32,
     * else the parameters' dtype (group_params_for_buffers,
     * megatron/core/distributed/param_and_grad_buffer.py), and fp16 runs
     * without fp32 accumulation reduce param.grad itself; ZeRO-3's shards keep
     * their dtype (plan_grad_reduce). */
    out->grads = p * (s->zero >= 3 ? b.grad : b.reduce) / (s->zero >= 2 ? shard : 1);
    out->optim = p * b.optim / (s->zero >= 1 ? shard : 1);
    out->block_states = p > 0 ? (out->params + out->grads + out->optim) * blocks / p : 0;
    out->zero_buffers = s->zero >= 3 && shard > 1 ? 2 * BF16 * model_largest_layer_params(mm) / s->tp : 0;
    if (out->zero_buffers > 0 && plan_zero3_deepspeed_applies(mm, s, o))   /* per-tensor gathers (cost_zero3.c) */
        out->zero_buffers = plan_zero3_deepspeed_buffer_bytes(mm, s);
    return p;
}

/* Bytes saved for backward per token of one block (A bytes per element), before dividing by
 * the sequence split. Shapes per token: residual x [h], normed x [h],
 * q/k/v [(H + 2 KV) d / tp], attention output [H d / tp] + fp32 LSE [H / tp],
 * and the MLP: SwiGLU gate, up, act [3 f / tp]; GELU fc1, act [2 f / tp].
 * Megatron sequence parallel also splits the [h] terms by tp where it
 * applies (plan_seqpar_split: the LLM's blocks). Selective
 * recompute is Megatron-LM's (Korthikanti et al. sec. 5): it re-runs the
 * attention core, so it keeps no log-sum-exp and no score matrix; full
 * recompute keeps only the block input. Without FlashAttention
 * (unfused_attention) the core saves its softmax output over `keys` keys
 * per head [H keys / tp], with dropout also the 1-byte mask and the dropped
 * probabilities (Korthikanti et al. Table 2: 5 a s^2 b); dropout adds a
 * 1-byte mask after the attention and after the MLP ([h] each). Together
 * with TP and no sequence parallelism this is their s b h (10 + 24/t +
 * 5 a s / (h t)). */
static double block_act_bytes_per_token(const model_module *mm, const plan_module *s, bool cross, double keys,
                                        double A, const plan_fp8_props *f8)
{
    double h = mm->hidden, d = mm->head_dim, H = mm->heads, KV = mm->kv_heads, f = mm->ffn, tp = s->tp;
    double hsplit = plan_seqpar_split(mm, s);
    if (s->recompute == PLAN_RECOMP_FULL) return A * h / hsplit;
    if (s->recompute == PLAN_RECOMP_OP) {
        /* torchtitan's per-op checkpointing: the block input, the attention
         * output and its fp32 log-sum-exp, and the outputs of the 1st, 3rd,
         * 5th and 7th matmul in forward order: wq, wv, w1 (gate) and w2
         * (SwiGLU: wq wk wv wo w1 w3 w2), or wq, wv, fc1 (GELU). */
        double mlp_saved = mm->ffn_kind == MODEL_FFN_SWIGLU ? f / tp + h / hsplit : f / tp;
        return A * (h / hsplit + H * d / tp + (cross ? 0 : KV * d / tp) + mlp_saved + H * d / tp) + FP32 * H / tp;
    }
    bool core_saved = s->recompute != PLAN_RECOMP_SELECTIVE;
    bool scores = mm->unfused_attention && !cross;
    double lse = core_saved && !scores ? FP32 * H / tp : 0;
    double probs = core_saved && scores ? H / tp * keys * (A + (mm->dropout ? 1 + A : 0)) : 0;
    double masks = mm->dropout ? 2 * h / hsplit : 0;
    /* A linear's saved input: A bytes, or under TransformerEngine's FP8 its
     * FP8 cast, 1 B (plan_fp8_props.saves_fp8_inputs): the norms' outputs are
     * written in FP8 (the norms save their own input, A), the MLP activation's
     * output is the second MLP linear's alone, and the attention output is
     * also kept by the attention core in bf16 where the core is saved. */
    bool fp8 = f8 && f8->saves_fp8_inputs;
    double L = fp8 ? 1.0 : A;
    double attn_out = core_saved ? A + (fp8 ? L : 0) : L;
    double attn = (A + L) * h / hsplit                  /* residual in, normed in */
                + A * (cross ? H * d : (H + 2 * KV) * d) / tp
                + attn_out * H * d / tp + lse + probs;
    double mlp_terms = mm->ffn_kind == MODEL_FFN_SWIGLU ? 3.0 : 2.0;
    double mlp = (A + L) * h / hsplit + (A * (mlp_terms - 1) + L) * f / tp;
    return attn + mlp + masks;
}

/* Units (micro-batch x model chunk) the Megatron target's stage i holds in
 * flight at its peak, per model chunk (slots[v]), of the step's micro-batches
 * through its vp chunks: the schedule's (plan_pipeline_peak_units); returns
 * their sum. 1F1B keeps min(pp - i, micro-batches) on stage i (Korthikanti
 * et al. sec. 4.2.3); interleaved, the first stage's 2 (pp - 1) + (vp - 1)
 * pp + 1 units are the pp (1 + (pp - 1) / (pp vp)) micro-batches of
 * megatron/training/theoretical_memory_usage.py while the step has as many. */
static int megatron_stage_slots(const plan_module *s, const plan_workload *w, int i, int *slots)
{
    double micro = fmax(1, plan_step_micro_batches(s, w));
    double units = fmin(micro * plan_vp(s), (double)INT_MAX);
    return plan_pipeline_peak_units(s->pp > 1 ? s->pp : 1, plan_vp(s), i, (int)units, slots);
}

int plan_stage_units_in_flight(const plan_module *s, const plan_workload *w, int i)
{
    int slots[PLAN_MAX_VP];
    return megatron_stage_slots(s, w, i, slots);
}

static double block_bytes(const model_module *mm, const plan_module *s, const plan_seq *q, double t, double A,
                          const plan_fp8_props *f8);

/* What stage st's blocks save for one micro-batch of t tokens: each block
 * as it recomputes (plan_block_recompute: under partial full recomputation
 * the recomputed ones their input, the others everything). */
static double stage_blocks_bytes(const model_module *mm, const plan_module *s, const plan_stage *st,
                                 const plan_seq *q, double t, double A, const plan_fp8_props *f8)
{
    int rc = plan_stage_recomputed_blocks(s, st);
    if (s->recompute != PLAN_RECOMP_FULL || rc == st->count) return st->count * block_bytes(mm, s, q, t, A, f8);
    plan_module full = *s, none = *s;
    full.recompute_layers = none.recompute_layers = 0;
    none.recompute = PLAN_RECOMP_NONE;
    return rc * block_bytes(mm, &full, q, t, A, f8) + (st->count - rc) * block_bytes(mm, &none, q, t, A, f8);
}

/* Tokens one GPU of the group processes per micro-batch. */
static double local_tokens(const plan_seq *q, const plan_module *s)
{
    return (double)s->micro_batch * q->tokens_per_sample / s->sp;
}

/* Bytes one block of the module saves for one micro-batch of t tokens,
 * averaged over its layers (self- and cross-attention blocks in the
 * module's proportion). */
static double block_bytes(const model_module *mm, const plan_module *s, const plan_seq *q, double t, double A,
                          const plan_fp8_props *f8)
{
    if (mm->layers <= 0) return 0;
    double n_cross = 0;
    for (int l = 0; l < mm->layers; l++) if (model_layer_is_cross(mm, l)) n_cross++;
    double self = block_act_bytes_per_token(mm, s, false, q->seq, A, f8);
    double cross = block_act_bytes_per_token(mm, s, true, 0, A, f8);
    double b = t * (self * (mm->layers - n_cross) + cross * n_cross) / mm->layers;
    /* Cross-attention keys/values over the encoder tokens of the micro-batch. */
    if (n_cross > 0 && s->recompute != PLAN_RECOMP_FULL)
        b += n_cross / mm->layers * A * 2.0 * mm->kv_heads * mm->head_dim / s->tp * q->cross_span * s->micro_batch;
    return b;
}

/* The LLM's embedding dropout mask, 1 byte per element of its [t, h]
 * output: Megatron-LM's LanguageModelEmbedding applies
 * Dropout(hidden_dropout) after scattering the embeddings to the sequence
 * parallel region (megatron/core/models/common/embeddings/
 * language_model_embedding.py), so sequence parallelism splits it by tp:
 * s b h p / t (Korthikanti et al. sec. 4.3, p the first stage's
 * micro-batches in flight, applied by the caller), and s b h p without it
 * (theoretical_memory_usage.py, compute_activation_memory_without_sp). */
static double embedding_dropout_bytes(const model_module *mm, const plan_module *s, double t)
{
    if (mm->kind != MODEL_LLM || !mm->dropout) return 0;
    return t * mm->hidden / plan_seqpar_split(mm, s);
}

/* One block's full activations over t tokens, nothing recomputed: what is
 * live while a block runs. */
static double one_block_live(const model_module *mm, const plan_module *s, const plan_seq *q, double t, double A,
                             const plan_fp8_props *f8)
{
    plan_module none = *s;
    none.recompute = PLAN_RECOMP_NONE;
    return t * block_act_bytes_per_token(mm, &none, false, q->seq, A, f8);
}

/* Returns the module's activations on pipeline stage `stage` (its blocks
 * and ends: own); *blocks_saved: of them, what its blocks save (the stem
 * and head apart). */
static double activation_bytes(const model_t *m, int mi, const plan_module *s, const plan_seq *q,
                               const plan_workload *w, int in_flight, double A, const plan_fp8_props *f8,
                               const plan_stage *own, int stage,
                               double *blocks_saved)
{
    const model_module *mm = &m->mod[mi];
    double t = local_tokens(q, s), mask = embedding_dropout_bytes(mm, s, t);
    if (!model_runs_backward(mm)) {
        /* A frozen encoder: autograd records nothing where no input needs a
         * gradient ("Backward computation is never performed in the subgraphs,
         * where all Tensors didn't require gradients", PyTorch's autograd
         * mechanics notes; its inputs are data, its weights frozen), so only
         * the block being run is live, and the output it hands the LLM. */
        *blocks_saved = 0;
        return one_block_live(mm, s, q, t, A, f8) + plan_encoder_out_rows(mm, q, t) * A * mm->out_hidden;
    }
    /* each model chunk's blocks times its units in flight (interleaved: chunk 0 holds the stem) */
    int slots[PLAN_MAX_VP];
    megatron_stage_slots(s, w, stage, slots);
    double saved = 0;
    for (int v = 0; v < plan_vp(s) && v < PLAN_MAX_VP; v++) {
        plan_stage chunk = plan_stage_chunk(own, v);
        saved += slots[v] * stage_blocks_bytes(mm, s, &chunk, q, t, A, f8);
    }
    double stem_micro = own->stem ? slots[0] : 0;
    bool head = own->head;   /* the final norm and output layer run here */
    double per_mb = 0;
    /* During backward with full recompute one block's full activations are
     * live again: one block of one micro-batch, however many are in flight. */
    double live = s->recompute == PLAN_RECOMP_FULL || s->recompute == PLAN_RECOMP_OP ? one_block_live(mm, s, q, t, A, f8) : 0;
    /* Stem and head with pp = 1: the final norm's input and the output
     * layer's input, 2 s b h bytes each (Korthikanti et al. sec. 4.3).
     * Sequence parallelism splits both by tp where it splits the blocks'
     * rows (plan_seqpar_split): 4 s b h / t there, and in
     * theoretical_memory_usage.py's 4 s b h (1 + v/h) / t, since the final
     * norm runs on the sequence-parallel shard and the output layer (a
     * ColumnParallelLinear) saves the shard it receives, gathering it inside
     * (megatron/core/tensor_parallel/layers.py,
     * LinearWithGradAccumulationAndAsyncCommunication.forward:
     * ctx.save_for_backward(input, ...) before the all-gather). Encoders run
     * without it (Megatron-LM's vision encoder and projection too), so their
     * final norm's and merger's inputs stay whole like their blocks' rows;
     * under dhp's sp (Ulysses, ring) t is already the rank's rows. They also
     * save their patch embedding's input and the merger MLP's. With pp > 1
     * each stage is priced apart: the first holds no head, and its first
     * block saves the embedding output; the last holds the head's inputs (of
     * its one micro-batch in flight under 1F1B), an encoder's first its
     * patch embedding's. The embedding's dropout mask counts on the first
     * stage, once per micro-batch its first chunk holds. */
    if (head) per_mb += t * A * mm->hidden * 2 / plan_seqpar_split(mm, s);
    if (mm->kind != MODEL_LLM) {
        double merged = plan_encoder_out_rows(mm, q, t);
        if (own->stem)
            per_mb += t * A * (double)mm->in_channels * mm->patch * mm->patch * mm->temporal_patch / s->tp;
        if (head) per_mb += merged * A * (mm->proj_in + 2.0 * mm->proj_hidden);
    }
    *blocks_saved = saved * in_flight + live;
    return (saved + per_mb + stem_micro * mask) * in_flight + live;
}

/* Bytes per logit [t, V/tp] element at the loss's peak, the larger of its
 * forward and its backward (plan_loss_props: which tensors each holds); A
 * the logits' own dtype. The torch loss's bf16 logits are freed before its
 * backward as torchtitan's train step does (`del pred`, "need to free to
 * before bwd to avoid peaking memory"); a trainer that keeps them holds A
 * more. */
static double logits_elem_bytes(const plan_loss_props *l, double A, bool split)
{
    double fwd = A + (split ? l->fp32_copies_fwd_tp : l->fp32_copies_fwd) * FP32;
    double bwd = (l->logits_kept_in_bwd ? A : 0) + (split ? l->fp32_copies_bwd_tp : l->fp32_copies_bwd) * FP32
               + (l->grad_copy ? A : 0);
    return fmax(fwd, bwd);
}

/* LM head logits [t, V/tp] in bf16 and the fp32 tensors the loss works on (logits_elem_bytes). */
static double logits_bytes(const model_module *mm, const plan_module *s, const plan_seq *q, const plan_workload *w,
                           const plan_options *o, double A)
{
    if (mm->kind != MODEL_LLM) return 0;
    double t = local_tokens(q, s);
    return plan_head_rows(w, PLAN_TARGET_MEGATRON, s->micro_batch, t) * ceil((double)mm->vocab / s->tp)
         * logits_elem_bytes(plan_loss_props_of(o), A, s->tp > 1);
}

static double comm_bytes(const model_module *mm, const plan_module *s, const plan_seq *q, double local_p, double A,
                         const plan_options *o)
{
    double comms = (s->tp > 1) + (s->sp > 1) + (s->dp * s->sp > 1) + (s->pp > 1);
    double b = comms * NCCL_BUFFSIZE * 2 * NCCL_CHANNELS;
    double shard = (double)s->dp * s->sp;
    if (shard > 1 && model_trains(mm)) {
        if (plan_zero3_deepspeed_applies(mm, s, o))   /* no bucket of its own (cost_zero3.c) */
            b += plan_zero3_deepspeed_bucket_bytes(mm, s, A * fmin(ZERO_REDUCE_BUCKET, local_p));
        else if (s->zero >= 2) b += A * fmin(ZERO_REDUCE_BUCKET, local_p);
        else b += 2 * fmin(DDP_BUCKET_BYTES, A * local_p);
    }
    double t = local_tokens(q, s);
    if (s->sp > 1) {
        if (plan_cp_of(mm, s) == PLAN_CP_RING)
            /* ring attention: K/V blocks and (backward) their gradients, two of each in flight
             * (TransformerEngine's AttnFuncWithCPAndKVP2P p2p_comm_buffers) */
            b += 8 * A * t * mm->kv_heads * mm->head_dim / s->tp;
        else
            /* Ulysses all-to-all needs separate send and receive buffers for q, k, v of one layer. */
            b += 2 * A * t * (mm->heads + 2.0 * mm->kv_heads) * mm->head_dim / s->tp;
    }
    if (plan_tp_overlaps(mm, s, o)) {
        double rows = t * mm->hidden;
        if (o->tp_style == PLAN_TP_DTENSOR)
            /* torchtitan's async TP: PyTorch's symmetric-memory workspace (get_symm_mem_workspace), its
             * largest request _pipelined_produce_and_all2all's two output chunks of rows / tp */
            b += 2 * A * rows / s->tp;
        else
            /* TransformerEngine's userbuffers: initialize_ub registers a buffer of the micro-batch's
             * whole [s b / cp, h] rows (Megatron's _initialize_tp_communicators) for each of the ten
             * overlaps, the six all-gathers' FP8 under FP8 (fp8_buf) */
            b += rows * (6 * plan_tp_gather_bytes(o, A) + 4 * A);
    }
    return b;
}

/* ---- the dhp target: what the executor allocates ----
 * Model states from the unit layout and the data-parallel strategy's
 * buffers (plan_dp_buffers_of, which executor/dp_*.c allocate), activations
 * from the executor's own list (plan_module_acts): what one activation slot
 * saves for backward, times the slots in flight, plus the scratch every
 * slot shares. */
static void executor_states(const model_module *mm, const plan_module *s, int stage, const plan_options *o,
                            plan_mem *out)
{
    plan_dp_rules r = plan_dp_rules_of(mm, s);
    plan_dp_buffers b = plan_dp_buffers_of(mm, s, stage);
    plan_state_bytes sb = plan_module_state_bytes(mm, o);
    double local = (double)b.local, shard = (double)b.shard_elems, unit = (double)r.shard * b.max_piece;
    out->params = (r.shard_params ? shard : local) * sb.param + local * plan_weight_copy_bytes(mm, o);
    out->grads = (r.shard_grads ? shard : local) * sb.grad;
    out->optim = (r.shard_optim ? shard : local) * sb.optim;
    out->zero_buffers = b.gather_slots * unit * sb.param + b.bucket_slots * unit * sb.grad;
    out->comm = (double)(b.staging + b.pieces) * fmax(sb.param, sb.grad);
    plan_zero3_bf16_memory(mm, s, stage, o, out);   /* bf16-mixed ZeRO-3: the bf16 shard and gathers */
    /* the blocks' share by elements: every unit keeps the same bytes per element
     * (the ZeRO pieces' padding, under one element a unit, apart) */
    out->block_states = local > 0 ? (out->params + out->grads + out->optim) * (double)b.block_local / local : 0;
}

/* The activations of rank stage `stage` with vslots[v] slots of its model
 * chunk v (one chunk without interleaving): each slot saves its chunk's
 * list, the scratch all slots share is the largest chunk's. */
static void executor_activations(const model_module *mm, const plan_module *s, int stage, const plan_seq *q,
                                 const plan_workload *w, const plan_options *o, const int *vslots, plan_mem *out)
{
    double mb = s->micro_batch > 0 ? s->micro_batch : 1, N = mb * q->tokens_per_sample / s->sp;
    plan_act_rows rows = { .rows = (int)N };
    if (mm->kind != MODEL_LLM) {
        rows.merged_rows = (int)(mm->kind == MODEL_VISION ? plan_encoder_out_rows(mm, q, N) : N / ((double)mm->merge * mm->merge));
    } else {
        /* the head is sized for every text position's prediction (the loss mask
         * aside) of the sp rank that holds the most */
        rows = plan_llm_act_rows(mm, s, (int)mb, (int)q->tokens_per_sample, w->text_tokens);
    }
    rows.bf16 = plan_saves_bf16(o);
    double A = plan_module_state_bytes(mm, o).act, act = 0, most_scratch = 0, all_logits = 0, staging = 0;
    out->block_acts = 0;
    for (int v = 0; v < plan_vp(s); v++) {
        double saved, block_saved, scratch, logits;
        int vstage = v * (s->pp > 1 ? s->pp : 1) + stage;
        plan_module_act_bytes(mm, s, vstage, &rows, A, &saved, &block_saved, &scratch, &logits);
        act += saved * vslots[v];
        out->block_acts += block_saved * vslots[v];
        most_scratch = fmax(most_scratch, scratch);
        all_logits += logits;
        if (plan_runs_bf16(o)) staging = fmax(staging, plan_gemm_staging_elems(mm, s, vstage, &rows));
    }
    /* the list's bytes (bf16: its saved block tensors at 2); bf16: the linears' two
     * bf16 staging buffers, autocast's weight cast (executor/precision.c) */
    out->activations = act + most_scratch + BF16 * (2 * staging + plan_weight_cast_elems(mm, s, stage, o));
    out->logits = all_logits;
    /* A stage's edges (executor/run_stage.c): buffers the micro-batch's rows
     * go out or come in through, and where the module runs a backward
     * those of their gradient. */
    double Nl = N / plan_seqpar_split(mm, s);
    out->comm += A * Nl * mm->hidden * plan_stage_edge_buffers(s, stage, model_runs_backward(mm));
}

int plan_stage_edge_buffers(const plan_module *s, int stage, bool backward)
{
    int pp = s->pp, vp = plan_vp(s), down = 0, up = 0;
    if (pp <= 1) return 0;
    for (int v = 0; v < vp; v++) {
        down += v * pp + stage < pp * vp - 1;   /* chunk v sends its rows to the next virtual stage */
        up += v * pp + stage > 0;               /* and its input's gradient to the previous one */
    }
    return down + (down > 0 && backward) + (up > 0) + (backward ? up : 0);
}

void plan_stage_memory(const model_t *m, int mi, const plan_module *s, int stage, const plan_workload *w,
                       const cost_gpu *g, const plan_options *o, int in_flight, plan_mem *out)
{
    /* the units in flight over the rank's chunks, as even as they go (the schedule's own: plan_stage_memory_slots) */
    int vp = plan_vp(s), vslots[PLAN_MAX_VP];
    if (in_flight < 1) in_flight = 1;
    for (int v = 0; v < vp && v < PLAN_MAX_VP; v++) vslots[v] = in_flight / vp + (v < in_flight % vp);
    plan_stage_memory_slots(m, mi, s, stage, w, g, o, vslots, out);
}

void plan_stage_memory_slots(const model_t *m, int mi, const plan_module *s, int stage, const plan_workload *w,
                             const cost_gpu *g, const plan_options *o, const int *vslots, plan_mem *out)
{
    const model_module *mm = &m->mod[mi];
    plan_seq q;
    plan_module_seq(m, mi, w, &q);
    memset(out, 0, sizeof *out);
    out->stage = stage;
    double A = plan_module_state_bytes(mm, o).act;
    int in_flight = 0, ones[PLAN_MAX_VP];
    for (int v = 0; v < plan_vp(s); v++) {
        ones[v] = vslots[v] > 0 ? vslots[v] : plan_vp(s) == 1;
        in_flight += ones[v];
    }
    if (o->target == PLAN_TARGET_DHP) {
        executor_states(mm, s, stage, o, out);
        executor_activations(mm, s, stage, &q, w, o, ones, out);
    } else {
        plan_stage st = plan_stage_of(mm, s, stage), *own = &st;   /* the stage's own blocks and ends */
        double local_p = model_state_bytes(mm, s, o, own, out);
        out->activations = activation_bytes(m, mi, s, &q, w, in_flight, A, plan_fp8_props_of(o->fp8), own, stage,
                                            &out->block_acts);
        /* the logits live where the output layer runs: the last stage, priced apart */
        out->logits = own->head ? logits_bytes(mm, s, &q, w, o, A) : 0;
        out->comm = comm_bytes(mm, s, &q, local_p, A, o);
    }
    out->reserved = plan_reserved_bytes(o, g);
    out->workspace = plan_backend_workspace_bytes(o, g);
    out->fragmentation = o->fragmentation * (out->activations + out->logits + out->comm + out->zero_buffers);
    out->total = out->params + out->grads + out->optim + out->zero_buffers + out->activations
               + out->logits + out->comm + plan_mem_once(out) + out->fragmentation;
    out->capacity = g->hbm_bytes;
}

/* Units (micro-batch x model chunk) stage i of a 1F1B pipeline of `stages`
 * keeps in flight: the schedule's peak (plan_pipeline_peak_units) before the
 * cap at the step's units. */
static int pipeline_units(const plan_module *s, int i, int stages)
{
    int slots[PLAN_MAX_VP];
    return stages <= 1 ? 1 : plan_pipeline_peak_units(stages, plan_vp(s), i, INT_MAX, slots);
}

/* The module's busiest stage, every stage priced apart: for dhp's executor
 * stage i keeping its pipeline_units for each micro-batch in flight, for the
 * Megatron target each stage its own blocks, ends and logits with the units
 * it holds over the step's micro-batches (megatron_stage_slots). */
void plan_module_memory(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                        const cost_gpu *g, const plan_options *o, int in_flight, plan_mem *out)
{
    bool dhp = o->target == PLAN_TARGET_DHP;
    int stages = s->pp > 1 ? s->pp : 1;
    plan_stage_memory(m, mi, s, 0, w, g, o, in_flight * (dhp ? pipeline_units(s, 0, stages) : 1), out);
    for (int i = 1; i < stages; i++) {
        plan_mem t;
        plan_stage_memory(m, mi, s, i, w, g, o, in_flight * (dhp ? pipeline_units(s, i, stages) : 1), &t);
        if (t.total > out->total) *out = t;
    }
}

plan_options plan_options_of(const plan_t *p)
{
    plan_options o;
    plan_options_default(&o);
    o.precision = p->precision;
    o.target = p->target;
    o.zero3 = p->zero3;
    o.adamw = p->adamw;
    o.optim_dtype = p->optim_dtype;
    o.grad_reduce = p->grad_reduce;
    o.tp_style = p->tp_style;
    o.pipe_engine = p->pipe_engine;
    o.grad_accum = p->grad_accum;
    o.fp8 = p->fp8;
    o.tp_comm_overlap = p->tp_comm_overlap;
    o.loss = p->loss;
    o.attention = p->attention;
    o.tf32 = p->tf32;
    o.backend = p->backend;
    return o;
}

const char *plan_mem_dominant(const plan_mem *mm)
{
    struct { const char *name; double v; } t[] = {
        { "parameters", mm->params }, { "gradients", mm->grads }, { "optimizer", mm->optim },
        { "zero_buffers", mm->zero_buffers }, { "activations", mm->activations },
        { "logits", mm->logits }, { "comm_buffers", mm->comm }, { "reserved", mm->reserved }, { "workspace", mm->workspace },
        { "fragmentation", mm->fragmentation },
    };
    int best = 0;
    for (int i = 1; i < (int)(sizeof t / sizeof t[0]); i++) if (t[i].v > t[best].v) best = i;
    return t[best].name;
}
