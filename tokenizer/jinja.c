/* The interpreter's entry points (see jinja.h): parse a template once, render it with variables. */
#include "jinja.h"

#include <locale.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "jinja_internal.h"

struct qlm_jinja {
    jarena mem; /* tokens and tree */
    jtokens tokens;
    jnode *root;
};

int qlm_jinja_parse(const char *src, size_t len, qlm_jinja **out) {
    *out = NULL;
    if (!src) return qlm_errorf("chat template: none given");
    qlm_jinja *t = calloc(1, sizeof *t);
    if (!t) return qlm_errorf("chat template: out of memory");
    if (jinja_lex(&t->mem, src, len, &t->tokens) != 0 || jinja_parse_tokens(&t->mem, &t->tokens, &t->root) != 0) {
        qlm_jinja_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void qlm_jinja_free(qlm_jinja *t) {
    if (!t) return;
    ja_free(&t->mem);
    free(t);
}

qlm_jinja_limits qlm_jinja_default_limits(void) {
    return (qlm_jinja_limits){.max_output = (size_t)32 << 20,
                              .max_memory = (size_t)512 << 20,
                              .max_iterations = 1000000,
                              .max_steps = 50000000,
                              .max_depth = 500,
                              .now = NULL};
}

/* An input as a value of the render (strings are not copied; untrusted ones are marked). */
static int convert(jrender *r, const qlm_jinja_input *in, int depth, jval *out) {
    if (depth > 100) return jr_fail(r, "the variables nest more than 100 deep");
    switch (in->type) {
    case QLM_JINJA_NONE: *out = jv_none(); return 0;
    case QLM_JINJA_BOOL: *out = jv_bool(in->i != 0); return 0;
    case QLM_JINJA_INT: *out = jv_int(in->i); return 0;
    case QLM_JINJA_FLOAT: *out = jv_float(in->f); return 0;
    case QLM_JINJA_STRING:
        *out = jv_str((jstr){in->s ? in->s : "", NULL, in->s ? in->len : 0, (unsigned char)(in->untrusted != 0)});
        return 0;
    case QLM_JINJA_LIST: {
        jval l = jv_list(r, L_LIST, in->n);
        if (!l.u.l) return -1;
        for (int i = 0; i < in->n; i++)
            if (convert(r, &in->items[i], depth + 1, &l.u.l->v[i]) != 0) return -1;
        *out = l;
        return 0;
    }
    case QLM_JINJA_DICT: {
        jval d = jv_dict(r, in->n);
        if (!d.u.d) return -1;
        for (int i = 0; i < in->n; i++) {
            const char *key = in->items[i].key ? in->items[i].key : "";
            d.u.d->k[i] = jv_str(js_lit(key, strlen(key)));
            if (convert(r, &in->items[i], depth + 1, &d.u.d->v[i]) != 0) return -1;
        }
        d.u.d->n = in->n;
        *out = d;
        return 0;
    }
    }
    return jr_fail(r, "a variable of unknown type %d", (int)in->type);
}

static int set_globals(jrender *r, const qlm_jinja_input *vars, int n) {
    jscope *g = jr_alloc(r, sizeof *g);
    if (!g) return -1;
    memset(g, 0, sizeof *g);
    for (int i = 0; i < n; i++) {
        const char *key = vars[i].key ? vars[i].key : "";
        jval v;
        if (convert(r, &vars[i], 0, &v) != 0 || jns_set(r, &g->vars, js_lit(key, strlen(key)), v) != 0) return -1;
    }
    r->globals = g;
    return 0;
}

/* The output with its marks as runs of trusted and untrusted text. */
static void to_marked(const jbuf *b, qlm_marked_text *out) {
    qlm_marked_put(out, "", 0, 0);
    for (size_t i = 0; i < b->n;) {
        size_t j = i;
        while (j < b->n && b->m[j] == b->m[i]) j++;
        qlm_marked_put(out, b->p + i, j - i, b->m[i]);
        i = j;
    }
}

int qlm_jinja_render(const qlm_jinja *t, const qlm_jinja_input *vars, int n, const qlm_jinja_limits *lim,
                     qlm_marked_text *out) {
    memset(out, 0, sizeof *out);
    if (!t || n < 0 || (n && !vars)) return qlm_errorf("chat template: invalid arguments");
    jrender r;
    memset(&r, 0, sizeof r);
    r.lim = lim ? *lim : qlm_jinja_default_limits();
    r.mem.budget = r.lim.max_memory;
    r.src = t->tokens.src;
    r.src_len = t->tokens.len;
    jbuf b = {0};
    int rc = set_globals(&r, vars, n) == 0 && jinja_exec(&r, t->root, &b) == 0 ? 0 : -1;
    if (rc == 0) {
        to_marked(&b, out);
        if (out->failed) {
            qlm_marked_free(out);
            rc = qlm_errorf("chat template: out of memory");
        }
    } else {
        jinja_error_at(r.src, r.src_len, r.pos, r.err[0] ? r.err : "render failed");
    }
    if (r.locale) freelocale((locale_t)r.locale);
    ja_free(&r.mem);
    return rc;
}
