/* ROUGE and the Porter stemmer against Python's rouge_score 0.1.2 / nltk (tests/fixtures/rouge from
 * tools/make_rouge_fixtures.py), edge cases, and `qlm rouge` end to end ($QLM_BIN, default build/qlm). */
#include <cjson/cJSON.h>
#include <math.h>
#include <sys/wait.h>

#include "core/error.h"
#include "eval/porter_stem.h"
#include "eval/rouge.h"
#include "test_util.h"

#define FIX "tests/fixtures/rouge/"
#define TOL 1e-6

/* Splits a malloc'd JSONL text into parsed lines (blank lines skipped); returns the count. */
static int load_jsonl(const char *path, cJSON ***out) {
    char *text = test_read_file(path, NULL);
    assert_non_null(text);
    int n = 0, cap = 0;
    cJSON **rec = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (n == cap) rec = realloc(rec, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *rec);
        rec[n] = cJSON_Parse(line);
        assert_non_null(rec[n]);
        n++;
    }
    free(text);
    *out = rec;
    return n;
}

static void free_jsonl(cJSON **rec, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(rec[i]);
    free(rec);
}

static const char *str_field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    assert_true(cJSON_IsString(v));
    return v->valuestring;
}

/* max |got - want| over P, R, F, where want is [p, r, f] (an array) or {precision, recall, fmeasure}. */
static double prf_diff(const qlm_rouge_prf *got, const cJSON *want) {
    double w[3];
    if (cJSON_IsArray(want)) {
        assert_int_equal(cJSON_GetArraySize(want), 3);
        for (int i = 0; i < 3; i++) w[i] = cJSON_GetArrayItem(want, i)->valuedouble;
    } else {
        w[0] = cJSON_GetObjectItemCaseSensitive(want, "precision")->valuedouble;
        w[1] = cJSON_GetObjectItemCaseSensitive(want, "recall")->valuedouble;
        w[2] = cJSON_GetObjectItemCaseSensitive(want, "fmeasure")->valuedouble;
    }
    return fmax(fabs(got->precision - w[0]), fmax(fabs(got->recall - w[1]), fabs(got->fmeasure - w[2])));
}

static double scores_diff(const qlm_rouge_scores *got, const cJSON *want) {
    double d = 0;
    for (int m = 0; m < QLM_ROUGE_N_METRICS; m++) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(want, qlm_rouge_metric_key(m));
        assert_non_null(w);
        d = fmax(d, prf_diff(&got->m[m], w));
    }
    return d;
}

static void test_stemmer_word_list(void **state) {
    (void)state;
    char *text = test_read_file(FIX "porter_stems.tsv", NULL);
    assert_non_null(text);
    int n = 0, bad = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *tab = strchr(line, '\t');
        assert_non_null(tab);
        *tab = 0;
        char word[256];
        size_t len = strlen(line);
        assert_true(len < sizeof word);
        memcpy(word, line, len + 1);
        size_t got = qlm_porter_stem(word, len);
        assert_int_equal(got, strlen(word));
        if (strcmp(word, tab + 1) != 0 && bad++ < 10)
            print_message("stem(%s) = %s, nltk says %s\n", line, word, tab + 1);
        n++;
    }
    free(text);
    print_message("%d words, %d stems differ from nltk's\n", n, bad);
    assert_true(n > 20000);
    assert_int_equal(bad, 0);
}

static void test_stemmer_examples(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"caresses", "caress"}, {"ponies", "poni"},     {"dies", "die"},       {"flies", "fli"},
        {"died", "die"},        {"spied", "spi"},       {"agreed", "agre"},    {"feed", "feed"},
        {"hopping", "hop"},     {"filing", "file"},     {"happy", "happi"},    {"enjoy", "enjoy"},
        {"relational", "relat"}, {"generalizations", "gener"}, {"dying", "die"}, {"skies", "sky"},
        {"Running", "run"},     {"is", "is"},           {"yyyy", "yyyi"},      {"2nd", "2nd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char w[32];
        strcpy(w, cases[i][0]);
        qlm_porter_stem(w, strlen(w));
        assert_string_equal(w, cases[i][1]);
    }
}

