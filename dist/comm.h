/* The communicator: the ranks of one job and the collectives that sharded training and inference
 * use — all-gather, reduce-scatter, all-reduce, broadcast, barrier — each as start/wait, so
 * communication overlaps compute. Model, trainer and scheduler code call these only, never MPI
 * or NCCL.
 *
 * Buffers are device memory of the communicator's backend (host memory on the CPU). Sums are
 * F32 and deterministic: every member adds the pieces in rank order 0, 1, ..., N-1, so the same
 * inputs give the same bits on every run and every member gets the same bits. A failure (a peer
 * that died or hangs past the deadline, a library error) returns -1 with a message naming the
 * peer; the job cannot continue and the caller ends it with qlm_comm_abort. */
#ifndef QLM_COMM_H
#define QLM_COMM_H

#include <stddef.h>

#include "../core/backend.h"
#include "transport.h"

typedef struct qlm_comm qlm_comm;
typedef struct qlm_comm_op qlm_comm_op;

struct qlm_comm {
    int rank, size;
    qlm_transport *tp; /* NULL for a group of one */
    const qlm_backend *be;
    double timeout_s;
    int world_rank; /* this member's rank in the job */
};

/* A communicator over transport tp (NULL: a group of one), reducing with be's ops. */
qlm_comm *qlm_comm_new(qlm_transport *tp, const qlm_backend *be, double timeout_s);
/* The members of c with the same color, ordered by key (a collective call over c). */
qlm_comm *qlm_comm_split(qlm_comm *c, int color, int key);
/* Frees c (and its transport); c's world transport is closed last. */
void qlm_comm_free(qlm_comm *c);
/* Ends the whole job (every rank) with this exit code; a group of one just exits. */
void qlm_comm_abort(qlm_comm *c, int code);
/* The world rank of member r (for messages). */
int qlm_comm_world_rank(const qlm_comm *c, int r);

/* All-gather in place: member r contributes bytes [offsets[r], offsets[r+1]) of buf, and every
 * member ends with all of them. */
qlm_comm_op *qlm_comm_start_allgather(qlm_comm *c, void *buf, const size_t *offsets);
/* Reduce-scatter: out (offsets[r+1]-offsets[r] floats) = the sum over members, in rank order, of
 * their in[offsets[r] .. offsets[r+1]) (+= with accumulate). out may lie inside in at its own
 * part. in must stay unchanged until the wait. Offsets count floats. */
qlm_comm_op *qlm_comm_start_reduce_scatter(qlm_comm *c, float *out, const float *in, const size_t *offsets,
                                           int accumulate);
/* All-reduce in place: buf (n floats) = the sum over members in rank order. */
qlm_comm_op *qlm_comm_start_allreduce(qlm_comm *c, float *buf, size_t n);
/* Broadcast bytes of buf from member root to all. */
qlm_comm_op *qlm_comm_start_broadcast(qlm_comm *c, void *buf, size_t bytes, int root);
/* Completes an operation and frees it: 0, or -1 (message set). A NULL op (a failed start) is -1. */
int qlm_comm_wait(qlm_comm_op *op);

/* Blocking forms: start then wait. */
int qlm_comm_allgather(qlm_comm *c, void *buf, const size_t *offsets);
int qlm_comm_reduce_scatter(qlm_comm *c, float *out, const float *in, const size_t *offsets, int accumulate);
int qlm_comm_allreduce(qlm_comm *c, float *buf, size_t n);
int qlm_comm_broadcast(qlm_comm *c, void *buf, size_t bytes, int root);
int qlm_comm_barrier(qlm_comm *c);

/* Host values, whatever the backend: x[0..n) = their sum over members in rank order (doubles:
 * norms, losses, counts), or the maximum. */
int qlm_comm_sum_host(qlm_comm *c, double *x, int n);
int qlm_comm_max_host(qlm_comm *c, double *x, int n);
/* Host bytes from root to all (a batch plan, a decision). */
int qlm_comm_broadcast_host(qlm_comm *c, void *buf, size_t bytes, int root);

/* Splits n items as evenly as possible among size members: offsets[r] = r * n / size, r = 0..size. */
void qlm_comm_even_offsets(size_t *offsets, int size, size_t n);

#endif
