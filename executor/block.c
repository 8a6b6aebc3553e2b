/* The pre-norm transformer block, forward and backward, with its
 * tensor-parallel regions (Megatron-LM's mappings: copy to / reduce from the
 * region, or under sequence parallelism all-gather into / reduce-scatter out
 * of it), the Ulysses all-to-alls and activation recomputation. Every
 * layer works on LOCAL shapes held in ex_module (d, H, Hkv, hd, f), so the
 * parallel layouts reuse the kernels with collectives in between. */
#include "executor/model_int.h"

#include <string.h>

const char *ex_comm_what(const ex_module *md)
{
    const char *sp = plan_cp_of(&md->mm, &md->strat) == PLAN_CP_RING ? "ring attention exchange" : "sequence-parallel alltoall";
    return md->sp > 1 && md->tp > 1 ? "tensor/sequence-parallel exchange" : md->sp > 1 ? sp : "tensor-parallel collective";
}

int ex_norm_rows(const ex_module *md) { return md->seqpar ? md->n_rows / md->tp : md->n_rows; }

void ex_norm_forward(const ex_backend *be, const ex_module *md, float *out, float *mean, float *rstd, const float *x,
                     const float *w, const float *b, int n)
{
    if (md->mm.norm == MODEL_NORM_LAYERNORM) be->layernorm_forward(out, mean, rstd, x, w, b, n, md->d, (float)model_norm_eps(&md->mm));
    else be->rmsnorm_forward(out, rstd, x, w, n, md->d, (float)model_norm_eps(&md->mm));
}

void ex_norm_backward(const ex_backend *be, const ex_module *md, float *dinp, float *dw, float *db, const float *dout,
                      const float *x, const float *w, const float *mean, const float *rstd, int n)
{
    if (md->mm.norm == MODEL_NORM_LAYERNORM) be->layernorm_backward(dinp, dw, db, dout, x, w, mean, rstd, n, md->d);
    else be->rmsnorm_backward(dinp, dw, dout, x, w, rstd, n, md->d);
}

/* A GELU MLP's activation: erf GELU, or CLIP's quick GELU (model_ffn_kind). */
static void mlp_act_forward(const ex_backend *be, const ex_module *md, float *out, const float *in, size_t n)
{
    if (md->mm.ffn_kind == MODEL_FFN_QUICK_GELU) be->quick_gelu_forward(out, in, n);
    else be->gelu_forward(out, in, n);
}

static void mlp_act_backward(const ex_backend *be, const ex_module *md, float *din, const float *dout, const float *in,
                             size_t n)
{
    if (md->mm.ffn_kind == MODEL_FFN_QUICK_GELU) be->quick_gelu_backward(din, dout, in, n);
    else be->gelu_backward(din, dout, in, n);
}

/* ------------------------------------------------------ tensor-parallel regions
 * Entering: the column-parallel linears' input, all N rows (under sequence
 * parallelism all-gathered from every rank's rows); its gradient leaves
 * summed over the group (all-reduce, or reduce-scatter back to the rows).
 * Leaving: the row-parallel output summed (all-reduce, or reduce-scatter to
 * this rank's rows); its gradient enters as all N rows (all-gathered). */

static const float *region_enter(ex_module *md, const float *rows)
{
    if (!md->seqpar) return rows;
    ex_tp_allgather(md, rows, md->a.tp_full, (size_t)ex_norm_rows(md) * md->d);
    return md->a.tp_full;
}

/* Where a row-parallel linear writes its partial sum of all N rows. */
static float *region_partial(ex_module *md, float *out) { return md->seqpar ? md->a.tp_part : out; }

static void region_leave(ex_module *md, float *partial, float *out)
{
    if (md->seqpar) ex_tp_reduce_scatter(md, partial, out, (size_t)ex_norm_rows(md) * md->d);
    else ex_tp_allreduce(md, out, (size_t)md->n_rows * md->d);
}

static const float *region_leave_grad(ex_module *md, const float *drows)
{
    if (!md->seqpar) return drows;
    ex_tp_allgather(md, drows, md->a.tp_dfull, (size_t)ex_norm_rows(md) * md->d);
    return md->a.tp_dfull;
}

/* Where the column-parallel linears' input gradient (a partial sum over all N rows) accumulates. */
static float *region_grad_partial(ex_module *md) { return md->seqpar ? md->a.tp_part : md->a.dln; }

