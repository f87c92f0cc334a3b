/* qlm serve end to end: the real binary on a free loopback port, spoken to with the curl CLI. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <unistd.h>

#include "test_util.h"

typedef struct {
    pid_t pid;
    int port;
    char dir[256];
} server;

static void server_start(server *s, const char *model, const char *flags) {
    assert_non_null(test_tmpdir(s->dir, sizeof s->dir));
    const char *bin = getenv("QLM_BIN");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s serve -m %s --port 0 --max-seqs 4 %s >%s/out 2>%s/err",
             bin && *bin ? bin : "build/qlm", model, flags, s->dir, s->dir);
    s->pid = fork();
    assert_true(s->pid >= 0);
    if (s->pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char path[512];
    snprintf(path, sizeof path, "%s/out", s->dir);
    s->port = 0;
    for (int i = 0; i < 200 && !s->port; i++) {
        char *out = test_read_file(path, NULL);
        const char *at = out ? strstr(out, "http://127.0.0.1:") : NULL;
        if (at) s->port = atoi(at + strlen("http://127.0.0.1:"));
        free(out);
        if (!s->port) usleep(50000);
    }
    assert_true(s->port > 0);
}

/* SIGTERM must drain and exit 0; returns the server's stderr (malloc'd). */
static char *server_stop(server *s) {
    assert_int_equal(kill(s->pid, SIGTERM), 0);
    int st = 0;
    assert_int_equal(waitpid(s->pid, &st, 0), s->pid);
    if (!WIFEXITED(st)) fail_msg("qlm serve ended by signal %d", WTERMSIG(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/err", s->dir);
    return test_read_file(path, NULL);
}

/* One request; the body (if any) comes from a file. Returns the status, *resp the body (malloc'd). */
static int http(const server *s, const char *method, const char *path, const char *body, const char *headers,
                char **resp) {
    char req[512], out[512], cmd[2048];
    snprintf(req, sizeof req, "%s/req", s->dir);
    snprintf(out, sizeof out, "%s/resp", s->dir);
    if (body) assert_int_equal(test_write_file(req, body, strlen(body)), 0);
    snprintf(cmd, sizeof cmd, "curl -s -N -o %s -w '%%{http_code}' -X %s %s %s%s http://127.0.0.1:%d%s", out, method,
             headers ? headers : "", body ? "-H 'Content-Type: application/json' --data-binary @" : "", body ? req : "",
             s->port, path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int status = 0;
    assert_int_equal(fscanf(p, "%d", &status), 1);
    pclose(p);
    *resp = test_read_file(out, NULL);
    assert_non_null(*resp);
    return status;
}

static cJSON *parse(const char *text) {
    cJSON *j = cJSON_Parse(text);
    if (!j) fail_msg("not JSON: %s", text);
    return j;
}

/* A non-streamed generation's text (choices[0].text or .message.content); usage checked. */
static char *generated(const server *s, const char *route, const char *body, const char *want_finish) {
    char *resp;
    int status = http(s, "POST", route, body, NULL, &resp);
    if (status != 200) fail_msg("%s -> %d %s", route, status, resp);
    cJSON *j = parse(resp);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *text = cJSON_GetObjectItem(c, "text");
    if (!text) text = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content");
    assert_true(cJSON_IsString(text));
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, want_finish);
    cJSON *u = cJSON_GetObjectItem(j, "usage");
    assert_true(cJSON_GetObjectItem(u, "prompt_tokens")->valueint > 0);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint,
                     cJSON_GetObjectItem(u, "prompt_tokens")->valueint + cJSON_GetObjectItem(u, "completion_tokens")->valueint);
    char *out = strdup(text->valuestring);
    cJSON_Delete(j);
    free(resp);
    return out;
}

/* The same request streamed: the concatenated deltas, with [DONE] last and usage in the final chunk. */
static char *streamed(const server *s, const char *route, const char *body) {
    char *resp;
    assert_int_equal(http(s, "POST", route, body, NULL, &resp), 200);
    size_t cap = strlen(resp) + 1, len = 0;
    char *text = calloc(1, cap);
    int done = 0, usage = 0;
    for (char *line = strtok(resp, "\n"); line; line = strtok(NULL, "\n")) {
        assert_memory_equal(line, "data: ", 6);
        assert_false(done);
        if (!strcmp(line + 6, "[DONE]")) {
            done = 1;
            continue;
        }
        cJSON *j = parse(line + 6);
        cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        cJSON *t = cJSON_GetObjectItem(c, "text");
        if (!t) t = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"), "content");
        assert_true(cJSON_IsString(t));
        len += (size_t)sprintf(text + len, "%s", t->valuestring);
        usage = cJSON_GetObjectItem(j, "usage") != NULL;
        assert_true(usage == cJSON_IsString(cJSON_GetObjectItem(c, "finish_reason")));
        cJSON_Delete(j);
    }
    assert_true(done && usage);
    free(resp);
    return text;
}

static void expect_error(const server *s, const char *method, const char *path, const char *body, const char *headers,
                         int want, const char *mention) {
    char *resp;
    int status = http(s, method, path, body, headers, &resp);
    if (status != want) fail_msg("%s %s -> %d (want %d): %s", method, path, status, want, resp);
    cJSON *j = parse(resp);
    cJSON *e = cJSON_GetObjectItem(j, "error");
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "message")) && cJSON_IsString(cJSON_GetObjectItem(e, "type")));
    assert_int_equal(cJSON_GetObjectItem(e, "code")->valueint, want);
    if (mention && !strstr(cJSON_GetObjectItem(e, "message")->valuestring, mention))
        fail_msg("'%s' does not mention %s", cJSON_GetObjectItem(e, "message")->valuestring, mention);
    cJSON_Delete(j);
    free(resp);
}

