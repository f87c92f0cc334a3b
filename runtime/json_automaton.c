/* The JSON pushdown automaton, one byte at a time. A thread is a stack of frames (the root, then
 * one per open value); a state holds every thread still alive, since anyOf and lists of types
 * are followed side by side until the bytes tell them apart. Each check is made at the first
 * byte that decides it (a \u escape's range digit by digit, a UTF-8 sequence's second byte), so
 * the automaton accepts exactly the valid prefixes and every live thread can still finish. */
#include <string.h>

#include "json_internal.h"

enum { ROOT_BEFORE, ROOT_CHILD, ROOT_DONE };                                         /* root */
enum { O_OPEN, O_FIRST, O_KEY, O_IN_KEY, O_COLON, O_VALUE, O_CHILD, O_NEXT };        /* object */
enum { A_OPEN, A_FIRST, A_ITEM, A_CHILD, A_NEXT };                                   /* array */
enum { S_OPEN, S_CHAR, S_ESC, S_HEX, S_LOW_BS, S_LOW_U, S_UTF8 };                    /* string */
enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP_MARK, N_EXP_SIGN, N_EXP }; /* number */
enum { L_START, L_IN };                                                              /* literals */

enum { JSON_LOW = 0x100 }; /* string frame: this \u escape must be a low surrogate */

/* What a frame did with a byte. */
enum {
    R_OK,     /* took it */
    R_FAIL,   /* no valid prefix takes it */
    R_END,    /* took it and its value is complete */
    R_PASS,   /* its value was complete before it (a number): the parent takes it */
    R_PUSHED, /* pushed a child frame, which takes it */
    R_FORKED, /* the alternatives of the value starting here took it, each in its own thread */
};

void json_thread_copy(json_thread *dst, const json_thread *src) {
    dst->depth = src->depth;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof src->f[0]);
}

static const json_node *node_of(const qlm_json_grammar *g, const json_frame *f) { return &g->nodes[f->node]; }

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* A whitespace byte in a container or before the document: bounded, so that the model cannot
 * spend its tokens on spaces. */
static int space(json_frame *f) {
    if (f->ws >= JSON_MAX_WS) return R_FAIL;
    f->ws++;
    return R_OK;
}

static int trie_child(const qlm_json_grammar *g, int at, unsigned char c) {
    for (int k = g->trie[at].child; k >= 0; k = g->trie[k].sibling)
        if (g->trie[k].byte == c) return k;
    return -1;
}

static int push(json_thread *t, int node) {
    if (t->depth == JSON_MAX_FRAMES) return -1;
    t->f[t->depth++] = (json_frame){.node = (uint16_t)node};
    return 0;
}

/* Opening a container: its frame may be at most JSON_MAX_NEST deep (the root is frame 0). */
static int may_open(const json_thread *t) { return t->depth - 1 <= JSON_MAX_NEST; }

static void feed(const qlm_json_grammar *g, json_thread *t, unsigned char c, json_state *out);

/* A value of node starts with byte c; an alternative (JN_ALT) starts a thread per member. */
static int push_value(const qlm_json_grammar *g, json_thread *t, int node, unsigned char c, json_state *out) {
    const json_node *n = &g->nodes[node];
    if (n->kind != JN_ALT) return push(t, node) == 0 ? R_PUSHED : R_FAIL;
    for (int i = 0; i < n->count; i++) {
        json_thread alt;
        json_thread_copy(&alt, t);
        if (push(&alt, g->list[n->first + i]) == 0) feed(g, &alt, c, out);
    }
    return R_FORKED;
}

static int root_byte(const qlm_json_grammar *g, json_thread *t, json_frame *f, unsigned char c, json_state *out) {
    if (f->phase != ROOT_BEFORE) return R_FAIL; /* nothing follows the value, not even whitespace */
    if (is_ws(c)) return space(f);
    f->phase = ROOT_CHILD;
    return push_value(g, t, f->node, c, out);
}

/* The properties whose key may come next: from the first one still allowed up to the first
 * required one (properties come in schema order; optional ones may be skipped). */
static uint64_t key_candidates(const json_node *n, int from) {
    if (from >= n->count) return 0;
    uint64_t later = ~0ULL << from, req = n->required & later;
    int last = n->count - 1;
    if (req)
        for (last = from; !(req >> last & 1); last++) {}
    return later & (last == 63 ? ~0ULL : (1ULL << (last + 1)) - 1);
}

