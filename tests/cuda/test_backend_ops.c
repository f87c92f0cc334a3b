/* The CUDA op table against references on random inputs: matmul against a double-precision sum
 * of the same operands (x in the form each path documents), the other ops against the CPU
 * backend's, which tests/test_*.c check against torch. Built and run by `make test-cuda` only:
 * it needs a GPU. */
#include <math.h>

#include "../../core/kv_cache.h"
#include "../../quant/half.h"
#include "../../quant/matmul.h"
#include "../../quant/x_int_form.h"
#include "gpu_test_util.h"

static float bf16_round(float x) { return qlm_bf16_to_f32(qlm_f32_to_bf16(x)); }

/* A weight of whole numbers in [-127, 127] (exact in every dtype; INT8 with a scale per tensor or
 * per row), for the exact checks (exact_x). */
static void make_int_weight(test_weight *t, qlm_dtype dt, int per_channel, int rows, int cols, unsigned seed) {
    float *w = randv((long)rows * cols, seed, 1.0f);
    for (long i = 0; i < (long)rows * cols; i++) w[i] = (float)(int)(w[i] * 127.0f);
    size_t data, total;
    float *rs = alloc_weight(t, dt, rows, cols, &data, &total);
    if (dt == QLM_I8) {
        for (long i = 0; i < (long)rows * cols; i++) ((signed char *)t->host_buf)[i] = (signed char)w[i];
        float *sv = randv(rows, seed + 1u, 1.0f);
        for (int r = 0; r < rows; r++) rs[r] = (1.0f + 0.5f * sv[r]) / 127.0f;
        if (per_channel)
            t->host.row_scales = rs;
        else
            t->host.scale = 0.8f * rs[0];
        free(sv);
    } else {
        qlm_convert_from_f32(t->host_buf, dt, w, (long)rows * cols);
    }
    free(w);
    upload_weight(t, data, total);
}

/* n rows of x that integer weights (make_int_weight) multiply exactly in F32 in any order: in row
 * i one column (its place moves with i) of magnitude 1/2..1 in steps of 2^-5, the others multiples
 * of 2^-16 below 2^-12, all exact in BF16. Every product is then a multiple of 2^-16, and every
 * partial sum of a row's products is below 127 (1 + 1536 2^-12) < 2^8 for up to 1536 columns, so
 * F32's 24 bits hold each exactly: any path that sums in F32 (FMAs, cuBLAS, tensor cores that keep
 * F32's significand) gives the correctly rounded product with the scale, bit for bit. One that
 * keeps fewer bits next to a large partial sum loses the small products' low bits. */
static float *exact_x(int n, int cols, unsigned seed) {
    assert_true(cols <= 1536);
    float *x = malloc((size_t)n * cols * sizeof *x);
    assert_non_null(x);
    for (int i = 0; i < n; i++) {
        int big = (i * 53 + 11) % cols;
        for (int c = 0; c < cols; c++) {
            float u = frand(&seed);
            if (c == big)
                x[(size_t)i * cols + c] = (u < 0 ? -1.0f : 1.0f) * (float)(16 + (int)(fabsf(u) * 15.99f)) / 32.0f;
            else
                x[(size_t)i * cols + c] = (float)(int)(u * 15.99f) / 65536.0f;
        }
    }
    return x;
}

/* Whether the product takes x in the I16 form (quant/x_int_form.h: per row of x, q = round(x / s)
 * with |q| <= 32767, as the CPU takes it): INT8 weights, in the GEMV (n <= 8) and in cuBLAS's
 * integer GEMM (n > 8), whose integer sums are exact. */
static int takes_i16(const qlm_weight *w) { return w->dtype == QLM_I8; }

/* How y (the device's [n][rows]) meets y = x W^T + bias computed in double from the stored values
 * (x in the form the path takes it, INT8's scales applied to the integer sum). */
typedef struct {
    double worst; /* max |y - ref| / (sum |w x| + |bias|) */
    /* outputs other than ref rounded to F32 (without a bias: one rounding after an exact sum); for
     * the I16 form, other than the CPU's scalar reference (qlm_matmul_scalar, the same integer sum
     * scaled in the same float operations), bias or not, bit for bit (NaN for NaN) */
    long inexact;
} matmul_err;

static matmul_err matmul_check(const test_weight *t, const float *x, int n, const float *bias, const float *y) {
    const qlm_weight *w = &t->host;
    const int rows = w->rows, cols = w->cols, i16 = takes_i16(w), rounds_x = w->dtype == QLM_BF16;
    double *wv = malloc((size_t)cols * sizeof *wv), *xr = malloc((size_t)n * cols * sizeof *xr);
    double *xscale = malloc((size_t)n * sizeof *xscale);
    float *wrow = malloc((size_t)cols * sizeof *wrow), *cpu_y = malloc((size_t)n * rows * sizeof *cpu_y);
    assert_true(wv && xr && xscale && wrow && cpu_y);
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * cols;
        float inv = 1, absmax = 0;
        int nan = 0;
        for (int c = 0; c < cols; c++) nan |= isnan(xi[c]), absmax = fmaxf(absmax, fabsf(xi[c]));
        xscale[i] = i16 ? qlm_x_int_scale(absmax, nan, QLM_I16_MAX, &inv) : 1;
        for (int c = 0; c < cols; c++)
            xr[(size_t)i * cols + c] = i16 ? (inv == 0 ? 0 : lrintf(xi[c] * inv)) : rounds_x ? bf16_round(xi[c]) : xi[c];
    }
    if (i16) qlm_matmul_scalar(cpu_y, x, n, w, bias);
    matmul_err e = {0, 0};
    for (int r = 0; r < rows; r++) {
        double scale = 1;
        if (w->dtype == QLM_I8) {
            for (int c = 0; c < cols; c++) wv[c] = ((const signed char *)w->data)[(size_t)r * cols + c];
            scale = w->row_scales ? w->row_scales[r] : w->scale;
        } else {
            qlm_weight_row_f32(w, r, wrow); /* exact for F32, F16 and BF16 */
            for (int c = 0; c < cols; c++) wv[c] = wrow[c];
        }
        for (int i = 0; i < n; i++) {
            double sum = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                sum += wv[c] * xr[(size_t)i * cols + c];
                mag += fabs(wv[c] * xr[(size_t)i * cols + c]);
            }
            const double s = scale * xscale[i], b = bias ? bias[r] : 0, ref = sum * s + b;
            const float got = y[(size_t)i * rows + r];
            e.worst = fmax(e.worst, fabs(got - ref) / (mag * s + fabs(b) + 1e-30));
            if (i16) {
                const float want = cpu_y[(size_t)i * rows + r];
                e.inexact += memcmp(&got, &want, sizeof got) != 0 && !(isnan(got) && isnan(want));
            }
            else if (!bias)
                e.inexact += got != (float)ref;
        }
    }
    free(wv), free(xr), free(xscale), free(wrow), free(cpu_y);
    return e;
}

/* The largest |a - b| / sum |w x| and how many of the n rows x rows outputs differ at all. */
static double rows_diff(const test_weight *t, const float *x, int n, const float *a, const float *b, long *differ) {
    const int rows = t->host.rows, cols = t->host.cols, rounds_x = t->host.dtype == QLM_BF16;
    float *wrow = malloc((size_t)cols * sizeof *wrow);
    assert_non_null(wrow);
    double worst = 0;
    *differ = 0;
    for (int r = 0; r < rows; r++) {
        qlm_weight_row_f32(&t->host, r, wrow);
        for (int i = 0; i < n; i++) {
            double mag = 0;
            for (int c = 0; c < cols; c++)
                mag += fabs((double)wrow[c] * (rounds_x ? bf16_round(x[(size_t)i * cols + c]) : x[(size_t)i * cols + c]));
            size_t k = (size_t)i * rows + r;
            worst = fmax(worst, fabs((double)a[k] - b[k]) / (mag + 1e-30));
            *differ += a[k] != b[k];
        }
    }
    free(wrow);
    return worst;
}

