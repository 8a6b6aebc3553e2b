/* executor-internal: what the MPI communicator (comm_mpi.c) shares with its
 * timeout diagnosis (comm_diag.c). */
#ifndef DHP_EXECUTOR_COMM_INT_H
#define DHP_EXECUTOR_COMM_INT_H

#include <mpi.h>
#include <stddef.h>

/* A private duplicate of MPI_COMM_WORLD for pings; an MPI return code. */
int comm_diag_init(void);
void comm_diag_free(void);
/* Answers the pings other ranks sent this one (called while it waits). */
void comm_diag_serve(void);
/* After a wait on c timed out: pings the members of c (only `peer`, its rank
 * in c, if >= 0) and writes into why which world ranks did not answer. */
void comm_diag_timeout(MPI_Comm c, int peer, double waited, char *why, size_t n);

#endif
