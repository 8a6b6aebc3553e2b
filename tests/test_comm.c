/* The MPI-less self communicator (executor/comm.h): collectives are copies,
 * messages to self are matched by tag in order, bad calls fail cleanly.
 * The MPI side is checked by tests/mpi/comm_check.c under mpirun. */
#include "test.h"
#include "executor/comm.h"
#include "util/util.h"

#include <string.h>

static ex_comm *self_comm(void)
{
    char err[UTIL_ERR_LEN];
    ex_comm *c = NULL;
    return ex_comm_self(&c, err) == UTIL_OK ? c : NULL;
}

TEST(comm_self_collectives_are_copies)
{
    ex_comm *c = self_comm();
    CHECK(c != NULL);
    CHECK_EQ_INT(ex_comm_rank(c), 0);
    CHECK_EQ_INT(ex_comm_size(c), 1);
    float f[3] = { 1.5f, -2, 7 }, g[3] = { 0 };
    double d[2] = { 0.25, -1e300 };
    int k[2] = { -4, 9 };
    CHECK_OK(ex_comm_barrier(c));
    CHECK_OK(ex_comm_allreduce_sum(c, f, 3));
    CHECK_OK(ex_comm_allreduce_max(c, f, 3));
    CHECK(f[0] == 1.5f && f[1] == -2 && f[2] == 7);
    CHECK_OK(ex_comm_allreduce_sum_f64(c, d, 2));
    CHECK(d[0] == 0.25 && d[1] == -1e300);
    CHECK_OK(ex_comm_allreduce_max_int(c, k, 2));
    CHECK(k[0] == -4 && k[1] == 9);
    CHECK_OK(ex_comm_allgather(c, f, g, 3));
    CHECK(memcmp(f, g, sizeof f) == 0);
    memset(g, 0, sizeof g);
    CHECK_OK(ex_comm_reduce_scatter(c, f, g, 3));
    CHECK(memcmp(f, g, sizeof f) == 0);
    memset(g, 0, sizeof g);
    CHECK_OK(ex_comm_alltoall(c, f, g, 3));
    CHECK(memcmp(f, g, sizeof f) == 0);
    char b[4] = "abc", r[4] = "";
    CHECK_OK(ex_comm_bcast(c, b, 4, 0));
    CHECK(strcmp(b, "abc") == 0);
    CHECK_OK(ex_comm_gather_bytes(c, b, r, 4, 0));
    CHECK(strcmp(r, "abc") == 0);
    CHECK_OK(ex_comm_allreduce_sum(c, NULL, 0));
    CHECK_EQ_INT(ex_comm_bytes(c), 0);
    CHECK_EQ_INT(ex_comm_error(c)[0], 0);
    CHECK_EQ_INT(ex_comm_bcast(c, b, 4, 1), UTIL_ERUNTIME);
    CHECK(strstr(ex_comm_error(c), "root 1") != NULL);
    CHECK_EQ_INT(ex_comm_gather_bytes(c, b, r, 4, -1), UTIL_ERUNTIME);
    CHECK_EQ_INT(ex_comm_allgather(c, NULL, g, 3), UTIL_ERUNTIME);
    ex_comm_free(c);
}

TEST(comm_self_messages_match_by_tag_in_order)
{
    size_t mem0 = util_mem_current(UTIL_MEM_COMM);
    ex_comm *c = self_comm();
    CHECK(c != NULL);
    float a[4] = { 1, 2, 3, 4 }, b[2] = { 5, 6 }, a2[4] = { 9, 9, 9, 9 };
    float ra[4] = { 0 }, rb[2] = { 0 }, ra2[4] = { 0 }, early[2] = { 0 };
    ex_request *sa, *sb, *sa2, *qa, *qb, *qa2, *qe, *se;
    /* a receive posted before its send */
    CHECK_OK(ex_comm_irecv(c, early, 2, 0, 77, &qe));
    /* two tags sent, received in the other order; same tag keeps FIFO order */
    CHECK_OK(ex_comm_isend(c, a, 4, 0, 1, &sa));
    CHECK_OK(ex_comm_isend(c, b, 2, 0, 2, &sb));
    CHECK_OK(ex_comm_isend(c, a2, 4, 0, 1, &sa2));
    CHECK_OK(ex_comm_irecv(c, rb, 2, 0, 2, &qb));
    CHECK_OK(ex_comm_irecv(c, ra, 4, 0, 1, &qa));
    CHECK_OK(ex_comm_irecv(c, ra2, 4, 0, 1, &qa2));
    CHECK_OK(ex_comm_isend(c, b, 2, 0, 77, &se));
    CHECK_OK(ex_comm_wait(c, qa2));
    CHECK_OK(ex_comm_wait(c, sa));
    CHECK_OK(ex_comm_wait(c, qb));
    CHECK_OK(ex_comm_wait(c, se));
    CHECK_OK(ex_comm_wait(c, sb));
    CHECK_OK(ex_comm_wait(c, qa));
    CHECK_OK(ex_comm_wait(c, sa2));
    CHECK_OK(ex_comm_wait(c, qe));
    CHECK(memcmp(ra, a, sizeof a) == 0);
    CHECK(memcmp(ra2, a2, sizeof a2) == 0);
    CHECK(memcmp(rb, b, sizeof b) == 0);
    CHECK(memcmp(early, b, sizeof b) == 0);
    CHECK_EQ_INT(ex_comm_bytes(c), (4 + 2 + 4 + 2) * sizeof(float));

    /* blocking send to self is buffered (COMM memory) until received */
    float x[3] = { 1, 2, 3 }, y[3] = { 0 };
    CHECK_OK(ex_comm_send(c, x, 3, 0, 5));
    CHECK(util_mem_current(UTIL_MEM_COMM) >= mem0 + sizeof x);
    x[0] = -1;
    CHECK_OK(ex_comm_recv(c, y, 3, 0, 5));
    CHECK(y[0] == 1 && y[1] == 2 && y[2] == 3);
    CHECK_EQ_INT(ex_comm_bytes(c), (4 + 2 + 4 + 2 + 3) * sizeof(float));
    ex_comm_free(c);
    CHECK_EQ_INT(util_mem_current(UTIL_MEM_COMM), mem0);
}

