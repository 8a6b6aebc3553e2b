/* executor tests of a model split over ranks (threads in one process):
 * the unit hooks' order (where the ZeRO strategies gather and reduce),
 * tensor- and sequence-parallel shards against the whole model, the layouts
 * the executor refuses, the loss mask over a split batch, the encoder's
 * activation slots, and ZeRO-1's optimizer shards. */
#include "test.h"
#include "executor/executor.h"
#include "executor/backend.h"
#include "tests/test_ex.h"

#include <pthread.h>
#include <stdlib.h>

/* The unit hooks (where the ZeRO strategies gather and reduce) are called in
 * the order ex_module_unit_order says, each begin closed by its end, by the
 * real passes and by the empty ones alike; the backward's last use of every
 * unit is flagged. */
typedef struct { int n; int unit[64]; int use[64]; bool begin[64], last[64]; } hook_log;

static int log_begin(void *ctx, int module, int unit, ex_unit_use use)
{
    hook_log *h = (hook_log *)ctx + module;
    if (h->n < 64) { h->unit[h->n] = unit; h->use[h->n] = use; h->begin[h->n] = true; h->last[h->n] = false; h->n++; }
    return 0;
}

static int log_end(void *ctx, int module, int unit, ex_unit_use use, bool last)
{
    hook_log *h = (hook_log *)ctx + module;
    if (h->n < 64) { h->unit[h->n] = unit; h->use[h->n] = use; h->begin[h->n] = false; h->last[h->n] = last; h->n++; }
    return 0;
}

/* The begins of one pass of log h, from entry *at, must be the model's order; their ends follow. */
static bool pass_follows_order(ex_model *em, int k, const hook_log *h, int *at, ex_unit_use use)
{
    int order[64], n = ex_module_unit_order(em, k, use, order, 64), open = 0, seen = 0, lasts = 0;
    for (; *at < h->n && seen < n; (*at)++) {
        if (h->use[*at] != (int)use) return false;
        if (h->begin[*at]) { if (h->unit[*at] != order[seen++]) return false; open++; }
        else { open--; lasts += h->last[*at]; }
    }
    while (*at < h->n && !h->begin[*at] && h->use[*at] == (int)use) { open--; lasts += h->last[(*at)++]; }
    const size_t *off;
    int units;
    ex_module_units(em, k, &off, &units);
    return seen == n && open == 0 && lasts == (use == EX_USE_FORWARD ? 0 : units);
}

static void unit_order_case(bool tied)
{
    model_t m;
    test_tiny_vl(&m, false);
    m.mod[m.llm].tied_embeddings = tied;
    test_batch tb;
    test_make_batch(&tb, &m);
    char err[UTIL_ERR_LEN] = "";
    ex_model *em = NULL;
    hook_log logs[2];
    memset(logs, 0, sizeof logs);
    int rc = ex_model_create(&m, 3, &em, err);
    ex_unit_hooks h = { logs, log_begin, log_end };
    for (int k = 0; k < 2 && !rc; k++) rc = ex_model_set_unit_hooks(em, k, &h);
    float loss;
    if (!rc) rc = ex_step_forward_backward(em, &tb.b, &loss, err);
    if (!rc) rc = ex_llm_empty_pass(em, true, err);
    if (!rc) rc = ex_vision_empty_pass(em, EX_USE_FORWARD, err);
    if (!rc) rc = ex_vision_empty_pass(em, EX_USE_BACKWARD, err);
    CHECK_MSG(rc == 0, "%s", err);
    int at = 0;
    /* vision: a forward and a backward, then the empty ones */
    CHECK(pass_follows_order(em, 0, &logs[0], &at, EX_USE_FORWARD));
    CHECK(pass_follows_order(em, 0, &logs[0], &at, EX_USE_BACKWARD));
    CHECK(pass_follows_order(em, 0, &logs[0], &at, EX_USE_FORWARD));
    CHECK(pass_follows_order(em, 0, &logs[0], &at, EX_USE_BACKWARD));
    CHECK_EQ_INT(at, logs[0].n);
    at = 0;
    for (int pass = 0; pass < 2; pass++) {
        CHECK(pass_follows_order(em, 1, &logs[1], &at, EX_USE_FORWARD));
        CHECK(pass_follows_order(em, 1, &logs[1], &at, EX_USE_BACKWARD));
    }
    CHECK_EQ_INT(at, logs[1].n);
    ex_model_free(em);
    test_free_batch(&tb);
}

TEST(executor_unit_hooks_follow_the_unit_order) { unit_order_case(false); }
TEST(executor_unit_hooks_follow_the_unit_order_with_a_tied_head) { unit_order_case(true); }

