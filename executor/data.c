/* Synthetic image-caption data set: renderer, shard writer, validating
 * loader, deterministic shuffled and data-parallel-sharded batches; with
 * audio (format version 2) each sample also has a clip (data_audio.c).
 * The on-disk format and the patch order are specified in executor/DATASET.md. */
#include "executor/data_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SHARD_MAGIC "DHPDATA\0"
#define SHARD_VERSION 1u           /* images only */
#define SHARD_VERSION_AUDIO 2u     /* with the audio section */
#define SHARD_HEADER_BYTES 72u
#define SHARD_HEADER_BYTES_AUDIO 80u
#define AUDIO_SECTION_VERSION 1
#define RECORD_META_BYTES 8u
#define MANIFEST_NAME "manifest.json"
#define MANIFEST_FORMAT "dhp-synth-captions"


static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

/* ---- configuration ---- */

void ex_synth_defaults(ex_synth_cfg *cfg)
{
    cfg->samples = 256;
    cfg->image_size = 32;
    cfg->patch = 4;
    cfg->merge = 2;
    cfg->window = 16;
    cfg->text_tokens = 48;
    cfg->shards = 4;
    cfg->seed = 1;
    cfg->audio = false;
    cfg->mel_bins = 16;
    cfg->mel_frames = 64;
}

static int isqrt_exact(int v)
{
    int r = (int)lround(sqrt((double)v));
    return r * r == v ? r : -1;
}

/* Shape rules shared by the writer and the loader; `what` prefixes errors.
 * A set with audio may have no images (image_size 0). */
static int check_layout(const char *what, int image_size, int patch, int merge, int window,
                        int text_tokens, bool audio, char *err)
{
    if (text_tokens < 3 || text_tokens > 4096)
        return util_fail(err, UTIL_EINVAL, "%s: text-tokens %d outside [3, 4096]", what, text_tokens);
    if (audio && image_size == 0) return UTIL_OK;
    if (image_size < 4 || image_size > 1024)
        return util_fail(err, UTIL_EINVAL, "%s: image-size %d outside [4, 1024]%s", what, image_size,
                         audio ? " (or 0: no images)" : "");
    if (patch < 1 || image_size % patch)
        return util_fail(err, UTIL_EINVAL, "%s: patch %d must be >= 1 and divide image-size %d",
                         what, patch, image_size);
    int grid = image_size / patch;
    if (merge < 1 || grid % merge)
        return util_fail(err, UTIL_EINVAL, "%s: merge %d must be >= 1 and divide the %d-patch grid side",
                         what, merge, grid);
    if (window < 0)
        return util_fail(err, UTIL_EINVAL, "%s: window %d must be >= 0", what, window);
    if (window > 0) {
        int side = isqrt_exact(window);
        if (side < 0)
            return util_fail(err, UTIL_EINVAL, "%s: window %d is not a square number of patches", what, window);
        if (side % merge || grid % side)
            return util_fail(err, UTIL_EINVAL,
                             "%s: window side %d must be a multiple of merge %d and divide the %d-patch grid side",
                             what, side, merge, grid);
    }
    return UTIL_OK;
}

/* The audio section's shape: B bins, F frames (even, for the encoder's stride-2 stem). */
static int check_audio_layout(const char *what, int mel_bins, int mel_frames, char *err)
{
    if (mel_bins < 1 || mel_bins > 1024)
        return util_fail(err, UTIL_EINVAL, "%s: mel-bins %d outside [1, 1024]", what, mel_bins);
    if (mel_frames < 8 || mel_frames > 65536 || mel_frames % 2)
        return util_fail(err, UTIL_EINVAL, "%s: mel-frames %d must be even and in [8, 65536]", what, mel_frames);
    return UTIL_OK;
}

int ex_synth_validate(const ex_synth_cfg *cfg, char *err)
{
    if (cfg->samples < 1 || cfg->samples > 1000000)
        return util_fail(err, UTIL_EINVAL, "synth: samples %d outside [1, 1000000]", cfg->samples);
    if (cfg->shards < 1 || cfg->shards > cfg->samples)
        return util_fail(err, UTIL_EINVAL, "synth: shards %d outside [1, samples=%d]", cfg->shards, cfg->samples);
    int rc = check_layout("synth", cfg->image_size, cfg->patch, cfg->merge, cfg->window, cfg->text_tokens, cfg->audio, err);
    if (!rc && cfg->audio) rc = check_audio_layout("synth", cfg->mel_bins, cfg->mel_frames, err);
    return rc;
}

/* ---- rendering ---- */

