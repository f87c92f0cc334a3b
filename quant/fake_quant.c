/* LSQ fake quantization (see fake_quant.h for the formulas and how they follow torch's kernels).
 *
 * Non-finite inputs: +-Inf clamp to the bounds (and count as outside); NaN propagates to out and,
 * being "inside", to dw and dscale (training that produces NaN should see it, not have it hidden).
 * Determinism: per-tensor backward splits n into FQ_CHUNKS fixed chunks (the split depends only on
 * n), sums each chunk serially in double, then the chunk sums serially; per-row backward sums each
 * row serially. So the result does not depend on the number of threads. */
#include "fake_quant.h"
#include "quantize.h"

#include <math.h>
#include <stddef.h>

/* Elementwise loops below this size run on one thread (OpenMP start-up costs more). */
#define FQ_PARALLEL_MIN 32768L
/* Fixed number of partial sums for the per-tensor scale gradient. */
#define FQ_CHUNKS 64

static void forward_span(float *out, const float *w, long n, float s, float lo, float hi) {
    const float inv = 1.0f / s;
    for (long i = 0; i < n; i++) {
        float q = nearbyintf(w[i] * inv) + 0.0f; /* -0 -> +0: torch goes through int64 */
        if (q < lo) q = lo;
        else if (q > hi) q = hi;
        out[i] = q * s;
    }
}

/* Adds dout to dw where inside; returns the sum (in double) of the float scale-gradient terms. */
static double backward_span(float *dw, const float *dout, const float *w, long n, float s, float lo, float hi,
                            float gf) {
    const float inv = 1.0f / s;
    double sum = 0;
    for (long i = 0; i < n; i++) {
        float q = nearbyintf(w[i] * inv);
        float t;
        if (q < lo) t = dout[i] * lo * gf;
        else if (q > hi) t = dout[i] * hi * gf;
        else {
            if (dw) dw[i] += dout[i];
            /* q*s - w rounded once (torch's kernel is FMA-contracted); exact in double. */
            float d = (float)((double)q * (double)s - (double)w[i]);
            t = dout[i] * d * inv * gf;
        }
        sum += t;
    }
    return sum;
}

void qlm_fake_quant_forward(float *out, const float *w, long n, float scale, int qmin, int qmax) {
    const long chunk = 4096;
    const long nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n >= FQ_PARALLEL_MIN)
    for (long c = 0; c < nchunks; c++) {
        long b = c * chunk, e = b + chunk < n ? b + chunk : n;
        forward_span(out + b, w + b, e - b, scale, (float)qmin, (float)qmax);
    }
}

void qlm_fake_quant_forward_rows(float *out, const float *w, int rows, int cols, const float *scales, int qmin,
                                 int qmax) {
#pragma omp parallel for schedule(static) if ((long)rows * cols >= FQ_PARALLEL_MIN)
    for (int r = 0; r < rows; r++) {
        long o = (long)r * cols;
        forward_span(out + o, w + o, cols, scales[r], (float)qmin, (float)qmax);
    }
}

void qlm_fake_quant_backward(float *dw, float *dscale, const float *dout, const float *w, long n, float scale,
                             int qmin, int qmax, float grad_factor) {
    double part[FQ_CHUNKS];
    const long chunk = (n + FQ_CHUNKS - 1) / FQ_CHUNKS;
#pragma omp parallel for schedule(static) if (n >= FQ_PARALLEL_MIN)
    for (int c = 0; c < FQ_CHUNKS; c++) {
        long b = c * chunk, e = b + chunk < n ? b + chunk : n;
        part[c] = b < e ? backward_span(dw ? dw + b : NULL, dout + b, w + b, e - b, scale, (float)qmin,
                                        (float)qmax, grad_factor)
                        : 0.0;
    }
    if (dscale) {
        double sum = 0;
        for (int c = 0; c < FQ_CHUNKS; c++) sum += part[c];
        *dscale += (float)sum;
    }
}

