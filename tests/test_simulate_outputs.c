/* What the step simulator hands out: the memory per rank with the schedule's
 * slots and the backend's workspace, its refusals, the Chrome trace and its
 * writer, the search's ranking by the simulated step, and the prediction kept
 * in the plan file (the walk itself: test_simulate.c). */
#include "tests/test.h"
#include "tests/test_simulate.h"

#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

/* Memory per rank: the memory model with the schedule's live slots. */
TEST(simulate_memory_per_rank_uses_the_schedule_slots)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan("vision:gpus=1,mb=1;llm:gpus=1", PLAN_DISAGGREGATED, 2, 2, 4, &p));
    plan_sim_mem enc, llm;
    CHECK_OK(plan_sim_memory(&p, 0, &enc, err));
    CHECK_OK(plan_sim_memory(&p, 1, &llm, err));
    /* 2 chunks in flight x 2 micro-batches of 1 sample */
    CHECK_EQ_INT(enc.slots, 4);
    CHECK_EQ_INT(llm.slots, 1);   /* its forward+backward's activations */
    plan_options o;
    plan_options_default(&o);
    o.precision = p.precision;
    plan_mem one;
    plan_module_memory(&p.model, 0, &p.mod[0], &p.work, &p.cluster.pool[0].gpu, &o, 1, &one);
    CHECK_NEAR(enc.activations, 4 * one.activations, 1e-12);
    CHECK_NEAR(enc.params, one.params, 1e-12);
    plan_module_memory(&p.model, 1, &p.mod[1], &p.work, &p.cluster.pool[0].gpu, &o, 1, &one);
    CHECK_NEAR(llm.total, one.total, 1e-12);
    CHECK(llm.logits > 0 && enc.logits == 0);
    /* colocated: both modules, the reservation once */
    static plan_t q;
    CHECK_OK(test_sim_plan("", PLAN_COLOCATED, 1, 1, 4, &q));
    plan_sim_mem both;
    CHECK_OK(plan_sim_memory(&q, 0, &both, err));
    plan_eval ev;
    CHECK_OK(plan_evaluate(&q, &o, &ev, err));
    CHECK_NEAR(both.total, ev.peak_mem, 1e-12);
}

/* Under the Megatron target a 1F1B pipeline's ranks each hold their own
 * stage (plan_stage_memory: its blocks and micro-batches in flight, the
 * embedding first, the logits last), the worst of them the planner's figure. */
TEST(simulate_megatron_pipeline_memory_rank_by_stage)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan_layers("vision:dp=4;llm:pp=4", PLAN_COLOCATED, 4, 1, 16, 8, &p));
    p.target = PLAN_TARGET_MEGATRON;
    plan_options o = plan_options_of(&p);
    const plan_module *s = &p.mod[p.model.llm];
    const cost_gpu *g = &p.cluster.pool[0].gpu;
    plan_sim_mem r[4];
    plan_mem st[4], worst;
    for (int i = 0; i < 4; i++) {
        CHECK_OK(plan_sim_memory(&p, i, &r[i], err));
        plan_stage_memory(&p.model, p.model.llm, s, i, &p.work, g, &o, 1, &st[i]);
    }
    for (int i = 1; i < 4; i++) {   /* the vision module is the same on every rank: the differences are the LLM's stages' */
        CHECK_NEAR(r[i].params - r[0].params, st[i].params - st[0].params, 1e-6);
        CHECK_NEAR(r[i].activations - r[0].activations, st[i].activations - st[0].activations, 1e-6);
        CHECK_NEAR(r[i].logits, st[i].logits, 1e-6);
    }
    CHECK(r[0].activations > r[3].activations && r[0].logits == 0 && r[3].logits > 0);
    for (int i = 0; i < 4; i++)   /* 1F1B: stage i holds pp - i micro-batches, counted as its slots */
        CHECK_EQ_INT(r[i].slots - r[3].slots, 3 - i);
    plan_module_memory(&p.model, p.model.llm, s, &p.work, g, &o, 1, &worst);
    double most = 0;
    for (int i = 0; i < 4; i++) most = st[i].total > most ? st[i].total : most;
    CHECK_NEAR(worst.total, most, 1e-6);
    /* one micro-batch in flight everywhere: the ends' activations (an encoder's patch embedding input
     * on its first stage, its merger's and a head's inputs on the last) add up to one stage's */
    for (int k = 0; k < p.model.n_modules; k++) {
        plan_module two = p.mod[k], one = p.mod[k];
        two.pp = 2, two.dp = 1, two.micro_batch = 1;
        one.pp = 1, one.dp = 1, one.micro_batch = 1;
        plan_workload w1 = p.work;
        w1.global_batch = 1;
        plan_mem a, b, flat;
        plan_stage_memory(&p.model, k, &two, 0, &w1, g, &o, 1, &a);
        plan_stage_memory(&p.model, k, &two, 1, &w1, g, &o, 1, &b);
        plan_stage_memory(&p.model, k, &one, 0, &w1, g, &o, 1, &flat);
        CHECK_NEAR(a.activations - a.block_acts + b.activations - b.block_acts, flat.activations - flat.block_acts, 1e-6);
        const model_module *mm = &p.model.mod[k];
        double copy = mm->kind == MODEL_LLM && mm->tied_embeddings ? (double)mm->vocab * mm->hidden : 0;   /* the last stage's */
        CHECK_NEAR(a.params + b.params, flat.params + copy * plan_module_state_bytes(mm, &o).param, 1e-6);
    }
}

