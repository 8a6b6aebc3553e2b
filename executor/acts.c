/* Activations: each module's forward fills a slot with what its backward
 * needs, carved tensor by tensor as plan_module_acts lists them (the memory
 * model sums the same list); scratch is shared by all slots. */
#include "executor/model_int.h"
#include "executor/precision.h"

#include <string.h>

/* Where the pointer to an activation tensor lives. */
static float **act_view(ex_acts *a, plan_act_id id, int layer)
{
    if (id < PLAN_NACT_BLOCK) {
        ex_block_acts *b = &a->blk[layer];
        float **f[PLAN_NACT_BLOCK] = {
            [PLAN_ACT_X] = &b->x, [PLAN_ACT_LN1] = &b->ln1, [PLAN_ACT_RSTD1] = &b->rstd1, [PLAN_ACT_Q] = &b->q,
            [PLAN_ACT_K] = &b->k, [PLAN_ACT_V] = &b->v, [PLAN_ACT_ATT] = &b->att, [PLAN_ACT_LSE] = &b->lse,
            [PLAN_ACT_XMID] = &b->xmid, [PLAN_ACT_LN2] = &b->ln2, [PLAN_ACT_RSTD2] = &b->rstd2, [PLAN_ACT_G] = &b->g,
            [PLAN_ACT_U] = &b->u, [PLAN_ACT_H] = &b->h, [PLAN_ACT_ATT_LOC] = &b->att_loc,
            [PLAN_ACT_MEAN1] = &b->mean1, [PLAN_ACT_MEAN2] = &b->mean2,
        };
        return f[id];
    }
    switch (id) {
    case PLAN_ACT_X_FINAL: return &a->x_final;
    case PLAN_ACT_COS: return &a->cos;
    case PLAN_ACT_SIN: return &a->sin;
    case PLAN_ACT_RC_OUT: return &a->rc_out;
    case PLAN_ACT_SP_PACK: return &a->sp_pack;
    case PLAN_ACT_SP_DQ: return &a->sp_dq;
    case PLAN_ACT_SP_DK: return &a->sp_dk;
    case PLAN_ACT_SP_DV: return &a->sp_dv;
    case PLAN_ACT_SP_DATT: return &a->sp_datt;
    case PLAN_ACT_SP_RECV: return &a->sp_recv;
    case PLAN_ACT_RING_KV: return &a->ring_kv;
    case PLAN_ACT_RING_DKV: return &a->ring_dkv;
    case PLAN_ACT_RING_OUT: return &a->ring_out;
    case PLAN_ACT_RING_LSE: return &a->ring_lse;
    case PLAN_ACT_TP_FULL: return &a->tp_full;
    case PLAN_ACT_TP_PART: return &a->tp_part;
    case PLAN_ACT_TP_DFULL: return &a->tp_dfull;
    case PLAN_ACT_TP_GRADS: return &a->tp_grads;
    case PLAN_ACT_DRES: return &a->dres;
    case PLAN_ACT_DLN: return &a->dln;
    case PLAN_ACT_DQ: return &a->dq;
    case PLAN_ACT_DK: return &a->dk;
    case PLAN_ACT_DV: return &a->dv;
    case PLAN_ACT_DATT: return &a->datt;
    case PLAN_ACT_DG: return &a->dg;
    case PLAN_ACT_DU: return &a->du;
    case PLAN_ACT_DH: return &a->dh;
    case PLAN_ACT_MLN: return &a->mln;
    case PLAN_ACT_MRSTD: return &a->mrstd;
    case PLAN_ACT_H1: return &a->h1;
    case PLAN_ACT_A1: return &a->a1;
    case PLAN_ACT_VOUT: return &a->vout;
    case PLAN_ACT_DH1: return &a->dh1;
    case PLAN_ACT_DA1: return &a->da1;
    case PLAN_ACT_XG: return &a->xg;
    case PLAN_ACT_RSTDF: return &a->rstdf;
    case PLAN_ACT_GATH: return &a->gath;
    case PLAN_ACT_LOGITS: return &a->logits;
    case PLAN_ACT_DLOGITS: return &a->dlogits;
    case PLAN_ACT_CE_MX: return &a->ce_mx;
    case PLAN_ACT_CE_ST: return &a->ce_st;
    case PLAN_ACT_EMB: return &a->emb;
    case PLAN_ACT_DGATH: return &a->dgath;
    case PLAN_ACT_DXG: return &a->dxg;
    case PLAN_ACT_DVIS: return &a->dvis;
    case PLAN_ACT_C1PRE: return &a->c1pre;
    case PLAN_ACT_C1OUT: return &a->c1out;
    case PLAN_ACT_C2PRE: return &a->c2pre;
    case PLAN_ACT_COL: return &a->col;
    case PLAN_ACT_DCOL: return &a->dcol;
    case PLAN_ACT_DC1OUT: return &a->dc1out;
    case PLAN_ACT_DC1PRE: return &a->dc1pre;
    case PLAN_ACT_POOLED: return &a->pooled;
    case PLAN_ACT_FLN: return &a->fln;
    case PLAN_ACT_FMEAN: return &a->fmean;
    case PLAN_ACT_FRSTD: return &a->frstd;
    case PLAN_ACT_AOUT: return &a->aout;
    case PLAN_ACT_DPOOLED: return &a->dpooled;
    case PLAN_ACT_CLIP_EMB: return &a->clip_emb;
    case PLAN_ACT_CLIP_MEAN: return &a->clip_mean;
    case PLAN_ACT_CLIP_RSTD: return &a->clip_rstd;
    default: return NULL;
    }
}

