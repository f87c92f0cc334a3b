/* Attention scores with the keys across the lanes, for calls of many query rows (prefill): each
 * block of 16 keys is widened and turned once (lane k holds key k), then every query row meets
 * it with FMAs whose query element is broadcast, and the horizontal sums that dominate the tiles'
 * scores at head_dim 64 (hsum4's shuffles on the one shuffle port) become vertical adds. Lane j's
 * chain of a tile (the columns gemm_step puts in lane j, in its order) is here the chain of the
 * turned vector j, and hsum4's tree (lanes j and j + 8, then pairs, then halves) is the same tree
 * over those vectors, so every score is the tiles' bit for bit: a row's score depends neither on
 * the call's row count nor on which kernel took it. Included by kernels_avx512.h after
 * kernel_rows.h (dot_rows, the tiles' driver, takes the calls this one does not). */

/* Keys a block takes: one a lane. */
#define LANE_KEYS 16
/* head_dim up to which a turned block (head_dim vectors) stays on the stack. */
#define LANE_KEYS_MAX_COLS 256
/* Query rows from which turning each block pays for itself (single thread, head_dim 64, BF16 keys:
 * 8 rows 1.8 ns a score either way, 48 rows 1.1 against the tiles' 1.8; decode's few take the tiles). */
#define LANE_KEYS_MIN_ROWS 8

/* Step s of a key row (16 columns of F32 and F16, half of 32 of split BF16) as gemm_step puts it
 * in the lanes: for split BF16 the even columns of a 32-column run, then its odd ones. */
AVX512_INLINE __m512 key_step(const char *row, int s, qlm_dtype dt) {
    if (SPLIT_BF16(dt)) {
        const __m512i pairs = _mm512_loadu_si512((const uint16_t *)row + 32 * (s / 2));
        return _mm512_castsi512_ps(s % 2 ? _mm512_and_si512(pairs, _mm512_set1_epi32((int)0xffff0000u))
                                         : _mm512_slli_epi32(pairs, 16));
    }
    return load16(row, 16L * s, dt, (__mmask16)0xffff);
}

/* v[c] becomes the vector of lane c of the 16 vectors v held (a 16 x 16 transpose). */
AVX512_INLINE void transpose16(__m512 v[16]) {
    __m512 t[16], u[16];
    QLM_UNROLL(8)
    for (int k = 0; k < 8; k++) {
        t[2 * k] = _mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]);
    }
    /* u[4k + e], lane L: element 4L + e of v[4k .. 4k + 3]. */
    QLM_UNROLL(4)
    for (int k = 0; k < 4; k++) {
        u[4 * k] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
        u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xee);
        u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
        u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xee);
    }
    /* Column 4L + e gathers lane L of u[e], u[4 + e], u[8 + e], u[12 + e]: a 4 x 4 transpose of lanes. */
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

/* The sum of lane chains j and j + 8 of nq (a constant) query rows against the turned block kt:
 * chain j multiplies turned vector 16 s + j by the query's element 16 s + j (its x form) for
 * each step s in order, from zero, as the tile's lane j does; f = chain j + chain j + 8 is
 * fold()'s sum of that lane pair. */
AVX512_INLINE void lane_pair(__m512 f[4], const float *x, long ldx, const __m512 *kt, int steps, int j, const int nq) {
    __m512 lo[4], hi[4];
    QLM_UNROLL(4)
    for (int i = 0; i < nq; i++) lo[i] = hi[i] = _mm512_setzero_ps();
    for (int s = 0; s < steps; s++) {
        const __m512 a = kt[16 * s + j], b = kt[16 * s + j + 8];
        QLM_UNROLL(4)
        for (int i = 0; i < nq; i++) {
            lo[i] = _mm512_fmadd_ps(a, _mm512_set1_ps(x[i * ldx + 16 * s + j]), lo[i]);
            hi[i] = _mm512_fmadd_ps(b, _mm512_set1_ps(x[i * ldx + 16 * s + j + 8]), hi[i]);
        }
    }
    QLM_UNROLL(4)
    for (int i = 0; i < nq; i++) f[i] = _mm512_add_ps(lo[i], hi[i]);
}

