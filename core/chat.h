/* Chat prompts. qlm does not run Jinja: it recognises the family of a model's chat template from
 * its source and renders conversations exactly as transformers' apply_chat_template renders the
 * published templates of that family:
 *   ChatML  "<|im_start|>" (SmolLM2, Qwen2): a literal "<|im_start|>system\n...<|im_end|>" block
 *           in the template is the default system prompt, inserted when the first message is
 *           not a system message.
 *   Zephyr  "<|user|>" (TinyLlama chat): "<|role|>\n" + content + eos + "\n" per message.
 *   Llama 2 "[INST]" with "<<SYS>>": bos + "[INST] " + stripped content + " [/INST]", the system
 *           message folded into the first user turn; roles must alternate user/assistant.
 *   Llama 3 "<|start_header_id|>" (the 3.0 template): bos, then per message a header and the
 *           trimmed content ending in "<|eot_id|>".
 * Any other template, or NULL, gives the plain fallback: "System: ...\n", "User: ...\n",
 * "Assistant: ...\n" per message (other roles as "role: ...\n") and "Assistant: " as the
 * generation prompt. */
#ifndef QLM_CHAT_H
#define QLM_CHAT_H

#include "marked_text.h"

typedef struct {
    const char *role;    /* "system", "user", "assistant", ... */
    const char *content;
} qlm_chat_message;

typedef enum {
    QLM_CHAT_PLAIN = 0,
    QLM_CHAT_CHATML = 1,
    QLM_CHAT_ZEPHYR = 2,
    QLM_CHAT_LLAMA2 = 3,
    QLM_CHAT_LLAMA3 = 4,
} qlm_chat_family;

/* The family a template belongs to (QLM_CHAT_PLAIN for NULL or unknown templates). */
qlm_chat_family qlm_chat_detect(const char *jinja_template);
/* "plain", "chatml", "zephyr", "llama2", "llama3". */
const char *qlm_chat_family_name(qlm_chat_family family);

/* Renders n messages; add_generation_prompt appends the assistant turn opener. bos/eos are the
 * tokenizer's BOS/EOS strings (NULL as ""). *out is malloc'd. Returns 0, or -1 on invalid input
 * (e.g. Llama 2 roles that do not alternate, as the template raises). */
int qlm_chat_render(const char *jinja_template, const qlm_chat_message *msgs, int n, int add_generation_prompt,
                    const char *bos, const char *eos, char **out);
/* The same text with what the messages say (contents, and roles the template writes out) marked
 * untrusted, for qlm_tokenizer_encode_marked: the template's markers become control tokens, a
 * "<|im_end|>" typed into a message stays text. */
int qlm_chat_render_marked(const char *jinja_template, const qlm_chat_message *msgs, int n, int add_generation_prompt,
                           const char *bos, const char *eos, qlm_marked_text *out);

#endif
