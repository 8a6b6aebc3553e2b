/* Ring attention with load-balanced causal chunks: the LLM's context
 * parallelism where tp * sp does not divide its heads (plan_cp_of). Each of
 * the sp ranks holds chunks j and 2 sp - 1 - j of every sample's sequence
 * cut in 2 sp (plan_cp_span_of), L = 2 C local rows per sample; the K/V
 * blocks travel the ring, rank j computing at step i against the block of
 * rank r = j - i (mod sp), as Megatron-Core's context parallelism does
 * (TransformerEngine's AttnFuncWithCPAndKVP2P; Liu et al., "Ring Attention
 * with Blockwise Transformers", arXiv 2310.01889):
 *  - i = 0: its own block, causal over its local rows (its two chunks in
 *    order are causal to each other);
 *  - r < j: every local query row sees chunk r (the block's first C rows) and
 *    not chunk 2 sp - 1 - r;
 *  - r > j: only the later chunk (query rows C .. L) sees the block, all of it.
 * Forward merges each block's partial result into the output by its
 * log-sum-exp; the next block is received while this one computes. Backward
 * passes the blocks again and, behind each, the gradient of its K/V that the
 * ranks before have summed; after the last step each rank receives its own. */
#include "executor/model_int.h"

/* Tags of the two kinds of messages (ex_p2p.tag + buffer index), and their
 * slots on the bf16 wire (executor/tp_wire.c). */
enum { TAG_KV = 0, TAG_DKV = 4 };

/* Posts m's messages into *req (md->comm_rc keeps the first failure; then
 * nothing more is posted); on the bf16 wire, packed (tp_wire.c). */
static void post(ex_module *md, const ex_p2p *m, ex_wire_recv *u, void **req)
{
    ex_wire_p2p(md, m, m->tag == TAG_KV ? 0 : 1, u, req);
}

/* Completes *req and widens what the wire brought into the receive buffers. */
static void wait(ex_module *md, void **req, ex_wire_recv *kv, ex_wire_recv *dkv)
{
    if (*req) {
        int rc = md->par.p2p_wait(md->par.ctx, *req);
        if (!md->comm_rc) md->comm_rc = rc;
    }
    *req = NULL;
    ex_wire_p2p_unpack(md, kv);
    if (dkv) ex_wire_p2p_unpack(md, dkv);
}

/* The K/V block (k, v) on to the next rank, the previous rank's into (nk, nv). */
static ex_p2p pass_pair(const ex_module *md, const float *k, const float *v, float *nk, float *nv, size_t n, int tag)
{
    int j = md->sp_rank, sp = md->sp;
    return (ex_p2p){ .send = { k, v }, .recv = { nk, nv }, .send_n = { n, n }, .recv_n = { n, n }, .n_send = 2,
                     .n_recv = 2, .to = (j + 1) % sp, .from = (j - 1 + sp) % sp, .tag = tag };
}

/* Owner of the block step i sees. */
static int owner(const ex_module *md, int i) { return (md->sp_rank - i + md->sp) % md->sp; }

void ex_ring_forward(const ex_backend *be, ex_module *md, ex_block_acts *a, const int *cu, int nseq)
{
    int sp = md->sp, j = md->sp_rank, L = md->n_rows / nseq, C = L / 2, H = md->H, Hkv = md->Hkv, hd = md->hd;
    size_t kn = (size_t)md->n_rows * Hkv * hd;
    float *buf = md->a.ring_kv;
    const float *ck = a->k, *cv = a->v;
    for (int i = 0; i < sp; i++) {
        void *req = NULL;
        ex_wire_recv ukv = { 0 };
        float *nk = buf + (size_t)(i % 2) * 2 * kn, *nv = nk + kn;
        if (i + 1 < sp) {
            ex_p2p m = pass_pair(md, ck, cv, nk, nv, kn, TAG_KV);
            post(md, &m, &ukv, &req);
        }
        if (i == 0) {
            be->attention_forward(a->att, a->lse, a->q, a->k, a->v, cu, nseq, H, Hkv, hd, true);
        } else {
            bool earlier = owner(md, i) < j;
            int q0 = earlier ? 0 : C, nq = earlier ? L : C, nk_rows = earlier ? C : L;
            be->attention_part_forward(md->a.ring_out, md->a.ring_lse, a->q, ck, cv, nseq, L, q0, nq, 0, nk_rows, H,
                                       Hkv, hd);
            be->attention_merge(a->att, a->lse, md->a.ring_out, md->a.ring_lse, nseq, L, q0, nq, H, hd);
        }
        wait(md, &req, &ukv, NULL);
        ck = nk;
        cv = nv;
    }
}

void ex_ring_backward(const ex_backend *be, ex_module *md, const ex_block_acts *a, const float *datt, const int *cu,
                      int nseq)
{
    ex_acts *s = &md->a;
    int sp = md->sp, j = md->sp_rank, N = md->n_rows, L = N / nseq, C = L / 2, H = md->H, Hkv = md->Hkv, hd = md->hd;
    size_t kn = (size_t)N * Hkv * hd;
    float *kv = s->ring_kv, *dkv = s->ring_dkv;
    be->zero(s->dq, (size_t)N * H * hd);
    be->zero(dkv, kn);
    be->zero(dkv + kn, kn);
    const float *ck = a->k, *cv = a->v;
    for (int i = 0; i < sp; i++) {
        void *req = NULL;
        ex_wire_recv ukv = { 0 }, udkv = { 0 };
        float *nk = kv + (size_t)(i % 2) * 2 * kn, *nv = nk + kn;
        float *dk = dkv + (size_t)(i % 2) * 2 * kn, *dv = dk + kn;
        if (i + 1 < sp) {
            ex_p2p m = pass_pair(md, ck, cv, nk, nv, kn, TAG_KV);
            post(md, &m, &ukv, &req);
        }
        if (i == 0) {
            be->attention_backward(s->dq, dk, dv, datt, a->q, a->k, a->v, a->att, a->lse, cu, nseq, H, Hkv, hd, true);
        } else {
            bool earlier = owner(md, i) < j;
            be->attention_part_backward(s->dq, dk, dv, datt, a->q, ck, cv, a->att, a->lse, nseq, L, earlier ? 0 : C,
                                        earlier ? L : C, 0, earlier ? C : L, H, Hkv, hd);
        }
        /* this block's gradient on to the next rank (after the last step: to
         * its owner); the next block's, summed so far, in (or this rank's own) */
        float *ndk = i + 1 < sp ? dkv + (size_t)((i + 1) % 2) * 2 * kn : s->dk, *ndv = i + 1 < sp ? ndk + kn : s->dv;
        ex_p2p m = pass_pair(md, dk, dv, ndk, ndv, kn, TAG_DKV);
        post(md, &m, &udkv, &req);
        wait(md, &req, &ukv, &udkv);
        ck = nk;
        cv = nv;
    }
}
