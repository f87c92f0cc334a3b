/* The CUDA training ops (all but attention_backward, tested on its own) against the CPU backend's,
 * which tests/test_train*.c check against torch, on random inputs. Outputs an op overwrites start
 * as NaN, so an element it leaves unwritten fails; outputs that accumulate start random. F32
 * results agree within 1e-5 of the largest value (sums in another order, libm's and CUDA's
 * exp/tanh/erf a few ulp apart); ops whose every value is computed in the CPU's order and rounding
 * (dropout, adamw, store_weight, embedding_backward, the bias gradient) agree bit for bit. Index
 * arrays of up to QLM_CUDA_SMALL values and longer ones take different paths only with
 * QLM_CUDA_GRAPHS=0 (graphs stage them all). Built and run by `make test-cuda` only: it needs a
 * GPU. */
#include <math.h>

#include "../../quant/half.h"
#include "gpu_test_util.h"

/* The device's bytes against want, bit for bit. */
static void check_same(const char *what, const void *dev, const void *want, size_t bytes) {
    void *got = malloc(bytes);
    assert_non_null(got);
    gpu->to_host(got, dev, bytes);
    print_message("%-52s %s\n", what, memcmp(got, want, bytes) == 0 ? "same bits" : "DIFFERENT");
    assert_memory_equal(got, want, bytes);
    free(got);
}

/* A second run's n floats (again) against the first's (first), both on the device, bit for bit. */
static void check_repeats(const char *what, const float *again, const float *first, long n) {
    float *want = from_gpu(first, n);
    check_same(what, again, want, (size_t)n * sizeof *want);
    free(want);
}

/* Every weight form, with more rows than one widened block (4096) so the blocks' sums chain, more
 * values of dy than one split into BF16 planes takes (2^24: BF16 and INT8 weights, whose dy goes in
 * runs of rows), and accumulate 0 (dx NaN on the GPU) and 1. */
static void test_matmul_backward_x(void **state) {
    (void)state;
    const struct {
        qlm_dtype dt;
        int pc;
    } kinds[] = {{QLM_F32, 0}, {QLM_F16, 0}, {QLM_BF16, 0}, {QLM_I8, 0}, {QLM_I8, 1}};
    const int shapes[][3] = {{37, 64, 5}, {4100, 96, 9}, {4100, 4, 4097}}; /* rows, cols, n */
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int acc = 0; acc < 2; acc++) {
                const int rows = shapes[s][0], cols = shapes[s][1], n = shapes[s][2];
                test_weight t;
                make_weight(&t, kinds[k].dt, kinds[k].pc, rows, cols, (unsigned)(rows + cols));
                float *dy = randv((long)n * rows, 3u + (unsigned)s, 1.0f), *want = randv((long)n * cols, 4u, 1.0f);
                float *ddy = to_gpu(dy, (size_t)n * rows * sizeof *dy);
                float *ddx = acc ? to_gpu(want, (size_t)n * cols * sizeof *want) : nan_gpu((long)n * cols);
                if (!acc) memset(want, 0, (size_t)n * cols * sizeof *want);
                assert_int_equal(cpu->matmul_backward_x(want, dy, n, &t.host, acc), 0);
                assert_int_equal(gpu->matmul_backward_x(ddx, ddy, n, &t.dev, acc), 0);
                char what[96];
                snprintf(what, sizeof what, "matmul_backward_x %s%s %4d x %2d, %4d rows, accumulate %d",
                         qlm_dtype_name(kinds[k].dt), kinds[k].pc ? "-pc" : "", rows, cols, n, acc);
                check_close(what, ddx, want, (long)n * cols, 1e-5);
                free(dy), free(want);
                free_weight(&t);
                gpu->free(ddy), gpu->free(ddx);
            }
}

/* A finite dy above BF16's largest finite value (it rounds to Inf in BF16) against BF16 weights:
 * dx is finite and the CPU's, not NaN (the split into BF16 planes keeps such a value finite). */
