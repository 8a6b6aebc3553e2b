/* Cost model: seconds for one module group under one strategy, priced with
 * costdb. Compute is summed GEMM by GEMM (cost_gemm_time with the local
 * shapes), attention through cost_attention_*_time on its scores, element-wise
 * work kernel by kernel through cost_elementwise_time; communication through
 * cost_collective_time with each group's placement in the node. */
#include "planner/planner.h"

#include <math.h>
#include <string.h>

typedef struct {
    const cost_gpu *g;
    double A;                    /* bytes per activation element */
    double fwd, bwd;             /* seconds */
    bool need_weight_grad;       /* false when frozen */
    bool need_input_grad;        /* false for a frozen first module */
} pricer;

static bool runs_backward(const pricer *p) { return p->need_input_grad || p->need_weight_grad; }

/* Y[m,n] = X[m,k] W[k,n]; backward dX = dY W^T (m,k,n) and dW = X^T dY (k,n,m). */
static void price_linear(pricer *p, double m, double n, double k)
{
    if (m <= 0 || n <= 0 || k <= 0) return;
    p->fwd += cost_gemm_time(p->g, m, n, k);
    if (p->need_input_grad) p->bwd += cost_gemm_time(p->g, m, k, n);
    if (p->need_weight_grad) p->bwd += cost_gemm_time(p->g, k, n, m);
}

/* softmax(Q K^T) V over `queries` queries, each attending to `span` keys:
 * queries * heads rows, queries * span * heads scores (cost_attention_*_time). */
static void price_attention(pricer *p, double queries, double span, double heads, double head_dim)
{
    double rows = queries * heads, scores = rows * span;
    p->fwd += cost_attention_forward_time(p->g, rows, scores, head_dim);
    if (runs_backward(p)) p->bwd += cost_attention_backward_time(p->g, rows, scores, head_dim);
}

/* One call of element-wise kernel k over n elements, in the forward pass. */
static void ew_fwd(pricer *p, cost_ew k, double n)
{
    if (n > 0) p->fwd += cost_elementwise_time(p->g, k, n, p->A);
}

/* The same in the backward pass, which runs when the module passes or keeps gradients. */
static void ew_bwd(pricer *p, cost_ew k, double n)
{
    if (n > 0 && runs_backward(p)) p->bwd += cost_elementwise_time(p->g, k, n, p->A);
}

/* A bias gradient (db = column sums of dY), only where the weights train. */
static void ew_bias_grad(pricer *p, bool has_bias, double n)
{
    if (has_bias && p->need_weight_grad) ew_bwd(p, COST_EW_BIAS_GRAD, n);
}

/* The element-wise kernels of one pre-norm block on t rows, call by call in
 * the order of executor/model.c (block_forward, block_backward): norms,
 * biases, RoPE on q and k (none in cross-attention blocks), the residual
 * adds, the MLP activation; backward, the zeroed gradient buffers the
 * backward accumulates into, the kernels' backward and the bias gradients.
 * qd, kd, f: this rank's q, k (= v) and MLP widths. LayerNorm models are
 * priced as RMSNorm. */
