/* costdb loading: the shipped files, the field getters, and GPU files
 * (dhp.gpu/1): validation and serialisation (cluster files: load_cluster.c).
 * Field formats are described in costdb/SCHEMA.md. */
#include "costdb/load_int.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPU_DIR "costdb/gpus/"
#define CLUSTER_DIR "costdb/clusters/"
#define MAX_SHIPPED 64
#define GPU_SCHEMA "dhp.gpu/1"

/* ---- names of the shipped (embedded) files ---- */

typedef struct {
    int n;
    char name[MAX_SHIPPED][COST_NAME_LEN];
    const util_embedded_file *file[MAX_SHIPPED];
} shipped_list;

static shipped_list gpus_shipped, presets_shipped;
static pthread_once_t shipped_once = PTHREAD_ONCE_INIT;

static void collect(shipped_list *l, const char *dir)
{
    size_t dl = strlen(dir);
    for (int i = 0; i < util_embedded_count() && l->n < MAX_SHIPPED; i++) {
        const util_embedded_file *f = util_embedded_at(i);
        size_t pl = strlen(f->path);
        if (strncmp(f->path, dir, dl) != 0 || pl < dl + 6 || strcmp(f->path + pl - 5, ".json") != 0)
            continue;
        size_t nl = pl - dl - 5;
        if (nl >= COST_NAME_LEN || memchr(f->path + dl, '/', nl)) continue;
        memcpy(l->name[l->n], f->path + dl, nl);
        l->name[l->n][nl] = '\0';
        l->file[l->n] = f;
        l->n++;
    }
}

static void collect_all(void)
{
    collect(&gpus_shipped, GPU_DIR);
    collect(&presets_shipped, CLUSTER_DIR);
}

static const shipped_list *shipped(const shipped_list *l)
{
    pthread_once(&shipped_once, collect_all);
    return l;
}

static const util_embedded_file *shipped_find(const shipped_list *l, const char *name, int *idx)
{
    for (int i = 0; i < l->n; i++)
        if (util_streq_nocase(l->name[i], name)) {
            if (idx) *idx = i;
            return l->file[i];
        }
    return NULL;
}

static void known_names(const shipped_list *l, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < l->n && used + 1 < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", l->name[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
}

const util_embedded_file *cost_preset_file(const char *name) { return shipped_find(shipped(&presets_shipped), name, NULL); }
void cost_preset_names(char *buf, size_t n) { known_names(shipped(&presets_shipped), buf, n); }

int cost_gpu_count(void) { return shipped(&gpus_shipped)->n; }
int cost_preset_count(void) { return shipped(&presets_shipped)->n; }

const char *cost_gpu_name(int i)
{
    const shipped_list *l = shipped(&gpus_shipped);
    return (i >= 0 && i < l->n) ? l->name[i] : NULL;
}

const char *cost_preset_name(int i)
{
    const shipped_list *l = shipped(&presets_shipped);
    return (i >= 0 && i < l->n) ? l->name[i] : NULL;
}

/* ---- field getters: errors read "<what>: <field path>: <problem>" ---- */

void cost_field_path(char *out, size_t n, const char *path, const char *key)
{
    /* Over-long paths are cut; using the result keeps -Wformat-truncation quiet. */
    if (snprintf(out, n, "%s%s%s", path, path[0] ? "." : "", key) < 0) out[0] = '\0';
}

