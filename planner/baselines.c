/* Baselines, evaluated on the same cost model as the planner's choice:
 *  zero3        DeepSpeed ZeRO-3: every module data parallel over all GPUs, >= 1 sample per GPU
 *  tp           Megatron-style TP (within a node) for every module, DP across, distributed optimizer
 *  homogeneous  the best single strategy applied to every module (colocated)
 *  sp-tp        Ulysses SP for the encoders + TP for the LLM, colocated (Ray's published "DHP" setting)
 * Each takes the fastest recompute / micro-batch variant that fits; when none
 * fits, the variant with the least memory, marked OOM. */
#include "planner/planner_int.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *baseline_names[PLAN_NBASE] = { "zero3", "tp", "homogeneous", "sp-tp" };
const char *plan_baseline_name(plan_baseline b) { return baseline_names[b]; }

PLAN_ENUM_PARSE(plan_baseline_parse, plan_baseline, baseline_names, PLAN_NBASE)

/* Largest power of two <= cap dividing every module's heads and kv_heads. */
static int widest_split(const model_t *m, int cap, bool encoders_only, bool llm_only)
{
    int best = 1;
    for (int d = 1; d <= cap; d *= 2) {
        bool ok = true;
        for (int k = 0; k < m->n_modules; k++) {
            if ((encoders_only && k == m->llm) || (llm_only && k != m->llm)) continue;
            if (m->mod[k].heads % d || m->mod[k].kv_heads % d) ok = false;
        }
        if (ok) best = d;
    }
    return best;
}

typedef struct { int tp, sp, pp, zero; bool seqpar; } degrees;

/* Colocated plan with per-module degrees on G GPUs of pool 0; tries every
 * recompute and micro-batch and keeps the best (fitting first). */
static int best_colocated(plan_t *out, const model_t *m, const cost_cluster *c, const plan_workload *w,
                          const plan_options *o, const degrees *deg, int G, char *err)
{
    bool have = false;
    plan_t trial;
    int max_dp = 0;
    for (int k = 0; k < m->n_modules; k++) {
        int d = G / (deg[k].tp * deg[k].sp * deg[k].pp);
        if (d < 1 || G % (deg[k].tp * deg[k].sp * deg[k].pp))
            return util_fail(err, UTIL_EINFEASIBLE, "%s: degrees do not divide %d GPUs", m->mod[k].name, G);
        if (d > max_dp) max_dp = d;
    }
    for (int rc = 0; rc < 3; rc++)
    for (int S = max_dp; S <= w->global_batch; S *= 2) {
        if (w->global_batch % S) continue;
        plan_init(&trial, m, c, w, o);
        trial.placement = PLAN_COLOCATED;
        bool ok = true;
        for (int k = 0; k < m->n_modules; k++) {
            plan_module *s = &trial.mod[k];
            s->pool = 0;
            s->tp = deg[k].tp; s->sp = deg[k].sp; s->pp = deg[k].pp;
            s->dp = G / (s->tp * s->sp * s->pp);
            s->zero = s->dp * s->sp > 1 ? deg[k].zero : 0;
            s->seq_parallel = deg[k].seqpar;
            s->recompute = (plan_recompute)rc;
            if (S % s->dp) { ok = false; break; }
            s->micro_batch = S / s->dp;
        }
        if (!ok) continue;
        char e[UTIL_ERR_LEN];
        if (plan_assemble(&trial, o, e)) continue;
        bool better = !have
            || (trial.pred.fits && !out->pred.fits)
            || (trial.pred.fits == out->pred.fits && trial.pred.fits && trial.pred.step_time_s < out->pred.step_time_s)
            || (!trial.pred.fits && !out->pred.fits && trial.pred.peak_mem_bytes[0] < out->pred.peak_mem_bytes[0]);
        if (better) { *out = trial; have = true; }
    }
    if (!have) return util_fail(err, UTIL_EINFEASIBLE, "no valid variant of these degrees for this workload");
    return UTIL_OK;
}

