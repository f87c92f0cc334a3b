// The NCCL transport (dist/transport.h) for jobs on GPUs. Buffers are device memory of the CUDA
// backend. Each operation's sends and receives are one NCCL group on the transport's own stream,
// queued behind the compute the backend has queued so far, and followed by an event that wait()
// polls until the deadline.
//
// Communicators are non-blocking (config.blocking = 0): no NCCL call then waits for a peer, so a
// peer that died or hangs meets the deadline wherever it stops the job (a communicator's start-up,
// a split, the connections a first transfer sets up, the transfer itself), and ncclCommAbort ends
// what is in flight. The price: a call may answer ncclInProgress, and the communicator is then
// polled until ready before anything more is queued on its stream; and NCCL launches each group
// from a thread it starts for it.
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "cuda_internal.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "qlm needs NCCL 2.18 or newer (ncclCommSplit, ncclCommFinalize, non-blocking communicators)"
#endif

extern "C" {
#include "../dist/launch.h"
}

struct nccl_tp {
    qlm_transport base;
    const qlm_backend *be;    // the CUDA backend, whose device memory the buffers are
    ncclComm_t comm;          // NULL once aborted after a failure
    cudaStream_t stream;      // this communicator's transfers (one per communicator, as NCCL advises)
    cudaEvent_t queued;       // recorded behind the backend's queued ops; the stream waits for it
    unsigned char *scratch;   // device bytes for empty transfers: one to receive per member, one to send
    qlm_transport *bootstrap; // the MPI world, if any: every transport aborts through it
    int owns_bootstrap;       // the world transport closes it
    double timeout_s;         // the deadline of the calls that take none (start, split, close)
};

struct nccl_op {
    cudaEvent_t done;
    unsigned char *peers; // per member: 1 when this operation talks to it (for messages)
};

int qlm_cuda_launch_device(int n_devices) {
    qlm_launch l;
    // Launcher variables that do not parse are reported where the job's communicator is made.
    if (qlm_launch_detect(&l) != 0) return 0;
    return l.local_rank % n_devices;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Between two polls: a yield at first, then sleeps growing to 0.5 ms, so that a short transfer is
// seen at once and a long wait leaves the core to the threads still computing.
static void pause_after(int idle) {
    if (idle < 64) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 1000L * (idle < 128 ? 20 : idle < 256 ? 100 : 500)};
    nanosleep(&ts, NULL);
}

static int my_rank(const nccl_tp *t) { return t->base.world[t->base.rank]; }

// Aborts *comm (what it has in flight ends) and forgets it. ncclCommAbort's result is not looked
// at: a communicator that fails even to abort leaves nothing more to do.
static void abort_comm(ncclComm_t *comm) {
    if (*comm) ncclCommAbort(*comm);
    *comm = NULL;
}

// The message of a failed NCCL call, with NCCL's own account, then the abort: the job cannot go on.
static int fail_comm(int rank, ncclComm_t *comm, const char *what, ncclResult_t r) {
    const char *detail = *comm ? ncclGetLastError(*comm) : NULL;
    qlm_errorf("rank %d: NCCL %s: %s%s%s", rank, what, ncclGetErrorString(r), detail && *detail ? ": " : "",
               detail ? detail : "");
    abort_comm(comm);
    return -1;
}

static int fail_cuda(nccl_tp *t, const char *what, cudaError_t e) {
    qlm_errorf("rank %d: CUDA %s: %s", my_rank(t), what, cudaGetErrorString(e));
    abort_comm(&t->comm);
    return -1;
}

// Polls comm until it has carried out the calls made so far: ncclSuccess, the error NCCL reports,
// or ncclInProgress when the deadline passed first. Sets no message (close() uses it too).
static ncclResult_t poll_ready(ncclComm_t comm, double timeout_s) {
    double deadline = now_s() + timeout_s;
    for (int idle = 0;; idle++) {
        ncclResult_t state;
        ncclResult_t r = ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess) return r;
        if (state != ncclInProgress || now_s() >= deadline) return state;
        pause_after(idle);
    }
}

