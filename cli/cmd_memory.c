/* dhp memory: per-GPU memory dry-run of a plan (a plan file, an explicit
 * strategy, a baseline, or the planner's choice). */
#include "cli/cli.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void usage(void)
{
    printf("usage: dhp memory [PLAN.json] [options]\n\n"
           "Will it fit, and where does the memory go: bytes per GPU of each module group.\n"
           "Without a plan file: --strategy, --baseline, or else the planner's choice.\n\n%s"
           "  --strategy SPEC       e.g. 'vision:sp=8,rc=full;llm:tp=8,zero=1' (keys dp tp sp cp pp vp split\n"
           "                        zero mb rc rc_layers seqpar pool gpus, as dhp plan --strategy)\n"
           "  --placement P         colocated (default with --strategy) or disaggregated (needs gpus=)\n"
           "  --n-micro N           chunks pipelined between groups (disaggregated)\n"
           "  --baseline NAME       zero3, tp, homogeneous or sp-tp\n"
           "  --check               exit 1 when the plan does not fit\n", cli_setup_help);
}


static void row(const char *name, const double *v, int n, bool colocated)
{
    double total = 0;
    char b[32];
    printf("  %-15s", name);
    for (int k = 0; k < n; k++) { printf(" %11s", util_fmt_bytes(v[k], b, sizeof b)); total += v[k]; }
    if (colocated && n > 1) printf(" %11s", util_fmt_bytes(total, b, sizeof b));
    printf("\n");
}

static void print_table(const plan_t *p, const plan_eval *ev)
{
    int n = p->n_modules;
    bool col = p->placement == PLAN_COLOCATED;
    printf("memory per GPU (%s", plan_placement_name(p->placement));
    printf(col ? ": every GPU holds all modules)\n" : ": each module on its own GPUs)\n");
    printf("  %-15s", "");
    for (int k = 0; k < n; k++) printf(" %11s", p->mod[k].module);
    if (col && n > 1) printf(" %11s", "per GPU");
    printf("\n");
    double v[MODEL_MAX_MODULES] = { 0 };
#define ROW(label, field) do { for (int k = 0; k < n; k++) v[k] = ev->mem[k].field; row(label, v, n, col); } while (0)
    ROW("parameters", params);
    ROW("gradients", grads);
    ROW("optimizer", optim);
    ROW("zero buffers", zero_buffers);
    ROW("activations", activations);
    ROW("logits", logits);
    ROW("comm buffers", comm);
    for (int k = 0; k < n; k++) v[k] = col && k > 0 ? 0 : ev->mem[k].reserved;
    row("reserved", v, n, col);
    for (int k = 0; k < n; k++) v[k] = col && k > 0 ? 0 : ev->mem[k].workspace;
    row("workspace", v, n, col);
    ROW("fragmentation", fragmentation);
    for (int k = 0; k < n; k++) v[k] = ev->mem[k].total - (col && k > 0 ? plan_mem_once(&ev->mem[k]) : 0);
    row("total", v, n, col);
    printf("  of which the transformer blocks' own (no embedding, head, final norm or logits):\n");
    ROW("block states", block_states);
    ROW("block activ.", block_acts);
#undef ROW
    /* a pipelined module's figures are one stage's: say which */
    for (int k = 0; k < n; k++)
        if (p->mod[k].pp > 1)
            printf("  %s: pipeline stage %d of %d, the busiest (each stage its own blocks, ends and units in flight)\n",
                   p->mod[k].module, ev->mem[k].stage, p->mod[k].pp);
}

static void dominant(const plan_t *p, const plan_eval *ev, char *buf, size_t len)
{
    int worst = 0;
    for (int k = 1; k < p->n_modules; k++) if (ev->mem[k].total > ev->mem[worst].total) worst = k;
    snprintf(buf, len, "%s (%s)", plan_mem_dominant(&ev->mem[worst]), p->mod[worst].module);
}

static cJSON *mem_json(const plan_mem *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "parameters", m->params);
    cJSON_AddNumberToObject(o, "gradients", m->grads);
    cJSON_AddNumberToObject(o, "optimizer", m->optim);
    cJSON_AddNumberToObject(o, "zero_buffers", m->zero_buffers);
    cJSON_AddNumberToObject(o, "activations", m->activations);
    cJSON_AddNumberToObject(o, "logits", m->logits);
    cJSON_AddNumberToObject(o, "comm_buffers", m->comm);
    cJSON_AddNumberToObject(o, "block_states", m->block_states);
    cJSON_AddNumberToObject(o, "block_activations", m->block_acts);
    cJSON_AddNumberToObject(o, "reserved", m->reserved);
    cJSON_AddNumberToObject(o, "workspace", m->workspace);
    cJSON_AddNumberToObject(o, "fragmentation", m->fragmentation);
    cJSON_AddNumberToObject(o, "total", m->total);
    cJSON_AddNumberToObject(o, "capacity", m->capacity);
    cJSON_AddNumberToObject(o, "stage", m->stage);
    return o;
}

