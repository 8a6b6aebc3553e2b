/* util's limits on untrusted input and its output rules (issue: hardened
 * against bad input): file kinds and sizes, JSON checks, names, the hash
 * map, the CRC, outputs written in place, the write-failure injection. */
#include "test.h"
#include "util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int put_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

TEST(util_read_refuses_fifo_device_directory_without_blocking)
{
    char dir[64], fifo[128], err[UTIL_ERR_LEN], *text;
    CHECK(test_tmp_dir(dir, sizeof dir, "limits") == 0);
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    /* no writer: a plain open would block forever */
    CHECK(util_read_file(fifo, &text, NULL, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "FIFO") && strstr(err, "refused"), "err: %s", err);
    CHECK(util_read_text_file("/dev/zero", UTIL_JSON_MAX_BYTES, &text, NULL, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "/dev/zero") && strstr(err, "character device"), "err: %s", err);
    CHECK(util_read_file(dir, &text, NULL, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "directory"), "err: %s", err);
    test_rm_tree(dir);
}

TEST(util_read_caps_size_and_refuses_nul_in_text)
{
    char dir[64], path[128], err[UTIL_ERR_LEN], *text;
    CHECK(test_tmp_dir(dir, sizeof dir, "limits") == 0);
    snprintf(path, sizeof path, "%s/big.json", dir);
    CHECK(put_file(path, "{\"a\": 1}\n       ", 16) == 0);
    CHECK(util_read_text_file(path, 15, &text, NULL, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "16 bytes") && strstr(err, "15-byte limit"), "err: %s", err);
    size_t n;
    CHECK_OK(util_read_text_file(path, 16, &text, &n, err));
    CHECK_EQ_INT(n, 16);
    util_free(text);
    CHECK(put_file(path, "{\"a\": 1}\0{\"b\"", 14) == 0);
    CHECK(util_read_text_file(path, 100, &text, NULL, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "NUL byte at offset 8"), "err: %s", err);
    cJSON *root;
    CHECK(util_json_read(path, &root, err) == UTIL_EINVAL);
    test_rm_tree(dir);
}

static int parse_err(const char *text, char *err)
{
    cJSON *root = NULL;
    int rc = util_json_parse(text, "t.json", &root, err);
    cJSON_Delete(root);
    return rc;
}

TEST(util_json_refuses_duplicate_keys_nul_bad_utf8_and_deep_nesting)
{
    char err[UTIL_ERR_LEN];
    CHECK(parse_err("{\"a\": 1, \"b\": {\"c\": 2, \"c\": 3}}", err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "key 'c' appears twice in b"), "err: %s", err);
    CHECK(parse_err("{\"m\": [{\"x\": 1}, {\"x\": 1, \"x\": 2}]}", err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "appears twice in m[1]"), "err: %s", err);
    /* a large object goes through the hash set */
    char big[4096] = "{";
    for (int i = 0; i < 100; i++) snprintf(big + strlen(big), sizeof big - strlen(big), "\"k%d\": %d, ", i, i);
    strcat(big, "\"k57\": 0}");
    CHECK(parse_err(big, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "key 'k57' appears twice in the top-level object"), "err: %s", err);
    CHECK(parse_err("{\"name\": \"ab\\u0000cd\"}", err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "NUL character") && strstr(err, "line 1"), "err: %s", err);
    CHECK_OK(parse_err("{\"name\": \"ab\\\\u0000cd\"}", err));   /* an escaped backslash, then text */
    CHECK(parse_err("{\"name\":\n \"\xff\xfe\"}", err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "invalid UTF-8") && strstr(err, "line 2"), "err: %s", err);
    CHECK(parse_err("{\"name\": \"\xed\xa0\x80\"}", err) == UTIL_EINVAL);   /* an encoded surrogate */
    CHECK(parse_err("{\"name\": \"a\x1b[31mb\"}", err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "control character"), "err: %s", err);
    CHECK_OK(parse_err("{\"name\": \"caf\xc3\xa9 \xe2\x82\xac\"}", err));
    char deep[200] = "";
    for (int i = 0; i < UTIL_JSON_MAX_DEPTH; i++) strcat(deep, "[");
    for (int i = 0; i < UTIL_JSON_MAX_DEPTH; i++) strcat(deep, "]");
    CHECK_OK(parse_err(deep, err));
    char deeper[200] = "[";
    strcat(deeper, deep);
    strcat(deeper, "]");
    CHECK(parse_err(deeper, err) == UTIL_EINVAL);
    CHECK_MSG(strstr(err, "nesting deeper than 64 levels"), "err: %s", err);
}

TEST(util_names_and_text_and_scrubbed_errors)
{
    CHECK(util_name_ok("vision") && util_name_ok("qwen2.5-vl_32b") && util_name_ok("A9"));
    CHECK(!util_name_ok("") && !util_name_ok("../../../X") && !util_name_ok("a/b") && !util_name_ok(".hidden"));
    CHECK(!util_name_ok("-rf") && !util_name_ok("a b") && !util_name_ok("caf\xc3\xa9"));
    CHECK(util_text_ok("H100 SXM (80 GB) caf\xc3\xa9"));
    CHECK(!util_text_ok("red\x1b[31m") && !util_text_ok("tab\there") && !util_text_ok("\xc2\x9b" "31m") && !util_text_ok("\xff"));
    char err[UTIL_ERR_LEN];
    util_fail(err, UTIL_EINVAL, "model '%s': bad", "x\x1b]0;pwned\x07y\nz\xff");
    CHECK_MSG(!strcmp(err, "model 'x?]0;pwned?y?z?': bad"), "err: %s", err);
}

