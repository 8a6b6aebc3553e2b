/* dhp profile: measure this host's CPU backend (or, with --backend cuda, its
 * GPUs) through profile/ and write a dhp.gpu/1 file and a one-node dhp.cluster/1 file for the
 * planner and the simulator. Run under mpirun to measure the collectives
 * between ranks. */
#include "cli/cli.h"
#include "executor/backend.h"
#include "profile/profile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const char *profile_help =
    "usage: dhp profile [--backend cpu|cuda|auto] [--tf32] [-o GPU.json] [--cluster-out CLUSTER.json] [--quick] [--json]\n"
    "\n"
    "Measures the local CPU backend: fp32 GEMMs (its linear_forward) over the tiny / 100M model shapes,\n"
    "the executor's attention kernels, STREAM and element-wise memory bandwidth, the fixed cost of a\n"
    "BLAS call, physical memory (rank 0 measuring while the others wait), how ranks sharing cores slow\n"
    "each other (bind them as the real run will, e.g. mpirun --bind-to core:overload-allowed), and -\n"
    "under mpirun - all-reduce, all-gather, reduce-scatter, all-to-all and send/recv between the ranks\n"
    "(without mpirun: a memcpy stands in for a send to oneself).\n"
    "With --backend cuda it measures this host's GPUs instead, one rank per GPU (the rank on its node):\n"
    "the CUDA backend's own GEMMs (fp32 linear_forward and bf16-mixed's linear_forward_bf16, what dhp run\n"
    "executes), attention (fp32 and bf16) and element-wise kernels, device-to-device copies, the launch\n"
    "cost, device memory and - under mpirun - the communicator's NCCL collectives between the GPUs:\n"
    "the interfaces dhp run uses.\n"
    "Every field's source says how it was measured (costdb/SCHEMA.md, \"Measured files\").\n"
    "\n"
    "  --backend B         cpu (default), cuda, or auto (cuda where a device is usable, as dhp run)\n"
    "  --tf32              also time the GEMM grid on TF32 tensor cores (as dhp run --tf32) and write\n"
    "                      peak_flops_tf32, the rate dhp plan --tf32 prices fp32 GEMMs at (a GPU backend only)\n"
    "  -o FILE             write the description of one rank (schema dhp.gpu/1)\n"
    "  --cluster-out FILE  write a cluster 'cpu-<ranks>' (cuda: 'cuda-<ranks>'): 1 node x <ranks>, the GPU inline, the intra\n"
    "                      link fitted to the collectives (use with dhp plan --cluster FILE)\n"
    "  --quick             a few seconds instead of about 40 s (fewer shapes and trials, smaller buffers)\n"
    "  --json              print the GPU and cluster JSON on stdout instead of the summary\n"
    "\n"
    "example: OPENBLAS_NUM_THREADS=1 mpirun -np 2 dhp profile -o cpu.json --cluster-out cpu-2.json\n"
    "         mpirun -np 8 dhp profile --backend cuda -o gpu.json --cluster-out node.json\n";

/* Fails early (before a minute of measuring) if path's directory cannot take a new file. */
static int check_writable(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) util_strlcpy(dir, ".", sizeof dir);
    else if (slash == path) util_strlcpy(dir, "/", sizeof dir);
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    if (access(dir, W_OK) != 0)
        return cli_usage_error("profile", "cannot write %s: %s: %s", path, dir, strerror(errno));
    return 0;
}

/* Largest relative difference from the CPU backend the CUDA kernels may
 * show before their timings are refused: fp32 sums in another order differ
 * by ~1e-6 of the largest value; a wrong index is off by O(1). */
#define CUDA_CHECK_TOLERANCE 1e-4

static double cuda_check_worst;
static char cuda_check_what[96];

static int best_gemm(const cost_profile *p)
{
    int best = 0;
    for (int i = 1; i < p->n_gemm; i++)
        if (p->gemm[i].rate > p->gemm[best].rate) best = i;
    return best;
}

static void print_collectives(const cost_profile *p)
{
    for (int op = 0; op < COST_PROF_NOPS; op++)
        if (p->fit[op].valid)
            printf("  %-15s alpha %.3g us, busbw %.2f GB/s (rms %.0f%%, %d sizes)\n", cost_profile_op_name((cost_prof_op)op),
                   p->fit[op].alpha_s * 1e6, p->fit[op].busbw / 1e9, 100 * p->fit[op].rms_rel, p->fit[op].points);
}

