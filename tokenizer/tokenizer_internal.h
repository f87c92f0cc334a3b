/* Private to the tokenizer sources (tokenizer.c, tokenizer_encode.c, tokenizer_bpe.c,
 * tokenizer_unigram.c, normalize_charsmap.c, pretokenize.c, utf8.c): the tokenizer object and the
 * helpers they share. */
#ifndef QLM_TOKENIZER_INTERNAL_H
#define QLM_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

/* Growable id list. */
typedef struct {
    int *v;
    int n, cap;
} tok_ids;
int tok_ids_push(tok_ids *a, int id);

/* Growable byte buffer. */
typedef struct {
    char *p;
    size_t n, cap;
} tok_buf;
int tok_buf_put(tok_buf *b, const void *data, size_t n);

/* Open-addressing map from vocabulary strings to ids (first id wins on duplicates). */
typedef struct {
    int32_t *slots; /* id, or -1 when empty */
    uint32_t mask;
} tok_strmap;

/* Open-addressing map from an id pair to its merge rank and merged id. */
typedef struct {
    uint64_t *keys; /* (left << 32 | right) + 1; 0 when empty */
    int32_t *rank;
    int32_t *merged;
    uint32_t mask;
} tok_pairmap;

/* An added token as matched in text: by its content, or its normalized form. */
typedef struct {
    const char *pat;
    uint32_t len;
    int id;
    int special;
} tok_added;

/* Added tokens bucketed by first byte, longest first within a bucket. */
typedef struct {
    tok_added *items;
    int n;
    int first[257]; /* items[first[b] .. first[b+1]) start with byte b */
    char *arena;    /* normalized patterns */
} tok_added_set;

/* A SentencePiece precompiled_charsmap: normalization rules in a Darts double-array trie. */
typedef struct {
    unsigned char *blob; /* the serialized map as read (kept for writing it back) */
    size_t blob_len;
    uint32_t *units;     /* trie units, host order */
    uint32_t n_units;
    const char *pool;    /* NUL-terminated replacement strings, inside blob */
    uint32_t pool_len;
} tok_charsmap;

/* Unigram model: piece scores, a byte trie of the pieces that text can match, normalization. */
typedef struct {
    double *scores;
    double unk_score;     /* lowest piece score minus 10, for characters no piece covers */
    int32_t *node_id;     /* trie node -> id of the piece ending there, or -1 */
    uint64_t *edge_keys;  /* (node << 8 | byte) + 1, 0 when empty */
    int32_t *edge_child;
    uint32_t edge_mask;
    tok_charsmap map;
    void *grapheme_re;    /* pcre2_code *: \X, for applying the map per grapheme cluster */
    int collapse_spaces, spm_normalizer, remove_extra_spaces;
} tok_unigram;

struct qlm_tokenizer {
    qlm_tokenizer_type type;
    qlm_pretokenizer pre;
    int n_vocab;
    char *text;        /* all token strings, NUL-terminated */
    uint32_t *off;     /* token id -> offset in text */
    uint32_t *len;     /* token id -> byte length */
    char *dec;         /* bytes each token decodes to */
    uint32_t *dec_off;
    uint32_t *dec_len;
    float *scores;     /* NULL when merging by rank */
    unsigned char *types;
    tok_strmap vocab;
    tok_pairmap merges;
    int n_merges;
    int bos, eos, unk, pad;
    int add_bos, add_eos;
    int add_space_prefix, spm_metaspace, space_prefix_first, split_words;
    int byte_fallback, fuse_unk, ignore_merges;
    int byte_ids[256]; /* SPM: id of <0xNN>; byte-level: id of the byte's alphabet character */
    tok_added_set raw_added;  /* matched in the input text */
    tok_added_set norm_added; /* matched after normalization */
    int *eog;
    int n_eog;
    char *chat_template;
    void *re;       /* pcre2_code *: the family's pre-tokenizer regex (byte-level only) */
    void *re_digit; /* pcre2_code *: \p{N} for the SmolLM digit split */
    tok_unigram *uni; /* Unigram only */
};

static inline const char *tok_str(const qlm_tokenizer *t, int id) { return t->text + t->off[id]; }

