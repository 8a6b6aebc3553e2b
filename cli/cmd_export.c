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
           "              FSDP for ZeRO, micro and global batch, recomputation, precision, the\n"
           "              pipeline split, the model's sizes, rotary embedding and norm epsilon), what\n"
           "              its validate_args asks beside them (the environment: \"env\" with --json),\n"
           "              and each module's Megatron Core MIMO grid (ModuleGridSpec)\n"
           "  deepspeed   one DeepSpeed config per module (JSON)\n"
           "  torchtitan  a torchtitan --job.config_file TOML for the LLM\n"
           "Notes (comments, or \"notes\" with --json) say where the trainer differs from the plan.\n"
           "  -o FILE     write atomically instead of printing\n"
           "  --json      the structured form for every trainer\n");
}

static void append_notes(cli_buf *b, const cJSON *doc)
{
    const cJSON *n;
    cJSON_ArrayForEach(n, cJSON_GetObjectItemCaseSensitive(doc, "notes")) cli_buf_printf(b, "# note: %s\n", n->valuestring);
}

/* Megatron: "# ..." lines, then the arguments, a flag and its value per line. */
static char *render_megatron(const cJSON *doc, const char *plan)
{
    cli_buf b = { 0 };
    cli_buf_printf(&b, "# dhp export --to megatron %s: Megatron-LM arguments for the language model\n"
                   "# (megatron/training/arguments.py, Megatron-LM core_v0.15.0), world size %d\n", plan,
                   cJSON_GetObjectItemCaseSensitive(doc, "world_size")->valueint);
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(doc, "env"))
        cli_buf_printf(&b, "# in the environment (validate_args asserts it): %s=%s\n", a->string, a->valuestring);
    bool first = true;
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(doc, "args")) {
        bool flag = !strncmp(a->valuestring, "--", 2);
        if (!first) cli_buf_add(&b, flag ? " \\\n    " : " ");
        else cli_buf_add(&b, "    ");
        cli_buf_word(&b, a->valuestring);
        first = false;
    }
    cli_buf_add(&b, "\n# Megatron Core MIMO per-module grids (examples/mimo/training/topology.py ModuleGridSpec):\n");
    const cJSON *g;
    cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(doc, "mimo_module_grid_specs"))
        cli_buf_printf(&b, "#   ModuleGridSpec(name=\"%s\", num_ranks=%d, tp=%d, cp=%d, pp=%d, rank_offset=%d)\n",
                       cJSON_GetObjectItemCaseSensitive(g, "name")->valuestring,
                       cJSON_GetObjectItemCaseSensitive(g, "num_ranks")->valueint,
                       cJSON_GetObjectItemCaseSensitive(g, "tp")->valueint,
                       cJSON_GetObjectItemCaseSensitive(g, "cp")->valueint,
                       cJSON_GetObjectItemCaseSensitive(g, "pp")->valueint,
                       cJSON_GetObjectItemCaseSensitive(g, "rank_offset")->valueint);
    append_notes(&b, doc);
    return b.s;
}

/* A TOML value: a string, a boolean, a whole number, or an array of them. */
static void toml_value(cli_buf *b, const cJSON *v)
{
    if (cJSON_IsString(v)) cli_buf_printf(b, "\"%s\"", v->valuestring);
    else if (cJSON_IsBool(v)) cli_buf_add(b, cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsArray(v)) {
        const cJSON *e;
        cli_buf_add(b, "[");
        cJSON_ArrayForEach(e, v) {
            if (e != v->child) cli_buf_add(b, ", ");
            toml_value(b, e);
        }
        cli_buf_add(b, "]");
    } else cli_buf_printf(b, "%d", v->valueint);
}

/* torchtitan: TOML sections with the plan's notes as comments. */
static char *render_torchtitan(const cJSON *doc, const char *plan)
{
    cli_buf b = { 0 };
    cli_buf_printf(&b, "# dhp export --to torchtitan %s: torchtitan --job.config_file (torchtitan 0.2.2\n"
                   "# torchtitan/config/job_config.py); add the [model], [optimizer] and data sections of your run\n",
                   plan);
    append_notes(&b, doc);
    const cJSON *sec, *kv;
    cJSON_ArrayForEach(sec, cJSON_GetObjectItemCaseSensitive(doc, "toml")) {
        cli_buf_printf(&b, "\n[%s]\n", sec->string);
        cJSON_ArrayForEach(kv, sec) {
            cli_buf_printf(&b, "%s = ", kv->string);
            toml_value(&b, kv);
            cli_buf_add(&b, "\n");
        }
    }
    return b.s;
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
    static const char *const trainers[] = { [CLI_MEGATRON] = "megatron", [CLI_DEEPSPEED] = "deepspeed",
                                            [CLI_TORCHTITAN] = "torchtitan" };
    char why[UTIL_ERR_LEN];
    int t = util_name_index(to, trainers, 3, why);
    if (t < 0) return cli_usage_error("export", "--to: %s", why);
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
        cli_buf b = { 0 };
        char *j = cJSON_Print(doc);
        cli_buf_printf(&b, "%s\n", j);
        free(j);
        text = b.s;
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
