#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "../core/error.h"

qlm_sampling qlm_sampling_defaults(void) {
    return (qlm_sampling){.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .repeat_penalty = 1.0f,
                          .repeat_last_n = 64, .seed = 0};
}

int qlm_sampling_validate(const qlm_sampling *s) {
    if (!(s->temperature >= 0) || s->temperature > 100) return qlm_errorf("--temp must be in [0, 100]");
    if (s->top_k < 0) return qlm_errorf("--top-k must be >= 0");
    if (!(s->top_p > 0) || s->top_p > 1) return qlm_errorf("--top-p must be in (0, 1]");
    if (!(s->repeat_penalty > 0) || s->repeat_penalty > 100) return qlm_errorf("--repeat-penalty must be in (0, 100]");
    if (s->repeat_last_n < 0) return qlm_errorf("--repeat-last-n must be >= 0");
    if (!(fabsf(s->presence_penalty) <= 2)) return qlm_errorf("--presence-penalty must be in [-2, 2]");
    if (!(fabsf(s->frequency_penalty) <= 2)) return qlm_errorf("--frequency-penalty must be in [-2, 2]");
    if (!(s->min_p >= 0) || s->min_p > 1) return qlm_errorf("--min-p must be in [0, 1]");
    for (int i = 0; i < s->n_logit_bias; i++)
        if (!(fabsf(s->logit_bias[i].bias) <= 100))
            return qlm_errorf("logit_bias of token %d must be in [-100, 100]", s->logit_bias[i].token);
    return 0;
}

/* xorshift64* */
static uint32_t next_u32(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1DULL) >> 32);
}

static float next_f32(uint64_t *state) { return (float)(next_u32(state) >> 8) / 16777216.0f; }

int qlm_sampler_init(qlm_sampler *s, const qlm_sampling *p, int vocab) {
    s->p = *p;
    s->vocab = vocab;
    s->rng = p->seed ? p->seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    s->prob = malloc((size_t)vocab * sizeof *s->prob);
    s->count = calloc((size_t)vocab, sizeof *s->count);
    s->bias = malloc((size_t)(p->n_logit_bias > 0 ? p->n_logit_bias : 1) * sizeof *s->bias);
    if (!s->idx || !s->prob || !s->count || !s->bias) {
        qlm_sampler_free(s);
        return qlm_errorf("out of memory");
    }
    for (int i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= vocab) {
            int t = p->logit_bias[i].token;
            qlm_sampler_free(s);
            return qlm_errorf("logit_bias: token %d is outside the vocabulary (0..%d)", t, vocab - 1);
        }
        s->bias[i] = p->logit_bias[i];
    }
    s->p.logit_bias = s->bias;
    return 0;
}

void qlm_sampler_free(qlm_sampler *s) {
    free(s->idx);
    free(s->prob);
    free(s->count);
    free(s->bias);
    s->idx = NULL;
    s->prob = NULL;
    s->count = NULL;
    s->bias = NULL;
}

/* Running maxima qlm_argmax keeps side by side: one compare-and-select chain over n elements is
 * latency-bound, and greedy decoding of a batch runs it over every row's vocabulary each step. */
#define ARGMAX_LANES 8

