/* Where each rank of a plan runs: its pool, the node within the pool, the
 * GPU within the node, and the node's index over the whole cluster (pools in
 * order, each pool's nodes in order). Ranks of a pool are laid out node-major
 * from the pool's lowest first_rank (plan_pool_offset), as the planner
 * assumes when it keeps tensor-parallel groups inside a node. */
#include "planner/planner.h"

int plan_rank_place(const plan_t *p, int rank, plan_place *out, char *err)
{
    for (int k = 0; k < p->n_modules; k++) {
        const plan_module *s = &p->mod[k];
        if (rank < s->first_rank || rank >= s->first_rank + s->n_ranks) continue;
        const cost_pool *pool = &p->cluster.pool[s->pool];
        int off = plan_pool_offset(p, k) + (rank - s->first_rank);
        out->pool = s->pool;
        out->node = off / pool->gpus_per_node;
        out->gpu = off % pool->gpus_per_node;
        if (out->node >= pool->nodes)
            return util_fail(err, UTIL_EINVAL, "rank %d: pool %s has %d nodes, the plan needs node %d", rank,
                             pool->name, pool->nodes, out->node);
        out->host = out->node;
        for (int i = 0; i < s->pool; i++) out->host += p->cluster.pool[i].nodes;
        return UTIL_OK;
    }
    return util_fail(err, UTIL_EINVAL, "rank %d: no module of the plan runs on it", rank);
}

int plan_cluster_nodes(const plan_t *p)
{
    int n = 0;
    for (int i = 0; i < p->cluster.n_pools; i++) n += p->cluster.pool[i].nodes;
    return n;
}
