#include "test.h"
#include "executor/executor.h"

#include <stdlib.h>
#include <unistd.h>

/* A fresh data set in a temp dir; caller frees with test_rm_tree. */
static int make_set(char *dir, size_t n, const ex_synth_cfg *cfg)
{
    if (test_tmp_dir(dir, n, "data")) return -1;
    char err[UTIL_ERR_LEN];
    int rc = ex_data_synth(dir, cfg, err);
    if (rc) printf("unit: synth failed: %s\n", err);
    return rc;
}

static ex_synth_cfg small_cfg(void)
{
    ex_synth_cfg c;
    ex_synth_defaults(&c);
    c.samples = 24;
    c.shards = 3;
    c.image_size = 16;
    c.patch = 2;
    c.merge = 2;
    c.window = 16;
    c.text_tokens = 40;
    c.seed = 7;
    return c;
}

static unsigned char *read_all(const char *path, size_t *len)
{
    char *buf, err[UTIL_ERR_LEN];
    if (util_read_file(path, &buf, len, err)) return NULL;
    return (unsigned char *)buf;
}

static void write_raw(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(p, 1, n, f); fclose(f); }
}

/* Shard k of the set in dir: its path into path, its bytes (util_free
 * them), NULL if unreadable. */
static unsigned char *read_shard(const char *dir, int k, char *path, size_t path_n, size_t *len)
{
    snprintf(path, path_n, "%s/shard-%05d.bin", dir, k);
    return read_all(path, len);
}

/* make_set, then the set opened (ex_data_close it; test_rm_tree the dir
 * either way); NULL with why printed when either fails. */
static ex_dataset *open_set(char *dir, size_t n, const ex_synth_cfg *cfg)
{
    ex_dataset *ds = NULL;
    char err[UTIL_ERR_LEN];
    if (make_set(dir, n, cfg)) return NULL;
    if (ex_data_open(dir, &ds, err)) {
        printf("unit: open failed: %s\n", err);
        ex_data_close(ds);
        return NULL;
    }
    return ds;
}

TEST(data_patch_order_formula_examples)
{
    /* grid 4, merge 2, no window: 2x2 blocks in row-major order. */
    CHECK_EQ_INT(ex_patch_order(0, 0, 4, 2, 0), 0);
    CHECK_EQ_INT(ex_patch_order(0, 1, 4, 2, 0), 1);
    CHECK_EQ_INT(ex_patch_order(1, 0, 4, 2, 0), 2);
    CHECK_EQ_INT(ex_patch_order(1, 1, 4, 2, 0), 3);
    CHECK_EQ_INT(ex_patch_order(0, 2, 4, 2, 0), 4);
    CHECK_EQ_INT(ex_patch_order(2, 0, 4, 2, 0), 8);
    /* grid 8, merge 2, window 16 (4x4 patches): 4 windows of 16. */
    CHECK_EQ_INT(ex_patch_order(0, 4, 8, 2, 16), 16);
    CHECK_EQ_INT(ex_patch_order(4, 0, 8, 2, 16), 32);
    CHECK_EQ_INT(ex_patch_order(1, 5, 8, 2, 16), 19);
    CHECK_EQ_INT(ex_patch_order(2, 6, 8, 2, 16), 28);
    CHECK_EQ_INT(ex_patch_order(7, 7, 8, 2, 16), 63);
    /* merge 1, no window: plain row-major. */
    CHECK_EQ_INT(ex_patch_order(3, 2, 5, 1, 0), 17);
}

TEST(data_patch_order_groups_are_spatial_blocks)
{
    const int grid = 8, merge = 2, window = 16, side = 4;
    int seen[64] = { 0 }, gy[64], gx[64];
    for (int y = 0; y < grid; y++)
        for (int x = 0; x < grid; x++) {
            int p = ex_patch_order(y, x, grid, merge, window);
            CHECK(p >= 0 && p < 64);
            seen[p]++;
            gy[p] = y; gx[p] = x;
        }
    for (int p = 0; p < 64; p++) CHECK_EQ_INT(seen[p], 1);
    for (int p = 0; p < 64; p++) {
        int g0 = p / (merge * merge) * (merge * merge), w0 = p / window * window;
        CHECK_EQ_INT(gy[p] / merge, gy[g0] / merge);
        CHECK_EQ_INT(gx[p] / merge, gx[g0] / merge);
        CHECK_EQ_INT(gy[p] / side, gy[w0] / side);
        CHECK_EQ_INT(gx[p] / side, gx[w0] / side);
    }
}

