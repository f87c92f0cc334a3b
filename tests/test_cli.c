/* End-to-end tests of the qlm binary ($QLM_BIN, default build/qlm) on real assets:
 * llama2.c reference outputs, the TinyStories-656K reference ids, upstream perplexity,
 * quantize/convert round trips and error handling of the command line. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <pty.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"
#include "../cpu/cpu_load.h"
#include "../quant/matmul.h"


static void test_stories260k_greedy_matches_llama2c(void **state) {
    (void)state;
    char model[512], ref_path[512];
    test_asset(model, sizeof model, "stories260K/stories260K.bin");
    test_asset(ref_path, sizeof ref_path, "stories260K/reference_greedy_t0_n256.txt");
    REQUIRE_ASSET(model);
    char *ref = test_read_file(ref_path, NULL), *out = NULL;
    assert_non_null(ref);
    assert_int_equal(test_run_qlm(&out, "generate -m %s --temp 0 -n 256 --quiet", model), 0);
    assert_string_equal(out, ref);
    free(out);
    free(ref);
}

static void test_tinystories656k_greedy_ids(void **state) {
    (void)state;
    char dir[512], ref_path[512];
    test_asset(dir, sizeof dir, "tinystories-656K-hf");
    test_asset(ref_path, sizeof ref_path, "tinystories-656K-hf/reference_greedy_from_bos_numpy_f64.txt");
    REQUIRE_ASSET(dir);
    char *ref = test_read_file(ref_path, NULL), *out = NULL;
    assert_non_null(ref);
    char *list = strstr(ref, "greedy ids [");
    assert_non_null(list);
    cJSON *ref_ids = cJSON_Parse(list + strlen("greedy ids "));
    assert_non_null(ref_ids);
    assert_int_equal(test_run_qlm(&out, "generate -m %s --temp 0 -n 120 --json --quiet", dir), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    cJSON *prompt = cJSON_GetObjectItem(j, "prompt_ids"), *ids = cJSON_GetObjectItem(j, "ids");
    assert_int_equal(cJSON_GetArraySize(prompt), 1);
    assert_int_equal(cJSON_GetArrayItem(prompt, 0)->valueint, cJSON_GetArrayItem(ref_ids, 0)->valueint);
    int match = 0;
    while (match < cJSON_GetArraySize(ids) && match + 1 < cJSON_GetArraySize(ref_ids) &&
           cJSON_GetArrayItem(ids, match)->valueint == cJSON_GetArrayItem(ref_ids, match + 1)->valueint)
        match++;
    print_message("tinystories-656K: %d of 120 greedy ids equal the float64 reference\n", match);
    assert_true(match >= 60);
    cJSON_Delete(j);
    cJSON_Delete(ref_ids);
    free(out);
    free(ref);
}

static double perplexity_nll(const char *model, const char *text, const char *extra) {
    char *out = NULL;
    assert_int_equal(test_run_qlm(&out, "perplexity -m %s -f %s --json --quiet %s", model, text, extra), 0);
    cJSON *j = cJSON_Parse(out);
    assert_non_null(j);
    double nll = cJSON_GetObjectItem(j, "nll")->valuedouble;
    int tokens = cJSON_GetObjectItem(j, "tokens")->valueint;
    print_message("stories260K %-22s NLL %.4f nats/token over %d tokens\n", extra[0] ? extra : "f32", nll, tokens);
    assert_int_equal(tokens, 1809);
    cJSON_Delete(j);
    free(out);
    return nll;
}

static void test_stories260k_perplexity(void **state) {
    (void)state;
    char model[512], text[512];
    test_asset(model, sizeof model, "stories260K/stories260K.bin");
    test_asset(text, sizeof text, "tinystories-text/tinystories_sample.txt");
    REQUIRE_ASSET(model);
    REQUIRE_ASSET(text);
    double f32 = perplexity_nll(model, text, "");
    assert_true(fabs(f32 - 1.2757) <= 0.002);
    double bf16 = perplexity_nll(model, text, "--dtype bf16");
    double i8 = perplexity_nll(model, text, "--dtype int8");
    double i8pc = perplexity_nll(model, text, "--dtype int8 --per-channel");
    assert_true(fabs(bf16 - f32) < 0.005);
    assert_true(fabs(i8 - f32) < 0.01);
    assert_true(fabs(i8pc - f32) < 0.01);
    /* Progress in a log is whole lines, not carriage returns. */
    char *log = NULL;
    assert_int_equal(test_run_qlm(&log, "perplexity -m %s -f %s 2>&1 >/dev/null", model, text), 0);
    assert_null(strchr(log, '\r'));
    assert_non_null(strstr(log, "scored "));
    free(log);
    /* bench says how far it is (in a log: every few seconds, and the last repetition). */
    assert_int_equal(test_run_qlm(&log, "bench -m %s --pp 16 --tg 8 --reps 2 2>&1 >/dev/null", model), 0);
    if (strchr(log, '\r') || !strstr(log, "bench: repetition 2/2, pp16 ") || !strstr(log, "tok/s, tg8 "))
        fail_msg("%s", log);
    free(log);
    /* Fewer tokens than the warm-up's four: its context is the runs'. */
    assert_int_equal(test_run_qlm(&log, "bench -m %s --pp 0 --tg 1 --reps 1 2>&1 >/dev/null", model), 0);
    if (!strstr(log, "tg1 ")) fail_msg("%s", log);
    free(log);
}

/* Block weights at load time: perplexity of tinystories-656K in Q8_0 near F32, 4-bit within a
 * bound, every group size, W8A8 (where the CPU has it; elsewhere --w8a8 leaves x 16-bit) near
 * the same weights with 16-bit x and the default where the CPU has it (exactly); and the flags'
 * errors. */
