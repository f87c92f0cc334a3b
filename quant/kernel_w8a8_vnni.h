/* W8A8 for block weights (Q8_0, Q4_0, Q4_1) in panels (block_pack.h) on AVX512_VNNI: x in the I8
 * form (bytes, with a scale and the sum of the values of each run of QLM_X8_BLOCK, qlm_x_dtype)
 * and VPDPBUSD, which multiplies unsigned bytes with signed ones and adds each four products
 * into a 32-bit lane. A 64-byte chunk of a panel holds four values of each of 16 weight rows;
 * four bytes of x broadcast to every lane multiply them, so lane r sums row r's products and
 * one register holds the panel's 16 outputs for one row of x. Q8_0's signed values are made
 * unsigned by flipping their top bit (v + 128), Q4 nibbles are unsigned already (v + 8 for
 * Q4_0): that excess times the run's sum of x starts each integer sum, so the sums are exact.
 * Per run, the 16 sums convert and add times the block's 16 scales (one conversion from F16)
 * and x's scale (Q4_1: plus its 16 offsets times the run's sum of x). Rows past the last panel
 * go through the scalar code (qlm_w8a8_rows). Included by kernels_avx512.h for VNNI targets, before
 * kernel_w8a8.h. */

/* acc + the sums of four products of a's unsigned and b's signed bytes, in 32-bit lanes. */
AVX512_INLINE __m512i dot_u8i8(__m512i acc, __m512i a, __m512i b) {
#if defined(__clang__)
    return _mm512_dpbusd_epi32(acc, a, b);
#else
    /* As asm with the accumulator tied, for the reasons given at dot_i16. */
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
#endif
}

/* Four bytes of x from p in every 32-bit lane. */
AVX512_INLINE __m512i x4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* Rows of x a panel tile takes at most: 8 sums and 8 accumulators, the weight chunks and scales,
 * within the 32 registers. */
#define W8A8_TILE_X 8

/* One panel (16 rows of block weights, group weights per block) against nx rows of x in the I8
 * form (ldx bytes apart; their run scales xs and sums xsum, runs_ld apart) over cols columns:
 * y[i * ldy + r] for r < 16, i < nx, scales and all. With pf, the next panel (its bytes follow
 * this one's) goes into L2 as this one is read, a block's share per block: the hardware
 * prefetchers stop at every 4 KiB page, and decode's 4-bit panels, with twice the arithmetic per
 * byte of Q8_0's, had memory and arithmetic taking turns (SmolLM2-135M Q4_1 decode +28%, the
 * 1.1B shape's Q4_0 +30%, Q8_0 +7%; into L1 instead, one 35-95 KiB panel of the 1.1B's Q8_0
 * ahead evicted what was in use and lost 10%). */
AVX512_INLINE void w8a8_panel(float *y, long ldy, const int8_t *x, long ldx, const float *xs, const int32_t *xsum,
                              long runs_ld, const char *panel, long cols, const int nx, qlm_dtype dt, const int group,
                              const char *pf) {
    const long nb = cols / group;
    const int runs = group / QLM_X8_BLOCK, excess = dt == QLM_Q8_0 ? 128 : dt == QLM_Q4_0 ? 8 : 0;
    const size_t sb = qlm_panel_scale_bytes(dt), vb = qlm_panel_run_bytes(dt), block_bytes = sb + runs * vb;
    const char *vals = panel + nb * sb;
    const __m512i low4 = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
    __m512 acc[W8A8_TILE_X];
    QLM_UNROLL(8)
    for (int i = 0; i < nx; i++) acc[i] = _mm512_setzero_ps();
    for (long b = 0; b < nb; b++) {
        if (pf)
            for (size_t o = 0; o < block_bytes; o += 64) _mm_prefetch(pf + b * block_bytes + o, _MM_HINT_T1);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(panel + b * sb)));
        const __m512 m = dt == QLM_Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(panel + b * sb + 32)))
                                        : _mm512_setzero_ps();
        for (int s = 0; s < runs; s++) {
            const long run = b * runs + s;
            const char *v = vals + run * vb;
            const int8_t *xr = x + run * QLM_X8_BLOCK;
            __m512i isum[W8A8_TILE_X];
            QLM_UNROLL(8)
            for (int i = 0; i < nx; i++) isum[i] = _mm512_set1_epi32(-excess * xsum[i * runs_ld + run]);
            if (dt == QLM_Q8_0) {
                QLM_UNROLL(8)
                for (int c = 0; c < 8; c++) {
                    const __m512i w = _mm512_xor_si512(_mm512_loadu_si512(v + 64 * c), flip);
                    QLM_UNROLL(8)
                    for (int i = 0; i < nx; i++) isum[i] = dot_u8i8(isum[i], w, x4(xr + i * ldx + 4 * c));
                }
            } else {
                QLM_UNROLL(4)
                for (int c = 0; c < 4; c++) {
                    const __m512i z = _mm512_loadu_si512(v + 64 * c);
                    const __m512i lo = _mm512_and_si512(z, low4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
                    QLM_UNROLL(8)
                    for (int i = 0; i < nx; i++) {
                        isum[i] = dot_u8i8(isum[i], lo, x4(xr + i * ldx + 4 * c));
                        isum[i] = dot_u8i8(isum[i], hi, x4(xr + i * ldx + 16 + 4 * c));
                    }
                }
            }
            QLM_UNROLL(8)
            for (int i = 0; i < nx; i++) {
                const float dx = xs[i * runs_ld + run];
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc[i]);
                if (dt == QLM_Q4_1)
                    acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps((float)xsum[i * runs_ld + run] * dx), acc[i]);
            }
        }
    }
    QLM_UNROLL(8)
    for (int i = 0; i < nx; i++) _mm512_storeu_ps(y + i * ldy, acc[i]);
}

