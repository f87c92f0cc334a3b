/* BF16 weights through AMX's BF16 tiles (TDPBF16PS), for the AMX table: every product of a
 * weight whose rows have a multiple of 32 columns, decode's single row of x as much as a
 * prompt's. The tiles add their products in an order of their own (not VDPBF16PS's, nor any
 * order written out in F32: measured on Sapphire Rapids), but one that depends on neither where a
 * row of x or W sits in its tile nor which other rows share it; a weight takes the tiles or the
 * vector kernel by its shape alone, so a row of x gets the same floats whatever rows share its
 * call. With 16 rows of x or more, x goes into A tiles as it lies (16 rows of 32 columns); each
 * 16 weight rows are first repacked, 32 columns at a time, into a panel whose chunks are B tiles
 * (row p holds columns 2p and 2p + 1 of each of the 16 weight rows: a 16 x 16 transpose of column
 * pairs), and the panel then serves every block of x. Rows of x past the last whole 16 come from a
 * zero-padded copy. Fewer rows of x take the other layout below (gemm_bf16_amx_few). Included by
 * kernels_avx512.h for the AMX table after kernel_rows.h and kernel_w8a8_amx.h. */

/* Columns of one chunk: a tile row's 16 pairs. */
#define BF16_AMX_COLS 32
/* Rows of x, and of W, one tile takes. */
#define BF16_AMX_ROWS 16
/* BF16 elements of one chunk of a panel: a B tile. */
#define BF16_AMX_CHUNK (BF16_AMX_ROWS * BF16_AMX_COLS)

/* The calling thread's room for what the tiles read repacked (panels, padded rows, x's columns),
 * kept across calls. */
static _Thread_local qlm_cpu_scratch t_bf16_amx;

/* Tiles 0-3: the 2 x 2 blocks of 16 x 16 F32 sums; 4-5: two blocks of 16 rows of x; 6-7: a chunk
 * of each of two panels. All are 16 rows of 64 bytes. */
