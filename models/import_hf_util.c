/* Reading Hugging Face config.json sections: typed getters that name the
 * field in the error, defaults for absent keys (the transformers
 * configuration classes' own defaults are passed in by the importers). */
#include "models/import_hf_int.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>


void hf_sec(hf_section *s, const cJSON *obj, const cJSON *fallback, const char *what, const char *name)
{
    s->obj = obj;
    s->fallback = fallback;
    snprintf(s->ctx, sizeof s->ctx, "%s: %s", what, name);
}

const cJSON *hf_lookup(const hf_section *s, const char *key)
{
    const cJSON *v = s->obj ? cJSON_GetObjectItemCaseSensitive(s->obj, key) : NULL;
    if ((!v || cJSON_IsNull(v)) && s->fallback) v = cJSON_GetObjectItemCaseSensitive(s->fallback, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* Integer key; dflt < 0 means required. */
int hf_int(const hf_section *s, const char *key, long dflt, int *out, char *err)
{
    const cJSON *v = hf_lookup(s, key);
    if (!v) {
        if (dflt < 0) return util_fail(err, UTIL_EINVAL, "%s.%s: required field is missing", s->ctx, key);
        *out = (int)dflt;
        return UTIL_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > MODEL_MAX_WIDTH ||
        v->valuedouble != (double)(int)v->valuedouble)
        return util_fail(err, UTIL_EINVAL, "%s.%s: must be an integer in [0, %d]", s->ctx, key, MODEL_MAX_WIDTH);
    *out = (int)v->valuedouble;
    return UTIL_OK;
}

/* A norm epsilon key, when present (rms_norm_eps, layer_norm_eps): *out is
 * left as it is (0: the norm kind's default, model_norm_eps) otherwise. */
int hf_eps(const hf_section *s, const char *key, double *out, char *err)
{
    const cJSON *v = hf_lookup(s, key);
    if (!v) return UTIL_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= MODEL_MAX_NORM_EPS))
        return util_fail(err, UTIL_EINVAL, "%s.%s: must be a number in (0, %g]", s->ctx, key, MODEL_MAX_NORM_EPS);
    *out = v->valuedouble;
    return UTIL_OK;
}

int hf_bool(const hf_section *s, const char *key, bool dflt, bool *out, char *err)
{
    const cJSON *v = hf_lookup(s, key);
    if (!v) { *out = dflt; return UTIL_OK; }
    if (!cJSON_IsBool(v)) return util_fail(err, UTIL_EINVAL, "%s.%s: must be true or false", s->ctx, key);
    *out = cJSON_IsTrue(v);
    return UTIL_OK;
}

const char *hf_str(const hf_section *s, const char *key)
{
    const cJSON *v = hf_lookup(s, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int hf_list(const hf_section *s, const char *key, int *list, int *n, char *err)
{
    const cJSON *arr = hf_lookup(s, key);
    *n = 0;
    if (!arr) return UTIL_OK;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > MODEL_MAX_LIST)
        return util_fail(err, UTIL_EINVAL, "%s.%s: must be an array of at most %d integers", s->ctx, key,
                         MODEL_MAX_LIST);
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > INT_MAX ||
            v->valuedouble != (double)(int)v->valuedouble)
            return util_fail(err, UTIL_EINVAL, "%s.%s[%d]: must be a non-negative integer", s->ctx, key, *n);
        list[(*n)++] = (int)v->valuedouble;
    }
    return UTIL_OK;
}

/* Derived sizes are products of config values (each <= MODEL_MAX_WIDTH, so
 * the int64 product is exact); they must fit an int. */
int hf_narrow(int64_t v, const hf_section *s, const char *field, int *out, char *err)
{
    if (v > MODEL_MAX_WIDTH)
        return util_fail(err, UTIL_EINVAL, "%s: derived %s = %lld exceeds %d", s->ctx, field, (long long)v,
                         MODEL_MAX_WIDTH);
    *out = (int)v;
    return UTIL_OK;
}

const cJSON *hf_sub(const cJSON *root, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return cJSON_IsObject(v) ? v : NULL;
}

void hf_init_module(model_module *mm, const char *name, model_kind kind)
{
    memset(mm, 0, sizeof *mm);
    util_strlcpy(mm->name, name, sizeof mm->name);
    mm->kind = kind;
    mm->temporal_patch = 1;
    mm->merge = 1;
    mm->pool = 1;
    mm->proj_bias = true;
    mm->feeds = -1;
}

int hf_set_head_dim(model_module *mm, const hf_section *s, char *err)
{
    if (mm->heads <= 0 || mm->hidden <= 0)
        return util_fail(err, UTIL_EINVAL, "%s: hidden size and head count must be > 0", s->ctx);
    if (!hf_lookup(s, "head_dim") && mm->hidden % mm->heads)
        return util_fail(err, UTIL_EINVAL, "%s: %d heads do not divide hidden size %d and head_dim is absent",
                         s->ctx, mm->heads, mm->hidden);
    return hf_int(s, "head_dim", mm->hidden / mm->heads, &mm->head_dim, err);
}
