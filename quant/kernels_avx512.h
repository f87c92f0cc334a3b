/* AVX-512 kernels (F + BW + VL): 16 floats per vector, the same structure as the AVX2 file.
 * Tails use masked loads and stores instead of scalar loops; a masked-off element is never
 * read, so rows may end at any column. Included by matmul_avx512.c, matmul_avx512vnni.c and
 * matmul_avx512bf16.c, which define AVX512_TARGET (the target attribute), AVX512_TABLE and
 * AVX512_NAME (the table and its name), AVX512_VNNI: 1 where the target has AVX512_VNNI, whose
 * integer dot products multiply 16-bit integers (VPDPWSSD, I8 weights with x in the I16 form)
 * 32 columns per instruction and bytes (VPDPBUSD, W8A8 for block weights, kernel_w8a8.h) 64,
 * and AVX512_BF16DP: 1 where it also has AVX512_BF16, whose dot product multiplies
 * BF16 weights with BF16 activations (VDPBF16PS) without converting W to F32; matmul_amx.c
 * also defines AVX512_AMX (W8A8's Q8_0, BF16 and INT8 weights through AMX tiles). matmul.c only
 * selects a table when the CPU (and the OS, for the ZMM and tile state) supports its target. */
#include "../core/cpu_scratch.h"
#include "block_pack.h"
#include "matmul_internal.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#define AVX512_FN static __attribute__((target(AVX512_TARGET)))
#define AVX512_INLINE static inline __attribute__((always_inline, target(AVX512_TARGET)))

/* Whether weights of dtype dt take the BF16 dot product (a constant at every call site). */
#define USES_DP(dt) (AVX512_BF16DP && (dt) == QLM_BF16)
/* Whether they take x as F32 with each step's even and odd columns apart (bf16_x_form). */
#define SPLIT_BF16(dt) (!AVX512_BF16DP && (dt) == QLM_BF16)
/* Bytes of an element of x in the activation form of dt on this table. */
#define X_SIZE(dt) (SPLIT_BF16(dt) ? 4 : qlm_x_elem_size(dt))
#define BF16_X_SIZE (AVX512_BF16DP ? 2 : 4)
/* Columns one step takes: 32 for the dot products (BF16 pairs, I8 through 16-bit pairs) and for
 * BF16 weights split into even and odd columns. */
#define STEP_COLS(dt) (USES_DP(dt) || SPLIT_BF16(dt) || (dt) == QLM_I8 ? 32 : 16)

/* acc + the sums of adjacent pairs of 16-bit products of a and b, in 32-bit lanes. */
AVX512_INLINE __m512i dot_i16(__m512i acc, __m512i a, __m512i b) {
#if AVX512_VNNI && defined(__clang__)
    return _mm512_dpwssd_epi32(acc, a, b);
#elif AVX512_VNNI
    /* As asm with the accumulator tied: GCC 12 copies every _mm512_dpwssd_epi32 accumulator
     * through another register and spills the copies in a tile of 24 (measured: half speed).
     * Not for clang, which takes the "m" of "vm" and so stores b to the stack for each. */
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

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

/* Rows of x one register tile takes: 4 weight rows x 6 x rows = 24 accumulators, plus the four
 * weight vectors and one x vector, within the 32 vector registers. */
#define TILE_X 6
/* Weight rows a tile takes for nx rows of x: with one or two, 8 rows (8 or 16 accumulators) keep
 * enough independent FMA chains in flight to hide the FMA latency. */
#define GROUP_ROWS(nx) ((nx) <= 2 ? 8 : 4)

/* 16 columns from k of weights of dtype dt converted to F32 against x of dtype xdt (rows x_row
 * bytes apart); lanes outside m read nothing. */
AVX512_INLINE void gemm_step16(__m512 acc[8][TILE_X], const char *x, long x_row, qlm_dtype xdt, const char *w,
                               size_t stride, long k, const int nr, const int nx, qlm_dtype dt, __mmask16 m) {
    __m512 wv[8];
    QLM_UNROLL(8)
    for (int r = 0; r < nr; r++) wv[r] = load16(w + r * stride, k, dt, m);
    QLM_UNROLL(6)
    for (int i = 0; i < nx; i++) {
        __m512 xv = load16(x + i * x_row, k, xdt, m);
        QLM_UNROLL(8)
        for (int r = 0; r < nr; r++) acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
    }
}

/* One step of gemm_tile: STEP_COLS(dt) columns from k, lanes outside m read nothing. x rows are
 * ldx elements apart, in the activation form of dt. I8 sums are int32 lanes held in acc's bits. */
AVX512_INLINE void gemm_step(__m512 acc[8][TILE_X], const char *x, long ldx, const char *w, size_t stride, long k,
                             const int nr, const int nx, qlm_dtype dt, __mmask32 m) {
    if (dt == QLM_I8) {
        __m512i wv[8];
        QLM_UNROLL(8)
        for (int r = 0; r < nr; r++) wv[r] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, (const int8_t *)(w + r * stride) + k));
        QLM_UNROLL(6)
        for (int i = 0; i < nx; i++) {
            __m512i xv = _mm512_maskz_loadu_epi16(m, (const int16_t *)x + i * ldx + k);
            QLM_UNROLL(8)
            for (int r = 0; r < nr; r++) acc[r][i] = _mm512_castsi512_ps(dot_i16(_mm512_castps_si512(acc[r][i]), wv[r], xv));
        }
        return;
    }