TEST(data_shard_round_trip_pixels_and_tokens)
{
    ex_synth_cfg cfg = small_cfg();
    char dir[64], err[UTIL_ERR_LEN];
    ex_dataset *ds = open_set(dir, sizeof dir, &cfg);
    CHECK(ds != NULL);
    const ex_dataset_info *in = ex_data_info(ds);
    CHECK_EQ_INT(in->samples, 24);
    CHECK_EQ_INT(in->shards, 3);
    CHECK_EQ_INT(in->grid, 8);
    CHECK_EQ_INT(in->patches, 64);
    CHECK_EQ_INT(in->patch_dim, 12);

    ex_data_rows b;
    CHECK_OK(ex_batch_alloc(&b, ds, 8, err));
    CHECK_OK(ex_data_batch(ds, 99, 1, 8, 0, 1, &b, err));
    /* Compare against the raw shard bytes: sample s lives in shard s/8 at record s%8. */
    size_t rb = 8 + EX_DATA_CAPTION_MAX + 16 * 16 * 3;
    for (int row = 0; row < b.n; row++) {
        int s = b.sample_ids[row];
        char path[128];
        size_t len;
        unsigned char *raw = read_shard(dir, s / 8, path, sizeof path, &len);
        CHECK(raw != NULL);
        const unsigned char *rec = raw + 72 + (size_t)(s % 8) * rb;
        for (int y = 0; y < 16; y += 3)
            for (int x = 0; x < 16; x += 5)
                for (int c = 0; c < 3; c++) {
                    int pos = ex_patch_order(y / 2, x / 2, 8, 2, 16);
                    float got = b.pixels[((size_t)row * 64 + pos) * 12 + (c * 2 + y % 2) * 2 + x % 2];
                    float want = rec[72 + ((size_t)y * 16 + x) * 3 + c] / 255.0f;
                    if (got != want) { util_free(raw); CHECK_MSG(0, "sample %d pixel (%d,%d,%d)", s, y, x, c); }
                }
        const char *cap = ex_data_caption(ds, s);
        int n = (int)strlen(cap);
        CHECK(memcmp(cap, rec + 8, (size_t)n) == 0 && rec[4] == n);
        util_free(raw);
        const int32_t *tok = b.tokens + row * 40, *tgt = b.targets + row * 40;
        const float *mask = b.loss_mask + row * 40;
        CHECK_EQ_INT(tok[0], EX_TOK_BOS);
        for (int t = 0; t < n; t++) CHECK_EQ_INT(tok[1 + t], (unsigned char)cap[t]);
        CHECK_EQ_INT(tok[1 + n], EX_TOK_EOS);
        CHECK_EQ_INT(b.lengths[row], n + 2);
        float msum = 0;
        for (int t = 0; t < 40; t++) {
            if (t >= n + 2) CHECK_EQ_INT(tok[t], EX_TOK_PAD);
            CHECK_EQ_INT(tgt[t], t + 1 < 40 ? tok[t + 1] : EX_TOK_PAD);
            CHECK(mask[t] == (tgt[t] != EX_TOK_PAD ? 1.0f : 0.0f));
            msum += mask[t];
        }
        CHECK_EQ_INT((int)msum, n + 1);
    }
    ex_batch_free(&b);
    ex_data_close(ds);
    test_rm_tree(dir);
}

