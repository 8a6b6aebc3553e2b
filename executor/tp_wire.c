/* The collectives of a module's tensor-parallel group (block.c's regions,
 * llm.c's ends) and of its Ulysses sp group, and the bf16 wire they move
 * activations on under bf16-mixed and -autocast (planner/precision.c
 * plan_act_wire_bf16, the one owner of which collectives move bf16; the dhp
 * target prices them at plan_act_wire_bytes).
 *
 * Megatron-LM under --bf16 runs its model in bf16, so the all-reduces,
 * all-gathers and reduce-scatters of megatron/core/tensor_parallel/
 * mappings.py move bf16 tensors, and NCCL sums bf16 by adding in fp32 and
 * rounding each partial sum back to bf16. Here the activations stay fp32
 * between kernels: a collective rounds its payload to bf16 (executor/bf16.h,
 * round to nearest even) into the module's linear staging (md->stage16,
 * executor/precision.c: operand | gradient, stage_cap elements each, sized
 * to the module's largest activation by plan_gemm_staging_elems and free
 * between two linears, so the wire costs no memory of its own), moves 2-byte
 * elements, and widens the result back into the fp32 buffer. The sums go
 * through the bf16 hooks (ex_comm_allreduce_sum_bf16 / _reduce_scatter_bf16:
 * NCCL's ncclBfloat16, MPI's user op of ex_bf16_sum_into, the same op the
 * emulated NCCL uses, so CPU and emulated-GPU runs agree bit for bit); the
 * all-gathers and all-to-alls carry two bf16 elements per float word through
 * the fp32 hooks (a rank's chunk padded to whole words), and so do ring
 * attention's K/V blocks and their gradients (executor/ring.c: the partial
 * gradient sums rounded to bf16 at every hop, as a bf16 sum). */
#include "executor/model_int.h"

/* ---------------------------------------------------------------- fp32 */

void ex_tp_allreduce_f32(ex_module *md, float *x, size_t n)
{
    if (md->tp > 1 && !md->comm_rc) md->comm_rc = md->par.allreduce_sum(md->par.ctx, x, n);
}

void ex_tp_allreduce_max(ex_module *md, float *x, size_t n)
{
    if (md->tp > 1 && !md->comm_rc) md->comm_rc = md->par.allreduce_max(md->par.ctx, x, n);
}

/* ----------------------------------------------------------- bf16 wire */

static bool wire16(const ex_module *md) { return md->par.wire_bf16; }

/* The staging the payload is packed into, `need` bf16 elements of it; NULL
 * (and md->comm_rc set) if it is smaller, which the layout rules out. */
static uint16_t *wire_room(ex_module *md, size_t need)
{
    if (need <= 2 * md->stage_cap) return md->stage16;
    md->comm_rc = UTIL_ENOMEM;
    return NULL;
}

/* Float words holding n bf16 elements: a rank's chunk of a gather or all-to-all. */
static size_t words_of(size_t n) { return (n + 1) / 2; }

/* k chunks of n elements between fp32 (n apart) and bf16 (2 * words_of(n) apart). */
static void pack(const ex_module *md, uint16_t *dst, const float *src, size_t n, int k)
{
    size_t w = 2 * words_of(n);
    if (w == n) md->be->to_bf16(dst, src, n * (size_t)k);
    else
        for (int r = 0; r < k; r++) md->be->to_bf16(dst + (size_t)r * w, src + (size_t)r * n, n);
}

static void unpack(const ex_module *md, float *dst, const uint16_t *src, size_t n, int k)
{
    size_t w = 2 * words_of(n);
    if (w == n) md->be->from_bf16(dst, src, n * (size_t)k);
    else
        for (int r = 0; r < k; r++) md->be->from_bf16(dst + (size_t)r * n, src + (size_t)r * w, n);
}

/* ------------------------------------------------- activation collectives */

void ex_tp_allreduce(ex_module *md, float *x, size_t n)
{
    if (md->tp <= 1 || md->comm_rc) return;
    if (!wire16(md)) {
        md->comm_rc = md->par.allreduce_sum(md->par.ctx, x, n);
        return;
    }
    uint16_t *w = wire_room(md, n);
    if (!w) return;
    md->be->to_bf16(w, x, n);
    md->comm_rc = md->par.allreduce_sum_bf16(md->par.ctx, w, n);
    if (!md->comm_rc) md->be->from_bf16(x, w, n);
}

