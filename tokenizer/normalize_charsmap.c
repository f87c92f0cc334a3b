/* SentencePiece's precompiled normalization rules ("precompiled_charsmap" in a .model file's
 * normalizer_spec, base64 in tokenizer.json's Precompiled normalizer; NFKC plus a few extras for
 * T5's "nmt_nfkc") and the two ways the reference libraries apply them.
 *
 * Layout: a little-endian uint32 T, then T bytes of a Darts-clone double-array trie (32-bit
 * little-endian units), then a pool of NUL-terminated replacement strings. The trie's keys are
 * the UTF-8 sequences to replace; a key's value is the offset of its replacement in the pool.
 * A unit u holds the label of the edge into it in bits 0-7 (bit 31 too, which marks value units,
 * so they never match a byte), a "has a value child" flag in bit 8, and the offset to its
 * children: (u >> 10) << ((u & 0x200) >> 6). From node p, byte c leads to p ^ offset(p) ^ c when
 * that unit's label is c; a flagged node's value unit is at p' ^ offset(p') after the step, and
 * its low 31 bits are the value. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "tokenizer_internal.h"

#define SPM_SPACE "\xE2\x96\x81"
#define REPLACEMENT_CHAR "\xEF\xBF\xBD"

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int tok_charsmap_init(tok_charsmap *m, const void *blob, size_t n) {
    memset(m, 0, sizeof(*m));
    if (n == 0) return 0;
    const unsigned char *b = blob;
    if (n < 4) return qlm_errorf("precompiled_charsmap: %zu bytes, too short for its header", n);
    uint32_t trie = le32(b);
    if (trie < 4 || trie % 4 != 0 || trie > n - 4)
        return qlm_errorf("precompiled_charsmap: trie size %u does not fit in %zu bytes", trie, n);
    size_t pool = n - 4 - trie;
    /* Every replacement ends with a NUL, so one found from any offset lies inside the pool. */
    if (pool > UINT32_MAX || (pool > 0 && b[n - 1] != 0))
        return qlm_errorf("precompiled_charsmap: the replacement strings do not end with a NUL");
    m->blob = malloc(n);
    m->units = malloc(trie);
    if (!m->blob || !m->units) {
        tok_charsmap_free(m);
        return qlm_errorf("precompiled_charsmap: out of memory");
    }
    memcpy(m->blob, b, n);
    m->blob_len = n;
    m->n_units = trie / 4;
    for (uint32_t i = 0; i < m->n_units; i++) m->units[i] = le32(b + 4 + 4 * (size_t)i);
    m->pool = (const char *)m->blob + 4 + trie;
    m->pool_len = (uint32_t)pool;
    return 0;
}

void tok_charsmap_free(tok_charsmap *m) {
    free(m->blob);
    free(m->units);
    memset(m, 0, sizeof(*m));
}

static uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
static uint32_t unit_label(uint32_t u) { return u & (1u << 31 | 0xFFu); }

/* The rule whose key is the shortest (or longest) prefix of s[0, n): its key length, with its
 * replacement in *rep; 0 when no key is a prefix. Steps outside the trie or the pool end the
 * search, so a damaged map never reads out of bounds. */
static size_t find_rule(const tok_charsmap *m, const unsigned char *s, size_t n, int longest, const char **rep) {
    if (m->n_units == 0) return 0;
    size_t found = 0;
    uint32_t p = unit_offset(m->units[0]);
    for (size_t i = 0; i < n; i++) {
        p ^= s[i];
        if (p >= m->n_units || unit_label(m->units[p]) != s[i]) break;
        int has_value = m->units[p] >> 8 & 1;
        p ^= unit_offset(m->units[p]);
        if (!has_value) continue;
        if (p >= m->n_units) break;
        uint32_t value = m->units[p] & 0x7FFFFFFFu;
        if (value >= m->pool_len) break;
        *rep = m->pool + value;
        found = i + 1;
        if (!longest) break;
    }
    return found;
}

/* Appends s to out; with collapse, a space that follows a space is dropped. */
static int put_text(tok_buf *out, const char *s, size_t n, int collapse) {
    if (!collapse) return tok_buf_put(out, s, n);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ' && out->n > 0 && out->p[out->n - 1] == ' ') continue;
        if (tok_buf_put(out, s + i, 1) != 0) return -1;
    }
    return 0;
}

void *tok_grapheme_re(void) {
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR) "\\X", PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_ANCHORED | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
    if (!re) {
        qlm_errorf("tokenizer: the grapheme cluster pattern does not compile (PCRE2 error %d)", err);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return re;
}