static void test_matmul_backward_x_huge_dy(void **state) {
    (void)state;
    const int rows = 8, cols = 16, n = 2;
    test_weight t;
    make_weight(&t, QLM_BF16, 0, rows, cols, 11u);
    float *dy = randv((long)n * rows, 12u, 1.0f), *want = calloc((size_t)n * cols, sizeof *want);
    assert_non_null(want);
    dy[3] = 3.3999e38f, dy[rows + 5] = -3.4e38f;
    float *ddy = to_gpu(dy, (size_t)n * rows * sizeof *dy), *ddx = nan_gpu((long)n * cols);
    assert_int_equal(cpu->matmul_backward_x(want, dy, n, &t.host, 0), 0);
    assert_int_equal(gpu->matmul_backward_x(ddx, ddy, n, &t.dev, 0), 0);
    for (long i = 0; i < (long)n * cols; i++) assert_true(isfinite(want[i]));
    check_close("matmul_backward_x bf16, |dy| 3.4e38", ddx, want, (long)n * cols, 1e-5);
    free(dy), free(want);
    free_weight(&t);
    gpu->free(ddy), gpu->free(ddx);
}

/* Copies of n values, rounded to BF16 (inputs QLM_BF16) or as they are. */
static float *inputs_as(const float *v, long n, qlm_dtype inputs) {
    float *out = malloc((size_t)n * sizeof *out);
    assert_non_null(out);
    for (long i = 0; i < n; i++) out[i] = inputs == QLM_BF16 ? qlm_bf16_to_f32(qlm_f32_to_bf16(v[i])) : v[i];
    return out;
}

/* dw0 + dy^T x in double, dy and x rounded to BF16 first (inputs QLM_BF16) or not. */
static float *reference_dw(const float *dw0, const float *dy, const float *x, int n, int rows, int cols,
                           qlm_dtype inputs) {
    float *want = malloc((size_t)rows * cols * sizeof *want);
    float *a = inputs_as(dy, (long)n * rows, inputs), *b = inputs_as(x, (long)n * cols, inputs);
    assert_non_null(want);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            double sum = dw0[(size_t)r * cols + c];
            for (int i = 0; i < n; i++) sum += (double)a[(size_t)i * rows + r] * b[(size_t)i * cols + c];
            want[(size_t)r * cols + c] = (float)sum;
        }
    free(a), free(b);
    return want;
}

/* dw and db accumulate; db's column sums run in the CPU's order. Both backends against a
 * reference in double, F32 inputs and BF16-rounded ones (whose dw must differ from the F32 one:
 * the rounding happened); the last shape has more values of dy and x than either rounds at a time
 * (8M on the CPU, 16M on the GPU), with a bias only (the host emulation takes minutes on it). */
static void test_matmul_backward_w(void **state) {
    (void)state;
    const int shapes[][3] = {{70, 130, 33}, {300, 257, 100}, {4096, 1, 4100}}; /* rows, cols, n */
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    const qlm_dtype inputs[] = {QLM_F32, QLM_BF16};
    for (size_t s = 0; s < n_shapes; s++)
        for (int with_db = s == n_shapes - 1; with_db < 2; with_db++) {
            const int rows = shapes[s][0], cols = shapes[s][1], n = shapes[s][2];
            float *dy = randv((long)n * rows, 5u, 1.0f), *x = randv((long)n * cols, 6u, 2.0f);
            float *dw0 = randv((long)rows * cols, 7u, 1.0f), *f32_dw = NULL;
            for (size_t k = 0; k < 2; k++) {
                float *dw = malloc((size_t)rows * cols * sizeof *dw), *db = randv(rows, 8u, 1.0f);
                assert_non_null(dw);
                memcpy(dw, dw0, (size_t)rows * cols * sizeof *dw);
                float *ddy = to_gpu(dy, (size_t)n * rows * sizeof *dy), *dx = to_gpu(x, (size_t)n * cols * sizeof *x);
                float *ddw = to_gpu(dw, (size_t)rows * cols * sizeof *dw), *ddb = to_gpu(db, (size_t)rows * sizeof *db);
                float *want = reference_dw(dw0, dy, x, n, rows, cols, inputs[k]);
                assert_int_equal(cpu->matmul_backward_w(dw, with_db ? db : NULL, dy, x, n, rows, cols, inputs[k]), 0);
                assert_int_equal(gpu->matmul_backward_w(ddw, with_db ? ddb : NULL, ddy, dx, n, rows, cols, inputs[k]), 0);
                char label[80], what[96];
                snprintf(label, sizeof label, "matmul_backward_w %4d x %3d, %4d rows, %s%s", rows, cols, n,
                         qlm_dtype_name(inputs[k]), with_db ? " + bias" : "");
                double d = rel_diff(dw, want, (long)rows * cols);
                snprintf(what, sizeof what, "%s: cpu", label);
                print_message("%-52s %.2e\n", what, d);
                assert_true(d <= 1e-5);
                snprintf(what, sizeof what, "%s: dw", label);
                check_close(what, ddw, dw, (long)rows * cols, 1e-5);
                snprintf(what, sizeof what, "%s: db", label);
                check_same(what, ddb, db, (size_t)rows * sizeof *db); /* untouched without a bias */
                if (inputs[k] == QLM_F32) {
                    f32_dw = dw;
                } else {
                    d = rel_diff(dw, f32_dw, (long)rows * cols);
                    print_message("%-52s %.2e\n", "  bf16 inputs against f32 ones", d);
                    assert_true(d > 1e-4);
                    free(dw), free(f32_dw);
                }
                free(want), free(db);
                gpu->free(ddy), gpu->free(dx), gpu->free(ddw), gpu->free(ddb);
            }
            free(dy), free(x), free(dw0);
        }
}

