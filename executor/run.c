/* `dhp run`: trains the model a plan describes. Every rank builds its
 * module groups' communicators (plan_group_of), places each module's state
 * as its data-parallel strategy says (executor/dp_*.c), then each step runs
 * its op list from plan_schedule_rank (planner/schedule.c) — the same list
 * the simulator prices — on the data-parallel shares of the global batch. */
#include "executor/run_internal.h"
#include "executor/precision.h"

#include <math.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void ex_run_options_default(ex_run_options *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 100;
    o->seed = 1234;
    o->shuffle_seed = 42;
    o->log_every = 1;
    o->comm_timeout_s = -1;
    o->optim = (ex_optim_config){ .lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 10, .total_steps = 100,
                                  .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                  .grad_clip = 1.0f };
}

/* ------------------------------------------------------------ comm hooks */

static int hook_allreduce_sum(void *ctx, float *buf, size_t n)
{
    return ex_comm_allreduce_sum(((run_hooks *)ctx)->tp, buf, n);
}

static int hook_allreduce_max(void *ctx, float *buf, size_t n)
{
    return ex_comm_allreduce_max(((run_hooks *)ctx)->tp, buf, n);
}

static int hook_allgather(void *ctx, const float *send, float *all, size_t n)
{
    return ex_comm_allgather(((run_hooks *)ctx)->tp, send, all, n);
}

static int hook_reduce_scatter(void *ctx, const float *send, float *recv, size_t n)
{
    return ex_comm_reduce_scatter(((run_hooks *)ctx)->tp, send, recv, n);
}

static int hook_alltoall(void *ctx, const float *send, float *recv, size_t chunk)
{
    return ex_comm_alltoall(((run_hooks *)ctx)->sp, send, recv, chunk);
}

/* Which of a group's instances a communicator is built for. */
typedef enum {
    GROUPS_ALL,               /* every group over the axes */
    GROUPS_FIRST_REPLICA,     /* those of each stage's first replica (dp = sp = 0) */
    GROUPS_FIRST              /* group color 0 only */
} group_pick;

/* Module k's communicator over `axes` (plan_group_of): every rank of the
 * world calls it, those outside the module or the picked groups pass no color. */
static int group_comm(run_ctx *r, int k, unsigned axes, group_pick pick, ex_comm **out, char *err)
{
    plan_group g = { -1, 0, 0, 0, 0 };
    bool in = plan_group_of(&r->plan, k, axes, r->rank, &g);
    const plan_coord *at = &r->mod[k].at;
    if (pick == GROUPS_FIRST_REPLICA) in = in && at->dp == 0 && at->sp == 0;
    if (pick == GROUPS_FIRST) in = in && g.color == 0;
    return ex_comm_split(r->world, in ? g.color : -1, g.key, out, err);
}

/* The tied LLM's embedding group: the first and the last stage (plan_embed_group_of). */
static int embed_comm(run_ctx *r, int k, ex_comm **out, char *err)
{
    plan_group g = { -1, 0, 0, 0, 0 };
    bool in = plan_embed_group_of(&r->plan, k, r->rank, &g);
    return ex_comm_split(r->world, in ? g.color : -1, g.key, out, err);
}

