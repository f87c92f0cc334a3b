/* Rows of the block types (core/dtype.h: Q8_0, Q4_0, Q4_1 with groups of 32, 64 or 128) from and
 * to F32. The scales follow GGUF's reference rules, so a qlm-made Q4_0 or Q8_0 block at group 32
 * holds the values llama.cpp's quantizer would choose up to the rounding of ties:
 *   Q8_0: d = max|w| / 127, q = round(w / d)
 *   Q4_0: d = w* / -8 where w* is the value of largest magnitude, q = round(w / d) + 8 in 0..15
 *   Q4_1: d = (max - min) / 15, m = min, q = round((w - m) / d) in 0..15
 * d and m are stored as F16 and the values are rounded against the stored d (and m). Non-finite
 * weights quantize as 0; a block of zeros gets d = 0. */
#ifndef QLM_BLOCK_QUANT_H
#define QLM_BLOCK_QUANT_H

#include <stdint.h>

#include "../core/dtype.h"

/* Where value j of a Q4 block's runs lies (core/dtype.h): its byte among the values, and the
 * shift of its nibble in that byte. */
static inline int qlm_q4_byte(int j) { return (j / 32) * 16 + j % 16; }
static inline int qlm_q4_shift(int j) { return j % 32 < 16 ? 0 : 4; }

/* Value j of a block's values (the bytes after its scale and offset) as the integer its scale
 * multiplies: Q8_0's int8, a Q4 nibble (Q4_0: less 8). */
static inline int qlm_block_value(const uint8_t *vals, int j, qlm_dtype dt) {
    if (dt == QLM_Q8_0) return ((const int8_t *)vals)[j];
    const int q = vals[qlm_q4_byte(j)] >> qlm_q4_shift(j) & 15;
    return dt == QLM_Q4_0 ? q - 8 : q;
}

/* roundf(v) (halves away from zero) clamped to [lo, hi]; NaN (0/0 from a zero scale) gives 0.
 * Without a call, in two stages a loop can run apart (each alone vectorizes; together GCC leaves
 * them scalar): v is first held to [lo - 1, hi + 1], which changes no result, so the truncating
 * conversion is defined, and v minus its truncation is exact, so the half test is too. */
static inline float qlm_round_clamp_hold(float v, int lo, int hi) {
    v = v == v ? v : 0.0f;
    v = v < (float)(lo - 1) ? (float)(lo - 1) : v;
    return v > (float)(hi + 1) ? (float)(hi + 1) : v;
}

/* The second stage: v as qlm_round_clamp_hold left it. */
static inline int qlm_round_clamp_held(float v, int lo, int hi) {
    int i = (int)v;
    float frac = v - (float)i;
    i += (frac >= 0.5f) - (frac <= -0.5f);
    i = i < lo ? lo : i;
    return i > hi ? hi : i;
}

static inline int qlm_round_clamp(float v, int lo, int hi) {
    return qlm_round_clamp_held(qlm_round_clamp_hold(v, lo, hi), lo, hi);
}

/* Quantizes cols values (a multiple of group) of src into the blocks at dst. */
void qlm_block_quantize_row(void *dst, qlm_dtype dt, int group, const float *src, long cols);
/* Q4_0 blocks from given values: q[cols] in -8..7 and one scale per group (scales[cols / group]),
 * each scale stored as F16 (QAT's learned scales, see qlm_fake_quant_to_int8). */
void qlm_block_pack_q4_0(void *dst, const int8_t *q, const float *scales, int group, long cols);
/* Expands the blocks of cols values at src into dst. */
void qlm_block_dequantize_row(float *dst, qlm_dtype dt, int group, const void *src, long cols);

#endif
