/* The encoders -> LLM hand-off of `dhp run`: each encoder's merged rows of
 * each chunk (and their gradients back) as the planner's segments say
 * (plan_handoff), one message per pair of ranks and encoder, each send left
 * in flight until an op the schedule marks retires it (plan_op.retires) or
 * the step ends.
 *
 * Each direction between two ranks is a communicator of its own
 * (run_handoff_comms), and a send starts at once: over NCCL, messages on the
 * world's one communicator were held until the sender's next wait (so the
 * LLM waited for every encoder forward issued before it), then launched with
 * that wait's receive as one group, whose completion also waited for the
 * sends' receivers. On a channel a send waits only for the compute before it
 * and completes when its receiver takes it; a receive, when its sender sent
 * (messages to one's own rank stay on the world's self path). */
#include "executor/run_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct { int from, to; } rank_pair;

static int pair_order(const void *a, const void *b)
{
    const rank_pair *x = a, *y = b;
    return x->from != y->from ? (x->from > y->from) - (x->from < y->from) : (x->to > y->to) - (x->to < y->to);
}

/* Every directed pair of ranks a hand-off message takes, over all
 * encoders, chunks and both directions (plan_handoff_next), sorted and
 * unique: the same list on every rank. */
static int handoff_pairs(const run_ctx *r, const run_handoff *h, rank_pair **out, int *n_out, char *err)
{
    rank_pair *v = NULL;
    int n = 0, cap = 0;
    for (int k = 0; k < r->plan.n_modules; k++) {
        const run_handoff_enc *e = &h->enc[k];
        for (int c = 0; e->seg && c < h->chunks; c++)
            for (int grad = 0; grad < 2; grad++) {
                plan_handoff_msg m;
                for (int from = 0; plan_handoff_next(e->seg[c], e->nseg[c], from, grad, &m); from = m.end) {
                    if (m.src == m.dst) continue;
                    if (n == cap) {
                        cap = cap ? 2 * cap : 64;
                        rank_pair *w = util_realloc(v, (size_t)cap * sizeof *w);
                        if (!w) { util_free(v); return util_fail(err, UTIL_ENOMEM, "run: out of memory"); }
                        v = w;
                    }
                    v[n++] = (rank_pair){ m.src, m.dst };
                }
            }
    }
    if (n) qsort(v, (size_t)n, sizeof *v, pair_order);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (!u || pair_order(&v[u - 1], &v[i])) v[u++] = v[i];
    *out = v;
    *n_out = u;
    return UTIL_OK;
}

/* This rank's part in the world splits that make every pair's communicator:
 * one split per round, each round a set of pairs no rank is in twice
 * (greedy, in list order), so a few splits make them all. Per round, the
 * pair this rank is in (its color) or -1, and its key (0 sends, 1 receives). */
static int plan_splits(run_ctx *r, run_handoff *h, char *err)
{
    rank_pair *pairs = NULL;
    int n = 0, rc = handoff_pairs(r, h, &pairs, &n, err);
    if (rc) return rc;
    int *round = util_malloc(((size_t)n + 1) * sizeof *round), *seen = util_calloc((size_t)r->size, sizeof *seen);
    h->split = util_malloc(((size_t)n + 1) * sizeof *h->split);
    h->chan = util_calloc((size_t)n + 1, sizeof *h->chan);
    if (!round || !seen || !h->split || !h->chan) rc = util_fail(err, UTIL_ENOMEM, "run: out of memory");
    int left = rc ? 0 : n;
    for (int i = 0; i < n && !rc; i++) round[i] = -1;
    for (int t = 0; left; t++) {
        run_handoff_split *sp = &h->split[h->n_split++];
        *sp = (run_handoff_split){ -1, -1, -1 };
        for (int i = 0; i < n; i++) {
            rank_pair *q = &pairs[i];
            if (round[i] >= 0 || seen[q->from] == t + 1 || seen[q->to] == t + 1) continue;
            round[i] = t;
            seen[q->from] = seen[q->to] = t + 1;
            left--;
            if (q->from == r->rank || q->to == r->rank) *sp = (run_handoff_split){ i, q->from, q->to };
        }
    }
    util_free(pairs);
    util_free(round);
    util_free(seen);
    return rc;
}

