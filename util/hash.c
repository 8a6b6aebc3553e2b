/* String -> int map with open addressing (linear probing), for look-ups by
 * name in files with many entries: checkpoint headers, JSON objects. */
#include "util.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A per-process seed, so that a file cannot be crafted to make every name
 * collide (the probe sequence would then be quadratic again). */
static uint64_t hash_seed(void)
{
    static _Atomic uint64_t seed;
    uint64_t s = atomic_load_explicit(&seed, memory_order_relaxed);
    if (s) return s;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    s = ((uint64_t)ts.tv_nsec << 20 ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid() << 40) | 1;
    uint64_t zero = 0;
    atomic_compare_exchange_strong(&seed, &zero, s);
    return atomic_load_explicit(&seed, memory_order_relaxed);
}

/* FNV-1a 64 (Fowler, Noll, Vo; http://www.isthe.com/chongo/tech/comp/fnv/)
 * from the seed, finished with the splitmix64 mixer (Steele, Lea, Flood
 * 2014) so that the low bits used as the slot depend on every byte. */
static uint64_t hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull ^ hash_seed();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    return h ^ (h >> 31);
}

int util_strmap_init(util_strmap *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < 2 * expected + 2) {
        if (cap > SIZE_MAX / 4 / sizeof(util_strmap_slot)) return UTIL_ENOMEM;
        cap *= 2;
    }
    m->slot = util_calloc(cap, sizeof *m->slot);
    if (!m->slot) return UTIL_ENOMEM;
    m->cap = cap;
    return UTIL_OK;
}

void util_strmap_free(util_strmap *m)
{
    util_free(m->slot);
    memset(m, 0, sizeof *m);
}

static size_t find_slot(const util_strmap *m, const char *key)
{
    size_t i = (size_t)hash_str(key) & (m->cap - 1);
    while (m->slot[i].key && strcmp(m->slot[i].key, key)) i = (i + 1) & (m->cap - 1);
    return i;
}

static int grow(util_strmap *m)
{
    util_strmap bigger;
    if (m->cap > SIZE_MAX / 4 / sizeof(util_strmap_slot)) return UTIL_ENOMEM;
    bigger.slot = util_calloc(2 * m->cap, sizeof *bigger.slot);
    if (!bigger.slot) return UTIL_ENOMEM;
    bigger.cap = 2 * m->cap;
    bigger.n = m->n;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slot[i].key) bigger.slot[find_slot(&bigger, m->slot[i].key)] = m->slot[i];
    util_free(m->slot);
    *m = bigger;
    return UTIL_OK;
}

int util_strmap_put(util_strmap *m, const char *key, int value, int *existing)
{
    if (2 * (m->n + 1) > m->cap && grow(m)) return UTIL_ENOMEM;
    size_t i = find_slot(m, key);
    if (m->slot[i].key) {
        if (existing) *existing = m->slot[i].value;
        return UTIL_EINVAL;
    }
    m->slot[i] = (util_strmap_slot){ key, value };
    m->n++;
    return UTIL_OK;
}

int util_strmap_get(const util_strmap *m, const char *key)
{
    if (!m->cap) return -1;
    size_t i = find_slot(m, key);
    return m->slot[i].key ? m->slot[i].value : -1;
}
