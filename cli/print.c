/* Human-readable and JSON rendering of plans. */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_emit_json(cJSON *doc)
{
    char *text = cJSON_Print(doc);
    if (text) { fputs(text, stdout); fputc('\n', stdout); free(text); }
    cJSON_Delete(doc);
}

int cli_reserve_stdout(void)
{
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    if (saved < 0) return -1;
    if (dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        close(saved);
        return -1;
    }
    util_set_stdout_fd(saved);
    return 0;
}

static double llm_seq(const model_t *m, const plan_workload *w)
{
    plan_seq q;
    plan_module_seq(m, m->llm, w, &q);
    return q.seq;
}

const char *cli_fmt_count(double n, char *buf, size_t len)
{
    if (n <= 0) snprintf(buf, len, "-");
    else if (n >= 1e9) snprintf(buf, len, "%.2fB", n / 1e9);
    else if (n >= 1e6) snprintf(buf, len, "%.1fM", n / 1e6);
    else snprintf(buf, len, "%.1fK", n / 1e3);
    return buf;
}

void cli_print_header(const model_t *m, const cost_cluster *c, const plan_workload *w)
{
    char b[32];
    printf("model    %s, %s parameters", m->name, cli_fmt_count((double)model_total_params(m), b, sizeof b));
    for (int k = 0; k < m->n_modules; k++)
        printf("%s%s %s", k ? ", " : " (", m->mod[k].name, cli_fmt_count((double)model_module_params(&m->mod[k]), b, sizeof b));
    printf(")\ncluster  %s:", c->name);
    for (int i = 0; i < c->n_pools; i++)
        printf("%s %d x %d %s", i ? " +" : "", c->pool[i].nodes, c->pool[i].gpus_per_node, c->pool[i].gpu.name);
    printf("\nworkload batch %d", w->global_batch);
    if (w->images_per_sample) printf(", %d image%s x %d vision tokens", w->images_per_sample,
                                     w->images_per_sample > 1 ? "s" : "", w->image_tokens);
    if (w->audio_frames) printf(", %d audio frames", w->audio_frames);
    printf(", %d text tokens -> LLM sequence %.0f\n", w->text_tokens, llm_seq(m, w));
}

static void fmt_ranks(const plan_module *s, char *buf, size_t n)
{
    if (s->n_ranks == 1) snprintf(buf, n, "%d", s->first_rank);
    else snprintf(buf, n, "%d-%d", s->first_rank, s->first_rank + s->n_ranks - 1);
}

/* The columns of the step's parts (plan_step_parts), as printed. */
enum { PART_GEMM, PART_ATTN, PART_OTHER, PART_RECOMPUTE, PART_TP, PART_SP, PART_ZERO, PART_HOP, PART_BUBBLE,
       PART_TRANSFER, PART_DP, PART_OPTIM, PART_N };
static const struct { const char *label, *key; } part_names[PART_N] = {
    { "GEMM", "gemm_s" }, { "attention", "attention_s" }, { "other", "other_compute_s" },
    { "recompute", "recompute_s" }, { "TP comm", "tp_comm_s" }, { "SP comm", "sp_comm_s" },
    { "ZeRO comm", "zero_comm_s" }, { "hand-offs", "stage_handoff_s" }, { "bubble", "pipeline_bubble_s" },
    { "to LLM", "encoder_handoff_s" }, { "DP sync", "dp_sync_s" }, { "optimizer", "optimizer_s" },
};

static void part_values(const plan_step_parts *sp, double *v)
{
    const plan_micro_parts *m = &sp->micro;
    double x[PART_N] = { m->gemm_s, m->attn_s, m->other_s, m->recompute_s, m->tp_comm_s, m->sp_comm_s, m->zero_comm_s,
                         m->hop_s, sp->bubble_s, sp->transfer_s, sp->dp_sync_s, sp->norm_s + sp->optim_s };
    memcpy(v, x, sizeof x);
}

/* Where each module's seconds of the step go, on the analytic model: a
 * row of seconds and one of shares, the columns every module leaves at 0
 * left out. Disaggregated groups run side by side: each row is its group's. */
