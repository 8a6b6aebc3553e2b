/* tests/ncclemu_init.h (included by tests/ncclemu.h): communicator set-up,
 * non-blocking as NCCL's with ncclConfig_t.blocking = 0 (the only mode
 * executor/comm_nccl.c uses): ncclCommInitRankConfig posts the bootstrap
 * and returns ncclInProgress; ncclCommGetAsyncError advances it and says
 * ncclInProgress until it is done. The bootstrap: every member sends (its
 * rank, its world rank) to the id's root with MPI_Isend, the root answers
 * each with the table of world ranks; the members then build the MPI
 * communicator of the group. DHP_EMU_NCCL_FAULT=RANK:init:stall makes world
 * rank RANK never take part (a peer that hangs or died during set-up): its
 * peers' set-up stays in progress. */
#ifndef DHP_TESTS_NCCLEMU_INIT_H
#define DHP_TESTS_NCCLEMU_INIT_H

typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER { sizeof(ncclConfig_t), 0xcafebeef, EMU_NCCL_VERSION, 1 }

struct emu_boot {
    int tag, root, rank, nranks;
    bool table_sent;   /* the root: its answers are posted */
    bool stalled;      /* DHP_EMU_NCCL_FAULT=RANK:init:stall */
    int pair[2];       /* this member's (rank, world rank) */
    int *world;        /* nranks world ranks */
    int *got;          /* the root: the other members' pairs, 2 ints each */
    MPI_Request *req;  /* nranks requests at most */
    int nreq;
};

static inline bool emu_init_stalls(void)
{
    const char *v = getenv("DHP_EMU_NCCL_FAULT");
    int rank = -1, me = -2, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    return v && sscanf(v, "%d:init:stall%n", &rank, &n) == 1 && n > 0 && v[n] == '\0' && rank == me;
}

static inline void emu_boot_free(struct emu_boot *b)
{
    if (!b) return;
    free(b->world);
    free(b->got);
    free(b->req);
    free(b);
}

/* Posts this member's part; false when MPI refused. */
static inline bool emu_boot_post(struct emu_boot *b)
{
    if (b->stalled) return true;
    if (b->pair[1] == b->root) {
        b->world[b->rank] = b->root;
        for (int i = 0; i + 1 < b->nranks; i++)
            if (MPI_Irecv(b->got + 2 * i, 2, MPI_INT, MPI_ANY_SOURCE, b->tag, MPI_COMM_WORLD, &b->req[b->nreq++]) != MPI_SUCCESS)
                return false;
        return true;
    }
    return MPI_Isend(b->pair, 2, MPI_INT, b->root, b->tag, MPI_COMM_WORLD, &b->req[b->nreq++]) == MPI_SUCCESS
        && MPI_Irecv(b->world, b->nranks, MPI_INT, b->root, b->tag + 1, MPI_COMM_WORLD, &b->req[b->nreq++]) == MPI_SUCCESS;
}

/* The group's MPI communicator from the table. */
static inline ncclResult_t emu_boot_finish(ncclComm_t c)
{
    struct emu_boot *b = c->boot;
    MPI_Group wg, g;
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_incl(wg, b->nranks, b->world, &g);
    bool ok = MPI_Comm_create_group(MPI_COMM_WORLD, g, b->tag, &c->comm) == MPI_SUCCESS;
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    if (ok) MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    emu_boot_free(b);
    c->boot = NULL;
    return ok ? ncclSuccess : ncclSystemError;
}

/* Advances c's set-up: ncclInProgress until it is done. */
static inline ncclResult_t emu_boot_progress(ncclComm_t c)
{
    struct emu_boot *b = c->boot;
    if (!b) return ncclSuccess;
    int flag = 0;
    if (b->stalled || MPI_Testall(b->nreq, b->req, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS || !flag)
        return ncclInProgress;
    b->nreq = 0;
    if (b->pair[1] == b->root && !b->table_sent) {   /* every pair in: the table to each member */
        for (int i = 0; i + 1 < b->nranks; i++) {
            int r = b->got[2 * i];
            if (r < 0 || r >= b->nranks) return ncclSystemError;
            b->world[r] = b->got[2 * i + 1];
        }
        for (int i = 0; i < b->nranks; i++)
            if (i != b->rank && MPI_Isend(b->world, b->nranks, MPI_INT, b->world[i], b->tag + 1, MPI_COMM_WORLD,
                                          &b->req[b->nreq++]) != MPI_SUCCESS)
                return ncclSystemError;
        b->table_sent = true;
        return ncclInProgress;
    }
    return emu_boot_finish(c);
}

static inline ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                                  ncclConfig_t *config)
{
    emu_id e;
    memcpy(&e, id.internal, sizeof e);
    if (e.magic != EMU_MAGIC || nranks < 1 || rank < 0 || rank >= nranks || !config) return ncclInvalidArgument;
    ncclComm_t c = calloc(1, sizeof *c);
    struct emu_boot *b = calloc(1, sizeof *b);
    if (b) {
        b->world = calloc((size_t)nranks, sizeof *b->world);
        b->got = calloc((size_t)(2 * nranks), sizeof *b->got);
        b->req = calloc((size_t)nranks, sizeof *b->req);
    }
    if (!c || !b || !b->world || !b->got || !b->req) {
        free(c);
        emu_boot_free(b);
        return ncclSystemError;
    }
    b->tag = EMU_TAG_BOOT + 2 * (e.seq % 1000);
    b->root = e.root;
    b->rank = rank;
    b->nranks = nranks;
    b->pair[0] = rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &b->pair[1]);
    b->stalled = emu_init_stalls();
    c->rank = rank;
    c->size = nranks;
    c->boot = b;
    *out = c;
    if (!emu_boot_post(b)) return c->async = ncclSystemError;
    ncclResult_t r = emu_boot_progress(c);
    while (config->blocking && r == ncclInProgress) r = emu_boot_progress(c);
    c->async = r == ncclInProgress ? ncclSuccess : r;   /* in progress: ncclCommGetAsyncError advances it */
    return r;
}

#endif
