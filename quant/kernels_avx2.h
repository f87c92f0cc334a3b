/* AVX2 + FMA + F16C kernels: 8 floats per vector. Every function carries the target
 * attribute, so the rest of the build needs no -m flags. Included by matmul_avx2.c and
 * matmul_avxvnni.c, which define AVX2_TARGET (the target attribute), AVX2_TABLE and AVX2_NAME (the
 * table and its name) and AVX2_VNNI: 1 where the target has AVX-VNNI (Alder Lake and later
 * client CPUs without AVX-512; Zen 5), whose VEX-encoded VPDPBUSD multiplies W8A8's bytes in one
 * instruction where VPMADDUBSW, VPMADDWD and VPADDD take three (kernel_w8a8_ymm.h). Its VPDPWSSD
 * for INT8 weights' 16-bit products measured no faster than VPMADDWD and VPADDD (SmolLM2-135M
 * INT8 pp256 1,017 against 1,060 tok/s on Zen 5), so that path is AVX2's. matmul.c only selects
 * a table when the CPU reports its extensions. */
#include "block_pack.h"
#include "matmul_internal.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AVX2_FN static __attribute__((target(AVX2_TARGET)))
#define AVX2_INLINE static inline __attribute__((always_inline, target(AVX2_TARGET)))


/* Eight weights of a row from element k as F32 (I8 without its scale). dt is a constant at
 * every call site, so the switch folds away. */
AVX2_INLINE __m256 load8(const void *row, long k, qlm_dtype dt) {
    switch (dt) {
    case QLM_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
    case QLM_BF16: {
        __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + k)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    }
    case QLM_I8:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + k))));
    default: return _mm256_loadu_ps((const float *)row + k);
    }
}

#define KERNEL_FN AVX2_FN
#define KERNEL_INLINE AVX2_INLINE
/* Rows of x a block tile takes: 4 weight rows x 2 x rows = 8 accumulators, with the x runs and
 * the weight run under way, within the 16 registers. */
#define BLOCK_TILE_X 2
#include "kernel_blocks.h"

/* Rows of x one register tile takes: 4 weight rows x 2 x rows = 8 accumulators, plus the four
 * weight vectors and one x vector, within the 16 vector registers. */
#define TILE_X 2
/* Weight rows a tile takes: 4 for any nx (8 would not fit the registers). */
#define GROUP_ROWS(nx) 4

/* BF16 weights take x as F32 with each step's even and odd columns apart (bf16_x_form). */
#define SPLIT_BF16(dt) ((dt) == QLM_BF16)
/* Bytes of an element of x in the activation form of dt on this table. */
#define X_SIZE(dt) (SPLIT_BF16(dt) ? 4 : qlm_x_elem_size(dt))
#define BF16_X_SIZE 4
/* The dtype of the elements of x where they are not integers. */
#define X_DTYPE(dt) (SPLIT_BF16(dt) ? QLM_F32 : qlm_x_dtype(dt))

/* Columns one step takes: 16 for I8 (pairs of 16-bit products per 32-bit lane) and BF16 (one load
 * of pairs split into even and odd columns), else 8. */
#define STEP_COLS(dt) ((dt) == QLM_I8 || SPLIT_BF16(dt) ? 16 : 8)

/* One step of gemm_tile: STEP_COLS(dt) columns from k; x rows ldx elements apart. I8 sums are
 * int32 lanes held in acc's bits. */
