/* Model descriptions: JSON schema "dhp.model/1" (models/SCHEMA.md) to and
 * from model_t, validation, the built-in zoo and module look-up. */
#include "models.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *kind_names[] = {"vision", "audio", "llm"};
static const char *ffn_names[] = {"gelu", "swiglu", "quick_gelu"};
static const char *norm_names[] = {"layernorm", "rmsnorm"};

const char *model_kind_name(model_kind k) { return (unsigned)k < 3 ? kind_names[k] : "?"; }
const char *model_ffn_kind_name(model_ffn_kind k) { return (unsigned)k < 3 ? ffn_names[k] : "?"; }
const char *model_norm_kind_name(model_norm_kind k) { return (unsigned)k < 2 ? norm_names[k] : "?"; }

/* ---- field table: one row per scalar field of model_module ---- */

typedef enum { F_INT, F_BOOL, F_NORM, F_EPS } field_type;
typedef enum { G_ALL, G_ENCODER, G_LLM } field_group;

typedef struct {
    const char *key;
    field_type type;
    field_group group;
    size_t off;
    bool derived;   /* absent -> computed from other fields after parsing */
} field_desc;

#define FI(k, g) {#k, F_INT, g, offsetof(model_module, k), false}
#define FB(k, g) {#k, F_BOOL, g, offsetof(model_module, k), false}
#define FD(k, t, g) {#k, t, g, offsetof(model_module, k), true}

static const field_desc fields[] = {
    FI(layers, G_ALL), FI(hidden, G_ALL), FI(heads, G_ALL),
    FD(kv_heads, F_INT, G_ALL), FD(head_dim, F_INT, G_ALL), FI(ffn, G_ALL),
    FB(qkv_bias, G_ALL), FD(k_bias, F_BOOL, G_ALL), FB(out_bias, G_ALL), FB(mlp_bias, G_ALL),
    FB(qk_norm, G_ALL), FB(qk_norm_head, G_ALL), FB(post_norms, G_ALL), FI(extra_params, G_ALL),
    FB(layer_scale, G_ALL), FB(frozen, G_ALL),
    FB(unfused_attention, G_ALL), FB(dropout, G_ALL),
    FB(pre_norm, G_ALL), FB(final_norm, G_ALL),
    FI(in_channels, G_ENCODER), FI(patch, G_ENCODER), FB(patch_bias, G_ENCODER),
    FI(temporal_patch, G_ENCODER), FI(image_size, G_ENCODER), FI(max_positions, G_ENCODER),
    FB(cls_token, G_ENCODER), FI(merge, G_ENCODER), FI(pool, G_ENCODER), FI(window, G_ENCODER),
    FI(gated_layers, G_ENCODER), FI(unused_layers, G_ENCODER), FI(max_tiles, G_ENCODER), FI(aspect_ratios, G_ENCODER),
    FB(proj_norm, G_ENCODER), FD(proj_norm_width, F_INT, G_ENCODER),
    FD(proj_norm_kind, F_NORM, G_ENCODER), FD(proj_in, F_INT, G_ENCODER), FI(proj_hidden, G_ENCODER),
    FI(out_hidden, G_ENCODER), FB(proj_bias, G_ENCODER),
    {"norm_eps", F_EPS, G_ALL, offsetof(model_module, norm_eps), false},
    FI(vocab, G_LLM), FI(vocab_extra, G_LLM), FB(tied_embeddings, G_LLM), FI(rope_theta, G_LLM),
};
#define N_FIELDS ((int)(sizeof fields / sizeof fields[0]))

static bool group_applies(field_group g, model_kind k)
{
    return g == G_ALL || (g == G_LLM) == (k == MODEL_LLM);
}

static int *int_at(model_module *mm, const field_desc *f) { return (int *)((char *)mm + f->off); }
static bool *bool_at(model_module *mm, const field_desc *f) { return (bool *)((char *)mm + f->off); }
static model_norm_kind *norm_at(model_module *mm, const field_desc *f)
{
    return (model_norm_kind *)((char *)mm + f->off);
}
static int int_of(const model_module *mm, const field_desc *f) { return *(const int *)((const char *)mm + f->off); }
static bool bool_of(const model_module *mm, const field_desc *f)
{
    return *(const bool *)((const char *)mm + f->off);
}
static model_norm_kind norm_of(const model_module *mm, const field_desc *f)
{
    return *(const model_norm_kind *)((const char *)mm + f->off);
}

/* ---- parsing ---- */

static int parse_enum(const cJSON *obj, const char *ctx, const char *key, const char **names, int n,
                      int dflt, bool required, int *out, char *err)
{
    char buf[32];
    int rc = util_json_str(obj, ctx, key, required, NULL, buf, sizeof buf, err);
    if (rc) return rc;
    if (!cJSON_GetObjectItemCaseSensitive(obj, key)) { *out = dflt; return UTIL_OK; }
    for (int i = 0; i < n; i++)
        if (strcmp(buf, names[i]) == 0) { *out = i; return UTIL_OK; }
    char choices[128] = "";
    for (int i = 0; i < n; i++) {
        strncat(choices, i ? "|" : "", sizeof choices - strlen(choices) - 1);
        strncat(choices, names[i], sizeof choices - strlen(choices) - 1);
    }
    return util_fail(err, UTIL_EINVAL, "%s.%s: unknown value '%s' (expected %s)", ctx, key, buf, choices);
}

