/* dhp simulate: one training step of a plan, op by op, on the cost model:
 * step time, per-rank busy / communication / idle, the critical path, and
 * per-rank peak memory; optionally a Chrome trace of every op. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void usage(void)
{
    printf("usage: dhp simulate [PLAN.json] [options]\n\n"
           "Simulates one step of the plan's schedule (what every rank runs, in order) with each op\n"
           "priced by the cost model: step time, busy / communication / idle per rank, the critical\n"
           "path, and peak memory per rank. Without a plan file: --strategy (as dhp memory).\n\n"
           "  --cluster NAME|PATH   re-price the plan on another cluster (default: the plan's own)\n"
           "  --trace FILE          write the simulated step as a Chrome trace (chrome://tracing, Perfetto;\n"
           "                        '-': stdout, the report then goes to stderr)\n"
           "  --report FILE.html    write a self-contained HTML report (GPU map, memory, timeline, baselines)\n"
           "  --measured TRACE      with --report: draw a dhp run --trace file beside the simulated step\n"
           "  --strategy SPEC       e.g. 'vision:gpus=2;llm:gpus=6,tp=2,seqpar=0' (keys as dhp memory)\n"
           "  --placement P         colocated (default with --strategy) or disaggregated\n"
           "  --n-micro N           chunks pipelined between groups (disaggregated)\n%s", cli_setup_help);
}

typedef struct {
    cli_setup setup;
    const char *plan_path, *strategy, *trace, *report, *measured;
    bool cluster_given;
    plan_placement placement;
    int n_micro;
} sim_args;

static int parse_args(int argc, char **argv, sim_args *a)
{
    memset(a, 0, sizeof *a);
    cli_setup_default(&a->setup);
    a->placement = PLAN_COLOCATED;
    a->n_micro = 1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--cluster")) a->cluster_given = true;
        int r = cli_setup_arg("simulate", &a->setup, argc, argv, &i);
        if (r == 2) return 2;
        if (r == 1) continue;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) { usage(); return 1; }
        else if (!strcmp(o, "--trace")) { if (!v) return cli_usage_error("simulate", "--trace needs a value"); a->trace = v; i++; }
        else if (!strcmp(o, "--report")) { if (!v) return cli_usage_error("simulate", "--report needs a value"); a->report = v; i++; }
        else if (!strcmp(o, "--measured")) { if (!v) return cli_usage_error("simulate", "--measured needs a value"); a->measured = v; i++; }
        else if (!strcmp(o, "--strategy")) { if (!v) return cli_usage_error("simulate", "--strategy needs a value"); a->strategy = v; i++; }
        else if (!strcmp(o, "--n-micro")) { if (cli_int_arg("simulate", o, v, 1, 1 << 20, &a->n_micro)) return 2; i++; }
        else if (!strcmp(o, "--placement")) {
            if (!v) return cli_usage_error("simulate", "--placement needs a value");
            char why[UTIL_ERR_LEN];
            if (plan_placement_parse(v, &a->placement, why)) return cli_usage_error("simulate", "--placement: %s", why);
            i++;
        } else if (o[0] == '-') return cli_usage_error("simulate", "unknown option '%s'", o);
        else if (a->plan_path) return cli_usage_error("simulate", "more than one plan file given");
        else a->plan_path = o;
    }
    if (!a->plan_path && !a->strategy) return cli_usage_error("simulate", "give a plan file or --strategy");
    if (a->plan_path && a->strategy) return cli_usage_error("simulate", "give a plan file or --strategy, not both");
    if (a->measured && !a->report) return cli_usage_error("simulate", "--measured goes with --report");
    char err[UTIL_ERR_LEN];
    if (a->trace && !strcmp(a->trace, "-")) {
        if (a->setup.json) return cli_usage_error("simulate", "--json and --trace - would both write to stdout");
        if (cli_reserve_stdout()) return cli_usage_error("simulate", "--trace -: cannot keep stdout for the trace");
    } else if (a->trace && util_check_output(a->trace, err)) {
        return cli_usage_error("simulate", "%s", err);
    }
    if (a->report && util_check_output(a->report, err)) return cli_usage_error("simulate", "%s", err);
    return 0;
}

/* The plan to simulate: read (and re-priced on --cluster) or built from --strategy. */
static int load_plan(const sim_args *a, plan_t *p)
{
    char err[UTIL_ERR_LEN];
    plan_options opt;
    plan_options_default(&opt);
    if (a->plan_path) {
        if (plan_read(a->plan_path, p, err)) return cli_bad_input(err);
        cli_setup_backend(&a->setup, p);
        if (a->cluster_given) {
            cost_cluster c;
            if (cost_cluster_load(a->setup.cluster, &c, err)) return cli_usage_error("simulate", "%s", err);
            p->cluster = c;
            if (plan_validate(p, err))
                return cli_usage_error("simulate", "the plan does not fit cluster '%s': %s", c.name, err);
        }
        opt = plan_options_of(p);
        if (plan_assemble(p, &opt, err)) return cli_usage_error("simulate", "%s", err);
        return 0;
    }
    model_t m; cost_cluster c; plan_workload w;
    if (cli_setup_load("simulate", &a->setup, &m, &c, &w)) return 2;
    cli_setup_options(&a->setup, &opt);
    if (plan_from_strategy_opts(a->strategy, &m, &c, &w, a->placement, 0, a->n_micro, &opt, p, err))
        return cli_usage_error("simulate", "%s", err);
    return 0;
}

