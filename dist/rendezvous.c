/* The TCP rendezvous that starts NCCL without MPI: rank 0 listens on MASTER_ADDR:MASTER_PORT and
 * answers every other rank with the same bytes (NCCL's unique id). A rank introduces itself with
 * a hello (magic, version, rank, size). Rank 0 serves all its connections at once through poll(),
 * so a stray or silent connection delays no one; a hello that contradicts the job (another size,
 * a rank out of range or claimed twice) ends the rendezvous at once with a message naming it.
 * Every wait (connect, accept, each read and write) ends at one deadline. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "launch.h"

enum {
    MAGIC = 0x514C4D52, /* "QLMR" */
    VERSION = 1,
    HELLO_BYTES = 16, /* magic, version, rank, size: 32-bit words in network order */
    REPLY_HEAD = 12,  /* status, then the byte count as two words (high, low) */
    STATUS_OK = 0,
    STATUS_REFUSED = 1,
    FROM_LEN = 80, /* "[numeric v6 address%scope]:port" */
};

/* Where the rendezvous is and who is speaking, for messages. */
typedef struct {
    char where[300]; /* "host:port", "[v6]:port" */
    int rank;
    double timeout_s;
} place;


/* Milliseconds for one poll(): what is left before the deadline, rounded up, at most a second
 * (the callers check the deadline again after each poll). */
static int poll_ms(double deadline) {
    double left = deadline - qlm_now_s();
    if (left <= 0) return 0;
    return left >= 1.0 ? 1000 : (int)(left * 1000.0) + 1;
}

static void put_u32(unsigned char *p, uint32_t v) {
    v = htonl(v);
    memcpy(p, &v, 4);
}

static uint32_t get_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return ntohl(v);
}

static void reply_head(unsigned char *p, uint32_t status, uint64_t n) {
    put_u32(p, status);
    put_u32(p + 4, (uint32_t)(n >> 32));
    put_u32(p + 8, (uint32_t)n);
}

static int resolve(const place *pl, const char *addr, int port, struct addrinfo **out) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    int rc = getaddrinfo(addr, service, &hints, out);
    if (rc == 0) return 0;
    return qlm_errorf("rank %d: rendezvous at %s: cannot resolve %s: %s", pl->rank, pl->where, addr,
                      rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
}

/* Waits until fd is ready for events or the deadline passes (-1, errno ETIMEDOUT). */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        if (qlm_now_s() >= deadline) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, poll_ms(deadline));
        if (r > 0) return 0; /* an error or hang-up shows in the next send or recv */
        if (r < 0 && errno != EINTR) return -1;
    }
}

/* Sends or receives exactly len bytes on a non-blocking socket before the deadline: 0; -1 with
 * errno set; -2 when the peer closed the connection first. */
static int transfer_all(int fd, void *buf, size_t len, int sending, double deadline) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = sending ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return -2;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_fd(fd, sending ? POLLOUT : POLLIN, deadline) != 0) return -1;
        } else if (errno != EINTR) {
            return -1;
        }
    }
    return 0;
}

/* "rank 3", "ranks 1, 4" (at most 16 named) for the ranks 1..size-1 whose flag equals want. */
static void list_ranks(const char *flags, int size, char want, char *buf, size_t cap) {
    int count = 0;
    for (int r = 1; r < size; r++) count += flags[r] == want;
    size_t len = (size_t)snprintf(buf, cap, "%s", count == 1 ? "rank" : "ranks");
    int named = 0;
    for (int r = 1; r < size && named < 16 && len < cap; r++)
        if (flags[r] == want) len += (size_t)snprintf(buf + len, cap - len, "%s %d", named++ ? "," : "", r);
    if (count > named && len < cap) snprintf(buf + len, cap - len, " and %d more", count - named);
}

/* ---- rank 0 ---- */

typedef struct {
    int fd;
    unsigned char hello[HELLO_BYTES];
    size_t got, sent;
    int rank; /* -1 until its hello has been read */
    char from[FROM_LEN];
} conn;

typedef struct {
    const place *pl;
    int size;
    int listen_fd;
    conn *conns;
    int n_conns, cap_conns;
    struct pollfd *fds;
    char *claimed, *answered; /* per rank */
    char (*claimed_from)[FROM_LEN];
    int n_answered;
    unsigned char *reply;
    size_t reply_len;
} server;

