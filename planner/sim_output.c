/* The simulator's results as text: op labels, the JSON report, the Chrome
 * trace, and the plan's prediction rescaled to the simulated step. */
#include "planner/sim_int.h"

#include <stdio.h>

/* ---- output ---- */

void plan_sim_op_label(const plan_t *p, const plan_op *op, char *buf, size_t n)
{
    const char *mod = op->module >= 0 && op->module < p->n_modules ? p->mod[op->module].module : "";
    if (op->chunk < 0) snprintf(buf, n, "%s%s%s", plan_op_name(op->kind), *mod ? " " : "", mod);
    else if (op->module >= 0 && plan_vp(&p->mod[op->module]) > 1)   /* interleaved: the model chunk too */
        snprintf(buf, n, "%s %s c%d s%d+%d v%d", plan_op_name(op->kind), mod, op->chunk, op->sample0, op->samples, op->vchunk);
    else snprintf(buf, n, "%s %s c%d s%d+%d", plan_op_name(op->kind), mod, op->chunk, op->sample0, op->samples);
}

static cJSON *mem_json(const plan_sim_mem *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "params", m->params);
    cJSON_AddNumberToObject(o, "grads", m->grads);
    cJSON_AddNumberToObject(o, "optim", m->optim);
    cJSON_AddNumberToObject(o, "zero_buffers", m->zero_buffers);
    cJSON_AddNumberToObject(o, "activations", m->activations);
    cJSON_AddNumberToObject(o, "slots", m->slots);
    cJSON_AddNumberToObject(o, "logits", m->logits);
    cJSON_AddNumberToObject(o, "comm", m->comm);
    cJSON_AddNumberToObject(o, "workspace", m->workspace);
    cJSON_AddNumberToObject(o, "other", m->other);
    cJSON_AddNumberToObject(o, "total", m->total);
    cJSON_AddNumberToObject(o, "capacity", m->capacity);
    return o;
}

static cJSON *op_json(const plan_t *p, int rank, const plan_sim_op *o)
{
    char name[96];
    plan_sim_op_label(p, &o->op, name, sizeof name);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "rank", rank);
    cJSON_AddStringToObject(j, "op", plan_op_name(o->op.kind));
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddNumberToObject(j, "start_s", o->start_s);
    cJSON_AddNumberToObject(j, "end_s", o->end_s);
    return j;
}

cJSON *plan_sim_to_json(const plan_t *p, const plan_sim_result *r)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddNumberToObject(doc, "step_time_s", r->step_time_s);
    cJSON_AddNumberToObject(doc, "world_size", r->world_size);
    cJSON_AddStringToObject(doc, "backend", plan_backend_name(plan_backend_of(p)));
    cJSON *ranks = cJSON_AddArrayToObject(doc, "ranks");
    for (int i = 0; i < r->world_size; i++) {
        const plan_sim_rank *rk = &r->rank[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "rank", i);
        cJSON *mods = cJSON_AddArrayToObject(o, "modules");
        for (int k = 0; k < p->n_modules; k++) {
            plan_coord cd;
            if (plan_rank_coord(p, k, i, &cd)) cJSON_AddItemToArray(mods, cJSON_CreateString(p->mod[k].module));
        }
        cJSON_AddNumberToObject(o, "ops", rk->n_ops);
        cJSON_AddNumberToObject(o, "end_s", rk->end_s);
        cJSON_AddNumberToObject(o, "busy_s", rk->busy_s);
        cJSON_AddNumberToObject(o, "comm_s", rk->comm_s);
        cJSON_AddNumberToObject(o, "idle_s", rk->idle_s);
        cJSON_AddItemToObject(o, "memory", mem_json(&rk->mem));
        cJSON_AddItemToArray(ranks, o);
    }
    cJSON *path = cJSON_AddArrayToObject(doc, "critical_path");
    for (int i = 0; i < r->n_path; i++) {
        const plan_sim_ref *x = &r->path[i];
        cJSON_AddItemToArray(path, op_json(p, x->rank, &r->rank[x->rank].ops[x->op]));
    }
    return doc;
}

