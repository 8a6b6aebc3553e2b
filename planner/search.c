/* Search: every module's candidate strategies are priced analytically here,
 * pruned to the useful ones, and a GLPK mixed-integer program chooses one
 * per module together with the placement:
 *
 *   x_c  in {0,1}  candidate c chosen          y in {0,1}  colocated placement
 *   w_f  in {0,1}  colocated family f = (pool, GPUs, samples per micro-step)
 *   z_n  in {0,1}  disaggregated with n chunks; M_n >= 0 slowest stage; E >= 0 slowest tail
 *
 *   sum_c x_c = 1                                  for every module k
 *   sum_{c in col(k,f)} x_c = w_f,  sum_f w_f = y   colocated modules share GPUs
 *   sum_{c in col(f)} mem_c x_c <= cap_f - reserved_f
 *   sum_{c in dis(k,n)} x_c = z_n,  sum_n z_n = 1 - y
 *   sum_{c in dis, pool p} gpus_c x_c <= G_p        disjoint groups
 *   M_n >= sum_{c in dis(k,n)} steady_c x_c  (+ sum_{c in dis(LLM,n)} loop_c x_c
 *          for an encoder k that trains),  E >= sum_{c in dis(k)} tail_c x_c
 *   Enc >= sum_{c in dis(k)} time_c x_c          for every encoder k
 *
 *   minimise  sum_{col} time_c x_c + sum_{dis, LLM} time_c x_c + Enc + sum_n (n-1) M_n + E
 *
 * which is the colocated in-turn step (sum of modules) or the pipelined
 * step (fill/drain: slowest encoder, then the LLM's chunk with its
 * pipeline's fill and drain, then (n-1) x the slowest steady chunk, then
 * the slowest optimizer tail), a training encoder's chunk lengthened by the
 * LLM's part of their loop (plan_encoder_loop; plan_evaluate's
 * disaggregated_step runs the chunks one by one). */
#include "planner/planner.h"

#include <glpk.h>
#include <math.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OPTS 64
#define DISAGG_FRONT 3   /* candidates kept per disaggregated key (prune) */

void plan_search_options_default(plan_search_options *o)
{
    plan_options_default(&o->opt);
    o->top_k = 4;
    o->allow_colocated = o->allow_disaggregated = true;
    o->max_pp = 8;
    o->time_limit_s = 20;
    o->verbose = false;
    o->exhaustive = false;
}

/* GPU counts a module group may take in a pool: every count inside a node;
 * on pools of up to 4 nodes every multiple of a quarter node; beyond, whole
 * nodes 1, 2, 3, 4, 6, 8, 12, 16, ... (x1.5 / x1.33 steps). */
static int gpu_count_options(const cost_pool *p, int *out)
{
    int n = 0, gpn = p->gpus_per_node;
    for (int g = 1; g < gpn && n < MAX_OPTS; g++) out[n++] = g;
    if (p->nodes <= 4) {
        int step = gpn >= 4 ? gpn / 4 : 1;
        for (int g = gpn; g <= p->nodes * gpn && n < MAX_OPTS; g += step) out[n++] = g;
        return n;
    }
    for (int nodes = 1; nodes <= p->nodes && n < MAX_OPTS;) {
        out[n++] = nodes * gpn;
        int next_pow = 1;
        while (next_pow <= nodes) next_pow *= 2;
        nodes = (nodes >= 2 && nodes * 3 / 2 < next_pow && (nodes & (nodes - 1)) == 0) ? nodes * 3 / 2 : next_pow;
    }
    return n;
}

static int divisors_up_to(int b, int limit, int *out)
{
    int n = 0;
    for (int d = 1; d <= b && d <= limit && n < MAX_OPTS; d++) if (b % d == 0) out[n++] = d;
    return n;
}

/* A candidate the cost model cannot place (INFINITY from costdb) never enters the MILP. */
static int push(plan_candidates *cs, const plan_candidate *c)
{
    if (!isfinite(c->time) || !isfinite(c->tail) || !isfinite(c->mem)) return UTIL_OK;
    if (cs->n == cs->cap) {
        int cap = cs->cap ? cs->cap * 2 : 256;
        plan_candidate *nc = util_realloc(cs->c, (size_t)cap * sizeof *nc);
        if (!nc) return UTIL_ENOMEM;
        cs->c = nc; cs->cap = cap;
    }
    cs->c[cs->n++] = *c;
    return UTIL_OK;
}

/* What price() gave one strategy: its time and memory depend on the
 * strategy, its micro-batch and the slots in flight, not on the chunk, so
 * the strategy's candidates (colocated, and disaggregated for every chunk
 * count) price each power-of-two micro-batch once per in-flight count. */
