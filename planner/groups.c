/* Rank groups of a module: the one place that says which ranks form a
 * tensor-, sequence-, data- or pipeline-parallel group (see planner.h).
 * A module's ranks are laid out
 *   local = ((pp_i * dp + dp_i) * sp + sp_i) * tp + tp_i     (tp fastest),
 * so a group over some axes holds the ranks whose other coordinates agree. */
#include "planner/planner.h"

#define NAXES 4

/* Sizes of the axes in layout order (tp fastest) and the bit of each. */
static void axis_sizes(const plan_module *s, int size[NAXES])
{
    size[0] = s->tp;
    size[1] = s->sp;
    size[2] = s->dp;
    size[3] = s->pp;
}

static const unsigned axis_bit[NAXES] = { PLAN_AX_TP, PLAN_AX_SP, PLAN_AX_DP, PLAN_AX_PP };

static void coord_digits(const plan_coord *c, int d[NAXES])
{
    d[0] = c->tp;
    d[1] = c->sp;
    d[2] = c->dp;
    d[3] = c->pp;
}

/* Mixed-radix number of the digits on the axes in (in == true) or out of the group. */
static int radix(const int size[NAXES], const int digit[NAXES], unsigned axes, bool in, int *count)
{
    int v = 0, mult = 1;
    for (int a = 0; a < NAXES; a++) {
        if (((axes & axis_bit[a]) != 0) != in) continue;
        v += digit[a] * mult;
        mult *= size[a];
    }
    if (count) *count = mult;
    return v;
}

/* Local index (in the module's layout) of a coordinate. */
static int local_index(const int size[NAXES], const int digit[NAXES])
{
    int v = 0, mult = 1;
    for (int a = 0; a < NAXES; a++) {
        v += digit[a] * mult;
        mult *= size[a];
    }
    return v;
}

/* The digits of member `key` of group `color`. */
static void member_digits(const int size[NAXES], unsigned axes, int color, int key, int digit[NAXES])
{
    for (int a = 0; a < NAXES; a++) {
        int *v = (axes & axis_bit[a]) ? &key : &color;
        digit[a] = *v % size[a];
        *v /= size[a];
    }
}

void plan_group_shape(const plan_module *s, unsigned axes, int gpus_per_node, int *size_out, int *per_node)
{
    int size[NAXES], digit[NAXES], n;
    axis_sizes(s, size);
    radix(size, size, axes, true, &n);   /* product of the group's axes */
    /* group 0's members in key order have rising local indices (both count
     * the same digits, tp fastest), so those on the first node come first */
    int on_first_node = 0;
    for (int key = 0; key < n; key++) {
        member_digits(size, axes, 0, key, digit);
        if (local_index(size, digit) >= gpus_per_node) break;
        on_first_node++;
    }
    *size_out = n;
    *per_node = on_first_node > 0 ? on_first_node : 1;
}

bool plan_stage_boundary_in_node(const plan_module *s, int gpus_per_node, int stage)
{
    int stride = s->tp * s->sp * s->dp;   /* a stage's ranks (the layout above), peers this far apart */
    if (gpus_per_node < 1 || stride >= gpus_per_node || s->pp < 2) return false;
    int a = stage * stride, b = (stage + 1) % s->pp * stride;
    for (int r = 0; r < stride; r++)
        if ((a + r) / gpus_per_node != (b + r) / gpus_per_node) return false;
    return true;
}

bool plan_group_of(const plan_t *p, int k, unsigned axes, int rank, plan_group *g)
{
    plan_coord c;
    if (!plan_rank_coord(p, k, rank, &c)) return false;
    const plan_module *s = &p->mod[k];
    int size[NAXES], digit[NAXES];
    axis_sizes(s, size);
    coord_digits(&c, digit);
    g->key = radix(size, digit, axes, true, &g->size);
    g->color = radix(size, digit, axes, false, &g->n_groups);
    int sz;
    plan_group_shape(s, axes, p->cluster.pool[s->pool].gpus_per_node, &sz, &g->per_node);
    return true;
}

int plan_group_member(const plan_t *p, int k, unsigned axes, int color, int key)
{
    const plan_module *s = &p->mod[k];
    int size[NAXES], digit[NAXES];
    axis_sizes(s, size);
    member_digits(size, axes, color, key, digit);
    return s->first_rank + local_index(size, digit);
}

bool plan_embed_group_of(const plan_t *p, int k, int rank, plan_group *g)
{
    plan_coord c;
    const plan_module *s = &p->mod[k];
    if (!plan_rank_coord(p, k, rank, &c) || !plan_dp_rules_of(&p->model.mod[k], s).step_embed_sync) return false;
    if (c.pp != 0 && c.pp != s->pp - 1) return false;
    plan_group pg;
    plan_group_of(p, k, PLAN_AX_PP, rank, &pg);
    /* the two ends of one pipeline: (pp - 1) * dp * sp * tp ranks apart */
    int gap = (s->pp - 1) * s->dp * s->sp * s->tp, gpn = p->cluster.pool[s->pool].gpus_per_node;
    *g = (plan_group){ .color = pg.color, .key = c.pp == 0 ? 0 : 1, .size = 2, .n_groups = pg.n_groups,
                       .per_node = gap < gpn ? 2 : 1 };
    return true;
}

int plan_stage_peer(const plan_t *p, int k, int rank, int v, int dir)
{
    plan_coord c;
    if (!plan_rank_coord(p, k, rank, &c)) return -1;
    int pp = p->mod[k].pp, g = v * pp + c.pp + dir;   /* the neighbouring virtual stage */
    if (v < 0 || v >= plan_vp(&p->mod[k]) || g < 0 || g >= pp * plan_vp(&p->mod[k])) return -1;
    c.pp = g % pp;
    return plan_coord_rank(p, k, &c);
}

int plan_hop_dir(plan_op_kind kind)
{
    const plan_op_info *in = plan_op_props(kind);
    return in->sends != in->grad ? 1 : -1;
}

int plan_hop_edge(const plan_t *p, const plan_op *o, int rank)
{
    plan_coord c;
    if (!plan_rank_coord(p, o->module, rank, &c)) return -1;
    int g = o->vchunk * p->mod[o->module].pp + c.pp;
    /* a send of activations and a receive of gradients sit below the edge (their peer is the next
     * virtual stage), the others above it */
    return plan_hop_dir(o->kind) > 0 ? g : g - 1;
}
