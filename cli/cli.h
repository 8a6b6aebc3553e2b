/* cli: the dhp binary's subcommands. Each returns the process exit code:
 * 0 success, 1 a run that failed at run time (e.g. OOM verdict with --check),
 * 2 bad input (one clear line on stderr). */
#ifndef DHP_CLI_H
#define DHP_CLI_H

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);   /* argv[0] is the subcommand name */
    const char *summary;
} cli_command;

/* Prints "dhp: <msg>" on stderr and returns 2. */
int cli_bad_input(const char *msg);
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cmd_profile(int argc, char **argv);   /* cli/cmd_profile.c */

#endif

#include "models/models.h"
#include "costdb/costdb.h"
#include "planner/planner.h"

/* Options shared by plan / memory / compare: model, cluster, workload. */
typedef struct {
    const char *model;        /* zoo name or path */
    const char *cluster;      /* preset or path */
    int batch, images, vision_tokens, image_size, audio_frames, text_tokens;
    plan_options opt;         /* --precision, --target, --zero3, --adamw, --grad-reduce, --tp-style, --tf32,
                               * --backend (what memory is predicted for); the rest plan_options_default's */
    bool precision_given, target_given, backend_given;
    bool json;
} cli_setup;

void cli_setup_default(cli_setup *s);
/* Consumes argv[*i] (and its value) if it is a setup option; returns 1 if
 * consumed, 0 if not a setup option, 2 on a bad value (message printed). */
int cli_setup_arg(const char *cmd, cli_setup *s, int argc, char **argv, int *i);
/* The memory and cost options the setup asks for: its precision and target
 * (the target its precision implies unless --target was given). */
void cli_setup_options(const cli_setup *s, plan_options *o);
/* A plan read from a file: the backend --backend names, where given (the file does not say). */
void cli_setup_backend(const cli_setup *s, plan_t *p);
/* Loads model and cluster and builds the workload; prints the error and returns 2 on bad input. */
int cli_setup_load(const char *cmd, const cli_setup *s, model_t *m, cost_cluster *c, plan_workload *w);
extern const char *cli_setup_help;

/* Parses a positive integer option value; prints an error and returns 2 if bad. */
int cli_int_arg(const char *cmd, const char *opt, const char *val, int lo, int hi, int *out);

/* The HTML report (cli/report.c, template cli/report.html): the plan's GPU
 * map, memory per GPU, simulated step (and a measured one from a dhp run
 * --trace file), and its throughput against rows (alternatives) and, with
 * baselines, the baselines on the same cost model. Written atomically. */
typedef struct { const char *label; const plan_t *plan; } cli_report_row;
int cli_report_write(const char *path, const plan_t *p, const cli_report_row *rows, int n_rows, bool baselines,
                     const char *measured, char *err);

/* dhp simulate (cli/cmd_simulate.c). */
int cmd_simulate(int argc, char **argv);

/* A growing string (cli/strbuf.c): s is NUL-terminated (NULL until the first add). */
typedef struct { char *s; size_t len, cap; } cli_buf;
void cli_buf_add(cli_buf *b, const char *s);
void cli_buf_printf(cli_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends w as one POSIX shell word (single-quoted when needed). */
void cli_buf_word(cli_buf *b, const char *w);
void cli_buf_free(cli_buf *b);

/* Printing helpers (cli/print.c). */
/* "33.45B", "156.6K", "108.0M"; "-" for 0. */
const char *cli_fmt_count(double n, char *buf, size_t len);
void cli_print_header(const model_t *m, const cost_cluster *c, const plan_workload *w);
void cli_print_plan(const plan_t *p);
/* Where each module's seconds of the step go (plan_step_parts_of), one object a module; a string on error. */
cJSON *cli_step_parts_json(const plan_t *p);
/* One line: the backend p's memory is predicted for and what it adds (plan_backend_workspace_bytes). */
void cli_print_backend(const plan_t *p);
void cli_print_plan_row_header(void);
void cli_print_plan_row(const char *name, const plan_t *p);
cJSON *cli_plan_summary_json(const plan_t *p);
/* Prints the JSON document (formatted) on stdout and frees it. */
void cli_emit_json(cJSON *doc);
/* For a command whose output file is "-": its report moves to stderr and
 * stdout is kept for the data (util_write_output("-")). 0, or -1. */
int cli_reserve_stdout(void);