/* Interleaved (vp > 1), each rank's stage too: its model chunks' blocks
 * times the units each holds at the schedule's peak (plan_pipeline_peak_units:
 * stage i 2 (pp - 1 - i) + (vp - 1) pp + 1 of them), the embedding on the
 * first stage and the head and its logits on the last alone. With even
 * chunks the first stage's blocks hold Korthikanti et al.'s pp (1 + (pp - 1)
 * / (pp vp)) micro-batches of a stage: 1.25 of pp = 2 at vp = 2. */
TEST(simulate_megatron_interleaved_memory_rank_by_stage)
{
    static plan_t p, flat;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan_layers("vision:gpus=1;llm:gpus=4,dp=2,pp=2,vp=2,mb=1", PLAN_DISAGGREGATED, 5, 1, 16, 8, &p));
    CHECK_OK(test_sim_plan_layers("vision:gpus=1;llm:gpus=4,dp=2,pp=2,mb=1", PLAN_DISAGGREGATED, 5, 1, 16, 8, &flat));
    p.target = flat.target = PLAN_TARGET_MEGATRON;
    plan_options o = plan_options_of(&p);
    const plan_module *s = &p.mod[p.model.llm], *s1 = &flat.mod[flat.model.llm];
    const cost_gpu *g = &p.cluster.pool[0].gpu;
    plan_mem st[2], one[2], worst;
    for (int i = 0; i < 2; i++) {
        plan_stage_memory(&p.model, p.model.llm, s, i, &p.work, g, &o, 1, &st[i]);
        plan_stage_memory(&flat.model, flat.model.llm, s1, i, &flat.work, g, &o, 1, &one[i]);
        CHECK_NEAR(st[i].params, one[i].params, 1e-6);   /* the same blocks and ends a rank, in two chunks */
        CHECK_NEAR(st[i].logits, one[i].logits, 1e-6);
    }
    CHECK(st[0].logits == 0 && st[1].logits > 0);
    CHECK_NEAR(st[0].block_acts / one[0].block_acts, 5.0 * 2 / (2 * 4), 1e-9);   /* 5 units of 2 blocks; 2 micro-batches of 4 */
    CHECK_NEAR(st[1].block_acts / one[1].block_acts, 3.0 * 2 / (1 * 4), 1e-9);   /* 3 units; 1 micro-batch */
    CHECK_EQ_INT(plan_stage_units_in_flight(s, &p.work, 0), 5);
    plan_sim_mem r[5];
    int first = -1, last = -1;
    for (int rank = 0; rank < 5; rank++) {
        plan_coord cd;
        CHECK_OK(plan_sim_memory(&p, rank, &r[rank], err));
        if (!plan_rank_coord(&p, p.model.llm, rank, &cd)) continue;
        if (cd.pp == 0) first = rank;
        else last = rank;
    }
    CHECK(first >= 0 && last >= 0);
    CHECK_EQ_INT(r[first].slots - r[last].slots, 5 - 3);
    CHECK_NEAR(r[first].activations - r[last].activations, st[0].activations - st[1].activations, 1e-6);
    plan_module_memory(&p.model, p.model.llm, s, &p.work, g, &o, 1, &worst);
    CHECK_NEAR(worst.total, fmax(st[0].total, st[1].total), 1e-6);
    CHECK_EQ_INT(worst.stage, st[1].total > st[0].total);   /* which stage, for dhp memory to name */
    CHECK(st[0].stage == 0 && st[1].stage == 1);
}

