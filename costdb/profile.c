/* dhp profile: measure the local CPU backend and describe one rank of it in
 * the dhp.gpu/1 format, and the ranks of this host as a one-node
 * dhp.cluster/1 file. The rules that turn measurements into cost-model
 * fields are in costdb/SCHEMA.md ("Measured files") and in each field's
 * source string. costdb sits below the executor, so the executor's kernels
 * timed here (attention, element-wise) come in through cost_profile_opts
 * from the CLI; the STREAM loops are the profile's own. */
#define _GNU_SOURCE   /* sched_getaffinity */
#include "costdb/costdb.h"
#include "costdb/profile_internal.h"

#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>


/* ---- measuring context: MPI or a lone process ---- */


void cost_prof_barrier(const prof_ctx *c)
{
    if (c->mpi) MPI_Barrier(c->comm);
}

/* The slowest rank's value: every rank gets max over ranks of *v. */
void cost_prof_max(const prof_ctx *c, double *v)
{
    if (c->mpi) MPI_Allreduce(MPI_IN_PLACE, v, 1, MPI_DOUBLE, MPI_MAX, c->comm);
}

/* All ranks fail together: the worst result code wins; a rank whose own
 * code is fine but another's is not reports a generic line. */
int cost_prof_agree(const prof_ctx *c, int rc, char *err)
{
    if (!c->mpi) return rc;
    int worst = rc;
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT, MPI_MAX, c->comm);
    if (worst && !rc) return util_fail(err, worst, "profile: another rank failed (code %d)", worst);
    return worst;
}

static bool launched_by_mpirun(void)
{
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}

/* Best mean seconds per call of fn over `trials` batches; a batch runs at
 * least min_calls calls and until target_s / trials has passed. One warm-up
 * call first (caches, page faults, BLAS thread start-up). */
static double time_calls(void (*fn)(void *), void *arg, double target_s, int min_calls, int trials)
{
    fn(arg);
    double best = INFINITY, per_trial = target_s / trials;
    for (int t = 0; t < trials; t++) {
        int calls = 0;
        double t0 = util_now(), dt;
        do { fn(arg); calls++; dt = util_now() - t0; } while (calls < min_calls || dt < per_trial);
        if (dt / calls < best) best = dt / calls;
    }
    return best;
}

/* Kernel figures describe one rank computing alone: rank 0 times fn while
 * the other ranks wait in MPI_Barrier (as the executor's idle ranks wait in
 * MPI_Wait); how ranks slow each other is measured apart (measure_sharing). */
static double alone_time(const prof_ctx *c, void (*fn)(void *), void *arg, double target_s, int min_calls, int trials)
{
    cost_prof_barrier(c);
    double t = c->rank == 0 ? time_calls(fn, arg, target_s, min_calls, trials) : 0;
    cost_prof_max(c, &t);
    return t;
}

void cost_prof_fill(float *x, size_t n, unsigned seed)
{
    unsigned s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((s >> 8) * (1.0 / 16777216.0) - 0.5);
    }
}

/* ---- host facts ---- */

/* Nominal clock: cpufreq's maximum if the kernel exposes it, else the
 * largest "cpu MHz" of /proc/cpuinfo; 0 if neither exists. */
static double cpu_clock_hz(void)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", "r");
    double khz = 0, mhz = 0;
    if (f) {
        if (fscanf(f, "%lf", &khz) != 1) khz = 0;
        fclose(f);
        if (khz > 0) return khz * 1e3;
    }
    if (!(f = fopen("/proc/cpuinfo", "r"))) return 0;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        double v;
        if (!strncmp(line, "cpu MHz", 7) && sscanf(strchr(line, ':') ? strchr(line, ':') + 1 : "", "%lf", &v) == 1 && v > mhz)
            mhz = v;
    }
    fclose(f);
    return mhz * 1e6;
}

/* Bytes in use now: MemTotal - MemAvailable from /proc/meminfo; without it,
 * this process's peak resident size. */
static double memory_in_use(bool *from_meminfo)
{
    FILE *f = fopen("/proc/meminfo", "r");
    double total = -1, avail = -1;
    if (f) {
        char line[256];
        double v;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemTotal: %lf kB", &v) == 1) total = v * 1024;
            if (sscanf(line, "MemAvailable: %lf kB", &v) == 1) avail = v * 1024;
        }
        fclose(f);
    }
    *from_meminfo = total > 0 && avail >= 0 && avail <= total;
    if (*from_meminfo) return total - avail;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) return (double)ru.ru_maxrss * 1024;
    return 0;
}

