/* executor-internal: TF32, the tensor cores' 19-bit float (sign, fp32's 8
 * exponent bits, 10 mantissa bits: NVIDIA A100 Tensor Core GPU Architecture
 * whitepaper, "TF32 ... 10-bit mantissa ... 8-bit exponent"), kept in an fp32
 * with the low 13 mantissa bits zero. ex_tf32_round rounds an fp32 to it,
 * to nearest, ties to even; a NaN stays a quiet NaN, an infinity stays one
 * and a value that rounds past FLT_MAX becomes one. What cuBLAS does with
 * CUBLAS_COMPUTE_32F_FAST_TF32 ("allows down-converting inputs to TF32",
 * cublas_api.h): the CPU emulator of the CUDA backend (tests/cudaemu_lt.h)
 * rounds the GEMM's A and B with it, then multiplies in fp32 (a product of
 * two 11-bit significands is exact in fp32's 24 bits). The hardware's own
 * conversion is not documented bit for bit (PTX's cvt.rna.tf32.f32 rounds
 * ties away from zero); the two differ on exact ties only. */
#ifndef DHP_EXECUTOR_TF32_H
#define DHP_EXECUTOR_TF32_H

#include <stdint.h>
#include <string.h>

static inline float ex_tf32_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) {   /* infinity stays; NaN stays a quiet NaN */
        if (u & 0x007fffffu) u |= 0x00400000u;
    } else {
        u += 0xfffu + ((u >> 13) & 1u);   /* round half to even on the dropped 13 bits */
    }
    u &= 0xffffe000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