/* The backend's own workspace (planner/backend.c): the CUDA backend's
 * own buffers (cuBLASLt's workspace, the reductions' partial sums, the
 * bias-gradient vector) once a rank under the dhp target, however many modules
 * the rank holds; none on the CPU backend, none under the Megatron target
 * (its reserved_bytes estimate holds the libraries' workspaces). */
TEST(simulate_memory_counts_the_cuda_workspace_once_a_rank)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    const double ws = (double)PLAN_CUDA_WORKSPACE_BYTES;
    CHECK_OK(test_sim_plan("", PLAN_COLOCATED, 1, 1, 4, &p));
    p.target = PLAN_TARGET_DHP;
    plan_sim_mem cuda, cpu;
    p.backend = PLAN_BACKEND_CPU;
    CHECK_OK(plan_sim_memory(&p, 0, &cpu, err));
    plan_options o = plan_options_of(&p);
    plan_eval ev_cpu, ev_cuda;
    CHECK_OK(plan_evaluate(&p, &o, &ev_cpu, err));
    p.backend = PLAN_BACKEND_CUDA;
    CHECK_OK(plan_sim_memory(&p, 0, &cuda, err));
    o = plan_options_of(&p);
    CHECK_OK(plan_evaluate(&p, &o, &ev_cuda, err));
    CHECK_NEAR(cuda.workspace, ws, 1e-9);
    CHECK_NEAR(cpu.workspace, 0, 1e-9);
    CHECK_NEAR(cuda.total - cpu.total, ws, 1e-3);
    CHECK_NEAR(ev_cuda.peak_mem - ev_cpu.peak_mem, ws, 1e-3);   /* two modules, counted once */
    CHECK_NEAR(cuda.total, ev_cuda.peak_mem, 1e-3);
    /* reserved: the GPU file's estimate holds a framework's cuBLAS workspace
     * (PyTorch's 32 MiB on the H100), which the Megatron target keeps and the
     * dhp target, counting its own above, leaves out: one workspace each */
    const cost_gpu *g = &p.cluster.pool[0].gpu;
    CHECK_NEAR(g->reserved_workspace_bytes, 32 << 20, 0);
    CHECK_NEAR(ev_cuda.mem[0].reserved, g->reserved_bytes - g->reserved_workspace_bytes, 0);
    CHECK_NEAR(ev_cpu.mem[0].reserved, g->reserved_bytes - g->reserved_workspace_bytes, 0);
    p.target = PLAN_TARGET_MEGATRON;
    CHECK_OK(plan_sim_memory(&p, 0, &cuda, err));
    CHECK_NEAR(cuda.workspace, 0, 1e-9);
    o = plan_options_of(&p);
    CHECK_OK(plan_evaluate(&p, &o, &ev_cuda, err));
    CHECK_NEAR(ev_cuda.mem[0].reserved, g->reserved_bytes, 0);
}

/* Without --backend the prediction is for the backend the pool's device
 * runs: a CPU described by dhp profile (COST_CPU_DEVICE_PREFIX) the CPU
 * backend's, a GPU the CUDA backend's. */
TEST(simulate_default_backend_follows_the_device)
{
    cost_gpu cpu = { 0 }, gpu = { 0 };
    snprintf(cpu.name, sizeof cpu.name, "%svm", COST_CPU_DEVICE_PREFIX);
    snprintf(gpu.name, sizeof gpu.name, "H100-SXM-80GB");
    CHECK(plan_backend_on(PLAN_BACKEND_DEVICE, &cpu) == PLAN_BACKEND_CPU);
    CHECK(plan_backend_on(PLAN_BACKEND_DEVICE, &gpu) == PLAN_BACKEND_CUDA);
    CHECK(plan_backend_on(PLAN_BACKEND_CUDA, &cpu) == PLAN_BACKEND_CUDA);   /* --backend cuda: dhp-emu's runs */
    plan_options o;
    plan_options_default(&o);
    o.target = PLAN_TARGET_DHP;
    CHECK_NEAR(plan_backend_workspace_bytes(&o, &cpu), 0, 0);
    CHECK_NEAR(plan_backend_workspace_bytes(&o, &gpu), (double)PLAN_CUDA_WORKSPACE_BYTES, 0);
}

