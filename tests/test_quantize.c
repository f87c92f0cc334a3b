/* INT8 quantization against numpy (tests/fixtures/quant/quantize.txt, made by
 * tools/make_quant_fixtures.py), its error bound, edge cases (zero / tiny / non-finite
 * tensors), block rounding against roundf at every half and its neighbours, and the dtype
 * conversion helpers. */
#include <math.h>

#include "test_util.h"

#include "quant/block_quant.h"
#include "quant/half.h"
#include "quant/quantize.h"

#define QUANT_FIXTURE "tests/fixtures/quant/quantize.txt"

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Reads "<key> v v v ..." with count hex float bits. */
static void read_floats(FILE *f, const char *key, float *out, long count) {
    char k[32];
    assert_int_equal(fscanf(f, "%31s", k), 1);
    assert_string_equal(k, key);
    for (long i = 0; i < count; i++) {
        unsigned u;
        assert_int_equal(fscanf(f, "%x", &u), 1);
        out[i] = bitsf(u);
    }
}

static void read_ints(FILE *f, const char *key, int *out, long count) {
    char k[32];
    assert_int_equal(fscanf(f, "%31s", k), 1);
    assert_string_equal(k, key);
    for (long i = 0; i < count; i++) assert_int_equal(fscanf(f, "%d", &out[i]), 1);
}

static uint64_t g_rng = 88172645463325252ull;

