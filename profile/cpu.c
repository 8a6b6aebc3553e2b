/* dhp profile on the CPU backend: one rank of this host described in the
 * dhp.gpu/1 format, the ranks of this host as a one-node dhp.cluster/1
 * file. The executor's kernels are timed through the backend table (GEMMs
 * are its linear_forward, cblas_sgemm); the STREAM loops are the profile's
 * own. The rules that turn measurements into cost-model fields are in
 * costdb/SCHEMA.md ("Measured files") and in each field's source string. */
#include "profile/profile_int.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

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

static void host_facts(cost_profile *p)
{
    prof_host_id(p);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    p->cpus = cpus > 0 ? (int)cpus : 1;
    p->blas_threads = openblas_get_num_threads();
    if (p->blas_threads < 1) p->blas_threads = 1;
    p->cpu_hz = cpu_clock_hz();
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    p->phys_bytes = pages > 0 && psize > 0 ? (double)pages * (double)psize : 0;
    p->used_bytes = memory_in_use(&p->used_from_meminfo);
}

/* ---- GEMM grid: the tiny / 100M models' linears (m: tokens; n, k: widths) ---- */

static int measure_gemm(const prof_ctx *c, cost_profile *p, char *err)
{
    static const int m_full[] = {64, 256, 1024, 4096}, nk_full[] = {32, 64, 128, 512, 2048};
    static const int m_quick[] = {64, 256, 1024}, nk_quick[] = {32, 256, 1024};
    prof_gemm_grid g = {p->quick ? m_quick : m_full, p->quick ? 3 : 4, p->quick ? nk_quick : nk_full, p->quick ? 3 : 5,
                        p->quick ? 0.003 : 0.015, cost_prof_gemm_passes(p), COST_PROF_GEMM_BATCHES, false};
    return prof_measure_gemm(c, p, &g, err);
}

/* ---- attention: a micro-batch's rows per call ---- */

/* Each timed call holds enough sequences of a shape for ATTN_CALL_ROWS rows,
 * as the executor's calls hold a micro-batch's: one short sequence alone falls
 * below the kernels' threading threshold and spreads the call's fixed cost
 * over few rows, neither as the executor's calls run (on 2 threads the 9-shape fit
 * was 6.6% rms with one sequence per call, 2.4% with these). */
#define ATTN_CALL_ROWS 1024

/* prof_measure_attention caps it (16 sequences: 16 x 64 tokens) */
static int attn_call_seqs(int seq) { return (ATTN_CALL_ROWS + seq - 1) / seq; }

/* Head shapes of the tiny-vl ViT (d=8) and LLM (d=16) and the dhp-100m LLM
 * and ViT (d=64, models/zoo), at short and long sequences, so the fit can
 * tell the per-score cost from the per-FLOP cost; the LLMs' shapes causal
 * too, as their layers run (a causal row's fixed costs spread over half the
 * keys). Passes over all shapes, best per shape. */
static int measure_attention(const prof_ctx *c, cost_profile *p, char *err)
{
    static const prof_attn_shape full[] = {
        {64, 4, 4, 8, false},   {256, 4, 4, 8, false},  {64, 4, 2, 16, false},
        {256, 4, 2, 16, false}, {512, 12, 4, 64, false}, {512, 6, 6, 64, false},
        {64, 4, 2, 16, true},   {256, 4, 2, 16, true},  {512, 12, 4, 64, true}};
    static const prof_attn_shape quick[] = {{64, 4, 4, 8, false}, {128, 4, 2, 16, false},
                                            {128, 12, 4, 64, false}, {128, 4, 2, 16, true}};
    return prof_measure_attention(c, p, p->quick ? quick : full, p->quick ? 4 : 9, p->quick ? 2 : 6,
                                  p->quick ? 0.005 : 0.04, attn_call_seqs, err);
}

/* ---- memory: the STREAM kernels ---- */

typedef struct { float *a, *b, *c; size_t n; } stream_arg;

static void k_copy(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->c[i] = s->a[i]; }
static void k_scale(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->b[i] = 3.0f * s->c[i]; }
static void k_add(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->c[i] = s->a[i] + s->b[i]; }
static void k_triad(void *v) { stream_arg *s = v; for (size_t i = 0; i < s->n; i++) s->a[i] = s->b[i] + 3.0f * s->c[i]; }
/* prof_alone_time's seconds; a failure is kept in *rc (the first) and reads as 1 s. */
static double alone(const prof_ctx *c, void (*fn)(void *), void *arg, double target_s, int min_calls, int trials, int *rc,
                    char *err)
{
    double t = 1;
    if (!*rc) *rc = prof_alone_time(c, fn, arg, target_s, min_calls, trials, &t, err);
    return *rc ? 1 : t;
}

/* Floats per STREAM array: at least 4x the last-level cache (STREAM's own
 * rule; 32 MiB here), 128 MiB, or 32 MiB when quick. */
