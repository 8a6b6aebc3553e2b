/* Checkpoints of `dhp run` (see run_internal.h): shards are gathered into
 * whole tensors so a checkpoint does not depend on the plan that wrote it. */
#include "executor/run_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CKPT_FORMAT "dhp.ckpt/1"

static int make_dir(const char *path, char *err)
{
    if (mkdir(path, 0777) && errno != EEXIST)
        return util_fail(err, UTIL_EIO, "checkpoint: cannot create directory %s: %s", path, strerror(errno));
    return UTIL_OK;
}

/* Module k's flat AdamW moments for this rank's tp shard (all n elements):
 * ZeRO-1 ranks all-gather their ranges over the gradient group. */
static int full_moments(run_ctx *r, int k, ex_buffer_kind kind, float *flat, char *err)
{
    run_module *m = &r->mod[k];
    float *mom;
    size_t n;
    if (ex_module_buffer(r->em, k, kind, &mom, &n)) return util_fail(err, UTIL_EINVAL, "checkpoint: module %d has no optimizer state", k);
    if (!m->zero1) { memcpy(flat, mom, m->n * sizeof(float)); return UTIL_OK; }
    memset(m->piece, 0, m->shard * sizeof(float));
    memcpy(m->piece, mom, n * sizeof(float));
    if (ex_comm_allgather(m->grad, m->piece, m->stage, m->shard))
        return util_fail(err, UTIL_ERUNTIME, "checkpoint: moment all-gather failed: %s", ex_comm_error(m->grad));
    memcpy(flat, m->stage, m->n * sizeof(float));
    return UTIL_OK;
}

/* The whole tensor from every tp rank's shard `local` (numel each):
 * row-split shards concatenate; column-split ones interleave per row. */
static int gather_whole(run_module *m, const ex_param *t, const float *local, float *whole, float *tmp, char *err)
{
    if (!t->sharded) { memcpy(whole, local, (size_t)t->numel * sizeof(float)); return UTIL_OK; }
    int tp = ex_comm_size(m->lead);
    if (ex_comm_allgather(m->lead, local, t->split_axis == 0 ? whole : tmp, (size_t)t->numel))
        return util_fail(err, UTIL_ERUNTIME, "checkpoint: tensor %s all-gather failed: %s", t->name, ex_comm_error(m->lead));
    if (t->split_axis == 0) return UTIL_OK;
    int64_t rows = t->shape[0], cols = t->shape[1];
    for (int q = 0; q < tp; q++)
        for (int64_t i = 0; i < rows; i++)
            memcpy(whole + i * t->full_shape[1] + q * cols, tmp + ((int64_t)q * rows + i) * cols, (size_t)cols * sizeof(float));
    return UTIL_OK;
}

/* This rank's slice of a whole tensor. */
static void take_shard(const ex_param *t, const float *whole, float *local)
{
    if (!t->sharded) { memcpy(local, whole, (size_t)t->numel * sizeof(float)); return; }
    int64_t rows = t->shape[0], cols = t->ndim > 1 ? t->shape[1] : 1, fc = t->ndim > 1 ? t->full_shape[1] : 1;
    for (int64_t i = 0; i < rows; i++)
        memcpy(local + i * cols, whole + (t->start[0] + i) * fc + (t->ndim > 1 ? t->start[1] : 0), (size_t)cols * sizeof(float));
}

typedef struct {
    ex_named_tensor *t;
    char **names;
    float **bufs;
    int n, cap;
} tensor_set;

static void set_free(tensor_set *s)
{
    for (int i = 0; i < s->n; i++) { util_free(s->names[i]); util_free(s->bufs[i]); }
    util_free(s->t); util_free(s->names); util_free(s->bufs);
    memset(s, 0, sizeof *s);
}

