/* The template source as jinja2's lexer reads it with trim_blocks and lstrip_blocks: newlines
 * normalised and one trailing newline dropped, text between tags, whitespace control (- and +),
 * {% raw %} blocks, comments, and the tokens inside {{ }} and {% %}. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "jinja_internal.h"

enum { MAX_BRACKETS = 256 };

typedef struct {
    jarena *a;
    const char *s;
    size_t n;
    jtoken *tok;
    int nt, cap;
} lexer;

int jinja_error_at(const char *src, size_t len, int pos, const char *msg) {
    int line = 1, col = 1;
    for (size_t i = 0; i < (size_t)pos && i < len;) {
        int clen;
        uint32_t c = ju_decode(src, len, i, &clen);
        if (c == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
        i += (size_t)clen;
    }
    return qlm_errorf("chat template line %d, column %d: %s", line, col, msg);
}

static int lex_fail(lexer *L, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int lex_fail(lexer *L, size_t pos, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return jinja_error_at(L->s, L->n, (int)pos, msg);
}

static jtoken *push(lexer *L, int type, size_t pos) {
    if (L->nt == L->cap) {
        int cap = L->cap ? L->cap * 2 : 256;
        jtoken *t = ja_alloc(L->a, sizeof *t * (size_t)cap);
        if (!t) {
            lex_fail(L, pos, "out of memory");
            return NULL;
        }
        if (L->nt) memcpy(t, L->tok, sizeof *t * (size_t)L->nt);
        L->tok = t;
        L->cap = cap;
    }
    jtoken *t = &L->tok[L->nt++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->pos = (int)pos;
    return t;
}

/* Whitespace as Python's \s and str.isspace() see it: its length at i, 0 if none. */
static int space_at(const lexer *L, size_t i) {
    if (i >= L->n) return 0;
    int len;
    uint32_t c = ju_decode(L->s, L->n, i, &len);
    return ju_isspace(c) ? len : 0;
}

static size_t skip_space(const lexer *L, size_t i) {
    int k;
    while ((k = space_at(L, i)) > 0) i += (size_t)k;
    return i;
}

/* Where s[from..to) ends once trailing whitespace is stripped (str.rstrip()). */
static size_t rstrip_end(const lexer *L, size_t from, size_t to) {
    while (to > from) {
        size_t start = to - 1;
        while (start > from && ((unsigned char)L->s[start] & 0xC0) == 0x80) start--;
        if ((size_t)space_at(L, start) != to - start) break;
        to = start;
    }
    return to;
}

static int all_space(const lexer *L, size_t from, size_t to) {
    return skip_space(L, from) >= to;
}

static int data(lexer *L, size_t from, size_t to) {
    if (to <= from) return 0;
    jtoken *t = push(L, T_DATA, from);
    if (!t) return -1;
    t->text = js_lit(L->s + from, to - from);
    return 0;
}

/* Where the text before a tag ends: "-" strips all whitespace before it; lstrip_blocks strips
 * the spaces that start its line when nothing else is on that line (not for {{ }} or "+"). */
static size_t text_end(const lexer *L, size_t from, size_t tag, char sign, int is_var, int line_starting) {
    if (sign == '-') return rstrip_end(L, from, tag);
    if (sign == '+' || is_var) return tag;
    size_t l = tag;
    while (l > from && L->s[l - 1] != '\n') l--;
    if ((l > from || line_starting) && l < tag && all_space(L, l, tag)) return l;
    return tag;
}

/* The end of a block tag at i ("+%}", "-%}" with the whitespace after it, "%}" with one newline
 * after it): the position after it, or 0 if there is none at i. */
static size_t block_end_at(const lexer *L, size_t i) {
    const char *s = L->s;
    size_t n = L->n;
    if (i + 2 < n && s[i] == '+' && s[i + 1] == '%' && s[i + 2] == '}') return i + 3;
    if (i + 2 < n && s[i] == '-' && s[i + 1] == '%' && s[i + 2] == '}') return skip_space(L, i + 3);
    if (i + 1 < n && s[i] == '%' && s[i + 1] == '}') return i + 2 + (i + 2 < n && s[i + 2] == '\n');
    return 0;
}

