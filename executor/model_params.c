/* The model's ZeRO shard state (which pieces of the flat weights, gradients
 * and moments a rank keeps) and the parameter API (named tensors, raw
 * save/load) over the layout of model.c. */
#include "executor/model_int.h"
#include "executor/precision.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ----------------------------------------------------------------- shards */

/* New moments for a new shard, keeping the values the old and new pieces share. */
static int reshard_moments(ex_module *md, const ex_shard *sh, char *err)
{
    const ex_backend *be = md->be;
    size_t n = sh->at[sh->n_units];
    float *m = be->alloc((n ? n : 1) * sizeof(float), UTIL_MEM_OPTIM);
    float *v = be->alloc((n ? n : 1) * sizeof(float), UTIL_MEM_OPTIM);
    if (!m || !v) {
        be->release(m);
        be->release(v);
        return util_fail(err, UTIL_ENOMEM, "executor: out of memory for %zu optimizer elements", n);
    }
    for (int u = 0; u < sh->n_units; u++) {
        size_t a0, a1, b0, b1;
        ex_shard_range(&md->shard, u, &a0, &a1);
        ex_shard_range(sh, u, &b0, &b1);
        size_t lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
        if (lo >= hi) continue;
        be->d2d(m + sh->at[u] + (lo - b0), md->m + md->shard.at[u] + (lo - a0), (hi - lo) * sizeof(float));
        be->d2d(v + sh->at[u] + (lo - b0), md->v + md->shard.at[u] + (lo - a0), (hi - lo) * sizeof(float));
    }
    be->release(md->m);
    be->release(md->v);
    md->m = m;
    md->v = v;
    return UTIL_OK;
}

/* This rank's pieces of a flat buffer, into a new shard buffer (zero padded). */
static float *take_pieces(const ex_backend *be, const ex_shard *sh, const float *flat, util_mem_cat cat)
{
    size_t n = sh->at[sh->n_units];
    float *out = be->alloc((n ? n : 1) * sizeof(float), cat);
    if (!out) return NULL;
    for (int u = 0; u < sh->n_units && flat; u++) {
        size_t lo, hi;
        ex_shard_range(sh, u, &lo, &hi);
        be->d2d(out + sh->at[u], flat + lo, (hi - lo) * sizeof(float));
    }
    return out;
}

int ex_module_set_shard(ex_model *em, int module_index, int G, int r, bool shard_grads, bool shard_params,
                        char *err)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return util_fail(err, UTIL_ENOTFOUND, "executor: ex_module_set_shard: module %d is not on this instance", module_index);
    ex_shard sh;
    int rc = ex_shard_init(&sh, md->unit_off, md->n_units, G, r, err);
    if (rc) return rc;
    bool trains = model_trains(&md->mm);
    if (trains && (rc = reshard_moments(md, &sh, err))) { ex_shard_free(&sh); return rc; }
    if (trains && shard_grads && !md->gshard) {
        md->gshard = take_pieces(md->be, &sh, NULL, UTIL_MEM_GRADS);
        if (!md->gshard) rc = util_fail(err, UTIL_ENOMEM, "executor: out of memory for the gradient shard");
        md->be->release(md->grads);
        md->grads = NULL;
        ex_module_bind_all(md, EX_BUF_GRADS);
    }
    if (!rc && shard_params && !md->pshard) {
        md->pshard = take_pieces(md->be, &sh, md->params, UTIL_MEM_PARAMS);
        if (!md->pshard) rc = util_fail(err, UTIL_ENOMEM, "executor: out of memory for the weight shard");
        md->be->release(md->params);
        md->params = NULL;
        ex_module_bind_all(md, EX_BUF_PARAMS);
    }
    ex_shard_free(&md->shard);
    md->shard = sh;
    return rc;
}

const ex_shard *ex_module_get_shard(ex_model *em, int module_index)
{
    ex_module *md = ex_module_at(em, module_index);
    return md ? &md->shard : NULL;
}

int ex_module_buffer(ex_model *em, int module_index, ex_buffer_kind kind, float **ptr, size_t *n)
{
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return UTIL_ENOTFOUND;
    size_t shard_n = md->shard.at[md->shard.n_units];
    switch (kind) {
    case EX_BUF_PARAMS: *ptr = md->params; *n = md->n_params; break;
    case EX_BUF_GRADS: *ptr = md->grads; *n = md->n_params; break;
    case EX_BUF_ADAM_M: *ptr = md->m; *n = shard_n; break;
    case EX_BUF_ADAM_V: *ptr = md->v; *n = shard_n; break;
    case EX_BUF_PARAMS_SHARD: *ptr = md->pshard; *n = shard_n; break;
    case EX_BUF_GRADS_SHARD: *ptr = md->gshard; *n = shard_n; break;
    default: return UTIL_EINVAL;
    }
    return *ptr ? UTIL_OK : UTIL_ENOTFOUND;
}

/* ------------------------------------------------------------ parameters */

