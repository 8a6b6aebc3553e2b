#include "test.h"
#include "util/util.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

TEST(util_atomic_write_replaces_and_leaves_no_temp)
{
    char dir[] = "/tmp/dhp-util-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/f.txt", dir);
    char err[UTIL_ERR_LEN];
    CHECK_OK(util_write_atomic(path, "one", 3, err));
    CHECK_OK(util_write_atomic(path, "second", 6, err));
    char *buf; size_t n;
    CHECK_OK(util_read_file(path, &buf, &n, err));
    CHECK_EQ_INT(n, 6);
    CHECK(strcmp(buf, "second") == 0);
    util_free(buf);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "test $(ls %s | wc -l) = 1", dir);
    CHECK(system(cmd) == 0);
    unlink(path);
    rmdir(dir);
}

TEST(util_atomic_write_fails_cleanly_in_missing_dir)
{
    char err[UTIL_ERR_LEN] = "";
    CHECK(util_write_atomic("/nonexistent-dir-dhp/x.json", "a", 1, err) == UTIL_EIO);
    CHECK(strstr(err, "/nonexistent-dir-dhp/x.json") != NULL);
}

TEST(util_mem_accounting_tracks_current_and_peak)
{
    util_mem_reset_peaks();
    size_t base = util_mem_current(UTIL_MEM_GRADS);
    void *a = util_malloc_cat(UTIL_MEM_GRADS, 1000);
    void *b = util_malloc_cat(UTIL_MEM_GRADS, 500);
    CHECK_EQ_INT(util_mem_current(UTIL_MEM_GRADS), base + 1500);
    util_free(a);
    CHECK_EQ_INT(util_mem_current(UTIL_MEM_GRADS), base + 500);
    CHECK_EQ_INT(util_mem_peak(UTIL_MEM_GRADS), base + 1500);
    b = util_realloc(b, 2000);
    CHECK_EQ_INT(util_mem_current(UTIL_MEM_GRADS), base + 2000);
    util_free(b);
    CHECK_EQ_INT(util_mem_current(UTIL_MEM_GRADS), base);
}

static void *alloc_churn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20000; i++) {
        void *p = util_malloc_cat(UTIL_MEM_COMM, 64 + (size_t)(i % 7));
        p = util_realloc(p, 128);
        util_free(p);
    }
    return NULL;
}

/* The kernels' worker threads and the tests' in-process ranks allocate at
 * once: no charge may be lost (with plain counters, lost updates left the
 * count 200-340 KB off after this churn). */
TEST(util_mem_accounting_is_exact_under_threads)
{
    size_t base = util_mem_current(UTIL_MEM_COMM);
    pthread_t th[4];
    int started = 0;
    for (int t = 0; t < 4; t++) started += pthread_create(&th[t], NULL, alloc_churn, NULL) == 0;
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    CHECK_EQ_INT(started, 4);
    CHECK_EQ_INT(util_mem_current(UTIL_MEM_COMM), base);
    CHECK(util_mem_peak(UTIL_MEM_COMM) >= base + 128);
}

TEST(util_json_getters_name_the_field)
{
    char err[UTIL_ERR_LEN];
    cJSON *root;
    CHECK_OK(util_json_parse("{\"a\": 3, \"b\": 2.5, \"s\": \"x\"}", "t", &root, err));
    long v; double d;
    CHECK_OK(util_json_int(root, "m", "a", true, 1, 10, 0, &v, err));
    CHECK_EQ_INT(v, 3);
    CHECK(util_json_int(root, "m", "b", true, 1, 10, 0, &v, err) == UTIL_EINVAL);
    CHECK(strstr(err, "m.b") != NULL);
    CHECK(util_json_int(root, "m", "a", true, 5, 10, 0, &v, err) == UTIL_EINVAL);
    CHECK(util_json_int(root, "m", "zz", true, 5, 10, 0, &v, err) == UTIL_EINVAL);
    CHECK(strstr(err, "missing") != NULL);
    CHECK_OK(util_json_num(root, "m", "zz", false, 0, 1, 0.5, &d, err));
    CHECK_NEAR(d, 0.5, 0);
    cJSON_Delete(root);
    CHECK(util_json_parse("{\"a\": 3,\n \"b\" 2}", "file.json", &root, err) == UTIL_EINVAL);
    CHECK(strstr(err, "line 2") != NULL);
}

/* An enum's value by name, and the message listing its names when it is none of them. */
TEST(util_name_index_says_the_choices)
{
    static const char *const three[] = { "units", "deepspeed-2021", "fsdp2" }, *const two[] = { "cuda", "cpu" };
    char err[UTIL_ERR_LEN];
    CHECK_EQ_INT(util_name_index("fsdp2", three, 3, err), 2);
    CHECK_EQ_INT(util_name_index("fsdp", three, 3, err), -1);
    CHECK_MSG(!strcmp(err, "'fsdp' is not units, deepspeed-2021 or fsdp2"), "%s", err);
    CHECK_EQ_INT(util_name_index("gpu", two, 2, err), -1);
    CHECK_MSG(!strcmp(err, "'gpu' is not cuda or cpu"), "%s", err);
    CHECK_EQ_INT(util_name_index(NULL, two, 1, err), -1);
    CHECK_MSG(!strcmp(err, "'' is not cuda"), "%s", err);
    CHECK_EQ_INT(util_name_index("cpu", two, 2, NULL), 1);
    CHECK_EQ_INT(util_name_index("x", two, 2, NULL), -1);
}
