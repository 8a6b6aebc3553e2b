#include "test_fixture.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void fail(const char *err)
{
    fprintf(stderr, "test fixture: %s\n", err);
    abort();
}

model_t test_model_load(const char *name)
{
    model_t m;
    char err[UTIL_ERR_LEN];
    if (model_load(name, &m, err)) fail(err);
    return m;
}

cost_cluster test_cluster_load(const char *name)
{
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    if (cost_cluster_load(name, &c, err)) fail(err);
    return c;
}

model_t test_llm(const char *name, const char *fmt, ...)
{
    char fields[512], text[768], err[UTIL_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(fields, sizeof fields, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof fields) fail("test_llm: the module's fields do not fit 512 bytes");
    snprintf(text, sizeof text,
             "{\"schema\": \"dhp.model/1\", \"name\": \"%s\", \"modules\": [{\"name\": \"llm\", \"kind\": \"llm\", %s}]}",
             name, fields);
    model_t m;
    if (model_parse_json(text, name, &m, err)) fail(err);
    return m;
}

int test_import_hf(const char *file, model_t *m, char *err)
{
    char path[256], *text;
    snprintf(path, sizeof path, "tests/data/hf/%s", file);
    int rc = util_read_file(path, &text, NULL, err);
    if (rc) return rc;
    rc = model_import_hf(text, path, m, err);
    util_free(text);
    return rc;
}

int test_model_json_round_trip(const model_t *m, model_t *back, char *err)
{
    cJSON *j = model_to_json(m);
    int rc = model_from_json(j, "imported", back, err);
    cJSON_Delete(j);
    return rc;
}

cost_gpu test_round_gpu(void)
{
    cost_gpu g = {.name = "round", .peak_flops = 1e15, .gemm_eff_max = 0.8, .gemm_half = 100,
                  .attn_eff = 0.5, .hbm_bytes = 1e11, .hbm_bw = 1e12, .mem_eff = 0.5,
                  .reserved_bytes = 1e9, .kernel_launch_s = 1e-5};
    return g;
}

int test_plan_json_round_trip(const plan_t *p, plan_t *back, char *err)
{
    cJSON *j = plan_to_json(p);
    int rc = plan_from_json(j, "plan", back, err);
    cJSON_Delete(j);
    return rc;
}

bool test_plan_json_has(const plan_t *p, const char *key)
{
    cJSON *j = plan_to_json(p);
    bool has = cJSON_GetObjectItemCaseSensitive(j, key) != NULL;
    cJSON_Delete(j);
    return has;
}

static plan_options options_for(plan_target t, plan_precision prec)
{
    plan_options o;
    plan_options_default(&o);
    o.target = t;
    o.precision = prec;
    return o;
}

plan_options test_dhp_fp32(void) { return options_for(PLAN_TARGET_DHP, PLAN_OPT_FP32); }
plan_options test_megatron_autocast(void) { return options_for(PLAN_TARGET_MEGATRON, PLAN_OPT_AUTOCAST); }