/* With more rows than the kernel's blocks (512), each block takes several rows; dweight's sum
 * repeats bit for bit. */
static void test_rmsnorm_backward(void **state) {
    (void)state;
    const int shapes[][2] = {{37, 300}, {700, 1000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int with_dw = 0; with_dw < 2; with_dw++) {
            const int n = shapes[s][0], dim = shapes[s][1];
            const long len = (long)n * dim;
            float *x = randv(len, 10u, 2.0f), *g = randv(len, 11u, 1.0f), *w = randv(dim, 12u, 1.0f);
            float *dx = randv(len, 13u, 1.0f), *dw = randv(dim, 14u, 1.0f);
            float *d_x = to_gpu(x, (size_t)len * sizeof *x), *d_g = to_gpu(g, (size_t)len * sizeof *g);
            float *d_w = to_gpu(w, (size_t)dim * sizeof *w);
            float *d_dx = to_gpu(dx, (size_t)len * sizeof *dx), *d_dw = to_gpu(dw, (size_t)dim * sizeof *dw);
            float *d_dw2 = to_gpu(dw, (size_t)dim * sizeof *dw), *d_dx2 = to_gpu(dx, (size_t)len * sizeof *dx);
            cpu->rmsnorm_backward(dx, with_dw ? dw : NULL, g, x, w, n, dim, 1e-5f);
            gpu->rmsnorm_backward(d_dx, with_dw ? d_dw : NULL, d_g, d_x, d_w, n, dim, 1e-5f);
            gpu->rmsnorm_backward(d_dx2, with_dw ? d_dw2 : NULL, d_g, d_x, d_w, n, dim, 1e-5f);
            char what[96];
            snprintf(what, sizeof what, "rmsnorm_backward %3d x %4d%s: dx", n, dim, with_dw ? " + dweight" : "");
            check_close(what, d_dx, dx, len, 1e-5);
            snprintf(what, sizeof what, "rmsnorm_backward %3d x %4d%s: dweight", n, dim, with_dw ? " + dweight" : "");
            check_close(what, d_dw, dw, dim, 1e-5);
            check_repeats("rmsnorm_backward: a second run's dweight", d_dw2, d_dw, dim);
            check_repeats("rmsnorm_backward: a second run's dx", d_dx2, d_dx, len);
            free(x), free(g), free(w), free(dx), free(dw);
            gpu->free(d_x), gpu->free(d_g), gpu->free(d_w), gpu->free(d_dx), gpu->free(d_dw), gpu->free(d_dw2);
            gpu->free(d_dx2);
        }
}

/* Against the CPU, and rope then rope_backward on the GPU gives the input back. */
static void test_rope_backward(void **state) {
    (void)state;
    const int heads = 6, kv_heads = 2, hd = 50;
    float *inv = randv(hd / 2, 20u, 0.5f);
    for (int j = 0; j < hd / 2; j++) inv[j] = fabsf(inv[j]);
    float *d_inv = to_gpu(inv, (size_t)hd / 2 * sizeof *inv);
    for (int n = 5; n <= 100; n += 95) { /* 100: more than QLM_CUDA_SMALL positions */
        int *pos = malloc((size_t)n * sizeof *pos);
        for (int i = 0; i < n; i++) pos[i] = (i * 97) % 2048;
        const long lq = (long)n * heads * hd, lk = (long)n * kv_heads * hd;
        float *q = randv(lq, 21u, 1.0f), *k = randv(lk, 22u, 1.0f), *q0 = copyv(q, lq), *k0 = copyv(k, lk);
        float *dq = to_gpu(q, (size_t)lq * sizeof *q), *dk = to_gpu(k, (size_t)lk * sizeof *k);
        cpu->rope_backward(q, k, n, pos, heads, kv_heads, hd, inv);
        gpu->rope_backward(dq, dk, n, pos, heads, kv_heads, hd, d_inv);
        char what[96];
        snprintf(what, sizeof what, "rope_backward, %3d rows: dq", n);
        check_close(what, dq, q, lq, 1e-5);
        snprintf(what, sizeof what, "rope_backward, %3d rows: dk", n);
        check_close(what, dk, k, lk, 1e-5);
        gpu->rope(dq, dk, n, pos, heads, kv_heads, hd, d_inv);
        snprintf(what, sizeof what, "rope after rope_backward, %3d rows: q", n);
        check_close(what, dq, q0, lq, 1e-5);
        snprintf(what, sizeof what, "rope after rope_backward, %3d rows: k", n);
        check_close(what, dk, k0, lk, 1e-5);
        free(pos), free(q), free(k), free(q0), free(k0);
        gpu->free(dq), gpu->free(dk);
    }
    free(inv);
    gpu->free(d_inv);
}

/* Every activation; activate_backward in place over dout. */
static void test_act_backward(void **state) {
    (void)state;
    static const char *names[] = {"silu", "gelu_tanh", "relu", "gelu"};
    const long m = 5000;
    float *gate = randv(m, 30u, 6.0f), *up = randv(m, 31u, 1.0f), *dout = randv(m, 32u, 1.0f);
    float *d_gate = to_gpu(gate, m * sizeof *gate), *d_up = to_gpu(up, m * sizeof *up);
    float *d_dout = to_gpu(dout, m * sizeof *dout);
    float *dg = malloc(m * sizeof *dg), *du = malloc(m * sizeof *du);
    for (int a = QLM_ACT_SILU; a <= QLM_ACT_GELU; a++) {
        float *d_dg = nan_gpu(m), *d_du = nan_gpu(m), *d_dx = to_gpu(dout, m * sizeof *dout);
        cpu->glu_backward(dg, du, dout, gate, up, m, (qlm_act)a);
        gpu->glu_backward(d_dg, d_du, d_dout, d_gate, d_up, m, (qlm_act)a);
        char what[96];
        snprintf(what, sizeof what, "glu_backward %s: dgate", names[a]);
        check_close(what, d_dg, dg, m, 1e-5);
        snprintf(what, sizeof what, "glu_backward %s: dup", names[a]);
        check_close(what, d_du, du, m, 1e-5);
        cpu->activate_backward(dg, dout, gate, m, (qlm_act)a);
        gpu->activate_backward(d_dx, d_dx, d_gate, m, (qlm_act)a);
        snprintf(what, sizeof what, "activate_backward %s, in place", names[a]);
        check_close(what, d_dx, dg, m, 1e-5);
        gpu->free(d_dg), gpu->free(d_du), gpu->free(d_dx);
    }
    free(gate), free(up), free(dout), free(dg), free(du);
    gpu->free(d_gate), gpu->free(d_up), gpu->free(d_dout);
}

/* Repeated ids, few and more than QLM_CUDA_SMALL: each table row adds its rows in order, as the
 * CPU does. */
static void test_embedding_backward(void **state) {
    (void)state;
    const int vocab = 50, dim = 48;
    for (int n = 5; n <= 300; n += 295) {
        int *ids = malloc((size_t)n * sizeof *ids);
        for (int i = 0; i < n; i++) ids[i] = (i * 7 + i / 3) % (n < vocab ? 3 : vocab);
        float *table = randv((long)vocab * dim, 40u, 1.0f), *dout = randv((long)n * dim, 41u, 1.0f);
        float *d_table = to_gpu(table, (size_t)vocab * dim * sizeof *table);
        float *d_dout = to_gpu(dout, (size_t)n * dim * sizeof *dout);
        cpu->embedding_backward(table, dout, ids, n, dim);
        gpu->embedding_backward(d_table, d_dout, ids, n, dim);
        char what[96];
        snprintf(what, sizeof what, "embedding_backward, %3d rows", n);
        check_same(what, d_table, table, (size_t)vocab * dim * sizeof *table);
        free(ids), free(table), free(dout);
        gpu->free(d_table), gpu->free(d_dout);
    }
}

/* Token targets and a teacher's distribution, with and without a soft cap, rows without a target
 * (-1) among them; a second run repeats the first bit for bit. */
static void check_cross_entropy(int n, int vocab, int with_teacher, float softcap) {
    const long len = (long)n * vocab;
    const float amp = softcap > 0 ? 3 * softcap : 8.0f; /* capped logits reach well into the cap */
    int *targets = malloc((size_t)n * sizeof *targets);
    for (int i = 0; i < n; i++) targets[i] = i % 4 == 2 ? -1 : (i * 37 + 11) % vocab;
    float *logits = randv(len, 50u + (unsigned)n, amp), *teacher = randv(len, 51u, amp), *loss = malloc((size_t)n * sizeof *loss);
    float *d_logits = to_gpu(logits, (size_t)len * sizeof *logits), *d_logits2 = to_gpu(logits, (size_t)len * sizeof *logits);
    float *d_teacher = with_teacher ? to_gpu(teacher, (size_t)len * sizeof *teacher) : NULL;
    float *d_loss = nan_gpu(n), *d_loss2 = nan_gpu(n);
    cpu->cross_entropy(loss, logits, targets, with_teacher ? teacher : NULL, n, vocab, 0.25f, softcap);
    gpu->cross_entropy(d_loss, d_logits, targets, d_teacher, n, vocab, 0.25f, softcap);
    gpu->cross_entropy(d_loss2, d_logits2, targets, d_teacher, n, vocab, 0.25f, softcap);
    char what[96];
    snprintf(what, sizeof what, "cross_entropy %2d x %5d%s, softcap %g: gradient", n, vocab,
             with_teacher ? " + teacher" : "", softcap);
    check_close(what, d_logits, logits, len, 1e-5);
    snprintf(what, sizeof what, "cross_entropy %2d x %5d%s, softcap %g: loss", n, vocab,
             with_teacher ? " + teacher" : "", softcap);
    check_close(what, d_loss, loss, n, 1e-5);
    check_repeats("cross_entropy: a second run's gradient", d_logits2, d_logits, len);
    check_repeats("cross_entropy: a second run's loss", d_loss2, d_loss, n);
    free(targets), free(logits), free(teacher), free(loss);
    gpu->free(d_logits), gpu->free(d_logits2), gpu->free(d_teacher), gpu->free(d_loss), gpu->free(d_loss2);
}

static void test_cross_entropy(void **state) {
    (void)state;
    for (int teacher = 0; teacher < 2; teacher++) {
        check_cross_entropy(6, 1000, teacher, 0);
        check_cross_entropy(6, 1000, teacher, 30.0f);
        check_cross_entropy(3, 50000, teacher, teacher ? 0 : 50.0f);
    }
    check_cross_entropy(70, 300, 0, 0); /* more than QLM_CUDA_SMALL targets */
}

/* 4200 arrays in one call (more than one launch's table holds, 4096) against the CPU's double
 * sums: empty, one block's share, a few blocks, 3000001 values (the most blocks, grid strides),
 * one with +inf and one with NaN, then thousands of small ones; a second call gives the same bits. */
static void test_sum_squares(void **state) {
    (void)state;
    enum { COUNT = 4200 };
    static const float *x[COUNT], *d_x[COUNT];
    static long n[COUNT];
    static double want[COUNT], got[COUNT], again[COUNT];
    for (int j = 0; j < COUNT; j++) {
        n[j] = j == 0 ? 0 : j == 1 ? 3000001 : j == 2 ? 4097 : j == 3 ? 70000 : j < 72 ? 1000 + 37 * j : 1 + j % 300;
        float *v = randv(n[j] > 0 ? n[j] : 1, 60u + (unsigned)j, 3.0f);
        if (j == 4) v[n[j] - 1] = INFINITY;
        if (j == 5) v[17] = NAN;
        x[j] = v, d_x[j] = to_gpu(v, (size_t)(n[j] > 0 ? n[j] : 1) * sizeof *v);
    }
    cpu->sum_squares(want, x, n, COUNT);
    gpu->sum_squares(got, d_x, n, COUNT);
    gpu->sum_squares(again, d_x, n, COUNT);
    double worst = 0;
    for (int j = 0; j < COUNT; j++) {
        if (j == 4 || j == 5) {
            assert_true(j == 4 ? isinf(got[j]) && got[j] > 0 : isnan(got[j]));
            continue;
        }
        const double d = want[j] == 0 ? fabs(got[j]) : fabs(got[j] - want[j]) / want[j];
        worst = fmax(worst, d);
        assert_true(d <= 1e-12);
        assert_memory_equal(&again[j], &got[j], sizeof got[j]);
    }
    print_message("sum_squares of %d arrays of 0 to %ld values: worst %.2e from the CPU's\n", COUNT, n[1], worst);
    assert_true(got[0] == 0);
    for (int j = 0; j < COUNT; j++) {
        free((void *)x[j]);
        gpu->free((void *)d_x[j]);
    }
}

/* The same keep mask and values as the CPU's, into another buffer and in place. */
static void test_dropout(void **state) {
    (void)state;
    const long n = 100003, first = 12345;
    const uint64_t seed = 0x243f6a8885a308d3ull;
    float *x = randv(n, 70u, 2.0f), *want = malloc((size_t)n * sizeof *want);
    float *d_x = to_gpu(x, (size_t)n * sizeof *x), *d_out = nan_gpu(n);
    cpu->dropout(want, x, n, 0.3f, seed, first);
    gpu->dropout(d_out, d_x, n, 0.3f, seed, first);
    check_same("dropout p 0.3", d_out, want, (size_t)n * sizeof *want);
    gpu->dropout(d_x, d_x, n, 0.3f, seed, first);
    check_same("dropout p 0.3, in place", d_x, want, (size_t)n * sizeof *want);
    free(x), free(want);
    gpu->free(d_x), gpu->free(d_out);
}

/* Two updates (step 1, and step 7 with clipping's factor) of one list of tensors on both backends:
 * p, m and v bit for bit. The list has more tensors than one launch's table holds (4096): empty
 * ones, one value, a block's share and one more, 3000001 values (thousands of blocks) and many
 * small ones, some without weight decay, all in four shared buffers as a trainer's pieces are. */
static void test_adamw(void **state) {
    (void)state;
    enum { COUNT = 4100 };
    static long n[COUNT], at[COUNT];
    static float *p[COUNT], *m[COUNT], *v[COUNT], *d_p[COUNT], *d_m[COUNT], *d_v[COUNT];
    static const float *g[COUNT], *d_g[COUNT];
    static unsigned char decay[COUNT];
    const long sizes[] = {0, 1, 2047, 2048, 2049, 10007, 3000001, 0};
    long total = 0;
    for (int j = 0; j < COUNT; j++) {
        n[j] = j < (int)(sizeof sizes / sizeof *sizes) ? sizes[j] : 1 + j % 97;
        at[j] = total, total += n[j];
        decay[j] = j % 3 != 0;
    }
    float *hp = randv(total, 80u, 1.0f), *hm = randv(total, 81u, 0.01f), *hv = randv(total, 82u, 1e-4f);
    for (long i = 0; i < total; i++) hv[i] = fabsf(hv[i]);
    float *dp = to_gpu(hp, (size_t)total * sizeof *hp), *dm = to_gpu(hm, (size_t)total * sizeof *hm);
    float *dv = to_gpu(hv, (size_t)total * sizeof *hv);
    const long steps[2] = {1, 7};
    const float clip[2] = {1.0f, 0.37f};
    for (int s = 0; s < 2; s++) {
        float *hg = randv(total, 83u + (unsigned)s, 0.1f), *dg = to_gpu(hg, (size_t)total * sizeof *hg);
        for (int j = 0; j < COUNT; j++) {
            p[j] = hp + at[j], m[j] = hm + at[j], v[j] = hv + at[j], g[j] = hg + at[j];
            d_p[j] = dp + at[j], d_m[j] = dm + at[j], d_v[j] = dv + at[j], d_g[j] = dg + at[j];
        }
        const qlm_adamw_tensors host = {.p = p, .m = m, .v = v, .g = g, .n = n, .decay = decay, .count = COUNT};
        const qlm_adamw_tensors dev = {.p = d_p, .m = d_m, .v = d_v, .g = d_g, .n = n, .decay = decay, .count = COUNT};
        qlm_adamw_step h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                            .step = steps[s], .grad_mul = clip[s]};
        cpu->adamw(&host, &h);
        gpu->adamw(&dev, &h);
        char what[96];
        snprintf(what, sizeof what, "adamw step %ld, %d tensors, grad x %g: p", steps[s], COUNT, clip[s]);
        check_same(what, dp, hp, (size_t)total * sizeof *hp);
        snprintf(what, sizeof what, "adamw step %ld: m", steps[s]);
        check_same(what, dm, hm, (size_t)total * sizeof *hm);
        snprintf(what, sizeof what, "adamw step %ld: v", steps[s]);
        check_same(what, dv, hv, (size_t)total * sizeof *hv);
        free(hg);
        gpu->free(dg);
    }
    free(hp), free(hm), free(hv);
    gpu->free(dp), gpu->free(dm), gpu->free(dv);
}

