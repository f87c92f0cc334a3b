/* Runs the tree: expressions with Python's operators, statements with jinja2's scoping (a for
 * loop's body starts each iteration in a fresh scope; macros, set blocks and with have their own;
 * if has none), loop controls, macros and call blocks. Every step is counted against the limits. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "jinja_internal.h"

enum { FLOW_NEXT = 0, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

static int eval(jrender *r, jscope *sc, const jnode *e, jval *out);
static int exec_body(jrender *r, jscope *sc, jnode *const *stmts, int n, jbuf *out);

/* ---- scopes ---- */

/* A scope with room for two variables (a loop's target and `loop`) in the same allocation: a
 * loop makes one per iteration. */
static jscope *scope_new(jrender *r, jscope *parent) {
    struct {
        jscope s;
        jstr k[2];
        jval v[2];
    } *block = jr_alloc(r, sizeof *block);
    if (!block) return NULL;
    memset(&block->s, 0, sizeof block->s);
    block->s.parent = parent;
    block->s.vars = (jns){0, 2, block->k, block->v};
    return &block->s;
}

static int scope_set(jrender *r, jscope *s, jstr name, jval v) { return jns_set(r, &s->vars, name, v); }

static int lookup(jrender *r, const jscope *s, jstr name, jval *out) {
    for (; s; s = s->parent) {
        if (jr_charge(r, 1 + s->vars.n / 8) != 0) return -1;
        for (int i = s->vars.n - 1; i >= 0; i--)
            if (js_eq(s->vars.k[i], name)) {
                *out = s->vars.v[i];
                return 0;
            }
    }
    int id = jinja_global_id(name);
    if (id >= 0) {
        jfunc *f = jr_func(r, F_GLOBAL, name, out);
        if (!f) return -1;
        f->id = id;
        return 0;
    }
    char msg[128];
    snprintf(msg, sizeof msg, "'%.*s' is undefined", (int)(name.n > 80 ? 80 : name.n), name.p);
    size_t n = strlen(msg);
    char *p = jr_alloc(r, n);
    if (!p) return -1;
    memcpy(p, msg, n);
    *out = jv_undef(js_lit(p, n));
    return 0;
}

static int fail_undefined(jrender *r, jval v) { return jr_fail(r, "%.*s", (int)v.u.s.n, v.u.s.p); }

/* ---- assignment ---- */

static int assign(jrender *r, jscope *sc, const jnode *target, jval v) {
    if (target->kind == E_NAME) return scope_set(r, sc, target->s, v);
    const jval *items;
    int n;
    if (jv_items(r, v, &items, &n) != 0) return -1;
    r->pos = target->pos;
    if (n != target->n)
        return jr_fail(r, n > target->n ? "too many values to unpack (expected %d)"
                                        : "not enough values to unpack (expected %d, got %d)",
                       target->n, n);
    for (int i = 0; i < n; i++)
        if (assign(r, sc, target->kids[i], items[i]) != 0) return -1;
    return 0;
}

static int ns_set(jrender *r, jns *ns, jstr name, jval v) {
    if (name.n && name.p[0] == '_')
        return jr_fail(r, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%.*s'",
                       (int)name.n, name.p);
    return jns_set(r, ns, name, v);
}

int jinja_namespace_set(jrender *r, jns *ns, jstr name, jval v) { return ns_set(r, ns, name, v); }

/* ---- arithmetic ---- */

