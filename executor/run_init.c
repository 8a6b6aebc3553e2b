/* `dhp run --init-from DIR`: a Hugging Face checkpoint as the starting
 * weights. Every rank checks the whole checkpoint against the plan's model
 * (ex_hf_open: names, shapes, config.json) before training starts, then
 * reads the tensors of the modules it runs, keeps its tp slice of each
 * (run_ckpt_take_shard) and hands the module's flat parameters to its
 * data-parallel strategy (run_dp_scatter_state), as a resume does; the
 * AdamW moments start at zero. */
#include "executor/run_internal.h"

#include <string.h>

static int load_module(run_ctx *r, ex_hf *h, int k, char *err)
{
    run_module *m = &r->mod[k];
    const char *mname = r->plan.model.mod[k].name;
    size_t plen = strlen(mname);
    float *flat = util_calloc(m->n ? m->n : 1, sizeof *flat), *whole = NULL;
    int rc = flat ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "init-from: out of memory");
    for (int i = 0; !rc && i < ex_param_count(r->em); i++) {
        ex_param t;
        if (ex_param_get(r->em, i, &t) || t.module_index != k) continue;
        size_t full = (size_t)(t.full_shape[0] * (t.ndim > 1 ? t.full_shape[1] : 1));
        util_free(whole);
        if (!(whole = util_malloc(full * sizeof *whole))) { rc = util_fail(err, UTIL_ENOMEM, "init-from: out of memory"); break; }
        /* the executor's names are the module's name, a dot, and plan_module_tensors' name */
        if (strncmp(t.name, mname, plen) || t.name[plen] != '.')
            rc = util_fail(err, UTIL_EINVAL, "init-from: tensor %s is not in module %s", t.name, mname);
        if (!rc) rc = ex_hf_read(h, k, t.name + plen + 1, whole, full, err);
        if (!rc) run_ckpt_take_shard(&t, whole, flat + t.offset);
    }
    if (!rc) rc = run_dp_scatter_state(&m->dp, EX_BUF_PARAMS, flat, err);
    util_free(whole);
    util_free(flat);
    return rc;
}

int run_init_from(run_ctx *r, char *err)
{
    ex_hf *h;
    int rc = ex_hf_open(r->o->init_from, &r->plan.model, &h, err);
    for (int k = 0; !rc && k < r->plan.n_modules; k++)
        if (r->mod[k].on) rc = load_module(r, h, k, err);
    ex_hf_close(h);
    return rc;
}