static int parse_int_list(const cJSON *obj, const char *ctx, const char *key, int *list, int *n, char *err)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(obj, key);
    *n = 0;
    if (!arr || cJSON_IsNull(arr)) return UTIL_OK;
    if (!cJSON_IsArray(arr)) return util_fail(err, UTIL_EINVAL, "%s.%s: must be an array of integers", ctx, key);
    int count = cJSON_GetArraySize(arr);
    if (count > MODEL_MAX_LIST)
        return util_fail(err, UTIL_EINVAL, "%s.%s: %d entries, at most %d", ctx, key, count, MODEL_MAX_LIST);
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (!cJSON_IsNumber(v) || v->valuedouble < INT_MIN || v->valuedouble > INT_MAX ||
            v->valuedouble != (double)(int)v->valuedouble)
            return util_fail(err, UTIL_EINVAL, "%s.%s[%d]: must be an integer", ctx, key, *n);
        list[(*n)++] = (int)v->valuedouble;
    }
    return UTIL_OK;
}

static bool known_key(const char *key, model_kind kind, bool *wrong_kind)
{
    static const char *special_all[] = {"name", "kind", "ffn_kind", "norm"};
    static const char *special_enc[] = {"feeds", "full_layers"};
    *wrong_kind = false;
    for (size_t i = 0; i < sizeof special_all / sizeof *special_all; i++)
        if (strcmp(key, special_all[i]) == 0) return true;
    for (size_t i = 0; i < sizeof special_enc / sizeof *special_enc; i++)
        if (strcmp(key, special_enc[i]) == 0) { *wrong_kind = kind == MODEL_LLM; return !*wrong_kind; }
    if (strcmp(key, "cross_layers") == 0 || strcmp(key, "mrope_section") == 0) {
        *wrong_kind = kind != MODEL_LLM;
        return !*wrong_kind;
    }
    for (int i = 0; i < N_FIELDS; i++)
        if (strcmp(key, fields[i].key) == 0) {
            *wrong_kind = !group_applies(fields[i].group, kind);
            return !*wrong_kind;
        }
    return false;
}

static int check_keys(const cJSON *obj, const char *ctx, model_kind kind, char *err)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, obj) {
        bool wrong_kind;
        if (known_key(c->string, kind, &wrong_kind)) continue;
        if (wrong_kind)
            return util_fail(err, UTIL_EINVAL, "%s.%s: not a field of a%s %s module", ctx, c->string,
                             kind == MODEL_VISION ? "" : "n", model_kind_name(kind));
        return util_fail(err, UTIL_EINVAL, "%s.%s: unknown field", ctx, c->string);
    }
    return UTIL_OK;
}

static void set_kind_defaults(model_module *mm, model_kind kind)
{
    memset(mm, 0, sizeof *mm);
    mm->kind = kind;
    mm->ffn_kind = kind == MODEL_LLM ? MODEL_FFN_SWIGLU : MODEL_FFN_GELU;
    mm->norm = kind == MODEL_LLM ? MODEL_NORM_RMSNORM : MODEL_NORM_LAYERNORM;
    mm->final_norm = kind == MODEL_LLM;
    mm->in_channels = kind == MODEL_VISION ? 3 : 0;
    mm->temporal_patch = 1;
    mm->merge = 1;
    mm->pool = 1;
    mm->proj_bias = true;
    mm->feeds = -1;
    mm->rope_theta = kind == MODEL_LLM ? 10000 : 0;
}

static bool is_required(const field_desc *f, model_kind kind)
{
    static const char *req_all[] = {"layers", "hidden", "heads", "ffn"};
    static const char *req_enc[] = {"patch", "out_hidden"};
    for (size_t i = 0; i < 4; i++) if (strcmp(f->key, req_all[i]) == 0) return true;
    if (kind == MODEL_LLM) return strcmp(f->key, "vocab") == 0;
    if (kind == MODEL_AUDIO && strcmp(f->key, "in_channels") == 0) return true;
    for (size_t i = 0; i < 2; i++) if (strcmp(f->key, req_enc[i]) == 0) return true;
    return false;
}

