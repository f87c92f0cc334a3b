/* The TCP rendezvous that starts NCCL without MPI (dist/rendezvous.c), with forked ranks on the
 * loopback: every rank receives rank 0's bytes, whether rank 0 listens first or last; stray
 * connections (a foreign protocol, a silent one) are dropped while the ranks finish; a rank that
 * never comes, a rank claimed twice and a rank of another job size make rank 0 fail within the
 * deadline with a message naming them; bad arguments fail at once. */
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../dist/launch.h"
#include "test_util.h"

enum { PATTERN_BYTES = 128 };

static void sleep_s(double s) { usleep((useconds_t)(s * 1e6)); }

static void fill_pattern(unsigned char *p) {
    for (int i = 0; i < PATTERN_BYTES; i++) p[i] = (unsigned char)(i * 7 + 3);
}

/* A loopback port of family (AF_INET, AF_INET6) that nobody listens on now, or -1 when the
 * family has no loopback here. */
static int free_port(int family) {
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof *a;
    }
    int fd = socket(family, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&ss, len) == 0 && getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                        : ((struct sockaddr_in *)&ss)->sin_port);
    close(fd);
    return port;
}

/* One process of a job and what it must do. */
typedef struct {
    const char *addr;
    int port, rank, size;
    double timeout_s;
    double delay_s;       /* before it calls the rendezvous */
    const char *must_say; /* NULL: it must get rank 0's bytes; else it must fail with this in the message */
    double fail_within_s; /* failing, at most this long after the call */
} rank_plan;

/* Forks a process that plays p and exits 0 when it behaved as planned (it prints its error). */
static pid_t spawn_rank(const rank_plan *p) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid > 0) return pid;
    alarm(8); /* a hang ends the child by signal, which the parent reports */
    sleep_s(p->delay_s);
    unsigned char buf[PATTERN_BYTES], want[PATTERN_BYTES];
    fill_pattern(want);
    if (p->rank == 0) memcpy(buf, want, sizeof buf);
    else memset(buf, 0, sizeof buf);
    double t0 = qlm_now_s();
    int rc = qlm_rendezvous_broadcast(p->addr, p->port, p->rank, p->size, buf, sizeof buf, p->timeout_s);
    double took = qlm_now_s() - t0;
    if (rc != 0) fprintf(stderr, "  rank %d (%.2f s): %s\n", p->rank, took, qlm_last_error());
    int ok = p->must_say ? rc == -1 && strstr(qlm_last_error(), p->must_say) && took <= p->fail_within_s
                         : rc == 0 && memcmp(buf, want, sizeof buf) == 0;
    _exit(ok ? 0 : 1);
}

static void expect_done(pid_t pid, const char *what) {
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st)) fail_msg("%s ended by signal %d", what, WTERMSIG(st));
    if (WEXITSTATUS(st) != 0) fail_msg("%s did not do as planned (see its line above)", what);
}

/* A job of n ranks on addr: the others first, rank 0 a moment later, so they must retry. */
static void run_job(const char *addr, int family, int n) {
    int port = free_port(family);
    assert_true(port > 0);
    pid_t pids[8];
    for (int r = n - 1; r >= 0; r--) {
        rank_plan p = {.addr = addr, .port = port, .rank = r, .size = n, .timeout_s = 5, .delay_s = r ? 0 : 0.2};
        pids[r] = spawn_rank(&p);
    }
    for (int r = 0; r < n; r++) {
        char what[32];
        snprintf(what, sizeof what, "rank %d", r);
        expect_done(pids[r], what);
    }
}

static void test_two_ranks(void **state) {
    (void)state;
    run_job("127.0.0.1", AF_INET, 2);
}

static void test_four_ranks(void **state) {
    (void)state;
    run_job("127.0.0.1", AF_INET, 4);
}

static void test_ipv6(void **state) {
    (void)state;
    if (free_port(AF_INET6) < 0) {
        print_message("no IPv6 loopback here, skipping\n");
        skip();
    }
    run_job("::1", AF_INET6, 2);
}

/* Connects to the loopback port, retrying until timeout_s: the socket, or -1. */
static int connect_retry(int port, double timeout_s) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (double end = qlm_now_s() + timeout_s; qlm_now_s() < end; sleep_s(0.02)) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) return -1;
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        close(fd);
    }
    return -1;
}

/* Forks a stranger that connects, sends greeting (or nothing), and exits 0 when rank 0 closes the
 * connection without sending it a byte. */
static pid_t spawn_stranger(int port, const char *greeting) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid > 0) return pid;
    alarm(8);
    int fd = connect_retry(port, 5);
    if (fd < 0) _exit(2);
    size_t len = strlen(greeting);
    if (len && send(fd, greeting, len, MSG_NOSIGNAL) != (ssize_t)len) _exit(3);
    char c;
    ssize_t n;
    while ((n = recv(fd, &c, 1, 0)) < 0 && errno == EINTR) continue;
    _exit(n == 0 ? 0 : 4);
}

static void test_strangers_dropped(void **state) {
    (void)state;
    int port = free_port(AF_INET);
    assert_true(port > 0);
    rank_plan r0 = {.addr = "127.0.0.1", .port = port, .rank = 0, .size = 2, .timeout_s = 5};
    rank_plan r1 = r0;
    r1.rank = 1, r1.delay_s = 0.3;
    pid_t p0 = spawn_rank(&r0);
    pid_t http = spawn_stranger(port, "GET / HTTP/1.0\r\n"); /* a whole hello's length, wrong magic */
    pid_t silent = spawn_stranger(port, "");
    pid_t p1 = spawn_rank(&r1);
    expect_done(p0, "rank 0");
    expect_done(p1, "rank 1");
    expect_done(http, "the HTTP stranger");
    expect_done(silent, "the silent stranger");
}

