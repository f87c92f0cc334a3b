/* The MPI transport. One progress thread owns MPI (MPI_THREAD_FUNNELED): it initializes it, posts
 * each operation's MPI_Isend/MPI_Irecv in the order callers start them, and keeps testing the
 * requests in flight, so transfers advance while the caller's threads compute (Open MPI moves
 * shared-memory and TCP messages only inside MPI calls). Callers wait on a condition variable
 * with a deadline; the thread records which requests finished, so a timeout names the peers
 * whose data never came. MPI errors return (MPI_ERRORS_RETURN) and become messages. */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "launch.h"
#include "transport.h"

enum { MAX_MSG = 1 << 30 }; /* bytes per MPI message (counts are int) */

typedef struct mpi_op {
    MPI_Request *reqs;
    int *peer;       /* member each request talks to */
    char *is_recv;
    char *finished;  /* set by the thread as requests complete */
    int n, n_done;
    int state;       /* 0 in flight, 1 complete, -1 failed */
    char err[320];
    struct mpi_op *next_active;
} mpi_op;

typedef struct {
    qlm_transport base;
    MPI_Comm comm;
} mpi_tp;

typedef enum { CMD_POST, CMD_SPLIT, CMD_FREE, CMD_ABORT } cmd_kind;

typedef struct cmd {
    cmd_kind kind;
    mpi_tp *tp;
    mpi_op *op;
    qlm_xfer *xfers; /* CMD_POST: sends then receives */
    int n_send, n_recv;
    int color, key, code;
    mpi_tp *result; /* CMD_SPLIT */
    int done;
    char err[256];
    struct cmd *next;
} cmd;

static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    cmd *head, *tail;
    int running, stop, init_state; /* init_state: 0 pending, 1 up, -1 failed */
    int waiters; /* callers blocked in a wait */
    char init_err[256];
    int world_rank, world_size;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

static void mpi_message(int code, char *buf, size_t cap, const char *what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "MPI error %d", code);
    snprintf(buf, cap, "%s: %.200s", what, text);
}


/* ---- on the progress thread ---- */

static void post(cmd *c) {
    mpi_op *op = c->op;
    int k = 0, rc = MPI_SUCCESS;
    for (int i = 0; i < c->n_send + c->n_recv && rc == MPI_SUCCESS; i++) {
        const qlm_xfer *x = &c->xfers[i];
        int recv = i >= c->n_send;
        size_t off = 0;
        do {
            size_t len = x->bytes - off > MAX_MSG ? MAX_MSG : x->bytes - off;
            char *p = (char *)x->data + off;
            rc = recv ? MPI_Irecv(p, (int)len, MPI_BYTE, x->peer, 1, c->tp->comm, &op->reqs[k])
                      : MPI_Isend(p, (int)len, MPI_BYTE, x->peer, 1, c->tp->comm, &op->reqs[k]);
            op->peer[k] = x->peer;
            op->is_recv[k] = (char)recv;
            k++;
            off += len;
        } while (off < x->bytes && rc == MPI_SUCCESS);
    }
    op->n = k;
    if (rc != MPI_SUCCESS) {
        mpi_message(rc, op->err, sizeof op->err, "starting a transfer");
        op->state = -1;
    }
}

static void split(cmd *c) {
    MPI_Comm out;
    int rc = MPI_Comm_split(c->tp->comm, c->color, c->key, &out);
    if (rc != MPI_SUCCESS) {
        mpi_message(rc, c->err, sizeof c->err, "splitting the communicator");
        return;
    }
    MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
    mpi_tp *t = c->result;
    t->comm = out;
    MPI_Comm_rank(out, &t->base.rank);
    MPI_Comm_size(out, &t->base.size);
    t->base.world = malloc((size_t)t->base.size * sizeof(int));
    int *mine = malloc((size_t)t->base.size * sizeof(int));
    if (!t->base.world || !mine) {
        free(mine);
        snprintf(c->err, sizeof c->err, "out of memory");
        return;
    }
    MPI_Group sub, world;
    MPI_Comm_group(out, &sub);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    for (int r = 0; r < t->base.size; r++) mine[r] = r;
    MPI_Group_translate_ranks(sub, t->base.size, mine, world, t->base.world);
    MPI_Group_free(&sub);
    MPI_Group_free(&world);
    free(mine);
}

