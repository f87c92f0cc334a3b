/* Pre-tokenization: the byte-level families' split regexes (PCRE2, UTF + UCP) and the
 * SentencePiece "▁" rules, each pre-token handed to the BPE merge loop. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "tokenizer_internal.h"

#define SPM_SPACE "\xE2\x96\x81" /* U+2581 "▁" */
#define SPM_SPACE_LEN 3

/* Family regexes as published in the models' tokenizer.json files (HF tokenizers runs them with
 * Oniguruma; PCRE2 with UCP gives the same classes). Invalid UTF-8 never matches; such bytes
 * become pre-tokens of their own. */
static const char RE_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char RE_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                                "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                               "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *qlm_pretokenizer_regex(qlm_pretokenizer pre) {
    switch (pre) {
    case QLM_PRE_LLAMA3: return RE_LLAMA3;
    case QLM_PRE_QWEN2: return RE_QWEN2;
    default: return RE_GPT2;
    }
}

static void *compile(const char *pattern) {
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof(msg));
        qlm_errorf("tokenizer: pre-tokenizer regex does not compile at %zu: %s", (size_t)at, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return re;
}

int tok_pre_init(qlm_tokenizer *t) {
    if (t->type != QLM_TOK_BYTE_BPE) return 0;
    t->re = compile(qlm_pretokenizer_regex(t->pre));
    if (!t->re) return -1;
    if (t->pre == QLM_PRE_SMOLLM && !(t->re_digit = compile("\\p{N}"))) return -1;
    return 0;
}

void tok_pre_free(qlm_tokenizer *t) {
    pcre2_code_free(t->re);
    pcre2_code_free(t->re_digit);
    t->re = t->re_digit = NULL;
}

typedef struct {
    const qlm_tokenizer *t;
    tok_bpe_scratch *s;
    pcre2_match_data *md;
    tok_ids *out;
} pre_ctx;

/* Finds the next match of re in s[from, end): 0, -1 when there is none, -2 on a matcher error. */
static int next_match(pre_ctx *c, const pcre2_code *re, const char *s, size_t end, size_t from, size_t *ms,
                      size_t *me) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, end, from, 0, c->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return -1;
    if (rc < 0) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        qlm_errorf("tokenizer: pre-tokenizer regex failed: %s", (char *)msg);
        return -2;
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    *ms = ov[0], *me = ov[1];
    return 0;
}

/* Applies the family regex to s[from, end): every match is a pre-token, and so is any text
 * between matches (invalid UTF-8). */
static int regex_split(pre_ctx *c, const char *s, size_t from, size_t end) {
    while (from < end) {
        size_t ms = end, me = end;
        int rc = next_match(c, c->t->re, s, end, from, &ms, &me);
        if (rc == -2) return -1;
        if (rc == -1) ms = me = end;
        if (me == ms && ms < end) me = ms + (size_t)tok_utf8_len((const unsigned char *)s + ms, end - ms);
        if (ms > from && tok_bpe_word(c->t, c->s, s + from, ms - from, c->out) != 0) return -1;
        if (me > ms && tok_bpe_word(c->t, c->s, s + ms, me - ms, c->out) != 0) return -1;
        from = me;
    }
    return 0;
}

/* SmolLM: every \p{N} character is a pre-token of its own; the text between them goes through
 * the GPT-2 regex separately (so "(?!\S)" sees the digit as the end). */
static int digit_split(pre_ctx *c, const char *s, size_t n) {
    size_t from = 0;
    while (from < n) {
        size_t ms = n, me = n;
        int rc = next_match(c, c->t->re_digit, s, n, from, &ms, &me);
        if (rc == -2) return -1;
        if (rc == -1) ms = me = n;
        if (regex_split(c, s, from, ms) != 0) return -1;
        if (me > ms && tok_bpe_word(c->t, c->s, s + ms, me - ms, c->out) != 0) return -1;
        from = me;
    }
    return 0;
}

int tok_spm_normalize(const char *s, size_t n, int prefix, tok_buf *out) {
    out->n = 0;
    if (prefix && tok_buf_put(out, SPM_SPACE, SPM_SPACE_LEN) != 0) return -1;
    for (size_t i = 0; i < n;) {
        size_t k = i;
        while (k < n && s[k] != ' ') k++;
        if (k > i && tok_buf_put(out, s + i, k - i) != 0) return -1;
        if (k < n && tok_buf_put(out, SPM_SPACE, SPM_SPACE_LEN) != 0) return -1;
        i = k + 1;
    }
    return 0;
}

/* Metaspace split: a new word starts at every "▁". */
static int spm_words(pre_ctx *c, const char *s, size_t n) {
    size_t start = 0;
    for (size_t i = 1; i + SPM_SPACE_LEN <= n; i++) {
        if (memcmp(s + i, SPM_SPACE, SPM_SPACE_LEN) != 0) continue;
        if (tok_bpe_word(c->t, c->s, s + start, i - start, c->out) != 0) return -1;
        start = i;
    }
    return tok_bpe_word(c->t, c->s, s + start, n - start, c->out);
}

static int spm_metaspace(pre_ctx *c, const char *seg, size_t n, int at_start) {
    const qlm_tokenizer *t = c->t;
    int starts_with_space = seg[0] == ' ' || (n >= SPM_SPACE_LEN && memcmp(seg, SPM_SPACE, SPM_SPACE_LEN) == 0);
    int prefix = t->add_space_prefix && (!t->space_prefix_first || at_start) && !starts_with_space;
    tok_buf buf = {0};
    int rc = tok_spm_normalize(seg, n, prefix, &buf);
    if (rc == 0) rc = t->split_words ? spm_words(c, buf.p, buf.n) : tok_bpe_word(t, c->s, buf.p, buf.n, c->out);
    free(buf.p);
    return rc;
}

int tok_pre_encode(const qlm_tokenizer *t, tok_bpe_scratch *s, const char *seg, size_t n, int at_start,
                   tok_ids *out) {
    if (n == 0) return 0;
    pre_ctx c = {t, s, NULL, out};
    if (t->type == QLM_TOK_SPM_BPE)
        return t->spm_metaspace ? spm_metaspace(&c, seg, n, at_start) : tok_bpe_word(t, s, seg, n, out);
    c.md = pcre2_match_data_create(4, NULL);
    if (!c.md) return qlm_errorf("tokenizer: out of memory");
    int rc = t->pre == QLM_PRE_SMOLLM ? digit_split(&c, seg, n) : regex_split(&c, seg, 0, n);
    pcre2_match_data_free(c.md);
    return rc;
}