static int required_after(const json_node *n, int from) { return from < 64 && (n->required >> from) != 0; }

static int key_byte(const qlm_json_grammar *g, const json_node *n, json_frame *f, unsigned char c) {
    int k = trie_child(g, f->b, c);
    if (k < 0 || !(g->trie[k].props & key_candidates(n, f->a))) return R_FAIL;
    int label = g->trie[k].label;
    if (label < 0) {
        f->b = (uint16_t)k;
        return R_OK;
    }
    /* A key ends with its closing quote, so it is no prefix of another: the property is known. */
    f->a = (uint16_t)(label + 1);
    f->b = (uint16_t)label;
    f->phase = O_COLON;
    return R_OK;
}

static int key_start(const qlm_json_grammar *g, json_thread *t, const json_node *n, json_frame *f, unsigned char c) {
    f->phase = O_IN_KEY;
    if (n->count) {
        f->b = (uint16_t)n->root;
        return key_byte(g, n, f, c);
    }
    if (n->child < 0) return R_FAIL; /* {} only */
    return push(t, g->string_node) == 0 ? R_PUSHED : R_FAIL;
}

static int object_byte(const qlm_json_grammar *g, json_thread *t, json_frame *f, unsigned char c, json_state *out) {
    const json_node *n = node_of(g, f);
    if (f->phase == O_OPEN) {
        if (c != '{' || !may_open(t)) return R_FAIL;
        f->phase = O_FIRST;
        return R_OK;
    }
    if (f->phase == O_IN_KEY) return key_byte(g, n, f, c);
    if (is_ws(c)) return space(f);
    f->ws = 0;
    switch (f->phase) {
    case O_FIRST:
        if (c == '}') return n->required ? R_FAIL : R_END;
        return c == '"' ? key_start(g, t, n, f, c) : R_FAIL;
    case O_KEY: return c == '"' ? key_start(g, t, n, f, c) : R_FAIL;
    case O_COLON:
        if (c != ':') return R_FAIL;
        f->phase = O_VALUE;
        return R_OK;
    case O_VALUE:
        f->phase = O_CHILD;
        return push_value(g, t, n->count ? g->list[n->first + f->b] : n->child, c, out);
    case O_NEXT:
        if (c == '}') return required_after(n, f->a) ? R_FAIL : R_END;
        if (c != ',' || !(n->count ? f->a < n->count : n->child >= 0)) return R_FAIL;
        f->phase = O_KEY;
        return R_OK;
    default: return R_FAIL;
    }
}

static int array_item(const qlm_json_grammar *g, json_thread *t, const json_node *n, json_frame *f, unsigned char c,
                      json_state *out) {
    if (f->a < UINT16_MAX) f->a++;
    f->phase = A_CHILD;
    return push_value(g, t, n->child, c, out);
}

static int array_byte(const qlm_json_grammar *g, json_thread *t, json_frame *f, unsigned char c, json_state *out) {
    const json_node *n = node_of(g, f);
    if (f->phase == A_OPEN) {
        if (c != '[' || !may_open(t)) return R_FAIL;
        f->phase = A_FIRST;
        return R_OK;
    }
    if (is_ws(c)) return space(f);
    f->ws = 0;
    switch (f->phase) {
    case A_FIRST:
        if (c == ']') return n->min_items == 0 ? R_END : R_FAIL;
        return n->max_items != 0 ? array_item(g, t, n, f, c, out) : R_FAIL;
    case A_ITEM: return array_item(g, t, n, f, c, out);
    case A_NEXT:
        if (c == ']') return f->a >= n->min_items ? R_END : R_FAIL;
        if (c != ',' || (n->max_items >= 0 && f->a >= n->max_items)) return R_FAIL;
        f->phase = A_ITEM;
        return R_OK;
    default: return R_FAIL;
    }
}

/* The lead byte of a multi-byte UTF-8 character: how many bytes follow and the range of the
 * next, which rules out overlong forms, surrogates and code points above U+10FFFF. */
static int utf8_lead(json_frame *f, unsigned char c) {
    int need, lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return R_FAIL;
    f->phase = S_UTF8;
    f->a = (uint16_t)need;
    f->b = (uint16_t)(lo << 8 | hi);
    return R_OK;
}

static int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

static int overlaps(unsigned lo, unsigned hi, unsigned a, unsigned b) { return lo <= b && a <= hi; }