static int build_comms(run_ctx *r, char *err)
{
    const plan_t *p = &r->plan;
    for (int k = 0; k < p->n_modules; k++) {
        run_module *m = &r->mod[k];
        m->on = plan_rank_coord(p, k, r->rank, &m->at);
        m->first = m->at.pp == 0;
        m->last = m->at.pp == p->mod[k].pp - 1;
        m->rules = plan_dp_rules_of(&p->model.mod[k], &p->mod[k]);
        int rc = group_comm(r, k, PLAN_AX_TP, GROUPS_ALL, &m->tp, err);
        if (!rc) rc = group_comm(r, k, PLAN_AX_SP, GROUPS_ALL, &m->sp, err);
        if (!rc) rc = group_comm(r, k, PLAN_AX_SHARD, GROUPS_ALL, &m->shard, err);
        if (!rc) rc = group_comm(r, k, PLAN_AX_TP, GROUPS_FIRST_REPLICA, &m->lead, err);
        if (!rc) rc = group_comm(r, k, PLAN_AX_PP, GROUPS_FIRST, &m->stage_leads, err);
        if (!rc) rc = group_comm(r, k, PLAN_AX_PP, GROUPS_ALL, &m->st.pp, err);
        if (!rc) rc = run_stage_comms(r, k, err);
        if (!rc) rc = embed_comm(r, k, &m->embed, err);
        if (rc) return rc;
        m->hooks = (run_hooks){ m->tp, m->sp };
    }
    return UTIL_OK;
}

static void free_comms(run_ctx *r)
{
    for (int k = 0; k < MODEL_MAX_MODULES; k++) {
        run_module *m = &r->mod[k];
        run_dp_free(&m->dp);
        run_stage_free(r, k);
        ex_comm_free(m->tp); ex_comm_free(m->sp); ex_comm_free(m->shard); ex_comm_free(m->lead);
        ex_comm_free(m->stage_leads); ex_comm_free(m->embed);
    }
}

/* ------------------------------------------------------------ validation */

static int check_data(const run_ctx *r, const ex_dataset_info *in, char *err)
{
    const plan_t *p = &r->plan;
    const model_t *m = &p->model;
    const model_module *llm = &m->mod[m->llm];
    if (p->work.global_batch > in->samples)
        return util_fail(err, UTIL_EINVAL, "run: global batch %d is larger than the data set's %d samples", p->work.global_batch, in->samples);
    if (p->work.text_tokens != in->text_tokens)
        return util_fail(err, UTIL_EINVAL, "run: plan has %d text tokens per sample, the data set %d", p->work.text_tokens, in->text_tokens);
    if (llm->vocab < EX_TOK_PAD + 1)
        return util_fail(err, UTIL_EINVAL, "run: module %s: vocab %d is smaller than the data set's byte-level tokens (%d)", llm->name, llm->vocab, EX_TOK_PAD + 1);
    int rc = ex_data_check_audio(in, m, err);
    if (rc) return rc;
    int ai = model_find_kind(m, MODEL_AUDIO), vi = model_find_kind(m, MODEL_VISION);
    if (ai >= 0 && in->mel_frames != 2 * p->work.audio_frames)
        return util_fail(err, UTIL_EINVAL, "run: plan has %d audio frames per sample, the data set's clips give %d (mel_frames %d / 2)",
                         p->work.audio_frames, in->mel_frames / 2, in->mel_frames);
    if (vi < 0 || !run_feeds(r, vi)) return UTIL_OK;
    const model_module *v = &m->mod[vi];
    if (p->work.images_per_sample != 1)
        return util_fail(err, UTIL_EINVAL, "run: plan has %d images per sample; the data set has one", p->work.images_per_sample);
    if (v->patch != in->patch || v->merge != in->merge || v->window != in->window)
        return util_fail(err, UTIL_EINVAL, "run: module %s has patch %d, merge %d, window %d; the data set %d, %d, %d",
                         v->name, v->patch, v->merge, v->window, in->patch, in->merge, in->window);
    if (v->in_channels * v->temporal_patch * v->patch * v->patch != in->patch_dim)
        return util_fail(err, UTIL_EINVAL, "run: module %s: patch vector of %d values, the data set's has %d", v->name,
                         v->in_channels * v->temporal_patch * v->patch * v->patch, in->patch_dim);
    if (p->work.image_tokens != in->patches)
        return util_fail(err, UTIL_EINVAL, "run: plan has %d vision tokens per image, the data set's images have %d patches", p->work.image_tokens, in->patches);
    return UTIL_OK;
}

