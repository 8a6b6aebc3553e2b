/* The cost model's part for the audio encoder's ends (executor/audio.c,
 * Whisper's encoder as Qwen2-Audio and Qwen2.5-Omni use it): the conv stem
 * with its positions on the first stage, the pooling, final LayerNorm and
 * projector on the last, call by call as the executor makes them. */
#include "planner/planner_int.h"

/* The stem on t rows, `segments` clip segments (plan_audio_stem_work):
 * conv1 over its R1 rows (C mel bins x k taps -> h) and conv2 (h x k -> h,
 * stride 2) as im2col (one call per segment) + GEMM, each with its bias and
 * GELU, the positions added per segment; backward conv2's and conv1's
 * weight gradients and conv2's input gradient (col2im per segment), the
 * im2col rebuilt (the mel frames need no gradient; the learned positions
 * are frozen, executor/audio.c). im2col and col2im are gathers priced as copies of
 * their nominal bytes: im2col reads and writes its rows x C k, col2im reads
 * the columns and updates the frames. */
static void price_stem(plan_pricer *p, const model_module *mm, double t, double R1, double segments)
{
    double h = mm->hidden, k = mm->patch, C = mm->in_channels;
    plan_price_gemm(p, R1, h, C * k, false);
    plan_price_gemm(p, t, h, h * k, true);
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_COPY, segments, R1 * C * k);             /* conv1 im2col */
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_BIAS, 1, R1 * h);
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_GELU, 1, R1 * h);
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_COPY, segments, t * h * k);              /* conv2 im2col */
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_BIAS, 1, t * h);
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_GELU, 1, t * h);
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_ADD, segments, t * h);                   /* positions */
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_ZERO, 1, t * h);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_GELU_BWD, 1, t * h);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_COPY, segments, t * h * k);              /* conv2 im2col again */
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_ZERO, 1, t * h * k);
    if (mm->patch_bias) plan_price_ew(p, PLAN_PASS_WGRAD, COST_EW_BIAS_GRAD, 1, t * h);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_COPY, segments, R1 * C * k);             /* conv1 im2col again */
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_ZERO, 1, R1 * h);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_COPY, segments, t * h * k / 2 + R1 * h); /* col2im */
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_ZERO, 1, R1 * h);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_GELU_BWD, 1, R1 * h);
    if (mm->patch_bias) plan_price_ew(p, PLAN_PASS_WGRAD, COST_EW_BIAS_GRAD, 1, R1 * h);
}

/* The head: the t / pool pooled rows (pooling reads pool rows per output
 * row and writes one, backward reads one and updates pool: copies of those
 * bytes), their final LayerNorm and the projector. */
static void price_head(plan_pricer *p, const model_module *mm, double t)
{
    double h = mm->hidden, pool = mm->pool > 0 ? mm->pool : 1, M = t / pool, O = mm->out_hidden;
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_COPY, 1, M * h * (pool + 1) / 2);     /* pooling */
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_LAYERNORM, 1, M * h);
    plan_price_gemm(p, M, O, h, true);
    plan_price_ew(p, PLAN_PASS_FWD, COST_EW_BIAS, 1, M * O);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_ZERO, 1, M * h);
    if (mm->proj_bias) plan_price_ew(p, PLAN_PASS_WGRAD, COST_EW_BIAS_GRAD, 1, M * O);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_ZERO, 1, M * h);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_LAYERNORM_BWD, 1, M * h);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_ZERO, 1, t * h);
    plan_price_ew(p, PLAN_PASS_BWD, COST_EW_COPY, 1, M * h * (2 * pool + 1) / 2); /* pooling's backward */
}

void plan_price_audio_ends(plan_pricer *p, const model_module *mm, const plan_stage *st, double samples, double F,
                           int sp, double t)
{
    if (st->stem) {
        double R1, segments;
        plan_audio_stem_work(mm, (int)samples, (int)F, sp, &R1, &segments);
        price_stem(p, mm, t, R1, segments);
    }
    if (st->head) price_head(p, mm, t);
}
