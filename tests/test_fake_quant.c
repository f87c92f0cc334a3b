/* LSQ fake quantization (quant/fake_quant.c) against torch's _fake_quantize_learnable_per_tensor_affine /
 * _per_channel_affine (tests/fixtures/qat/, made by tools/make_qat_fixtures.py), plus the rules that
 * need no fixture: the starting scale, values on the grid, ties, zero tensors, accumulation and
 * thread-count independent scale gradients. The fixtures are committed: a missing one fails. */
#include <float.h>
#include <math.h>
#include <omp.h>

#include <cjson/cJSON.h>

#include "test_util.h"

#include "quant/fake_quant.h"

#define QAT_DIR "tests/fixtures/qat"

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

typedef struct {
    char name[64];
    int per_channel, rows, cols, qmin, qmax, k;
    float grad_factor;
    float *blob; /* w, dout, out, dw (n each), scales, dscales (k each) */
    float *w, *dout, *out, *dw, *scales, *dscales;
} qat_case;

static void load_case(const cJSON *c, qat_case *qc) {
    memset(qc, 0, sizeof *qc);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(c, "kind");
    assert_true(cJSON_IsString(name) && cJSON_IsString(kind));
    snprintf(qc->name, sizeof qc->name, "%s", name->valuestring);
    qc->per_channel = strcmp(kind->valuestring, "channel") == 0;
    assert_true(qc->per_channel || strcmp(kind->valuestring, "tensor") == 0);
    qc->rows = cJSON_GetObjectItemCaseSensitive(c, "rows")->valueint;
    qc->cols = cJSON_GetObjectItemCaseSensitive(c, "cols")->valueint;
    qc->qmin = cJSON_GetObjectItemCaseSensitive(c, "qmin")->valueint;
    qc->qmax = cJSON_GetObjectItemCaseSensitive(c, "qmax")->valueint;
    qc->k = cJSON_GetObjectItemCaseSensitive(c, "scales")->valueint;
    qc->grad_factor = (float)cJSON_GetObjectItemCaseSensitive(c, "grad_factor")->valuedouble;
    assert_int_equal(qc->k, qc->per_channel ? qc->rows : 1);

    char path[256];
    snprintf(path, sizeof path, "%s/%s.f32", QAT_DIR, qc->name);
    size_t len = 0;
    qc->blob = (float *)test_read_file(path, &len);
    if (!qc->blob) fail_msg("fixture missing: %s (run tools/make_qat_fixtures.py)", path);
    long n = (long)qc->rows * qc->cols;
    assert_int_equal(len, sizeof(float) * (size_t)(4 * n + 2 * qc->k));
    qc->w = qc->blob;
    qc->dout = qc->w + n;
    qc->out = qc->dout + n;
    qc->dw = qc->out + n;
    qc->scales = qc->dw + n;
    qc->dscales = qc->scales + qc->k;
}