void cost_prof_host_id(cost_profile *p)
{
    if (gethostname(p->host, sizeof p->host) != 0 || !p->host[0]) util_strlcpy(p->host, "unknown-host", sizeof p->host);
    p->host[sizeof p->host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (!gmtime_r(&now, &tm) || !strftime(p->date, sizeof p->date, "%Y-%m-%dT%H:%M:%SZ", &tm))
        util_strlcpy(p->date, "unknown-date", sizeof p->date);
}

static void host_facts(cost_profile *p)
{
    cost_prof_host_id(p);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    p->cpus = cpus > 0 ? (int)cpus : 1;
    p->blas_threads = openblas_get_num_threads();
    if (p->blas_threads < 1) p->blas_threads = 1;
    p->cpu_hz = cpu_clock_hz();
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    p->phys_bytes = pages > 0 && psize > 0 ? (double)pages * (double)psize : 0;
    p->used_bytes = memory_in_use(&p->used_from_meminfo);
}

/* ---- GEMM: C[m,n] = A[m,k] B[n,k]^T, the executor's linear forward ---- */

/* The grid's GEMMs find their operands as the executor's do: the input A in
 * cache (the kernel before it has just written it), the weights B and the
 * output C in memory (each call takes the next B, C of an arena far larger
 * than the cache; a step touches every weight and output once per pass). On
 * this VM, against the same GEMMs timed inside dhp run (m = 1024, n, k = 32 ..
 * 128, the tiny-vl blocks' linears without a bias), timed all in cache they
 * read 28-47% short, all from memory 3-20% over, this way -7% .. +5%. */
#define GEMM_ARENA_BYTES (512.0 * 1048576)
#define GEMM_ARENA_QUICK_BYTES (64.0 * 1048576)

typedef struct {
    int m, n, k;
    float *arena;               /* slots of A[m,k] B[n,k] C[m,n], one per call */
    size_t arena_n, slot_n, next;
} gemm_arg;

static gemm_arg gemm_shape(float *arena, size_t arena_n, int m, int n, int k)
{
    size_t slot = ((size_t)m * k + (size_t)n * k + (size_t)m * n + 15) & ~(size_t)15;
    return (gemm_arg){m, n, k, arena, arena_n, slot, 0};
}

static void run_gemm(void *v)
{
    gemm_arg *g = v;
    if (g->next + g->slot_n > g->arena_n) g->next = 0;
    const float *A = g->arena, *B = g->arena + g->next + (size_t)g->m * g->k;
    float *C = g->arena + g->next + (size_t)g->m * g->k + (size_t)g->n * g->k;
    g->next += g->slot_n;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g->m, g->n, g->k, 1.0f, A, g->k, B, g->k, 0.0f, C, g->n);
}

void cost_prof_keep_gemm(cost_profile *p, int idx, int pass, int m, int n, int k, double t)
{
    cost_profile_gemm *r = &p->gemm[idx];
    if (pass > 0 && r->seconds <= t) return;
    *r = (cost_profile_gemm){m, n, k, t, 2.0 * m * n * k / t};
}


static int measure_gemm(const prof_ctx *c, cost_profile *p, char *err)
{
    static const int m_full[] = {64, 256, 1024, 4096}, nk_full[] = {32, 64, 128, 512, 2048};
    static const int m_quick[] = {64, 256, 1024}, nk_quick[] = {32, 256, 1024};
    const int *ms = p->quick ? m_quick : m_full, *nks = p->quick ? nk_quick : nk_full;
    int nm = p->quick ? 3 : 4, nnk = p->quick ? 3 : 5;
    size_t mmax = (size_t)ms[nm - 1], nkmax = (size_t)nks[nnk - 1];
    size_t largest = gemm_shape(NULL, 0, (int)mmax, (int)nkmax, (int)nkmax).slot_n;
    double bytes = p->quick ? GEMM_ARENA_QUICK_BYTES : GEMM_ARENA_BYTES;
    if (p->phys_bytes > 0 && bytes > p->phys_bytes / 16) bytes = p->phys_bytes / 16;   /* a small host */
    size_t arena_n = (size_t)(bytes / sizeof(float));
    if (arena_n < 2 * largest) arena_n = 2 * largest;
    if (c->rank != 0) arena_n = 16;   /* only rank 0 times; the others wait */
    float *arena = util_malloc(arena_n * sizeof *arena);
    int rc = arena ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for the GEMM arena (%.0f MiB)",
                                         (double)arena_n * sizeof *arena / 1048576);
    if ((rc = cost_prof_agree(c, rc, err))) goto out;
    cost_prof_fill(arena, arena_n, 1);
    p->gemm_arena_bytes = (double)arena_n * sizeof *arena;
    gemm_arg one = gemm_shape(arena, 16, 1, 1, 1);   /* one slot, the same every call: in cache */
    p->launch_s = alone_time(c, run_gemm, &one, p->quick ? 0.005 : 0.05, 1000, 3);
    /* Passes over the whole grid, best per shape: a burst of load from other
     * processes spoils one pass of a shape, rarely all of them. */
    double target = p->quick ? 0.003 : 0.015;
    p->n_gemm = 0;
    for (int pass = 0; pass < gemm_passes(p); pass++) {
        int idx = 0;
        for (int i = 0; i < nm; i++)
            for (int j = 0; j < nnk; j++)
                for (int l = 0; l < nnk && idx < COST_PROFILE_MAX_GEMM; l++, idx++) {
                    gemm_arg g = gemm_shape(arena, arena_n, ms[i], nks[j], nks[l]);
                    cost_prof_keep_gemm(p, idx, pass, g.m, g.n, g.k, alone_time(c, run_gemm, &g, target, 1, GEMM_BATCHES));
                }
        p->n_gemm = idx;
    }
out:
    util_free(arena);
    return rc;
}

/* ---- attention: the backend's kernels (cost_profile_opts), causal or not ---- */

/* Each timed call holds enough sequences of a shape for ATTN_CALL_ROWS rows,
 * as the executor's calls hold a micro-batch's: one short sequence alone falls
 * below the kernels' threading threshold and spreads the call's fixed cost
 * over few rows, neither as the executor's calls run (on 2 threads the 9-shape fit
 * was 6.6% rms with one sequence per call, 2.4% with these). */
#define ATTN_CALL_ROWS 1024
#define ATTN_MAX_SEQS 16

cost_profile_attn cost_prof_attn_of(cost_prof_attn_shape s)
{
    return (cost_profile_attn){.seq = s.seq, .heads = s.heads, .kv_heads = s.kv_heads, .head_dim = s.head_dim,
                               .causal = s.causal, .seqs = 1};
}

