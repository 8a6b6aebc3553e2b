/* executor-internal: what the synthetic data set's files share
 * (executor/data.c: the format, loader and batches; executor/data_audio.c:
 * the sounds). */
#ifndef DHP_EXECUTOR_DATA_INT_H
#define DHP_EXECUTOR_DATA_INT_H

#include "executor/executor.h"

/* splitmix64 (Steele, Lea, Flood 2014; reference code
 * https://prng.di.unimi.it/splitmix64.c): state += golden gamma, then mix. */
static inline uint64_t ex_splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform integer in [0, n): floor(hi32(x) * n / 2^32) (Lemire's
 * multiply-shift, bias < n / 2^32). */
static inline uint32_t ex_rng_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)(((ex_splitmix64(s) >> 32) * (uint64_t)n) >> 32);
}

/* data_audio.c: sample i's sound (DATASET.md "Audio"): its frames
 * [F][B] as bytes, its kind (0 tone, 1 chirp, 2 noise burst) and variant,
 * and the caption that describes it (NUL-terminated, < 24 bytes). */
#define EX_SOUND_CAPTION_MAX 24
void ex_synth_sound(uint64_t seed, int i, int F, int B, unsigned char *frames, int *kind, int *variant,
                    char *caption);
/* A stored frame byte as the feature value: byte / 127.5 - 1, in [-1, 1]. */
static inline float ex_sound_value(unsigned char byte) { return (float)byte / 127.5f - 1.0f; }

#endif