static const char *const shape_names[] = { "circle", "square", "triangle", "cross", "diamond", "ring" };
static const char *const colour_names[] = { "red", "green", "blue", "yellow", "cyan", "magenta", "white", "orange" };
static const unsigned char colour_rgb[][3] = {
    { 230, 40, 40 }, { 40, 200, 60 }, { 50, 80, 240 }, { 240, 220, 40 },
    { 40, 220, 230 }, { 220, 50, 220 }, { 245, 245, 245 }, { 250, 140, 20 },
};
static const char *const position_names[] = {
    "at top left", "at the top", "at top right", "on the left", "in the center",
    "on the right", "at bottom left", "at the bottom", "at bottom right",
};
static const char *const size_names[] = { "small", "large" };
#define N_SHAPES 6
#define N_COLOURS 8
#define N_POSITIONS 9
#define N_SIZES 2

/* Is offset (dx, dy) from the centre (dy grows downwards) inside shape of radius r? */
static bool shape_covers(int shape, double dx, double dy, double r)
{
    double ax = fabs(dx), ay = fabs(dy), d2 = dx * dx + dy * dy;
    switch (shape) {
    case 0: return d2 <= r * r;
    case 1: return ax <= r && ay <= r;
    case 2: return dy >= -r && dy <= r && ax <= (dy + r) / 2;  /* apex up */
    case 3: return (ax <= r / 3 && ay <= r) || (ay <= r / 3 && ax <= r);
    case 4: return ax + ay <= r;
    default: return d2 <= r * r && d2 >= r * r / 4;
    }
}

typedef struct { int shape, colour, position, size; } sample_label;

/* Sample i's image is a pure function of (seed, i): its generator state is
 * seed ^ (i + 1) * 0xD1B54A32D192ED03 (any odd constant spreads the indexes;
 * this one and the epoch constant below are dhp's own choice, fixed by the
 * format). Writes the labels, the image caption into caption (returns its
 * length) and the pixels px[S][S][C]. */
static int render_image(uint64_t seed, int i, int S, unsigned char *rec, char *caption, unsigned char *px)
{
    uint64_t s = seed ^ ((uint64_t)(i + 1) * 0xD1B54A32D192ED03ull);
    sample_label l = { (int)ex_rng_below(&s, N_SHAPES), (int)ex_rng_below(&s, N_COLOURS),
                       (int)ex_rng_below(&s, N_POSITIONS), (int)ex_rng_below(&s, N_SIZES) };
    double cell = S / 3.0;
    double jitter = S / 24.0;
    double cx = (l.position % 3 + 0.5) * cell + ((double)ex_rng_below(&s, 1001) / 500.0 - 1.0) * jitter;
    double cy = (l.position / 3 + 0.5) * cell + ((double)ex_rng_below(&s, 1001) / 500.0 - 1.0) * jitter;
    double r = fmax(1.5, S * (l.size ? 0.15 : 0.09));
    rec[0] = (unsigned char)l.shape; rec[1] = (unsigned char)l.colour;
    rec[2] = (unsigned char)l.position; rec[3] = (unsigned char)l.size;
    int n = snprintf(caption, EX_DATA_CAPTION_MAX + 1, "a %s %s %s %s", size_names[l.size],
                     colour_names[l.colour], shape_names[l.shape], position_names[l.position]);
    for (int y = 0; y < S; y++)
        for (int x = 0; x < S; x++) {
            unsigned char *p = px + ((size_t)y * S + x) * EX_DATA_CHANNELS;
            bool in = shape_covers(l.shape, x + 0.5 - cx, y + 0.5 - cy, r);
            for (int c = 0; c < EX_DATA_CHANNELS; c++)
                p[c] = in ? colour_rgb[l.colour][c] : (unsigned char)(16 + ex_rng_below(&s, 16));
        }
    return n;
}

/* One record (DATASET.md): the image (S > 0) and the sound (F > 0), the
 * caption describing both ("<image>, <sound>"). */
static void render_sample(uint64_t seed, int i, int S, int F, int B, unsigned char *rec)
{
    memset(rec, 0, RECORD_META_BYTES + EX_DATA_CAPTION_MAX);
    char caption[EX_DATA_CAPTION_MAX + 1] = "", sound[EX_SOUND_CAPTION_MAX];
    unsigned char *px = rec + RECORD_META_BYTES + EX_DATA_CAPTION_MAX;
    int n = S > 0 ? render_image(seed, i, S, rec, caption, px) : 0;
    if (F > 0) {
        int kind, variant;
        ex_synth_sound(seed, i, F, B, px + (size_t)S * S * EX_DATA_CHANNELS, &kind, &variant, sound);
        rec[5] = (unsigned char)(kind + 1);
        rec[6] = (unsigned char)variant;
        n += snprintf(caption + n, sizeof caption - (size_t)n, "%s%s", n ? ", " : "", sound);
    }
    rec[4] = (unsigned char)n;
    memcpy(rec + RECORD_META_BYTES, caption, (size_t)n);
}

/* ---- writer ---- */

static size_t record_bytes_for(int S, int F, int B)
{
    return RECORD_META_BYTES + EX_DATA_CAPTION_MAX + (size_t)S * S * EX_DATA_CHANNELS + (size_t)F * B;
}

