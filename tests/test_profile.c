/* dhp profile: the fits recover known parameters from synthetic data, the
 * fitted terms are the cost model's, and the JSON it writes loads back. */
#include "test.h"
#include "tests/test_profile.h"
#include "costdb/costdb.h"
#include "planner/planner.h"
#include "profile/profile.h"

#include <stdlib.h>

static const double sizes[] = {4096, 16384, 65536, 262144, 1048576, 4194304, 16777216};
#define NSIZES ((int)(sizeof sizes / sizeof *sizes))

TEST(profile_fit_recovers_alpha_busbw_of_one_collective)
{
    const double alpha = 2.5e-6, busbw = 3.7e11;
    double a[NSIZES], x[NSIZES], t[NSIZES], al, be, rms;
    for (int i = 0; i < NSIZES; i++) {
        cost_profile_op_terms(COST_PROF_ALLREDUCE, sizes[i], 8, &a[i], &x[i]);
        t[i] = a[i] * alpha + x[i] / busbw;
    }
    CHECK_OK(cost_profile_fit_alpha_beta(a, x, t, NSIZES, &al, &be, &rms, NULL));
    CHECK_NEAR(al, alpha, 1e-9);
    CHECK_NEAR(1 / be, busbw, 1e-9);
    CHECK(rms < 1e-12);
}

TEST(profile_joint_fit_recovers_alpha_busbw_over_all_operations)
{
    const double alpha = 1.3e-6, busbw = 9.1e9;
    double a[5 * NSIZES], x[5 * NSIZES], t[5 * NSIZES], al, be;
    int n = 0;
    for (int op = COST_PROF_ALLREDUCE; op <= COST_PROF_SENDRECV; op++)
        for (int i = 0; i < NSIZES; i++, n++) {
            cost_profile_op_terms((cost_prof_op)op, sizes[i], 3, &a[n], &x[n]);
            t[n] = a[n] * alpha + x[n] / busbw;
        }
    CHECK_OK(cost_profile_fit_alpha_beta(a, x, t, n, &al, &be, NULL, NULL));
    CHECK_NEAR(al, alpha, 1e-9);
    CHECK_NEAR(1 / be, busbw, 1e-9);
}

TEST(profile_fit_clamps_a_negative_latency_to_zero)
{
    /* t = S / B - 1 us for large S: the unconstrained fit wants alpha < 0. */
    double a[NSIZES], x[NSIZES], t[NSIZES], al, be;
    for (int i = 0; i < NSIZES; i++) { a[i] = 1; x[i] = sizes[i]; t[i] = sizes[i] / 1e9 - 1e-6; }
    char err[UTIL_ERR_LEN];
    CHECK_OK(cost_profile_fit_alpha_beta(a, x, t, NSIZES, &al, &be, NULL, err));
    CHECK(al == 0);
    /* with alpha = 0 the weighted least squares slope is sum(x/t) / sum(x^2/t^2) */
    double sxt = 0, sxx = 0;
    for (int i = 0; i < NSIZES; i++) { sxt += x[i] / t[i]; sxx += x[i] * x[i] / (t[i] * t[i]); }
    CHECK_NEAR(be, sxt / sxx, 1e-12);
}

TEST(profile_fit_rejects_unusable_data)
{
    char err[UTIL_ERR_LEN];
    double a[3] = {1, 1, 1}, x[3] = {4096, 4096, 4096}, t[3] = {1e-6, 1.1e-6, 0.9e-6}, al, be;
    CHECK_EQ_INT(cost_profile_fit_alpha_beta(a, x, t, 1, &al, &be, NULL, err), UTIL_EINVAL);
    CHECK(strstr(err, "2 usable points"));
    CHECK_EQ_INT(cost_profile_fit_alpha_beta(a, x, t, 3, &al, &be, NULL, err), UTIL_EINVAL);
    CHECK(strstr(err, "proportional"));
    double z[3] = {0, 0, 0};
    CHECK_EQ_INT(cost_profile_fit_alpha_beta(a, z, t, 3, &al, &be, NULL, err), UTIL_EINVAL);
    double x2[3] = {4096, 65536, 1048576}, bad[3] = {-1, 0, NAN};
    CHECK_EQ_INT(cost_profile_fit_alpha_beta(a, x2, bad, 3, &al, &be, NULL, err), UTIL_EINVAL);
    /* times that fall with size: no positive bandwidth term */
    double falling[3] = {3e-3, 2e-3, 1e-3};
    CHECK_EQ_INT(cost_profile_fit_alpha_beta(a, x2, falling, 3, &al, &be, NULL, err), UTIL_EINVAL);
}

/* The fit's terms are the planner's: steps * alpha + xbytes / busbw equals
 * cost_collective_time on one node for every collective the fit uses. */
TEST(profile_fit_terms_are_the_cost_models)
{
    cost_pool pool;
    memset(&pool, 0, sizeof pool);
    pool.nodes = 1;
    pool.gpus_per_node = 8;
    pool.intra.alpha_s = 3e-6;
    pool.intra.busbw = 2e11;
    const cost_prof_op ops[] = {COST_PROF_ALLREDUCE, COST_PROF_ALLGATHER, COST_PROF_REDUCESCATTER, COST_PROF_ALLTOALL};
    const cost_coll colls[] = {COST_ALLREDUCE, COST_ALLGATHER, COST_REDUCESCATTER, COST_ALLTOALL};
    for (int i = 0; i < 4; i++)
        for (int n = 2; n <= 8; n *= 2) {
            double steps, x;
            cost_profile_op_terms(ops[i], 1 << 20, n, &steps, &x);
            CHECK_NEAR(steps * pool.intra.alpha_s + x / pool.intra.busbw,
                       cost_collective_time(&pool, colls[i], 1 << 20, n, n), 1e-12);
        }
    cost_cluster c;
    memset(&c, 0, sizeof c);
    c.n_pools = 1;
    c.pool[0] = pool;
    double steps, x;
    cost_profile_op_terms(COST_PROF_SENDRECV, 1 << 20, 2, &steps, &x);
    CHECK_NEAR(steps * pool.intra.alpha_s + x / pool.intra.busbw, cost_p2p_time(&c, 0, 0, true, 1 << 20), 1e-12);
}

