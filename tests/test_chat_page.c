/* The chat page in a real browser: qlm serve on a free port and Debian's chromium, headless, driven
 * over the DevTools protocol on a pipe (--remote-debugging-pipe: commands go to its fd 3, replies and
 * events come from its fd 4, each one JSON object ended by a NUL byte), with trusted input events, as
 * a user. Each chat request the page sends is observed (held by the Fetch domain and let go
 * unchanged, or answered by the test where it checks the page's rendering of a given answer).
 * - test_chat_page: settings out of range (a temperature, max tokens past the server's limit) are
 *   refused on the page; then a system prompt, temperature 0 and a small max tokens are typed in and
 *   a message is sent: the request carries them, the answer streams onto the page and equals the
 *   same request sent with curl, and the truncation is shown. A screenshot is saved to
 *   $QLM_ARTIFACTS/chat_page.png, else to test-artifacts/chat_page.png in the build folder
 *   (build/<BUILD>).
 * - test_chat_page_stop: on the default model (long answers), Enter while an answer streams sends
 *   nothing; Stop cancels the request (the server stops generating), keeps the partial answer, and
 *   the next message carries it.
 * - test_chat_page_key_markdown: with --api-key, the 401 stays on screen until the key is typed in;
 *   an answer in Markdown renders as code, lists, emphasis and links, never as the HTML it holds.
 * $QLM_CHROMIUM overrides /usr/bin/chromium. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "serve_test_util.h"

enum { WIDTH = 1000, HEIGHT = 800 };
static const char k_message[] = "Tell me a story";
static const char k_system[] = "You are a storyteller.";
/* For the default model: an answer long enough to be stopped in the middle. */
static const char k_long[] = "Write a long story about a dragon who learns to fly.", k_next[] = "And then?";
/* Temperature 0 so that curl's answer repeats the page's. Max tokens other than the page's 256, so
 * that the request shows the field was read; not fewer: at 48 the whole answer sometimes reached the
 * page in one read, with no growth to see. */
static const char k_temperature[] = "0", k_max_tokens[] = "128";
static const char *g_argv0;

typedef struct {
    server srv;
    pid_t chrome;               /* the browser, also its process group's id; 0 once reaped */
    int chrome_status;          /* the browser's wait status once reaped */
    int to_chrome, from_chrome; /* our ends of its pipes, -1 when closed */
    char *in;                   /* bytes read from the browser, not yet handed out */
    size_t in_len, in_cap;
    int next_id, continue_id; /* continue_id: our Fetch.continueRequest until its reply comes */
    char session[128];
    cJSON *request;     /* the last chat request as the page sent it */
    cJSON *headers;     /* and its headers */
    int n_requests;     /* chat requests the page sent */
    const char *canned; /* an SSE body that answers the page's chat requests instead of the server */
    int passed;
} browser;

static cJSON *must(cJSON *j) {
    if (!j) fail_msg("out of memory building JSON");
    return j;
}

static void browser_fail(const browser *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Fails the test with the message, after the end of Chromium's log. */
static void browser_fail(const browser *b, const char *fmt, ...) {
    char msg[2048], path[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s/chromium.log", b->srv.dir);
    char *log = test_read_file(path, NULL);
    if (log) {
        size_t n = strlen(log);
        print_error("Chromium's log (%s) ends:\n%s\n", path, log + (n > 3000 ? n - 3000 : 0));
    }
    free(log);
    fail_msg("%s", msg);
}

/* Decodes base64 without line breaks; returns the bytes (malloc'd, NUL-terminated) or NULL. */
static unsigned char *b64_decode(const char *text, size_t *len) {
    size_t n = strlen(text);
    if (n % 4) return NULL;
    unsigned char *out = malloc(n / 4 * 3 + 1);
    if (!out) return NULL;
    int got = EVP_DecodeBlock(out, (const unsigned char *)text, (int)n);
    if (got < 0) {
        free(out);
        return NULL;
    }
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    got -= (n > 0 && text[n - 1] == '=') + (n > 1 && text[n - 2] == '=');
    out[got] = 0;
    *len = (size_t)got;
    return out;
}

/* Base64 of len bytes (malloc'd). */
static char *b64_encode(const char *bytes, size_t len) {
    char *out = malloc(len / 3 * 4 + 5);
    if (!out) fail_msg("out of memory");
    EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)bytes, (int)len);
    return out;
}

static void cdp_write(browser *b, const char *text, double end) {
    size_t len = strlen(text) + 1, off = 0; /* the NUL ends the message */
    while (off < len) {
        ssize_t n = write(b->to_chrome, text + off, len - off);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) browser_fail(b, "writing to Chromium: %s", strerror(errno));
        double left = end - qlm_now_s();
        if (left <= 0) browser_fail(b, "Chromium does not read its pipe");
        struct pollfd p = {.fd = b->to_chrome, .events = POLLOUT};
        if (poll(&p, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR) browser_fail(b, "poll: %s", strerror(errno));
    }
}

/* Sends a command (taking params; to the page's session when in_session) and returns its id. */
static int cdp_send(browser *b, const char *method, cJSON *params, int in_session) {
    cJSON *m = must(cJSON_CreateObject());
    int id = ++b->next_id;
    must(cJSON_AddNumberToObject(m, "id", id));
    must(cJSON_AddStringToObject(m, "method", method));
    if (!cJSON_AddItemToObject(m, "params", params ? params : must(cJSON_CreateObject())))
        fail_msg("out of memory building JSON");
    if (in_session) must(cJSON_AddStringToObject(m, "sessionId", b->session));
    char *text = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    if (!text) fail_msg("out of memory building JSON");
    cdp_write(b, text, qlm_now_s() + 10);
    free(text);
    return id;
}

