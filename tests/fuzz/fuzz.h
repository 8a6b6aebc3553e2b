/* Shared by the libFuzzer targets (tests/fuzz/fuzz_*.c, `make fuzz`): each
 * target feeds one of dhp's parsers the bytes libFuzzer gives it. A parser
 * may refuse an input (one error line); it may not crash, leak, read out of
 * bounds, overflow a signed integer or hang. */
#ifndef DHP_FUZZ_H
#define DHP_FUZZ_H

#include "util/util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a NUL-terminated string (what a text reader would pass on:
 * util_read_text_file refuses a NUL byte, so the text stops at the first). */
static inline char *fuzz_text(const uint8_t *data, size_t size)
{
    char *s = util_malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* A private directory for targets whose parser reads files (tmpfs if there is one). */
static inline const char *fuzz_dir(void)
{
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/dev/shm/dhp-fuzz-XXXXXX");
        if (!mkdtemp(dir)) {
            snprintf(dir, sizeof dir, "/tmp/dhp-fuzz-XXXXXX");
            if (!mkdtemp(dir)) abort();
        }
    }
    return dir;
}

static inline void fuzz_write(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
}

#endif
