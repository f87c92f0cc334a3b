/* The JSON constraint: the automaton accepts exactly the valid prefixes (RFC 8259 and the
 * supported schema subset), knows when the value is complete, names a refused schema keyword and
 * where it is, and its token masks equal a brute-force check; random walks through what it allows
 * always end in a document cJSON parses and the schema accepts. */
#include <math.h>

#include "../loaders/model_source.h"
#include "../runtime/json_constraint.h"
#include "../runtime/token_stream.h"
#include "test_util.h"

/* ---- helpers ---- */

static qlm_json_grammar *schema_grammar(const char *text) {
    cJSON *s = cJSON_Parse(text);
    if (!s) fail_msg("test schema is not JSON: %s", text);
    qlm_json_grammar *g = qlm_json_grammar_schema(s);
    cJSON_Delete(s);
    if (!g) fail_msg("schema refused: %s: %s", text, qlm_last_error());
    return g;
}

/* Feeds s byte by byte: the index of the first refused byte, or -1 when all are taken. */
static long first_refused(qlm_json_matcher *m, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (qlm_json_matcher_feed(m, s + i, 1) != 0) return (long)i;
    return -1;
}

typedef struct {
    const char *text;
    int complete; /* 1: a whole value; 0: a valid prefix only */
} good_case;

typedef struct {
    const char *prefix, *next; /* prefix is taken, then the first byte of next is refused */
} bad_case;

static void check_good(const qlm_json_grammar *g, const good_case *cases, int n) {
    for (int i = 0; i < n; i++) {
        qlm_json_matcher *m = qlm_json_matcher_new(g, NULL);
        assert_non_null(m);
        long at = first_refused(m, cases[i].text, strlen(cases[i].text));
        if (at >= 0) fail_msg("'%s' refused at byte %ld", cases[i].text, at);
        if (qlm_json_matcher_complete(m) != cases[i].complete)
            fail_msg("'%s': complete is %d, want %d", cases[i].text, !cases[i].complete, cases[i].complete);
        qlm_json_matcher_free(m);
    }
}

static void check_bad(const qlm_json_grammar *g, const bad_case *cases, int n) {
    for (int i = 0; i < n; i++) {
        qlm_json_matcher *m = qlm_json_matcher_new(g, NULL);
        assert_non_null(m);
        long at = first_refused(m, cases[i].prefix, strlen(cases[i].prefix));
        if (at >= 0) fail_msg("prefix '%s' refused at byte %ld", cases[i].prefix, at);
        if (qlm_json_matcher_allows(m, cases[i].next, 1))
            fail_msg("'%s' then '%s' was taken", cases[i].prefix, cases[i].next);
        /* A refused byte leaves the state as it was. */
        assert_int_equal(qlm_json_matcher_feed(m, cases[i].next, 1), -1);
        assert_int_equal(qlm_json_matcher_allows(m, "", 0), 1);
        qlm_json_matcher_free(m);
    }
}

/* ---- RFC 8259 ---- */