static void price_block_elementwise(pricer *p, const model_module *mm, double t, double qd, double kd, double f,
                                    bool rope)
{
    double h = mm->hidden;
    bool swiglu = mm->ffn_kind == MODEL_FFN_SWIGLU;
    double mlp_in = swiglu ? 2 : 1;                      /* gate and up, or the one up projection */
    ew_fwd(p, COST_EW_RMSNORM, t * h);
    if (mm->qkv_bias) { ew_fwd(p, COST_EW_BIAS, t * qd); ew_fwd(p, COST_EW_BIAS, t * kd); ew_fwd(p, COST_EW_BIAS, t * kd); }
    if (rope) { ew_fwd(p, COST_EW_ROPE, t * qd); ew_fwd(p, COST_EW_ROPE, t * kd); }
    if (mm->out_bias) ew_fwd(p, COST_EW_BIAS, t * h);
    ew_fwd(p, COST_EW_ADD, t * h);
    ew_fwd(p, COST_EW_RMSNORM, t * h);
    if (mm->mlp_bias) for (int i = 0; i < mlp_in; i++) ew_fwd(p, COST_EW_BIAS, t * f);
    ew_fwd(p, swiglu ? COST_EW_SWIGLU : COST_EW_GELU, t * f);
    if (mm->mlp_bias) ew_fwd(p, COST_EW_BIAS, t * h);
    ew_fwd(p, COST_EW_ADD, t * h);

    ew_bwd(p, COST_EW_ZERO, t * f);
    ew_bias_grad(p, mm->mlp_bias, t * h);
    for (int i = 0; i < mlp_in; i++) ew_bwd(p, COST_EW_ZERO, t * f);
    ew_bwd(p, swiglu ? COST_EW_SWIGLU_BWD : COST_EW_GELU_BWD, t * f);
    ew_bwd(p, COST_EW_ZERO, t * h);
    for (int i = 0; i < mlp_in; i++) ew_bias_grad(p, mm->mlp_bias, t * f);
    ew_bwd(p, COST_EW_RMSNORM_BWD, t * h);
    ew_bwd(p, COST_EW_ZERO, t * qd);
    ew_bias_grad(p, mm->out_bias, t * h);
    ew_bwd(p, COST_EW_ZERO, t * qd); ew_bwd(p, COST_EW_ZERO, t * kd); ew_bwd(p, COST_EW_ZERO, t * kd);
    if (rope) { ew_bwd(p, COST_EW_ROPE_BWD, t * qd); ew_bwd(p, COST_EW_ROPE_BWD, t * kd); }
    ew_bwd(p, COST_EW_ZERO, t * h);
    if (mm->qkv_bias) { ew_bias_grad(p, true, t * qd); ew_bias_grad(p, true, t * kd); ew_bias_grad(p, true, t * kd); }
    ew_bwd(p, COST_EW_RMSNORM_BWD, t * h);
}

/* One transformer block on t local tokens (after the Ulysses split, per dp rank). */
static void price_block(pricer *p, const model_module *mm, const plan_module *s, double t,
                        double span, bool cross, double cross_tokens)
{
    double h = mm->hidden, d = mm->head_dim, H = mm->heads, KV = mm->kv_heads, f = mm->ffn, tp = s->tp;
    if (cross) {
        price_linear(p, t, H * d / tp, h);
        price_linear(p, cross_tokens, 2 * KV * d / tp, h);
        price_attention(p, t, cross_tokens, H / tp, d);
    } else {
        price_linear(p, t, (H + 2 * KV) * d / tp, h);
        price_attention(p, t, span, H / tp, d);
    }
    price_linear(p, t, h, H * d / tp);
    if (mm->ffn_kind == MODEL_FFN_SWIGLU) price_linear(p, t, 2 * f / tp, h);
    else price_linear(p, t, f / tp, h);
    price_linear(p, t, h, f / tp);
    price_block_elementwise(p, mm, t, H * d / tp, KV * d / tp, f / tp, !cross);
}

static void price_blocks(pricer *p, const model_module *mm, const plan_module *s, double t,
                         double span, bool cross, double cross_tokens, int count)
{
    if (count == 0) return;
    pricer one = *p;
    one.fwd = one.bwd = 0;
    price_block(&one, mm, s, t, span, cross, cross_tokens);
    p->fwd += count * one.fwd;
    p->bwd += count * one.bwd;
}

/* The LLM's stem and head (executor/model.c, llm_forward / llm_backward):
 * embedding rows in, then over the `rows` predicting rows the final norm,
 * the vocabulary shard's head GEMM and the cross-entropy, whose gradient
 * the forward computes. */
static void price_llm_ends(pricer *p, const model_module *mm, const plan_module *s, double t, double rows)
{
    double h = mm->hidden, shard = ceil((double)mm->vocab / s->tp);
    ew_fwd(p, COST_EW_COPY, t * h);
    ew_fwd(p, COST_EW_COPY, rows * h);
    ew_fwd(p, COST_EW_RMSNORM, rows * h);
    price_linear(p, rows, shard, h);
    ew_fwd(p, COST_EW_CE, rows * shard);
    ew_bwd(p, COST_EW_ZERO, rows * h);
    ew_bwd(p, COST_EW_ZERO, rows * h);
    ew_bwd(p, COST_EW_ZERO, t * h);
    ew_bwd(p, COST_EW_RMSNORM_BWD, rows * h);
    ew_bwd(p, COST_EW_ADD, rows * h);
    if (p->need_weight_grad) ew_bwd(p, COST_EW_ADD, t * h);   /* embedding gradient rows */
}

/* The vision / audio stem and merger (executor/model.c, vision_forward /
 * vision_backward): patch embedding, then over the merged rows the norm, the
 * two-layer GELU projector (or one linear). */
