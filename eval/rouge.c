/* ROUGE scores as rouge_score computes them (see rouge.h). Tokens are interned to integer ids
 * shared by the prediction and its references; n-gram overlaps are counted on those ids and the
 * LCS tables are built over them. The arithmetic of P, R and F is rouge_score's, operation for
 * operation, so the results are the same doubles. */
#include "rouge.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "porter_stem.h"

const char *qlm_rouge_metric_key(int metric) {
    static const char *const keys[] = {"rouge1", "rouge2", "rougeL", "rougeLsum"};
    return metric >= 0 && metric < QLM_ROUGE_N_METRICS ? keys[metric] : "?";
}

const char *qlm_rouge_metric_name(int metric) {
    static const char *const names[] = {"ROUGE-1", "ROUGE-2", "ROUGE-L", "ROUGE-Lsum"};
    return metric >= 0 && metric < QLM_ROUGE_N_METRICS ? names[metric] : "?";
}

void qlm_rouge_tokens_free(qlm_rouge_tokens *t) {
    free(t->tok);
    free(t->sent_start);
    free(t->storage);
    memset(t, 0, sizeof *t);
}

static char ascii_alnum_lower(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return (char)c;
    if (c >= 'A' && c <= 'Z') return (char)(c - 'A' + 'a');
    return 0;
}

int qlm_rouge_tokenize(const char *text, qlm_rouge_tokens *out) {
    memset(out, 0, sizeof *out);
    size_t len = strlen(text);
    if (len > INT_MAX / 2) return qlm_errorf("a text of %zu bytes is too long to score", len);
    /* A token is never longer than the bytes it came from and is followed by a separator byte or
     * the end of the text, so len + 1 bytes hold the tokens with their NULs. Tokens need a byte
     * between them, so there are at most len / 2 + 1 of them (and no more sentences than tokens). */
    size_t max_tok = len / 2 + 1;
    out->storage = malloc(len + 1);
    out->tok = malloc(max_tok * sizeof *out->tok);
    out->sent_start = malloc((max_tok + 1) * sizeof *out->sent_start);
    if (!out->storage || !out->tok || !out->sent_start) {
        qlm_rouge_tokens_free(out);
        return qlm_errorf("out of memory tokenizing a text of %zu bytes", len);
    }
    char *dst = out->storage, *cur = NULL; /* cur: start of the token being read */
    int line_has_tokens = 0;
    for (const unsigned char *p = (const unsigned char *)text;;) {
        char a = ascii_alnum_lower(*p);
        size_t bytes = 1;
        int splits = !a;
        /* The two characters whose Python lowercase holds an ASCII letter: U+0130 becomes "i"
         * followed by U+0307 (not alphanumeric, so it ends the token), U+212A becomes "k". */
        if (!a && p[0] == 0xC4 && p[1] == 0xB0) {
            a = 'i';
            bytes = 2;
        } else if (!a && p[0] == 0xE2 && p[1] == 0x84 && p[2] == 0xAA) {
            a = 'k';
            bytes = 3;
            splits = 0;
        }
        if (a) {
            if (!cur) cur = dst;
            *dst++ = a;
        }
        if (splits && cur) {
            size_t n = (size_t)(dst - cur);
            *dst = 0;
            if (n > 3) n = qlm_porter_stem(cur, n); /* rouge_score stems only tokens of 4+ characters */
            if (!line_has_tokens) out->sent_start[out->n_sents++] = out->n;
            line_has_tokens = 1;
            out->tok[out->n++] = cur;
            dst = cur + n + 1;
            cur = NULL;
        }
        if (!*p) break;
        if (*p == '\n') line_has_tokens = 0;
        p += bytes;
    }
    out->sent_start[out->n_sents] = out->n;
    return 0;
}

/* One side of a comparison: token ids with the sentence boundaries, id counts, sorted bigrams. */
typedef struct {
    const int *id;
    int n;
    const int *sent_start;
    int n_sents;
    int *count;       /* n_ids entries */
    uint64_t *bigram; /* n - 1 entries (when n >= 2), sorted */
} side;

