/* Interleaved virtual pipeline stages (planner/schedule.c's emit_1f1b with
 * vp model chunks per rank): Megatron-LM's interleaved 1F1B (Narayanan et
 * al. SC'21 sec. 2.2.2; Megatron-Core's forward_backward_pipelining_with_
 * interleaving), checked against its rules on every rank. */
#include "tests/test.h"
#include "planner/planner.h"

#include <stdio.h>
#include <string.h>

/* tiny-vl on 8xh100, its LLM with `layers` blocks on pp stages of vp chunks:
 * m chunks of one sample, one micro-batch each, through the LLM's pipeline. */
static int tiny_vl_llm_layers(int layers, model_t *m, cost_cluster *c)
{
    char err[UTIL_ERR_LEN];
    if (model_load("tiny-vl", m, err) || cost_cluster_load("8xh100", c, err)) return UTIL_EINVAL;
    m->mod[m->llm].layers = layers;
    return UTIL_OK;
}

static int make_vp_plan(int pp, int vp, int m, int layers, plan_t *p)
{
    model_t md;
    cost_cluster c;
    char err[UTIL_ERR_LEN], spec[128];
    if (tiny_vl_llm_layers(layers, &md, &c)) return UTIL_EINVAL;
    plan_workload w = { .global_batch = m, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 16 };
    snprintf(spec, sizeof spec, "vision:gpus=1;llm:gpus=%d,pp=%d,vp=%d,mb=1", pp, pp, vp);
    int rc = plan_from_strategy(spec, &md, &c, &w, PLAN_DISAGGREGATED, 1 + pp, m, p, err);
    if (rc) fprintf(stderr, "make_vp_plan: %s\n", err);
    return rc;
}

/* Megatron-Core's warm-up (get_pp_rank_microbatches with
 * microbatch_group_size_per_vp_stage = pp), capped at the n units. */
static int megatron_warmup(int pp, int vp, int rank, int n)
{
    int w = vp > 1 ? (pp - rank - 1) * 2 + (vp - 1) * pp : pp - rank - 1;
    return w < n ? w : n;
}

typedef struct { int mb, v; bool fwd, bwd; } unit_op;

/* The rank's compute ops in order: FORWARD, BACKWARD, FORWARD_BACKWARD (both). */
static int compute_ops(const plan_t *p, const plan_schedule *s, unit_op *out, int cap)
{
    int n = 0;
    for (int i = 0; i < s->n && n < cap; i++) {
        const plan_op *o = &s->op[i];
        if (o->module != p->model.llm) continue;
        bool f = o->kind == PLAN_OP_FORWARD || o->kind == PLAN_OP_FORWARD_BACKWARD;
        bool b = o->kind == PLAN_OP_BACKWARD || o->kind == PLAN_OP_FORWARD_BACKWARD;
        if (f || b) out[n++] = (unit_op){ o->sample0, o->vchunk, f, b };
    }
    return n;
}

/* The sample0 sequence of a rank's hops of one kind through model chunk v. */
static int hop_seq(const plan_t *p, const plan_schedule *s, plan_op_kind kind, int v, int *out, int cap)
{
    int n = 0;
    for (int i = 0; i < s->n && n < cap; i++)
        if (s->op[i].kind == kind && s->op[i].module == p->model.llm && s->op[i].vchunk == v) out[n++] = s->op[i].sample0;
    return n;
}

