/* Directory creation for the caches and outputs dhp writes. */
#include "util.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

int util_mkdir_p(const char *path, char *err)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return util_fail(err, UTIL_EINVAL, "%s: path empty or too long", path);
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        struct stat st;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return util_fail(err, UTIL_EIO, "%s: cannot create directory: %s", buf, strerror(errno));
        if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
            return util_fail(err, UTIL_EIO, "%s: exists and is not a directory", buf);
        if (c == '\0') break;
        *p = c;
    }
    return UTIL_OK;
}
