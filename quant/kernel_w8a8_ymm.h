/* W8A8's panel tile in 256-bit vectors, for CPUs without AVX512_VNNI (AVX2, AVX-VNNI, AVX-512
 * before Cascade Lake); ymm instructions issue on more ports than zmm ones (as kernel_blocks.h
 * found). With AVX-VNNI (W8A8_YMM_VNNI), VEX-encoded VPDPBUSD does what kernel_w8a8_vnni.h's zmm
 * one does, 8 lanes at a time. Without it, VPMADDUBSW multiplies unsigned bytes with signed ones
 * and adds adjacent pairs into 16-bit lanes, saturating, and VPMADDWD by ones adds those pairs into
 * 32-bit lanes: four products a lane, as VPDPBUSD gives them. Either way a 64-byte chunk of a
 * panel (block_pack.h) serves as it does in zmm, rows 0-7 in its low half and 8-15 in its high
 * one. No sum saturates: Q4 nibbles (0..15) times x (|x| <= 127) pair to at most 3,810, and a
 * 16-bit lane adds a run's eight pairs (its four chunks' low and high nibbles), at most 30,480,
 * before one VPMADDWD; Q8_0's values are taken as |w| with w's sign moved onto x (VPSIGNB), pairs
 * at most 2 x 128 x 127 = 32,512 (VNNI's v + 128 would reach 64,770). The integer sums are the
 * zmm kernel's, and so is every float operation after them: the results are its results bit for
 * bit. Included before kernel_w8a8.h by kernels_avx2.h and kernels_avx512.h (without VNNI), after
 * KERNEL_INLINE, W8A8_YMM_VNNI and W8A8_TILE_X (rows of x a tile takes: its accumulators, two per
 * row, and 16-bit sums within the registers). */

/* acc + the sums of four products of a's unsigned and b's signed bytes, in 32-bit lanes (without
 * VNNI, each pair of products must stay within 16 bits). AVX-VNNI's intrinsic compiles to the VEX
 * form, which CPUs without AVX-512 run. */
KERNEL_INLINE __m256i dot_u8i8_ymm(__m256i acc, __m256i a, __m256i b) {
#if W8A8_YMM_VNNI
    return _mm256_dpbusd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
#endif
}

