/* The step's data on this rank: its samples of the global batch, read from
 * the dataset into host buffers the backend copies from without staging
 * (ex_backend.alloc_host: page-locked memory under CUDA, cudaMallocHost),
 * two sets of them. While step s computes on one set, the other receives
 * step s + 1's samples (run_data_prefetch, called after step s's ops are
 * issued and before the step's sync: on a GPU the host reads the dataset
 * while the device still runs the step's kernels); the micro-batches' host
 * -> device copies (h2d, from page-locked memory asynchronous on the
 * compute stream) then read a set nobody writes until a sync has passed
 * them: a set is written again two steps later, after the next step's sync.
 * The double buffering of PyTorch's DataLoader with pin_memory and
 * non_blocking copies (pytorch.org/docs/stable/data.html, "Memory
 * Pinning"), on one thread. */
#include "executor/run_internal.h"

#include <string.h>

static void *host_alloc(const ex_backend *be, size_t bytes)
{
    return be->alloc_host ? be->alloc_host(bytes) : util_malloc(bytes);
}

static void host_release(const ex_backend *be, void *p)
{
    if (be->release_host) be->release_host(p);
    else util_free(p);
}

/* Points the step's buffers (pixels .. mask) at set i. */
static void use_set(run_data *d, int i)
{
    d->pixels = d->set[i].pixels;
    d->mel = d->set[i].mel;
    d->tokens = d->set[i].tokens;
    d->mask = d->set[i].mask;
    d->cur = i;
}

int run_data_init(run_ctx *r, const plan_schedule *s, ex_dataset *ds, run_data *d, char *err)
{
    const ex_dataset_info *in = ex_data_info(ds);
    int B = r->plan.work.global_batch;
    memset(d, 0, sizeof *d);
    d->be = r->be;
    d->loaded[0] = d->loaded[1] = -1;
    d->row_of = util_malloc((size_t)B * sizeof(int));
    d->ones = util_malloc((size_t)B * sizeof(int));
    if (!d->row_of || !d->ones) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
    for (int j = 0; j < B; j++) { d->row_of[j] = -1; d->ones[j] = 1; }
    for (int i = 0; i < s->n; i++) {
        const plan_op *o = &s->op[i];
        if (o->kind == PLAN_OP_FORWARD || o->kind == PLAN_OP_FORWARD_BACKWARD)
            for (int j = o->sample0; j < o->sample0 + o->samples; j++) d->row_of[j] = 0;
    }
    for (int j = 0; j < B; j++)
        if (d->row_of[j] >= 0) d->row_of[j] = d->n++;
    d->patches = in->patches;
    d->patch_dim = in->patch_dim;
    d->T = in->text_tokens;
    d->grid = in->grid;
    d->mel_frames = in->mel_frames;
    d->mel_bins = in->mel_bins;
    const model_t *m = &r->plan.model;
    int vi = model_find_kind(m, MODEL_VISION), ai = model_find_kind(m, MODEL_AUDIO);
    d->images = vi >= 0 && run_feeds(r, vi);
    d->audio = ai >= 0 && run_feeds(r, ai);
    size_t rows = d->n > 0 ? (size_t)d->n : 1;
    for (int i = 0; i < 2; i++) {
        run_data_set *b = &d->set[i];
        b->pixels = host_alloc(d->be, (rows * in->patches * in->patch_dim + 1) * sizeof(float));
        b->mel = host_alloc(d->be, (rows * in->mel_frames * in->mel_bins + 1) * sizeof(float));
        b->tokens = host_alloc(d->be, rows * in->text_tokens * sizeof(int32_t));
        b->mask = host_alloc(d->be, rows * in->text_tokens * sizeof(float));
        if (!b->pixels || !b->mel || !b->tokens || !b->mask)
            return util_fail(err, UTIL_ENOMEM, "run: out of %s memory for the step's data", d->be->alloc_host ? "page-locked host" : "");
    }
    use_set(d, 0);
    return ex_batch_alloc(&d->one, ds, 1, err);
}

void run_data_free(run_data *d)
{
    util_free(d->row_of);
    util_free(d->ones);
    for (int i = 0; d->be && i < 2; i++) {
        run_data_set *b = &d->set[i];
        host_release(d->be, b->pixels); host_release(d->be, b->mel);
        host_release(d->be, b->tokens); host_release(d->be, b->mask);
    }
    ex_batch_free(&d->one);
    memset(d, 0, sizeof *d);
}

/* Loads this rank's samples of step `step` into set i: global sample j of
 * the step is row j of the dp = 1 batch, so every plan sees the same data. */
static int load(run_ctx *r, ex_dataset *ds, long step, run_data *d, int i, char *err)
{
    int B = r->plan.work.global_batch;
    run_data_set *b = &d->set[i];
    size_t px = (size_t)d->patches * d->patch_dim, mel = (size_t)d->mel_frames * d->mel_bins;
    d->loaded[i] = -1;
    for (int j = 0; j < B; j++) {
        int row = d->row_of[j];
        if (row < 0) continue;
        int rc = ex_data_batch(ds, r->o->shuffle_seed, step, B, j, B, &d->one, err);
        if (rc) return rc;
        memcpy(b->pixels + (size_t)row * px, d->one.pixels, px * sizeof(float));
        if (d->one.mel) memcpy(b->mel + (size_t)row * mel, d->one.mel, mel * sizeof(float));
        memcpy(b->tokens + (size_t)row * d->T, d->one.tokens, (size_t)d->T * sizeof(int32_t));
        memcpy(b->mask + (size_t)row * d->T, d->one.loss_mask, (size_t)d->T * sizeof(float));
    }
    d->loaded[i] = step;
    return UTIL_OK;
}

int run_data_load(run_ctx *r, ex_dataset *ds, long step, run_data *d, char *err)
{
    for (int i = 0; i < 2; i++)
        if (d->loaded[i] == step) { use_set(d, i); return UTIL_OK; }
    int rc = load(r, ds, step, d, d->cur, err);   /* nothing in flight reads it: the last step ended with a sync */
    if (!rc) use_set(d, d->cur);
    return rc;
}

int run_data_prefetch(run_ctx *r, ex_dataset *ds, long step, run_data *d, char *err)
{
    if (step >= r->o->steps) return UTIL_OK;
    return load(r, ds, step, d, 1 - d->cur, err);
}
