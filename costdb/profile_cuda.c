/* dhp profile --backend cuda: measure this host's GPUs the way
 * costdb/profile.c measures its CPU ranks, into the same dhp.gpu/1 and
 * dhp.cluster/1 files: cuBLAS GEMMs over transformer shapes, the CUDA
 * backend's own attention and element-wise kernels (passed in by the CLI;
 * costdb cannot link the executor), device-to-device copies, the launch
 * cost, device memory, and NCCL collectives between the ranks' GPUs. Every
 * kernel is timed with CUDA events on the default stream, on rank 0 while
 * the other ranks wait (each rank has a GPU of its own, so nothing is
 * shared; the collectives run on all). The rules that turn the
 * measurements into fields are cost_prof_derive's (costdb/profile.c) and
 * costdb/SCHEMA.md, "Measured files". */
#include "costdb/costdb.h"
#include "costdb/profile_internal.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#ifndef DHP_CUDA

int cost_profile_measure_cuda(const cost_profile_opts *o, cost_profile *p, char *err)
{
    (void)o;
    memset(p, 0, sizeof *p);
    return util_fail(err, UTIL_EUNSUPPORTED, "profile: this dhp was built without CUDA (no nvcc at build time)");
}

#else

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

typedef struct {
    const prof_ctx *c;
    const cost_profile_opts *o;
    cublasHandle_t blas;
    bool has_blas;
    ncclComm_t nccl;
    bool has_nccl;
    cudaEvent_t t0, t1;
    bool has_events;
} gpu_ctx;

static int cuda_fail(char *err, cudaError_t e, const char *what)
{
    return util_fail(err, UTIL_ERUNTIME, "profile: %s: %s", what, cudaGetErrorString(e));
}

#define CUDA_TRY(call, what) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return cuda_fail(err, e_, what); } while (0)

