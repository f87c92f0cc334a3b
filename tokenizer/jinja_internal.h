/* The Jinja interpreter's parts (see jinja.h):
 *   jinja_lex.c          the source to tokens
 *   jinja_parse.c        tokens to a tree: expressions (jinja_parse_stmt.c: statements, checks)
 *   jinja_value.c        memory, strings with their marks, values and their Python semantics
 *   jinja_print.c        str(), repr() and JSON of values
 *   jinja_lookup.c       attribute, item and slice lookups as jinja2's sandbox makes them
 *   jinja_eval.c         runs the tree
 *   jinja_filters.c      filters; jinja_builtins.c tests and globals; jinja_methods.c methods
 *   jinja_text.c         Python's str operations on marked strings
 *   jinja.c              the entry points */
#ifndef QLM_JINJA_INTERNAL_H
#define QLM_JINJA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "jinja.h"

/* ---- memory: everything of a parse or a render lives in one arena, freed at once ---- */

typedef struct jchunk jchunk;
typedef struct {
    jchunk *head;
    size_t total, budget; /* bytes taken; 0 budget: unbounded */
} jarena;

/* NULL when out of memory or over the budget. */
void *ja_alloc(jarena *a, size_t n);
void ja_free(jarena *a);

/* ---- strings: bytes with one trust mark per byte ---- */

/* m == NULL: every byte is marked `uni` (0 trusted, 1 untrusted); else m[i] is byte i's mark. */
typedef struct {
    const char *p;
    const unsigned char *m;
    size_t n;
    unsigned char uni;
} jstr;

static inline int js_mark(jstr s, size_t i) { return s.m ? s.m[i] : s.uni; }
static inline jstr js_lit(const char *p, size_t n) { return (jstr){p, NULL, n, 0}; }
/* A trusted string of a C string literal. */
#define JS_C(literal) js_lit(literal, sizeof(literal) - 1)
static inline jstr js_sub(jstr s, size_t from, size_t to) {
    return (jstr){s.p + from, s.m ? s.m + from : NULL, to - from, s.uni};
}
int js_eq(jstr a, jstr b);
int js_eqc(jstr a, const char *c);

/* UTF-8 code point at s[i] (an invalid byte reads as one character); *len its bytes. */
uint32_t ju_decode(const char *s, size_t n, size_t i, int *len);
/* Python's str.isspace() for the code point. */
int ju_isspace(uint32_t c);

/* ---- lexer ---- */

enum {
    T_EOF,
    T_DATA,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_VAR_BEGIN,
    T_VAR_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    /* operators */
    T_ADD, T_SUB, T_DIV, T_FLOORDIV, T_MUL, T_MOD, T_POW, T_TILDE, T_LBRACKET, T_RBRACKET, T_LPAREN,
    T_RPAREN, T_LBRACE, T_RBRACE, T_EQ, T_NE, T_GT, T_GTEQ, T_LT, T_LTEQ, T_ASSIGN, T_DOT, T_COLON,
    T_PIPE, T_COMMA, T_SEMICOLON,
};
/* E_OPERAND operators beyond the comparison tokens */
enum { OP_IN = 1000, OP_NOTIN };
/* S_MACRO / S_CALLBLOCK op: the body reads varargs / kwargs (extra arguments land there) */
enum { MACRO_VARARGS = 1, MACRO_KWARGS = 2 };

typedef struct {
    int type;
    int pos;   /* byte offset in the normalised source */
    jstr text; /* DATA, NAME, STRING (escapes resolved) */
    long long i;
    double f;
} jtoken;

typedef struct {
    const char *src; /* newlines normalised, one trailing newline dropped (as jinja2 reads it) */
    size_t len;
    jtoken *tok;
    int n;
} jtokens;

/* Sets qlm_errorf ("chat template line L, column C: ...") on failure. */
int jinja_lex(jarena *a, const char *src, size_t len, jtokens *out);
/* Formats the error at byte pos of the normalised source into qlm_errorf; returns -1. */
int jinja_error_at(const char *src, size_t len, int pos, const char *msg);
const char *jinja_token_name(int type);

