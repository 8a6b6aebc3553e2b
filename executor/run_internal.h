/* executor-internal: the state of one rank of `dhp run`, shared by the
 * driver (run.c) and its checkpoints (run_ckpt.c). */
#ifndef DHP_EXECUTOR_RUN_INTERNAL_H
#define DHP_EXECUTOR_RUN_INTERNAL_H

#include "executor/executor.h"
#include "executor/comm.h"

/* Both hooks of a module's ex_parallel go to its own communicators. */
typedef struct { ex_comm *tp, *sp; } run_hooks;

typedef struct {
    bool on;                  /* this rank is in the module's group */
    bool trains;              /* not frozen */
    plan_coord at;
    ex_comm *tp, *sp;         /* ranks of one replica that differ only in tp / sp */
    ex_comm *grad;            /* dp x sp ranks with the same tp index: gradient sync, ZeRO-1 shards */
    ex_comm *lead;            /* rank 0 of each tp group (sp = 0, dp = 0) x tp: checkpoint gathers */
    run_hooks hooks;
    bool zero1;
    size_t n;                 /* flat parameters on this rank */
    size_t shard, lo, hi;     /* ZeRO-1: padded shard size and this rank's range */
    float *stage, *piece;     /* ZeRO-1 staging [grad size * shard] and [shard] (COMM) */
} run_module;

typedef struct {
    const ex_run_options *o;
    plan_t plan;
    ex_comm *world;
    int rank, size;
    run_module mod[MODEL_MAX_MODULES];
    int enc;                  /* encoder module index, -1 if none */
    ex_model *em;
    ex_optim_config optim;
    int step;                 /* steps done */
    /* CLOCK_REALTIME - util_now() on this rank: the trace's op times are
     * wall-clock times, which every process of a host reads from one clock
     * and NTP keeps close across hosts, so ranks line up. (Each rank's own
     * step start does not: the ranks of a step start apart, by whatever the
     * previous step left between them; nor does the exit of a start-up
     * collective, which a rank descheduled right after it misses by a time
     * slice.) */
    double wall_offset;
} run_ctx;

/* Checkpoints: DIR/step-NNNNNNNN/<module>.safetensors with every parameter
 * as a whole tensor and its AdamW moments ("adam_m." / "adam_v." + name),
 * metadata step, adam_t, seed, shuffle_seed; DIR/latest names the newest
 * complete step directory. Whole tensors make a checkpoint independent of
 * the plan's layout. Collective over the world. */
int run_ckpt_save(run_ctx *r, char *err);
/* Loads DIR/latest into every rank's shards; sets r->step. */
int run_ckpt_load(run_ctx *r, char *err);
/* DIR/step-NNNNNNNN of a step into out. */
int run_ckpt_step_dir(const run_ctx *r, long long step, char *out, size_t n);

/* The step every rank resumes from (executor/run_resume.c): rank 0 reads
 * DIR/latest and checks that its step directory holds every module's file,
 * each a dhp checkpoint with checksums at that step (a missing, foreign or
 * other-step file is named), then every rank gets the step or the refusal
 * before any work. Collective over the world. */
int run_ckpt_resume_step(run_ctx *r, char *dir, size_t n, long long *step, char *err);

/* Output paths and checkpoint directories (executor/run_paths.c). Before
 * step 1: --ckpt DIR is created and must take files, --trace FILE must be
 * writable, temp files a killed run left in DIR are removed; every rank
 * agrees. Collective over the world. */
int run_paths_prepare(run_ctx *r, char *err);
/* --ckpt-keep N: removes all but the N newest step directories up to the
 * current step (rank 0, after DIR/latest moved). */
void run_ckpt_retain(run_ctx *r);

/* SIGTERM, SIGINT, SIGUSR1 (executor/run_signals.c): the first asks the run
 * to stop after the current step, write a checkpoint and exit 0 (Slurm
 * sends SIGTERM before preempting a job); a second one ends the process. */
void run_signals_install(void);
void run_signals_restore(void);
/* After each step: whether any rank got a stop signal (a tiny all-reduce
 * over the world, so all stop after the same step); *sig is the signal. */
int run_signals_agree_stop(run_ctx *r, bool *stop, int *sig, char *err);
/* Rank 0's line on stderr after a stop: the signal, the step, the checkpoint. */
void run_signals_note(const run_ctx *r, int sig);

#endif
