/* BF16 and I8 weights through AMX tiles, for the AMX table: every product of a BF16 weight whose
 * rows have a multiple of 32 columns (TDPBF16PS) and of an I8 weight whose rows have a multiple of
 * 64 columns, up to AMX_I8_MAX_COLS (TDPBSSD and TDPBUSD), decode's single row of x as much as a
 * prompt's.
 *
 * BF16: the tiles add their products in an order of their own (not VDPBF16PS's, nor any order
 * written out in F32: measured on Sapphire Rapids), but one that depends on neither where a row
 * of x or W sits in its tile nor which other rows share it.
 * I8: x comes in the I16 form, whose values q split into a signed high byte and an unsigned low
 * one (q = 256 h + l); W's bytes multiply the two in tiles of their own, whose sums are exact in
 * 32 bits over a whole row (|h|, |w| <= 128 and l <= 255 over 65,536 columns stay below 2^31). An
 * output is the exact integer dot product rounded once to F32 and then scaled as qlm_gemv_finish
 * scales it, where the vector kernels round the sums of each lane and of each 2048 columns.
 * Either way a weight takes the tiles or the vector kernel by its shape alone, so a row of x gets
 * the same floats whatever rows share its call.
 *
 * Two layouts. With 16 rows of x or more, x goes into A tiles (16 rows of 64 bytes: BF16 rows as
 * they lie, I8's two planes of bytes from a split copy), and each 16 weight rows are first
 * repacked, 64 bytes of each at a time, into a panel whose chunks are B tiles (row p holds bytes
 * 4p..4p+3 of each of the 16 rows: a 16 x 16 transpose of 32-bit words), which then serves every
 * block of x. Fewer rows of x take the other layout (amx_gemm_few). Included by kernels_avx512.h
 * for the AMX table after kernel_rows.h and kernel_w8a8_amx.h. */

/* Bytes of a tile row: a chunk of a row of W or x (32 BF16 columns, 64 I8 ones). */
#define AMX_ROW_BYTES 64
/* Rows of x, and of W, one tile takes. */
#define AMX_ROWS 16
/* Bytes of a chunk of a panel: a B tile. */
#define AMX_CHUNK (AMX_ROWS * AMX_ROW_BYTES)
/* Columns up to which I8's integer sums stay exact in 32 bits. */
#define AMX_I8_MAX_COLS 65536L

/* The calling thread's room for what the tiles read repacked (panels, padded rows, x's columns or
 * planes), kept across calls. */
static _Thread_local qlm_cpu_scratch t_amx;

/* Tiles 0-3: 2 x 2 blocks of 16 x 16 sums; 4-5: two A tiles of x; 6-7: a chunk of each of two
 * panels. All are 16 rows of 64 bytes. */
AVX512_INLINE void amx_configure_panels(void) {
    amx_load_tiles(8, (const uint8_t[]){16, 16, 16, 16, 16, 16, 16, 16},
                   (const uint16_t[]){64, 64, 64, 64, 64, 64, 64, 64});
}

/* r[i] lane j <- r[j] lane i, for 16 x 16 32-bit lanes: pairs within 128-bit lanes, then their
 * quadruples, then the 128-bit lanes of four rows each. */
