/* The plan file (schema "dhp.plan/1"): everything the executor needs —
 * model, cluster, workload, placement and each module's ranks and degrees —
 * plus the planner's predictions. Written atomically. */
#include "planner/planner_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every enum of the plan and its options by name: each table is the one
 * list of its names (util_name_index parses, and says what it holds when a
 * value is not one of them). */
static const char *placement_names[] = { "colocated", "disaggregated" };
static const char *recompute_names[] = { "none", "selective", "full", "op" };
static const char *precision_names[PLAN_NPRECISION] = { "bf16-mixed", "bf16-pure", "bf16-autocast", "fp32" };
static const char *target_names[PLAN_NTARGET] = { "megatron", "dhp" };
static const char *zero3_names[PLAN_NZERO3] = { "units", "deepspeed-2021", "fsdp2" };
static const char *adamw_names[PLAN_NADAMW] = { "fused", "foreach" };
static const char *optim_dtype_names[PLAN_NOPTIM_DTYPE] = { "fp32", "bf16" };
static const char *grad_reduce_names[PLAN_NREDUCE] = { "grads", "bf16" };
static const char *tp_style_names[PLAN_NTP_STYLE] = { "megatron", "dtensor" };
static const char *pipe_engine_names[PLAN_NPIPE] = { "megatron", "deepspeed-2021", "deepspeed" };
/* Megatron-LM's 1F1B; DeepSpeed's PipelineEngine before and after PR 1407
 * (planner/framework.h, plan_pipe_engine; the gathers: planner/cost_hop.c). */
static const plan_pipe_props pipe_engine_props[PLAN_NPIPE] = {
    [PLAN_PIPE_MEGATRON] = { .blocking = false, .reduce_after_flush = false, .interleaves = true, .grad_whole = false,
                             .grad_gathers = 1, .zero_on_stages = 3 },
    [PLAN_PIPE_DEEPSPEED_2021] = { .blocking = true, .reduce_after_flush = true, .interleaves = false,
                                   .grad_whole = true, .grad_gathers = 1, .zero_on_stages = 1 },
    [PLAN_PIPE_DEEPSPEED] = { .blocking = true, .reduce_after_flush = true, .interleaves = false, .grad_whole = false,
                              .grad_gathers = 2, .zero_on_stages = 1 },
};
static const char *grad_accum_names[PLAN_NACCUM] = { "fused", "add", "bf16-optimizer" };
static const char *fp8_names[PLAN_NFP8] = { "none", "delayed", "tensorwise", "torchao" };
static const char *loss_names[PLAN_NLOSS] = { "auto", "vocab-parallel", "torch", "fused" };
static const char *attention_names[PLAN_NATTN] = { "flash2", "cudnn" };
/* planner/framework.h, plan_loss (auto: resolved by plan_loss_props_of). */
static const plan_loss_props loss_props[PLAN_NLOSS] = {
    [PLAN_LOSS_VOCAB_PARALLEL] = { .in_fp32 = true, .fp32_copies_fwd = 1, .fp32_copies_bwd = 1, .fp32_copies_fwd_tp = 1,
                                   .fp32_copies_bwd_tp = 1, .logits_kept_in_bwd = true, .grad_copy = false },
    /* forward: the fp32 copy and log_softmax's output; backward: that output (saved), nll_loss's
     * dense gradient and log_softmax's input gradient; loss_parallel one more each way */
    [PLAN_LOSS_TORCH] = { .in_fp32 = true, .fp32_copies_fwd = 2, .fp32_copies_bwd = 3, .fp32_copies_fwd_tp = 3,
                          .fp32_copies_bwd_tp = 4, .logits_kept_in_bwd = false, .grad_copy = false },
    [PLAN_LOSS_FUSED] = { .in_fp32 = false, .fp32_copies_fwd = 0, .fp32_copies_bwd = 0, .fp32_copies_fwd_tp = 0,
                          .fp32_copies_bwd_tp = 0, .logits_kept_in_bwd = true, .grad_copy = true },
};
/* planner/framework.h, plan_fp8. */
static const plan_fp8_props fp8_props[PLAN_NFP8] = {
    [PLAN_FP8_NONE] = { .on = false },
    [PLAN_FP8_DELAYED] = { .on = true, .what = "TransformerEngine, delayed scaling, FP8 weights", .saves_fp8_inputs = true, .primary_fp8_weights = true, .amax_pass = false,
                           .norm_casts = true, .tp_gathers_fp8 = true },
    [PLAN_FP8_TENSORWISE] = { .on = true, .what = "TransformerEngine, current scaling, FP8 weights", .saves_fp8_inputs = true, .primary_fp8_weights = true, .amax_pass = true,
                              .norm_casts = true, .tp_gathers_fp8 = true },
    [PLAN_FP8_TORCHAO] = { .on = true, .what = "torchao's Float8Linear, tensorwise scaling", .saves_fp8_inputs = false, .primary_fp8_weights = false, .amax_pass = true,
                           .norm_casts = false, .tp_gathers_fp8 = true },
};