#define MEMO_MB 31
typedef struct {
    bool done[2][MEMO_MB];
    plan_time t[2][MEMO_MB];
    plan_mem mem[2][MEMO_MB];
} price_memo;

typedef struct {
    const model_t *m;
    const cost_cluster *c;
    const plan_workload *w;
    const plan_search_options *o;
    plan_candidates *cs;
    price_memo *memo;         /* the strategy being priced (build_module clears it) */
} build_ctx;

static void price(const build_ctx *b, int k, const plan_module *s, int in_flight, plan_time *t, plan_mem *mem)
{
    int j = 0;
    while (j < MEMO_MB && (1 << j) < s->micro_batch) j++;
    bool memo = b->memo && in_flight >= 1 && in_flight <= 2 && j < MEMO_MB && (1 << j) == s->micro_batch;
    if (memo && b->memo->done[in_flight - 1][j]) {
        *t = b->memo->t[in_flight - 1][j];
        *mem = b->memo->mem[in_flight - 1][j];
        return;
    }
    plan_module_time(b->m, k, s, b->w, b->c, &b->o->opt, t);
    plan_module_memory(b->m, k, s, b->w, &b->c->pool[s->pool].gpu, &b->o->opt, in_flight, mem);
    if (memo) {
        b->memo->t[in_flight - 1][j] = *t;
        b->memo->mem[in_flight - 1][j] = *mem;
        b->memo->done[in_flight - 1][j] = true;
    }
}

/* Colocated candidates of module k with given degrees, for every samples-per-step. */
/* Interleaved stages run where each 1F1B pass's micro-batches come in
 * whole groups of pp (plan_schedule_check; Megatron-LM's rule). */
static bool interleaving_fits(const plan_module *s, int micro_per_pass)
{
    return plan_vp(s) == 1 || (micro_per_pass > 0 && micro_per_pass % s->pp == 0);
}

static int add_colocated(const build_ctx *b, int k, plan_module s, int gpus)
{
    int B = b->w->global_batch;
    for (int mb = 1; mb * s.dp <= B; mb *= 2) {
        int S = mb * s.dp;
        if (B % S) continue;
        /* beside encoders each chunk of S samples is its own pass: one micro-batch per rank */
        if (!interleaving_fits(&s, plan_whole_batch_pipeline(b->m, b->w) ? B / S : 1)) continue;
        s.micro_batch = mb;
        plan_time t; plan_mem mem;
        price(b, k, &s, 1, &t, &mem);
        double fixed = mem.total - plan_mem_once(&mem);
        if (mem.total > mem.capacity) continue;
        /* the schedule's B / S chunks of S samples, a pipelined module filling and draining in each */
        plan_candidate c = { .module = k, .colocated = true, .pool = s.pool, .gpus = gpus,
                             .samples_per_step = S, .n_micro = 1, .s = s,
                             .time = (plan_whole_batch_pipeline(b->m, b->w) ? plan_chunk_time(&t, &s, B)
                                      : (double)(B / S) * plan_chunk_time(&t, &s, S)) + plan_time_tail_s(&t),
                             .mem = fixed };
        int rc = push(b->cs, &c);
        if (rc) return rc;
    }
    return UTIL_OK;
}

/* Disaggregated candidates of module k: one per chunk count n. An encoder
 * that trains processes its whole per-rank chunk at once (its activations
 * wait for the LLM's gradient anyway); the LLM, and a frozen encoder, which
 * keeps nothing for a backward, may micro-step inside a chunk. A chunk need
 * not divide evenly over dp: the busiest replica paces the group. */
