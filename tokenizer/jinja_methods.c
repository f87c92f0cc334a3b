/* Methods of str, dict, list and tuple values as chat templates call them (message.content.strip(),
 * message.get('tool_calls'), ...). Python's other methods are known by name: calling one fails
 * naming it, and the ones jinja2's immutable sandbox refuses (list.append, dict.update, ...) are
 * undefined, as there. */
#include <string.h>

#include "jinja_internal.h"

enum {
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_SPLITLINES, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_SWAPCASE, M_REPLACE, M_FIND, M_RFIND, M_INDEX, M_RINDEX, M_COUNT, M_JOIN,
    M_ISALPHA, M_ISDIGIT, M_ISALNUM, M_ISSPACE, M_ISLOWER, M_ISUPPER, M_REMOVEPREFIX, M_REMOVESUFFIX,
    M_GET, M_ITEMS, M_KEYS, M_VALUES, M_LIST_COUNT, M_LIST_INDEX, M_COPY,
};

typedef struct {
    const char *name;
    int id;
} method;

static const method k_str[] = {
    {"capitalize", M_CAPITALIZE}, {"casefold", -1}, {"center", -1}, {"count", M_COUNT}, {"encode", -1},
    {"endswith", M_ENDSWITH}, {"expandtabs", -1}, {"find", M_FIND}, {"format", -1}, {"format_map", -1},
    {"index", M_INDEX}, {"isalnum", M_ISALNUM}, {"isalpha", M_ISALPHA}, {"isascii", -1}, {"isdecimal", -1},
    {"isdigit", M_ISDIGIT}, {"isidentifier", -1}, {"islower", M_ISLOWER}, {"isnumeric", -1}, {"isprintable", -1},
    {"isspace", M_ISSPACE}, {"istitle", -1}, {"isupper", M_ISUPPER}, {"join", M_JOIN}, {"ljust", -1},
    {"lower", M_LOWER}, {"lstrip", M_LSTRIP}, {"maketrans", -1}, {"partition", -1},
    {"removeprefix", M_REMOVEPREFIX}, {"removesuffix", M_REMOVESUFFIX}, {"replace", M_REPLACE},
    {"rfind", M_RFIND}, {"rindex", M_RINDEX}, {"rjust", -1}, {"rpartition", -1}, {"rsplit", M_RSPLIT},
    {"rstrip", M_RSTRIP}, {"split", M_SPLIT}, {"splitlines", M_SPLITLINES}, {"startswith", M_STARTSWITH},
    {"strip", M_STRIP}, {"swapcase", M_SWAPCASE}, {"title", M_TITLE}, {"translate", -1}, {"upper", M_UPPER},
    {"zfill", -1},
};
static const method k_dict[] = {
    {"clear", -3}, {"copy", M_COPY}, {"fromkeys", -1}, {"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS},
    {"pop", -3}, {"popitem", -3}, {"setdefault", -3}, {"update", -3}, {"values", M_VALUES},
};
static const method k_list[] = {
    {"append", -3}, {"clear", -3}, {"copy", M_COPY}, {"count", M_LIST_COUNT}, {"extend", -3},
    {"index", M_LIST_INDEX}, {"insert", -3}, {"pop", -3}, {"remove", -3}, {"reverse", -3}, {"sort", -3},
};
static const method k_tuple[] = {{"count", M_LIST_COUNT}, {"index", M_LIST_INDEX}};

static int find_method(const method *t, size_t n, jstr name) {
    for (size_t i = 0; i < n; i++)
        if (js_eqc(name, t[i].name)) return t[i].id;
    return -2;
}

int jinja_method_id(jval self, jstr name) {
#define FIND(t) find_method(t, sizeof t / sizeof t[0], name)
    switch (self.t) {
    case V_STR: return FIND(k_str);
    case V_DICT: return FIND(k_dict);
    case V_LIST:
        if (self.u.l->kind == L_LIST) return FIND(k_list);
        if (self.u.l->kind == L_TUPLE || self.u.l->kind == L_RANGE) return FIND(k_tuple);
        return -2;
    default: return -2;
    }
#undef FIND
}

/* Python's s[start:end] for the optional start / end of find, count, startswith...: the byte
 * range and the character offset of its start. -1 when they are out of the string (start beyond
 * its end). */
static int sub_range(jrender *r, jstr s, jval start, jval end, size_t *a, size_t *b, long *a_char, int *outside) {
    long n = js_chars(s);
    long long v[2] = {0, n};
    jval in[2] = {start, end};
    *outside = 0;
    for (int k = 0; k < 2; k++) {
        if (in[k].t == V_NONE) continue;
        if (jinja_int_arg(r, in[k], k ? "end" : "start", &v[k]) != 0) return -1;
        if (v[k] < 0) v[k] = v[k] + n < 0 ? 0 : v[k] + n;
    }
    if (v[0] > n) *outside = 1;
    if (v[1] > n) v[1] = n;
    if (v[1] < v[0]) v[1] = v[0] > n ? n : v[0];
    if (v[0] > n) v[0] = n;
    *a = js_char_offset(s, (long)v[0]);
    *b = *a + js_char_offset(js_sub(s, *a, s.n), (long)(v[1] - v[0]));
    *a_char = (long)v[0];
    return 0;
}

static int str_arg(jrender *r, jval v, const char *what, jstr *out) {
    if (v.t == V_STR) {
        *out = v.u.s;
        return 0;
    }
    if (v.t == V_UNDEF) return jr_fail(r, "%.*s", (int)v.u.s.n, v.u.s.p);
    return jr_fail(r, "%s: must be str, not %s", what, jv_type_name(v));
}

static int starts_or_ends(jrender *r, int ends, jstr s, const jval *p, int *res) {
    size_t a, b;
    long ac;
    int outside;
    if (sub_range(r, s, p[1], p[2], &a, &b, &ac, &outside) != 0) return -1;
    const jval *options = &p[0];
    int n = 1;
    if (p[0].t == V_LIST && p[0].u.l->kind == L_TUPLE) {
        options = p[0].u.l->v;
        n = p[0].u.l->n;
    } else if (p[0].t != V_STR) {
        return jr_fail(r, "%s first arg must be str or a tuple of str, not %s", ends ? "endswith" : "startswith",
                       jv_type_name(p[0]));
    }
    *res = 0;
    for (int i = 0; i < n && !*res && !outside; i++) {
        jstr x;
        if (str_arg(r, options[i], "a tuple for startswith / endswith", &x) != 0) return -1;
        if (x.n <= b - a) *res = memcmp(s.p + (ends ? b - x.n : a), x.p, x.n) == 0;
    }
    return 0;
}

/* find, rfind, index, rindex, count over s[start:end]. */
static int search(jrender *r, int id, jstr s, const jval *p, jval *out) {
    jstr sub;
    size_t a, b;
    long ac;
    int outside;
    if (str_arg(r, p[0], "the substring", &sub) != 0 || sub_range(r, s, p[1], p[2], &a, &b, &ac, &outside) != 0)
        return -1;
    /* rfind compares at each position */
    if (jr_charge(r, (cost_compare(b - a) + 1) * (cost_compare(sub.n) + 1)) != 0) return -1;
    if (id == M_COUNT) {
        long count = 0;
        if (!outside && sub.n == 0) count = js_chars(js_sub(s, a, b)) + 1;
        for (size_t i = a; !outside && sub.n && i + sub.n <= b;) {
            const char *hit = memmem(s.p + i, b - i, sub.p, sub.n);
            if (!hit) break;
            count++;
            i = (size_t)(hit - s.p) + sub.n;
        }
        *out = jv_int(count);
        return 0;
    }
    long at = -1;
    if (!outside && sub.n <= b - a) {
        const char *hit = NULL;
        if (id == M_FIND || id == M_INDEX) {
            hit = memmem(s.p + a, b - a, sub.p, sub.n);
        } else {
            for (size_t i = b - sub.n + 1; i-- > a && !hit;)
                if (memcmp(s.p + i, sub.p, sub.n) == 0) hit = s.p + i;
        }
        if (hit) at = ac + js_chars(js_sub(s, a, (size_t)(hit - s.p)));
    }
    if (at < 0 && (id == M_INDEX || id == M_RINDEX)) return jr_fail(r, "substring not found");
    *out = jv_int(at);
    return 0;
}

static int str_join(jrender *r, jstr sep, jval iterable, jval *out) {
    const jval *items;
    int n;
    if (jv_items(r, iterable, &items, &n) != 0) return -1;
    jbuf b = {0};
    for (int i = 0; i < n; i++) {
        if (items[i].t != V_STR)
            return jr_fail(r, "sequence item %d: expected str instance, %s found", i, jv_type_name(items[i]));
        if ((i && jb_put(r, &b, sep) != 0) || jb_put(r, &b, items[i].u.s) != 0) return -1;
    }
    *out = jv_str(jb_str(&b));
    return 0;
}

/* isalpha, isdigit, ...: every character passes and there is at least one. */
static int str_is(jrender *r, int id, jstr s, jval *out) {
    if (js_prepare_locale(r, s) != 0) return -1;
    int ok = s.n > 0, cased = 0;
    for (size_t i = 0; i < s.n && ok;) {
        int len;
        uint32_t c = ju_decode(s.p, s.n, i, &len);
        int digit = c >= '0' && c <= '9';
        switch (id) {
        case M_ISALPHA: ok = js_is_alpha(r, c); break;
        case M_ISDIGIT: ok = digit; break;
        case M_ISALNUM: ok = digit || js_is_alpha(r, c); break;
        case M_ISSPACE: ok = ju_isspace(c); break;
        case M_ISLOWER: ok = !js_is_upper(r, c); cased |= js_is_lower(r, c); break;
        default: ok = !js_is_lower(r, c); cased |= js_is_upper(r, c); break;
        }
        i += (size_t)len;
    }
    *out = jv_bool(ok && (cased || (id != M_ISLOWER && id != M_ISUPPER)));
    return 0;
}

static int str_method(jrender *r, int id, jstr name, jstr s, const jargs *a, jval *out) {
    static const char *const none[] = {""}, *const chars[] = {"chars"}, *const split[] = {"sep", "maxsplit"},
                             *const affix[] = {"prefix", "start", "end"}, *const rep[] = {"old", "new", "count"},
                             *const sub[] = {"sub", "start", "end"}, *const one[] = {"x"},
                             *const keep[] = {"keepends"};
    const char *const *params = none;
    int np = 0;
    switch (id) {
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: params = chars, np = 1; break;
    case M_SPLIT: case M_RSPLIT: params = split, np = 2; break;
    case M_SPLITLINES: params = keep, np = 1; break;
    case M_STARTSWITH: case M_ENDSWITH: params = affix, np = 3; break;
    case M_REPLACE: params = rep, np = 3; break;
    case M_FIND: case M_RFIND: case M_INDEX: case M_RINDEX: case M_COUNT: params = sub, np = 3; break;
    case M_JOIN: case M_REMOVEPREFIX: case M_REMOVESUFFIX: params = one, np = 1; break;
    default: break;
    }
    jval p[3];
    int given[3];
    if (jinja_bind(r, "method", name, a, params, np, p, given) != 0) return -1;
    jstr res, x, y;
    int yes = 0;
    switch (id) {
    case M_STRIP:
    case M_LSTRIP:
    case M_RSTRIP:
        if (p[0].t != V_NONE && p[0].t != V_STR) return jr_fail(r, "strip arg must be None or str");
        if (js_strip(r, s, p[0].t == V_STR ? &p[0].u.s : NULL, id != M_RSTRIP, id != M_LSTRIP, &res) != 0) return -1;
        *out = jv_str(res);
        return 0;
    case M_SPLIT:
    case M_RSPLIT: {
        long long max = -1;
        if (p[0].t != V_NONE && str_arg(r, p[0], "the separator", &x) != 0) return -1;
        if (given[1] && jinja_int_arg(r, p[1], "maxsplit", &max) != 0) return -1;
        return js_split(r, s, p[0].t == V_NONE ? NULL : &x, (long)max, id == M_RSPLIT, out);
    }
    case M_SPLITLINES: return js_splitlines(r, s, jv_truthy(p[0]), out);
    case M_STARTSWITH:
    case M_ENDSWITH:
        if (!given[0]) return jr_fail(r, "%.*s takes at least 1 argument", (int)name.n, name.p);
        if (starts_or_ends(r, id == M_ENDSWITH, s, p, &yes) != 0) return -1;
        *out = jv_bool(yes);
        return 0;
    case M_UPPER:
    case M_LOWER:
    case M_TITLE:
    case M_CAPITALIZE:
    case M_SWAPCASE: {
        int mode = id == M_UPPER ? CASE_UPPER : id == M_LOWER ? CASE_LOWER : id == M_TITLE ? CASE_PY_TITLE
                   : id == M_SWAPCASE ? CASE_SWAP : CASE_CAPITALIZE;
        if (js_case(r, s, mode, &res) != 0) return -1;
        *out = jv_str(res);
        return 0;
    }
    case M_REPLACE: {
        long long count = -1;
        if (!given[0] || !given[1]) return jr_fail(r, "replace expected at least 2 arguments");
        if (str_arg(r, p[0], "replace", &x) != 0 || str_arg(r, p[1], "replace", &y) != 0) return -1;
        if (given[2] && jinja_int_arg(r, p[2], "count", &count) != 0) return -1;
        if (js_replace(r, s, x, y, (long)count, &res) != 0) return -1;
        *out = jv_str(res);
        return 0;
    }
    case M_FIND:
    case M_RFIND:
    case M_INDEX:
    case M_RINDEX:
    case M_COUNT:
        if (!given[0]) return jr_fail(r, "%.*s takes at least 1 argument", (int)name.n, name.p);
        return search(r, id, s, p, out);
    case M_JOIN: return given[0] ? str_join(r, s, p[0], out) : jr_fail(r, "join() takes exactly one argument");
    case M_REMOVEPREFIX:
    case M_REMOVESUFFIX:
        if (!given[0]) return jr_fail(r, "%.*s takes exactly one argument (0 given)", (int)name.n, name.p);
        if (str_arg(r, p[0], "removeprefix / removesuffix", &x) != 0) return -1;
        if (x.n <= s.n && memcmp(id == M_REMOVEPREFIX ? s.p : s.p + s.n - x.n, x.p, x.n) == 0)
            s = id == M_REMOVEPREFIX ? js_sub(s, x.n, s.n) : js_sub(s, 0, s.n - x.n);
        *out = jv_str(s);
        return 0;
    default: return str_is(r, id, s, out);
    }
}

static int view(jrender *r, const jdict *d, int kind, jval *out) {
    jval l = jv_list(r, kind, d->n);
    if (!l.u.l) return -1;
    for (int i = 0; i < d->n; i++) {
        if (kind == L_KEYS) {
            l.u.l->v[i] = d->k[i];
        } else if (kind == L_VALUES) {
            l.u.l->v[i] = d->v[i];
        } else {
            jval t = jv_list(r, L_TUPLE, 2);
            if (!t.u.l) return -1;
            t.u.l->v[0] = d->k[i];
            t.u.l->v[1] = d->v[i];
            l.u.l->v[i] = t;
        }
    }
    *out = l;
    return 0;
}

int jinja_call_method(jrender *r, const jfunc *f, const jargs *a, jval *out) {
    static const char *const get[] = {"key", "default"}, *const one[] = {"x"}, *const none[] = {""};
    jval self = f->self, p[2];
    int given[2];
    long work = 1 + (self.t == V_STR ? cost_scan(self.u.s.n) : 0);
    for (int i = 0; i < a->n; i++) work += a->args[i].t == V_STR ? cost_scan(a->args[i].u.s.n) : 0;
    if (jr_charge(r, work) != 0) return -1;
    if (f->id == -1)
        return jr_fail(r, "the method %s.%.*s() is not supported", jv_type_name(self), (int)f->name.n, f->name.p);
    if (self.t == V_STR) return str_method(r, f->id, f->name, self.u.s, a, out);
    int rc = f->id == M_GET ? jinja_bind(r, "method", f->name, a, get, 2, p, given)
             : f->id == M_LIST_COUNT || f->id == M_LIST_INDEX ? jinja_bind(r, "method", f->name, a, one, 1, p, given)
                                                              : jinja_bind(r, "method", f->name, a, none, 0, p, given);
    if (rc != 0) return -1;
    switch (f->id) {
    case M_GET: {
        if (!given[0]) return jr_fail(r, "get expected at least 1 argument, got 0");
        int miss = jv_dict_get(r, self.u.d, p[0], out);
        if (miss < 0) return -1;
        if (miss) *out = p[1];
        return 0;
    }
    case M_ITEMS: return view(r, self.u.d, L_ITEMS, out);
    case M_KEYS: return view(r, self.u.d, L_KEYS, out);
    case M_VALUES: return view(r, self.u.d, L_VALUES, out);
    case M_COPY:
        if (self.t == V_DICT) {
            jval d = jv_dict(r, self.u.d->n);
            if (!d.u.d) return -1;
            d.u.d->n = self.u.d->n;
            if (d.u.d->n) {
                memcpy(d.u.d->k, self.u.d->k, sizeof(jval) * (size_t)d.u.d->n);
                memcpy(d.u.d->v, self.u.d->v, sizeof(jval) * (size_t)d.u.d->n);
            }
            *out = d;
        } else {
            jval l = jv_list(r, L_LIST, self.u.l->n);
            if (!l.u.l) return -1;
            if (l.u.l->n) memcpy(l.u.l->v, self.u.l->v, sizeof(jval) * (size_t)l.u.l->n);
            *out = l;
        }
        return 0;
    default: { /* list / tuple count and index */
        if (!given[0]) return jr_fail(r, "%.*s takes exactly one argument (0 given)", (int)f->name.n, f->name.p);
        long count = 0, first = -1;
        for (int i = 0; i < self.u.l->n; i++) {
            int e = jv_equal(r, self.u.l->v[i], p[0]);
            if (e < 0) return -1;
            if (e && first < 0) first = i;
            count += e;
        }
        if (f->id == M_LIST_INDEX && first < 0) return jr_fail(r, "%s.index(x): x not in %s", jv_type_name(self),
                                                                jv_type_name(self));
        *out = jv_int(f->id == M_LIST_INDEX ? first : count);
        return 0;
    }
    }
}
