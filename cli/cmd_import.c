/* dhp import: Hugging Face config.json (file or URL) -> our model schema. */
#include "cli/cli.h"

#include <stdio.h>
#include <string.h>

static void usage(void)
{
    printf("usage: dhp import CONFIG.json|URL|hf:ORG/NAME[@REV] [-o MODEL.json] [--name NAME]\n\n"
           "Converts a Hugging Face config.json (%s)\n"
           "into a dhp model description. Prints it, or writes it atomically with -o. Prints the\n"
           "parameter count on stderr.\n\n"
           "hf:ORG/NAME fetches the model's config.json from the Hub ($HF_ENDPOINT, default\n"
           "https://huggingface.co; HF_TOKEN for gated models; HF_HUB_OFFLINE=1 reads the cache only)\n"
           "and caches it under $XDG_CACHE_HOME/dhp (default ~/.cache/dhp). Every --model option\n"
           "takes hf:ORG/NAME too. URLs must be https (http only to a loopback host).\n",
           model_import_hf_types());
}

int cmd_import(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) { usage(); return 0; }
        else if (!strcmp(o, "-o") || !strcmp(o, "--out")) { if (!v) return cli_usage_error("import", "%s needs a value", o); out = v; i++; }
        else if (!strcmp(o, "--name")) { if (!v) return cli_usage_error("import", "--name needs a value"); name = v; i++; }
        else if (o[0] == '-') return cli_usage_error("import", "unknown option '%s'", o);
        else if (src) return cli_usage_error("import", "more than one input given");
        else src = o;
    }
    if (!src) return cli_usage_error("import", "missing CONFIG.json or URL");
    char err[UTIL_ERR_LEN], *text = NULL;
    if (out && strcmp(out, "-") && util_check_output(out, err)) return cli_bad_input(err);
    bool url = !strncmp(src, "http://", 7) || !strncmp(src, "https://", 8);
    model_t m;
    int rc;
    if (model_hub_is_ref(src)) {
        if ((rc = model_hub_load(src, &m, err))) return cli_bad_input(err);
    } else {
        if ((url ? util_http_get(src, &text, NULL, err) : util_read_text_file(src, UTIL_JSON_MAX_BYTES, &text, NULL, err)))
            return cli_bad_input(err);
        rc = model_import_hf(text, src, &m, err);
        util_free(text);
        if (rc) return cli_bad_input(err);
    }
    if (name) util_strlcpy(m.name, name, sizeof m.name);
    if (url) util_strlcpy(m.source, src, sizeof m.source);
    if (model_validate_as(&m, src, err)) return cli_bad_input(err);
    cJSON *doc = model_to_json(&m);
    if (out) {
        rc = util_json_write(out, doc, err);
        cJSON_Delete(doc);
        if (rc) return cli_bad_input(err);
    } else {
        cli_emit_json(doc);
    }
    char b[32];
    fprintf(stderr, "dhp import: %s: %s parameters", m.name, cli_fmt_count((double)model_total_params(&m), b, sizeof b));
    for (int k = 0; k < m.n_modules; k++)
        fprintf(stderr, ", %s %s", m.mod[k].name, cli_fmt_count((double)model_module_params(&m.mod[k]), b, sizeof b));
    fprintf(stderr, "%s%s\n", out ? " -> " : "", out ? out : "");
    return 0;
}