AVX2_INLINE void gemm_step(__m256 acc[4][TILE_X], const char *x, long ldx, const char *w, size_t stride, long k,
                           const int nr, const int nx, qlm_dtype dt) {
    if (dt == QLM_I8) {
        __m256i wv[4];
        QLM_UNROLL(4)
        for (int r = 0; r < nr; r++)
            wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((const int8_t *)(w + r * stride) + k)));
        QLM_UNROLL(2)
        for (int i = 0; i < nx; i++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)((const int16_t *)x + i * ldx + k));
            QLM_UNROLL(4)
            for (int r = 0; r < nr; r++)
                acc[r][i] = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(acc[r][i]), _mm256_madd_epi16(wv[r], xv)));
        }
        return;
    }
    if (SPLIT_BF16(dt)) {
        /* 16 BF16 weights are 8 lanes of pairs: shifted left, the even columns as F32; masked,
         * the odd ones; x holds the step's even columns, then its odd ones. */
        const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
        if (nx == 1) {
            /* One x row (decode): a row's pairs loaded once, both halves taken from the register
             * (the empty asm keeps GCC from folding the load into both uses, loading twice). */
            const __m256 xe = _mm256_loadu_ps((const float *)x + k), xo = _mm256_loadu_ps((const float *)x + k + 8);
            QLM_UNROLL(4)
            for (int r = 0; r < nr; r++) {
                __m256i pairs = _mm256_loadu_si256((const __m256i *)((const uint16_t *)(w + r * stride) + k));
                __asm__("" : "+x"(pairs));
                acc[r][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)), xe, acc[r][0]);
                acc[r][0] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(pairs, high)), xo, acc[r][0]);
            }
            return;
        }
        __m256 wv[4];
        QLM_UNROLL(2)
        for (int half = 0; half < 2; half++) {
            QLM_UNROLL(4)
            for (int r = 0; r < nr; r++) {
                __m256i pairs = _mm256_loadu_si256((const __m256i *)((const uint16_t *)(w + r * stride) + k));
                wv[r] = _mm256_castsi256_ps(half ? _mm256_and_si256(pairs, high) : _mm256_slli_epi32(pairs, 16));
            }
            QLM_UNROLL(2)
            for (int i = 0; i < nx; i++) {
                __m256 xv = _mm256_loadu_ps((const float *)x + i * ldx + k + 8 * half);
                QLM_UNROLL(4)
                for (int r = 0; r < nr; r++) acc[r][i] = _mm256_fmadd_ps(wv[r], xv, acc[r][i]);
            }
        }
        return;
    }
    const qlm_dtype xdt = qlm_x_dtype(dt);
    const long x_row = ldx * (long)qlm_weight_elem_size(xdt);
    __m256 wv[4];
    QLM_UNROLL(4)
    for (int r = 0; r < nr; r++) wv[r] = load8(w + r * stride, k, dt);
    QLM_UNROLL(2)
    for (int i = 0; i < nx; i++) {
        __m256 xv = load8(x + i * x_row, k, xdt);
        QLM_UNROLL(4)
        for (int r = 0; r < nr; r++) acc[r][i] = _mm256_fmadd_ps(wv[r], xv, acc[r][i]);
    }
}

/* The dot product of columns [k, k1) of a weight row and a row of x in its activation form, in
 * scalar code (I8: in integers, exact). */
AVX2_INLINE float tail_dot(const char *w, const char *x, long k, long k1, qlm_dtype dt) {
    if (dt == QLM_I8) {
        int32_t s = 0;
        for (; k < k1; k++) s += (int32_t)((const int8_t *)w)[k] * ((const int16_t *)x)[k];
        return (float)s;
    }
    float s = 0;
    for (; k < k1; k++) s += qlm_weight_at(w, k, dt) * qlm_weight_at(x, k, X_DTYPE(dt));
    return s;
}

/* nr (1 or 4) weight rows against nx (1 or 2) rows of x (in the activation form of dt, ldx
 * elements apart) over cols columns, storing or (add) adding the sums to y, as in the AVX-512
 * file; the last columns short of a step are added in scalar code. */