/* Tensor parallel in one process: two threads, a barrier-based allreduce. */
typedef struct { pthread_barrier_t bar; float *slot[2]; } tp_comm;
typedef struct { tp_comm *comm; int rank; } tp_ctx;

static int tp_allreduce(void *ctx, float *buf, size_t n)
{
    tp_ctx *c = ctx;
    c->comm->slot[c->rank] = buf;
    pthread_barrier_wait(&c->comm->bar);
    if (c->rank == 0)
        for (size_t i = 0; i < n; i++) {
            float s = c->comm->slot[0][i] + c->comm->slot[1][i];
            c->comm->slot[0][i] = c->comm->slot[1][i] = s;
        }
    pthread_barrier_wait(&c->comm->bar);
    return 0;
}

static int tp_allreduce_max(void *ctx, float *buf, size_t n)
{
    tp_ctx *c = ctx;
    c->comm->slot[c->rank] = buf;
    pthread_barrier_wait(&c->comm->bar);
    if (c->rank == 0)
        for (size_t i = 0; i < n; i++) {
            float s = fmaxf(c->comm->slot[0][i], c->comm->slot[1][i]);
            c->comm->slot[0][i] = c->comm->slot[1][i] = s;
        }
    pthread_barrier_wait(&c->comm->bar);
    return 0;
}

typedef struct { ex_model *em; const ex_batch *b; const ex_optim_config *oc; float loss, loss2; int rc; } tp_job;

static void *tp_run(void *arg)
{
    tp_job *j = arg;
    char err[UTIL_ERR_LEN];
    j->rc = ex_step_forward_backward(j->em, j->b, &j->loss, err);
    if (!j->rc) j->rc = ex_optimizer_step(j->em, j->oc, 0, NULL, NULL, err);
    if (!j->rc) j->rc = ex_step_forward_backward(j->em, j->b, &j->loss2, err);
    return NULL;
}

/* Worst relative error of a shard's tensors (grads or data) vs the slices of the whole model's. */
static double shard_err(ex_model *whole, ex_model *shard, bool grads)
{
    double worst = 0;
    for (int i = 0; i < ex_param_count(shard); i++) {
        ex_param s, w;
        ex_param_get(shard, i, &s);
        ex_param_get(whole, i, &w);
        if (strcmp(s.name, w.name) || s.full_shape[0] != w.shape[0] || s.full_shape[1] != w.shape[1]) return 1;
        double d = 0, r = 0;
        for (int64_t a = 0; a < s.shape[0]; a++)
            for (int64_t c = 0; c < s.shape[1]; c++) {
                double x = (grads ? s.grad : s.data)[a * s.shape[1] + c];
                double y = (grads ? w.grad : w.data)[(s.start[0] + a) * w.shape[1] + s.start[1] + c];
                d += (x - y) * (x - y);
                r += y * y;
            }
        double e = r > 0 ? sqrt(d / r) : sqrt(d);
        if (e > worst) worst = e;
    }
    return worst;
}

/* Two tensor-parallel LLM shards (threads) give the whole model's loss,
 * gradients (shards gathered by ex_param start / shape: the vocab-parallel
 * embedding and head are row shards) and AdamW-updated parameters.
 * vision_tp: built per module with the vision encoder tensor-parallel on the
 * same group too; tied / masked: tied embeddings, a loss mask. */
