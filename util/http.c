/* HTTP(S) requests through libcurl: dhp import URL, the Hugging Face Hub
 * (models/hub.c) and Ray's REST APIs (cli/cmd_launch.c).
 *
 * Every request is bounded: a connect timeout, a total timeout, a low-speed
 * timeout (a server that trickles or stalls), a cap on the response size
 * (streamed into memory and cut at the cap, also refused up front when
 * Content-Length says more), and at most max_redirects redirects. Redirects
 * are followed here, not by libcurl, so that each hop is checked against the
 * same rule as the first URL: https, or http only to a loopback host (a test
 * server, a local Ray head); never from https down to http. A bearer token is
 * sent to the first URL's host only. Proxies come from libcurl's own
 * http_proxy / https_proxy / no_proxy environment variables. */
#include "util.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define HTTP_DEFAULT_MAX_BYTES (16u << 20)

typedef struct { char *buf; size_t len, cap_bytes; bool too_big; } http_sink;

static size_t sink_write(char *data, size_t size, size_t n, void *user)
{
    http_sink *s = user;
    size_t add = size * n;
    if (add > s->cap_bytes - s->len) { s->too_big = true; return 0; }
    char *nb = util_realloc(s->buf, s->len + add + 1);
    if (!nb) return 0;
    memcpy(nb + s->len, data, add);
    s->buf = nb;
    s->len += add;
    s->buf[s->len] = '\0';
    return add;
}

/* A positive integer from the environment, else dflt. */
static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    return *end == '\0' && x > 0 ? x : dflt;
}

void util_http_opts_default(util_http_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_bytes = (size_t)env_long("DHP_HTTP_MAX_BYTES", HTTP_DEFAULT_MAX_BYTES);
    o->connect_timeout_s = env_long("DHP_HTTP_CONNECT_TIMEOUT", 10);
    o->timeout_s = env_long("DHP_HTTP_TIMEOUT", 60);
    o->low_speed_bytes = 1024;
    o->low_speed_time_s = env_long("DHP_HTTP_LOW_SPEED_TIME", 15);
    o->max_redirects = env_long("DHP_HTTP_MAX_REDIRECTS", 5);
}

/* Scheme and host of url; false when libcurl cannot parse it. */
static bool url_parts(const char *url, char *scheme, size_t ns, char *host, size_t nh)
{
    CURLU *u = curl_url();
    if (!u) return false;
    char *sc = NULL, *h = NULL;
    bool ok = curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_SCHEME, &sc, 0) == CURLUE_OK &&
              curl_url_get(u, CURLUPART_HOST, &h, 0) == CURLUE_OK;
    if (ok) { util_strlcpy(scheme, sc, ns); util_strlcpy(host, h, nh); }
    curl_free(sc);
    curl_free(h);
    curl_url_cleanup(u);
    return ok;
}

bool util_http_host_is_loopback(const char *host)
{
    return !strcasecmp(host, "localhost") || !strcmp(host, "[::1]") || !strcmp(host, "::1") ||
           !strncmp(host, "127.", 4);
}

/* The rule every hop must pass; prev_scheme is NULL for the first URL. */
static int check_url(const char *url, const char *prev_scheme, char *scheme, char *host, size_t n, char *err)
{
    if (!url_parts(url, scheme, n, host, n)) return util_fail(err, UTIL_EINVAL, "%s: not a valid URL", url);
    if (!strcasecmp(scheme, "https")) return UTIL_OK;
    if (strcasecmp(scheme, "http"))
        return util_fail(err, UTIL_EINVAL, "%s: scheme '%s' is not http or https", url, scheme);
    if (prev_scheme && !strcasecmp(prev_scheme, "https"))
        return util_fail(err, UTIL_EINVAL, "%s: redirect from https down to http refused", url);
    if (!util_http_host_is_loopback(host))
        return util_fail(err, UTIL_EINVAL, "%s: plain http is allowed to a loopback host only; use https", url);
    return UTIL_OK;
}

/* One request without following redirects. *location gets the redirect
 * target (curl_free it) for 3xx answers. */