/* y = x W^T (+ bias) for n rows on the GPU. */
static float *gpu_matmul(const test_weight *t, const float *dx, int n, const float *dbias) {
    float *dy = gpu->alloc((size_t)n * t->host.rows * sizeof(float));
    assert_non_null(dy);
    gpu->matmul(dy, dx, n, &t->dev, dbias);
    float *y = from_gpu(dy, (long)n * t->host.rows);
    gpu->free(dy);
    return y;
}

/* The GPU's y for n rows against the double reference (x in the form each path documents):
 * within 1e-5 of sum |w x|; INT8, the CPU's scalar reference bit for bit. For n <= 8 (the GEMV)
 * also the same rows inside a 9-row call (cuBLAS), which the model tests compare when a batch's
 * rows run alone: *vs_gemm and *gemm_differ get how far apart the two paths are and in how many
 * outputs (reported, as floating-point paths sum in other orders; for INT8 none may differ). */
static double check_matmul(qlm_dtype dt, int per_channel, int rows, int cols, int n, int with_bias, double *vs_gemm,
                           long *gemm_differ) {
    test_weight t;
    make_weight(&t, dt, per_channel, rows, cols, (unsigned)(rows * 31 + cols + n));
    const int nx = n < 9 ? 9 : n;
    float *x = randv((long)nx * cols, 99u + (unsigned)n, 3.0f), *bias = randv(rows, 5u, 1.0f);
    float *dx = to_gpu(x, (size_t)nx * cols * sizeof *x), *db = to_gpu(bias, (size_t)rows * sizeof *bias);
    float *y = gpu_matmul(&t, dx, n, with_bias ? db : NULL);
    matmul_err e = matmul_check(&t, x, n, with_bias ? bias : NULL, y);
    if (e.worst > 1e-5)
        fail_msg("matmul %s%s %d x %d, %d rows%s: max |diff| / sum|w x| = %.2e", qlm_dtype_name(dt),
                 per_channel ? "-pc" : "", rows, cols, n, with_bias ? " + bias" : "", e.worst);
    if (takes_i16(&t.host) && e.inexact)
        fail_msg("matmul %s%s %d x %d, %d rows%s: %ld outputs differ from the CPU's scalar reference",
                 qlm_dtype_name(dt), per_channel ? "-pc" : "", rows, cols, n, with_bias ? " + bias" : "", e.inexact);
    *vs_gemm = 0, *gemm_differ = 0;
    if (n <= 8) {
        float *y9 = gpu_matmul(&t, dx, 9, with_bias ? db : NULL);
        *vs_gemm = rows_diff(&t, x, n, y, y9, gemm_differ);
        if (takes_i16(&t.host) && *gemm_differ)
            fail_msg("matmul %s%s %d x %d, %d rows%s: %ld outputs differ between the GEMV and the 9-row GEMM",
                     qlm_dtype_name(dt), per_channel ? "-pc" : "", rows, cols, n, with_bias ? " + bias" : "",
                     *gemm_differ);
        free(y9);
    }
    free(x), free(bias), free(y);
    gpu->free(dx), gpu->free(db);
    free_weight(&t);
    return e.worst;
}

static void test_matmul(void **state) {
    (void)state;
    const struct {
        qlm_dtype dt;
        int pc;
    } kinds[] = {{QLM_F32, 0}, {QLM_F16, 0}, {QLM_BF16, 0}, {QLM_I8, 0}, {QLM_I8, 1}};
    /* 176 columns: INT8 rows of 11 16-byte vectors (the last 4-vector step partial), BF16 of 22;
     * 176 rows: 11 tiles of 16. 203 columns fill no vectors (the scalar loop). 5632 columns (the
     * FFN's down projection): every warp of a tile takes more than one batch of steps; 5648, a
     * vector more, ends its rows in a partial step after several batches (INT8 lanes past the row
     * read its last vector again, which x's zeros there must cancel). */
    const int shapes[][2] = {{37, 64},  {96, 203},  {130, 1536}, {176, 176},
                             {64, 176}, {176, 64}, {24, 5632},  {24, 5648}};
    const int ns[] = {1, 2, 3, 4, 5, 7, 8, 9, 40};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            double worst = 0, vs_gemm = 0;
            long differ = 0, outputs = 0;
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
                double v;
                long d;
                worst = fmax(worst, check_matmul(kinds[k].dt, kinds[k].pc, shapes[s][0], shapes[s][1], ns[j],
                                                 (int)(j + s) % 2, &v, &d));
                vs_gemm = fmax(vs_gemm, v);
                differ += d;
                if (ns[j] <= 8) outputs += (long)ns[j] * shapes[s][0];
            }
            print_message("matmul %-4s%s %4d x %4d, n 1-40: max |diff| / sum|w x| = %.2e; GEMV rows vs the same in "
                          "cuBLAS: %.2e, %ld of %ld outputs differ\n",
                          qlm_dtype_name(kinds[k].dt), kinds[k].pc ? "-pc" : "   ", shapes[s][0], shapes[s][1], worst,
                          vs_gemm, differ, outputs);
        }
}

/* Products that sum exactly in F32 (exact_x, make_int_weight) come out of the GEMV (n <= 8) as the
 * correctly rounded result, bit for bit, in every dtype and corner (partial steps, 2-7 rows of 8,
 * rows not filling a tile); INT8, whose sums over x's I16 form are exact for any x, as the CPU's
 * scalar reference, in the GEMV and in cuBLAS (n > 8). The other cuBLAS rows are reported, not
 * asserted. */
static void test_matmul_exact(void **state) {
    (void)state;
    const struct {
        qlm_dtype dt;
        int pc;
    } kinds[] = {{QLM_F32, 0}, {QLM_F16, 0}, {QLM_BF16, 0}, {QLM_I8, 0}, {QLM_I8, 1}};
    const int shapes[][2] = {{37, 64}, {96, 203}, {130, 1536}, {176, 176}, {64, 176}, {176, 64}};
    const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int rows = shapes[s][0], cols = shapes[s][1];
            test_weight t;
            make_int_weight(&t, kinds[k].dt, kinds[k].pc, rows, cols, (unsigned)(rows + 7 * cols));
            long gemv_bad = 0, gemm_bad = 0, gemv_all = 0, gemm_all = 0;
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
                const int n = ns[j];
                float *x = exact_x(n, cols, 17u + (unsigned)n), *dx = to_gpu(x, (size_t)n * cols * sizeof *x);
                float *y = gpu_matmul(&t, dx, n, NULL);
                matmul_err e = matmul_check(&t, x, n, NULL, y);
                if ((n <= 8 || takes_i16(&t.host)) && e.inexact)
                    fail_msg("exact matmul %s%s %d x %d, %d rows: %ld of %ld outputs inexact (max |diff| / sum|w x| "
                             "%.2e)",
                             qlm_dtype_name(kinds[k].dt), kinds[k].pc ? "-pc" : "", rows, cols, n, e.inexact,
                             (long)n * rows, e.worst);
                *(n <= 8 ? &gemv_bad : &gemm_bad) += e.inexact;
                *(n <= 8 ? &gemv_all : &gemm_all) += (long)n * rows;
                free(x), free(y);
                gpu->free(dx);
            }
            print_message("exact matmul %-4s%s %4d x %4d: GEMV %ld of %ld outputs inexact, cuBLAS %ld of %ld\n",
                          qlm_dtype_name(kinds[k].dt), kinds[k].pc ? "-pc" : "   ", rows, cols, gemv_bad, gemv_all,
                          gemm_bad, gemm_all);
            free_weight(&t);
        }
}

/* INT8 takes x as the CPU does where a row of x is not ordinary too: a NaN or an infinity in it
 * (the row's outputs NaN), all zeros, all below 1e-30 (dropped: zeros), one huge value beside small
 * ones (which the I16 form rounds to 0): the CPU's scalar reference, bit for bit, in the GEMV (the
 * six rows) and in cuBLAS (twice them), over whole 16-byte vectors (64 columns) and not (203),
 * scales per tensor and per row (with a bias). */
