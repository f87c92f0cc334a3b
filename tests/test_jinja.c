/* The chat-template interpreter (core/jinja*.c) against jinja2 as transformers runs it: the
 * renders in tests/fixtures/jinja/cases.json (tools/make_jinja_fixtures.py) of real and written
 * chat templates over many conversations, and of one construct at a time, each with its output,
 * its untrusted byte ranges, or the fact that jinja2 fails; the syntax errors with qlm's message
 * and position; the limits a hostile template meets; and random mutations of real templates,
 * which must never crash (run under ASan too). */
#include "test_util.h"

#include <cjson/cJSON.h>

#include "tokenizer/chat.h"
#include "core/error.h"
#include "tokenizer/jinja.h"

static cJSON *load_cases(void) {
    char *json = test_read_file("tests/fixtures/jinja/cases.json", NULL);
    assert_non_null(json);
    cJSON *root = cJSON_Parse(json);
    free(json);
    assert_non_null(root);
    return root;
}

static const char *str_field(const cJSON *c, const char *name) {
    const cJSON *f = cJSON_GetObjectItem(c, name);
    return cJSON_IsString(f) ? f->valuestring : NULL;
}

/* The fixtures' strftime_now time. */
static struct tm fixture_now(const cJSON *root) {
    struct tm t = {0};
    assert_int_equal(sscanf(str_field(root, "now"), "%d-%d-%d %d:%d:%d", &t.tm_year, &t.tm_mon, &t.tm_mday, &t.tm_hour,
                            &t.tm_min, &t.tm_sec),
                     6);
    t.tm_year -= 1900;
    t.tm_mon -= 1;
    t.tm_isdst = -1;
    mktime(&t); /* fills the weekday and day of the year */
    return t;
}

/* ---- JSON variables as interpreter inputs ---- */

static int count(const cJSON *j) {
    int n = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, j) n++;
    return n;
}

static void to_input(const cJSON *j, qlm_jinja_input *in, int untrusted) {
    memset(in, 0, sizeof *in);
    in->key = j->string;
    if (cJSON_IsNull(j)) {
        in->type = QLM_JINJA_NONE;
    } else if (cJSON_IsBool(j)) {
        in->type = QLM_JINJA_BOOL;
        in->i = cJSON_IsTrue(j);
    } else if (cJSON_IsNumber(j)) {
        int integral = j->valuedouble == (double)(long long)j->valuedouble;
        in->type = integral ? QLM_JINJA_INT : QLM_JINJA_FLOAT;
        in->i = (long long)j->valuedouble;
        in->f = j->valuedouble;
    } else if (cJSON_IsString(j)) {
        in->type = QLM_JINJA_STRING;
        in->s = j->valuestring;
        in->len = strlen(j->valuestring);
        in->untrusted = untrusted;
    } else {
        in->type = cJSON_IsArray(j) ? QLM_JINJA_LIST : QLM_JINJA_DICT;
        in->n = count(j);
        qlm_jinja_input *items = calloc((size_t)in->n + 1, sizeof *items);
        assert_non_null(items);
        int k = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, j) to_input(c, &items[k++], untrusted);
        in->items = items;
    }
}

static void free_input(qlm_jinja_input *in) {
    for (int i = 0; (in->type == QLM_JINJA_LIST || in->type == QLM_JINJA_DICT) && i < in->n; i++)
        free_input((qlm_jinja_input *)&in->items[i]);
    if (in->type == QLM_JINJA_LIST || in->type == QLM_JINJA_DICT) free((void *)in->items);
}

/* The top-level variables of a case: strings untrusted except bos_token and eos_token. */
static qlm_jinja_input *vars_input(const cJSON *vars, int *n) {
    *n = count(vars);
    qlm_jinja_input *in = calloc((size_t)*n + 1, sizeof *in);
    assert_non_null(in);
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, vars) to_input(c, &in[k++], strcmp(c->string, "bos_token") && strcmp(c->string, "eos_token"));
    return in;
}

static void free_vars(qlm_jinja_input *in, int n) {
    for (int i = 0; i < n; i++) free_input(&in[i]);
    free(in);
}

/* ---- checks ---- */

