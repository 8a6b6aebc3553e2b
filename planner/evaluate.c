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

/* Pipeline depth whose activations an encoder keeps alive in the
 * disaggregated 1F1B flow: its chunk waits for the LLM's gradient while it
 * already runs the next chunk forward. */
static int encoder_in_flight(const plan_t *p) { return p->n_micro > 1 ? 2 : 1; }

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

/* Seconds to hand one chunk's encoder output to the LLM and its gradient back:
 * each encoder data-parallel replica sends its share in parallel. */
static double transfer_time(const plan_t *p, int mi, int chunk)
{
    const plan_module *s = &p->mod[mi];
    double per_rank = (chunk + s->dp - 1) / s->dp;
    double bytes = handoff_bytes_per_sample(&p->model, mi, &p->work, plan_precision_bytes(p->precision).act)
                 * per_rank / s->sp;
    int li = p->model.llm;
    bool same = same_node_groups(p, mi, li);
    return 2.0 * cost_p2p_time(&p->cluster, s->pool, p->mod[li].pool, same, bytes);
}

static void fill_prediction(plan_t *p, const plan_eval *ev, double step)
{
    plan_prediction *pr = &p->pred;
    const plan_workload *w = &p->work;
    double flops = 0, peak_sum = 0;
    for (int k = 0; k < p->n_modules; k++) {
        flops += ev->time[k].model_flops;
        if (p->placement == PLAN_DISAGGREGATED || k == 0)
            peak_sum += p->mod[k].n_ranks * p->cluster.pool[p->mod[k].pool].gpu.peak_flops;
    }
    plan_seq lq;
    plan_module_seq(&p->model, p->model.llm, w, &lq);
    pr->step_time_s = pr->analytic_step_time_s = step;
    pr->simulated = false;
    pr->samples_per_s = w->global_batch / step;
    pr->vision_tokens_per_s = (double)w->global_batch * w->images_per_sample * w->image_tokens / step;
    pr->tokens_per_s = (double)w->global_batch * lq.tokens_per_sample / step;
    pr->mfu = flops / (step * peak_sum);
}

/* Colocated modules run the schedule's chunks in turn (plan_chunks: one
 * micro-batch per LLM dp rank each), a pipelined module filling and
 * draining its stages in every chunk. */
static double colocated_time(const plan_t *p, const plan_time *t, const plan_module *s)
{
    if (plan_whole_batch_pipeline(&p->model, &p->work)) return plan_chunk_time(t, s, p->work.global_batch);
    /* every chunk is full but the last (plan_chunk_range): priced once each, so
     * a global batch of 2^28 samples is not 2^26 chunks per evaluation */
    int n = plan_chunks(p), first, full = 0, last = 0;
    if (n < 1) return 0;
    if (n > 1) plan_chunk_range(p, 0, &first, &full);
    plan_chunk_range(p, n - 1, &first, &last);
    return (n - 1) * plan_chunk_time(t, s, full) + plan_chunk_time(t, s, last);
}

int plan_evaluate(plan_t *p, const plan_options *o, plan_eval *ev, char *err)
{
    memset(ev, 0, sizeof *ev);
    int rc = plan_validate(p, err);
    if (rc) return rc;
    const plan_workload *w = &p->work;
    int chunk = w->global_batch / (p->placement == PLAN_DISAGGREGATED ? p->n_micro : 1);
    double sum_t = 0, max_t = 0, sum_tail = 0, max_tail = 0, max_enc_t = 0, llm_t = 0;
    bool fits = true;
    ev->peak_mem = 0;
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        const cost_cluster *c = &p->cluster;
        plan_module_time(&p->model, k, s, w, c, o, &ev->time[k]);
        bool encoder = k != p->model.llm;
        int in_flight = p->placement == PLAN_DISAGGREGATED && encoder ? encoder_in_flight(p) : 1;
        plan_module_memory(&p->model, k, s, w, &c->pool[s->pool].gpu, o, in_flight, &ev->mem[k]);
        double t = p->placement == PLAN_DISAGGREGATED ? plan_chunk_time(&ev->time[k], s, chunk) : colocated_time(p, &ev->time[k], s);
        if (p->placement == PLAN_DISAGGREGATED && encoder) t += transfer_time(p, k, chunk);
        double tail = plan_time_tail_s(&ev->time[k]);
        ev->module_step_s[k] = t * (p->placement == PLAN_DISAGGREGATED ? p->n_micro : 1) + tail;
        sum_t += t; if (t > max_t) max_t = t;
        if (encoder) { if (t > max_enc_t) max_enc_t = t; } else llm_t = t;
        sum_tail += tail; if (tail > max_tail) max_tail = tail;
        p->pred.peak_mem_bytes[k] = ev->mem[k].total;
    }
    double step;
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
        /* Encoders run side by side, each feeding the LLM: a two-stage pipeline
         * over n_micro chunks fills and drains once (slowest encoder, then the
         * LLM), the slowest group paces the rest; optimizer steps run in parallel. */
        step = max_enc_t + llm_t + (p->n_micro - 1) * max_t + max_tail;
        for (int k = 0; k < p->n_modules; k++) {
            if (ev->mem[k].total > ev->mem[k].capacity) fits = false;
            if (ev->mem[k].total > ev->peak_mem) { ev->peak_mem = ev->mem[k].total; ev->capacity = ev->mem[k].capacity; }
        }
        for (int k = 0; k < p->n_modules; k++)
            if (k != p->model.llm) ev->transfer_s += transfer_time(p, k, chunk) * p->n_micro;
    }
    p->pred.fits = fits;
    fill_prediction(p, ev, step);
    return UTIL_OK;
}
