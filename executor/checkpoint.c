/* Checkpoints in the safetensors format
 * (https://github.com/huggingface/safetensors, README "Format"):
 *   8 bytes   N, unsigned little-endian 64-bit header size
 *   N bytes   UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end]},
 *             "__metadata__": {string: string}}, space-padded
 *   rest      the byte buffer; offsets are relative to its start, tensors
 *             are little-endian, row-major, and must cover it without holes
 *             or overlaps.
 * dhp adds checksums in the metadata, where any safetensors reader keeps
 * them: "crc32:<tensor>" = 8 hex digits, the CRC-32 of the tensor's bytes as
 * stored, and "meta_crc32", the CRC-32 of every other metadata key and value
 * (each NUL-terminated, in file order). A reader verifies what is there. */
#include "executor/bf16.h"
#include "executor/executor.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint I/O assumes a little-endian host");

/* The reference implementation refuses headers above 100 MB
 * (safetensors/src/tensor.rs, MAX_HEADER_SIZE). */
#define MAX_HEADER_BYTES (100u * 1000u * 1000u)
#define CHUNK_FLOATS 65536
#define CRC_PREFIX "crc32:"
#define META_CRC "meta_crc32"

/* Dtype names and element sizes from safetensors/src/tensor.rs (enum Dtype). */
static const struct { const char *name; int size; } dtypes[] = {
    { "BOOL", 1 }, { "U8", 1 }, { "I8", 1 }, { "F8_E5M2", 1 }, { "F8_E4M3", 1 },
    { "I16", 2 }, { "U16", 2 }, { "F16", 2 }, { "BF16", 2 }, { "I32", 4 }, { "U32", 4 },
    { "F32", 4 }, { "F64", 8 }, { "I64", 8 }, { "U64", 8 },
};

static int dtype_size(const char *name)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dtypes[i].name, name)) return dtypes[i].size;
    return 0;
}


/* IEEE binary16 -> binary32, exact (subnormals, infinities and NaNs included). */
static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, u;
    if (exp == 0x1F) u = sign | 0x7F800000u | (man << 13);
    else if (exp) u = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) u = sign;
    else {   /* subnormal: man * 2^-24, normalised */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Elements of a shape; a shape of a file is checked against the file's size
 * before anything else uses it, so the product fits (a zero dimension makes
 * it 0 whatever the others say). */
static int64_t shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) return 0;
    for (int i = 0; i < ndim; i++)
        if (!util_mul_i64(n, shape[i], &n)) return INT64_MAX;
    return n;
}

static bool reserved_key(const char *k)
{
    return !strncmp(k, CRC_PREFIX, strlen(CRC_PREFIX)) || !strcmp(k, META_CRC);
}

/* CRC-32 of the metadata pairs other than META_CRC, in order. */
static uint32_t meta_crc(const char *const *kv, int n)
{
    uint32_t crc = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(kv[2 * i], META_CRC)) continue;
        crc = util_crc32(crc, kv[2 * i], strlen(kv[2 * i]) + 1);
        crc = util_crc32(crc, kv[2 * i + 1], strlen(kv[2 * i + 1]) + 1);
    }
    return crc;
}

int64_t ex_ckpt_numel(const ex_ckpt_entry *e) { return shape_numel(e->ndim, e->shape); }

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* ---- writer ---- */

static int check_tensor(const char *path, const ex_named_tensor *t, char *err)
{
    if (!t->name || !t->name[0] || !strcmp(t->name, "__metadata__") || !util_text_ok(t->name))
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': name must be printable, non-empty and not __metadata__",
                         path, t->name ? t->name : "");
    if (t->dtype != EX_DT_F32 && t->dtype != EX_DT_BF16)
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': unknown dtype %d", path, t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > EX_CKPT_MAX_DIMS)
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': ndim %d outside [0, %d]", path, t->name, t->ndim, EX_CKPT_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0)
            return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': negative dimension %d", path, t->name, d);
    if (!t->data && shape_numel(t->ndim, t->shape) > 0)
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': no data", path, t->name);
    return UTIL_OK;
}

