/* Every open connection, from accept to close, looked at ten times a second by one thread. The
 * event loop only notices a connection when bytes move, so two things need this outside view:
 * a request that has not arrived whole within the deadline (slowloris: a byte now and then keeps
 * an idle timer happy, not a total one) is cut with shutdown(), which the loop then sees; and a
 * generation parked while it waits for tokens, whose connection the loop no longer polls, is
 * cancelled when its client hangs up. A client that hangs up while its request is still arriving is
 * cut too. */
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "../core/error.h"
#include "internal.h"

enum { TICK_MS = 100 };

static int hung_up(short revents) { return (revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0; }

/* One poll over every connection that waits for its client (a request still arriving) or for a
 * generation: a client that hung up is cut, or its generation cancelled. libmicrohttpd misses some
 * such hang-ups under load (seen: a closed connection held its per-address slot until the idle
 * timeout); shutdown() makes the event loop see it. */
static void look(watchdog *w, double now) {
    int n = 0;
    for (peer *p = w->head; p; p = p->next) {
        if (p->receiving && !p->cut && now - p->since > w->deadline_s) {
            /* The fd stays open until MHD's close notice, which needs w->mu. */
            shutdown(p->fd, SHUT_RDWR);
            p->cut = 1;
            w->cut++;
        }
        n += (p->receiving && !p->cut) || p->job;
    }
    if (n > w->cap) {
        struct pollfd *f = realloc(w->pfd, (size_t)n * 2 * sizeof *f);
        peer **m = f ? realloc(w->pmap, (size_t)n * 2 * sizeof *m) : NULL;
        if (f) w->pfd = f;
        if (!m) return; /* try again next tick */
        w->pmap = m;
        w->cap = n * 2;
    }
    int k = 0;
    for (peer *p = w->head; p; p = p->next)
        if ((p->receiving && !p->cut) || p->job) {
            w->pfd[k] = (struct pollfd){.fd = p->fd, .events = POLLRDHUP};
            w->pmap[k++] = p;
        }
    if (k == 0 || poll(w->pfd, (nfds_t)k, 0) <= 0) return;
    for (int i = 0; i < k; i++) {
        peer *p = w->pmap[i];
        if (!hung_up(w->pfd[i].revents)) continue;
        if (p->job) {
            job_cancel(w->queue, p->job);
            p->job = NULL;
        } else {
            shutdown(p->fd, SHUT_RDWR);
            p->cut = 1;
        }
    }
}

static void *watch(void *arg) {
    watchdog *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += TICK_MS * 1000000L;
        until.tv_sec += until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&w->cv, &w->mu, &until);
        look(w, qlm_now_s());
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int watchdog_start(watchdog *w, job_queue *q, double deadline_s) {
    *w = (watchdog){.queue = q, .deadline_s = deadline_s};
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, watch, w) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        return qlm_errorf("server: cannot start the connection watchdog thread");
    }
    return 0;
}

void watchdog_stop(watchdog *w) {
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    free(w->pfd);
    free(w->pmap);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

peer *watchdog_add(watchdog *w, int fd) {
    peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->fd = fd;
    p->receiving = 1;
    p->since = qlm_now_s();
    pthread_mutex_lock(&w->mu);
    p->next = w->head;
    if (w->head) w->head->prev = p;
    w->head = p;
    w->open++;
    pthread_mutex_unlock(&w->mu);
    return p;
}

void watchdog_remove(watchdog *w, peer *p) {
    pthread_mutex_lock(&w->mu);
    if (p->prev) p->prev->next = p->next;
    else w->head = p->next;
    if (p->next) p->next->prev = p->prev;
    w->open--;
    pthread_mutex_unlock(&w->mu);
    free(p);
}

void watchdog_arrived(watchdog *w, peer *p) {
    pthread_mutex_lock(&w->mu);
    p->receiving = 0;
    pthread_mutex_unlock(&w->mu);
}

void watchdog_watch_job(watchdog *w, peer *p, job *j) {
    pthread_mutex_lock(&w->mu);
    p->job = j;
    pthread_mutex_unlock(&w->mu);
}

void watchdog_answered(watchdog *w, peer *p) {
    pthread_mutex_lock(&w->mu);
    p->job = NULL;
    p->receiving = 1;
    p->since = qlm_now_s();
    pthread_mutex_unlock(&w->mu);
}

void watchdog_counts(watchdog *w, int *open, long *cut) {
    pthread_mutex_lock(&w->mu);
    *open = w->open;
    *cut = w->cut;
    pthread_mutex_unlock(&w->mu);
}