static void check_rank(const plan_t *p, int pp, int vp, int m, int stage, plan_schedule *all)
{
    enum { CAP = 512 };
    unit_op u[CAP];
    const plan_schedule *s = &all[stage];
    int n = compute_ops(p, s, u, CAP), units = m * vp, w = megatron_warmup(pp, vp, stage, units);
    bool fwd_done[CAP] = { false }, bwd_done[CAP] = { false };
    int live = 0, peak = 0, k_fwd = 0, k_bwd = 0, live_v[PLAN_MAX_VP] = { 0 }, peak_v[PLAN_MAX_VP] = { 0 };
    for (int i = 0; i < n; i++) {
        int id = u[i].mb * vp + u[i].v;
        CHECK_MSG(u[i].mb >= 0 && u[i].mb < m && u[i].v >= 0 && u[i].v < vp, "stage %d: op %d outside the units", stage, i);
        if (u[i].fwd) {
            /* the k-th forward: micro-batch group k / (pp vp), chunk (k / pp) mod vp */
            CHECK_MSG(u[i].v == k_fwd / pp % vp && u[i].mb == k_fwd / (pp * vp) * pp + k_fwd % pp,
                      "pp %d vp %d m %d stage %d: forward %d is micro-batch %d chunk %d", pp, vp, m, stage, k_fwd, u[i].mb, u[i].v);
            CHECK(!fwd_done[id]);
            fwd_done[id] = true;
            k_fwd++;
            live_v[u[i].v]++;
            if (++live > peak) {
                peak = live;
                memcpy(peak_v, live_v, sizeof peak_v);
            }
        }
        if (u[i].bwd) {
            /* backwards in the same table, the chunks reversed */
            CHECK_MSG(u[i].v == vp - 1 - k_bwd / pp % vp && u[i].mb == k_bwd / (pp * vp) * pp + k_bwd % pp,
                      "pp %d vp %d m %d stage %d: backward %d is micro-batch %d chunk %d", pp, vp, m, stage, k_bwd, u[i].mb, u[i].v);
            CHECK_MSG(fwd_done[id] && !bwd_done[id], "stage %d: backward of micro-batch %d chunk %d before its forward", stage, u[i].mb, u[i].v);
            bwd_done[id] = true;
            k_bwd++;
            live--;
            live_v[u[i].v]--;
        }
        /* the warm-up: w forwards, and the one of the first 1F1B step, before the first backward */
        if (k_bwd == 0 && u[i].fwd && !u[i].bwd) CHECK(k_fwd <= w + 1);
    }
    CHECK_EQ_INT(k_fwd, units);
    CHECK_EQ_INT(k_bwd, units);
    CHECK_MSG(peak == (w + 1 < units ? w + 1 : units), "pp %d vp %d m %d stage %d: %d in flight, Megatron's %d", pp, vp, m, stage, peak,
              w + 1 < units ? w + 1 : units);
    /* the memory model's count of the peak, chunk by chunk, is the schedule's */
    int slots[PLAN_MAX_VP];
    CHECK_EQ_INT(plan_pipeline_peak_units(pp, vp, stage, units, slots), peak);
    for (int v = 0; v < vp; v++)
        CHECK_MSG(slots[v] == peak_v[v], "pp %d vp %d m %d stage %d chunk %d: %d units at the peak, the schedule's %d", pp, vp, m,
                  stage, v, slots[v], peak_v[v]);
    int per_chunk = 0;
    for (int v = 0; v < vp; v++) per_chunk += s->vslots[v];
    CHECK_EQ_INT(per_chunk, s->slots[p->model.llm]);
    CHECK(s->slots[p->model.llm] >= (vp > 1 ? peak : 1));
    if (vp == 1) {   /* today's 1F1B: slot = forward index mod the in-flight count, the last stage fused */
        int k = 0;
        for (int i = 0; i < s->n; i++)
            if (s->op[i].kind == PLAN_OP_FORWARD) CHECK_EQ_INT(s->op[i].slot, k++ % (w + 1));
            else if (s->op[i].kind == PLAN_OP_FORWARD_BACKWARD) { CHECK_EQ_INT(s->op[i].slot, -1); CHECK_EQ_INT(stage, pp - 1); k++; }
        CHECK_EQ_INT(s->slots[p->model.llm], stage == pp - 1 ? 1 : w + 1);
    }
    /* chunk c's activations leave the last stage for chunk c + 1 on the first, in the order the first stage takes them */
    if (stage == pp - 1)
        for (int c = 0; c + 1 < vp; c++) {
            int a[CAP], b[CAP];
            int na = hop_seq(p, s, PLAN_OP_SEND_STAGE, c, a, CAP), nb = hop_seq(p, &all[0], PLAN_OP_RECV_STAGE, c + 1, b, CAP);
            CHECK_EQ_INT(na, m);
            CHECK_EQ_INT(nb, m);
            for (int i = 0; i < na && i < nb; i++) CHECK_EQ_INT(a[i], b[i]);
            int last = plan_coord_rank(p, p->model.llm, &(plan_coord){ .pp = pp - 1 });
            CHECK_EQ_INT(plan_stage_peer(p, p->model.llm, last, c, +1), plan_coord_rank(p, p->model.llm, &(plan_coord){ .pp = 0 }));
        }
}

TEST(schedule_interleaved_1f1b_follows_megatron)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    int pps[] = { 2, 4 };
    for (int a = 0; a < 2; a++)
        for (int vp = 1; vp <= 3; vp++)
            for (int g = 1; g <= 3; g++) {
                int pp = pps[a], m = g * pp;
                CHECK_OK(make_vp_plan(pp, vp, m, pp * vp, &p));
                plan_schedule s[4];
                int L = p.model.llm;
                for (int st = 0; st < pp; st++)
                    CHECK_OK(plan_schedule_rank(&p, plan_coord_rank(&p, L, &(plan_coord){ .pp = st }), &s[st], err));
                for (int st = 0; st < pp; st++) check_rank(&p, pp, vp, m, st, s);
                for (int st = 0; st < pp; st++) plan_schedule_free(&s[st]);
                /* every rank's hops are matched and the step runs to its end (no wait on a message never sent) */
                plan_sim_result r;
                int rc = plan_sim_run(&p, NULL, &r, err);
                CHECK_MSG(rc == UTIL_OK, "pp %d vp %d m %d: %s", pp, vp, m, err);
                plan_sim_free(&r);
            }
}

/* Rank stage i holds chunks i, i + pp, ...: blocks L / (pp vp) each, the
 * embedding on the first chunk of stage 0 and the head on the last of stage
 * pp - 1; an uneven rank split in equal chunks per rank. */
