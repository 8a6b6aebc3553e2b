/* The audio encoder: Whisper-large-v3's encoder as Qwen2-Audio and
 * Qwen2.5-Omni's thinker use it (huggingface/transformers
 * src/transformers/models/qwen2_audio/modeling_qwen2_audio.py,
 * Qwen2AudioEncoder; qwen2_5_omni/modeling_qwen2_5_omni.py,
 * Qwen2_5OmniAudioEncoder):
 *   x0  = gelu(conv2(gelu(conv1(mel)))) + positions
 *         conv1: C mel bins -> d, kernel k, padding k / 2; conv2: d -> d, kernel
 *         k, stride 2, padding k / 2 (k = 3: 2F mel frames -> F rows)
 *         positions: learned rows [F, d] when the model has max_positions
 *         (Qwen2-Audio's embed_positions), else Whisper's sinusoids (Omni's
 *         SinusoidsPositionEmbedding)
 *   the pre-norm blocks (LayerNorm, attention without rotary over each clip,
 *   GELU MLP: block.c), then AvgPool1d(pool, pool) over each clip's rows, the
 *   final LayerNorm and the projector Linear(d -> LLM hidden).
 * Forward and backward run in activation slots, with the unit hooks around
 * every use of a unit, as vision.c does. Ulysses sequence parallelism splits
 * the batch's rows (clips one after another) over the sp ranks; each rank
 * runs the conv stem for its own rows from the whole clips' mel frames
 * (a halo of k / 2 conv1 frames where its rows start or end inside a clip),
 * so its stem weight gradients are partial sums, all-reduced over the sp
 * group like every encoder weight's. */
#include "executor/encoder_int.h"

#include <math.h>
#include <string.h>


int ex_check_audio_module(const model_module *mm, const model_module *llm, char *err)
{
    const char *n = mm->name;
    if (mm->in_channels <= 0 || mm->patch <= 0 || mm->patch % 2 == 0 || mm->pool < 1)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: in_channels > 0, an odd conv kernel (patch) and pool >= 1 are needed", n);
    if (mm->proj_hidden > 0 || mm->proj_norm || mm->pre_norm || !mm->final_norm)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: the audio encoder is Whisper's: final_norm, one linear projector (proj_hidden 0), no proj_norm or pre_norm", n);
    if (mm->merge > 1 || mm->temporal_patch > 1 || mm->window > 0)
        return util_fail(err, UTIL_EUNSUPPORTED, "executor: module %s: merge, temporal_patch and window attention do not apply to the audio encoder", n);
    if (mm->proj_in != mm->hidden)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: proj_in %d != hidden %d", n, mm->proj_in, mm->hidden);
    if (mm->out_hidden != llm->hidden)
        return util_fail(err, UTIL_EINVAL, "executor: module %s: out_hidden %d != llm hidden %d", n, mm->out_hidden, llm->hidden);
    if (mm->max_positions == 0 && (mm->hidden % 2 || mm->hidden < 4))
        return util_fail(err, UTIL_EINVAL, "executor: module %s: sinusoidal positions need an even hidden >= 4 (got %d)", n, mm->hidden);
    return UTIL_OK;
}

int ex_check_audio(const ex_model *em, const ex_batch *b, char *err)
{
    if (b->n_audio < 0) return util_fail(err, UTIL_EINVAL, "executor: batch: n_audio %d < 0", b->n_audio);
    if (b->n_audio == 0) return UTIL_OK;
    if (em->aud_index < 0) return util_fail(err, UTIL_EINVAL, "executor: batch: %d audio clips but the model has no audio encoder", b->n_audio);
    if (!b->mel || !b->audio_per_sample)
        return util_fail(err, UTIL_EINVAL, "executor: batch: audio clips without mel or audio_per_sample");
    return ex_audio_check_frames(&em->m.mod[em->aud_index], b->mel_frames, err);
}

int ex_audio_check_frames(const model_module *am, int mel_frames, char *err)
{
    if (mel_frames < 2 || mel_frames % 2)
        return util_fail(err, UTIL_EINVAL, "executor: batch: mel_frames %d must be even and >= 2 (the stride-2 conv stem halves it)", mel_frames);
    return plan_audio_frames_check(am, mel_frames / 2, "executor: batch", err);
}

