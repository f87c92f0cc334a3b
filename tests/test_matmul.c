/* qlm_matmul on every supported ISA (scalar, AVX2, AVX-512, AVX-512 with BF16) and qlm_matmul_scalar against a
 * double-precision product of the dequantized weights, for odd shapes (cols not multiples of
 * 8/16/32/64, rows not multiples of 4), n = 1 (GEMV), 2 to 17 (the register-tiled GEMM, every
 * remainder of its x-row block) and 64 (a prefill-sized call), with and
 * without bias; against torch (tests/fixtures/quant/matmul.txt, tools/make_quant_fixtures.py);
 * GEMV results independent of the thread count; the attention kernels (strided dot products and
 * weighted sums) and the vectorized exponential on every ISA.
 *
 * Bound: every path sums exactly-dequantized F32 weights times x in its activation form (F32;
 * rounded to BF16 for BF16 weights; 16-bit integers with a row scale for I8 weights), the same on
 * every path, so the reference puts x in that form too and the error is float summation error:
 * |y - ref| <= 1e-5 * (sum_k |x_k w_k| + |bias|). */
#include <float.h>
#include <math.h>
#include <omp.h>

#include "test_util.h"

#include "core/backend.h"
#include "core/train_formulas.h"
#include "quant/block_pack.h"
#include "quant/block_quant.h"
#include "quant/half.h"
#include "quant/matmul.h"
#include "quant/quantize.h"
#include "quant/x_int_form.h"

#define MATMUL_FIXTURE "tests/fixtures/quant/matmul.txt"
#define REL_TOL 1e-5
/* Rows of x in the largest calls: a prefill chunk. */
#define PREFILL_N 64

static const char *const k_isas[] = {"scalar", "avx2", "avxvnni", "avx512", "avx512vnni", "avx512bf16", "amx"};

typedef struct {
    qlm_dtype dtype;
    int per_row;
    const char *name;
    int group; /* block types */
    int act8;  /* W8A8 */
} kind;

static const kind k_kinds[] = {
    {QLM_F32, 0, "f32", 0, 0},          {QLM_F16, 0, "f16", 0, 0},         {QLM_BF16, 0, "bf16", 0, 0},
    {QLM_I8, 0, "int8", 0, 0},          {QLM_I8, 1, "int8/row", 0, 0},     {QLM_Q8_0, 0, "q8_0/32", 32, 0},
    {QLM_Q4_0, 0, "q4_0/32", 32, 0},    {QLM_Q4_1, 0, "q4_1/32", 32, 0},   {QLM_Q8_0, 0, "q8_0/64", 64, 0},
    {QLM_Q4_0, 0, "q4_0/128", 128, 0},  {QLM_Q4_1, 0, "q4_1/64", 64, 0},   {QLM_Q8_0, 0, "q8_0/32/a8", 32, 1},
    {QLM_Q4_0, 0, "q4_0/32/a8", 32, 1}, {QLM_Q4_1, 0, "q4_1/32/a8", 32, 1}, {QLM_Q8_0, 0, "q8_0/64/a8", 64, 1},
    {QLM_Q4_0, 0, "q4_0/128/a8", 128, 1}, {QLM_Q4_1, 0, "q4_1/64/a8", 64, 1},
};
#define NKINDS (int)(sizeof k_kinds / sizeof k_kinds[0])

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;

static float frand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* A weight in storage dtype plus its exact dequantized values in double. */
typedef struct {
    qlm_weight w;
    void *data;
    float *row_scales;
    double *deq;
} test_weight;

/* Whether weights of kind k can have cols columns (block types: whole blocks). */
static int kind_fits(const kind *k, int cols) {
    return !k->group || cols % k->group == 0;
}

static void make_weight(test_weight *t, const kind *k, const float *src, int rows, int cols) {
    long n = (long)rows * cols;
    t->data = malloc(n * 4 + 1);
    t->row_scales = malloc(rows * sizeof(float));
    t->deq = malloc(n * sizeof(double));
    assert_true(t->data && t->row_scales && t->deq);
    t->w = (qlm_weight){.dtype = k->dtype, .rows = rows, .cols = cols, .data = t->data, .scale = 1.0f, .group = k->group, .act8 = k->act8};
    switch (k->dtype) {
    case QLM_Q8_0:
    case QLM_Q4_0:
    case QLM_Q4_1: {
        size_t stride = qlm_dtype_row_bytes(k->dtype, cols, k->group);
        float *row = malloc((size_t)cols * sizeof *row);
        assert_non_null(row);
        for (int r = 0; r < rows; r++) {
            qlm_block_quantize_row((char *)t->data + r * stride, k->dtype, k->group, src + (long)r * cols, cols);
            qlm_block_dequantize_row(row, k->dtype, k->group, (char *)t->data + r * stride, cols);
            for (int c = 0; c < cols; c++) t->deq[(long)r * cols + c] = row[c];
        }
        free(row);
        if (k->act8) assert_int_equal(qlm_block_to_panels(t->data, k->dtype, k->group, rows, cols), 0);
        break;
    }
    case QLM_I8:
        if (k->per_row) {
            qlm_quantize_i8_rows(t->data, t->row_scales, src, rows, cols);
            t->w.row_scales = t->row_scales;
        } else {
            t->w.scale = qlm_quantize_i8(t->data, src, rows, cols);
        }
        for (long i = 0; i < n; i++)
            t->deq[i] = (double)((int8_t *)t->data)[i] * (k->per_row ? t->row_scales[i / cols] : t->w.scale);
        break;
    case QLM_F16:
    case QLM_BF16:
        qlm_convert_from_f32(t->data, k->dtype, src, n);
        for (long i = 0; i < n; i++) {
            uint16_t h = ((uint16_t *)t->data)[i];
            t->deq[i] = k->dtype == QLM_F16 ? qlm_f16_to_f32(h) : qlm_bf16_to_f32(h);
        }
        break;
    default:
        memcpy(t->data, src, n * sizeof(float));
        for (long i = 0; i < n; i++) t->deq[i] = src[i];
    }
}

static void free_weight(test_weight *t) {
    free(t->data);
    free(t->row_scales);
    free(t->deq);
}

/* x's value in an integer form, written out from its definition: q = x * (qmax / max|x|) rounded
 * to nearest even, times max|x| / qmax (the I16 form: qmax 32767 over the row; the I8 form of
 * W8A8: 127 over each run of 32) for the finite, non-tiny rows the tests use. */
static double i16_value(float x, float absmax, float qmax) {
    float inv = qmax / absmax;
    return (double)rintf(x * inv) * (double)(absmax / qmax);
}

/* Row x[0..cols) as weights w multiply it. */
static void x_for(double *out, const float *x, long cols, const qlm_weight *w) {
    const qlm_dtype dt = w->dtype;
    const long span = w->act8 ? 32 : cols;
    for (long k0 = 0; k0 < cols; k0 += span) {
        float absmax = 0;
        for (long k = k0; k < k0 + span; k++) absmax = fabsf(x[k]) > absmax ? fabsf(x[k]) : absmax;
        for (long k = k0; k < k0 + span; k++)
            out[k] = dt == QLM_BF16                          ? qlm_bf16_to_f32(qlm_f32_to_bf16(x[k]))
                     : dt == QLM_I8 || qlm_dtype_is_block(dt) ? i16_value(x[k], absmax, w->act8 ? 127.0f : 32767.0f)
                                                             : x[k];
    }
}