static void tp_case(bool vision_tp, bool tied, bool masked)
{
    model_t m;
    test_tiny_vl(&m, false);
    m.mod[1].mlp_bias = true;   /* exercise replicated down bias too */
    m.mod[1].out_bias = true;
    m.mod[1].tied_embeddings = tied;
    test_batch tb;
    test_make_batch(&tb, &m);
    if (masked) tb.b.loss_mask = test_batch_mask;
    char err[UTIL_ERR_LEN] = "";
    tp_comm comm;
    pthread_barrier_init(&comm.bar, NULL, 2);
    tp_ctx ctx[2] = { { &comm, 0 }, { &comm, 1 } };
    ex_model *whole = NULL, *sh[2] = { NULL, NULL };
    int rc = ex_model_create(&m, 11, &whole, err);
    for (int r = 0; r < 2 && !rc; r++) {
        ex_parallel par = { .tp_size = 2, .tp_rank = r, .ctx = &ctx[r], .allreduce_sum = tp_allreduce,
                            .allreduce_max = tp_allreduce_max };
        ex_parallel per[2] = { par, par };
        if (!vision_tp) per[0] = (ex_parallel){ 0 };
        rc = vision_tp ? ex_model_create_per_module(ex_backend_cpu(), &m, 11, ~0u, per, &sh[r], err)
                       : ex_model_create_parallel(&m, 11, ~0u, &par, &sh[r], err);
    }
    bool vocab_sharded = false;
    for (int i = 0; !rc && i < ex_param_count(sh[1]); i++) {
        ex_param p;
        ex_param_get(sh[1], i, &p);
        if (!strcmp(p.name, "llm.embed_tokens.weight"))
            vocab_sharded = p.sharded && p.split_axis == 0 && p.shape[0] == 136 && p.start[0] == 136 && p.full_shape[0] == 272;
    }
    double init_err = rc ? 1 : fmax(shard_err(whole, sh[0], false), shard_err(whole, sh[1], false));
    ex_optim_config oc = { .lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 1, .total_steps = 4, .beta1 = 0.9f,
                           .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 0.5f };
    tp_job jobs[2] = { { sh[0], &tb.b, &oc, 0, 0, 0 }, { sh[1], &tb.b, &oc, 0, 0, 0 } };
    float lw = 0, lw2 = 0, gn = 0;
    double grad_err = 1, param_err = 1;
    bool covered = false, replicas = false;
    int tpr[2] = { 0, 1 }, spr[2] = { 0, 0 };
    if (!rc) {
        pthread_t th[2];
        for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, tp_run, &jobs[r]);
        for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
        rc = jobs[0].rc ? jobs[0].rc : jobs[1].rc;
    }
    if (!rc) rc = ex_step_forward_backward(whole, &tb.b, &lw, err);
    if (!rc) rc = ex_optimizer_step(whole, &oc, 0, &gn, NULL, err);
    if (!rc) param_err = gathered_err(whole, sh, tpr, spr, 2, false, false, &covered, &replicas);
    if (!rc) rc = ex_step_forward_backward(whole, &tb.b, &lw2, err);
    bool cov2 = false, rep2 = false;
    if (!rc) grad_err = gathered_err(whole, sh, tpr, spr, 2, true, false, &cov2, &rep2);
    ex_model_free(whole); ex_model_free(sh[0]); ex_model_free(sh[1]); test_free_batch(&tb);
    pthread_barrier_destroy(&comm.bar);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    CHECK(init_err == 0);
    CHECK(vocab_sharded);
    CHECK(covered && cov2);
    CHECK(replicas && rep2);
    CHECK(gn > oc.grad_clip);   /* clipping was active */
    CHECK_NEAR(jobs[0].loss, lw, 1e-6);
    CHECK(jobs[0].loss == jobs[1].loss);
    CHECK_NEAR(jobs[0].loss2, lw2, 1e-5);
    /* Parameters after one AdamW step get 1e-3 (measured 1.5e-4): the first step
     * is ~lr * g / (|g| + eps), which amplifies the summation-order noise of
     * near-zero gradients; the gradients themselves agree to ~1e-6. */
    CHECK_MSG(param_err < 1e-3 && grad_err < 1e-4, "param rel err %g, grad rel err %g", param_err, grad_err);
}

TEST(executor_tensor_parallel_shards_match_the_whole_model) { tp_case(false, false, false); }
TEST(executor_tensor_parallel_vision_and_vocab_parallel_tied_masked_match_the_whole_model) { tp_case(true, true, true); }

/* Ulysses in one process: each rank posts its send buffer, then copies chunk
 * `rank` of every rank's buffer into its recv. */
typedef struct { pthread_barrier_t bar; const float *send[2]; } sp_comm;
typedef struct { sp_comm *comm; int rank; } sp_ctx;

static int sp_alltoall(void *ctx, const float *send, float *recv, size_t chunk)
{
    sp_ctx *c = ctx;
    c->comm->send[c->rank] = send;
    pthread_barrier_wait(&c->comm->bar);
    for (int r = 0; r < 2; r++)
        memcpy(recv + r * chunk, c->comm->send[r] + c->rank * chunk, chunk * sizeof(float));
    pthread_barrier_wait(&c->comm->bar);
    return 0;
}

/* Two Ulysses sequence-parallel vision ranks (threads), each with half the
 * patch rows, give the whole encoder's merged outputs and, summed, its gradients. */