/* The next whole message from Chromium, or NULL when none comes before end. */
static cJSON *cdp_next(browser *b, double end) {
    for (;;) {
        char *nul = b->in_len ? memchr(b->in, 0, b->in_len) : NULL;
        if (nul) {
            size_t used = (size_t)(nul - b->in) + 1;
            cJSON *m = cJSON_ParseWithLength(b->in, used - 1);
            memmove(b->in, nul + 1, b->in_len - used);
            b->in_len -= used;
            if (!m) browser_fail(b, "Chromium sent a message that is not JSON");
            return m;
        }
        double left = end - qlm_now_s();
        if (left <= 0) return NULL;
        struct pollfd p = {.fd = b->from_chrome, .events = POLLIN};
        int ready = poll(&p, 1, (int)(left * 1000) + 1);
        if (ready < 0 && errno != EINTR) browser_fail(b, "poll: %s", strerror(errno));
        if (ready <= 0) continue;
        if (b->in_cap - b->in_len < 65536) {
            size_t cap = b->in_cap * 2 > b->in_len + 65536 ? b->in_cap * 2 : b->in_len + 65536;
            char *grown = realloc(b->in, cap);
            if (!grown) fail_msg("out of memory");
            b->in = grown;
            b->in_cap = cap;
        }
        ssize_t n = read(b->from_chrome, b->in + b->in_len, b->in_cap - b->in_len);
        if (n == 0) browser_fail(b, "Chromium closed its end of the pipe");
        if (n < 0 && errno != EAGAIN && errno != EINTR) browser_fail(b, "reading from Chromium: %s", strerror(errno));
        if (n > 0) b->in_len += (size_t)n;
    }
}

/* The page's chat request, held by the Fetch domain: kept for the test, sent on unchanged (or
 * answered with b->canned). */
static void on_request(browser *b, const cJSON *params) {
    const cJSON *id = cJSON_GetObjectItem(params, "requestId"), *req = cJSON_GetObjectItem(params, "request");
    if (!cJSON_IsString(id)) browser_fail(b, "Fetch.requestPaused without a requestId");
    cJSON_Delete(b->request);
    cJSON_Delete(b->headers);
    b->request = NULL;
    b->headers = must(cJSON_Duplicate(cJSON_GetObjectItem(req, "headers"), 1));
    b->n_requests++;
    /* Newer Chromiums give the body as base64 postDataEntries, older ones as postData. */
    const cJSON *entries = cJSON_GetObjectItem(req, "postDataEntries"), *e;
    const cJSON *plain = cJSON_GetObjectItem(req, "postData");
    char *body = NULL;
    size_t len = 0;
    if (cJSON_GetArraySize(entries) > 0) {
        cJSON_ArrayForEach(e, entries) {
            const cJSON *bytes = cJSON_GetObjectItem(e, "bytes");
            size_t n = 0;
            unsigned char *part = cJSON_IsString(bytes) ? b64_decode(bytes->valuestring, &n) : NULL;
            char *grown = part ? realloc(body, len + n + 1) : NULL;
            if (!grown) browser_fail(b, "the chat request's body is not base64");
            memcpy(grown + len, part, n + 1);
            body = grown;
            len += n;
            free(part);
        }
    } else if (cJSON_IsString(plain)) {
        body = strdup(plain->valuestring);
    }
    if (!body) browser_fail(b, "the page's chat request has no body");
    b->request = cJSON_Parse(body);
    if (!cJSON_IsObject(b->request)) browser_fail(b, "the page's chat request is not a JSON object: %s", body);
    free(body);

    cJSON *p = must(cJSON_CreateObject());
    must(cJSON_AddStringToObject(p, "requestId", id->valuestring));
    if (!b->canned) {
        b->continue_id = cdp_send(b, "Fetch.continueRequest", p, 1);
        return;
    }
    char *bytes = b64_encode(b->canned, strlen(b->canned));
    must(cJSON_AddNumberToObject(p, "responseCode", 200));
    if (!cJSON_AddItemToObject(p, "responseHeaders",
                               must(cJSON_Parse("[{\"name\":\"Content-Type\",\"value\":\"text/event-stream\"}]"))))
        fail_msg("out of memory building JSON");
    must(cJSON_AddStringToObject(p, "body", bytes));
    free(bytes);
    b->continue_id = cdp_send(b, "Fetch.fulfillRequest", p, 1);
}

/* Events and replies that come while the test waits for something else. */
static void on_message(browser *b, const cJSON *m) {
    const cJSON *id = cJSON_GetObjectItem(m, "id"), *method = cJSON_GetObjectItem(m, "method");
    if (b->continue_id && cJSON_IsNumber(id) && id->valueint == b->continue_id) {
        char *err = cJSON_PrintUnformatted(cJSON_GetObjectItem(m, "error"));
        if (err) browser_fail(b, "letting the chat request go: %s", err);
        b->continue_id = 0;
    }
    if (cJSON_IsString(method) && !strcmp(method->valuestring, "Fetch.requestPaused"))
        on_request(b, cJSON_GetObjectItem(m, "params"));
}

/* Sends a command and waits (up to limit_s) for its reply; returns its result (the caller deletes it). */
static cJSON *cdp_call(browser *b, const char *method, cJSON *params, int in_session, double limit_s) {
    int id = cdp_send(b, method, params, in_session);
    double end = qlm_now_s() + limit_s;
    for (;;) {
        cJSON *m = cdp_next(b, end);
        if (!m) browser_fail(b, "no reply to %s within %.0f s", method, limit_s);
        const cJSON *got = cJSON_GetObjectItem(m, "id");
        if (cJSON_IsNumber(got) && got->valueint == id) {
            char *err = cJSON_PrintUnformatted(cJSON_GetObjectItem(m, "error"));
            if (err) browser_fail(b, "%s: %s", method, err);
            cJSON *result = cJSON_DetachItemFromObject(m, "result");
            cJSON_Delete(m);
            if (!result) browser_fail(b, "%s: a reply without a result", method);
            return result;
        }
        on_message(b, m);
        cJSON_Delete(m);
    }
}

/* Serves events for the given time. */
static void cdp_pump(browser *b, double seconds) {
    double end = qlm_now_s() + seconds;
    cJSON *m;
    while ((m = cdp_next(b, end))) {
        on_message(b, m);
        cJSON_Delete(m);
    }
}

/* Runs JavaScript in the page; returns its value (null for undefined; the caller deletes it). */
static cJSON *eval(browser *b, const char *js) {
    cJSON *p = must(cJSON_CreateObject());
    must(cJSON_AddStringToObject(p, "expression", js));
    must(cJSON_AddTrueToObject(p, "returnByValue"));
    cJSON *r = cdp_call(b, "Runtime.evaluate", p, 1, 10);
    const cJSON *ex = cJSON_GetObjectItem(r, "exceptionDetails");
    if (ex) {
        const cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(ex, "exception"), "description");
        browser_fail(b, "the page threw %s\nwhile evaluating %s", cJSON_IsString(d) ? d->valuestring : "", js);
    }
    cJSON *v = cJSON_DetachItemFromObject(cJSON_GetObjectItem(r, "result"), "value");
    cJSON_Delete(r);
    return v ? v : must(cJSON_CreateNull());
}

