/* Encoding driver. As HF tokenizers does: the text is first split on added tokens matched in the
 * raw text (leftmost, then longest), each remaining segment is normalized ("▁" rules of SPM
 * tokenizers, the charsmap and space rules of Unigram ones) and split again on added tokens whose
 * normalized form is matched, and what is left is pre-tokenized and BPE- or Unigram-encoded.
 * Special (control) added tokens take part only with parse_special, and never inside the
 * untrusted ranges of a marked text. */
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "tokenizer_internal.h"

int tok_ids_push(tok_ids *a, int id) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 64;
        if (cap <= a->cap) return qlm_errorf("tokenizer: too many tokens");
        int *v = realloc(a->v, sizeof(int) * (size_t)cap);
        if (!v) return qlm_errorf("tokenizer: out of memory");
        a->v = v, a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

int tok_buf_put(tok_buf *b, const void *data, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return qlm_errorf("tokenizer: out of memory");
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* ---- added-token sets ---- */

static int added_cmp(const void *x, const void *y) {
    const tok_added *a = x, *b = y;
    unsigned char fa = (unsigned char)a->pat[0], fb = (unsigned char)b->pat[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id - b->id;
}

static void added_index(tok_added_set *a) {
    qsort(a->items, (size_t)a->n, sizeof(tok_added), added_cmp);
    int k = 0;
    for (int b = 0; b < 256; b++) {
        a->first[b] = k;
        while (k < a->n && (unsigned char)a->items[k].pat[0] == b) k++;
    }
    a->first[256] = a->n;
}

static int is_added(const qlm_tokenizer *t, int id) {
    return t->len[id] > 0 && (t->types[id] == QLM_TOKEN_CONTROL || t->types[id] == QLM_TOKEN_USER_DEFINED);
}

/* Normalized forms of the tokens marked QLM_ADDED_NORMALIZED, concatenated in norm_added.arena;
 * (*offs)[id] is where each starts. */
static int normalized_patterns(qlm_tokenizer *t, const unsigned char *flags, size_t **offs) {
    tok_buf arena = {0}, one = {0};
    int prefix = t->type == QLM_TOK_SPM_BPE && !t->spm_metaspace && t->add_space_prefix;
    *offs = calloc((size_t)t->n_vocab, sizeof(size_t));
    if (!*offs) return qlm_errorf("tokenizer: out of memory");
    for (int id = 0; id < t->n_vocab; id++) {
        if (!is_added(t, id) || !(flags[id] & QLM_ADDED_NORMALIZED)) continue;
        const char *src = tok_str(t, id);
        size_t n = t->len[id];
        if (t->type == QLM_TOK_SPM_BPE && !t->spm_metaspace) {
            if (tok_spm_normalize(src, n, prefix, &one) != 0) goto fail;
            src = one.p, n = one.n;
        }
        (*offs)[id] = arena.n;
        if (tok_buf_put(&arena, src, n + 1) != 0) goto fail; /* keeps the NUL */
    }
    free(one.p);
    t->norm_added.arena = arena.p;
    return 0;
fail:
    free(one.p);
    free(arena.p);
    free(*offs);
    *offs = NULL;
    return -1;
}

int tok_added_build(qlm_tokenizer *t, const unsigned char *flags) {
    size_t *offs = NULL;
    if (flags && normalized_patterns(t, flags, &offs) != 0) return -1;
    int n = 0;
    for (int id = 0; id < t->n_vocab; id++) n += is_added(t, id);
    t->raw_added.items = calloc((size_t)n + 1, sizeof(tok_added));
    t->norm_added.items = calloc((size_t)n + 1, sizeof(tok_added));
    if (!t->raw_added.items || !t->norm_added.items) {
        free(offs);
        return qlm_errorf("tokenizer: out of memory");
    }
    for (int id = 0; id < t->n_vocab; id++) {
        if (!is_added(t, id)) continue;
        tok_added item = {tok_str(t, id), t->len[id], id, t->types[id] == QLM_TOKEN_CONTROL};
        tok_added_set *set = &t->raw_added;
        if (flags && (flags[id] & QLM_ADDED_NORMALIZED)) {
            set = &t->norm_added;
            item.pat = t->norm_added.arena + offs[id];
            item.len = (uint32_t)strlen(item.pat);
        }
        set->items[set->n++] = item;
    }
    free(offs);
    added_index(&t->raw_added);
    added_index(&t->norm_added);
    return 0;
}

void tok_added_free(tok_added_set *a) {
    free(a->items);
    free(a->arena);
    memset(a, 0, sizeof(*a));
}

/* ---- driver ---- */

typedef struct {
    const qlm_tokenizer *t;
    int parse_special;
    const qlm_marked_text *marks; /* untrusted ranges of the text, or NULL */
    int norm_special;             /* control tokens may be read in the current normalized segment */
    tok_bpe_scratch scratch;
    tok_unigram_scratch uni;
    tok_buf norm;
    tok_ids out;
} enc_ctx;

/* Whether a control token may be read at [pos, pos + len): raw is the text as given (offsets
 * comparable with the marks); a normalized segment has no such offsets, so it takes control tokens
 * only if none of its raw text is untrusted. */
static int special_allowed(const enc_ctx *c, int raw, size_t pos, size_t len) {
    if (!c->parse_special) return 0;
    if (!c->marks) return 1;
    return raw ? !qlm_marked_overlaps(c->marks, pos, pos + len) : c->norm_special;
}

/* The longest added token of set at s[pos..n) that may be read there, or NULL. */
static const tok_added *match_at(const enc_ctx *c, const tok_added_set *set, const char *s, size_t n, size_t pos,
                                 int raw) {
    unsigned char b = (unsigned char)s[pos];
    for (int k = set->first[b]; k < set->first[b + 1]; k++) {
        const tok_added *a = &set->items[k];
        if (a->len <= n - pos && memcmp(s + pos, a->pat, a->len) == 0 &&
            (!a->special || special_allowed(c, raw, pos, a->len)))
            return a;
    }
    return NULL;
}

/* Splits s on the tokens of set; gaps go to gap(), matches to the output. */
static int split_on(enc_ctx *c, const tok_added_set *set, const char *s, size_t n, int at_start, int raw,
                    int (*gap)(enc_ctx *, const char *, size_t, int)) {
    size_t g = 0;
    for (size_t pos = 0; set->n > 0 && pos < n;) {
        const tok_added *a = match_at(c, set, s, n, pos, raw);
        if (!a) {
            pos++;
            continue;
        }
        if (pos > g && gap(c, s + g, pos - g, at_start && g == 0) != 0) return -1;
        if (tok_ids_push(&c->out, a->id) != 0) return -1;
        pos += a->len;
        g = pos;
    }
    return n > g ? gap(c, s + g, n - g, at_start && g == 0) : 0;
}

static int pre_encode(enc_ctx *c, const char *s, size_t n, int at_start) {
    if (c->t->type == QLM_TOK_UNIGRAM) return tok_unigram_encode(c->t, &c->uni, s, n, at_start, &c->out);
    return tok_pre_encode(c->t, &c->scratch, s, n, at_start, &c->out);
}

/* A gap of the raw text (s points into it). */
static int normalize_segment(enc_ctx *c, const char *s, size_t n, int at_start) {
    const qlm_tokenizer *t = c->t;
    if (c->marks) {
        size_t at = (size_t)(s - c->marks->text);
        c->norm_special = !qlm_marked_overlaps(c->marks, at, at + n);
    }
    if (t->type == QLM_TOK_SPM_BPE && !t->spm_metaspace) {
        if (tok_spm_normalize(s, n, t->add_space_prefix, &c->norm) != 0) return -1;
        s = c->norm.p, n = c->norm.n;
    } else if (t->type == QLM_TOK_UNIGRAM) {
        if (tok_unigram_normalize(t, s, n, &c->norm) != 0) return -1;
        s = c->norm.p, n = c->norm.n;
    }
    return split_on(c, &t->norm_added, s, n, at_start, 0, pre_encode);
}

static int encode(const qlm_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
                  const qlm_marked_text *marks, int **ids, int *n_ids) {
    if (!t || !ids || !n_ids || (!text && len > 0)) return qlm_errorf("tokenizer encode: invalid arguments");
    if (len > (size_t)INT32_MAX / 2) return qlm_errorf("tokenizer encode: text of %zu bytes is too long", len);
    enc_ctx c = {.t = t, .parse_special = parse_special, .marks = marks};
    int rc = 0;
    if (add_special && t->add_bos && t->bos >= 0) rc = tok_ids_push(&c.out, t->bos);
    if (rc == 0 && len > 0) rc = split_on(&c, &t->raw_added, text, len, 1, 1, normalize_segment);
    if (rc == 0 && add_special && t->add_eos && t->eos >= 0) rc = tok_ids_push(&c.out, t->eos);
    if (rc == 0 && !c.out.v) { /* *ids is never NULL, even for no tokens */
        rc = tok_ids_push(&c.out, 0);
        c.out.n = 0;
    }
    tok_bpe_scratch_free(&c.scratch);
    tok_unigram_scratch_free(&c.uni);
    free(c.norm.p);
    if (rc != 0) {
        free(c.out.v);
        return -1;
    }
    *ids = c.out.v;
    *n_ids = c.out.n;
    return 0;
}

int qlm_tokenizer_encode(const qlm_tokenizer *t, const char *text, size_t len, int add_special, int parse_special,
                         int **ids, int *n_ids) {
    return encode(t, text, len, add_special, parse_special, NULL, ids, n_ids);
}

int qlm_tokenizer_encode_marked(const qlm_tokenizer *t, const qlm_marked_text *text, int add_special, int **ids,
                                int *n_ids) {
    if (!text || text->failed) return qlm_errorf("tokenizer encode: invalid arguments");
    return encode(t, text->text, text->len, add_special, 1, text, ids, n_ids);
}