static void test_object_prefixes(void **state) {
    (void)state;
    qlm_json_grammar *g = qlm_json_grammar_object();
    assert_non_null(g);
    static const good_case good[] = {
        {"{}", 1},
        {" \n\t\r{}", 1},
        {"{\"a\":1}", 1},
        {"{ \"a\" : 1 , \"b\" : [ ] }", 1},
        {"{\"a\":[1,2.5,-0.5e+10,0,-0,1E5,1e-5,true,false,null,\"x\",{}]}", 1},
        {"{\"k\":{\"n\":{\"m\":[[],[{}]]}}}", 1},
        {"{\"s\":\"\\u00e9\\ud83d\\ude00\\n\\t\\\"\\\\\\/\\b\\f\\r\\uFFFF\\uE000\\u0000\"}", 1},
        {"{\"u\":\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xED\x9F\xBF\xF4\x8F\xBF\xBF\x7F\"}", 1},
        {"{\"\":\"\"}", 1},
        {"{", 0},
        {"{\"a", 0},
        {"{\"a\":", 0},
        {"{\"a\":1", 0},
        {"{\"a\":-", 0},
        {"{\"a\":1.", 0},
        {"{\"a\":1e", 0},
        {"{\"a\":1e+", 0},
        {"{\"a\":tr", 0},
        {"{\"s\":\"\\u", 0},
        {"{\"s\":\"\\uD83D", 0},
        {"{\"s\":\"\\ud83d\\", 0},
        {"{\"s\":\"\\ud83d\\u", 0},
        {"{\"s\":\"\\ud83d\\uDE0", 0},
        {"{\"s\":\"\xE2\x82", 0},
        {"{\"a\":[1,", 0},
    };
    static const bad_case bad[] = {
        {"", "["}, {"", "\""}, {"", "1"}, {"", "n"}, {"", "}"},
        {"{}", "}"}, {"{}", " "}, {"{}", "\n"}, {"{}", "{"},
        {"{", ","}, {"{", "1"}, {"{", "a"}, {"{\"a\"", "1"}, {"{\"a\":", "}"}, {"{\"a\":1", "\""}, {"{\"a\":1,", "}"},
        {"{\"a\":[1,", "]"}, {"{\"a\":[", ","}, {"{\"a\":[1", "}"}, {"{\"a\":{", "]"},
        {"{\"a\":0", "1"}, {"{\"a\":", "."}, {"{\"a\":", "+"}, {"{\"a\":1.", "e"}, {"{\"a\":1.", "}"}, {"{\"a\":-", "a"},
        {"{\"a\":1e", "}"}, {"{\"a\":1e+", "-"}, {"{\"a\":0", "x"}, {"{\"a\":-0", "0"}, {"{\"a\":1.5", "."},
        {"{\"a\":tru", "x"}, {"{\"a\":", "T"}, {"{\"a\":nul", "}"}, {"{\"a\":true", "e"},
        {"{\"a\":\"", "\x01"}, {"{\"a\":\"", "\n"}, {"{\"a\":\"\\", "x"}, {"{\"a\":\"\\", "U"}, {"{\"a\":\"\\u12", "g"},
        {"{\"a\":\"\\uD", "C"}, {"{\"a\":\"\\ud", "f"}, {"{\"a\":\"\\ud83d", "x"}, {"{\"a\":\"\\ud83d", "\""},
        {"{\"a\":\"\\ud83d\\", "n"}, {"{\"a\":\"\\ud83d\\u", "0"}, {"{\"a\":\"\\ud83d\\uD", "8"},
        {"{\"a\":\"", "\xC0"}, {"{\"a\":\"", "\xC1"}, {"{\"a\":\"", "\xF5"}, {"{\"a\":\"", "\xFF"}, {"{\"a\":\"", "\x80"},
        {"{\"a\":\"\xE0", "\x80"}, {"{\"a\":\"\xED", "\xA0"}, {"{\"a\":\"\xF0", "\x8F"}, {"{\"a\":\"\xF4", "\x90"},
        {"{\"a\":\"\xE2\x82", "\""}, {"{\"a\":\"\xC3", "\xC3"},
        {"{                    ", " "}, {"                    ", "\t"}, {"{\"a\"                    ", "\n"},
    };
    check_good(g, good, (int)(sizeof good / sizeof *good));
    check_bad(g, bad, (int)(sizeof bad / sizeof *bad));

    /* 32 objects nest; a 33rd does not, though an array or a scalar still can't open there either. */
    char deep[400] = "";
    for (int i = 0; i < 31; i++) strcat(deep, "{\"a\":");
    strcat(deep, "{\"a\":");
    qlm_json_matcher *m = qlm_json_matcher_new(g, NULL);
    assert_int_equal(first_refused(m, deep, strlen(deep)), -1);
    assert_false(qlm_json_matcher_allows(m, "{", 1));
    assert_false(qlm_json_matcher_allows(m, "[", 1));
    assert_true(qlm_json_matcher_allows(m, "1}", 2));
    qlm_json_matcher_free(m);
    /* A number is at most 32 bytes, and never left where a digit would be due. */
    m = qlm_json_matcher_new(g, NULL);
    const char *num = "{\"a\":-1234567890123456789012345678901";
    assert_int_equal(first_refused(m, num, strlen(num)), -1);
    assert_false(qlm_json_matcher_allows(m, "0", 1));
    assert_true(qlm_json_matcher_allows(m, "}", 1));
    qlm_json_matcher_free(m);
    m = qlm_json_matcher_new(g, NULL);
    num = "{\"a\":-123456789012345678901234567890";
    assert_int_equal(first_refused(m, num, strlen(num)), -1);
    assert_false(qlm_json_matcher_allows(m, ".", 1));
    assert_true(qlm_json_matcher_allows(m, "1}", 2));
    qlm_json_matcher_free(m);
    qlm_json_grammar_free(g);
}

static void test_completion(void **state) {
    (void)state;
    qlm_json_grammar *g = qlm_json_grammar_object();
    qlm_json_matcher *m = qlm_json_matcher_new(g, NULL);
    assert_false(qlm_json_matcher_complete(m));
    assert_int_equal(qlm_json_matcher_feed(m, "{\"a\":[1]", 8), 0);
    assert_false(qlm_json_matcher_complete(m));
    assert_false(qlm_json_matcher_done(m));
    assert_int_equal(qlm_json_matcher_feed(m, "}", 1), 0);
    assert_true(qlm_json_matcher_complete(m));
    assert_true(qlm_json_matcher_done(m));
    qlm_json_matcher_free(m);
    qlm_json_grammar_free(g);
    /* A number is complete but may go on: end-of-generation may come, generation does not stop. */
    g = schema_grammar("{\"type\":\"number\"}");
    m = qlm_json_matcher_new(g, NULL);
    assert_int_equal(qlm_json_matcher_feed(m, "12", 2), 0);
    assert_true(qlm_json_matcher_complete(m));
    assert_false(qlm_json_matcher_done(m));
    assert_int_equal(qlm_json_matcher_feed(m, "e", 1), 0);
    assert_false(qlm_json_matcher_complete(m));
    assert_int_equal(qlm_json_matcher_feed(m, "5", 1), 0);
    assert_true(qlm_json_matcher_complete(m));
    assert_int_equal(qlm_json_matcher_feed(m, " ", 1), -1);
    qlm_json_matcher_free(m);
    qlm_json_grammar_free(g);
}

/* ---- schemas ---- */

static const char *k_person =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"description\":\"who\"},"
    "\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"a\",\"ab\",\"b\"]},\"maxItems\":2},"
    "\"opt\":{\"type\":[\"boolean\",\"null\"]}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false,\"title\":\"Person\"}";