static int read_field(const cJSON *obj, const char *ctx, const field_desc *f, model_module *mm,
                      bool required, char *err)
{
    long v;
    int e;
    switch (f->type) {
    case F_INT:
        if (util_json_int(obj, ctx, f->key, required, INT_MIN, INT_MAX, *int_at(mm, f), &v, err))
            return UTIL_EINVAL;
        *int_at(mm, f) = (int)v;
        return UTIL_OK;
    case F_BOOL:
        return util_json_bool(obj, ctx, f->key, required, *bool_at(mm, f), bool_at(mm, f), err);
    case F_NORM:
        if (parse_enum(obj, ctx, f->key, norm_names, 2, (int)*norm_at(mm, f), required, &e, err))
            return UTIL_EINVAL;
        *norm_at(mm, f) = (model_norm_kind)e;
        return UTIL_OK;
    case F_EPS:
        return util_json_num(obj, ctx, f->key, required, 0, MODEL_MAX_NORM_EPS, 0, (double *)((char *)mm + f->off), err);
    }
    return UTIL_EINVAL;
}

/* Fields whose default depends on others: kv_heads = heads, head_dim =
 * hidden / heads (heads must divide hidden then), k_bias = qkv_bias,
 * proj_in = hidden * merge^2, proj_norm_width = hidden, proj_norm_kind = norm. */
static int derive_defaults(model_module *mm, const cJSON *obj, const char *ctx, char *err)
{
    bool has_head_dim = cJSON_GetObjectItemCaseSensitive(obj, "head_dim") != NULL;
    if (!cJSON_GetObjectItemCaseSensitive(obj, "kv_heads")) mm->kv_heads = mm->heads;
    if (!cJSON_GetObjectItemCaseSensitive(obj, "k_bias")) mm->k_bias = mm->qkv_bias;
    if (!cJSON_GetObjectItemCaseSensitive(obj, "proj_norm_kind")) mm->proj_norm_kind = mm->norm;
    if (!cJSON_GetObjectItemCaseSensitive(obj, "proj_norm_width")) mm->proj_norm_width = mm->hidden;
    if (!cJSON_GetObjectItemCaseSensitive(obj, "proj_in") && mm->kind != MODEL_LLM) {
        double p = (double)mm->hidden * mm->merge * mm->merge;
        if (p > MODEL_MAX_WIDTH)
            return util_fail(err, UTIL_EINVAL, "%s.proj_in: hidden*merge^2 = %.0f exceeds the limit %d", ctx, p,
                             MODEL_MAX_WIDTH);
        mm->proj_in = p > 0 ? (int)p : 0;   /* a bad hidden or merge is reported by validation */
    }
    if (!has_head_dim && mm->heads > 0 && mm->hidden > 0) {
        if (mm->hidden % mm->heads)
            return util_fail(err, UTIL_EINVAL, "%s.heads: %d does not divide hidden %d (give head_dim explicitly)",
                             ctx, mm->heads, mm->hidden);
        mm->head_dim = mm->hidden / mm->heads;
    }
    return UTIL_OK;
}

static int parse_module(const cJSON *obj, const char *ctx, model_module *mm, char *feeds, size_t feeds_n,
                        char *err)
{
    if (!cJSON_IsObject(obj)) return util_fail(err, UTIL_EINVAL, "%s: must be an object", ctx);
    int kind;
    if (parse_enum(obj, ctx, "kind", kind_names, 3, 0, true, &kind, err)) return UTIL_EINVAL;
    set_kind_defaults(mm, (model_kind)kind);
    if (check_keys(obj, ctx, mm->kind, err)) return UTIL_EINVAL;
    if (util_json_str(obj, ctx, "name", true, NULL, mm->name, sizeof mm->name, err)) return UTIL_EINVAL;
    int e;
    if (parse_enum(obj, ctx, "ffn_kind", ffn_names, 3, (int)mm->ffn_kind, false, &e, err)) return UTIL_EINVAL;
    mm->ffn_kind = (model_ffn_kind)e;
    if (parse_enum(obj, ctx, "norm", norm_names, 2, (int)mm->norm, false, &e, err)) return UTIL_EINVAL;
    mm->norm = (model_norm_kind)e;
    for (int i = 0; i < N_FIELDS; i++) {
        const field_desc *f = &fields[i];
        if (!group_applies(f->group, mm->kind)) continue;
        if (f->derived && !cJSON_GetObjectItemCaseSensitive(obj, f->key)) continue;
        if (read_field(obj, ctx, f, mm, is_required(f, mm->kind), err)) return UTIL_EINVAL;
    }
    if (derive_defaults(mm, obj, ctx, err)) return UTIL_EINVAL;
    if (mm->kind == MODEL_LLM) {
        feeds[0] = '\0';
        if (parse_int_list(obj, ctx, "mrope_section", mm->mrope_section, &mm->n_mrope, err)) return UTIL_EINVAL;
        return parse_int_list(obj, ctx, "cross_layers", mm->cross_layers, &mm->n_cross_layers, err);
    }
    if (util_json_str(obj, ctx, "feeds", true, NULL, feeds, feeds_n, err)) return UTIL_EINVAL;
    return parse_int_list(obj, ctx, "full_layers", mm->full_layers, &mm->n_full_layers, err);
}

