#include "perplexity.h"

#include <math.h>
#include <stdlib.h>

#include "../core/error.h"

/* -log softmax(logits)[target], computed stably in double. */
static double token_nll(const float *logits, int vocab, int target) {
    float mx = logits[0];
    for (int i = 1; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    return log(sum) + mx - logits[target];
}

int qlm_score_tokens(const qlm_model *m, qlm_kv_state *state, const int *ids, int n, qlm_nll *acc) {
    int vocab = m->cfg.vocab_size, chunk = state->max_batch;
    float *logits = malloc((size_t)chunk * vocab * sizeof *logits);
    int *pos = malloc((size_t)chunk * sizeof *pos), *rows = malloc((size_t)chunk * sizeof *rows);
    int rc = 0;
    if (!logits || !pos || !rows) {
        rc = qlm_errorf("out of memory for %d x %d logits", chunk, vocab);
        goto out;
    }
    for (int w0 = 0; w0 + 1 < n && rc == 0; w0 += state->max_seq - 1) {
        int wlen = n - w0 < state->max_seq ? n - w0 : state->max_seq;
        for (int c0 = 0; c0 < wlen - 1 && rc == 0; c0 += chunk) {
            int len = wlen - 1 - c0 < chunk ? wlen - 1 - c0 : chunk;
            for (int i = 0; i < len; i++) {
                pos[i] = c0 + i;
                rows[i] = i;
            }
            rc = qlm_forward(m, state, ids + w0 + c0, pos, len, rows, len, logits);
            for (int i = 0; rc == 0 && i < len; i++) {
                acc->nll_sum += token_nll(logits + (size_t)i * vocab, vocab, ids[w0 + c0 + i + 1]);
                acc->n_predicted++;
            }
        }
    }
out:
    free(logits);
    free(pos);
    free(rows);
    return rc;
}
