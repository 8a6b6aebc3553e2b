/* The drift guard's pricing side (tests/test_drift.c): what the cost model
 * prices for one micro-batch, read off plan_cp_micro_time itself (a pipeline
 * stage's, of one sp rank: plan_stage_micro_time's price is the sp group's
 * pace; target dhp, fp32) without changing it. Each count is the price on a made-up device on
 * which that one thing costs exactly its count and everything else (almost)
 * nothing (rates of 1e300, no launch cost):
 *  - element-wise kernel k: a rate table in which k moves accesses x 4
 *    bytes per second (each call costs its elements), or in which k's rate
 *    grows as its bytes (each call costs 1 s);
 *  - GEMMs: 2 FLOP/s at efficiency 1 (each costs m n k); a launch cost of
 *    1 s with the GEMMs priced and without (efficiency 0 prices one at 0),
 *    whose difference is their number; a measured-efficiency grid that is
 *    slow only inside a box of shapes (which shapes there are, found axis by
 *    axis, and how many GEMMs have each);
 *  - attention: 1 s per row or per score, forward and backward kernels; its
 *    calls are the launches left when the GEMMs and element-wise kernels are
 *    taken out;
 *  - collectives: a link per operation at 1 s per ring step (calls) or 1 B/s
 *    (bytes of the full buffer); point-to-point messages (ring attention's)
 *    the node's link, 1 s each or 1 B/s; plan_time's sync counts as they are.
 * Forward is fwd_s (fwd_comm_s); backward is bwd_s + recompute_s (the
 * executor re-runs recomputed kernels inside its backward). */
#include "tests/drift.h"
#include "tests/test_fixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HUGE_RATE 1e300

static const cost_coll coll_op[DRIFT_NCOLL - 1] = { COST_ALLREDUCE, COST_ALLGATHER, COST_REDUCESCATTER, COST_ALLTOALL };

typedef struct {
    const model_t *m;
    int mi, sp_rank;
    plan_module s;
    plan_workload w;
    double A;                  /* bytes per activation element (fp32) */
    int stage;                 /* a pipeline stage (plan_stage_micro_time), or -1: the whole module */
    cost_cluster *c;
} pricing;

static cost_gpu free_gpu(void)
{
    cost_gpu g;
    memset(&g, 0, sizeof g);
    strcpy(g.name, "drift");
    g.peak_flops = HUGE_RATE;
    g.gemm_eff_max = 1;
    g.attn_eff = HUGE_RATE;
    g.hbm_bw = HUGE_RATE;
    g.mem_eff = 1;
    g.hbm_bytes = HUGE_RATE;
    return g;
}

static cost_pool free_pool(void)
{
    cost_pool p;
    memset(&p, 0, sizeof p);
    strcpy(p.name, "drift");
    p.gpu = free_gpu();
    p.nodes = 1;
    p.gpus_per_node = 8;
    p.intra = p.inter = (cost_link){ 0, HUGE_RATE };
    for (int op = 0; op < COST_N_COLL; op++) {
        p.has_intra_op[op] = true;
        p.intra_op[op] = p.intra;
    }
    return p;
}

/* A count read off a price: what the free parts add (1e-290 s or so) and
 * the rounding of the interpolated rates (1e-15 of each) taken away. */
static double whole(double v)
{
    double r = round(v);
    return fabs(v - r) < 1e-9 * fmax(1.0, fabs(v)) ? r : v;
}

/* Prices the micro-batch on pool p; v gets forward and backward (with recomputation). */
static void price(const pricing *pr, const cost_pool *p, plan_time *t, double v[DRIFT_NPH])
{
    memset(pr->c, 0, sizeof *pr->c);
    strcpy(pr->c->name, "drift");
    pr->c->n_pools = 1;
    pr->c->pool[0] = *p;
    pr->c->cross_pool = p->inter;
    plan_options o = test_dhp_fp32();
    plan_cp_micro_time(pr->m, pr->mi, &pr->s, pr->stage >= 0 ? pr->stage : 0, pr->sp_rank, &pr->w, pr->c, &o,
                       pr->s.micro_batch, t);
    v[DRIFT_FWD] = whole(t->fwd_s);
    v[DRIFT_BWD] = whole(t->bwd_s + t->recompute_s);
}

static void price_gpu(const pricing *pr, const cost_gpu *g, double v[DRIFT_NPH])
{
    cost_pool p = free_pool();
    p.gpu = *g;
    plan_time t;
    price(pr, &p, &t, v);
}

