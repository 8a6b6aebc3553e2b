/* The audio encoder (executor/audio.c) and the Whisper-style block variant
 * (LayerNorm, GELU MLP: executor/block.c): its parameter layout against the
 * model's count, its backward against central finite differences, Ulysses
 * and tensor-parallel ranks against the whole encoder, activation slots, the
 * memory it allocates against plan_module_acts, frozen encoders, unit hooks,
 * bad batches, the omni model (vision + audio + LLM in one instance), and
 * (driven by tests/t_torch_ref.sh) loss, gradients and 5 AdamW steps
 * against tests/ref/torch_audio_ref.py. */
#include "test.h"
#include "tests/test_ex.h"
#include "executor/executor.h"
#include "executor/backend.h"
#include "planner/planner.h"

#include <stdlib.h>
#include <unistd.h>

#define ur test_urand
#define rnd test_rnd

/* A zoo model and its audio module's index. */
static int load(const char *name, model_t *m)
{
    char err[UTIL_ERR_LEN];
    if (model_load(name, m, err)) return -1;
    return model_find_kind(m, MODEL_AUDIO);
}

typedef struct {
    ex_batch b;
    float *mel;
    int aps[2];
} audio_batch;

/* n clips of Tm mel frames for module am, split over two samples (1, n - 1). */
static void make_clips(audio_batch *ab, const model_module *am, int n, int Tm)
{
    memset(ab, 0, sizeof *ab);
    ab->mel = rnd((size_t)n * Tm * am->in_channels, 1);
    ab->aps[0] = 1;
    ab->aps[1] = n - 1;
    ab->b.n_audio = n;
    ab->b.mel_frames = Tm;
    ab->b.mel = ab->mel;
    ab->b.audio_per_sample = ab->aps;
    ab->b.batch = 2;
}

/* The zoo model name's audio encoder (its index, -1 if it does not load) and
 * n clips of Tm frames for it (make_clips). */
static int load_clips(const char *name, int n, int Tm, model_t *m, audio_batch *ab)
{
    int a = load(name, m);
    if (a >= 0) make_clips(ab, &m->mod[a], n, Tm);
    return a;
}

/* The pass the tests repeat: forward, then backward from dout (loss = sum(out * dout)). */
typedef struct { const ex_batch *b; const float *dout; int rows; } audio_pass_ctx;

static int audio_pass(void *ctx, ex_model *em, float *loss, char *err)
{
    audio_pass_ctx *c = ctx;
    const float *out;
    int rc = ex_audio_forward(em, c->b, &out, &c->rows, err);
    if (rc) return rc;
    double s = 0;
    for (size_t i = 0; i < (size_t)c->rows * 64; i++) s += (double)out[i] * c->dout[i];
    *loss = (float)s;
    return ex_audio_backward(em, c->b, c->dout, err);
}

static const ex_param *find_param(ex_model *em, const char *name, ex_param *p)
{
    for (int i = 0; i < ex_param_count(em); i++)
        if (!ex_param_get(em, i, p) && !strcmp(p->name, name)) return p;
    return NULL;
}