AVX512_INLINE void transpose_16x16(__m512i r[16]) {
    __m512i t[16], u[16];
    QLM_UNROLL(8)
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[4g + c], lane L: column 4L + c of rows 4g..4g+3. */
    QLM_UNROLL(4)
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    QLM_UNROLL(4)
    for (int c = 0; c < 4; c++) {
        const __m512i a01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), a23 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
        const __m512i b01 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
        const __m512i b23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
        r[c] = _mm512_shuffle_i32x4(a01, b01, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(a01, b01, 0xdd);
        r[8 + c] = _mm512_shuffle_i32x4(a23, b23, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(a23, b23, 0xdd);
    }
}

/* The rows W the tiles multiply: rows of chunks x AMX_ROW_BYTES bytes (BF16 or I8), stride bytes
 * apart, of which there are rows (a weight's, or a chunk of attention's keys). I8's outputs are
 * scaled by row_scales[o], or by scale where that is NULL, and with add go onto y's values. */
typedef struct {
    const char *data;
    size_t stride;
    int rows;
    long chunks;
    const float *row_scales;
    float scale;
    int add;
} amx_rows;

/* nr (<= 16) rows from w (stride bytes apart; the panel's other rows zero) into panel, chunk c at
 * panel + c AMX_CHUNK. The same bytes of the npf rows at pf (the next block's) are prefetched
 * meanwhile: the hardware prefetchers lose track of many short row streams. */
AVX512_INLINE void amx_pack(char *panel, const char *w, size_t stride, int nr, long chunks, const char *pf, int npf) {
    for (long c = 0; c < chunks; c++) {
        __m512i r[AMX_ROWS];
        QLM_UNROLL(16)
        for (int j = 0; j < AMX_ROWS; j++)
            r[j] = j < nr ? _mm512_loadu_si512(w + j * stride + c * AMX_ROW_BYTES) : _mm512_setzero_si512();
        for (int j = 0; j < npf; j++) _mm_prefetch(pf + j * stride + c * AMX_ROW_BYTES, _MM_HINT_T0);
        transpose_16x16(r);
        QLM_UNROLL(16)
        for (int p = 0; p < AMX_ROWS; p++) _mm512_store_si512(panel + c * AMX_CHUNK + p * AMX_ROW_BYTES, r[p]);
    }
}

/* The panel of x W (amx_gemm_xw) for outputs k0..k0+nk-1 (nk <= 16): chunk c holds W's rows 64c to
 * 64c + 63 (stride bytes apart), tile row p bytes 4p..4p+3 of each output's column, so four rows'
 * 16 bytes from k0 interleaved (the other columns zero). */
AVX512_INLINE void amx_pack_t(char *panel, const char *w, size_t stride, int k0, int nk, long chunks) {
    const __mmask16 m = tail_mask(nk);
    for (long c = 0; c < chunks; c++)
        for (int p = 0; p < AMX_ROWS; p++) {
            const char *r = w + (size_t)(AMX_ROW_BYTES * c + 4 * p) * stride + k0;
            const __m128i r0 = _mm_maskz_loadu_epi8(m, r), r1 = _mm_maskz_loadu_epi8(m, r + stride);
            const __m128i r2 = _mm_maskz_loadu_epi8(m, r + 2 * stride), r3 = _mm_maskz_loadu_epi8(m, r + 3 * stride);
            const __m128i a = _mm_unpacklo_epi8(r0, r1), b = _mm_unpackhi_epi8(r0, r1);
            const __m128i d = _mm_unpacklo_epi8(r2, r3), e = _mm_unpackhi_epi8(r2, r3);
            __m128i *dst = (__m128i *)(panel + c * AMX_CHUNK + p * AMX_ROW_BYTES);
            _mm_store_si128(dst, _mm_unpacklo_epi16(a, d));
            _mm_store_si128(dst + 1, _mm_unpackhi_epi16(a, d));
            _mm_store_si128(dst + 2, _mm_unpacklo_epi16(b, e));
            _mm_store_si128(dst + 3, _mm_unpackhi_epi16(b, e));
        }
}

/* Tile `tile` (0-3) to dst, rows ld bytes apart. */
AVX512_INLINE void amx_store_tile(const int tile, void *dst, long ld) {
    switch (tile) {
    case 0: _tile_stored(0, dst, ld); break;
    case 1: _tile_stored(1, dst, ld); break;
    case 2: _tile_stored(2, dst, ld); break;
    default: _tile_stored(3, dst, ld); break;
    }
}

/* BF16's sums in tile `tile` into y (rows ldy floats apart): mi rows of x by nw weight rows,
 * through stage when the tile is not whole. */
AVX512_INLINE void amx_store_f32(const int tile, float *y, long ldy, int mi, int nw) {
    float stage[AMX_ROWS][AMX_ROWS];
    if (mi == AMX_ROWS && nw == AMX_ROWS) {
        amx_store_tile(tile, y, ldy * (long)sizeof(float));
        return;
    }
    amx_store_tile(tile, stage, sizeof stage[0]);
    for (int i = 0; i < mi; i++) memcpy(y + i * ldy, stage[i], (size_t)nw * sizeof(float));
}

/* 65536 h + 256 m + l for 8 lanes of each, exact in double (below 2^47). */
AVX512_INLINE __m512d amx_i8_total(__m256i h, __m256i m, __m256i l) {
    const __m512d mid = _mm512_fmadd_pd(_mm512_cvtepi32_pd(m), _mm512_set1_pd(256.0), _mm512_cvtepi32_pd(l));
    return _mm512_fmadd_pd(_mm512_cvtepi32_pd(h), _mm512_set1_pd(65536.0), mid);
}

/* The outputs t..t+nw-1 (nw <= 16) for one row of x, whose integer form has the scale xs, into
 * y[0..nw): the exact sums of its byte planes (I16: hi 256 + lo, with top zero; I24: top 65536 +
 * hi 256 + lo) rounded once to F32, then times xs and W's scale and plus the bias, in
 * qlm_gemv_finish's order (and onto y's values with w->add). */
AVX512_INLINE void amx_i8_finish(float *y, __m512i top, __m512i hi, __m512i lo, float xs, const amx_rows *w, int t,
                                 int nw, const float *bias) {
    const __m512d s0 = amx_i8_total(_mm512_castsi512_si256(top), _mm512_castsi512_si256(hi), _mm512_castsi512_si256(lo));
    const __m512d s1 = amx_i8_total(_mm512_extracti64x4_epi64(top, 1), _mm512_extracti64x4_epi64(hi, 1),
                                    _mm512_extracti64x4_epi64(lo, 1));
    __m512 s = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm512_cvtpd_ps(s0))),
                                                   _mm256_castps_pd(_mm512_cvtpd_ps(s1)), 1));
    const __mmask16 m = tail_mask(nw);
    s = _mm512_mul_ps(s, _mm512_set1_ps(xs));
    s = _mm512_mul_ps(s, w->row_scales ? _mm512_maskz_loadu_ps(m, w->row_scales + t) : _mm512_set1_ps(w->scale));
    if (bias) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, bias + t));
    if (w->add) s = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y), s);
    _mm512_mask_storeu_ps(y, m, s);
}