int ex_audio_rows_per_clip(const ex_model *em, const ex_batch *b)
{
    if (b->n_audio <= 0 || em->aud_index < 0) return 0;
    return b->mel_frames / 2 / em->m.mod[em->aud_index].pool;
}

/* ---------------------------------------------------------------- stem */

/* This rank's segment of clip c (plan_audio_segment). */
static bool audio_seg_of(const ex_module *md, int F, int c, plan_audio_seg *s)
{
    return plan_audio_segment(&md->mm, F, md->sp_rank * md->n_rows, md->n_rows, c, s);
}

/* The clips this rank's rows touch: [*c0, *c1). */
static void audio_clips(const ex_module *md, int F, int *c0, int *c1)
{
    plan_audio_clips(F, md->sp_rank * md->n_rows, md->n_rows, c0, c1);
}

/* im2col of every segment's conv1 frames (stride 1 over the mel frames) into
 * col; returns the conv1 rows (plan_audio_conv1_rows bounds them). */
static int conv1_cols(const ex_backend *be, ex_module *md, const ex_batch *b, float *col)
{
    int C = md->mm.in_channels, k = md->mm.patch, Tm = b->mel_frames, F = Tm / 2, c0, c1, r = 0;
    const float *mel = md->slot[md->cur].in_dev;   /* b->mel on the backend (ex_audio_stage_forward) */
    audio_clips(md, F, &c0, &c1);
    for (int c = c0; c < c1; c++) {
        plan_audio_seg s;
        if (!audio_seg_of(md, F, c, &s)) continue;
        be->im2col1d(col + (size_t)r * C * k, mel + (size_t)c * Tm * C, s.ns, C, k, 1, k / 2, s.s0, 0, Tm);
        r += s.ns;
    }
    return r;
}

/* im2col of conv2 (stride 2) over each segment's conv1 rows c1 into col, or
 * (dc1 given) its backward: dcol's gradient into the conv1 rows. */
static void conv2_cols(const ex_backend *be, ex_module *md, const ex_batch *b, const float *c1, float *col,
                       float *dc1, const float *dcol)
{
    int d = md->d, k = md->mm.patch, Tm = b->mel_frames, F = Tm / 2, c0, c1n, r = 0;
    audio_clips(md, F, &c0, &c1n);
    for (int c = c0; c < c1n; c++) {
        plan_audio_seg s;
        if (!audio_seg_of(md, F, c, &s)) continue;
        size_t at = (size_t)s.row * d * k;
        if (dc1) be->col2im1d(dc1 + (size_t)r * d, dcol + at, s.n, d, k, 2, k / 2, s.t0, s.s0, s.ns);
        else be->im2col1d(col + at, c1 + (size_t)r * d, s.n, d, k, 2, k / 2, s.t0, s.s0, s.ns);
        r += s.ns;
    }
}

/* Whisper's sinusoids (modeling_qwen2_5_omni.py SinusoidsPositionEmbedding,
 * whisper/model.py sinusoids): row t = [sin(t inv_i), cos(t inv_i)], i < d/2,
 * inv_i = exp(-i ln(10000) / (d/2 - 1)); the n rows of clip frames t0.. into tab. */
static void sinusoids(float *tab, int t0, int n, int d)
{
    int half = d / 2;
    double inc = log(10000.0) / (half - 1);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < half; i++) {
            double ang = (t0 + r) * exp(-inc * i);
            tab[(size_t)r * d + i] = (float)sin(ang);
            tab[(size_t)r * d + half + i] = (float)cos(ang);
        }
}

/* Positions of this rank's rows added to x0, one add per segment (the
 * learned table's rows, or sinusoids written into the dln scratch, free
 * during a forward). The table is not trained: transformers' Whisper and
 * Qwen2-Audio encoders hold it as a parameter but freeze it
 * (embed_positions.requires_grad_(False) in WhisperEncoder and
 * Qwen2AudioEncoder), so it gets no gradient (and no weight decay,
 * planner/layout.c) and a checkpoint's table stays as loaded. */
