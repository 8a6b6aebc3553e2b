/* AdamW with decoupled weight decay, global-norm clipping and a warm-up +
 * cosine learning rate, over the elements a rank updates: every one of its
 * module, or under ZeRO its pieces of each unit (ex_shard). */
#include "executor/model_int.h"

#include <math.h>
#include <string.h>

float ex_lr_at(const ex_optim_config *c, int step)
{
    if (step < c->warmup_steps) return c->lr * (float)(step + 1) / (float)c->warmup_steps;
    int span = c->total_steps - c->warmup_steps;
    double p = (double)(step - c->warmup_steps) / (double)(span > 1 ? span : 1);
    if (p > 1) p = 1;
    return (float)(c->min_lr + (c->lr - c->min_lr) * 0.5 * (1.0 + cos(M_PI * p)));
}

/* One contiguous run of elements a rank updates, inside one tensor: its
 * weights, gradients and moments wherever the strategy keeps them. */
typedef struct {
    const ex_tensor *t;
    float *p, *g, *m, *v;
    size_t n;
} segment;

/* Calls fn on every segment of md this rank updates, tensor by tensor. */
static void for_each_segment(ex_module *md, void (*fn)(ex_module *md, const segment *s, void *ctx), void *ctx)
{
    const ex_shard *sh = &md->shard;
    for (int i = 0; i < md->n_tensors; i++) {
        const ex_tensor *t = &md->t[i];
        int u = t->d.unit;
        size_t lo, hi;
        ex_shard_range(sh, u, &lo, &hi);
        size_t a = t->off > lo ? t->off : lo, z = t->off + t->numel < hi ? t->off + t->numel : hi;
        if (a >= z) continue;
        size_t in_shard = sh->at[u] + (a - lo);
        segment s = { t, md->pshard ? md->pshard + in_shard : md->params + a,
                      md->gshard ? md->gshard + in_shard : md->grads + a,
                      md->m ? md->m + in_shard : NULL, md->v ? md->v + in_shard : NULL, z - a };
        fn(md, &s, ctx);
    }
}

/* Tensors a tp rank counts in the global norm: its own shard of a split
 * tensor, a replicated one on tp rank 0 only; a pipeline's last stage's copy
 * of a tied embedding not at all (the first stage counts the one gradient
 * both hold after EMBED_SYNC). */
static bool tp_counts(const ex_module *md, const ex_tensor *t)
{
    return !t->d.tied_copy && (t->d.split_axis >= 0 || md->tp_rank == 0);
}

typedef struct { const ex_backend *be; double ss; } sumsq_ctx;

static void sumsq_segment(ex_module *md, const segment *s, void *c)
{
    sumsq_ctx *x = c;
    if (tp_counts(md, s->t)) x->ss += x->be->sumsq(s->g, s->n);
}

static double module_sumsq(const ex_model *em, ex_module *md)
{
    sumsq_ctx c = { em->be, 0 };
    if (ex_module_trains(md)) for_each_segment(md, sumsq_segment, &c);
    return c.ss;
}

double ex_module_grad_sumsq(ex_model *em, int module_index)
{
    ex_module *md = ex_module_at(em, module_index);
    return md ? module_sumsq(em, md) : 0;
}

/* Counts each tensor on exactly one rank of the groups it is replicated over:
 * tp-sharded tensors on every tp rank of their module, replicated ones on tp
 * rank 0, vision tensors (replicated over the sp group once all-reduced) on
 * sp rank 0; a vision encoder without tp of its own on an instance whose LLM
 * is tp-parallel is replicated over the LLM's group, so counted on its rank 0. */
double ex_grad_sumsq(const ex_model *em)
{
    const ex_module *llm = &em->mod[em->m.llm];
    double ss = 0;
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        ex_module *md = (ex_module *)&em->mod[k];
        bool over_llm_group = k != em->m.llm && md->tp == 1 && llm->on && llm->tp_rank != 0;
        if (md->sp_rank != 0 || over_llm_group) continue;
        ss += module_sumsq(em, md);
    }
    return ss;
}

typedef struct {
    const ex_backend *be;
    const ex_optim_config *c;
    float lr, bc1, bc2, clip;
} adamw_ctx;

static void adamw_segment(ex_module *md, const segment *s, void *c)
{
    (void)md;
    adamw_ctx *x = c;
    if (x->clip < 1.0f) x->be->scale_inplace(s->g, x->clip, s->n);
    x->be->adamw(s->p, s->g, s->m, s->v, s->n, x->lr, x->c->beta1, x->c->beta2, x->c->eps,
                 s->t->d.decay ? x->c->weight_decay : 0.0f, x->bc1, x->bc2);
}