static const char *cublas_text(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "not supported by this GPU";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

/* ---- timing with CUDA events ---- */

typedef struct {
    void (*fn)(void *);
    void *arg;
    int *status;        /* the callee's first failure (cuBLAS, NCCL), 0 = none; may be NULL */
    const char *what;   /* names the call in errors */
} timed_call;

/* Seconds of one batch of `reps` calls between two events. */
static int event_batch(gpu_ctx *g, const timed_call *tc, int reps, double *s, char *err)
{
    CUDA_TRY(cudaEventRecord(g->t0, 0), "cudaEventRecord");
    for (int r = 0; r < reps; r++) tc->fn(tc->arg);
    CUDA_TRY(cudaEventRecord(g->t1, 0), "cudaEventRecord");
    CUDA_TRY(cudaEventSynchronize(g->t1), "waiting for the timed kernels");
    float ms = 0;
    CUDA_TRY(cudaEventElapsedTime(&ms, g->t0, g->t1), "cudaEventElapsedTime");
    *s = ms * 1e-3;
    return UTIL_OK;
}

/* Best seconds per call over `trials` batches; a batch's call count is set
 * from one timed call so that the batches together take about target_s.
 * One warm-up call first (cuBLAS heuristics, lazy module loading). */
static int time_on_device(gpu_ctx *g, const timed_call *tc, double target_s, int trials, double *best, char *err)
{
    double one;
    tc->fn(tc->arg);
    int rc = event_batch(g, tc, 1, &one, err);
    if (rc) return rc;
    double want = target_s / trials / (one > 1e-7 ? one : 1e-7);
    int reps = want < 1 ? 1 : want > 20000 ? 20000 : (int)want;
    *best = INFINITY;
    for (int t = 0; t < trials; t++) {
        double s;
        if ((rc = event_batch(g, tc, reps, &s, err))) return rc;
        if (s / reps < *best) *best = s / reps;
    }
    if (tc->status && *tc->status)
        return util_fail(err, UTIL_ERUNTIME, "profile: %s failed (status %d)", tc->what, *tc->status);
    return g->o->sync(err);
}

/* Rank 0 times; the others wait in MPI_Barrier; everybody gets the figure. */
static int alone_on_device(gpu_ctx *g, const timed_call *tc, double target_s, int trials, double *best, char *err)
{
    cost_prof_barrier(g->c);
    int rc = UTIL_OK;
    *best = 0;
    if (g->c->rank == 0) rc = time_on_device(g, tc, target_s, trials, best, err);
    if ((rc = cost_prof_agree(g->c, rc, err))) return rc;
    cost_prof_max(g->c, best);
    return UTIL_OK;
}

/* ---- device buffers ---- */

static int device_alloc(void **d, size_t bytes, char *err)
{
    *d = NULL;
    CUDA_TRY(cudaMalloc(d, bytes), "cudaMalloc");
    return UTIL_OK;
}

/* BF16 of x, rounded to nearest even (finite inputs). */
static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* n deterministic values (cost_prof_fill) on the device, fp32 or bf16. */
static int device_fill(void *d, size_t n, bool bf16, unsigned seed, char *err)
{
    const size_t chunk = 1u << 20;
    float *h = util_malloc(chunk * sizeof *h);
    uint16_t *hb = bf16 ? util_malloc(chunk * sizeof *hb) : NULL;
    if (!h || (bf16 && !hb)) { util_free(h); util_free(hb); return util_fail(err, UTIL_ENOMEM, "profile: out of host memory"); }
    int rc = UTIL_OK;
    for (size_t at = 0; at < n && !rc; at += chunk) {
        size_t m = n - at < chunk ? n - at : chunk;
        cost_prof_fill(h, m, seed + (unsigned)(at / chunk));
        cudaError_t e;
        if (bf16) {
            for (size_t i = 0; i < m; i++) hb[i] = to_bf16(h[i]);
            e = cudaMemcpy((uint16_t *)d + at, hb, m * sizeof *hb, cudaMemcpyHostToDevice);
        } else {
            e = cudaMemcpy((float *)d + at, h, m * sizeof *h, cudaMemcpyHostToDevice);
        }
        if (e != cudaSuccess) rc = cuda_fail(err, e, "copying to the device");
    }
    util_free(h);
    util_free(hb);
    return rc;
}

/* ---- the device ---- */

static int device_facts(gpu_ctx *g, cost_profile *p, char *err)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return util_fail(err, UTIL_ERUNTIME, "profile: no CUDA device: %s", cudaGetErrorString(e));
    if (count < 1) return util_fail(err, UTIL_ERUNTIME, "profile: no CUDA device");
    if (g->c->size > count)
        return util_fail(err, UTIL_EINVAL, "profile: %d ranks but %d GPU%s on this host (one rank per GPU)", g->c->size, count,
                         count > 1 ? "s" : "");
    int dev = g->c->rank;
    CUDA_TRY(cudaSetDevice(dev), "cudaSetDevice");
    struct cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    cost_profile_device *d = &p->dev;
    util_strlcpy(d->name, prop.name, sizeof d->name);
    d->cc_major = prop.major;
    d->cc_minor = prop.minor;
    d->sms = prop.multiProcessorCount;
    d->devices = count;
    int khz = 0, mem_khz = 0, bus = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev) != cudaSuccess) khz = 0;
    if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess) mem_khz = 0;
    if (cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) bus = 0;
    d->clock_hz = khz * 1e3;
    d->mem_clock_hz = mem_khz * 1e3;
    d->bus_bits = bus;
    if (cudaRuntimeGetVersion(&d->runtime_version) != cudaSuccess) d->runtime_version = 0;
    if (cudaDriverGetVersion(&d->driver_version) != cudaSuccess) d->driver_version = 0;
    if (ncclGetVersion(&d->nccl_version) != ncclSuccess) d->nccl_version = 0;
    d->gemm_fp32 = g->o->gemm_fp32;
    return UTIL_OK;
}

/* Device memory in use once the context, cuBLAS and NCCL exist: what the
 * runtime keeps from tensors (and what other processes hold). */
static int device_memory(cost_profile *p, char *err)
{
    size_t free_b = 0, total_b = 0;
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    p->phys_bytes = (double)total_b;
    p->used_bytes = (double)(total_b - free_b);
    p->used_from_meminfo = true;
    return UTIL_OK;
}

/* ---- GEMM: C[m,n] = A[m,k] B[n,k]^T (the executor's linear forward) ---- */

