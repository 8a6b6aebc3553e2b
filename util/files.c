/* Whole-file input and output with the limits every reader and writer of dhp
 * shares: inputs are regular files of bounded size (FIFOs and devices are
 * refused before a byte is read), outputs replace regular files atomically
 * and write non-regular targets (a terminal, a pipe, /dev/null, "-") in place.
 *
 * Fault injection for the reliability tests (README, "Reliability"), read
 * once from the environment; every byte dhp writes to a file goes through
 * util_write_all:
 *   DHP_FAULT_ENOSPC_AFTER=N  writes fail with ENOSPC (a full disk) once N
 *                             bytes have been written by this process;
 *   DHP_FAULT_KILL_AFTER=N    the process kills itself with SIGKILL once N
 *                             bytes have been written (a crash mid-write). */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- fault injection ---- */

static long long fault_limit(const char *name)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v) return -1;
    long long n = strtoll(v, &end, 10);
    return *end || n < 0 ? -1 : n;
}

static long long g_written, g_enospc_after = -2, g_kill_after = -2;

/* How many of `len` bytes may be written before an injected fault; sets
 * *fault to the errno to fail with (0: none, -1: kill). */
static size_t fault_allowance(size_t len, int *fault)
{
    if (g_enospc_after == -2) {
        g_enospc_after = fault_limit("DHP_FAULT_ENOSPC_AFTER");
        g_kill_after = fault_limit("DHP_FAULT_KILL_AFTER");
    }
    *fault = 0;
    size_t allow = len;
    long long limits[2] = { g_kill_after, g_enospc_after };
    for (int i = 0; i < 2; i++) {
        if (limits[i] < 0) continue;
        long long left = limits[i] > g_written ? limits[i] - g_written : 0;
        if ((unsigned long long)left < allow) { allow = (size_t)left; *fault = i == 0 ? -1 : ENOSPC; }
    }
    return allow;
}

void util_fault_inject(long long enospc_after, long long kill_after)
{
    g_enospc_after = enospc_after;
    g_kill_after = kill_after;
    g_written = 0;
}

int util_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    int fault;
    size_t allow = fault_allowance(len, &fault);
    while (len > 0) {
        if (allow == 0 && fault) {
            if (fault < 0) raise(SIGKILL);
            errno = fault;
            return -1;
        }
        ssize_t w = write(fd, p, allow < len ? allow : len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
        allow -= (size_t)w;
        g_written += w;
    }
    return 0;
}

/* ---- input ---- */