static void test_tokenize(void **state) {
    (void)state;
    /* Python: tokenize.tokenize(text, PorterStemmer()) from rouge_score. */
    const char *text = "\xC4\xB0STANBUL \xE2\x84\xAA"
                       "elvins: Don't stop-2nd caf\xC3\xA9 GENERALIZATIONS\n\n  running\r\nx";
    const char *want[] = {"i", "stanbul", "kelvin", "don", "t", "stop", "2nd", "caf", "gener", "run", "x"};
    qlm_rouge_tokens t;
    assert_int_equal(qlm_rouge_tokenize(text, &t), 0);
    assert_int_equal(t.n, 11);
    for (int i = 0; i < t.n; i++) assert_string_equal(t.tok[i], want[i]);
    assert_int_equal(t.n_sents, 3); /* the blank line holds no tokens */
    assert_int_equal(t.sent_start[0], 0);
    assert_int_equal(t.sent_start[1], 9);
    assert_int_equal(t.sent_start[2], 10);
    assert_int_equal(t.sent_start[3], 11);
    qlm_rouge_tokens_free(&t);
    assert_int_equal(qlm_rouge_tokenize(" \n--\xFF\xC4", &t), 0); /* invalid UTF-8 bytes separate */
    assert_int_equal(t.n, 0);
    assert_int_equal(t.n_sents, 0);
    qlm_rouge_tokens_free(&t);
}

static void expect_scores(const char *pred, const char *const *refs, int n, const double want[4][3]) {
    qlm_rouge_scores s;
    assert_int_equal(qlm_rouge_score(pred, refs, n, &s), 0);
    for (int m = 0; m < QLM_ROUGE_N_METRICS; m++) {
        assert_true(fabs(s.m[m].precision - want[m][0]) <= 1e-15);
        assert_true(fabs(s.m[m].recall - want[m][1]) <= 1e-15);
        assert_true(fabs(s.m[m].fmeasure - want[m][2]) <= 1e-15);
    }
}

static void test_edge_cases(void **state) {
    (void)state;
    static const double zero[4][3] = {{0}}, one[4][3] = {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}};
    const char *text = "The cat sat on the mat.";
    const char *empty[] = {""}, *punct[] = {"?! -- ..."}, *ref[] = {text};
    expect_scores("", ref, 1, zero); /* empty prediction */
    expect_scores("...\n\n", ref, 1, zero);
    expect_scores(text, empty, 1, zero); /* empty reference */
    expect_scores(text, punct, 1, zero);
    expect_scores("", empty, 1, zero);
    expect_scores("the CAT sat, on the mats", ref, 1, one);
    /* A one-token text has no bigrams: ROUGE-2 is 0 while the rest match. */
    const char *word[] = {"cat"};
    static const double single[4][3] = {{1, 1, 1}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}};
    expect_scores("cats", word, 1, single);

    /* rouge_score's README example and the ROUGE paper's summary-level LCS example (values from Python). */
    const char *fox[] = {"The quick brown fox jumps over the lazy dog"};
    static const double fox_want[4][3] = {{0.75, 0.6666666666666666, 0.7058823529411765},
                                          {0.2857142857142857, 0.25, 0.26666666666666666},
                                          {0.625, 0.5555555555555556, 0.5882352941176471},
                                          {0.625, 0.5555555555555556, 0.5882352941176471}};
    expect_scores("The quick brown dog jumps on the log.", fox, 1, fox_want);
    const char *abcde[] = {"a b c d e"};
    static const double lsum_want[4][3] = {{1, 1, 1}, {0.75, 0.75, 0.75}, {0.6, 0.6, 0.6}, {1, 1, 1}};
    expect_scores("c d e\na b", abcde, 1, lsum_want);
    /* Repeated tokens: union-LCS hits are clipped by the token counts. */
    const char *xy[] = {"x y x y\nx"};
    static const double dup_want[4][3] = {{0.8333333333333334, 1.0, 0.9090909090909091},
                                          {0.6, 0.75, 0.6666666666666665},
                                          {0.6666666666666666, 0.8, 0.7272727272727272},
                                          {0.8333333333333334, 1.0, 0.9090909090909091}};
    expect_scores("x x\ny x y y", xy, 1, dup_want);
    /* Several references: ROUGE-1 takes the shuffled one, the others the second. */
    const char *multi[] = {"mat the on sat cat the", "the cat sat on a rug"};
    static const double multi_want[4][3] = {{1, 1, 1},
                                            {0.6, 0.6, 0.6},
                                            {0.6666666666666666, 0.6666666666666666, 0.6666666666666666},
                                            {0.6666666666666666, 0.6666666666666666, 0.6666666666666666}};
    expect_scores("the cat sat on the mat", multi, 2, multi_want);

    qlm_rouge_scores s;
    assert_int_equal(qlm_rouge_score(text, ref, 0, &s), -1);
    const char *null_ref[] = {text, NULL};
    assert_int_equal(qlm_rouge_score(text, null_ref, 2, &s), -1);
    assert_non_null(strstr(qlm_last_error(), "NULL"));
    assert_int_equal(qlm_rouge_mean(&s, 0, &s), -1);
}

