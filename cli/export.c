/* dhp export: a plan's strategy in the terms of other trainers.
 *
 * Each exporter builds one JSON document (what --json prints); the text
 * forms (cli/cmd_export.c) render it. The names are the trainers' own:
 *   Megatron-LM: megatron/training/arguments.py at tag core_v0.15.0
 *     (NVIDIA/Megatron-LM 0d7e02bd), and for per-module parallelism Megatron
 *     Core MIMO's ModuleGridSpec (examples/mimo/training/topology.py, main
 *     d98e8a64): a HyperCommGrid [tp, cp, dp, pp] per module at rank_offset;
 *   DeepSpeed 0.19.8: deepspeed/runtime/config.py, precision_config.py,
 *     zero/config.py, tensor_parallel/config.py (one config per module);
 *   torchtitan 0.2.2: torchtitan/config/job_config.py (a --job.config_file TOML).
 * dhp's sequence parallelism (sp) becomes Megatron context parallelism,
 * with all-to-all communication where it is Ulysses (--cp-comm-type a2a,
 * the DeepSpeed-Ulysses scheme) and ring attention's where it is ring
 * (--cp-comm-type p2p: plan_cp_of); DeepSpeed's sequence_parallel_size
 * (Ulysses only: a note says so of a ring), and torchtitan's
 * context_parallel_degree (ring attention there: a note says so of Ulysses). */
#include "cli/cli_export.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void note(cJSON *notes, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(cJSON *notes, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cJSON_AddItemToArray(notes, cJSON_CreateString(buf));
}

static void arg(cJSON *args, const char *name, const char *value)
{
    cJSON_AddItemToArray(args, cJSON_CreateString(name));
    if (value) cJSON_AddItemToArray(args, cJSON_CreateString(value));
}

/* name (NULL: one more value of the flag before it) and its whole-number value */
static void arg_int(cJSON *args, const char *name, long v)
{
    char b[32];
    snprintf(b, sizeof b, "%ld", v);
    if (name) arg(args, name, b);
    else cJSON_AddItemToArray(args, cJSON_CreateString(b));
}

/* Every trainer here splits the global batch into equal micro-batches per
 * data-parallel rank: micro x accumulation x dp = global. dhp's schedule
 * allows shares that differ by one; those plans cannot be exported. */
static int accumulation(const plan_t *p, int k, int *gas, char *err)
{
    const plan_module *s = &p->mod[k];
    long per_step = (long)s->micro_batch * s->dp;
    if (per_step <= 0 || p->work.global_batch % per_step)
        return util_fail(err, UTIL_EINVAL, "module %s: global batch %d is not a multiple of micro-batch %d x dp %d; "
                         "the trainers need micro x accumulation x dp = global batch", s->module,
                         p->work.global_batch, s->micro_batch, s->dp);
    *gas = (int)(p->work.global_batch / per_step);
    return UTIL_OK;
}

static int llm_seq_len(const plan_t *p)
{
    plan_seq q;
    plan_module_seq(&p->model, p->model.llm, &p->work, &q);
    return (int)ceil(q.seq);
}

/* ---- Megatron-LM ---- */

static void megatron_model_args(const plan_t *p, cJSON *args)
{
    const model_module *mm = &p->model.mod[p->model.llm];
    int seq = llm_seq_len(p);
    arg_int(args, "--num-layers", mm->layers);
    arg_int(args, "--hidden-size", mm->hidden);
    arg_int(args, "--ffn-hidden-size", mm->ffn);
    arg_int(args, "--num-attention-heads", mm->heads);
    if (mm->kv_heads != mm->heads) { arg(args, "--group-query-attention", NULL); arg_int(args, "--num-query-groups", mm->kv_heads); }
    if (mm->head_dim * mm->heads != mm->hidden) arg_int(args, "--kv-channels", mm->head_dim);
    arg_int(args, "--seq-length", seq);
    arg_int(args, "--max-position-embeddings", seq);
    /* the rotary embedding as the model has it: Megatron's defaults (10000, 1-D RoPE) are not Qwen2.5's */
    if (mm->n_mrope > 0) {
        arg(args, "--position-embedding-type", "mrope");
        arg(args, "--mrope-section", NULL);
        for (int i = 0; i < mm->n_mrope; i++) arg_int(args, NULL, mm->mrope_section[i]);
    } else {
        arg(args, "--position-embedding-type", "rope");
    }
    arg_int(args, "--rotary-base", mm->rope_theta);
    if (mm->ffn_kind == MODEL_FFN_SWIGLU) arg(args, "--swiglu", NULL);
    arg(args, "--normalization", mm->norm == MODEL_NORM_RMSNORM ? "RMSNorm" : "LayerNorm");
    char eps[32];
    snprintf(eps, sizeof eps, "%g", model_norm_eps(mm));   /* Megatron's default is 1e-5 */
    arg(args, "--norm-epsilon", eps);
    if (!mm->tied_embeddings) arg(args, "--untie-embeddings-and-output-weights", NULL);
    if (!mm->out_bias && !mm->mlp_bias) arg(args, "--disable-bias-linear", NULL);
    if (mm->qkv_bias) arg(args, "--add-qkv-bias", NULL);
    if (mm->qk_norm_head) arg(args, "--qk-layernorm", NULL);
    arg_int(args, "--vocab-size", mm->vocab);
}

