/* dhp run PLAN --data DIR: trains the model of a plan file, each module on
 * its own rank group with its own strategy. Launch with
 * `mpirun -np WORLD dhp run ...` (or srun); one rank runs without mpirun. */
#include "cli/cli.h"
#include "executor/executor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void run_usage(void)
{
    ex_run_options d;
    ex_run_options_default(&d);
    printf("usage: [mpirun -np WORLD] dhp run PLAN.json --data DIR [options]\n\n"
           "  --steps N          steps of the run and of the LR schedule (%d)\n"
           "  --stop-after N     stop after N steps (resume later with --resume)\n"
           "  --lr X --min-lr X  peak and final learning rate (%g, %g)\n"
           "  --warmup N         linear warm-up steps, then cosine (%d)\n"
           "  --weight-decay X   AdamW decoupled weight decay on matrices (%g)\n"
           "  --grad-clip X      global gradient-norm clip, 0 = off (%g)\n"
           "  --seed N           weight initialisation seed (%llu)\n"
           "  --shuffle-seed N   data order seed (%llu)\n"
           "  --ckpt DIR         write checkpoints to DIR (safetensors, one file per module)\n"
           "  --ckpt-every N     steps between checkpoints (default: only at the end)\n"
           "  --ckpt-keep N      keep only the newest N checkpoints (default: all)\n"
           "  --resume           continue from DIR/latest\n"
           "  --init-from DIR    start from a Hugging Face safetensors checkpoint (qwen2_5_vl, qwen2_audio)\n"
           "  --backend B        cpu, cuda or auto: cuda where a GPU is visible, else cpu (auto)\n"
           "  --comm mpi|nccl    the communicator (default: nccl with the CUDA backend when built in, else mpi)\n"
           "  --tf32             precision fp32's linears on TF32 tensor cores (the CUDA backend; a plan made\n"
           "                     with --tf32 runs so too); the CPU backend refuses it\n"
           "  --comm-timeout S   a rank waiting S seconds for another ends the run naming it\n"
           "                     (0 = wait forever; default $DHP_COMM_TIMEOUT, else 600)\n"
           "  --log-json         one JSON object per step on stdout\n"
           "  --log-every N      text log every N steps (1)\n"
           "  --trace FILE       Chrome trace (Perfetto) of the last step's measured ops ('-': stdout)\n"
           "  --no-progress      no progress bar even on a terminal\n\n"
           "SIGTERM, SIGINT or SIGUSR1 (Slurm's preemption and time-limit signals): the run finishes\n"
           "the current step, writes a checkpoint (--ckpt) and exits 0; a second signal ends it at once.\n",
           d.steps, (double)d.optim.lr, (double)d.optim.min_lr, d.optim.warmup_steps,
           (double)d.optim.weight_decay, (double)d.optim.grad_clip, (unsigned long long)d.seed,
           (unsigned long long)d.shuffle_seed);
}

static int float_arg(const char *opt, const char *v, float lo, float *out)
{
    char *end;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || errno || end == v || *end || !(x >= lo))
        return cli_usage_error("run", "%s: '%s' is not a number >= %g", opt, v ? v : "", (double)lo);
    *out = (float)x;
    return 0;
}

static int seed_arg(const char *opt, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || errno || end == v || *end) return cli_usage_error("run", "%s: '%s' is not a non-negative integer", opt, v ? v : "");
    *out = x;
    return 0;
}