static void test_matmul_int8_special_x(void **state) {
    (void)state;
    const int widths[2] = {64, 203}, kinds = 6, rows = 37;
    for (int c = 0; c < 2; c++)
        for (int pc = 0; pc < 2; pc++)
            for (int n = kinds; n <= 2 * kinds; n += kinds) {
                const int cols = widths[c];
                test_weight t;
                make_weight(&t, QLM_I8, pc, rows, cols, 7u + (unsigned)(2 * c + pc));
                float *x = randv((long)n * cols, 21u, 2.0f), *bias = randv(rows, 3u, 1.0f);
                for (int i = 0; i < n; i += kinds) {
                    float *xi = x + (size_t)i * cols;
                    xi[5] = NAN;
                    xi[2 * cols - 1] = -INFINITY;
                    for (int k = 0; k < cols; k++) xi[2 * cols + k] = 0, xi[3 * cols + k] *= 1e-32f;
                    xi[4 * cols + 3] = 1e35f;
                }
                float *dx = to_gpu(x, (size_t)n * cols * sizeof *x), *db = to_gpu(bias, (size_t)rows * sizeof *bias);
                float *y = gpu_matmul(&t, dx, n, pc ? db : NULL);
                matmul_err e = matmul_check(&t, x, n, pc ? bias : NULL, y);
                print_message("int8%s %d x %d, %2d rows of x with NaN, -inf, zeros, 1e-32, 1e35, none: %ld of %d "
                              "outputs differ from the CPU's\n",
                              pc ? "-pc + bias" : "", rows, cols, n, e.inexact, n * rows);
                assert_int_equal(e.inexact, 0);
                for (int i = 0; i < n; i += kinds)
                    for (int r = 0; r < rows; r++) {
                        const float *yi = y + (size_t)i * rows + r;
                        assert_true(isnan(yi[0]) && isnan(yi[rows]));
                        assert_true(isfinite(yi[4 * rows]) && isfinite(yi[5 * rows]));
                        if (!pc) assert_true(yi[2 * rows] == 0 && yi[3 * rows] == 0);
                    }
                free(x), free(bias), free(y);
                gpu->free(dx), gpu->free(db);
                free_weight(&t);
            }
}

/* 0 finite, 1 +inf, 2 -inf, 3 NaN. */
static int float_class(float v) { return isnan(v) ? 3 : isinf(v) ? (v > 0 ? 1 : 2) : 0; }

/* F32, F16 and BF16 weights (loaded with --no-check) with +inf in a row's last column (the last
 * 16-byte vector of the mma GEMV, or the scalar tail), -inf in the first, NaN in the middle, against
 * x with zeros, +inf and NaN where they meet them and finite elsewhere: every output NaN, +inf,
 * -inf or finite as the CPU backend's, in the GEMV (n <= 8) and in cuBLAS, over whole vectors (64,
 * 5648 columns: several batches of steps) and not (203). */
static void test_matmul_special_weight(void **state) {
    (void)state;
    const qlm_dtype dts[3] = {QLM_F32, QLM_F16, QLM_BF16};
    const int widths[3] = {64, 203, 5648}, ns[4] = {1, 4, 8, 9}, rows = 37;
    for (int d = 0; d < 3; d++)
        for (int c = 0; c < 3; c++) {
            const int cols = widths[c];
            float *w = randv((long)rows * cols, 17u + (unsigned)c, 1.0f);
            w[3L * cols + cols - 1] = INFINITY;
            w[5L * cols] = -INFINITY;
            w[7L * cols + cols / 2] = NAN;
            test_weight t;
            size_t data, total;
            alloc_weight(&t, dts[d], rows, cols, &data, &total);
            qlm_convert_from_f32(t.host_buf, dts[d], w, (long)rows * cols);
            upload_weight(&t, data, total);
            long mismatched = 0, special = 0;
            for (int k = 0; k < 4; k++) {
                const int n = ns[k];
                float *x = randv((long)n * cols, 29u + (unsigned)n, 3.0f);
                x[cols - 1] = 2.0f, x[0] = 0.5f;   /* row 0: w's infinities times finite x */
                if (n > 1) x[2L * cols - 1] = 0;   /* row 1: +inf times 0 */
                if (n > 2) x[2L * cols + 9] = INFINITY; /* row 2: +inf times every row's w */
                if (n > 3) x[3L * cols + cols - 2] = NAN;
                float *dx = to_gpu(x, (size_t)n * cols * sizeof *x);
                float *y = gpu_matmul(&t, dx, n, NULL), *want = malloc((size_t)n * rows * sizeof *want);
                assert_non_null(want);
                cpu->matmul(want, x, n, &t.host, NULL);
                for (long i = 0; i < (long)n * rows; i++) {
                    mismatched += float_class(y[i]) != float_class(want[i]);
                    special += float_class(want[i]) != 0;
                }
                free(x), free(y), free(want);
                gpu->free(dx);
            }
            print_message("matmul %-4s %2d x %4d with inf and NaN weights, n 1-9: %ld of %ld non-finite outputs, %ld "
                          "of another kind than the CPU's\n",
                          qlm_dtype_name(dts[d]), rows, cols, special, (long)(1 + 4 + 8 + 9) * rows, mismatched);
            assert_true(special > 0);
            assert_int_equal(mismatched, 0);
            free(w);
            free_weight(&t);
        }
}

/* INT8 products larger than one GEMM call of launch_gemm_i8: rows wider than its column chunk
 * (2^16 columns, whose sums it adds in int64), and more weight rows than one block of its int32
 * sums holds (2^24 sums: 2^19 rows for 9 rows of x, the planes' 32 rows), per tensor and per row
 * with a bias: the CPU's scalar reference, bit for bit, for 9 rows of x (the GEMM) and, for the
 * wide rows, one (the GEMV). */
static void test_matmul_int8_large(void **state) {
    (void)state;
    const struct {
        int rows, cols, n_min;
    } shapes[] = {{6, (1 << 17) + 64, 1}, {(1 << 19) + 37, 32, 9}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int pc = 0; pc < 2; pc++)
            for (int n = shapes[k].n_min; n <= 9; n += 8) {
                const int rows = shapes[k].rows, cols = shapes[k].cols;
                test_weight t;
                make_weight(&t, QLM_I8, pc, rows, cols, 11u + (unsigned)pc);
                float *x = randv((long)n * cols, 5u + (unsigned)n, 2.0f), *bias = randv(rows, 9u, 1.0f);
                float *dx = to_gpu(x, (size_t)n * cols * sizeof *x), *db = to_gpu(bias, (size_t)rows * sizeof *bias);
                float *y = gpu_matmul(&t, dx, n, pc ? db : NULL);
                matmul_err e = matmul_check(&t, x, n, pc ? bias : NULL, y);
                print_message("int8%s %d x %d, %d rows of x: %ld of %ld outputs differ from the CPU's\n",
                              pc ? "-pc + bias" : "", rows, cols, n, e.inexact, (long)n * rows);
                assert_int_equal(e.inexact, 0);
                free(x), free(bias), free(y);
                gpu->free(dx), gpu->free(db);
                free_weight(&t);
            }
}

/* One group of count weights (per_channel[k], amp[k] the range of their F32 values, so per-tensor
 * INT8 scales differ) of cols columns: the group's y equal the separate matmuls' bit for bit, and
 * meet the double reference (within 1e-5 of sum |w x|; exactly with exact inputs, for n <= 8). */