int plan_sim_write_trace(const char *path, const plan_t *p, const plan_sim_result *r, char *err)
{
    int total = 0;
    for (int i = 0; i < r->world_size; i++) total += r->rank[i].n_ops;
    plan_trace_event *ev = util_calloc((size_t)(total ? total : 1), sizeof *ev);
    char (*names)[96] = util_calloc((size_t)(r->world_size ? r->world_size : 1), sizeof *names);
    const char **np = util_calloc((size_t)(r->world_size ? r->world_size : 1), sizeof *np);
    if (!ev || !names || !np) {
        util_free(ev); util_free(names); util_free(np);
        return util_fail(err, UTIL_ENOMEM, "simulate: out of memory for the trace");
    }
    int n = 0;
    for (int i = 0; i < r->world_size; i++) {
        int len = snprintf(names[i], sizeof names[i], "rank %d", i);
        for (int k = 0; k < p->n_modules; k++) {
            plan_coord cd;
            if (plan_rank_coord(p, k, i, &cd) && len < (int)sizeof names[i])
                len += snprintf(names[i] + len, sizeof names[i] - (size_t)len, " %s", p->mod[k].module);
        }
        np[i] = names[i];
        for (int j = 0; j < r->rank[i].n_ops; j++) {
            const plan_sim_op *o = &r->rank[i].ops[j];
            plan_trace_event *e = &ev[n++];
            e->rank = i;
            e->lane = plan_op_props(o->op.kind)->lane;
            plan_sim_op_label(p, &o->op, e->name, sizeof e->name);
            e->start_s = o->start_s;
            e->end_s = o->end_s;
            e->chunk = o->op.chunk;
            e->samples = o->op.chunk >= 0 ? o->op.samples : -1;
            e->bytes = plan_op_props(o->op.kind)->transfer ? o->bytes : -1;
        }
    }
    int rc = plan_trace_write(path, ev, n, r->world_size, np, err);
    util_free(ev);
    util_free(names);
    util_free(np);
    return rc;
}

/* The dhp target's memory as the run holds it rank by rank (plan_sim_mem:
 * the module model's terms with each rank's own activation slots, and the
 * encoder -> LLM hand-off's buffers and held messages, which no one
 * module's memory sees): each module's peak is its ranks' most (colocated:
 * every rank's, all modules on it), and the plan fits where every rank does. */
static void simulated_memory(plan_t *p, const plan_sim_result *r)
{
    plan_prediction *pr = &p->pred;
    bool fits = true;
    for (int k = 0; k < p->n_modules; k++) pr->peak_mem_bytes[k] = 0;
    for (int i = 0; i < r->world_size; i++) {
        const plan_sim_mem *m = &r->rank[i].mem;
        if (m->total > m->capacity) fits = false;
        for (int k = 0; k < p->n_modules; k++) {
            plan_coord cd;
            bool held = p->placement == PLAN_COLOCATED || plan_rank_coord(p, k, i, &cd);
            if (held && m->total > pr->peak_mem_bytes[k]) pr->peak_mem_bytes[k] = m->total;
        }
    }
    pr->fits = fits;
}

int plan_sim_predict(plan_t *p, char *err)
{
    plan_sim_result r;
    int rc = plan_sim_run(p, NULL, &r, err);
    if (rc) return rc;
    plan_prediction *pr = &p->pred;
    double sim = r.step_time_s;
    if (p->target == PLAN_TARGET_DHP) simulated_memory(p, &r);
    plan_sim_free(&r);
    if (!(sim > 0)) return util_fail(err, UTIL_EINVAL, "simulate: the step takes no time");
    /* Rates are work per step over the step time: rescale them to the simulated step
     * (from the step they hold: plan_evaluate's, or an earlier simulation's, whose
     * analytic step stays; the search's trim simulates before the search does). */
    double scale = pr->step_time_s / sim;
    if (!pr->simulated) pr->analytic_step_time_s = pr->step_time_s;
    pr->step_time_s = sim;
    pr->samples_per_s *= scale;
    pr->vision_tokens_per_s *= scale;
    pr->tokens_per_s *= scale;
    pr->mfu *= scale;
    pr->simulated = true;
    return UTIL_OK;
}