static int attn_call_seqs(int seq)
{
    int n = (ATTN_CALL_ROWS + seq - 1) / seq;
    return n < 1 ? 1 : n > ATTN_MAX_SEQS ? ATTN_MAX_SEQS : n;
}

typedef struct {
    const cost_profile_opts *o;
    int n, H, Hkv, hd;
    const float *q, *k, *v, *dout;
    float *out, *lse, *dq, *dk, *dv;
    int cu[ATTN_MAX_SEQS + 1], nseq;
    bool causal;
} attn_arg;

static void attn_forward(void *arg)
{
    attn_arg *a = arg;
    a->o->attention_forward(a->out, a->lse, a->q, a->k, a->v, a->cu, a->nseq, a->H, a->Hkv, a->hd, a->causal);
}

static void attn_backward(void *arg)
{
    attn_arg *a = arg;
    a->o->attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out, a->lse, a->cu, a->nseq,
                             a->H, a->Hkv, a->hd, a->causal);
}

/* Buffers: q, k, v, dout, out, dq, dk, dv, lse, one after another. */
static int measure_one_attention(const prof_ctx *c, cost_profile_attn *r, double target, char *err)
{
    int ns = r->seqs = attn_call_seqs(r->seq);
    size_t nq = (size_t)ns * r->seq * r->heads * r->head_dim, nkv = (size_t)ns * r->seq * r->kv_heads * r->head_dim;
    float *buf = util_calloc(4 * nq + 4 * nkv + (size_t)ns * r->seq * r->heads, sizeof *buf);
    int rc = buf ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for attention buffers");
    if ((rc = cost_prof_agree(c, rc, err))) { util_free(buf); return rc; }
    attn_arg a = {c->o, r->seq, r->heads, r->kv_heads, r->head_dim, buf, buf + nq, buf + nq + nkv,
                  buf + nq + 2 * nkv, buf + 2 * nq + 2 * nkv, buf + 4 * nq + 4 * nkv,
                  buf + 3 * nq + 2 * nkv, buf + 4 * nq + 2 * nkv, buf + 4 * nq + 3 * nkv, {0}, ns, r->causal};
    for (int i = 0; i <= ns; i++) a.cu[i] = i * r->seq;
    cost_prof_fill(buf, 2 * nq + 2 * nkv, 3);     /* q, k, v, dout */
    r->fwd_s = alone_time(c, attn_forward, &a, target, 1, 2);
    r->bwd_s = alone_time(c, attn_backward, &a, target * COST_ATTN_BWD_FLOPS, 1, 2);
    r->fwd_s /= ns;
    r->bwd_s /= ns;
    r->fwd_flops = cost_prof_attn_fwd_flops(r);
    util_free(buf);
    return UTIL_OK;
}

/* Head shapes of the tiny-vl ViT (d=8) and LLM (d=16) and the dhp-100m LLM
 * and ViT (d=64, models/zoo), at short and long sequences, so the fit can
 * tell the per-score cost from the per-FLOP cost; the LLMs' shapes causal
 * too, as their layers run (a causal row's fixed costs spread over half the
 * keys). */
static int measure_attention(const prof_ctx *c, cost_profile *p, char *err)
{
    static const cost_prof_attn_shape full[] = {
        {64, 4, 4, 8, false},   {256, 4, 4, 8, false},  {64, 4, 2, 16, false},
        {256, 4, 2, 16, false}, {512, 12, 4, 64, false}, {512, 6, 6, 64, false},
        {64, 4, 2, 16, true},   {256, 4, 2, 16, true},  {512, 12, 4, 64, true}};
    static const cost_prof_attn_shape quick[] = {{64, 4, 4, 8, false}, {128, 4, 2, 16, false},
                                                 {128, 12, 4, 64, false}, {128, 4, 2, 16, true}};
    const cost_prof_attn_shape *shapes = p->quick ? quick : full;
    p->n_attn = p->quick ? 4 : 9;
    /* Passes over all shapes, best per shape (as for the GEMM grid). */
    int passes = p->quick ? 2 : 6;
    for (int pass = 0; pass < passes; pass++)
        for (int i = 0; i < p->n_attn; i++) {
            cost_profile_attn r = cost_prof_attn_of(shapes[i]);
            int rc = measure_one_attention(c, &r, p->quick ? 0.005 : 0.04, err);
            if (rc) return rc;
            if (pass == 0) p->attn[i] = r;
            p->attn[i].fwd_s = fmin(p->attn[i].fwd_s, r.fwd_s);
            p->attn[i].bwd_s = fmin(p->attn[i].bwd_s, r.bwd_s);
        }
    return UTIL_OK;
}

/* ---- memory: the STREAM kernels ---- */

typedef struct { float *a, *b, *c; size_t n; const cost_profile_opts *o; } stream_arg;

static void k_copy(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->c[i] = s->a[i]; }
static void k_scale(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->b[i] = 3.0f * s->c[i]; }
static void k_add(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->c[i] = s->a[i] + s->b[i]; }
static void k_triad(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->a[i] = s->b[i] + 3.0f * s->c[i]; }
/* The backend's y += x (the residual add): 12 B per element */
static void k_add_inplace(void *v) { stream_arg *s = v; s->o->add_inplace(s->c, s->b, s->n); }

static double stream_time(const prof_ctx *c, void (*fn)(void *), stream_arg *s, int trials)
{
    return alone_time(c, fn, s, 0, 1, trials);
}

/* Floats per STREAM array: at least 4x the last-level cache (STREAM's own
 * rule; 32 MiB here), 128 MiB, or 32 MiB when quick. */