/* Every fixture pair against rouge_score, and the mean. */
static void test_fixture_pairs(void **state) {
    (void)state;
    cJSON **preds, **refs;
    int np = load_jsonl(FIX "preds.jsonl", &preds), nr = load_jsonl(FIX "refs.jsonl", &refs);
    char *ej = test_read_file(FIX "expected.json", NULL);
    assert_non_null(ej);
    cJSON *exp = cJSON_Parse(ej);
    assert_non_null(exp);
    const cJSON *pairs = cJSON_GetObjectItemCaseSensitive(exp, "pairs");
    int n = cJSON_GetArraySize(pairs);
    assert_true(n >= 300);
    assert_int_equal(np, n);
    assert_int_equal(nr, n);
    qlm_rouge_scores *got = calloc((size_t)n, sizeof *got);
    double max_diff = 0;
    int multi = 0;
    for (int i = 0; i < n; i++) {
        const cJSON *want = cJSON_GetArrayItem(pairs, i);
        const cJSON *fields = cJSON_GetObjectItemCaseSensitive(want, "ref_fields");
        assert_string_equal(str_field(preds[i], "fname"), str_field(want, "fname"));
        assert_string_equal(str_field(refs[i], "fname"), str_field(want, "fname"));
        const char *r[3];
        int k = cJSON_GetArraySize(fields);
        assert_true(k >= 1 && k <= 3);
        for (int j = 0; j < k; j++) r[j] = str_field(refs[i], cJSON_GetArrayItem(fields, j)->valuestring);
        multi += k > 1;
        assert_int_equal(qlm_rouge_score(str_field(preds[i], "summary"), r, k, &got[i]), 0);
        double d = scores_diff(&got[i], want);
        if (d > TOL)
            print_message("pair %d (%s, %s): differs by %g\n", i, str_field(want, "fname"), str_field(want, "kind"), d);
        max_diff = fmax(max_diff, d);
    }
    qlm_rouge_scores mean;
    assert_int_equal(qlm_rouge_mean(got, (size_t)n, &mean), 0);
    double mean_diff = scores_diff(&mean, cJSON_GetObjectItemCaseSensitive(exp, "mean"));
    print_message("%d pairs (%d multi-reference): max |diff| %g per pair, %g in the means\n", n, multi, max_diff,
                  mean_diff);
    assert_true(multi > 0 && multi < n);
    assert_true(max_diff <= TOL);
    assert_true(mean_diff <= TOL);
    free(got);
    cJSON_Delete(exp);
    free(ej);
    free_jsonl(preds, np);
    free_jsonl(refs, nr);
}


/* Checks `qlm rouge ... --json` output against a {rouge1: {precision, ...}, ...} object. */
static double cli_diff(const char *out, const cJSON *want, int pairs, const char *paired_by) {
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(j, "pairs")->valueint, pairs);
    const cJSON *by = cJSON_GetObjectItemCaseSensitive(j, "paired_by");
    if (paired_by) assert_string_equal(by->valuestring, paired_by);
    else assert_true(cJSON_IsNull(by));
    double d = 0;
    for (int m = 0; m < QLM_ROUGE_N_METRICS; m++) {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(j, qlm_rouge_metric_key(m));
        assert_non_null(g);
        qlm_rouge_prf prf = {cJSON_GetObjectItemCaseSensitive(g, "precision")->valuedouble,
                             cJSON_GetObjectItemCaseSensitive(g, "recall")->valuedouble,
                             cJSON_GetObjectItemCaseSensitive(g, "fmeasure")->valuedouble};
        d = fmax(d, prf_diff(&prf, cJSON_GetObjectItemCaseSensitive(want, qlm_rouge_metric_key(m))));
    }
    cJSON_Delete(j);
    return d;
}