/* The GEMM grid dhp profile measures (full mode). */
static int gemm_grid(double *m, double *n, double *k)
{
    const double ms[] = {64, 256, 1024, 4096}, nks[] = {32, 128, 512, 2048};
    int c = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 4; l++, c++) { m[c] = ms[i]; n[c] = nks[j]; k[c] = nks[l]; }
    return c;
}

TEST(profile_gemm_fit_recovers_rate_and_half)
{
    double m[64], n[64], k[64], r[64], R, h, rms;
    int c = gemm_grid(m, n, k);
    const double halves[] = {18.7, 64, 0.5, 900};
    for (int t = 0; t < 4; t++) {
        cost_gpu g = {.peak_flops = 3.3e11, .gemm_eff_max = 0.7, .gemm_half = halves[t]};
        for (int i = 0; i < c; i++) r[i] = g.peak_flops * cost_gemm_efficiency(&g, m[i], n[i], k[i]);
        CHECK_OK(cost_profile_fit_gemm(m, n, k, r, c, &R, &h, &rms, NULL));
        CHECK_NEAR(h, halves[t], 1e-6);
        CHECK_NEAR(R, g.peak_flops * g.gemm_eff_max, 1e-9);
        CHECK(rms < 1e-6);
    }
}

TEST(profile_gemm_fit_of_a_flat_rate_has_no_half)
{
    double m[64], n[64], k[64], r[64], R, h;
    int c = gemm_grid(m, n, k);
    for (int i = 0; i < c; i++) r[i] = 1.5e11;
    CHECK_OK(cost_profile_fit_gemm(m, n, k, r, c, &R, &h, NULL, NULL));
    CHECK(h == 0);
    CHECK_NEAR(R, 1.5e11, 1e-12);
}

TEST(profile_gemm_fit_rejects_bad_input)
{
    char err[UTIL_ERR_LEN];
    double m[2] = {64, 128}, n[2] = {64, 64}, k[2] = {64, 64}, r[2] = {1e9, 0}, R, h;
    CHECK_EQ_INT(cost_profile_fit_gemm(m, n, k, r, 1, &R, &h, NULL, err), UTIL_EINVAL);
    CHECK_EQ_INT(cost_profile_fit_gemm(m, n, k, r, 2, &R, &h, NULL, err), UTIL_EINVAL);
    CHECK(strstr(err, "shape 1"));
}

/* A profile filled by hand (no timing): what the JSON writers turn it into. */
static void fake_profile(cost_profile *p)
{
    memset(p, 0, sizeof *p);
    util_strlcpy(p->host, "testhost", sizeof p->host);
    util_strlcpy(p->date, "2025-01-01T00:00:00Z", sizeof p->date);
    p->ranks = 2;
    p->mpi = true;
    p->cpus = 2;
    p->blas_threads = 1;
    p->cpu_hz = 2.5e9;
    p->core_share = 1;
    p->flops_per_cycle = 64;
    p->gemm_rate_max = 1.1e11;
    p->n_gemm = 2;
    p->gemm[0] = (cost_profile_gemm){64, 32, 32, 1e-6, 2.0 * 64 * 32 * 32 / 1e-6};
    p->gemm[1] = (cost_profile_gemm){1024, 1024, 1024, 0.02, 2.0 * 1024 * 1024 * 1024 / 0.02};
    p->n_attn = 1;
    p->attn[0] = (cost_profile_attn){128, 4, 2, 16, 4.0 * 128 * 128 * 4 * 16, 1e-3, 2e-3, false, 1};
    p->stream_bytes = 1 << 25;
    p->copy_bw = p->scale_bw = p->add_bw = p->triad_bw = 2e10;
    p->ew_add_bw = p->ew_swiglu_bw = p->ew_rmsnorm_bw = p->ew_bw = 1e10;
    p->launch_s = 1e-7;
    p->phys_bytes = 16e9;
    p->used_bytes = 1e9;
    p->used_from_meminfo = true;
    p->n_coll = 2;
    p->coll[0] = (cost_profile_coll){COST_PROF_ALLREDUCE, 4096, 2e-6};
    p->coll[1] = (cost_profile_coll){COST_PROF_ALLREDUCE, 1 << 20, 1e-4};
    p->fit[COST_PROF_ALLREDUCE] = (cost_profile_fit){true, 1e-6, 1e10, 0.05, 2};
    p->link = p->fit[COST_PROF_ALLREDUCE];
    cost_gpu g = {.name = "CPU-testhost", .peak_flops = 1.6e11, .gemm_eff_max = 0.6875, .gemm_half = 12,
                  .attn_eff = 0.03, .attn_score_s = 2e-9, .attn_bwd_score_s = 3e-9, .hbm_bytes = 8e9,
                  .hbm_bw = 2e10, .mem_eff = 0.5, .reserved_bytes = 5e8, .kernel_launch_s = 1e-7};
    p->gpu = g;
}

static bool sourced_by_profile(const cJSON *o, const char *key)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(f, "source");
    return cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(f, "value")) && cJSON_IsString(s)
        && strncmp(s->valuestring, "measured by dhp profile on testhost 2025-01-01T00:00:00Z, ", 58) == 0;
}

