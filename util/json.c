#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cJSON gives only a pointer to where parsing stopped; turn it into line:col. */
int util_json_parse(const char *text, const char *what, cJSON **out, char *err)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        int line = 1, col = 1;
        const char *stop = end ? end : text;
        for (const char *p = text; p < stop && *p; p++) {
            if (*p == '\n') { line++; col = 1; } else col++;
        }
        return util_fail(err, UTIL_EINVAL, "%s: malformed JSON at line %d, column %d", what, line, col);
    }
    *out = root;
    return UTIL_OK;
}

static const cJSON *field(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

int util_json_num(const cJSON *obj, const char *ctx, const char *key, bool required,
                  double lo, double hi, double dflt, double *out, char *err)
{
    const cJSON *v = field(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return util_fail(err, UTIL_EINVAL, "%s.%s: required field is missing", ctx, key);
        *out = dflt;
        return UTIL_OK;
    }
    if (!cJSON_IsNumber(v)) return util_fail(err, UTIL_EINVAL, "%s.%s: must be a number", ctx, key);
    double d = v->valuedouble;
    if (!isfinite(d)) return util_fail(err, UTIL_EINVAL, "%s.%s: must be finite", ctx, key);
    if (d < lo || d > hi)
        return util_fail(err, UTIL_EINVAL, "%s.%s: %g is out of range [%g, %g]", ctx, key, d, lo, hi);
    *out = d;
    return UTIL_OK;
}

int util_json_int(const cJSON *obj, const char *ctx, const char *key, bool required,
                  long lo, long hi, long dflt, long *out, char *err)
{
    double d;
    int rc = util_json_num(obj, ctx, key, required, -9.0e18, 9.0e18, (double)dflt, &d, err);
    if (rc) return rc;
    if (d != floor(d)) return util_fail(err, UTIL_EINVAL, "%s.%s: must be an integer (got %g)", ctx, key, d);
    if (d < (double)lo || d > (double)hi)
        return util_fail(err, UTIL_EINVAL, "%s.%s: %.0f is out of range [%ld, %ld]", ctx, key, d, lo, hi);
    *out = (long)d;
    return UTIL_OK;
}

int util_json_str(const cJSON *obj, const char *ctx, const char *key, bool required,
                  const char *dflt, char *out, size_t n, char *err)
{
    const cJSON *v = field(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return util_fail(err, UTIL_EINVAL, "%s.%s: required field is missing", ctx, key);
        util_strlcpy(out, dflt ? dflt : "", n);
        return UTIL_OK;
    }
    if (!cJSON_IsString(v)) return util_fail(err, UTIL_EINVAL, "%s.%s: must be a string", ctx, key);
    if (strlen(v->valuestring) >= n)
        return util_fail(err, UTIL_EINVAL, "%s.%s: longer than %zu characters", ctx, key, n - 1);
    util_strlcpy(out, v->valuestring, n);
    return UTIL_OK;
}

int util_json_bool(const cJSON *obj, const char *ctx, const char *key, bool required,
                   bool dflt, bool *out, char *err)
{
    const cJSON *v = field(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return util_fail(err, UTIL_EINVAL, "%s.%s: required field is missing", ctx, key);
        *out = dflt;
        return UTIL_OK;
    }
    if (!cJSON_IsBool(v)) return util_fail(err, UTIL_EINVAL, "%s.%s: must be true or false", ctx, key);
    *out = cJSON_IsTrue(v);
    return UTIL_OK;
}

int util_json_write(const char *path, const cJSON *root, char *err)
{
    char *text = cJSON_Print(root);
    if (!text) return util_fail(err, UTIL_ENOMEM, "%s: out of memory serialising JSON", path);
    size_t n = strlen(text);
    /* cJSON_Print allocates with malloc; append a newline in a copy we own. */
    char *buf = util_malloc(n + 2);
    if (!buf) { free(text); return util_fail(err, UTIL_ENOMEM, "%s: out of memory", path); }
    memcpy(buf, text, n);
    buf[n] = '\n'; buf[n + 1] = '\0';
    free(text);
    int rc = util_write_atomic(path, buf, n + 1, err);
    util_free(buf);
    return rc;
}