/* ref = x deq^T + bias in double; mag = the error scale sum |x w| + |bias|. */
static void reference(double *ref, double *mag, const float *x, int n, const test_weight *t, const float *bias) {
    int rows = t->w.rows, cols = t->w.cols;
    double *xf = malloc((size_t)cols * sizeof *xf + 1);
    assert_non_null(xf);
    for (int i = 0; i < n; i++) {
        x_for(xf, x + (size_t)i * cols, cols, &t->w);
        for (int o = 0; o < rows; o++) {
            double s = bias ? bias[o] : 0, m = bias ? fabs(bias[o]) : 0;
            for (int k = 0; k < cols; k++) {
                double p = xf[k] * t->deq[(size_t)o * cols + k];
                s += p;
                m += fabs(p);
            }
            ref[(size_t)i * rows + o] = s;
            mag[(size_t)i * rows + o] = m;
        }
    }
    free(xf);
}

static void check_close(const float *y, const double *ref, const double *mag, long count, const char *what) {
    for (long i = 0; i < count; i++) {
        double err = fabs((double)y[i] - ref[i]);
        if (!(err <= REL_TOL * mag[i] + 1e-30)) fail_msg("%s: y[%ld] = %.9g, reference %.9g (scale %g)", what, i, y[i], ref[i], mag[i]);
    }
}

/* Runs one shape for every kind and ISA, with and without bias. */
static void check_shape(int n, int rows, int cols) {
    long nw = (long)rows * cols, nx = (long)n * cols, ny = (long)n * rows;
    float *src = malloc(nw * sizeof(float)), *x = malloc(nx * sizeof(float)), *bias = malloc(rows * sizeof(float));
    float *y = malloc((ny + 1) * sizeof(float)), *ys = malloc(ny * sizeof(float)), *y_simd = malloc(ny * sizeof(float));
    double *ref = malloc(ny * sizeof(double)), *mag = malloc(ny * sizeof(double));
    assert_true(src && x && bias && y && ys && y_simd && ref && mag);
    for (long i = 0; i < nw; i++) src[i] = frand() * 0.2f;
    for (long i = 0; i < nx; i++) x[i] = frand();
    for (int o = 0; o < rows; o++) bias[o] = frand();
    const char *orig = qlm_matmul_isa();
    for (int ki = 0; ki < NKINDS; ki++) {
        if (!kind_fits(&k_kinds[ki], cols)) continue;
        test_weight t;
        make_weight(&t, &k_kinds[ki], src, rows, cols);
        for (int b = 0; b < 2; b++) {
            const float *bp = b ? bias : NULL;
            char what[128];
            int simd = 0;
            reference(ref, mag, x, n, &t, bp);
            qlm_matmul_scalar(ys, x, n, &t.w, bp);
            snprintf(what, sizeof what, "%s n=%d %dx%d bias=%d scalar ref", k_kinds[ki].name, n, rows, cols, b);
            check_close(ys, ref, mag, ny, what);
            for (size_t ii = 0; ii < sizeof k_isas / sizeof k_isas[0]; ii++) {
                if (qlm_matmul_force_isa(k_isas[ii]) != 0) continue;
                y[ny] = 12345.0f; /* sentinel: nothing may be written past y */
                qlm_matmul(y, x, n, &t.w, bp);
                snprintf(what, sizeof what, "%s n=%d %dx%d bias=%d %s", k_kinds[ki].name, n, rows, cols, b, k_isas[ii]);
                check_close(y, ref, mag, ny, what);
                assert_true(y[ny] == 12345.0f);
                /* W8A8's integer sums are exact: every SIMD kernel set gives the same floats. */
                if (!t.w.act8 || ii == 0) continue;
                if (simd++ == 0) memcpy(y_simd, y, ny * sizeof *y);
                else if (memcmp(y, y_simd, ny * sizeof *y) != 0) fail_msg("%s: not the other ISAs' floats", what);
            }
        }
        free_weight(&t);
    }
    assert_int_equal(qlm_matmul_force_isa(orig), 0);
    free(src);
    free(x);
    free(bias);
    free(y);
    free(ys);
    free(y_simd);
    free(ref);
    free(mag);
}

static void test_odd_shapes(void **state) {
    (void)state;
    static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 13, 17, PREFILL_N};
    static const int rows[] = {1, 3, 4, 5, 13, 37};
    static const int cols[] = {1, 7, 8, 9, 15, 17, 31, 33, 63, 65, 100, 257};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof rows / sizeof rows[0]; b++)
            for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) check_shape(ns[a], rows[b], cols[c]);
}

/* Big enough for several threads, several tiles per thread and a ragged last tile. */
static void test_threaded_shapes(void **state) {
    (void)state;
    check_shape(1, 1003, 577);
    check_shape(2, 1003, 577);
    check_shape(9, 1003, 577);
    check_shape(16, 1003, 577);
    check_shape(24, 517, 1539);
    check_shape(PREFILL_N, 517, 1539);
    check_shape(3, 37, 5000); /* I8 rows in several integer blocks */
}

/* Block weights: widths of whole blocks of every group, rows not multiples of 4, every remainder
 * of the x-row tiles, and the default model's shapes. */
static void test_block_shapes(void **state) {
    (void)state;
    static const int ns[] = {1, 2, 3, 4, 5, 7, 17};
    static const int rows[] = {1, 5, 37};
    static const int cols[] = {32, 64, 96, 128, 384};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof rows / sizeof rows[0]; b++)
            for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) check_shape(ns[a], rows[b], cols[c]);
    check_shape(1, 1536, 576);
    check_shape(PREFILL_N, 576, 1536);
}

/* qlm_matmul_group gives each product exactly what qlm_matmul gives it (the shared region splits
 * rows differently, and results must not depend on the split), for q/k/v-like shapes in every
 * kind, and falls back to one call each when widths or dtypes differ; the product that adds (the
 * second) gives what y held plus that product. */
static void matmul_group_width(int cols) {
    static const int rows[] = {576, 192, 190};
    const int n_max = 7;
    float *src = malloc((size_t)576 * cols * sizeof *src), *x = malloc((size_t)n_max * cols * sizeof *x);
    float *bias = malloc(576 * sizeof *bias), *y[3], *ref = malloc((size_t)n_max * 576 * sizeof *ref);
    assert_true(src && x && bias && ref);
    for (int i = 0; i < 576 * cols; i++) src[i] = frand() * 0.2f;
    for (int i = 0; i < n_max * cols; i++) x[i] = frand();
    for (int i = 0; i < 576; i++) bias[i] = frand();
    for (int p = 0; p < 3; p++) assert_non_null(y[p] = malloc((size_t)n_max * rows[p] * sizeof *y[p]));
    for (int ki = 0; ki < NKINDS; ki++) {
        if (!kind_fits(&k_kinds[ki], cols)) continue;
        test_weight t[3];
        qlm_matmul_out outs[3];
        for (int p = 0; p < 3; p++) {
            /* The last weight is F32 in one round, so that the group mixes dtypes. */
            make_weight(&t[p], &k_kinds[p == 2 && ki == NKINDS - 1 ? 0 : ki], src, rows[p], cols);
            outs[p] = (qlm_matmul_out){y[p], &t[p].w, p == 1 ? bias : NULL, p == 1};
        }
        for (int n = 1; n <= n_max; n += 3) {
            for (int i = 0; i < n * rows[1]; i++) y[1][i] = (float)i;
            assert_int_equal(qlm_matmul_group(outs, 3, x, n), 0);
            for (int p = 0; p < 3; p++) {
                qlm_matmul(ref, x, n, &t[p].w, outs[p].bias);
                if (outs[p].add)
                    for (int i = 0; i < n * rows[p]; i++) ref[i] += (float)i;
                assert_memory_equal(y[p], ref, (size_t)n * rows[p] * sizeof *ref);
            }
        }
        for (int p = 0; p < 3; p++) free_weight(&t[p]);
    }
    for (int p = 0; p < 3; p++) free(y[p]);
    free(src);
    free(x);
    free(bias);
    free(ref);
}