static size_t stream_floats(const cost_profile *p) { return p->quick ? (8u << 20) : (32u << 20); }

static int measure_memory(const prof_ctx *c, cost_profile *p, char *err)
{
    size_t n = stream_floats(p);
    stream_arg s = {util_malloc(n * sizeof(float)), util_malloc(n * sizeof(float)), util_malloc(n * sizeof(float)), n, c->o};
    int rc = (s.a && s.b && s.c) ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for STREAM arrays");
    if (!(rc = cost_prof_agree(c, rc, err))) {
        cost_prof_fill(s.a, n, 4); cost_prof_fill(s.b, n, 5); cost_prof_fill(s.c, n, 6);
        int trials = p->quick ? 3 : 6;
        double b = (double)n * sizeof(float);
        p->stream_bytes = b;
        p->copy_bw = 2 * b / stream_time(c, k_copy, &s, trials);
        p->scale_bw = 2 * b / stream_time(c, k_scale, &s, trials);
        p->add_bw = 3 * b / stream_time(c, k_add, &s, trials);
        p->triad_bw = 3 * b / stream_time(c, k_triad, &s, trials);
    }
    util_free(s.a); util_free(s.b); util_free(s.c);
    return rc;
}

/* ---- element-wise kernels one by one, at two sizes (cost_ew_table) ---- */

#define EW_SMALL 24576        /* 96 KiB per array: a kernel's arrays stay in a core's L2 */
#define EW_UNIT (3 * 1024)    /* sizes are multiples of every row length above */


/* mem_eff's inputs, from the table's large size: the residual add, SwiGLU
 * and RMSNorm, and the three together (total bytes / total time). */
static void derive_ew_rates(cost_profile *p)
{
    const cost_ew_table *T = &p->ew;
    p->ew_add_bw = T->bw[COST_EW_ADD][1];
    p->ew_swiglu_bw = T->bw[COST_EW_SWIGLU][1];
    p->ew_rmsnorm_bw = T->bw[COST_EW_RMSNORM][1];
    double ba = cost_ew_accesses(COST_EW_ADD), bs = cost_ew_accesses(COST_EW_SWIGLU), br = cost_ew_accesses(COST_EW_RMSNORM);
    p->ew_bw = (ba + bs + br) / (ba / p->ew_add_bw + bs / p->ew_swiglu_bw + br / p->ew_rmsnorm_bw);
}

typedef struct {
    const cost_profile_opts *o;
    cost_ew k;
    size_t n;
    float *x[5], *w, *db, *rstd, *st, *cs, *sn, *mean, *db2;
    int32_t *targets;
    double sum;           /* sumsq's result, kept */
} ew_arg;

/* One call of kernel a->k over a->n elements, on the arrays the executor would pass. */
static void run_ew(void *v)
{
    ew_arg *a = v;
    const cost_profile_opts *o = a->o;
    float *const *x = a->x;
    int rows = (int)(a->n / EW_ROW), rope_rows = (int)(a->n / (EW_HEADS * EW_HEAD_DIM)), ce_rows = (int)(a->n / EW_VOCAB);
    switch (a->k) {
    case COST_EW_ZERO: o->zero(x[4], a->n); break;
    case COST_EW_COPY: o->copy(x[1], x[0], a->n); break;
    case COST_EW_ADD: o->add_inplace(x[1], x[0], a->n); break;
    case COST_EW_BIAS: o->add_bias(x[1], a->w, rows, EW_ROW); break;
    case COST_EW_BIAS_GRAD: o->linear_backward(NULL, NULL, a->db, x[0], NULL, NULL, rows, 1, EW_ROW); break;
    case COST_EW_RMSNORM: o->rmsnorm_forward(x[1], a->rstd, x[0], a->w, rows, EW_ROW, 1e-6f); break;
    case COST_EW_RMSNORM_BWD: o->rmsnorm_backward(x[2], a->db, x[1], x[0], a->w, a->rstd, rows, EW_ROW); break;
    case COST_EW_ROPE: o->rope_forward(x[0], a->cs, a->sn, rope_rows, EW_HEADS, EW_HEAD_DIM); break;
    case COST_EW_ROPE_BWD: o->rope_backward(x[0], a->cs, a->sn, rope_rows, EW_HEADS, EW_HEAD_DIM); break;
    case COST_EW_SWIGLU: o->swiglu_forward(x[2], x[0], x[1], a->n); break;
    case COST_EW_SWIGLU_BWD: o->swiglu_backward(x[3], x[4], x[2], x[0], x[1], a->n); break;
    case COST_EW_GELU: o->gelu_forward(x[1], x[0], a->n); break;
    case COST_EW_GELU_BWD: o->gelu_backward(x[2], x[1], x[0], a->n); break;
    case COST_EW_CE:
        o->ce_row_max(a->rstd, x[0], ce_rows, EW_VOCAB);
        o->ce_exp_sum(x[1], a->st, x[0], a->rstd, a->targets, ce_rows, EW_VOCAB, 0);
        o->ce_grad(x[1], a->st, a->targets, ce_rows, EW_VOCAB, 0, 1.0f);
        break;
    case COST_EW_SUMSQ: a->sum += o->sumsq(x[0], a->n); break;
    case COST_EW_LAYERNORM: o->layernorm_forward(x[1], a->mean, a->rstd, x[0], a->w, a->w, rows, EW_ROW, 1e-5f); break;
    case COST_EW_LAYERNORM_BWD:
        o->layernorm_backward(x[2], a->db, a->db2, x[1], x[0], a->w, a->mean, a->rstd, rows, EW_ROW);
        break;
    case COST_EW_ATTN_MERGE:   /* rows of 8 heads x 64: part x[0] and its lse x[3] into out x[1], lse x[2] */
        o->attention_merge(x[1], x[2], x[0], x[3], 1, rope_rows, 0, rope_rows, EW_HEADS, EW_HEAD_DIM);
        break;
    case COST_N_EW: break;
    }
}

