/* Whole-plan evaluation: the one place where module times and memory are
 * combined into a step time, throughput, MFU and a fits/OOM verdict. The
 * MILP's choice, the baselines and `dhp memory` all go through here. */
#include "planner/planner.h"

#include <math.h>
#include <string.h>


/* Encoder output that crosses to the LLM per sample, bytes (A per element). */
static double handoff_bytes_per_sample(const model_t *m, int mi, const plan_workload *w, double A)
{
    const model_module *mm = &m->mod[mi];
    plan_seq q;
    plan_module_seq(m, mi, w, &q);
    double tokens = plan_encoder_out_rows(mm, &q, q.tokens_per_sample);
    return A * tokens * mm->out_hidden;
}

/* Chunks whose activations an encoder keeps alive in the disaggregated
 * flow: a training one its loop's window (plan_encoder_loops), each
 * waiting for the LLM's gradient while it runs the next ones forward. */
static int encoder_in_flight(const plan_t *p, const plan_encoder_loop *loop)
{
    return loop->window > 1 ? loop->window : p->n_micro > 1 ? 2 : 1;
}

static bool same_node_groups(const plan_t *p, int a, int b)
{
    const plan_module *x = &p->mod[a], *y = &p->mod[b];
    if (x->pool != y->pool) return false;
    int gpn = p->cluster.pool[x->pool].gpus_per_node;
    int ox = plan_pool_offset(p, a), oy = plan_pool_offset(p, b);
    int lo = ox < oy ? ox : oy;
    int hi = ox + x->n_ranks > oy + y->n_ranks ? ox + x->n_ranks : oy + y->n_ranks;
    return lo / gpn == (hi - 1) / gpn;
}

/* Seconds to hand one chunk's encoder output to the LLM (*to_llm) and,
 * where the encoder trains, its gradient back (*back; disaggregated).
 * Ranks send and take their shares in parallel; each direction lasts as
 * long as its busiest end: a sender sends its share once for every
 * receiving tp rank it feeds (plan_handoff_copies), a receiver takes its
 * own share once. An encoder rank holds its (dp, sp) group's rows of the
 * chunk, an LLM rank of the first stage its group's. */
static void transfer_times(const plan_t *p, int mi, int chunk, double *to_llm, double *back)
{
    const plan_module *e = &p->mod[mi], *l = &p->mod[p->model.llm];
    double sample = handoff_bytes_per_sample(&p->model, mi, &p->work, plan_precision_bytes(p->precision).act);
    double enc = sample * ((chunk + e->dp - 1) / e->dp) / e->sp, llm = sample * ((chunk + l->dp - 1) / l->dp) / l->sp;
    bool same = same_node_groups(p, mi, p->model.llm);
    *to_llm = cost_p2p_time(&p->cluster, e->pool, l->pool, same, fmax(enc * plan_handoff_copies(p, mi, false), llm));
    *back = model_trains(&p->model.mod[mi])
          ? cost_p2p_time(&p->cluster, l->pool, e->pool, same, fmax(llm * plan_handoff_copies(p, mi, true), enc)) : 0;
}

static void fill_prediction(plan_t *p, const plan_eval *ev, double step)
{
    plan_prediction *pr = &p->pred;
    const plan_workload *w = &p->work;
    double flops = 0, peak_sum = 0;
    for (int k = 0; k < p->n_modules; k++) {
        flops += ev->time[k].model_flops;
        if (p->placement == PLAN_DISAGGREGATED || k == 0)
            peak_sum += p->mod[k].n_ranks * cost_gpu_mfu_peak(&p->cluster.pool[p->mod[k].pool].gpu);
    }
    plan_seq lq;
    plan_module_seq(&p->model, p->model.llm, w, &lq);
    pr->step_time_s = pr->analytic_step_time_s = step;
    pr->simulated = false;
    pr->samples_per_s = w->global_batch / step;
    pr->vision_tokens_per_s = (double)w->global_batch * w->images_per_sample * w->image_tokens / step;
    pr->tokens_per_s = (double)w->global_batch * lq.tokens_per_sample / step;
    pr->model_flops = flops;
    pr->mfu = flops / (step * peak_sum);
}

