/* Sharded inference under mpirun on the default model (SmolLM2-135M-Instruct): with --shard fsdp
 * each rank keeps 1/N of the weights and gathers a layer before running it; greedy generation,
 * batch summarization of DialogSum dialogues split over the ranks, and the server give exactly
 * what one process gives, and each rank holds about 1/N of the weights. */
#include <signal.h>
#include <unistd.h>

#include "dist_test_util.h"

static char g_model[512], g_dir[256], g_data[512];

static int setup(void **state) {
    (void)state;
    if (!test_tmpdir(g_dir, sizeof g_dir)) return -1;
    test_default_gguf(g_model, sizeof g_model);
    snprintf(g_data, sizeof g_data, "%s/dialogues.jsonl", g_dir);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return test_remove_tree(g_dir);
}

#define MODEL_ARGS "-m %s --dtype bf16 --device cpu"

/* Greedy JSON output (prompt ids, generated ids, text) at 2 and 4 ranks equals one process's. */
static void test_generate(void **state) {
    (void)state;
    REQUIRE_ASSET(g_model);
    const char *args = "generate " MODEL_ARGS " -p 'The three primary colors are' -n 24 --temp 0 --json --quiet";
    char *want = NULL;
    assert_int_equal(test_run_qlm(&want, args, g_model), 0);
    for (int np = 2; np <= 4; np *= 2) {
        char *got = NULL, fmt[512];
        snprintf(fmt, sizeof fmt, "%%s %s --shard fsdp", args);
        assert_int_equal(test_mpirun(&got, NULL, np, fmt, test_qlm_bin(), g_model), 0);
        print_message("%d ranks: %s", np, got);
        assert_string_equal(got, want);
        free(got);
    }
    free(want);
}

/* The first `count` DialogSum test dialogues as input lines. */
static void write_dialogues(int count) {
    char src[512];
    test_asset(src, sizeof src, "dialogsum/dialogsum.test.jsonl");
    REQUIRE_ASSET(src);
    test_corpus c = test_corpus_load(src);
    assert_true(c.n >= count);
    FILE *f = fopen(g_data, "w");
    assert_non_null(f);
    for (int i = 0; i < count; i++) fprintf(f, "%.*s\n", (int)c.len[i], c.line[i]);
    fclose(f);
    test_corpus_free(&c);
}

/* 16 dialogues at batch 8 through the chat template (make bench does 32): split over 2 and 4
 * ranks, OUT is byte for byte one process's, no part file is left, and rank 0 keeps about 1/N of
 * the weights. Each rank's batch holds other dialogues than one process's, so prompt prefixes are
 * evaluated whole (--no-prefix-reuse): a copied prefix of another length changes the rounding of
 * the rest (at 4 ranks one of 32 greedy summaries then differed). */
static void test_summarize_batch(void **state) {
    (void)state;
    REQUIRE_ASSET(g_model);
    write_dialogues(16);
    const char *args = "summarize " MODEL_ARGS " --batch %s --out %s -n 16 --batch-size 8 --no-prefix-reuse";
    char want[400], *log = NULL;
    snprintf(want, sizeof want, "%s/one.jsonl", g_dir);
    assert_int_equal(test_run_qlm(&log, "summarize -m %s --dtype bf16 --device cpu --batch %s --out %s -n 16 "
                                        "--batch-size 8 --no-prefix-reuse --quiet 2>&1",
                                  g_model, g_data, want),
                     0);
    free(log);
    char *expected = test_read_file(want, NULL);
    assert_non_null(expected);
    for (int np = 2; np <= 4; np *= 2) {
        char out[400], fmt[512];
        snprintf(out, sizeof out, "%s/ranks%d.jsonl", g_dir, np);
        snprintf(fmt, sizeof fmt, "%%s %s --shard fsdp", args);
        double secs;
        int rc = test_mpirun(&log, &secs, np, fmt, test_qlm_bin(), g_model, g_data, out);
        if (rc != 0) print_message("%s\n", log);
        assert_int_equal(rc, 0);
        double kept = 0, whole = 0;
        const char *line = strstr(log, "rank 0 keeps");
        assert_non_null(line);
        assert_int_equal(sscanf(line, "rank 0 keeps %lf of %lf MiB", &kept, &whole), 2);
        print_message("%d ranks: %.1f s, rank 0 keeps %.1f of %.1f MiB of weights\n", np, secs, kept, whole);
        assert_true(kept <= whole / np * 1.02);
        free(log);
        char *got = test_read_file(out, NULL);
        assert_non_null(got);
        assert_string_equal(got, expected);
        free(got);
        char part[500];
        snprintf(part, sizeof part, "%s.part-0", out);
        assert_false(test_path_exists(part));
    }
    free(expected);
}