static void test_block_dtypes(void **state) {
    (void)state;
    char model[512], text[512], small[512];
    test_asset(model, sizeof model, "tinystories-656K-hf");
    test_asset(text, sizeof text, "tinystories-text/tinystories_sample.txt");
    test_asset(small, sizeof small, "stories260K/stories260K.bin");
    REQUIRE_ASSET(model);
    REQUIRE_ASSET(text);
    REQUIRE_ASSET(small);
    const char *flags[] = {"",
                           "--dtype q8_0 --no-w8a8",
                           "--dtype q4_1 --no-w8a8",
                           "--dtype int4 --no-w8a8",
                           "--dtype q4_0 --group 128 --no-w8a8",
                           "--dtype q4_1 --group 64 --no-w8a8",
                           "--dtype q8_0 --w8a8",
                           "--dtype q4_1 --w8a8",
                           "--dtype q4_1"};
    const double bound[] = {0, 0.01, 0.1, 0.15, 0.25, 0.15, 0.01, 0.1, 0.1};
    double nll[9];
    for (int i = 0; i < 9; i++) {
        char *out = NULL;
        assert_int_equal(test_run_qlm(&out, "perplexity -m %s -f %s --json --quiet %s", model, text, flags[i]), 0);
        cJSON *j = cJSON_Parse(out);
        assert_non_null(j);
        nll[i] = cJSON_GetObjectItem(j, "nll")->valuedouble;
        print_message("tinystories-656K %-24s NLL %.4f nats/token\n", flags[i][0] ? flags[i] : "f32", nll[i]);
        if (i) assert_true(fabs(nll[i] - nll[0]) <= bound[i]);
        cJSON_Delete(j);
        free(out);
    }
    /* x's 8-bit runs against the same weights with 16-bit x. */
    assert_true(fabs(nll[6] - nll[1]) <= 0.005 && fabs(nll[7] - nll[2]) <= 0.005);
    assert_true(nll[8] == (qlm_matmul_w8a8() ? nll[7] : nll[2]));
    char *err = NULL;
    assert_int_equal(test_run_qlm(&err, "generate -m %s --group 48 -p x 2>&1", model), 2);
    assert_non_null(strstr(err, "--group must be 32, 64 or 128"));
    free(err);
    assert_int_equal(test_run_qlm(&err, "generate -m %s --dtype bf16 --group 64 -p x 2>&1", model), 1);
    assert_non_null(strstr(err, "--group applies to int8 and the block dtypes"));
    free(err);
    assert_int_equal(test_run_qlm(&err, "generate -m %s --dtype int8 --w8a8 -p x 2>&1", model), 1);
    assert_non_null(strstr(err, "--w8a8 applies to block weights"));
    free(err);
    /* stories260K's MLP is 172 wide: not whole blocks of 32. */
    assert_int_equal(test_run_qlm(&err, "generate -m %s --dtype q4_0 -p x 2>&1", small), 1);
    assert_non_null(strstr(err, "172 columns do not split into q4_0 blocks of 32"));
    free(err);
    /* quantize writes the blocks; the folder reads back to the same greedy text as quantizing at load. */
    char tmp[256], out_dir[600], cmd[1400];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(out_dir, sizeof out_dir, "%s/q4", tmp);
    assert_int_equal(test_run_qlm(NULL, "quantize %s %s --dtype int4 --group 64 2>/dev/null", model, out_dir), 0);
    char *a = NULL, *b = NULL, *info = NULL;
    assert_int_equal(test_run_qlm(&a, "generate -m %s --dtype q4_0 --group 64 --temp 0 -n 40 --json --quiet", model), 0);
    assert_int_equal(test_run_qlm(&b, "generate -m %s --temp 0 -n 40 --json --quiet", out_dir), 0);
    assert_string_equal(a, b);
    free(a), free(b);
    /* int8 with a scale per group of weights is q8_0 at that group; not also per channel. */
    assert_int_equal(test_run_qlm(&a, "generate -m %s --dtype q8_0 --group 64 --temp 0 -n 40 --json --quiet", model), 0);
    assert_int_equal(test_run_qlm(&b, "generate -m %s --dtype int8 --group 64 --temp 0 -n 40 --json --quiet", model), 0);
    assert_string_equal(a, b);
    free(b);
    assert_int_equal(test_run_qlm(&b, "generate -m %s --dtype int8 --group 64 --per-channel -p x 2>&1", model), 1);
    assert_non_null(strstr(b, "--per-channel and --group are two scale granularities of int8"));
    assert_int_equal(test_run_qlm(&info, "info %s --tensors", out_dir), 0);
    assert_non_null(strstr(info, "model.layers.1.mlp.down_proj.weight                  q4_0  [128, 384] blocks of 64"));
    free(a), free(b), free(info);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
}

static void test_quantize_roundtrip(void **state) {
    (void)state;
    char dir[512], tmp[256], out_dir[600];
    test_asset(dir, sizeof dir, "tinystories-656K-hf");
    REQUIRE_ASSET(dir);
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(out_dir, sizeof out_dir, "%s/int8", tmp);
    assert_int_equal(test_run_qlm(NULL, "quantize %s %s --dtype int8 --per-channel 2>/dev/null", dir, out_dir), 0);
    char *a = NULL, *b = NULL;
    assert_int_equal(test_run_qlm(&a, "generate -m %s --dtype int8 --per-channel --temp 0 -n 40 --json --quiet", dir), 0);
    assert_int_equal(test_run_qlm(&b, "generate -m %s --temp 0 -n 40 --json --quiet", out_dir), 0);
    /* Quantizing in memory or from the written file gives the same weights, so the same tokens. */
    assert_string_equal(a, b);
    free(a);
    free(b);
    char *info = NULL;
    assert_int_equal(test_run_qlm(&info, "info %s --tensors", out_dir), 0);
    assert_non_null(strstr(info, "per-channel scales"));
    free(info);
    /* --json: what was written, and the folder as info describes it. */
    char *res = NULL, file[700];
    assert_int_equal(test_run_qlm(&res, "quantize %s %s --dtype q4_0 --group 64 --json 2>/dev/null", dir, out_dir), 0);
    cJSON *r = cJSON_Parse(res);
    assert_non_null(r);
    snprintf(file, sizeof file, "%s/model.safetensors", out_dir);
    size_t file_bytes = 0;
    free(test_read_file(file, &file_bytes));
    assert_string_equal(cJSON_GetObjectItem(r, "dtype")->valuestring, "q4_0");
    assert_int_equal(cJSON_GetObjectItem(r, "group")->valueint, 64);
    assert_true(cJSON_GetObjectItem(r, "bytes")->valuedouble == (double)file_bytes);
    assert_int_equal(test_run_qlm(&info, "info %s --tensors --json", out_dir), 0);
    cJSON *j = cJSON_Parse(info), *m = cJSON_GetObjectItem(j, "model"), *cfg = cJSON_GetObjectItem(m, "config");
    assert_non_null(cfg);
    assert_int_equal(cJSON_GetObjectItem(cfg, "hidden_size")->valueint, 128);
    assert_string_equal(cJSON_GetObjectItem(m, "dtype")->valuestring, "q4_0");
    assert_true(cJSON_GetObjectItem(m, "parameters")->valuedouble == cJSON_GetObjectItem(r, "parameters")->valuedouble);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(m, "tensors")), cJSON_GetObjectItem(m, "tensor_count")->valueint);
    assert_true(cJSON_IsObject(cJSON_GetObjectItem(m, "tokenizer")));
    assert_true(cJSON_IsBool(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "cpu"), "w8a8")));
    /* The weights as a plain run loads them: 16-bit x reads the blocks where the file is mapped
     * (the norms alone copied to F32), W8A8 repacks them all (a model this small keeps no panel
     * cache); either way as many bytes as the file's tensors. */
    cJSON *w = cJSON_GetObjectItem(m, "weights");
    const double file_mapped = cJSON_GetObjectItem(w, "file_mapped_bytes")->valuedouble,
                 owned = cJSON_GetObjectItem(w, "owned_bytes")->valuedouble;
    const int w8a8 = qlm_matmul_w8a8();
    assert_string_equal(cJSON_GetObjectItem(w, "loads_as")->valuestring, w8a8 ? "q4_0 w8a8" : "q4_0");
    assert_true(cJSON_GetObjectItem(w, "panel_cache_mapped_bytes")->valuedouble == 0);
    assert_true(file_mapped + owned == cJSON_GetObjectItem(m, "bytes")->valuedouble);
    assert_true(w8a8 ? file_mapped == 0 : owned < 0.01 * file_mapped);
    cJSON_Delete(j);
    cJSON_Delete(r);
    free(info);
    free(res);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
}

/* quantize --random-weights: a model folder from a config alone, the weights that --random-weights
 * gives at load, the same bytes every time. */
static void test_quantize_random_weights(void **state) {
    (void)state;
    char dir[512], tmp[256], a_dir[600], b_dir[600], path[700];
    test_asset(dir, sizeof dir, "tinystories-656K-hf");
    REQUIRE_ASSET(dir);
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(a_dir, sizeof a_dir, "%s/a", tmp);
    snprintf(b_dir, sizeof b_dir, "%s/b", tmp);
    assert_int_equal(test_run_qlm(NULL, "quantize %s %s --dtype bf16 --random-weights 2>/dev/null", dir, a_dir), 0);
    assert_int_equal(test_run_qlm(NULL, "quantize %s %s --dtype bf16 --random-weights 2>/dev/null", dir, b_dir), 0);
    size_t a_len = 0, b_len = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", a_dir);
    char *a = test_read_file(path, &a_len);
    snprintf(path, sizeof path, "%s/model.safetensors", b_dir);
    char *b = test_read_file(path, &b_len);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(a_len == b_len && memcmp(a, b, a_len) == 0);
    free(a), free(b);
    /* The folder (with the tokenizer beside it) runs, as the same weights made at load do. */
    assert_int_equal(test_run_qlm(&a, "generate -m %s --random-weights --dtype bf16 -p Once --temp 0 -n 24 --json --quiet",
                                  dir), 0);
    assert_int_equal(test_run_qlm(&b, "generate -m %s -p Once --temp 0 -n 24 --json --quiet", a_dir), 0);
    assert_string_equal(a, b);
    free(a), free(b);
    char *err = NULL;
    assert_int_equal(test_run_qlm(&err, "quantize --from-qat %s %s --random-weights 2>&1", dir, b_dir), 2);
    assert_non_null(strstr(err, "leave out --random-weights"));
    free(err);
    assert_int_equal(test_run_qlm(&err, "convert %s %s --random-weights 2>&1", dir, b_dir), 2);
    assert_non_null(strstr(err, "usage: qlm convert"));
    free(err);
    test_remove_tree(tmp);
}

