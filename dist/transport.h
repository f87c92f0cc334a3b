/* What a communication library provides to qlm's collectives (dist/comm.c): point-to-point
 * transfers between the members of a group, started together as one operation and waited on
 * together, with a deadline. Every collective is built from these and local sums in rank order,
 * so the result of a reduction depends only on its inputs, never on the library's algorithm or on
 * timing. Implementations: MPI (dist/transport_mpi.c, host memory) and NCCL (cuda/, device
 * memory). A group of one needs no transport. */
#ifndef QLM_TRANSPORT_H
#define QLM_TRANSPORT_H

#include <stddef.h>

/* One message: bytes of memory to send to, or receive from, rank peer of the group. */
typedef struct {
    int peer;
    void *data;
    size_t bytes;
} qlm_xfer;

typedef struct qlm_transport qlm_transport;

struct qlm_transport {
    const char *name; /* "mpi", "nccl" */
    int rank, size;
    int *world; /* world rank of each member, for messages that name a rank */
    void *ctx;
    /* Starts the sends and receives as one operation, in the order every member starts its
     * operations (matching is by that order). *op is waited on exactly once. -1: message set. */
    int (*start)(qlm_transport *t, const qlm_xfer *send, int n_send, const qlm_xfer *recv, int n_recv, void **op);
    /* Waits until the operation's transfers are complete: 0. -1 (message set, naming the members
     * that did not deliver) when the deadline passes first or the library reports an error; the
     * job cannot continue then. */
    int (*wait)(qlm_transport *t, void *op, double timeout_s);
    /* The members with the same color, ordered by key then rank (a collective call). */
    qlm_transport *(*split)(qlm_transport *t, int color, int key);
    /* Ends the whole job now (every rank of every group), with this exit code. */
    void (*abort)(qlm_transport *t, int code);
    void (*close)(qlm_transport *t);
};

#endif