void ex_tp_allgather(ex_module *md, const float *x, float *all, size_t n)
{
    if (md->comm_rc) return;
    if (!wire16(md)) {
        md->comm_rc = md->par.allgather(md->par.ctx, x, all, n);
        return;
    }
    size_t w = words_of(n), gathered = 2 * w * (size_t)md->tp;
    uint16_t *recv = wire_room(md, gathered + 2 * w), *send = recv ? recv + gathered : NULL;
    if (!recv) return;
    pack(md, send, x, n, 1);
    md->comm_rc = md->par.allgather(md->par.ctx, (const float *)send, (float *)recv, w);
    if (!md->comm_rc) unpack(md, all, recv, n, md->tp);
}

void ex_tp_reduce_scatter(ex_module *md, const float *x, float *mine, size_t n)
{
    if (md->comm_rc) return;
    if (!wire16(md)) {
        md->comm_rc = md->par.reduce_scatter(md->par.ctx, x, mine, n);
        return;
    }
    size_t all = n * (size_t)md->tp;
    uint16_t *send = wire_room(md, all + n), *recv = send ? send + all : NULL;
    if (!send) return;
    md->be->to_bf16(send, x, all);
    md->comm_rc = md->par.reduce_scatter_bf16(md->par.ctx, send, recv, n);
    if (!md->comm_rc) md->be->from_bf16(mine, recv, n);
}

void ex_sp_alltoall(ex_module *md, const float *send, float *recv, size_t chunk)
{
    if (md->comm_rc) return;
    if (!wire16(md)) {
        md->comm_rc = md->par.alltoall(md->par.ctx, send, recv, chunk);
        return;
    }
    size_t w = words_of(chunk), all = 2 * w * (size_t)md->sp;
    uint16_t *s16 = wire_room(md, 2 * all), *r16 = s16 ? s16 + all : NULL;
    if (!s16) return;
    pack(md, s16, send, chunk, md->sp);
    md->comm_rc = md->par.alltoall(md->par.ctx, (const float *)s16, (float *)r16, w);
    if (!md->comm_rc) unpack(md, recv, r16, chunk, md->sp);
}

void ex_wire_p2p(ex_module *md, const ex_p2p *m, int slot, ex_wire_recv *u, void **req)
{
    u->n = 0;
    if (md->comm_rc) return;
    if (!wire16(md)) {
        md->comm_rc = md->par.p2p_start(md->par.ctx, m, req);
        return;
    }
    size_t per = 0;   /* a slot: every message of m packed, whole words each */
    for (int i = 0; i < m->n_send; i++) per += 2 * words_of(m->send_n[i]);
    for (int i = 0; i < m->n_recv; i++) per += 2 * words_of(m->recv_n[i]);
    uint16_t *at = wire_room(md, (size_t)(slot + 1) * per);
    if (!at) return;
    at += (size_t)slot * per;
    ex_p2p w = *m;
    for (int i = 0; i < m->n_send; i++) {
        pack(md, at, m->send[i], m->send_n[i], 1);
        w.send[i] = (const float *)at;
        w.send_n[i] = words_of(m->send_n[i]);
        at += 2 * w.send_n[i];
    }
    for (int i = 0; i < m->n_recv; i++) {
        w.recv[i] = (float *)at;
        w.recv_n[i] = words_of(m->recv_n[i]);
        u->dst[u->n] = m->recv[i], u->src[u->n] = at, u->len[u->n++] = m->recv_n[i];
        at += 2 * w.recv_n[i];
    }
    md->comm_rc = md->par.p2p_start(md->par.ctx, &w, req);
}

void ex_wire_p2p_unpack(ex_module *md, ex_wire_recv *u)
{
    for (int i = 0; i < u->n && !md->comm_rc; i++) unpack(md, u->dst[i], u->src[i], u->len[i], 1);
    u->n = 0;
}

int ex_wire_check(const ex_module *md, const ex_parallel *par, char *err)
{
    if (!par || !par->wire_bf16) return UTIL_OK;
    if (md->tp > 1 && !par->allreduce_sum_bf16)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: a bf16 wire at tp_size %d needs allreduce_sum_bf16", md->mm.name, md->tp);
    if (md->seqpar && !par->reduce_scatter_bf16)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: a bf16 wire under sequence parallelism needs reduce_scatter_bf16",
                         md->mm.name);
    return UTIL_OK;
}
