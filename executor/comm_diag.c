/* Which rank is missing when a wait times out. Every rank that waits in the
 * communicator (comm_mpi.c) answers pings on a private duplicate of the world
 * communicator; the rank whose wait timed out pings the members of the
 * communicator it waited on and names those that did not answer within a
 * few seconds: killed, stopped (SIGSTOP), or busy elsewhere for longer than
 * the timeout. If every member answers, they all wait, in different
 * operations: the ranks' schedules differ. */
#include "executor/comm_int.h"
#include "util/util.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

#define TAG_PING 1
#define TAG_PONG 2
#define PING_WAIT_S 3.0
#define PONG_SLOTS 256

static MPI_Comm g_ctl = MPI_COMM_NULL;
static int g_seq;

int comm_diag_init(void)
{
    if (g_ctl != MPI_COMM_NULL) return MPI_SUCCESS;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &g_ctl);
    if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(g_ctl, MPI_ERRORS_RETURN);
    return rc;
}

void comm_diag_free(void)
{
    if (g_ctl != MPI_COMM_NULL) MPI_Comm_free(&g_ctl);
}

/* Fire and forget: the payload lives in a ring of slots, long enough for an
 * eager send of one int to leave. */
static void send_int(int value, int dest, int tag)
{
    static int slot[PONG_SLOTS];
    static unsigned next;
    int *p = &slot[next++ % PONG_SLOTS];
    *p = value;
    MPI_Request req;
    if (MPI_Isend(p, 1, MPI_INT, dest, tag, g_ctl, &req) == MPI_SUCCESS) MPI_Request_free(&req);
}

void comm_diag_serve(void)
{
    if (g_ctl == MPI_COMM_NULL) return;
    for (;;) {
        int flag = 0, seq;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_PING, g_ctl, &flag, &st) != MPI_SUCCESS || !flag) return;
        if (MPI_Recv(&seq, 1, MPI_INT, st.MPI_SOURCE, TAG_PING, g_ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
        send_int(seq, st.MPI_SOURCE, TAG_PONG);
    }
}

/* World ranks of c's members (only member `peer` if >= 0); returns how many. */
static int members(MPI_Comm c, int peer, int *world, int max)
{
    MPI_Group g, wg;
    int size = 0;
    if (MPI_Comm_group(c, &g) != MPI_SUCCESS) return 0;
    MPI_Comm_group(g_ctl, &wg);
    MPI_Group_size(g, &size);
    int n = 0;
    for (int i = 0; i < size && n < max; i++) {
        if (peer >= 0 && i != peer) continue;
        MPI_Group_translate_ranks(g, 1, &i, wg, &world[n]);
        n++;
    }
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    return n;
}

/* Pings every member, collects pongs of this round for PING_WAIT_S. */
static void ping_round(const int *world, int n, int me, bool *answered)
{
    int seq = ++g_seq;
    for (int i = 0; i < n; i++) {
        answered[i] = world[i] == me;
        if (!answered[i]) send_int(seq, world[i], TAG_PING);
    }
    double end = util_now() + PING_WAIT_S;
    int missing = 0;
    for (int i = 0; i < n; i++) missing += !answered[i];
    while (missing > 0 && util_now() < end) {
        comm_diag_serve();
        int flag = 0, got;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_PONG, g_ctl, &flag, &st) != MPI_SUCCESS) break;
        if (!flag) { sched_yield(); continue; }
        if (MPI_Recv(&got, 1, MPI_INT, st.MPI_SOURCE, TAG_PONG, g_ctl, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        for (int i = 0; got == seq && i < n; i++)
            if (world[i] == st.MPI_SOURCE && !answered[i]) { answered[i] = true; missing--; }
    }
}

/* Appends world rank r to a list of ranks: the first 8, then how many more. */
static void add_rank(char *list, size_t n, int r, int before)
{
    size_t len = strlen(list);
    if (before < 8) snprintf(list + len, n - len, "%s%d", before ? ", " : "", r);
    else if (before == 8) snprintf(list + len, n - len, " and more");
}

/* Pings c's members (only `peer` if >= 0) and lists those that answer and
 * those that do not, this rank left out. */
typedef struct { char silent[256], alive[256]; int n_silent, n_alive, me; } diag_roll;

static void roll_call(MPI_Comm c, int peer, diag_roll *d)
{
    enum { MAX = 4096 };
    static int world[MAX];
    static bool answered[MAX];
    memset(d, 0, sizeof *d);
    d->me = -1;
    MPI_Comm_rank(g_ctl != MPI_COMM_NULL ? g_ctl : MPI_COMM_WORLD, &d->me);
    int m = g_ctl == MPI_COMM_NULL ? 0 : members(c, peer, world, MAX);
    ping_round(world, m, d->me, answered);
    for (int i = 0; i < m; i++) {
        if (world[i] == d->me) continue;
        if (answered[i]) add_rank(d->alive, sizeof d->alive, world[i], d->n_alive++);
        else add_rank(d->silent, sizeof d->silent, world[i], d->n_silent++);
    }
}

void comm_diag_timeout(MPI_Comm c, int peer, double waited, char *why, size_t n)
{
    diag_roll d;
    roll_call(c, peer, &d);
    int me = d.me;
    if (d.n_silent)
        snprintf(why, n, "rank %d waited %.0f s (the communication timeout): no answer from rank%s %s "
                 "(killed, stopped, or busy outside communication for that long)", me, waited, d.n_silent > 1 ? "s" : "", d.silent);
    else if (d.n_alive)
        snprintf(why, n, "rank %d waited %.0f s (the communication timeout): rank%s %s answer%s but did not complete it: "
                 "waiting in another operation (the ranks' schedules differ) or in a device operation that does not "
                 "finish (a hung NCCL kernel or link)", me, waited, d.n_alive > 1 ? "s" : "", d.alive, d.n_alive > 1 ? "" : "s");
    else if (g_ctl == MPI_COMM_NULL)
        snprintf(why, n, "rank %d waited %.0f s (the communication timeout); which rank is missing is not known "
                 "(no control channel)", me, waited);
    else
        snprintf(why, n, "rank %d waited %.0f s (the communication timeout) on an operation no other rank takes part in: "
                 "a device operation that does not finish (a hung kernel or NCCL)", me, waited);
}

void comm_diag_missing(MPI_Comm c, char *why, size_t n)
{
    diag_roll d;
    roll_call(c, -1, &d);
    if (d.n_silent)
        snprintf(why, n, "; no answer from rank%s %s (killed, stopped, or busy outside communication)",
                 d.n_silent > 1 ? "s" : "", d.silent);
    else
        snprintf(why, n, "%s", d.n_alive ? "; every other rank of the group answers" : "");
}