static void test_convert_llama2c_roundtrip(void **state) {
    (void)state;
    char model[512], tmp[256], out_dir[600];
    test_asset(model, sizeof model, "stories260K/stories260K.bin");
    REQUIRE_ASSET(model);
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(out_dir, sizeof out_dir, "%s/hf", tmp);
    assert_int_equal(test_run_qlm(NULL, "convert %s %s 2>/dev/null", model, out_dir), 0);
    char *a = NULL, *b = NULL;
    assert_int_equal(test_run_qlm(&a, "generate -m %s --temp 0 -n 60 --quiet", model), 0);
    assert_int_equal(test_run_qlm(&b, "generate -m %s --temp 0 -n 60 --quiet", out_dir), 0);
    assert_string_equal(a, b);
    free(a);
    free(b);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    assert_int_equal(system(cmd), 0);
}

static void test_sampling_is_seeded(void **state) {
    (void)state;
    char model[512];
    test_asset(model, sizeof model, "stories260K/stories260K.bin");
    REQUIRE_ASSET(model);
    char *a = NULL, *b = NULL, *c = NULL;
    const char *flags = "--temp 1.0 --top-p 0.9 --top-k 0 -n 100 --quiet";
    assert_int_equal(test_run_qlm(&a, "generate -m %s %s --seed 42", model, flags), 0);
    assert_int_equal(test_run_qlm(&b, "generate -m %s %s --seed 42", model, flags), 0);
    assert_int_equal(test_run_qlm(&c, "generate -m %s %s --seed 43", model, flags), 0);
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    free(a);
    free(b);
    free(c);
}

/* Also loads the llama2.c checkpoint through its folder (no config.json: the one .bin in it). */
static void test_stop_string_and_max_tokens(void **state) {
    (void)state;
    char model[512];
    test_asset(model, sizeof model, "stories260K");
    REQUIRE_ASSET(model);
    char *full = NULL, *stopped = NULL;
    assert_int_equal(test_run_qlm(&full, "generate -m %s --temp 0 -n 255 --quiet", model), 0);
    assert_int_equal(test_run_qlm(&stopped, "generate -m %s --temp 0 -n 255 --quiet --stop Lily", model), 0);
    char *cut = strstr(full, "Lily");
    assert_non_null(cut);
    size_t keep = (size_t)(cut - full);
    assert_int_equal(strlen(stopped), keep + 1); /* text before the stop string, then the newline */
    assert_memory_equal(stopped, full, keep);
    free(full);
    free(stopped);
}


/* Dialogues for the summarize tests: short, varied, one with quotes and a newline-free line. */
static const char *k_dialogues[] = {
    "#Person1#: Hello, Lily. Do you want to play?\n#Person2#: Yes, let us play in the park.",
    "#Person1#: The cat is sad.\n#Person2#: Why?\n#Person1#: It lost its \"red\" ball.",
    "#Person1#: Tom found a big stick.",
    "#Person1#: Can we go home now?\n#Person2#: Not yet, the sun is still up.",
    "#Person1#: I like the blue bird.\n#Person2#: Me too! It can sing.",
    "#Person1#: Mom made a cake.\n#Person2#: Can I have some?\n#Person1#: After dinner.",
};
enum { N_DIALOGUES = sizeof k_dialogues / sizeof k_dialogues[0] };

/* Writes the dialogues as JSONL ({"id": "d<i>", "dialogue": ..., "summary": ...}) into path. */
static void write_dialogues(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < N_DIALOGUES; i++) {
        cJSON *o = cJSON_CreateObject();
        char id[16];
        snprintf(id, sizeof id, "d%d", i);
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "dialogue", k_dialogues[i]);
        cJSON_AddStringToObject(o, "summary", "Lily and Tom play with the ball in the park.");
        char *line = cJSON_PrintUnformatted(o);
        fprintf(f, "%s\n", line);
        free(line);
        cJSON_Delete(o);
    }
    fclose(f);
}

/* The summary of single mode is the greedy continuation of the lab's prompt, with whitespace
 * trimmed; batch mode gives every line the same, keeps the other fields, and resumes after a
 * torn last line without redoing or losing a line. */
