/* The communicator over MPI with 1, 2 and 4 ranks (this program starts itself under mpirun):
 * every collective's values, sums in rank order bit for bit on every member, sub-groups,
 * overlap of a started operation with other work, and failures — a rank that hangs is named
 * by the others' timeout, a rank killed by SIGKILL ends the job within seconds. */
#include <signal.h>
#include <unistd.h>

#include "../dist/launch.h"
#include "dist_test_util.h"

static const char *g_self;

/* ---- the ranks' side: returns the number of failed checks ---- */

static int g_failed;

#define CHECK(cond, ...)                                                 \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "rank check failed (%s:%d): ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                \
            fprintf(stderr, "\n");                                       \
            g_failed++;                                                  \
        }                                                                \
    } while (0)

/* Member r's value i: magnitudes far apart, so a different order of the sum changes the bits. */
static float value(int r, size_t i) {
    static const float scale[] = {1e8f, 1.0f, -1e8f, 3.25f, 1e-3f, 7e7f, -2.5f, 0.1f};
    return scale[r % 8] * (1.0f + (float)(i % 97) / 64.0f) + (float)r * 1e-2f;
}

/* The sum over members 0..size-1 in rank order, as the communicator must compute it. */
static float rank_order_sum(int size, size_t i) {
    float s = value(0, i);
    for (int r = 1; r < size; r++) s += value(r, i);
    return s;
}

static void check_allgather(qlm_comm *c) {
    size_t off[65];
    /* Uneven parts, the last member's empty. */
    off[0] = 0;
    for (int r = 0; r < c->size; r++) off[r + 1] = off[r] + (r == c->size - 1 && c->size > 1 ? 0 : 1000 + 37 * (size_t)r);
    unsigned char *buf = calloc(off[c->size], 1);
    for (size_t i = off[c->rank]; i < off[c->rank + 1]; i++) buf[i] = (unsigned char)(c->rank * 31 + i);
    CHECK(qlm_comm_allgather(c, buf, off) == 0, "allgather: %s", qlm_last_error());
    int bad = 0;
    for (int r = 0; r < c->size; r++)
        for (size_t i = off[r]; i < off[r + 1]; i++) bad += buf[i] != (unsigned char)(r * 31 + i);
    CHECK(bad == 0, "allgather: %d bytes wrong", bad);
    free(buf);
}

static void check_reduce_scatter(qlm_comm *c) {
    size_t n = 10007, off[65];
    qlm_comm_even_offsets(off, c->size, n);
    float *in = malloc(n * sizeof *in), *out = malloc((off[c->rank + 1] - off[c->rank] + 1) * sizeof *out);
    for (size_t i = 0; i < n; i++) in[i] = value(c->rank, i);
    CHECK(qlm_comm_reduce_scatter(c, out, in, off, 0) == 0, "reduce-scatter: %s", qlm_last_error());
    int bad = 0;
    for (size_t i = off[c->rank]; i < off[c->rank + 1]; i++) {
        float want = rank_order_sum(c->size, i);
        bad += memcmp(&out[i - off[c->rank]], &want, sizeof want) != 0;
    }
    CHECK(bad == 0, "reduce-scatter: %d sums differ from the rank-order sum", bad);
    /* accumulate: out += the sum again */
    CHECK(qlm_comm_reduce_scatter(c, out, in, off, 1) == 0, "reduce-scatter +=: %s", qlm_last_error());
    bad = 0;
    for (size_t i = off[c->rank]; i < off[c->rank + 1]; i++) {
        float s = rank_order_sum(c->size, i), want = s + s;
        bad += memcmp(&out[i - off[c->rank]], &want, sizeof want) != 0;
    }
    CHECK(bad == 0, "reduce-scatter +=: %d values wrong", bad);
    /* in place: the output is the member's own part of the input */
    CHECK(qlm_comm_reduce_scatter(c, in + off[c->rank], in, off, 0) == 0, "in place: %s", qlm_last_error());
    bad = 0;
    for (size_t i = off[c->rank]; i < off[c->rank + 1]; i++) {
        float want = rank_order_sum(c->size, i);
        bad += memcmp(&in[i], &want, sizeof want) != 0;
    }
    CHECK(bad == 0, "reduce-scatter in place: %d values wrong", bad);
    free(in);
    free(out);
}

/* Every member ends with the same bits, the rank-order sums; the first element is a sum whose
 * bits depend on the order ((1e8 + 1) - 1e8 = 0 in F32, 1e8 + (1 - 1e8) would not be). */
