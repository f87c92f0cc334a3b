/* jinja2's filters with jinja2's (and Python's) behaviour, transformers' tojson among them. The
 * filters jinja2 has and qlm does not run are known by name, so a template that uses one fails
 * saying so, and only when it reaches it. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

enum {
    F_ABS, F_ATTR, F_CAPITALIZE, F_DEFAULT, F_DICTSORT, F_FIRST, F_FLOAT, F_INDENT, F_INT, F_ITEMS, F_JOIN,
    F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE,
    F_ROUND, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER,
};

static const struct {
    const char *name;
    int id;
} k_filters[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"batch", -2}, {"capitalize", F_CAPITALIZE}, {"center", -2},
    {"count", F_LENGTH}, {"d", F_DEFAULT}, {"default", F_DEFAULT}, {"dictsort", F_DICTSORT}, {"e", -2},
    {"escape", -2}, {"filesizeformat", -2}, {"first", F_FIRST}, {"float", F_FLOAT}, {"forceescape", -2},
    {"format", -2}, {"groupby", -2}, {"indent", F_INDENT}, {"int", F_INT}, {"items", F_ITEMS}, {"join", F_JOIN},
    {"last", F_LAST}, {"length", F_LENGTH}, {"list", F_LIST}, {"lower", F_LOWER}, {"map", F_MAP}, {"max", F_MAX},
    {"min", F_MIN}, {"pprint", -2}, {"random", -2}, {"reject", F_REJECT}, {"rejectattr", F_REJECTATTR},
    {"replace", F_REPLACE}, {"reverse", F_REVERSE}, {"round", F_ROUND}, {"safe", -2}, {"select", F_SELECT},
    {"selectattr", F_SELECTATTR}, {"slice", -2}, {"sort", F_SORT}, {"string", F_STRING}, {"striptags", -2},
    {"sum", F_SUM}, {"title", F_TITLE}, {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"truncate", -2},
    {"unique", F_UNIQUE}, {"upper", F_UPPER}, {"urlencode", -2}, {"urlize", -2}, {"wordcount", -2},
    {"wordwrap", -2}, {"xmlattr", -2},
};

int jinja_filter_id(jstr name) {
    for (size_t i = 0; i < sizeof k_filters / sizeof k_filters[0]; i++)
        if (js_eqc(name, k_filters[i].name)) return k_filters[i].id;
    return -1;
}

static int to_str(jrender *r, jval v, jstr *out) { return jv_to_str(r, v, out); }

/* jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0 (item first, as obj[k]). */
static int attr_get(jrender *r, jval item, jval attribute, jval *out) {
    if (attribute.t != V_STR) return jv_getitem(r, item, attribute, out);
    jstr s = attribute.u.s;
    size_t start = 0;
    for (size_t i = 0; i <= s.n; i++) {
        if (i < s.n && s.p[i] != '.') continue;
        jstr part = js_sub(s, start, i);
        jval key = jv_str(part);
        int digits = part.n > 0 && part.n < 18;
        long long number = 0;
        for (size_t k = 0; k < part.n && digits; k++) {
            digits = part.p[k] >= '0' && part.p[k] <= '9';
            number = number * 10 + (part.p[k] - '0');
        }
        if (digits) key = jv_int(number);
        if (jv_getitem(r, item, key, &item) != 0) return -1;
        start = i + 1;
    }
    *out = item;
    return 0;
}

/* ---- sorting (stable, by Python's <) ---- */

typedef struct {
    jval key, val;
} keyed;

static int key_for(jrender *r, jval item, const jval *attribute, int case_sensitive, jval *key) {
    if (attribute && attr_get(r, item, *attribute, &item) != 0) return -1;
    if (!case_sensitive && item.t == V_STR) {
        jstr low;
        if (js_case(r, item.u.s, CASE_LOWER, &low) != 0) return -1;
        item = jv_str(low);
    }
    *key = item;
    return 0;
}

/* Whether x goes before y (strictly). */
static int precedes(jrender *r, const keyed *x, const keyed *y, int reverse, int *yes) {
    int cmp;
    if (jv_order(r, reverse ? y->key : x->key, reverse ? x->key : y->key, &cmp) != 0) return -1;
    *yes = cmp == -1;
    return 0;
}

