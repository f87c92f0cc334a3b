/* Vocabulary and merge hash maps, and the BPE merge loop: symbols in a linked list, candidate
 * merges in a binary heap ordered by merge rank (HF BPE) or by the merged piece's score
 * (SentencePiece BPE / llama2.c), ties to the leftmost pair. */
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "tokenizer_internal.h"

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 31);
}

static uint32_t table_size(int n) {
    uint32_t cap = 16;
    while (cap < (uint32_t)n * 2u) cap <<= 1;
    return cap;
}

int tok_strmap_build(tok_strmap *m, const qlm_tokenizer *t) {
    uint32_t cap = table_size(t->n_vocab);
    m->slots = malloc(sizeof(int32_t) * cap);
    if (!m->slots) return qlm_errorf("tokenizer: out of memory for the vocabulary map");
    memset(m->slots, 0xFF, sizeof(int32_t) * cap);
    m->mask = cap - 1;
    for (int id = 0; id < t->n_vocab; id++) {
        if (t->len[id] == 0 || tok_vocab_find(t, tok_str(t, id), t->len[id]) >= 0) continue;
        uint32_t h = (uint32_t)hash_bytes(tok_str(t, id), t->len[id]) & m->mask;
        while (m->slots[h] >= 0) h = (h + 1) & m->mask;
        m->slots[h] = id;
    }
    return 0;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->slots);
    m->slots = NULL;
}

int tok_vocab_find(const qlm_tokenizer *t, const char *s, size_t n) {
    const tok_strmap *m = &t->vocab;
    if (!m->slots || n == 0) return -1;
    uint32_t h = (uint32_t)hash_bytes(s, n) & m->mask;
    for (int32_t id; (id = m->slots[h]) >= 0; h = (h + 1) & m->mask)
        if (t->len[id] == n && memcmp(tok_str(t, id), s, n) == 0) return id;
    return -1;
}

static int pair_find(const tok_pairmap *m, int a, int b, int *rank, int *merged) {
    if (!m->keys) return 0;
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (uint32_t h = (uint32_t)hash_pair(key) & m->mask; m->keys[h]; h = (h + 1) & m->mask) {
        if (m->keys[h] == key) {
            *rank = m->rank[h];
            *merged = m->merged[h];
            return 1;
        }
    }
    return 0;
}

/* Splits "left right" into vocabulary ids. A merge of pieces that themselves hold spaces (some
 * tokenizer.json files) is split at the space where both halves and their concatenation are
 * vocabulary entries. */
static int split_merge(const qlm_tokenizer *t, const char *m, int *a, int *b, int *merged, char *tmp) {
    size_t n = strlen(m);
    for (size_t k = 0; k < n; k++) {
        if (m[k] != ' ') continue;
        int l = tok_vocab_find(t, m, k), r = tok_vocab_find(t, m + k + 1, n - k - 1);
        if (l < 0 || r < 0) continue;
        memcpy(tmp, m, k);
        memcpy(tmp + k, m + k + 1, n - k - 1);
        int c = tok_vocab_find(t, tmp, n - 1);
        if (c < 0) continue;
        *a = l, *b = r, *merged = c;
        return 0;
    }
    return -1;
}

static void pair_insert(tok_pairmap *m, int a, int b, int rank, int merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t h = (uint32_t)hash_pair(key) & m->mask;
    for (; m->keys[h]; h = (h + 1) & m->mask)
        if (m->keys[h] == key) return; /* a repeated merge keeps its first (best) rank */
    m->keys[h] = key;
    m->rank[h] = rank;
    m->merged[h] = merged;
}

int tok_merges_build(qlm_tokenizer *t, const char *const *merges, int n_merges) {
    tok_pairmap *m = &t->merges;
    uint32_t cap = table_size(n_merges);
    m->keys = calloc(cap, sizeof(uint64_t));
    m->rank = malloc(sizeof(int32_t) * cap);
    m->merged = malloc(sizeof(int32_t) * cap);
    if (!m->keys || !m->rank || !m->merged) return qlm_errorf("tokenizer: out of memory for %d merges", n_merges);
    m->mask = cap - 1;
    char *tmp = NULL;
    int rc = 0;
    for (int i = 0; i < n_merges; i++) {
        if (!merges[i]) {
            rc = qlm_errorf("tokenizer: merge %d is missing", i);
            break;
        }
        char *grown = realloc(tmp, strlen(merges[i]) + 1);
        if (!grown) {
            rc = qlm_errorf("tokenizer: out of memory");
            break;
        }
        tmp = grown;
        int a, b, merged;
        if (split_merge(t, merges[i], &a, &b, &merged, tmp) != 0) {
            rc = qlm_errorf("tokenizer: merge %d \"%.80s\" is not two vocabulary pieces whose join is one", i,
                            merges[i]);
            break;
        }
        pair_insert(m, a, b, i, merged);
    }
    free(tmp);
    t->n_merges = n_merges;
    return rc;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->keys);
    free(m->rank);
    free(m->merged);
    memset(m, 0, sizeof(*m));
}

