/* Python's str operations on marked strings: strip, split, replace, find, splitlines and case
 * mapping. Pieces of a string are slices of it, so they keep their marks; what a mapping makes
 * of a character takes that character's mark. */
#include <locale.h>
#include <string.h>
#include <wctype.h>

#include "jinja_internal.h"

/* ---- characters ---- */

static int in_chars(jstr set, uint32_t c) {
    for (size_t i = 0; i < set.n;) {
        int len;
        if (ju_decode(set.p, set.n, i, &len) == c) return 1;
        i += (size_t)len;
    }
    return 0;
}

/* The start of the character that ends at `end` (end > 0). */
static size_t char_start_before(jstr s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s.p[i] & 0xC0) == 0x80 && end - i < 4) i--;
    int len;
    ju_decode(s.p, s.n, i, &len);
    return i + (size_t)len == end ? i : end - 1;
}

int js_strip(jrender *r, jstr s, const jstr *chars, int left, int right, jstr *out) {
    /* each stripped character is looked up among chars */
    if (jr_charge(r, (cost_scan(s.n) + 1) * (chars ? cost_scan(chars->n) + 1 : 1)) != 0) return -1;
    size_t a = 0, b = s.n;
    while (left && a < b) {
        int len;
        uint32_t c = ju_decode(s.p, s.n, a, &len);
        if (chars ? !in_chars(*chars, c) : !ju_isspace(c)) break;
        a += (size_t)len;
    }
    while (right && b > a) {
        size_t start = char_start_before(s, b);
        int len;
        uint32_t c = ju_decode(s.p, s.n, start, &len);
        if (chars ? !in_chars(*chars, c) : !ju_isspace(c)) break;
        b = start;
    }
    *out = js_sub(s, a, b);
    return 0;
}

/* ---- split ---- */

/* The length of the whitespace character at byte i, 0 if it is not one. */
static size_t js_space_len(jstr s, size_t i) {
    int len;
    uint32_t c = ju_decode(s.p, s.n, i, &len);
    return ju_isspace(c) ? (size_t)len : 0;
}


typedef struct {
    jstr *v;
    int n, cap;
} pieces;

static int add_piece(jrender *r, pieces *p, jstr s) {
    if (p->n == p->cap) {
        int cap = p->cap ? p->cap * 2 : 8;
        jstr *v = jr_alloc(r, sizeof *v * (size_t)cap);
        if (!v) return -1;
        if (p->n) memcpy(v, p->v, sizeof *v * (size_t)p->n);
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = s;
    return 0;
}

static int pieces_list(jrender *r, const pieces *p, int reverse, jval *out) {
    jval l = jv_list(r, L_LIST, p->n);
    if (!l.u.l) return -1;
    for (int i = 0; i < p->n; i++) l.u.l->v[i] = jv_str(p->v[reverse ? p->n - 1 - i : i]);
    *out = l;
    return 0;
}

static int split_space(jrender *r, jstr s, long maxsplit, int from_right, pieces *p) {
    if (!from_right) {
        size_t i = 0;
        for (;;) {
            while (i < s.n && js_space_len(s, i)) i += js_space_len(s, i);
            if (i >= s.n) return 0;
            if (maxsplit >= 0 && p->n == maxsplit) return add_piece(r, p, js_sub(s, i, s.n));
            size_t start = i;
            while (i < s.n && !js_space_len(s, i)) {
                int len;
                ju_decode(s.p, s.n, i, &len);
                i += (size_t)len;
            }
            if (add_piece(r, p, js_sub(s, start, i)) != 0) return -1;
        }
    }
    size_t end = s.n;
    for (;;) {
        while (end > 0 && js_space_len(s, char_start_before(s, end)) == end - char_start_before(s, end))
            end = char_start_before(s, end);
        if (end == 0) return 0;
        if (maxsplit >= 0 && p->n == maxsplit) return add_piece(r, p, js_sub(s, 0, end));
        size_t start = end;
        while (start > 0 && js_space_len(s, char_start_before(s, start)) != start - char_start_before(s, start))
            start = char_start_before(s, start);
        if (add_piece(r, p, js_sub(s, start, end)) != 0) return -1;
        end = start;
    }
}

static const char *rmemmem(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, n, nn) == 0) return h + i;
    return NULL;
}