// poll_ready with the message and the abort when the communicator does not become ready.
static int settle(int rank, ncclComm_t *comm, const char *what, double timeout_s) {
    ncclResult_t r = poll_ready(*comm, timeout_s);
    if (r == ncclSuccess) return 0;
    if (r != ncclInProgress) return fail_comm(rank, comm, what, r);
    abort_comm(comm);
    return qlm_errorf("rank %d: NCCL %s: waited %g s: a peer died or hangs (the deadline is --dist-timeout or "
                      "QLM_DIST_TIMEOUT seconds)",
                      rank, what, timeout_s);
}

// "transfers with rank 3", "transfers with ranks 1, 4": the world ranks of op's peers (16 at most).
static void describe_op(const nccl_tp *t, const nccl_op *op, char *buf, size_t cap) {
    int count = 0, named = 0;
    for (int r = 0; r < t->base.size; r++) count += op->peers[r];
    size_t len = (size_t)snprintf(buf, cap, "transfers with %s", count == 1 ? "rank" : "ranks");
    for (int r = 0; r < t->base.size && named < 16 && len < cap; r++)
        if (op->peers[r]) len += (size_t)snprintf(buf + len, cap - len, "%s %d", named++ ? "," : "", t->base.world[r]);
    if (count > named && len < cap) snprintf(buf + len, cap - len, " and %d more", count - named);
}

// ---- transport objects ----

static int tp_start(qlm_transport *base, const qlm_xfer *send, int n_send, const qlm_xfer *recv, int n_recv,
                    void **out);
static int tp_wait(qlm_transport *base, void *handle, double timeout_s);
static qlm_transport *tp_split(qlm_transport *base, int color, int key);
static void tp_abort(qlm_transport *base, int code);
static void tp_close(qlm_transport *base);

// Frees what tp_new made (the communicator is destroyed or aborted before). Failures here have
// nowhere to go: release runs on error paths and in close, which report nothing.
static void release(nccl_tp *t) {
    cudaSetDevice(qlm_cuda_device);
    if (t->stream) cudaStreamDestroy(t->stream);
    if (t->queued) cudaEventDestroy(t->queued);
    if (t->scratch) cudaFree(t->scratch);
    if (t->owns_bootstrap) t->bootstrap->close(t->bootstrap);
    free(t->base.world);
    free(t);
}

// A transport of size members without its communicator: stream, event, scratch bytes, on the
// backend's GPU.
static nccl_tp *tp_new(const qlm_backend *be, int size, double timeout_s) {
    nccl_tp *t = (nccl_tp *)calloc(1, sizeof *t);
    int *world = (int *)calloc((size_t)size, sizeof *world);
    if (!t || !world) {
        free(t);
        free(world);
        qlm_errorf("out of memory");
        return NULL;
    }
    t->be = be;
    t->base.name = "nccl";
    t->base.size = size;
    t->base.world = world;
    t->base.start = tp_start;
    t->base.wait = tp_wait;
    t->base.split = tp_split;
    t->base.abort = tp_abort;
    t->base.close = tp_close;
    t->timeout_s = timeout_s;
    cudaError_t e;
    if ((e = cudaSetDevice(qlm_cuda_device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&t->queued, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaMalloc((void **)&t->scratch, (size_t)size + 1)) != cudaSuccess ||
        (e = cudaMemsetAsync(t->scratch, 0, (size_t)size + 1, t->stream)) != cudaSuccess) {
        qlm_errorf("NCCL transport: %s", cudaGetErrorString(e));
        release(t);
        return NULL;
    }
    return t;
}

static void op_free(nccl_op *op) {
    cudaEventDestroy(op->done); // an event still pending (an abandoned operation) is freed once it completes
    free(op->peers);
    free(op);
}

static nccl_op *op_new(nccl_tp *t) {
    nccl_op *op = (nccl_op *)calloc(1, sizeof *op);
    if (op) op->peers = (unsigned char *)calloc((size_t)t->base.size, 1);
    if (!op || !op->peers) {
        if (op) free(op->peers);
        free(op);
        qlm_errorf("out of memory");
        return NULL;
    }
    cudaError_t e = cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(op->peers);
        free(op);
        fail_cuda(t, "cudaEventCreate", e);
        return NULL;
    }
    return op;
}

