/* Whether a module can run under a strategy (plan_strategy_check): the
 * degrees, the ZeRO stage and the pool, and what each parallelism needs of
 * the model's shape and the workload (heads, blocks per stage, sequence
 * splits, the executor's row layouts); the one gate every candidate, every
 * --strategy and every plan file passes before it is priced. */
#include "planner/planner_int.h"

#include <math.h>

static bool divides(long a, long b) { return a > 0 && b % a == 0; }

int plan_strategy_check(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                        const cost_cluster *c, char *err)
{
    const model_module *mm = &m->mod[mi];
    if (s->dp < 1 || s->tp < 1 || s->sp < 1 || s->pp < 1 || s->micro_batch < 1)
        return util_fail(err, UTIL_EINVAL, "%s: degrees and micro_batch must be >= 1", mm->name);
    if (s->zero < 0 || s->zero > 3)
        return util_fail(err, UTIL_EINVAL, "%s: zero stage must be 0..3 (got %d)", mm->name, s->zero);
    if (s->pool < 0 || s->pool >= c->n_pools)
        return util_fail(err, UTIL_EINVAL, "%s: pool %d does not exist", mm->name, s->pool);
    const cost_pool *pool = &c->pool[s->pool];
    if (s->tp > pool->gpus_per_node)
        return util_fail(err, UTIL_EINVAL, "%s: tp %d exceeds the %d GPUs of a node", mm->name, s->tp,
                         pool->gpus_per_node);
    /* ring attention is the LLM's (executor/ring.c); an encoder's sp is Ulysses over its rows */
    if (s->cp != PLAN_CP_NONE && s->sp <= 1)
        return util_fail(err, UTIL_EINVAL, "%s: cp=%s says how sp ranks attend across the sequence: it needs sp > 1",
                         mm->name, plan_cp_name(s->cp));
    if (s->cp == PLAN_CP_RING && mm->kind != MODEL_LLM)
        return util_fail(err, UTIL_EINVAL, "%s: cp=ring: ring attention runs in the language model; an encoder's sp "
                         "is Ulysses over its rows", mm->name);
    /* the LLM's context parallelism falls back to ring attention (plan_cp_of) */
    if (plan_cp_of(mm, s) != PLAN_CP_RING && (!divides(s->tp * s->sp, mm->heads) || !divides(s->tp * s->sp, mm->kv_heads)))
        return util_fail(err, UTIL_EINVAL, "%s: tp*sp = %d must divide heads %d and kv_heads %d", mm->name,
                         s->tp * s->sp, mm->heads, mm->kv_heads);
    /* A vocab that tp does not divide is padded, as Megatron-LM's --make-vocab-size-divisible-by does. */
    /* ffn need not divide by tp: uneven column shards (Qwen2.5-VL's ViT ffn 3420 under TP8). */
    /* ZeRO-3 beside pipeline stages: each stage's units are gathered for
     * every micro-batch's forward and backward and freed after it, as without
     * stages (plan_dp_rules_of), so the micro-batches in flight hold no
     * gathered weights; DeepSpeed 2021's ZeRO-3 is refused with its options
     * (plan_zero3_pipeline_check). */
    /* A tied embedding's first- and last-stage copies are synced as whole
     * gradients (Megatron-LM's embedding group), which ZeRO-2 does not keep. */
    plan_dp_rules dr = plan_dp_rules_of(mm, s);
    if (dr.step_embed_sync && dr.shard_grads)
        return util_fail(err, UTIL_EINVAL, "%s: zero %d with pp %d needs untied embeddings (the tied embedding's two "
                         "stage copies sync whole gradients; use zero <= 1)", mm->name, s->zero, s->pp);
    if (s->recompute_layers < 0 || (s->recompute_layers > 0 && s->recompute != PLAN_RECOMP_FULL))
        return util_fail(err, UTIL_EINVAL, "%s: rc_layers %d (blocks of each stage recomputed) applies to rc=full, not %s",
                         mm->name, s->recompute_layers, plan_recompute_name(s->recompute));
    int rc = plan_stage_split_check(mm, s, err);
    if (rc) return rc;
    /* dhp's executor splits an encoder's rows evenly over its sp ranks and
     * hands the LLM equal rows per rank: a class row per image breaks both */
    if (plan_module_clip(mm) && s->sp > 1)
        return util_fail(err, UTIL_EINVAL, "%s: sp %d: a tower with a class row per image runs without sequence "
                         "parallelism (the class row is dropped before the projector, so ranks would hand on unequal rows)",
                         mm->name, s->sp);
    plan_seq q;
    plan_module_seq(m, mi, w, &q);
    if (s->sp > 1 && fmod(q.seq, s->sp) != 0)
        return util_fail(err, UTIL_EINVAL, "%s: sequence %.0f is not divisible by sp %d", mm->name, q.seq, s->sp);
    if ((rc = plan_cp_check(mm, s, q.seq, err))) return rc;
    if (mm->kind != MODEL_LLM && s->sp > 1 && mm->merge > 1 && fmod(q.seq / s->sp, mm->merge * mm->merge) != 0)
        return util_fail(err, UTIL_EINVAL, "%s: sp %d splits merge groups", mm->name, s->sp);
    /* The audio encoder pools each rank's rows on their own (executor/audio.c). */
    if (mm->kind == MODEL_AUDIO && mm->pool > 1 && fmod(q.seq / s->sp, mm->pool) != 0)
        return util_fail(err, UTIL_EINVAL, "%s: sp %d splits the %.0f frames into parts that are not whole pool groups of %d",
                         mm->name, s->sp, q.seq, mm->pool);
    /* Megatron's sequence parallelism splits the LLM blocks' norm and residual
     * rows over the tp group (Korthikanti et al., arXiv 2205.05198, sec. 4.2.2),
     * which needs whole rows per rank. */
    if (s->seq_parallel && mm->kind != MODEL_LLM)
        return util_fail(err, UTIL_EINVAL, "%s: Megatron sequence parallelism (seqpar) applies to the LLM's tensor-parallel blocks", mm->name);
    if (s->seq_parallel && s->tp > 1 && fmod(q.seq / s->sp, s->tp) != 0)
        return util_fail(err, UTIL_EINVAL, "%s: sequence parallelism needs each sp rank's %.0f tokens divisible by tp %d", mm->name, q.seq / s->sp, s->tp);
    int64_t g;
    if (!plan_module_ranks(s, &g) || g > cost_pool_gpus(pool))
        return util_fail(err, UTIL_EINVAL, "%s: dp*tp*sp*pp = %d*%d*%d*%d GPUs exceed pool '%s' (%d)", mm->name,
                         s->dp, s->tp, s->sp, s->pp, pool->name, cost_pool_gpus(pool));
    return UTIL_OK;
}