AVX2_INLINE void gemm_tile(float *y, long ldy, const char *x, long ldx, const char *w, size_t stride, long cols,
                           const int nr, const int nx, qlm_dtype dt, const char *pf, int add) {
    const long esize = (long)qlm_weight_elem_size(dt), ks = STEP_COLS(dt);
    const long x_row = ldx * (long)X_SIZE(dt);
    __m256 acc[4][TILE_X];
    QLM_UNROLL(4)
    for (int r = 0; r < nr; r++)
        QLM_UNROLL(2)
        for (int i = 0; i < nx; i++) acc[r][i] = _mm256_setzero_ps();
    long k = 0;
    for (; k + ks <= cols; k += ks) {
        /* This step reads 4 rows x ks weights; prefetch as many bytes of the next rows. */
        if (pf)
            for (long j = 0; j < (4 * ks * esize + 63) / 64; j++) _mm_prefetch(pf + k * 4 * esize + 64 * j, _MM_HINT_T0);
        gemm_step(acc, x, ldx, w, stride, k, nr, nx, dt);
    }
    if (dt == QLM_I8)
        QLM_UNROLL(4)
        for (int r = 0; r < nr; r++)
            QLM_UNROLL(2)
            for (int i = 0; i < nx; i++) acc[r][i] = _mm256_cvtepi32_ps(_mm256_castps_si256(acc[r][i]));
    for (int i = 0; i < nx; i++) {
        float s[4];
        if (nr == 4)
            _mm_storeu_ps(s, hsum4_ps256(acc[0][i], acc[1][i], acc[2][i], acc[3][i]));
        else
            s[0] = _mm_cvtss_f32(hsum4_ps256(acc[0][i], acc[0][i], acc[0][i], acc[0][i])); /* the same tree */
        for (int r = 0; r < nr; r++) {
            if (k < cols) s[r] += tail_dot(w + r * stride, x + i * x_row, k, cols, dt);
            y[i * ldy + r] = add ? y[i * ldy + r] + s[r] : s[r];
        }
    }
}

/* The same tile with nx as a constant. */
AVX2_INLINE void gemm_tile_x(float *y, long ldy, const char *x, long ldx, int nx, const char *w, size_t stride,
                             long cols, const int nr, qlm_dtype dt, const char *pf, int add) {
    if (nx == 1)
        gemm_tile(y, ldy, x, ldx, w, stride, cols, nr, 1, dt, pf, add);
    else
        gemm_tile(y, ldy, x, ldx, w, stride, cols, nr, TILE_X, dt, pf, add);
}

/* The same tile with nx as a constant (and group where the caller makes it one). */
AVX2_INLINE void block_tile_g(float *y, long ldy, const int16_t *x, long ldx, int nx, const char *w, size_t stride,
                              long cols, const int nr, qlm_dtype dt, const int group, const char *pf) {
    if (nx == 1)
        block_tile(y, ldy, x, ldx, w, stride, cols, nr, 1, dt, group, pf);
    else
        block_tile(y, ldy, x, ldx, w, stride, cols, nr, BLOCK_TILE_X, dt, group, pf);
}

AVX2_FN void f16_to_f32(float *dst, const uint16_t *src, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(src, i, QLM_F16));
    for (; i < n; i++) dst[i] = qlm_f16_to_f32(src[i]);
}

AVX2_FN void bf16_to_f32(float *dst, const uint16_t *src, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(src, i, QLM_BF16));
    for (; i < n; i++) dst[i] = qlm_bf16_to_f32(src[i]);
}

AVX2_FN void i8_to_f32(float *dst, const int8_t *src, long n, float scale) {
    __m256 s = _mm256_set1_ps(scale);
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(load8(src, i, QLM_I8), s));
    for (; i < n; i++) dst[i] = (float)src[i] * scale;
}

AVX2_FN void f32_to_f16(uint16_t *dst, const float *src, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = qlm_f32_to_f16(src[i]);
}

/* Round to nearest even on the upper 16 bits; NaNs are quieted like qlm_f32_to_bf16. Result
 * in the low half of each 32-bit lane. */
AVX2_INLINE __m256i bf16_round(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

AVX2_FN void f32_to_bf16(uint16_t *dst, const float *src, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i lo = bf16_round(_mm256_loadu_ps(src + i)), hi = bf16_round(_mm256_loadu_ps(src + i + 8));
        /* packus interleaves the 128-bit lanes; the permute puts them back in order. */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
        _mm256_storeu_si256((__m256i *)(dst + i), p);
    }
    for (; i < n; i++) dst[i] = qlm_f32_to_bf16(src[i]);
}

/* The BF16 rounding of v as F32. */
AVX2_INLINE __m256 bf16_rounded(__m256 v) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_round(v), 16));
}

