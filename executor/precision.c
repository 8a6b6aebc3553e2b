/* bf16-mixed and -autocast in the executor (the rules and their memory:
 * planner/precision.c). The model runs on a backend table that is the
 * chosen backend's in every entry but the linears: a linear finds the
 * module whose fp32 weights hold its weight (the master), reads the same
 * offset of the module's bf16 copy (bf16-mixed: one allocation, the
 * weights' layout, a view per tensor, as llm.c's params_memory) or rounds
 * the weight into the module's cast staging (autocast: torch.autocast's
 * per-op cast), rounds its activation operand (backward: also the
 * incoming gradient) to bf16 in the module's staging buffers and calls the
 * backend's bf16 GEMM (fp32 accumulation, fp32 outputs and gradients).
 * The attention runs in bf16 where the backend has a bf16 attention
 * (set_attention_bf16: the CUDA backend's tensor-core kernels, fp32
 * statistics and accumulators), fp32 elsewhere (the CPU backend).
 * Everything else (norms, softmax, the loss, gradients, their
 * reduction, AdamW) stays fp32. A weight outside every copy or an operand
 * larger than the staging is a failure the step's sync reports.
 * Under ZeRO-3 a module's weights live in its gathered units: the strategy
 * registers those buffers (ex_precision_add_weights) and the linears round
 * the weight they read into the cast staging, as autocast's; bf16-mixed's
 * bf16 shard is the strategy's (executor/dp_zero3_bf16.c), rounded when
 * ex_precision_refresh calls the hook it registered. */
#include "executor/precision.h"

#include <stdio.h>
#include <string.h>

#define MAX_MODULES 64

static struct {
    const ex_backend *base;
    ex_backend table;
    bool copy;                     /* bf16-mixed: a persistent copy; autocast: a cast per linear */
    ex_module *mod[MAX_MODULES];   /* the modules with a bf16 copy */
    struct { ex_module *md; const float *at; size_t n; } gathered[MAX_MODULES * 4];   /* ZeRO-3 units */
    struct { void (*fn)(void *); void *ctx; } refresh[MAX_MODULES];
    char failure[UTIL_ERR_LEN];
} g;

/* Keeps the first failure until the next sync. */
static void fail_once(const ex_module *md, size_t need, size_t cap)
{
    if (g.failure[0]) return;
    if (!md) snprintf(g.failure, sizeof g.failure, "bf16 linears: a linear's weight is outside every module's fp32 weights");
    else snprintf(g.failure, sizeof g.failure, "bf16 linears: module %s: a linear's operand of %zu elements exceeds its bf16 staging of %zu",
                  md->mm.name, need, cap);
}

static ex_module *owner_of(const float *w)
{
    for (int i = 0; i < MAX_MODULES; i++) {
        ex_module *md = g.mod[i];
        if (md && md->params && w >= md->params && w < md->params + md->n_params) return md;
    }
    for (size_t i = 0; i < sizeof g.gathered / sizeof g.gathered[0]; i++)
        if (g.gathered[i].md && w >= g.gathered[i].at && w < g.gathered[i].at + g.gathered[i].n) return g.gathered[i].md;
    return NULL;
}

/* The module holding w with room for operands of `need` elements, or NULL (failure noted). */
static ex_module *module_for(const float *w, size_t need)
{
    ex_module *md = owner_of(w);
    if (!md || need > md->stage_cap) {
        fail_once(md, need, md ? md->stage_cap : 0);
        return NULL;
    }
    return md;
}

/* The bf16 weight w[o, in] the linear reads: the copy's view, or w rounded into the cast staging. */
static const uint16_t *bf16_weight(ex_module *md, const float *w, int in, int o)
{
    if (md->w16) return md->w16 + (w - md->params);
    size_t n = (size_t)o * in;
    if (n > md->wcast_cap) {
        fail_once(md, n, md->wcast_cap);
        return NULL;
    }
    g.base->to_bf16(md->wcast16, w, n);
    return md->wcast16;
}

static void mixed_linear_forward(float *out, const float *inp, const float *w, const float *b, int n, int in, int o)
{
    if (n <= 0 || o <= 0) return;
    ex_module *md = module_for(w, (size_t)n * (size_t)(in > 0 ? in : 0));
    const uint16_t *w16 = md ? bf16_weight(md, w, in, o) : NULL;
    if (!w16) return;
    g.base->to_bf16(md->stage16, inp, (size_t)n * in);
    g.base->linear_forward_bf16(out, md->stage16, w16, b, n, in, o);
}

static void mixed_linear_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                  const float *w, int n, int in, int o)
{
    if (n <= 0 || o <= 0) return;
    if ((!dinp && !dw) || in <= 0) {   /* the bias gradient alone: fp32 */
        g.base->linear_backward(NULL, NULL, db, dout, inp, w, n, in, o);
        return;
    }
    size_t ni = (size_t)n * in, nd = (size_t)n * o;
    ex_module *md = module_for(w, ni > nd ? ni : nd);
    const uint16_t *w16 = md ? bf16_weight(md, w, in, o) : NULL;
    if (!w16) return;
    uint16_t *a16 = md->stage16, *d16 = md->stage16 + md->stage_cap;
    if (dw) g.base->to_bf16(a16, inp, ni);
    g.base->to_bf16(d16, dout, nd);
    g.base->linear_backward_bf16(dinp, dw, db, dout, d16, a16, w16, n, in, o);
}

static int mixed_sync(char *err)
{
    int rc = g.base->sync(err);
    if (!rc && g.failure[0]) {
        rc = util_fail(err, UTIL_ERUNTIME, "%s", g.failure);
        g.failure[0] = '\0';
    }
    return rc;
}