static int resolve_feeds(model_t *m, char feeds[][MODEL_NAME_LEN], const char *what, char *err)
{
    m->llm = -1;
    for (int i = 0; i < m->n_modules; i++) {
        if (m->mod[i].kind != MODEL_LLM) continue;
        if (m->llm >= 0)
            return util_fail(err, UTIL_EINVAL, "%s: modules[%d].kind: second llm module (modules[%d] is one); "
                             "a model has exactly one", what, i, m->llm);
        m->llm = i;
    }
    for (int i = 0; i < m->n_modules; i++) {
        if (m->mod[i].kind == MODEL_LLM) continue;
        int target = model_find(m, feeds[i]);
        if (target < 0)
            return util_fail(err, UTIL_EINVAL, "%s: modules[%d].feeds: no module named '%s'", what, i, feeds[i]);
        m->mod[i].feeds = target;
    }
    return UTIL_OK;
}

/* util_json_* name a field "ctx.key"; at the top level we want "file: key". */
static int top_level_error(const char *what, char *err)
{
    size_t n = strlen(what), len = strlen(err);
    if (strncmp(err, what, n) == 0 && err[n] == '.' && len + 2 < UTIL_ERR_LEN) {
        memmove(err + n + 2, err + n + 1, len - n);
        err[n] = ':';
        err[n + 1] = ' ';
    }
    return UTIL_EINVAL;
}

static const char *const token_names[MODEL_NTOKENS] = { "image", "video", "vision_start", "vision_end", "audio" };

const char *model_token_name(model_token t) { return t >= 0 && t < MODEL_NTOKENS ? token_names[t] : "?"; }

/* "tokens": {"image": 151655, ...}: optional, each id a non-negative integer. */
static int parse_tokens(const cJSON *root, const char *what, model_t *m, char *err)
{
    for (int t = 0; t < MODEL_NTOKENS; t++) m->tokens[t] = -1;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!o) return UTIL_OK;
    if (!cJSON_IsObject(o)) return util_fail(err, UTIL_EINVAL, "%s.tokens: must be an object", what);
    const cJSON *c;
    cJSON_ArrayForEach(c, o) {
        int t = 0;
        while (t < MODEL_NTOKENS && strcmp(c->string, token_names[t])) t++;
        if (t == MODEL_NTOKENS)
            return util_fail(err, UTIL_EINVAL, "%s.tokens.%s: unknown token (known: image, video, vision_start, vision_end, audio)", what, c->string);
        if (!cJSON_IsNumber(c) || c->valuedouble < 0 || c->valuedouble > INT_MAX || c->valuedouble != (int)c->valuedouble)
            return util_fail(err, UTIL_EINVAL, "%s.tokens.%s: must be a non-negative integer", what, c->string);
        m->tokens[t] = (int)c->valuedouble;
    }
    return UTIL_OK;
}

static int parse_top(const cJSON *root, const char *what, model_t *m, char *err)
{
    char buf[64];
    if (util_json_str(root, what, "schema", true, NULL, buf, sizeof buf, err)) return UTIL_EINVAL;
    if (strcmp(buf, MODEL_SCHEMA) != 0)
        return util_fail(err, UTIL_EINVAL, "%s.schema: '%s' is not %s", what, buf, MODEL_SCHEMA);
    if (util_json_str(root, what, "name", true, NULL, m->name, sizeof m->name, err)) return UTIL_EINVAL;
    if (util_json_str(root, what, "source", false, "", m->source, sizeof m->source, err)) return UTIL_EINVAL;
    double pub;
    if (util_json_num(root, what, "published_params", false, 0, 9.0e15, 0, &pub, err)) return UTIL_EINVAL;
    m->published_params = (int64_t)pub;
    if (util_json_str(root, what, "published_source", false, "", m->published_source, sizeof m->published_source,
                      err))
        return UTIL_EINVAL;
    if (parse_tokens(root, what, m, err)) return UTIL_EINVAL;
    const cJSON *mods = cJSON_GetObjectItemCaseSensitive(root, "modules");
    if (!cJSON_IsArray(mods)) return util_fail(err, UTIL_EINVAL, "%s.modules: required array is missing", what);
    int n = cJSON_GetArraySize(mods);
    if (n < 1 || n > MODEL_MAX_MODULES)
        return util_fail(err, UTIL_EINVAL, "%s.modules: %d modules, need 1..%d", what, n, MODEL_MAX_MODULES);
    return UTIL_OK;
}