static void check_group(const qlm_dtype *dts, const int *per_channel, const float *amp, const int *rows, int count,
                        int cols, int n, int exact) {
    test_weight t[4];
    qlm_matmul_out outs[4];
    float *solo[4];
    float *x = exact ? exact_x(n, cols, 5u + (unsigned)n) : randv((long)n * cols, 3u + (unsigned)n, 2.0f);
    float *dx = to_gpu(x, (size_t)n * cols * sizeof *x);
    assert_true(count <= 4);
    for (int k = 0; k < count; k++) {
        if (exact)
            make_int_weight(&t[k], dts[k], per_channel[k], rows[k], cols, 40u + (unsigned)k);
        else
            make_weight_amp(&t[k], dts[k], per_channel[k], rows[k], cols, 40u + (unsigned)k, amp[k]);
        outs[k] = (qlm_matmul_out){gpu->alloc((size_t)n * rows[k] * sizeof(float)), &t[k].dev, NULL, 0};
        solo[k] = gpu->alloc((size_t)n * rows[k] * sizeof(float));
        gpu->matmul(solo[k], dx, n, &t[k].dev, NULL);
    }
    assert_int_equal(gpu->matmul_group(outs, count, dx, n), 0);
    double worst = 0;
    long inexact = 0;
    for (int k = 0; k < count; k++) {
        float *a = from_gpu(outs[k].y, (long)n * rows[k]), *b = from_gpu(solo[k], (long)n * rows[k]);
        assert_memory_equal(a, b, (size_t)n * rows[k] * sizeof(float));
        matmul_err e = matmul_check(&t[k], x, n, NULL, a);
        worst = fmax(worst, e.worst);
        inexact += e.inexact;
        free(a), free(b);
        gpu->free(outs[k].y), gpu->free(solo[k]);
    }
    print_message("group of %d (%s%s %d", count, qlm_dtype_name(dts[0]), per_channel[0] ? "-pc" : "", rows[0]);
    for (int k = 1; k < count; k++)
        print_message(", %s%s %d", qlm_dtype_name(dts[k]), per_channel[k] ? "-pc" : "", rows[k]);
    if (exact)
        print_message(") x %d, %2d rows, exact inputs: = separate; %ld of the outputs inexact\n", cols, n, inexact);
    else
        print_message(") x %d, %2d rows: = separate; max |diff| / sum|w x| %.2e\n", cols, n, worst);
    assert_true(worst <= 1e-5);
    if (exact && n <= 8) assert_int_equal(inexact, 0);
    for (int k = 0; k < count; k++) free_weight(&t[k]);
    free(x);
    gpu->free(dx);
}

/* A group equals its weights' separate matmuls bit for bit, on both paths, also mixing dtypes;
 * INT8 groups of per-tensor weights with different scales, of 176, 64 and 37 rows (11, 4 and 3
 * tiles, the last not full) over 64 and 176 columns (one step; 11 vectors, the last step partial). */
static void test_matmul_group(void **state) {
    (void)state;
    const int ns[] = {1, 4, 7, 12};
    {
        const qlm_dtype dts[3] = {QLM_BF16, QLM_BF16, QLM_I8};
        const int pc[3] = {0, 0, 0}, rows[3] = {64, 32, 48};
        const float amp[3] = {1, 1, 1};
        for (int n = 1; n <= 12; n += 11) check_group(dts, pc, amp, rows, 3, 256, n, 0);
    }
    const qlm_dtype i8[4] = {QLM_I8, QLM_I8, QLM_I8, QLM_I8}, bf[4] = {QLM_BF16, QLM_BF16, QLM_BF16, QLM_BF16};
    const int pt[4] = {0, 0, 0, 0}, mixed_pc[4] = {0, 1, 0, 0};
    const int rows2[2] = {176, 64}, rows3[3] = {176, 64, 37}, rows4[4] = {37, 176, 64, 16};
    const float amp[4] = {1.0f, 0.25f, 3.0f, 0.5f};
    const int cols[2] = {64, 176};
    for (int c = 0; c < 2; c++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (int exact = 0; exact < 2; exact++) {
                check_group(i8, pt, amp, rows2, 2, cols[c], ns[j], exact);
                check_group(i8, pt, amp, rows3, 3, cols[c], ns[j], exact);
                check_group(i8, mixed_pc, amp, rows4, 4, cols[c], ns[j], exact);
                check_group(bf, pt, amp, rows3, 3, cols[c], ns[j], exact);
            }
}

/* One step_matmul_group of count weights of dtype dt (rows[k] x cols) on the GPU, the last
 * product adding to what its y holds (with a bias), against the step's op and then matmul_group on
 * the GPU (the same kernels' path for n > 8 or widths the fused GEMV does not take): x written as
 * the op writes it and every y within 1e-5 of sum |w x| (the formed x in its own kernel's order of
 * operations; printed: how many outputs differ at all). The product that adds equals what y held
 * plus the same product into a fresh y, bit for bit. */
static void check_step(qlm_x_kind kind, qlm_act act, qlm_dtype dt, int per_channel, const int *rows, int count,
                       int cols, int n) {
    const long nx = (long)n * cols;
    float *a = randv(nx, 61u + (unsigned)n, 3.0f), *b = randv(nx, 62u, 1.5f), *nw = randv(cols, 63u, 1.0f);
    float *da = to_gpu(a, (size_t)nx * sizeof *a), *db = to_gpu(b, (size_t)nx * sizeof *b);
    float *dnw = to_gpu(nw, (size_t)cols * sizeof *nw), *dx = nan_gpu(nx), *dx_ref = gpu->alloc((size_t)nx * sizeof(float));
    float *bias = randv(rows[count - 1], 64u, 0.5f), *dbias = to_gpu(bias, (size_t)rows[count - 1] * sizeof *bias);
    test_weight t[3];
    qlm_matmul_out outs[3], refs[3], plain;
    float *y0 = randv((long)n * rows[count - 1], 65u, 2.0f);
    assert_true(count <= 3);
    for (int k = 0; k < count; k++) {
        const int last = k == count - 1;
        const size_t bytes = (size_t)n * rows[k] * sizeof(float);
        make_weight(&t[k], dt, per_channel, rows[k], cols, 70u + (unsigned)k);
        outs[k] = (qlm_matmul_out){last ? to_gpu(y0, bytes) : nan_gpu((long)n * rows[k]), &t[k].dev,
                                   last ? dbias : NULL, last};
        refs[k] = outs[k];
        refs[k].y = last ? to_gpu(y0, bytes) : nan_gpu((long)n * rows[k]);
    }
    const qlm_x_step step = {kind, dx, da, kind == QLM_X_GLU ? db : NULL, kind == QLM_X_RMSNORM ? dnw : NULL, 1e-5f, act};
    assert_int_equal(gpu->step_matmul_group(outs, count, &step, NULL, n), 0);
    if (kind == QLM_X_RMSNORM)
        gpu->rmsnorm(dx_ref, da, dnw, n, cols, 1e-5f);
    else
        gpu->glu(dx_ref, da, db, nx, act);
    assert_int_equal(gpu->matmul_group(refs, count, dx_ref, n), 0);
    plain = outs[count - 1];
    plain.y = nan_gpu((long)n * rows[count - 1]);
    plain.add = 0;
    assert_int_equal(gpu->matmul_group(&plain, 1, dx_ref, n), 0);

    float *x = from_gpu(dx, nx), *x_ref = from_gpu(dx_ref, nx);
    assert_true(rel_diff(x, x_ref, nx) <= 1e-6);
    long differ = 0;
    double worst = 0;
    for (int k = 0; k < count; k++) {
        float *got = from_gpu(outs[k].y, (long)n * rows[k]), *want = from_gpu(refs[k].y, (long)n * rows[k]);
        long d = 0;
        worst = fmax(worst, rows_diff(&t[k], x_ref, n, got, want, &d));
        differ += d;
        if (k == count - 1) {
            float *alone = from_gpu(plain.y, (long)n * rows[k]);
            for (long i = 0; i < (long)n * rows[k]; i++) assert_true(want[i] == y0[i] + alone[i]);
            free(alone);
        }
        free(got), free(want);
        gpu->free(outs[k].y), gpu->free(refs[k].y);
        free_weight(&t[k]);
    }
    print_message("%s %s%s x %d, %d rows: x %s, y max |diff| / sum|w x| %.2e, %ld outputs differ\n",
                  kind == QLM_X_RMSNORM ? "rmsnorm" : "glu", qlm_dtype_name(dt), per_channel ? "-pc" : "", cols, n,
                  rel_diff(x, x_ref, nx) == 0 ? "equal" : "within 1e-6", worst, differ);
    assert_true(worst <= 1e-5);
    free(a), free(b), free(nw), free(bias), free(y0), free(x), free(x_ref);
    gpu->free(da), gpu->free(db), gpu->free(dnw), gpu->free(dx), gpu->free(dx_ref), gpu->free(dbias), gpu->free(plain.y);
}

/* A block's norm inside its q/k/v group and the GLU inside the down projection (the decode step's
 * fused GEMV: BF16 and INT8 per tensor and per channel, 1 to 8 rows), rows of 5632 under the norm
 * (several batches of steps a warp, the first batch's first steps loaded before the norm's sums),
 * and the shapes it leaves to the op and then the product: 9 rows (cuBLAS), and a width of 100
 * BF16 columns (not whole vectors). */
static void test_step_matmul_group(void **state) {
    (void)state;
    const int qkv[3] = {96, 32, 48}, down[1] = {80};
    const int ns[] = {1, 2, 3, 8, 9};
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
        check_step(QLM_X_RMSNORM, QLM_ACT_SILU, QLM_BF16, 0, qkv, 3, 576, ns[j]);
        check_step(QLM_X_RMSNORM, QLM_ACT_SILU, QLM_I8, 1, qkv, 3, 256, ns[j]);
        check_step(QLM_X_GLU, QLM_ACT_SILU, QLM_BF16, 0, down, 1, 1536, ns[j]);
        check_step(QLM_X_GLU, QLM_ACT_GELU_TANH, QLM_I8, 0, down, 1, 512, ns[j]);
    }
    for (int n = 1; n <= 3; n += 2) {
        check_step(QLM_X_RMSNORM, QLM_ACT_SILU, QLM_BF16, 0, qkv, 3, 5632, n);
        check_step(QLM_X_RMSNORM, QLM_ACT_SILU, QLM_I8, 1, qkv, 3, 5632, n);
    }
    check_step(QLM_X_RMSNORM, QLM_ACT_SILU, QLM_BF16, 0, qkv, 3, 100, 2);
    check_step(QLM_X_GLU, QLM_ACT_SILU, QLM_F32, 0, down, 1, 256, 1);
}

