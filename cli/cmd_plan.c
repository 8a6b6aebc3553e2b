/* dhp plan: the optimal plan, its alternatives and the baselines. */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(void)
{
    printf("usage: dhp plan [options]\n\n"
           "Finds the fastest per-module parallel plan that fits (GLPK MILP over priced candidates),\n"
           "prints it with the next-best alternatives and the baselines on the same cost model,\n"
           "and writes the plan file the executor runs.\n\n%s"
           "  --placement P         auto (default), colocated or disaggregated\n"
           "  --top K               alternatives to show (default 4)\n"
           "  --no-baselines        skip the baselines\n"
           "  --exhaustive          enumerate every combination instead of the MILP (small cases)\n"
           "  -o, --out FILE        write the chosen plan (default plan.json; '-': stdout, the report\n"
           "                        then goes to stderr)\n"
           "  --pick N              write alternative N instead (0 = the chosen plan, 1..--top the next best)\n"
           "  --compare             Ray's published grid (1024..65536 vision tokens, batch 8/8/8/8/4/2):\n"
           "                        zero3, tp, sp-tp and dhp per row (precision bf16-autocast and target\n"
           "                        megatron, as the experiment ran, unless given)\n"
           "  --grid T:B,...        the grid for --compare, vision tokens:batch pairs\n"
           "  --strategy SPEC       no search: the plan of explicit per-module strategies, e.g.\n"
           "                        'vision:gpus=1,sp=1;llm:gpus=2,tp=2' (keys dp tp sp cp pp vp split zero\n"
           "                        mb rc rc_layers seqpar pool gpus; cp: the LLM's sp as ulysses (all-to-alls\n"
           "                        of heads) or ring (ring attention: Megatron-Core's and torchtitan's context\n"
           "                        parallelism), default ulysses where tp x sp divides the heads, else ring;\n"
           "                        vp: interleaved stages per pp rank; split:\n"
           "                        blocks per stage, 7:8:8:7, or 'ends': the embedding and the head a block\n"
           "                        each in an even split over pp x vp, Megatron-Core's account-for-embedding/\n"
           "                        loss, Llama 3's layout; rc_layers=N with rc=full: only the first N blocks\n"
           "                        of each stage (chunk) recompute, Megatron's --recompute-method block), with\n"
           "                        --placement colocated (default) or disaggregated\n"
           "  --gpus N              GPUs (ranks) a --strategy plan uses (default: all of pool 0)\n"
           "  --n-micro N           chunks pipelined between module groups (--strategy, disaggregated)\n"
           "  --report FILE.html    also write a self-contained HTML report: GPU map, memory per GPU,\n"
           "                        simulated step timeline, throughput against the baselines\n", cli_setup_help);
}

typedef struct {
    cli_setup setup;
    const char *out;
    const char *grid;
    const char *strategy;
    const char *report;
    int gpus, n_micro;
    int top, pick;
    bool baselines, compare, exhaustive;
    bool colocated, disaggregated;
} plan_args;

