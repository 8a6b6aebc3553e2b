/* Inputs that used to crash, wrap or run away (issue: hardened against bad
 * input and faults), as regression tests: sizes that overflow, plans the
 * simulator cannot hold, checkpoints that lie, writes killed half-way. */
#include "tests/test.h"
#include "planner/planner.h"
#include "executor/executor.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int tiny_plan(const char *spec, plan_placement pl, int gpus, int n_micro, int batch, plan_t *p, char *err)
{
    model_t m;
    cost_cluster c;
    if (model_load("tiny-vl", &m, err) || cost_cluster_load("cpu-4", &c, err)) return UTIL_EINVAL;
    plan_workload w = { .global_batch = batch, .images_per_sample = 1, .image_tokens = 64, .text_tokens = 48 };
    plan_options o;
    plan_options_default(&o);
    o.precision = PLAN_OPT_FP32;
    return plan_from_strategy_opts(spec, &m, &c, &w, pl, gpus, n_micro, &o, p, err);
}

/* A global batch of 2^22 samples on 4 ranks is a million chunks: the
 * simulator used to build every op (25M, 3.8 GB) before answering; now it
 * refuses with the sizes, and a small plan of the same kind still runs. */
TEST(simulate_refuses_plans_above_its_op_bound_up_front)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(tiny_plan("vision:dp=4;llm:dp=4", PLAN_COLOCATED, 4, 1, 1 << 22, &p, err));
    double ops, work;
    plan_sim_size(&p, &ops, &work);
    CHECK(ops > PLAN_SIM_MAX_OPS);
    plan_sim_result r;
    CHECK_EQ_INT(plan_sim_run(&p, NULL, &r, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "4 ranks x 1048576 chunks") && strstr(err, "limit"), "err: %s", err);
    /* the search's re-ranking falls back to the analytic prediction */
    CHECK(plan_sim_predict(&p, err) == UTIL_EINVAL && !p.pred.simulated);
    CHECK_OK(tiny_plan("vision:dp=4;llm:dp=4", PLAN_COLOCATED, 4, 1, 64, &p, err));
    plan_sim_size(&p, &ops, &work);
    CHECK(ops < PLAN_SIM_MAX_OPS && work < PLAN_SIM_MAX_WORK);
    CHECK_OK(plan_sim_run(&p, NULL, &r, err));
    /* the estimate bounds what the simulator built */
    double built = 0;
    for (int i = 0; i < r.world_size; i++) built += r.rank[i].n_ops;
    CHECK_MSG(built <= ops, "built %g ops, estimated %g", built, ops);
    plan_sim_free(&r);
}

/* Vision tokens per sample past 2^31 overflowed int arithmetic in the
 * schedule (UBSan: signed overflow in planner/schedule.c). */
TEST(workload_refuses_token_counts_that_overflow)
{
    model_t m;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("qwen2.5-vl-7b", &m, err));
    plan_workload w = { .global_batch = 8, .images_per_sample = 1 << 20, .image_tokens = 1 << 20, .text_tokens = 512 };
    CHECK_EQ_INT(plan_workload_validate(&m, &w, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "tokens per sample") && strstr(err, "limit"), "err: %s", err);
    w = (plan_workload){ .global_batch = 1 << 30, .images_per_sample = 1, .image_tokens = 1 << 28, .text_tokens = 512 };
    CHECK_EQ_INT(plan_workload_validate(&m, &w, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "2^53"), "err: %s", err);
    w = (plan_workload){ .global_batch = 8, .images_per_sample = 1, .image_tokens = 16384, .text_tokens = 512 };
    CHECK_OK(plan_workload_validate(&m, &w, err));
}

/* dp * micro_batch of 65536 * 65536 wrapped to 0 in a 32-bit int and the
 * colocated check then divided by it (SIGFPE in dhp memory and simulate). */
TEST(plan_validate_multiplies_degrees_in_64_bits)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(tiny_plan("vision:dp=4;llm:dp=4", PLAN_COLOCATED, 4, 1, 8, &p, err));
    for (int k = 0; k < p.n_modules; k++) p.mod[k].micro_batch = 1 << 30;
    CHECK_EQ_INT(plan_validate(&p, err), UTIL_EINVAL);
    for (int k = 0; k < p.n_modules; k++) { p.mod[k].dp = 1 << 16; p.mod[k].micro_batch = 1 << 16; }
    CHECK_EQ_INT(plan_validate(&p, err), UTIL_EINVAL);
    int64_t ranks;
    plan_module big = { .dp = 1 << 24, .tp = 1 << 20, .sp = 1 << 20, .pp = 1 << 20 };
    CHECK(!plan_module_ranks(&big, &ranks));
    big = (plan_module){ .dp = 1 << 24, .tp = 1 << 10, .sp = 1 << 10, .pp = 1 };
    CHECK(plan_module_ranks(&big, &ranks));
    CHECK(ranks == (int64_t)1 << 44);
}

static void flip_byte(const char *path, long from_end)
{
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, -from_end, SEEK_END);
    int c = fgetc(f);
    fseek(f, -from_end, SEEK_END);
    fputc(c ^ 0x10, f);
    fclose(f);
}