static void test_missing_rank(void **state) {
    (void)state;
    int port = free_port(AF_INET);
    assert_true(port > 0);
    rank_plan r0 = {.addr = "127.0.0.1", .port = port, .rank = 0, .size = 3, .timeout_s = 1,
                    .must_say = "no word from rank 2 within 1 s", .fail_within_s = 1.5};
    rank_plan r1 = {.addr = "127.0.0.1", .port = port, .rank = 1, .size = 3, .timeout_s = 5};
    pid_t p0 = spawn_rank(&r0), p1 = spawn_rank(&r1);
    expect_done(p0, "rank 0");
    expect_done(p1, "rank 1");
}

/* A second rank 1 ends the rendezvous at once: rank 0 names the rank, the second is refused. */
static void test_duplicate_rank(void **state) {
    (void)state;
    int port = free_port(AF_INET);
    assert_true(port > 0);
    rank_plan r0 = {.addr = "127.0.0.1", .port = port, .rank = 0, .size = 3, .timeout_s = 4,
                    .must_say = "two processes say they are rank 1", .fail_within_s = 2};
    rank_plan first = {.addr = "127.0.0.1", .port = port, .rank = 1, .size = 3, .timeout_s = 4};
    rank_plan second = first;
    second.delay_s = 0.3, second.must_say = "rank 0 refused this process (rank 1 of 3)", second.fail_within_s = 2;
    pid_t p0 = spawn_rank(&r0), p1 = spawn_rank(&first), p2 = spawn_rank(&second);
    expect_done(p0, "rank 0");
    expect_done(p1, "the first rank 1");
    expect_done(p2, "the second rank 1");
}

/* A process of a larger job claims a rank past this job's last. */
static void test_other_job_size(void **state) {
    (void)state;
    int port = free_port(AF_INET);
    assert_true(port > 0);
    rank_plan r0 = {.addr = "127.0.0.1", .port = port, .rank = 0, .size = 2, .timeout_s = 4,
                    .must_say = "says it is rank 3 of a job of 4 ranks; rank 0 has 2", .fail_within_s = 2};
    rank_plan stray = {.addr = "127.0.0.1", .port = port, .rank = 3, .size = 4, .timeout_s = 4,
                       .must_say = "rank 0 refused this process (rank 3 of 4)", .fail_within_s = 2};
    pid_t p0 = spawn_rank(&r0), p3 = spawn_rank(&stray);
    expect_done(p0, "rank 0");
    expect_done(p3, "the rank of the other job");
}

static void test_no_rank0(void **state) {
    (void)state;
    int port = free_port(AF_INET);
    assert_true(port > 0);
    unsigned char buf[PATTERN_BYTES] = {0};
    double t0 = qlm_now_s();
    assert_int_equal(qlm_rendezvous_broadcast("127.0.0.1", port, 1, 2, buf, sizeof buf, 0.5), -1);
    double took = qlm_now_s() - t0;
    char where[64];
    snprintf(where, sizeof where, "rank 1: rendezvous at 127.0.0.1:%d: could not reach rank 0", port);
    print_message("%s (%.2f s)\n", qlm_last_error(), took);
    assert_non_null(strstr(qlm_last_error(), where));
    assert_true(took >= 0.45 && took < 1.5);
}

static void test_bad_arguments(void **state) {
    (void)state;
    unsigned char buf[4] = {1, 2, 3, 4};
    assert_int_equal(qlm_rendezvous_broadcast("127.0.0.1", 1, 5, 4, buf, sizeof buf, 1), -1);
    assert_string_equal(qlm_last_error(), "rendezvous: rank 5 is not in 0..3");
    assert_int_equal(qlm_rendezvous_broadcast("127.0.0.1", 1, 4, 4, buf, sizeof buf, 1), -1);
    assert_string_equal(qlm_last_error(), "rendezvous: rank 4 is not in 0..3");
    assert_int_equal(qlm_rendezvous_broadcast("127.0.0.1", 1, -1, 4, buf, sizeof buf, 1), -1);
    assert_int_equal(qlm_rendezvous_broadcast("127.0.0.1", 1, 0, 0, buf, sizeof buf, 1), -1);
    assert_int_equal(qlm_rendezvous_broadcast("127.0.0.1", 0, 1, 2, buf, sizeof buf, 1), -1);
    assert_non_null(strstr(qlm_last_error(), "port 0 is not in 1..65535"));
    /* A job of one needs no network: nothing listens, nothing changes. */
    assert_int_equal(qlm_rendezvous_broadcast("127.0.0.1", 1, 0, 1, buf, sizeof buf, 1), 0);
    assert_int_equal(buf[0], 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks),         cmocka_unit_test(test_four_ranks),
        cmocka_unit_test(test_ipv6),              cmocka_unit_test(test_strangers_dropped),
        cmocka_unit_test(test_missing_rank),      cmocka_unit_test(test_duplicate_rank),
        cmocka_unit_test(test_other_job_size),    cmocka_unit_test(test_no_rank0),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
