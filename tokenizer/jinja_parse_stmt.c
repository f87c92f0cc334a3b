/* Statements (for, if, set, macro, call, filter, with, print, break, continue, generation) to a
 * tree, and the check jinja2's compiler makes afterwards: unknown filters and tests fail at
 * compile time unless they sit inside an if (there they fail only when they run). */
#include <stdio.h>
#include <string.h>

#include "jinja_parser.h"

/* ---- statements ---- */

static jnode *subparse(parser *p, const char *const *ends);

static int can_assign(const jnode *t) {
    if (t->kind == E_NAME) return 1;
    if (t->kind != E_TUPLE) return 0;
    for (int i = 0; i < t->n; i++)
        if (!can_assign(t->kids[i])) return 0;
    return 1;
}

static jnode *parse_assign_target(parser *p, int with_namespace, const char *extra_end) {
    const jtoken *t = jp_cur(p);
    if (with_namespace && t->type == T_NAME && jp_look(p)->type == T_DOT) {
        jnode *n = jp_node(p, E_NSREF, t->pos);
        if (!n) return NULL;
        n->s = t->text;
        jp_next(p);
        jp_next(p);
        if (jp_cur(p)->type != T_NAME) {
            jp_expect(p, T_NAME);
            return NULL;
        }
        if (!(n->a = jp_node(p, E_STR, jp_cur(p)->pos))) return NULL;
        n->a->s = jp_cur(p)->text;
        jp_next(p);
        return n;
    }
    jnode *target = jp_tuple(p, 1, 1, extra_end, 0);
    if (target && !can_assign(target)) return jp_fail(p, target->pos, "can't assign to this expression");
    return target;
}

