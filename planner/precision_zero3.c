/* bf16-mixed with ZeRO-3 in dhp run: the rules, the two all-gathers of a
 * unit and their buffers (the executor: executor/dp_zero3_bf16.c).
 *
 * PyTorch FSDP's MixedPrecision(param_dtype=torch.bfloat16) and DeepSpeed's
 * ZeRO-3 bf16 (deepspeed/runtime/zero/stage3.py: fp32 partitions in the
 * optimizer, the model's bf16 partitions all-gathered) keep each rank's fp32
 * master shard and its AdamW moments, round a bf16 copy of the shard after
 * each optimizer step and all-gather that copy, half the bytes of an fp32
 * gather; gradients are reduce-scattered in fp32 (FSDP's reduce_dtype
 * float32). dhp's bf16-mixed reads bf16 weights only in its linears
 * (planner/precision.c): norms, biases and embedding lookups read the fp32
 * master. So a unit's gather moves its linears' weights in bf16 and the rest
 * in fp32, and the gathered unit the executor computes with holds, for every
 * tensor, what the other ZeRO stages' bf16-mixed reads there: the linears
 * round the bf16 values again (exactly) and read bf16(master), the others
 * read the master. The two kinds interleave inside a unit and the shard cuts
 * a unit into equal pieces across tensors, so each rank sends two messages:
 * its whole piece in bf16 (two elements a 4-byte word, an odd piece padded
 * by one element), and its piece's fp32-read elements packed, padded to the
 * most any rank holds. The fp32-read tensors are the small ones (norm
 * weights and biases: O(hidden) a block against O(hidden^2) for the
 * linears), the embedding tables aside. */
#include "planner/planner.h"

#include <string.h>

bool plan_tensor_is_gemm_weight(plan_tensor_role role)
{
    switch (role) {
    case PLAN_TW_PATCH_W: case PLAN_TW_WQ: case PLAN_TW_WK: case PLAN_TW_WV: case PLAN_TW_WO:
    case PLAN_TW_WG: case PLAN_TW_WU: case PLAN_TW_WD: case PLAN_TW_M0W: case PLAN_TW_M2W:
    case PLAN_TW_HEAD: case PLAN_TW_CONV1_W: case PLAN_TW_CONV2_W: case PLAN_TW_PROJ_W:
        return true;
    default:
        return false;
    }
}

bool plan_zero3_bf16(const model_module *mm, const plan_module *s, const plan_options *o)
{
    return plan_runs_bf16(o) && o->precision == PLAN_OPT_MIXED_FP32 && plan_dp_rules_of(mm, s).shard_params;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Adds the fp32-read range [a, b) of a unit cut in pieces of p to each rank's count. */
static void count_range(int64_t a, int64_t b, int64_t p, int64_t *count)
{
    for (int64_t r = a / p; r * p < b; r++) {
        int64_t lo = a > r * p ? a : r * p, hi = b < (r + 1) * p ? b : (r + 1) * p;
        count[r] += hi - lo;
    }
}

int plan_zero3_bf16_units(const model_module *mm, const plan_module *s, const plan_stage *st, int shard, plan_z3_unit *u)
{
    int U = plan_module_units(mm);
    int64_t G = shard > 1 ? shard : 1;
    memset(u, 0, (size_t)U * sizeof *u);
    int n = plan_module_tensor_shapes(mm, s->tp, 0, s->seq_parallel, st, NULL, 0);
    plan_tensor *t = util_malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    int64_t *size = util_calloc((size_t)U, sizeof *size), *count = util_calloc((size_t)G, sizeof *count);
    int rc = t && size && count ? UTIL_OK : UTIL_ENOMEM;
    if (!rc) {
        plan_module_tensor_shapes(mm, s->tp, 0, s->seq_parallel, st, t, n);
        for (int i = 0; i < n; i++) size[t[i].unit] += t[i].shape[0] * t[i].shape[1];
        for (int k = 0; k < U; k++) u[k].piece = ceil_div(size[k], G), u[k].half = ceil_div(u[k].piece, 2);
        /* the tensors in flat order, units contiguous (executor/model.c's layout) */
        for (int i = 0, k = -1; i <= n; i++) {
            if (i == n || t[i].unit != k) {   /* unit k ends: its most packed */
                for (int64_t r = 0; k >= 0 && r < G; r++) {
                    if (count[r] > u[k].full) u[k].full = count[r];
                    count[r] = 0;
                }
                if (i == n) break;
                k = t[i].unit;
                size[k] = 0;                  /* from here on: the offset inside the unit */
            }
            int64_t e = t[i].shape[0] * t[i].shape[1];
            if (e > 0 && !plan_tensor_is_gemm_weight(t[i].role)) count_range(size[k], size[k] + e, u[k].piece, count);
            size[k] += e;
        }
    }
    util_free(t);
    util_free(size);
    util_free(count);
    return rc;
}

plan_z3_buffers plan_zero3_bf16_buffers(const model_module *mm, const plan_module *s, int stage)
{
    plan_z3_buffers b = { 0 };
    int U = plan_module_units(mm);
    int64_t G = plan_dp_rules_of(mm, s).shard, half = 0, full = 0;
    plan_z3_unit *u = util_malloc((size_t)U * sizeof *u);
    plan_stage st = plan_stage_of(mm, s, stage);
    if (!u || plan_zero3_bf16_units(mm, s, &st, (int)G, u)) {
        util_free(u);
        return b;
    }
    for (int k = 0; k < U; k++) {
        b.half_shard += u[k].half;
        b.full_shard += u[k].full;
        if (u[k].half > half) half = u[k].half;
        if (u[k].full > full) full = u[k].full;
    }
    util_free(u);
    b.half_recv = G * half;
    b.full_recv = G * full;
    return b;
}

void plan_zero3_bf16_memory(const model_module *mm, const plan_module *s, int stage, const plan_options *o,
                            plan_mem *out)
{
    if (!plan_zero3_bf16(mm, s, o)) return;
    plan_dp_buffers d = plan_dp_buffers_of(mm, s, stage);
    plan_z3_buffers b = plan_zero3_bf16_buffers(mm, s, stage);
    out->params += -(double)d.local * plan_weight_copy_bytes(mm, o) + 4.0 * (double)(b.half_shard + b.full_shard);
    out->zero_buffers += 4.0 * d.gather_slots * (double)(b.half_recv + b.full_recv);
}
