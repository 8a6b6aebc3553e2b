/* costdb loading: cluster files (dhp.cluster/1): validation, parsing and
 * serialisation, on the field getters and GPU parser of load.c. Field formats
 * are described in costdb/SCHEMA.md. */
#include "costdb/load_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLUSTER_SCHEMA "dhp.cluster/1"
#define MAX_NODES 1000000
#define MAX_GPUS_PER_NODE 1024
#define MAX_TOTAL_GPUS 16777216L

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
    int rc = cost_check_range(what, path, "busbw", l->busbw, 0, true, HUGE_VAL, err);
    if (rc) return rc;
    return cost_check_range(what, path, "alpha_s", l->alpha_s, 0, false, 1, err);
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
    if ((rc = cost_validate_gpu(&p->gpu, what, path, err))) return rc;
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
    cost_field_path(sub, sizeof sub, path, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return util_fail(err, UTIL_EINVAL, "%s: %s: required field is missing", what, sub);
    if (!cJSON_IsObject(v)) return util_fail(err, UTIL_EINVAL, "%s: %s: must be an object", what, sub);
    int rc = cost_check_source(v, what, sub, err);
    if (rc) return rc;
    if ((rc = cost_get_num(v, what, sub, "busbw", &l->busbw, err))) return rc;
    return cost_get_num(v, what, sub, "alpha_s", &l->alpha_s, err);
}

/* Optional "intra_ops": {"source": "...", "<collective>": {"alpha_s", "busbw"}, ...}
 * with cost_coll_name's names (cost_pool.intra_op). */
static int parse_intra_ops(const cJSON *pool, const char *what, const char *path, cost_pool *p, char *err)
{
    memset(p->has_intra_op, 0, sizeof p->has_intra_op);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(pool, "intra_ops");
    if (!v) return UTIL_OK;
    char sub[UTIL_ERR_LEN / 2];
    cost_field_path(sub, sizeof sub, path, "intra_ops");
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
    cost_field_path(sub, sub_len, path, key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(pool, key);
    *arr = v;
    *n = -1;
    if (!v) return UTIL_OK;
    if (cJSON_IsObject(v)) {
        int rc = cost_check_source(v, what, sub, err);
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
    int rc = cost_gpu_field(pool, what, path, "compute_handoff_s", &p->handoff_s, err);
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
    int rc = cost_gpu_field(pool, what, path, "collective_overlap", &p->overlap, err);
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
    cost_field_path(sub, sizeof sub, path, "gpu");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(pool, "gpu");
    if (!v) return util_fail(err, UTIL_EINVAL, "%s: %s: required field is missing", what, sub);
    if (cJSON_IsObject(v)) return cost_parse_gpu_obj(v, what, sub, false, g, err);
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
    if ((rc = cost_get_str(obj, what, path, "name", p->name, sizeof p->name, err))) return rc;
    if ((rc = parse_pool_gpu(obj, what, path, &p->gpu, err))) return rc;
    /* Counts are checked as soon as they are read, so the first error is the one a user made first. */
    if ((rc = cost_get_int(obj, what, path, "nodes", &p->nodes, err))) return rc;
    if ((rc = check_count(what, path, "nodes", p->nodes, MAX_NODES, err))) return rc;
    if ((rc = cost_get_int(obj, what, path, "gpus_per_node", &p->gpus_per_node, err))) return rc;
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
    int rc = cost_check_schema(root, what, "", CLUSTER_SCHEMA, true, err);
    if (rc) return rc;
    if ((rc = cost_get_str(root, what, "", "name", c->name, sizeof c->name, err))) return rc;
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
    const util_embedded_file *f = cost_preset_file(name_or_path);
    char *text = NULL;
    const char *what = name_or_path;
    int rc;
    if (f) {
        if (!(text = cost_embedded_text(f, err))) return UTIL_ENOMEM;
        what = f->path;
    } else if (looks_like_path(name_or_path)) {
        size_t len;
        if ((rc = util_read_text_file(name_or_path, UTIL_JSON_MAX_BYTES, &text, &len, err))) return rc;
    } else {
        char known[UTIL_ERR_LEN / 2];
        cost_preset_names(known, sizeof known);
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
