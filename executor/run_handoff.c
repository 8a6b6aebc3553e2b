/* The encoder -> LLM hand-off of `dhp run`: each chunk's merged rows (and
 * their gradients back) as the planner's segments say (plan_handoff), one
 * message per pair of ranks, sends left in flight until the step ends. */
#include "executor/run_internal.h"

#include <string.h>

int run_handoff_init(run_ctx *r, run_handoff *h, char *err)
{
    const plan_t *p = &r->plan;
    memset(h, 0, sizeof *h);
    if (r->enc < 0) return UTIL_OK;
    h->chunks = plan_chunks(p);
    h->rows = plan_rows_per_sample(p, r->enc);
    h->llm_rows = plan_cp_encoder_rows(p, r->enc, r->rank);
    h->d = p->model.mod[p->model.llm].hidden;
    h->seg = util_calloc((size_t)h->chunks, sizeof *h->seg);
    h->nseg = util_calloc((size_t)h->chunks, sizeof *h->nseg);
    if (!h->seg || !h->nseg) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
    for (int c = 0; c < h->chunks; c++) {
        int rc = plan_handoff(p, r->enc, c, &h->seg[c], &h->nseg[c], err);
        if (rc) return rc;
    }
    if (r->mod[r->enc].on) {
        size_t n = (size_t)plan_max_share(p, r->enc) * h->rows / p->mod[r->enc].sp * h->d;
        h->act_pack = util_malloc_cat(UTIL_MEM_COMM, (n ? n : 1) * sizeof(float));
        h->grad_pack = util_malloc_cat(UTIL_MEM_COMM, (n ? n : 1) * sizeof(float));
        if (!h->act_pack || !h->grad_pack) return util_fail(err, UTIL_ENOMEM, "run: out of memory for hand-off buffers");
    }
    if (r->mod[p->model.llm].on) {
        size_t n = (size_t)plan_max_share(p, p->model.llm) * h->llm_rows * h->d;
        h->act_in = util_malloc_cat(UTIL_MEM_COMM, (n ? n : 1) * sizeof(float));
        h->grad_out = util_malloc_cat(UTIL_MEM_COMM, (n ? n : 1) * sizeof(float));
        if (!h->act_in || !h->grad_out) return util_fail(err, UTIL_ENOMEM, "run: out of memory for hand-off buffers");
    }
    return UTIL_OK;
}

int run_handoff_wait_all(run_ctx *r, run_handoff *h, char *err)
{
    int rc = UTIL_OK;
    for (int i = 0; i < h->n_pend; i++) {
        if (ex_comm_wait(r->world, h->pend[i].req) && !rc)
            rc = util_fail(err, UTIL_ERUNTIME, "run: hand-off send failed: %s", ex_comm_error(r->world));
        util_free(h->pend[i].buf);
    }
    h->n_pend = 0;
    return rc;
}

void run_handoff_free(run_ctx *r, run_handoff *h)
{
    char err[UTIL_ERR_LEN];
    run_handoff_wait_all(r, h, err);
    for (int c = 0; c < h->chunks; c++) util_free(h->seg[c]);
    util_free(h->seg); util_free(h->nseg); util_free(h->pend);
    util_free(h->act_pack); util_free(h->grad_pack); util_free(h->act_in); util_free(h->grad_out);
}

/* Sends this rank's rows of chunk c: one message per peer, the
 * concatenation of its segments in plan order, packed from src (rows of
 * width d at the segment's own-side offset). Messages complete by step end. */
int run_handoff_send(run_ctx *r, run_handoff *h, int c, bool grad, const float *src, char *err)
{
    const plan_segment *sg = h->seg[c];
    int n = h->nseg[c], tag = plan_handoff_tag(r->enc, c, grad);
    size_t d = (size_t)h->d;
    int i, j, peer, nrows;
    for (int from = 0; plan_handoff_message(sg, n, from, r->rank, grad, true, &i, &j, &peer, &nrows); from = j) {
        size_t rows = (size_t)nrows;
        float *msg = util_malloc_cat(UTIL_MEM_COMM, (rows ? rows : 1) * d * sizeof(float));
        if (!msg) return util_fail(err, UTIL_ENOMEM, "run: out of memory for a hand-off message");
        size_t at = 0;
        for (int q = i; q < j; q++) {
            int off = grad ? sg[q].llm_off : sg[q].enc_off;
            memcpy(msg + at * d, src + (size_t)off * d, (size_t)sg[q].rows * d * sizeof(float));
            at += sg[q].rows;
        }
        if (h->n_pend == h->cap_pend) {
            int cap = h->cap_pend ? 2 * h->cap_pend : 16;
            run_pending *pn = util_realloc(h->pend, (size_t)cap * sizeof *pn);
            if (!pn) { util_free(msg); return util_fail(err, UTIL_ENOMEM, "run: out of memory"); }
            h->pend = pn;
            h->cap_pend = cap;
        }
        ex_request *req;
        if (ex_comm_isend(r->world, msg, rows * d, peer, tag, &req)) {
            util_free(msg);
            return util_fail(err, UTIL_ERUNTIME, "run: hand-off send to rank %d failed: %s", peer, ex_comm_error(r->world));
        }
        h->pend[h->n_pend++] = (run_pending){ req, msg };
    }
    return UTIL_OK;
}

/* Receives chunk c's rows from every peer and scatters them into dst. */
int run_handoff_recv(run_ctx *r, run_handoff *h, int c, bool grad, float *dst, char *err)
{
    const plan_segment *sg = h->seg[c];
    int n = h->nseg[c], tag = plan_handoff_tag(r->enc, c, grad);
    size_t d = (size_t)h->d;
    int i, j, peer, nrows;
    for (int from = 0; plan_handoff_message(sg, n, from, r->rank, grad, false, &i, &j, &peer, &nrows); from = j) {
        size_t rows = (size_t)nrows;
        float *msg = util_malloc_cat(UTIL_MEM_COMM, (rows ? rows : 1) * d * sizeof(float));
        if (!msg) return util_fail(err, UTIL_ENOMEM, "run: out of memory for a hand-off message");
        if (ex_comm_recv(r->world, msg, rows * d, peer, tag)) {
            util_free(msg);
            return util_fail(err, UTIL_ERUNTIME, "run: hand-off receive from rank %d failed: %s", peer, ex_comm_error(r->world));
        }
        size_t at = 0;
        for (int q = i; q < j; q++) {
            int off = grad ? sg[q].enc_off : sg[q].llm_off;
            memcpy(dst + (size_t)off * d, msg + at * d, (size_t)sg[q].rows * d * sizeof(float));
            at += sg[q].rows;
        }
        util_free(msg);
    }
    return UTIL_OK;
}