static float *set_add(tensor_set *s, const char *prefix, const ex_param *p)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        ex_named_tensor *t = util_realloc(s->t, (size_t)cap * sizeof *t);
        if (t) s->t = t;
        char **nm = util_realloc(s->names, (size_t)cap * sizeof *nm);
        if (nm) s->names = nm;
        float **b = util_realloc(s->bufs, (size_t)cap * sizeof *b);
        if (b) s->bufs = b;
        if (!t || !nm || !b) return NULL;
        s->cap = cap;
    }
    size_t len = strlen(prefix) + strlen(p->name) + 1;
    char *name = util_malloc(len);
    int64_t numel = p->full_shape[0] * (p->ndim > 1 ? p->full_shape[1] : 1);
    float *buf = util_malloc((size_t)numel * sizeof(float));
    if (!name || !buf) { util_free(name); util_free(buf); return NULL; }
    snprintf(name, len, "%s%s", prefix, p->name);
    s->names[s->n] = name;
    s->bufs[s->n] = buf;
    s->t[s->n] = (ex_named_tensor){ .name = name, .dtype = EX_DT_F32, .ndim = p->ndim,
                                    .shape = { p->full_shape[0], p->ndim > 1 ? p->full_shape[1] : 0 }, .data = buf };
    s->n++;
    return buf;
}

int run_ckpt_step_dir(const run_ctx *r, long long step, char *out, size_t n)
{
    return snprintf(out, n, "%s/step-%08lld", r->o->ckpt_dir, step) >= (int)n ? UTIL_EINVAL : UTIL_OK;
}

/* Gathers module k's tensors (and moments) into whole tensors; the lead
 * tp-0 rank writes them. */
static int save_module(run_ctx *r, int k, const char *dir, char *err)
{
    run_module *m = &r->mod[k];
    float *flat_m = NULL, *flat_v = NULL, *tmp = NULL;
    tensor_set set = { 0 };
    int rc = UTIL_OK;
    if (m->trains) {
        flat_m = util_malloc(m->n * sizeof(float));
        flat_v = util_malloc(m->n * sizeof(float));
        if (!flat_m || !flat_v) rc = util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory");
        if (!rc) rc = full_moments(r, k, EX_BUF_ADAM_M, flat_m, err);
        if (!rc) rc = full_moments(r, k, EX_BUF_ADAM_V, flat_v, err);
    }
    bool lead = m->lead != NULL;
    for (int i = 0; lead && !rc && i < ex_param_count(r->em); i++) {
        ex_param t;
        if (ex_param_get(r->em, i, &t) || t.module_index != k) continue;
        util_free(tmp);
        tmp = util_malloc((size_t)t.numel * ex_comm_size(m->lead) * sizeof(float));
        const float *src[3] = { t.data, flat_m ? flat_m + t.offset : NULL, flat_v ? flat_v + t.offset : NULL };
        const char *prefix[3] = { "", "adam_m.", "adam_v." };
        for (int j = 0; !rc && j < 3; j++) {
            if (!src[j]) continue;
            float *whole = set_add(&set, prefix[j], &t);
            if (!whole || !tmp) rc = util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory");
            else rc = gather_whole(m, &t, src[j], whole, tmp, err);
        }
    }
    if (!rc && lead && ex_comm_rank(m->lead) == 0) {
        char path[4096 + 64], step[32], adam_t[32], seed[32], shuffle[32];
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, r->plan.mod[k].module);
        snprintf(step, sizeof step, "%d", r->step);
        snprintf(adam_t, sizeof adam_t, "%d", ex_optimizer_get_t(r->em));
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)r->o->seed);
        snprintf(shuffle, sizeof shuffle, "%llu", (unsigned long long)r->o->shuffle_seed);
        const char *meta[] = { "format", CKPT_FORMAT, "model", r->plan.model.name, "module", r->plan.mod[k].module,
                               "step", step, "adam_t", adam_t, "seed", seed, "shuffle_seed", shuffle };
        rc = ex_ckpt_write(path, set.t, set.n, meta, 7, err);
    }
    set_free(&set);
    util_free(tmp); util_free(flat_m); util_free(flat_v);
    return rc;
}