static void region_enter_grad(ex_module *md, float *partial)
{
    if (md->seqpar) ex_tp_reduce_scatter(md, partial, md->a.dln, (size_t)ex_norm_rows(md) * md->d);
    else ex_tp_allreduce(md, md->a.dln, (size_t)md->n_rows * md->d);
}

/* -------------------------------------------------------------- Ulysses
 * The all-to-alls swap rows and heads (DeepSpeed-Ulysses, Jacobs et al.,
 * arXiv 2309.14509): this rank's Nl rows x all nh heads <-> all sp x Nl rows
 * x nh / sp heads, re-sharded by the backend around the exchange. An
 * encoder's rank holds a slice of the micro-batch's rows, so the rows come
 * back in order; the LLM's holds a slice of each of its g samples, so the
 * received rows, rank-major, are regrouped sample-major (and back). */

/* Sequences each rank holds a slice of. */
static int ulysses_groups(const ex_module *md) { return md->mm.kind == MODEL_LLM ? md->n_seq : 1; }

/* src [Nl, nh, hd] (this rank's rows) -> dst [sp * Nl, nh / sp, hd]. */
static void sp_heads_to_rows(const ex_backend *be, ex_module *md, float *dst, const float *src, int nh)
{
    int Nl = md->n_rows, sp = md->sp, g = ulysses_groups(md);
    size_t blk = (size_t)nh / sp * md->hd, chunk = (size_t)Nl * blk;
    be->transpose_blocks(md->a.sp_pack, src, Nl, sp, blk);        /* [Nl][sp][blk] -> [sp][Nl][blk] */
    float *recv = g > 1 ? md->a.sp_recv : dst;
    ex_sp_alltoall(md, md->a.sp_pack, recv, chunk);
    if (g > 1) be->transpose_blocks(dst, recv, sp, g, (size_t)(Nl / g) * blk);   /* [sp][g][..] -> [g][sp][..] */
}

/* The inverse: src [sp * Nl, nh / sp, hd] -> dst [Nl, nh, hd]. */
static void sp_rows_to_heads(const ex_backend *be, ex_module *md, float *dst, const float *src, int nh)
{
    int Nl = md->n_rows, sp = md->sp, g = ulysses_groups(md);
    size_t blk = (size_t)nh / sp * md->hd, chunk = (size_t)Nl * blk;
    const float *send = src;
    float *recv = md->a.sp_pack;
    if (g > 1) {
        be->transpose_blocks(md->a.sp_pack, src, g, sp, (size_t)(Nl / g) * blk);   /* [g][sp][..] -> [sp][g][..] */
        send = md->a.sp_pack;
        recv = md->a.sp_recv;
    }
    ex_sp_alltoall(md, send, recv, chunk);
    be->transpose_blocks(dst, recv, sp, Nl, blk);                 /* [sp][Nl][blk] -> [Nl][sp][blk] */
}

/* How layer l attends across the sp ranks (plan_cp_layer), and the heads it runs attention on. */
static plan_cp layer_cp(const ex_module *md, int l) { return plan_cp_layer(&md->mm, &md->strat, l, md->n_rows); }

/* The attention core of layer l: q, k, v (all rows x H / sp heads under
 * Ulysses, else this rank's rows) to att and lse. */
static void attention_core(const ex_backend *be, ex_module *md, int l, const int *cu, int nseq, bool causal)
{
    ex_block_acts *a = &md->a.blk[l];
    plan_cp cp = layer_cp(md, l);
    if (cp == PLAN_CP_RING) {
        ex_ring_forward(be, md, a, cu, nseq);
        return;
    }
    int div = cp == PLAN_CP_ULYSSES ? md->sp : 1;
    be->attention_forward(a->att, a->lse, a->q, a->k, a->v, cu, nseq, md->H / div, md->Hkv / div, md->hd, causal);
}

/* ---------------------------------------------------------------- blocks */