static void test_summarize(void **state) {
    (void)state;
    char model[512], dir[256], in[512], out[512], one[512], prompt[512];
    test_asset(model, sizeof model, "stories260K");
    REQUIRE_ASSET(model);
    assert_non_null(test_tmpdir(dir, sizeof dir));
    snprintf(in, sizeof in, "%s/in.jsonl", dir);
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    snprintf(one, sizeof one, "%s/one.txt", dir);
    snprintf(prompt, sizeof prompt, "%s/prompt.txt", dir);
    write_dialogues(in);
    const char *flags = "--temp 0 -n 24 --quiet";
    char *single[N_DIALOGUES];
    for (int i = 0; i < N_DIALOGUES; i++) {
        assert_int_equal(test_write_file(one, k_dialogues[i], strlen(k_dialogues[i])), 0);
        assert_int_equal(test_run_qlm(&single[i], "summarize -m %s %s %s", model, one, flags), 0);
        char text[1024];
        snprintf(text, sizeof text, "Summarize the following conversation.\n\n%s\n\nSummary: ", k_dialogues[i]);
        assert_int_equal(test_write_file(prompt, text, strlen(text)), 0);
        char *gen = NULL;
        assert_int_equal(test_run_qlm(&gen, "generate -m %s -f %s %s", model, prompt, flags), 0);
        /* generate prints prompt + continuation + newline; summarize the trimmed continuation + newline */
        char *cont = gen + strlen(text);
        while (*cont == ' ' || *cont == '\n') cont++;
        size_t n = strlen(cont);
        while (n && (cont[n - 1] == ' ' || cont[n - 1] == '\n')) n--;
        assert_int_equal(strlen(single[i]), n + 1);
        assert_memory_equal(single[i], cont, n);
        single[i][n] = 0;
        free(gen);
        /* --json holds the same summary with its counts. */
        char *js = NULL;
        assert_int_equal(test_run_qlm(&js, "summarize -m %s %s %s --json", model, one, flags), 0);
        cJSON *j = cJSON_Parse(js);
        assert_non_null(j);
        assert_string_equal(cJSON_GetObjectItem(j, "summary")->valuestring, single[i]);
        assert_true(cJSON_GetObjectItem(j, "completion_tokens")->valueint > 0);
        assert_true(cJSON_GetObjectItem(j, "prompt_tokens")->valueint > 10);
        cJSON_Delete(j);
        free(js);
    }
    char *err = NULL;
    /* Nothing to summarize is an error, not a summary the model makes up. */
    assert_int_equal(test_run_qlm(&err, "summarize -m %s /dev/null 2>&1", model), 1);
    assert_non_null(strstr(err, "no dialogue to summarize"));
    free(err);
    assert_int_equal(test_run_qlm(&err, "summarize -m %s - < /dev/null 2>&1", model), 1);
    assert_non_null(strstr(err, "stdin: no dialogue"));
    free(err);
    /* The input has "summary" (the reference): writing the summary there would lose it. */
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --batch %s --out %s %s 2>&1", model, in, out, flags), 1);
    assert_non_null(strstr(err, "in.jsonl:1: the record has a \"summary\" field"));
    assert_non_null(strstr(err, "--out-field"));
    free(err);
    flags = "--temp 0 -n 24 --quiet --out-field prediction";
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --batch %s --out %s --batch-size 4 %s", model, in, out, flags), 0);
    free(err);
    size_t len;
    char *full = test_read_file(out, &len);
    assert_non_null(full);
    char *line = full;
    for (int i = 0; i < N_DIALOGUES; i++) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = 0;
        cJSON *rec = cJSON_Parse(line);
        assert_non_null(rec);
        char id[16];
        snprintf(id, sizeof id, "d%d", i);
        assert_string_equal(cJSON_GetObjectItem(rec, "id")->valuestring, id);
        assert_null(cJSON_GetObjectItem(rec, "dialogue"));
        assert_string_equal(cJSON_GetObjectItem(rec, "summary")->valuestring, "Lily and Tom play with the ball in the park.");
        assert_string_equal(cJSON_GetObjectItem(rec, "prediction")->valuestring, single[i]);
        cJSON_Delete(rec);
        *nl = '\n';
        line = nl + 1;
    }
    assert_int_equal(*line, 0);

    /* Not overwritten without --resume. */
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --batch %s --out %s %s 2>&1", model, in, out, flags), 1);
    assert_non_null(strstr(err, "--resume"));
    free(err);
    /* Two complete lines and a torn third: --resume cuts the torn line and finishes the rest. */
    char *second_nl = strchr(strchr(full, '\n') + 1, '\n');
    size_t keep = (size_t)(second_nl - full) + 1;
    assert_int_equal(test_write_file(out, full, keep + 10), 0);
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --batch %s --out %s --resume --batch-size 3 %s", model, in, out,
                             flags), 0);
    free(err);
    char *resumed = test_read_file(out, NULL);
    assert_string_equal(resumed, full);
    free(resumed);
    /* --eval scores the output against the input's summary field. */
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --batch %s --out %s --resume --eval %s", model, in, out, flags), 0);
    assert_non_null(strstr(err, "ROUGE-Lsum"));
    free(err);
    /* Lines of other records (the first two swapped) are not resumed from. */
    char *first_nl = strchr(full, '\n');
    size_t l1 = (size_t)(first_nl - full) + 1, l2 = keep - l1;
    char *swapped = malloc(keep);
    memcpy(swapped, full + l1, l2);
    memcpy(swapped + l2, full, l1);
    assert_int_equal(test_write_file(out, swapped, keep), 0);
    free(swapped);
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --batch %s --out %s --resume %s 2>&1", model, in, out, flags), 1);
    assert_non_null(strstr(err, "out.jsonl:1 does not belong to"));
    assert_non_null(strstr(err, "in.jsonl:1"));
    free(err);
    /* A prompt with no room for --max-tokens is skipped with an "error" line; the rest are done. */
    char *words = malloc(8192);
    strcpy(words, "{\"id\": \"long\", \"dialogue\": \"#Person1#:");
    for (int i = 0; i < 600; i++) strcat(words, " ball");
    strcat(words, "\"}\n");
    char *withlong = test_read_file(in, &len);
    size_t inlen = strlen(withlong);
    withlong = realloc(withlong, inlen + strlen(words) + 1);
    strcpy(withlong + inlen, words);
    assert_int_equal(test_write_file(in, withlong, strlen(withlong)), 0);
    free(words);
    remove(out);
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --batch %s --out %s --eval %s 2>&1", model, in, out,
                                  "--temp 0 -n 24 --out-field prediction"),
                     0);
    assert_non_null(strstr(err, "in.jsonl:7 skipped: the prompt is"));
    assert_non_null(strstr(err, "1 record skipped"));
    assert_non_null(strstr(err, "ROUGE-Lsum"));
    free(err);
    char *skipped = test_read_file(out, NULL);
    assert_memory_equal(skipped, full, strlen(full));
    cJSON *last = cJSON_Parse(skipped + strlen(full));
    assert_non_null(last);
    assert_string_equal(cJSON_GetObjectItem(last, "id")->valuestring, "long");
    assert_non_null(strstr(cJSON_GetObjectItem(last, "error")->valuestring, "exceeds the model's 512 positions"));
    assert_null(cJSON_GetObjectItem(last, "prediction"));
    cJSON_Delete(last);
    free(skipped);
    withlong[inlen] = 0;
    assert_int_equal(test_write_file(in, withlong, inlen), 0);
    free(withlong);

    /* Bad input names the file and line. */
    FILE *f = fopen(in, "a");
    fputs("{\"id\": \"bad\"}\n", f);
    fclose(f);
    remove(out);
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --batch %s --out %s %s 2>&1", model, in, out, flags), 1);
    assert_non_null(strstr(err, "in.jsonl:7: missing field \"dialogue\""));
    free(err);
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --batch %s %s 2>&1", model, in, flags), 2);
    free(err);
    assert_int_equal(test_run_qlm(&err, "summarize -m %s --shots 1 %s %s 2>&1", model, one, flags), 2);
    assert_non_null(strstr(err, "--examples"));
    free(err);

    for (int i = 0; i < N_DIALOGUES; i++) free(single[i]);
    free(full);
    const char *names[] = {in, out, one, prompt};
    for (int i = 0; i < 4; i++) remove(names[i]);
    rmdir(dir);
}

/* Expects "qlm ARGS" to exit with status want and its stderr to mention text. */
static void expect_message(int want, const char *mention, const char *fmt, const char *a, const char *b) {
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, fmt, a, b);
    int rc = test_run_qlm(&out, "%s 2>&1", args);
    if (rc != want || !strstr(out, mention)) fail_msg("qlm %s: exit %d (want %d): %s(want '%s')", args, rc, want, out, mention);
    free(out);
}

/* Inputs of the wrong kind get a message that says what is wrong with them. */
static void test_clear_messages(void **state) {
    (void)state;
    char model[512], tok[512], hf[512], dir[256], file[300], text[300], jsonl[300];
    test_asset(model, sizeof model, "stories260K/stories260K.bin");
    test_asset(tok, sizeof tok, "stories260K/tok512.bin");
    test_asset(hf, sizeof hf, "tinystories-656K-hf");
    REQUIRE_ASSET(model);
    REQUIRE_ASSET(hf);
    assert_non_null(test_tmpdir(dir, sizeof dir));
    snprintf(file, sizeof file, "%s/afile", dir);
    snprintf(text, sizeof text, "%s/words.txt", dir);
    snprintf(jsonl, sizeof jsonl, "%s/d.jsonl", dir);
    assert_int_equal(test_write_file(file, "x", 1), 0);
    const char *words = "root:x:0:0:root:/root:/bin/bash\n";
    assert_int_equal(test_write_file(text, words, strlen(words)), 0);
    const char *dialogue = "{\"fname\": \"a\", \"dialogue\": \"#Person1#: Hi.\", \"summary\": \"Hi.\"}\n";
    assert_int_equal(test_write_file(jsonl, dialogue, strlen(dialogue)), 0);

    expect_message(1, "--pp/--tg of 100000 exceed the model's context of 512", "bench -m %s --pp 100000%s", model, "");
    expect_message(2, "--pp 0 and --tg 0 leave nothing to measure", "bench -m %s --pp 0 --tg 0%s", model, "");
    expect_message(1, "/dev/zero: not a regular file or a folder", "generate -m /dev/zero -p hi%s%s", "", "");
    expect_message(1, "not a tokenizer (tokenizer.json", "tokenize -t %s hi%s", text, "");
    expect_message(1, "/dev/null: not a regular file", "tokenize -t /dev/null hi%s%s", "", "");
    expect_message(0, "3 tokens", "tokenize -t %s 'Once upon'%s", tok, ""); /* a llama2.c tokenizer alone */
    expect_message(1, "afile: exists and is not a folder", "quantize %s %s --dtype int8", hf, file);
    expect_message(1, "not a regular file (--out names", "summarize -m %s --batch %s --out /tmp --out-field p --max-tokens 2", hf, jsonl);
    expect_message(1, ": is a folder, not a file", "rouge --pred %s --ref %s", dir, jsonl);
    expect_message(1, "adapts a T5 model, but the base model is Llama-family",
                   "generate -m %s --lora a=tests/fixtures/lora/t5_qv_rslora_r16 -p hi%s", hf, "");
    test_remove_tree(dir);
}