int run_handoff_comms(run_ctx *r, run_handoff *h, char *err)
{
    int rc = UTIL_OK;
    for (int t = 0; !rc && t < h->n_split; t++) {
        const run_handoff_split *sp = &h->split[t];
        ex_comm *c = NULL;
        rc = ex_comm_split(r->world, sp->color, sp->to == r->rank, &c, err);
        if (!rc && c) h->chan[h->n_chan++] = (run_handoff_channel){ sp->from, sp->to, c };
    }
    return rc;
}

/* The communicator and peer for a message between this rank and `peer`:
 * their channel in that direction, or the world's self path. */
static ex_comm *channel(run_ctx *r, const run_handoff *h, int peer, bool sending, int *chan_peer)
{
    *chan_peer = peer;
    if (peer == r->rank) return r->world;
    int from = sending ? r->rank : peer, to = sending ? peer : r->rank;
    for (int i = 0; i < h->n_chan; i++)
        if (h->chan[i].from == from && h->chan[i].to == to) {
            *chan_peer = sending ? 1 : 0;
            return h->chan[i].c;
        }
    return NULL;
}

bool run_feeds(const run_ctx *r, int k) { return plan_feeds_llm(&r->plan.model, &r->plan.work, k); }

bool run_encoder_trains(const run_ctx *r)
{
    for (int k = 0; k < r->plan.n_modules; k++)
        if (run_feeds(r, k) && r->mod[k].rules.trains) return true;
    return false;
}

static float *comm_floats(const run_ctx *r, size_t n) { return r->be->alloc((n ? n : 1) * sizeof(float), UTIL_MEM_COMM); }

static int encoder_init(run_ctx *r, run_handoff *h, int k, char *err)
{
    const plan_t *p = &r->plan;
    run_handoff_enc *e = &h->enc[k];
    e->rows = plan_rows_per_sample(p, k);
    e->seg = util_calloc((size_t)h->chunks, sizeof *e->seg);
    e->nseg = util_calloc((size_t)h->chunks, sizeof *e->nseg);
    if (!e->seg || !e->nseg) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
    for (int c = 0; c < h->chunks; c++) {
        int rc = plan_handoff(p, k, c, &e->seg[c], &e->nseg[c], err);
        if (rc) return rc;
    }
    if (r->mod[k].on) {   /* a frozen encoder gets no gradient back: no buffer for one */
        size_t n = (size_t)plan_max_share(p, k) * e->rows / p->mod[k].sp * h->d;
        e->act_pack = comm_floats(r, n);
        e->grad_pack = r->mod[k].rules.trains ? comm_floats(r, n) : NULL;
        if (!e->act_pack || (r->mod[k].rules.trains && !e->grad_pack))
            return util_fail(err, UTIL_ENOMEM, "run: out of memory for hand-off buffers");
    }
    return UTIL_OK;
}

int run_handoff_init(run_ctx *r, run_handoff *h, char *err)
{
    const plan_t *p = &r->plan;
    memset(h, 0, sizeof *h);
    h->chunks = plan_chunks(p);
    h->d = p->model.mod[p->model.llm].hidden;
    bool any = false;
    for (int k = 0; k < p->n_modules; k++) {
        if (!run_feeds(r, k)) continue;
        any = true;
        int rc = encoder_init(r, h, k, err);
        if (rc) return rc;
    }
    int rc = plan_splits(r, h, err);
    if (rc) return rc;
    if (any && r->mod[p->model.llm].on) {
        h->llm_rows = plan_cp_encoder_rows(p, -1, r->rank);
        size_t n = (size_t)plan_max_share(p, p->model.llm) * h->llm_rows * h->d;
        bool grads = run_encoder_trains(r);   /* the encoders' rows' gradient goes back to one that trains */
        h->act_in = comm_floats(r, n);
        h->grad_out = grads ? comm_floats(r, n) : NULL;
        if (!h->act_in || (grads && !h->grad_out)) return util_fail(err, UTIL_ENOMEM, "run: out of memory for hand-off buffers");
    }
    return UTIL_OK;
}

