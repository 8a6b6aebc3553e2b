/* dhp launch (cli/cmd_launch.c) and its Ray side (cli/launch_ray.c). */
#ifndef DHP_CLI_LAUNCH_H
#define DHP_CLI_LAUNCH_H

#include "cli/cli.h"

#define CLI_MAX_HOSTS 4096
#define CLI_HOST_LEN 256
#define CLI_MAX_RANKS (1 << 16)

typedef struct { int n; char name[CLI_MAX_HOSTS][CLI_HOST_LEN]; } cli_hosts;
typedef struct {
    struct { int host, gpu, slot; } rank[CLI_MAX_RANKS];
    int hosts_used;
    int tasks_per_host[CLI_MAX_HOSTS], gpus_per_host[CLI_MAX_HOSTS];
} cli_placement;

/* Host names, one per line ('#' starts a comment). */
int cli_launch_hosts_read(const char *path, cli_hosts *h, char *err);
/* Every rank's host (index into h), GPU and rankfile slot (its GPU's share of
 * cores_per_node cores; 0: one core per GPU). */
int cli_launch_place(const plan_t *p, const cli_hosts *h, int cores_per_node, cli_placement *out, char *err);
/* "rank R=HOST slot=S" lines. */
void cli_launch_rankfile(const cli_placement *pl, const cli_hosts *h, int world, cli_buf *b);
/* Appends "/abs/dhp run /abs/PLAN ARGS..." as shell words. */
int cli_launch_run_words(const char *plan_path, int argc, char **argv, cli_buf *b, char *err);

/* --ray ADDRESS: submit through Ray's Jobs REST API (exit code). */
int cli_launch_ray(const plan_t *p, const char *plan_path, const char *address, int cores_per_node, bool wait,
                   int timeout_s, int argc, char **argv);
/* dhp clusters --from-ray ADDRESS: the Ray cluster's alive nodes and GPUs as a
 * cluster description (one pool per kind of node). */
int cli_clusters_from_ray(const char *address, const char *gpu, const char *links_from, cost_cluster *c, char *err);

#endif