static void check_marks(const char *name, const qlm_marked_text *out, const cJSON *want) {
    if (cJSON_IsNull(want) || !want) return;
    int n = count(want), k = 0;
    const cJSON *r;
    if (n != out->n_plain) {
        for (int i = 0; i < out->n_plain; i++) print_message("  got [%zu, %zu)\n", out->plain[i].start, out->plain[i].end);
        cJSON_ArrayForEach(r, want) print_message("  want [%d, %d)\n", r->child->valueint, r->child->next->valueint);
        fail_msg("%s: %d untrusted ranges, want %d", name, out->n_plain, n);
    }
    cJSON_ArrayForEach(r, want) {
        size_t s = (size_t)r->child->valueint, e = (size_t)r->child->next->valueint;
        if (out->plain[k].start != s || out->plain[k].end != e)
            fail_msg("%s: untrusted range %d is [%zu, %zu), want [%zu, %zu)", name, k, out->plain[k].start,
                     out->plain[k].end, s, e);
        k++;
    }
}

static void check_render(const char *name, int rc, const qlm_marked_text *out, const cJSON *c) {
    const char *want = str_field(c, "expected"), *error = str_field(c, "error");
    if (error) {
        if (rc == 0) fail_msg("%s: rendered \"%s\", but jinja2 fails: %s", name, out->text, error);
        /* what raise_exception says reaches the caller */
        if (!strncmp(error, "TemplateError: ", 15) && !strstr(qlm_last_error(), error + 15))
            fail_msg("%s: error \"%s\" lacks \"%s\"", name, qlm_last_error(), error + 15);
        return;
    }
    if (rc != 0) fail_msg("%s: %s", name, qlm_last_error());
    if (out->len != strlen(want) || memcmp(out->text, want, out->len) != 0)
        fail_msg("%s:\n got: \"%s\"\nwant: \"%s\"", name, out->text, want);
    check_marks(name, out, cJSON_GetObjectItem(c, "marks"));
}

/* Published chat templates and ones written with their constructs, rendered through the chat
 * API over every fixture conversation. */
static void test_chat_templates(void **state) {
    (void)state;
    cJSON *root = load_cases();
    struct tm now = fixture_now(root);
    qlm_jinja_limits lim = qlm_jinja_default_limits();
    lim.now = &now;
    const cJSON *c;
    int n = 0, errors = 0, real = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "chat")) {
        const char *name = str_field(c, "name");
        const cJSON *def = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "templates"), str_field(c, "template"));
        const char *tmpl = str_field(def, "source");
        qlm_jinja *t;
        if (qlm_jinja_parse(tmpl, strlen(tmpl), &t) != 0) fail_msg("%s: %s", name, qlm_last_error());
        qlm_chat_message msgs[16];
        int m = 0;
        const cJSON *msg;
        const cJSON *conv = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "conversations"), str_field(c, "conversation"));
        cJSON_ArrayForEach(msg, conv) {
            assert_true(m < 16);
            msgs[m++] = (qlm_chat_message){str_field(msg, "role"), str_field(msg, "content")};
        }
        qlm_marked_text out;
        int rc = qlm_chat_render_parsed(t, msgs, m, cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                                        str_field(def, "bos"), str_field(def, "eos"), &lim, &out);
        check_render(name, rc, &out, c);
        qlm_marked_free(&out);
        qlm_jinja_free(t);
        errors += str_field(c, "error") != NULL;
        real += !strncmp(name, "tinyllama/", 10) || !strncmp(name, "smollm2/", 8);
        n++;
    }
    print_message("%d chat renders (%d of real templates), %d failing as in jinja2\n", n, real, errors);
    assert_true(n >= 140 && errors >= 10 && real >= 14);
    cJSON_Delete(root);
}

/* One construct at a time: operators, tests, filters, methods, loops, scoping, macros,
 * whitespace control. */