/* Points every block's view of a tensor shared by all blocks: the
 * recomputed ones, and under bf16 the fp32 copy of a layer being run, the
 * block input's split between even layers (X) and odd ones (X_ODD). */
static void bind_shared(ex_module *md, plan_act_id id, float *p)
{
    for (int l = 0; l < md->mm.layers; l++) {
        if (id == PLAN_ACT_X_ODD) {
            if (l % 2) md->a.blk[l].x = p;
        } else if (id != PLAN_ACT_X || !md->a.blk[l].bf[PLAN_ACT_X] || l % 2 == 0) {
            *act_view(&md->a, id, l) = p;
        }
    }
}

/* Carves a module's activations for one slot's geometry out of saved (the
 * slot) and scratch, each tensor its elements' bytes (fp32, or bf16 where
 * the list says); with NULL bases it only counts bytes. The list gives a
 * block's bf16 tensors before the shared copies that hold them in fp32. */
static int acts_layout(ex_module *md, void *saved, void *scratch, const ex_slot *g, size_t *n_saved,
                       size_t *n_scratch)
{
    plan_act_rows rows = { g->n_rows, g->m_rows, g->n_pred, g->emb_rows, md->bf16 };
    int n = plan_module_acts(&md->mm, &md->strat, md->stage_index, &rows, NULL, 0);
    plan_act *list = util_malloc((size_t)n * sizeof *list);
    if (!list) return UTIL_ENOMEM;
    plan_module_acts(&md->mm, &md->strat, md->stage_index, &rows, list, n);
    size_t os = 0, ox = 0;
    if (saved)
        for (int l = 0; l < md->mm.layers; l++) memset(md->a.blk[l].bf, 0, sizeof md->a.blk[l].bf);
    for (int i = 0; i < n; i++) {
        const plan_act *a = &list[i];
        size_t *off = a->saved ? &os : &ox;
        char *base = a->saved ? saved : scratch, *p = base ? base + *off : NULL;
        *off += a->elems * (a->bf16 ? sizeof(uint16_t) : sizeof(float));
        if (!base) continue;
        if (a->bf16) {
            md->a.blk[a->layer].bf[a->id] = (uint16_t *)(void *)p;
            md->a.blk[a->layer].bf_n[a->id] = a->elems;
        } else if (a->id == PLAN_ACT_X_ODD || (a->id < PLAN_NACT_BLOCK && a->layer < 0)) {
            bind_shared(md, a->id, (float *)(void *)p);
        } else if (a->layer < 0 || a->id >= PLAN_NACT_BLOCK) {
            *act_view(&md->a, a->id, a->layer) = (float *)(void *)p;
        }
    }
    /* A block's own fp32 tensors last: under partial recomputation
     * (plan_block_recompute) a shared copy listed after them serves the
     * recomputing blocks only, and must not take the others' views. */
    for (size_t i = 0, bs = 0, bx = 0; saved && i < (size_t)n; i++) {
        const plan_act *a = &list[i];
        size_t *off = a->saved ? &bs : &bx;
        char *p = (a->saved ? (char *)saved : (char *)scratch) + *off;
        *off += a->elems * (a->bf16 ? sizeof(uint16_t) : sizeof(float));
        if (!a->bf16 && a->layer >= 0 && a->id < PLAN_NACT_BLOCK && a->id != PLAN_ACT_X_ODD)
            *act_view(&md->a, a->id, a->layer) = (float *)(void *)p;
    }
    util_free(list);
    if (n_saved) *n_saved = os;
    if (n_scratch) *n_scratch = ox;
    return UTIL_OK;
}