void tok_grapheme_re_free(void *re) { pcre2_code_free(re); }

/* Byte length of the extended grapheme cluster at s[i] (1 for an invalid UTF-8 byte, which \X
 * does not match). ASCII followed by ASCII is a cluster of its own unless it is CR LF, which
 * spares most calls. */
static size_t cluster_len(const pcre2_code *re, pcre2_match_data *md, const unsigned char *s, size_t n, size_t i) {
    if (s[i] < 0x80 && (i + 1 == n || (s[i + 1] < 0x80 && !(s[i] == '\r' && s[i + 1] == '\n')))) return 1;
    if (pcre2_match(re, s, n, i, 0, md, NULL) < 0) return (size_t)tok_utf8_len(s + i, n - i);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    return ov[1] > i ? ov[1] - i : 1;
}

/* The character at s (n > 0 bytes available), *clen bytes long: replaced by a rule, kept, or
 * U+FFFD for an invalid byte. */
static int put_char_hf(const tok_charsmap *m, const unsigned char *s, size_t n, int collapse, tok_buf *out,
                       size_t *clen) {
    const char *rep;
    *clen = (size_t)tok_utf8_len(s, n);
    if (find_rule(m, s, *clen, 0, &rep) > 0) return put_text(out, rep, strlen(rep), collapse);
    if (*clen == 1 && s[0] >= 0x80) return put_text(out, REPLACEMENT_CHAR, 3, collapse);
    return put_text(out, (const char *)s, *clen, collapse);
}

int tok_charsmap_normalize_hf(const tok_charsmap *m, void *grapheme_re, const char *s, size_t n, int collapse,
                              tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    out->n = 0;
    if (tok_buf_put(out, "", 0) != 0) return -1;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md) return qlm_errorf("tokenizer: out of memory");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n;) {
        size_t g = cluster_len(grapheme_re, md, u, n, i);
        const char *rep;
        /* tokenizers replaces a whole short cluster by the first rule that matches its start, and
         * maps longer clusters one character at a time. */
        if (g < 6 && find_rule(m, u + i, g, 0, &rep) > 0) {
            rc = put_text(out, rep, strlen(rep), collapse);
            i += g;
            continue;
        }
        size_t clen = 0;
        for (size_t end = i + g; rc == 0 && i < end; i += clen)
            rc = put_char_hf(m, u + i, end - i, collapse, out, &clen);
    }
    pcre2_match_data_free(md);
    return rc;
}

/* The longest rule at s (n > 0): its replacement in *rep / *rep_len; returns the bytes consumed. */
static size_t spm_rule(const tok_charsmap *m, const unsigned char *s, size_t n, const char **rep, size_t *rep_len) {
    size_t k = find_rule(m, s, n, 1, rep);
    if (k > 0) {
        *rep_len = strlen(*rep);
        return k;
    }
    int clen = tok_utf8_len(s, n);
    int bad = clen == 1 && s[0] >= 0x80;
    *rep = bad ? REPLACEMENT_CHAR : (const char *)s;
    *rep_len = bad ? 3 : (size_t)clen;
    return (size_t)clen;
}

int tok_charsmap_normalize_spm(const tok_charsmap *m, const char *s, size_t n, int prefix, int remove_extra,
                               tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    const char *rep;
    size_t rep_len, i = 0;
    out->n = 0;
    if (tok_buf_put(out, "", 0) != 0) return -1;
    /* Leading characters that normalize to exactly one space are dropped. */
    while (remove_extra && i < n) {
        size_t k = spm_rule(m, u + i, n - i, &rep, &rep_len);
        if (rep_len != 1 || rep[0] != ' ') break;
        i += k;
    }
    if (i == n) return 0;
    if (prefix && tok_buf_put(out, SPM_SPACE, 3) != 0) return -1;
    int prev_space = remove_extra;
    while (i < n) {
        i += spm_rule(m, u + i, n - i, &rep, &rep_len);
        /* A replacement's leading spaces go when the text so far ends with one. */
        while (prev_space && rep_len > 0 && rep[0] == ' ') rep++, rep_len--;
        for (size_t k = 0; k < rep_len; k++)
            if (tok_buf_put(out, rep[k] == ' ' ? SPM_SPACE : rep + k, rep[k] == ' ' ? 3 : 1) != 0) return -1;
        if (rep_len > 0) prev_space = rep[rep_len - 1] == ' ';
        if (!remove_extra) prev_space = 0;
    }
    while (remove_extra && out->n >= 3 && memcmp(out->p + out->n - 3, SPM_SPACE, 3) == 0) out->n -= 3;
    out->p[out->n] = 0;
    return 0;
}
