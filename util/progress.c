/* A progress line on stderr for the long computations of the planning
 * commands (simulating thousands of ranks, searching large clusters): shown
 * only on a terminal, only once a phase has run a second, at most five
 * times a second, and erased when the phase ends. */
#include "util.h"

#include <stdio.h>

static bool g_on, g_shown;
static const char *g_what;
static double g_start, g_last;

void util_progress_enable(bool on) { g_on = on; }

void util_progress(const char *what, double done, double total)
{
    if (!g_on) return;
    double now = util_now();
    if (what != g_what) {
        g_what = what;
        g_start = now;
        g_last = 0;
    }
    if (done >= total) {
        if (g_shown) fprintf(stderr, "\r\033[K");
        g_shown = false;
        g_what = NULL;
        return;
    }
    if (now - g_start < 1.0 || now - g_last < 0.2) return;
    g_last = now;
    g_shown = true;
    fprintf(stderr, "\r\033[K%s: %.0f of %.0f (%.0f%%, %.0f s)", what, done, total, total > 0 ? 100 * done / total : 0,
            now - g_start);
    fflush(stderr);
}
