/* Minimal test framework. Each TEST registers itself at load time; the
 * runner (tests/test_main.c) prints one line per test:
 *   "ok NAME", "FAIL NAME: file:line: message" or "skipped: NAME: why".
 * tests/run.sh aggregates these lines with the script tests. */
#ifndef DHP_TEST_H
#define DHP_TEST_H

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn);
/* A test a script drives (it needs files or a process the script prepares):
 * run only when the runner's filter argument names it. */
void test_register_driven(const char *name, test_fn fn);
void test_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void test_skip(const char *why);
int test_failed_now(void);

#define TEST(name)                                                        \
    static void name(void);                                               \
    __attribute__((constructor)) static void test_reg_##name(void)        \
    { test_register(#name, name); }                                       \
    static void name(void)

#define TEST_DRIVEN(name)                                                 \
    static void name(void);                                               \
    __attribute__((constructor)) static void test_reg_##name(void)        \
    { test_register_driven(#name, name); }                                \
    static void name(void)

/* A fresh directory /tmp/dhp-TAG-XXXXXX, its name in dir (n bytes): 0, or
 * -1 when it could not be made. */
int test_tmp_dir(char *dir, size_t n, const char *tag);
/* Removes dir and all below it (rm -rf): 0, or -1 (said on stdout). */
int test_rm_tree(const char *dir);

#define CHECK(cond) do { if (!(cond)) { test_fail_at(__FILE__, __LINE__, "%s", #cond); return; } } while (0)
#define CHECK_MSG(cond, ...) do { if (!(cond)) { test_fail_at(__FILE__, __LINE__, __VA_ARGS__); return; } } while (0)
#define CHECK_EQ_INT(a, b) do { long long _a = (long long)(a), _b = (long long)(b); \
    if (_a != _b) { test_fail_at(__FILE__, __LINE__, "%s == %lld, expected %s == %lld", #a, _a, #b, _b); return; } } while (0)
/* Relative tolerance check: |a-b| <= rel * max(|a|,|b|, tiny). */
#define CHECK_NEAR(a, b, rel) do { double _a = (double)(a), _b = (double)(b); \
    double _m = fmax(fabs(_a), fabs(_b)); if (_m < 1e-300) _m = 1e-300; \
    if (!(fabs(_a - _b) <= (rel) * _m)) { test_fail_at(__FILE__, __LINE__, \
        "%s = %.9g vs %s = %.9g (rel err %.3g > %g)", #a, _a, #b, _b, fabs(_a - _b) / _m, (double)(rel)); return; } } while (0)
#define CHECK_OK(expr) do { char _e[512] = ""; (void)_e; int _rc = (expr); \
    if (_rc != 0) { test_fail_at(__FILE__, __LINE__, "%s returned %d", #expr, _rc); return; } } while (0)

#endif