static int check_tensors(const char *path, const ex_named_tensor *t, int n, char *err)
{
    util_strmap seen;
    if (util_strmap_init(&seen, (size_t)n)) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    int rc = UTIL_OK;
    for (int i = 0; i < n && !rc; i++) {
        if ((rc = check_tensor(path, &t[i], err))) break;
        rc = util_strmap_put(&seen, t[i].name, i, NULL);
        if (rc == UTIL_EINVAL) rc = util_fail(err, UTIL_EINVAL, "%s: tensor name '%s' appears twice", path, t[i].name);
        else if (rc) rc = util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    }
    util_strmap_free(&seen);
    return rc;
}

/* Header JSON, space-padded so the byte buffer starts 8-byte aligned. */
static char *build_header(const ex_named_tensor *t, int n, const char *const *meta_kv, int n_meta, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    if (n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; i < n_meta; i++) cJSON_AddStringToObject(m, meta_kv[2 * i], meta_kv[2 * i + 1]);
        char crc[16];
        snprintf(crc, sizeof crc, "%08x", meta_crc(meta_kv, n_meta));
        cJSON_AddStringToObject(m, META_CRC, crc);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        cJSON_AddStringToObject(e, "dtype", t[i].dtype == EX_DT_BF16 ? "BF16" : "F32");
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        uint64_t bytes = (uint64_t)shape_numel(t[i].ndim, t[i].shape) * (t[i].dtype == EX_DT_BF16 ? 2 : 4);
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + bytes)));
        off += bytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return NULL;
    size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
    char *out = util_malloc(padded + 1);
    if (out) {
        memcpy(out, json, jl);
        memset(out + jl, ' ', padded - jl);
        out[padded] = 0;
        *len = padded;
    }
    free(json);
    return out;
}

/* The tensor's bytes as stored: written to fd (if >= 0) and summed into
 * *crc (if not NULL). */
static int tensor_bytes(int fd, const ex_named_tensor *t, uint32_t *crc)
{
    size_t numel = (size_t)shape_numel(t->ndim, t->shape);
    if (crc) *crc = 0;
    if (t->dtype == EX_DT_F32) {
        if (crc) *crc = util_crc32(0, t->data, numel * sizeof(float));
        return fd >= 0 ? util_write_all(fd, t->data, numel * sizeof(float)) : 0;
    }
    uint16_t buf[CHUNK_FLOATS];
    for (size_t i = 0; i < numel; i += CHUNK_FLOATS) {
        size_t k = numel - i < CHUNK_FLOATS ? numel - i : CHUNK_FLOATS;
        for (size_t j = 0; j < k; j++) buf[j] = ex_bf16_from_f32(t->data[i + j]);
        if (crc) *crc = util_crc32(*crc, buf, k * sizeof(uint16_t));
        if (fd >= 0 && util_write_all(fd, buf, k * sizeof(uint16_t))) return -1;
    }
    return 0;
}

/* The caller's metadata (reserved keys dropped: they are recomputed) and a
 * "crc32:<name>" pair per tensor; *kv and its strings are freed by free_meta. */
typedef struct { const char **kv; char **owned; int n, n_owned; } meta_list;

static void free_meta(meta_list *m)
{
    for (int i = 0; i < m->n_owned; i++) util_free(m->owned[i]);
    util_free(m->owned);
    util_free(m->kv);
}

static int checksum_meta(const ex_named_tensor *t, int n, const char *const *meta_kv, int n_meta, meta_list *m)
{
    memset(m, 0, sizeof *m);
    m->kv = util_calloc(2 * ((size_t)n + (size_t)n_meta) + 1, sizeof *m->kv);
    m->owned = util_calloc(2 * (size_t)n + 1, sizeof *m->owned);
    if (!m->kv || !m->owned) return UTIL_ENOMEM;
    for (int i = 0; i < n_meta; i++) {
        if (reserved_key(meta_kv[2 * i])) continue;
        m->kv[2 * m->n] = meta_kv[2 * i];
        m->kv[2 * m->n + 1] = meta_kv[2 * i + 1];
        m->n++;
    }
    for (int i = 0; i < n; i++) {
        uint32_t crc;
        tensor_bytes(-1, &t[i], &crc);
        size_t len = strlen(CRC_PREFIX) + strlen(t[i].name) + 1;
        char *key = util_malloc(len), *val = util_malloc(16);
        if (key) m->owned[m->n_owned++] = key;
        if (val) m->owned[m->n_owned++] = val;
        if (!key || !val) return UTIL_ENOMEM;
        snprintf(key, len, CRC_PREFIX "%s", t[i].name);
        snprintf(val, 16, "%08x", crc);
        m->kv[2 * m->n] = key;
        m->kv[2 * m->n + 1] = val;
        m->n++;
    }
    return UTIL_OK;
}