static void test_matmul_group(void **state) {
    (void)state;
    matmul_group_width(97);
    matmul_group_width(128);
}

/* A weight whose rows are interleaved for RoPE (rope_heads, a GGUF's Q/K used where they lie) gives
 * the products of the same weight in PyTorch's order, bit for bit, biases included: alone, beside
 * others in a group, and in the scalar reference; and its rows read back in PyTorch's order. */
static void test_rope_rows(void **state) {
    (void)state;
    enum { ROWS = 576, HEADS = 9, COLS = 128, N = 5 };
    float *src = malloc((size_t)ROWS * COLS * sizeof *src), *stored = malloc((size_t)ROWS * COLS * sizeof *stored);
    float *x = malloc((size_t)N * COLS * sizeof *x), *bias = malloc(ROWS * sizeof *bias);
    float *ya = malloc((size_t)N * ROWS * sizeof *ya), *yb = malloc((size_t)N * ROWS * sizeof *yb);
    float *yv = malloc((size_t)N * 192 * sizeof *yv), *yv_ref = malloc((size_t)N * 192 * sizeof *yv_ref);
    float *row_a = malloc(COLS * sizeof *row_a), *row_b = malloc(COLS * sizeof *row_b);
    assert_true(src && stored && x && bias && ya && yb && yv && yv_ref && row_a && row_b);
    for (int i = 0; i < ROWS * COLS; i++) src[i] = frand() * 0.2f;
    for (int i = 0; i < N * COLS; i++) x[i] = frand();
    for (int i = 0; i < ROWS; i++) bias[i] = frand();
    for (int r = 0; r < ROWS; r++)
        memcpy(stored + qlm_rope_stored_row(r, ROWS, HEADS) * COLS, src + (size_t)r * COLS, COLS * sizeof *src);
    for (int ki = 0; ki < NKINDS; ki++) {
        test_weight a, b, v;
        make_weight(&a, &k_kinds[ki], src, ROWS, COLS);
        make_weight(&b, &k_kinds[ki], stored, ROWS, COLS);
        make_weight(&v, &k_kinds[ki], src, 192, COLS);
        b.w.rope_heads = HEADS;
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *bi = with_bias ? bias : NULL;
            qlm_matmul(ya, x, N, &a.w, bi);
            qlm_matmul(yb, x, N, &b.w, bi);
            assert_memory_equal(ya, yb, (size_t)N * ROWS * sizeof *ya);
            qlm_matmul(yv_ref, x, N, &v.w, bi);
            const qlm_matmul_out outs[2] = {{yb, &b.w, bi, 0}, {yv, &v.w, bi, 0}};
            memset(yb, 0, (size_t)N * ROWS * sizeof *yb);
            assert_int_equal(qlm_matmul_group(outs, 2, x, N), 0);
            assert_memory_equal(ya, yb, (size_t)N * ROWS * sizeof *ya);
            assert_memory_equal(yv, yv_ref, (size_t)N * 192 * sizeof *yv);
            qlm_matmul_scalar(ya, x, N, &a.w, bi);
            qlm_matmul_scalar(yb, x, N, &b.w, bi);
            assert_memory_equal(ya, yb, (size_t)N * ROWS * sizeof *ya);
        }
        for (int r = 0; r < ROWS; r += 7) {
            qlm_weight_row_f32(&a.w, r, row_a);
            qlm_weight_row_f32(&b.w, r, row_b);
            assert_memory_equal(row_a, row_b, COLS * sizeof *row_a);
        }
        free_weight(&a);
        free_weight(&b);
        free_weight(&v);
    }
    free(src);
    free(stored);
    free(x);
    free(bias);
    free(ya);
    free(yb);
    free(yv);
    free(yv_ref);
    free(row_a);
    free(row_b);
}

/* The largest products the I16 form makes (|q| = 32767 against |w| = 127, all of one sign) over
 * long rows, one width for the vector kernels and one for AMX's tiles (a multiple of 64), one row
 * of x and 17 (the tiles' two layouts), rows of x of both signs (the tiles' high byte -128 and low
 * byte 255 of q = -32767 and 32767): integer partial sums must not overflow on any path. */
static void test_i8_extreme_sums(void **state) {
    (void)state;
    enum { ROWS = 5, N = 17 };
    static const int widths[] = {12000, 12032};
    for (int wi = 0; wi < 2; wi++) {
        const int cols = widths[wi];
        float *src = malloc((size_t)ROWS * cols * sizeof *src), *x = malloc((size_t)N * cols * sizeof *x), y[N * ROWS];
        assert_true(src && x);
        for (long i = 0; i < (long)ROWS * cols; i++) src[i] = i / cols == 2 ? -1.0f : 1.0f;
        for (long i = 0; i < (long)N * cols; i++) x[i] = i / cols % 2 ? -3.0f : 3.0f;
        test_weight t;
        make_weight(&t, &k_kinds[3], src, ROWS, cols);
        const char *orig = qlm_matmul_isa();
        for (size_t ii = 0; ii < sizeof k_isas / sizeof k_isas[0]; ii++) {
            if (qlm_matmul_force_isa(k_isas[ii]) != 0) continue;
            for (int n = 1; n <= N; n += N - 1) {
                qlm_matmul(y, x, n, &t.w, NULL);
                for (int i = 0; i < n; i++)
                    for (int o = 0; o < ROWS; o++) {
                        double want = (o == 2 ? -3.0 : 3.0) * (i % 2 ? -1 : 1) * cols;
                        if (!(fabs(y[i * ROWS + o] - want) <= 1e-5 * fabs(want)))
                            fail_msg("%s %d cols n=%d: y[%d][%d] = %.9g, want %.9g", k_isas[ii], cols, n, i, o, y[i * ROWS + o], want);
                    }
            }
            /* A NaN or infinity in x makes every product NaN, as it would with F32 x. */
            for (int bad = 0; bad < 2; bad++) {
                x[cols - 3] = bad ? INFINITY : NAN;
                qlm_matmul(y, x, 1, &t.w, NULL);
                for (int o = 0; o < ROWS; o++)
                    if (!isnan(y[o])) fail_msg("%s: y[%d] = %.9g with x[%d] = %g, want NaN", k_isas[ii], o, y[o], cols - 3, x[cols - 3]);
                x[cols - 3] = 3.0f;
            }
        }
        assert_int_equal(qlm_matmul_force_isa(orig), 0);
        free_weight(&t);
        free(src);
        free(x);
    }
}

/* On the amx table, I8 weights whose rows are whole 64 columns (up to 65,536) take the tiles, and
 * each output is the exact integer dot product of x's I16 form and W, rounded once to F32, times
 * x's scale and then W's (per tensor or per row), plus the bias: checked bit for bit against that
 * sum in 64-bit integers, for both layouts of the tiles (1, 5, 16 and 21 rows of x) and outputs
 * that end inside a block of 16. */
