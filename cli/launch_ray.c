/* Ray: a run submitted through the Jobs REST API, and a cluster description
 * read from the State API. Both are the dashboard's HTTP endpoints
 * (ray/dashboard/modules/job/job_head.py: POST /api/jobs/, GET
 * /api/jobs/{id}, GET /api/jobs/{id}/logs; ray/util/state: GET /api/v0/nodes),
 * reached with libcurl (util/http.c) at the address the user gives
 * (http://HEAD:8265). The job's entrypoint writes the rankfile on the head
 * node and runs mpirun there, over the Ray cluster's nodes: dhp and the plan
 * must sit at the same paths on every node (a shared file system), and
 * mpirun must reach the nodes as it does on any cluster (ssh). */
#include "cli/cli_launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RAY_MAX_NODES CLI_MAX_HOSTS

typedef struct {
    char ip[64], accel[64];
    int gpus;
    bool head;
} ray_node;

static void base_url(const char *address, char *out, size_t n)
{
    util_strlcpy(out, address, n);
    size_t len = strlen(out);
    while (len > 0 && out[len - 1] == '/') out[--len] = '\0';
}

/* GET/POST ADDRESS + path, a 2xx JSON answer parsed. */
static int ray_call(const char *address, const char *path, const char *body, cJSON **out, char *err)
{
    char url[2048];
    base_url(address, url, sizeof url);
    util_strlcpy(url + strlen(url), path, sizeof url - strlen(url));
    util_http_response r;
    if (util_http_request(NULL, url, body, NULL, &r, err)) return UTIL_EIO;
    int rc = util_http_check_status(url, &r, err);
    if (!rc) rc = util_json_parse(r.body, url, out, err);
    util_free(r.body);
    return rc ? UTIL_EIO : UTIL_OK;
}

static int by_head_then_ip(const void *a, const void *b)
{
    const ray_node *x = a, *y = b;
    if (x->head != y->head) return x->head ? -1 : 1;
    return strcmp(x->ip, y->ip);
}

/* The alive nodes (head first, then by address) with their GPUs and accelerator type. */
static int ray_nodes(const char *address, ray_node *nodes, int *n, char *err)
{
    cJSON *doc;
    if (ray_call(address, "/api/v0/nodes?limit=10000", NULL, &doc, err)) return UTIL_EIO;
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(doc, "data");
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(data, "result"), "result");
    if (!cJSON_IsArray(res)) {
        cJSON_Delete(doc);
        return util_fail(err, UTIL_EIO, "%s/api/v0/nodes: data.result.result: expected the list of nodes", address);
    }
    *n = 0;
    const cJSON *nd;
    cJSON_ArrayForEach(nd, res) {
        const cJSON *state = cJSON_GetObjectItemCaseSensitive(nd, "state"), *ip = cJSON_GetObjectItemCaseSensitive(nd, "node_ip");
        if (!cJSON_IsString(state) || strcmp(state->valuestring, "ALIVE") || !cJSON_IsString(ip)) continue;
        if (*n == RAY_MAX_NODES) break;
        ray_node *o = &nodes[(*n)++];
        memset(o, 0, sizeof *o);
        util_strlcpy(o->ip, ip->valuestring, sizeof o->ip);
        o->head = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(nd, "is_head_node"));
        const cJSON *rt = cJSON_GetObjectItemCaseSensitive(nd, "resources_total"), *kv;
        cJSON_ArrayForEach(kv, rt) {
            if (!strcmp(kv->string, "GPU") && cJSON_IsNumber(kv))   /* Ray reports counts as floats */
                o->gpus = kv->valuedouble >= 0 && kv->valuedouble <= 1 << 20 ? (int)kv->valuedouble : 0;
            else if (!strncmp(kv->string, "accelerator_type:", 17)) util_strlcpy(o->accel, kv->string + 17, sizeof o->accel);
        }
    }
    cJSON_Delete(doc);
    qsort(nodes, (size_t)*n, sizeof *nodes, by_head_then_ip);
    return UTIL_OK;
}

/* Ray's accelerator types (ray/util/accelerators/accelerators.py) with one
 * GPU file here; "A100" names both memory sizes, so it needs --gpu. */
static const char *gpu_of_accel(const char *accel)
{
    static const char *map[][2] = { {"H100", "H100-SXM-80GB"}, {"H200", "H200-141GB"}, {"L40S", "L40S"} };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (!strcmp(accel, map[i][0])) return map[i][1];
    return NULL;
}