/* Whether Megatron-LM's uneven-split arguments say dhp's split: every stage
 * a whole number of chunks (Megatron splits a stage's layers evenly over its
 * vp chunks and refuses a remainder), the middle stages alike (Megatron
 * spreads what the first and the last leave evenly over them;
 * TransformerConfig.__post_init__, core_v0.15.0). Fills the first and the
 * last stage's layers, and mid (the middle stages', -1 with two stages). */
static bool megatron_uneven_split(const model_module *mm, const plan_module *s, int *first, int *last, int *mid)
{
    int pp = s->pp, vp = plan_vp(s);
    *first = plan_stage_of(mm, s, 0).count, *last = plan_stage_of(mm, s, pp - 1).count;
    *mid = pp > 2 ? plan_stage_of(mm, s, 1).count : -1;
    bool ok = *first % vp == 0 && *last % vp == 0;
    for (int i = 1; i < pp - 1; i++) ok &= plan_stage_of(mm, s, i).count == *mid && *mid % vp == 0;
    return ok;
}

/* One virtual stage in the layout's letters: E (the embedding), t or t*n
 * (blocks), L (the loss head). */
static void layout_stage(const plan_stage *st, char *out, size_t n)
{
    int len = snprintf(out, n, "%s", st->stem ? "E" : "");
    if (st->count == 1) len += snprintf(out + len, n - (size_t)len, "t");
    else if (st->count > 1) len += snprintf(out + len, n - (size_t)len, "t*%d", st->count);
    snprintf(out + len, n - (size_t)len, "%s", st->head ? "L" : "");
}

/* Megatron-LM's --pipeline-model-parallel-layout of dhp's split: the
 * virtual stages in layer order separated by '|', a run of n like stages
 * "(X|)*n", a comma after each run (cosmetic; PipelineParallelLayerLayout.
 * parse_str_to_list, core_v0.15.0). The caller frees it. */
static char *megatron_layout(const model_module *mm, const plan_module *s)
{
    cli_buf b = { 0 };
    int stages = s->pp * plan_vp(s), run = 0;
    bool after_run = false;
    char prev[32] = "", cur[32];
    for (int g = 0; g <= stages; g++) {
        if (g < stages) {
            plan_stage st = plan_vstage_of(mm, s, g);
            layout_stage(&st, cur, sizeof cur);
            if (run > 0 && !strcmp(cur, prev)) { run++; continue; }
        }
        if (run > 0) {
            bool last = g == stages;
            if (after_run) cli_buf_add(&b, ",");
            if (run > 1 && last) cli_buf_printf(&b, "(%s|)*%d,%s", prev, run - 1, prev);   /* no '|' after the last */
            else if (run > 1) cli_buf_printf(&b, "(%s|)*%d", prev, run);
            else cli_buf_printf(&b, "%s%s", prev, last ? "" : "|");
            after_run = run > 1;
        }
        snprintf(prev, sizeof prev, "%s", g < stages ? cur : "");
        run = 1;
    }
    return b.s;
}

/* The LLM's pipeline split in Megatron-LM's terms, Megatron's own where it
 * has one: the chunks a rank (--num-virtual-stages-per-pipeline-rank) of the
 * even split, the embedding and the loss counted as layers (split_ends), the
 * first and the last stage's layers (--decoder-first/last-pipeline-num-layers)
 * where the rest is even; any other split stage by stage
 * (--pipeline-model-parallel-layout, which Megatron takes alone). */
static void megatron_pipeline_args(const plan_t *p, const plan_module *s, cJSON *args)
{
    if (s->pp <= 1) return;
    const model_module *mm = &p->model.mod[p->model.llm];
    int vp = plan_vp(s), first, last, mid;
    if (!s->split_ends && !megatron_uneven_split(mm, s, &first, &last, &mid)) {
        char *layout = megatron_layout(mm, s);
        arg(args, "--pipeline-model-parallel-layout", layout ? layout : "");
        free(layout);
        return;
    }
    if (vp > 1) arg_int(args, "--num-virtual-stages-per-pipeline-rank", vp);
    if (s->split_ends) {
        arg(args, "--account-for-embedding-in-pipeline-split", NULL);
        arg(args, "--account-for-loss-in-pipeline-split", NULL);
        return;
    }
    if (mid < 0 && first == last) return;   /* two even stages: Megatron's own split */
    if (mid < 0 || first != mid) arg_int(args, "--decoder-first-pipeline-num-layers", first);
    if (mid < 0 || last != mid) arg_int(args, "--decoder-last-pipeline-num-layers", last);
}

/* dhp's ZeRO-2 / -3 go to Megatron-LM as Megatron FSDP (ZeRO-1 as its
 * distributed optimizer). */
static bool megatron_fsdp(const plan_module *s) { return s->zero >= 2; }

/* What Megatron-LM's validate_args (megatron/training/arguments.py,
 * core_v0.15.0) asks beside the strategy's own arguments:
 * - Megatron FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1 (its fsdp_dtensor
 *   checkpoint format goes with its arguments);
 * - tensor or context parallelism without it require
 *   CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell (so the TP / CP
 *   collectives keep their order against the compute);
 * - context parallelism a sequence of a multiple of 2 cp (each rank takes
 *   two chunks, for the causal mask's balance). */
