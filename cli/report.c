/* dhp plan --report / dhp simulate --report: one self-contained HTML file.
 * The data (GPU map, memory per GPU, the simulated and measured step, the
 * plan against its alternatives and baselines) is gathered here as JSON and
 * embedded in cli/report.html, whose script draws it as inline SVG. */
#include "cli/cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPORT_MAX_NODES 64      /* nodes drawn in the GPU map */
#define REPORT_MAX_RANKS 64      /* ranks drawn in the memory and timeline sections */

/* "tp2 sp4 dp2 z3 rc:full": the degrees above 1, ZeRO and recomputation. */
static void strategy_short(const plan_module *s, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    const struct { const char *k; int v; } d[] = { {"tp", s->tp}, {"sp", s->sp}, {"dp", s->dp}, {"pp", s->pp} };
    for (size_t i = 0; i < 4; i++)
        if (d[i].v > 1) len += (size_t)snprintf(buf + len, n - len, "%s%s%d", len ? " " : "", d[i].k, d[i].v);
    if (s->zero) len += (size_t)snprintf(buf + len, n - len, "%sz%d", len ? " " : "", s->zero);
    char rc[24];
    if (s->recompute != PLAN_RECOMP_NONE)
        snprintf(buf + len, n - len, "%src:%s", len ? " " : "",
                 s->recompute == PLAN_RECOMP_FULL ? plan_recompute_label(s, rc, sizeof rc) : "sel");
    if (!buf[0]) snprintf(buf, n, "1 GPU");
}

