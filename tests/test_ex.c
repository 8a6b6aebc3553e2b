/* Executor test helpers (tests/test_ex.h). */
#include "tests/test_ex.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int grp_reduce(grp_t *g, int rank, float *buf, size_t n, bool max)
{
    g->slot[rank] = buf;
    pthread_barrier_wait(&g->bar);
    if (rank == 0)
        for (size_t i = 0; i < n; i++) {
            float acc = g->slot[0][i];
            for (int r = 1; r < g->size; r++) acc = max ? fmaxf(acc, g->slot[r][i]) : acc + g->slot[r][i];
            for (int r = 0; r < g->size; r++) g->slot[r][i] = acc;
        }
    pthread_barrier_wait(&g->bar);
    return 0;
}

int grid_sum(void *ctx, float *buf, size_t n) { grid_ctx *c = ctx; return grp_reduce(c->tp, c->tr, buf, n, false); }
int grid_max(void *ctx, float *buf, size_t n) { grid_ctx *c = ctx; return grp_reduce(c->tp, c->tr, buf, n, true); }

int grid_alltoall(void *ctx, const float *send, float *recv, size_t chunk)
{
    grid_ctx *c = ctx;
    grp_t *g = c->sp;
    g->send[c->sr] = send;
    pthread_barrier_wait(&g->bar);
    for (int r = 0; r < g->size; r++)
        memcpy(recv + r * chunk, g->send[r] + c->sr * chunk, chunk * sizeof(float));
    pthread_barrier_wait(&g->bar);
    return 0;
}

double gathered_err(ex_model *whole, ex_model **ranks, const int *tp_rank, const int *sp_rank,
                    int n_ranks, bool grads, bool sum_sp, bool *covered, bool *replicas_equal)
{
    double worst = 0;
    *covered = *replicas_equal = true;
    int n_sp = 0;
    for (int r = 0; r < n_ranks; r++) n_sp = sp_rank[r] + 1 > n_sp ? sp_rank[r] + 1 : n_sp;
    for (int i = 0; i < ex_param_count(whole); i++) {
        ex_param w;
        ex_param_get(whole, i, &w);
        double *full = calloc((size_t)w.numel, sizeof *full);
        int *cnt = calloc((size_t)w.numel, sizeof *cnt);
        for (int r = 0; r < n_ranks; r++) {
            ex_param p, p0;
            ex_param_get(ranks[r], i, &p);
            float *buf;
            size_t n;
            if (strcmp(p.name, w.name) || p.full_shape[0] != w.shape[0] || p.full_shape[1] != w.shape[1] ||
                p.module_index != w.module_index || ex_module_buffer(ranks[r], p.module_index, EX_BUF_PARAMS, &buf, &n) ||
                buf + p.offset != p.data || p.offset + (size_t)p.numel > n)
                *covered = false;
            if (!p.sharded && tp_rank[r] != 0) {   /* a replica: same values as its tp rank 0 */
                for (int q = 0; q < n_ranks; q++)
                    if (tp_rank[q] == 0 && sp_rank[q] == sp_rank[r]) {
                        ex_param_get(ranks[q], i, &p0);
                        if (memcmp(grads ? p.grad : p.data, grads ? p0.grad : p0.data, (size_t)p.numel * 4)) *replicas_equal = false;
                    }
                continue;
            }
            if (!sum_sp && sp_rank[r] != 0) continue;
            const float *src = grads ? p.grad : p.data;
            for (int64_t a = 0; a < p.shape[0]; a++)
                for (int64_t c = 0; c < p.shape[1]; c++) {
                    int64_t k = (p.start[0] + a) * w.shape[1] + p.start[1] + c;
                    if (k < 0 || k >= w.numel) { *covered = false; continue; }
                    full[k] += src[a * p.shape[1] + c];
                    cnt[k]++;
                }
        }
        double d = 0, ref = 0;
        for (int64_t k = 0; k < w.numel; k++) {
            double y = (grads ? w.grad : w.data)[k];
            if (cnt[k] != (sum_sp ? n_sp : 1)) *covered = false;
            d += (full[k] - y) * (full[k] - y);
            ref += y * y;
        }
        double e = ref > 0 ? sqrt(d / ref) : sqrt(d);
        if (e > worst) worst = e;
        free(full);
        free(cnt);
    }
    return worst;
}


/* ---------------------------------------------------- PyTorch reference */

int test_write_file(const char *dir, const char *name, const void *data, size_t n)
{
    char path[400], err[UTIL_ERR_LEN];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return util_write_atomic(path, data, n, err);
}

void *test_read_all(const char *dir, const char *name, size_t *n)
{
    char path[400], err[UTIL_ERR_LEN], *buf = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (util_read_file(path, &buf, n, err)) return NULL;
    return buf;
}