static void megatron_requirements(const plan_t *p, const plan_module *s, cJSON *env, cJSON *notes)
{
    if (megatron_fsdp(s)) {
        note(notes, "%s: Megatron FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1: leave it unset%s", s->module,
             s->tp > 1 || s->sp > 1 ? " (Megatron warns that tensor and context parallelism run best with 1)" : "");
        if (s->pp > 1)
            note(notes, "%s: Megatron FSDP beside pipeline parallelism: its guide (docs/source/api-guide/custom_fsdp.md) "
                 "names tensor, expert and context parallelism as what it integrates with, not pipelines", s->module);
    } else if (s->tp > 1 || s->sp > 1) {
        cJSON_AddStringToObject(env, "CUDA_DEVICE_MAX_CONNECTIONS", "1");
    }
    int seq = llm_seq_len(p);
    if (s->sp > 1 && seq % (2 * s->sp))
        note(notes, "%s: Megatron-LM's context parallelism needs --seq-length a multiple of 2 x %d; pad the sequence "
             "from %d to %d", s->module, s->sp, seq, (seq + 2 * s->sp - 1) / (2 * s->sp) * (2 * s->sp));
}

static void megatron_strategy_args(const plan_t *p, const plan_module *s, cJSON *args, cJSON *env, cJSON *notes)
{
    arg_int(args, "--tensor-model-parallel-size", s->tp);
    arg_int(args, "--pipeline-model-parallel-size", s->pp);
    megatron_pipeline_args(p, s, args);
    if (s->sp > 1) {
        arg_int(args, "--context-parallel-size", s->sp);
        arg(args, "--cp-comm-type", plan_cp_of(&p->model.mod[p->model.llm], s) == PLAN_CP_RING ? "p2p" : "a2a");
    }
    if (s->seq_parallel && s->tp > 1) arg(args, "--sequence-parallel", NULL);
    if (s->zero == 1) arg(args, "--use-distributed-optimizer", NULL);
    if (megatron_fsdp(s)) {
        arg(args, "--use-megatron-fsdp", NULL);
        arg(args, "--data-parallel-sharding-strategy", s->zero == 2 ? "optim_grads" : "optim_grads_params");
        arg(args, "--ckpt-format", "fsdp_dtensor");   /* the only format it saves (validate_args) */
    }
    megatron_requirements(p, s, env, notes);
    arg_int(args, "--micro-batch-size", s->micro_batch);
    arg_int(args, "--global-batch-size", p->work.global_batch);
    if (s->recompute == PLAN_RECOMP_FULL) {
        /* rc_layers: the first N blocks of each model chunk, as dhp's
         * plan_block_recompute (megatron/core/transformer/transformer_block.py
         * _checkpointed_forward, 'block': layer_idx < recompute_num_layers of
         * the chunk's num_layers_per_pipeline_rank) */
        arg(args, "--recompute-granularity", "full");
        arg(args, "--recompute-method", s->recompute_layers > 0 ? "block" : "uniform");
        arg_int(args, "--recompute-num-layers", s->recompute_layers > 0 ? s->recompute_layers : 1);
    } else if (s->recompute == PLAN_RECOMP_SELECTIVE) {
        arg(args, "--recompute-granularity", "selective");
        arg(args, "--recompute-modules", "mlp");
        note(notes, "%s: dhp's selective recomputation recomputes the MLP activation only; Megatron's nearest, "
             "--recompute-modules mlp, recomputes the whole MLP (more memory freed, more time)", s->module);
    }
    switch (p->precision) {
    case PLAN_OPT_MIXED_FP32: arg(args, "--bf16", NULL); break;
    case PLAN_OPT_PURE_BF16:
        arg(args, "--bf16", NULL);
        note(notes, "precision bf16-pure: Megatron keeps fp32 main weights and gradients under --bf16");
        break;
    case PLAN_OPT_AUTOCAST:
        arg(args, "--bf16", NULL);
        note(notes, "precision bf16-autocast (fp32 weights): Megatron has no autocast mode; --bf16 keeps bf16 "
             "weights with fp32 main copies");
        break;
    case PLAN_OPT_FP32: case PLAN_NPRECISION: break;
    }
    if (s->pp > 1 && p->pipe_engine != PLAN_PIPE_MEGATRON)
        note(notes, "%s: priced as DeepSpeed's pipeline engine (--pipe-engine %s); Megatron-LM's 1F1B batches its "
             "sends and overlaps the gradient reduction, so it runs faster than the plan says", s->module,
             plan_pipe_engine_name(p->pipe_engine));
    if (p->grad_accum != PLAN_ACCUM_FUSED)
        note(notes, "%s: priced with gradient accumulation %s (--grad-accum); Megatron-LM fuses it into the weight-gradient "
             "GEMM (gradient_accumulation_fusion, its default), so it runs faster than the plan says", s->module,
             plan_grad_accum_name(p->grad_accum));
    /* Megatron's --grad-reduce-in-bf16: its gradient buffer in bf16 and reduced so, as the plan prices a
     * module below ZeRO-3 (model_state_bytes); ZeRO-3's fp32 shards with bf16 reductions are FSDP's */
    if (p->grad_reduce == PLAN_REDUCE_BF16 && s->zero < 3) arg(args, "--grad-reduce-in-bf16", NULL);
    else if (p->grad_reduce == PLAN_REDUCE_BF16)
        note(notes, "%s: gradients reduced in bf16 (--grad-reduce bf16) not exported: Megatron's --grad-reduce-in-bf16 "
             "also keeps its gradient buffers in bf16, the plan's ZeRO-3 keeps fp32 shards", s->module);
}