static cJSON *modules_json(const plan_t *p)
{
    cJSON *a = cJSON_CreateArray();
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        char sh[96], full[256], rc[24];
        strategy_short(s, sh, sizeof sh);
        char ranks[48];
        if (s->n_ranks == 1) snprintf(ranks, sizeof ranks, "rank %d", s->first_rank);
        else snprintf(ranks, sizeof ranks, "ranks %d-%d", s->first_rank, s->first_rank + s->n_ranks - 1);
        snprintf(full, sizeof full, "%s, dp %d tp %d sp %d pp %d, ZeRO %d, recompute %s, micro-batch %d%s%s",
                 ranks, s->dp, s->tp, s->sp, s->pp, s->zero,
                 plan_recompute_label(s, rc, sizeof rc), s->micro_batch, s->seq_parallel ? ", sequence parallel" : "",
                 plan_cp_of(&p->model.mod[k], s) == PLAN_CP_RING ? ", ring attention over sp" : "");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", s->module);
        cJSON_AddStringToObject(o, "short", sh);
        cJSON_AddStringToObject(o, "strategy", full);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

/* Every node of the cluster the plan touches, each GPU with its rank (-1 idle) and modules. */
static int nodes_json(const plan_t *p, cJSON *doc, char *err)
{
    int n_hosts = plan_cluster_nodes(p), used = 0;
    int *host_used = calloc((size_t)n_hosts, sizeof *host_used);
    for (int r = 0; r < p->world_size; r++) {
        plan_place pl;
        if (plan_rank_place(p, r, &pl, err)) { free(host_used); return UTIL_EINVAL; }
        host_used[pl.host] = 1;
    }
    cJSON *nodes = cJSON_AddArrayToObject(doc, "nodes");
    int host = 0, left_out = 0;
    for (int i = 0; i < p->cluster.n_pools; i++) {
        const cost_pool *pool = &p->cluster.pool[i];
        for (int nd = 0; nd < pool->nodes; nd++, host++) {
            if (!host_used[host]) continue;
            if (used++ >= REPORT_MAX_NODES) { left_out++; continue; }
            cJSON *node = cJSON_CreateObject(), *gpus = cJSON_AddArrayToObject(node, "gpus");
            char name[96];
            snprintf(name, sizeof name, "%s node %d", pool->name, nd);
            cJSON_AddStringToObject(node, "name", name);
            for (int g = 0; g < pool->gpus_per_node; g++) {
                cJSON *gpu = cJSON_CreateObject(), *mods = cJSON_AddArrayToObject(gpu, "modules");
                int rank = -1;
                for (int r = 0; r < p->world_size && rank < 0; r++) {
                    plan_place pl;
                    if (plan_rank_place(p, r, &pl, err) == UTIL_OK && pl.host == host && pl.gpu == g) rank = r;
                }
                for (int k = 0; k < p->n_modules && rank >= 0; k++) {
                    plan_coord cd;
                    if (plan_rank_coord(p, k, rank, &cd)) cJSON_AddItemToArray(mods, cJSON_CreateNumber(k));
                }
                cJSON_AddNumberToObject(gpu, "rank", rank);
                cJSON_AddItemToArray(gpus, gpu);
            }
            cJSON_AddItemToArray(nodes, node);
        }
    }
    cJSON_AddNumberToObject(doc, "nodes_left_out", left_out);
    free(host_used);
    return UTIL_OK;
}

/* Per rank: the memory model's categories, summed over the modules it runs
 * (the runtime reservation once, as dhp memory counts it). */
/* Rank r's memory by the chart's categories: the simulator's rank by rank
 * (dhp simulate's table, the hand-off's buffers included), else, for a plan
 * the schedule does not run, the modules it holds under the plan's options. */
static int rank_memory(const plan_t *p, const plan_eval *ev, int r, double *v, double *cap)
{
    plan_sim_mem m;
    char e[UTIL_ERR_LEN];
    if (plan_sim_memory(p, r, &m, e) == UTIL_OK) {
        const double x[8] = { m.params, m.grads, m.optim, m.zero_buffers, m.activations, m.logits, m.comm,
                              m.other + m.workspace };
        memcpy(v, x, sizeof x);
        *cap = m.capacity;
        return UTIL_OK;
    }
    bool first = true;
    for (int k = 0; k < p->n_modules; k++) {
        plan_coord cd;
        if (!plan_rank_coord(p, k, r, &cd)) continue;
        const plan_mem *mm = &ev->mem[k];
        const double add[8] = { mm->params, mm->grads, mm->optim, mm->zero_buffers, mm->activations, mm->logits,
                                mm->comm, mm->fragmentation + (first ? mm->reserved + mm->workspace : 0) };
        for (int c = 0; c < 8; c++) v[c] += add[c];
        *cap = mm->capacity;
        first = false;
    }
    return UTIL_OK;
}

static int memory_json(const plan_t *p, cJSON *doc, char *err)
{
    plan_t copy = *p;
    plan_options o = plan_options_of(p);
    plan_eval ev;
    if (plan_evaluate(&copy, &o, &ev, err)) return UTIL_EINVAL;
    cJSON *rows = cJSON_AddArrayToObject(doc, "memory");
    int shown = p->world_size < REPORT_MAX_RANKS ? p->world_size : REPORT_MAX_RANKS;
    for (int r = 0; r < shown; r++) {
        double v[8] = { 0 }, cap = 0;
        rank_memory(p, &ev, r, v, &cap);
        static const char *cats[8] = { "params", "grads", "optim", "zero_buffers", "activations", "logits", "comm",
                                       "other" };
        cJSON *row = cJSON_CreateObject(), *parts = cJSON_AddObjectToObject(row, "parts");
        double total = 0;
        for (int c = 0; c < 8; c++) { cJSON_AddNumberToObject(parts, cats[c], v[c]); total += v[c]; }
        cJSON_AddNumberToObject(row, "rank", r);
        cJSON_AddNumberToObject(row, "total", total);
        cJSON_AddNumberToObject(row, "capacity", cap);
        cJSON_AddItemToArray(rows, row);
    }
    cJSON_AddNumberToObject(doc, "memory_left_out", p->world_size - shown);
    return UTIL_OK;
}

static cJSON *event(int rank, int lane, const char *name, double start, double end)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "rank", rank);
    cJSON_AddNumberToObject(e, "lane", lane);
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddNumberToObject(e, "start", start);
    cJSON_AddNumberToObject(e, "end", end);
    return e;
}

/* A Chrome trace of dhp run --trace: its "X" events, times from the first
 * event's start, seconds. */
