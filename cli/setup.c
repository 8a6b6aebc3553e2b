/* Option parsing shared by the planning subcommands. */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cli_setup_help =
    "  --model NAME|PATH     zoo model or model JSON (default qwen2.5-vl-32b; 'dhp models' lists the zoo)\n"
    "  --cluster NAME|PATH   cluster preset or cluster JSON (default 8xh100; 'dhp clusters' lists presets)\n"
    "  --batch N             global batch, samples per step (default 8)\n"
    "  --images N            images per sample, >= 1 (default 1 for models with a vision encoder)\n"
    "  --vision-tokens N     vision tokens (patches) per image, before the merger (default 16384;\n"
    "                        a CLIP tower (LLaVA): the patches of its image_size)\n"
    "  --image-size PX       square image side in pixels instead of --vision-tokens\n"
    "  --audio-frames N      audio encoder frames per sample after its conv stem (default: its learned\n"
    "                        positions' rows, else 1500, Whisper's 30 s)\n"
    "  --text-tokens N       text tokens per sample (default 512)\n"
    "  --precision P         bf16-mixed (bf16 weights + fp32 master; default), bf16-autocast (fp32\n"
    "                        weights, bf16 compute; the --compare default), bf16-pure (Megatron only),\n"
    "                        or fp32\n"
    "  --target T            what memory and time describe: dhp (what `dhp run` allocates and issues;\n"
    "                        the default) or megatron (Megatron-LM / DeepSpeed's published formulas, for\n"
    "                        a plan exported to them; the default for bf16-pure)\n"
    "  --zero3 Z             the megatron target's ZeRO-3: units (one gather per layer, hidden behind the\n"
    "                        compute: FSDP; default), fsdp2 (the same, each gathered layer copied out of\n"
    "                        its all-gather buffer: PyTorch's fully_shard, torchtitan) or deepspeed-2021\n"
    "                        (DeepSpeed v0.3-0.4: one per weight tensor, the GPU drained before each)\n"
    "  --adamw A             the megatron target's AdamW step: fused (one pass over the states: apex,\n"
    "                        DeepSpeed, torch fused=True; default) or foreach (one pass per op: torch's\n"
    "                        default AdamW, per-parameter loops)\n"
    "  --optim-dtype D       the megatron target's AdamW states under bf16-mixed: fp32 (master, m, v;\n"
    "                        default) or bf16 (Apex DistributedFusedAdam dtype bf16, NeMo's optim.dtype:\n"
    "                        6 bytes an element, not 12)\n"
    "  --grad-reduce R       the megatron target's data-parallel gradient reduction: grads (in the\n"
    "                        gradients' dtype, fp32 under bf16-mixed and -autocast; default) or bf16\n"
    "                        (2 bytes an element: PyTorch FSDP's reduce_dtype bf16, or param_dtype bf16\n"
    "                        with reduce_dtype unset; and the width of fp16 gradients reduced as they\n"
    "                        are, Megatron-LM / DeepSpeed --fp16 without fp32 accumulation); below\n"
    "                        ZeRO-3 the gradients are held in it too (Megatron --grad-reduce-in-bf16)\n"
    "  --tp-style T          the megatron target's tensor parallelism: megatron (Megatron-LM's; default)\n"
    "                        or dtensor (PyTorch's ColwiseParallel / RowwiseParallel / SequenceParallel,\n"
    "                        torchtitan: a copy beside each sequence-dim collective, no backward re-gather)\n"
    "  --pipe-engine E       the megatron target's pipeline: megatron (Megatron-LM's 1F1B; default),\n"
    "                        deepspeed (DeepSpeed's PipelineEngine: blocking sends, the gradient reduced\n"
    "                        after the flush) or deepspeed-2021 (the same up to v0.5.3: gradients sent\n"
    "                        whole, not partitioned over tp)\n"
    "  --grad-accum A        the megatron target's gradient accumulation over micro-batches: fused\n"
    "                        (Megatron-LM's gradient_accumulation_fusion; default), add (autograd's\n"
    "                        grad += new from the second micro-batch: Megatron-LM before 2022, DeepSpeed\n"
    "                        fp16) or bf16-optimizer (DeepSpeed's BF16_Optimizer: a cast and an fp32 add\n"
    "                        after every backward)\n"
    "  --fp8 R               the megatron target's FP8 linears (the blocks' linear GEMMs at the GPU's FP8\n"
    "                        peak; attention, embedding and output layer in bf16; GPUs with FP8 only):\n"
    "                        delayed or tensorwise (TransformerEngine's delayed / current scaling, FP8\n"
    "                        saved inputs and primary FP8 weights: Megatron --fp8-recipe, --fp8-param-\n"
    "                        gather), torchao (torchtitan's Float8Linear: bf16 saved inputs, weights cast\n"
    "                        at each use) or none (default)\n"
    "  --tp-comm-overlap     the megatron target's TP communication overlap (modules with seqpar over\n"
    "                        tp > 1): TransformerEngine's userbuffers pipeline each sequence-parallel\n"
    "                        all-gather and reduce-scatter of the blocks with its linear's GEMM\n"
    "                        (Megatron --tp-comm-overlap); under --tp-style dtensor torchtitan's async\n"
    "                        TP (enable_async_tensor_parallel: the forward's pairs and the backward's\n"
    "                        all-gathers fused with their matmuls)\n"
    "  --loss L              the megatron target's cross-entropy, what its memory holds: vocab-parallel\n"
    "                        (Megatron-LM's: one fp32 copy, in place), torch (F.cross_entropy on fp32\n"
    "                        logits as torchtitan: three fp32 [t, V] tensors in its backward), fused\n"
    "                        (flash-attn's, llm-foundry's default: the bf16 logits and their gradient)\n"
    "                        or auto (default: torch under bf16-autocast, else vocab-parallel)\n"
    "  --attention K         the megatron target's attention kernel: flash2 (FlashAttention-2; default)\n"
    "                        or cudnn (cuDNN's fused attention, which TransformerEngine runs on Hopper:\n"
    "                        the GPU file's attn_cudnn_speedup over FlashAttention-2)\n"
    "  --tf32                precision fp32's GEMMs on TF32 tensor cores (dhp run --tf32): priced at the\n"
    "                        GPU's TF32 peak instead of its fp32 (CUDA-core) peak\n"
    "  --backend B           the dhp target's memory on the backend dhp run uses: cuda (its cuBLASLt\n"
    "                        workspace, 32 MiB a GPU) or cpu (none); default: the cluster's device's\n"
    "  --json                machine-readable output on stdout\n";

