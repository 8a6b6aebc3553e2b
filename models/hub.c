/* Models by name from the Hugging Face Hub: "hf:ORG/NAME[@REVISION]".
 *
 * config.json is fetched from $HF_ENDPOINT/ORG/NAME/resolve/REVISION/config.json
 * (default endpoint https://huggingface.co, revision main; the URL layout and
 * the variables are huggingface_hub's: HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE,
 * docs/source/en/package_reference/environment_variables.md), with HF_TOKEN as
 * a bearer token for gated and private models. The file is converted first
 * and cached only when the conversion succeeded, atomically, under
 * $XDG_CACHE_HOME/dhp/hf/ORG/NAME/REVISION/config.json (default ~/.cache/dhp):
 * a refused or partial answer never leaves a cache entry. A cached entry is
 * used without asking the network (delete it to fetch again); with
 * HF_HUB_OFFLINE set, only the cache is read. */
#include "models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define HUB_PREFIX "hf:"
#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"

bool model_hub_is_ref(const char *s)
{
    return s && !strncmp(s, HUB_PREFIX, strlen(HUB_PREFIX));
}

/* Hub repository ids: letters, digits, '-', '_', '.'; no "..", no leading '.'
 * or '-' (huggingface_hub validate_repo_id). The same rule keeps the cache
 * path inside the cache directory. */
static bool valid_part(const char *s, size_t n)
{
    if (n == 0 || n > 96 || s[0] == '.' || s[0] == '-') return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                  c == '_' || c == '.';
        if (!ok || (c == '.' && i + 1 < n && s[i + 1] == '.')) return false;
    }
    return true;
}

int model_hub_parse_ref(const char *ref, model_hub_ref *out, char *err)
{
    memset(out, 0, sizeof *out);
    if (!model_hub_is_ref(ref)) return util_fail(err, UTIL_EINVAL, "%s: not a hf:ORG/NAME reference", ref);
    const char *id = ref + strlen(HUB_PREFIX), *slash = strchr(id, '/'), *at = strchr(id, '@');
    if (!slash || (at && at < slash))
        return util_fail(err, UTIL_EINVAL, "%s: expected hf:ORG/NAME or hf:ORG/NAME@REVISION", ref);
    size_t org_n = (size_t)(slash - id);
    const char *name = slash + 1;
    size_t name_n = at ? (size_t)(at - name) : strlen(name);
    const char *rev = at ? at + 1 : "main";
    if (!valid_part(id, org_n) || !valid_part(name, name_n) || !valid_part(rev, strlen(rev)) ||
        memchr(name, '/', name_n))
        return util_fail(err, UTIL_EINVAL, "%s: organisation, name and revision may hold only letters, digits, "
                         "'-', '_' and '.' (no '..')", ref);
    memcpy(out->org, id, org_n);
    memcpy(out->name, name, name_n);
    util_strlcpy(out->revision, rev, sizeof out->revision);
    return UTIL_OK;
}

static bool env_true(const char *name)
{
    const char *v = getenv(name);
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

int model_hub_cache_dir(char *buf, size_t n, char *err)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w;
    if (xdg && xdg[0] == '/') w = snprintf(buf, n, "%s/dhp", xdg);
    else if (home && *home) w = snprintf(buf, n, "%s/.cache/dhp", home);
    else return util_fail(err, UTIL_EINVAL, "cache: neither XDG_CACHE_HOME (absolute) nor HOME is set");
    if (w < 0 || (size_t)w >= n) return util_fail(err, UTIL_EINVAL, "cache: directory path too long");
    return UTIL_OK;
}

static int entry_paths(const model_hub_ref *r, char *dir, char *file, size_t n, char *err)
{
    char base[1024];
    if (model_hub_cache_dir(base, sizeof base, err)) return UTIL_EINVAL;
    int w = snprintf(dir, n, "%s/hf/%s/%s/%s", base, r->org, r->name, r->revision);
    if (w < 0 || (size_t)w >= n || snprintf(file, n, "%s/config.json", dir) >= (int)n)
        return util_fail(err, UTIL_EINVAL, "cache: entry path too long");
    return UTIL_OK;
}

