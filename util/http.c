/* HTTP(S) GET of a small document through libcurl (dhp import URL). */
#include "util.h"

#include <curl/curl.h>
#include <string.h>

#define HTTP_MAX_BYTES (16u << 20)

typedef struct { char *buf; size_t len; bool too_big; } http_sink;

static size_t sink_write(char *data, size_t size, size_t n, void *user)
{
    http_sink *s = user;
    size_t add = size * n;
    if (s->len + add > HTTP_MAX_BYTES) { s->too_big = true; return 0; }
    char *nb = util_realloc(s->buf, s->len + add + 1);
    if (!nb) return 0;
    memcpy(nb + s->len, data, add);
    s->buf = nb;
    s->len += add;
    s->buf[s->len] = '\0';
    return add;
}

int util_http_get(const char *url, char **out, size_t *len, char *err)
{
    CURL *curl = curl_easy_init();
    if (!curl) return util_fail(err, UTIL_ERUNTIME, "%s: cannot initialise libcurl", url);
    http_sink s = { util_malloc(1), 0, false };
    if (!s.buf) { curl_easy_cleanup(curl); return util_fail(err, UTIL_ENOMEM, "%s: out of memory", url); }
    s.buf[0] = '\0';
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 60L);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "dhp-import/1");
    CURLcode rc = curl_easy_perform(curl);
    long status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(curl);
    if (rc != CURLE_OK || status != 200) {
        util_free(s.buf);
        if (s.too_big) return util_fail(err, UTIL_EIO, "%s: larger than %u bytes", url, HTTP_MAX_BYTES);
        if (rc != CURLE_OK) return util_fail(err, UTIL_EIO, "%s: %s", url, curl_easy_strerror(rc));
        return util_fail(err, UTIL_EIO, "%s: HTTP status %ld", url, status);
    }
    *out = s.buf;
    if (len) *len = s.len;
    return UTIL_OK;
}
