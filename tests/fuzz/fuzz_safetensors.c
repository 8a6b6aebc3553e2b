/* Safetensors files and dhp checkpoints (executor/checkpoint.c, `dhp run
 * --resume`, `dhp data ckpt-*`): open the file, look up every tensor and
 * metadata key by name, read every tensor (checksums verified). */
#include "tests/fuzz/fuzz.h"
#include "executor/executor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[128];
    if (!path[0]) snprintf(path, sizeof path, "%s/fuzz.safetensors", fuzz_dir());
    fuzz_write(path, data, size);
    char err[UTIL_ERR_LEN];
    ex_ckpt *c;
    if (ex_ckpt_open(path, &c, err) != UTIL_OK) return 0;
    for (int i = 0; i < ex_ckpt_meta_count(c); i++) {
        const char *k, *v;
        ex_ckpt_meta_at(c, i, &k, &v);
        if (ex_ckpt_meta(c, k) == NULL) abort();
    }
    for (int i = 0; i < ex_ckpt_count(c); i++) {
        const ex_ckpt_entry *e = ex_ckpt_entry_at(c, i);
        if (ex_ckpt_find(c, e->name) != e) abort();
        int64_t n = ex_ckpt_numel(e);
        if (strcmp(e->dtype, "F32") && strcmp(e->dtype, "BF16") && strcmp(e->dtype, "F16")) continue;
        float *buf = util_malloc((size_t)(n ? n : 1) * sizeof(float));
        if (!buf) abort();
        (void)ex_ckpt_read_f32(c, e, buf, (size_t)n, err);
        util_free(buf);
    }
    ex_ckpt_close(c);
    return 0;
}