/* See qlm_kernel_table.bf16_x_form. */
AVX2_FN void bf16_x_form(void *dst, const float *x, long n) {
    float *d = dst;
    long i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = bf16_rounded(_mm256_loadu_ps(x + i)), b = bf16_rounded(_mm256_loadu_ps(x + i + 8));
        /* shuffle_ps picks within 128-bit lanes; the permute puts the lanes' halves in order. */
        _mm256_storeu_ps(d + i, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8)));
        _mm256_storeu_ps(d + i + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8)));
    }
    for (; i < n; i++) d[i] = qlm_bf16_to_f32(qlm_f32_to_bf16(x[i]));
}

/* Outputs d..d+8nc-1 (nc 8-float chunks, 1 or 4) of nj (1 or 2) rows of o held in registers across
 * all m weighted value rows (of dt): each value vector is loaded once for the nj rows. */
AVX2_INLINE void weighted_sum_tile(float *o, const float *p, long ldp, const char *v, size_t row, int m, long hd,
                                   long d, const int nj, const int nc, qlm_dtype dt) {
    __m256 a[2][4];
    QLM_UNROLL(2)
    for (int j = 0; j < nj; j++)
        QLM_UNROLL(4)
        for (int c = 0; c < nc; c++) a[j][c] = _mm256_loadu_ps(o + (size_t)j * hd + d + 8 * c);
    for (int t = 0; t < m; t++) {
        __m256 vt[4];
        if (t + 8 < m) _mm_prefetch(v + (size_t)(t + 8) * row + d * (long)qlm_weight_elem_size(dt), _MM_HINT_T0);
        QLM_UNROLL(4)
        for (int c = 0; c < nc; c++) vt[c] = load8(v + (size_t)t * row, d + 8 * c, dt);
        QLM_UNROLL(2)
        for (int j = 0; j < nj; j++) {
            __m256 pj = _mm256_set1_ps(p[(size_t)j * ldp + t]);
            QLM_UNROLL(4)
            for (int c = 0; c < nc; c++) a[j][c] = _mm256_fmadd_ps(pj, vt[c], a[j][c]);
        }
    }
    QLM_UNROLL(2)
    for (int j = 0; j < nj; j++)
        QLM_UNROLL(4)
        for (int c = 0; c < nc; c++) _mm256_storeu_ps(o + (size_t)j * hd + d + 8 * c, a[j][c]);
}

/* Rows of o in pairs, 32 outputs at a time, then 8, then the last hd % 8 in scalar code. Each output
 * adds its m products in order whatever g and m are (see the AVX-512 file's). */
AVX2_INLINE void weighted_sum_dt(float *o, const float *p, int g, long ldp, const void *v, size_t v_stride, int m,
                                 long hd, qlm_dtype dt) {
    const size_t row = v_stride * qlm_weight_elem_size(dt);
    for (int j = 0; j < g;) {
        const int nj = g - j >= 2 ? 2 : 1;
        float *oj = o + (size_t)j * hd;
        const float *pj = p + (size_t)j * ldp;
        long d = 0;
        for (; d + 32 <= hd; d += 32)
            if (nj == 2)
                weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 2, 4, dt);
            else
                weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 1, 4, dt);
        for (; d + 8 <= hd; d += 8)
            if (nj == 2)
                weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 2, 1, dt);
            else
                weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 1, 1, dt);
        for (int r = 0; r < nj; r++)
            for (long e = d; e < hd; e++)
                for (int t = 0; t < m; t++)
                    oj[(size_t)r * hd + e] += pj[(size_t)r * ldp + t] * qlm_weight_at((const char *)v + (size_t)t * row, e, dt);
        j += nj;
    }
}

AVX2_FN float quantize_i16(int16_t *q, const float *x, long n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
    }
    float m[8], absmax = 0;
    int has_nan = _mm256_movemask_ps(nan) != 0;
    _mm256_storeu_ps(m, mx);
    for (int j = 0; j < 8; j++) absmax = m[j] > absmax ? m[j] : absmax;
    for (long j = i; j < n; j++) {
        has_nan |= isnan(x[j]);
        absmax = fabsf(x[j]) > absmax ? fabsf(x[j]) : absmax;
    }
    float inv, s = qlm_x_int_scale(absmax, has_nan, QLM_I16_MAX, &inv);
    if (inv == 0) {
        memset(q, 0, (size_t)n * sizeof *q);
        return s;
    }
    __m256 f = _mm256_set1_ps(inv);
    for (i = 0; i + 16 <= n; i += 16) {
        /* Round to nearest even, as lrintf; packs puts the 128-bit lanes out of order. */
        __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), f));
        __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), f));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xd8));
    }
    for (; i < n; i++) q[i] = (int16_t)lrintf(x[i] * inv);
    return s;
}