/* Times made from known terms (1.5 ns fwd and 2 ns bwd per score, 8 and 20
 * ns per row, 20% of 1e11 FLOP/s on the FLOPs) come back from the fit, the
 * causal shapes' scores counted as the kernel computes them, s (s + 1) / 2
 * per head; a set where the FLOP term would need more than the peak is
 * pinned at attn_eff 1; shapes of one span are fitted without row terms. */
TEST(profile_attention_fit_recovers_its_terms)
{
    static const int shape[][4] = {{64, 4, 8, 0}, {256, 4, 8, 0}, {64, 4, 16, 1}, {256, 4, 16, 0}, {512, 12, 64, 1}};
    cost_profile_attn a[5];
    double peak = 1e11, per_flop = 1.0 / (0.2 * peak);
    for (int i = 0; i < 5; i++) {
        double s = shape[i][0], R = s * shape[i][1], S = R * (shape[i][3] ? (s + 1) / 2 : s), d = shape[i][2];
        a[i] = (cost_profile_attn){shape[i][0], shape[i][1], shape[i][1], shape[i][2], 4 * S * d,
                                   S * (1.5e-9 + 4 * d * per_flop) + R * 8e-9,
                                   S * (2e-9 + 2.5 * 4 * d * per_flop) + R * 2e-8, shape[i][3], 1};
    }
    cost_attn_fit f;
    char err[UTIL_ERR_LEN];
    CHECK_OK(cost_profile_fit_attention(a, 5, peak, &f, err));
    CHECK_NEAR(f.attn_eff, 0.2, 1e-9);
    CHECK_NEAR(f.score_s, 1.5e-9, 1e-9);
    CHECK_NEAR(f.bwd_score_s, 2e-9, 1e-9);
    CHECK_NEAR(f.row_s, 8e-9, 1e-9);
    CHECK_NEAR(f.bwd_row_s, 2e-8, 1e-9);
    CHECK(f.rms_rel < 1e-9);
    CHECK_OK(cost_profile_fit_attention(a, 5, 1e9, &f, err));   /* a peak below the FLOP rate */
    CHECK(f.attn_eff == 1.0 && f.score_s >= 0 && f.bwd_score_s >= 0 && f.row_s >= 0 && f.bwd_row_s >= 0);
    CHECK_EQ_INT(cost_profile_fit_attention(a, 1, peak, &f, err), UTIL_EINVAL);
    /* one span (s = 64, d = 8 and 16, no row cost): rows and scores cannot be told apart */
    cost_profile_attn one[2] = {a[0], a[0]};
    one[1].head_dim = 16;
    for (int i = 0; i < 2; i++) {
        double S = 64.0 * 64 * 4, d = one[i].head_dim;
        one[i].fwd_s = S * (1.5e-9 + 4 * d * per_flop);
        one[i].bwd_s = S * (2e-9 + 2.5 * 4 * d * per_flop);
    }
    CHECK_OK(cost_profile_fit_attention(one, 2, peak, &f, err));
    CHECK(f.row_s == 0 && f.bwd_row_s == 0);
    CHECK_NEAR(f.score_s, 1.5e-9, 1e-9);
    CHECK_NEAR(f.attn_eff, 0.2, 1e-9);
}

TEST(profile_json_loads_back_through_the_costdb_loader)
{
    cost_profile *p = malloc(sizeof *p);
    CHECK(p);
    fake_profile(p);
    char err[UTIL_ERR_LEN];
    cJSON *gj, *cj;
    char *gt, *ct;
    test_profile_files(p, true, &gj, &cj, &gt, &ct);
    const char *keys[] = {"peak_flops", "gemm_eff_max", "gemm_half", "attn_eff", "hbm_bytes", "hbm_bw",
                          "mem_eff", "reserved_bytes", "kernel_launch_s"};
    bool sourced = gj != NULL;
    for (int i = 0; sourced && i < 9; i++) sourced = sourced_by_profile(gj, keys[i]);
    bool has_meas = gj && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(gj, "measurements"))
        && cj && cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(cj, "measurements"));
    cost_gpu g;
    cost_cluster c;
    int rg = gt ? cost_gpu_parse_json(gt, "gpu", &g, err) : -1;
    int rcl = ct ? cost_cluster_parse_json(ct, "cluster", &c, err) : -1;
    test_profile_files_free(gj, cj, gt, ct);
    cost_profile want = *p;
    free(p);
    CHECK(sourced);
    CHECK(has_meas);
    CHECK_MSG(rg == 0, "gpu: %s", err);
    CHECK_MSG(rcl == 0, "cluster: %s", err);
    CHECK(memcmp(&g, &want.gpu, sizeof g) == 0);
    CHECK(strcmp(c.name, "cpu-2") == 0);
    CHECK_EQ_INT(c.n_pools, 1);
    CHECK_EQ_INT(c.pool[0].nodes, 1);
    CHECK_EQ_INT(c.pool[0].gpus_per_node, 2);
    CHECK(memcmp(&c.pool[0].gpu, &want.gpu, sizeof g) == 0);
    CHECK_NEAR(c.pool[0].intra.alpha_s, 1e-6, 1e-15);
    CHECK_NEAR(c.pool[0].intra.busbw, 1e10, 1e-15);
}

/* The handoff time (cost_pool.handoff_s) goes out sourced with what it came
 * from and loads back; unmeasured (0), the pool has none. */
