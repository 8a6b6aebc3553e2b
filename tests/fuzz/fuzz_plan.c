/* Plan files (schema dhp.plan/1, planner/planfile.c) as `dhp memory` and
 * `dhp simulate` take them: parse and validate, evaluate on the cost model,
 * build rank 0's and the last rank's schedules and simulate the step. */
#include "tests/fuzz/fuzz.h"
#include "planner/planner.h"

static void schedule_of(const plan_t *p, int rank)
{
    plan_schedule s;
    char err[UTIL_ERR_LEN];
    if (plan_schedule_rank(p, rank, &s, err) == UTIL_OK) plan_schedule_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size), err[UTIL_ERR_LEN];
    static plan_t p;
    cJSON *root;
    if (util_json_parse(text, "fuzz.json", &root, err) == UTIL_OK) {
        if (plan_from_json(root, "fuzz.json", &p, err) == UTIL_OK) {
            plan_options o;
            plan_options_default(&o);
            o.precision = p.precision;
            if (plan_assemble(&p, &o, err) == UTIL_OK && plan_schedule_check(&p, err) == UTIL_OK) {
                schedule_of(&p, 0);
                schedule_of(&p, p.world_size - 1);
                plan_sim_result r;
                if (plan_sim_run(&p, NULL, &r, err) == UTIL_OK) plan_sim_free(&r);
            }
        }
        cJSON_Delete(root);
    }
    util_free(text);
    return 0;
}
