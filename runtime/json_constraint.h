/* Constrained decoding to JSON (OpenAI's response_format): a byte-level pushdown automaton accepts
 * exactly the prefixes of the documents a grammar allows (one JSON object, or a value that a JSON
 * Schema of the supported subset accepts), and before each sampling step it lists the vocabulary
 * tokens whose whole bytes keep the output such a prefix; the others get -inf logits. A grammar
 * is compiled once per request, a vocabulary index once per tokenizer, a matcher (the automaton's
 * state) lives as long as one sequence. */
#ifndef QLM_JSON_CONSTRAINT_H
#define QLM_JSON_CONSTRAINT_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "../tokenizer/tokenizer.h"

typedef struct qlm_json_grammar qlm_json_grammar;
typedef struct qlm_json_vocab qlm_json_vocab;
typedef struct qlm_json_matcher qlm_json_matcher;

/* One JSON object (RFC 8259), any keys and values. Whitespace runs are at most 20 bytes, objects
 * and arrays nest at most 32 deep, a number is at most 32 bytes. */
qlm_json_grammar *qlm_json_grammar_object(void);
/* One value the schema accepts: type (a name or a list), properties (generated in their order;
 * the required ones always, optional ones maybe), required, additionalProperties (false; true,
 * absent or a schema generate no other property when properties are listed, any keys when none
 * are), items, minItems, maxItems, enum and const (any values, matched in their compact form),
 * anyOf; title, description, default, examples, $schema, $id, $comment, $defs are ignored. Any
 * other keyword is refused. NULL with qlm_last_error() naming the keyword and where it is as a
 * JSON pointer ("'pattern' at #/properties/name is not supported"). The schema is untrusted: its
 * depth, size and compiled size are bounded. */
qlm_json_grammar *qlm_json_grammar_schema(const cJSON *schema);
void qlm_json_grammar_free(qlm_json_grammar *g);

/* Token i spells bytes[i][0..lens[i]) (0: never allowed); eog: the end-of-generation ids, allowed
 * once the value is complete. Tokens longer than 255 bytes are never allowed. */
qlm_json_vocab *qlm_json_vocab_new(const char *const *bytes, const int *lens, int n, const int *eog, int n_eog);
/* The index of a tokenizer's vocabulary: each token as it is spelled inside a text (control and
 * unknown tokens spell nothing and are never allowed). */
qlm_json_vocab *qlm_json_vocab_from_tokenizer(const qlm_tokenizer *tok);
/* 0 when every byte that a document of g may need next is a token of its own (printable ASCII,
 * UTF-8 continuation bytes, the bytes of the schema's keys and values), so that a matcher of g
 * always has a token to go on with; else -1 with the first missing byte named. */
int qlm_json_vocab_check(const qlm_json_vocab *v, const qlm_json_grammar *g);
void qlm_json_vocab_free(qlm_json_vocab *v);

/* v may be NULL for a matcher fed bytes only (no masks). */
qlm_json_matcher *qlm_json_matcher_new(const qlm_json_grammar *g, const qlm_json_vocab *v);
void qlm_json_matcher_free(qlm_json_matcher *m);
/* Extends the output by n bytes: 0, or -1 (the state unchanged) when they make it no valid prefix. */
int qlm_json_matcher_feed(qlm_json_matcher *m, const char *bytes, size_t n);
/* Whether feeding these bytes would succeed. */
int qlm_json_matcher_allows(const qlm_json_matcher *m, const char *bytes, size_t n);
/* The output is one whole value: end-of-generation may come. */
int qlm_json_matcher_complete(const qlm_json_matcher *m);
/* Complete, and no byte can extend it (a closed object, unlike a number): generation ends. */
int qlm_json_matcher_done(const qlm_json_matcher *m);
/* The tokens that may come next, bit i of word i / 64 for token i: the vocabulary's tokens whose
 * bytes feed, and its end-of-generation ones when complete. Owned by m until the next call. */
const uint64_t *qlm_json_matcher_allowed(qlm_json_matcher *m);
/* Sets logits[i] to -inf for every token that may not come next (ids past the vocabulary too). 0,
 * or -1 when no token may (a vocabulary that fails qlm_json_vocab_check). */
int qlm_json_matcher_mask(qlm_json_matcher *m, float *logits, int n_logits);

#endif
