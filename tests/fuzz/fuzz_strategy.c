/* --strategy strings (planner/baselines.c, `dhp plan/memory/simulate
 * --strategy`), on a vision-language model and an audio one, both
 * placements; the first byte picks the setting, the rest is the string. */
#include "tests/fuzz/fuzz.h"
#include "planner/planner.h"

static model_t models[2];
static cost_cluster clusters[2];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    char err[UTIL_ERR_LEN];
    if (model_load("qwen2.5-vl-7b", &models[0], err) || model_load("qwen2.5-omni-7b", &models[1], err) ||
        cost_cluster_load("2x8xh100", &clusters[0], err) || cost_cluster_load("mixed-h100-a100", &clusters[1], err)) {
        fprintf(stderr, "fuzz_strategy: %s\n", err);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    unsigned sel = data[0];
    char *spec = fuzz_text(data + 1, size - 1), err[UTIL_ERR_LEN];
    const model_t *m = &models[sel & 1];
    plan_workload w = { .global_batch = 8 << (sel >> 4 & 3), .images_per_sample = 1, .image_tokens = 4096,
                        .audio_frames = m == &models[1] ? 1500 : 0, .text_tokens = 512 };
    static plan_t p;
    plan_placement pl = sel & 2 ? PLAN_DISAGGREGATED : PLAN_COLOCATED;
    int gpus = sel & 4 ? 8 : 0, n_micro = sel & 8 ? 4 : 1;
    if (plan_from_strategy(spec, m, &clusters[sel >> 6 & 1], &w, pl, gpus, n_micro, &p, err) == UTIL_OK) {
        plan_schedule s;
        if (plan_schedule_rank(&p, 0, &s, err) == UTIL_OK) plan_schedule_free(&s);
    }
    util_free(spec);
    return 0;
}