static void test_schema_prefixes(void **state) {
    (void)state;
    qlm_json_grammar *g = schema_grammar(k_person);
    static const good_case good[] = {
        {"{\"name\":\"x\",\"age\":3}", 1},
        {"{ \"name\" : \"x\" , \"age\" : -30 }", 1},
        {"{\"name\":\"x\",\"age\":3,\"tags\":[\"ab\",\"a\"]}", 1},
        {"{\"name\":\"x\",\"age\":3,\"opt\":null}", 1},
        {"{\"name\":\"x\",\"age\":3,\"tags\":[],\"opt\":false}", 1},
        {"{\"name\":\"x\",\"age\":3,\"tags\":[\"a", 0},
        {"{\"name\":\"x\",\"age\":3", 0},
    };
    static const bad_case bad[] = {
        {"", "["}, {"{", "}"}, {"{\"", "a"}, {"{\"name\":\"x\"", "}"}, {"{\"name\":", "1"},
        {"{\"name\":\"x\",\"age\":1", "."}, {"{\"name\":\"x\",\"age\":1", "e"}, {"{\"name\":\"x\",\"age\":", "\""},
        {"{\"name\":\"x\",\"age\":1,\"tags\":[\"", "c"}, {"{\"name\":\"x\",\"age\":1,\"tags\":[\"ab", "c"},
        {"{\"name\":\"x\",\"age\":1,\"tags\":[\"a\",\"b\"", ","}, {"{\"name\":\"x\",\"age\":1,\"", "z"},
        {"{\"name\":\"x\",\"age\":1,\"tags\":[],\"", "n"}, {"{\"name\":\"x\",\"age\":1,\"opt\":", "1"},
        {"{\"name\":\"x\",\"age\":1,\"opt\":null", ","},
    };
    check_good(g, good, (int)(sizeof good / sizeof *good));
    check_bad(g, bad, (int)(sizeof bad / sizeof *bad));
    qlm_json_grammar_free(g);
    g = schema_grammar("{\"enum\":[1,12,1.5,\"a\\\"b\",null,{\"k\":[true]}]}");
    static const good_case enums[] = {{"1", 1}, {"12", 1}, {"1.5", 1}, {"1.", 0}, {"\"a\\\"b\"", 1}, {"null", 1},
                                      {"{\"k\":[true]}", 1}, {" 1", 1}};
    static const bad_case enums_bad[] = {{"1", "3"}, {"12", "0"}, {"\"a", "b"}, {"", "2"}, {"{", " "}, {"1", " "}};
    check_good(g, enums, (int)(sizeof enums / sizeof *enums));
    check_bad(g, enums_bad, (int)(sizeof enums_bad / sizeof *enums_bad));
    qlm_json_grammar_free(g);
    /* anyOf: alternatives that share a prefix are followed side by side. */
    g = schema_grammar("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},"
                       "\"required\":[\"k\",\"x\"]},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"b\"},"
                       "\"y\":{\"type\":\"string\"}},\"required\":[\"k\",\"y\"]},{\"type\":\"null\"}]}");
    static const good_case alts[] = {{"{\"k\":\"a\",\"x\":1}", 1}, {"{\"k\":\"b\",\"y\":\"s\"}", 1}, {"null", 1}};
    static const bad_case alts_bad[] = {{"{\"k\":\"a\",\"", "y"}, {"{\"k\":\"b\",\"", "x"}, {"", "\""}, {"{\"k\":\"", "c"}};
    check_good(g, alts, (int)(sizeof alts / sizeof *alts));
    check_bad(g, alts_bad, (int)(sizeof alts_bad / sizeof *alts_bad));
    qlm_json_grammar_free(g);
    /* minItems, a dictionary (additionalProperties as a schema), true as a schema. */
    g = schema_grammar("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"array\",\"items\":true,\"minItems\":2}}");
    static const good_case dict[] = {{"{\"any key\":[1,\"x\"],\"\":[{},[]]}", 1}, {"{}", 1}};
    static const bad_case dict_bad[] = {{"{\"a\":[1", "]"}, {"{\"a\":", "1"}, {"{\"a\":[", "]"}, {"{\"a\":[1,2]", "]"}};
    check_good(g, dict, (int)(sizeof dict / sizeof *dict));
    check_bad(g, dict_bad, (int)(sizeof dict_bad / sizeof *dict_bad));
    qlm_json_grammar_free(g);
}

typedef struct {
    const char *schema;
    const char *say[2]; /* what the message must mention: the keyword, the place */
} error_case;