typedef struct {
    gpu_ctx *g;
    int m, n, k;
    bool fp32;
    const void *A, *B;
    void *C;
    int status;
} gemm_arg;

/* Row-major C = A B^T is column-major C^T = B A^T: B (stored k x n column-major) transposed, A as is. */
static void run_gemm(void *v)
{
    gemm_arg *a = v;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s;
    if (a->fp32)
        s = cublasSgemm(a->g->blas, CUBLAS_OP_T, CUBLAS_OP_N, a->n, a->m, a->k, &one, a->B, a->k, a->A, a->k, &zero,
                        a->C, a->n);
    else
        s = cublasGemmEx(a->g->blas, CUBLAS_OP_T, CUBLAS_OP_N, a->n, a->m, a->k, &one, a->B, CUDA_R_16BF, a->k, a->A,
                         CUDA_R_16BF, a->k, &zero, a->C, CUDA_R_16BF, a->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS && !a->status) a->status = (int)s;
}

static int measure_gemm(gpu_ctx *g, cost_profile *p, char *err)
{
    /* m: tokens of a micro-batch; n, k: hidden and FFN sizes of 1B-72B models. */
    static const int m_full[] = {1024, 4096, 16384}, nk_full[] = {1024, 4096, 8192, 16384};
    static const int m_quick[] = {1024, 8192}, nk_quick[] = {2048, 8192};
    const int *ms = p->quick ? m_quick : m_full, *nks = p->quick ? nk_quick : nk_full;
    int nm = p->quick ? 2 : 3, nnk = p->quick ? 2 : 4;
    bool fp32 = g->o->gemm_fp32;
    size_t el = fp32 ? 4 : 2, mmax = (size_t)ms[nm - 1], nkmax = (size_t)nks[nnk - 1];
    void *A = NULL, *B = NULL, *C = NULL;
    int rc = device_alloc(&A, mmax * nkmax * el, err);
    if (!rc) rc = device_alloc(&B, nkmax * nkmax * el, err);
    if (!rc) rc = device_alloc(&C, mmax * nkmax * el, err);
    if (!rc) rc = device_fill(A, mmax * nkmax, !fp32, 1, err);
    if (!rc) rc = device_fill(B, nkmax * nkmax, !fp32, 2, err);
    if ((rc = cost_prof_agree(g->c, rc, err))) goto out;
    int passes = p->quick ? 1 : 2, idx = 0;
    for (int pass = 0; pass < passes && !rc; pass++) {
        idx = 0;
        for (int i = 0; i < nm && !rc; i++)
            for (int j = 0; j < nnk && !rc; j++)
                for (int l = 0; l < nnk && !rc && idx < COST_PROFILE_MAX_GEMM; l++, idx++) {
                    gemm_arg a = {g, ms[i], nks[j], nks[l], fp32, A, B, C, 0};
                    timed_call tc = {run_gemm, &a, &a.status, fp32 ? "cublasSgemm" : "cublasGemmEx"};
                    double t;
                    rc = alone_on_device(g, &tc, p->quick ? 0.01 : 0.05, 2, &t, err);
                    if (!rc) cost_prof_keep_gemm(p, idx, pass, a.m, a.n, a.k, t);
                }
    }
    p->n_gemm = idx;
out:
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    return rc;
}

/* ---- launch cost: back-to-back launches of a one-element kernel ---- */

typedef struct { const cost_profile_opts *o; float *y; const float *x; size_t n; } ew_arg;

static void run_add(void *v) { ew_arg *a = v; a->o->add_inplace(a->y, a->x, a->n); }

static int measure_launch(gpu_ctx *g, cost_profile *p, char *err)
{
    void *buf = NULL;
    int rc = device_alloc(&buf, 2 * sizeof(float), err);
    if (!rc) CUDA_TRY(cudaMemset(buf, 0, 2 * sizeof(float)), "cudaMemset");
    if ((rc = cost_prof_agree(g->c, rc, err))) { cudaFree(buf); return rc; }
    ew_arg a = {g->o, buf, (float *)buf + 1, 1};
    timed_call tc = {run_add, &a, NULL, "add_inplace"};
    rc = alone_on_device(g, &tc, p->quick ? 0.01 : 0.05, 3, &p->launch_s, err);
    cudaFree(buf);
    return rc;
}