TEST(data_captions_truncate_but_keep_bos_eos)
{
    ex_synth_cfg cfg = small_cfg();
    cfg.text_tokens = 10;
    char dir[64], err[UTIL_ERR_LEN];
    ex_dataset *ds = open_set(dir, sizeof dir, &cfg);
    CHECK(ds != NULL);
    ex_data_rows b;
    CHECK_OK(ex_batch_alloc(&b, ds, 4, err));
    CHECK_OK(ex_data_batch(ds, 1, 0, 4, 0, 1, &b, err));
    for (int r = 0; r < 4; r++) {
        const char *cap = ex_data_caption(ds, b.sample_ids[r]);
        CHECK(strlen(cap) > 8);
        CHECK_EQ_INT(b.tokens[r * 10], EX_TOK_BOS);
        CHECK(memcmp(cap, "a ", 2) == 0 && b.tokens[r * 10 + 1] == 'a');
        CHECK_EQ_INT(b.tokens[r * 10 + 8], (unsigned char)cap[7]);
        CHECK_EQ_INT(b.tokens[r * 10 + 9], EX_TOK_EOS);
        CHECK_EQ_INT(b.lengths[r], 10);
        CHECK(b.loss_mask[r * 10 + 8] == 1.0f && b.loss_mask[r * 10 + 9] == 0.0f);
    }
    ex_batch_free(&b);
    ex_data_close(ds);
    test_rm_tree(dir);
}

TEST(data_synth_is_deterministic_in_the_seed)
{
    ex_synth_cfg cfg = small_cfg();
    char a[64], b[64], c[64];
    CHECK(make_set(a, sizeof a, &cfg) == 0);
    CHECK(make_set(b, sizeof b, &cfg) == 0);
    cfg.seed = 8;
    CHECK(make_set(c, sizeof c, &cfg) == 0);
    char path[128];
    size_t la, lb, lc;
    unsigned char *da = read_shard(a, 1, path, sizeof path, &la), *db = read_shard(b, 1, path, sizeof path, &lb),
                  *dc = read_shard(c, 1, path, sizeof path, &lc);
    bool same = da && db && la == lb && !memcmp(da, db, la);
    bool differs = da && dc && la == lc && memcmp(da + 72, dc + 72, la - 76) != 0;
    util_free(da); util_free(db); util_free(dc);
    test_rm_tree(a); test_rm_tree(b); test_rm_tree(c);
    CHECK(same);
    CHECK(differs);
}

/* ex_data_open's verdict on dir (its message in err). */
static int open_after(const char *dir, char *err)
{
    ex_dataset *ds = NULL;
    int rc = ex_data_open(dir, &ds, err);
    ex_data_close(ds);
    return rc;
}

/* A small set in dir (test_rm_tree it) whose shard k is rewritten as edit
 * leaves its bytes (edit returns how many of them to keep); path names the
 * shard. False when the set or the shard could not be made or read. */
static bool set_with_edited_shard(char *dir, size_t dir_n, int k, char *path, size_t path_n,
                                  size_t (*edit)(unsigned char *d, size_t len))
{
    ex_synth_cfg cfg = small_cfg();
    if (make_set(dir, dir_n, &cfg)) return false;
    size_t len;
    unsigned char *d = read_shard(dir, k, path, path_n, &len);
    if (!d) return false;
    write_raw(path, d, edit(d, len));
    util_free(d);
    return true;
}

static size_t flip_a_middle_bit(unsigned char *d, size_t len) { d[len / 2] ^= 0x10; return len; }
static size_t drop_the_last_100_bytes(unsigned char *d, size_t len) { (void)d; return len - 100; }
static size_t break_the_magic(unsigned char *d, size_t len) { d[0] = 'X'; return len; }

TEST(data_corrupted_byte_is_a_crc_error_naming_the_file)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(set_with_edited_shard(dir, sizeof dir, 1, path, sizeof path, flip_a_middle_bit));
    int rc = open_after(dir, err);
    test_rm_tree(dir);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "shard-00001.bin") && strstr(err, "CRC32 mismatch"), "err: %s", err);
}

TEST(data_truncated_shard_is_reported)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(set_with_edited_shard(dir, sizeof dir, 2, path, sizeof path, drop_the_last_100_bytes));
    int rc = open_after(dir, err);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "shard-00002.bin") && strstr(err, "truncated"), "err: %s", err);
    write_raw(path, "DHPD", 4);
    rc = open_after(dir, err);
    test_rm_tree(dir);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "shard-00002.bin") && strstr(err, "truncated"), "err: %s", err);
}