/* Writes bytes over element k of tensor name in dir/model.safetensors (elem: its byte width). */
static void patch_tensor(const char *dir, const char *name, int64_t k, const void *bytes, size_t elem) {
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t len;
    char *file = test_read_file(path, &len);
    assert_non_null(file);
    uint64_t hlen;
    memcpy(&hlen, file, 8);
    cJSON *h = cJSON_ParseWithLength(file + 8, (size_t)hlen);
    assert_non_null(h);
    cJSON *offs = cJSON_GetObjectItem(cJSON_GetObjectItem(h, name), "data_offsets");
    assert_non_null(offs);
    size_t at = 8 + (size_t)hlen + (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble + (size_t)k * elem;
    assert_true(at + elem <= len);
    memcpy(file + at, bytes, elem);
    assert_int_equal(test_write_file(path, file, len), 0);
    cJSON_Delete(h);
    free(file);
}

/* NaN/Inf weights and absurd INT8 scales are refused at load, naming the tensor; --no-check loads
 * them anyway. */
static void test_weight_values_checked(void **state) {
    (void)state;
    char hf[512], dir[256];
    test_asset(hf, sizeof hf, "tinystories-656K-hf");
    REQUIRE_ASSET(hf);
    assert_non_null(test_tmpdir(dir, sizeof dir));
    const uint32_t nan32 = 0x7FC00000u;
    const uint16_t inf_bf16 = 0x7F80u, ninf_f16 = 0xFC00u;
    const float zero = 0, minus = -1, huge = 1e31f;
    const struct {
        const char *dtype, *tensor;
        int64_t k;
        const void *bad;
        size_t elem;
        const char *mention;
    } cases[] = {
        {"f32", "model.layers.1.mlp.down_proj.weight", 777, &nan32, 4, "down_proj.weight holds NaN or Inf (element 777 of"},
        {"bf16", "model.layers.0.self_attn.q_proj.weight", 5, &inf_bf16, 2, "q_proj.weight holds NaN or Inf (element 5 of"},
        {"f16", "model.embed_tokens.weight", 123, &ninf_f16, 2, "embed_tokens.weight holds NaN or Inf (element 123 of"},
        {"int8", "model.layers.1.self_attn.o_proj.weight_scale", 0, &zero, 4, "o_proj.weight: INT8 scale 0 is not in"},
        {"int8 --per-channel", "model.layers.0.mlp.up_proj.weight_scale", 3, &minus, 4, "up_proj.weight: INT8 scale -1 of row 3"},
        {"int8", "model.layers.0.mlp.gate_proj.weight_scale", 0, &huge, 4, "INT8 scale 1e+31 is not in (0, 1e30]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[300], *log = NULL;
        snprintf(out, sizeof out, "%s/m%zu", dir, i);
        assert_int_equal(test_run_qlm(NULL, "quantize %s %s --dtype %s 2>/dev/null", hf, out, cases[i].dtype), 0);
        assert_int_equal(test_run_qlm(&log, "generate -m %s -p Once -n 2 2>&1", out), 0);
        free(log);
        /* config.json says how the folder is stored: other tools refuse INT8 by name. */
        char cfg_path[400];
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", out);
        char *text = test_read_file(cfg_path, NULL);
        cJSON *cfg = cJSON_Parse(text);
        const char *torch = cJSON_GetObjectItem(cfg, "torch_dtype")->valuestring;
        const cJSON *q = cJSON_GetObjectItem(cfg, "quantization_config");
        int int8 = !strncmp(cases[i].dtype, "int8", 4);
        assert_string_equal(torch, !strcmp(cases[i].dtype, "bf16") ? "bfloat16" : !strcmp(cases[i].dtype, "f16") ? "float16"
                                                                                                              : "float32");
        assert_int_equal(q != NULL, int8);
        if (int8) {
            assert_string_equal(cJSON_GetObjectItem(q, "quant_method")->valuestring, "qlm_int8");
            assert_string_equal(cJSON_GetObjectItem(q, "granularity")->valuestring,
                                strstr(cases[i].dtype, "per-channel") ? "per-channel" : "per-tensor");
        }
        cJSON_Delete(cfg);
        free(text);
        patch_tensor(out, cases[i].tensor, cases[i].k, cases[i].bad, cases[i].elem);
        assert_int_equal(test_run_qlm(&log, "generate -m %s -p Once -n 2 2>&1", out), 1);
        if (!strstr(log, cases[i].mention) || !strstr(log, "--no-check"))
            fail_msg("%s: %s (want '%s')", cases[i].dtype, log, cases[i].mention);
        free(log);
        assert_int_equal(test_run_qlm(&log, "generate -m %s -p Once -n 2 --no-check 2>&1", out), 0);
        free(log);
    }
    test_remove_tree(dir);
}

/* Runs "[env] qlm generate -m model --temp 0 -n 24 [flags]": the exit status, its text (*out) and
 * its log (*err), both malloc'd. */
static int generate_logged(const char *env, const char *model, const char *flags, char **out, char **err) {
    char dir[256], path[300], cmd[2048];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    snprintf(path, sizeof path, "%s/err", dir);
    const char *bin = getenv("QLM_BIN");
    snprintf(cmd, sizeof cmd, "%s %s generate -m %s --temp 0 -n 24 %s 2>%s", env, bin && *bin ? bin : "build/qlm", model,
             flags, path);
    int rc = test_run_shell(out, cmd);
    *err = test_read_file(path, NULL);
    assert_non_null(*err);
    test_remove_tree(dir);
    return rc;
}

/* On a machine other programs keep busy the default thread count shrinks to the free cores (here
 * none: one thread) and says so; --threads and OMP_NUM_THREADS are obeyed as given. The text is
 * the same whatever the threads. */
static void test_threads_under_load(void **state) {
    (void)state;
    char model[512];
    test_asset(model, sizeof model, "stories260K/stories260K.bin");
    REQUIRE_ASSET(model);
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    int cores = CPU_COUNT(&set);
    pid_t hogs[256];
    assert_true(cores <= 256);
    for (int i = 0; i < cores; i++) {
        hogs[i] = fork();
        assert_true(hogs[i] >= 0);
        if (hogs[i] == 0) {
            for (volatile unsigned long k = 0;; k++) continue;
        }
    }
    usleep(200000);
    unsetenv("OMP_WAIT_POLICY");
    char *out[3], *err[3];
    int rc[3] = {generate_logged("", model, "", &out[0], &err[0]),
                 generate_logged("", model, "--threads 2", &out[1], &err[1]),
                 generate_logged("OMP_NUM_THREADS=2", model, "", &out[2], &err[2])};
    for (int i = 0; i < cores; i++) {
        kill(hogs[i], SIGKILL);
        waitpid(hogs[i], NULL, 0);
    }
    for (int i = 0; i < 3; i++) assert_int_equal(rc[i], 0);
    if (!strstr(err[0], "other programs keep") || !strstr(err[0], ": 1 thread (--threads N to choose)") ||
        !strstr(err[0], "cpu backend, 1 threads"))
        fail_msg("under load: %s", err[0]);
    for (int i = 1; i < 3; i++) {
        assert_null(strstr(err[i], "other programs keep"));
        assert_non_null(strstr(err[i], "cpu backend, 2 threads"));
        if (!strstr(err[i], "OMP_WAIT_POLICY=passive")) fail_msg("a forced count past the free cores: %s", err[i]);
    }
    assert_true(strlen(out[0]) > 20);
    for (int i = 1; i < 3; i++) assert_string_equal(out[i], out[0]);
    for (int i = 0; i < 3; i++) {
        free(out[i]);
        free(err[i]);
    }
}

static void *spin_until_cleared(void *flag) {
    while (__atomic_load_n((int *)flag, __ATOMIC_RELAXED)) continue;
    return NULL;
}

/* Over 5 samples 10 ms apart, the least (least) or the most of qlm_cpu_others_running(). */
static int others_running(int least) {
    int r = least ? INT_MAX : 0;
    for (int i = 0; i < 5; i++) {
        const int n = qlm_cpu_others_running();
        assert_true(n >= 0);
        r = least ? (n < r ? n : r) : (n > r ? n : r);
        usleep(10000);
    }
    return r;
}

/* The load that shrinks the default thread count is other programs': a process's own runnable
 * threads (OpenBLAS's pool spins for a while after the library loads, so qlm took one thread on
 * an idle 2-core machine) are not counted. Four spinning threads here, on any number of cores:
 * the fewest others counted while they spin must stay below 4 more than the most counted before
 * (on an idle machine, below 4; other programs' load, which may come and go, is not theirs). */
static void test_own_threads_are_not_load(void **state) {
    (void)state;
    enum { SPINNERS = 4 };
    const int before = others_running(0);
    pthread_t t[SPINNERS];
    int spin = 1;
    for (int i = 0; i < SPINNERS; i++) assert_int_equal(pthread_create(&t[i], NULL, spin_until_cleared, &spin), 0);
    usleep(50000);
    const int during = others_running(1);
    __atomic_store_n(&spin, 0, __ATOMIC_RELAXED);
    for (int i = 0; i < SPINNERS; i++) pthread_join(t[i], NULL);
    if (during >= before + SPINNERS)
        fail_msg("%d other runnable threads counted beside this process's %d spinning ones (%d before they started)",
                 during, SPINNERS, before);
}

/* OPENBLAS_NUM_THREADS=1 unless the user set it: qlm's threads call OpenBLAS one thread each, and
 * the pool the pthread build otherwise starts as it loads spins beside them (qlm restarts itself
 * with the variable set). */
static int openblas_threads_with(const char *value) {
    char *saved = getenv("OPENBLAS_NUM_THREADS") ? strdup(getenv("OPENBLAS_NUM_THREADS")) : NULL;
    if (value)
        setenv("OPENBLAS_NUM_THREADS", value, 1);
    else
        unsetenv("OPENBLAS_NUM_THREADS");
    char *out = NULL;
    int rc = test_run_qlm(&out, "info --json");
    if (saved)
        setenv("OPENBLAS_NUM_THREADS", saved, 1);
    else
        unsetenv("OPENBLAS_NUM_THREADS");
    free(saved);
    assert_int_equal(rc, 0);
    cJSON *root = cJSON_Parse(out);
    const cJSON *n = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "cpu"), "openblas_threads");
    assert_true(cJSON_IsNumber(n));
    int threads = n->valueint;
    cJSON_Delete(root);
    free(out);
    return threads;
}

