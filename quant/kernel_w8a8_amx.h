/* W8A8 for Q8_0 weights in panels (block_pack.h) through AMX's integer tiles, 16 rows of x at a
 * time: a panel's run of 32 values is already the layout of a B tile (row c holds values 4c..4c+3
 * of each of the 16 weight rows), so TDPBSSD multiplies it as it is with 16 rows of x's I8 form
 * (an A tile of 16 rows x 32 bytes) into 16 x 16 exact integer sums: kernel_w8a8_vnni.h's, whose
 * scale arithmetic follows in the same order, so a row of x gets the same floats from either
 * kernel whatever rows share its call. Q4's nibbles would first have to be spread into bytes
 * through memory: that lost what the tiles gained (bench_kernels, Sapphire Rapids), so Q4_0 and
 * Q4_1 stay with VPDPBUSD. Included by kernels_avx512.h for the AMX table, after
 * kernel_w8a8_vnni.h (rows of x below 16, and other types, stay there). The caller has asked
 * Linux for the tile state (matmul.c). */

/* Rows of x one AMX panel tile takes. */
#define W8A8_AMX_ROWS 16

/* Configures tiles 0..count-1 (palette 1): tile t rows[t] rows of colsb[t] bytes. Every AMX
 * kernel (this file's and kernel_amx.h's) loads its own at the start of a call. */
AVX512_INLINE void amx_load_tiles(int count, const uint8_t *rows, const uint16_t *colsb) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < count; t++) c.rows[t] = rows[t], c.colsb[t] = colsb[t];
    _tile_loadconfig(&c);
}

/* Tile 0 the 16 x 16 int32 sums, tile 1 16 rows of 32 bytes of x, tile 2 the 8 rows of 64 bytes of
 * one run of the panel. */
AVX512_INLINE void amx_configure(void) {
    amx_load_tiles(3, (const uint8_t[]){16, 16, 8}, (const uint16_t[]){64, QLM_X8_BLOCK, 64});
}

/* One Q8_0 panel against W8A8_AMX_ROWS rows of x, as w8a8_panel with nx = 16 computes it. */
AVX512_INLINE void w8a8_panel_amx(float *y, long ldy, const int8_t *x, long ldx, const float *xs, long runs_ld,
                                  const char *panel, long cols, const int group) {
    const long nb = cols / group;
    const int runs = group / QLM_X8_BLOCK;
    const size_t sb = qlm_panel_scale_bytes(QLM_Q8_0), vb = qlm_panel_run_bytes(QLM_Q8_0);
    const char *vals = panel + nb * sb;
    int32_t sums[W8A8_AMX_ROWS][16];
    __m512 acc[W8A8_AMX_ROWS];
    QLM_UNROLL(16)
    for (int i = 0; i < W8A8_AMX_ROWS; i++) acc[i] = _mm512_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(panel + b * sb)));
        for (int s = 0; s < runs; s++) {
            const long run = b * runs + s;
            _tile_zero(0);
            _tile_loadd(1, x + run * QLM_X8_BLOCK, ldx);
            _tile_loadd(2, vals + run * vb, 64);
            _tile_dpbssd(0, 1, 2);
            _tile_stored(0, sums, 64);
            QLM_UNROLL(16)
            for (int i = 0; i < W8A8_AMX_ROWS; i++)
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(sums[i])),
                                         _mm512_mul_ps(d, _mm512_set1_ps(xs[i * runs_ld + run])), acc[i]);
        }
    }
    QLM_UNROLL(16)
    for (int i = 0; i < W8A8_AMX_ROWS; i++) _mm512_storeu_ps(y + i * ldy, acc[i]);
}