TEST(audio_layout_is_the_model_param_count_with_whisper_tensors)
{
    model_t m;
    int a = load("tiny-audio", &m);
    CHECK(a >= 0);
    char err[UTIL_ERR_LEN];
    ex_model *em;
    CHECK_OK(ex_model_create_modules(&m, 5, 1u << a, &em, err));
    float *buf;
    size_t n;
    ex_param p;
    bool count = !ex_module_buffer(em, a, EX_BUF_PARAMS, &buf, &n) && (int64_t)n == model_module_params(&m.mod[a]);
    bool conv1 = find_param(em, "audio.conv1.weight", &p) && p.shape[0] == 32 && p.shape[1] == 16 * 3 && p.decay;
    bool pos = find_param(em, "audio.embed_positions.weight", &p) && p.shape[0] == 64 && p.shape[1] == 32;
    bool ln_bias = find_param(em, "audio.blocks.1.norm2.bias", &p) && p.data[0] == 0 && !p.decay;
    bool fc = find_param(em, "audio.blocks.0.mlp.fc1.weight", &p) && p.shape[0] == 64 && find_param(em, "audio.blocks.0.mlp.fc2.bias", &p);
    bool head = find_param(em, "audio.layer_norm.bias", &p) && find_param(em, "audio.proj.weight", &p) && p.shape[0] == 64;
    bool none = !find_param(em, "audio.blocks.0.attn.k.bias", &p) && !find_param(em, "audio.blocks.0.mlp.gate.weight", &p) &&
                find_param(em, "audio.blocks.0.attn.v.bias", &p);
    ex_model_free(em);
    CHECK_MSG(count, "%zu parameters, the model counts %lld", n, (long long)model_module_params(&m.mod[a]));
    CHECK(conv1 && pos && ln_bias && fc && head && none);
    /* Qwen2.5-Omni's positions are sinusoids, no parameter; Qwen2-Audio-7B's
     * layout (not allocated) is its published encoder's count too. */
    const char *names[] = { "tiny-omni", "qwen2-audio-7b", "qwen2.5-omni-7b" };
    for (int i = 0; i < 3; i++) {
        a = load(names[i], &m);
        CHECK(a >= 0);
        int64_t units[MODEL_MAX_LAYERS + 2];
        CHECK_MSG(plan_unit_sizes(&m.mod[a], 1, NULL, units) == model_module_params(&m.mod[a]), "%s", names[i]);
    }
}

/* ------------------------------------------------- finite differences */

static struct { ex_model *em; audio_batch ab; float *dout; } FD;

static double fd_loss(void)
{
    char err[UTIL_ERR_LEN];
    const float *out;
    int rows;
    if (ex_audio_forward(FD.em, &FD.ab.b, &out, &rows, err)) return NAN;
    double s = 0;
    for (size_t i = 0; i < (size_t)rows * 64; i++) s += (double)out[i] * FD.dout[i];
    return s;
}

/* Every tensor's gradient (up to 5 of its elements, spread over it) against
 * central differences of sum(out * dout): conv stem, learned or sinusoidal
 * positions, LayerNorm blocks with GELU MLPs, pooling, final norm, projector;
 * two clips, the second sample's. */
static void fd_case(const char *model)
{
    model_t m;
    int a = load(model, &m);
    CHECK(a >= 0);
    char err[UTIL_ERR_LEN];
    CHECK_OK(ex_model_create_modules(&m, 7, 1u << a, &FD.em, err));
    test_perturb_vectors(FD.em, ur);
    make_clips(&FD.ab, &m.mod[a], 2, 12);
    FD.dout = rnd((size_t)2 * 3 * 64, 1);
    audio_pass_ctx pc = { &FD.ab.b, FD.dout, 0 };
    float loss;
    int rc = audio_pass(&pc, FD.em, &loss, err);
    int nt = ex_param_count(FD.em);
    double *dd = calloc((size_t)nt, sizeof *dd), *rr = calloc((size_t)nt, sizeof *rr), rmax = 0;
    for (int i = 0; !rc && i < nt; i++) {
        ex_param p;
        ex_param_get(FD.em, i, &p);
        double d = 0, r = 0;
        if (strstr(p.name, "embed_positions")) {   /* frozen (executor/audio.c): no gradient at all */
            for (int64_t j = 0; j < p.numel; j++) d += (double)p.grad[j] * p.grad[j];
            dd[i] = d;
            rr[i] = d > 0 ? 0 : 1;
            continue;
        }
        for (int s = 0; s < 5 && s < p.numel; s++) {
            int64_t j = s * (p.numel / 5 > 0 ? p.numel / 5 : 1) + (p.numel > 7 ? 3 : 0);
            if (j >= p.numel) j = p.numel - 1;
            float old = p.data[j], eps = 1e-2f;
            p.data[j] = old + eps;
            double lp = fd_loss();
            p.data[j] = old - eps;
            double lm = fd_loss();
            p.data[j] = old;
            double num = (lp - lm) / (2.0 * eps);
            d += (num - p.grad[j]) * (num - p.grad[j]);
            r += num * num;
        }
        dd[i] = d;
        rr[i] = r;
        rmax = fmax(rmax, r);
    }
    /* Each tensor judged against its own gradient, or 1% of the largest where
     * it is smaller (the near-uniform attention's q, k gradients at this
     * init are below the fp32 loss's resolution at this step). */
    double worst = 0;
    const char *where = "";
    for (int i = 0; !rc && i < nt; i++) {
        double e = sqrt(dd[i]) / fmax(sqrt(rr[i]), 0.01 * sqrt(rmax));
        ex_param p;
        ex_param_get(FD.em, i, &p);
        if (e > worst) { worst = e; where = p.name; }
    }
    free(dd);
    free(rr);
    printf("audio %s: finite differences, worst rel err %.2e (%s)\n", model, worst, where);
    bool fine = worst < 1e-2;
    char what[128];
    snprintf(what, sizeof what, "%s", where);
    ex_model_free(FD.em);
    free(FD.ab.mel);
    free(FD.dout);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_MSG(fine, "%s: rel err %g in %s", model, worst, what);
}

