#include "test.h"
#include "executor/executor.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

static int count_files(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p) { if (fscanf(p, "%d", &n) != 1) n = -1; pclose(p); }
    return n;
}

/* A hand-made safetensors file: header JSON as given, then data bytes. */
static void write_st(const char *path, const char *json, const void *data, size_t n, uint64_t claimed_len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return;
    uint64_t len = claimed_len ? claimed_len : strlen(json);
    unsigned char l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (unsigned char)(len >> (8 * i));
    fwrite(l8, 1, 8, f);
    fwrite(json, 1, strlen(json), f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* Opens path and returns the error code, leaving the message in err. */
static int open_err(const char *path, char *err)
{
    ex_ckpt *c = NULL;
    int rc = ex_ckpt_open(path, &c, err);
    ex_ckpt_close(c);
    return rc;
}

TEST(ckpt_round_trip_values_shapes_metadata)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "ckpt") == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    float w[6] = { 1.5f, -2.25f, 3e-8f, 1e30f, -0.0f, 7.0f }, bias[3] = { 0.1f, 0.2f, 0.3f }, step = 12.0f;
    ex_named_tensor t[3] = {
        { "blk.0.w", EX_DT_F32, 2, { 2, 3 }, w },
        { "blk.0.b", EX_DT_F32, 1, { 3 }, bias },
        { "scalar", EX_DT_F32, 0, { 0 }, &step },
    };
    const char *meta[] = { "step", "1234", "rng", "18446744073709551615" };
    CHECK_OK(ex_ckpt_write(path, t, 3, meta, 2, err));
    CHECK_EQ_INT(count_files(dir), 1);

    ex_ckpt *c;
    CHECK_OK(ex_ckpt_open(path, &c, err));
    CHECK_EQ_INT(ex_ckpt_count(c), 3);
    CHECK(strcmp(ex_ckpt_meta(c, "step"), "1234") == 0);
    CHECK(strcmp(ex_ckpt_meta(c, "rng"), "18446744073709551615") == 0);
    CHECK(ex_ckpt_meta(c, "nope") == NULL);
    const ex_ckpt_entry *e = ex_ckpt_find(c, "blk.0.w");
    CHECK(e && e->ndim == 2 && e->shape[0] == 2 && e->shape[1] == 3 && !strcmp(e->dtype, "F32"));
    CHECK(ex_ckpt_find(c, "scalar")->ndim == 0);
    ex_ckpt_close(c);

    float w2[6], b2[3], s2;
    ex_named_tensor r[3] = {
        { "scalar", EX_DT_F32, 0, { 0 }, &s2 },
        { "blk.0.w", EX_DT_F32, 2, { 2, 3 }, w2 },
        { "blk.0.b", EX_DT_F32, 1, { 3 }, b2 },
    };
    CHECK_OK(ex_ckpt_read_into(path, r, 3, err));
    CHECK(memcmp(w, w2, sizeof w) == 0 && memcmp(bias, b2, sizeof bias) == 0 && s2 == 12.0f);
    test_rm_tree(dir);
}

TEST(ckpt_bf16_rounds_to_nearest_even)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "ckpt") == 0);
    snprintf(path, sizeof path, "%s/bf.safetensors", dir);
    /* bf16 keeps 8 significand bits: spacing at 1.0 is 2^-7. */
    float v[5] = { 1.0f + 0x1p-8f,            /* tie -> even: 1.0 */
                   1.0f + 0x1p-7f + 0x1p-8f,  /* tie -> even: 1 + 2^-6 */
                   1.0f + 3 * 0x1p-9f,        /* above half -> 1 + 2^-7 */
                   -3.5f, 65536.0f };
    float want[5] = { 1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -3.5f, 65536.0f };
    ex_named_tensor t = { "v", EX_DT_BF16, 1, { 5 }, v };
    CHECK_OK(ex_ckpt_write(path, &t, 1, NULL, 0, err));
    float got[5];
    ex_named_tensor r = { "v", EX_DT_F32, 1, { 5 }, got };
    CHECK_OK(ex_ckpt_read_into(path, &r, 1, err));
    for (int i = 0; i < 5; i++) CHECK_MSG(got[i] == want[i], "v[%d] = %.9g, want %.9g", i, got[i], want[i]);
    ex_ckpt *c;
    CHECK_OK(ex_ckpt_open(path, &c, err));
    CHECK(strcmp(ex_ckpt_entry_at(c, 0)->dtype, "BF16") == 0);
    ex_ckpt_close(c);
    test_rm_tree(dir);
}

