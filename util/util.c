#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int util_fail(char *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, UTIL_ERR_LEN, fmt, ap);
        va_end(ap);
        util_sanitize(err);
    }
    return code;
}

void util_strlcpy(char *dst, const char *src, size_t n)
{
    if (n == 0) return;
    size_t len = strlen(src);
    if (len >= n) len = n - 1;
    memcpy(dst, src, len);
    dst[len] = '\0';
}

bool util_streq_nocase(const char *a, const char *b)
{
    return strcasecmp(a, b) == 0;
}

/* Each block carries a 16-byte header with its size and category so frees
 * can be charged back without a lookup table. */
typedef struct { size_t size; size_t cat; } mem_header;
/* Atomic: the kernels' worker threads and the tests' in-process ranks
 * allocate concurrently. Relaxed order: the counts are statistics, not
 * synchronisation. */
static _Atomic size_t mem_cur[UTIL_MEM_NCAT], mem_peak[UTIL_MEM_NCAT];

void util_mem_charge(util_mem_cat cat, size_t n)
{
    size_t now = atomic_fetch_add_explicit(&mem_cur[cat], n, memory_order_relaxed) + n;
    size_t peak = atomic_load_explicit(&mem_peak[cat], memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak_explicit(&mem_peak[cat], &peak, now, memory_order_relaxed,
                                                                memory_order_relaxed)) {}
}

void util_mem_discharge(util_mem_cat cat, size_t n)
{
    atomic_fetch_sub_explicit(&mem_cur[cat], n, memory_order_relaxed);
}

void *util_malloc_cat(util_mem_cat cat, size_t n)
{
    mem_header *h = malloc(sizeof(mem_header) + (n ? n : 1));
    if (!h) return NULL;
    h->size = n; h->cat = (size_t)cat;
    util_mem_charge((util_mem_cat)h->cat, n);
    return h + 1;
}

void *util_calloc_cat(util_mem_cat cat, size_t count, size_t size)
{
    if (size && count > SIZE_MAX / size) return NULL;
    void *p = util_malloc_cat(cat, count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

void util_free(void *p)
{
    if (!p) return;
    mem_header *h = (mem_header *)p - 1;
    util_mem_discharge((util_mem_cat)h->cat, h->size);
    free(h);
}

void *util_realloc(void *p, size_t n)
{
    if (!p) return util_malloc(n);
    mem_header *h = (mem_header *)p - 1;
    size_t old = h->size, cat = h->cat;
    mem_header *nh = realloc(h, sizeof(mem_header) + (n ? n : 1));
    if (!nh) return NULL;
    util_mem_discharge((util_mem_cat)cat, old);
    nh->size = n;
    util_mem_charge((util_mem_cat)cat, n);
    return nh + 1;
}

char *util_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = util_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

size_t util_mem_current(util_mem_cat cat) { return atomic_load_explicit(&mem_cur[cat], memory_order_relaxed); }
size_t util_mem_peak(util_mem_cat cat) { return atomic_load_explicit(&mem_peak[cat], memory_order_relaxed); }
void util_mem_reset_peaks(void)
{
    for (int i = 0; i < UTIL_MEM_NCAT; i++)
        atomic_store_explicit(&mem_peak[i], atomic_load_explicit(&mem_cur[i], memory_order_relaxed), memory_order_relaxed);
}

const char *util_mem_cat_name(util_mem_cat cat)
{
    static const char *names[UTIL_MEM_NCAT] = {
        "other", "parameters", "gradients", "optimizer", "activations", "comm_buffers", "zero_buffers", "workspace"
    };
    return (unsigned)cat < UTIL_MEM_NCAT ? names[cat] : "?";
}

const char *util_fmt_bytes(double bytes, char *buf, size_t n)
{
    const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
    int u = 0;
    double v = bytes;
    while (v >= 1024.0 && u < 4) { v /= 1024.0; u++; }
    /* 1023.5 KiB would print as "1024 KiB": move up a unit first */
    if (u > 0 && u < 4 && v >= 999.5) { v /= 1024.0; u++; }
    const char *fmt = u == 0 ? "%.0f %s" : v < 9.995 ? "%.2f %s" : v < 99.95 ? "%.1f %s" : "%.0f %s";
    snprintf(buf, n, fmt, v, unit[u]);
    return buf;
}

double util_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void util_sleep_until(double t)
{
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {}
}
