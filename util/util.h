/* util: the lowest layer. One result-code convention for all of dhp, error
 * message buffers, whole-file I/O with atomic replace, and a counting
 * allocator with per-category totals (the executor's memory report reads it).
 *
 * Convention: every fallible function returns an int result code (UTIL_OK = 0)
 * and, on failure, writes one human-readable line into `err` (size UTIL_ERR_LEN)
 * that names the field or file and the problem. */
#ifndef DHP_UTIL_H
#define DHP_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define UTIL_ERR_LEN 512

enum {
    UTIL_OK = 0,
    UTIL_EINVAL = 2,   /* bad input: malformed, inconsistent or out-of-range values */
    UTIL_EIO = 3,      /* file could not be read or written */
    UTIL_ENOMEM = 4,   /* allocation failed */
    UTIL_ENOTFOUND = 5,/* unknown name (preset, model, module) */
    UTIL_EINFEASIBLE = 6, /* nothing fits (planner) */
    UTIL_EUNSUPPORTED = 7,/* valid request that this build does not implement */
    UTIL_ERUNTIME = 8  /* numeric failure at run time (NaN loss, MPI error) */
};

/* Formats into err (if non-NULL) and returns code, so callers can write
 * `return util_fail(err, UTIL_EINVAL, "model: field '%s' must be > 0", f);`
 * The line is scrubbed (util_sanitize): whatever a file or an argument put
 * in it, it prints as one line with no terminal control codes. */