int qlm_argmax(const float *x, int n) {
    if (n <= 0) return 0;
    float m[ARGMAX_LANES];
    int at[ARGMAX_LANES];
    for (int j = 0; j < ARGMAX_LANES; j++) m[j] = x[0], at[j] = 0;
    int i = 1;
    for (; i + ARGMAX_LANES <= n; i += ARGMAX_LANES)
        for (int j = 0; j < ARGMAX_LANES; j++)
            if (x[i + j] > m[j]) m[j] = x[i + j], at[j] = i + j;
    int best = 0;
    for (int j = 0; j < ARGMAX_LANES; j++)
        if (m[j] > x[best] || (m[j] == x[best] && at[j] < best)) best = at[j];
    for (; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* OpenAI's presence and frequency penalties over the generated tokens hist[start..n), counted in
 * s->count (which is left zero again). */
static void apply_presence_frequency(qlm_sampler *s, float *logits, const int *hist, int n, int start) {
    const qlm_sampling *p = &s->p;
    if (p->presence_penalty == 0 && p->frequency_penalty == 0) return;
    for (int i = start; i < n; i++)
        if (hist[i] >= 0 && hist[i] < s->vocab) s->count[hist[i]]++;
    for (int i = start; i < n; i++) {
        int t = hist[i];
        if (t < 0 || t >= s->vocab || s->count[t] == 0) continue;
        logits[t] -= p->frequency_penalty * (float)s->count[t] + p->presence_penalty;
        s->count[t] = 0; /* each token once */
    }
}

static void apply_repeat_penalty(float *logits, int vocab, const int *hist, int n, const qlm_sampling *p) {
    if (p->repeat_penalty == 1.0f || p->repeat_last_n == 0) return;
    int start = n > p->repeat_last_n ? n - p->repeat_last_n : 0;
    /* A token repeated in the window is penalized once, as in HF's processor. */
    for (int i = start; i < n; i++) {
        int t = hist[i], seen = 0;
        if (t < 0 || t >= vocab) continue;
        for (int j = start; j < i && !seen; j++) seen = hist[j] == t;
        if (seen) continue;
        logits[t] = logits[t] > 0 ? logits[t] / p->repeat_penalty : logits[t] * p->repeat_penalty;
    }
}

/* Sorts candidates by descending probability (idx/prob kept in step). */
static void sort_desc(int *idx, float *prob, int n) {
    for (int gap = n / 2; gap > 0; gap /= 2)
        for (int i = gap; i < n; i++) {
            float pv = prob[i];
            int iv = idx[i], j = i;
            for (; j >= gap && prob[j - gap] < pv; j -= gap) {
                prob[j] = prob[j - gap];
                idx[j] = idx[j - gap];
            }
            prob[j] = pv;
            idx[j] = iv;
        }
}

/* Keeps the k largest logits as candidates (partial selection with a min-heap). */
static int select_top_k(const float *logits, int vocab, int k, int *idx, float *val) {
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        if (n < k) {
            int c = n++;
            while (c > 0 && val[(c - 1) / 2] > v) {
                val[c] = val[(c - 1) / 2];
                idx[c] = idx[(c - 1) / 2];
                c = (c - 1) / 2;
            }
            val[c] = v;
            idx[c] = i;
        } else if (v > val[0]) {
            int c = 0;
            for (;;) {
                int l = 2 * c + 1, r = l + 1, m = c;
                float mv = v;
                if (l < k && val[l] < mv) m = l, mv = val[l];
                if (r < k && val[r] < mv) m = r, mv = val[r];
                if (m == c) break;
                val[c] = val[m];
                idx[c] = idx[m];
                c = m;
            }
            val[c] = v;
            idx[c] = i;
        }
    }
    return n;
}

int qlm_sampler_sample(qlm_sampler *s, float *logits, const int *history, int n_history, int n_generated) {
    const qlm_sampling *p = &s->p;
    for (int i = 0; i < p->n_logit_bias; i++) logits[p->logit_bias[i].token] += p->logit_bias[i].bias;
    apply_repeat_penalty(logits, s->vocab, history, n_history, p);
    apply_presence_frequency(s, logits, history, n_history,
                             n_generated < n_history ? n_history - (n_generated > 0 ? n_generated : 0) : 0);
    if (p->temperature == 0.0f) return qlm_argmax(logits, s->vocab);
    int n;
    if (p->top_k > 0 && p->top_k < s->vocab) {
        n = select_top_k(logits, s->vocab, p->top_k, s->idx, s->prob);
    } else {
        n = s->vocab;
        for (int i = 0; i < n; i++) {
            s->idx[i] = i;
            s->prob[i] = logits[i];
        }
    }
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (s->prob[i] > mx) mx = s->prob[i];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        s->prob[i] = expf((s->prob[i] - mx) / p->temperature);
        sum += s->prob[i];
    }
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (p->min_p > 0) {
        /* the likeliest candidate has e^0 before normalizing: its probability is 1 / sum */
        float floor_p = p->min_p * (float)(1.0 / sum), kept = 0;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (s->prob[i] >= floor_p) {
                s->idx[m] = s->idx[i];
                s->prob[m++] = s->prob[i];
                kept += s->prob[i];
            }
        n = m;
        for (int i = 0; i < n; i++) s->prob[i] /= kept;
    }
    if (p->top_p < 1.0f) {
        /* Tokens below (1-p)/(n-1) can never be in the nucleus; drop them before sorting. */
        float cutoff = n > 1 ? (1.0f - p->top_p) / (float)(n - 1) : 0;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (s->prob[i] >= cutoff) {
                s->idx[m] = s->idx[i];
                s->prob[m++] = s->prob[i];
            }
        if (m == 0) m = n;
        n = m;
        sort_desc(s->idx, s->prob, n);
        float cum = 0;
        int last = n - 1;
        for (int i = 0; i < n; i++) {
            cum += s->prob[i];
            if (cum > p->top_p) {
                last = i;
                break;
            }
        }
        n = last + 1;
        sum = cum;
        if (sum <= 0) sum = 1;
    } else {
        sum = 1.0;
    }
    float r = next_f32(&s->rng) * (float)sum, acc = 0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (s->prob[i] > 0) last = i;
        acc += s->prob[i];
        if (r < acc) return s->idx[i];
    }
    /* r is past the total as floats add it up: the last candidate that can be picked at all, never
     * one of probability 0 (a token masked to -inf). */
    return s->idx[last];
}