static void test_openblas_keeps_no_pool(void **state) {
    (void)state;
    assert_int_equal(openblas_threads_with(NULL), 1);
    /* A count the user set stays (OpenBLAS holds it to the cores this process may use). */
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    assert_int_equal(openblas_threads_with("2"), CPU_COUNT(&set) < 2 ? CPU_COUNT(&set) : 2);
}

/* What a terminal shows of a child on a pseudo-terminal, read as it comes. */
typedef struct {
    int fd;
    pid_t pid;
    char buf[1 << 16];
    size_t len, seen; /* seen: where the next wait starts looking */
} terminal;

/* Reads until needle appears after what earlier waits matched (fails after limit_s). */
static void term_wait(terminal *t, const char *needle, double limit_s) {
    double end = qlm_now_s() + limit_s;
    for (;;) {
        t->buf[t->len] = 0;
        const char *at = strstr(t->buf + t->seen, needle);
        if (at) {
            t->seen = (size_t)(at - t->buf) + strlen(needle);
            return;
        }
        if (qlm_now_s() > end) fail_msg("no '%s' on the terminal after %.0f s; it shows:\n%s", needle, limit_s, t->buf + t->seen);
        struct pollfd p = {.fd = t->fd, .events = POLLIN};
        if (poll(&p, 1, 100) == 1) {
            ssize_t n = read(t->fd, t->buf + t->len, sizeof t->buf - 1 - t->len);
            if (n <= 0) fail_msg("the terminal closed before '%s':\n%s", needle, t->buf + t->seen);
            t->len += (size_t)n;
        }
    }
}

/* Keys typed a moment after the prompt showed: libedit sets the terminal up after printing it and
 * drops what was typed before (as a person never types that fast, this only concerns the test). */
static void term_type(terminal *t, const char *keys) {
    usleep(300000);
    assert_int_equal(write(t->fd, keys, strlen(keys)), (ssize_t)strlen(keys));
}

/* qlm chat on a terminal, as a user drives it: Ctrl-C stops an answer and the prompt comes back,
 * /help lists the commands, an unknown /command is refused instead of sent to the model, the Up
 * arrow recalls the last line (libedit), and Ctrl-D at the prompt quits with status 0. */
static void test_chat_terminal(void **state) {
    (void)state;
    char model[512];
    REQUIRE_ASSET(test_default_gguf(model, sizeof model));
    const char *bin = getenv("QLM_BIN");
    terminal *t = calloc(1, sizeof *t);
    assert_non_null(t);
    t->pid = forkpty(&t->fd, NULL, NULL, NULL);
    assert_true(t->pid >= 0);
    if (t->pid == 0) {
        execl(bin && *bin ? bin : "build/qlm", "qlm", "chat", "-m", model, "--temp", "0", "-n", "300", "--quiet", (char *)NULL);
        _exit(127);
    }
    term_wait(t, "> ", 60);
    term_type(t, "Write a long story about a dragon who learns to fly.\r");
    term_wait(t, "dragon", 60); /* the echo */
    size_t before = t->len;
    double t0 = qlm_now_s();
    while (t->len < before + 60 && qlm_now_s() - t0 < 60) { /* some of the answer */
        struct pollfd p = {.fd = t->fd, .events = POLLIN};
        if (poll(&p, 1, 100) == 1) {
            ssize_t n = read(t->fd, t->buf + t->len, sizeof t->buf - 1 - t->len);
            if (n > 0) t->len += (size_t)n;
        }
    }
    term_type(t, "\x03");
    double stop = qlm_now_s();
    term_wait(t, "[stopped]", 10);
    term_wait(t, "> ", 10);
    print_message("chat: Ctrl-C stopped the answer in %.2f s and the prompt came back\n", qlm_now_s() - stop);
    assert_int_equal(waitpid(t->pid, NULL, WNOHANG), 0);
    term_type(t, "/help\r");
    term_wait(t, "/reset", 10);
    term_wait(t, "> ", 10);
    term_type(t, "/bogus\r");
    term_wait(t, "unknown command /bogus", 10);
    term_wait(t, "> ", 10);
    term_type(t, "\x1b[A\r"); /* Up: the last line again */
    term_wait(t, "unknown command /bogus", 10);
    term_wait(t, "> ", 10);
    term_type(t, "\x04");
    int st = 0;
    double end = qlm_now_s() + 10;
    while (waitpid(t->pid, &st, WNOHANG) == 0) {
        if (qlm_now_s() > end) {
            t->buf[t->len] = 0;
            fail_msg("Ctrl-D at the prompt did not end qlm chat:\n%s", t->buf + t->seen);
        }
        struct pollfd p = {.fd = t->fd, .events = POLLIN};
        if (poll(&p, 1, 20) == 1 && t->len < sizeof t->buf - 1) { /* keep the terminal drained */
            ssize_t n = read(t->fd, t->buf + t->len, sizeof t->buf - 1 - t->len);
            if (n > 0) t->len += (size_t)n;
        }
    }
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(t->fd);
    free(t);
}

