/* The CUDA fake-quantization ops (QAT) against the CPU backend's, which are quant/fake_quant.c's
 * functions that tests/test_fake_quant.c checks against torch bit for bit. Weights include values
 * exactly on rounding halves (power-of-two scales make w * (1/s) exact), just past the range's
 * ends, far outside it, zeros of both signs and infinities; per-tensor and per-row scales; INT8 and
 * INT4 ranges. The forward and the weight gradient agree bit for bit (a NaN counts as equal to any
 * NaN: the GPU's NaNs do not carry the input's payload), the scale gradients within 1e-6 (double
 * sums in another order), and the GPU's repeat bit for bit. An output the op overwrites starts as
 * NaN; outputs that accumulate start random. Built and run by `make test-cuda` only: it needs a GPU. */
#include <math.h>

#include "../../quant/fake_quant.h"
#include "gpu_test_util.h"

/* The LCG's next 24 bits (frand's source), for integer choices. */
static unsigned next(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* The device's n values against want bit for bit (any NaN equal to any NaN). */
static void check_same(const char *what, const float *dev, const float *want, long n) {
    float *got = from_gpu(dev, n);
    long bad = 0, first = -1;
    for (long i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof *got) != 0 && !(isnan(got[i]) && isnan(want[i])))
            if (bad++ == 0) first = i;
    print_message("%-58s %s\n", what, bad ? "DIFFERENT" : "same bits");
    if (bad) {
        uint32_t g, w;
        memcpy(&g, &got[first], sizeof g);
        memcpy(&w, &want[first], sizeof w);
        print_message("  %ld differ, first [%ld]: %.9g (0x%08x) against %.9g (0x%08x)\n", bad, first, got[first],
                      (unsigned)g, want[first], (unsigned)w);
    }
    free(got);
    assert_int_equal(bad, 0);
}

/* Scale gradients: |got - want| <= 1e-6 (|want| + |start|), the bound of two float roundings of
 * double sums that differ in their last bits (start: the value they were added to). */
static void check_scales(const char *what, const float *dev, const float *want, const float *start, long n) {
    float *got = from_gpu(dev, n);
    double worst = 0;
    for (long i = 0; i < n; i++) {
        double d = isnan(want[i]) && isnan(got[i]) ? 0 : fabs((double)got[i] - want[i]);
        double ratio = d / (1e-6 * (fabs((double)want[i]) + fabs((double)start[i])) + 1e-300);
        worst = isnan(d) ? INFINITY : fmax(worst, ratio);
    }
    print_message("%-58s %.2e of the bound\n", what, worst);
    free(got);
    assert_true(worst <= 1.0);
}

/* Weights for scales s (per row, or s[0] for all): mostly uniform over the range and a little
 * past it, with exact halves of a step (ties), the range's ends and the halves just past them,
 * values far outside, zeros of both signs and a few infinities. */
static float *make_weights(int rows, int cols, const float *s, int per_row, int qmin, int qmax, unsigned seed) {
    float *w = malloc((size_t)rows * cols * sizeof *w);
    assert_non_null(w);
    for (int r = 0; r < rows; r++) {
        const float sc = s[per_row ? r : 0];
        for (int c = 0; c < cols; c++) {
            float *v = &w[(size_t)r * cols + c];
            unsigned kind = next(&seed) % 10;
            int k = qmin - 1 + (int)(next(&seed) % (unsigned)(qmax - qmin + 3)); /* qmin - 1 .. qmax + 1 */
            if (kind == 0) *v = ((float)k + 0.5f) * sc;
            else if (kind == 1) *v = (float)k * sc;
            else if (kind == 2) *v = (next(&seed) & 1 ? (float)qmax + 0.5f : (float)qmin - 0.5f) * sc;
            else if (kind == 3) *v = (float)(qmax + 2 + (int)(next(&seed) % 200)) * sc * (next(&seed) & 1 ? 1 : -1);
            else if (kind == 4) *v = next(&seed) & 1 ? 0.0f : -0.0f;
            else *v = (float)(qmin - 2 + (qmax - qmin + 4) * (frand(&seed) + 1.0) / 2.0) * sc;
        }
    }
    long n = (long)rows * cols;
    w[n / 3] = INFINITY;
    w[n / 2] = -INFINITY;
    return w;
}

/* Scales: a power of two (ties exact) where i + seed is a multiple of 3, others anywhere in
 * [0.003, 0.05]. */
static float *make_scales(int n, unsigned seed) {
    float *s = malloc((size_t)n * sizeof *s);
    assert_non_null(s);
    for (int i = 0; i < n; i++) {
        unsigned r = seed + (unsigned)i;
        s[i] = r % 3 == 0 ? ldexpf(1.0f, -4 - (int)(next(&r) % 5)) : 0.0265f + 0.0235f * frand(&r);
    }
    return s;
}

