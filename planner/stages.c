/* Pipeline stages as data: how a module's blocks split over its pipeline
 * stages and their interleaved chunks (plan_stage_of and its split rules),
 * and which of a stage's blocks recompute (plan_block_recompute). The
 * activation and tensor layouts (layout.c), the prices, the memory formulas,
 * the schedule and the executor take their stages from here. */
#include "planner/planner.h"

#include <stdio.h>

/* One contiguous range of blocks, as a stage (or a model chunk) of one chunk. */
static plan_stage contiguous(int first, int count, bool stem, bool head)
{
    plan_stage st = { .first = first, .count = count, .stem = stem, .head = head, .chunks = 1 };
    st.chunk_first[0] = first;
    st.chunk_count[0] = count;
    return st;
}

/* Blocks of each virtual stage g = v pp + j (chunk v of rank stage j) under
 * split_ends: Megatron-Core's account_for_embedding_in_pipeline_split and
 * account_for_loss_in_pipeline_split (megatron/core/transformer/
 * transformer_layer.py get_transformer_layer_offset, transformer_block.py
 * get_num_layers_to_build): the embedding and the loss count as a layer each,
 * the L + 2 split evenly over the pp vp virtual stages (num_layers // pp //
 * vp, which plan_stage_split_check asks to divide), the first virtual stage a
 * block short for the embedding and the last one for the head. Llama 3 405B's
 * layout (Llama Team, arXiv 2407.21783 sec. 3.3.2): 126 layers, pp 16, V 8:
 * the first chunk the embedding alone, the last the output layer and loss. */
static void split_ends_counts(int L, int pp, int vp, int *vcount)
{
    int G = pp * vp, per = (L + 2) / G, extra = (L + 2) % G;
    for (int g = 0; g < G; g++) vcount[g] = per + (g < extra);
    /* (more virtual stages than slots, which the check refuses, leave them empty, never negative) */
    if (vcount[0] > 0) vcount[0]--;
    if (vcount[G - 1] > 0) vcount[G - 1]--;
}

bool plan_stage_layers_given(const plan_module *s)
{
    int pp = s->pp < PLAN_MAX_PP ? s->pp : PLAN_MAX_PP;
    for (int j = 0; j < pp; j++)
        if (s->stage_layers[j] > 0) return true;
    return false;
}

plan_stage plan_stage_of(const model_module *mm, const plan_module *s, int i)
{
    int pp = s && s->pp > 1 ? s->pp : 1, L = mm->layers;
    if (pp == 1 || i < 0) return contiguous(0, L, true, true);
    if (pp > PLAN_MAX_PP) pp = PLAN_MAX_PP;
    int vp = plan_vp(s) < PLAN_MAX_VP ? plan_vp(s) : PLAN_MAX_VP;
    int vcount[PLAN_MAX_PP * PLAN_MAX_VP];
    if (s->split_ends) {
        split_ends_counts(L, pp, vp, vcount);
    } else {
        int count[PLAN_MAX_PP];
        if (plan_stage_layers_given(s)) {
            for (int j = 0; j < pp; j++) count[j] = s->stage_layers[j];
        } else {
            int base = (L + pp - 1) / pp, short_by = base * pp - L;
            for (int j = 0; j < pp; j++) count[j] = base;
            /* the shortfall comes off the ends first: stage 0, pp - 1, 1, pp - 2, ... */
            for (int t = 0; t < short_by; t++) count[t % 2 ? pp - 1 - t / 2 : t / 2]--;
        }
        /* each stage's blocks in vp chunks as even as they allow, the first chunks longer */
        for (int v = 0; v < vp; v++)
            for (int j = 0; j < pp; j++) vcount[v * pp + j] = count[j] / vp + (v < count[j] % vp);
    }
    /* Interleaved: round v holds every rank's chunk v in stage order
     * (Megatron-LM's virtual pipeline layout), so virtual stage v pp + j
     * starts after the blocks of the virtual stages before it. */
    plan_stage st = contiguous(0, 0, i == 0, i == pp - 1);
    st.chunks = vp;
    for (int g = 0, first = 0; g < pp * vp; g++) {
        if (g % pp == i) {
            st.chunk_first[g / pp] = first;
            st.chunk_count[g / pp] = vcount[g];
            st.count += vcount[g];
        }
        first += vcount[g];
    }
    st.first = st.chunk_first[0];
    return st;
}

