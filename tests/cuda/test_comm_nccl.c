/* The NCCL transport (cuda/transport_nccl.cu) and the collectives over it (dist/comm.c), on device
 * buffers of the CUDA backend. Alone: an NCCL world of one — a transfer to itself queued behind
 * compute not yet launched, empty transfers, a split — and the collectives of a group of one over
 * it. Under `mpirun -np K` on a machine with K GPUs, also the job's communicator: every collective
 * against the host's sums in rank order, bit for bit, host sums, and a split. Skipped without a
 * GPU. */
#include <math.h>

#include "../../dist/launch.h"
#include "../test_util.h"

static const qlm_backend *gpu;
static char g_no_gpu[256];
static qlm_launch g_launch;
static qlm_comm *g_world; /* the job's communicator when mpirun started several ranks */

#define REQUIRE_GPU()                                          \
    do {                                                       \
        if (!gpu) {                                            \
            print_message("no GPU, skipping: %s\n", g_no_gpu); \
            skip();                                            \
        }                                                      \
    } while (0)

#define REQUIRE_JOB()                                                                      \
    do {                                                                                   \
        REQUIRE_GPU();                                                                     \
        if (!g_world) {                                                                    \
            print_message("one rank: the job's collectives need `mpirun -np K`, skipping\n"); \
            skip();                                                                        \
        }                                                                                  \
    } while (0)

/* Floats of many magnitudes, different for every rank, so that the order of a sum shows in its bits. */
static float value(int rank, size_t i) {
    unsigned h = (unsigned)i * 2654435761u ^ (unsigned)(rank + 1) * 0x9E3779B9u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return ldexpf((float)(h & 0xFFFFFF) / 16777216.0f - 0.5f, (int)(h >> 24) % 24 - 12);
}

static void *upload(const void *host, size_t bytes) {
    void *d = gpu->alloc(bytes);
    assert_non_null(d);
    gpu->to_device(d, host, bytes);
    return d;
}

static void *download(const void *dev, size_t bytes) {
    void *h = malloc(bytes);
    assert_non_null(h);
    gpu->to_host(h, dev, bytes);
    return h;
}

/* An NCCL world of this process alone (it keeps the launch's local rank, hence its GPU). */
static qlm_transport *world_of_one(double timeout_s) {
    qlm_launch one = g_launch;
    one.kind = QLM_LAUNCH_SINGLE, one.rank = 0, one.size = 1;
    qlm_transport *tp = qlm_transport_nccl_world(&one, NULL, timeout_s);
    if (!tp) fail_msg("qlm_transport_nccl_world: %s", qlm_last_error());
    assert_string_equal(tp->name, "nccl");
    assert_int_equal(tp->rank, 0);
    assert_int_equal(tp->size, 1);
    assert_int_equal(tp->world[0], 0);
    return tp;
}

/* src, scaled by 2 by an op still queued when the transfer starts, goes to dst; an op queued after
 * the wait reads what arrived. Then empty transfers (a barrier's). */
static void test_transfer_to_self(void **state) {
    (void)state;
    REQUIRE_GPU();
    qlm_transport *tp = world_of_one(30);
    const long n = 1 << 20;
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    for (long i = 0; i < n; i++) x[i] = value(0, (size_t)i);
    float *src = upload(x, (size_t)n * sizeof *x), *dst = gpu->alloc((size_t)n * sizeof *x);
    assert_non_null(dst);
    gpu->zero(dst, n);
    gpu->scale(src, n, 2.0f);
    qlm_xfer s = {0, src, (size_t)n * sizeof *x}, r = {0, dst, (size_t)n * sizeof *x};
    void *op = NULL;
    assert_int_equal(tp->start(tp, &s, 1, &r, 1, &op), 0);
    assert_int_equal(tp->wait(tp, op, 30), 0);
    gpu->add(dst, src, n);
    float *got = download(dst, (size_t)n * sizeof *x);
    for (long i = 0; i < n; i++)
        if (got[i] != 4.0f * x[i]) fail_msg("element %ld: %g, want %g", i, (double)got[i], 4.0 * x[i]);
    qlm_xfer empty = {0, NULL, 0};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(tp->start(tp, &empty, 1, &empty, 1, &op), 0);
        assert_int_equal(tp->wait(tp, op, 30), 0);
    }
    free(x), free(got);
    gpu->free(src), gpu->free(dst);
    tp->close(tp);
}

