/* dhp launch PLAN.json: start `dhp run` where the plan says each rank runs.
 *
 * Ranks are placed node-major as the planner assumes (plan_rank_place): a
 * rank's host is the plan's node index into --hosts (one name per line), and
 * its GPU is its index within that node, which is also its local rank there
 * (a node's ranks are consecutive and start at GPU 0). Three ways out:
 *   mpirun with an Open MPI rankfile ("rank R=HOST slot=CORE"), printed or
 *     run (--exec);
 *   an sbatch script (--slurm FILE): one allocation, SLURM_HOSTFILE with
 *     --distribution=arbitrary for the node of every task, srun --mpi=pmix,
 *     --gpu-bind=map_gpu so a node's local task i gets GPU i;
 *   a Ray job (--ray ADDRESS, cli/launch_ray.c). */
#include "cli/cli_launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(void)
{
    printf("usage: dhp launch PLAN.json [options] [-- DHP-RUN-OPTIONS...]\n\n"
           "Prints the mpirun command (and writes its rankfile) that runs `dhp run PLAN.json` with\n"
           "every rank on the host and GPU the plan assigns; the options after -- go to dhp run.\n\n"
           "  --hosts FILE          host names, one per line, in the plan's node order (pools in the\n"
           "                        cluster's order); default localhost for a one-node plan\n"
           "  --cores-per-node N    cores of a node, shared evenly by its GPUs' ranks for the rankfile's\n"
           "                        slot (default: one core per GPU)\n"
           "  --rankfile FILE       where to write the rankfile (default PLAN.json.rankfile)\n"
           "  --exec                run mpirun instead of printing the command\n"
           "  --slurm FILE          write an sbatch script instead (srun --mpi=pmix, ranks node-major)\n"
           "  --ray ADDRESS         submit the run as a Ray job to the dashboard at ADDRESS\n"
           "                        (http://HEAD:8265): hosts are the Ray cluster's alive nodes\n"
           "  --wait                with --ray: wait for the job, print its logs, exit 0 when it succeeded\n"
           "  --timeout S           with --wait: give up after S seconds (default 3600)\n");
}

int cli_launch_hosts_read(const char *path, cli_hosts *h, char *err)
{
    char *text;
    memset(h, 0, sizeof *h);
    /* a host file: a line per host */
    if (util_read_text_file(path, (size_t)1 << 20, &text, NULL, err)) return UTIL_EIO;
    int line = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        line++;
        char *c = strchr(l, '#');
        if (c) *c = '\0';
        char name[CLI_HOST_LEN];
        if (sscanf(l, "%255s", name) != 1) continue;
        for (const char *q = name; *q; q++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:[]", *q)) {
                util_free(text);
                return util_fail(err, UTIL_EINVAL, "%s:%d: '%s' is not a host name", path, line, name);
            }
        if (h->n == CLI_MAX_HOSTS) {
            util_free(text);
            return util_fail(err, UTIL_EINVAL, "%s: more than %d hosts", path, CLI_MAX_HOSTS);
        }
        util_strlcpy(h->name[h->n++], name, CLI_HOST_LEN);
    }
    util_free(text);
    return UTIL_OK;
}

int cli_launch_place(const plan_t *p, const cli_hosts *h, int cores_per_node, cli_placement *out, char *err)
{
    memset(out, 0, sizeof *out);
    out->hosts_used = 0;
    for (int r = 0; r < p->world_size; r++) {
        plan_place pl;
        if (plan_rank_place(p, r, &pl, err)) return UTIL_EINVAL;
        if (pl.host >= h->n)
            return util_fail(err, UTIL_EINVAL, "rank %d runs on the plan's node %d, but %d host%s given (--hosts: "
                             "one per node, in the plan's node order)", r, pl.host, h->n, h->n == 1 ? " is" : "s are");
        int gpn = p->cluster.pool[pl.pool].gpus_per_node, cores = cores_per_node > 0 ? cores_per_node : gpn;
        out->rank[r].host = pl.host;
        out->rank[r].gpu = pl.gpu;
        out->rank[r].slot = (int)((long)pl.gpu * cores / gpn);
        if (pl.host + 1 > out->hosts_used) out->hosts_used = pl.host + 1;
        if (pl.gpu + 1 > out->gpus_per_host[pl.host]) out->gpus_per_host[pl.host] = pl.gpu + 1;
        out->tasks_per_host[pl.host]++;
    }
    /* GPU = local rank: every used node's ranks are its GPUs 0..k-1. */
    for (int i = 0; i < out->hosts_used; i++)
        if (out->tasks_per_host[i] && out->tasks_per_host[i] != out->gpus_per_host[i])
            return util_fail(err, UTIL_EINVAL, "node %d: its %d ranks do not hold GPUs 0-%d", i,
                             out->tasks_per_host[i], out->gpus_per_host[i] - 1);
    return UTIL_OK;
}