static int perform(CURL *curl, const char *url, const char *method, const char *body, const char *bearer,
                   const util_http_opts *o, http_sink *s, long *status, char **location, char *err)
{
    char cerr[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdr = NULL;
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, o->connect_timeout_s);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, o->timeout_s);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, o->low_speed_bytes);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, o->low_speed_time_s);
    curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)o->max_bytes);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, "dhp/0.1");
    const char *ca = getenv("CURL_CA_BUNDLE");   /* as the curl tool and Python requests honour it */
    if (ca && *ca) curl_easy_setopt(curl, CURLOPT_CAINFO, ca);
    if (bearer) {
        curl_easy_setopt(curl, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
        curl_easy_setopt(curl, CURLOPT_XOAUTH2_BEARER, bearer);
    }
    if (body) {
        hdr = curl_slist_append(hdr, "Content-Type: application/json");
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    }
    if (method) curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    CURLcode rc = curl_easy_perform(curl);
    curl_slist_free_all(hdr);
    *status = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, status);
    if (rc == CURLE_FILESIZE_EXCEEDED || (rc == CURLE_WRITE_ERROR && s->too_big))
        return util_fail(err, UTIL_EIO, "%s: response larger than the %zu-byte cap (DHP_HTTP_MAX_BYTES)", url,
                         o->max_bytes);
    if (rc == CURLE_OPERATION_TIMEDOUT)
        return util_fail(err, UTIL_EIO, "%s: timed out (%s; limits: DHP_HTTP_TIMEOUT %ld s, under %ld B/s for "
                         "DHP_HTTP_LOW_SPEED_TIME %ld s)", url, cerr[0] ? cerr : "no answer", o->timeout_s,
                         o->low_speed_bytes, o->low_speed_time_s);
    if (rc != CURLE_OK)
        return util_fail(err, UTIL_EIO, "%s: %s", url, cerr[0] ? cerr : curl_easy_strerror(rc));
    *location = NULL;
    char *loc = NULL;
    if (*status >= 300 && *status < 400 && curl_easy_getinfo(curl, CURLINFO_REDIRECT_URL, &loc) == CURLE_OK && loc)
        *location = strdup(loc);
    return UTIL_OK;
}

static const char *status_text(long status)
{
    switch (status) {
    case 400: return "bad request";
    case 401: return "unauthorized";
    case 403: return "forbidden";
    case 404: return "not found";
    case 429: return "too many requests";
    default: return status >= 500 ? "server error" : "unexpected status";
    }
}

int util_http_request(const char *method, const char *url, const char *body, const util_http_opts *opts,
                      util_http_response *resp, char *err)
{
    util_http_opts dflt;
    if (!opts) { util_http_opts_default(&dflt); opts = &dflt; }
    memset(resp, 0, sizeof *resp);
    char scheme[16], host[256], first_host[256], cur[2048];
    if (strlen(url) >= sizeof cur) return util_fail(err, UTIL_EINVAL, "URL longer than %zu characters", sizeof cur - 1);
    int rc = check_url(url, NULL, scheme, host, sizeof host, err);
    if (rc) return rc;
    util_strlcpy(first_host, host, sizeof first_host);
    util_strlcpy(cur, url, sizeof cur);
    CURL *curl = curl_easy_init();
    if (!curl) return util_fail(err, UTIL_ERUNTIME, "%s: cannot initialise libcurl", url);
    http_sink s = { NULL, 0, opts->max_bytes, false };
    long status = 0;
    for (long hops = 0;; hops++) {
        util_free(s.buf);
        s.buf = util_malloc(1);
        s.len = 0;
        if (!s.buf) { rc = util_fail(err, UTIL_ENOMEM, "%s: out of memory", cur); break; }
        s.buf[0] = '\0';
        char *location = NULL;
        /* The token goes to the host it was given for, not to a redirect's other host. */
        const char *bearer = opts->bearer && !strcasecmp(host, first_host) ? opts->bearer : NULL;
        rc = perform(curl, cur, method, body, bearer, opts, &s, &status, &location, err);
        if (rc || !location) { free(location); break; }
        if (hops + 1 > opts->max_redirects) {
            free(location);
            rc = util_fail(err, UTIL_EIO, "%s: more than %ld redirects (DHP_HTTP_MAX_REDIRECTS)", url,
                           opts->max_redirects);
            break;
        }
        char prev[16];
        util_strlcpy(prev, scheme, sizeof prev);
        if (strlen(location) >= sizeof cur) {
            free(location);
            rc = util_fail(err, UTIL_EIO, "%s: redirect target longer than %zu characters", url, sizeof cur - 1);
            break;
        }
        util_strlcpy(cur, location, sizeof cur);
        free(location);
        if ((rc = check_url(cur, prev, scheme, host, sizeof host, err))) break;
        /* a redirected POST becomes a GET (303, and what browsers do for 301/302) */
        if (status != 307 && status != 308) { body = NULL; method = NULL; }
    }
    curl_easy_cleanup(curl);
    resp->status = status;
    if (rc) { util_free(s.buf); return rc; }
    resp->body = s.buf;
    resp->len = s.len;
    return UTIL_OK;
}

int util_http_check_status(const char *url, const util_http_response *r, char *err)
{
    if (r->status >= 200 && r->status < 300) return UTIL_OK;
    /* The first line of the body often says why (Ray, the Hub); keep it short and printable. */
    char why[160] = "";
    if (r->body) {
        size_t n = 0;
        for (const char *c = r->body; *c && *c != '\n' && n + 1 < sizeof why; c++)
            why[n++] = (*c >= 32 && *c < 127) ? *c : ' ';
        why[n] = '\0';
    }
    return util_fail(err, UTIL_EIO, "%s: HTTP %ld (%s)%s%s", url, r->status, status_text(r->status),
                     why[0] ? ": " : "", why);
}

int util_http_get(const char *url, char **out, size_t *len, char *err)
{
    util_http_response r;
    int rc = util_http_request(NULL, url, NULL, NULL, &r, err);
    if (rc) return rc;
    if ((rc = util_http_check_status(url, &r, err))) { util_free(r.body); return rc; }
    *out = r.body;
    if (len) *len = r.len;
    return UTIL_OK;
}