/* Makes the rename durable; failure to open the directory is not an error
 * for the checkpoint's content, so it is ignored. */
static void fsync_parent(const char *path)
{
    char *copy = util_strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY);
    if (fd >= 0) { (void)fsync(fd); close(fd); }
    util_free(copy);
}

int ex_ckpt_write(const char *path, const ex_named_tensor *t, int n,
                  const char *const *meta_kv, int n_meta, char *err)
{
    if (n < 0 || n_meta < 0) return util_fail(err, UTIL_EINVAL, "%s: negative tensor or metadata count", path);
    int rc = check_tensors(path, t, n, err);
    if (rc) return rc;
    for (int i = 0; i < n_meta; i++)
        if (!meta_kv[2 * i] || !meta_kv[2 * i + 1])
            return util_fail(err, UTIL_EINVAL, "%s: metadata pair %d has a NULL key or value", path, i);
    size_t hlen = 0;
    meta_list ml;
    char *header = checksum_meta(t, n, meta_kv, n_meta, &ml) ? NULL : build_header(t, n, ml.kv, ml.n, &hlen);
    free_meta(&ml);
    if (!header) return util_fail(err, UTIL_ENOMEM, "%s: out of memory for the header", path);

    size_t plen = strlen(path);
    char *tmp = util_malloc(plen + 16);
    if (!tmp) { util_free(header); return util_fail(err, UTIL_ENOMEM, "%s: out of memory", path); }
    snprintf(tmp, plen + 16, "%s" UTIL_TMP_INFIX "XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        rc = util_fail(err, UTIL_EIO, "%s: cannot create temp file: %s", path, strerror(errno));
        util_free(tmp); util_free(header);
        return rc;
    }
    (void)fchmod(fd, 0644);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    bool ok = !util_write_all(fd, len8, 8) && !util_write_all(fd, header, hlen);
    for (int i = 0; ok && i < n; i++) ok = !tensor_bytes(fd, &t[i], NULL);
    if (!ok) rc = util_fail(err, UTIL_EIO, "%s: write failed: %s", path, strerror(errno));
    else if (fsync(fd) != 0) rc = util_fail(err, UTIL_EIO, "%s: fsync failed: %s", path, strerror(errno));
    if (close(fd) != 0 && !rc) rc = util_fail(err, UTIL_EIO, "%s: close failed: %s", path, strerror(errno));
    if (!rc && rename(tmp, path) != 0) rc = util_fail(err, UTIL_EIO, "%s: rename failed: %s", path, strerror(errno));
    if (rc) unlink(tmp);
    else fsync_parent(path);
    util_free(tmp);
    util_free(header);
    return rc;
}

/* ---- reader ---- */

struct ex_ckpt {
    char *path;
    FILE *f;
    uint64_t data_start, data_size;
    ex_ckpt_entry *entries;
    int n;
    char **meta;   /* key, value, key, value ... */
    int n_meta;
    util_strmap by_name, by_key;   /* entries and metadata by name: look-ups stay O(1) with 100k tensors */
};

