/* Context parallelism of the LLM: which positions of a sample each sp rank
 * holds, and which variant runs (see planner.h, plan_cp). The hand-off
 * routing (handoff.c), the executor's LLM layout (executor/llm.c, ring.c),
 * the activation list (layout.c) and the cost model (cost.c) all ask here. */
#include "planner/planner.h"

#include <limits.h>
#include <math.h>
#include <string.h>

static bool divides(int a, int b) { return a > 0 && b % a == 0; }

plan_cp plan_cp_of(const model_module *mm, const plan_module *s)
{
    if (!s || s->sp <= 1) return PLAN_CP_NONE;
    int tp = s->tp > 0 ? s->tp : 1;
    if (mm->kind != MODEL_LLM) return PLAN_CP_ULYSSES;
    if (s->cp == PLAN_CP_ULYSSES || s->cp == PLAN_CP_RING) return s->cp;
    return divides(tp * s->sp, mm->heads) && divides(tp * s->sp, mm->kv_heads) ? PLAN_CP_ULYSSES : PLAN_CP_RING;
}

const char *plan_cp_name(plan_cp k)
{
    return k == PLAN_CP_ULYSSES ? "ulysses" : k == PLAN_CP_RING ? "ring" : "none";
}

bool plan_cp_parse(const char *name, plan_cp *out)
{
    if (!strcmp(name, "auto")) *out = PLAN_CP_NONE;
    else if (!strcmp(name, "ulysses")) *out = PLAN_CP_ULYSSES;
    else if (!strcmp(name, "ring")) *out = PLAN_CP_RING;
    else return false;
    return true;
}

int plan_cp_chunks(plan_cp k, int sp) { return k == PLAN_CP_RING ? 2 * sp : k == PLAN_CP_ULYSSES ? sp : 1; }

/* Ulysses: [j S / sp, (j + 1) S / sp). Ring: chunks j and 2 sp - 1 - j of
 * S / (2 sp) positions each, in that order (Megatron-Core's
 * get_batch_on_this_cp_rank: a causal mask gives chunk c work that grows with
 * c, so rank j pairs the j-th cheapest with the j-th dearest). */
plan_cp_span plan_cp_span_of(plan_cp k, int S, int sp, int j)
{
    plan_cp_span s = { 0 };
    if (k == PLAN_CP_NONE || sp <= 1) {
        s.n = 1;
        s.hi[0] = S;
        return s;
    }
    if (k == PLAN_CP_ULYSSES) {
        s.n = 1;
        s.lo[0] = (int)((long)j * S / sp);
        s.hi[0] = (int)((long)(j + 1) * S / sp);
        return s;
    }
    int C = S / (2 * sp);
    s.n = 2;
    s.lo[0] = j * C;
    s.hi[0] = (j + 1) * C;
    s.lo[1] = (2 * sp - 1 - j) * C;
    s.hi[1] = (2 * sp - j) * C;
    return s;
}

int plan_cp_rows(const plan_cp_span *s)
{
    int n = 0;
    for (int i = 0; i < s->n; i++) n += s->hi[i] - s->lo[i];
    return n;
}

int plan_cp_held(const plan_cp_span *s, int a, int b)
{
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        int lo = a > s->lo[i] ? a : s->lo[i], hi = b < s->hi[i] ? b : s->hi[i];
        if (hi > lo) n += hi - lo;
    }
    return n;
}

int plan_cp_position(const plan_cp_span *s, int row)
{
    for (int i = 0; i < s->n; i++) {
        int len = s->hi[i] - s->lo[i];
        if (row < len) return s->lo[i] + row;
        row -= len;
    }
    return -1;
}

int plan_cp_local(const plan_cp_span *s, int pos)
{
    int before = 0;
    for (int i = 0; i < s->n; i++) {
        if (pos >= s->lo[i] && pos < s->hi[i]) return before + pos - s->lo[i];
        before += s->hi[i] - s->lo[i];
    }
    return -1;
}

/* The most any of the sp ranks holds of positions [a, b). */
static int most_held(plan_cp k, int S, int sp, int a, int b)
{
    int most = 0;
    for (int j = 0; j < (sp > 1 ? sp : 1); j++) {
        plan_cp_span s = plan_cp_span_of(k, S, sp, j);
        int n = plan_cp_held(&s, a, b);
        if (n > most) most = n;
    }
    return most;
}

/* samples x rows per sample, saturated at INT_MAX: the search prices
 * micro-batches far larger than any rank holds (2^28 samples), whose rows
 * no int counts; they come out as impossibly large, not as an overflow. */
static int rows_times(int samples, int rows)
{
    int64_t n = (int64_t)samples * rows;
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* Every sp rank sizes its slot as the busiest one needs it, so that the
 * ranks of a group hold the same memory whatever their share of encoder
 * rows, text and predictions. */
plan_act_rows plan_llm_act_rows(const model_module *mm, const plan_module *s, int samples, int S, int T)
{
    plan_cp k = plan_cp_of(mm, s);
    int sp = s->sp > 1 ? s->sp : 1, R = S - T;
    plan_act_rows r = { 0 };
    r.rows = rows_times(samples, S / sp);
    r.merged_rows = rows_times(samples, most_held(k, S, sp, 0, R));
    r.pred_rows = rows_times(samples, most_held(k, S, sp, R, R + T - 1));
    r.emb_rows = s->tp > 1 ? rows_times(samples, most_held(k, S, sp, R, S)) : 0;
    return r;
}

int plan_cp_check(const model_module *mm, const plan_module *s, double seq, char *err)
{
    plan_cp k = plan_cp_of(mm, s);
    if (k == PLAN_CP_NONE || mm->kind != MODEL_LLM) return UTIL_OK;
    int parts = plan_cp_chunks(k, s->sp);
    if (fmod(seq, parts) != 0)
        return util_fail(err, UTIL_EINVAL,
                         "%s: sp %d: %s context parallelism needs the sequence (%.0f tokens) divisible by %d", mm->name,
                         s->sp, plan_cp_name(k), seq, parts);
    if (k == PLAN_CP_RING && (!divides(s->tp, mm->heads) || !divides(s->tp, mm->kv_heads)))
        return util_fail(err, UTIL_EINVAL, "%s: tp %d must divide heads %d and kv_heads %d", mm->name, s->tp, mm->heads,
                         mm->kv_heads);
    return UTIL_OK;
}

plan_cp plan_cp_layer(const model_module *mm, const plan_module *s, int layer, double rows)
{
    plan_cp k = plan_cp_of(mm, s);
    /* An encoder's window layer stays on its rank when the rank's rows (from
     * j * rows on) are whole windows: it attends within them, all heads. */
    if (k == PLAN_CP_ULYSSES && mm->kind != MODEL_LLM && mm->window > 0 && !model_layer_is_full_attention(mm, layer)
        && fmod(rows, mm->window) == 0)
        return PLAN_CP_NONE;
    return k;
}

int plan_cp_encoder_rows(const plan_t *p, int k, int rank)
{
    int L = p->model.llm, a = k < 0 ? 0 : plan_encoder_offset(p, k);
    int b = k < 0 ? plan_encoder_offset(p, p->n_modules) : a + plan_rows_per_sample(p, k);
    plan_coord c;
    if (!plan_rank_coord(p, L, rank, &c)) return 0;
    plan_seq q;
    plan_module_seq(&p->model, L, &p->work, &q);
    plan_cp_span span = plan_cp_span_of(plan_cp_of(&p->model.mod[L], &p->mod[L]), (int)q.seq, p->mod[L].sp, c.sp);
    return plan_cp_held(&span, a, b);
}