/* utf8.c */
/* Length of the UTF-8 sequence at s (n bytes available): 1-4, or 1 for an invalid byte. */
int tok_utf8_len(const unsigned char *s, size_t n);
/* Bytes at the end of s[0..n) that start a UTF-8 sequence the next bytes may complete (0..3). */
size_t tok_utf8_partial_tail(const unsigned char *s, size_t n);
/* Writes the UTF-8 form of cp (< 0x110000) to out; returns its length. */
int tok_utf8_put(uint32_t cp, char *out);
/* Decodes the valid sequence at s of length len. */
uint32_t tok_utf8_cp(const unsigned char *s, int len);
/* GPT-2 byte-level alphabet: the code point that stands for byte b. */
uint32_t tok_byte_to_cp(unsigned char b);
/* Inverse of tok_byte_to_cp, or -1 if cp stands for no byte. */
int tok_cp_to_byte(uint32_t cp);

/* tokenizer_bpe.c */
int tok_strmap_build(tok_strmap *m, const qlm_tokenizer *t);
void tok_strmap_free(tok_strmap *m);
int tok_vocab_find(const qlm_tokenizer *t, const char *s, size_t n);
int tok_merges_build(qlm_tokenizer *t, const char *const *merges, int n_merges);
void tok_pairmap_free(tok_pairmap *m);

/* Reusable scratch space for tok_bpe_word. */
typedef struct {
    void *sym;
    int sym_cap;
    void *heap;
    int heap_cap;
    tok_buf mapped;
} tok_bpe_scratch;
void tok_bpe_scratch_free(tok_bpe_scratch *s);
/* BPE-encodes one pre-token (SPM: normalized text with "▁"; byte-level: raw bytes), appending
 * the ids to out. */
int tok_bpe_word(const qlm_tokenizer *t, tok_bpe_scratch *s, const char *w, size_t n, tok_ids *out);

/* pretokenize.c */
int tok_pre_init(qlm_tokenizer *t);
void tok_pre_free(qlm_tokenizer *t);
/* Splits one text segment (no added tokens inside) into pre-tokens and BPE-encodes each.
 * at_start: the segment begins the input (Metaspace prepend_scheme "first"). */
int tok_pre_encode(const qlm_tokenizer *t, tok_bpe_scratch *s, const char *seg, size_t n, int at_start,
                   tok_ids *out);
/* SPM "▁" normalization of a segment: optional "▁" prefix, spaces to "▁". */
int tok_spm_normalize(const char *s, size_t n, int prefix, tok_buf *out);

/* normalize_charsmap.c */
/* Checks and copies a serialized charsmap (empty: no rules). */
int tok_charsmap_init(tok_charsmap *m, const void *blob, size_t n);
void tok_charsmap_free(tok_charsmap *m);
/* \X compiled for tok_charsmap_normalize_hf (pcre2_code *), or NULL with the error set. */
void *tok_grapheme_re(void);
void tok_grapheme_re_free(void *re);
/* HF tokenizers' Precompiled normalizer: each grapheme cluster shorter than 6 bytes that starts
 * with a rule's key is replaced by that (shortest) rule's string, other clusters character by
 * character; runs of spaces then become one when collapse. Invalid UTF-8 bytes become U+FFFD. */
int tok_charsmap_normalize_hf(const tok_charsmap *m, void *grapheme_re, const char *s, size_t n, int collapse,
                              tok_buf *out);
/* The sentencepiece normalizer: the longest rule at each position; with remove_extra, no leading,
 * trailing or repeated spaces; one "▁" first when prefix; spaces become "▁". Invalid UTF-8 bytes
 * become U+FFFD. */
int tok_charsmap_normalize_spm(const tok_charsmap *m, const char *s, size_t n, int prefix, int remove_extra,
                               tok_buf *out);

/* tokenizer_unigram.c */
int tok_unigram_build(qlm_tokenizer *t, const qlm_tokenizer_spec *spec);
void tok_unigram_free(qlm_tokenizer *t);
/* Normalizes one text segment (no added tokens inside) into out. */
int tok_unigram_normalize(const qlm_tokenizer *t, const char *s, size_t n, tok_buf *out);

/* Reusable scratch space for tok_unigram_encode. */
typedef struct {
    double *score;
    int32_t *start, *id, *path;
    size_t cap;
    tok_buf word;
} tok_unigram_scratch;
void tok_unigram_scratch_free(tok_unigram_scratch *s);
/* Encodes a normalized segment: the Metaspace rules (unless spm_normalizer) and the best
 * segmentation of each word. at_start: the segment begins the input. */
int tok_unigram_encode(const qlm_tokenizer *t, tok_unigram_scratch *s, const char *seg, size_t n, int at_start,
                       tok_ids *out);

/* tokenizer_encode.c */
int tok_added_build(qlm_tokenizer *t, const unsigned char *flags);
void tok_added_free(tok_added_set *a);

#endif
