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

void run_ckpt_take_shard(const ex_param *t, const float *whole, float *local)
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

/* A whole tensor `name` of ndim and shape; returns its buffer. */
static float *set_add_named(tensor_set *s, const char *name, int ndim, const int64_t shape[2])
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
    int64_t numel = shape[0] * (ndim > 1 ? shape[1] : 1);
    char *copy = util_malloc(strlen(name) + 1);
    float *buf = util_malloc((size_t)(numel > 0 ? numel : 1) * sizeof(float));
    if (!copy || !buf) { util_free(copy); util_free(buf); return NULL; }
    strcpy(copy, name);
    s->names[s->n] = copy;
    s->bufs[s->n] = buf;
    s->t[s->n] = (ex_named_tensor){ .name = copy, .dtype = EX_DT_F32, .ndim = ndim,
                                    .shape = { shape[0], ndim > 1 ? shape[1] : 0 }, .data = buf };
    s->n++;
    return buf;
}

static float *set_add(tensor_set *s, const char *prefix, const ex_param *p)
{
    char name[320];
    snprintf(name, sizeof name, "%s%s", prefix, p->name);
    return set_add_named(s, name, p->ndim, p->full_shape);
}

static int64_t entry_numel(const ex_named_tensor *t) { return t->shape[0] * (t->ndim > 1 ? t->shape[1] : 1); }

/* ---- a pipelined module: every stage's tensors to the first stage's writer ----
 * Stage s's lead sends its set as a header ("name ndim d0 d1" lines) and the
 * concatenated data over the module's stage-lead group (dp = sp = tp = 0 of
 * each stage); messages carry floats, the header's bytes padded into them. */
enum { TAG_SIZES = 1, TAG_HEADER, TAG_DATA };

static int send_set(run_module *m, const tensor_set *set, char *err)
{
    size_t hlen = 0, data = 0;
    for (int i = 0; i < set->n; i++) {
        hlen += strlen(set->t[i].name) + 64;
        data += (size_t)entry_numel(&set->t[i]);
    }
    char *hdr = util_calloc(hlen + 4, 1);
    float *buf = util_malloc((data ? data : 1) * sizeof(float));
    int rc = hdr && buf ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory");
    size_t at = 0, used = 0;
    for (int i = 0; !rc && i < set->n; i++) {
        const ex_named_tensor *t = &set->t[i];
        used += (size_t)snprintf(hdr + used, hlen + 4 - used, "%s %d %lld %lld\n", t->name, t->ndim, (long long)t->shape[0],
                                 (long long)t->shape[1]);
        memcpy(buf + at, t->data, (size_t)entry_numel(t) * sizeof(float));
        at += (size_t)entry_numel(t);
    }
    size_t hfloats = (used + 4) / 4;
    float sizes[2] = { (float)hfloats, (float)data };
    if (!rc && (ex_comm_send(m->stage_leads, sizes, 2, 0, TAG_SIZES) || ex_comm_send(m->stage_leads, (const float *)hdr, hfloats, 0, TAG_HEADER)
                || ex_comm_send(m->stage_leads, buf, data, 0, TAG_DATA)))
        rc = util_fail(err, UTIL_ERUNTIME, "checkpoint: sending a pipeline stage's tensors failed: %s", ex_comm_error(m->stage_leads));
    util_free(hdr);
    util_free(buf);
    return rc;
}

