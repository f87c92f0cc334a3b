/* The sampler against the distributions its parameters define: softmax at a temperature, top-k,
 * min-p and top-p cuts, and the logit bias and penalties applied to the logits first (OpenAI's and
 * HF's formulas, checked on the values they must leave). */
#include <math.h>

#include "../core/error.h"
#include "../runtime/sampler.h"
#include "test_util.h"

static qlm_sampling plain(void) {
    qlm_sampling p = qlm_sampling_defaults();
    p.temperature = 1.0f, p.top_k = 0, p.top_p = 1.0f, p.seed = 42;
    return p;
}

/* Frequencies of each of the 4 tokens over n draws from logits (fresh copies each draw). */
static void frequencies(const qlm_sampling *p, const float *logits, int n, double freq[4]) {
    qlm_sampler s;
    assert_int_equal(qlm_sampler_init(&s, p, 4), 0);
    int hits[4] = {0};
    for (int i = 0; i < n; i++) {
        float l[4] = {logits[0], logits[1], logits[2], logits[3]};
        hits[qlm_sampler_sample(&s, l, NULL, 0, 0)]++;
    }
    for (int k = 0; k < 4; k++) freq[k] = (double)hits[k] / n;
    qlm_sampler_free(&s);
}

static void test_distributions(void **state) {
    (void)state;
    const float logits[4] = {1.0f, 0.5f, 0.0f, -1.0f};
    double z = exp(1) + exp(0.5) + 1 + exp(-1), want[4] = {exp(1) / z, exp(0.5) / z, 1 / z, exp(-1) / z}, f[4];
    qlm_sampling p = plain();
    frequencies(&p, logits, 40000, f);
    for (int k = 0; k < 4; k++) assert_true(fabs(f[k] - want[k]) < 0.01);
    /* temperature 0.5 doubles the logits */
    p.temperature = 0.5f;
    double z2 = exp(2) + exp(1) + 1 + exp(-2);
    frequencies(&p, logits, 40000, f);
    assert_true(fabs(f[0] - exp(2) / z2) < 0.01 && fabs(f[3] - exp(-2) / z2) < 0.005);
    /* top-k 2: the two likeliest, renormalized */
    p = plain(), p.top_k = 2;
    frequencies(&p, logits, 40000, f);
    assert_true(fabs(f[0] - want[0] / (want[0] + want[1])) < 0.01 && f[2] == 0 && f[3] == 0);
    /* min-p 0.5: tokens below half the likeliest's probability (0.43) go: 0.61 of 1's 0.61 stays */
    p = plain(), p.min_p = 0.5f;
    frequencies(&p, logits, 40000, f);
    assert_true(fabs(f[0] - want[0] / (want[0] + want[1])) < 0.01 && f[2] == 0 && f[3] == 0);
    p.min_p = 0.7f; /* token 1 is at 0.61 of token 0 */
    frequencies(&p, logits, 2000, f);
    assert_true(f[0] == 1.0);
    /* top-p 0.8: the smallest prefix by probability reaching it (0.43 + 0.26 + 0.16 > 0.8) */
    p = plain(), p.top_p = 0.8f;
    frequencies(&p, logits, 40000, f);
    assert_true(f[3] == 0 && fabs(f[0] - want[0] / (want[0] + want[1] + want[2])) < 0.01);
}

static void test_bias_and_penalties(void **state) {
    (void)state;
    qlm_sampling p = plain();
    p.temperature = 0;
    qlm_logit_bias bias[] = {{2, 5.0f}, {0, -100.0f}};
    p.logit_bias = bias, p.n_logit_bias = 2;
    p.presence_penalty = 0.5f, p.frequency_penalty = 0.25f;
    qlm_sampler s;
    assert_int_equal(qlm_sampler_init(&s, &p, 4), 0);
    float l[4] = {1, 1, 1, 1};
    const int hist[] = {1, 3, 3, 1, 1}; /* a prompt of 2 tokens, then 3, 1, 1 generated */
    assert_int_equal(qlm_sampler_sample(&s, l, hist, 5, 3), 2);
    assert_true(l[0] == 1 - 100.0f && l[2] == 6.0f);
    assert_true(l[1] == 1 - (0.25f * 2 + 0.5f)); /* twice among the generated (the prompt's does not count) */
    assert_true(l[3] == 1 - (0.25f * 1 + 0.5f));
    /* the counts are left zero: a second call penalizes the same way */
    float l2[4] = {1, 1, 1, 1};
    qlm_sampler_sample(&s, l2, hist, 5, 3);
    assert_memory_equal(l, l2, sizeof l);
    qlm_sampler_free(&s);
    /* a biased token outside the vocabulary, and values out of range, are refused by name */
    qlm_logit_bias far[] = {{4, 1.0f}};
    p.logit_bias = far, p.n_logit_bias = 1;
    assert_int_equal(qlm_sampler_init(&s, &p, 4), -1);
    assert_non_null(strstr(qlm_last_error(), "token 4 is outside the vocabulary"));
    qlm_sampling bad = plain();
    bad.min_p = 1.5f;
    assert_int_equal(qlm_sampling_validate(&bad), -1);
    assert_non_null(strstr(qlm_last_error(), "--min-p"));
    bad = plain(), bad.presence_penalty = 3;
    assert_int_equal(qlm_sampling_validate(&bad), -1);
    bad = plain(), bad.logit_bias = bias, bad.n_logit_bias = 1, bias[0].bias = 101;
    assert_int_equal(qlm_sampling_validate(&bad), -1);
    assert_non_null(strstr(qlm_last_error(), "logit_bias of token 2"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_bias_and_penalties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