static int check_plan(run_ctx *r, char *err)
{
    const plan_t *p = &r->plan;
    int rc = plan_schedule_check(p, err);
    if (!rc) rc = plan_run_check(p, err);
    if (rc) return rc;
    if (p->world_size != r->size)
        return util_fail(err, UTIL_EINVAL, "run: the plan needs %d ranks, this run has %d (mpirun -np %d)", p->world_size, r->size, p->world_size);
    return UTIL_OK;
}

/* ------------------------------------------------------------ model setup */

/* Each module's layout on this rank (its tp, sp and stage coordinates,
 * sequence parallelism, recomputation), then its data-parallel strategy
 * and its pipeline stage's edges. */
static int create_model(run_ctx *r, char *err)
{
    const plan_t *p = &r->plan;
    plan_options po = plan_options_of(p);
    ex_parallel par[MODEL_MAX_MODULES];
    unsigned mask = 0;
    memset(par, 0, sizeof par);
    for (int k = 0; k < p->n_modules; k++) {
        run_module *m = &r->mod[k];
        if (!m->on) continue;
        mask |= 1u << k;
        const plan_module *s = &p->mod[k];
        par[k] = (ex_parallel){ .tp_size = s->tp, .tp_rank = m->at.tp, .sp_size = s->sp, .sp_rank = m->at.sp,
                                .ctx = &m->hooks, .allreduce_sum = hook_allreduce_sum, .alltoall = hook_alltoall,
                                .allreduce_max = hook_allreduce_max, .seq_parallel = s->seq_parallel,
                                .allgather = hook_allgather, .reduce_scatter = hook_reduce_scatter,
                                .recompute = s->recompute, .recompute_layers = s->recompute_layers, .pp_size = s->pp, .pp_rank = m->at.pp, .vp = s->vp };
        memcpy(par[k].stage_layers, s->stage_layers, sizeof par[k].stage_layers);
        par[k].split_ends = s->split_ends;
        par[k].cp = s->cp;
        run_cp_hooks(&par[k]);
        run_wire_hooks(&par[k], &po);
    }
    int rc = ex_model_create_per_module(r->be, &p->model, r->o->seed, mask, par, &r->em, err);
    if (!rc) rc = ex_precision_attach(r->em, err);
    for (int k = 0; !rc && k < p->n_modules; k++) {
        run_module *m = &r->mod[k];
        if (!m->on) continue;
        float *buf;
        ex_module_buffer(r->em, k, EX_BUF_PARAMS, &buf, &m->n);
        plan_dp_buffers b = plan_dp_buffers_of(&p->model.mod[k], &p->mod[k], m->at.pp);
        rc = run_dp_init(&m->dp, r->em, k, m->shard, &m->rules, &b, err);
        if (!rc) rc = run_stage_init(r, k, err);
    }
    return rc;
}

/* ------------------------------------------------------------ step data (run_data.c) */

/* Predictions the global batch's loss averages over: each LLM dp rank
 * counts its samples, summed over the dp group. */
static int count_predictions(run_ctx *r, const plan_schedule *s, const run_data *d, run_stats *st, char *err)
{
    int L = r->plan.model.llm;
    if (!r->mod[L].on) return UTIL_OK;
    double cnt = 0;
    for (int i = 0; i < s->n && r->mod[L].at.sp == 0; i++) {   /* sp ranks share their samples: the first counts */
        const plan_op *o = &s->op[i];
        if (o->module != L || (o->kind != PLAN_OP_FORWARD && o->kind != PLAN_OP_FORWARD_BACKWARD) || o->vchunk != 0) continue;
        for (int j = o->sample0; j < o->sample0 + o->samples; j++)
            for (int t = 0; t + 1 < d->T; t++) cnt += d->mask[(size_t)d->row_of[j] * d->T + t] != 0;
    }
    if (ex_comm_allreduce_sum_f64(r->mod[L].shard, &cnt, 1))
        return util_fail(err, UTIL_ERUNTIME, "run: all-reduce failed: %s", ex_comm_error(r->mod[L].shard));
    st->denominator = cnt > 0 ? cnt : 1;
    return UTIL_OK;
}

