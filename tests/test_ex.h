/* Executor test helpers shared by tests/test_executor*.c and tests/test_audio.c:
 * in-process ranks (threads) with tp / sp collectives, shard gathering, and
 * the PyTorch reference comparison (tests/t_torch_ref.sh), tiny-vl and a
 * batch of it. */
#ifndef DHP_TEST_EX_H
#define DHP_TEST_EX_H

#include "executor/executor.h"

#include <pthread.h>
#include <stdbool.h>

/* Uniform in [-1, 1) from a state of its own (an LCG's top 24 bits), and n
 * such values times scale (free them). */
float test_urand(void);
float *test_rnd(size_t n, float scale);

/* The zoo's tiny-vl / tiny-vl-window shapes (the models/ loader's contract),
 * filled in m. */
void test_tiny_vl(model_t *m, bool window);
/* A batch of 2 samples for tiny-vl: 3 images of 8 x 8 patches (1 and 2 a
 * sample), 10 text tokens a sample, random pixels and tokens
 * (test_urand); test_free_batch frees them. */
typedef struct {
    ex_batch b;
    float *pixels;
    int32_t *tokens;
    int ipb[2];
} test_batch;
void test_make_batch(test_batch *tb, const model_t *m);
void test_free_batch(test_batch *tb);
/* test_tiny_vl and its test_make_batch: most model-level tests' start. */
void test_tiny_vl_batch(model_t *m, bool window, test_batch *tb);
/* A loss mask of that batch [2, 10]: a few positions of each sample dropped. */
extern const float test_batch_mask[20];
/* Whether two models hold bit-identical buffers k of module `module`. */
bool test_same_buffer(ex_model *a, ex_model *b, int module, ex_buffer_kind k);

/* A 2-D grid of in-process ranks (threads), rank k = sp_rank * tp + tp_rank:
 * allreduce_sum / _max over the tp group (same sp rank), alltoall over the
 * sp group (same tp rank). */
typedef struct { pthread_barrier_t bar; int size; float *slot[4]; const float *send[4]; } grp_t;
typedef struct { grp_t *tp, *sp; int tr, sr; } grid_ctx;
int grid_sum(void *ctx, float *buf, size_t n);
int grid_max(void *ctx, float *buf, size_t n);
int grid_alltoall(void *ctx, const float *send, float *recv, size_t chunk);

/* Rebuilds every gradient (or parameter) of whole from the ranks' shards using
 * ex_param start / shape: sharded tensors from every rank, replicated ones
 * from tp rank 0 (the others must hold exactly the same values). With
 * sum_sp, ranks of different sp ranks (sp_rank[i]) add up (partial sequence
 * gradients); else only sp rank 0 contributes. Returns the worst norm-wise
 * relative error against whole; *covered = every element came from exactly
 * one tp rank per sp rank, module_index / offset name the flat buffers. */
double gathered_err(ex_model *whole, ex_model **ranks, const int *tp_rank, const int *sp_rank,
                    int n_ranks, bool grads, bool sum_sp, bool *covered, bool *replicas_equal);

/* One encoder rank's work (a thread): forward of b (audio: the clips, else
 * the images), its `width`-wide rows compared with whole (norm-wise
 * relative error into out_err), then backward from dout. */
typedef struct {
    ex_model *em;
    ex_batch b;
    bool audio;
    int width;
    const float *dout, *whole;
    int rows, rc;
    double out_err;
} enc_job;
void *enc_run(void *job);

/* tp x sp in-process ranks (threads) of encoder module k of m, rank j =
 * sp_rank * tp + tp_rank (4 ranks at most), against the
 * whole module from the same seed: the whole module runs forward and backward
 * (from random dout rows) on b, then every rank on its part of b (slice sets
 * the rank's inputs; NULL: every rank reads all of b) and its rows of dout.
 * Fills the rows' worst error, the gathered gradients' (gathered_err, sp
 * partials summed), and keeps the models for the caller's checks until
 * encoder_grid_free (which keeps the figures). */
typedef struct {
    int rc;
    char err[UTIL_ERR_LEN];
    int n, tpr[4], spr[4], rows, rank_rows;
    ex_model *whole, *rk[4];
    float *dout;
    double out_err, grad_err;
    bool covered, replicas;
} encoder_grid;
void encoder_grid_run(encoder_grid *g, const model_t *m, int k, int tp, int sp, uint64_t seed, const ex_batch *b,
                      void (*slice)(ex_batch *b, int sp_rank, int sp, const void *ctx), const void *ctx,
                      float (*urand)(void));
void encoder_grid_free(encoder_grid *g);

/* ---- the PyTorch reference (tests/t_torch_ref.sh) ---- */

int test_write_file(const char *dir, const char *name, const void *data, size_t n);
/* The file's bytes (util_free them), NULL if unreadable. */
void *test_read_all(const char *dir, const char *name, size_t *n);
/* Random values in the model's vectors (norm weights about 1, biases small)
 * so every path of a reference comparison is exercised; urand in [-1, 1). */
void test_perturb_vectors(ex_model *em, float (*urand)(void));
/* A copy of every parameter in ex_param order (free it). */
float *test_params_copy(ex_model *em);
/* sqrt of the sum of squares of every gradient. */
double test_grad_norm(ex_model *em);

/* One training pass the reference repeats: forward and backward of the
 * test's batch, gradients accumulated into em, *loss set. */
typedef int (*test_ref_pass)(void *ctx, ex_model *em, float *loss, char *err);
typedef struct {
    bool have;                 /* the script ran and wrote every result */
    int rc;                    /* the script's exit status, or the executor's first failure */
    double loss, grad, adam_loss, update;   /* relative errors (see torch_ref.py's outputs) */
    const char *worst_grad, *worst_update;
} test_ref_result;
/* Runs `python3 script dir` (dir holds params.bin written from em at p0 and
 * the test's inputs), then compares: loss0 and em's gradients of the pass
 * just run with ref_loss.txt and ref_grads.bin; then reloads params.bin, runs
 * 5 steps of pass + ex_optimizer_step(oc) and compares the losses and the
 * updates (params - p0) with ref_adam_losses.txt / ref_adam_params.bin.
 * Removes dir. */
void test_torch_compare(ex_model *em, const char *script, const char *dir, float loss0, const float *p0,
                        const ex_optim_config *oc, test_ref_pass pass, void *ctx, test_ref_result *out, char *err);
/* Prints the comparison's figures as "<label> <name>: ..." and judges them
 * by the reference tests' tolerances; false with why filled otherwise. */
bool test_ref_verdict(const char *label, const char *name, float loss, const test_ref_result *r, const char *err,
                      char *why, size_t why_len);
/* The clipped AdamW every reference comparison runs (clip at half the first
 * gradient norm, so clipping is active), and its JSON for the script. */
ex_optim_config test_ref_optim(double grad_norm);
void test_ref_optim_json(char *s, size_t cap, const ex_optim_config *oc);

#endif