typedef struct {
    const char *s;
    int *slot;
} intern_entry;

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const intern_entry *)a)->s, ((const intern_entry *)b)->s);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Writes the id of every token of toks[0..n_texts) into ids (laid out text after text): equal
 * strings get equal ids, numbered from 0. Returns the number of distinct tokens, or -1. */
static int intern(const qlm_rouge_tokens *toks, int n_texts, int *ids) {
    size_t total = 0;
    for (int t = 0; t < n_texts; t++) total += (size_t)toks[t].n;
    if (total == 0) return 0;
    intern_entry *e = malloc(total * sizeof *e);
    if (!e) return qlm_errorf("out of memory interning %zu tokens", total);
    size_t k = 0;
    for (int t = 0; t < n_texts; t++)
        for (int i = 0; i < toks[t].n; i++, k++) e[k] = (intern_entry){toks[t].tok[i], ids + k};
    qsort(e, total, sizeof *e, cmp_entry);
    int n_ids = 0;
    for (k = 0; k < total; k++) {
        if (k > 0 && strcmp(e[k].s, e[k - 1].s) != 0) n_ids++;
        *e[k].slot = n_ids;
    }
    free(e);
    return n_ids + 1;
}

/* Fills s->count (zeroed, n_ids entries) and s->bigram (room for n - 1 keys). */
static void side_index(side *s, int n_ids) {
    memset(s->count, 0, (size_t)n_ids * sizeof *s->count);
    for (int i = 0; i < s->n; i++) s->count[s->id[i]]++;
    for (int i = 0; i + 1 < s->n; i++) s->bigram[i] = (uint64_t)s->id[i] * (uint64_t)n_ids + (uint64_t)s->id[i + 1];
    if (s->n >= 2) qsort(s->bigram, (size_t)s->n - 1, sizeof *s->bigram, cmp_u64);
}

/* rouge_score: precision = hits / max(#prediction, 1), recall = hits / max(#reference, 1). */
static qlm_rouge_prf prf(long hits, long n_pred, long n_ref) {
    qlm_rouge_prf s;
    s.precision = (double)hits / (double)(n_pred > 0 ? n_pred : 1);
    s.recall = (double)hits / (double)(n_ref > 0 ? n_ref : 1);
    s.fmeasure = s.precision + s.recall > 0 ? 2 * s.precision * s.recall / (s.precision + s.recall) : 0.0;
    return s;
}

static long unigram_overlap(const side *p, const side *r, int n_ids) {
    long hits = 0;
    for (int i = 0; i < n_ids; i++) hits += p->count[i] < r->count[i] ? p->count[i] : r->count[i];
    return hits;
}

static long bigram_overlap(const side *p, const side *r) {
    long hits = 0;
    int np = p->n > 1 ? p->n - 1 : 0, nr = r->n > 1 ? r->n - 1 : 0;
    for (int i = 0, j = 0; i < np && j < nr;) {
        if (p->bigram[i] < r->bigram[j]) i++;
        else if (p->bigram[i] > r->bigram[j]) j++;
        else {
            uint64_t key = p->bigram[i];
            int ci = 0, cj = 0;
            for (; i < np && p->bigram[i] == key; i++) ci++;
            for (; j < nr && r->bigram[j] == key; j++) cj++;
            hits += ci < cj ? ci : cj;
        }
    }
    return hits;
}

/* LCS length of a and b with one row of b->n + 1 ints. */
static int lcs_length(const int *a, int na, const int *b, int nb, int *row) {
    memset(row, 0, ((size_t)nb + 1) * sizeof *row);
    for (int i = 1; i <= na; i++) {
        int diag = 0; /* row[j - 1] of the previous row */
        for (int j = 1; j <= nb; j++) {
            int up = row[j];
            row[j] = a[i - 1] == b[j - 1] ? diag + 1 : (up > row[j - 1] ? up : row[j - 1]);
            diag = up;
        }
    }
    return row[nb];
}

/* Marks in mark[0..nr) the tokens of ref that are in the LCS of ref and can which rouge_score's
 * _backtrack_norec reads out of the table (which of several LCS it is matters for the union). */
