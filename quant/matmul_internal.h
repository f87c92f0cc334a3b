/* Private to quant/: the table of ISA-specific kernels behind qlm_matmul and the bulk
 * conversions. One table per instruction set; matmul.c picks the best the CPU supports. */
#ifndef QLM_MATMUL_INTERNAL_H
#define QLM_MATMUL_INTERNAL_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/weight.h"
#include "half.h"
#include "x_int_form.h"

typedef struct {
    const char *name;
    /* y[i][o] = dot(W[o], x[i]) (* I8 scales) (+ bias[o]) for r0 <= o < r1, i < n (x rows of
     * cols elements in the activation form of w->dtype, see qlm_x_dtype, ldx elements apart;
     * x_scale: the row scales of the I16 form, else NULL; y rows of stride rows); y and bias are
     * indexed by the absolute output o. Single-threaded. */
    void (*gemm)(float *y, const void *x, long ldx, const float *x_scale, int n, const qlm_weight *w, int r0, int r1,
                 const float *bias);
    /* q[k] = x[k] / s rounded, k < n, in the I16 form (qlm_x_int_scale); returns s. */
    float (*quantize_i16)(int16_t *q, const float *x, long n);
    /* Where the CPU multiplies bytes (VPDPBUSD), else NULL (qlm_w8a8_rows and its quantizer
     * serve): x[0..n) (n a multiple of QLM_X8_BLOCK) in the I8 form, each run of QLM_X8_BLOCK
     * values q = x / s rounded with its own s in scales[run] (qlm_x_int_scale with QLM_X8_MAX)
     * and the sum of its q in sums[run]. */
    void (*quantize_i8)(int8_t *q, float *scales, int32_t *sums, const float *x, long n);
    /* gemm for block weights with act8 (in panels, block_pack.h) and x in the I8 form: xs and
     * xsum hold each row's cols / QLM_X8_BLOCK run scales and sums, row after row. r0 is a
     * multiple of QLM_PANEL_ROWS, r1 too or w->rows. */
    void (*gemm_w8a8)(float *y, const int8_t *x, long ldx, const float *xs, const int32_t *xsum, int n,
                      const qlm_weight *w, int r0, int r1, const float *bias);
    /* See qlm_dot_rows. */
    void (*dot_rows)(float *y, long ldy, const void *x, int n, const void *w, size_t w_stride, int rows, long cols,
                     qlm_dtype dt);
    /* See qlm_weighted_sum. */
    void (*weighted_sum)(float *o, const float *p, int g, long ldp, const void *v, size_t v_stride, int m, long hd,
                         qlm_dtype dt);
    /* See qlm_exp_f32. */
    void (*exp)(float *x, long n);
    void (*f16_to_f32)(float *dst, const uint16_t *src, long n);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, long n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, long n);
    void (*f32_to_bf16)(uint16_t *dst, const float *src, long n);
    /* BF16 weights' activation form of x[0..n) (one row), bf16_x_size bytes an element: BF16
     * where the CPU has a BF16 dot product; elsewhere the F32 values of x rounded to BF16, each
     * whole step of the kernels' columns (32 for AVX-512, 16 for AVX2) as its even-indexed then
     * its odd-indexed values (the rest as they come): a vector load of BF16 weights splits into
     * its even and odd halves as F32 by one shift and one AND, where widening it in order takes
     * two instructions per half, on the ports the FMAs use. */
    void (*bf16_x_form)(void *dst, const float *x, long n);
    int bf16_x_size;
    /* dst[i] = src[i] * scale */
    void (*i8_to_f32)(float *dst, const int8_t *src, long n, float scale);
    /* Where the CPU has AMX (else NULL): x[0..n) (n a multiple of 16), times scales[k] where scales
     * is not NULL, in the I24 form q = x / s rounded (qlm_x_int_scale with QLM_I24_MAX), as three
     * planes of bytes q = 65536 top + 256 hi + lo (top signed, hi and lo unsigned); returns s. */
    float (*i24_planes)(int8_t *top, uint8_t *hi, uint8_t *lo, const float *x, const float *scales, long n);
    /* Where the CPU has AMX (else NULL): y[i][k] = scale sum_o q[i][o] W[o][k] (with add: y[i][k]
     * plus that) for the outputs k0 <= k < k1 of an I8 weight whose rows count is a multiple of 64
     * up to 65,536, and n rows of x in i24_planes' planes (each row of each plane ld bytes from the
     * next, the planes plane bytes apart, zero rows up to a whole 16; row scales xs), y's rows
     * w->cols apart: each sum exact, rounded once to F32, then times xs[i] and scale. */
    void (*gemm_i8_xw)(float *y, const char *x, long ld, long plane, const float *xs, int n, const qlm_weight *w,
                       float scale, int k0, int k1, int add);
    /* out[i] = 0 where element first + i drops (qlm_dropout_drops with base and threshold), else
     * x[i] * keep_scale, for i < n (out may be x). */
    void (*dropout)(float *out, const float *x, long n, float keep_scale, uint64_t base, uint64_t threshold,
                    long first);
} qlm_kernel_table;

