/* Sequence lengths each module sees for a workload. */
#include "planner/planner.h"

#include <math.h>
#include <stdint.h>

static bool llm_uses_cross_attention(const model_t *m)
{
    return m->mod[m->llm].n_cross_layers > 0;
}

/* Rows encoder k gives one sample's LLM sequence (after merge / pooling):
 * a vision encoder's merged image tokens, an audio encoder's pooled frames
 * (one clip per sample); 0 for the LLM and for an encoder whose inputs the
 * samples do not carry. */
double plan_encoder_tokens(const model_t *m, const plan_workload *w, int k)
{
    const model_module *mm = &m->mod[k];
    double pool = mm->pool > 0 ? mm->pool : 1;
    if (mm->kind == MODEL_VISION)
        return (double)w->images_per_sample * w->image_tokens / ((double)mm->merge * mm->merge * pool);
    if (mm->kind == MODEL_AUDIO) return (double)w->audio_frames / pool;
    return 0;
}

int plan_encoder_rows(const model_t *m, const plan_workload *w, int k) { return (int)plan_encoder_tokens(m, w, k); }

/* The one owner of a sample's LLM sequence layout: every encoder's rows in
 * the model's module order, then the text (Qwen2.5-Omni's thinker reads
 * each modality's embeddings at its placeholder tokens, in the order the
 * prompt gives them: the image's, then the audio's, then the text's;
 * transformers' Qwen2_5OmniThinkerForConditionalGeneration.forward scatters
 * them by masked_scatter at those positions). rows[j] is what module j gives
 * this sample (the LLM's entry is ignored). */
int plan_sample_offset(const model_t *m, const int *rows, int k)
{
    int off = 0;
    for (int j = 0; j < k && j < m->n_modules; j++)
        if (j != m->llm) off += rows[j];
    return off;
}

/* Encoder tokens one sample contributes to the LLM. */
static double encoder_tokens_to_llm(const model_t *m, const plan_workload *w)
{
    double t = 0;
    for (int i = 0; i < m->n_modules; i++) t += plan_encoder_tokens(m, w, i);
    return t;
}

int plan_module_seq(const model_t *m, int mi, const plan_workload *w, plan_seq *out)
{
    const model_module *mm = &m->mod[mi];
    plan_seq s = { 0 };
    switch (mm->kind) {
    case MODEL_VISION:
        s.samples_units = w->images_per_sample;
        s.seq = w->image_tokens + (mm->cls_token ? 1 : 0);   /* the class row runs through the blocks */
        s.attn_span_full = s.seq;
        s.attn_span_window = mm->window > 0 ? fmin(mm->window, s.seq) : s.seq;
        break;
    case MODEL_AUDIO:
        s.samples_units = w->audio_frames > 0 ? 1 : 0;
        s.seq = w->audio_frames;
        s.attn_span_full = s.attn_span_window = s.seq;
        break;
    case MODEL_LLM:
        s.samples_units = 1;
        if (llm_uses_cross_attention(m)) {
            s.seq = w->text_tokens;
            s.cross_span = encoder_tokens_to_llm(m, w);
        } else {
            s.seq = w->text_tokens + encoder_tokens_to_llm(m, w);
        }
        /* Causal attention: row r attends to keys 0..r (FlashAttention skips the masked tiles). */
        s.attn_span_full = s.attn_span_window = cost_attention_mean_span(s.seq, true);
        break;
    }
    s.tokens_per_sample = s.samples_units * s.seq;
    *out = s;
    return UTIL_OK;
}

double plan_encoder_out_rows(const model_module *mm, const plan_seq *q, double rows)
{
    double cls = mm->kind == MODEL_VISION && mm->cls_token ? 1 : 0, pool = mm->pool > 0 ? mm->pool : 1;
    double kept = q->seq > 0 ? rows * (q->seq - cls) / q->seq : rows;
    return kept / ((double)mm->merge * mm->merge * pool);
}

double plan_head_rows(const plan_workload *w, plan_target t, double samples, double tokens)
{
    return t == PLAN_TARGET_DHP ? samples * (w->text_tokens - 1) : tokens;
}

int plan_workload_validate(const model_t *m, const plan_workload *w, char *err)
{
    if (w->global_batch < 1)
        return util_fail(err, UTIL_EINVAL, "workload.global_batch: must be >= 1 (got %d)", w->global_batch);
    if (w->text_tokens < 1)
        return util_fail(err, UTIL_EINVAL, "workload.text_tokens: must be >= 1 (got %d)", w->text_tokens);
    if (w->images_per_sample < 0 || w->image_tokens < 0 || w->audio_frames < 0)
        return util_fail(err, UTIL_EINVAL, "workload: image and audio sizes must be >= 0");
    int vi = model_find_kind(m, MODEL_VISION);
    if (vi >= 0 && w->images_per_sample > 0) {
        int mg = m->mod[vi].merge, pool = m->mod[vi].pool;
        if (w->image_tokens < 1)
            return util_fail(err, UTIL_EINVAL, "workload.image_tokens: must be >= 1 when images_per_sample > 0");
        if (w->image_tokens % (mg * mg * pool) != 0)
            return util_fail(err, UTIL_EINVAL, "workload.image_tokens: %d is not a multiple of the %dx%d merge "
                             "times the %d-token pool", w->image_tokens, mg, mg, pool);
    }
    /* every size derived from these stays exact: tokens per sample in an
     * int, tokens per step in a double (2^53) */
    int64_t vis = (int64_t)w->images_per_sample * w->image_tokens;
    int64_t seq = vis + w->text_tokens + w->audio_frames;
    if (vis > INT32_MAX || seq > INT32_MAX)
        return util_fail(err, UTIL_EINVAL, "workload: %d images x %d vision tokens + %d text tokens + %d audio frames = "
                         "%lld tokens per sample, above the limit %d", w->images_per_sample, w->image_tokens,
                         w->text_tokens, w->audio_frames, (long long)seq, INT32_MAX);
    if ((double)seq * w->global_batch > 9007199254740992.0)
        return util_fail(err, UTIL_EINVAL, "workload: global batch %d x %lld tokens per sample is above 2^53 tokens per step",
                         w->global_batch, (long long)seq);
    if (vi < 0 && w->images_per_sample > 0)
        return util_fail(err, UTIL_EINVAL, "workload.images_per_sample: model '%s' has no vision encoder", m->name);
    int ai = model_find_kind(m, MODEL_AUDIO);
    if (ai < 0 && w->audio_frames > 0)
        return util_fail(err, UTIL_EINVAL, "workload.audio_frames: model '%s' has no audio encoder", m->name);
    if (ai >= 0 && w->audio_frames > 0) return plan_audio_frames_check(&m->mod[ai], w->audio_frames, "workload.audio_frames", err);
    return UTIL_OK;
}

int plan_image_tokens_from_pixels(const model_t *m, int pixels, int *tokens, char *err)
{
    int vi = model_find_kind(m, MODEL_VISION);
    if (vi < 0) return util_fail(err, UTIL_EINVAL, "--image-size: model '%s' has no vision encoder", m->name);
    const model_module *v = &m->mod[vi];
    int unit = v->patch * v->merge;
    if (pixels < unit || pixels % unit != 0)
        return util_fail(err, UTIL_EINVAL, "--image-size: %d px is not a positive multiple of patch*merge = %d px",
                         pixels, unit);
    int side = pixels / v->patch;
    *tokens = side * side;
    return UTIL_OK;
}
