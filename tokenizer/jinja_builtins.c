/* jinja2's tests, the globals transformers gives chat templates (range, namespace, dict,
 * raise_exception, strftime_now) and the binding of call arguments the builtins share. The tests
 * jinja2 has and qlm does not run are known by name (see jinja_filters.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

enum {
    T_IS_BOOLEAN, T_IS_CALLABLE, T_IS_DEFINED, T_IS_DIVISIBLEBY, T_IS_EQ, T_IS_ESCAPED, T_IS_EVEN, T_IS_FALSE,
    T_IS_FILTER, T_IS_FLOAT, T_IS_GE, T_IS_GT, T_IS_IN, T_IS_INTEGER, T_IS_ITERABLE, T_IS_LE, T_IS_LOWER,
    T_IS_LT, T_IS_MAPPING, T_IS_NE, T_IS_NONE, T_IS_NUMBER, T_IS_ODD, T_IS_SEQUENCE, T_IS_STRING, T_IS_TEST,
    T_IS_TRUE, T_IS_UNDEFINED, T_IS_UPPER, T_IS_SAMEAS,
};

static const struct {
    const char *name;
    int id;
} k_tests[] = {
    {"!=", T_IS_NE}, {"<", T_IS_LT}, {"<=", T_IS_LE}, {"==", T_IS_EQ}, {">", T_IS_GT}, {">=", T_IS_GE},
    {"boolean", T_IS_BOOLEAN}, {"callable", T_IS_CALLABLE}, {"defined", T_IS_DEFINED},
    {"divisibleby", T_IS_DIVISIBLEBY}, {"eq", T_IS_EQ}, {"equalto", T_IS_EQ}, {"escaped", T_IS_ESCAPED},
    {"even", T_IS_EVEN}, {"false", T_IS_FALSE}, {"filter", T_IS_FILTER}, {"float", T_IS_FLOAT}, {"ge", T_IS_GE},
    {"greaterthan", T_IS_GT}, {"gt", T_IS_GT}, {"in", T_IS_IN}, {"integer", T_IS_INTEGER},
    {"iterable", T_IS_ITERABLE}, {"le", T_IS_LE}, {"lessthan", T_IS_LT}, {"lower", T_IS_LOWER}, {"lt", T_IS_LT},
    {"mapping", T_IS_MAPPING}, {"ne", T_IS_NE}, {"none", T_IS_NONE}, {"number", T_IS_NUMBER}, {"odd", T_IS_ODD},
    {"sameas", T_IS_SAMEAS}, {"sequence", T_IS_SEQUENCE}, {"string", T_IS_STRING}, {"test", T_IS_TEST},
    {"true", T_IS_TRUE}, {"undefined", T_IS_UNDEFINED}, {"upper", T_IS_UPPER},
};

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_LIPSUM, G_CYCLER, G_JOINER };
static const char *const k_globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now",
                                        "lipsum", "cycler", "joiner"};

int jinja_test_id(jstr name) {
    for (size_t i = 0; i < sizeof k_tests / sizeof k_tests[0]; i++)
        if (js_eqc(name, k_tests[i].name)) return k_tests[i].id;
    return -1;
}

int jinja_global_id(jstr name) {
    for (size_t i = 0; i < sizeof k_globals / sizeof k_globals[0]; i++)
        if (js_eqc(name, k_globals[i])) return (int)i;
    return -1;
}

/* ---- arguments ---- */

int jinja_bind(jrender *r, const char *what, jstr name, const jargs *a, const char *const *params, int n_params,
               jval *vals, int *given) {
    for (int i = 0; i < n_params; i++) {
        vals[i] = jv_none();
        given[i] = 0;
    }
    if (a->n > n_params)
        return jr_fail(r, "%s %.*s takes at most %d argument(s), %d given", what, (int)name.n, name.p, n_params, a->n);
    for (int i = 0; i < a->n; i++) {
        vals[i] = a->args[i];
        given[i] = 1;
    }
    for (int k = 0; k < a->n_kw; k++) {
        int at = -1;
        for (int i = 0; i < n_params; i++)
            if (js_eqc(a->names[k], params[i])) at = i;
        if (at < 0)
            return jr_fail(r, "%s %.*s got an unexpected keyword argument '%.*s'", what, (int)name.n, name.p,
                           (int)a->names[k].n, a->names[k].p);
        if (given[at])
            return jr_fail(r, "%s %.*s got multiple values for argument '%s'", what, (int)name.n, name.p, params[at]);
        vals[at] = a->kwargs[k];
        given[at] = 1;
    }
    return 0;
}