/* ---- attention: the backend's kernels, one sequence, causal or not ---- */

typedef struct {
    const cost_profile_opts *o;
    int n, H, Hkv, hd;
    const float *q, *k, *v, *dout;
    float *out, *lse, *dq, *dk, *dv;
    int *cu;            /* device: {0, n} */
    bool causal;
} attn_arg;

static void attn_forward(void *v)
{
    attn_arg *a = v;
    a->o->attention_forward(a->out, a->lse, a->q, a->k, a->v, a->cu, 1, a->H, a->Hkv, a->hd, a->causal);
}

static void attn_backward(void *v)
{
    attn_arg *a = v;
    a->o->attention_backward(a->dq, a->dk, a->dv, a->dout, a->q, a->k, a->v, a->out, a->lse, a->cu, 1, a->H, a->Hkv,
                             a->hd, a->causal);
}

static int measure_one_attention(gpu_ctx *g, cost_profile_attn *r, double target, char *err)
{
    size_t nq = (size_t)r->seq * r->heads * r->head_dim, nkv = (size_t)r->seq * r->kv_heads * r->head_dim;
    size_t total = 4 * nq + 4 * nkv + (size_t)r->seq * r->heads;
    float *buf = NULL;
    int *cu = NULL;
    int rc = device_alloc((void **)&buf, total * sizeof *buf, err);
    if (!rc) rc = device_alloc((void **)&cu, 2 * sizeof *cu, err);
    if (!rc) rc = device_fill(buf, 2 * nq + 2 * nkv, false, 3, err);   /* q, k, v, dout */
    if (!rc) {
        int h[2] = {0, r->seq};
        cudaError_t e = cudaMemcpy(cu, h, sizeof h, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemset(buf + 2 * nq + 2 * nkv, 0, (total - 2 * nq - 2 * nkv) * sizeof *buf);
        if (e != cudaSuccess) rc = cuda_fail(err, e, "preparing the attention buffers");
    }
    if (!(rc = cost_prof_agree(g->c, rc, err))) {
        attn_arg a = {g->o, r->seq, r->heads, r->kv_heads, r->head_dim, buf, buf + nq, buf + nq + nkv,
                      buf + nq + 2 * nkv, buf + 2 * nq + 2 * nkv, buf + 4 * nq + 4 * nkv, buf + 3 * nq + 2 * nkv,
                      buf + 4 * nq + 2 * nkv, buf + 4 * nq + 3 * nkv, cu, r->causal};
        timed_call f = {attn_forward, &a, NULL, "attention_forward"}, b = {attn_backward, &a, NULL, "attention_backward"};
        rc = alone_on_device(g, &f, target, 2, &r->fwd_s, err);
        if (!rc) rc = alone_on_device(g, &b, target * COST_ATTN_BWD_FLOPS, 2, &r->bwd_s, err);
        r->fwd_flops = cost_prof_attn_fwd_flops(r);
    }
    cudaFree(buf);
    cudaFree(cu);
    return rc;
}

/* Head shapes of Qwen2.5-VL's ViT (d=80) and 32B LLM (d=128, GQA 40/8) and a
 * d=64 model, at two lengths, so the fit can tell per-score from per-FLOP
 * cost; the LLM shapes causal too, as LLM layers run. */
static int measure_attention(gpu_ctx *g, cost_profile *p, char *err)
{
    static const cost_prof_attn_shape full[] = {
        {1024, 16, 16, 80, false}, {4096, 16, 16, 80, false}, {1024, 40, 8, 128, false},
        {4096, 40, 8, 128, false}, {2048, 16, 16, 64, false}, {2048, 32, 8, 64, false},
        {1024, 40, 8, 128, true},  {4096, 40, 8, 128, true},  {2048, 32, 8, 64, true}};
    static const cost_prof_attn_shape quick[] = {{1024, 16, 16, 80, false}, {1024, 40, 8, 128, false},
                                                 {2048, 16, 16, 64, false}, {1024, 40, 8, 128, true}};
    const cost_prof_attn_shape *shapes = p->quick ? quick : full;
    p->n_attn = p->quick ? 4 : 9;
    for (int i = 0; i < p->n_attn; i++) {
        p->attn[i] = cost_prof_attn_of(shapes[i]);
        int rc = measure_one_attention(g, &p->attn[i], p->quick ? 0.02 : 0.1, err);
        if (rc) return rc;
    }
    return UTIL_OK;
}

/* ---- memory: device-to-device copy and the backend's element-wise kernels ---- */

typedef struct { void *dst; const void *src; size_t bytes; int status; } copy_arg;

static void run_copy(void *v)
{
    copy_arg *a = v;
    cudaError_t e = cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice, 0);
    if (e != cudaSuccess && !a->status) a->status = (int)e;
}

