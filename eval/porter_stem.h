/* Porter stemmer with the behaviour of NLTK's PorterStemmer in its default NLTK_EXTENSIONS mode,
 * which is the stemmer rouge_score uses for use_stemmer=True (Porter, "An algorithm for suffix
 * stripping", 1980, plus Martin Porter's later changes and NLTK's additions: a table of irregular
 * forms, "ies"/"ied" on 4-letter words, y -> i only after a consonant, "alli" first, "fulli",
 * "logi", words of 1-2 letters left alone). */
#ifndef QLM_PORTER_STEM_H
#define QLM_PORTER_STEM_H

#include <stddef.h>

/* Stems word[0..len) in place and returns the stem's length (never more than len); the stem is
 * NUL-terminated, so word must have room for len + 1 bytes. ASCII capitals are lowercased first, as
 * NLTK does; every byte that is not a, e, i, o, u or y counts as a consonant (digits included). */
size_t qlm_porter_stem(char *word, size_t len);

#endif
