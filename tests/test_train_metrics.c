/* The training metrics log (metrics.jsonl: append, new-run truncation, resume cut-back with torn
 * last lines) and the loss-curve SVG (well-formed, point counts, escaping, edge cases). */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <strings.h>
#include <unistd.h>

#include "../core/error.h"
#include "../train/metrics.h"
#include "test_util.h"

static void rm_rf(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void path_in(char *buf, size_t cap, const char *dir, const char *name) { snprintf(buf, cap, "%s/%s", dir, name); }

/* The log's lines, each parsed (asserting every line is a whole JSON object ending in '\n'). */
typedef struct {
    cJSON *obj[4096];
    int n;
} log_lines;

static void read_log(const char *dir, log_lines *out) {
    char path[512];
    path_in(path, sizeof path, dir, "metrics.jsonl");
    size_t len = 0;
    char *data = test_read_file(path, &len);
    assert_non_null(data);
    assert_true(len == 0 || data[len - 1] == '\n');
    out->n = 0;
    for (char *line = data, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = 0;
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        assert_true(cJSON_IsObject(o));
        assert_true(out->n < 4096);
        out->obj[out->n++] = o;
    }
    free(data);
}

static void free_log(log_lines *l) {
    for (int i = 0; i < l->n; i++) cJSON_Delete(l->obj[i]);
    l->n = 0;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

/* Steps 1..n with an eval every 5 steps. */
static void log_run(qlm_train_log *g, long from, long to) {
    for (long s = from; s <= to; s++) {
        assert_int_equal(qlm_train_log_step(g, s, 3.0 - 0.01 * (double)s, 2e-4, 1.25, 812.5, 65536, 0.5 * (double)s), 0);
        if (s % 5 == 0) assert_int_equal(qlm_train_log_eval(g, s, 2.9 - 0.01 * (double)s), 0);
    }
}

static void append_raw(const char *dir, const char *text) {
    char path[512];
    path_in(path, sizeof path, dir, "metrics.jsonl");
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static void test_write_and_fields(void **state) {
    (void)state;
    char dir[256];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    qlm_train_log *g = qlm_train_log_open(dir, -1, "t");
    assert_non_null(g);
    qlm_train_log_set_sync_every(g, 3);
    log_run(g, 1, 10);
    /* Optional fields: NaN is left out, inf is null; a NaN loss is null. */
    assert_int_equal(qlm_train_log_step(g, 11, NAN, 1e-4, INFINITY, NAN, NAN, 6), 0);
    assert_int_equal(qlm_train_log_eval(g, 11, INFINITY), 0);
    assert_int_equal(qlm_train_log_sync(g), 0);
    size_t nt, ne;
    const qlm_train_point *tp = qlm_train_log_losses(g, &nt);
    qlm_train_log_evals(g, &ne);
    assert_int_equal(nt, 11);
    assert_int_equal(ne, 3);
    assert_int_equal(tp[0].step, 1);
    assert_true(isnan(tp[10].value));
    qlm_train_log_close(g);

    log_lines l;
    read_log(dir, &l);
    assert_int_equal(l.n, 14);
    const cJSON *first = l.obj[0];
    assert_int_equal((long)num(first, "step"), 1);
    assert_true(fabs(num(first, "loss") - 2.99) < 1e-9);
    assert_true(fabs(num(first, "lr") - 2e-4) < 1e-15);
    assert_true(fabs(num(first, "grad_norm") - 1.25) < 1e-12);
    assert_true(fabs(num(first, "tokens_per_s") - 812.5) < 1e-9);
    assert_true(fabs(num(first, "loss_scale") - 65536) < 1e-9);
    assert_true(fabs(num(first, "elapsed_s") - 0.5) < 1e-12);
    const cJSON *ev = l.obj[5]; /* steps 1..5, then the eval at 5 */
    assert_int_equal((long)num(ev, "step"), 5);
    assert_true(fabs(num(ev, "eval_loss") - 2.85) < 1e-9);
    assert_null(cJSON_GetObjectItem(ev, "loss"));
    const cJSON *odd = l.obj[12]; /* after step 10's eval */
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(odd, "loss")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(odd, "grad_norm")));
    assert_null(cJSON_GetObjectItem(odd, "tokens_per_s"));
    assert_null(cJSON_GetObjectItem(odd, "loss_scale"));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(l.obj[13], "eval_loss")));
    free_log(&l);

    /* A new run (resume_step -1) empties the log; so does reopening it. */
    g = qlm_train_log_open(dir, -1, "t");
    assert_non_null(g);
    assert_int_equal(qlm_train_log_step(g, 1, 2.5, 1e-4, 1, 1, 1, 1), 0);
    qlm_train_log_close(g);
    read_log(dir, &l);
    assert_int_equal(l.n, 1);
    free_log(&l);
    rm_rf(dir);
}

