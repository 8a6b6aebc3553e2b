/* A pipeline stage's hand-off to the next (or its gradient back): its bytes
 * (the rows a rank holds at the boundary), how they cross (the Megatron
 * target's scatter over tp, DeepSpeed's pipeline engine: plan_pipe_engine)
 * and the seconds at each end; plan_micro_time paces a pipeline with them,
 * the simulator's stage messages carry the same (sim_stage_hop). */
#include "planner/planner_int.h"

/* One stage's activation to the next (or its gradient back): the rank's
 * block rows (its sequence-parallel share of them) between two ranks of the
 * module, in a node when the module's group fits one. */
double plan_stage_hop_bytes(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                            const plan_options *o, double samples)
{
    plan_seq q;
    plan_module_seq(m, mi, w, &q);
    double rows = samples * q.tokens_per_sample / s->sp / plan_seqpar_split(&m->mod[mi], s);
    return plan_module_state_bytes(&m->mod[mi], o).act * rows * m->mod[mi].hidden;
}

/* The engine's properties (plan_pipe_engine_props). DeepSpeed's
 * PipelineEngine partitions (engine.py, PartitionedTensor over the
 * slice-parallel group) the activation it sends, and the receiver's forward
 * rebuilds it (part_input.full()); before a backward, the engine rebuilds
 * the stage's own output it partitioned after the forward
 * (part_output.full(): in _exec_recv_grads up to v0.5.3, in
 * _exec_backward_pass after), and from v0.5.4 the partitioned gradient
 * (part_grad.full()) too: one all-gather on an activation's arrival, one
 * (deepspeed-2021, the gradient whole on the wire) or two (deepspeed) on a
 * gradient's; Megatron-LM's one each way. */
plan_hop_wire plan_stage_hop_wire(const model_module *mm, const plan_module *s, const cost_pool *pool,
                                  const plan_options *o, double bytes, bool grad)
{
    bool megatron = o->target == PLAN_TARGET_MEGATRON;
    const plan_pipe_props *e = plan_pipe_engine_props(o->pipe_engine);
    plan_hop_wire h = { bytes, 0, megatron && e->blocking, megatron };
    if (!megatron || s->tp <= 1 || plan_seqpar_split(mm, s) > 1 || !(bytes > 0)) return h;
    int G, per_node;
    plan_group_shape(s, PLAN_AX_TP, pool->gpus_per_node, &G, &per_node);
    double gather = cost_collective_time(pool, COST_ALLGATHER, bytes, G, per_node);
    h.wire_bytes = grad && e->grad_whole ? bytes : bytes / s->tp;
    h.gather_s = (grad ? e->grad_gathers : 1) * gather;
    return h;
}

plan_hop_time plan_stage_hop_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                                  const cost_cluster *c, const plan_options *o, double samples, bool grad, bool same_node)
{
    plan_hop_wire h = plan_stage_hop_wire(&m->mod[mi], s, &c->pool[s->pool], o, plan_stage_hop_bytes(m, mi, s, w, o, samples),
                                          grad);
    double wire = cost_p2p_time(c, s->pool, s->pool, same_node, h.wire_bytes);
    return (plan_hop_time){ wire + h.gather_s, h.held ? wire : 0 };
}

/* A pipeline's hops at one stage boundary: the activation's and the
 * gradient's, over the node's link where the two stages share nodes
 * (plan_stage_boundary_in_node), else the network's. */
typedef struct { plan_hop_time fwd, bwd; } boundary_hops;

/* The hops at stage i in one micro-batch: each of its chunks receives the
 * activation from the previous virtual stage and sends its gradient back,
 * sends its activation to the next and receives the gradient, except at
 * the pipeline's two ends (the first stage's first chunk, the last stage's
 * last chunk). Stage i's boundary with the next stage is b[i]; the last
 * stage's with the first (the chunks' wrap under interleaving) b[pp - 1]. */
static double stage_hops_s(const plan_module *s, const boundary_hops *b, int i)
{
    int vp = plan_vp(s), units = s->pp * vp;
    const boundary_hops *in = &b[(i + s->pp - 1) % s->pp], *out = &b[i];
    double t = 0;
    for (int v = 0; v < vp; v++) {
        int u = v * s->pp + i;   /* the chunk's virtual stage */
        if (u > 0) t += in->fwd.recv_s + in->bwd.send_s;
        if (u < units - 1) t += out->fwd.send_s + out->bwd.recv_s;
    }
    return t;
}

void plan_pipeline_hops_of(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                           const cost_cluster *c, const plan_options *o, double samples, plan_pipeline_hops *out)
{
    bool backward = model_runs_backward(&m->mod[mi]);
    boundary_hops link[2], b[PLAN_MAX_PP];   /* link[0] across nodes, link[1] in a node */
    for (int in = 0; in < 2; in++) {
        link[in].fwd = plan_stage_hop_time(m, mi, s, w, c, o, samples, false, in);
        link[in].bwd = backward ? plan_stage_hop_time(m, mi, s, w, c, o, samples, true, in) : (plan_hop_time){ 0, 0 };
    }
    for (int i = 0; i < s->pp; i++) b[i] = link[plan_stage_boundary_in_node(s, c->pool[s->pool].gpus_per_node, i)];
    /* pp - 1 hand-offs each way, pp * vp - 1 with interleaving: every model
     * chunk hands off to the next rank (Narayanan et al. SC'21 sec. 2.2.2),
     * chunk u's over boundary u mod pp */
    out->fwd_s = out->bwd_s = 0;
    for (int u = 0; u < s->pp * plan_vp(s) - 1; u++) {
        out->fwd_s += b[u % s->pp].fwd.recv_s;
        out->bwd_s += b[u % s->pp].bwd.recv_s;
    }
    for (int i = 0; i < s->pp; i++) out->stage_s[i] = stage_hops_s(s, b, i);
}