TEST(audio_backward_matches_finite_differences_learned_positions) { fd_case("tiny-audio"); }
TEST(audio_backward_matches_finite_differences_sinusoids) { fd_case("tiny-omni"); }

/* ------------------------------------------- tensor and sequence parallel */

/* tp x sp audio ranks (threads) over 3 clips of 8 frames: sp splits the 24
 * rows inside clips (the conv stem's halo, the positions of later frames),
 * tp the heads and the GELU MLP's columns. The ranks' rows equal the whole
 * encoder's, their gradients (tp shards gathered, sp partials summed) its
 * gradients. */
static void audio_grid_case(const char *model, int tp, int sp)
{
    model_t m;
    audio_batch ab;
    int a = load_clips(model, 3, 16, &m, &ab);
    CHECK(a >= 0);
    encoder_grid g;
    encoder_grid_run(&g, &m, a, tp, sp, 21, &ab.b, NULL, NULL, ur);
    printf("audio %s tp %d x sp %d: out rel err %.2e, grad rel err %.2e\n", model, tp, sp, g.out_err, g.grad_err);
    encoder_grid_free(&g);
    free(ab.mel);
    CHECK_MSG(g.rc == 0, "rc %d: %s", g.rc, g.err);
    CHECK_EQ_INT(g.rows, 12);
    CHECK_EQ_INT(g.rank_rows, g.rows / sp);
    CHECK(g.covered);
    CHECK(g.replicas);
    CHECK_MSG(g.out_err < 1e-5, "out rel err %g", g.out_err);
    CHECK_MSG(g.grad_err < 1e-5, "grad rel err %g", g.grad_err);
}

TEST(audio_sequence_parallel_2_matches_the_whole_encoder) { audio_grid_case("tiny-audio", 1, 2); }
TEST(audio_sequence_parallel_4_sinusoids_matches_the_whole_encoder) { audio_grid_case("tiny-omni", 1, 4); }
TEST(audio_tensor_and_sequence_parallel_match_the_whole_encoder) { audio_grid_case("tiny-audio", 2, 2); }

/* Two pipeline stages of the audio encoder (the stem and block 0; block 1
 * and the head), chained through ex_stage_forward / ex_stage_backward, give
 * the whole encoder's rows and, tensor by tensor, its gradients. */
