/* The panel layout of block weights (Q8_0, Q4_0, Q4_1) that W8A8 reads (qlm_weight.act8): rows
 * in panels of QLM_PANEL_ROWS, each panel the same bytes as its rows in GGUF's layout, reordered
 * so that one 64-byte load holds four consecutive values of each of the panel's 16 rows, the
 * operand VPDPBUSD multiplies with four bytes of x broadcast to every lane. The 16 outputs of a
 * panel then sum in the lanes of one register: no horizontal sums, and a block's 16 scales
 * convert and apply with one instruction each instead of one per row. A panel holds, for each
 * block b of the row: its 16 F16 scales (Q4_1: then its 16 F16 offsets) at b * scale bytes;
 * after all of those, for each run of 32 values (group / 32 per block, in order), its values:
 *   Q8_0: 8 chunks of 64 bytes, chunk c holding values 4c..4c+3 of row r at bytes 4r..4r+3;
 *   Q4:   4 chunks of 64 bytes, chunk c holding values 4c..4c+3 of row r in the low nibbles of
 *         bytes 4r..4r+3 and values 16+4c..16+4c+3 in their high nibbles.
 * Rows past the last whole panel stay in GGUF's layout, where they were. */
#ifndef QLM_BLOCK_PACK_H
#define QLM_BLOCK_PACK_H

#include <stddef.h>

#include "../core/dtype.h"

#define QLM_PANEL_ROWS 16

/* Bytes of a panel's scales per block, and of its values per run of 32. */
static inline size_t qlm_panel_scale_bytes(qlm_dtype dt) { return dt == QLM_Q4_1 ? 64 : 32; }
static inline size_t qlm_panel_run_bytes(qlm_dtype dt) { return dt == QLM_Q8_0 ? 512 : 256; }

/* Rows of a matrix of rows rows that lie in whole panels. */
static inline int qlm_panel_rows(int rows) { return rows / QLM_PANEL_ROWS * QLM_PANEL_ROWS; }

/* Bytes of the largest block (Q4_1's or Q8_0's head and 128 values). */
#define QLM_BLOCK_MAX_BYTES (4 + 128)

/* Block b of row r of a block matrix at data (rows x cols, blocks of group) whose whole panels
 * are in the panel layout, in GGUF's layout: in place for a row past the panels, else copied
 * into room (QLM_BLOCK_MAX_BYTES). */
const void *qlm_panels_block(const void *data, qlm_dtype dt, int group, int rows, long cols, int r, long b, void *room);

/* Row r of such a matrix as F32, as qlm_block_dequantize_row gives it. */
void qlm_panels_row_f32(float *dst, const void *data, qlm_dtype dt, int group, int rows, long cols, int r);

/* Writes one panel (QLM_PANEL_ROWS rows of cols values) from its rows in GGUF's layout, wherever
 * they lie (a mapped file, a row just quantized). */
void qlm_panel_from_rows(void *panel, const void *const *rows, qlm_dtype dt, int group, long cols);

/* Puts the whole panels of a rows x cols block matrix at data into the panel layout, in place;
 * qlm_block_from_panels takes them back. -1 (message set) when out of memory. */
int qlm_block_to_panels(void *data, qlm_dtype dt, int group, int rows, long cols);
int qlm_block_from_panels(void *data, qlm_dtype dt, int group, int rows, long cols);

#endif
