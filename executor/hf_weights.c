/* Reading a Hugging Face safetensors checkpoint for `dhp run --init-from`:
 * the directory's files (one model.safetensors, or the shards that
 * model.safetensors.index.json's weight_map names, as transformers'
 * save_pretrained writes them: modeling_utils.py, SAFE_WEIGHTS_INDEX_NAME),
 * checked against the model before anything is read. The files are
 * untrusted: each goes through ex_ckpt_open (bounded header, offsets inside
 * the file, no overlaps); names come from hf_names.c's table. */
#include "executor/executor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* index.json and config.json are a few hundred KB for the largest published
 * models; anything far larger is not one. */
#define MAX_JSON_BYTES (64u << 20)

typedef struct {
    int n;
    plan_tensor *t;      /* plan_module_tensors, whole (tp 1) */
    ex_hf_ref *ref;
} hf_module;

typedef struct {
    char *name;          /* a tensor in weight_map */
    int shard;
    bool used;
} hf_entry;

struct ex_hf {
    char dir[4096];
    model_t m;
    int n_shards;
    ex_ckpt **shard;
    char **shard_name;
    int n_entries;
    hf_entry *entry;
    hf_module mod[MODEL_MAX_MODULES];
};

void ex_hf_close(ex_hf *h)
{
    if (!h) return;
    for (int i = 0; i < h->n_shards; i++) { ex_ckpt_close(h->shard[i]); util_free(h->shard_name[i]); }
    for (int i = 0; i < h->n_entries; i++) util_free(h->entry[i].name);
    for (int k = 0; k < MODEL_MAX_MODULES; k++) { util_free(h->mod[k].t); util_free(h->mod[k].ref); }
    util_free(h->shard);
    util_free(h->shard_name);
    util_free(h->entry);
    util_free(h);
}

/* A JSON file of the checkpoint, size-capped; NULL text when absent (ENOENT). */
static int read_json(const char *path, bool optional, cJSON **out, char *err)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) {
        if (optional && errno == ENOENT) return UTIL_OK;
        return util_fail(err, UTIL_EIO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode) || st.st_size > (off_t)MAX_JSON_BYTES)
        return util_fail(err, UTIL_EINVAL, "%s: not a regular file of at most %u bytes", path, MAX_JSON_BYTES);
    char *text = NULL;
    size_t len;
    int rc = util_read_file(path, &text, &len, err);
    if (rc) return rc;
    *out = cJSON_ParseWithLength(text, len);
    util_free(text);
    return *out ? UTIL_OK : util_fail(err, UTIL_EINVAL, "%s: not valid JSON", path);
}

static int add_shard(ex_hf *h, const char *file, const char *from, char *err)
{
    for (int i = 0; i < h->n_shards; i++)
        if (!strcmp(h->shard_name[i], file)) return i;
    if (!file[0] || strchr(file, '/') || !strcmp(file, "..") || !strcmp(file, "."))
        return util_fail(err, UTIL_EINVAL, "%s: shard name '%s' is not a file name in the checkpoint directory", from, file), -1;
    ex_ckpt **s = util_realloc(h->shard, (size_t)(h->n_shards + 1) * sizeof *s);
    if (s) h->shard = s;
    char **nm = util_realloc(h->shard_name, (size_t)(h->n_shards + 1) * sizeof *nm);
    if (nm) h->shard_name = nm;
    if (!s || !nm) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", from), -1;
    char path[4096 + 256];
    snprintf(path, sizeof path, "%s/%s", h->dir, file);
    struct stat st;
    if (stat(path, &st) != 0)
        return util_fail(err, UTIL_EINVAL, "%s: names shard %s, which is missing (%s)", from, file, strerror(errno)), -1;
    char sub[UTIL_ERR_LEN];
    if (ex_ckpt_open(path, &h->shard[h->n_shards], sub))
        return util_fail(err, UTIL_EINVAL, "%s", sub), -1;
    h->shard_name[h->n_shards] = util_strdup(file);
    if (!h->shard_name[h->n_shards]) { ex_ckpt_close(h->shard[h->n_shards]); return util_fail(err, UTIL_ENOMEM, "out of memory"), -1; }
    return h->n_shards++;
}

static int add_entry(ex_hf *h, const char *name, int shard, char *err)
{
    if (h->n_entries % 256 == 0) {
        hf_entry *e = util_realloc(h->entry, (size_t)(h->n_entries + 256) * sizeof *e);
        if (!e) return util_fail(err, UTIL_ENOMEM, "out of memory");
        h->entry = e;
    }
    h->entry[h->n_entries] = (hf_entry){ util_strdup(name), shard, false };
    if (!h->entry[h->n_entries].name) return util_fail(err, UTIL_ENOMEM, "out of memory");
    h->n_entries++;
    return UTIL_OK;
}