TEST(data_bad_magic_and_missing_shard)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(set_with_edited_shard(dir, sizeof dir, 0, path, sizeof path, break_the_magic));
    int rc = open_after(dir, err);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "shard-00000.bin") && strstr(err, "bad magic"), "err: %s", err);
    unlink(path);
    rc = open_after(dir, err);
    CHECK(rc != UTIL_OK);
    CHECK_MSG(strstr(err, "shard-00000.bin") != NULL, "err: %s", err);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    unlink(path);
    rc = open_after(dir, err);
    test_rm_tree(dir);
    CHECK(rc != UTIL_OK);
    CHECK_MSG(strstr(err, "manifest.json") != NULL, "err: %s", err);
}

TEST(data_shard_disagreeing_with_manifest_is_rejected)
{
    ex_synth_cfg cfg = small_cfg();
    char a[64], b[64], pa[128], pb[128], err[UTIL_ERR_LEN];
    CHECK(make_set(a, sizeof a, &cfg) == 0);
    cfg.seed = 3;
    CHECK(make_set(b, sizeof b, &cfg) == 0);
    /* Shard 1 of another (valid, same-shaped) set: CRC fine, seed differs. */
    snprintf(pa, sizeof pa, "%s/shard-00001.bin", a);
    size_t len;
    unsigned char *d = read_shard(b, 1, pb, sizeof pb, &len);
    CHECK(d != NULL);
    write_raw(pa, d, len);
    util_free(d);
    int rc = open_after(a, err);
    test_rm_tree(a); test_rm_tree(b);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK_MSG(strstr(err, "shard-00001.bin") && strstr(err, "seed"), "err: %s", err);
}

TEST(data_synth_rejects_bad_layouts)
{
    ex_synth_cfg c = small_cfg();
    char err[UTIL_ERR_LEN];
    c.window = 12;
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "window"));
    c = small_cfg(); c.window = 9;   /* side 3 not a multiple of merge 2 */
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "window"));
    c = small_cfg(); c.patch = 3;
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "patch"));
    c = small_cfg(); c.merge = 3;
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "merge"));
    c = small_cfg(); c.shards = 25;
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "shards"));
    c = small_cfg(); c.text_tokens = 2;
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "text-tokens"));
    c = small_cfg(); c.window = 0;
    CHECK_OK(ex_synth_validate(&c, err));
}

TEST(data_shuffle_is_deterministic_and_covers_each_epoch)
{
    ex_synth_cfg cfg = small_cfg();
    char dir[64], err[UTIL_ERR_LEN];
    CHECK(make_set(dir, sizeof dir, &cfg) == 0);
    ex_dataset *ds, *ds2;
    CHECK_OK(ex_data_open(dir, &ds, err));
    CHECK_OK(ex_data_open(dir, &ds2, err));
    ex_data_rows b, b2;
    CHECK_OK(ex_batch_alloc(&b, ds, 6, err));
    CHECK_OK(ex_batch_alloc(&b2, ds, 6, err));
    CHECK_EQ_INT(ex_data_steps_per_epoch(ds, 6), 4);
    int ids[2][24];
    for (int epoch = 0; epoch < 2; epoch++) {
        int seen[24] = { 0 };
        for (int k = 0; k < 4; k++) {
            long step = epoch * 4 + k;
            CHECK_OK(ex_data_batch(ds, 42, step, 6, 0, 1, &b, err));
            /* A second loader jumping straight to this step (a resume) agrees. */
            CHECK_OK(ex_data_batch(ds2, 42, step, 6, 0, 1, &b2, err));
            CHECK(memcmp(b.sample_ids, b2.sample_ids, 6 * sizeof(int32_t)) == 0);
            for (int r = 0; r < 6; r++) { seen[b.sample_ids[r]]++; ids[epoch][k * 6 + r] = b.sample_ids[r]; }
        }
        for (int s = 0; s < 24; s++) CHECK_EQ_INT(seen[s], 1);
    }
    CHECK(memcmp(ids[0], ids[1], sizeof ids[0]) != 0);
    CHECK_OK(ex_data_batch(ds, 43, 0, 6, 0, 1, &b, err));
    CHECK(memcmp(ids[0], b.sample_ids, 6 * sizeof(int32_t)) != 0);
    ex_batch_free(&b); ex_batch_free(&b2);
    ex_data_close(ds); ex_data_close(ds2);
    test_rm_tree(dir);
}