/* --fp8 (plan_fp8): TransformerEngine's FP8 linears, E4M3 forward and E5M2
 * gradients (hybrid), with the primary FP8 weights the plan prices
 * (plan_fp8_props.primary_fp8_weights: --fp8-param-gather). torchao's recipe
 * has no Megatron form: TransformerEngine's tensorwise (current) scaling is the
 * nearest. Once for the whole job: Megatron's FP8 flags are global. */
static void megatron_fp8_args(const plan_t *p, cJSON *args, cJSON *notes)
{
    if (!plan_fp8_props_of(p->fp8)->on) return;
    arg(args, "--fp8-format", "hybrid");
    arg(args, "--fp8-recipe", p->fp8 == PLAN_FP8_DELAYED ? "delayed" : "tensorwise");
    arg(args, "--fp8-param-gather", NULL);
    if (p->fp8 == PLAN_FP8_TORCHAO)
        note(notes, "fp8 torchao (torchao's Float8Linear) exported as TransformerEngine's tensorwise recipe: the plan "
             "priced bf16 saved inputs and per-use weight casts, TransformerEngine saves FP8 inputs and keeps FP8 "
             "weights (plan again with --fp8 tensorwise)");
}

/* Whether the plan overlaps the language model's (s) TP collectives (plan_tp_overlaps). */
static bool llm_tp_overlaps(const plan_t *p, const plan_module *s)
{
    plan_options o = plan_options_of(p);
    return plan_tp_overlaps(&p->model.mod[p->model.llm], s, &o);
}

/* --tp-comm-overlap (plan_tp_overlaps): Megatron-LM's --tp-comm-overlap,
 * TransformerEngine's userbuffers at their default methods, as the plan
 * priced them; Megatron asserts --sequence-parallel with it, so only where the
 * language model's strategy has seqpar over tp > 1. */
static void megatron_tp_overlap_args(const plan_t *p, const plan_module *s, cJSON *args, cJSON *notes)
{
    if (!p->tp_comm_overlap) return;
    if (llm_tp_overlaps(p, s)) {
        arg(args, "--tp-comm-overlap", NULL);
        if (p->tp_style == PLAN_TP_DTENSOR)
            note(notes, "%s: the plan priced torchtitan's async TP (--tp-style dtensor); Megatron's --tp-comm-overlap "
                 "is TransformerEngine's userbuffers (plan again without --tp-style dtensor)", s->module);
    }
    else note(notes, "%s: --tp-comm-overlap not exported: its strategy has no sequence parallelism over tp > 1, "
              "which Megatron's TP communication overlap needs (the plan priced its collectives exposed)", s->module);
}

/* The plan's cross-entropy (--loss) where the trainer computes its own
 * (native; PLAN_LOSS_AUTO: the model code's, DeepSpeed): a note that its
 * memory differs from what the plan priced. */
static void loss_note(const plan_t *p, plan_loss native, const char *trainer, cJSON *notes)
{
    if (p->loss == PLAN_LOSS_AUTO) return;
    plan_options o = plan_options_of(p);
    if (plan_loss_of(&o) == native) return;
    note(notes, "loss %s not exported: %s computes %s%s, whose memory differs from what the plan priced",
         plan_loss_name(p->loss), trainer, native == PLAN_LOSS_AUTO ? "the model code's cross-entropy" : "its own ",
         native == PLAN_LOSS_AUTO ? "" : plan_loss_name(native));
}

/* bf16 AdamW states (--optim-dtype bf16, Apex's DistributedFusedAdam as NeMo
 * runs it): none of the three trainers keeps them, so a note that its
 * optimizer holds twice the bytes the plan priced. */
static void optim_dtype_note(const plan_t *p, const char *trainer, cJSON *notes)
{
    if (p->optim_dtype == PLAN_OPTIM_FP32) return;
    note(notes, "optimizer states %s (--optim-dtype) not exported: %s keeps fp32 master weights, m and v, 12 bytes an "
         "element where the plan priced 6", plan_optim_dtype_name(p->optim_dtype), trainer);
}

static cJSON *megatron_grid(const plan_t *p, int k)
{
    const plan_module *s = &p->mod[k];
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "name", k == p->model.llm ? "language" : s->module);
    cJSON_AddNumberToObject(g, "num_ranks", s->n_ranks);
    cJSON_AddNumberToObject(g, "tp", s->tp);
    cJSON_AddNumberToObject(g, "cp", s->sp);
    cJSON_AddNumberToObject(g, "pp", s->pp);
    cJSON_AddNumberToObject(g, "rank_offset", s->first_rank);
    return g;
}

