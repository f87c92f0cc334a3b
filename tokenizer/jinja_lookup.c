/* Looking into values as jinja2's sandbox does: obj.name tries the attribute (a method of str,
 * dict or list, a loop variable, a namespace entry) before the item, obj[key] the item before
 * the attribute; a miss is undefined, and what the sandbox refuses (names starting with "__",
 * methods that modify) is undefined too. Slices as Python's. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "jinja_internal.h"

static int hashable(jval k) {
    if (k.t == V_LIST && k.u.l->kind == L_TUPLE) {
        for (int i = 0; i < k.u.l->n; i++)
            if (!hashable(k.u.l->v[i])) return 0;
        return 1;
    }
    return k.t != V_DICT && !(k.t == V_LIST && k.u.l->kind != L_RANGE);
}

/* The index of key in d by Python equality, d->n when missing, -1 on error. */
static int dict_index(jrender *r, const jdict *d, jval key) {
    if (!hashable(key)) return jr_fail(r, "unhashable type: '%s'", jv_type_name(key));
    if (jr_charge(r, (long)(d->n / 8) * (key.t == V_STR ? cost_compare(key.u.s.n) + 1 : 1)) != 0) return -1;
    for (int i = 0; i < d->n; i++) {
        if (key.t == V_STR && d->k[i].t != V_STR) continue;
        int e = key.t == V_STR ? js_eq(key.u.s, d->k[i].u.s) : jv_equal(r, key, d->k[i]);
        if (e < 0) return -1;
        if (e) return i;
    }
    return d->n;
}

int jv_dict_get(jrender *r, const jdict *d, jval key, jval *out) {
    int i = dict_index(r, d, key);
    if (i < 0) return -1;
    if (i == d->n) return 1;
    *out = d->v[i];
    return 0;
}

int jv_dict_put(jrender *r, jdict *d, jval key, jval v) {
    int i = dict_index(r, d, key);
    if (i < 0) return -1;
    if (i == d->n) d->k[d->n++] = key;
    d->v[i] = v;
    return 0;
}

