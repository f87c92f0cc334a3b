/* Symmetric INT8 weight quantization: q = round(w / s) clamped to [-127, 127],
 * s = max|w| / 127 per tensor or per row (output channel).
 * Rounding is half away from zero, so |w - q*s| <= s/2. s is taken over the finite values; an
 * all-zero (or underflowing) tensor or row gets s = 1. NaN quantizes to 0, +-Inf to +-127. */
#ifndef QLM_QUANTIZE_H
#define QLM_QUANTIZE_H

#include <stdint.h>

#include "../core/dtype.h"
#include "../core/weight.h"

/* Per-tensor: one scale for all rows*cols values. Returns the scale. */
float qlm_quantize_i8(int8_t *q, const float *w, long rows, long cols);
/* Per-row: scales[r] for each row. */
void qlm_quantize_i8_rows(int8_t *q, float *scales, const float *w, long rows, long cols);

/* max |w| over the finite values (0 when there are none). */
float qlm_absmax_finite(const float *w, long n);
/* The scale of values whose finite absolute maximum is absmax (1 when that is 0). */
float qlm_i8_scale(float absmax);
/* q[i] = round(w[i] / s) clamped to [-127, 127] for one run of n values. */
void qlm_quantize_i8_run(int8_t *q, const float *w, long n, float s);
/* Converts n F32 values to dtype dst (F32/F16/BF16; not I8). */
void qlm_convert_from_f32(void *dst, qlm_dtype dt, const float *src, long n);
/* Converts row r of w (any dtype; rows in PyTorch's order whatever rope_heads) to F32. */
void qlm_weight_row_f32(const qlm_weight *w, int r, float *out);
/* Converts n values of dtype src (F32/F16/BF16) to F32. */
void qlm_convert_to_f32(float *dst, const void *src, qlm_dtype st, long n);

#endif