static int export_megatron(const plan_t *p, cJSON *doc, cJSON *notes, char *err)
{
    int k = p->model.llm, gas;
    const plan_module *s = &p->mod[k];
    if (accumulation(p, k, &gas, err)) return UTIL_EINVAL;
    cJSON *args = cJSON_AddArrayToObject(doc, "args");
    cJSON *env = cJSON_AddObjectToObject(doc, "env");
    megatron_model_args(p, args);
    megatron_strategy_args(p, s, args, env, notes);
    megatron_fp8_args(p, args, notes);
    megatron_tp_overlap_args(p, s, args, notes);
    /* --attention: TransformerEngine picks cuDNN's fused attention on Hopper by itself (FusedAttention
     * preferred there), so a plan priced with FlashAttention-2 on such GPUs runs faster than it says */
    if (p->attention == PLAN_ATTN_FLASH2 && p->cluster.n_pools > 0 && cost_gpu_has_cudnn_attention(&p->cluster.pool[0].gpu))
        note(notes, "attention priced as FlashAttention-2; TransformerEngine runs cuDNN's fused attention on %s, faster "
             "(plan again with --attention cudnn)", p->cluster.pool[0].gpu.name);
    loss_note(p, PLAN_LOSS_VOCAB_PARALLEL, "Megatron-LM", notes);
    optim_dtype_note(p, "Megatron-LM", notes);
    cJSON_AddNumberToObject(doc, "world_size", s->n_ranks);
    cJSON *grids = cJSON_AddArrayToObject(doc, "mimo_module_grid_specs");
    for (int m = 0; m < p->n_modules; m++) {
        cJSON_AddItemToArray(grids, megatron_grid(p, m));
        const plan_module *e = &p->mod[m];
        char rc[24];
        if (m == k) continue;
        note(notes, "%s: ZeRO %d, recompute %s, micro-batch %d: set in the MIMO modality submodule's own config "
             "(Megatron's per-module settings are Python, not arguments)", e->module, e->zero,
             plan_recompute_label(e, rc, sizeof rc), e->micro_batch);
    }
    note(notes, "%s grids: %s", p->n_modules > 1 ? "MIMO" : "one module",
         p->placement == PLAN_COLOCATED ? "every module spans the same ranks (MIMO colocated)"
                                        : "modules on disjoint ranks (MIMO non-colocated)");
    return UTIL_OK;
}

/* ---- DeepSpeed ---- */

static cJSON *deepspeed_config(const plan_t *p, int k, int gas, cJSON *notes)
{
    const plan_module *s = &p->mod[k];
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "train_batch_size", p->work.global_batch);
    cJSON_AddNumberToObject(c, "train_micro_batch_size_per_gpu", s->micro_batch);
    cJSON_AddNumberToObject(c, "gradient_accumulation_steps", gas);
    /* deepspeed/runtime/pipe/engine.py (PipelineEngine.__init__) asserts "ZeRO-2 and ZeRO-3 are
     * incompatible with pipeline parallelism": a pipelined module's ZeRO-2 goes as stage 1 */
    int stage = s->pp > 1 && s->zero >= 2 ? 1 : s->zero;
    if (stage != s->zero)
        note(notes, "%s: ZeRO-%d exported as stage 1: DeepSpeed's PipelineEngine refuses ZeRO-2 and -3 beside "
             "pipeline stages; its gradients are then whole on each rank (dhp memory --strategy with zero=1 "
             "says what that costs)", s->module, s->zero);
    cJSON *z = cJSON_AddObjectToObject(c, "zero_optimization");
    cJSON_AddNumberToObject(z, "stage", stage);
    switch (p->precision) {
    case PLAN_OPT_MIXED_FP32: cJSON_AddBoolToObject(cJSON_AddObjectToObject(c, "bf16"), "enabled", true); break;
    case PLAN_OPT_PURE_BF16: {
        cJSON *b = cJSON_AddObjectToObject(c, "bf16");
        cJSON_AddBoolToObject(b, "enabled", true);
        cJSON_AddBoolToObject(b, "bf16_master_weights_and_grads", true);
        cJSON_AddBoolToObject(b, "bf16_optimizer_states", true);
        break;
    }
    case PLAN_OPT_AUTOCAST: {
        cJSON *a = cJSON_AddObjectToObject(c, "torch_autocast");
        cJSON_AddBoolToObject(a, "enabled", true);
        cJSON_AddStringToObject(a, "dtype", "bfloat16");
        break;
    }
    case PLAN_OPT_FP32: case PLAN_NPRECISION: break;
    }
    /* deepspeed/runtime/config.py get_communication_data_type: "fp32", "fp16" or "bf16" */
    if (p->grad_reduce == PLAN_REDUCE_BF16) cJSON_AddStringToObject(c, "communication_data_type", "bf16");
    if (s->sp > 1) cJSON_AddNumberToObject(c, "sequence_parallel_size", s->sp);
    if (plan_cp_of(&p->model.mod[k], s) == PLAN_CP_RING)
        note(notes, "%s: sp %d priced as ring attention; DeepSpeed's sequence parallelism is Ulysses (all-to-all), "
             "which needs tp x sp to divide the heads", s->module, s->sp);
    if (s->tp > 1) cJSON_AddNumberToObject(cJSON_AddObjectToObject(c, "tensor_parallel"), "autotp_size", s->tp);
    if (s->pp > 1) {
        cJSON *pp = cJSON_AddObjectToObject(c, "pipeline");
        cJSON_AddNumberToObject(pp, "stages", s->pp);
        cJSON_AddNumberToObject(pp, "activation_checkpoint_interval",
                                s->recompute == PLAN_RECOMP_FULL && s->recompute_layers == 0 ? 1 : 0);
        if (p->pipe_engine == PLAN_PIPE_MEGATRON)
            note(notes, "%s: pp %d priced as Megatron-LM's 1F1B; DeepSpeed's PipelineEngine blocks on each send and "
                 "reduces gradients after the flush: plan with --target megatron --pipe-engine deepspeed to price it",
                 s->module, s->pp);
        if (plan_vp(s) > 1)
            note(notes, "%s: vp %d not exported: DeepSpeed's PipelineEngine runs one model chunk a stage (no "
                 "interleaving)", s->module, plan_vp(s));
        const model_module *mm = &p->model.mod[k];
        int first = plan_stage_of(mm, s, 0).count, last = plan_stage_of(mm, s, s->pp - 1).count;
        note(notes, "%s: dhp's split: %d blocks on the first stage, %d on the last%s; DeepSpeed's PipelineModule "
             "takes it as its partition_method in the model code", s->module, first, last,
             s->split_ends ? " (split=ends: the embedding and the head a block each)" : "");
    }
    char rc[24];
    if (s->recompute != PLAN_RECOMP_NONE)
        note(notes, "%s: recompute %s: DeepSpeed leaves the granularity to the model code (%s)", s->module,
             plan_recompute_label(s, rc, sizeof rc),
             s->recompute != PLAN_RECOMP_FULL ? "checkpoint the MLP activation only"
             : s->recompute_layers > 0 ? "deepspeed.checkpointing.checkpoint around the first rc_layers blocks of each "
                                         "stage, the others run plainly"
                                       : "deepspeed.checkpointing.checkpoint around every block");
    if (s->seq_parallel && s->tp > 1)
        note(notes, "%s: Megatron-style sequence parallelism inside TP has no DeepSpeed config key", s->module);
    return c;
}