/* Evaluates js every 50 ms (serving events meanwhile) until it returns true; fails after limit_s. */
static void wait_until(browser *b, const char *js, double limit_s, const char *what) {
    double end = qlm_now_s() + limit_s;
    for (;;) {
        cJSON *v = eval(b, js);
        int ok = cJSON_IsTrue(v);
        cJSON_Delete(v);
        if (ok) return;
        if (qlm_now_s() > end) browser_fail(b, "%s: not within %.0f s", what, limit_s);
        cdp_pump(b, 0.05);
    }
}

/* A left click in the middle of the element, as a user's (trusted events, hit-tested). */
static void click(browser *b, const char *id) {
    char js[512];
    snprintf(js, sizeof js,
             "(() => { const e = document.getElementById('%s'), r = e.getBoundingClientRect();"
             " const x = r.x + r.width / 2, y = r.y + r.height / 2;"
             " return document.elementFromPoint(x, y) === e ? [x, y] : null; })()",
             id);
    cJSON *xy = eval(b, js);
    if (cJSON_GetArraySize(xy) != 2) {
        cJSON_Delete(xy);
        browser_fail(b, "#%s cannot be clicked: not on the screen, or covered", id);
    }
    double x = cJSON_GetArrayItem(xy, 0)->valuedouble, y = cJSON_GetArrayItem(xy, 1)->valuedouble;
    cJSON_Delete(xy);
    const char *types[] = {"mouseMoved", "mousePressed", "mouseReleased"};
    for (int i = 0; i < 3; i++) {
        char p[256];
        snprintf(p, sizeof p, "{\"type\":\"%s\",\"x\":%.1f,\"y\":%.1f,\"button\":\"left\",\"clickCount\":%d}", types[i],
                 x, y, i > 0);
        cJSON_Delete(cdp_call(b, "Input.dispatchMouseEvent", must(cJSON_Parse(p)), 1, 10));
    }
}

/* Clicks into the field, selects what it holds with Ctrl+A and types text over it. */
static void type_into(browser *b, const char *id, const char *text) {
    click(b, id);
    const char *types[] = {"rawKeyDown", "keyUp"};
    for (int i = 0; i < 2; i++) {
        char key[160];
        snprintf(key, sizeof key,
                 "{\"type\":\"%s\",\"modifiers\":2,\"key\":\"a\",\"code\":\"KeyA\",\"windowsVirtualKeyCode\":65}",
                 types[i]);
        cJSON_Delete(cdp_call(b, "Input.dispatchKeyEvent", must(cJSON_Parse(key)), 1, 10));
    }
    cJSON *p = must(cJSON_CreateObject());
    must(cJSON_AddStringToObject(p, "text", text));
    cJSON_Delete(cdp_call(b, "Input.insertText", p, 1, 10));
    char js[128];
    snprintf(js, sizeof js, "document.getElementById('%s').value", id);
    cJSON *v = eval(b, js);
    if (!cJSON_IsString(v) || strcmp(v->valuestring, text))
        browser_fail(b, "#%s holds '%s' after typing '%s'", id, cJSON_GetStringValue(v), text);
    cJSON_Delete(v);
}

static void browser_start(browser *b, const char *chrome) {
    char profile[600], log[600], size[64];
    snprintf(profile, sizeof profile, "--user-data-dir=%s/profile", b->srv.dir);
    snprintf(log, sizeof log, "%s/chromium.log", b->srv.dir);
    snprintf(size, sizeof size, "--window-size=%d,%d", WIDTH, HEIGHT);
    char *argv[] = {(char *)chrome, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    profile, size, "--remote-debugging-pipe", "about:blank", NULL};
    /* Its crash handler keeps a database under $XDG_CONFIG_HOME/chromium whatever --user-data-dir
     * says: that goes to the test's folder too. */
    char xdg[600];
    snprintf(xdg, sizeof xdg, "XDG_CONFIG_HOME=%s", b->srv.dir);
    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **envp = malloc((n_env + 2) * sizeof *envp);
    if (!envp) fail_msg("out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (strncmp(environ[i], "XDG_CONFIG_HOME=", 16)) envp[k++] = environ[i];
    envp[k++] = xdg;
    envp[k] = NULL;
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0) fail_msg("pipe2: %s", strerror(errno));
    int logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (logfd < 0 || nullfd < 0) fail_msg("open %s: %s", logfd < 0 ? log : "/dev/null", strerror(errno));
    b->chrome = fork();
    if (b->chrome < 0) fail_msg("fork: %s", strerror(errno));
    if (b->chrome == 0) {
        /* Its own process group, so that its helper processes can be killed with it. The pipe ends
         * go above 4 first, so that placing one on 3 or 4 cannot close the other. */
        int r = fcntl(to[0], F_DUPFD, 10), w = fcntl(from[1], F_DUPFD, 10);
        if (setpgid(0, 0) != 0 || r < 0 || w < 0 || dup2(r, 3) < 0 || dup2(w, 4) < 0 || dup2(nullfd, 0) < 0 ||
            dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0 || close(r) != 0 || close(w) != 0)
            _exit(126);
        execve(chrome, argv, envp);
        _exit(127);
    }
    free(envp);
    /* Also here, so that the group exists before a kill can name it (EACCES: the child has run exec,
     * after its own setpgid). */
    if (setpgid(b->chrome, b->chrome) != 0 && errno != EACCES) fail_msg("setpgid: %s", strerror(errno));
    b->to_chrome = to[1];
    b->from_chrome = from[0];
    if (close(to[0]) != 0 || close(from[1]) != 0 || close(logfd) != 0 || close(nullfd) != 0)
        fail_msg("close: %s", strerror(errno));
    if (fcntl(b->to_chrome, F_SETFL, O_NONBLOCK) != 0 || fcntl(b->from_chrome, F_SETFL, O_NONBLOCK) != 0)
        fail_msg("fcntl: %s", strerror(errno));
}

