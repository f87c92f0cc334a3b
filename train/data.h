/* Training data for `qlm train`: JSONL examples turned into token ids with a per-token target mask,
 * an eval split, a seeded per-epoch order with a resumable cursor, and optional packing.
 *
 * Input lines (one JSON object per non-blank line; every line must be valid, or the load fails with
 * "FILE:LINE: ..."):
 *   {"prompt": P, "completion": C}
 *       ids = [BOS] + encode(P) + encode(C) + [EOS]. BOS only when the tokenizer has one and adds it
 *       when encoding with special tokens; EOS only when it has one. P and C are encoded separately
 *       (so the context is exactly the tokens `qlm generate` feeds for prompt P, trailing space
 *       included), without special-token parsing ("<|im_end|>" in the text stays text). Tokenizers
 *       that prepend "▁" to encoded text (SentencePiece style: Llama 2, TinyLlama) drop one leading
 *       space of C, which that "▁" stands for (" Paris." -> "▁Paris", "."). Targets: the tokens of
 *       C and the EOS.
 *   {"messages": [{"role": "system"|"user"|"assistant", "content": S}, ...]}
 *       The conversation rendered with the tokenizer's chat template (qlm_chat_render; its plain
 *       fallback when there is none) and encoded as `qlm chat` encodes prompts (no added specials,
 *       special tokens parsed: BOS appears only where the template writes it). At least one
 *       assistant message. Targets: for each assistant message i, the tokens between
 *         A_i = encode(render(messages[0..i), add_generation_prompt=1))  and
 *         B_i = encode(render(messages[0..i], add_generation_prompt=0))
 *       located in F = encode(render(all messages, 0)): the span F[a, b) where a = the length of the
 *       common prefix of A_i and F, b = the length of the common prefix of B_i and F. That is the
 *       assistant content and the template's end of turn ("<|im_end|>\n", "</s>\n", " </s>",
 *       "<|eot_id|>", "\n" in the plain fallback; TinyLlama's tokenizer writes Zephyr's "</s>\n" as
 *       "</s>", "▁", "<0x0A>"). The rendered texts must be prefixes of the full text, else the line
 *       is an error (e.g. a ChatML conversation that opens with an assistant message, where the
 *       default system prompt comes first). When a token straddles a boundary (A_i or B_i not a token prefix of
 *       F), the differing token counts as a target: at the start a = the first differing position;
 *       at the end b = the first differing position + 1, so no assistant byte is ever left out.
 *   template mode (options.target_field set): each line is an object with string fields; the prompt
 *       is options.prompt_template (QLM_SUMMARY_TEMPLATE, the DialogSum lab's zero-shot prompt, when
 *       NULL) with every {name} replaced by the line's string field `name` (a missing field is an
 *       error; "{" not followed by name characters and "}" is literal), the target the line's
 *       target_field. options.chat = 0: treated as {"prompt","completion"}. options.chat = 1: as
 *       {"messages": [{"user", prompt}, {"assistant", target}]}.
 *
 * Truncation to seq_len tokens: the tokens before the first target are the prompt part (in a
 * multi-turn conversation, later user turns are not part of it and are only lost by the right cut). Tokens are
 * dropped from the left of the prompt part (a leading BOS is kept; at least one token always stays
 * before the first target) until the example fits; if it is still too long it is cut at the right
 * (targets lost). Such examples are counted in n_truncated. Examples left without targets are
 * dropped and counted in n_skipped.
 *
 * Invalid UTF-8, NUL bytes and "\u0000" escapes are errors; the file is read line by line. */
#ifndef QLM_TRAIN_DATA_H
#define QLM_TRAIN_DATA_H

#include <stdint.h>

#include "../tokenizer/tokenizer.h"

typedef struct {
    int *ids;              /* len token ids */
    unsigned char *target; /* len flags: 1 = ids[t] is predicted (from position t-1); target[0] = 0 */
    int len, n_targets;
    int line;              /* 1-based line of the source file */
    int truncated;         /* 1 if it was cut to seq_len */
} qlm_train_example;

typedef struct {
    qlm_train_example *ex;
    int n;
    long total_tokens, target_tokens; /* sums over ex */
    int n_truncated;                  /* examples of this set that were truncated */
    int n_skipped;                    /* lines of this set's file dropped for having no targets (the
                                         train set counts those of the shared file when eval is split
                                         from it) */
} qlm_train_set;

typedef struct {
    int seq_len;                 /* >= 2: longest example (and packed sequence) */
    const char *prompt_template; /* template mode: prompt with {field} placeholders (NULL: QLM_SUMMARY_TEMPLATE) */
    const char *target_field;    /* template mode on when set, e.g. "summary" */
    int chat;                    /* template mode: render prompt/target as a user/assistant exchange */
    double eval_fraction;        /* 0..0.5; used when eval_path is NULL */
    uint64_t seed;               /* for the eval split */
} qlm_train_data_options;

/* Loads path into *train. eval may be NULL; otherwise it receives the examples of eval_path when
 * given, else the last round(n * eval_fraction) examples (at least 1 when the fraction is > 0) of a
 * seeded shuffle of path's examples (qlm_train_order(n, seed, -1)); both sets keep file order. With
 * neither, *eval is empty. Errors: "FILE:LINE: ..." for bad lines, an empty file (no examples),
 * every example skipped, or too few examples to split. On failure both sets are left empty. */
int qlm_train_data_load(qlm_train_set *train, qlm_train_set *eval, const char *path, const char *eval_path,
                        const qlm_tokenizer *tok, const qlm_train_data_options *o);
void qlm_train_set_free(qlm_train_set *s);

/* The order of epoch `epoch`: perm[0..n) a Fisher-Yates shuffle of 0..n-1 driven by splitmix64 seeded
 * from (seed, epoch); the same on every platform. */
void qlm_train_order(int n, uint64_t seed, int epoch, int *perm);

/* Position in the data stream; plain integers so checkpoints can store and restore it. Start with
 * {seed, 0, 0}. index is the next position within epoch's order (0..n-1). */
typedef struct {
    uint64_t seed;
    int epoch;
    int index;
} qlm_train_cursor;

/* Writes the next B example indices (of a set of n) into idx and advances c, continuing into the
 * next epoch's order when one ends. Returns 0, or -1 when n < 1, B < 1 or c is out of range. */
int qlm_train_next_batch(qlm_train_cursor *c, int n, int B, int *idx);

/* Packing: the next sequence made of consecutive examples of the epoch order, concatenated while
 * the total stays <= seq_len (an example is never split; one that does not fit starts the next
 * sequence; a sequence never spans two epochs). ids and target need room for seq_len entries; each
 * example keeps its own mask, so target is 0 at every example's first token. Returns the length
 * (> 0) and sets *n_examples when not NULL, or -1 (empty set, or an example longer than seq_len). */
int qlm_train_next_packed(qlm_train_cursor *c, const qlm_train_set *s, int seq_len, int *ids, unsigned char *target,
                          int *n_examples);
/* How many packed sequences epoch `epoch` of cursor seed makes (for steps per epoch), or -1. */
int qlm_train_packed_count(const qlm_train_set *s, uint64_t seed, int epoch, int seq_len);

#endif