static void modules_of(const plan_t *p, int rank, char *buf, size_t n)
{
    buf[0] = 0;
    size_t len = 0;
    for (int k = 0; k < p->n_modules; k++) {
        plan_coord cd;
        if (!plan_rank_coord(p, k, rank, &cd)) continue;
        int w = snprintf(buf + len, n - len, "%s%s", len ? "+" : "", p->mod[k].module);
        if (w < 0 || (size_t)w >= n - len) break;
        len += (size_t)w;
    }
}

/* One rank's row after its rank number: modules, seconds, memory. */
static void rank_row(const plan_t *p, const plan_sim_result *r, int i, char *buf, size_t n)
{
    const plan_sim_rank *rk = &r->rank[i];
    const plan_sim_mem *m = &rk->mem;
    char mods[64];
    modules_of(p, i, mods, sizeof mods);
    char b[9][32];
    const double v[9] = { m->params, m->grads, m->optim, m->zero_buffers, m->activations, m->logits, m->comm,
                          m->other + m->workspace, m->total };
    for (int c = 0; c < 9; c++) util_fmt_bytes(v[c], b[c], sizeof b[c]);
    snprintf(buf, n, "%-12s %9.5f %9.5f %9.5f %5.1f%% | %9s %9s %9s %9s %9s %5d %9s %9s %9s %9s%s", mods, rk->busy_s,
             rk->comm_s, rk->idle_s, r->step_time_s > 0 ? 100 * rk->busy_s / r->step_time_s : 0, b[0], b[1], b[2], b[3],
             b[4], m->slots, b[5], b[6], b[7], b[8], m->total > m->capacity ? "  OOM" : "");
}

/* A run of consecutive ranks whose rows print the same is one line, its
 * ranks as first-last: a 2,240-rank data-parallel plan is one line, not
 * 2,240, while every rank that differs (a pipeline stage, a module's
 * group) keeps its own. */
static void print_ranks(const plan_t *p, const plan_sim_result *r)
{
    printf("\nper rank: seconds of the step, peak memory (activations: live slots; ranks a-b: each the same)\n");
    printf("  %9s %-12s %9s %9s %9s %6s | %9s %9s %9s %9s %9s %5s %9s %9s %9s %9s\n", "rank", "modules", "busy", "comm",
           "idle", "busy%", "params", "grads", "optim", "zero", "activ", "slots", "logits", "comm", "other", "total");
    /* other: the reservation, fragmentation and the backend's workspace (cli_print_backend) */
    char cur[2048], next[2048];   /* room for any double %9.5f prints */
    if (r->world_size > 0) rank_row(p, r, 0, cur, sizeof cur);
    for (int i = 0, first = 0; i < r->world_size; i++) {
        bool last = i + 1 == r->world_size;
        if (!last) {
            rank_row(p, r, i + 1, next, sizeof next);
            if (!strcmp(cur, next)) continue;   /* rank i + 1 joins the run */
        }
        char ranks[24];
        if (i == first) snprintf(ranks, sizeof ranks, "%d", i);
        else snprintf(ranks, sizeof ranks, "%d-%d", first, i);
        printf("  %9s %s\n", ranks, cur);
        if (!last) memcpy(cur, next, sizeof cur);
        first = i + 1;
    }
}

static void print_path(const plan_t *p, const plan_sim_result *r)
{
    printf("\ncritical path (%d ops; each begins when the one above ends, or its message arrives)\n", r->n_path);
    printf("  %4s %-40s %10s %10s %10s\n", "rank", "op", "start", "end", "waited");
    for (int i = 0; i < r->n_path; i++) {
        const plan_sim_op *o = &r->rank[r->path[i].rank].ops[r->path[i].op];
        char name[96];
        plan_sim_op_label(p, &o->op, name, sizeof name);
        printf("  %4d %-40s %10.6f %10.6f %10.6f\n", r->path[i].rank, name, o->start_s, o->end_s, o->begin_s - o->start_s);
    }
}

int cmd_simulate(int argc, char **argv)
{
    sim_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    util_progress_enable(isatty(STDERR_FILENO));
    static plan_t p;
    if ((rc = load_plan(&a, &p))) return rc;
    double analytic = p.pred.step_time_s;
    char err[UTIL_ERR_LEN];
    plan_sim_result r;
    if (plan_sim_run(&p, NULL, &r, err)) return cli_usage_error("simulate", "%s", err);
    if ((a.trace && plan_sim_write_trace(a.trace, &p, &r, err)) ||
        (a.report && cli_report_write(a.report, &p, NULL, 0, true, a.measured, err))) {
        plan_sim_free(&r);
        return cli_bad_input(err);
    }
    if (a.setup.json) {
        cJSON *doc = plan_sim_to_json(&p, &r);
        cJSON_AddNumberToObject(doc, "analytic_step_time_s", analytic);
        cJSON_AddStringToObject(doc, "cluster", p.cluster.name);
        cJSON_AddStringToObject(doc, "placement", plan_placement_name(p.placement));
        cJSON_AddNumberToObject(doc, "chunks", plan_chunks(&p));
        if (a.trace) cJSON_AddStringToObject(doc, "trace", a.trace);
        cli_emit_json(doc);
    } else {
        cli_print_header(&p.model, &p.cluster, &p.work);
        printf("\n");
        cli_print_plan(&p);
        printf("\n");
        cli_print_backend(&p);
        printf("\nsimulated step %.6f s (analytic cost model %.6f s, %+.1f%%), %d chunks, %d ranks\n", r.step_time_s,
               analytic, analytic > 0 ? 100 * (r.step_time_s / analytic - 1) : 0, plan_chunks(&p), r.world_size);
        print_ranks(&p, &r);
        print_path(&p, &r);
        if (a.trace) printf("\nwrote %s\n", a.trace);
    }
    plan_sim_free(&r);
    return 0;
}