/* I8's sums of 16 rows of x by 16 weight rows from t, high bytes' in tile hi and low bytes' in
 * tile lo, into the mi x nw outputs at y (rows ldy floats apart; x's scales xs). */
AVX512_INLINE void amx_i8_store(const int hi, const int lo, float *y, long ldy, int mi, int nw, const float *xs,
                                const amx_rows *w, int t, const float *bias) {
    int32_t h[AMX_ROWS][AMX_ROWS], l[AMX_ROWS][AMX_ROWS];
    amx_store_tile(hi, h, sizeof h[0]);
    amx_store_tile(lo, l, sizeof l[0]);
    for (int i = 0; i < mi; i++)
        amx_i8_finish(y + i * ldy, _mm512_setzero_si512(), _mm512_loadu_si512(h[i]), _mm512_loadu_si512(l[i]), xs[i], w,
                      t, nw, bias);
}

/* The sums over all chunks of the A tiles at xa and xb (lda, ldb bytes from row to row) by the
 * panels pa and pb, in tiles 0 (xa pa), 1 (xa pb), 2 (xb pa) and 3 (xb pb), for na (1 or 2) A
 * tiles and nb (1 or 2) panels. BF16: xa and xb are two blocks of x; I8: one block's high bytes
 * (signed) and low bytes (unsigned). */
AVX512_INLINE void amx_tiles(const char *xa, long lda, const char *xb, long ldb, const char *pa, const char *pb,
                             long chunks, const int na, const int nb, const int i8) {
    _tile_zero(0);
    if (nb > 1) _tile_zero(1);
    if (na > 1) _tile_zero(2);
    if (na > 1 && nb > 1) _tile_zero(3);
    for (long c = 0; c < chunks; c++) {
        _tile_loadd(4, xa + c * AMX_ROW_BYTES, lda);
        _tile_loadd(6, pa + c * AMX_CHUNK, AMX_ROW_BYTES);
        if (i8) _tile_dpbssd(0, 4, 6);
        else _tile_dpbf16ps(0, 4, 6);
        if (nb > 1) {
            _tile_loadd(7, pb + c * AMX_CHUNK, AMX_ROW_BYTES);
            if (i8) _tile_dpbssd(1, 4, 7);
            else _tile_dpbf16ps(1, 4, 7);
        }
        if (na > 1) {
            _tile_loadd(5, xb + c * AMX_ROW_BYTES, ldb);
            if (i8) _tile_dpbusd(2, 5, 6);
            else _tile_dpbf16ps(2, 5, 6);
            if (nb > 1 && i8) _tile_dpbusd(3, 5, 7);
            else if (nb > 1) _tile_dpbf16ps(3, 5, 7);
        }
    }
}

/* Rows of x in the I16 form (ldx elements apart) as two planes of bytes: row i's high bytes
 * (signed) at hi + i ld, its low bytes (unsigned) at lo + i ld; cols a multiple of 32. */