static int parse_args(int argc, char **argv, plan_args *a)
{
    memset(a, 0, sizeof *a);
    cli_setup_default(&a->setup);
    a->out = "plan.json";
    a->grid = "1024:8,4096:8,9216:8,16384:8,25600:4,65536:2";
    a->top = 4;
    a->n_micro = 1;
    a->baselines = true;
    a->colocated = a->disaggregated = true;
    for (int i = 1; i < argc; i++) {
        int r = cli_setup_arg("plan", &a->setup, argc, argv, &i);
        if (r == 2) return 2;
        if (r == 1) continue;
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) { usage(); return 1; }
        else if (!strcmp(o, "--top")) { if (cli_int_arg("plan", o, v, 0, 15, &a->top)) return 2; i++; }
        else if (!strcmp(o, "--pick")) { if (cli_int_arg("plan", o, v, 0, 15, &a->pick)) return 2; i++; }
        else if (!strcmp(o, "--no-baselines")) a->baselines = false;
        else if (!strcmp(o, "--compare")) a->compare = true;
        else if (!strcmp(o, "--exhaustive")) a->exhaustive = true;
        else if (!strcmp(o, "--strategy")) { if (!v) return cli_usage_error("plan", "--strategy needs a value"); a->strategy = v; i++; }
        else if (!strcmp(o, "--gpus")) { if (cli_int_arg("plan", o, v, 1, 1 << 24, &a->gpus)) return 2; i++; }
        else if (!strcmp(o, "--n-micro")) { if (cli_int_arg("plan", o, v, 1, 1 << 20, &a->n_micro)) return 2; i++; }
        else if (!strcmp(o, "--report")) { if (!v) return cli_usage_error("plan", "--report needs a value"); a->report = v; i++; }
        else if (!strcmp(o, "--grid")) { if (!v) return cli_usage_error("plan", "--grid needs a value"); a->grid = v; i++; }
        else if (!strcmp(o, "-o") || !strcmp(o, "--out")) {
            if (!v) return cli_usage_error("plan", "%s needs a value", o);
            a->out = v; i++;
        } else if (!strcmp(o, "--placement")) {
            if (!v) return cli_usage_error("plan", "--placement needs a value");
            static const char *const placements[] = { "auto", "colocated", "disaggregated" };   /* auto: both */
            char why[UTIL_ERR_LEN];
            int pl = util_name_index(v, placements, 3, why);
            if (pl < 0) return cli_usage_error("plan", "--placement: %s", why);
            a->disaggregated = pl != 1;
            a->colocated = pl != 2;
            i++;
        } else return cli_usage_error("plan", "unknown option '%s'", o);
    }
    if (a->compare) return 0;   /* --compare writes no plan */
    char err[UTIL_ERR_LEN];
    if (!strcmp(a->out, "-")) {
        if (a->setup.json) return cli_usage_error("plan", "--json and -o - would both write to stdout");
        if (cli_reserve_stdout()) return cli_usage_error("plan", "-o -: cannot keep stdout for the plan");
    } else if (util_check_output(a->out, err)) {
        return cli_usage_error("plan", "%s", err);   /* before a search that may take minutes */
    }
    return 0;
}

static void search_options(const plan_args *a, plan_search_options *so)
{
    plan_search_options_default(so);
    cli_setup_options(&a->setup, &so->opt);
    so->top_k = a->top;
    so->allow_colocated = a->colocated;
    so->allow_disaggregated = a->disaggregated;
    so->exhaustive = a->exhaustive;
}

static int run_baselines(const model_t *m, const cost_cluster *c, const plan_workload *w, const plan_options *o,
                         plan_t *out, bool *have)
{
    for (int b = 0; b < PLAN_NBASE; b++) {
        char err[UTIL_ERR_LEN];
        have[b] = plan_baseline_make((plan_baseline)b, m, c, w, o, &out[b], err) == UTIL_OK;
    }
    return 0;
}

static double best_fitting_baseline(const plan_t *base, const bool *have)
{
    double best = 0;
    for (int b = 0; b < PLAN_NBASE; b++)
        if (have[b] && base[b].pred.fits && (best == 0 || base[b].pred.step_time_s < best)) best = base[b].pred.step_time_s;
    return best;
}

/* --strategy: the given per-module strategies as a plan, evaluated and written. */
static int plan_strategy(const plan_args *a)
{
    model_t m; cost_cluster c; plan_workload w;
    if (cli_setup_load("plan", &a->setup, &m, &c, &w)) return 2;
    static plan_t p;
    char err[UTIL_ERR_LEN];
    plan_placement pl = a->colocated ? PLAN_COLOCATED : PLAN_DISAGGREGATED;
    plan_options opt;
    cli_setup_options(&a->setup, &opt);
    if (plan_from_strategy_opts(a->strategy, &m, &c, &w, pl, a->gpus, a->n_micro, &opt, &p, err)) return cli_usage_error("plan", "%s", err);
    /* as the search's plans: the dhp target's memory and fits rank by rank (the hand-off included);
     * the Megatron target keeps its formulas' (and the published bench its analytic step) */
    if (p.target == PLAN_TARGET_DHP) plan_sim_predict(&p, NULL);
    if (plan_write(a->out, &p, err)) { fprintf(stderr, "dhp plan: %s\n", err); return 2; }
    if (a->report && cli_report_write(a->report, &p, NULL, 0, a->baselines, NULL, err)) return cli_bad_input(err);
    if (a->setup.json) {
        cJSON *doc = plan_to_json(&p);
        cJSON_AddItemToObject(doc, "step_parts", cli_step_parts_json(&p));
        cli_emit_json(doc);
        return 0;
    }
    cli_print_header(&m, &c, &w);
    printf("plan from --strategy\n");
    cli_print_plan(&p);
    printf("\n");
    cli_print_plan_row_header();
    cli_print_plan_row("strategy", &p);
    printf("wrote %s\n", strcmp(a->out, "-") ? a->out : "the plan to stdout");
    return 0;
}