static int measured_events(const char *path, int shown, cJSON *tl, char *err)
{
    cJSON *root;
    int rc = util_json_read(path, &root, err);
    if (rc) return rc;
    if (!cJSON_IsArray(root)) { cJSON_Delete(root); return util_fail(err, UTIL_EINVAL, "%s: not a JSON array of trace events", path); }
    double t0 = INFINITY, t1 = -INFINITY;
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, root) {   /* one pass for the checks and the time base */
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
        if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X")) { i++; continue; }
        const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts"), *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
        if (!cJSON_IsNumber(ts) || !cJSON_IsNumber(dur) || !cJSON_IsNumber(pid) || dur->valuedouble < 0) {
            cJSON_Delete(root);
            return util_fail(err, UTIL_EINVAL, "%s: event %d: ts, dur and pid must be numbers (dur >= 0)", path, i);
        }
        if (ts->valuedouble < t0) t0 = ts->valuedouble;
        if (ts->valuedouble + dur->valuedouble > t1) t1 = ts->valuedouble + dur->valuedouble;
        i++;
    }
    if (!(t1 >= t0)) { cJSON_Delete(root); return util_fail(err, UTIL_EINVAL, "%s: no complete (\"ph\": \"X\") events", path); }
    cJSON *evs = cJSON_AddArrayToObject(tl, "measured");
    cJSON_ArrayForEach(e, root) {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
        if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X")) continue;
        int rank = (int)cJSON_GetObjectItemCaseSensitive(e, "pid")->valuedouble;
        if (rank < 0 || rank >= shown) continue;
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid"), *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        double ts = cJSON_GetObjectItemCaseSensitive(e, "ts")->valuedouble, d = cJSON_GetObjectItemCaseSensitive(e, "dur")->valuedouble;
        cJSON_AddItemToArray(evs, event(rank, cJSON_IsNumber(tid) && tid->valueint == 1 ? 1 : 0,
                                        cJSON_IsString(name) ? name->valuestring : "?", (ts - t0) / 1e6, (ts + d - t0) / 1e6));
    }
    cJSON_AddNumberToObject(tl, "measured_step_s", (t1 - t0) / 1e6);
    cJSON_AddStringToObject(tl, "measured_source", path);
    cJSON_Delete(root);
    return UTIL_OK;
}

/* The simulated step (plan_sim_run), or why there is none. */
static int timeline_json(const plan_t *p, const char *measured, cJSON *doc, char *err)
{
    cJSON *tl = cJSON_AddObjectToObject(doc, "timeline");
    int shown = p->world_size < REPORT_MAX_RANKS ? p->world_size : REPORT_MAX_RANKS;
    cJSON *ranks = cJSON_AddArrayToObject(tl, "ranks");
    for (int r = 0; r < shown; r++) cJSON_AddItemToArray(ranks, cJSON_CreateNumber(r));
    cJSON_AddNumberToObject(tl, "ranks_left_out", p->world_size - shown);
    plan_sim_result sr;
    char why[UTIL_ERR_LEN];
    if (plan_sim_run(p, NULL, &sr, why)) {
        plan_sim_free(&sr);
        cJSON_AddStringToObject(tl, "error", why);
    } else {
        cJSON *evs = cJSON_AddArrayToObject(tl, "predicted");
        for (int r = 0; r < shown; r++)
            for (int i = 0; i < sr.rank[r].n_ops; i++) {
                const plan_sim_op *o = &sr.rank[r].ops[i];
                char name[96];
                plan_sim_op_label(p, &o->op, name, sizeof name);
                if (o->end_s > o->begin_s)
                    cJSON_AddItemToArray(evs, event(r, plan_op_props(o->op.kind)->lane, name, o->begin_s, o->end_s));
            }
        cJSON_AddNumberToObject(tl, "predicted_step_s", sr.step_time_s);
        plan_sim_free(&sr);
    }
    return measured ? measured_events(measured, shown, tl, err) : UTIL_OK;
}

