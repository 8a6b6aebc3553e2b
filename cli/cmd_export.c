/* dhp export --to megatron|deepspeed|torchtitan PLAN.json: the plan's
 * strategy as the trainer's own arguments or configuration (cli/export.c). */
#include "cli/cli_export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    printf("usage: dhp export --to megatron|deepspeed|torchtitan PLAN.json [-o FILE] [--json]\n\n"
           "Writes the plan's strategy in a trainer's own terms:\n"
           "  megatron    Megatron-LM arguments for the LLM (TP, PP, context parallelism for dhp's\n"
           "              sequence parallelism, sequence parallel, distributed optimizer or Megatron\n"
           "              FSDP for ZeRO, micro and global batch, recomputation, precision, the model's\n"
           "              sizes) and each module's Megatron Core MIMO grid (ModuleGridSpec)\n"
           "  deepspeed   one DeepSpeed config per module (JSON)\n"
           "  torchtitan  a torchtitan --job.config_file TOML for the LLM\n"
           "Notes (comments, or \"notes\" with --json) say where the trainer differs from the plan.\n"
           "  -o FILE     write atomically instead of printing\n"
           "  --json      the structured form for every trainer\n");
}

/* A shell word: quoted when it holds anything but safe characters. */
static void shell_word(char **buf, size_t *len, size_t *cap, const char *w)
{
    bool plain = *w != '\0';
    for (const char *c = w; *c; c++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,/=+:", *c)) plain = false;
    size_t need = strlen(w) * 4 + 4;
    if (*len + need + 1 > *cap) {
        *cap = (*len + need + 1) * 2;
        *buf = realloc(*buf, *cap);
    }
    if (plain) *len += (size_t)sprintf(*buf + *len, "%s", w);
    else {
        (*buf)[(*len)++] = '\'';
        for (const char *c = w; *c; c++) {
            if (*c == '\'') { memcpy(*buf + *len, "'\\''", 4); *len += 4; }
            else (*buf)[(*len)++] = *c;
        }
        (*buf)[(*len)++] = '\'';
        (*buf)[*len] = '\0';
    }
}

static void append(char **buf, size_t *len, size_t *cap, const char *s)
{
    size_t n = strlen(s);
    if (*len + n + 1 > *cap) { *cap = (*len + n + 1) * 2; *buf = realloc(*buf, *cap); }
    memcpy(*buf + *len, s, n + 1);
    *len += n;
}

static void append_notes(char **b, size_t *len, size_t *cap, const cJSON *doc)
{
    const cJSON *n;
    cJSON_ArrayForEach(n, cJSON_GetObjectItemCaseSensitive(doc, "notes")) {
        append(b, len, cap, "# note: ");
        append(b, len, cap, n->valuestring);
        append(b, len, cap, "\n");
    }
}

/* Megatron: "# ..." lines, then the arguments, two per line (flag value). */
static char *render_megatron(const cJSON *doc, const char *plan)
{
    size_t len = 0, cap = 4096;
    char *b = calloc(1, cap), line[512];
    snprintf(line, sizeof line, "# dhp export --to megatron %s: Megatron-LM arguments for the language model\n"
             "# (megatron/training/arguments.py, Megatron-LM core_v0.15.0), world size %d\n", plan,
             cJSON_GetObjectItemCaseSensitive(doc, "world_size")->valueint);
    append(&b, &len, &cap, line);
    const cJSON *a, *args = cJSON_GetObjectItemCaseSensitive(doc, "args");
    bool first = true;
    cJSON_ArrayForEach(a, args) {
        bool flag = !strncmp(a->valuestring, "--", 2);
        if (flag && !first) append(&b, &len, &cap, " \\\n");
        else if (!first) append(&b, &len, &cap, " ");
        if (flag) append(&b, &len, &cap, "    ");
        shell_word(&b, &len, &cap, a->valuestring);
        first = false;
    }
    append(&b, &len, &cap, "\n# Megatron Core MIMO per-module grids (examples/mimo/training/topology.py ModuleGridSpec):\n");
    const cJSON *g;
    cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(doc, "mimo_module_grid_specs")) {
        snprintf(line, sizeof line, "#   ModuleGridSpec(name=\"%s\", num_ranks=%d, tp=%d, cp=%d, pp=%d, rank_offset=%d)\n",
                 cJSON_GetObjectItemCaseSensitive(g, "name")->valuestring,
                 cJSON_GetObjectItemCaseSensitive(g, "num_ranks")->valueint,
                 cJSON_GetObjectItemCaseSensitive(g, "tp")->valueint, cJSON_GetObjectItemCaseSensitive(g, "cp")->valueint,
                 cJSON_GetObjectItemCaseSensitive(g, "pp")->valueint,
                 cJSON_GetObjectItemCaseSensitive(g, "rank_offset")->valueint);
        append(&b, &len, &cap, line);
    }
    append_notes(&b, &len, &cap, doc);
    return b;
}