static void print_step_parts(const plan_t *p)
{
    plan_step_parts parts[MODEL_MAX_MODULES];
    char err[UTIL_ERR_LEN];
    if (plan_step_parts_of(p, parts, err)) {
        printf("  where the step goes: %s\n", err);
        return;
    }
    double v[MODEL_MAX_MODULES][PART_N];
    bool shown[PART_N] = { false };
    for (int k = 0; k < p->n_modules; k++) {
        part_values(&parts[k], v[k]);
        for (int i = 0; i < PART_N; i++) shown[i] |= v[k][i] > 5e-4;
    }
    printf("  where the step goes, seconds (analytic%s):\n  %-8s %5s",
           p->placement == PLAN_DISAGGREGATED ? "; each group's own, the groups overlap" : "", "module", "");
    for (int i = 0; i < PART_N; i++) if (shown[i]) printf(" %9s", part_names[i].label);
    printf(" %9s\n", "total");
    for (int k = 0; k < p->n_modules; k++) {
        double total = plan_step_parts_total(&parts[k]);
        printf("  %-8s %5s", p->mod[k].module, "s");
        for (int i = 0; i < PART_N; i++) if (shown[i]) printf(" %9.3f", v[k][i]);
        printf(" %9.3f\n  %-8s %5s", total, "", "share");
        for (int i = 0; i < PART_N; i++) if (shown[i]) printf(" %8.1f%%", total > 0 ? 100 * v[k][i] / total : 0.0);
        printf("\n");
    }
}

