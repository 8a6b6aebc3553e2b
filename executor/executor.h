/* executor: runs a plan for real. One algorithm, two backends (CPU: BLAS +
 * MPI; CUDA: cuBLAS + NCCL + own kernels) behind small kernel and
 * communicator interfaces. Public names are prefixed ex_. */
#ifndef DHP_EXECUTOR_H
#define DHP_EXECUTOR_H

#include "util/util.h"
#include "models/models.h"
#include "planner/planner.h"

/* ---- model, kernels, training step ---- */

/* ---- data set and checkpoints ---- */

/* Synthetic image-caption data set (format: executor/DATASET.md).
 * Text is byte-level: token = byte value 0..255, plus the specials below;
 * EX_VOCAB ids are reserved (259..271 unused). */
#define EX_TOK_BOS 256
#define EX_TOK_EOS 257
#define EX_TOK_PAD 258
#define EX_VOCAB 272
#define EX_DATA_CHANNELS 3
#define EX_DATA_CAPTION_MAX 64   /* caption bytes stored per sample */

typedef struct {
    int samples;      /* total samples, >= 1 */
    int image_size;   /* S: images are S x S RGB */
    int patch;        /* P: S % P == 0 */
    int merge;        /* M: patch-merger side, (S/P) % M == 0 */
    int window;       /* patches per attention window (a square, side % M == 0), 0 = none */
    int text_tokens;  /* T: token row length incl. BOS/EOS, >= 3 */
    int shards;       /* 1..samples */
    uint64_t seed;
} ex_synth_cfg;

/* Defaults used by `dhp data synth` when an option is not given. */
void ex_synth_defaults(ex_synth_cfg *cfg);
/* Checks shapes (names the offending option) without writing anything. */
int ex_synth_validate(const ex_synth_cfg *cfg, char *err);
/* Renders the data set into dir (created if missing): shard-NNNNN.bin files
 * then manifest.json, each written atomically. */
int ex_data_synth(const char *dir, const ex_synth_cfg *cfg, char *err);

typedef struct {
    int samples, image_size, channels, patch, merge, window, text_tokens, shards;
    int grid;          /* S / P patches per side */
    int patches;       /* grid * grid patches per image */
    int patch_dim;     /* C * P * P */
    uint64_t seed;     /* the synth seed (not the shuffle seed) */
} ex_dataset_info;

typedef struct ex_dataset ex_dataset;

/* Opens and fully validates a data set directory (manifest, every shard's
 * header, size and CRC32); shards are loaded into memory. */
int ex_data_open(const char *dir, ex_dataset **out, char *err);
void ex_data_close(ex_dataset *ds);
const ex_dataset_info *ex_data_info(const ex_dataset *ds);
/* Caption text of global sample i (NUL-terminated), NULL if out of range. */
const char *ex_data_caption(const ex_dataset *ds, int i);

/* Position of patch (row y, col x) in the model's patch order, for a grid
 * g x g, merge m and window w (patches, 0 = the whole image); see DATASET.md. */
int ex_patch_order(int y, int x, int grid, int merge, int window);

/* One rank's batch. Layouts (row-major):
 *   pixels    [n, patches, patch_dim]  float in [0,1], patch vector index c*P*P + py*P + px
 *   tokens    [n, T]  BOS, caption bytes (truncated to T-2), EOS, PAD...
 *   targets   [n, T]  targets[t] = tokens[t+1]; PAD at t = T-1
 *   loss_mask [n, T]  1 where targets[t] != PAD, else 0
 *   lengths   [n]     tokens that are not PAD (BOS..EOS)
 *   sample_ids[n]     global sample index of each row */
typedef struct {
    int n, patches, patch_dim, text_tokens;
    float *pixels;
    int32_t *tokens, *targets;
    float *loss_mask;
    int32_t *lengths, *sample_ids;
} ex_batch;

int ex_batch_alloc(ex_batch *b, const ex_dataset *ds, int n, char *err);
void ex_batch_free(ex_batch *b);

/* Full global batches per epoch (the tail that does not fill one is dropped). */
long ex_data_steps_per_epoch(const ex_dataset *ds, int global_batch);

/* Fills b with rank `rank` of `dp`'s slice of global batch number `step`
 * (counted from 0 across epochs: epoch = step / steps_per_epoch). The epoch's
 * order is a Fisher-Yates shuffle driven by splitmix64 seeded from
 * (shuffle_seed, epoch); rank r gets positions [r*L, (r+1)*L) of the global
 * batch, L = global_batch / dp, so the ranks' rows concatenated in rank order
 * are exactly the dp = 1 batch. b must hold L rows. The only state a resume
 * needs is (shuffle_seed, step). */
int ex_data_batch(ex_dataset *ds, uint64_t shuffle_seed, long step, int global_batch,
                  int rank, int dp, ex_batch *b, char *err);

/* Safetensors checkpoints (https://github.com/huggingface/safetensors):
 * u64 LE header length N, N bytes of JSON, then the raw LE tensor bytes. */
typedef enum { EX_DT_F32 = 0, EX_DT_BF16 = 1 } ex_dtype;
#define EX_CKPT_MAX_DIMS 8

/* A named F32 tensor in memory. dtype is the dtype on disk: F32, or BF16
 * (written round-to-nearest-even, widened back to F32 on read). */
typedef struct {
    const char *name;
    ex_dtype dtype;
    int ndim;
    int64_t shape[EX_CKPT_MAX_DIMS];
    float *data;
} ex_named_tensor;

/* Writes tensors (in order) and metadata pairs meta_kv[2i] = key,
 * meta_kv[2i+1] = value, via temp file + fsync + rename: on failure the old
 * file at path (if any) is untouched and no temp file remains. */
int ex_ckpt_write(const char *path, const ex_named_tensor *t, int n,
                  const char *const *meta_kv, int n_meta, char *err);

/* Reads into caller-allocated tensors; the file must hold exactly these
 * names with these shapes (any mismatch names the tensor). The on-disk
 * dtype may be F32 or BF16 whatever t[i].dtype says. */
int ex_ckpt_read_into(const char *path, const ex_named_tensor *t, int n, char *err);

/* Generic validated view of a checkpoint file. */
typedef struct {
    char *name;
    char dtype[8];       /* as in the file: "F32", "BF16", ... */
    int ndim;
    int64_t shape[EX_CKPT_MAX_DIMS];
    uint64_t begin, end; /* data_offsets, relative to the data section */
} ex_ckpt_entry;

typedef struct ex_ckpt ex_ckpt;

/* Validates header length, JSON, dtypes, shapes, offsets (inside the data
 * section, no overlaps, no holes) and the file size. */
int ex_ckpt_open(const char *path, ex_ckpt **out, char *err);
void ex_ckpt_close(ex_ckpt *c);
int ex_ckpt_count(const ex_ckpt *c);
const ex_ckpt_entry *ex_ckpt_entry_at(const ex_ckpt *c, int i);
const ex_ckpt_entry *ex_ckpt_find(const ex_ckpt *c, const char *name);
/* Metadata value for key, NULL if absent. */
const char *ex_ckpt_meta(const ex_ckpt *c, const char *key);
int ex_ckpt_meta_count(const ex_ckpt *c);
void ex_ckpt_meta_at(const ex_ckpt *c, int i, const char **key, const char **value);
/* Reads entry e (F32 or BF16 on disk) as floats into out[numel]. */
int ex_ckpt_read_f32(ex_ckpt *c, const ex_ckpt_entry *e, float *out, size_t numel, char *err);
int64_t ex_ckpt_numel(const ex_ckpt_entry *e);

#endif