/* Unrolls a tile's loop n times (its count, once the call site's constants are inlined) under GCC,
 * which unrolls after inlining. Clang unrolls a count pragma in the function as written, before
 * inlining, at run time, and then keeps the tile's accumulators in memory (prefill 2-5x slower);
 * left alone, it unrolls the loops fully once their counts are constants. */
#define QLM_PRAGMA(text) _Pragma(#text)
#if defined(__clang__)
#define QLM_UNROLL(n) QLM_PRAGMA(clang loop unroll(full))
#else
#define QLM_UNROLL(n) QLM_PRAGMA(GCC unroll n)
#endif

#if defined(__x86_64__)
/* A SIMD file's table: every one names its kernels alike (its gemm and dot_rows may be fronts of
 * them; i24_planes_fn and gemm_i8_xw_fn are NULL where it has none). */
#define QLM_SIMD_KERNEL_TABLE(table, table_name, gemm_fn, dot_rows_fn, i24_planes_fn, gemm_i8_xw_fn)           \
    const qlm_kernel_table table = {.name = table_name,                                                         \
                                    .gemm = gemm_fn,                                                            \
                                    .quantize_i16 = quantize_i16,                                               \
                                    .quantize_i8 = quantize_i8,                                                 \
                                    .gemm_w8a8 = gemm_w8a8,                                                     \
                                    .dot_rows = dot_rows_fn,                                                    \
                                    .weighted_sum = weighted_sum,                                               \
                                    .exp = exp_f32,                                                             \
                                    .f16_to_f32 = f16_to_f32,                                                   \
                                    .bf16_to_f32 = bf16_to_f32,                                                 \
                                    .f32_to_f16 = f32_to_f16,                                                   \
                                    .f32_to_bf16 = f32_to_bf16,                                                 \
                                    .bf16_x_form = bf16_x_form,                                                 \
                                    .bf16_x_size = BF16_X_SIZE,                                                 \
                                    .i8_to_f32 = i8_to_f32,                                                     \
                                    .i24_planes = i24_planes_fn,                                                \
                                    .gemm_i8_xw = gemm_i8_xw_fn,                                                \
                                    .dropout = dropout}

extern const qlm_kernel_table qlm_kernels_avx2;
extern const qlm_kernel_table qlm_kernels_avxvnni;
extern const qlm_kernel_table qlm_kernels_avx512;
extern const qlm_kernel_table qlm_kernels_avx512vnni;
extern const qlm_kernel_table qlm_kernels_avx512bf16;
extern const qlm_kernel_table qlm_kernels_amx;
#endif

/* The table in use: the best the CPU supports, or the one forced by qlm_matmul_force_isa. */
const qlm_kernel_table *qlm_kernels(void);

