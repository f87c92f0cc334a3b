/* The interpreter's memory, strings with their trust marks, and the Python semantics of its
 * values: truth, ==, ordering, `in`, len() and iteration (jinja_print.c prints them,
 * jinja_lookup.c looks into them). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

/* ---- arena ---- */

struct jchunk {
    jchunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->head && a->head->cap - a->head->used >= n) {
        void *p = a->head->data + a->head->used;
        a->head->used += n;
        return p;
    }
    size_t cap = n > 65536 ? n : 65536;
    if (a->budget && (a->total + cap > a->budget || cap > a->budget)) return NULL;
    jchunk *c = malloc(sizeof *c + cap);
    if (!c) return NULL;
    a->total += cap;
    c->cap = cap;
    c->used = n;
    /* A big block gets its own chunk behind the current one, whose free space stays usable. */
    if (a->head && cap == n) {
        c->next = a->head->next;
        a->head->next = c;
    } else {
        c->next = a->head;
        a->head = c;
    }
    return c->data;
}

void ja_free(jarena *a) {
    for (jchunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- UTF-8 ---- */

static int cont(unsigned char c) { return (c & 0xC0) == 0x80; }

uint32_t ju_decode(const char *str, size_t n, size_t i, int *len) {
    const unsigned char *s = (const unsigned char *)str + i;
    size_t left = n - i;
    unsigned char c = s[0];
    *len = 1;
    if (c < 0x80) return c;
    if (c >= 0xC2 && c <= 0xDF && left >= 2 && cont(s[1])) {
        *len = 2;
        return (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F);
    }
    if (c >= 0xE0 && c <= 0xEF && left >= 3 && cont(s[1]) && cont(s[2])) {
        uint32_t v = (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
        if (v >= 0x800 && (v < 0xD800 || v > 0xDFFF)) {
            *len = 3;
            return v;
        }
    }
    if (c >= 0xF0 && c <= 0xF4 && left >= 4 && cont(s[1]) && cont(s[2]) && cont(s[3])) {
        uint32_t v = (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
                     (s[3] & 0x3F);
        if (v >= 0x10000 && v <= 0x10FFFF) {
            *len = 4;
            return v;
        }
    }
    return 0xDC00 + c; /* Python's surrogateescape reading of a stray byte */
}

int ju_isspace(uint32_t c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The byte offset of the character after the one at byte i. */
static size_t next_char(jstr s, size_t i) {
    if ((unsigned char)s.p[i] < 0x80) return i + 1;
    int len;
    ju_decode(s.p, s.n, i, &len);
    return i + (size_t)len;
}

long js_chars(jstr s) {
    long k = 0;
    for (size_t i = 0; i < s.n; k++) i = next_char(s, i);
    return k;
}

size_t js_char_offset(jstr s, long k) {
    size_t i = 0;
    for (; k > 0 && i < s.n; k--) i = next_char(s, i);
    return i;
}

int js_eq(jstr a, jstr b) { return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0); }
int js_eqc(jstr a, const char *c) { return js_eq(a, js_lit(c, strlen(c))); }

/* ---- render errors and memory ---- */

int jr_fail(jrender *r, const char *fmt, ...) {
    if (r->failed) return -1;
    r->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err, sizeof r->err, fmt, ap);
    va_end(ap);
    return -1;
}

void *jr_alloc(jrender *r, size_t n) {
    void *p = ja_alloc(&r->mem, n);
    if (!p) {
        if (r->mem.budget && r->mem.total + n + 65536 > r->mem.budget)
            jr_fail(r, "the render needs more than %zu MiB of memory (the limit)", r->mem.budget >> 20);
        else
            jr_fail(r, "out of memory");
    }
    return p;
}

jfunc *jr_func(jrender *r, int kind, jstr name, jval *out) {
    jfunc *f = jr_alloc(r, sizeof *f);
    if (!f) return NULL;
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->name = name;
    out->t = V_FUNC;
    out->u.fn = f;
    return f;
}

int jr_charge(jrender *r, long units) {
    r->steps += units;
    if (r->steps > r->lim.max_steps)
        return jr_fail(r, "the render took more than %ld steps (the limit)", r->lim.max_steps);
    return 0;
}

/* ---- buffers ---- */

static int jb_reserve(jrender *r, jbuf *b, size_t more) {
    if (b->n + more > r->lim.max_output)
        return jr_fail(r, "the output exceeds %zu bytes (the limit)", r->lim.max_output);
    if (b->n + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < b->n + more) cap *= 2;
    char *p = jr_alloc(r, cap);
    unsigned char *m = p ? jr_alloc(r, cap) : NULL;
    if (!m) return -1;
    if (b->n) {
        memcpy(p, b->p, b->n);
        memcpy(m, b->m, b->n);
    }
    b->p = p;
    b->m = m;
    b->cap = cap;
    return 0;
}

int jb_putc(jrender *r, jbuf *b, const char *s, size_t n, int mark) {
    if (n == 0) return 0;
    if (jb_reserve(r, b, n) != 0) return -1;
    memcpy(b->p + b->n, s, n);
    memset(b->m + b->n, mark, n);
    b->n += n;
    return 0;
}

int jb_put(jrender *r, jbuf *b, jstr s) {
    if (s.n == 0) return 0;
    if (jb_reserve(r, b, s.n) != 0) return -1;
    memcpy(b->p + b->n, s.p, s.n);
    if (s.m) memcpy(b->m + b->n, s.m, s.n);
    else memset(b->m + b->n, s.uni, s.n);
    b->n += s.n;
    return 0;
}

jstr jb_str(const jbuf *b) {
    jstr s = {b->p ? b->p : "", b->m, b->n, 0};
    int first = b->n ? b->m[0] : 0;
    size_t i = 0;
    while (i < b->n && b->m[i] == first) i++;
    if (i == b->n) { /* uniform: no per-byte marks needed */
        s.m = NULL;
        s.uni = (unsigned char)first;
    }
    return s;
}

int js_concat(jrender *r, jstr a, jstr b, jstr *out) {
    if (a.n == 0 || b.n == 0) {
        *out = a.n ? a : b;
        return 0;
    }
    jbuf buf = {0};
    if (jb_put(r, &buf, a) != 0 || jb_put(r, &buf, b) != 0) return -1;
    *out = jb_str(&buf);
    return 0;
}

int js_from_cstr(jrender *r, const char *s, jstr *out) {
    size_t n = strlen(s);
    char *p = jr_alloc(r, n + 1);
    if (!p) return -1;
    memcpy(p, s, n + 1);
    *out = js_lit(p, n);
    return 0;
}

/* ---- values ---- */

int jns_set(jrender *r, jns *t, jstr name, jval v) {
    for (int i = 0; i < t->n; i++)
        if (js_eq(t->k[i], name)) {
            t->v[i] = v;
            return 0;
        }
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 4;
        jstr *k = jr_alloc(r, sizeof *k * (size_t)cap);
        jval *vals = k ? jr_alloc(r, sizeof *vals * (size_t)cap) : NULL;
        if (!vals) return -1;
        if (t->n) {
            memcpy(k, t->k, sizeof *k * (size_t)t->n);
            memcpy(vals, t->v, sizeof *vals * (size_t)t->n);
        }
        t->k = k;
        t->v = vals;
        t->cap = cap;
    }
    t->k[t->n] = name;
    t->v[t->n++] = v;
    return 0;
}

jval jv_list(jrender *r, int kind, int n) {
    jval v = {V_LIST, {0}};
    jlist *l = jr_alloc(r, sizeof *l);
    if (!l) return v;
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->n = n;
    l->v = n ? jr_alloc(r, sizeof(jval) * (size_t)n) : NULL;
    if (n && !l->v) return v;
    v.u.l = l;
    return v;
}

jval jv_dict(jrender *r, int n) {
    jval v = {V_DICT, {0}};
    jdict *d = jr_alloc(r, sizeof *d);
    if (!d) return v;
    d->n = 0;
    d->k = n ? jr_alloc(r, sizeof(jval) * (size_t)n) : NULL;
    d->v = n ? jr_alloc(r, sizeof(jval) * (size_t)n) : NULL;
    if (n && (!d->k || !d->v)) return v;
    v.u.d = d;
    return v;
}

const char *jv_type_name(jval v) {
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list",
                                        "dict", "Namespace", "function", "LoopContext"};
    static const char *const lists[] = {"list", "tuple", "range", "generator", "dict_keys", "dict_values",
                                        "dict_items"};
    return v.t == V_LIST ? lists[v.u.l->kind] : names[v.t];
}

int jv_truthy(jval v) {
    switch (v.t) {
    case V_UNDEF:
    case V_NONE: return 0;
    case V_BOOL:
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0;
    case V_STR: return v.u.s.n != 0;
    case V_LIST: return v.u.l->kind == L_ITER || v.u.l->n != 0;
    case V_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

/* ---- equality and order ---- */

/* a and b as numbers (bool counts as int): 0 equal, -1 a < b, 1 a > b, 2 unordered (nan) */
static int num_cmp(jval a, jval b) {
    if (a.t != V_FLOAT && b.t != V_FLOAT) return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
    if (a.t == V_FLOAT && b.t == V_FLOAT) return a.u.f < b.u.f ? -1 : a.u.f > b.u.f ? 1 : a.u.f == b.u.f ? 0 : 2;
    double f = a.t == V_FLOAT ? a.u.f : b.u.f;
    long long i = a.t == V_FLOAT ? b.u.i : a.u.i;
    int sign = a.t == V_FLOAT ? 1 : -1; /* the result for "float > int" */
    if (isnan(f)) return 2;
    if (f >= 9.3e18) return sign;
    if (f <= -9.3e18) return -sign;
    double fl = floor(f);
    long long fi = (long long)fl;
    if (fi != i) return fi > i ? sign : -sign;
    return fl < f ? sign : 0;
}

static int equal_at(jrender *r, jval a, jval b, int depth);

static int lists_equal(jrender *r, const jlist *x, const jlist *y, int depth) {
    if (x->n != y->n) return 0;
    for (int i = 0; i < x->n; i++) {
        int e = equal_at(r, x->v[i], y->v[i], depth + 1);
        if (e != 1) return e;
    }
    return 1;
}

/* 1 equal, 0 not, -1 error */
static int equal_at(jrender *r, jval a, jval b, int depth) {
    if (depth > 200) return jr_fail(r, "a value nested more than 200 deep");
    if (jv_is_num(a) && jv_is_num(b)) return num_cmp(a, b) == 0;
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return jr_charge(r, cost_compare(a.u.s.n)) != 0 ? -1 : js_eq(a.u.s, b.u.s);
    case V_LIST: {
        const jlist *x = a.u.l, *y = b.u.l;
        if (x == y) return 1;
        if (x->kind != y->kind || x->kind == L_ITER || x->kind == L_VALUES) return 0;
        if (x->kind == L_RANGE && x->n == 0 && y->n == 0) return 1;
        if (x->kind == L_KEYS || x->kind == L_ITEMS) { /* set-like views */
            if (x->n != y->n) return 0;
            for (int i = 0; i < x->n; i++) {
                int found = 0;
                for (int j = 0; j < y->n && !found; j++) {
                    int e = equal_at(r, x->v[i], y->v[j], depth + 1);
                    if (e < 0) return -1;
                    found = e;
                }
                if (!found) return 0;
            }
            return 1;
        }
        return lists_equal(r, x, y, depth);
    }
    case V_DICT: {
        const jdict *x = a.u.d, *y = b.u.d;
        if (x->n != y->n) return 0;
        for (int i = 0; i < x->n; i++) {
            jval other;
            int rc = jv_dict_get(r, y, x->k[i], &other);
            if (rc < 0) return -1;
            if (rc == 1) return 0;
            int e = equal_at(r, x->v[i], other, depth + 1);
            if (e != 1) return e;
        }
        return 1;
    }
    case V_NS: return a.u.ns == b.u.ns;
    case V_FUNC: return a.u.fn == b.u.fn;
    case V_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

int jv_equal(jrender *r, jval a, jval b) {
    if (jr_charge(r, 1) != 0) return -1;
    return equal_at(r, a, b, 0);
}

static int order_at(jrender *r, jval a, jval b, int *cmp, int depth) {
    if (depth > 200) return jr_fail(r, "a value nested more than 200 deep");
    if (a.t == V_UNDEF || b.t == V_UNDEF) {
        jstr msg = (a.t == V_UNDEF ? a : b).u.s;
        return jr_fail(r, "%.*s", (int)msg.n, msg.p);
    }
    if (jv_is_num(a) && jv_is_num(b)) {
        *cmp = num_cmp(a, b);
        return 0;
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        if (jr_charge(r, cost_compare(n)) != 0) return -1;
        int c = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        *cmp = c < 0 ? -1 : c > 0 ? 1 : a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
        return 0;
    }
    if (a.t == V_LIST && b.t == V_LIST && a.u.l->kind == b.u.l->kind &&
        (a.u.l->kind == L_LIST || a.u.l->kind == L_TUPLE)) {
        const jlist *x = a.u.l, *y = b.u.l;
        for (int i = 0; i < x->n && i < y->n; i++) {
            int e = equal_at(r, x->v[i], y->v[i], depth + 1);
            if (e < 0) return -1;
            if (!e) return order_at(r, x->v[i], y->v[i], cmp, depth + 1);
        }
        *cmp = x->n < y->n ? -1 : x->n > y->n;
        return 0;
    }
    return jr_fail(r, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
}

int jv_order(jrender *r, jval a, jval b, int *cmp) {
    if (jr_charge(r, 1) != 0) return -1;
    return order_at(r, a, b, cmp, 0);
}

int jv_contains(jrender *r, jval c, jval item, int *in) {
    *in = 0;
    if (c.t == V_STR) {
        if (item.t == V_UNDEF) return jr_fail(r, "%.*s", (int)item.u.s.n, item.u.s.p);
        if (item.t != V_STR)
            return jr_fail(r, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        if (jr_charge(r, cost_compare(c.u.s.n)) != 0) return -1;
        *in = item.u.s.n == 0 || memmem(c.u.s.p, c.u.s.n, item.u.s.p, item.u.s.n) != NULL;
        return 0;
    }
    if (c.t == V_DICT) {
        jval v;
        int rc = jv_dict_get(r, c.u.d, item, &v);
        *in = rc == 0;
        return rc < 0 ? -1 : 0;
    }
    if (c.t == V_UNDEF) return 0;
    if (c.t != V_LIST) return jr_fail(r, "argument of type '%s' is not iterable", jv_type_name(c));
    jlist *l = c.u.l;
    for (int i = l->kind == L_ITER ? l->pos : 0; i < l->n; i++) {
        int e = jv_equal(r, item, l->v[i]);
        if (e < 0) return -1;
        if (e) {
            if (l->kind == L_ITER) l->pos = i + 1;
            *in = 1;
            return 0;
        }
    }
    if (l->kind == L_ITER) l->pos = l->n;
    return 0;
}

/* ---- length, iteration, lookups ---- */

int jv_len(jrender *r, jval v, long *n) {
    switch (v.t) {
    case V_UNDEF: *n = 0; return 0;
    case V_STR:
        *n = js_chars(v.u.s);
        return jr_charge(r, cost_scan(v.u.s.n));
    case V_DICT: *n = v.u.d->n; return 0;
    case V_LIST:
        if (v.u.l->kind != L_ITER) {
            *n = v.u.l->n;
            return 0;
        }
        break;
    case V_LOOP: *n = v.u.loop->length; return 0;
    default: break;
    }
    return jr_fail(r, "object of type '%s' has no len()", jv_type_name(v));
}

int jv_items(jrender *r, jval v, const jval **items, int *n) {
    switch (v.t) {
    case V_UNDEF: *items = NULL; *n = 0; return 0;
    case V_LIST: {
        jlist *l = v.u.l;
        if (l->kind == L_ITER) {
            *items = l->n ? l->v + l->pos : NULL;
            *n = l->n - l->pos;
            l->pos = l->n;
            return 0;
        }
        *items = l->v;
        *n = l->n;
        return 0;
    }
    case V_DICT: *items = v.u.d->k; *n = v.u.d->n; return 0;
    case V_STR: {
        jstr s = v.u.s;
        long chars = js_chars(s);
        if (jr_charge(r, cost_scan(s.n) + chars) != 0) return -1;
        jval list = jv_list(r, L_LIST, (int)chars);
        if (!list.u.l) return -1;
        size_t at = 0;
        for (long k = 0; k < chars; k++) {
            int len;
            ju_decode(s.p, s.n, at, &len);
            list.u.l->v[k] = jv_str(js_sub(s, at, at + (size_t)len));
            at += (size_t)len;
        }
        *items = list.u.l->v;
        *n = (int)chars;
        return 0;
    }
    default: return jr_fail(r, "'%s' object is not iterable", jv_type_name(v));
    }
}
