/* Chrome trace event format writer (the "JSON Array Format" of the Trace
 * Event Format document, readable by chrome://tracing and Perfetto): complete
 * events "ph": "X" with microsecond "ts" / "dur", pid = rank, tid = lane, and
 * "M" metadata events naming processes and lanes. */
#include "planner/planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const lane_names[PLAN_TRACE_NLANES] = { "compute", "comm" };

static cJSON *metadata(const char *what, int pid, int tid, const char *name)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", what);
    cJSON_AddStringToObject(e, "ph", "M");
    cJSON_AddNumberToObject(e, "pid", pid);
    if (tid >= 0) cJSON_AddNumberToObject(e, "tid", tid);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(e, "args"), "name", name);
    return e;
}

static cJSON *complete(const plan_trace_event *ev)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", ev->name);
    cJSON_AddStringToObject(e, "cat", lane_names[ev->lane]);
    cJSON_AddStringToObject(e, "ph", "X");
    cJSON_AddNumberToObject(e, "ts", ev->start_s * 1e6);
    cJSON_AddNumberToObject(e, "dur", (ev->end_s - ev->start_s) * 1e6);
    cJSON_AddNumberToObject(e, "pid", ev->rank);
    cJSON_AddNumberToObject(e, "tid", ev->lane);
    cJSON *args = cJSON_AddObjectToObject(e, "args");
    if (ev->chunk >= 0) cJSON_AddNumberToObject(args, "chunk", ev->chunk);
    if (ev->samples >= 0) cJSON_AddNumberToObject(args, "samples", ev->samples);
    if (ev->bytes >= 0) cJSON_AddNumberToObject(args, "bytes", ev->bytes);
    return e;
}

int plan_trace_write(const char *path, const plan_trace_event *ev, int n, int world_size,
                     const char *const *names, char *err)
{
    for (int i = 0; i < n; i++) {
        if (ev[i].rank < 0 || ev[i].rank >= world_size)
            return util_fail(err, UTIL_EINVAL, "trace: event %d (%s): rank %d outside 0..%d", i, ev[i].name, ev[i].rank, world_size - 1);
        if ((int)ev[i].lane < 0 || ev[i].lane >= PLAN_TRACE_NLANES)
            return util_fail(err, UTIL_EINVAL, "trace: event %d (%s): lane %d is not compute or comm", i, ev[i].name, (int)ev[i].lane);
        if (!(ev[i].end_s >= ev[i].start_s))
            return util_fail(err, UTIL_EINVAL, "trace: event %d (%s) ends before it starts", i, ev[i].name);
    }
    cJSON *doc = cJSON_CreateArray();
    for (int r = 0; r < world_size; r++) {
        char name[64];
        snprintf(name, sizeof name, "rank %d", r);
        cJSON_AddItemToArray(doc, metadata("process_name", r, -1, names && names[r] ? names[r] : name));
        cJSON *order = metadata("process_sort_index", r, -1, "");
        cJSON *args = cJSON_GetObjectItemCaseSensitive(order, "args");
        cJSON_DeleteItemFromObject(args, "name");
        cJSON_AddNumberToObject(args, "sort_index", r);
        cJSON_AddItemToArray(doc, order);
        for (int l = 0; l < PLAN_TRACE_NLANES; l++) cJSON_AddItemToArray(doc, metadata("thread_name", r, l, lane_names[l]));
    }
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(doc, complete(&ev[i]));
    char *text = cJSON_PrintUnformatted(doc);
    cJSON_Delete(doc);
    if (!text) return util_fail(err, UTIL_ENOMEM, "trace: out of memory writing %s", path);
    int rc = util_write_output(path, text, strlen(text), err);
    free(text);
    return rc;
}
