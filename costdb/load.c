/* costdb loading: GPU files (dhp.gpu/1), cluster files (dhp.cluster/1),
 * validation and serialisation. Field formats are described in costdb/SCHEMA.md. */
#include "costdb/costdb.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPU_DIR "costdb/gpus/"
#define CLUSTER_DIR "costdb/clusters/"
#define MAX_SHIPPED 64
#define GPU_SCHEMA "dhp.gpu/1"
#define CLUSTER_SCHEMA "dhp.cluster/1"
#define MAX_NODES 1000000
#define MAX_GPUS_PER_NODE 1024
#define MAX_TOTAL_GPUS 16777216L

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

static void field_path(char *out, size_t n, const char *path, const char *key)
{
    /* Over-long paths are cut; using the result keeps -Wformat-truncation quiet. */
    if (snprintf(out, n, "%s%s%s", path, path[0] ? "." : "", key) < 0) out[0] = '\0';
}

static int get_num(const cJSON *obj, const char *what, const char *path, const char *key,
                   double *out, char *err)
{
    char fp[UTIL_ERR_LEN / 2];
    field_path(fp, sizeof fp, path, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return util_fail(err, UTIL_EINVAL, "%s: %s: required field is missing", what, fp);
    if (!cJSON_IsNumber(v)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be a number", what, fp);
    *out = v->valuedouble;
    return UTIL_OK;
}

static int get_int(const cJSON *obj, const char *what, const char *path, const char *key,
                   int *out, char *err)
{
    double d;
    int rc = get_num(obj, what, path, key, &d, err);
    if (rc) return rc;
    char fp[UTIL_ERR_LEN / 2];
    field_path(fp, sizeof fp, path, key);
    if (d != floor(d) || fabs(d) > 2147483647.0)
        return util_fail(err, UTIL_EINVAL, "%s: %s: must be an integer (got %g)", what, fp, d);
    *out = (int)d;
    return UTIL_OK;
}

static int get_str(const cJSON *obj, const char *what, const char *path, const char *key,
                   char *out, size_t n, char *err)
{
    char fp[UTIL_ERR_LEN / 2];
    field_path(fp, sizeof fp, path, key);
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

static int check_schema(const cJSON *obj, const char *what, const char *path, const char *want,
                        bool required, char *err)
{
    if (!required && !cJSON_GetObjectItemCaseSensitive(obj, "schema")) return UTIL_OK;
    char schema[32], fp[UTIL_ERR_LEN / 2];
    int rc = get_str(obj, what, path, "schema", schema, sizeof schema, err);
    if (rc) return rc;
    field_path(fp, sizeof fp, path, "schema");
    if (strcmp(schema, want) != 0)
        return util_fail(err, UTIL_EINVAL, "%s: %s: expected \"%s\" (got \"%s\")", what, fp, want, schema);
    return UTIL_OK;
}

static int check_source(const cJSON *obj, const char *what, const char *path, char *err)
{
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(obj, "source");
    if (src && !cJSON_IsString(src))
        return util_fail(err, UTIL_EINVAL, "%s: %s.source: must be a string", what, path);
    return UTIL_OK;
}

static int check_range(const char *what, const char *path, const char *key, double v, double lo,
                       bool lo_open, double hi, char *err)
{
    char fp[UTIL_ERR_LEN / 2];
    field_path(fp, sizeof fp, path, key);
    if (!isfinite(v) || (lo_open ? v <= lo : v < lo))
        return util_fail(err, UTIL_EINVAL, "%s: %s: must be %s %g (got %g)", what, fp,
                         lo_open ? ">" : ">=", lo, v);
    if (v > hi) return util_fail(err, UTIL_EINVAL, "%s: %s: must be <= %g (got %g)", what, fp, hi, v);
    return UTIL_OK;
}

/* ---- GPU descriptions ---- */

/* A GPU field is either a plain number or {"value": number, "source": string}. */
static int gpu_field(const cJSON *obj, const char *what, const char *path, const char *key,
                     double *out, char *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsObject(v)) return get_num(obj, what, path, key, out, err);
    char sub[UTIL_ERR_LEN / 2];
    field_path(sub, sizeof sub, path, key);
    int rc = check_source(v, what, sub, err);
    if (rc) return rc;
    return get_num(v, what, sub, "value", out, err);
}

static int validate_gpu(const cost_gpu *g, const char *what, const char *path, char *err)
{
    int rc;
    if (!g->name[0]) {
        char fp[UTIL_ERR_LEN / 2];
        field_path(fp, sizeof fp, path, "name");
        return util_fail(err, UTIL_EINVAL, "%s: %s: must not be empty", what, fp);
    }
    if ((rc = check_range(what, path, "peak_flops", g->peak_flops, 0, true, HUGE_VAL, err))) return rc;
    if ((rc = check_range(what, path, "peak_flops_fp32", g->peak_flops_fp32, 0, false, HUGE_VAL, err))) return rc;
    if ((rc = check_range(what, path, "peak_flops_tf32", g->peak_flops_tf32, 0, false, HUGE_VAL, err))) return rc;
    if ((rc = check_range(what, path, "gemm_eff_max", g->gemm_eff_max, 0, true, 1, err))) return rc;
    if ((rc = check_range(what, path, "gemm_half", g->gemm_half, 0, false, HUGE_VAL, err))) return rc;
    if ((rc = check_range(what, path, "attn_eff", g->attn_eff, 0, true, 1, err))) return rc;
    if ((rc = check_range(what, path, "attn_score_s", g->attn_score_s, 0, false, 1, err))) return rc;
    if ((rc = check_range(what, path, "attn_bwd_score_s", g->attn_bwd_score_s, 0, false, 1, err))) return rc;
    if ((rc = check_range(what, path, "attn_row_s", g->attn_row_s, 0, false, 1, err))) return rc;
    if ((rc = check_range(what, path, "attn_bwd_row_s", g->attn_bwd_row_s, 0, false, 1, err))) return rc;
    if ((rc = check_range(what, path, "hbm_bytes", g->hbm_bytes, 0, true, HUGE_VAL, err))) return rc;
    if ((rc = check_range(what, path, "hbm_bw", g->hbm_bw, 0, true, HUGE_VAL, err))) return rc;
    if ((rc = check_range(what, path, "mem_eff", g->mem_eff, 0, true, 1, err))) return rc;
    if ((rc = check_range(what, path, "reserved_bytes", g->reserved_bytes, 0, false, HUGE_VAL, err))) return rc;
    if (g->reserved_bytes >= g->hbm_bytes) {
        char fp[UTIL_ERR_LEN / 2];
        field_path(fp, sizeof fp, path, "reserved_bytes");
        return util_fail(err, UTIL_EINVAL, "%s: %s: %g leaves nothing of hbm_bytes %g", what, fp,
                         g->reserved_bytes, g->hbm_bytes);
    }
    if ((rc = check_range(what, path, "sm_count", g->sm_count, 0, false, 1e6, err))) return rc;
    if ((rc = check_range(what, path, "attn_hd_half", g->attn_hd_half, 0, false, 1e6, err))) return rc;
    if ((rc = check_range(what, path, "attn_row_scores", g->attn_row_scores, 0, false, 1e6, err))) return rc;
    return check_range(what, path, "kernel_launch_s", g->kernel_launch_s, 0, false, 1, err);
}

int cost_gpu_validate(const cost_gpu *g, const char *ctx, char *err)
{
    return validate_gpu(g, ctx ? ctx : g->name, "", err);
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
    field_path(sub, sub_len, path, key);
    if (!cJSON_IsObject(*v)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be an object", what, sub);
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(*v, "source");
    if (src && !cJSON_IsString(src)) return util_fail(err, UTIL_EINVAL, "%s: %s.source: must be a string", what, sub);
    return UTIL_OK;
}

/* Optional "gemm_grid": {"m": [...], "n": [...], "k": [...], "eff": [n_m x n_n x n_k,
 * k fastest], "source": "..."} (cost_gemm_grid). */
static int parse_gemm_grid(const cJSON *obj, const char *what, const char *path, cost_gemm_grid *G, char *err)
{
    const cJSON *v;
    char sub[UTIL_ERR_LEN / 2];
    int rc = optional_table(obj, what, path, "gemm_grid", &v, sub, sizeof sub, err);
    if (rc || !v) return rc;
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

static int parse_gpu_obj(const cJSON *obj, const char *what, const char *path, bool need_schema,
                         cost_gpu *g, char *err)
{
    if (!cJSON_IsObject(obj))
        return util_fail(err, UTIL_EINVAL, "%s: %s: must be an object", what, path[0] ? path : "(top level)");
    int rc = check_schema(obj, what, path, GPU_SCHEMA, need_schema, err);
    if (rc) return rc;
    memset(g, 0, sizeof *g);
    if ((rc = get_str(obj, what, path, "name", g->name, sizeof g->name, err))) return rc;
    struct { const char *key; double *dst; } f[] = {
        {"peak_flops", &g->peak_flops}, {"gemm_eff_max", &g->gemm_eff_max},
        {"gemm_half", &g->gemm_half}, {"attn_eff", &g->attn_eff},
        {"hbm_bytes", &g->hbm_bytes}, {"hbm_bw", &g->hbm_bw}, {"mem_eff", &g->mem_eff},
        {"reserved_bytes", &g->reserved_bytes}, {"kernel_launch_s", &g->kernel_launch_s},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if ((rc = gpu_field(obj, what, path, f[i].key, f[i].dst, err))) return rc;
    struct { const char *key; double *dst; } optional[] = {
        {"attn_score_s", &g->attn_score_s}, {"attn_bwd_score_s", &g->attn_bwd_score_s},
        {"attn_row_s", &g->attn_row_s}, {"attn_bwd_row_s", &g->attn_bwd_row_s},
        {"sm_count", &g->sm_count}, {"attn_hd_half", &g->attn_hd_half},
        {"attn_row_scores", &g->attn_row_scores},
        {"peak_flops_fp32", &g->peak_flops_fp32}, {"peak_flops_tf32", &g->peak_flops_tf32},
    };
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
        if (cJSON_GetObjectItemCaseSensitive(obj, optional[i].key)
            && (rc = gpu_field(obj, what, path, optional[i].key, optional[i].dst, err))) return rc;
    if ((rc = parse_gemm_grid(obj, what, path, &g->grid, err))) return rc;
    if ((rc = parse_ew_table(obj, what, path, &g->ew, err))) return rc;
    return validate_gpu(g, what, path, err);
}

int cost_gpu_parse_json(const char *text, const char *what, cost_gpu *g, char *err)
{
    cJSON *root;
    int rc = util_json_parse(text, what, &root, err);
    if (rc) return rc;
    rc = parse_gpu_obj(root, what, "", true, g, err);
    cJSON_Delete(root);
    return rc;
}

/* Embedded data is not NUL-terminated by contract; copy it before parsing. */
static char *embedded_text(const util_embedded_file *f, char *err)
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
    char *text = embedded_text(f, err);
    if (!text) return UTIL_ENOMEM;
    int rc = cost_gpu_parse_json(text, f->path, g, err);
    util_free(text);
    return rc;
}

bool cost_gemm_grid_add(cJSON *o, const cost_gemm_grid *G, const char *source)
{
    cJSON *v = cJSON_CreateObject();
    bool ok = v && cJSON_AddItemToObject(v, "m", cJSON_CreateDoubleArray(G->m, G->n_m))
        && cJSON_AddItemToObject(v, "n", cJSON_CreateDoubleArray(G->n, G->n_n))
        && cJSON_AddItemToObject(v, "k", cJSON_CreateDoubleArray(G->k, G->n_k))
        && cJSON_AddItemToObject(v, "eff", cJSON_CreateDoubleArray(G->eff, G->n_m * G->n_n * G->n_k))
        && (!source || cJSON_AddStringToObject(v, "source", source));
    if (ok && cJSON_AddItemToObject(o, "gemm_grid", v)) return true;
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
        && (g->sm_count <= 0 || cJSON_AddNumberToObject(o, "sm_count", g->sm_count))
        && (g->attn_hd_half <= 0 || cJSON_AddNumberToObject(o, "attn_hd_half", g->attn_hd_half))
        && (g->attn_row_scores <= 0 || cJSON_AddNumberToObject(o, "attn_row_scores", g->attn_row_scores))
        && (g->grid.n_m == 0 || cost_gemm_grid_add(o, &g->grid, NULL))
        && (g->ew.n == 0 || cost_ew_table_add(o, &g->ew, NULL));
    if (!ok) { cJSON_Delete(o); return NULL; }
    return o;
}

/* ---- clusters ---- */

int cost_pool_gpus(const cost_pool *p) { return p->nodes * p->gpus_per_node; }

int cost_cluster_gpus(const cost_cluster *c)
{
    int n = 0;
    for (int i = 0; i < c->n_pools; i++) n += cost_pool_gpus(&c->pool[i]);
    return n;
}

static int validate_link(const cost_link *l, const char *what, const char *path, char *err)
{
    int rc = check_range(what, path, "busbw", l->busbw, 0, true, HUGE_VAL, err);
    if (rc) return rc;
    return check_range(what, path, "alpha_s", l->alpha_s, 0, false, 1, err);
}

static int check_count(const char *what, const char *path, const char *key, int v, int max, char *err)
{
    if (v < 1 || v > max)
        return util_fail(err, UTIL_EINVAL, "%s: %s.%s: must be >= 1 and <= %d (got %d)", what, path, key, max, v);
    return UTIL_OK;
}

static int validate_pool(const cost_pool *p, int i, const char *what, char *err)
{
    char path[UTIL_ERR_LEN / 2];
    int rc;
    snprintf(path, sizeof path, "pools[%d]", i);
    if (!p->name[0]) return util_fail(err, UTIL_EINVAL, "%s: %s.name: must not be empty", what, path);
    if ((rc = check_count(what, path, "nodes", p->nodes, MAX_NODES, err))) return rc;
    if ((rc = check_count(what, path, "gpus_per_node", p->gpus_per_node, MAX_GPUS_PER_NODE, err))) return rc;
    snprintf(path, sizeof path, "pools[%d].gpu", i);
    if ((rc = validate_gpu(&p->gpu, what, path, err))) return rc;
    snprintf(path, sizeof path, "pools[%d].intra", i);
    if ((rc = validate_link(&p->intra, what, path, err))) return rc;
    for (int k = 0; k < COST_N_COLL; k++) {
        if (!p->has_intra_op[k]) continue;
        snprintf(path, sizeof path, "pools[%d].intra_ops.%s", i, cost_coll_name((cost_coll)k));
        if ((rc = validate_link(&p->intra_op[k], what, path, err))) return rc;
    }
    snprintf(path, sizeof path, "pools[%d].inter", i);
    return validate_link(&p->inter, what, path, err);
}

static int validate_cluster(const cost_cluster *c, const char *what, char *err)
{
    if (!c->name[0]) return util_fail(err, UTIL_EINVAL, "%s: name: must not be empty", what);
    if (c->n_pools < 1 || c->n_pools > COST_MAX_POOLS)
        return util_fail(err, UTIL_EINVAL, "%s: pools: must have 1 to %d entries (got %d)", what,
                         COST_MAX_POOLS, c->n_pools);
    long total = 0;
    for (int i = 0; i < c->n_pools; i++) {
        const cost_pool *p = &c->pool[i];
        int rc = validate_pool(p, i, what, err);
        if (rc) return rc;
        for (int j = 0; j < i; j++)
            if (util_streq_nocase(c->pool[j].name, p->name))
                return util_fail(err, UTIL_EINVAL, "%s: pools[%d].name: '%s' repeats pools[%d]", what, i, p->name, j);
        total += (long)p->nodes * p->gpus_per_node;
        if (total > MAX_TOTAL_GPUS)
            return util_fail(err, UTIL_EINVAL, "%s: pools[%d].nodes: cluster exceeds %ld GPUs", what, i, MAX_TOTAL_GPUS);
    }
    return validate_link(&c->cross_pool, what, "cross_pool", err);
}

int cost_cluster_validate(const cost_cluster *c, char *err)
{
    return validate_cluster(c, c->name[0] ? c->name : "cluster", err);
}

static int parse_link(const cJSON *obj, const char *what, const char *path, const char *key,
                      cost_link *l, char *err)
{
    char sub[UTIL_ERR_LEN / 2];
    field_path(sub, sizeof sub, path, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return util_fail(err, UTIL_EINVAL, "%s: %s: required field is missing", what, sub);
    if (!cJSON_IsObject(v)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be an object", what, sub);
    int rc = check_source(v, what, sub, err);
    if (rc) return rc;
    if ((rc = get_num(v, what, sub, "busbw", &l->busbw, err))) return rc;
    return get_num(v, what, sub, "alpha_s", &l->alpha_s, err);
}

/* Optional "intra_ops": {"source": "...", "<collective>": {"alpha_s", "busbw"}, ...}
 * with cost_coll_name's names (cost_pool.intra_op). */
static int parse_intra_ops(const cJSON *pool, const char *what, const char *path, cost_pool *p, char *err)
{
    memset(p->has_intra_op, 0, sizeof p->has_intra_op);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(pool, "intra_ops");
    if (!v) return UTIL_OK;
    char sub[UTIL_ERR_LEN / 2];
    field_path(sub, sizeof sub, path, "intra_ops");
    if (!cJSON_IsObject(v)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be an object", what, sub);
    const cJSON *item;
    cJSON_ArrayForEach(item, v) {
        if (!strcmp(item->string, "source")) {
            if (!cJSON_IsString(item)) return util_fail(err, UTIL_EINVAL, "%s: %s.source: must be a string", what, sub);
            continue;
        }
        int op = -1;
        for (int k = 0; k < COST_N_COLL; k++)
            if (!strcmp(item->string, cost_coll_name((cost_coll)k))) op = k;
        if (op < 0)
            return util_fail(err, UTIL_EINVAL, "%s: %s.%s: not a collective (all-reduce, all-gather, reduce-scatter, "
                             "all-to-all, broadcast)", what, sub, item->string);
        int rc = parse_link(v, what, sub, item->string, &p->intra_op[op], err);
        if (rc) return rc;
        p->has_intra_op[op] = true;
    }
    return UTIL_OK;
}

/* An optional pool array `key`, plain or {"value": [...], "source": "..."}:
 * *arr NULL when absent, else the array and *n its length (-1 not an array);
 * sub gets the field's path for errors. */
static int optional_array(const cJSON *pool, const char *what, const char *path, const char *key,
                          char *sub, size_t sub_len, const cJSON **arr, int *n, char *err)
{
    field_path(sub, sub_len, path, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(pool, key);
    *arr = v;
    *n = -1;
    if (!v) return UTIL_OK;
    if (cJSON_IsObject(v)) {
        int rc = check_source(v, what, sub, err);
        if (rc) return rc;
        v = cJSON_GetObjectItemCaseSensitive(v, "value");
    }
    *arr = v;
    if (cJSON_IsArray(v)) *n = cJSON_GetArraySize(v);
    return UTIL_OK;
}

/* Optional "compute_speed": [speed with 1, 2, ... ranks computing], plain
 * or as {"value": [...], "source": "..."} (cost_pool.speed). */
static int parse_speed(const cJSON *pool, const char *what, const char *path, cost_pool *p, char *err)
{
    char sub[UTIL_ERR_LEN / 2];
    const cJSON *v;
    int n, rc = optional_array(pool, what, path, "compute_speed", sub, sizeof sub, &v, &n, err);
    p->n_speed = 0;
    if (rc || !v) return rc;
    if (n < 1 || n > COST_MAX_SPEED || n > p->gpus_per_node)
        return util_fail(err, UTIL_EINVAL, "%s: %s: must be an array of 1 to min(%d, gpus_per_node = %d) speeds",
                         what, sub, COST_MAX_SPEED, p->gpus_per_node);
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || !(x->valuedouble > 0) || x->valuedouble > 1)
            return util_fail(err, UTIL_EINVAL, "%s: %s[%d]: must be a number in (0, 1]", what, sub, i);
        p->speed[i] = x->valuedouble;
    }
    if (fabs(p->speed[0] - 1.0) > 1e-9)
        return util_fail(err, UTIL_EINVAL, "%s: %s[0]: must be 1 (speeds are relative to one rank computing alone; got %g)",
                         what, sub, p->speed[0]);
    p->n_speed = n;
    return UTIL_OK;
}

/* Optional "compute_sets": [lowest local rank of each local rank's processor
 * set], plain or {"value": [...], "source": "..."} (cost_pool.set_of). */
static int parse_sets(const cJSON *pool, const char *what, const char *path, cost_pool *p, char *err)
{
    char sub[UTIL_ERR_LEN / 2];
    const cJSON *v;
    int n, rc = optional_array(pool, what, path, "compute_sets", sub, sizeof sub, &v, &n, err);
    p->has_sets = false;
    if (rc || !v) return rc;
    if (n != p->gpus_per_node || n > COST_MAX_SPEED)
        return util_fail(err, UTIL_EINVAL, "%s: %s: must be an array of gpus_per_node (%d, at most %d) ranks",
                         what, sub, p->gpus_per_node, COST_MAX_SPEED);
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(v, i);
        int s = cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble <= i ? (int)x->valuedouble : -1;
        if (!cJSON_IsNumber(x) || s != x->valuedouble || s < 0 || s > i || (s < i && p->set_of[s] != s))
            return util_fail(err, UTIL_EINVAL, "%s: %s[%d]: must be the lowest rank of its set (0..%d, itself a set's first)",
                             what, sub, i, i);
        p->set_of[i] = s;
    }
    p->has_sets = true;
    return UTIL_OK;
}

/* Optional "compute_handoff_s": seconds, plain or {"value": s, "source":
 * "..."} (cost_pool.handoff_s); only meaningful where ranks share processors. */
static int parse_handoff(const cJSON *pool, const char *what, const char *path, cost_pool *p, char *err)
{
    p->handoff_s = 0;
    if (!cJSON_GetObjectItemCaseSensitive(pool, "compute_handoff_s")) return UTIL_OK;
    int rc = gpu_field(pool, what, path, "compute_handoff_s", &p->handoff_s, err);
    if (rc) return rc;
    if (!isfinite(p->handoff_s) || p->handoff_s < 0 || p->handoff_s > 1)
        return util_fail(err, UTIL_EINVAL, "%s: %s.compute_handoff_s: must be seconds in [0, 1] (got %g)", what, path,
                         p->handoff_s);
    if (p->handoff_s > 0 && p->n_speed == 0)
        return util_fail(err, UTIL_EINVAL, "%s: %s.compute_handoff_s: needs compute_speed (ranks that share processors)",
                         what, path);
    return UTIL_OK;
}

/* Optional "collective_overlap": a fraction in [0, 1], plain or {"value", "source"} (cost_pool.overlap). */
static int parse_overlap(const cJSON *pool, const char *what, const char *path, cost_pool *p, char *err)
{
    p->has_overlap = false;
    p->overlap = 0;
    if (!cJSON_GetObjectItemCaseSensitive(pool, "collective_overlap")) return UTIL_OK;
    int rc = gpu_field(pool, what, path, "collective_overlap", &p->overlap, err);
    if (rc) return rc;
    if (!isfinite(p->overlap) || p->overlap < 0 || p->overlap > 1)
        return util_fail(err, UTIL_EINVAL, "%s: %s.collective_overlap: must be a fraction in [0, 1] (got %g)", what, path,
                         p->overlap);
    p->has_overlap = true;
    return UTIL_OK;
}

/* "gpu" is a shipped GPU name or an embedded dhp.gpu/1 object (what
 * cost_cluster_to_json writes, so a plan file carries its own numbers). */
static int parse_pool_gpu(const cJSON *pool, const char *what, const char *path, cost_gpu *g, char *err)
{
    char sub[UTIL_ERR_LEN / 2];
    field_path(sub, sizeof sub, path, "gpu");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(pool, "gpu");
    if (!v) return util_fail(err, UTIL_EINVAL, "%s: %s: required field is missing", what, sub);
    if (cJSON_IsObject(v)) return parse_gpu_obj(v, what, sub, false, g, err);
    if (!cJSON_IsString(v)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be a GPU name or a GPU object", what, sub);
    char inner[UTIL_ERR_LEN];
    int rc = cost_gpu_load(v->valuestring, g, inner);
    if (rc == UTIL_ENOTFOUND) return util_fail(err, UTIL_EINVAL, "%s: %s: %s", what, sub, inner);
    if (rc) return util_fail(err, rc, "%s", inner);
    return UTIL_OK;
}

static int parse_pool(const cJSON *obj, const char *what, int i, cost_pool *p, char *err)
{
    char path[UTIL_ERR_LEN / 2];
    snprintf(path, sizeof path, "pools[%d]", i);
    if (!cJSON_IsObject(obj)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be an object", what, path);
    int rc;
    if ((rc = get_str(obj, what, path, "name", p->name, sizeof p->name, err))) return rc;
    if ((rc = parse_pool_gpu(obj, what, path, &p->gpu, err))) return rc;
    /* Counts are checked as soon as they are read, so the first error is the one a user made first. */
    if ((rc = get_int(obj, what, path, "nodes", &p->nodes, err))) return rc;
    if ((rc = check_count(what, path, "nodes", p->nodes, MAX_NODES, err))) return rc;
    if ((rc = get_int(obj, what, path, "gpus_per_node", &p->gpus_per_node, err))) return rc;
    if ((rc = check_count(what, path, "gpus_per_node", p->gpus_per_node, MAX_GPUS_PER_NODE, err))) return rc;
    if ((rc = parse_link(obj, what, path, "intra", &p->intra, err))) return rc;
    if ((rc = parse_link(obj, what, path, "inter", &p->inter, err))) return rc;
    if ((rc = parse_intra_ops(obj, what, path, p, err))) return rc;
    if ((rc = parse_speed(obj, what, path, p, err))) return rc;
    if ((rc = parse_sets(obj, what, path, p, err))) return rc;
    if ((rc = parse_handoff(obj, what, path, p, err))) return rc;
    return parse_overlap(obj, what, path, p, err);
}

/* Unset cross_pool: the slowest inter link of all pools (for two pools, the slower of the two). */
cost_link cost_cluster_default_cross_pool(const cost_cluster *c)
{
    cost_link l = c->pool[0].inter;
    for (int i = 1; i < c->n_pools; i++) {
        if (c->pool[i].inter.busbw < l.busbw) l.busbw = c->pool[i].inter.busbw;
        if (c->pool[i].inter.alpha_s > l.alpha_s) l.alpha_s = c->pool[i].inter.alpha_s;
    }
    return l;
}

static int parse_cluster_obj(const cJSON *root, const char *what, cost_cluster *c, char *err)
{
    if (!cJSON_IsObject(root)) return util_fail(err, UTIL_EINVAL, "%s: must be a JSON object", what);
    memset(c, 0, sizeof *c);
    int rc = check_schema(root, what, "", CLUSTER_SCHEMA, true, err);
    if (rc) return rc;
    if ((rc = get_str(root, what, "", "name", c->name, sizeof c->name, err))) return rc;
    const cJSON *pools = cJSON_GetObjectItemCaseSensitive(root, "pools");
    if (!cJSON_IsArray(pools)) return util_fail(err, UTIL_EINVAL, "%s: pools: must be an array", what);
    int n = cJSON_GetArraySize(pools);
    if (n < 1 || n > COST_MAX_POOLS)
        return util_fail(err, UTIL_EINVAL, "%s: pools: must have 1 to %d entries (got %d)", what, COST_MAX_POOLS, n);
    for (int i = 0; i < n; i++)
        if ((rc = parse_pool(cJSON_GetArrayItem(pools, i), what, i, &c->pool[i], err))) return rc;
    c->n_pools = n;
    if (cJSON_GetObjectItemCaseSensitive(root, "cross_pool")) {
        if ((rc = parse_link(root, what, "", "cross_pool", &c->cross_pool, err))) return rc;
    } else {
        c->cross_pool = cost_cluster_default_cross_pool(c);
    }
    return validate_cluster(c, what, err);
}

int cost_cluster_parse_json(const char *text, const char *what, cost_cluster *c, char *err)
{
    cJSON *root;
    int rc = util_json_parse(text, what, &root, err);
    if (rc) return rc;
    rc = parse_cluster_obj(root, what, c, err);
    cJSON_Delete(root);
    return rc;
}

static bool looks_like_path(const char *s)
{
    size_t n = strlen(s);
    return strchr(s, '/') || (n > 5 && strcmp(s + n - 5, ".json") == 0);
}

int cost_cluster_load(const char *name_or_path, cost_cluster *c, char *err)
{
    if (!name_or_path || !name_or_path[0])
        return util_fail(err, UTIL_EINVAL, "cluster: empty preset name or path");
    const shipped_list *l = shipped(&presets_shipped);
    const util_embedded_file *f = shipped_find(l, name_or_path, NULL);
    char *text = NULL;
    const char *what = name_or_path;
    int rc;
    if (f) {
        if (!(text = embedded_text(f, err))) return UTIL_ENOMEM;
        what = f->path;
    } else if (looks_like_path(name_or_path)) {
        size_t len;
        if ((rc = util_read_text_file(name_or_path, UTIL_JSON_MAX_BYTES, &text, &len, err))) return rc;
    } else {
        char known[UTIL_ERR_LEN / 2];
        known_names(l, known, sizeof known);
        return util_fail(err, UTIL_ENOTFOUND, "unknown cluster preset '%s' (known: %s; or give a path to a cluster JSON file)",
                         name_or_path, known);
    }
    rc = cost_cluster_parse_json(text, what, c, err);
    util_free(text);
    return rc;
}

static cJSON *link_to_json(const cost_link *l)
{
    cJSON *o = cJSON_CreateObject();
    if (o && cJSON_AddNumberToObject(o, "busbw", l->busbw) && cJSON_AddNumberToObject(o, "alpha_s", l->alpha_s))
        return o;
    cJSON_Delete(o);
    return NULL;
}

static bool add_item(cJSON *parent, const char *key, cJSON *item)
{
    if (!item) return false;
    if (!cJSON_AddItemToObject(parent, key, item)) { cJSON_Delete(item); return false; }
    return true;
}

static bool add_intra_ops(cJSON *o, const cost_pool *p)
{
    cJSON *ops = NULL;
    for (int k = 0; k < COST_N_COLL; k++) {
        if (!p->has_intra_op[k]) continue;
        if (!ops && !(ops = cJSON_CreateObject())) return false;
        if (!add_item(ops, cost_coll_name((cost_coll)k), link_to_json(&p->intra_op[k]))) { cJSON_Delete(ops); return false; }
    }
    return !ops || add_item(o, "intra_ops", ops);
}

static cJSON *pool_to_json(const cost_pool *p)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddStringToObject(o, "name", p->name)
        && add_item(o, "gpu", cost_gpu_to_json(&p->gpu))
        && cJSON_AddNumberToObject(o, "nodes", p->nodes)
        && cJSON_AddNumberToObject(o, "gpus_per_node", p->gpus_per_node)
        && add_item(o, "intra", link_to_json(&p->intra))
        && add_item(o, "inter", link_to_json(&p->inter))
        && (p->n_speed == 0 || add_item(o, "compute_speed", cJSON_CreateDoubleArray(p->speed, p->n_speed)))
        && (!p->has_sets || add_item(o, "compute_sets", cJSON_CreateIntArray(p->set_of, p->gpus_per_node)))
        && (!(p->handoff_s > 0) || cJSON_AddNumberToObject(o, "compute_handoff_s", p->handoff_s))
        && (!p->has_overlap || cJSON_AddNumberToObject(o, "collective_overlap", p->overlap))
        && add_intra_ops(o, p);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

cJSON *cost_cluster_to_json(const cost_cluster *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *pools = cJSON_CreateArray();
    bool ok = o && pools && cJSON_AddStringToObject(o, "schema", CLUSTER_SCHEMA)
        && cJSON_AddStringToObject(o, "name", c->name);
    if (ok) {
        ok = cJSON_AddItemToObject(o, "pools", pools);
        if (!ok) cJSON_Delete(pools);
        pools = NULL;
    }
    for (int i = 0; ok && i < c->n_pools; i++) {
        cJSON *p = pool_to_json(&c->pool[i]);
        ok = p && cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(o, "pools"), p);
        if (!ok) cJSON_Delete(p);
    }
    ok = ok && add_item(o, "cross_pool", link_to_json(&c->cross_pool));
    cJSON_Delete(pools);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}