TEST(audio_pipeline_stages_match_the_whole_encoder)
{
    model_t m;
    audio_batch ab;
    int a = load_clips("tiny-audio", 3, 16, &m, &ab);
    CHECK(a >= 0);
    char err[UTIL_ERR_LEN] = "";
    ex_model *whole = NULL, *st[2] = { NULL, NULL };
    int rc = ex_model_create_modules(&m, 8, 1u << a, &whole, err);
    for (int r = 0; r < 2 && !rc; r++) {
        ex_parallel par[MODEL_MAX_MODULES];
        memset(par, 0, sizeof par);
        par[a].pp_size = 2;
        par[a].pp_rank = r;
        rc = ex_model_create_per_module(ex_backend_cpu(), &m, 8, 1u << a, par, &st[r], err);
    }
    float *dout = rnd((size_t)12 * 64, 1);
    audio_pass_ctx pc = { &ab.b, dout, 0 };
    float l;
    if (!rc) rc = audio_pass(&pc, whole, &l, err);
    const float *ref = NULL;
    int rows = 0;
    if (!rc) rc = ex_audio_forward(whole, &ab.b, &ref, &rows, err);
    ex_stage_io f0 = { 0 }, f1 = { 0 }, b1 = { .in = dout }, b0 = { 0 };
    if (!rc) rc = ex_stage_forward(st[0], a, &ab.b, &f0, err);
    f1.in = f0.out;
    if (!rc) rc = ex_stage_forward(st[1], a, &ab.b, &f1, err);
    double oerr = 0;
    for (int i = 0; !rc && i < rows * 64; i++) oerr = fmax(oerr, fabs(f1.out[i] - ref[i]));
    if (!rc) rc = ex_stage_backward(st[1], a, &ab.b, &b1, err);
    b0.in = b1.out;
    if (!rc) rc = ex_stage_backward(st[0], a, &ab.b, &b0, err);
    /* every stage tensor's gradient against the whole model's of the same name */
    double gerr = 0;
    int seen = 0;
    for (int r = 0; r < 2 && !rc; r++)
        for (int i = 0; i < ex_param_count(st[r]); i++) {
            ex_param p, w;
            ex_param_get(st[r], i, &p);
            if (!find_param(whole, p.name, &w) || w.numel != p.numel) { gerr = 1; continue; }
            seen++;
            for (int64_t j = 0; j < p.numel; j++) gerr = fmax(gerr, fabs(p.grad[j] - w.grad[j]) / (fabs(w.grad[j]) + 1e-3));
        }
    bool split = f0.out_rows == 24 && f1.out_rows == 12 && b1.out_rows == 24 && b0.out == NULL;
    int n_whole = whole ? ex_param_count(whole) : -1;
    ex_model_free(whole); ex_model_free(st[0]); ex_model_free(st[1]);
    free(dout); free(ab.mel);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(split);
    CHECK_EQ_INT(seen, n_whole);   /* the stages hold every tensor once */
    CHECK_MSG(oerr < 1e-6, "stage rows differ by %g", oerr);
    CHECK_MSG(gerr < 1e-5, "stage gradients differ by %g (relative)", gerr);
}

/* -------------------------------------------------------- slots, memory */

/* Two micro-batches alive in slots 0 and 1 (other clip counts and lengths)
 * give the gradients of running them one after the other; a slot's memory
 * is exactly what plan_module_acts lists for it (plus its sequence offsets). */