/* Waits (up to limit_s) until the browser and every process of its group have ended and are
 * reaped; returns 0 when they have. */
static int browser_reap(browser *b, double limit_s) {
    double end = qlm_now_s() + limit_s;
    for (;;) {
        int st;
        pid_t r = waitpid(-b->chrome, &st, WNOHANG);
        if (r == b->chrome) b->chrome_status = st;
        if (r > 0) continue;
        if (r < 0 && errno == ECHILD) {
            b->chrome = 0;
            return 0;
        }
        if (r < 0 && errno != EINTR) return -1;
        if (qlm_now_s() > end) return -1;
        usleep(10000);
    }
}

/* Chromium's crash handlers start sessions of their own, out of the browser's group, and come to
 * this process (their subreaper) as orphans: once the browser is gone, they are this process's only
 * children. Waits (up to limit_s) for them to end, then kills what is left; 0 when all are reaped. */
static int reap_orphans(double limit_s) {
    double end = qlm_now_s() + limit_s;
    for (int killed = 0;;) {
        pid_t r = waitpid(-1, NULL, WNOHANG);
        if (r > 0) continue;
        if (r < 0 && errno == ECHILD) return 0;
        if (r < 0 && errno != EINTR) return -1;
        if (qlm_now_s() > end) {
            if (killed) return -1;
            char path[64];
            snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)getpid(), (int)getpid());
            char *pids = test_read_file(path, NULL);
            if (!pids) return -1;
            for (char *at = pids, *next; *at; at = next) {
                long pid = strtol(at, &next, 10);
                if (next == at) break;
                if (pid > 0) kill((pid_t)pid, SIGKILL);
            }
            free(pids);
            killed = 1;
            end = qlm_now_s() + limit_s;
        }
        usleep(10000);
    }
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int setup(void **state) {
    browser *b = calloc(1, sizeof *b);
    if (!b) return -1;
    b->to_chrome = b->from_chrome = -1;
    *state = b;
    return 0;
}

/* Runs after a failure too: nothing the test started may outlive it. */
static int teardown(void **state) {
    browser *b = *state;
    int rc = 0;
    if (b->chrome > 0) {
        if (kill(-b->chrome, SIGKILL) != 0 && errno != ESRCH) print_error("kill Chromium: %s\n", strerror(errno));
        if (browser_reap(b, 10) != 0) {
            print_error("Chromium's processes (group %d) did not end\n", (int)b->chrome);
            rc = -1;
        }
    }
    if (b->srv.pid > 0 && (kill(b->srv.pid, SIGKILL) != 0 || waitpid(b->srv.pid, NULL, 0) != b->srv.pid)) {
        print_error("qlm serve (%d): %s\n", (int)b->srv.pid, strerror(errno));
        rc = -1;
    }
    if (reap_orphans(5) != 0) {
        print_error("Chromium's crash handlers did not end\n");
        rc = -1;
    }
    if (b->to_chrome >= 0) close(b->to_chrome);
    if (b->from_chrome >= 0) close(b->from_chrome);
    /* Kept after a failure: the server's and Chromium's logs are there. */
    if (b->passed && nftw(b->srv.dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        print_error("removing %s: %s\n", b->srv.dir, strerror(errno));
    free(b->in);
    cJSON_Delete(b->request);
    cJSON_Delete(b->headers);
    free(b);
    return rc;
}

/* Creates dir and its parents. */
static void make_dirs(char *dir) {
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0755); /* an error here shows in the last mkdir's */
            *p = '/';
        }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) fail_msg("mkdir %s: %s", dir, strerror(errno));
}

/* $QLM_ARTIFACTS/chat_page.png, else test-artifacts/chat_page.png in the folder above the test
 * binary's (build/<BUILD>/tests/test_chat_page -> build/<BUILD>/test-artifacts). */
static void save_screenshot(const unsigned char *png, size_t len, char *path, size_t cap) {
    const char *env = getenv("QLM_ARTIFACTS");
    char dir[512], self[512];
    snprintf(self, sizeof self, "%s", g_argv0);
    if (env && *env)
        snprintf(dir, sizeof dir, "%s", env);
    else
        snprintf(dir, sizeof dir, "%s/test-artifacts", dirname(dirname(self)));
    make_dirs(dir);
    snprintf(path, cap, "%s/chat_page.png", dir);
    if (test_write_file(path, png, len) != 0) fail_msg("cannot write %s: %s", path, strerror(errno));
}

/* Keeps, on every change of the conversation, the last answer as the page shows it (its innerText,
 * white space collapsed: qlmShown) when it differs from the one before. */
static const char k_observer[] =
    "(() => {\n"
    "  window.qlmShown = () => {\n"
    "    const a = [...document.querySelectorAll('#history .assistant')].pop();\n"
    "    return a ? a.innerText.replace(/\\s+/g, ' ').trim() : '';\n"
    "  };\n"
    "  window.qlmSeen = [];\n"
    "  new MutationObserver(() => {\n"
    "    const t = window.qlmShown(), seen = window.qlmSeen;\n"
    "    if (!t || seen[seen.length - 1] === t) return;\n"
    "    seen.push(t);\n"
    "    window.qlmLast = performance.now();\n"
    "    if (seen.length === 1) window.qlmFirst = window.qlmLast;\n"
    "  }).observe(document.getElementById('history'), { childList: true, subtree: true, characterData: true });\n"
    "  return true;\n"
    "})()";

/* The chat answer's events handed to the page one read at a time (counted in qlmEvents), whatever
 * chunks the network makes of them: a fast machine's tiny model writes all 128 tokens before the
 * page's first read, and a busy one may keep the page from reading until they have all arrived (one
 * text on the page either way; once so in a CI run on 2 cores even through a 16 KB/s emulated
 * connection, whose throttle also let what was left through at once at random points). The page's
 * own reader then shows the answer growing as it does when the events come apart. */
