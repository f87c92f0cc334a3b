/* Chat template families rendered without a Jinja engine (see chat.h). */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

/* Template text: its special tokens are meant. */
static void put(qlm_marked_text *b, const char *s) { qlm_marked_puts(b, s, 0); }
/* What a message says (or its role): never read as control tokens. */
static void put_said(qlm_marked_text *b, const char *s) { qlm_marked_puts(b, s, 1); }

/* Python's str.isspace() for the characters str.strip() / Jinja's trim remove. */
static size_t space_len(const unsigned char *s, size_t n) {
    static const char *const wide[] = {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8", "\xE2\x80\xA9",
                                       "\xE2\x80\xAF", "\xE2\x81\x9F", "\xE3\x80\x80"};
    if (n == 0) return 0;
    if (s[0] == ' ' || (s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x1F)) return 1;
    if (n >= 3 && s[0] == 0xE2 && s[1] == 0x80 && s[2] >= 0x80 && s[2] <= 0x8A) return 3; /* U+2000..U+200A */
    for (size_t i = 0; i < sizeof(wide) / sizeof(wide[0]); i++) {
        size_t k = strlen(wide[i]);
        if (n >= k && memcmp(s, wide[i], k) == 0) return k;
    }
    return 0;
}

/* [*lo, *hi) of s[0..n) without its leading and trailing whitespace (Python's str.strip()). */
static void strip_range(const char *text, size_t n, size_t *lo, size_t *hi) {
    const unsigned char *s = (const unsigned char *)text;
    size_t a = 0, k;
    while ((k = space_len(s + a, n - a)) > 0) a += k;
    size_t end = n;
    while (end > a) {
        size_t start = end - 1;
        while (start > a && (s[start] & 0xC0) == 0x80) start--; /* back to the character's first byte */
        if (space_len(s + start, end - start) != end - start) break;
        end = start;
    }
    *lo = a;
    *hi = end;
}

/* Appends what a message says with leading and trailing whitespace removed. */
static void put_stripped(qlm_marked_text *b, const char *content) {
    size_t lo, hi;
    strip_range(content, strlen(content), &lo, &hi);
    qlm_marked_put(b, content + lo, hi - lo, 1);
}

qlm_chat_family qlm_chat_detect(const char *t) {
    if (!t) return QLM_CHAT_PLAIN;
    if (strstr(t, "<|im_start|>")) return QLM_CHAT_CHATML;
    if (strstr(t, "<|start_header_id|>")) return QLM_CHAT_LLAMA3;
    if (strstr(t, "<|user|>")) return QLM_CHAT_ZEPHYR;
    if (strstr(t, "[INST]") && strstr(t, "<<SYS>>")) return QLM_CHAT_LLAMA2;
    return QLM_CHAT_PLAIN;
}

const char *qlm_chat_family_name(qlm_chat_family f) {
    switch (f) {
    case QLM_CHAT_CHATML: return "chatml";
    case QLM_CHAT_ZEPHYR: return "zephyr";
    case QLM_CHAT_LLAMA2: return "llama2";
    case QLM_CHAT_LLAMA3: return "llama3";
    default: return "plain";
    }
}

/* ---- ChatML ---- */

/* Appends the Jinja string-literal text s[0..n) with its escapes (\n, \t, \', \", \\) resolved. */
static void put_unescaped(qlm_marked_text *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' && i + 1 < n) {
            c = s[++i];
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c;
        }
        qlm_marked_put(b, &c, 1, 0);
    }
}

/* The template's literal default system block "<|im_start|>system\n...<|im_end|>" (inside one
 * string literal, so no quotes), rendered into b; 0 if there is none. */
static int default_system(const char *t, qlm_marked_text *b) {
    static const char head[] = "<|im_start|>system", tail[] = "<|im_end|>";
    for (const char *p = strstr(t, head); p; p = strstr(p + 1, head)) {
        const char *body = p + strlen(head);
        if (*body == '\n') body++;
        else if (body[0] == '\\' && body[1] == 'n') body += 2;
        else continue;
        const char *end = strstr(body, tail);
        if (!end || end == body || memchr(body, '\'', (size_t)(end - body)) || memchr(body, '"', (size_t)(end - body)))
            continue;
        put(b, "<|im_start|>system\n");
        put_unescaped(b, body, (size_t)(end - body));
        put(b, "<|im_end|>\n");
        return 1;
    }
    return 0;
}

static void render_chatml(qlm_marked_text *b, const char *t, const qlm_chat_message *m, int n, int gen) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && strcmp(m[0].role, "system") != 0) default_system(t, b);
        put(b, "<|im_start|>");
        put_said(b, m[i].role);
        put(b, "\n");
        put_said(b, m[i].content);
        put(b, "<|im_end|>\n");
    }
    if (gen) put(b, "<|im_start|>assistant\n");
}

