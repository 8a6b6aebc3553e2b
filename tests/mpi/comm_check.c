/* Checks the communicator (executor/comm.h) on N ranks, with `--comm nccl`
 * its NCCL implementation (built against tests/ncclemu.h: comm_check_emu),
 * else MPI: every
 * collective against values computed locally from rank-dependent inputs, on
 * the world and on split sub-communicators (even/odd reversed by key, a rank
 * left out, tp x dp rows and columns); point-to-point rings posted before any
 * wait; sends to self; error paths; the bytes counters; the bf16 sums. Everything runs twice,
 * the second time with MPI calls split in pieces of 5 elements.
 * Prints "comm_check ok N" on rank 0, or "comm_check FAIL rank R: ..." lines;
 * exits nonzero on failure. Run by tests/t_comm.sh under mpirun. */
#include "executor/backend.h"
#include "executor/bf16.h"
#include "executor/comm.h"
#include "util/util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_fails;
static char g_first[400];

__attribute__((format(printf, 2, 3)))
static void note_fail(int line, const char *fmt, ...)
{
    if (g_fails++) return;
    int k = snprintf(g_first, sizeof g_first, "line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_first + k, sizeof g_first - (size_t)k, fmt, ap);
    va_end(ap);
}
#define EXPECT(cond, ...) do { if (!(cond)) note_fail(__LINE__, __VA_ARGS__); } while (0)
#define EXPECT_OK(c, expr) do { int _rc = (expr); \
    EXPECT(_rc == UTIL_OK, "%s returned %d: %s", #expr, _rc, ex_comm_error(c)); } while (0)

/* Exact in float: rank r's element i of chunk j. */
static float val(int r, int j, size_t i) { return (float)(r * 1000 + j * 100 + (int)(i % 97)); }

static void *xcalloc(size_t n, size_t s)
{
    void *p = calloc(n ? n : 1, s);
    if (!p) { fprintf(stderr, "comm_check: out of memory\n"); exit(2); }
    return p;
}

static void expect_bytes(ex_comm *c, uint64_t before, uint64_t want, const char *what, const char *name)
{
    uint64_t got = ex_comm_bytes(c) - before;
    EXPECT(got == want, "%s on %s counted %llu bytes, want %llu", what, name,
           (unsigned long long)got, (unsigned long long)want);
}

static void check_reductions(ex_comm *c, size_t n, const char *name)
{
    int p = ex_comm_size(c), r = ex_comm_rank(c);
    float *f = xcalloc(n, sizeof *f), *g = xcalloc(n, sizeof *g);
    double *d = xcalloc(n, sizeof *d);
    int *k = xcalloc(n, sizeof *k);
    for (size_t i = 0; i < n; i++) {
        f[i] = val(r, 0, i);
        g[i] = (r % 2 ? -1.0f : 1.0f) * val(r, 1, i);
        d[i] = r + 0.5 + (double)i;
        k[i] = (size_t)r == i % (size_t)p ? 100 + (int)i : -r;
    }
    uint64_t b0 = ex_comm_bytes(c);
    EXPECT_OK(c, ex_comm_allreduce_sum(c, f, n));
    expect_bytes(c, b0, 2 * (uint64_t)(p - 1) * n * 4 / (uint64_t)p, "allreduce_sum", name);
    EXPECT_OK(c, ex_comm_allreduce_max(c, g, n));
    EXPECT_OK(c, ex_comm_allreduce_sum_f64(c, d, n));
    EXPECT_OK(c, ex_comm_allreduce_max_int(c, k, n));
    for (size_t i = 0; i < n; i++) {
        float sum = 0, mx = -1e30f;
        double dsum = 0;
        int kmax = -(1 << 30);
        for (int q = 0; q < p; q++) {
            sum += val(q, 0, i);
            float gq = (q % 2 ? -1.0f : 1.0f) * val(q, 1, i);
            mx = gq > mx ? gq : mx;
            dsum += q + 0.5 + (double)i;
            int kq = (size_t)q == i % (size_t)p ? 100 + (int)i : -q;
            kmax = kq > kmax ? kq : kmax;
        }
        EXPECT(f[i] == sum, "allreduce_sum on %s [%zu] = %g, want %g", name, i, f[i], sum);
        EXPECT(g[i] == mx, "allreduce_max on %s [%zu] = %g, want %g", name, i, g[i], mx);
        EXPECT(d[i] == dsum, "allreduce_sum_f64 on %s [%zu] = %g, want %g", name, i, d[i], dsum);
        EXPECT(k[i] == kmax, "allreduce_max_int on %s [%zu] = %d, want %d", name, i, k[i], kmax);
    }
    free(f); free(g); free(d); free(k);
}

static void check_chunked(ex_comm *c, size_t n, const char *name)
{
    int p = ex_comm_size(c), r = ex_comm_rank(c);
    size_t pn = (size_t)p * n;
    float *send = xcalloc(pn, sizeof *send), *recv = xcalloc(pn, sizeof *recv);
    for (size_t i = 0; i < n; i++) send[i] = val(r, 0, i);
    uint64_t b0 = ex_comm_bytes(c);
    EXPECT_OK(c, ex_comm_allgather(c, send, recv, n));
    expect_bytes(c, b0, (uint64_t)(p - 1) * n * 4, "allgather", name);
    for (size_t j = 0; j < pn; j++)
        EXPECT(recv[j] == val((int)(j / n), 0, j % n), "allgather on %s [%zu] = %g", name, j, recv[j]);

    for (size_t j = 0; j < pn; j++) send[j] = val(r, (int)(j / n), j % n);
    memset(recv, 0, pn * sizeof *recv);
    b0 = ex_comm_bytes(c);
    EXPECT_OK(c, ex_comm_reduce_scatter(c, send, recv, n));
    expect_bytes(c, b0, (uint64_t)(p - 1) * n * 4, "reduce_scatter", name);
    for (size_t i = 0; i < n; i++) {
        float sum = 0;
        for (int q = 0; q < p; q++) sum += val(q, r, i);
        EXPECT(recv[i] == sum, "reduce_scatter on %s [%zu] = %g, want %g", name, i, recv[i], sum);
    }

    b0 = ex_comm_bytes(c);
    EXPECT_OK(c, ex_comm_alltoall(c, send, recv, n));
    expect_bytes(c, b0, (uint64_t)(p - 1) * n * 4, "alltoall", name);
    for (size_t j = 0; j < pn; j++)
        EXPECT(recv[j] == val((int)(j / n), r, j % n), "alltoall on %s [%zu] = %g", name, j, recv[j]);
    free(send); free(recv);
}

static void check_bytes_calls(ex_comm *c, size_t n, const char *name)
{
    int p = ex_comm_size(c), r = ex_comm_rank(c), root = p - 1;
    size_t nb = 3 * n + 1;
    unsigned char *b = xcalloc(nb, 1), *all = xcalloc((size_t)p * nb, 1);
    if (r == root) for (size_t i = 0; i < nb; i++) b[i] = (unsigned char)(i * 7 + n);
    uint64_t b0 = ex_comm_bytes(c);
    EXPECT_OK(c, ex_comm_bcast(c, b, nb, root));
    expect_bytes(c, b0, (uint64_t)nb * (uint64_t)(p - 1) / (uint64_t)p, "bcast", name);
    for (size_t i = 0; i < nb; i++)
        EXPECT(b[i] == (unsigned char)(i * 7 + n), "bcast on %s byte %zu = %d", name, i, b[i]);
    for (size_t i = 0; i < nb; i++) b[i] = (unsigned char)(r * 31 + i);
    b0 = ex_comm_bytes(c);
    EXPECT_OK(c, ex_comm_gather_bytes(c, b, r == 0 ? all : NULL, nb, 0));
    expect_bytes(c, b0, r == 0 ? 0 : nb, "gather_bytes", name);
    if (r == 0)
        for (size_t j = 0; j < (size_t)p * nb; j++)
            EXPECT(all[j] == (unsigned char)((j / nb) * 31 + j % nb), "gather_bytes on %s byte %zu", name, j);
    EXPECT_OK(c, ex_comm_barrier(c));
    EXPECT(ex_comm_bcast(c, b, nb, p) == UTIL_ERUNTIME && strstr(ex_comm_error(c), "root"),
           "bcast to root %d on %s accepted", p, name);
    free(b); free(all);
}

/* The bf16 sums: small integers, exact in bf16 whatever order the ranks'
 * partial sums take, then (2 ranks: one partial sum) a sum that rounds,
 * 1 + 1.5 * 2^-8 -> 1 + 2^-7 (to nearest; fp32 keeps it). */
static void check_bf16(ex_comm *c, size_t n, const char *name)
{
    int p = ex_comm_size(c), r = ex_comm_rank(c);
    size_t pn = (size_t)p * n;
    uint16_t *buf = xcalloc(pn, sizeof *buf), *recv = xcalloc(n, sizeof *recv);
    for (size_t i = 0; i < n; i++) buf[i] = ex_bf16_from_f32((float)(r + (int)(i % 7)));
    uint64_t b0 = ex_comm_bytes(c);
    EXPECT_OK(c, ex_comm_allreduce_sum_bf16(c, buf, n));
    expect_bytes(c, b0, 2 * (uint64_t)(p - 1) * n * 2 / (uint64_t)p, "allreduce_sum_bf16", name);
    for (size_t i = 0; i < n; i++) {
        int sum = 0;
        for (int q = 0; q < p; q++) sum += q + (int)(i % 7);
        EXPECT(ex_bf16_to_f32(buf[i]) == (float)sum, "allreduce_sum_bf16 on %s [%zu] = %g, want %d", name, i,
               ex_bf16_to_f32(buf[i]), sum);
    }
    for (size_t j = 0; j < pn; j++) buf[j] = ex_bf16_from_f32((float)(r + (int)(j / n) + (int)(j % n % 5)));
    b0 = ex_comm_bytes(c);
    EXPECT_OK(c, ex_comm_reduce_scatter_bf16(c, buf, recv, n));
    expect_bytes(c, b0, (uint64_t)(p - 1) * n * 2, "reduce_scatter_bf16", name);
    for (size_t i = 0; i < n; i++) {
        int sum = 0;
        for (int q = 0; q < p; q++) sum += q + r + (int)(i % 5);
        EXPECT(ex_bf16_to_f32(recv[i]) == (float)sum, "reduce_scatter_bf16 on %s [%zu] = %g, want %d", name, i,
               ex_bf16_to_f32(recv[i]), sum);
    }
    if (p == 2) {
        for (size_t i = 0; i < n; i++) buf[i] = ex_bf16_from_f32(r ? 3.0f / 512 : 1.0f);
        EXPECT_OK(c, ex_comm_allreduce_sum_bf16(c, buf, n));
        for (size_t i = 0; i < n; i++)
            EXPECT(ex_bf16_to_f32(buf[i]) == 1.0f + 1.0f / 128, "allreduce_sum_bf16 on %s rounds to %.9g, want %.9g", name,
                   ex_bf16_to_f32(buf[i]), 1.0f + 1.0f / 128);
    }
    free(buf); free(recv);
}

static void check_collectives(ex_comm *c, const char *name)
{
    const size_t sizes[] = { 1, 13 };
    for (size_t s = 0; s < 2; s++) {
        check_bf16(c, sizes[s], name);
        check_reductions(c, sizes[s], name);
        check_chunked(c, sizes[s], name);
        check_bytes_calls(c, sizes[s], name);
    }
}

/* Splits c by color/key, checks the new rank and size and that its members
 * are the expected world ranks (member(q) is rank q's world rank). */
static ex_comm *split_checked(ex_comm *c, int color, int key, int want_rank, int want_size,
                              int (*member)(int me, int q), const char *name)
{
    char err[UTIL_ERR_LEN] = "";
    ex_comm *s = NULL;
    int r = ex_comm_rank(c);
    EXPECT(ex_comm_split(c, color, key, &s, err) == UTIL_OK, "split %s: %s", name, err);
    if (!s) return NULL;
    EXPECT(ex_comm_rank(s) == want_rank && ex_comm_size(s) == want_size, "%s: rank %d/%d, want %d/%d",
           name, ex_comm_rank(s), ex_comm_size(s), want_rank, want_size);
    float me = (float)r, *all = xcalloc((size_t)ex_comm_size(s), sizeof *all);
    EXPECT_OK(s, ex_comm_allgather(s, &me, all, 1));
    for (int q = 0; q < ex_comm_size(s); q++)
        EXPECT(all[q] == (float)member(r, q), "%s: member %d is world rank %g, want %d", name, q, all[q], member(r, q));
    free(all);
    return s;
}

static int g_p, g_tp;
static int parity_member(int me, int q)
{   /* same parity as me, in decreasing world rank (key = -rank) */
    int top = (g_p - 1) - (g_p - 1 - me) % 2;
    return top - 2 * q;
}
static int plain_member(int me, int q) { (void)me; return q; }
static int row_member(int me, int q) { return (me / g_tp) * g_tp + q; }
static int col_member(int me, int q) { return q * g_tp + me % g_tp; }

static void check_splits(ex_comm *w)
{
    int p = ex_comm_size(w), r = ex_comm_rank(w);
    g_p = p;
    g_tp = p % 2 == 0 ? 2 : 1;
    int same = 0, above = 0;
    for (int q = 0; q < p; q++) if (q % 2 == r % 2) { same++; above += q > r; }
    ex_comm *par = split_checked(w, r % 2, -r, above, same, parity_member, "parity");
    if (par) check_collectives(par, "parity");
    ex_comm *rest = split_checked(w, r == p - 1 && p > 1 ? -1 : 4, r, r, p > 1 ? p - 1 : 1, plain_member, "all-but-last");
    EXPECT((rest == NULL) == (r == p - 1 && p > 1), "all-but-last: rank %d got %s", r, rest ? "a comm" : "NULL");
    if (rest) check_reductions(rest, 5, "all-but-last");
    ex_comm *row = split_checked(w, r / g_tp, r % g_tp, r % g_tp, g_tp, row_member, "tp-row");
    ex_comm *col = split_checked(w, r % g_tp, r / g_tp, r / g_tp, p / g_tp, col_member, "dp-column");
    if (row) check_collectives(row, "tp-row");
    if (col) check_collectives(col, "dp-column");
    ex_comm_free(par); ex_comm_free(rest); ex_comm_free(row); ex_comm_free(col);
}

/* Both ring directions posted (irecv and isend) before any wait, sends waited
 * first; with one rank both neighbours are self. */
static void check_ring(ex_comm *c, size_t n)
{
    int p = ex_comm_size(c), r = ex_comm_rank(c), right = (r + 1) % p, left = (r + p - 1) % p;
    float *sr = xcalloc(n, sizeof(float)), *sl = xcalloc(n, sizeof(float));
    float *fl = xcalloc(n, sizeof(float)), *fr = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) { sr[i] = val(r, 5, i); sl[i] = val(r, 6, i); }
    ex_request *q[4] = { 0 };
    uint64_t b0 = ex_comm_bytes(c);
    EXPECT_OK(c, ex_comm_irecv(c, fl, n, left, 11, &q[2]));
    EXPECT_OK(c, ex_comm_irecv(c, fr, n, right, 12, &q[3]));
    EXPECT_OK(c, ex_comm_isend(c, sr, n, right, 11, &q[0]));
    EXPECT_OK(c, ex_comm_isend(c, sl, n, left, 12, &q[1]));
    for (int i = 0; i < 4; i++) if (q[i]) EXPECT_OK(c, ex_comm_wait(c, q[i]));
    expect_bytes(c, b0, 2 * (uint64_t)n * 4, "ring", "world");
    for (size_t i = 0; i < n; i++) {
        EXPECT(fl[i] == val(left, 5, i), "ring from left [%zu] = %g", i, fl[i]);
        EXPECT(fr[i] == val(right, 6, i), "ring from right [%zu] = %g", i, fr[i]);
    }
    /* blocking send to self, then the receive; the buffered copy in between
     * is the implementation's memory, counted as UTIL_MEM_COMM (executor/comm.h) */
    size_t comm0 = util_mem_current(UTIL_MEM_COMM);
    EXPECT_OK(c, ex_comm_send(c, sr, n, r, 3));
    EXPECT(util_mem_current(UTIL_MEM_COMM) == comm0 + n * sizeof(float), "a buffered send to self of %zu B counted as "
           "%zu B of COMM memory", n * sizeof(float), util_mem_current(UTIL_MEM_COMM) - comm0);
    memset(fl, 0, n * sizeof(float));
    EXPECT_OK(c, ex_comm_recv(c, fl, n, r, 3));
    EXPECT(memcmp(fl, sr, n * sizeof(float)) == 0, "send to self garbled");
    EXPECT(util_mem_current(UTIL_MEM_COMM) == comm0, "COMM memory %zu B after the receive from self, %zu B before the send",
           util_mem_current(UTIL_MEM_COMM), comm0);
    free(sr); free(sl); free(fl); free(fr);
}

/* A receive shorter or longer than its message fails (MPI's truncation
 * error, or the count check), and so do a bad tag and a bad peer. NCCL
 * cannot tell a size mismatch (it hangs or corrupts; the emulation aborts
 * the communicator), so there only the argument checks run. */
static void check_p2p_errors(ex_comm *c, bool sizes)
{
    int p = ex_comm_size(c), r = ex_comm_rank(c);
    float x[10] = { 0 };
    EXPECT(ex_comm_send(c, x, 1, p, 0) == UTIL_ERUNTIME && strstr(ex_comm_error(c), "peer"), "peer %d accepted", p);
    EXPECT(ex_comm_send(c, x, 1, 0, 1 << 20) == UTIL_ERUNTIME && strstr(ex_comm_error(c), "tag"), "tag 1<<20 accepted");
    if (p < 2 || r > 1 || !sizes) return;
    if (r == 0) {
        EXPECT_OK(c, ex_comm_send(c, x, 10, 1, 20));
        EXPECT_OK(c, ex_comm_send(c, x, 5, 1, 21));
    } else {
        EXPECT(ex_comm_recv(c, x, 5, 0, 20) == UTIL_ERUNTIME && strstr(ex_comm_error(c), "MPI_Wait"),
               "truncated receive accepted: '%s'", ex_comm_error(c));
        EXPECT(ex_comm_recv(c, x, 10, 0, 21) == UTIL_ERUNTIME && strstr(ex_comm_error(c), "got 5 floats"),
               "short message accepted: '%s'", ex_comm_error(c));
    }
}

/* ex_comm_start launches a collected send now: rank 1's receive completes
 * while rank 0 makes no communicator call at all (it watches for a file
 * rank 1 writes once it has the message; without the start, NCCL's send
 * waited for rank 0's next wait, and rank 0 reports it after 10 s). */
static void check_started_send(ex_comm *c, float *d, size_t n)
{
    double id = ex_comm_rank(c) == 0 ? (double)getpid() : 0;
    EXPECT_OK(c, ex_comm_allreduce_sum_f64(c, &id, 1));
    char flag[64];
    snprintf(flag, sizeof flag, "/tmp/dhp_comm_check_started.%.0f", id);
    if (ex_comm_rank(c) == 0) {
        ex_request *q = NULL;
        EXPECT_OK(c, ex_comm_isend(c, d, n, 1, 9, &q));
        EXPECT_OK(c, ex_comm_start(c));
        double t0 = util_now();
        while (access(flag, F_OK) != 0 && util_now() - t0 < 10) usleep(1000);
        EXPECT(access(flag, F_OK) == 0, "a started send did not reach rank 1 in 10 s without a wait");
        if (q) EXPECT_OK(c, ex_comm_wait(c, q));
        unlink(flag);
    } else if (ex_comm_rank(c) == 1) {
        EXPECT_OK(c, ex_comm_recv(c, d, n, 0, 9));
        FILE *f = fopen(flag, "w");
        if (f) fclose(f);
    }
    double one = 1;
    EXPECT_OK(c, ex_comm_allreduce_sum_f64(c, &one, 1));
}

/* With NCCL beside a backend whose memory is device memory (a GPU, or
 * comm_check_emu's emulated CUDA backend, which tells host from device
 * pointers as a GPU does): a device buffer's sum goes through NCCL, a host
 * one's through MPI, both right, and so does a ring of host messages; and
 * a send still collected (not launched) when its rank enters a
 * host collective is launched first, so the peer that waits for it before
 * the same collective gets it (a deadlock before). Returns whether it ran. */
static bool check_device_routing(ex_comm *c)
{
    char err[UTIL_ERR_LEN];
    const ex_backend *be = ex_backend_cuda(err);
    if (!be || be->host_memory) return false;
    int p = ex_comm_size(c), r = ex_comm_rank(c);
    enum { N = 64 };
    float h[N], *d = be->alloc(N * sizeof(float), UTIL_MEM_ACTIV);
    EXPECT(d != NULL, "device buffer of %d floats", N);
    if (!d) return true;
    for (int i = 0; i < N; i++) h[i] = val(r, 0, (size_t)i);
    be->h2d(d, h, sizeof h);
    EXPECT_OK(c, ex_comm_allreduce_sum(c, d, N));
    EXPECT_OK(c, ex_comm_allreduce_sum(c, h, N));
    float back[N];
    be->d2h(back, d, sizeof back);
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int q = 0; q < p; q++) want += val(q, 0, (size_t)i);
        EXPECT(back[i] == want && h[i] == want, "sum [%d]: device %g host %g, want %g", i, back[i], h[i], want);
    }
    if (p > 1) {
        /* a ring of host messages (through MPI) */
        float out = (float)r, in = -1;
        ex_request *q = NULL;
        EXPECT_OK(c, ex_comm_isend(c, &out, 1, (r + 1) % p, 7, &q));
        EXPECT_OK(c, ex_comm_recv(c, &in, 1, (r + p - 1) % p, 7));
        if (q) EXPECT_OK(c, ex_comm_wait(c, q));
        EXPECT(in == (float)((r + p - 1) % p), "host message from rank %d: %g", (r + p - 1) % p, in);
        double one = 1;
        if (r == 0) {
            ex_request *q = NULL;
            EXPECT_OK(c, ex_comm_isend(c, d, N, 1, 8, &q));
            EXPECT_OK(c, ex_comm_allreduce_sum_f64(c, &one, 1));
            if (q) EXPECT_OK(c, ex_comm_wait(c, q));
        } else {
            if (r == 1) EXPECT_OK(c, ex_comm_recv(c, d, N, 0, 8));
            EXPECT_OK(c, ex_comm_allreduce_sum_f64(c, &one, 1));
        }
        EXPECT(one == p, "host sum %g after the collected send, want %d", one, p);
        check_started_send(c, d, N);
    }
    be->release(d);
    return true;
}