/* Trace of the last step: one event per op, seconds from the step's start. */
typedef struct { plan_op op; double t0, t1; } op_event;

static int run_step(run_ctx *r, const plan_schedule *s, ex_dataset *ds, run_data *d, run_handoff *h,
                    run_stats *st, op_event *ev, char *err)
{
    memset(st, 0, sizeof *st);
    ex_precision_refresh(r->em);   /* bf16-mixed: the weights' bf16 copy from this step's master (a no-op otherwise) */
    int rc = run_data_load(r, ds, r->step, d, err);
    if (!rc) rc = count_predictions(r, s, d, st, err);
    if (rc) return rc;
    bool applied = false;
    int failed = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        double t0 = util_now();
        rc = run_op(r, &s->op[i], d, h, st, &applied, &failed, err);
        double t1 = util_now();
        st->op_s[s->op[i].kind] += t1 - t0;
        if (ev) ev[i] = (op_event){ s->op[i], t0 + r->wall_offset, t1 + r->wall_offset };
    }
    char werr[UTIL_ERR_LEN];
    int wrc = run_handoff_wait_all(r, h, werr);
    if (!wrc) wrc = run_stage_wait_all(r, werr);
    if (!wrc) wrc = run_dp_step_wait_all(r, werr);
    if (!rc && wrc) rc = util_fail(err, wrc, "%s", werr);
    if (!rc) rc = run_data_prefetch(r, ds, r->step + 1, d, err);   /* beside the step's kernels, before its sync */
    return rc;
}

/* ------------------------------------------------------------ logging */

#define LOG_CATS 7
static const util_mem_cat log_cats[LOG_CATS] = { UTIL_MEM_PARAMS, UTIL_MEM_GRADS, UTIL_MEM_OPTIM, UTIL_MEM_ACTIV,
                                                 UTIL_MEM_COMM, UTIL_MEM_ZERO, UTIL_MEM_WORKSPACE };
static const char *const log_cat_keys[LOG_CATS] = { "params", "grads", "optim", "activations", "comm", "zero_buffers",
                                                    "workspace" };

typedef struct { double step_s; double mem[LOG_CATS]; } rank_report;