TEST(data_dp_ranks_partition_the_global_batch)
{
    ex_synth_cfg cfg = small_cfg();
    char dir[64], err[UTIL_ERR_LEN];
    ex_dataset *ds = open_set(dir, sizeof dir, &cfg);
    CHECK(ds != NULL);
    const int G = 8;
    ex_data_rows full;
    CHECK_OK(ex_batch_alloc(&full, ds, G, err));
    const int dps[] = { 2, 4, 8 };
    for (long step = 0; step < 5; step++) {   /* crosses the epoch boundary at 3 */
        CHECK_OK(ex_data_batch(ds, 5, step, G, 0, 1, &full, err));
        for (size_t k = 0; k < sizeof dps / sizeof dps[0]; k++) {
            int dp = dps[k], L = G / dp;
            ex_data_rows part;
            CHECK_OK(ex_batch_alloc(&part, ds, L, err));
            for (int r = 0; r < dp; r++) {
                CHECK_OK(ex_data_batch(ds, 5, step, G, r, dp, &part, err));
                size_t px = (size_t)part.patches * part.patch_dim, T = (size_t)part.text_tokens;
                bool same = !memcmp(part.sample_ids, full.sample_ids + r * L, L * sizeof(int32_t)) &&
                            !memcmp(part.pixels, full.pixels + r * L * px, L * px * sizeof(float)) &&
                            !memcmp(part.tokens, full.tokens + r * L * T, L * T * sizeof(int32_t)) &&
                            !memcmp(part.loss_mask, full.loss_mask + r * L * T, L * T * sizeof(float));
                if (!same) { ex_batch_free(&part); CHECK_MSG(0, "step %ld dp %d rank %d differs", step, dp, r); }
            }
            ex_batch_free(&part);
        }
    }
    ex_batch_free(&full);
    ex_data_close(ds);
    test_rm_tree(dir);
}

TEST(data_batch_rejects_bad_sharding)
{
    ex_synth_cfg cfg = small_cfg();
    char dir[64], err[UTIL_ERR_LEN];
    ex_dataset *ds = open_set(dir, sizeof dir, &cfg);
    CHECK(ds != NULL);
    ex_data_rows b;
    CHECK_OK(ex_batch_alloc(&b, ds, 3, err));
    int r1 = ex_data_batch(ds, 1, 0, 8, 0, 3, &b, err);
    bool m1 = strstr(err, "does not divide") != NULL;
    int r2 = ex_data_batch(ds, 1, 0, 9, 3, 3, &b, err);
    bool m2 = strstr(err, "rank 3") != NULL;
    int r3 = ex_data_batch(ds, 1, 0, 12, 0, 3, &b, err);   /* needs 4 rows, buffer has 3 */
    bool m3 = strstr(err, "buffer") != NULL;
    int r4 = ex_data_batch(ds, 1, 0, 25, 0, 1, &b, err);
    ex_batch_free(&b);
    ex_data_close(ds);
    test_rm_tree(dir);
    CHECK(r1 == UTIL_EINVAL && m1);
    CHECK(r2 == UTIL_EINVAL && m2);
    CHECK(r3 == UTIL_EINVAL && m3);
    CHECK(r4 == UTIL_EINVAL);
}

/* ------------------------------------------------------------------ audio */

static ex_synth_cfg audio_cfg(int image_size)
{
    ex_synth_cfg c = small_cfg();
    c.audio = true;
    c.image_size = image_size;
    c.mel_bins = 16;
    c.mel_frames = 32;
    c.text_tokens = 64;
    return c;
}

/* What a clip's frames show, from the decoded values alone: the frames where
 * the sound is (some bin well above the floor), the loudest bin in the first
 * and the last of them, how many of those frames have nearly every bin loud. */
typedef struct { int on, first_peak, last_peak, loud_all; double mean_peak; } clip_view;

static clip_view view_clip(const float *mel, int F, int B)
{
    clip_view v = { 0, -1, -1, 0, 0 };
    for (int t = 0; t < F; t++) {
        const float *f = mel + (size_t)t * B;
        int peak = 0, loud = 0;
        for (int b = 0; b < B; b++) {
            if (f[b] > f[peak]) peak = b;
            loud += f[b] > 0.0f;
        }
        if (f[peak] < 0.0f) continue;   /* the floor stays below -0.7 */
        v.on++;
        if (v.first_peak < 0) v.first_peak = peak;
        v.last_peak = peak;
        v.mean_peak += peak;
        v.loud_all += loud >= B - 1;
    }
    if (v.on) v.mean_peak /= v.on;
    return v;
}