/* {% end... %} names; ends is NULL-terminated. Returns the body with the stream at the end name. */
static jnode *parse_statements(parser *p, const char *const *ends, int drop_needle) {
    if (jp_cur(p)->type == T_COLON) jp_next(p);
    if (jp_expect(p, T_BLOCK_END) != 0) return NULL;
    jnode *body = subparse(p, ends);
    if (!body) return NULL;
    if (jp_cur(p)->type == T_EOF) {
        char want[160] = "";
        for (int i = 0; ends[i]; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", i ? " or " : "", ends[i]);
        return jp_fail(p, jp_cur(p)->pos, "unexpected end of template: a block is not closed (looking for %s)", want);
    }
    if (drop_needle) jp_next(p);
    return body;
}

static jnode *parse_for(parser *p, int pos) {
    static const char *const body_end[] = {"endfor", "else", NULL}, *const else_end[] = {"endfor", NULL};
    jnode *n = jp_node(p, S_FOR, pos);
    if (!n || !(n->a = parse_assign_target(p, 0, "in")) || jp_expect_name(p, "in") != 0) return NULL;
    if (!(n->b = jp_tuple(p, 0, 0, "recursive", 0))) return NULL;
    if (jp_is_name(jp_cur(p), "if")) {
        jp_next(p);
        if (!(n->c = jp_expression(p, 1))) return NULL;
    }
    if (jp_is_name(jp_cur(p), "recursive")) return jp_fail(p, jp_cur(p)->pos, "recursive loops are not supported");
    p->loops++;
    jnode *body = parse_statements(p, body_end, 0);
    p->loops--;
    if (!body) return NULL;
    n->kids = body->kids;
    n->n = body->n;
    int is_else = jp_is_name(jp_cur(p), "else");
    jp_next(p);
    if (is_else) {
        int loops = p->loops;
        p->loops = 0;
        jnode *e = parse_statements(p, else_end, 1);
        p->loops = loops;
        if (!e) return NULL;
        n->more = e->kids;
        n->n_more = e->n;
    }
    return n;
}

/* S_IF: kids are test, body, test, body...; a is the else body. */
static jnode *parse_if(parser *p, int pos) {
    static const char *const ends[] = {"elif", "else", "endif", NULL}, *const else_end[] = {"endif", NULL};
    jnode *n = jp_node(p, S_IF, pos);
    nvec parts = {0};
    if (!n) return NULL;
    for (;;) {
        if (jp_push(p, &parts, jp_tuple(p, 0, 0, NULL, 0)) != 0 || jp_push(p, &parts, parse_statements(p, ends, 0)) != 0)
            return NULL;
        int kind = jp_is_name(jp_cur(p), "elif") ? 0 : jp_is_name(jp_cur(p), "else") ? 1 : 2;
        jp_next(p);
        if (kind == 1 && !(n->a = parse_statements(p, else_end, 1))) return NULL;
        if (kind != 0) break;
    }
    n->kids = parts.v;
    n->n = parts.n;
    return n;
}

static jnode *parse_set(parser *p, int pos) {
    static const char *const ends[] = {"endset", NULL};
    jnode *target = parse_assign_target(p, 1, NULL);
    if (!target) return NULL;
    if (jp_cur(p)->type == T_ASSIGN) {
        jp_next(p);
        jnode *n = jp_node(p, S_SET, pos);
        if (!n) return NULL;
        n->a = target;
        n->b = jp_tuple(p, 0, 1, NULL, 0);
        return n->b ? n : NULL;
    }
    jnode *n = jp_node(p, S_SETBLOCK, pos);
    if (!n) return NULL;
    n->a = target;
    n->b = jp_filter(p, NULL, 0);
    if (p->failed || !(n->c = parse_statements(p, ends, 1))) return NULL;
    return n;
}

/* (name, name=default, ...) into n->kids (E_NAME) and n->more (defaults, NULL where none). */
static int parse_signature(parser *p, jnode *n) {
    nvec names = {0}, defaults = {0};
    int any_default = 0;
    if (jp_expect(p, T_LPAREN) != 0) return -1;
    while (jp_cur(p)->type != T_RPAREN) {
        if (names.n && jp_expect(p, T_COMMA) != 0) return -1;
        if (jp_cur(p)->type != T_NAME) {
            jp_expect(p, T_NAME);
            return -1;
        }
        jnode *name = jp_node(p, E_NAME, jp_cur(p)->pos);
        if (!name) return -1;
        name->s = jp_cur(p)->text;
        jp_next(p);
        jnode *def = NULL;
        if (jp_cur(p)->type == T_ASSIGN) {
            jp_next(p);
            if (!(def = jp_expression(p, 1))) return -1;
            any_default = 1;
        } else if (any_default) {
            jp_fail(p, name->pos, "non-default argument follows default argument");
            return -1;
        }
        if (jp_push(p, &names, name) != 0 || jp_push_opt(p, &defaults, def, name->pos) != 0) return -1;
    }
    if (jp_expect(p, T_RPAREN) != 0) return -1;
    n->kids = names.v;
    n->n = names.n;
    n->more = defaults.v;
    n->n_more = defaults.n;
    return 0;
}

/* A body that is its own function in jinja2 (macro, call block): no loop around it. */
static jnode *parse_inner_body(parser *p, const char *const *ends) {
    int loops = p->loops;
    p->loops = 0;
    jnode *body = parse_statements(p, ends, 1);
    p->loops = loops;
    return body;
}

/* Whether the body reads name (not counting macros and call blocks inside it: those are functions
 * of their own), as jinja2 decides whether a macro takes varargs or kwargs. */
static int reads_name(const jnode *n, const char *name) {
    if (!n || n->kind == S_MACRO) return 0;
    if (n->kind == E_NAME) return js_eqc(n->s, name);
    if (n->kind == S_CALLBLOCK) return reads_name(n->b, name);
    if (reads_name(n->a, name) || reads_name(n->b, name) || reads_name(n->c, name)) return 1;
    for (int i = 0; i < n->n; i++)
        if (reads_name(n->kids[i], name)) return 1;
    for (int i = 0; i < n->n_more; i++)
        if (reads_name(n->more[i], name)) return 1;
    return 0;
}

/* MACRO_VARARGS / MACRO_KWARGS in n->op when the body of n->a reads them. */
static void note_varargs(jnode *n) {
    const jnode *body = n->a;
    for (int i = 0; i < body->n; i++) {
        if (reads_name(body->kids[i], "varargs")) n->op |= MACRO_VARARGS;
        if (reads_name(body->kids[i], "kwargs")) n->op |= MACRO_KWARGS;
    }
}

static jnode *parse_macro(parser *p, int pos) {
    static const char *const ends[] = {"endmacro", NULL};
    jnode *n = jp_node(p, S_MACRO, pos);
    if (!n) return NULL;
    if (jp_cur(p)->type != T_NAME) {
        jp_expect(p, T_NAME);
        return NULL;
    }
    n->s = jp_cur(p)->text;
    jp_next(p);
    if (parse_signature(p, n) != 0 || !(n->a = parse_inner_body(p, ends))) return NULL;
    note_varargs(n);
    return n;
}

static jnode *parse_call_block(parser *p, int pos) {
    static const char *const ends[] = {"endcall", NULL};
    jnode *n = jp_node(p, S_CALLBLOCK, pos);
    if (!n) return NULL;
    if (jp_cur(p)->type == T_LPAREN && parse_signature(p, n) != 0) return NULL;
    if (!(n->b = jp_expression(p, 1))) return NULL;
    if (n->b->kind != E_CALL) return jp_fail(p, n->b->pos, "expected call");
    if (!(n->a = parse_inner_body(p, ends))) return NULL;
    note_varargs(n);
    return n;
}

static jnode *parse_with(parser *p, int pos) {
    static const char *const ends[] = {"endwith", NULL};
    jnode *n = jp_node(p, S_WITH, pos);
    nvec targets = {0}, values = {0};
    if (!n) return NULL;
    while (jp_cur(p)->type != T_BLOCK_END) {
        if (targets.n && jp_expect(p, T_COMMA) != 0) return NULL;
        if (jp_push(p, &targets, parse_assign_target(p, 0, NULL)) != 0 || jp_expect(p, T_ASSIGN) != 0 ||
            jp_push(p, &values, jp_expression(p, 1)) != 0)
            return NULL;
    }
    n->kids = targets.v;
    n->n = targets.n;
    n->more = values.v;
    n->n_more = values.n;
    n->a = parse_statements(p, ends, 1);
    return n->a ? n : NULL;
}

static jnode *parse_print(parser *p, int pos) {
    jnode *n = jp_node(p, S_BODY, pos);
    nvec outs = {0};
    if (!n) return NULL;
    while (jp_cur(p)->type != T_BLOCK_END) {
        if (outs.n && jp_expect(p, T_COMMA) != 0) return NULL;
        jnode *o = jp_node(p, S_OUTPUT, jp_cur(p)->pos);
        if (!o || !(o->a = jp_expression(p, 1)) || jp_push(p, &outs, o) != 0) return NULL;
    }
    n->kids = outs.v;
    n->n = outs.n;
    return n;
}

static jnode *parse_statement(parser *p) {
    const jtoken *t = jp_cur(p);
    int pos = t->pos;
    if (t->type != T_NAME) return jp_fail(p, pos, "tag name expected");
    static const char *const refused[] = {"block", "extends", "include", "import", "from", "autoescape"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (js_eqc(t->text, refused[i]))
            return jp_fail(p, pos, "{%% %s %%} is not supported in chat templates", refused[i]);
    if (jp_enter(p) != 0) return NULL;
    jnode *n;
    jp_next(p);
    if (js_eqc(t->text, "for")) n = parse_for(p, pos);
    else if (js_eqc(t->text, "if")) n = parse_if(p, pos);
    else if (js_eqc(t->text, "set")) n = parse_set(p, pos);
    else if (js_eqc(t->text, "macro")) n = parse_macro(p, pos);
    else if (js_eqc(t->text, "call")) n = parse_call_block(p, pos);
    else if (js_eqc(t->text, "with")) n = parse_with(p, pos);
    else if (js_eqc(t->text, "print")) n = parse_print(p, pos);
    else if (js_eqc(t->text, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        n = jp_node(p, S_FILTERBLOCK, pos);
        if (n && (!(n->a = jp_filter(p, NULL, 1)) || !(n->b = parse_statements(p, ends, 1)))) n = NULL;
    } else if (js_eqc(t->text, "generation")) { /* transformers' marker of the assistant's text */
        static const char *const ends[] = {"endgeneration", NULL};
        if ((n = jp_node(p, S_GENERATION, pos)) && !(n->a = parse_inner_body(p, ends))) n = NULL;
    } else if (js_eqc(t->text, "break") || js_eqc(t->text, "continue")) {
        if (!p->loops) return jp_fail(p, pos, "'%.*s' outside of a loop", (int)t->text.n, t->text.p);
        n = jp_node(p, t->text.p[0] == 'b' ? S_BREAK : S_CONTINUE, pos);
    } else {
        return jp_fail(p, pos, "unknown tag '%.*s'", (int)(t->text.n > 60 ? 60 : t->text.n), t->text.p);
    }
    p->depth--;
    return n;
}

static jnode *subparse(parser *p, const char *const *ends) {
    jnode *body = jp_node(p, S_BODY, jp_cur(p)->pos);
    nvec stmts = {0};
    if (!body || jp_enter(p) != 0) return NULL;
    for (;;) {
        const jtoken *t = jp_cur(p);
        if (t->type == T_EOF) break;
        if (t->type == T_DATA) {
            jnode *d = jp_node(p, S_DATA, t->pos);
            if (!d) return NULL;
            d->s = t->text;
            jp_next(p);
            if (jp_push(p, &stmts, d) != 0) return NULL;
        } else if (t->type == T_VAR_BEGIN) {
            jp_next(p);
            jnode *o = jp_node(p, S_OUTPUT, jp_cur(p)->pos);
            if (!o || !(o->a = jp_tuple(p, 0, 1, NULL, 0)) || jp_expect(p, T_VAR_END) != 0 || jp_push(p, &stmts, o) != 0)
                return NULL;
        } else if (t->type == T_BLOCK_BEGIN) {
            jp_next(p);
            int at_end = 0;
            for (int i = 0; ends && ends[i]; i++) at_end |= jp_is_name(jp_cur(p), ends[i]);
            if (at_end) break;
            if (jp_push(p, &stmts, parse_statement(p)) != 0 || jp_expect(p, T_BLOCK_END) != 0) return NULL;
        } else {
            char got[80];
            jp_describe(t, got, sizeof got);
            return jp_fail(p, t->pos, "unexpected '%s'", got);
        }
    }
    p->depth--;
    body->kids = stmts.v;
    body->n = stmts.n;
    return body;
}

/* ---- the check jinja2's compiler makes: unknown filters and tests fail at compile time unless
 * they sit inside an if (or an inline if), where they fail only when they run ---- */

static int check(parser *p, const jnode *n, int soft);

static int check_all(parser *p, jnode *const *v, int count, int soft) {
    for (int i = 0; i < count; i++)
        if (v[i] && check(p, v[i], soft) != 0) return -1;
    return 0;
}

static int check(parser *p, const jnode *n, int soft) {
    if ((n->kind == E_FILTER || n->kind == E_TEST) && n->op == -1 && !soft) {
        jp_fail(p, n->pos, "unknown %s \"%.*s\"", n->kind == E_FILTER ? "filter" : "test", (int)n->s.n, n->s.p);
        return -1;
    }
    switch (n->kind) {
    case S_IF:
    case E_COND: soft = 1; break;
    case S_FOR:
        if (check(p, n->b, soft) != 0) return -1;
        return (n->c && check(p, n->c, 0) != 0) || check_all(p, n->kids, n->n, 0) != 0 ||
                       check_all(p, n->more, n->n_more, 0) != 0
                   ? -1
                   : 0;
    case S_MACRO:
    case S_SETBLOCK:
    case S_FILTERBLOCK:
    case S_GENERATION: soft = 0; break;
    case S_CALLBLOCK: return check(p, n->b, soft) != 0 || check_all(p, n->more, n->n_more, 0) != 0 || check(p, n->a, 0);
    case S_WITH: return check_all(p, n->more, n->n_more, soft) != 0 || check(p, n->a, 0);
    default: break;
    }
    if ((n->a && check(p, n->a, soft) != 0) || (n->b && check(p, n->b, soft) != 0) ||
        (n->c && check(p, n->c, soft) != 0))
        return -1;
    return check_all(p, n->kids, n->n, soft) != 0 || check_all(p, n->more, n->n_more, soft) != 0 ? -1 : 0;
}

int jinja_parse_tokens(jarena *a, const jtokens *tokens, jnode **root) {
    parser p = {.a = a, .t = tokens};
    jnode *body = subparse(&p, NULL);
    if (!body) return -1;
    if (check(&p, body, 0) != 0) return -1;
    *root = body;
    return 0;
}
