/* Quantization-aware training (QAT) with learned scales (LSQ, Esser et al. 2020): symmetric INT8
 * fake quantization, zero point 0, computed as PyTorch's _LearnableFakeQuantize computes it
 * (torch._fake_quantize_learnable_per_tensor_affine / _per_channel_affine on the CPU; checked bit
 * for bit against torch 2.15 by tools/make_qat_fixtures.py and tests/test_fake_quant.c).
 *
 * Weights stay F32 ("latent"); with inv = 1.0f / s (a float, as torch does; x * inv is not always
 * x / s) and q = nearbyintf(w * inv) (round half to even):
 *   forward   out = clamp(q, qmin, qmax) * s     (a zero comes out as +0, as torch's int64 round trip)
 *   inside    qmin <= q <= qmax  (q is the ROUNDED value: w * inv may reach qmax + 0.5 exclusive,
 *             and qmax + 0.5 itself rounds to even, so e.g. -128.5 is inside for qmin = -128)
 *   dw        += dout                                   when inside, else nothing (STE)
 *   dscale    += sum of gf * dout * (q*s - w) * inv     when inside (q*s - w rounded once, as
 *                                                       torch's FMA-contracted kernel computes it)
 *                        gf * dout * qmin or qmax       when q < qmin or q > qmax
 * that is, inside, d out / d s = q - w / s. The dscale terms are float products as in torch; their
 * sum is taken in double in a fixed order (fixed chunks / rows), so it is bit-identical from run to
 * run whatever the thread count, and within float summation error of torch's float sum.
 *
 * Scales must be finite and > 0; training keeps them >= QLM_FAKE_QUANT_MIN_SCALE (torch clamps its
 * learned scale to float32 eps before every forward: qlm_fake_quant_clamp_scales). out may alias w. */
#ifndef QLM_FAKE_QUANT_H
#define QLM_FAKE_QUANT_H

#include <float.h>
#include <stdint.h>

/* The smallest scale: torch.finfo(torch.float32).eps, the floor torch's observers and
 * _LearnableFakeQuantize put under a scale. */
#define QLM_FAKE_QUANT_MIN_SCALE FLT_EPSILON

/* One scale for all n values. */
void qlm_fake_quant_forward(float *out, const float *w, long n, float scale, int qmin, int qmax);
/* Per-row scales: w is [rows][cols], scales[rows] (torch's per-channel with axis 0). */
void qlm_fake_quant_forward_rows(float *out, const float *w, int rows, int cols, const float *scales, int qmin,
                                 int qmax);

/* Backward of qlm_fake_quant_forward for upstream gradient dout[n]: accumulates (+=) into dw[n] and
 * *dscale (see the formulas above), so several uses of one latent tensor add up. dw may be NULL
 * (scale gradient only), as may dscale (weight gradient only). */
void qlm_fake_quant_backward(float *dw, float *dscale, const float *dout, const float *w, long n, float scale,
                             int qmin, int qmax, float grad_factor);
/* Per-row backward: dscales[r] accumulates row r's terms. dw or dscales may be NULL. */
void qlm_fake_quant_backward_rows(float *dw, float *dscales, const float *dout, const float *w, int rows, int cols,
                                  const float *scales, int qmin, int qmax, float grad_factor);

/* LSQ's gradient factor as _LearnableFakeQuantize(use_grad_scaling=True) computes it:
 * (float)(1.0 / sqrt(n * qmax)) in double, where n is the number of values in the WHOLE tensor,
 * per-tensor and per-channel alike (torch uses X.numel(), not the values per channel). */
float qlm_lsq_grad_factor(long n, int qmax);

/* The starting scale for QAT: max|w| / qmax over the finite values (QAT starts from post-training
 * quantization), floored at QLM_FAKE_QUANT_MIN_SCALE, so an all-zero (or all non-finite, or
 * vanishingly small) tensor gets FLT_EPSILON, never 0. */
float qlm_fake_quant_init_scale(const float *w, long n, int qmax);
/* The same per row: fills scales[rows]. */
void qlm_fake_quant_init_scales_rows(float *scales, const float *w, int rows, int cols, int qmax);

/* The INT8 values a fake-quantized tensor stands for: q = clamp(round(w * (1/s)), qmin, qmax) with
 * the forward's rounding, so q * s equals qlm_fake_quant_forward's output exactly (the INT8 model
 * computes what QAT trained). Per tensor (scales[0]) or per row (scales[rows]). */
void qlm_fake_quant_to_int8(int8_t *q, const float *w, int rows, int cols, const float *scales, int per_row, int qmin,
                            int qmax);

/* The starting scales for 4-bit groups, per row of cols values: of max|w| / qmax and 31 steps down
 * to half of it, the one whose fake quantization has the least squared error. With 16 levels,
 * max|w| / qmax wastes qmin's level and often most of the others (its model started 0.02 nats
 * behind Q4_0's post-training rounding; the least-error scale starts ahead of it). */
void qlm_fake_quant_init_scales_mse_rows(float *scales, const float *w, int rows, int cols, int qmin, int qmax);

/* Clamps n learned scales to >= QLM_FAKE_QUANT_MIN_SCALE (a NaN scale becomes the floor too), as
 * torch does before each forward; call after every optimizer step. */
void qlm_fake_quant_clamp_scales(float *scales, long n);

#endif