typedef struct { const cost_profile_opts *o; float *a, *b, *c, *w, *rstd, *mean, *dw, *db; size_t n; } ew3_arg;

static void run_ew_add(void *v) { ew3_arg *s = v; s->o->add_inplace(s->c, s->b, s->n); }
static void run_ew_swiglu(void *v) { ew3_arg *s = v; s->o->swiglu_forward(s->a, s->b, s->c, s->n); }
static void run_ew_rmsnorm(void *v)
{
    ew3_arg *s = v;
    s->o->rmsnorm_forward(s->a, s->rstd, s->b, s->w, (int)(s->n / COST_PROF_GPU_RMSNORM_DIM), COST_PROF_GPU_RMSNORM_DIM, 1e-6f);
}

/* LayerNorm (the audio encoder's norm), forward into a, backward from a into c */
static void run_ew_layernorm(void *v)
{
    ew3_arg *s = v;
    s->o->layernorm_forward(s->a, s->mean, s->rstd, s->b, s->w, s->w, (int)(s->n / COST_PROF_GPU_RMSNORM_DIM),
                            COST_PROF_GPU_RMSNORM_DIM, 1e-5f);
}

static void run_ew_layernorm_bwd(void *v)
{
    ew3_arg *s = v;
    s->o->layernorm_backward(s->c, s->dw, s->db, s->a, s->b, s->w, s->mean, s->rstd,
                             (int)(s->n / COST_PROF_GPU_RMSNORM_DIM), COST_PROF_GPU_RMSNORM_DIM);
}

/* The LayerNorm kernels' rates, a one-size table (costdb.h cost_ew_table). */
static int measure_layernorm(gpu_ctx *g, cost_profile *p, ew3_arg *s, double target, int trials, char *err)
{
    timed_call f = {run_ew_layernorm, s, NULL, "layernorm_forward"}, bw = {run_ew_layernorm_bwd, s, NULL, "layernorm_backward"};
    double tf = 0, tb = 0, b = (double)s->n * sizeof(float);
    int rc = alone_on_device(g, &f, target, trials, &tf, err);
    if (!rc) rc = alone_on_device(g, &bw, target, trials, &tb, err);
    if (rc) return rc;
    memset(&p->ew, 0, sizeof p->ew);
    p->ew.n = 1;
    p->ew.elements[0] = (double)s->n;
    p->ew.bw[COST_EW_LAYERNORM][0] = cost_ew_accesses(COST_EW_LAYERNORM) * b / tf;
    p->ew.bw[COST_EW_LAYERNORM_BWD][0] = cost_ew_accesses(COST_EW_LAYERNORM_BWD) * b / tb;
    return UTIL_OK;
}