static void test_i8_tiles_exact(void **state) {
    (void)state;
    const char *orig = qlm_matmul_isa();
    if (qlm_matmul_force_isa("amx") != 0) {
        print_message("no AMX here: the I8 tiles are not tested\n");
        return;
    }
    enum { ROWS = 37 };
    static const int widths[] = {64, 576, 12032}, ns[] = {1, 5, 16, 21};
    for (int wi = 0; wi < 3; wi++) {
        const int cols = widths[wi], nmax = 21;
        float *src = malloc((size_t)ROWS * cols * sizeof *src), *x = malloc((size_t)nmax * cols * sizeof *x);
        float *y = malloc((size_t)nmax * ROWS * sizeof *y), bias[ROWS];
        int16_t *q = malloc((size_t)nmax * cols * sizeof *q);
        float xs[21];
        assert_true(src && x && y && q);
        for (long i = 0; i < (long)ROWS * cols; i++) src[i] = frand();
        for (long i = 0; i < (long)nmax * cols; i++) x[i] = frand() * 5.0f;
        for (int o = 0; o < ROWS; o++) bias[o] = frand();
        for (int i = 0; i < nmax; i++) {
            float absmax = 0;
            for (int k = 0; k < cols; k++) absmax = fmaxf(absmax, fabsf(x[(long)i * cols + k]));
            const float inv = 32767.0f / absmax;
            xs[i] = absmax / 32767.0f;
            for (int k = 0; k < cols; k++) q[(long)i * cols + k] = (int16_t)rintf(x[(long)i * cols + k] * inv);
        }
        for (int per_row = 0; per_row < 2; per_row++) {
            test_weight t;
            make_weight(&t, &k_kinds[3 + per_row], src, ROWS, cols);
            for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
                for (int b = 0; b < 2; b++) {
                    qlm_matmul(y, x, ns[a], &t.w, b ? bias : NULL);
                    for (int i = 0; i < ns[a]; i++)
                        for (int o = 0; o < ROWS; o++) {
                            int64_t sum = 0;
                            for (int k = 0; k < cols; k++) sum += (int64_t)q[(long)i * cols + k] * ((int8_t *)t.data)[(long)o * cols + k];
                            float want = (float)sum * xs[i] * (per_row ? t.row_scales[o] : t.w.scale);
                            if (b) want += bias[o];
                            if (y[(long)i * ROWS + o] != want)
                                fail_msg("%s %d cols n=%d bias=%d: y[%d][%d] = %.9g, want %.9g", k_kinds[3 + per_row].name, cols,
                                         ns[a], b, i, o, y[(long)i * ROWS + o], want);
                        }
                }
            free_weight(&t);
        }
        free(src);
        free(x);
        free(y);
        free(q);
    }
    assert_int_equal(qlm_matmul_force_isa(orig), 0);
}

/* W8A8 at its extremes: Q8_0 values of -128 and 127 and Q4 nibbles of 0 and 15 against x of
 * +-127 in the I8 form, signs lined up so every product pair is as large as it gets (VPMADDUBSW's
 * 16-bit pairs saturate past 32,767; Q8_0 made unsigned as v + 128 would reach 64,770). Every
 * ISA's sum is the exact one, and the SIMD kernels (VPDPBUSD and VPMADDUBSW) agree bit for bit. */
static void test_w8a8_extreme_bytes(void **state) {
    (void)state;
    enum { ROWS = 2 * QLM_PANEL_ROWS + 3, COLS = 256, N = 21 }; /* 16 rows of x for AMX, 5 for the rest */
    static const qlm_dtype dts[] = {QLM_Q8_0, QLM_Q4_0, QLM_Q4_1};
    float x[N * COLS], y[N * ROWS], first[N * ROWS];
    for (int i = 0; i < N; i++)
        for (int k = 0; k < COLS; k++) x[i * COLS + k] = (k / 3 + i) % 2 ? 1.0f : -1.0f;
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
        const qlm_dtype dt = dts[di];
        const size_t row_bytes = qlm_dtype_row_bytes(dt, COLS, 32), bb = qlm_dtype_block_bytes(dt, 32);
        const int head = dt == QLM_Q4_1 ? 4 : 2; /* the F16 scale (Q4_1: and offset) */
        uint8_t *data = malloc((size_t)ROWS * row_bytes);
        double want[N * ROWS];
        assert_non_null(data);
        for (int r = 0; r < ROWS; r++)
            for (int b = 0; b < COLS / 32; b++) {
                uint8_t *blk = data + (size_t)r * row_bytes + (size_t)b * bb;
                blk[0] = 0x00, blk[1] = 0x3C; /* d = 1 */
                if (dt == QLM_Q4_1) blk[2] = 0x00, blk[3] = 0xC8; /* m = -8 */
                for (int j = 0; j < 32; j++) {
                    /* the extreme of x's sign at column k, or (rows past r % 3 == 0) the other */
                    const int k = b * 32 + j, up = ((k / 3) % 2 == 1) != (r % 3 == 0);
                    if (dt == QLM_Q8_0)
                        ((int8_t *)blk + head)[j] = (int8_t)(up ? 127 : -128);
                    else
                        blk[head + j % 16] = (uint8_t)((blk[head + j % 16] & (j < 16 ? 0xF0 : 0x0F)) |
                                                       (up ? 15 : 0) << (j < 16 ? 0 : 4));
                }
            }
        for (int i = 0; i < N; i++)
            for (int r = 0; r < ROWS; r++) {
                double s = 0;
                for (int k = 0; k < COLS; k++) {
                    const int up = ((k / 3) % 2 == 1) != (r % 3 == 0);
                    const double w = dt == QLM_Q8_0 ? (up ? 127 : -128) : (up ? 7 : -8); /* Q4: 15 - 8, 0 - 8 */
                    s += w * x[i * COLS + k];
                }
                want[i * ROWS + r] = s;
            }
        assert_int_equal(qlm_block_to_panels(data, dt, 32, ROWS, COLS), 0);
        const qlm_weight w = {.dtype = dt, .rows = ROWS, .cols = COLS, .data = data, .scale = 1.0f, .group = 32, .act8 = 1};
        const char *orig = qlm_matmul_isa();
        int simd = 0;
        for (size_t ii = 0; ii < sizeof k_isas / sizeof k_isas[0]; ii++) {
            if (qlm_matmul_force_isa(k_isas[ii]) != 0) continue;
            qlm_matmul(y, x, N, &w, NULL);
            for (int o = 0; o < N * ROWS; o++)
                if (!(fabs(y[o] - want[o]) <= 1e-5 * fabs(want[o])))
                    fail_msg("%s %s: y[%d] = %.9g, want %.9g", k_isas[ii], qlm_dtype_name(dt), o, y[o], want[o]);
            if (ii == 0) continue;
            if (simd++ == 0) memcpy(first, y, sizeof y);
            else assert_memory_equal(y, first, sizeof y);
        }
        assert_int_equal(qlm_matmul_force_isa(orig), 0);
        free(data);
    }
}

/* W8A8's panels hold the rows' bytes reordered: every row comes back out of its panel as it went
 * in, the whole matrix back from panels, and rows past the last panel never move. */