int util_fail(char *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- files (util/files.c) ----
 * Inputs must be regular files: FIFOs, devices and directories are refused
 * before anything is read (a FIFO would block, /dev/zero never ends), and so
 * is a file above `max` bytes. *out is NUL-terminated; util_free it. */
int util_read_file_max(const char *path, size_t max, char **out, size_t *len, char *err);
/* util_read_file_max without a size limit of its own (binary inputs whose
 * expected size the caller checks). */
int util_read_file(const char *path, char **out, size_t *len, char *err);
/* The same for text: a NUL byte anywhere is refused (it would hide the rest). */
int util_read_text_file(const char *path, size_t max, char **out, size_t *len, char *err);
/* Limit for JSON documents dhp reads (models, clusters, plans, configs,
 * manifests): the largest one it writes is a few MB. */
#define UTIL_JSON_MAX_BYTES ((size_t)64 << 20)

/* Temp files of atomic writes are named PATH + UTIL_TMP_INFIX + 6 random
 * characters; a killed run leaves them behind, so cleaners look for it. */
#define UTIL_TMP_INFIX ".tmp."
/* Writes path atomically: temp file in the same directory, fsync, rename.
 * On any failure the temp file is removed and path is untouched. */
int util_write_atomic(const char *path, const void *data, size_t len, char *err);
/* An output the user named: "-" is stdout; an existing non-regular target
 * (a terminal, pipe, FIFO, /dev/null, or /dev/stdout) is written in place,
 * not replaced; a regular file (through a symbolic link: the file it names)
 * is replaced atomically. */
int util_write_output(const char *path, const void *data, size_t len, char *err);
/* Checks, before any work, that util_write_output(path) can succeed: the
 * directory exists and takes a new file, or the target accepts writes. */
int util_check_output(const char *path, char *err);
/* util_mkdir_p (util/path.c), then checks a file can be created in it. */
int util_mkdir_writable(const char *path, char *err);
/* write(2) until done (EINTR retried); -1 with errno on failure. Every file
 * write of dhp goes through it (the fault injection of util/files.c). */
int util_write_all(int fd, const void *data, size_t len);
/* Testing hook: the fault injection of the environment variables
 * DHP_FAULT_ENOSPC_AFTER / DHP_FAULT_KILL_AFTER (util/files.c) set directly,
 * -1 for none; the count of bytes written restarts at 0. */
void util_fault_inject(long long enospc_after, long long kill_after);
/* The descriptor "-" writes to (default 1): a command whose data goes to
 * stdout moves its report to stderr and keeps stdout's descriptor here. */
void util_set_stdout_fd(int fd);

/* ---- untrusted text (util/text.c) ---- */
/* Length of the well-formed UTF-8 sequence at s (1..4), 0 if none. */
size_t util_utf8_seq(const unsigned char *s, size_t left);
bool util_utf8_valid(const char *s, size_t n, size_t *bad_at);
/* Valid UTF-8 without control characters (C0, DEL, C1): safe to print. */
bool util_text_ok(const char *s);
/* A name that becomes part of a file name (module names): [A-Za-z0-9._-],
 * not empty, not starting with '.' or '-'. */
bool util_name_ok(const char *s);
/* In place: control characters and bytes of invalid UTF-8 become '?'. */
void util_sanitize(char *s);
/* An option's value among its names: the index of s in names[0..n), or
 * -1 with err (UTIL_ERR_LEN; may be NULL) saying "'s' is not a, b or c",
 * the names in table order. Every enum's name table parses through it, so
 * a message lists what the table holds. */
int util_name_index(const char *s, const char *const *names, int n, char *err);

/* CRC-32 (zlib's): crc = util_crc32(0, p, n), continued by passing it back. */
uint32_t util_crc32(uint32_t crc, const void *data, size_t n);

/* String -> int map (util/hash.c); keys are not copied and must outlive it. */
typedef struct { const char *key; int value; } util_strmap_slot;
typedef struct { util_strmap_slot *slot; size_t cap, n; } util_strmap;
int util_strmap_init(util_strmap *m, size_t expected);
void util_strmap_free(util_strmap *m);
/* UTIL_OK, UTIL_EINVAL if key is already there (its value in *existing), UTIL_ENOMEM. */
int util_strmap_put(util_strmap *m, const char *key, int value, int *existing);
/* The value, -1 if absent. */
int util_strmap_get(const util_strmap *m, const char *key);

/* Overflow-checked 64-bit arithmetic for sizes derived from input (false:
 * the result does not fit). */
static inline bool util_mul_i64(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool util_add_i64(int64_t a, int64_t b, int64_t *out) { return !__builtin_add_overflow(a, b, out); }

/* Counting allocator. Every byte dhp allocates for long-lived data goes
 * through these so per-category peaks can be reported (redis zmalloc style). */
typedef enum {
    UTIL_MEM_OTHER = 0,
    UTIL_MEM_PARAMS,
    UTIL_MEM_GRADS,
    UTIL_MEM_OPTIM,
    UTIL_MEM_ACTIV,
    UTIL_MEM_COMM,
    UTIL_MEM_ZERO,     /* ZeRO-3 gathered units and ZeRO-2/3 gradient buckets */
    UTIL_MEM_WORKSPACE, /* a backend library's own workspace (the CUDA backend's cuBLASLt) */
    UTIL_MEM_NCAT
} util_mem_cat;

void *util_malloc_cat(util_mem_cat cat, size_t n);
void *util_calloc_cat(util_mem_cat cat, size_t count, size_t size);
void util_free(void *p);
static inline void *util_malloc(size_t n) { return util_malloc_cat(UTIL_MEM_OTHER, n); }
static inline void *util_calloc(size_t c, size_t s) { return util_calloc_cat(UTIL_MEM_OTHER, c, s); }
void *util_realloc(void *p, size_t n);
char *util_strdup(const char *s);
/* Charges / discharges n bytes to a category without allocating: for memory
 * another allocator hands out (the CUDA backend's device buffers), so the
 * report and the planner's exact predictions count it the same way. */
void util_mem_charge(util_mem_cat cat, size_t n);
void util_mem_discharge(util_mem_cat cat, size_t n);
size_t util_mem_current(util_mem_cat cat);
size_t util_mem_peak(util_mem_cat cat);
void util_mem_reset_peaks(void);
const char *util_mem_cat_name(util_mem_cat cat);

/* Bounded string copy that always NUL-terminates. */
void util_strlcpy(char *dst, const char *src, size_t n);

/* Formats bytes with the unit that fits (B, KiB, MiB, GiB, TiB) and three
 * significant digits: "512 B", "1.50 KiB", "78.4 GiB". */
const char *util_fmt_bytes(double bytes, char *buf, size_t n);

/* Files under models/zoo, costdb/gpus and costdb/clusters are compiled into
 * the binary (build/gen/embedded.c) so built-in names work from any cwd.
 * Lookup by repository-relative path, e.g. "models/zoo/qwen2.5-vl-32b.json". */
typedef struct { const char *path; const unsigned char *data; size_t len; } util_embedded_file;
const util_embedded_file *util_embedded_find(const char *path);
int util_embedded_count(void);
const util_embedded_file *util_embedded_at(int i);

/* JSON helpers over cJSON. Each getter validates and, on failure, names the
 * field as "<ctx>.<key>" in err. `required` false means: absent -> dflt.
 * Integer getters reject non-integral numbers and values outside [lo, hi]. */
#include <cjson/cJSON.h>
/* Parses a JSON document and checks what cJSON lets through: invalid
 * UTF-8, control characters and \u0000 in strings, nesting deeper than
 * UTIL_JSON_MAX_DEPTH, and a key repeated in one object (cJSON keeps both;
 * which one a reader sees would be an accident). Errors name line:column. */
#define UTIL_JSON_MAX_DEPTH 64
int util_json_parse(const char *text, const char *what, cJSON **out, char *err);
/* util_read_text_file (UTIL_JSON_MAX_BYTES) + util_json_parse. */
int util_json_read(const char *path, cJSON **out, char *err);
int util_json_int(const cJSON *obj, const char *ctx, const char *key, bool required,
                  long lo, long hi, long dflt, long *out, char *err);
int util_json_num(const cJSON *obj, const char *ctx, const char *key, bool required,
                  double lo, double hi, double dflt, double *out, char *err);
int util_json_str(const cJSON *obj, const char *ctx, const char *key, bool required,
                  const char *dflt, char *out, size_t n, char *err);
int util_json_bool(const cJSON *obj, const char *ctx, const char *key, bool required,
                   bool dflt, bool *out, char *err);
/* Serialises with cJSON_Print and writes with util_write_output. */
int util_json_write(const char *path, const cJSON *root, char *err);

/* HTTP(S) through libcurl (util/http.c). Every request is bounded by the
 * options below (defaults from the environment: DHP_HTTP_MAX_BYTES (16 MiB),
 * DHP_HTTP_TIMEOUT (60 s total), DHP_HTTP_CONNECT_TIMEOUT (10 s),
 * DHP_HTTP_LOW_SPEED_TIME (15 s under 1 KiB/s), DHP_HTTP_MAX_REDIRECTS (5)).
 * URLs must be https, or http to a loopback host; a redirect may not go
 * from https to http. */
typedef struct {
    size_t max_bytes;
    long connect_timeout_s, timeout_s, low_speed_bytes, low_speed_time_s, max_redirects;
    const char *bearer;          /* Authorization: Bearer, sent to the first URL's host only */
} util_http_opts;
void util_http_opts_default(util_http_opts *o);
typedef struct { long status; char *body; size_t len; } util_http_response;   /* body: util_free */
/* method NULL: GET, or POST when body (JSON) is given. Any status is a
 * success here (resp->status says which); transport failures, caps and
 * timeouts are errors with one line naming the URL. opts NULL: defaults. */
int util_http_request(const char *method, const char *url, const char *body, const util_http_opts *opts,
                      util_http_response *resp, char *err);
/* UTIL_OK for 2xx, else one line "URL: HTTP 404 (not found): <first body line>". */
int util_http_check_status(const char *url, const util_http_response *r, char *err);
bool util_http_host_is_loopback(const char *host);
/* GET with the defaults, 2xx required; *out NUL-terminated, util_free it. */
int util_http_get(const char *url, char **out, size_t *len, char *err);

/* Progress of a long computation on stderr (util/progress.c): off unless
 * enabled (the planning commands enable it on a terminal); a phase is named
 * by its `what` string; done >= total ends it and erases the line. */
void util_progress_enable(bool on);
void util_progress(const char *what, double done, double total);

/* mkdir -p (mode 0755); UTIL_EIO naming the component that failed. */
int util_mkdir_p(const char *path, char *err);

/* Monotonic wall time in seconds. */
double util_now(void);
/* Sleeps until util_now() reaches t (returns at once if it has). */
void util_sleep_until(double t);

/* Case-insensitive equality. */
bool util_streq_nocase(const char *a, const char *b);

#endif