TEST(profile_handoff_loads_back_and_is_absent_unmeasured)
{
    cost_profile *p = malloc(sizeof *p);
    CHECK(p);
    fake_profile(p);
    p->n_speed = 2;
    p->speed[0] = 1;
    p->speed[1] = 0.5;
    p->n_sets = 2;
    p->set_of[0] = 0;
    p->set_of[1] = 1;
    char err[UTIL_ERR_LEN];
    cost_cluster c, none;
    int rc[2];
    const char *src = NULL;
    for (int i = 0; i < 2; i++) {
        p->handoff_s = i == 0 ? 0.0015 : 0;
        p->handoff_busy_rtt_s = p->handoff_s + 2e-6;
        p->handoff_idle_rtt_s = 2e-6;
        p->handoff_mate = 2;
        p->handoff_partner = 1;
        p->handoff_exchanges = 200;
        cJSON *cj = cost_profile_cluster_json(p);
        const cJSON *h = cj ? cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(cj, "pools"), 0),
                                                                "compute_handoff_s") : NULL;
        const cJSON *hs = h ? cJSON_GetObjectItemCaseSensitive(h, "source") : NULL;
        if (i == 0 && cJSON_IsString(hs) && strstr(hs->valuestring, "mean round trip 1.502 ms over 200 exchanges"))
            src = "ok";
        if (i == 1 && h) src = NULL;
        char *ct = cj ? cJSON_Print(cj) : NULL;
        rc[i] = ct ? cost_cluster_parse_json(ct, "cluster", i == 0 ? &c : &none, err) : -1;
        cJSON_free(ct);
        cJSON_Delete(cj);
    }
    free(p);
    CHECK_MSG(rc[0] == 0 && rc[1] == 0, "%s", err);
    CHECK(src != NULL);
    CHECK(c.pool[0].handoff_s == 0.0015);
    CHECK(none.pool[0].handoff_s == 0 && none.pool[0].n_speed == 2);
}

/* Driven by tests/t_profile.sh: the files a real `dhp profile` wrote load
 * through the normal paths, and the cluster carries the same GPU. */
TEST_DRIVEN(profile_written_files_load)
{
    const char *gpath = getenv("DHP_PROFILE_GPU"), *cpath = getenv("DHP_PROFILE_CLUSTER");
    if (!gpath || !cpath) { test_skip("DHP_PROFILE_GPU / DHP_PROFILE_CLUSTER not set"); return; }
    char err[UTIL_ERR_LEN], *text = NULL;
    size_t len;
    CHECK_MSG(util_read_file(gpath, &text, &len, err) == 0, "%s", err);
    cost_gpu g;
    int rc = cost_gpu_parse_json(text, gpath, &g, err);
    util_free(text);
    CHECK_MSG(rc == 0, "%s", err);
    cost_cluster c;
    CHECK_MSG(cost_cluster_load(cpath, &c, err) == 0, "%s", err);
    CHECK(memcmp(&c.pool[0].gpu, &g, sizeof g) == 0);
    CHECK(c.pool[0].gpus_per_node >= 1 && c.pool[0].nodes == 1);
    CHECK(g.peak_flops > 0 && g.hbm_bw > 0 && c.pool[0].intra.busbw > 0);
}

/* A CUDA profile made from known terms (an H100-like device: 132 SMs at
 * 1980 MHz, HBM3 at 2619 MHz on a 5120-bit bus): cost_prof_derive turns it
 * into the fields the shipped GPU files have, and the files load back. */
/* cJSON prints a double in 15 digits where that reads back within an ulp or
 * so of it (its print_number): each number as written, to 1e-14. */
static bool near_rel(double a, double b) { return fabs(a - b) <= 1e-14 * fmax(fabs(a), fabs(b)); }

static bool gpu_loads_back(const cost_gpu *g, const cost_gpu *w)
{
    const double ga[] = {g->peak_flops, g->gemm_eff_max, g->gemm_half, g->attn_eff, g->attn_score_s,
                         g->attn_bwd_score_s, g->attn_row_s, g->attn_bwd_row_s, g->hbm_bytes, g->hbm_bw,
                         g->mem_eff, g->reserved_bytes, g->kernel_launch_s, g->sm_count};
    const double wa[] = {w->peak_flops, w->gemm_eff_max, w->gemm_half, w->attn_eff, w->attn_score_s,
                         w->attn_bwd_score_s, w->attn_row_s, w->attn_bwd_row_s, w->hbm_bytes, w->hbm_bw,
                         w->mem_eff, w->reserved_bytes, w->kernel_launch_s, w->sm_count};
    for (size_t i = 0; i < sizeof ga / sizeof ga[0]; i++)
        if (!near_rel(ga[i], wa[i])) return false;
    const cost_gemm_grid *a = &g->grid, *b = &w->grid;
    if (strcmp(g->name, w->name) || a->n_m != b->n_m || a->n_n != b->n_n || a->n_k != b->n_k || g->ew.n != w->ew.n)
        return false;
    for (int i = 0; i < a->n_m; i++) if (!near_rel(a->m[i], b->m[i])) return false;
    for (int i = 0; i < a->n_n; i++) if (!near_rel(a->n[i], b->n[i])) return false;
    for (int i = 0; i < a->n_k; i++) if (!near_rel(a->k[i], b->k[i])) return false;
    for (int i = 0; i < a->n_m * a->n_n * a->n_k; i++) if (!near_rel(a->eff[i], b->eff[i])) return false;
    for (int i = 0; i < g->ew.n; i++) {
        if (!near_rel(g->ew.elements[i], w->ew.elements[i])) return false;
        for (int k = 0; k < COST_N_EW; k++) if (!near_rel(g->ew.bw[k][i], w->ew.bw[k][i])) return false;
    }
    return true;
}

