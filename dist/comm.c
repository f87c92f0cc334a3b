/* Collectives from point-to-point transfers (dist/transport.h) and the backend's copy and add:
 * a reduce-scatter receives every member's piece of its own part and adds them in rank order, so
 * each sum is the same on every run and every member; an all-reduce is a reduce-scatter followed
 * by an all-gather (the ring algorithms' volume: 2 (N-1)/N of the buffer per member). */
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

typedef enum { OP_ALLGATHER, OP_REDUCE_SCATTER, OP_ALLREDUCE, OP_BROADCAST, OP_BARRIER } op_kind;

static const char *const k_op_names[] = {"all-gather", "reduce-scatter", "all-reduce", "broadcast", "barrier"};

struct qlm_comm_op {
    qlm_comm *c;
    op_kind kind;
    void *tp_op;        /* transfers in flight, or NULL */
    size_t *offsets;    /* size + 1 entries (floats for sums, bytes otherwise) */
    /* reduce-scatter (and an all-reduce's first half) */
    float *out;
    const float *in;
    float *slots; /* one piece per member, own included, summed in rank order */
    int accumulate;
    float *buf; /* all-reduce: the buffer, gathered in place after the sums */
};

qlm_comm *qlm_comm_new(qlm_transport *tp, const qlm_backend *be, double timeout_s) {
    qlm_comm *c = calloc(1, sizeof *c);
    if (!c) {
        qlm_errorf("out of memory");
        return NULL;
    }
    c->tp = tp;
    c->be = be;
    c->timeout_s = timeout_s;
    c->rank = tp ? tp->rank : 0;
    c->size = tp ? tp->size : 1;
    c->world_rank = tp ? tp->world[tp->rank] : 0;
    return c;
}

qlm_comm *qlm_comm_split(qlm_comm *c, int color, int key) {
    qlm_transport *tp = NULL;
    if (c->tp) {
        tp = c->tp->split(c->tp, color, key);
        if (!tp) return NULL;
        if (tp->size == 1) tp->close(tp), tp = NULL;
    }
    qlm_comm *s = qlm_comm_new(tp, c->be, c->timeout_s);
    if (!s && tp) tp->close(tp);
    if (s) s->world_rank = c->world_rank;
    return s;
}

void qlm_comm_free(qlm_comm *c) {
    if (!c) return;
    if (c->tp) c->tp->close(c->tp);
    free(c);
}

void qlm_comm_abort(qlm_comm *c, int code) {
    fflush(stdout);
    fflush(stderr);
    if (c && c->tp) c->tp->abort(c->tp, code);
    exit(code);
}

int qlm_comm_world_rank(const qlm_comm *c, int r) { return c->tp ? c->tp->world[r] : c->world_rank; }

void qlm_comm_even_offsets(size_t *offsets, int size, size_t n) {
    for (int r = 0; r <= size; r++) offsets[r] = (size_t)((unsigned __int128)n * (unsigned)r / (unsigned)size);
}

static qlm_comm_op *op_new(qlm_comm *c, op_kind kind, const size_t *offsets) {
    qlm_comm_op *op = calloc(1, sizeof *op);
    if (!op) {
        qlm_errorf("out of memory");
        return NULL;
    }
    op->c = c;
    op->kind = kind;
    if (offsets) {
        op->offsets = malloc((size_t)(c->size + 1) * sizeof *op->offsets);
        if (!op->offsets) {
            free(op);
            qlm_errorf("out of memory");
            return NULL;
        }
        memcpy(op->offsets, offsets, (size_t)(c->size + 1) * sizeof *offsets);
    }
    return op;
}

static void op_free(qlm_comm_op *op) {
    if (op->slots) op->c->be->free(op->slots);
    free(op->offsets);
    free(op);
}

static qlm_comm_op *op_fail(qlm_comm_op *op) {
    qlm_error_context("%s", k_op_names[op->kind]);
    op_free(op);
    return NULL;
}

/* Starts the sends and receives of one exchange with every other member. */
static int exchange(qlm_comm_op *op, qlm_xfer *send, int n_send, qlm_xfer *recv, int n_recv) {
    qlm_comm *c = op->c;
    if (!c->tp || (n_send == 0 && n_recv == 0)) return 0;
    return c->tp->start(c->tp, send, n_send, recv, n_recv, &op->tp_op);
}

/* Member q's part of op->offsets, in bytes (unit: 4 for floats, 1 for bytes). */
static size_t part(const qlm_comm_op *op, int q, size_t unit) { return (op->offsets[q + 1] - op->offsets[q]) * unit; }