AVX512_INLINE void bf16_amx_configure(void) {
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

/* nr (<= 16) weight rows from w (stride elements apart; the panel's other rows zero) into panel,
 * chunk c at panel + c BF16_AMX_CHUNK. The same columns of the npf rows at pf (the next block's)
 * are prefetched meanwhile: the hardware prefetchers lose track of many short row streams. */
AVX512_INLINE void bf16_amx_pack(uint16_t *panel, const uint16_t *w, size_t stride, int nr, long chunks,
                                 const uint16_t *pf, int npf) {
    for (long c = 0; c < chunks; c++) {
        __m512i r[BF16_AMX_ROWS];
        QLM_UNROLL(16)
        for (int j = 0; j < BF16_AMX_ROWS; j++)
            r[j] = j < nr ? _mm512_loadu_si512(w + j * stride + c * BF16_AMX_COLS) : _mm512_setzero_si512();
        for (int j = 0; j < npf; j++) _mm_prefetch((const char *)(pf + j * stride + c * BF16_AMX_COLS), _MM_HINT_T0);
        transpose_16x16(r);
        QLM_UNROLL(16)
        for (int p = 0; p < BF16_AMX_ROWS; p++) _mm512_store_si512(panel + c * BF16_AMX_CHUNK + p * BF16_AMX_COLS, r[p]);
    }
}

/* Sums tile `tile` into y (rows ldy floats apart): mi rows of x by nw weight rows, through stage
 * when the tile is not whole. */
AVX512_INLINE void bf16_amx_store(const int tile, float *y, long ldy, int mi, int nw) {
    float stage[BF16_AMX_ROWS][BF16_AMX_ROWS];
    const int whole = mi == BF16_AMX_ROWS && nw == BF16_AMX_ROWS;
    float *dst = whole ? y : &stage[0][0];
    const long ld = whole ? ldy * (long)sizeof(float) : (long)sizeof stage[0];
    switch (tile) {
    case 0: _tile_stored(0, dst, ld); break;
    case 1: _tile_stored(1, dst, ld); break;
    case 2: _tile_stored(2, dst, ld); break;
    default: _tile_stored(3, dst, ld); break;
    }
    if (!whole)
        for (int i = 0; i < mi; i++) memcpy(y + i * ldy, stage[i], (size_t)nw * sizeof(float));
}

/* The sums of na (1 or 2) blocks of x (xa, xb: lda, ldb bytes from row to row) by nb (1 or 2)
 * panels (pa, pb) over all chunks, in tiles 0 (xa pa), 1 (xa pb), 2 (xb pa) and 3 (xb pb). */
AVX512_INLINE void bf16_amx_tiles(const uint16_t *xa, long lda, const uint16_t *xb, long ldb, const uint16_t *pa,
                                  const uint16_t *pb, long chunks, const int na, const int nb) {
    _tile_zero(0);
    if (nb > 1) _tile_zero(1);
    if (na > 1) _tile_zero(2);
    if (na > 1 && nb > 1) _tile_zero(3);
    for (long c = 0; c < chunks; c++) {
        _tile_loadd(4, xa + c * BF16_AMX_COLS, lda);
        _tile_loadd(6, pa + c * BF16_AMX_CHUNK, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (nb > 1) {
            _tile_loadd(7, pb + c * BF16_AMX_CHUNK, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (na > 1) {
            _tile_loadd(5, xb + c * BF16_AMX_COLS, ldb);
            _tile_dpbf16ps(2, 5, 6);
            if (nb > 1) _tile_dpbf16ps(3, 5, 7);
        }
    }
}

/* The BF16 rows W the tiles multiply: rows of cols elements (a multiple of BF16_AMX_COLS), stride
 * elements apart, of which there are rows (a weight's, or a chunk of attention's keys). */
typedef struct {
    const uint16_t *data;
    size_t stride;
    int rows;
    long cols;
} bf16_rows;

/* Rows [r0, r1) of y = x W^T (+ bias), y's rows ldy floats apart, x in BF16 rows ldx elements
 * apart; room: the two panels and 16 padded rows of x. */
AVX512_INLINE void gemm_bf16_amx(float *y, long ldy, const uint16_t *x, long ldx, int n, const bf16_rows *w, int r0,
                                 int r1, const float *bias, uint16_t *room) {
    const long cols = w->cols, chunks = cols / BF16_AMX_COLS;
    const size_t stride = w->stride;
    const uint16_t *wd = w->data;
    uint16_t *pa = room, *pb = room + chunks * BF16_AMX_CHUNK, *xpad = pb + chunks * BF16_AMX_CHUNK;
    const int whole = n - n % BF16_AMX_ROWS;
    if (whole < n) {
        for (int i = whole; i < n; i++) memcpy(xpad + (i - whole) * cols, x + i * ldx, (size_t)cols * sizeof *x);
        memset(xpad + (n - whole) * cols, 0, (size_t)(BF16_AMX_ROWS - (n - whole)) * cols * sizeof *x);
    }
    bf16_amx_configure();
    for (int t = r0; t < r1; t += 2 * BF16_AMX_ROWS) {
        const int nw = r1 - t < 2 * BF16_AMX_ROWS ? r1 - t : 2 * BF16_AMX_ROWS;
        const int na = nw < BF16_AMX_ROWS ? nw : BF16_AMX_ROWS, nb = nw - na;
        const int next = r1 - t - nw < 2 * BF16_AMX_ROWS ? r1 - t - nw : 2 * BF16_AMX_ROWS;
        const int pfa = next < BF16_AMX_ROWS ? next : BF16_AMX_ROWS;
        const uint16_t *wt = wd + (size_t)t * stride, *wn = wt + nw * stride;
        bf16_amx_pack(pa, wt, stride, na, chunks, wn, pfa);
        if (nb > 0)
            bf16_amx_pack(pb, wt + BF16_AMX_ROWS * stride, stride, nb, chunks, next > pfa ? wn + BF16_AMX_ROWS * stride : NULL,
                          next - pfa);
        for (int i = 0; i < n; i += 2 * BF16_AMX_ROWS) {
            const int ma = n - i < BF16_AMX_ROWS ? n - i : BF16_AMX_ROWS;
            const int mb = n - i - ma < BF16_AMX_ROWS ? n - i - ma : BF16_AMX_ROWS;
            const uint16_t *xa = i < whole ? x + i * ldx : xpad, *xb = i + BF16_AMX_ROWS < whole ? xa + BF16_AMX_ROWS * ldx : xpad;
            const long lda = (i < whole ? ldx : cols) * 2, ldb = (i + BF16_AMX_ROWS < whole ? ldx : cols) * 2;
            float *ya = y + i * ldy + t, *yb = ya + BF16_AMX_ROWS * ldy;
            if (mb > 0 && nb > 0) bf16_amx_tiles(xa, lda, xb, ldb, pa, pb, chunks, 2, 2);
            else if (mb > 0) bf16_amx_tiles(xa, lda, xb, ldb, pa, pb, chunks, 2, 1);
            else if (nb > 0) bf16_amx_tiles(xa, lda, xb, ldb, pa, pb, chunks, 1, 2);
            else bf16_amx_tiles(xa, lda, xb, ldb, pa, pb, chunks, 1, 1);
            bf16_amx_store(0, ya, ldy, ma, na);
            if (nb > 0) bf16_amx_store(1, ya + BF16_AMX_ROWS, ldy, ma, nb);
            if (mb > 0) bf16_amx_store(2, yb, ldy, mb, na);
            if (mb > 0 && nb > 0) bf16_amx_store(3, yb + BF16_AMX_ROWS, ldy, mb, nb);
        }
        if (bias)
            for (int i = 0; i < n; i++)
                for (int o = t; o < t + nw; o++) y[i * ldy + o] += bias[o];
    }
    _tile_release();
}

/* Fewer than BF16_AMX_ROWS rows of x (decode, a small batch) take the roles the other way round,
 * which gives the same floats (the products commute and their order in the tiles is the same;
 * measured): W's rows are A tiles loaded where they lie, so no weight is repacked, and x is the B
 * tile of n columns, each pair of its rows' columns one 32-bit column ([pair][row of x]; one row
 * of x is itself). One block of 16 weight rows at a time: with two or three in flight, decode read
 * more rows at once and lost 5-20% of its speed (SmolLM2-135M, Sapphire Rapids). Tiles: 0 the
 * block's sums, 16 rows of n floats (y's rows transposed); 1 its rows' chunk; 2 x's chunk. */

/* Chunks ahead of the tiles that the block's rows are prefetched: a tile load that misses L1 waits
 * on its 16 lines in turn (decode then ran at two thirds of the vector kernel's speed); 4 and 8
 * were alike and better than 1 and 2 (bench_kernels, Sapphire Rapids). */
#define BF16_AMX_AHEAD 4

AVX512_INLINE void bf16_amx_configure_few(int n) {
    const uint16_t x_bytes = (uint16_t)(4 * n);
    amx_load_tiles(3, (const uint8_t[]){16, 16, 16}, (const uint16_t[]){x_bytes, 64, x_bytes});
}

/* The sums of 16 weight rows from w (ld elements from row to row) with the n columns of xp over all
 * chunks, in tile 0, prefetching BF16_AMX_AHEAD chunks ahead in these rows or, past their end, in
 * the npf rows at pf (pf_ld elements apart). */
AVX512_INLINE void bf16_amx_few_tile(const uint16_t *w, long ld, const uint32_t *xp, int n, long chunks,
                                     const uint16_t *pf, long pf_ld, int npf) {
    _tile_zero(0);
    for (long c = 0; c < chunks; c++) {
        const long ahead = c + BF16_AMX_AHEAD;
        if (ahead < chunks)
            for (int j = 0; j < BF16_AMX_ROWS; j++) _mm_prefetch((const char *)(w + j * ld + ahead * BF16_AMX_COLS), _MM_HINT_T0);
        else
            for (int j = 0; j < npf; j++)
                _mm_prefetch((const char *)(pf + j * pf_ld + (ahead - chunks) * BF16_AMX_COLS), _MM_HINT_T0);
        _tile_loadd(2, xp + c * BF16_AMX_ROWS * n, 4 * n);
        _tile_loadd(1, w + c * BF16_AMX_COLS, ld * 2);
        _tile_dpbf16ps(0, 1, 2);
    }
}

/* gemm_bf16_amx for n < BF16_AMX_ROWS; room: n cols elements for x's columns (n > 1) and 16 cols
 * for W's last rows, zero-padded to a whole block. */
AVX512_INLINE void gemm_bf16_amx_few(float *y, long ldy, const uint16_t *x, long ldx, int n, const bf16_rows *w, int r0,
                                     int r1, const float *bias, uint16_t *room) {
    const long cols = w->cols, chunks = cols / BF16_AMX_COLS, pairs = cols / 2;
    const size_t stride = w->stride;
    const uint16_t *wd = w->data;
    const uint32_t *xp = (const uint32_t *)x;
    uint16_t *wpad = room + (n > 1 ? n * cols : 0);
    if (n > 1) {
        uint32_t *p = (uint32_t *)room;
        for (int i = 0; i < n; i++) {
            const uint32_t *xi = (const uint32_t *)(x + i * ldx);
            for (long q = 0; q < pairs; q++) p[q * n + i] = xi[q];
        }
        xp = p;
    }
    bf16_amx_configure_few(n);
    for (int t = r0; t < r1; t += BF16_AMX_ROWS) {
        const int nw = r1 - t < BF16_AMX_ROWS ? r1 - t : BF16_AMX_ROWS;
        const int npf = r1 - t - nw < BF16_AMX_ROWS ? r1 - t - nw : BF16_AMX_ROWS;
        const uint16_t *wt = wd + (size_t)t * stride;
        long ld = (long)stride;
        if (t + BF16_AMX_ROWS > w->rows) {
            /* W ends within this block: its rows from a zero-padded copy. */
            for (int r = 0; r < w->rows - t; r++) memcpy(wpad + r * cols, wt + r * stride, (size_t)cols * sizeof *wpad);
            memset(wpad + (w->rows - t) * cols, 0, (size_t)(t + BF16_AMX_ROWS - w->rows) * cols * sizeof *wpad);
            wt = wpad;
            ld = cols;
        }
        bf16_amx_few_tile(wt, ld, xp, n, chunks, wd + (size_t)(t + nw) * stride, (long)stride, npf);
        float stage[BF16_AMX_ROWS * BF16_AMX_ROWS];
        float *dst = n == 1 && nw == BF16_AMX_ROWS ? y + t : stage;
        _tile_stored(0, dst, 4 * n);
        if (dst == stage)
            for (int i = 0; i < n; i++)
                for (int r = 0; r < nw; r++) y[i * ldy + t + r] = stage[r * n + i];
        if (bias)
            for (int i = 0; i < n; i++)
                for (int o = t; o < t + nw; o++) y[i * ldy + o] += bias[o];
    }
    _tile_release();
}

/* y = x W^T (+ bias) through the tiles for rows [r0, r1) of W, in the layout n asks for; 0, or -1
 * without room for the panels. */
AVX512_INLINE int bf16_amx(float *y, long ldy, const uint16_t *x, long ldx, int n, const bf16_rows *w, int r0, int r1,
                           const float *bias) {
    /* Two panels and 16 padded rows, or n - 1 < 16 rows of x's columns and 16 padded rows. */
    uint16_t *room = qlm_cpu_scratch_bytes(&t_bf16_amx, (size_t)w->cols * (2 + 1) * BF16_AMX_ROWS * 2);
    if (!room) return -1;
    if (n < BF16_AMX_ROWS)
        gemm_bf16_amx_few(y, ldy, x, ldx, n, w, r0, r1, bias, room);
    else
        gemm_bf16_amx(y, ldy, x, ldx, n, w, r0, r1, bias, room);
    return 0;
}

/* The AMX table's gemm and dot_rows: BF16 rows with whole chunks of columns through the tiles,
 * every other product through the vector kernels. Without room for the panels they take the
 * vector kernel too: correct, but rounded as VDPBF16PS rounds. */
AVX512_FN void gemm_amx(float *y, const void *x, long ldx, const float *x_scale, int n, const qlm_weight *w, int r0,
                        int r1, const float *bias) {
    const bf16_rows rows = {w->data, (size_t)w->cols, w->rows, w->cols};
    if (w->dtype != QLM_BF16 || w->cols % BF16_AMX_COLS != 0 || r0 >= r1 ||
        bf16_amx(y, w->rows, x, ldx, n, &rows, r0, r1, bias) != 0)
        gemm(y, x, ldx, x_scale, n, w, r0, r1, bias);
}

AVX512_FN void dot_rows_amx(float *y, long ldy, const void *x, int n, const void *w, size_t w_stride, int rows,
                            long cols, qlm_dtype dt) {
    const bf16_rows r = {w, w_stride, rows, cols};
    if (dt != QLM_BF16 || cols % BF16_AMX_COLS != 0 || bf16_amx(y, ldy, x, cols, n, &r, 0, rows, NULL) != 0)
        dot_rows(y, ldy, x, n, w, w_stride, rows, cols, dt);
}