/* The links of the first preset cluster with this GPU (Ray does not report
 * the interconnect), or of --links-from. */
static int links_for(const char *gpu, const char *links_from, cost_pool *pool, char *err)
{
    for (int i = links_from ? -1 : 0; i < (links_from ? 0 : cost_preset_count()); i++) {
        static cost_cluster c;
        if (cost_cluster_load(links_from ? links_from : cost_preset_name(i), &c, err)) return UTIL_EINVAL;
        for (int k = 0; k < c.n_pools; k++)
            if (links_from || !strcmp(c.pool[k].gpu.name, gpu)) {
                pool->intra = c.pool[k].intra;
                pool->inter = c.pool[k].inter;
                return UTIL_OK;
            }
    }
    return util_fail(err, UTIL_ENOTFOUND, "no preset cluster has %s GPUs to copy the links from: give --links-from "
                     "PRESET or FILE", gpu);
}

int cli_clusters_from_ray(const char *address, const char *gpu, const char *links_from, cost_cluster *c, char *err)
{
    static ray_node nodes[RAY_MAX_NODES];
    int n;
    if (ray_nodes(address, nodes, &n, err)) return UTIL_EIO;
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "ray");
    for (int i = 0; i < n; i++) {
        if (nodes[i].gpus <= 0) continue;
        const char *name = gpu ? gpu : gpu_of_accel(nodes[i].accel);
        if (!name)
            return util_fail(err, UTIL_EINVAL, "%s: node %s: accelerator type '%s' names no GPU file here: give --gpu "
                             "NAME (dhp clusters prints the GPUs)", address, nodes[i].ip,
                             nodes[i].accel[0] ? nodes[i].accel : "(none)");
        int k = 0;
        while (k < c->n_pools && (strcmp(c->pool[k].gpu.name, name) || c->pool[k].gpus_per_node != nodes[i].gpus)) k++;
        if (k == c->n_pools) {
            if (k == COST_MAX_POOLS) return util_fail(err, UTIL_EINVAL, "%s: more than %d kinds of node", address, COST_MAX_POOLS);
            cost_pool *pool = &c->pool[c->n_pools++];
            if (cost_gpu_load(name, &pool->gpu, err) || links_for(name, links_from, pool, err)) return UTIL_EINVAL;
            snprintf(pool->name, sizeof pool->name, "ray%d", k);
            pool->gpus_per_node = nodes[i].gpus;
        }
        c->pool[k].nodes++;
    }
    if (c->n_pools == 0) return util_fail(err, UTIL_EINVAL, "%s: no alive node with GPUs", address);
    c->cross_pool = cost_cluster_default_cross_pool(c);
    return cost_cluster_validate(c, err);
}

/* Plan node h -> the next unused Ray node with enough GPUs. */
static int assign_hosts(const plan_t *p, const ray_node *nodes, int n, cli_hosts *h, char *err)
{
    bool used[RAY_MAX_NODES] = { false };
    int need = plan_cluster_nodes(p), host = 0;
    h->n = 0;
    for (int i = 0; i < p->cluster.n_pools && h->n < need; i++)
        for (int nd = 0; nd < p->cluster.pool[i].nodes; nd++, host++) {
            int gpn = p->cluster.pool[i].gpus_per_node, j = 0;
            while (j < n && (used[j] || nodes[j].gpus < gpn)) j++;
            if (j == n) {
                /* nodes the plan does not touch need no Ray node */
                bool touched = false;
                for (int r = 0; r < p->world_size && !touched; r++) {
                    plan_place pl;
                    touched = plan_rank_place(p, r, &pl, err) == UTIL_OK && pl.host == host;
                }
                if (touched)
                    return util_fail(err, UTIL_EINVAL, "the plan's node %d (pool %s) needs %d GPUs; the Ray cluster "
                                     "has no other alive node with as many", host, p->cluster.pool[i].name, gpn);
                util_strlcpy(h->name[h->n++], "unused", CLI_HOST_LEN);
                continue;
            }
            used[j] = true;
            util_strlcpy(h->name[h->n++], nodes[j].ip, CLI_HOST_LEN);
        }
    return UTIL_OK;
}