/* The shards and their tensors: the index's weight_map, each name present in
 * the shard it names; or the one model.safetensors. */
static int open_files(ex_hf *h, char *err)
{
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", h->dir);
    cJSON *idx;
    int rc = read_json(path, true, &idx, err);
    if (rc) return rc;
    if (!idx) {
        snprintf(path, sizeof path, "%s/model.safetensors", h->dir);
        struct stat st;
        if (stat(path, &st) != 0)
            return util_fail(err, UTIL_EINVAL, "%s: no model.safetensors.index.json and no model.safetensors: not a Hugging Face checkpoint", h->dir);
        int s = add_shard(h, "model.safetensors", h->dir, err);
        if (s < 0) return UTIL_EINVAL;
        for (int i = 0; !rc && i < ex_ckpt_count(h->shard[s]); i++) rc = add_entry(h, ex_ckpt_entry_at(h->shard[s], i)->name, s, err);
        return rc;
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    if (!cJSON_IsObject(map)) rc = util_fail(err, UTIL_EINVAL, "%s: weight_map: required object is missing", path);
    for (const cJSON *kv = map ? map->child : NULL; !rc && kv; kv = kv->next) {
        if (!cJSON_IsString(kv)) { rc = util_fail(err, UTIL_EINVAL, "%s: weight_map.%s: must be a file name", path, kv->string); break; }
        int s = add_shard(h, kv->valuestring, path, err);
        if (s < 0) rc = UTIL_EINVAL;
        else if (!ex_ckpt_find(h->shard[s], kv->string))
            rc = util_fail(err, UTIL_EINVAL, "%s: weight_map.%s: shard %s has no such tensor", path, kv->string, kv->valuestring);
        else rc = add_entry(h, kv->string, s, err);
    }
    /* a tensor in a shard that the index does not list is not part of the model either */
    for (int s = 0; !rc && s < h->n_shards; s++)
        for (int i = 0; !rc && i < ex_ckpt_count(h->shard[s]); i++)
            if (!cJSON_GetObjectItemCaseSensitive(map, ex_ckpt_entry_at(h->shard[s], i)->name))
                rc = util_fail(err, UTIL_EINVAL, "%s/%s: tensor %s is not in %s's weight_map", h->dir, h->shard_name[s],
                               ex_ckpt_entry_at(h->shard[s], i)->name, path);
    cJSON_Delete(idx);
    return rc;
}

/* config.json, when present, must describe the same shapes as the run's model. */
static int check_config(ex_hf *h, char *err)
{
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/config.json", h->dir);
    cJSON *cfg;
    int rc = read_json(path, true, &cfg, err);
    if (rc || !cfg) return rc;
    char *text = cJSON_PrintUnformatted(cfg);
    cJSON_Delete(cfg);
    model_t *hm = util_calloc(1, sizeof *hm);
    if (!text || !hm) rc = util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    if (!rc) rc = model_import_hf(text, path, hm, err);
    free(text);
    for (int k = 0; !rc && k < h->m.n_modules; k++) {
        const model_module *a = &h->m.mod[k];
        int j = model_find_kind(hm, a->kind);
        if (j < 0) { rc = util_fail(err, UTIL_EINVAL, "%s: describes no %s module, the run's model has one", path, a->name); break; }
        const model_module *b = &hm->mod[j];
        const char *f[] = { "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "in_channels", "patch",
                            "temporal_patch", "merge", "window", "out_hidden", "tied_embeddings" };
        const int va[] = { a->layers, a->hidden, a->heads, a->kv_heads, a->head_dim, a->ffn, a->vocab, a->in_channels,
                           a->patch, a->temporal_patch, a->merge, a->window, a->out_hidden, a->tied_embeddings };
        const int vb[] = { b->layers, b->hidden, b->heads, b->kv_heads, b->head_dim, b->ffn, b->vocab, b->in_channels,
                           b->patch, b->temporal_patch, b->merge, b->window, b->out_hidden, b->tied_embeddings };
        for (size_t i = 0; !rc && i < sizeof va / sizeof va[0]; i++)
            if (va[i] != vb[i])
                rc = util_fail(err, UTIL_EINVAL, "%s: %s %s is %d, the run's model %s has %d (another architecture)", path,
                               a->name, f[i], vb[i], h->m.name, va[i]);
    }
    util_free(hm);
    return rc;
}

static hf_entry *find_entry(ex_hf *h, const char *name)
{
    for (int i = 0; i < h->n_entries; i++)
        if (!strcmp(h->entry[i].name, name)) return &h->entry[i];
    return NULL;
}

static void fmt_dims(char *buf, size_t n, int ndim, const int64_t *d)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Every tensor of the model: its Hugging Face reference, present with that shape and a float dtype. */
static int map_module(ex_hf *h, int k, char *err)
{
    const model_module *mm = &h->m.mod[k];
    hf_module *md = &h->mod[k];
    md->n = plan_module_tensors(mm, 1, 0, false, NULL, NULL, 0);
    md->t = util_calloc((size_t)(md->n > 0 ? md->n : 1), sizeof *md->t);
    md->ref = util_calloc((size_t)(md->n > 0 ? md->n : 1), sizeof *md->ref);
    if (!md->t || !md->ref) return util_fail(err, UTIL_ENOMEM, "out of memory");
    plan_module_tensors(mm, 1, 0, false, NULL, md->t, md->n);
    for (int i = 0; i < md->n; i++) {
        ex_hf_ref *r = &md->ref[i];
        int rc = ex_hf_ref_of(&h->m, mm, &md->t[i], r, err);
        if (rc) return rc;
        hf_entry *e = find_entry(h, r->name);
        if (!e)
            return util_fail(err, UTIL_EINVAL, "%s: tensor %s (the model's %s.%s) is missing", h->dir, r->name, mm->name,
                             md->t[i].name);
        e->used = true;
        const ex_ckpt_entry *ce = ex_ckpt_find(h->shard[e->shard], r->name);
        bool same = ce->ndim == r->ndim;
        for (int d = 0; same && d < r->ndim; d++) same = ce->shape[d] == r->shape[d];
        if (!same) {
            char a[160], b[160];
            fmt_dims(a, sizeof a, ce->ndim, ce->shape);
            fmt_dims(b, sizeof b, r->ndim, r->shape);
            return util_fail(err, UTIL_EINVAL, "%s/%s: tensor %s has shape %s, model %s needs %s", h->dir,
                             h->shard_name[e->shard], r->name, a, h->m.name, b);
        }
        if (strcmp(ce->dtype, "F32") && strcmp(ce->dtype, "BF16") && strcmp(ce->dtype, "F16"))
            return util_fail(err, UTIL_EINVAL, "%s/%s: tensor %s has dtype %s, not F32, BF16 or F16", h->dir,
                             h->shard_name[e->shard], r->name, ce->dtype);
    }
    return UTIL_OK;
}

int ex_hf_open(const char *dir, const model_t *m, ex_hf **out, char *err)
{
    *out = NULL;
    ex_hf *h = util_calloc(1, sizeof *h);
    if (!h) return util_fail(err, UTIL_ENOMEM, "out of memory");
    util_strlcpy(h->dir, dir, sizeof h->dir);
    h->m = *m;
    int rc = ex_hf_arch_of(m, NULL, NULL, NULL, err);
    if (!rc) rc = open_files(h, err);
    if (!rc) rc = check_config(h, err);
    for (int k = 0; !rc && k < m->n_modules; k++) rc = map_module(h, k, err);
    for (int i = 0; !rc && i < h->n_entries; i++)
        if (!h->entry[i].used)
            rc = util_fail(err, UTIL_EINVAL, "%s/%s: tensor %s is not part of model %s (another architecture?)", dir,
                           h->shard_name[h->entry[i].shard], h->entry[i].name, m->name);
    if (rc) { ex_hf_close(h); return rc; }
    *out = h;
    return UTIL_OK;
}

int ex_hf_read(ex_hf *h, int k, const char *name, float *out, size_t numel, char *err)
{
    const hf_module *md = k >= 0 && k < h->m.n_modules ? &h->mod[k] : NULL;
    int i = 0;
    while (md && i < md->n && strcmp(md->t[i].name, name)) i++;
    if (!md || i == md->n) return util_fail(err, UTIL_EINVAL, "%s: module %d has no tensor %s", h->dir, k, name);
    const plan_tensor *t = &md->t[i];
    const ex_hf_ref *r = &md->ref[i];
    hf_entry *e = find_entry(h, r->name);
    const ex_ckpt_entry *ce = ex_ckpt_find(h->shard[e->shard], r->name);
    size_t cols = (size_t)(t->ndim > 1 ? t->full[1] : 1), whole = (size_t)ex_ckpt_numel(ce);
    if (numel != (size_t)t->full[0] * cols)
        return util_fail(err, UTIL_EINVAL, "%s: tensor %s: %zu elements asked, it has %zu", h->dir, r->name, numel,
                         (size_t)t->full[0] * cols);
    if (whole == numel) return ex_ckpt_read_f32(h->shard[e->shard], ce, out, numel, err);
    float *all = util_malloc(whole * sizeof *all);   /* q, k or v rows of a fused qkv */
    if (!all) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", h->dir);
    int rc = ex_ckpt_read_f32(h->shard[e->shard], ce, all, whole, err);
    if (!rc) memcpy(out, all + (size_t)r->row0 * cols, numel * sizeof *out);
    util_free(all);
    return rc;
}