static int merge_sort(jrender *r, keyed *v, keyed *tmp, int n, int reverse) {
    if (n < 2) return 0;
    int h = n / 2;
    if (merge_sort(r, v, tmp, h, reverse) != 0 || merge_sort(r, v + h, tmp, n - h, reverse) != 0) return -1;
    int i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int first;
        if (precedes(r, &v[j], &v[i], reverse, &first) != 0) return -1;
        tmp[k++] = first ? v[j++] : v[i++];
    }
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, sizeof *v * (size_t)n);
    return 0;
}

static int sorted_keyed(jrender *r, keyed *v, int n, int reverse) {
    keyed *tmp = n ? jr_alloc(r, sizeof *tmp * (size_t)n) : NULL;
    if (n && !tmp) return -1;
    if (jr_charge(r, n) != 0) return -1;
    return merge_sort(r, v, tmp, n, reverse);
}

static jval tuple2(jrender *r, jval a, jval b) {
    jval t = jv_list(r, L_TUPLE, 2);
    if (t.u.l) {
        t.u.l->v[0] = a;
        t.u.l->v[1] = b;
    }
    return t;
}

/* ---- filters ---- */

#define BIND(fname, ...)                                                                                    \
    static const char *const params_[] = {__VA_ARGS__};                                                    \
    jval p[sizeof params_ / sizeof params_[0]];                                                            \
    int given[sizeof params_ / sizeof params_[0]];                                                         \
    if (jinja_bind(r, "filter", fname, a, params_, (int)(sizeof params_ / sizeof params_[0]), p, given) != 0) \
        return -1

static int f_items(jrender *r, jval v, jval *out) {
    if (v.t == V_UNDEF) {
        *out = jv_list(r, L_ITER, 0);
        return out->u.l ? 0 : -1;
    }
    if (v.t != V_DICT) return jr_fail(r, "Can only get item pairs from a mapping.");
    jval l = jv_list(r, L_ITER, v.u.d->n);
    if (!l.u.l) return -1;
    for (int i = 0; i < v.u.d->n; i++)
        if (!(l.u.l->v[i] = tuple2(r, v.u.d->k[i], v.u.d->v[i])).u.l) return -1;
    *out = l;
    return 0;
}

static int f_join(jrender *r, jstr name, jval v, const jargs *a, jval *out) {
    BIND(name, "d", "attribute");
    jstr sep = JS_C("");
    if (given[0] && to_str(r, p[0], &sep) != 0) return -1;
    const jval *items;
    int n;
    if (jv_items(r, v, &items, &n) != 0) return -1;
    jbuf b = {0};
    for (int i = 0; i < n; i++) {
        jval item = items[i];
        jstr s;
        if ((given[1] && p[1].t != V_NONE && attr_get(r, item, p[1], &item) != 0) || to_str(r, item, &s) != 0 ||
            (i && jb_put(r, &b, sep) != 0) || jb_put(r, &b, s) != 0)
            return -1;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

static int f_first_last(jrender *r, int last, jval v, jval *out) {
    if (last && v.t == V_LIST && v.u.l->kind == L_ITER) return jr_fail(r, "'generator' object is not reversible");
    if (!last && v.t == V_LIST && v.u.l->kind == L_ITER) { /* next() takes one item of a generator */
        jlist *l = v.u.l;
        if (l->pos < l->n) {
            *out = l->v[l->pos++];
            return 0;
        }
    } else {
        const jval *items;
        int n;
        if (jv_items(r, v, &items, &n) != 0) return -1;
        if (n) {
            *out = items[last ? n - 1 : 0];
            return 0;
        }
    }
    *out = jv_undef(last ? JS_C("No last item, sequence was empty.") : JS_C("No first item, sequence was empty."));
    return 0;
}

/* Python's int(text, base): optional sign, the base's prefix (0x, 0o, 0b; base 0 takes it from
 * the prefix), digits with single underscores between them. -1 when the text is not one, -2 on
 * an error. */
static int parse_int(jrender *r, jstr s, int base, jval *out) {
    jstr t;
    if (js_strip(r, s, NULL, 1, 1, &t) != 0) return -2;
    size_t i = 0;
    int neg = 0;
    if (i < t.n && (t.p[i] == '+' || t.p[i] == '-')) neg = t.p[i++] == '-';
    if (i + 1 < t.n && t.p[i] == '0') {
        char p = (char)(t.p[i + 1] | 0x20);
        int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == 0 || base == pb)) {
            base = pb;
            i += 2;
            if (i < t.n && t.p[i] == '_') i++;
        }
    }
    if (base == 0) { /* decimal, and no leading zeros but for zero itself */
        base = 10;
        for (size_t k = i; k + 1 < t.n && t.p[k] == '0'; k++)
            if (t.p[k + 1] != '0' && t.p[k + 1] != '_') return -1;
    }
    if (base < 2 || base > 36 || i >= t.n) return -1;
    unsigned long long v = 0;
    for (size_t k = i; k < t.n; k++) {
        char c = t.p[k];
        if (c == '_' && k > i && k + 1 < t.n && t.p[k - 1] != '_') continue;
        int d = c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
        if (d >= base || v > (9223372036854775807ULL - (unsigned)d) / (unsigned)base) return -1;
        v = v * (unsigned)base + (unsigned)d;
    }
    *out = jv_int(neg ? -(long long)v : (long long)v);
    return 0;
}