static bool ew_kernels_given(const cost_profile_opts *o)
{
    return o->zero && o->copy && o->add_inplace && o->add_bias && o->linear_backward && o->rmsnorm_forward
        && o->rmsnorm_backward && o->rope_forward && o->rope_backward && o->swiglu_forward && o->swiglu_backward
        && o->gelu_forward && o->gelu_backward && o->ce_row_max && o->ce_exp_sum && o->ce_grad && o->sumsq
        && o->layernorm_forward && o->layernorm_backward && o->attention_merge;
}

/* Every kernel at EW_SMALL elements (cache-resident) and at the STREAM
 * arrays' size (memory), best of a few passes: a pass in one of the host's
 * slow moments spoils that pass only. */
static int measure_elementwise(const prof_ctx *c, cost_profile *p, char *err)
{
    size_t big = stream_floats(p) / EW_UNIT * EW_UNIT;
    ew_arg a = {.o = c->o, .w = util_malloc(EW_ROW * sizeof(float)), .db = util_malloc(EW_ROW * sizeof(float)),
                .rstd = util_malloc((big / EW_ROW + 1) * sizeof(float)), .st = util_malloc((2 * big / EW_VOCAB + 2) * sizeof(float)),
                .cs = util_malloc(big / EW_HEADS / 2 * sizeof(float)), .sn = util_malloc(big / EW_HEADS / 2 * sizeof(float)),
                .targets = util_malloc((big / EW_VOCAB + 1) * sizeof(int32_t)),
                .mean = util_malloc((big / EW_ROW + 1) * sizeof(float)), .db2 = util_malloc(EW_ROW * sizeof(float))};
    bool ok = a.w && a.db && a.rstd && a.st && a.cs && a.sn && a.targets && a.mean && a.db2;
    for (int i = 0; i < 5; i++) ok = (a.x[i] = util_malloc(big * sizeof(float))) && ok;
    int rc = ok ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for the element-wise arrays");
    if (!(rc = cost_prof_agree(c, rc, err))) {
        for (int i = 0; i < 5; i++) cost_prof_fill(a.x[i], big, 11 + (unsigned)i);
        cost_prof_fill(a.w, EW_ROW, 16);
        /* A rotation, so that RoPE called again and again keeps its values' size (no denormals). */
        for (size_t i = 0; i < big / EW_HEADS / 2; i++) {
            a.cs[i] = (float)cos(0.001 * (double)i);
            a.sn[i] = (float)sin(0.001 * (double)i);
        }
        cost_prof_fill(a.rstd, big / EW_ROW + 1, 17);
        cost_prof_fill(a.mean, big / EW_ROW + 1, 18);
        memset(a.db, 0, EW_ROW * sizeof(float));
        memset(a.db2, 0, EW_ROW * sizeof(float));
        for (size_t r = 0; r <= big / EW_VOCAB; r++) a.targets[r] = (int32_t)(r * 7919 % EW_VOCAB);
        cost_ew_table *T = &p->ew;
        memset(T, 0, sizeof *T);
        T->n = 2;
        T->elements[0] = EW_SMALL;
        T->elements[1] = (double)big;
        for (int pass = 0; pass < ew_passes(p); pass++)
            for (int k = 0; k < COST_N_EW; k++)
                for (int s = 0; s < 2; s++) {
                    a.k = (cost_ew)k;
                    a.n = s ? big : EW_SMALL;
                    /* In-place kernels start from the same values each call; the accumulating ones drift slowly. */
                    double t = s ? alone_time(c, run_ew, &a, 0, 1, 2) : alone_time(c, run_ew, &a, p->quick ? 0.002 : 0.006, 3, 2);
                    double bw = (double)a.n * cost_ew_accesses(a.k) * sizeof(float) / t;
                    if (bw > T->bw[k][s]) T->bw[k][s] = bw;
                }
        derive_ew_rates(p);
    }
    for (int i = 0; i < 5; i++) util_free(a.x[i]);
    util_free(a.w); util_free(a.db); util_free(a.rstd); util_free(a.st); util_free(a.cs); util_free(a.sn); util_free(a.targets);
    util_free(a.mean); util_free(a.db2);
    return rc;
}

/* ---- compute sharing: how ranks on this host slow each other ---- */

/* One unit of executor-like work: a GEMM, an attention forward and a
 * residual add, in the proportions of a small transformer layer. */
typedef struct {
    gemm_arg g;
    attn_arg a;
    stream_arg s;
} mix_arg;

static void run_mix(void *v)
{
    mix_arg *m = v;
    run_gemm(&m->g);
    attn_forward(&m->a);
    k_add_inplace(&m->s);
}

/* Units per second one of ranks 0..k-1 runs, mean over the k, while they
 * all compute in one common window of wall time and the others wait in
 * MPI_Allreduce (polling, as the executor's idle ranks do in MPI_Wait). A
 * fixed window, not fixed work: no rank finishes early and leaves the others
 * the processors.
 *
 * The window is common to the k: rank 0 sends a start time a little ahead
 * (CLOCK_MONOTONIC, one clock for the ranks of a host, and the set is rank
 * 0's host), the busy ranks sleep until it and become runnable together.
 * Were each window opened when its rank first ran after a barrier, it would
 * skip the slices its set-mates ran first and run on after some of them had
 * stopped: the k windows then cover 40 ms plus k-1 first slices of CPU time,
 * and the speeds came out high by that much (four ranks on one CPU read 0.28
 * each, 1.12 in all). A window whose start some busy rank learnt of too late
 * is run again with more lead. */
