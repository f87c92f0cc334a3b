/* SentencePiece Unigram (T5): a text segment is normalized (charsmap rules, space rules), cut
 * into words at each "▁" when the Metaspace pre-tokenizer says so, and each word is split into
 * the pieces whose summed log-probabilities are highest (Viterbi over a byte trie of the pieces).
 * A character that no single-character piece covers is unknown and scores the lowest piece score
 * minus 10; adjacent unknowns become one unk id (or byte pieces with byte fallback). Ties go to
 * the segmentation whose last piece starts first, as in both reference libraries. */
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "tokenizer_internal.h"

#define SPM_SPACE "\xE2\x96\x81"
#define SPM_SPACE_LEN 3
#define UNK_PENALTY 10.0

/* ---- piece trie: nodes are numbered, edges live in a hash map keyed by (node, byte) ---- */

static uint64_t edge_key(int32_t node, unsigned char b) { return ((uint64_t)(uint32_t)node << 8 | b) + 1; }

static uint32_t edge_hash(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(key ^ key >> 29);
}

static int32_t edge_find(const tok_unigram *u, int32_t node, unsigned char b) {
    uint64_t key = edge_key(node, b);
    for (uint32_t h = edge_hash(key) & u->edge_mask; u->edge_keys[h]; h = (h + 1) & u->edge_mask)
        if (u->edge_keys[h] == key) return u->edge_child[h];
    return -1;
}

/* Pieces that text can produce: every piece for tokenizers; for sentencepiece only normal ones
 * (control, unknown, byte and unused pieces are never matched, and user-defined ones are split
 * out as added tokens before). */
static int matchable(const qlm_tokenizer *t, int id) {
    return t->len[id] > 0 && (!t->uni->spm_normalizer || t->types[id] == QLM_TOKEN_NORMAL);
}

static int build_trie(qlm_tokenizer *t) {
    tok_unigram *u = t->uni;
    size_t bytes = 0;
    for (int id = 0; id < t->n_vocab; id++)
        if (matchable(t, id)) bytes += t->len[id];
    if (bytes >= INT32_MAX / 4) return qlm_errorf("tokenizer: Unigram pieces too long");
    uint32_t cap = 16;
    while (cap < bytes * 2) cap <<= 1;
    u->node_id = malloc(sizeof(int32_t) * (bytes + 1));
    u->edge_keys = calloc(cap, sizeof(uint64_t));
    u->edge_child = malloc(sizeof(int32_t) * cap);
    if (!u->node_id || !u->edge_keys || !u->edge_child) return qlm_errorf("tokenizer: out of memory for the pieces");
    u->edge_mask = cap - 1;
    u->node_id[0] = -1;
    int32_t n_nodes = 1;
    for (int id = 0; id < t->n_vocab; id++) {
        if (!matchable(t, id)) continue;
        const unsigned char *s = (const unsigned char *)tok_str(t, id);
        int32_t node = 0;
        for (uint32_t i = 0; i < t->len[id]; i++) {
            int32_t next = edge_find(u, node, s[i]);
            if (next < 0) {
                uint64_t key = edge_key(node, s[i]);
                uint32_t h = edge_hash(key) & u->edge_mask;
                while (u->edge_keys[h]) h = (h + 1) & u->edge_mask;
                u->edge_keys[h] = key;
                u->edge_child[h] = next = n_nodes;
                u->node_id[n_nodes++] = -1;
            }
            node = next;
        }
        if (u->node_id[node] < 0) u->node_id[node] = id; /* a repeated piece keeps its first id */
    }
    return 0;
}

int tok_unigram_build(qlm_tokenizer *t, const qlm_tokenizer_spec *spec) {
    tok_unigram *u = t->uni = calloc(1, sizeof(tok_unigram));
    if (!u) return qlm_errorf("tokenizer: out of memory");
    u->collapse_spaces = spec->collapse_spaces;
    u->spm_normalizer = spec->spm_normalizer;
    u->remove_extra_spaces = spec->remove_extra_spaces;
    u->scores = malloc(sizeof(double) * (size_t)t->n_vocab);
    if (!u->scores) return qlm_errorf("tokenizer: out of memory");
    memcpy(u->scores, spec->piece_scores, sizeof(double) * (size_t)t->n_vocab);
    /* The unknown score: tokenizers takes the minimum over all pieces, sentencepiece over normal
     * pieces. */
    double min = 0;
    int seen = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        if (u->spm_normalizer && t->types[id] != QLM_TOKEN_NORMAL) continue;
        if (!seen || u->scores[id] < min) min = u->scores[id];
        seen = 1;
    }
    u->unk_score = min - UNK_PENALTY;
    if (tok_charsmap_init(&u->map, spec->charsmap, spec->charsmap ? spec->charsmap_len : 0) != 0) return -1;
    if (!u->spm_normalizer && !(u->grapheme_re = tok_grapheme_re())) return -1;
    return build_trie(t);
}

void tok_unigram_free(qlm_tokenizer *t) {
    tok_unigram *u = t->uni;
    if (!u) return;
    free(u->scores);
    free(u->node_id);
    free(u->edge_keys);
    free(u->edge_child);
    tok_charsmap_free(&u->map);
    tok_grapheme_re_free(u->grapheme_re);
    free(u);
    t->uni = NULL;
}