TEST(ckpt_truncated_file_is_rejected)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "ckpt") == 0);
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    float v[16] = { 0 };
    ex_named_tensor t = { "v", EX_DT_F32, 1, { 16 }, v };
    CHECK_OK(ex_ckpt_write(path, &t, 1, NULL, 0, err));
    char *buf; size_t len;
    CHECK_OK(util_read_file(path, &buf, &len, err));
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    fwrite(buf, 1, len - 4, f);
    fclose(f);
    util_free(buf);
    int rc = open_err(path, err);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, path) && strstr(err, "'v'") && strstr(err, "out of range"), "err: %s", err);
    f = fopen(path, "wb");
    fwrite("\x10\0\0", 1, 3, f);
    fclose(f);
    rc = open_err(path, err);
    test_rm_tree(dir);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "truncated"), "err: %s", err);
}

TEST(ckpt_header_length_past_eof)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "ckpt") == 0);
    snprintf(path, sizeof path, "%s/h.safetensors", dir);
    write_st(path, "{}", NULL, 0, 1000);
    int rc = open_err(path, err);
    test_rm_tree(dir);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "header length 1000") && strstr(err, "past end of file"), "err: %s", err);
}

TEST(ckpt_bad_json_and_bad_entries)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "ckpt") == 0);
    snprintf(path, sizeof path, "%s/j.safetensors", dir);
    float d[4] = { 1, 2, 3, 4 };
    struct { const char *json; const char *want; } cases[] = {
        { "{\"a\": {\"dtype\": \"F32\",", "header" },
        { "[1, 2]", "must be an object" },
        { "{\"a\": {\"dtype\": \"Q4\", \"shape\": [4], \"data_offsets\": [0, 16]}}", "unknown dtype" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [-4], \"data_offsets\": [0, 16]}}", "shape" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0]}}", "data_offsets" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 32]}}", "out of range" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [8, 4]}}", "out of range" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}", "needs 12 bytes" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
          " \"b\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [4, 16]}}", "overlap" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
          " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [12, 16]}}", "hole" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", "tensors cover 8" },
        { "{\"__metadata__\": {\"step\": 3}, \"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}",
          "__metadata__.step" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_st(path, cases[i].json, d, sizeof d, 0);
        int rc = open_err(path, err);
        if (rc != UTIL_EINVAL || !strstr(err, cases[i].want) || !strstr(err, path)) {
            test_rm_tree(dir);
            CHECK_MSG(0, "case %zu: rc %d, err '%s', wanted '%s'", i, rc, err, cases[i].want);
        }
    }
    test_rm_tree(dir);
}