static void test_expressions(void **state) {
    (void)state;
    cJSON *root = load_cases();
    struct tm now = fixture_now(root);
    qlm_jinja_limits lim = qlm_jinja_default_limits();
    lim.now = &now;
    const cJSON *c;
    int n = 0, marked = 0, nv;
    qlm_jinja_input *vars = vars_input(cJSON_GetObjectItem(root, "expr_vars"), &nv);
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "expr")) {
        const char *tmpl = str_field(c, "template");
        qlm_jinja *t;
        qlm_marked_text out = {0};
        int rc = qlm_jinja_parse(tmpl, strlen(tmpl), &t);
        if (rc == 0) rc = qlm_jinja_render(t, vars, nv, &lim, &out);
        check_render(tmpl, rc, &out, c);
        marked += out.n_plain > 0;
        qlm_marked_free(&out);
        if (t) qlm_jinja_free(t);
        n++;
    }
    free_vars(vars, nv);
    print_message("%d expressions, %d with untrusted text\n", n, marked);
    assert_true(n >= 90 && marked >= 20);
    cJSON_Delete(root);
}

static void test_syntax_errors(void **state) {
    (void)state;
    cJSON *root = load_cases();
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "syntax")) {
        const char *tmpl = str_field(c, "template");
        qlm_jinja *t = NULL;
        if (qlm_jinja_parse(tmpl, strlen(tmpl), &t) == 0) fail_msg("\"%s\" parses", tmpl);
        assert_null(t);
        if (strcmp(qlm_last_error(), str_field(c, "message")) != 0)
            fail_msg("\"%s\":\n got: %s\nwant: %s", tmpl, qlm_last_error(), str_field(c, "message"));
        n++;
    }
    assert_true(n >= 20);
    cJSON_Delete(root);
}

/* Renders tmpl with one message ("hi") under lim (NULL: defaults); returns rc, out in *text. */
static int render_one(const char *tmpl, const qlm_jinja_limits *lim, char **text) {
    static const qlm_chat_message msg = {"user", "hi"};
    qlm_jinja *t;
    *text = NULL;
    if (qlm_jinja_parse(tmpl, strlen(tmpl), &t) != 0) return -2;
    qlm_marked_text out;
    int rc = qlm_chat_render_parsed(t, &msg, 1, 1, "<s>", "</s>", lim, &out);
    qlm_jinja_free(t);
    if (rc == 0) *text = qlm_marked_take(&out);
    return rc;
}

static void expect_error(const char *tmpl, const qlm_jinja_limits *lim, const char *message) {
    char *text;
    int rc = render_one(tmpl, lim, &text);
    if (rc == 0) fail_msg("\"%s\" rendered \"%s\"", tmpl, text);
    if (!strstr(qlm_last_error(), message)) fail_msg("\"%s\": \"%s\" lacks \"%s\"", tmpl, qlm_last_error(), message);
}

static void expect_text(const char *tmpl, const char *want) {
    char *text;
    if (render_one(tmpl, NULL, &text) != 0) fail_msg("\"%s\": %s", tmpl, qlm_last_error());
    assert_string_equal(text, want);
    free(text);
}

/* Errors while rendering name their place; what jinja2 defers to run time stays there. */
static void test_runtime_errors(void **state) {
    (void)state;
    expect_error("{% if true %}\n  {{ raise_exception('Bad ' ~ 'role') }}{% endif %}", NULL,
                 "chat template line 2, column 6: raise_exception: Bad role");
    expect_text("{% if false %}{{ x | nosuch }}{% endif %}ok", "ok");
    expect_error("{% if true %}{{ 1 | nosuch }}{% endif %}", NULL, "line 1, column 21: unknown filter \"nosuch\"");
    expect_text("{{ 'x' if true else 1 is nosuch }}", "x");
    expect_error("{{ 'x' if false else 1 is nosuch }}", NULL, "line 1, column 27: unknown test \"nosuch\"");
    expect_error("{{ '<b>' | safe }}", NULL, "line 1, column 12: the filter \"safe\" is not supported");
    expect_error("\n\n   {{ foo.bar }}", NULL, "chat template line 3, column 10: 'foo' is undefined");
    expect_error("{{ messages[3].role }}", NULL, "list object has no element 3");
    expect_error("{{ 'a' + 1 }}", NULL, "line 1, column 8: can only concatenate str (not \"int\") to str");
    expect_error("{{ messages.append(1) }}", NULL, "access to attribute 'append' of 'list' object is unsafe.");
    expect_error("{% set ns = namespace(a=1) %}{% set ns._x = 1 %}", NULL, "underscore-prefixed");
    expect_error("{{ 'abc'.format(1) }}", NULL, "the method str.format() is not supported");
    expect_error("{{ lipsum() }}", NULL, "the global lipsum() is not supported");
    expect_error("{{ range(1000000) | length }}", NULL, "Range too big");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, "integer overflow");
    expect_error("{{ messages | map(attribute='role') }}", NULL, "cannot print a generator");
    expect_text("{{ messages[0]['role'] }}{{ bos_token }}{{ eos_token }}", "user<s></s>");
}