static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void test_matches_numpy(void **state) {
    (void)state;
    FILE *f = fopen(QUANT_FIXTURE, "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof line, f)); /* comment */
    int matrices = 0, rows, cols;
    while (fscanf(f, " matrix %d %d", &rows, &cols) == 2) {
        long n = (long)rows * cols;
        float *w = malloc(n * sizeof(float)), *rs_ref = malloc(rows * sizeof(float));
        float *rs = malloc(rows * sizeof(float)), ts_ref;
        int *q_ref = malloc(n * sizeof(int));
        int8_t *q = malloc(n);
        assert_true(w && rs_ref && rs && q_ref && q);
        read_floats(f, "w", w, n);
        read_floats(f, "tensor_scale", &ts_ref, 1);
        read_ints(f, "tensor_q", q_ref, n);
        float s = qlm_quantize_i8(q, w, rows, cols);
        assert_int_equal(fbits(s), fbits(ts_ref));
        for (long i = 0; i < n; i++)
            if (q[i] != q_ref[i]) fail_msg("per-tensor q[%ld] = %d, numpy %d (w %g)", i, q[i], q_ref[i], w[i]);
        read_floats(f, "row_scales", rs_ref, rows);
        read_ints(f, "row_q", q_ref, n);
        qlm_quantize_i8_rows(q, rs, w, rows, cols);
        for (int r = 0; r < rows; r++) assert_int_equal(fbits(rs[r]), fbits(rs_ref[r]));
        for (long i = 0; i < n; i++)
            if (q[i] != q_ref[i]) fail_msg("per-row q[%ld] = %d, numpy %d (w %g)", i, q[i], q_ref[i], w[i]);
        free(w);
        free(rs_ref);
        free(rs);
        free(q_ref);
        free(q);
        matrices++;
    }
    fclose(f);
    assert_int_equal(matrices, 2);
}

/* Half away from zero: with scale exactly 1 the ties are exact. */
static void test_rounding_ties(void **state) {
    (void)state;
    const float w[] = {127.0f, 0.5f, -0.5f, 2.5f, -3.5f, 1.4999999f, -126.5f};
    const int8_t want[] = {127, 1, -1, 3, -4, 1, -127};
    int8_t q[7];
    assert_true(qlm_quantize_i8(q, w, 1, 7) == 1.0f);
    for (int i = 0; i < 7; i++) assert_int_equal(q[i], want[i]);
}

/* Q8_0 and Q4_0 blocks whose scale is exactly 1 (a value of 127, or -8, in each) round every
 * other value as roundf does, then clamp: at each k + 0.5, the floats either side of it, and
 * random values, positive and negative. */
static void test_block_rounding(void **state) {
    (void)state;
    enum { N = 31 * 1200 };
    static float v8[N], v4[N];
    int n = 0;
    for (int k = -127; k <= 126 && n + 4 <= N; k++) {
        float h = (float)k + 0.5f;
        const float near[] = {h, nextafterf(h, -INFINITY), nextafterf(h, INFINITY), (float)k};
        for (int i = 0; i < 4; i++) v8[n++] = near[i];
    }
    while (n < N) v8[n++] = frand() * 127.0f;
    for (int i = 0; i < N; i++) v4[i] = v8[i] / 16.0f; /* halves of -8..8 and their neighbours too */
    for (int i = 0; i < N; i++)
        if (i % 16 == 0) v4[i] = nextafterf((float)(i / 16 % 16) - 8.0f + 0.5f, i % 32 ? INFINITY : -INFINITY);
    /* The helper itself, where the blocks cannot reach: outside the range and not finite. */
    const float far[] = {INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 127.5f, -127.5f, 128.49f, -128.5f, 2.5e9f, -0.0f};
    for (int i = 0; i < 11; i++) {
        float r = roundf(far[i]);
        int want = isnan(far[i]) ? 0 : r < -127 ? -127 : r > 127 ? 127 : (int)r;
        assert_int_equal(qlm_round_clamp(far[i], -127, 127), want);
    }
    const qlm_dtype types[] = {QLM_Q8_0, QLM_Q4_0};
    for (int t = 0; t < 2; t++) {
        const float *v = t == 0 ? v8 : v4;
        for (int b = 0; b < N / 31; b++) {
            float w[32];
            w[0] = t == 0 ? 127.0f : -8.0f;
            memcpy(w + 1, v + b * 31, 31 * sizeof *w);
            uint8_t block[34];
            qlm_block_quantize_row(block, types[t], 32, w, 32);
            assert_true(qlm_f16_to_f32((uint16_t)(block[0] | block[1] << 8)) == 1.0f);
            for (int j = 1; j < 32; j++) {
                float r = t == 0 ? roundf(w[j]) : roundf(w[j] + 8.0f);
                int lo = t == 0 ? -127 : 0, hi = t == 0 ? 127 : 15;
                int want = r < (float)lo ? lo : r > (float)hi ? hi : (int)r;
                int got = qlm_block_value(block + 2, j, types[t]) + (t == 0 ? 0 : 8);
                if (got != want) fail_msg("%s: %.9g gives %d, roundf %d", t ? "q4_0" : "q8_0", w[j], got, want);
            }
        }
    }
}

static void check_bound(const float *w, const int8_t *q, long n, float s) {
    for (long i = 0; i < n; i++) {
        assert_true(q[i] >= -127 && q[i] <= 127);
        /* s/2 plus float rounding of w/s (a few ulps of |w|). */
        double err = fabs((double)w[i] - (double)q[i] * s);
        if (err > 0.5 * s + 2e-7 * fabs(w[i])) fail_msg("w %g q %d s %g: error %g > s/2", w[i], q[i], s, err);
    }
}

static void test_error_bound(void **state) {
    (void)state;
    const long rows = 64, cols = 301, n = rows * cols;
    float *w = malloc(n * sizeof(float)), *rs = malloc(rows * sizeof(float));
    int8_t *q = malloc(n);
    assert_true(w && rs && q);
    for (long i = 0; i < n; i++) w[i] = frand() * frand() * (i % 97 == 0 ? 10.0f : 0.1f);
    float s = qlm_quantize_i8(q, w, rows, cols);
    check_bound(w, q, n, s);
    int maxq = 0;
    for (long i = 0; i < n; i++) maxq = abs(q[i]) > maxq ? abs(q[i]) : maxq;
    assert_int_equal(maxq, 127);
    qlm_quantize_i8_rows(q, rs, w, rows, cols);
    for (long r = 0; r < rows; r++) {
        check_bound(w + r * cols, q + r * cols, cols, rs[r]);
        int m = 0;
        for (long k = 0; k < cols; k++) m = abs(q[r * cols + k]) > m ? abs(q[r * cols + k]) : m;
        assert_int_equal(m, 127);
    }
    free(w);
    free(rs);
    free(q);
}

static void test_zero_and_tiny(void **state) {
    (void)state;
    float w[2 * 5] = {0};
    int8_t q[10];
    float rs[2];
    memset(q, 7, sizeof q);
    assert_true(qlm_quantize_i8(q, w, 2, 5) == 1.0f);
    for (int i = 0; i < 10; i++) assert_int_equal(q[i], 0);
    /* Row 0 all zero, row 1 so small that max/127 underflows to 0. */
    w[5] = bitsf(1);   /* smallest subnormal */
    w[6] = -bitsf(1);
    qlm_quantize_i8_rows(q, rs, w, 2, 5);
    assert_true(rs[0] == 1.0f && rs[1] == 1.0f);
    for (int i = 0; i < 10; i++) assert_int_equal(q[i], 0);
}

static void test_non_finite(void **state) {
    (void)state;
    const float w[] = {127.0f, INFINITY, -INFINITY, NAN, -0.5f};
    const int8_t want[] = {127, 127, -127, 0, -1};
    int8_t q[5];
    float rs[1];
    assert_true(qlm_quantize_i8(q, w, 1, 5) == 1.0f);
    for (int i = 0; i < 5; i++) assert_int_equal(q[i], want[i]);
    qlm_quantize_i8_rows(q, rs, w, 1, 5);
    assert_true(rs[0] == 1.0f);
    for (int i = 0; i < 5; i++) assert_int_equal(q[i], want[i]);
}

static void test_convert(void **state) {
    (void)state;
    enum { N = 37 };
    float src[N], back[N];
    uint16_t h[N];
    for (int i = 0; i < N; i++) src[i] = frand() * 1000.0f;
    qlm_convert_from_f32(h, QLM_F16, src, N);
    qlm_convert_to_f32(back, h, QLM_F16, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(h[i], qlm_f32_to_f16(src[i]));
        assert_true(back[i] == qlm_f16_to_f32(h[i]));
        assert_true(fabsf(back[i] - src[i]) <= fabsf(src[i]) * 0x1p-11f);
    }
    qlm_convert_from_f32(h, QLM_BF16, src, N);
    qlm_convert_to_f32(back, h, QLM_BF16, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(h[i], qlm_f32_to_bf16(src[i]));
        assert_true(fabsf(back[i] - src[i]) <= fabsf(src[i]) * 0x1p-8f);
    }
    float same[N];
    qlm_convert_from_f32(same, QLM_F32, src, N);
    qlm_convert_to_f32(back, same, QLM_F32, N);
    assert_memory_equal(back, src, sizeof src);
}

static void test_weight_row(void **state) {
    (void)state;
    enum { R = 3, C = 19 };
    float w[R * C], out[C];
    uint16_t h[R * C];
    int8_t q[R * C];
    float rs[R];
    for (int i = 0; i < R * C; i++) w[i] = frand();
    qlm_weight wt = {.dtype = QLM_F32, .rows = R, .cols = C, .data = w};
    qlm_weight_row_f32(&wt, 2, out);
    assert_memory_equal(out, w + 2 * C, sizeof out);

    qlm_convert_from_f32(h, QLM_F16, w, R * C);
    wt = (qlm_weight){.dtype = QLM_F16, .rows = R, .cols = C, .data = h};
    qlm_weight_row_f32(&wt, 1, out);
    for (int k = 0; k < C; k++) assert_true(out[k] == qlm_f16_to_f32(h[C + k]));

    qlm_convert_from_f32(h, QLM_BF16, w, R * C);
    wt.dtype = QLM_BF16;
    qlm_weight_row_f32(&wt, 2, out);
    for (int k = 0; k < C; k++) assert_true(out[k] == qlm_bf16_to_f32(h[2 * C + k]));

    float s = qlm_quantize_i8(q, w, R, C);
    wt = (qlm_weight){.dtype = QLM_I8, .rows = R, .cols = C, .data = q, .scale = s};
    qlm_weight_row_f32(&wt, 1, out);
    for (int k = 0; k < C; k++) assert_true(out[k] == (float)q[C + k] * s);

    qlm_quantize_i8_rows(q, rs, w, R, C);
    wt.row_scales = rs;
    for (int r = 0; r < R; r++) {
        qlm_weight_row_f32(&wt, r, out);
        for (int k = 0; k < C; k++) {
            assert_true(out[k] == (float)q[r * C + k] * rs[r]);
            assert_true(fabsf(out[k] - w[r * C + k]) <= 0.5f * rs[r] * 1.0001f);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_numpy), cmocka_unit_test(test_rounding_ties),
        cmocka_unit_test(test_block_rounding),
        cmocka_unit_test(test_error_bound),   cmocka_unit_test(test_zero_and_tiny),
        cmocka_unit_test(test_non_finite),    cmocka_unit_test(test_convert),
        cmocka_unit_test(test_weight_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
