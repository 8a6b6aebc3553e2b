/* CRC-32/ISO-HDLC (the zlib / PNG CRC, RFC 1952 section 8: reflected
 * polynomial 0xEDB88320, init and final xor 0xFFFFFFFF), slicing-by-8
 * (Kounavis and Berry, "A Systematic Approach to Building High Performance
 * Software-Based CRC Generators", ISCC 2005): eight table look-ups per eight
 * bytes, several times the byte-wise loop's speed on checkpoint tensors. */
#include "util.h"

#include <pthread.h>

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t util_crc32(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&table_once, build_tables);
    const unsigned char *p = data;
    uint32_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t one = le32(p) ^ c, two = le32(p + 4);
        c = table[7][one & 0xFF] ^ table[6][(one >> 8) & 0xFF] ^ table[5][(one >> 16) & 0xFF] ^ table[4][one >> 24]
          ^ table[3][two & 0xFF] ^ table[2][(two >> 8) & 0xFF] ^ table[1][(two >> 16) & 0xFF] ^ table[0][two >> 24];
    }
    while (n--) c = table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}