// ---- operations ----

// Queues one transfer. An empty one moves a byte between scratch bytes instead, so that it still
// waits for its peer: a barrier is made of empty transfers.
static ncclResult_t post(nccl_tp *t, const qlm_xfer *x, int sending) {
    void *data = x->data;
    size_t bytes = x->bytes;
    if (bytes == 0) data = t->scratch + (sending ? t->base.size : x->peer), bytes = 1;
    return sending ? ncclSend(data, bytes, ncclUint8, x->peer, t->comm, t->stream)
                   : ncclRecv(data, bytes, ncclUint8, x->peer, t->comm, t->stream);
}

// The group of op's transfers on t's stream, behind the backend's queued ops (they produce the
// buffers sent, and may still read the ones received into), then op's event.
static int queue_group(nccl_tp *t, const qlm_xfer *send, int n_send, const qlm_xfer *recv, int n_recv, nccl_op *op) {
    char what[200];
    describe_op(t, op, what, sizeof what);
    cudaError_t e = cudaSetDevice(qlm_cuda_device);
    if (e != cudaSuccess) return fail_cuda(t, "cudaSetDevice", e);
    qlm_cuda_flush_and_record(t->queued);
    if ((e = cudaStreamWaitEvent(t->stream, t->queued, 0)) != cudaSuccess)
        return fail_cuda(t, "cudaStreamWaitEvent", e);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return fail_comm(my_rank(t), &t->comm, what, r);
    for (int i = 0; i < n_send && r == ncclSuccess; i++) r = post(t, &send[i], 1);
    for (int i = 0; i < n_recv && r == ncclSuccess; i++) r = post(t, &recv[i], 0);
    ncclResult_t end = ncclGroupEnd(); // closes the group even after a failed post
    if (r == ncclSuccess) r = end;
    if (r != ncclSuccess && r != ncclInProgress) return fail_comm(my_rank(t), &t->comm, what, r);
    // Until the group is queued, nothing else may go on the stream.
    if (r == ncclInProgress && settle(my_rank(t), &t->comm, what, t->timeout_s) != 0) return -1;
    if ((e = cudaEventRecord(op->done, t->stream)) != cudaSuccess) return fail_cuda(t, "cudaEventRecord", e);
    return 0;
}

static int check_peers(const nccl_tp *t, const qlm_xfer *x, int n) {
    for (int i = 0; i < n; i++) {
        if (x[i].peer < 0 || x[i].peer >= t->base.size)
            return qlm_errorf("rank %d: NCCL: member %d is not in 0..%d", my_rank(t), x[i].peer, t->base.size - 1);
        if (x[i].bytes && !x[i].data)
            return qlm_errorf("rank %d: NCCL: a transfer of %zu bytes with member %d has no buffer", my_rank(t),
                              x[i].bytes, x[i].peer);
    }
    return 0;
}

static int tp_start(qlm_transport *base, const qlm_xfer *send, int n_send, const qlm_xfer *recv, int n_recv,
                    void **out) {
    nccl_tp *t = (nccl_tp *)base;
    if (!t->comm) return qlm_errorf("rank %d: NCCL: the communicator was aborted after an earlier failure", my_rank(t));
    if (check_peers(t, send, n_send) != 0 || check_peers(t, recv, n_recv) != 0) return -1;
    nccl_op *op = op_new(t);
    if (!op) return -1;
    for (int i = 0; i < n_send; i++) op->peers[send[i].peer] = 1;
    for (int i = 0; i < n_recv; i++) op->peers[recv[i].peer] = 1;
    if (queue_group(t, send, n_send, recv, n_recv, op) != 0) {
        op_free(op);
        return -1;
    }
    *out = op;
    return 0;
}