static void test_schema_errors(void **state) {
    (void)state;
    static const error_case cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"x\"}", {"'pattern'", "at # "}},
        {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1}}}",
         {"'minLength'", "#/properties/name "}},
        {"{\"properties\":{\"a/b~\":{\"format\":\"date\"}}}", {"'format'", "#/properties/a~1b~0 "}},
        {"{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/x\"},\"$defs\":{\"x\":{}}}", {"'$ref'", "#/items "}},
        {"{\"anyOf\":[{\"type\":\"string\"},{\"oneOf\":[]}]}", {"'oneOf'", "#/anyOf/1 "}},
        {"{\"type\":\"strange\"}", {"'type'", "strange"}},
        {"{\"type\":[]}", {"'type'", "#"}},
        {"{\"type\":\"object\",\"required\":[\"x\"]}", {"'required'", "'x'"}},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", {"'minItems'", "'maxItems'"}},
        {"{\"type\":\"array\",\"minItems\":-1}", {"'minItems'", "#"}},
        {"{\"type\":\"array\",\"maxItems\":1.5}", {"'maxItems'", "#"}},
        {"{\"type\":\"array\",\"minItems\":5000}", {"'minItems'", "1024"}},
        {"{\"enum\":[]}", {"'enum'", "#"}},
        {"{\"enum\":[\"a\"],\"type\":\"integer\"}", {"'enum'", "'type'"}},
        {"{\"enum\":[\"a\"],\"items\":{}}", {"'items'", "'enum'"}},
        {"{\"const\":1,\"enum\":[1]}", {"'const'", "'enum'"}},
        {"{\"anyOf\":[],\"title\":\"t\"}", {"'anyOf'", "#"}},
        {"{\"anyOf\":[{}],\"type\":\"object\"}", {"'type'", "'anyOf'"}},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", {"'items'", "tuple"}},
        {"{\"type\":\"object\",\"properties\":{\"a\":false}}", {"#/properties/a", "object"}},
        {"{\"type\":\"object\",\"additionalProperties\":1}", {"'additionalProperties'", "#"}},
        {"{\"type\":\"array\",\"uniqueItems\":true}", {"'uniqueItems'", "#"}},
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"oneOf\":[{}]}}}", {"'oneOf'", "#/properties/x "}},
        {"[]", {"schema", "#"}},
        {"{\"const\":\"\xff\"}", {"'const'", "UTF-8"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *s = cJSON_Parse(cases[i].schema);
        assert_non_null(s);
        qlm_json_grammar *g = qlm_json_grammar_schema(s);
        cJSON_Delete(s);
        if (g) fail_msg("accepted: %s", cases[i].schema);
        for (int k = 0; k < 2; k++)
            if (!strstr(qlm_last_error(), cases[i].say[k]))
                fail_msg("%s: '%s' does not mention %s", cases[i].schema, qlm_last_error(), cases[i].say[k]);
    }
}

/* Bounds on untrusted schemas: nesting, depth, size. */
static void test_schema_bounds(void **state) {
    (void)state;
    char *text = malloc(200000);
    /* 32 arrays nest, 33 do not. */
    for (int n = 32; n <= 33; n++) {
        text[0] = 0;
        for (int i = 0; i < n; i++) strcat(text, "{\"type\":\"array\",\"items\":");
        strcat(text, "{\"type\":\"integer\"}");
        for (int i = 0; i < n; i++) strcat(text, "}");
        cJSON *s = cJSON_Parse(text);
        qlm_json_grammar *g = qlm_json_grammar_schema(s);
        cJSON_Delete(s);
        if (n == 32) {
            assert_non_null(g);
            qlm_json_matcher *m = qlm_json_matcher_new(g, NULL);
            char doc[100] = "";
            for (int i = 0; i < 32; i++) strcat(doc, "[");
            strcat(doc, "7");
            for (int i = 0; i < 32; i++) strcat(doc, "]");
            assert_int_equal(first_refused(m, doc, strlen(doc)), -1);
            assert_true(qlm_json_matcher_done(m));
            qlm_json_matcher_free(m);
            qlm_json_grammar_free(g);
        } else {
            assert_null(g);
            assert_non_null(strstr(qlm_last_error(), "nest deeper than 32"));
        }
    }
    /* anyOf inside anyOf, 100 deep. */
    text[0] = 0;
    for (int i = 0; i < 100; i++) strcat(text, "{\"anyOf\":[");
    strcat(text, "{}");
    for (int i = 0; i < 100; i++) strcat(text, "]}");
    cJSON *s = cJSON_Parse(text);
    assert_null(qlm_json_grammar_schema(s));
    assert_non_null(strstr(qlm_last_error(), "deeper than 64"));
    cJSON_Delete(s);
    /* 65 properties; an enum of 70,000 bytes. */
    strcpy(text, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 65; i++) sprintf(text + strlen(text), "%s\"p%d\":{}", i ? "," : "", i);
    strcat(text, "}}");
    s = cJSON_Parse(text);
    assert_null(qlm_json_grammar_schema(s));
    assert_non_null(strstr(qlm_last_error(), "'properties'"));
    cJSON_Delete(s);
    strcpy(text, "{\"enum\":[");
    for (int i = 0; i < 7000; i++) sprintf(text + strlen(text), "%s\"%05d-abcdefghij\"", i ? "," : "", i);
    strcat(text, "]}");
    s = cJSON_Parse(text);
    assert_null(qlm_json_grammar_schema(s));
    assert_non_null(strstr(qlm_last_error(), "exceed"));
    cJSON_Delete(s);
    free(text);
}

/* ---- a validator for the supported subset, independent of the compiler ---- */

static int validate(const cJSON *v, const cJSON *s);

static int type_ok(const cJSON *v, const char *t) {
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    return !strcmp(t, "null") && cJSON_IsNull(v);
}

static int object_ok(const cJSON *v, const cJSON *s) {
    const cJSON *props = cJSON_GetObjectItem(s, "properties"), *extra = cJSON_GetObjectItem(s, "additionalProperties");
    const cJSON *r, *f;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(s, "required")) if (!cJSON_GetObjectItem(v, r->valuestring)) return 0;
    cJSON_ArrayForEach(f, v) {
        const cJSON *p = props ? cJSON_GetObjectItem(props, f->string) : NULL;
        if (p ? !validate(f, p) : cJSON_IsFalse(extra) || (cJSON_IsObject(extra) && !validate(f, extra))) return 0;
    }
    return 1;
}