int jinja_int_arg(jrender *r, jval v, const char *param, long long *out) {
    if (v.t == V_INT || v.t == V_BOOL) {
        *out = v.u.i;
        return 0;
    }
    if (v.t == V_UNDEF) return jr_fail(r, "%.*s", (int)v.u.s.n, v.u.s.p);
    return jr_fail(r, "'%s' object cannot be interpreted as an integer (%s)", jv_type_name(v), param);
}

/* ---- tests ---- */

static int compare_test(jrender *r, int id, jval v, jval other, int *out) {
    int cmp, eq;
    if (id == T_IS_EQ || id == T_IS_NE) {
        if ((eq = jv_equal(r, v, other)) < 0) return -1;
        *out = id == T_IS_EQ ? eq : !eq;
        return 0;
    }
    if (jv_order(r, v, other, &cmp) != 0) return -1;
    *out = id == T_IS_LT ? cmp == -1 : id == T_IS_LE ? (cmp == -1 || cmp == 0) : id == T_IS_GT ? cmp == 1
                                                                                               : (cmp == 0 || cmp == 1);
    return 0;
}

/* value % divisor == 0, with Python's % (so strings fail as they would). */
static int divisible(jrender *r, jval v, jval d, int *out) {
    if (v.t == V_UNDEF) return jr_fail(r, "%.*s", (int)v.u.s.n, v.u.s.p);
    if (!jv_is_num(v) || !jv_is_num(d))
        return jr_fail(r, "unsupported operand type(s) for %%: '%s' and '%s'", jv_type_name(v), jv_type_name(d));
    if (v.t == V_FLOAT || d.t == V_FLOAT) {
        double x = v.t == V_FLOAT ? v.u.f : (double)v.u.i, y = d.t == V_FLOAT ? d.u.f : (double)d.u.i;
        if (y == 0) return jr_fail(r, "float modulo");
        *out = fmod(x, y) == 0;
        return 0;
    }
    if (d.u.i == 0) return jr_fail(r, "integer division or modulo by zero");
    *out = d.u.i == -1 || v.u.i % d.u.i == 0;
    return 0;
}

static int case_test(jrender *r, jval v, int upper, int *out) {
    jstr s;
    if (jv_to_str(r, v, &s) != 0 || js_prepare_locale(r, s) != 0) return -1;
    int cased = 0, ok = 1;
    for (size_t i = 0; i < s.n && ok;) {
        int len;
        uint32_t c = ju_decode(s.p, s.n, i, &len);
        if (upper ? js_is_lower(r, c) : js_is_upper(r, c)) ok = 0;
        else if (js_is_cased(r, c)) cased = 1;
        i += (size_t)len;
    }
    *out = ok && cased;
    return 0;
}