int model_from_json(const cJSON *root, const char *what, model_t *m, char *err)
{
    memset(m, 0, sizeof *m);
    if (!cJSON_IsObject(root)) return util_fail(err, UTIL_EINVAL, "%s: top level must be an object", what);
    static const char *top_keys[] = {"schema", "name", "source", "published_params", "published_source",
                                     "tokens", "modules"};
    const cJSON *c;
    cJSON_ArrayForEach(c, root) {
        bool known = false;
        for (size_t i = 0; i < sizeof top_keys / sizeof *top_keys; i++) known |= strcmp(c->string, top_keys[i]) == 0;
        if (!known) return util_fail(err, UTIL_EINVAL, "%s: %s: unknown field", what, c->string);
    }
    if (parse_top(root, what, m, err)) return top_level_error(what, err);
    const cJSON *mods = cJSON_GetObjectItemCaseSensitive(root, "modules");
    char feeds[MODEL_MAX_MODULES][MODEL_NAME_LEN];
    const cJSON *mo;
    cJSON_ArrayForEach(mo, mods) {
        char ctx[MODEL_NAME_LEN + 300];
        snprintf(ctx, sizeof ctx, "%s: modules[%d]", what, m->n_modules);
        if (parse_module(mo, ctx, &m->mod[m->n_modules], feeds[m->n_modules], MODEL_NAME_LEN, err))
            return UTIL_EINVAL;
        m->n_modules++;
    }
    if (resolve_feeds(m, feeds, what, err)) return UTIL_EINVAL;
    return model_validate_as(m, what, err);
}

int model_parse_json(const char *text, const char *what, model_t *m, char *err)
{
    cJSON *root;
    if (util_json_parse(text, what, &root, err)) return UTIL_EINVAL;
    int rc = model_from_json(root, what, m, err);
    cJSON_Delete(root);
    return rc;
}

/* ---- validation ---- */

#define BAD(...) util_fail(err, UTIL_EINVAL, __VA_ARGS__)

static int check_positive(const char *what, int i, const char *key, int v, char *err)
{
    if (v > 0) return UTIL_OK;
    return BAD("%s: modules[%d].%s: must be > 0 (got %d)", what, i, key, v);
}

static int check_at_least(const char *what, int i, const char *key, int v, int lo, char *err)
{
    if (v >= lo) return UTIL_OK;
    return BAD("%s: modules[%d].%s: must be >= %d (got %d)", what, i, key, lo, v);
}

static int check_at_most(const char *what, int i, const char *key, int v, int hi, char *err)
{
    if (v <= hi) return UTIL_OK;
    return BAD("%s: modules[%d].%s: %d exceeds the limit %d", what, i, key, v, hi);
}

static int check_layer_list(const char *what, int i, const char *key, const int *list, int n, int layers,
                            char *err)
{
    if (n < 0 || n > MODEL_MAX_LIST) return BAD("%s: modules[%d].%s: bad length %d", what, i, key, n);
    for (int j = 0; j < n; j++) {
        if (list[j] < 0 || list[j] >= layers)
            return BAD("%s: modules[%d].%s[%d]: layer %d is out of range [0, %d)", what, i, key, j, list[j], layers);
        if (j > 0 && list[j] <= list[j - 1])
            return BAD("%s: modules[%d].%s[%d]: %d is not after %d (list must be sorted, no repeats)",
                       what, i, key, j, list[j], list[j - 1]);
    }
    return UTIL_OK;
}

double model_norm_eps(const model_module *mm)
{
    if (mm->norm_eps > 0) return mm->norm_eps;
    return mm->norm == MODEL_NORM_LAYERNORM ? 1e-5 : 1e-6;
}

static int validate_common(const model_module *mm, const char *what, int i, char *err)
{
    if (!(mm->norm_eps >= 0 && mm->norm_eps <= MODEL_MAX_NORM_EPS))
        return BAD("%s: modules[%d].norm_eps: must be in [0, %g] (0: the norm's default)", what, i, MODEL_MAX_NORM_EPS);
    if (!mm->name[0]) return BAD("%s: modules[%d].name: must not be empty", what, i);
    /* module names become file names (checkpoints: DIR/step-N/<module>.safetensors) */
    if (!util_name_ok(mm->name))
        return BAD("%s: modules[%d].name: '%s' must be letters, digits, '.', '_' or '-' (not first '.' or '-')",
                   what, i, mm->name);
    if ((unsigned)mm->kind > MODEL_LLM) return BAD("%s: modules[%d].kind: unknown kind %d", what, i, (int)mm->kind);
    if ((unsigned)mm->ffn_kind > MODEL_FFN_QUICK_GELU) return BAD("%s: modules[%d].ffn_kind: unknown", what, i);
    if ((unsigned)mm->norm > MODEL_NORM_RMSNORM) return BAD("%s: modules[%d].norm: unknown", what, i);
    const char *keys[] = {"layers", "hidden", "heads", "kv_heads", "head_dim", "ffn"};
    const int vals[] = {mm->layers, mm->hidden, mm->heads, mm->kv_heads, mm->head_dim, mm->ffn};
    for (int k = 0; k < 6; k++)
        if (check_positive(what, i, keys[k], vals[k], err)) return UTIL_EINVAL;
    if (check_at_most(what, i, "layers", mm->layers, MODEL_MAX_LAYERS, err)) return UTIL_EINVAL;
    if (check_at_least(what, i, "extra_params", mm->extra_params, 0, err)) return UTIL_EINVAL;
    const char *wkeys[] = {"hidden", "ffn", "heads", "head_dim", "vocab", "vocab_extra", "max_positions", "window",
                           "image_size", "proj_in", "proj_hidden", "out_hidden", "proj_norm_width"};
    const int wvals[] = {mm->hidden, mm->ffn, mm->heads, mm->head_dim, mm->vocab, mm->vocab_extra,
                         mm->max_positions, mm->window, mm->image_size, mm->proj_in, mm->proj_hidden,
                         mm->out_hidden, mm->proj_norm_width};
    for (int k = 0; k < 13; k++)
        if (check_at_most(what, i, wkeys[k], wvals[k], MODEL_MAX_WIDTH, err)) return UTIL_EINVAL;
    const char *fkeys[] = {"in_channels", "patch", "temporal_patch", "merge", "pool", "max_tiles", "aspect_ratios"};
    const int fvals[] = {mm->in_channels, mm->patch, mm->temporal_patch, mm->merge, mm->pool, mm->max_tiles,
                         mm->aspect_ratios};
    for (int k = 0; k < 7; k++)
        if (check_at_most(what, i, fkeys[k], fvals[k], MODEL_MAX_FACTOR, err)) return UTIL_EINVAL;
    if ((int64_t)mm->heads * mm->head_dim > MODEL_MAX_WIDTH)
        return BAD("%s: modules[%d].head_dim: heads*head_dim = %lld exceeds the limit %d", what, i,
                   (long long)mm->heads * mm->head_dim, MODEL_MAX_WIDTH);
    if (mm->heads % mm->kv_heads)
        return BAD("%s: modules[%d].kv_heads: %d does not divide heads %d", what, i, mm->kv_heads, mm->heads);
    return UTIL_OK;
}