static int measure_memory(gpu_ctx *g, cost_profile *p, char *err)
{
    /* floats per array: 256 MiB (64 MiB quick), whole RMSNorm rows; then the
     * norm weight, LayerNorm's dw and db (a row each), rstd and mean (per row) */
    const size_t D = COST_PROF_GPU_RMSNORM_DIM;
    size_t n = (p->quick ? (16u << 20) : (64u << 20)) / D * D;
    float *buf = NULL;
    int rc = device_alloc((void **)&buf, (3 * n + 3 * D + 2 * (n / D)) * sizeof *buf, err);
    if (!rc) rc = device_fill(buf, 3 * n + 3 * D + 2 * (n / D), false, 4, err);
    if ((rc = cost_prof_agree(g->c, rc, err))) { cudaFree(buf); return rc; }
    float *tail = buf + 3 * n;
    ew3_arg s = {g->o, buf, buf + n, buf + 2 * n, tail, tail + 3 * D, tail + 3 * D + n / D, tail + D, tail + 2 * D, n};
    double b = (double)n * sizeof(float), tcopy = 0, ta = 0, ts = 0, tr = 0;
    int trials = p->quick ? 2 : 5;
    double target = p->quick ? 0.02 : 0.1;
    copy_arg cp = {s.a, s.b, n * sizeof(float), 0};
    timed_call copy = {run_copy, &cp, &cp.status, "cudaMemcpyAsync"}, add = {run_ew_add, &s, NULL, "add_inplace"},
               sw = {run_ew_swiglu, &s, NULL, "swiglu_forward"}, rms = {run_ew_rmsnorm, &s, NULL, "rmsnorm_forward"};
    rc = alone_on_device(g, &copy, target, trials, &tcopy, err);
    if (!rc) rc = alone_on_device(g, &add, target, trials, &ta, err);
    if (!rc) rc = alone_on_device(g, &sw, target, trials, &ts, err);
    if (!rc) rc = alone_on_device(g, &rms, target, trials, &tr, err);
    if (!rc) rc = measure_layernorm(g, p, &s, target, trials, err);
    if (!rc) {
        p->stream_bytes = b;
        p->dev.d2d_bw = 2 * b / tcopy;
        p->copy_bw = p->dev.d2d_bw;
        p->ew_add_bw = 3 * b / ta;
        p->ew_swiglu_bw = 3 * b / ts;
        p->ew_rmsnorm_bw = 2 * b / tr;
        p->ew_bw = 8 * b / (ta + ts + tr);
    }
    cudaFree(buf);
    return rc;
}

/* ---- collectives: NCCL between the ranks' GPUs ---- */

typedef struct {
    gpu_ctx *g;
    cost_prof_op op;
    size_t count;       /* floats per rank chunk (all-gather, reduce-scatter, all-to-all) or whole buffer */
    float *send, *recv;
    int status;
} coll_arg;