PLAN_ENUM_PARSE(plan_placement_parse, plan_placement, placement_names, 2)
PLAN_ENUM_PARSE(plan_recompute_parse, plan_recompute, recompute_names, 4)
PLAN_ENUM_PARSE(plan_precision_parse, plan_precision, precision_names, PLAN_NPRECISION)
PLAN_ENUM_PARSE(plan_target_parse, plan_target, target_names, PLAN_NTARGET)
PLAN_ENUM_PARSE(plan_zero3_parse, plan_zero3, zero3_names, PLAN_NZERO3)
PLAN_ENUM_PARSE(plan_adamw_parse, plan_adamw, adamw_names, PLAN_NADAMW)
PLAN_ENUM_PARSE(plan_optim_dtype_parse, plan_optim_dtype, optim_dtype_names, PLAN_NOPTIM_DTYPE)
PLAN_ENUM_PARSE(plan_grad_reduce_parse, plan_grad_reduce, grad_reduce_names, PLAN_NREDUCE)
PLAN_ENUM_PARSE(plan_tp_style_parse, plan_tp_style, tp_style_names, PLAN_NTP_STYLE)
PLAN_ENUM_PARSE(plan_pipe_engine_parse, plan_pipe_engine, pipe_engine_names, PLAN_NPIPE)
PLAN_ENUM_PARSE(plan_grad_accum_parse, plan_grad_accum, grad_accum_names, PLAN_NACCUM)
PLAN_ENUM_PARSE(plan_fp8_parse, plan_fp8, fp8_names, PLAN_NFP8)
PLAN_ENUM_PARSE(plan_loss_parse, plan_loss, loss_names, PLAN_NLOSS)
PLAN_ENUM_PARSE(plan_attention_parse, plan_attention, attention_names, PLAN_NATTN)

const char *plan_precision_name(plan_precision p) { return precision_names[p]; }
const char *plan_target_name(plan_target t) { return t >= 0 && t < PLAN_NTARGET ? target_names[t] : "?"; }
const char *plan_adamw_name(plan_adamw a) { return a >= 0 && a < PLAN_NADAMW ? adamw_names[a] : "?"; }
const char *plan_optim_dtype_name(plan_optim_dtype d)
{
    return d >= 0 && d < PLAN_NOPTIM_DTYPE ? optim_dtype_names[d] : "?";
}
const char *plan_grad_reduce_name(plan_grad_reduce r) { return r >= 0 && r < PLAN_NREDUCE ? grad_reduce_names[r] : "?"; }
const char *plan_tp_style_name(plan_tp_style t) { return t >= 0 && t < PLAN_NTP_STYLE ? tp_style_names[t] : "?"; }
const char *plan_pipe_engine_name(plan_pipe_engine e) { return e >= 0 && e < PLAN_NPIPE ? pipe_engine_names[e] : "?"; }
const plan_pipe_props *plan_pipe_engine_props(plan_pipe_engine e)
{
    return &pipe_engine_props[e >= 0 && e < PLAN_NPIPE ? e : PLAN_PIPE_MEGATRON];
}
const char *plan_grad_accum_name(plan_grad_accum a) { return a >= 0 && a < PLAN_NACCUM ? grad_accum_names[a] : "?"; }
const char *plan_fp8_name(plan_fp8 f) { return f >= 0 && f < PLAN_NFP8 ? fp8_names[f] : "?"; }
const char *plan_loss_name(plan_loss l) { return l >= 0 && l < PLAN_NLOSS ? loss_names[l] : "?"; }
const char *plan_attention_name(plan_attention a) { return a >= 0 && a < PLAN_NATTN ? attention_names[a] : "?"; }
plan_loss plan_loss_of(const plan_options *o)
{
    if (o->loss > PLAN_LOSS_AUTO && o->loss < PLAN_NLOSS) return o->loss;
    return o->precision == PLAN_OPT_AUTOCAST ? PLAN_LOSS_TORCH : PLAN_LOSS_VOCAB_PARALLEL;
}
const plan_loss_props *plan_loss_props_of(const plan_options *o) { return &loss_props[plan_loss_of(o)]; }
const plan_fp8_props *plan_fp8_props_of(plan_fp8 f) { return &fp8_props[f >= 0 && f < PLAN_NFP8 ? f : PLAN_FP8_NONE]; }
const char *plan_zero3_name(plan_zero3 z) { return z >= 0 && z < PLAN_NZERO3 ? zero3_names[z] : "?"; }
const char *plan_placement_name(plan_placement p) { return placement_names[p]; }
const char *plan_recompute_name(plan_recompute r) { return recompute_names[r]; }