/* Four bytes of x from p in every 32-bit lane. */
KERNEL_INLINE __m256i x4_ymm(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

/* See kernel_w8a8_vnni.h's w8a8_panel, which this computes in the same order. */
KERNEL_INLINE void w8a8_panel(float *y, long ldy, const int8_t *x, long ldx, const float *xs, const int32_t *xsum,
                              long runs_ld, const char *panel, long cols, const int nx, qlm_dtype dt, const int group,
                              const char *pf) {
    const long nb = cols / group;
    const int runs = group / QLM_X8_BLOCK;
    const size_t sb = qlm_panel_scale_bytes(dt), vb = qlm_panel_run_bytes(dt), block_bytes = sb + runs * vb;
    const char *vals = panel + nb * sb;
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256 acc[W8A8_TILE_X][2];
    QLM_UNROLL(8)
    for (int i = 0; i < nx; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++) {
        if (pf)
            for (size_t o = 0; o < block_bytes; o += 64) _mm_prefetch(pf + b * block_bytes + o, _MM_HINT_T1);
        __m256 d[2], m[2];
        QLM_UNROLL(2)
        for (int h = 0; h < 2; h++) {
            d[h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(panel + b * sb + 16 * h)));
            m[h] = dt == QLM_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(panel + b * sb + 32 + 16 * h)))
                                  : _mm256_setzero_ps();
        }
        for (int s = 0; s < runs; s++) {
            const long run = b * runs + s;
            const char *v = vals + run * vb;
            const int8_t *xr = x + run * QLM_X8_BLOCK;
            __m256i isum[W8A8_TILE_X][2];
            if (dt == QLM_Q8_0) {
                QLM_UNROLL(8)
                for (int i = 0; i < nx; i++) isum[i][0] = isum[i][1] = _mm256_setzero_si256();
                QLM_UNROLL(8)
                for (int c = 0; c < 8; c++) {
                    const __m256i w[2] = {_mm256_loadu_si256((const __m256i *)(v + 64 * c)),
                                          _mm256_loadu_si256((const __m256i *)(v + 64 * c + 32))};
                    const __m256i a[2] = {_mm256_abs_epi8(w[0]), _mm256_abs_epi8(w[1])};
                    QLM_UNROLL(8)
                    for (int i = 0; i < nx; i++) {
                        const __m256i xb = x4_ymm(xr + i * ldx + 4 * c);
                        QLM_UNROLL(2)
                        for (int h = 0; h < 2; h++)
                            isum[i][h] = dot_u8i8_ymm(isum[i][h], a[h], _mm256_sign_epi8(xb, w[h]));
                    }
                }
            } else {
#if !W8A8_YMM_VNNI
                /* Without VNNI a 16-bit lane adds the run's pairs, then one VPMADDWD widens them. */
                __m256i s16[W8A8_TILE_X][2];
                QLM_UNROLL(8)
                for (int i = 0; i < nx; i++) s16[i][0] = s16[i][1] = _mm256_setzero_si256();
#endif
                QLM_UNROLL(8)
                for (int i = 0; i < nx; i++)
                    isum[i][0] = isum[i][1] = _mm256_set1_epi32(dt == QLM_Q4_0 ? -8 * xsum[i * runs_ld + run] : 0);
                QLM_UNROLL(4)
                for (int c = 0; c < 4; c++) {
                    __m256i lo[2], hi[2];
                    QLM_UNROLL(2)
                    for (int h = 0; h < 2; h++) {
                        const __m256i z = _mm256_loadu_si256((const __m256i *)(v + 64 * c + 32 * h));
                        lo[h] = _mm256_and_si256(z, low4);
                        hi[h] = _mm256_and_si256(_mm256_srli_epi16(z, 4), low4);
                    }
                    QLM_UNROLL(8)
                    for (int i = 0; i < nx; i++) {
                        const __m256i xa = x4_ymm(xr + i * ldx + 4 * c), xb = x4_ymm(xr + i * ldx + 16 + 4 * c);
                        QLM_UNROLL(2)
                        for (int h = 0; h < 2; h++) {
#if W8A8_YMM_VNNI
                            isum[i][h] = dot_u8i8_ymm(dot_u8i8_ymm(isum[i][h], lo[h], xa), hi[h], xb);
#else
                            s16[i][h] = _mm256_add_epi16(s16[i][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xa),
                                                                                     _mm256_maddubs_epi16(hi[h], xb)));
#endif
                        }
                    }
                }
#if !W8A8_YMM_VNNI
                QLM_UNROLL(8)
                for (int i = 0; i < nx; i++)
                    QLM_UNROLL(2)
                    for (int h = 0; h < 2; h++)
                        isum[i][h] = _mm256_add_epi32(isum[i][h], _mm256_madd_epi16(s16[i][h], _mm256_set1_epi16(1)));
#endif
            }
            QLM_UNROLL(8)
            for (int i = 0; i < nx; i++) {
                const float dx = xs[i * runs_ld + run];
                QLM_UNROLL(2)
                for (int h = 0; h < 2; h++) {
                    acc[i][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][h]), _mm256_mul_ps(d[h], _mm256_set1_ps(dx)),
                                                acc[i][h]);
                    if (dt == QLM_Q4_1)
                        acc[i][h] = _mm256_fmadd_ps(m[h], _mm256_set1_ps((float)xsum[i * runs_ld + run] * dx), acc[i][h]);
                }
            }
        }
    }
    QLM_UNROLL(8)
    for (int i = 0; i < nx; i++) {
        _mm256_storeu_ps(y + i * ldy, acc[i][0]);
        _mm256_storeu_ps(y + i * ldy + 8, acc[i][1]);
    }
}
