/* Helpers shared by the tests that run the real `qlm serve` (test_serve.c, test_chat_page.c): the
 * binary ($QLM_BIN, default build/qlm) on a free loopback port, spoken to with the curl CLI. */
#ifndef QLM_SERVE_TEST_UTIL_H
#define QLM_SERVE_TEST_UTIL_H

#include <cjson/cJSON.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

typedef struct {
    pid_t pid; /* 0 once reaped */
    int port;
    char dir[256];
} server;

static inline void server_start(server *s, const char *model, const char *flags) {
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
        /* "listening on http://HOST:PORT (model ...", HOST maybe "[::1]" */
        const char *at = out ? strstr(out, "listening on http://") : NULL, *end = at ? strstr(at, " (model") : NULL;
        if (end) {
            const char *colon = end;
            while (colon > at && *colon != ':') colon--;
            s->port = atoi(colon + 1);
        }
        free(out);
        if (!s->port) usleep(50000);
    }
    assert_true(s->port > 0);
}

/* SIGTERM must drain and exit 0; returns the server's stderr (malloc'd). */
static inline char *server_stop(server *s) {
    assert_int_equal(kill(s->pid, SIGTERM), 0);
    int st = 0;
    assert_int_equal(waitpid(s->pid, &st, 0), s->pid);
    s->pid = 0;
    if (!WIFEXITED(st)) fail_msg("qlm serve ended by signal %d", WTERMSIG(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    char path[512];
    snprintf(path, sizeof path, "%s/err", s->dir);
    return test_read_file(path, NULL);
}

/* One request; the body (if any) comes from a file. Returns the status, *resp the body (malloc'd). */
static inline int http(const server *s, const char *method, const char *path, const char *body, const char *headers,
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

static inline cJSON *parse(const char *text) {
    cJSON *j = cJSON_Parse(text);
    if (!j) fail_msg("not JSON: %s", text);
    return j;
}

#endif
