/* executor-internal: bf16-mixed (executor/precision.c; the rules:
 * planner/precision.c). */
#ifndef DHP_EXECUTOR_PRECISION_H
#define DHP_EXECUTOR_PRECISION_H

#include "executor/model_int.h"

/* The backend the model runs on under the plan's options: base itself for
 * fp32; for bf16-mixed and -autocast a table that is base in everything but
 * the linears, which read bf16 weights (mixed: the module's copy; autocast:
 * the weight rounded per linear) and round their activation operands to
 * bf16 (one process runs one precision: the table is the process's). */
const ex_backend *ex_precision_backend(const ex_backend *base, const plan_options *o);
bool ex_precision_is_mixed(const ex_backend *be);
/* Allocates every module's bf16 weight copy (bf16-mixed, UTIL_MEM_PARAMS)
 * or weight cast staging (autocast, UTIL_MEM_ACTIV: the largest tensor);
 * a no-op under fp32. */
int ex_precision_attach(ex_model *em, char *err);
/* Rounds each module's weights into its copy: before a step's first forward
 * (after the previous step's optimizer, a resume or --init-from). */
void ex_precision_refresh(ex_model *em);
/* Grows the module's two GEMM staging buffers to the bound slot geometry's
 * need (plan_gemm_staging_elems, UTIL_MEM_ACTIV). */
int ex_precision_reserve(ex_module *md, const plan_act_rows *rows, char *err);
/* ZeRO-3 (executor/dp_zero3*.c): the module's weights are gathered unit by
 * unit from now (its whole bf16 copy goes, its linears round the weight they
 * read into a cast staging); a buffer of n floats the module's gathered
 * weights are bound in (its linears find their module there); a hook
 * ex_precision_refresh calls (fn NULL: removes ctx's); whether the linears
 * read a persistent bf16 copy (bf16-mixed) rather than a per-linear cast. */
int ex_precision_gathered(ex_module *md, char *err);
int ex_precision_add_weights(ex_module *md, const float *at, size_t n);
int ex_precision_on_refresh(void (*fn)(void *), void *ctx);
bool ex_precision_keeps_copy(const ex_backend *be);
/* Releases the module's copy and staging. */
void ex_precision_detach(ex_module *md);

#endif
