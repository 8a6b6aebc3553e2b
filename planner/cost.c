/* Cost model: seconds for one module group under one strategy, priced with
 * costdb. Compute is summed GEMM by GEMM (cost_gemm_time with the local
 * shapes), attention through cost_attention_*_time on its scores, element-wise
 * work kernel by kernel through cost_elementwise_time; communication through
 * cost_collective_time with each group's placement in the node. */
#include "planner/planner_int.h"

#include <math.h>
#include <string.h>

typedef struct plan_pricer {
    const cost_gpu *g;
    double A;                    /* bytes per activation element */
    double fwd, bwd;             /* seconds */
    double gemm_s, attn_s;       /* of fwd + bwd, the GEMMs' and the attention cores' (plan_micro_parts) */
    bool need_weight_grad;       /* false when frozen */
    bool need_input_grad;        /* false for a frozen first module */
    bool megatron;               /* PLAN_TARGET_MEGATRON: Megatron-LM's kernels and recomputation */
    cost_gemm_math math;         /* the linears' GEMMs (plan_gemm_math) */
    cost_gemm_math block_math;   /* the transformer blocks' linears' (plan_block_gemm_math: FP8 under --fp8) */
    const plan_fp8_props *fp8;   /* the blocks' FP8 recipe (plan_fp8_props_of) */
    cost_attn_kernel attn;       /* the attention's kernel (plan_attention_kernel) */
    bool loss_fp32;              /* the Megatron target's loss on fp32 logits (plan_loss_props.in_fp32) */
} pricer;

void plan_comm_add(plan_comm *c, bool backward, double seconds, int count)
{
    if (count <= 0) return;
    if (backward) { c->bwd_s += count * seconds; c->bwd_syncs += count; }
    else { c->fwd_s += count * seconds; c->fwd_syncs += count; }
}

static bool runs_backward(const pricer *p) { return p->need_input_grad || p->need_weight_grad; }

/* A pricer for a part priced on its own: p's settings, nothing summed yet. */
static pricer fresh(const pricer *p)
{
    pricer q = *p;
    q.fwd = q.bwd = q.gemm_s = q.attn_s = 0;
    return q;
}

/* `times` copies of part q into p (kinds and all). */
static void merge(pricer *p, const pricer *q, double times)
{
    p->fwd += times * q->fwd;
    p->bwd += times * q->bwd;
    p->gemm_s += times * q->gemm_s;
    p->attn_s += times * q->attn_s;
}

/* Y[m,n] = X[m,k] W[k,n]; backward dX = dY W^T (m,k,n) and dW = X^T dY (k,n,m). */
static void price_linear(pricer *p, double m, double n, double k)
{
    if (m <= 0 || n <= 0 || k <= 0) return;
    double f = cost_gemm_time_in(p->g, p->math, m, n, k), b = 0;
    if (p->need_input_grad) b += cost_gemm_time_in(p->g, p->math, m, k, n);
    if (p->need_weight_grad) b += cost_gemm_time_in(p->g, p->math, k, n, m);
    p->fwd += f;
    p->bwd += b;
    p->gemm_s += f + b;
}

/* softmax(Q K^T) V over `queries` queries, each attending to `span` keys:
 * queries * heads rows, queries * span * heads scores (cost_attention_*_time). */