void test_profile_fake_cuda(cost_profile *p, double rate, double half)
{
    memset(p, 0, sizeof *p);
    util_strlcpy(p->host, "testhost", sizeof p->host);
    util_strlcpy(p->date, "2025-01-01T00:00:00Z", sizeof p->date);
    p->cuda = true;
    p->ranks = 2;
    p->mpi = true;
    p->dev = (cost_profile_device){.name = "NVIDIA H100 80GB HBM3", .cc_major = 9, .cc_minor = 0, .sms = 132,
                                   .devices = 8, .clock_hz = 1.98e9, .mem_clock_hz = 2.619e9, .bus_bits = 5120,
                                   .d2d_bw = 2.6e12, .runtime_version = 13000, .driver_version = 13000,
                                   .nccl_version = 22809, .backend = "cuda"};
    p->launch_s = 3e-6;
    static const int mk[] = {2048, 4096, 8192};
    const cost_gpu sms = {.sm_count = 132};   /* the rates follow the model's wave term over the device's SMs */
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            double m = mk[i], n = 2 * mk[j], k = mk[(i + j) % 3];
            double r = rate * (m / (m + half)) * (n / (n + half)) * (k / (k + half)) * cost_gemm_wave_efficiency(&sms, m, n, k);
            double s = 2 * m * n * k / r + p->launch_s;
            p->gemm[p->n_gemm++] = (cost_profile_gemm){(int)m, (int)n, (int)k, s, 2 * m * n * k / s};
        }
    static const int sh[][4] = {{1024, 16, 16, 80}, {4096, 16, 16, 80}, {1024, 40, 8, 128}, {2048, 16, 16, 64}};
    double per_flop = 1.0 / 2e13;     /* 20 TFLOP/s on the attention FLOPs */
    for (int i = 0; i < 4; i++) {
        double S = (double)sh[i][0] * sh[i][0] * sh[i][1], d = sh[i][3];
        /* a call of one sequence: its terms and the call's launch (fitted less it: the model adds it) */
        p->attn[p->n_attn++] = (cost_profile_attn){sh[i][0], sh[i][1], sh[i][2], sh[i][3], 4 * S * d,
                                                   S * (1e-11 + 4 * d * per_flop) + p->launch_s,
                                                   S * (2e-11 + 10 * d * per_flop) + p->launch_s, false, 1};
    }
    p->stream_bytes = 256.0 * 1048576;
    p->copy_bw = p->dev.d2d_bw;
    p->ew_add_bw = p->ew_swiglu_bw = p->ew_rmsnorm_bw = p->ew_bw = 2.0e12;
    p->phys_bytes = 85.0e9;
    p->used_bytes = 0.6e9;
    p->n_coll = 2;
    p->coll[0] = (cost_profile_coll){COST_PROF_ALLREDUCE, 8192, 2e-5};
    p->coll[1] = (cost_profile_coll){COST_PROF_ALLREDUCE, 1 << 28, 1.5e-3};
    p->fit[COST_PROF_ALLREDUCE] = (cost_profile_fit){true, 8e-6, 3.6e11, 0.05, 2};
    p->link = p->fit[COST_PROF_ALLREDUCE];
}

TEST(profile_cuda_fields_follow_the_device_and_load_back)
{
    cost_profile *p = malloc(sizeof *p);
    CHECK(p);
    test_profile_fake_cuda(p, 7.0e14, 96);
    char err[UTIL_ERR_LEN];
    int rc = cost_prof_derive(p, err);
    cJSON *gj, *cj;
    char *gt, *ct;
    test_profile_files(p, rc == 0, &gj, &cj, &gt, &ct);
    cost_gpu g;
    cost_cluster c;
    int rg = gt ? cost_gpu_parse_json(gt, "gpu", &g, err) : -1;
    int rcl = ct ? cost_cluster_parse_json(ct, "cluster", &c, err) : -1;
    bool nccl_src = ct && strstr(ct, "ncclAllReduce") && strstr(ct, "NCCL 22809");
    bool dev_src = gt && strstr(gt, "132 SMs") && strstr(gt, "multiProcessorCount") && strstr(gt, "fp32 linear_forward") && strstr(gt, "the cuda backend") && strstr(gt, "cudaMemGetInfo");
    test_profile_files_free(gj, cj, gt, ct);
    cost_profile want = *p;
    free(p);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_MSG(rg == 0, "gpu: %s", err);
    CHECK_MSG(rcl == 0, "cluster: %s", err);
    /* 7e14 / (1.98e9 x 132) = 2678 FLOP/cycle/SM, rounded up to 4096 */
    CHECK_MSG(fabs(want.flops_per_cycle - 4096) < 1e-9, "fpc %g rate %g half %g", want.flops_per_cycle, want.gemm_rate_max, want.gpu.gemm_half);
    CHECK_NEAR(g.peak_flops, 4096 * 1.98e9 * 132, 1e-12);
    CHECK_NEAR(g.gemm_eff_max, 7.0e14 / (4096 * 1.98e9 * 132), 1e-3);
    CHECK_NEAR(g.gemm_half, 96, 2e-2);
    CHECK_NEAR(g.sm_count, 132, 0);   /* the planner's wave model reads it (costdb/model.c) */
    CHECK_NEAR(g.hbm_bw, 2.619e9 * 2 * 5120 / 8, 1e-12);   /* 3.35 TB/s, H100 SXM's datasheet figure */
    CHECK_NEAR(g.mem_eff, 2.0e12 / (2.619e9 * 2 * 5120 / 8), 1e-12);
    CHECK_NEAR(g.hbm_bytes, 85.0e9, 1e-12);
    CHECK_NEAR(g.reserved_bytes, 0.6e9, 1e-12);
    CHECK_NEAR(g.attn_score_s, 1e-11, 1e-6);
    CHECK_NEAR(g.attn_bwd_score_s, 2e-11, 1e-6);
    CHECK_NEAR(g.attn_eff * g.peak_flops, 2e13, 1e-6);
    CHECK(strcmp(g.name, "NVIDIA H100 80GB HBM3") == 0);
    CHECK(gpu_loads_back(&g, &want.gpu));
    CHECK(nccl_src && dev_src);
    CHECK(strcmp(c.name, "cuda-2") == 0);
    CHECK_EQ_INT(c.pool[0].gpus_per_node, 2);
    CHECK_EQ_INT(c.pool[0].n_speed, 0);     /* a GPU per rank: no processor sharing */
    CHECK(!c.pool[0].has_sets);
    CHECK_EQ_INT(want.gpu.grid.n_m, 0);     /* the shapes are not a full grid */
}