static void test_split_of_one(void **state) {
    (void)state;
    REQUIRE_GPU();
    qlm_transport *tp = world_of_one(30);
    qlm_transport *sub = tp->split(tp, 3, 7);
    if (!sub) fail_msg("split: %s", qlm_last_error());
    assert_int_equal(sub->rank, 0);
    assert_int_equal(sub->size, 1);
    assert_int_equal(sub->world[0], 0);
    unsigned char bytes[64];
    for (int i = 0; i < 64; i++) bytes[i] = (unsigned char)(i * 5 + 1);
    void *src = upload(bytes, sizeof bytes), *dst = gpu->alloc(sizeof bytes), *op = NULL;
    assert_non_null(dst);
    qlm_xfer s = {0, src, sizeof bytes}, r = {0, dst, sizeof bytes};
    assert_int_equal(sub->start(sub, &s, 1, &r, 1, &op), 0);
    assert_int_equal(sub->wait(sub, op, 30), 0);
    unsigned char *got = download(dst, sizeof bytes);
    assert_memory_equal(got, bytes, sizeof bytes);
    free(got);
    gpu->free(src), gpu->free(dst);
    assert_null(tp->split(tp, -1, 0));
    print_message("%s\n", qlm_last_error());
    sub->close(sub);
    tp->close(tp);
}