#if AVX512_BF16DP
    if (USES_DP(dt)) {
        __m512i wv[8];
        QLM_UNROLL(8)
        for (int r = 0; r < nr; r++) wv[r] = _mm512_maskz_loadu_epi16(m, (const uint16_t *)(w + r * stride) + k);
        QLM_UNROLL(6)
        for (int i = 0; i < nx; i++) {
            __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, (const uint16_t *)x + i * ldx + k);
            QLM_UNROLL(8)
            for (int r = 0; r < nr; r++) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], (__m512bh)wv[r], xv);
        }
        return;
    }
#else
    if (SPLIT_BF16(dt)) {
        if (m != 0xffffffffu) {
            /* The row's last columns (up to 31), as they come, x in F32. */
            gemm_step16(acc, x, ldx * 4, QLM_F32, w, stride, k, nr, nx, dt, (__mmask16)m);
            gemm_step16(acc, x, ldx * 4, QLM_F32, w, stride, k + 16, nr, nx, dt, (__mmask16)(m >> 16));
            return;
        }
        /* 32 BF16 weights are 16 lanes of pairs: shifted left, the even columns as F32; with the
         * even ones masked off, the odd ones. x holds the step's even columns, then its odd
         * ones; every sum takes the even products before the odd ones. */
        if (nx == 1) {
            /* One x row (decode): a row's pairs loaded once, both halves taken from the register.
             * In two 32-byte loads, which GCC keeps in that register (a 64-byte load it folds into
             * both uses, loading twice), and of which at most one straddles two cache lines
             * however the rows lie (weights read in place from a safetensors file start 40 bytes
             * past a line). */
            const __m512i high = _mm512_set1_epi32((int)0xffff0000u);
            const __m512 xe = _mm512_loadu_ps((const float *)x + k), xo = _mm512_loadu_ps((const float *)x + k + 16);
            QLM_UNROLL(8)
            for (int r = 0; r < nr; r++) {
                const __m256i *row = (const __m256i *)((const uint16_t *)(w + r * stride) + k);
                const __m512i pairs = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(row)),
                                                         _mm256_loadu_si256(row + 1), 1);
                acc[r][0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)), xe, acc[r][0]);
                acc[r][0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(pairs, high)), xo, acc[r][0]);
            }
            return;
        }
        /* Several x rows: the two halves one after the other, each row's pairs loaded for each
         * (the odd ones by a masked load: GCC merges two plain loads of one vector and then
         * spills it, short of general registers for eight row addresses). */
        __m512 wv[8];
        QLM_UNROLL(2)
        for (int half = 0; half < 2; half++) {
            QLM_UNROLL(8)
            for (int r = 0; r < nr; r++) {
                const uint16_t *pairs = (const uint16_t *)(w + r * stride) + k;
                wv[r] = _mm512_castsi512_ps(half ? _mm512_maskz_loadu_epi16((__mmask32)0xaaaaaaaau, pairs)
                                                 : _mm512_slli_epi32(_mm512_loadu_si512(pairs), 16));
            }
            QLM_UNROLL(6)
            for (int i = 0; i < nx; i++) {
                __m512 xv = _mm512_loadu_ps((const float *)x + i * ldx + k + 16 * half);
                QLM_UNROLL(8)
                for (int r = 0; r < nr; r++) acc[r][i] = _mm512_fmadd_ps(wv[r], xv, acc[r][i]);
            }
        }
        return;
    }