int tok_unigram_normalize(const qlm_tokenizer *t, const char *s, size_t n, tok_buf *out) {
    const tok_unigram *u = t->uni;
    if (u->spm_normalizer)
        return tok_charsmap_normalize_spm(&u->map, s, n, t->add_space_prefix, u->remove_extra_spaces, out);
    return tok_charsmap_normalize_hf(&u->map, u->grapheme_re, s, n, u->collapse_spaces, out);
}

/* ---- Viterbi ---- */

void tok_unigram_scratch_free(tok_unigram_scratch *s) {
    free(s->score);
    free(s->start);
    free(s->id);
    free(s->path);
    free(s->word.p);
    memset(s, 0, sizeof(*s));
}

static int ensure_lattice(tok_unigram_scratch *s, size_t n) {
    if (s->cap > n) return 0;
    size_t cap = n + 1 > 64 ? n + 1 : 64;
    double *score = realloc(s->score, sizeof(double) * cap);
    if (score) s->score = score;
    int32_t *start = realloc(s->start, sizeof(int32_t) * cap);
    if (start) s->start = start;
    int32_t *id = realloc(s->id, sizeof(int32_t) * cap);
    if (id) s->id = id;
    int32_t *path = realloc(s->path, sizeof(int32_t) * cap);
    if (path) s->path = path;
    if (!score || !start || !id || !path) return qlm_errorf("tokenizer: out of memory");
    s->cap = cap;
    return 0;
}

/* The best path to end can come from a piece [start, end): kept when it scores strictly higher,
 * so among equal paths the first one found (the earliest start) stays. */
static void relax(tok_unigram_scratch *s, size_t start, size_t end, int32_t id, double score) {
    double total = s->score[start] + score;
    if (s->start[end] < 0 || total > s->score[end]) {
        s->score[end] = total;
        s->start[end] = (int32_t)start;
        s->id[end] = id;
    }
}

/* Emits the unknown text w[a, b) as byte pieces when byte fallback has all of them, else unk. */
static int push_unknown(const qlm_tokenizer *t, const char *w, size_t a, size_t b, tok_ids *out) {
    int bytes = t->byte_fallback;
    for (size_t i = a; bytes && i < b; i++) bytes = t->byte_ids[(unsigned char)w[i]] >= 0;
    if (!bytes) return tok_ids_push(out, t->unk);
    for (size_t i = a; i < b; i++)
        if (tok_ids_push(out, t->byte_ids[(unsigned char)w[i]]) != 0) return -1;
    return 0;
}

static int encode_word(const qlm_tokenizer *t, tok_unigram_scratch *s, const char *w, size_t n, tok_ids *out) {
    if (n == 0) return 0;
    if (n >= INT32_MAX) return qlm_errorf("tokenizer: text too long");
    if (ensure_lattice(s, n) != 0) return -1;
    const tok_unigram *u = t->uni;
    const unsigned char *b = (const unsigned char *)w;
    for (size_t i = 0; i <= n; i++) s->start[i] = -1;
    s->start[0] = 0, s->score[0] = 0;
    for (size_t i = 0; i < n;) {
        size_t clen = (size_t)tok_utf8_len(b + i, n - i);
        int single = 0;
        int32_t node = 0;
        for (size_t k = i; k < n && (node = edge_find(u, node, b[k])) >= 0; k++) {
            int32_t id = u->node_id[node];
            if (id < 0) continue;
            relax(s, i, k + 1, id, u->scores[id]);
            single |= k + 1 - i == clen;
        }
        if (!single) relax(s, i, i + clen, t->unk, u->unk_score);
        i += clen;
    }
    /* The pieces' end offsets, last first. */
    size_t n_path = 0;
    for (size_t end = n; end > 0; end = (size_t)s->start[end]) s->path[n_path++] = (int32_t)end;
    int rc = 0;
    for (size_t k = n_path; rc == 0 && k-- > 0;) {
        size_t end = (size_t)s->path[k], start = (size_t)s->start[end];
        if (s->id[end] != t->unk) {
            rc = tok_ids_push(out, s->id[end]);
            continue;
        }
        while (t->fuse_unk && k > 0 && s->id[s->path[k - 1]] == t->unk) end = (size_t)s->path[--k];
        rc = push_unknown(t, w, start, end, out);
    }
    return rc;
}

int tok_unigram_encode(const qlm_tokenizer *t, tok_unigram_scratch *s, const char *seg, size_t n, int at_start,
                       tok_ids *out) {
    if (n == 0) return 0;
    if (t->uni->spm_normalizer) return encode_word(t, s, seg, n, out);
    /* Metaspace: spaces become "▁", and a "▁" goes first unless the segment starts with one. */
    int starts_with_space = seg[0] == ' ' || (n >= SPM_SPACE_LEN && memcmp(seg, SPM_SPACE, SPM_SPACE_LEN) == 0);
    int prefix = t->add_space_prefix && (!t->space_prefix_first || at_start) && !starts_with_space;
    if (tok_spm_normalize(seg, n, prefix, &s->word) != 0) return -1;
    const char *w = s->word.p;
    size_t len = s->word.n, start = 0;
    for (size_t i = 1; t->split_words && i + SPM_SPACE_LEN <= len; i++) {
        if (memcmp(w + i, SPM_SPACE, SPM_SPACE_LEN) != 0) continue;
        if (encode_word(t, s, w + start, i - start, out) != 0) return -1;
        start = i;
    }
    return encode_word(t, s, w + start, len - start, out);
}