int js_split(jrender *r, jstr s, const jstr *sep, long maxsplit, int from_right, jval *out) {
    pieces p = {0};
    /* rsplit compares at each position */
    if (jr_charge(r, (cost_scan(s.n) + 1) * (sep ? cost_compare(sep->n) + 1 : 1)) != 0) return -1;
    if (!sep) {
        if (split_space(r, s, maxsplit, from_right, &p) != 0) return -1;
        return pieces_list(r, &p, from_right, out);
    }
    if (sep->n == 0) return jr_fail(r, "empty separator");
    size_t a = 0, b = s.n;
    while (maxsplit < 0 || p.n < maxsplit) {
        const char *hit = from_right ? rmemmem(s.p + a, b - a, sep->p, sep->n) : memmem(s.p + a, b - a, sep->p, sep->n);
        if (!hit) break;
        size_t at = (size_t)(hit - s.p);
        if (from_right) {
            if (add_piece(r, &p, js_sub(s, at + sep->n, b)) != 0) return -1;
            b = at;
        } else {
            if (add_piece(r, &p, js_sub(s, a, at)) != 0) return -1;
            a = at + sep->n;
        }
    }
    if (add_piece(r, &p, js_sub(s, a, b)) != 0) return -1;
    return pieces_list(r, &p, from_right, out);
}

/* Line boundaries as Python's str.splitlines() knows them: the length of the one at i, 0 if none. */
static size_t line_break_len(jstr s, size_t i) {
    int len;
    uint32_t c = ju_decode(s.p, s.n, i, &len);
    if (c == '\r' && i + 1 < s.n && s.p[i + 1] == '\n') return 2;
    if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
        c == 0x2029)
        return (size_t)len;
    return 0;
}

int js_splitlines(jrender *r, jstr s, int keepends, jval *out) {
    pieces p = {0};
    if (jr_charge(r, cost_scan(s.n)) != 0) return -1;
    size_t start = 0, i = 0;
    while (i < s.n) {
        size_t br = line_break_len(s, i);
        if (!br) {
            int len;
            ju_decode(s.p, s.n, i, &len);
            i += (size_t)len;
            continue;
        }
        if (add_piece(r, &p, js_sub(s, start, keepends ? i + br : i)) != 0) return -1;
        i += br;
        start = i;
    }
    if (start < s.n && add_piece(r, &p, js_sub(s, start, s.n)) != 0) return -1;
    return pieces_list(r, &p, 0, out);
}

/* ---- replace, find, count ---- */

int js_replace(jrender *r, jstr s, jstr old, jstr rep, long count, jstr *out) {
    jbuf b = {0};
    if (jr_charge(r, cost_scan(s.n)) != 0) return -1;
    if (old.n == 0) { /* the new text goes before every character and at the end */
        size_t i = 0;
        long done = 0;
        while (count < 0 || done < count) {
            if (jb_put(r, &b, rep) != 0) return -1;
            done++;
            if (i >= s.n) break;
            int len;
            ju_decode(s.p, s.n, i, &len);
            if (jb_put(r, &b, js_sub(s, i, i + (size_t)len)) != 0) return -1;
            i += (size_t)len;
        }
        if (jb_put(r, &b, js_sub(s, i, s.n)) != 0) return -1;
        *out = jb_str(&b);
        return 0;
    }
    size_t i = 0;
    for (long done = 0; count < 0 || done < count; done++) {
        const char *hit = memmem(s.p + i, s.n - i, old.p, old.n);
        if (!hit) break;
        size_t at = (size_t)(hit - s.p);
        if (jb_put(r, &b, js_sub(s, i, at)) != 0 || jb_put(r, &b, rep) != 0) return -1;
        i = at + old.n;
        if (jr_charge(r, 1) != 0) return -1;
    }
    if (i == 0) {
        *out = s;
        return 0;
    }
    if (jb_put(r, &b, js_sub(s, i, s.n)) != 0) return -1;
    *out = jb_str(&b);
    return 0;
}