int model_hub_url(const model_hub_ref *r, char *url, size_t n, char *err)
{
    const char *ep = getenv("HF_ENDPOINT");
    if (!ep || !*ep) ep = HUB_DEFAULT_ENDPOINT;
    size_t len = strlen(ep);
    while (len > 0 && ep[len - 1] == '/') len--;
    int w = snprintf(url, n, "%.*s/%s/%s/resolve/%s/config.json", (int)len, ep, r->org, r->name, r->revision);
    if (w < 0 || (size_t)w >= n) return util_fail(err, UTIL_EINVAL, "HF_ENDPOINT: URL too long");
    return UTIL_OK;
}

static const char *hub_token(void)
{
    const char *t = getenv("HF_TOKEN");
    if (!t || !*t) t = getenv("HUGGING_FACE_HUB_TOKEN");   /* huggingface_hub's older name */
    return t && *t ? t : NULL;
}

/* GET config.json; the Hub's answers explained in one line. */
static int fetch(const char *ref, const char *url, char **text, char *err)
{
    util_http_opts o;
    util_http_opts_default(&o);
    o.bearer = hub_token();
    util_http_response r;
    char e[UTIL_ERR_LEN];
    if (util_http_request(NULL, url, NULL, &o, &r, e))
        return util_fail(err, UTIL_EIO, "%s: %s", ref, e);
    int rc = UTIL_OK;
    if (r.status == 401 || r.status == 403)
        rc = util_fail(err, UTIL_EIO, "%s: %s: HTTP %ld: gated or private model: set HF_TOKEN to a token that has "
                       "access (and accept the model's licence on its page)%s", ref, url, r.status,
                       o.bearer ? "; the HF_TOKEN given was refused" : "");
    else if (r.status == 404)
        rc = util_fail(err, UTIL_ENOTFOUND, "%s: %s: HTTP 404: no such model, revision or config.json", ref, url);
    else if (util_http_check_status(url, &r, e))
        rc = util_fail(err, UTIL_EIO, "%s: %s", ref, e);
    if (rc) { util_free(r.body); return rc; }
    *text = r.body;
    return UTIL_OK;
}

/* Converts text; on success the model is named after the repository. */
static int convert(const char *text, const char *what, const model_hub_ref *r, const char *source, model_t *m,
                   char *err)
{
    int rc = model_import_hf(text, what, m, err);
    if (rc) return rc;
    util_strlcpy(m->name, r->name, sizeof m->name);
    util_strlcpy(m->source, source, sizeof m->source);
    return UTIL_OK;
}

int model_hub_load(const char *ref, model_t *m, char *err)
{
    model_hub_ref r;
    char dir[1536], file[1600], url[2048], what[2200];
    int rc = model_hub_parse_ref(ref, &r, err);
    if (rc || (rc = entry_paths(&r, dir, file, sizeof dir, err)) || (rc = model_hub_url(&r, url, sizeof url, err)))
        return rc;
    char *text = NULL;
    if (access(file, F_OK) == 0) {
        if ((rc = util_read_text_file(file, UTIL_JSON_MAX_BYTES, &text, NULL, err))) return rc;
        snprintf(what, sizeof what, "%s (cached %s)", ref, file);
        rc = convert(text, what, &r, url, m, err);
        util_free(text);
        return rc;
    }
    if (env_true("HF_HUB_OFFLINE"))
        return util_fail(err, UTIL_ENOTFOUND, "%s: not in the cache (%s) and HF_HUB_OFFLINE is set", ref, file);
    if ((rc = fetch(ref, url, &text, err))) return rc;
    snprintf(what, sizeof what, "%s config.json", ref);
    rc = convert(text, what, &r, url, m, err);
    if (rc == UTIL_OK && (rc = util_mkdir_p(dir, err)) == UTIL_OK)
        rc = util_write_atomic(file, text, strlen(text), err);
    util_free(text);
    return rc;
}