/* The bf16 kernel's times of the profile's attention shapes, made from
 * known terms x scale: its products at 200 TFLOP/s, 4 and 7 ps fwd and bwd
 * per score, 3 and 9 ns per row. */
#define A16_FLOP_S (1 / 2e14)
static void fake_attn_bf16(cost_profile *p, double scale)
{
    p->attn_bf16 = true;
    for (int i = 0; i < p->n_attn; i++) {
        const cost_profile_attn *a = &p->attn[i];
        double S = cost_prof_attn_scores(a), R = (double)a->seq * a->heads, d = a->head_dim;
        p->attn_bf16_fwd_s[i] = scale * (S * (4e-12 + 4 * d * A16_FLOP_S) + R * 3e-9) + p->launch_s;
        p->attn_bf16_bwd_s[i] = scale * (S * (7e-12 + 2.5 * 4 * d * A16_FLOP_S) + R * 9e-9) + p->launch_s;
    }
}

static bool attn_terms_near(const cost_attn_terms *a, const cost_attn_terms *b)
{
    return a->measured == b->measured && near_rel(a->flop_s, b->flop_s) && near_rel(a->score_s, b->score_s)
        && near_rel(a->bwd_score_s, b->bwd_score_s) && near_rel(a->row_s, b->row_s) && near_rel(a->bwd_row_s, b->bwd_row_s);
}

/* The profile's GPU file text gt and cluster file text ct loaded back (g,
 * c), and g written by cost_gpu_to_json and read again (plain): 0 when all
 * three load (tests/test_profile.h). */
void test_profile_files(const cost_profile *p, bool made, cJSON **gj, cJSON **cj, char **gt, char **ct)
{
    *gj = made ? cost_profile_gpu_json(p, true) : NULL;
    *cj = made ? cost_profile_cluster_json(p) : NULL;
    *gt = *gj ? cJSON_Print(*gj) : NULL;
    *ct = *cj ? cJSON_Print(*cj) : NULL;
}

void test_profile_files_free(cJSON *gj, cJSON *cj, char *gt, char *ct)
{
    cJSON_free(gt);
    cJSON_free(ct);
    cJSON_Delete(gj);
    cJSON_Delete(cj);
}

int test_profile_read_back(const char *gt, const char *ct, cost_gpu *g, cost_cluster *c, cost_gpu *plain, char *err)
{
    int rc = gt ? cost_gpu_parse_json(gt, "gpu", g, err) : -1;
    if (!rc) rc = ct ? cost_cluster_parse_json(ct, "cluster", c, err) : -1;
    cJSON *pj = rc ? NULL : cost_gpu_to_json(g);
    char *pt = pj ? cJSON_Print(pj) : NULL;
    if (!rc) rc = pt ? cost_gpu_parse_json(pt, "plain", plain, err) : -1;
    cJSON_free(pt);
    cJSON_Delete(pj);
    return rc;
}

/* A GPU text with its object `key` edited by fn, parsed: the loader's verdict (err) (tests/test_profile.h). */
int test_profile_parse_edited(const char *text, const char *key, void (*fn)(cJSON *obj), char *err)
{
    cJSON *o = cJSON_Parse(text);
    if (!o) return util_fail(err, UTIL_EINVAL, "test: unparsable");
    fn(cJSON_GetObjectItemCaseSensitive(o, key));
    char *t = cJSON_Print(o);
    cost_gpu g;
    int rc = t ? cost_gpu_parse_json(t, "edited", &g, err) : UTIL_ENOMEM;
    cJSON_free(t);
    cJSON_Delete(o);
    return rc;
}
static void drop_bwd_row(cJSON *a) { cJSON_DeleteItemFromObjectCaseSensitive(a, "bwd_row_s"); }
static void negative_score(cJSON *a) { cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(a, "score_s"), -1e-12); }
static void nothing_per_score(cJSON *a)
{
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(a, "flop_s"), 0);
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(a, "score_s"), 0);
}

/* A CUDA profile with the bf16 attention's times: its fit recovers the
 * terms, the GPU and cluster files carry them ("attn_bf16", sourced, each
 * shape's bf16 times under measurements) and load back, as does the plain
 * form (cost_gpu_to_json); the loader refuses a partial, negative or
 * costless attn_bf16; a CPU profile writes none. */