/* Tests op's requests and returns its new state (0 in flight, 1 complete, -1 failed); *moved when
 * any request finished. The state is not published here: the waiting thread frees op as soon as
 * it sees a final state, so the engine unlinks op first. */
static int progress(mpi_op *op, int *moved) {
    int *idx = malloc((size_t)(op->n ? op->n : 1) * sizeof *idx), count = 0;
    *moved = 0;
    if (!idx) return 0;
    int rc = op->n ? MPI_Testsome(op->n, op->reqs, &count, idx, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    if (rc != MPI_SUCCESS) {
        mpi_message(rc, op->err, sizeof op->err, "a transfer failed");
        free(idx);
        return -1;
    }
    if (count == MPI_UNDEFINED) count = 0;
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < count; i++) op->finished[idx[i]] = 1;
    op->n_done += count;
    pthread_mutex_unlock(&g.mu);
    free(idx);
    *moved = count > 0;
    return op->n_done == op->n ? 1 : 0;
}

static void *engine(void *arg) {
    (void)arg;
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    pthread_mutex_lock(&g.mu);
    if (rc != MPI_SUCCESS) {
        snprintf(g.init_err, sizeof g.init_err, "MPI_Init_thread failed (error %d)", rc);
        g.init_state = -1;
    } else {
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &g.world_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g.world_size);
        g.init_state = 1;
    }
    pthread_cond_broadcast(&g.done);
    pthread_mutex_unlock(&g.mu);
    if (rc != MPI_SUCCESS) return NULL;
    mpi_op *active = NULL;
    int idle = 0;
    for (;;) {
        pthread_mutex_lock(&g.mu);
        while (!g.head && !active && !g.stop) pthread_cond_wait(&g.work, &g.mu);
        if (g.stop && !g.head && !active) {
            pthread_mutex_unlock(&g.mu);
            break;
        }
        cmd *list = g.head;
        g.head = g.tail = NULL;
        pthread_mutex_unlock(&g.mu);
        int changed = list != NULL;
        for (cmd *c = list, *next; c; c = next) {
            next = c->next;
            if (c->kind == CMD_ABORT) MPI_Abort(MPI_COMM_WORLD, c->code);
            if (c->kind == CMD_POST) {
                post(c);
                if (c->op->state == 0) {
                    mpi_op **tail = &active;
                    while (*tail) tail = &(*tail)->next_active;
                    *tail = c->op;
                }
            } else if (c->kind == CMD_SPLIT) {
                split(c);
            } else if (c->kind == CMD_FREE) {
                MPI_Comm_free(&c->tp->comm);
            }
            pthread_mutex_lock(&g.mu);
            c->done = 1;
            pthread_mutex_unlock(&g.mu);
        }
        for (mpi_op **p = &active; *p;) {
            mpi_op *op = *p;
            int moved, state = progress(op, &moved);
            changed |= moved;
            if (state == 0) {
                p = &op->next_active;
                continue;
            }
            *p = op->next_active;
            pthread_mutex_lock(&g.mu);
            op->state = state;
            pthread_mutex_unlock(&g.mu);
            changed = 1;
        }
        if (changed) {
            pthread_mutex_lock(&g.mu);
            pthread_cond_broadcast(&g.done);
            pthread_mutex_unlock(&g.mu);
            idle = 0;
        } else if (active) {
            /* Nothing moved. With a caller waiting: yield at first, then sleep longer, up to 0.5 ms,
             * so a rank waiting on a slower peer leaves the cores to the ranks still computing.
             * With none (a prefetch while the caller computes): poll every 50 us, not taking the
             * caller's core with a spin. */
            int waiting = __atomic_load_n(&g.waiters, __ATOMIC_RELAXED) > 0;
            if (waiting && ++idle < 64) {
                sched_yield();
            } else {
                long ns = 1000L * (!waiting ? 20 : idle < 128 ? 20 : idle < 256 ? 100 : 500);
                struct timespec ts = {0, ns};
                nanosleep(&ts, NULL);
            }
        }
    }
    MPI_Finalize();
    return NULL;
}