/* The verdict's peak: the simulator's rank by rank where it ran the plan
 * (plan_sim_predict: the hand-off's buffers included), else the modules'. */
static double verdict_peak(const plan_t *p, const plan_eval *ev)
{
    double peak = ev->peak_mem;
    for (int k = 0; p->pred.simulated && k < p->n_modules; k++)
        if (p->pred.peak_mem_bytes[k] > peak) peak = p->pred.peak_mem_bytes[k];
    return peak;
}

/* Beside the verdict, the least recomputation that fits: beside OOM, the recomputation that
 * makes the plan fit (plan_fit_by_recompute); beside FITS, as few recomputed blocks as still fit
 * where the plan recomputes more (plan_trim_recompute); each judged as the plan is (the
 * simulator's peak where the dhp target runs it). *changed: the modules it changes, 0 for none. */
static void fit_hint(const plan_t *p, const plan_options *o, plan_t *f, unsigned *changed)
{
    char err[UTIL_ERR_LEN];
    *changed = 0;
    if (p->pred.fits) {
        *f = *p;
        if (plan_trim_recompute(f, o, err)) return;
        for (int k = 0; k < p->n_modules; k++)
            if (f->mod[k].recompute != p->mod[k].recompute || f->mod[k].recompute_layers != p->mod[k].recompute_layers)
                *changed |= 1u << k;
        return;
    }
    if (plan_fit_by_recompute(p, o, f, changed, err) || !*changed) return;
    if (f->target == PLAN_TARGET_DHP) plan_sim_predict(f, NULL);
    if (!f->pred.fits) *changed = 0;
}

/* "vision: rc=full,rc_layers=24; llm: rc=full": the modules of `changed` as --strategy keys. */
static void changed_text(const plan_t *f, unsigned changed, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < f->n_modules && len < n; k++) {
        if (!(changed >> k & 1)) continue;
        const plan_module *s = &f->mod[k];
        len += (size_t)snprintf(buf + len, n - len, "%s%s: rc=%s", len ? "; " : "", s->module,
                                plan_recompute_name(s->recompute));
        if (len < n && s->recompute_layers > 0)
            len += (size_t)snprintf(buf + len, n - len, ",rc_layers=%d", s->recompute_layers);
    }
}

static double plan_peak(const plan_t *p)
{
    double peak = 0;
    for (int k = 0; k < p->n_modules; k++) peak = fmax(peak, p->pred.peak_mem_bytes[k]);
    return peak;
}

static int report(const plan_t *p, const plan_eval *ev, const plan_options *o, bool json, bool check)
{
    static plan_t f;
    unsigned changed;
    fit_hint(p, o, &f, &changed);
    char dom[128];
    dominant(p, ev, dom, sizeof dom);
    double peak_bytes = verdict_peak(p, ev), margin = ev->capacity - peak_bytes;
    if (json) {
        cJSON *doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "placement", plan_placement_name(p->placement));
        cJSON_AddStringToObject(doc, "backend", plan_backend_name(plan_backend_of(p)));
        cJSON *mods = cJSON_AddArrayToObject(doc, "modules");
        for (int k = 0; k < p->n_modules; k++) {
            cJSON *mo = mem_json(&ev->mem[k]);
            cJSON_AddStringToObject(mo, "module", p->mod[k].module);
            cJSON_AddItemToArray(mods, mo);
        }
        cJSON_AddNumberToObject(doc, "peak_bytes", peak_bytes);
        cJSON_AddNumberToObject(doc, "modules_peak_bytes", ev->peak_mem);
        cJSON_AddNumberToObject(doc, "capacity_bytes", ev->capacity);
        cJSON_AddBoolToObject(doc, "fits", p->pred.fits);
        cJSON_AddStringToObject(doc, "dominant", dom);
        if (changed) {
            cJSON *fw = cJSON_AddObjectToObject(doc, "fits_with"), *ms = cJSON_AddArrayToObject(fw, "modules");
            for (int k = 0; k < f.n_modules; k++) {
                if (!(changed >> k & 1)) continue;
                cJSON *mo = cJSON_CreateObject();
                cJSON_AddStringToObject(mo, "module", f.mod[k].module);
                cJSON_AddStringToObject(mo, "recompute", plan_recompute_name(f.mod[k].recompute));
                cJSON_AddNumberToObject(mo, "recompute_layers", f.mod[k].recompute_layers);
                cJSON_AddItemToArray(ms, mo);
            }
            cJSON_AddNumberToObject(fw, "peak_bytes", plan_peak(&f));
            cJSON_AddNumberToObject(fw, "step_time_s", f.pred.step_time_s);
        }
        cli_emit_json(doc);
    } else {
        cli_print_plan(p);
        printf("\n");
        cli_print_backend(p);
        print_table(p, ev);
        char peak[32], cap[32], m[32];
        if (peak_bytes > ev->peak_mem)
            printf("  rank by rank (dhp simulate: each rank's activation slots and the encoder -> LLM hand-off's\n"
                   "  buffers and held messages, which no module's column holds): %s on the busiest rank\n",
                   util_fmt_bytes(peak_bytes, m, sizeof m));
        util_fmt_bytes(peak_bytes, peak, sizeof peak);
        util_fmt_bytes(ev->capacity, cap, sizeof cap);
        if (p->pred.fits) printf("\nFITS: peak %s of %s (%s free); largest term: %s\n", peak, cap,
                                 util_fmt_bytes(margin, m, sizeof m), dom);
        else printf("\nOOM by %s: peak %s of %s; largest term: %s\n", util_fmt_bytes(-margin, m, sizeof m), peak,
                    cap, dom);
        if (changed) {
            char what[256];
            changed_text(&f, changed, what, sizeof what);
            printf("%s %s (the least recomputation that fits: peak %s, step %.3f s against %.3f s)\n",
                   p->pred.fits ? "fits recomputing less, with" : "fits with", what,
                   util_fmt_bytes(plan_peak(&f), m, sizeof m), f.pred.step_time_s, p->pred.step_time_s);
        }
    }
    return check && !p->pred.fits ? 1 : 0;
}

