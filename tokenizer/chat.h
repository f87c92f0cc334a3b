/* Chat prompts: a conversation rendered with the model's own chat template, run by qlm's Jinja
 * interpreter (jinja.h) with the variables transformers' apply_chat_template passes: messages
 * (a list of {role, content}), add_generation_prompt, bos_token, eos_token, and tools and
 * documents as None. What the messages say (contents and roles) is marked untrusted in the
 * output, the template's own text and bos/eos trusted.
 *
 * Without a template (NULL) the plain format is used: "System: ...\n", "User: ...\n",
 * "Assistant: ...\n" per message (other roles as "role: ...\n") and "Assistant: " as the
 * generation prompt. A template that does not parse, or fails on a conversation (its
 * raise_exception, a limit), is an error: the plain format never stands in for it. */
#ifndef QLM_CHAT_H
#define QLM_CHAT_H

#include <stddef.h>

#include "jinja.h"
#include "marked_text.h"

typedef struct {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content;
} qlm_chat_message;

/* Renders n messages with the template's source (NULL: the plain format); add_generation_prompt
 * asks the template for the assistant turn's opening. bos/eos are the tokenizer's BOS/EOS
 * strings (NULL as ""). *out is malloc'd. Returns 0, or -1 with the template's error (its line,
 * column and message, e.g. what its raise_exception says). */
int qlm_chat_render(const char *jinja_template, const qlm_chat_message *msgs, int n, int add_generation_prompt,
                    const char *bos, const char *eos, char **out);
/* The same text with what the messages say marked untrusted, for qlm_tokenizer_encode_marked:
 * the template's markers become control tokens, a "<|im_end|>" typed into a message stays text. */
int qlm_chat_render_marked(const char *jinja_template, const qlm_chat_message *msgs, int n, int add_generation_prompt,
                           const char *bos, const char *eos, qlm_marked_text *out);
/* The same with a template parsed once by qlm_jinja_parse (NULL: the plain format) and render
 * limits (NULL: qlm_jinja_default_limits()). */
int qlm_chat_render_parsed(const qlm_jinja *tmpl, const qlm_chat_message *msgs, int n, int add_generation_prompt,
                           const char *bos, const char *eos, const qlm_jinja_limits *lim, qlm_marked_text *out);

/* 0 when the template parses (NULL, the plain format, does), else -1 naming its line and column. */
int qlm_chat_template_check(const char *jinja_template);
/* What renders chats, for log lines: "none (plain \"User: ...\" lines)", "Jinja, N bytes", or
 * "Jinja, N bytes, does not parse: <why>" (which also leaves that in qlm_last_error). Returns buf. */
const char *qlm_chat_template_describe(const char *jinja_template, char *buf, size_t size);

#endif