/* Pre-norm transformer block over N rows, weights of layer l:
 *   xmid = x + Wo attn(rope(Wq n1 + bq), rope(Wk n1 + bk), Wv n1 + bv) + bo,  n1 = norm1(x)
 *   out  = xmid + Wd (silu(Wg n2 + bg) * (Wu n2 + bu)) + bd,                   n2 = norm2(xmid)
 * q [N, H*hd], k/v [N, Hkv*hd], attention per sequence of cu (nseq), causal or not.
 * The norms are RMSNorm, or LayerNorm with a bias (Whisper's); a GELU MLP
 * (Whisper's fc1, fc2) is out = xmid + Wd gelu(Wu n2 + bu) + bd, and a
 * module without rotary positions (audio) skips the rope.
 * With tp > 1, H, Hkv and f are this rank's slice (q/k/v/gate/up split by rows,
 * o/down by columns) and the o and down outputs are summed over the group
 * before their (replicated) bias and the residual; under sequence
 * parallelism x, the norms and the residual hold this rank's N / tp rows.
 * With sp > 1 (Ulysses), rows are this rank's slice of the sequence; q, k, v
 * go through an all-to-all to all rows x H/sp heads for attention (cu then
 * counts all rows) and the output comes back. Reads a->x, writes out. */
void ex_block_forward(const ex_backend *be, ex_module *md, int l, float *out, const int *cu, int nseq, bool causal)
{
    const ex_block_w *w = &md->w.blk[l];
    ex_block_acts *a = &md->a.blk[l];
    int N = md->n_rows, Nl = ex_norm_rows(md), d = md->d, qd = md->H * md->hd, kd = md->Hkv * md->hd, f = md->f;
    bool sp = layer_cp(md, l) == PLAN_CP_ULYSSES;
    ex_norm_forward(be, md, a->ln1, a->mean1, a->rstd1, a->x, w->ln1, w->ln1b, Nl);
    const float *in = region_enter(md, a->ln1);
    float *q = sp ? md->a.dq : a->q, *k = sp ? md->a.dk : a->k, *v = sp ? md->a.dv : a->v;
    be->linear_forward(q, in, w->wq, w->bq, N, d, qd);
    be->linear_forward(k, in, w->wk, w->bk, N, d, kd);
    be->linear_forward(v, in, w->wv, w->bv, N, d, kd);
    if (md->rope) {
        be->rope_forward(q, md->a.cos, md->a.sin, N, md->H, md->hd);
        be->rope_forward(k, md->a.cos, md->a.sin, N, md->Hkv, md->hd);
    }
    if (sp) {
        sp_heads_to_rows(be, md, a->q, q, md->H);
        sp_heads_to_rows(be, md, a->k, k, md->Hkv);
        sp_heads_to_rows(be, md, a->v, v, md->Hkv);
    }
    attention_core(be, md, l, cu, nseq, causal);
    if (sp) sp_rows_to_heads(be, md, a->att_loc, a->att, md->H);
    float *part = region_partial(md, a->xmid);
    be->linear_forward(part, sp ? a->att_loc : a->att, w->wo, NULL, N, qd, d);
    region_leave(md, part, a->xmid);
    if (w->bo) be->add_bias(a->xmid, w->bo, Nl, d);
    be->add_inplace(a->xmid, a->x, (size_t)Nl * d);
    ex_norm_forward(be, md, a->ln2, a->mean2, a->rstd2, a->xmid, w->ln2, w->ln2b, Nl);
    in = region_enter(md, a->ln2);
    if (md->mm.ffn_kind == MODEL_FFN_SWIGLU) {
        be->linear_forward(a->g, in, w->wg, w->bg, N, d, f);
        be->linear_forward(a->u, in, w->wu, w->bu, N, d, f);
        be->swiglu_forward(a->h, a->g, a->u, (size_t)N * f);
    } else {
        be->linear_forward(a->g, in, w->wu, w->bu, N, d, f);   /* fc1 */
        mlp_act_forward(be, md, a->h, a->g, (size_t)N * f);
    }
    part = region_partial(md, out);
    be->linear_forward(part, a->h, w->wd, NULL, N, f, d);
    region_leave(md, part, out);
    if (w->bd) be->add_bias(out, w->bd, Nl, d);
    be->add_inplace(out, a->xmid, (size_t)Nl * d);
}

/* Block backward: dres [Nl, d] holds dL/d(out) on entry and dL/d(x) on return;
 * weight gradients accumulate into the module's gradient views of layer l
 * (NULL views, a frozen module's, are skipped by the kernels). Under sequence
 * parallelism the norms' weight (and LayerNorm bias) gradients are partial
 * sums over the group's rows: they are summed over it (Megatron all-reduces
 * them in finalize_model_grads) before they accumulate; tp_grads holds them
 * as [norm1 w, norm2 w, norm1 b, norm2 b]. */