TEST(executor_sequence_parallel_vision_matches_the_whole_encoder)
{
    model_t m;
    test_batch tb;
    test_tiny_vl_batch(&m, true, &tb);
    char err[UTIL_ERR_LEN] = "";
    sp_comm comm;
    pthread_barrier_init(&comm.bar, NULL, 2);
    sp_ctx ctx[2] = { { &comm, 0 }, { &comm, 1 } };
    ex_model *whole = NULL, *sh[2] = { NULL, NULL };
    int rc = ex_model_create_modules(&m, 21, 1u << 0, &whole, err);
    for (int r = 0; r < 2 && !rc; r++) {
        ex_parallel par = { .sp_size = 2, .sp_rank = r, .ctx = &ctx[r], .alltoall = sp_alltoall };
        rc = ex_model_create_parallel(&m, 21, 1u << 0, &par, &sh[r], err);
    }
    const float *vw = NULL;
    int rows = 0;
    if (!rc) rc = ex_vision_forward(whole, &tb.b, &vw, &rows, err);
    float *dvis = test_rnd((size_t)rows * 64, 1);
    if (!rc) rc = ex_vision_backward(whole, &tb.b, dvis, err);
    enc_job jobs[2];
    int half_rows = 3 * 64 / 2, cpp = 48;
    for (int r = 0; r < 2; r++) {
        jobs[r] = (enc_job){ .em = sh[r], .b = tb.b, .width = 64, .dout = dvis + (size_t)r * (rows / 2) * 64,
                             .whole = vw + (size_t)r * (rows / 2) * 64, .rc = -1 };
        jobs[r].b.pixels = tb.pixels + (size_t)r * half_rows * cpp;
    }
    if (!rc) {
        pthread_t th[2];
        for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, enc_run, &jobs[r]);
        for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
        rc = jobs[0].rc ? jobs[0].rc : jobs[1].rc;
    }
    double gerr = 1;
    if (!rc) {
        float *gw, *g0, *g1;
        size_t n, n0, n1;
        ex_module_buffer(whole, 0, EX_BUF_GRADS, &gw, &n);
        ex_module_buffer(sh[0], 0, EX_BUF_GRADS, &g0, &n0);
        ex_module_buffer(sh[1], 0, EX_BUF_GRADS, &g1, &n1);
        double d = 0, r2 = 0;
        for (size_t i = 0; i < n && n0 == n && n1 == n; i++) {
            double x = (double)g0[i] + g1[i];
            d += (x - gw[i]) * (x - gw[i]);
            r2 += (double)gw[i] * gw[i];
        }
        gerr = n0 == n && n1 == n ? sqrt(d / r2) : 1;
    }
    ex_model_free(whole); ex_model_free(sh[0]); ex_model_free(sh[1]); test_free_batch(&tb); free(dvis);
    pthread_barrier_destroy(&comm.bar);
    CHECK_MSG(rc == 0, "rc %d: %s", rc, err);
    CHECK_EQ_INT(jobs[0].rows, rows / 2);
    CHECK_MSG(jobs[0].out_err < 1e-6 && jobs[1].out_err < 1e-6, "vout rel err %g %g", jobs[0].out_err, jobs[1].out_err);
    CHECK_MSG(gerr < 1e-5, "grad rel err %g", gerr);
}

/* The sp rank's patch rows of the test batch's 3 images of 64 patches. */
static void vision_slice(ex_batch *b, int sp_rank, int sp, const void *ctx)
{
    b->pixels = (const float *)ctx + (size_t)sp_rank * (3 * 64 / sp) * 48;
}

/* tp x sp vision ranks (threads) built per module: merged outputs equal the
 * whole encoder's rows, gradients (tp shards gathered, sp partials summed)
 * equal its gradients, replicated tensors agree exactly over the tp group. */
static void vision_grid_case(int tp, int sp)
{
    model_t m;
    test_batch tb;
    test_tiny_vl_batch(&m, true, &tb);
    encoder_grid g;
    encoder_grid_run(&g, &m, 0, tp, sp, 21, &tb.b, vision_slice, tb.pixels, test_urand);
    bool sharded = false;
    if (!g.rc) {
        ex_param p;
        ex_param_get(g.rk[g.n - 1], 3, &p);   /* vision.blocks.0.attn.q.weight */
        sharded = !strcmp(p.name, "vision.blocks.0.attn.q.weight") && p.sharded == (tp > 1) && p.shape[0] == 32 / tp;
    }
    printf("vision tp %d x sp %d: vout rel err %.2e, grad rel err %.2e\n", tp, sp, g.out_err, g.grad_err);
    encoder_grid_free(&g);
    test_free_batch(&tb);
    CHECK_MSG(g.rc == 0, "rc %d: %s", g.rc, g.err);
    CHECK_EQ_INT(g.rank_rows, g.rows / sp);
    CHECK(sharded);
    CHECK(g.covered);
    CHECK(g.replicas);
    CHECK_MSG(g.out_err < 1e-6, "vout rel err %g", g.out_err);
    CHECK_MSG(g.grad_err < 1e-5, "grad rel err %g", g.grad_err);
}