/* A few of the per-kernel element-wise rates, as ns per fp32 element (all are in the file). */
static void print_elementwise(const cost_ew_table *T)
{
    static const cost_ew shown[] = {COST_EW_ADD, COST_EW_RMSNORM, COST_EW_ROPE, COST_EW_SWIGLU, COST_EW_SWIGLU_BWD,
                                    COST_EW_GELU, COST_EW_CE};
    if (T->n != COST_EW_SIZES) return;
    printf("  %-15s ns per element at %.0fK / %.0fM elements:", "element-wise", T->elements[0] / 1e3, T->elements[1] / 1e6);
    for (size_t i = 0; i < sizeof shown / sizeof *shown; i++) {
        double per = cost_ew_accesses(shown[i]) * 4 * 1e9;
        printf("%s %s %.3g/%.3g", i ? "," : "", cost_ew_name(shown[i]), per / T->bw[shown[i]][0], per / T->bw[shown[i]][1]);
    }
    printf("\n");
}

static void print_summary_cuda(const cost_profile *p, const char *gpu_path, const char *cluster_path)
{
    const cost_gpu *g = &p->gpu;
    const cost_profile_device *d = &p->dev;
    char mem[32], res[32];
    int best = best_gemm(p);
    printf("dhp profile: %s, %s, %d rank%s, %s (sm_%d%d, %d SMs, %.0f MHz), %d GPU%s on the host, backend %s%s\n", p->host,
           p->date, p->ranks, p->ranks > 1 ? "s" : "", d->name, d->cc_major, d->cc_minor, d->sms, d->clock_hz / 1e6,
           d->devices, d->devices > 1 ? "s" : "", d->backend, p->quick ? ", quick" : "");
    if (p->n_gemm)
        printf("  %-15s best %.1f TFLOP/s (%dx%dx%d); fit %.1f TFLOP/s large-shape, gemm_half %.0f (rms %.0f%%)\n",
               "gemm fp32", p->gemm[best].rate / 1e12, p->gemm[best].m, p->gemm[best].n,
               p->gemm[best].k, p->gemm_rate_max / 1e12, g->gemm_half, 100 * p->gemm_fit_rms);
    if (p->tf32)
        printf("  %-15s peak_flops_tf32 %.3g TFLOP/s (fit to the same shapes on TF32 tensor cores, rms %.0f%%)\n",
               "gemm tf32", g->peak_flops_tf32 / 1e12, 100 * p->tf32_fit_rms);
    if (g->gemm_bf16.measured) {
        printf("  %-15s best %.3g TFLOP/s, the same %d shapes through linear_forward_bf16 (gemm_bf16)", "gemm bf16",
               p->gemm_bf16_best / 1e12, p->n_gemm);
        if (d->clock_hz > 0 && d->sms > 0)   /* the peak its rounding gives, what plans quote MFU against */
            printf("; peak %.4g TFLOP/s (%g FLOP/cycle/SM), what plans quote MFU against", g->gemm_bf16.peak_flops / 1e12,
                   g->gemm_bf16.peak_flops / (d->clock_hz * d->sms));
        printf("\n");
    }
    if (p->flops_per_cycle > 0)
        printf("  %-15s %.1f TFLOP/s (%g FLOP/cycle/SM), gemm_eff_max %.3f\n", "peak", g->peak_flops / 1e12,
               p->flops_per_cycle, g->gemm_eff_max);
    else
        printf("  %-15s %.3g TFLOP/s (no clock known: the best measured rate), gemm_eff_max %.3f\n", "peak",
               g->peak_flops / 1e12, g->gemm_eff_max);
    printf("  %-15s attn_eff %.4f + %.3g ns fwd, %.3g ns bwd per score + %.3g ns fwd, %.3g ns bwd per row (rms %.0f%%, "
           "%d shapes)\n", "attention", g->attn_eff, g->attn_score_s * 1e9, g->attn_bwd_score_s * 1e9, g->attn_row_s * 1e9,
           g->attn_bwd_row_s * 1e9, 100 * p->attn_fit_rms, p->n_attn);
    const cost_attn_terms *a16 = &g->attn_bf16;
    if (a16->measured)
        printf("  %-15s %.3g TFLOP/s on the products + %.3g ns fwd, %.3g ns bwd per score + %.3g ns fwd, %.3g ns bwd per "
               "row (rms %.0f%%, the same shapes; attn_bf16)\n", "attention bf16", a16->flop_s > 0 ? 1e-12 / a16->flop_s : INFINITY,
               a16->score_s * 1e9, a16->bwd_score_s * 1e9, a16->row_s * 1e9, a16->bwd_row_s * 1e9, 100 * p->attn_bf16_fit_rms);
    printf("  %-15s hbm_bw %.0f GB/s, device copy %.0f GB/s; element-wise %.0f GB/s, mem_eff %.3f\n", "memory bw",
           g->hbm_bw / 1e9, d->d2d_bw / 1e9, p->ew_bw / 1e9, g->mem_eff);
    printf("  %-15s %s, %s reserved\n", "memory", util_fmt_bytes(g->hbm_bytes, mem, sizeof mem),
           util_fmt_bytes(g->reserved_bytes, res, sizeof res));
    printf("  %-15s %.3g us per kernel\n", "launch", g->kernel_launch_s * 1e6);
    printf("  %-15s match the CPU backend within %.2g of the largest value (worst: %s)\n", "cuda kernels",
           cuda_check_worst, cuda_check_what);
    print_collectives(p);
    printf("  %-15s alpha %.3g us, busbw %.2f GB/s%s\n", "intra link", p->link.alpha_s * 1e6, p->link.busbw / 1e9,
           p->mpi ? " (NCCL, joint fit)" : " (1 rank: device copy)");
    if (gpu_path) printf("wrote %s\n", gpu_path);
    if (cluster_path) printf("wrote %s\n", cluster_path);
}

