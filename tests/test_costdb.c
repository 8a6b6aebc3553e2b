#include "test.h"
#include "test_fixture.h"
#include "costdb/costdb.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

static const char *const expected_gpus[] = {
    "A100-SXM-40GB", "A100-SXM-80GB", "H100-SXM-80GB", "H200-141GB", "L40S"
};
static const char *const expected_presets[] = {
    "8xh100", "2x8xh100", "128x8xh100", "8xa100-80g", "8xh200", "mixed-h100-a100", "16x8xa100"
};

static bool listed(const char *name, const char *(*at)(int), int count)
{
    for (int i = 0; i < count; i++)
        if (strcmp(at(i), name) == 0) return true;
    return false;
}

static cJSON *embedded_json(const char *path)
{
    const util_embedded_file *f = util_embedded_find(path);
    if (!f) return NULL;
    char *t = malloc(f->len + 1);
    memcpy(t, f->data, f->len);
    t[f->len] = '\0';
    cJSON *j = cJSON_Parse(t);
    free(t);
    return j;
}

static bool has_source(const cJSON *o)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "source");
    return cJSON_IsString(s) && strlen(s->valuestring) > 10;
}

TEST(costdb_all_gpus_load_with_their_file_name)
{
    char err[UTIL_ERR_LEN];
    for (size_t i = 0; i < sizeof expected_gpus / sizeof *expected_gpus; i++)
        CHECK_MSG(listed(expected_gpus[i], cost_gpu_name, cost_gpu_count()), "missing GPU %s", expected_gpus[i]);
    for (int i = 0; i < cost_gpu_count(); i++) {
        cost_gpu g;
        int rc = cost_gpu_load(cost_gpu_name(i), &g, err);
        CHECK_MSG(rc == UTIL_OK, "%s: %s", cost_gpu_name(i), err);
        CHECK_MSG(strcmp(g.name, cost_gpu_name(i)) == 0, "name %s in file %s", g.name, cost_gpu_name(i));
        CHECK(g.gemm_eff_max > 0.5 && g.gemm_eff_max <= 1);
        CHECK(g.reserved_bytes < 0.1 * g.hbm_bytes);
    }
}

TEST(costdb_every_gpu_field_cites_a_source)
{
    const char *fields[] = {"peak_flops", "gemm_eff_max", "gemm_half", "attn_eff", "hbm_bytes",
                            "hbm_bw", "mem_eff", "reserved_bytes", "kernel_launch_s"};
    for (int i = 0; i < cost_gpu_count(); i++) {
        char path[128];
        snprintf(path, sizeof path, "costdb/gpus/%s.json", cost_gpu_name(i));
        cJSON *j = embedded_json(path);
        CHECK_MSG(j, "%s does not parse", path);
        for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, fields[f]);
            bool ok = cJSON_IsObject(o) && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "value")) && has_source(o);
            if (!ok) { cJSON_Delete(j); CHECK_MSG(false, "%s: %s has no value+source", path, fields[f]); }
        }
        cJSON_Delete(j);
    }
}

TEST(costdb_every_cluster_link_cites_a_source)
{
    for (int i = 0; i < cost_preset_count(); i++) {
        char path[128];
        snprintf(path, sizeof path, "costdb/clusters/%s.json", cost_preset_name(i));
        cJSON *j = embedded_json(path);
        CHECK_MSG(j, "%s does not parse", path);
        const cJSON *pool;
        bool ok = true;
        cJSON_ArrayForEach(pool, cJSON_GetObjectItemCaseSensitive(j, "pools"))
            ok = ok && has_source(cJSON_GetObjectItemCaseSensitive(pool, "intra"))
                    && has_source(cJSON_GetObjectItemCaseSensitive(pool, "inter"));
        const cJSON *cross = cJSON_GetObjectItemCaseSensitive(j, "cross_pool");
        ok = ok && (!cross || has_source(cross));
        cJSON_Delete(j);
        CHECK_MSG(ok, "%s: a link lacks its source", path);
    }
}

TEST(costdb_all_presets_load_and_validate)
{
    char err[UTIL_ERR_LEN];
    for (size_t i = 0; i < sizeof expected_presets / sizeof *expected_presets; i++)
        CHECK_MSG(listed(expected_presets[i], cost_preset_name, cost_preset_count()), "missing preset %s",
                  expected_presets[i]);
    for (int i = 0; i < cost_preset_count(); i++) {
        cost_cluster c;
        int rc = cost_cluster_load(cost_preset_name(i), &c, err);
        CHECK_MSG(rc == UTIL_OK, "%s: %s", cost_preset_name(i), err);
        CHECK_MSG(strcmp(c.name, cost_preset_name(i)) == 0, "preset %s names itself %s", cost_preset_name(i), c.name);
        CHECK_OK(cost_cluster_validate(&c, err));
    }
    cost_cluster c;
    CHECK_OK(cost_cluster_load("128x8xh100", &c, err));
    CHECK_EQ_INT(cost_cluster_gpus(&c), 1024);
    CHECK(strcmp(c.pool[0].gpu.name, "H100-SXM-80GB") == 0);
    CHECK_OK(cost_cluster_load("mixed-h100-a100", &c, err));
    CHECK_EQ_INT(c.n_pools, 2);
    CHECK_EQ_INT(cost_cluster_gpus(&c), 32);
    CHECK_EQ_INT(cost_pool_gpus(&c.pool[1]), 16);
    CHECK(strcmp(c.pool[1].gpu.name, "A100-SXM-80GB") == 0);
    CHECK_NEAR(c.cross_pool.busbw, 24e9, 1e-12);
}

TEST(costdb_names_match_case_insensitively)
{
    char err[UTIL_ERR_LEN];
    cost_gpu g;
    CHECK_OK(cost_gpu_load("h100-sxm-80gb", &g, err));
    CHECK(strcmp(g.name, "H100-SXM-80GB") == 0);
    cost_cluster c;
    CHECK_OK(cost_cluster_load("8XH100", &c, err));
    CHECK_EQ_INT(cost_cluster_gpus(&c), 8);
}

TEST(costdb_unknown_names_are_not_found_and_list_known)
{
    char err[UTIL_ERR_LEN];
    cost_gpu g;
    CHECK_EQ_INT(cost_gpu_load("B200", &g, err), UTIL_ENOTFOUND);
    CHECK(strstr(err, "B200") && strstr(err, "H100-SXM-80GB") && strstr(err, "L40S"));
    cost_cluster c;
    CHECK_EQ_INT(cost_cluster_load("9xh100", &c, err), UTIL_ENOTFOUND);
    CHECK(strstr(err, "9xh100") && strstr(err, "8xh100") && strstr(err, "mixed-h100-a100"));
    CHECK_EQ_INT(cost_cluster_load("/nonexistent-dhp/c.json", &c, err), UTIL_EIO);
}