static int export_deepspeed(const plan_t *p, cJSON *doc, cJSON *notes, char *err)
{
    cJSON *mods = cJSON_AddArrayToObject(doc, "modules");
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        int gas;
        if (accumulation(p, k, &gas, err)) return UTIL_EINVAL;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "module", s->module);
        cJSON_AddNumberToObject(m, "first_rank", s->first_rank);
        cJSON_AddNumberToObject(m, "ranks", s->n_ranks);
        cJSON_AddNumberToObject(m, "data_parallel_size", s->dp);
        cJSON_AddItemToObject(m, "config", deepspeed_config(p, k, gas, notes));
        cJSON_AddItemToArray(mods, m);
    }
    note(notes, "one DeepSpeed engine per module (deepspeed.initialize with that module's config and process "
         "groups); the %s placement is dhp's", plan_placement_name(p->placement));
    if (plan_fp8_props_of(p->fp8)->on)
        note(notes, "fp8 %s: DeepSpeed's config has no FP8 linears; the model code must bring them "
             "(TransformerEngine's modules under te.fp8_autocast, or torchao's convert_to_float8_training)",
             plan_fp8_name(p->fp8));
    loss_note(p, PLAN_LOSS_AUTO, "DeepSpeed", notes);
    optim_dtype_note(p, "DeepSpeed", notes);
    if (p->attention == PLAN_ATTN_CUDNN)
        note(notes, "attention cudnn: DeepSpeed's config does not pick the attention kernel; the model code must "
             "run cuDNN's fused attention (TransformerEngine's DotProductAttention) as the plan priced");
    if (p->tp_comm_overlap)
        note(notes, "tp_comm_overlap not exported: DeepSpeed overlaps no tensor-parallel collective with its GEMMs "
             "(the plan priced %s)", p->tp_style == PLAN_TP_DTENSOR ? "torchtitan's async TP"
                                                                    : "TransformerEngine's userbuffers");
    return UTIL_OK;
}

/* ---- torchtitan ---- */

/* Partial full recomputation (rc_layers = N) in torchtitan's terms: its
 * layer-wise selective option k wraps every k-th block of each model part
 * in a full checkpoint (torchtitan/distributed/activation_checkpoint.py
 * _apply_layer_sac: a counter reset per model part, `count % k == 0`), so
 * floor(c / k) of a part's c blocks recompute where dhp recomputes the
 * first min(N, c) (plan_block_recompute): the same count, other positions,
 * which prices alike. The largest k that recomputes at least that many in
 * every part; a note where it recomputes more. */
static void torchtitan_layer_ac(const plan_t *p, int k, cJSON *ac, cJSON *notes)
{
    const plan_module *s = &p->mod[k];
    const model_module *mm = &p->model.mod[k];
    int parts = s->pp * plan_vp(s), freq = 1;
    for (int f = mm->layers; f > 1 && freq == 1; f--) {
        bool enough = true;
        for (int g = 0; g < parts && enough; g++) {
            int c = plan_vstage_of(mm, s, g).count;
            enough = c / f >= (s->recompute_layers < c ? s->recompute_layers : c);
        }
        if (enough) freq = f;
    }
    bool exact = true;
    for (int g = 0; g < parts; g++) {
        int c = plan_vstage_of(mm, s, g).count;
        exact = exact && c / freq == (s->recompute_layers < c ? s->recompute_layers : c);
    }
    char opt[16];
    snprintf(opt, sizeof opt, "%d", freq);
    cJSON_ReplaceItemInObject(ac, "mode", cJSON_CreateString(freq == 1 ? "full" : "selective"));
    if (freq > 1) cJSON_AddStringToObject(ac, "selective_ac_option", opt);
    if (!exact)
        note(notes, "%s: rc_layers %d: torchtitan's layer-wise checkpointing wraps every k-th block of a model part; "
             "k = %d recomputes more blocks than dhp's %d a part (more time, less memory than priced)", s->module,
             s->recompute_layers, freq, s->recompute_layers);
}