static const char *k_prompts[4] = {"Once upon a time", "The cat sat", "Lily and Tom went to the park", "One day"};

static void test_serve_openai(void **state) {
    (void)state;
    char model[512];
    test_asset(model, sizeof model, "tinystories-656K-hf");
    REQUIRE_ASSET(model);
    server s;
    server_start(&s, model, "--name tiny");
    char *resp, body[1024];

    assert_int_equal(http(&s, "GET", "/health", NULL, NULL, &resp), 200);
    free(resp);
    assert_int_equal(http(&s, "GET", "/v1/models", NULL, NULL, &resp), 200);
    cJSON *j = parse(resp);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0), "id")->valuestring,
                        "tiny");
    cJSON_Delete(j);
    free(resp);

    /* Greedy: streamed == non-streamed, for completions and chat (the plain fallback template). */
    const char *gen = "{\"model\":\"tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0%s}";
    snprintf(body, sizeof body, gen, "");
    char *plain = generated(&s, "/v1/completions", body, "length");
    assert_true(strlen(plain) > 10);
    snprintf(body, sizeof body, gen, ",\"stream\":true");
    char *stream = streamed(&s, "/v1/completions", body);
    assert_string_equal(plain, stream);
    free(stream);
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":16,"
                       "\"temperature\":0,\"stop\":[\"zzz\"]%s}";
    snprintf(body, sizeof body, chat, "");
    char *chat_plain = generated(&s, "/v1/chat/completions", body, "length");
    snprintf(body, sizeof body, chat, ",\"stream\":true");
    stream = streamed(&s, "/v1/chat/completions", body);
    assert_string_equal(chat_plain, stream);
    free(stream);
    free(chat_plain);

    /* A stop string ends the text before it, with finish_reason "stop". */
    char stop[64];
    snprintf(stop, sizeof stop, "%.6s", plain + 8);
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,\"stop\":\"%s\"}", stop);
    char *cut = generated(&s, "/v1/completions", body, "stop");
    assert_true(strlen(cut) <= 8 && strncmp(cut, plain, strlen(cut)) == 0);
    free(cut);
    free(plain);

    /* Four requests at once, each as it is alone (sampled with a seed, so the slots must not mix). */
    char alone[4][512];
    for (int i = 0; i < 4; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":40,\"temperature\":0.8,\"seed\":%d}", k_prompts[i], i);
        char *t = generated(&s, "/v1/completions", body, "length");
        snprintf(alone[i], sizeof alone[i], "%s", t);
        free(t);
    }
    char cmd[8192];
    int at = snprintf(cmd, sizeof cmd, "cd %s; ", s.dir);
    for (int i = 0; i < 4; i++)
        at += snprintf(cmd + at, sizeof cmd - (size_t)at,
                       "curl -s -o c%d http://127.0.0.1:%d/v1/completions -d '{\"prompt\":\"%s\",\"max_tokens\":40,"
                       "\"temperature\":0.8,\"seed\":%d}' & ",
                       i, s.port, k_prompts[i], i);
    snprintf(cmd + at, sizeof cmd - (size_t)at, "wait");
    assert_int_equal(system(cmd), 0);
    for (int i = 0; i < 4; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/c%d", s.dir, i);
        char *out = test_read_file(path, NULL);
        assert_non_null(out);
        j = parse(out);
        assert_string_equal(
            cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text")->valuestring, alone[i]);
        cJSON_Delete(j);
        free(out);
    }

    /* tokenize / detokenize round trip. */
    assert_int_equal(http(&s, "POST", "/tokenize", "{\"prompt\":\"The cat sat\",\"add_special_tokens\":false}", NULL, &resp),
                     200);
    j = parse(resp);
    char *ids = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "tokens"));
    assert_true(cJSON_GetObjectItem(j, "count")->valueint > 0);
    cJSON_Delete(j);
    free(resp);
    snprintf(body, sizeof body, "{\"tokens\":%s}", ids);
    free(ids);
    assert_int_equal(http(&s, "POST", "/detokenize", body, NULL, &resp), 200);
    j = parse(resp);
    assert_string_equal(cJSON_GetObjectItem(j, "prompt")->valuestring, "The cat sat");
    cJSON_Delete(j);
    free(resp);

    /* Errors. */
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\": ", NULL, 400, "JSON");
    expect_error(&s, "POST", "/v1/completions", "{\"max_tokens\":4}", NULL, 400, "prompt");
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":-3}", NULL, 400, "max_tokens");
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\":\"a\",\"n\":2}", NULL, 400, "'n'");
    expect_error(&s, "POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\"}]}", NULL, 400, "messages[0]");
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\":\"a\",\"model\":\"nope\"}", NULL, 404, "nope");
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\":\"a\",\"adapter\":\"nope\"}", NULL, 404, "nope");
    expect_error(&s, "GET", "/v1/nothing", NULL, NULL, 404, NULL);
    expect_error(&s, "GET", "/v1/completions", NULL, NULL, 405, NULL);
    size_t big = (1u << 20) + 100;
    char *huge = malloc(big + 64);
    int n = sprintf(huge, "{\"prompt\":\"");
    memset(huge + n, 'a', big);
    strcpy(huge + n + big, "\"}");
    expect_error(&s, "POST", "/v1/completions", huge, NULL, 413, NULL);
    /* Long but under the body limit: more tokens than the context holds. */
    n = sprintf(huge, "{\"prompt\":\"");
    for (int i = 0; i < 2000; i++) n += sprintf(huge + n, "cat ");
    strcpy(huge + n, "\"}");
    expect_error(&s, "POST", "/v1/completions", huge, NULL, 400, "longer");
    free(huge);

    assert_int_equal(http(&s, "GET", "/metrics", NULL, NULL, &resp), 200);
    assert_non_null(strstr(resp, "qlm_queue_depth 0"));
    assert_non_null(strstr(resp, "qlm_generation_tokens_total"));
    free(resp);

    char *log = server_stop(&s);
    assert_non_null(log);
    assert_non_null(strstr(log, "POST /v1/completions 200 24 tokens"));
    assert_non_null(strstr(log, "POST /v1/completions 413"));
    free(log);
}