/* A checkpoint with one flipped bit read back without a word changed the
 * resumed run; now the tensor's checksum names it, and a changed metadata
 * value (a step number) fails the metadata checksum. */
TEST(ckpt_flipped_bytes_are_found_by_their_checksums)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "hard") == 0);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    float a[64], b[32];
    for (int i = 0; i < 64; i++) a[i] = (float)i * 0.5f;
    for (int i = 0; i < 32; i++) b[i] = -(float)i;
    ex_named_tensor t[2] = { { "a", EX_DT_F32, 2, { 8, 8 }, a }, { "b", EX_DT_BF16, 1, { 32 }, b } };
    const char *meta[] = { "step", "10" };
    CHECK_OK(ex_ckpt_write(path, t, 2, meta, 1, err));
    ex_ckpt *c;
    CHECK_OK(ex_ckpt_open(path, &c, err));
    CHECK(ex_ckpt_checksummed(c));
    int n = 0;
    CHECK_OK(ex_ckpt_verify(c, &n, err));
    CHECK_EQ_INT(n, 2);
    ex_ckpt_close(c);
    flip_byte(path, 3);   /* inside b, the last tensor */
    float back[64];
    ex_named_tensor r = { "b", EX_DT_F32, 1, { 32 }, back };
    ex_named_tensor both[2] = { { "a", EX_DT_F32, 2, { 8, 8 }, back }, r };
    CHECK_EQ_INT(ex_ckpt_read_into(path, both, 2, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "m.safetensors") && strstr(err, "tensor 'b'") && strstr(err, "checksum mismatch"), "err: %s", err);
    /* the metadata: rewrite "10" as "19" in the header */
    CHECK_OK(ex_ckpt_write(path, t, 2, meta, 1, err));
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    char head[4096];
    size_t got = fread(head, 1, sizeof head - 1, f);
    head[got] = 0;
    char *at = strstr(head + 8, "\"step\":\"10\"");
    CHECK(at != NULL);
    fseek(f, (long)(at - head) + 9, SEEK_SET);
    fputc('9', f);
    fclose(f);
    CHECK_EQ_INT(ex_ckpt_open(path, &c, err), UTIL_EINVAL);
    CHECK_MSG(strstr(err, "metadata checksum mismatch"), "err: %s", err);
    test_rm_tree(dir);
}

/* 100,000 tensors: the header's name check and every look-up go through a
 * hash map (the pairwise check took 91 s for 160k tensors). */
TEST(ckpt_many_tensors_open_and_find_by_name)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "hard") == 0);
    snprintf(path, sizeof path, "%s/many.safetensors", dir);
    enum { N = 100000 };
    ex_named_tensor *t = util_calloc(N, sizeof *t);
    char (*names)[24] = util_calloc(N, sizeof *names);
    float *v = util_calloc(N, sizeof *v);
    CHECK(t && names && v);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "layer.%d.scale", i);
        v[i] = (float)i;
        t[i] = (ex_named_tensor){ names[i], EX_DT_F32, 1, { 1 }, &v[i] };
    }
    CHECK_OK(ex_ckpt_write(path, t, N, NULL, 0, err));
    ex_ckpt *c;
    CHECK_OK(ex_ckpt_open(path, &c, err));
    CHECK_EQ_INT(ex_ckpt_count(c), N);
    for (int i = 0; i < N; i += 997) {
        const ex_ckpt_entry *e = ex_ckpt_find(c, names[i]);
        float x;
        CHECK(e != NULL);
        CHECK_OK(ex_ckpt_read_f32(c, e, &x, 1, err));
        CHECK(x == (float)i);
    }
    ex_ckpt_close(c);
    for (int i = 0; i < N; i++) v[i] = -1;
    CHECK_OK(ex_ckpt_read_into(path, t, N, err));
    CHECK(v[N - 1] == (float)(N - 1));
    util_free(t); util_free(names); util_free(v);
    test_rm_tree(dir);
}

/* A process killed half-way through a checkpoint write (the injected
 * SIGKILL of util_write_all) leaves the old file whole and a temp file. */
TEST(ckpt_write_killed_midway_keeps_the_old_file)
{
    char dir[64], path[128], err[UTIL_ERR_LEN];
    CHECK(test_tmp_dir(dir, sizeof dir, "hard") == 0);
    snprintf(path, sizeof path, "%s/k.safetensors", dir);
    static float a[4096];
    for (int i = 0; i < 4096; i++) a[i] = (float)i;
    ex_named_tensor t = { "a", EX_DT_F32, 1, { 4096 }, a };
    CHECK_OK(ex_ckpt_write(path, &t, 1, NULL, 0, err));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        a[0] = 42;
        util_fault_inject(-1, 5000);
        ex_ckpt_write(path, &t, 1, NULL, 0, err);
        _exit(0);   /* not reached: killed after 5000 bytes */
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "status %d", status);
    float back[4096];
    ex_named_tensor r = { "a", EX_DT_F32, 1, { 4096 }, back };
    CHECK_OK(ex_ckpt_read_into(path, &r, 1, err));
    CHECK(back[0] == 0.0f && back[4095] == 4095.0f);
    test_rm_tree(dir);
}