void test_perturb_vectors(ex_model *em, float (*urand)(void))
{
    for (int i = 0; i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        if (p.ndim != 1) continue;
        bool weight = strstr(p.name, "norm") != NULL && strstr(p.name, ".weight") != NULL;
        for (int64_t j = 0; j < p.numel; j++) p.data[j] = weight ? 1.0f + 0.2f * urand() : 0.05f * urand();
    }
}

float *test_params_copy(ex_model *em)
{
    float *p0 = malloc((size_t)ex_model_num_params(em) * sizeof *p0 + 1);
    size_t off = 0;
    for (int i = 0; p0 && i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        memcpy(p0 + off, p.data, (size_t)p.numel * 4);
        off += (size_t)p.numel;
    }
    return p0;
}

double test_grad_norm(ex_model *em)
{
    double s = 0;
    for (int i = 0; i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        for (int64_t j = 0; p.grad && j < p.numel; j++) s += (double)p.grad[j] * p.grad[j];
    }
    return sqrt(s);
}

ex_optim_config test_ref_optim(double grad_norm)
{
    return (ex_optim_config){ .lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 2, .total_steps = 5, .beta1 = 0.9f,
                              .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = (float)(0.5 * grad_norm) };
}

void test_ref_optim_json(char *s, size_t cap, const ex_optim_config *oc)
{
    snprintf(s, cap,
             "\"optim\": {\"lr\": %.9g, \"min_lr\": %.9g, \"warmup_steps\": %d, \"total_steps\": %d, \"beta1\": %.9g, "
             "\"beta2\": %.9g, \"eps\": %.9g, \"weight_decay\": %.9g, \"grad_clip\": %.9g, \"steps\": 5}",
             (double)oc->lr, (double)oc->min_lr, oc->warmup_steps, oc->total_steps, (double)oc->beta1,
             (double)oc->beta2, (double)oc->eps, (double)oc->weight_decay, (double)oc->grad_clip);
}

/* Worst norm-wise relative error over tensors of (C values - ref) / ref
 * (or of the update C - p0 vs ref - p0 when p0 != NULL). */
static double worst_tensor_err(ex_model *em, const double *ref, const float *p0, bool grads, const char **worst)
{
    double w = 0;
    size_t off = 0;
    for (int i = 0; i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        const float *c = grads ? p.grad : p.data;
        double d = 0, r = 0;
        for (int64_t j = 0; j < p.numel; j++) {
            double a = c[j], b = ref[off + j];
            if (p0) { a -= p0[off + j]; b -= p0[off + j]; }
            d += (a - b) * (a - b);
            r += b * b;
        }
        double e = r > 0 ? sqrt(d / r) : sqrt(d);
        if (e > w) { w = e; *worst = p.name; }
        off += (size_t)p.numel;
    }
    return w;
}

void test_torch_compare(ex_model *em, const char *script, const char *dir, float loss0, const float *p0,
                        const ex_optim_config *oc, test_ref_pass pass, void *ctx, test_ref_result *out, char *err)
{
    memset(out, 0, sizeof *out);
    out->loss = out->grad = out->update = 1;
    out->worst_grad = out->worst_update = "";
    char cmd[1200], path[400];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s'", script, dir);
    int rc = system(cmd);
    size_t n1 = 0, n2 = 0, n3 = 0, n4 = 0, n_params = (size_t)ex_model_num_params(em);
    char *ref_loss = rc == 0 ? test_read_all(dir, "ref_loss.txt", &n1) : NULL;
    double *ref_grads = rc == 0 ? test_read_all(dir, "ref_grads.bin", &n2) : NULL;
    char *ref_losses = rc == 0 ? test_read_all(dir, "ref_adam_losses.txt", &n3) : NULL;
    double *ref_params = rc == 0 ? test_read_all(dir, "ref_adam_params.bin", &n4) : NULL;
    out->have = ref_loss && ref_grads && ref_losses && ref_params && n2 == n_params * 8 && n4 == n2;
    if (out->have) {
        double rl = atof(ref_loss);
        out->loss = fabs(loss0 - rl) / fabs(rl);
        out->grad = worst_tensor_err(em, ref_grads, NULL, true, &out->worst_grad);
        ex_zero_grads(em);
        snprintf(path, sizeof path, "%s/params.bin", dir);
        rc = ex_params_load_raw(em, path, err);
        char *lp = ref_losses;
        for (int s = 0; s < 5 && rc == 0; s++) {
            float l;
            rc = pass(ctx, em, &l, err);
            if (!rc) rc = ex_optimizer_step(em, oc, s, NULL, NULL, err);
            double r = strtod(lp, &lp), e = fabs(l - r) / fabs(r);
            if (e > out->adam_loss) out->adam_loss = e;
        }
        out->update = worst_tensor_err(em, ref_params, p0, false, &out->worst_update);
    }
    out->rc = rc;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) && !out->rc) out->rc = -1;
    util_free(ref_loss); util_free(ref_grads); util_free(ref_losses); util_free(ref_params);
}
