/* Tokens to a tree, following jinja2's parser: the helpers both halves use, and expressions with
 * jinja2's operator precedence (jinja_parse_stmt.c has the statements). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "jinja_parser.h"

void *jp_fail(parser *p, int pos, const char *fmt, ...) {
    if (p->failed) return NULL;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->failed = 1;
    jinja_error_at(p->t->src, p->t->len, pos, msg);
    return NULL;
}

void jp_describe(const jtoken *t, char *buf, size_t cap) {
    if (t->type == T_NAME) snprintf(buf, cap, "%.*s", (int)(t->text.n > 60 ? 60 : t->text.n), t->text.p);
    else snprintf(buf, cap, "%s", jinja_token_name(t->type));
}

int jp_expect(parser *p, int type) {
    if (jp_cur(p)->type == type) {
        jp_next(p);
        return 0;
    }
    char got[80];
    jp_describe(jp_cur(p), got, sizeof got);
    if (jp_cur(p)->type == T_EOF)
        jp_fail(p, jp_cur(p)->pos, "unexpected end of template, expected '%s'", jinja_token_name(type));
    else jp_fail(p, jp_cur(p)->pos, "expected token '%s', got '%s'", jinja_token_name(type), got);
    return -1;
}

int jp_expect_name(parser *p, const char *w) {
    if (jp_is_name(jp_cur(p), w)) {
        jp_next(p);
        return 0;
    }
    char got[80];
    jp_describe(jp_cur(p), got, sizeof got);
    jp_fail(p, jp_cur(p)->pos, "expected token '%s', got '%s'", w, got);
    return -1;
}

jnode *jp_node(parser *p, int kind, int pos) {
    jnode *n = ja_alloc(p->a, sizeof *n);
    if (!n) return jp_fail(p, pos, "out of memory");
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->pos = pos;
    return n;
}

int jp_push_opt(parser *p, nvec *v, jnode *x, int pos) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        jnode **nv = ja_alloc(p->a, sizeof *nv * (size_t)cap);
        if (!nv) {
            jp_fail(p, pos, "out of memory");
            return -1;
        }
        if (v->n) memcpy(nv, v->v, sizeof *nv * (size_t)v->n);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return 0;
}

int jp_push(parser *p, nvec *v, jnode *x) { return x ? jp_push_opt(p, v, x, x->pos) : -1; }

/* One more level of nesting (nested brackets, chained operators, statements inside statements):
 * the tree's depth is bounded, so walking it cannot exhaust the stack. */
int jp_enter(parser *p) {
    if (++p->depth > MAX_NESTING) {
        jp_fail(p, jp_cur(p)->pos, "the template nests more than %d levels deep", MAX_NESTING);
        return -1;
    }
    return 0;
}

/* ---- expressions ---- */

static jnode *parse_unary(parser *p, int with_filter);
static jnode *parse_primary(parser *p);
static jnode *parse_postfix(parser *p, jnode *node);
static int parse_call_args(parser *p, jnode *call);

static jnode *parse_list(parser *p) {
    jnode *n = jp_node(p, E_LIST, jp_cur(p)->pos);
    nvec items = {0};
    jp_next(p);
    while (n && jp_cur(p)->type != T_RBRACKET) {
        if (items.n && jp_expect(p, T_COMMA) != 0) return NULL;
        if (jp_cur(p)->type == T_RBRACKET) break;
        if (jp_push(p, &items, jp_expression(p, 1)) != 0) return NULL;
    }
    if (!n || jp_expect(p, T_RBRACKET) != 0) return NULL;
    n->kids = items.v;
    n->n = items.n;
    return n;
}

static jnode *parse_dict(parser *p) {
    jnode *n = jp_node(p, E_DICT, jp_cur(p)->pos);
    nvec keys = {0}, values = {0};
    jp_next(p);
    while (n && jp_cur(p)->type != T_RBRACE) {
        if (keys.n && jp_expect(p, T_COMMA) != 0) return NULL;
        if (jp_cur(p)->type == T_RBRACE) break;
        if (jp_push(p, &keys, jp_expression(p, 1)) != 0 || jp_expect(p, T_COLON) != 0 ||
            jp_push(p, &values, jp_expression(p, 1)) != 0)
            return NULL;
    }
    if (!n || jp_expect(p, T_RBRACE) != 0) return NULL;
    n->kids = keys.v;
    n->n = keys.n;
    n->more = values.v;
    n->n_more = values.n;
    return n;
}