// Polls op's event and the communicator's errors until the transfers are done or the deadline.
static int await_op(nccl_tp *t, nccl_op *op, double timeout_s) {
    double deadline = now_s() + timeout_s;
    char what[200];
    for (int idle = 0;; idle++) {
        if (!t->comm)
            return qlm_errorf("rank %d: NCCL: the communicator was aborted after an earlier failure", my_rank(t));
        cudaError_t e = cudaEventQuery(op->done);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) return fail_cuda(t, "waiting for NCCL transfers", e);
        ncclResult_t state;
        ncclResult_t r = ncclCommGetAsyncError(t->comm, &state);
        if (r != ncclSuccess) state = r;
        if (state != ncclSuccess && state != ncclInProgress) {
            describe_op(t, op, what, sizeof what);
            return fail_comm(my_rank(t), &t->comm, what, state);
        }
        if (now_s() >= deadline) {
            abort_comm(&t->comm);
            describe_op(t, op, what, sizeof what);
            return qlm_errorf("rank %d: NCCL: waited %g s for the %s: a peer died or hangs (the deadline is "
                              "--dist-timeout or QLM_DIST_TIMEOUT seconds)",
                              my_rank(t), timeout_s, what);
        }
        pause_after(idle);
    }
}

// Returns once the transfers are complete, so the backend's later ops see what was received.
static int tp_wait(qlm_transport *base, void *handle, double timeout_s) {
    nccl_tp *t = (nccl_tp *)base;
    nccl_op *op = (nccl_op *)handle;
    qlm_cuda_flush_and_record(NULL); // the ops queued since the start compute while the transfers run
    int rc = await_op(t, op, timeout_s);
    op_free(op);
    return rc;
}

// NCCL connects two members in the first group that has them exchange, and that group waits for
// the peer under the start-up deadline: a member whose first collective comes much later than its
// peers' (a sharded server's, until its first request) would end the job there. So every pair
// connects while all members are known to be present, right after the communicator starts.
static int connect_all(nccl_tp *t) {
    int n = t->base.size, me = t->base.rank;
    if (n == 1) return 0;
    qlm_xfer *x = (qlm_xfer *)calloc((size_t)(2 * (n - 1)), sizeof *x);
    if (!x) return qlm_errorf("out of memory");
    for (int q = 0, k = 0; q < n; q++)
        if (q != me) x[k] = {q, NULL, 0}, x[n - 1 + k] = {q, NULL, 0}, k++;
    void *op = NULL;
    int rc = tp_start(&t->base, x, n - 1, x + n - 1, n - 1, &op);
    if (rc == 0) rc = tp_wait(&t->base, op, t->timeout_s);
    free(x);
    return rc;
}

// ---- split ----

// Every member's color and key into all[2 q], all[2 q + 1] (a collective call over t). The copies
// go through the backend's table, so they are ordered with the transfers like any op's buffers.
static int gather_colors(nccl_tp *t, int color, int key, int *all) {
    int n = t->base.size, me = t->base.rank;
    all[2 * me] = color, all[2 * me + 1] = key;
    if (n == 1) return 0;
    const size_t pair = 2 * sizeof(int);
    qlm_xfer *x = (qlm_xfer *)calloc((size_t)(2 * (n - 1)), sizeof *x);
    int *dev = x ? (int *)t->be->alloc((size_t)n * pair) : NULL;
    int rc = !x ? qlm_errorf("out of memory") : !dev ? -1 : 0;
    if (rc == 0) t->be->to_device(dev + 2 * me, all + 2 * me, pair);
    for (int q = 0, k = 0; rc == 0 && q < n; q++)
        if (q != me) x[k] = {q, dev + 2 * me, pair}, x[n - 1 + k] = {q, dev + 2 * q, pair}, k++;
    void *op = NULL;
    if (rc == 0) rc = tp_start(&t->base, x, n - 1, x + n - 1, n - 1, &op);
    if (rc == 0) rc = tp_wait(&t->base, op, t->timeout_s);
    if (rc == 0) t->be->to_host(all, dev, (size_t)n * pair);
    if (dev) t->be->free(dev);
    free(x);
    return rc;
}

// The members (ranks in the parent) with color, ordered by key, then by rank: ncclCommSplit's order.
static int split_members(const int *all, int n, int color, int *members) {
    int count = 0;
    for (int q = 0; q < n; q++) {
        if (all[2 * q] != color) continue;
        int at = count++;
        while (at > 0 && all[2 * members[at - 1] + 1] > all[2 * q + 1]) members[at] = members[at - 1], at--;
        members[at] = q;
    }
    return count;
}