int jinja_apply_test(jrender *r, int id, jstr name, jval v, const jargs *a, int *out) {
    static const char *const one[] = {"other"};
    jval p[1];
    int given[1];
    int takes_arg = id == T_IS_DIVISIBLEBY || id == T_IS_EQ || id == T_IS_NE || id == T_IS_LT || id == T_IS_LE ||
                    id == T_IS_GT || id == T_IS_GE || id == T_IS_IN || id == T_IS_SAMEAS;
    if (jinja_bind(r, "test", name, a, one, takes_arg, p, given) != 0) return -1;
    if (takes_arg && !given[0]) return jr_fail(r, "test %.*s needs an argument", (int)name.n, name.p);
    switch (id) {
    case T_IS_BOOLEAN: *out = v.t == V_BOOL; return 0;
    case T_IS_CALLABLE: *out = v.t == V_FUNC || v.t == V_LOOP || v.t == V_UNDEF; return 0;
    case T_IS_SAMEAS: /* Python's "is": decided here for None, True and False only */
        if (v.t != V_NONE && v.t != V_BOOL && p[0].t != V_NONE && p[0].t != V_BOOL)
            return jr_fail(r, "the test sameas is supported with none, true or false");
        *out = v.t == p[0].t && (v.t == V_NONE || v.u.i == p[0].u.i);
        return 0;
    case T_IS_DEFINED: *out = v.t != V_UNDEF; return 0;
    case T_IS_UNDEFINED: *out = v.t == V_UNDEF; return 0;
    case T_IS_DIVISIBLEBY: return divisible(r, v, p[0], out);
    case T_IS_EVEN:
    case T_IS_ODD: {
        int even;
        if (divisible(r, v, jv_int(2), &even) != 0) return -1;
        *out = id == T_IS_EVEN ? even : !even;
        return 0;
    }
    case T_IS_ESCAPED: *out = 0; return 0;
    case T_IS_FALSE: *out = v.t == V_BOOL && !v.u.i; return 0;
    case T_IS_TRUE: *out = v.t == V_BOOL && v.u.i; return 0;
    case T_IS_FILTER: *out = v.t == V_STR && jinja_filter_id(v.u.s) != -1; return 0;
    case T_IS_TEST: *out = v.t == V_STR && jinja_test_id(v.u.s) != -1; return 0;
    case T_IS_FLOAT: *out = v.t == V_FLOAT; return 0;
    case T_IS_INTEGER: *out = v.t == V_INT; return 0;
    case T_IS_NUMBER: *out = jv_is_num(v); return 0;
    case T_IS_IN: return jv_contains(r, p[0], v, out);
    case T_IS_ITERABLE: *out = v.t == V_STR || v.t == V_LIST || v.t == V_DICT || v.t == V_UNDEF || v.t == V_LOOP; return 0;
    case T_IS_SEQUENCE: /* len() and [] both work */
        *out = v.t == V_STR || v.t == V_DICT || v.t == V_UNDEF ||
               (v.t == V_LIST && (v.u.l->kind == L_LIST || v.u.l->kind == L_TUPLE || v.u.l->kind == L_RANGE));
        return 0;
    case T_IS_LOWER:
    case T_IS_UPPER: return case_test(r, v, id == T_IS_UPPER, out);
    case T_IS_MAPPING: *out = v.t == V_DICT; return 0;
    case T_IS_NONE: *out = v.t == V_NONE; return 0;
    case T_IS_STRING: *out = v.t == V_STR; return 0;
    default: return compare_test(r, id, v, p[0], out);
    }
}

/* ---- globals ---- */

/* dict(*args, **kwargs) as Python builds it: one mapping or list of pairs, then the keywords. */
static int build_dict(jrender *r, const char *what, const jargs *a, jval *out) {
    if (a->n > 1) return jr_fail(r, "%s expected at most 1 argument, got %d", what, a->n);
    const jval *items = NULL;
    int n = 0;
    if (a->n && a->args[0].t != V_DICT && jv_items(r, a->args[0], &items, &n) != 0) return -1;
    int total = (a->n && a->args[0].t == V_DICT ? a->args[0].u.d->n : n) + a->n_kw;
    jval d = jv_dict(r, total);
    if (!d.u.d) return -1;
    for (int i = 0; i < total; i++) {
        jval k, v;
        if (a->n && a->args[0].t == V_DICT && i < a->args[0].u.d->n) {
            k = a->args[0].u.d->k[i];
            v = a->args[0].u.d->v[i];
        } else if (i < n) {
            const jval *pair;
            int pn;
            if (jv_items(r, items[i], &pair, &pn) != 0) return -1;
            if (pn != 2)
                return jr_fail(r, "dictionary update sequence element #%d has length %d; 2 is required", i, pn);
            k = pair[0];
            v = pair[1];
        } else {
            int kw = i - (total - a->n_kw);
            k = jv_str(a->names[kw]);
            v = a->kwargs[kw];
        }
        if (jv_dict_put(r, d.u.d, k, v) != 0) return -1;
    }
    *out = d;
    return 0;
}

