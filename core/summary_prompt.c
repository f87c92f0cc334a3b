#include "summary_prompt.h"

#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "error.h"

#define PLACEHOLDER "{dialogue}"

int qlm_summary_template_check(const char *tmpl, const char *source) {
    if (!strstr(tmpl, PLACEHOLDER)) return qlm_errorf("%s: the prompt template has no %s placeholder", source, PLACEHOLDER);
    return 0;
}

/* tmpl with every {dialogue} replaced by dialogue; NULL when out of memory. */
static char *fill(const char *tmpl, const char *dialogue) {
    size_t n = 0, plen = strlen(PLACEHOLDER), dlen = strlen(dialogue);
    for (const char *p = strstr(tmpl, PLACEHOLDER); p; p = strstr(p + plen, PLACEHOLDER)) n++;
    char *out = malloc(strlen(tmpl) + n * dlen + 1), *w = out;
    if (!out) return NULL;
    for (const char *p = tmpl;;) {
        const char *hit = strstr(p, PLACEHOLDER);
        size_t keep = hit ? (size_t)(hit - p) : strlen(p);
        memcpy(w, p, keep);
        w += keep;
        if (!hit) break;
        memcpy(w, dialogue, dlen);
        w += dlen;
        p = hit + plen;
    }
    *w = 0;
    return out;
}

static int append(char **buf, size_t *len, const char *s) {
    size_t n = strlen(s);
    char *b = realloc(*buf, *len + n + 1);
    if (!b) return -1;
    memcpy(b + *len, s, n + 1);
    *buf = b;
    *len += n;
    return 0;
}

static int plain_prompt(const char *tmpl, const qlm_shot *shots, int n_shots, const char *dialogue, char **out) {
    char *buf = NULL;
    size_t len = 0;
    int rc = 0;
    for (int i = 0; i <= n_shots && rc == 0; i++) {
        char *filled = fill(tmpl, i < n_shots ? shots[i].dialogue : dialogue);
        rc = !filled || append(&buf, &len, filled) != 0 ||
             (i < n_shots && (append(&buf, &len, shots[i].summary) != 0 || append(&buf, &len, "\n\n") != 0));
        free(filled);
    }
    if (rc != 0) {
        free(buf);
        return qlm_errorf("out of memory");
    }
    *out = buf;
    return 0;
}

static int chat_prompt(const char *tmpl, const qlm_shot *shots, int n_shots, const char *dialogue,
                       const char *chat_template, const char *bos, const char *eos, char **out) {
    int n = 2 * n_shots + 1, rc = 0;
    qlm_chat_message *msgs = calloc((size_t)n, sizeof *msgs);
    char **filled = calloc((size_t)n_shots + 1, sizeof *filled);
    if (!msgs || !filled) rc = qlm_errorf("out of memory");
    for (int i = 0; i <= n_shots && rc == 0; i++) {
        filled[i] = fill(tmpl, i < n_shots ? shots[i].dialogue : dialogue);
        if (!filled[i]) rc = qlm_errorf("out of memory");
        msgs[2 * i] = (qlm_chat_message){"user", filled[i]};
        if (i < n_shots) msgs[2 * i + 1] = (qlm_chat_message){"assistant", shots[i].summary};
    }
    if (rc == 0) rc = qlm_chat_render(chat_template, msgs, n, 1, bos, eos, out);
    for (int i = 0; filled && i <= n_shots; i++) free(filled[i]);
    free(filled);
    free(msgs);
    return rc;
}

int qlm_summary_prompt(const char *tmpl, const qlm_shot *shots, int n_shots, const char *dialogue,
                       const char *chat_template, const char *bos, const char *eos, char **out) {
    *out = NULL;
    if (qlm_summary_template_check(tmpl, "summary prompt") != 0) return -1;
    if (chat_template) return chat_prompt(tmpl, shots, n_shots, dialogue, chat_template, bos, eos, out);
    return plain_prompt(tmpl, shots, n_shots, dialogue, out);
}