static void test_serve_api_key(void **state) {
    (void)state;
    char model[512];
    test_asset(model, sizeof model, "tinystories-656K-hf");
    REQUIRE_ASSET(model);
    server s;
    server_start(&s, model, "--api-key sekrit --quiet");
    char *resp;
    assert_int_equal(http(&s, "GET", "/health", NULL, NULL, &resp), 200);
    free(resp);
    expect_error(&s, "GET", "/v1/models", NULL, NULL, 401, "API key");
    expect_error(&s, "POST", "/v1/completions", "{\"prompt\":\"a\"}", "-H 'Authorization: Bearer wrong'", 401, NULL);
    assert_int_equal(http(&s, "GET", "/v1/models", NULL, "-H 'Authorization: Bearer sekrit'", &resp), 200);
    free(resp);
    /* A streamed request still running when SIGTERM comes finishes before the exit. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "curl -s -N -H 'Authorization: Bearer sekrit' -o %s/drain http://127.0.0.1:%d/v1/completions "
             "-d '{\"prompt\":\"Once\",\"max_tokens\":200,\"temperature\":0,\"stream\":true}' & sleep 0.3; kill -TERM %d; wait",
             s.dir, s.port, (int)s.pid);
    assert_int_equal(system(cmd), 0);
    free(server_stop(&s));
    char path[512];
    snprintf(path, sizeof path, "%s/drain", s.dir);
    char *drained = test_read_file(path, NULL);
    assert_non_null(drained);
    assert_non_null(strstr(drained, "data: [DONE]"));
    free(drained);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_serve_openai),
        cmocka_unit_test(test_serve_api_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
