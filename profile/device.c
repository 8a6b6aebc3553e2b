/* dhp profile on a device backend (CUDA, or its CPU emulator): one device
 * per rank, the executor's own kernels timed through the backend table
 * (GEMMs are its linear_forward, and linear_forward_bf16 as bf16-mixed
 * runs them; attention, fp32 and, where the backend
 * has it, bf16; the residual add, SwiGLU,
 * RMSNorm and LayerNorm at large sizes; its device-to-device copy; the
 * launch cost of a one-element kernel), the collectives through the
 * executor's communicator (NCCL), the device's facts from the runtime
 * (profile/device_facts.c). Each figure is a batch of calls ended by the
 * backend's sync, on rank 0 while the others wait. */
#include "profile/profile_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- launch cost: back-to-back launches of a one-element kernel ---- */

typedef struct { const ex_backend *be; float *y; const float *x; size_t n; } add_arg;

static void run_add(void *v) { add_arg *a = v; a->be->add_inplace(a->y, a->x, a->n); }

static int measure_launch(const prof_ctx *c, cost_profile *p, char *err)
{
    float *buf = prof_alloc_filled(c, 2, 0, err);
    int rc = prof_agree(c, buf ? UTIL_OK : UTIL_ENOMEM, err);
    add_arg a = {c->be, buf, buf + 1, 1};
    if (!rc) rc = prof_alone_time(c, run_add, &a, p->quick ? 0.01 : 0.05, 100, 3, &p->launch_s, err);
    prof_release(c, buf);
    return rc;
}

/* ---- GEMMs and attention at the sizes the device runs ---- */

/* The grid again through another of the backend's GEMM paths (tf32: --tf32's
 * CUBLAS_COMPUTE_32F_FAST_TF32; else linear_forward_bf16, bf16-mixed's),
 * its times into t[], the fp32 grid the efficiencies come from kept. */
static int measure_gemm_again(const prof_ctx *c, cost_profile *p, prof_gemm_grid g, bool tf32, double *t, char *err)
{
    cost_profile_gemm fp32[COST_PROFILE_MAX_GEMM];
    int n = p->n_gemm, rc = UTIL_OK, off = UTIL_OK;
    memcpy(fp32, p->gemm, sizeof fp32);
    g.bf16 = !tf32;
    if (!tf32 || !(rc = ex_backend_tf32(c->be, true, err))) rc = prof_measure_gemm(c, p, &g, err);
    if (tf32) off = ex_backend_tf32(c->be, false, err);
    for (int i = 0; i < n && i < p->n_gemm && !rc; i++) t[i] = p->gemm[i].seconds;
    if (!rc && p->n_gemm != n) rc = util_fail(err, UTIL_EINVAL, "profile: the GEMM grid changed between passes");
    memcpy(p->gemm, fp32, sizeof fp32);
    p->n_gemm = n;
    return rc ? rc : off;
}

/* A device's grid: m tokens of a micro-batch; n, k hidden and FFN sizes of
 * 1B-72B models. The emulator (a CPU thread running the CUDA kernels)
 * runs CPU-sized models: a few of the CPU profile's shapes. Then the same
 * grid with --tf32's GEMMs (asked for) and with bf16-mixed's. */
static int measure_gemm(const prof_ctx *c, cost_profile *p, char *err)
{
    static const int m_full[] = {1024, 4096, 16384}, nk_full[] = {1024, 4096, 8192, 16384};
    static const int m_quick[] = {1024, 8192}, nk_quick[] = {2048, 8192};
    static const int m_host[] = {64, 256}, nk_host[] = {32, 256};
    prof_gemm_grid g = {p->quick ? m_quick : m_full, p->quick ? 2 : 3, p->quick ? nk_quick : nk_full, p->quick ? 2 : 4,
                        p->quick ? 0.01 : 0.05, p->quick ? 1 : 2, 2, false};
    if (ex_backend_emulated(c->be)) g = (prof_gemm_grid){m_host, 2, nk_host, 2, 0.003, 1, 2, false};
    int rc = prof_measure_gemm(c, p, &g, err);
    if (!rc && p->tf32) rc = measure_gemm_again(c, p, g, true, p->gemm_tf32_s, err);
    if (rc || !c->be->linear_forward_bf16 || !c->be->to_bf16) return rc;   /* a backend without bf16 linears */
    rc = measure_gemm_again(c, p, g, false, p->gemm_bf16_s, err);
    p->gemm_bf16 = !rc;
    return rc;
}

static int one_sequence(int seq) { (void)seq; return 1; }

/* Head shapes of Qwen2.5-VL's ViT (d=80) and 32B LLM (d=128, GQA 40/8) and a
 * d=64 model, at two lengths, so the fit can tell per-score from per-FLOP
 * cost; the LLM shapes causal too, as LLM layers run. One sequence per
 * call. On the emulator, the CPU profile's quick shapes, its d=64 one with 4
 * heads, not 12 (the emulated bf16 kernel, a CPU thread running every WMMA
 * lane, took 1 s for its backward). */