static int start_allgather(qlm_comm_op *op, void *buf, size_t unit) {
    qlm_comm *c = op->c;
    int n = c->size - 1, k = 0;
    qlm_xfer *x = calloc((size_t)(2 * (n ? n : 1)), sizeof *x);
    if (!x) return qlm_errorf("out of memory");
    char *b = buf;
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank) continue;
        x[k] = (qlm_xfer){q, b + op->offsets[c->rank] * unit, part(op, c->rank, unit)};
        x[n + k] = (qlm_xfer){q, b + op->offsets[q] * unit, part(op, q, unit)};
        k++;
    }
    int rc = exchange(op, x, n, x + n, n);
    free(x);
    return rc;
}

qlm_comm_op *qlm_comm_start_allgather(qlm_comm *c, void *buf, const size_t *offsets) {
    qlm_comm_op *op = op_new(c, OP_ALLGATHER, offsets);
    if (!op) return NULL;
    return start_allgather(op, buf, 1) == 0 ? op : op_fail(op);
}

static int start_reduce_scatter(qlm_comm_op *op, float *out, const float *in, int accumulate) {
    qlm_comm *c = op->c;
    op->out = out, op->in = in, op->accumulate = accumulate;
    size_t own = part(op, c->rank, 1);
    if (c->size == 1) return 0;
    op->slots = c->be->alloc((own ? own : 1) * (size_t)c->size * sizeof(float));
    if (!op->slots) return -1;
    int n = c->size - 1, k = 0;
    qlm_xfer *x = calloc((size_t)(2 * n), sizeof *x);
    if (!x) return qlm_errorf("out of memory");
    for (int q = 0; q < c->size; q++) {
        if (q == c->rank) continue;
        x[k] = (qlm_xfer){q, (void *)(in + op->offsets[q]), part(op, q, sizeof(float))};
        x[n + k] = (qlm_xfer){q, op->slots + (size_t)q * own, own * sizeof(float)};
        k++;
    }
    int rc = exchange(op, x, n, x + n, n);
    free(x);
    return rc;
}

qlm_comm_op *qlm_comm_start_reduce_scatter(qlm_comm *c, float *out, const float *in, const size_t *offsets,
                                           int accumulate) {
    qlm_comm_op *op = op_new(c, OP_REDUCE_SCATTER, offsets);
    if (!op) return NULL;
    return start_reduce_scatter(op, out, in, accumulate) == 0 ? op : op_fail(op);
}

qlm_comm_op *qlm_comm_start_allreduce(qlm_comm *c, float *buf, size_t n) {
    qlm_comm_op *op = op_new(c, OP_ALLREDUCE, NULL);
    if (!op) return NULL;
    op->offsets = malloc((size_t)(c->size + 1) * sizeof *op->offsets);
    if (!op->offsets) {
        qlm_errorf("out of memory");
        return op_fail(op);
    }
    qlm_comm_even_offsets(op->offsets, c->size, n);
    op->buf = buf;
    return start_reduce_scatter(op, buf + op->offsets[c->rank], buf, 0) == 0 ? op : op_fail(op);
}

qlm_comm_op *qlm_comm_start_broadcast(qlm_comm *c, void *buf, size_t bytes, int root) {
    qlm_comm_op *op = op_new(c, OP_BROADCAST, NULL);
    if (!op) return NULL;
    if (root < 0 || root >= c->size) {
        qlm_errorf("root %d is not a member (0..%d)", root, c->size - 1);
        return op_fail(op);
    }
    int n = c->size - 1, rc = 0;
    if (c->rank == root) {
        qlm_xfer *x = calloc((size_t)(n ? n : 1), sizeof *x);
        if (!x) {
            qlm_errorf("out of memory");
            return op_fail(op);
        }
        for (int q = 0, k = 0; q < c->size; q++)
            if (q != root) x[k++] = (qlm_xfer){q, buf, bytes};
        rc = exchange(op, x, n, NULL, 0);
        free(x);
    } else {
        qlm_xfer x = {root, buf, bytes};
        rc = exchange(op, NULL, 0, &x, 1);
    }
    return rc == 0 ? op : op_fail(op);
}

/* Adds the slots in rank order and stores (or adds) the sum into out. */
static void sum_slots(qlm_comm_op *op) {
    qlm_comm *c = op->c;
    const qlm_backend *be = c->be;
    long own = (long)part(op, c->rank, 1);
    if (own == 0) return;
    if (c->size == 1) {
        if (op->accumulate) be->add(op->out, op->in, own);
        else if (op->out != op->in) be->copy(op->out, op->in, own);
        return;
    }
    be->copy(op->slots + (size_t)c->rank * own, op->in + op->offsets[c->rank], own);
    for (int q = 1; q < c->size; q++) be->add(op->slots, op->slots + (size_t)q * own, own);
    if (op->accumulate) be->add(op->out, op->slots, own);
    else be->copy(op->out, op->slots, own);
}

static int wait_transfers(qlm_comm_op *op) {
    qlm_comm *c = op->c;
    if (!op->tp_op) return 0;
    void *t = op->tp_op;
    op->tp_op = NULL;
    return c->tp->wait(c->tp, t, c->timeout_s);
}