void ex_acts_pack(ex_module *md, int l)
{
    ex_block_acts *b = &md->a.blk[l];
    for (int id = 0; id < PLAN_NACT_BLOCK; id++)
        if (b->bf[id]) md->be->to_bf16(b->bf[id], *act_view(&md->a, (plan_act_id)id, l), b->bf_n[id]);
}

void ex_acts_unpack(ex_module *md, int l)
{
    ex_block_acts *b = &md->a.blk[l];
    for (int id = 0; id < PLAN_NACT_BLOCK; id++)
        if (b->bf[id]) md->be->from_bf16(*act_view(&md->a, (plan_act_id)id, l), b->bf[id], b->bf_n[id]);
}

/* Points md->a and the geometry at the current slot's activations. */
void ex_slot_bind(ex_module *md)
{
    ex_slot *s = &md->slot[md->cur];
    acts_layout(md, s->mem, md->scratch, s, NULL, NULL);
    md->cu = s->cu;
    md->cu_win = s->cu_win;
    md->cu_dev = s->cu_dev;
    md->cu_win_dev = s->cu_win_dev;
    md->n_rows = s->n_rows;
    md->n_seq = s->n_seq;
    md->n_win = s->n_win;
}

int ex_dev_reserve(const ex_backend *be, void **buf, size_t *cap, size_t bytes, util_mem_cat cat)
{
    if (bytes <= *cap && *buf) return UTIL_OK;
    be->release(*buf);
    *cap = 0;
    *buf = be->alloc(bytes, cat);
    if (!*buf) return UTIL_ENOMEM;
    *cap = bytes;
    return UTIL_OK;
}

/* Grows *buf (bytes, UTIL_MEM_ACTIV, the backend's) to hold need; the contents are not kept. */
static int grow_bytes(const ex_backend *be, void **buf, size_t *cap, size_t need)
{
    if (need <= *cap && *buf) return UTIL_OK;
    be->release(*buf);
    *cap = 0;
    *buf = be->alloc(need ? need : 1, UTIL_MEM_ACTIV);
    if (!*buf) return UTIL_ENOMEM;
    *cap = need;
    return UTIL_OK;
}

/* Sizes the current slot (allocated on first use, grown when a batch needs
 * more) and the shared scratch for a forward, then binds them. The LLM
 * sizes its head for reserve_pred predictions (every text position) however
 * many the loss mask counts, so its memory does not depend on the data. */