/* Writes lines[0..n) (each without its newline) to dir/name; returns the path in buf. */
static const char *write_lines(char *buf, size_t cap, const char *dir, const char *name, char **lines, int n) {
    snprintf(buf, cap, "%s/%s", dir, name);
    FILE *f = fopen(buf, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", lines[i]);
    fclose(f);
    return buf;
}

static void test_cli(void **state) {
    (void)state;
    char *ej = test_read_file(FIX "expected.json", NULL);
    assert_non_null(ej);
    cJSON *exp = cJSON_Parse(ej);
    assert_non_null(exp);
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(exp, "pairs"));
    const cJSON *cli = cJSON_GetObjectItemCaseSensitive(exp, "cli");
    const char *base = "rouge --pred " FIX "preds.jsonl --ref " FIX "refs.jsonl";
    char *out = NULL;
    double max_diff = 0;
    /* Fixture files as they are: paired by fname; one and three reference fields. */
    for (int c = 0; c < cJSON_GetArraySize(cli); c++) {
        const cJSON *run = cJSON_GetArrayItem(cli, c);
        assert_int_equal(test_run_qlm(&out, "%s --ref-field %s --json", base, str_field(run, "ref_field")), 0);
        max_diff = fmax(max_diff, cli_diff(out, cJSON_GetObjectItemCaseSensitive(run, "mean"), n, "fname"));
        free(out);
    }
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cli, 0), "mean");

    /* Predictions in reverse order pair by fname; without fname they pair by line order. */
    char tmp[256], path[512], path2[512];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    char *ptext = test_read_file(FIX "preds.jsonl", NULL);
    assert_non_null(ptext);
    char **lines = malloc((size_t)n * sizeof *lines);
    int k = 0;
    for (char *l = strtok(ptext, "\n"); l; l = strtok(NULL, "\n")) lines[k++] = l;
    assert_int_equal(k, n);
    char **rev = malloc((size_t)n * sizeof *rev);
    for (int i = 0; i < n; i++) rev[i] = lines[n - 1 - i];
    write_lines(path, sizeof path, tmp, "reversed.jsonl", rev, n);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref " FIX "refs.jsonl --ref-field summary1 --json", path), 0);
    max_diff = fmax(max_diff, cli_diff(out, single, n, "fname"));
    free(out);
    char **noid = malloc((size_t)n * sizeof *noid);
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_Parse(lines[i]);
        cJSON_DeleteItemFromObjectCaseSensitive(o, "fname");
        noid[i] = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
    }
    write_lines(path, sizeof path, tmp, "noid.jsonl", noid, n);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref " FIX "refs.jsonl --ref-field summary1 --json", path), 0);
    max_diff = fmax(max_diff, cli_diff(out, single, n, NULL));
    free(out);
    print_message("qlm rouge: max |diff| %g from rouge_score in the means\n", max_diff);
    assert_true(max_diff <= TOL);

    /* The table. */
    assert_int_equal(test_run_qlm(&out, "%s --ref-field summary1,summary2,summary3", base), 0);
    assert_non_null(strstr(out, "ROUGE-Lsum"));
    char count[32];
    snprintf(count, sizeof count, "%d pairs", n);
    assert_non_null(strstr(out, count));
    free(out);
    assert_int_equal(test_run_qlm(&out, "rouge --help"), 0);
    assert_memory_equal(out, "usage: qlm rouge", strlen("usage: qlm rouge"));
    free(out);

    /* Bad data: exit 1 with the file, line and field named. */
    char *bad[3] = {lines[0], lines[1], "{\"fname\": \"x\", \"summary\": \"unterminated}"};
    write_lines(path, sizeof path, tmp, "badjson.jsonl", bad, 3);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref %s 2>&1", path, path), 1);
    assert_non_null(strstr(out, "badjson.jsonl:3: invalid JSON"));
    free(out);
    bad[1] = "{\"fname\": \"test_x\", \"text\": \"no summary here\"}";
    bad[2] = lines[2];
    write_lines(path, sizeof path, tmp, "nofield.jsonl", bad, 3);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref %s --ref-field text 2>&1", path, path), 1);
    assert_non_null(strstr(out, "nofield.jsonl:1: missing field \"text\""));
    free(out);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref %s --ref-field summary 2>&1", path, path), 1);
    assert_non_null(strstr(out, "nofield.jsonl:2: missing field \"summary\""));
    free(out);
    bad[1] = "{\"fname\": \"test_x\", \"summary\": 42}";
    write_lines(path, sizeof path, tmp, "nonstring.jsonl", bad, 3);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref %s 2>&1", path, path), 1);
    assert_non_null(strstr(out, "nonstring.jsonl:2: field \"summary\" is not a string"));
    free(out);
    bad[1] = "[1, 2]";
    write_lines(path, sizeof path, tmp, "array.jsonl", bad, 3);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref %s 2>&1", path, path), 1);
    assert_non_null(strstr(out, "array.jsonl:2: expected a JSON object"));
    free(out);
    /* Mismatched records: counts by line order, ids, repeated ids. */
    write_lines(path2, sizeof path2, tmp, "two.jsonl", lines, 2);
    char *noid_two[2] = {noid[0], noid[1]};
    write_lines(path, sizeof path, tmp, "two-noid.jsonl", noid_two, 2);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref " FIX "refs.jsonl 2>&1", path), 1);
    if (!strstr(out, "two-noid.jsonl has 2 records") || !strstr(out, "--id-field")) fail_msg("%s", out);
    free(out);
    char *swapped[2] = {lines[0], lines[2]};
    /* Paired by id, a partial prediction file scores its own records (pairs 0 and 2 of the
     * fixture, both scored against summary1 by rouge_score). */
    write_lines(path, sizeof path, tmp, "partial.jsonl", swapped, 2);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref " FIX "refs.jsonl --ref-field summary1 --json", path), 0);
    cJSON *part = cJSON_Parse(out);
    const cJSON *pairs = cJSON_GetObjectItemCaseSensitive(exp, "pairs");
    double mean_f = 0;
    for (int i = 0; i <= 2; i += 2) {
        const cJSON *p = cJSON_GetArrayItem(pairs, i);
        assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(p, "ref_fields")), 1);
        mean_f += cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(p, "rouge1"), 2)->valuedouble / 2;
    }
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(part, "pairs")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(part, "references")->valueint, n);
    double got = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(part, "rouge1"), "fmeasure")->valuedouble;
    if (fabs(got - mean_f) > TOL) fail_msg("partial ROUGE-1 F %g, rouge_score %g", got, mean_f);
    cJSON_Delete(part);
    free(out);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref " FIX "refs.jsonl --ref-field summary1", path), 0);
    assert_non_null(strstr(out, "2 of the 329 references scored"));
    free(out);
    write_lines(path, sizeof path, tmp, "other.jsonl", swapped, 2);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref %s 2>&1", path, path2), 1);
    assert_non_null(strstr(out, "other.jsonl:2: fname"));
    free(out);
    char *twice[2] = {lines[0], lines[0]};
    write_lines(path, sizeof path, tmp, "twice.jsonl", twice, 2);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref %s 2>&1", path, path2), 1);
    assert_non_null(strstr(out, "twice.jsonl:2: id"));
    free(out);
    /* An escaped NUL separates words like a space (cJSON alone would end the text there); an escaped
     * backslash before "u0000" stays text. */
    char *spaced[2] = {"{\"summary\": \"the cat sat on the mat\"}", "{\"summary\": \"a\\\\u0000b dog\"}"};
    char *nul[2] = {"{\"summary\": \"the cat\\u0000sat on\\u0000\\u0000the mat\"}",
                    "{\"summary\": \"a\\\\u0000b dog\"}"};
    char *refs[2] = {"{\"summary\": \"the cat sat on the mat\"}", "{\"summary\": \"a u0000b dog\"}"};
    write_lines(path, sizeof path, tmp, "spaced.jsonl", spaced, 2);
    write_lines(path2, sizeof path2, tmp, "refs2.jsonl", refs, 2);
    char *want;
    assert_int_equal(test_run_qlm(&want, "rouge --pred %s --ref %s --json", path, path2), 0);
    write_lines(path, sizeof path, tmp, "nul.jsonl", nul, 2);
    assert_int_equal(test_run_qlm(&out, "rouge --pred %s --ref %s --json", path, path2), 0);
    assert_string_equal(out, want);
    free(out);
    free(want);
    assert_int_equal(test_run_qlm(&out, "rouge --pred /nonexistent.jsonl --ref %s 2>&1", path2), 1);
    assert_non_null(strstr(out, "/nonexistent.jsonl"));
    free(out);

    /* Usage errors: exit 2. */
    assert_int_equal(test_run_qlm(NULL, "rouge 2>/dev/null"), 2);
    assert_int_equal(test_run_qlm(NULL, "rouge --pred %s 2>/dev/null", path2), 2);
    assert_int_equal(test_run_qlm(NULL, "%s --ref-field a,,b 2>/dev/null", base), 2);
    assert_int_equal(test_run_qlm(NULL, "%s --frobnicate 2>/dev/null", base), 2);

    for (int i = 0; i < n; i++) free(noid[i]);
    free(noid);
    free(rev);
    free(lines);
    free(ptext);
    cJSON_Delete(exp);
    free(ej);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stemmer_word_list), cmocka_unit_test(test_stemmer_examples),
        cmocka_unit_test(test_tokenize),          cmocka_unit_test(test_edge_cases),
        cmocka_unit_test(test_fixture_pairs),     cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
