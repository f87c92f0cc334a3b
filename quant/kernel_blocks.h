/* The block-type GEMM tile (Q8_0, Q4_0, Q4_1; core/dtype.h) in 256-bit vectors, shared by the AVX2
 * and AVX-512 files: 256-bit integer and float instructions issue on three ports where 512-bit
 * ones share two, and a block's work is mostly short unpacking, so ymm code ran 4-bit decode
 * faster than the zmm form did on an AVX-512 CPU. x comes in the I16 form (qlm_x_is_i16): a run of
 * 32 weights is widened to two vectors of 16-bit integers and multiplied pairwise into 32-bit
 * lanes (VPMADDWD), exact; per block the integer sums are converted and added times the block's
 * scale. Q4 nibbles are taken unsigned (0..15), so Q4_0's offset is 8 times the block's sum of x,
 * taken off in integers, and Q4_1's offset m multiplies that sum in F32; the sums of x serve the
 * tile's four weight rows. Included by kernels_avx2.h and kernels_avx512.h after they define
 * KERNEL_INLINE and BLOCK_TILE_X (rows of x per tile); kernel_rows.h drives the tiles. */
#ifndef KERNEL_INLINE
#error "define KERNEL_INLINE and BLOCK_TILE_X before including kernel_blocks.h"
#endif

/* {sum(a), sum(b), sum(c), sum(d)} */
KERNEL_INLINE __m128 hsum4_ps256(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

KERNEL_INLINE float hsum_ps256(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* An F16 at p, in every lane (through qlm_f16_lut: one broadcast load). */
KERNEL_INLINE __m256 block_scale(const char *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _mm256_set1_ps(qlm_f16_lut[h]);
}

/* Run s (32 values) of a block's values as 16-bit integers: values 0..15 in v[0], 16..31 in v[1];
 * Q4 nibbles unsigned. */
KERNEL_INLINE void block_run(__m256i v[2], const char *vals, int s, qlm_dtype dt) {
    if (dt == QLM_Q8_0) {
        v[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(vals + 32 * s)));
        v[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(vals + 32 * s + 16)));
        return;
    }
    /* Zero-extended bytes: the high nibble is the word shifted right by 4, the low one masked. */
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(vals + 16 * s)));
    v[0] = _mm256_and_si256(b, _mm256_set1_epi16(15));
    v[1] = _mm256_srli_epi16(b, 4);
}

/* The pairwise products of a run of weights (block_run) with x's 32 values from x, in 8 lanes. */
KERNEL_INLINE __m256i run_dot(const __m256i w[2], const int16_t *x) {
    return _mm256_add_epi32(_mm256_madd_epi16(w[0], _mm256_loadu_si256((const __m256i *)x)),
                            _mm256_madd_epi16(w[1], _mm256_loadu_si256((const __m256i *)(x + 16))));
}

/* nr (1 or 4) rows of block weights (stride bytes apart) against nx (1..BLOCK_TILE_X) rows of x in
 * the I16 form (ldx elements apart) over cols columns; pf: the next rows, prefetched along. */
KERNEL_INLINE void block_tile(float *y, long ldy, const int16_t *x, long ldx, const char *w, size_t stride, long cols,
                              const int nr, const int nx, qlm_dtype dt, const int group, const char *pf) {
    const size_t bb = qlm_dtype_block_bytes(dt, group);
    const int head = qlm_block_head(dt), runs = group / 32;
    const __m256i ones[2] = {_mm256_set1_epi16(1), _mm256_set1_epi16(1)};
    __m256 acc[4][BLOCK_TILE_X];
    QLM_UNROLL(4)
    for (int r = 0; r < nr; r++)
        QLM_UNROLL(4)
        for (int i = 0; i < nx; i++) acc[r][i] = _mm256_setzero_ps();
    for (long k = 0, b = 0; k < cols; k += group, b++) {
        const char *blk = w + (size_t)b * bb;
        if (pf)
            for (size_t j = 0; j < (nr * bb + 63) / 64; j++) _mm_prefetch(pf + (size_t)b * nr * bb + 64 * j, _MM_HINT_T0);
        __m256i xsum[BLOCK_TILE_X];
        __m256 xsum_f[BLOCK_TILE_X];
        if (dt != QLM_Q8_0)
            QLM_UNROLL(4)
            for (int i = 0; i < nx; i++) {
                xsum[i] = _mm256_setzero_si256();
                for (int s = 0; s < runs; s++) xsum[i] = _mm256_add_epi32(xsum[i], run_dot(ones, x + i * ldx + k + 32 * s));
                if (dt == QLM_Q4_0) xsum[i] = _mm256_slli_epi32(xsum[i], 3);
                else xsum_f[i] = _mm256_cvtepi32_ps(xsum[i]);
            }
        QLM_UNROLL(4)
        for (int r = 0; r < nr; r++) {
            __m256i isum[BLOCK_TILE_X];
            QLM_UNROLL(4)
            for (int i = 0; i < nx; i++) isum[i] = dt == QLM_Q4_0 ? _mm256_sub_epi32(_mm256_setzero_si256(), xsum[i])
                                                                  : _mm256_setzero_si256();
            for (int s = 0; s < runs; s++) {
                __m256i wv[2];
                block_run(wv, blk + r * stride + head, s, dt);
                QLM_UNROLL(4)
                for (int i = 0; i < nx; i++) isum[i] = _mm256_add_epi32(isum[i], run_dot(wv, x + i * ldx + k + 32 * s));
            }
            const __m256 d = block_scale(blk + r * stride);
            QLM_UNROLL(4)
            for (int i = 0; i < nx; i++) acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), d, acc[r][i]);
            if (dt == QLM_Q4_1) {
                const __m256 m = block_scale(blk + r * stride + 2);
                QLM_UNROLL(4)
                for (int i = 0; i < nx; i++) acc[r][i] = _mm256_fmadd_ps(xsum_f[i], m, acc[r][i]);
            }
        }
    }
    QLM_UNROLL(4)
    for (int i = 0; i < nx; i++) {
        if (nr == 1)
            y[i * ldy] = hsum_ps256(acc[0][i]);
        else
            _mm_storeu_ps(y + i * ldy, hsum4_ps256(acc[0][i], acc[1][i], acc[2][i], acc[3][i]));
    }
}