/* ---- callers ---- */

static void submit(cmd *c) {
    pthread_mutex_lock(&g.mu);
    if (g.tail) g.tail->next = c;
    else g.head = c;
    g.tail = c;
    pthread_cond_signal(&g.work);
    pthread_mutex_unlock(&g.mu);
}

/* Submits c and waits until the thread has run it. */
static void run(cmd *c) {
    submit(c);
    pthread_mutex_lock(&g.mu);
    while (!c->done) pthread_cond_wait(&g.done, &g.mu);
    pthread_mutex_unlock(&g.mu);
}

static void op_free(mpi_op *op) {
    free(op->reqs);
    free(op->peer);
    free(op->is_recv);
    free(op->finished);
    free(op);
}

static int tp_start(qlm_transport *t, const qlm_xfer *send, int n_send, const qlm_xfer *recv, int n_recv,
                    void **out) {
    mpi_tp *m = (mpi_tp *)t;
    int n = 0;
    for (int i = 0; i < n_send; i++) n += (int)(send[i].bytes / MAX_MSG + 1);
    for (int i = 0; i < n_recv; i++) n += (int)(recv[i].bytes / MAX_MSG + 1);
    cmd *c = calloc(1, sizeof *c);
    mpi_op *op = calloc(1, sizeof *op);
    if (c) c->xfers = malloc((size_t)(n_send + n_recv + 1) * sizeof *c->xfers);
    if (op) {
        op->reqs = calloc((size_t)n + 1, sizeof *op->reqs);
        op->peer = calloc((size_t)n + 1, sizeof *op->peer);
        op->is_recv = calloc((size_t)n + 1, 1);
        op->finished = calloc((size_t)n + 1, 1);
    }
    if (!c || !op || !c->xfers || !op->reqs || !op->peer || !op->is_recv || !op->finished) {
        if (c) free(c->xfers);
        free(c);
        if (op) op_free(op);
        return qlm_errorf("out of memory");
    }
    if (n_send) memcpy(c->xfers, send, (size_t)n_send * sizeof *send);
    if (n_recv) memcpy(c->xfers + n_send, recv, (size_t)n_recv * sizeof *recv);
    c->kind = CMD_POST;
    c->tp = m;
    c->op = op;
    c->n_send = n_send;
    c->n_recv = n_recv;
    run(c);
    free(c->xfers);
    free(c);
    *out = op;
    return 0;
}

/* "rank 2" or "ranks 1, 3": the world ranks of the peers whose receives (or, when every receive
 * finished, sends) did not finish. Returns whether they are receives. */
static int missing_peers(const mpi_tp *m, const mpi_op *op, char *buf, size_t cap) {
    int recv = 0;
    for (int i = 0; i < op->n; i++) recv |= !op->finished[i] && op->is_recv[i];
    int seen[32], count = 0;
    char list[200] = "";
    size_t len = 0;
    for (int i = 0; i < op->n && count < 32; i++) {
        if (op->finished[i] || op->is_recv[i] != recv) continue;
        int w = m->base.world[op->peer[i]], dup = 0;
        for (int k = 0; k < count; k++) dup |= seen[k] == w;
        if (dup) continue;
        seen[count++] = w;
        if (len < sizeof list) len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", count > 1 ? ", " : "", w);
    }
    snprintf(buf, cap, "%s %s", count > 1 ? "ranks" : "rank", list);
    return recv;
}