static int parse(int argc, char **argv, ex_run_options *o)
{
    bool no_progress = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0, consumed = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { run_usage(); return 1; }
        else if (!strcmp(a, "--data")) o->data_dir = v;
        else if (!strcmp(a, "--ckpt")) o->ckpt_dir = v;
        else if (!strcmp(a, "--trace")) o->trace_path = v;
        else if (!strcmp(a, "--init-from")) o->init_from = v;
        else if (!strcmp(a, "--backend")) {
            o->backend = v;
            char why[UTIL_ERR_LEN];
            if (!ex_backend_name_ok(v, why)) return cli_usage_error("run", "--backend: %s", why);
        }
        else if (!strcmp(a, "--comm")) o->comm = v;
        else if (!strcmp(a, "--steps")) rc = cli_int_arg("run", a, v, 1, 1 << 30, &o->steps);
        else if (!strcmp(a, "--stop-after")) rc = cli_int_arg("run", a, v, 1, 1 << 30, &o->stop_after);
        else if (!strcmp(a, "--warmup")) rc = cli_int_arg("run", a, v, 0, 1 << 30, &o->optim.warmup_steps);
        else if (!strcmp(a, "--ckpt-every")) rc = cli_int_arg("run", a, v, 1, 1 << 30, &o->ckpt_every);
        else if (!strcmp(a, "--ckpt-keep")) rc = cli_int_arg("run", a, v, 1, 1 << 30, &o->ckpt_keep);
        else if (!strcmp(a, "--comm-timeout")) {
            float t;
            if (!(rc = float_arg(a, v, 0, &t))) o->comm_timeout_s = t;
        }
        else if (!strcmp(a, "--log-every")) rc = cli_int_arg("run", a, v, 1, 1 << 30, &o->log_every);
        else if (!strcmp(a, "--lr")) rc = float_arg(a, v, 0, &o->optim.lr);
        else if (!strcmp(a, "--min-lr")) rc = float_arg(a, v, 0, &o->optim.min_lr);
        else if (!strcmp(a, "--weight-decay")) rc = float_arg(a, v, 0, &o->optim.weight_decay);
        else if (!strcmp(a, "--grad-clip")) rc = float_arg(a, v, 0, &o->optim.grad_clip);
        else if (!strcmp(a, "--seed")) rc = seed_arg(a, v, &o->seed);
        else if (!strcmp(a, "--shuffle-seed")) rc = seed_arg(a, v, &o->shuffle_seed);
        else {
            consumed = 0;
            if (!strcmp(a, "--resume")) o->resume = true;
            else if (!strcmp(a, "--log-json")) o->log_json = true;
            else if (!strcmp(a, "--tf32")) o->tf32 = true;
            else if (!strcmp(a, "--no-progress")) no_progress = true;
            else if (a[0] == '-') return cli_usage_error("run", "unknown option '%s'", a);
            else if (!o->plan_path) o->plan_path = a;
            else return cli_usage_error("run", "unexpected argument '%s'", a);
        }
        if (rc) return rc;
        if (consumed) {
            if (!v) return cli_usage_error("run", "%s needs a value", a);
            i++;
        }
    }
    if (!o->plan_path) return cli_usage_error("run", "no plan file given");
    if (!o->data_dir) return cli_usage_error("run", "--data DIR is required (make one with 'dhp data synth --out DIR')");
    if (o->optim.min_lr > o->optim.lr) return cli_usage_error("run", "--min-lr %g is above --lr %g", (double)o->optim.min_lr, (double)o->optim.lr);
    if (o->ckpt_keep && !o->ckpt_dir) return cli_usage_error("run", "--ckpt-keep needs --ckpt DIR");
    if (o->trace_path && !strcmp(o->trace_path, "-") && cli_reserve_stdout())
        return cli_usage_error("run", "--trace -: cannot keep stdout for the trace");
    o->progress = !no_progress && !o->log_json && isatty(STDERR_FILENO);
    return 0;
}

int cmd_run(int argc, char **argv)
{
    ex_run_options o;
    ex_run_options_default(&o);
    int rc = parse(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    char err[UTIL_ERR_LEN] = "";
    rc = ex_run(&o, &argc, &argv, err);
    if (!rc) return 0;
    if (err[0]) fprintf(stderr, "dhp run: %s\n", err);   /* empty: rank 0 prints the job's one line */
    return rc == UTIL_EINVAL || rc == UTIL_ENOTFOUND || rc == UTIL_EUNSUPPORTED ? 2 : 1;
}