static void price_attention(pricer *p, double queries, double span, double heads, double head_dim)
{
    double rows = queries * heads, scores = rows * span;
    p->fwd += cost_attention_forward_time_in(p->g, p->attn, rows, scores, head_dim);
    if (runs_backward(p)) p->bwd += cost_attention_backward_time_in(p->g, p->attn, rows, scores, head_dim);
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
 * the order of executor/block.c (ex_block_forward, ex_block_backward): norms,
 * biases, RoPE on q and k (none in cross-attention blocks), the residual
 * adds, the MLP activation; backward, the zeroed gradient buffers the
 * backward accumulates into, the kernels' backward and the bias gradients.
 * qd, kd, f: this rank's q, k (= v) and MLP widths; tn the rows the norms,
 * the row-parallel biases and the residual hold (t / tp under sequence
 * parallelism, whose norms' partial weight gradients are summed and added
 * once per block). A LayerNorm model's norms are the LayerNorm kernel
 * (mean and variance, the bias), priced at its own rate. */
static void price_block_elementwise(pricer *p, const model_module *mm, double t, double tn, double qd, double kd,
                                    double f, bool rope, bool seqpar)
{
    double h = mm->hidden;
    bool swiglu = mm->ffn_kind == MODEL_FFN_SWIGLU, ln = mm->norm == MODEL_NORM_LAYERNORM;
    cost_ew norm = ln ? COST_EW_LAYERNORM : COST_EW_RMSNORM, norm_bwd = ln ? COST_EW_LAYERNORM_BWD : COST_EW_RMSNORM_BWD;
    double mlp_in = swiglu ? 2 : 1;                      /* gate and up, or the one up projection */
    ew_fwd(p, norm, tn * h);
    if (mm->qkv_bias) { ew_fwd(p, COST_EW_BIAS, t * qd); ew_fwd(p, COST_EW_BIAS, t * kd); }
    if (mm->k_bias) ew_fwd(p, COST_EW_BIAS, t * kd);
    if (rope) { ew_fwd(p, COST_EW_ROPE, t * qd); ew_fwd(p, COST_EW_ROPE, t * kd); }
    if (mm->out_bias) ew_fwd(p, COST_EW_BIAS, tn * h);
    ew_fwd(p, COST_EW_ADD, tn * h);
    ew_fwd(p, norm, tn * h);
    if (mm->mlp_bias) for (int i = 0; i < mlp_in; i++) ew_fwd(p, COST_EW_BIAS, t * f);
    ew_fwd(p, swiglu ? COST_EW_SWIGLU : COST_EW_GELU, t * f);
    if (mm->mlp_bias) ew_fwd(p, COST_EW_BIAS, tn * h);
    ew_fwd(p, COST_EW_ADD, tn * h);

    bool partial_norms = seqpar && p->need_weight_grad;
    if (partial_norms) ew_bwd(p, COST_EW_ZERO, 2 * h);
    ew_bwd(p, COST_EW_ZERO, t * f);
    ew_bias_grad(p, mm->mlp_bias, t * h);
    for (int i = 0; i < mlp_in; i++) ew_bwd(p, COST_EW_ZERO, t * f);
    ew_bwd(p, swiglu ? COST_EW_SWIGLU_BWD : COST_EW_GELU_BWD, t * f);
    ew_bwd(p, COST_EW_ZERO, t * h);
    for (int i = 0; i < mlp_in; i++) ew_bias_grad(p, mm->mlp_bias, t * f);
    ew_bwd(p, norm_bwd, tn * h);
    ew_bwd(p, COST_EW_ZERO, t * qd);
    ew_bias_grad(p, mm->out_bias, t * h);
    ew_bwd(p, COST_EW_ZERO, t * qd); ew_bwd(p, COST_EW_ZERO, t * kd); ew_bwd(p, COST_EW_ZERO, t * kd);
    if (rope) { ew_bwd(p, COST_EW_ROPE_BWD, t * qd); ew_bwd(p, COST_EW_ROPE_BWD, t * kd); }
    ew_bwd(p, COST_EW_ZERO, t * h);
    if (mm->qkv_bias) { ew_bias_grad(p, true, t * qd); ew_bias_grad(p, true, t * kd); }
    ew_bias_grad(p, mm->k_bias, t * kd);
    ew_bwd(p, norm_bwd, tn * h);
    if (partial_norms) { ew_bwd(p, COST_EW_ADD, h); ew_bwd(p, COST_EW_ADD, h); }
}

/* `count` linears n wide on the same input: for the Megatron target one
 * fused GEMM count x n wide (Megatron-LM's fused weights, linear_qkv and
 * linear_fc1 in megatron/core/transformer), for the dhp target the
 * executor's count GEMMs (executor/block.c runs k, v and gate, up apart). */
static void price_linears(pricer *p, double m, double k, int count, double n)
{
    if (p->megatron) price_linear(p, m, count * n, k);
    else for (int i = 0; i < count; i++) price_linear(p, m, n, k);
}

/* One of the blocks' linears (count of them on the same input, price_linears)
 * and, under --fp8, its casts. */
static void price_block_linears(pricer *p, double m, double k, int count, double n, bool norm_fed)
{
    price_linears(p, m, k, count, n);
    int calls = p->megatron ? 1 : count;
    double fwd = 0, bwd = 0;
    plan_fp8_casts_s(p->fp8, p->g, p->A, m, p->megatron ? count * n : n, k, norm_fed, &fwd, &bwd);
    p->fwd += calls * fwd;
    if (runs_backward(p)) p->bwd += calls * bwd;
}

/* Attention without FlashAttention (model_module.unfused_attention), as
 * Megatron-LM ran it before 2022 (Korthikanti et al., arXiv 2205.05198,
 * sec. 4.1, and its FusedScaleMaskSoftmax): Q K^T and P V as batched GEMMs
 * over the whole `keys` x `keys` score matrix of each sequence (the causal
 * mask is applied, not skipped), the fused scale-mask-softmax reading and
 * writing every score, then dropout on the probabilities (its 1-byte mask).
 * Backward: four GEMMs (dP, dV, dQ, dK), the dropout and softmax gradients.
 * The score passes are bound by memory (cost_memory_time). */
static void price_attention_unfused(pricer *p, const model_module *mm, double queries, double keys, double heads,
                                    double head_dim)
{
    double rows = queries * heads, scores = rows * keys, A = p->A;
    double drop_fwd = mm->dropout ? 2 * A + 1 : 0, drop_bwd = mm->dropout ? 2 * A + 1 : 0;
    p->fwd += cost_gemm_time(p->g, rows, keys, head_dim) + cost_gemm_time(p->g, rows, head_dim, keys);
    p->fwd += cost_memory_time(p->g, scores * (2 * A + drop_fwd));
    if (!runs_backward(p)) return;
    p->bwd += 2 * cost_gemm_time(p->g, rows, keys, head_dim) + 2 * cost_gemm_time(p->g, rows, head_dim, keys);
    p->bwd += cost_memory_time(p->g, scores * (3 * A + drop_bwd));
}

/* Dropout on n elements of the block's hidden rows (after the attention
 * output and the MLP output, model_module.dropout): forward reads x, writes
 * y and the 1-byte mask; backward reads dy and the mask, writes dx. */
static void price_hidden_dropout(pricer *p, double n)
{
    if (!(n > 0)) return;
    p->fwd += cost_memory_time(p->g, n * (2 * p->A + 1));
    if (runs_backward(p)) p->bwd += cost_memory_time(p->g, n * (2 * p->A + 1));
}

/* A block's attention core: ring attention's blocks and merges (cost_cp.c),
 * the unfused score matrix (where Megatron-LM runs it), or flash attention. */
static void price_attention_core(pricer *core, const model_module *mm, const plan_ring_price *ring, bool unfused,
                                 double t, double span, double keys, double heads, double head_dim)
{
    if (ring) {
        core->fwd += ring->fwd_s;
        if (runs_backward(core)) core->bwd += ring->bwd_s;
    } else if (unfused) {
        price_attention_unfused(core, mm, t, keys, heads, head_dim);
    } else {
        price_attention(core, t, span, heads, head_dim);
    }
}

void plan_block_linear_shapes(const model_module *mm, const plan_module *s, double t, plan_gemm_shape out[PLAN_NLIN])
{
    double h = mm->hidden, d = mm->head_dim, H = mm->heads, KV = mm->kv_heads, f = mm->ffn, tp = s->tp;
    double mlp_in = mm->ffn_kind == MODEL_FFN_SWIGLU ? 2 : 1;   /* gate and up, or the one up projection */
    out[PLAN_LIN_QKV] = (plan_gemm_shape){ t, (H + 2 * KV) * d / tp, h };
    out[PLAN_LIN_PROJ] = (plan_gemm_shape){ t, h, H * d / tp };
    out[PLAN_LIN_FC1] = (plan_gemm_shape){ t, mlp_in * f / tp, h };
    out[PLAN_LIN_FC2] = (plan_gemm_shape){ t, h, f / tp };
}

/* Block linear i as one GEMM of its shape (plan_block_linear_shapes), a
 * norm feeding query/key/value and the MLP's input. */
static void price_shape_linear(pricer *p, const plan_gemm_shape *l, plan_block_linear i)
{
    price_block_linears(p, l[i].m, l[i].k, 1, l[i].n, i == PLAN_LIN_QKV || i == PLAN_LIN_FC1);
}

/* One transformer block on t local tokens (after the Ulysses split, per dp
 * rank); *selective gets what selective recomputation re-runs of it in
 * backward: the attention core's forward and the MLP activation. */
static void price_block(pricer *p, const model_module *mm, const plan_module *s, double t,
                        double span, double keys, bool cross, double cross_tokens, const plan_ring_price *ring,
                        double *selective)
{
    double h = mm->hidden, d = mm->head_dim, H = mm->heads, KV = mm->kv_heads, f = mm->ffn, tp = s->tp;
    double split = plan_seqpar_split(mm, s);
    bool seqpar = split > 1;
    double tn = t / split;
    double fwd0 = p->fwd;
    plan_gemm_shape lin[PLAN_NLIN];
    plan_block_linear_shapes(mm, s, t, lin);
    pricer core = fresh(p);   /* the attention core, whatever its kernels */
    if (cross) {
        price_block_linears(p, t, h, 1, H * d / tp, true);
        price_block_linears(p, cross_tokens, h, 2, KV * d / tp, false);
        price_attention(&core, t, cross_tokens, H / tp, d);
    } else if (p->megatron) {
        price_shape_linear(p, lin, PLAN_LIN_QKV);
        price_attention_core(&core, mm, ring, mm->unfused_attention, t, span, keys, H / tp, d);
    } else {                          /* the executor's q, then k and v */
        price_block_linears(p, t, h, 1, H * d / tp, true);
        price_block_linears(p, t, h, 2, KV * d / tp, true);
        price_attention_core(&core, mm, ring, false, t, span, keys, H / tp, d);
    }
    p->fwd += core.fwd;
    p->bwd += core.bwd;
    p->attn_s += core.fwd + core.bwd;
    price_shape_linear(p, lin, PLAN_LIN_PROJ);
    if (p->megatron && !cross) price_shape_linear(p, lin, PLAN_LIN_FC1);   /* gate and up in one GEMM */
    else price_block_linears(p, t, h, mm->ffn_kind == MODEL_FFN_SWIGLU ? 2 : 1, f / tp, true);   /* apart */
    price_shape_linear(p, lin, PLAN_LIN_FC2);
    price_block_elementwise(p, mm, t, tn, H * d / tp, KV * d / tp, f / tp, !cross && plan_module_rotary(mm), seqpar);
    if (mm->dropout) { price_hidden_dropout(p, tn * h); price_hidden_dropout(p, tn * h); }
    if (s->recompute == PLAN_RECOMP_OP) {
        /* torchtitan's per-op checkpointing re-runs the block's forward but
         * the attention core and the saved matmuls (plan_recompute): wq, wv,
         * and w1, w2 (SwiGLU) or fc1 (GELU), priced as the separate GEMMs
         * they are there. */
        double saved = cost_gemm_time_in(p->g, p->math, t, H * d / tp, h)
                     + (cross ? 0 : cost_gemm_time_in(p->g, p->math, t, KV * d / tp, h))
                     + cost_gemm_time_in(p->g, p->math, t, f / tp, h)
                     + (mm->ffn_kind == MODEL_FFN_SWIGLU ? cost_gemm_time_in(p->g, p->math, t, h, f / tp) : 0);
        *selective = fmax(0.0, p->fwd - fwd0 - core.fwd - saved);
        return;
    }
    /* Megatron-LM's selective recomputation re-runs the attention core only
     * (Korthikanti et al. sec. 5; Megatron-Core recompute_modules
     * ["core_attn"]); dhp's executor re-runs the MLP activation too. */
    if (p->megatron) { *selective = core.fwd; return; }
    *selective = core.fwd + cost_elementwise_time(p->g, mm->ffn_kind == MODEL_FFN_SWIGLU ? COST_EW_SWIGLU : COST_EW_GELU,
                                                  t * f / tp, p->A);
}

/* count blocks of one kind: their compute into p, the forward of the
 * recomputed of them (what full recomputation re-runs, plan_block_recompute)
 * into *recomputed_fwd, selective's re-run into *selective. */
static void price_blocks(pricer *p, const model_module *mm, const plan_module *s, double t,
                         double span, double keys, bool cross, double cross_tokens, const plan_ring_price *ring,
                         int count, int recomputed, double *recomputed_fwd, double *selective)
{
    if (count == 0) return;
    pricer one = fresh(p);
    one.math = p->block_math;
    double sel = 0;
    price_block(&one, mm, s, t, span, keys, cross, cross_tokens, ring, &sel);
    merge(p, &one, count);
    *recomputed_fwd += recomputed * one.fwd;
    *selective += count * sel;
}

/* `calls` calls of element-wise kernel k over n elements in all (n / calls
 * each), in the forward pass or the backward. */
static void ew_calls(pricer *p, bool backward, cost_ew k, double calls, double n)
{
    if (!(calls > 0) || n <= 0 || (backward && !runs_backward(p))) return;
    double s = calls * cost_elementwise_time(p->g, k, n / calls, p->A);
    if (backward) p->bwd += s;
    else p->fwd += s;
}

/* planner_int.h's steps for the cost model's parts in files of their own
 * (cost_audio.c): a GEMM whose input may need no gradient, element-wise
 * calls in a pass. */
void plan_price_gemm(pricer *p, double m, double n, double k, bool input_grad)
{
    pricer q = fresh(p);
    q.need_input_grad = p->need_input_grad && input_grad;
    price_linear(&q, m, n, k);
    merge(p, &q, 1);
}

void plan_price_ew(pricer *p, plan_pass pass, cost_ew k, double calls, double n)
{
    if (pass == PLAN_PASS_WGRAD && !p->need_weight_grad) return;
    ew_calls(p, pass != PLAN_PASS_FWD, k, calls, n);
}

/* The LLM's stem (executor/llm.c, llm_embed / llm_embed_backward): the
 * embedding rows in (under tensor parallelism every rank first looks up
 * all `text` rows in its vocabulary shard); under sequence parallelism the
 * first block's rows are sliced out of all t rows. Backward, the encoder
 * rows' gradient is copied out for the encoder and the text rows' is added
 * to the embedding. The dhp target prices the executor's calls: each
 * sample's encoder rows and text rows are placed, and their gradients taken,
 * by calls of their own (`samples` of each; the Megatron target one each). */
static void price_llm_stem(pricer *p, const model_module *mm, const plan_module *s, double t, double text,
                           double samples, int text_runs)
{
    double h = mm->hidden, calls = p->megatron ? 1 : samples, runs = p->megatron ? 1 : samples * text_runs;
    bool seqpar = plan_seqpar_split(mm, s) > 1;
    /* the vocab-parallel lookup: every text token in one call, or under
     * context parallelism each run of text positions the rank holds */
    if (s->tp > 1) ew_calls(p, false, COST_EW_COPY, s->sp > 1 ? runs : 1, text * h);
    if (!p->megatron) {
        ew_calls(p, false, COST_EW_COPY, calls, (t - text) * h);   /* encoder rows */
        ew_calls(p, false, COST_EW_COPY, runs, text * h);          /* text rows (the lookup, or its copy) */
    } else {
        ew_fwd(p, COST_EW_COPY, t * h);
    }
    if (seqpar) ew_fwd(p, COST_EW_COPY, t / s->tp * h);
    ew_calls(p, true, COST_EW_COPY, calls, (t - text) * h);
    if (p->need_weight_grad) ew_calls(p, true, COST_EW_ADD, runs, text * h);   /* embedding gradient rows */
}

/* The loss (COST_EW_CE, its gradient included). The Megatron target's on fp32 logits whatever the
 * compute dtype where its kernel takes them so (plan_loss_props.in_fp32), as Megatron-Core
 * (tensor_parallel/cross_entropy.py, calculate_logits_max: .float()) and torchtitan
 * (F.cross_entropy(pred.flatten(0, 1).float(), ...)) do: a cast in, its passes at 4 B, the logits'
 * gradient cast back (COST_EW_COPY at the read's and write's mean width); flash-attn's fused loss
 * at the logits' own width. */
static void price_loss(pricer *p, double logits)
{
    pricer q = fresh(p);
    q.A = p->loss_fp32 ? fmax(p->A, 4) : p->A;
    ew_fwd(&q, COST_EW_CE, logits);
    q.A = (q.A + p->A) / 2;
    if (q.A != p->A) { ew_fwd(&q, COST_EW_COPY, logits); ew_bwd(&q, COST_EW_COPY, logits); }
    merge(p, &q, 1);
}

static void price_llm_head(pricer *p, const model_module *mm, const plan_module *s, double t, double rows)
{
    double h = mm->hidden, shard = ceil((double)mm->vocab / s->tp);
    bool seqpar = plan_seqpar_split(mm, s) > 1;
    ew_fwd(p, COST_EW_COPY, rows * h);
    ew_fwd(p, COST_EW_RMSNORM, rows * h);
    price_linear(p, rows, shard, h);
    price_loss(p, rows * shard);
    ew_bwd(p, COST_EW_ZERO, t * h);
    ew_bwd(p, COST_EW_ZERO, rows * h);
    ew_bwd(p, COST_EW_ZERO, rows * h);
    ew_bwd(p, COST_EW_RMSNORM_BWD, rows * h);
    ew_bwd(p, COST_EW_ADD, rows * h);
    if (seqpar) ew_bwd(p, COST_EW_COPY, t / s->tp * h);
}

/* The LLM's stem and head on stage st as sp rank sp_rank holds them (its
 * text rows and predictions, plan_cp_end_rows); sp_rank < 0: the sp group's
 * pace: its slowest stem forward, stem backward and head, each of which the
 * other ranks wait for at their next exchange. *text and *head get the rows
 * of the ranks priced (for their tensor-parallel collectives). */
static void price_llm_ends(pricer *p, const model_module *mm, const plan_module *s, const plan_stage *st,
                           const plan_workload *w, plan_target target, double samples, double S, double t, int sp_rank,
                           double *text, double *head)
{
    int first = sp_rank >= 0 ? sp_rank : 0, last = sp_rank >= 0 ? sp_rank : s->sp - 1;
    double stem_f = -1, stem_b = -1;
    pricer slowest_head = fresh(p);
    slowest_head.bwd = -1;
    for (int j = first; j <= last; j++) {
        double tx, hd;
        int runs;
        plan_cp_end_rows(mm, s, w, target, samples, S, j, &tx, &hd, &runs);
        pricer a = fresh(p), b = fresh(p);
        if (st->stem) price_llm_stem(&a, mm, s, t, tx, samples, runs);
        if (st->head) price_llm_head(&b, mm, s, t, hd);
        if (a.fwd > stem_f) { stem_f = a.fwd; *text = tx; }
        if (a.bwd > stem_b) stem_b = a.bwd;
        if (b.fwd + b.bwd > slowest_head.fwd + slowest_head.bwd) { slowest_head = b; *head = hd; }
    }
    p->fwd += stem_f;          /* the stem is element-wise work only */
    p->bwd += stem_b;
    merge(p, &slowest_head, 1);
}

/* The vision / audio stem and merger (executor/vision.c,
 * ex_vision_stage_forward / ex_vision_stage_backward): patch embedding, then
 * over the merged rows the norm, the two-layer GELU projector (or one
 * linear). The Megatron target splits the patch embedding and the projector
 * over the tp group; the dhp executor keeps both whole on every tp rank
 * (plan_module_tensors), so they run whole there. */
static double encoder_ends_split(const pricer *p, const plan_module *s) { return p->megatron ? s->tp : 1; }

static void price_encoder_stem(pricer *p, const model_module *mm, const plan_module *s, double t)
{
    double h = mm->hidden / encoder_ends_split(p, s);
    double pix = (double)mm->in_channels * mm->patch * mm->patch * mm->temporal_patch;
    pricer stem = fresh(p);           /* the pixels need no gradient */
    stem.need_input_grad = false;
    price_linear(&stem, t, h, pix);
    merge(p, &stem, 1);
    if (mm->max_positions > 0) {   /* learned positions added; CLIP's pre_layrnorm (executor/clip.c) */
        ew_fwd(p, COST_EW_ADD, t * h);
        ew_bwd(p, COST_EW_ADD, t * h);
    }
    if (mm->pre_norm) {
        ew_fwd(p, COST_EW_LAYERNORM, t * h);
        ew_bwd(p, COST_EW_ZERO, t * h);
        ew_bwd(p, COST_EW_LAYERNORM_BWD, t * h);
    }
    if (mm->patch_bias) ew_fwd(p, COST_EW_BIAS, t * h);
    ew_bias_grad(p, mm->patch_bias, t * h);
}

static void price_encoder_head(pricer *p, const model_module *mm, const plan_module *s, double t, double merged)
{
    double h = mm->hidden, split = encoder_ends_split(p, s);
    if (mm->proj_norm) {
        ew_fwd(p, COST_EW_RMSNORM, t * h);
        ew_bwd(p, COST_EW_ZERO, t * h);
        ew_bwd(p, COST_EW_RMSNORM_BWD, t * h);
    } else {   /* CLIP (executor/clip.c): the kept rows gathered, their gradient scattered back */
        ew_fwd(p, COST_EW_COPY, merged * h);
        ew_bwd(p, COST_EW_COPY, merged * h);
    }
    ew_bwd(p, COST_EW_ZERO, t * h);
    if (mm->proj_hidden > 0) {
        double ph = mm->proj_hidden / split;
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
        price_linear(p, merged, mm->out_hidden / split, mm->proj_in);
        ew_fwd(p, COST_EW_BIAS, merged * mm->out_hidden / split);
        ew_bias_grad(p, true, merged * mm->out_hidden / split);
    }
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

/* Ulysses re-shards around each all-to-all through the backend's
 * transpose_blocks (executor/block.c sp_heads_to_rows, sp_rows_to_heads):
 * forward q, k, v packed for the exchange and the attention output
 * unpacked, backward the output's gradient packed and dq, dk, dv unpacked;
 * t local rows. The LLM's ranks hold a slice of each of its samples: with
 * more than one in the micro-batch, each exchange also regroups its rows
 * (one more transpose each). */
static void price_ulysses_copies(pricer *p, const model_module *mm, const plan_module *s, double t, double samples,
                                 int layers)
{
    double q_elems = t * mm->heads * mm->head_dim / s->tp, kv_elems = t * mm->kv_heads * mm->head_dim / s->tp;
    int per = mm->kind == MODEL_LLM && samples > 1 ? 2 : 1;
    for (int l = 0; l < layers; l++)
        for (int c = 0; c < per; c++) {
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

/* What full recomputation re-runs in backward: the blocks' forward, its exchanges too. */
static void recompute_comm(const plan_comm *fwd, plan_comm *c)
{
    c->bwd_s += fwd->fwd_s;
    c->bwd_syncs += fwd->fwd_syncs;
}

static void merge_fwd(const plan_comm *fwd, plan_comm *c)
{
    c->fwd_s += fwd->fwd_s;
    c->fwd_syncs += fwd->fwd_syncs;
}

/* bf16 saved activations (plan_saves_bf16, plan_module_acts): after each
 * layer's forward the executor rounds every tensor it saves in bf16 from
 * its fp32 copy into the slot, and widens them back before the layer's
 * backward, one call per tensor (executor/acts.c): 4 bytes read and 2
 * written per element, the copy kernel's two accesses at 3 bytes each. */
static void price_bf16_acts(pricer *p, const model_module *mm, const plan_module *s, const plan_stage *st, double t)
{
    int first[PLAN_BLOCK_KINDS], count[PLAN_BLOCK_KINDS];
    plan_stage_block_kinds(mm, s, st, t, first, count);
    for (int u = 0; u < PLAN_BLOCK_KINDS; u++) {
        double n[PLAN_NACT_BLOCK];
        int k = count[u] ? plan_block_bf16_elems(mm, s, st, first[u], t, n) : 0;
        for (int i = 0; i < k; i++) {
            double copy = count[u] * cost_elementwise_time(p->g, COST_EW_COPY, n[i], 3.0);
            p->fwd += copy;
            if (runs_backward(p)) p->bwd += copy;
        }
    }
}

/* A priced micro-batch's parts (plan_micro_parts): of its compute, gemm
 * seconds of GEMMs and attn of attention cores, the rest other work. */
static plan_micro_parts parts_of(const plan_time *t, double gemm, double attn)
{
    return (plan_micro_parts){ .gemm_s = gemm, .attn_s = attn, .other_s = t->fwd_s + t->bwd_s - gemm - attn,
                               .recompute_s = t->recompute_s, .tp_comm_s = t->tp_comm_s, .sp_comm_s = t->sp_comm_s,
                               .zero_comm_s = t->zero_comm_s };
}

static void add_parts(plan_micro_parts *a, const plan_micro_parts *b)
{
    a->gemm_s += b->gemm_s;
    a->attn_s += b->attn_s;
    a->other_s += b->other_s;
    a->recompute_s += b->recompute_s;
    a->tp_comm_s += b->tp_comm_s;
    a->sp_comm_s += b->sp_comm_s;
    a->zero_comm_s += b->zero_comm_s;
    a->hop_s += b->hop_s;
}

/* Compute and in-op communication of one micro-batch of `samples` samples
 * (per dp rank) through the layers of stage st: its blocks, and the stem and
 * head where it holds them. */
static void price_micro(const model_t *m, int mi, const plan_module *s, const plan_stage *st, const plan_workload *w,
                        const cost_cluster *c, const plan_options *o, double samples, int sp_rank, plan_time *out)
{
    const model_module *mm = &m->mod[mi];
    const cost_pool *pool = &c->pool[s->pool];
    const cost_gpu *g = &pool->gpu;
    plan_seq q;
    plan_module_seq(m, mi, w, &q);
    memset(out, 0, sizeof *out);

    double A = plan_module_state_bytes(mm, o).act;   /* an activation element (dhp's executor: fp32); the collectives: W below */
    pricer p = { .g = g, .A = A, .need_weight_grad = model_trains(mm), .need_input_grad = model_runs_backward(mm),
                 .megatron = o->target == PLAN_TARGET_MEGATRON, .math = plan_gemm_math(o),
                 .block_math = plan_block_gemm_math(o), .fp8 = plan_fp8_props_of(o->fp8),
                 .attn = plan_attention_kernel(o),
                 .loss_fp32 = o->target == PLAN_TARGET_MEGATRON && plan_loss_props_of(o)->in_fp32 };
    bool backward = runs_backward(&p);
    if (samples <= 0) {   /* an empty micro-batch (planner/chunks.c, plan_micro_ops): the strategy's collectives only */
        plan_comm dp = { 0 };
        plan_price_dp_micro(mm, s, st, pool, o, backward, 0, 0, &dp, &out->fwd_s, &out->bwd_s);
        out->zero_comm_s = dp.fwd_s + dp.bwd_s;
        out->fwd_comm_s = dp.fwd_s;
        out->fwd_syncs = dp.fwd_syncs;
        out->bwd_syncs = dp.bwd_syncs;
        out->micro_s = out->stage_max_s = out->fwd_s + out->bwd_s + out->zero_comm_s;
        out->pace = parts_of(out, 0, 0);
        return;
    }
    double t = samples * q.tokens_per_sample / s->sp;
    double cross_tokens = samples * q.cross_span / s->sp;
    /* Blocks differ only by attention kind: price one of each kind, times its
     * count; rc_*: of them, the blocks full recomputation re-runs. */
    int n_full = 0, n_window = 0, n_cross = 0, rc_full = 0, rc_window = 0, rc_cross = 0;
    for (int j = 0; j < st->count; j++) {
        int l = plan_stage_block(st, j);
        bool rc = plan_block_recompute(s, st, l) == PLAN_RECOMP_FULL;
        if (model_layer_is_cross(mm, l)) n_cross++, rc_cross += rc;
        else if (model_layer_is_full_attention(mm, l)) n_full++, rc_full += rc;
        else n_window++, rc_window += rc;
    }
    /* the LLM's ring attention (plan_cp_of): its full-attention blocks' cores */
    bool ring = plan_cp_of(mm, s) == PLAN_CP_RING;
    plan_ring_price rp = { 0 };
    if (ring) plan_price_ring_block(mm, s, pool, o, A, samples, q.seq, sp_rank, backward, &rp);
    double recomputed_fwd = 0, selective = 0;
    /* Keys of the whole score matrix the unfused attention materialises: the sequence (window). */
    double keys_full = q.seq, keys_window = mm->window > 0 ? fmin(mm->window, q.seq) : q.seq;
    price_blocks(&p, mm, s, t, q.attn_span_full, keys_full, false, cross_tokens, ring ? &rp : NULL, n_full, rc_full,
                 &recomputed_fwd, &selective);
    price_blocks(&p, mm, s, t, q.attn_span_window, keys_window, false, cross_tokens, NULL, n_window, rc_window,
                 &recomputed_fwd, &selective);
    price_blocks(&p, mm, s, t, 0, 0, true, cross_tokens, NULL, n_cross, rc_cross, &recomputed_fwd, &selective);
    /* the blocks that exchange by Ulysses all-to-alls (plan_cp_layer), and of them the recomputed */
    int n_a2a_layers = 0, rc_a2a_layers = 0;
    for (int j = 0; j < st->count; j++) {
        int l = plan_stage_block(st, j);
        bool a2a = !model_layer_is_cross(mm, l) && plan_cp_layer(mm, s, l, t) == PLAN_CP_ULYSSES;
        n_a2a_layers += a2a;
        rc_a2a_layers += a2a && plan_block_recompute(s, st, l) == PLAN_RECOMP_FULL;
    }
    price_ulysses_copies(&p, mm, s, t, samples, n_a2a_layers);
    pricer rc_copies = fresh(&p);   /* the packing the recomputed blocks' forward does again */
    price_ulysses_copies(&rc_copies, mm, s, t, samples, rc_a2a_layers);
    recomputed_fwd += rc_copies.fwd;
    double text_rows = 0, head_rows = 0;
    if (mm->kind == MODEL_LLM) {
        price_llm_ends(&p, mm, s, st, w, o->target, samples, q.seq, t, sp_rank, &text_rows, &head_rows);
    } else if (mm->kind == MODEL_AUDIO) {
        plan_price_audio_ends(&p, mm, st, samples, q.seq, s->sp, t);
    } else {
        if (st->stem) price_encoder_stem(&p, mm, s, t);
        if (st->head) price_encoder_head(&p, mm, s, t, plan_encoder_out_rows(mm, &q, t));
    }
    /* a pipeline stage's input rows in from the previous stage's message,
     * its output's gradient in from the next one's (executor/llm.c, vision.c, audio.c) */
    double boundary = t / plan_seqpar_split(mm, s) * mm->hidden;
    if (!st->stem) ew_fwd(&p, COST_EW_COPY, boundary);
    if (!st->head) ew_bwd(&p, COST_EW_COPY, boundary);
    if (plan_saves_bf16(o)) price_bf16_acts(&p, mm, s, st, t);
    if (backward) p.bwd += plan_grad_accum_s(mm, s, st, w, g, o);   /* the weight gradients into the step's (cost_grad_accum.c) */
    out->fwd_s = p.fwd;
    out->bwd_s = p.bwd;
    if (s->recompute == PLAN_RECOMP_FULL) out->recompute_s = recomputed_fwd;
    else if (s->recompute == PLAN_RECOMP_SELECTIVE || s->recompute == PLAN_RECOMP_OP) out->recompute_s = selective;
    if (!backward) out->recompute_s = 0;

    /* In-op communication: the blocks' forward exchanges (re-issued by full
     * recomputation), then everything else. */
    plan_comm tp_fwd = { 0 }, tp = { 0 }, sp_fwd = { 0 }, sp = { 0 }, dp = { 0 };
    double W = plan_act_wire_bytes(o);   /* what the activation collectives move (planner/precision.c) */
    plan_price_tp_blocks(mm, s, st->count, pool, o, W, t, backward, model_trains(mm), &tp, &tp_fwd);
    plan_price_tp_llm_ends(mm, s, st, pool, W, t, text_rows, head_rows, backward, &tp);
    plan_price_ulysses(mm, s, pool, W, t, n_a2a_layers, backward, &sp_fwd, &sp);
    sp_fwd.fwd_s += n_full * rp.fwd_comm_s;
    sp_fwd.fwd_syncs += n_full * rp.fwd_syncs;
    sp.bwd_s += n_full * rp.bwd_comm_s;
    sp.bwd_syncs += n_full * rp.bwd_syncs;
    if (s->recompute == PLAN_RECOMP_FULL && backward) {
        /* the forward exchanges of the blocks it re-runs (plan_block_recompute), again */
        int rc_blocks = rc_full + rc_window + rc_cross;
        plan_comm tp_rc = { 0 }, tp_rc_fwd = { 0 }, sp_rc = { 0 }, sp_rc_fwd = { 0 };
        plan_price_tp_blocks(mm, s, rc_blocks, pool, o, W, t, false, model_trains(mm), &tp_rc, &tp_rc_fwd);
        plan_price_ulysses(mm, s, pool, W, t, rc_a2a_layers, false, &sp_rc_fwd, &sp_rc);
        sp_rc_fwd.fwd_s += rc_full * rp.fwd_comm_s;
        sp_rc_fwd.fwd_syncs += rc_full * rp.fwd_syncs;
        recompute_comm(&tp_rc_fwd, &tp);
        recompute_comm(&sp_rc_fwd, &sp);
    } else if (s->recompute == PLAN_RECOMP_SELECTIVE && ring && backward) {
        recompute_comm(&sp_fwd, &sp);   /* the attention core it re-runs passes the K/V blocks again */
    }
    merge_fwd(&tp_fwd, &tp);
    merge_fwd(&sp_fwd, &sp);
    double dp_fwd_busy, dp_busy;
    plan_price_dp_micro(mm, s, st, pool, o, backward, out->fwd_s, out->bwd_s + out->recompute_s, &dp, &dp_fwd_busy,
                        &dp_busy);
    out->fwd_s += dp_fwd_busy;
    out->bwd_s += dp_busy;
    out->tp_comm_s = tp.fwd_s + tp.bwd_s;
    out->sp_comm_s = sp.fwd_s + sp.bwd_s;
    out->zero_comm_s = dp.fwd_s + dp.bwd_s;
    out->fwd_syncs = tp.fwd_syncs + sp.fwd_syncs + dp.fwd_syncs;
    out->bwd_syncs = tp.bwd_syncs + sp.bwd_syncs + dp.bwd_syncs;
    out->fwd_comm_s = tp.fwd_s + sp.fwd_s + dp.fwd_s;
    out->micro_s = out->fwd_s + out->bwd_s + out->recompute_s + out->tp_comm_s + out->sp_comm_s + out->zero_comm_s;
    out->stage_max_s = out->micro_s;
    out->pace = parts_of(out, p.gemm_s, p.attn_s);
}

void plan_stage_micro_time(const model_t *m, int mi, const plan_module *s, int stage, const plan_workload *w,
                           const cost_cluster *c, const plan_options *o, double samples, plan_time *out)
{
    plan_stage st = plan_vstage_of(&m->mod[mi], s, stage);
    price_micro(m, mi, s, &st, w, c, o, samples, -1, out);
}

void plan_cp_micro_time(const model_t *m, int mi, const plan_module *s, int stage, int sp_rank, const plan_workload *w,
                        const cost_cluster *c, const plan_options *o, double samples, plan_time *out)
{
    plan_stage st = plan_vstage_of(&m->mod[mi], s, stage);
    price_micro(m, mi, s, &st, w, c, o, samples, sp_rank, out);
}

/* The whole module: every stage's compute and in-op communication plus the
 * hand-offs between stages; stage_max_s is the busiest stage with its hops,
 * which paces a pipeline. */
void plan_micro_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                     const cost_cluster *c, const plan_options *o, double samples, plan_time *out)
{
    plan_stage whole = plan_stage_of(&m->mod[mi], s, -1);
    price_micro(m, mi, s, &whole, w, c, o, samples, -1, out);
    if (s->pp <= 1 || samples <= 0) return;
    plan_pipeline_hops h;
    plan_pipeline_hops_of(m, mi, s, w, c, o, samples, &h);
    int vp = plan_vp(s);
    out->pp_p2p_s = h.fwd_s + h.bwd_s;
    out->fwd_comm_s += h.fwd_s;
    out->micro_s += out->pp_p2p_s;
    out->stage_max_s = 0;
    double stages_s = 0;
    for (int i = 0; i < s->pp; i++) {
        double chunks = 0;
        plan_micro_parts parts = { .hop_s = h.stage_s[i] };
        for (int v = 0; v < vp; v++) {   /* the rank's model chunks, each a virtual stage */
            plan_time st;
            plan_stage_micro_time(m, mi, s, v * s->pp + i, w, c, o, samples, &st);
            chunks += st.micro_s;
            add_parts(&parts, &st.pace);
        }
        double t = chunks + parts.hop_s;
        stages_s += t;
        if (t > out->stage_max_s) {
            out->stage_max_s = t;
            out->pace = parts;
        }
    }
    out->fill_s = (stages_s - out->stage_max_s) / (s->pp - 1);
}

void plan_module_time(const model_t *m, int mi, const plan_module *s, const plan_workload *w,
                      const cost_cluster *c, const plan_options *o, plan_time *out)
{
    const model_module *mm = &m->mod[mi];
    const cost_pool *pool = &c->pool[s->pool];
    plan_micro_time(m, mi, s, w, c, o, s->micro_batch, out);
    /* the stages step side by side: the slowest one's */
    for (int i = 0; i < (s->pp > 1 ? s->pp : 1); i++) {
        plan_time st = *out;
        plan_stage_step_time(mm, s, i, pool, o, &st);
        if (i == 0 || st.norm_s + st.optim_s + st.grad_sync_s + st.param_gather_s
                      > out->norm_s + out->optim_s + out->grad_sync_s + out->param_gather_s) {
            out->dp_exposed_s = st.dp_exposed_s;
            out->grad_sync_s = st.grad_sync_s;
            out->grad_sync_busy_s = st.grad_sync_busy_s;
            out->param_gather_s = st.param_gather_s;
            out->param_gather_busy_s = st.param_gather_busy_s;
            out->optim_s = st.optim_s;
            out->norm_s = st.norm_s;
        }
    }
    plan_seq q;
    plan_module_seq(m, mi, w, &q);
    double passes = model_trains(mm) ? 3.0 : model_runs_backward(mm) ? 2.0 : 1.0;
    out->model_flops = passes * forward_flops_per_sample(mm, &q) * w->global_batch;
}

/* Durations of the schedule's compute ops from plan_micro_time: an encoder
 * forward is its compute plus the forward half of its in-op communication,
 * its backward (with recompute) the rest; an LLM forward+backward is micro_s. */
double plan_time_forward_s(const plan_time *t) { return t->fwd_s + t->fwd_comm_s; }
double plan_time_backward_s(const plan_time *t) { return t->micro_s - plan_time_forward_s(t); }

double plan_time_tail_s(const plan_time *t) { return t->dp_exposed_s + t->norm_s + t->optim_s; }