/* ---- case mapping ---- */

typedef struct {
    uint32_t from;
    const char *to; /* UTF-8 */
} special_case;

/* Python's multi-character mappings (SpecialCasing.txt) that templates could meet. */
static const special_case k_upper[] = {
    {0xDF, "SS"},      {0x149, "\xCA\xBCN"}, {0x1F0, "J\xCC\x8C"}, {0x587, "\xD4\xB5\xD5\x92"},
    {0xFB00, "FF"},    {0xFB01, "FI"},       {0xFB02, "FL"},       {0xFB03, "FFI"},
    {0xFB04, "FFL"},   {0xFB05, "ST"},       {0xFB06, "ST"},
};
static const special_case k_title[] = {
    {0xDF, "Ss"},      {0xFB00, "Ff"},       {0xFB01, "Fi"},       {0xFB02, "Fl"},   {0xFB03, "Ffi"},
    {0xFB04, "Ffl"},   {0xFB05, "St"},       {0xFB06, "St"},       {0x1C4, "\xC7\x85"}, {0x1C5, "\xC7\x85"},
    {0x1C6, "\xC7\x85"}, {0x1C7, "\xC7\x88"}, {0x1C8, "\xC7\x88"}, {0x1C9, "\xC7\x88"}, {0x1CA, "\xC7\x8B"},
    {0x1CB, "\xC7\x8B"}, {0x1CC, "\xC7\x8B"}, {0x1F1, "\xC7\xB2"}, {0x1F2, "\xC7\xB2"}, {0x1F3, "\xC7\xB2"},
};

static const char *special(const special_case *t, size_t n, uint32_t c) {
    for (size_t i = 0; i < n; i++)
        if (t[i].from == c) return t[i].to;
    return NULL;
}

static int need_locale(jrender *r) {
    if (r->locale) return 0;
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
    if (!l) l = newlocale(LC_CTYPE_MASK, "C.utf8", (locale_t)0);
    if (!l) return jr_fail(r, "changing the case of non-ASCII text needs the C.UTF-8 locale");
    r->locale = l;
    return 0;
}

static uint32_t map_lower(jrender *r, uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    if (c >= 0xDC80 && c <= 0xDCFF) return c;
    return (uint32_t)towlower_l((wint_t)c, (locale_t)r->locale);
}

static uint32_t map_upper(jrender *r, uint32_t c) {
    if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
    if (c >= 0xDC80 && c <= 0xDCFF) return c;
    return (uint32_t)towupper_l((wint_t)c, (locale_t)r->locale);
}

int js_is_cased(jrender *r, uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (c >= 0xDC80 && c <= 0xDCFF) return 0;
    return iswupper_l((wint_t)c, (locale_t)r->locale) || iswlower_l((wint_t)c, (locale_t)r->locale) ||
           special(k_title, sizeof k_title / sizeof k_title[0], c) != NULL;
}

int js_is_upper(jrender *r, uint32_t c) {
    if (c < 0x80) return c >= 'A' && c <= 'Z';
    return c < 0xDC80 || c > 0xDCFF ? iswupper_l((wint_t)c, (locale_t)r->locale) : 0;
}

int js_is_lower(jrender *r, uint32_t c) {
    if (c < 0x80) return c >= 'a' && c <= 'z';
    return c < 0xDC80 || c > 0xDCFF ? iswlower_l((wint_t)c, (locale_t)r->locale) : 0;
}

int js_is_alpha(jrender *r, uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    return c < 0xDC80 || c > 0xDCFF ? iswalpha_l((wint_t)c, (locale_t)r->locale) : 0;
}

int js_prepare_locale(jrender *r, jstr s) {
    for (size_t i = 0; i < s.n; i++)
        if ((unsigned char)s.p[i] >= 0x80) return need_locale(r);
    return 0;
}