/* Completes and frees the pending sends `which` selects (all: NULL), keeping the rest in order. */
static int complete_sends(run_ctx *r, run_handoff *h, const run_pending *which, char *err)
{
    int rc = UTIL_OK, kept = 0;
    for (int i = 0; i < h->n_pend; i++) {
        run_pending *q = &h->pend[i];
        if (which && (q->k != which->k || q->c_chunk != which->c_chunk || q->grad != which->grad)) {
            h->pend[kept++] = *q;
            continue;
        }
        if (ex_comm_wait(q->c, q->req) && !rc) rc = util_fail(err, UTIL_ERUNTIME, "run: hand-off send failed: %s", ex_comm_error(q->c));
        r->be->release(q->buf);
    }
    h->n_pend = kept;
    return rc;
}

int run_handoff_wait_all(run_ctx *r, run_handoff *h, char *err) { return complete_sends(r, h, NULL, err); }

int run_handoff_retire(run_ctx *r, run_handoff *h, int k, int c, bool grad, char *err)
{
    run_pending which = { .k = k, .c_chunk = c, .grad = grad };
    return complete_sends(r, h, &which, err);
}

void run_handoff_free(run_ctx *r, run_handoff *h)
{
    char err[UTIL_ERR_LEN];
    run_handoff_wait_all(r, h, err);
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        run_handoff_enc *e = &h->enc[k];
        for (int c = 0; e->seg && c < h->chunks; c++) util_free(e->seg[c]);
        util_free(e->seg); util_free(e->nseg); util_free(e->order);
        if (r->be) { r->be->release(e->act_pack); r->be->release(e->grad_pack); }
    }
    util_free(h->pend);
    for (int i = 0; i < h->n_chan; i++) ex_comm_free(h->chan[i].c);
    util_free(h->chan);
    util_free(h->split);
    if (r->be) { r->be->release(h->act_in); r->be->release(h->grad_out); }
}

/* Moves segment sg's rows between a message (msg, the encoder's stored
 * order) and an own buffer (own, at offset off): in order, or on the LLM's
 * side (llm_side) block by block through the block's raster order. */
static int move_segment(run_ctx *r, run_handoff_enc *e, int k, const plan_segment *sg, float *msg, float *own, int off,
                        bool llm_side, bool to_msg, size_t d, char *err)
{
    size_t n = (size_t)sg->rows;
    if (!sg->block || !llm_side) {
        if (to_msg) r->be->d2d(msg, own + (size_t)off * d, n * d * sizeof(float));
        else r->be->d2d(own + (size_t)off * d, msg, n * d * sizeof(float));
        return UTIL_OK;
    }
    if (e->order_block != sg->block) {
        util_free(e->order);
        e->order_block = 0;
        if (!(e->order = util_malloc((size_t)sg->block * sizeof *e->order))) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
        int rc = plan_handoff_block_order(&r->plan, k, sg->block, e->order, err);
        if (rc) return rc;
        e->order_block = sg->block;
    }
    ex_move_permuted_rows(r->be, msg, own + (size_t)off * d, n, d, e->order, (size_t)sg->block, !to_msg);
    return UTIL_OK;
}

/* Chunk c of encoder k's segments: *sg, n of them (an error where k feeds the LLM none). */
static int chunk_segments(run_ctx *r, const run_handoff *h, int k, int c, const plan_segment **sg, int *n, char *err)
{
    if (!h->enc[k].seg) return util_fail(err, UTIL_EINVAL, "run: module %s feeds the LLM no rows", r->plan.mod[k].module);
    *sg = h->enc[k].seg[c];
    *n = h->enc[k].nseg[c];
    return UTIL_OK;
}

/* A message of rows x d floats (one float at least). */
static float *message_alloc(run_ctx *r, size_t rows, size_t d, char *err)
{
    float *msg = r->be->alloc((rows ? rows : 1) * d * sizeof(float), UTIL_MEM_COMM);
    if (!msg) util_fail(err, UTIL_ENOMEM, "run: out of memory for a hand-off message");
    return msg;
}

/* Moves segments sg[i .. j) between a message, their concatenation in plan
 * order, and this rank's own buffer: on the LLM's side (llm_side) at their
 * llm_off, else at their enc_off. */
