/* Tokenizers: SentencePiece-style BPE with byte fallback (Llama 2, TinyLlama,
 * TinyStories), GPT-2 style byte-level BPE with a regex pre-tokenizer (GPT-2,
 * Llama 3, SmolLM2, Qwen2) and SentencePiece Unigram (T5, FLAN-T5). Built from a
 * qlm_tokenizer_spec that each file format (tokenizer.json, SentencePiece .model,
 * llama2.c tokenizer.bin, GGUF metadata) fills in. */
#ifndef QLM_TOKENIZER_H
#define QLM_TOKENIZER_H

#include <stddef.h>

#include "marked_text.h"

typedef enum {
    QLM_TOK_SPM_BPE = 1,  /* "▁" for spaces, byte fallback <0xNN>, merges by rank or by score */
    QLM_TOK_BYTE_BPE = 2, /* GPT-2 byte-to-unicode alphabet, regex pre-tokenizer, merges by rank */
    QLM_TOK_UNIGRAM = 3,  /* "▁" for spaces, best segmentation by summed piece log-probabilities */
} qlm_tokenizer_type;

/* How the byte-level pre-tokenizer splits text (the regex differs per model family). */
typedef enum {
    QLM_PRE_GPT2 = 0,   /* GPT-2 regex */
    QLM_PRE_LLAMA3 = 1, /* Llama 3 regex (digits in runs of up to 3) */
    QLM_PRE_SMOLLM = 2, /* individual digits, then the GPT-2 regex (SmolLM/SmolLM2) */
    QLM_PRE_QWEN2 = 3,  /* Qwen2 regex: the Llama 3 one with single digits (its NFC step is not applied) */
} qlm_pretokenizer;

/* The split regex of a byte-level family, exactly as its tokenizer.json files publish it (the
 * JSON reader recognises Llama 3 and Qwen2 by it). SmolLM's digit split comes before GPT-2's. */
const char *qlm_pretokenizer_regex(qlm_pretokenizer pre);

/* Token attribute, as GGUF's tokenizer.ggml.token_type values. */
typedef enum {
    QLM_TOKEN_NORMAL = 1,
    QLM_TOKEN_UNKNOWN = 2,
    QLM_TOKEN_CONTROL = 3,      /* special: <s>, </s>, <|im_start|>; matched in text only when parse_special */
    QLM_TOKEN_USER_DEFINED = 4, /* added token that is not special: always matched as a whole */
    QLM_TOKEN_UNUSED = 5,
    QLM_TOKEN_BYTE = 6,         /* <0xNN> byte-fallback piece */
} qlm_token_type;

/* Per-token flags of added tokens (tokenizer.json "added_tokens"). */
enum {
    /* Matched in the normalized text (after the "▁" normalizer) instead of the raw text, as HF
     * tokenizers does for added tokens with "normalized": true; the matched form is the token's
     * content passed through the same normalizer. */
    QLM_ADDED_NORMALIZED = 1,
};

typedef struct {
    qlm_tokenizer_type type;
    int n_vocab;
    const char *const *tokens; /* n_vocab strings, as stored in the file (with ▁ / Ġ alphabets) */
    const float *scores;       /* NULL, or n_vocab scores (SPM: merge priority when merges are absent) */
    const int *token_types;    /* NULL, or n_vocab qlm_token_type values */
    int n_merges;
    const char *const *merges; /* "left right" pairs in rank order; NULL to merge by score. A pair of
                                  pieces that hold spaces is split where both halves and their
                                  join are vocabulary entries */
    qlm_pretokenizer pre;
    int bos_id, eos_id, unk_id, pad_id; /* -1 when absent */
    int add_bos;               /* prepend BOS when encoding with add_special */
    int add_eos;
    int add_space_prefix;      /* SPM: prepend "▁" to each text segment between added tokens (HF's
                                  Prepend normalizer, Llama 2 style); decoding drops one leading space */
    int byte_fallback;         /* SPM: unknown chars become <0xNN> pieces (else unk; dropped when
                                  there is no unk, as byte-level BPE does with bytes it lacks) */
    const char *chat_template; /* Jinja source from tokenizer_config.json / GGUF, or NULL */
    /* Extra end-of-turn ids (e.g. <|im_end|>, <|eot_id|>) that stop generation. When
     * n_extra_eos is 0, control tokens named <|im_end|>, <|eot_id|>, <|eom_id|>, <|end|>,
     * <|endoftext|>, <|end_of_text|> or <end_of_turn> are used. */
    int n_extra_eos;
    const int *extra_eos;
    /* Optional refinements; zero-initialised specs keep the defaults described above. */
    const unsigned char *token_flags; /* NULL, or n_vocab QLM_ADDED_* bit sets */
    int spm_metaspace;      /* SPM: "▁" rules come from a Metaspace pre-tokenizer (applied after
                               added tokens are split; no "▁" added when the text already starts
                               with one) instead of a Prepend/Replace normalizer */
    int space_prefix_first; /* Metaspace prepend_scheme "first": "▁" only before the text segment
                               that starts the input */
    int split_words;        /* Metaspace split: BPE runs on each "▁"-started word separately */
    int fuse_unk;           /* consecutive unknown characters become one unk id (HF fuse_unk) */
    int ignore_merges;      /* a pre-token that is a vocabulary entry is emitted whole without
                               merging (HF ignore_merges, Llama 3) */
    /* Unigram. The "▁" fields above keep their meaning (spm_metaspace, add_space_prefix,
     * space_prefix_first, split_words, fuse_unk, byte_fallback); unk_id is required. */
    const double *piece_scores; /* n_vocab log-probabilities */
    const void *charsmap;       /* SentencePiece precompiled_charsmap (rules applied before the "▁"
                                   rules), or NULL */
    size_t charsmap_len;
    int collapse_spaces;        /* runs of spaces become one after the charsmap (HF Replace " {2,}") */
    int spm_normalizer;         /* as the sentencepiece library rather than HF tokenizers: rules by
                                   longest match instead of per grapheme cluster, one "▁" prefix per
                                   segment (add_space_prefix), only normal pieces matched in text */
    int remove_extra_spaces;    /* spm_normalizer: drop leading, trailing and repeated spaces */
} qlm_tokenizer_spec;