int plan_stage_split_check(const model_module *mm, const plan_module *s, char *err)
{
    int pp = s->pp > 1 ? s->pp : 1, vp = plan_vp(s);
    if (pp > PLAN_MAX_PP || pp > mm->layers)
        return util_fail(err, UTIL_EINVAL, "%s: pp %d: at most %d stages, and one block each (%d layers)", mm->name, pp,
                         PLAN_MAX_PP, mm->layers);
    if (vp > 1 && (pp == 1 || vp > PLAN_MAX_VP))
        return util_fail(err, UTIL_EINVAL, "%s: vp %d needs pp > 1 and at most %d chunks a stage", mm->name, vp, PLAN_MAX_VP);
    if (s->split_ends) {
        if (plan_stage_layers_given(s))
            return util_fail(err, UTIL_EINVAL, "%s: split: stage_layers and split_ends are two splits; give one", mm->name);
        if (pp == 1 || (mm->layers + 2) % (pp * vp))
            return util_fail(err, UTIL_EINVAL,
                             "%s: split_ends: the %d blocks with the embedding and the head (%d) need pp > 1 and "
                             "to divide by pp x vp = %d", mm->name, mm->layers, mm->layers + 2, pp * vp);
    }
    int total = 0;
    for (int i = 0; i < pp; i++) {
        plan_stage st = plan_stage_of(mm, s, i);
        if (st.count < 1)
            return util_fail(err, UTIL_EINVAL, "%s: split: pipeline stage %d has no block", mm->name, i);
        /* Interleaving splits every stage's blocks into vp chunks of a block or
         * more; under split_ends the embedding's or the head's chunk may hold
         * that alone. */
        for (int v = 0; v < st.chunks; v++) {
            bool end = (i == 0 && v == 0) || (i == pp - 1 && v == st.chunks - 1);
            if (st.chunk_count[v] < 1 && !(s->split_ends && end))
                return util_fail(err, UTIL_EINVAL, "%s: vp %d needs at least vp blocks a stage (stage %d holds %d)",
                                 mm->name, vp, i, st.count);
        }
        total += st.count;
    }
    if (total != mm->layers)
        return util_fail(err, UTIL_EINVAL, "%s: stage_layers: the stages hold %d blocks, the module has %d", mm->name, total,
                         mm->layers);
    return UTIL_OK;
}

int plan_stage_block(const plan_stage *st, int j)
{
    for (int v = 0; st->chunks > 1 && v < st->chunks && v < PLAN_MAX_VP; v++) {
        if (j < st->chunk_count[v]) return st->chunk_first[v] + j;
        j -= st->chunk_count[v];
    }
    return st->first + j;
}

plan_stage plan_stage_chunk(const plan_stage *st, int v)
{
    if (st->chunks <= 1 || v < 0 || v >= PLAN_MAX_VP) return *st;
    return contiguous(st->chunk_first[v], st->chunk_count[v], st->stem && v == 0, st->head && v == st->chunks - 1);
}

plan_stage plan_vstage_of(const model_module *mm, const plan_module *s, int g)
{
    int pp = s && s->pp > 1 ? s->pp : 1;
    if (g < 0) return plan_stage_of(mm, s, g);
    plan_stage st = plan_stage_of(mm, s, g % pp);
    return plan_stage_chunk(&st, g / pp);
}

plan_recompute plan_block_recompute(const plan_module *s, const plan_stage *st, int layer)
{
    if (s->recompute != PLAN_RECOMP_FULL || s->recompute_layers <= 0) return s->recompute;
    int first = st->first;
    for (int v = 0; st->chunks > 1 && v < st->chunks && v < PLAN_MAX_VP; v++)
        if (layer >= st->chunk_first[v] && layer < st->chunk_first[v] + st->chunk_count[v]) first = st->chunk_first[v];
    return layer - first < s->recompute_layers ? PLAN_RECOMP_FULL : PLAN_RECOMP_NONE;
}

int plan_stage_recomputed_blocks(const plan_module *s, const plan_stage *st)
{
    int n = 0;
    for (int j = 0; j < st->count; j++) {
        int l = plan_stage_block(st, j);
        n += plan_block_recompute(s, st, l) == PLAN_RECOMP_FULL;
    }
    return n;
}

int plan_longest_chunk(const model_module *mm, const plan_module *s)
{
    int longest = 0;
    for (int g = 0; g < s->pp * plan_vp(s); g++) {
        int c = plan_vstage_of(mm, s, g).count;
        if (c > longest) longest = c;
    }
    return longest;
}