static int recv_set(run_module *m, int stage, tensor_set *set, char *err)
{
    float sizes[2];
    if (ex_comm_recv(m->stage_leads, sizes, 2, stage, TAG_SIZES))
        return util_fail(err, UTIL_ERUNTIME, "checkpoint: receiving stage %d's tensors failed: %s", stage, ex_comm_error(m->stage_leads));
    size_t hfloats = (size_t)sizes[0], data = (size_t)sizes[1];
    char *hdr = util_calloc(hfloats * 4 + 1, 1);
    float *buf = util_malloc((data ? data : 1) * sizeof(float));
    int rc = hdr && buf ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory");
    if (!rc && (ex_comm_recv(m->stage_leads, (float *)hdr, hfloats, stage, TAG_HEADER) || ex_comm_recv(m->stage_leads, buf, data, stage, TAG_DATA)))
        rc = util_fail(err, UTIL_ERUNTIME, "checkpoint: receiving stage %d's tensors failed: %s", stage, ex_comm_error(m->stage_leads));
    size_t at = 0;
    for (char *line = hdr, *nl; !rc && line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char name[320];
        int ndim;
        long long d0, d1;
        if (sscanf(line, "%319s %d %lld %lld", name, &ndim, &d0, &d1) != 4 || ndim < 1 || ndim > 2 || d0 < 0 || d1 < 0) {
            rc = util_fail(err, UTIL_EINVAL, "checkpoint: stage %d sent a corrupt tensor list", stage);
            break;
        }
        int64_t shape[2] = { d0, d1 }, n = d0 * (ndim > 1 ? d1 : 1);
        if (at + (size_t)n > data) { rc = util_fail(err, UTIL_EINVAL, "checkpoint: stage %d sent too little data", stage); break; }
        float *dst = set_add_named(set, name, ndim, shape);
        if (!dst) { rc = util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory"); break; }
        memcpy(dst, buf + at, (size_t)n * sizeof(float));
        at += (size_t)n;
    }
    util_free(hdr);
    util_free(buf);
    return rc;
}

int run_ckpt_step_dir(const run_ctx *r, long long step, char *out, size_t n)
{
    return snprintf(out, n, "%s/step-%08lld", r->o->ckpt_dir, step) >= (int)n ? UTIL_EINVAL : UTIL_OK;
}

/* Module k's state of this tp rank, gathered out of its data-parallel
 * strategy's shards (every rank of the module), then its tensors gathered
 * whole over the first replica's tp group of each stage; the first stage's
 * rank 0 of it writes them, with the other stages' (a tied embedding's
 * copy on the last stage is the first stage's: written once). */
static int save_module(run_ctx *r, int k, const char *dir, char *err)
{
    run_module *m = &r->mod[k];
    float *flat[3] = { NULL, NULL, NULL }, *tmp = NULL;
    const ex_buffer_kind kinds[3] = { EX_BUF_PARAMS, EX_BUF_ADAM_M, EX_BUF_ADAM_V };
    const char *prefix[3] = { "", "adam_m.", "adam_v." };
    tensor_set set = { 0 };
    int rc = UTIL_OK, n_state = m->rules.trains ? 3 : 1;
    for (int j = 0; !rc && j < n_state; j++) {
        flat[j] = util_malloc((m->n ? m->n : 1) * sizeof(float));
        rc = flat[j] ? run_dp_gather_state(&m->dp, kinds[j], flat[j], err)
                     : util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory");
    }
    bool lead = m->lead != NULL;
    for (int i = 0; lead && !rc && i < ex_param_count(r->em); i++) {
        ex_param t;
        if (ex_param_get(r->em, i, &t) || t.module_index != k || t.tied_copy) continue;
        util_free(tmp);
        tmp = util_malloc((size_t)t.numel * ex_comm_size(m->lead) * sizeof(float));
        for (int j = 0; !rc && j < n_state; j++) {
            float *whole = set_add(&set, prefix[j], &t);
            if (!whole || !tmp) rc = util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory");
            else rc = gather_whole(m, &t, flat[j] + t.offset, whole, tmp, err);
        }
    }
    /* a pipelined module's stages: their leads' tensors to the first stage's */
    bool writer = lead && ex_comm_rank(m->lead) == 0 && m->at.pp == 0;
    if (!rc && lead && ex_comm_rank(m->lead) == 0 && m->at.pp > 0) rc = send_set(m, &set, err);
    for (int st = 1; !rc && writer && st < r->plan.mod[k].pp; st++) rc = recv_set(m, st, &set, err);
    if (!rc && writer) {
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
    util_free(tmp);
    for (int j = 0; j < 3; j++) util_free(flat[j]);
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
    if (!rc) run_ckpt_take_shard(t, whole, local);
    return rc;
}

/* Every tensor's whole copy from the file, this rank's tp slice of it into
 * the module's flat state, then into the data-parallel strategy's shards. */
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
    float *flat[3] = { NULL, NULL, NULL }, *whole = NULL;
    const ex_buffer_kind kinds[3] = { EX_BUF_PARAMS, EX_BUF_ADAM_M, EX_BUF_ADAM_V };
    const char *prefix[3] = { "", "adam_m.", "adam_v." };
    int n_state = m->rules.trains ? 3 : 1;
    for (int j = 0; !rc && j < n_state; j++)
        if (!(flat[j] = util_calloc(m->n ? m->n : 1, sizeof(float)))) rc = util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory");
    for (int i = 0; !rc && i < ex_param_count(r->em); i++) {
        ex_param t;
        if (ex_param_get(r->em, i, &t) || t.module_index != k) continue;
        util_free(whole);
        whole = util_malloc((size_t)(t.full_shape[0] * (t.ndim > 1 ? t.full_shape[1] : 1)) * sizeof(float));
        if (!whole) { rc = util_fail(err, UTIL_ENOMEM, "checkpoint: out of memory"); break; }
        for (int j = 0; !rc && j < n_state; j++) {
            char name[256];
            snprintf(name, sizeof name, "%s%s", prefix[j], t.name);
            rc = load_tensor(c, path, name, &t, whole, flat[j] + t.offset, err);
        }
    }
    for (int j = 0; !rc && j < n_state; j++) rc = run_dp_scatter_state(&m->dp, kinds[j], flat[j], err);
    if (!rc && m->rules.trains) ex_optimizer_set_t(r->em, (int)adam_t);
    util_free(whole);
    for (int j = 0; j < 3; j++) util_free(flat[j]);
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
