#include "block_pack.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "block_quant.h"
#include "matmul_internal.h"

/* Copies block b of row r of a panel (nb blocks per row) to or from blk in GGUF's layout
 * (to_panel: blk into the panel). A run's values go in groups of four bytes: Q8_0's four values,
 * or a Q4 byte's two nibbles as GGUF pairs them (value j and j + 16), which is the panel's
 * pairing too. */
static inline __attribute__((always_inline)) void move_block(uint8_t *panel, uint8_t *blk, qlm_dtype dt, int group,
                                                             long nb, int r, long b, int to_panel) {
    const int runs = group / 32, head = qlm_block_head(dt), run_bytes = qlm_block_run_bytes(dt);
    const size_t sb = qlm_panel_scale_bytes(dt), vb = qlm_panel_run_bytes(dt);
    uint8_t *sc = panel + b * sb + 2 * (size_t)r;
    for (int h = 0; h < head; h += 2, sc += 32) memcpy(to_panel ? sc : blk + h, to_panel ? blk + h : sc, 2);
    for (int s = 0; s < runs; s++) {
        uint8_t *run = panel + nb * sb + (size_t)(b * runs + s) * vb + 4 * (size_t)r;
        uint8_t *src = blk + head + (size_t)s * run_bytes;
        for (int c = 0; c < run_bytes / 4; c++) memcpy(to_panel ? run + 64 * c : src + 4 * c, to_panel ? src + 4 * c : run + 64 * c, 4);
    }
}

/* Row r of a panel to or from row in GGUF's layout. Inlined where dt and the direction are
 * constants: the loops over a block's bytes then unroll into plain moves. */
static inline __attribute__((always_inline)) void move_row(uint8_t *panel, uint8_t *row, qlm_dtype dt, int group,
                                                           long cols, int r, int to_panel) {
    const size_t bb = qlm_dtype_block_bytes(dt, group);
    for (long b = 0; b < cols / group; b++) move_block(panel, row + b * bb, dt, group, cols / group, r, b, to_panel);
}

const void *qlm_panels_block(const void *data, qlm_dtype dt, int group, int rows, long cols, int r, long b, void *room) {
    const size_t row_bytes = qlm_dtype_row_bytes(dt, cols, group);
    if (r >= qlm_panel_rows(rows)) return (const uint8_t *)data + (size_t)r * row_bytes + b * qlm_dtype_block_bytes(dt, group);
    uint8_t *panel = (uint8_t *)data + (size_t)(r / QLM_PANEL_ROWS) * QLM_PANEL_ROWS * row_bytes;
    move_block(panel, room, dt, group, cols / group, r % QLM_PANEL_ROWS, b, 0);
    return room;
}

void qlm_panels_row_f32(float *dst, const void *data, qlm_dtype dt, int group, int rows, long cols, int r) {
    uint8_t room[QLM_BLOCK_MAX_BYTES];
    for (long b = 0; b < cols / group; b++)
        qlm_block_dequantize_row(dst + b * group, dt, group, qlm_panels_block(data, dt, group, rows, cols, r, b, room),
                                 group);
}

static inline __attribute__((always_inline)) void rows_to_panel(void *panel, const void *const *rows, qlm_dtype dt,
                                                                int group, long cols) {
    for (int r = 0; r < QLM_PANEL_ROWS; r++) move_row(panel, (uint8_t *)rows[r], dt, group, cols, r, 1);
}

void qlm_panel_from_rows(void *panel, const void *const *rows, qlm_dtype dt, int group, long cols) {
    if (dt == QLM_Q8_0)
        rows_to_panel(panel, rows, QLM_Q8_0, group, cols);
    else if (dt == QLM_Q4_0)
        rows_to_panel(panel, rows, QLM_Q4_0, group, cols);
    else
        rows_to_panel(panel, rows, QLM_Q4_1, group, cols);
}

/* Each whole panel through a copy of its bytes, rows to panels or back; threads take panels. */
static int convert(void *data, qlm_dtype dt, int group, int rows, long cols, int to_panels) {
    const size_t row_bytes = qlm_dtype_row_bytes(dt, cols, group), bytes = QLM_PANEL_ROWS * row_bytes;
    const int panels = rows / QLM_PANEL_ROWS;
    int failed = 0;
#pragma omp parallel if (panels > 8)
    {
        uint8_t *tmp = malloc(bytes);
        if (!tmp) failed = 1;
#pragma omp for schedule(static)
        for (int p = 0; p < panels; p++) {
            if (!tmp) continue;
            uint8_t *at = (uint8_t *)data + (size_t)p * bytes;
            memcpy(tmp, at, bytes);
            if (to_panels) {
                const void *src[QLM_PANEL_ROWS];
                for (int r = 0; r < QLM_PANEL_ROWS; r++) src[r] = tmp + r * row_bytes;
                qlm_panel_from_rows(at, src, dt, group, cols);
            } else {
                for (int r = 0; r < QLM_PANEL_ROWS; r++) move_row(tmp, at + r * row_bytes, dt, group, cols, r, 0);
            }
        }
        free(tmp);
    }
    return failed ? qlm_errorf("out of memory putting weights into panels") : 0;
}

int qlm_block_to_panels(void *data, qlm_dtype dt, int group, int rows, long cols) {
    return convert(data, dt, group, rows, cols, 1);
}

int qlm_block_from_panels(void *data, qlm_dtype dt, int group, int rows, long cols) {
    return convert(data, dt, group, rows, cols, 0);
}
