/* Scalar formulas the training ops compute on every backend: one definition, compiled by the C
 * compiler for the CPU backend and by nvcc for the CUDA one (host and device), so the two cannot
 * drift apart in what they compute. */
#ifndef QLM_TRAIN_FORMULAS_H
#define QLM_TRAIN_FORMULAS_H

#include <math.h>
#include <stdint.h>

#include "backend.h"
#include "host_device.h"

/* act(x) into *value, and act'(x). */
static inline QLM_HD float qlm_act_grad(float x, qlm_act a, float *value) {
    switch (a) {
    case QLM_ACT_GELU_TANH: {
        const float c = 0.7978845608028654f;
        float u = c * (x + 0.044715f * x * x * x), t = tanhf(u);
        *value = 0.5f * x * (1.0f + t);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
    }
    case QLM_ACT_RELU:
        *value = x > 0 ? x : 0;
        return x > 0 ? 1.0f : 0.0f;
    case QLM_ACT_GELU: {
        float cdf = 0.5f * (1.0f + erff(x * 0.7071067811865476f));
        *value = x * cdf;
        return cdf + x * 0.3989422804014327f * expf(-0.5f * x * x);
    }
    default: {
        float s = 1.0f / (1.0f + expf(-x));
        *value = x * s;
        return s * (1.0f + x * (1.0f - s));
    }
    }
}

/* A logit under a soft cap (softcap <= 0: none). */
static inline QLM_HD float qlm_softcapped(float x, float softcap) {
    return softcap > 0 ? softcap * tanhf(x / softcap) : x;
}

/* Cross-entropy's gradient at one logit l (already capped) of a row with max mx, 1 / sum of exp(l -
 * mx) inv and log of that sum log_sum: grad_scale (p - target) through the cap. The target is the
 * teacher's probability exp(log_pt) when there is a teacher (its term of the KL divergence is
 * added to *kl), else 1 at the row's target token (is_target) and 0 elsewhere. */
static inline QLM_HD float qlm_cross_entropy_grad(float l, float mx, float inv, double log_sum, float grad_scale,
                                                  float softcap, int teacher, double log_pt, int is_target,
                                                  double *kl) {
    float g = grad_scale * expf(l - mx) * inv;
    if (teacher) {
        double pt = exp(log_pt);
        *kl += pt * (log_pt - ((double)(l - mx) - log_sum));
        g -= grad_scale * (float)pt;
    } else if (is_target) {
        g -= grad_scale;
    }
    if (softcap > 0) {
        float c = l / softcap; /* tanh of the raw logit over the cap */
        g *= 1.0f - c * c;
    }
    return g;
}

/* splitmix64's finalizer on z in place, written once for a uint64_t and for the vectors of them
 * of the SIMD dropout (quant/kernel_dropout.h). */
#define QLM_MIX64_IN_PLACE(z)                              \
    do {                                                   \
        (z) = ((z) ^ ((z) >> 30)) * 0xbf58476d1ce4e5b9ULL; \
        (z) = ((z) ^ ((z) >> 27)) * 0x94d049bb133111ebULL; \
        (z) ^= (z) >> 31;                                  \
    } while (0)

/* splitmix64's finalizer: a counter-based generator, so element i's draw needs no state. */
static inline QLM_HD uint64_t qlm_mix64(uint64_t z) {
    QLM_MIX64_IN_PLACE(z);
    return z;
}

/* The step from one element's counter to the next (the golden ratio's fraction of 2^64). */
#define QLM_DROPOUT_STEP 0x9e3779b97f4a7c15ULL

/* Dropout with probability p: the draws below threshold drop. */
static inline QLM_HD uint64_t qlm_dropout_threshold(float p) { return (uint64_t)((double)p * 18446744073709551616.0); }

/* Whether element `index` drops, base = qlm_mix64(seed). */
static inline QLM_HD int qlm_dropout_drops(uint64_t base, long index, uint64_t threshold) {
    return qlm_mix64(base + (uint64_t)index * QLM_DROPOUT_STEP) < threshold;
}

/* One AdamW step's constants, each computed from the double hyper-parameters and rounded to float
 * once, as torch rounds a Python scalar for a float32 tensor (host only: both backends compute
 * them before their loop or launch). */
typedef struct {
    float decay, one_minus_b1, b2, one_minus_b2, step_size, bc2_sqrt, eps, grad_mul;
} qlm_adamw_consts;

/* with_decay 0: a tensor exempt from weight decay (p * 1, its value unchanged). */
static inline qlm_adamw_consts qlm_adamw_constants(const qlm_adamw_step *h, int with_decay) {
    double bc1 = 1.0 - pow(h->beta1, (double)h->step), bc2 = 1.0 - pow(h->beta2, (double)h->step);
    qlm_adamw_consts c = {with_decay ? (float)(1.0 - h->lr * h->weight_decay) : 1.0f,
                          (float)(1.0 - h->beta1), (float)h->beta2, (float)(1.0 - h->beta2), (float)(h->lr / bc1),
                          (float)sqrt(bc2), (float)h->eps, h->grad_mul};
    return c;
}

#endif