/* One shape and range: forward (into NaNs, and in place), then backward (dw and dscales
 * accumulating, each also alone), twice on the GPU for repeatability. */
static void check_case(int rows, int cols, int per_row, int qmin, int qmax, unsigned seed) {
    const long n = (long)rows * cols;
    const int ns = per_row ? rows : 1;
    float *s = make_scales(ns, seed);
    float *w = make_weights(rows, cols, s, per_row, qmin, qmax, seed + 1);
    float *dout = randv(n, seed + 2, 1.0f), *dw0 = randv(n, seed + 3, 1.0f), *ds0 = randv(ns, seed + 4, 1e-3f);
    for (long i = 0; i < n; i += 17) dout[i] = 0;
    const float gf = qlm_lsq_grad_factor(n, qmax);
    char what[128], shape[64];
    snprintf(shape, sizeof shape, "%-10s %5d x %5d, %d..%d", per_row ? "per-row" : "per-tensor", rows, cols, qmin, qmax);
    float *d_s = to_gpu(s, (size_t)ns * sizeof *s), *d_w = to_gpu(w, (size_t)n * sizeof *w);
    float *d_dout = to_gpu(dout, (size_t)n * sizeof *dout);

    float *out = malloc((size_t)n * sizeof *out);
    assert_non_null(out);
    cpu->fake_quant_forward(out, w, rows, cols, s, per_row, qmin, qmax);
    float *d_out = nan_gpu(n);
    gpu->fake_quant_forward(d_out, d_w, rows, cols, d_s, per_row, qmin, qmax);
    snprintf(what, sizeof what, "forward %s", shape);
    check_same(what, d_out, out, n);
    float *d_in_place = to_gpu(w, (size_t)n * sizeof *w);
    gpu->fake_quant_forward(d_in_place, d_in_place, rows, cols, d_s, per_row, qmin, qmax);
    snprintf(what, sizeof what, "forward in place %s", shape);
    check_same(what, d_in_place, out, n);

    float *dw = malloc((size_t)n * sizeof *dw), *ds = malloc((size_t)ns * sizeof *ds);
    assert_non_null(dw);
    assert_non_null(ds);
    memcpy(dw, dw0, (size_t)n * sizeof *dw);
    memcpy(ds, ds0, (size_t)ns * sizeof *ds);
    cpu->fake_quant_backward(dw, ds, dout, w, rows, cols, s, per_row, qmin, qmax, gf);
    float *first_ds = NULL;
    for (int rep = 0; rep < 2; rep++) {
        float *d_dw = to_gpu(dw0, (size_t)n * sizeof *dw0), *d_ds = to_gpu(ds0, (size_t)ns * sizeof *ds0);
        gpu->fake_quant_backward(d_dw, d_ds, d_dout, d_w, rows, cols, d_s, per_row, qmin, qmax, gf);
        snprintf(what, sizeof what, "backward dw %s", shape);
        check_same(what, d_dw, dw, n);
        snprintf(what, sizeof what, "backward dscales %s", shape);
        check_scales(what, d_ds, ds, ds0, ns);
        if (rep == 0) {
            first_ds = from_gpu(d_ds, ns);
        } else {
            snprintf(what, sizeof what, "backward dscales again %s", shape);
            check_same(what, d_ds, first_ds, ns);
        }
        gpu->free(d_dw), gpu->free(d_ds);
    }

    /* Each gradient alone: the other NULL. */
    float *d_dw = to_gpu(dw0, (size_t)n * sizeof *dw0), *d_ds = to_gpu(ds0, (size_t)ns * sizeof *ds0);
    gpu->fake_quant_backward(d_dw, NULL, d_dout, d_w, rows, cols, d_s, per_row, qmin, qmax, gf);
    gpu->fake_quant_backward(NULL, d_ds, d_dout, d_w, rows, cols, d_s, per_row, qmin, qmax, gf);
    snprintf(what, sizeof what, "backward dw alone %s", shape);
    check_same(what, d_dw, dw, n);
    snprintf(what, sizeof what, "backward dscales alone %s", shape);
    check_same(what, d_ds, first_ds, ns);

    free(s), free(w), free(dout), free(dw0), free(ds0), free(out), free(dw), free(ds), free(first_ds);
    gpu->free(d_s), gpu->free(d_w), gpu->free(d_dout), gpu->free(d_out), gpu->free(d_in_place);
    gpu->free(d_dw), gpu->free(d_ds);
}

