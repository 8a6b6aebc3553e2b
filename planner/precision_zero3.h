/* bf16 with ZeRO-3 in dhp run (planner/precision_zero3.c): which tensors a
 * gather moves in bf16, what each unit's two all-gathers move and what the
 * executor (executor/dp_zero3_bf16.c) allocates for them. Included by
 * planner.h. */
#ifndef DHP_PLANNER_PRECISION_ZERO3_H
#define DHP_PLANNER_PRECISION_ZERO3_H

/* The weight of a linear (a GEMM's operand, read by the executor's bf16
 * linears only, rounded): the tensors a bf16-mixed ZeRO-3 gather moves in
 * bf16. Every other tensor (norms, biases, embedding tables, positions) is
 * read in fp32 and gathered in fp32. */
bool plan_tensor_is_gemm_weight(plan_tensor_role role);
/* bf16-mixed on a module whose weights ZeRO-3 shards (target dhp). */
bool plan_zero3_bf16(const model_module *mm, const plan_module *s, const plan_options *o);

/* One unit's gather under plan_zero3_bf16, per rank of the shard group, in
 * floats (4-byte words, as the communicator counts): `half` carries the
 * rank's piece of the unit rounded to bf16, two elements a word
 * (ceil(piece / 2)); `full` carries the rank's elements of the fp32 tensors,
 * packed (the most any rank of the group holds). */
typedef struct { int64_t piece, half, full; } plan_z3_unit;
/* Fills u[plan_module_units(mm)] for the blocks of st (plan_stage_of; 0 for
 * units another stage holds) cut in G pieces (plan_dp_rules.shard); UTIL_OK or UTIL_ENOMEM. */
int plan_zero3_bf16_units(const model_module *mm, const plan_module *s, const plan_stage *st, int G, plan_z3_unit *u);

/* What the executor allocates, in floats: the bf16 shard (params: every
 * unit's `half` words) and the packed fp32 shard (params: every unit's
 * `full`), and per gather slot the two receive buffers (zero buffers:
 * G * max half, G * max full) beside the slot's fp32 unit. */
typedef struct { int64_t half_shard, full_shard, half_recv, full_recv; } plan_z3_buffers;
plan_z3_buffers plan_zero3_bf16_buffers(const model_module *mm, const plan_module *s, int stage);

/* The dhp target's memory of a bf16-mixed ZeRO-3 module: adds those buffers to
 * params and zero_buffers (out filled by the fp32 rules), and takes out the
 * whole-module bf16 copy the other ZeRO stages keep. */
void plan_zero3_bf16_memory(const model_module *mm, const plan_module *s, int stage, const plan_options *o,
                            plan_mem *out);

#endif