/* sh -c text: write the rankfile, run mpirun, remove the rankfile, keep mpirun's status. */
static int entrypoint(const plan_t *p, const cli_placement *pl, const cli_hosts *h, const char *plan_path, int argc,
                      char **argv, cli_buf *e, char *err)
{
    cli_buf rf = { 0 };
    cli_launch_rankfile(pl, h, p->world_size, &rf);
    cli_buf_add(e, "rf=$(mktemp) && printf '%s\\n'");
    for (char *save = NULL, *l = strtok_r(rf.s, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cli_buf_add(e, " ");
        cli_buf_word(e, l);
    }
    cli_buf_free(&rf);
    cli_buf_printf(e, " >\"$rf\" && mpirun -np %d --rankfile \"$rf\" ", p->world_size);
    if (cli_launch_run_words(plan_path, argc, argv, e, err)) return UTIL_EIO;
    cli_buf_add(e, "; rc=$?; rm -f \"$rf\"; exit $rc");
    return UTIL_OK;
}

static int wait_for(const char *address, const char *id, int timeout_s, char *status, size_t n, char *err)
{
    char path[512];
    snprintf(path, sizeof path, "/api/jobs/%s", id);
    time_t end = time(NULL) + timeout_s;
    for (;;) {
        cJSON *doc;
        if (ray_call(address, path, NULL, &doc, err)) return UTIL_EIO;
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(doc, "status");
        util_strlcpy(status, cJSON_IsString(st) ? st->valuestring : "?", n);
        cJSON_Delete(doc);
        if (!strcmp(status, "SUCCEEDED") || !strcmp(status, "FAILED") || !strcmp(status, "STOPPED")) return UTIL_OK;
        if (time(NULL) >= end)
            return util_fail(err, UTIL_EIO, "Ray job %s still %s after %d s (--timeout)", id, status, timeout_s);
        sleep(1);
    }
}

int cli_launch_ray(const plan_t *p, const char *plan_path, const char *address, int cores_per_node, bool wait,
                   int timeout_s, int argc, char **argv)
{
    static ray_node nodes[RAY_MAX_NODES];
    static cli_hosts hosts;
    static cli_placement pl;
    char err[UTIL_ERR_LEN];
    int n;
    if (ray_nodes(address, nodes, &n, err) || assign_hosts(p, nodes, n, &hosts, err) ||
        cli_launch_place(p, &hosts, cores_per_node, &pl, err))
        return cli_bad_input(err);
    cli_buf e = { 0 };
    if (entrypoint(p, &pl, &hosts, plan_path, argc, argv, &e, err)) { cli_buf_free(&e); return cli_bad_input(err); }
    cJSON *req = cJSON_CreateObject();
    cJSON_AddStringToObject(req, "entrypoint", e.s);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(req, "metadata"), "dhp_plan", plan_path);
    char *body = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    cJSON *doc;
    int rc = ray_call(address, "/api/jobs/", body, &doc, err);
    free(body);
    if (rc) { cli_buf_free(&e); return cli_bad_input(err); }
    const cJSON *sid = cJSON_GetObjectItemCaseSensitive(doc, "submission_id");
    char id[256];
    util_strlcpy(id, cJSON_IsString(sid) ? sid->valuestring : "", sizeof id);
    cJSON_Delete(doc);
    if (!id[0] || strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != strlen(id)) {
        cli_buf_free(&e);
        snprintf(err, sizeof err, "%s/api/jobs/: the answer has no usable submission_id", address);
        return cli_bad_input(err);
    }
    printf("submitted Ray job %s to %s: %d ranks on %d node(s)\n  %s\n", id, address, p->world_size, pl.hosts_used, e.s);
    cli_buf_free(&e);
    if (!wait) return 0;
    fflush(stdout);
    char status[32], path[512];
    if (wait_for(address, id, timeout_s, status, sizeof status, err)) return cli_bad_input(err);
    snprintf(path, sizeof path, "/api/jobs/%s/logs", id);
    if (ray_call(address, path, NULL, &doc, err) == UTIL_OK) {
        const cJSON *logs = cJSON_GetObjectItemCaseSensitive(doc, "logs");
        if (cJSON_IsString(logs)) fputs(logs->valuestring, stdout);
        cJSON_Delete(doc);
    }
    printf("Ray job %s: %s\n", id, status);
    if (strcmp(status, "SUCCEEDED")) { fprintf(stderr, "dhp launch: Ray job %s %s\n", id, status); return 1; }
    return 0;
}