static void test_panels_round_trip(void **state) {
    (void)state;
    const int rows = 2 * QLM_PANEL_ROWS + 5, cols = 256;
    for (int ki = 0; ki < NKINDS; ki++) {
        const kind *k = &k_kinds[ki];
        if (!k->act8) continue;
        const size_t row_bytes = qlm_dtype_row_bytes(k->dtype, cols, k->group), bytes = (size_t)rows * row_bytes;
        uint8_t *orig = malloc(bytes), *data = malloc(bytes), *row = malloc(row_bytes);
        assert_true(orig && data && row);
        for (size_t i = 0; i < bytes; i++) orig[i] = (uint8_t)(frand() * 127.0f + 128.0f);
        memcpy(data, orig, bytes);
        assert_int_equal(qlm_block_to_panels(data, k->dtype, k->group, rows, cols), 0);
        assert_true(memcmp(data, orig, bytes) != 0);
        const size_t bb = qlm_dtype_block_bytes(k->dtype, k->group);
        uint8_t room[QLM_BLOCK_MAX_BYTES];
        for (int r = 0; r < qlm_panel_rows(rows); r++) {
            for (long b = 0; b < cols / k->group; b++)
                memcpy(row + b * bb, qlm_panels_block(data, k->dtype, k->group, rows, cols, r, b, room), bb);
            assert_memory_equal(row, orig + (size_t)r * row_bytes, row_bytes);
        }
        assert_memory_equal(data + (size_t)qlm_panel_rows(rows) * row_bytes, orig + (size_t)qlm_panel_rows(rows) * row_bytes,
                            (size_t)(rows - qlm_panel_rows(rows)) * row_bytes);
        assert_int_equal(qlm_block_from_panels(data, k->dtype, k->group, rows, cols), 0);
        assert_memory_equal(data, orig, bytes);
        free(orig);
        free(data);
        free(row);
    }
}

/* GEMV rows are split among threads in whole kernel groups, so results do not depend on it. */
static void thread_count_width(const int cols) {
    const int rows = 333;
    float *src = malloc(rows * cols * sizeof(float)), *x = malloc(3 * cols * sizeof(float));
    float *y1 = malloc(3 * rows * sizeof(float)), *y2 = malloc(3 * rows * sizeof(float));
    assert_true(src && x && y1 && y2);
    for (int i = 0; i < rows * cols; i++) src[i] = frand();
    for (int i = 0; i < 3 * cols; i++) x[i] = frand();
    int saved = omp_get_max_threads();
    for (int ki = 0; ki < NKINDS; ki++) {
        if (!kind_fits(&k_kinds[ki], cols)) continue;
        test_weight t;
        make_weight(&t, &k_kinds[ki], src, rows, cols);
        omp_set_num_threads(1);
        qlm_matmul(y1, x, 3, &t.w, NULL);
        omp_set_num_threads(3);
        qlm_matmul(y2, x, 3, &t.w, NULL);
        assert_memory_equal(y1, y2, 3 * rows * sizeof(float));
        free_weight(&t);
    }
    omp_set_num_threads(saved);
    free(src);
    free(x);
    free(y1);
    free(y2);
}

static void test_thread_count_invariance(void **state) {
    (void)state;
    thread_count_width(129);
    thread_count_width(128);
}

/* A row of x gets the same floats whatever rows share its call (a sequence decodes the same alone
 * and in a batch, and a prompt's last row as its decode would), on every ISA and dtype: x's rows
 * alone, in a call of 17 from row 3, and all 40 in one. Widths of whole 32 columns take BF16
 * through AMX's tiles where the CPU has them, with fewer than 16 rows of x and with more (two
 * layouts), over weights that end inside a block of 16 rows. */
static void batch_width(const int rows, const int cols) {
    const int n = 40, part = 17, from = 3;
    float *src = malloc((size_t)rows * cols * sizeof(float)), *x = malloc((size_t)n * cols * sizeof(float));
    float *all = malloc((size_t)n * rows * sizeof(float)), *some = malloc((size_t)part * rows * sizeof(float));
    float *one = malloc((size_t)rows * sizeof(float));
    assert_true(src && x && all && some && one);
    for (long i = 0; i < (long)rows * cols; i++) src[i] = frand();
    for (long i = 0; i < (long)n * cols; i++) x[i] = frand();
    const char *orig = qlm_matmul_isa();
    for (size_t ii = 0; ii < sizeof k_isas / sizeof k_isas[0]; ii++) {
        if (qlm_matmul_force_isa(k_isas[ii]) != 0) continue;
        for (int ki = 0; ki < NKINDS; ki++) {
            if (!kind_fits(&k_kinds[ki], cols)) continue;
            test_weight t;
            make_weight(&t, &k_kinds[ki], src, rows, cols);
            qlm_matmul(all, x, n, &t.w, NULL);
            qlm_matmul(some, x + (size_t)from * cols, part, &t.w, NULL);
            for (int i = 0; i < n; i++) {
                qlm_matmul(one, x + (size_t)i * cols, 1, &t.w, NULL);
                if (memcmp(one, all + (size_t)i * rows, rows * sizeof *one) != 0)
                    fail_msg("%s %dx%d %s: row %d alone differs from the call of %d", k_kinds[ki].name, rows, cols, k_isas[ii], i, n);
                if (i >= from && i < from + part && memcmp(one, some + (size_t)(i - from) * rows, rows * sizeof *one) != 0)
                    fail_msg("%s %dx%d %s: row %d alone differs from the call of %d", k_kinds[ki].name, rows, cols, k_isas[ii], i, part);
            }
            free_weight(&t);
        }
    }
    assert_int_equal(qlm_matmul_force_isa(orig), 0);
    free(src);
    free(x);
    free(all);
    free(some);
    free(one);
}

static void test_batch_invariance(void **state) {
    (void)state;
    batch_width(37, 64);
    batch_width(100, 576);
    batch_width(21, 40);
}

/* The attention kernels on every ISA: scores of n query rows (5, and 20: AMX's two layouts, and
 * the keys across the lanes of AVX-512's and AVX2's prefill) against strided key rows, each row's the same
 * alone, and the weighted sum of strided value rows, for head sizes that are not multiples of the
 * vector width, with F32 keys and values, with BF16 ones (the queries then rounded to BF16 as
 * well) and with F16 ones. */
static double round_to(float v, qlm_dtype dt) {
    if (dt == QLM_BF16) return qlm_bf16_to_f32(qlm_f32_to_bf16(v));
    return dt == QLM_F16 ? qlm_f16_to_f32(qlm_f32_to_f16(v)) : v;
}