static int type_error(jrender *r, const char *op, jval a, jval b) {
    return jr_fail(r, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static double num_f(jval v) { return v.t == V_FLOAT ? v.u.f : (double)v.u.i; }

static int repeat(jrender *r, jval seq, long long times, jval *out) {
    if (times < 0) times = 0;
    if (seq.t == V_STR && seq.u.s.n == 0) {
        *out = seq;
        return 0;
    }
    if (seq.t == V_STR) {
        if (seq.u.s.n && (unsigned long long)times > r->lim.max_output / seq.u.s.n)
            return jr_fail(r, "the string would exceed %zu bytes (the output limit)", r->lim.max_output);
        jbuf b = {0};
        for (long long i = 0; i < times; i++)
            if (jb_put(r, &b, seq.u.s) != 0) return -1;
        *out = jv_str(jb_str(&b));
        return 0;
    }
    const jlist *l = seq.u.l;
    if (l->n && times > (long long)(INT_MAX / 2) / l->n) return jr_fail(r, "the list would be too long");
    jval res = jv_list(r, l->kind, (int)(l->n * times));
    if (!res.u.l) return -1;
    for (long long i = 0; l->n && i < times; i++) memcpy(res.u.l->v + i * l->n, l->v, sizeof(jval) * (size_t)l->n);
    *out = res;
    return 0;
}

static int concat_lists(jrender *r, const jlist *a, const jlist *b, jval *out) {
    jval res = jv_list(r, a->kind, a->n + b->n);
    if (!res.u.l) return -1;
    if (a->n) memcpy(res.u.l->v, a->v, sizeof(jval) * (size_t)a->n);
    if (b->n) memcpy(res.u.l->v + a->n, b->v, sizeof(jval) * (size_t)b->n);
    *out = res;
    return 0;
}

static int int_pow(jrender *r, long long base, long long exp, jval *out) {
    long long acc = 1;
    while (exp > 0) {
        if ((exp & 1) && __builtin_mul_overflow(acc, base, &acc)) break;
        exp >>= 1;
        if (exp && __builtin_mul_overflow(base, base, &base)) break;
    }
    if (exp > 0) return jr_fail(r, "integer overflow (qlm's templates use 64-bit integers)");
    *out = jv_int(acc);
    return 0;
}

/* Python's float // and % (floatobject.c's divmod). */
static void float_floordiv_mod(double a, double b, double *div_out, double *mod_out) {
    double mod = fmod(a, b), div = (a - mod) / b;
    if (mod != 0) {
        if ((b < 0) != (mod < 0)) {
            mod += b;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, b);
    }
    double floordiv;
    if (div != 0) {
        floordiv = floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, a / b);
    }
    *div_out = floordiv;
    *mod_out = mod;
}

static const char *const k_op_names[] = {[T_ADD] = "+", [T_SUB] = "-", [T_MUL] = "*", [T_DIV] = "/",
                                          [T_FLOORDIV] = "//", [T_MOD] = "%", [T_POW] = "** or pow()"};

static int numeric(jrender *r, int op, jval a, jval b, jval *out) {
    if (a.t == V_FLOAT || b.t == V_FLOAT || op == T_DIV) {
        double x = num_f(a), y = num_f(b), d, m;
        switch (op) {
        case T_ADD: *out = jv_float(x + y); return 0;
        case T_SUB: *out = jv_float(x - y); return 0;
        case T_MUL: *out = jv_float(x * y); return 0;
        case T_DIV:
            if (y == 0) return jr_fail(r, "division by zero");
            *out = jv_float(x / y);
            return 0;
        case T_FLOORDIV:
        case T_MOD:
            if (y == 0) return jr_fail(r, op == T_MOD ? "float modulo" : "float floor division by zero");
            float_floordiv_mod(x, y, &d, &m);
            *out = jv_float(op == T_MOD ? m : d);
            return 0;
        default:
            if (x == 0 && y < 0) return jr_fail(r, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) return jr_fail(r, "a negative number to a fractional power is complex");
            *out = jv_float(pow(x, y));
            return 0;
        }
    }
    long long x = a.u.i, y = b.u.i, v;
    switch (op) {
    case T_ADD:
        if (__builtin_add_overflow(x, y, &v)) break;
        *out = jv_int(v);
        return 0;
    case T_SUB:
        if (__builtin_sub_overflow(x, y, &v)) break;
        *out = jv_int(v);
        return 0;
    case T_MUL:
        if (__builtin_mul_overflow(x, y, &v)) break;
        *out = jv_int(v);
        return 0;
    case T_FLOORDIV:
    case T_MOD: {
        if (y == 0) return jr_fail(r, "integer division or modulo by zero");
        if (x == LLONG_MIN && y == -1) break;
        long long q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
            q--;
            m += y;
        }
        *out = jv_int(op == T_MOD ? m : q);
        return 0;
    }
    case T_POW:
        if (y < 0) {
            if (x == 0) return jr_fail(r, "0.0 cannot be raised to a negative power");
            *out = jv_float(pow((double)x, (double)y));
            return 0;
        }
        return int_pow(r, x, y, out);
    default: return type_error(r, k_op_names[op], a, b);
    }
    return jr_fail(r, "integer overflow (qlm's templates use 64-bit integers)");
}