static void shard_name(char *buf, size_t n, int k)
{
    snprintf(buf, n, "shard-%05d.bin", k);
}

static int write_shard(const char *dir, const ex_synth_cfg *cfg, int k, int first, int count, char *err)
{
    int F = cfg->audio ? cfg->mel_frames : 0, B = cfg->audio ? cfg->mel_bins : 0;
    size_t rb = record_bytes_for(cfg->image_size, F, B);
    uint32_t hdr = cfg->audio ? SHARD_HEADER_BYTES_AUDIO : SHARD_HEADER_BYTES;
    size_t len = hdr + (size_t)count * rb + 4;
    unsigned char *buf = util_calloc(1, len);
    if (!buf) return util_fail(err, UTIL_ENOMEM, "synth: out of memory for shard %d (%zu bytes)", k, len);
    memcpy(buf, SHARD_MAGIC, 8);
    uint32_t fields[] = { cfg->audio ? SHARD_VERSION_AUDIO : SHARD_VERSION, hdr, (uint32_t)k, (uint32_t)cfg->shards,
                          (uint32_t)first, (uint32_t)count, (uint32_t)cfg->samples,
                          (uint32_t)cfg->image_size, EX_DATA_CHANNELS, (uint32_t)cfg->patch,
                          (uint32_t)cfg->merge, (uint32_t)cfg->window, (uint32_t)cfg->text_tokens,
                          (uint32_t)rb };
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) put_u32(buf + 8 + 4 * f, fields[f]);
    put_u64(buf + 64, cfg->seed);
    if (cfg->audio) {
        put_u32(buf + 72, (uint32_t)B);
        put_u32(buf + 76, (uint32_t)F);
    }
    for (int j = 0; j < count; j++)
        render_sample(cfg->seed, first + j, cfg->image_size, F, B, buf + hdr + (size_t)j * rb);
    put_u32(buf + len - 4, util_crc32(0, buf, len - 4));
    char name[32], path[4096];
    shard_name(name, sizeof name, k);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = util_write_atomic(path, buf, len, err);
    util_free(buf);
    return rc;
}

static int write_manifest(const char *dir, const ex_synth_cfg *cfg, char *err)
{
    cJSON *root = cJSON_CreateObject();
    char seed[32], name[32], path[4096];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)cfg->seed);
    cJSON_AddStringToObject(root, "format", MANIFEST_FORMAT);
    cJSON_AddNumberToObject(root, "version", cfg->audio ? SHARD_VERSION_AUDIO : SHARD_VERSION);
    if (cfg->audio) {
        cJSON *a = cJSON_AddObjectToObject(root, "audio");
        cJSON_AddNumberToObject(a, "version", AUDIO_SECTION_VERSION);
        cJSON_AddNumberToObject(a, "mel_bins", cfg->mel_bins);
        cJSON_AddNumberToObject(a, "mel_frames", cfg->mel_frames);
    }
    cJSON_AddNumberToObject(root, "samples", cfg->samples);
    cJSON_AddNumberToObject(root, "image_size", cfg->image_size);
    cJSON_AddNumberToObject(root, "channels", EX_DATA_CHANNELS);
    cJSON_AddNumberToObject(root, "patch", cfg->patch);
    cJSON_AddNumberToObject(root, "merge", cfg->merge);
    cJSON_AddNumberToObject(root, "window", cfg->window);
    cJSON_AddNumberToObject(root, "text_tokens", cfg->text_tokens);
    cJSON_AddStringToObject(root, "seed", seed);
    cJSON *shards = cJSON_AddArrayToObject(root, "shards");
    for (int k = 0; k < cfg->shards; k++) {
        long first = (long)k * cfg->samples / cfg->shards;
        long next = (long)(k + 1) * cfg->samples / cfg->shards;
        cJSON *s = cJSON_CreateObject();
        shard_name(name, sizeof name, k);
        cJSON_AddStringToObject(s, "file", name);
        cJSON_AddNumberToObject(s, "samples", (double)(next - first));
        cJSON_AddItemToArray(shards, s);
    }
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST_NAME);
    int rc = util_json_write(path, root, err);
    cJSON_Delete(root);
    return rc;
}

int ex_data_synth(const char *dir, const ex_synth_cfg *cfg, char *err)
{
    int rc = ex_synth_validate(cfg, err);
    if (rc) return rc;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return util_fail(err, UTIL_EIO, "%s: cannot create directory: %s", dir, strerror(errno));
    /* Shards first, manifest last: a crash midway leaves no loadable set. */
    for (int k = 0; k < cfg->shards; k++) {
        int first = (int)((long)k * cfg->samples / cfg->shards);
        int next = (int)((long)(k + 1) * cfg->samples / cfg->shards);
        rc = write_shard(dir, cfg, k, first, next - first, err);
        if (rc) return rc;
    }
    return write_manifest(dir, cfg, err);
}

/* ---- loader ---- */