int ex_param_count(const ex_model *em)
{
    int n = 0;
    for (int k = 0; k < MODEL_MAX_MODULES; k++) n += em->mod[k].n_tensors;
    return n;
}

int64_t ex_model_num_params(const ex_model *em)
{
    int64_t n = 0;
    for (int k = 0; k < MODEL_MAX_MODULES; k++) n += (int64_t)em->mod[k].n_params;
    return n;
}

/* Tensors are numbered module by module in model order (the vision encoder before the LLM). */
int ex_param_get(ex_model *em, int i, ex_param *out)
{
    if (i < 0) return UTIL_EINVAL;
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        ex_module *md = &em->mod[k];
        if (i >= md->n_tensors) { i -= md->n_tensors; continue; }
        const ex_tensor *t = &md->t[i];
        out->name = t->name;
        out->ndim = t->d.ndim;
        for (int a = 0; a < 2; a++) {
            out->shape[a] = t->d.shape[a];
            out->full_shape[a] = t->d.full[a];
            out->start[a] = t->d.start[a];
        }
        out->sharded = t->d.split_axis >= 0;
        out->numel = (int64_t)t->numel;
        out->data = md->params ? md->params + t->off : NULL;
        out->grad = md->grads ? md->grads + t->off : NULL;
        out->decay = t->d.decay;
        out->module_index = k;
        out->offset = t->off;
        out->split_axis = t->d.split_axis > 0 ? t->d.split_axis : 0;
        out->tied_copy = t->d.tied_copy;
        return UTIL_OK;
    }
    return UTIL_EINVAL;
}

static int names_text(ex_model *em, char **out, size_t *len, char *err)
{
    /* A line is at most 95 (name) + 3 + 2 * 20 (int64) + 2 characters. */
    size_t cap = 160 * (size_t)(ex_param_count(em) + 1), n = 0;
    char *s = util_malloc(cap);
    if (!s) return util_fail(err, UTIL_ENOMEM, "executor: out of memory");
    for (int i = 0; i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        if (p.ndim == 2) n += (size_t)snprintf(s + n, cap - n, "%s 2 %lld %lld\n", p.name, (long long)p.shape[0], (long long)p.shape[1]);
        else n += (size_t)snprintf(s + n, cap - n, "%s 1 %lld\n", p.name, (long long)p.shape[0]);
    }
    *out = s;
    *len = n;
    return UTIL_OK;
}

static int check_flat(ex_model *em, const char *path, char *err)
{
    for (int k = 0; k < MODEL_MAX_MODULES; k++)
        if (em->mod[k].on && !em->mod[k].params)
            return util_fail(err, UTIL_EINVAL, "%s: module %s keeps only a ZeRO-3 weight shard", path, em->mod[k].mm.name);
    return UTIL_OK;
}

int ex_params_save_raw(ex_model *em, const char *path, char *err)
{
    int rc = check_flat(em, path, err);
    if (rc) return rc;
    size_t total = (size_t)ex_model_num_params(em);
    float *buf = util_malloc(total * sizeof(float) + 1);
    if (!buf) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    size_t off = 0;
    for (int i = 0; i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        em->be->d2h(buf + off, p.data, (size_t)p.numel * sizeof(float));
        off += (size_t)p.numel;
    }
    rc = util_write_atomic(path, buf, total * sizeof(float), err);
    util_free(buf);
    if (rc) return rc;
    char *names, npath[1024];
    size_t nlen;
    if ((rc = names_text(em, &names, &nlen, err))) return rc;
    snprintf(npath, sizeof npath, "%s.names", path);
    rc = util_write_atomic(npath, names, nlen, err);
    util_free(names);
    return rc;
}

int ex_params_load_raw(ex_model *em, const char *path, char *err)
{
    char npath[1024], *names = NULL, *mine = NULL, *data = NULL;
    size_t nlen, mlen, dlen;
    snprintf(npath, sizeof npath, "%s.names", path);
    int rc = check_flat(em, path, err);
    if (!rc) rc = util_read_file(npath, &names, &nlen, err);
    if (!rc) rc = names_text(em, &mine, &mlen, err);
    if (!rc && (nlen != mlen || memcmp(names, mine, nlen)))
        rc = util_fail(err, UTIL_EINVAL, "%s: tensor names or shapes differ from this model", npath);
    if (!rc) rc = util_read_file(path, &data, &dlen, err);
    if (!rc && dlen != (size_t)ex_model_num_params(em) * sizeof(float))
        rc = util_fail(err, UTIL_EINVAL, "%s: %zu bytes, expected %lld", path, dlen, (long long)ex_model_num_params(em) * 4);
    if (!rc) {
        size_t off = 0;
        for (int i = 0; i < ex_param_count(em); i++) {
            ex_param p;
            ex_param_get(em, i, &p);
            em->be->h2d(p.data, data + off, (size_t)p.numel * sizeof(float));
            off += (size_t)p.numel * sizeof(float);
        }
    }
    util_free(names);
    util_free(mine);
    util_free(data);
    return rc;
}