void cli_setup_default(cli_setup *s)
{
    memset(s, 0, sizeof *s);
    s->model = "qwen2.5-vl-32b";
    s->cluster = "8xh100";
    plan_options_default(&s->opt);
    s->batch = 8;
    s->images = -1;
    s->vision_tokens = -1;   /* cli_setup_load: 16384, or what a fixed-size CLIP tower takes */
    s->audio_frames = -1;
    s->text_tokens = 512;
}

int cli_int_arg(const char *cmd, const char *opt, const char *val, int lo, int hi, int *out)
{
    char *end;
    if (!val) return cli_usage_error(cmd, "%s needs a value", opt);
    long v = strtol(val, &end, 10);
    if (*val == '\0' || *end != '\0')
        return cli_usage_error(cmd, "%s: '%s' is not an integer", opt, val);
    if (v < lo || v > hi)
        return cli_usage_error(cmd, "%s: %ld is out of range [%d, %d]", opt, v, lo, hi);
    *out = (int)v;
    return 0;
}

/* An option whose value names one of an enum's members, parsed (rc) by its
 * planner parser, which said why not (why): 1 with the value consumed and
 * *given set, 2 (message printed) without a value or with a bad one. */
static int enum_arg(const char *cmd, const char *opt, const char *val, int rc, const char *why, bool *given, int *i)
{
    if (!val) { cli_usage_error(cmd, "%s needs a value", opt); return 2; }
    if (rc) { cli_usage_error(cmd, "%s: %s", opt, why); return 2; }
    if (given) *given = true;
    (*i)++;
    return 1;
}

