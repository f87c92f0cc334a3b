/* The integer forms of x that integer weights multiply: I16 (one scale per row of x; what I8
 * weights meet on the CPU and in the GPU's GEMV) and I8 (one scale per run of a block type's
 * values). One definition of their scale for both backends. */
#ifndef QLM_X_INT_FORM_H
#define QLM_X_INT_FORM_H

#include <float.h>
#include <math.h>

#include "../core/host_device.h"

/* Largest |q| of the I16 form and of the I8 form: symmetric, so -q is always representable. */
#define QLM_I16_MAX 32767.0f
/* Largest |q| of the I24 form (one scale per row, three planes of bytes): the dy of an INT8
 * weight's backward on AMX, whose rows (softmax probabilities at the LM head) span more than 16
 * bits' worth of magnitudes. 2^23 - 2, not - 1: the largest |x| times inv = qmax / max|x|, both
 * rounded to F32, may come out up to one above qmax at this size, and q must stay below 2^23 (its
 * top byte signed). */
#define QLM_I24_MAX 8388606.0f
#define QLM_X8_MAX 127.0f

/* The scale s = max|x| / qmax of an integer form (I16: qmax QLM_I16_MAX per row; I8: QLM_X8_MAX
 * per run) of values whose largest magnitude is absmax (NaN if they hold a NaN or infinity, so
 * that their products are NaN as with F32 x), and in *inv the factor that maps x to
 * q = round(x * inv); *inv = 0 (all q = 0) for values that are not finite or whose largest
 * magnitude is below 1e-30 (their products, under 1e-30 |w|, are dropped). */
static inline QLM_HD float qlm_x_int_scale(float absmax, int has_nan, float qmax, float *inv) {
    if (has_nan || !(absmax <= FLT_MAX)) {
        *inv = 0;
        return NAN;
    }
    if (absmax < 1e-30f) {
        *inv = 0;
        return 0;
    }
    *inv = qmax / absmax;
    return absmax / qmax;
}

#endif