static const char k_event_reads[] =
    "(() => {\n"
    "  const fetch0 = window.fetch;\n"
    "  window.fetch = async (...args) => {\n"
    "    const resp = await fetch0(...args);\n"
    "    if (args[0] !== '/v1/chat/completions' || !resp.body) return resp;\n"
    "    const reader = resp.body.getReader(), dec = new TextDecoder(), enc = new TextEncoder();\n"
    "    let buf = '';\n"
    "    const body = new ReadableStream({ async pull(c) {\n"
    "      for (;;) {\n"
    "        const at = buf.indexOf('\\n\\n');\n"
    "        if (at >= 0) {\n"
    "          window.qlmEvents = (window.qlmEvents || 0) + 1;\n"
    "          c.enqueue(enc.encode(buf.slice(0, at + 2)));\n"
    "          buf = buf.slice(at + 2);\n"
    "          return;\n"
    "        }\n"
    "        const { value, done } = await reader.read();\n"
    "        if (done) { if (buf) c.enqueue(enc.encode(buf)); c.close(); return; }\n"
    "        buf += dec.decode(value, { stream: true });\n"
    "      }\n"
    "    } });\n"
    "    return new Response(body, { status: resp.status, statusText: resp.statusText, headers: resp.headers });\n"
    "  };\n"
    "  return true;\n"
    "})()";

static const char *string_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!cJSON_IsString(v)) fail_msg("no string '%s' in %s", key, cJSON_PrintUnformatted(o));
    return v->valuestring;
}

/* s with each run of white space made one space, none at the ends (malloc'd): text as a page shows it. */
static char *collapsed(const char *s) {
    char *out = malloc(strlen(s) + 1), *o = out;
    if (!out) fail_msg("out of memory");
    for (; *s; s++) {
        if (!isspace((unsigned char)*s)) *o++ = *s;
        else if (o > out && !isspace((unsigned char)s[1]) && s[1]) *o++ = ' ';
    }
    *o = 0;
    return out;
}

static int eval_true(browser *b, const char *js) {
    cJSON *v = eval(b, js);
    int t = cJSON_IsTrue(v);
    cJSON_Delete(v);
    return t;
}

static char *eval_string(browser *b, const char *js) {
    cJSON *v = eval(b, js);
    if (!cJSON_IsString(v)) browser_fail(b, "%s is not a string", js);
    char *s = strdup(v->valuestring);
    cJSON_Delete(v);
    if (!s) fail_msg("out of memory");
    return s;
}

/* Enter in the field, as a key pressed (keydown, then the character it would type). */
static void press_enter(browser *b, const char *id) {
    click(b, id);
    const char *keys[] = {
        "{\"type\":\"rawKeyDown\",\"key\":\"Enter\",\"code\":\"Enter\",\"windowsVirtualKeyCode\":13}",
        "{\"type\":\"char\",\"key\":\"Enter\",\"code\":\"Enter\",\"text\":\"\\r\",\"windowsVirtualKeyCode\":13}",
        "{\"type\":\"keyUp\",\"key\":\"Enter\",\"code\":\"Enter\",\"windowsVirtualKeyCode\":13}"};
    for (int i = 0; i < 3; i++) cJSON_Delete(cdp_call(b, "Input.dispatchKeyEvent", must(cJSON_Parse(keys[i])), 1, 10));
}

/* The server on model with flags, and the chat page open in a browser tab of its own (its session
 * flattened into the pipe, its chat requests held), with the observer installed. */
static void open_page(browser *b, const char *model, const char *flags) {
    const char *env = getenv("QLM_CHROMIUM"), *chrome = env && *env ? env : "/usr/bin/chromium";
    if (access(chrome, X_OK) != 0) {
        const char *req = getenv("QLM_REQUIRE_ASSETS");
        if (req && !strcmp(req, "1")) fail_msg("%s is missing (scripts/setup.sh --test installs it)", chrome);
        print_message("%s is missing, skipping (scripts/setup.sh --test installs it)\n", chrome);
        skip();
    }
    server_start(&b->srv, model, flags);
    browser_start(b, chrome);
    cJSON *r = cdp_call(b, "Target.createTarget", must(cJSON_Parse("{\"url\":\"about:blank\"}")), 0, 30);
    cJSON *p = must(cJSON_CreateObject());
    must(cJSON_AddStringToObject(p, "targetId", string_of(r, "targetId")));
    must(cJSON_AddTrueToObject(p, "flatten"));
    cJSON_Delete(r);
    r = cdp_call(b, "Target.attachToTarget", p, 0, 10);
    snprintf(b->session, sizeof b->session, "%s", string_of(r, "sessionId"));
    cJSON_Delete(r);
    cJSON_Delete(cdp_call(b, "Fetch.enable",
                          must(cJSON_Parse("{\"patterns\":[{\"urlPattern\":\"*/v1/chat/completions\"}]}")), 1, 10));
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", b->srv.port);
    p = must(cJSON_CreateObject());
    must(cJSON_AddStringToObject(p, "url", url));
    r = cdp_call(b, "Page.navigate", p, 1, 10);
    if (cJSON_GetObjectItem(r, "errorText")) browser_fail(b, "opening %s: %s", url, string_of(r, "errorText"));
    cJSON_Delete(r);
    wait_until(b, "document.readyState === 'complete'", 20, "the page");
    if (!eval_true(b, k_observer)) browser_fail(b, "the observer was not installed");
}

static void wait_models(browser *b, const char *name) {
    wait_until(b, "document.querySelectorAll('#model option').length > 0", 20, "the model list");
    char *v = eval_string(b, "document.getElementById('model').value");
    assert_string_equal(v, name);
    free(v);
}

/* Closes the browser (it must exit 0) and drains the server. */
static void close_page(browser *b) {
    cdp_send(b, "Browser.close", NULL, 0);
    if (browser_reap(b, 10) != 0) browser_fail(b, "Chromium did not exit within 10 s of Browser.close");
    if (!WIFEXITED(b->chrome_status) || WEXITSTATUS(b->chrome_status) != 0)
        browser_fail(b, "Chromium ended with wait status %#x", b->chrome_status);
    free(server_stop(&b->srv));
    b->passed = 1;
}

/* Waits until the page has finished with the answer: its status is one of the given (a JS array). */
static char *wait_status(browser *b, const char *states, double limit_s) {
    char js[256];
    snprintf(js, sizeof js,
             "%s.includes(document.getElementById('status').textContent) && document.getElementById('stop').hidden",
             states);
    wait_until(b, js, limit_s, "the end of the answer");
    return eval_string(b, "document.getElementById('status').textContent");
}

/* A setting the page must refuse: typed in, Send clicked, the status line says why, and no request
 * goes out; the message stays in its box and out of the history. */
