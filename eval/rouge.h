/* ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum, equal to Google's rouge_score package
 * (RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)):
 *
 * - tokens: the text is lowercased (as Python's str.lower(); the only non-ASCII characters that
 *   lowercase to ASCII letters are U+0130 -> "i" and U+212A KELVIN SIGN -> "k"), every run of
 *   characters other than a-z and 0-9 is a separator, and tokens longer than 3 characters are
 *   Porter-stemmed (porter_stem.h);
 * - ROUGE-N: clipped n-gram overlap; precision = overlap / prediction n-grams, recall = overlap /
 *   reference n-grams (0 when there are none);
 * - ROUGE-L: longest common subsequence of the two token sequences;
 * - ROUGE-Lsum: summary-level LCS (Lin 2004, section 3.2): the texts are split into sentences at
 *   '\n', each reference sentence takes the union of its LCS with every prediction sentence (the
 *   particular LCS rouge_score's back-tracking picks), and hits are clipped by token counts as in
 *   ROUGE-1.5.5;
 * - F = 2PR / (P + R), 0 when P + R = 0. Everything is 0 when either side has no tokens.
 *
 * Several references: as rouge_score's score_multi, each metric takes the scores of the reference
 * with the highest F (the first one on ties), so different metrics may use different references. */
#ifndef QLM_ROUGE_H
#define QLM_ROUGE_H

#include <stddef.h>
#include <stdio.h>

enum { QLM_ROUGE_1, QLM_ROUGE_2, QLM_ROUGE_L, QLM_ROUGE_LSUM, QLM_ROUGE_N_METRICS };

typedef struct {
    double precision, recall, fmeasure;
} qlm_rouge_prf;

typedef struct {
    qlm_rouge_prf m[QLM_ROUGE_N_METRICS]; /* indexed by QLM_ROUGE_1 ... QLM_ROUGE_LSUM */
} qlm_rouge_scores;

/* rouge_score's key of a metric: "rouge1", "rouge2", "rougeL", "rougeLsum". */
const char *qlm_rouge_metric_key(int metric);
/* Its display name: "ROUGE-1", "ROUGE-2", "ROUGE-L", "ROUGE-Lsum". */
const char *qlm_rouge_metric_name(int metric);

/* The tokens of a text, in order; sentences are its '\n'-separated lines that hold tokens. */
typedef struct {
    int n;           /* number of tokens */
    char **tok;      /* tok[i]: token i, NUL-terminated, [a-z0-9]+ */
    int n_sents;     /* lines that hold at least one token */
    int *sent_start; /* n_sents + 1 entries: sentence s is tokens [sent_start[s], sent_start[s + 1]) */
    char *storage;   /* owns the token bytes */
} qlm_rouge_tokens;

/* Tokenizes text (UTF-8) as rouge_score's default tokenizer with use_stemmer=True. Bytes that are
 * not valid UTF-8 act as separators. Returns 0, or -1 (out of memory or a text over INT_MAX/2
 * bytes); free with qlm_rouge_tokens_free either way. */
int qlm_rouge_tokenize(const char *text, qlm_rouge_tokens *out);
void qlm_rouge_tokens_free(qlm_rouge_tokens *t);

/* Scores pred against n_refs >= 1 references. Returns 0, or -1 with qlm_last_error() set. */
int qlm_rouge_score(const char *pred, const char *const *refs, int n_refs, qlm_rouge_scores *out);

/* The mean of each precision, recall and F over n >= 1 scored pairs. rouge_score's
 * BootstrapAggregator reports the median of bootstrap resamples of this mean ("mid"), which is
 * random and equal to this mean only in expectation; qlm reports the plain mean. */
int qlm_rouge_mean(const qlm_rouge_scores *scores, size_t n, qlm_rouge_scores *mean);

/* Prints the metric / precision / recall / F1 table of mean scores. */
void qlm_rouge_print_table(FILE *f, const qlm_rouge_scores *mean);

#endif