/* The LLM's pipeline in torchtitan 0.2.2's [parallelism] terms: the whole
 * per-rank batch in one pipeline pass of micro-batches (local_batch_size is
 * the dp rank's share, pipeline_parallel_microbatch_size the plan's
 * micro-batch), 1F1B or Interleaved1F1B, and dhp's split as the modules of
 * each model chunk (module_fqns_per_model_part, torchtitan's Llama names;
 * virtual stage g on rank g % pp, as torchtitan's looped schedules place
 * them), so an uneven split or split=ends goes across exactly. */
static void torchtitan_pipeline(const plan_t *p, const plan_module *s, cJSON *par, cJSON *tr)
{
    const model_module *mm = &p->model.mod[p->model.llm];
    int vp = plan_vp(s);
    cJSON_AddStringToObject(par, "pipeline_parallel_schedule", vp > 1 ? "Interleaved1F1B" : "1F1B");
    cJSON_AddNumberToObject(par, "pipeline_parallel_microbatch_size", s->micro_batch);
    cJSON *parts = cJSON_AddArrayToObject(par, "module_fqns_per_model_part");
    for (int g = 0; g < s->pp * vp; g++) {
        plan_stage v = plan_vstage_of(mm, s, g);
        cJSON *part = cJSON_CreateArray();
        char name[32];
        if (v.stem) cJSON_AddItemToArray(part, cJSON_CreateString("tok_embeddings"));
        for (int l = v.first; l < v.first + v.count; l++) {
            snprintf(name, sizeof name, "layers.%d", l);
            cJSON_AddItemToArray(part, cJSON_CreateString(name));
        }
        if (v.head) {
            cJSON_AddItemToArray(part, cJSON_CreateString("norm"));
            cJSON_AddItemToArray(part, cJSON_CreateString("output"));
        }
        cJSON_AddItemToArray(parts, part);
    }
    cJSON_ReplaceItemInObject(tr, "local_batch_size", cJSON_CreateNumber(p->work.global_batch / s->dp));
}

/* --fp8 in torchtitan 0.2.2's terms: the quantize.linear.float8 model
 * converter (torchao's Float8Linear, torchtitan/components/quantization/
 * float8.py) with tensorwise scaling, the output layer left in bf16 as the
 * plan prices it (filter_fqns). TransformerEngine's recipes have no torchtitan
 * form: a note. */
static void torchtitan_fp8(const plan_t *p, cJSON *toml, cJSON *notes)
{
    if (!plan_fp8_props_of(p->fp8)->on) return;
    cJSON *model = cJSON_AddObjectToObject(toml, "model");
    cJSON *conv = cJSON_AddArrayToObject(model, "converters");
    cJSON_AddItemToArray(conv, cJSON_CreateString("quantize.linear.float8"));
    cJSON *f8 = cJSON_AddObjectToObject(toml, "quantize.linear.float8");
    cJSON_AddStringToObject(f8, "recipe_name", "tensorwise");
    cJSON *skip = cJSON_AddArrayToObject(f8, "filter_fqns");
    cJSON_AddItemToArray(skip, cJSON_CreateString("output"));
    if (p->fp8 != PLAN_FP8_TORCHAO)
        note(notes, "fp8 %s (TransformerEngine) exported as torchao's tensorwise Float8Linear: it saves bf16 inputs "
             "and casts the weights at each use, which the plan did not price (plan again with --fp8 torchao)",
             plan_fp8_name(p->fp8));
}

/* torch.compile of the model (dhp prices the blocks' element-wise work fused,
 * as Inductor runs it; the loss stays eager, as --loss torch prices it:
 * components ["model"], torchtitan 0.2.2's [compile]); --tp-comm-overlap: the
 * plan's async TP (under --tp-style dtensor) as enable_async_tensor_parallel,
 * which needs the compile. */
static void torchtitan_compile(const plan_t *p, const plan_module *s, cJSON *toml, cJSON *par, cJSON *notes)
{
    cJSON *cc = cJSON_AddObjectToObject(toml, "compile");
    cJSON_AddBoolToObject(cc, "enable", true);
    cJSON *comp = cJSON_AddArrayToObject(cc, "components");
    cJSON_AddItemToArray(comp, cJSON_CreateString("model"));
    if (!p->tp_comm_overlap) return;
    if (!llm_tp_overlaps(p, s))
        note(notes, "tp_comm_overlap not exported: %s has no sequence parallelism over tp > 1 to overlap", s->module);
    else if (p->tp_style == PLAN_TP_DTENSOR)
        cJSON_AddBoolToObject(par, "enable_async_tensor_parallel", true);
    else
        note(notes, "tp_comm_overlap not exported: the plan priced TransformerEngine's userbuffers; torchtitan's async "
             "TP (enable_async_tensor_parallel) pipelines its collectives by its own methods (plan again with "
             "--tp-style dtensor)");
}

