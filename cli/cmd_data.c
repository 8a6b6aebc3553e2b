/* dhp data: synthetic data sets and checkpoint files.
 *   dhp data synth --out DIR [--samples N] [--image-size S] [--patch P] [--merge M]
 *                  [--window W] [--text-tokens T] [--shards K] [--seed X]
 *                  [--audio [--mel-bins B] [--mel-frames F]]
 *   dhp data inspect DIR [--captions N]
 *   dhp data ckpt-inspect FILE
 *   dhp data ckpt-copy IN OUT [--bf16]   (re-encode a safetensors file through dhp) */
#include "cli/cli.h"
#include "executor/executor.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int data_fail(const char *err)
{
    fprintf(stderr, "dhp data: %s\n", err);
    return 2;
}

static void data_usage(FILE *f)
{
    ex_synth_cfg d;
    ex_synth_defaults(&d);
    fprintf(f,
            "usage: dhp data synth --out DIR [--samples N (%d)] [--image-size S (%d)] [--patch P (%d)]\n"
            "                      [--merge M (%d)] [--window W (%d patches, 0 = none)] [--text-tokens T (%d)]\n"
            "                      [--shards K (%d)] [--seed X (%llu)]\n"
            "                      [--audio [--mel-bins B (%d)] [--mel-frames F (%d, even)]]\n"
            "                      --audio: every sample has a clip of F log-mel-like frames of B bins (a tone,\n"
            "                      chirp or noise burst the caption describes too); --image-size 0: no images\n"
            "       dhp data inspect DIR [--captions N]\n"
            "       dhp data ckpt-inspect FILE\n"
            "       dhp data ckpt-copy IN OUT [--bf16]\n",
            d.samples, d.image_size, d.patch, d.merge, d.window, d.text_tokens, d.shards,
            (unsigned long long)d.seed, d.mel_bins, d.mel_frames);
}

static bool parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static int int_option(const char *opt, const char *val, int *out)
{
    long v;
    if (!val) return cli_usage_error("data", "%s needs a value", opt);
    if (!parse_long(val, INT_MIN, INT_MAX, &v)) return cli_usage_error("data", "%s: '%s' is not an integer", opt, val);
    *out = (int)v;
    return 0;
}

static int cmd_synth(int argc, char **argv)
{
    ex_synth_cfg cfg;
    ex_synth_defaults(&cfg);
    const char *out = NULL;
    struct { const char *name; int *dst; } ints[] = {
        { "--samples", &cfg.samples }, { "--image-size", &cfg.image_size }, { "--patch", &cfg.patch },
        { "--merge", &cfg.merge }, { "--window", &cfg.window }, { "--text-tokens", &cfg.text_tokens },
        { "--shards", &cfg.shards }, { "--mel-bins", &cfg.mel_bins }, { "--mel-frames", &cfg.mel_frames },
    };
    bool mel_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool known = false;
        for (size_t k = 0; k < sizeof ints / sizeof ints[0] && !known; k++)
            if (!strcmp(a, ints[k].name)) {
                if (int_option(a, v, ints[k].dst)) return 2;
                known = true;
                mel_given |= !strncmp(a, "--mel-", 6);
            }
        if (known) { i++; continue; }
        if (!strcmp(a, "--audio")) { cfg.audio = true; continue; }
        if (!strcmp(a, "--out")) {
            if (!v) return cli_usage_error("data", "--out needs a directory");
            out = v;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            if (!v) return cli_usage_error("data", "--seed needs a value");
            errno = 0;
            cfg.seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') return cli_usage_error("data", "--seed: '%s' is not an unsigned integer", v);
        } else {
            return cli_usage_error("data", "synth: unknown option '%s'", a);
        }
        i++;
    }
    if (!out) return cli_usage_error("data", "synth: --out DIR is required");
    if (mel_given && !cfg.audio) return cli_usage_error("data", "synth: --mel-bins and --mel-frames need --audio");
    char err[UTIL_ERR_LEN];
    if (ex_data_synth(out, &cfg, err)) return data_fail(err);
    printf("wrote %d samples in %d shards to %s%s\n", cfg.samples, cfg.shards, out, cfg.audio ? " (with audio)" : "");
    return 0;
}

static int cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL;
    int show = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--captions")) {
            if (int_option(argv[i], i + 1 < argc ? argv[i + 1] : NULL, &show)) return 2;
            if (show < 0) return cli_usage_error("data", "--captions: %d must be >= 0", show);
            i++;
        } else if (argv[i][0] == '-' || dir) {
            return cli_usage_error("data", "inspect: unexpected argument '%s'", argv[i]);
        } else {
            dir = argv[i];
        }
    }
    if (!dir) return cli_usage_error("data", "inspect: needs a data set directory");
    char err[UTIL_ERR_LEN];
    ex_dataset *ds;
    if (ex_data_open(dir, &ds, err)) return data_fail(err);
    const ex_dataset_info *in = ex_data_info(ds);
    printf("data set  %s (all shards verified)\n", dir);
    printf("samples   %d in %d shards, seed %llu\n", in->samples, in->shards, (unsigned long long)in->seed);
    printf("format    version %d\n", in->version);
    if (in->image_size > 0)
        printf("images    %dx%dx%d -> %d patches of %d (patch %d, merge %d, window %d)\n", in->image_size,
               in->image_size, in->channels, in->patches, in->patch_dim, in->patch, in->merge, in->window);
    else
        printf("images    none\n");
    if (in->mel_frames > 0)
        printf("audio     %d frames x %d mel bins per sample (values in [-1, 1])\n", in->mel_frames, in->mel_bins);
    printf("text      %d tokens (vocab %d: bytes, BOS=%d EOS=%d PAD=%d)\n", in->text_tokens, EX_VOCAB,
           EX_TOK_BOS, EX_TOK_EOS, EX_TOK_PAD);
    for (int i = 0; i < show && i < in->samples; i++) printf("caption   %d: %s\n", i, ex_data_caption(ds, i));
    ex_data_close(ds);
    return 0;
}