AVX512_INLINE void amx_i8_planes(char *hi, char *lo, long ld, const int16_t *x, long ldx, int n, long cols) {
    for (int i = 0; i < n; i++)
        for (long k = 0; k < cols; k += 32) {
            const __m512i v = _mm512_loadu_si512(x + i * ldx + k);
            _mm256_storeu_si256((__m256i *)(hi + i * ld + k), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
            _mm256_storeu_si256((__m256i *)(lo + i * ld + k), _mm512_cvtepi16_epi8(v));
        }
}

/* Rows [r0, r1) of y = x W^T (+ bias), y's rows ldy floats apart, for n >= 16 rows of x. BF16: x's
 * rows lie ldx bytes apart, and room holds the two panels and 16 zero-padded rows; I8: x is the
 * high-byte plane and xlo the low one (ldx bytes from row to row, zero rows up to a whole 16),
 * xs their scales, and room the two panels. */
AVX512_INLINE void amx_gemm_panels(float *y, long ldy, const char *x, const char *xlo, long ldx, const float *xs, int n,
                                   const amx_rows *w, int r0, int r1, const float *bias, char *room, const int i8) {
    const long chunks = w->chunks, bytes = chunks * AMX_ROW_BYTES;
    const size_t stride = w->stride;
    char *pa = room, *pb = room + chunks * AMX_CHUNK, *xpad = pb + chunks * AMX_CHUNK;
    const int whole = i8 ? n : n - n % AMX_ROWS;
    if (whole < n) {
        for (int i = whole; i < n; i++) memcpy(xpad + (i - whole) * bytes, x + i * ldx, (size_t)bytes);
        memset(xpad + (n - whole) * bytes, 0, (size_t)(AMX_ROWS - (n - whole)) * bytes);
    }
    amx_configure_panels();
    for (int t = r0; t < r1; t += 2 * AMX_ROWS) {
        const int nw = r1 - t < 2 * AMX_ROWS ? r1 - t : 2 * AMX_ROWS;
        const int na = nw < AMX_ROWS ? nw : AMX_ROWS, nb = nw - na;
        const int next = r1 - t - nw < 2 * AMX_ROWS ? r1 - t - nw : 2 * AMX_ROWS;
        const int pfa = next < AMX_ROWS ? next : AMX_ROWS;
        const char *wt = w->data + (size_t)t * stride, *wn = wt + nw * stride;
        amx_pack(pa, wt, stride, na, chunks, wn, pfa);
        if (nb > 0)
            amx_pack(pb, wt + AMX_ROWS * stride, stride, nb, chunks, next > pfa ? wn + AMX_ROWS * stride : NULL, next - pfa);
        if (i8) {
            for (int i = 0; i < n; i += AMX_ROWS) {
                const int mi = n - i < AMX_ROWS ? n - i : AMX_ROWS;
                float *yi = y + i * ldy + t;
                if (nb > 0) amx_tiles(x + i * ldx, ldx, xlo + i * ldx, ldx, pa, pb, chunks, 2, 2, 1);
                else amx_tiles(x + i * ldx, ldx, xlo + i * ldx, ldx, pa, pb, chunks, 2, 1, 1);
                amx_i8_store(0, 2, yi, ldy, mi, na, xs + i, w, t, bias);
                if (nb > 0) amx_i8_store(1, 3, yi + AMX_ROWS, ldy, mi, nb, xs + i, w, t + AMX_ROWS, bias);
            }
            continue;
        }
        for (int i = 0; i < n; i += 2 * AMX_ROWS) {
            const int ma = n - i < AMX_ROWS ? n - i : AMX_ROWS;
            const int mb = n - i - ma < AMX_ROWS ? n - i - ma : AMX_ROWS;
            const char *xa = i < whole ? x + i * ldx : xpad, *xb = i + AMX_ROWS < whole ? xa + AMX_ROWS * ldx : xpad;
            const long lda = i < whole ? ldx : bytes, ldb = i + AMX_ROWS < whole ? ldx : bytes;
            float *ya = y + i * ldy + t, *yb = ya + AMX_ROWS * ldy;
            if (mb > 0 && nb > 0) amx_tiles(xa, lda, xb, ldb, pa, pb, chunks, 2, 2, 0);
            else if (mb > 0) amx_tiles(xa, lda, xb, ldb, pa, pb, chunks, 2, 1, 0);
            else if (nb > 0) amx_tiles(xa, lda, xb, ldb, pa, pb, chunks, 1, 2, 0);
            else amx_tiles(xa, lda, xb, ldb, pa, pb, chunks, 1, 1, 0);
            amx_store_f32(0, ya, ldy, ma, na);
            if (nb > 0) amx_store_f32(1, ya + AMX_ROWS, ldy, ma, nb);
            if (mb > 0) amx_store_f32(2, yb, ldy, mb, na);
            if (mb > 0 && nb > 0) amx_store_f32(3, yb + AMX_ROWS, ldy, mb, nb);
        }
        if (bias)
            for (int i = 0; i < n; i++)
                for (int o = t; o < t + nw; o++) y[i * ldy + o] += bias[o];
    }
    _tile_release();
}

/* Fewer than AMX_ROWS rows of x (decode, a small batch) take the roles the other way round, which
 * gives the same floats (the products commute and their order in the tiles is the same;
 * measured): W's rows are A tiles loaded where they lie, so no weight is repacked, and x is the B
 * tile of n columns, each row's 32-bit word q (BF16: a pair of columns; I8: four bytes of a plane)
 * at [q][row of x] (one row of x is itself). One block of 16 weight rows at a time: with two or
 * three in flight, BF16 decode read more rows at once and lost 5-20% of its speed (SmolLM2-135M,
 * Sapphire Rapids). Tiles: 0 the block's sums (I8: of the high bytes), 16 rows of n 32-bit lanes
 * (y's rows transposed); 1 its rows' chunk; 2 x's chunk (I8: of the high bytes); I8's low bytes:
 * 3 their sums, 4 their chunk. */

/* Chunks ahead of the tiles that the block's rows are prefetched: a tile load that misses L1 waits
 * on its 16 lines in turn (BF16 decode then ran at two thirds of the vector kernel's speed); 4 and
 * 8 were alike and better than 1 and 2 (bench_kernels, Sapphire Rapids). */
#define AMX_AHEAD 4

AVX512_INLINE void amx_configure_few(int n) {
    const uint16_t x_bytes = (uint16_t)(4 * n);
    amx_load_tiles(5, (const uint8_t[]){16, 16, 16, 16, 16}, (const uint16_t[]){x_bytes, 64, x_bytes, x_bytes, x_bytes});
}

/* Row i of the n rows of x (words 32-bit words at row) into the few-rows layout's columns. */
AVX512_INLINE void amx_column(uint32_t *cols, const char *row, long words, int n, int i) {
    for (long q = 0; q < words; q++) memcpy(&cols[q * n + i], row + 4 * q, 4);
}

/* The sums of 16 weight rows from w (ld bytes from row to row) with the n columns of xh (I8: and
 * xl) over all chunks, prefetching AMX_AHEAD chunks ahead in these rows or, past their end, in the
 * npf rows at pf (pf_ld bytes apart). */
AVX512_INLINE void amx_few_tile(const char *w, long ld, const char *xh, const char *xl, int n, long chunks,
                                const char *pf, long pf_ld, int npf, const int i8) {
    const long x_chunk = AMX_ROWS * 4 * n;
    _tile_zero(0);
    if (i8) _tile_zero(3);
    for (long c = 0; c < chunks; c++) {
        const long ahead = c + AMX_AHEAD;
        if (ahead < chunks)
            for (int j = 0; j < AMX_ROWS; j++) _mm_prefetch(w + j * ld + ahead * AMX_ROW_BYTES, _MM_HINT_T0);
        else
            for (int j = 0; j < npf; j++) _mm_prefetch(pf + j * pf_ld + (ahead - chunks) * AMX_ROW_BYTES, _MM_HINT_T0);
        _tile_loadd(2, xh + c * x_chunk, 4 * n);
        _tile_loadd(1, w + c * AMX_ROW_BYTES, ld);
        if (i8) {
            _tile_dpbssd(0, 1, 2);
            _tile_loadd(4, xl + c * x_chunk, 4 * n);
            _tile_dpbsud(3, 1, 4);
        } else {
            _tile_dpbf16ps(0, 1, 2);
        }
    }
}

/* The block's sums (16 weight rows from t by n rows of x) into the n x nw outputs at y (output t of
 * x's first row; rows ldy floats apart): as they are plus the bias (BF16), or through
 * amx_i8_finish with x's scales xs. */
AVX512_INLINE void amx_few_store(float *y, long ldy, int n, int nw, const float *xs, const amx_rows *w, int t,
                                 const float *bias, const int i8) {
    int32_t stage[AMX_ROWS][AMX_ROWS];
    __m512i s[AMX_ROWS], l[AMX_ROWS];
    /* One row of x: its 16 sums are the tile's column, stored as one row; more rows of x: y's rows
     * transposed. */
    if (n == 1) {
        _tile_stored(0, stage, 4);
        s[0] = _mm512_loadu_si512(stage[0]);
        if (i8) {
            _tile_stored(3, stage, 4);
            l[0] = _mm512_loadu_si512(stage[0]);
        }
    } else {
        _tile_stored(0, stage, sizeof stage[0]);
        QLM_UNROLL(16)
        for (int r = 0; r < AMX_ROWS; r++) s[r] = _mm512_loadu_si512(stage[r]);
        transpose_16x16(s);
        if (i8) {
            _tile_stored(3, stage, sizeof stage[0]);
            QLM_UNROLL(16)
            for (int r = 0; r < AMX_ROWS; r++) l[r] = _mm512_loadu_si512(stage[r]);
            transpose_16x16(l);
        }
    }
    const __mmask16 m = tail_mask(nw);
    for (int i = 0; i < n; i++) {
        if (i8) {
            amx_i8_finish(y + i * ldy, _mm512_setzero_si512(), s[i], l[i], xs[i], w, t, nw, bias);
            continue;
        }
        __m512 v = _mm512_castsi512_ps(s[i]);
        if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + t));
        _mm512_mask_storeu_ps(y + i * ldy, m, v);
    }
}