static void price_encoder_ends(pricer *p, const model_module *mm, const plan_module *s, double t)
{
    double h = mm->hidden, pix = (double)mm->in_channels * mm->patch * mm->patch * mm->temporal_patch;
    double merged = t / ((double)mm->merge * mm->merge * (mm->pool > 0 ? mm->pool : 1));
    pricer stem = *p;                 /* the pixels need no gradient */
    stem.need_input_grad = false;
    price_linear(&stem, t, h / s->tp, pix);
    p->fwd = stem.fwd;
    p->bwd = stem.bwd;
    ew_fwd(p, COST_EW_BIAS, t * h / s->tp);
    ew_bias_grad(p, true, t * h / s->tp);
    ew_fwd(p, COST_EW_RMSNORM, t * h);
    ew_bwd(p, COST_EW_ZERO, t * h);
    ew_bwd(p, COST_EW_ZERO, t * h);
    ew_bwd(p, COST_EW_RMSNORM_BWD, t * h);
    if (mm->proj_hidden > 0) {
        double ph = mm->proj_hidden / (double)s->tp;
        price_linear(p, merged, ph, mm->proj_in);
        price_linear(p, merged, mm->out_hidden, ph);
        ew_fwd(p, COST_EW_BIAS, merged * ph);
        ew_fwd(p, COST_EW_GELU, merged * ph);
        ew_fwd(p, COST_EW_BIAS, merged * mm->out_hidden);
        ew_bwd(p, COST_EW_ZERO, merged * ph);
        ew_bwd(p, COST_EW_ZERO, merged * ph);
        ew_bwd(p, COST_EW_GELU_BWD, merged * ph);
        ew_bias_grad(p, true, merged * ph);
        ew_bias_grad(p, true, merged * mm->out_hidden);
    } else {
        price_linear(p, merged, mm->out_hidden / (double)s->tp, mm->proj_in);
        ew_fwd(p, COST_EW_BIAS, merged * mm->out_hidden / s->tp);
        ew_bias_grad(p, true, merged * mm->out_hidden / s->tp);
    }
}

static double allreduce_tp(const cost_pool *pool, const plan_module *s, double bytes)
{
    return cost_collective_time(pool, COST_ALLREDUCE, bytes, s->tp, s->tp);
}

/* Ranks of a group per node, for a group of n ranks at stride `stride` in the
 * module's rank order (tp fastest) on nodes of gpn GPUs. */
static int ranks_per_node(int n, int stride, int gpn)
{
    int per = gpn / stride;
    if (per < 1) per = 1;
    return per > n ? n : per;
}

/* Ulysses keeps window layers local when every rank holds whole windows. */
static bool window_layers_local(const model_module *mm, const plan_module *s, const plan_seq *q)
{
    if (mm->window <= 0 || s->sp == 1) return true;
    double per_rank = q->seq / s->sp;
    return fmod(per_rank, mm->window) == 0;
}

/* FLOPs of one sample through the module's forward at tp = sp = 1. */
static double forward_flops_per_sample(const model_module *mm, const plan_seq *q)
{
    double t = q->tokens_per_sample;
    double flops = 2.0 * t * (double)model_module_params(mm);
    if (mm->kind == MODEL_LLM) flops -= 2.0 * t * mm->vocab * (double)mm->hidden; /* embedding is a lookup */
    if (mm->tied_embeddings && mm->kind == MODEL_LLM) flops += 2.0 * t * mm->vocab * (double)mm->hidden;
    for (int l = 0; l < mm->layers; l++) {
        double span = model_layer_is_full_attention(mm, l) ? q->attn_span_full : q->attn_span_window;
        if (model_layer_is_cross(mm, l)) span = q->cross_span;
        flops += 4.0 * t * span * mm->heads * mm->head_dim;
    }
    return flops;
}

/* Weights and gradients travel in the dtypes the memory model holds them
 * in (plan_module_state_bytes). Under bf16-mixed, gradients go in fp32:
 * Megatron-LM forces accumulate_allreduce_grads_in_fp32 for bfloat16
 * ("bfloat16 requires gradient accumulation and all-reduce to be done in
 * fp32", megatron/training/arguments.py) and its distributed optimizer
 * all-gathers the bf16 weights. Under autocast the weights and their
 * gradients are fp32 (PyTorch DDP / DeepSpeed reduce what they hold). */

