/* Continuous batching: many independent requests decoded together on one model. Each request
 * takes a free slot (its own KV cache region), is prefilled on its own, then joins the decode
 * step, where one forward pass computes the next token of every active slot, reading the
 * weights once for all of them. A finished request frees its slot at once for the next one. A
 * decoder-only prompt that starts like one already evaluated (16 tokens or more, same adapter)
 * copies that prefix's keys and values from the slot that holds them instead of evaluating it. */
#ifndef QLM_BATCH_H
#define QLM_BATCH_H

#include "generate.h"

typedef struct {
    const int *ids; /* the prompt (T5: the encoder's input); valid until the request is done */
    int n_ids;
    const qlm_gen_params *params;
    const struct qlm_lora_adapter *adapter; /* NULL: none; requests with different adapters share steps */
    /* NULL, or receives the text as it is produced (stop strings held back, as in a session);
     * returning non-zero cancels the request, which then ends with QLM_STOP_CALLER and frees its
     * slot at once. */
    qlm_emit_fn emit;
    void *emit_user;
    /* NULL, or receives (with params->logprob_user, and params->top_logprobs alternatives) the
     * log-probability of each prompt token after the first given the ones before it, in order,
     * before any generated token's. The prompt is then evaluated whole and alone when admitted,
     * every row's logits kept (no prefix copied: its rows would have none). Decoder-only: a T5
     * request with it fails the run. */
    qlm_logprob_fn on_prompt_logprob;
    void *user;
} qlm_batch_request;

/* Fills *req with the next request: 1, or 0 when there are none now (the run ends once the
 * active ones finish; a server calls qlm_batch_run again when more arrive), or -1 on error. */
typedef int (*qlm_batch_next_fn)(void *ctx, qlm_batch_request *req);
/* A finished request, with all its text (stop strings removed); non-zero aborts the run. */
typedef int (*qlm_batch_done_fn)(void *ctx, const qlm_batch_request *req, const char *text, size_t len,
                                 const qlm_gen_stats *stats);

typedef struct {
    const qlm_model *model;   /* decoder-only, or */
    const qlm_t5_model *t5;   /* encoder-decoder */
    const qlm_tokenizer *tok;
    int n_slots;              /* requests decoded together */
    int max_prompt;           /* longest prompt (T5: input) a slot takes */
    int max_output;           /* most tokens a request generates */
    /* Evaluate every prompt whole, never copying a shared prefix: each request then gets exactly
     * what it gets alone, whatever else shares the batch (a copied prefix of another length can
     * change the rounding of the rest). */
    int no_prefix_reuse;
} qlm_batch_config;

typedef struct {
    int requests;
    long prompt_tokens, generated_tokens;
    long reused_tokens;       /* prompt tokens whose keys and values were copied from an earlier prompt's */
    long steps;               /* decode forward passes */
    double seconds;
} qlm_batch_stats;

/* Runs until no request is active and next() has none: qlm_batch_new + qlm_batch_drain + free. */
int qlm_batch_run(const qlm_batch_config *cfg, qlm_batch_next_fn next, qlm_batch_done_fn done, void *ctx,
                  qlm_batch_stats *stats);

/* The slots and caches of cfg allocated once, for a caller that drains requests in bursts (a
 * server), so no burst allocates. A failed drain drops the requests it held; the batch stays usable. */
typedef struct qlm_batch qlm_batch;
qlm_batch *qlm_batch_new(const qlm_batch_config *cfg);
void qlm_batch_free(qlm_batch *b);
int qlm_batch_drain(qlm_batch *b, qlm_batch_next_fn next, qlm_batch_done_fn done, void *ctx, qlm_batch_stats *stats);

#endif