void ex_block_backward(const ex_backend *be, ex_module *md, int l, float *dres, const int *cu, int nseq, bool causal)
{
    const ex_block_w *w = &md->w.blk[l];
    ex_block_w *gw = &md->g.blk[l];
    ex_block_acts *a = &md->a.blk[l];
    ex_acts *s = &md->a;
    int N = md->n_rows, Nl = ex_norm_rows(md), d = md->d, qd = md->H * md->hd, kd = md->Hkv * md->hd, f = md->f;
    size_t Nd = (size_t)N * d, Nf = (size_t)N * f;
    bool partial_norms = md->seqpar && gw->ln1, ln = md->mm.norm == MODEL_NORM_LAYERNORM;
    bool swiglu = md->mm.ffn_kind == MODEL_FFN_SWIGLU;
    size_t n_norm = (ln ? 4 : 2) * (size_t)d;
    float *dln1 = partial_norms ? s->tp_grads : gw->ln1, *dln2 = partial_norms ? s->tp_grads + d : gw->ln2;
    float *dln1b = partial_norms && ln ? s->tp_grads + 2 * d : gw->ln1b;
    float *dln2b = partial_norms && ln ? s->tp_grads + 3 * d : gw->ln2b;
    if (partial_norms) be->zero(s->tp_grads, n_norm);
    const float *dout = region_leave_grad(md, dres);
    be->zero(s->dh, Nf);
    be->linear_backward(s->dh, gw->wd, gw->bd, dout, a->h, w->wd, N, f, d);
    be->zero(s->dg, Nf);
    if (swiglu) {
        be->zero(s->du, Nf);
        be->swiglu_backward(s->dg, s->du, s->dh, a->g, a->u, Nf);
    } else {
        mlp_act_backward(be, md, s->dg, s->dh, a->g, Nf);
    }
    const float *in = region_enter(md, a->ln2);
    float *dpart = region_grad_partial(md);
    be->zero(dpart, Nd);
    if (swiglu) {
        be->linear_backward(dpart, gw->wg, gw->bg, s->dg, in, w->wg, N, d, f);
        be->linear_backward(dpart, gw->wu, gw->bu, s->du, in, w->wu, N, d, f);
    } else {
        be->linear_backward(dpart, gw->wu, gw->bu, s->dg, in, w->wu, N, d, f);   /* fc1 */
    }
    region_enter_grad(md, dpart);
    ex_norm_backward(be, md, dres, dln2, dln2b, s->dln, a->xmid, w->ln2, a->mean2, a->rstd2, Nl);
    plan_cp cp = layer_cp(md, l);
    bool sp = cp == PLAN_CP_ULYSSES;
    dout = region_leave_grad(md, dres);
    be->zero(s->datt, (size_t)N * qd);
    be->linear_backward(s->datt, gw->wo, gw->bo, dout, sp ? a->att_loc : a->att, w->wo, N, qd, d);
    if (cp == PLAN_CP_RING) {
        ex_ring_backward(be, md, a, s->datt, cu, nseq);   /* into s->dq, s->dk, s->dv */
    } else {
        if (sp) sp_heads_to_rows(be, md, s->sp_datt, s->datt, md->H);
        float *dq = sp ? s->sp_dq : s->dq, *dk = sp ? s->sp_dk : s->dk, *dv = sp ? s->sp_dv : s->dv;
        int div = sp ? md->sp : 1;
        be->zero(dq, (size_t)N * qd);
        be->zero(dk, (size_t)N * kd);
        be->zero(dv, (size_t)N * kd);
        be->attention_backward(dq, dk, dv, sp ? s->sp_datt : s->datt, a->q, a->k, a->v, a->att, a->lse,
                               cu, nseq, md->H / div, md->Hkv / div, md->hd, causal);
        if (sp) {
            sp_rows_to_heads(be, md, s->dq, dq, md->H);
            sp_rows_to_heads(be, md, s->dk, dk, md->Hkv);
            sp_rows_to_heads(be, md, s->dv, dv, md->Hkv);
        }
    }
    if (md->rope) {
        be->rope_backward(s->dq, s->cos, s->sin, N, md->H, md->hd);
        be->rope_backward(s->dk, s->cos, s->sin, N, md->Hkv, md->hd);
    }
    in = region_enter(md, a->ln1);
    be->zero(dpart, Nd);
    be->linear_backward(dpart, gw->wq, gw->bq, s->dq, in, w->wq, N, d, qd);
    be->linear_backward(dpart, gw->wk, gw->bk, s->dk, in, w->wk, N, d, kd);
    be->linear_backward(dpart, gw->wv, gw->bv, s->dv, in, w->wv, N, d, kd);
    region_enter_grad(md, dpart);
    ex_norm_backward(be, md, dres, dln1, dln1b, s->dln, a->x, w->ln1, a->mean1, a->rstd1, Nl);
    if (partial_norms) {
        ex_tp_allreduce_f32(md, s->tp_grads, n_norm);   /* weight gradients: fp32 */
        be->add_inplace(gw->ln1, s->tp_grads, (size_t)d);
        be->add_inplace(gw->ln2, s->tp_grads + d, (size_t)d);
        if (ln) {
            be->add_inplace(gw->ln1b, s->tp_grads + 2 * d, (size_t)d);
            be->add_inplace(gw->ln2b, s->tp_grads + 3 * d, (size_t)d);
        }
    }
}

