/* executor-internal: bf16-mixed (executor/precision.c; the rules:
 * planner/precision.c). */
#ifndef DHP_EXECUTOR_PRECISION_H
#define DHP_EXECUTOR_PRECISION_H

#include "executor/model_int.h"

/* The backend the model runs on: base itself for fp32, for bf16-mixed a
 * table that is base in everything but the linears, which read the
 * module's bf16 weight copy and round their activation operands to bf16
 * (one process runs one precision: the table is the process's). */
const ex_backend *ex_precision_backend(const ex_backend *base, bool bf16_mixed);
bool ex_precision_is_mixed(const ex_backend *be);
/* Allocates every module's bf16 weight copy (UTIL_MEM_PARAMS) where the
 * model's backend is the bf16-mixed one; a no-op under fp32. */
int ex_precision_attach(ex_model *em, char *err);
/* Rounds each module's weights into its copy: before a step's first forward
 * (after the previous step's optimizer, a resume or --init-from). */
void ex_precision_refresh(ex_model *em);
/* Grows the module's two GEMM staging buffers to the bound slot geometry's
 * need (plan_gemm_staging_elems, UTIL_MEM_ACTIV). */
int ex_precision_reserve(ex_module *md, const plan_act_rows *rows, char *err);
/* Releases the module's copy and staging. */
void ex_precision_detach(ex_module *md);

#endif