/* The scalar gemm_w8a8: rows [r0, r1) of any act8 weight, a panel's blocks taken out one by one.
 * The kernel tables' own take the rows past the last panel here. */
void qlm_w8a8_rows(float *y, const int8_t *x, long ldx, const float *xs, const int32_t *xsum, int n,
                   const qlm_weight *w, int r0, int r1, const float *bias);

/* Every F16 bit pattern as F32, filled before qlm_kernels first returns: the block kernels read
 * a block's scale with one broadcast load from it rather than converting it in vector registers
 * (three instructions on the two ports the 512-bit arithmetic shares, per weight row and block).
 * The scales of one model use a few hundred entries, which stay in cache. */
extern float qlm_f16_lut[65536];


/* e^x = 2^k e^r with k = round(x log2 e) and r = x - k ln 2 (ln 2 in a high part exact in a few
 * bits and a low part, so r is exact), e^r by its degree-6 minimax polynomial on |r| <= ln2/2
 * (Cephes' expf coefficients), evaluated by Horner in FMA by the SIMD kernels. */
#define QLM_EXP_LOG2E 1.44269504088896341f
#define QLM_EXP_LN2_HI 0.693359375f
#define QLM_EXP_LN2_LO -2.12194440e-4f
#define QLM_EXP_P0 1.9875691500e-4f
#define QLM_EXP_P1 1.3981999507e-3f
#define QLM_EXP_P2 8.3334519073e-3f
#define QLM_EXP_P3 4.1665795894e-2f
#define QLM_EXP_P4 1.6666665459e-1f
#define QLM_EXP_P5 5.0000001201e-1f
/* r = x - k ln 2 and e^r from r, in the vector ops of the caller's ISA (FNMA(a, b, c) = c - a b,
 * FMA(a, b, c) = a b + c), so that each ISA's kernel spells the method once. */
#define QLM_EXP_REDUCE(x, k, FNMA, SET1) FNMA(k, SET1(QLM_EXP_LN2_LO), FNMA(k, SET1(QLM_EXP_LN2_HI), x))
#define QLM_EXP_POLY(r, FMA, SET1, MUL, ADD)                                                                   \
    FMA(FMA(FMA(FMA(FMA(FMA(SET1(QLM_EXP_P0), r, SET1(QLM_EXP_P1)), r, SET1(QLM_EXP_P2)), r, SET1(QLM_EXP_P3)), r, \
                    SET1(QLM_EXP_P4)),                                                                          \
                r, SET1(QLM_EXP_P5)),                                                                           \
        MUL(r, r), ADD(r, SET1(1.0f)))

/* Element size of the weight dtypes the kernels take element by element (not the block types). */
static inline size_t qlm_weight_elem_size(qlm_dtype dt) {
    return dt == QLM_F32 ? 4 : dt == QLM_I8 ? 1 : 2;
}

/* The activations weights of dtype w multiply (their activation form), the same on every path:
 * - BF16 weights take x rounded to BF16 (round to nearest even, as PyTorch's bf16 matmul does),
 *   so that CPUs with a BF16 dot product (two products per lane and instruction, no conversion
 *   of W) and those without give the same products; sums are F32. Those without keep it as F32
 *   in their own order (qlm_kernel_table.bf16_x_form).
 * - I8 weights take x in the I16 form: 16-bit integers q with one scale s per row of x,
 *   x ~ q s (qlm_x_i16_scale), so W x is a sum of exact integer products, two per lane and
 *   instruction (AVX-512 VNNI's VPDPWSSD, or VPMADDWD), and memory rather than converting W to
 *   F32 bounds decode. The rounding error of x (at most max|x| / 65534 per element) is far
 *   below that of the INT8 weights (max|w| / 254).
 * - block types (Q8_0, Q4_0, Q4_1) take the I16 form too: a block's products sum exactly in
 *   integers and each block adds its sum times its scale in F32 (Q4_1: plus its offset times the
 *   block's sum of x, also an integer).
 * - block weights with act8 set (W8A8, stored in panels: block_pack.h) take the I8 form: bytes q
 *   with one scale per run of 32 values (llama.cpp's Q8_0 for activations), and the run's sum of
 *   q; VPDPBUSD (AVX512_VNNI) multiplies them four products per lane and instruction, without
 *   widening W. Its error (at most max|x| / 254 over the run per element) is that of Q8_0
 *   weights: one scale per row of x instead cost SmolLM2-135M 3% of perplexity (outlier
 *   channels), runs of 32 0.13% (measured in PyTorch). Paths without VNNI take the same form in
 *   scalar code (for tests: the command line sets act8 only where VNNI runs it).
 * - every other dtype takes F32 x.
 * qlm_x_dtype names the F32 or BF16 form (QLM_F32 for I8 and block weights, whose form is not a
 * dtype). */