/* Ulysses re-shards around each all-to-all by copying (executor/model.c
 * sp_heads_to_rows, sp_rows_to_heads): forward q, k, v packed into the send
 * buffer and the attention output unpacked from the receive buffer, backward
 * the output's gradient packed and dq, dk, dv unpacked; t local rows. */
static void price_ulysses_copies(pricer *p, const model_module *mm, const plan_module *s, double t, int layers)
{
    double q_elems = t * mm->heads * mm->head_dim / s->tp, kv_elems = t * mm->kv_heads * mm->head_dim / s->tp;
    for (int l = 0; l < layers; l++) {
        ew_fwd(p, COST_EW_COPY, q_elems);    /* q */
        ew_fwd(p, COST_EW_COPY, kv_elems);   /* k */
        ew_fwd(p, COST_EW_COPY, kv_elems);   /* v */
        ew_fwd(p, COST_EW_COPY, q_elems);    /* attention output */
        ew_bwd(p, COST_EW_COPY, q_elems);    /* its gradient */
        ew_bwd(p, COST_EW_COPY, q_elems);    /* dq */
        ew_bwd(p, COST_EW_COPY, kv_elems);   /* dk */
        ew_bwd(p, COST_EW_COPY, kv_elems);   /* dv */
    }
}

/* Compute and in-op communication of one micro-batch of `samples` samples
 * (per dp rank): the per-micro-batch terms of plan_time. */
void plan_micro_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                     const cost_cluster *c, const plan_options *o, double samples, plan_time *out)
{
    const model_module *mm = &m->mod[mi];
    const cost_pool *pool = &c->pool[s->pool];
    const cost_gpu *g = &pool->gpu;
    int gpn = pool->gpus_per_node;
    plan_seq q;
    plan_module_seq(m, mi, w, &q);
    memset(out, 0, sizeof *out);

    double A = plan_precision_bytes(o->precision).act;   /* activation / communication element */
    pricer p = { .g = g, .A = A, .need_weight_grad = !mm->frozen, .need_input_grad = !(mm->frozen && mm->kind != MODEL_LLM) };
    double t = samples * q.tokens_per_sample / s->sp;
    double cross_tokens = samples * q.cross_span / s->sp;
    /* Blocks differ only by attention kind: price one of each kind, times its count. */
    int n_full = 0, n_window = 0, n_cross = 0;
    for (int l = 0; l < mm->layers; l++) {
        if (model_layer_is_cross(mm, l)) n_cross++;
        else if (model_layer_is_full_attention(mm, l)) n_full++;
        else n_window++;
    }
    price_blocks(&p, mm, s, t, q.attn_span_full, false, cross_tokens, n_full);
    price_blocks(&p, mm, s, t, q.attn_span_window, false, cross_tokens, n_window);
    price_blocks(&p, mm, s, t, 0, true, cross_tokens, n_cross);
    int n_a2a_layers = n_full + (window_layers_local(mm, s, &q) ? 0 : n_window);
    if (s->sp > 1) price_ulysses_copies(&p, mm, s, t, n_a2a_layers);
    double h = mm->hidden;
    if (mm->kind == MODEL_LLM) price_llm_ends(&p, mm, s, t, plan_head_rows(w, o->precision, samples, t));
    else price_encoder_ends(&p, mm, s, t);
    out->fwd_s = p.fwd;
    out->bwd_s = p.bwd;
    if (s->recompute == PLAN_RECOMP_FULL) out->recompute_s = p.fwd;
    else if (s->recompute == PLAN_RECOMP_SELECTIVE)
        out->recompute_s = cost_memory_time(g, t * A * 3.0 * mm->ffn / s->tp * mm->layers);

    /* Tensor parallel: Megatron's f/g all-reduces (or the equivalent
     * all-gather + reduce-scatter pair with sequence parallel). */
    if (s->tp > 1) {
        /* per block: 2 all-reduces forward (attention, MLP), 2 backward */
        out->tp_comm_s = mm->layers * 4.0 * allreduce_tp(pool, s, A * t * mm->hidden);
        if (mm->kind == MODEL_LLM) out->tp_comm_s += 2 * allreduce_tp(pool, s, A * t * h);
        /* the LLM's ends: the embedding's and the loss statistics' all-reduces
         * forward, the head gradient's backward (executor/model.c) */
        out->fwd_syncs += 2 * mm->layers + (mm->kind == MODEL_LLM ? 2 : 0);
        out->bwd_syncs += 2 * mm->layers + (mm->kind == MODEL_LLM ? 1 : 0);
    }
    /* Ulysses: q, k, v and the output re-sharded forward, their gradients backward. */
    if (s->sp > 1) {
        double dims = (2.0 * mm->heads + 2.0 * mm->kv_heads) * mm->head_dim / s->tp;
        double bytes = A * t * dims;
        int per = ranks_per_node(s->sp, s->tp, gpn);
        out->sp_comm_s = 2.0 * n_a2a_layers * cost_collective_time(pool, COST_ALLTOALL, bytes, s->sp, per);
        /* one all-to-all each for q, k, v and the output, and for their gradients */
        out->fwd_syncs += 4 * n_a2a_layers;
        out->bwd_syncs += 4 * n_a2a_layers;
    }
    if (s->recompute == PLAN_RECOMP_FULL) out->bwd_syncs += out->fwd_syncs;
    /* Pipeline stage hand-offs, forward activation and backward gradient. */
    if (s->pp > 1) {
        bool same_node = (double)s->tp * s->sp * s->dp * s->pp <= gpn;
        out->pp_p2p_s = 2.0 * (s->pp - 1) * cost_p2p_time(c, s->pool, s->pool, same_node, A * t * h);
    }
    double lp = plan_local_params(mm, s);
    int shard = s->dp * s->sp;
    int shard_per_node = ranks_per_node(shard, s->tp, gpn);
    double compute_mb = out->fwd_s + out->bwd_s + out->recompute_s;
    if (shard > 1 && s->zero >= 3) {
        /* Per micro-batch: gather parameters for forward (and, when trained,
         * again for backward and reduce-scatter gradients); prefetch hides part of it. */
        plan_state_bytes b = plan_module_state_bytes(mm, o->precision);
        double ag = cost_collective_time(pool, COST_ALLGATHER, b.param * lp, shard, shard_per_node);
        if (mm->frozen) out->zero_comm_s = ag;
        else {
            double rs = cost_collective_time(pool, COST_REDUCESCATTER, b.grad * lp, shard, shard_per_node);
            out->zero_comm_s = fmax(0.0, 2 * ag + rs - o->overlap * compute_mb);
        }
    }
    out->micro_s = compute_mb + out->tp_comm_s + out->sp_comm_s + out->zero_comm_s + out->pp_p2p_s;
    /* The forward pass carries half of the TP / SP / PP exchanges (the cost
     * model counts as many forward as backward) and one of ZeRO-3's three gathers. */
    out->fwd_comm_s = 0.5 * (out->tp_comm_s + out->sp_comm_s + out->pp_p2p_s)
                    + (mm->frozen ? out->zero_comm_s : out->zero_comm_s / 3.0);
}

