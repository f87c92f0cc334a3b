/* Prompts for dialogue summarization: a template with a {dialogue} placeholder, optional
 * worked examples (one-/few-shot) before it, as plain text (T5, base models) or as chat turns
 * rendered with an instruction-tuned decoder's chat template. */
#ifndef QLM_SUMMARY_PROMPT_H
#define QLM_SUMMARY_PROMPT_H

#include "../tokenizer/marked_text.h"

/* The zero-shot prompt of the DialogSum lab. */
#define QLM_SUMMARY_TEMPLATE "Summarize the following conversation.\n\n{dialogue}\n\nSummary: "

typedef struct {
    const char *dialogue, *summary;
} qlm_shot;

/* Checks that tmpl holds the {dialogue} placeholder; source names it in the error. */
int qlm_summary_template_check(const char *tmpl, const char *source);

/* Builds the prompt for dialogue into *out (the dialogues and summaries marked untrusted, for
 * qlm_tokenizer_encode_marked; free with qlm_marked_free). Plain (chat_template NULL): each shot is
 * the template filled with its dialogue followed by its summary and a blank line, then the
 * template filled with dialogue. Chat: each shot is a user turn (the filled template) and an
 * assistant turn (its summary), then the user turn, rendered with the generation prompt; bos/eos
 * are the tokenizer's strings for the template. */
int qlm_summary_prompt(const char *tmpl, const qlm_shot *shots, int n_shots, const char *dialogue,
                       const char *chat_template, const char *bos, const char *eos, qlm_marked_text *out);

#endif