static jnode *parse_primary(parser *p) {
    const jtoken *t = jp_cur(p);
    jnode *n;
    if (jp_enter(p) != 0) return NULL;
    switch (t->type) {
    case T_NAME:
        if (js_eqc(t->text, "true") || js_eqc(t->text, "false") || js_eqc(t->text, "True") || js_eqc(t->text, "False")) {
            if (!(n = jp_node(p, E_BOOL, t->pos))) return NULL;
            n->i = t->text.p[0] == 't' || t->text.p[0] == 'T';
        } else if (js_eqc(t->text, "none") || js_eqc(t->text, "None")) {
            n = jp_node(p, E_NONE, t->pos);
        } else {
            if ((n = jp_node(p, E_NAME, t->pos))) n->s = t->text;
        }
        jp_next(p);
        break;
    case T_STRING: {
        /* adjacent literals are one string, as in Python */
        size_t total = 0;
        int k = p->i;
        for (; p->t->tok[k].type == T_STRING; k++) total += p->t->tok[k].text.n;
        if (!(n = jp_node(p, E_STR, t->pos))) return NULL;
        if (k == p->i + 1) {
            n->s = t->text;
        } else {
            char *s = ja_alloc(p->a, total + 1);
            if (!s) return jp_fail(p, t->pos, "out of memory");
            size_t at = 0;
            for (int j = p->i; j < k; j++) {
                memcpy(s + at, p->t->tok[j].text.p, p->t->tok[j].text.n);
                at += p->t->tok[j].text.n;
            }
            n->s = js_lit(s, total);
        }
        p->i = k;
        break;
    }
    case T_INT:
        if ((n = jp_node(p, E_INT, t->pos))) n->i = t->i;
        jp_next(p);
        break;
    case T_FLOAT:
        if ((n = jp_node(p, E_FLOAT, t->pos))) n->f = t->f;
        jp_next(p);
        break;
    case T_LPAREN:
        jp_next(p);
        n = jp_tuple(p, 0, 1, NULL, 1);
        if (n && jp_expect(p, T_RPAREN) != 0) return NULL;
        break;
    case T_LBRACKET: n = parse_list(p); break;
    case T_LBRACE: n = parse_dict(p); break;
    default: {
        char got[80];
        jp_describe(t, got, sizeof got);
        if (t->type == T_EOF) return jp_fail(p, t->pos, "unexpected end of template");
        return jp_fail(p, t->pos, "unexpected '%s'", got);
    }
    }
    p->depth--;
    return n;
}

/* An expression ends a tuple here: the end of the tag, a closing parenthesis or extra_end. */
static int tuple_end(const parser *p, const char *extra_end) {
    int type = jp_cur(p)->type;
    return type == T_VAR_END || type == T_BLOCK_END || type == T_RPAREN || type == T_EOF ||
           (extra_end && jp_is_name(jp_cur(p), extra_end));
}

jnode *jp_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end, int explicit_parens) {
    int pos = jp_cur(p)->pos, is_tuple = 0;
    nvec items = {0};
    for (;;) {
        if (items.n && jp_expect(p, T_COMMA) != 0) return NULL;
        if (tuple_end(p, extra_end)) break;
        if (jp_push(p, &items, simplified ? parse_primary(p) : jp_expression(p, with_condexpr)) != 0) return NULL;
        if (jp_cur(p)->type != T_COMMA) break;
        is_tuple = 1;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) {
            char got[80];
            jp_describe(jp_cur(p), got, sizeof got);
            return jp_fail(p, jp_cur(p)->pos, "expected an expression, got '%s'", got);
        }
    }
    jnode *n = jp_node(p, E_TUPLE, pos);
    if (!n) return NULL;
    n->kids = items.v;
    n->n = items.n;
    return n;
}

static jnode *parse_subscribed(parser *p) {
    int pos = jp_cur(p)->pos;
    jnode *start = NULL, *stop = NULL, *step = NULL;
    if (jp_cur(p)->type == T_COLON) {
        jp_next(p);
    } else {
        start = jp_expression(p, 1);
        if (!start || jp_cur(p)->type != T_COLON) return start;
        jp_next(p);
    }
    int type = jp_cur(p)->type;
    if (type != T_COLON && type != T_RBRACKET && type != T_COMMA && !(stop = jp_expression(p, 1))) return NULL;
    if (jp_cur(p)->type == T_COLON) {
        jp_next(p);
        type = jp_cur(p)->type;
        if (type != T_RBRACKET && type != T_COMMA && !(step = jp_expression(p, 1))) return NULL;
    }
    jnode *n = jp_node(p, E_SLICE, pos);
    if (!n) return NULL;
    n->a = start;
    n->b = stop;
    n->c = step;
    return n;
}