TEST(profile_attn_bf16_round_trips_through_the_files)
{
    cost_profile *p = malloc(sizeof *p);
    CHECK(p);
    test_profile_fake_cuda(p, 7.0e14, 96);
    fake_attn_bf16(p, 1);
    char err[UTIL_ERR_LEN], e1[UTIL_ERR_LEN] = "", e2[UTIL_ERR_LEN] = "", e3[UTIL_ERR_LEN] = "";
    int rc = cost_prof_derive(p, err);
    cJSON *gj, *cj;
    char *gt, *ct;
    test_profile_files(p, rc == 0, &gj, &cj, &gt, &ct);
    const cJSON *a16 = cJSON_GetObjectItemCaseSensitive(gj, "attn_bf16"), *src = cJSON_GetObjectItemCaseSensitive(a16, "source");
    bool sourced = cJSON_IsString(src) && !strncmp(src->valuestring, "measured by dhp profile on testhost 2025-01-01T00:00:00Z, ", 58)
        && strstr(src->valuestring, "cuda_attention16.cuh");
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(gj, "measurements"), "attention");
    int timed = 0;
    for (int i = 0; i < cJSON_GetArraySize(rows); i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(r, "bf16_fwd_seconds"), *b = cJSON_GetObjectItemCaseSensitive(r, "bf16_bwd_seconds");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(r, "bf16_model_fwd_seconds");
        timed += cJSON_IsNumber(f) && f->valuedouble == p->attn_bf16_fwd_s[i] && cJSON_IsNumber(b)
                 && b->valuedouble == p->attn_bf16_bwd_s[i] && cJSON_IsNumber(m);
    }
    cost_gpu g, plain;
    cost_cluster c;
    int rl = test_profile_read_back(gt, ct, &g, &c, &plain, err);
    int r1 = gt ? test_profile_parse_edited(gt, "attn_bf16", drop_bwd_row, e1) : -1, r2 = gt ? test_profile_parse_edited(gt, "attn_bf16", negative_score, e2) : -1;
    int r3 = gt ? test_profile_parse_edited(gt, "attn_bf16", nothing_per_score, e3) : -1;
    test_profile_files_free(gj, cj, gt, ct);
    cost_profile want = *p;
    fake_profile(p);   /* the CPU backend: no bf16 attention, nothing written */
    cJSON *cpu = cost_profile_gpu_json(p, true);
    char *cput = cpu ? cJSON_Print(cpu) : NULL;
    bool cpu_silent = cput && !strstr(cput, "attn_bf16") && !strstr(cput, "bf16_fwd_seconds");
    cost_gpu cg;
    int rcpu = cput ? cost_gpu_parse_json(cput, "cpu", &cg, err) : -1;
    cJSON_free(cput);
    cJSON_Delete(cpu);
    free(p);
    CHECK_MSG(rc == 0 && rl == 0 && rcpu == 0, "%s", err);
    const cost_attn_terms *t = &want.gpu.attn_bf16;
    CHECK(t->measured);
    CHECK_NEAR(t->flop_s, A16_FLOP_S, 1e-6);
    CHECK_NEAR(t->score_s, 4e-12, 1e-6);
    CHECK_NEAR(t->bwd_score_s, 7e-12, 1e-6);
    CHECK_NEAR(t->row_s, 3e-9, 1e-6);
    CHECK_NEAR(t->bwd_row_s, 9e-9, 1e-6);
    CHECK(want.attn_bf16_fit_rms < 1e-9);
    CHECK_NEAR(want.gpu.attn_score_s, 1e-11, 1e-6);   /* the fp32 fit keeps the fp32 times */
    CHECK(sourced);
    CHECK_EQ_INT(timed, want.n_attn);
    CHECK(attn_terms_near(&g.attn_bf16, t));
    CHECK(attn_terms_near(&c.pool[0].gpu.attn_bf16, t));
    CHECK(attn_terms_near(&plain.attn_bf16, t));
    CHECK(cpu_silent && !cg.attn_bf16.measured);
    CHECK_MSG(r1 == UTIL_EINVAL && strstr(e1, "attn_bf16.bwd_row_s: required field is missing"), "%s", e1);
    CHECK_MSG(r2 == UTIL_EINVAL && strstr(e2, "attn_bf16.score_s: must be >= 0"), "%s", e2);
    CHECK_MSG(r3 == UTIL_EINVAL && strstr(e3, "attn_bf16: flop_s and score_s"), "%s", e3);
}

/* A 4-layer, 16-head (d = 64) LLM's micro-batch of 2 x 256 tokens on one GPU g, target t
 * (tests/test_profile.h: the profile tests' pricing checks share it). */
int test_profile_llm_micro(const cost_gpu *g, plan_precision prec, plan_target t, plan_time *out, char *err)
{
    static const char *text = "{\"schema\": \"dhp.model/1\", \"name\": \"g\", \"modules\": [{\"name\": \"llm\", "
                              "\"kind\": \"llm\", \"layers\": 4, \"hidden\": 1024, \"heads\": 16, \"ffn\": 4096, "
                              "\"vocab\": 1000}]}";
    model_t m;
    cost_cluster c;
    int rc = model_parse_json(text, "llm", &m, err);
    if (!rc) rc = cost_cluster_load("8xa100-80g", &c, err);
    if (rc) return rc;
    c.pool[0].gpu = *g;
    plan_options o;
    plan_options_default(&o);
    o.precision = prec;
    o.target = t;
    plan_workload w = {.global_batch = 2, .text_tokens = 256};
    plan_module s = {.dp = 1, .tp = 1, .sp = 1, .pp = 1, .micro_batch = 2, .recompute = PLAN_RECOMP_NONE, .n_ranks = 1};
    plan_micro_time(&m, 0, &s, &w, &c, &o, 2, out);
    return UTIL_OK;
}

/* The planner prices the dhp target's attention under bf16-mixed and
 * -autocast from the profile's bf16 times: doubling them adds, per layer,
 * the bf16 attention's price by hand (S scores x (score_s + 4 d flop_s) + R
 * rows x row_s, backward alike) and nothing under fp32, which keeps the fp32
 * kernel's fit; without attn_bf16 the bf16 precisions fall back to the
 * bf16-peak rule (FlashAttention's price). */