/* A chunk through one module (plan_chunk_time): its micro-batches and the
 * pipeline's fill and drain, in passes of the pacing stage. 1F1B with stage
 * times T_i, the slowest T_k, m micro-batches: the first micro-batch's
 * forward reaches stage k through the stages before it, stage k runs its m
 * passes, the last backward returns through them, and the stages after k
 * hold its first backward back by their own forward and backward:
 *   step = m T_k + sum over i != k of T_i = (m + (pp - 1) fill / T_k) T_k
 * with fill (plan_time.fill_s) the others' mean: the (pp - 1) bubble passes
 * of even stages (Narayanan et al. SC'21, sec. 2.2.2), fewer where the
 * other stages are faster. With vp interleaved chunks per rank a unit is
 * 1 / vp of a rank's pass and the fill and drain cross (pp - 1) units each
 * way: (pp - 1) / vp passes (bubble fraction (p - 1) / (v m), ibid.). */
void plan_chunk_units(const plan_time *t, const plan_module *s, int chunk_samples, double *micros, double *bubbles)
{
    double per_rank = ceil((double)chunk_samples / s->dp), pace = plan_pace_s(t, s);
    *micros = ceil(per_rank / s->micro_batch);
    *bubbles = s->pp > 1 && pace > 0 ? (double)(s->pp - 1) / plan_vp(s) * t->fill_s / pace : 0;
}

double plan_pace_s(const plan_time *t, const plan_module *s) { return s->pp > 1 ? t->stage_max_s : t->micro_s; }

double plan_short_micro_saving(const model_t *m, int k, const plan_module *s, const plan_workload *w,
                               const cost_cluster *c, const plan_options *o, const plan_time *t, int chunk_samples)
{
    int mb = s->micro_batch > 0 ? s->micro_batch : 1, per_rank = (chunk_samples + s->dp - 1) / s->dp;
    double full = plan_pace_s(t, s);
    if (per_rank % mb == 0 || full <= 0) return 0;
    plan_time st;
    plan_micro_time(m, k, s, w, c, o, per_rank % mb, &st);
    double saved = 1 - plan_pace_s(&st, s) / full;
    return saved > 0 ? saved : 0;
}

double plan_chunk_time(const plan_time *t, const plan_module *s, int chunk_samples)
{
    double micros, bubbles;
    plan_chunk_units(t, s, chunk_samples, &micros, &bubbles);
    return (micros + bubbles) * plan_pace_s(t, s);
}

/* The passes of module k's pacing stage in one run of `chunk` samples
 * (plan_chunk_units). Colocated modules run the schedule's chunks in turn
 * (plan_chunks: one micro-batch per LLM dp rank each), a pipelined module
 * filling and draining its stages in every chunk; a disaggregated group runs
 * chunks of `chunk` samples, p->n_micro of them a step. */
static void module_units(const plan_t *p, int k, const plan_time *t, int chunk, double *micros, double *bubbles)
{
    const plan_module *s = &p->mod[k];
    if (p->placement == PLAN_DISAGGREGATED) {
        plan_chunk_units(t, s, chunk, micros, bubbles);
        return;
    }
    if (plan_whole_batch_pipeline(&p->model, &p->work)) {
        plan_chunk_units(t, s, p->work.global_batch, micros, bubbles);
        return;
    }
    /* every chunk is full but the last (plan_chunk_range): counted once each, so
     * a global batch of 2^28 samples is not 2^26 chunks per evaluation */
    int n = plan_chunks(p), first, full = 0, last = 0;
    *micros = *bubbles = 0;
    if (n < 1) return;
    if (n > 1) plan_chunk_range(p, 0, &first, &full);
    plan_chunk_range(p, n - 1, &first, &last);
    double fm, fb, lm, lb;
    plan_chunk_units(t, s, full, &fm, &fb);
    plan_chunk_units(t, s, last, &lm, &lb);
    *micros = (n - 1) * fm + lm;
    *bubbles = (n - 1) * fb + lb;
}

