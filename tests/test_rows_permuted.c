/* ex_move_permuted_rows (executor/rows_permuted.c): all rows in one
 * gather_rows through an index list kept on the backend, on the CPU backend
 * and the CUDA backend's source (emulated), against the row-by-row
 * definition: both directions, a partial last block, the list kept across
 * calls and rebuilt for another order of the same shape, no order (one
 * copy), and an order that is no permutation (row by row, as before). */
#include "test.h"
#include "tests/kernel_data.h"
#include "util/util.h"

/* The definition, on host buffers. */
static void reference(float *packed, float *permuted, size_t n, size_t d, const int *order, size_t block,
                      bool to_permuted)
{
    for (size_t r = 0; r < n; r++) {
        size_t q = order ? r - r % block + (size_t)order[r % block] : r;
        if (to_permuted) memcpy(permuted + q * d, packed + r * d, d * sizeof(float));
        else memcpy(packed + r * d, permuted + q * d, d * sizeof(float));
    }
}

/* One move on be (from src into a zeroed destination) against the reference; false on a difference. */
static bool move_case(const ex_backend *be, size_t n, size_t d, const int *order, size_t block, bool to_permuted)
{
    size_t bytes = n * d * sizeof(float);
    float *src = rnd(n * d, 1), *want = calloc(n * d, sizeof(float)), *got = malloc(bytes);
    float *a = be->alloc(bytes, UTIL_MEM_OTHER), *b = be->alloc(bytes, UTIL_MEM_OTHER);
    be->h2d(a, src, bytes);
    if (to_permuted) reference(src, want, n, d, order, block, true);
    else reference(want, src, n, d, order, block, false);
    if (to_permuted) ex_move_permuted_rows(be, a, b, n, d, order, block, true);
    else ex_move_permuted_rows(be, b, a, n, d, order, block, false);
    be->d2h(got, b, bytes);
    char err[UTIL_ERR_LEN];
    bool same = be->sync(err) == 0 && !memcmp(got, want, bytes);
    be->release(a);
    be->release(b);
    free(src); free(want); free(got);
    return same;
}

static void check_backend(const ex_backend *be)
{
    const int ord[4] = { 2, 0, 3, 1 }, other[4] = { 1, 0, 3, 2 }, twice[4] = { 0, 0, 1, 2 };
    for (int dir = 0; dir < 2; dir++) {
        CHECK_MSG(move_case(be, 12, 5, ord, 4, dir), "%s: 12 rows, blocks of 4, to_permuted %d", be->name, dir);
        CHECK_MSG(move_case(be, 12, 5, ord, 4, dir), "%s: the kept list again, to_permuted %d", be->name, dir);
        CHECK_MSG(move_case(be, 12, 5, other, 4, dir), "%s: another order of the same shape, to_permuted %d", be->name, dir);
        CHECK_MSG(move_case(be, 10, 3, other, 4, dir), "%s: a partial last block, to_permuted %d", be->name, dir);
        CHECK_MSG(move_case(be, 7, 2, NULL, 7, dir), "%s: no order, to_permuted %d", be->name, dir);
    }
    CHECK_MSG(move_case(be, 8, 3, twice, 4, false), "%s: an order that is no permutation", be->name);
}

TEST(rows_permuted_move_in_one_gather_cpu_and_cuda_emu)
{
    check_backend(ex_backend_cpu());
    char err[UTIL_ERR_LEN] = "";
    const ex_backend *be = ex_backend_cuda_emu(err);
    CHECK_MSG(be != NULL, "%s", err);
    if (be) check_backend(be);
}
