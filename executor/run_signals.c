/* Stopping `dhp run` cleanly. Slurm sends SIGTERM to every task of a job it
 * preempts or that reaches its time limit and SIGKILL KillWait seconds later
 * (slurm.conf, KillWait; sbatch --signal can send SIGUSR1 earlier); an
 * interactive user presses Ctrl-C. The handler only records the signal; after
 * each step the ranks agree (one all-reduce of an int) whether any of them
 * got one, so all stop after the same step, write a checkpoint and exit 0,
 * and a requeued job continues with --resume. A second signal of any of
 * these kinds ends the process at once (the default action). */
#include "executor/run_internal.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static volatile sig_atomic_t g_signal;
static const int stop_signals[] = { SIGTERM, SIGINT, SIGUSR1 };
#define N_STOP ((int)(sizeof stop_signals / sizeof stop_signals[0]))
static struct sigaction g_old[N_STOP];
static bool g_installed;

static void on_stop(int sig)
{
    if (!g_signal) {
        g_signal = sig;
        return;
    }
    /* the second one: the default action (the process ends) */
    signal(sig, SIG_DFL);
    raise(sig);
}

void run_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    g_signal = 0;
    for (int i = 0; i < N_STOP; i++) sigaction(stop_signals[i], &sa, &g_old[i]);
    g_installed = true;
}

void run_signals_restore(void)
{
    if (!g_installed) return;
    for (int i = 0; i < N_STOP; i++) sigaction(stop_signals[i], &g_old[i], NULL);
    g_installed = false;
}

int run_signals_agree_stop(run_ctx *r, bool *stop, int *sig, char *err)
{
    int v = g_signal;
    if (ex_comm_allreduce_max_int(r->world, &v, 1))
        return util_fail(err, UTIL_ERUNTIME, "run: agreeing on a stop signal failed: %s", ex_comm_error(r->world));
    *stop = v != 0;
    *sig = v;
    return UTIL_OK;
}

void run_signals_note(const run_ctx *r, int sig)
{
    if (r->rank != 0) return;
    const char *name = sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
    if (r->o->ckpt_dir)
        fprintf(stderr, "dhp run: %s: stopped after step %d of %d; checkpoint %s/step-%08d (continue with --resume)\n",
                name, r->step, r->o->steps, r->o->ckpt_dir, r->step);
    else
        fprintf(stderr, "dhp run: %s: stopped after step %d of %d; nothing saved (no --ckpt)\n", name, r->step, r->o->steps);
}