const ex_backend *ex_precision_backend(const ex_backend *base, const plan_options *o)
{
    /* the attention (a backend's own entries) in the process's precision */
    if (base && base->set_attention_bf16) base->set_attention_bf16(plan_runs_bf16(o));
    if (!plan_runs_bf16(o) || !base) return base;
    g.copy = plan_weight_copy_bytes(NULL, o) > 0;
    if (g.base != base) {
        g.base = base;
        g.table = *base;
        g.table.linear_forward = mixed_linear_forward;
        g.table.linear_backward = mixed_linear_backward;
        g.table.sync = mixed_sync;
    }
    return &g.table;
}

bool ex_precision_is_mixed(const ex_backend *be) { return be && g.base && be == &g.table; }

static int enroll(ex_module *md)
{
    for (int i = 0; i < MAX_MODULES; i++)
        if (!g.mod[i]) {
            g.mod[i] = md;
            return UTIL_OK;
        }
    return UTIL_ENOMEM;
}

/* autocast, ZeRO-3: the largest tensor the rank holds (plan_weight_cast_elems over the same list) */
static int cast_staging(ex_module *md, char *err)
{
    for (int i = 0; i < md->n_tensors; i++)
        if (md->t[i].numel > md->wcast_cap) md->wcast_cap = md->t[i].numel;
    md->wcast16 = md->be->alloc((md->wcast_cap ? md->wcast_cap : 1) * sizeof(uint16_t), UTIL_MEM_ACTIV);
    if (!md->wcast16)
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for the bf16 weight cast (%zu elements)", md->mm.name, md->wcast_cap);
    return UTIL_OK;
}

int ex_precision_attach(ex_model *em, char *err)
{
    if (!ex_precision_is_mixed(em->be)) return UTIL_OK;
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        ex_module *md = &em->mod[k];
        if (!md->on) continue;
        md->bf16 = true;
        if (enroll(md)) return util_fail(err, UTIL_ENOMEM, "executor: more than %d modules with bf16 linears", MAX_MODULES);
        if (g.copy) {
            md->w16 = md->be->alloc((md->n_params ? md->n_params : 1) * sizeof(uint16_t), UTIL_MEM_PARAMS);
            if (!md->w16)
                return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for the bf16 copy of %zu parameters", md->mm.name, md->n_params);
            continue;
        }
        int rc = cast_staging(md, err);
        if (rc) return rc;
    }
    ex_precision_refresh(em);
    return UTIL_OK;
}

void ex_precision_refresh(ex_model *em)
{
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        ex_module *md = &em->mod[k];
        if (md->on && md->w16 && md->params) g.base->to_bf16(md->w16, md->params, md->n_params);
    }
    for (int i = 0; i < MAX_MODULES; i++)
        if (g.refresh[i].fn) g.refresh[i].fn(g.refresh[i].ctx);
}

int ex_precision_gathered(ex_module *md, char *err)
{
    if (!md->bf16 || md->wcast16) return UTIL_OK;
    md->be->release(md->w16);   /* bf16-mixed: the shard's copy is the strategy's */
    md->w16 = NULL;
    return cast_staging(md, err);
}

int ex_precision_add_weights(ex_module *md, const float *at, size_t n)
{
    for (size_t i = 0; i < sizeof g.gathered / sizeof g.gathered[0]; i++)
        if (!g.gathered[i].md) {
            g.gathered[i].md = md, g.gathered[i].at = at, g.gathered[i].n = n;
            return UTIL_OK;
        }
    return UTIL_ENOMEM;
}

int ex_precision_on_refresh(void (*fn)(void *), void *ctx)
{
    int at = -1;
    for (int i = 0; i < MAX_MODULES; i++) {
        if (g.refresh[i].fn && g.refresh[i].ctx == ctx) g.refresh[i].fn = NULL, g.refresh[i].ctx = NULL;
        if (at < 0 && !g.refresh[i].fn) at = i;
    }
    if (!fn) return UTIL_OK;
    if (at < 0) return UTIL_ENOMEM;
    g.refresh[at].fn = fn, g.refresh[at].ctx = ctx;
    return UTIL_OK;
}

bool ex_precision_keeps_copy(const ex_backend *be) { return ex_precision_is_mixed(be) && g.copy; }

int ex_precision_reserve(ex_module *md, const plan_act_rows *rows, char *err)
{
    if (!md->bf16) return UTIL_OK;
    size_t need = (size_t)plan_gemm_staging_elems(&md->mm, &md->strat, md->stage_index, rows);
    if (need <= md->stage_cap && md->stage16) return UTIL_OK;
    md->be->release(md->stage16);
    md->stage_cap = 0;
    md->stage16 = md->be->alloc(2 * (need ? need : 1) * sizeof(uint16_t), UTIL_MEM_ACTIV);
    if (!md->stage16)
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for the bf16 staging (%zu elements)", md->mm.name, 2 * need);
    md->stage_cap = need ? need : 1;
    return UTIL_OK;
}

void ex_precision_detach(ex_module *md)
{
    for (int i = 0; i < MAX_MODULES; i++)
        if (g.mod[i] == md) g.mod[i] = NULL;
    for (size_t i = 0; i < sizeof g.gathered / sizeof g.gathered[0]; i++)
        if (g.gathered[i].md == md) g.gathered[i].md = NULL;
    if (md->be) {
        md->be->release(md->w16);
        md->be->release(md->wcast16);
        md->be->release(md->stage16);
    }
    md->w16 = md->wcast16 = md->stage16 = NULL;
    md->stage_cap = md->wcast_cap = 0;
    md->bf16 = false;
}