static void test_attention_kernels(void **state) {
    (void)state;
    static const int dims[] = {1, 7, 16, 17, 48, 55, 64, 70, 128};
    const int most = 20, rows = 37, stride = 300;
    float *kv = malloc((size_t)rows * stride * sizeof *kv), *x = malloc((size_t)most * 128 * sizeof *x);
    uint16_t *kvb = malloc((size_t)rows * stride * sizeof *kvb), *kvh = malloc((size_t)rows * stride * sizeof *kvh);
    float *xb = malloc((size_t)most * 128 * sizeof *xb), *one = malloc((size_t)rows * sizeof *one);
    float *y = malloc((size_t)most * rows * sizeof *y), *o = malloc((size_t)most * 128 * sizeof *o);
    double *ref = malloc((size_t)most * 128 * sizeof *ref), *mag = malloc((size_t)most * 128 * sizeof *mag); /* rows < 128 */
    assert_true(kv && x && kvb && kvh && xb && one && y && o && ref && mag);
    for (int i = 0; i < rows * stride; i++) kv[i] = frand();
    qlm_convert_from_f32(kvb, QLM_BF16, kv, (long)rows * stride);
    qlm_convert_from_f32(kvh, QLM_F16, kv, (long)rows * stride);
    const char *orig = qlm_matmul_isa();
    static const qlm_dtype kv_dtypes[] = {QLM_F32, QLM_BF16, QLM_F16};
    for (int pass = 0; pass < 6; pass++) {
        const int n = pass < 3 ? 5 : most, bf = kv_dtypes[pass % 3] == QLM_BF16;
        const qlm_dtype dt = kv_dtypes[pass % 3];
        const char *base = dt == QLM_F32 ? (const char *)kv : (const char *)(bf ? kvb : kvh);
        const size_t esize = dt == QLM_F32 ? sizeof(float) : sizeof(uint16_t);
        const void *keys = base + 3 * esize, *values = base + 5 * esize;
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            int hd = dims[di];
            for (int i = 0; i < n * hd; i++) x[i] = frand();
            for (size_t ii = 0; ii < sizeof k_isas / sizeof k_isas[0]; ii++) {
                if (qlm_matmul_force_isa(k_isas[ii]) != 0) continue;
                char what[96];
                /* BF16 keys meet x in the form of the kernels in use. */
                for (int i = 0; bf && i < n; i++)
                    qlm_bf16_x_form((char *)xb + (size_t)i * hd * qlm_bf16_x_size(), x + i * hd, hd);
                const size_t x_row = bf ? hd * qlm_bf16_x_size() : hd * sizeof(float);
                qlm_dot_rows(y, rows, bf ? (const void *)xb : x, n, keys, stride, rows, hd, dt);
                for (int i = 0; i < n; i++) {
                    qlm_dot_rows(one, rows, (const char *)(bf ? (const void *)xb : x) + i * x_row, 1, keys, stride, rows, hd, dt);
                    if (memcmp(one, y + (size_t)i * rows, rows * sizeof *one) != 0)
                        fail_msg("dot_rows %s hd=%d %s: query %d alone differs from the call of %d", qlm_dtype_name(dt), hd,
                                 k_isas[ii], i, n);
                }
                for (int i = 0; i < n; i++)
                    for (int r = 0; r < rows; r++) {
                        double s = 0, m = 0;
                        for (int d = 0; d < hd; d++) {
                            double p = round_to(x[i * hd + d], bf ? QLM_BF16 : QLM_F32) *
                                       round_to(kv[(size_t)r * stride + 3 + d], dt);
                            s += p;
                            m += fabs(p);
                        }
                        ref[i * rows + r] = s, mag[i * rows + r] = m;
                    }
                snprintf(what, sizeof what, "dot_rows %s hd=%d %s", qlm_dtype_name(dt), hd, k_isas[ii]);
                check_close(y, ref, mag, (long)n * rows, what);
                /* x as n rows of weights over the key rows: o = x0 + x[:, :rows] V. */
                for (int i = 0; i < n * hd; i++) o[i] = x[i];
                qlm_weighted_sum(o, y, n, rows, values, stride, rows, hd, dt);
                for (int i = 0; i < n; i++)
                    for (int d = 0; d < hd; d++) {
                        double s = x[i * hd + d], m = fabs(s);
                        for (int t = 0; t < rows; t++) {
                            double p = (double)y[i * rows + t] * round_to(kv[(size_t)t * stride + 5 + d], dt);
                            s += p;
                            m += fabs(p);
                        }
                        ref[i * hd + d] = s, mag[i * hd + d] = m;
                    }
                snprintf(what, sizeof what, "weighted_sum %s hd=%d %s", qlm_dtype_name(dt), hd, k_isas[ii]);
                check_close(o, ref, mag, (long)n * hd, what);
            }
        }
    }
    assert_int_equal(qlm_matmul_force_isa(orig), 0);
    free(kv), free(x), free(kvb), free(kvh), free(xb), free(one), free(y), free(o), free(ref), free(mag);
}

/* Units in the last place between a and the double b, at b's scale. */
static double ulps(float a, double b) {
    int e;
    frexp(b, &e);
    return fabs((double)a - b) / ldexp(1.0, e - 24);
}

/* qlm_exp_f32 on every ISA against exp in double: within 2 ulp wherever e^x is at least 3e-38,
 * 0 or the subnormal below that, +inf past FLT_MAX, e^-inf = 0, NaN kept; for every length up to
 * past a vector (the tails: nothing past n is touched, and each value is the one a long call
 * gives). */