static int array_ok(const cJSON *v, const cJSON *s) {
    const cJSON *items = cJSON_GetObjectItem(s, "items"), *mn = cJSON_GetObjectItem(s, "minItems");
    const cJSON *mx = cJSON_GetObjectItem(s, "maxItems"), *e;
    int n = cJSON_GetArraySize(v);
    if ((mn && n < mn->valueint) || (mx && n > mx->valueint)) return 0;
    cJSON_ArrayForEach(e, v) if (items && !validate(e, items)) return 0;
    return 1;
}

static int validate(const cJSON *v, const cJSON *s) {
    if (cJSON_IsTrue(s)) return 1;
    const cJSON *any = cJSON_GetObjectItem(s, "anyOf"), *en = cJSON_GetObjectItem(s, "enum");
    const cJSON *co = cJSON_GetObjectItem(s, "const"), *t = cJSON_GetObjectItem(s, "type"), *e;
    if (any) {
        cJSON_ArrayForEach(e, any) if (validate(v, e)) return 1;
        return 0;
    }
    if (co && !cJSON_Compare(v, co, 1)) return 0;
    if (en) {
        int found = 0;
        cJSON_ArrayForEach(e, en) found |= cJSON_Compare(v, e, 1);
        if (!found) return 0;
    }
    if (cJSON_IsString(t) && !type_ok(v, t->valuestring)) return 0;
    if (cJSON_IsArray(t)) {
        int ok = 0;
        cJSON_ArrayForEach(e, t) ok |= type_ok(v, e->valuestring);
        if (!ok) return 0;
    }
    if (cJSON_IsObject(v) && !object_ok(v, s)) return 0;
    return !cJSON_IsArray(v) || array_ok(v, s);
}

/* Parses a whole document as a client would (nothing may follow the value). */
static cJSON *parse_all(const char *text) {
    const char *end = NULL;
    return cJSON_ParseWithOpts(text, &end, 1);
}

/* ---- random walks ---- */

static uint64_t g_rng;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 11);
}

/* Bytes that close things are likelier, so that walks end. */
static int byte_weight(int b) { return b == '"' || b == '}' || b == ']' ? 40 : b == ',' || b == ':' ? 4 : 1; }

static const char *k_walk_schemas[] = {
    NULL, /* json_object */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}",
    NULL, /* k_person */
    "{\"anyOf\":[{\"type\":\"array\",\"items\":{\"type\":[\"number\",\"null\"]},\"minItems\":1,\"maxItems\":4},"
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":{\"const\":[1,\"x\"]}},"
    "\"required\":[\"b\"]},\"c\":{\"type\":\"boolean\"}},\"required\":[\"c\"]},{\"type\":\"string\"}]}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}",
};

enum { N_WALK_GRAMMARS = sizeof k_walk_schemas / sizeof *k_walk_schemas };

static qlm_json_grammar *walk_grammar(int k, cJSON **schema) {
    const char *text = k == 0 ? "{\"type\":\"object\"}" : k == 2 ? k_person : k_walk_schemas[k];
    *schema = cJSON_Parse(text);
    return k == 0 ? qlm_json_grammar_object() : schema_grammar(text);
}

/* Byte walks: every allowed byte is a valid next byte (checked by completing the walk), and the
 * end is a document cJSON parses and the schema accepts. For json_object, cJSON parses a prefix
 * exactly when the matcher calls it complete. */
static void test_random_byte_walks(void **state) {
    (void)state;
    g_rng = 0x5eed1234ULL;
    char *doc = malloc(1 << 16);
    for (int k = 0; k < N_WALK_GRAMMARS; k++) {
        cJSON *schema;
        qlm_json_grammar *g = walk_grammar(k, &schema);
        for (int w = 0; w < 150; w++) {
            qlm_json_matcher *m = qlm_json_matcher_new(g, NULL);
            size_t n = 0;
            for (;;) {
                doc[n] = 0;
                int complete = qlm_json_matcher_complete(m);
                if (k == 0) {
                    cJSON *p = parse_all(doc);
                    if ((p != NULL) != complete) fail_msg("complete %d but cJSON %s '%s'", complete, p ? "parses" : "fails", doc);
                    cJSON_Delete(p);
                }
                if (complete && (qlm_json_matcher_done(m) || rnd() % 2)) break;
                int weight[256], total = 0;
                for (int b = 1; b < 256; b++) {
                    char c = (char)b;
                    weight[b] = qlm_json_matcher_allows(m, &c, 1) ? byte_weight(b) : 0;
                    total += weight[b];
                }
                if (!total) fail_msg("dead end after '%s'", doc);
                int r = (int)(rnd() % (uint32_t)total), b = 1;
                while (r >= weight[b]) r -= weight[b++];
                doc[n++] = (char)b;
                assert_int_equal(qlm_json_matcher_feed(m, &doc[n - 1], 1), 0);
                assert_true(n < (1 << 16) - 1);
            }
            cJSON *v = parse_all(doc);
            if (!v) fail_msg("walk %d of schema %d: cJSON refuses '%s'", w, k, doc);
            if (!validate(v, schema)) fail_msg("walk %d of schema %d: invalid under the schema: '%s'", w, k, doc);
            if (k == 0) assert_true(cJSON_IsObject(v));
            cJSON_Delete(v);
            qlm_json_matcher_free(m);
        }
        cJSON_Delete(schema);
        qlm_json_grammar_free(g);
    }
    free(doc);
}

