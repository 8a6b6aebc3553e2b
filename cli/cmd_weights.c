/* dhp export-weights CKPT -o DIR (--plan PLAN.json | --model M): a `dhp run`
 * checkpoint back in the Hugging Face layout (executor/hf_export.c). */
#include "cli/cli.h"
#include "executor/executor.h"

#include <stdio.h>
#include <string.h>

static void usage(void)
{
    printf("usage: dhp export-weights CKPT -o DIR (--plan PLAN.json | --model M)\n\n"
           "Writes the weights of checkpoint CKPT (a --ckpt directory: its latest step; or one\n"
           "step-N directory) as DIR/model.safetensors and DIR/config.json with the Hugging Face\n"
           "names transformers loads (qwen2_5_vl, qwen2_audio). The model is the plan's, or M\n"
           "(a zoo name or a model file).\n");
}

int cmd_export_weights(int argc, char **argv)
{
    const char *ckpt = NULL, *out = NULL, *plan_path = NULL, *model = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); return 0; }
        const char **dst = !strcmp(a, "-o") ? &out : !strcmp(a, "--plan") ? &plan_path : !strcmp(a, "--model") ? &model : NULL;
        if (dst) {
            if (!v) return cli_usage_error("export-weights", "%s needs a value", a);
            *dst = v;
            i++;
        } else if (a[0] == '-') return cli_usage_error("export-weights", "unknown option '%s'", a);
        else if (!ckpt) ckpt = a;
        else return cli_usage_error("export-weights", "unexpected argument '%s'", a);
    }
    if (!ckpt) return cli_usage_error("export-weights", "no checkpoint directory given");
    if (!out) return cli_usage_error("export-weights", "-o DIR is required");
    if (!plan_path == !model) return cli_usage_error("export-weights", "give the model: --plan PLAN.json or --model M");
    char err[UTIL_ERR_LEN];
    plan_t *p = util_calloc(1, sizeof *p);
    if (!p) return cli_bad_input("out of memory");
    int rc = plan_path ? plan_read(plan_path, p, err) : model_load(model, &p->model, err);
    if (!rc) rc = ex_hf_export(ckpt, &p->model, out, err);
    const char *missing = rc ? NULL : ex_hf_missing_token(&p->model);
    if (missing)
        fprintf(stderr, "dhp export-weights: note: model %s records no %s (its \"tokens\"); config.json leaves it to transformers' default\n",
                p->model.name, missing);
    util_free(p);
    if (rc) return cli_bad_input(err);
    printf("wrote %s/model.safetensors and %s/config.json\n", out, out);
    return 0;
}