int cost_get_num(const cJSON *obj, const char *what, const char *path, const char *key,
                 double *out, char *err)
{
    char fp[UTIL_ERR_LEN / 2];
    cost_field_path(fp, sizeof fp, path, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return util_fail(err, UTIL_EINVAL, "%s: %s: required field is missing", what, fp);
    if (!cJSON_IsNumber(v)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be a number", what, fp);
    *out = v->valuedouble;
    return UTIL_OK;
}

int cost_get_int(const cJSON *obj, const char *what, const char *path, const char *key,
                 int *out, char *err)
{
    double d;
    int rc = cost_get_num(obj, what, path, key, &d, err);
    if (rc) return rc;
    char fp[UTIL_ERR_LEN / 2];
    cost_field_path(fp, sizeof fp, path, key);
    if (d != floor(d) || fabs(d) > 2147483647.0)
        return util_fail(err, UTIL_EINVAL, "%s: %s: must be an integer (got %g)", what, fp, d);
    *out = (int)d;
    return UTIL_OK;
}

int cost_get_str(const cJSON *obj, const char *what, const char *path, const char *key,
                 char *out, size_t n, char *err)
{
    char fp[UTIL_ERR_LEN / 2];
    cost_field_path(fp, sizeof fp, path, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return util_fail(err, UTIL_EINVAL, "%s: %s: required field is missing", what, fp);
    if (!cJSON_IsString(v)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be a string", what, fp);
    if (strlen(v->valuestring) >= n)
        return util_fail(err, UTIL_EINVAL, "%s: %s: longer than %zu characters", what, fp, n - 1);
    if (!util_text_ok(v->valuestring))
        return util_fail(err, UTIL_EINVAL, "%s: %s: control characters are not allowed", what, fp);
    util_strlcpy(out, v->valuestring, n);
    return UTIL_OK;
}

int cost_check_schema(const cJSON *obj, const char *what, const char *path, const char *want,
                      bool required, char *err)
{
    if (!required && !cJSON_GetObjectItemCaseSensitive(obj, "schema")) return UTIL_OK;
    char schema[32], fp[UTIL_ERR_LEN / 2];
    int rc = cost_get_str(obj, what, path, "schema", schema, sizeof schema, err);
    if (rc) return rc;
    cost_field_path(fp, sizeof fp, path, "schema");
    if (strcmp(schema, want) != 0)
        return util_fail(err, UTIL_EINVAL, "%s: %s: expected \"%s\" (got \"%s\")", what, fp, want, schema);
    return UTIL_OK;
}

int cost_check_source(const cJSON *obj, const char *what, const char *path, char *err)
{
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(obj, "source");
    if (src && !cJSON_IsString(src))
        return util_fail(err, UTIL_EINVAL, "%s: %s.source: must be a string", what, path);
    return UTIL_OK;
}

int cost_check_range(const char *what, const char *path, const char *key, double v, double lo,
                     bool lo_open, double hi, char *err)
{
    char fp[UTIL_ERR_LEN / 2];
    cost_field_path(fp, sizeof fp, path, key);
    if (!isfinite(v) || (lo_open ? v <= lo : v < lo))
        return util_fail(err, UTIL_EINVAL, "%s: %s: must be %s %g (got %g)", what, fp,
                         lo_open ? ">" : ">=", lo, v);
    if (v > hi) return util_fail(err, UTIL_EINVAL, "%s: %s: must be <= %g (got %g)", what, fp, hi, v);
    return UTIL_OK;
}

/* ---- GPU descriptions ---- */

/* A GPU field is either a plain number or {"value": number, "source": string}. */
int cost_gpu_field(const cJSON *obj, const char *what, const char *path, const char *key,
                   double *out, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsObject(v)) return cost_get_num(obj, what, path, key, out, err);
    char sub[UTIL_ERR_LEN / 2];
    cost_field_path(sub, sizeof sub, path, key);
    int rc = cost_check_source(v, what, sub, err);
    if (rc) return rc;
    return cost_get_num(v, what, sub, "value", out, err);
}

/* A measured attention's terms (cost_attn_terms), if any: seconds in [0, 1],
 * and a time that grows with the scores, forward and backward. */
static int validate_attn_terms(const cost_attn_terms *t, const char *what, const char *path, const char *key, char *err)
{
    if (!t->measured) return UTIL_OK;
    char sub[UTIL_ERR_LEN / 2];
    cost_field_path(sub, sizeof sub, path, key);
    const struct { const char *key; double v; } f[] = {{"flop_s", t->flop_s}, {"score_s", t->score_s},
        {"bwd_score_s", t->bwd_score_s}, {"row_s", t->row_s}, {"bwd_row_s", t->bwd_row_s}};
    int rc;
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if ((rc = cost_check_range(what, sub, f[i].key, f[i].v, 0, false, 1, err))) return rc;
    if (!(t->flop_s > 0) && !(t->score_s > 0 && t->bwd_score_s > 0))
        return util_fail(err, UTIL_EINVAL, "%s: %s: flop_s and score_s (or bwd_score_s) are both 0: the attention "
                         "would cost nothing per score", what, sub);
    return UTIL_OK;
}

int cost_validate_gpu(const cost_gpu *g, const char *what, const char *path, char *err)
{
    int rc;
    if (!g->name[0]) {
        char fp[UTIL_ERR_LEN / 2];
        cost_field_path(fp, sizeof fp, path, "name");
        return util_fail(err, UTIL_EINVAL, "%s: %s: must not be empty", what, fp);
    }
    if ((rc = cost_check_range(what, path, "peak_flops", g->peak_flops, 0, true, HUGE_VAL, err))) return rc;
    if ((rc = cost_check_range(what, path, "peak_flops_fp32", g->peak_flops_fp32, 0, false, HUGE_VAL, err))) return rc;
    if ((rc = cost_check_range(what, path, "peak_flops_tf32", g->peak_flops_tf32, 0, false, HUGE_VAL, err))) return rc;
    if ((rc = cost_check_range(what, path, "peak_flops_fp8", g->peak_flops_fp8, 0, false, HUGE_VAL, err))) return rc;
    if ((rc = cost_check_range(what, path, "gemm_eff_max_fp8", g->gemm_eff_max_fp8, 0, false, 1, err))) return rc;
    if ((g->peak_flops_fp8 > 0) != (g->gemm_eff_max_fp8 > 0))
        return util_fail(err, UTIL_EINVAL, "%s: %s: peak_flops_fp8 and gemm_eff_max_fp8 go together (one prices FP8 "
                         "GEMMs without the other)", what, path);
    if ((rc = cost_check_range(what, path, "gemm_eff_max", g->gemm_eff_max, 0, true, 1, err))) return rc;
    if ((rc = cost_check_range(what, path, "gemm_half", g->gemm_half, 0, false, HUGE_VAL, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_eff", g->attn_eff, 0, true, 1, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_score_s", g->attn_score_s, 0, false, 1, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_bwd_score_s", g->attn_bwd_score_s, 0, false, 1, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_row_s", g->attn_row_s, 0, false, 1, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_bwd_row_s", g->attn_bwd_row_s, 0, false, 1, err))) return rc;
    if ((rc = cost_check_range(what, path, "hbm_bytes", g->hbm_bytes, 0, true, HUGE_VAL, err))) return rc;
    if ((rc = cost_check_range(what, path, "hbm_bw", g->hbm_bw, 0, true, HUGE_VAL, err))) return rc;
    if ((rc = cost_check_range(what, path, "mem_eff", g->mem_eff, 0, true, 1, err))) return rc;
    if ((rc = cost_check_range(what, path, "reserved_bytes", g->reserved_bytes, 0, false, HUGE_VAL, err))) return rc;
    if (g->reserved_bytes >= g->hbm_bytes) {
        char fp[UTIL_ERR_LEN / 2];
        cost_field_path(fp, sizeof fp, path, "reserved_bytes");
        return util_fail(err, UTIL_EINVAL, "%s: %s: %g leaves nothing of hbm_bytes %g", what, fp,
                         g->reserved_bytes, g->hbm_bytes);
    }
    if ((rc = cost_check_range(what, path, "reserved_workspace_bytes", g->reserved_workspace_bytes, 0, false,
                               g->reserved_bytes, err))) return rc;
    if ((rc = cost_check_range(what, path, "sm_count", g->sm_count, 0, false, 1e6, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_hd_half", g->attn_hd_half, 0, false, 1e6, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_row_scores", g->attn_row_scores, 0, false, 1e6, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_bwd_eff", g->attn_bwd_eff, 0, false, 1, err))) return rc;
    if ((rc = cost_check_range(what, path, "gemm_sustained", g->gemm_sustained, 0, false, 1, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_bwd_row_scores", g->attn_bwd_row_scores, 0, false, 1e6, err))) return rc;
    if ((rc = cost_check_range(what, path, "attn_cudnn_speedup", g->attn_cudnn_speedup, 0, false, 10, err))) return rc;
    if ((rc = validate_attn_terms(&g->attn_bf16, what, path, "attn_bf16", err))) return rc;
    if (g->gemm_bf16.measured) {
        char sub[UTIL_ERR_LEN / 2];
        cost_field_path(sub, sizeof sub, path, "gemm_bf16");
        if ((rc = cost_check_range(what, sub, "peak_flops", g->gemm_bf16.peak_flops, 0, true, HUGE_VAL, err))) return rc;
    }
    return cost_check_range(what, path, "kernel_launch_s", g->kernel_launch_s, 0, false, 1, err);
}

int cost_gpu_validate(const cost_gpu *g, const char *ctx, char *err)
{
    return cost_validate_gpu(g, ctx ? ctx : g->name, "", err);
}

/* An array of lo .. hi positive ascending sizes at sub.key (a GEMM grid's axis, an element-wise table's sizes). */
static int size_axis(const cJSON *obj, const char *what, const char *sub, const char *key, int lo, int hi, double *a,
                     int *n, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    int len = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (len < lo || len > hi)
        return util_fail(err, UTIL_EINVAL, "%s: %s.%s: must be an array of %d to %d sizes", what, sub, key, lo, hi);
    for (int i = 0; i < len; i++) {
        const cJSON *x = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || !(x->valuedouble > 0) || (i && !(x->valuedouble > a[i - 1])))
            return util_fail(err, UTIL_EINVAL, "%s: %s.%s[%d]: sizes must be positive and ascending", what, sub, key, i);
        a[i] = x->valuedouble;
    }
    *n = len;
    return UTIL_OK;
}

/* An optional measured table obj.key: *v NULL when absent; else an object
 * whose "source", if any, is a string; sub receives its path for messages. */
static int optional_table(const cJSON *obj, const char *what, const char *path, const char *key, const cJSON **v,
                          char *sub, size_t sub_len, char *err)
{
    *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!*v) return UTIL_OK;
    cost_field_path(sub, sub_len, path, key);
    if (!cJSON_IsObject(*v)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be an object", what, sub);
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(*v, "source");
    if (src && !cJSON_IsString(src)) return util_fail(err, UTIL_EINVAL, "%s: %s.source: must be a string", what, sub);
    return UTIL_OK;
}

/* A grid's {"m": [...], "n": [...], "k": [...], "eff": [n_m x n_n x n_k, k
 * fastest]} in v, at sub (cost_gemm_grid). */
static int parse_grid_fields(const cJSON *v, const char *what, const char *sub, cost_gemm_grid *G, char *err)
{
    int rc;
    if ((rc = size_axis(v, what, sub, "m", 2, COST_GEMM_GRID, G->m, &G->n_m, err))
        || (rc = size_axis(v, what, sub, "n", 2, COST_GEMM_GRID, G->n, &G->n_n, err))
        || (rc = size_axis(v, what, sub, "k", 2, COST_GEMM_GRID, G->k, &G->n_k, err))) {
        G->n_m = 0;
        return rc;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(v, "eff");
    int want = G->n_m * G->n_n * G->n_k;
    if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != want) {
        rc = util_fail(err, UTIL_EINVAL, "%s: %s.eff: must be an array of %d x %d x %d = %d efficiencies", what, sub,
                       G->n_m, G->n_n, G->n_k, want);
        G->n_m = 0;
        return rc;
    }
    for (int i = 0; i < want; i++) {
        const cJSON *x = cJSON_GetArrayItem(e, i);
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || !(x->valuedouble > 0) || x->valuedouble > 1) {
            G->n_m = 0;
            return util_fail(err, UTIL_EINVAL, "%s: %s.eff[%d]: must be a number in (0, 1]", what, sub, i);
        }
        G->eff[i] = x->valuedouble;
    }
    return UTIL_OK;
}

/* Optional "gemm_grid": the grid's fields and "source" (cost_gemm_grid). */
static int parse_gemm_grid(const cJSON *obj, const char *what, const char *path, cost_gemm_grid *G, char *err)
{
    const cJSON *v;
    char sub[UTIL_ERR_LEN / 2];
    int rc = optional_table(obj, what, path, "gemm_grid", &v, sub, sizeof sub, err);
    if (rc || !v) return rc;
    return parse_grid_fields(v, what, sub, G, err);
}

/* Optional "gemm_bf16": {"peak_flops", the grid's fields, "source"} (cost_gemm_terms), all or none. */
static int parse_gemm_bf16(const cJSON *obj, const char *what, const char *path, cost_gemm_terms *t, char *err)
{
    const cJSON *v;
    char sub[UTIL_ERR_LEN / 2];
    int rc = optional_table(obj, what, path, "gemm_bf16", &v, sub, sizeof sub, err);
    if (rc || !v) return rc;
    if ((rc = cost_get_num(v, what, sub, "peak_flops", &t->peak_flops, err))
        || (rc = parse_grid_fields(v, what, sub, &t->grid, err))) return rc;
    t->measured = true;
    return UTIL_OK;
}

/* Optional "elementwise": {"elements": [n0, n1], "<kernel>": [B/s at n0, at n1], ...,
 * "source": "..."} (cost_ew_table); kernels absent are priced at hbm_bw x mem_eff. */
static int parse_ew_table(const cJSON *obj, const char *what, const char *path, cost_ew_table *T, char *err)
{
    const cJSON *v;
    char sub[UTIL_ERR_LEN / 2];
    int n, rc = optional_table(obj, what, path, "elementwise", &v, sub, sizeof sub, err);
    if (rc || !v) return rc;
    if ((rc = size_axis(v, what, sub, "elements", 1, COST_EW_SIZES, T->elements, &n, err))) return rc;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!strcmp(it->string, "elements") || !strcmp(it->string, "source")) continue;
        int k = 0;
        while (k < COST_N_EW && strcmp(it->string, cost_ew_name((cost_ew)k))) k++;
        if (k == COST_N_EW) return util_fail(err, UTIL_EINVAL, "%s: %s.%s: not an element-wise kernel", what, sub, it->string);
        if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != n)
            return util_fail(err, UTIL_EINVAL, "%s: %s.%s: must be an array of %d rates", what, sub, it->string, n);
        for (int i = 0; i < n; i++) {
            const cJSON *x = cJSON_GetArrayItem(it, i);
            if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || !(x->valuedouble > 0))
                return util_fail(err, UTIL_EINVAL, "%s: %s.%s[%d]: must be a positive rate (B/s)", what, sub, it->string, i);
            T->bw[k][i] = x->valuedouble;
        }
    }
    T->n = n;
    return UTIL_OK;
}

/* Optional "attn_bf16": {"flop_s", "score_s", "bwd_score_s", "row_s", "bwd_row_s",
 * "source"} (cost_attn_terms), all five or none. */
static int parse_attn_bf16(const cJSON *obj, const char *what, const char *path, cost_attn_terms *t, char *err)
{
    const cJSON *v;
    char sub[UTIL_ERR_LEN / 2];
    int rc = optional_table(obj, what, path, "attn_bf16", &v, sub, sizeof sub, err);
    if (rc || !v) return rc;
    struct { const char *key; double *dst; } f[] = {{"flop_s", &t->flop_s}, {"score_s", &t->score_s},
        {"bwd_score_s", &t->bwd_score_s}, {"row_s", &t->row_s}, {"bwd_row_s", &t->bwd_row_s}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if ((rc = cost_get_num(v, what, sub, f[i].key, f[i].dst, err))) return rc;
    t->measured = true;
    return UTIL_OK;
}

int cost_parse_gpu_obj(const cJSON *obj, const char *what, const char *path, bool need_schema,
                       cost_gpu *g, char *err)
{
    if (!cJSON_IsObject(obj))
        return util_fail(err, UTIL_EINVAL, "%s: %s: must be an object", what, path[0] ? path : "(top level)");
    int rc = cost_check_schema(obj, what, path, GPU_SCHEMA, need_schema, err);
    if (rc) return rc;
    memset(g, 0, sizeof *g);
    if ((rc = cost_get_str(obj, what, path, "name", g->name, sizeof g->name, err))) return rc;
    struct { const char *key; double *dst; } f[] = {
        {"peak_flops", &g->peak_flops}, {"gemm_eff_max", &g->gemm_eff_max},
        {"gemm_half", &g->gemm_half}, {"attn_eff", &g->attn_eff},
        {"hbm_bytes", &g->hbm_bytes}, {"hbm_bw", &g->hbm_bw}, {"mem_eff", &g->mem_eff},
        {"reserved_bytes", &g->reserved_bytes}, {"kernel_launch_s", &g->kernel_launch_s},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if ((rc = cost_gpu_field(obj, what, path, f[i].key, f[i].dst, err))) return rc;
    struct { const char *key; double *dst; } optional[] = {
        {"attn_score_s", &g->attn_score_s}, {"attn_bwd_score_s", &g->attn_bwd_score_s},
        {"attn_row_s", &g->attn_row_s}, {"attn_bwd_row_s", &g->attn_bwd_row_s},
        {"sm_count", &g->sm_count}, {"attn_hd_half", &g->attn_hd_half},
        {"attn_row_scores", &g->attn_row_scores}, {"attn_bwd_eff", &g->attn_bwd_eff},
        {"attn_bwd_row_scores", &g->attn_bwd_row_scores}, {"gemm_sustained", &g->gemm_sustained},
        {"attn_cudnn_speedup", &g->attn_cudnn_speedup},
        {"peak_flops_fp32", &g->peak_flops_fp32}, {"peak_flops_tf32", &g->peak_flops_tf32},
        {"peak_flops_fp8", &g->peak_flops_fp8}, {"gemm_eff_max_fp8", &g->gemm_eff_max_fp8},
        {"reserved_workspace_bytes", &g->reserved_workspace_bytes},
    };
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(obj, optional[i].key)
            && (rc = cost_gpu_field(obj, what, path, optional[i].key, optional[i].dst, err))) return rc;
    if ((rc = parse_gemm_grid(obj, what, path, &g->grid, err))) return rc;
    if ((rc = parse_ew_table(obj, what, path, &g->ew, err))) return rc;
    if ((rc = parse_attn_bf16(obj, what, path, &g->attn_bf16, err))) return rc;
    if ((rc = parse_gemm_bf16(obj, what, path, &g->gemm_bf16, err))) return rc;
    return cost_validate_gpu(g, what, path, err);
}

int cost_gpu_parse_json(const char *text, const char *what, cost_gpu *g, char *err)
{
    cJSON *root;
    int rc = util_json_parse(text, what, &root, err);
    if (rc) return rc;
    rc = cost_parse_gpu_obj(root, what, "", true, g, err);
    cJSON_Delete(root);
    return rc;
}

/* Embedded data is not NUL-terminated by contract; copy it before parsing. */
char *cost_embedded_text(const util_embedded_file *f, char *err)
{
    char *t = util_malloc(f->len + 1);
    if (!t) { util_fail(err, UTIL_ENOMEM, "%s: out of memory", f->path); return NULL; }
    memcpy(t, f->data, f->len);
    t[f->len] = '\0';
    return t;
}

int cost_gpu_load(const char *name, cost_gpu *g, char *err)
{
    const shipped_list *l = shipped(&gpus_shipped);
    const util_embedded_file *f = name ? shipped_find(l, name, NULL) : NULL;
    if (!f) {
        char known[UTIL_ERR_LEN / 2];
        known_names(l, known, sizeof known);
        return util_fail(err, UTIL_ENOTFOUND, "unknown GPU '%s' (known: %s)", name ? name : "(null)", known);
    }
    char *text = cost_embedded_text(f, err);
    if (!text) return UTIL_ENOMEM;
    int rc = cost_gpu_parse_json(text, f->path, g, err);
    util_free(text);
    return rc;
}

/* G's axes and efficiencies, and source unless NULL, added to v (NULL: out of memory). */
static bool add_grid_fields(cJSON *v, const cost_gemm_grid *G, const char *source)
{
    return v && cJSON_AddItemToObject(v, "m", cJSON_CreateDoubleArray(G->m, G->n_m))
        && cJSON_AddItemToObject(v, "n", cJSON_CreateDoubleArray(G->n, G->n_n))
        && cJSON_AddItemToObject(v, "k", cJSON_CreateDoubleArray(G->k, G->n_k))
        && cJSON_AddItemToObject(v, "eff", cJSON_CreateDoubleArray(G->eff, G->n_m * G->n_n * G->n_k))
        && (!source || cJSON_AddStringToObject(v, "source", source));
}

bool cost_gemm_grid_add(cJSON *o, const cost_gemm_grid *G, const char *source)
{
    cJSON *v = cJSON_CreateObject();
    if (add_grid_fields(v, G, source) && cJSON_AddItemToObject(o, "gemm_grid", v)) return true;
    cJSON_Delete(v);
    return false;
}

bool cost_gemm_bf16_add(cJSON *o, const cost_gemm_terms *t, const char *source)
{
    cJSON *v = cJSON_CreateObject();
    if (v && cJSON_AddNumberToObject(v, "peak_flops", t->peak_flops) && add_grid_fields(v, &t->grid, source)
        && cJSON_AddItemToObject(o, "gemm_bf16", v)) return true;
    cJSON_Delete(v);
    return false;
}

bool cost_attn_bf16_add(cJSON *o, const cost_attn_terms *t, const char *source)
{
    cJSON *v = cJSON_CreateObject();
    bool ok = v && cJSON_AddNumberToObject(v, "flop_s", t->flop_s) && cJSON_AddNumberToObject(v, "score_s", t->score_s)
        && cJSON_AddNumberToObject(v, "bwd_score_s", t->bwd_score_s) && cJSON_AddNumberToObject(v, "row_s", t->row_s)
        && cJSON_AddNumberToObject(v, "bwd_row_s", t->bwd_row_s)
        && (!source || cJSON_AddStringToObject(v, "source", source));
    if (ok && cJSON_AddItemToObject(o, "attn_bf16", v)) return true;
    cJSON_Delete(v);
    return false;
}

bool cost_ew_table_add(cJSON *o, const cost_ew_table *T, const char *source)
{
    cJSON *v = cJSON_CreateObject();
    bool ok = v && cJSON_AddItemToObject(v, "elements", cJSON_CreateDoubleArray(T->elements, T->n));
    for (int k = 0; ok && k < COST_N_EW; k++)
        if (T->bw[k][0] > 0) ok = cJSON_AddItemToObject(v, cost_ew_name((cost_ew)k), cJSON_CreateDoubleArray(T->bw[k], T->n));
    ok = ok && (!source || cJSON_AddStringToObject(v, "source", source));
    if (ok && cJSON_AddItemToObject(o, "elementwise", v)) return true;
    cJSON_Delete(v);
    return false;
}

cJSON *cost_gpu_to_json(const cost_gpu *g)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    bool ok = cJSON_AddStringToObject(o, "schema", GPU_SCHEMA) && cJSON_AddStringToObject(o, "name", g->name)
        && cJSON_AddNumberToObject(o, "peak_flops", g->peak_flops)
        && cJSON_AddNumberToObject(o, "gemm_eff_max", g->gemm_eff_max)
        && cJSON_AddNumberToObject(o, "gemm_half", g->gemm_half)
        && cJSON_AddNumberToObject(o, "attn_eff", g->attn_eff)
        && cJSON_AddNumberToObject(o, "attn_score_s", g->attn_score_s)
        && cJSON_AddNumberToObject(o, "attn_bwd_score_s", g->attn_bwd_score_s)
        && cJSON_AddNumberToObject(o, "attn_row_s", g->attn_row_s)
        && cJSON_AddNumberToObject(o, "attn_bwd_row_s", g->attn_bwd_row_s)
        && cJSON_AddNumberToObject(o, "hbm_bytes", g->hbm_bytes)
        && cJSON_AddNumberToObject(o, "hbm_bw", g->hbm_bw)
        && cJSON_AddNumberToObject(o, "mem_eff", g->mem_eff)
        && cJSON_AddNumberToObject(o, "reserved_bytes", g->reserved_bytes)
        && cJSON_AddNumberToObject(o, "kernel_launch_s", g->kernel_launch_s)
        && (g->peak_flops_fp32 <= 0 || cJSON_AddNumberToObject(o, "peak_flops_fp32", g->peak_flops_fp32))
        && (g->peak_flops_tf32 <= 0 || cJSON_AddNumberToObject(o, "peak_flops_tf32", g->peak_flops_tf32))
        && (g->peak_flops_fp8 <= 0 || cJSON_AddNumberToObject(o, "peak_flops_fp8", g->peak_flops_fp8))
        && (g->gemm_eff_max_fp8 <= 0 || cJSON_AddNumberToObject(o, "gemm_eff_max_fp8", g->gemm_eff_max_fp8))
        && (g->reserved_workspace_bytes <= 0
            || cJSON_AddNumberToObject(o, "reserved_workspace_bytes", g->reserved_workspace_bytes))
        && (g->sm_count <= 0 || cJSON_AddNumberToObject(o, "sm_count", g->sm_count))
        && (g->attn_hd_half <= 0 || cJSON_AddNumberToObject(o, "attn_hd_half", g->attn_hd_half))
        && (g->attn_row_scores <= 0 || cJSON_AddNumberToObject(o, "attn_row_scores", g->attn_row_scores))
        && (g->attn_bwd_eff <= 0 || cJSON_AddNumberToObject(o, "attn_bwd_eff", g->attn_bwd_eff))
        && (g->attn_bwd_row_scores <= 0 || cJSON_AddNumberToObject(o, "attn_bwd_row_scores", g->attn_bwd_row_scores))
        && (g->attn_cudnn_speedup <= 0 || cJSON_AddNumberToObject(o, "attn_cudnn_speedup", g->attn_cudnn_speedup))
        && (g->gemm_sustained <= 0 || cJSON_AddNumberToObject(o, "gemm_sustained", g->gemm_sustained))
        && (g->grid.n_m == 0 || cost_gemm_grid_add(o, &g->grid, NULL))
        && (g->ew.n == 0 || cost_ew_table_add(o, &g->ew, NULL))
        && (!g->attn_bf16.measured || cost_attn_bf16_add(o, &g->attn_bf16, NULL))
        && (!g->gemm_bf16.measured || cost_gemm_bf16_add(o, &g->gemm_bf16, NULL));
    if (!ok) { cJSON_Delete(o); return NULL; }
    return o;
}