/* A 2-rank server answers as one process would, and ends cleanly when rank 0 gets SIGTERM. */
static void test_serve(void **state) {
    (void)state;
    REQUIRE_ASSET(g_model);
    char *want = NULL;
    assert_int_equal(test_run_qlm(&want, "generate " MODEL_ARGS " -p 'The capital of France is' -n 12 --temp 0 --json "
                                         "--quiet",
                                  g_model),
                     0);
    char log[400], cmd[2048];
    snprintf(log, sizeof log, "%s/serve.log", g_dir);
    snprintf(cmd, sizeof cmd,
             TEST_MPIRUN " -np 2 %s serve " MODEL_ARGS " --shard fsdp --port 0 > %s 2>&1; echo $? >> %s",
             test_qlm_bin(), g_model, log, log);
    pid_t job = fork();
    assert_true(job >= 0);
    if (job == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int port = 0;
    for (int i = 0; i < 600 && !port; i++) {
        usleep(50000);
        char *text = test_read_file(log, NULL);
        const char *at = text ? strstr(text, "listening on http://127.0.0.1:") : NULL;
        if (at) port = atoi(at + strlen("listening on http://127.0.0.1:"));
        free(text);
    }
    assert_true(port > 0);
    char curl[512], *answer = NULL;
    snprintf(curl, sizeof curl,
             "curl -s localhost:%d/v1/completions -H 'Content-Type: application/json' -d "
             "'{\"prompt\":\"The capital of France is\",\"max_tokens\":12,\"temperature\":0}'",
             port);
    FILE *p = popen(curl, "r");
    assert_non_null(p);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = 0;
    pclose(p);
    answer = buf;
    /* The completion's text is generate's text. */
    const char *text = strstr(want, "\"text\": \"");
    assert_non_null(text);
    text += strlen("\"text\": \"");
    size_t len = (size_t)(strstr(text, "\", \"stop\"") - text);
    char expected[512];
    snprintf(expected, sizeof expected, "\"text\":\"%.*s\"", (int)len, text);
    print_message("server: %s\n", answer);
    assert_non_null(strstr(answer, expected));
    /* SIGTERM to rank 0: it drains and releases rank 1; the job exits 0. */
    pid_t root = 0;
    for (int i = 0; i < 100 && !root; i++) {
        char pids[64];
        FILE *q = popen("pgrep -f 'qlm serve -m'", "r");
        while (q && fgets(pids, sizeof pids, q)) {
            char env[300], all[65536];
            snprintf(env, sizeof env, "/proc/%d/environ", atoi(pids));
            FILE *e = fopen(env, "rb");
            if (!e) continue;
            size_t m = fread(all, 1, sizeof all - 1, e);
            fclose(e);
            for (size_t k = 0; k < m; k += strlen(all + k) + 1)
                if (strcmp(all + k, "OMPI_COMM_WORLD_RANK=0") == 0) root = atoi(pids);
        }
        if (q) pclose(q);
    }
    assert_true(root > 0);
    kill(root, SIGTERM);
    int status;
    waitpid(job, &status, 0);
    char *out = test_read_file(log, NULL);
    assert_non_null(out);
    size_t ol = strlen(out);
    while (ol > 0 && out[ol - 1] == '\n') out[--ol] = 0;
    const char *last = strrchr(out, '\n');
    assert_string_equal(last ? last + 1 : out, "0");
    free(out);
    free(want);
}

/* Started as several ranks without --shard, and T5 with it: refused, saying why. */
static void test_refusals(void **state) {
    (void)state;
    REQUIRE_ASSET(g_model);
    char *log = NULL;
    int rc = test_mpirun(&log, NULL, 2, "%s generate " MODEL_ARGS " -p hi -n 2", test_qlm_bin(), g_model);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(log, "started as 2 ranks: add --shard fsdp"));
    free(log);
    char t5[512];
    test_asset(t5, sizeof t5, "flan-t5-small");
    REQUIRE_ASSET(t5);
    rc = test_mpirun(&log, NULL, 2, "%s generate -m %s --random-weights -p hi -n 2 --device cpu --shard fsdp",
                     test_qlm_bin(), t5);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(log, "sharded inference runs Llama-family models"));
    free(log);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate),
        cmocka_unit_test(test_summarize_batch),
        cmocka_unit_test(test_serve),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