/* Every sample's clip shows the sound its caption names: a tone's band in
 * the named third of the bins, a chirp's band moving the named way, a burst
 * loud in every bin for about F/8 (short) or F/2 (long) frames; values stay
 * in [-1, 1]; the caption is the image's (unchanged by --audio) then the
 * sound's; the record's kind byte agrees. */
TEST(data_audio_clips_show_what_their_captions_say)
{
    ex_synth_cfg cfg = audio_cfg(16), plain = small_cfg();
    char dir[64], pdir[64], err[UTIL_ERR_LEN];
    CHECK(make_set(dir, sizeof dir, &cfg) == 0);
    CHECK(make_set(pdir, sizeof pdir, &plain) == 0);
    ex_dataset *ds, *ps;
    CHECK_OK(ex_data_open(dir, &ds, err));
    CHECK_OK(ex_data_open(pdir, &ps, err));
    const ex_dataset_info *in = ex_data_info(ds);
    CHECK_EQ_INT(in->version, 2);
    CHECK_EQ_INT(in->mel_bins, 16);
    CHECK_EQ_INT(in->mel_frames, 32);
    CHECK_EQ_INT(ex_data_info(ps)->version, 1);
    CHECK_EQ_INT(ex_data_info(ps)->mel_frames, 0);
    ex_data_rows b, pb;
    CHECK_OK(ex_batch_alloc(&b, ds, 24, err));
    CHECK_OK(ex_batch_alloc(&pb, ps, 24, err));
    CHECK_OK(ex_data_batch(ds, 5, 0, 24, 0, 1, &b, err));
    CHECK_OK(ex_data_batch(ps, 5, 0, 24, 0, 1, &pb, err));
    CHECK(pb.mel == NULL && b.mel != NULL);
    int kinds[3] = { 0, 0, 0 };
    char what[160] = "";
    for (int r = 0; r < 24 && !what[0]; r++) {
        const char *cap = ex_data_caption(ds, b.sample_ids[r]), *pcap = ex_data_caption(ps, pb.sample_ids[r]);
        const float *mel = b.mel + (size_t)r * 32 * 16;
        size_t pl = strlen(pcap);
        for (int i = 0; i < 32 * 16; i++)
            if (!(mel[i] >= -1.0f && mel[i] <= 1.0f)) snprintf(what, sizeof what, "sample %d: value %g", r, mel[i]);
        if (b.sample_ids[r] != pb.sample_ids[r] || strncmp(cap, pcap, pl) || strncmp(cap + pl, ", a ", 4) ||
            memcmp(b.pixels + (size_t)r * 64 * 12, pb.pixels + (size_t)r * 64 * 12, 64 * 12 * sizeof(float)))
            snprintf(what, sizeof what, "sample %d: '%s' is not the image set's '%s' and a sound", r, cap, pcap);
        const char *snd = cap + pl + 2;
        clip_view v = view_clip(mel, 32, 16);
        bool ok;
        if (strstr(snd, "tone")) {
            double want = strstr(snd, "low") ? 0.2 * 16 : strstr(snd, "mid") ? 0.5 * 16 : 0.8 * 16;
            ok = v.on >= 16 && fabs(v.mean_peak - want) < 1.0;
            kinds[0]++;
        } else if (strstr(snd, "chirp")) {
            bool rising = strstr(snd, "rising") != NULL;
            ok = v.on >= 16 && (rising ? v.last_peak - v.first_peak >= 8 : v.first_peak - v.last_peak >= 8);
            kinds[1]++;
        } else {
            int len = strstr(snd, "short") ? 4 : 16;
            ok = strstr(snd, "noise burst") && v.loud_all >= len - 1 && v.on == len;
            kinds[2]++;
        }
        if (!ok && !what[0])
            snprintf(what, sizeof what, "sample %d '%s': %d frames on, peaks %d -> %d (mean %.1f), %d all loud", r, snd,
                     v.on, v.first_peak, v.last_peak, v.mean_peak, v.loud_all);
    }
    ex_batch_free(&b); ex_batch_free(&pb);
    ex_data_close(ds); ex_data_close(ps);
    test_rm_tree(dir); test_rm_tree(pdir);
    CHECK_MSG(!what[0], "%s", what);
    CHECK_MSG(kinds[0] && kinds[1] && kinds[2], "24 samples hold %d tones, %d chirps, %d bursts", kinds[0], kinds[1], kinds[2]);
}

