/* What costdb's loaders share (load.c: shipped files, field getters, GPU
 * files; load_cluster.c: cluster files). Private to costdb/. Every getter's
 * error reads "<what>: <field path>: <problem>". */
#ifndef DHP_COSTDB_LOAD_INT_H
#define DHP_COSTDB_LOAD_INT_H

#include "costdb/costdb.h"

#include <stdbool.h>
#include <stddef.h>

/* The shipped cluster preset NAME (NULL when none), and the presets' names, comma separated. */
const util_embedded_file *cost_preset_file(const char *name);
void cost_preset_names(char *buf, size_t n);

/* "path.key" (or "key" at the top) into out. */
void cost_field_path(char *out, size_t n, const char *path, const char *key);
int cost_get_num(const cJSON *obj, const char *what, const char *path, const char *key, double *out, char *err);
int cost_get_int(const cJSON *obj, const char *what, const char *path, const char *key, int *out, char *err);
int cost_get_str(const cJSON *obj, const char *what, const char *path, const char *key, char *out, size_t n, char *err);
int cost_check_schema(const cJSON *obj, const char *what, const char *path, const char *want, bool required, char *err);
int cost_check_source(const cJSON *obj, const char *what, const char *path, char *err);
/* v within [lo, hi] (lo excluded when lo_open). */
int cost_check_range(const char *what, const char *path, const char *key, double v, double lo, bool lo_open, double hi,
                     char *err);

/* A GPU figure: a number, or an object {"value": v, "source": "..."}. */
int cost_gpu_field(const cJSON *obj, const char *what, const char *path, const char *key, double *out, char *err);
int cost_validate_gpu(const cost_gpu *g, const char *what, const char *path, char *err);
int cost_parse_gpu_obj(const cJSON *obj, const char *what, const char *path, bool need_schema, cost_gpu *g, char *err);
/* A shipped file's text, NUL-terminated, malloc'd. */
char *cost_embedded_text(const util_embedded_file *f, char *err);

#endif
