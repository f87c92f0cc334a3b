/* What happens to each sampled token of one sequence, shared by a single session and the
 * batch scheduler: sampling, the end-of-generation and length checks, detokenizing into text,
 * holding back text that could be the start of a stop string, and streaming the rest. */
#ifndef QLM_TOKEN_STREAM_H
#define QLM_TOKEN_STREAM_H

#include <stddef.h>

#include "generate.h"

typedef struct {
    const qlm_tokenizer *tok; /* NULL: ids only, no text */
    const qlm_gen_params *p;
    qlm_emit_fn emit;
    void *user;
    qlm_gen_stats *stats;
    qlm_sampler sampler;
    char *held; /* text not emitted yet */
    size_t len, cap;
    int prev;   /* the previous token, for how the next piece is spelled (-1: start of text) */
    int caller_stop;
    int vocab;
    float *raw; /* the logits as the model gave them, kept for log-probabilities (NULL: none asked) */
    struct qlm_json_matcher *json; /* p->json's automaton over the output so far (NULL: free text) */
} qlm_token_stream;

/* prev: the token before the first generated one (-1 when the output starts text). Resets
 * stats' generated count and reason. */
int qlm_token_stream_init(qlm_token_stream *ts, const qlm_tokenizer *tok, const qlm_gen_params *p, int vocab, int prev,
                          qlm_emit_fn emit, void *user, qlm_gen_stats *stats);
/* Samples the next token from logits (history: the sequence so far, for penalties; logits may be
 * modified: with p->json, the tokens that would leave the JSON value get -inf). Returns 0 with *id
 * when the sequence goes on (feed *id to the model), 1 when it has ended (stats->reason says why),
 * -1 on error. */
int qlm_token_stream_next(qlm_token_stream *ts, float *logits, const int *history, int n_history, int *id);
/* Token id's log-probability under logits (their log-softmax) into *chosen, and the n_top most
 * likely tokens' (at most QLM_MAX_TOP_LOGPROBS and vocab, most likely first, ties by lower id) into
 * top; returns how many that is. */
int qlm_logprobs(const float *logits, int vocab, int id, int n_top, qlm_token_logprob *chosen, qlm_token_logprob *top);
/* Emits the text still held back (unless a stop string ended the sequence) and frees. */
void qlm_token_stream_finish(qlm_token_stream *ts);

#endif