#endif
    const qlm_dtype xdt = qlm_x_dtype(dt);
    gemm_step16(acc, x, ldx * (long)qlm_weight_elem_size(xdt), xdt, w, stride, k, nr, nx, dt, (__mmask16)m);
}

/* nr (1, 4 or 8) weight rows (stride bytes apart, storage dtype dt) against nx (1..TILE_X) rows
 * of x (ldx elements apart), over cols columns; add: add the sums to y rather than store them
 * (the I8 column blocks after the first). Each weight vector is loaded (and converted) once for
 * nx products and each x vector serves nr, so with several x rows the loop is bound by
 * arithmetic throughput rather than loads; with one it is bound by memory, and pf (when set,
 * the next rows) is prefetched as this step consumes the current ones: the hardware prefetchers
 * lose track of several short interleaved row streams. nr, nx and dt are constants at each call
 * site, so the accumulator arrays become registers. Each (row, x row) sum runs over k in the
 * same order whatever nr and nx are, and its lanes are added up by the same tree (a lone row's by
 * hsum4 too): attention's scores for a key then do not depend on how many keys a call takes. */
AVX512_INLINE void gemm_tile(float *y, long ldy, const char *x, long ldx, const char *w, size_t stride, long cols,
                             const int nr, const int nx, qlm_dtype dt, const char *pf, int add) {
    const long esize = (long)qlm_weight_elem_size(dt), ks = STEP_COLS(dt);
    __m512 acc[8][TILE_X];
    QLM_UNROLL(8)
    for (int r = 0; r < nr; r++)
        QLM_UNROLL(6)
        for (int i = 0; i < nx; i++) acc[r][i] = _mm512_setzero_ps();
    long k = 0;
    for (; k + ks <= cols; k += ks) {
        /* This step reads nr rows x ks weights; prefetch as many bytes of the next rows. */
        if (pf)
            for (long j = 0; j < nr * ks * esize / 64; j++) _mm_prefetch(pf + k * nr * esize + 64 * j, _MM_HINT_T0);
        gemm_step(acc, x, ldx, w, stride, k, nr, nx, dt, (__mmask32)0xffffffffu);
    }
    if (k < cols) gemm_step(acc, x, ldx, w, stride, k, nr, nx, dt, (__mmask32)((1u << (cols - k)) - 1u));
    if (dt == QLM_I8)
        QLM_UNROLL(8)
        for (int r = 0; r < nr; r++)
            QLM_UNROLL(6)
            for (int i = 0; i < nx; i++) acc[r][i] = _mm512_cvtepi32_ps(_mm512_castps_si512(acc[r][i]));
    QLM_UNROLL(6)
    for (int i = 0; i < nx; i++) {
        float *yi = y + i * ldy;
        if (nr == 1) {
            const float h = _mm_cvtss_f32(hsum4(acc[0][i], acc[0][i], acc[0][i], acc[0][i]));
            yi[0] = add ? yi[0] + h : h;
        } else
            QLM_UNROLL(2)
            for (int r = 0; r < nr; r += 4) {
                __m128 h = hsum4(acc[r][i], acc[r + 1][i], acc[r + 2][i], acc[r + 3][i]);
                _mm_storeu_ps(yi + r, add ? _mm_add_ps(_mm_loadu_ps(yi + r), h) : h);
            }
    }
}