static void log_step(const run_ctx *r, const run_stats *st, const rank_report *rep, double eta_s)
{
    const plan_t *p = &r->plan;
    double step_s = 0;
    for (int q = 0; q < r->size; q++) if (rep[q].step_s > step_s) step_s = rep[q].step_s;
    plan_seq lq;
    plan_module_seq(&p->model, p->model.llm, &p->work, &lq);
    double llm_tokens = lq.tokens_per_sample * p->work.global_batch;
    double vis_tokens = (double)p->work.images_per_sample * p->work.image_tokens * p->work.global_batch;
    if (r->o->log_json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "step", r->step);
        cJSON_AddNumberToObject(j, "steps", r->o->steps);
        cJSON_AddNumberToObject(j, "loss", st->loss);
        cJSON_AddNumberToObject(j, "grad_norm", st->grad_norm);
        cJSON_AddNumberToObject(j, "lr", st->lr);
        cJSON_AddNumberToObject(j, "step_s", step_s);
        cJSON_AddNumberToObject(j, "tokens_per_s", llm_tokens / step_s);
        cJSON_AddNumberToObject(j, "vision_tokens_per_s", vis_tokens / step_s);
        cJSON_AddNumberToObject(j, "samples_per_s", p->work.global_batch / step_s);
        cJSON *ranks = cJSON_AddArrayToObject(j, "ranks");
        for (int q = 0; q < r->size; q++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "rank", q);
            cJSON_AddNumberToObject(o, "step_s", rep[q].step_s);
            cJSON *mem = cJSON_AddObjectToObject(o, "peak_bytes");
            for (int c = 0; c < LOG_CATS; c++) cJSON_AddNumberToObject(mem, log_cat_keys[c], rep[q].mem[c]);
            cJSON_AddItemToArray(ranks, o);
        }
        char *text = cJSON_PrintUnformatted(j);
        if (text) printf("%s\n", text);
        cJSON_free(text);
        cJSON_Delete(j);
        fflush(stdout);
        return;
    }
    if (r->o->progress) fprintf(stderr, "\r\033[K");
    printf("step %d/%d  loss %.4f  gnorm %.3f  lr %.2e  %.3f s  %.0f tok/s  mem",
           r->step, r->o->steps, st->loss, st->grad_norm, st->lr, step_s, llm_tokens / step_s);
    int shown = r->size <= 4 ? r->size : 1;
    for (int q = 0; q < shown; q++) {
        char b[LOG_CATS][24];
        for (int c = 0; c < LOG_CATS; c++) util_fmt_bytes(rep[q].mem[c], b[c], sizeof b[c]);
        printf("%s r%d P %s G %s O %s A %s C %s", q ? " |" : "", q, b[0], b[1], b[2], b[3], b[4]);
        if (rep[q].mem[5] > 0) printf(" Z %s", b[5]);
        if (rep[q].mem[6] > 0) printf(" W %s", b[6]);
    }
    if (shown < r->size) printf(" (rank 0 of %d; --log-json has all)", r->size);
    printf("\n");
    fflush(stdout);
    if (r->o->progress) {
        int done = r->step, total = r->o->stop_after > 0 ? r->o->stop_after : r->o->steps, width = 30;
        int fill = total > 0 ? width * done / total : width;
        fprintf(stderr, "[%.*s%*s] %d/%d  ETA %.0f s", fill, "==============================", width - fill, "", done, total, eta_s);
        fflush(stderr);
    }
}

static int gather_report(run_ctx *r, double step_s, rank_report *all, char *err)
{
    rank_report me = { .step_s = step_s };
    for (int c = 0; c < LOG_CATS; c++) me.mem[c] = (double)util_mem_peak(log_cats[c]);
    if (ex_comm_gather_bytes(r->world, &me, all, sizeof me, 0))
        return util_fail(err, UTIL_ERUNTIME, "run: gathering the step report failed: %s", ex_comm_error(r->world));
    return UTIL_OK;
}

/* The last step's measured ops as a Chrome trace, written by rank 0 with
 * the simulator's writer and labels, so predicted and measured timelines
 * line up event for event. */
static int write_trace(run_ctx *r, const plan_schedule *s, const op_event *ev, char *err)
{
    int most = s->n;
    if (ex_comm_allreduce_max_int(r->world, &most, 1)) return util_fail(err, UTIL_ERUNTIME, "run: trace: %s", ex_comm_error(r->world));
    op_event *mine = util_calloc((size_t)most, sizeof *mine), *all = NULL;
    if (!mine) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
    memcpy(mine, ev, (size_t)s->n * sizeof *ev);
    for (int i = s->n; i < most; i++) mine[i].op.kind = PLAN_NOPS;
    if (r->rank == 0) all = util_malloc((size_t)most * r->size * sizeof *all);
    int rc = ex_comm_gather_bytes(r->world, mine, all, (size_t)most * sizeof *mine, 0)
           ? util_fail(err, UTIL_ERUNTIME, "run: trace: %s", ex_comm_error(r->world)) : UTIL_OK;
    plan_trace_event *te = !rc && r->rank == 0 ? util_calloc((size_t)most * r->size, sizeof *te) : NULL;
    if (!rc && r->rank == 0 && !te) rc = util_fail(err, UTIL_ENOMEM, "run: out of memory");
    if (te) {
        double first = INFINITY;   /* the step's first op on any rank is the trace's time 0 */
        for (size_t i = 0; i < (size_t)most * r->size; i++)
            if (all[i].op.kind != PLAN_NOPS && all[i].t0 < first) first = all[i].t0;
        int n = 0;
        for (int q = 0; q < r->size; q++)
            for (int i = 0; i < most; i++) {
                const op_event *e = &all[(size_t)q * most + i];
                if (e->op.kind == PLAN_NOPS) continue;
                plan_trace_event *t = &te[n++];
                t->rank = q;
                t->lane = plan_op_props(e->op.kind)->lane;
                plan_sim_op_label(&r->plan, &e->op, t->name, sizeof t->name);
                t->start_s = e->t0 - first;
                t->end_s = e->t1 - first;
                t->chunk = e->op.chunk;
                t->samples = e->op.chunk >= 0 ? e->op.samples : -1;
                t->bytes = -1;
            }
        rc = plan_trace_write(r->o->trace_path, te, n, r->size, NULL, err);
    }
    util_free(te);
    util_free(mine);
    util_free(all);
    return rc;
}