static double shared_rate(const prof_ctx *c, const cost_profile *p, mix_arg *m, int k, double window_s)
{
    /* busy: the first k ranks of rank 0's processor set */
    int pos = -1;
    for (int r = 0, seen = 0; r <= c->rank && r < p->ranks && r < COST_MAX_SPEED; r++)
        if (p->set_of[r] == 0) { if (r == c->rank) pos = seen; seen++; }
    bool busy = pos >= 0 && pos < k;
    double lead = 0.005;
    for (int tries = 0;; tries++, lead *= 2) {
        cost_prof_barrier(c);
        double start = util_now() + lead, rate = 0, late = 0;
        if (c->mpi) MPI_Bcast(&start, 1, MPI_DOUBLE, 0, c->comm);
        if (busy) {
            late = util_now() > start;
            util_sleep_until(start);
            long units = 0;
            double dt;
            do { run_mix(m); units++; dt = util_now() - start; } while (dt < window_s);
            rate = units / dt;
        }
        cost_prof_max(c, &late);
        if (late && tries < 4) continue;
        if (c->mpi) MPI_Allreduce(MPI_IN_PLACE, &rate, 1, MPI_DOUBLE, MPI_SUM, c->comm);
        return rate / k;
    }
}


/* Median of x[0..n) (n <= SHARING_TRIALS), x reordered. */
static double median(double *x, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j - 1] > x[j]; j--) { double t = x[j]; x[j] = x[j - 1]; x[j - 1] = t; }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static int measure_handoff(const prof_ctx *c, cost_profile *p, mix_arg *m);

static int measure_sharing(const prof_ctx *c, cost_profile *p, char *err)
{
    enum { GM = 256, GN = 256, GK = 64, SEQ = 128, H = 4, D = 16, ADD = 1 << 18 };
    size_t nq = (size_t)SEQ * H * D;
    float *buf = util_calloc((size_t)GM * GK + GN * GK + GM * GN + 5 * nq + SEQ * H + 2 * ADD, sizeof *buf);
    int rc = buf ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for the sharing benchmark");
    if ((rc = cost_prof_agree(c, rc, err))) { util_free(buf); return rc; }
    float *q = buf + (size_t)GM * GK + GN * GK + GM * GN, *add = q + 5 * nq + SEQ * H;
    mix_arg m = {gemm_shape(buf, (size_t)GM * GK + GN * GK + GM * GN, GM, GN, GK),   /* one slot: in cache */
                 {c->o, SEQ, H, H, D, q, q + nq, q + 2 * nq, q + 3 * nq, q + 4 * nq, q + 5 * nq,
                  NULL, NULL, NULL, {0, SEQ}, 1, false},
                 {add, add + ADD, add, ADD, c->o}};
    cost_prof_fill(buf, (size_t)GM * GK + GN * GK, 8);
    cost_prof_fill(q, 4 * nq, 9);
    cost_prof_fill(add, 2 * ADD, 10);
    /* Windows of 40 ms, quick too: many scheduler time slices, so the
     * sharing is seen, not one slice's luck. */
    double unit = alone_time(c, run_mix, &m, 0.02, 3, 2);
    double window = 0.04;
    int n = 0;
    for (int r = 0; r < p->ranks && r < COST_MAX_SPEED; r++) n += p->set_of[r] == 0;
    /* Each trial measures k = 2 .. n in adjacent windows between two windows
     * of k = 1 and keeps the ratios to the mean of those two: adjacent
     * windows see the same state of the host (this VM's speed changes by up
     * to 1.4x every few seconds, which a ratio of rates measured seconds
     * apart would carry), and the one after cancels a drift the one before
     * alone would read as sharing; the median over the trials. */
    double ratio[COST_MAX_SPEED][SHARING_TRIALS], rate[COST_MAX_SPEED + 1];
    int trials = p->quick ? SHARING_TRIALS / 2 : SHARING_TRIALS;
    for (int t = 0; t < trials; t++) {
        for (int k = 1; k <= n; k++) rate[k] = shared_rate(c, p, &m, k, window);
        double alone = 0.5 * (rate[1] + shared_rate(c, p, &m, 1, window));
        for (int k = 2; k <= n; k++) ratio[k - 1][t] = rate[k] / alone;
    }
    p->n_speed = n;
    p->speed[0] = 1.0;
    for (int k = 2; k <= n; k++) p->speed[k - 1] = fmin(1.0, median(ratio[k - 1], trials));
    p->sharing_unit_s = unit;
    rc = measure_handoff(c, p, &m);
    util_free(buf);
    return rc;
}

/* ---- handing a shared processor back ----
 *
 * A rank that waits in MPI polls and yields its processor (the executor's
 * ranks run with mpi_yield_when_idle); a set-mate that computes then keeps
 * it to the end of the scheduler's time slice, which can be milliseconds
 * (on this kind of host, HZ=250 ticks: up to 4 ms). A rank that exchanges
 * every layer (tensor or sequence parallel) loses its processor at nearly
 * every exchange, far more than the even split compute_speed measures.
 * Measured as the executor meets it: rank 0 computes HANDOFF_WORK_S, then a
 * round trip with a rank bound elsewhere, over and over, while rank 0's
 * set-mate computes without a pause, and again while the mate waits too;
 * the difference of the mean round trips is the time the processor takes to
 * come back (cost_pool.handoff_s). */

