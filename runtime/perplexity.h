/* Mean negative log-likelihood of token sequences under a model. */
#ifndef QLM_PERPLEXITY_H
#define QLM_PERPLEXITY_H

#include "../models/model.h"

typedef struct {
    double nll_sum;   /* nats */
    long n_predicted; /* tokens scored */
} qlm_nll;

/* Scores ids[1..n) given their prefixes, in windows of at most state->max_seq tokens that each
 * start from an empty cache (the first token of a window is context only). Adds into acc. */
int qlm_score_tokens(const qlm_model *m, qlm_kv_state *state, const int *ids, int n, qlm_nll *acc);

#endif
