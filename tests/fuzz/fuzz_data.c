/* Data sets (executor/data.c, executor/DATASET.md): a manifest and one
 * shard. Input: 4 bytes little-endian manifest length n, the manifest, then
 * the bytes of shard-00000.bin. Opened as `dhp run --data` opens it, then
 * two steps' batches are drawn. */
#include "tests/fuzz/fuzz.h"
#include "executor/executor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    size_t n = (size_t)data[0] | (size_t)data[1] << 8 | (size_t)data[2] << 16 | (size_t)data[3] << 24;
    if (n > size - 4) return 0;
    static char manifest[128], shard[128];
    if (!manifest[0]) {
        snprintf(manifest, sizeof manifest, "%s/manifest.json", fuzz_dir());
        snprintf(shard, sizeof shard, "%s/shard-00000.bin", fuzz_dir());
    }
    fuzz_write(manifest, data + 4, n);
    fuzz_write(shard, data + 4 + n, size - 4 - n);
    char err[UTIL_ERR_LEN];
    ex_dataset *ds;
    if (ex_data_open(fuzz_dir(), &ds, err) != UTIL_OK) return 0;
    const ex_dataset_info *in = ex_data_info(ds);
    int batch = in->samples < 4 ? in->samples : 4;
    ex_data_rows b;
    if (ex_batch_alloc(&b, ds, batch, err) == UTIL_OK) {
        for (long step = 0; step < 2; step++) (void)ex_data_batch(ds, 7, step, batch, 0, 1, &b, err);
        ex_batch_free(&b);
    }
    (void)ex_data_caption(ds, in->samples - 1);
    ex_data_close(ds);
    return 0;
}