/* A \u escape's digit: the escapes the digits so far can still complete must include one that
 * is allowed here (a low surrogate right after a high one; no lone low surrogate elsewhere). */
static int hex_digit(json_frame *f, unsigned char c) {
    int h = hex_value(c), low = f->a & JSON_LOW, k = (f->a & 7) + 1;
    if (h < 0) return R_FAIL;
    unsigned v = (unsigned)f->b * 16 + (unsigned)h, span = 1u << (4 * (4 - k)), lo = v * span, hi = lo + span - 1;
    int ok = low ? overlaps(lo, hi, 0xDC00, 0xDFFF) : overlaps(lo, hi, 0, 0xDBFF) || overlaps(lo, hi, 0xE000, 0xFFFF);
    if (!ok) return R_FAIL;
    f->a = (uint16_t)(low | k);
    f->b = (uint16_t)v;
    if (k == 4) f->phase = !low && v >= 0xD800 && v <= 0xDBFF ? S_LOW_BS : S_CHAR;
    return R_OK;
}

static int string_byte(json_frame *f, unsigned char c) {
    switch (f->phase) {
    case S_OPEN:
        if (c != '"') return R_FAIL;
        f->phase = S_CHAR;
        return R_OK;
    case S_CHAR:
        if (c == '"') return R_END;
        if (c == '\\') {
            f->phase = S_ESC;
            return R_OK;
        }
        if (c < 0x20) return R_FAIL;
        return c < 0x80 ? R_OK : utf8_lead(f, c);
    case S_UTF8:
        if (c < f->b >> 8 || c > (f->b & 0xFF)) return R_FAIL;
        f->b = 0x80BF;
        if (--f->a == 0) f->phase = S_CHAR;
        return R_OK;
    case S_ESC:
        if (c == 'u') {
            f->phase = S_HEX;
            f->a = f->b = 0;
            return R_OK;
        }
        if (!c || !strchr("\"\\/bfnrt", c)) return R_FAIL;
        f->phase = S_CHAR;
        return R_OK;
    case S_HEX: return hex_digit(f, c);
    case S_LOW_BS:
        if (c != '\\') return R_FAIL;
        f->phase = S_LOW_U;
        return R_OK;
    case S_LOW_U:
        if (c != 'u') return R_FAIL;
        f->phase = S_HEX;
        f->a = JSON_LOW;
        f->b = 0;
        return R_OK;
    default: return R_FAIL;
    }
}

static int number_accepting(int phase) {
    return phase == N_ZERO || phase == N_INT || phase == N_FRAC || phase == N_EXP;
}

static int number_byte(const json_node *n, json_frame *f, unsigned char c) {
    int digit = c >= '0' && c <= '9', real = n->kind == JN_NUMBER, e = real && (c == 'e' || c == 'E');
    int dot = real && c == '.', next = -1;
    switch (f->phase) {
    case N_START: next = c == '-' ? N_MINUS : c == '0' ? N_ZERO : digit ? N_INT : -1; break;
    case N_MINUS: next = c == '0' ? N_ZERO : digit ? N_INT : -1; break;
    case N_ZERO: next = dot ? N_DOT : e ? N_EXP_MARK : -1; break;
    case N_INT: next = digit ? N_INT : dot ? N_DOT : e ? N_EXP_MARK : -1; break;
    case N_DOT: next = digit ? N_FRAC : -1; break;
    case N_FRAC: next = digit ? N_FRAC : e ? N_EXP_MARK : -1; break;
    case N_EXP_MARK: next = c == '+' || c == '-' ? N_EXP_SIGN : digit ? N_EXP : -1; break;
    case N_EXP_SIGN:
    case N_EXP: next = digit ? N_EXP : -1; break;
    default: break;
    }
    /* A byte that leaves the number unfinished needs room for a digit after it. */
    if (next >= 0 && f->a + (number_accepting(next) ? 1 : 2) <= JSON_MAX_NUMBER) {
        f->phase = (uint8_t)next;
        f->a++;
        return R_OK;
    }
    return number_accepting(f->phase) ? R_PASS : R_FAIL;
}