/* amx_gemm_panels for n < AMX_ROWS, x in the columns xh (and I8's xl); wpad: room for 16 rows of
 * W, W's last ones zero-padded to a whole block. */
AVX512_INLINE void amx_gemm_few(float *y, long ldy, const char *xh, const char *xl, const float *xs, int n,
                                const amx_rows *w, int r0, int r1, const float *bias, char *wpad, const int i8) {
    const long chunks = w->chunks, bytes = chunks * AMX_ROW_BYTES;
    const size_t stride = w->stride;
    amx_configure_few(n);
    for (int t = r0; t < r1; t += AMX_ROWS) {
        const int nw = r1 - t < AMX_ROWS ? r1 - t : AMX_ROWS;
        const int npf = r1 - t - nw < AMX_ROWS ? r1 - t - nw : AMX_ROWS;
        const char *wt = w->data + (size_t)t * stride;
        long ld = (long)stride;
        if (t + AMX_ROWS > w->rows) {
            for (int r = 0; r < w->rows - t; r++) memcpy(wpad + r * bytes, wt + r * stride, (size_t)bytes);
            memset(wpad + (w->rows - t) * bytes, 0, (size_t)(t + AMX_ROWS - w->rows) * bytes);
            wt = wpad;
            ld = bytes;
        }
        amx_few_tile(wt, ld, xh, xl, n, chunks, w->data + (size_t)(t + nw) * stride, (long)stride, npf, i8);
        amx_few_store(y + t, ldy, n, nw, xs, w, t, bias, i8);
    }
    _tile_release();
}