void cli_launch_rankfile(const cli_placement *pl, const cli_hosts *h, int world, cli_buf *b)
{
    for (int r = 0; r < world; r++)
        cli_buf_printf(b, "rank %d=%s slot=%d\n", r, h->name[pl->rank[r].host], pl->rank[r].slot);
}

/* `dhp run PLAN ARGS...` with absolute paths (the command may run elsewhere). */
int cli_launch_run_words(const char *plan_path, int argc, char **argv, cli_buf *b, char *err)
{
    char exe[4096], plan[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return util_fail(err, UTIL_EIO, "launch: cannot find the dhp binary (/proc/self/exe)");
    exe[n] = '\0';
    if (!realpath(plan_path, plan)) return util_fail(err, UTIL_EIO, "%s: cannot resolve the path", plan_path);
    cli_buf_word(b, exe);
    cli_buf_add(b, " run ");
    cli_buf_word(b, plan);
    for (int i = 0; i < argc; i++) { cli_buf_add(b, " "); cli_buf_word(b, argv[i]); }
    return UTIL_OK;
}

/* The sbatch script. */
static int slurm_script(const plan_t *p, const cli_placement *pl, const char *plan_path, int argc, char **argv,
                        cli_buf *b, char *err)
{
    int per_node = 0, gpus = 0;
    for (int i = 0; i < pl->hosts_used; i++) {
        if (pl->tasks_per_host[i] > per_node) per_node = pl->tasks_per_host[i];
        if (pl->gpus_per_host[i] > gpus) gpus = pl->gpus_per_host[i];
    }
    cli_buf_printf(b, "#!/bin/bash\n# dhp launch --slurm %s: %s, %d ranks on %d nodes, each rank on the node and GPU\n"
                   "# the plan places it (node-major: a node's ranks are consecutive, local rank = GPU).\n"
                   "#SBATCH --job-name=dhp-%s\n#SBATCH --nodes=%d\n#SBATCH --ntasks=%d\n"
                   "#SBATCH --ntasks-per-node=%d\n#SBATCH --gpus-per-node=%d\n#SBATCH --exclusive\n",
                   plan_path, p->model.name, p->world_size, pl->hosts_used, p->model.name, pl->hosts_used,
                   p->world_size, per_node, gpus);
    if (p->cluster.n_pools > 1)
        cli_buf_add(b, "# The plan's pools hold different GPUs: the nodes must come in the plan's pool order\n"
                       "# (for example a heterogeneous job, #SBATCH hetjob, one component per pool).\n");
    cli_buf_add(b, "set -euo pipefail\n# The allocation's node of every task, by the plan's node index.\nRANK_NODE=(");
    for (int r = 0; r < p->world_size; r++) cli_buf_printf(b, "%s%d", r ? " " : "", pl->rank[r].host);
    cli_buf_add(b, ")\nmapfile -t NODES < <(scontrol show hostnames \"$SLURM_JOB_NODELIST\")\n"
                   "SLURM_HOSTFILE=$(mktemp)\nexport SLURM_HOSTFILE\n"
                   "trap 'rm -f \"$SLURM_HOSTFILE\"' EXIT\n"
                   "for n in \"${RANK_NODE[@]}\"; do echo \"${NODES[$n]}\"; done >\"$SLURM_HOSTFILE\"\n");
    cli_buf_printf(b, "srun --mpi=pmix --ntasks=%d --distribution=arbitrary --gpu-bind=map_gpu:", p->world_size);
    for (int g = 0; g < gpus; g++) cli_buf_printf(b, "%s%d", g ? "," : "", g);
    cli_buf_add(b, " \\\n    ");
    if (cli_launch_run_words(plan_path, argc, argv, b, err)) return UTIL_EIO;
    cli_buf_add(b, "\n");
    return UTIL_OK;
}

typedef struct {
    const char *plan, *hosts, *rankfile, *slurm, *ray;
    int cores, timeout_s;
    bool exec, wait;
    int run_argc;
    char **run_argv;
} launch_args;

static int parse(int argc, char **argv, launch_args *a)
{
    memset(a, 0, sizeof *a);
    a->timeout_s = 3600;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--")) { a->run_argc = argc - i - 1; a->run_argv = argv + i + 1; break; }
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) { usage(); return 1; }
        const char **str = !strcmp(o, "--hosts") ? &a->hosts : !strcmp(o, "--rankfile") ? &a->rankfile
                         : !strcmp(o, "--slurm") ? &a->slurm : !strcmp(o, "--ray") ? &a->ray : NULL;
        if (str) { if (!v) return cli_usage_error("launch", "%s needs a value", o); *str = v; i++; }
        else if (!strcmp(o, "--cores-per-node")) { if (cli_int_arg("launch", o, v, 1, 1 << 20, &a->cores)) return 2; i++; }
        else if (!strcmp(o, "--timeout")) { if (cli_int_arg("launch", o, v, 1, 1 << 30, &a->timeout_s)) return 2; i++; }
        else if (!strcmp(o, "--exec")) a->exec = true;
        else if (!strcmp(o, "--wait")) a->wait = true;
        else if (o[0] == '-') return cli_usage_error("launch", "unknown option '%s'", o);
        else if (a->plan) return cli_usage_error("launch", "more than one plan file given");
        else a->plan = o;
    }
    if (!a->plan) return cli_usage_error("launch", "missing PLAN.json");
    if ((a->slurm != NULL) + (a->ray != NULL) + a->exec > 1)
        return cli_usage_error("launch", "give one of --exec, --slurm and --ray");
    if (a->wait && !a->ray) return cli_usage_error("launch", "--wait goes with --ray");
    return 0;
}