static void test_exp(void **state) {
    (void)state;
    enum { N = 20000 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    assert_true(x && y);
    for (int i = 0; i < N - 8; i++) x[i] = -110.0f + 206.0f * (float)i / (N - 8);
    const float specials[8] = {-INFINITY, INFINITY, NAN, 0.0f, -0.0f, 1e-40f, 88.72283935546875f, 88.7228470f};
    memcpy(x + N - 8, specials, sizeof specials);
    const char *orig = qlm_matmul_isa();
    for (size_t ii = 0; ii < sizeof k_isas / sizeof k_isas[0]; ii++) {
        if (qlm_matmul_force_isa(k_isas[ii]) != 0) continue;
        double worst = 0;
        memcpy(y, x, N * sizeof *y);
        qlm_exp_f32(y, N);
        for (int i = 0; i < N; i++) {
            double ref = exp((double)x[i]);
            if (isnan(x[i])) {
                assert_true(isnan(y[i]));
            } else if (ref > FLT_MAX * (1.0 + 0x1p-24)) {
                if (!isinf(y[i])) fail_msg("%s: exp(%.9g) = %.9g, want inf", k_isas[ii], x[i], y[i]);
            } else if (ref >= 3e-38) {
                double u = ulps(y[i], ref);
                if (u > 2) fail_msg("%s: exp(%.9g) = %.9g, reference %.9g (%.2f ulp)", k_isas[ii], x[i], y[i], ref, u);
                if (u > worst) worst = u;
            } else if (!(y[i] == 0.0f || fabs((double)y[i] - ref) <= 0x1p-149)) {
                fail_msg("%s: exp(%.9g) = %.9g, want 0 or %.9g", k_isas[ii], x[i], y[i], ref);
            }
        }
        for (int n = 1; n <= 40; n++) {
            float v[41];
            for (int i = 0; i < n; i++) v[i] = x[i * 397 % (N - 8)];
            v[n] = 12345.0f;
            qlm_exp_f32(v, n);
            assert_true(v[n] == 12345.0f);
            for (int i = 0; i < n; i++) assert_true(v[i] == y[i * 397 % (N - 8)]);
        }
        print_message("exp %-10s worst %.2f ulp\n", k_isas[ii], worst);
    }
    assert_int_equal(qlm_matmul_force_isa(orig), 0);
    free(x);
    free(y);
}

/* qlm_matmul_i8_xw, the product x W of an INT8 weight's backward, on the amx table: each output
 * the exact integer sum of x's 24-bit form (after per-channel scales) and W's column, rounded once,
 * times x's row scale and W's tensor scale (and added onto y with accumulate), bit for bit against
 * that sum in 64-bit integers, for W's rows of one and several 64-row chunks, outputs that end
 * inside a block of 16, and 16 or more rows of x, one of them spanning 2^-20..1 as the head's
 * softmax probabilities do. Elsewhere, and where it does not apply (15 rows of x, 100 rows of W),
 * it returns -1 and writes nothing. */
static void test_i8_xw_exact(void **state) {
    (void)state;
    static const int rows_of[] = {64, 576, 1088}, cols_of[] = {40, 128, 577}, ns[] = {16, 21, 64};
    const char *orig = qlm_matmul_isa();
    const int amx = qlm_matmul_force_isa("amx") == 0;
    if (!amx) print_message("no AMX here: only the refusal of qlm_matmul_i8_xw is tested\n");
    for (int ri = 0; ri < 3; ri++)
        for (int ci = 0; ci < 3; ci++) {
            const int R = rows_of[ri], C = cols_of[ci], nmax = 64;
            float *src = malloc((size_t)R * C * sizeof *src), *x = malloc((size_t)nmax * R * sizeof *x);
            float *y = malloc((size_t)nmax * C * sizeof *y), *old = malloc((size_t)nmax * C * sizeof *old);
            float *xr = malloc((size_t)R * sizeof *xr);
            int32_t *q = malloc((size_t)R * sizeof *q);
            assert_true(src && x && y && old && xr && q);
            for (long i = 0; i < (long)R * C; i++) src[i] = frand();
            for (long i = 0; i < (long)nmax * R; i++) x[i] = frand() * 3.0f;
            for (int o = 0; o < R; o++) x[R + o] = ldexpf(frand(), -(o % 21));
            for (long i = 0; i < (long)nmax * C; i++) old[i] = frand();
            for (int per_row = 0; per_row < 2; per_row++) {
                test_weight t;
                make_weight(&t, &k_kinds[3 + per_row], src, R, C);
                const int8_t *wq = t.data;
                for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
                    for (int acc = 0; acc < 2; acc++) {
                        const int n = ns[a];
                        memcpy(y, old, (size_t)n * C * sizeof *y);
                        if (!amx) {
                            assert_int_equal(qlm_matmul_i8_xw(y, x, n, &t.w, acc), -1);
                            assert_memory_equal(y, old, (size_t)n * C * sizeof *y);
                            continue;
                        }
                        assert_int_equal(qlm_matmul_i8_xw(y, x, n, &t.w, acc), 0);
                        for (int i = 0; i < n; i++) {
                            float absmax = 0;
                            for (int o = 0; o < R; o++) {
                                xr[o] = per_row ? x[(long)i * R + o] * t.row_scales[o] : x[(long)i * R + o];
                                absmax = fmaxf(absmax, fabsf(xr[o]));
                            }
                            const float inv = QLM_I24_MAX / absmax, xs = absmax / QLM_I24_MAX;
                            for (int o = 0; o < R; o++) q[o] = (int32_t)rintf(xr[o] * inv);
                            for (int k = 0; k < C; k++) {
                                int64_t sum = 0;
                                for (int o = 0; o < R; o++) sum += (int64_t)q[o] * wq[(long)o * C + k];
                                float want = (float)sum * xs * (per_row ? 1.0f : t.w.scale);
                                if (acc) want = old[(long)i * C + k] + want;
                                if (y[(long)i * C + k] != want)
                                    fail_msg("%s %dx%d n=%d acc=%d: y[%d][%d] = %.9g, want %.9g", k_kinds[3 + per_row].name, R,
                                             C, n, acc, i, k, y[(long)i * C + k], want);
                            }
                        }
                    }
                memcpy(y, old, (size_t)15 * C * sizeof *y);
                assert_int_equal(qlm_matmul_i8_xw(y, x, 15, &t.w, 1), -1);
                assert_memory_equal(y, old, (size_t)15 * C * sizeof *y);
                free_weight(&t);
            }
            free(src), free(x), free(y), free(old), free(xr), free(q);
        }
    /* W's rows not whole chunks of 64, and a table without the tiles. */
    test_weight t;
    float *src = malloc(100 * 64 * sizeof *src), *x = malloc(16 * 100 * sizeof *x), y[16 * 64];
    assert_true(src && x);
    for (int i = 0; i < 100 * 64; i++) src[i] = frand();
    for (int i = 0; i < 16 * 100; i++) x[i] = frand();
    make_weight(&t, &k_kinds[3], src, 100, 64);
    assert_int_equal(qlm_matmul_i8_xw(y, x, 16, &t.w, 0), -1);
    free_weight(&t);
    make_weight(&t, &k_kinds[3], src, 64, 100);
    if (qlm_matmul_force_isa("avx512bf16") == 0) assert_int_equal(qlm_matmul_i8_xw(y, x, 16, &t.w, 0), -1);
    if (qlm_matmul_force_isa("scalar") == 0) assert_int_equal(qlm_matmul_i8_xw(y, x, 16, &t.w, 0), -1);
    free_weight(&t);
    free(src), free(x);
    assert_int_equal(qlm_matmul_force_isa(orig), 0);
}

/* Dropout on every ISA against core/train_formulas.h's draw element by element, bit for bit (x
 * with NaN and infinities too), for every length up to 40 and long ones, offsets into a tensor
 * past 2^32, in place as well; and the formula drops about p of the elements. */
static void test_dropout(void **state) {
    (void)state;
    enum { N = 4099 };
    static const float ps[] = {0.05f, 0.5f, 0.999f};
    static const long firsts[] = {0, 5, 3L << 32};
    float *x = malloc(N * sizeof *x), *want = malloc(N * sizeof *want), *got = malloc(N * sizeof *got);
    assert_true(x && want && got);
    for (int i = 0; i < N; i++) x[i] = i % 97 == 3 ? NAN : i % 89 == 5 ? -INFINITY : frand() * 4.0f;
    const char *orig = qlm_matmul_isa();
    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++)
        for (size_t fi = 0; fi < sizeof firsts / sizeof firsts[0]; fi++) {
            const uint64_t seed = 0x1234567ull + pi * 7 + fi, base = qlm_mix64(seed);
            const uint64_t threshold = qlm_dropout_threshold(ps[pi]);
            long dropped = 0;
            for (int i = 0; i < N; i++) {
                const int drops = qlm_dropout_drops(base, firsts[fi] + i, threshold);
                want[i] = drops ? 0.0f : x[i] * (1.0f / (1.0f - ps[pi]));
                dropped += drops;
            }
            const double mean = ps[pi] * N, sd = sqrt(N * ps[pi] * (1.0 - ps[pi]));
            if (fabs(dropped - mean) > 5 * sd + 1) fail_msg("p=%g: %ld of %d dropped", ps[pi], dropped, N);
            for (size_t ii = 0; ii < sizeof k_isas / sizeof k_isas[0]; ii++) {
                if (qlm_matmul_force_isa(k_isas[ii]) != 0) continue;
                for (int n = 0; n <= N; n = n < 40 ? n + 1 : n == 40 ? 1000 : n == 1000 ? N : N + 1) {
                    for (int at = 0; at < 3 && n + at <= N; at++) {
                        memset(got, 0x55, N * sizeof *got);
                        qlm_dropout_f32(got, x + at, n, ps[pi], seed, firsts[fi] + at);
                        if (memcmp(got, want + at, (size_t)n * sizeof *got) != 0 || (n + at < N && got[n] == want[n + at]))
                            fail_msg("%s p=%g first=%ld n=%d at=%d: not the formula's floats", k_isas[ii], ps[pi], firsts[fi], n, at);
                    }
                }
                memcpy(got, x, N * sizeof *got);
                qlm_dropout_f32(got, got, N, ps[pi], seed, firsts[fi]);
                if (memcmp(got, want, N * sizeof *got) != 0) fail_msg("%s p=%g in place: not the formula's floats", k_isas[ii], ps[pi]);
            }
        }
    assert_int_equal(qlm_matmul_force_isa(orig), 0);
    free(x);
    free(want);
    free(got);
}