static jnode *parse_subscript(parser *p, jnode *node) {
    const jtoken *t = jp_cur(p);
    jp_next(p);
    if (t->type == T_DOT) {
        const jtoken *attr = jp_cur(p);
        jp_next(p);
        jnode *n = jp_node(p, attr->type == T_NAME ? E_GETATTR : E_GETITEM, t->pos);
        if (!n) return NULL;
        n->a = node;
        if (attr->type == T_NAME) {
            n->s = attr->text;
            return n;
        }
        if (attr->type != T_INT) return jp_fail(p, attr->pos, "expected name or number");
        if (!(n->b = jp_node(p, E_INT, attr->pos))) return NULL;
        n->b->i = attr->i;
        return n;
    }
    nvec args = {0};
    while (jp_cur(p)->type != T_RBRACKET) {
        if (args.n && jp_expect(p, T_COMMA) != 0) return NULL;
        if (jp_push(p, &args, parse_subscribed(p)) != 0) return NULL;
    }
    if (jp_expect(p, T_RBRACKET) != 0) return NULL;
    jnode *n = jp_node(p, E_GETITEM, t->pos);
    if (!n) return NULL;
    n->a = node;
    if (args.n == 1) {
        n->b = args.v[0];
    } else {
        if (!(n->b = jp_node(p, E_TUPLE, t->pos))) return NULL;
        n->b->kids = args.v;
        n->b->n = args.n;
    }
    return n;
}

static jnode *parse_call(parser *p, jnode *node) {
    jnode *n = jp_node(p, E_CALL, node->pos);
    if (!n) return NULL;
    n->a = node;
    return parse_call_args(p, n) == 0 ? n : NULL;
}

/* (args, name=value, ...) into call->kids and call->more (E_KWARG nodes). */
static int parse_call_args(parser *p, jnode *call) {
    int pos = jp_cur(p)->pos;
    nvec args = {0}, kwargs = {0};
    if (jp_expect(p, T_LPAREN) != 0) return -1;
    int need_comma = 0;
    while (jp_cur(p)->type != T_RPAREN) {
        if (need_comma) {
            if (jp_expect(p, T_COMMA) != 0) return -1;
            if (jp_cur(p)->type == T_RPAREN) break;
        }
        if (jp_cur(p)->type == T_MUL || jp_cur(p)->type == T_POW) {
            jp_fail(p, jp_cur(p)->pos, "calls with *args or **kwargs are not supported");
            return -1;
        }
        if (jp_cur(p)->type == T_NAME && jp_look(p)->type == T_ASSIGN) {
            jnode *kw = jp_node(p, E_KWARG, jp_cur(p)->pos);
            if (!kw) return -1;
            kw->s = jp_cur(p)->text;
            jp_next(p);
            jp_next(p);
            if (!(kw->a = jp_expression(p, 1)) || jp_push(p, &kwargs, kw) != 0) return -1;
        } else {
            if (kwargs.n) {
                jp_fail(p, pos, "invalid syntax for function call expression");
                return -1;
            }
            if (jp_push(p, &args, jp_expression(p, 1)) != 0) return -1;
        }
        need_comma = 1;
    }
    if (jp_expect(p, T_RPAREN) != 0) return -1;
    call->kids = args.v;
    call->n = args.n;
    call->more = kwargs.v;
    call->n_more = kwargs.n;
    return 0;
}

/* A filter or test name, dotted names included (jinja2 allows them; none is known here). */
static int parse_callee_name(parser *p, jnode *n) {
    if (jp_cur(p)->type != T_NAME) {
        jp_expect(p, T_NAME);
        return -1;
    }
    n->s = jp_cur(p)->text;
    jp_next(p);
    while (jp_cur(p)->type == T_DOT) {
        jp_next(p);
        if (jp_cur(p)->type != T_NAME) {
            jp_expect(p, T_NAME);
            return -1;
        }
        n->s.n = (size_t)(jp_cur(p)->text.p + jp_cur(p)->text.n - n->s.p);
        jp_next(p);
    }
    return 0;
}

