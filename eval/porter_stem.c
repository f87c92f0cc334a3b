/* Porter stemmer, NLTK_EXTENSIONS flavour (see porter_stem.h). Written from the published algorithm
 * and NLTK's documented deviations; the steps below follow the paper's numbering.
 *
 * Rule lists are tried in order and the first rule whose suffix matches decides: if its condition
 * fails, the word is left as it is and no later rule of that step is tried. Conditions look at the
 * "stem", the word without the matched suffix. No rule makes the word longer than it was when
 * stemming started (step 1b adds at most one letter after removing two or three), so everything
 * happens in the caller's buffer. */
#include "porter_stem.h"

#include <string.h>

typedef struct {
    char *b;
    size_t n;
} word;

static int is_vowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

/* A consonant is a letter other than a, e, i, o, u, and other than a y that follows a consonant.
 * Each y of a run of y's flips the answer of the letter before it. */
static int is_cons(const char *b, size_t i) {
    int flip = 0;
    while (i > 0 && b[i] == 'y') {
        flip = !flip;
        i--;
    }
    return (!is_vowel(b[i])) != flip;
}

/* m in [C](VC)^m[V] for b[0..k): the number of vowel-to-consonant transitions. */
static int measure(const char *b, size_t k) {
    int m = 0, prev_cons = 1;
    for (size_t i = 0; i < k; i++) {
        int cons = is_vowel(b[i]) ? 0 : b[i] == 'y' ? (i == 0 || !prev_cons) : 1;
        if (cons && !prev_cons) m++;
        prev_cons = cons;
    }
    return m;
}

static int contains_vowel(const char *b, size_t k) {
    for (size_t i = 0; i < k; i++)
        if (!is_cons(b, i)) return 1;
    return 0;
}

/* *d: ends with a double consonant. */
static int ends_double(const char *b, size_t k) { return k >= 2 && b[k - 1] == b[k - 2] && is_cons(b, k - 1); }

/* *o: ends consonant-vowel-consonant, the last not w, x or y. NLTK also counts a stem of exactly
 * two letters, vowel then consonant (any consonant: "ow" qualifies). */
static int ends_cvc(const char *b, size_t k) {
    if (k >= 3)
        return is_cons(b, k - 3) && !is_cons(b, k - 2) && is_cons(b, k - 1) && b[k - 1] != 'w' && b[k - 1] != 'x' &&
               b[k - 1] != 'y';
    return k == 2 && !is_cons(b, 0) && is_cons(b, 1);
}

static int ends_with(const word *w, const char *suffix) {
    size_t s = strlen(suffix);
    return s <= w->n && memcmp(w->b + w->n - s, suffix, s) == 0;
}

/* Replaces everything after the first k letters with rep. */
static void set_tail(word *w, size_t k, const char *rep) {
    size_t r = strlen(rep);
    memcpy(w->b + k, rep, r);
    w->n = k + r;
}

typedef int (*condition)(const char *b, size_t k);

typedef struct {
    const char *suffix, *rep;
    condition cond; /* NULL: unconditional */
} rule;

static void apply_rules(word *w, const rule *rules, size_t n_rules) {
    for (size_t i = 0; i < n_rules; i++) {
        if (!ends_with(w, rules[i].suffix)) continue;
        size_t k = w->n - strlen(rules[i].suffix);
        if (!rules[i].cond || rules[i].cond(w->b, k)) set_tail(w, k, rules[i].rep);
        return;
    }
}

static int m_gt0(const char *b, size_t k) { return measure(b, k) > 0; }
static int m_gt1(const char *b, size_t k) { return measure(b, k) > 1; }
/* Step 4's (m>1 and (*s or *t)) ION. */
static int m_gt1_st(const char *b, size_t k) { return measure(b, k) > 1 && (b[k - 1] == 's' || b[k - 1] == 't'); }
/* NLTK's LOGI -> LOG measures the stem with its 'l', so "geologi" stems like "archaeologi". */
static int logi_cond(const char *b, size_t k) { return measure(b, k + 1) > 0; }
/* NLTK's step 1c: Y -> I only after a consonant that is not the whole stem ("happy", not "enjoy", "by"). */
static int y_cond(const char *b, size_t k) { return k > 1 && is_cons(b, k - 1); }

#define N_RULES(r) (sizeof r / sizeof r[0])

static void step1a(word *w) {
    static const rule rules[] = {{"sses", "ss", NULL}, {"ies", "i", NULL}, {"ss", "ss", NULL}, {"s", "", NULL}};
    if (w->n == 4 && ends_with(w, "ies")) { /* NLTK: "dies" -> "die", but "flies" -> "fli" */
        set_tail(w, 1, "ie");
        return;
    }
    apply_rules(w, rules, N_RULES(rules));
}

