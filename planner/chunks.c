/* How a step's batch divides: into chunks (a disaggregated plan's n_micro,
 * or colocated one micro-batch of every LLM dp rank), each chunk over a
 * module's dp ranks, each share into micro-batches; and where a module's
 * ranks sit in its grid. planner/schedule.c orders the operations on them. */
#include "planner/planner_int.h"

/* Colocated chunks hold one micro-batch of every LLM dp rank. */
static int colocated_chunk_samples(const plan_t *p)
{
    const plan_module *l = &p->mod[p->model.llm];
    int c = l->dp * (l->micro_batch > 0 ? l->micro_batch : 1);
    return c > 0 ? c : 1;
}

int plan_chunks(const plan_t *p)
{
    int B = p->work.global_batch;
    if (p->placement == PLAN_DISAGGREGATED) return p->n_micro > 0 ? p->n_micro : 1;
    int C = colocated_chunk_samples(p);
    return (B + C - 1) / C;
}

void plan_chunk_range(const plan_t *p, int c, int *first, int *count)
{
    int B = p->work.global_batch;
    if (p->placement == PLAN_DISAGGREGATED) {
        int n = plan_chunks(p);
        *first = (int)((long)c * B / n);
        *count = (int)((long)(c + 1) * B / n) - *first;
        return;
    }
    int C = colocated_chunk_samples(p);
    *first = c * C;
    *count = B - *first < C ? B - *first : C;
}

void plan_chunk_share(const plan_t *p, int k, int c, int dp_i, int *first, int *count)
{
    int f, n, dp = p->mod[k].dp;
    plan_chunk_range(p, c, &f, &n);
    *first = f + (int)((long)dp_i * n / dp);
    *count = f + (int)((long)(dp_i + 1) * n / dp) - *first;
}

int plan_max_share(const plan_t *p, int k)
{
    int most = 0;
    for (int c = 0; c < plan_chunks(p); c++)
        for (int i = 0; i < p->mod[k].dp; i++) {
            int f, n;
            plan_chunk_share(p, k, c, i, &f, &n);
            if (n > most) most = n;
        }
    return most;
}

bool plan_rank_coord(const plan_t *p, int k, int rank, plan_coord *out)
{
    const plan_module *s = &p->mod[k];
    int local = rank - s->first_rank;
    if (local < 0 || local >= s->n_ranks) return false;
    out->tp = local % s->tp;
    local /= s->tp;
    out->sp = local % s->sp;
    local /= s->sp;
    out->dp = local % s->dp;
    out->pp = local / s->dp;
    return true;
}

int plan_coord_rank(const plan_t *p, int k, const plan_coord *c)
{
    const plan_module *s = &p->mod[k];
    return s->first_rank + ((c->pp * s->dp + c->dp) * s->sp + c->sp) * s->tp + c->tp;
}

int plan_rows_per_sample(const plan_t *p, int k) { return plan_encoder_rows(&p->model, &p->work, k); }

int plan_encoder_offset(const plan_t *p, int k)
{
    int rows[MODEL_MAX_MODULES];
    for (int j = 0; j < p->n_modules; j++) rows[j] = plan_rows_per_sample(p, j);
    return plan_sample_offset(&p->model, rows, k);
}

bool plan_feeds_llm(const model_t *m, const plan_workload *w, int k) { return plan_encoder_rows(m, w, k) > 0; }

bool plan_encoder_feeds(const plan_t *p, int k) { return plan_feeds_llm(&p->model, &p->work, k); }

bool plan_whole_batch_pipeline(const model_t *m, const plan_workload *w)
{
    for (int k = 0; k < m->n_modules; k++)
        if (plan_feeds_llm(m, w, k)) return false;
    return true;
}

int plan_micro_count(const plan_module *s, int count)
{
    int mb = s->micro_batch > 0 ? s->micro_batch : 1;
    return (count + mb - 1) / mb;
}

void plan_micro_range(const plan_module *s, int first, int count, int u, int *f, int *n)
{
    int mb = s->micro_batch > 0 ? s->micro_batch : 1, left = count - u * mb;
    *f = left > 0 ? first + u * mb : first + count;
    *n = left <= 0 ? 0 : left < mb ? left : mb;
}

/* The largest dp share of chunk c for module k: plan_chunk_share's split
 * differs by at most one sample, so ceil(chunk / dp). */
static int busiest_share(const plan_t *p, int k, int c)
{
    int f, n, dp = p->mod[k].dp;
    plan_chunk_range(p, c, &f, &n);
    return (n + dp - 1) / dp;
}

int plan_micro_ops(const plan_t *p, int k, int c, int count)
{
    const plan_module *s = &p->mod[k];
    int n = plan_micro_count(s, count);
    plan_dp_rules r = plan_dp_rules_of(&p->model.mod[k], s);
    if (!r.unit_param_gather && !r.unit_grad_reduce) return n;
    int busiest = plan_micro_count(s, busiest_share(p, k, c));
    return busiest > n ? busiest : n;
}

int plan_max_micro_per_share(const plan_t *p, int k)
{
    int most = 0;
    for (int c = 0; c < plan_chunks(p); c++) {
        int m = plan_micro_ops(p, k, c, busiest_share(p, k, c));
        if (m > most) most = m;
    }
    return most;
}