TEST(util_crc32_matches_the_check_value_in_any_split)
{
    /* the CRC-32/ISO-HDLC check value of "123456789" */
    CHECK_EQ_INT(util_crc32(0, "123456789", 9), 0xCBF43926u);
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 131 + 7);
    uint32_t whole = util_crc32(0, buf, sizeof buf);
    for (size_t cut = 0; cut < 20; cut++) CHECK_EQ_INT(util_crc32(util_crc32(0, buf, cut), buf + cut, sizeof buf - cut), whole);
}

TEST(util_strmap_finds_every_key_and_refuses_repeats)
{
    util_strmap m;
    CHECK_OK(util_strmap_init(&m, 4));
    static char keys[20000][16];
    for (int i = 0; i < 20000; i++) {
        snprintf(keys[i], sizeof keys[i], "t.%d", i);
        CHECK_OK(util_strmap_put(&m, keys[i], i, NULL));
    }
    int old = -1;
    CHECK(util_strmap_put(&m, "t.123", 5, &old) == UTIL_EINVAL);
    CHECK_EQ_INT(old, 123);
    for (int i = 0; i < 20000; i += 7) CHECK_EQ_INT(util_strmap_get(&m, keys[i]), i);
    CHECK_EQ_INT(util_strmap_get(&m, "t.20000"), -1);
    util_strmap_free(&m);
}

TEST(util_output_dash_and_non_regular_targets_are_written_in_place)
{
    char dir[64], path[128], link[128], err[UTIL_ERR_LEN], *text;
    CHECK(test_tmp_dir(dir, sizeof dir, "limits") == 0);
    /* "-": the descriptor standing for stdout */
    snprintf(path, sizeof path, "%s/stdout.txt", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0);
    util_set_stdout_fd(fd);
    int rc = util_write_output("-", "to stdout\n", 10, err);
    util_set_stdout_fd(STDOUT_FILENO);
    close(fd);
    CHECK_OK(rc);
    CHECK_OK(util_read_file(path, &text, NULL, err));
    CHECK(!strcmp(text, "to stdout\n"));
    util_free(text);
    /* a character device stays one */
    CHECK_OK(util_write_output("/dev/null", "x", 1, err));
    struct stat st;
    CHECK(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
    /* a symbolic link keeps pointing at the file it names, which is replaced */
    snprintf(path, sizeof path, "%s/real.json", dir);
    snprintf(link, sizeof link, "%s/link.json", dir);
    CHECK(put_file(path, "old", 3) == 0 && symlink(path, link) == 0);
    CHECK_OK(util_write_output(link, "new", 3, err));
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK_OK(util_read_file(path, &text, NULL, err));
    CHECK(!strcmp(text, "new"));
    util_free(text);
    CHECK(util_write_output(dir, "x", 1, err) == UTIL_EIO);
    CHECK_MSG(strstr(err, "is a directory"), "err: %s", err);
    test_rm_tree(dir);
}

TEST(util_check_output_finds_missing_directories_before_any_work)
{
    char dir[64], path[160], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "limits") == 0);
    snprintf(path, sizeof path, "%s/missing/trace.json", dir);
    CHECK(util_check_output(path, err) == UTIL_EIO);
    CHECK_MSG(strstr(err, "missing") && strstr(err, "No such file"), "err: %s", err);
    snprintf(path, sizeof path, "%s/trace.json", dir);
    CHECK_OK(util_check_output(path, err));
    CHECK_OK(util_check_output("-", err));
    CHECK_OK(util_check_output("/dev/null", err));
    snprintf(path, sizeof path, "%s/a/b/c", dir);
    CHECK_OK(util_mkdir_writable(path, err));
    struct stat st;
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    test_rm_tree(dir);
}

TEST(util_atomic_write_under_a_full_disk_keeps_the_old_file)
{
    char dir[64], path[128], err[UTIL_ERR_LEN], *text;
    CHECK(test_tmp_dir(dir, sizeof dir, "limits") == 0);
    snprintf(path, sizeof path, "%s/latest", dir);
    CHECK_OK(util_write_atomic(path, "step-00000010\n", 14, err));
    util_fault_inject(5, -1);
    int rc = util_write_atomic(path, "step-00000020\n", 14, err);
    util_fault_inject(-1, -1);
    CHECK_EQ_INT(rc, UTIL_EIO);
    CHECK_MSG(strstr(err, "latest") && strstr(err, "No space left"), "err: %s", err);
    CHECK_OK(util_read_file(path, &text, NULL, err));
    CHECK(!strcmp(text, "step-00000010\n"));
    util_free(text);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) = 1", dir);
    CHECK_MSG(system(cmd) == 0, "a temp file was left in %s", dir);
    test_rm_tree(dir);
}