int cli_setup_arg(const char *cmd, cli_setup *s, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    const char *val = *i + 1 < argc ? argv[*i + 1] : NULL;
    struct { const char *name; int *dst; int lo; } ints[] = {
        { "--batch", &s->batch, 1 }, { "--images", &s->images, 1 }, { "--vision-tokens", &s->vision_tokens, 1 },
        { "--image-size", &s->image_size, 1 }, { "--audio-frames", &s->audio_frames, 0 },
        { "--text-tokens", &s->text_tokens, 1 },
    };
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++)
        if (!strcmp(a, ints[k].name)) {
            if (cli_int_arg(cmd, a, val, ints[k].lo, 1 << 28, ints[k].dst)) return 2;
            (*i)++;
            return 1;
        }
    if (!strcmp(a, "--model") || !strcmp(a, "--cluster")) {
        if (!val) { cli_usage_error(cmd, "%s needs a value", a); return 2; }
        if (!strcmp(a, "--model")) s->model = val;
        else s->cluster = val;
        (*i)++;
        return 1;
    }
    plan_options *o = &s->opt;
    char why[UTIL_ERR_LEN] = "";
    if (!strcmp(a, "--precision"))
        return enum_arg(cmd, a, val, val ? plan_precision_parse(val, &o->precision, why) : 0, why, &s->precision_given, i);
    if (!strcmp(a, "--target"))
        return enum_arg(cmd, a, val, val ? plan_target_parse(val, &o->target, why) : 0, why, &s->target_given, i);
    if (!strcmp(a, "--zero3")) return enum_arg(cmd, a, val, val ? plan_zero3_parse(val, &o->zero3, why) : 0, why, NULL, i);
    if (!strcmp(a, "--adamw")) return enum_arg(cmd, a, val, val ? plan_adamw_parse(val, &o->adamw, why) : 0, why, NULL, i);
    if (!strcmp(a, "--optim-dtype"))
        return enum_arg(cmd, a, val, val ? plan_optim_dtype_parse(val, &o->optim_dtype, why) : 0, why, NULL, i);
    if (!strcmp(a, "--grad-reduce"))
        return enum_arg(cmd, a, val, val ? plan_grad_reduce_parse(val, &o->grad_reduce, why) : 0, why, NULL, i);
    if (!strcmp(a, "--tp-style"))
        return enum_arg(cmd, a, val, val ? plan_tp_style_parse(val, &o->tp_style, why) : 0, why, NULL, i);
    if (!strcmp(a, "--pipe-engine"))
        return enum_arg(cmd, a, val, val ? plan_pipe_engine_parse(val, &o->pipe_engine, why) : 0, why, NULL, i);
    if (!strcmp(a, "--grad-accum"))
        return enum_arg(cmd, a, val, val ? plan_grad_accum_parse(val, &o->grad_accum, why) : 0, why, NULL, i);
    if (!strcmp(a, "--fp8")) return enum_arg(cmd, a, val, val ? plan_fp8_parse(val, &o->fp8, why) : 0, why, NULL, i);
    if (!strcmp(a, "--tp-comm-overlap")) { o->tp_comm_overlap = true; return 1; }
    if (!strcmp(a, "--loss")) return enum_arg(cmd, a, val, val ? plan_loss_parse(val, &o->loss, why) : 0, why, NULL, i);
    if (!strcmp(a, "--attention"))
        return enum_arg(cmd, a, val, val ? plan_attention_parse(val, &o->attention, why) : 0, why, NULL, i);
    if (!strcmp(a, "--backend"))
        return enum_arg(cmd, a, val, val ? plan_backend_parse(val, &o->backend, why) : 0, why, &s->backend_given, i);
    if (!strcmp(a, "--tf32")) { o->tf32 = true; return 1; }
    if (!strcmp(a, "--json")) { s->json = true; return 1; }
    return 0;
}

void cli_setup_options(const cli_setup *s, plan_options *o)
{
    *o = s->opt;
    if (!s->target_given) o->target = plan_target_default(o->precision);
}

void cli_setup_backend(const cli_setup *s, plan_t *p)
{
    if (s->backend_given) p->backend = s->opt.backend;
}

int cli_setup_load(const char *cmd, const cli_setup *s, model_t *m, cost_cluster *c, plan_workload *w)
{
    char err[UTIL_ERR_LEN];
    plan_options o;
    cli_setup_options(s, &o);
    if (plan_options_check(&o, NULL, err)) return cli_usage_error(cmd, "%s", err);
    if (model_load(s->model, m, err)) return cli_usage_error(cmd, "%s", err);
    if (cost_cluster_load(s->cluster, c, err)) return cli_usage_error(cmd, "%s", err);
    if (plan_options_pool_check(&o, c, err)) return cli_usage_error(cmd, "%s", err);
    memset(w, 0, sizeof *w);
    w->global_batch = s->batch;
    w->text_tokens = s->text_tokens;
    bool vision = model_find_kind(m, MODEL_VISION) >= 0;
    int ai = model_find_kind(m, MODEL_AUDIO);
    w->images_per_sample = s->images >= 0 ? s->images : (vision ? 1 : 0);
    if (w->images_per_sample > 0) {
        int vi = model_find_kind(m, MODEL_VISION);
        /* a CLIP tower takes images of its image_size only: a position per patch and the class row */
        bool clip = vi >= 0 && plan_module_clip(&m->mod[vi]) && m->mod[vi].max_positions > 1;
        w->image_tokens = s->vision_tokens >= 0 ? s->vision_tokens : clip ? m->mod[vi].max_positions - 1 : 16384;
        if (s->image_size > 0 && plan_image_tokens_from_pixels(m, s->image_size, &w->image_tokens, err))
            return cli_usage_error(cmd, "%s", err);
    }
    w->audio_frames = s->audio_frames >= 0 ? s->audio_frames : (ai >= 0 ? plan_audio_default_frames(&m->mod[ai]) : 0);
    if (plan_workload_validate(m, w, err)) return cli_usage_error(cmd, "%s", err);
    return 0;
}
