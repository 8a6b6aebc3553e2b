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

/* --price KIND:ARGS on pool 0 of c: one kernel or collective as the cost
 * model prices it (bench/published.py checks the costdb against the
 * published kernel and nccl-tests figures with it). */
static int price(const cost_cluster *c, const char *spec)
{
    const cost_pool *p = &c->pool[0];
    double a[4] = { 0 };
    char kind[32];
    const char *colon = strchr(spec, ':');
    if (!colon || colon - spec >= (long)sizeof kind)
        return cli_usage_error("clusters", "--price: '%s' is not KIND:ARGS", spec);
    memcpy(kind, spec, (size_t)(colon - spec));
    kind[colon - spec] = '\0';
    int n = sscanf(colon + 1, "%lf,%lf,%lf,%lf", &a[0], &a[1], &a[2], &a[3]);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", kind);
    bool fp8 = !strcmp(kind, "gemm8");   /* an FP8 GEMM (COST_MATH_FP8) */
    if ((fp8 || !strcmp(kind, "gemm")) && n == 3) {
        cost_gemm_math math = fp8 ? COST_MATH_FP8 : COST_MATH_BF16;
        if (fp8 && !cost_gpu_has_fp8(&p->gpu)) {
            cJSON_Delete(o);
            return cli_usage_error("clusters", "--price: %s has no FP8 tensor cores (no peak_flops_fp8)", p->gpu.name);
        }
        double t = cost_gemm_time_in(&p->gpu, math, a[0], a[1], a[2]);
        cJSON_AddNumberToObject(o, "seconds", t);
        cJSON_AddNumberToObject(o, "flops_per_s", 2 * a[0] * a[1] * a[2] / t);
        cJSON_AddNumberToObject(o, "efficiency", cost_gemm_efficiency_in(&p->gpu, math, a[0], a[1], a[2]));
        /* the burst rate MAMF-like benchmarks time (bench/published.py's fit rows) */
        cJSON_AddNumberToObject(o, "burst_flops_per_s",
                                2 * a[0] * a[1] * a[2] / cost_gemm_burst_time_in(&p->gpu, math, a[0], a[1], a[2]));
    } else if (!strcmp(kind, "attention") && n >= 3) {
        /* SEQ,HEADS,HEAD_DIM[,CAUSAL]: one sequence's forward */
        double rows = a[0] * a[1], scores = rows * cost_attention_mean_span(a[0], n > 3 && a[3] != 0);
        double t = cost_attention_forward_time(&p->gpu, rows, scores, a[2]);
        cJSON_AddNumberToObject(o, "seconds", t);
        cJSON_AddNumberToObject(o, "flops_per_s", 4 * a[2] * scores / t);
    } else if (n >= 2) {
        /* BYTES,RANKS[,PER_NODE]; bus bandwidth as nccl-tests reports it (doc/PERFORMANCE.md) */
        static const char *names[] = { "allreduce", "allgather", "reducescatter", "alltoall", "broadcast" };
        int op = -1;
        for (int i = 0; i < 5; i++) if (!strcmp(kind, names[i])) op = i;
        if (op < 0) { cJSON_Delete(o); return cli_usage_error("clusters", "--price: unknown kind '%s'", kind); }
        int ranks = (int)a[1], per_node = n > 2 ? (int)a[2] : (ranks < p->gpus_per_node ? ranks : p->gpus_per_node);
        double t = cost_collective_time(p, (cost_coll)op, a[0], ranks, per_node);
        double factor = op == COST_ALLREDUCE ? 2.0 * (ranks - 1) / ranks : op == COST_BROADCAST ? 1.0 : (ranks - 1.0) / ranks;
        cJSON_AddNumberToObject(o, "seconds", t);
        cJSON_AddNumberToObject(o, "busbw", a[0] / t * factor);
    } else {
        cJSON_Delete(o);
        return cli_usage_error("clusters", "--price: '%s': gemm:M,N,K, gemm8:M,N,K (FP8), attention:SEQ,HEADS,HEAD_DIM[,CAUSAL] or "
                               "allreduce|allgather|reducescatter|alltoall|broadcast:BYTES,RANKS[,PER_NODE]", spec);
    }
    cli_emit_json(o);
    return 0;
}

/* dhp clusters --from-ray ADDRESS [--gpu NAME] [--links-from PRESET] [-o FILE] */
static int clusters_from_ray(int argc, char **argv)
{
    const char *address = NULL, *gpu = NULL, *links = NULL, *out = NULL;
    for (int i = 1; i < argc; i += 2) {   /* each option takes a value */
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **dst = !strcmp(o, "--from-ray") ? &address : !strcmp(o, "--gpu") ? &gpu
                         : !strcmp(o, "--links-from") ? &links : !strcmp(o, "-o") ? &out : NULL;
        if (!dst) return cli_usage_error("clusters", "unknown option '%s'", o);
        if (!v) return cli_usage_error("clusters", "%s needs a value", o);
        *dst = v;
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
        printf("usage: dhp clusters [PRESET|FILE [--price KIND:ARGS]]\n       dhp clusters --from-ray http://HEAD:8265 [--gpu NAME] "
               "[--links-from PRESET] [-o FILE]\n\nLists the presets, prints one, or reads a Ray cluster's alive "
               "nodes and GPUs (its State API)\ninto a cluster description; the links come from a preset with the "
               "same GPU.\n");
        return 0;
    }
    if (argc > 1) {
        cost_cluster c;
        char err[UTIL_ERR_LEN];
        if (cost_cluster_load(argv[1], &c, err)) return cli_usage_error("clusters", "%s", err);
        if (argc > 3 && !strcmp(argv[2], "--price")) return price(&c, argv[3]);
        if (argc > 2) return cli_usage_error("clusters", "usage: dhp clusters [NAME [--price KIND:ARGS]]");
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