TEST(audio_slots_keep_two_micro_batches_and_allocate_what_the_plan_lists)
{
    model_t m;
    int a = load("tiny-audio", &m);
    CHECK(a >= 0);
    audio_batch A, B;
    make_clips(&A, &m.mod[a], 3, 16);
    make_clips(&B, &m.mod[a], 2, 24);
    char err[UTIL_ERR_LEN] = "";
    ex_model *x = NULL, *y = NULL;
    int rc = ex_model_create_modules(&m, 3, 1u << a, &x, err);
    if (!rc) rc = ex_model_create_modules(&m, 3, 1u << a, &y, err);
    float *da = rnd((size_t)12 * 64, 1), *db = rnd((size_t)12 * 64, 1);
    audio_pass_ctx pa = { &A.b, da, 0 }, pb = { &B.b, db, 0 };
    float l;
    if (!rc) rc = audio_pass(&pa, y, &l, err);
    if (!rc) rc = audio_pass(&pb, y, &l, err);
    const float *out;
    int rows;
    size_t act0 = util_mem_current(UTIL_MEM_ACTIV), act1 = 0;
    if (!rc) rc = ex_audio_forward(x, &A.b, &out, &rows, err);
    act1 = util_mem_current(UTIL_MEM_ACTIV);
    if (!rc) rc = ex_audio_set_slot(x, 1, err);
    if (!rc) rc = ex_audio_forward(x, &B.b, &out, &rows, err);
    if (!rc) rc = ex_audio_set_slot(x, 0, err);
    if (!rc) rc = ex_audio_backward(x, &A.b, da, err);
    if (!rc) rc = ex_audio_set_slot(x, 1, err);
    if (!rc) rc = ex_audio_backward(x, &B.b, db, err);
    float *gx, *gy;
    size_t nx, ny;
    bool same = !rc && !ex_module_buffer(x, a, EX_BUF_GRADS, &gx, &nx) && !ex_module_buffer(y, a, EX_BUF_GRADS, &gy, &ny) &&
                nx == ny && !memcmp(gx, gy, nx * sizeof *gx);
    int wrong = ex_audio_backward(x, &A.b, da, err);   /* slot 1 holds B */
    /* the first forward's slot and the scratch: the plan's lists for 24 rows, 12 pooled */
    plan_module s = { .dp = 1, .tp = 1, .sp = 1, .pp = 1, .micro_batch = 1 };
    plan_act_rows r = { .rows = 24, .merged_rows = 12 };
    double saved, block_saved, scratch, logits;
    plan_module_act_bytes(&m.mod[a], &s, 0, &r, sizeof(float), &saved, &block_saved, &scratch, &logits);
    size_t want = (size_t)(saved + scratch) + 2 * 4 * sizeof(int);
    ex_model_free(x); ex_model_free(y);
    free(A.mel); free(B.mel); free(da); free(db);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(same);
    CHECK_EQ_INT(wrong, UTIL_EINVAL);
    CHECK_MSG(act1 - act0 == want, "allocated %zu bytes, plan_module_acts lists %zu", act1 - act0, want);
    CHECK(logits == 0);
}

/* Selective (attention core and GELU re-run) and full recomputation (each
 * block re-run from its input, LayerNorm statistics and all) give the
 * gradients of keeping every activation, bit for bit, and keep less. */
TEST(audio_recomputation_gives_the_same_gradients)
{
    model_t m;
    audio_batch ab;
    int a = load_clips("tiny-audio", 3, 16, &m, &ab);
    CHECK(a >= 0);
    float *dout = rnd((size_t)12 * 64, 1);
    char err[UTIL_ERR_LEN] = "";
    const plan_recompute modes[3] = { PLAN_RECOMP_NONE, PLAN_RECOMP_SELECTIVE, PLAN_RECOMP_FULL };
    float *g[3] = { NULL, NULL, NULL };
    size_t n[3] = { 0, 0, 0 }, act[3] = { 0, 0, 0 };
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++) {
        ex_parallel par[MODEL_MAX_MODULES];
        memset(par, 0, sizeof par);
        par[a].recompute = modes[i];
        ex_model *em = NULL;
        rc = ex_model_create_per_module(ex_backend_cpu(), &m, 4, 1u << a, par, &em, err);
        size_t before = util_mem_current(UTIL_MEM_ACTIV);
        audio_pass_ctx pc = { &ab.b, dout, 0 };
        float l, *gb;
        if (!rc) rc = audio_pass(&pc, em, &l, err);
        act[i] = util_mem_current(UTIL_MEM_ACTIV) - before;
        if (!rc && !ex_module_buffer(em, a, EX_BUF_GRADS, &gb, &n[i])) {
            g[i] = malloc(n[i] * sizeof(float));
            memcpy(g[i], gb, n[i] * sizeof(float));
        }
        ex_model_free(em);
    }
    bool same = g[0] && g[1] && g[2] && n[1] == n[0] && n[2] == n[0] && !memcmp(g[0], g[1], n[0] * 4) &&
                !memcmp(g[0], g[2], n[0] * 4);
    for (int i = 0; i < 3; i++) free(g[i]);
    free(dout); free(ab.mel);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK(same);
    CHECK_MSG(act[1] < act[0] && act[2] < act[1], "activation bytes %zu, %zu, %zu", act[0], act[1], act[2]);
}