// The new communicator and this member's rank in it, checked against the order the keys give
// (expect: this member's place in members).
static int split_comm(nccl_tp *t, int color, int key, int count, int expect, ncclComm_t *sub, int *rank) {
    char what[64];
    snprintf(what, sizeof what, "split (color %d, key %d)", color, key);
    ncclResult_t r = ncclCommSplit(t->comm, color, key, sub, NULL); // NULL: non-blocking like its parent
    if (r != ncclSuccess && r != ncclInProgress) return fail_comm(my_rank(t), &t->comm, what, r);
    // The split runs as the parent's work, and *sub is set when it is done.
    if (settle(my_rank(t), &t->comm, what, t->timeout_s) != 0) return -1;
    if (!*sub) return qlm_errorf("rank %d: NCCL %s gave no communicator", my_rank(t), what);
    if (settle(my_rank(t), sub, what, t->timeout_s) != 0) return -1;
    int size = 0;
    if ((r = ncclCommCount(*sub, &size)) != ncclSuccess || (r = ncclCommUserRank(*sub, rank)) != ncclSuccess)
        return fail_comm(my_rank(t), sub, what, r);
    if (size != count || *rank != expect) {
        abort_comm(sub);
        return qlm_errorf("rank %d: NCCL %s: rank %d of %d, not rank %d of %d as the keys order them", my_rank(t),
                          what, *rank, size, expect, count);
    }
    return 0;
}

static qlm_transport *tp_split(qlm_transport *base, int color, int key) {
    nccl_tp *t = (nccl_tp *)base;
    if (!t->comm) {
        qlm_errorf("rank %d: NCCL: the communicator was aborted after an earlier failure", my_rank(t));
        return NULL;
    }
    if (color < 0) {
        qlm_errorf("rank %d: NCCL split: color %d is negative", my_rank(t), color);
        return NULL;
    }
    int n = t->base.size;
    int *all = (int *)malloc((size_t)n * 2 * sizeof *all), *members = (int *)malloc((size_t)n * sizeof *members);
    nccl_tp *s = NULL;
    ncclComm_t sub = NULL;
    int rank = 0, count = 0, expect = -1;
    int rc = all && members ? 0 : qlm_errorf("out of memory");
    if (rc == 0) rc = gather_colors(t, color, key, all);
    if (rc == 0) count = split_members(all, n, color, members);
    for (int i = 0; i < count; i++)
        if (members[i] == t->base.rank) expect = i;
    if (rc == 0) rc = split_comm(t, color, key, count, expect, &sub, &rank);
    if (rc == 0 && !(s = tp_new(t->be, count, t->timeout_s))) abort_comm(&sub);
    if (s) {
        s->comm = sub;
        s->base.rank = rank;
        for (int i = 0; i < count; i++) s->base.world[i] = t->base.world[members[i]];
        s->bootstrap = t->bootstrap;
        if (connect_all(s) != 0) {
            abort_comm(&s->comm);
            release(s);
            s = NULL;
        }
    }
    free(all);
    free(members);
    return s ? &s->base : NULL;
}

// ---- the end ----

// Ends every rank: this communicator is aborted, then the MPI world if there is one (mpirun stops
// the others), else this process, whose exit the launcher sees. _exit, not exit: the exit handlers
// would tear down a CUDA context whose other communicators may still wait for dead peers.
static void tp_abort(qlm_transport *base, int code) {
    nccl_tp *t = (nccl_tp *)base;
    abort_comm(&t->comm);
    fflush(stdout);
    fflush(stderr);
    if (t->bootstrap) t->bootstrap->abort(t->bootstrap, code);
    _exit(code);
}

// Finalizes (what is in flight drains, up to the deadline), then destroys; a communicator that
// does not finalize is aborted. Nothing to report: close sets no message, so the caller's stays.
static void tp_close(qlm_transport *base) {
    nccl_tp *t = (nccl_tp *)base;
    if (t->comm) {
        ncclResult_t r = ncclCommFinalize(t->comm);
        if (r == ncclInProgress) r = poll_ready(t->comm, t->timeout_s);
        if (r == ncclSuccess) {
            ncclCommDestroy(t->comm); // a destroy that fails leaves nothing to do either
            t->comm = NULL;
        }
        abort_comm(&t->comm);
    }
    release(t);
}