static size_t stream_floats(const cost_profile *p) { return p->quick ? (8u << 20) : (32u << 20); }

static int measure_memory(const prof_ctx *c, cost_profile *p, char *err)
{
    size_t n = stream_floats(p);
    stream_arg s = {util_malloc(n * sizeof(float)), util_malloc(n * sizeof(float)), util_malloc(n * sizeof(float)), n};
    int rc = (s.a && s.b && s.c) ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for STREAM arrays");
    if (!(rc = prof_agree(c, rc, err))) {
        prof_fill(s.a, n, 4); prof_fill(s.b, n, 5); prof_fill(s.c, n, 6);
        int trials = p->quick ? 3 : 6;
        double b = (double)n * sizeof(float);
        p->stream_bytes = b;
        p->copy_bw = 2 * b / alone(c, k_copy, &s, 0, 1, trials, &rc, err);
        p->scale_bw = 2 * b / alone(c, k_scale, &s, 0, 1, trials, &rc, err);
        p->add_bw = 3 * b / alone(c, k_add, &s, 0, 1, trials, &rc, err);
        p->triad_bw = 3 * b / alone(c, k_triad, &s, 0, 1, trials, &rc, err);
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
    const ex_backend *be;
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
    const ex_backend *o = a->be;
    float *const *x = a->x;
    int rows = (int)(a->n / COST_PROF_EW_ROW), rope_rows = (int)(a->n / (COST_PROF_EW_HEADS * COST_PROF_EW_HEAD_DIM)), ce_rows = (int)(a->n / COST_PROF_EW_VOCAB);
    switch (a->k) {
    case COST_EW_ZERO: o->zero(x[4], a->n); break;
    case COST_EW_COPY: o->copy(x[1], x[0], a->n); break;
    case COST_EW_ADD: o->add_inplace(x[1], x[0], a->n); break;
    case COST_EW_BIAS: o->add_bias(x[1], a->w, rows, COST_PROF_EW_ROW); break;
    case COST_EW_BIAS_GRAD: o->linear_backward(NULL, NULL, a->db, x[0], NULL, NULL, rows, 1, COST_PROF_EW_ROW); break;
    case COST_EW_RMSNORM: o->rmsnorm_forward(x[1], a->rstd, x[0], a->w, rows, COST_PROF_EW_ROW, 1e-6f); break;
    case COST_EW_RMSNORM_BWD: o->rmsnorm_backward(x[2], a->db, x[1], x[0], a->w, a->rstd, rows, COST_PROF_EW_ROW); break;
    case COST_EW_ROPE: o->rope_forward(x[0], a->cs, a->sn, rope_rows, COST_PROF_EW_HEADS, COST_PROF_EW_HEAD_DIM); break;
    case COST_EW_ROPE_BWD: o->rope_backward(x[0], a->cs, a->sn, rope_rows, COST_PROF_EW_HEADS, COST_PROF_EW_HEAD_DIM); break;
    case COST_EW_SWIGLU: o->swiglu_forward(x[2], x[0], x[1], a->n); break;
    case COST_EW_SWIGLU_BWD: o->swiglu_backward(x[3], x[4], x[2], x[0], x[1], a->n); break;
    case COST_EW_GELU: o->gelu_forward(x[1], x[0], a->n); break;
    case COST_EW_GELU_BWD: o->gelu_backward(x[2], x[1], x[0], a->n); break;
    case COST_EW_CE:
        o->ce_row_max(a->rstd, x[0], ce_rows, COST_PROF_EW_VOCAB);
        o->ce_exp_sum(x[1], a->st, x[0], a->rstd, a->targets, ce_rows, COST_PROF_EW_VOCAB, 0);
        o->ce_grad(x[1], a->st, a->targets, ce_rows, COST_PROF_EW_VOCAB, 0, 1.0f);
        break;
    case COST_EW_SUMSQ: a->sum += o->sumsq(x[0], a->n); break;
    case COST_EW_LAYERNORM: o->layernorm_forward(x[1], a->mean, a->rstd, x[0], a->w, a->w, rows, COST_PROF_EW_ROW, 1e-5f); break;
    case COST_EW_LAYERNORM_BWD:
        o->layernorm_backward(x[2], a->db, a->db2, x[1], x[0], a->w, a->mean, a->rstd, rows, COST_PROF_EW_ROW);
        break;
    case COST_EW_ATTN_MERGE:   /* rows of 8 heads x 64: part x[0] and its lse x[3] into out x[1], lse x[2] */
        o->attention_merge(x[1], x[2], x[0], x[3], 1, rope_rows, 0, rope_rows, COST_PROF_EW_HEADS, COST_PROF_EW_HEAD_DIM);
        break;
    case COST_N_EW: break;
    }
}

/* Every kernel at EW_SMALL elements (cache-resident) and at the STREAM
 * arrays' size (memory), best of a few passes: a pass in one of the host's
 * slow moments spoils that pass only. */
static int measure_elementwise(const prof_ctx *c, cost_profile *p, char *err)
{
    size_t big = stream_floats(p) / EW_UNIT * EW_UNIT;
    ew_arg a = {.be = c->be, .w = util_malloc(COST_PROF_EW_ROW * sizeof(float)), .db = util_malloc(COST_PROF_EW_ROW * sizeof(float)),
                .rstd = util_malloc((big / COST_PROF_EW_ROW + 1) * sizeof(float)), .st = util_malloc((2 * big / COST_PROF_EW_VOCAB + 2) * sizeof(float)),
                .cs = util_malloc(big / COST_PROF_EW_HEADS / 2 * sizeof(float)), .sn = util_malloc(big / COST_PROF_EW_HEADS / 2 * sizeof(float)),
                .targets = util_malloc((big / COST_PROF_EW_VOCAB + 1) * sizeof(int32_t)),
                .mean = util_malloc((big / COST_PROF_EW_ROW + 1) * sizeof(float)), .db2 = util_malloc(COST_PROF_EW_ROW * sizeof(float))};
    bool ok = a.w && a.db && a.rstd && a.st && a.cs && a.sn && a.targets && a.mean && a.db2;
    for (int i = 0; i < 5; i++) ok = (a.x[i] = util_malloc(big * sizeof(float))) && ok;
    int rc = ok ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "profile: out of memory for the element-wise arrays");
    if (!(rc = prof_agree(c, rc, err))) {
        for (int i = 0; i < 5; i++) prof_fill(a.x[i], big, 11 + (unsigned)i);
        prof_fill(a.w, COST_PROF_EW_ROW, 16);
        /* A rotation, so that RoPE called again and again keeps its values' size (no denormals). */
        for (size_t i = 0; i < big / COST_PROF_EW_HEADS / 2; i++) {
            a.cs[i] = (float)cos(0.001 * (double)i);
            a.sn[i] = (float)sin(0.001 * (double)i);
        }
        prof_fill(a.rstd, big / COST_PROF_EW_ROW + 1, 17);
        prof_fill(a.mean, big / COST_PROF_EW_ROW + 1, 18);
        memset(a.db, 0, COST_PROF_EW_ROW * sizeof(float));
        memset(a.db2, 0, COST_PROF_EW_ROW * sizeof(float));
        for (size_t r = 0; r <= big / COST_PROF_EW_VOCAB; r++) a.targets[r] = (int32_t)(r * 7919 % COST_PROF_EW_VOCAB);
        cost_ew_table *T = &p->ew;
        memset(T, 0, sizeof *T);
        T->n = 2;
        T->elements[0] = EW_SMALL;
        T->elements[1] = (double)big;
        for (int pass = 0; pass < cost_prof_ew_passes(p); pass++)
            for (int k = 0; k < COST_N_EW; k++)
                for (int s = 0; s < 2; s++) {
                    a.k = (cost_ew)k;
                    a.n = s ? big : EW_SMALL;
                    /* In-place kernels start from the same values each call; the accumulating ones drift slowly. */
                    double t = s ? alone(c, run_ew, &a, 0, 1, 2, &rc, err) : alone(c, run_ew, &a, p->quick ? 0.002 : 0.006, 3, 2, &rc, err);
                    double bw = (double)a.n * cost_ew_accesses(a.k) * sizeof(float) / t;
                    if (bw > T->bw[k][s]) T->bw[k][s] = bw;
                }
        if (!rc) derive_ew_rates(p);
    }
    for (int i = 0; i < 5; i++) util_free(a.x[i]);
    util_free(a.w); util_free(a.db); util_free(a.rstd); util_free(a.st); util_free(a.cs); util_free(a.sn); util_free(a.targets);
    util_free(a.mean); util_free(a.db2);
    return rc;
}

int prof_measure_cpu(const prof_opts *o, cost_profile *p, char *err)
{
    prof_ctx c = {false, MPI_COMM_NULL, 0, 1, o, o->be, NULL};
    int rc = prof_init_mpi(&c, EX_COMM_MPI, err);
    if (!rc) {
        p->rank = c.rank;
        p->ranks = c.size;
        p->mpi = c.mpi && c.size > 1;
        prof_barrier(&c);
        host_facts(p);
        prof_share_host_facts(&c, p);
        prof_find_sets(&c, p);
        if (!(rc = measure_gemm(&c, p, err)) && !(rc = measure_attention(&c, p, err)) && !(rc = measure_memory(&c, p, err))
            && !(rc = measure_elementwise(&c, p, err)))
            rc = prof_measure_collectives(&c, p, err);
        if (!rc) rc = prof_measure_overlap(&c, p, err);
        if (!rc) rc = prof_measure_sharing(&c, p, err);
        if (!rc) rc = cost_prof_derive(p, err);
    }
    prof_close(&c);
    return rc;
}