/* The same tile with nx as a constant (nr = 8 only comes with nx <= 2). */
AVX512_INLINE void gemm_tile_x(float *y, long ldy, const char *x, long ldx, int nx, const char *w, size_t stride,
                               long cols, const int nr, qlm_dtype dt, const char *pf, int add) {
    if (nr == 8) {
        if (nx == 1)
            gemm_tile(y, ldy, x, ldx, w, stride, cols, 8, 1, dt, pf, add);
        else
            gemm_tile(y, ldy, x, ldx, w, stride, cols, 8, 2, dt, pf, add);
        return;
    }
    switch (nx) {
    case 1: gemm_tile(y, ldy, x, ldx, w, stride, cols, nr, 1, dt, pf, add); break;
    case 2: gemm_tile(y, ldy, x, ldx, w, stride, cols, nr, 2, dt, pf, add); break;
    case 3: gemm_tile(y, ldy, x, ldx, w, stride, cols, nr, 3, dt, pf, add); break;
    case 4: gemm_tile(y, ldy, x, ldx, w, stride, cols, nr, 4, dt, pf, add); break;
    case 5: gemm_tile(y, ldy, x, ldx, w, stride, cols, nr, 5, dt, pf, add); break;
    default: gemm_tile(y, ldy, x, ldx, w, stride, cols, nr, TILE_X, dt, pf, add); break;
    }
}

#define KERNEL_FN AVX512_FN
#define KERNEL_INLINE AVX512_INLINE
/* Rows of x a block tile takes: 4 weight rows x 3 x rows = 12 accumulators, with the x runs and
 * their sums, within the 32 vector registers. */
#define BLOCK_TILE_X 3
#include "kernel_blocks.h"

/* The same tile with nx as a constant (and group where the caller makes it one). */
AVX512_INLINE void block_tile_g(float *y, long ldy, const int16_t *x, long ldx, int nx, const char *w, size_t stride,
                                long cols, const int nr, qlm_dtype dt, const int group, const char *pf) {
    switch (nx) {
    case 1: block_tile(y, ldy, x, ldx, w, stride, cols, nr, 1, dt, group, pf); break;
    case 2: block_tile(y, ldy, x, ldx, w, stride, cols, nr, 2, dt, group, pf); break;
    default: block_tile(y, ldy, x, ldx, w, stride, cols, nr, BLOCK_TILE_X, dt, group, pf); break;
    }
}

#if AVX512_VNNI
#include "kernel_w8a8_vnni.h"
#ifdef AVX512_AMX
#include "kernel_w8a8_amx.h"
#endif
#else
/* Rows of x a W8A8 tile takes: 4 x 2 accumulators and 4 x 2 16-bit sums, with the weights, in the
 * 32 registers. */
#define W8A8_TILE_X 4
#define W8A8_YMM_VNNI 0
#include "kernel_w8a8_ymm.h"
#endif
#include "kernel_w8a8.h"

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

/* v rounded to BF16, in the low 16 bits of each lane: to nearest even, NaNs quieted like
 * qlm_f32_to_bf16. */
AVX512_INLINE __m512i bf16_round(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, nan);
}

AVX512_FN void f32_to_bf16(uint16_t *dst, const float *src, long n) {
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = block_mask(i, n);
        _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(bf16_round(_mm512_maskz_loadu_ps(m, src + i))));
    }
}

/* The BF16 rounding of v as F32. */
AVX512_INLINE __m512 bf16_rounded(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_round(v), 16));
}

/* See qlm_kernel_table.bf16_x_form. */
AVX512_FN void bf16_x_form(void *dst, const float *x, long n) {
#if AVX512_BF16DP
    f32_to_bf16(dst, x, n);
#else
    float *d = dst;
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    long i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 a = bf16_rounded(_mm512_loadu_ps(x + i)), b = bf16_rounded(_mm512_loadu_ps(x + i + 16));
        _mm512_storeu_ps(d + i, _mm512_permutex2var_ps(a, even, b));
        _mm512_storeu_ps(d + i + 16, _mm512_permutex2var_ps(a, odd, b));
    }
    for (; i < n; i += 16) {
        __mmask16 m = block_mask(i, n);
        _mm512_mask_storeu_ps(d + i, m, bf16_rounded(_mm512_maskz_loadu_ps(m, x + i)));
    }