/* --image-size 0 with audio: no pixels, the caption is the sound's alone;
 * the rows' clips are the dp = 1 batch's, split by rank. */
TEST(data_audio_only_set_and_its_dp_slices)
{
    ex_synth_cfg cfg = audio_cfg(0);
    char dir[64], err[UTIL_ERR_LEN];
    ex_dataset *ds = open_set(dir, sizeof dir, &cfg);
    CHECK(ds != NULL);
    const ex_dataset_info *in = ex_data_info(ds);
    CHECK_EQ_INT(in->patches, 0);
    CHECK_EQ_INT(in->grid, 0);
    ex_data_rows full, part;
    CHECK_OK(ex_batch_alloc(&full, ds, 8, err));
    CHECK_OK(ex_batch_alloc(&part, ds, 4, err));
    CHECK_OK(ex_data_batch(ds, 3, 2, 8, 0, 1, &full, err));
    CHECK_OK(ex_data_batch(ds, 3, 2, 8, 1, 2, &part, err));
    bool same = !memcmp(part.mel, full.mel + (size_t)4 * 32 * 16, (size_t)4 * 32 * 16 * sizeof(float));
    const char *cap = ex_data_caption(ds, 0);
    bool sound_only = !strncmp(cap, "a ", 2) && (strstr(cap, "tone") || strstr(cap, "chirp") || strstr(cap, "burst")) &&
                      !strchr(cap, ',');
    ex_data_rows wrong;
    int mismatch = UTIL_OK;
    ex_synth_cfg other = audio_cfg(0);
    other.mel_frames = 16;
    char odir[64];
    ex_dataset *os = open_set(odir, sizeof odir, &other);
    CHECK(os != NULL);
    CHECK_OK(ex_batch_alloc(&wrong, os, 8, err));
    mismatch = ex_data_batch(ds, 3, 2, 8, 0, 1, &wrong, err);   /* 16-frame buffer for a 32-frame set */
    ex_batch_free(&wrong); ex_data_close(os); test_rm_tree(odir);
    ex_batch_free(&full); ex_batch_free(&part);
    ex_data_close(ds);
    test_rm_tree(dir);
    CHECK(same);
    CHECK_MSG(sound_only, "caption '%s'", cap);
    CHECK_EQ_INT(mismatch, UTIL_EINVAL);
}

static void rewrite_manifest(const char *dir, const char *from, const char *to)
{
    char path[128];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    size_t len;
    unsigned char *m = read_all(path, &len);
    char *text = calloc(len + strlen(to) + 1, 1), *at = m ? strstr((char *)m, from) : NULL;
    if (at) {
        size_t pre = (size_t)(at - (char *)m);
        memcpy(text, m, pre);
        strcpy(text + pre, to);
        strcat(text, at + strlen(from));
        write_raw(path, text, strlen(text));
    }
    util_free(m);
    free(text);
}

/* Version 1 sets load as before (no audio); the audio section is versioned
 * and must agree with the manifest's version and the shards' headers. */
