#include "cli/cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DHP_VERSION "0.1.0"

/* Subcommands live in cli/cmd_*.c. */
int cmd_plan(int argc, char **argv);
int cmd_memory(int argc, char **argv);
int cmd_models(int argc, char **argv);
int cmd_clusters(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_export_weights(int argc, char **argv);

static const cli_command commands[] = {
    { "plan", cmd_plan, "find the fastest per-module plan that fits; compare with baselines" },
    { "memory", cmd_memory, "memory dry-run: will a plan fit, and where the memory goes" },
    { "models", cmd_models, "list the model zoo, or print one model's description" },
    { "clusters", cmd_clusters, "list cluster presets, or print one" },
    { "import", cmd_import, "convert a Hugging Face config.json (file or URL) into a model description" },
    { "run", cmd_run, "train the model of a plan file (mpirun -np WORLD dhp run plan.json --data DIR)" },
    { "data", cmd_data, "synthesise / inspect data sets, inspect / copy checkpoints" },
    { "simulate", cmd_simulate, "simulate one step of a plan op by op: step time, idle, critical path, trace" },
    { "launch", cmd_launch, "run a plan where it says: mpirun with a rankfile, an sbatch script, or a Ray job" },
    { "export", cmd_export, "a plan's strategy as Megatron-LM arguments, DeepSpeed or torchtitan configs" },
    { "export-weights", cmd_export_weights, "a run's checkpoint as Hugging Face safetensors + config.json" },
    { "profile", cmd_profile, "measure this host's CPU backend: write a GPU and a cluster JSON for the planner" },
    { NULL, NULL, NULL }
};

/* Messages name files and arguments: scrubbed of control codes, as util_fail does. */
int cli_bad_input(const char *msg)
{
    char line[UTIL_ERR_LEN];
    util_strlcpy(line, msg, sizeof line);
    util_sanitize(line);
    fprintf(stderr, "dhp: %s\n", line);
    return 2;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    util_sanitize(msg);
    fprintf(stderr, "dhp %s: %s (see 'dhp %s --help')\n", cmd, msg, cmd);
    return 2;
}

static void usage(FILE *f)
{
    fprintf(f, "dhp %s — plan and run disaggregated hybrid-parallel training of multimodal models\n\n"
               "usage: dhp <command> [options]\n\ncommands:\n", DHP_VERSION);
    for (const cli_command *c = commands; c->name; c++) fprintf(f, "  %-10s %s\n", c->name, c->summary);
    fprintf(f, "\n'dhp <command> --help' shows a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) { printf("dhp %s\n", DHP_VERSION); return 0; }
    for (const cli_command *c = commands; c->name; c++)
        if (!strcmp(argv[1], c->name)) return c->fn(argc - 1, argv + 1);
    char name[64];
    util_strlcpy(name, argv[1], sizeof name);
    util_sanitize(name);
    fprintf(stderr, "dhp: unknown command '%s' (see 'dhp --help')\n", name);
    return 2;
}