static int undef_msg(jrender *r, jval *out, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int undef_msg(jrender *r, jval *out, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jstr s;
    if (js_from_cstr(r, msg, &s) != 0) return -1;
    *out = jv_undef(s);
    return 0;
}

/* What jinja2 calls a value in "'dict object' has no attribute 'x'". */
static const char *object_name(jval v) {
    switch (v.t) {
    case V_NONE: return "None";
    case V_DICT: return "dict object";
    case V_STR: return "str object";
    case V_NS: return "Namespace object";
    default: return v.t == V_LIST ? (v.u.l->kind == L_TUPLE ? "tuple object" : "list object") : jv_type_name(v);
    }
}

static int loop_attr(jrender *r, const jloop *l, jstr name, jval *out) {
    long i = l->index0, n = l->length;
    if (js_eqc(name, "index")) *out = jv_int(i + 1);
    else if (js_eqc(name, "index0")) *out = jv_int(i);
    else if (js_eqc(name, "revindex")) *out = jv_int(n - i);
    else if (js_eqc(name, "revindex0")) *out = jv_int(n - i - 1);
    else if (js_eqc(name, "first")) *out = jv_bool(i == 0);
    else if (js_eqc(name, "last")) *out = jv_bool(i == n - 1);
    else if (js_eqc(name, "length")) *out = jv_int(n);
    else if (js_eqc(name, "depth")) *out = jv_int(1);
    else if (js_eqc(name, "depth0")) *out = jv_int(0);
    else if (js_eqc(name, "previtem") && i > 0) *out = l->items[i - 1];
    else if (js_eqc(name, "nextitem") && i + 1 < n) *out = l->items[i + 1];
    else if (js_eqc(name, "previtem") || js_eqc(name, "nextitem"))
        return undef_msg(r, out, "there is no %s", js_eqc(name, "previtem") ? "previous item" : "next item");
    else if (js_eqc(name, "cycle") || js_eqc(name, "changed")) {
        jfunc *f = jr_func(r, name.p[1] == 'y' ? F_LOOP_CYCLE : F_LOOP_CHANGED, name, out);
        if (!f) return -1;
        f->loop = (jloop *)l;
    } else
        return undef_msg(r, out, "'LoopContext object' has no attribute '%.*s'", (int)name.n, name.p);
    return 0;
}

static int method_value(jrender *r, jval self, jstr name, int id, jval *out) {
    jfunc *f = jr_func(r, F_METHOD, name, out);
    if (!f) return -1;
    f->id = id;
    f->self = self;
    return 0;
}

int jv_getattr(jrender *r, jval obj, jstr name, jval *out) {
    if (jr_charge(r, 1) != 0) return -1;
    if (obj.t == V_UNDEF) return jr_fail(r, "%.*s", (int)obj.u.s.n, obj.u.s.p);
    if (name.n >= 2 && name.p[0] == '_' && name.p[1] == '_')
        return undef_msg(r, out, "access to attribute '%.*s' of '%s' object is unsafe.", (int)name.n, name.p,
                         jv_type_name(obj));
    if (obj.t == V_LOOP) return loop_attr(r, obj.u.loop, name, out);
    if (obj.t == V_NS) {
        for (int i = 0; i < obj.u.ns->n; i++)
            if (js_eq(obj.u.ns->k[i], name)) {
                *out = obj.u.ns->v[i];
                return 0;
            }
        return undef_msg(r, out, "'Namespace object' has no attribute '%.*s'", (int)name.n, name.p);
    }
    int id = jinja_method_id(obj, name);
    if (id == -3)
        return undef_msg(r, out, "access to attribute '%.*s' of '%s' object is unsafe.", (int)name.n, name.p,
                         jv_type_name(obj));
    if (id != -2) return method_value(r, obj, name, id, out);
    if (obj.t == V_DICT) {
        int rc = jv_dict_get(r, obj.u.d, jv_str(name), out);
        if (rc <= 0) return rc;
    }
    return undef_msg(r, out, "'%s' has no attribute '%.*s'", object_name(obj), (int)name.n, name.p);
}

/* Python's slice.indices(): start, stop, step resolved against length n. -1 on a bad slice. */
static int slice_indices(jrender *r, const jval *bounds, long n, long *start, long *stop, long *step) {
    for (int k = 0; k < 3; k++)
        if (bounds[k].t != V_NONE && bounds[k].t != V_INT && bounds[k].t != V_BOOL) return 1;
    *step = bounds[2].t == V_NONE ? 1 : (long)bounds[2].u.i;
    if (*step == 0) return jr_fail(r, "slice step cannot be zero");
    long lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
    for (int k = 0; k < 2; k++) {
        long *at = k == 0 ? start : stop;
        if (bounds[k].t == V_NONE) {
            *at = (k == 0) == (*step > 0) ? lo : hi;
            continue;
        }
        long long v = bounds[k].u.i;
        if (v < 0) v += n;
        *at = v < lo ? lo : v > hi ? hi : (long)v;
    }
    return 0;
}

int jv_slice(jrender *r, jval obj, const jval *bounds, jval *out) {
    if (obj.t == V_UNDEF) return jr_fail(r, "%.*s", (int)obj.u.s.n, obj.u.s.p);
    int seq = obj.t == V_STR || (obj.t == V_LIST && (obj.u.l->kind == L_LIST || obj.u.l->kind == L_TUPLE ||
                                                     obj.u.l->kind == L_RANGE));
    if (!seq) return undef_msg(r, out, "'%s' object is not subscriptable with a slice", jv_type_name(obj));
    long n, start = 0, stop = 0, step = 1;
    if (jv_len(r, obj, &n) != 0) return -1;
    int rc = slice_indices(r, bounds, n, &start, &stop, &step);
    if (rc != 0) return rc < 0 ? -1 : undef_msg(r, out, "slice indices must be integers or None");
    long count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                          : (start > stop ? (start - stop - step - 1) / -step : 0);
    if (jr_charge(r, count / 16 + (obj.t == V_STR && step != 1 ? cost_rewrite((size_t)count) : 0)) != 0) return -1;
    if (obj.t == V_STR) {
        jstr s = obj.u.s;
        if (step == 1) {
            size_t a = js_char_offset(s, start);
            *out = jv_str(js_sub(s, a, a + js_char_offset(js_sub(s, a, s.n), stop - start)));
            return 0;
        }
        size_t *offs = jr_alloc(r, sizeof(size_t) * (size_t)(n + 1));
        if (!offs) return -1;
        for (long k = 0, at = 0; k <= n; k++) {
            offs[k] = (size_t)at;
            if (k < n) {
                int len;
                ju_decode(s.p, s.n, (size_t)at, &len);
                at += len;
            }
        }
        jbuf b = {0};
        for (long k = 0, i = start; k < count; k++, i += step)
            if (jb_put(r, &b, js_sub(s, offs[i], offs[i + 1])) != 0) return -1;
        *out = jv_str(jb_str(&b));
        return 0;
    }
    const jlist *l = obj.u.l;
    jval res = jv_list(r, l->kind, (int)count);
    if (!res.u.l) return -1;
    for (long k = 0, i = start; k < count; k++, i += step) res.u.l->v[k] = l->v[i];
    if (l->kind == L_RANGE) {
        res.u.l->start = l->start + start * l->step;
        res.u.l->stop = l->start + stop * l->step;
        res.u.l->step = l->step * step;
    }
    *out = res;
    return 0;
}

int jv_getitem(jrender *r, jval obj, jval key, jval *out) {
    if (jr_charge(r, 1 + (obj.t == V_STR ? cost_scan(obj.u.s.n) : 0)) != 0) return -1;
    if (obj.t == V_UNDEF) return jr_fail(r, "%.*s", (int)obj.u.s.n, obj.u.s.p);
    int seq = obj.t == V_STR || (obj.t == V_LIST && (obj.u.l->kind == L_LIST || obj.u.l->kind == L_TUPLE ||
                                                     obj.u.l->kind == L_RANGE));
    if (seq && (key.t == V_INT || key.t == V_BOOL)) {
        long n;
        if (jv_len(r, obj, &n) != 0) return -1;
        long long i = key.u.i < 0 ? key.u.i + n : key.u.i;
        if (i < 0 || i >= n) return undef_msg(r, out, "%s has no element %lld", object_name(obj), key.u.i);
        if (obj.t == V_STR) {
            size_t a = js_char_offset(obj.u.s, (long)i);
            int len;
            ju_decode(obj.u.s.p, obj.u.s.n, a, &len);
            *out = jv_str(js_sub(obj.u.s, a, a + (size_t)len));
        } else {
            *out = obj.u.l->v[i];
        }
        return 0;
    }
    if (obj.t == V_DICT && hashable(key)) {
        int rc = jv_dict_get(r, obj.u.d, key, out);
        if (rc <= 0) return rc;
    }
    if (key.t == V_STR) return jv_getattr(r, obj, key.u.s, out);
    jstr ks;
    if (key.t == V_INT || key.t == V_FLOAT || key.t == V_NONE || key.t == V_BOOL) {
        if (jv_to_str(r, key, &ks) != 0) return -1;
        return undef_msg(r, out, "%s has no element %.*s", object_name(obj), (int)ks.n, ks.p);
    }
    return undef_msg(r, out, "%s has no such element", object_name(obj));
}