/* e^x for 8 lanes (see QLM_EXP_LOG2E). x is clamped to where 2^(k-1) is a normal float, the
 * product takes the last factor 2 separately (so e^x up to FLT_MAX comes out), and the results
 * that would be below 3e-38 (given as 0) or infinite are put in afterwards, as is NaN. */
AVX2_INLINE __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-86.5f), hi = _mm256_set1_ps(88.72283935546875f);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(QLM_EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = QLM_EXP_REDUCE(xc, k, _mm256_fnmadd_ps, _mm256_set1_ps);
    __m256 p = QLM_EXP_POLY(r, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_mul_ps, _mm256_add_ps);
    /* 2^(k-1): k - 1 + 127 in the exponent field, 1..254 for -125 <= k <= 128. */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(126)), 23);
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(2.0f));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* The tail through masked loads and stores, so a value's result does not depend on where it sits. */
AVX2_FN void exp_f32(float *x, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(x + i, m, exp8(_mm256_maskload_ps(x + i, m)));
    }
}

#include "kernel_rows.h"

/* What kernel_key_lanes.h builds attention's prefill scores from. */
#define LANE_VEC __m256
#define LANE_COUNT 8
#define LANE_QUERIES 2
/* Measured as AVX-512's: 12 rows 3.0 ns a score either way, 48 rows 2.5-2.7 against the tiles' 2.9-3.0. */
#define LANE_KEYS_MIN_ROWS 16
#define LANES_OWN_ORDER(dt) 0

#define lanes_zero _mm256_setzero_ps
#define lanes_fma _mm256_fmadd_ps
#define lanes_add _mm256_add_ps
#define lanes_set1 _mm256_set1_ps
#define lanes_unpacklo _mm256_unpacklo_ps
#define lanes_unpackhi _mm256_unpackhi_ps
#define lanes_shuffle _mm256_shuffle_ps

AVX2_INLINE void lanes_store(float *y, __m256 v, int nk) {
    if (nk == 8)
        _mm256_storeu_ps(y, v);
    else
        _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(nk), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), v);
}

/* Step s of a key row (8 columns of F32 and F16, half of 16 of split BF16) as gemm_step puts it in
 * the lanes: for split BF16 the even columns of a 16-column run, then its odd ones. */
AVX2_INLINE __m256 lanes_key_step(const char *row, int s, qlm_dtype dt) {
    if (SPLIT_BF16(dt)) {
        const __m256i pairs = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + 16 * (s / 2)));
        return _mm256_castsi256_ps(s % 2 ? _mm256_and_si256(pairs, _mm256_set1_epi32((int)0xffff0000u))
                                         : _mm256_slli_epi32(pairs, 16));
    }
    return load8(row, 8L * s, dt);
}

/* The 8 x 8 transpose's moves across 128-bit lanes: column 4H + e is half H of u[e] and u[4 + e]. */
AVX2_INLINE void lanes_cross(__m256 v[8], const __m256 u[8]) {
    QLM_UNROLL(4)
    for (int e = 0; e < 4; e++) {
        v[e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x20);
        v[4 + e] = _mm256_permute2f128_ps(u[e], u[4 + e], 0x31);
    }
}

#include "kernel_key_lanes.h"

/* Rows of x a W8A8 tile takes: 2 x 2 accumulators and 2 x 2 16-bit sums, with the weights, in the
 * 16 registers. */
#define W8A8_TILE_X 2
#define W8A8_YMM_VNNI AVX2_VNNI
#include "kernel_w8a8_ymm.h"
#include "kernel_w8a8.h"

#define DROPOUT_LANES 4
#include "kernel_dropout.h"

QLM_SIMD_KERNEL_TABLE(AVX2_TABLE, AVX2_NAME, gemm, attention_scores, NULL, NULL);

#endif