static ncclResult_t nccl_alltoall(const coll_arg *a)
{
    int n = a->g->c->size;
    ncclResult_t r = ncclGroupStart();
    for (int peer = 0; peer < n && r == ncclSuccess; peer++) {
        r = ncclSend(a->send + (size_t)peer * a->count, a->count, ncclFloat, peer, a->g->nccl, 0);
        if (r == ncclSuccess) r = ncclRecv(a->recv + (size_t)peer * a->count, a->count, ncclFloat, peer, a->g->nccl, 0);
    }
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

static ncclResult_t nccl_ring_exchange(const coll_arg *a)
{
    int n = a->g->c->size, me = a->g->c->rank;
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess) r = ncclSend(a->send, a->count, ncclFloat, (me + 1) % n, a->g->nccl, 0);
    if (r == ncclSuccess) r = ncclRecv(a->recv, a->count, ncclFloat, (me + n - 1) % n, a->g->nccl, 0);
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

static void run_coll(void *v)
{
    coll_arg *a = v;
    ncclComm_t comm = a->g->nccl;
    ncclResult_t r = ncclSuccess;
    switch (a->op) {
    case COST_PROF_ALLREDUCE: r = ncclAllReduce(a->send, a->recv, a->count, ncclFloat, ncclSum, comm, 0); break;
    case COST_PROF_ALLGATHER: r = ncclAllGather(a->send, a->recv, a->count, ncclFloat, comm, 0); break;
    case COST_PROF_REDUCESCATTER: r = ncclReduceScatter(a->send, a->recv, a->count, ncclFloat, ncclSum, comm, 0); break;
    case COST_PROF_ALLTOALL: r = nccl_alltoall(a); break;
    case COST_PROF_SENDRECV: r = nccl_ring_exchange(a); break;
    case COST_PROF_MEMCPY:
        if (cudaMemcpyAsync(a->recv, a->send, a->count * sizeof(float), cudaMemcpyDeviceToDevice, 0) != cudaSuccess)
            r = ncclUnhandledCudaError;
        break;
    case COST_PROF_NOPS: break;
    }
    if (r != ncclSuccess && !a->status) a->status = (int)r;
}

/* Every rank times the same number of calls with its own events; the
 * slowest rank's mean, best of 3 trials (the CPU profile's rule). */
static int time_coll(gpu_ctx *g, coll_arg *a, double target, double *seconds, char *err)
{
    timed_call tc = {run_coll, a, &a->status, cost_profile_op_name(a->op)};
    run_coll(a);
    double one;
    cost_prof_barrier(g->c);
    int rc = event_batch(g, &tc, 1, &one, err);
    if ((rc = cost_prof_agree(g->c, rc, err))) return rc;
    cost_prof_max(g->c, &one);
    double want = target / 3 / (one > 1e-7 ? one : 1e-7);
    int reps = want < 1 ? 1 : want > 10000 ? 10000 : (int)want;
    double best = INFINITY;
    for (int t = 0; t < 3; t++) {
        double s = 0;
        cost_prof_barrier(g->c);
        rc = event_batch(g, &tc, reps, &s, err);
        if ((rc = cost_prof_agree(g->c, rc, err))) return rc;
        s /= reps;
        cost_prof_max(g->c, &s);
        if (s < best) best = s;
    }
    rc = a->status ? util_fail(err, UTIL_ERUNTIME, "profile: %s of %zu floats failed: %s", cost_profile_op_name(a->op),
                               a->count, ncclGetErrorString((ncclResult_t)a->status))
                   : UTIL_OK;
    if ((rc = cost_prof_agree(g->c, rc, err))) return rc;
    *seconds = best;
    return UTIL_OK;
}

static int measure_collectives(gpu_ctx *g, cost_profile *p, char *err)
{
    static const size_t full[] = {8u << 10, 64u << 10, 512u << 10, 4u << 20, 32u << 20, 256u << 20};
    static const size_t quick[] = {8u << 10, 512u << 10, 16u << 20};
    const size_t *sizes = p->quick ? quick : full;
    int ns = p->quick ? 3 : 6, n = g->c->size;
    size_t maxb = sizes[ns - 1];
    float *send = NULL, *recv = NULL;
    int rc = device_alloc((void **)&send, maxb, err);
    if (!rc) rc = device_alloc((void **)&recv, maxb, err);
    if (!rc) rc = device_fill(send, maxb / sizeof(float), false, 8, err);
    if ((rc = cost_prof_agree(g->c, rc, err))) goto out;
    int first = g->has_nccl ? COST_PROF_ALLREDUCE : COST_PROF_MEMCPY;
    int last = g->has_nccl ? COST_PROF_SENDRECV : COST_PROF_MEMCPY;
    p->n_coll = 0;
    for (int op = first; op <= last && !rc; op++)
        for (int i = 0; i < ns && p->n_coll < COST_PROFILE_MAX_COLL && !rc; i++) {
            bool chunked = op == COST_PROF_ALLGATHER || op == COST_PROF_REDUCESCATTER || op == COST_PROF_ALLTOALL;
            size_t floats = sizes[i] / sizeof(float);
            coll_arg a = {g, (cost_prof_op)op, chunked ? floats / (size_t)n : floats, send, recv, 0};
            cost_profile_coll *r = &p->coll[p->n_coll];
            r->op = a.op;
            r->bytes = (double)a.count * (chunked ? n : 1) * sizeof(float);
            rc = time_coll(g, &a, p->quick ? 0.01 : 0.1, &r->seconds, err);
            if (!rc) p->n_coll++;
        }
    if (!rc) {
        for (int op = 0; op < COST_PROF_NOPS; op++) cost_prof_fit_points(p, op, n, &p->fit[op]);
        cost_prof_fit_points(p, -1, n, &p->link);
        if (!p->link.valid) rc = util_fail(err, UTIL_ERUNTIME, "profile: the collective timings do not fit t = alpha + bytes/busbw");
    }
out:
    cudaFree(send);
    cudaFree(recv);
    return rc;
}

/* ---- set-up ---- */

static int open_libraries(gpu_ctx *g, char *err)
{
    CUDA_TRY(cudaEventCreate(&g->t0), "cudaEventCreate");
    CUDA_TRY(cudaEventCreate(&g->t1), "cudaEventCreate");
    g->has_events = true;
    cublasStatus_t s = cublasCreate(&g->blas);
    if (s != CUBLAS_STATUS_SUCCESS) return util_fail(err, UTIL_ERUNTIME, "profile: cublasCreate: %s", cublas_text(s));
    g->has_blas = true;
    if (!g->c->mpi || g->c->size < 2) return UTIL_OK;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = g->c->rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, g->c->comm);
    if (r == ncclSuccess) r = ncclCommInitRank(&g->nccl, g->c->size, id, g->c->rank);
    if (r != ncclSuccess) return util_fail(err, UTIL_ERUNTIME, "profile: NCCL set-up: %s", ncclGetErrorString(r));
    g->has_nccl = true;
    return UTIL_OK;
}

