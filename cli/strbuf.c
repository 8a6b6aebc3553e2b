/* A growing string for the text dhp writes: launch scripts, command lines,
 * exported configs. Out of memory is not survivable here: abort with a line. */
#include "cli/cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void grow(cli_buf *b, size_t add)
{
    if (b->len + add + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + add + 1) cap *= 2;
    char *n = realloc(b->s, cap);
    if (!n) { fputs("dhp: out of memory\n", stderr); exit(2); }
    b->s = n;
    b->cap = cap;
}

void cli_buf_add(cli_buf *b, const char *s)
{
    size_t n = strlen(s);
    grow(b, n);
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

void cli_buf_printf(cli_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    grow(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* POSIX shell word: as is when it holds only safe characters, else in single
 * quotes with each ' written as '\'' . */
void cli_buf_word(cli_buf *b, const char *w)
{
    bool plain = *w != '\0';
    for (const char *c = w; *c; c++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.,/=+:@%", *c)) plain = false;
    if (plain) { cli_buf_add(b, w); return; }
    cli_buf_add(b, "'");
    for (const char *c = w; *c; c++) {
        if (*c == '\'') cli_buf_add(b, "'\\''");
        else { char one[2] = { *c, 0 }; cli_buf_add(b, one); }
    }
    cli_buf_add(b, "'");
}

void cli_buf_free(cli_buf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}