static int agree(run_ctx *r, int rc, const char *what, char *err)
{
    int v = rc;
    if (ex_comm_allreduce_max_int(r->world, &v, 1)) return rc ? rc : UTIL_ERUNTIME;
    if (v && !rc) return util_fail(err, v, "checkpoint: %s failed on another rank", what);
    return rc;
}

int run_ckpt_save(run_ctx *r, char *err)
{
    char dir[4096];
    int rc = run_ckpt_step_dir(r, r->step, dir, sizeof dir) ? util_fail(err, UTIL_EINVAL, "checkpoint: path too long") : UTIL_OK;
    if (!rc && r->rank == 0) rc = make_dir(r->o->ckpt_dir, err);
    if (!rc && r->rank == 0) rc = make_dir(dir, err);
    if ((rc = agree(r, rc, "creating the directory", err))) return rc;
    for (int k = 0; !rc && k < r->plan.n_modules; k++)
        if (r->mod[k].on) rc = save_module(r, k, dir, err);
    if ((rc = agree(r, rc, "writing", err))) return rc;
    /* DIR/latest moves only once every module file of the step is complete */
    if (r->rank == 0) {
        char path[4096 + 16], text[32];
        snprintf(path, sizeof path, "%s/latest", r->o->ckpt_dir);
        int n = snprintf(text, sizeof text, "step-%08d\n", r->step);
        rc = util_write_atomic(path, text, (size_t)n, err);
    }
    rc = agree(r, rc, "writing latest", err);
    if (!rc && r->rank == 0) run_ckpt_retain(r);
    return rc;
}

static int meta_long(ex_ckpt *c, const char *path, const char *key, long long *out, char *err)
{
    const char *v = ex_ckpt_meta(c, key);
    char *end = NULL;
    if (v) *out = strtoll(v, &end, 10);
    if (!v || !end || *end || end == v) return util_fail(err, UTIL_EINVAL, "checkpoint: %s: metadata %s missing or not a number", path, key);
    return UTIL_OK;
}

static int check_meta(run_ctx *r, ex_ckpt *c, const char *path, int k, long long *step, long long *adam_t, char *err)
{
    const char *f = ex_ckpt_meta(c, "format"), *model = ex_ckpt_meta(c, "model"), *mod = ex_ckpt_meta(c, "module");
    if (!f || strcmp(f, CKPT_FORMAT)) return util_fail(err, UTIL_EINVAL, "checkpoint: %s is not a dhp checkpoint (%s)", path, CKPT_FORMAT);
    if (!ex_ckpt_checksummed(c))
        return util_fail(err, UTIL_EINVAL, "checkpoint: %s has no checksums (written by an older dhp): refused", path);
    if (!model || strcmp(model, r->plan.model.name) || !mod || strcmp(mod, r->plan.mod[k].module))
        return util_fail(err, UTIL_EINVAL, "checkpoint: %s holds model %s module %s, the plan's is %s module %s", path,
                         model ? model : "?", mod ? mod : "?", r->plan.model.name, r->plan.mod[k].module);
    long long seed, shuffle;
    int rc = meta_long(c, path, "step", step, err);
    if (!rc) rc = meta_long(c, path, "adam_t", adam_t, err);
    if (!rc) rc = meta_long(c, path, "seed", &seed, err);
    if (!rc) rc = meta_long(c, path, "shuffle_seed", &shuffle, err);
    if (!rc && (unsigned long long)shuffle != r->o->shuffle_seed)
        rc = util_fail(err, UTIL_EINVAL, "checkpoint: %s was trained with --shuffle-seed %lld, not %llu (the data order would change)",
                       path, shuffle, (unsigned long long)r->o->shuffle_seed);
    if (!rc && (*step < 0 || *step > r->o->steps))
        rc = util_fail(err, UTIL_EINVAL, "checkpoint: %s is at step %lld, outside --steps %d", path, *step, r->o->steps);
    return rc;
}