struct ex_dataset {
    ex_dataset_info info;
    size_t record_bytes;
    unsigned char *records;   /* all samples in global order */
    int *order;               /* cached epoch permutation */
    long order_epoch;
    uint64_t order_seed;
    bool order_valid;
    char **captions;          /* NUL-terminated copies, one per sample */
};

static int manifest_int(const cJSON *m, const char *path, const char *key, long lo, long hi, int *out, char *err)
{
    long v;
    int rc = util_json_int(m, path, key, true, lo, hi, 0, &v, err);
    if (!rc) *out = (int)v;
    return rc;
}

/* Version 2's "audio" section {"version": 1, "mel_bins", "mel_frames"};
 * version 1 has none (and no audio). */
static int read_audio_section(const cJSON *m, const char *path, ex_dataset_info *info, char *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(m, "audio");
    info->mel_bins = info->mel_frames = 0;
    if (info->version == (int)SHARD_VERSION)
        return a ? util_fail(err, UTIL_EINVAL, "%s.audio: a version 1 set has no audio section", path) : UTIL_OK;
    if (!cJSON_IsObject(a)) return util_fail(err, UTIL_EINVAL, "%s.audio: version 2 needs the audio section (an object)", path);
    char ctx[4200];
    snprintf(ctx, sizeof ctx, "%s.audio", path);
    int v, rc;
    if ((rc = manifest_int(a, ctx, "version", 0, 1000000, &v, err))) return rc;
    if (v != AUDIO_SECTION_VERSION)
        return util_fail(err, UTIL_EUNSUPPORTED, "%s.version: %d, this build reads audio section version %d", ctx, v,
                         AUDIO_SECTION_VERSION);
    if ((rc = manifest_int(a, ctx, "mel_bins", 1, 1 << 20, &info->mel_bins, err)) ||
        (rc = manifest_int(a, ctx, "mel_frames", 1, 1 << 20, &info->mel_frames, err)))
        return rc;
    return check_audio_layout(ctx, info->mel_bins, info->mel_frames, err);
}

static int read_manifest(const char *dir, ex_dataset_info *info, cJSON **root_out, char *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, MANIFEST_NAME);
    cJSON *m;
    int rc = util_json_read(path, &m, err);
    if (rc) return rc;
    char fmt[64], seed[32];
    if ((rc = util_json_str(m, path, "format", true, NULL, fmt, sizeof fmt, err))) goto fail;
    if (strcmp(fmt, MANIFEST_FORMAT)) {
        rc = util_fail(err, UTIL_EINVAL, "%s.format: '%s', expected '%s'", path, fmt, MANIFEST_FORMAT);
        goto fail;
    }
    if ((rc = manifest_int(m, path, "version", 0, 1000000, &info->version, err))) goto fail;
    if (info->version != (int)SHARD_VERSION && info->version != (int)SHARD_VERSION_AUDIO) {
        rc = util_fail(err, UTIL_EUNSUPPORTED, "%s.version: %d, this build reads versions %u and %u", path, info->version,
                       SHARD_VERSION, SHARD_VERSION_AUDIO);
        goto fail;
    }
    if ((rc = read_audio_section(m, path, info, err))) goto fail;
    if ((rc = manifest_int(m, path, "samples", 1, 1000000, &info->samples, err)) ||
        (rc = manifest_int(m, path, "image_size", 0, 1 << 20, &info->image_size, err)) ||
        (rc = manifest_int(m, path, "channels", EX_DATA_CHANNELS, EX_DATA_CHANNELS, &info->channels, err)) ||
        (rc = manifest_int(m, path, "patch", 1, 1 << 20, &info->patch, err)) ||
        (rc = manifest_int(m, path, "merge", 1, 1 << 20, &info->merge, err)) ||
        (rc = manifest_int(m, path, "window", 0, 1 << 20, &info->window, err)) ||
        (rc = manifest_int(m, path, "text_tokens", 1, 1 << 20, &info->text_tokens, err)) ||
        (rc = util_json_str(m, path, "seed", true, NULL, seed, sizeof seed, err)))
        goto fail;
    if ((rc = check_layout(path, info->image_size, info->patch, info->merge, info->window, info->text_tokens,
                           info->mel_frames > 0, err)))
        goto fail;
    char *end;
    errno = 0;
    info->seed = strtoull(seed, &end, 10);
    if (errno || end == seed || *end) {
        rc = util_fail(err, UTIL_EINVAL, "%s.seed: '%s' is not an unsigned integer", path, seed);
        goto fail;
    }
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(m, "shards");
    if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) < 1) {
        rc = util_fail(err, UTIL_EINVAL, "%s.shards: must be a non-empty array", path);
        goto fail;
    }
    info->shards = cJSON_GetArraySize(shards);
    info->grid = info->image_size / info->patch;   /* 0 without images */
    info->patches = info->grid * info->grid;
    info->patch_dim = info->channels * info->patch * info->patch;
    *root_out = m;
    return UTIL_OK;