/* The plan summary every JSON output uses, with the chart's label. */
static void throughput_row(cJSON *rows, const char *label, const plan_t *p, bool chosen)
{
    cJSON *o = cli_plan_summary_json(p);
    cJSON_AddStringToObject(o, "label", label);
    cJSON_AddBoolToObject(o, "chosen", chosen);
    cJSON_AddItemToArray(rows, o);
}

int cli_report_write(const char *path, const plan_t *p, const cli_report_row *rows, int n_rows, bool baselines,
                     const char *measured, char *err)
{
    cJSON *doc = cJSON_CreateObject();
    char wl[256];
    plan_seq q;
    plan_module_seq(&p->model, p->model.llm, &p->work, &q);
    snprintf(wl, sizeof wl, "batch %d, %d image(s) x %d vision tokens, %d audio frames, %d text tokens -> LLM sequence %.0f",
             p->work.global_batch, p->work.images_per_sample, p->work.image_tokens, p->work.audio_frames,
             p->work.text_tokens, q.seq);
    cJSON_AddStringToObject(doc, "model", p->model.name);
    cJSON_AddStringToObject(doc, "cluster", p->cluster.name);
    cJSON_AddStringToObject(doc, "placement", plan_placement_name(p->placement));
    cJSON_AddStringToObject(doc, "precision", plan_precision_name(p->precision));
    cJSON_AddStringToObject(doc, "workload", wl);
    cJSON_AddNumberToObject(doc, "world_size", p->world_size);
    cJSON_AddItemToObject(doc, "prediction", cli_plan_summary_json(p));
    cJSON_AddItemToObject(doc, "modules", modules_json(p));
    cJSON_AddItemToObject(doc, "step_parts", cli_step_parts_json(p));
    int rc = nodes_json(p, doc, err);
    if (!rc) rc = memory_json(p, doc, err);
    if (!rc) rc = timeline_json(p, measured, doc, err);
    cJSON *tp = cJSON_AddArrayToObject(doc, "throughput");
    throughput_row(tp, p->label[0] ? p->label : "plan", p, true);
    for (int i = 0; i < n_rows; i++) throughput_row(tp, rows[i].label, rows[i].plan, false);
    if (baselines) {
        /* priced under the plan's own target and framework options (FP8, TP overlap, loss, ...), as
         * dhp plan prices its baselines */
        plan_options o = plan_options_of(p);
        for (int b = 0; b < PLAN_NBASE; b++) {
            static plan_t base;
            char e[UTIL_ERR_LEN];
            if (plan_baseline_make((plan_baseline)b, &p->model, &p->cluster, &p->work, &o, &base, e) == UTIL_OK)
                throughput_row(tp, plan_baseline_name((plan_baseline)b), &base, false);
        }
    }
    if (rc) { cJSON_Delete(doc); return rc; }
    char *json = cJSON_PrintUnformatted(doc);
    cJSON_Delete(doc);
    const util_embedded_file *tpl = util_embedded_find("cli/report.html");
    if (!json || !tpl) { free(json); return util_fail(err, UTIL_ERUNTIME, "report: template cli/report.html not built in"); }
    const char *mark = "/*DHP_DATA*/null";
    const char *t = (const char *)tpl->data, *at = strstr(t, mark);
    if (!at) { free(json); return util_fail(err, UTIL_ERUNTIME, "report: template lacks the data mark"); }
    /* "</" inside a <script> would end it: names come from user files. */
    size_t jn = strlen(json), cap = tpl->len + 6 * jn + 1, len = 0;
    char *out = malloc(cap);
    memcpy(out, t, (size_t)(at - t));
    len = (size_t)(at - t);
    for (size_t i = 0; i < jn; i++) {
        if (json[i] == '<') { memcpy(out + len, "\\u003c", 6); len += 6; }
        else out[len++] = json[i];
    }
    const char *rest = at + strlen(mark);
    size_t rn = tpl->len - (size_t)(rest - t);
    memcpy(out + len, rest, rn);
    len += rn;
    free(json);
    rc = util_write_atomic(path, out, len, err);
    free(out);
    return rc;
}
