/* The audio encoder's conv stem geometry, one owner for executor/audio.c
 * (which runs it), the cost model (which prices its calls) and the layout
 * (which allocates its rows). Whisper's stem (conv1: kernel k, padding k / 2;
 * conv2: the same with stride 2; huggingface/transformers
 * models/qwen2_audio/modeling_qwen2_audio.py Qwen2AudioEncoder) turns a
 * clip's 2F mel frames into F rows. A rank holding `rows` consecutive rows
 * of the batch's clips (clip after clip; under Ulysses its 1 / sp) computes
 * them clip by clip: the segment of each clip it touches, and the conv1
 * frames that segment's conv2 reads. */
#include "planner/planner.h"

#include <math.h>

bool plan_audio_segment(const model_module *mm, int F, int lo, int rows, int clip, plan_audio_seg *s)
{
    int k = mm->patch, pad = k / 2, Tm = 2 * F, hi = lo + rows;
    int a = clip * F > lo ? clip * F : lo, b = (clip + 1) * F < hi ? (clip + 1) * F : hi;
    if (a >= b) return false;
    s->t0 = a - clip * F;
    s->n = b - a;
    s->row = a - lo;
    int c0 = 2 * s->t0 - pad, c1 = 2 * (s->t0 + s->n - 1) - pad + k;
    s->s0 = c0 > 0 ? c0 : 0;
    s->ns = (c1 < Tm ? c1 : Tm) - s->s0;
    return true;
}

void plan_audio_clips(int F, int lo, int rows, int *c0, int *c1)
{
    if (F <= 0) {   /* clips of no frames (a workload without audio): none touched */
        *c0 = *c1 = 0;
        return;
    }
    *c0 = lo / F;
    *c1 = (lo + rows + F - 1) / F;
}

void plan_audio_stem_work(const model_module *mm, int samples, int F, int sp, double *conv1_rows, double *segments)
{
    int N = samples * F, parts = sp > 1 ? sp : 1, rows = N / parts;
    *conv1_rows = *segments = 0;
    if (F <= 0) return;   /* a workload without audio (audio_frames 0): no clip, no stem work */
    for (int r = 0; r < parts; r++) {
        int c0, c1, n = 0;
        double r1 = 0;
        plan_audio_clips(F, r * rows, rows, &c0, &c1);
        for (int c = c0; c < c1; c++) {
            plan_audio_seg s;
            if (plan_audio_segment(mm, F, r * rows, rows, c, &s)) { r1 += s.ns; n++; }
        }
        if (r1 > *conv1_rows) { *conv1_rows = r1; *segments = n; }
    }
}

/* 2 N rows for whole clips (conv2 has stride 2), and under Ulysses k - 2
 * more at most: the halo a rank whose rows start (k / 2 frames) or end
 * (k / 2 - 1) inside a clip adds. */
double plan_audio_conv1_rows(const model_module *mm, const plan_module *s, double N)
{
    return 2 * N + (s->sp > 1 ? mm->patch - 2 : 0);
}

int plan_audio_frames_check(const model_module *mm, int F, const char *what, char *err)
{
    if (mm->pool > 1 && F % mm->pool)
        return util_fail(err, UTIL_EINVAL, "%s: %d frames after the conv stem are not a multiple of %s's pool %d", what, F,
                         mm->name, mm->pool);
    if (mm->max_positions > 0 && F > mm->max_positions)
        return util_fail(err, UTIL_EINVAL, "%s: %d frames after the conv stem exceed %s's max_positions %d (its learned "
                         "positions' rows)", what, F, mm->name, mm->max_positions);
    return UTIL_OK;
}

int plan_audio_default_frames(const model_module *mm)
{
    return mm->max_positions > 0 ? mm->max_positions : 1500;
}