TEST(simulate_refuses_what_the_schedule_does_not_run)
{
    static plan_t p;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan("vision:sp=2;llm:tp=2,seqpar=0", PLAN_COLOCATED, 2, 1, 4, &p));
    p.mod[1].pp = 2;
    p.mod[1].stage_layers[0] = p.model.mod[1].layers;   /* a pipeline stage without a block */
    plan_sim_result r;
    CHECK(plan_sim_run(&p, NULL, &r, err) == UTIL_EINVAL && strstr(err, "holds no block"));
    CHECK(r.rank == NULL && r.path == NULL);
    plan_sim_free(&r);
}

/* The trace is a JSON array with one complete event per op and names for
 * every process and lane. */
TEST(simulate_trace_is_chrome_json_with_one_event_per_op)
{
    static plan_t p;
    plan_sim_result r;
    CHECK_OK(test_sim_run("vision:gpus=1;llm:gpus=2,tp=2,seqpar=0", PLAN_DISAGGREGATED, 3, 2, 4, &p, &r));
    char err[UTIL_ERR_LEN];
    char path[] = "/tmp/dhp-trace-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_OK(plan_sim_write_trace(path, &p, &r, err));
    char *text;
    size_t len;
    CHECK_OK(util_read_file(path, &text, &len, err));
    unlink(path);
    cJSON *doc;
    int rc = util_json_parse(text, "trace", &doc, err);
    util_free(text);
    CHECK_MSG(rc == UTIL_OK, "%s", err);
    CHECK(cJSON_IsArray(doc));
    int ops = 0, events = 0, procs = 0, lanes = 0;
    for (int i = 0; i < r.world_size; i++) ops += r.rank[i].n_ops;
    int per_rank[3] = { 0, 0, 0 };
    const cJSON *e;
    cJSON_ArrayForEach(e, doc) {
        const char *ph = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "ph"));
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid");
        if (!ph || !name || !cJSON_IsNumber(pid)) { CHECK_MSG(0, "event without ph/name/pid"); }
        if (!strcmp(ph, "X")) {
            events++;
            const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts"), *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
            const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
            CHECK(cJSON_IsNumber(ts) && cJSON_IsNumber(dur) && dur->valuedouble >= 0 && cJSON_IsNumber(tid));
            CHECK(ts->valuedouble + dur->valuedouble <= r.step_time_s * 1e6 * (1 + 1e-12));
            CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(e, "args")));
            CHECK(pid->valueint >= 0 && pid->valueint < 3);
            per_rank[pid->valueint]++;
        } else if (!strcmp(ph, "M")) {
            if (!strcmp(name, "process_name")) procs++;
            if (!strcmp(name, "thread_name")) lanes++;
        }
    }
    cJSON_Delete(doc);
    CHECK_EQ_INT(events, ops);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(per_rank[i], r.rank[i].n_ops);
    CHECK_EQ_INT(procs, 3);
    CHECK_EQ_INT(lanes, 6);
    plan_sim_free(&r);
}

TEST(trace_writer_refuses_bad_events_and_leaves_no_file)
{
    char err[UTIL_ERR_LEN];
    char path[] = "/tmp/dhp-trace-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    unlink(path);
    plan_trace_event ev[2] = {
        { .rank = 0, .lane = PLAN_TRACE_COMPUTE, .name = "forward", .start_s = 0, .end_s = 1, .chunk = 0, .samples = 2, .bytes = -1 },
        { .rank = 2, .lane = PLAN_TRACE_COMM, .name = "recv", .start_s = 1, .end_s = 2, .chunk = -1, .samples = -1, .bytes = 8 },
    };
    CHECK(plan_trace_write(path, ev, 2, 2, NULL, err) == UTIL_EINVAL && strstr(err, "rank 2"));
    CHECK(access(path, F_OK) != 0);
    ev[1].rank = 1;
    ev[1].end_s = 0.5;
    CHECK(plan_trace_write(path, ev, 2, 2, NULL, err) == UTIL_EINVAL && strstr(err, "ends before"));
    ev[1].end_s = 2;
    CHECK_OK(plan_trace_write(path, ev, 2, 2, NULL, err));
    char *text;
    size_t len;
    CHECK_OK(util_read_file(path, &text, &len, err));
    unlink(path);
    CHECK(strstr(text, "\"ts\":1000000") && strstr(text, "\"dur\":1000000") && strstr(text, "\"bytes\":8"));
    util_free(text);
}

