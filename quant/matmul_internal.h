/* Private to quant/: the table of ISA-specific kernels behind qlm_matmul and the bulk
 * conversions. One table per instruction set; matmul.c picks the best the CPU supports. */
#ifndef QLM_MATMUL_INTERNAL_H
#define QLM_MATMUL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "../core/weight.h"
#include "half.h"

typedef struct {
    const char *name;
    /* y[i][o] = dot(W[o], x[i]) (* I8 scale) (+ bias[o]) for r0 <= o < r1, i < n (x rows of
     * stride cols, in qlm_x_dtype(w->dtype); y rows of stride rows); y and bias are indexed by the
     * absolute output o. Single-threaded. */
    void (*gemm)(float *y, const void *x, int n, const qlm_weight *w, int r0, int r1, const float *bias);
    /* See qlm_dot_rows_f32. */
    void (*dot_rows)(float *y, long ldy, const float *x, int n, const float *w, size_t w_stride, int rows, long cols);
    /* See qlm_weighted_sum_f32. */
    void (*weighted_sum)(float *o, const float *p, int g, long ldp, const float *v, size_t v_stride, int m, long hd);
    /* See qlm_exp_f32. */
    void (*exp)(float *x, long n);
    void (*f16_to_f32)(float *dst, const uint16_t *src, long n);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, long n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, long n);
    void (*f32_to_bf16)(uint16_t *dst, const float *src, long n);
    /* dst[i] = src[i] * scale */
    void (*i8_to_f32)(float *dst, const int8_t *src, long n, float scale);
} qlm_kernel_table;

#if defined(__x86_64__)
extern const qlm_kernel_table qlm_kernels_avx2;
extern const qlm_kernel_table qlm_kernels_avx512;
extern const qlm_kernel_table qlm_kernels_avx512bf16;
#endif

/* The table in use: the best the CPU supports, or the one forced by qlm_matmul_force_isa. */
const qlm_kernel_table *qlm_kernels(void);


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

/* Element size of the weight dtypes the kernels take. */
static inline size_t qlm_weight_elem_size(qlm_dtype dt) {
    return dt == QLM_F32 ? 4 : dt == QLM_I8 ? 1 : 2;
}

/* The activations weights of dtype w multiply: BF16 weights take x rounded to BF16 (round to
 * nearest even, as PyTorch's bf16 matmul does), so that CPUs with a BF16 dot product (two
 * products per lane and instruction, no conversion of W) and those without give the same
 * products; every other dtype takes F32 x. Sums are F32 either way. */
static inline qlm_dtype qlm_x_dtype(qlm_dtype w) {
    return w == QLM_BF16 ? QLM_BF16 : QLM_F32;
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

/* Applies the I8 scale of output o and the bias to a raw dot product. */
static inline float qlm_gemv_finish(float s, const qlm_weight *w, int o, const float *bias) {
    if (w->dtype == QLM_I8) s *= w->row_scales ? w->row_scales[o] : w->scale;
    return bias ? s + bias[o] : s;
}

#endif