static int add_disaggregated(const build_ctx *b, int k, plan_module s, int gpus)
{
    int B = b->w->global_batch, ns[MAX_OPTS];
    int nn = divisors_up_to(B, 32, ns);
    bool encoder = k != b->m->llm;
    for (int i = 0; i < nn; i++) {
        int n = ns[i], chunk = B / n;
        if (chunk < s.dp) continue;
        /* Uneven splits are allowed: the busiest rank takes ceil(chunk / dp). */
        int per_rank = (chunk + s.dp - 1) / s.dp;
        for (int mb = encoder && model_runs_backward(&b->m->mod[k]) ? per_rank : 1; mb <= per_rank; mb *= 2) {
            /* the whole step is one pass: interleave only where every replica's share splits evenly */
            bool even = chunk % s.dp == 0 && per_rank % mb == 0;
            if (!interleaving_fits(&s, even ? n * (per_rank / mb) : 0)) continue;
            s.micro_batch = mb;
            plan_time t; plan_mem mem;
            price(b, k, &s, encoder && n > 1 ? 2 : 1, &t, &mem);
            if (mem.total > mem.capacity) continue;
            /* a short last micro-batch priced at its own samples (plan_short_micro_saving) */
            double pace = plan_pace_s(&t, &s);
            double saved = plan_short_micro_saving(b->m, k, &s, b->w, b->c, &b->o->opt, &t, chunk);
            double time = plan_chunk_time(&t, &s, chunk) - saved * pace, steady = time, loop = 0;
            bool trains = false;
            if (!encoder) {   /* its fill and drain once a step; a training encoder waits reach units a chunk */
                double micros, bubbles;
                plan_chunk_units(&t, &s, chunk, &micros, &bubbles);
                plan_encoder_loop l;
                char e[UTIL_ERR_LEN];
                int rc = plan_encoder_loop_even(s.pp, plan_vp(&s), n, (int)micros, &l, e);
                if (rc) return rc;
                steady = (micros - saved) * pace;
                loop = l.reach * steady / (micros * plan_vp(&s));   /* reach units, as evaluate.c prices a unit */
            } else {
                const model_module *mm = &b->m->mod[k];
                plan_seq q;
                plan_module_seq(b->m, k, b->w, &q);
                double bytes = plan_precision_bytes(b->o->opt.precision).act
                             * plan_encoder_out_rows(mm, &q, q.tokens_per_sample * per_rank / s.sp) * mm->out_hidden;
                bool one_node = cost_pool_gpus(&b->c->pool[s.pool]) <= b->c->pool[s.pool].gpus_per_node;
                /* its hand-off before the LLM's strategy is known: one copy of its share out and, where it
                 * trains, its gradient back (the plan's own, evaluate.c transfer_times, counts the LLM's ends) */
                trains = model_trains(mm);
                time += (trains ? 2.0 : 1.0) * cost_p2p_time(b->c, s.pool, s.pool, one_node, bytes);
                steady = time;
            }
            plan_candidate c = { .module = k, .colocated = false, .pool = s.pool, .gpus = gpus, .n_micro = n,
                                 .s = s, .time = time, .steady = steady, .loop = loop, .trains = trains,
                                 .tail = plan_time_tail_s(&t), .mem = mem.total };
            int rc = push(b->cs, &c);
            if (rc) return rc;
        }
    }
    return UTIL_OK;
}

/* A candidate's own step: colocated its share, disaggregated its n chunks
 * pipelined (the first whole, the rest at its steady pace). */
static double own_step(const plan_candidate *c)
{
    return c->colocated ? c->time : c->time + (c->n_micro - 1) * c->steady;
}

/* Sorts candidates by key and keeps the Pareto front of own step and memory
 * per key (a disaggregated key as a colocated one). */
static int key_cmp(const void *pa, const void *pb)
{
    const plan_candidate *a = pa, *b = pb;
    if (a->module != b->module) return a->module - b->module;
    if (a->colocated != b->colocated) return a->colocated - b->colocated;
    if (a->pool != b->pool) return a->pool - b->pool;
    if (a->gpus != b->gpus) return a->gpus - b->gpus;
    int ka = a->colocated ? a->samples_per_step : a->n_micro, kb = b->colocated ? b->samples_per_step : b->n_micro;
    if (ka != kb) return ka - kb;
    double ra = own_step(a), rb = own_step(b);
    if (ra != rb) return ra < rb ? -1 : 1;
    if (a->mem != b->mem) return a->mem < b->mem ? -1 : 1;
    return 0;
}

static bool same_key(const plan_candidate *a, const plan_candidate *b)
{
    return a->module == b->module && a->colocated == b->colocated && a->pool == b->pool && a->gpus == b->gpus
        && (a->colocated ? a->samples_per_step == b->samples_per_step : a->n_micro == b->n_micro);
}

static void prune(plan_candidates *cs)
{
    qsort(cs->c, (size_t)cs->n, sizeof cs->c[0], key_cmp);
    int out = 0;
    for (int i = 0; i < cs->n;) {
        int j = i;
        while (j < cs->n && same_key(&cs->c[i], &cs->c[j])) j++;
        /* Sorted by own step within the key: the first is the fastest; a later
         * one survives on the front only if it needs strictly less memory. A
         * disaggregated key keeps the first few of its front: where the
         * simulation finds a plan short of memory (the hand-off's buffers, no
         * one candidate's), a leaner one is there to take. */
        double best_mem = INFINITY;
        for (int t = i, kept = 0; t < j && (cs->c[t].colocated || kept < DISAGG_FRONT); t++)
            if (cs->c[t].mem < best_mem) { cs->c[out++] = cs->c[t]; best_mem = cs->c[t].mem; kept++; }
        i = j;
    }
    cs->n = out;
}

/* The recompute_layers variants of full recomputation a strategy s is
 * priced with where keeping everything does not fit: 0 (every block), then
 * a quarter, a half and three quarters of its longest model chunk's blocks
 * (plan_module.recompute_layers), each between keeping everything and
 * recomputing it all in time and memory, for the MILP to weigh against the
 * other modules' memory. Just the first for a module without a backward to
 * recompute for. Their count, in out[]. */
