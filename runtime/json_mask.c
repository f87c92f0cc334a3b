/* Which tokens may come next. A vocabulary is indexed once as tries in preorder (a node's
 * subtree is the nodes up to its `end`), so a mask is one pass that steps the automaton by each
 * node's byte and skips the subtree of a byte it refuses: only plausible tokens are walked. Inside
 * a string of any content (where most tokens go) the plain-text tokens leave the state as it is:
 * they are allowed as a precomputed set, and only the other tokens are walked, from the first
 * byte that is not plain text (a second trie of those suffixes). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "json_internal.h"

enum { MAX_TOKEN_BYTES = 255 };

typedef struct {
    uint32_t end;       /* the first node after its subtree */
    uint32_t tok_first; /* its tokens: ids[tok_first .. tok_first + n_tok) */
    uint32_t n_tok;
    uint16_t depth;     /* its byte's position in the token, from 1 */
    uint8_t byte;
} vocab_node;

typedef struct {
    vocab_node *nodes;
    uint32_t n;
    int *ids;
} vocab_trie;

struct qlm_json_vocab {
    int n_tokens, max_len;
    vocab_trie full;   /* every token by its bytes */
    vocab_trie suffix; /* the tokens that are not plain text, by their bytes from the first that is not */
    uint64_t *plain;   /* tokens of plain string characters only */
    int *eog;
    int n_eog;
    unsigned char alone[256]; /* the bytes that are a token by themselves */
};

struct qlm_json_matcher {
    const qlm_json_grammar *g;
    const qlm_json_vocab *v;
    json_state state;
    json_state *walk; /* a state per trie depth, v->max_len + 1 */
    uint64_t *allowed;
};

typedef struct {
    const unsigned char *s;
    int n, id;
} entry;

static int words(int n) { return (n + 63) / 64; }

/* ---- the index ---- */

static int by_bytes(const void *pa, const void *pb) {
    const entry *a = pa, *b = pb;
    int m = a->n < b->n ? a->n : b->n, c = memcmp(a->s, b->s, (size_t)m);
    if (c) return c;
    return a->n != b->n ? a->n - b->n : a->id - b->id;
}

/* The trie of the entries (sorted here) in preorder; tokens with equal bytes share a node. */
static int build_trie(vocab_trie *t, entry *e, int n) {
    size_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += (size_t)e[i].n;
    t->nodes = malloc((bytes ? bytes : 1) * sizeof *t->nodes);
    t->ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *t->ids);
    if (!t->nodes || !t->ids) return qlm_errorf("out of memory");
    qsort(e, (size_t)n, sizeof *e, by_bytes);
    uint32_t open[MAX_TOKEN_BYTES + 1]; /* the node at each depth of the current path */
    int prev_n = 0;
    t->n = 0;
    for (int i = 0; i < n; i++) {
        int common = 0;
        if (i > 0)
            while (common < prev_n && common < e[i].n && e[i - 1].s[common] == e[i].s[common]) common++;
        for (int d = common + 1; d <= prev_n; d++) t->nodes[open[d]].end = t->n;
        for (int d = common + 1; d <= e[i].n; d++) {
            open[d] = t->n;
            t->nodes[t->n++] = (vocab_node){.depth = (uint16_t)d, .byte = e[i].s[d - 1]};
        }
        vocab_node *at = &t->nodes[open[e[i].n]];
        if (at->n_tok++ == 0) at->tok_first = (uint32_t)i;
        t->ids[i] = e[i].id;
        prev_n = e[i].n;
    }
    for (int d = 1; d <= prev_n; d++) t->nodes[open[d]].end = t->n;
    return 0;
}

/* Bytes at the start of s that are whole characters a string holds as they are: not the quote,
 * the backslash or a control byte, and valid UTF-8. */
static int plain_prefix(const unsigned char *s, int n) {
    int i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x20 || c == '"' || c == '\\') break;
        int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
                : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!len || i + len > n || !qlm_utf8_valid(s + i, (size_t)len)) break;
        i += len;
    }
    return i;
}


static int index_tokens(qlm_json_vocab *v, const char *const *bytes, const int *lens, entry *full, entry *suffix) {
    int n_full = 0, n_suffix = 0;
    for (int id = 0; id < v->n_tokens; id++) {
        const unsigned char *s = (const unsigned char *)bytes[id];
        int n = lens[id];
        if (n <= 0 || n > MAX_TOKEN_BYTES) continue;
        int is_eog = 0;
        for (int k = 0; k < v->n_eog; k++) is_eog |= v->eog[k] == id;
        if (is_eog) continue; /* allowed only as the end, never as text */
        full[n_full++] = (entry){s, n, id};
        int p = plain_prefix(s, n);
        if (p == n) v->plain[id / 64] |= 1ULL << (id % 64);
        else suffix[n_suffix++] = (entry){s + p, n - p, id};
        if (n > v->max_len) v->max_len = n;
    }
    if (build_trie(&v->full, full, n_full) != 0 || build_trie(&v->suffix, suffix, n_suffix) != 0) return -1;
    for (uint32_t i = 0; i < v->full.n; i = v->full.nodes[i].end) /* the first bytes */
        v->alone[v->full.nodes[i].byte] = v->full.nodes[i].n_tok > 0;
    return 0;
}

