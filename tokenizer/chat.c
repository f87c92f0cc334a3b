/* Chat prompts through the model's Jinja template, or the plain format without one (see chat.h). */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

/* Template text: its special tokens are meant. */
static void put(qlm_marked_text *b, const char *s) { qlm_marked_puts(b, s, 0); }
/* What a message says (or its role): never read as control tokens. */
static void put_said(qlm_marked_text *b, const char *s) { qlm_marked_puts(b, s, 1); }

static void render_plain(qlm_marked_text *b, const qlm_chat_message *m, int n, int gen) {
    put(b, "");
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

static qlm_jinja_input str_input(const char *key, const char *s, int untrusted) {
    return (qlm_jinja_input){.type = QLM_JINJA_STRING, .key = key, .s = s, .len = strlen(s), .untrusted = untrusted};
}

/* The variables apply_chat_template gives a template, in the caller's memory (vars: 6 entries,
 * entries: 2n for the messages' fields, list: n). */
static void chat_vars(const qlm_chat_message *msgs, int n, int gen, const char *bos, const char *eos,
                      qlm_jinja_input *vars, qlm_jinja_input *list, qlm_jinja_input *fields) {
    for (int i = 0; i < n; i++) {
        fields[2 * i] = str_input("role", msgs[i].role, 1);
        fields[2 * i + 1] = str_input("content", msgs[i].content, 1);
        list[i] = (qlm_jinja_input){.type = QLM_JINJA_DICT, .items = &fields[2 * i], .n = 2};
    }
    vars[0] = (qlm_jinja_input){.type = QLM_JINJA_LIST, .key = "messages", .items = list, .n = n};
    vars[1] = (qlm_jinja_input){.type = QLM_JINJA_NONE, .key = "tools"};
    vars[2] = (qlm_jinja_input){.type = QLM_JINJA_NONE, .key = "documents"};
    vars[3] = (qlm_jinja_input){.type = QLM_JINJA_BOOL, .key = "add_generation_prompt", .i = gen != 0};
    vars[4] = str_input("bos_token", bos, 0);
    vars[5] = str_input("eos_token", eos, 0);
}

int qlm_chat_render_parsed(const qlm_jinja *tmpl, const qlm_chat_message *msgs, int n, int gen, const char *bos,
                           const char *eos, const qlm_jinja_limits *lim, qlm_marked_text *out) {
    memset(out, 0, sizeof *out);
    if (n < 0 || (n > 0 && !msgs)) return qlm_errorf("chat: invalid arguments");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return qlm_errorf("chat: message %d has no role or content", i);
    if (!tmpl) {
        render_plain(out, msgs, n, gen);
        if (!out->failed) return 0;
        qlm_marked_free(out);
        return qlm_errorf("chat: out of memory");
    }
    qlm_jinja_input vars[6], *list = calloc((size_t)n + 1, sizeof *list);
    qlm_jinja_input *fields = calloc(2 * (size_t)n + 1, sizeof *fields);
    int rc = -1;
    if (list && fields) {
        chat_vars(msgs, n, gen, bos ? bos : "", eos ? eos : "", vars, list, fields);
        rc = qlm_jinja_render(tmpl, vars, 6, lim, out);
    } else {
        qlm_errorf("chat: out of memory");
    }
    free(list);
    free(fields);
    return rc;
}

int qlm_chat_render_marked(const char *tmpl, const qlm_chat_message *msgs, int n, int gen, const char *bos,
                           const char *eos, qlm_marked_text *out) {
    memset(out, 0, sizeof *out);
    qlm_jinja *parsed = NULL;
    if (tmpl && qlm_jinja_parse(tmpl, strlen(tmpl), &parsed) != 0) return -1;
    int rc = qlm_chat_render_parsed(parsed, msgs, n, gen, bos, eos, NULL, out);
    qlm_jinja_free(parsed);
    return rc;
}

int qlm_chat_render(const char *tmpl, const qlm_chat_message *msgs, int n, int gen, const char *bos, const char *eos,
                    char **out) {
    if (!out) return qlm_errorf("chat: invalid arguments");
    qlm_marked_text m;
    if (qlm_chat_render_marked(tmpl, msgs, n, gen, bos, eos, &m) != 0) return -1;
    return (*out = qlm_marked_take(&m)) ? 0 : qlm_errorf("chat: out of memory");
}

int qlm_chat_template_check(const char *tmpl) {
    if (!tmpl) return 0;
    qlm_jinja *parsed;
    if (qlm_jinja_parse(tmpl, strlen(tmpl), &parsed) != 0) return -1;
    qlm_jinja_free(parsed);
    return 0;
}

const char *qlm_chat_template_describe(const char *tmpl, char *buf, size_t size) {
    if (!tmpl) snprintf(buf, size, "none (plain \"User: ...\" lines)");
    else if (qlm_chat_template_check(tmpl) != 0)
        snprintf(buf, size, "Jinja, %zu bytes, does not parse: %s", strlen(tmpl), qlm_last_error());
    else snprintf(buf, size, "Jinja, %zu bytes", strlen(tmpl));
    return buf;
}