#endif
}

AVX512_FN float quantize_i16(int16_t *q, const float *x, long n) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (long i = 0; i < n; i += 16) {
        __m512 v = _mm512_maskz_loadu_ps(block_mask(i, n), x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    float inv, s = qlm_x_int_scale(_mm512_reduce_max_ps(mx), nan != 0, QLM_I16_MAX, &inv);
    if (inv == 0) {
        memset(q, 0, (size_t)n * sizeof *q);
        return s;
    }
    __m512 f = _mm512_set1_ps(inv);
    for (long i = 0; i < n; i += 16) {
        __mmask16 m = block_mask(i, n);
        /* Round to nearest even, as lrintf; |x inv| <= 32767 so the narrowing is exact. */
        __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), f));
        _mm256_mask_storeu_epi16(q + i, m, _mm512_cvtsepi32_epi16(r));
    }
    return s;
}

/* e^x for 16 lanes (see QLM_EXP_LOG2E): x is clamped where e^x is 0 or +inf in float anyway, and
 * VSCALEF multiplies by 2^k with the right result for every k, subnormal and infinite included. */
AVX512_INLINE __m512 exp16(__m512 x) {
    __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(89.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(QLM_EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = QLM_EXP_REDUCE(xc, k, _mm512_fnmadd_ps, _mm512_set1_ps);
    __m512 y = _mm512_scalef_ps(QLM_EXP_POLY(r, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_mul_ps, _mm512_add_ps), k);
    /* max/min turned NaN into a bound; give it back. */
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

AVX512_FN void exp_f32(float *x, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, m, exp16(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* Outputs d..d+63 of nj (a constant, 1 to 6) rows of o held in registers across all m weighted
 * value rows (of dt): each value vector is loaded once for the nj rows, whose 4 nj FMA chains are
 * in flight together. */
AVX512_INLINE void weighted_sum_tile(float *o, const float *p, long ldp, const char *v, size_t row, int m, long hd,
                                     long d, const int nj, qlm_dtype dt) {
    __mmask16 mk[4];
    __m512 a[6][4];
    QLM_UNROLL(4)
    for (int c = 0; c < 4; c++) mk[c] = d + 16 * c >= hd ? 0 : block_mask(d + 16 * c, hd);
    QLM_UNROLL(6)
    for (int j = 0; j < nj; j++)
        QLM_UNROLL(4)
        for (int c = 0; c < 4; c++) a[j][c] = _mm512_maskz_loadu_ps(mk[c], o + (size_t)j * hd + d + 16 * c);
    for (int t = 0; t < m; t++) {
        __m512 vt[4];
        if (t + 8 < m) _mm_prefetch(v + (size_t)(t + 8) * row + d * (long)qlm_weight_elem_size(dt), _MM_HINT_T0);
        QLM_UNROLL(4)
        for (int c = 0; c < 4; c++) vt[c] = load16(v + (size_t)t * row, d + 16 * c, dt, mk[c]);
        QLM_UNROLL(6)
        for (int j = 0; j < nj; j++) {
            __m512 pj = _mm512_set1_ps(p[(size_t)j * ldp + t]);
            QLM_UNROLL(4)
            for (int c = 0; c < 4; c++) a[j][c] = _mm512_fmadd_ps(pj, vt[c], a[j][c]);
        }
    }
    QLM_UNROLL(6)
    for (int j = 0; j < nj; j++)
        QLM_UNROLL(4)
        for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(o + (size_t)j * hd + d + 16 * c, mk[c], a[j][c]);
}

/* Rows of o in sixes (24 accumulators; 0.85 ns per row and key at head_dim 64 where fours took
 * 0.91), then the last one to five, 64 outputs at a time. Each output adds its m products in
 * order, one FMA after another, whatever g and m are: a weight of 0 leaves it as it was, so
 * attention may pass a key a row does not see with weight 0 and get the row's own sum. */
AVX512_INLINE void weighted_sum_dt(float *o, const float *p, int g, long ldp, const void *v, size_t v_stride, int m,
                                   long hd, qlm_dtype dt) {
    const size_t row = v_stride * qlm_weight_elem_size(dt);
    for (int j = 0; j < g;) {
        const int nj = g - j >= 6 ? 6 : g - j;
        float *oj = o + (size_t)j * hd;
        const float *pj = p + (size_t)j * ldp;
        for (long d = 0; d < hd; d += 64) {
            switch (nj) {
            case 6: weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 6, dt); break;
            case 5: weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 5, dt); break;
            case 4: weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 4, dt); break;
            case 3: weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 3, dt); break;
            case 2: weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 2, dt); break;
            default: weighted_sum_tile(oj, pj, ldp, v, row, m, hd, d, 1, dt); break;
            }
        }
        j += nj;
    }
}

