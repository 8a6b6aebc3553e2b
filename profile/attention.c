/* dhp profile: the backend's attention kernels (executor/backend.h
 * attention_forward / attention_backward), causal or not, on the backend's
 * memory, a call holding as many sequences of a shape as the caller says
 * (the executor's calls hold a micro-batch's). */
#include "profile/profile_int.h"

#include <math.h>
#include <string.h>

#define ATTN_MAX_SEQS 16

typedef struct {
    const ex_backend *be;
    int n, H, Hkv, hd;
    const float *q, *k, *v, *dout;
    float *out, *lse, *dq, *dk, *dv;
    const int *cu;       /* backend memory: {0, n, 2n, ..} */
    int nseq;
    bool causal;
} attn_arg;

static void attn_forward(void *arg)
{
    attn_arg *a = arg;
    a->be->attention_forward(a->out, a->lse, a->q, a->k, a->v, a->cu, a->nseq, a->H, a->Hkv, a->hd, a->causal);
}

static void attn_backward(void *arg)
{
    attn_arg *a = arg;
    a->be->attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out, a->lse, a->cu, a->nseq, a->H,
                              a->Hkv, a->hd, a->causal);
}

/* Buffers: q, k, v, dout (filled), out, dq, dk, dv, lse (zeroed), one after another. */
static int measure_one(const prof_ctx *c, cost_profile_attn *r, double target, char *err)
{
    int ns = r->seqs;
    size_t nq = (size_t)ns * r->seq * r->heads * r->head_dim, nkv = (size_t)ns * r->seq * r->kv_heads * r->head_dim;
    size_t filled = 2 * nq + 2 * nkv, total = 4 * nq + 4 * nkv + (size_t)ns * r->seq * r->heads;
    float *buf = prof_alloc_filled(c, total, 0, err), *in = buf ? prof_alloc_filled(c, filled, 3, err) : NULL;
    int *cu = in ? c->be->alloc((ATTN_MAX_SEQS + 1) * sizeof *cu, UTIL_MEM_OTHER) : NULL;
    int rc = cu ? UTIL_OK : buf && in ? util_fail(err, UTIL_ENOMEM, "profile: out of memory") : UTIL_ENOMEM;
    if (!rc) {
        int h[ATTN_MAX_SEQS + 1];
        for (int i = 0; i <= ns; i++) h[i] = i * r->seq;
        c->be->h2d(cu, h, (size_t)(ns + 1) * sizeof *h);
        c->be->d2d(buf, in, filled * sizeof *buf);
        rc = c->be->sync(err);
    }
    if (!(rc = prof_agree(c, rc, err))) {
        attn_arg a = {c->be, r->seq, r->heads, r->kv_heads, r->head_dim, buf, buf + nq, buf + nq + nkv,
                      buf + nq + 2 * nkv, buf + 2 * nq + 2 * nkv, buf + 4 * nq + 4 * nkv, buf + 3 * nq + 2 * nkv,
                      buf + 4 * nq + 2 * nkv, buf + 4 * nq + 3 * nkv, cu, ns, r->causal};
        rc = prof_alone_time(c, attn_forward, &a, target, 1, 2, &r->fwd_s, err);
        if (!rc) rc = prof_alone_time(c, attn_backward, &a, target * COST_ATTN_BWD_FLOPS, 1, 2, &r->bwd_s, err);
        r->fwd_s /= ns;
        r->bwd_s /= ns;
        r->fwd_flops = cost_prof_attn_fwd_flops(r);
    }
    prof_release(c, buf);
    prof_release(c, in);
    prof_release(c, cu);
    return rc;
}

int prof_measure_attention(const prof_ctx *c, cost_profile *p, const prof_attn_shape *shapes, int n, int passes,
                           double target, int (*seqs_per_call)(int seq), char *err)
{
    p->n_attn = n < COST_PROFILE_MAX_ATTN ? n : COST_PROFILE_MAX_ATTN;
    /* Passes over all shapes, best per shape (as for the GEMM grid). */
    for (int pass = 0; pass < passes; pass++)
        for (int i = 0; i < p->n_attn; i++) {
            const prof_attn_shape *s = &shapes[i];
            int seqs = seqs_per_call(s->seq);
            cost_profile_attn r = {.seq = s->seq, .heads = s->heads, .kv_heads = s->kv_heads, .head_dim = s->head_dim,
                                   .causal = s->causal, .seqs = seqs < 1 ? 1 : seqs > ATTN_MAX_SEQS ? ATTN_MAX_SEQS : seqs};
            int rc = measure_one(c, &r, target, err);
            if (rc) return rc;
            if (pass == 0) p->attn[i] = r;
            p->attn[i].fwd_s = fmin(p->attn[i].fwd_s, r.fwd_s);
            p->attn[i].bwd_s = fmin(p->attn[i].bwd_s, r.bwd_s);
        }
    return UTIL_OK;
}
