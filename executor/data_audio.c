/* The synthetic data set's sounds (executor/DATASET.md, "Audio"): each
 * sample's clip is F frames of B log-mel-like bins, a quiet noise floor with
 * one sound on it: a tone (a steady band, low, mid or high), a chirp (a band
 * sweeping up or down) or a noise burst (every bin loud, short or long), so
 * its caption can be learnt from the frames. Values follow Whisper's
 * normalised log-mel range, (log10 mel clamped to max - 8, + 4) / 4, about
 * [-1, 1] (huggingface/transformers WhisperFeatureExtractor._np_extract_fbank_features). */
#include "executor/data_int.h"

#include <math.h>
#include <stdio.h>

static const char *const tone_names[] = { "low", "mid", "high" };
static const char *const chirp_names[] = { "rising", "falling" };
static const char *const burst_names[] = { "short", "long" };

/* u in [0, 1) from the stream */
static double unit(uint64_t *s) { return (ex_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0); }

static unsigned char encode(double v)
{
    double b = floor((v + 1.0) * 127.5 + 0.5);
    return (unsigned char)(b < 0 ? 0 : b > 255 ? 255 : b);
}

/* The floor's level at one bin and frame: -0.8 + [0, 0.1) */
static double floor_level(uint64_t *s) { return -0.8 + 0.1 * unit(s); }

/* A band of loudness 0.9 centred at bin c, Gaussian across bins, over the floor. */
static double band(double fl, int b, double c, double width)
{
    double g = exp(-(b - c) * (b - c) / (2 * width * width));
    return fl + (0.9 - fl) * g;
}

/* Sample i's generator state is seed ^ (i + 1) * 0xA24BAED4963EE407 (its own
 * stream, so the images of a set with audio are those of the same set
 * without). Draws: kind, variant, then the span (tone, chirp: start in
 * [0, F/4), end in (3F/4, F]; burst: start), then per frame and bin
 * (frame-major) a floor value and, inside a burst, the burst's value. */
void ex_synth_sound(uint64_t seed, int i, int F, int B, unsigned char *frames, int *kind, int *variant, char *caption)
{
    uint64_t s = seed ^ ((uint64_t)(i + 1) * 0xA24BAED4963EE407ull);
    int k = (int)ex_rng_below(&s, 3), v = (int)ex_rng_below(&s, k == 0 ? 3 : 2);
    int t0, t1;
    if (k == 2) {
        int len = v == 0 ? (F / 8 > 2 ? F / 8 : 2) : F / 2;
        t0 = (int)ex_rng_below(&s, (uint32_t)(F - len + 1));
        t1 = t0 + len;
    } else {
        t0 = (int)ex_rng_below(&s, (uint32_t)(F / 4 > 0 ? F / 4 : 1));
        t1 = F - (int)ex_rng_below(&s, (uint32_t)(F / 4 > 0 ? F / 4 : 1));
    }
    double width = B / 32.0 > 0.6 ? B / 32.0 : 0.6;
    for (int t = 0; t < F; t++)
        for (int b = 0; b < B; b++) {
            double fl = floor_level(&s), val = fl;
            bool on = t >= t0 && t < t1;
            if (on && k == 0) {
                val = band(fl, b, B * (0.2 + 0.3 * v), width);
            } else if (on && k == 1) {
                double p = t1 - t0 > 1 ? (double)(t - t0) / (t1 - t0 - 1) : 0;
                val = band(fl, b, B * (v == 0 ? 0.15 + 0.7 * p : 0.85 - 0.7 * p), width);
            } else if (on) {
                val = 0.3 + 0.6 * unit(&s);
            }
            frames[(size_t)t * B + b] = encode(val);
        }
    *kind = k;
    *variant = v;
    if (k == 0) snprintf(caption, EX_SOUND_CAPTION_MAX, "a %s tone", tone_names[v]);
    else if (k == 1) snprintf(caption, EX_SOUND_CAPTION_MAX, "a %s chirp", chirp_names[v]);
    else snprintf(caption, EX_SOUND_CAPTION_MAX, "a %s noise burst", burst_names[v]);
}

int ex_data_check_audio(const ex_dataset_info *in, const model_t *m, char *err)
{
    int ai = model_find_kind(m, MODEL_AUDIO);
    if (in->mel_frames > 0 && ai < 0)
        return util_fail(err, UTIL_EINVAL, "data: the data set has audio (mel_bins %d, mel_frames %d) but model %s has no audio encoder",
                         in->mel_bins, in->mel_frames, m->name);
    if (ai < 0) return UTIL_OK;
    const model_module *am = &m->mod[ai];
    if (in->mel_frames == 0)
        return util_fail(err, UTIL_EINVAL, "data: model %s has an audio encoder (%s) but the data set has no audio (dhp data synth --audio)",
                         m->name, am->name);
    if (in->mel_bins != am->in_channels)
        return util_fail(err, UTIL_EINVAL, "data: the data set's mel_bins %d != module %s in_channels %d", in->mel_bins,
                         am->name, am->in_channels);
    return ex_audio_check_frames(am, in->mel_frames, err);
}
