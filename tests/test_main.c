#include "test.h"

#include <stdarg.h>
#include <stdlib.h>

#define MAX_TESTS 1024
static struct { const char *name; test_fn fn; int driven; } tests[MAX_TESTS];
static int n_tests, cur_failed, cur_skipped;

static void add(const char *name, test_fn fn, int driven)
{
    if (n_tests < MAX_TESTS) { tests[n_tests].name = name; tests[n_tests].fn = fn; tests[n_tests].driven = driven; n_tests++; }
}

void test_register(const char *name, test_fn fn) { add(name, fn, 0); }
void test_register_driven(const char *name, test_fn fn) { add(name, fn, 1); }

static const char *cur_name;

void test_fail_at(const char *file, int line, const char *fmt, ...)
{
    if (cur_failed) return;
    cur_failed = 1;
    printf("FAIL %s: %s:%d: ", cur_name, file, line);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

void test_skip(const char *why)
{
    cur_skipped = 1;
    printf("skipped: %s: %s\n", cur_name, why);
}

int test_failed_now(void) { return cur_failed; }

int test_tmp_dir(char *dir, size_t n, const char *tag)
{
    int len = snprintf(dir, n, "/tmp/dhp-%s-XXXXXX", tag);
    return len > 0 && (size_t)len < n && mkdtemp(dir) ? 0 : -1;
}

int test_rm_tree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) == 0) return 0;
    printf("unit: could not remove %s\n", dir);
    return -1;
}

int main(int argc, char **argv)
{
    /* Optional argument: run only tests whose name contains it. */
    const char *filter = argc > 1 ? argv[1] : NULL;
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter)) continue;
        if (!filter && tests[i].driven) continue;
        cur_name = tests[i].name;
        cur_failed = cur_skipped = 0;
        tests[i].fn();
        if (cur_failed) failed++;
        else if (cur_skipped) skipped++;
        else { passed++; printf("ok %s\n", cur_name); }
        fflush(stdout);
    }
    printf("unit: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}