/* ----------------------------------------------- frozen, hooks, bad input */

static int log_hook_begin(void *ctx, int module, int unit, ex_unit_use use)
{
    int *log = ctx;
    (void)module;
    log[1 + log[0]++] = use == EX_USE_FORWARD ? unit : 100 + unit;
    return 0;
}
static int log_hook_end(void *ctx, int module, int unit, ex_unit_use use, bool last)
{
    (void)ctx; (void)module; (void)unit; (void)use; (void)last;
    return 0;
}

/* The unit hooks of a forward, a backward and both empty passes follow
 * ex_module_unit_order; a frozen encoder's backward leaves nothing to
 * update and holds no gradients or optimizer state. */
TEST(audio_unit_hooks_follow_the_unit_order_and_frozen_encoders_stay)
{
    model_t m;
    audio_batch ab;
    int a = load_clips("tiny-audio", 2, 8, &m, &ab);
    CHECK(a >= 0);
    char err[UTIL_ERR_LEN] = "";
    ex_model *em = NULL;
    int log[64] = { 0 }, fwd[8], bwd[8];
    int rc = ex_model_create_modules(&m, 9, 1u << a, &em, err);
    int nf = ex_module_unit_order(em, a, EX_USE_FORWARD, fwd, 8), nb = ex_module_unit_order(em, a, EX_USE_BACKWARD, bwd, 8);
    ex_unit_hooks h = { log, log_hook_begin, log_hook_end };
    if (!rc) rc = ex_model_set_unit_hooks(em, a, &h);
    float *dout = rnd((size_t)8 * 64, 1);
    audio_pass_ctx pc = { &ab.b, dout, 0 };
    float l;
    if (!rc) rc = audio_pass(&pc, em, &l, err);
    if (!rc) rc = ex_audio_empty_pass(em, EX_USE_FORWARD, err);
    if (!rc) rc = ex_audio_empty_pass(em, EX_USE_BACKWARD, err);
    bool order = log[0] == 2 * (nf + nb);
    for (int rep = 0; rep < 2 && order; rep++) {
        for (int i = 0; i < nf; i++) order &= log[1 + rep * (nf + nb) + i] == fwd[i];
        for (int i = 0; i < nb; i++) order &= log[1 + rep * (nf + nb) + nf + i] == 100 + bwd[i];
    }
    ex_model_free(em);
    /* frozen */
    m.mod[a].frozen = true;
    ex_model *fz = NULL;
    if (!rc) rc = ex_model_create_modules(&m, 9, 1u << a, &fz, err);
    float *before = NULL, *after, *g;
    size_t n = 0, n2;
    if (!rc && !ex_module_buffer(fz, a, EX_BUF_PARAMS, &after, &n)) {
        before = malloc(n * sizeof *before);
        memcpy(before, after, n * sizeof *before);
    }
    if (!rc) rc = audio_pass(&pc, fz, &l, err);
    bool kept = before && !ex_module_buffer(fz, a, EX_BUF_PARAMS, &after, &n2) && n2 == n && !memcmp(before, after, n * 4);
    bool stateless = ex_module_buffer(fz, a, EX_BUF_GRADS, &g, &n2) == UTIL_ENOTFOUND &&
                     ex_module_buffer(fz, a, EX_BUF_ADAM_M, &g, &n2) == UTIL_ENOTFOUND;
    ex_model_free(fz);
    free(before); free(dout); free(ab.mel);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(nf, m.mod[a].layers + 2);
    CHECK_MSG(order, "the hooks ran %d uses, not the unit order's", log[0]);
    CHECK(kept);
    CHECK(stateless);
}