static void model_elementwise(const pricing *pr, drift_tally *mt)
{
    double v[DRIFT_NPH];
    for (int k = 0; k < COST_N_EW; k++) {
        double per = cost_ew_accesses(k) * 4.0;   /* the table's bytes per element */
        cost_gpu g = free_gpu();
        /* elements: k moves its nominal bytes at accesses x A bytes per second */
        g.ew.n = 1;
        g.ew.elements[0] = 1;
        for (int j = 0; j < COST_N_EW; j++) g.ew.bw[j][0] = HUGE_RATE;
        g.ew.bw[k][0] = cost_ew_accesses(k) * pr->A;
        price_gpu(pr, &g, v);
        for (int ph = 0; ph < DRIFT_NPH; ph++) mt->ew_elems[ph][k] = v[ph];
        /* calls: k's rate equals its bytes (a line in log-log through both sizes) */
        g.ew.n = 2;
        g.ew.elements[0] = 0.5;
        g.ew.elements[1] = 1e15;
        for (int j = 0; j < COST_N_EW; j++) g.ew.bw[j][0] = g.ew.bw[j][1] = HUGE_RATE;
        g.ew.bw[k][0] = g.ew.elements[0] * per;
        g.ew.bw[k][1] = g.ew.elements[1] * per;
        price_gpu(pr, &g, v);
        for (int ph = 0; ph < DRIFT_NPH; ph++) mt->ew_calls[ph][k] = v[ph];
    }
}

/* A box of GEMM shapes: integers lo[a] .. hi[a] on each axis (m, n, k). */
typedef struct { double lo[3], hi[3]; } box;

/* Prices GEMMs in the box at efficiency `slow` (1 FLOP/s peak), those outside at 1e300:
 * a measured-efficiency grid of 4 points per axis, the middle two a quarter
 * element outside the box (the grid interpolates between them), the outer
 * two half an element out (every integer outside clamps to them). */
static void price_box(const pricing *pr, const box *b, double slow, double v[DRIFT_NPH])
{
    cost_gpu g = free_gpu();
    g.peak_flops = 1;
    cost_gemm_grid *G = &g.grid;
    G->n_m = G->n_n = G->n_k = 4;
    double *axis[3] = { G->m, G->n, G->k };
    for (int a = 0; a < 3; a++) {
        axis[a][0] = b->lo[a] - 0.5;
        axis[a][1] = b->lo[a] - 0.25;
        axis[a][2] = b->hi[a] + 0.25;
        axis[a][3] = b->hi[a] + 0.5;
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 4; l++) {
                bool in = (i == 1 || i == 2) && (j == 1 || j == 2) && (l == 1 || l == 2);
                G->eff[(i * 4 + j) * 4 + l] = in ? slow : HUGE_RATE;
            }
    price_gpu(pr, &g, v);
}

#define MAX_DIM 1048576.0
#define MAX_VALUES 32

/* The values axis a takes among the priced GEMMs inside b (its range on a
 * split in halves while any GEMM falls in it: each costs 2 m n k there). */
static void find_values(const pricing *pr, box b, int a, double *out, int *n, bool *overflow)
{
    double v[DRIFT_NPH];
    price_box(pr, &b, 1, v);
    if (v[DRIFT_FWD] + v[DRIFT_BWD] < 1) return;
    if (b.lo[a] == b.hi[a]) {
        if (*n < MAX_VALUES) out[(*n)++] = b.lo[a];
        else *overflow = true;
        return;
    }
    double mid = floor((b.lo[a] + b.hi[a]) / 2), hi = b.hi[a];
    b.hi[a] = mid;
    find_values(pr, b, a, out, n, overflow);
    b.lo[a] = mid + 1;
    b.hi[a] = hi;
    find_values(pr, b, a, out, n, overflow);
}

/* The GEMM shapes the cost model prices, found axis by axis, and how many
 * of each per pass (1 s per GEMM of exactly that shape). Non-integer shapes
 * escape the search; the GEMM count and m n k totals still see them. */
static void model_shapes(const pricing *pr, drift_tally *mt)
{
    box all = { { 1, 1, 1 }, { MAX_DIM, MAX_DIM, MAX_DIM } };
    double ms[MAX_VALUES], ns[MAX_VALUES], ks[MAX_VALUES], v[DRIFT_NPH];
    int n_m = 0;
    find_values(pr, all, 0, ms, &n_m, &mt->overflow);
    for (int i = 0; i < n_m; i++) {
        box bm = all;
        bm.lo[0] = bm.hi[0] = ms[i];
        int n_n = 0;
        find_values(pr, bm, 1, ns, &n_n, &mt->overflow);
        for (int j = 0; j < n_n; j++) {
            box bn = bm;
            bn.lo[1] = bn.hi[1] = ns[j];
            int n_k = 0;
            find_values(pr, bn, 2, ks, &n_k, &mt->overflow);
            for (int l = 0; l < n_k; l++) {
                box one = bn;
                one.lo[2] = one.hi[2] = ks[l];
                price_box(pr, &one, 2 * ms[i] * ns[j] * ks[l], v);
                if (mt->n_shapes == DRIFT_MAX_SHAPES) { mt->overflow = true; return; }
                mt->shape[mt->n_shapes++] = (drift_shape){ ms[i], ns[j], ks[l], { v[DRIFT_FWD], v[DRIFT_BWD] } };
            }
        }
    }
}