void ex_ckpt_close(ex_ckpt *c)
{
    if (!c) return;
    if (c->f) fclose(c->f);
    for (int i = 0; i < c->n; i++) util_free(c->entries[i].name);
    for (int i = 0; i < 2 * c->n_meta; i++) util_free(c->meta[i]);
    util_free(c->entries);
    util_free(c->meta);
    util_free(c->path);
    util_strmap_free(&c->by_name);
    util_strmap_free(&c->by_key);
    util_free(c);
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static bool json_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static int parse_metadata(ex_ckpt *c, const cJSON *m, char *err)
{
    if (!cJSON_IsObject(m)) return util_fail(err, UTIL_EINVAL, "%s: __metadata__ must be an object", c->path);
    int n = cJSON_GetArraySize(m);
    c->meta = util_calloc((size_t)(2 * n + 1), sizeof *c->meta);
    if (!c->meta) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", c->path);
    if (util_strmap_init(&c->by_key, (size_t)n)) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", c->path);
    for (const cJSON *kv = m->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv))
            return util_fail(err, UTIL_EINVAL, "%s: __metadata__.%s must be a string", c->path, kv->string);
        if (!util_text_ok(kv->string) || !util_text_ok(kv->valuestring))
            return util_fail(err, UTIL_EINVAL, "%s: __metadata__.%s: control characters are not allowed", c->path, kv->string);
        c->meta[2 * c->n_meta] = util_strdup(kv->string);
        c->meta[2 * c->n_meta + 1] = util_strdup(kv->valuestring);
        c->n_meta++;
        if (!c->meta[2 * c->n_meta - 2] || !c->meta[2 * c->n_meta - 1] ||
            util_strmap_put(&c->by_key, c->meta[2 * c->n_meta - 2], c->n_meta - 1, NULL))
            return util_fail(err, UTIL_ENOMEM, "%s: out of memory", c->path);
    }
    return UTIL_OK;
}

static bool hex32(const char *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 8; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return s[8] == '\0';
}

/* The metadata checksum, then each "crc32:<name>" onto its tensor. */
static int parse_checksums(ex_ckpt *c, char *err)
{
    const char *stored = ex_ckpt_meta(c, META_CRC);
    uint32_t want;
    if (stored) {
        if (!hex32(stored, &want)) return util_fail(err, UTIL_EINVAL, "%s: metadata %s is not 8 hex digits", c->path, META_CRC);
        uint32_t got = meta_crc((const char *const *)c->meta, c->n_meta);
        if (got != want)
            return util_fail(err, UTIL_EINVAL, "%s: metadata checksum mismatch (stored %08x, computed %08x): the header is corrupted",
                             c->path, want, got);
    }
    size_t pre = strlen(CRC_PREFIX);
    for (int i = 0; i < c->n_meta; i++) {
        const char *k = c->meta[2 * i];
        if (strncmp(k, CRC_PREFIX, pre)) continue;
        int e = util_strmap_get(&c->by_name, k + pre);
        if (e < 0) return util_fail(err, UTIL_EINVAL, "%s: metadata %s: the file has no tensor '%s'", c->path, k, k + pre);
        if (!hex32(c->meta[2 * i + 1], &c->entries[e].crc))
            return util_fail(err, UTIL_EINVAL, "%s: metadata %s is not 8 hex digits", c->path, k);
        c->entries[e].has_crc = true;
    }
    return UTIL_OK;
}

static int parse_entry(ex_ckpt *c, const cJSON *j, ex_ckpt_entry *e, char *err)
{
    const char *name = j->string;
    if (!cJSON_IsObject(j)) return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': entry must be an object", c->path, name);
    if (!name[0] || !util_text_ok(name))
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': names must be non-empty printable text", c->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt) || !dtype_size(dt->valuestring))
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': missing or unknown dtype", c->path, name);
    util_strlcpy(e->dtype, dt->valuestring, sizeof e->dtype);
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > EX_CKPT_MAX_DIMS)
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': shape must be an array of at most %d integers",
                         c->path, name, EX_CKPT_MAX_DIMS);
    e->ndim = 0;
    uint64_t numel = 1;
    for (const cJSON *d = shape->child; d; d = d->next) {
        uint64_t v;
        if (!json_uint(d, &v))
            return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': shape entries must be non-negative integers", c->path, name);
        e->shape[e->ndim++] = (int64_t)v;
        if (v && numel > c->data_size / v + 1) numel = c->data_size + 1;  /* saturate: cannot fit */
        else numel *= v;
    }
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_uint(offs->child, &e->begin) || !json_uint(offs->child->next, &e->end))
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': data_offsets must be [begin, end] integers", c->path, name);
    if (e->begin > e->end || e->end > c->data_size)
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data section is %llu bytes)",
                         c->path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                         (unsigned long long)c->data_size);
    uint64_t want = numel * (uint64_t)dtype_size(e->dtype);
    if (e->end - e->begin != want) {
        char sh[160];
        fmt_shape(sh, sizeof sh, e->ndim, e->shape);
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': %s %s needs %llu bytes, data_offsets span %llu",
                         c->path, name, e->dtype, sh, (unsigned long long)want,
                         (unsigned long long)(e->end - e->begin));
    }
    e->name = util_strdup(name);
    return e->name ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "%s: out of memory", c->path);
}