/* n floats from a cache of dtype kv (F32 or BF16). */
static float *cache_floats(const void *cache, qlm_dtype kv, long n) {
    float *f = malloc((size_t)n * sizeof *f);
    assert_non_null(f);
    for (long i = 0; i < n; i++)
        f[i] = kv == QLM_BF16 ? qlm_bf16_to_f32(((const uint16_t *)cache)[i]) : ((const float *)cache)[i];
    return f;
}

/* A decode step's q, k and v with the kv step after them: heads and kv_heads of hd, RoPE or not
 * (T5), caches of dtype kv, rows in slot i % 2 (slots) or all in slot 0, biases on the three
 * (Qwen2) or none. */
typedef struct {
    int heads, kv_heads, hd, rope, slots, bias;
    qlm_dtype kv;
} kv_case;

/* step_matmul_group with the norm inside and the kv step after the products (n rows at positions
 * 5 + 3i, stored at those modulo the caches' 16 positions), against the norm, matmul_group and
 * rope_store one after the other on the GPU, caches starting from the same random bytes: q, k and
 * v within 1e-5 of their largest value, the caches within that or, BF16, a unit in their last
 * place (printed: how many values differ at all). Whatever the reference, the fused caches hold
 * the fused k and v exactly, in their dtype, at their rows' places. */
static void check_step_kv(qlm_dtype dt, int per_channel, int cols, int n, const kv_case *c) {
    const int max_pos = 16, n_slots = 2, hd = c->hd, rows[3] = {c->heads * hd, c->kv_heads * hd, c->kv_heads * hd};
    const long nx = (long)n * cols, cells = (long)n_slots * c->kv_heads * max_pos * hd;
    const size_t esize = c->kv == QLM_BF16 ? 2 : 4, cache_bytes = (size_t)cells * esize;
    int pos[9], store_pos[9], slots[9];
    assert_true(n <= 9);
    for (int i = 0; i < n; i++) pos[i] = 5 + 3 * i, store_pos[i] = pos[i] % max_pos, slots[i] = i % 2;
    float *a = randv(nx, 81u + (unsigned)n, 3.0f), *nw = randv(cols, 82u, 1.0f), *inv = randv(hd / 2, 83u, 0.5f);
    for (int j = 0; j < hd / 2; j++) inv[j] = fabsf(inv[j]);
    float *da = to_gpu(a, (size_t)nx * sizeof *a), *dnw = to_gpu(nw, (size_t)cols * sizeof *nw);
    float *dinv = to_gpu(inv, (size_t)hd / 2 * sizeof *inv), *dx = nan_gpu(nx), *dx_ref = nan_gpu(nx);
    float *start = randv(cells, 84u, 1.0f);
    void *start_bytes = malloc(cache_bytes), *dcache[2][2]; /* [fused, reference][k, v] */
    assert_non_null(start_bytes);
    qlm_convert_from_f32(start_bytes, c->kv, start, cells);
    for (int f = 0; f < 2; f++)
        for (int kv = 0; kv < 2; kv++) dcache[f][kv] = to_gpu(start_bytes, cache_bytes);
    test_weight t[3];
    float *bias[3] = {NULL, NULL, NULL};
    qlm_matmul_out outs[3], refs[3];
    for (int k = 0; k < 3; k++) {
        make_weight(&t[k], dt, per_channel, rows[k], cols, 90u + (unsigned)k);
        if (c->bias) {
            float *b = randv(rows[k], 95u + (unsigned)k, 0.5f);
            bias[k] = to_gpu(b, (size_t)rows[k] * sizeof *b);
            free(b);
        }
        outs[k] = (qlm_matmul_out){nan_gpu((long)n * rows[k]), &t[k].dev, bias[k], 0};
        refs[k] = outs[k];
        refs[k].y = nan_gpu((long)n * rows[k]);
    }
    qlm_kv_step kv = {.pos = pos, .inv_freq = c->rope ? dinv : NULL, .n_heads = c->heads, .n_kv_heads = c->kv_heads,
                      .head_dim = hd, .k_cache = dcache[0][0], .v_cache = dcache[0][1], .kv = c->kv,
                      .slots = c->slots ? slots : NULL, .store_pos = store_pos, .max_pos = max_pos};
    const qlm_x_step step = {.kind = QLM_X_RMSNORM, .x = dx, .a = da, .weight = dnw, .eps = 1e-5f};
    assert_int_equal(gpu->step_matmul_group(outs, 3, &step, &kv, n), 0);
    gpu->rmsnorm(dx_ref, da, dnw, n, cols, 1e-5f);
    assert_int_equal(gpu->matmul_group(refs, 3, dx_ref, n), 0);
    kv.k_cache = dcache[1][0], kv.v_cache = dcache[1][1];
    gpu->rope_store(refs[0].y, refs[1].y, refs[2].y, n, &kv);

    long differ = 0;
    double worst = 0;
    float *y[3];
    for (int k = 0; k < 3; k++) {
        const long m = (long)n * rows[k];
        float *want = from_gpu(refs[k].y, m);
        y[k] = from_gpu(outs[k].y, m);
        worst = fmax(worst, rel_diff(y[k], want, m));
        for (long i = 0; i < m; i++) differ += y[k][i] != want[i];
        free(want);
    }
    void *raw = malloc(cache_bytes);
    assert_non_null(raw);
    for (int kv_i = 0; kv_i < 2; kv_i++) {
        gpu->to_host(raw, dcache[1][kv_i], cache_bytes);
        float *want = cache_floats(raw, c->kv, cells);
        gpu->to_host(raw, dcache[0][kv_i], cache_bytes);
        float *got = cache_floats(raw, c->kv, cells);
        assert_true(rel_diff(got, want, cells) <= (c->kv == QLM_BF16 ? 1.0 / 256 : 1e-5));
        for (long i = 0; i < cells; i++) differ += got[i] != want[i];
        /* each row's k or v at its place, as the cache's dtype holds it */
        for (int i = 0; i < n; i++)
            for (int h = 0; h < c->kv_heads; h++)
                for (int e = 0; e < hd; e++) {
                    const size_t at = (((size_t)(c->slots ? slots[i] : 0) * c->kv_heads + h) * max_pos + store_pos[i]) * hd + e;
                    const float v = y[1 + kv_i][((size_t)i * c->kv_heads + h) * hd + e];
                    assert_true(got[at] == (c->kv == QLM_BF16 ? bf16_round(v) : v));
                }
        free(want), free(got);
    }
    print_message("norm + q+k+v + %s, %s%s x %d, %d rows, %d/%d heads of %d, %s cache%s%s: max diff %.2e, %ld values differ\n",
                  c->rope ? "rope_store" : "kv_store", qlm_dtype_name(dt), per_channel ? "-pc" : "", cols, n, c->heads,
                  c->kv_heads, hd, qlm_dtype_name(c->kv), c->slots ? ", slots" : "", c->bias ? ", biases" : "", worst,
                  differ);
    assert_true(worst <= 1e-5);
    for (int k = 0; k < 3; k++) {
        free(y[k]);
        gpu->free(outs[k].y), gpu->free(refs[k].y), gpu->free(bias[k]);
        free_weight(&t[k]);
    }
    for (int f = 0; f < 2; f++)
        for (int kv_i = 0; kv_i < 2; kv_i++) gpu->free(dcache[f][kv_i]);
    free(a), free(nw), free(inv), free(start), free(start_bytes), free(raw);
    gpu->free(da), gpu->free(dnw), gpu->free(dinv), gpu->free(dx), gpu->free(dx_ref);
}