/* "{%" [-+] ws WORD ws (block end) at i, for raw / endraw: the position after it, or 0. */
static size_t word_tag_at(const lexer *L, size_t i, const char *word, int trim_after) {
    size_t n = L->n, w = strlen(word);
    if (i + 1 >= n || L->s[i] != '{' || L->s[i + 1] != '%') return 0;
    i += 2;
    if (i < n && (L->s[i] == '-' || L->s[i] == '+')) i++;
    i = skip_space(L, i);
    if (i + w > n || memcmp(L->s + i, word, w) != 0) return 0;
    i = skip_space(L, i + w);
    if (trim_after) return block_end_at(L, i);
    if (i + 2 < n && L->s[i] == '-' && L->s[i + 1] == '%' && L->s[i + 2] == '}') return skip_space(L, i + 3);
    if (i + 1 < n && L->s[i] == '%' && L->s[i + 1] == '}') return i + 2;
    return 0;
}

/* {% raw %} ... {% endraw %}: the text inside as data. */
static int lex_raw(lexer *L, size_t start, size_t *pos, int *line_starting) {
    for (size_t i = *pos; i + 1 < L->n; i++) {
        size_t end = word_tag_at(L, i, "endraw", 1);
        if (!end) continue;
        char sign = L->s[i + 2] == '-' || L->s[i + 2] == '+' ? L->s[i + 2] : 0;
        if (data(L, *pos, text_end(L, *pos, i, sign, 0, *line_starting)) != 0) return -1;
        *pos = end;
        *line_starting = L->s[end - 1] == '\n';
        return 0;
    }
    return lex_fail(L, start, "Missing end of raw directive");
}

