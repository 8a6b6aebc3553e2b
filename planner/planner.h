/* planner: memory model, cost model, the GLPK mixed-integer search over
 * per-module strategies and placements, the baselines, and the plan file.
 *
 * Layering: util < models < costdb < planner < executor < cli. The plan
 * types below are the contract between planner and executor. */
#ifndef DHP_PLANNER_H
#define DHP_PLANNER_H

#include <stdbool.h>
#include "util/util.h"
#include "models/models.h"
#include "costdb/costdb.h"

#define PLAN_SCHEMA "dhp.plan/1"
#define PLAN_SCHEMA_VERSION 1

typedef enum { PLAN_COLOCATED = 0, PLAN_DISAGGREGATED } plan_placement;
typedef enum { PLAN_RECOMP_NONE = 0, PLAN_RECOMP_SELECTIVE, PLAN_RECOMP_FULL } plan_recompute;
typedef enum { PLAN_OPT_MIXED_FP32 = 0, PLAN_OPT_PURE_BF16 } plan_precision;

/* What one training step processes. Sequence lengths per sample:
 * vision encoder sees images_per_sample * image_tokens patches; the LLM sees
 * images_per_sample * image_tokens / merge^2 (+ audio) + text_tokens. */
typedef struct {
    int global_batch;         /* samples per optimizer step */
    int images_per_sample;    /* 0 for no images */
    int image_tokens;         /* vision tokens (patches) per image, before the merger */
    int audio_frames;         /* audio encoder frames per sample (after the conv stem); 0 = none */
    int text_tokens;          /* text tokens per sample */
} plan_workload;

/* One module's strategy. Ranks of the module group are the contiguous global
 * ranks [first_rank, first_rank + n_ranks) with n_ranks = dp*tp*sp*pp, laid out
 *   local = ((pp_i * dp + dp_i) * sp + sp_i) * tp + tp_i     (tp fastest). */
typedef struct {
    char module[MODEL_NAME_LEN];
    int module_index;         /* index into model_t.mod */
    int pool;                 /* cluster pool index */
    int first_rank, n_ranks;
    int dp, tp, sp, pp;
    int zero;                 /* ZeRO stage 0..3 across the dp group */
    int micro_batch;          /* samples per micro-batch per dp rank */
    plan_recompute recompute;
    bool seq_parallel;        /* Megatron sequence parallelism on top of tp (LLM) */
} plan_module;

typedef struct {
    double step_time_s;
    double samples_per_s, vision_tokens_per_s, tokens_per_s;
    double mfu;
    double peak_mem_bytes[MODEL_MAX_MODULES];   /* per GPU of each module group */
    bool fits;
} plan_prediction;

typedef struct {
    int version;
    model_t model;            /* full description, so a plan is self-contained */
    cost_cluster cluster;
    plan_workload work;
    plan_placement placement;
    plan_precision precision;
    int world_size;           /* total ranks the plan uses */
    int n_micro;              /* micro-batches per step flowing between module groups */
    int n_modules;            /* one entry per model module, same order as model.mod */
    plan_module mod[MODEL_MAX_MODULES];
    plan_prediction pred;
    char label[64];           /* "dhp", "zero3", "tp", "homogeneous", ... */
} plan_t;

/* Plan file I/O (atomic write). plan_read validates against the model it
 * carries: degrees multiply to n_ranks, groups disjoint (disaggregated) or
 * identical (colocated), tp divides heads, sequence divisible by sp, etc. */
int plan_write(const char *path, const plan_t *p, char *err);
int plan_read(const char *path, plan_t *p, char *err);
cJSON *plan_to_json(const plan_t *p);
int plan_from_json(const cJSON *root, const char *what, plan_t *p, char *err);
int plan_validate(const plan_t *p, char *err);

const char *plan_placement_name(plan_placement p);
const char *plan_recompute_name(plan_recompute r);

#endif
