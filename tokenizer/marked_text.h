/* Text assembled from trusted pieces (a chat template's own markers) and untrusted ones (what a
 * message, a dialogue or a user says). The untrusted ranges are recorded so that the tokenizer
 * never reads a control token such as "<|im_end|>" inside them (special-token injection). */
#ifndef QLM_MARKED_TEXT_H
#define QLM_MARKED_TEXT_H

#include <stddef.h>

typedef struct {
    size_t start, end; /* [start, end) */
} qlm_span;

typedef struct {
    char *text; /* NUL-terminated; NULL until something is put */
    size_t len, cap;
    qlm_span *plain; /* the untrusted ranges, ascending, disjoint, adjacent ones merged */
    int n_plain, cap_plain;
    int failed; /* out of memory: every later put is ignored */
} qlm_marked_text;

/* Appends s[0..n); plain marks it untrusted. */
void qlm_marked_put(qlm_marked_text *m, const char *s, size_t n, int plain);
void qlm_marked_puts(qlm_marked_text *m, const char *s, int plain);
/* Appends src's [start, end) with its marks. */
void qlm_marked_append(qlm_marked_text *m, const qlm_marked_text *src, size_t start, size_t end);
/* Whether [start, end) overlaps an untrusted range. */
int qlm_marked_overlaps(const qlm_marked_text *m, size_t start, size_t end);
/* Hands the text over (malloc'd, "" for nothing put) and frees the rest; NULL if out of memory. */
char *qlm_marked_take(qlm_marked_text *m);
void qlm_marked_free(qlm_marked_text *m);

#endif
