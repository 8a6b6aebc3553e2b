/* bf16 saved activations (planner/precision.c plan_act_saved_bf16,
 * planner/layout.c plan_module_acts, executor/acts.c): under bf16 every
 * block tensor a layer keeps but the fp32 statistics is listed at 2 bytes,
 * with one fp32 copy per stage that the layer being run computes in (two
 * for the block input: even and odd layers), and nothing else changes: the
 * same tensors in the same order, the same sizes. The executor carves the
 * same list (t_bf16.sh checks a run's allocation against it). */
#include "test.h"
#include "planner/planner.h"

#include <stdlib.h>

static plan_act *acts_of(const model_module *mm, const plan_module *s, const plan_act_rows *r, int *n)
{
    *n = plan_module_acts(mm, s, 0, r, NULL, 0);
    plan_act *a = calloc((size_t)*n, sizeof *a);
    plan_module_acts(mm, s, 0, r, a, *n);
    return a;
}

/* The fp32 list with the bf16 list's per-layer entries and shared copies checked against it. */
static void check_module(const model_module *mm, const plan_module *s, plan_act_rows r)
{
    int nf, nb;
    r.bf16 = false;
    plan_act *f = acts_of(mm, s, &r, &nf);
    r.bf16 = true;
    plan_act *b = acts_of(mm, s, &r, &nb);
    double packed = 0, copies = 0;
    int i = 0, j = 0, n_packed = 0, n_copies = 0;
    for (; j < nb; j++) {
        const plan_act *x = &b[j];
        if (x->bf16) {
            n_packed++;
            packed += (double)x->elems;
            CHECK_MSG(x->saved && x->layer >= 0 && plan_act_saved_bf16(x->id), "%s: tensor %d layer %d in bf16",
                      mm->name, x->id, x->layer);
        }
        /* an entry the fp32 list lacks: the shared fp32 copy of a bf16 tensor */
        if (i < nf && f[i].id == x->id && f[i].layer == x->layer) {
            CHECK_MSG(f[i].elems == x->elems && f[i].saved == x->saved && !f[i].bf16, "%s: tensor %d changed", mm->name, x->id);
            CHECK_MSG(x->bf16 == (x->saved && x->layer >= 0 && x->id < PLAN_NACT_BLOCK && plan_act_saved_bf16(x->id)),
                      "%s: tensor %d layer %d: bf16 %d", mm->name, x->id, x->layer, x->bf16);
            i++;
            continue;
        }
        CHECK_MSG(!x->saved && !x->bf16 && x->layer < 0, "%s: extra tensor %d layer %d", mm->name, x->id, x->layer);
        plan_act_id of = x->id == PLAN_ACT_X_ODD ? PLAN_ACT_X : x->id;
        bool held = false;
        for (int k = 0; k < nb; k++) held |= b[k].bf16 && b[k].id == of && b[k].elems == x->elems;
        CHECK_MSG(held, "%s: an fp32 copy of tensor %d that no layer saves in bf16", mm->name, x->id);
        n_copies++;
        copies += (double)x->elems;
    }
    CHECK_MSG(i == nf, "%s: %d of the fp32 list's %d tensors in the bf16 list", mm->name, i, nf);
    /* the bytes: bf16 halves what the layers save and adds the copies to the scratch */
    double sf, bsf, xf, lf, sb, bsb, xb, lb;
    r.bf16 = false;
    plan_module_act_bytes(mm, s, 0, &r, 4, &sf, &bsf, &xf, &lf);
    r.bf16 = true;
    plan_module_act_bytes(mm, s, 0, &r, 4, &sb, &bsb, &xb, &lb);
    CHECK_NEAR(sf - sb, 2 * packed, 0);
    CHECK_NEAR(bsf - bsb, 2 * packed, 0);   /* the packed tensors are the blocks' own */
    CHECK_NEAR(xb - xf, 4 * copies, 0);
    CHECK(lf == lb);
    CHECK_MSG(n_packed > 0 && n_copies > 0, "%s: %d tensors in bf16, %d copies", mm->name, n_packed, n_copies);
    free(f);
    free(b);
}

TEST(bf16_saved_block_tensors_are_two_bytes_with_one_fp32_copy_a_stage)
{
    model_t m;
    char err[UTIL_ERR_LEN];
    CHECK_MSG(!model_load("tiny-vl", &m, err), "%s", err);
    /* the last: full recomputation of the first block only (rc_layers), the other keeping everything */
    plan_recompute rc[] = { PLAN_RECOMP_NONE, PLAN_RECOMP_SELECTIVE, PLAN_RECOMP_FULL, PLAN_RECOMP_FULL };
    int rc_layers[] = { 0, 0, 0, 1 };
    for (int k = 0; k < m.n_modules; k++)
        for (size_t c = 0; c < sizeof rc / sizeof rc[0]; c++) {
            plan_module s = { .dp = 1, .tp = 1, .sp = 1, .pp = 1, .micro_batch = 1, .n_ranks = 1, .recompute = rc[c],
                              .recompute_layers = rc_layers[c] };
            plan_act_rows r = { .rows = 48, .merged_rows = 12, .pred_rows = 30 };
            check_module(&m.mod[k], &s, r);
            s.tp = 2;   /* sequence parallelism: the norms' rows split */
            s.seq_parallel = true;
            check_module(&m.mod[k], &s, r);
        }
    /* which: all but the statistics */
    CHECK(plan_act_saved_bf16(PLAN_ACT_X) && plan_act_saved_bf16(PLAN_ACT_Q) && plan_act_saved_bf16(PLAN_ACT_H)
          && plan_act_saved_bf16(PLAN_ACT_ATT_LOC));
    CHECK(!plan_act_saved_bf16(PLAN_ACT_RSTD1) && !plan_act_saved_bf16(PLAN_ACT_LSE) && !plan_act_saved_bf16(PLAN_ACT_MEAN2)
          && !plan_act_saved_bf16(PLAN_ACT_X_FINAL));
}