static void refused_setting(browser *b, const char *id, const char *value, const char *why) {
    int before = b->n_requests;
    type_into(b, id, value);
    click(b, "send");
    char js[256];
    snprintf(js, sizeof js, "document.getElementById('status').textContent === '%s'", why);
    wait_until(b, js, 10, why);
    cdp_pump(b, 0.2); /* time for a request the page would have started to come paused */
    if (b->n_requests != before) browser_fail(b, "the page sent %s %s: %s", id, value, cJSON_PrintUnformatted(b->request));
    snprintf(js, sizeof js,
             "document.querySelectorAll('#history .msg').length === 0 &&"
             " document.getElementById('message').value === '%s'",
             k_message);
    if (!eval_true(b, js)) browser_fail(b, "the refused message left the message box or reached the history");
}

/* A chat message {role, content}. */
static cJSON *message(const char *role, const char *content) {
    cJSON *m = must(cJSON_CreateObject());
    must(cJSON_AddStringToObject(m, "role", role));
    must(cJSON_AddStringToObject(m, "content", content));
    return m;
}

static void test_chat_page(void **state) {
    browser *b = *state;
    char model[512];
    test_asset(model, sizeof model, "tinystories-656K-hf");
    REQUIRE_ASSET(model);
    double t0 = qlm_now_s();
    /* One thread: the server sends what the model wrote since its last event as one event, so a
     * model on every core can finish before the events go out (the page then has nothing to grow). */
    open_page(b, model, "--name tiny --quiet --max-output 200 --threads 1");
    wait_models(b, "tiny");
    /* The page takes the server's limit on max tokens. */
    char *max = eval_string(b, "document.getElementById('max-tokens').max");
    assert_string_equal(max, "200");
    free(max);

    type_into(b, "message", k_message);
    refused_setting(b, "temperature", "5", "Temperature must be a number from 0 to 2");
    type_into(b, "temperature", k_temperature);
    refused_setting(b, "max-tokens", "500", "Max tokens must be a whole number from 1 to 200");

    /* The settings and a system prompt typed into their fields and the message sent with the button,
     * as a user does. */
    type_into(b, "max-tokens", k_max_tokens);
    type_into(b, "system", k_system);
    if (!eval_true(b, k_event_reads)) browser_fail(b, "fetch was not wrapped");
    click(b, "send");
    double t_sent = qlm_now_s();
    char *status = wait_status(b, "['done', 'error']", 60);
    double answer_s = qlm_now_s() - t_sent;
    char *answer = eval_string(b, "window.qlmShown()");
    if (strcmp(status, "done")) browser_fail(b, "the page shows an error: %s", answer);
    free(status);
    char *user = eval_string(b, "[...document.querySelectorAll('.msg.user')].pop().textContent");
    assert_string_equal(user, k_message);
    free(user);
    assert_true(strlen(answer) > 0);

    /* (a) The page's request carries the system prompt and the settings, and sent with curl without
     * streaming gives the text the page shows. */
    if (b->n_requests != 1 || !b->request) browser_fail(b, "the page sent %d chat requests, not 1", b->n_requests);
    cJSON *want = must(cJSON_CreateArray());
    if (!cJSON_AddItemToArray(want, message("system", k_system)) ||
        !cJSON_AddItemToArray(want, message("user", k_message)))
        fail_msg("out of memory building JSON");
    const cJSON *temperature = cJSON_GetObjectItem(b->request, "temperature");
    const cJSON *max_tokens = cJSON_GetObjectItem(b->request, "max_tokens");
    if (!cJSON_Compare(cJSON_GetObjectItem(b->request, "messages"), want, 1) ||
        !cJSON_IsTrue(cJSON_GetObjectItem(b->request, "stream")) || !cJSON_IsNumber(temperature) ||
        temperature->valuedouble != atof(k_temperature) || !cJSON_IsNumber(max_tokens) ||
        max_tokens->valuedouble != atof(k_max_tokens))
        fail_msg("the page sent %s", cJSON_PrintUnformatted(b->request));
    cJSON_Delete(want);
    cJSON *same = must(cJSON_Duplicate(b->request, 1));
    cJSON_DeleteItemFromObject(same, "stream");
    char *body = cJSON_PrintUnformatted(same), *resp;
    cJSON_Delete(same);
    if (!body) fail_msg("out of memory building JSON");
    int code = http(&b->srv, "POST", "/v1/chat/completions", body, "--max-time 30", &resp);
    if (code != 200) fail_msg("curl %s -> %d %s", body, code, resp);
    cJSON *plain = parse(resp);
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(plain, "choices"), 0);
    const cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(choice, "message"), "content");
    if (!cJSON_IsString(content)) fail_msg("no message.content in %s", resp);
    char *want_text = collapsed(content->valuestring);
    assert_string_equal(answer, want_text);
    free(want_text);

    /* (b) The answer ran into max tokens, and the page says so under it. */
    assert_string_equal(string_of(choice, "finish_reason"), "length");
    char *note = eval_string(b, "(() => { const n = [...document.querySelectorAll('#history .assistant')].pop()"
                                ".nextElementSibling; return n && n.className === 'note' ? n.textContent : ''; })()");
    assert_string_equal(note, "stopped at max tokens (128)");
    free(note);
    cJSON_Delete(plain);
    free(resp);
    free(body);

    /* (c) The answer grew on the page: each text it showed extends the one before, and at least two
     * came before the final one. */
    cJSON *seen = eval(b, "window.qlmSeen");
    int n_seen = cJSON_GetArraySize(seen);
    for (int i = 0; i + 1 < n_seen; i++) {
        const char *s = cJSON_GetStringValue(cJSON_GetArrayItem(seen, i));
        const char *next = cJSON_GetStringValue(cJSON_GetArrayItem(seen, i + 1));
        if (!s || !next || strncmp(s, next, strlen(s)))
            fail_msg("text %d of the answer, '%s', does not grow into '%s'", i, s, next);
    }
    if (n_seen < 3) {
        cJSON *events = eval(b, "window.qlmEvents || 0");
        fail_msg("the answer was shown as %d text(s) from %.0f events, not streamed: %s", n_seen, events->valuedouble,
                 answer);
    }
    assert_string_equal(cJSON_GetArrayItem(seen, n_seen - 1)->valuestring, answer);
    cJSON_Delete(seen);
    cJSON *ms = eval(b, "(window.qlmLast || 0) - (window.qlmFirst || 0)");

    /* (d) A PNG screenshot of the page with the conversation. */
    cJSON *r = cdp_call(b, "Page.captureScreenshot", must(cJSON_Parse("{\"format\":\"png\"}")), 1, 20);
    size_t png_len;
    unsigned char *png = b64_decode(string_of(r, "data"), &png_len);
    cJSON_Delete(r);
    if (!png || png_len < 24 || memcmp(png, "\x89PNG\r\n\x1a\n", 8)) fail_msg("the screenshot is not a PNG");
    char shot[600];
    save_screenshot(png, png_len, shot, sizeof shot);
    unsigned w = (unsigned)png[16] << 24 | png[17] << 16 | png[18] << 8 | png[19];
    unsigned h = (unsigned)png[20] << 24 | png[21] << 16 | png[22] << 8 | png[23];
    free(png);
    print_message("chat page: %d texts over %.0f ms, %zu chars, answered in %.2f s\n", n_seen, ms->valuedouble,
                  strlen(answer), answer_s);
    print_message("screenshot (%ux%u): %s\n", w, h, shot);
    cJSON_Delete(ms);
    free(answer);
    close_page(b);
    print_message("chat page: %.1f s in all\n", qlm_now_s() - t0);
}