typedef struct qlm_tokenizer qlm_tokenizer;

/* Copies everything it needs from spec. NULL on error (see qlm_last_error()). */
/* Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF), as Python decodes. */
int qlm_utf8_valid(const unsigned char *s, size_t n);

qlm_tokenizer *qlm_tokenizer_build(const qlm_tokenizer_spec *spec);
void qlm_tokenizer_free(qlm_tokenizer *t);

/* Loaders for the file formats. tokenizer_config may be NULL (then looked up beside tokenizer_json). */
qlm_tokenizer *qlm_tokenizer_load_json(const char *tokenizer_json, const char *tokenizer_config);
/* SentencePiece ModelProto (spiece.model, tokenizer.model) of a Unigram model. encode(add_special)
 * appends EOS, as T5's tokenizers do; the text is normalized and segmented as the sentencepiece
 * library does. */
qlm_tokenizer *qlm_tokenizer_load_spiece(const char *path);
/* llama2.c tokenizer.bin; vocab_size from the checkpoint header, or 0 to count the file's tokens. */
qlm_tokenizer *qlm_tokenizer_load_llama2c(const char *path, int vocab_size);

/* Encodes UTF-8 text. add_special: prepend BOS (and append EOS) as the tokenizer is configured.
 * parse_special: special tokens written in the text ("<|im_start|>") become their ids.
 * On success *ids is malloc'd (caller frees) and *n_ids set. */
int qlm_tokenizer_encode(const qlm_tokenizer *t, const char *text, size_t len, int add_special,
                         int parse_special, int **ids, int *n_ids);
/* Encodes with special tokens parsed except where they overlap text's untrusted ranges (what a
 * chat message or a dialogue says): there "<|im_end|>" is text like any other. */
int qlm_tokenizer_encode_marked(const qlm_tokenizer *t, const qlm_marked_text *text, int add_special, int **ids,
                                int *n_ids);

/* Decodes ids to UTF-8 (skipping control and unknown tokens when skip_special). *out malloc'd and
 * NUL-terminated. SPM and Unigram tokenizers with a space prefix drop one leading space of the
 * whole output, as HF's Strip and Metaspace decoders do; Unigram ones from a SentencePiece model
 * drop the leading space of every token until one adds text, as sentencepiece does. Byte pieces
 * are emitted as raw bytes (HF would turn an invalid UTF-8 run into U+FFFD). */
int qlm_tokenizer_decode(const qlm_tokenizer *t, const int *ids, int n_ids, int skip_special,
                         char **out, size_t *out_len);

/* Streaming: bytes that token `id` adds when it follows token `prev` (-1 at start), written to buf.
 * Control and unknown tokens add nothing. SPM tokenizers with a space prefix drop the leading
 * space of a token that follows -1 or BOS. Byte pieces give single bytes. The pieces of a
 * sequence concatenate to decode(skip_special=1) whenever BOS appears only at its start (and, for
 * Unigram ones from a SentencePiece model, the sequence does not start with a lone "▁").
 * Returns the byte count (which may be a partial UTF-8 sequence), or -1 if cap is too small or
 * id is out of range. */
int qlm_tokenizer_piece(const qlm_tokenizer *t, int prev, int id, char *buf, int cap);

/* The raw vocabulary string of id (as stored), or NULL if out of range. */
const char *qlm_tokenizer_token(const qlm_tokenizer *t, int id);
int qlm_tokenizer_vocab_size(const qlm_tokenizer *t);
int qlm_tokenizer_bos(const qlm_tokenizer *t);
int qlm_tokenizer_eos(const qlm_tokenizer *t);
/* True if id ends generation (EOS or one of the extra end-of-turn ids). */
int qlm_tokenizer_is_eog(const qlm_tokenizer *t, int id);
/* Id of an exact vocabulary string, or -1. */
int qlm_tokenizer_find(const qlm_tokenizer *t, const char *token);
/* Jinja source of the chat template, or NULL. */
const char *qlm_tokenizer_chat_template(const qlm_tokenizer *t);
/* True if decode(encode(x)) == x for all valid UTF-8 text encoded without special handling
 * (add_special = parse_special = 0): byte-level BPE and SPM byte fallback covering every byte
 * that UTF-8 uses, and no Metaspace prefix rule (which loses a leading space). */
int qlm_tokenizer_is_lossless(const qlm_tokenizer *t);
/* Writes tokenizer.json and tokenizer_config.json into dir (atomically) so HF tokenizers and qlm
 * load the same vocabulary, merges, special tokens and chat template. */
int qlm_tokenizer_save_json(const qlm_tokenizer *t, const char *dir);
/* Sets/overrides the chat template (copied). */
int qlm_tokenizer_set_chat_template(qlm_tokenizer *t, const char *tmpl);

#endif