TEST(executor_tensor_parallel_vision_matches_the_whole_encoder) { vision_grid_case(2, 1); }
TEST(executor_tensor_and_sequence_parallel_vision_matches_the_whole_encoder) { vision_grid_case(2, 2); }

TEST(executor_parallel_layouts_refuse_what_they_cannot_run)
{
    model_t m;
    test_tiny_vl(&m, false);
    char err[UTIL_ERR_LEN] = "";
    ex_model *em = NULL;
    tp_comm comm;
    tp_ctx ctx = { &comm, 0 };
    ex_parallel tp2 = { .tp_size = 2, .ctx = &ctx, .allreduce_sum = tp_allreduce, .allreduce_max = tp_allreduce_max };
    ex_parallel no_max = tp2;
    no_max.allreduce_max = NULL;
    CHECK_EQ_INT(ex_model_create_parallel(&m, 1, 1u << 1, &no_max, &em, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "allreduce_max") != NULL, "%s", err);
    m.mod[1].vocab = 271;
    CHECK_EQ_INT(ex_model_create_parallel(&m, 1, 1u << 1, &tp2, &em, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "vocab 271") != NULL, "%s", err);
    test_tiny_vl(&m, false);
    /* the LLM's context parallelism needs its exchanges: Ulysses' all-to-alls
     * (tp x sp divides the heads), ring attention's messages (2 x 2 does not divide 2 kv heads) */
    ex_parallel per[2] = { { 0 }, { .sp_size = 2, .ctx = &ctx } };
    CHECK_EQ_INT(ex_model_create_per_module(ex_backend_cpu(), &m, 1, ~0u, per, &em, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "Ulysses sequence parallelism needs alltoall") != NULL, "%s", err);
    per[1] = (ex_parallel){ .tp_size = 2, .sp_size = 2, .ctx = &ctx, .allreduce_sum = tp_allreduce,
                            .allreduce_max = tp_allreduce_max, .alltoall = sp_alltoall };
    CHECK_EQ_INT(ex_model_create_per_module(ex_backend_cpu(), &m, 1, ~0u, per, &em, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "ring attention needs p2p_start and p2p_wait") != NULL, "%s", err);
    per[1] = (ex_parallel){ 0 };
    per[0] = (ex_parallel){ .tp_size = 2, .sp_size = 4, .ctx = &ctx, .allreduce_sum = tp_allreduce, .alltoall = sp_alltoall };
    CHECK_EQ_INT(ex_model_create_per_module(ex_backend_cpu(), &m, 1, ~0u, per, &em, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "tp_size 2 x sp_size 4") != NULL, "%s", err);
    CHECK(em == NULL);
}

/* -------------------------------------------------------- loss mask */

/* Worst norm-wise relative error of a's gradients against b's (same layout). */
static double grads_err(ex_model *a, ex_model *b)
{
    double worst = 0;
    for (int i = 0; i < ex_param_count(a); i++) {
        ex_param pa, pb;
        ex_param_get(a, i, &pa);
        ex_param_get(b, i, &pb);
        if (pa.numel != pb.numel) return 1;
        double d = 0, r = 0;
        for (int64_t j = 0; j < pa.numel; j++) {
            d += ((double)pa.grad[j] - pb.grad[j]) * ((double)pa.grad[j] - pb.grad[j]);
            r += (double)pb.grad[j] * pb.grad[j];
        }
        double e = r > 0 ? sqrt(d / r) : sqrt(d);
        if (e > worst) worst = e;
    }
    return worst;
}

static double grads_sumsq(ex_model *em)
{
    double s = 0;
    for (int i = 0; i < ex_param_count(em); i++) {
        ex_param p;
        ex_param_get(em, i, &p);
        for (int64_t j = 0; j < p.numel; j++) s += (double)p.grad[j] * p.grad[j];
    }
    return s;
}

/* Masking the tail of every sample equals the batch cut before it (causal:
 * later tokens cannot reach counted predictions); an all-ones mask is no mask. */