static int recompute_layer_options(const model_module *mm, const plan_module *s, int out[4])
{
    int n = 0, longest = plan_longest_chunk(mm, s);
    out[n++] = 0;
    if (!model_runs_backward(mm)) return n;
    for (int q = 1; q <= 3; q++) {
        int r = longest * q / 4;
        if (r >= 1 && r < longest && r != out[n - 1]) out[n++] = r;
    }
    return n;
}

static int build_module(const build_ctx *b, int k)
{
    const model_module *mm = &b->m->mod[k];
    for (int p = 0; p < b->c->n_pools; p++) {
        const cost_pool *pool = &b->c->pool[p];
        int gs[MAX_OPTS], ng = gpu_count_options(pool, gs);
        for (int gi = 0; gi < ng; gi++) {
            util_progress("plan: pricing candidates", gi, ng);
            int g = gs[gi];
            for (int tp = 1; tp <= pool->gpus_per_node && tp <= g; tp *= 2)
            for (int sp = 1; tp * sp <= g && tp * sp <= mm->heads; sp *= 2)
            for (int pp = 1; tp * sp * pp <= g && pp <= b->o->max_pp; pp *= 2)
            /* the LLM's interleaved virtual stages (Narayanan et al. SC'21 sec. 2.2.2): 2 chunks per rank */
            /* (DeepSpeed's pipeline engine has none: plan_validate) */
            for (int vp = 1; vp <= (k == b->m->llm && pp > 1 && plan_pipe_engine_props(b->o->opt.pipe_engine)->interleaves ? 2 : 1);
                 vp++)
            /* the LLM's interleaved split with the embedding and the head a block each
             * (plan_module.split_ends; Llama 3's balance of its first and last chunk) where
             * plan_stage_split_check takes it (without interleaving it is plan_stage_of's own) */
            for (int ends = 0; ends <= (k == b->m->llm && vp > 1); ends++)
            /* the LLM's context parallelism: its default (Ulysses where tp x sp divides the heads,
             * else ring: plan_cp_of), and ring attention where the default is Ulysses */
            for (int ring = 0; ring <= (k == b->m->llm && sp > 1); ring++) {
                if (g % (tp * sp * pp)) continue;
                if (ring && plan_cp_of(mm, &(plan_module){ .tp = tp, .sp = sp }) == PLAN_CP_RING) continue;   /* the default */
                int dp = g / (tp * sp * pp);
                /* whether keeping every activation made a candidate, per ZeRO stage: then
                 * recomputing a part of the blocks is not tried (it only pays where that
                 * does not fit, and doubled the 1,024-GPU search's time where it was) */
                bool none_fits[4] = { false };
                for (int rc = 0; rc < 3; rc++)
                for (int zero = 0; zero <= 3; zero++)
                for (int rl = 0, n_rl = 1, rls[4] = { 0 }; rl < n_rl; rl++) {
                    if (zero > 0 && dp * sp == 1) break;
                    /* ZeRO-2 beside pipeline stages runs (--strategy) but reduce-scatters every
                     * micro-batch's gradients of the stage, which loses to ZeRO-1's one reduction
                     * a step wherever the pipeline has the micro-batches to fill it; pricing it
                     * made the 1,024-GPU search 2.32 -> 3.16 s for the same plan */
                    if (zero == 2 && pp > 1) continue;
                    /* ZeRO-3 beside stages likewise gathers each stage's weights twice a
                     * micro-batch where ZeRO-1 moves them once a step; tried where the degrees
                     * fit no other way (at the least recomputation that fits) it priced Llama 3
                     * 405B's 1,024-GPU search 88 -> 169 candidates, 4.0 -> 6.5-7.2 s, for the same plan */
                    if (zero == 3 && pp > 1) continue;
                    plan_module s = { .module_index = k, .pool = p, .dp = dp, .tp = tp, .sp = sp, .pp = pp,
                                      .zero = zero, .micro_batch = 1, .recompute = (plan_recompute)rc, .vp = vp,
                                      .split_ends = ends, .cp = ring ? PLAN_CP_RING : PLAN_CP_NONE,
                                      .seq_parallel = mm->kind == MODEL_LLM && tp > 1, .n_ranks = g };
                    if (rc == PLAN_RECOMP_FULL && rl == 0 && !none_fits[zero]) n_rl = recompute_layer_options(mm, &s, rls);
                    s.recompute_layers = rls[rl];
                    util_strlcpy(s.module, mm->name, sizeof s.module);
                    if (plan_strategy_check(b->m, k, &s, b->w, b->c, NULL)) continue;
                    memset(b->memo->done, 0, sizeof b->memo->done);
                    int err, before = b->cs->n;
                    if (b->o->allow_colocated && (err = add_colocated(b, k, s, g))) return err;
                    /* one module has no other to be apart from: its disaggregated plans are its
                     * colocated ones again (asked for alone, --placement disaggregated, they stay) */
                    bool apart = b->o->allow_disaggregated && !(b->o->allow_colocated && b->m->n_modules == 1);
                    if (apart && (err = add_disaggregated(b, k, s, g))) return err;
                    if (rc == PLAN_RECOMP_NONE && b->cs->n > before) none_fits[zero] = true;
                }
            }
        }
        util_progress("plan: pricing candidates", ng, ng);
    }
    return UTIL_OK;
}