jnode *jp_filter(parser *p, jnode *node, int start_inline) {
    int saved = p->depth;
    while (jp_cur(p)->type == T_PIPE || start_inline) {
        if (!start_inline) jp_next(p);
        start_inline = 0;
        if (jp_enter(p) != 0) return NULL;
        jnode *f = jp_node(p, E_FILTER, jp_cur(p)->pos);
        if (!f || parse_callee_name(p, f) != 0) return NULL;
        f->a = node;
        f->op = jinja_filter_id(f->s);
        if (jp_cur(p)->type == T_LPAREN && parse_call_args(p, f) != 0) return NULL;
        node = f;
    }
    p->depth = saved;
    return node;
}

static jnode *parse_test(parser *p, jnode *node) {
    int pos = jp_cur(p)->pos, negated = 0;
    jp_next(p); /* is */
    if (jp_is_name(jp_cur(p), "not")) {
        jp_next(p);
        negated = 1;
    }
    jnode *t = jp_node(p, E_TEST, jp_cur(p)->pos);
    if (!t || parse_callee_name(p, t) != 0) return NULL;
    t->a = node;
    t->op = jinja_test_id(t->s);
    int type = jp_cur(p)->type;
    if (type == T_LPAREN) {
        if (parse_call_args(p, t) != 0) return NULL;
    } else if ((type == T_NAME || type == T_STRING || type == T_INT || type == T_FLOAT || type == T_LBRACKET ||
                type == T_LBRACE) &&
               !jp_is_name(jp_cur(p), "else") && !jp_is_name(jp_cur(p), "or") && !jp_is_name(jp_cur(p), "and")) {
        if (jp_is_name(jp_cur(p), "is")) return jp_fail(p, jp_cur(p)->pos, "You cannot chain multiple tests with is");
        jnode *arg = parse_primary(p);
        if (!arg || !(arg = parse_postfix(p, arg))) return NULL;
        if (!(t->kids = ja_alloc(p->a, sizeof(jnode *)))) return jp_fail(p, pos, "out of memory");
        t->kids[0] = arg;
        t->n = 1;
    }
    if (!negated) return t;
    jnode *n = jp_node(p, E_NOT, pos);
    if (n) n->a = t;
    return n;
}

static jnode *parse_postfix(parser *p, jnode *node) {
    int saved = p->depth;
    while (node) {
        int type = jp_cur(p)->type;
        if (type != T_DOT && type != T_LBRACKET && type != T_LPAREN) break;
        if (jp_enter(p) != 0) return NULL;
        node = type == T_LPAREN ? parse_call(p, node) : parse_subscript(p, node);
    }
    p->depth = saved;
    return node;
}

static jnode *parse_filter_expr(parser *p, jnode *node) {
    int saved = p->depth;
    while (node) {
        if (jp_cur(p)->type == T_PIPE) node = jp_filter(p, node, 0);
        else if (jp_is_name(jp_cur(p), "is")) node = parse_test(p, node);
        else if (jp_cur(p)->type == T_LPAREN) node = parse_call(p, node);
        else break;
        if (jp_enter(p) != 0) return NULL;
    }
    p->depth = saved;
    return node;
}

static jnode *parse_unary(parser *p, int with_filter) {
    int type = jp_cur(p)->type, pos = jp_cur(p)->pos;
    jnode *node;
    if (jp_enter(p) != 0) return NULL;
    if (type == T_SUB || type == T_ADD) {
        jp_next(p);
        node = jp_node(p, type == T_SUB ? E_NEG : E_POS, pos);
        if (node && !(node->a = parse_unary(p, 0))) return NULL;
    } else {
        node = parse_primary(p);
    }
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    p->depth--;
    return node;
}

static jnode *binop(parser *p, int kind, int op, int pos, jnode *a, jnode *b) {
    if (!a || !b) return NULL;
    jnode *n = jp_node(p, kind, pos);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *p) {
    int saved = p->depth;
    jnode *left = parse_unary(p, 1);
    while (left && jp_cur(p)->type == T_POW) {
        int pos = jp_cur(p)->pos;
        jp_next(p);
        if (jp_enter(p) != 0) return NULL;
        left = binop(p, E_BINOP, T_POW, pos, left, parse_unary(p, 1));
    }
    p->depth = saved;
    return left;
}

static jnode *parse_math2(parser *p) {
    int saved = p->depth;
    jnode *left = parse_pow(p);
    for (;;) {
        int type = jp_cur(p)->type, pos = jp_cur(p)->pos;
        if (!left || (type != T_MUL && type != T_DIV && type != T_FLOORDIV && type != T_MOD)) break;
        jp_next(p);
        if (jp_enter(p) != 0) return NULL;
        left = binop(p, E_BINOP, type, pos, left, parse_pow(p));
    }
    p->depth = saved;
    return left;
}