/* ---- tree ---- */

enum {
    /* expressions */
    E_STR, E_INT, E_FLOAT, E_BOOL, E_NONE, E_NAME, E_LIST, E_TUPLE, E_DICT, E_GETATTR, E_GETITEM, E_SLICE,
    E_CALL, E_KWARG, E_FILTER, E_TEST, E_NOT, E_NEG, E_POS, E_BINOP, E_CONCAT, E_AND, E_OR, E_COMPARE,
    E_OPERAND, E_COND, E_NSREF,
    /* statements */
    S_BODY, S_DATA, S_OUTPUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_BREAK, S_CONTINUE, S_MACRO, S_CALLBLOCK,
    S_FILTERBLOCK, S_WITH, S_GENERATION,
};

typedef struct jnode jnode;
struct jnode {
    int kind;
    int op;  /* E_BINOP / E_OPERAND: the operator token; E_FILTER / E_TEST: the builtin's id (-1 unknown) */
    int pos; /* where it starts in the source */
    jstr s;  /* literal, name, attribute, filter or test name */
    long long i;
    double f;
    jnode *a, *b, *c; /* operands; S_FOR: a target, b iterable, c filter test */
    jnode **kids;     /* items, arguments, body statements, if branches */
    int n;
    jnode **more; /* dict values, keyword arguments, else body, macro defaults */
    int n_more;
};

int jinja_parse_tokens(jarena *a, const jtokens *tokens, jnode **root);

/* ---- values ---- */

enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC, V_LOOP };
/* list kinds: what Python type the sequence is (it shows in printing, equality and which ops work) */
enum { L_LIST, L_TUPLE, L_RANGE, L_ITER, L_KEYS, L_VALUES, L_ITEMS };

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jns jns;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct {
    int t;
    union {
        long long i; /* BOOL, INT */
        double f;
        jstr s;          /* STR; UNDEF: the name that was missing (for messages) */
        jlist *l;
        jdict *d;
        jns *ns;
        jfunc *fn;
        jloop *loop;
    } u;
} jval;

struct jlist {
    int kind;
    int n;
    int pos; /* L_ITER: items already consumed */
    jval *v;
    long long start, stop, step; /* L_RANGE */
};
struct jdict {
    int n;
    jval *k, *v;
};
/* Names and their values, in order: a namespace() object (the one mutable value), or a scope's
 * variables. */
struct jns {
    int n, cap;
    jstr *k;
    jval *v;
};

typedef struct jscope jscope;
/* What a call of a function value does. */
enum { F_GLOBAL, F_METHOD, F_MACRO, F_CALLER, F_LOOP_CYCLE, F_LOOP_CHANGED };
struct jfunc {
    int kind, id; /* F_GLOBAL: builtin id; F_METHOD: method id (-1 unsupported) */
    jstr name;
    jval self;             /* F_METHOD: the receiver */
    const jnode *node;     /* F_MACRO: S_MACRO; F_CALLER: S_CALLBLOCK */
    jscope *closure;
    jloop *loop;
};
struct jloop {
    long index0, length;
    const jval *items;
    jval last_changed; /* what loop.changed() saw last (undefined before its first call) */
};

static inline jval jv_undef(jstr name) { jval v = {V_UNDEF, {0}}; v.u.s = name; return v; }
static inline jval jv_none(void) { jval v = {V_NONE, {0}}; return v; }
static inline jval jv_bool(int b) { jval v = {V_BOOL, {0}}; v.u.i = b != 0; return v; }
static inline jval jv_int(long long i) { jval v = {V_INT, {0}}; v.u.i = i; return v; }
static inline jval jv_float(double f) { jval v = {V_FLOAT, {0}}; v.u.f = f; return v; }
static inline jval jv_str(jstr s) { jval v = {V_STR, {0}}; v.u.s = s; return v; }
static inline int jv_is_num(jval v) { return v.t == V_BOOL || v.t == V_INT || v.t == V_FLOAT; }