/* y = x W^T (+ bias) through the tiles for rows [r0, r1) of W, in the layout n asks for: x BF16
 * rows (i8 = 0) or the I16 form with row scales xs (i8 = 1), ldx elements apart. 0, or -1 without
 * room for what the tiles read repacked. */
AVX512_INLINE int amx_gemm(float *y, long ldy, const void *x, long ldx, const float *xs, int n, const amx_rows *w,
                           int r0, int r1, const float *bias, const int i8) {
    const long bytes = w->chunks * AMX_ROW_BYTES, plane = qlm_x_row_stride(bytes, 1);
    const long npad = (n + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS;
    const int16_t *xq = x;
    size_t need;
    if (n < AMX_ROWS) /* W's padded rows, x's columns (I8: two planes, and a row split on the way) */
        need = (size_t)bytes * (AMX_ROWS + (i8 ? 2 * n + (n > 1 ? 2 : 0) : n > 1 ? n : 0));
    else /* two panels, and BF16's 16 padded rows of x or I8's planes */
        need = (size_t)2 * w->chunks * AMX_CHUNK + (i8 ? (size_t)2 * npad * plane : (size_t)AMX_ROWS * bytes);
    char *room = qlm_cpu_scratch_bytes(&t_amx, need);
    if (!room) return -1;
    if (n >= AMX_ROWS && !i8) {
        amx_gemm_panels(y, ldy, x, NULL, ldx * 2, NULL, n, w, r0, r1, bias, room, 0);
    } else if (n >= AMX_ROWS) {
        char *hi = room + 2 * w->chunks * AMX_CHUNK, *lo = hi + npad * plane;
        amx_i8_planes(hi, lo, plane, xq, ldx, n, bytes);
        memset(hi + n * plane, 0, (size_t)(npad - n) * plane);
        memset(lo + n * plane, 0, (size_t)(npad - n) * plane);
        amx_gemm_panels(y, ldy, hi, lo, plane, xs, n, w, r0, r1, bias, room, 1);
    } else if (!i8) {
        char *cols = room + AMX_ROWS * bytes;
        for (int i = 0; n > 1 && i < n; i++) amx_column((uint32_t *)cols, (const char *)x + i * ldx * 2, bytes / 4, n, i);
        amx_gemm_few(y, ldy, n > 1 ? cols : x, NULL, NULL, n, w, r0, r1, bias, room, 0);
    } else {
        char *hi = room + AMX_ROWS * bytes, *lo = hi + n * bytes, *split = lo + n * bytes;
        if (n == 1) amx_i8_planes(hi, lo, 0, xq, ldx, 1, bytes);
        for (int i = 0; n > 1 && i < n; i++) {
            amx_i8_planes(split, split + bytes, 0, xq + i * ldx, ldx, 1, bytes);
            amx_column((uint32_t *)hi, split, bytes / 4, n, i);
            amx_column((uint32_t *)lo, split + bytes, bytes / 4, n, i);
        }
        amx_gemm_few(y, ldy, hi, lo, xs, n, w, r0, r1, bias, room, 1);
    }
    return 0;
}

/* The AMX table's gemm and dot_rows: BF16 rows of whole 32 columns and I8 rows of whole 64 (up to
 * AMX_I8_MAX_COLS) through the tiles, every other product through the vector kernels. Without
 * room for the panels they take the vector kernel too: correct, but rounded as it rounds. */
AVX512_FN void gemm_amx(float *y, const void *x, long ldx, const float *x_scale, int n, const qlm_weight *w, int r0,
                        int r1, const float *bias) {
    if (r0 < r1 && w->dtype == QLM_BF16 && w->cols % 32 == 0) {
        const amx_rows rows = {w->data, (size_t)w->cols * 2, w->rows, w->cols / 32, NULL, 1.0f, 0};
        if (amx_gemm(y, w->rows, x, ldx, NULL, n, &rows, r0, r1, bias, 0) == 0) return;
    } else if (r0 < r1 && w->dtype == QLM_I8 && w->cols % 64 == 0 && w->cols <= AMX_I8_MAX_COLS) {
        const amx_rows rows = {w->data, (size_t)w->cols, w->rows, w->cols / 64, w->row_scales, w->scale, 0};
        if (amx_gemm(y, w->rows, x, ldx, x_scale, n, &rows, r0, r1, bias, 1) == 0) return;
    }
    gemm(y, x, ldx, x_scale, n, w, r0, r1, bias);
}

AVX512_FN void dot_rows_amx(float *y, long ldy, const void *x, int n, const void *w, size_t w_stride, int rows,
                            long cols, qlm_dtype dt) {
    const amx_rows r = {w, w_stride * 2, rows, cols / 32, NULL, 1.0f, 0};
    if (dt != QLM_BF16 || cols % 32 != 0 || amx_gemm(y, ldy, x, cols, NULL, n, &r, 0, rows, NULL, 0) != 0)
        attention_scores(y, ldy, x, n, w, w_stride, rows, cols, dt);
}

/* The product x W of an I8 weight's backward (qlm_matmul_i8_xw): x in the I24 form as three planes
 * of bytes (q = 65536 t + 256 h + l: a signed top byte and unsigned high and low ones; each plane's
 * rows ld bytes apart, the planes plane bytes apart, rows of zeros up to a whole 16), whose three
 * sums are each exact in 32 bits as I16's two are. One panel at a time (amx_pack_t): three sums, an
 * x tile per plane and the panel fill the eight tiles. */

/* The sums of one block of x's three planes (from x, plane bytes apart) by the panel over all
 * chunks, in tiles 0 (top), 1 (high) and 2 (low). */
AVX512_INLINE void amx_tiles_i24(const char *x, long ld, long plane, const char *panel, long chunks) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    for (long c = 0; c < chunks; c++) {
        _tile_loadd(6, panel + c * AMX_CHUNK, AMX_ROW_BYTES);
        _tile_loadd(4, x + c * AMX_ROW_BYTES, ld);
        _tile_dpbssd(0, 4, 6);
        _tile_loadd(5, x + plane + c * AMX_ROW_BYTES, ld);
        _tile_dpbusd(1, 5, 6);
        _tile_loadd(7, x + 2 * plane + c * AMX_ROW_BYTES, ld);
        _tile_dpbusd(2, 7, 6);
    }
}