static int validate_encoder(const model_t *m, const model_module *mm, const char *what, int i, char *err)
{
    const char *keys[] = {"in_channels", "patch", "proj_in", "out_hidden", "temporal_patch", "merge", "pool"};
    const int vals[] = {mm->in_channels, mm->patch, mm->proj_in, mm->out_hidden, mm->temporal_patch,
                        mm->merge, mm->pool};
    for (int k = 0; k < 7; k++)
        if (check_positive(what, i, keys[k], vals[k], err)) return UTIL_EINVAL;
    const char *zkeys[] = {"image_size", "max_positions", "window", "proj_hidden", "gated_layers", "max_tiles",
                           "aspect_ratios"};
    const int zvals[] = {mm->image_size, mm->max_positions, mm->window, mm->proj_hidden, mm->gated_layers,
                         mm->max_tiles, mm->aspect_ratios};
    for (int k = 0; k < 7; k++)
        if (check_at_least(what, i, zkeys[k], zvals[k], 0, err)) return UTIL_EINVAL;
    if (mm->proj_norm && check_positive(what, i, "proj_norm_width", mm->proj_norm_width, err)) return UTIL_EINVAL;
    if ((unsigned)mm->proj_norm_kind > MODEL_NORM_RMSNORM) return BAD("%s: modules[%d].proj_norm_kind: unknown", what, i);
    if (mm->gated_layers > mm->layers)
        return BAD("%s: modules[%d].gated_layers: %d exceeds layers %d", what, i, mm->gated_layers, mm->layers);
    if (check_at_least(what, i, "unused_layers", mm->unused_layers, 0, err) ||
        check_at_most(what, i, "unused_layers", mm->unused_layers, MODEL_MAX_LAYERS, err))
        return UTIL_EINVAL;
    if (mm->unused_layers > 0 && mm->kind != MODEL_VISION)
        return BAD("%s: modules[%d].unused_layers: a vision tower's field (LLaVA's vision_feature_layer)", what, i);
    if (mm->max_tiles > 0 && (mm->aspect_ratios <= 0 || mm->max_positions <= 0))
        return BAD("%s: modules[%d].max_tiles: tile embeddings need aspect_ratios > 0 and max_positions > 0", what, i);
    int64_t merged = (int64_t)mm->hidden * mm->merge * mm->merge;
    if (mm->proj_in % merged)
        return BAD("%s: modules[%d].proj_in: %d is not a multiple of hidden*merge^2 = %lld", what, i, mm->proj_in,
                   (long long)merged);
    if (mm->window == 0 && mm->n_full_layers > 0)
        return BAD("%s: modules[%d].full_layers: given but window is 0 (every layer is full attention)", what, i);
    if (check_layer_list(what, i, "full_layers", mm->full_layers, mm->n_full_layers, mm->layers, err))
        return UTIL_EINVAL;
    if (mm->n_cross_layers)
        return BAD("%s: modules[%d].cross_layers: only the llm has cross-attention layers", what, i);
    if (mm->feeds != m->llm)
        return BAD("%s: modules[%d].feeds: must name the llm module '%s'", what, i, m->mod[m->llm].name);
    const model_module *llm = &m->mod[m->llm];
    if (mm->out_hidden != llm->hidden)
        return BAD("%s: modules[%d].out_hidden: %d differs from llm hidden %d", what, i, mm->out_hidden, llm->hidden);
    return UTIL_OK;
}