static void step1b(word *w) {
    if (ends_with(w, "ied")) { /* NLTK: "died" -> "die", "spied" -> "spi" */
        set_tail(w, w->n - 3, w->n == 4 ? "ie" : "i");
        return;
    }
    if (ends_with(w, "eed")) {
        if (measure(w->b, w->n - 3) > 0) set_tail(w, w->n - 3, "ee");
        return;
    }
    if (ends_with(w, "ed") && contains_vowel(w->b, w->n - 2)) w->n -= 2;
    else if (ends_with(w, "ing") && contains_vowel(w->b, w->n - 3)) w->n -= 3;
    else return;
    /* The stem is not empty: it holds a vowel. */
    static const rule restore[] = {{"at", "ate", NULL}, {"bl", "ble", NULL}, {"iz", "ize", NULL}};
    for (size_t i = 0; i < N_RULES(restore); i++)
        if (ends_with(w, restore[i].suffix)) {
            set_tail(w, w->n - strlen(restore[i].suffix), restore[i].rep);
            return;
        }
    if (ends_double(w->b, w->n)) {
        char last = w->b[w->n - 1];
        if (last != 'l' && last != 's' && last != 'z') w->n--;
    } else if (measure(w->b, w->n) == 1 && ends_cvc(w->b, w->n)) {
        set_tail(w, w->n, "e");
    }
}

static void step1c(word *w) {
    static const rule rules[] = {{"y", "i", y_cond}};
    apply_rules(w, rules, N_RULES(rules));
}

static void step2(word *w) {
    static const rule rules[] = {
        {"ational", "ate", m_gt0}, {"tional", "tion", m_gt0}, {"enci", "ence", m_gt0},   {"anci", "ance", m_gt0},
        {"izer", "ize", m_gt0},    {"bli", "ble", m_gt0},     {"alli", "al", m_gt0},     {"entli", "ent", m_gt0},
        {"eli", "e", m_gt0},       {"ousli", "ous", m_gt0},   {"ization", "ize", m_gt0}, {"ation", "ate", m_gt0},
        {"ator", "ate", m_gt0},    {"alism", "al", m_gt0},    {"iveness", "ive", m_gt0}, {"fulness", "ful", m_gt0},
        {"ousness", "ous", m_gt0}, {"aliti", "al", m_gt0},    {"iviti", "ive", m_gt0},   {"biliti", "ble", m_gt0},
        {"fulli", "ful", m_gt0},   {"logi", "log", logi_cond},
    };
    /* NLTK applies ALLI -> AL before the list and then runs the list on the result, so that
     * "...ationalli" goes on to "...ate". */
    if (ends_with(w, "alli") && measure(w->b, w->n - 4) > 0) set_tail(w, w->n - 4, "al");
    apply_rules(w, rules, N_RULES(rules));
}

static void step3(word *w) {
    static const rule rules[] = {{"icate", "ic", m_gt0}, {"ative", "", m_gt0}, {"alize", "al", m_gt0},
                                 {"iciti", "ic", m_gt0}, {"ical", "ic", m_gt0}, {"ful", "", m_gt0},
                                 {"ness", "", m_gt0}};
    apply_rules(w, rules, N_RULES(rules));
}

static void step4(word *w) {
    static const rule rules[] = {
        {"al", "", m_gt1},    {"ance", "", m_gt1}, {"ence", "", m_gt1},  {"er", "", m_gt1},  {"ic", "", m_gt1},
        {"able", "", m_gt1},  {"ible", "", m_gt1}, {"ant", "", m_gt1},   {"ement", "", m_gt1}, {"ment", "", m_gt1},
        {"ent", "", m_gt1},   {"ion", "", m_gt1_st}, {"ou", "", m_gt1},  {"ism", "", m_gt1}, {"ate", "", m_gt1},
        {"iti", "", m_gt1},   {"ous", "", m_gt1},  {"ive", "", m_gt1},   {"ize", "", m_gt1},
    };
    apply_rules(w, rules, N_RULES(rules));
}

/* Both E rules are tried (unlike a rule list): (m>1) E -> , then (m=1 and not *o) E -> . */
static void step5a(word *w) {
    if (!ends_with(w, "e")) return;
    int m = measure(w->b, w->n - 1);
    if (m > 1 || (m == 1 && !ends_cvc(w->b, w->n - 1))) w->n--;
}

static void step5b(word *w) {
    if (ends_with(w, "ll") && measure(w->b, w->n - 1) > 1) w->n--;
}

size_t qlm_porter_stem(char *s, size_t len) {
    /* NLTK's table of irregular forms, looked up before anything else. */
    static const char *const irregular[][2] = {
        {"sky", "sky"},         {"skies", "sky"},       {"dying", "die"},       {"lying", "lie"},
        {"tying", "tie"},       {"news", "news"},       {"innings", "inning"},  {"inning", "inning"},
        {"outings", "outing"},  {"outing", "outing"},   {"cannings", "canning"}, {"canning", "canning"},
        {"howe", "howe"},       {"proceed", "proceed"}, {"exceed", "exceed"},   {"succeed", "succeed"},
    };
    for (size_t i = 0; i < len; i++)
        if (s[i] >= 'A' && s[i] <= 'Z') s[i] = (char)(s[i] - 'A' + 'a');
    word w = {s, len};
    for (size_t i = 0; i < N_RULES(irregular); i++)
        if (strlen(irregular[i][0]) == len && memcmp(s, irregular[i][0], len) == 0) {
            set_tail(&w, 0, irregular[i][1]);
            s[w.n] = 0;
            return w.n;
        }
    if (len > 2) { /* NLTK leaves words of one or two letters alone */
        step1a(&w);
        step1b(&w);
        step1c(&w);
        step2(&w);
        step3(&w);
        step4(&w);
        step5a(&w);
        step5b(&w);
    }
    s[w.n] = 0;
    return w.n;
}