cJSON *cli_step_parts_json(const plan_t *p)
{
    plan_step_parts parts[MODEL_MAX_MODULES];
    char err[UTIL_ERR_LEN];
    if (plan_step_parts_of(p, parts, err)) return cJSON_CreateString(err);
    cJSON *a = cJSON_CreateArray();
    for (int k = 0; k < p->n_modules; k++) {
        double v[PART_N];
        part_values(&parts[k], v);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "module", p->mod[k].module);
        cJSON_AddNumberToObject(o, "micro_batches", parts[k].micros);
        for (int i = 0; i < PART_N; i++) cJSON_AddNumberToObject(o, part_names[i].key, v[i]);
        cJSON_AddNumberToObject(o, "total_s", plan_step_parts_total(&parts[k]));
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

/* A pipelined module's split: its stages' blocks (plan_stage_of), the
 * chunks a stage under interleaving, and whether the ends count as blocks. */
static void print_pipeline(const plan_t *p, int k)
{
    const plan_module *s = &p->mod[k];
    const model_module *mm = &p->model.mod[k];
    printf("  %-8s pipeline: %d stages", s->module, s->pp);
    if (plan_vp(s) > 1) printf(" x %d interleaved chunks", plan_vp(s));
    printf(", blocks a stage");
    for (int i = 0; i < s->pp; i++) {
        if (s->pp > 12 && i == 6) {   /* the ends, where the splits differ, and the count between */
            printf(" ... (%d more)", s->pp - 12);
            i = s->pp - 6;
        }
        printf(" %d", plan_stage_of(mm, s, i).count);
    }
    if (s->split_ends) printf(" (split=ends: the embedding and the head a block each)");
    printf("\n");
}

/* A module recomputing part of its blocks (plan_module.recompute_layers):
 * which, and how many of them in all. */
static void print_partial_recompute(const plan_t *p, int k)
{
    const plan_module *s = &p->mod[k];
    const model_module *mm = &p->model.mod[k];
    int n = 0;
    for (int i = 0; i < (s->pp > 1 ? s->pp : 1); i++) {
        plan_stage st = plan_stage_of(mm, s, i);
        n += plan_stage_recomputed_blocks(s, &st);
    }
    printf("  %-8s recompute: ", s->module);
    if (s->pp > 1)
        printf("the first %d blocks of each %s, %d of its %d,", s->recompute_layers,
               plan_vp(s) > 1 ? "interleaved chunk" : "stage", n, mm->layers);
    else
        printf("the first %d of its %d blocks", n, mm->layers);
    printf(" re-run their forward in the backward; the others keep their activations\n");
}

/* --tp-comm-overlap: which modules overlap their blocks' TP collectives (plan_tp_overlaps). */
static void print_tp_overlap(const plan_t *p)
{
    plan_options o = plan_options_of(p);
    printf("  tp comm overlap (%s; TP comm is what the GEMMs leave exposed):",
           p->tp_style == PLAN_TP_DTENSOR ? "torchtitan's async TP" : "TransformerEngine's userbuffers");
    int n = 0;
    for (int k = 0; k < p->n_modules; k++)
        if (plan_tp_overlaps(&p->model.mod[k], &p->mod[k], &o)) printf("%s %s", n++ ? "," : "", p->mod[k].module);
    printf("%s\n", n ? "" : " no module (none has seqpar over tp > 1)");
}

/* The LLM's context parallelism where it is ring attention (asked, or where
 * Ulysses cannot split the heads: plan_cp_of); Ulysses, the default, goes unsaid. */
static void print_ring(const plan_t *p, int k)
{
    const plan_module *s = &p->mod[k];
    if (plan_cp_of(&p->model.mod[k], s) != PLAN_CP_RING) return;
    printf("  %-8s context parallelism: ring attention over sp %d (the sequence in %d load-balanced chunks, the K/V "
           "blocks passed around the ring%s)\n", s->module, s->sp, plan_cp_chunks(PLAN_CP_RING, s->sp),
           s->cp == PLAN_CP_RING ? "" : "; Ulysses splits the heads, which tp x sp does not divide");
}

void cli_print_plan(const plan_t *p)
{
    const plan_prediction *pr = &p->pred;
    printf("placement %s", plan_placement_name(p->placement));
    if (p->placement == PLAN_DISAGGREGATED) printf(", %d micro-batch chunks pipelined between groups", p->n_micro);
    else printf(", modules run in turn on the same GPUs");
    printf("\n  %-8s %-6s %5s %4s %4s %4s %4s %4s %4s %-9s %-6s %10s\n", "module", "pool", "ranks", "gpus", "dp",
           "tp", "sp", "pp", "zero", "recompute", "mb", "mem/GPU");
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        char ranks[32], mem[32], rc[24];
        fmt_ranks(s, ranks, sizeof ranks);
        printf("  %-8s %-6s %5s %4d %4d %4d %4d %4d %4d %-9s %-6d %10s\n", s->module,
               p->cluster.pool[s->pool].name, ranks, s->n_ranks, s->dp, s->tp, s->sp, s->pp, s->zero,
               plan_recompute_label(s, rc, sizeof rc), s->micro_batch,
               util_fmt_bytes(pr->peak_mem_bytes[k], mem, sizeof mem));
    }
    for (int k = 0; k < p->n_modules; k++) {
        if (p->mod[k].pp > 1) print_pipeline(p, k);
        print_ring(p, k);
        if (p->mod[k].recompute == PLAN_RECOMP_FULL && p->mod[k].recompute_layers > 0) print_partial_recompute(p, k);
    }
    if (plan_fp8_props_of(p->fp8)->on)
        printf("  fp8 %s: the blocks' linears in FP8 (%s); attention, embeddings and output layer in bf16; MFU "
               "against the bf16 peak\n", plan_fp8_name(p->fp8), plan_fp8_props_of(p->fp8)->what);
    if (p->tp_comm_overlap) print_tp_overlap(p);
    if (p->attention == PLAN_ATTN_CUDNN)
        printf("  attention cudnn: cuDNN's fused attention (TransformerEngine's on Hopper), the GPU file's "
               "attn_cudnn_speedup over FlashAttention-2\n");
    if (p->optim_dtype == PLAN_OPTIM_BF16)
        printf("  optimizer states bf16: master weights, m and v in bf16 (Apex's DistributedFusedAdam with dtype "
               "bf16, NeMo's optim.dtype), 6 bytes an element\n");
    printf("  step %.3f s", pr->step_time_s);
    if (pr->simulated) printf(" (simulated; analytic %.3f s)", pr->analytic_step_time_s);
    else printf(" (analytic)");   /* a plan the schedule was not simulated for: dhp simulate prices it */
    printf(" | %.0f vision tok/s | %.0f tok/s | %.3f samples/s | MFU %.1f%% | %s\n", pr->vision_tokens_per_s,
           pr->tokens_per_s, pr->samples_per_s, 100 * pr->mfu, pr->fits ? "fits" : "OOM");
    print_step_parts(p);
}