static void close_libraries(gpu_ctx *g)
{
    if (g->has_nccl) ncclCommDestroy(g->nccl);
    if (g->has_blas) cublasDestroy(g->blas);
    if (g->has_events) { cudaEventDestroy(g->t0); cudaEventDestroy(g->t1); }
}

static int check_opts(const cost_profile_opts *o, char *err)
{
    if (!o || !o->attention_forward || !o->attention_backward || !o->add_inplace || !o->swiglu_forward
        || !o->rmsnorm_forward || !o->layernorm_forward || !o->layernorm_backward || !o->sync)
        return util_fail(err, UTIL_EINVAL, "profile: the CUDA backend's kernels and sync are required (cost_profile_opts)");
    return UTIL_OK;
}

/* Rank 0's device facts for everybody (the files describe rank 0's GPU). */
static void share_device(const prof_ctx *c, cost_profile *p)
{
    if (c->mpi) MPI_Bcast(&p->dev, sizeof p->dev, MPI_BYTE, 0, c->comm);
    double m[2] = {p->phys_bytes, p->used_bytes};
    if (c->mpi) MPI_Bcast(m, 2, MPI_DOUBLE, 0, c->comm);
    p->phys_bytes = m[0];
    p->used_bytes = m[1];
}

static int measure_all(gpu_ctx *g, cost_profile *p, char *err)
{
    int rc = device_facts(g, p, err);
    if (!rc && g->o->check_kernels) rc = g->o->check_kernels(err);
    if ((rc = cost_prof_agree(g->c, rc, err))) return rc;
    rc = open_libraries(g, err);
    if (!rc) rc = device_memory(p, err);
    if ((rc = cost_prof_agree(g->c, rc, err))) return rc;
    share_device(g->c, p);
    if (!(rc = measure_launch(g, p, err)) && !(rc = measure_gemm(g, p, err)) && !(rc = measure_attention(g, p, err))
        && !(rc = measure_memory(g, p, err)))
        rc = measure_collectives(g, p, err);
    if (!rc) rc = cost_prof_derive(p, err);
    return rc;
}

int cost_profile_measure_cuda(const cost_profile_opts *o, cost_profile *p, char *err)
{
    memset(p, 0, sizeof *p);
    int rc = check_opts(o, err);
    if (rc) return rc;
    p->quick = o->quick;
    p->cuda = true;
    prof_ctx c = {false, MPI_COMM_NULL, 0, 1, o};
    bool we_init = false;
    rc = cost_prof_init_mpi(&c, &we_init, err);
    if (!rc) {
        p->rank = c.rank;
        p->ranks = c.size;
        p->mpi = c.mpi && c.size > 1;
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        p->cpus = cpus > 0 ? (int)cpus : 1;
        p->blas_threads = 1;
        cost_prof_host_id(p);
        cost_prof_share_host_facts(&c, p);
        gpu_ctx g = {&c, o, NULL, false, NULL, false, NULL, NULL, false};
        rc = measure_all(&g, p, err);
        close_libraries(&g);
    }
    if (we_init) MPI_Finalize();
    return rc;
}

#endif
