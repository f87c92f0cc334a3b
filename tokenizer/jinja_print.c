/* Values as text: Python's str() and repr() (floats in their shortest round-trip form), and
 * JSON as transformers' tojson writes it (json.dumps). Each output byte takes the mark of the
 * character it comes from; quotes, brackets and separators are trusted. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

/* ---- Python's float repr ---- */

static void float_repr(double d, char *out, size_t cap) {
    if (isnan(d)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp is [-]D[.DDD]e[+-]XX: the shortest digits that read back as d */
    const char *p = tmp;
    char digits[24];
    int nd = 0, neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = atoi(p + 1) + 1;
    size_t k = 0;
    if (neg) out[k++] = '-';
    if (decpt <= -4 || decpt > 16) {
        out[k++] = digits[0];
        if (nd > 1) k += (size_t)snprintf(out + k, cap - k, ".%s", digits + 1);
        snprintf(out + k, cap - k, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
        return;
    }
    if (decpt <= 0) { /* 0.000ddd */
        out[k++] = '0';
        out[k++] = '.';
        for (int z = 0; z < -decpt; z++) out[k++] = '0';
        snprintf(out + k, cap - k, "%s", digits);
    } else if (decpt >= nd) { /* ddd000.0 */
        k += (size_t)snprintf(out + k, cap - k, "%s", digits);
        for (int z = 0; z < decpt - nd; z++) out[k++] = '0';
        snprintf(out + k, cap - k, ".0");
    } else {
        snprintf(out + k, cap - k, "%.*s.%s", decpt, digits, digits + decpt);
    }
}

/* ---- str() and repr() ---- */

static int printable(uint32_t c) {
    if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return 0;
    if (c < 0x300) return 1;
    static const uint32_t ranges[][2] = {
        {0x0600, 0x0605}, {0x061C, 0x061C}, {0x06DD, 0x06DD}, {0x070F, 0x070F}, {0x1680, 0x1680},
        {0x180E, 0x180E}, {0x2000, 0x200F}, {0x2028, 0x202F}, {0x205F, 0x206F}, {0x3000, 0x3000},
        {0xD800, 0xF8FF}, {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB}, {0xFFFE, 0xFFFF}, {0x110BD, 0x110BD},
        {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0000, 0xE0FFF},
        {0xF0000, 0x10FFFF}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (c >= ranges[i][0] && c <= ranges[i][1]) return 0;
    return 1;
}

static int repr_str(jrender *r, jbuf *b, jstr s) {
    if (jr_charge(r, cost_rewrite(s.n)) != 0) return -1;
    int single = memchr(s.p, '\'', s.n) != NULL, dbl = memchr(s.p, '"', s.n) != NULL;
    char q = single && !dbl ? '"' : '\'';
    if (jb_putc(r, b, &q, 1, 0) != 0) return -1;
    for (size_t i = 0; i < s.n;) {
        int len, mark = js_mark(s, i);
        uint32_t c = ju_decode(s.p, s.n, i, &len);
        char esc[12];
        const char *piece = esc;
        size_t n;
        if (c == (uint32_t)q || c == '\\') n = (size_t)snprintf(esc, sizeof esc, "\\%c", (char)c);
        else if (c == '\t') n = (size_t)snprintf(esc, sizeof esc, "\\t");
        else if (c == '\n') n = (size_t)snprintf(esc, sizeof esc, "\\n");
        else if (c == '\r') n = (size_t)snprintf(esc, sizeof esc, "\\r");
        else if (printable(c) && !(c >= 0xDC80 && c <= 0xDCFF && len == 1)) {
            piece = s.p + i;
            n = (size_t)len;
        } else if (c <= 0xFF || (c >= 0xDC80 && c <= 0xDCFF && len == 1)) {
            n = (size_t)snprintf(esc, sizeof esc, "\\x%02x", c <= 0xFF ? c : c - 0xDC00);
        } else if (c <= 0xFFFF) {
            n = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
        } else {
            n = (size_t)snprintf(esc, sizeof esc, "\\U%08x", c);
        }
        if (jb_putc(r, b, piece, n, mark) != 0) return -1;
        i += (size_t)len;
    }
    return jb_putc(r, b, &q, 1, 0);
}

static int put_lit(jrender *r, jbuf *b, const char *s) { return jb_putc(r, b, s, strlen(s), 0); }

static int repr_items(jrender *r, jbuf *b, const jval *v, int n, const char *open, const char *close, int depth);

static int repr_at(jrender *r, jbuf *b, jval v, int depth) {
    if (depth > 200) return jr_fail(r, "a value nested more than 200 deep");
    char num[40];
    switch (v.t) {
    case V_UNDEF: return put_lit(r, b, "Undefined");
    case V_STR: return repr_str(r, b, v.u.s);
    case V_LIST: {
        jlist *l = v.u.l;
        switch (l->kind) {
        case L_LIST: return repr_items(r, b, l->v, l->n, "[", "]", depth);
        case L_TUPLE:
            if (l->n == 1) return repr_items(r, b, l->v, 1, "(", ",)", depth);
            return repr_items(r, b, l->v, l->n, "(", ")", depth);
        case L_RANGE:
            if (l->step == 1) snprintf(num, sizeof num, "range(%lld, %lld)", l->start, l->stop);
            else snprintf(num, sizeof num, "range(%lld, %lld, %lld)", l->start, l->stop, l->step);
            return put_lit(r, b, num);
        case L_KEYS: return repr_items(r, b, l->v, l->n, "dict_keys([", "])", depth);
        case L_VALUES: return repr_items(r, b, l->v, l->n, "dict_values([", "])", depth);
        case L_ITEMS: return repr_items(r, b, l->v, l->n, "dict_items([", "])", depth);
        default: return jr_fail(r, "cannot print a generator (the result of map, select, reverse, items...); add |list");
        }
    }
    case V_DICT: {
        if (put_lit(r, b, "{") != 0) return -1;
        for (int i = 0; i < v.u.d->n; i++) {
            if ((i && put_lit(r, b, ", ") != 0) || repr_at(r, b, v.u.d->k[i], depth + 1) != 0 ||
                put_lit(r, b, ": ") != 0 || repr_at(r, b, v.u.d->v[i], depth + 1) != 0)
                return -1;
        }
        return put_lit(r, b, "}");
    }
    case V_NS: {
        if (put_lit(r, b, "<Namespace {") != 0) return -1;
        for (int i = 0; i < v.u.ns->n; i++) {
            if ((i && put_lit(r, b, ", ") != 0) || repr_str(r, b, v.u.ns->k[i]) != 0 || put_lit(r, b, ": ") != 0 ||
                repr_at(r, b, v.u.ns->v[i], depth + 1) != 0)
                return -1;
        }
        return put_lit(r, b, "}>");
    }
    case V_LOOP:
        snprintf(num, sizeof num, "<LoopContext %ld/%ld>", v.u.loop->index0 + 1, v.u.loop->length);
        return put_lit(r, b, num);
    case V_FUNC:
        if (v.u.fn->kind == F_MACRO || v.u.fn->kind == F_CALLER) {
            if (put_lit(r, b, "<Macro '") != 0 || jb_put(r, b, v.u.fn->name) != 0) return -1;
            return put_lit(r, b, "'>");
        }
        return jr_fail(r, "cannot print a function or method (call it)");
    default: {
        jstr s;
        return jv_to_str(r, v, &s) != 0 ? -1 : jb_put(r, b, s);
    }
    }
}

static int repr_items(jrender *r, jbuf *b, const jval *v, int n, const char *open, const char *close, int depth) {
    if (put_lit(r, b, open) != 0) return -1;
    for (int i = 0; i < n; i++)
        if ((i && put_lit(r, b, ", ") != 0) || repr_at(r, b, v[i], depth + 1) != 0) return -1;
    return put_lit(r, b, close);
}

int jv_to_str(jrender *r, jval v, jstr *out) {
    char num[40];
    switch (v.t) {
    case V_UNDEF: *out = JS_C(""); return 0;
    case V_NONE: *out = JS_C("None"); return 0;
    case V_BOOL: *out = v.u.i ? JS_C("True") : JS_C("False"); return 0;
    case V_INT: snprintf(num, sizeof num, "%lld", v.u.i); return js_from_cstr(r, num, out);
    case V_FLOAT: float_repr(v.u.f, num, sizeof num); return js_from_cstr(r, num, out);
    case V_STR: *out = v.u.s; return 0;
    default: {
        jbuf b = {0};
        if (repr_at(r, &b, v, 0) != 0) return -1;
        *out = jb_str(&b);
        return 0;
    }
    }
}

/* ---- JSON (Python's json.dumps) ---- */

static int json_str(jrender *r, jbuf *b, jstr s, int ascii) {
    if (jr_charge(r, cost_rewrite(s.n)) != 0) return -1;
    if (jb_putc(r, b, "\"", 1, 0) != 0) return -1;
    for (size_t i = 0; i < s.n;) {
        int len, mark = js_mark(s, i);
        uint32_t c = ju_decode(s.p, s.n, i, &len);
        char esc[16];
        size_t n = 0;
        const char *piece = esc;
        switch (c) {
        case '"': n = (size_t)snprintf(esc, sizeof esc, "\\\""); break;
        case '\\': n = (size_t)snprintf(esc, sizeof esc, "\\\\"); break;
        case '\n': n = (size_t)snprintf(esc, sizeof esc, "\\n"); break;
        case '\r': n = (size_t)snprintf(esc, sizeof esc, "\\r"); break;
        case '\t': n = (size_t)snprintf(esc, sizeof esc, "\\t"); break;
        case '\b': n = (size_t)snprintf(esc, sizeof esc, "\\b"); break;
        case '\f': n = (size_t)snprintf(esc, sizeof esc, "\\f"); break;
        default:
            if (c < 0x20 || (ascii && c >= 0x7F && c <= 0xFFFF)) {
                n = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c);
            } else if (ascii && c > 0xFFFF) {
                uint32_t v = c - 0x10000;
                n = (size_t)snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                piece = s.p + i;
                n = (size_t)len;
            }
        }
        if (jb_putc(r, b, piece, n, mark) != 0) return -1;
        i += (size_t)len;
    }
    return jb_putc(r, b, "\"", 1, 0);
}

static int json_newline(jrender *r, jbuf *b, jstr *indent, int level) {
    if (!indent) return 0;
    if (jb_putc(r, b, "\n", 1, 0) != 0) return -1;
    for (int i = 0; i < level; i++)
        if (jb_put(r, b, *indent) != 0) return -1;
    return 0;
}

/* A dict key as json.dumps writes it (str, or a number / bool / None turned into one). */
static int json_key(jrender *r, jbuf *b, jval k, int ascii) {
    jstr s;
    char num[40];
    switch (k.t) {
    case V_STR: return json_str(r, b, k.u.s, ascii);
    case V_NONE: return json_str(r, b, JS_C("null"), 0);
    case V_BOOL: return json_str(r, b, k.u.i ? JS_C("true") : JS_C("false"), 0);
    case V_INT:
    case V_FLOAT:
        if (k.t == V_FLOAT && !isfinite(k.u.f)) {
            snprintf(num, sizeof num, "%s", isnan(k.u.f) ? "NaN" : k.u.f > 0 ? "Infinity" : "-Infinity");
            return json_str(r, b, js_lit(num, strlen(num)), 0);
        }
        if (jv_to_str(r, k, &s) != 0) return -1;
        return json_str(r, b, s, 0);
    default: return jr_fail(r, "tojson: keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

/* Dict entry order for sort_keys (a stable insertion sort: dicts in templates are small). */
static int sorted_order(jrender *r, const jdict *d, int *order) {
    for (int i = 0; i < d->n; i++) {
        int j = i;
        while (j > 0) {
            int cmp;
            if (jv_order(r, d->k[i], d->k[order[j - 1]], &cmp) != 0) return -1;
            if (cmp != -1) break;
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    return 0;
}

int jv_to_json(jrender *r, jbuf *b, jval v, int ascii, jstr *indent, jstr item_sep, jstr key_sep, int sort_keys,
               int depth) {
    if (depth > 200) return jr_fail(r, "tojson: a value nested more than 200 deep");
    if (jr_charge(r, 1) != 0) return -1;
    switch (v.t) {
    case V_NONE: return put_lit(r, b, "null");
    case V_BOOL: return put_lit(r, b, v.u.i ? "true" : "false");
    case V_INT: {
        jstr s;
        return jv_to_str(r, v, &s) != 0 ? -1 : jb_put(r, b, s);
    }
    case V_FLOAT: {
        if (!isfinite(v.u.f)) return put_lit(r, b, isnan(v.u.f) ? "NaN" : v.u.f > 0 ? "Infinity" : "-Infinity");
        jstr s;
        return jv_to_str(r, v, &s) != 0 ? -1 : jb_put(r, b, s);
    }
    case V_STR: return json_str(r, b, v.u.s, ascii);
    case V_LIST:
        if (v.u.l->kind != L_LIST && v.u.l->kind != L_TUPLE)
            return jr_fail(r, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
        if (v.u.l->n == 0) return put_lit(r, b, "[]");
        if (put_lit(r, b, "[") != 0) return -1;
        for (int i = 0; i < v.u.l->n; i++) {
            if ((i && jb_put(r, b, item_sep) != 0) || json_newline(r, b, indent, depth + 1) != 0 ||
                jv_to_json(r, b, v.u.l->v[i], ascii, indent, item_sep, key_sep, sort_keys, depth + 1) != 0)
                return -1;
        }
        if (json_newline(r, b, indent, depth) != 0) return -1;
        return put_lit(r, b, "]");
    case V_DICT: {
        const jdict *d = v.u.d;
        if (d->n == 0) return put_lit(r, b, "{}");
        int *order = jr_alloc(r, sizeof(int) * (size_t)d->n);
        if (!order) return -1;
        for (int i = 0; i < d->n; i++) order[i] = i;
        if (sort_keys && sorted_order(r, d, order) != 0) return -1;
        if (put_lit(r, b, "{") != 0) return -1;
        for (int i = 0; i < d->n; i++) {
            int k = order[i];
            if ((i && jb_put(r, b, item_sep) != 0) || json_newline(r, b, indent, depth + 1) != 0 ||
                json_key(r, b, d->k[k], ascii) != 0 || jb_put(r, b, key_sep) != 0 ||
                jv_to_json(r, b, d->v[k], ascii, indent, item_sep, key_sep, sort_keys, depth + 1) != 0)
                return -1;
        }
        if (json_newline(r, b, indent, depth) != 0) return -1;
        return put_lit(r, b, "}");
    }
    default: return jr_fail(r, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
    }
}