static int cmp_by_begin(const void *a, const void *b)
{
    const ex_ckpt_entry *x = *(ex_ckpt_entry *const *)a, *y = *(ex_ckpt_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Sorted by begin, the tensors must tile [0, data_size) exactly. */
static int check_tiling(ex_ckpt *c, char *err)
{
    ex_ckpt_entry **s = util_malloc((size_t)(c->n + 1) * sizeof *s);
    if (!s) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", c->path);
    for (int i = 0; i < c->n; i++) s[i] = &c->entries[i];
    qsort(s, (size_t)c->n, sizeof *s, cmp_by_begin);
    uint64_t at = 0;
    int rc = UTIL_OK;
    for (int i = 0; i < c->n && !rc; i++) {
        if (s[i]->begin < at)
            rc = util_fail(err, UTIL_EINVAL, "%s: tensors '%s' and '%s' overlap (byte %llu)", c->path,
                           s[i - 1]->name, s[i]->name, (unsigned long long)s[i]->begin);
        else if (s[i]->begin > at)
            rc = util_fail(err, UTIL_EINVAL, "%s: hole in the data section at bytes [%llu, %llu) before tensor '%s'",
                           c->path, (unsigned long long)at, (unsigned long long)s[i]->begin, s[i]->name);
        at = s[i]->end;
    }
    if (!rc && at != c->data_size)
        rc = util_fail(err, UTIL_EINVAL, "%s: data section is %llu bytes but tensors cover %llu",
                       c->path, (unsigned long long)c->data_size, (unsigned long long)at);
    util_free(s);
    return rc;
}

static int parse_header(ex_ckpt *c, const char *text, char *err)
{
    cJSON *root;
    char what[4200];
    snprintf(what, sizeof what, "%s: header", c->path);
    int rc = util_json_parse(text, what, &root, err);
    if (rc) return rc;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return util_fail(err, UTIL_EINVAL, "%s: header JSON must be an object", c->path);
    }
    /* util_json_parse refused repeated keys: names are unique */
    int n = cJSON_GetArraySize(root);
    c->entries = util_calloc((size_t)n + 1, sizeof *c->entries);
    if (!c->entries || util_strmap_init(&c->by_name, (size_t)n)) rc = util_fail(err, UTIL_ENOMEM, "%s: out of memory", c->path);
    for (const cJSON *j = root->child; j && !rc; j = j->next) {
        if (!strcmp(j->string, "__metadata__")) {
            rc = parse_metadata(c, j, err);
            continue;
        }
        rc = parse_entry(c, j, &c->entries[c->n], err);
        if (!rc && util_strmap_put(&c->by_name, c->entries[c->n].name, c->n, NULL))
            rc = util_fail(err, UTIL_ENOMEM, "%s: out of memory", c->path);
        if (!rc) c->n++;
    }
    cJSON_Delete(root);
    if (!rc) rc = check_tiling(c, err);
    return rc ? rc : parse_checksums(c, err);
}

static int open_file(ex_ckpt *c, char *err)
{
    /* O_NONBLOCK: a FIFO without a writer would block the open; it is refused below */
    int fd = open(c->path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return util_fail(err, UTIL_EIO, "%s: cannot open: %s", c->path, strerror(errno));
    struct stat st;
    bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (!regular || !(c->f = fdopen(fd, "rb"))) {
        int rc = regular ? util_fail(err, UTIL_EIO, "%s: cannot open: %s", c->path, strerror(errno))
                         : util_fail(err, UTIL_EINVAL, "%s: not a regular file: refused", c->path);
        close(fd);
        return rc;
    }
    uint64_t size = (uint64_t)st.st_size;
    unsigned char len8[8];
    if (size < 8 || fread(len8, 1, 8, c->f) != 8)
        return util_fail(err, UTIL_EINVAL, "%s: truncated: %llu bytes, no 8-byte header length", c->path, (unsigned long long)size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);
    if (hlen > size - 8)
        return util_fail(err, UTIL_EINVAL, "%s: header length %llu runs past end of file (%llu bytes): truncated or not safetensors",
                         c->path, (unsigned long long)hlen, (unsigned long long)size);
    if (hlen > MAX_HEADER_BYTES)
        return util_fail(err, UTIL_EINVAL, "%s: header length %llu above the %u-byte limit", c->path,
                         (unsigned long long)hlen, MAX_HEADER_BYTES);
    c->data_start = 8 + hlen;
    c->data_size = size - c->data_start;
    char *text = util_malloc((size_t)hlen + 1);
    if (!text) return util_fail(err, UTIL_ENOMEM, "%s: out of memory for a %llu-byte header", c->path, (unsigned long long)hlen);
    int rc = UTIL_OK;
    if (fread(text, 1, (size_t)hlen, c->f) != hlen) rc = util_fail(err, UTIL_EIO, "%s: short read of the header", c->path);
    text[hlen] = 0;
    if (!rc && strlen(text) != hlen) rc = util_fail(err, UTIL_EINVAL, "%s: header contains a NUL byte", c->path);
    if (!rc) rc = parse_header(c, text, err);
    util_free(text);
    return rc;
}

int ex_ckpt_open(const char *path, ex_ckpt **out, char *err)
{
    *out = NULL;
    ex_ckpt *c = util_calloc(1, sizeof *c);
    if (!c) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    c->path = util_strdup(path);
    int rc = c->path ? open_file(c, err) : util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    if (rc) { ex_ckpt_close(c); return rc; }
    *out = c;
    return UTIL_OK;
}

int ex_ckpt_count(const ex_ckpt *c) { return c->n; }

const ex_ckpt_entry *ex_ckpt_entry_at(const ex_ckpt *c, int i)
{
    return i >= 0 && i < c->n ? &c->entries[i] : NULL;
}

const ex_ckpt_entry *ex_ckpt_find(const ex_ckpt *c, const char *name)
{
    int i = util_strmap_get(&c->by_name, name);
    return i >= 0 ? &c->entries[i] : NULL;
}

const char *ex_ckpt_meta(const ex_ckpt *c, const char *key)
{
    int i = util_strmap_get(&c->by_key, key);
    return i >= 0 ? c->meta[2 * i + 1] : NULL;
}

bool ex_ckpt_checksummed(const ex_ckpt *c)
{
    if (!ex_ckpt_meta(c, META_CRC)) return false;
    for (int i = 0; i < c->n; i++)
        if (!c->entries[i].has_crc) return false;
    return true;
}

int ex_ckpt_meta_count(const ex_ckpt *c) { return c->n_meta; }

void ex_ckpt_meta_at(const ex_ckpt *c, int i, const char **key, const char **value)
{
    bool in = i >= 0 && i < c->n_meta;
    *key = in ? c->meta[2 * i] : NULL;
    *value = in ? c->meta[2 * i + 1] : NULL;
}

int ex_ckpt_read_f32(ex_ckpt *c, const ex_ckpt_entry *e, float *out, size_t numel, char *err)
{
    if ((uint64_t)ex_ckpt_numel(e) != numel)
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': %lld elements, caller expects %zu",
                         c->path, e->name, (long long)ex_ckpt_numel(e), numel);
    bool bf16 = !strcmp(e->dtype, "BF16"), f16 = !strcmp(e->dtype, "F16");
    if (!bf16 && !f16 && strcmp(e->dtype, "F32"))
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': dtype %s, expected F32, BF16 or F16", c->path, e->name, e->dtype);
    if (fseeko(c->f, (off_t)(c->data_start + e->begin), SEEK_SET) != 0)
        return util_fail(err, UTIL_EIO, "%s: tensor '%s': seek failed: %s", c->path, e->name, strerror(errno));
    uint32_t crc = 0;
    if (!bf16 && !f16) {
        if (fread(out, sizeof(float), numel, c->f) != numel)
            return util_fail(err, UTIL_EIO, "%s: tensor '%s': short read", c->path, e->name);
        if (e->has_crc) crc = util_crc32(0, out, numel * sizeof(float));
    } else {
        uint16_t buf[CHUNK_FLOATS];
        for (size_t i = 0; i < numel; i += CHUNK_FLOATS) {
            size_t k = numel - i < CHUNK_FLOATS ? numel - i : CHUNK_FLOATS;
            if (fread(buf, sizeof(uint16_t), k, c->f) != k)
                return util_fail(err, UTIL_EIO, "%s: tensor '%s': short read", c->path, e->name);
            if (e->has_crc) crc = util_crc32(crc, buf, k * sizeof(uint16_t));
            for (size_t j = 0; j < k; j++) out[i + j] = bf16 ? ex_bf16_to_f32(buf[j]) : f16_to_f32(buf[j]);
        }
    }
    if (e->has_crc && crc != e->crc)
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': checksum mismatch (stored %08x, computed %08x): the file is corrupted",
                         c->path, e->name, e->crc, crc);
    return UTIL_OK;
}

