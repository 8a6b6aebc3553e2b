/* The cost model's part for FP8 linears (--fp8, plan_fp8_props; the
 * Megatron target): the casts around each of the blocks' linears and, under
 * TransformerEngine's primary FP8 weights, the step's weight transposes. The
 * GEMMs themselves are priced in COST_MATH_FP8 by planner/cost.c
 * (plan_block_gemm_math). */
#include "planner/planner_int.h"

/* The FP8 casts around one of the blocks' linears (m rows, k in, n out),
 * element-wise passes over tensors of A bytes an element: forward, the
 * input's cast and its transpose for the weight gradient (read A, write 1 +
 * 1 B; transformer_engine's fp8_cast_transpose_fused), or, for the input a
 * norm feeds under TransformerEngine (LayerNormLinear: the norm kernel
 * writes FP8 itself), the transpose alone (read 1, write 1 B; the norm's
 * narrower write is not priced); backward, the output gradient's cast and
 * transpose (read A, write 2 B). torchao casts the weight at each use (read
 * A, write 1 B, forward and again transposed in backward); TransformerEngine
 * keeps it in FP8 (plan_fp8_weight_cast_s). Under current scaling
 * (amax_pass) each cast first reads its tensor for the amax. Sets *fwd and
 * *bwd; 0 without FP8. */
void plan_fp8_casts_s(const plan_fp8_props *f, const cost_gpu *g, double A, double m, double n, double k,
                      bool norm_fed, double *fwd, double *bwd)
{
    *fwd = *bwd = 0;
    if (!f || !f->on || m <= 0 || n <= 0 || k <= 0) return;
    double amax = f->amax_pass ? A : 0, in = m * k, w = k * n, out = m * n;
    *fwd = norm_fed && f->norm_casts ? cost_memory_time(g, in * 2.0) : cost_memory_time(g, in * (amax + A + 2.0));
    *bwd = cost_memory_time(g, out * (amax + A + 2.0));
    if (!f->primary_fp8_weights) {
        *fwd += cost_memory_time(g, w * (amax + A + 1.0));
        *bwd += cost_memory_time(g, w * (amax + A + 1.0));
    }
}

/* TransformerEngine's primary FP8 weights (plan_fp8_props.primary_fp8_weights):
 * each step, after the optimizer wrote them from the fp32 master (the copy
 * bf16 weights get too), the first micro-batch transposes each block
 * linear's weight (read 1, write 1 B an element); 0 otherwise. */
double plan_fp8_weight_cast_s(const model_module *mm, const plan_module *s, const cost_pool *pool, const plan_options *o)
{
    if (!plan_fp8_props_of(o->fp8)->primary_fp8_weights) return 0;
    return cost_memory_time(&pool->gpu, plan_local_block_params(mm, s) * 2.0);
}