int qlm_comm_wait(qlm_comm_op *op) {
    if (!op) return -1;
    int rc = wait_transfers(op);
    if (rc == 0 && (op->kind == OP_REDUCE_SCATTER || op->kind == OP_ALLREDUCE)) sum_slots(op);
    if (rc == 0 && op->kind == OP_ALLREDUCE && op->c->size > 1) {
        for (int q = 0; q <= op->c->size; q++) op->offsets[q] *= sizeof(float);
        rc = start_allgather(op, op->buf, 1);
        if (rc == 0) rc = wait_transfers(op);
    }
    if (rc != 0) {
        qlm_error_context("%s", k_op_names[op->kind]);
        /* A failed wait leaves its receives posted while the job ends (both transports): one that
         * lands late must not write into memory handed out again, so the slots stay allocated. */
        op->slots = NULL;
    }
    op_free(op);
    return rc;
}

int qlm_comm_allgather(qlm_comm *c, void *buf, const size_t *offsets) {
    return qlm_comm_wait(qlm_comm_start_allgather(c, buf, offsets));
}

int qlm_comm_reduce_scatter(qlm_comm *c, float *out, const float *in, const size_t *offsets, int accumulate) {
    return qlm_comm_wait(qlm_comm_start_reduce_scatter(c, out, in, offsets, accumulate));
}

int qlm_comm_allreduce(qlm_comm *c, float *buf, size_t n) { return qlm_comm_wait(qlm_comm_start_allreduce(c, buf, n)); }

int qlm_comm_broadcast(qlm_comm *c, void *buf, size_t bytes, int root) {
    return qlm_comm_wait(qlm_comm_start_broadcast(c, buf, bytes, root));
}

int qlm_comm_barrier(qlm_comm *c) {
    qlm_comm_op *op = op_new(c, OP_BARRIER, NULL);
    if (!op) return -1;
    int n = c->size - 1;
    qlm_xfer *x = calloc((size_t)(2 * (n ? n : 1)), sizeof *x);
    if (!x) {
        op_free(op);
        return qlm_errorf("out of memory");
    }
    for (int q = 0, k = 0; q < c->size; q++)
        if (q != c->rank) x[k] = (qlm_xfer){q, NULL, 0}, x[n + k] = (qlm_xfer){q, NULL, 0}, k++;
    int rc = exchange(op, x, n, x + n, n);
    free(x);
    if (rc != 0) {
        op_fail(op);
        return -1;
    }
    return qlm_comm_wait(op);
}

/* Every member's n doubles, gathered into all[size][n] (host memory). */
static int gather_host(qlm_comm *c, const double *x, int n, double *all) {
    size_t bytes = (size_t)n * sizeof(double);
    size_t *off = malloc((size_t)(c->size + 1) * sizeof *off);
    if (!off) return qlm_errorf("out of memory");
    for (int r = 0; r <= c->size; r++) off[r] = (size_t)r * bytes;
    int rc;
    if (c->be->host_memory) {
        memcpy(all + (size_t)c->rank * n, x, bytes);
        rc = qlm_comm_allgather(c, all, off);
    } else {
        void *dev = c->be->alloc(bytes * (size_t)c->size);
        rc = dev ? 0 : -1;
        if (rc == 0) {
            c->be->to_device((char *)dev + off[c->rank], x, bytes);
            rc = qlm_comm_allgather(c, dev, off);
            if (rc == 0) c->be->to_host(all, dev, bytes * (size_t)c->size);
            c->be->free(dev);
        }
    }
    free(off);
    return rc;
}

static int reduce_host(qlm_comm *c, double *x, int n, int max) {
    if (c->size == 1) return 0;
    double *all = malloc((size_t)n * (size_t)c->size * sizeof *all);
    if (!all) return qlm_errorf("out of memory");
    int rc = gather_host(c, x, n, all);
    for (int i = 0; i < n && rc == 0; i++) {
        double v = all[i];
        for (int r = 1; r < c->size; r++) {
            double w = all[(size_t)r * n + i];
            v = max ? (w > v ? w : v) : v + w;
        }
        x[i] = v;
    }
    free(all);
    return rc;
}

int qlm_comm_sum_host(qlm_comm *c, double *x, int n) { return reduce_host(c, x, n, 0); }
int qlm_comm_max_host(qlm_comm *c, double *x, int n) { return reduce_host(c, x, n, 1); }

int qlm_comm_broadcast_host(qlm_comm *c, void *buf, size_t bytes, int root) {
    if (c->size == 1) return 0;
    if (c->be->host_memory) return qlm_comm_broadcast(c, buf, bytes, root);
    void *dev = c->be->alloc(bytes ? bytes : 1);
    if (!dev) return -1;
    if (c->rank == root) c->be->to_device(dev, buf, bytes);
    int rc = qlm_comm_broadcast(c, dev, bytes, root);
    if (rc == 0) c->be->to_host(buf, dev, bytes);
    c->be->free(dev);
    return rc;
}