static plan_step_parts step_parts(const plan_time *t, double micros, double bubble_s, double transfer_s)
{
    plan_step_parts sp = { .micro = t->pace, .micros = micros, .bubble_s = bubble_s, .transfer_s = transfer_s,
                           .dp_sync_s = t->dp_exposed_s, .norm_s = t->norm_s, .optim_s = t->optim_s };
    double *f[] = { &sp.micro.gemm_s, &sp.micro.attn_s, &sp.micro.other_s, &sp.micro.recompute_s,
                    &sp.micro.tp_comm_s, &sp.micro.sp_comm_s, &sp.micro.zero_comm_s, &sp.micro.hop_s };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) *f[i] *= micros;
    return sp;
}

double plan_step_parts_total(const plan_step_parts *sp)
{
    const plan_micro_parts *m = &sp->micro;
    return m->gemm_s + m->attn_s + m->other_s + m->recompute_s + m->tp_comm_s + m->sp_comm_s + m->zero_comm_s
         + m->hop_s + sp->bubble_s + sp->transfer_s + sp->dp_sync_s + sp->norm_s + sp->optim_s;
}

/* One chunk on a disaggregated encoder group: its forward and backward
 * (the chunk's passes, plan_chunk_units), the hand-off each way, its tail
 * (plan_time_tail_s) and of it the reduction before the gradient norm
 * (plan_time_reduction_tail_s), its loop with the LLM. */
typedef struct {
    double fwd_s, bwd_s, to_llm_s, back_s, tail_s, reduce_s;
    bool trains;
    plan_encoder_loop loop;
} enc_chunk;

typedef struct {
    double fwd_unit_s, bwd_unit_s;   /* a unit (micro-batch x model chunk) on the pacing stage: pace / vp, split */
    double steady_s;   /* a chunk's m micro-batches on the pacing stage: m x pace */
    double latency_s;  /* a chunk through the pipeline and back: (m + fill and drain) x pace */
    double tail_s, reduce_s;   /* as enc_chunk's */
} llm_chunk;

/* The disaggregated step, chunk by chunk in the schedule's order
 * (planner/schedule.c), n chunks: each encoder group forwards chunk c (F),
 * the LLM's first stage starts it (S) and sends its gradient back (G), the
 * encoder runs its backward (B). With chunk c's loop on the LLM's first
 * stage (plan_llm_chunk_loops: first unit u, backward units before it b,
 * need, reach) and units f, b forward and backward:
 *   arrive(c) = max over encoders of F(c) + to_llm
 *   S(c) = max(arrive(c), S(c-1) + (u(c) - u(c-1)) f + (b(c) - b(c-1)) b)
 *   G(c) = max(S(c) + latency, G(c-1), S(c + need - 1) + reach (f + b),
 *              S(0) + c steady + latency)          the pacing stage's own work
 *   training encoder: F(c) after B(c-W); B(c) after F(c+W-1) and G(c) + back
 *   frozen encoder: F(c) after S(c-2) (its send of c-1 frees chunk c-2 once taken)
 * with W the loop's window (plan_encoder_loops): the LLM fills and drains
 * its pipeline once over all chunks, and an encoder whose next forward
 * waits for a gradient that waits for its own latest chunk paces the step
 * at its chunk plus that reach. Each group reduces its gradients after its
 * own last backward (the LLM's, G(n-1)); the gradient norm spans every
 * rank, so step = the last group's reduction end, then the slowest of the
 * rest of the tails (the norm's pass, the optimizer, the parameter
 * gathers). */