static int listen_on(server *s, const char *addr, int port) {
    struct addrinfo *list;
    if (resolve(s->pl, addr, port, &list) != 0) return -1;
    const char *step = "socket";
    int err = 0;
    for (struct addrinfo *ai = list; ai && s->listen_fd < 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            step = "socket", err = errno;
            continue;
        }
        int one = 1;
        /* A rank 0 restarted soon after a failed job can listen again on the same port. */
        if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) step = "SO_REUSEADDR", err = errno;
        else if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) step = "bind", err = errno;
        else if (listen(fd, s->size + 16) != 0) step = "listen", err = errno;
        else s->listen_fd = fd;
        if (s->listen_fd != fd) close(fd);
    }
    freeaddrinfo(list);
    if (s->listen_fd >= 0) return 0;
    return qlm_errorf("rank 0: rendezvous at %s: cannot listen: %s: %s", s->pl->where, step, strerror(err));
}

static void describe_peer(const struct sockaddr_storage *sa, socklen_t len, char *out) {
    char host[64], serv[8]; /* numeric: too short a buffer fails, it does not truncate */
    if (getnameinfo((const struct sockaddr *)sa, len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        snprintf(out, FROM_LEN, "an unknown address");
    else if (strchr(host, ':'))
        snprintf(out, FROM_LEN, "[%s]:%s", host, serv);
    else
        snprintf(out, FROM_LEN, "%s:%s", host, serv);
}

static int add_conn(server *s, int fd, const struct sockaddr_storage *sa, socklen_t len) {
    if (s->n_conns == s->cap_conns) {
        int cap = s->cap_conns ? 2 * s->cap_conns : 16;
        conn *c = realloc(s->conns, (size_t)cap * sizeof *c);
        struct pollfd *f = c ? realloc(s->fds, (size_t)(cap + 1) * sizeof *f) : NULL;
        if (c) s->conns = c;
        if (f) s->fds = f;
        if (!c || !f) {
            close(fd);
            return qlm_errorf("out of memory");
        }
        s->cap_conns = cap;
    }
    conn *c = &s->conns[s->n_conns++];
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->rank = -1;
    describe_peer(sa, len, c->from);
    return 0;
}

static void drop_conn(server *s, int i) {
    close(s->conns[i].fd);
    s->conns[i] = s->conns[--s->n_conns];
}

/* Accepts every connection waiting. */
static int accept_new(server *s) {
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            if (add_conn(s, fd, &sa, len) != 0) return -1;
            continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        /* A client that gave up between its connect and this accept is no failure. */
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        return qlm_errorf("rank 0: rendezvous at %s: accept: %s", s->pl->where, strerror(errno));
    }
}

/* Tells a process whose hello contradicts the job that rank 0 refused it, so it does not report
 * a mere lost connection. The result is ignored: the rendezvous fails either way, and a process
 * that misses this word reports the closed connection instead. */
static void refuse(const conn *c) {
    unsigned char head[REPLY_HEAD];
    reply_head(head, STATUS_REFUSED, 0);
    (void)send(c->fd, head, sizeof head, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* A complete hello: 0 (the rank is claimed, or a stray is to be dropped: c->rank stays -1), or -1
 * with a message when it contradicts the job. */
static int check_hello(server *s, conn *c) {
    const place *pl = s->pl;
    uint32_t magic = get_u32(c->hello), version = get_u32(c->hello + 4);
    uint32_t rank = get_u32(c->hello + 8), size = get_u32(c->hello + 12);
    if (magic != MAGIC) return 0;
    if (version != VERSION) {
        refuse(c);
        return qlm_errorf("rank 0: rendezvous at %s: the process at %s speaks rendezvous version %u, rank 0 "
                          "version %d (a different qlm build)",
                          pl->where, c->from, version, VERSION);
    }
    if (size != (uint32_t)s->size) {
        refuse(c);
        return qlm_errorf("rank 0: rendezvous at %s: the process at %s says it is rank %u of a job of %u ranks; "
                          "rank 0 has %d",
                          pl->where, c->from, rank, size, s->size);
    }
    if (rank == 0 || rank >= size) {
        refuse(c);
        return qlm_errorf("rank 0: rendezvous at %s: the process at %s says it is rank %u; rank 0 expects ranks "
                          "1..%d",
                          pl->where, c->from, rank, s->size - 1);
    }
    if (s->claimed[rank]) {
        refuse(c);
        return qlm_errorf("rank 0: rendezvous at %s: two processes say they are rank %u (at %s and %s)", pl->where,
                          rank, s->claimed_from[rank], c->from);
    }
    s->claimed[rank] = 1;
    memcpy(s->claimed_from[rank], c->from, FROM_LEN);
    c->rank = (int)rank;
    return 0;
}

/* Reads what has arrived of c's hello: 0 to keep c, 1 to drop it (closed, or a stray), -1 on a
 * hello that contradicts the job. */
static int read_hello(server *s, conn *c) {
    for (;;) {
        ssize_t n = recv(c->fd, c->hello + c->got, HELLO_BYTES - c->got, 0);
        if (n > 0) {
            c->got += (size_t)n;
            if (c->got < HELLO_BYTES) continue;
            if (check_hello(s, c) != 0) return -1;
            return c->rank < 0;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return 1; /* closed or reset before a whole hello: not one of the job's ranks */
    }
}

/* Sends what the socket takes of the reply: 0 to keep c, 1 when c's rank has all of it, -1 when
 * the connection broke. */
static int write_reply(server *s, conn *c) {
    for (;;) {
        ssize_t n = send(c->fd, s->reply + c->sent, s->reply_len - c->sent, MSG_NOSIGNAL);
        if (n > 0) {
            c->sent += (size_t)n;
            if (c->sent < s->reply_len) continue;
            s->answered[c->rank] = 1;
            s->n_answered++;
            return 1;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return qlm_errorf("rank 0: rendezvous at %s: lost rank %d (at %s) while answering it: %s", s->pl->where,
                          c->rank, c->from, n == 0 ? "nothing sent" : strerror(errno));
    }
}

static int serve_conn(server *s, conn *c) { return c->rank < 0 ? read_hello(s, c) : write_reply(s, c); }

static int report_missing(const server *s) {
    char who[200];
    const place *pl = s->pl;
    int unclaimed = 0;
    for (int r = 1; r < s->size; r++) unclaimed += !s->claimed[r];
    if (unclaimed) {
        list_ranks(s->claimed, s->size, 0, who, sizeof who);
        return qlm_errorf("rank 0: rendezvous at %s: no word from %s within %g s (not started, or cannot reach "
                          "this address)",
                          pl->where, who, pl->timeout_s);
    }
    list_ranks(s->answered, s->size, 0, who, sizeof who);
    return qlm_errorf("rank 0: rendezvous at %s: could not deliver the bytes to %s within %g s", pl->where, who,
                      pl->timeout_s);
}

/* One round: waits for activity, then serves the connections and accepts new ones. */
static int serve_round(server *s, double deadline) {
    s->fds[0] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
    for (int i = 0; i < s->n_conns; i++)
        s->fds[i + 1] = (struct pollfd){.fd = s->conns[i].fd, .events = s->conns[i].rank < 0 ? POLLIN : POLLOUT};
    int r = poll(s->fds, (nfds_t)s->n_conns + 1, poll_ms(deadline));
    if (r < 0 && errno == EINTR) return 0;
    if (r < 0) return qlm_errorf("rank 0: rendezvous at %s: poll: %s", s->pl->where, strerror(errno));
    /* Backwards, so that dropping connection i (the last one moves into its place) leaves the
     * entries still to visit where they were. */
    for (int i = s->n_conns - 1; i >= 0; i--) {
        if (!s->fds[i + 1].revents) continue;
        int rc = serve_conn(s, &s->conns[i]);
        if (rc < 0) return -1;
        if (rc > 0) drop_conn(s, i);
    }
    return s->fds[0].revents ? accept_new(s) : 0;
}

static int serve(const place *pl, const char *addr, int port, int size, const void *bytes, size_t n,
                 double deadline) {
    server s = {.pl = pl, .size = size, .listen_fd = -1, .reply_len = REPLY_HEAD + n};
    s.claimed = calloc((size_t)size, 1);
    s.answered = calloc((size_t)size, 1);
    s.claimed_from = calloc((size_t)size, FROM_LEN);
    s.reply = malloc(s.reply_len);
    s.fds = malloc(sizeof *s.fds);
    int rc = s.claimed && s.answered && s.claimed_from && s.reply && s.fds ? 0 : qlm_errorf("out of memory");
    if (rc == 0) {
        reply_head(s.reply, STATUS_OK, n);
        if (n) memcpy(s.reply + REPLY_HEAD, bytes, n);
        rc = listen_on(&s, addr, port);
    }
    while (rc == 0 && s.n_answered < size - 1) {
        if (qlm_now_s() >= deadline) rc = report_missing(&s);
        else rc = serve_round(&s, deadline);
    }
    while (s.n_conns > 0) drop_conn(&s, s.n_conns - 1);
    if (s.listen_fd >= 0) close(s.listen_fd);
    free(s.conns), free(s.fds), free(s.claimed), free(s.answered), free(s.claimed_from), free(s.reply);
    return rc;
}

/* ---- the other ranks ---- */

/* A connected non-blocking socket to ai, or -1 with *err set. */
static int try_connect(const struct addrinfo *ai, double deadline, int *err) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    /* Interrupted, a non-blocking connect goes on in the background like one in progress. */
    if (rc != 0 && (errno == EINPROGRESS || errno == EINTR)) {
        int so_error = 0;
        socklen_t len = sizeof so_error;
        if (wait_fd(fd, POLLOUT, deadline) != 0) rc = -1;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) rc = -1;
        else if (so_error != 0) rc = -1, errno = so_error;
        else rc = 0;
    }
    if (rc == 0) return fd;
    *err = errno;
    close(fd);
    return -1;
}

/* The hello, then the reply into bytes. */
static int greet(const place *pl, int fd, int size, void *bytes, size_t n, double deadline) {
    unsigned char hello[HELLO_BYTES], head[REPLY_HEAD];
    put_u32(hello, MAGIC);
    put_u32(hello + 4, VERSION);
    put_u32(hello + 8, (uint32_t)pl->rank);
    put_u32(hello + 12, (uint32_t)size);
    const char *what = "sending its hello";
    int rc = transfer_all(fd, hello, sizeof hello, 1, deadline);
    if (rc == 0) what = "waiting for the answer", rc = transfer_all(fd, head, sizeof head, 0, deadline);
    if (rc == 0 && get_u32(head) != STATUS_OK)
        return qlm_errorf("rank %d: rendezvous at %s: rank 0 refused this process (rank %d of %d); see rank 0's "
                          "message",
                          pl->rank, pl->where, pl->rank, size);
    uint64_t len = rc == 0 ? ((uint64_t)get_u32(head + 4) << 32) | get_u32(head + 8) : 0;
    if (rc == 0 && len != n)
        return qlm_errorf("rank %d: rendezvous at %s: rank 0 sends %llu bytes, this rank expects %zu (a different "
                          "qlm build?)",
                          pl->rank, pl->where, (unsigned long long)len, n);
    if (rc == 0 && n) what = "receiving the bytes", rc = transfer_all(fd, bytes, n, 0, deadline);
    if (rc == 0) return 0;
    if (rc == -2)
        return qlm_errorf("rank %d: rendezvous at %s: rank 0 closed the connection while this rank was %s (it "
                          "failed or refused this rank; see its message)",
                          pl->rank, pl->where, what);
    if (errno == ETIMEDOUT)
        return qlm_errorf("rank %d: rendezvous at %s: rank 0 did not answer within %g s (%s)", pl->rank, pl->where,
                          pl->timeout_s, what);
    return qlm_errorf("rank %d: rendezvous at %s: %s: %s", pl->rank, pl->where, what, strerror(errno));
}

/* Connects to rank 0, trying each of addr's addresses and again after a short sleep until the
 * deadline: rank 0 may not be listening yet. */
static int join(const place *pl, const char *addr, int port, int size, void *bytes, size_t n, double deadline) {
    struct addrinfo *list;
    if (resolve(pl, addr, port, &list) != 0) return -1;
    int err = ETIMEDOUT, fd = -1;
    while (fd < 0 && qlm_now_s() < deadline) {
        for (struct addrinfo *ai = list; ai && fd < 0; ai = ai->ai_next) fd = try_connect(ai, deadline, &err);
        double pause = deadline - qlm_now_s();
        if (fd < 0 && pause > 0) {
            struct timespec ts = {0, pause < 0.05 ? (long)(pause * 1e9) : 50000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) continue;
        }
    }
    freeaddrinfo(list);
    if (fd < 0)
        return qlm_errorf("rank %d: rendezvous at %s: could not reach rank 0 within %g s: %s (is rank 0 running, "
                          "and MASTER_ADDR/MASTER_PORT its address?)",
                          pl->rank, pl->where, pl->timeout_s, strerror(err));
    int rc = greet(pl, fd, size, bytes, n, deadline);
    close(fd);
    return rc;
}

int qlm_rendezvous_broadcast(const char *addr, int port, int rank, int size, void *bytes, size_t n,
                             double timeout_s) {
    if (size < 1) return qlm_errorf("rendezvous: a job of %d ranks", size);
    if (rank < 0 || rank >= size) return qlm_errorf("rendezvous: rank %d is not in 0..%d", rank, size - 1);
    if (size == 1) return 0;
    if (!addr || !*addr) return qlm_errorf("rank %d: rendezvous: no address for rank 0", rank);
    if (port < 1 || port > 65535)
        return qlm_errorf("rank %d: rendezvous at %s: port %d is not in 1..65535", rank, addr, port);
    if (!(timeout_s > 0)) return qlm_errorf("rank %d: rendezvous: the timeout must be positive", rank);
    if (n && !bytes) return qlm_errorf("rank %d: rendezvous: no buffer for %zu bytes", rank, n);
    place pl = {.rank = rank, .timeout_s = timeout_s};
    snprintf(pl.where, sizeof pl.where, strchr(addr, ':') ? "[%s]:%d" : "%s:%d", addr, port);
    double deadline = qlm_now_s() + timeout_s;
    return rank == 0 ? serve(&pl, addr, port, size, bytes, n, deadline)
                     : join(&pl, addr, port, size, bytes, n, deadline);
}