static void lcs_mark(const int *ref, int nr, const int *can, int nc, int *t, char *mark) {
    size_t w = (size_t)nc + 1;
    for (int j = 0; j <= nc; j++) t[j] = 0;
    for (int i = 1; i <= nr; i++) {
        int *row = t + (size_t)i * w, *up = row - w;
        row[0] = 0;
        for (int j = 1; j <= nc; j++)
            row[j] = ref[i - 1] == can[j - 1] ? up[j - 1] + 1 : (up[j] > row[j - 1] ? up[j] : row[j - 1]);
    }
    for (int i = nr, j = nc; i > 0 && j > 0;) {
        if (ref[i - 1] == can[j - 1]) {
            mark[i - 1] = 1;
            i--;
            j--;
        } else if (t[(size_t)i * w + (size_t)j - 1] > t[(size_t)(i - 1) * w + (size_t)j]) {
            j--;
        } else {
            i--;
        }
    }
}

/* Summary-level LCS hits: for each reference sentence, the union of its LCS with every prediction
 * sentence, taken in reference order; a token is a hit while both texts still have unused copies of
 * it (cnt_p, cnt_r: n_ids scratch counters). */
static long lsum_hits(const side *p, const side *r, int n_ids, int *cnt_p, int *cnt_r, int *table, char *mark) {
    memcpy(cnt_p, p->count, (size_t)n_ids * sizeof *cnt_p);
    memcpy(cnt_r, r->count, (size_t)n_ids * sizeof *cnt_r);
    long hits = 0;
    for (int s = 0; s < r->n_sents; s++) {
        const int *ref = r->id + r->sent_start[s];
        int nr = r->sent_start[s + 1] - r->sent_start[s];
        memset(mark, 0, (size_t)nr);
        for (int c = 0; c < p->n_sents; c++)
            lcs_mark(ref, nr, p->id + p->sent_start[c], p->sent_start[c + 1] - p->sent_start[c], table, mark);
        for (int i = 0; i < nr; i++) {
            int t = ref[i];
            if (mark[i] && cnt_p[t] > 0 && cnt_r[t] > 0) {
                hits++;
                cnt_p[t]--;
                cnt_r[t]--;
            }
        }
    }
    return hits;
}

static int longest_sentence(const side *s) {
    int m = 0;
    for (int i = 0; i < s->n_sents; i++)
        if (s->sent_start[i + 1] - s->sent_start[i] > m) m = s->sent_start[i + 1] - s->sent_start[i];
    return m;
}

/* calloc that does not return NULL for zero elements. */
static void *alloc_zero(size_t n, size_t size) { return calloc(n ? n : 1, size); }