/* GEMMs and attention: m n k, calls, shapes; attention rows, scores, calls. */
static void model_compute(const pricing *pr, drift_tally *mt)
{
    double v[DRIFT_NPH], with[DRIFT_NPH], without[DRIFT_NPH];
    cost_gpu g = free_gpu();
    g.peak_flops = 2;
    price_gpu(pr, &g, v);
    for (int ph = 0; ph < DRIFT_NPH; ph++) mt->gemm_mnk[ph] = v[ph];
    g = free_gpu();
    g.kernel_launch_s = 1;
    price_gpu(pr, &g, with);
    g.gemm_eff_max = 0;
    price_gpu(pr, &g, without);
    for (int ph = 0; ph < DRIFT_NPH; ph++) {
        mt->gemm_calls[ph] = with[ph] - without[ph];
        mt->att_calls[ph] = without[ph];
        for (int k = 0; k < COST_N_EW; k++) mt->att_calls[ph] -= mt->ew_calls[ph][k];
    }
    model_shapes(pr, mt);
    for (int kernel = 0; kernel < 2; kernel++) {
        g = free_gpu();
        *(kernel ? &g.attn_bwd_row_s : &g.attn_row_s) = 1;
        price_gpu(pr, &g, v);
        for (int ph = 0; ph < DRIFT_NPH; ph++) mt->att_rows[ph][kernel] = v[ph];
        g = free_gpu();
        *(kernel ? &g.attn_bwd_score_s : &g.attn_score_s) = 1;
        price_gpu(pr, &g, v);
        for (int ph = 0; ph < DRIFT_NPH; ph++) mt->att_scores[ph][kernel] = v[ph];
    }
}

/* Collectives: op's link costs 1 s per ring step (calls) or 1 B/s (bytes);
 * point-to-point messages (the node's link, which no collective uses here:
 * each has its own) 1 s each or 1 B/s. */
static void model_comm(const pricing *pr, drift_tally *mt)
{
    plan_time t;
    double v[DRIFT_NPH];
    for (int op = 0; op < DRIFT_NCOLL; op++) {
        int k = op == DRIFT_A2A || op == DRIFT_P2P ? pr->s.sp : pr->s.tp;
        if (k < 2) continue;
        double steps = op == DRIFT_AR ? 2.0 * (k - 1) : k - 1, frac = op == DRIFT_AR ? 2.0 * (k - 1) / k : (double)(k - 1) / k;
        if (op == DRIFT_P2P) steps = frac = 1;
        for (int bytes = 0; bytes < 2; bytes++) {
            cost_pool p = free_pool();
            cost_link l = bytes ? (cost_link){ 0, 1 } : (cost_link){ 1, HUGE_RATE };
            if (op == DRIFT_P2P) p.intra = l;
            else p.intra_op[coll_op[op]] = l;
            price(pr, &p, &t, v);
            double all = t.tp_comm_s + t.sp_comm_s, pass[DRIFT_NPH] = { t.fwd_comm_s, all - t.fwd_comm_s };
            for (int ph = 0; ph < DRIFT_NPH; ph++) {
                if (bytes) mt->coll_elems[ph][op] = whole(pass[ph] / frac / pr->A);
                else mt->coll_calls[ph][op] = whole(pass[ph] / steps);
            }
        }
    }
    cost_pool p = free_pool();
    price(pr, &p, &t, v);
    mt->syncs[DRIFT_FWD] = t.fwd_syncs;
    mt->syncs[DRIFT_BWD] = t.bwd_syncs;
}

int drift_price(const drift_case *dc, const model_t *m, int module, int sp_rank, drift_tally *mt)
{
    pricing pr = { .m = m, .mi = module, .sp_rank = sp_rank, .A = plan_precision_bytes(PLAN_OPT_FP32).act,
                   .stage = dc->pp > 1 ? dc->stage : -1 };
    int pp = dc->pp > 1 ? dc->pp : 1;
    pr.s = (plan_module){ .module_index = module, .n_ranks = dc->tp * dc->sp * pp, .dp = 1, .tp = dc->tp, .sp = dc->sp,
                          .pp = pp, .micro_batch = DRIFT_SAMPLES, .recompute = dc->recompute, .recompute_layers = dc->recompute_layers,
                          .seq_parallel = dc->seqpar, .vp = dc->vp, .split_ends = dc->split_ends };
    snprintf(pr.s.module, sizeof pr.s.module, "%s", m->mod[module].name);
    pr.w = (plan_workload){ .global_batch = DRIFT_SAMPLES, .images_per_sample = DRIFT_IMAGES / DRIFT_SAMPLES,
                            .image_tokens = DRIFT_PATCHES, .text_tokens = drift_text(dc),
                            .audio_frames = model_find_kind(m, MODEL_AUDIO) >= 0 ? DRIFT_MEL_FRAMES / 2 : 0 };
    if (model_find_kind(m, MODEL_VISION) < 0) pr.w.images_per_sample = pr.w.image_tokens = 0;
    memset(mt, 0, sizeof *mt);
    pr.c = malloc(sizeof *pr.c);
    if (!pr.c) return UTIL_ENOMEM;
    model_elementwise(&pr, mt);
    model_compute(&pr, mt);
    model_comm(&pr, mt);
    free(pr.c);
    return UTIL_OK;
}
