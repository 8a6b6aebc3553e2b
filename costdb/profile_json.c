/* dhp profile: a profile as files, the dhp.gpu/1 description of one rank
 * and the one-node dhp.cluster/1 file, with the measurements they come from
 * (costdb/SCHEMA.md, "Measured files"); written atomically and read back. */
#include "costdb/costdb.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- JSON ---- */

static const char *source_text(const cost_profile *p, char *src, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A measured figure's source: "measured by dhp profile on HOST DATE", then
 * fmt's text (from its ", " or ": "). */
static const char *source_text(const cost_profile *p, char *src, size_t n, const char *fmt, ...)
{
    int u = snprintf(src, n, "measured by dhp profile on %s %s", p->host, p->date);
    if (u >= 0 && (size_t)u < n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(src + u, n - (size_t)u, fmt, ap);
        va_end(ap);
    }
    return src;
}

/* {"value": value, "source": src}; NULL (value freed) on failure. */
static cJSON *sourced(cJSON *value, const char *src)
{
    cJSON *o = cJSON_CreateObject();
    if (o && value && cJSON_AddItemToObject(o, "value", value)) {
        if (cJSON_AddStringToObject(o, "source", src)) return o;
    } else {
        cJSON_Delete(value);
    }
    cJSON_Delete(o);
    return NULL;
}

static bool add_field(cJSON *o, const cost_profile *p, const char *key, double v, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* o[key] = {"value": v, "source": "measured by dhp profile on HOST DATE, <how>"} */
static bool add_field(cJSON *o, const cost_profile *p, const char *key, double v, const char *fmt, ...)
{
    char how[1024], src[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(how, sizeof how, fmt, ap);
    va_end(ap);
    cJSON *f = sourced(cJSON_CreateNumber(v), source_text(p, src, sizeof src, ", %s", how));
    if (!f || !cJSON_AddItemToObject(o, key, f)) {
        cJSON_Delete(f);
        return false;
    }
    return true;
}

static const char *shape_list(const cost_profile *p, char *buf, size_t n)
{
    /* The distinct m and the distinct n (= k) values of the measured grid. */
    int ms[COST_PROFILE_MAX_GEMM], ns[COST_PROFILE_MAX_GEMM], nm = 0, nn = 0;
    for (int i = 0; i < p->n_gemm; i++) {
        bool seen = false;
        for (int j = 0; j < nm; j++) seen = seen || ms[j] == p->gemm[i].m;
        if (!seen) ms[nm++] = p->gemm[i].m;
        seen = false;
        for (int j = 0; j < nn; j++) seen = seen || ns[j] == p->gemm[i].n;
        if (!seen) ns[nn++] = p->gemm[i].n;
    }
    size_t u = 0;
    u += (size_t)snprintf(buf + u, n - u, "m in {");
    for (int j = 0; j < nm && u < n; j++) u += (size_t)snprintf(buf + u, n - u, "%s%d", j ? "," : "", ms[j]);
    if (u < n) u += (size_t)snprintf(buf + u, n - u, "} x n,k in {");
    for (int j = 0; j < nn && u < n; j++) u += (size_t)snprintf(buf + u, n - u, "%s%d", j ? "," : "", ns[j]);
    if (u < n) snprintf(buf + u, n - u, "}");
    return buf;
}

static const char *who(const cost_profile *p, char *buf, size_t n)
{
    snprintf(buf, n, "%d rank%s on %d CPUs, %d OpenBLAS thread%s per rank%s", p->ranks, p->ranks > 1 ? "s" : "",
             p->cpus, p->blas_threads, p->blas_threads > 1 ? "s" : "",
             p->ranks > 1 ? ", rank 0 measuring while the others wait in MPI_Barrier (compute_speed says how ranks computing "
                            "at once slow each other)" : "");
    return buf;
}

static const char *attn_shape_list(const cost_profile *p, char *buf, size_t n)
{
    size_t u = 0;
    buf[0] = '\0';
    for (int i = 0; i < p->n_attn && u < n; i++)
        u += (size_t)snprintf(buf + u, n - u, "%s %d x s=%d H=%d Hkv=%d d=%d%s", i ? "," : "", p->attn[i].seqs,
                              p->attn[i].seq, p->attn[i].heads, p->attn[i].kv_heads, p->attn[i].head_dim,
                              p->attn[i].causal ? " causal" : "");
    return buf;
}

/* gemm_half and the attention fit's fields, the same fit for both backends;
 * `kernels` names the attention kernels timed, `w` who measured. */
static bool add_fit_fields(cJSON *o, const cost_profile *p, const char *kernels, const char *w)
{
    const cost_gpu *g = &p->gpu;
    char at[768];
    attn_shape_list(p, at, sizeof at);
    return add_field(o, p, "gemm_half", g->gemm_half, "same least-squares fit as gemm_eff_max, s(x) = x / (x + gemm_half)")
        && add_field(o, p, "attn_eff", g->attn_eff,
                     "%s, timed calls of (sequences x shape)%s, the times per sequence; least-squares fit (relative "
                     "error, rms %.1f%%) of fwd = S "
                     "(attn_score_s + 4 d / (peak_flops attn_eff)) + R attn_row_s, bwd = S (attn_bwd_score_s + 2.5 x 4 d "
                     "/ (peak_flops attn_eff)) + R attn_bwd_row_s, S = s^2 H scores, causal s (s + 1) / 2 H, R = s H "
                     "rows; %s", kernels, at, 100 * p->attn_fit_rms, w)
        && add_field(o, p, "attn_score_s", g->attn_score_s,
                     "same fit as attn_eff: forward seconds per score that do not scale with d (max, exp, rescale)")
        && add_field(o, p, "attn_bwd_score_s", g->attn_bwd_score_s,
                     "same fit as attn_eff: backward seconds per score that do not scale with d (exp recomputed, dS)")
        && add_field(o, p, "attn_row_s", g->attn_row_s,
                     "same fit as attn_eff: forward seconds per query row and head that do not scale with the keys "
                     "(online-softmax set-up, final normalization, lse)")
        && add_field(o, p, "attn_bwd_row_s", g->attn_bwd_row_s,
                     "same fit as attn_eff: backward seconds per query row and head that do not scale with the keys "
                     "(dout . out, the row's loads)");
}

/* The fields of a device profile (profile/device.c): one rank's GPU. */
static bool add_gpu_fields_cuda(cJSON *o, const cost_profile *p)
{
    const cost_gpu *g = &p->gpu;
    const cost_profile_device *d = &p->dev;
    char shapes[256], w[256];
    shape_list(p, shapes, sizeof shapes);
    snprintf(w, sizeof w, "%s (sm_%d%d, %d SMs), CUDA runtime %d, driver %d, the %s backend's kernels, rank 0 of %d timing "
             "batches of calls ended by the backend's sync while the others wait", d->name, d->cc_major, d->cc_minor, d->sms,
             d->runtime_version, d->driver_version, d->backend, p->ranks);
    const char *kern = "fp32 linear_forward (the backend's GEMM, cublasLtMatmul on CUDA)";
    bool ok;
    if (d->clock_hz > 0)
        ok = add_field(o, p, "peak_flops", g->peak_flops,
                       "%s peak = %g FLOP/cycle/SM x %.0f MHz (cudaDevAttrClockRate) x %d SMs; rule: the higher of the fitted "
                       "large-shape %s rate (%.4g FLOP/s, see gemm_eff_max) and the best measured shape's, / (clock x SMs), "
                       "rounded up to a power of two FLOP/cycle; %s",
                       "fp32", p->flops_per_cycle, d->clock_hz / 1e6, d->sms,
                       kern, p->gemm_rate_max, w);
    else
        ok = add_field(o, p, "peak_flops", g->peak_flops,
                       "the best measured %s rate (the device gives no clock, so no theoretical peak); %s", kern, w);
    ok = ok && add_field(o, p, "gemm_eff_max", g->gemm_eff_max,
                         "fitted large-shape rate %.4g FLOP/s / peak_flops; least-squares fit (relative error, rms %.1f%%) of "
                         "rate = peak_flops * gemm_eff_max * s(m) s(n) s(k)%s to %s (row-major A[m,k] B[n,k]^T, the "
                         "executor's linear) over %d shapes %s, time less kernel_launch_s, best of 2 batches%s; %s",
                         p->gemm_rate_max, 100 * p->gemm_fit_rms, g->sm_count > 0 ? " * wave(m,n,k) (sm_count)" : "", kern,
                         p->n_gemm, shapes, p->quick ? "" : " in 2 passes", w);
    if (g->sm_count > 0)
        ok = ok && add_field(o, p, "sm_count", g->sm_count,
                             "multiprocessors of %s (cudaGetDeviceProperties multiProcessorCount), the GEMM wave term's "
                             "(costdb/SCHEMA.md, Cost model)", d->name);
    if (p->tf32)
        ok = ok && add_field(o, p, "peak_flops_tf32", g->peak_flops_tf32,
                             "the same %d GEMM shapes with fp32 operands read as TF32 (CUBLAS_COMPUTE_32F_FAST_TF32, dhp "
                             "profile --tf32 as dhp run --tf32), timed as the fp32 grid; least-squares fit (relative error, rms "
                             "%.1f%%) of time = 2mnk / (peak_flops_tf32 x eff(m,n,k)) + kernel_launch_s, eff the fp32 grid's "
                             "(gemm_grid), as the planner prices --tf32; %s", p->n_gemm, 100 * p->tf32_fit_rms, w);
    ok = ok && add_fit_fields(o, p, "the CUDA backend's own fp32 attention kernels (executor/cuda_kernels.cu, passed in by "
                                    "the CLI), forward and backward", w);
    ok = ok && add_field(o, p, "hbm_bytes", g->hbm_bytes, "device memory (cudaMemGetInfo total) of %s", d->name);
    if (d->mem_clock_hz > 0 && d->bus_bits > 0)
        ok = ok && add_field(o, p, "hbm_bw", g->hbm_bw,
                             "theoretical: memory clock %.0f MHz (cudaDevAttrMemoryClockRate) x 2 (double data rate) x "
                             "%d-bit bus (cudaDevAttrGlobalMemoryBusWidth) / 8; the backend's device-to-device copy (d2d) of %.0f MiB "
                             "moved %.4g GB/s (read + written)", d->mem_clock_hz / 1e6, d->bus_bits,
                             p->stream_bytes / 1048576.0, d->d2d_bw / 1e9);
    else
        ok = ok && add_field(o, p, "hbm_bw", g->hbm_bw,
                             "the backend's device-to-device copy (d2d) of %.0f MiB, bytes read + written per second (the device "
                             "reports no memory clock)", p->stream_bytes / 1048576.0);
    ok = ok && add_field(o, p, "mem_eff", g->mem_eff,
                         "the CUDA backend's element-wise kernels over fp32 arrays of %.0f MiB (residual add 12 B/element "
                         "%.4g GB/s, SwiGLU 12 B/element %.4g GB/s, RMSNorm d=%d 8 B/element %.4g GB/s): total bytes / "
                         "total time %.4g GB/s, / hbm_bw",
                         p->stream_bytes / 1048576.0, p->ew_add_bw / 1e9, p->ew_swiglu_bw / 1e9, COST_PROF_GPU_RMSNORM_DIM, p->ew_rmsnorm_bw / 1e9,
                         p->ew_bw / 1e9);
    ok = ok && add_field(o, p, "reserved_bytes", g->reserved_bytes,
                         "device memory in use once the CUDA context, cuBLAS%s exist, before any buffer (cudaMemGetInfo "
                         "total - free; includes other processes on the GPU)", p->mpi ? " and NCCL" : "");
    ok = ok && add_field(o, p, "kernel_launch_s", g->kernel_launch_s,
                         "mean time per launch of back-to-back one-element add_inplace kernels (the backend's), CUDA "
                         "events, best of 3 batches");
    return ok;
}

static bool add_gpu_fields_cpu(cJSON *o, const cost_profile *p)
{
    const cost_gpu *g = &p->gpu;
    char shapes[256], w[320];
    shape_list(p, shapes, sizeof shapes);
    who(p, w, sizeof w);
    bool ok;
    if (p->cpu_hz > 0)
        ok = add_field(o, p, "peak_flops", g->peak_flops,
                       "fp32 peak of one rank = %g FLOP/cycle x %.0f MHz x %.3g cores; rule: the higher of the fitted "
                       "large-shape cblas_sgemm rate (%.4g FLOP/s, see gemm_eff_max) and the best measured shape's, / (clock "
                       "x cores), rounded up to a power of two FLOP/cycle; cores = min(BLAS threads, CPUs); %s",
                       p->flops_per_cycle, p->cpu_hz / 1e6, p->core_share, p->gemm_rate_max, w);
    else
        ok = add_field(o, p, "peak_flops", g->peak_flops,
                       "the best measured cblas_sgemm rate (the OS gives no clock, so no theoretical peak); %s", w);
    ok = ok && add_field(o, p, "gemm_eff_max", g->gemm_eff_max,
                         "fitted large-shape rate %.4g FLOP/s / peak_flops; least-squares fit (relative error, rms %.1f%%) "
                         "of rate = peak_flops * gemm_eff_max * s(m) s(n) s(k) to fp32 cblas_sgemm (A[m,k] B[n,k]^T, the "
                         "executor's linear) over %d shapes %s, A in cache, B and C the next slot of a %.0f MiB arena each call "
                         "(from memory, as a step's weights and outputs come), time less kernel_launch_s, best of %d batches "
                         "in %d passes over the grid; %s",
                         p->gemm_rate_max, 100 * p->gemm_fit_rms, p->n_gemm, shapes, p->gemm_arena_bytes / 1048576,
                         COST_PROF_GEMM_BATCHES * cost_prof_gemm_passes(p), cost_prof_gemm_passes(p), w);
    ok = ok && add_fit_fields(o, p, "flash-style attention forward and backward, the executor's own kernels "
                                    "(executor/cpu_kernels.c, passed in by the CLI)", w);
    ok = ok && add_field(o, p, "hbm_bytes", g->hbm_bytes,
                         "physical memory (sysconf _SC_PHYS_PAGES x _SC_PAGESIZE) %.4g GiB / %d rank%s on this host",
                         p->phys_bytes / 1073741824.0, p->ranks, p->ranks > 1 ? "s" : "");
    ok = ok && add_field(o, p, "hbm_bw", g->hbm_bw,
                         "best per-rank bandwidth of the STREAM kernels over 3 fp32 arrays of %.0f MiB (copy %.3g, scale "
                         "%.3g, add %.3g, triad %.3g GB/s; bytes read + written, best of several passes); the DRAM's "
                         "theoretical rate is not visible to the tool; %s",
                         p->stream_bytes / 1048576.0, p->copy_bw / 1e9, p->scale_bw / 1e9, p->add_bw / 1e9,
                         p->triad_bw / 1e9, w);
    ok = ok && add_field(o, p, "mem_eff", g->mem_eff,
                         "three of the executor's element-wise kernels (executor/cpu_kernels.c, passed in by the CLI) at "
                         "the elementwise table's large size, %.0f MiB per array (residual add 12 B/element %.3g GB/s, "
                         "SwiGLU 12 B/element %.3g GB/s, RMSNorm d=%d 8 B/element %.3g GB/s): total bytes / total time "
                         "%.3g GB/s, / hbm_bw",
                         g->ew.elements[1] * sizeof(float) / 1048576.0, p->ew_add_bw / 1e9, p->ew_swiglu_bw / 1e9, COST_PROF_EW_ROW,
                         p->ew_rmsnorm_bw / 1e9, p->ew_bw / 1e9);
    ok = ok && add_field(o, p, "reserved_bytes", g->reserved_bytes,
                         p->used_from_meminfo
                             ? "memory in use before the benchmark buffers (MemTotal - MemAvailable of /proc/meminfo: the OS, "
                               "other processes, the ranks' libraries and MPI) / ranks on this host"
                             : "this process's peak resident size before the benchmark buffers (getrusage; /proc/meminfo "
                               "was not readable)");
    ok = ok && add_field(o, p, "kernel_launch_s", g->kernel_launch_s,
                         "mean time of one 1x1x1 cblas_sgemm call (the fixed cost of a BLAS call), best of 3 batches");
    return ok;
}

/* "attn_bf16": the bf16 attention's fit, where the backend has that kernel. */
static bool add_attn_bf16(cJSON *o, const cost_profile *p)
{
    const cost_attn_terms *t = &p->gpu.attn_bf16;
    if (!t->measured) return true;
    char at[768], src[1800];
    attn_shape_list(p, at, sizeof at);
    source_text(p, src, sizeof src, ", the %s backend's bf16 attention kernels "
                "(executor/cuda_attention16.cuh, set_attention_bf16 on: q, k, v, dout rounded to bf16, products on tensor "
                "cores through WMMA, fp32 statistics), forward and backward, at attn_eff's shapes (%s), the times per "
                "sequence; least-squares fit (relative error, rms %.1f%%) of fwd = S (score_s + 4 d flop_s) + R row_s, "
                "bwd = S (bwd_score_s + 2.5 x 4 d flop_s) + R bwd_row_s, seconds, S scores and R rows as attn_eff's, "
                "without a peak (the tensor cores' bf16 rate is not measured; flop_s pinned at >= 0): the products at "
                "%.4g FLOP/s. dhp plan prices the dhp target's attention under bf16-mixed and -autocast with them",
                p->dev.backend, at + (at[0] == ' '), 100 * p->attn_bf16_fit_rms, t->flop_s > 0 ? 1 / t->flop_s : INFINITY);
    return cost_attn_bf16_add(o, t, src);
}

/* "gemm_bf16": the bf16 linear's grid, where the profile timed it (a device backend). */
static bool add_gemm_bf16(cJSON *o, const cost_profile *p)
{
    const cost_gemm_terms *t = &p->gpu.gemm_bf16;
    if (!t->measured) return true;
    char shapes[256], src[1200];
    shape_list(p, shapes, sizeof shapes);
    source_text(p, src, sizeof src, ", the %s backend's linear_forward_bf16 (what dhp run's "
                "bf16-mixed and bf16-autocast linears call: row-major A[m,k] B[n,k]^T on bf16 operands, fp32 accumulation "
                "and output; cublasLtMatmul CUDA_R_16BF, CUBLAS_COMPUTE_32F on CUDA, executor/cuda_gemm.cuh) at gemm_grid's "
                "shapes (%s), timed as them: peak_flops the best shape's rate (time less kernel_launch_s), eff each shape's "
                "rate / peak_flops, k fastest; dhp plan prices the dhp target's bf16 GEMMs as 2mnk / (peak_flops x eff) + "
                "kernel_launch_s, eff interpolated as gemm_grid's (linear in log m, log n, log k; outside the grid the edge "
                "value x the fitted s(m) s(n) s(k))", p->dev.backend, shapes);
    return cost_gemm_bf16_add(o, t, src);
}

static bool add_gpu_fields(cJSON *o, const cost_profile *p)
{
    if (!(p->cuda ? add_gpu_fields_cuda(o, p) : add_gpu_fields_cpu(o, p)) || !add_attn_bf16(o, p)
        || !add_gemm_bf16(o, p)) return false;
    char src[600];
    if (p->gpu.grid.n_m > 0) {
        source_text(p, src, sizeof src, ", the GEMM shapes of gemm_eff_max's fit: each shape's "
                    "rate (time less kernel_launch_s) / peak_flops, k fastest; the cost model interpolates them linearly in "
                    "log m, log n, log k and, outside the grid, scales the edge value by the fitted s(m) s(n) s(k)");
        if (!cost_gemm_grid_add(o, &p->gpu.grid, src)) return false;
    }
    if (p->gpu.ew.n == 0) return true;
    if (p->cuda)
        source_text(p, src, sizeof src, ": the CUDA backend's LayerNorm forward and backward "
                    "(executor/cuda_kernels_whisper.cuh, passed in by the CLI), rows of %d, over fp32 arrays of `elements` "
                    "elements, nominal bytes (costdb/model.c ew_kernels, x 4 B) / time; the other element-wise kernels, all "
                    "bound by memory on a GPU, are priced at hbm_bw x mem_eff", COST_PROF_GPU_RMSNORM_DIM);
    else
        source_text(p, src, sizeof src, ": each of the executor's element-wise kernels "
                    "(executor/cpu_kernels.c, passed in by the CLI) over fp32 arrays of `elements` elements, its nominal bytes "
                    "(tensor elements read + written per element, costdb/model.c ew_kernels, x 4 B) / time, best of %d passes; "
                    "rows of %d (RMSNorm, LayerNorm, bias), %d heads x %d (RoPE), vocabulary %d (cross-entropy); the cost model "
                    "interpolates in log bytes between the two sizes", cost_prof_ew_passes(p), COST_PROF_EW_ROW, COST_PROF_EW_HEADS,
                    COST_PROF_EW_HEAD_DIM, COST_PROF_EW_VOCAB);
    return cost_ew_table_add(o, &p->gpu.ew, src);
}

static bool add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v) != NULL; }

static bool add_obj(cJSON *parent, const char *key, cJSON *child)
{
    if (!child) return false;
    if (!cJSON_AddItemToObject(parent, key, child)) { cJSON_Delete(child); return false; }
    return true;
}

static cJSON *gemm_measurements(const cost_profile *p)
{
    cJSON *o = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    const char *kernel = !p->cuda ? "cblas_sgemm RowMajor NoTrans x Trans, fp32"
                         : "the backend's linear_forward (row-major A[m,k] B[n,k]^T; cublasLtMatmul OP_T x OP_N on CUDA), fp32";
    bool ok = o && rows && cJSON_AddStringToObject(o, "kernel", kernel)
        && add_num(o, "rate_max", p->gemm_rate_max) && add_num(o, "gemm_half", p->gpu.gemm_half)
        && add_num(o, "fit_rms_rel", p->gemm_fit_rms);
    for (int i = 0; ok && i < p->n_gemm; i++) {
        const cost_profile_gemm *g = &p->gemm[i];
        cJSON *r = cJSON_CreateObject();
        ok = r && add_num(r, "m", g->m) && add_num(r, "n", g->n) && add_num(r, "k", g->k)
            && add_num(r, "seconds", g->seconds) && add_num(r, "flops_per_s", g->rate)
            && add_num(r, "model_seconds", cost_gemm_time(&p->gpu, g->m, g->n, g->k));
        if (ok && p->tf32)   /* --tf32: the same shape on TF32 tensor cores, and its price at peak_flops_tf32 */
            ok = add_num(r, "tf32_seconds", p->gemm_tf32_s[i])
                && add_num(r, "tf32_model_seconds", cost_gemm_time_in(&p->gpu, COST_MATH_TF32, g->m, g->n, g->k));
        if (ok && p->gpu.gemm_bf16.measured)   /* the same shape through linear_forward_bf16, and its price from gemm_bf16 */
            ok = add_num(r, "bf16_seconds", p->gemm_bf16_s[i])
                && add_num(r, "bf16_model_seconds", cost_gemm_time_in(&p->gpu, COST_MATH_BF16_DHP, g->m, g->n, g->k));
        if (!ok || !cJSON_AddItemToArray(rows, r)) { cJSON_Delete(r); ok = false; }
    }
    if (ok && add_obj(o, "shapes", rows)) return o;
    if (!ok) cJSON_Delete(rows);
    cJSON_Delete(o);
    return NULL;
}

static double rows_of(const cost_profile_attn *a) { return (double)a->seq * a->heads; }

/* Each attention shape's times and its price from the fit (model_*: the
 * fp32 kernel's, at attn_eff; bf16_*: the bf16 kernel's, where measured). */
static cJSON *attn_measurements(const cost_profile *p)
{
    cJSON *rows = cJSON_CreateArray();
    bool ok = rows != NULL;
    for (int i = 0; ok && i < p->n_attn; i++) {
        const cost_profile_attn *a = &p->attn[i];
        cJSON *r = cJSON_CreateObject();
        ok = r && add_num(r, "seq", a->seq) && add_num(r, "heads", a->heads) && add_num(r, "kv_heads", a->kv_heads)
            && add_num(r, "head_dim", a->head_dim) && cJSON_AddBoolToObject(r, "causal", a->causal)
            && add_num(r, "sequences_per_call", a->seqs)
            && add_num(r, "fwd_flops", a->fwd_flops)
            && add_num(r, "fwd_seconds", a->fwd_s) && add_num(r, "bwd_seconds", a->bwd_s)
            && add_num(r, "fwd_flops_per_s", a->fwd_flops / a->fwd_s) && add_num(r, "bwd_over_fwd", a->bwd_s / a->fwd_s)
            && add_num(r, "model_fwd_seconds", cost_attention_forward_time_in(&p->gpu, COST_ATTN_FP32, rows_of(a), cost_prof_attn_scores(a), a->head_dim))
            && add_num(r, "model_bwd_seconds", cost_attention_backward_time_in(&p->gpu, COST_ATTN_FP32, rows_of(a), cost_prof_attn_scores(a), a->head_dim));
        if (ok && p->gpu.attn_bf16.measured)   /* the same shape with the bf16 kernel, and its price from attn_bf16 */
            ok = add_num(r, "bf16_fwd_seconds", p->attn_bf16_fwd_s[i]) && add_num(r, "bf16_bwd_seconds", p->attn_bf16_bwd_s[i])
                && add_num(r, "bf16_model_fwd_seconds",
                           cost_attention_forward_time_in(&p->gpu, COST_ATTN_BF16, rows_of(a), cost_prof_attn_scores(a), a->head_dim))
                && add_num(r, "bf16_model_bwd_seconds",
                           cost_attention_backward_time_in(&p->gpu, COST_ATTN_BF16, rows_of(a), cost_prof_attn_scores(a), a->head_dim));
        if (!ok || !cJSON_AddItemToArray(rows, r)) { cJSON_Delete(r); ok = false; }
    }
    if (ok) return rows;
    cJSON_Delete(rows);
    return NULL;
}

static cJSON *device_measurements(const cost_profile *p)
{
    const cost_profile_device *d = &p->dev;
    cJSON *o = cJSON_CreateObject(), *ew = cJSON_CreateObject(), *mem = cJSON_CreateObject();
    bool ok = o && ew && mem && cJSON_AddStringToObject(o, "host", p->host) && cJSON_AddStringToObject(o, "date", p->date)
        && cJSON_AddBoolToObject(o, "quick", p->quick) && add_num(o, "ranks", p->ranks)
        && cJSON_AddStringToObject(o, "device", d->name) && add_num(o, "compute_capability", d->cc_major * 10 + d->cc_minor)
        && add_num(o, "sms", d->sms) && add_num(o, "devices", d->devices) && add_num(o, "clock_hz", d->clock_hz)
        && add_num(o, "mem_clock_hz", d->mem_clock_hz) && add_num(o, "bus_bits", d->bus_bits)
        && add_num(o, "cuda_runtime", d->runtime_version) && add_num(o, "driver", d->driver_version)
        && add_num(o, "nccl", d->nccl_version) && add_num(o, "flops_per_cycle_per_sm", p->flops_per_cycle)
        && add_num(o, "kernel_launch_s", p->launch_s) && add_num(o, "d2d_copy_bw", d->d2d_bw)
        && add_num(ew, "array_bytes", p->stream_bytes) && add_num(ew, "add_inplace_bw", p->ew_add_bw)
        && add_num(ew, "swiglu_bw", p->ew_swiglu_bw) && add_num(ew, "rmsnorm_bw", p->ew_rmsnorm_bw)
        && add_num(ew, "combined_bw", p->ew_bw) && add_num(ew, "layernorm_bw", p->ew.bw[COST_EW_LAYERNORM][0])
        && add_num(ew, "layernorm_bwd_bw", p->ew.bw[COST_EW_LAYERNORM_BWD][0])
        && add_num(mem, "total_bytes", p->phys_bytes) && add_num(mem, "used_at_start_bytes", p->used_bytes);
    if (ok) { ok = add_obj(o, "elementwise", ew); ew = NULL; }
    if (ok) { ok = add_obj(o, "memory", mem); mem = NULL; }
    ok = ok && add_obj(o, "gemm", gemm_measurements(p)) && add_obj(o, "attention", attn_measurements(p));
    cJSON_Delete(ew); cJSON_Delete(mem);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

static cJSON *gpu_measurements(const cost_profile *p)
{
    if (p->cuda) return device_measurements(p);
    cJSON *o = cJSON_CreateObject(), *st = cJSON_CreateObject(), *ew = cJSON_CreateObject(), *mem = cJSON_CreateObject();
    bool ok = o && st && ew && mem && cJSON_AddStringToObject(o, "host", p->host) && cJSON_AddStringToObject(o, "date", p->date)
        && cJSON_AddBoolToObject(o, "quick", p->quick) && add_num(o, "ranks", p->ranks) && add_num(o, "cpus", p->cpus)
        && add_num(o, "blas_threads", p->blas_threads) && add_num(o, "cpu_hz", p->cpu_hz)
        && add_num(o, "core_share", p->core_share) && add_num(o, "flops_per_cycle", p->flops_per_cycle)
        && add_num(o, "kernel_launch_s", p->launch_s)
        && add_num(st, "array_bytes", p->stream_bytes) && add_num(st, "copy_bw", p->copy_bw)
        && add_num(st, "scale_bw", p->scale_bw) && add_num(st, "add_bw", p->add_bw) && add_num(st, "triad_bw", p->triad_bw)
        && add_num(ew, "add_inplace_bw", p->ew_add_bw) && add_num(ew, "swiglu_bw", p->ew_swiglu_bw)
        && add_num(ew, "rmsnorm_bw", p->ew_rmsnorm_bw) && add_num(ew, "combined_bw", p->ew_bw)
        && add_num(mem, "phys_bytes", p->phys_bytes) && add_num(mem, "used_at_start_bytes", p->used_bytes)
        && cJSON_AddStringToObject(mem, "used_from", p->used_from_meminfo ? "/proc/meminfo" : "getrusage");
    if (ok) { ok = add_obj(o, "stream", st); st = NULL; }
    if (ok) { ok = add_obj(o, "elementwise", ew); ew = NULL; }
    if (ok) { ok = add_obj(o, "memory", mem); mem = NULL; }
    ok = ok && add_obj(o, "gemm", gemm_measurements(p)) && add_obj(o, "attention", attn_measurements(p));
    cJSON_Delete(st); cJSON_Delete(ew); cJSON_Delete(mem);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

cJSON *cost_profile_gpu_json(const cost_profile *p, bool with_measurements)
{
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddStringToObject(o, "schema", "dhp.gpu/1") && cJSON_AddStringToObject(o, "name", p->gpu.name)
        && add_gpu_fields(o, p);
    if (ok && with_measurements) ok = add_obj(o, "measurements", gpu_measurements(p));
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

static const char *sizes_text(const cost_profile *p, char *buf, size_t n)
{
    double lo = INFINITY, hi = 0;
    for (int i = 0; i < p->n_coll; i++) { lo = fmin(lo, p->coll[i].bytes); hi = fmax(hi, p->coll[i].bytes); }
    snprintf(buf, n, "S = %.0f B .. %.0f B (%d sizes)", p->n_coll ? lo : 0, hi, p->n_coll ? p->n_coll / (p->mpi ? 5 : 1) : 0);
    return buf;
}

static cJSON *link_json(const cost_profile *p, bool intra)
{
    char how[1024], src[1400], sz[96];
    sizes_text(p, sz, sizeof sz);
    if (!intra)
        snprintf(how, sizeof how, "not measured: dhp profile sees one host; a copy of intra so that the 1-node file "
                                  "loads (a 1-node pool never uses its inter link)");
    else if (p->mpi && p->cuda)
        snprintf(how, sizeof how, "%d GPUs of this host, one rank each: weighted least-squares fit (relative error, rms "
                 "%.1f%%) of t = steps * alpha_s + S * factor / busbw (nccl-tests factors: all-reduce 2(n-1) steps, "
                 "2(n-1)/n; all-gather, reduce-scatter, all-to-all n-1, (n-1)/n; send/recv 1, 1) jointly over "
                 "the executor's communicator (ex_comm over NCCL %d: ncclAllReduce, ncclAllGather, ncclReduceScatter, "
                 "grouped ncclSend/ncclRecv all-to-all, a ring isend/irecv exchange), %s, slowest rank, best of 3 trials; per-operation fits and the raw "
                 "table under measurements", p->ranks, 100 * p->link.rms_rel, p->dev.nccl_version, sz);
    else if (p->cuda)
        snprintf(how, sizeof how, "1 process (not under mpirun): the backend's device-to-device copy of %s stands in "
                 "for a send to oneself, least-squares fit (relative error, rms %.1f%%) of t = alpha_s + S / busbw; no "
                 "link between GPUs measured (run one rank per GPU under mpirun)", sz, 100 * p->link.rms_rel);
    else if (p->mpi)
        snprintf(how, sizeof how, "%d ranks on this host: weighted least-squares fit (relative error, rms %.1f%%) of "
                 "t = steps * alpha_s + S * factor / busbw (nccl-tests factors: all-reduce 2(n-1) steps, 2(n-1)/n; "
                 "all-gather, reduce-scatter, all-to-all n-1, (n-1)/n; send/recv 1, 1) jointly over the "
                 "executor's communicator (ex_comm over MPI: all-reduce, all-gather, reduce-scatter, all-to-all and a ring "
                 "isend/irecv exchange), %s, slowest rank, "
                 "best of 3 trials; per-operation fits and the raw table under measurements",
                 p->ranks, 100 * p->link.rms_rel, sz);
    else
        snprintf(how, sizeof how, "1 process (not under mpirun): a send/recv to oneself, measured as memcpy of %s, "
                 "least-squares fit (relative error, rms %.1f%%) of t = alpha_s + S / busbw; no inter-process link measured",
                 sz, 100 * p->link.rms_rel);
    source_text(p, src, sizeof src, ", %s", how);
    cJSON *o = cJSON_CreateObject();
    if (o && add_num(o, "busbw", p->link.busbw) && add_num(o, "alpha_s", p->link.alpha_s)
        && cJSON_AddStringToObject(o, "source", src))
        return o;
    cJSON_Delete(o);
    return NULL;
}

static cJSON *fit_json(const cost_profile_fit *f)
{
    cJSON *o = cJSON_CreateObject();
    if (o && add_num(o, "alpha_s", f->alpha_s) && add_num(o, "busbw", f->busbw) && add_num(o, "rms_rel", f->rms_rel)
        && add_num(o, "points", f->points))
        return o;
    cJSON_Delete(o);
    return NULL;
}

static const char *coll_method(const cost_profile *p)
{
    if (p->cuda)
        return p->mpi ? "the executor's communicator (NCCL) between the ranks' GPUs, slowest rank, best of 3 trials"
                      : "the backend's device-to-device copy in one process, best of 3 trials";
    return p->mpi ? "the executor's communicator (MPI) over all ranks, slowest rank, best of 3 trials"
                  : "memcpy in one process, best of 3 trials";
}

static cJSON *coll_measurements(const cost_profile *p)
{
    cJSON *o = cJSON_CreateObject(), *rows = cJSON_CreateArray(), *fits = cJSON_CreateObject();
    bool ok = o && rows && fits && add_num(o, "ranks", p->ranks)
        && cJSON_AddStringToObject(o, "method", coll_method(p));
    for (int i = 0; ok && i < p->n_coll; i++) {
        const cost_profile_coll *c = &p->coll[i];
        double steps, x;
        cost_profile_op_terms(c->op, c->bytes, p->ranks, &steps, &x);
        cJSON *r = cJSON_CreateObject();
        ok = r && cJSON_AddStringToObject(r, "op", cost_profile_op_name(c->op)) && add_num(r, "bytes", c->bytes)
            && add_num(r, "seconds", c->seconds) && add_num(r, "algbw", c->bytes / c->seconds)
            && add_num(r, "busbw", x / c->seconds);
        if (!ok || !cJSON_AddItemToArray(rows, r)) { cJSON_Delete(r); ok = false; }
    }
    for (int op = 0; ok && op < COST_PROF_NOPS; op++)
        if (p->fit[op].valid) ok = add_obj(fits, cost_profile_op_name((cost_prof_op)op), fit_json(&p->fit[op]));
    ok = ok && add_obj(fits, "joint", fit_json(&p->link));
    if (ok) { ok = add_obj(o, "collectives", rows); rows = NULL; }
    if (ok) { ok = add_obj(o, "fits", fits); fits = NULL; }
    cJSON_Delete(rows);
    cJSON_Delete(fits);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* {"value": [speed with 1..ranks computing], "source": ...} */
static cJSON *speed_json(const cost_profile *p)
{
    char who_[320];
    who(p, who_, sizeof who_);
    char src[1400];
    source_text(p, src, sizeof src,
                ", one rank's compute speed while k = 1..%d ranks of its processor set "
                "(compute_sets; without it, the host) compute at once, relative to one alone (the condition of the gpu "
                "figures): k ranks run units of an executor-like mix (a 256x256x64 cblas_sgemm, the executor's attention "
                "forward s=128 H=4 d=16, a residual add of 2^18 floats; one unit %.3g ms on rank 0 alone) for one common %.0f ms window (its start "
                "sent ahead by rank 0, the busy ranks sleeping until it), the others wait in MPI_Allreduce as the executor's "
                "idle ranks wait in MPI_Wait; mean rate of the busy ranks over the rate of "
                "one alone in the windows just before and after (the same state of the host), median of %d trials, capped at 1; %s",
                p->n_speed, 1e3 * p->sharing_unit_s, 40.0, p->quick ? COST_PROF_SHARING_TRIALS / 2 : COST_PROF_SHARING_TRIALS, who_);
    return sourced(cJSON_CreateDoubleArray(p->speed, p->n_speed), src);
}

/* {"value": seconds, "source": ...} (cost_pool.handoff_s) */
static cJSON *handoff_json(const cost_profile *p)
{
    char src[900];
    source_text(p, src, sizeof src,
                ", the time a rank that waited in MPI (polling, yielding its CPU) takes to "
                "get its CPU back from a set-mate that computes: rank 0 computes %.0f us then exchanges 8 bytes with rank "
                "%d (bound elsewhere), over and over, while its set-mate rank %d runs the compute_speed mix without a "
                "pause (mean round trip %.3f ms over %d exchanges, median of %d windows) and while the mate waits in MPI "
                "too (%.4f ms); the difference. The simulator gives a rank that waits every interval of compute "
                "min(interval, this) of a shared CPU against a mate's min(its interval, this)",
                1e6 * COST_PROF_HANDOFF_WORK_S, p->handoff_partner, p->handoff_mate, 1e3 * p->handoff_busy_rtt_s,
                p->handoff_exchanges, p->quick ? 1 : COST_PROF_HANDOFF_TRIALS, 1e3 * p->handoff_idle_rtt_s);
    return sourced(cJSON_CreateNumber(p->handoff_s), src);
}

/* {"value": fraction, "source": ...} (cost_pool.overlap) */
static cJSON *overlap_json(const cost_profile *p)
{
    char src[700];
    source_text(p, src, sizeof src,
                " over %d ranks: an ex_comm_iallgather (MPI_Iallgather) of %u KiB per rank, compute without "
                "MPI calls for as long as the all-gather alone takes (%.1f us), then ex_comm_wait, as dhp's ZeRO strategies "
                "prefetch a unit: alone %.1f us, compute alone %.1f us, both %.1f us (best of %d, slowest rank); the "
                "fraction of the collective hidden",
                p->ranks, COST_PROF_OVERLAP_BYTES >> 10, 1e6 * p->overlap_coll_s, 1e6 * p->overlap_coll_s,
                1e6 * p->overlap_compute_s, 1e6 * p->overlap_both_s, COST_PROF_OVERLAP_TRIALS);
    return sourced(cJSON_CreateNumber(p->overlap), src);
}

/* {"value": [lowest rank of each rank's processor set], "source": ...} */
static cJSON *sets_json(const cost_profile *p)
{
    char src[512], cpus[256] = "";
    size_t u = 0;
    for (int r = 0; r < p->ranks && r < COST_MAX_SPEED && u < sizeof cpus; r++)
        u += (size_t)snprintf(cpus + u, sizeof cpus - u, "%s%d", r ? "," : "", p->bound_cpu[r]);
    source_text(p, src, sizeof src, ", each rank's CPU binding (sched_getaffinity: %s; -1 "
                "unbound): ranks bound to one CPU share it, the others share the host", cpus);
    int v[COST_MAX_SPEED];
    for (int r = 0; r < p->ranks && r < COST_MAX_SPEED; r++) v[r] = p->set_of[r];
    return sourced(cJSON_CreateIntArray(v, p->ranks < COST_MAX_SPEED ? p->ranks : COST_MAX_SPEED), src);
}

/* The per-operation fits as the pool's intra_ops (cost_pool.intra_op): each
 * collective priced by its own alpha and busbw inside the node. */
static cJSON *intra_ops_json(const cost_profile *p)
{
    static const struct { cost_prof_op prof; cost_coll op; } map[] = {
        {COST_PROF_ALLREDUCE, COST_ALLREDUCE}, {COST_PROF_ALLGATHER, COST_ALLGATHER},
        {COST_PROF_REDUCESCATTER, COST_REDUCESCATTER}, {COST_PROF_ALLTOALL, COST_ALLTOALL}};
    char src[512];
    source_text(p, src, sizeof src, ", each collective's own weighted least-squares fit of "
                "t = steps * alpha_s + S * factor / busbw over its sizes (the per-operation fits under measurements); the "
                "cost model prices these operations inside a node with them, the rest with intra");
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddStringToObject(o, "source", src);
    for (size_t i = 0; ok && i < sizeof map / sizeof *map; i++) {
        const cost_profile_fit *f = &p->fit[map[i].prof];
        if (!f->valid) continue;
        cJSON *l = cJSON_CreateObject();
        ok = l && add_num(l, "busbw", f->busbw) && add_num(l, "alpha_s", f->alpha_s)
            && cJSON_AddItemToObject(o, cost_coll_name(map[i].op), l);
        if (!ok) cJSON_Delete(l);
    }
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

cJSON *cost_profile_cluster_json(const cost_profile *p)
{
    char name[COST_NAME_LEN];
    snprintf(name, sizeof name, "%s-%d", p->cuda ? "cuda" : "cpu", p->ranks);
    cJSON *o = cJSON_CreateObject(), *pools = cJSON_CreateArray(), *pool = cJSON_CreateObject();
    bool ok = o && pools && pool && cJSON_AddStringToObject(o, "schema", "dhp.cluster/1") && cJSON_AddStringToObject(o, "name", name)
        && cJSON_AddStringToObject(pool, "name", p->cuda ? "cuda" : "cpu") && add_obj(pool, "gpu", cost_profile_gpu_json(p, false))
        && add_num(pool, "nodes", 1) && add_num(pool, "gpus_per_node", p->ranks)
        && add_obj(pool, "intra", link_json(p, true)) && add_obj(pool, "inter", link_json(p, false))
        && (p->n_speed == 0 || add_obj(pool, "compute_speed", speed_json(p)))
        && (p->n_sets <= 1 || add_obj(pool, "compute_sets", sets_json(p)))
        && (!(p->handoff_s > 0) || p->n_speed == 0 || add_obj(pool, "compute_handoff_s", handoff_json(p)))
        && (!p->has_overlap || add_obj(pool, "collective_overlap", overlap_json(p)))
        && (!p->mpi || add_obj(pool, "intra_ops", intra_ops_json(p)));
    if (ok) { ok = cJSON_AddItemToArray(pools, pool); if (ok) pool = NULL; }
    if (ok) { ok = add_obj(o, "pools", pools); pools = NULL; }
    ok = ok && add_obj(o, "measurements", coll_measurements(p));
    cJSON_Delete(pool);
    cJSON_Delete(pools);
    if (ok) return o;
    cJSON_Delete(o);
    return NULL;
}

/* Serialise, parse back with the loader (kind 'g' GPU, 'c' cluster), write atomically. */
static int write_checked(cJSON *doc, char kind, const char *path, char *err)
{
    if (!doc) return util_fail(err, UTIL_ENOMEM, "%s: out of memory building the JSON", path);
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    if (!text) return util_fail(err, UTIL_ENOMEM, "%s: out of memory serialising the JSON", path);
    size_t len = strlen(text);
    char *buf = util_malloc(len + 2);
    int rc = buf ? UTIL_OK : util_fail(err, UTIL_ENOMEM, "%s: out of memory", path);
    if (!rc) {
        memcpy(buf, text, len);
        buf[len] = '\n';
        buf[len + 1] = '\0';
        cost_gpu g;
        cost_cluster c;
        rc = kind == 'g' ? cost_gpu_parse_json(buf, path, &g, err) : cost_cluster_parse_json(buf, path, &c, err);
        if (!rc) rc = util_write_atomic(path, buf, len + 1, err);
    }
    util_free(buf);
    cJSON_free(text);
    return rc;
}

int cost_profile_write(const cost_profile *p, const char *gpu_path, const char *cluster_path, char *err)
{
    int rc = UTIL_OK;
    if (gpu_path) rc = write_checked(cost_profile_gpu_json(p, true), 'g', gpu_path, err);
    if (!rc && cluster_path) rc = write_checked(cost_profile_cluster_json(p), 'c', cluster_path, err);
    return rc;
}