static bool link_eq(const cost_link *a, const cost_link *b)
{
    return a->busbw == b->busbw && a->alpha_s == b->alpha_s;
}

/* cJSON prints a number with 15 digits when that reads back within an ulp or two. */
static bool near_ulps(double a, double b) { return fabs(a - b) <= 4e-16 * fmax(fabs(a), fabs(b)); }

static bool grid_eq(const cost_gemm_grid *a, const cost_gemm_grid *b)
{
    if (a->n_m != b->n_m || a->n_n != b->n_n || a->n_k != b->n_k) return false;
    bool eq = true;
    for (int i = 0; i < a->n_m; i++) eq = eq && a->m[i] == b->m[i];
    for (int i = 0; i < a->n_n; i++) eq = eq && a->n[i] == b->n[i];
    for (int i = 0; i < a->n_k; i++) eq = eq && a->k[i] == b->k[i];
    for (int i = 0; i < a->n_m * a->n_n * a->n_k; i++) eq = eq && near_ulps(a->eff[i], b->eff[i]);
    return eq;
}

static bool ew_eq(const cost_ew_table *a, const cost_ew_table *b)
{
    bool eq = a->n == b->n;
    for (int i = 0; eq && i < a->n; i++) {
        eq = near_ulps(a->elements[i], b->elements[i]);
        for (int k = 0; k < COST_N_EW; k++) eq = eq && near_ulps(a->bw[k][i], b->bw[k][i]);
    }
    return eq;
}

static bool gpu_eq(const cost_gpu *a, const cost_gpu *b)
{
    return strcmp(a->name, b->name) == 0 && a->peak_flops == b->peak_flops && a->gemm_eff_max == b->gemm_eff_max
        && a->gemm_half == b->gemm_half && a->attn_eff == b->attn_eff && a->hbm_bytes == b->hbm_bytes
        && a->hbm_bw == b->hbm_bw && a->mem_eff == b->mem_eff && a->reserved_bytes == b->reserved_bytes
        && a->reserved_workspace_bytes == b->reserved_workspace_bytes
        && a->kernel_launch_s == b->kernel_launch_s && grid_eq(&a->grid, &b->grid) && ew_eq(&a->ew, &b->ew);
}

static bool cluster_eq(const cost_cluster *a, const cost_cluster *b)
{
    if (strcmp(a->name, b->name) || a->n_pools != b->n_pools || !link_eq(&a->cross_pool, &b->cross_pool))
        return false;
    for (int i = 0; i < a->n_pools; i++) {
        const cost_pool *p = &a->pool[i], *q = &b->pool[i];
        if (strcmp(p->name, q->name) || p->nodes != q->nodes || p->gpus_per_node != q->gpus_per_node
            || !gpu_eq(&p->gpu, &q->gpu) || !link_eq(&p->intra, &q->intra) || !link_eq(&p->inter, &q->inter))
            return false;
    }
    return true;
}

TEST(costdb_cluster_to_json_round_trips_self_contained)
{
    char err[UTIL_ERR_LEN];
    for (int i = 0; i < cost_preset_count(); i++) {
        cost_cluster a, b;
        CHECK_OK(cost_cluster_load(cost_preset_name(i), &a, err));
        cJSON *j = cost_cluster_to_json(&a);
        CHECK(j != NULL);
        /* Self-contained: the GPU is an object with its numbers, not a name to look up. */
        const cJSON *gpu = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "pools"), 0), "gpu");
        bool embedded = cJSON_IsObject(gpu) && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(gpu, "peak_flops"));
        char *text = cJSON_Print(j);
        cJSON_Delete(j);
        CHECK(embedded);
        int rc = cost_cluster_parse_json(text, "roundtrip.json", &b, err);
        free(text);
        CHECK_MSG(rc == UTIL_OK, "%s: %s", cost_preset_name(i), err);
        CHECK_MSG(cluster_eq(&a, &b), "%s changed in the round trip", cost_preset_name(i));
    }
}

TEST(costdb_cluster_loads_from_a_user_path_with_a_gpu_object)
{
    char dir[] = "/tmp/dhp-costdb-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/mine.json", dir);
    const char *text =
        "{\"schema\": \"dhp.cluster/1\", \"name\": \"mine\", \"pools\": [{\"name\": \"p\", \"gpu\": "
        "{\"name\": \"X1\", \"peak_flops\": 1e15, \"gemm_eff_max\": 0.8, \"gemm_half\": 50, \"attn_eff\": 0.4, "
        "\"hbm_bytes\": 1e11, \"hbm_bw\": {\"value\": 5e12, \"source\": \"made up\"}, \"mem_eff\": 0.9, "
        "\"reserved_bytes\": 1e9, \"kernel_launch_s\": 3e-6}, \"nodes\": 4, \"gpus_per_node\": 4, "
        "\"intra\": {\"busbw\": 2e11, \"alpha_s\": 1e-6}, \"inter\": {\"busbw\": 5e10, \"alpha_s\": 5e-6}}]}";
    char err[UTIL_ERR_LEN];
    CHECK_OK(util_write_atomic(path, text, strlen(text), err));
    cost_cluster c;
    int rc = cost_cluster_load(path, &c, err);
    unlink(path);
    rmdir(dir);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    CHECK_EQ_INT(cost_cluster_gpus(&c), 16);
    CHECK_NEAR(c.pool[0].gpu.hbm_bw, 5e12, 0);
    /* Single pool without cross_pool: it falls back to the pool's inter link. */
    CHECK(link_eq(&c.cross_pool, &c.pool[0].inter));
}

TEST(costdb_cross_pool_defaults_to_the_slower_inter_link)
{
    const char *text =
        "{\"schema\": \"dhp.cluster/1\", \"name\": \"mix\", \"pools\": ["
        "{\"name\": \"a\", \"gpu\": \"H100-SXM-80GB\", \"nodes\": 1, \"gpus_per_node\": 8,"
        " \"intra\": {\"busbw\": 3.7e11, \"alpha_s\": 2e-6}, \"inter\": {\"busbw\": 4.7e10, \"alpha_s\": 6e-6}},"
        "{\"name\": \"b\", \"gpu\": \"a100-sxm-80gb\", \"nodes\": 1, \"gpus_per_node\": 8,"
        " \"intra\": {\"busbw\": 2.4e11, \"alpha_s\": 2e-6}, \"inter\": {\"busbw\": 2.4e10, \"alpha_s\": 5e-6}}]}";
    char err[UTIL_ERR_LEN];
    cost_cluster c;
    CHECK_OK(cost_cluster_parse_json(text, "mix.json", &c, err));
    CHECK_NEAR(c.cross_pool.busbw, 2.4e10, 0);
    CHECK_NEAR(c.cross_pool.alpha_s, 6e-6, 0);
}