static int disaggregated_step(const plan_t *p, const plan_chunk_loop *l, const enc_chunk *enc, const llm_chunk *lc,
                              double *step, char *err)
{
    int n = plan_chunks(p), K = p->n_modules, L = p->model.llm, W = 1;
    double *S = util_malloc(sizeof *S * (size_t)n * 2), *G = S ? S + n : NULL;
    int rc = S ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "plan: out of memory pricing the disaggregated step");
    for (int k = 0; k < K; k++)
        if (k != L && enc[k].trains && enc[k].loop.window > W) W = enc[k].loop.window;
    double free_at[MODEL_MAX_MODULES] = { 0 };   /* each encoder group's last op ends */
    for (int j = 0, next_g = 0; j <= n && !rc; j++) {
        if (j < n) {
            double arrive = 0;
            for (int k = 0; k < K; k++) {
                if (k == L) continue;
                double start = free_at[k];
                if (!enc[k].trains && j >= 2 && S[j - 2] > start) start = S[j - 2];
                free_at[k] = start + enc[k].fwd_s;
                arrive = fmax(arrive, free_at[k] + enc[k].to_llm_s);
            }
            S[j] = !j ? arrive : fmax(arrive, S[j - 1] + (l[j].first_unit - l[j - 1].first_unit) * lc->fwd_unit_s
                                              + (l[j].backs - l[j - 1].backs) * lc->bwd_unit_s);
        }
        /* chunk c's backward follows the forward of c + W - 1; after the last forward, every chunk left */
        for (int last = j < n ? j - W + 1 : n - 1; next_g <= last; next_g++) {
            int c = next_g, dep = c + l[c].need - 1;
            G[c] = S[c] + lc->latency_s;
            if (c > 0) G[c] = fmax(G[c], G[c - 1]);
            if (l[c].need >= 1 && dep < n) G[c] = fmax(G[c], S[dep] + l[c].reach * (lc->fwd_unit_s + lc->bwd_unit_s));
            /* the pacing stage's chunks 0..c between one fill and one drain, before an encoder's backward of c */
            G[c] = fmax(G[c], S[0] + c * lc->steady_s + lc->latency_s);
            for (int k = 0; k < K; k++)
                if (k != L && enc[k].trains) free_at[k] = fmax(free_at[k], G[c] + enc[k].back_s) + enc[k].bwd_s;
        }
    }
    if (!rc) {
        double norm_at = G[n - 1] + lc->reduce_s, after = lc->tail_s - lc->reduce_s;
        for (int k = 0; k < K; k++)
            if (k != L) {
                norm_at = fmax(norm_at, free_at[k] + enc[k].reduce_s);
                after = fmax(after, enc[k].tail_s - enc[k].reduce_s);
            }
        *step = norm_at + after;
    }
    util_free(S);
    return rc;
}

