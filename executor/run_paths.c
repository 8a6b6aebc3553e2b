/* Where `dhp run` writes: checked before step 1 (a missing --trace directory
 * used to be found only after the whole run had trained), temp files of
 * killed runs removed, old checkpoints retired with --ckpt-keep. */
#include "executor/run_internal.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A temp file of util_write_atomic or ex_ckpt_write: NAME.tmp.XXXXXX. */
static bool is_temp_name(const char *name)
{
    const char *t = strstr(name, UTIL_TMP_INFIX);
    if (!t) return false;
    while (strstr(t + 1, UTIL_TMP_INFIX)) t = strstr(t + 1, UTIL_TMP_INFIX);
    const char *x = t + strlen(UTIL_TMP_INFIX);
    if (strlen(x) != 6) return false;
    for (; *x; x++)
        if (!((*x >= 'a' && *x <= 'z') || (*x >= 'A' && *x <= 'Z') || (*x >= '0' && *x <= '9'))) return false;
    return true;
}

/* "step-NNNNNNNN" -> N, else -1. */
static long long step_of(const char *name)
{
    if (strncmp(name, "step-", 5) || !name[5]) return -1;
    char *end;
    long long s = strtoll(name + 5, &end, 10);
    return *end || s < 0 ? -1 : s;
}

/* Removes dir's temp files (and, with checkpoints too, its *.safetensors);
 * returns how many files went. */
static int remove_files(const char *dir, bool checkpoints)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        bool ckpt = checkpoints && len > 12 && !strcmp(e->d_name + len - 12, ".safetensors");
        if (!ckpt && !is_temp_name(e->d_name)) continue;
        char path[4096 + 300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        n += unlink(path) == 0;
    }
    closedir(d);
    return n;
}

/* Temp files in DIR and its step directories: what a run killed while
 * writing a checkpoint leaves (its files were never renamed into place). */
static int remove_temp_files(const char *ckpt_dir)
{
    int n = remove_files(ckpt_dir, false);
    DIR *d = opendir(ckpt_dir);
    if (!d) return n;
    for (struct dirent *e; (e = readdir(d));) {
        if (step_of(e->d_name) < 0) continue;
        char path[4096 + 300];
        snprintf(path, sizeof path, "%s/%s", ckpt_dir, e->d_name);
        n += remove_files(path, false);
    }
    closedir(d);
    return n;
}

/* Every rank gets rank 0's verdict and its message. */
static int share_verdict(run_ctx *r, int rc, char *err)
{
    struct { int rc; char msg[UTIL_ERR_LEN]; } v = { rc, "" };
    if (r->rank == 0 && rc) util_strlcpy(v.msg, err, sizeof v.msg);
    if (ex_comm_bcast(r->world, &v, sizeof v, 0))
        return util_fail(err, UTIL_ERUNTIME, "run: %s", ex_comm_error(r->world));
    /* one line per job: rank 0 prints it, the others return the code with an empty message */
    if (v.rc && r->rank != 0) err[0] = '\0';
    return v.rc;
}

int run_paths_prepare(run_ctx *r, char *err)
{
    const ex_run_options *o = r->o;
    int rc = UTIL_OK;
    if (r->rank == 0) {
        if (o->ckpt_dir) rc = util_mkdir_writable(o->ckpt_dir, err);
        if (!rc && o->ckpt_dir) {
            int n = remove_temp_files(o->ckpt_dir);
            if (n) fprintf(stderr, "dhp run: removed %d temp file%s an interrupted run left in %s\n", n, n > 1 ? "s" : "", o->ckpt_dir);
        }
        if (!rc && o->trace_path) rc = util_check_output(o->trace_path, err);
    }
    if (rc) rc = UTIL_EINVAL;   /* a path the user gave: bad input (exit 2) */
    if ((rc = share_verdict(r, rc, err)) || !o->ckpt_dir) return rc;
    /* the module files are written by other ranks, possibly on other hosts: each checks it can */
    int mine = r->rank == 0 || !util_mkdir_writable(o->ckpt_dir, err) ? UTIL_OK : UTIL_EINVAL, all = mine;
    if (ex_comm_allreduce_max_int(r->world, &all, 1)) return util_fail(err, UTIL_ERUNTIME, "run: %s", ex_comm_error(r->world));
    if (all && !mine) return util_fail(err, all, "run: --ckpt %s cannot be written from another rank (its message is above)", o->ckpt_dir);
    return all;
}

static int by_step_desc(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

void run_ckpt_retain(run_ctx *r)
{
    int keep = r->o->ckpt_keep;
    if (keep <= 0) return;
    DIR *d = opendir(r->o->ckpt_dir);
    if (!d) return;
    long long *steps = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        long long s = step_of(e->d_name);
        /* steps after this one are not this run's (latest never named them) */
        if (s < 0 || s > r->step) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long long *ns = util_realloc(steps, cap * sizeof *ns);
            if (!ns) break;
            steps = ns;
        }
        steps[n++] = s;
    }
    closedir(d);
    qsort(steps, n, sizeof *steps, by_step_desc);
    for (size_t i = (size_t)keep; i < n; i++) {
        char dir[4096];
        if (run_ckpt_step_dir(r, steps[i], dir, sizeof dir)) continue;
        remove_files(dir, true);
        rmdir(dir);   /* fails, and keeps the directory, if anything else is in it */
    }
    util_free(steps);
}