int plan_candidates_build(const model_t *m, const cost_cluster *c, const plan_workload *w,
                          const plan_search_options *o, plan_candidates *out, char *err)
{
    memset(out, 0, sizeof *out);
    out->n_modules = m->n_modules;
    out->llm = m->llm;
    out->n_pools = c->n_pools;
    for (int p = 0; p < c->n_pools; p++) {
        out->reserved[p] = plan_reserved_bytes(&o->opt, &c->pool[p].gpu) + plan_backend_workspace_bytes(&o->opt, &c->pool[p].gpu);
        out->capacity[p] = c->pool[p].gpu.hbm_bytes;
        out->pool_gpus[p] = cost_pool_gpus(&c->pool[p]);
    }
    build_ctx b = { m, c, w, o, out, util_malloc(sizeof(price_memo)) };
    if (!b.memo) return util_fail(err, UTIL_ENOMEM, "planner: out of memory");
    for (int k = 0; k < m->n_modules; k++) {
        int before = out->n;
        if (build_module(&b, k)) {
            util_free(b.memo);
            plan_candidates_free(out);
            return util_fail(err, UTIL_ENOMEM, "planner: out of memory");
        }
        if (out->n == before) {
            util_free(b.memo);
            plan_candidates_free(out);
            return util_fail(err, UTIL_EINFEASIBLE,
                             "module '%s' of %s fits on no GPU group of cluster '%s' for this workload",
                             m->mod[k].name, m->name, c->name);
        }
    }
    util_free(b.memo);
    prune(out);
    return UTIL_OK;
}

void plan_candidates_free(plan_candidates *cs)
{
    util_free(cs->c);
    memset(cs, 0, sizeof *cs);
}

bool plan_candidates_objective(const plan_candidates *cs, const int *chosen, double *objective)
{
    const plan_candidate *first = &cs->c[chosen[0]];
    double sum = 0, max_t = 0, max_tail = 0, mem = 0, max_enc = 0, llm = 0;
    int used[COST_MAX_POOLS] = { 0 };
    for (int k = 0; k < cs->n_modules; k++) {
        const plan_candidate *c = &cs->c[chosen[k]];
        if (c->module != k || c->colocated != first->colocated) return false;
        if (c->colocated) {
            if (c->pool != first->pool || c->gpus != first->gpus || c->samples_per_step != first->samples_per_step)
                return false;
            mem += c->mem;
        } else {
            if (c->n_micro != first->n_micro) return false;
            used[c->pool] += c->gpus;
            if (c->tail > max_tail) max_tail = c->tail;
        }
        sum += c->time;
        if (c->steady > max_t) max_t = c->steady;
        if (k == cs->llm) llm = c->time;
        else if (c->time > max_enc) max_enc = c->time;
    }
    /* a training encoder's period: its chunk and the LLM's loop (see the MILP's M_n rows) */
    for (int k = 0; k < cs->n_modules; k++) {
        const plan_candidate *c = &cs->c[chosen[k]];
        if (!c->colocated && k != cs->llm && c->trains) max_t = fmax(max_t, c->steady + cs->c[chosen[cs->llm]].loop);
    }
    if (first->colocated) {
        if (mem > cs->capacity[first->pool] - cs->reserved[first->pool]) return false;
        *objective = sum;
    } else {
        for (int p = 0; p < cs->n_pools; p++) if (used[p] > cs->pool_gpus[p]) return false;
        *objective = max_enc + llm + (first->n_micro - 1) * max_t + max_tail;
    }
    return true;
}

/* Column layout of the MILP. */
typedef struct {
    int n_x, n_fam, n_n;
    int fam_pool[4096], fam_gpus[4096], fam_S[4096];
    int n_values[MAX_OPTS];
    int col_y, col_w0, col_z0, col_M0, col_E, col_enc, n_cols;
    int *fam;                 /* family of each colocated candidate, -1 otherwise */
} milp_layout;

static int family_of(const milp_layout *L, const plan_candidate *c)
{
    for (int f = 0; f < L->n_fam; f++)
        if (L->fam_pool[f] == c->pool && L->fam_gpus[f] == c->gpus && L->fam_S[f] == c->samples_per_step) return f;
    return -1;
}