/* Python's float(text). -1 when the text is not one, -2 on an error. */
static int parse_float(jrender *r, jstr s, jval *out) {
    jstr t;
    if (js_strip(r, s, NULL, 1, 1, &t) != 0) return -2;
    char buf[128];
    size_t k = 0;
    if (t.n == 0 || t.n >= sizeof buf) return -1;
    for (size_t i = 0; i < t.n; i++) {
        char c = t.p[i];
        int digit_before = i > 0 && t.p[i - 1] >= '0' && t.p[i - 1] <= '9';
        int digit_after = i + 1 < t.n && t.p[i + 1] >= '0' && t.p[i + 1] <= '9';
        if (c == '_' && digit_before && digit_after) continue;
        if ((unsigned char)c >= 0x80 || c == '_' || c == 'x' || c == 'X') return -1;
        buf[k++] = c;
    }
    buf[k] = 0;
    char *end;
    double d = strtod(buf, &end);
    if (*end || end == buf) return -1;
    *out = jv_float(d);
    return 0;
}

static int f_int_float(jrender *r, int is_float, jstr name, jval v, const jargs *a, jval *out) {
    BIND(name, "default", "base");
    if (is_float && given[1]) return jr_fail(r, "filter float takes at most 1 argument (default)");
    jval def = given[0] ? p[0] : is_float ? jv_float(0) : jv_int(0);
    long long base = 10;
    if (given[1] && jinja_int_arg(r, p[1], "base", &base) != 0) return -1;
    switch (v.t) {
    case V_UNDEF: return jr_fail(r, "%.*s", (int)v.u.s.n, v.u.s.p);
    case V_BOOL:
    case V_INT: *out = is_float ? jv_float((double)v.u.i) : jv_int(v.u.i); return 0;
    case V_FLOAT:
        if (is_float) *out = v;
        else if (isnan(v.u.f)) *out = def;
        else if (!(fabs(v.u.f) < 9.2e18)) return jr_fail(r, "cannot convert float infinity to integer");
        else *out = jv_int((long long)v.u.f);
        return 0;
    case V_STR: {
        jval n;
        int rc = is_float ? parse_float(r, v.u.s, &n) : parse_int(r, v.u.s, (int)base, &n);
        if (rc == 0) {
            *out = n;
            return 0;
        }
        if (rc == -1 && !is_float && (rc = parse_float(r, v.u.s, &n)) == 0 && fabs(n.u.f) < 9.2e18 && !isnan(n.u.f)) {
            *out = jv_int((long long)n.u.f);
            return 0;
        }
        if (rc == -2) return -1;
        *out = def;
        return 0;
    }
    default: *out = def; return 0;
    }
}