/* torchtitan: TOML sections with the plan's notes as comments. */
static char *render_torchtitan(const cJSON *doc, const char *plan)
{
    size_t len = 0, cap = 4096;
    char *b = calloc(1, cap), line[512];
    snprintf(line, sizeof line, "# dhp export --to torchtitan %s: torchtitan --job.config_file (torchtitan 0.2.2\n"
             "# torchtitan/config/job_config.py); add the [model], [optimizer] and data sections of your run\n", plan);
    append(&b, &len, &cap, line);
    append_notes(&b, &len, &cap, doc);
    const cJSON *sec, *kv;
    cJSON_ArrayForEach(sec, cJSON_GetObjectItemCaseSensitive(doc, "toml")) {
        snprintf(line, sizeof line, "\n[%s]\n", sec->string);
        append(&b, &len, &cap, line);
        cJSON_ArrayForEach(kv, sec) {
            if (cJSON_IsString(kv)) snprintf(line, sizeof line, "%s = \"%s\"\n", kv->string, kv->valuestring);
            else if (cJSON_IsBool(kv)) snprintf(line, sizeof line, "%s = %s\n", kv->string, cJSON_IsTrue(kv) ? "true" : "false");
            else snprintf(line, sizeof line, "%s = %d\n", kv->string, kv->valueint);
            append(&b, &len, &cap, line);
        }
    }
    return b;
}

int cmd_export(int argc, char **argv)
{
    const char *to = NULL, *plan_path = NULL, *out = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) { usage(); return 0; }
        else if (!strcmp(o, "--to")) { if (!v) return cli_usage_error("export", "--to needs a value"); to = v; i++; }
        else if (!strcmp(o, "-o") || !strcmp(o, "--out")) { if (!v) return cli_usage_error("export", "%s needs a value", o); out = v; i++; }
        else if (!strcmp(o, "--json")) json = true;
        else if (o[0] == '-') return cli_usage_error("export", "unknown option '%s'", o);
        else if (plan_path) return cli_usage_error("export", "more than one plan file given");
        else plan_path = o;
    }
    if (!to) return cli_usage_error("export", "--to megatron|deepspeed|torchtitan is required");
    cli_trainer t;
    if (!strcmp(to, "megatron")) t = CLI_MEGATRON;
    else if (!strcmp(to, "deepspeed")) t = CLI_DEEPSPEED;
    else if (!strcmp(to, "torchtitan")) t = CLI_TORCHTITAN;
    else return cli_usage_error("export", "--to: '%s' is not megatron, deepspeed or torchtitan", to);
    if (!plan_path) return cli_usage_error("export", "missing PLAN.json");
    static plan_t p;
    char err[UTIL_ERR_LEN];
    if (plan_read(plan_path, &p, err)) return cli_bad_input(err);
    cJSON *doc;
    if (cli_export(&p, t, &doc, err)) {
        char msg[UTIL_ERR_LEN + 300];
        snprintf(msg, sizeof msg, "%s: %s", plan_path, err);
        return cli_bad_input(msg);
    }
    char *text;
    if (json || t == CLI_DEEPSPEED) {
        char *j = cJSON_Print(doc);
        text = malloc(strlen(j) + 2);
        sprintf(text, "%s\n", j);
        free(j);
    } else {
        text = t == CLI_MEGATRON ? render_megatron(doc, plan_path) : render_torchtitan(doc, plan_path);
    }
    cJSON_Delete(doc);
    int rc = 0;
    if (out) {
        if (util_write_atomic(out, text, strlen(text), err)) rc = cli_bad_input(err);
    } else {
        fputs(text, stdout);
    }
    free(text);
    return rc;
}
