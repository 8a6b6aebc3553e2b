/* `dhp run --resume`: the step every rank resumes from is decided once, by
 * rank 0, from DIR/latest and a check of the whole step directory, and sent
 * to every rank before any of them loads a byte. Each rank reading `latest`
 * and its own modules' files on its own let a partial restore (files of two
 * steps) resume ranks at different steps, which then waited for each other
 * forever. */
#include "executor/run_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The step DIR/latest names ("step-NNNNNNNN\n", as run_ckpt_save writes it). */
static int read_latest(const run_ctx *r, long long *step, char *err)
{
    char path[4096 + 16], *text = NULL;
    snprintf(path, sizeof path, "%s/latest", r->o->ckpt_dir);
    int rc = util_read_text_file(path, 64, &text, NULL, err);
    if (rc) return util_fail(err, rc, "checkpoint: --resume: no checkpoint in %s (%s is missing or unreadable)", r->o->ckpt_dir, path);
    char *end = NULL;
    long long s = -1;
    if (!strncmp(text, "step-", 5)) s = strtoll(text + 5, &end, 10);
    if (!end || end == text + 5 || (*end && strcmp(end, "\n")) || s < 0 || s > INT32_MAX)
        rc = util_fail(err, UTIL_EINVAL, "checkpoint: %s is corrupt (expected step-NNNNNNNN)", path);
    util_free(text);
    *step = s;
    return rc;
}

/* What is wrong with module k's file of the step, appended to why (empty: nothing). */
static void check_module_file(const run_ctx *r, int k, const char *dir, long long step, char *why, size_t n)
{
    const char *mod = r->plan.mod[k].module;
    char path[4096 + 80], problem[UTIL_ERR_LEN] = "";
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, mod);
    struct stat st;
    ex_ckpt *c = NULL;
    if (stat(path, &st) != 0) snprintf(problem, sizeof problem, "%s.safetensors is missing", mod);
    else if (ex_ckpt_open(path, &c, problem) == UTIL_OK) {
        const char *s = ex_ckpt_meta(c, "step"), *m = ex_ckpt_meta(c, "module");
        char *end = NULL;
        long long at = s ? strtoll(s, &end, 10) : -1;
        if (!m || strcmp(m, mod)) snprintf(problem, sizeof problem, "%s.safetensors holds module %s", mod, m ? m : "?");
        else if (!end || *end || at != step)
            snprintf(problem, sizeof problem, "%s.safetensors is at step %s", mod, s ? s : "?");
    }
    ex_ckpt_close(c);
    if (!problem[0]) return;
    size_t len = strlen(why);
    if (len && len + 2 < n) {
        memcpy(why + len, "; ", 3);
        len += 2;
    }
    if (len < n) util_strlcpy(why + len, problem, n - len);
}

/* Rank 0's verdict on the step directory latest names. */
static int check_step(const run_ctx *r, char *dir, size_t n, long long *step, char *err)
{
    int rc = read_latest(r, step, err);
    if (!rc && run_ckpt_step_dir(r, *step, dir, n)) rc = util_fail(err, UTIL_EINVAL, "checkpoint: path too long");
    if (rc) return rc;
    char why[UTIL_ERR_LEN] = "";
    for (int k = 0; k < r->plan.n_modules; k++) check_module_file(r, k, dir, *step, why, sizeof why);
    if (why[0])
        return util_fail(err, UTIL_EINVAL, "checkpoint: %s (named by %s/latest) is not a complete checkpoint of this plan: %s",
                         dir, r->o->ckpt_dir, why);
    return UTIL_OK;
}

int run_ckpt_resume_step(run_ctx *r, char *dir, size_t n, long long *step, char *err)
{
    struct { int rc; long long step; char msg[UTIL_ERR_LEN]; } v = { UTIL_OK, -1, "" };
    if (r->rank == 0) {
        v.rc = check_step(r, dir, n, &v.step, v.msg);
    }
    if (ex_comm_bcast(r->world, &v, sizeof v, 0))
        return util_fail(err, UTIL_ERUNTIME, "checkpoint: sharing the resume step failed: %s", ex_comm_error(r->world));
    /* one line per job: rank 0 prints it, the others return the code with an empty message */
    if (v.rc) {
        if (r->rank == 0) util_strlcpy(err, v.msg, UTIL_ERR_LEN);
        else err[0] = '\0';
        return v.rc;
    }
    *step = v.step;
    return run_ckpt_step_dir(r, v.step, dir, n) ? util_fail(err, UTIL_EINVAL, "checkpoint: path too long") : UTIL_OK;
}