enum { HANDOFF_PING = 11, HANDOFF_STOP = 12 };

static void spin_for(double s)
{
    double t0 = util_now();
    while (util_now() - t0 < s) {}
}

/* Rank 0's side: exchanges until the window is all but over; returns the
 * mean round trip (0 if none), *n their count. */
static double handoff_pings(const prof_ctx *c, int partner, double until, long *n)
{
    double buf = 0, sum = 0;
    *n = 0;
    while (util_now() < until) {
        spin_for(HANDOFF_WORK_S);
        double t = util_now();
        MPI_Send(&buf, 1, MPI_DOUBLE, partner, HANDOFF_PING, c->comm);
        MPI_Recv(&buf, 1, MPI_DOUBLE, partner, HANDOFF_PING, c->comm, MPI_STATUS_IGNORE);
        sum += util_now() - t;
        ++*n;
    }
    MPI_Send(&buf, 1, MPI_DOUBLE, partner, HANDOFF_STOP, c->comm);
    return *n ? sum / *n : 0;
}

static void handoff_echo(const prof_ctx *c)
{
    for (;;) {
        double buf;
        MPI_Status st;
        MPI_Recv(&buf, 1, MPI_DOUBLE, 0, MPI_ANY_TAG, c->comm, &st);
        if (st.MPI_TAG == HANDOFF_STOP) return;
        MPI_Send(&buf, 1, MPI_DOUBLE, 0, HANDOFF_PING, c->comm);
    }
}

/* One window of window_s, its start sent ahead by rank 0 (as shared_rate's):
 * rank 0's mean round trip, every rank gets it; *n the exchanges. */
static double handoff_window(const prof_ctx *c, const cost_profile *p, mix_arg *m, bool mate_busy, double window_s,
                             long *n)
{
    cost_prof_barrier(c);
    double start = util_now() + 0.005, rtt = 0;
    *n = 0;
    MPI_Bcast(&start, 1, MPI_DOUBLE, 0, c->comm);
    if (c->rank == p->handoff_mate && mate_busy) {
        util_sleep_until(start);
        while (util_now() < start + window_s) run_mix(m);
    } else if (c->rank == 0) {
        util_sleep_until(start + 0.1 * window_s);   /* the mate has the processor */
        rtt = handoff_pings(c, p->handoff_partner, start + 0.9 * window_s, n);
    } else if (c->rank == p->handoff_partner) {
        handoff_echo(c);
    }
    double cnt = (double)*n;
    MPI_Bcast(&rtt, 1, MPI_DOUBLE, 0, c->comm);
    MPI_Bcast(&cnt, 1, MPI_DOUBLE, 0, c->comm);
    *n = (long)cnt;
    return rtt;
}

/* Rank 0's set-mate (the next rank bound to its CPU) and a rank bound to
 * another set; false if the host has no such pair. */
static bool handoff_ranks(cost_profile *p)
{
    p->handoff_mate = p->handoff_partner = -1;
    for (int r = 1; r < p->ranks && r < COST_MAX_SPEED; r++) {
        if (p->set_of[r] == 0 && p->handoff_mate < 0) p->handoff_mate = r;
        if (p->set_of[r] != 0 && p->handoff_partner < 0) p->handoff_partner = r;
    }
    return p->mpi && p->n_sets > 1 && p->handoff_mate > 0 && p->handoff_partner > 0;
}

static int measure_handoff(const prof_ctx *c, cost_profile *p, mix_arg *m)
{
    p->handoff_s = p->handoff_busy_rtt_s = p->handoff_idle_rtt_s = 0;
    p->handoff_exchanges = 0;
    if (!handoff_ranks(p)) return UTIL_OK;
    /* Windows of hundreds of time slices; trials adjacent in time, the median. */
    double window = p->quick ? 0.15 : 0.3, busy[HANDOFF_TRIALS], idle[HANDOFF_TRIALS];
    int trials = p->quick ? 1 : HANDOFF_TRIALS;
    long n;
    for (int t = 0; t < trials; t++) {
        busy[t] = handoff_window(c, p, m, true, window, &n);
        p->handoff_exchanges += (int)n;
        idle[t] = handoff_window(c, p, m, false, 0.25 * window, &n);
    }
    p->handoff_busy_rtt_s = median(busy, trials);
    p->handoff_idle_rtt_s = median(idle, trials);
    p->handoff_s = fmax(0.0, p->handoff_busy_rtt_s - p->handoff_idle_rtt_s);
    return UTIL_OK;
}

/* ---- overlap ----
 * How much of a non-blocking collective concurrent compute hides, as dhp's
 * ZeRO strategies issue them (executor/dp_zero3.c prefetches a unit's
 * MPI_Iallgather, the unit's kernels run, MPI_Wait): every rank starts an
 * all-gather of OVERLAP_BYTES per rank, computes for as long as the
 * all-gather alone takes without any MPI call (as BLAS and the kernels
 * run), then waits. Best of OVERLAP_TRIALS for the slowest rank of each:
 * the collective alone, the compute alone, both; overlap = (collective +
 * compute - both) / collective, within [0, 1] (cost_pool.overlap). */

static double overlap_trial(const prof_ctx *c, const float *send, float *recv, int count, double compute_s, int mode)
{
    cost_prof_barrier(c);
    double t0 = util_now();
    MPI_Request req = MPI_REQUEST_NULL;
    if (mode != 1) MPI_Iallgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, c->comm, &req);
    if (mode != 0) spin_for(compute_s);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
    double t = util_now() - t0;
    cost_prof_max(c, &t);
    return t;
}