static int make_homogeneous(plan_t *out, const model_t *m, const cost_cluster *c, const plan_workload *w,
                            const plan_options *o, int G, char *err)
{
    bool have = false;
    int gpn = c->pool[0].gpus_per_node;
    for (int tp = 1; tp <= gpn && tp <= G; tp *= 2)
    for (int sp = 1; tp * sp <= G; sp *= 2)
    for (int pp = 1; tp * sp * pp <= G && pp <= 8; pp *= 2)
    for (int zero = 0; zero <= 3; zero++) {
        if (G % (tp * sp * pp)) continue;
        degrees deg[MODEL_MAX_MODULES];
        for (int k = 0; k < m->n_modules; k++)
            deg[k] = (degrees){ tp, sp, pp, zero, tp > 1 && k == m->llm };
        plan_t trial;
        char e[UTIL_ERR_LEN];
        if (best_colocated(&trial, m, c, w, o, deg, G, e)) continue;
        bool better = !have || (trial.pred.fits && !out->pred.fits)
            || (trial.pred.fits == out->pred.fits && trial.pred.step_time_s < out->pred.step_time_s);
        if (better) { *out = trial; have = true; }
    }
    if (!have) return util_fail(err, UTIL_EINFEASIBLE, "no homogeneous strategy is valid for this model");
    return UTIL_OK;
}

int plan_baseline_make(plan_baseline b, const model_t *m, const cost_cluster *c, const plan_workload *w,
                       const plan_options *o, plan_t *p, char *err)
{
    int G = cost_pool_gpus(&c->pool[0]);
    int gpn = c->pool[0].gpus_per_node;
    degrees deg[MODEL_MAX_MODULES];
    plan_workload work = *w;
    int rc;
    switch (b) {
    case PLAN_BASE_ZERO3:
        /* Every GPU needs at least one sample: the batch rounds up to a multiple of G. */
        if (work.global_batch % G) work.global_batch = (work.global_batch / G + 1) * G;
        for (int k = 0; k < m->n_modules; k++) deg[k] = (degrees){ 1, 1, 1, 3, false };
        rc = best_colocated(p, m, c, &work, o, deg, G, err);
        break;
    case PLAN_BASE_TP: {
        int tp = widest_split(m, gpn, false, false);
        for (int k = 0; k < m->n_modules; k++) deg[k] = (degrees){ tp, 1, 1, 1, k == m->llm && tp > 1 };
        rc = best_colocated(p, m, c, &work, o, deg, G, err);
        break;
    }
    case PLAN_BASE_SP_TP: {
        int sp = widest_split(m, gpn, true, false), tp = widest_split(m, gpn, false, true);
        for (int k = 0; k < m->n_modules; k++)
            deg[k] = k == m->llm ? (degrees){ tp, 1, 1, 1, tp > 1 } : (degrees){ 1, sp, 1, 1, false };
        rc = best_colocated(p, m, c, &work, o, deg, G, err);
        break;
    }
    case PLAN_BASE_HOMOGENEOUS:
        rc = make_homogeneous(p, m, c, &work, o, G, err);
        break;
    default:
        return util_fail(err, UTIL_EINVAL, "unknown baseline %d", (int)b);
    }
    if (!rc) util_strlcpy(p->label, baseline_names[b], sizeof p->label);
    /* Priced like plan_search's plans: simulated where the schedule runs it. */
    if (!rc) plan_sim_predict(p, NULL);
    return rc;
}

/* ---- explicit strategies: "vision:sp=8,rc=full;llm:tp=8,zero=1" ---- */