/* The chosen plan against its alternatives and the baselines. */
static int write_report(const plan_args *a, const plan_search_result *r, const plan_t *base, const bool *have, char *err)
{
    cli_report_row rows[16 + PLAN_NBASE];
    static char names[16][16];
    int n = 0;
    for (int i = 1; i < r->n_plans && i < 16; i++) {
        snprintf(names[i], sizeof names[i], "alt %d", i);
        rows[n++] = (cli_report_row){ names[i], &r->plans[i] };
    }
    for (int b = 0; b < PLAN_NBASE; b++)
        if (have[b]) rows[n++] = (cli_report_row){ plan_baseline_name((plan_baseline)b), &base[b] };
    return cli_report_write(a->report, &r->plans[0], rows, n, false, NULL, err);
}

static int plan_once(const plan_args *a)
{
    if (a->strategy) return plan_strategy(a);
    model_t m; cost_cluster c; plan_workload w;
    if (cli_setup_load("plan", &a->setup, &m, &c, &w)) return 2;
    plan_search_options so;
    search_options(a, &so);
    static plan_search_result r;
    char err[UTIL_ERR_LEN];
    int rc = plan_search(&m, &c, &w, &so, &r, err);
    if (rc) { fprintf(stderr, "dhp plan: %s\n", err); return 2; }
    static plan_t base[PLAN_NBASE];
    bool have[PLAN_NBASE] = { false };
    if (a->baselines) run_baselines(&m, &c, &w, &so.opt, base, have);
    if (a->pick >= r.n_plans)
        return cli_usage_error("plan", "--pick %d: the search found %d plan(s) (0 .. %d)", a->pick, r.n_plans, r.n_plans - 1);
    if ((rc = plan_write(a->out, &r.plans[a->pick], err))) {
        fprintf(stderr, "dhp plan: %s\n", err);
        return 2;
    }
    double best_base = best_fitting_baseline(base, have);
    if (a->report && write_report(a, &r, base, have, err)) return cli_bad_input(err);
    if (a->setup.json) {
        cJSON *doc = cJSON_CreateObject();
        cJSON_AddItemToObject(doc, "plan", plan_to_json(&r.plans[0]));
        cJSON_AddItemToObject(doc, "step_parts", cli_step_parts_json(&r.plans[0]));
        cJSON *alts = cJSON_AddArrayToObject(doc, "alternatives");
        for (int i = 1; i < r.n_plans; i++) cJSON_AddItemToArray(alts, cli_plan_summary_json(&r.plans[i]));
        cJSON *bs = cJSON_AddArrayToObject(doc, "baselines");
        for (int b = 0; b < PLAN_NBASE; b++) if (have[b]) cJSON_AddItemToArray(bs, cli_plan_summary_json(&base[b]));
        cJSON *st = cJSON_AddObjectToObject(doc, "search");
        cJSON_AddNumberToObject(st, "candidates", r.n_candidates);
        cJSON_AddNumberToObject(st, "milp_vars", r.n_milp_vars);
        cJSON_AddNumberToObject(st, "milp_rows", r.n_milp_rows);
        cJSON_AddNumberToObject(st, "milp_solves", r.milp_solves);
        cJSON_AddNumberToObject(st, "seconds", r.search_s);
        if (best_base > 0) cJSON_AddNumberToObject(doc, "speedup_vs_best_baseline", best_base / r.plans[0].pred.step_time_s);
        cli_emit_json(doc);
        return 0;
    }
    cli_print_header(&m, &c, &w);
    printf("search   %d candidates priced, MILP %d variables x %d constraints, %d solves, %.2f s\n\n",
           r.n_candidates, r.n_milp_vars, r.n_milp_rows, r.milp_solves, r.search_s);
    printf("chosen plan\n");
    cli_print_plan(&r.plans[0]);
    printf("\n");
    cli_print_plan_row_header();
    cli_print_plan_row("dhp", &r.plans[0]);
    for (int i = 1; i < r.n_plans; i++) {
        char name[32];
        snprintf(name, sizeof name, "alt %d", i);
        cli_print_plan_row(name, &r.plans[i]);
    }
    if (a->baselines) {
        printf("baselines (same cost model)\n");
        for (int b = 0; b < PLAN_NBASE; b++) if (have[b]) cli_print_plan_row(plan_baseline_name((plan_baseline)b), &base[b]);
        if (!r.plans[0].pred.fits)
            printf("\ndhp's plan does not fit rank by rank (the hand-off's buffers and messages beside every module's "
                   "memory); %s\n", best_base > 0 ? "a baseline above does" : "nor does any baseline");
        else if (best_base > 0) printf("\ndhp is %.2fx the best baseline that fits\n", best_base / r.plans[0].pred.step_time_s);
        else printf("\nno baseline fits; dhp's plan does\n");
    }
    printf("wrote %s%s\n", strcmp(a->out, "-") ? a->out : "the plan to stdout", a->pick ? " (the alternative --pick names)" : "");
    return 0;
}

