/* Cluster and GPU descriptions (schemas dhp.cluster/1, dhp.gpu/1,
 * costdb/load.c): the same bytes through both parsers; what a cluster
 * accepts is priced once (a collective, a GEMM) and round-tripped. */
#include "tests/fuzz/fuzz.h"
#include "costdb/costdb.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size), err[UTIL_ERR_LEN];
    static cost_cluster c, again;
    static cost_gpu g;
    if (cost_cluster_parse_json(text, "fuzz.json", &c, err) == UTIL_OK) {
        const cost_pool *p = &c.pool[0];
        volatile double t = cost_collective_time(p, COST_ALLREDUCE, 1e6, cost_pool_gpus(p), p->gpus_per_node);
        (void)t;
        cJSON *j = cost_cluster_to_json(&c);
        char *out = cJSON_PrintUnformatted(j);
        if (!out || cost_cluster_parse_json(out, "round-trip", &again, err) != UTIL_OK) {
            fprintf(stderr, "accepted cluster does not round-trip: %s\n", err);
            abort();
        }
        cJSON_free(out);
        cJSON_Delete(j);
    }
    (void)cost_gpu_parse_json(text, "fuzz.json", &g, err);
    util_free(text);
    return 0;
}