/* Clips the model or its encoder cannot take are refused by name, one line each. */
TEST(audio_bad_batches_and_models_are_refused_with_one_line)
{
    model_t m, vl;
    int a = load("tiny-audio", &m);
    CHECK(a >= 0);
    char err[UTIL_ERR_LEN] = "";
    ex_model *em = NULL, *v = NULL;
    CHECK_OK(ex_model_create(&m, 1, &em, err));
    audio_batch ab;
    make_clips(&ab, &m.mod[a], 2, 16);
    const float *out;
    int rows;
    struct { int tm, n; const char *want; } bad[] = {
        { 15, 2, "mel_frames 15" }, { 0, 2, "mel_frames 0" }, { 18, 2, "not a multiple of audio's pool 2" },
        { 132, 2, "exceed audio's max_positions 64" }, { 16, -1, "n_audio -1" },
    };
    bool ok = true;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0] && ok; i++) {
        ex_batch b = ab.b;
        b.mel_frames = bad[i].tm;
        b.n_audio = bad[i].n;
        ok = ex_audio_forward(em, &b, &out, &rows, err) == UTIL_EINVAL && strstr(err, bad[i].want) && !strchr(err, '\n');
        if (!ok) printf("bad batch %zu: '%s'\n", i, err);
    }
    ex_batch nomel = ab.b;
    nomel.mel = NULL;
    ok = ok && ex_check_audio(em, &nomel, err) == UTIL_EINVAL;
    /* audio for a model without an audio encoder */
    CHECK_OK(model_load("tiny-vl", &vl, err));
    CHECK_OK(ex_model_create(&vl, 1, &v, err));
    bool no_encoder = ex_check_audio(v, &ab.b, err) == UTIL_EINVAL && strstr(err, "no audio encoder") &&
                      ex_audio_forward(v, &ab.b, &out, &rows, err) == UTIL_EINVAL;
    ex_model_free(v);
    ex_model_free(em);
    /* what the encoder does not implement */
    model_t bad_m = m;
    bad_m.mod[a].proj_hidden = 16;
    int two_layer = ex_model_create(&bad_m, 1, &em, err);
    bool named = two_layer == UTIL_EUNSUPPORTED && strstr(err, "audio") != NULL;
    bad_m = m;
    bad_m.mod[a].patch = 4;
    int even = ex_model_create(&bad_m, 1, &em, err);
    free(ab.mel);
    CHECK(ok);
    CHECK(no_encoder);
    CHECK(named);
    CHECK_EQ_INT(even, UTIL_EINVAL);
}

/* Qwen2.5-Omni's thinker shape: one instance holds vision, audio and the LLM;
 * both encoders run their own micro-batch and return their rows. */
TEST(audio_omni_instance_runs_vision_and_audio_encoders)
{
    model_t m;
    int a = load("tiny-omni", &m);
    CHECK(a >= 0);
    int vi = model_find_kind(&m, MODEL_VISION);
    char err[UTIL_ERR_LEN] = "";
    ex_model *em = NULL;
    CHECK_OK(ex_model_create(&m, 2, &em, err));
    audio_batch ab;
    make_clips(&ab, &m.mod[a], 2, 16);
    int ipb[2] = { 1, 1 };
    float *pix = rnd((size_t)2 * 64 * 48, 1);
    ex_batch b = ab.b;
    b.n_images = 2; b.grid_h = b.grid_w = 8; b.patches = 64; b.pixels = pix; b.images_per_sample = ipb;
    const float *vo, *ao;
    int vrows = 0, arows = 0;
    int rc = ex_vision_forward(em, &b, &vo, &vrows, err);
    if (!rc) rc = ex_audio_forward(em, &b, &ao, &arows, err);
    float *dv = rnd((size_t)vrows * 64, 1), *da = rnd((size_t)arows * 64, 1);
    if (!rc) rc = ex_vision_backward(em, &b, dv, err);
    if (!rc) rc = ex_audio_backward(em, &b, da, err);
    float *g;
    size_t n;
    double gv = 0, ga = 0;
    if (!rc && !ex_module_buffer(em, vi, EX_BUF_GRADS, &g, &n)) for (size_t i = 0; i < n; i++) gv += fabs(g[i]);
    if (!rc && !ex_module_buffer(em, a, EX_BUF_GRADS, &g, &n)) for (size_t i = 0; i < n; i++) ga += fabs(g[i]);
    int per_clip = ex_audio_rows_per_clip(em, &b);
    ex_model_free(em);
    free(ab.mel); free(pix); free(dv); free(da);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(vrows, 2 * 64 / 4);
    CHECK_EQ_INT(arows, 2 * 8 / 2);
    CHECK_EQ_INT(per_clip, 4);
    CHECK(gv > 0 && ga > 0);
}

