/* tests/cudaemu_wmma.h (included by tests/cudaemu.h): the warp matrix
 * functions (nvcuda::wmma, CUDA C++ Programming Guide, "Warp Matrix
 * Functions") that the bf16 attention kernels use (executor/cuda_attention16.cuh),
 * and __nv_bfloat16 as their element type.
 *
 *  - fragment<matrix_a | matrix_b | accumulator, 16, 16, 16, T, layout>:
 *    T __nv_bfloat16 (a, b) or float (accumulator). The lane layout of a real
 *    fragment is unspecified, so here every emulated thread holds the whole
 *    16x16 tile (x[] row-major, num_elements 256): code that treats fragments
 *    as opaque, or only maps every element of x[] the same way (what the
 *    Guide allows), computes the same here as on the GPU;
 *  - load_matrix_sync / store_matrix_sync with the Guide's requirements
 *    checked (a 256-bit aligned pointer; ldm a multiple of 8 elements for
 *    16-bit types and of 4 for float): a violation aborts, naming the call;
 *  - fill_fragment; mma_sync: d = c + a b with the bf16 inputs widened
 *    exactly, every product exact in fp32 (8 x 8 significant bits) and the
 *    16 products of an element added to c in ascending k, rounded to
 *    nearest in fp32 after each addition. The tensor cores add the same exact
 *    products in another order and with their own internal alignment and
 *    rounding (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of
 *    NVIDIA tensor cores", PeerJ CS 7:e330, 2021: products exact, the sum
 *    truncated rather than rounded); either way a result differs from the
 *    exact sum by at most about 17 * 2^-23 times the sum of |c| and |a_k b_k|,
 *    which the tests' bounds (2^-8 per bf16 operand) dwarf.
 * Warps are not checked for taking the same arguments (the kernels keep
 * every *_sync call warp-uniform by construction). */
#ifndef DHP_TESTS_CUDAEMU_WMMA_H
#define DHP_TESTS_CUDAEMU_WMMA_H

#include "executor/bf16.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#define __align__(n) __attribute__((aligned(n)))

/* bits of a bfloat16 (cuda_bf16.h's type; the kernels write the bits themselves) */
struct __nv_bfloat16 {
    uint16_t x;
};

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major;   /* incomplete, as in mma.h */
struct col_major;
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "cudaemu_wmma: only 16x16x16 fragments are emulated");
    enum { num_elements = 256 };
    T x[num_elements];   /* the whole tile, row-major */
};

[[noreturn]] static inline void cudaemu_wmma_abort(const char *call, const char *why)
{
    std::fprintf(stderr, "cudaemu: wmma::%s: %s\n", call, why);
    std::abort();
}

static inline void cudaemu_wmma_check(const char *call, const void *p, unsigned ldm, unsigned multiple)
{
    if ((uintptr_t)p % 32) cudaemu_wmma_abort(call, "the pointer is not 256-bit aligned");
    if (ldm % multiple || ldm < 16) cudaemu_wmma_abort(call, "ldm is not a multiple of 16 bytes of at least 16 elements");
}

static inline float cudaemu_wmma_f32(__nv_bfloat16 b) { return ex_bf16_to_f32(b.x); }

/* element (r, c) of a 16x16 matrix at p: row-major p[r ldm + c], column-major p[c ldm + r] */
template <typename T>
static inline T cudaemu_wmma_at(const T *p, unsigned ldm, int r, int c, bool row)
{
    T v;
    std::memcpy(&v, row ? p + (size_t)r * ldm + c : p + (size_t)c * ldm + r, sizeof v);
    return v;
}

template <typename Use, typename Layout>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f, const __nv_bfloat16 *p,
                                    unsigned ldm)
{
    static_assert(std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value,
                  "cudaemu_wmma: a and b fragments name their layout");
    cudaemu_wmma_check("load_matrix_sync", p, ldm, 8);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r * 16 + c] = cudaemu_wmma_at(p, ldm, r, c, std::is_same<Layout, row_major>::value);
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t layout)
{
    cudaemu_wmma_check("load_matrix_sync", p, ldm, 4);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r * 16 + c] = cudaemu_wmma_at(p, ldm, r, c, layout == mem_row_major);
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                                     layout_t layout)
{
    cudaemu_wmma_check("store_matrix_sync", p, ldm, 4);
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            (layout == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.x[r * 16 + c];
}

template <typename Use, typename T, typename Layout>
static inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout> &f, const T &v)
{
    for (int i = 0; i < 256; i++) f.x[i] = v;
}

/* d = c + a b (see the top). The 32 lanes of a warp run one after another
 * here and pass the same fragments, so a product is kept by its inputs (the
 * whole of a, b and c compared, never trusted to the hash alone) and the
 * other lanes copy it: the same values, 1/32 of the work. */
struct cudaemu_wmma_product {
    uint16_t a[256], b[256];
    float c[256], d[256];
};

template <typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
                            const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c)
{
    static std::unordered_map<uint64_t, cudaemu_wmma_product> seen;
    static std::mutex mu;
    cudaemu_wmma_product p;
    for (int i = 0; i < 256; i++) {
        p.a[i] = a.x[i].x;
        p.b[i] = b.x[i].x;
    }
    std::memcpy(p.c, c.x, sizeof p.c);
    uint64_t h = 1469598103934665603ull, w;   /* FNV-1a over every 5th 64-bit word of a, b, c */
    for (size_t i = 0; i + sizeof w <= offsetof(cudaemu_wmma_product, d); i += 5 * sizeof w) {
        std::memcpy(&w, (const char *)&p + i, sizeof w);
        h = (h ^ w) * 1099511628211ull;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto it = seen.find(h);
    if (it != seen.end() && !std::memcmp(&it->second, &p, offsetof(cudaemu_wmma_product, d))) {
        std::memcpy(d.x, it->second.d, sizeof p.d);
        return;
    }
    float fa[256], fb[256];
    for (int i = 0; i < 256; i++) {
        fa[i] = ex_bf16_to_f32(p.a[i]);
        fb[i] = ex_bf16_to_f32(p.b[i]);
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float s = p.c[i * 16 + j];
            for (int k = 0; k < 16; k++) s += fa[i * 16 + k] * fb[k * 16 + j];
            p.d[i * 16 + j] = s;
        }
    if (seen.size() >= 4096) seen.clear();   /* a warp's lanes follow one another closely */
    seen[h] = p;
    std::memcpy(d.x, p.d, sizeof p.d);
}

}   // namespace wmma
}   // namespace nvcuda

#endif