static int measure_attention_grid(const prof_ctx *c, cost_profile *p, char *err)
{
    static const prof_attn_shape full[] = {
        {1024, 16, 16, 80, false}, {4096, 16, 16, 80, false}, {1024, 40, 8, 128, false},
        {4096, 40, 8, 128, false}, {2048, 16, 16, 64, false}, {2048, 32, 8, 64, false},
        {1024, 40, 8, 128, true},  {4096, 40, 8, 128, true},  {2048, 32, 8, 64, true}};
    static const prof_attn_shape quick[] = {{1024, 16, 16, 80, false}, {1024, 40, 8, 128, false},
                                            {2048, 16, 16, 64, false}, {1024, 40, 8, 128, true}};
    static const prof_attn_shape host[] = {{64, 4, 4, 8, false}, {128, 4, 2, 16, false},
                                           {128, 4, 2, 64, false}, {128, 4, 2, 16, true}};
    if (ex_backend_emulated(c->be)) return prof_measure_attention(c, p, host, 4, 1, 0.005, one_sequence, err);
    return prof_measure_attention(c, p, p->quick ? quick : full, p->quick ? 4 : 9, 1, p->quick ? 0.02 : 0.1,
                                  one_sequence, err);
}

/* The grid with the backend's fp32 attention (attn_eff's), then, where the
 * backend has a bf16 one (set_attention_bf16: what bf16-mixed and -autocast
 * run), the same grid with it, kept beside the fp32 times (gpu.attn_bf16's
 * fit); the backend's attention is fp32 again after. */
static int measure_attention(const prof_ctx *c, cost_profile *p, char *err)
{
    int rc = measure_attention_grid(c, p, err);
    if (rc || !c->be->set_attention_bf16) return rc;
    cost_profile_attn fp32[COST_PROFILE_MAX_ATTN];
    int n = p->n_attn;
    memcpy(fp32, p->attn, sizeof fp32);
    c->be->set_attention_bf16(true);
    rc = measure_attention_grid(c, p, err);
    c->be->set_attention_bf16(false);
    for (int i = 0; i < n && i < p->n_attn && !rc; i++) {
        p->attn_bf16_fwd_s[i] = p->attn[i].fwd_s;
        p->attn_bf16_bwd_s[i] = p->attn[i].bwd_s;
    }
    p->attn_bf16 = !rc && p->n_attn == n;
    memcpy(p->attn, fp32, sizeof fp32);
    p->n_attn = n;
    return rc;
}

/* ---- memory: device-to-device copy and the backend's element-wise kernels ---- */

typedef struct { const ex_backend *be; float *a, *b, *c, *w, *rstd, *mean, *dw, *db; size_t n; } ew3_arg;

#define ROWS(s) ((int)((s)->n / COST_PROF_GPU_RMSNORM_DIM))
static void run_copy(void *v) { ew3_arg *s = v; s->be->d2d(s->b, s->a, s->n * sizeof(float)); }
static void run_ew_add(void *v) { ew3_arg *s = v; s->be->add_inplace(s->c, s->b, s->n); }
static void run_ew_swiglu(void *v) { ew3_arg *s = v; s->be->swiglu_forward(s->a, s->b, s->c, s->n); }
static void run_ew_rmsnorm(void *v)
{
    ew3_arg *s = v;
    s->be->rmsnorm_forward(s->a, s->rstd, s->b, s->w, ROWS(s), COST_PROF_GPU_RMSNORM_DIM, 1e-6f);
}
/* LayerNorm (the audio encoder's norm), forward into a, backward from a into c */
static void run_ew_layernorm(void *v)
{
    ew3_arg *s = v;
    s->be->layernorm_forward(s->a, s->mean, s->rstd, s->b, s->w, s->w, ROWS(s), COST_PROF_GPU_RMSNORM_DIM, 1e-5f);
}
static void run_ew_layernorm_bwd(void *v)
{
    ew3_arg *s = v;
    s->be->layernorm_backward(s->c, s->dw, s->db, s->a, s->b, s->w, s->mean, s->rstd, ROWS(s), COST_PROF_GPU_RMSNORM_DIM);
}

/* Floats per array: 256 MiB (64 MiB quick; 4 MiB on the emulator), whole norm rows. */
static size_t array_floats(const prof_ctx *c, const cost_profile *p)
{
    size_t n = ex_backend_emulated(c->be) ? (1u << 20) : p->quick ? (16u << 20) : (64u << 20);
    return n / COST_PROF_GPU_RMSNORM_DIM * COST_PROF_GPU_RMSNORM_DIM;
}