/* One valid pool, with a hole for a fault: "%s" is replaced by the pool body. */
static int parse_with_pool(const char *pool_fields, cost_cluster *c, char *err)
{
    char text[2048];
    snprintf(text, sizeof text,
             "{\"schema\": \"dhp.cluster/1\", \"name\": \"c\", \"pools\": [{\"name\": \"p\", %s}]}", pool_fields);
    return cost_cluster_parse_json(text, "c.json", c, err);
}

#define GOOD_GPU "\"gpu\": \"H100-SXM-80GB\""
#define GOOD_INTRA "\"intra\": {\"busbw\": 3.7e11, \"alpha_s\": 2e-6}"
#define GOOD_INTER "\"inter\": {\"busbw\": 4.7e10, \"alpha_s\": 6e-6}"
/* A whole valid pool of `nodes` nodes of `gpus` GPUs (bare numbers). */
#define GOOD_POOL(nodes, gpus) GOOD_GPU ", \"nodes\": " #nodes ", \"gpus_per_node\": " #gpus ", " GOOD_INTRA ", " GOOD_INTER

TEST(costdb_bad_cluster_json_names_file_and_field)
{
    struct { const char *pool; const char *want; } cases[] = {
        {GOOD_POOL(0, 8), "c.json: pools[0].nodes: must be >= 1"},
        {GOOD_GPU ", \"nodes\": 0, \"gpus_per_node\": 8", "c.json: pools[0].nodes: must be >= 1"},
        {GOOD_POOL(-3, 8), "c.json: pools[0].nodes:"},
        {GOOD_POOL(1.5, 8), "c.json: pools[0].nodes: must be an integer"},
        {GOOD_POOL(1, 0), "c.json: pools[0].gpus_per_node: must be >= 1"},
        {GOOD_GPU ", \"nodes\": 1, \"gpus_per_node\": \"8\", " GOOD_INTRA ", " GOOD_INTER,
         "c.json: pools[0].gpus_per_node: must be a number"},
        {"\"gpu\": \"B300\", \"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA ", " GOOD_INTER,
         "c.json: pools[0].gpu: unknown GPU 'B300'"},
        {"\"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA ", " GOOD_INTER, "c.json: pools[0].gpu: required"},
        {GOOD_GPU ", \"nodes\": 1, \"gpus_per_node\": 8, \"intra\": {\"busbw\": 0, \"alpha_s\": 2e-6}, " GOOD_INTER,
         "c.json: pools[0].intra.busbw: must be > 0"},
        {GOOD_GPU ", \"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA ", \"inter\": {\"busbw\": -4e10, \"alpha_s\": 1e-6}",
         "c.json: pools[0].inter.busbw: must be > 0"},
        {GOOD_GPU ", \"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA ", \"inter\": {\"busbw\": 4e10, \"alpha_s\": -1}",
         "c.json: pools[0].inter.alpha_s: must be >= 0"},
        {GOOD_GPU ", \"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA, "c.json: pools[0].inter: required"},
        {"\"gpu\": {\"name\": \"X\", \"peak_flops\": 1e15, \"gemm_eff_max\": 0.8, \"gemm_half\": 50, "
         "\"attn_eff\": 0.4, \"hbm_bytes\": 1e11, \"hbm_bw\": 5e12, \"mem_eff\": 1.5, \"reserved_bytes\": 1e9, "
         "\"kernel_launch_s\": 3e-6}, \"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA ", " GOOD_INTER,
         "c.json: pools[0].gpu.mem_eff: must be <= 1"},
        {"\"gpu\": {\"name\": \"X\", \"peak_flops\": 1e15}, \"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA ", " GOOD_INTER,
         "c.json: pools[0].gpu.gemm_eff_max: required"},
        {GOOD_POOL(1, 2) ", \"compute_speed\": [1, 0.5, 0.4]",
         "c.json: pools[0].compute_speed: must be an array of 1 to min(64, gpus_per_node = 2) speeds"},
        {GOOD_POOL(1, 2) ", \"compute_speed\": [0.5, 0.5]", "c.json: pools[0].compute_speed[0]: must be 1"},
        {GOOD_POOL(1, 2) ", \"compute_speed\": [1, 0]", "c.json: pools[0].compute_speed[1]: must be a number in (0, 1]"},
        {GOOD_POOL(1, 2) ", \"compute_speed\": {\"value\": [1], \"source\": 3}",
         "c.json: pools[0].compute_speed.source: must be a string"},
        {GOOD_POOL(1, 2) ", \"compute_sets\": [0]",
         "c.json: pools[0].compute_sets: must be an array of gpus_per_node (2, at most 64) ranks"},
        {GOOD_POOL(1, 3) ", \"compute_sets\": [0, 1, 2, 1]",
         "c.json: pools[0].compute_sets: must be an array of gpus_per_node"},
        {GOOD_POOL(1, 3) ", \"compute_sets\": [0, 2, 1]",
         "c.json: pools[0].compute_sets[1]: must be the lowest rank of its set"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[UTIL_ERR_LEN] = "";
        cost_cluster c;
        int rc = parse_with_pool(cases[i].pool, &c, err);
        CHECK_MSG(rc == UTIL_EINVAL, "case %zu: rc %d (%s)", i, rc, err);
        CHECK_MSG(strstr(err, cases[i].want) != NULL, "case %zu: got '%s', want '%s'", i, err, cases[i].want);
        CHECK_MSG(strchr(err, '\n') == NULL, "case %zu: error spans lines", i);
    }
}

TEST(costdb_bad_cluster_structure_is_invalid)
{
    struct { const char *text; const char *want; } cases[] = {
        {"{\"schema\": \"dhp.cluster/1\", \"name\": \"c\"}", "c.json: pools: must be an array"},
        {"{\"schema\": \"dhp.cluster/1\", \"name\": \"c\", \"pools\": []}", "c.json: pools: must have 1 to"},
        {"{\"schema\": \"dhp.gpu/1\", \"name\": \"c\", \"pools\": []}", "c.json: schema: expected"},
        {"{\"name\": \"c\", \"pools\": []}", "c.json: schema: required"},
        {"{\"schema\": \"dhp.cluster/1\", \"name\": \"c\", \"pools\": [\n 3,]}", "c.json: malformed JSON at line 2"},
        {"{\"schema\": \"dhp.cluster/1\", \"name\": \"c\", \"pools\": [{\"name\": \"p\", " GOOD_GPU
         ", \"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA ", " GOOD_INTER "}, {\"name\": \"P\", " GOOD_GPU
         ", \"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA ", " GOOD_INTER "}]}", "c.json: pools[1].name: 'P' repeats"},
        {"{\"schema\": \"dhp.cluster/1\", \"name\": \"c\", \"pools\": [{\"name\": \"p\", " GOOD_GPU
         ", \"nodes\": 1, \"gpus_per_node\": 8, " GOOD_INTRA ", " GOOD_INTER "}], \"cross_pool\": {\"busbw\": 0, "
         "\"alpha_s\": 0}}", "c.json: cross_pool.busbw: must be > 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[UTIL_ERR_LEN] = "";
        cost_cluster c;
        int rc = cost_cluster_parse_json(cases[i].text, "c.json", &c, err);
        CHECK_MSG(rc == UTIL_EINVAL, "case %zu: rc %d (%s)", i, rc, err);
        CHECK_MSG(strstr(err, cases[i].want) != NULL, "case %zu: got '%s', want '%s'", i, err, cases[i].want);
    }
}

TEST(costdb_validate_rejects_a_hand_built_bad_cluster)
{
    char err[UTIL_ERR_LEN];
    cost_cluster c;
    CHECK_OK(cost_cluster_load("8xh100", &c, err));
    c.pool[0].gpus_per_node = -2;
    CHECK_EQ_INT(cost_cluster_validate(&c, err), UTIL_EINVAL);
    CHECK(strstr(err, "8xh100: pools[0].gpus_per_node") != NULL);
}

TEST(costdb_gemm_efficiency_is_monotone_and_tends_to_max)
{
    char err[UTIL_ERR_LEN];
    cost_gpu g;
    CHECK_OK(cost_gpu_load("H100-SXM-80GB", &g, err));
    double prev_m = 0, prev_n = 0, prev_k = 0;
    for (double x = 1; x <= 65536; x *= 2) {
        double em = cost_gemm_efficiency(&g, x, 4096, 4096);
        double en = cost_gemm_efficiency(&g, 4096, x, 4096);
        double ek = cost_gemm_efficiency(&g, 4096, 4096, x);
        CHECK_MSG(em > prev_m && en > prev_n && ek > prev_k, "not increasing at %g", x);
        CHECK(em < g.gemm_eff_max);
        prev_m = em; prev_n = en; prev_k = ek;
    }
    CHECK_NEAR(cost_gemm_efficiency(&g, 1e9, 1e9, 1e9), g.gemm_eff_max, 1e-6);
    /* gemm_half is the size at which one dimension alone halves throughput. */
    CHECK_NEAR(cost_gemm_efficiency(&g, g.gemm_half, 1e12, 1e12), g.gemm_eff_max / 2, 1e-6);
    CHECK_NEAR(cost_gemm_efficiency(&g, 0, 4096, 4096), 0, 0);
    CHECK_NEAR(cost_gemm_time(&g, 4096, 0, 4096), 0, 0);
}

TEST(costdb_h100_gemm_times_match_mamf_and_measured_cublas)
{
    char err[UTIL_ERR_LEN];
    cost_gpu g;
    CHECK_OK(cost_gpu_load("H100-SXM-80GB", &g, err));
    double flops = 2.0 * 8192 * 8192 * 8192;
    /* MAMF (stas00/ml-engineering): 794 TFLOP/s is the best achievable rate,
     * timed in bursts, as the benchmarks below are. */
    CHECK_NEAR(cost_gemm_burst_time(&g, 8192, 8192, 8192), flops / 794e12, 0.03);
    /* cuBLAS BF16 on H100 SXM, pranjalssh/fast.cu README: 8192^3 in 1.378 ms, 6144^3 in 0.626 ms. */
    CHECK_NEAR(cost_gemm_burst_time(&g, 8192, 8192, 8192), 1.378e-3, 0.04);
    CHECK_NEAR(cost_gemm_burst_time(&g, 6144, 6144, 6144), 0.626e-3, 0.04);
    /* A thin GEMM (m = 64 rows) is far from the large-shape rate. */
    CHECK(cost_gemm_efficiency(&g, 64, 8192, 8192) < 0.6 * g.gemm_eff_max);
}

/* A training step's GEMMs run back to back at the clock the power limit
 * holds (MSMF), not at the burst rate MAMF times: the H100 and H200 files'
 * gemm_sustained (stas00/ml-engineering's MSMF / MAMF on H200, 698.6 / 823.9)
 * slows the bf16 GEMMs the cost model prices, not the fp32 / TF32 ones nor a
 * GPU without a sustained measurement (L40S); the A100 files' comes from the
 * weight-gradient GEMMs Zero Bubble's runs timed (bench/published.tsv rows
 * 136-139: least squares of burst / measured, 0.931); the field survives the
 * plan file's copy of the GPU and is range-checked. */
TEST(costdb_bf16_gemms_are_priced_at_the_sustained_rate)
{
    char err[UTIL_ERR_LEN];
    cost_gpu g, a;
    CHECK_OK(cost_gpu_load("H100-SXM-80GB", &g, err));
    CHECK_NEAR(g.gemm_sustained, 698.6 / 823.9, 0.002);
    double L = g.kernel_launch_s, m = 16384, n = 4096, k = 14336;
    CHECK_NEAR(cost_gemm_time(&g, m, n, k) - L, (cost_gemm_burst_time(&g, m, n, k) - L) / g.gemm_sustained, 1e-9);
    CHECK_NEAR(cost_gemm_time_in(&g, COST_MATH_BF16_DHP, m, n, k), cost_gemm_time(&g, m, n, k), 1e-12);
    CHECK_NEAR(cost_gemm_sustained(&g, COST_MATH_FP32), 1, 0);
    CHECK_NEAR(cost_gemm_sustained(&g, COST_MATH_TF32), 1, 0);
    cost_gpu h;
    CHECK_OK(cost_gpu_load("H200-141GB", &h, err));
    CHECK_NEAR(h.gemm_sustained, g.gemm_sustained, 0);
    CHECK_OK(cost_gpu_load("A100-SXM-80GB", &a, err));
    double r[4] = { 8.817 / 9.337, 18.683 / 19.927, 7.473 / 8.132, 7.117 / 7.715 }, rr = 0, r1 = 0;
    for (int i = 0; i < 4; i++) { rr += r[i] * r[i]; r1 += r[i]; }
    CHECK_NEAR(a.gemm_sustained, rr / r1, 0.001);
    cost_gpu a40, l;
    CHECK_OK(cost_gpu_load("A100-SXM-40GB", &a40, err));
    CHECK_NEAR(a40.gemm_sustained, a.gemm_sustained, 0);
    CHECK_OK(cost_gpu_load("L40S", &l, err));
    CHECK_NEAR(cost_gemm_time(&l, m, n, k), cost_gemm_burst_time(&l, m, n, k), 0);
    cJSON *j = cost_gpu_to_json(&g);
    CHECK(j != NULL);
    char *text = cJSON_PrintUnformatted(j);
    cost_gpu back;
    CHECK_OK(cost_gpu_parse_json(text, "round trip", &back, err));
    CHECK_NEAR(back.gemm_sustained, g.gemm_sustained, 0);
    cJSON_free(text);
    cJSON_ReplaceItemInObject(j, "gemm_sustained", cJSON_CreateNumber(1.5));
    text = cJSON_PrintUnformatted(j);
    CHECK(cost_gpu_parse_json(text, "round trip", &back, err) == UTIL_EINVAL && strstr(err, "gemm_sustained"));
    cJSON_free(text);
    cJSON_Delete(j);
}

TEST(costdb_memory_attention_gemm_times_by_hand)
{
    cost_gpu g = test_round_gpu();
    CHECK_NEAR(cost_memory_time(&g, 1e9), 2e-3 + 1e-5, 1e-12);      /* 1e9 / (1e12 * 0.5) */
    /* 1e12 FLOPs = 1e12 / (4 * 125) scores of d = 125: 1e12 / (1e15 * 0.5), backward 2.5x the FLOPs */
    CHECK_NEAR(cost_attention_forward_time(&g, 1e6, 2e9, 125), 2e-3 + 1e-5, 1e-12);
    CHECK_NEAR(cost_attention_backward_time(&g, 1e6, 2e9, 125), 5e-3 + 1e-5, 1e-12);
    /* plus 1 ns per score forward, 3 ns backward */
    g.attn_score_s = 1e-9;
    g.attn_bwd_score_s = 3e-9;
    CHECK_NEAR(cost_attention_forward_time(&g, 1e6, 2e9, 125), 2e-3 + 2.0 + 1e-5, 1e-12);
    CHECK_NEAR(cost_attention_backward_time(&g, 1e6, 2e9, 125), 5e-3 + 6.0 + 1e-5, 1e-12);
    /* plus 10 ns per row forward, 30 ns backward, over 1e6 rows */
    g.attn_row_s = 1e-8;
    g.attn_bwd_row_s = 3e-8;
    CHECK_NEAR(cost_attention_forward_time(&g, 1e6, 2e9, 125), 2e-3 + 2.0 + 1e-2 + 1e-5, 1e-12);
    CHECK_NEAR(cost_attention_backward_time(&g, 1e6, 2e9, 125), 5e-3 + 6.0 + 3e-2 + 1e-5, 1e-12);
    /* plus 200 scores' matmul price per row: 1e6 rows x 200 = 2e8 scores more, 2e-4 s forward */
    g.attn_row_scores = 200;
    CHECK_NEAR(cost_attention_forward_time(&g, 1e6, 2e9, 125), 2e-3 + 2.0 + 1e-2 + 2e-4 + 1e-5, 1e-12);
    CHECK_NEAR(cost_attention_backward_time(&g, 1e6, 2e9, 125), 5e-3 + 6.0 + 3e-2 + 5e-4 + 1e-5, 1e-12);
    /* the backward's own shape: its matmul price at half the forward's efficiency (2x), its rows at 400
     * scores (1e6 x 400 x 2.5e-12 x 2 = 2e-3 s); the forward's unchanged */
    g.attn_bwd_eff = 0.5;
    g.attn_bwd_row_scores = 400;
    CHECK_NEAR(cost_attention_forward_time(&g, 1e6, 2e9, 125), 2e-3 + 2.0 + 1e-2 + 2e-4 + 1e-5, 1e-12);
    CHECK_NEAR(cost_attention_backward_time(&g, 1e6, 2e9, 125), 1e-2 + 6.0 + 3e-2 + 2e-3 + 1e-5, 1e-12);
    g.attn_bwd_eff = g.attn_bwd_row_scores = 0;
    CHECK_NEAR(cost_memory_time(&g, 0), 0, 0);
    CHECK_NEAR(cost_attention_forward_time(&g, 1, -1, 64), 0, 0);
    CHECK_NEAR(cost_attention_backward_time(&g, 1, 0, 64), 0, 0);
    /* 2*100^3 FLOPs at 1e15 * 0.8 * (1/2)^3 = 1e14 FLOP/s -> 2e-8 s, plus launch */
    CHECK_NEAR(cost_gemm_time(&g, 100, 100, 100), 2e-8 + 1e-5, 1e-9);
}

/* A 2 x 2 x 2 measured grid on round_gpu: m, n, k in {100, 400}, eff 0.1 at
 * the small corner rising by 0.1, 0.2, 0.4 along m, n, k. */
static cost_gpu grid_gpu(void)
{
    cost_gpu g = test_round_gpu();
    cost_gemm_grid *G = &g.grid;
    G->n_m = G->n_n = G->n_k = 2;
    G->m[0] = G->n[0] = G->k[0] = 100;
    G->m[1] = G->n[1] = G->k[1] = 400;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 2; c++) G->eff[(a * 2 + b) * 2 + c] = 0.1 + 0.1 * a + 0.2 * b + 0.4 * c;
    return g;
}

TEST(costdb_gemm_grid_interpolates_in_log_size_and_extends_by_the_formula)
{
    cost_gpu g = grid_gpu();
    CHECK_NEAR(cost_gemm_efficiency(&g, 100, 100, 100), 0.1, 1e-12);
    CHECK_NEAR(cost_gemm_efficiency(&g, 400, 400, 400), 0.8, 1e-12);
    CHECK_NEAR(cost_gemm_efficiency(&g, 400, 100, 400), 0.6, 1e-12);
    /* 200 is half-way between 100 and 400 in log size: 0.1 + 0.05 + 0.1 + 0.2 */
    CHECK_NEAR(cost_gemm_efficiency(&g, 200, 200, 200), 0.45, 1e-12);
    /* below the grid: the edge value x s(50) / s(100), s(x) = x / (x + 100) */
    CHECK_NEAR(cost_gemm_efficiency(&g, 50, 100, 100), 0.1 * (50.0 / 150) / (100.0 / 200), 1e-12);
    /* above it: x s(1600) / s(400) */
    CHECK_NEAR(cost_gemm_efficiency(&g, 400, 400, 1600), 0.8 * (1600.0 / 1700) / (400.0 / 500), 1e-12);
    /* 2 x 200^3 FLOPs at 1e15 x 0.45, plus launch */
    CHECK_NEAR(cost_gemm_time(&g, 200, 200, 200), 1.6e7 / 4.5e14 + 1e-5, 1e-12);
    CHECK_NEAR(cost_gemm_efficiency(&g, 0, 200, 200), 0, 0);
}

/* g written by cost_gpu_to_json parses back to the same GPU. */
static bool gpu_round_trips(const cost_gpu *g, cost_gpu *back, char *err)
{
    cJSON *o = cost_gpu_to_json(g);
    char *text = o ? cJSON_Print(o) : NULL;
    int rc = text ? cost_gpu_parse_json(text, "gpu.json", back, err) : -1;
    cJSON_free(text);
    cJSON_Delete(o);
    return rc == 0 && gpu_eq(g, back);
}

/* A valid GPU with `"<key>": <value>` added must be refused with `want` in the message. */
static bool gpu_field_refused(const char *key, const char *value, const char *want, char *err)
{
    char doc[1024];
    cost_gpu back;
    snprintf(doc, sizeof doc, "{\"schema\": \"dhp.gpu/1\", \"name\": \"x\", \"peak_flops\": 1e15, \"gemm_eff_max\": 0.8, "
             "\"gemm_half\": 100, \"attn_eff\": 0.5, \"hbm_bytes\": 1e11, \"hbm_bw\": 1e12, \"mem_eff\": 0.5, "
             "\"reserved_bytes\": 1e9, \"kernel_launch_s\": 1e-5, \"%s\": %s}", key, value);
    return cost_gpu_parse_json(doc, "bad.json", &back, err) == UTIL_EINVAL && strstr(err, want) != NULL;
}

TEST(costdb_gemm_grid_round_trips_and_bad_grids_are_named)
{
    cost_gpu g = grid_gpu(), back;
    char err[UTIL_ERR_LEN] = "";
    CHECK_MSG(gpu_round_trips(&g, &back, err), "%s", err);
    static const struct { const char *grid, *want; } bad[] = {
        {"{\"m\": [100], \"n\": [1, 2], \"k\": [1, 2], \"eff\": [0.5, 0.5]}", "gemm_grid.m: must be an array of 2 to 8"},
        {"{\"m\": [2, 1], \"n\": [1, 2], \"k\": [1, 2], \"eff\": []}", "gemm_grid.m[1]: sizes must be positive and ascending"},
        {"{\"m\": [1, 2], \"n\": [1, 2], \"k\": [1, 2], \"eff\": [0.5]}", "gemm_grid.eff: must be an array of 2 x 2 x 2 = 8"},
        {"{\"m\": [1, 2], \"n\": [1, 2], \"k\": [1, 2], \"eff\": [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.5]}",
         "gemm_grid.eff[7]: must be a number in (0, 1]"},
        {"{\"m\": [1, 2], \"n\": [1, 2], \"k\": [1, 2], \"eff\": [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], \"source\": 3}",
         "gemm_grid.source: must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(gpu_field_refused("gemm_grid", bad[i].grid, bad[i].want, err), "case %zu: '%s'", i, err);
}

/* c written by cost_cluster_to_json and parsed back into *back. */
static int json_round_trip(const cost_cluster *c, cost_cluster *back, char *err)
{
    cJSON *j = cost_cluster_to_json(c);
    char *t = j ? cJSON_Print(j) : NULL;
    int rc = t ? cost_cluster_parse_json(t, "back", back, err) : -1;
    cJSON_free(t);
    cJSON_Delete(j);
    return rc;
}

/* A measured speed table loads plain or sourced, survives the round trip
 * through cost_cluster_to_json, and shares processors evenly beyond it. */
TEST(costdb_compute_speed_loads_and_extends)
{
    char err[UTIL_ERR_LEN] = "";
    cost_cluster c, back;
    CHECK_OK(parse_with_pool(GOOD_POOL(1, 4)
                             ", \"compute_speed\": {\"value\": [1, 1, 0.75, 0.5], \"source\": \"test\"}", &c, err));
    CHECK_EQ_INT(c.pool[0].n_speed, 4);
    CHECK(cost_compute_speed(&c.pool[0], 1) == 1 && cost_compute_speed(&c.pool[0], 3) == 0.75);
    CHECK(cost_compute_speed(&c.pool[0], 4) == 0.5 && cost_compute_speed(&c.pool[0], 8) == 0.25);
    int rc = json_round_trip(&c, &back, err);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    CHECK(back.pool[0].n_speed == 4 && memcmp(back.pool[0].speed, c.pool[0].speed, 4 * sizeof(double)) == 0);
    CHECK(!back.pool[0].has_sets);
    CHECK_OK(parse_with_pool(GOOD_POOL(1, 4)
                             ", \"compute_speed\": [1, 0.5], \"compute_sets\": {\"value\": [0, 1, 0, 1], \"source\": \"t\"}", &c, err));
    CHECK(c.pool[0].has_sets && c.pool[0].set_of[2] == 0 && c.pool[0].set_of[3] == 1);
    rc = json_round_trip(&c, &back, err);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    CHECK(back.pool[0].has_sets && memcmp(back.pool[0].set_of, c.pool[0].set_of, 4 * sizeof(int)) == 0);
    CHECK_OK(parse_with_pool(GOOD_POOL(1, 4), &c, err));
    CHECK(c.pool[0].n_speed == 0 && cost_compute_speed(&c.pool[0], 3) == 1);   /* GPUs: a device per rank */
}

/* The handoff time loads plain or sourced, survives the round trip, sets
 * the share weight min(interval, handoff), and is refused out of range or
 * without a speed table. */
TEST(costdb_compute_handoff_loads_and_weighs)
{
    char err[UTIL_ERR_LEN] = "";
    cost_cluster c, back;
    CHECK_OK(parse_with_pool(GOOD_POOL(1, 2)
                             ", \"compute_speed\": [1, 0.5], \"compute_handoff_s\": {\"value\": 0.002, \"source\": \"t\"}",
                             &c, err));
    CHECK(c.pool[0].handoff_s == 0.002);
    CHECK(cost_share_weight(&c.pool[0], 0.0005) == 0.0005);
    CHECK(cost_share_weight(&c.pool[0], 0.01) == 0.002 && cost_share_weight(&c.pool[0], INFINITY) == 0.002);
    int rc = json_round_trip(&c, &back, err);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    CHECK(back.pool[0].handoff_s == 0.002);
    CHECK_OK(parse_with_pool(GOOD_POOL(1, 2) ", \"compute_speed\": [1, 0.5]", &c, err));
    CHECK(c.pool[0].handoff_s == 0 && cost_share_weight(&c.pool[0], 0.0005) == 1);   /* unmeasured: even */
    static const struct { const char *extra, *want; } bad[] = {
        { ", \"compute_speed\": [1, 0.5], \"compute_handoff_s\": -0.001", "must be seconds in [0, 1]" },
        { ", \"compute_speed\": [1, 0.5], \"compute_handoff_s\": \"2 ms\"", "must be a number" },
        { ", \"compute_handoff_s\": 0.002", "needs compute_speed" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char pool[1024];
        snprintf(pool, sizeof pool, GOOD_POOL(1, 2) "%s", bad[i].extra);
        rc = parse_with_pool(pool, &c, err);
        CHECK_MSG(rc == UTIL_EINVAL && strstr(err, bad[i].want) && strstr(err, "compute_handoff_s"), "case %zu: '%s'", i, err);
    }
}

static cost_pool round_pool(void)
{
    cost_pool p = {.name = "p", .nodes = 4, .gpus_per_node = 8,
                   .intra = {.alpha_s = 1e-6, .busbw = 100e9}, .inter = {.alpha_s = 5e-6, .busbw = 10e9}};
    p.gpu = test_round_gpu();
    return p;
}

TEST(costdb_intra_node_collectives_match_alpha_beta_by_hand)
{
    cost_pool p = round_pool();
    double S = 1e9;
    /* all-reduce 8 ranks: 14 alpha + S/B * 14/8 = 14e-6 + 0.0175 */
    CHECK_NEAR(cost_collective_time(&p, COST_ALLREDUCE, S, 8, 8), 0.017514, 1e-9);
    /* all-gather / reduce-scatter / all-to-all: 7 alpha + S/B * 7/8 */
    CHECK_NEAR(cost_collective_time(&p, COST_ALLGATHER, S, 8, 8), 0.008757, 1e-9);
    CHECK_NEAR(cost_collective_time(&p, COST_REDUCESCATTER, S, 8, 8), 0.008757, 1e-9);
    CHECK_NEAR(cost_collective_time(&p, COST_ALLTOALL, S, 8, 8), 0.008757, 1e-9);
    /* 4 ranks: all-reduce 6 alpha + S/B * 6/4 */
    CHECK_NEAR(cost_collective_time(&p, COST_ALLREDUCE, S, 4, 4), 0.015006, 1e-9);
    /* broadcast: 7 alpha + S/B */
    CHECK_NEAR(cost_collective_time(&p, COST_BROADCAST, S, 8, 8), 0.010007, 1e-9);
}

TEST(costdb_cross_node_collectives_match_hierarchical_by_hand)
{
    cost_pool p = round_pool();
    double S = 1e9;
    /* 2 nodes x 8: intra RS (7e-6 + 0.00875) + inter AR of S/8 over 2 (2*5e-6 + 0.0125 * 2/2)
     * + intra AG (7e-6 + 0.00875) = 0.030024 */
    CHECK_NEAR(cost_collective_time(&p, COST_ALLREDUCE, S, 16, 8), 0.030024, 1e-9);
    /* all-gather, reduce-scatter: NCCL's one ring through all 16 ranks, 15 alpha_e = 75e-6,
     * + the two-level bandwidth: S/8 over 2 nodes at B_e (0.0125/2) + S over 8 at B_i (0.00875) */
    CHECK_NEAR(cost_collective_time(&p, COST_ALLGATHER, S, 16, 8), 0.015075, 1e-9);
    CHECK_NEAR(cost_collective_time(&p, COST_REDUCESCATTER, S, 16, 8), 0.015075, 1e-9);
    /* the latency grows with the ranks, not the nodes: 32 ranks on 4 nodes of 8, 31 alpha_e */
    CHECK_NEAR(cost_collective_time(&p, COST_ALLGATHER, 8.0, 32, 8) - 8.0 / 8 / p.inter.busbw * 3 / 4
               - 8.0 / p.intra.busbw * 7 / 8, 31 * 5e-6, 1e-12);
    /* all-to-all: NIC carries S*8/16 at 10 GB/s = 0.05 (NVLink part 0.004375 overlaps)
     * + 7 alpha_i + 8 alpha_e = 47e-6 */
    CHECK_NEAR(cost_collective_time(&p, COST_ALLTOALL, S, 16, 8), 0.050047, 1e-9);
    /* one GPU per node on 4 nodes: a plain ring over the NICs, 6 alpha_e + S/B_e * 6/4 */
    CHECK_NEAR(cost_collective_time(&p, COST_ALLREDUCE, S, 4, 1), 0.15003, 1e-9);
    /* cross-node is slower than the same group inside one node */
    CHECK(cost_collective_time(&p, COST_ALLREDUCE, S, 8, 4) > cost_collective_time(&p, COST_ALLREDUCE, S, 8, 8));
}

TEST(costdb_collective_edge_cases)
{
    cost_pool p = round_pool();
    CHECK_NEAR(cost_collective_time(&p, COST_ALLREDUCE, 1e9, 1, 1), 0, 0);
    CHECK_NEAR(cost_collective_time(&p, COST_ALLREDUCE, 0, 8, 8), 0, 0);
    CHECK(isinf(cost_collective_time(&p, COST_ALLREDUCE, 1e9, 8, 3)));   /* 3 does not divide 8 */
    CHECK(isinf(cost_collective_time(&p, COST_ALLREDUCE, 1e9, 16, 16))); /* only 8 per node */
    CHECK(isinf(cost_collective_time(&p, COST_ALLREDUCE, 1e9, 40, 8)));  /* only 4 nodes */
    CHECK(isinf(cost_collective_time(&p, COST_ALLGATHER, 1e9, 8, 0)));
}

TEST(costdb_p2p_uses_the_shared_link)
{
    char err[UTIL_ERR_LEN];
    cost_cluster c;
    CHECK_OK(cost_cluster_load("mixed-h100-a100", &c, err));
    double S = 1e9;
    CHECK_NEAR(cost_p2p_time(&c, 0, 0, true, S), c.pool[0].intra.alpha_s + S / 370e9, 1e-12);
    CHECK_NEAR(cost_p2p_time(&c, 0, 0, false, S), c.pool[0].inter.alpha_s + S / 47e9, 1e-12);
    CHECK_NEAR(cost_p2p_time(&c, 0, 1, false, S), c.cross_pool.alpha_s + S / 24e9, 1e-12);
    CHECK_NEAR(cost_p2p_time(&c, 1, 0, true, S), c.cross_pool.alpha_s + S / 24e9, 1e-12);
    CHECK(isinf(cost_p2p_time(&c, 0, 2, false, S)));
    CHECK_NEAR(cost_p2p_time(&c, 0, 0, true, 0), 0, 0);
}

TEST(costdb_collective_names)
{
    CHECK(strcmp(cost_coll_name(COST_ALLREDUCE), "all-reduce") == 0);
    CHECK(strcmp(cost_coll_name(COST_ALLTOALL), "all-to-all") == 0);
    CHECK(strcmp(cost_coll_name((cost_coll)99), "unknown") == 0);
}

/* Per-collective intra links (dhp profile's per-operation fits): a listed
 * operation inside one node uses its own alpha and busbw, the others and
 * multi-node groups keep intra; they load, round-trip, and bad ones are named. */
TEST(costdb_intra_ops_price_their_collective_inside_a_node)
{
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_OK(parse_with_pool(GOOD_POOL(2, 8)
                             ", \"intra_ops\": {\"source\": \"test\", \"reduce-scatter\": {\"busbw\": 1e11, \"alpha_s\": 4e-6}}",
                             &c, err));
    const cost_pool *p = &c.pool[0];
    CHECK(p->has_intra_op[COST_REDUCESCATTER] && !p->has_intra_op[COST_ALLREDUCE]);
    /* 8 ranks, 1e9 B: 7 x 4 us + 1e9 / 1e11 x 7/8 */
    CHECK_NEAR(cost_collective_time(p, COST_REDUCESCATTER, 1e9, 8, 8), 7 * 4e-6 + 1e9 / 1e11 * 7 / 8, 1e-12);
    /* all-gather keeps intra: 7 x 2 us + 1e9 / 3.7e11 x 7/8 */
    CHECK_NEAR(cost_collective_time(p, COST_ALLGATHER, 1e9, 8, 8), 7 * 2e-6 + 1e9 / 3.7e11 * 7 / 8, 1e-12);
    cJSON *o = cost_cluster_to_json(&c);
    char *text = o ? cJSON_Print(o) : NULL;
    cost_cluster back;
    int rc = text ? cost_cluster_parse_json(text, "back.json", &back, err) : -1;
    cJSON_free(text);
    cJSON_Delete(o);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(back.pool[0].has_intra_op[COST_REDUCESCATTER] && back.pool[0].intra_op[COST_REDUCESCATTER].busbw == 1e11);
    CHECK_EQ_INT(parse_with_pool(GOOD_POOL(1, 8)
                                 ", \"intra_ops\": {\"all-scatter\": {\"busbw\": 1e11, \"alpha_s\": 0}}", &c, err), UTIL_EINVAL);
    CHECK(strstr(err, "pools[0].intra_ops.all-scatter: not a collective") != NULL);
    CHECK_EQ_INT(parse_with_pool(GOOD_POOL(1, 8)
                                 ", \"intra_ops\": {\"all-reduce\": {\"busbw\": -1, \"alpha_s\": 0}}", &c, err), UTIL_EINVAL);
    CHECK(strstr(err, "intra_ops.all-reduce") != NULL);
}

/* A table with SwiGLU measured at 1e3 and 1e6 elements (4 and 1 GB/s of its
 * 12 nominal bytes per fp32 element); the other kernels are not in it. */
static cost_gpu ew_gpu(void)
{
    cost_gpu g = test_round_gpu();
    g.ew.n = 2;
    g.ew.elements[0] = 1e3;
    g.ew.elements[1] = 1e6;
    g.ew.bw[COST_EW_SWIGLU][0] = 4e9;
    g.ew.bw[COST_EW_SWIGLU][1] = 1e9;
    return g;
}

TEST(costdb_elementwise_kernels_priced_at_their_own_rate)
{
    cost_gpu g = ew_gpu();
    /* not measured: its nominal bytes at hbm_bw x mem_eff, 1e8 x 3 x 2 B / 5e11 */
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_ADD, 1e8, 2), 1.2e-3 + 1e-5, 1e-12);
    /* at the table's sizes, its rates: 12e3 B / 4e9, 12e6 B / 1e9 */
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_SWIGLU, 1e3, 4), 3e-6 + 1e-5, 1e-12);
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_SWIGLU, 1e6, 4), 1.2e-2 + 1e-5, 1e-12);
    /* half-way in log bytes: the geometric mean of the rates, 2e9 */
    double mid = sqrt(1e9);
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_SWIGLU, mid, 4), mid * 12 / 2e9 + 1e-5, 1e-12);
    /* bf16 elements move half the bytes: 1e6 of them sit where 5e5 fp32 ones do */
    double w = log(6e6 / 12e3) / log(1e3), rate = exp((1 - w) * log(4e9) + w * log(1e9));
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_SWIGLU, 1e6, 2), 6e6 / rate + 1e-5, 1e-12);
    /* outside the table: clamped to the end rates */
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_SWIGLU, 1e7, 4), 0.12 + 1e-5, 1e-12);
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_SWIGLU, 10, 4), 120 / 4e9 + 1e-5, 1e-12);
    CHECK_NEAR(cost_elementwise_time(&g, COST_EW_SWIGLU, 0, 4), 0, 0);
    /* every kernel has a name of its own and a positive access count */
    for (int k = 0; k < COST_N_EW; k++) {
        CHECK(cost_ew_name((cost_ew)k) != NULL && cost_ew_accesses((cost_ew)k) >= 1);
        for (int j = 0; j < k; j++) CHECK(strcmp(cost_ew_name((cost_ew)k), cost_ew_name((cost_ew)j)) != 0);
    }
    CHECK(cost_ew_name(COST_N_EW) == NULL);
}