/* Outputs [k0, k1) of y = x W (rows of y ldy floats apart) for n rows of x; panel: room for one. */
AVX512_INLINE void amx_gemm_xw(float *y, long ldy, const char *x, long ld, long plane, const float *xs, int n,
                               const amx_rows *w, int k0, int k1, char *panel) {
    amx_configure_panels();
    for (int t = k0; t < k1; t += AMX_ROWS) {
        const int nw = k1 - t < AMX_ROWS ? k1 - t : AMX_ROWS;
        amx_pack_t(panel, w->data, w->stride, t, nw, w->chunks);
        for (int i = 0; i < n; i += AMX_ROWS) {
            const int mi = n - i < AMX_ROWS ? n - i : AMX_ROWS;
            int32_t top[AMX_ROWS][AMX_ROWS], hi[AMX_ROWS][AMX_ROWS], lo[AMX_ROWS][AMX_ROWS];
            amx_tiles_i24(x + i * ld, ld, plane, panel, w->chunks);
            _tile_stored(0, top, sizeof top[0]);
            _tile_stored(1, hi, sizeof hi[0]);
            _tile_stored(2, lo, sizeof lo[0]);
            for (int r = 0; r < mi; r++)
                amx_i8_finish(y + (i + r) * ldy + t, _mm512_loadu_si512(top[r]), _mm512_loadu_si512(hi[r]),
                              _mm512_loadu_si512(lo[r]), xs[i + r], w, t, nw, NULL);
        }
    }
    _tile_release();
}