static void check_allreduce(qlm_comm *c) {
    size_t n = 4099;
    float *buf = malloc(n * sizeof *buf);
    for (size_t i = 0; i < n; i++) buf[i] = value(c->rank, i);
    CHECK(qlm_comm_allreduce(c, buf, n) == 0, "allreduce: %s", qlm_last_error());
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = rank_order_sum(c->size, i);
        bad += memcmp(&buf[i], &want, sizeof want) != 0;
    }
    CHECK(bad == 0, "allreduce: %d of %zu values differ from the rank-order sum", bad, n);
    /* Fewer values than members: some members own nothing. */
    float few[2] = {(float)c->rank, 1.0f};
    CHECK(qlm_comm_allreduce(c, few, 2) == 0, "allreduce of 2: %s", qlm_last_error());
    CHECK(few[0] == (float)(c->size * (c->size - 1) / 2) && few[1] == (float)c->size, "allreduce of 2: %g %g",
          few[0], few[1]);
    free(buf);
}

static void check_broadcast_and_host(qlm_comm *c) {
    int root = c->size - 1;
    char msg[64] = "";
    if (c->rank == root) snprintf(msg, sizeof msg, "plan from %d", root);
    CHECK(qlm_comm_broadcast_host(c, msg, sizeof msg, root) == 0, "broadcast: %s", qlm_last_error());
    char want[64];
    snprintf(want, sizeof want, "plan from %d", root);
    CHECK(strcmp(msg, want) == 0, "broadcast gave '%s'", msg);
    double x[2] = {c->rank + 0.5, -(double)c->rank};
    CHECK(qlm_comm_sum_host(c, x, 2) == 0, "sum_host: %s", qlm_last_error());
    CHECK(x[0] == c->size * (c->size - 1) / 2.0 + 0.5 * c->size, "sum_host gave %g", x[0]);
    double m[1] = {(double)(c->rank * 7 % 5)};
    CHECK(qlm_comm_max_host(c, m, 1) == 0, "max_host: %s", qlm_last_error());
    double best = 0;
    for (int r = 0; r < c->size; r++) best = r * 7 % 5 > best ? r * 7 % 5 : best;
    CHECK(m[0] == best, "max_host gave %g, want %g", m[0], best);
    CHECK(qlm_comm_barrier(c) == 0, "barrier: %s", qlm_last_error());
}

/* Groups of members with equal rank % 2: sums over the group only, in the group's rank order. */
static void check_split(qlm_comm *c) {
    qlm_comm *g = qlm_comm_split(c, c->rank % 2, c->rank);
    CHECK(g != NULL, "split: %s", qlm_last_error());
    if (!g) return;
    CHECK(g->size == (c->size + 1 - c->rank % 2) / 2, "group of %d", g->size);
    CHECK(qlm_comm_world_rank(g, g->rank) == c->rank, "world rank %d", qlm_comm_world_rank(g, g->rank));
    float v[3] = {(float)c->rank, 1, 0};
    CHECK(qlm_comm_allreduce(g, v, 3) == 0, "group allreduce: %s", qlm_last_error());
    float want = 0;
    for (int r = c->rank % 2; r < c->size; r += 2) want += (float)r;
    CHECK(v[0] == want && v[1] == (float)g->size, "group sum %g (want %g), count %g", v[0], want, v[1]);
    qlm_comm_free(g);
}

/* Two operations in flight at once, completed in order, with work between start and wait. */
static void check_overlap(qlm_comm *c) {
    size_t n = 1 << 20, off[65];
    qlm_comm_even_offsets(off, c->size, n);
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) a[i] = b[i] = 0;
    for (size_t i = off[c->rank]; i < off[c->rank + 1]; i++) a[i] = (float)i, b[i] = -(float)i;
    for (int r = 0; r <= c->size; r++) off[r] *= sizeof(float);
    qlm_comm_op *oa = qlm_comm_start_allgather(c, a, off), *ob = qlm_comm_start_allgather(c, b, off);
    volatile double work = 0;
    for (int i = 0; i < 2000000; i++) work += i * 1e-9;
    (void)work;
    CHECK(qlm_comm_wait(oa) == 0 && qlm_comm_wait(ob) == 0, "overlapped all-gathers: %s", qlm_last_error());
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != (float)i || b[i] != -(float)i;
    CHECK(bad == 0, "overlapped all-gathers: %d values wrong", bad);
    free(a);
    free(b);
}

static int rank_main(const char *scenario) {
    qlm_launch l;
    if (qlm_launch_detect(&l) != 0) {
        fprintf(stderr, "launch: %s\n", qlm_last_error());
        return 1;
    }
    double timeout = strcmp(scenario, "hang") == 0 ? 2.0 : 60.0;
    qlm_comm *c = qlm_dist_world(&l, qlm_backend_cpu(), timeout);
    if (!c) {
        fprintf(stderr, "world: %s\n", qlm_last_error());
        return 1;
    }
    if (c->size != l.size || c->rank != l.rank) {
        fprintf(stderr, "rank %d of %d, launcher says %d of %d\n", c->rank, c->size, l.rank, l.size);
        return 1;
    }
    if (strcmp(scenario, "collectives") == 0) {
        check_allgather(c);
        check_reduce_scatter(c);
        check_allreduce(c);
        check_broadcast_and_host(c);
        check_split(c);
        check_overlap(c);
    } else {
        /* hang: the last rank stops answering; kill: it dies. The others wait in a barrier. */
        if (c->rank == c->size - 1) {
            if (strcmp(scenario, "kill") == 0) raise(SIGKILL);
            sleep(30);
        }
        if (qlm_comm_barrier(c) != 0) {
            fprintf(stderr, "qlm: %s\n", qlm_last_error());
            qlm_comm_abort(c, 3);
        }
    }
    fprintf(stderr, "rank %d: %d failed checks\n", c->rank, g_failed);
    qlm_comm_free(c);
    return g_failed ? 1 : 0;
}