/* ---- token masks ---- */

typedef struct {
    const char **bytes;
    int *lens;
    int n;
} toy_vocab;

/* Single bytes, multi-byte runs that cross JSON's boundaries, partial UTF-8, and an EOS. */
static toy_vocab toy(void) {
    static const char *multi[] = {"{\"", "\":", "\",", "\"}", " \"", "{\n  \"", "true", "null", "12", ".5", "e+",
                                  "\\u", "\\ud83d", "\\ude00", "\xC3\xA9", "\xC3", "\xA9", "\xF0\x9F\x98\x80",
                                  "\xF0\x9F", "\x98\x80", "\"name\"", "\"age\":", "\"tags\":[\"", "\"]}", "}}", "]]",
                                  "  ", "    ", "\n", "\"red\"", "red", "\"}\n", "1,", ", \"", "false}", "\":\"",
                                  "[{", "0.0", "-1", "x\"", "ab", "\"\"", "\\\"", "\\n"};
    int n_multi = (int)(sizeof multi / sizeof *multi), n = 0;
    toy_vocab v = {malloc((size_t)(256 + n_multi + 1) * sizeof(char *)), malloc((size_t)(256 + n_multi + 1) * sizeof(int)), 0};
    static char singles[256];
    for (int b = 0; b < 256; b++) {
        singles[b] = (char)b;
        v.bytes[n] = &singles[b];
        v.lens[n++] = 1;
    }
    for (int i = 0; i < n_multi; i++) {
        v.bytes[n] = multi[i];
        v.lens[n++] = (int)strlen(multi[i]);
    }
    v.bytes[n] = "</s>"; /* EOS: spelled as text, yet only ever the end */
    v.lens[n++] = 4;
    v.n = n;
    return v;
}

/* The mask equals, token by token, whether the token's bytes feed (EOS: whether complete). */
static void check_mask(qlm_json_matcher *m, const char *const *bytes, const int *lens, int n, int eos) {
    const uint64_t *ok = qlm_json_matcher_allowed(m);
    for (int id = 0; id < n; id++) {
        int want = id == eos ? qlm_json_matcher_complete(m)
                             : lens[id] > 0 && lens[id] <= 255 && qlm_json_matcher_allows(m, bytes[id], (size_t)lens[id]);
        int got = (int)(ok[id / 64] >> (id % 64) & 1);
        if (got != want) fail_msg("token %d ('%.*s'): mask %d, brute force %d", id, lens[id] > 0 ? lens[id] : 0, bytes[id], got, want);
    }
}

/* Whether token id may be picked: allowed, not EOS, and when closing it opens nothing and (strict)
 * closes something. */
static int acceptable(const uint64_t *ok, const char *const *bytes, const int *lens, int id, int eos, int closing,
                      int strict) {
    if (!(ok[id / 64] >> (id % 64) & 1) || id == eos) return 0;
    if (!closing) return 1;
    const char *s = bytes[id];
    size_t l = (size_t)lens[id];
    if (memchr(s, '{', l) || memchr(s, '[', l)) return 0;
    return !strict || memchr(s, '"', l) || memchr(s, '}', l) || memchr(s, ']', l);
}

/* An allowed token at random; when closing, EOS if allowed, else one that closes things. Random
 * ids are tried first (most of a vocabulary is allowed inside a string), then all are scanned. */
static int pick_token(const uint64_t *ok, const char *const *bytes, const int *lens, int n, int closing, int eos) {
    if (closing && eos >= 0 && ok[eos / 64] >> (eos % 64) & 1) return eos;
    for (int tries = 0; tries < 256; tries++) {
        int id = (int)(rnd() % (uint32_t)n);
        if (acceptable(ok, bytes, lens, id, eos, closing, 1)) return id;
    }
    /* Then anything allowed: a required array must still open. */
    int *cand = malloc((size_t)n * sizeof *cand), k = 0, pick = -1;
    for (int level = 0; level < 3 && !k; level++)
        for (int id = 0; id < n; id++)
            if (acceptable(ok, bytes, lens, id, eos, closing && level < 2, level == 0)) cand[k++] = id;
    if (k) pick = cand[rnd() % (uint32_t)k];
    free(cand);
    return pick;
}

/* Token walks over a vocabulary with the first n_grammars of k_walk_schemas: each step's mask
 * against brute force (for the first check_steps steps), each chosen token's bytes feed, and the
 * end parses and validates. Returns the seconds the masks took and counts them in *n_masks. */