TEST(profile_attn_bf16_prices_the_bf16_precisions)
{
    cost_profile *p = malloc(sizeof *p);
    CHECK(p);
    char err[UTIL_ERR_LEN] = "";
    cost_gpu g1, g2;
    test_profile_fake_cuda(p, 7.0e14, 96);
    fake_attn_bf16(p, 1);
    int rc = cost_prof_derive(p, err);
    g1 = p->gpu;
    test_profile_fake_cuda(p, 7.0e14, 96);
    fake_attn_bf16(p, 2);
    if (!rc) rc = cost_prof_derive(p, err);
    g2 = p->gpu;
    free(p);
    CHECK_MSG(rc == 0, "%s", err);
    cost_gpu g0 = g1;
    g0.attn_bf16.measured = false;
    const plan_precision bf16[] = {PLAN_OPT_MIXED_FP32, PLAN_OPT_AUTOCAST};
    double R = 512.0 * 16, S = R * 128.5, d = 64;   /* causal: row r sees r + 1 of 256 keys */
    double fwd = S * (4e-12 + 4 * d * A16_FLOP_S) + R * 3e-9, bwd = S * (7e-12 + 2.5 * 4 * d * A16_FLOP_S) + R * 9e-9;
    for (int i = 0; i < 2; i++) {
        plan_time t0, t1, t2;
        CHECK_OK(test_profile_llm_micro(&g0, bf16[i], PLAN_TARGET_DHP, &t0, err));
        CHECK_OK(test_profile_llm_micro(&g1, bf16[i], PLAN_TARGET_DHP, &t1, err));
        CHECK_OK(test_profile_llm_micro(&g2, bf16[i], PLAN_TARGET_DHP, &t2, err));
        CHECK_NEAR(t2.fwd_s - t1.fwd_s, 4 * fwd, 1e-6);
        CHECK_NEAR(t2.bwd_s - t1.bwd_s, 4 * bwd, 1e-6);
        CHECK_NEAR(t0.fwd_s - t1.fwd_s, 4 * (cost_attention_forward_time(&g1, R, S, d)
                                             - cost_attention_forward_time_in(&g1, COST_ATTN_BF16, R, S, d)), 1e-6);
        CHECK(cost_attention_forward_time_in(&g0, COST_ATTN_BF16, R, S, d) == cost_attention_forward_time(&g0, R, S, d));
    }
    plan_time f1, f2;
    CHECK_OK(test_profile_llm_micro(&g1, PLAN_OPT_FP32, PLAN_TARGET_DHP, &f1, err));
    CHECK_OK(test_profile_llm_micro(&g2, PLAN_OPT_FP32, PLAN_TARGET_DHP, &f2, err));
    CHECK(f1.fwd_s == f2.fwd_s && f1.bwd_s == f2.bwd_s);
    CHECK_NEAR(cost_attention_forward_time_in(&g1, COST_ATTN_FP32, R, S, d) - g1.kernel_launch_s,
               S * (1e-11 + 4 * d / 2e13), 1e-6);   /* fake_cuda_profile's fp32 terms */
}

TEST(profile_without_a_backend_fails_with_one_clear_line)
{
    prof_opts o = {.quick = true};   /* no backend: refused before measuring anything */
    cost_profile *p = malloc(sizeof *p);
    CHECK(p);
    char err[UTIL_ERR_LEN] = "";
    int rc = prof_measure(&o, p, err);
    free(p);
    CHECK_EQ_INT(rc, UTIL_EINVAL);
    CHECK(strstr(err, "backend") != NULL);
}

/* A full grid of measured GEMMs (rates no s(m)s(n)s(k) curve fits): the
 * derived GPU prices every measured shape at its measured time. */
TEST(profile_gemm_grid_prices_measured_shapes_as_measured)
{
    cost_profile *p = malloc(sizeof *p);
    CHECK(p);
    fake_profile(p);
    static const int ms[] = {64, 256, 1024}, nks[] = {32, 256, 1024};
    p->n_gemm = 0;
    unsigned s = 7;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            for (int l = 0; l < 3; l++) {
                s = s * 1664525u + 1013904223u;
                double m = ms[i], n = nks[j], k = nks[l], rate = 1e11 * (0.5 + 0.5 * (s >> 8) / 16777216.0);
                double t = 2 * m * n * k / rate + p->launch_s;
                p->gemm[p->n_gemm++] = (cost_profile_gemm){ms[i], nks[j], nks[l], t, 2 * m * n * k / t};
            }
    static const int sh[][3] = {{64, 4, 8}, {256, 4, 8}, {64, 4, 16}, {256, 4, 16}};
    p->n_attn = 4;
    for (int i = 0; i < 4; i++) {
        double S = (double)sh[i][0] * sh[i][0] * sh[i][1], d = sh[i][2];
        p->attn[i] = (cost_profile_attn){sh[i][0], sh[i][1], sh[i][1], sh[i][2], 4 * S * d, S * (2e-9 + 4 * d / 2e10),
                                         S * (3e-9 + 10 * d / 2e10), false, 1};
    }
    char err[UTIL_ERR_LEN];
    int rc = cost_prof_derive(p, err);
    double worst = 0;
    for (int i = 0; !rc && i < p->n_gemm; i++) {
        const cost_profile_gemm *g = &p->gemm[i];
        worst = fmax(worst, fabs(cost_gemm_time(&p->gpu, g->m, g->n, g->k) / g->seconds - 1));
    }
    cost_gemm_grid G = p->gpu.grid;
    free(p);
    CHECK_MSG(rc == 0, "%s", err);
    CHECK_EQ_INT(G.n_m, 3);
    CHECK_EQ_INT(G.n_n, 3);
    CHECK_EQ_INT(G.n_k, 3);
    CHECK(G.m[0] == 64 && G.m[2] == 1024 && G.k[1] == 256);
    CHECK_MSG(worst < 1e-9, "worst relative difference %g", worst);
}