/* See qlm_kernel_table.i24_planes. */
AVX512_FN float i24_planes(int8_t *top, uint8_t *hi, uint8_t *lo, const float *x, const float *scales, long n) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (long k = 0; k < n; k += 16) {
        __m512 v = _mm512_loadu_ps(x + k);
        if (scales) v = _mm512_mul_ps(v, _mm512_loadu_ps(scales + k));
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    float inv, s = qlm_x_int_scale(_mm512_reduce_max_ps(mx), nan != 0, QLM_I24_MAX, &inv);
    const __m512 f = _mm512_set1_ps(inv);
    for (long k = 0; k < n; k += 16) {
        __m512 v = _mm512_loadu_ps(x + k);
        if (scales) v = _mm512_mul_ps(v, _mm512_loadu_ps(scales + k));
        /* Round to nearest even, as lrintf; inv = 0 (not finite, or tiny) gives all zeros. */
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, f));
        _mm_storeu_si128((__m128i *)(top + k), _mm512_cvtepi32_epi8(_mm512_srai_epi32(q, 16)));
        _mm_storeu_si128((__m128i *)(hi + k), _mm512_cvtepi32_epi8(_mm512_srai_epi32(q, 8)));
        _mm_storeu_si128((__m128i *)(lo + k), _mm512_cvtepi32_epi8(q));
    }
    return s;
}

/* See qlm_kernel_table.gemm_i8_xw. Without room for the panel, the same exact sums one at a time
 * (the same floats, slowly). */
AVX512_FN void gemm_i8_xw(float *y, const char *x, long ld, long plane, const float *xs, int n, const qlm_weight *w,
                          float scale, int k0, int k1, int add) {
    const amx_rows t = {w->data, (size_t)w->cols, w->cols, w->rows / AMX_ROW_BYTES, NULL, scale, add};
    char *panel = k0 < k1 ? qlm_cpu_scratch_bytes(&t_amx, (size_t)t.chunks * AMX_CHUNK) : NULL;
    if (panel) {
        amx_gemm_xw(y, w->cols, x, ld, plane, xs, n, &t, k0, k1, panel);
        return;
    }
    const int8_t *wd = w->data;
    for (int i = 0; i < n; i++)
        for (int k = k0; k < k1; k++) {
            int64_t sum = 0;
            for (int o = 0; o < w->rows; o++) {
                const char *xo = x + i * ld + o;
                const int32_t q = (int8_t)xo[0] * 65536 + (uint8_t)xo[plane] * 256 + (uint8_t)xo[2 * plane];
                sum += (int64_t)q * wd[(size_t)o * w->cols + k];
            }
            float *yo = y + (size_t)i * w->cols + k, v = (float)sum * xs[i] * scale;
            *yo = add ? *yo + v : v;
        }
}
