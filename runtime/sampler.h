/* Next-token choice: logit bias, repetition / presence / frequency penalties, then greedy
 * (temperature 0) or temperature, top-k, min-p and top-p (nucleus) sampling with a seeded
 * generator. */
#ifndef QLM_SAMPLER_H
#define QLM_SAMPLER_H

#include <stdint.h>

/* An additive bias on one token's logit (OpenAI's logit_bias). */
typedef struct {
    int token;
    float bias; /* -100..100; -100 in practice bans the token */
} qlm_logit_bias;

typedef struct {
    float temperature;    /* 0: greedy */
    int top_k;            /* 0: all tokens */
    float top_p;          /* 1: no nucleus cut */
    float repeat_penalty; /* 1: none; >1 divides positive / multiplies negative logits of recent tokens */
    int repeat_last_n;    /* how many recent tokens the penalties look at */
    /* OpenAI's: logit -= frequency_penalty * count + presence_penalty * (count > 0), counts over the
     * tokens generated so far (the prompt's are not counted); 0: none. */
    float presence_penalty, frequency_penalty;
    float min_p;          /* 0: none; else tokens below min_p times the likeliest one's probability go */
    const qlm_logit_bias *logit_bias; /* n_logit_bias entries (the sampler keeps its own copy) */
    int n_logit_bias;
    uint64_t seed;
} qlm_sampling;

/* Defaults: temperature 0.7, top_k 40, top_p 0.9, repeat_penalty 1, last_n 64, seed 0 (= from time). */
qlm_sampling qlm_sampling_defaults(void);
/* Checks ranges; names the flag in the message. */
int qlm_sampling_validate(const qlm_sampling *s);

typedef struct {
    qlm_sampling p;
    uint64_t rng;
    int vocab;
    int *idx;     /* scratch: candidate ids */
    float *prob;  /* scratch: candidate probabilities */
    int *count;   /* scratch: occurrences per token in the recent window (zero between calls) */
    qlm_logit_bias *bias; /* p.logit_bias, copied */
} qlm_sampler;

/* Fails (message naming the token) on a logit_bias token outside the vocabulary. */
int qlm_sampler_init(qlm_sampler *s, const qlm_sampling *p, int vocab);
void qlm_sampler_free(qlm_sampler *s);
/* Picks a token from logits[vocab] (modified in place). history: tokens so far, of which the last
 * n_generated are the model's own (what presence and frequency penalties count). */
int qlm_sampler_sample(qlm_sampler *s, float *logits, const int *history, int n_history, int n_generated);
/* Index of the largest logit (first on ties). */
int qlm_argmax(const float *x, int n);

#endif