/* Ray's grid: each row is vision tokens:batch. */
static int parse_grid(const char *grid, int *tokens, int *batch, int max)
{
    int n = 0;
    const char *p = grid;
    while (*p && n < max) {
        char *end;
        long t = strtol(p, &end, 10);
        if (end == p || *end != ':' || t < 1) return -1;
        p = end + 1;
        long b = strtol(p, &end, 10);
        if (end == p || b < 1 || (*end && *end != ',')) return -1;
        tokens[n] = (int)t; batch[n] = (int)b; n++;
        p = *end ? end + 1 : end;
    }
    return *p ? -1 : n;
}

/* Ray's experiment trains under torch.autocast with fp32 weights, in PyTorch with
 * DeepSpeed ZeRO-3 and Megatron-style TP: its rows are priced as those
 * frameworks run (the megatron target) unless --target says otherwise. */
static int compare(const plan_args *a_in)
{
    plan_args copy = *a_in;
    const plan_args *a = &copy;
    if (!copy.setup.precision_given) copy.setup.opt.precision = PLAN_OPT_AUTOCAST;
    if (!copy.setup.target_given) {
        copy.setup.opt.target = PLAN_TARGET_MEGATRON;
        copy.setup.target_given = true;
    }
    int tokens[32], batch[32];
    int n = parse_grid(a->grid, tokens, batch, 32);
    if (n <= 0) return cli_usage_error("plan", "--grid: '%s' is not TOKENS:BATCH[,TOKENS:BATCH...]", a->grid);
    cJSON *rows = cJSON_CreateArray();
    bool header = false;
    for (int i = 0; i < n; i++) {
        cli_setup s = a->setup;
        s.vision_tokens = tokens[i];
        s.batch = batch[i];
        s.image_size = 0;
        model_t m; cost_cluster c; plan_workload w;
        if (cli_setup_load("plan", &s, &m, &c, &w)) { cJSON_Delete(rows); return 2; }
        if (!header && !a->setup.json) { cli_print_header(&m, &c, &w); header = true; }
        plan_search_options so;
        search_options(a, &so);
        so.top_k = 0;
        plan_baseline order[] = { PLAN_BASE_ZERO3, PLAN_BASE_TP, PLAN_BASE_SP_TP };
        if (!a->setup.json) { printf("\nvision tokens %d, batch %d\n", tokens[i], batch[i]); cli_print_plan_row_header(); }
        cJSON *row = cJSON_CreateObject();
        cJSON_AddNumberToObject(row, "vision_tokens", tokens[i]);
        cJSON_AddNumberToObject(row, "batch", batch[i]);
        cJSON *strategies = cJSON_AddArrayToObject(row, "strategies");
        for (size_t b = 0; b < sizeof order / sizeof order[0]; b++) {
            static plan_t p;
            char err[UTIL_ERR_LEN];
            if (plan_baseline_make(order[b], &m, &c, &w, &so.opt, &p, err)) continue;
            if (!a->setup.json) cli_print_plan_row(plan_baseline_name(order[b]), &p);
            cJSON_AddItemToArray(strategies, cli_plan_summary_json(&p));
        }
        static plan_search_result r;
        char err[UTIL_ERR_LEN];
        if (plan_search(&m, &c, &w, &so, &r, err) == UTIL_OK) {
            if (!a->setup.json) cli_print_plan_row("dhp", &r.plans[0]);
            cJSON_AddItemToArray(strategies, cli_plan_summary_json(&r.plans[0]));
        } else if (!a->setup.json) {
            printf("  %-12s %s\n", "dhp", err);
        }
        cJSON_AddItemToArray(rows, row);
    }
    if (a->setup.json) cli_emit_json(rows);
    else cJSON_Delete(rows);
    return 0;
}

int cmd_plan(int argc, char **argv)
{
    plan_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    util_progress_enable(isatty(STDERR_FILENO));
    return a.compare ? compare(&a) : plan_once(&a);
}