TEST(executor_loss_mask_equals_the_batch_without_the_masked_positions)
{
    model_t m;
    test_batch tb;
    test_tiny_vl_batch(&m, false, &tb);
    char err[UTIL_ERR_LEN] = "";
    float tail[20], ones[20];
    int32_t cut[14];
    for (int i = 0; i < 20; i++) { tail[i] = i % 10 < 6 ? 1.0f : 0.0f; ones[i] = 1.0f; }
    for (int s = 0; s < 2; s++) memcpy(cut + s * 7, tb.tokens + s * 10, 7 * sizeof(int32_t));
    ex_model *a = NULL, *b = NULL, *c = NULL;
    int rc = ex_model_create(&m, 4, &a, err);
    if (!rc) rc = ex_model_create(&m, 4, &b, err);
    if (!rc) rc = ex_model_create(&m, 4, &c, err);
    ex_batch masked = tb.b, shorter = tb.b, all = tb.b;
    masked.loss_mask = tail;
    shorter.tokens = cut;
    shorter.text_tokens = 7;
    all.loss_mask = ones;
    float lm = 0, ls = 0, lo = 0, ln = 0;
    if (!rc) rc = ex_step_forward_backward(a, &masked, &lm, err);
    if (!rc) rc = ex_step_forward_backward(b, &shorter, &ls, err);
    double e = rc ? 1 : grads_err(a, b);
    bool same = false;
    if (!rc) {
        ex_zero_grads(a);
        rc = ex_step_forward_backward(a, &all, &lo, err);
        if (!rc) rc = ex_step_forward_backward(c, &tb.b, &ln, err);
        same = !rc && lo == ln && grads_err(a, c) == 0;
    }
    printf("loss mask vs cut batch: loss %.7g vs %.7g, grad rel err %.2e\n", (double)lm, (double)ls, e);
    ex_model_free(a); ex_model_free(b); ex_model_free(c); test_free_batch(&tb);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_NEAR(lm, ls, 1e-6);
    CHECK_MSG(e < 1e-5, "grad rel err %g", e);
    CHECK(same);
}

/* Complementary masks with the whole batch's denominator accumulate to the
 * unmasked step; the default denominator is the batch's own count; an
 * all-zero mask gives loss 0 and no gradient; a bad denominator is refused. */
TEST(executor_loss_mask_and_denominator_split_a_batch_exactly)
{
    model_t m;
    test_batch tb;
    test_tiny_vl_batch(&m, true, &tb);
    char err[UTIL_ERR_LEN] = "";
    float inv[20], none[20] = { 0 };
    int cnt_a = 0;
    for (int i = 0; i < 20; i++) {
        inv[i] = 1.0f - test_batch_mask[i];
        cnt_a += test_batch_mask[i] != 0 && i % 10 != 9;
    }
    ex_model *a = NULL, *b = NULL;
    int rc = ex_model_create(&m, 8, &a, err);
    if (!rc) rc = ex_model_create(&m, 8, &b, err);
    ex_batch ba = tb.b, bb = tb.b, bz = tb.b, bo = tb.b, bad = tb.b;
    ba.loss_mask = test_batch_mask; ba.loss_denominator = 18;
    bb.loss_mask = inv; bb.loss_denominator = 18;
    bz.loss_mask = none;
    bo.loss_mask = test_batch_mask;   /* own count */
    bad.loss_denominator = -1;
    float la = 0, lb = 0, lall = 0, lz = 1, lown = 0, lbad;
    if (!rc) rc = ex_step_forward_backward(a, &ba, &la, err);
    if (!rc) rc = ex_step_forward_backward(a, &bb, &lb, err);
    if (!rc) rc = ex_step_forward_backward(b, &tb.b, &lall, err);
    double e = rc ? 1 : grads_err(a, b);
    double zero_ss = 1;
    if (!rc) {
        ex_zero_grads(b);
        rc = ex_step_forward_backward(b, &bz, &lz, err);
        zero_ss = grads_sumsq(b);
    }
    if (!rc) rc = ex_step_forward(b, &bo, &lown, err);
    int rbad = ex_step_forward_backward(b, &bad, &lbad, err);
    bool bad_msg = strstr(err, "loss_denominator") != NULL;
    printf("loss mask split: %.7g + %.7g vs %.7g, grad rel err %.2e\n", (double)la, (double)lb, (double)lall, e);
    ex_model_free(a); ex_model_free(b); test_free_batch(&tb);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_NEAR(la + lb, lall, 1e-6);
    CHECK_MSG(e < 1e-5, "grad rel err %g", e);
    CHECK(lz == 0 && zero_ss == 0);
    CHECK_NEAR(lown, la * 18.0 / cnt_a, 1e-6);
    CHECK_EQ_INT(rbad, UTIL_EINVAL);
    CHECK(bad_msg);
}