// ---- the world ----

// The backend runs on this process's launch GPU (qlm_cuda_launch_device); NCCL must use the same.
static int use_launch_device(const qlm_launch *l) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1)
        return qlm_errorf("rank %d: no GPU for NCCL: %s", l->rank, e != cudaSuccess ? cudaGetErrorString(e) : "none");
    int want = l->local_rank % n;
    if (want != qlm_cuda_device)
        return qlm_errorf("rank %d: the CUDA backend runs on GPU %d, but local rank %d takes GPU %d of %d", l->rank,
                          qlm_cuda_device, l->local_rank, want, n);
    if ((e = cudaSetDevice(want)) != cudaSuccess)
        return qlm_errorf("rank %d: cudaSetDevice(%d): %s", l->rank, want, cudaGetErrorString(e));
    return 0;
}

// Rank 0's unique id to every rank: over the MPI world when there is one, else the TCP rendezvous.
static int share_unique_id(const qlm_launch *l, qlm_transport *bootstrap, ncclUniqueId *id, double timeout_s) {
    ncclResult_t r = l->rank == 0 ? ncclGetUniqueId(id) : ncclSuccess;
    if (r != ncclSuccess) return qlm_errorf("rank 0: ncclGetUniqueId: %s", ncclGetErrorString(r));
    if (l->size == 1) return 0;
    if (!bootstrap)
        return qlm_rendezvous_broadcast(l->master_addr, l->master_port, l->rank, l->size, id, sizeof *id, timeout_s);
    if (bootstrap->size != l->size || bootstrap->rank != l->rank)
        return qlm_errorf("rank %d: the bootstrap transport says rank %d of %d, the launch %d of %d", l->rank,
                          bootstrap->rank, bootstrap->size, l->rank, l->size);
    int n_send = l->rank == 0 ? l->size - 1 : 0;
    qlm_xfer *x = (qlm_xfer *)calloc((size_t)(n_send ? n_send : 1), sizeof *x);
    if (!x) return qlm_errorf("out of memory");
    for (int q = 1; q <= n_send; q++) x[q - 1] = {q, id, sizeof *id};
    if (l->rank != 0) x[0] = {0, id, sizeof *id};
    void *op = NULL;
    int rc = l->rank == 0 ? bootstrap->start(bootstrap, x, n_send, NULL, 0, &op)
                          : bootstrap->start(bootstrap, NULL, 0, x, 1, &op);
    if (rc == 0) rc = bootstrap->wait(bootstrap, op, timeout_s);
    free(x);
    if (rc != 0) qlm_error_context("sharing NCCL's unique id");
    return rc;
}

static int init_comm(nccl_tp *t, ncclUniqueId id) {
    char what[64];
    snprintf(what, sizeof what, "start-up of a communicator of %d ranks", t->base.size);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&t->comm, t->base.size, id, t->base.rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) return fail_comm(my_rank(t), &t->comm, what, r);
    return settle(my_rank(t), &t->comm, what, t->timeout_s);
}

// The bootstrap transport becomes the world's on success only: on failure the caller still owns it.
extern "C" qlm_transport *qlm_transport_nccl_world(const qlm_launch *l, qlm_transport *bootstrap, double timeout_s) {
    const qlm_backend *be = qlm_backend_cuda();
    if (!be || use_launch_device(l) != 0) return NULL;
    ncclUniqueId id;
    if (share_unique_id(l, bootstrap, &id, timeout_s) != 0) return NULL;
    nccl_tp *t = tp_new(be, l->size, timeout_s);
    if (!t) return NULL;
    t->base.rank = l->rank;
    for (int r = 0; r < l->size; r++) t->base.world[r] = r;
    if (init_comm(t, id) != 0 || connect_all(t) != 0) {
        abort_comm(&t->comm);
        release(t);
        return NULL;
    }
    t->bootstrap = bootstrap;
    t->owns_bootstrap = bootstrap != NULL;
    return &t->base;
}
