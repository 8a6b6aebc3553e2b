#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void line_col(const char *text, const char *stop, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (const char *p = text; p < stop && *p; p++) {
        if (*p == '\n') { (*line)++; *col = 1; } else (*col)++;
    }
}

static int fail_at(const char *text, const char *at, const char *what, const char *problem, char *err)
{
    int line, col;
    line_col(text, at, &line, &col);
    return util_fail(err, UTIL_EINVAL, "%s: %s at line %d, column %d", what, problem, line, col);
}

/* What cJSON accepts and JSON (RFC 8259) or dhp does not: strings must be
 * valid UTF-8 without raw control characters (section 7) and without
 * \u0000 (cJSON would cut the string there); nesting is bounded (cJSON's
 * own limit is 1000, and every reader recurses). One pass over the text. */
static int prescan(const char *text, const char *what, char *err)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t n = strlen(text);
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        if (!in_str) {
            if (c == '"') in_str = true;
            else if (c == '{' || c == '[') {
                if (++depth > UTIL_JSON_MAX_DEPTH) {
                    char why[64];
                    snprintf(why, sizeof why, "nesting deeper than %d levels", UTIL_JSON_MAX_DEPTH);
                    return fail_at(text, text + i, what, why, err);
                }
            } else if (c == '}' || c == ']') depth--;
            i++;
            continue;
        }
        if (c == '"') { in_str = false; i++; continue; }
        if (c == '\\') {
            if (i + 5 < n && p[i + 1] == 'u' && !memcmp(p + i + 2, "0000", 4))
                return fail_at(text, text + i, what, "NUL character (\\u0000) in a string", err);
            i += i + 1 < n ? 2 : 1;
            continue;
        }
        if (c < 0x20) return fail_at(text, text + i, what, "control character in a string", err);
        size_t k = util_utf8_seq(p + i, n - i);
        if (!k) return fail_at(text, text + i, what, "invalid UTF-8 in a string", err);
        i += k;
    }
    return UTIL_OK;
}

/* Appends ".key" or "[i]" to the location of a value, for messages. */
static void path_push(char *path, size_t cap, const char *key, int index)
{
    size_t len = strlen(path);
    if (key) snprintf(path + len, cap - len, "%s%s", len ? "." : "", key);
    else snprintf(path + len, cap - len, "[%d]", index);
}

static int duplicate(const char *what, const char *path, const char *key, char *err)
{
    return util_fail(err, UTIL_EINVAL, "%s: key '%s' appears twice in %s%s", what, key,
                     path[0] ? "" : "the top-level object", path);
}

/* Small objects compare pairwise, large ones (a checkpoint header's
 * thousands of tensors) through a hash set: linear either way in practice. */
static int object_dups(const cJSON *o, const char *what, const char *path, char *err)
{
    int n = cJSON_GetArraySize(o);
    if (n <= 16) {
        for (const cJSON *a = o->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (!strcmp(a->string, b->string)) return duplicate(what, path, a->string, err);
        return UTIL_OK;
    }
    util_strmap seen;
    if (util_strmap_init(&seen, (size_t)n)) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", what);
    int rc = UTIL_OK;
    for (const cJSON *a = o->child; a && !rc; a = a->next) {
        int r = util_strmap_put(&seen, a->string, 0, NULL);
        if (r == UTIL_EINVAL) rc = duplicate(what, path, a->string, err);
        else if (r) rc = util_fail(err, UTIL_ENOMEM, "%s: out of memory", what);
    }
    util_strmap_free(&seen);
    return rc;
}

static int check_dups(const cJSON *node, const char *what, char *path, size_t cap, char *err)
{
    if (!cJSON_IsObject(node) && !cJSON_IsArray(node)) return UTIL_OK;
    if (cJSON_IsObject(node)) {
        int rc = object_dups(node, what, path, err);
        if (rc) return rc;
    }
    size_t len = strlen(path);
    int i = 0;
    for (const cJSON *c = node->child; c; c = c->next, i++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
        path_push(path, cap, cJSON_IsObject(node) ? c->string : NULL, i);
        int rc = check_dups(c, what, path, cap, err);
        path[len] = '\0';
        if (rc) return rc;
    }
    return UTIL_OK;
}

int util_json_parse(const char *text, const char *what, cJSON **out, char *err)
{
    *out = NULL;
    int rc = prescan(text, what, err);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) return fail_at(text, end ? end : text, what, "malformed JSON", err);
    char path[256] = "";
    if ((rc = check_dups(root, what, path, sizeof path, err))) {
        cJSON_Delete(root);
        return rc;
    }
    *out = root;
    return UTIL_OK;
}

int util_json_read(const char *path, cJSON **out, char *err)
{
    char *text;
    *out = NULL;
    int rc = util_read_text_file(path, UTIL_JSON_MAX_BYTES, &text, NULL, err);
    if (rc) return rc;
    rc = util_json_parse(text, path, out, err);
    util_free(text);
    return rc;
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
    /* an escaped control character (\u001b ...) passes the parser's checks */
    if (!util_text_ok(v->valuestring))
        return util_fail(err, UTIL_EINVAL, "%s.%s: control characters are not allowed", ctx, key);
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
    int rc = util_write_output(path, buf, n + 1, err);
    util_free(buf);
    return rc;
}