static int move_message(run_ctx *r, run_handoff *h, int k, const plan_segment *sg, int i, int j, float *msg, float *own,
                        bool llm_side, bool to_msg, size_t d, char *err)
{
    size_t at = 0;
    for (int q = i; q < j; q++) {
        int rc = move_segment(r, &h->enc[k], k, &sg[q], msg + at * d, own, llm_side ? sg[q].llm_off : sg[q].enc_off,
                              llm_side, to_msg, d, err);
        if (rc) return rc;
        at += sg[q].rows;
    }
    return UTIL_OK;
}

/* Sends this rank's rows of chunk c of encoder k: one message per peer, the
 * concatenation of its segments in plan order, packed from src (rows of
 * width d at the segment's own-side offset). Messages complete by step end.
 * The gradient goes from the LLM's side back to the encoder's. */
int run_handoff_send(run_ctx *r, run_handoff *h, int k, int c, bool grad, const float *src, char *err)
{
    const plan_segment *sg = NULL;
    int n = 0, tag = plan_handoff_tag(k, c, grad);
    if (chunk_segments(r, h, k, c, &sg, &n, err)) return UTIL_EINVAL;
    size_t d = (size_t)h->d;
    int i, j, peer, nrows;
    for (int from = 0; plan_handoff_message(sg, n, from, r->rank, grad, true, &i, &j, &peer, &nrows); from = j) {
        size_t rows = (size_t)nrows;
        float *msg = message_alloc(r, rows, d, err);
        if (!msg) return UTIL_ENOMEM;
        int rc = move_message(r, h, k, sg, i, j, msg, (float *)src, grad, true, d, err);
        if (rc) { r->be->release(msg); return rc; }
        if (h->n_pend == h->cap_pend) {
            int cap = h->cap_pend ? 2 * h->cap_pend : 16;
            run_pending *pn = util_realloc(h->pend, (size_t)cap * sizeof *pn);
            if (!pn) { r->be->release(msg); return util_fail(err, UTIL_ENOMEM, "run: out of memory"); }
            h->pend = pn;
            h->cap_pend = cap;
        }
        ex_request *req;
        int to;
        ex_comm *ch = channel(r, h, peer, true, &to);
        if (!ch) { r->be->release(msg); return util_fail(err, UTIL_EINVAL, "run: no hand-off channel to rank %d", peer); }
        if (ex_comm_isend(ch, msg, rows * d, to, tag, &req)) {
            r->be->release(msg);
            return util_fail(err, UTIL_ERUNTIME, "run: hand-off send to rank %d failed: %s", peer, ex_comm_error(ch));
        }
        h->pend[h->n_pend++] = (run_pending){ req, msg, ch, k, c, grad };
        if (ex_comm_start(ch)) return util_fail(err, UTIL_ERUNTIME, "run: hand-off send to rank %d failed: %s", peer, ex_comm_error(ch));
    }
    return UTIL_OK;
}

/* Receives chunk c's rows of encoder k from every peer and scatters them into dst. */
int run_handoff_recv(run_ctx *r, run_handoff *h, int k, int c, bool grad, float *dst, char *err)
{
    const plan_segment *sg = NULL;
    int n = 0, tag = plan_handoff_tag(k, c, grad);
    if (chunk_segments(r, h, k, c, &sg, &n, err)) return UTIL_EINVAL;
    size_t d = (size_t)h->d;
    int i, j, peer, nrows;
    for (int from = 0; plan_handoff_message(sg, n, from, r->rank, grad, false, &i, &j, &peer, &nrows); from = j) {
        size_t rows = (size_t)nrows;
        float *msg = message_alloc(r, rows, d, err);
        if (!msg) return UTIL_ENOMEM;
        int src;
        ex_comm *ch = channel(r, h, peer, false, &src);
        if (!ch || ex_comm_recv(ch, msg, rows * d, src, tag)) {
            r->be->release(msg);
            return util_fail(err, UTIL_ERUNTIME, "run: hand-off receive from rank %d failed: %s", peer,
                             ch ? ex_comm_error(ch) : "no channel from it");
        }
        int rc = move_message(r, h, k, sg, i, j, msg, dst, !grad, false, d, err);
        r->be->release(msg);
        if (rc) return rc;
    }
    return UTIL_OK;
}