/* A counter or gauge of the server's /metrics. */
static long metric(browser *b, const char *name) {
    char *resp;
    if (http(&b->srv, "GET", "/metrics", NULL, "", &resp) != 200) fail_msg("GET /metrics: %s", resp);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *at = strstr(resp, key);
    if (!at) fail_msg("no %s in /metrics:\n%s", name, resp);
    long v = atol(at + strlen(key));
    free(resp);
    return v;
}

static void test_chat_page_stop(void **state) {
    browser *b = *state;
    char model[512];
    test_default_gguf(model, sizeof model);
    REQUIRE_ASSET(model);
    open_page(b, model, "--name smol --quiet");
    wait_models(b, "smol");
    type_into(b, "temperature", "0");
    type_into(b, "max-tokens", "1000");
    type_into(b, "message", k_long);
    press_enter(b, "message");
    wait_until(b, "window.qlmShown().length >= 20", 60, "the start of the answer");
    if (!eval_true(b, "!document.getElementById('stop').hidden && document.getElementById('send').hidden"))
        browser_fail(b, "while the answer streams, Stop is not shown in place of Send");

    /* Enter while the answer streams sends nothing and leaves the next message in its box. */
    type_into(b, "message", k_next);
    press_enter(b, "message");
    cdp_pump(b, 0.3);
    if (b->n_requests != 1) browser_fail(b, "Enter during an answer sent a request: %s", cJSON_PrintUnformatted(b->request));
    char *box = eval_string(b, "document.getElementById('message').value");
    assert_string_equal(box, k_next);
    free(box);

    /* Stop: the partial answer stays, marked, and the server stops generating. */
    click(b, "stop");
    char *status = wait_status(b, "['done', 'stopped', 'error']", 10);
    if (strcmp(status, "stopped")) browser_fail(b, "the answer ended as '%s' rather than by Stop", status);
    free(status);
    char *partial = eval_string(b, "window.qlmShown()");
    char *note = eval_string(b, "[...document.querySelectorAll('#history .assistant')].pop().nextElementSibling.textContent");
    assert_string_equal(note, "stopped");
    free(note);
    double end = qlm_now_s() + 10;
    while (metric(b, "qlm_running_sequences") != 0) {
        if (qlm_now_s() > end) fail_msg("the server still generates 10 s after Stop");
        usleep(50000);
    }
    long generated = metric(b, "qlm_generation_tokens_total");
    if (generated >= 1000) fail_msg("the server generated all %ld tokens despite Stop", generated);

    /* The next message goes out with the partial answer in the conversation. */
    press_enter(b, "message");
    wait_until(b, "window.qlmShown() !== '' && document.querySelectorAll('#history .user').length === 2", 10,
               "the next message");
    cdp_pump(b, 0.2);
    if (b->n_requests != 2 || !b->request) browser_fail(b, "%d chat requests, not 2", b->n_requests);
    const cJSON *sent = cJSON_GetObjectItem(b->request, "messages");
    const cJSON *said = cJSON_GetObjectItem(cJSON_GetArrayItem(sent, 1), "content");
    char *said_shown = cJSON_IsString(said) ? collapsed(said->valuestring) : NULL;
    if (cJSON_GetArraySize(sent) != 3 || !said_shown || strcmp(said_shown, partial))
        fail_msg("after Stop the page sent %s; the answer shown was '%s'", cJSON_PrintUnformatted(sent), partial);
    print_message("chat page: stopped after %zu chars; the server generated %ld tokens of 1000\n", strlen(partial),
                  generated);
    free(said_shown);
    free(partial);
    /* The second answer ends here, by Stop or on its own: its length follows from where Stop cut the
     * first, which depends on timing (under ASan it was over before a user's click could reach Stop).
     * Stop's click is checked above; this one is cleanup and goes through the element. */
    assert_true(eval_true(b, "(document.getElementById('stop').hidden || document.getElementById('stop').click(), true)"));
    free(wait_status(b, "['done', 'stopped']", 10));
    close_page(b);
}

/* An SSE stream as the server sends it, with the text in the given pieces (one chunk each). */
static char *sse_body(const char *const *pieces, int n) {
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    if (!out) fail_msg("out of memory");
    out[0] = 0;
    for (int i = 0; i <= n; i++) {
        char *chunk = NULL;
        cJSON *c = must(cJSON_Parse("{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{}}]}"));
        cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0);
        if (i < n) {
            must(cJSON_AddStringToObject(cJSON_GetObjectItem(choice, "delta"), "content", pieces[i]));
            must(cJSON_AddNullToObject(choice, "finish_reason"));
        } else {
            must(cJSON_AddStringToObject(choice, "finish_reason", "stop"));
        }
        chunk = cJSON_PrintUnformatted(c);
        cJSON_Delete(c);
        if (!chunk) fail_msg("out of memory building JSON");
        size_t need = len + strlen(chunk) + 32;
        if (need > cap && !(out = realloc(out, cap = need * 2))) fail_msg("out of memory");
        len += (size_t)sprintf(out + len, "data: %s\n\n", chunk);
        free(chunk);
    }
    if (len + 16 > cap && !(out = realloc(out, len + 16))) fail_msg("out of memory");
    strcpy(out + len, "data: [DONE]\n\n");
    return out;
}