TEST(comm_self_bad_calls_fail_cleanly)
{
    size_t mem0 = util_mem_current(UTIL_MEM_COMM);
    ex_comm *c = self_comm();
    CHECK(c != NULL);
    float x[4] = { 0 };
    ex_request *r = (ex_request *)&r;
    CHECK_EQ_INT(ex_comm_isend(c, x, 4, 0, -1, &r), UTIL_ERUNTIME);
    CHECK(r == NULL);
    CHECK(strstr(ex_comm_error(c), "tag -1") != NULL);
    CHECK_EQ_INT(ex_comm_irecv(c, x, 4, 0, 1 << 20, &r), UTIL_ERUNTIME);
    CHECK(strstr(ex_comm_error(c), "tag 1048576") != NULL);
    CHECK_OK(ex_comm_send(c, x, 4, 0, (1 << 20) - 1));
    CHECK_OK(ex_comm_recv(c, x, 4, 0, (1 << 20) - 1));
    CHECK_EQ_INT(ex_comm_send(c, x, 4, 1, 0), UTIL_ERUNTIME);
    CHECK(strstr(ex_comm_error(c), "peer 1") != NULL);
    /* a receive with no send fails instead of hanging */
    CHECK_EQ_INT(ex_comm_recv(c, x, 4, 0, 3), UTIL_ERUNTIME);
    CHECK(strstr(ex_comm_error(c), "no matching send") != NULL);
    /* sender and receiver must agree on the count */
    CHECK_OK(ex_comm_send(c, x, 4, 0, 3));
    CHECK_EQ_INT(ex_comm_recv(c, x, 2, 0, 3), UTIL_ERUNTIME);
    CHECK(strstr(ex_comm_error(c), "4 floats") != NULL);
    CHECK_EQ_INT(ex_comm_wait(c, NULL), UTIL_ERUNTIME);
    /* a message never received is freed with the communicator */
    CHECK_OK(ex_comm_send(c, x, 4, 0, 8));
    ex_comm_free(c);
    CHECK_EQ_INT(util_mem_current(UTIL_MEM_COMM), mem0);
}

TEST(comm_self_split)
{
    char err[UTIL_ERR_LEN];
    ex_comm *c = self_comm(), *s = (ex_comm *)&s;
    CHECK(c != NULL);
    CHECK_OK(ex_comm_split(c, -1, 0, &s, err));
    CHECK(s == NULL);
    CHECK_OK(ex_comm_split(c, 3, 7, &s, err));
    CHECK(s != NULL && s != c);
    CHECK_EQ_INT(ex_comm_rank(s), 0);
    CHECK_EQ_INT(ex_comm_size(s), 1);
    float v = 2;
    CHECK_OK(ex_comm_send(s, &v, 1, 0, 0));
    CHECK_EQ_INT(ex_comm_recv(c, &v, 1, 0, 0), UTIL_ERUNTIME); /* queues are per communicator */
    CHECK_OK(ex_comm_recv(s, &v, 1, 0, 0));
    CHECK_EQ_INT(ex_comm_bytes(s), 4);
    CHECK_EQ_INT(ex_comm_bytes(c), 0);
    ex_comm_free(s);
    ex_comm_free(c);
    ex_comm_free(NULL);
}
