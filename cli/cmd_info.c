/* dhp models / dhp clusters: what is built in. */
#include "cli/cli_launch.h"

#include <stdio.h>
#include <string.h>

int cmd_models(int argc, char **argv)
{
    bool json = argc > 1 && !strcmp(argv[1], "--json");
    if (argc > 1 && !json) {
        /* dhp models NAME: print the description in our schema */
        model_t m;
        char err[UTIL_ERR_LEN];
        if (model_load(argv[1], &m, err)) return cli_usage_error("models", "%s", err);
        cli_emit_json(model_to_json(&m));
        return 0;
    }
    cJSON *arr = json ? cJSON_CreateArray() : NULL;
    if (!json) printf("%-24s %10s %10s  modules\n", "model", "params", "published");
    for (int i = 0; i < model_zoo_count(); i++) {
        model_t m;
        char err[UTIL_ERR_LEN];
        if (model_load(model_zoo_name(i), &m, err)) { fprintf(stderr, "dhp models: %s\n", err); continue; }
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", m.name);
            cJSON_AddNumberToObject(o, "params", (double)model_total_params(&m));
            cJSON_AddNumberToObject(o, "published_params", (double)m.published_params);
            cJSON_AddItemToArray(arr, o);
            continue;
        }
        char a[32], b[32];
        printf("%-24s %10s %10s ", m.name, cli_fmt_count((double)model_total_params(&m), a, sizeof a),
               cli_fmt_count((double)m.published_params, b, sizeof b));
        for (int k = 0; k < m.n_modules; k++)
            printf(" %s:%s %dL h%d", m.mod[k].name, model_kind_name(m.mod[k].kind), m.mod[k].layers, m.mod[k].hidden);
        printf("\n");
    }
    if (json) cli_emit_json(arr);
    return 0;
}

/* dhp clusters --from-ray ADDRESS [--gpu NAME] [--links-from PRESET] [-o FILE] */
static int clusters_from_ray(int argc, char **argv)
{
    const char *address = NULL, *gpu = NULL, *links = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **dst = !strcmp(o, "--from-ray") ? &address : !strcmp(o, "--gpu") ? &gpu
                         : !strcmp(o, "--links-from") ? &links : !strcmp(o, "-o") ? &out : NULL;
        if (!dst) return cli_usage_error("clusters", "unknown option '%s'", o);
        if (!v) return cli_usage_error("clusters", "%s needs a value", o);
        *dst = v;
        i++;
    }
    static cost_cluster c;
    char err[UTIL_ERR_LEN];
    if (cli_clusters_from_ray(address, gpu, links, &c, err)) return cli_bad_input(err);
    cJSON *doc = cost_cluster_to_json(&c);
    if (!out) { cli_emit_json(doc); return 0; }
    int rc = util_json_write(out, doc, err);
    cJSON_Delete(doc);
    if (rc) return cli_bad_input(err);
    printf("wrote %s: %d pool(s)", out, c.n_pools);
    for (int p = 0; p < c.n_pools; p++) printf("%s %d x %d %s", p ? "," : "", c.pool[p].nodes, c.pool[p].gpus_per_node, c.pool[p].gpu.name);
    printf("\n");
    return 0;
}

int cmd_clusters(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--from-ray")) return clusters_from_ray(argc, argv);
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: dhp clusters [PRESET|FILE]\n       dhp clusters --from-ray http://HEAD:8265 [--gpu NAME] "
               "[--links-from PRESET] [-o FILE]\n\nLists the presets, prints one, or reads a Ray cluster's alive "
               "nodes and GPUs (its State API)\ninto a cluster description; the links come from a preset with the "
               "same GPU.\n");
        return 0;
    }
    if (argc > 1) {
        cost_cluster c;
        char err[UTIL_ERR_LEN];
        if (cost_cluster_load(argv[1], &c, err)) return cli_usage_error("clusters", "%s", err);
        cli_emit_json(cost_cluster_to_json(&c));
        return 0;
    }
    printf("%-20s %6s  pools\n", "preset", "GPUs");
    for (int i = 0; i < cost_preset_count(); i++) {
        cost_cluster c;
        char err[UTIL_ERR_LEN];
        if (cost_cluster_load(cost_preset_name(i), &c, err)) { fprintf(stderr, "dhp clusters: %s\n", err); continue; }
        printf("%-20s %6d ", cost_preset_name(i), cost_cluster_gpus(&c));
        for (int p = 0; p < c.n_pools; p++)
            printf(" %s%d x %d %s (intra %.0f GB/s, inter %.0f GB/s per GPU)", p ? "+ " : "", c.pool[p].nodes,
                   c.pool[p].gpus_per_node, c.pool[p].gpu.name, c.pool[p].intra.busbw / 1e9, c.pool[p].inter.busbw / 1e9);
        printf("\n");
    }
    return 0;
}