/* F32, BF16 and F16 (rounded to nearest even, past F16's range to infinity, into its subnormals),
 * over a weight whose bytes start as all ones (NaNs). */
static void test_store_weight(void **state) {
    (void)state;
    const int rows = 37, cols = 53;
    const long n = (long)rows * cols;
    float *src = randv(n, 90u, 2.0f);
    const float special[] = {70000.0f, 65519.0f, -65520.0f, 1e-6f, -3e-8f, -0.0f, INFINITY, 1.00390625f, 1.01171875f};
    memcpy(src, special, sizeof special);
    /* NaNs of either sign, quiet and signalling, with payload bits in what BF16 and F16 keep. */
    const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f812345u, 0xff80a000u, 0x7fffe000u};
    memcpy(src + sizeof special / sizeof *special, nans, sizeof nans);
    float *d_src = to_gpu(src, (size_t)n * sizeof *src);
    const qlm_dtype dts[] = {QLM_F32, QLM_BF16, QLM_F16};
    for (int k = 0; k < 3; k++) {
        size_t bytes = (size_t)n * qlm_dtype_size(dts[k]);
        void *want = malloc(bytes), *ones = malloc(bytes);
        assert_non_null(want);
        assert_non_null(ones);
        memset(ones, 0xff, bytes);
        void *d_w = to_gpu(ones, bytes);
        qlm_weight hw = {.dtype = dts[k], .rows = rows, .cols = cols, .data = want, .scale = 1.0f}, dw = hw;
        dw.data = d_w;
        cpu->store_weight(&hw, src);
        gpu->store_weight(&dw, d_src);
        char what[96];
        snprintf(what, sizeof what, "store_weight %s", qlm_dtype_name(dts[k]));
        check_same(what, d_w, want, bytes);
        free(want), free(ones);
        gpu->free(d_w);
    }
    free(src);
    gpu->free(d_src);
}

int main(void) {
    gpu = qlm_backend_cuda();
    cpu = qlm_backend_cpu();
    if (!gpu) {
        fprintf(stderr, "test_train_ops needs a GPU: %s\n", qlm_last_error());
        return 1;
    }
    char line[256];
    gpu->describe(line, sizeof line);
    printf("%s\n", line);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_backward_x), cmocka_unit_test(test_matmul_backward_x_huge_dy),
        cmocka_unit_test(test_matmul_backward_w),
        cmocka_unit_test(test_rmsnorm_backward),  cmocka_unit_test(test_rope_backward),
        cmocka_unit_test(test_act_backward),      cmocka_unit_test(test_embedding_backward),
        cmocka_unit_test(test_cross_entropy),     cmocka_unit_test(test_sum_squares),
        cmocka_unit_test(test_dropout),           cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_store_weight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
