/* UTF-8 helpers and the GPT-2 byte-level alphabet for the tokenizers. */
#include "tokenizer_internal.h"

static int is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

int tok_utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return n >= 2 && is_cont(s[1]) ? 2 : 1;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || !is_cont(s[2])) return 1;
        /* Reject overlong forms (E0 80..9F) and UTF-16 surrogates (ED A0..BF). */
        unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return s[1] >= lo && s[1] <= hi ? 3 : 1;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || !is_cont(s[2]) || !is_cont(s[3])) return 1;
        /* Reject overlong forms (F0 80..8F) and code points above U+10FFFF (F4 90..). */
        unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return s[1] >= lo && s[1] <= hi ? 4 : 1;
    }
    return 1;
}

int qlm_utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int len = s[i] < 0x80 ? 1 : tok_utf8_len(s + i, n - i);
        if (s[i] >= 0x80 && len == 1) return 0;
        i += (size_t)len;
    }
    return 1;
}

size_t tok_utf8_partial_tail(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = s[n - k];
        if (is_cont(c)) continue;
        size_t want = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
        return want > k ? k : 0;
    }
    return 0;
}

uint32_t tok_utf8_cp(const unsigned char *s, int len) {
    switch (len) {
    case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    case 4:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
               (s[3] & 0x3F);
    default: return s[0];
    }
}

int tok_utf8_put(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's alphabet keeps the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF as the same code
 * points and gives the other 68 bytes (0x00..0x20, 0x7F..0xA0, 0xAD) U+0100.. in byte order. */
uint32_t tok_byte_to_cp(unsigned char b) {
    if (b <= 0x20) return 256u + b;
    if (b >= 0x7F && b <= 0xA0) return 256u + 33u + (uint32_t)(b - 0x7F);
    if (b == 0xAD) return 256u + 33u + 34u;
    return b;
}

int tok_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xFF && cp != 0xAD)) return (int)cp;
    if (cp >= 256 && cp < 256 + 33) return (int)(cp - 256);
    if (cp >= 256 + 33 && cp < 256 + 67) return (int)(0x7F + (cp - 256 - 33));
    if (cp == 256 + 67) return 0xAD;
    return -1;
}