static int nindex_of(const milp_layout *L, int n)
{
    for (int i = 0; i < L->n_n; i++) if (L->n_values[i] == n) return i;
    return -1;
}

static int layout_build(const plan_candidates *cs, milp_layout *L)
{
    memset(L, 0, sizeof *L);
    L->n_x = cs->n;
    L->fam = util_malloc(sizeof(int) * (size_t)(cs->n ? cs->n : 1));
    if (!L->fam) return UTIL_ENOMEM;
    for (int i = 0; i < cs->n; i++) {
        const plan_candidate *c = &cs->c[i];
        L->fam[i] = -1;
        if (c->colocated) {
            /* Candidates are sorted by key, so a family's members are adjacent per module. */
            int f = family_of(L, c);
            if (f < 0) {
                if (L->n_fam == 4096) return UTIL_ENOMEM;
                f = L->n_fam++;
                L->fam_pool[f] = c->pool; L->fam_gpus[f] = c->gpus; L->fam_S[f] = c->samples_per_step;
            }
            L->fam[i] = f;
        }
        if (!c->colocated && nindex_of(L, c->n_micro) < 0) {
            if (L->n_n == MAX_OPTS) return UTIL_ENOMEM;
            L->n_values[L->n_n++] = c->n_micro;
        }
    }
    /* GLPK columns are 1-based: x_1..x_n, then y, w_f, z_n, M_n, E. */
    L->col_y = L->n_x + 1;
    L->col_w0 = L->col_y + 1;
    L->col_z0 = L->col_w0 + L->n_fam;
    L->col_M0 = L->col_z0 + L->n_n;
    L->col_E = L->col_M0 + L->n_n;
    L->col_enc = L->col_E + 1;
    L->n_cols = L->col_enc;
    return UTIL_OK;
}

/* Sparse row builder for glp_set_mat_row. */
typedef struct { int n, cap; int *ind; double *val; } row_buf;

static int row_add(row_buf *r, int col, double v)
{
    if (r->n + 1 >= r->cap) {
        int cap = r->cap ? r->cap * 2 : 64;
        int *ni = util_realloc(r->ind, (size_t)cap * sizeof(int));
        if (!ni) return UTIL_ENOMEM;
        r->ind = ni;
        double *nv = util_realloc(r->val, (size_t)cap * sizeof(double));
        if (!nv) return UTIL_ENOMEM;
        r->val = nv;
        r->cap = cap;
    }
    r->n++;
    r->ind[r->n] = col;
    r->val[r->n] = v;
    return UTIL_OK;
}

static int row_emit(glp_prob *lp, row_buf *r, int type, double lo, double hi)
{
    int row = glp_add_rows(lp, 1);
    glp_set_row_bnds(lp, row, type, lo, hi);
    glp_set_mat_row(lp, row, r->n, r->ind, r->val);
    r->n = 0;
    return row;
}