static int cmd_ckpt_inspect(int argc, char **argv)
{
    if (argc != 2) return cli_usage_error("data", "ckpt-inspect: needs exactly one FILE");
    char err[UTIL_ERR_LEN], shape[256];
    ex_ckpt *c;
    if (ex_ckpt_open(argv[1], &c, err)) return data_fail(err);
    int verified = 0;
    if (ex_ckpt_verify(c, &verified, err)) { ex_ckpt_close(c); return data_fail(err); }
    printf("%d tensors, %d metadata entries\n", ex_ckpt_count(c), ex_ckpt_meta_count(c));
    int sums = 0;
    for (int i = 0; i < ex_ckpt_meta_count(c); i++) {
        const char *k, *v;
        ex_ckpt_meta_at(c, i, &k, &v);
        if (!strncmp(k, "crc32:", 6)) sums++;
        else printf("meta %s = %s\n", k, v);
    }
    printf("checksums %d of %d tensors (CRC-32), all verified\n", verified, ex_ckpt_count(c));
    (void)sums;
    for (int i = 0; i < ex_ckpt_count(c); i++) {
        const ex_ckpt_entry *e = ex_ckpt_entry_at(c, i);
        size_t k = 0;
        shape[0] = 0;
        for (int d = 0; d < e->ndim && k < sizeof shape; d++)
            k += (size_t)snprintf(shape + k, sizeof shape - k, "%s%lld", d ? "," : "", (long long)e->shape[d]);
        printf("tensor %s %s [%s]\n", e->name, e->dtype, shape);
    }
    ex_ckpt_close(c);
    return 0;
}

/* Reads every tensor as F32 and writes them back (F32, or BF16 with --bf16)
 * with the same metadata: a round trip through both halves of the code. */
static int copy_checkpoint(ex_ckpt *c, const char *out, ex_dtype dtype, char *err)
{
    int n = ex_ckpt_count(c), nm = ex_ckpt_meta_count(c), rc = UTIL_OK;
    ex_named_tensor *t = util_calloc((size_t)n + 1, sizeof *t);
    const char **kv = util_calloc((size_t)(2 * nm + 1), sizeof *kv);
    if (!t || !kv) rc = util_fail(err, UTIL_ENOMEM, "ckpt-copy: out of memory");
    for (int i = 0; i < n && !rc; i++) {
        const ex_ckpt_entry *e = ex_ckpt_entry_at(c, i);
        t[i].name = e->name;
        t[i].dtype = dtype;
        t[i].ndim = e->ndim;
        memcpy(t[i].shape, e->shape, sizeof e->shape);
        size_t numel = (size_t)ex_ckpt_numel(e);
        t[i].data = util_malloc(numel * sizeof(float) + 1);
        rc = t[i].data ? ex_ckpt_read_f32(c, e, t[i].data, numel, err)
                       : util_fail(err, UTIL_ENOMEM, "ckpt-copy: out of memory for '%s'", e->name);
    }
    for (int i = 0; i < nm && !rc; i++) ex_ckpt_meta_at(c, i, &kv[2 * i], &kv[2 * i + 1]);
    if (!rc) rc = ex_ckpt_write(out, t, n, kv, nm, err);
    for (int i = 0; t && i < n; i++) util_free(t[i].data);
    util_free(t);
    util_free(kv);
    return rc;
}

static int cmd_ckpt_copy(int argc, char **argv)
{
    const char *paths[2] = { NULL, NULL };
    int np = 0;
    ex_dtype dtype = EX_DT_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bf16")) dtype = EX_DT_BF16;
        else if (argv[i][0] == '-' || np == 2) return cli_usage_error("data", "ckpt-copy: unexpected argument '%s'", argv[i]);
        else paths[np++] = argv[i];
    }
    if (np != 2) return cli_usage_error("data", "ckpt-copy: needs IN and OUT");
    char err[UTIL_ERR_LEN];
    ex_ckpt *c;
    if (ex_ckpt_open(paths[0], &c, err)) return data_fail(err);
    int rc = copy_checkpoint(c, paths[1], dtype, err);
    ex_ckpt_close(c);
    return rc ? data_fail(err) : 0;
}

int cmd_data(int argc, char **argv)
{
    if (argc < 2) return cli_usage_error("data", "needs a subcommand: synth, inspect, ckpt-inspect or ckpt-copy");
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) { data_usage(stdout); return 0; }
    if (!strcmp(sub, "synth")) return cmd_synth(argc - 1, argv + 1);
    if (!strcmp(sub, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(sub, "ckpt-inspect")) return cmd_ckpt_inspect(argc - 1, argv + 1);
    if (!strcmp(sub, "ckpt-copy")) return cmd_ckpt_copy(argc - 1, argv + 1);
    return cli_usage_error("data", "unknown subcommand '%s'", sub);
}