float *ex_stage_input(ex_module *md)
{
    return md->stage.count > 0 ? md->a.blk[md->stage.first].x : md->a.x_final;
}

/* Block l's output: the next block's input, or the stage's last output. */
static float *block_out(ex_module *md, int l)
{
    return l + 1 < md->stage.first + md->stage.count ? md->a.blk[l + 1].x : md->a.x_final;
}

/* What a recomputing backward re-runs of layer l's forward first: the whole
 * block (full), or the attention core and the MLP activation (selective),
 * into the tensors every block shares; nothing where the block keeps its
 * activations (plan_block_recompute). */
static void recompute(const ex_backend *be, ex_module *md, int l, const int *cu, int nseq, bool causal)
{
    plan_recompute rc = plan_block_recompute(&md->strat, &md->stage, l);
    if (rc == PLAN_RECOMP_FULL) {
        ex_block_forward(be, md, l, md->a.rc_out, cu, nseq, causal);
    } else if (rc == PLAN_RECOMP_SELECTIVE) {
        attention_core(be, md, l, cu, nseq, causal);
        ex_block_acts *a = &md->a.blk[l];
        if (md->mm.ffn_kind == MODEL_FFN_SWIGLU) be->swiglu_forward(a->h, a->g, a->u, (size_t)md->n_rows * md->f);
        else mlp_act_forward(be, md, a->h, a->g, (size_t)md->n_rows * md->f);
    }
}

/* The sequences layer l attends within: the windows of a window layer (this
 * rank's own when it keeps the layer local), else the whole sequences. */
static int layer_seqs(const ex_module *md, int l, const int *cu, const int *cu_win, const int **c)
{
    if (model_layer_is_full_attention(&md->mm, l)) {
        *c = cu;
        return md->n_seq;
    }
    *c = cu_win;
    return layer_cp(md, l) == PLAN_CP_NONE && md->sp > 1 ? md->n_rows / md->mm.window : md->n_win;
}

void ex_blocks_forward(const ex_backend *be, ex_module *md, const int *cu, const int *cu_win, bool causal)
{
    for (int l = md->stage.first; l < md->stage.first + md->stage.count; l++) {
        const int *c;
        int n = layer_seqs(md, l, cu, cu_win, &c);
        ex_unit_begin(md, 1 + l, EX_USE_FORWARD);
        ex_block_forward(be, md, l, block_out(md, l), c, n, causal);
        ex_acts_pack(md, l);   /* bf16: the layer's saved tensors into the slot */
        ex_unit_end(md, 1 + l, EX_USE_FORWARD, false);
    }
}

void ex_blocks_backward(const ex_backend *be, ex_module *md, const int *cu, const int *cu_win, bool causal)
{
    for (int l = md->stage.first + md->stage.count - 1; l >= md->stage.first; l--) {
        const int *c;
        int n = layer_seqs(md, l, cu, cu_win, &c);
        ex_unit_begin(md, 1 + l, EX_USE_BACKWARD);
        ex_acts_unpack(md, l);
        recompute(be, md, l, c, n, causal);
        ex_block_backward(be, md, l, md->a.dres, c, n, causal);
        ex_unit_end(md, 1 + l, EX_USE_BACKWARD, true);
    }
}