int cmd_memory(int argc, char **argv)
{
    cli_setup setup;
    cli_setup_default(&setup);
    const char *plan_path = NULL, *strategy = NULL, *baseline = NULL;
    plan_placement pl = PLAN_COLOCATED;
    int n_micro = 1;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        int r = cli_setup_arg("memory", &setup, argc, argv, &i);
        if (r == 2) return 2;
        if (r == 1) continue;
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) { usage(); return 0; }
        else if (!strcmp(o, "--strategy")) { if (!v) return cli_usage_error("memory", "--strategy needs a value"); strategy = v; i++; }
        else if (!strcmp(o, "--baseline")) { if (!v) return cli_usage_error("memory", "--baseline needs a value"); baseline = v; i++; }
        else if (!strcmp(o, "--n-micro")) { if (cli_int_arg("memory", o, v, 1, 1 << 20, &n_micro)) return 2; i++; }
        else if (!strcmp(o, "--check")) check = true;
        else if (!strcmp(o, "--placement")) {
            if (!v) return cli_usage_error("memory", "--placement needs a value");
            char why[UTIL_ERR_LEN];
            if (plan_placement_parse(v, &pl, why)) return cli_usage_error("memory", "--placement: %s", why);
            i++;
        } else if (o[0] == '-') return cli_usage_error("memory", "unknown option '%s'", o);
        else if (plan_path) return cli_usage_error("memory", "more than one plan file given");
        else plan_path = o;
    }
    static plan_t p;
    char err[UTIL_ERR_LEN];
    plan_options opt;
    cli_setup_options(&setup, &opt);
    if (plan_path) {
        if (plan_read(plan_path, &p, err)) return cli_bad_input(err);
        cli_setup_backend(&setup, &p);
        opt = plan_options_of(&p);
    } else {
        model_t m; cost_cluster c; plan_workload w;
        if (cli_setup_load("memory", &setup, &m, &c, &w)) return 2;
        if (strategy) {
            if (plan_from_strategy_opts(strategy, &m, &c, &w, pl, 0, n_micro, &opt, &p, err)) return cli_usage_error("memory", "%s", err);
        } else if (baseline) {
            plan_baseline b;
            if (plan_baseline_parse(baseline, &b, err)) return cli_usage_error("memory", "--baseline: %s", err);
            if (plan_baseline_make(b, &m, &c, &w, &opt, &p, err)) return cli_usage_error("memory", "%s", err);
        } else {
            static plan_search_result r;
            plan_search_options so;
            plan_search_options_default(&so);
            so.opt = opt;
            so.top_k = 0;
            if (plan_search(&m, &c, &w, &so, &r, err)) { fprintf(stderr, "dhp memory: %s\n", err); return 2; }
            p = r.plans[0];
        }
    }
    plan_eval ev;
    if (plan_evaluate(&p, &opt, &ev, err)) return cli_usage_error("memory", "%s", err);
    if (p.target == PLAN_TARGET_DHP) plan_sim_predict(&p, NULL);   /* a plan the schedule does not run keeps plan_evaluate's */
    return report(&p, &ev, &opt, setup.json, check);
}
