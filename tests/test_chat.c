/* Chat rendering against transformers' apply_chat_template renders of the same templates
 * (tests/fixtures/chat/chat_cases.json from tools/make_tokenizer_fixtures.py), the family
 * detection, the plain fallback and invalid conversations. */
#include "test_util.h"

#include <cjson/cJSON.h>

#include "core/chat.h"
#include "core/error.h"
#include "core/tokenizer.h"

static cJSON *load_cases(void) {
    char *json = test_read_file("tests/fixtures/chat/chat_cases.json", NULL);
    assert_non_null(json);
    cJSON *root = cJSON_Parse(json);
    free(json);
    assert_non_null(root);
    return root;
}

/* Renders one fixture case with tmpl (the case's own template when NULL). */
static char *render_case(const cJSON *c, const char *tmpl) {
    const cJSON *msgs = cJSON_GetObjectItem(c, "messages"), *m;
    qlm_chat_message list[16];
    int n = 0;
    cJSON_ArrayForEach(m, msgs) {
        assert_true(n < 16);
        list[n].role = cJSON_GetObjectItem(m, "role")->valuestring;
        list[n].content = cJSON_GetObjectItem(m, "content")->valuestring;
        n++;
    }
    if (!tmpl) tmpl = cJSON_GetObjectItem(c, "template")->valuestring;
    char *out = NULL;
    int rc = qlm_chat_render(tmpl, list, n, cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                             cJSON_GetObjectItem(c, "bos")->valuestring, cJSON_GetObjectItem(c, "eos")->valuestring, &out);
    if (rc != 0) fail_msg("%s: %s", cJSON_GetObjectItem(c, "name")->valuestring, qlm_last_error());
    return out;
}

static void test_matches_transformers(void **state) {
    (void)state;
    cJSON *root = load_cases();
    const cJSON *c;
    int n = 0, families[5] = {0};
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        const char *tmpl = cJSON_GetObjectItem(c, "template")->valuestring;
        qlm_chat_family f = qlm_chat_detect(tmpl);
        assert_string_equal(qlm_chat_family_name(f), cJSON_GetObjectItem(c, "family")->valuestring);
        families[f]++;
        char *out = render_case(c, NULL);
        const char *want = cJSON_GetObjectItem(c, "expected")->valuestring;
        if (strcmp(out, want) != 0) fail_msg("%s:\n got: \"%s\"\nwant: \"%s\"", name, out, want);
        free(out);
        n++;
    }
    assert_int_equal(n, 36);
    assert_int_equal(families[QLM_CHAT_PLAIN], 0);
    for (int f = QLM_CHAT_CHATML; f <= QLM_CHAT_LLAMA3; f++) assert_true(families[f] >= 6);
    cJSON_Delete(root);
}

/* SmolLM2 inserts its default system prompt when the conversation has none. */
static void test_chatml_default_system(void **state) {
    (void)state;
    cJSON *root = load_cases();
    const cJSON *c;
    int checked = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        if (strcmp(cJSON_GetObjectItem(c, "name")->valuestring, "smollm2/no_system_multi/gen1") != 0) continue;
        static const char head[] = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                                   "Hugging Face<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n";
        char *out = render_case(c, NULL);
        assert_memory_equal(out, head, sizeof(head) - 1);
        free(out);
        checked++;
    }
    assert_int_equal(checked, 1);
    cJSON_Delete(root);
}

/* The template TinyLlama's tokenizer_config.json carries, loaded through the tokenizer. */
static void test_template_from_tokenizer_config(void **state) {
    (void)state;
    char path[512];
    REQUIRE_ASSET(test_asset(path, sizeof(path), "tinyllama-1.1b-chat-v1.0-tokenizer/tokenizer.json"));
    qlm_tokenizer *t = qlm_tokenizer_load_json(path, NULL);
    assert_non_null(t);
    const char *tmpl = qlm_tokenizer_chat_template(t);
    assert_int_equal(qlm_chat_detect(tmpl), QLM_CHAT_ZEPHYR);
    cJSON *root = load_cases();
    const cJSON *c;
    int checked = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        if (strncmp(cJSON_GetObjectItem(c, "name")->valuestring, "tinyllama/", 10) != 0) continue;
        char *out = render_case(c, tmpl);
        assert_string_equal(out, cJSON_GetObjectItem(c, "expected")->valuestring);
        free(out);
        checked++;
    }
    assert_int_equal(checked, 6);
    cJSON_Delete(root);
    qlm_tokenizer_free(t);
}

static void test_plain_fallback(void **state) {
    (void)state;
    const qlm_chat_message msgs[] = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"tool", "42"}};
    char *out = NULL;
    assert_int_equal(qlm_chat_detect(NULL), QLM_CHAT_PLAIN);
    assert_int_equal(qlm_chat_detect("{{ messages }}"), QLM_CHAT_PLAIN);
    assert_string_equal(qlm_chat_family_name(QLM_CHAT_PLAIN), "plain");
    assert_int_equal(qlm_chat_render(NULL, msgs, 4, 1, "<s>", "</s>", &out), 0);
    assert_string_equal(out, "System: Be brief.\nUser: Hi\nAssistant: Hello.\ntool: 42\nAssistant: ");
    free(out);
    assert_int_equal(qlm_chat_render("{% for m in messages %}{{ m.content }}{% endfor %}", msgs + 1, 1, 0, NULL, NULL, &out), 0);
    assert_string_equal(out, "User: Hi\n");
    free(out);
    assert_int_equal(qlm_chat_render(NULL, NULL, 0, 1, NULL, NULL, &out), 0);
    assert_string_equal(out, "Assistant: ");
    free(out);
}

static void test_invalid_conversations(void **state) {
    (void)state;
    cJSON *root = load_cases();
    const char *llama2 = NULL;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        if (strcmp(cJSON_GetObjectItem(c, "family")->valuestring, "llama2") == 0)
            llama2 = cJSON_GetObjectItem(c, "template")->valuestring;
    }
    assert_non_null(llama2);
    const qlm_chat_message twice[] = {{"user", "a"}, {"user", "b"}};
    char *out = NULL;
    assert_int_equal(qlm_chat_render(llama2, twice, 2, 1, "<s>", "</s>", &out), -1);
    assert_non_null(strstr(qlm_last_error(), "alternate"));
    const qlm_chat_message missing[] = {{"user", NULL}};
    assert_int_equal(qlm_chat_render(llama2, missing, 1, 1, "<s>", "</s>", &out), -1);
    assert_int_equal(qlm_chat_render(llama2, NULL, 1, 1, "<s>", "</s>", &out), -1);
    assert_int_equal(qlm_chat_render(llama2, twice, 1, 1, "<s>", "</s>", NULL), -1);
    cJSON_Delete(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_transformers),
        cmocka_unit_test(test_chatml_default_system),
        cmocka_unit_test(test_template_from_tokenizer_config),
        cmocka_unit_test(test_plain_fallback),
        cmocka_unit_test(test_invalid_conversations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