static int add_rows(glp_prob *lp, const plan_candidates *cs, const milp_layout *L,
                    const int *excluded, int n_excluded, row_buf *r)
{
    int K = cs->n_modules;
    int rc = 0;
    /* One candidate per module. */
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < cs->n; i++) if (cs->c[i].module == k) rc |= row_add(r, i + 1, 1.0);
        row_emit(lp, r, GLP_FX, 1.0, 1.0);
    }
    /* Colocated families: every module picks the family w_f; sum w_f = y; memory per family. */
    for (int f = 0; f < L->n_fam; f++) {
        for (int k = 0; k < K; k++) {
            for (int i = 0; i < cs->n; i++)
                if (cs->c[i].colocated && cs->c[i].module == k && L->fam[i] == f) rc |= row_add(r, i + 1, 1.0);
            rc |= row_add(r, L->col_w0 + f, -1.0);
            row_emit(lp, r, GLP_FX, 0.0, 0.0);
        }
        for (int i = 0; i < cs->n; i++)
            if (cs->c[i].colocated && L->fam[i] == f) rc |= row_add(r, i + 1, cs->c[i].mem / 1e9);
        int p = L->fam_pool[f];
        row_emit(lp, r, GLP_UP, 0.0, (cs->capacity[p] - cs->reserved[p]) / 1e9);
    }
    for (int f = 0; f < L->n_fam; f++) rc |= row_add(r, L->col_w0 + f, 1.0);
    rc |= row_add(r, L->col_y, -1.0);
    row_emit(lp, r, GLP_FX, 0.0, 0.0);
    /* Disaggregated: every module picks the same chunk count; sum z_n = 1 - y. */
    for (int ni = 0; ni < L->n_n; ni++)
        for (int k = 0; k < K; k++) {
            for (int i = 0; i < cs->n; i++)
                if (!cs->c[i].colocated && cs->c[i].module == k && cs->c[i].n_micro == L->n_values[ni])
                    rc |= row_add(r, i + 1, 1.0);
            rc |= row_add(r, L->col_z0 + ni, -1.0);
            row_emit(lp, r, GLP_FX, 0.0, 0.0);
            /* M_n >= module k's pick's steady chunk and, for a training encoder, the LLM pick's loop */
            bool trains = false;
            for (int i = 0; i < cs->n; i++)
                if (!cs->c[i].colocated && cs->c[i].module == k && cs->c[i].n_micro == L->n_values[ni]) {
                    rc |= row_add(r, i + 1, cs->c[i].steady);
                    trains |= cs->c[i].trains;
                }
            for (int i = 0; trains && i < cs->n; i++)
                if (!cs->c[i].colocated && cs->c[i].module == cs->llm && cs->c[i].n_micro == L->n_values[ni]
                    && cs->c[i].loop > 0)
                    rc |= row_add(r, i + 1, cs->c[i].loop);
            rc |= row_add(r, L->col_M0 + ni, -1.0);
            row_emit(lp, r, GLP_UP, 0.0, 0.0);
        }
    for (int ni = 0; ni < L->n_n; ni++) rc |= row_add(r, L->col_z0 + ni, 1.0);
    rc |= row_add(r, L->col_y, 1.0);
    row_emit(lp, r, GLP_FX, 1.0, 1.0);
    /* Enc >= chunk time of each encoder's disaggregated pick (encoders run side by side). */
    for (int k = 0; k < K; k++) {
        if (k == cs->llm) continue;
        for (int i = 0; i < cs->n; i++)
            if (!cs->c[i].colocated && cs->c[i].module == k) rc |= row_add(r, i + 1, cs->c[i].time);
        rc |= row_add(r, L->col_enc, -1.0);
        row_emit(lp, r, GLP_UP, 0.0, 0.0);
    }
    /* E >= tail of each module's disaggregated pick. */
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < cs->n; i++)
            if (!cs->c[i].colocated && cs->c[i].module == k) rc |= row_add(r, i + 1, cs->c[i].tail);
        rc |= row_add(r, L->col_E, -1.0);
        row_emit(lp, r, GLP_UP, 0.0, 0.0);
    }
    /* GPU budget per pool for disjoint groups. */
    for (int p = 0; p < cs->n_pools; p++) {
        for (int i = 0; i < cs->n; i++)
            if (!cs->c[i].colocated && cs->c[i].pool == p) rc |= row_add(r, i + 1, cs->c[i].gpus);
        if (r->n) row_emit(lp, r, GLP_UP, 0.0, cs->pool_gpus[p]);
    }
    /* No-good cuts: each earlier solution is excluded. */
    for (int e = 0; e < n_excluded; e++) {
        for (int k = 0; k < K; k++) rc |= row_add(r, excluded[e * K + k] + 1, 1.0);
        row_emit(lp, r, GLP_UP, 0.0, K - 1.0);
    }
    return rc;
}