/* A group of one with an NCCL transport: every collective leaves the member's own data. */
static void test_collectives_of_one(void **state) {
    (void)state;
    REQUIRE_GPU();
    qlm_comm *c = qlm_comm_new(world_of_one(30), gpu, 30);
    assert_non_null(c);
    enum { N = 1000 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = value(0, (size_t)i), y[i] = value(1, (size_t)i);
    float *buf = upload(x, sizeof x), *out = upload(y, sizeof y);
    size_t off[2] = {0, N};
    assert_int_equal(qlm_comm_allgather(c, buf, (size_t[]){0, sizeof x}), 0);
    assert_int_equal(qlm_comm_allreduce(c, buf, N), 0);
    assert_int_equal(qlm_comm_broadcast(c, buf, sizeof x, 0), 0);
    assert_int_equal(qlm_comm_barrier(c), 0);
    float *got = download(buf, sizeof x);
    assert_memory_equal(got, x, sizeof x);
    free(got);
    assert_int_equal(qlm_comm_reduce_scatter(c, out, buf, off, 1), 0);
    got = download(out, sizeof y);
    for (int i = 0; i < N; i++) assert_true(got[i] == y[i] + x[i]);
    free(got);
    assert_int_equal(qlm_comm_reduce_scatter(c, out, buf, off, 0), 0);
    got = download(out, sizeof y);
    assert_memory_equal(got, x, sizeof x);
    free(got);
    double h[2] = {1.5, -2.0};
    assert_int_equal(qlm_comm_sum_host(c, h, 2), 0);
    assert_true(h[0] == 1.5 && h[1] == -2.0);
    gpu->free(buf), gpu->free(out);
    qlm_comm_free(c);
}

/* ---- the job's communicator (mpirun -np K, K GPUs) ---- */

/* Uneven parts, member 1's empty: all-gather in place, every byte checked. */
static void test_job_allgather(void **state) {
    (void)state;
    REQUIRE_JOB();
    int n = g_world->size, me = g_world->rank;
    size_t *off = calloc((size_t)n + 1, sizeof *off);
    assert_non_null(off);
    for (int r = 0; r < n; r++) off[r + 1] = off[r] + (r == 1 ? 0 : 1000 + 37 * (size_t)r);
    unsigned char *host = calloc(off[n], 1);
    assert_non_null(host);
    for (size_t i = off[me]; i < off[me + 1]; i++) host[i] = (unsigned char)(me * 13 + i);
    void *buf = upload(host, off[n]);
    assert_int_equal(qlm_comm_allgather(g_world, buf, off), 0);
    unsigned char *got = download(buf, off[n]);
    for (int r = 0; r < n; r++)
        for (size_t i = off[r]; i < off[r + 1]; i++)
            if (got[i] != (unsigned char)(r * 13 + i)) fail_msg("byte %zu (rank %d's part): %d", i, r, got[i]);
    free(off), free(host), free(got);
    gpu->free(buf);
}

/* The sum over members in rank order of value(q, i), in floats as the host adds them. */
static float rank_order_sum(int n, size_t i) {
    float s = value(0, i);
    for (int q = 1; q < n; q++) s += value(q, i);
    return s;
}

static void test_job_reduce_scatter(void **state) {
    (void)state;
    REQUIRE_JOB();
    int n = g_world->size, me = g_world->rank;
    const size_t len = 10007;
    size_t *off = calloc((size_t)n + 1, sizeof *off);
    float *in = malloc(len * sizeof *in), *base = malloc(len * sizeof *base), *want = malloc(len * sizeof *want);
    assert_true(off && in && base && want);
    qlm_comm_even_offsets(off, n, len);
    size_t own = off[me + 1] - off[me];
    assert_true(own > 0);
    for (size_t i = 0; i < len; i++) in[i] = value(me, i);
    for (size_t i = 0; i < own; i++) base[i] = value(1000 + me, i);
    float *d_in = upload(in, len * sizeof *in), *d_out = upload(base, own * sizeof *base);
    for (int accumulate = 1; accumulate >= 0; accumulate--) {
        assert_int_equal(qlm_comm_reduce_scatter(g_world, d_out, d_in, off, accumulate), 0);
        float *got = download(d_out, own * sizeof *got);
        for (size_t i = 0; i < own; i++) {
            float sum = rank_order_sum(n, off[me] + i);
            want[i] = accumulate ? base[i] + sum : sum;
        }
        assert_memory_equal(got, want, own * sizeof *want);
        free(got);
    }
    free(off), free(in), free(base), free(want);
    gpu->free(d_in), gpu->free(d_out);
}

static void test_job_allreduce(void **state) {
    (void)state;
    REQUIRE_JOB();
    int n = g_world->size, me = g_world->rank;
    const size_t len = 100003;
    float *x = malloc(len * sizeof *x), *want = malloc(len * sizeof *want);
    assert_true(x && want);
    for (size_t i = 0; i < len; i++) x[i] = value(me, i), want[i] = rank_order_sum(n, i);
    float *buf = upload(x, len * sizeof *x);
    assert_int_equal(qlm_comm_allreduce(g_world, buf, len), 0);
    float *got = download(buf, len * sizeof *got);
    assert_memory_equal(got, want, len * sizeof *want);
    free(x), free(want), free(got);
    gpu->free(buf);
}

static void test_job_broadcast_and_barrier(void **state) {
    (void)state;
    REQUIRE_JOB();
    int n = g_world->size, me = g_world->rank, root = n - 1;
    const size_t len = 12345;
    unsigned char *host = malloc(len), *want = malloc(len);
    assert_true(host && want);
    for (size_t i = 0; i < len; i++) host[i] = (unsigned char)(me * 7 + i), want[i] = (unsigned char)(root * 7 + i);
    void *buf = upload(host, len);
    assert_int_equal(qlm_comm_broadcast(g_world, buf, len, root), 0);
    unsigned char *got = download(buf, len);
    assert_memory_equal(got, want, len);
    for (int k = 0; k < 3; k++) assert_int_equal(qlm_comm_barrier(g_world), 0);
    free(host), free(want), free(got);
    gpu->free(buf);
}

static void test_job_host_values(void **state) {
    (void)state;
    REQUIRE_JOB();
    int n = g_world->size, me = g_world->rank;
    double x[2] = {0.1 * (me + 1), -me}, want[2] = {0, 0};
    for (int q = 0; q < n; q++) want[0] += 0.1 * (q + 1), want[1] -= q;
    assert_int_equal(qlm_comm_sum_host(g_world, x, 2), 0);
    assert_true(x[0] == want[0] && x[1] == want[1]);
    double m[1] = {me == 1 ? 5.0 : (double)me};
    assert_int_equal(qlm_comm_max_host(g_world, m, 1), 0);
    assert_true(m[0] == fmax(5.0, n - 1));
    char plan[32];
    snprintf(plan, sizeof plan, "plan of rank %d", me);
    assert_int_equal(qlm_comm_broadcast_host(g_world, plan, sizeof plan, 0), 0);
    assert_string_equal(plan, "plan of rank 0");
}

/* Even and odd ranks, each group in reverse rank order; an all-reduce within each. */
static void test_job_split(void **state) {
    (void)state;
    REQUIRE_JOB();
    int n = g_world->size, me = g_world->rank;
    qlm_comm *half = qlm_comm_split(g_world, me % 2, n - me);
    if (!half) fail_msg("split: %s", qlm_last_error());
    int members[64] = {0}, count = 0;
    for (int q = n - 1; q >= 0; q--)
        if (q % 2 == me % 2 && count < 64) members[count++] = q;
    assert_int_equal(half->size, count);
    assert_int_equal(members[half->rank], me);
    for (int i = 0; i < count && count > 1; i++) assert_int_equal(qlm_comm_world_rank(half, i), members[i]);
    const size_t len = 4099;
    float *x = malloc(len * sizeof *x), *want = malloc(len * sizeof *want);
    assert_true(x && want);
    for (size_t i = 0; i < len; i++) {
        x[i] = value(me, i);
        want[i] = value(members[0], i);
        for (int k = 1; k < count; k++) want[i] += value(members[k], i);
    }
    float *buf = upload(x, len * sizeof *x);
    assert_int_equal(qlm_comm_allreduce(half, buf, len), 0);
    float *got = download(buf, len * sizeof *got);
    assert_memory_equal(got, want, len * sizeof *want);
    free(x), free(want), free(got);
    gpu->free(buf);
    qlm_comm_free(half);
}

static int setup(void **state) {
    (void)state;
    if (qlm_launch_detect(&g_launch) != 0) {
        fprintf(stderr, "launch: %s\n", qlm_last_error());
        return -1;
    }
    gpu = qlm_backend_cuda();
    if (!gpu) {
        snprintf(g_no_gpu, sizeof g_no_gpu, "%s", qlm_last_error());
        return 0;
    }
    char line[256];
    gpu->describe(line, sizeof line);
    printf("rank %d of %d: %s\n", g_launch.rank, g_launch.size, line);
    if (g_launch.size == 1) return 0;
    g_world = qlm_dist_world(&g_launch, gpu, 60);
    if (!g_world) fprintf(stderr, "rank %d: the job's communicator: %s\n", g_launch.rank, qlm_last_error());
    return g_world ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    qlm_comm_free(g_world);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transfer_to_self),  cmocka_unit_test(test_split_of_one),
        cmocka_unit_test(test_collectives_of_one), cmocka_unit_test(test_job_allgather),
        cmocka_unit_test(test_job_reduce_scatter), cmocka_unit_test(test_job_allreduce),
        cmocka_unit_test(test_job_broadcast_and_barrier), cmocka_unit_test(test_job_host_values),
        cmocka_unit_test(test_job_split),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