/* What a hostile template meets: every limit fails with its own message, quickly. */
static void test_limits(void **state) {
    (void)state;
    qlm_jinja_limits lim = qlm_jinja_default_limits();
    lim.max_iterations = 20000;
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", &lim,
                 "chat template line 1, column 32: the loops ran more than 20000 iterations (the limit)");
    lim = qlm_jinja_default_limits();
    lim.max_output = 100000;
    expect_error("{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}", &lim, "the output exceeds 100000 bytes");
    expect_error("{{ 'x' * 10 ** 12 }}", &lim, "exceed 100000 bytes");
    expect_error("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", &lim,
                 "exceeds 100000 bytes");
    lim = qlm_jinja_default_limits();
    lim.max_memory = 16 << 20;
    expect_error("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}",
                 &lim, "the render needs more than 16 MiB of memory (the limit)");
    lim = qlm_jinja_default_limits();
    lim.max_steps = 100000;
    expect_error("{% for i in range(50000) %}{{ 1 + 1 + 1 + 1 + 1 + 1 }}{% endfor %}", &lim,
                 "the render took more than 100000 steps (the limit)");
    expect_error("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", NULL, "nested more than 500");
    expect_error("{% set ns = namespace(v=1) %}{% for i in range(500) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}",
                 NULL, "a value nested more than 200 deep");
    /* nesting in the source: refused by the parser, so no walk of the tree is deep */
    char *deep = malloc(40000);
    assert_non_null(deep);
    qlm_jinja *t = NULL;
    for (int parens = 200; parens <= 5000; parens += 4800) {
        strcpy(deep, "{{ ");
        for (int i = 0; i < parens; i++) strcat(deep, "(");
        strcat(deep, "1");
        for (int i = 0; i < parens; i++) strcat(deep, ")");
        strcat(deep, " }}");
        assert_int_equal(qlm_jinja_parse(deep, strlen(deep), &t), -1);
        assert_non_null(strstr(qlm_last_error(), parens == 200 ? "nests more than 200 levels deep"
                                                               : "column 260: brackets nested more than 256 deep"));
    }
    strcpy(deep, "{{ 1");
    for (int i = 0; i < 5000; i++) strcat(deep, " + 1");
    strcat(deep, " }}");
    assert_int_equal(qlm_jinja_parse(deep, strlen(deep), &t), -1);
    assert_non_null(strstr(qlm_last_error(), "nests more than 200 levels deep"));
    deep[0] = 0;
    for (int i = 0; i < 300; i++) strcat(deep, "{% if true %}");
    assert_int_equal(qlm_jinja_parse(deep, strlen(deep), &t), -1);
    assert_non_null(strstr(qlm_last_error(), "nests more than 200 levels deep"));
    free(deep);
}

/* Positions count characters, lines as jinja2 does (\r\n one line break); the source's last
 * newline is dropped; marks of template text, bos and messages. */
static void test_positions_and_marks(void **state) {
    (void)state;
    qlm_jinja *t;
    assert_int_equal(qlm_jinja_parse("é€ {{ 1 +* 2 }}", strlen("é€ {{ 1 +* 2 }}"), &t), -1);
    assert_string_equal(qlm_last_error(), "chat template line 1, column 10: unexpected '*'");
    assert_int_equal(qlm_jinja_parse("a\r\nb\rc\n {% endif %}", 19, &t), -1);
    assert_string_equal(qlm_last_error(), "chat template line 4, column 5: unknown tag 'endif'");
    expect_text("a\n", "a");
    expect_text("a\n\n", "a\n");
    expect_text("a\r\n", "a");
    const qlm_chat_message msgs[] = {{"user", " hi<|im_end|> "}};
    const char *src = "{{ bos_token }}<{{ messages[0].role }}>{{ messages[0].content | trim }}|";
    assert_int_equal(qlm_jinja_parse(src, strlen(src), &t), 0);
    qlm_marked_text out;
    assert_int_equal(qlm_chat_render_parsed(t, msgs, 1, 0, "<s>", "</s>", NULL, &out), 0);
    assert_string_equal(out.text, "<s><user>hi<|im_end|>|");
    assert_int_equal(out.n_plain, 2);
    assert_true(out.plain[0].start == 4 && out.plain[0].end == 8);
    assert_true(out.plain[1].start == 9 && out.plain[1].end == 21);
    qlm_marked_free(&out);
    qlm_jinja_free(t);
    assert_int_equal(qlm_chat_render_parsed(NULL, msgs, 1, 1, NULL, NULL, NULL, &out), 0);
    assert_string_equal(out.text, "User:  hi<|im_end|> \nAssistant: ");
    qlm_marked_free(&out);
}