static double token_walks(const qlm_json_vocab *v, const char *const *bytes, const int *lens, int n, int eos,
                          int n_grammars, int walks, int check_steps, int *n_masks) {
    double mask_s = 0;
    char *doc = malloc(1 << 20);
    for (int k = 0; k < n_grammars; k++) {
        cJSON *schema;
        qlm_json_grammar *g = walk_grammar(k, &schema);
        for (int w = 0; w < walks; w++) {
            qlm_json_matcher *m = qlm_json_matcher_new(g, v);
            size_t len = 0;
            int ended = 0;
            for (int step = 0; step < 4000 && !ended; step++) {
                if (step < check_steps) check_mask(m, bytes, lens, n, eos);
                double t0 = qlm_now_s();
                const uint64_t *ok = qlm_json_matcher_allowed(m);
                mask_s += qlm_now_s() - t0;
                (*n_masks)++;
                int id = pick_token(ok, bytes, lens, n, step > 40, eos);
                if (id < 0) fail_msg("no token allowed after '%.*s'", (int)len, doc);
                if (id == eos) break;
                assert_int_equal(qlm_json_matcher_feed(m, bytes[id], (size_t)lens[id]), 0);
                memcpy(doc + len, bytes[id], (size_t)lens[id]);
                len += (size_t)lens[id];
                ended = qlm_json_matcher_done(m);
            }
            doc[len] = 0;
            assert_true(qlm_json_matcher_complete(m));
            cJSON *val = parse_all(doc);
            if (!val) fail_msg("token walk %d of schema %d: cJSON refuses '%s'", w, k, doc);
            if (!validate(val, schema)) fail_msg("token walk %d of schema %d: invalid: '%s'", w, k, doc);
            cJSON_Delete(val);
            qlm_json_matcher_free(m);
        }
        cJSON_Delete(schema);
        qlm_json_grammar_free(g);
    }
    free(doc);
    return mask_s;
}

static void test_toy_vocabulary_masks(void **state) {
    (void)state;
    g_rng = 0xfeedULL;
    toy_vocab t = toy();
    int eos = t.n - 1, n_masks = 0;
    qlm_json_grammar *object = qlm_json_grammar_object();
    qlm_json_vocab *v = qlm_json_vocab_new(t.bytes, t.lens, t.n, &eos, 1);
    assert_non_null(v);
    assert_int_equal(qlm_json_vocab_check(v, object), 0);
    token_walks(v, t.bytes, t.lens, t.n, eos, N_WALK_GRAMMARS, 60, 4000, &n_masks);
    qlm_json_vocab_free(v);
    /* Only the single bytes the check asks for: it passes for json_object, whose walks then never
     * run out of tokens; a schema's keys and values need more ("b" of its enum, the first missing). */
    for (int b = 0; b < 256; b++)
        t.lens[b] = (b >= 0x80 && b < 0xC0) || (b && strchr("{}[],:\"\\0123456789truefalsncd", b));
    v = qlm_json_vocab_new(t.bytes, t.lens, t.n, &eos, 1);
    assert_int_equal(qlm_json_vocab_check(v, object), 0);
    token_walks(v, t.bytes, t.lens, t.n, eos, 1, 60, 0, &n_masks);
    qlm_json_grammar *person = schema_grammar(k_person);
    assert_int_equal(qlm_json_vocab_check(v, person), -1);
    assert_non_null(strstr(qlm_last_error(), "'b'"));
    qlm_json_grammar_free(person);
    qlm_json_vocab_free(v);
    /* Without a token for '{' nothing can start: the check says which byte is missing. */
    t.lens['{'] = 0;
    v = qlm_json_vocab_new(t.bytes, t.lens, t.n, &eos, 1);
    assert_int_equal(qlm_json_vocab_check(v, object), -1);
    assert_non_null(strstr(qlm_last_error(), "'{'"));
    qlm_json_vocab_free(v);
    qlm_json_grammar_free(object);
    free(t.bytes);
    free(t.lens);
}

/* ---- the real vocabulary of the default model ---- */

typedef struct {
    qlm_source src;
    const char **bytes;
    int *lens, n;
    char *text;
} real_vocab;

static void open_real(real_vocab *r) {
    char path[512];
    test_default_gguf(path, sizeof path);
    REQUIRE_ASSET(path);
    if (qlm_source_open(&r->src, path, NULL) != 0) fail_msg("%s", qlm_last_error());
    r->n = qlm_tokenizer_vocab_size(r->src.tok);
    r->bytes = malloc((size_t)r->n * sizeof *r->bytes);
    r->lens = malloc((size_t)r->n * sizeof *r->lens);
    r->text = malloc((size_t)r->n * 256);
    int after = qlm_tokenizer_bos(r->src.tok) == 0 ? 1 : 0;
    for (int id = 0; id < r->n; id++) {
        r->bytes[id] = r->text + (size_t)id * 256;
        r->lens[id] = qlm_tokenizer_piece(r->src.tok, after, id, r->text + (size_t)id * 256, 256);
    }
}

static void close_real(real_vocab *r) {
    free(r->bytes);
    free(r->lens);
    free(r->text);
    qlm_source_close(&r->src);
}

/* SmolLM2's 49,152 tokens: masks equal brute force, walks end valid, and the mask's cost. */
static void test_real_vocabulary_masks(void **state) {
    (void)state;
    real_vocab r;
    open_real(&r);
    g_rng = 0xabcdefULL;
    double t0 = qlm_now_s();
    qlm_json_vocab *v = qlm_json_vocab_from_tokenizer(r.src.tok);
    double build_s = qlm_now_s() - t0;
    assert_non_null(v);
    qlm_json_grammar *object = qlm_json_grammar_object(), *rare = schema_grammar("{\"const\":\"\xF1\x80\x80\x80\"}");
    assert_int_equal(qlm_json_vocab_check(v, object), 0);
    /* SmolLM2 has no token for the lead byte of U+40000 (its training text never had one). */
    assert_int_equal(qlm_json_vocab_check(v, rare), -1);
    assert_non_null(strstr(qlm_last_error(), "0xF1"));
    qlm_json_grammar_free(object);
    qlm_json_grammar_free(rare);
    int eos = qlm_tokenizer_eos(r.src.tok), n_masks = 0;
    assert_true(qlm_tokenizer_is_eog(r.src.tok, eos));
    /* Special tokens spell nothing inside a text: never allowed. */
    int im_start = qlm_tokenizer_find(r.src.tok, "<|im_start|>");
    assert_true(im_start >= 0);
    assert_int_equal(r.lens[im_start], 0);
    token_walks(v, r.bytes, r.lens, r.n, eos, N_WALK_GRAMMARS, 1, 30, &n_masks);
    n_masks = 0;
    double mask_s = token_walks(v, r.bytes, r.lens, r.n, eos, N_WALK_GRAMMARS, 6, 0, &n_masks);
    print_message("json mask over %d tokens: %.1f us per token (%d masks); index built in %.1f ms\n", r.n,
                  mask_s / n_masks * 1e6, n_masks, build_s * 1e3);
    qlm_json_vocab_free(v);
    close_real(&r);
}