/* ------------------------------------------------- PyTorch reference */

static void torch_audio_case(const char *model)
{
    const char *script = getenv("DHP_TORCH_AUDIO_REF_SCRIPT");
    if (!script) { test_skip("driven by tests/t_torch_ref.sh (needs DHP_TORCH_AUDIO_REF_SCRIPT)"); return; }
    model_t m;
    int a = load(model, &m);
    CHECK(a >= 0);
    const model_module *am = &m.mod[a];
    audio_batch ab;
    make_clips(&ab, am, 3, 16);
    char err[UTIL_ERR_LEN], dir[] = "/tmp/dhp-torchaudio-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    ex_model *em;
    CHECK_OK(ex_model_create_modules(&m, 1234, 1u << a, &em, err));
    test_perturb_vectors(em, ur);
    float *p0 = test_params_copy(em), *dout = rnd((size_t)12 * 64, 1);
    audio_pass_ctx pc = { &ab.b, dout, 0 };
    float loss;
    CHECK_OK(audio_pass(&pc, em, &loss, err));
    ex_optim_config oc = test_ref_optim(test_grad_norm(em));
    char cfg[2048], optim[512], path[400];
    test_ref_optim_json(optim, sizeof optim, &oc);
    snprintf(cfg, sizeof cfg,
             "{\"audio\": {\"layers\": %d, \"heads\": %d, \"head_dim\": %d, \"in_channels\": %d, \"patch\": %d, "
             "\"pool\": %d},\n\"batch\": {\"n_audio\": %d, \"mel_frames\": %d},\n%s\n}\n",
             am->layers, am->heads, am->head_dim, am->in_channels, am->patch, am->pool, ab.b.n_audio, ab.b.mel_frames, optim);
    snprintf(path, sizeof path, "%s/params.bin", dir);
    CHECK_OK(ex_params_save_raw(em, path, err));
    CHECK_OK(test_write_file(dir, "config.json", cfg, strlen(cfg)));
    CHECK_OK(test_write_file(dir, "mel.bin", ab.mel, (size_t)3 * 16 * am->in_channels * 4));
    CHECK_OK(test_write_file(dir, "dout.bin", dout, (size_t)12 * 64 * 4));
    test_ref_result r;
    test_torch_compare(em, script, dir, loss, p0, &oc, audio_pass, &pc, &r, err);
    /* the tolerances of tests/t_torch_ref.sh's tiny-vl cases */
    char why[UTIL_ERR_LEN];
    bool ok = test_ref_verdict("torch_audio_ref", model, loss, &r, err, why, sizeof why);
    free(p0); free(dout); free(ab.mel);
    ex_model_free(em);
    CHECK_MSG(ok, "%s", why);
}

/* learned positions (Qwen2-Audio), and sinusoids (Qwen2.5-Omni) */
TEST_DRIVEN(audio_torch_ref_tiny_audio) { torch_audio_case("tiny-audio"); }
TEST_DRIVEN(audio_torch_ref_tiny_omni) { torch_audio_case("tiny-omni"); }