/* Per-tensor shapes below and above the blocks' first pass (1024 blocks of 256 threads), per-row
 * ones as groups of 32, as output rows, and as few long rows. */
static void test_fake_quant(void **state) {
    (void)state;
    const int ranges[][2] = {{-127, 127}, {-8, 7}};
    for (int k = 0; k < 2; k++) {
        const int qmin = ranges[k][0], qmax = ranges[k][1];
        check_case(37, 129, 0, qmin, qmax, 12u + 3u * (unsigned)k);     /* a power-of-two scale */
        check_case(300, 1100, 0, qmin, qmax, 22u + 3u * (unsigned)k);   /* another scale */
        check_case(4100, 32, 1, qmin, qmax, 30u + (unsigned)k);
        check_case(67, 300, 1, qmin, qmax, 40u + (unsigned)k);
        check_case(3, 5000, 1, qmin, qmax, 50u + (unsigned)k);
    }
}

/* A NaN weight is inside (quant/fake_quant.c): the forward gives NaN, dw takes dout, and its
 * row's scale gradient becomes NaN, the other rows' not. */
static void test_fake_quant_nan(void **state) {
    (void)state;
    const int rows = 4, cols = 40;
    const long n = (long)rows * cols;
    float *s = make_scales(rows, 60u), *w = make_weights(rows, cols, s, 1, -127, 127, 61u);
    float *dout = randv(n, 62u, 1.0f), *dw = randv(n, 63u, 1.0f), *ds = randv(rows, 64u, 1e-3f);
    w[cols + 5] = NAN;
    float *d_s = to_gpu(s, rows * sizeof *s), *d_w = to_gpu(w, (size_t)n * sizeof *w);
    float *d_dout = to_gpu(dout, (size_t)n * sizeof *dout), *d_dw = to_gpu(dw, (size_t)n * sizeof *dw);
    float *d_ds = to_gpu(ds, rows * sizeof *ds), *d_out = nan_gpu(n), *start = malloc(rows * sizeof *start);
    float *out = malloc((size_t)n * sizeof *out);
    assert_non_null(start);
    assert_non_null(out);
    memcpy(start, ds, rows * sizeof *ds);
    const float gf = qlm_lsq_grad_factor(n, 127);
    cpu->fake_quant_forward(out, w, rows, cols, s, 1, -127, 127);
    cpu->fake_quant_backward(dw, ds, dout, w, rows, cols, s, 1, -127, 127, gf);
    gpu->fake_quant_forward(d_out, d_w, rows, cols, d_s, 1, -127, 127);
    gpu->fake_quant_backward(d_dw, d_ds, d_dout, d_w, rows, cols, d_s, 1, -127, 127, gf);
    assert_true(isnan(out[cols + 5]) && isnan(ds[1]) && !isnan(ds[0]));
    check_same("NaN weight: forward", d_out, out, n);
    check_same("NaN weight: dw", d_dw, dw, n);
    check_scales("NaN weight: dscales", d_ds, ds, start, rows);
    free(s), free(w), free(dout), free(dw), free(ds), free(start), free(out);
    gpu->free(d_s), gpu->free(d_w), gpu->free(d_dout), gpu->free(d_dw), gpu->free(d_ds), gpu->free(d_out);
}

/* The floor under learned scales: below it, at it, NaN, negative, zero, large; bit for bit. */
static void test_clamp_scales(void **state) {
    (void)state;
    const long n = 1000;
    float *s = randv(n, 70u, 1e-6f);
    const float special[] = {NAN, -NAN, 0.0f, -0.0f, -1.0f, FLT_EPSILON, nextafterf(FLT_EPSILON, 0), 1e30f,
                             -INFINITY, INFINITY, 1e-45f};
    memcpy(s, special, sizeof special);
    float *d_s = to_gpu(s, (size_t)n * sizeof *s);
    cpu->fake_quant_clamp_scales(s, n);
    gpu->fake_quant_clamp_scales(d_s, n);
    check_same("clamp_scales", d_s, s, n);
    for (long i = 0; i < n; i++) assert_true(s[i] >= QLM_FAKE_QUANT_MIN_SCALE);
    free(s);
    gpu->free(d_s);
}

int main(void) {
    gpu = qlm_backend_cuda();
    cpu = qlm_backend_cpu();
    if (!gpu) {
        fprintf(stderr, "test_fake_quant_cuda needs a GPU: %s\n", qlm_last_error());
        return 1;
    }
    char line[256];
    gpu->describe(line, sizeof line);
    printf("%s\n", line);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_quant),
        cmocka_unit_test(test_fake_quant_nan),
        cmocka_unit_test(test_clamp_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