static int put_code(jrender *r, jbuf *b, uint32_t c, int mark) {
    char u[4];
    int n;
    if (c < 0x80) {
        u[0] = (char)c;
        n = 1;
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
        u[0] = (char)(c - 0xDC00);
        n = 1;
    } else if (c < 0x800) {
        u[0] = (char)(0xC0 | c >> 6);
        u[1] = (char)(0x80 | (c & 0x3F));
        n = 2;
    } else if (c < 0x10000) {
        u[0] = (char)(0xE0 | c >> 12);
        u[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        u[2] = (char)(0x80 | (c & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | c >> 18);
        u[1] = (char)(0x80 | ((c >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((c >> 6) & 0x3F));
        u[3] = (char)(0x80 | (c & 0x3F));
        n = 4;
    }
    return jb_putc(r, b, u, (size_t)n, mark);
}

/* Python's lower() of the character at i of s: a capital sigma that ends a word is final. */
static int put_lower(jrender *r, jbuf *b, jstr s, size_t i, uint32_t c, int len, int mark) {
    if (c == 0x130) return jb_putc(r, b, "i\xCC\x87", 3, mark);
    if (c == 0x3A3) {
        int before = 0, after = 0, l2;
        if (i > 0) before = js_is_cased(r, ju_decode(s.p, s.n, char_start_before(s, i), &l2));
        if (i + (size_t)len < s.n) after = js_is_cased(r, ju_decode(s.p, s.n, i + (size_t)len, &l2));
        return put_code(r, b, before && !after ? 0x3C2 : 0x3C3, mark);
    }
    return put_code(r, b, map_lower(r, c), mark);
}

static int put_upper(jrender *r, jbuf *b, uint32_t c, int mark, int title) {
    const char *sp = title ? special(k_title, sizeof k_title / sizeof k_title[0], c) : NULL;
    if (!sp) sp = special(k_upper, sizeof k_upper / sizeof k_upper[0], c);
    if (sp) return jb_putc(r, b, sp, strlen(sp), mark);
    return put_code(r, b, map_upper(r, c), mark);
}

/* Where jinja2's title filter starts a new word. */
static int title_separator(uint32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || ju_isspace(c);
}

int js_case(jrender *r, jstr s, int mode, jstr *out) {
    if (js_prepare_locale(r, s) != 0) return -1;
    if (jr_charge(r, cost_rewrite(s.n)) != 0) return -1;
    jbuf b = {0};
    int prev_cased = 0, word_start = 1, first = 1;
    for (size_t i = 0; i < s.n;) {
        int len, mark = js_mark(s, i), rc;
        uint32_t c = ju_decode(s.p, s.n, i, &len);
        switch (mode) {
        case CASE_LOWER: rc = put_lower(r, &b, s, i, c, len, mark); break;
        case CASE_UPPER: rc = put_upper(r, &b, c, mark, 0); break;
        case CASE_CAPITALIZE: rc = first ? put_upper(r, &b, c, mark, 1) : put_lower(r, &b, s, i, c, len, mark); break;
        case CASE_PY_TITLE:
            rc = prev_cased ? put_lower(r, &b, s, i, c, len, mark) : put_upper(r, &b, c, mark, 1);
            prev_cased = js_is_cased(r, c);
            break;
        case CASE_SWAP:
            rc = js_is_upper(r, c) ? put_lower(r, &b, s, i, c, len, mark)
                 : js_is_lower(r, c) ? put_upper(r, &b, c, mark, 0)
                                     : put_code(r, &b, c, mark);
            break;
        default: /* jinja2's title filter: each word's first character upper, the rest lower */
            if (title_separator(c)) {
                rc = put_code(r, &b, c, mark);
                word_start = 1;
            } else {
                rc = word_start ? put_upper(r, &b, c, mark, 0) : put_lower(r, &b, s, i, c, len, mark);
                word_start = 0;
            }
        }
        if (rc != 0) return -1;
        first = 0;
        i += (size_t)len;
    }
    *out = jb_str(&b);
    return 0;
}