TEST(ckpt_dtype_and_shape_mismatch_name_the_tensor)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "ckpt") == 0);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    int32_t ints[4] = { 1, 2, 3, 4 };
    write_st(path, "{\"ids\": {\"dtype\": \"I32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", ints, sizeof ints, 0);
    float buf[8];
    ex_named_tensor want = { "ids", EX_DT_F32, 1, { 4 }, buf };
    int rc = ex_ckpt_read_into(path, &want, 1, err);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "'ids'") && strstr(err, "dtype I32"), "err: %s", err);

    float w[6] = { 0 };
    ex_named_tensor t[2] = { { "w", EX_DT_F32, 2, { 2, 3 }, w }, { "b", EX_DT_F32, 1, { 2 }, w } };
    CHECK_OK(ex_ckpt_write(path, t, 2, NULL, 0, err));
    ex_named_tensor wrong_shape[2] = { { "w", EX_DT_F32, 2, { 3, 2 }, buf }, { "b", EX_DT_F32, 1, { 2 }, buf } };
    rc = ex_ckpt_read_into(path, wrong_shape, 2, err);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "'w'") && strstr(err, "[2,3]") && strstr(err, "[3,2]"), "err: %s", err);
    ex_named_tensor missing[2] = { { "w", EX_DT_F32, 2, { 2, 3 }, buf }, { "c", EX_DT_F32, 1, { 2 }, buf } };
    rc = ex_ckpt_read_into(path, missing, 2, err);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "'c'") && strstr(err, "missing"), "err: %s", err);
    rc = ex_ckpt_read_into(path, t, 1, err);
    test_rm_tree(dir);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "'b'") && strstr(err, "not in the model"), "err: %s", err);
}

TEST(ckpt_write_rejects_bad_tensors)
{
    char err[UTIL_ERR_LEN];
    float v[2] = { 0 };
    ex_named_tensor dup[2] = { { "a", EX_DT_F32, 1, { 2 }, v }, { "a", EX_DT_F32, 1, { 2 }, v } };
    CHECK(ex_ckpt_write("/tmp/dhp-never.safetensors", dup, 2, NULL, 0, err) == UTIL_EINVAL && strstr(err, "twice"));
    ex_named_tensor neg = { "n", EX_DT_F32, 1, { -1 }, v };
    CHECK(ex_ckpt_write("/tmp/dhp-never.safetensors", &neg, 1, NULL, 0, err) == UTIL_EINVAL && strstr(err, "'n'"));
    CHECK(access("/tmp/dhp-never.safetensors", F_OK) != 0);
}

TEST(ckpt_write_to_unwritable_dir_leaves_nothing)
{
    char dir[64], path[160], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "ckpt") == 0);
    /* A regular file used as a directory fails even for root. */
    snprintf(path, sizeof path, "%s/plainfile", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fclose(f);
    snprintf(path, sizeof path, "%s/plainfile/c.safetensors", dir);
    float v[2] = { 1, 2 };
    ex_named_tensor t = { "v", EX_DT_F32, 1, { 2 }, v };
    int rc = ex_ckpt_write(path, &t, 1, NULL, 0, err);
    int files = count_files(dir);
    test_rm_tree(dir);
    CHECK_EQ_INT(rc, UTIL_EIO);
    CHECK_MSG(strstr(err, path) != NULL, "err: %s", err);
    CHECK_EQ_INT(files, 1);
}

TEST(ckpt_failed_write_keeps_the_old_checkpoint)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "ckpt") == 0);
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    float small[4] = { 1, 2, 3, 4 };
    ex_named_tensor t = { "v", EX_DT_F32, 1, { 4 }, small };
    CHECK_OK(ex_ckpt_write(path, &t, 1, NULL, 0, err));
    /* Make the next, larger write fail midway with EFBIG (file size limit). */
    size_t n = 1 << 16;
    float *big = calloc(n, sizeof *big);
    CHECK(big != NULL);
    ex_named_tensor tb = { "v", EX_DT_F32, 1, { (int64_t)n }, big };
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 4096;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    int rc = ex_ckpt_write(path, &tb, 1, NULL, 0, err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    free(big);
    int files = count_files(dir);
    float back[4] = { 0 };
    ex_named_tensor r = { "v", EX_DT_F32, 1, { 4 }, back };
    char err2[UTIL_ERR_LEN];
    int rc2 = ex_ckpt_read_into(path, &r, 1, err2);
    test_rm_tree(dir);
    CHECK_EQ_INT(rc, UTIL_EIO);
    CHECK_MSG(strstr(err, "write failed"), "err: %s", err);
    CHECK_EQ_INT(files, 1);
    CHECK_EQ_INT(rc2, UTIL_OK);
    CHECK(memcmp(back, small, sizeof small) == 0);
}