TEST(schedule_interleaved_stage_blocks)
{
    model_module mm = { .layers = 12 };
    plan_module s = { .pp = 2, .vp = 3 };
    plan_stage a = plan_stage_of(&mm, &s, 0), b = plan_stage_of(&mm, &s, 1);
    CHECK_EQ_INT(a.count, 6);
    int want0[6] = { 0, 1, 4, 5, 8, 9 }, want1[6] = { 2, 3, 6, 7, 10, 11 };
    for (int j = 0; j < 6; j++) {
        CHECK_EQ_INT(plan_stage_block(&a, j), want0[j]);
        CHECK_EQ_INT(plan_stage_block(&b, j), want1[j]);
    }
    for (int g = 0; g < 6; g++) {
        plan_stage v = plan_vstage_of(&mm, &s, g);
        CHECK_EQ_INT(v.first, 2 * g);
        CHECK_EQ_INT(v.count, 2);
        CHECK(v.stem == (g == 0) && v.head == (g == 5));
    }
    s.stage_layers[0] = 3;   /* stage 0 one chunk of 1 and ... */
    s.stage_layers[1] = 9;
    s.vp = 3;
    plan_stage c = plan_vstage_of(&mm, &s, 1), d = plan_vstage_of(&mm, &s, 2);
    CHECK_EQ_INT(c.first, 1);
    CHECK_EQ_INT(c.count, 3);
    CHECK_EQ_INT(d.first, 4);
    CHECK_EQ_INT(d.count, 1);
    /* micro-batches not in whole groups of pp (3 chunks of 1): one line, when the plan is made */
    static plan_t p;
    char err[UTIL_ERR_LEN];
    model_t md;
    cost_cluster cl;
    CHECK_OK(tiny_vl_llm_layers(4, &md, &cl));
    plan_workload w = { .global_batch = 3, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 16 };
    CHECK(plan_from_strategy("vision:gpus=1;llm:gpus=2,pp=2,vp=2,mb=1", &md, &cl, &w, PLAN_DISAGGREGATED, 3, 3, &p, err)
          == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "whole groups of pp") != NULL, "%s", err);
}

/* The search prices interleaved LLM candidates (vp = 2) where each pass's
 * micro-batches come in whole groups of pp, with split=ends too where pp vp
 * divides the layers + 2 (6 + 2 over 2 ranks x 2 chunks; never without
 * interleaving, where that split is plan_stage_of's own), and every plan it
 * assembles from them passes plan_schedule_check. */
TEST(search_prices_interleaved_llm_candidates)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_OK(tiny_vl_llm_layers(6, &m, &c));
    plan_workload w = { .global_batch = 16, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 48 };
    plan_search_options o;
    plan_search_options_default(&o);
    o.opt.precision = PLAN_OPT_FP32;
    o.opt.target = PLAN_TARGET_DHP;
    plan_candidates cs;
    CHECK_OK(plan_candidates_build(&m, &c, &w, &o, &cs, err));
    int interleaved = 0, ends = 0;
    for (int i = 0; i < cs.n; i++) {
        const plan_candidate *x = &cs.c[i];
        CHECK(!x->s.split_ends || (plan_vp(&x->s) > 1 && (6 + 2) % (x->s.pp * plan_vp(&x->s)) == 0));
        if (plan_vp(&x->s) == 1) continue;
        interleaved++;
        ends += x->s.split_ends;
        CHECK(x->module == m.llm && x->s.pp > 1 && !x->colocated);   /* beside an encoder a colocated pass is one micro-batch */
    }
    CHECK_MSG(interleaved > 0 && ends > 0, "%d interleaved candidates, %d of them split=ends, among %d", interleaved, ends,
              cs.n);
    plan_candidates_free(&cs);
    o.top_k = 8;
    static plan_search_result r;
    CHECK_OK(plan_search(&m, &c, &w, &o, &r, err));
    for (int i = 0; i < r.n_plans; i++) CHECK_OK(plan_schedule_check(&r.plans[i], err));
}

/* --strategy writes only what dhp run runs: an interleaved LLM beside an
 * encoder in a colocated plan (each pass one micro-batch) is refused with
 * the schedule's own line, at plan time (plan_assemble owns the check). */
TEST(strategy_refuses_interleaved_passes_not_in_groups_of_pp)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_OK(tiny_vl_llm_layers(8, &m, &c));
    plan_workload w = { .global_batch = 8, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 48 };
    static plan_t p;
    CHECK(plan_from_strategy("vision:dp=4;llm:pp=2,vp=2,dp=2", &m, &c, &w, PLAN_COLOCATED, 4, 0, &p, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "whole groups of pp") != NULL, "%s", err);
    /* the same LLM split in a disaggregated plan whose chunks give each pass 2 micro-batches runs */
    CHECK_OK(plan_from_strategy("vision:gpus=1;llm:gpus=2,pp=2,vp=2,mb=1", &m, &c, &w, PLAN_DISAGGREGATED, 0, 4, &p, err));
    CHECK_OK(plan_schedule_check(&p, err));
}