static int f_indent(jrender *r, jstr name, jval v, const jargs *a, jval *out) {
    BIND(name, "width", "first", "blank");
    jstr s, ind;
    if (v.t == V_UNDEF) return jr_fail(r, "%.*s", (int)v.u.s.n, v.u.s.p);
    if (v.t != V_STR) return jr_fail(r, "indent: unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(v));
    s = v.u.s;
    if (given[0] && p[0].t == V_STR) {
        ind = p[0].u.s;
    } else {
        long long w = 4;
        if (given[0] && jinja_int_arg(r, p[0], "width", &w) != 0) return -1;
        jbuf sp = {0};
        for (long long i = 0; i < w; i++)
            if (jb_putc(r, &sp, " ", 1, 0) != 0) return -1;
        ind = jb_str(&sp);
    }
    jstr nl = JS_C("\n"), whole;
    if (js_concat(r, s, nl, &whole) != 0) return -1;
    jval lines;
    if (js_splitlines(r, whole, 0, &lines) != 0) return -1;
    jbuf b = {0};
    if (given[1] && jv_truthy(p[1]) && jb_put(r, &b, ind) != 0) return -1;
    for (int i = 0; i < lines.u.l->n; i++) {
        jstr line = lines.u.l->v[i].u.s;
        if (i && jb_put(r, &b, nl) != 0) return -1;
        if (i && (line.n || (given[2] && jv_truthy(p[2]))) && jb_put(r, &b, ind) != 0) return -1;
        if (jb_put(r, &b, line) != 0) return -1;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

/* select / reject / selectattr / rejectattr / map: a generator over the items. */
static int f_select(jrender *r, int id, jstr name, jval v, const jargs *a, jval *out) {
    int attr_mode = id == F_SELECTATTR || id == F_REJECTATTR, keep_if = id == F_SELECT || id == F_SELECTATTR;
    jval attribute = jv_none();
    int first_test = 0;
    if (attr_mode) {
        if (a->n < 1) return jr_fail(r, "filter %.*s needs an attribute name", (int)name.n, name.p);
        attribute = a->args[0];
        first_test = 1;
    }
    if (a->n_kw) return jr_fail(r, "filter %.*s takes no keyword arguments", (int)name.n, name.p);
    int test = -3;
    jstr test_name = JS_C("");
    if (a->n > first_test) {
        if (a->args[first_test].t != V_STR) return jr_fail(r, "filter %.*s: the test must be named", (int)name.n, name.p);
        test_name = a->args[first_test].u.s;
        test = jinja_test_id(test_name);
        if (test == -1) return jr_fail(r, "No test named '%.*s'.", (int)test_name.n, test_name.p);
        if (test == -2) return jr_fail(r, "the test \"%.*s\" is not supported", (int)test_name.n, test_name.p);
    }
    int n_targs = a->n > first_test ? a->n - first_test - 1 : 0;
    jargs targs = {n_targs ? a->args + first_test + 1 : NULL, n_targs, NULL, NULL, 0};
    const jval *items;
    int n;
    if (jv_items(r, v, &items, &n) != 0) return -1;
    jval res = jv_list(r, L_ITER, n);
    if (!res.u.l) return -1;
    int k = 0;
    for (int i = 0; i < n; i++) {
        jval x = items[i];
        int yes;
        if (attr_mode && attr_get(r, x, attribute, &x) != 0) return -1;
        if (test == -3) yes = jv_truthy(x);
        else if (jinja_apply_test(r, test, test_name, x, &targs, &yes) != 0) return -1;
        if (yes == keep_if) res.u.l->v[k++] = items[i];
    }
    res.u.l->n = k;
    *out = res;
    return 0;
}

static int f_map(jrender *r, jstr name, jval v, const jargs *a, jval *out) {
    jval attribute = jv_none(), def = jv_none();
    int by_attr = 0, has_def = 0, filter = -1;
    jstr fname = JS_C("");
    for (int k = 0; k < a->n_kw; k++) {
        if (js_eqc(a->names[k], "attribute")) attribute = a->kwargs[k], by_attr = 1;
        else if (js_eqc(a->names[k], "default")) def = a->kwargs[k], has_def = 1;
    }
    if (!by_attr) {
        if (a->n < 1 || a->args[0].t != V_STR) return jr_fail(r, "map requires a filter argument");
        fname = a->args[0].u.s;
        filter = jinja_filter_id(fname);
        if (filter == -1) return jr_fail(r, "No filter named '%.*s'.", (int)fname.n, fname.p);
        if (filter == -2) return jr_fail(r, "the filter \"%.*s\" is not supported", (int)fname.n, fname.p);
    } else if (a->n || a->n_kw > 1 + has_def) {
        return jr_fail(r, "filter %.*s: unexpected arguments with attribute=", (int)name.n, name.p);
    }
    jargs fargs = {a->n > 1 ? a->args + 1 : NULL, a->n ? a->n - 1 : 0, a->names, a->kwargs, a->n_kw};
    const jval *items;
    int n;
    if (jv_items(r, v, &items, &n) != 0) return -1;
    jval res = jv_list(r, L_ITER, n);
    if (!res.u.l) return -1;
    for (int i = 0; i < n; i++) {
        jval x = items[i];
        if (by_attr) {
            if (attr_get(r, x, attribute, &x) != 0) return -1;
            if (has_def && x.t == V_UNDEF) x = def;
        } else if (jinja_apply_filter(r, filter, fname, x, &fargs, &x) != 0) {
            return -1;
        }
        res.u.l->v[i] = x;
    }
    *out = res;
    return 0;
}

static int f_sort(jrender *r, int id, jstr name, jval v, const jargs *a, jval *out) {
    const jval *items;
    int n;
    jval p[4];
    int given[4], reverse, cs;
    keyed *kv;
    if (id == F_DICTSORT) {
        static const char *const params[] = {"case_sensitive", "by", "reverse"};
        if (jinja_bind(r, "filter", name, a, params, 3, p, given) != 0) return -1;
        int by_value = given[1] && p[1].t == V_STR && js_eqc(p[1].u.s, "value");
        if (given[1] && !by_value && !(p[1].t == V_STR && js_eqc(p[1].u.s, "key")))
            return jr_fail(r, "You can only sort by either \"key\" or \"value\"");
        if (v.t != V_DICT) return jr_fail(r, "dictsort: '%s' object has no attribute 'items'", jv_type_name(v));
        cs = jv_truthy(p[0]);
        reverse = jv_truthy(p[2]);
        n = v.u.d->n;
        if (!(kv = n ? jr_alloc(r, sizeof *kv * (size_t)n) : NULL) && n) return -1;
        for (int i = 0; i < n; i++) {
            kv[i].val = tuple2(r, v.u.d->k[i], v.u.d->v[i]);
            if (!kv[i].val.u.l || key_for(r, by_value ? v.u.d->v[i] : v.u.d->k[i], NULL, cs, &kv[i].key) != 0)
                return -1;
        }
    } else {
        static const char *const params[] = {"reverse", "case_sensitive", "attribute"};
        if (jinja_bind(r, "filter", name, a, params, 3, p, given) != 0) return -1;
        reverse = jv_truthy(p[0]);
        cs = jv_truthy(p[1]);
        if (jv_items(r, v, &items, &n) != 0) return -1;
        if (!(kv = n ? jr_alloc(r, sizeof *kv * (size_t)n) : NULL) && n) return -1;
        for (int i = 0; i < n; i++) {
            kv[i].val = items[i];
            if (key_for(r, items[i], given[2] && p[2].t != V_NONE ? &p[2] : NULL, cs, &kv[i].key) != 0) return -1;
        }
    }
    if (sorted_keyed(r, kv, n, reverse) != 0) return -1;
    jval res = jv_list(r, L_LIST, n);
    if (!res.u.l) return -1;
    for (int i = 0; i < n; i++) res.u.l->v[i] = kv[i].val;
    *out = res;
    return 0;
}

static int f_min_max(jrender *r, int is_max, jstr name, jval v, const jargs *a, jval *out) {
    BIND(name, "case_sensitive", "attribute");
    const jval *items;
    int n;
    if (jv_items(r, v, &items, &n) != 0) return -1;
    if (n == 0) {
        *out = jv_undef(JS_C("No aggregated item, sequence was empty."));
        return 0;
    }
    int best = 0;
    jval best_key;
    const jval *attr = given[1] && p[1].t != V_NONE ? &p[1] : NULL;
    if (key_for(r, items[0], attr, jv_truthy(p[0]), &best_key) != 0) return -1;
    for (int i = 1; i < n; i++) {
        jval key;
        int cmp;
        if (key_for(r, items[i], attr, jv_truthy(p[0]), &key) != 0 ||
            jv_order(r, is_max ? best_key : key, is_max ? key : best_key, &cmp) != 0)
            return -1;
        if (cmp == -1) {
            best = i;
            best_key = key;
        }
    }
    *out = items[best];
    return 0;
}

static int f_unique(jrender *r, jstr name, jval v, const jargs *a, jval *out) {
    BIND(name, "case_sensitive", "attribute");
    const jval *items;
    int n;
    if (jv_items(r, v, &items, &n) != 0) return -1;
    jval res = jv_list(r, L_ITER, n), seen = jv_dict(r, n); /* seen keys, looked up as a set */
    if (!res.u.l || !seen.u.d) return -1;
    int k = 0;
    for (int i = 0; i < n; i++) {
        jval key, found;
        if (key_for(r, items[i], given[1] && p[1].t != V_NONE ? &p[1] : NULL, jv_truthy(p[0]), &key) != 0) return -1;
        int rc = jv_dict_get(r, seen.u.d, key, &found);
        if (rc < 0) return -1;
        if (rc == 1) {
            seen.u.d->k[seen.u.d->n] = key;
            seen.u.d->v[seen.u.d->n++] = key;
            res.u.l->v[k++] = items[i];
        }
    }
    res.u.l->n = k;
    *out = res;
    return 0;
}

static int f_reverse(jrender *r, jval v, jval *out) {
    if (v.t == V_STR) {
        jval bounds[3] = {jv_none(), jv_none(), jv_int(-1)};
        return jv_slice(r, v, bounds, out);
    }
    int iter = !(v.t == V_LIST && v.u.l->kind == L_ITER); /* a sequence gives a reverse iterator */
    const jval *items;
    int n;
    if (v.t != V_LIST && v.t != V_DICT && v.t != V_UNDEF) return jr_fail(r, "argument must be iterable");
    if (jv_items(r, v, &items, &n) != 0) return -1;
    jval res = jv_list(r, iter ? L_ITER : L_LIST, n);
    if (!res.u.l) return -1;
    for (int i = 0; i < n; i++) res.u.l->v[i] = items[n - 1 - i];
    *out = res;
    return 0;
}

/* Decimal digits rounded to a multiple of 10^k, half to even on the exact value (more_after: the
 * value goes on past the digits, so it is above any tie), as text into out. */
static void round_digits(const char *digits, int k, int more_after, char *out, size_t cap) {
    char d[720];
    size_t n = strlen(digits), pad = n < (size_t)k + 1 ? (size_t)k + 1 - n : 0; /* a head digit at least */
    memset(d, '0', pad);
    memcpy(d + pad, digits, n + 1);
    size_t len = n + pad, head = len - (size_t)k;
    int cmp = d[head] - '5';
    for (size_t i = head + 1; cmp == 0 && i < len; i++) cmp = d[i] != '0';
    if (cmp == 0 && more_after) cmp = 1;
    int up = cmp > 0 || (cmp == 0 && (d[head - 1] - '0') % 2 == 1);
    d[head] = 0;
    for (size_t i = head; up && i-- > 0;) {
        if (d[i] == '9') {
            d[i] = '0';
        } else {
            d[i]++;
            up = 0;
        }
    }
    size_t at = (size_t)snprintf(out, cap, "%s%s", up ? "1" : "", d);
    for (int z = 0; z < k && at + 1 < cap; z++) out[at++] = '0';
    out[at] = 0;
}

/* Python's round(v, precision) ("common"). */
static int round_common(jrender *r, jval v, long long prec, jval *out) {
    char digits[400], res[800];
    if (v.t != V_FLOAT) {
        if (prec >= 0) {
            *out = jv_int(v.u.i);
            return 0;
        }
        if (prec < -18) return jr_fail(r, "round: precision %lld is not supported on integers", prec);
        unsigned long long mag = v.u.i < 0 ? 0 - (unsigned long long)v.u.i : (unsigned long long)v.u.i;
        snprintf(digits, sizeof digits, "%llu", mag);
        round_digits(digits, (int)-prec, 0, res, sizeof res);
        errno = 0;
        unsigned long long m = strtoull(res, NULL, 10);
        if (errno || m > 9223372036854775807ULL) return jr_fail(r, "integer overflow");
        *out = jv_int(v.u.i < 0 ? -(long long)m : (long long)m);
        return 0;
    }
    double x = v.u.f;
    if (!isfinite(x) || prec > 323) {
        *out = v;
        return 0;
    }
    if (prec >= 0) {
        snprintf(res, sizeof res, "%.*f", (int)prec, x); /* correctly rounded, half to even */
        *out = jv_float(strtod(res, NULL));
        return 0;
    }
    if (prec < -308) {
        *out = jv_float(copysign(0.0, x));
        return 0;
    }
    double ip = trunc(fabs(x));
    snprintf(digits, sizeof digits, "%.0f", ip); /* the integer part, exactly */
    round_digits(digits, (int)-prec, fabs(x) > ip, res, sizeof res);
    *out = jv_float(copysign(strtod(res, NULL), x));
    return 0;
}

static int f_round(jrender *r, jstr name, jval v, const jargs *a, jval *out) {
    BIND(name, "precision", "method");
    long long prec = 0;
    if (given[0] && jinja_int_arg(r, p[0], "precision", &prec) != 0) return -1;
    int method = 0; /* common, ceil, floor */
    if (given[1]) {
        if (p[1].t == V_STR && js_eqc(p[1].u.s, "ceil")) method = 1;
        else if (p[1].t == V_STR && js_eqc(p[1].u.s, "floor")) method = 2;
        else if (!(p[1].t == V_STR && js_eqc(p[1].u.s, "common")))
            return jr_fail(r, "method must be common, ceil or floor");
    }
    if (v.t == V_UNDEF) return jr_fail(r, "%.*s", (int)v.u.s.n, v.u.s.p);
    if (!jv_is_num(v)) return jr_fail(r, "type %s doesn't define __round__ method", jv_type_name(v));
    if (!method) return round_common(r, v, prec, out);
    if (prec < -300 || prec > 300) return jr_fail(r, "round: precision %lld is not supported", prec);
    double scale = pow(10.0, (double)prec), x = (v.t == V_FLOAT ? v.u.f : (double)v.u.i) * scale;
    *out = jv_float((method == 1 ? ceil(x) : floor(x)) / scale);
    return 0;
}

static int f_sum(jrender *r, jstr name, jval v, const jargs *a, jval *out) {
    BIND(name, "attribute", "start");
    const jval *items;
    int n;
    jval acc = given[1] ? p[1] : jv_int(0);
    if (acc.t == V_STR) return jr_fail(r, "sum() can't sum strings [use ''.join(seq) instead]");
    if (jv_items(r, v, &items, &n) != 0) return -1;
    for (int i = 0; i < n; i++) {
        jval x = items[i];
        if (given[0] && p[0].t != V_NONE && attr_get(r, x, p[0], &x) != 0) return -1;
        if (jinja_binop(r, T_ADD, acc, x, &acc) != 0) return -1;
    }
    *out = acc;
    return 0;
}

static int f_tojson(jrender *r, jstr name, jval v, const jargs *a, jval *out) {
    BIND(name, "ensure_ascii", "indent", "separators", "sort_keys");
    jstr indent, *ind = NULL, item_sep = JS_C(", "), key_sep = JS_C(": ");
    if (p[1].t == V_STR) {
        indent = p[1].u.s;
        ind = &indent;
    } else if (p[1].t != V_NONE) {
        long long w;
        if (jinja_int_arg(r, p[1], "indent", &w) != 0) return -1;
        jbuf sp = {0};
        for (long long i = 0; i < w; i++)
            if (jb_putc(r, &sp, " ", 1, 0) != 0) return -1;
        indent = jb_str(&sp);
        ind = &indent;
        item_sep = JS_C(",");
    }
    if (p[1].t == V_STR) item_sep = JS_C(",");
    if (p[2].t != V_NONE) {
        const jval *seps;
        int n;
        if (jv_items(r, p[2], &seps, &n) != 0 || n != 2 || seps[0].t != V_STR || seps[1].t != V_STR)
            return jr_fail(r, "tojson: separators must be a pair of strings");
        item_sep = seps[0].u.s;
        key_sep = seps[1].u.s;
    }
    jbuf b = {0};
    if (jv_to_json(r, &b, v, jv_truthy(p[0]), ind, item_sep, key_sep, jv_truthy(p[3]), 0) != 0) return -1;
    *out = jv_str(jb_str(&b));
    return 0;
}

static int f_text(jrender *r, int id, jstr name, jval v, const jargs *a, jval *out) {
    jstr s, res;
    if (to_str(r, v, &s) != 0) return -1;
    switch (id) {
    case F_TRIM: {
        BIND(name, "chars");
        if (p[0].t != V_NONE && p[0].t != V_STR) return jr_fail(r, "strip arg must be None or str");
        if (js_strip(r, s, p[0].t == V_STR ? &p[0].u.s : NULL, 1, 1, &res) != 0) return -1;
        break;
    }
    case F_REPLACE: {
        BIND(name, "old", "new", "count");
        jstr old, rep;
        long long count = -1;
        if (!given[0] || !given[1]) return jr_fail(r, "filter replace needs old and new");
        if (to_str(r, p[0], &old) != 0 || to_str(r, p[1], &rep) != 0) return -1;
        if (given[2] && p[2].t != V_NONE && jinja_int_arg(r, p[2], "count", &count) != 0) return -1;
        if (js_replace(r, s, old, rep, (long)count, &res) != 0) return -1;
        break;
    }
    default: {
        if (a->n || a->n_kw) return jr_fail(r, "filter %.*s takes no arguments", (int)name.n, name.p);
        int mode = id == F_LOWER ? CASE_LOWER : id == F_UPPER ? CASE_UPPER : id == F_TITLE ? CASE_TITLE_WORDS
                                                                                           : CASE_CAPITALIZE;
        if (js_case(r, s, mode, &res) != 0) return -1;
    }
    }
    *out = jv_str(res);
    return 0;
}

static int no_args(jrender *r, jstr name, const jargs *a) {
    return a->n || a->n_kw ? jr_fail(r, "filter %.*s takes no arguments", (int)name.n, name.p) : 0;
}

int jinja_apply_filter(jrender *r, int id, jstr name, jval v, const jargs *a, jval *out) {
    if (jr_charge(r, 1 + (v.t == V_STR ? cost_scan(v.u.s.n) : 0)) != 0) return -1;
    switch (id) {
    case F_ABS:
        if (no_args(r, name, a) != 0) return -1;
        if (v.t == V_FLOAT) *out = jv_float(fabs(v.u.f));
        else if ((v.t == V_INT || v.t == V_BOOL) && v.u.i != LLONG_MIN) *out = jv_int(llabs(v.u.i));
        else return jr_fail(r, "bad operand type for abs(): '%s'", jv_type_name(v));
        return 0;
    case F_ATTR: { /* Python's getattr(): a dict's keys are not attributes */
        BIND(name, "name");
        jstr an;
        if (to_str(r, p[0], &an) != 0) return -1;
        if (v.t == V_DICT && jinja_method_id(v, an) == -2) {
            *out = jv_undef(JS_C("'dict object' has no attribute"));
            return 0;
        }
        return jv_getattr(r, v, an, out);
    }
    case F_DEFAULT: {
        BIND(name, "default_value", "boolean");
        int use = v.t == V_UNDEF || (jv_truthy(p[1]) && !jv_truthy(v));
        *out = use ? (given[0] ? p[0] : jv_str(JS_C(""))) : v;
        return 0;
    }
    case F_FIRST:
    case F_LAST: return no_args(r, name, a) != 0 ? -1 : f_first_last(r, id == F_LAST, v, out);
    case F_INT:
    case F_FLOAT: return f_int_float(r, id == F_FLOAT, name, v, a, out);
    case F_INDENT: return f_indent(r, name, v, a, out);
    case F_ITEMS: return no_args(r, name, a) != 0 ? -1 : f_items(r, v, out);
    case F_JOIN: return f_join(r, name, v, a, out);
    case F_LENGTH: {
        long n;
        if (no_args(r, name, a) != 0 || jv_len(r, v, &n) != 0) return -1;
        *out = jv_int(n);
        return 0;
    }
    case F_LIST: {
        const jval *items;
        int n;
        if (no_args(r, name, a) != 0 || jv_items(r, v, &items, &n) != 0) return -1;
        jval l = jv_list(r, L_LIST, n);
        if (!l.u.l) return -1;
        if (n) memcpy(l.u.l->v, items, sizeof(jval) * (size_t)n);
        *out = l;
        return 0;
    }
    case F_MAP: return f_map(r, name, v, a, out);
    case F_MAX:
    case F_MIN: return f_min_max(r, id == F_MAX, name, v, a, out);
    case F_REJECT:
    case F_REJECTATTR:
    case F_SELECT:
    case F_SELECTATTR: return f_select(r, id, name, v, a, out);
    case F_REVERSE: return no_args(r, name, a) != 0 ? -1 : f_reverse(r, v, out);
    case F_ROUND: return f_round(r, name, v, a, out);
    case F_DICTSORT:
    case F_SORT: return f_sort(r, id, name, v, a, out);
    case F_STRING: {
        jstr s;
        if (no_args(r, name, a) != 0 || to_str(r, v, &s) != 0) return -1;
        *out = jv_str(s);
        return 0;
    }
    case F_SUM: return f_sum(r, name, v, a, out);
    case F_TOJSON: return f_tojson(r, name, v, a, out);
    case F_UNIQUE: return f_unique(r, name, v, a, out);
    default: return f_text(r, id, name, v, a, out);
    }
}