static void test_resume_truncates(void **state) {
    (void)state;
    char dir[256];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    qlm_train_log *g = qlm_train_log_open(dir, -1, "t");
    assert_non_null(g);
    log_run(g, 1, 12);
    qlm_train_log_close(g);
    /* A crash mid-write left a torn last line. */
    append_raw(dir, "{\"step\":13,\"loss\":1.8,\"l");

    g = qlm_train_log_open(dir, 7, "t");
    assert_non_null(g);
    size_t nt, ne;
    const qlm_train_point *tp = qlm_train_log_losses(g, &nt);
    const qlm_train_point *ep = qlm_train_log_evals(g, &ne);
    assert_int_equal(nt, 7);
    assert_int_equal(ne, 1);
    assert_int_equal(tp[6].step, 7);
    assert_true(fabs(tp[6].value - 2.93) < 1e-9);
    assert_int_equal(ep[0].step, 5);
    assert_true(fabs(ep[0].value - 2.85) < 1e-9);
    log_lines l;
    read_log(dir, &l); /* the cut-back file alone: 7 steps + 1 eval, no torn line */
    assert_int_equal(l.n, 8);
    free_log(&l);
    log_run(g, 8, 12);
    qlm_train_log_close(g);

    /* No duplicates, no torn line: train steps strictly increasing 1..12, evals at 5 and 10. */
    read_log(dir, &l);
    assert_int_equal(l.n, 14);
    long last = 0;
    int evals = 0;
    for (int i = 0; i < l.n; i++) {
        long s = (long)num(l.obj[i], "step");
        if (cJSON_GetObjectItem(l.obj[i], "eval_loss")) {
            evals++;
            assert_int_equal(s % 5, 0);
        } else {
            assert_int_equal(s, last + 1);
            last = s;
        }
    }
    assert_int_equal(last, 12);
    assert_int_equal(evals, 2);
    free_log(&l);

    /* Torn tails of other shapes: NUL bytes (delayed allocation after a power cut), a garbage
     * line ending in a newline; a complete last line without its newline is kept. */
    append_raw(dir, "{\"step\":13,\"loss\":1.5}");
    g = qlm_train_log_open(dir, 100, "t");
    assert_non_null(g);
    qlm_train_log_losses(g, &nt);
    assert_int_equal(nt, 13);
    qlm_train_log_close(g);
    read_log(dir, &l);
    assert_int_equal(l.n, 15);
    free_log(&l);
    char path[512];
    path_in(path, sizeof path, dir, "metrics.jsonl");
    FILE *f = fopen(path, "ab");
    assert_non_null(f);
    static const char zeros[40] = {0};
    fwrite("{\"step\":14,\"lo\n", 1, 15, f);
    fwrite(zeros, 1, sizeof zeros, f);
    fclose(f);
    g = qlm_train_log_open(dir, 100, "t");
    assert_non_null(g);
    qlm_train_log_losses(g, &nt);
    assert_int_equal(nt, 13);
    assert_int_equal(qlm_train_log_step(g, 14, 1.4, 1, 1, 1, 1, 1), 0);
    qlm_train_log_close(g);
    read_log(dir, &l);
    assert_int_equal(l.n, 16);
    free_log(&l);

    /* Resume at 0 keeps nothing; resume with no log at all starts an empty one. */
    g = qlm_train_log_open(dir, 0, "t");
    assert_non_null(g);
    qlm_train_log_losses(g, &nt);
    assert_int_equal(nt, 0);
    qlm_train_log_close(g);
    read_log(dir, &l);
    assert_int_equal(l.n, 0);
    free_log(&l);
    assert_int_equal(unlink(path), 0);
    g = qlm_train_log_open(dir, 50, "t");
    assert_non_null(g);
    assert_true(test_path_exists(path));
    qlm_train_log_close(g);
    rm_rf(dir);
}