static void test_matches_torch(void **state) {
    (void)state;
    char *json = test_read_file(QAT_DIR "/cases.json", NULL);
    if (!json) fail_msg("fixture missing: %s/cases.json (run tools/make_qat_fixtures.py)", QAT_DIR);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases"), *c;
    assert_true(cJSON_IsArray(cases));
    int seen = 0, seen_channel = 0, seen_m128 = 0;
    cJSON_ArrayForEach(c, cases) {
        qat_case qc;
        load_case(c, &qc);
        long n = (long)qc.rows * qc.cols;
        float *out = malloc(sizeof(float) * (size_t)n), *dw = calloc((size_t)n, sizeof(float));
        float *ds = calloc((size_t)qc.k, sizeof(float));
        assert_true(out && dw && ds);

        /* torch's grad factor for the whole tensor (X.numel(), per channel too), bit for bit. */
        float gf = qlm_lsq_grad_factor(n, qc.qmax);
        assert_true(same_bits(gf, qc.grad_factor));

        if (qc.per_channel) {
            qlm_fake_quant_forward_rows(out, qc.w, qc.rows, qc.cols, qc.scales, qc.qmin, qc.qmax);
            qlm_fake_quant_backward_rows(dw, ds, qc.dout, qc.w, qc.rows, qc.cols, qc.scales, qc.qmin, qc.qmax, gf);
        } else {
            qlm_fake_quant_forward(out, qc.w, n, qc.scales[0], qc.qmin, qc.qmax);
            qlm_fake_quant_backward(dw, ds, qc.dout, qc.w, n, qc.scales[0], qc.qmin, qc.qmax, gf);
        }
        long not_exact = 0, clipped = 0;
        for (long i = 0; i < n; i++) {
            float s = qc.scales[qc.per_channel ? i / qc.cols : 0];
            if (fabsf(out[i] - qc.out[i]) > 1e-6f * s)
                fail_msg("%s: out[%ld] %.9g, torch %.9g (w %.9g, s %.9g)", qc.name, i, out[i], qc.out[i], qc.w[i], s);
            if (fabsf(dw[i] - qc.dw[i]) > 1e-6f)
                fail_msg("%s: dw[%ld] %.9g, torch %.9g (w/s %.9g)", qc.name, i, dw[i], qc.dw[i], qc.w[i] / s);
            /* dw: torch writes dout * 0 (maybe -0) where we add nothing; compare values. */
            not_exact += !same_bits(out[i], qc.out[i]) || dw[i] != qc.dw[i];
            clipped += qc.dw[i] == 0 && qc.dout[i] != 0;
        }
        /* Within tolerance is the contract; bit for bit is what the formulas give. */
        assert_int_equal(not_exact, 0);
        assert_true(clipped > 0); /* the fixtures exercise the clamp */
        double worst = 0;
        for (int r = 0; r < qc.k; r++) {
            double ref = qc.dscales[r], err = fabs((double)ds[r] - ref);
            if (err > 1e-4 * fabs(ref) + 1e-9)
                fail_msg("%s: dscale[%d] %.9g, torch %.9g", qc.name, r, ds[r], qc.dscales[r]);
            if (ref != 0 && err / fabs(ref) > worst) worst = err / fabs(ref);
        }
        print_message("%-18s %s %dx%d qmin %d: out bit-exact, dw exact (%ld clipped); dscale worst rel. diff %.2e\n",
                      qc.name, qc.per_channel ? "per row   " : "per tensor", qc.rows, qc.cols, qc.qmin, clipped,
                      worst);
        seen++;
        seen_channel += qc.per_channel;
        seen_m128 += qc.qmin == -128;
        free(out);
        free(dw);
        free(ds);
        free(qc.blob);
    }
    assert_true(seen >= 4 && seen_channel >= 1 && seen_channel < seen && seen_m128 >= 1);
    cJSON_Delete(root);
    free(json);
}

static void test_init_scale(void **state) {
    (void)state;
    float w[6] = {0.5f, -2.54f, 1.0f, 0.0f, INFINITY, NAN}; /* non-finite values are ignored */
    assert_true(same_bits(qlm_fake_quant_init_scale(w, 6, 127), 2.54f / 127.0f));
    assert_true(same_bits(qlm_fake_quant_init_scale(w, 6, 7), 2.54f / 7.0f));

    float rows[3 * 4] = {1, -3, 2, 0, /* all zero: */ 0, 0, 0, 0, 0.25f, 0.125f, -0.5f, 0.0f};
    float s[3];
    qlm_fake_quant_init_scales_rows(s, rows, 3, 4, 127);
    assert_true(same_bits(s[0], 3.0f / 127.0f));
    assert_true(same_bits(s[1], QLM_FAKE_QUANT_MIN_SCALE)); /* never 0 */
    assert_true(same_bits(s[2], 0.5f / 127.0f));

    /* A large tensor (the parallel path) agrees with the serial definition. */
    long n = 300000;
    float *big = malloc(sizeof(float) * (size_t)n);
    assert_non_null(big);
    for (long i = 0; i < n; i++) big[i] = (float)((i * 7919) % 10007) / 10007.0f - 0.5f;
    big[123457] = -3.25f;
    assert_true(same_bits(qlm_fake_quant_init_scale(big, n, 127), 3.25f / 127.0f));
    free(big);

    float sc[4] = {0.1f, 0.0f, -1.0f, NAN};
    qlm_fake_quant_clamp_scales(sc, 4);
    assert_true(sc[0] == 0.1f && sc[1] == FLT_EPSILON && sc[2] == FLT_EPSILON && sc[3] == FLT_EPSILON);
}