/* plan_search re-ranks its plans by the simulated step and keeps the analytic step (plan_evaluate's) beside it. */
TEST(search_ranks_schedulable_plans_by_the_simulated_step)
{
    model_t m;
    cost_cluster c;
    char err[UTIL_ERR_LEN];
    CHECK_OK(model_load("tiny-vl", &m, err));
    CHECK_OK(cost_cluster_load("8xh100", &c, err));
    c.pool[0].gpus_per_node = 2;
    plan_workload w = { .global_batch = 16, .images_per_sample = 1, .image_tokens = 4096, .text_tokens = 256 };
    plan_search_options so;
    plan_search_options_default(&so);
    so.top_k = 15;
    static plan_search_result r;
    CHECK_OK(plan_search(&m, &c, &w, &so, &r, err));
    CHECK(r.n_plans > 4);
    int simulated = 0, analytic_only = 0;
    for (int i = 0; i < r.n_plans; i++) {
        static plan_t q;
        q = r.plans[i];
        plan_options o;
        plan_options_default(&o);
        o.precision = q.precision;
        plan_eval ev;
        CHECK_OK(plan_evaluate(&q, &o, &ev, err));
        const plan_prediction *pr = &r.plans[i].pred;
        CHECK_NEAR(pr->analytic_step_time_s, q.pred.step_time_s, 1e-12);
        if (i) CHECK(pr->step_time_s >= r.plans[i - 1].pred.step_time_s);
        if (plan_schedule_check(&r.plans[i], err) == UTIL_OK) {
            plan_sim_result s;
            CHECK_OK(plan_sim_run(&r.plans[i], NULL, &s, err));
            CHECK(pr->simulated && pr->step_time_s == s.step_time_s);
            CHECK_NEAR(pr->samples_per_s * pr->step_time_s, w.global_batch, 1e-9);
            plan_sim_free(&s);
            simulated++;
        } else {
            CHECK(!pr->simulated && pr->step_time_s == pr->analytic_step_time_s);
            analytic_only++;
        }
    }
    /* every plan the search makes is one the schedule runs (pipelines included) */
    CHECK(simulated == r.n_plans && analytic_only == 0);
}

/* The plan file keeps both predictions. */
TEST(simulate_prediction_round_trips_through_the_plan_file)
{
    static plan_t p, back;
    char err[UTIL_ERR_LEN];
    CHECK_OK(test_sim_plan("vision:gpus=1;llm:gpus=1", PLAN_DISAGGREGATED, 2, 2, 4, &p));
    double analytic = p.pred.step_time_s;
    CHECK(!p.pred.simulated && p.pred.analytic_step_time_s == analytic);
    CHECK_OK(plan_sim_predict(&p, err));
    CHECK(p.pred.simulated && p.pred.analytic_step_time_s == analytic && p.pred.step_time_s != analytic);
    CHECK_NEAR(p.pred.samples_per_s * p.pred.step_time_s, 4, 1e-12);
    char path[] = "/tmp/dhp-plan-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    CHECK_OK(plan_write(path, &p, err));
    int rc = plan_read(path, &back, err);
    unlink(path);
    CHECK_OK(rc);
    CHECK(back.pred.simulated);
    CHECK_NEAR(back.pred.step_time_s, p.pred.step_time_s, 1e-12);
    CHECK_NEAR(back.pred.analytic_step_time_s, analytic, 1e-12);
    /* a plan the schedule does not run keeps its analytic prediction */
    back.mod[1].pp = 2;
    back.mod[1].stage_layers[0] = back.model.mod[1].layers;   /* the second stage holds no block */
    back.pred = p.pred;
    back.pred.step_time_s = back.pred.analytic_step_time_s = 1.5;
    back.pred.simulated = false;
    CHECK(plan_sim_predict(&back, err) != UTIL_OK);
    CHECK(back.pred.step_time_s == 1.5 && !back.pred.simulated);
}
