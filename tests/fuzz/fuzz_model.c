/* Model descriptions (schema dhp.model/1, models/model.c): parse, validate,
 * count parameters, and round-trip what was accepted. */
#include "tests/fuzz/fuzz.h"
#include "models/models.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size), err[UTIL_ERR_LEN];
    model_t m, again;
    if (model_parse_json(text, "fuzz.json", &m, err) == UTIL_OK) {
        volatile int64_t n = model_total_params(&m);
        (void)n;
        for (int k = 0; k < m.n_modules; k++) (void)model_largest_layer_params(&m.mod[k]);
        cJSON *j = model_to_json(&m);
        char *out = cJSON_PrintUnformatted(j);
        if (model_parse_json(out, "round-trip", &again, err) != UTIL_OK) {
            fprintf(stderr, "accepted model does not round-trip: %s\n", err);
            abort();
        }
        cJSON_free(out);
        cJSON_Delete(j);
    }
    util_free(text);
    return 0;
}