int ex_acts_ensure(ex_module *md, int n, int m_rows, int n_pred, int reserve_pred, int emb_rows, int n_cu, char *err)
{
    ex_slot *s = &md->slot[md->cur];
    ex_slot want = { .n_rows = n, .m_rows = m_rows, .n_pred = n_pred > reserve_pred ? n_pred : reserve_pred,
                     .emb_rows = emb_rows };
    size_t ns, nx;
    if (acts_layout(md, NULL, NULL, &want, &ns, &nx))
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory", md->mm.name);
    s->filled = false;
    if (grow_bytes(md->be, &s->mem, &s->cap, ns) || grow_bytes(md->be, &md->scratch, &md->scratch_cap, nx))
        return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for activations (%zu bytes)", md->mm.name, ns + nx);
    plan_act_rows rows = { want.n_rows, want.m_rows, want.n_pred, want.emb_rows, md->bf16 };
    int rc = ex_precision_reserve(md, &rows, err);
    if (rc) return rc;
    if (n_cu + 1 > s->n_cu_cap) {
        size_t bytes = (size_t)(n_cu + 1) * sizeof(int);
        util_free(s->cu);
        util_free(s->cu_win);
        md->be->release(s->cu_dev);
        md->be->release(s->cu_win_dev);
        s->cu = util_malloc(bytes);
        s->cu_win = util_malloc(bytes);
        s->cu_dev = md->be->alloc(bytes, UTIL_MEM_ACTIV);
        s->cu_win_dev = md->be->alloc(bytes, UTIL_MEM_ACTIV);
        s->n_cu_cap = s->cu && s->cu_win && s->cu_dev && s->cu_win_dev ? n_cu + 1 : 0;
        if (!s->n_cu_cap) return util_fail(err, UTIL_ENOMEM, "executor: out of memory for sequence offsets");
    }
    s->n_rows = n;
    s->m_rows = m_rows;
    s->n_pred = want.n_pred;
    s->emb_rows = emb_rows;
    s->n_seq = s->n_win = 0;
    ex_slot_bind(md);
    return UTIL_OK;
}

/* Records the sequence counts of the forward that just filled the current slot. */
void ex_slot_filled(ex_module *md)
{
    ex_slot *s = &md->slot[md->cur];
    s->n_seq = md->n_seq;
    s->n_win = md->n_win;
    s->filled = true;
}

void ex_cu_upload(ex_module *md, int n_seq, int n_win)
{
    md->be->h2d(md->cu_dev, md->cu, (size_t)(n_seq + 1) * sizeof(int));
    if (n_win >= 0) md->be->h2d(md->cu_win_dev, md->cu_win, (size_t)(n_win + 1) * sizeof(int));
}

void *ex_slot_input(ex_module *md, const void *src, size_t bytes, bool tok, char *err)
{
    ex_slot *s = &md->slot[md->cur];
    void **buf = tok ? &s->tok_dev : &s->in_dev;
    size_t *cap = tok ? &s->tok_cap : &s->in_cap;
    /* The batch is input data, host memory in the CPU run too (UTIL_MEM_OTHER): not a planned category. */
    if (ex_dev_reserve(md->be, buf, cap, bytes ? bytes : 1, UTIL_MEM_OTHER)) {
        util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for the batch's inputs (%zu bytes)", md->mm.name, bytes);
        return NULL;
    }
    md->be->h2d(*buf, src, bytes);
    return *buf;
}

int ex_rope_host(ex_module *md, size_t n, float **cos, float **sin, char *err)
{
    size_t need = 2 * n * (size_t)(md->hd / 2);
    if (need > md->host_rope_cap || !md->host_rope) {
        util_free(md->host_rope);
        md->host_rope = util_malloc((need ? need : 1) * sizeof(float));
        md->host_rope_cap = md->host_rope ? need : 0;
        if (!md->host_rope) return util_fail(err, UTIL_ENOMEM, "executor: module %s: out of memory for the rotary tables", md->mm.name);
    }
    *cos = md->host_rope;
    *sin = md->host_rope + need / 2;
    return UTIL_OK;
}

void ex_rope_upload(ex_module *md, size_t n)
{
    size_t half = n * (size_t)(md->hd / 2);
    md->be->h2d(md->a.cos, md->host_rope, half * sizeof(float));
    md->be->h2d(md->a.sin, md->host_rope + half, half * sizeof(float));
}

void ex_acts_free(ex_module *md)
{
    const ex_backend *be = md->be;
    for (int i = 0; i < EX_MAX_SLOTS; i++) {
        ex_slot *s = &md->slot[i];
        be->release(s->mem);
        util_free(s->cu);
        util_free(s->cu_win);
        be->release(s->cu_dev);
        be->release(s->cu_win_dev);
        be->release(s->in_dev);
        be->release(s->tok_dev);
    }
    be->release(md->scratch);
    util_free(md->host_rope);
}
