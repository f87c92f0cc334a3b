/* A generation session: one sequence, its KV cache, and the tokens in it. Prompts are
 * prefilled in batches; new tokens are sampled and streamed as text through a callback;
 * generation stops on an end-of-generation token, a stop string, max_new_tokens, or a
 * full context. Later turns reuse the cached prefix. With an encoder-decoder (T5) the
 * prompt is the encoder's input and the tokens are the decoder's, from its start token. */
#ifndef QLM_GENERATE_H
#define QLM_GENERATE_H

#include <stddef.h>

#include "../models/model.h"
#include "../models/t5.h"
#include "sampler.h"
#include "../tokenizer/tokenizer.h"

enum { QLM_MAX_TOP_LOGPROBS = 20 };

typedef struct {
    int id;
    float logprob;
} qlm_token_logprob;

/* Receives each generated token's log-probability under the model (the log-softmax of the raw
 * logits, before temperature, penalties and filters) and the n_top most likely tokens', most
 * likely first. EOS, which ends the output, is not reported. */
typedef void (*qlm_logprob_fn)(void *user, qlm_token_logprob chosen, const qlm_token_logprob *top, int n_top);

typedef struct {
    qlm_sampling sampling;
    int max_new_tokens;
    const char *const *stop; /* stop strings (not included in the output) */
    int n_stop;
    int *out_ids; /* NULL, or room for max_new_tokens generated ids (EOS not included) */
    qlm_logprob_fn on_logprob; /* NULL: no log-probabilities */
    void *logprob_user;
    int top_logprobs;          /* alternatives reported per token, 0..QLM_MAX_TOP_LOGPROBS */
    /* NULL, or the output is one JSON value this grammar accepts (json_constraint.h): before each
     * sampling step the tokens that would leave it get -inf logits, and once the value is complete
     * and nothing can extend it the output ends (QLM_STOP_COMPLETE). json_vocab: the tokenizer's
     * tokens indexed for the masks. */
    const struct qlm_json_grammar *json;
    const struct qlm_json_vocab *json_vocab;
} qlm_gen_params;

typedef enum {
    QLM_STOP_EOS,
    QLM_STOP_STRING,
    QLM_STOP_LENGTH,
    QLM_STOP_CONTEXT,
    QLM_STOP_CALLER,
    QLM_STOP_COMPLETE, /* the JSON value the output is held to is complete */
} qlm_stop_reason;

typedef struct {
    int n_prompt;      /* prompt tokens evaluated (after prefix reuse) */
    int n_generated;
    qlm_stop_reason reason;
    double prefill_seconds, decode_seconds;
    double constraint_seconds; /* of decode_seconds, spent on JSON token masks */
} qlm_gen_stats;

/* Receives generated text as it is produced; return non-zero to stop. */
typedef int (*qlm_emit_fn)(void *user, const char *text, size_t len);

typedef struct {
    const qlm_model *model;   /* decoder-only, or */
    const qlm_t5_model *t5;   /* encoder-decoder */
    const qlm_tokenizer *tok;
    qlm_kv_state state;
    qlm_t5_state t5_state;
    int *input;               /* T5: the encoded input */
    int n_input;
    int *tokens; /* tokens whose keys/values are in the cache */
    int n_tokens;
    float *logits; /* logits after the last evaluated token */
    int have_logits;
} qlm_session;

int qlm_session_init(qlm_session *s, const qlm_model *m, const qlm_tokenizer *tok, int ctx, int max_batch);
/* An encoder-decoder session for inputs of up to max_input and outputs of up to max_output tokens. */
int qlm_session_init_t5(qlm_session *s, const qlm_t5_model *m, const qlm_tokenizer *tok, int max_input,
                        int max_output);
void qlm_session_free(qlm_session *s);
/* The LoRA adapter (lora/lora.h; NULL: none) the next tokens use. A change empties the cache, whose
 * keys and values the old adapter produced; nothing is allocated or reloaded. */
void qlm_session_set_adapter(qlm_session *s, const struct qlm_lora_adapter *a);

/* Makes the cache hold exactly ids[0..n): keeps the longest common prefix, evaluates the rest.
 * T5: encodes ids as the input (unless it is the one already encoded) and restarts the decoder. */
int qlm_session_sync(qlm_session *s, const int *ids, int n, qlm_gen_stats *stats);
/* Samples up to p->max_new_tokens tokens after the current ones, streaming text to emit. */
int qlm_session_generate(qlm_session *s, const qlm_gen_params *p, qlm_emit_fn emit, void *user,
                         qlm_gen_stats *stats);
const char *qlm_stop_reason_name(qlm_stop_reason r);

#endif