/* ---------------------------------------------------- activation slots */

/* Two micro-batches kept alive in two vision slots (forward A, forward B,
 * backward A, backward B) give exactly the gradients of running them one
 * after the other; B has other image shapes and more rows, so its slot's
 * offsets and rotary tables differ and the shared scratch grows in between. */
TEST(executor_vision_slots_keep_two_micro_batches_alive)
{
    model_t m;
    test_tiny_vl(&m, true);
    test_batch ta, tb;
    test_make_batch(&ta, &m);
    test_make_batch(&tb, &m);
    /* B: 8 images of 4 x 8 patches (other sequence offsets and rotary tables, more rows) */
    int cpp = 48, ipb4[2] = { 4, 4 };
    float *pix4 = test_rnd((size_t)8 * 32 * cpp, 1);
    tb.b.n_images = 8; tb.b.grid_h = 4; tb.b.patches = 32; tb.b.pixels = pix4; tb.b.images_per_sample = ipb4;
    char err[UTIL_ERR_LEN] = "";
    ex_model *x = NULL, *y = NULL;
    int rc = ex_model_create_modules(&m, 31, 1u << 0, &x, err);
    if (!rc) rc = ex_model_create_modules(&m, 31, 1u << 0, &y, err);
    float *da = test_rnd((size_t)48 * 64, 1), *db = test_rnd((size_t)64 * 64, 1), *va = malloc((size_t)48 * 64 * 4);
    const float *out_a = NULL, *out_b = NULL, *ref;
    int rows = 0;
    size_t act0 = util_mem_current(UTIL_MEM_ACTIV), act1 = 0, act2 = 0;
    /* y: one after the other in slot 0 */
    if (!rc) rc = ex_vision_forward(y, &ta.b, &ref, &rows, err);
    if (!rc) { memcpy(va, ref, (size_t)48 * 64 * 4); rc = ex_vision_backward(y, &ta.b, da, err); }
    if (!rc) rc = ex_vision_forward(y, &tb.b, &ref, &rows, err);
    if (!rc) rc = ex_vision_backward(y, &tb.b, db, err);
    /* x: both alive */
    if (!rc) rc = ex_vision_set_slot(x, 0, err);
    if (!rc) { act0 = util_mem_current(UTIL_MEM_ACTIV); rc = ex_vision_forward(x, &ta.b, &out_a, &rows, err); }
    if (!rc) { act1 = util_mem_current(UTIL_MEM_ACTIV); rc = ex_vision_set_slot(x, 1, err); }
    if (!rc) rc = ex_vision_forward(x, &tb.b, &out_b, &rows, err);
    act2 = util_mem_current(UTIL_MEM_ACTIV);
    bool a_kept = !rc && !memcmp(out_a, va, (size_t)48 * 64 * 4);
    if (!rc) rc = ex_vision_set_slot(x, 0, err);
    if (!rc) rc = ex_vision_backward(x, &ta.b, da, err);
    if (!rc) rc = ex_vision_set_slot(x, 1, err);
    if (!rc) rc = ex_vision_backward(x, &tb.b, db, err);
    bool same = !rc && test_same_buffer(x, y, 0, EX_BUF_GRADS);
    int wrong = ex_vision_backward(x, &ta.b, da, err);   /* slot 1 holds B */
    int empty = ex_vision_set_slot(x, 5, err) ? -1 : ex_vision_backward(x, &ta.b, da, err);
    int range = ex_vision_set_slot(x, EX_MAX_SLOTS, err);
    ex_model_free(x); ex_model_free(y);
    test_free_batch(&ta); test_free_batch(&tb); free(pix4); free(da); free(db); free(va);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(a_kept);
    CHECK(same);
    CHECK(act1 > act0 && act2 > act1);
    CHECK_EQ_INT(wrong, UTIL_EINVAL);
    CHECK_EQ_INT(empty, UTIL_EINVAL);
    CHECK_EQ_INT(range, UTIL_EINVAL);
}

/* ------------------------------------------------------------- ZeRO-1 */

/* Two "data-parallel ranks" with the same gradients, each holding AdamW
 * moments for its pieces of every unit (ex_module_set_shard, G = 2), apply
 * them with the global norm; the pieces combined are exactly the unsharded
 * update, over two steps (moments and t carried). */