static int tp_wait(qlm_transport *t, void *handle, double timeout_s) {
    mpi_tp *m = (mpi_tp *)t;
    mpi_op *op = handle;
    double deadline = qlm_now_s() + timeout_s;
    int timed_out = 0;
    pthread_mutex_lock(&g.mu);
    __atomic_add_fetch(&g.waiters, 1, __ATOMIC_RELAXED);
    while (op->state == 0 && !timed_out) {
        double left = deadline - qlm_now_s();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double step = left < 1.0 ? left : 1.0;
        ts.tv_sec += (time_t)step;
        ts.tv_nsec += (long)((step - (double)(time_t)step) * 1e9);
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&g.done, &g.mu, &ts);
    }
    __atomic_sub_fetch(&g.waiters, 1, __ATOMIC_RELAXED);
    int state = op->state, recv = 0;
    char who[256] = "";
    if (state == 0) recv = missing_peers(m, op, who, sizeof who);
    pthread_mutex_unlock(&g.mu);
    if (state == 1) {
        op_free(op);
        return 0;
    }
    /* A failed or abandoned operation keeps its requests: the job ends now. */
    if (state == -1) return qlm_errorf("rank %d: %s", g.world_rank, op->err);
    return qlm_errorf("rank %d: %s %s for %.0f s: it died or hangs (the deadline is --dist-timeout or "
                      "QLM_DIST_TIMEOUT seconds)",
                      g.world_rank, recv ? "no data from" : "could not deliver to", who, timeout_s);
}

static qlm_transport *tp_split(qlm_transport *t, int color, int key);

static void tp_abort(qlm_transport *t, int code) {
    (void)t;
    cmd *c = calloc(1, sizeof *c);
    if (c) {
        c->kind = CMD_ABORT;
        c->code = code;
        submit(c);
    }
    /* The thread aborts the job; if it is stuck, do it from here. */
    sleep(5);
    MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);
}

static void tp_close(qlm_transport *t) {
    mpi_tp *m = (mpi_tp *)t;
    if (m->comm == MPI_COMM_WORLD) {
        pthread_mutex_lock(&g.mu);
        g.stop = 1;
        pthread_cond_signal(&g.work);
        pthread_mutex_unlock(&g.mu);
        pthread_join(g.thread, NULL);
        g.running = 0;
    } else if (m->comm != MPI_COMM_NULL) {
        cmd c = {.kind = CMD_FREE, .tp = m};
        run(&c);
    }
    free(m->base.world);
    free(m);
}

static mpi_tp *tp_alloc(void) {
    mpi_tp *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->base = (qlm_transport){.name = "mpi", .start = tp_start, .wait = tp_wait, .split = tp_split,
                              .abort = tp_abort, .close = tp_close};
    m->comm = MPI_COMM_NULL;
    return m;
}

static qlm_transport *tp_split(qlm_transport *t, int color, int key) {
    mpi_tp *out = tp_alloc();
    if (!out) {
        qlm_errorf("out of memory");
        return NULL;
    }
    cmd c = {.kind = CMD_SPLIT, .tp = (mpi_tp *)t, .color = color, .key = key, .result = out};
    run(&c);
    if (c.err[0] || out->comm == MPI_COMM_NULL) {
        qlm_errorf("rank %d: %s", g.world_rank, c.err[0] ? c.err : "splitting the communicator failed");
        free(out->base.world);
        free(out);
        return NULL;
    }
    return &out->base;
}

qlm_transport *qlm_transport_mpi_world(void) {
    if (g.running) {
        qlm_errorf("internal: the MPI world transport is already open");
        return NULL;
    }
    mpi_tp *m = tp_alloc();
    if (!m) {
        qlm_errorf("out of memory");
        return NULL;
    }
    g.stop = 0;
    g.init_state = 0;
    if (pthread_create(&g.thread, NULL, engine, NULL) != 0) {
        free(m);
        qlm_errorf("cannot start the MPI progress thread: %s", strerror(errno));
        return NULL;
    }
    pthread_mutex_lock(&g.mu);
    while (g.init_state == 0) pthread_cond_wait(&g.done, &g.mu);
    pthread_mutex_unlock(&g.mu);
    if (g.init_state < 0) {
        pthread_join(g.thread, NULL);
        free(m);
        qlm_errorf("%s", g.init_err);
        return NULL;
    }
    g.running = 1;
    m->comm = MPI_COMM_WORLD;
    m->base.rank = g.world_rank;
    m->base.size = g.world_size;
    m->base.world = malloc((size_t)g.world_size * sizeof(int));
    if (!m->base.world) {
        tp_close(&m->base);
        qlm_errorf("out of memory");
        return NULL;
    }
    for (int r = 0; r < g.world_size; r++) m->base.world[r] = r;
    return &m->base;
}