int main(int argc, char **argv)
{
    char err[UTIL_ERR_LEN] = "";
    ex_comm *w = NULL, *w2 = NULL;
    ex_comm_kind kind = argc > 2 && !strcmp(argv[1], "--comm") && !strcmp(argv[2], "nccl") ? EX_COMM_NCCL : EX_COMM_MPI;
    if (ex_comm_world(&argc, &argv, kind, &w, err) != UTIL_OK) {
        printf("comm_check FAIL: %s\n", err);
        return 1;
    }
    size_t mem0 = util_mem_current(UTIL_MEM_COMM);
    EXPECT(ex_comm_kind_of(w) == kind, "world is %s, asked %s", ex_comm_kind_name(ex_comm_kind_of(w)), ex_comm_kind_name(kind));
    EXPECT(ex_comm_world(&argc, &argv, kind, &w2, err) == UTIL_OK && ex_comm_size(w2) == ex_comm_size(w),
           "second ex_comm_world: %s", err);
    ex_comm_free(w2);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) ex_comm_set_max_piece(5);
        check_collectives(w, "world");
        check_splits(w);
        check_ring(w, pass == 0 ? (size_t)1 << 18 : 1001);
        if (pass == 0) check_p2p_errors(w, kind == EX_COMM_MPI);
    }
    bool routed = kind == EX_COMM_NCCL && check_device_routing(w);
    EXPECT(util_mem_current(UTIL_MEM_COMM) == mem0, "COMM memory %zu after, %zu before",
           util_mem_current(UTIL_MEM_COMM), mem0);
    int any = g_fails;
    if (ex_comm_allreduce_max_int(w, &any, 1) != UTIL_OK) any = 1;
    if (g_fails) printf("comm_check FAIL rank %d: %d failures, first %s\n", ex_comm_rank(w), g_fails, g_first);
    else if (ex_comm_rank(w) == 0 && !any) printf("comm_check ok %d %s%s\n", ex_comm_size(w), ex_comm_kind_name(kind),
                                              routed ? " (device and host buffers routed)" : "");
    ex_comm_free(w);
    ex_comm_finalize();
    return any ? 1 : 0;
}