/* Reads one whole tensor by name and keeps this rank's slice in `local`. */
static int load_tensor(ex_ckpt *c, const char *path, const char *name, const ex_param *t, float *whole, float *local, char *err)
{
    const ex_ckpt_entry *e = ex_ckpt_find(c, name);
    if (!e) return util_fail(err, UTIL_EINVAL, "checkpoint: %s has no tensor %s (a different model?)", path, name);
    int64_t full = t->full_shape[0] * (t->ndim > 1 ? t->full_shape[1] : 1);
    if (e->ndim != t->ndim || e->shape[0] != t->full_shape[0] || (t->ndim > 1 && e->shape[1] != t->full_shape[1]))
        return util_fail(err, UTIL_EINVAL, "checkpoint: %s: tensor %s has another shape than the model's", path, name);
    int rc = ex_ckpt_read_f32(c, e, whole, (size_t)full, err);
    if (!rc) take_shard(t, whole, local);
    return rc;
}

static int load_module(run_ctx *r, int k, const char *dir, long long *step, char *err)
{
    run_module *m = &r->mod[k];
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, r->plan.mod[k].module);
    ex_ckpt *c;
    int rc = ex_ckpt_open(path, &c, err);
    if (rc) return rc;
    long long adam_t = 0;
    rc = check_meta(r, c, path, k, step, &adam_t, err);
    float *flat_m = m->trains ? util_calloc(m->n, sizeof(float)) : NULL;
    float *flat_v = m->trains ? util_calloc(m->n, sizeof(float)) : NULL;
    float *whole = NULL;
    if (!rc && m->trains && (!flat_m || !flat_v)) rc = util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory");
    for (int i = 0; !rc && i < ex_param_count(r->em); i++) {
        ex_param t;
        if (ex_param_get(r->em, i, &t) || t.module_index != k) continue;
        util_free(whole);
        whole = util_malloc((size_t)(t.full_shape[0] * (t.ndim > 1 ? t.full_shape[1] : 1)) * sizeof(float));
        if (!whole) { rc = util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory"); break; }
        char name[256];
        rc = load_tensor(c, path, t.name, &t, whole, t.data, err);
        if (!rc && m->trains) {
            snprintf(name, sizeof name, "adam_m.%s", t.name);
            rc = load_tensor(c, path, name, &t, whole, flat_m + t.offset, err);
        }
        if (!rc && m->trains) {
            snprintf(name, sizeof name, "adam_v.%s", t.name);
            rc = load_tensor(c, path, name, &t, whole, flat_v + t.offset, err);
        }
    }
    if (!rc && m->trains) {
        float *mom;
        size_t n;
        ex_module_buffer(r->em, k, EX_BUF_ADAM_M, &mom, &n);
        memcpy(mom, flat_m + (m->zero1 ? m->lo : 0), n * sizeof(float));
        ex_module_buffer(r->em, k, EX_BUF_ADAM_V, &mom, &n);
        memcpy(mom, flat_v + (m->zero1 ? m->lo : 0), n * sizeof(float));
        ex_optimizer_set_t(r->em, (int)adam_t);
    }
    util_free(whole); util_free(flat_m); util_free(flat_v);
    ex_ckpt_close(c);
    return rc;
}

int run_ckpt_load(run_ctx *r, char *err)
{
    char dir[4096];
    long long step = -1;
    int rc = run_ckpt_resume_step(r, dir, sizeof dir, &step, err);
    for (int k = 0; !rc && k < r->plan.n_modules; k++) {
        if (!r->mod[k].on) continue;
        long long s = -1;
        rc = load_module(r, k, dir, &s, err);
        if (!rc && s != step)
            rc = util_fail(err, UTIL_EINVAL, "checkpoint: %s/%s.safetensors is at step %lld, %s/latest names step %lld",
                           dir, r->plan.mod[k].module, s, r->o->ckpt_dir, step);
    }
    if (!rc) r->step = (int)step;
    return rc;
}