void qlm_fake_quant_backward_rows(float *dw, float *dscales, const float *dout, const float *w, int rows, int cols,
                                  const float *scales, int qmin, int qmax, float grad_factor) {
#pragma omp parallel for schedule(static) if ((long)rows * cols >= FQ_PARALLEL_MIN)
    for (int r = 0; r < rows; r++) {
        long o = (long)r * cols;
        double sum = backward_span(dw ? dw + o : NULL, dout + o, w + o, cols, scales[r], (float)qmin, (float)qmax,
                                   grad_factor);
        if (dscales) dscales[r] += (float)sum;
    }
}

float qlm_lsq_grad_factor(long n, int qmax) {
    /* torch: grad_factor = 1.0 / (X.numel() * self.quant_max) ** 0.5 in Python floats (double),
     * passed to a kernel that takes a float. */
    return (float)(1.0 / sqrt((double)n * (double)qmax));
}

static float init_scale(float absmax, int qmax) {
    float s = absmax / (float)qmax;
    return s >= QLM_FAKE_QUANT_MIN_SCALE ? s : QLM_FAKE_QUANT_MIN_SCALE;
}

/* Candidate scales the MSE initialisation tries, from max|w| / qmax down to half of it. */
#define FQ_MSE_STEPS 32

float qlm_fake_quant_init_scale(const float *w, long n, int qmax) {
    float m = 0;
#pragma omp parallel for reduction(max : m) schedule(static) if (n >= FQ_PARALLEL_MIN)
    for (long c = 0; c < (n + 4095) / 4096; c++) {
        long b = c * 4096, e = b + 4096 < n ? b + 4096 : n;
        float a = qlm_absmax_finite(w + b, e - b);
        if (a > m) m = a;
    }
    return init_scale(m, qmax);
}

void qlm_fake_quant_init_scales_rows(float *scales, const float *w, int rows, int cols, int qmax) {
#pragma omp parallel for schedule(static) if ((long)rows * cols >= FQ_PARALLEL_MIN)
    for (int r = 0; r < rows; r++) scales[r] = init_scale(qlm_absmax_finite(w + (long)r * cols, cols), qmax);
}

/* Squared error of fake-quantizing the n values of w with scale s. */
static double fake_quant_sq_error(const float *w, long n, float s, int qmin, int qmax) {
    double e = 0;
    const float inv = 1.0f / s;
    for (long k = 0; k < n; k++) {
        float q = nearbyintf(w[k] * inv);
        q = q < (float)qmin ? (float)qmin : q > (float)qmax ? (float)qmax : q;
        double d = (double)(q * s) - (double)w[k];
        e += isfinite(w[k]) ? d * d : 0;
    }
    return e;
}

void qlm_fake_quant_init_scales_mse_rows(float *scales, const float *w, int rows, int cols, int qmin, int qmax) {
#pragma omp parallel for schedule(static) if ((long)rows * cols >= FQ_PARALLEL_MIN)
    for (int r = 0; r < rows; r++) {
        const float *row = w + (long)r * cols, top = init_scale(qlm_absmax_finite(row, cols), qmax);
        float best = top;
        double best_err = fake_quant_sq_error(row, cols, top, qmin, qmax);
        for (int f = 1; f < FQ_MSE_STEPS; f++) {
            float s = top * (1.0f - 0.5f * (float)f / FQ_MSE_STEPS);
            if (!(s >= QLM_FAKE_QUANT_MIN_SCALE)) break;
            double err = fake_quant_sq_error(row, cols, s, qmin, qmax);
            if (err < best_err) best = s, best_err = err;
        }
        scales[r] = best;
    }
}

void qlm_fake_quant_clamp_scales(float *scales, long n) {
    for (long i = 0; i < n; i++)
        if (!(scales[i] >= QLM_FAKE_QUANT_MIN_SCALE)) scales[i] = QLM_FAKE_QUANT_MIN_SCALE;
}

void qlm_fake_quant_to_int8(int8_t *q, const float *w, int rows, int cols, const float *scales, int per_row, int qmin,
                            int qmax) {
#pragma omp parallel for if ((long)rows * cols > 65536)
    for (int r = 0; r < rows; r++) {
        float inv = 1.0f / scales[per_row ? r : 0];
        for (int c = 0; c < cols; c++) {
            float v = nearbyintf(w[(size_t)r * cols + c] * inv);
            q[(size_t)r * cols + c] = (int8_t)(v < qmin ? qmin : v > qmax ? qmax : v == v ? v : 0);
        }
    }
}