const char *plan_recompute_label(const plan_module *s, char *buf, size_t n)
{
    if (s->recompute == PLAN_RECOMP_FULL && s->recompute_layers > 0)
        snprintf(buf, n, "full:%d", s->recompute_layers);
    else
        snprintf(buf, n, "%s", recompute_names[s->recompute]);
    return buf;
}

cJSON *plan_module_to_json(const plan_module *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "module", s->module);
    cJSON_AddNumberToObject(o, "pool", s->pool);
    cJSON_AddNumberToObject(o, "first_rank", s->first_rank);
    cJSON_AddNumberToObject(o, "n_ranks", s->n_ranks);
    cJSON_AddNumberToObject(o, "dp", s->dp);
    cJSON_AddNumberToObject(o, "tp", s->tp);
    cJSON_AddNumberToObject(o, "sp", s->sp);
    cJSON_AddNumberToObject(o, "pp", s->pp);
    cJSON_AddNumberToObject(o, "zero", s->zero);
    cJSON_AddNumberToObject(o, "micro_batch", s->micro_batch);
    cJSON_AddStringToObject(o, "recompute", recompute_names[s->recompute]);
    if (s->recompute_layers > 0) cJSON_AddNumberToObject(o, "recompute_layers", s->recompute_layers);
    cJSON_AddBoolToObject(o, "seq_parallel", s->seq_parallel);
    if (plan_vp(s) > 1) cJSON_AddNumberToObject(o, "vp", s->vp);
    if (s->split_ends) cJSON_AddBoolToObject(o, "split_ends", true);
    if (s->cp != PLAN_CP_NONE) cJSON_AddStringToObject(o, "cp", plan_cp_name(s->cp));
    if (plan_stage_layers_given(s)) {   /* an explicit split; otherwise plan_stage_of's default */
        cJSON *a = cJSON_AddArrayToObject(o, "stage_layers");
        for (int i = 0; i < s->pp && i < PLAN_MAX_PP; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(s->stage_layers[i]));
    }
    return o;
}

static cJSON *prediction_to_json(const plan_t *p)
{
    const plan_prediction *pr = &p->pred;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step_time_s", pr->step_time_s);
    cJSON_AddNumberToObject(o, "analytic_step_time_s", pr->analytic_step_time_s);
    cJSON_AddBoolToObject(o, "simulated", pr->simulated);
    cJSON_AddNumberToObject(o, "samples_per_s", pr->samples_per_s);
    cJSON_AddNumberToObject(o, "vision_tokens_per_s", pr->vision_tokens_per_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", pr->tokens_per_s);
    cJSON_AddNumberToObject(o, "mfu", pr->mfu);
    cJSON_AddNumberToObject(o, "model_flops", pr->model_flops);
    cJSON *mem = cJSON_AddArrayToObject(o, "peak_mem_bytes");
    for (int k = 0; k < p->n_modules; k++) cJSON_AddItemToArray(mem, cJSON_CreateNumber(pr->peak_mem_bytes[k]));
    cJSON_AddBoolToObject(o, "fits", pr->fits);
    return o;
}

cJSON *plan_to_json(const plan_t *p)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "schema", PLAN_SCHEMA);
    cJSON_AddStringToObject(root, "label", p->label);
    cJSON_AddItemToObject(root, "model", model_to_json(&p->model));
    cJSON_AddItemToObject(root, "cluster", cost_cluster_to_json(&p->cluster));
    cJSON *w = cJSON_AddObjectToObject(root, "workload");
    cJSON_AddNumberToObject(w, "global_batch", p->work.global_batch);
    cJSON_AddNumberToObject(w, "images_per_sample", p->work.images_per_sample);
    cJSON_AddNumberToObject(w, "image_tokens", p->work.image_tokens);
    cJSON_AddNumberToObject(w, "audio_frames", p->work.audio_frames);
    cJSON_AddNumberToObject(w, "text_tokens", p->work.text_tokens);
    cJSON_AddStringToObject(root, "placement", placement_names[p->placement]);
    cJSON_AddStringToObject(root, "schedule", p->placement == PLAN_COLOCATED ? "in-turn" : "1f1b-across-modules");
    cJSON_AddStringToObject(root, "precision", precision_names[p->precision]);
    cJSON_AddStringToObject(root, "target", plan_target_name(p->target));
    if (p->zero3 != PLAN_ZERO3_UNITS) cJSON_AddStringToObject(root, "zero3", plan_zero3_name(p->zero3));
    if (p->adamw != PLAN_ADAMW_FUSED) cJSON_AddStringToObject(root, "adamw", plan_adamw_name(p->adamw));
    if (p->optim_dtype != PLAN_OPTIM_FP32)
        cJSON_AddStringToObject(root, "optim_dtype", plan_optim_dtype_name(p->optim_dtype));
    if (p->grad_reduce != PLAN_REDUCE_GRADS) cJSON_AddStringToObject(root, "grad_reduce", plan_grad_reduce_name(p->grad_reduce));
    if (p->tp_style != PLAN_TP_MEGATRON) cJSON_AddStringToObject(root, "tp_style", plan_tp_style_name(p->tp_style));
    if (p->pipe_engine != PLAN_PIPE_MEGATRON) cJSON_AddStringToObject(root, "pipe_engine", plan_pipe_engine_name(p->pipe_engine));
    if (p->grad_accum != PLAN_ACCUM_FUSED) cJSON_AddStringToObject(root, "grad_accum", plan_grad_accum_name(p->grad_accum));
    if (p->tf32) cJSON_AddBoolToObject(root, "tf32", true);
    if (p->fp8 != PLAN_FP8_NONE) cJSON_AddStringToObject(root, "fp8", plan_fp8_name(p->fp8));
    if (p->tp_comm_overlap) cJSON_AddBoolToObject(root, "tp_comm_overlap", true);
    if (p->loss != PLAN_LOSS_AUTO) cJSON_AddStringToObject(root, "loss", plan_loss_name(p->loss));
    if (p->attention != PLAN_ATTN_FLASH2) cJSON_AddStringToObject(root, "attention", plan_attention_name(p->attention));
    cJSON_AddNumberToObject(root, "world_size", p->world_size);
    cJSON_AddNumberToObject(root, "n_micro", p->n_micro);
    cJSON *mods = cJSON_AddArrayToObject(root, "modules");
    for (int k = 0; k < p->n_modules; k++) cJSON_AddItemToArray(mods, plan_module_to_json(&p->mod[k]));
    cJSON_AddItemToObject(root, "prediction", prediction_to_json(p));
    return root;
}