static int validate_llm(const model_module *mm, const char *what, int i, char *err)
{
    if (check_positive(what, i, "vocab", mm->vocab, err)) return UTIL_EINVAL;
    if (check_at_least(what, i, "vocab_extra", mm->vocab_extra, 0, err)) return UTIL_EINVAL;
    if (mm->feeds != -1) return BAD("%s: modules[%d].feeds: the llm feeds no module", what, i);
    if (mm->n_full_layers || mm->window)
        return BAD("%s: modules[%d].window: window attention is an encoder field", what, i);
    if (mm->gated_layers) return BAD("%s: modules[%d].gated_layers: an encoder field", what, i);
    if (check_layer_list(what, i, "cross_layers", mm->cross_layers, mm->n_cross_layers, mm->layers, err))
        return UTIL_EINVAL;
    if (mm->n_cross_layers >= mm->layers)
        return BAD("%s: modules[%d].cross_layers: every layer is cross-attention, none self-attention", what, i);
    if (check_positive(what, i, "rope_theta", mm->rope_theta, err)) return UTIL_EINVAL;
    int pairs = 0;
    for (int j = 0; j < mm->n_mrope; j++) pairs += mm->mrope_section[j] >= 0 ? mm->mrope_section[j] : -(1 << 20);
    if (mm->n_mrope && (mm->n_mrope != 3 || pairs != mm->head_dim / 2))
        return BAD("%s: modules[%d].mrope_section: must be 3 non-negative counts (t, h, w) summing to head_dim / 2 = %d",
                   what, i, mm->head_dim / 2);
    return UTIL_OK;
}

int model_validate_as(const model_t *m, const char *what, char *err)
{
    if (!m->name[0]) return BAD("%s: name: must not be empty", what);
    if (!util_text_ok(m->name) || !util_text_ok(m->source) || !util_text_ok(m->published_source))
        return BAD("%s: name, source and published_source must be printable UTF-8 text", what);
    if (m->n_modules < 1 || m->n_modules > MODEL_MAX_MODULES)
        return BAD("%s: modules: %d modules, need 1..%d", what, m->n_modules, MODEL_MAX_MODULES);
    int llms = 0;
    for (int i = 0; i < m->n_modules; i++) llms += m->mod[i].kind == MODEL_LLM;
    if (llms != 1) return BAD("%s: modules: %d llm modules, need exactly one", what, llms);
    if (m->llm < 0 || m->llm >= m->n_modules || m->mod[m->llm].kind != MODEL_LLM)
        return BAD("%s: llm: index %d is not the llm module", what, m->llm);
    for (int i = 0; i < m->n_modules; i++) {
        const model_module *mm = &m->mod[i];
        if (validate_common(mm, what, i, err)) return UTIL_EINVAL;
        for (int j = 0; j < i; j++)
            if (strcmp(m->mod[j].name, mm->name) == 0)
                return BAD("%s: modules[%d].name: '%s' repeats modules[%d]", what, i, mm->name, j);
        int rc = mm->kind == MODEL_LLM ? validate_llm(mm, what, i, err) : validate_encoder(m, mm, what, i, err);
        if (rc) return rc;
    }
    int rows = m->mod[m->llm].vocab + m->mod[m->llm].vocab_extra;
    for (int t = 0; t < MODEL_NTOKENS; t++)
        if (m->tokens[t] >= rows)
            return BAD("%s: tokens.%s: %d is outside the llm's %d embedding rows", what, token_names[t], m->tokens[t], rows);
    return UTIL_OK;
}

int model_validate(const model_t *m, char *err)
{
    return model_validate_as(m, m->name[0] ? m->name : "model", err);
}

/* ---- serialisation ---- */

static void add_int_list(cJSON *obj, const char *key, const int *list, int n)
{
    cJSON *arr = cJSON_AddArrayToObject(obj, key);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(list[i]));
}

static cJSON *module_to_json(const model_t *m, const model_module *mm)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", mm->name);
    cJSON_AddStringToObject(o, "kind", model_kind_name(mm->kind));
    cJSON_AddStringToObject(o, "ffn_kind", model_ffn_kind_name(mm->ffn_kind));
    cJSON_AddStringToObject(o, "norm", model_norm_kind_name(mm->norm));
    for (int i = 0; i < N_FIELDS; i++) {
        const field_desc *f = &fields[i];
        if (!group_applies(f->group, mm->kind)) continue;
        if (f->type == F_INT) cJSON_AddNumberToObject(o, f->key, int_of(mm, f));
        else if (f->type == F_BOOL) cJSON_AddBoolToObject(o, f->key, bool_of(mm, f));
        else if (f->type == F_EPS) { if (mm->norm_eps > 0) cJSON_AddNumberToObject(o, f->key, mm->norm_eps); }
        else cJSON_AddStringToObject(o, f->key, model_norm_kind_name(norm_of(mm, f)));
    }
    if (mm->kind == MODEL_LLM) {
        add_int_list(o, "cross_layers", mm->cross_layers, mm->n_cross_layers);
        if (mm->n_mrope) add_int_list(o, "mrope_section", mm->mrope_section, mm->n_mrope);
    } else {
        add_int_list(o, "full_layers", mm->full_layers, mm->n_full_layers);
        if (mm->feeds >= 0 && mm->feeds < m->n_modules) cJSON_AddStringToObject(o, "feeds", m->mod[mm->feeds].name);
    }
    return o;
}