TEST(costdb_elementwise_table_round_trips_and_bad_tables_are_named)
{
    cost_gpu g = ew_gpu(), back;
    char err[UTIL_ERR_LEN] = "";
    CHECK_MSG(gpu_round_trips(&g, &back, err), "%s", err);
    CHECK(back.ew.bw[COST_EW_ADD][0] == 0);
    static const struct { const char *table, *want; } bad[] = {
        {"[1, 2]", "elementwise: must be an object"},
        {"{\"swiglu\": [1e9]}", "elementwise.elements: must be an array of 1 to 2 sizes"},
        {"{\"elements\": [10, 5], \"swiglu\": [1e9, 1e9]}", "elementwise.elements[1]: sizes must be positive and ascending"},
        {"{\"elements\": [10, 50], \"swigloo\": [1e9, 1e9]}", "elementwise.swigloo: not an element-wise kernel"},
        {"{\"elements\": [10, 50], \"swiglu\": [1e9]}", "elementwise.swiglu: must be an array of 2 rates"},
        {"{\"elements\": [10, 50], \"add\": [1e9, 0]}", "elementwise.add[1]: must be a positive rate"},
        {"{\"elements\": [10, 50], \"add\": [1e9, 1e9], \"source\": 1}", "elementwise.source: must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(gpu_field_refused("elementwise", bad[i].table, bad[i].want, err), "case %zu: '%s'", i, err);
}