/* ------------------------------------------------------------ driver */

static double wall_minus_monotonic(void)
{
    struct timespec w;
    double m = util_now();
    clock_gettime(CLOCK_REALTIME, &w);
    return (double)w.tv_sec + 1e-9 * (double)w.tv_nsec - m;
}

static int agree(run_ctx *r, int rc, char *err)
{
    int v = rc;
    if (ex_comm_allreduce_max_int(r->world, &v, 1)) return rc ? rc : UTIL_ERUNTIME;
    if (v && !rc) return util_fail(err, v, "run: another rank failed during set-up (its message is above)");
    return rc;
}

static int train(run_ctx *r, ex_dataset *ds, char *err)
{
    plan_schedule s;
    run_data d;
    run_handoff h;
    memset(&d, 0, sizeof d);
    memset(&h, 0, sizeof h);
    int rc = plan_schedule_rank(&r->plan, r->rank, &s, err);
    if (!rc) rc = run_data_init(r, &s, ds, &d, err);
    if (!rc) rc = run_handoff_init(r, &h, err);
    rc = agree(r, rc, err);
    if (!rc) rc = agree(r, run_handoff_comms(r, &h, err), err);
    r->wall_offset = wall_minus_monotonic();
    op_event *ev = rc ? NULL : util_calloc((size_t)s.n + 1, sizeof *ev);
    rank_report *rep = util_calloc((size_t)r->size, sizeof *rep);
    int stop = r->o->stop_after > 0 && r->o->stop_after < r->o->steps ? r->o->stop_after : r->o->steps;
    double t_begin = util_now();
    int first = r->step;
    while (!rc && r->step < stop) {
        run_stats st;
        double t0 = util_now();
        if ((rc = run_backend_explain(r, run_step(r, &s, ds, &d, &h, &st, ev, err), NULL, err)) || (rc = run_backend_sync(r, err))) {
            char why[UTIL_ERR_LEN];
            util_strlcpy(why, err, sizeof why);
            util_fail(err, rc, "step %d: %s", r->step + 1, why);
            break;
        }
        r->step++;
        double dt = util_now() - t0;
        if ((rc = gather_report(r, dt, rep, err))) break;
        bool halt = false;   /* SIGTERM / SIGINT / SIGUSR1 on any rank: this step is the last */
        int sig = 0;
        if ((rc = run_signals_agree_stop(r, &halt, &sig, err))) break;
        double eta = (util_now() - t_begin) / (r->step - first) * (stop - r->step);
        bool last = r->step == stop || halt;
        if (r->rank == 0 && (last || r->o->log_json || r->step % (r->o->log_every > 0 ? r->o->log_every : 1) == 0))
            log_step(r, &st, rep, eta);
        bool ckpt = r->o->ckpt_dir && (last || (r->o->ckpt_every > 0 && r->step % r->o->ckpt_every == 0));
        if (ckpt) rc = run_backend_explain(r, run_ckpt_save(r, err), "checkpoint", err);
        if (!rc && last && r->o->trace_path) rc = write_trace(r, &s, ev, err);
        if (!rc && halt) { run_signals_note(r, sig); break; }
    }
    if (r->rank == 0 && r->o->progress && !r->o->log_json) fprintf(stderr, "\n");
    util_free(ev);
    util_free(rep);
    run_handoff_free(r, &h);
    run_data_free(&d);
    plan_schedule_free(&s);
    return rc;
}