/* What the page made of the Markdown answer, as JSON. */
static const char k_rendered[] =
    "(() => {\n"
    "  const a = [...document.querySelectorAll('#history .assistant')].pop();\n"
    "  const texts = (sel) => [...a.querySelectorAll(sel)].map((e) => e.textContent);\n"
    "  const ol = a.querySelector('ol'), code = a.querySelector('pre > code');\n"
    "  return { h2: texts('h2'), strong: texts('strong'), em: texts('em'), code: texts(':not(pre) > code'),\n"
    "    links: [...a.querySelectorAll('a')].map((e) => e.getAttribute('href') + ' ' + e.textContent),\n"
    "    ul: texts('ul > li'), ol: texts('ol > li'), olStart: ol ? ol.start : 0, quote: texts('blockquote'),\n"
    "    block: code ? code.textContent : '', lang: code ? code.className : '',\n"
    "    markup: document.querySelectorAll('#history img, #history b, #history script').length,\n"
    "    pwned: window.qlmPwned === undefined ? 0 : window.qlmPwned, shown: window.qlmShown() };\n"
    "})()";

static void expect_list(const cJSON *got, const char *key, const char *const *want, int n) {
    const cJSON *list = cJSON_GetObjectItem(got, key);
    int ok = cJSON_GetArraySize(list) == n;
    for (int i = 0; ok && i < n; i++) ok = !strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(list, i)), want[i]);
    if (!ok) fail_msg("the Markdown's %s rendered as %s", key, cJSON_PrintUnformatted(list));
}

static void test_chat_page_key_markdown(void **state) {
    browser *b = *state;
    char model[512];
    test_asset(model, sizeof model, "tinystories-656K-hf");
    REQUIRE_ASSET(model);
    open_page(b, model, "--name tiny --quiet --api-key sesame");

    /* Without the key, the page says what is needed and keeps saying it, through a refused message. */
    wait_until(b, "!document.getElementById('alert').hidden", 20, "the page's alert");
    char *alert = eval_string(b, "document.getElementById('alert').textContent");
    if (!strstr(alert, "API key")) browser_fail(b, "the alert says '%s'", alert);
    free(alert);
    type_into(b, "message", k_message);
    click(b, "send");
    free(wait_status(b, "['error']", 20));
    if (!eval_true(b, "!document.getElementById('alert').hidden &&"
                      " document.getElementById('alert').textContent.includes('refused the API key') &&"
                      " document.querySelector('#history .error') !== null"))
        browser_fail(b, "after a refused message the 401 is not on screen");

    /* The key typed in: the models load, the alert goes, and requests carry the key. */
    type_into(b, "key", "sesame");
    click(b, "message"); /* leaving the field commits it */
    wait_models(b, "tiny");
    if (!eval_true(b, "document.getElementById('alert').hidden")) browser_fail(b, "the alert stays with the right key");

    /* An answer in Markdown (given by the test, split across chunks as a stream is). */
    static const char *const pieces[] = {
        "## Ste", "ps\nUse **bold** and *ital", "ic* and `x = 1`, see [the docs](https://example.com/docs).\n\n",
        "- first\n- second\n\n3. three\n4. four\n\n> quoted <b>text</b>\n\n```c\nint main(void) {\n",
        ("  return 0;\n}\n```\n<img src=x onerror=\"window.qlmPwned=1\"> [bad](javascript:window.qlmPwned=2) "
         "snake_case_name stays."),
    };
    char *canned = sse_body(pieces, (int)(sizeof pieces / sizeof *pieces));
    b->canned = canned;
    type_into(b, "message", "Show me Markdown");
    click(b, "send");
    char *status = wait_status(b, "['done', 'error']", 20);
    assert_string_equal(status, "done");
    free(status);
    b->canned = NULL;
    free(canned);
    const cJSON *auth = cJSON_GetObjectItem(b->headers, "Authorization");
    if (!cJSON_IsString(auth) || strcmp(auth->valuestring, "Bearer sesame"))
        fail_msg("the page's request has the headers %s", cJSON_PrintUnformatted(b->headers));
    cJSON *got = eval(b, k_rendered);
    expect_list(got, "h2", (const char *const[]){"Steps"}, 1);
    expect_list(got, "strong", (const char *const[]){"bold"}, 1);
    expect_list(got, "em", (const char *const[]){"italic"}, 1);
    expect_list(got, "code", (const char *const[]){"x = 1"}, 1);
    expect_list(got, "links", (const char *const[]){"https://example.com/docs the docs"}, 1);
    expect_list(got, "ul", (const char *const[]){"first", "second"}, 2);
    expect_list(got, "ol", (const char *const[]){"three", "four"}, 2);
    expect_list(got, "quote", (const char *const[]){"quoted <b>text</b>"}, 1);
    assert_int_equal(cJSON_GetObjectItem(got, "olStart")->valueint, 3);
    assert_string_equal(string_of(got, "block"), "int main(void) {\n  return 0;\n}");
    assert_string_equal(string_of(got, "lang"), "language-c");
    if (cJSON_GetObjectItem(got, "markup")->valueint != 0 || cJSON_GetObjectItem(got, "pwned")->valueint != 0 ||
        !strstr(string_of(got, "shown"), "<img src=x onerror=\"window.qlmPwned=1\">") ||
        !strstr(string_of(got, "shown"), "snake_case_name stays."))
        fail_msg("the answer's HTML became markup: %s", cJSON_PrintUnformatted(got));
    cJSON_Delete(got);
    close_page(b);
}

int main(int argc, char **argv) {
    (void)argc;
    g_argv0 = argv[0];
    /* Chromium's helpers orphaned by a killed browser come to this process, which can then reap them. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
        perror("prctl(PR_SET_CHILD_SUBREAPER)");
        return 1;
    }
    /* A write to a Chromium that has gone fails with EPIPE instead of ending the test. */
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
        perror("signal(SIGPIPE)");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_chat_page, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chat_page_stop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chat_page_key_markdown, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
