/* AVX-512 kernels (F + BW + VL): 16 floats per vector, the same structure as the AVX2 file.
 * Tails use masked loads and stores instead of scalar loops; a masked-off element is never
 * read, so rows may end at any column. matmul.c only selects this table when the CPU (and
 * the OS, for the ZMM state) supports all three extensions. */
#include "matmul_internal.h"

#if defined(__x86_64__)

#include <immintrin.h>

#define AVX512_TARGET "avx512f,avx512bw,avx512vl,fma,f16c"
#define AVX512_FN static __attribute__((target(AVX512_TARGET)))
#define AVX512_INLINE static inline __attribute__((always_inline, target(AVX512_TARGET)))

/* The low n (< 16) lanes. */
AVX512_INLINE __mmask16 tail_mask(long n) {
    return (__mmask16)((1u << n) - 1u);
}

/* Sixteen weights of a row from element k as F32 (I8 without its scale); lanes outside m read
 * nothing and are zero. dt is a constant at every call site, so the switch folds away. */
AVX512_INLINE __m512 load16(const void *row, long k, qlm_dtype dt, __mmask16 m) {
    switch (dt) {
    case QLM_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
    case QLM_BF16: {
        __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k));
        return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    }
    case QLM_I8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, (const int8_t *)row + k)));
    default: return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    }
}

/* Sum of the two 256-bit halves. */
AVX512_INLINE __m256 fold(__m512 a) {
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return _mm256_add_ps(_mm512_castps512_ps256(a), hi);
}

/* {sum(a), sum(b), sum(c), sum(d)} */
AVX512_INLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(fold(a), fold(b)), _mm256_hadd_ps(fold(c), fold(d)));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Dot products of four rows (stride bytes apart) with x. Each x vector is loaded once for the
 * four rows, and two accumulators per row hide the FMA latency. When pf is set, it is the
 * start of the next four rows, which are prefetched as this step consumes the current ones:
 * the hardware prefetchers lose track of four short interleaved row streams. */
AVX512_INLINE __m128 dot4(const char *w0, size_t stride, const float *x, long cols, qlm_dtype dt, const char *pf) {
    const char *w1 = w0 + stride, *w2 = w1 + stride, *w3 = w2 + stride;
    const long esize = (long)qlm_weight_elem_size(dt);
    const __mmask16 all = 0xffff;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    long k = 0;
    for (; k + 32 <= cols; k += 32) {
        /* This step reads 4 rows x 32 weights = 128 * esize bytes; prefetch as many of the next rows. */
        if (pf)
            for (long j = 0; j < 2 * esize; j++) _mm_prefetch(pf + k * 4 * esize + 64 * j, _MM_HINT_T0);
        __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
        a0 = _mm512_fmadd_ps(load16(w0, k, dt, all), x0, a0);
        a1 = _mm512_fmadd_ps(load16(w1, k, dt, all), x0, a1);
        a2 = _mm512_fmadd_ps(load16(w2, k, dt, all), x0, a2);
        a3 = _mm512_fmadd_ps(load16(w3, k, dt, all), x0, a3);
        b0 = _mm512_fmadd_ps(load16(w0, k + 16, dt, all), x1, b0);
        b1 = _mm512_fmadd_ps(load16(w1, k + 16, dt, all), x1, b1);
        b2 = _mm512_fmadd_ps(load16(w2, k + 16, dt, all), x1, b2);
        b3 = _mm512_fmadd_ps(load16(w3, k + 16, dt, all), x1, b3);
    }
    for (; k < cols; k += 16) {
        __mmask16 m = cols - k >= 16 ? all : tail_mask(cols - k);
        __m512 x0 = _mm512_maskz_loadu_ps(m, x + k);
        a0 = _mm512_fmadd_ps(load16(w0, k, dt, m), x0, a0);
        a1 = _mm512_fmadd_ps(load16(w1, k, dt, m), x0, a1);
        a2 = _mm512_fmadd_ps(load16(w2, k, dt, m), x0, a2);
        a3 = _mm512_fmadd_ps(load16(w3, k, dt, m), x0, a3);
    }
    return hsum4(_mm512_add_ps(a0, b0), _mm512_add_ps(a1, b1), _mm512_add_ps(a2, b2), _mm512_add_ps(a3, b3));
}

AVX512_INLINE float dot1(const char *w0, const float *x, long cols, qlm_dtype dt) {
    const __mmask16 all = 0xffff;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    long k = 0;
    for (; k + 64 <= cols; k += 64) {
        a0 = _mm512_fmadd_ps(load16(w0, k, dt, all), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(load16(w0, k + 16, dt, all), _mm512_loadu_ps(x + k + 16), a1);
        a2 = _mm512_fmadd_ps(load16(w0, k + 32, dt, all), _mm512_loadu_ps(x + k + 32), a2);
        a3 = _mm512_fmadd_ps(load16(w0, k + 48, dt, all), _mm512_loadu_ps(x + k + 48), a3);
    }
    for (; k < cols; k += 16) {
        __mmask16 m = cols - k >= 16 ? all : tail_mask(cols - k);
        a0 = _mm512_fmadd_ps(load16(w0, k, dt, m), _mm512_maskz_loadu_ps(m, x + k), a0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

#define KERNEL_FN AVX512_FN
#define KERNEL_INLINE AVX512_INLINE
#include "gemv_rows.h"

AVX512_INLINE __mmask16 block_mask(long i, long n) {
    return n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
}

AVX512_FN void f16_to_f32(float *dst, const uint16_t *src, long n) {
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = block_mask(i, n);
        _mm512_mask_storeu_ps(dst + i, m, load16(src, i, QLM_F16, m));
    }
}

AVX512_FN void bf16_to_f32(float *dst, const uint16_t *src, long n) {
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = block_mask(i, n);
        _mm512_mask_storeu_ps(dst + i, m, load16(src, i, QLM_BF16, m));
    }
}

AVX512_FN void i8_to_f32(float *dst, const int8_t *src, long n, float scale) {
    __m512 s = _mm512_set1_ps(scale);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = block_mask(i, n);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_mul_ps(load16(src, i, QLM_I8, m), s));
    }
}

AVX512_FN void f32_to_f16(uint16_t *dst, const float *src, long n) {
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = block_mask(i, n);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_mask_storeu_epi16(dst + i, m, h);
    }
}

/* Round to nearest even on the upper 16 bits; NaNs are quieted like qlm_f32_to_bf16. */
AVX512_FN void f32_to_bf16(uint16_t *dst, const float *src, long n) {
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = block_mask(i, n);
        __m512 v = _mm512_maskz_loadu_ps(m, src + i);
        __m512i u = _mm512_castps_si512(v);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
        __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
        r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, nan);
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(r));
    }
}

const qlm_kernel_table qlm_kernels_avx512 = {
    .name = "avx512",
    .gemv = gemv,
    .f16_to_f32 = f16_to_f32,
    .bf16_to_f32 = bf16_to_f32,
    .f32_to_f16 = f32_to_f16,
    .f32_to_bf16 = f32_to_bf16,
    .i8_to_f32 = i8_to_f32,
};

#endif