static int positions(const ex_backend *be, ex_module *md, const ex_batch *b, float *x0, char *err)
{
    int d = md->d, Tm = b->mel_frames, F = Tm / 2, c0, c1;
    audio_clips(md, F, &c0, &c1);
    for (int c = c0; c < c1; c++) {
        plan_audio_seg s;
        if (!audio_seg_of(md, F, c, &s)) continue;
        size_t n = (size_t)s.n * d;
        if (md->w.pos) {
            be->add_inplace(x0 + (size_t)s.row * d, md->w.pos + (size_t)s.t0 * d, n);
        } else {
            float *tab = util_malloc((n ? n : 1) * sizeof *tab);   /* host staging */
            if (!tab) return util_fail(err, UTIL_ENOMEM, "executor: %s: out of memory for the positions", md->mm.name);
            sinusoids(tab, s.t0, s.n, d);
            be->h2d(md->a.dln, tab, n * sizeof *tab);
            util_free(tab);
            be->add_inplace(x0 + (size_t)s.row * d, md->a.dln, n);
        }
    }
    return UTIL_OK;
}

/* The conv stem from the slot's mel frames (in; conv1_cols reads them there). */
static int stem_forward(const ex_backend *be, ex_module *md, const ex_batch *b, const float *in, float *x0, char *err)
{
    (void)in;
    ex_acts *a = &md->a;
    int d = md->d, C = md->mm.in_channels, k = md->mm.patch, N = md->n_rows;
    int R1 = conv1_cols(be, md, b, a->col);
    be->linear_forward(a->c1pre, a->col, md->w.conv1w, md->w.conv1b, R1, C * k, d);
    be->gelu_forward(a->c1out, a->c1pre, (size_t)R1 * d);
    conv2_cols(be, md, b, a->c1out, a->col, NULL, NULL);
    be->linear_forward(a->c2pre, a->col, md->w.conv2w, md->w.conv2b, N, d * k, d);
    be->gelu_forward(x0, a->c2pre, (size_t)N * d);
    return positions(be, md, b, x0, err);
}

/* From dres = dL/d(x0): conv2's and conv1's weight gradients (the mel
 * frames need none, the frozen positions none either). */
static void stem_backward(const ex_backend *be, ex_module *md, const ex_batch *b)
{
    ex_acts *a = &md->a;
    int d = md->d, C = md->mm.in_channels, k = md->mm.patch, N = md->n_rows;
    be->zero(a->dln, (size_t)N * d);
    be->gelu_backward(a->dln, a->dres, a->c2pre, (size_t)N * d);
    conv2_cols(be, md, b, a->c1out, a->col, NULL, NULL);
    be->zero(a->dcol, (size_t)N * d * k);
    be->linear_backward(a->dcol, md->g.conv2w, md->g.conv2b, a->dln, a->col, md->w.conv2w, N, d * k, d);
    int R1 = conv1_cols(be, md, b, a->col);
    be->zero(a->dc1out, (size_t)R1 * d);
    conv2_cols(be, md, b, NULL, NULL, a->dc1out, a->dcol);
    be->zero(a->dc1pre, (size_t)R1 * d);
    be->gelu_backward(a->dc1pre, a->dc1out, a->c1pre, (size_t)R1 * d);
    be->linear_backward(NULL, md->g.conv1w, md->g.conv1b, a->dc1pre, a->col, md->w.conv1w, R1, C * k, d);
}

/* ---------------------------------------------------------- the encoder */

/* The slot's geometry: this rank's N / sp rows (whole pool groups), one
 * attention sequence per clip (cu over all the batch's rows, as Ulysses
 * attends over them). */
static int audio_geometry(ex_module *md, const ex_batch *b, char *err)
{
    int F = b->mel_frames / 2, N = b->n_audio * F, pool = md->mm.pool;
    if (N % md->sp || (N / md->sp) % pool)
        return util_fail(err, UTIL_EINVAL, "executor: batch: %d audio frames do not split into sp_size %d parts of whole pool groups of %d", N, md->sp, pool);
    int Nl = N / md->sp;
    int rc = ex_acts_ensure(md, Nl, Nl / pool, 0, 0, 0, b->n_audio, err);
    if (rc) return rc;
    for (int i = 0; i <= b->n_audio; i++) md->cu[i] = md->cu_win[i] = i * F;
    md->n_seq = md->n_win = b->n_audio;
    ex_cu_upload(md, md->n_seq, md->n_win);
    return UTIL_OK;
}

int ex_audio_rows(const ex_module *md, const ex_batch *b) { return b->n_audio * (b->mel_frames / 2) / md->sp; }

