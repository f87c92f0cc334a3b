#include "summary_prompt.h"

#include <stdlib.h>
#include <string.h>

#include "../tokenizer/chat.h"
#include "../core/error.h"

#define PLACEHOLDER "{dialogue}"

int qlm_summary_template_check(const char *tmpl, const char *source) {
    if (!strstr(tmpl, PLACEHOLDER)) return qlm_errorf("%s: the prompt template has no %s placeholder", source, PLACEHOLDER);
    return 0;
}

/* Appends tmpl with every {dialogue} replaced by dialogue, which is marked untrusted. */
static void fill(qlm_marked_text *out, const char *tmpl, const char *dialogue) {
    size_t plen = strlen(PLACEHOLDER);
    for (const char *p = tmpl;;) {
        const char *hit = strstr(p, PLACEHOLDER);
        qlm_marked_put(out, p, hit ? (size_t)(hit - p) : strlen(p), 0);
        if (!hit) return;
        qlm_marked_puts(out, dialogue, 1);
        p = hit + plen;
    }
}

static void plain_prompt(const char *tmpl, const qlm_shot *shots, int n_shots, const char *dialogue,
                         qlm_marked_text *out) {
    for (int i = 0; i <= n_shots; i++) {
        fill(out, tmpl, i < n_shots ? shots[i].dialogue : dialogue);
        if (i < n_shots) {
            qlm_marked_puts(out, shots[i].summary, 1);
            qlm_marked_puts(out, "\n\n", 0);
        }
    }
}

static int chat_prompt(const char *tmpl, const qlm_shot *shots, int n_shots, const char *dialogue,
                       const char *chat_template, const char *bos, const char *eos, qlm_marked_text *out) {
    int n = 2 * n_shots + 1, rc = 0;
    qlm_chat_message *msgs = calloc((size_t)n, sizeof *msgs);
    char **filled = calloc((size_t)n_shots + 1, sizeof *filled);
    if (!msgs || !filled) rc = qlm_errorf("out of memory");
    for (int i = 0; i <= n_shots && rc == 0; i++) {
        qlm_marked_text turn = {0}; /* the user turn is said as a whole, so its marks are not needed */
        fill(&turn, tmpl, i < n_shots ? shots[i].dialogue : dialogue);
        if (!(filled[i] = qlm_marked_take(&turn))) rc = qlm_errorf("out of memory");
        msgs[2 * i] = (qlm_chat_message){"user", filled[i]};
        if (i < n_shots) msgs[2 * i + 1] = (qlm_chat_message){"assistant", shots[i].summary};
    }
    if (rc == 0) rc = qlm_chat_render_marked(chat_template, msgs, n, 1, bos, eos, out);
    for (int i = 0; filled && i <= n_shots; i++) free(filled[i]);
    free(filled);
    free(msgs);
    return rc;
}

int qlm_summary_prompt(const char *tmpl, const qlm_shot *shots, int n_shots, const char *dialogue,
                       const char *chat_template, const char *bos, const char *eos, qlm_marked_text *out) {
    memset(out, 0, sizeof *out);
    if (qlm_summary_template_check(tmpl, "summary prompt") != 0) return -1;
    if (chat_template) return chat_prompt(tmpl, shots, n_shots, dialogue, chat_template, bos, eos, out);
    plain_prompt(tmpl, shots, n_shots, dialogue, out);
    if (out->failed) {
        qlm_marked_free(out);
        return qlm_errorf("out of memory");
    }
    return 0;
}