static void add_columns(glp_prob *lp, const plan_candidates *cs, const milp_layout *L)
{
    glp_add_cols(lp, L->n_cols);
    for (int i = 0; i < cs->n; i++) {
        glp_set_col_kind(lp, i + 1, GLP_BV);
        /* Disaggregated encoders enter the fill/drain through Enc, not directly. */
        bool via_enc = !cs->c[i].colocated && cs->c[i].module != cs->llm;
        glp_set_obj_coef(lp, i + 1, via_enc ? 0.0 : cs->c[i].time);
    }
    glp_set_col_kind(lp, L->col_y, GLP_BV);
    for (int f = 0; f < L->n_fam; f++) glp_set_col_kind(lp, L->col_w0 + f, GLP_BV);
    for (int ni = 0; ni < L->n_n; ni++) {
        glp_set_col_kind(lp, L->col_z0 + ni, GLP_BV);
        glp_set_col_bnds(lp, L->col_M0 + ni, GLP_LO, 0.0, 0.0);
        glp_set_obj_coef(lp, L->col_M0 + ni, L->n_values[ni] - 1.0);
    }
    glp_set_col_bnds(lp, L->col_E, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(lp, L->col_E, 1.0);
    glp_set_col_bnds(lp, L->col_enc, GLP_LO, 0.0, 0.0);
    glp_set_obj_coef(lp, L->col_enc, 1.0);
}

/* GLPK aborts the process on internal errors; its error hook lets us return
 * an error instead (glp_error_hook, GLPK reference manual sec. 6.1). */
static jmp_buf glpk_escape;
static void glpk_error_hook(void *info)
{
    (void)info;
    longjmp(glpk_escape, 1);
}

static int solve_guarded(glp_prob *lp, glp_iocp *parm, int *ret)
{
    glp_error_hook(glpk_error_hook, NULL);
    if (setjmp(glpk_escape)) {
        glp_error_hook(NULL, NULL);
        glp_free_env();   /* the environment is unusable after an error */
        return UTIL_ERUNTIME;
    }
    *ret = glp_intopt(lp, parm);
    glp_error_hook(NULL, NULL);
    return UTIL_OK;
}

int plan_milp_solve(const plan_candidates *cs, const int *excluded, int n_excluded, double time_limit_s,
                    int *chosen, double *objective, int *n_vars, int *n_rows, char *err)
{
    milp_layout *L = util_calloc(1, sizeof *L);
    if (!L) return util_fail(err, UTIL_ENOMEM, "planner: out of memory");
    int rc = layout_build(cs, L);
    if (rc) { util_free(L->fam); util_free(L); return util_fail(err, rc, "planner: too many candidate families"); }
    glp_prob *lp = glp_create_prob();
    glp_set_obj_dir(lp, GLP_MIN);
    add_columns(lp, cs, L);
    row_buf r = { 0 };
    rc = add_rows(lp, cs, L, excluded, n_excluded, &r);
    util_free(r.ind); util_free(r.val);
    if (rc) { glp_delete_prob(lp); util_free(L->fam); util_free(L); return util_fail(err, UTIL_ENOMEM, "planner: out of memory"); }
    if (n_vars) *n_vars = glp_get_num_cols(lp);
    if (n_rows) *n_rows = glp_get_num_rows(lp);
    glp_iocp parm;
    glp_init_iocp(&parm);
    parm.presolve = GLP_ON;
    parm.msg_lev = GLP_MSG_OFF;
    parm.tm_lim = (int)(time_limit_s * 1000);
    parm.mip_gap = 0.0;
    int ret;
    if (solve_guarded(lp, &parm, &ret)) {
        util_free(L->fam); util_free(L);
        return util_fail(err, UTIL_ERUNTIME, "planner: GLPK failed inside glp_intopt");
    }
    int status = glp_mip_status(lp);
    if ((ret != 0 && ret != GLP_ETMLIM) || (status != GLP_OPT && status != GLP_FEAS)) {
        glp_delete_prob(lp); util_free(L->fam); util_free(L);
        return util_fail(err, UTIL_EINFEASIBLE,
                         "no plan fits: every combination of the %d candidate module strategies exceeds a GPU's memory "
                         "or the GPU count (MILP %s)", cs->n,
                         status == GLP_NOFEAS || ret == GLP_ENOPFS ? "infeasible" : "found no solution");
    }
    *objective = glp_mip_obj_val(lp);
    for (int k = 0; k < cs->n_modules; k++) chosen[k] = -1;
    for (int i = 0; i < cs->n; i++)
        if (glp_mip_col_val(lp, i + 1) > 0.5) chosen[cs->c[i].module] = i;
    glp_delete_prob(lp);
    util_free(L->fam); util_free(L);
    for (int k = 0; k < cs->n_modules; k++)
        if (chosen[k] < 0) return util_fail(err, UTIL_ERUNTIME, "planner: MILP left module %d unassigned", k);
    return UTIL_OK;
}

/* Exhaustive enumeration of one candidate per module, the Calculon-style
 * baseline the benchmark times the MILP against. Refuses above max_combos. */
int plan_exhaustive_solve(const plan_candidates *cs, double max_combos, int *chosen, double *objective, char *err)
{
    int K = cs->n_modules;
    int count[MODEL_MAX_MODULES] = { 0 }, start[MODEL_MAX_MODULES] = { 0 };
    for (int i = cs->n - 1; i >= 0; i--) { count[cs->c[i].module]++; start[cs->c[i].module] = i; }
    double combos = 1;
    for (int k = 0; k < K; k++) combos *= count[k];
    if (combos > max_combos)
        return util_fail(err, UTIL_EUNSUPPORTED, "exhaustive search: %.3g combinations exceed the limit %.3g", combos, max_combos);
    /* Candidates are sorted by module, so module k's are [start[k], start[k] + count[k]). */
    int idx[MODEL_MAX_MODULES];
    for (int k = 0; k < K; k++) idx[k] = start[k];
    double best = INFINITY;
    for (;;) {
        double obj;
        if (plan_candidates_objective(cs, idx, &obj) && obj < best) {
            best = obj;
            memcpy(chosen, idx, sizeof(int) * (size_t)K);
        }
        int k = K - 1;
        while (k >= 0 && ++idx[k] == start[k] + count[k]) { idx[k] = start[k]; k--; }
        if (k < 0) break;
    }
    if (best == INFINITY) return util_fail(err, UTIL_EINFEASIBLE, "planner: no plan fits (exhaustive search)");
    *objective = best;
    return UTIL_OK;
}