/* The kv step inside the q/k/v GEMV (SmolLM2's heads, BF16 and F32 caches, slots, INT8 per channel,
 * Qwen2's biases, T5's store without RoPE; 1 to 8 rows) and the shapes it leaves to the ops one
 * after the other: 9 rows, and heads of 8 (a rotated pair would straddle two tiles' halves). */
static void test_step_matmul_group_kv(void **state) {
    (void)state;
    const kv_case smol = {9, 3, 64, 1, 1, 0, QLM_BF16}, qwen = {4, 2, 32, 1, 0, 1, QLM_F32};
    const kv_case t5 = {2, 2, 64, 0, 1, 0, QLM_F32}, narrow = {4, 4, 8, 1, 0, 0, QLM_BF16};
    const int ns[] = {1, 2, 3, 8, 9};
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
        check_step_kv(QLM_BF16, 0, 576, ns[j], &smol);
        check_step_kv(QLM_I8, 1, 256, ns[j], &qwen);
    }
    check_step_kv(QLM_BF16, 0, 128, 2, &t5);
    check_step_kv(QLM_I8, 0, 128, 1, &t5);
    check_step_kv(QLM_BF16, 0, 64, 3, &narrow);
}

/* The same op on the CPU and the GPU over the same inputs. */
static void test_rows_ops(void **state) {
    (void)state;
    const int n = 5, dim = 300, heads = 6, hd = 50;
    float *x = randv((long)n * dim, 1u, 4.0f), *w = randv(dim, 2u, 1.0f), *want = malloc((size_t)n * dim * sizeof *want);
    float *dx = to_gpu(x, (size_t)n * dim * sizeof *x), *dw = to_gpu(w, (size_t)dim * sizeof *w);
    cpu->rmsnorm(want, x, w, n, dim, 1e-5f);
    gpu->rmsnorm(dx, dx, dw, n, dim, 1e-5f);
    float *got = from_gpu(dx, (long)n * dim);
    assert_true(rel_diff(got, want, (long)n * dim) <= 1e-6);
    free(got);
    /* wider than the rows the kernel holds in registers */
    const int wide = 5000;
    float *xw = randv(2L * wide, 21u, 3.0f), *ww = randv(wide, 23u, 1.0f), *want_w = malloc(2 * wide * sizeof *want_w);
    float *dxw = to_gpu(xw, 2 * wide * sizeof *xw), *dww = to_gpu(ww, wide * sizeof *ww);
    cpu->rmsnorm(want_w, xw, ww, 2, wide, 1e-6f);
    gpu->rmsnorm(dxw, dxw, dww, 2, wide, 1e-6f);
    got = from_gpu(dxw, 2L * wide);
    assert_true(rel_diff(got, want_w, 2L * wide) <= 1e-6);
    free(got), free(xw), free(ww), free(want_w);
    gpu->free(dxw), gpu->free(dww);

    int pos[5] = {0, 7, 100, 2047, 31};
    const int kv_heads = 2;
    float *inv = randv(hd / 2, 3u, 0.5f), *r = randv((long)n * heads * hd, 4u, 1.0f), *rk = randv((long)n * kv_heads * hd, 8u, 1.0f);
    for (int j = 0; j < hd / 2; j++) inv[j] = fabsf(inv[j]);
    float *dr = to_gpu(r, (size_t)n * heads * hd * sizeof *r), *dinv = to_gpu(inv, (size_t)hd / 2 * sizeof *inv);
    float *drk = to_gpu(rk, (size_t)n * kv_heads * hd * sizeof *rk);
    cpu->rope(r, rk, n, pos, heads, kv_heads, hd, inv);
    gpu->rope(dr, drk, n, pos, heads, kv_heads, hd, dinv);
    got = from_gpu(dr, (long)n * heads * hd);
    assert_true(rel_diff(got, r, (long)n * heads * hd) <= 1e-5);
    free(got);
    got = from_gpu(drk, (long)n * kv_heads * hd);
    assert_true(rel_diff(got, rk, (long)n * kv_heads * hd) <= 1e-5);
    free(got), free(rk);
    gpu->free(drk);

    const long m = 5000;
    float *g = randv(m, 6u, 12.0f), *u = randv(m, 7u, 1.0f), *dg = to_gpu(g, m * sizeof *g), *du = to_gpu(u, m * sizeof *u);
    float *out = malloc(m * sizeof *out), *dout = gpu->alloc(m * sizeof *dout);
    for (int a = QLM_ACT_SILU; a <= QLM_ACT_RELU; a++) {
        cpu->glu(out, g, u, m, (qlm_act)a);
        gpu->glu(dout, dg, du, m, (qlm_act)a);
        got = from_gpu(dout, m);
        assert_true(rel_diff(got, out, m) <= 1e-6);
        free(got);
    }
    gpu->add(dg, du, m);
    gpu->scale(dg, m, -0.5f);
    got = from_gpu(dg, m);
    for (long i = 0; i < m; i++) assert_float_equal(got[i], (g[i] + u[i]) * -0.5f, 1e-6);
    free(got);
    free(x), free(w), free(want), free(inv), free(r), free(g), free(u), free(out);
    gpu->free(dx), gpu->free(dw), gpu->free(dr), gpu->free(dinv), gpu->free(dg), gpu->free(du), gpu->free(dout);
}

/* rope_store on the GPU against rope then kv_store on the CPU: q and k rotated at pos, k and v
 * stored at other positions (a rolling cache's) of slots (NULL: slot 0). A BF16 cache may round a
 * key the other way after the two backends' sines differ in the last bit: 2^-8 relative. */