/* Without -m, generate (and chat, summarize, serve) use the embedded default model from
 * $QLM_CACHE and say so; without it there, the error says how to fetch it. */
static void test_default_model(void **state) {
    (void)state;
    char gguf[512], cache[256], link[400];
    REQUIRE_ASSET(test_default_gguf(gguf, sizeof gguf));
    assert_non_null(test_tmpdir(cache, sizeof cache));
    snprintf(link, sizeof link, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    assert_int_equal(symlink(gguf, link), 0);
    char *out = NULL, *with_m = NULL;
    char cmd[1200];
    const char *bin = getenv("QLM_BIN");
    snprintf(cmd, sizeof cmd, "QLM_CACHE=%s %s generate -p 'The capital of France is' -n 6 --temp 0 2>%s/err", cache,
             bin && *bin ? bin : "build/qlm", cache);
    assert_int_equal(test_run_shell(&out, cmd), 0);
    char errp[300];
    snprintf(errp, sizeof errp, "%s/err", cache);
    char *err = test_read_file(errp, NULL);
    if (!strstr(err, "no -m given: the default model") || !strstr(err, "SmolLM2-135M-Instruct")) fail_msg("%s", err);
    free(err);
    assert_int_equal(test_run_qlm(&with_m, "generate -m %s -p 'The capital of France is' -n 6 --temp 0 2>/dev/null", gguf), 0);
    assert_string_equal(out, with_m);
    free(out);
    free(with_m);
    snprintf(cmd, sizeof cmd, "QLM_CACHE=%s/none %s chat -p hi 2>&1", cache, bin && *bin ? bin : "build/qlm");
    assert_int_equal(test_run_shell(&out, cmd), 2);
    if (!strstr(out, "default model") || !strstr(out, "make run")) fail_msg("%s", out);
    free(out);
    test_remove_tree(cache);
}

/* The bash completion offers the commands and each command's flags as its --help lists them, and
 * `make install PREFIX=...` puts the binary and the completion in place (the installed one runs). */
static void test_completion_and_install(void **state) {
    (void)state;
    const char *bin = getenv("QLM_BIN");
    char cmd[2048], *out = NULL, dir[256];
    snprintf(cmd, sizeof cmd,
             "bash -c 'source scripts/qlm-completion.bash; q=%s; COMP_WORDS=($q ge); COMP_CWORD=1; _qlm; "
             "echo \"${COMPREPLY[*]}\"; COMP_WORDS=($q generate --tem); COMP_CWORD=2; _qlm; echo \"${COMPREPLY[*]}\"; "
             "COMP_WORDS=($q serve --max-conn); COMP_CWORD=2; _qlm; echo \"${COMPREPLY[*]}\"'",
             bin && *bin ? bin : "build/qlm");
    assert_int_equal(test_run_shell(&out, cmd), 0);
    assert_string_equal(out, "generate\n--temp --temperature\n--max-connections --max-connections-per-ip\n");
    free(out);
    assert_non_null(test_tmpdir(dir, sizeof dir));
    /* The build folder of the binary under test (build/asan under make asan), so nothing is rebuilt. */
    char build[1024] = "build";
    if (bin && *bin && strrchr(bin, '/')) snprintf(build, sizeof build, "%.*s", (int)(strrchr(bin, '/') - bin), bin);
    snprintf(cmd, sizeof cmd,
             "make --no-print-directory -s install BUILD=%s PREFIX=%s/usr >/dev/null && %s/usr/bin/qlm --version && "
             "test -f %s/usr/share/bash-completion/completions/qlm",
             build, dir, dir, dir);
    assert_int_equal(test_run_shell(&out, cmd), 0);
    assert_memory_equal(out, "qlm ", 4);
    free(out);
    test_remove_tree(dir);
}

/* --chat-template FILE: a template that does not parse stops chat, serve and summarize before the
 * model loads, naming the file, line and column; one that parses replaces the model's (the log
 * line says which renders), and its raise_exception reaches the user. */
static void test_chat_template_file(void **state) {
    (void)state;
    char model[512], *out = NULL;
    REQUIRE_ASSET(test_default_gguf(model, sizeof model));
    char dir[512];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    char bad[600], good[600], raising[600];
    snprintf(bad, sizeof bad, "%s/bad.jinja", dir);
    snprintf(good, sizeof good, "%s/good.jinja", dir);
    snprintf(raising, sizeof raising, "%s/raising.jinja", dir);
    FILE *f = fopen(bad, "w");
    assert_non_null(f);
    fputs("{% for m in messages %}\n  {{ m.content | nosuch }}\n{% endfor %}\n", f);
    fclose(f);
    assert_non_null(f = fopen(good, "w"));
    fputs("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", f);
    fclose(f);
    assert_non_null(f = fopen(raising, "w"));
    fputs("{{ raise_exception('this template takes no ' ~ messages[0].role ~ ' turns') }}", f);
    fclose(f);
    const char *cmds[] = {"chat -p hi", "serve --port 0", "summarize -"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        assert_int_equal(test_run_qlm(&out, "%s -m %s --chat-template %s </dev/null 2>&1", cmds[i], model, bad), 1);
        if (!strstr(out, bad) || !strstr(out, "line 2, column 18: unknown filter \"nosuch\"") || strstr(out, "loaded"))
            fail_msg("%s: %s", cmds[i], out);
        free(out);
    }
    assert_int_equal(test_run_qlm(&out, "chat -m %s --chat-template %s/none.jinja -p hi 2>&1", model, dir), 1);
    assert_non_null(strstr(out, "none.jinja"));
    free(out);
    assert_int_equal(test_run_qlm(&out, "chat -m %s --chat-template %s -p 'Name a colour.' -n 4 --temp 0 2>&1", model, good), 0);
    if (!strstr(out, "chat template: Jinja, 149 bytes from ") || !strstr(out, good)) fail_msg("%s", out);
    free(out);
    assert_int_equal(test_run_qlm(&out, "chat -m %s --chat-template %s -p hi -n 4 2>&1", model, raising), 1);
    if (!strstr(out, "raise_exception: this template takes no user turns")) fail_msg("%s", out);
    free(out);
    unlink(bad);
    unlink(good);
    unlink(raising);
    rmdir(dir);
}

/* --json-object and --json-schema FILE hold generate's and chat's output to JSON (the server's
 * constraint); a bad schema is an error naming the file and the keyword, before the model loads. */
static void test_json_output(void **state) {
    (void)state;
    char model[512], *out = NULL;
    REQUIRE_ASSET(test_default_gguf(model, sizeof model));
    char dir[512], good[600], bad[600], broken[600];
    assert_non_null(test_tmpdir(dir, sizeof dir));
    snprintf(good, sizeof good, "%s/person.json", dir);
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    snprintf(broken, sizeof broken, "%s/broken.json", dir);
    const char *person = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
                         "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
    const char *pattern = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"pattern\":\"^A\"}}}";
    assert_int_equal(test_write_file(good, person, strlen(person)), 0);
    assert_int_equal(test_write_file(bad, pattern, strlen(pattern)), 0);
    assert_int_equal(test_write_file(broken, "{\"type\":", 8), 0);
    const char *sampling = "--temp 0 --frequency-penalty 0.5 -n 96";

    /* generate --json: the text is one object, and the output ended because it was complete. */
    assert_int_equal(test_run_qlm(&out, "generate -m %s --json-object -p 'A JSON object describing a cat:' %s --json --quiet",
                                  model, sampling), 0);
    cJSON *j = cJSON_Parse(out), *text = cJSON_GetObjectItem(j, "text");
    if (!cJSON_IsString(text)) fail_msg("%s", out);
    cJSON *v = cJSON_Parse(text->valuestring);
    if (!cJSON_IsObject(v)) fail_msg("not an object: %s", text->valuestring);
    assert_string_equal(cJSON_GetObjectItem(j, "stop")->valuestring, "complete");
    cJSON_Delete(v);
    cJSON_Delete(j);
    free(out);
    /* chat --json-schema: the reply validates. */
    assert_int_equal(test_run_qlm(&out, "chat -m %s --json-schema %s -p 'Invent a pilot.' %s --quiet", model, good, sampling), 0);
    v = cJSON_Parse(out);
    const cJSON *name = cJSON_GetObjectItem(v, "name"), *age = cJSON_GetObjectItem(v, "age");
    if (cJSON_GetArraySize(v) != 2 || !cJSON_IsString(name) || !cJSON_IsNumber(age) || age->valuedouble != floor(age->valuedouble))
        fail_msg("not a person: %s", out);
    cJSON_Delete(v);
    free(out);
    /* The mask's cost is reported. */
    assert_int_equal(test_run_qlm(&out, "generate -m %s --json-schema %s -p 'A person:' %s 2>&1 >/dev/null", model, good,
                                  sampling), 0);
    if (!strstr(out, "JSON token masks: ") || !strstr(out, "stop: complete")) fail_msg("%s", out);
    free(out);
    /* Errors: the file and the keyword with its place, before any model is loaded. */
    const char *cmds[] = {"generate -p hi", "chat -p hi"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(test_run_qlm(&out, "%s -m %s --json-schema %s 2>&1", cmds[i], model, bad), 1);
        if (!strstr(out, bad) || !strstr(out, "'pattern' at #/properties/name is not supported") || strstr(out, "loaded"))
            fail_msg("%s: %s", cmds[i], out);
        free(out);
        assert_int_equal(test_run_qlm(&out, "%s -m %s --json-schema %s 2>&1", cmds[i], model, broken), 1);
        if (!strstr(out, broken) || !strstr(out, "not JSON")) fail_msg("%s: %s", cmds[i], out);
        free(out);
        assert_int_equal(test_run_qlm(&out, "%s -m %s --json-schema %s/none.json 2>&1", cmds[i], model, dir), 1);
        if (!strstr(out, "none.json")) fail_msg("%s: %s", cmds[i], out);
        free(out);
        assert_int_equal(test_run_qlm(&out, "%s -m %s --json-object --json-schema %s 2>&1", cmds[i], model, good), 1);
        if (!strstr(out, "exclude each other")) fail_msg("%s: %s", cmds[i], out);
        free(out);
    }
    unlink(good);
    unlink(bad);
    unlink(broken);
    rmdir(dir);
}

static void test_command_line_errors(void **state) {
    (void)state;
    assert_int_equal(test_run_qlm(NULL, "2>/dev/null"), 2);
    assert_int_equal(test_run_qlm(NULL, "frobnicate 2>/dev/null"), 2);
    const char *cmds[] = {"generate", "chat", "info", "tokenize", "perplexity",
                          "quantize", "convert", "bench", "rouge", "summarize", "lora", "pull", "serve"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out = NULL, *help = NULL;
        assert_int_equal(test_run_qlm(&out, "%s --help", cmds[i]), 0);
        assert_non_null(strstr(out, "usage: qlm"));
        assert_int_equal(test_run_qlm(&help, "help %s", cmds[i]), 0);
        assert_string_equal(help, out);
        free(help);
        free(out);
        /* A usage error is the synopsis and a pointer to --help, not the whole help. */
        assert_int_equal(test_run_qlm(&out, "%s --no-such-flag 2>&1", cmds[i]), 2);
        int lines = 0;
        for (const char *p = out; *p; p++) lines += *p == '\n';
        if (lines > 3 || !strstr(out, "--help") || !strstr(out, "usage: qlm")) fail_msg("%s: %s", cmds[i], out);
        free(out);
    }
    char *version = NULL;
    assert_int_equal(test_run_qlm(&version, "--version"), 0);
    assert_true(!strncmp(version, "qlm ", 4) && strchr(version + 4, '.'));
    free(version);
    /* llama.cpp's -c N is the context: a context too small for the prompt says so and exits 1 (it
     * crashed: the session was freed after the model it points into). */
    char tiny[512];
    test_asset(tiny, sizeof tiny, "stories260K/stories260K.bin");
    if (test_path_exists(tiny)) {
        assert_int_equal(test_run_qlm(&version, "generate -m %s -c 4 -p 'Once upon a time there was' -n 8 2>&1", tiny), 1);
        if (!strstr(version, "context")) fail_msg("-c 4: %s", version);
        free(version);
    }
    /* llama.cpp's "-t 4" (threads) gets a hint rather than "no such tokenizer file". */
    assert_int_equal(test_run_qlm(&version, "generate -m x -t 4 -p hi 2>&1"), 2);
    assert_non_null(strstr(version, "--threads 4"));
    free(version);
    char *err = NULL;
    assert_int_equal(test_run_qlm(&err, "generate -m /nonexistent/model.gguf -p hi 2>&1"), 1);
    assert_non_null(strstr(err, "/nonexistent/model.gguf"));
    free(err);
    assert_int_equal(test_run_qlm(&err, "generate -m tests -p hi 2>&1"), 1);
    assert_non_null(strstr(err, "tests: no config.json"));
    free(err);
    char model[512];
    test_asset(model, sizeof model, "stories260K");
    if (test_path_exists(model)) {
        /* An adapter made for another base, an unknown --adapter, a malformed --lora. */
        assert_int_equal(test_run_qlm(&err, "generate -m %s --lora a=tests/fixtures/lora/mha_attn_r8 -p hi 2>&1", model), 1);
        assert_non_null(strstr(err, "mha_attn_r8"));
        assert_non_null(strstr(err, "expected"));
        free(err);
        assert_int_equal(test_run_qlm(&err, "generate -m %s --adapter b -p hi 2>&1", model), 1);
        assert_non_null(strstr(err, "--adapter b: no such adapter"));
        free(err);
        assert_int_equal(test_run_qlm(&err, "generate -m %s --lora nopath -p hi 2>&1", model), 2);
        assert_non_null(strstr(err, "NAME=PATH"));
        free(err);
    }
    assert_int_equal(test_run_qlm(&err, "generate -m x --temp -1 2>&1"), 2);
    assert_non_null(strstr(err, "--temp"));
    free(err);
    assert_int_equal(test_run_qlm(&err, "generate -m x --top-p abc 2>&1"), 2);
    free(err);
    assert_int_equal(test_run_qlm(&err, "quantize a b 2>&1"), 2);
    assert_non_null(strstr(err, "--dtype"));
    free(err);
    assert_int_equal(test_run_qlm(&err, "generate -m x --dtype q3 2>&1"), 2);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260k_greedy_matches_llama2c),
        cmocka_unit_test(test_tinystories656k_greedy_ids),
        cmocka_unit_test(test_stories260k_perplexity),
        cmocka_unit_test(test_block_dtypes),
        cmocka_unit_test(test_quantize_roundtrip),
        cmocka_unit_test(test_quantize_random_weights),
        cmocka_unit_test(test_convert_llama2c_roundtrip),
        cmocka_unit_test(test_sampling_is_seeded),
        cmocka_unit_test(test_stop_string_and_max_tokens),
        cmocka_unit_test(test_summarize),
        cmocka_unit_test(test_command_line_errors),
        cmocka_unit_test(test_chat_template_file),
        cmocka_unit_test(test_json_output),
        cmocka_unit_test(test_threads_under_load),
        cmocka_unit_test(test_own_threads_are_not_load),
        cmocka_unit_test(test_openblas_keeps_no_pool),
        cmocka_unit_test(test_chat_terminal),
        cmocka_unit_test(test_default_model),
        cmocka_unit_test(test_completion_and_install),
        cmocka_unit_test(test_clear_messages),
        cmocka_unit_test(test_weight_values_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