int ex_run(const ex_run_options *o, int *argc, char ***argv, char *err)
{
    run_ctx *r = util_calloc(1, sizeof *r);
    if (!r) return util_fail(err, UTIL_ENOMEM, "run: out of memory");
    r->o = o;
    r->optim = o->optim;
    r->optim.total_steps = o->steps;
    if (o->comm_timeout_s >= 0) ex_comm_set_timeout(o->comm_timeout_s);
    ex_comm_kind kind;
    char comm_line[160];
    /* The communicator is picked before the world exists, the backend after
     * (run_pick_backend needs the plan): NCCL is the default when the CUDA
     * backend was asked for and a device (or the emulator) is there: else
     * run_pick_backend says why it is not; under auto the run may still
     * compute on a GPU over MPI (one rank, run_pick_backend). */
    char why[UTIL_ERR_LEN + 64], ignored[UTIL_ERR_LEN];
    bool cuda = o->backend && !strcmp(o->backend, "cuda") && ex_backend_pick("cuda", why, sizeof why, ignored);
    int rc = ex_comm_pick(o->comm, cuda, &kind, comm_line, sizeof comm_line, err);
    if (!rc) rc = ex_comm_world(argc, argv, kind, &r->world, err);
    if (rc) { util_free(r); return rc; }
    run_signals_install();
    r->rank = ex_comm_rank(r->world);
    r->size = ex_comm_size(r->world);
    ex_dataset *ds = NULL;
    if (o->steps < 1) rc = util_fail(err, UTIL_EINVAL, "run: --steps must be >= 1");
    if (!rc) rc = plan_read(o->plan_path, &r->plan, err);
    if (!rc) rc = check_plan(r, err);
    if (!rc) rc = ex_data_open(o->data_dir, &ds, err);
    if (!rc) rc = check_data(r, ex_data_info(ds), err);
    if (!rc) rc = agree(r, run_pick_backend(r, err), err);
    if (!rc && r->rank == 0 && !o->log_json) printf("%s\n", comm_line);   /* after the backend's line: a refused run prints nothing */
    if (!rc && o->resume && !o->ckpt_dir) rc = util_fail(err, UTIL_EINVAL, "run: --resume needs --ckpt DIR");
    if (!rc && o->resume && o->init_from)
        rc = util_fail(err, UTIL_EINVAL, "run: --init-from and --resume: a resumed run continues its checkpoint's weights");
    if (!rc) rc = run_paths_prepare(r, err);
    /* set-up checks are identical on every rank, so communicators are built only when all passed */
    if (!rc) rc = build_comms(r, err);
    if (!rc) rc = agree(r, run_backend_explain(r, create_model(r, err), NULL, err), err);
    /* the log reports the training steps' peaks, not the set-up's (ZeRO-1
     * frees the moments the model first allocates whole) */
    util_mem_reset_peaks();
    if (!rc && o->resume) rc = agree(r, run_ckpt_load(r, err), err);
    if (!rc && o->init_from) rc = agree(r, run_init_from(r, err), err);
    if (!rc) rc = train(r, ds, err);
    ex_model_free(r->em);
    ex_data_close(ds);
    free_comms(r);
    ex_comm_free(r->world);
    util_free(r);
    ex_comm_finalize();
    run_signals_restore();
    return rc;
}