static bool pieces_match(ex_model *full, ex_model **r, int mod)
{
    float *pf, *mf, *p[2], *mv[2];
    size_t n;
    ex_module_buffer(full, mod, EX_BUF_PARAMS, &pf, &n);
    ex_module_buffer(full, mod, EX_BUF_ADAM_V, &mf, &n);
    bool same = true;
    for (int k = 0; k < 2; k++) {
        ex_module_buffer(r[k], mod, EX_BUF_PARAMS, &p[k], &n);
        ex_module_buffer(r[k], mod, EX_BUF_ADAM_V, &mv[k], &n);
        const ex_shard *sh = ex_module_get_shard(r[k], mod);
        for (int u = 0; u < sh->n_units; u++) {
            size_t lo, hi;
            ex_shard_range(sh, u, &lo, &hi);
            same = same && !memcmp(p[k] + lo, pf + lo, (hi - lo) * 4) && !memcmp(mv[k] + sh->at[u], mf + lo, (hi - lo) * 4);
        }
    }
    /* the all-gather: each rank takes the other's updated pieces */
    for (int k = 0; k < 2; k++) {
        const ex_shard *sh = ex_module_get_shard(r[k], mod);
        for (int u = 0; u < sh->n_units; u++) {
            size_t lo, hi;
            ex_shard_range(sh, u, &lo, &hi);
            memcpy(p[1 - k] + lo, p[k] + lo, (hi - lo) * 4);
        }
    }
    return same;
}

TEST(executor_zero1_optimizer_shards_combine_to_the_unsharded_update)
{
    model_t m;
    test_batch tb;
    test_tiny_vl_batch(&m, false, &tb);
    char err[UTIL_ERR_LEN] = "";
    ex_model *full = NULL, *r[2] = { NULL, NULL };
    int rc = ex_model_create(&m, 6, &full, err);
    for (int k = 0; k < 2 && !rc; k++) rc = ex_model_create(&m, 6, &r[k], err);
    size_t n[2] = { 0, 0 };
    float *p;
    for (int mod = 0; mod < 2 && !rc; mod++) ex_module_buffer(full, mod, EX_BUF_PARAMS, &p, &n[mod]);
    size_t o0 = util_mem_current(UTIL_MEM_OPTIM), o1 = o0;
    for (int mod = 0; mod < 2 && !rc; mod++)
        for (int k = 0; k < 2 && !rc; k++) rc = ex_module_set_shard(r[k], mod, 2, k, false, false, err);
    o1 = util_mem_current(UTIL_MEM_OPTIM);
    size_t mlen = 0, pieces = 0;
    float *mptr = NULL;
    int mrc = rc ? -1 : ex_module_buffer(r[1], 1, EX_BUF_ADAM_M, &mptr, &mlen);
    if (!rc) {
        const ex_shard *sh = ex_module_get_shard(r[1], 1);
        pieces = sh->at[sh->n_units];
    }
    bool same = !rc;
    double gn_first = 0;
    for (int s = 0; s < 2 && !rc && same; s++) {
        float l;
        rc = ex_step_forward_backward(full, &tb.b, &l, err);
        for (int k = 0; k < 2 && !rc; k++) rc = ex_step_forward_backward(r[k], &tb.b, &l, err);
        double gn = sqrt(ex_grad_sumsq(full));
        if (s == 0) gn_first = gn;
        ex_optim_config oc = { .lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 1, .total_steps = 4, .beta1 = 0.9f,
                               .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = (float)(0.5 * gn_first) };
        if (!rc) rc = ex_optimizer_apply(full, &oc, s, gn, NULL, err);
        for (int k = 0; k < 2 && !rc; k++) rc = ex_optimizer_apply(r[k], &oc, s, gn, NULL, err);
        for (int mod = 0; mod < 2 && !rc; mod++) same = pieces_match(full, r, mod) && same;
    }
    int t = ex_optimizer_get_t(r[0]);
    ex_optimizer_set_t(r[0], 9);
    int t2 = ex_optimizer_get_t(r[0]);
    int bad = ex_module_set_shard(r[0], 1, 2, 2, false, false, err);
    ex_model_free(full); ex_model_free(r[0]); ex_model_free(r[1]); test_free_batch(&tb);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(same);
    /* each rank dropped the moments (2 floats) of the pieces it does not own, but for the padding of its own */
    CHECK((double)(o0 - o1) > 0.98 * (double)(n[0] + n[1]) * 8 && o0 - o1 <= (n[0] + n[1]) * 8);
    CHECK_EQ_INT(mrc, UTIL_OK);
    CHECK_EQ_INT(mlen, pieces);
    CHECK(pieces >= n[1] / 2 && pieces < n[1] / 2 + 8);
    CHECK(t == 2 && t2 == 9);
    CHECK_EQ_INT(bad, UTIL_EINVAL);
}
