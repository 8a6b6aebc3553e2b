/* executor-internal: bfloat16 as 16 bits (sign, 8 exponent bits, 7 mantissa
 * bits: the upper half of an IEEE-754 binary32). Conversion from fp32 rounds
 * to nearest, ties to even, as CUDA's __float2bfloat16_rn and PyTorch's
 * c10::BFloat16 round_to_nearest_even (c10/util/BFloat16.h); a NaN stays a
 * quiet NaN. Widening back is exact. One definition for the CPU backend, the
 * CUDA kernels and the emulator. */
#ifndef DHP_EXECUTOR_BF16_H
#define DHP_EXECUTOR_BF16_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__) || defined(EX_CUDA_EMU)
#define EX_BF16_HD __host__ __device__
#else
#define EX_BF16_HD
#endif

typedef uint16_t ex_bf16;

static inline EX_BF16_HD ex_bf16 ex_bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ex_bf16)((u >> 16) | 0x40u);   /* NaN: keep it quiet */
    u += 0x7fffu + ((u >> 16) & 1u);   /* round half to even on the dropped 16 bits */
    return (ex_bf16)(u >> 16);
}

static inline EX_BF16_HD float ex_bf16_to_f32(ex_bf16 b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* inout[i] = bf16(in[i] + inout[i]): one step of a bf16 sum (the
 * activation collectives under bf16, executor/tp_wire.c), added in fp32 and
 * rounded back as NCCL's bf16 reductions do. Commutative, so every rank of a
 * collective gets the same bits whatever order its algorithm pairs them in.
 * One definition for the MPI communicator's user op (executor/comm_mpi.c)
 * and the emulated NCCL's (tests/ncclemu.h), so they agree bit for bit. */
static inline void ex_bf16_sum_into(const void *in, void *inout, size_t n)
{
    const ex_bf16 *a = (const ex_bf16 *)in;
    ex_bf16 *b = (ex_bf16 *)inout;
    for (size_t i = 0; i < n; i++) b[i] = ex_bf16_from_f32(ex_bf16_to_f32(a[i]) + ex_bf16_to_f32(b[i]));
}

#endif