int plan_write(const char *path, const plan_t *p, char *err)
{
    cJSON *root = plan_to_json(p);
    int rc = util_json_write(path, root, err);
    cJSON_Delete(root);
    return rc;
}

/* Re-serialises a sub-object and hands it to its module's text parser. */
static int parse_sub(const cJSON *root, const char *key, const char *what, bool is_model, void *out, char *err)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsObject(o)) return util_fail(err, UTIL_EINVAL, "%s: %s: required object is missing", what, key);
    char *text = cJSON_PrintUnformatted(o);
    if (!text) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", what);
    char ctx[300];
    snprintf(ctx, sizeof ctx, "%s: %s", what, key);
    int rc = is_model ? model_parse_json(text, ctx, out, err) : cost_cluster_parse_json(text, ctx, out, err);
    free(text);
    return rc;
}

static int parse_module(const cJSON *o, const char *ctx, plan_module *s, char *err)
{
    long v;
    int rc;
    char buf[MODEL_NAME_LEN];
    if (!cJSON_IsObject(o)) return util_fail(err, UTIL_EINVAL, "%s: must be an object", ctx);
    if ((rc = util_json_str(o, ctx, "module", true, NULL, s->module, sizeof s->module, err))) return rc;
#define INT_FIELD(name, lo, hi, req, dflt) \
    do { if ((rc = util_json_int(o, ctx, #name, req, lo, hi, dflt, &v, err))) return rc; s->name = (int)v; } while (0);
    INT_FIELD(pool, 0, COST_MAX_POOLS - 1, false, 0)
    INT_FIELD(first_rank, 0, 1 << 24, true, 0)
    INT_FIELD(n_ranks, 1, 1 << 24, true, 1)
    INT_FIELD(dp, 1, 1 << 24, true, 1)
    INT_FIELD(tp, 1, 1024, true, 1)
    INT_FIELD(sp, 1, 1 << 16, true, 1)
    INT_FIELD(pp, 1, 1024, true, 1)
    INT_FIELD(zero, 0, 3, true, 0)
    INT_FIELD(micro_batch, 1, 1 << 20, true, 1)
    INT_FIELD(vp, 1, 1024, false, 1)
    INT_FIELD(recompute_layers, 0, 1 << 20, false, 0)
#undef INT_FIELD
    if ((rc = util_json_str(o, ctx, "recompute", false, "none", buf, sizeof buf, err))) return rc;
    char why[UTIL_ERR_LEN];
    if (plan_recompute_parse(buf, &s->recompute, why)) return util_fail(err, UTIL_EINVAL, "%s.recompute: %s", ctx, why);
    if ((rc = util_json_bool(o, ctx, "seq_parallel", false, false, &s->seq_parallel, err))) return rc;
    if ((rc = util_json_bool(o, ctx, "split_ends", false, false, &s->split_ends, err))) return rc;
    if ((rc = util_json_str(o, ctx, "cp", false, "auto", buf, sizeof buf, err))) return rc;
    if (!plan_cp_parse(buf, &s->cp)) return util_fail(err, UTIL_EINVAL, "%s.cp: '%s' is not ulysses, ring or auto", ctx, buf);
    memset(s->stage_layers, 0, sizeof s->stage_layers);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "stage_layers");
    if (!a) return UTIL_OK;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != s->pp || s->pp > PLAN_MAX_PP)
        return util_fail(err, UTIL_EINVAL, "%s.stage_layers: must be an array of pp = %d block counts (at most %d)", ctx, s->pp, PLAN_MAX_PP);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 1 || e->valuedouble > (1 << 20) || e->valuedouble != (int)e->valuedouble)
            return util_fail(err, UTIL_EINVAL, "%s.stage_layers[%d]: must be a whole number of blocks >= 1", ctx, i);
        s->stage_layers[i] = (int)e->valuedouble;
    }
    return UTIL_OK;
}