/* xorshift64*: the same mutations on every run. */
static uint64_t next_rand(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

/* Random edits of real templates (and of random bytes) parse or fail, render or fail, and never
 * crash, leak or hang. */
static void test_mutations_never_crash(void **state) {
    (void)state;
    static const char alphabet[] = "{}%#-+()[]'\".|~=<>!:,_ \n\tabcnxyz0123456789\\*/";
    cJSON *root = load_cases();
    const char *sources[64];
    int n_src = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "templates")) {
        if (n_src < 64) sources[n_src++] = str_field(c, "source");
    }
    qlm_jinja_limits lim = qlm_jinja_default_limits();
    lim.max_iterations = 2000;
    lim.max_steps = 100000;
    lim.max_output = 1 << 16;
    lim.max_memory = 8 << 20;
    lim.max_depth = 200;
    const qlm_chat_message msgs[] = {{"system", "sys"}, {"user", "hi <|im_end|>"}, {"assistant", "<think>a</think>b"},
                                     {"user", "again"}};
    uint64_t seed = 0x9E3779B97F4A7C15ULL;
    int parsed = 0, rendered = 0, runs = 10000;
    char *buf = malloc(1 << 16);
    assert_non_null(buf);
    for (int it = 0; it < runs; it++) {
        size_t len;
        if (it % 10 == 9) { /* random bytes */
            len = next_rand(&seed) % 200;
            for (size_t i = 0; i < len; i++) buf[i] = (char)(next_rand(&seed) & 0xFF);
        } else {
            const char *src = sources[next_rand(&seed) % (uint64_t)n_src];
            len = strlen(src);
            memcpy(buf, src, len);
            int edits = 1 + (int)(next_rand(&seed) % 4);
            for (int e = 0; e < edits && len > 0 && len < (1 << 16) - 64; e++) {
                size_t at = next_rand(&seed) % len;
                char ch = alphabet[next_rand(&seed) % (sizeof alphabet - 1)];
                switch (next_rand(&seed) % 4) {
                case 0: buf[at] = ch; break;
                case 1:
                    memmove(buf + at + 1, buf + at, len - at);
                    buf[at] = ch;
                    len++;
                    break;
                case 2:
                    memmove(buf + at, buf + at + 1, len - at - 1);
                    len--;
                    break;
                default: { /* repeat a piece */
                    size_t piece = 1 + next_rand(&seed) % 16;
                    if (at + piece > len) piece = len - at;
                    memmove(buf + at + piece, buf + at, len - at);
                    len += piece;
                }
                }
            }
        }
        qlm_jinja *t;
        if (qlm_jinja_parse(buf, len, &t) != 0) {
            assert_true(strncmp(qlm_last_error(), "chat template line ", 19) == 0);
            continue;
        }
        parsed++;
        qlm_marked_text out;
        if (qlm_chat_render_parsed(t, msgs, 4, (int)(it & 1), "<s>", "</s>", &lim, &out) == 0) {
            rendered++;
            qlm_marked_free(&out);
        } else {
            assert_true(strncmp(qlm_last_error(), "chat template line ", 19) == 0);
        }
        qlm_jinja_free(t);
    }
    print_message("%d mutated templates: %d parse, %d render\n", runs, parsed, rendered);
    assert_true(parsed > runs / 10 && rendered > runs / 20);
    free(buf);
    cJSON_Delete(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_templates),
        cmocka_unit_test(test_expressions),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_positions_and_marks),
        cmocka_unit_test(test_mutations_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