/* Squared error of fake-quantizing w with scale sc into [qmin, qmax]. */
static double sq_error(const float *w, int n, float sc, int qmin, int qmax) {
    float *out = malloc((size_t)n * sizeof *out);
    assert_non_null(out);
    qlm_fake_quant_forward(out, w, n, sc, qmin, qmax);
    double e = 0;
    for (int k = 0; k < n; k++) e += ((double)out[k] - w[k]) * ((double)out[k] - w[k]);
    free(out);
    return e;
}

/* The 4-bit groups' starting scales: within [max/(2 qmax), max/qmax], never worse than max/qmax,
 * and on Gaussian-like groups strictly better (16 levels leave room); a zero group gets the floor. */
static void test_init_scale_mse(void **state) {
    (void)state;
    enum { ROWS = 64, COLS = 32 };
    float *w = malloc(sizeof(float) * ROWS * COLS), s[ROWS + 1];
    assert_non_null(w);
    uint32_t x = 12345;
    for (int i = 0; i < ROWS * COLS; i++) {
        float sum = 0;
        for (int k = 0; k < 4; k++) sum += (float)((x = x * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
        w[i] = sum * 0.05f;
    }
    memset(w + (ROWS - 1) * COLS, 0, COLS * sizeof(float));
    int better = 0;
    qlm_fake_quant_init_scales_mse_rows(s, w, ROWS, COLS, -8, 7);
    for (int r = 0; r < ROWS - 1; r++) {
        float top = qlm_fake_quant_init_scale(w + r * COLS, COLS, 7);
        assert_true(s[r] <= top && s[r] >= top * 0.5f);
        double e = sq_error(w + r * COLS, COLS, s[r], -8, 7), e_top = sq_error(w + r * COLS, COLS, top, -8, 7);
        assert_true(e <= e_top);
        better += e < e_top * 0.95;
    }
    assert_true(better > ROWS / 2);
    assert_true(same_bits(s[ROWS - 1], QLM_FAKE_QUANT_MIN_SCALE));
    free(w);
}

/* Values already on the grid come back unchanged and give the scale no gradient. */
static void test_grid_identity(void **state) {
    (void)state;
    const float scales[3] = {0.0123457f, 0.0078125f, 3.3f};
    float w[3][256], out[3][256], dw[3][256], dout[256];
    for (int i = 0; i < 256; i++) dout[i] = (float)(i % 17) - 8.0f;
    for (int r = 0; r < 3; r++)
        for (int k = -128; k < 128; k++) w[r][k + 128] = (float)k * scales[r];
    for (int r = 0; r < 3; r++) {
        qlm_fake_quant_forward(out[r], w[r], 256, scales[r], -128, 127);
        for (int i = 0; i < 256; i++) assert_true(same_bits(out[r][i], w[r][i]));
        float ds = 0;
        memset(dw[r], 0, sizeof dw[r]);
        qlm_fake_quant_backward(dw[r], &ds, dout, w[r], 256, scales[r], -128, 127, 1.0f);
        /* Only the float rounding of k * s (q - w/s is 0 up to it; exactly 0 for 2^-7). */
        assert_true(fabsf(ds) < 256 * 8 * 1e-6f);
        if (r == 1) assert_true(ds == 0.0f);
        for (int i = 0; i < 256; i++) assert_true(same_bits(dw[r][i], dout[i]));
    }
    /* Per row, with the rows' own scales. */
    float outr[3][256];
    qlm_fake_quant_forward_rows(&outr[0][0], &w[0][0], 3, 256, scales, -128, 127);
    assert_memory_equal(outr, w, sizeof w);
}

/* Round half to even, the clamp, and which side of it counts as inside (the rounded value). */
static void test_ties_and_bounds(void **state) {
    (void)state;
    const float s = 0.0625f; /* 1/s exact: w * (1/s) is exactly the tie */
    const float t[] = {0.5f, 1.5f, 2.5f, -2.5f, 127.4f, 127.5f, -127.5f, -128.5f, -128.6f, 1e30f, -INFINITY};
    const float want_q[] = {0, 2, 2, -2, 127, 127, -128, -128, -128, 127, -128};
    const int inside[] = {1, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0};
    enum { N = sizeof t / sizeof t[0] };
    float w[N], out[N], dw[N], dout[N];
    for (int i = 0; i < N; i++) {
        w[i] = t[i] * s;
        dout[i] = 1.0f;
    }
    qlm_fake_quant_forward(out, w, N, s, -128, 127);
    for (int i = 0; i < N; i++) {
        assert_true(out[i] == want_q[i] * s);
        float d = 0, ds = 0;
        qlm_fake_quant_backward(&d, &ds, &dout[i], &w[i], 1, s, -128, 127, 0.5f);
        assert_true(d == (float)inside[i]);
        /* inside: d out / d s = q - w/s; outside: the bound */
        float want = inside[i] ? (want_q[i] - t[i]) * 0.5f : want_q[i] * 0.5f;
        if (fabsf(ds - want) > 1e-5f) fail_msg("value %g: dscale %g, want %g", t[i], ds, want);
    }
    /* qmin -127: -127.5 rounds to -128 and is outside. */
    float d = 0, ds = 0, o;
    qlm_fake_quant_forward(&o, &w[6], 1, s, -127, 127);
    assert_true(o == -127 * s);
    qlm_fake_quant_backward(&d, &ds, &dout[6], &w[6], 1, s, -127, 127, 1.0f);
    assert_true(d == 0 && ds == -127.0f);
    memset(dw, 0, sizeof dw);
    qlm_fake_quant_backward(dw, NULL, dout, w, N, s, -128, 127, 1.0f); /* NULL dscale: dw only */
    for (int i = 0; i < N; i++) assert_true(dw[i] == (float)inside[i]);
}

static void test_zero_tensor(void **state) {
    (void)state;
    float w[4 * 8] = {0}, out[4 * 8], dw[4 * 8] = {0}, dout[4 * 8], s[4], ds[4] = {0};
    for (int i = 0; i < 32; i++) dout[i] = (float)i - 10.0f;
    float s1 = qlm_fake_quant_init_scale(w, 32, 127);
    assert_true(s1 > 0);
    qlm_fake_quant_forward(out, w, 32, s1, -127, 127);
    for (int i = 0; i < 32; i++) assert_true(out[i] == 0.0f);
    qlm_fake_quant_init_scales_rows(s, w, 4, 8, 127);
    qlm_fake_quant_forward_rows(out, w, 4, 8, s, -127, 127);
    for (int i = 0; i < 32; i++) assert_true(out[i] == 0.0f);
    qlm_fake_quant_backward_rows(dw, ds, dout, w, 4, 8, s, -127, 127, qlm_lsq_grad_factor(32, 127));
    for (int i = 0; i < 32; i++) assert_true(dw[i] == dout[i]); /* inside: gradient passes */
    for (int r = 0; r < 4; r++) assert_true(ds[r] == 0.0f);
    /* n = 0 is a no-op. */
    float one = 5.0f;
    qlm_fake_quant_backward(NULL, &one, dout, w, 0, 1.0f, -127, 127, 1.0f);
    assert_true(one == 5.0f);
}

/* dw and dscale accumulate; the per-tensor scale gradient does not depend on the thread count. */
static void test_accumulate_and_determinism(void **state) {
    (void)state;
    long n = 1L << 20;
    float *w = malloc(sizeof(float) * (size_t)n), *dout = malloc(sizeof(float) * (size_t)n);
    float *dw1 = calloc((size_t)n, sizeof(float)), *dw2 = calloc((size_t)n, sizeof(float));
    float *out = malloc(sizeof(float) * (size_t)n), *outr = malloc(sizeof(float) * (size_t)n);
    assert_true(w && dout && dw1 && dw2 && out && outr);
    uint64_t x = 88172645463325252ull;
    for (long i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[i] = (float)((x >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
        dout[i] = (float)((x & 0xffff) * (1.0 / 65536.0)) - 0.5f;
    }
    float s = 0.8f * qlm_fake_quant_init_scale(w, n, 127), gf = qlm_lsq_grad_factor(n, 127);

    float ds_t[3];
    int threads[3] = {1, 2, 3};
    int saved = omp_get_max_threads();
    for (int k = 0; k < 3; k++) {
        omp_set_num_threads(threads[k]);
        ds_t[k] = 0;
        qlm_fake_quant_backward(k == 0 ? dw1 : NULL, &ds_t[k], dout, w, n, s, -127, 127, gf);
    }
    omp_set_num_threads(saved);
    assert_true(same_bits(ds_t[0], ds_t[1]) && same_bits(ds_t[0], ds_t[2]));

    /* Twice into the same accumulators: exactly double (x + x is exact). */
    float ds2 = 0;
    qlm_fake_quant_backward(dw2, &ds2, dout, w, n, s, -127, 127, gf);
    qlm_fake_quant_backward(dw2, &ds2, dout, w, n, s, -127, 127, gf);
    assert_true(same_bits(ds2, 2.0f * ds_t[0]));
    for (long i = 0; i < n; i++) assert_true(same_bits(dw2[i], 2.0f * dw1[i]));

    /* Per-row with every row's scale equal to the tensor's: same forward, same dw, and the row
     * gradients add up to the tensor's (up to float rounding of the partial sums). */
    int rows = 1024, cols = (int)(n / rows);
    float *scales = malloc(sizeof(float) * (size_t)rows), *dsr = calloc((size_t)rows, sizeof(float));
    assert_true(scales && dsr);
    for (int r = 0; r < rows; r++) scales[r] = s;
    qlm_fake_quant_forward(out, w, n, s, -127, 127);
    qlm_fake_quant_forward_rows(outr, w, rows, cols, scales, -127, 127);
    assert_memory_equal(out, outr, sizeof(float) * (size_t)n);
    memset(dw2, 0, sizeof(float) * (size_t)n);
    qlm_fake_quant_backward_rows(dw2, dsr, dout, w, rows, cols, scales, -127, 127, gf);
    assert_memory_equal(dw1, dw2, sizeof(float) * (size_t)n);
    double sum = 0, mag = 0;
    for (int r = 0; r < rows; r++) sum += dsr[r], mag += fabs(dsr[r]);
    assert_true(fabs(sum - ds_t[0]) <= 1e-5 * mag);
    /* In place (out aliases w). */
    memcpy(outr, w, sizeof(float) * (size_t)n);
    qlm_fake_quant_forward(outr, outr, n, s, -127, 127);
    assert_memory_equal(out, outr, sizeof(float) * (size_t)n);

    free(scales), free(dsr), free(w), free(dout), free(dw1), free(dw2), free(out), free(outr);
}

static void test_grad_factor(void **state) {
    (void)state;
    /* 1 / sqrt(n * qmax), n = every value of the tensor. */
    assert_true(same_bits(qlm_lsq_grad_factor(1, 1), 1.0f));
    assert_true(same_bits(qlm_lsq_grad_factor(64 * 96, 127), (float)(1.0 / sqrt(64.0 * 96.0 * 127.0))));
    float big = qlm_lsq_grad_factor(4096L * 4096L, 127), want = 1.0f / (4096.0f * sqrtf(127.0f));
    assert_true(fabsf(big - want) <= 1e-6f * want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_torch),
        cmocka_unit_test(test_init_scale),
        cmocka_unit_test(test_init_scale_mse),
        cmocka_unit_test(test_grid_identity),
        cmocka_unit_test(test_ties_and_bounds),
        cmocka_unit_test(test_zero_tensor),
        cmocka_unit_test(test_accumulate_and_determinism),
        cmocka_unit_test(test_grad_factor),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