fail:
    cJSON_Delete(m);
    return rc;
}

/* A shard's header bytes: version 2 adds the audio section. */
static uint32_t shard_header_bytes(const ex_dataset_info *in)
{
    return in->version == (int)SHARD_VERSION_AUDIO ? SHARD_HEADER_BYTES_AUDIO : SHARD_HEADER_BYTES;
}

/* A shard header's version and header size against the manifest's. */
static int check_header_version(const unsigned char *h, const char *path, const ex_dataset_info *in, char *err)
{
    uint32_t version = get_u32(h + 8), hdr = get_u32(h + 12);
    if (version != (uint32_t)in->version || hdr != shard_header_bytes(in))
        return util_fail(err, UTIL_EUNSUPPORTED, "%s: version %u / header %u bytes, the manifest's version %d has %u",
                         path, version, hdr, in->version, shard_header_bytes(in));
    return UTIL_OK;
}

/* A shard whose size disagrees with the manifest may be of another format
 * version (a version 1 shard under a version 2 manifest): its header says
 * so, which names the cause better than its size. */
static int check_shard_version(const char *path, const ex_dataset_info *in, char *err)
{
    unsigned char h[16];
    FILE *f = fopen(path, "rb");
    if (!f) return util_fail(err, UTIL_EIO, "%s: %s", path, strerror(errno));
    size_t n = fread(h, 1, sizeof h, f);
    fclose(f);
    if (n < sizeof h || memcmp(h, SHARD_MAGIC, 8)) return UTIL_OK;
    return check_header_version(h, path, in, err);
}

/* Checks one shard buffer: magic, version, size, CRC, then agreement with
 * the manifest; copies its records to ds->records at first_sample. */
static int load_shard(ex_dataset *ds, const char *path, int k, int want_samples, int *next_sample, char *err)
{
    char *buf;
    size_t len;
    /* the manifest fixes the shard's size: nothing larger is read */
    size_t expect = shard_header_bytes(&ds->info) + (size_t)want_samples * ds->record_bytes + 4;
    int rc = util_read_file_max(path, expect, &buf, &len, err);
    if (rc) return rc;
    const unsigned char *p = (const unsigned char *)buf;
    const ex_dataset_info *in = &ds->info;
    if (len < 8) { rc = util_fail(err, UTIL_EINVAL, "%s: truncated: %zu bytes, shorter than the magic", path, len); goto out; }
    if (memcmp(p, SHARD_MAGIC, 8)) { rc = util_fail(err, UTIL_EINVAL, "%s: bad magic (not a dhp data shard)", path); goto out; }
    bool audio = in->version == (int)SHARD_VERSION_AUDIO;
    uint32_t want_hdr = shard_header_bytes(in);
    if (len < want_hdr + 4) {
        rc = util_fail(err, UTIL_EINVAL, "%s: truncated: %zu bytes, shorter than the %u-byte header", path, len, want_hdr);
        goto out;
    }
    uint32_t hdr = get_u32(p + 12);
    if ((rc = check_header_version(p, path, in, err))) goto out;
    uint32_t count = get_u32(p + 28), rb = get_u32(p + 60);
    uint64_t want = (uint64_t)hdr + (uint64_t)count * rb + 4;
    if (len < want) {
        rc = util_fail(err, UTIL_EINVAL, "%s: truncated: %zu bytes, header promises %llu (%u records of %u bytes)",
                       path, len, (unsigned long long)want, count, rb);
        goto out;
    }
    if (len > want) {
        rc = util_fail(err, UTIL_EINVAL, "%s: %zu bytes, header promises %llu: trailing garbage",
                       path, len, (unsigned long long)want);
        goto out;
    }
    uint32_t stored = get_u32(p + len - 4), actual = util_crc32(0, p, len - 4);
    if (stored != actual) {
        rc = util_fail(err, UTIL_EINVAL, "%s: CRC32 mismatch (stored %08x, computed %08x): file is corrupted", path, stored, actual);
        goto out;
    }
    uint32_t got[] = { get_u32(p + 16), get_u32(p + 20), get_u32(p + 24), count, get_u32(p + 32),
                       get_u32(p + 36), get_u32(p + 40), get_u32(p + 44), get_u32(p + 48),
                       get_u32(p + 52), get_u32(p + 56), rb,
                       audio ? get_u32(p + 72) : 0, audio ? get_u32(p + 76) : 0 };
    uint32_t exp[] = { (uint32_t)k, (uint32_t)in->shards, (uint32_t)*next_sample, (uint32_t)want_samples,
                       (uint32_t)in->samples, (uint32_t)in->image_size, (uint32_t)in->channels,
                       (uint32_t)in->patch, (uint32_t)in->merge, (uint32_t)in->window,
                       (uint32_t)in->text_tokens, (uint32_t)ds->record_bytes,
                       (uint32_t)in->mel_bins, (uint32_t)in->mel_frames };
    static const char *const names[] = { "shard_index", "n_shards", "first_sample", "samples", "total_samples",
                                         "image_size", "channels", "patch", "merge", "window",
                                         "text_tokens", "record_bytes", "mel_bins", "mel_frames" };
    for (size_t f = 0; f < sizeof got / sizeof got[0]; f++)
        if (got[f] != exp[f]) {
            rc = util_fail(err, UTIL_EINVAL, "%s: header %s = %u, manifest implies %u", path, names[f], got[f], exp[f]);
            goto out;
        }
    if (get_u64(p + 64) != in->seed) {
        rc = util_fail(err, UTIL_EINVAL, "%s: header seed differs from the manifest", path);
        goto out;
    }
    for (uint32_t j = 0; j < count; j++) {
        const unsigned char *r = p + hdr + (size_t)j * rb;
        if (r[4] > EX_DATA_CAPTION_MAX) {
            rc = util_fail(err, UTIL_EINVAL, "%s: record %u: caption length %u > %d", path, j, r[4], EX_DATA_CAPTION_MAX);
            goto out;
        }
    }
    memcpy(ds->records + (size_t)*next_sample * ds->record_bytes, p + hdr, (size_t)count * rb);
    *next_sample += (int)count;
out:
    util_free(buf);
    return rc;
}