static void read_hex(FILE *f, const char *key, float *out, long count) {
    char k[32];
    assert_int_equal(fscanf(f, "%31s", k), 1);
    assert_string_equal(k, key);
    for (long i = 0; i < count; i++) {
        unsigned u;
        assert_int_equal(fscanf(f, "%x", &u), 1);
        memcpy(&out[i], &u, 4);
    }
}

static void read_doubles(FILE *f, const char *key, double *out, long count) {
    char k[32];
    assert_int_equal(fscanf(f, "%31s", k), 1);
    assert_string_equal(k, key);
    for (long i = 0; i < count; i++) assert_int_equal(fscanf(f, "%lf", &out[i]), 1);
}

/* The torch products; x is also stacked to a prefill-sized call, whose rows must equal the small
 * call's bit for bit. */
static void test_vs_torch(void **state) {
    (void)state;
    FILE *f = fopen(MATMUL_FIXTURE, "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof line, f));
    int n, rows, cols;
    assert_int_equal(fscanf(f, " dims %d %d %d", &n, &rows, &cols), 3);
    long ny = (long)n * rows;
    const int stack = (PREFILL_N + n - 1) / n;
    float *x = malloc(stack * n * cols * sizeof(float)), *w = malloc(rows * cols * sizeof(float));
    float *bias = malloc(rows * sizeof(float)), *y = malloc(stack * ny * sizeof(float));
    double *ref = malloc(stack * ny * sizeof(double)), *mag = malloc(stack * ny * sizeof(double));
    assert_true(x && w && bias && y && ref && mag);
    read_hex(f, "x", x, n * cols);
    for (int c = 1; c < stack; c++) memcpy(x + c * n * cols, x, n * cols * sizeof(float));
    read_hex(f, "w", w, rows * cols);
    read_hex(f, "bias", bias, rows);
    for (long i = 0; i < ny; i++) {
        int o = i % rows;
        mag[i] = fabs(bias[o]);
        for (int k = 0; k < cols; k++) mag[i] += fabs(x[(i / rows) * cols + k] * w[o * cols + k]);
        for (int c = 1; c < stack; c++) mag[i + c * ny] = mag[i];
    }
    static const char *const keys[] = {"y_f32", "y_f16", "y_bf16", "y_int8_rows"};
    static const int kind_of[] = {0, 1, 2, 4};
    for (int ki = 0; ki < 4; ki++) {
        read_doubles(f, keys[ki], ref, ny);
        for (int c = 1; c < stack; c++) memcpy(ref + c * ny, ref, ny * sizeof(double));
        test_weight t;
        make_weight(&t, &k_kinds[kind_of[ki]], w, rows, cols);
        qlm_matmul(y, x, n, &t.w, bias);
        check_close(y, ref, mag, ny, keys[ki]);
        float *ys = malloc(stack * ny * sizeof *ys);
        assert_non_null(ys);
        qlm_matmul(ys, x, stack * n, &t.w, bias);
        for (int c = 0; c < stack; c++) assert_memory_equal(ys + c * ny, y, ny * sizeof *y);
        free(ys);
        free_weight(&t);
    }
    fclose(f);
    free(x);
    free(w);
    free(bias);
    free(y);
    free(ref);
    free(mag);
}

/* The backward through a weight, dx = dy W, for every storage dtype and a weight taller than one
 * block of rows converted to F32 (512): each block must meet its own rows of W. Against the
 * product in double of the dequantized weight; accumulate adds to what dx held. */
static void backward_x_width(const int COLS) {
    const qlm_backend *be = qlm_backend_cpu();
    enum { ROWS = 1100, N = 5 };
    float *src = malloc(sizeof(float) * ROWS * COLS), *dy = malloc(sizeof(float) * N * ROWS);
    float *dx = malloc(sizeof(float) * N * COLS);
    assert_true(src && dy && dx);
    for (int i = 0; i < ROWS * COLS; i++) src[i] = frand();
    for (int i = 0; i < N * ROWS; i++) dy[i] = frand();
    for (int k = 0; k < NKINDS; k++) {
        if (!kind_fits(&k_kinds[k], COLS)) continue;
        test_weight t;
        make_weight(&t, &k_kinds[k], src, ROWS, COLS);
        for (int acc = 0; acc < 2; acc++) {
            for (int i = 0; i < N * COLS; i++) dx[i] = 0.5f;
            assert_int_equal(be->matmul_backward_x(dx, dy, N, &t.w, acc), 0);
            double worst = 0;
            for (int i = 0; i < N; i++)
                for (int c = 0; c < COLS; c++) {
                    double ref = acc ? 0.5 : 0, mag = acc ? 0.5 : 0;
                    for (int r = 0; r < ROWS; r++) {
                        ref += (double)dy[i * ROWS + r] * t.deq[(long)r * COLS + c];
                        mag += fabs((double)dy[i * ROWS + r] * t.deq[(long)r * COLS + c]);
                    }
                    double e = fabs(dx[i * COLS + c] - ref) / mag;
                    if (!(e <= worst)) worst = e; /* NaN included */
                }
            if (!(worst <= REL_TOL)) fail_msg("%s backward_x (accumulate %d): relative error %.3g", k_kinds[k].name, acc, worst);
        }
        free_weight(&t);
    }
    free(src), free(dy), free(dx);
}

static void test_backward_x_blocks(void **state) {
    (void)state;
    backward_x_width(40);
    backward_x_width(128);
}

static void test_isa_selection(void **state) {
    (void)state;
    const char *orig = qlm_matmul_isa();
    int known = 0;
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++) known |= strcmp(orig, k_isas[i]) == 0;
    assert_true(known);
    assert_int_equal(qlm_matmul_force_isa("scalar"), 0);
    assert_string_equal(qlm_matmul_isa(), "scalar");
    assert_int_equal(qlm_matmul_force_isa("sse9"), -1);
    assert_string_equal(qlm_matmul_isa(), "scalar");
    for (size_t i = 0; i < sizeof k_isas / sizeof k_isas[0]; i++)
        if (qlm_matmul_force_isa(k_isas[i]) != 0) print_message("isa %s not supported here: its paths are not tested\n", k_isas[i]);
    assert_int_equal(qlm_matmul_force_isa(orig), 0);
    assert_string_equal(qlm_matmul_isa(), orig);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isa_selection), cmocka_unit_test(test_i8_extreme_sums), cmocka_unit_test(test_i8_tiles_exact), cmocka_unit_test(test_i8_xw_exact),
        cmocka_unit_test(test_panels_round_trip), cmocka_unit_test(test_w8a8_extreme_bytes),
        cmocka_unit_test(test_matmul_group), cmocka_unit_test(test_rope_rows),   cmocka_unit_test(test_odd_shapes),
        cmocka_unit_test(test_threaded_shapes), cmocka_unit_test(test_block_shapes), cmocka_unit_test(test_thread_count_invariance),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_vs_torch),
        cmocka_unit_test(test_attention_kernels),
        cmocka_unit_test(test_exp),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_backward_x_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