/* How the ranks of one core share it (compute_speed, compute_handoff_s). */
static void print_sharing(const cost_profile *p)
{
    if (p->n_speed < 2) return;
    printf("  %-15s speed per rank with 1..%d of a core's ranks computing:", "sharing", p->n_speed);
    for (int k = 0; k < p->n_speed; k++) printf(" %.3g", p->speed[k]);
    if (p->handoff_s > 0)
        printf("; a rank that waited gets its core back from a computing mate after %.3g ms", p->handoff_s * 1e3);
    printf("\n");
}

static void print_summary(const cost_profile *p, const char *gpu_path, const char *cluster_path)
{
    if (p->cuda) { print_summary_cuda(p, gpu_path, cluster_path); return; }
    const cost_gpu *g = &p->gpu;
    char mem[32], res[32];
    int best = best_gemm(p);
    printf("dhp profile: %s, %s, %d rank%s, %d CPUs, %d BLAS thread%s per rank%s\n", p->host, p->date, p->ranks,
           p->ranks > 1 ? "s" : "", p->cpus, p->blas_threads, p->blas_threads > 1 ? "s" : "", p->quick ? ", quick" : "");
    printf("  %-15s %s\n", "device", g->name);
    if (p->n_gemm)
        printf("  %-15s best %.1f GFLOP/s (%dx%dx%d); fit %.1f GFLOP/s large-shape, gemm_half %.1f (rms %.0f%%)\n",
               "gemm fp32", p->gemm[best].rate / 1e9, p->gemm[best].m, p->gemm[best].n, p->gemm[best].k,
               p->gemm_rate_max / 1e9, g->gemm_half, 100 * p->gemm_fit_rms);
    if (p->flops_per_cycle > 0)
        printf("  %-15s %.1f GFLOP/s (%g FLOP/cycle x %.0f MHz x %.3g cores), gemm_eff_max %.3f\n", "peak",
               g->peak_flops / 1e9, p->flops_per_cycle, p->cpu_hz / 1e6, p->core_share, g->gemm_eff_max);
    else
        printf("  %-15s %.1f GFLOP/s (no clock known: the best measured rate), gemm_eff_max %.3f\n", "peak", g->peak_flops / 1e9,
               g->gemm_eff_max);
    printf("  %-15s %.2f GFLOP/s on the FLOPs (attn_eff %.4f) + %.3g ns fwd, %.3g ns bwd per score + %.3g ns fwd, %.3g ns "
           "bwd per row (rms %.0f%%, %d shapes)\n", "attention", g->attn_eff * g->peak_flops / 1e9, g->attn_eff,
           g->attn_score_s * 1e9, g->attn_bwd_score_s * 1e9, g->attn_row_s * 1e9, g->attn_bwd_row_s * 1e9,
           100 * p->attn_fit_rms, p->n_attn);
    printf("  %-15s triad %.1f GB/s, best STREAM %.1f GB/s (hbm_bw); element-wise %.1f GB/s, mem_eff %.3f\n", "memory bw",
           p->triad_bw / 1e9, g->hbm_bw / 1e9, p->ew_bw / 1e9, g->mem_eff);
    print_elementwise(&g->ew);
    printf("  %-15s %s per rank, %s reserved\n", "memory", util_fmt_bytes(g->hbm_bytes, mem, sizeof mem),
           util_fmt_bytes(g->reserved_bytes, res, sizeof res));
    printf("  %-15s %.3g us per BLAS call\n", "launch", g->kernel_launch_s * 1e6);
    print_sharing(p);
    print_collectives(p);
    printf("  %-15s alpha %.3g us, busbw %.2f GB/s%s\n", "intra link", p->link.alpha_s * 1e6, p->link.busbw / 1e9,
           p->mpi ? " (joint fit)" : " (1 rank: memcpy)");
    if (p->has_overlap)
        printf("  %-15s %.0f%% of a non-blocking all-gather hidden by compute (%.1f us alone, %.1f us with as much compute)\n",
               "overlap", 100 * p->overlap, p->overlap_coll_s * 1e6, p->overlap_both_s * 1e6);
    if (gpu_path) printf("wrote %s\n", gpu_path);
    if (cluster_path) printf("wrote %s\n", cluster_path);
}