static int check_optim(const ex_optim_config *c, double grad_norm, char *err)
{
    if (!(c->lr >= 0) || !(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1) || !(c->eps > 0))
        return util_fail(err, UTIL_EINVAL, "executor: optimizer: need lr >= 0, 0 <= beta1, beta2 < 1, eps > 0");
    if (!isfinite(grad_norm)) return util_fail(err, UTIL_ERUNTIME, "executor: gradient norm is %g", grad_norm);
    return UTIL_OK;
}

static void zero_grads(const ex_backend *be, ex_module *md)
{
    if (md->grads) be->zero(md->grads, md->n_params);
    if (md->gshard) be->zero(md->gshard, md->shard.at[md->shard.n_units]);
}

void ex_zero_grads(ex_model *em)
{
    for (int k = 0; k < MODEL_MAX_MODULES; k++)
        if (em->mod[k].on) zero_grads(em->be, &em->mod[k]);
}

/* Clip with the global norm (torch.nn.utils.clip_grad_norm_: grads times
 * min(1, grad_clip / (norm + 1e-6))), one AdamW update at the step count
 * em->adam_t, zero the gradients: one module. */
static void update_module(ex_model *em, ex_module *md, const ex_optim_config *c, float lr, double grad_norm)
{
    if (ex_module_trains(md)) {
        adamw_ctx x = { em->be, c, lr, 1.0f - powf(c->beta1, (float)em->adam_t),
                        1.0f - powf(c->beta2, (float)em->adam_t), 1.0f };
        if (c->grad_clip > 0) {
            float coef = c->grad_clip / ((float)grad_norm + 1e-6f);
            if (coef < 1.0f) x.clip = coef;
        }
        for_each_segment(md, adamw_segment, &x);
    }
    zero_grads(em->be, md);
}

void ex_optimizer_begin(ex_model *em) { em->adam_t++; }

int ex_optimizer_apply_module(ex_model *em, const ex_optim_config *c, int step, double grad_norm,
                              int module_index, float *lr_out, char *err)
{
    int rc = check_optim(c, grad_norm, err);
    if (rc) return rc;
    ex_module *md = ex_module_at(em, module_index);
    if (!md) return util_fail(err, UTIL_EINVAL, "executor: optimizer: module %d is not on this instance", module_index);
    float lr = ex_lr_at(c, step);
    update_module(em, md, c, lr, grad_norm);
    if (lr_out) *lr_out = lr;
    return UTIL_OK;
}

int ex_optimizer_apply(ex_model *em, const ex_optim_config *c, int step, double grad_norm,
                       float *lr_out, char *err)
{
    int rc = check_optim(c, grad_norm, err);
    if (rc) return rc;
    float lr = ex_lr_at(c, step);
    ex_optimizer_begin(em);
    for (int k = 0; k < MODEL_MAX_MODULES; k++)
        if (em->mod[k].on) update_module(em, &em->mod[k], c, lr, grad_norm);
    if (lr_out) *lr_out = lr;
    return UTIL_OK;
}

/* The global norm for one instance's group: the LLM's tp group if it is
 * tp-parallel, else the vision encoder's (sp partial gradients are the
 * caller's to all-reduce first). */
int ex_optimizer_step(ex_model *em, const ex_optim_config *c, int step, float *grad_norm,
                      float *lr_out, char *err)
{
    double ss = ex_grad_sumsq(em);
    const ex_module *llm = &em->mod[em->m.llm], *md = llm->on && llm->tp > 1 ? llm : NULL;
    for (int k = 0; !md && k < MODEL_MAX_MODULES; k++)
        if (em->mod[k].on && em->mod[k].tp > 1) md = &em->mod[k];
    if (md) {
        float f = (float)ss;
        int rc = md->par.allreduce_sum(md->par.ctx, &f, 1);
        if (rc) return util_fail(err, UTIL_ERUNTIME, "executor: tensor-parallel allreduce_sum failed with %d", rc);
        ss = f;
    }
    double norm = sqrt(ss);
    if (grad_norm) *grad_norm = (float)norm;
    return ex_optimizer_apply(em, c, step, norm, lr_out, err);
}

int ex_optimizer_get_t(const ex_model *em) { return em->adam_t; }
void ex_optimizer_set_t(ex_model *em, int t) { em->adam_t = t; }
