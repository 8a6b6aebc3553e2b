/* Hugging Face config.json (models/import_hf.c, `dhp import`). */
#include "tests/fuzz/fuzz.h"
#include "models/models.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size), err[UTIL_ERR_LEN];
    model_t m;
    if (model_import_hf(text, "config.json", &m, err) == UTIL_OK) {
        volatile int64_t n = model_total_params(&m);
        (void)n;
    }
    util_free(text);
    return 0;
}