static int g_range(jrender *r, const jargs *a, jval *out) {
    long long v[3] = {0, 0, 1};
    if (a->n_kw) return jr_fail(r, "range() takes no keyword arguments");
    if (a->n < 1 || a->n > 3) return jr_fail(r, "range expected 1 to 3 arguments, got %d", a->n);
    for (int i = 0; i < a->n; i++)
        if (jinja_int_arg(r, a->args[i], "range", &v[a->n == 1 ? 1 : i]) != 0) return -1;
    if (v[2] == 0) return jr_fail(r, "range() arg 3 must not be zero");
    long double span = v[2] > 0 ? (long double)v[1] - v[0] : (long double)v[0] - v[1];
    long double count = span <= 0 ? 0 : (span + (v[2] > 0 ? v[2] : -v[2]) - 1) / (v[2] > 0 ? v[2] : -v[2]);
    if (count > 100000)
        return jr_fail(r, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    int n = (int)count;
    jval l = jv_list(r, L_RANGE, n);
    if (!l.u.l) return -1;
    for (int i = 0; i < n; i++) l.u.l->v[i] = jv_int(v[0] + (long long)i * v[2]);
    l.u.l->start = v[0];
    l.u.l->stop = v[1];
    l.u.l->step = v[2];
    *out = l;
    return 0;
}

static int g_strftime(jrender *r, const jargs *a, jval *out) {
    static const char *const params[] = {"format"};
    jval p[1];
    int given[1];
    if (jinja_bind(r, "function", JS_C("strftime_now"), a, params, 1, p, given) != 0) return -1;
    if (p[0].t != V_STR) return jr_fail(r, "strftime() argument 1 must be str, not %s", jv_type_name(p[0]));
    struct tm now;
    if (r->lim.now) {
        now = *r->lim.now;
    } else {
        time_t t = time(NULL);
        localtime_r(&t, &now);
    }
    jstr f = p[0].u.s;
    char *fmt = jr_alloc(r, f.n + 2);
    if (!fmt) return -1;
    memcpy(fmt, f.p, f.n);
    fmt[f.n] = '\x01'; /* tells an empty result from a buffer too small */
    fmt[f.n + 1] = 0;
    for (size_t cap = f.n * 4 + 64; cap <= 65536; cap *= 4) {
        char *buf = jr_alloc(r, cap);
        if (!buf) return -1;
        size_t n = strftime(buf, cap, fmt, &now);
        if (n > 0) {
            *out = jv_str(js_lit(buf, n - 1));
            return 0;
        }
    }
    return jr_fail(r, "strftime_now: the formatted time is too long");
}

int jinja_call_global(jrender *r, int id, const jargs *a, jval *out) {
    switch (id) {
    case G_RANGE: return g_range(r, a, out);
    case G_DICT: return build_dict(r, "dict", a, out);
    case G_NAMESPACE: {
        jval d;
        if (build_dict(r, "namespace", a, &d) != 0) return -1;
        jns *ns = jr_alloc(r, sizeof *ns);
        if (!ns) return -1;
        memset(ns, 0, sizeof *ns);
        for (int i = 0; i < d.u.d->n; i++) {
            if (d.u.d->k[i].t != V_STR) return jr_fail(r, "namespace attribute names must be strings");
            if (jinja_namespace_set(r, ns, d.u.d->k[i].u.s, d.u.d->v[i]) != 0) return -1;
        }
        out->t = V_NS;
        out->u.ns = ns;
        return 0;
    }
    case G_RAISE: {
        jstr msg;
        if (a->n != 1 || a->n_kw) return jr_fail(r, "raise_exception() takes exactly one argument");
        if (jv_to_str(r, a->args[0], &msg) != 0) return -1;
        return jr_fail(r, "raise_exception: %.*s", (int)(msg.n > 400 ? 400 : msg.n), msg.p);
    }
    case G_STRFTIME: return g_strftime(r, a, out);
    default: return jr_fail(r, "the global %s() is not supported", k_globals[id]);
    }
}