static void test_corrupt_middle_is_error(void **state) {
    (void)state;
    char dir[256], path[512];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    path_in(path, sizeof path, dir, "metrics.jsonl");
    const char *text = "{\"step\":1,\"loss\":2}\nnot json\n{\"step\":2,\"loss\":1.9}\n";
    assert_int_equal(test_write_file(path, text, strlen(text)), 0);
    qlm_clear_error();
    assert_null(qlm_train_log_open(dir, 10, "t"));
    assert_non_null(strstr(qlm_last_error(), "metrics.jsonl:2"));
    /* The file is left alone. */
    size_t len;
    char *data = test_read_file(path, &len);
    assert_string_equal(data, text);
    free(data);
    /* A folder that cannot be created is an error too. */
    assert_null(qlm_train_log_open("/nonexistent-qlm/x/y", -1, "t"));
    rm_rf(dir);
}

/* ---- SVG ---- */

/* word occurs (case-insensitively) not inside a longer word ("dominant-baseline" is fine). */
static int has_word(const char *s, const char *word) {
    size_t n = strlen(word);
    for (const char *p = s; *p; p++)
        if (strncasecmp(p, word, n) == 0 && (p == s || !isalpha((unsigned char)p[-1])) && !isalpha((unsigned char)p[n]))
            return 1;
    return 0;
}

static char *read_svg(const char *dir) {
    char path[512];
    path_in(path, sizeof path, dir, "loss_curve.svg");
    char *s = test_read_file(path, NULL);
    assert_non_null(s);
    /* Minimal well-formedness: one root element, no non-finite numbers. */
    assert_true(strncmp(s, "<svg", 4) == 0);
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' ')) n--;
    assert_true(n >= 6 && strncmp(s + n - 6, "</svg>", 6) == 0);
    assert_false(has_word(s, "nan"));
    assert_false(has_word(s, "inf"));
    int opened = 0, closed = 0;
    for (const char *p = s; (p = strstr(p, "<svg")); p++) opened++;
    for (const char *p = s; (p = strstr(p, "</svg>")); p++) closed++;
    assert_int_equal(opened, 1);
    assert_int_equal(closed, 1);
    return s;
}

/* Number of x,y pairs in the polyline with class cls; -1 when there is none. */
static int polyline_points(const char *svg, const char *cls) {
    char key[64];
    snprintf(key, sizeof key, "<polyline class=\"%s\"", cls);
    const char *p = strstr(svg, key);
    if (!p) return -1;
    p = strstr(p, "points=\"");
    assert_non_null(p);
    p += 8;
    int pairs = 0;
    for (; *p && *p != '"'; p++) pairs += *p == ',';
    return pairs;
}