/* ---- render state ---- */

struct jscope {
    jscope *parent;
    jns vars;
};

/* A growing string: the output, or what a block captures. */
typedef struct {
    char *p;
    unsigned char *m;
    size_t n, cap;
} jbuf;

typedef struct {
    jarena mem;
    qlm_jinja_limits lim;
    const char *src; /* for error positions */
    size_t src_len;
    int pos;         /* the node being evaluated, for errors */
    char err[512];   /* the error, once set */
    int failed;
    long iterations, steps;
    int depth;
    jscope *globals; /* the render's variables */
    void *locale;    /* for case mapping beyond ASCII, made on first use */
} jrender;

/* Work in steps, one step being about one node evaluated: bytes compared (memcmp, memmem),
 * bytes decoded as characters, characters rewritten one by one. */
static inline long cost_compare(size_t n) { return (long)(n / 64); }
static inline long cost_scan(size_t n) { return (long)(n / 16); }
static inline long cost_rewrite(size_t n) { return (long)(n / 2); }

/* Records an error at r->pos (the first one wins); returns -1. */
int jr_fail(jrender *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void *jr_alloc(jrender *r, size_t n);
/* A function value of that kind and name in *out: its jfunc zeroed otherwise, for the caller to
 * fill; NULL when out of memory. */
jfunc *jr_func(jrender *r, int kind, jstr name, jval *out);
/* A step of work; fails past the limit. */
int jr_charge(jrender *r, long units);

/* Buffers and string building (marks kept byte for byte). */
int jb_put(jrender *r, jbuf *b, jstr s);
/* A copy of s in the render's memory. */
int js_from_cstr(jrender *r, const char *s, jstr *out);
int jb_putc(jrender *r, jbuf *b, const char *s, size_t n, int mark);
jstr jb_str(const jbuf *b);
int js_concat(jrender *r, jstr a, jstr b, jstr *out);

/* Python's str() of a value (repr() of containers; marks carried from its strings); -1 for what
 * qlm cannot print (functions, generators). */
int jv_to_str(jrender *r, jval v, jstr *out);
/* transformers' tojson: json.dumps(v, ensure_ascii, indent (NULL: none), separators, sort_keys). */
int jv_to_json(jrender *r, jbuf *b, jval v, int ensure_ascii, jstr *indent, jstr item_sep, jstr key_sep,
               int sort_keys, int depth);
int jv_truthy(jval v);
/* Python ==. */
int jv_equal(jrender *r, jval a, jval b);
/* Python's ordering of a and b: *cmp -1 (a < b), 0, 1, or 2 (unordered: nan); -1 for types that
 * do not order. */
int jv_order(jrender *r, jval a, jval b, int *cmp);
/* item in container (an iterator is consumed up to the item, as in Python). */
int jv_contains(jrender *r, jval container, jval item, int *in);
const char *jv_type_name(jval v);

jval jv_list(jrender *r, int kind, int n); /* .u.l NULL when out of memory */
jval jv_dict(jrender *r, int n);
/* Items of anything iterable (a string's characters, a dict's keys); an iterator is consumed.
 * -1 for what is not iterable. */
int jv_items(jrender *r, jval v, const jval **items, int *n);
/* Python len(); -1 when v has none. */
int jv_len(jrender *r, jval v, long *n);
/* Characters (code points) of a string. */
long js_chars(jstr s);
/* Byte offset of character k (k in 0..chars). */
size_t js_char_offset(jstr s, long k);

/* Lookups as jinja2's sandbox does them: attribute first for obj.name, item first for obj[k];
 * a miss is undefined (or an error where jinja2 raises). */
int jv_getattr(jrender *r, jval obj, jstr name, jval *out);
int jv_getitem(jrender *r, jval obj, jval key, jval *out);
/* obj[start:stop:step] (bounds: three values, none where omitted). */
int jv_slice(jrender *r, jval obj, const jval *bounds, jval *out);
/* dict lookup by Python equality; 0 found, 1 missing */
int jv_dict_get(jrender *r, const jdict *d, jval key, jval *out);
/* d[key] = v: a present key keeps its place, a new one goes last (d has room for it); 0 or -1. */
int jv_dict_put(jrender *r, jdict *d, jval key, jval v);

/* ---- builtins ---- */

int jinja_filter_id(jstr name);  /* -1 unknown to jinja2; -2 jinja2's but not supported here */
int jinja_test_id(jstr name);    /* the same for tests */
int jinja_global_id(jstr name);  /* -1 none */

typedef struct {
    jval *args;
    int n;
    jstr *names; /* keyword argument names */
    jval *kwargs;
    int n_kw;
} jargs;

/* Binds a call's arguments to the parameters (at most 8): positional first, then by name;
 * given[i] says whether parameter i was passed. */
int jinja_bind(jrender *r, const char *what, jstr name, const jargs *a, const char *const *params, int n_params,
               jval *vals, int *given);
/* Python's int() of a bool or int argument; -1 with a message naming the parameter otherwise. */
int jinja_int_arg(jrender *r, jval v, const char *param, long long *out);

int jinja_apply_filter(jrender *r, int id, jstr name, jval v, const jargs *a, jval *out);
int jinja_apply_test(jrender *r, int id, jstr name, jval v, const jargs *a, int *out);
int jinja_call_global(jrender *r, int id, const jargs *a, jval *out);
/* The method of a str, dict or list named name: its id, -1 a Python method qlm does not run,
 * -2 not a method at all, -3 a method the sandbox refuses (it would modify the object). */
int jinja_method_id(jval self, jstr name);
int jinja_call_method(jrender *r, const jfunc *f, const jargs *a, jval *out);
/* a op b with Python's semantics (op: T_ADD, T_SUB, T_MUL, T_DIV, T_FLOORDIV, T_MOD, T_POW). */
int jinja_binop(jrender *r, int op, jval a, jval b, jval *out);
/* Sets name in the table (added at its end when new). */
int jns_set(jrender *r, jns *t, jstr name, jval v);
/* Sets a namespace attribute (refusing the names transformers refuses). */
int jinja_namespace_set(jrender *r, jns *ns, jstr name, jval v);
/* Runs a parsed template into out. */
int jinja_exec(jrender *r, const jnode *root, jbuf *out);

/* ---- Python's str operations (jinja_text.c) ---- */

/* strip / lstrip / rstrip: whitespace, or the characters of *chars. */
int js_strip(jrender *r, jstr s, const jstr *chars, int left, int right, jstr *out);
/* split / rsplit into a list (on whitespace runs when sep is NULL); maxsplit < 0: no limit. */
int js_split(jrender *r, jstr s, const jstr *sep, long maxsplit, int from_right, jval *out);
int js_splitlines(jrender *r, jstr s, int keepends, jval *out);
/* replace(old, rep, count); count < 0: every occurrence. */
int js_replace(jrender *r, jstr s, jstr old, jstr rep, long count, jstr *out);
/* Case mapping as Python's str methods (and jinja2's title filter) do it; each character's
 * mapping keeps its mark. */
enum { CASE_LOWER, CASE_UPPER, CASE_TITLE_WORDS, CASE_CAPITALIZE, CASE_PY_TITLE, CASE_SWAP };
int js_case(jrender *r, jstr s, int mode, jstr *out);
/* Character classes (non-ASCII through the C.UTF-8 locale, made ready by js_prepare_locale). */
int js_prepare_locale(jrender *r, jstr s);
int js_is_cased(jrender *r, uint32_t c);
int js_is_upper(jrender *r, uint32_t c);
int js_is_lower(jrender *r, uint32_t c);
int js_is_alpha(jrender *r, uint32_t c);

#endif