qlm_json_vocab *qlm_json_vocab_new(const char *const *bytes, const int *lens, int n, const int *eog, int n_eog) {
    qlm_json_vocab *v = calloc(1, sizeof *v);
    size_t cap = (size_t)(n > 0 ? n : 1);
    entry *full = malloc(cap * sizeof *full), *suffix = malloc(cap * sizeof *suffix);
    int rc = -1;
    if (v && full && suffix && n >= 0 && n_eog >= 0) {
        v->n_tokens = n;
        v->n_eog = n_eog;
        v->plain = calloc((size_t)words(n) + 1, sizeof *v->plain);
        v->eog = malloc((size_t)(n_eog + 1) * sizeof *v->eog);
        if (v->plain && v->eog) {
            memcpy(v->eog, eog, (size_t)n_eog * sizeof *eog);
            rc = index_tokens(v, bytes, lens, full, suffix);
        } else {
            qlm_errorf("out of memory");
        }
    } else {
        qlm_errorf(n < 0 || n_eog < 0 ? "json vocabulary: negative sizes" : "out of memory");
    }
    free(full);
    free(suffix);
    if (rc != 0) {
        qlm_json_vocab_free(v);
        return NULL;
    }
    return v;
}

/* Every token's bytes in one buffer: *text, with each token's offset in bytes[] until all are in. */
static int spell_all(const qlm_tokenizer *tok, int n, char **text, const char **bytes, int *lens) {
    /* Each token spelled after one that is not BOS: inside a text, where some tokenizers keep the
     * leading space they drop at the start. */
    int after = qlm_tokenizer_bos(tok) == 0 ? 1 : 0;
    size_t len = 0, cap = 0;
    size_t *off = malloc((size_t)(n > 0 ? n : 1) * sizeof *off);
    if (!off) return qlm_errorf("out of memory");
    for (int id = 0; id < n; id++) {
        if (len + MAX_TOKEN_BYTES > cap) {
            cap = (len + MAX_TOKEN_BYTES) * 2;
            char *t = realloc(*text, cap);
            if (!t) {
                free(off);
                return qlm_errorf("out of memory");
            }
            *text = t;
        }
        /* A token longer than MAX_TOKEN_BYTES fails here (-1): it is never allowed. */
        lens[id] = qlm_tokenizer_piece(tok, after, id, *text + len, MAX_TOKEN_BYTES);
        off[id] = len;
        len += lens[id] > 0 ? (size_t)lens[id] : 0;
    }
    for (int id = 0; id < n; id++) bytes[id] = *text + off[id];
    free(off);
    return 0;
}

qlm_json_vocab *qlm_json_vocab_from_tokenizer(const qlm_tokenizer *tok) {
    int n = qlm_tokenizer_vocab_size(tok), n_eog = 0;
    char *text = NULL;
    const char **bytes = malloc((size_t)n * sizeof *bytes);
    int *lens = malloc((size_t)n * sizeof *lens), *eog = malloc((size_t)n * sizeof *eog);
    qlm_json_vocab *v = NULL;
    if (!bytes || !lens || !eog) {
        qlm_errorf("out of memory");
    } else if (spell_all(tok, n, &text, bytes, lens) == 0) {
        for (int id = 0; id < n; id++)
            if (qlm_tokenizer_is_eog(tok, id)) eog[n_eog++] = id;
        v = qlm_json_vocab_new(bytes, lens, n, eog, n_eog);
    }
    free(text);
    free(bytes);
    free(lens);
    free(eog);
    return v;
}

/* Whatever state a matcher is in, one of these bytes continues it: a structural byte or quote, a
 * digit, a letter of true, false or null, what a high surrogate's escape needs next (a backslash,
 * u, d, c), a UTF-8 continuation byte after a lead, or the next byte of a key or value. Other text
 * never has to be spelled. */
int qlm_json_vocab_check(const qlm_json_vocab *v, const qlm_json_grammar *g) {
    static const char grammar_bytes[] = "{}[],:\"\\0123456789truefalsncd";
    unsigned char need[256] = {0};
    for (const char *c = grammar_bytes; *c; c++) need[(unsigned char)*c] = 1;
    for (int b = 0x80; b < 0xC0; b++) need[b] = 1;
    for (int i = 0; i < g->n_trie; i++) need[g->trie[i].byte] = 1;
    need[0] = 0; /* the byte of trie roots, which compact JSON never holds */
    for (int b = 0; b < 256; b++) {
        if (!need[b] || v->alone[b]) continue;
        if (b >= 0x20 && b < 0x7F)
            return qlm_errorf("the vocabulary has no token of its own for '%c', which JSON output may need", b);
        return qlm_errorf("the vocabulary has no token of its own for the byte 0x%02X, which JSON output may need", b);
    }
    return 0;
}

void qlm_json_vocab_free(qlm_json_vocab *v) {
    if (!v) return;
    free(v->full.nodes);
    free(v->full.ids);
    free(v->suffix.nodes);
    free(v->suffix.ids);
    free(v->plain);
    free(v->eog);
    free(v);
}