/* The head: aout[M, out] = proj(layernorm(avgpool(xL))), M = N / pool. */
static void head_forward(const ex_backend *be, ex_module *md, const ex_batch *b, ex_stage_io *io)
{
    (void)b;
    const model_module *mm = &md->mm;
    ex_acts *a = &md->a;
    int M = md->n_rows / mm->pool;
    be->avgpool_rows_forward(a->pooled, a->x_final, M, mm->pool, md->d);
    ex_norm_forward(be, md, a->fln, a->fmean, a->frstd, a->pooled, md->w.lnf, md->w.lnf_b, M);
    be->linear_forward(a->aout, a->fln, md->w.proj_w, md->w.proj_b, M, md->d, mm->out_hidden);
    io->out = a->aout;
    io->out_rows = M;
}

static void head_backward(const ex_backend *be, ex_module *md, const ex_batch *b, const float *dout)
{
    (void)b;
    const model_module *mm = &md->mm;
    ex_acts *a = &md->a;
    int d = md->d, N = md->n_rows, M = N / mm->pool;
    be->zero(a->dln, (size_t)M * d);
    be->linear_backward(a->dln, md->g.proj_w, md->g.proj_b, dout, a->fln, md->w.proj_w, M, d, mm->out_hidden);
    be->zero(a->dpooled, (size_t)M * d);
    ex_norm_backward(be, md, a->dpooled, md->g.lnf, md->g.lnf_b, a->dln, a->pooled, md->w.lnf, a->fmean, a->frstd, M);
    be->zero(a->dres, (size_t)N * d);
    be->avgpool_rows_backward(a->dres, a->dpooled, M, mm->pool, d);
}

static const ex_encoder_parts audio_parts = { stem_forward, head_forward, head_backward, stem_backward };

/* Audio forward of this stage: x0 from the conv stem on the first stage
 * (else the previous stage's rows), the stage's blocks, then on the last
 * stage the head. */
int ex_audio_stage_forward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err)
{
    const model_module *mm = &md->mm;
    int rc = ex_check_audio(em, b, err);
    if (!rc && b->n_audio == 0) rc = util_fail(err, UTIL_EINVAL, "executor: %s forward: batch has no audio", mm->name);
    if (!rc && !md->stage.stem && !io->in) rc = util_fail(err, UTIL_EINVAL, "executor: %s stage %d forward: no input rows", mm->name, md->stage_index);
    if (!rc) rc = audio_geometry(md, b, err);
    if (rc) return rc;
    size_t mel = (size_t)b->n_audio * b->mel_frames * mm->in_channels;
    return ex_encoder_stage_run_forward(em->be, md, b, b->mel, mel * sizeof(float), &audio_parts, io, err);
}

/* Audio backward of this stage, from daout [M, out] on the last stage (else
 * the next stage's gradient of this stage's rows), down to the conv stem's
 * weights on the first stage (else the gradient of the stage's input rows). */
int ex_audio_stage_backward(ex_model *em, ex_module *md, const ex_batch *b, ex_stage_io *io, char *err)
{
    int rc = ex_check_audio(em, b, err);
    if (!rc) rc = ex_encoder_backward_begin(md, ex_audio_rows(md, b), io, err);
    if (rc) return rc;
    if (md->n_seq != b->n_audio)
        return util_fail(err, UTIL_EINVAL, "executor: %s backward: batch differs from slot %d's forward", md->mm.name, md->cur);
    return ex_encoder_stage_run_backward(em->be, md, b, &audio_parts, io, err);
}

int ex_audio_set_slot(ex_model *em, int slot, char *err)
{
    if (em->aud_index < 0) return util_fail(err, UTIL_EINVAL, "executor: ex_audio_set_slot: no audio module on this model instance");
    return ex_module_set_slot(em, em->aud_index, slot, err);
}

int ex_audio_forward(ex_model *em, const ex_batch *b, const float **aud_out, int *aud_rows, char *err)
{
    return ex_encoder_forward(em, em->aud_index, "ex_audio_forward", "audio", b, aud_out, aud_rows, err);
}

int ex_audio_backward(ex_model *em, const ex_batch *b, const float *daud, char *err)
{
    return ex_encoder_backward(em, em->aud_index, "ex_audio_backward", "audio", b, daud, err);
}

/* A micro-batch this rank has no samples of, while its shard group's other
 * ranks do: only the unit hooks (ex_stage_empty_pass). */
int ex_audio_empty_pass(ex_model *em, ex_unit_use use, char *err)
{
    return ex_encoder_empty_pass(em, em->aud_index, "ex_audio_empty_pass", "audio", use, err);
}