static const char *file_kind(mode_t m)
{
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

int util_read_file_max(const char *path, size_t max, char **out, size_t *len, char *err)
{
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO without a writer would block */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return util_fail(err, UTIL_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = util_fail(err, UTIL_EIO, "%s: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return util_fail(err, UTIL_EINVAL, "%s: is %s, not a regular file: refused", path, file_kind(st.st_mode));
    }
    if ((unsigned long long)st.st_size > max) {
        close(fd);
        return util_fail(err, UTIL_EINVAL, "%s: %lld bytes, above the %zu-byte limit for this input: refused",
                         path, (long long)st.st_size, max);
    }
    size_t size = (size_t)st.st_size, n = 0;
    char *buf = util_malloc(size + 1);
    if (!buf) { close(fd); return util_fail(err, UTIL_ENOMEM, "%s: out of memory for %zu bytes", path, size); }
    while (n < size) {
        ssize_t got = read(fd, buf + n, size - n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
    }
    char extra;
    ssize_t more = n == size ? read(fd, &extra, 1) : 0;
    close(fd);
    if (n != size || more != 0) {
        util_free(buf);
        return util_fail(err, UTIL_EIO, "%s: changed size while being read (%zu bytes expected)", path, size);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return UTIL_OK;
}

int util_read_file(const char *path, char **out, size_t *len, char *err)
{
    return util_read_file_max(path, (size_t)SSIZE_MAX, out, len, err);
}

int util_read_text_file(const char *path, size_t max, char **out, size_t *len, char *err)
{
    size_t n;
    int rc = util_read_file_max(path, max, out, &n, err);
    if (rc) return rc;
    const char *nul = memchr(*out, '\0', n);
    if (nul) {
        size_t at = (size_t)(nul - *out);
        util_free(*out);
        *out = NULL;
        return util_fail(err, UTIL_EINVAL, "%s: NUL byte at offset %zu: not a text file", path, at);
    }
    if (len) *len = n;
    return UTIL_OK;
}

/* ---- output ---- */

static int g_stdout_fd = STDOUT_FILENO;

void util_set_stdout_fd(int fd) { g_stdout_fd = fd; }

int util_write_atomic(const char *path, const void *data, size_t len, char *err)
{
    size_t plen = strlen(path);
    char *tmp = util_malloc(plen + 16);
    if (!tmp) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    snprintf(tmp, plen + 16, "%s" UTIL_TMP_INFIX "XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int rc = util_fail(err, UTIL_EIO, "%s: cannot create: %s", path, strerror(errno));
        util_free(tmp);
        return rc;
    }
    (void)fchmod(fd, 0644);
    int rc = UTIL_OK;
    if (util_write_all(fd, data, len)) rc = util_fail(err, UTIL_EIO, "%s: write failed: %s", path, strerror(errno));
    else if (fsync(fd) != 0) rc = util_fail(err, UTIL_EIO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) != 0 && !rc) rc = util_fail(err, UTIL_EIO, "%s: close failed: %s", path, strerror(errno));
    if (!rc && rename(tmp, path) != 0) rc = util_fail(err, UTIL_EIO, "%s: rename failed: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    util_free(tmp);
    return rc;
}

static bool same_file_as_fd(const struct stat *st, int fd)
{
    struct stat o;
    return fstat(fd, &o) == 0 && o.st_dev == st->st_dev && o.st_ino == st->st_ino;
}

static int write_fd_all(int fd, const char *what, const void *data, size_t len, char *err)
{
    if (fd == g_stdout_fd || fd == STDOUT_FILENO) fflush(stdout);
    if (util_write_all(fd, data, len)) return util_fail(err, UTIL_EIO, "%s: write failed: %s", what, strerror(errno));
    return UTIL_OK;
}

int util_write_output(const char *path, const void *data, size_t len, char *err)
{
    if (!strcmp(path, "-")) return write_fd_all(g_stdout_fd, "stdout", data, len, err);
    struct stat st;
    if (stat(path, &st) != 0) return util_write_atomic(path, data, len, err);
    if (S_ISDIR(st.st_mode)) return util_fail(err, UTIL_EIO, "%s: is a directory", path);
    /* /dev/stdout of a run redirected into a file: append where stdout is, not replace the file under it */
    if (same_file_as_fd(&st, g_stdout_fd)) return write_fd_all(g_stdout_fd, path, data, len, err);
    if (!S_ISREG(st.st_mode)) {
        int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) return util_fail(err, UTIL_EIO, "%s: cannot open: %s", path, strerror(errno));
        int rc = write_fd_all(fd, path, data, len, err);
        if (close(fd) != 0 && !rc) rc = util_fail(err, UTIL_EIO, "%s: close failed: %s", path, strerror(errno));
        return rc;
    }
    /* a symbolic link to a regular file: replace the file it names, keep the link */
    char *target = realpath(path, NULL);
    if (!target) return util_fail(err, UTIL_EIO, "%s: %s", path, strerror(errno));
    int rc = util_write_atomic(target, data, len, err);
    free(target);
    return rc;
}

/* The directory part of path ("." if none) into buf. */
static void parent_dir(const char *path, char *buf, size_t n)
{
    const char *slash = strrchr(path, '/');
    if (!slash) { util_strlcpy(buf, ".", n); return; }
    size_t len = slash == path ? 1 : (size_t)(slash - path);
    if (len >= n) len = n - 1;
    memcpy(buf, path, len);
    buf[len] = '\0';
}

/* Creating (and removing) a file is the only test of writability that holds
 * for root, read-only mounts and full quotas alike. */
static int probe_dir(const char *dir, const char *what, char *err)
{
    char probe[PATH_MAX];
    if (snprintf(probe, sizeof probe, "%s/.dhp-probe" UTIL_TMP_INFIX "XXXXXX", dir) >= (int)sizeof probe)
        return util_fail(err, UTIL_EINVAL, "%s: path too long", what);
    int fd = mkstemp(probe);
    if (fd < 0) return util_fail(err, UTIL_EIO, "%s: cannot write in %s: %s", what, dir, strerror(errno));
    close(fd);
    unlink(probe);
    return UTIL_OK;
}

int util_check_output(const char *path, char *err)
{
    if (!strcmp(path, "-")) return UTIL_OK;
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return util_fail(err, UTIL_EIO, "%s: is a directory", path);
        if (!S_ISREG(st.st_mode)) {
            int fd = open(path, O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
            if (fd < 0 && errno != ENXIO)   /* ENXIO: a FIFO with no reader yet */
                return util_fail(err, UTIL_EIO, "%s: cannot write: %s", path, strerror(errno));
            if (fd >= 0) close(fd);
            return UTIL_OK;
        }
    } else if (errno != ENOENT) {
        return util_fail(err, UTIL_EIO, "%s: %s", path, strerror(errno));
    }
    char dir[PATH_MAX];
    parent_dir(path, dir, sizeof dir);
    return probe_dir(dir, path, err);
}

int util_mkdir_writable(const char *path, char *err)
{
    int rc = util_mkdir_p(path, err);
    return rc ? rc : probe_dir(path, path, err);
}