/* ---- the cmocka side ---- */

static void run_collectives(int np) {
    char *out = NULL;
    int rc = test_mpirun(&out, NULL, np, "%s --rank collectives", g_self);
    if (rc != 0) print_message("%s\n", out);
    assert_int_equal(rc, 0);
    assert_null(strstr(out, "rank check failed"));
    free(out);
}

static void test_collectives_1(void **state) {
    (void)state;
    run_collectives(1);
}

static void test_collectives_2(void **state) {
    (void)state;
    run_collectives(2);
}

static void test_collectives_4(void **state) {
    (void)state;
    run_collectives(4);
}

/* Three ranks, the last failing as scenario says: the job ends non-zero within `within` seconds
 * and its output holds `says`. */
static void expect_job_end(const char *scenario, const char *says, double within) {
    char *out = NULL;
    double secs = 0;
    int rc = test_mpirun(&out, &secs, 3, "%s --rank %s", g_self, scenario);
    print_message("%s: exit %d after %.1f s\n", scenario, rc, secs);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, says));
    assert_true(secs < within);
    free(out);
}

/* A rank that hangs: the others' deadline (2 s here) passes and they end the job, naming it. */
static void test_hung_rank_is_named(void **state) {
    (void)state;
    expect_job_end("hang", "no data from rank 2", 25);
}

/* A rank killed by SIGKILL: the job ends within seconds with a message naming it. */
static void test_killed_rank_ends_job(void **state) {
    (void)state;
    expect_job_end("kill", "rank 2", 30);
}

/* The launchers' variables: MPICH's PMI names the local rank itself; Slurm's srun (PMI-2) leaves it
 * to SLURM_LOCALID, which must be read, or every rank of a machine takes its first GPU. */
static void test_launch_local_rank(void **state) {
    (void)state;
    static const char *const vars[] = {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_LOCALID",
                                       "SLURM_NTASKS_PER_NODE"};
    qlm_launch l;
    setenv("PMI_RANK", "3", 1), setenv("PMI_SIZE", "4", 1);
    setenv("SLURM_LOCALID", "1", 1), setenv("SLURM_NTASKS_PER_NODE", "2", 1);
    assert_int_equal(qlm_launch_detect(&l), 0);
    assert_int_equal(l.kind, QLM_LAUNCH_MPI);
    assert_true(l.rank == 3 && l.size == 4 && l.local_rank == 1 && l.local_size == 2);
    setenv("MPI_LOCALRANKID", "0", 1), setenv("MPI_LOCALNRANKS", "4", 1);
    assert_int_equal(qlm_launch_detect(&l), 0);
    assert_true(l.local_rank == 0 && l.local_size == 4);
    unsetenv("MPI_LOCALRANKID"), unsetenv("MPI_LOCALNRANKS");
    setenv("SLURM_LOCALID", "x", 1);
    assert_int_equal(qlm_launch_detect(&l), -1);
    assert_non_null(strstr(qlm_last_error(), "SLURM_LOCALID=x"));
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

/* torchrun's workers: its agent's store holds MASTER_PORT, so the rendezvous listens on the next. */
static void test_launch_torchrun_port(void **state) {
    (void)state;
    static const char *const vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                       "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"};
    qlm_launch l;
    setenv("RANK", "1", 1), setenv("WORLD_SIZE", "2", 1), setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1), setenv("MASTER_ADDR", "127.0.0.1", 1), setenv("MASTER_PORT", "29500", 1);
    assert_int_equal(qlm_launch_detect(&l), 0);
    assert_true(l.kind == QLM_LAUNCH_ENV && l.master_port == 29500 && l.local_rank == 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    assert_int_equal(qlm_launch_detect(&l), 0);
    assert_int_equal(l.master_port, 29501);
    setenv("MASTER_PORT", "65535", 1);
    assert_int_equal(qlm_launch_detect(&l), -1);
    assert_non_null(strstr(qlm_last_error(), "torchrun's store"));
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) unsetenv(vars[i]);
}

int main(int argc, char **argv) {
    g_self = argv[0];
    if (argc == 3 && strcmp(argv[1], "--rank") == 0) return rank_main(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives_1),      cmocka_unit_test(test_collectives_2),
        cmocka_unit_test(test_collectives_4),      cmocka_unit_test(test_hung_rank_is_named),
        cmocka_unit_test(test_killed_rank_ends_job), cmocka_unit_test(test_launch_local_rank),
        cmocka_unit_test(test_launch_torchrun_port),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