/* Once per step over the module's dp*sp replicas of each weight shard:
 * gradient all-reduce, or its reduce-scatter (gradients) + all-gather
 * (updated weights) halves (ZeRO). */
static void price_step_comm(const model_module *mm, const plan_module *s, const cost_pool *pool,
                            plan_precision precision, plan_time *out)
{
    double lp = plan_local_params(mm, s);
    int shard = s->dp * s->sp;
    int shard_per_node = ranks_per_node(shard, s->tp, pool->gpus_per_node);
    if (shard <= 1 || mm->frozen) return;
    plan_state_bytes b = plan_module_state_bytes(mm, precision);
    out->grad_rs_s = cost_collective_time(pool, COST_REDUCESCATTER, b.grad * lp, shard, shard_per_node);
    out->param_ag_s = cost_collective_time(pool, COST_ALLGATHER, b.param * lp, shard, shard_per_node);
    /* ZeRO-3 reduces gradients per micro-batch (zero_comm_s) instead. */
    if (s->zero < 3) out->dp_comm_s = cost_collective_time(pool, COST_ALLREDUCE, b.grad * lp, shard, shard_per_node);
}

void plan_module_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                      const cost_cluster *c, const plan_options *o, plan_time *out)
{
    const model_module *mm = &m->mod[mi];
    const cost_pool *pool = &c->pool[s->pool];
    plan_micro_time(m, mi, s, w, c, o, s->micro_batch, out);
    price_step_comm(mm, s, pool, o->precision, out);
    /* Bucketed gradient reduction overlaps the last micro-batch's backward. */
    out->dp_exposed_s = fmax(0.0, out->dp_comm_s - o->overlap * out->bwd_s / s->pp);
    if (!mm->frozen) {
        double bytes_per_param = plan_precision_bytes(o->precision).step_traffic;
        double opt_shard = s->zero >= 1 ? (double)s->dp * s->sp : 1;
        /* AdamW is one fused streaming pass over its state: STREAM-class
         * bandwidth (hbm_bw), not the element-wise mix that mem_eff describes. */
        out->optim_s = plan_local_params(mm, s) / opt_shard * bytes_per_param / pool->gpu.hbm_bw + pool->gpu.kernel_launch_s;
        /* The clip's norm: a sum of squares over the gradients the rank counts
         * (executor/run.c local_grad_sumsq), its shard with ZeRO, else all of them. */
        out->norm_s = cost_elementwise_time(&pool->gpu, COST_EW_SUMSQ, plan_local_params(mm, s) / opt_shard,
                                            plan_module_state_bytes(mm, o->precision).grad);
    }
    plan_seq q;
    plan_module_seq(m, mi, w, &q);
    double passes = mm->frozen ? (mm->kind == MODEL_LLM ? 2.0 : 1.0) : 3.0;
    out->model_flops = passes * forward_flops_per_sample(mm, &q) * w->global_batch;
}