static int measure_overlap(const prof_ctx *c, cost_profile *p, char *err)
{
    p->has_overlap = false;
    if (!c->mpi || c->size < 2) return UTIL_OK;
    int count = (int)(OVERLAP_BYTES / sizeof(float));
    float *send = util_calloc_cat(UTIL_MEM_COMM, (size_t)count, sizeof(float));
    float *recv = util_calloc_cat(UTIL_MEM_COMM, (size_t)count * (size_t)c->size, sizeof(float));
    int rc = cost_prof_agree(c, send && recv ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory"), err);
    double best[3] = { INFINITY, INFINITY, INFINITY };   /* collective, compute, both */
    for (int t = 0; !rc && t < OVERLAP_TRIALS; t++) {
        double coll = overlap_trial(c, send, recv, count, 0, 0);
        if (coll < best[0]) best[0] = coll;
        for (int mode = 1; mode <= 2; mode++) {
            double v = overlap_trial(c, send, recv, count, best[0], mode);
            if (v < best[mode]) best[mode] = v;
        }
    }
    if (!rc) {
        p->overlap_coll_s = best[0];
        p->overlap_compute_s = best[1];
        p->overlap_both_s = best[2];
        double hidden = (best[0] + best[1] - best[2]) / best[0];
        p->overlap = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;
        p->has_overlap = true;
    }
    util_free(send);
    util_free(recv);
    return rc;
}

int cost_prof_init_mpi(prof_ctx *c, bool *we_init, char *err)
{
    int inited = 0;
    MPI_Initialized(&inited);
    *we_init = false;
    if (!inited) {
        if (!launched_by_mpirun()) return UTIL_OK;
        if (MPI_Init(NULL, NULL) != MPI_SUCCESS) return util_fail(err, UTIL_ERUNTIME, "profile: MPI_Init failed");
        *we_init = true;
    }
    c->mpi = true;
    c->comm = MPI_COMM_WORLD;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    MPI_Comm local;
    int local_size = 0;
    if (MPI_Comm_split_type(c->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_size(local, &local_size);
        MPI_Comm_free(&local);
    }
    if (local_size != c->size)
        return util_fail(err, UTIL_EINVAL, "profile: measures one host; %d of the %d ranks share this one (run all ranks on one node)",
                         local_size, c->size);
    return UTIL_OK;
}

/* Rank 0's host facts for everybody (the date string and memory in use may differ by rank). */
void cost_prof_share_host_facts(const prof_ctx *c, cost_profile *p)
{
    if (!c->mpi) return;
    MPI_Bcast(p->host, sizeof p->host, MPI_CHAR, 0, c->comm);
    MPI_Bcast(p->date, sizeof p->date, MPI_CHAR, 0, c->comm);
    double d[3] = {p->cpu_hz, p->phys_bytes, p->used_bytes};
    MPI_Bcast(d, 3, MPI_DOUBLE, 0, c->comm);
    p->cpu_hz = d[0]; p->phys_bytes = d[1]; p->used_bytes = d[2];
    int b = p->used_from_meminfo;
    MPI_Bcast(&b, 1, MPI_INT, 0, c->comm);
    p->used_from_meminfo = b;
}

/* The CPU this process is bound to, -1 when it may run on several. */
static int bound_cpu(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1) return -1;
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &set)) return i;
    return -1;
}

/* Ranks bound to the same CPU (mpirun --bind-to core) share it; unbound
 * ranks share all of the host's. set_of[r] = the lowest rank of r's set. */
static void find_sets(const prof_ctx *c, cost_profile *p)
{
    int n = p->ranks < COST_MAX_SPEED ? p->ranks : COST_MAX_SPEED, cpu[COST_MAX_SPEED], mine = bound_cpu();
    if (c->mpi && c->size <= COST_MAX_SPEED) MPI_Allgather(&mine, 1, MPI_INT, cpu, 1, MPI_INT, c->comm);
    else for (int r = 0; r < n; r++) cpu[r] = -1;
    p->n_sets = 0;
    for (int r = 0; r < n; r++) {
        p->set_of[r] = r;
        for (int q = 0; q < r; q++)
            if (cpu[q] == cpu[r]) { p->set_of[r] = q; break; }
        if (p->set_of[r] == r) p->n_sets++;
        p->bound_cpu[r] = cpu[r];
    }
}

int cost_profile_measure(const cost_profile_opts *o, cost_profile *p, char *err)
{
    memset(p, 0, sizeof *p);
    if (!o || !o->attention_forward || !o->attention_backward || !ew_kernels_given(o))
        return util_fail(err, UTIL_EINVAL, "profile: the backend's attention and element-wise kernels are required (cost_profile_opts)");
    p->quick = o->quick;
    prof_ctx c = {false, MPI_COMM_NULL, 0, 1, o};
    bool we_init;
    int rc = cost_prof_init_mpi(&c, &we_init, err);
    if (!rc) {
        p->rank = c.rank;
        p->ranks = c.size;
        p->mpi = c.mpi && c.size > 1;
        cost_prof_barrier(&c);
        host_facts(p);
        cost_prof_share_host_facts(&c, p);
        find_sets(&c, p);
        if (!(rc = measure_gemm(&c, p, err)) && !(rc = measure_attention(&c, p, err)) && !(rc = measure_memory(&c, p, err))
            && !(rc = measure_elementwise(&c, p, err)))
            rc = cost_prof_measure_collectives(&c, p, err);
        if (!rc) rc = measure_overlap(&c, p, err);
        if (!rc) rc = measure_sharing(&c, p, err);
        if (!rc) rc = cost_prof_derive(p, err);
    }
    if (we_init) MPI_Finalize();
    return rc;
}