TEST(data_format_versions_and_the_audio_section_are_checked)
{
    ex_synth_cfg a = audio_cfg(16), v1 = small_cfg();
    char da[64], d1[64], err[UTIL_ERR_LEN];
    CHECK(make_set(da, sizeof da, &a) == 0);
    CHECK(make_set(d1, sizeof d1, &v1) == 0);
    char path[128];
    size_t la, l1;
    unsigned char *ra = read_shard(da, 0, path, sizeof path, &la), *r1 = read_shard(d1, 0, path, sizeof path, &l1);
    bool headers = ra && r1 && ra[8] == 2 && ra[12] == 80 && r1[8] == 1 && r1[12] == 72;
    util_free(ra); util_free(r1);
    /* the audio section's own version */
    rewrite_manifest(da, "\"version\":\t1", "\"version\":\t7");
    int rc_section = open_after(da, err);
    bool names_section = strstr(err, "audio") && strstr(err, "version") && strstr(err, "7");
    rewrite_manifest(da, "\"version\":\t7", "\"version\":\t1");
    /* a version 2 manifest without the section */
    rewrite_manifest(da, "\"audio\"", "\"audio_gone\"");
    int rc_missing = open_after(da, err);
    bool names_missing = strstr(err, ".audio") != NULL;
    /* version 1 shards under a version 2 manifest */
    rewrite_manifest(d1, "\"version\":\t1", "\"version\":\t2,\n\t\"audio\":\t{\"version\": 1, \"mel_bins\": 16, \"mel_frames\": 32}");
    int rc_mixed = open_after(d1, err);
    bool names_shard = strstr(err, "shard-00000.bin") && strstr(err, "version 1");
    test_rm_tree(da); test_rm_tree(d1);
    CHECK(headers);
    CHECK_EQ_INT(rc_section, UTIL_EUNSUPPORTED);
    CHECK_MSG(names_section, "err: %s", err);
    CHECK_EQ_INT(rc_missing, UTIL_EINVAL);
    CHECK(names_missing);
    CHECK_EQ_INT(rc_mixed, UTIL_EUNSUPPORTED);
    CHECK_MSG(names_shard, "err: %s", err);
}

TEST(data_synth_rejects_bad_audio_layouts)
{
    ex_synth_cfg c = audio_cfg(16);
    char err[UTIL_ERR_LEN];
    CHECK_OK(ex_synth_validate(&c, err));
    c.mel_frames = 31;
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "mel-frames 31"));
    c = audio_cfg(16); c.mel_frames = 4;
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "mel-frames"));
    c = audio_cfg(16); c.mel_bins = 0;
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "mel-bins"));
    c = small_cfg(); c.image_size = 0;   /* no images needs audio */
    CHECK(ex_synth_validate(&c, err) == UTIL_EINVAL && strstr(err, "image-size 0"));
}

/* The data set against a model, before anything is allocated. */
TEST(data_audio_is_checked_against_the_model)
{
    ex_synth_cfg a = audio_cfg(16), v1 = small_cfg();
    char da[64], d1[64], err[UTIL_ERR_LEN];
    CHECK(make_set(da, sizeof da, &a) == 0);
    CHECK(make_set(d1, sizeof d1, &v1) == 0);
    ex_dataset *sa, *s1;
    CHECK_OK(ex_data_open(da, &sa, err));
    CHECK_OK(ex_data_open(d1, &s1, err));
    model_t audio, vl, omni;
    CHECK_OK(model_load("tiny-audio", &audio, err));
    CHECK_OK(model_load("tiny-vl", &vl, err));
    CHECK_OK(model_load("tiny-omni", &omni, err));
    int ok_audio = ex_data_check_audio(ex_data_info(sa), &audio, err);
    int ok_omni = ex_data_check_audio(ex_data_info(sa), &omni, err);
    int ok_plain = ex_data_check_audio(ex_data_info(s1), &vl, err);
    int no_encoder = ex_data_check_audio(ex_data_info(sa), &vl, err);
    bool names1 = strstr(err, "no audio encoder") && strstr(err, "mel_bins") && !strchr(err, '\n');
    int no_audio = ex_data_check_audio(ex_data_info(s1), &audio, err);
    bool names2 = strstr(err, "has no audio") != NULL;
    audio.mod[model_find_kind(&audio, MODEL_AUDIO)].in_channels = 80;
    int bins = ex_data_check_audio(ex_data_info(sa), &audio, err);
    bool names3 = strstr(err, "mel_bins 16") && strstr(err, "in_channels 80");
    ex_data_close(sa); ex_data_close(s1);
    test_rm_tree(da); test_rm_tree(d1);
    CHECK_OK(ok_audio);
    CHECK_OK(ok_omni);
    CHECK_OK(ok_plain);
    CHECK_EQ_INT(no_encoder, UTIL_EINVAL);
    CHECK(names1);
    CHECK_EQ_INT(no_audio, UTIL_EINVAL);
    CHECK(names2);
    CHECK_EQ_INT(bins, UTIL_EINVAL);
    CHECK(names3);
}