int qlm_rouge_score(const char *pred, const char *const *refs, int n_refs, qlm_rouge_scores *out) {
    if (!pred || !refs || n_refs < 1) return qlm_errorf("rouge: a prediction and at least one reference are needed");
    for (int k = 0; k < n_refs; k++)
        if (!refs[k]) return qlm_errorf("rouge: reference %d is NULL", k);
    int rc = -1, n_texts = n_refs + 1;
    qlm_rouge_tokens *toks = calloc((size_t)n_texts, sizeof *toks);
    side *sides = calloc((size_t)n_texts, sizeof *sides);
    int *ids = NULL, *counts = NULL, *row = NULL, *table = NULL;
    uint64_t *bigrams = NULL;
    char *mark = NULL;
    if (!toks || !sides) {
        qlm_errorf("out of memory");
        goto out;
    }
    for (int t = 0; t < n_texts; t++)
        if (qlm_rouge_tokenize(t == 0 ? pred : refs[t - 1], &toks[t]) != 0) goto out;

    size_t total = 0;
    int max_ref_sent = 0, max_pred_sent;
    for (int t = 0; t < n_texts; t++) total += (size_t)toks[t].n;
    ids = alloc_zero(total, sizeof *ids);
    bigrams = alloc_zero(total, sizeof *bigrams);
    if (!ids || !bigrams) {
        qlm_errorf("out of memory scoring %zu tokens", total);
        goto out;
    }
    int n_ids = intern(toks, n_texts, ids);
    if (n_ids < 0) goto out;
    /* Counters: one row per text, then two scratch rows for ROUGE-Lsum. */
    counts = alloc_zero(((size_t)n_texts + 2) * (size_t)n_ids, sizeof *counts);
    if (!counts) {
        qlm_errorf("out of memory scoring %d distinct tokens", n_ids);
        goto out;
    }
    size_t off = 0;
    for (int t = 0; t < n_texts; t++) {
        side *s = &sides[t];
        s->id = ids + off;
        s->n = toks[t].n;
        s->sent_start = toks[t].sent_start;
        s->n_sents = toks[t].n_sents;
        s->count = counts + (size_t)t * (size_t)n_ids;
        s->bigram = bigrams + off;
        side_index(s, n_ids);
        off += (size_t)s->n;
        int longest = longest_sentence(s);
        if (t > 0 && longest > max_ref_sent) max_ref_sent = longest;
    }
    max_pred_sent = longest_sentence(&sides[0]);
    size_t table_cols = (size_t)max_pred_sent + 1;
    if ((size_t)max_ref_sent + 1 > SIZE_MAX / sizeof *table / table_cols) {
        qlm_errorf("rouge: sentences of %d and %d tokens are too long for ROUGE-Lsum", max_pred_sent, max_ref_sent);
        goto out;
    }
    row = alloc_zero((size_t)sides[0].n + 1, sizeof *row);
    table = alloc_zero(((size_t)max_ref_sent + 1) * table_cols, sizeof *table);
    mark = alloc_zero((size_t)max_ref_sent, 1);
    if (!row || !table || !mark) {
        qlm_errorf("out of memory for LCS tables of %d x %d tokens", max_ref_sent, max_pred_sent);
        goto out;
    }
    int *scratch = counts + (size_t)n_texts * (size_t)n_ids;
    const side *p = &sides[0];
    for (int k = 0; k < n_refs; k++) {
        const side *r = &sides[k + 1];
        qlm_rouge_scores s;
        s.m[QLM_ROUGE_1] = prf(unigram_overlap(p, r, n_ids), p->n, r->n);
        s.m[QLM_ROUGE_2] = prf(bigram_overlap(p, r), p->n - 1, r->n - 1);
        s.m[QLM_ROUGE_L] = prf(lcs_length(r->id, r->n, p->id, p->n, row), p->n, r->n);
        s.m[QLM_ROUGE_LSUM] = prf(lsum_hits(p, r, n_ids, scratch, scratch + n_ids, table, mark), p->n, r->n);
        /* score_multi: per metric, the first reference with the highest F. */
        for (int m = 0; m < QLM_ROUGE_N_METRICS; m++)
            if (k == 0 || s.m[m].fmeasure > out->m[m].fmeasure) out->m[m] = s.m[m];
    }
    rc = 0;
out:
    for (int t = 0; toks && t < n_texts; t++) qlm_rouge_tokens_free(&toks[t]);
    free(toks);
    free(sides);
    free(ids);
    free(bigrams);
    free(counts);
    free(row);
    free(table);
    free(mark);
    return rc;
}

int qlm_rouge_mean(const qlm_rouge_scores *scores, size_t n, qlm_rouge_scores *mean) {
    if (n == 0) return qlm_errorf("rouge: no pairs to average");
    memset(mean, 0, sizeof *mean);
    for (size_t i = 0; i < n; i++)
        for (int m = 0; m < QLM_ROUGE_N_METRICS; m++) {
            mean->m[m].precision += scores[i].m[m].precision;
            mean->m[m].recall += scores[i].m[m].recall;
            mean->m[m].fmeasure += scores[i].m[m].fmeasure;
        }
    for (int m = 0; m < QLM_ROUGE_N_METRICS; m++) {
        mean->m[m].precision /= (double)n;
        mean->m[m].recall /= (double)n;
        mean->m[m].fmeasure /= (double)n;
    }
    return 0;
}

void qlm_rouge_print_table(FILE *f, const qlm_rouge_scores *mean) {
    fprintf(f, "%-11s %9s %9s %9s\n", "metric", "precision", "recall", "F1");
    for (int m = 0; m < QLM_ROUGE_N_METRICS; m++)
        fprintf(f, "%-11s %9.4f %9.4f %9.4f\n", qlm_rouge_metric_name(m), mean->m[m].precision, mean->m[m].recall,
                mean->m[m].fmeasure);
}