static int export_torchtitan(const plan_t *p, cJSON *doc, cJSON *notes, char *err)
{
    int k = p->model.llm, gas;
    const plan_module *s = &p->mod[k];
    if (accumulation(p, k, &gas, err)) return UTIL_EINVAL;
    cJSON *toml = cJSON_AddObjectToObject(doc, "toml");
    cJSON *par = cJSON_AddObjectToObject(toml, "parallelism");
    /* FSDP2: ZeRO-3 reshards after forward, ZeRO-1/2 keep the gathered
     * parameters to the backward ("never"), no ZeRO is plain replication. */
    cJSON_AddNumberToObject(par, "data_parallel_replicate_degree", s->zero == 0 ? s->dp : 1);
    cJSON_AddNumberToObject(par, "data_parallel_shard_degree", s->zero == 0 ? 1 : s->dp);
    if (s->zero > 0) cJSON_AddStringToObject(par, "fsdp_reshard_after_forward", s->zero == 3 ? "always" : "never");
    cJSON_AddNumberToObject(par, "tensor_parallel_degree", s->tp);
    cJSON_AddBoolToObject(par, "disable_loss_parallel", false);
    cJSON_AddNumberToObject(par, "pipeline_parallel_degree", s->pp);
    cJSON_AddNumberToObject(par, "context_parallel_degree", s->sp);
    cJSON *ac = cJSON_AddObjectToObject(toml, "activation_checkpoint");
    cJSON_AddStringToObject(ac, "mode", s->recompute == PLAN_RECOMP_FULL ? "full"
                                        : s->recompute == PLAN_RECOMP_SELECTIVE ? "selective" : "none");
    if (s->recompute == PLAN_RECOMP_SELECTIVE) cJSON_AddStringToObject(ac, "selective_ac_option", "op");
    if (s->recompute == PLAN_RECOMP_FULL && s->recompute_layers > 0) torchtitan_layer_ac(p, k, ac, notes);
    cJSON *tr = cJSON_AddObjectToObject(toml, "training");
    cJSON_AddNumberToObject(tr, "local_batch_size", s->micro_batch);
    cJSON_AddNumberToObject(tr, "global_batch_size", p->work.global_batch);
    cJSON_AddNumberToObject(tr, "seq_len", llm_seq_len(p));
    cJSON_AddStringToObject(tr, "mixed_precision_param", p->precision == PLAN_OPT_FP32 ? "float32" : "bfloat16");
    if (s->pp > 1) torchtitan_pipeline(p, s, par, tr);
    torchtitan_fp8(p, toml, notes);
    loss_note(p, PLAN_LOSS_TORCH, "torchtitan", notes);
    optim_dtype_note(p, "torchtitan", notes);
    if (p->attention == PLAN_ATTN_CUDNN)
        note(notes, "attention cudnn not exported: torchtitan 0.2.2's scaled_dot_product_attention picks its own "
             "backend (FlashAttention-2 on Hopper unless cuDNN's is enabled in PyTorch); the plan priced cuDNN's");
    torchtitan_compile(p, s, toml, par, notes);
    if (p->grad_reduce == PLAN_REDUCE_BF16)
        note(notes, "%s: gradients reduced in bf16 (--grad-reduce bf16) not exported: torchtitan 0.2.2's "
             "mixed_precision_reduce takes float32 only", s->module);
    if (s->zero == 1) note(notes, "%s: ZeRO-1 has no FSDP2 equivalent; exported as ZeRO-2 (reshard never)", s->module);
    /* torch/distributed/pipelining/stage.py (backward_maybe_with_nosync) turns an
     * FSDP2 stage's gradient sync off before every backward but the last */
    if (s->zero == 3 && s->pp > 1)
        note(notes, "%s: ZeRO-3 on pipeline stages: torchtitan's schedules (PyTorch's pipelining) reduce-scatter FSDP2 "
             "gradients at each stage's last backward only, holding the stage's whole gradients until then, where the "
             "plan reduce-scatters every micro-batch's (dhp memory --strategy with zero=1 prices whole gradients)",
             s->module);
    if (plan_cp_of(&p->model.mod[k], s) == PLAN_CP_ULYSSES)
        note(notes, "%s: torchtitan's context parallelism is ring attention, not the Ulysses all-to-all priced "
             "(--strategy cp=ring prices it)", s->module);
    if (s->tp > 1 && !s->seq_parallel) note(notes, "%s: torchtitan's TP always uses sequence parallelism", s->module);
    for (int m = 0; m < p->n_modules; m++)
        if (m != k) note(notes, "%s: torchtitan trains the language model only; the encoder is not exported",
                         p->mod[m].module);
    return UTIL_OK;
}

int cli_export(const plan_t *p, cli_trainer t, cJSON **out, char *err)
{
    static const char *names[] = {"megatron", "deepspeed", "torchtitan"};
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "trainer", names[t]);
    cJSON_AddStringToObject(doc, "model", p->model.name);
    cJSON_AddStringToObject(doc, "placement", plan_placement_name(p->placement));
    cJSON *notes = cJSON_CreateArray();
    int rc = t == CLI_MEGATRON ? export_megatron(p, doc, notes, err)
           : t == CLI_DEEPSPEED ? export_deepspeed(p, doc, notes, err) : export_torchtitan(p, doc, notes, err);
    cJSON_AddItemToObject(doc, "notes", notes);
    if (rc) { cJSON_Delete(doc); return rc; }
    *out = doc;
    return UTIL_OK;
}