static jnode *parse_concat(parser *p) {
    int pos = jp_cur(p)->pos;
    nvec args = {0};
    if (jp_push(p, &args, parse_math2(p)) != 0) return NULL;
    while (jp_cur(p)->type == T_TILDE) {
        jp_next(p);
        if (jp_push(p, &args, parse_math2(p)) != 0) return NULL;
    }
    if (args.n == 1) return args.v[0];
    jnode *n = jp_node(p, E_CONCAT, pos);
    if (!n) return NULL;
    n->kids = args.v;
    n->n = args.n;
    return n;
}

static jnode *parse_math1(parser *p) {
    int saved = p->depth;
    jnode *left = parse_concat(p);
    for (;;) {
        int type = jp_cur(p)->type, pos = jp_cur(p)->pos;
        if (!left || (type != T_ADD && type != T_SUB)) break;
        jp_next(p);
        if (jp_enter(p) != 0) return NULL;
        left = binop(p, E_BINOP, type, pos, left, parse_concat(p));
    }
    p->depth = saved;
    return left;
}

static jnode *parse_compare(parser *p) {
    int pos = jp_cur(p)->pos;
    jnode *expr = parse_math1(p);
    nvec ops = {0};
    while (expr) {
        int type = jp_cur(p)->type, op;
        if (type == T_EQ || type == T_NE || type == T_LT || type == T_LTEQ || type == T_GT || type == T_GTEQ) {
            op = type;
            jp_next(p);
        } else if (jp_is_name(jp_cur(p), "in")) {
            op = OP_IN;
            jp_next(p);
        } else if (jp_is_name(jp_cur(p), "not") && jp_is_name(jp_look(p), "in")) {
            op = OP_NOTIN;
            jp_next(p);
            jp_next(p);
        } else {
            break;
        }
        jnode *o = jp_node(p, E_OPERAND, jp_cur(p)->pos);
        if (!o || !(o->a = parse_math1(p)) || jp_push(p, &ops, o) != 0) return NULL;
        o->op = op;
    }
    if (!expr || !ops.n) return expr;
    jnode *n = jp_node(p, E_COMPARE, pos);
    if (!n) return NULL;
    n->a = expr;
    n->kids = ops.v;
    n->n = ops.n;
    return n;
}

static jnode *parse_not(parser *p) {
    if (!jp_is_name(jp_cur(p), "not")) return parse_compare(p);
    int pos = jp_cur(p)->pos;
    jp_next(p);
    if (jp_enter(p) != 0) return NULL;
    jnode *n = jp_node(p, E_NOT, pos);
    if (n && !(n->a = parse_not(p))) return NULL;
    p->depth--;
    return n;
}

static jnode *parse_and(parser *p) {
    int saved = p->depth;
    jnode *left = parse_not(p);
    while (left && jp_is_name(jp_cur(p), "and")) {
        int pos = jp_cur(p)->pos;
        jp_next(p);
        if (jp_enter(p) != 0) return NULL;
        left = binop(p, E_AND, 0, pos, left, parse_not(p));
    }
    p->depth = saved;
    return left;
}

static jnode *parse_or(parser *p) {
    int saved = p->depth;
    jnode *left = parse_and(p);
    while (left && jp_is_name(jp_cur(p), "or")) {
        int pos = jp_cur(p)->pos;
        jp_next(p);
        if (jp_enter(p) != 0) return NULL;
        left = binop(p, E_OR, 0, pos, left, parse_and(p));
    }
    p->depth = saved;
    return left;
}

static jnode *parse_condexpr(parser *p) {
    int saved = p->depth;
    jnode *e1 = parse_or(p);
    while (e1 && jp_is_name(jp_cur(p), "if")) {
        int pos = jp_cur(p)->pos;
        jp_next(p);
        if (jp_enter(p) != 0) return NULL;
        jnode *n = jp_node(p, E_COND, pos);
        if (!n || !(n->b = parse_or(p))) return NULL;
        n->a = e1;
        if (jp_is_name(jp_cur(p), "else")) {
            jp_next(p);
            if (!(n->c = parse_condexpr(p))) return NULL;
        }
        e1 = n;
    }
    p->depth = saved;
    return e1;
}

jnode *jp_expression(parser *p, int with_condexpr) {
    if (jp_enter(p) != 0) return NULL;
    jnode *n = with_condexpr ? parse_condexpr(p) : parse_or(p);
    p->depth--;
    return n;
}