/* ---- merge loop ---- */

enum { SYM_MERGES = 0, SYM_BYTE = 1, SYM_UNK = 2 };

typedef struct {
    int id, prev, next;
    uint32_t start, len;
    int kind;
} sym_t;

typedef struct {
    double key; /* merge rank, or minus the merged piece's score */
    int pos, right, merged;
    uint32_t llen, rlen;
} cand_t;

typedef struct {
    const qlm_tokenizer *t;
    tok_bpe_scratch *s;
    const char *w;
    int n_sym, n_heap;
} bpe_ctx;

static int cand_less(const cand_t *x, const cand_t *y) {
    return x->key < y->key || (x->key == y->key && x->pos < y->pos);
}

static int heap_push(bpe_ctx *c, cand_t v) {
    tok_bpe_scratch *s = c->s;
    if (c->n_heap == s->heap_cap) {
        int cap = s->heap_cap ? s->heap_cap * 2 : 64;
        cand_t *h = realloc(s->heap, sizeof(cand_t) * (size_t)cap);
        if (!h) return qlm_errorf("tokenizer: out of memory");
        s->heap = h, s->heap_cap = cap;
    }
    cand_t *h = s->heap;
    int i = c->n_heap++;
    while (i > 0 && cand_less(&v, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
    return 0;
}

static cand_t heap_pop(bpe_ctx *c) {
    cand_t *h = c->s->heap, top = h[0], last = h[--c->n_heap];
    int i = 0, n = c->n_heap;
    for (;;) {
        int k = 2 * i + 1;
        if (k >= n) break;
        if (k + 1 < n && cand_less(&h[k + 1], &h[k])) k++;
        if (!cand_less(&h[k], &last)) break;
        h[i] = h[k];
        i = k;
    }
    if (n > 0) h[i] = last;
    return top;
}

/* SentencePiece merges only into ordinary pieces, never into control, unknown or byte pieces. */
static int score_mergeable(const qlm_tokenizer *t, int id) {
    int ty = t->types[id];
    return ty == QLM_TOKEN_NORMAL || ty == QLM_TOKEN_USER_DEFINED || ty == QLM_TOKEN_UNUSED;
}

static int add_cand(bpe_ctx *c, int a) {
    sym_t *sym = c->s->sym;
    int b = a >= 0 ? sym[a].next : -1;
    if (b < 0 || sym[a].kind != SYM_MERGES || sym[b].kind != SYM_MERGES) return 0;
    const qlm_tokenizer *t = c->t;
    cand_t v = {0, a, b, -1, sym[a].len, sym[b].len};
    if (!t->scores) {
        int rank;
        if (!pair_find(&t->merges, sym[a].id, sym[b].id, &rank, &v.merged)) return 0;
        v.key = rank;
    } else {
        if (sym[a].start + sym[a].len != sym[b].start) return 0;
        v.merged = tok_vocab_find(t, c->w + sym[a].start, sym[a].len + sym[b].len);
        if (v.merged < 0 || !score_mergeable(t, v.merged)) return 0;
        v.key = -(double)t->scores[v.merged];
    }
    return heap_push(c, v);
}

static void push_sym(bpe_ctx *c, int id, uint32_t start, uint32_t len, int kind) {
    sym_t *sym = c->s->sym;
    int i = c->n_sym++;
    sym[i] = (sym_t){id, i - 1, -1, start, len, kind};
    if (i > 0) sym[i - 1].next = i;
}

/* An unknown character: unk (fused with a preceding unk when fuse_unk), or dropped without one. */
static void push_unknown(bpe_ctx *c, uint32_t start, uint32_t len) {
    sym_t *sym = c->s->sym;
    if (c->t->unk < 0) return;
    if (c->t->fuse_unk && c->n_sym > 0 && sym[c->n_sym - 1].kind == SYM_UNK &&
        sym[c->n_sym - 1].start + sym[c->n_sym - 1].len == start) {
        sym[c->n_sym - 1].len += len;
        return;
    }
    push_sym(c, c->t->unk, start, len, SYM_UNK);
}

static void initial_symbols(bpe_ctx *c, size_t n) {
    const qlm_tokenizer *t = c->t;
    const unsigned char *w = (const unsigned char *)c->w;
    for (size_t i = 0; i < n;) {
        size_t clen = t->type == QLM_TOK_BYTE_BPE ? 1 : (size_t)tok_utf8_len(w + i, n - i);
        int id = t->type == QLM_TOK_BYTE_BPE ? t->byte_ids[w[i]] : tok_vocab_find(t, c->w + i, clen);
        if (id >= 0) {
            push_sym(c, id, (uint32_t)i, (uint32_t)clen, SYM_MERGES);
        } else {
            int bytes_ok = t->type == QLM_TOK_SPM_BPE && t->byte_fallback;
            for (size_t k = 0; bytes_ok && k < clen; k++) bytes_ok = t->byte_ids[w[i + k]] >= 0;
            /* SentencePiece never merges byte pieces; HF BPE looks them up like any id pair. */
            for (size_t k = 0; bytes_ok && k < clen; k++)
                push_sym(c, t->byte_ids[w[i + k]], (uint32_t)(i + k), 1, t->scores ? SYM_BYTE : SYM_MERGES);
            if (!bytes_ok) push_unknown(c, (uint32_t)i, (uint32_t)clen);
        }
        i += clen;
    }
}

/* HF ignore_merges: a pre-token that is itself a vocabulary entry is emitted whole. */
static int whole_word(const qlm_tokenizer *t, tok_bpe_scratch *s, const char *w, size_t n) {
    if (t->type != QLM_TOK_BYTE_BPE) return tok_vocab_find(t, w, n);
    s->mapped.n = 0;
    for (size_t i = 0; i < n; i++) {
        char u[4];
        if (tok_buf_put(&s->mapped, u, (size_t)tok_utf8_put(tok_byte_to_cp((unsigned char)w[i]), u)) != 0) return -2;
    }
    return tok_vocab_find(t, s->mapped.p, s->mapped.n);
}

static int ensure_syms(tok_bpe_scratch *s, size_t n) {
    if ((size_t)s->sym_cap >= n) return 0;
    if (n > (size_t)INT32_MAX / sizeof(sym_t)) return qlm_errorf("tokenizer: text too long");
    sym_t *p = realloc(s->sym, sizeof(sym_t) * n);
    if (!p) return qlm_errorf("tokenizer: out of memory");
    s->sym = p, s->sym_cap = (int)n;
    return 0;
}

int tok_bpe_word(const qlm_tokenizer *t, tok_bpe_scratch *s, const char *w, size_t n, tok_ids *out) {
    if (n == 0) return 0;
    if (t->ignore_merges) {
        int id = whole_word(t, s, w, n);
        if (id == -2) return -1;
        if (id >= 0) return tok_ids_push(out, id);
    }
    if (ensure_syms(s, n) != 0) return -1;
    bpe_ctx c = {t, s, w, 0, 0};
    initial_symbols(&c, n);
    for (int i = 0; i + 1 < c.n_sym; i++)
        if (add_cand(&c, i) != 0) return -1;
    sym_t *sym = s->sym;
    while (c.n_heap > 0) {
        cand_t v = heap_pop(&c);
        int a = v.pos, b = v.right;
        /* Stale: one side has merged since this candidate was queued. */
        if (sym[a].len != v.llen || sym[a].next != b || sym[b].len != v.rlen) continue;
        sym[a].id = v.merged;
        sym[a].len += sym[b].len;
        sym[b].len = 0;
        sym[a].next = sym[b].next;
        if (sym[b].next >= 0) sym[sym[b].next].prev = a;
        if (add_cand(&c, sym[a].prev) != 0 || add_cand(&c, a) != 0) return -1;
    }
    for (int i = c.n_sym > 0 ? 0 : -1; i >= 0; i = sym[i].next)
        if (tok_ids_push(out, sym[i].id) != 0) return -1;
    return 0;
}

void tok_bpe_scratch_free(tok_bpe_scratch *s) {
    free(s->sym);
    free(s->heap);
    free(s->mapped.p);
    memset(s, 0, sizeof(*s));
}
