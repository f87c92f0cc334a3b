/* The parser's own parts, shared by jinja_parse.c (expressions) and jinja_parse_stmt.c
 * (statements and the compile-time check). */
#ifndef QLM_JINJA_PARSER_H
#define QLM_JINJA_PARSER_H

#include "jinja_internal.h"

/* Nesting (brackets, chained operators, statements in statements) the tree may have, so that
 * walking it cannot exhaust the stack. */
enum { MAX_NESTING = 200 };

typedef struct {
    jarena *a;
    const jtokens *t;
    int i;
    int depth;
    int loops; /* for bodies around the current statement (break and continue need one) */
    int failed;
} parser;

typedef struct {
    jnode **v;
    int n, cap;
} nvec;

static inline const jtoken *jp_cur(const parser *p) { return &p->t->tok[p->i]; }
static inline const jtoken *jp_look(const parser *p) { return p->i + 1 < p->t->n ? &p->t->tok[p->i + 1] : jp_cur(p); }
static inline void jp_next(parser *p) {
    if (jp_cur(p)->type != T_EOF) p->i++;
}
static inline int jp_is_name(const jtoken *t, const char *w) { return t->type == T_NAME && js_eqc(t->text, w); }

/* Records the error at byte pos (the first one wins); returns NULL. */
void *jp_fail(parser *p, int pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* How jinja2 names a token in "expected ..., got ...". */
void jp_describe(const jtoken *t, char *buf, size_t cap);
int jp_expect(parser *p, int type);
int jp_expect_name(parser *p, const char *w);
jnode *jp_node(parser *p, int kind, int pos);
/* Appends x (jp_push_opt: x may be NULL, a missing default; jp_push: NULL is a failed parse). */
int jp_push_opt(parser *p, nvec *v, jnode *x, int pos);
int jp_push(parser *p, nvec *v, jnode *x);
/* One more level of nesting; fails past MAX_NESTING. */
int jp_enter(parser *p);

/* jinja2's parse_expression, parse_tuple and parse_filter. */
jnode *jp_expression(parser *p, int with_condexpr);
jnode *jp_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end, int explicit_parens);
jnode *jp_filter(parser *p, jnode *node, int start_inline);

#endif