/* q = f_j + f_{j + 1} (j even): the first of hsum4's pairwise sums. */
AVX512_INLINE void lane_quad(__m512 q[4], const float *x, long ldx, const __m512 *kt, int steps, int j, const int nq) {
    __m512 f[4];
    lane_pair(q, x, ldx, kt, steps, j, nq);
    lane_pair(f, x, ldx, kt, steps, j + 1, nq);
    QLM_UNROLL(4)
    for (int i = 0; i < nq; i++) q[i] = _mm512_add_ps(q[i], f[i]);
}

/* Scores of nq (1 to 4, a constant) query rows against a turned block, the lanes in m stored:
 * hsum4's tree ((f0 + f1) + (f2 + f3)) + ((f4 + f5) + (f6 + f7)), each sum taken as its terms come. */
AVX512_INLINE void lane_scores(float *y, long ldy, const float *x, long ldx, const __m512 *kt, int steps, const int nq,
                               __mmask16 m) {
    __m512 h[2][4], a[4], b[4];
    QLM_UNROLL(2)
    for (int half = 0; half < 2; half++) {
        lane_quad(a, x, ldx, kt, steps, 4 * half, nq);
        lane_quad(b, x, ldx, kt, steps, 4 * half + 2, nq);
        QLM_UNROLL(4)
        for (int i = 0; i < nq; i++) h[half][i] = _mm512_add_ps(a[i], b[i]);
    }
    QLM_UNROLL(4)
    for (int i = 0; i < nq; i++) _mm512_mask_storeu_ps(y + i * ldy, m, _mm512_add_ps(h[0][i], h[1][i]));
}

/* dot_rows for n >= LANE_KEYS_MIN_ROWS query rows (x in the form of dt, rows cols apart) and whole
 * steps of columns: keys in blocks of 16, each widened and turned into kt, then met by the rows
 * four at a time. */
AVX512_INLINE void key_lane_scores(float *y, long ldy, const float *x, int n, const char *w, size_t stride, int rows,
                                   long cols, qlm_dtype dt) {
    __m512 kt[LANE_KEYS_MAX_COLS];
    const int steps = (int)(cols / 16);
    for (int r0 = 0; r0 < rows; r0 += LANE_KEYS) {
        const int nk = rows - r0 < LANE_KEYS ? rows - r0 : LANE_KEYS;
        for (int s = 0; s < steps; s++) {
            __m512 v[16];
            QLM_UNROLL(16)
            for (int k = 0; k < 16; k++) v[k] = k < nk ? key_step(w + (size_t)(r0 + k) * stride, s, dt) : _mm512_setzero_ps();
            transpose16(v);
            QLM_UNROLL(16)
            for (int c = 0; c < 16; c++) kt[16 * s + c] = v[c];
        }
        const __mmask16 m = nk == LANE_KEYS ? (__mmask16)0xffff : tail_mask(nk);
        float *yr = y + r0;
        int i = 0;
        for (; i + 4 <= n; i += 4) lane_scores(yr + i * ldy, ldy, x + i * cols, cols, kt, steps, 4, m);
        switch (n - i) {
        case 3: lane_scores(yr + i * ldy, ldy, x + i * cols, cols, kt, steps, 3, m); break;
        case 2: lane_scores(yr + i * ldy, ldy, x + i * cols, cols, kt, steps, 2, m); break;
        case 1: lane_scores(yr + i * ldy, ldy, x + i * cols, cols, kt, steps, 1, m); break;
        default: break;
        }
    }
}

/* The table's dot_rows: the keys across the lanes where they can be (not for the BF16 dot
 * product's own order, nor for a row with a partial step), else the tiles. */
AVX512_FN void attention_scores(float *y, long ldy, const void *x, int n, const void *w, size_t w_stride, int rows,
                                long cols, qlm_dtype dt) {
    if (n >= LANE_KEYS_MIN_ROWS && !USES_DP(dt) && cols % STEP_COLS(dt) == 0 && cols <= LANE_KEYS_MAX_COLS)
        key_lane_scores(y, ldy, (const float *)x, n, (const char *)w, w_stride * qlm_weight_elem_size(dt), rows, cols,
                        dt);
    else
        dot_rows(y, ldy, x, n, w, w_stride, rows, cols, dt);
}
