#include "marked_text.h"

#include <stdlib.h>
#include <string.h>

static int grow(void **p, size_t *cap, size_t need, size_t item) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * item);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

void qlm_marked_put(qlm_marked_text *m, const char *s, size_t n, int plain) {
    if (m->failed) return;
    if (grow((void **)&m->text, &m->cap, m->len + n + 1, 1) != 0) {
        m->failed = 1;
        return;
    }
    memcpy(m->text + m->len, s, n);
    size_t start = m->len;
    m->len += n;
    m->text[m->len] = 0;
    if (!plain || n == 0) return;
    if (m->n_plain > 0 && m->plain[m->n_plain - 1].end == start) {
        m->plain[m->n_plain - 1].end = m->len;
        return;
    }
    size_t cap = (size_t)m->cap_plain;
    if (grow((void **)&m->plain, &cap, (size_t)m->n_plain + 1, sizeof *m->plain) != 0) {
        m->failed = 1;
        return;
    }
    m->cap_plain = (int)cap;
    m->plain[m->n_plain++] = (qlm_span){start, m->len};
}

void qlm_marked_puts(qlm_marked_text *m, const char *s, int plain) { qlm_marked_put(m, s, strlen(s), plain); }

void qlm_marked_append(qlm_marked_text *m, const qlm_marked_text *src, size_t start, size_t end) {
    for (int i = 0; i < src->n_plain && start < end; i++) {
        const qlm_span *r = &src->plain[i];
        if (r->end <= start) continue;
        if (r->start >= end) break;
        if (r->start > start) qlm_marked_put(m, src->text + start, r->start - start, 0);
        size_t from = r->start > start ? r->start : start, to = r->end < end ? r->end : end;
        qlm_marked_put(m, src->text + from, to - from, 1);
        start = to;
    }
    if (start < end) qlm_marked_put(m, src->text + start, end - start, 0);
}

int qlm_marked_overlaps(const qlm_marked_text *m, size_t start, size_t end) {
    int lo = 0, hi = m->n_plain; /* the first range ending after start */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (m->plain[mid].end <= start) lo = mid + 1;
        else hi = mid;
    }
    return lo < m->n_plain && m->plain[lo].start < end;
}

char *qlm_marked_take(qlm_marked_text *m) {
    qlm_marked_put(m, "", 0, 0);
    char *t = m->failed ? NULL : m->text;
    if (!t) free(m->text);
    free(m->plain);
    memset(m, 0, sizeof *m);
    return t;
}

void qlm_marked_free(qlm_marked_text *m) {
    free(m->text);
    free(m->plain);
    memset(m, 0, sizeof *m);
}