static int parse_kv(plan_module *s, const char *key, const char *val, int *gpus, char *err)
{
    char *end;
    if (!strcmp(key, "rc") || !strcmp(key, "recompute")) {
        char why[UTIL_ERR_LEN];
        if (plan_recompute_parse(val, &s->recompute, why)) return util_fail(err, UTIL_EINVAL, "--strategy: %s: %s", key, why);
        return UTIL_OK;
    }
    if (!strcmp(key, "cp")) {
        /* the LLM's context parallelism: Ulysses all-to-alls or ring attention (plan_cp_of) */
        if (!plan_cp_parse(val, &s->cp))
            return util_fail(err, UTIL_EINVAL, "--strategy: cp=%s: ulysses, ring or auto", val);
        return UTIL_OK;
    }
    if (!strcmp(key, "split") && !strcmp(val, "ends")) {
        /* the even split with the embedding and the head a block each (plan_module.split_ends) */
        s->split_ends = true;
        return UTIL_OK;
    }
    if (!strcmp(key, "split")) {
        /* blocks per pipeline stage, "7:8:8:7" (plan_module.stage_layers); pp is their count */
        int n = 0;
        memset(s->stage_layers, 0, sizeof s->stage_layers);
        for (const char *q = val; *q; q = *end == ':' ? end + 1 : end) {
            long b = strtol(q, &end, 10);
            if (end == q || b < 1 || b > (1 << 20) || (*end && *end != ':') || n == PLAN_MAX_PP)
                return util_fail(err, UTIL_EINVAL, "--strategy: split=%s: blocks per stage, at least 1 each, e.g. 7:8:8:7 (at most %d stages), or 'ends'",
                                 val, PLAN_MAX_PP);
            s->stage_layers[n++] = (int)b;
            if (!*end) break;
        }
        if (n == 0) return util_fail(err, UTIL_EINVAL, "--strategy: split is empty");
        s->pp = n;
        return UTIL_OK;
    }
    long v = strtol(val, &end, 10);
    if (*val == '\0' || *end != '\0' || v < 0 || v > (1 << 24))
        return util_fail(err, UTIL_EINVAL, "--strategy: %s=%s: not a non-negative integer", key, val);
    if (!strcmp(key, "dp")) s->dp = (int)v;
    else if (!strcmp(key, "tp")) s->tp = (int)v;
    else if (!strcmp(key, "sp")) s->sp = (int)v;
    else if (!strcmp(key, "pp")) s->pp = (int)v;
    else if (!strcmp(key, "zero")) s->zero = (int)v;
    else if (!strcmp(key, "mb")) s->micro_batch = (int)v;
    else if (!strcmp(key, "seqpar")) s->seq_parallel = v != 0;
    else if (!strcmp(key, "pool")) s->pool = (int)v;
    else if (!strcmp(key, "gpus")) *gpus = (int)v;
    else if (!strcmp(key, "vp")) s->vp = (int)v;
    else if (!strcmp(key, "rc_layers")) s->recompute_layers = (int)v;
    else return util_fail(err, UTIL_EINVAL,
                          "--strategy: unknown key '%s' (dp, tp, sp, cp, pp, split, vp, zero, mb, rc, rc_layers, seqpar, pool, gpus)", key);
    if (v == 0 && strcmp(key, "zero") && strcmp(key, "seqpar") && strcmp(key, "pool"))
        return util_fail(err, UTIL_EINVAL, "--strategy: %s must be >= 1", key);
    return UTIL_OK;
}