/* The largest tick label of the given class. */
static double max_tick(const char *svg, const char *cls) {
    char key[64];
    snprintf(key, sizeof key, "class=\"%s\"", cls);
    double mx = -INFINITY;
    for (const char *p = svg; (p = strstr(p, key)); p++) {
        const char *t = strchr(p, '>');
        assert_non_null(t);
        mx = fmax(mx, strtod(t + 1, NULL));
    }
    return mx;
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_svg_small_run(void **state) {
    (void)state;
    char dir[256];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    qlm_train_log *g = qlm_train_log_open(dir, -1, "qlm train: <SmolLM2> & \"LoRA\" r='8'");
    assert_non_null(g);
    log_run(g, 1, 20);
    assert_int_equal(qlm_train_log_plot(g), 0);
    char *svg = read_svg(dir);
    assert_non_null(strstr(svg, "qlm train: &lt;SmolLM2&gt; &amp; &quot;LoRA&quot; r=&apos;8&apos;"));
    assert_null(strstr(svg, "<SmolLM2>"));
    assert_int_equal(polyline_points(svg, "train"), 20);
    assert_int_equal(polyline_points(svg, "ema"), 20);
    assert_int_equal(polyline_points(svg, "eval"), 4);
    assert_int_equal(count(svg, "<circle cx="), 4); /* eval markers */
    assert_non_null(strstr(svg, ">step</text>"));
    assert_non_null(strstr(svg, ">loss</text>"));
    assert_non_null(strstr(svg, "class=\"legend\""));
    assert_non_null(strstr(svg, "eval loss"));
    /* 1-2-5 ticks: steps 1..20 give 0, 2, ..., 20 (step 2 or 5 depending on the target count). */
    assert_non_null(strstr(svg, "class=\"xtick\""));
    assert_non_null(strstr(svg, ">0</text>"));
    assert_non_null(strstr(svg, ">20</text>"));
    /* Losses 2.79..2.99 (eval 2.70..2.85): y ticks 2.6 .. 3.0 on a 0.1 grid, one decimal. */
    assert_non_null(strstr(svg, ">2.6</text>"));
    assert_non_null(strstr(svg, ">2.7</text>"));
    assert_non_null(strstr(svg, ">3.0</text>"));
    assert_true(fabs(max_tick(svg, "ytick") - 3.0) < 1e-9);
    free(svg);
    /* The plot is rewritten, not appended to, and no temporary file is left behind. */
    assert_int_equal(qlm_train_log_step(g, 21, 2.5, 1, 1, 1, 1, 1), 0);
    assert_int_equal(qlm_train_log_plot(g), 0);
    svg = read_svg(dir);
    assert_int_equal(polyline_points(svg, "train"), 21);
    free(svg);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c tmp", dir);
    FILE *p = popen(cmd, "r");
    char out[16] = {0};
    assert_non_null(fgets(out, sizeof out, p));
    pclose(p);
    assert_int_equal(atoi(out), 0);
    qlm_train_log_close(g);

    /* Resume rebuilds the same history, hence the same picture. */
    g = qlm_train_log_open(dir, 20, "qlm train: <SmolLM2> & \"LoRA\" r='8'");
    assert_non_null(g);
    assert_int_equal(qlm_train_log_plot(g), 0);
    svg = read_svg(dir);
    assert_int_equal(polyline_points(svg, "train"), 20);
    assert_int_equal(polyline_points(svg, "eval"), 4);
    free(svg);
    qlm_train_log_close(g);
    rm_rf(dir);
}

static void test_svg_edge_cases(void **state) {
    (void)state;
    char dir[256], path[512];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    path_in(path, sizeof path, dir, "loss_curve.svg");
    char *svg;

    /* No points. */
    assert_int_equal(qlm_train_plot_svg(path, NULL, NULL, 0, NULL, 0), 0);
    svg = read_svg(dir);
    assert_int_equal(polyline_points(svg, "train"), -1);
    assert_non_null(strstr(svg, "no data yet"));
    assert_non_null(strstr(svg, "qlm train"));
    free(svg);

    /* One point: a marker, no EMA line. */
    qlm_train_point one = {7, 2.5};
    assert_int_equal(qlm_train_plot_svg(path, "one", &one, 1, NULL, 0), 0);
    svg = read_svg(dir);
    assert_int_equal(polyline_points(svg, "train"), 1);
    assert_int_equal(polyline_points(svg, "ema"), -1);
    assert_non_null(strstr(svg, "<circle class=\"train\""));
    free(svg);

    /* One eval point only. */
    assert_int_equal(qlm_train_plot_svg(path, "e", NULL, 0, &one, 1), 0);
    svg = read_svg(dir);
    assert_int_equal(count(svg, "<circle cx="), 1);
    free(svg);

    /* All-equal losses, steps all equal too. */
    qlm_train_point flat[5];
    for (int i = 0; i < 5; i++) flat[i] = (qlm_train_point){3, 0.0};
    assert_int_equal(qlm_train_plot_svg(path, "flat", flat, 5, flat, 2), 0);
    svg = read_svg(dir);
    assert_int_equal(polyline_points(svg, "train"), 5);
    free(svg);

    /* NaN / inf / absurd values are skipped; all non-finite is like no data. */
    qlm_train_point mixed[6] = {{1, 2.0}, {2, NAN}, {3, INFINITY}, {4, -INFINITY}, {5, 1e300}, {6, 1.5}};
    assert_int_equal(qlm_train_plot_svg(path, "mixed", mixed, 6, mixed + 1, 3), 0);
    svg = read_svg(dir);
    assert_int_equal(polyline_points(svg, "train"), 2);
    assert_int_equal(polyline_points(svg, "eval"), -1);
    free(svg);
    assert_int_equal(qlm_train_plot_svg(path, "bad", mixed + 1, 4, NULL, 0), 0);
    svg = read_svg(dir);
    assert_non_null(strstr(svg, "no data yet"));
    free(svg);

    /* Control characters and invalid UTF-8 in the title still give well-formed XML. */
    assert_int_equal(qlm_train_plot_svg(path, "a\x01\x7f\xff\xc3(\xc3\xa9", &one, 1, NULL, 0), 0);
    svg = read_svg(dir);
    assert_non_null(strstr(svg, "a  \xEF\xBF\xBD\xEF\xBF\xBD(\xc3\xa9"));
    free(svg);

    /* Thousands of points: the raw line is downsampled to at most 2000, spikes kept. */
    size_t n = 50000;
    qlm_train_point *many = malloc(n * sizeof *many);
    assert_non_null(many);
    for (size_t i = 0; i < n; i++) many[i] = (qlm_train_point){(long)i + 1, 3.0 / (1 + 0.001 * (double)i) + 0.05 * sin((double)i)};
    many[31337].value = 9.0;
    assert_int_equal(qlm_train_plot_svg(path, "many", many, n, many, 300), 0);
    svg = read_svg(dir);
    int raw = polyline_points(svg, "train"), ema = polyline_points(svg, "ema");
    assert_true(raw > 1000 && raw <= QLM_TRAIN_PLOT_MAX_POINTS);
    assert_true(ema > 1000 && ema <= QLM_TRAIN_PLOT_MAX_POINTS);
    assert_int_equal(polyline_points(svg, "eval"), 300);
    assert_true(strlen(svg) < 400000);
    /* The spike survives downsampling: the y axis still reaches it. */
    assert_true(max_tick(svg, "ytick") >= 9.0);
    assert_true(max_tick(svg, "xtick") >= 50000);
    free(svg);
    free(many);

    /* Unwritable destination: an error, not a crash. */
    assert_int_equal(qlm_train_plot_svg("/nonexistent-qlm/loss_curve.svg", "x", &one, 1, NULL, 0), -1);
    rm_rf(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_and_fields),        cmocka_unit_test(test_resume_truncates),
        cmocka_unit_test(test_corrupt_middle_is_error), cmocka_unit_test(test_svg_small_run),
        cmocka_unit_test(test_svg_edge_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