/* Manifest entry k: its path and sample count (at most `left`). */
static int shard_entry(const cJSON *shards, const char *dir, int k, int left, char *path, size_t n,
                       int *samples, char *err)
{
    char ctx[64], file[256];
    const cJSON *s = cJSON_GetArrayItem(shards, k);
    int rc;
    snprintf(ctx, sizeof ctx, "manifest.json.shards[%d]", k);
    if ((rc = util_json_str(s, ctx, "file", true, NULL, file, sizeof file, err)) ||
        (rc = manifest_int(s, ctx, "samples", 1, left, samples, err)))
        return rc;
    if (strchr(file, '/') || !util_name_ok(file))
        return util_fail(err, UTIL_EINVAL, "%s.file: '%s' must be a plain file name ([A-Za-z0-9._-])", ctx, file);
    snprintf(path, n, "%s/%s", dir, file);
    return UTIL_OK;
}

/* Every shard is a regular file of exactly the size its samples make:
 * checked before the data set's memory is allocated or a shard is read. */
static int check_shard_sizes(const ex_dataset *ds, const char *dir, const cJSON *shards, char *err)
{
    int next = 0;
    for (int k = 0; k < ds->info.shards; k++) {
        char path[4096];
        int samples, rc = shard_entry(shards, dir, k, ds->info.samples - next, path, sizeof path, &samples, err);
        if (rc) return rc;
        struct stat st;
        if (stat(path, &st) != 0) return util_fail(err, UTIL_EIO, "%s: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode)) return util_fail(err, UTIL_EINVAL, "%s: not a regular file: refused", path);
        uint64_t want = shard_header_bytes(&ds->info) + (uint64_t)samples * ds->record_bytes + 4;
        if ((uint64_t)st.st_size != want && (rc = check_shard_version(path, &ds->info, err))) return rc;
        if ((uint64_t)st.st_size != want)
            return util_fail(err, UTIL_EINVAL, "%s: %s: %lld bytes, the manifest's %d samples make %llu",
                             path, (uint64_t)st.st_size < want ? "truncated" : "too long", (long long)st.st_size,
                             samples, (unsigned long long)want);
        next += samples;
    }
    if (next != ds->info.samples)
        return util_fail(err, UTIL_EINVAL, "%s/manifest.json: shards hold %d samples, manifest says %d",
                         dir, next, ds->info.samples);
    return UTIL_OK;
}

static int load_shards(ex_dataset *ds, const char *dir, const cJSON *manifest, char *err)
{
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(manifest, "shards");
    int rc = check_shard_sizes(ds, dir, shards, err);
    if (rc) return rc;
    ds->records = util_malloc((size_t)ds->info.samples * ds->record_bytes);
    ds->order = util_malloc((size_t)ds->info.samples * sizeof *ds->order);
    if (!ds->records || !ds->order)
        return util_fail(err, UTIL_ENOMEM, "%s: out of memory for %d samples", dir, ds->info.samples);
    int next = 0;
    for (int k = 0; k < ds->info.shards; k++) {
        char path[4096];
        int samples;
        if ((rc = shard_entry(shards, dir, k, ds->info.samples - next, path, sizeof path, &samples, err))) return rc;
        if ((rc = load_shard(ds, path, k, samples, &next, err))) return rc;
    }
    return UTIL_OK;
}

static int build_captions(ex_dataset *ds, char *err)
{
    ds->captions = util_calloc((size_t)ds->info.samples, sizeof *ds->captions);
    if (!ds->captions) return util_fail(err, UTIL_ENOMEM, "data: out of memory for captions");
    for (int i = 0; i < ds->info.samples; i++) {
        const unsigned char *r = ds->records + (size_t)i * ds->record_bytes;
        ds->captions[i] = util_malloc((size_t)r[4] + 1);
        if (!ds->captions[i]) return util_fail(err, UTIL_ENOMEM, "data: out of memory for captions");
        memcpy(ds->captions[i], r + RECORD_META_BYTES, r[4]);
        ds->captions[i][r[4]] = 0;
    }
    return UTIL_OK;
}

int ex_data_open(const char *dir, ex_dataset **out, char *err)
{
    *out = NULL;
    ex_dataset *ds = util_calloc(1, sizeof *ds);
    if (!ds) return util_fail(err, UTIL_ENOMEM, "%s: out of memory", dir);
    cJSON *manifest = NULL;
    int rc = read_manifest(dir, &ds->info, &manifest, err);
    if (rc) { util_free(ds); return rc; }
    ds->record_bytes = record_bytes_for(ds->info.image_size, ds->info.mel_frames, ds->info.mel_bins);
    rc = load_shards(ds, dir, manifest, err);
    if (!rc) rc = build_captions(ds, err);
    cJSON_Delete(manifest);
    if (rc) { ex_data_close(ds); return rc; }
    *out = ds;
    return UTIL_OK;
}

void ex_data_close(ex_dataset *ds)
{
    if (!ds) return;
    if (ds->captions)
        for (int i = 0; i < ds->info.samples; i++) util_free(ds->captions[i]);
    util_free(ds->captions);
    util_free(ds->records);
    util_free(ds->order);
    util_free(ds);
}

const ex_dataset_info *ex_data_info(const ex_dataset *ds) { return &ds->info; }

const char *ex_data_caption(const ex_dataset *ds, int i)
{
    return i >= 0 && i < ds->info.samples ? ds->captions[i] : NULL;
}

/* ---- patch order and batches ---- */

/* Patch vectors are (c, ky, kx), the order of Qwen2-VL's image processor
 * flatten_patches with temporal patch 1 (huggingface/transformers,
 * src/transformers/models/qwen2_vl/image_processing_qwen2_vl.py). */

/* Window side w = sqrt(window) (w = grid when window == 0), merge m:
 *   pos = win * w^2 + grp * m^2 + (y%m)*m + x%m
 *   win = (y/w) * (grid/w) + x/w,  grp = ((y%w)/m) * (w/m) + (x%w)/m */
int ex_patch_order(int y, int x, int grid, int merge, int window)
{
    int w = window > 0 ? isqrt_exact(window) : grid;
    int ly = y % w, lx = x % w;
    int win = (y / w) * (grid / w) + x / w;
    int grp = (ly / merge) * (w / merge) + lx / merge;
    return win * w * w + grp * merge * merge + (ly % merge) * merge + lx % merge;
}

int ex_batch_alloc(ex_data_rows *b, const ex_dataset *ds, int n, char *err)
{
    memset(b, 0, sizeof *b);
    if (n < 1) return util_fail(err, UTIL_EINVAL, "batch: rows %d must be >= 1", n);
    const ex_dataset_info *in = &ds->info;
    b->n = n;
    b->patches = in->patches;
    b->patch_dim = in->patch_dim;
    b->text_tokens = in->text_tokens;
    b->mel_frames = in->mel_frames;
    b->mel_bins = in->mel_bins;
    size_t nt = (size_t)n * in->text_tokens, npx = (size_t)n * in->patches * in->patch_dim;
    size_t nmel = (size_t)n * in->mel_frames * in->mel_bins;
    b->pixels = util_malloc((npx ? npx : 1) * sizeof(float));
    b->mel = nmel ? util_malloc(nmel * sizeof(float)) : NULL;
    b->tokens = util_malloc(nt * sizeof(int32_t));
    b->targets = util_malloc(nt * sizeof(int32_t));
    b->loss_mask = util_malloc(nt * sizeof(float));
    b->lengths = util_malloc((size_t)n * sizeof(int32_t));
    b->sample_ids = util_malloc((size_t)n * sizeof(int32_t));
    if (!b->pixels || !b->tokens || !b->targets || !b->loss_mask || !b->lengths || !b->sample_ids || (nmel && !b->mel)) {
        ex_batch_free(b);
        return util_fail(err, UTIL_ENOMEM, "batch: out of memory for %d rows", n);
    }
    return UTIL_OK;
}

void ex_batch_free(ex_data_rows *b)
{
    util_free(b->pixels); util_free(b->tokens); util_free(b->targets);
    util_free(b->loss_mask); util_free(b->lengths); util_free(b->sample_ids); util_free(b->mel);
    memset(b, 0, sizeof *b);
}

long ex_data_steps_per_epoch(const ex_dataset *ds, int global_batch)
{
    return global_batch > 0 ? ds->info.samples / global_batch : 0;
}

/* Fisher-Yates (Durstenfeld): for i = N-1 .. 1 swap order[i] with
 * order[j], j = ex_rng_below(i + 1); generator state seed ^ (epoch+1) * 0x8CB92BA72F3D8DD7. */
static void epoch_order(ex_dataset *ds, uint64_t seed, long epoch)
{
    if (ds->order_valid && ds->order_epoch == epoch && ds->order_seed == seed) return;
    int n = ds->info.samples;
    for (int i = 0; i < n; i++) ds->order[i] = i;
    uint64_t s = seed ^ ((uint64_t)(epoch + 1) * 0x8CB92BA72F3D8DD7ull);
    for (int i = n - 1; i > 0; i--) {
        int j = (int)ex_rng_below(&s, (uint32_t)i + 1);
        int t = ds->order[i]; ds->order[i] = ds->order[j]; ds->order[j] = t;
    }
    ds->order_epoch = epoch;
    ds->order_seed = seed;
    ds->order_valid = true;
}

static void fill_row(const ex_dataset *ds, int sample, int row, ex_data_rows *b)
{
    const ex_dataset_info *in = &ds->info;
    const unsigned char *rec = ds->records + (size_t)sample * ds->record_bytes;
    const unsigned char *img = rec + RECORD_META_BYTES + EX_DATA_CAPTION_MAX;
    int S = in->image_size, P = in->patch, C = in->channels;
    float *dst = b->pixels + (size_t)row * in->patches * in->patch_dim;
    for (int py = 0; py < in->grid; py++)
        for (int px = 0; px < in->grid; px++) {
            float *v = dst + (size_t)ex_patch_order(py, px, in->grid, in->merge, in->window) * in->patch_dim;
            for (int c = 0; c < C; c++)
                for (int ky = 0; ky < P; ky++)
                    for (int kx = 0; kx < P; kx++)
                        v[(c * P + ky) * P + kx] =
                            img[((size_t)(py * P + ky) * S + px * P + kx) * C + c] / 255.0f;
        }
    size_t nmel = (size_t)in->mel_frames * in->mel_bins;
    const unsigned char *snd = img + (size_t)S * S * C;
    for (size_t i = 0; i < nmel; i++) b->mel[(size_t)row * nmel + i] = ex_sound_value(snd[i]);
    int T = in->text_tokens, cap = rec[4] < T - 2 ? rec[4] : T - 2;
    int32_t *tok = b->tokens + (size_t)row * T, *tgt = b->targets + (size_t)row * T;
    float *mask = b->loss_mask + (size_t)row * T;
    tok[0] = EX_TOK_BOS;
    for (int t = 0; t < cap; t++) tok[1 + t] = rec[RECORD_META_BYTES + t];
    tok[1 + cap] = EX_TOK_EOS;
    for (int t = cap + 2; t < T; t++) tok[t] = EX_TOK_PAD;
    for (int t = 0; t < T; t++) {
        tgt[t] = t + 1 < T ? tok[t + 1] : EX_TOK_PAD;
        mask[t] = tgt[t] != EX_TOK_PAD ? 1.0f : 0.0f;
    }
    b->lengths[row] = cap + 2;
    b->sample_ids[row] = sample;
}

int ex_data_batch(ex_dataset *ds, uint64_t shuffle_seed, long step, int global_batch,
                  int rank, int dp, ex_data_rows *b, char *err)
{
    const ex_dataset_info *in = &ds->info;
    if (global_batch < 1 || global_batch > in->samples)
        return util_fail(err, UTIL_EINVAL, "batch: global batch %d outside [1, samples=%d]", global_batch, in->samples);
    if (dp < 1 || global_batch % dp)
        return util_fail(err, UTIL_EINVAL, "batch: data-parallel degree %d does not divide global batch %d", dp, global_batch);
    if (rank < 0 || rank >= dp)
        return util_fail(err, UTIL_EINVAL, "batch: rank %d outside [0, %d)", rank, dp);
    if (step < 0) return util_fail(err, UTIL_EINVAL, "batch: step %ld must be >= 0", step);
    int local = global_batch / dp;
    if (b->n != local || b->patches != in->patches || b->patch_dim != in->patch_dim || b->text_tokens != in->text_tokens ||
        b->mel_frames != in->mel_frames || b->mel_bins != in->mel_bins)
        return util_fail(err, UTIL_EINVAL, "batch: buffer holds %d rows of %dx%d patches, %d tokens, %dx%d mel; need %d rows of "
                         "%dx%d, %d, %dx%d", b->n, b->patches, b->patch_dim, b->text_tokens, b->mel_frames, b->mel_bins,
                         local, in->patches, in->patch_dim, in->text_tokens, in->mel_frames, in->mel_bins);
    long spe = ex_data_steps_per_epoch(ds, global_batch);
    epoch_order(ds, shuffle_seed, step / spe);
    long base = (step % spe) * global_batch + (long)rank * local;
    for (int j = 0; j < local; j++) fill_row(ds, ds->order[base + j], j, b);
    return UTIL_OK;
}