static void check_rope_store(qlm_dtype kv, const int *slots) {
    const int n = 3, q_heads = 4, heads = 2, hd = 16, max_pos = 10, n_slots = 2;
    const int pos[3] = {19, 0, 14}, store_pos[3] = {9, 0, 4};
    const long nq = (long)n * q_heads * hd, nk = (long)n * heads * hd, cells = (long)n_slots * heads * max_pos * hd;
    const size_t bytes = (size_t)cells * (kv == QLM_BF16 ? 2 : 4);
    float *q = randv(nq, 31u, 1.0f), *k = randv(nk, 32u, 1.0f), *v = randv(nk, 33u, 1.0f), *inv = randv(hd / 2, 34u, 0.5f);
    for (int j = 0; j < hd / 2; j++) inv[j] = fabsf(inv[j]);
    float *dq = to_gpu(q, (size_t)nq * sizeof *q), *dk = to_gpu(k, (size_t)nk * sizeof *k);
    float *dv = to_gpu(v, (size_t)nk * sizeof *v), *dinv = to_gpu(inv, (size_t)hd / 2 * sizeof *inv);
    void *want_k = calloc(1, bytes), *want_v = calloc(1, bytes), *got = malloc(bytes);
    void *dkc = to_gpu(want_k, bytes), *dvc = to_gpu(want_v, bytes);
    const qlm_kv_step on_cpu = {.pos = pos, .inv_freq = inv, .n_heads = q_heads, .n_kv_heads = heads, .head_dim = hd,
                                .k_cache = want_k, .v_cache = want_v, .kv = kv, .slots = slots, .store_pos = store_pos,
                                .max_pos = max_pos};
    qlm_kv_step on_gpu = on_cpu;
    on_gpu.inv_freq = dinv, on_gpu.k_cache = dkc, on_gpu.v_cache = dvc;
    cpu->rope_store(q, k, v, n, &on_cpu);
    gpu->rope_store(dq, dk, dv, n, &on_gpu);
    float *got_q = from_gpu(dq, nq), *got_k = from_gpu(dk, nk);
    assert_true(rel_diff(got_q, q, nq) <= 1e-5);
    assert_true(rel_diff(got_k, k, nk) <= 1e-5);
    const double bound = kv == QLM_BF16 ? 1.0 / 256 : 1e-5;
    gpu->to_host(got, dkc, bytes);
    float *a = cache_floats(got, kv, cells), *b = cache_floats(want_k, kv, cells);
    assert_true(rel_diff(a, b, cells) <= bound);
    free(a), free(b);
    gpu->to_host(got, dvc, bytes);
    assert_memory_equal(got, want_v, bytes);
    free(q), free(k), free(v), free(inv), free(want_k), free(want_v), free(got), free(got_q), free(got_k);
    gpu->free(dq), gpu->free(dk), gpu->free(dv), gpu->free(dinv), gpu->free(dkc), gpu->free(dvc);
}

/* The GPU's key and value caches equal the CPU's, byte for byte. */
static void check_caches(const void *dkc, const void *dvc, const void *want_k, const void *want_v, size_t bytes) {
    void *got = malloc(bytes);
    assert_non_null(got);
    gpu->to_host(got, dkc, bytes);
    assert_memory_equal(got, want_k, bytes);
    gpu->to_host(got, dvc, bytes);
    assert_memory_equal(got, want_v, bytes);
    free(got);
}

static void test_embedding_and_kv_store(void **state) {
    (void)state;
    const int ids[4] = {3, 0, 99, 3}, vocab = 100, dim = 48;
    for (int dt = QLM_F32; dt <= QLM_I8; dt++) { /* the CUDA backend runs no block types */
        test_weight t;
        make_weight(&t, (qlm_dtype)dt, dt == QLM_I8, vocab, dim, 11u);
        float *want = malloc(4 * dim * sizeof *want), *dout = gpu->alloc(4 * dim * sizeof(float));
        cpu->embedding(want, &t.host, ids, 4);
        gpu->embedding(dout, &t.dev, ids, 4);
        float *got = from_gpu(dout, 4 * dim);
        assert_memory_equal(got, want, 4 * dim * sizeof *got);
        free(got), free(want);
        gpu->free(dout);
        free_weight(&t);
    }
    const int n = 3, heads = 2, hd = 8, max_pos = 10, n_slots = 2, slots[3] = {1, 0, 1}, pos[3] = {9, 0, 4};
    for (int bf = 0; bf < 2; bf++) {
        qlm_dtype kv = bf ? QLM_BF16 : QLM_F32;
        size_t bytes = (size_t)n_slots * heads * max_pos * hd * (bf ? 2 : 4);
        size_t src_bytes = (size_t)n * heads * hd * sizeof(float);
        float *k = randv(n * heads * hd, 12u, 1.0f), *v = randv(n * heads * hd, 13u, 1.0f);
        float *dk = to_gpu(k, src_bytes), *dv = to_gpu(v, src_bytes);
        void *want_k = calloc(1, bytes), *want_v = calloc(1, bytes);
        void *dkc = gpu->alloc(bytes), *dvc = gpu->alloc(bytes);
        gpu->to_device(dkc, want_k, bytes);
        gpu->to_device(dvc, want_v, bytes);
        cpu->kv_store(want_k, want_v, kv, k, v, n, slots, 0, pos, heads, hd, max_pos);
        gpu->kv_store(dkc, dvc, kv, dk, dv, n, slots, 0, pos, heads, hd, max_pos);
        check_caches(dkc, dvc, want_k, want_v, bytes);
        free(k), free(v), free(want_k), free(want_v);
        gpu->free(dk), gpu->free(dv), gpu->free(dkc), gpu->free(dvc);
        check_rope_store(kv, slots);
        check_rope_store(kv, NULL);
    }
}

/* Index arrays fill the queue's staging ring (2^20 ints) twice over without a sync point: cache
 * stores of 3072 rows, each staging its slots then its positions, 6144 ints an op. Had the ring
 * been emptied between one op's two arrays (the 171st op's, at 1044480 + 3072 + 3072 ints), the
 * next queue would have written its own arrays over that op's slots before it ran. Slots and
 * positions change from op to op, so stale ones put rows in the wrong cells. */
static void test_ring_between_arrays(void **state) {
    (void)state;
    enum { N = 3072, OPS = 360, SLOTS = 3, HEADS = 1, HD = 8, MAX_POS = 4096 };
    const size_t bytes = (size_t)SLOTS * HEADS * MAX_POS * HD * sizeof(float);
    float *k = randv((long)N * HEADS * HD, 41u, 1.0f), *v = randv((long)N * HEADS * HD, 42u, 1.0f);
    float *dk = to_gpu(k, (size_t)N * HEADS * HD * sizeof *k), *dv = to_gpu(v, (size_t)N * HEADS * HD * sizeof *v);
    void *want_k = calloc(1, bytes), *want_v = calloc(1, bytes);
    void *dkc = to_gpu(want_k, bytes), *dvc = to_gpu(want_v, bytes);
    int *slots = malloc(N * sizeof *slots), *pos = malloc(N * sizeof *pos);
    for (int op = 0; op < OPS; op++) {
        for (int i = 0; i < N; i++) slots[i] = (i + op) % SLOTS, pos[i] = (i + 5 * op) % MAX_POS;
        cpu->kv_store(want_k, want_v, QLM_F32, k, v, N, slots, 0, pos, HEADS, HD, MAX_POS);
        gpu->kv_store(dkc, dvc, QLM_F32, dk, dv, N, slots, 0, pos, HEADS, HD, MAX_POS);
    }
    check_caches(dkc, dvc, want_k, want_v, bytes);
    free(k), free(v), free(want_k), free(want_v), free(slots), free(pos);
    gpu->free(dk), gpu->free(dv), gpu->free(dkc), gpu->free(dvc);
}

/* One attention call on both backends: caches of n_slots slots of max_pos rows in the decode
 * layout (slots given; over fixed keys with each slot's heads packed) or one [keys][kv_dim] block
 * (no slots). window > 0: a sliding window over rolling caches of window + n rows, scores capped
 * at 20 (Gemma 2's form). */