/* ---- Zephyr, Llama 2, Llama 3, plain ---- */

static void render_zephyr(qlm_marked_text *b, const qlm_chat_message *m, int n, int gen, const char *eos) {
    for (int i = 0; i < n; i++) {
        const char *r = m[i].role;
        if (strcmp(r, "user") == 0 || strcmp(r, "system") == 0 || strcmp(r, "assistant") == 0) {
            put(b, "<|");
            put(b, r);
            put(b, "|>\n");
            put_said(b, m[i].content);
            put(b, eos);
            put(b, "\n");
        }
        if (i == n - 1 && gen) put(b, "<|assistant|>\n");
    }
}

static int render_llama2(qlm_marked_text *b, const qlm_chat_message *m, int n, const char *bos, const char *eos) {
    const char *system = NULL;
    if (n > 0 && strcmp(m[0].role, "system") == 0) {
        system = m[0].content;
        m++;
        n--;
    }
    for (int i = 0; i < n; i++) {
        int user = strcmp(m[i].role, "user") == 0;
        if (user != (i % 2 == 0))
            return qlm_errorf("chat template llama2: conversation roles must alternate user/assistant/user/...");
        qlm_marked_text content = {0};
        if (i == 0 && system) {
            put(&content, "<<SYS>>\n");
            put_said(&content, system);
            put(&content, "\n<</SYS>>\n\n");
        }
        put_said(&content, m[i].content);
        if (content.failed) {
            qlm_marked_free(&content);
            b->failed = 1;
            return 0; /* reported by the caller */
        }
        size_t lo, hi; /* the template strips system block and message together */
        strip_range(content.text, content.len, &lo, &hi);
        if (user) {
            put(b, bos);
            put(b, "[INST] ");
            qlm_marked_append(b, &content, lo, hi);
            put(b, " [/INST]");
        } else if (strcmp(m[i].role, "assistant") == 0) {
            put(b, " ");
            qlm_marked_append(b, &content, lo, hi);
            put(b, " ");
            put(b, eos);
        }
        qlm_marked_free(&content);
    }
    return 0;
}

static void render_llama3(qlm_marked_text *b, const qlm_chat_message *m, int n, int gen, const char *bos) {
    for (int i = 0; i < n; i++) {
        if (i == 0) put(b, bos);
        put(b, "<|start_header_id|>");
        put_said(b, m[i].role);
        put(b, "<|end_header_id|>\n\n");
        put_stripped(b, m[i].content);
        put(b, "<|eot_id|>");
    }
    if (gen) put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_plain(qlm_marked_text *b, const qlm_chat_message *m, int n, int gen) {
    for (int i = 0; i < n; i++) {
        const char *r = m[i].role;
        const char *shown = strcmp(r, "system") == 0      ? "System"
                            : strcmp(r, "user") == 0      ? "User"
                            : strcmp(r, "assistant") == 0 ? "Assistant"
                                                          : NULL;
        if (shown) put(b, shown);
        else put_said(b, r);
        put(b, ": ");
        put_said(b, m[i].content);
        put(b, "\n");
    }
    if (gen) put(b, "Assistant: ");
}

int qlm_chat_render_marked(const char *tmpl, const qlm_chat_message *msgs, int n, int gen, const char *bos,
                           const char *eos, qlm_marked_text *out) {
    memset(out, 0, sizeof *out);
    if (n < 0 || (n > 0 && !msgs)) return qlm_errorf("chat: invalid arguments");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return qlm_errorf("chat: message %d has no role or content", i);
    bos = bos ? bos : "";
    eos = eos ? eos : "";
    put(out, "");
    int rc = 0;
    switch (qlm_chat_detect(tmpl)) {
    case QLM_CHAT_CHATML: render_chatml(out, tmpl, msgs, n, gen); break;
    case QLM_CHAT_ZEPHYR: render_zephyr(out, msgs, n, gen, eos); break;
    case QLM_CHAT_LLAMA2: rc = render_llama2(out, msgs, n, bos, eos); break;
    case QLM_CHAT_LLAMA3: render_llama3(out, msgs, n, gen, bos); break;
    default: render_plain(out, msgs, n, gen); break;
    }
    if (rc == 0 && out->failed) rc = qlm_errorf("chat: out of memory");
    if (rc != 0) qlm_marked_free(out);
    return rc;
}

int qlm_chat_render(const char *tmpl, const qlm_chat_message *msgs, int n, int gen, const char *bos, const char *eos,
                    char **out) {
    if (!out) return qlm_errorf("chat: invalid arguments");
    qlm_marked_text m;
    if (qlm_chat_render_marked(tmpl, msgs, n, gen, bos, eos, &m) != 0) return -1;
    return (*out = qlm_marked_take(&m)) ? 0 : qlm_errorf("chat: out of memory");
}