#include "kernel_rows.h"

/* What kernel_key_lanes.h builds attention's prefill scores from. */
#define LANE_VEC __m512
#define LANE_COUNT 16
#define LANE_QUERIES 4
/* One thread, head_dim 64, BF16 keys: 8 rows 1.8 ns a score either way, 48 rows 1.1 against the
 * tiles' 1.8; decode's few rows keep the tiles. */
#define LANE_KEYS_MIN_ROWS 8
#define LANES_OWN_ORDER(dt) USES_DP(dt)

#define lanes_zero _mm512_setzero_ps
#define lanes_fma _mm512_fmadd_ps
#define lanes_add _mm512_add_ps
#define lanes_set1 _mm512_set1_ps
#define lanes_unpacklo _mm512_unpacklo_ps
#define lanes_unpackhi _mm512_unpackhi_ps
#define lanes_shuffle _mm512_shuffle_ps

AVX512_INLINE void lanes_store(float *y, __m512 v, int nk) {
    _mm512_mask_storeu_ps(y, nk == 16 ? (__mmask16)0xffff : tail_mask(nk), v);
}

/* Step s of a key row (16 columns of F32 and F16, half of 32 of split BF16) as gemm_step puts it
 * in the lanes: for split BF16 the even columns of a 32-column run, then its odd ones. */
AVX512_INLINE __m512 lanes_key_step(const char *row, int s, qlm_dtype dt) {
    if (SPLIT_BF16(dt)) {
        const __m512i pairs = _mm512_loadu_si512((const uint16_t *)row + 32 * (s / 2));
        return _mm512_castsi512_ps(s % 2 ? _mm512_and_si512(pairs, _mm512_set1_epi32((int)0xffff0000u))
                                         : _mm512_slli_epi32(pairs, 16));
    }
    return load16(row, 16L * s, dt, (__mmask16)0xffff);
}

/* The 16 x 16 transpose's moves across 128-bit lanes: column 4L + e gathers lane L of u[e], u[4 + e],
 * u[8 + e], u[12 + e] (a 4 x 4 transpose of lanes). */
AVX512_INLINE void lanes_cross(__m512 v[16], const __m512 u[16]) {
    QLM_UNROLL(4)
    for (int e = 0; e < 4; e++) {
        const __m512 w0 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0x88), w1 = _mm512_shuffle_f32x4(u[e], u[4 + e], 0xdd);
        const __m512 w2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0x88),
                     w3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], 0xdd);
        v[e] = _mm512_shuffle_f32x4(w0, w2, 0x88);
        v[8 + e] = _mm512_shuffle_f32x4(w0, w2, 0xdd);
        v[4 + e] = _mm512_shuffle_f32x4(w1, w3, 0x88);
        v[12 + e] = _mm512_shuffle_f32x4(w1, w3, 0xdd);
    }
}

#include "kernel_key_lanes.h"

#define DROPOUT_LANES 8
#include "kernel_dropout.h"

#ifdef AVX512_AMX
#include "kernel_amx.h"
QLM_SIMD_KERNEL_TABLE(AVX512_TABLE, AVX512_NAME, gemm_amx, dot_rows_amx, i24_planes, gemm_i8_xw);
#else
QLM_SIMD_KERNEL_TABLE(AVX512_TABLE, AVX512_NAME, gemm, attention_scores, NULL, NULL);
#endif

#endif
