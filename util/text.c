/* Untrusted text: UTF-8 validation, the name rule for names that become
 * file names, and the scrub that keeps every error line one printable line. */
#include "util.h"

#include <stdio.h>
#include <string.h>

/* Length of the well-formed UTF-8 sequence at s (1..4 bytes), 0 if there is
 * none: the table of well-formed byte sequences of the Unicode Standard
 * (version 15, section 3.9, table 3-7) — no overlong forms, no surrogates
 * U+D800..U+DFFF, nothing above U+10FFFF. */
size_t util_utf8_seq(const unsigned char *s, size_t left)
{
    if (left == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (left < n || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

bool util_utf8_valid(const char *s, size_t n, size_t *bad_at)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t k = util_utf8_seq(p + i, n - i);
        if (!k) {
            if (bad_at) *bad_at = i;
            return false;
        }
        i += k;
    }
    return true;
}

/* C0 controls, DEL and the C1 controls U+0080..U+009F (UTF-8 C2 80..C2 9F):
 * the bytes a terminal acts on (ESC starts escape sequences, C1 CSI too). */
static bool is_control_at(const unsigned char *p, size_t k)
{
    return (k == 1 && (p[0] < 0x20 || p[0] == 0x7F)) || (k == 2 && p[0] == 0xC2 && p[1] < 0xA0);
}

bool util_text_ok(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = util_utf8_seq(p + i, n - i);
        if (!k || is_control_at(p + i, k)) return false;
        i += k;
    }
    return true;
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

bool util_name_ok(const char *s)
{
    if (!s || !s[0] || s[0] == '.' || s[0] == '-') return false;
    for (const char *p = s; *p; p++)
        if (!name_char(*p)) return false;
    return true;
}

void util_sanitize(char *s)
{
    unsigned char *p = (unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = util_utf8_seq(p + i, n - i);
        if (!k) { p[i++] = '?'; continue; }
        if (is_control_at(p + i, k)) memset(p + i, '?', k);
        i += k;
    }
}

int util_name_index(const char *s, const char *const *names, int n, char *err)
{
    for (int i = 0; s && i < n; i++)
        if (!strcmp(s, names[i])) return i;
    if (!err) return -1;
    size_t at = (size_t)snprintf(err, UTIL_ERR_LEN, "'%s' is not ", s ? s : "");
    for (int i = 0; i < n && at < UTIL_ERR_LEN; i++)
        at += (size_t)snprintf(err + at, UTIL_ERR_LEN - at, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", names[i]);
    return -1;
}