cJSON *model_to_json(const model_t *m)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "schema", MODEL_SCHEMA);
    cJSON_AddStringToObject(root, "name", m->name);
    cJSON_AddStringToObject(root, "source", m->source);
    cJSON_AddNumberToObject(root, "published_params", (double)m->published_params);
    if (m->published_source[0]) cJSON_AddStringToObject(root, "published_source", m->published_source);
    cJSON *tok = NULL;
    for (int t = 0; t < MODEL_NTOKENS; t++)
        if (m->tokens[t] >= 0) {
            if (!tok) tok = cJSON_AddObjectToObject(root, "tokens");
            cJSON_AddNumberToObject(tok, token_names[t], m->tokens[t]);
        }
    cJSON *mods = cJSON_AddArrayToObject(root, "modules");
    for (int i = 0; i < m->n_modules; i++) cJSON_AddItemToArray(mods, module_to_json(m, &m->mod[i]));
    return root;
}

/* ---- zoo and look-up ---- */

#define ZOO_PREFIX "models/zoo/"
#define ZOO_MAX 64
static char zoo_names[ZOO_MAX][MODEL_NAME_LEN];
static int zoo_n = -1;

static void zoo_scan(void)
{
    if (zoo_n >= 0) return;
    zoo_n = 0;
    size_t pre = strlen(ZOO_PREFIX);
    for (int i = 0; i < util_embedded_count() && zoo_n < ZOO_MAX; i++) {
        const char *p = util_embedded_at(i)->path;
        size_t len = strlen(p);
        if (strncmp(p, ZOO_PREFIX, pre) != 0 || len < pre + 6 || strcmp(p + len - 5, ".json") != 0) continue;
        size_t n = len - pre - 5;
        if (n >= MODEL_NAME_LEN || memchr(p + pre, '/', n)) continue;
        memcpy(zoo_names[zoo_n], p + pre, n);
        zoo_names[zoo_n][n] = '\0';
        zoo_n++;
    }
}

int model_zoo_count(void)
{
    zoo_scan();
    return zoo_n;
}

const char *model_zoo_name(int i)
{
    zoo_scan();
    return i >= 0 && i < zoo_n ? zoo_names[i] : NULL;
}

static int not_found(const char *name, char *err)
{
    char list[300] = "";
    for (int i = 0; i < model_zoo_count(); i++) {
        if (strlen(list) + strlen(model_zoo_name(i)) + 3 >= sizeof list) { strcat(list, ", ..."); break; }
        if (i) strcat(list, ", ");
        strcat(list, model_zoo_name(i));
    }
    return util_fail(err, UTIL_ENOTFOUND, "model '%s': no such file and not a zoo model (zoo: %s)", name, list);
}

static bool looks_like_path(const char *s)
{
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 5 && strcmp(s + n - 5, ".json") == 0);
}

int model_load(const char *name_or_path, model_t *m, char *err)
{
    if (!name_or_path || !*name_or_path) return util_fail(err, UTIL_EINVAL, "model: empty name");
    if (model_hub_is_ref(name_or_path)) return model_hub_load(name_or_path, m, err);
    if (!looks_like_path(name_or_path)) {
        char path[MODEL_NAME_LEN + 32];
        if (strlen(name_or_path) < MODEL_NAME_LEN) {
            snprintf(path, sizeof path, ZOO_PREFIX "%s.json", name_or_path);
            const util_embedded_file *f = util_embedded_find(path);
            if (f) return model_parse_json((const char *)f->data, path, m, err);
        }
        struct stat st;
        if (stat(name_or_path, &st) != 0) return not_found(name_or_path, err);
    }
    char *text;
    int rc = util_read_text_file(name_or_path, UTIL_JSON_MAX_BYTES, &text, NULL, err);
    if (rc) return rc;
    rc = model_parse_json(text, name_or_path, m, err);
    util_free(text);
    return rc;
}

int model_find(const model_t *m, const char *module_name)
{
    for (int i = 0; i < m->n_modules; i++)
        if (strcmp(m->mod[i].name, module_name) == 0) return i;
    return -1;
}

bool model_trains(const model_module *mm) { return !mm->frozen; }

bool model_runs_backward(const model_module *mm) { return model_trains(mm) || mm->kind == MODEL_LLM; }

int model_find_kind(const model_t *m, model_kind kind)
{
    for (int i = 0; i < m->n_modules; i++)
        if (m->mod[i].kind == kind) return i;
    return -1;
}