/* Durations of the schedule's compute ops from plan_micro_time: an encoder
 * forward is its compute plus the forward half of its in-op communication,
 * its backward (with recompute) the rest; an LLM forward+backward is micro_s. */
double plan_time_forward_s(const plan_time *t) { return t->fwd_s + t->fwd_comm_s; }
double plan_time_backward_s(const plan_time *t) { return t->micro_s - plan_time_forward_s(t); }

double plan_time_tail_s(const plan_time *t) { return t->dp_exposed_s + t->norm_s + t->optim_s; }

double plan_chunk_time(const plan_time *t, const plan_module *s, int chunk_samples)
{
    double per_rank = ceil((double)chunk_samples / s->dp);
    double steps = ceil(per_rank / s->micro_batch);
    if (s->pp == 1) return steps * t->micro_s;
    double stage = t->micro_s / s->pp;
    return (steps + s->pp - 1) * stage;
}

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
    if (!divides(s->tp * s->sp, mm->heads) || !divides(s->tp * s->sp, mm->kv_heads))
        return util_fail(err, UTIL_EINVAL, "%s: tp*sp = %d must divide heads %d and kv_heads %d", mm->name,
                         s->tp * s->sp, mm->heads, mm->kv_heads);
    /* A vocab that tp does not divide is padded, as Megatron-LM's --make-vocab-size-divisible-by does. */
    /* ffn need not divide by tp: uneven column shards (Qwen2.5-VL's ViT ffn 3420 under TP8). */
    /* DeepSpeed refuses ZeRO-2/3 with pipeline parallelism (gradient and weight
     * partitions conflict with per-micro-batch stage hand-offs); ZeRO-1 works. */
    if (s->pp > 1 && s->zero >= 2)
        return util_fail(err, UTIL_EINVAL, "%s: zero %d does not combine with pp %d (use zero <= 1)", mm->name,
                         s->zero, s->pp);
    if (mm->layers % s->pp != 0)
        return util_fail(err, UTIL_EINVAL, "%s: pp %d does not divide %d layers", mm->name, s->pp, mm->layers);
    plan_seq q;
    plan_module_seq(m, mi, w, &q);
    if (s->sp > 1 && fmod(q.seq, s->sp) != 0)
        return util_fail(err, UTIL_EINVAL, "%s: sequence %.0f is not divisible by sp %d", mm->name, q.seq, s->sp);
    if (mm->kind != MODEL_LLM && s->sp > 1 && mm->merge > 1 && fmod(q.seq / s->sp, mm->merge * mm->merge) != 0)
        return util_fail(err, UTIL_EINVAL, "%s: sp %d splits merge groups", mm->name, s->sp);
    int64_t g;
    if (!plan_module_ranks(s, &g) || g > cost_pool_gpus(pool))
        return util_fail(err, UTIL_EINVAL, "%s: dp*tp*sp*pp = %d*%d*%d*%d GPUs exceed pool '%s' (%d)", mm->name,
                         s->dp, s->tp, s->sp, s->pp, pool->name, cost_pool_gpus(pool));
    return UTIL_OK;
}