static void print_json(const cost_profile *p)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON *g = cost_profile_gpu_json(p, true), *c = cost_profile_cluster_json(p);
    if (!doc || !g || !c || !cJSON_AddItemToObject(doc, "gpu", g)) { cJSON_Delete(g); cJSON_Delete(c); cJSON_Delete(doc); return; }
    if (!cJSON_AddItemToObject(doc, "cluster", c)) cJSON_Delete(c);
    cli_emit_json(doc);
}

static int check_cuda_kernels(char *err)
{
    int rc = ex_cuda_check(&cuda_check_worst, cuda_check_what, sizeof cuda_check_what, err);
    if (rc) return rc;
    if (!(cuda_check_worst <= CUDA_CHECK_TOLERANCE))
        return util_fail(err, UTIL_ERUNTIME, "the CUDA kernel %s differs from the CPU backend by %.3g of its largest value "
                         "(allowed %g): not timing wrong kernels", cuda_check_what, cuda_check_worst, CUDA_CHECK_TOLERANCE);
    return UTIL_OK;
}

int cmd_profile(int argc, char **argv)
{
    const char *gpu_path = NULL, *cluster_path = NULL, *backend = "cpu";
    prof_opts o = { .quick = false };
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(profile_help, stdout); return 0; }
        if (!strcmp(a, "--quick")) o.quick = true;
        else if (!strcmp(a, "--tf32")) o.tf32 = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--backend")) {
            if (i + 1 >= argc) return cli_usage_error("profile", "--backend needs cpu, cuda or auto");
            backend = argv[++i];
            if (strcmp(backend, "cpu") && strcmp(backend, "cuda") && strcmp(backend, "auto"))
                return cli_usage_error("profile", "unknown backend '%s' (cpu, cuda or auto)", backend);
        }
        else if (!strcmp(a, "-o") || !strcmp(a, "--cluster-out")) {
            if (i + 1 >= argc || !argv[i + 1][0]) return cli_usage_error("profile", "%s needs a file name", a);
            if (!strcmp(a, "-o")) gpu_path = argv[++i];
            else cluster_path = argv[++i];
        } else {
            return cli_usage_error("profile", "unknown option '%s'", a);
        }
    }
    if (gpu_path && cluster_path && !strcmp(gpu_path, cluster_path))
        return cli_usage_error("profile", "-o and --cluster-out name the same file '%s'", gpu_path);
    if ((gpu_path && check_writable(gpu_path)) || (cluster_path && check_writable(cluster_path))) return 2;
    cost_profile p;
    memset(&p, 0, sizeof p);
    char err[UTIL_ERR_LEN], why[UTIL_ERR_LEN];
    /* the backend dhp run would use (executor/backend_pick.c) */
    o.be = ex_backend_pick(backend, why, sizeof why, err);
    int rc = o.be ? UTIL_OK : UTIL_ERUNTIME;
    if (o.be && o.be != ex_backend_cpu()) o.check_kernels = check_cuda_kernels;
    if (!rc) rc = prof_measure(&o, &p, err);
    if (rc) {
        if (p.rank == 0) fprintf(stderr, "dhp profile: %s\n", err);
        return rc == UTIL_EINVAL || rc == UTIL_EUNSUPPORTED ? 2 : 1;   /* bad input: what this backend cannot do */
    }
    if (p.rank != 0) return 0;
    if ((rc = cost_profile_write(&p, gpu_path, cluster_path, err))) {
        fprintf(stderr, "dhp profile: %s\n", err);
        return rc == UTIL_EIO ? 2 : 1;
    }
    if (json) print_json(&p);
    else { printf("%s\n", why); print_summary(&p, gpu_path, cluster_path); }
    return 0;
}