static int measure_memory(const prof_ctx *c, cost_profile *p, char *err)
{
    /* three arrays; then the norm weight, LayerNorm's dw and db (a row each), rstd and mean (per row) */
    const size_t D = COST_PROF_GPU_RMSNORM_DIM, n = array_floats(c, p);
    float *buf = prof_alloc_filled(c, 3 * n + 3 * D + 2 * (n / D), 4, err);
    int rc = prof_agree(c, buf ? UTIL_OK : UTIL_ENOMEM, err);
    if (rc) return rc;
    float *tail = buf + 3 * n;
    ew3_arg s = {c->be, buf, buf + n, buf + 2 * n, tail, tail + 3 * D, tail + 3 * D + n / D, tail + D, tail + 2 * D, n};
    double b = (double)n * sizeof(float), t[6] = {0};
    int trials = p->quick ? 2 : 5;
    double target = p->quick ? 0.02 : 0.1;
    void (*fns[6])(void *) = {run_copy, run_ew_add, run_ew_swiglu, run_ew_rmsnorm, run_ew_layernorm, run_ew_layernorm_bwd};
    for (int i = 0; i < 6 && !rc; i++) rc = prof_alone_time(c, fns[i], &s, target, 1, trials, &t[i], err);
    if (!rc) {
        p->stream_bytes = b;
        p->dev.d2d_bw = 2 * b / t[0];
        p->copy_bw = p->dev.d2d_bw;
        p->ew_add_bw = 3 * b / t[1];
        p->ew_swiglu_bw = 3 * b / t[2];
        p->ew_rmsnorm_bw = 2 * b / t[3];
        p->ew_bw = 8 * b / (t[1] + t[2] + t[3]);
        /* the LayerNorm kernels' rates, a one-size table (costdb.h cost_ew_table) */
        memset(&p->ew, 0, sizeof p->ew);
        p->ew.n = 1;
        p->ew.elements[0] = (double)n;
        p->ew.bw[COST_EW_LAYERNORM][0] = cost_ew_accesses(COST_EW_LAYERNORM) * b / t[4];
        p->ew.bw[COST_EW_LAYERNORM_BWD][0] = cost_ew_accesses(COST_EW_LAYERNORM_BWD) * b / t[5];
    }
    prof_release(c, buf);
    return rc;
}

/* ---- set-up ---- */

/* Rank 0's device facts for everybody (the files describe rank 0's device). */
static void share_device(const prof_ctx *c, cost_profile *p)
{
    if (!c->mpi) return;
    MPI_Bcast(&p->dev, sizeof p->dev, MPI_BYTE, 0, c->comm);
    double m[2] = {p->phys_bytes, p->used_bytes};
    MPI_Bcast(m, 2, MPI_DOUBLE, 0, c->comm);
    p->phys_bytes = m[0];
    p->used_bytes = m[1];
}

static int measure_all(const prof_ctx *c, cost_profile *p, char *err)
{
    int rc = prof_device_facts(c, p, err);
    if (!rc && c->o->check_kernels) rc = c->o->check_kernels(err);
    if ((rc = prof_agree(c, rc, err))) return rc;
    share_device(c, p);
    if (!(rc = measure_launch(c, p, err)) && !(rc = measure_gemm(c, p, err)) && !(rc = measure_attention(c, p, err))
        && !(rc = measure_memory(c, p, err)))
        rc = prof_measure_collectives(c, p, err);
    if (!rc) rc = cost_prof_derive(p, err);
    return rc;
}

int prof_measure_device(const prof_opts *o, cost_profile *p, char *err)
{
    p->cuda = true;
    prof_ctx c = {false, MPI_COMM_NULL, 0, 1, o, o->be, NULL};
    /* the communicator dhp run picks for a device backend: NCCL where it is built in */
    ex_comm_kind kind;
    char line[UTIL_ERR_LEN];
    int rc = ex_comm_pick(NULL, true, &kind, line, sizeof line, err);
    if (!rc) rc = prof_init_mpi(&c, kind, err);
    /* MPI reads host memory only: between GPUs the collectives need NCCL */
    if (!rc && c.size > 1 && kind == EX_COMM_MPI && !o->be->host_memory)
        rc = util_fail(err, UTIL_EUNSUPPORTED, "profile: %d ranks on the %s backend need NCCL between the GPUs, and this dhp "
                       "was built without it (make NCCL=1 with nccl.h found)", c.size, o->be->name);
    if (!rc) {
        p->rank = c.rank;
        p->ranks = c.size;
        p->mpi = c.mpi && c.size > 1;
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        p->cpus = cpus > 0 ? (int)cpus : 1;
        p->blas_threads = 1;
        prof_host_id(p);
        prof_share_host_facts(&c, p);
        rc = measure_all(&c, p, err);
    }
    prof_close(&c);
    return rc;
}