static int parse_workload(const cJSON *root, const char *what, plan_workload *w, char *err)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "workload");
    char ctx[300];
    snprintf(ctx, sizeof ctx, "%s: workload", what);
    if (!cJSON_IsObject(o)) return util_fail(err, UTIL_EINVAL, "%s: required object is missing", ctx);
    long v;
    int rc;
#define W(name, lo, req) \
    do { if ((rc = util_json_int(o, ctx, #name, req, lo, 1L << 30, 0, &v, err))) return rc; w->name = (int)v; } while (0);
    W(global_batch, 1, true)
    W(images_per_sample, 0, false)
    W(image_tokens, 0, false)
    W(audio_frames, 0, false)
    W(text_tokens, 1, true)
#undef W
    return UTIL_OK;
}

int plan_from_json(const cJSON *root, const char *what, plan_t *p, char *err)
{
    memset(p, 0, sizeof *p);
    p->backend = PLAN_BACKEND_DEVICE;   /* not in the file: the device's unless --backend says (cli_setup_backend) */
    char buf[64];
    int rc;
    long v;
    if ((rc = util_json_str(root, what, "schema", true, NULL, buf, sizeof buf, err))) return rc;
    if (strcmp(buf, PLAN_SCHEMA))
        return util_fail(err, UTIL_EINVAL, "%s: schema '%s' is not %s", what, buf, PLAN_SCHEMA);
    p->version = PLAN_SCHEMA_VERSION;
    if ((rc = util_json_str(root, what, "label", false, "", p->label, sizeof p->label, err))) return rc;
    if ((rc = parse_sub(root, "model", what, true, &p->model, err))) return rc;
    if ((rc = parse_sub(root, "cluster", what, false, &p->cluster, err))) return rc;
    if ((rc = parse_workload(root, what, &p->work, err))) return rc;
    if ((rc = util_json_str(root, what, "placement", true, NULL, buf, sizeof buf, err))) return rc;
    char why[UTIL_ERR_LEN];
    if (plan_placement_parse(buf, &p->placement, why)) return util_fail(err, UTIL_EINVAL, "%s.placement: %s", what, why);
    if ((rc = util_json_str(root, what, "precision", false, "bf16-mixed", buf, sizeof buf, err))) return rc;
    if (plan_precision_parse(buf, &p->precision, why)) return util_fail(err, UTIL_EINVAL, "%s.precision: %s", what, why);
    if ((rc = util_json_str(root, what, "target", false, plan_target_name(plan_target_default(p->precision)), buf,
                            sizeof buf, err))) return rc;
    if (plan_target_parse(buf, &p->target, why)) return util_fail(err, UTIL_EINVAL, "%s.target: %s", what, why);
    if ((rc = util_json_str(root, what, "zero3", false, plan_zero3_name(PLAN_ZERO3_UNITS), buf, sizeof buf, err))) return rc;
    if (plan_zero3_parse(buf, &p->zero3, why)) return util_fail(err, UTIL_EINVAL, "%s.zero3: %s", what, why);
    if ((rc = util_json_str(root, what, "adamw", false, plan_adamw_name(PLAN_ADAMW_FUSED), buf, sizeof buf, err))) return rc;
    if (plan_adamw_parse(buf, &p->adamw, why)) return util_fail(err, UTIL_EINVAL, "%s.adamw: %s", what, why);
    if ((rc = util_json_str(root, what, "optim_dtype", false, plan_optim_dtype_name(PLAN_OPTIM_FP32), buf, sizeof buf,
                            err))) return rc;
    if (plan_optim_dtype_parse(buf, &p->optim_dtype, why))
        return util_fail(err, UTIL_EINVAL, "%s.optim_dtype: %s", what, why);
    if ((rc = util_json_str(root, what, "grad_reduce", false, plan_grad_reduce_name(PLAN_REDUCE_GRADS), buf, sizeof buf,
                            err))) return rc;
    if (plan_grad_reduce_parse(buf, &p->grad_reduce, why))
        return util_fail(err, UTIL_EINVAL, "%s.grad_reduce: %s", what, why);
    if ((rc = util_json_str(root, what, "tp_style", false, plan_tp_style_name(PLAN_TP_MEGATRON), buf, sizeof buf, err)))
        return rc;
    if (plan_tp_style_parse(buf, &p->tp_style, why)) return util_fail(err, UTIL_EINVAL, "%s.tp_style: %s", what, why);
    if ((rc = util_json_str(root, what, "pipe_engine", false, plan_pipe_engine_name(PLAN_PIPE_MEGATRON), buf, sizeof buf,
                            err))) return rc;
    if (plan_pipe_engine_parse(buf, &p->pipe_engine, why))
        return util_fail(err, UTIL_EINVAL, "%s.pipe_engine: %s", what, why);
    if ((rc = util_json_str(root, what, "grad_accum", false, plan_grad_accum_name(PLAN_ACCUM_FUSED), buf, sizeof buf,
                            err))) return rc;
    if (plan_grad_accum_parse(buf, &p->grad_accum, why))
        return util_fail(err, UTIL_EINVAL, "%s.grad_accum: %s", what, why);
    if ((rc = util_json_bool(root, what, "tf32", false, false, &p->tf32, err))) return rc;
    if ((rc = util_json_str(root, what, "fp8", false, plan_fp8_name(PLAN_FP8_NONE), buf, sizeof buf, err))) return rc;
    if (plan_fp8_parse(buf, &p->fp8, why)) return util_fail(err, UTIL_EINVAL, "%s.fp8: %s", what, why);
    if ((rc = util_json_bool(root, what, "tp_comm_overlap", false, false, &p->tp_comm_overlap, err))) return rc;
    if ((rc = util_json_str(root, what, "loss", false, plan_loss_name(PLAN_LOSS_AUTO), buf, sizeof buf, err))) return rc;
    if (plan_loss_parse(buf, &p->loss, why)) return util_fail(err, UTIL_EINVAL, "%s.loss: %s", what, why);
    if ((rc = util_json_str(root, what, "attention", false, plan_attention_name(PLAN_ATTN_FLASH2), buf, sizeof buf, err)))
        return rc;
    if (plan_attention_parse(buf, &p->attention, why)) return util_fail(err, UTIL_EINVAL, "%s.attention: %s", what, why);
    plan_options po = plan_options_of(p);
    const char *key;
    if (plan_options_check(&po, &key, why)) return util_fail(err, UTIL_EINVAL, "%s.%s: %s", what, key, why);
    if ((rc = util_json_int(root, what, "world_size", true, 1, 1 << 24, 1, &v, err))) return rc;
    p->world_size = (int)v;
    if ((rc = util_json_int(root, what, "n_micro", false, 1, 1 << 20, 1, &v, err))) return rc;
    p->n_micro = (int)v;
    const cJSON *mods = cJSON_GetObjectItemCaseSensitive(root, "modules");
    if (!cJSON_IsArray(mods)) return util_fail(err, UTIL_EINVAL, "%s.modules: required array is missing", what);
    int n = cJSON_GetArraySize(mods);
    if (n != p->model.n_modules)
        return util_fail(err, UTIL_EINVAL, "%s.modules: %d entries but the model has %d modules", what, n,
                         p->model.n_modules);
    p->n_modules = n;
    for (int k = 0; k < n; k++) {
        char ctx[300];
        snprintf(ctx, sizeof ctx, "%s.modules[%d]", what, k);
        if ((rc = parse_module(cJSON_GetArrayItem(mods, k), ctx, &p->mod[k], err))) return rc;
        p->mod[k].module_index = model_find(&p->model, p->mod[k].module);
        if (p->mod[k].module_index != k)
            return util_fail(err, UTIL_EINVAL, "%s.module: '%s' is not module %d of the model", ctx, p->mod[k].module, k);
    }
    const cJSON *pred = cJSON_GetObjectItemCaseSensitive(root, "prediction");
    if (cJSON_IsObject(pred)) {
        double d;
        if (!util_json_num(pred, what, "step_time_s", false, 0, 1e30, 0, &d, NULL)) p->pred.step_time_s = d;
        p->pred.analytic_step_time_s = p->pred.step_time_s;
        if (!util_json_num(pred, what, "analytic_step_time_s", false, 0, 1e30, 0, &d, NULL) && d > 0)
            p->pred.analytic_step_time_s = d;
        bool simulated = false;
        if (!util_json_bool(pred, what, "simulated", false, false, &simulated, NULL)) p->pred.simulated = simulated;
        if (!util_json_num(pred, what, "samples_per_s", false, 0, 1e30, 0, &d, NULL)) p->pred.samples_per_s = d;
        if (!util_json_num(pred, what, "vision_tokens_per_s", false, 0, 1e30, 0, &d, NULL)) p->pred.vision_tokens_per_s = d;
        if (!util_json_num(pred, what, "tokens_per_s", false, 0, 1e30, 0, &d, NULL)) p->pred.tokens_per_s = d;
        if (!util_json_num(pred, what, "mfu", false, 0, 1e30, 0, &d, NULL)) p->pred.mfu = d;
        if (!util_json_num(pred, what, "model_flops", false, 0, 1e30, 0, &d, NULL)) p->pred.model_flops = d;
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(pred, "peak_mem_bytes");
        for (int k = 0; k < n && cJSON_IsArray(mem) && k < cJSON_GetArraySize(mem); k++)
            p->pred.peak_mem_bytes[k] = cJSON_GetArrayItem(mem, k)->valuedouble;
        bool fits;
        if (!util_json_bool(pred, what, "fits", false, true, &fits, NULL)) p->pred.fits = fits;
    }
    char verr[UTIL_ERR_LEN];
    if ((rc = plan_validate(p, verr))) return util_fail(err, rc, "%s: %s", what, verr);
    return UTIL_OK;
}

int plan_read(const char *path, plan_t *p, char *err)
{
    cJSON *root;
    int rc = util_json_read(path, &root, err);
    if (rc) return rc;
    rc = plan_from_json(root, path, p, err);
    cJSON_Delete(root);
    return rc;
}

static bool overlaps(const plan_module *a, const plan_module *b)
{
    return a->first_rank < b->first_rank + b->n_ranks && b->first_rank < a->first_rank + a->n_ranks;
}

/* dp * micro_batch in 64 bits: each factor comes from the file (up to 2^24
 * and 2^20), and a product wrapped to 0 was a division by zero below. */
static int64_t samples_per_micro_step(const plan_module *s) { return (int64_t)s->dp * s->micro_batch; }

static int validate_colocated(const plan_t *p, char *err)
{
    const plan_module *a = &p->mod[0];
    int64_t per = samples_per_micro_step(a);
    if (p->n_micro != 1) return util_fail(err, UTIL_EINVAL, "n_micro: colocated plans run in turn (n_micro 1)");
    for (int k = 1; k < p->n_modules; k++) {
        const plan_module *b = &p->mod[k];
        if (b->first_rank != a->first_rank || b->n_ranks != a->n_ranks || b->pool != a->pool)
            return util_fail(err, UTIL_EINVAL, "modules[%d]: colocated modules must share the same ranks", k);
        if (samples_per_micro_step(b) != per)
            return util_fail(err, UTIL_EINVAL,
                             "modules[%d]: colocated modules must take the same samples per micro-step "
                             "(dp*micro_batch %lld vs %lld)", k, (long long)samples_per_micro_step(b), (long long)per);
    }
    if (p->work.global_batch % per != 0)
        return util_fail(err, UTIL_EINVAL, "global_batch %d is not a multiple of dp*micro_batch %lld",
                         p->work.global_batch, (long long)per);
    return UTIL_OK;
}

static int validate_disaggregated(const plan_t *p, char *err)
{
    if (p->work.global_batch % p->n_micro != 0)
        return util_fail(err, UTIL_EINVAL, "n_micro: %d does not divide global_batch %d", p->n_micro,
                         p->work.global_batch);
    int chunk = p->work.global_batch / p->n_micro;
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        for (int j = 0; j < k; j++)
            if (overlaps(s, &p->mod[j]))
                return util_fail(err, UTIL_EINVAL, "modules[%d]: ranks overlap module %d in a disaggregated plan", k, j);
        if (chunk < s->dp)
            return util_fail(err, UTIL_EINVAL, "modules[%d]: chunk of %d samples leaves some of its %d dp replicas idle",
                             k, chunk, s->dp);
        if (s->micro_batch > (chunk + s->dp - 1) / s->dp)
            return util_fail(err, UTIL_EINVAL, "modules[%d]: micro_batch %d exceeds the %d samples a replica gets per chunk",
                             k, s->micro_batch, (chunk + s->dp - 1) / s->dp);
    }
    return UTIL_OK;
}

bool plan_module_ranks(const plan_module *s, int64_t *out)
{
    int64_t t;
    return util_mul_i64(s->dp, s->tp, &t) && util_mul_i64(t, s->sp, &t) && util_mul_i64(t, s->pp, out);
}

int plan_pool_offset(const plan_t *p, int k)
{
    int base = p->mod[k].first_rank;
    for (int j = 0; j < p->n_modules; j++)
        if (p->mod[j].pool == p->mod[k].pool && p->mod[j].first_rank < base) base = p->mod[j].first_rank;
    return p->mod[k].first_rank - base;
}

/* Tensor-parallel groups are the module's consecutive runs of tp ranks; each must sit in one node. */
static int validate_tp_in_node(const plan_t *p, int k, char *err)
{
    const plan_module *s = &p->mod[k];
    int gpn = p->cluster.pool[s->pool].gpus_per_node, off = plan_pool_offset(p, k);
    for (int g = off; g < off + s->n_ranks; g += s->tp)
        if (g / gpn != (g + s->tp - 1) / gpn)
            return util_fail(err, UTIL_EINVAL, "modules[%d]: tp group of ranks %d-%d straddles a node boundary", k,
                             s->first_rank + g - off, s->first_rank + g - off + s->tp - 1);
    return UTIL_OK;
}

int plan_validate(const plan_t *p, char *err)
{
    int rc;
    if (p->n_modules != p->model.n_modules)
        return util_fail(err, UTIL_EINVAL, "modules: %d entries for %d model modules", p->n_modules, p->model.n_modules);
    if ((rc = plan_workload_validate(&p->model, &p->work, err))) return rc;
    plan_options po = plan_options_of(p);
    if ((rc = plan_options_pool_check(&po, &p->cluster, err))) return rc;   /* FP8 cores, a cuDNN attention figure */
    int pool_gpus[COST_MAX_POOLS] = { 0 };
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        char e[UTIL_ERR_LEN];
        if ((rc = plan_strategy_check(&p->model, k, s, &p->work, &p->cluster, e)) ||
            (rc = plan_zero3_pipeline_check(&p->model.mod[k], s, &po, e)))
            return util_fail(err, rc, "modules[%d]: %s", k, e);
        int64_t degrees;
        if (!plan_module_ranks(s, &degrees) || s->n_ranks != degrees)
            return util_fail(err, UTIL_EINVAL, "modules[%d].n_ranks: %d is not dp*tp*sp*pp = %d*%d*%d*%d", k, s->n_ranks,
                             s->dp, s->tp, s->sp, s->pp);
        if (s->first_rank + s->n_ranks > p->world_size)
            return util_fail(err, UTIL_EINVAL, "modules[%d]: ranks %d..%d exceed world_size %d", k, s->first_rank,
                             s->first_rank + s->n_ranks - 1, p->world_size);
        if (p->placement == PLAN_DISAGGREGATED || k == 0) pool_gpus[s->pool] += s->n_ranks;
        if ((rc = validate_tp_in_node(p, k, err))) return rc;
        const plan_pipe_props *engine = plan_pipe_engine_props(p->pipe_engine);
        if (!engine->interleaves && plan_vp(s) > 1)
            return util_fail(err, UTIL_EINVAL, "modules[%d]: vp %d: DeepSpeed's pipeline engine (%s) has no interleaved "
                             "schedule: vp 1, or --pipe-engine megatron", k, plan_vp(s), plan_pipe_engine_name(p->pipe_engine));
        if (s->pp > 1 && s->zero > engine->zero_on_stages)
            return util_fail(err, UTIL_EINVAL, "modules[%d]: ZeRO-%d beside pp %d: DeepSpeed's pipeline engine (%s) "
                             "refuses ZeRO-2 and -3 with pipeline stages: zero %d, or --pipe-engine megatron", k, s->zero,
                             s->pp, plan_pipe_engine_name(p->pipe_engine), engine->zero_on_stages);
    }
    for (int i = 0; i < p->cluster.n_pools; i++)
        if (pool_gpus[i] > cost_pool_gpus(&p->cluster.pool[i]))
            return util_fail(err, UTIL_EINVAL, "plan uses %d GPUs of pool '%s', which has %d", pool_gpus[i],
                             p->cluster.pool[i].name, cost_pool_gpus(&p->cluster.pool[i]));
    return p->placement == PLAN_COLOCATED ? validate_colocated(p, err) : validate_disaggregated(p, err);
}