/* The token stream applies the mask before sampling, reports the model's own log-probabilities,
 * and ends with "complete" once the object is closed. */
typedef struct {
    int n, top_is_x;
    float chosen_lp;
} lp_log;

static void on_lp(void *user, qlm_token_logprob chosen, const qlm_token_logprob *top, int n_top) {
    lp_log *l = user;
    (void)chosen;
    if (l->n++ == 0) l->top_is_x = n_top > 0 && top[0].logprob > -0.01f;
    if (l->n == 1) l->chosen_lp = chosen.logprob;
}

static int sink(void *user, const char *text, size_t len) {
    char *out = user;
    strncat(out, text, len);
    return 0;
}

static void test_token_stream_constrained(void **state) {
    (void)state;
    real_vocab r;
    open_real(&r);
    qlm_json_vocab *v = qlm_json_vocab_from_tokenizer(r.src.tok);
    qlm_json_grammar *g = qlm_json_grammar_object();
    int x = qlm_tokenizer_find(r.src.tok, "x"), open = qlm_tokenizer_find(r.src.tok, "{"),
        close = qlm_tokenizer_find(r.src.tok, "}"), eos = qlm_tokenizer_eos(r.src.tok), vocab = r.n;
    assert_true(x >= 0 && open >= 0 && close >= 0);
    lp_log log = {0};
    qlm_gen_params p = {.max_new_tokens = 64, .on_logprob = on_lp, .logprob_user = &log, .top_logprobs = 1,
                        .json = g, .json_vocab = v};
    p.sampling = qlm_sampling_defaults();
    p.sampling.temperature = 0;
    qlm_gen_stats st;
    qlm_token_stream ts;
    char out[4096] = "";
    assert_int_equal(qlm_token_stream_init(&ts, r.src.tok, &p, vocab, -1, sink, out, &st), 0);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    int rc, id, steps = 0;
    /* The model wants "x" (no JSON), then the end of text, then "}" (no start), then "{". */
    do {
        for (int i = 0; i < vocab; i++)
            logits[i] = i == x ? 30.0f : i == eos ? 20.0f : i == close ? 10.0f : i == open ? 5.0f : 0.0f;
        rc = qlm_token_stream_next(&ts, logits, NULL, 0, &id);
    } while (rc == 0 && ++steps < 64);
    assert_int_equal(rc, 1);
    qlm_token_stream_finish(&ts);
    assert_int_equal(st.reason, QLM_STOP_COMPLETE);
    assert_string_equal(out, "{}");
    cJSON *j = parse_all(out);
    if (!j || !cJSON_IsObject(j)) fail_msg("not an object: '%s'", out);
    cJSON_Delete(j);
    /* The first token's log-probability is the model's: "x" is its top choice at ~0, and the
     * token the mask let through is far less likely. */
    assert_true(log.top_is_x);
    assert_true(log.chosen_lp < -5);
    assert_true(st.constraint_seconds > 0);
    free(logits);
    qlm_json_grammar_free(g);
    qlm_json_vocab_free(v);
    close_real(&r);
}

/* A token masked to -inf is never sampled, not even when r lands past the candidates' total as
 * floats add it up (the sampler fell back to its last candidate, here the masked one). */
static void test_masked_never_sampled(void **state) {
    (void)state;
    enum { V = 20000, DRAWS = 6000 };
    qlm_sampling p = qlm_sampling_defaults();
    p.temperature = 1, p.top_k = 0, p.top_p = 1, p.seed = 42;
    qlm_sampler s;
    assert_int_equal(qlm_sampler_init(&s, &p, V), 0);
    float *logits = malloc(V * sizeof *logits);
    int masked = 0;
    for (int r = 0; r < DRAWS; r++) {
        /* Two likely tokens, then many whose probabilities are each below half a float step at the
         * running total, so that it ends short of 1; the last token is masked. */
        for (int i = 0; i < V; i++) logits[i] = i < 2 ? 0.0f : i < V - 1 ? -16.7f : -INFINITY;
        masked += qlm_sampler_sample(&s, logits, NULL, 0, 0) == V - 1;
    }
    assert_int_equal(masked, 0);
    free(logits);
    qlm_sampler_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_object_prefixes),
        cmocka_unit_test(test_completion),
        cmocka_unit_test(test_schema_prefixes),
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_schema_bounds),
        cmocka_unit_test(test_random_byte_walks),
        cmocka_unit_test(test_toy_vocabulary_masks),
        cmocka_unit_test(test_real_vocabulary_masks),
        cmocka_unit_test(test_token_stream_constrained),
        cmocka_unit_test(test_masked_never_sampled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