static void check_attention(int n, int heads, int kv_heads, int hd, int keys, int n_keys_mode, int with_bias,
                            int with_slots, int bf16, int window) {
    const int n_slots = with_slots ? 3 : 1;
    qlm_attn_shape sh = {.n_heads = heads, .n_kv_heads = kv_heads, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
    int *pos = malloc((size_t)n * sizeof *pos), *slots = malloc((size_t)n * sizeof *slots), slot_keys[3] = {keys, 1, keys / 2 + 1};
    for (int i = 0; i < n; i++) {
        slots[i] = i % n_slots;
        pos[i] = n_keys_mode ? i % keys : keys - n + i;
        if (with_slots && !n_keys_mode) pos[i] = (i * 13) % keys;
    }
    if (n_keys_mode) sh.n_keys = keys;
    if (window) sh.window = window, sh.ring = window + n, sh.softcap = 20.0f;
    long bias_len = 0;
    float *bias = NULL;
    if (with_bias) {
        sh.pos_bias_span = 2 * keys - 1;
        sh.pos_bias_offset = keys - 1;
        bias_len = (long)heads * sh.pos_bias_span;
        bias = randv(bias_len, 21u, 2.0f);
    }
    if (with_slots) {
        sh.slots = slots;
        sh.slot_keys = n_keys_mode ? slot_keys : NULL;
        qlm_kv_shape(&sh, keys, bf16 ? QLM_BF16 : QLM_F32);
        sh.heads_packed = n_keys_mode; /* as T5's cross-attention caches */
    }
    sh.kv_dtype = bf16 ? QLM_BF16 : QLM_F32;
    long q_len = (long)n * heads * hd, kv_len = (long)n_slots * keys * kv_heads * hd;
    float *q = randv(q_len, 22u, 1.5f), *k = randv(kv_len, 23u, 1.5f), *v = randv(kv_len, 24u, 1.0f);
    void *kc = k, *vc = v;
    if (bf16) {
        kc = malloc((size_t)kv_len * 2), vc = malloc((size_t)kv_len * 2);
        qlm_convert_from_f32(kc, QLM_BF16, k, kv_len);
        qlm_convert_from_f32(vc, QLM_BF16, v, kv_len);
    }
    size_t kv_bytes = (size_t)kv_len * (bf16 ? 2 : 4);
    float *want = malloc((size_t)q_len * sizeof *want), *dq = to_gpu(q, (size_t)q_len * sizeof *q);
    void *dk = to_gpu(kc, kv_bytes), *dv = to_gpu(vc, kv_bytes);
    float *dbias = bias ? to_gpu(bias, (size_t)bias_len * sizeof *bias) : NULL, *dout = gpu->alloc((size_t)q_len * sizeof(float));
    qlm_attn_shape gsh = sh;
    gsh.pos_bias = dbias;
    /* The reference: the CPU over the stored values widened to F32 (its BF16 forms round q too). */
    sh.pos_bias = bias;
    sh.kv_dtype = QLM_F32;
    if (bf16) {
        qlm_convert_to_f32(k, kc, QLM_BF16, kv_len);
        qlm_convert_to_f32(v, vc, QLM_BF16, kv_len);
    }
    cpu->attention(want, q, k, v, n, pos, &sh);
    gpu->attention(dout, dq, dk, dv, n, pos, &gsh);
    float *got = from_gpu(dout, q_len);
    double d = rel_diff(got, want, q_len);
    print_message("attention n %3d heads %d/%d hd %3d keys %4d %s%s%s%s%s: %.2e\n", n, heads, kv_heads, hd, keys,
                  n_keys_mode ? "all keys" : "causal", with_bias ? " + bias" : "", with_slots ? " slots" : "",
                  bf16 ? " bf16" : "", window ? " window, ring, softcap" : "", d);
    assert_true(d <= 2e-5);
    free(pos), free(slots), free(bias), free(q), free(k), free(v), free(want), free(got);
    if (bf16) free(kc), free(vc);
    gpu->free(dq), gpu->free(dk), gpu->free(dv), gpu->free(dbias), gpu->free(dout);
}

static void test_attention(void **state) {
    (void)state;
    for (int bf = 0; bf < 2; bf++) {
        check_attention(1, 9, 3, 64, 70, 0, 0, 0, bf, 0);    /* decode, GQA */
        check_attention(20, 4, 2, 16, 20, 0, 0, 0, bf, 0);   /* causal prefill */
        check_attention(33, 8, 8, 64, 33, 1, 1, 0, bf, 0);   /* T5 encoder: all keys + bias */
        check_attention(6, 4, 4, 96, 300, 0, 1, 1, bf, 0);   /* T5 decoder: slots + causal bias */
        check_attention(7, 4, 4, 8, 45, 1, 0, 1, bf, 0);     /* cross-attention: per-slot key counts */
        check_attention(100, 6, 2, 256, 100, 0, 0, 0, bf, 0); /* wide heads, many rows (device index arrays) */
        check_attention(1, 32, 4, 64, 2048, 0, 0, 0, bf, 0);  /* decode over a long context: keys split */
        check_attention(3, 8, 8, 64, 1500, 1, 1, 1, bf, 0);   /* split, per-slot key counts (one under a span), bias */
        check_attention(2, 4, 4, 64, 40000, 0, 0, 0, bf, 0);  /* more keys than MAX_SPLITS spans of 256 */
        check_attention(5, 4, 2, 50, 60, 0, 0, 1, bf, 0);     /* rows of 50: no 16-byte loads */
        check_attention(3, 4, 2, 320, 90, 0, 1, 0, bf, 0);    /* head_dim over 256 */
        check_attention(12, 4, 2, 64, 200, 0, 0, 1, bf, 16);  /* sliding window over rolling caches */
        check_attention(1, 8, 2, 64, 3000, 0, 0, 0, bf, 1024); /* a window far along, its keys split */
    }
}

/* A batch mixing two adapter pairs (F32 and BF16) and rows without one, on both backends. */
static void test_lora(void **state) {
    (void)state;
    enum { N = 70, IN = 96, OUT = 80 };
    const int ranks[2] = {8, 16};
    test_weight A[2], B[2];
    qlm_lora_ref host_ref[2], dev_ref[2];
    for (int k = 0; k < 2; k++) {
        qlm_dtype dt = k ? QLM_BF16 : QLM_F32;
        make_weight(&A[k], dt, 0, ranks[k], IN, 60u + (unsigned)k);
        make_weight(&B[k], dt, 0, OUT, ranks[k], 70u + (unsigned)k);
        host_ref[k] = (qlm_lora_ref){&A[k].host, &B[k].host, 0.5f + k};
        dev_ref[k] = (qlm_lora_ref){&A[k].dev, &B[k].dev, 0.5f + k};
    }
    const qlm_lora_ref *host_rows[N], *dev_rows[N];
    for (int i = 0; i < N; i++) {
        int pick = (i * 7) % 3; /* 0, 1: a pair; 2: none */
        host_rows[i] = pick < 2 ? &host_ref[pick] : NULL;
        dev_rows[i] = pick < 2 ? &dev_ref[pick] : NULL;
    }
    float *x = randv((long)N * IN, 80u, 1.0f), *y = randv((long)N * OUT, 81u, 1.0f);
    float *dx = to_gpu(x, (size_t)N * IN * sizeof *x), *dy = to_gpu(y, (size_t)N * OUT * sizeof *y);
    assert_int_equal(cpu->lora(y, x, N, host_rows), 0);
    assert_int_equal(gpu->lora(dy, dx, N, dev_rows), 0);
    float *got = from_gpu(dy, (long)N * OUT);
    double d = rel_diff(got, y, (long)N * OUT);
    print_message("lora, %d rows over 2 pairs and none: %.2e\n", N, d);
    assert_true(d <= 1e-5);
    free(x), free(y), free(got);
    gpu->free(dx), gpu->free(dy);
    for (int k = 0; k < 2; k++) free_weight(&A[k]), free_weight(&B[k]);
}

/* More memory than any GPU has is an error naming the size, not a crash. */
static void test_out_of_memory(void **state) {
    (void)state;
    void *p = gpu->alloc((size_t)1 << 50);
    assert_null(p);
    assert_non_null(strstr(qlm_last_error(), "out of GPU memory"));
    print_message("%s\n", qlm_last_error());
}

int main(void) {
    gpu = qlm_backend_cuda();
    cpu = qlm_backend_cpu();
    if (!gpu) {
        fprintf(stderr, "test_backend_ops needs a GPU: %s\n", qlm_last_error());
        return 1;
    }
    char line[256];
    gpu->describe(line, sizeof line);
    printf("%s\n", line);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),          cmocka_unit_test(test_matmul_exact),
        cmocka_unit_test(test_matmul_int8_special_x), cmocka_unit_test(test_matmul_special_weight),
        cmocka_unit_test(test_matmul_int8_large),
        cmocka_unit_test(test_matmul_group),    cmocka_unit_test(test_step_matmul_group),
        cmocka_unit_test(test_step_matmul_group_kv),
        cmocka_unit_test(test_rows_ops),        cmocka_unit_test(test_embedding_and_kv_store),
        cmocka_unit_test(test_ring_between_arrays),
        cmocka_unit_test(test_attention),       cmocka_unit_test(test_lora),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