int plan_evaluate(plan_t *p, const plan_options *o, plan_eval *ev, char *err)
{
    memset(ev, 0, sizeof *ev);
    int rc = plan_validate(p, err);
    if (rc) return rc;
    const plan_workload *w = &p->work;
    bool disagg = p->placement == PLAN_DISAGGREGATED;
    int chunk = w->global_batch / (disagg ? p->n_micro : 1);
    /* the LLM's loop with the encoders, chunk by chunk (disaggregated_step, the encoders' windows) */
    plan_chunk_loop *loops = disagg ? util_calloc((size_t)plan_chunks(p), sizeof *loops) : NULL;
    if (disagg && !loops) return util_fail(err, UTIL_ENOMEM, "plan: out of memory pricing the disaggregated step");
    if (disagg) plan_llm_chunk_loops(p, loops);
    double sum_t = 0, sum_tail = 0;
    enc_chunk enc[MODEL_MAX_MODULES];
    llm_chunk lc = { 0 };
    memset(enc, 0, sizeof enc);
    bool fits = true;
    ev->peak_mem = 0;
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        const cost_cluster *c = &p->cluster;
        const plan_time *tk = &ev->time[k];
        plan_module_time(&p->model, k, s, w, c, o, &ev->time[k]);
        bool encoder = k != p->model.llm;
        plan_encoder_loop loop = disagg && encoder ? plan_encoder_loop_in(p, k, loops) : (plan_encoder_loop){ 1, 0 };
        int in_flight = disagg && encoder ? encoder_in_flight(p, &loop) : 1;
        plan_module_memory(&p->model, k, s, w, &c->pool[s->pool].gpu, o, in_flight, &ev->mem[k]);
        double micros, bubbles, pace = plan_pace_s(tk, s), to_llm = 0, back = 0;
        module_units(p, k, tk, chunk, &micros, &bubbles);
        double whole_micros = micros;   /* the schedule's micro-batches, each a unit (per model chunk) */
        if (disagg) micros -= plan_short_micro_saving(&p->model, k, s, w, c, o, tk, chunk);
        if (disagg && encoder) transfer_times(p, k, chunk, &to_llm, &back);
        double passes = (micros + bubbles) * pace, transfer = to_llm + back, tail = plan_time_tail_s(tk);
        /* disaggregated, each group runs n_micro chunks; the LLM's 1F1B spans them, filling and draining once */
        double runs = disagg ? p->n_micro : 1, fills = disagg && !encoder ? 1 : runs;
        ev->module_step_s[k] = (micros * runs + bubbles * fills) * pace + transfer * runs + tail;
        ev->parts[k] = step_parts(tk, micros * runs, bubbles * pace * fills, transfer * runs);
        sum_t += passes + transfer;
        sum_tail += tail;
        double fwd = tk->micro_s > 0 ? plan_time_forward_s(tk) / tk->micro_s : 1;   /* a pass's forward share */
        if (disagg && encoder) {
            enc[k] = (enc_chunk){ fwd * passes, (1 - fwd) * passes, to_llm, back, tail, plan_time_reduction_tail_s(tk),
                                  model_trains(&p->model.mod[k]), loop };
        } else if (disagg) {
            /* a unit's time on average: a short last micro-batch (above) is a cheaper one */
            double unit = whole_micros > 0 ? micros * pace / (whole_micros * plan_vp(s)) : pace / plan_vp(s);
            lc = (llm_chunk){ fwd * unit, (1 - fwd) * unit, micros * pace, passes, tail, plan_time_reduction_tail_s(tk) };
        }
        p->pred.peak_mem_bytes[k] = ev->mem[k].total;
    }
    double step = 0;
    if (p->placement == PLAN_COLOCATED) {
        /* Modules run in turn on the same GPUs; memory of all of them is resident,
         * the runtime reservation counted once. */
        step = sum_t + sum_tail;
        double total = 0;
        for (int k = 0; k < p->n_modules; k++) total += ev->mem[k].total - (k ? plan_mem_once(&ev->mem[k]) : 0);
        ev->peak_mem = total;
        ev->capacity = ev->mem[0].capacity;
        fits = total <= ev->capacity;
        for (int k = 0; k < p->n_modules; k++) p->pred.peak_mem_bytes[k] = total;
    } else {
        /* Encoders run side by side, each feeding the LLM chunk by chunk;
         * optimizer steps run in parallel. */
        rc = disaggregated_step(p, loops, enc, &lc, &step, err);
        util_free(loops);
        if (rc) return rc;
        for (int k = 0; k < p->n_modules; k++) {
            if (ev->mem[k].total > ev->mem[k].capacity) fits = false;
            if (ev->mem[k].total > ev->peak_mem) { ev->peak_mem = ev->mem[k].total; ev->capacity = ev->mem[k].capacity; }
        }
        for (int k = 0; k < p->n_modules; k++)
            if (k != p->model.llm) ev->transfer_s += (enc[k].to_llm_s + enc[k].back_s) * p->n_micro;
    }
    p->pred.fits = fits;
    fill_prediction(p, ev, step);
    return UTIL_OK;
}

int plan_step_parts_of(const plan_t *p, plan_step_parts *out, char *err)
{
    plan_t *q = util_malloc(sizeof *q);
    plan_eval *ev = util_malloc(sizeof *ev);
    int rc = q && ev ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "plan: out of memory pricing the step's parts");
    if (!rc) {
        *q = *p;
        plan_options o = plan_options_of(p);
        rc = plan_evaluate(q, &o, ev, err);
    }
    if (!rc) memcpy(out, ev->parts, sizeof ev->parts[0] * (size_t)p->n_modules);
    util_free(q);
    util_free(ev);
    return rc;
}
