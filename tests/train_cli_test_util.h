/* What the end-to-end training tests share: their data (prompt/completion pairs cut from
 * TinyStories) and the crash-safety check of checkpoints. */
#ifndef QLM_TRAIN_CLI_TEST_UTIL_H
#define QLM_TRAIN_CLI_TEST_UTIL_H

#include <cjson/cJSON.h>

#include "../core/error.h"
#include "../loaders/safetensors.h"
#include "test_util.h"

/* Writes `count` JSONL prompt/completion pairs to path: a TinyStories line's first sentence, then
 * the rest. */
static inline void test_write_story_pairs(const char *path, int count) {
    char src[512];
    test_asset(src, sizeof src, "tinystories-text/tinystories_val.txt");
    REQUIRE_ASSET(src);
    test_corpus c = test_corpus_load(src);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    int written = 0;
    for (int i = 0; i < c.n && written < count; i++) {
        if (c.len[i] < 80) continue;
        char line[400];
        size_t n = c.len[i] < 300 ? c.len[i] : 300;
        memcpy(line, c.line[i], n);
        line[n] = 0;
        char *dot = strchr(line, '.');
        if (!dot || dot[1] == 0) continue;
        char completion[400];
        snprintf(completion, sizeof completion, "%s", dot + 1);
        dot[1] = 0;
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "prompt", line);
        cJSON_AddStringToObject(j, "completion", completion);
        char *s = cJSON_PrintUnformatted(j);
        fprintf(f, "%s\n", s);
        free(s);
        cJSON_Delete(j);
        written++;
    }
    fclose(f);
    test_corpus_free(&c);
    assert_int_equal(written, count);
}

/* checkpoint.json in dir (when there is one) parses, and every file it lists loads. */
static inline void test_check_checkpoint_intact(const char *dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    if (!test_path_exists(path)) return; /* stopped before the first checkpoint */
    char *text = test_read_file(path, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) fail_msg("%s is torn", path);
    const cJSON *files = cJSON_GetObjectItem(j, "tensors"), *f;
    assert_true(cJSON_IsArray(files) && cJSON_GetArraySize(files) > 0);
    cJSON_ArrayForEach(f, files) {
        assert_true(cJSON_IsString(f));
        snprintf(path, sizeof path, "%s/%s", dir, f->valuestring);
        qlm_tensor_store *s = qlm_store_new();
        if (qlm_safetensors_load(path, s) != 0) fail_msg("torn checkpoint: %s", qlm_last_error());
        assert_true(qlm_store_count(s) > 0);
        qlm_store_free(s);
    }
    cJSON_Delete(j);
}

#endif