/* ---- the matcher ---- */

qlm_json_matcher *qlm_json_matcher_new(const qlm_json_grammar *g, const qlm_json_vocab *v) {
    qlm_json_matcher *m = calloc(1, sizeof *m);
    if (!m) {
        qlm_errorf("out of memory");
        return NULL;
    }
    m->g = g;
    m->v = v;
    json_state_start(g, &m->state);
    if (v && (!(m->walk = malloc((size_t)(v->max_len + 1) * sizeof *m->walk)) ||
              !(m->allowed = malloc((size_t)(words(v->n_tokens) + 1) * sizeof *m->allowed)))) {
        qlm_json_matcher_free(m);
        qlm_errorf("out of memory");
        return NULL;
    }
    return m;
}

void qlm_json_matcher_free(qlm_json_matcher *m) {
    if (!m) return;
    free(m->walk);
    free(m->allowed);
    free(m);
}

static void copy_state(json_state *dst, const json_state *src) {
    dst->n = src->n;
    for (int i = 0; i < src->n; i++) json_thread_copy(&dst->t[i], &src->t[i]);
}

/* The state after the bytes, in one of tmp[0..1], or NULL when they are refused. */
static const json_state *run(const qlm_json_matcher *m, const char *bytes, size_t n, json_state tmp[2]) {
    const json_state *at = &m->state;
    for (size_t i = 0; i < n; i++) {
        if (!json_state_step(m->g, at, (unsigned char)bytes[i], &tmp[i & 1])) return NULL;
        at = &tmp[i & 1];
    }
    return at;
}

int qlm_json_matcher_feed(qlm_json_matcher *m, const char *bytes, size_t n) {
    json_state tmp[2];
    const json_state *after = run(m, bytes, n, tmp);
    if (!after) return -1;
    if (after != &m->state) copy_state(&m->state, after);
    return 0;
}

int qlm_json_matcher_allows(const qlm_json_matcher *m, const char *bytes, size_t n) {
    json_state tmp[2];
    return run(m, bytes, n, tmp) != NULL;
}

int qlm_json_matcher_complete(const qlm_json_matcher *m) { return json_state_complete(m->g, &m->state); }

int qlm_json_matcher_done(const qlm_json_matcher *m) { return json_state_done(&m->state); }

/* Marks the tokens of trie t that the state in m->walk[0] takes. */
static void walk(qlm_json_matcher *m, const vocab_trie *t) {
    json_state *w = m->walk;
    for (uint32_t i = 0; i < t->n;) {
        const vocab_node *nd = &t->nodes[i];
        if (!json_state_step(m->g, &w[nd->depth - 1], nd->byte, &w[nd->depth])) {
            i = nd->end;
            continue;
        }
        for (uint32_t k = 0; k < nd->n_tok; k++) {
            int id = t->ids[nd->tok_first + k];
            m->allowed[id / 64] |= 1ULL << (id % 64);
        }
        i++;
    }
}

/* The threads of the current state inside (or outside) a free string, into m->walk[0]. */
static int split(qlm_json_matcher *m, int in_string) {
    json_state *w = &m->walk[0];
    w->n = 0;
    for (int i = 0; i < m->state.n; i++)
        if (json_thread_in_free_string(m->g, &m->state.t[i]) == in_string)
            json_thread_copy(&w->t[w->n++], &m->state.t[i]);
    return w->n;
}

const uint64_t *qlm_json_matcher_allowed(qlm_json_matcher *m) {
    const qlm_json_vocab *v = m->v;
    int nw = words(v->n_tokens);
    memset(m->allowed, 0, (size_t)nw * sizeof *m->allowed);
    if (split(m, 1)) {
        for (int i = 0; i < nw; i++) m->allowed[i] = v->plain[i];
        walk(m, &v->suffix);
    }
    if (split(m, 0)) walk(m, &v->full);
    if (qlm_json_matcher_complete(m))
        for (int k = 0; k < v->n_eog; k++) m->allowed[v->eog[k] / 64] |= 1ULL << (v->eog[k] % 64);
    return m->allowed;
}

int qlm_json_matcher_mask(qlm_json_matcher *m, float *logits, int n_logits) {
    const uint64_t *ok = qlm_json_matcher_allowed(m);
    int nw = words(m->v->n_tokens), any = 0;
    for (int base = 0; base < n_logits; base += 64) {
        int n = n_logits - base < 64 ? n_logits - base : 64;
        uint64_t in = n == 64 ? ~0ULL : (1ULL << n) - 1, bits = (base / 64 < nw ? ok[base / 64] : 0) & in;
        uint64_t off = ~bits & in;
        any |= bits != 0;
        /* Words are mostly all in (inside a string) or all out (elsewhere). */
        if (off == ~0ULL)
            for (int i = 0; i < 64; i++) logits[base + i] = -INFINITY;
        else
            for (; off; off &= off - 1) logits[base + __builtin_ctzll(off)] = -INFINITY;
    }
    return any ? 0 : qlm_errorf("no token of the vocabulary can continue the JSON output");
}