static int parse_spec(const char *spec, const model_t *m, plan_module *mods, int *gpus, bool *given_dp, char *err)
{
    char buf[1024];
    if (strlen(spec) >= sizeof buf) return util_fail(err, UTIL_EINVAL, "--strategy: too long");
    util_strlcpy(buf, spec, sizeof buf);
    char *save_mod = NULL;
    for (char *part = strtok_r(buf, ";", &save_mod); part; part = strtok_r(NULL, ";", &save_mod)) {
        char *colon = strchr(part, ':');
        if (!colon) return util_fail(err, UTIL_EINVAL, "--strategy: '%s' is not MODULE:key=value,...", part);
        *colon = '\0';
        while (isspace((unsigned char)*part)) part++;
        int k = model_find(m, part);
        if (k < 0) return util_fail(err, UTIL_EINVAL, "--strategy: model '%s' has no module '%s'", m->name, part);
        char *save_kv = NULL;
        for (char *kv = strtok_r(colon + 1, ",", &save_kv); kv; kv = strtok_r(NULL, ",", &save_kv)) {
            char *eq = strchr(kv, '=');
            if (!eq) return util_fail(err, UTIL_EINVAL, "--strategy: '%s' is not key=value", kv);
            *eq = '\0';
            if (!strcmp(kv, "dp")) given_dp[k] = true;
            int rc = parse_kv(&mods[k], kv, eq + 1, &gpus[k], err);
            if (rc) return rc;
        }
    }
    return UTIL_OK;
}

int plan_from_strategy(const char *spec, const model_t *m, const cost_cluster *c, const plan_workload *w,
                       plan_placement pl, int gpus, int n_micro, plan_t *p, char *err)
{
    plan_options o;
    plan_options_default(&o);
    return plan_from_strategy_opts(spec, m, c, w, pl, gpus, n_micro, &o, p, err);
}

int plan_from_strategy_opts(const char *spec, const model_t *m, const cost_cluster *c, const plan_workload *w,
                            plan_placement pl, int gpus, int n_micro, const plan_options *opt, plan_t *p, char *err)
{
    plan_options o = *opt;
    plan_init(p, m, c, w, &o);
    p->placement = pl;
    p->n_micro = pl == PLAN_COLOCATED ? 1 : (n_micro > 0 ? n_micro : 1);
    int mod_gpus[MODEL_MAX_MODULES] = { 0 };
    bool given_dp[MODEL_MAX_MODULES] = { false };
    bool given_mb[MODEL_MAX_MODULES] = { false };
    for (int k = 0; k < m->n_modules; k++)
        p->mod[k] = (plan_module){ .dp = 1, .tp = 1, .sp = 1, .pp = 1, .zero = -1, .micro_batch = 0 };
    int rc = parse_spec(spec ? spec : "", m, p->mod, mod_gpus, given_dp, err);
    if (rc) return rc;
    int S = 0;
    for (int k = 0; k < m->n_modules; k++) {
        plan_module *s = &p->mod[k];
        int g = pl == PLAN_COLOCATED ? (gpus > 0 ? gpus : cost_pool_gpus(&c->pool[0])) : mod_gpus[k];
        if (s->pool < 0 || s->pool >= c->n_pools)
            return util_fail(err, UTIL_EINVAL, "--strategy: %s: pool %d does not exist", m->mod[k].name, s->pool);
        if (!given_dp[k] && g > 0) {
            int mp = s->tp * s->sp * s->pp;
            if (g % mp) return util_fail(err, UTIL_EINVAL, "--strategy: %s: tp*sp*pp = %d does not divide %d GPUs",
                                         m->mod[k].name, mp, g);
            s->dp = g / mp;
        }
        if (s->zero < 0) s->zero = s->dp * s->sp > 1 ? 1 : 0;
        if (s->micro_batch > 0) given_mb[k] = true;
        if (pl == PLAN_COLOCATED && s->dp > S) S = s->dp;
    }
    for (int k = 0; k < m->n_modules; k++) {
        plan_module *s = &p->mod[k];
        if (k == m->llm && s->tp > 1 && !strstr(spec ? spec : "", "seqpar")) s->seq_parallel = true;
        if (given_mb[k]) continue;
        if (pl == PLAN_COLOCATED) s->micro_batch = S % s->dp == 0 ? S / s->dp : 1;
        else {
            int chunk = w->global_batch / p->n_micro;
            s->micro_batch = chunk / s->dp > 0 ? chunk / s->dp : 1;
        }
    }
    util_strlcpy(p->label, "custom", sizeof p->label);
    return plan_assemble(p, &o, err);
}