void cli_print_backend(const plan_t *p)
{
    plan_options o = plan_options_of(p);
    double ws = plan_backend_workspace_bytes(&o, &p->cluster.pool[0].gpu);
    char b[32];
    printf("memory on the %s backend (--backend cuda|cpu): ", plan_backend_name(plan_backend_of(p)));
    if (ws > 0) printf("its cuBLASLt workspace and scratch, %s a rank, beside the layout's buffers\n", util_fmt_bytes(ws, b, sizeof b));
    else if (p->target != PLAN_TARGET_DHP) printf("target %s: library workspaces are in reserved\n", plan_target_name(p->target));
    else printf("no library workspace\n");
}

void cli_print_plan_row_header(void)
{
    printf("  %-12s %-13s %9s %12s %10s %9s %6s %10s  %s\n", "strategy", "placement", "step(s)", "vision tok/s",
           "tok/s", "samples/s", "MFU", "peak mem", "");
}

static double peak_of(const plan_t *p)
{
    double peak = 0;
    for (int k = 0; k < p->n_modules; k++) if (p->pred.peak_mem_bytes[k] > peak) peak = p->pred.peak_mem_bytes[k];
    return peak;
}

void cli_print_plan_row(const char *name, const plan_t *p)
{
    const plan_prediction *pr = &p->pred;
    double cap = p->cluster.pool[p->mod[0].pool].gpu.hbm_bytes;
    char verdict[64] = "", over[32], peak[32];
    if (!pr->fits) snprintf(verdict, sizeof verdict, "OOM (+%s)", util_fmt_bytes(peak_of(p) - cap, over, sizeof over));
    printf("  %-12s %-13s %9.3f %12.0f %10.0f %9.3f %5.1f%% %10s  %s\n", name, plan_placement_name(p->placement),
           pr->step_time_s, pr->vision_tokens_per_s, pr->tokens_per_s, pr->samples_per_s, 100 * pr->mfu,
           util_fmt_bytes(peak_of(p), peak, sizeof peak), verdict);
}

cJSON *cli_plan_summary_json(const plan_t *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "strategy", p->label);
    cJSON_AddStringToObject(o, "placement", plan_placement_name(p->placement));
    cJSON_AddNumberToObject(o, "n_micro", p->n_micro);
    cJSON_AddNumberToObject(o, "global_batch", p->work.global_batch);
    cJSON_AddNumberToObject(o, "step_time_s", p->pred.step_time_s);
    cJSON_AddNumberToObject(o, "analytic_step_time_s", p->pred.analytic_step_time_s);
    cJSON_AddBoolToObject(o, "simulated", p->pred.simulated);
    cJSON_AddNumberToObject(o, "vision_tokens_per_s", p->pred.vision_tokens_per_s);
    cJSON_AddNumberToObject(o, "tokens_per_s", p->pred.tokens_per_s);
    cJSON_AddNumberToObject(o, "samples_per_s", p->pred.samples_per_s);
    cJSON_AddNumberToObject(o, "mfu", p->pred.mfu);
    cJSON_AddNumberToObject(o, "peak_mem_bytes", peak_of(p));
    cJSON_AddBoolToObject(o, "fits", p->pred.fits);
    cJSON *mods = cJSON_AddArrayToObject(o, "modules");
    for (int k = 0; k < p->n_modules; k++) {
        cJSON *mo = plan_module_to_json(&p->mod[k]);
        cJSON_AddNumberToObject(mo, "mem_bytes", p->pred.peak_mem_bytes[k]);
        cJSON_AddItemToArray(mods, mo);
    }
    return o;
}