int ex_ckpt_verify(ex_ckpt *c, int *verified, char *err)
{
    int rc = UTIL_OK, n = 0;
    float *buf = NULL;
    for (int i = 0; i < c->n && !rc; i++) {
        const ex_ckpt_entry *e = &c->entries[i];
        if (!e->has_crc || (strcmp(e->dtype, "F32") && strcmp(e->dtype, "BF16"))) continue;
        size_t numel = (size_t)ex_ckpt_numel(e);
        util_free(buf);
        buf = util_malloc((numel ? numel : 1) * sizeof(float));
        rc = buf ? ex_ckpt_read_f32(c, e, buf, numel, err) : util_fail(err, UTIL_ENOMEM, "%s: out of memory", c->path);
        n += !rc;
    }
    util_free(buf);
    if (verified) *verified = n;
    return rc;
}

static int read_one(ex_ckpt *c, const ex_named_tensor *t, char *err)
{
    const ex_ckpt_entry *e = ex_ckpt_find(c, t->name);
    if (!e) return util_fail(err, UTIL_EINVAL, "%s: tensor '%s' is missing from the checkpoint", c->path, t->name);
    bool same = e->ndim == t->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == t->shape[d];
    if (!same) {
        char a[160], b[160];
        fmt_shape(a, sizeof a, e->ndim, e->shape);
        fmt_shape(b, sizeof b, t->ndim, t->shape);
        return util_fail(err, UTIL_EINVAL, "%s: tensor '%s': shape %s in the checkpoint, model expects %s",
                         c->path, t->name, a, b);
    }
    return ex_ckpt_read_f32(c, e, t->data, (size_t)shape_numel(t->ndim, t->shape), err);
}

int ex_ckpt_read_into(const char *path, const ex_named_tensor *t, int n, char *err)
{
    ex_ckpt *c;
    int rc = ex_ckpt_open(path, &c, err);
    if (rc) return rc;
    for (int i = 0; i < n && !rc; i++) rc = read_one(c, &t[i], err);
    /* every name of t was found and the names of t are distinct: equal counts mean nothing else is there */
    if (!rc && c->n != n) {
        util_strmap wanted;
        if (util_strmap_init(&wanted, (size_t)n)) rc = util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
        for (int j = 0; j < n && !rc; j++) util_strmap_put(&wanted, t[j].name, j, NULL);
        for (int i = 0; i < c->n && !rc; i++)
            if (util_strmap_get(&wanted, c->entries[i].name) < 0)
                rc = util_fail(err, UTIL_EINVAL, "%s: tensor '%s' in the checkpoint is not in the model", path, c->entries[i].name);
        util_strmap_free(&wanted);
    }
    ex_ckpt_close(c);
    return rc;
}