static int lex_comment(lexer *L, size_t start, size_t after, size_t *pos, int *line_starting) {
    for (size_t q = after; q + 1 < L->n; q++) {
        if (L->s[q] != '#' || L->s[q + 1] != '}') continue;
        char sign = q > after ? L->s[q - 1] : 0;
        *pos = sign == '-' ? skip_space(L, q + 2) : q + 2 + (sign != '+' && q + 2 < L->n && L->s[q + 2] == '\n');
        *line_starting = L->s[*pos - 1] == '\n';
        return 0;
    }
    return lex_fail(L, start, "Missing end of comment tag");
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* (\d+_)*\d+ at i: its end, or 0. */
static size_t digits_at(const lexer *L, size_t i) {
    if (i >= L->n || !is_digit(L->s[i])) return 0;
    while (i < L->n && is_digit(L->s[i])) {
        i++;
        if (i + 1 < L->n && L->s[i] == '_' && is_digit(L->s[i + 1])) i++;
    }
    return i;
}

static size_t exponent_at(const lexer *L, size_t i) {
    if (i >= L->n || (L->s[i] != 'e' && L->s[i] != 'E')) return 0;
    i++;
    if (i < L->n && (L->s[i] == '+' || L->s[i] == '-')) i++;
    return digits_at(L, i);
}

/* jinja2's float: digits with a fraction, an exponent or both (never right after a dot). */
static size_t float_at(const lexer *L, size_t i) {
    if (i > 0 && L->s[i - 1] == '.') return 0;
    size_t q = digits_at(L, i);
    if (!q) return 0;
    if (q < L->n && L->s[q] == '.') {
        size_t f = digits_at(L, q + 1);
        if (!f) return 0;
        size_t e = exponent_at(L, f);
        return e ? e : f;
    }
    return exponent_at(L, q);
}

static int int_digit(char c, int base) {
    int v = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : 99;
    return v < base ? v : -1;
}

/* jinja2's integer (0b, 0o, 0x, decimal, zeros; single underscores between digits): its end. */
static size_t int_at(const lexer *L, size_t i, int *base) {
    const char *s = L->s;
    size_t n = L->n;
    if (i + 1 < n && s[i] == '0') {
        char p = (char)(s[i + 1] | 0x20);
        *base = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 0;
        if (*base) {
            size_t j = i + 2;
            for (;;) {
                size_t k = j + (j < n && s[j] == '_');
                if (k >= n || int_digit(s[k], *base) < 0) break;
                j = k + 1;
            }
            if (j > i + 2) return j;
        }
    }
    *base = 10;
    if (i >= n || !is_digit(s[i])) return 0;
    char first = s[i];
    size_t j = i + 1;
    for (;;) {
        size_t k = j + (j < n && s[j] == '_');
        if (k >= n || !is_digit(s[k]) || (first == '0' && s[k] != '0')) break;
        j = k + 1;
    }
    return j;
}

static int lex_number(lexer *L, size_t i, size_t *end) {
    size_t f = float_at(L, i);
    char buf[128];
    if (f) {
        size_t k = 0;
        for (size_t j = i; j < f && k + 1 < sizeof buf; j++)
            if (L->s[j] != '_') buf[k++] = L->s[j];
        buf[k] = 0;
        jtoken *t = push(L, T_FLOAT, i);
        if (!t) return -1;
        t->f = strtod(buf, NULL);
        *end = f;
        return 0;
    }
    int base;
    size_t e = int_at(L, i, &base);
    unsigned long long v = 0;
    for (size_t j = i + (base == 10 ? 0 : 2); j < e; j++) {
        int d = int_digit(L->s[j], base);
        if (d < 0) continue;
        if (v > (9223372036854775807ULL - (unsigned)d) / (unsigned)base)
            return lex_fail(L, i, "integer literal too large (qlm's templates use 64-bit integers)");
        v = v * (unsigned)base + (unsigned)d;
    }
    jtoken *t = push(L, T_INT, i);
    if (!t) return -1;
    t->i = (long long)v;
    *end = e;
    return 0;
}

static int put_utf8(char *out, uint32_t c) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | c >> 6);
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | c >> 12);
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | c >> 18);
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* \x, \u, \U: exactly `digits` hex digits at s; the value, or -1. */
static long hex_escape(const char *s, size_t avail, int digits) {
    if ((size_t)digits > avail) return -1;
    long v = 0;
    for (int k = 0; k < digits; k++) {
        int d = int_digit(s[k], 16);
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A string literal's text with its escapes resolved as Python's unicode-escape codec does. */
static int lex_string(lexer *L, size_t i, size_t *end) {
    char q = L->s[i];
    size_t j = i + 1;
    while (j < L->n && L->s[j] != q) j += L->s[j] == '\\' ? 2 : 1;
    if (j >= L->n) return lex_fail(L, i, "unexpected char '%c'", q);
    char *out = ja_alloc(L->a, (j - i) * 3 + 16);
    if (!out) return lex_fail(L, i, "out of memory");
    size_t k = 0;
    for (size_t p = i + 1; p < j;) {
        char c = L->s[p];
        if (c != '\\') {
            out[k++] = c;
            p++;
            continue;
        }
        char e = L->s[p + 1];
        p += 2;
        static const char simple_in[] = "\\'\"abfnrtv", simple_out[] = "\\'\"\a\b\f\n\r\t\v";
        const char *hit = e ? strchr(simple_in, e) : NULL;
        if (hit) {
            out[k++] = simple_out[hit - simple_in];
        } else if (e == '\n') {
            continue;
        } else if (e >= '0' && e <= '7') {
            uint32_t v = (uint32_t)(e - '0');
            for (int d = 0; d < 2 && p < j && L->s[p] >= '0' && L->s[p] <= '7'; d++)
                v = v * 8 + (uint32_t)(L->s[p++] - '0');
            k += (size_t)put_utf8(out + k, v);
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            long v = hex_escape(L->s + p, j - p, digits);
            if (v < 0) return lex_fail(L, p - 2, "truncated \\%cXX escape in a string", e);
            if (v > 0x10FFFF) return lex_fail(L, p - 2, "illegal Unicode character in a string");
            if (v >= 0xD800 && v <= 0xDFFF) return lex_fail(L, p - 2, "a lone surrogate in a string");
            k += (size_t)put_utf8(out + k, (uint32_t)v);
            p += (size_t)digits;
        } else if (e == 'N') {
            return lex_fail(L, p - 2, "\\N{...} escapes are not supported");
        } else if ((unsigned char)e >= 0x80) {
            /* the codec sees the backslash-escaped form of the character, after a real backslash */
            int len;
            uint32_t c2 = ju_decode(L->s, L->n, p - 1, &len);
            k += (size_t)snprintf(out + k, 12, c2 <= 0xFF ? "\\x%02x" : c2 <= 0xFFFF ? "\\u%04x" : "\\U%08x", c2);
            p += (size_t)len - 1;
        } else {
            out[k++] = '\\';
            p--;
        }
    }
    jtoken *t = push(L, T_STRING, i);
    if (!t) return -1;
    t->text = js_lit(out, k);
    *end = j + 1;
    return 0;
}

static int op_token(const char *s, size_t avail, int *len) {
    static const struct {
        const char *op;
        int type;
    } ops[] = {{"//", T_FLOORDIV}, {"**", T_POW}, {"==", T_EQ},       {"!=", T_NE},       {">=", T_GTEQ},
               {"<=", T_LTEQ},     {"+", T_ADD},  {"-", T_SUB},        {"/", T_DIV},       {"*", T_MUL},
               {"%", T_MOD},       {"~", T_TILDE}, {"[", T_LBRACKET},  {"]", T_RBRACKET},  {"(", T_LPAREN},
               {")", T_RPAREN},    {"{", T_LBRACE}, {"}", T_RBRACE},   {">", T_GT},        {"<", T_LT},
               {"=", T_ASSIGN},    {".", T_DOT},  {":", T_COLON},      {"|", T_PIPE},      {",", T_COMMA},
               {";", T_SEMICOLON}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        size_t n = strlen(ops[k].op);
        if (n <= avail && memcmp(s, ops[k].op, n) == 0) {
            *len = (int)n;
            return ops[k].type;
        }
    }
    return -1;
}

/* The tokens of one {{ }} or {% %} up to its end; *pos after it (the source's end if it has none:
 * the parser reports that). */
static int lex_tag(lexer *L, int is_var, size_t start, size_t *pos, int *line_starting) {
    char open[MAX_BRACKETS];
    int depth = 0;
    size_t i = start;
    for (;;) {
        if (depth == 0) {
            size_t end = 0;
            if (is_var && i + 2 < L->n && L->s[i] == '-' && L->s[i + 1] == '}' && L->s[i + 2] == '}')
                end = skip_space(L, i + 3);
            else if (is_var && i + 1 < L->n && L->s[i] == '}' && L->s[i + 1] == '}')
                end = i + 2;
            else if (!is_var)
                end = block_end_at(L, i);
            if (end) {
                if (!push(L, is_var ? T_VAR_END : T_BLOCK_END, i)) return -1;
                *pos = end;
                *line_starting = L->s[end - 1] == '\n';
                return 0;
            }
        }
        if (i >= L->n) {
            *pos = i;
            return 0;
        }
        int sp = space_at(L, i);
        if (sp) {
            i += (size_t)sp;
            continue;
        }
        char c = L->s[i];
        size_t end = i;
        if (is_digit(c)) {
            if (lex_number(L, i, &end) != 0) return -1;
            i = end;
        } else if (is_name_start(c)) {
            end = i;
            while (end < L->n && is_name_char(L->s[end])) end++;
            jtoken *t = push(L, T_NAME, i);
            if (!t) return -1;
            t->text = js_lit(L->s + i, end - i);
            i = end;
        } else if (c == '\'' || c == '"') {
            if (lex_string(L, i, &end) != 0) return -1;
            i = end;
        } else {
            int len, type = op_token(L->s + i, L->n - i, &len);
            if (type < 0) {
                int clen;
                ju_decode(L->s, L->n, i, &clen);
                return lex_fail(L, i, "unexpected char '%.*s'", clen, L->s + i);
            }
            if (type == T_LBRACE || type == T_LPAREN || type == T_LBRACKET) {
                if (depth == MAX_BRACKETS) return lex_fail(L, i, "brackets nested more than %d deep", MAX_BRACKETS);
                open[depth++] = type == T_LBRACE ? '}' : type == T_LPAREN ? ')' : ']';
            } else if (type == T_RBRACE || type == T_RPAREN || type == T_RBRACKET) {
                if (depth == 0) return lex_fail(L, i, "unexpected '%c'", c);
                if (open[depth - 1] != c) return lex_fail(L, i, "unexpected '%c', expected '%c'", c, open[depth - 1]);
                depth--;
            }
            if (!push(L, type, i)) return -1;
            i += (size_t)len;
        }
    }
}

/* Newlines normalised to \n and one trailing newline dropped, as jinja2 reads a template. */
static char *normalise(jarena *a, const char *src, size_t len, size_t *out_len) {
    char *s = ja_alloc(a, len + 1);
    if (!s) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k > 0 && s[k - 1] == '\n') k--;
    s[k] = 0;
    *out_len = k;
    return s;
}

static int lex_all(lexer *L) {
    size_t pos = 0;
    int line_starting = 1;
    while (pos < L->n) {
        size_t tag = pos;
        while (tag + 1 < L->n && !(L->s[tag] == '{' && strchr("{%#", L->s[tag + 1]))) tag++;
        if (tag + 1 >= L->n) return data(L, pos, L->n);
        char kind = L->s[tag + 1];
        size_t after = tag + 2;
        char sign = after < L->n && (L->s[after] == '-' || L->s[after] == '+') ? L->s[after] : 0;
        if (sign) after++;
        size_t raw_end = kind == '%' ? word_tag_at(L, tag, "raw", 0) : 0;
        if (data(L, pos, text_end(L, pos, tag, sign, kind == '{', line_starting)) != 0) return -1;
        line_starting = 0;
        if (raw_end) {
            pos = raw_end;
            line_starting = L->s[raw_end - 1] == '\n';
            if (lex_raw(L, tag, &pos, &line_starting) != 0) return -1;
        } else if (kind == '#') {
            if (lex_comment(L, tag, after, &pos, &line_starting) != 0) return -1;
        } else {
            if (!push(L, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, tag)) return -1;
            if (lex_tag(L, kind == '{', after, &pos, &line_starting) != 0) return -1;
        }
    }
    return 0;
}

int jinja_lex(jarena *a, const char *src, size_t len, jtokens *out) {
    lexer L = {.a = a};
    memset(out, 0, sizeof *out);
    L.s = normalise(a, src, len, &L.n);
    if (!L.s) return qlm_errorf("chat template: out of memory");
    if (lex_all(&L) != 0) return -1;
    if (!push(&L, T_EOF, L.n)) return -1;
    out->src = L.s;
    out->len = L.n;
    out->tok = L.tok;
    out->n = L.nt;
    return 0;
}

const char *jinja_token_name(int type) {
    static const char *const names[] = {
        "end of template", "template data", "begin of statement block", "end of statement block",
        "begin of print statement", "end of print statement", "name", "string", "integer", "float",
        "+", "-", "/", "//", "*", "%", "**", "~", "[", "]", "(", ")", "{", "}", "==", "!=", ">", ">=",
        "<", "<=", "=", ".", ":", "|", ",", ";"};
    return type >= 0 && type < (int)(sizeof names / sizeof names[0]) ? names[type] : "?";
}