static int binop(jrender *r, int op, jval a, jval b, jval *out) {
    if (a.t == V_UNDEF) return fail_undefined(r, a);
    if (b.t == V_UNDEF) return fail_undefined(r, b);
    if (jv_is_num(a) && jv_is_num(b)) return numeric(r, op, a, b, out);
    if (op == T_ADD && a.t == V_STR && b.t == V_STR) {
        jstr s;
        if (js_concat(r, a.u.s, b.u.s, &s) != 0) return -1;
        *out = jv_str(s);
        return 0;
    }
    if (op == T_ADD && a.t == V_LIST && b.t == V_LIST && a.u.l->kind == b.u.l->kind &&
        (a.u.l->kind == L_LIST || a.u.l->kind == L_TUPLE))
        return concat_lists(r, a.u.l, b.u.l, out);
    if (op == T_ADD && a.t == V_STR)
        return jr_fail(r, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
    if (op == T_MUL) {
        int a_seq = a.t == V_STR || (a.t == V_LIST && (a.u.l->kind == L_LIST || a.u.l->kind == L_TUPLE));
        int b_seq = b.t == V_STR || (b.t == V_LIST && (b.u.l->kind == L_LIST || b.u.l->kind == L_TUPLE));
        if (a_seq && (b.t == V_INT || b.t == V_BOOL)) return repeat(r, a, b.u.i, out);
        if (b_seq && (a.t == V_INT || a.t == V_BOOL)) return repeat(r, b, a.u.i, out);
    }
    if (op == T_MOD && a.t == V_STR) return jr_fail(r, "string formatting with %% is not supported");
    return type_error(r, k_op_names[op], a, b);
}

int jinja_binop(jrender *r, int op, jval a, jval b, jval *out) { return binop(r, op, a, b, out); }

/* ---- expressions ---- */

static int eval_args(jrender *r, jscope *sc, const jnode *call, int extra_kw, jargs *a) {
    memset(a, 0, sizeof *a);
    jval *args = call->n ? jr_alloc(r, sizeof(jval) * (size_t)call->n) : NULL;
    jval *kw = call->n_more + extra_kw ? jr_alloc(r, sizeof(jval) * (size_t)(call->n_more + extra_kw)) : NULL;
    jstr *names = call->n_more + extra_kw ? jr_alloc(r, sizeof(jstr) * (size_t)(call->n_more + extra_kw)) : NULL;
    if ((call->n && !args) || (call->n_more + extra_kw && (!kw || !names))) return -1;
    for (int i = 0; i < call->n; i++)
        if (eval(r, sc, call->kids[i], &args[i]) != 0) return -1;
    for (int i = 0; i < call->n_more; i++) {
        for (int j = 0; j < i; j++)
            if (js_eq(call->more[j]->s, call->more[i]->s)) {
                r->pos = call->more[i]->pos;
                return jr_fail(r, "keyword argument repeated: %.*s", (int)call->more[i]->s.n, call->more[i]->s.p);
            }
        names[i] = call->more[i]->s;
        if (eval(r, sc, call->more[i]->a, &kw[i]) != 0) return -1;
    }
    *a = (jargs){args, call->n, names, kw, call->n_more};
    return 0;
}

static int call_value(jrender *r, jval fn, const jargs *a, jval *out);

static int undefined_param(jrender *r, jstr param, jval *out) {
    char msg[160];
    int n = snprintf(msg, sizeof msg, "parameter '%.*s' was not provided", (int)(param.n > 80 ? 80 : param.n), param.p);
    char *p = jr_alloc(r, (size_t)n);
    if (!p) return -1;
    memcpy(p, msg, (size_t)n);
    *out = jv_undef(js_lit(p, (size_t)n));
    return 0;
}

/* The parameters of a macro (or a call block's caller) bound as jinja2 binds them: positional,
 * then by name, then defaults (evaluated in the macro's scope); extra ones go to varargs and
 * kwargs when the body reads those, and are an error otherwise. */
static int bind_params(jrender *r, const jnode *def, jscope *sc, const jargs *a, jstr name) {
    int np = def->n, positional = a->n < np ? a->n : np;
    if (a->n > np && !(def->op & MACRO_VARARGS))
        return jr_fail(r, "macro '%.*s' takes not more than %d argument(s)", (int)name.n, name.p, np);
    for (int i = 0; i < positional; i++)
        if (scope_set(r, sc, def->kids[i]->s, a->args[i]) != 0) return -1;
    jval extra = jv_dict(r, a->n_kw);
    if (!extra.u.d) return -1;
    for (int k = 0; k < a->n_kw; k++) {
        int at = -1;
        for (int i = 0; i < np; i++)
            if (js_eq(def->kids[i]->s, a->names[k])) at = i;
        if (at >= 0 && at < positional)
            return jr_fail(r, "macro '%.*s' got multiple values for argument '%.*s'", (int)name.n, name.p,
                           (int)a->names[k].n, a->names[k].p);
        if (at < 0 && !js_eqc(a->names[k], "caller")) {
            if (!(def->op & MACRO_KWARGS))
                return jr_fail(r, "macro '%.*s' takes no keyword argument '%.*s'", (int)name.n, name.p,
                               (int)a->names[k].n, a->names[k].p);
            extra.u.d->k[extra.u.d->n] = jv_str(a->names[k]);
            extra.u.d->v[extra.u.d->n++] = a->kwargs[k];
        } else if (scope_set(r, sc, a->names[k], a->kwargs[k]) != 0) {
            return -1;
        }
    }
    for (int i = positional; i < np; i++) {
        jval v;
        int given = 0;
        for (int k = 0; k < a->n_kw; k++) given |= js_eq(def->kids[i]->s, a->names[k]);
        if (given) continue;
        if (def->more[i] ? eval(r, sc, def->more[i], &v) : undefined_param(r, def->kids[i]->s, &v)) return -1;
        if (scope_set(r, sc, def->kids[i]->s, v) != 0) return -1;
    }
    if (def->op & MACRO_VARARGS) {
        jval rest = jv_list(r, L_TUPLE, a->n - positional);
        if (!rest.u.l) return -1;
        for (int i = positional; i < a->n; i++) rest.u.l->v[i - positional] = a->args[i];
        if (scope_set(r, sc, JS_C("varargs"), rest) != 0) return -1;
    }
    return def->op & MACRO_KWARGS ? scope_set(r, sc, JS_C("kwargs"), extra) : 0;
}

/* A macro's or call block's body run with a's arguments; its output is the call's value. */
static int run_callable_body(jrender *r, const jnode *def, jscope *closure, const jargs *a, jval caller, jstr name,
                             jval *out) {
    if (++r->depth > r->lim.max_depth)
        return jr_fail(r, "calls nested more than %d deep (recursion?)", r->lim.max_depth);
    jscope *sc = scope_new(r, closure);
    if (!sc || bind_params(r, def, sc, a, name) != 0) return -1;
    if (caller.t == V_FUNC && scope_set(r, sc, JS_C("caller"), caller) != 0) return -1;
    jbuf b = {0};
    if (exec_body(r, sc, def->a->kids, def->a->n, &b) < 0) return -1;
    r->depth--;
    *out = jv_str(jb_str(&b));
    return 0;
}

static int call_value(jrender *r, jval fn, const jargs *a, jval *out) {
    if (fn.t == V_UNDEF) return fail_undefined(r, fn);
    if (fn.t != V_FUNC) return jr_fail(r, "'%s' object is not callable", jv_type_name(fn));
    const jfunc *f = fn.u.fn;
    switch (f->kind) {
    case F_GLOBAL: return jinja_call_global(r, f->id, a, out);
    case F_METHOD: return jinja_call_method(r, f, a, out);
    case F_LOOP_CYCLE:
        if (a->n == 0) return jr_fail(r, "no items for cycling given");
        *out = a->args[f->loop->index0 % a->n];
        return 0;
    case F_LOOP_CHANGED: {
        jval now = jv_list(r, L_TUPLE, a->n);
        if (!now.u.l) return -1;
        if (a->n) memcpy(now.u.l->v, a->args, sizeof(jval) * (size_t)a->n);
        int same = f->loop->last_changed.t == V_UNDEF ? 0 : jv_equal(r, f->loop->last_changed, now);
        if (same < 0) return -1;
        f->loop->last_changed = now;
        *out = jv_bool(!same);
        return 0;
    }
    default: {
        jval caller = jv_none();
        jargs rest = *a;
        if (f->kind == F_MACRO) { /* a call block hands its body over as the last keyword argument */
            if (rest.n_kw && js_eqc(rest.names[rest.n_kw - 1], "caller") && rest.kwargs[rest.n_kw - 1].t == V_FUNC &&
                rest.kwargs[rest.n_kw - 1].u.fn->kind == F_CALLER) {
                caller = rest.kwargs[rest.n_kw - 1];
                rest.n_kw--;
            }
            return run_callable_body(r, f->node, f->closure, &rest, caller, f->node->s, out);
        }
        return run_callable_body(r, f->node, f->closure, &rest, caller, JS_C("caller"), out);
    }
    }
}

static int eval_filter(jrender *r, jscope *sc, const jnode *e, const jval *input, jval *out) {
    jval v;
    if (e->a) {
        if (e->a->kind == E_FILTER ? eval_filter(r, sc, e->a, input, &v) : eval(r, sc, e->a, &v)) return -1;
    } else {
        v = *input;
    }
    jargs a;
    if (eval_args(r, sc, e, 0, &a) != 0) return -1;
    r->pos = e->pos;
    if (e->op == -1) return jr_fail(r, "unknown filter \"%.*s\"", (int)e->s.n, e->s.p);
    if (e->op == -2) return jr_fail(r, "the filter \"%.*s\" is not supported", (int)e->s.n, e->s.p);
    return jinja_apply_filter(r, e->op, e->s, v, &a, out);
}

static int eval_compare(jrender *r, jscope *sc, const jnode *e, jval *out) {
    jval left;
    if (eval(r, sc, e->a, &left) != 0) return -1;
    for (int i = 0; i < e->n; i++) {
        const jnode *o = e->kids[i];
        jval right;
        int res, cmp;
        if (eval(r, sc, o->a, &right) != 0) return -1;
        r->pos = o->pos;
        switch (o->op) {
        case T_EQ:
        case T_NE:
            if ((res = jv_equal(r, left, right)) < 0) return -1;
            if (o->op == T_NE) res = !res;
            break;
        case OP_IN:
        case OP_NOTIN:
            if (jv_contains(r, right, left, &res) != 0) return -1;
            if (o->op == OP_NOTIN) res = !res;
            break;
        default:
            if (jv_order(r, left, right, &cmp) != 0) return -1;
            res = o->op == T_LT ? cmp == -1 : o->op == T_LTEQ ? cmp == -1 || cmp == 0 : o->op == T_GT ? cmp == 1
                                                                                             : cmp == 0 || cmp == 1;
        }
        if (!res) {
            *out = jv_bool(0);
            return 0;
        }
        left = right;
    }
    *out = jv_bool(1);
    return 0;
}

static int eval_literal_list(jrender *r, jscope *sc, const jnode *e, int kind, jval *out) {
    jval l = jv_list(r, kind, e->n);
    if (!l.u.l) return -1;
    for (int i = 0; i < e->n; i++)
        if (eval(r, sc, e->kids[i], &l.u.l->v[i]) != 0) return -1;
    *out = l;
    return 0;
}

static int eval_dict(jrender *r, jscope *sc, const jnode *e, jval *out) {
    jval d = jv_dict(r, e->n);
    if (!d.u.d) return -1;
    for (int i = 0; i < e->n; i++) {
        jval k, v;
        if (eval(r, sc, e->kids[i], &k) != 0 || eval(r, sc, e->more[i], &v) != 0) return -1;
        r->pos = e->kids[i]->pos;
        if (jv_dict_put(r, d.u.d, k, v) != 0) return -1;
    }
    *out = d;
    return 0;
}

static int eval_inner(jrender *r, jscope *sc, const jnode *e, jval *out) {
    jval a, b;
    switch (e->kind) {
    case E_STR: *out = jv_str(e->s); return 0;
    case E_INT: *out = jv_int(e->i); return 0;
    case E_FLOAT: *out = jv_float(e->f); return 0;
    case E_BOOL: *out = jv_bool((int)e->i); return 0;
    case E_NONE: *out = jv_none(); return 0;
    case E_NAME: return lookup(r, sc, e->s, out);
    case E_LIST: return eval_literal_list(r, sc, e, L_LIST, out);
    case E_TUPLE: return eval_literal_list(r, sc, e, L_TUPLE, out);
    case E_DICT: return eval_dict(r, sc, e, out);
    case E_GETATTR:
        if (eval(r, sc, e->a, &a) != 0) return -1;
        r->pos = e->pos;
        return jv_getattr(r, a, e->s, out);
    case E_GETITEM: {
        if (eval(r, sc, e->a, &a) != 0) return -1;
        if (e->b->kind != E_SLICE) {
            if (eval(r, sc, e->b, &b) != 0) return -1;
            r->pos = e->pos;
            return jv_getitem(r, a, b, out);
        }
        jval bounds[3];
        const jnode *parts[3] = {e->b->a, e->b->b, e->b->c};
        for (int k = 0; k < 3; k++) {
            bounds[k] = jv_none();
            if (parts[k] && eval(r, sc, parts[k], &bounds[k]) != 0) return -1;
        }
        r->pos = e->pos;
        return jv_slice(r, a, bounds, out);
    }
    case E_SLICE: return jr_fail(r, "a slice is only supported as the one subscript");
    case E_CALL: {
        jargs args;
        if (eval(r, sc, e->a, &a) != 0 || eval_args(r, sc, e, 0, &args) != 0) return -1;
        r->pos = e->pos;
        return call_value(r, a, &args, out);
    }
    case E_FILTER: return eval_filter(r, sc, e, NULL, out);
    case E_TEST: {
        jargs args;
        int res;
        if (eval(r, sc, e->a, &a) != 0 || eval_args(r, sc, e, 0, &args) != 0) return -1;
        r->pos = e->pos;
        if (e->op == -1) return jr_fail(r, "unknown test \"%.*s\"", (int)e->s.n, e->s.p);
        if (e->op == -2) return jr_fail(r, "the test \"%.*s\" is not supported", (int)e->s.n, e->s.p);
        if (jinja_apply_test(r, e->op, e->s, a, &args, &res) != 0) return -1;
        *out = jv_bool(res);
        return 0;
    }
    case E_NOT:
        if (eval(r, sc, e->a, &a) != 0) return -1;
        *out = jv_bool(!jv_truthy(a));
        return 0;
    case E_NEG:
    case E_POS:
        if (eval(r, sc, e->a, &a) != 0) return -1;
        r->pos = e->pos;
        if (a.t == V_UNDEF) return fail_undefined(r, a);
        if (!jv_is_num(a))
            return jr_fail(r, "bad operand type for unary %c: '%s'", e->kind == E_NEG ? '-' : '+', jv_type_name(a));
        if (a.t == V_FLOAT) *out = jv_float(e->kind == E_NEG ? -a.u.f : a.u.f);
        else if (e->kind == E_NEG && a.u.i == LLONG_MIN) return jr_fail(r, "integer overflow");
        else *out = jv_int(e->kind == E_NEG ? -a.u.i : a.u.i);
        return 0;
    case E_BINOP:
        if (eval(r, sc, e->a, &a) != 0 || eval(r, sc, e->b, &b) != 0) return -1;
        r->pos = e->pos;
        return binop(r, e->op, a, b, out);
    case E_CONCAT: {
        jbuf buf = {0};
        for (int i = 0; i < e->n; i++) {
            jstr s;
            if (eval(r, sc, e->kids[i], &a) != 0 || jv_to_str(r, a, &s) != 0 || jb_put(r, &buf, s) != 0) return -1;
        }
        *out = jv_str(jb_str(&buf));
        return 0;
    }
    case E_AND:
    case E_OR:
        if (eval(r, sc, e->a, &a) != 0) return -1;
        if (jv_truthy(a) == (e->kind == E_OR)) {
            *out = a;
            return 0;
        }
        return eval(r, sc, e->b, out);
    case E_COMPARE: return eval_compare(r, sc, e, out);
    case E_COND:
        if (eval(r, sc, e->b, &a) != 0) return -1;
        if (jv_truthy(a)) return eval(r, sc, e->a, out);
        if (e->c) return eval(r, sc, e->c, out);
        *out = jv_undef(JS_C("the inline if-expression evaluated to false and no else section was defined."));
        return 0;
    default: return jr_fail(r, "internal error: expression kind %d", e->kind);
    }
}

static int eval(jrender *r, jscope *sc, const jnode *e, jval *out) {
    if (r->failed || jr_charge(r, 1) != 0) return -1;
    if (++r->depth > r->lim.max_depth) return jr_fail(r, "expressions nested more than %d deep", r->lim.max_depth);
    r->pos = e->pos;
    int rc = eval_inner(r, sc, e, out);
    r->depth--;
    return rc;
}

/* ---- statements ---- */

static int exec_for(jrender *r, jscope *sc, const jnode *s, jbuf *out) {
    jval it;
    const jval *items;
    int n;
    if (eval(r, sc, s->b, &it) != 0) return -1;
    r->pos = s->b->pos;
    if (it.t == V_UNDEF) n = 0, items = NULL;
    else if (jv_items(r, it, &items, &n) != 0) return -1;
    if (s->c) { /* {% for x in xs if cond %}: the loop sees only the items that pass */
        jval *kept = n ? jr_alloc(r, sizeof(jval) * (size_t)n) : NULL;
        int k = 0;
        if (n && !kept) return -1;
        for (int i = 0; i < n; i++) {
            jval keep;
            jscope *isc = scope_new(r, sc);
            if (++r->iterations > r->lim.max_iterations)
                return jr_fail(r, "the loops ran more than %ld iterations (the limit)", r->lim.max_iterations);
            if (!isc || assign(r, isc, s->a, items[i]) != 0 || eval(r, isc, s->c, &keep) != 0) return -1;
            if (jv_truthy(keep)) kept[k++] = items[i];
        }
        items = kept;
        n = k;
    }
    if (n == 0) {
        jscope *esc = scope_new(r, sc);
        return esc && exec_body(r, esc, s->more, s->n_more, out) >= 0 ? 0 : -1;
    }
    jloop *lp = jr_alloc(r, sizeof *lp);
    if (!lp) return -1;
    lp->length = n;
    lp->items = items;
    lp->last_changed = jv_undef(JS_C(""));
    for (int i = 0; i < n; i++) {
        r->pos = s->pos;
        if (++r->iterations > r->lim.max_iterations)
            return jr_fail(r, "the loops ran more than %ld iterations (the limit)", r->lim.max_iterations);
        jscope *isc = scope_new(r, sc);
        jval loop = {V_LOOP, {0}};
        loop.u.loop = lp;
        lp->index0 = i;
        if (!isc || assign(r, isc, s->a, items[i]) != 0 || scope_set(r, isc, JS_C("loop"), loop) != 0) return -1;
        int flow = exec_body(r, isc, s->kids, s->n, out);
        if (flow < 0) return -1;
        if (flow == FLOW_BREAK) break;
    }
    return 0;
}

static int exec_set(jrender *r, jscope *sc, const jnode *s, jval v) {
    if (s->a->kind != E_NSREF) return assign(r, sc, s->a, v);
    jval ns;
    if (lookup(r, sc, s->a->s, &ns) != 0) return -1;
    r->pos = s->a->pos;
    if (ns.t != V_NS) return jr_fail(r, "cannot assign attribute on non-namespace object");
    return ns_set(r, ns.u.ns, s->a->a->s, v);
}

/* Runs body in a scope of its own and returns what it wrote. */
static int capture(jrender *r, jscope *sc, const jnode *body, jval *out) {
    jscope *inner = scope_new(r, sc);
    jbuf b = {0};
    if (!inner || exec_body(r, inner, body->kids, body->n, &b) < 0) return -1;
    *out = jv_str(jb_str(&b));
    return 0;
}

static int exec_stmt(jrender *r, jscope *sc, const jnode *s, jbuf *out) {
    jval v;
    switch (s->kind) {
    case S_DATA: return jb_put(r, out, s->s);
    case S_OUTPUT: {
        jstr str;
        if (eval(r, sc, s->a, &v) != 0) return -1;
        r->pos = s->pos;
        return jv_to_str(r, v, &str) != 0 ? -1 : jb_put(r, out, str);
    }
    case S_BODY: return exec_body(r, sc, s->kids, s->n, out);
    case S_IF:
        for (int i = 0; i + 1 < s->n; i += 2) {
            if (eval(r, sc, s->kids[i], &v) != 0) return -1;
            if (jv_truthy(v)) return exec_body(r, sc, s->kids[i + 1]->kids, s->kids[i + 1]->n, out);
        }
        return s->a ? exec_body(r, sc, s->a->kids, s->a->n, out) : 0;
    case S_FOR: return exec_for(r, sc, s, out);
    case S_SET: return eval(r, sc, s->b, &v) != 0 ? -1 : exec_set(r, sc, s, v);
    case S_SETBLOCK:
        if (capture(r, sc, s->c, &v) != 0) return -1;
        if (s->b && eval_filter(r, sc, s->b, &v, &v) != 0) return -1;
        return exec_set(r, sc, s, v);
    case S_BREAK: return FLOW_BREAK;
    case S_CONTINUE: return FLOW_CONTINUE;
    case S_MACRO:
    case S_CALLBLOCK: {
        jfunc *f = jr_func(r, s->kind == S_MACRO ? F_MACRO : F_CALLER, s->s, &v);
        if (!f) return -1;
        f->node = s;
        f->closure = sc;
        if (s->kind == S_MACRO) return scope_set(r, sc, s->s, v);
        jval callee, res;
        jargs a;
        const jnode *call = s->b;
        if (eval(r, sc, call->a, &callee) != 0 || eval_args(r, sc, call, 1, &a) != 0) return -1;
        a.names[a.n_kw] = JS_C("caller");
        a.kwargs[a.n_kw++] = v;
        r->pos = call->pos;
        jstr str;
        if (call_value(r, callee, &a, &res) != 0 || jv_to_str(r, res, &str) != 0) return -1;
        return jb_put(r, out, str);
    }
    case S_FILTERBLOCK: {
        jstr str;
        if (capture(r, sc, s->b, &v) != 0 || eval_filter(r, sc, s->a, &v, &v) != 0 || jv_to_str(r, v, &str) != 0)
            return -1;
        return jb_put(r, out, str);
    }
    case S_WITH: {
        jval *vals = s->n ? jr_alloc(r, sizeof(jval) * (size_t)s->n) : NULL;
        if (s->n && !vals) return -1;
        for (int i = 0; i < s->n; i++)
            if (eval(r, sc, s->more[i], &vals[i]) != 0) return -1;
        jscope *inner = scope_new(r, sc);
        if (!inner) return -1;
        for (int i = 0; i < s->n; i++)
            if (assign(r, inner, s->kids[i], vals[i]) != 0) return -1;
        return exec_body(r, inner, s->a->kids, s->a->n, out) < 0 ? -1 : 0;
    }
    case S_GENERATION: {
        jstr str;
        return capture(r, sc, s->a, &v) != 0 || jv_to_str(r, v, &str) != 0 ? -1 : jb_put(r, out, str);
    }
    default: return jr_fail(r, "internal error: statement kind %d", s->kind);
    }
}

/* FLOW_NEXT, FLOW_BREAK or FLOW_CONTINUE (a loop control met inside), or -1. */
static int exec_body(jrender *r, jscope *sc, jnode *const *stmts, int n, jbuf *out) {
    if (++r->depth > r->lim.max_depth) return jr_fail(r, "statements nested more than %d deep", r->lim.max_depth);
    for (int i = 0; i < n; i++) {
        if (r->failed || jr_charge(r, 1) != 0) return -1;
        r->pos = stmts[i]->pos;
        int flow = exec_stmt(r, sc, stmts[i], out);
        if (flow != FLOW_NEXT) {
            r->depth--;
            return flow;
        }
    }
    r->depth--;
    return FLOW_NEXT;
}

int jinja_exec(jrender *r, const jnode *root, jbuf *out) {
    jscope *top = scope_new(r, r->globals);
    if (!top) return -1;
    return exec_body(r, top, root->kids, root->n, out) < 0 ? -1 : 0;
}