static inline qlm_dtype qlm_x_dtype(qlm_dtype w) {
    return w == QLM_BF16 ? QLM_BF16 : QLM_F32;
}

/* Whether weights of dtype w take x in the I16 form. */
static inline int qlm_x_is_i16(qlm_dtype w) {
    return w == QLM_I8 || qlm_dtype_is_block(w);
}

/* Bytes of one element of x in the activation form of weights of dtype w, W8A8's I8 form aside
 * (matmul.c's form_elem_size). */
static inline size_t qlm_x_elem_size(qlm_dtype w) {
    return w == QLM_BF16 || qlm_x_is_i16(w) ? 2 : 4;
}

/* Elements from one row of x's activation form (esize bytes each) to the next, for rows of cols elements: rows
 * whose bytes are a multiple of 4 KiB get a cache line more. Otherwise the GEMM's six x rows and
 * four weight rows (also 4 KiB apart then) all fall into one set of the 8-way L1 cache and
 * evict each other: T5's down projection (2048 BF16 columns) ran at 60% of the other products'
 * speed. */
static inline long qlm_x_row_stride(long cols, size_t esize) {
    return (size_t)cols * esize % 4096 == 0 ? cols + (long)(64 / esize) : cols;
}

/* Values of the I8 form that share a scale: a run of a block type's values. */
#define QLM_X8_BLOCK 32
/* Columns of an I8 row whose integer products one int32 lane sums before they are added up in
 * F32: with |q| <= 32767 and |w| <= 128, a lane of 8 (AVX2) holding 2 products per 16 columns
 * stays below 2^31 over 2048 / 8 = 256 products; a multiple of every kernel's step. */
#define QLM_I8_BLOCK 2048L

/* The bytes before a block's values (its F16 scale, and Q4_1's F16 offset) and those of each run
 * of 32 values. */
static inline int qlm_block_head(qlm_dtype dt) {
    return dt == QLM_Q4_1 ? 4 : 2;
}
static inline int qlm_block_run_bytes(qlm_dtype dt) {
    return dt == QLM_Q8_0 ? 32 : 16;
}

/* Element k of a row in storage dtype dt as F32, without the I8 scale (for scalar loops and tails). */
static inline float qlm_weight_at(const void *row, long k, qlm_dtype dt) {
    switch (dt) {
    case QLM_F16: return qlm_f16_to_f32(((const uint16_t *)row)[k]);
    case QLM_BF16: return qlm_bf16_to_f32(((const uint16_t *)row)[k]);
    case QLM_I8: return (float)((const int8_t *)row)[k];
    default: return ((const float *)row)[k];
    }
}

/* Applies the scales of a product over the I16 form (xs: that of the row of x; for I8, w's for
 * output o) and the bias to a raw dot product. */
static inline float qlm_gemv_finish(float s, const qlm_weight *w, int o, float xs, const float *bias) {
    if (w->dtype == QLM_I8) s = s * xs * (w->row_scales ? w->row_scales[o] : w->scale);
    else if (qlm_dtype_is_block(w->dtype)) s *= xs;
    return bias ? s + bias[o] : s;
}

#endif