/* A literal whose bytes so far end one value may still go on as a longer one (1 and 12). */
static int literal_byte(const qlm_json_grammar *g, const json_node *n, json_frame *f, unsigned char c) {
    int at = f->phase == L_START ? n->root : f->b, k = trie_child(g, at, c);
    if (k < 0) return f->phase == L_IN && g->trie[at].label >= 0 ? R_PASS : R_FAIL;
    f->phase = L_IN;
    f->b = (uint16_t)k;
    return g->trie[k].label >= 0 && g->trie[k].child < 0 ? R_END : R_OK;
}

static int frame_byte(const qlm_json_grammar *g, json_thread *t, unsigned char c, json_state *out) {
    json_frame *f = &t->f[t->depth - 1];
    if (t->depth == 1) return root_byte(g, t, f, c, out);
    const json_node *n = node_of(g, f);
    switch (n->kind) {
    case JN_OBJECT: return object_byte(g, t, f, c, out);
    case JN_ARRAY: return array_byte(g, t, f, c, out);
    case JN_STRING: return string_byte(f, c);
    case JN_NUMBER:
    case JN_INTEGER: return number_byte(n, f, c);
    case JN_LITERALS: return literal_byte(g, n, f, c);
    default: return R_FAIL; /* JN_ALT never has a frame of its own */
    }
}

/* The parent of a value that just ended moves past it. */
static void child_done(const qlm_json_grammar *g, json_thread *t) {
    json_frame *f = &t->f[t->depth - 1];
    if (t->depth == 1) f->phase = ROOT_DONE;
    else if (node_of(g, f)->kind == JN_OBJECT) f->phase = f->phase == O_IN_KEY ? O_COLON : O_NEXT;
    else f->phase = A_NEXT;
}

static int same_thread(const json_thread *a, const json_thread *b) {
    return a->depth == b->depth && memcmp(a->f, b->f, (size_t)a->depth * sizeof a->f[0]) == 0;
}

/* Keeps t in out unless an equal thread is there; past JSON_MAX_THREADS it is dropped, which
 * narrows what may follow but never lets anything invalid through. */
static void keep(json_state *out, const json_thread *t) {
    for (int i = 0; i < out->n; i++)
        if (same_thread(&out->t[i], t)) return;
    if (out->n < JSON_MAX_THREADS) json_thread_copy(&out->t[out->n++], t);
}

static void feed(const qlm_json_grammar *g, json_thread *t, unsigned char c, json_state *out) {
    for (;;) {
        int r = frame_byte(g, t, c, out);
        if (r == R_PUSHED) continue;
        if (r == R_END || r == R_PASS) {
            t->depth--;
            child_done(g, t);
            if (r == R_PASS) continue;
        }
        if (r == R_OK || r == R_END) keep(out, t);
        return;
    }
}

void json_state_start(const qlm_json_grammar *g, json_state *s) {
    s->n = 1;
    s->t[0].depth = 1;
    s->t[0].f[0] = (json_frame){.node = (uint16_t)g->root, .phase = ROOT_BEFORE};
}

int json_state_step(const qlm_json_grammar *g, const json_state *in, unsigned char c, json_state *out) {
    out->n = 0;
    for (int i = 0; i < in->n; i++) {
        json_thread t;
        json_thread_copy(&t, &in->t[i]);
        feed(g, &t, c, out);
    }
    return out->n > 0;
}

/* A number or literal at the top may end where it is. */
static int may_end(const qlm_json_grammar *g, const json_frame *f) {
    const json_node *n = node_of(g, f);
    if (n->kind == JN_NUMBER || n->kind == JN_INTEGER) return number_accepting(f->phase);
    return n->kind == JN_LITERALS && f->phase == L_IN && g->trie[f->b].label >= 0;
}

int json_state_complete(const qlm_json_grammar *g, const json_state *s) {
    for (int i = 0; i < s->n; i++) {
        const json_thread *t = &s->t[i];
        if ((t->depth == 1 && t->f[0].phase == ROOT_DONE) || (t->depth == 2 && may_end(g, &t->f[1]))) return 1;
    }
    return 0;
}

int json_state_done(const json_state *s) {
    for (int i = 0; i < s->n; i++)
        if (s->t[i].depth != 1 || s->t[i].f[0].phase != ROOT_DONE) return 0;
    return s->n > 0;
}

int json_thread_in_free_string(const qlm_json_grammar *g, const json_thread *t) {
    const json_frame *f = &t->f[t->depth - 1];
    return t->depth > 1 && node_of(g, f)->kind == JN_STRING && f->phase == S_CHAR;
}
