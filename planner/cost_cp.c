/* The cost model's part for the LLM's context parallelism (plan_cp_of):
 * ring attention's blocks as executor/ring.c runs them, and the rows of the
 * LLM's ends (the embedding's text rows, the head's predictions) an sp rank
 * holds (plan_cp_span_of). */
#include "planner/planner_int.h"

#include <math.h>

/* The exchange of one ring step: the K and the V block, each a message to
 * the next rank while the previous rank's come in (full duplex). The group's
 * slowest hop paces the ring: between nodes once the group spans them. */
static double ring_exchange_s(const cost_pool *pool, const plan_module *s, double bytes)
{
    int n, per_node;
    plan_group_shape(s, PLAN_AX_SP, pool->gpus_per_node, &n, &per_node);
    const cost_link *l = per_node >= n ? &pool->intra : &pool->inter;
    return bytes > 0 ? 2 * (l->alpha_s + bytes / l->busbw) : 0;
}

void plan_price_ring_block(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o,
                           double A, double samples, double S, int sp_rank, bool backward, plan_ring_price *out)
{
    const cost_gpu *g = &pool->gpu;
    cost_attn_kernel kern = plan_attention_kernel(o);
    int sp = s->sp, j = sp_rank >= 0 ? sp_rank : sp - 1;   /* the pace: rank sp - 1 sees every block whole */
    double H = (double)mm->heads / s->tp, hd = mm->head_dim, kvd = (double)mm->kv_heads / s->tp * hd;
    double L = S / sp, C = L / 2;   /* local rows per sample, a chunk */
    double overlap = o->target == PLAN_TARGET_DHP && pool->has_overlap ? pool->overlap : o->overlap;
    double exchange = ring_exchange_s(pool, s, plan_act_wire_bytes(o) * samples * L * kvd);   /* K/V on the activations' wire */
    *out = (plan_ring_price){ 0 };
    for (int i = 0; i < sp; i++) {
        double fwd, bwd;
        if (i == 0) {   /* its own block, causal over its two chunks */
            double rows = samples * L * H, scores = samples * L * (L + 1) / 2 * H;
            fwd = cost_attention_forward_time_in(g, kern, rows, scores, hd);
            bwd = cost_attention_backward_time_in(g, kern, rows, scores, hd);
        } else {        /* an earlier rank's block (all queries, its first chunk) or a later one's (the later chunk, all of it) */
            bool earlier = (j - i + sp) % sp < j;
            double q = earlier ? L : C, rows = samples * q * H, scores = samples * q * (earlier ? C : L) * H;
            fwd = cost_attention_forward_time_in(g, kern, rows, scores, hd)
                + cost_elementwise_time(g, COST_EW_ATTN_MERGE, rows * hd, A);
            bwd = cost_attention_backward_time_in(g, kern, rows, scores, hd);
        }
        out->fwd_s += fwd;
        if (backward) out->bwd_s += bwd;
        /* the next block travels while this one computes (as much of it as
         * compute hides); backward its gradient follows once computed */
        if (i + 1 < sp) {
            out->fwd_comm_s += fmax(0.0, exchange - overlap * fwd);
            out->fwd_syncs++;
        }
        if (backward) {
            out->bwd_comm_s += (i + 1 < sp ? fmax(0.0, exchange - overlap * bwd) : 0) + exchange;
            out->bwd_syncs++;
        }
    }
}

void plan_cp_end_rows(const model_module *mm, const plan_module *s, const plan_workload *w, plan_target target,
                      double samples, double S, int sp_rank, double *text, double *head, int *text_runs)
{
    int T = w->text_tokens, R = (int)S - T;
    plan_cp_span span = plan_cp_span_of(plan_cp_of(mm, s), (int)S, s->sp, sp_rank > 0 ? sp_rank : 0);
    *text = samples * plan_cp_held(&span, R, (int)S);
    *head = target == PLAN_TARGET_DHP ? samples * plan_cp_held(&span, R, R + T - 1) : samples * plan_cp_rows(&span);
    *text_runs = 0;
    for (int i = 0; i < span.n; i++) *text_runs += span.hi[i] > R;
}