int cmd_launch(int argc, char **argv)
{
    launch_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    static plan_t p;
    char err[UTIL_ERR_LEN];
    if (plan_read(a.plan, &p, err)) return cli_bad_input(err);
    if (a.ray) return cli_launch_ray(&p, a.plan, a.ray, a.cores, a.wait, a.timeout_s, a.run_argc, a.run_argv);
    static cli_hosts hosts;
    static cli_placement pl;
    if (a.hosts) {
        if (cli_launch_hosts_read(a.hosts, &hosts, err)) return cli_bad_input(err);
    } else if (a.slurm) {   /* the allocation names the nodes; the script maps the plan's node indices */
        hosts.n = plan_cluster_nodes(&p) < CLI_MAX_HOSTS ? plan_cluster_nodes(&p) : CLI_MAX_HOSTS;
        for (int i = 0; i < hosts.n; i++) snprintf(hosts.name[i], CLI_HOST_LEN, "node%d", i);
    } else {
        hosts.n = 1;
        util_strlcpy(hosts.name[0], "localhost", CLI_HOST_LEN);
    }
    if (cli_launch_place(&p, &hosts, a.cores, &pl, err)) {
        char msg[UTIL_ERR_LEN + 300];
        snprintf(msg, sizeof msg, "%s: %s", a.plan, err);
        return cli_bad_input(msg);
    }
    cli_buf b = { 0 };
    if (a.slurm) {
        rc = slurm_script(&p, &pl, a.plan, a.run_argc, a.run_argv, &b, err);
        if (!rc) rc = util_write_atomic(a.slurm, b.s, b.len, err);
        cli_buf_free(&b);
        if (rc) return cli_bad_input(err);
        printf("wrote %s (sbatch %s)\n", a.slurm, a.slurm);
        return 0;
    }
    char rf[4096];
    snprintf(rf, sizeof rf, "%s.rankfile", a.plan);
    const char *rankfile = a.rankfile ? a.rankfile : rf;
    cli_launch_rankfile(&pl, &hosts, p.world_size, &b);
    rc = util_write_atomic(rankfile, b.s, b.len, err);
    cli_buf_free(&b);
    if (rc) return cli_bad_input(err);
    cli_buf cmd = { 0 };
    cli_buf_printf(&cmd, "mpirun -np %d --rankfile ", p.world_size);
    cli_buf_word(&cmd, rankfile);
    cli_buf_add(&cmd, " ");
    if (cli_launch_run_words(a.plan, a.run_argc, a.run_argv, &cmd, err)) { cli_buf_free(&cmd); return cli_bad_input(err); }
    if (!a.exec) {
        printf("# wrote %s: each rank on the host and GPU slot the plan assigns\n%s\n", rankfile, cmd.s);
        cli_buf_free(&cmd);
        return 0;
    }
    fflush(stdout);
    execl("/bin/sh", "sh", "-c", cmd.s, (char *)NULL);
    snprintf(err, sizeof err, "launch: cannot run /bin/sh for mpirun");
    cli_buf_free(&cmd);
    return cli_bad_input(err);
}
