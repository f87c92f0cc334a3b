/* The chat page in a real browser: qlm serve on a free port and Debian's chromium, headless, driven
 * over the DevTools protocol on a pipe (--remote-debugging-pipe: commands go to its fd 3, replies and
 * events come from its fd 4, each one JSON object ended by a NUL byte). With trusted input events, as
 * a user: a temperature out of range is refused on the page without a request; then Temperature 0
 * and a small Max tokens are typed into the page's settings and a message is sent. The request the
 * page sends is observed (held by the Fetch domain and let go unchanged), the answer is watched as it
 * streams onto the page and compared with the same request sent with curl, and a screenshot is saved
 * to $QLM_ARTIFACTS/chat_page.png, else to test-artifacts/chat_page.png in the build folder
 * (build/<BUILD>). $QLM_CHROMIUM overrides /usr/bin/chromium. */
#include <cjson/cJSON.h>
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
    cJSON *request; /* the chat request as the page sent it */
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

/* The page's chat request, held by the Fetch domain: kept for the test, sent on unchanged. */
static void on_request(browser *b, const cJSON *params) {
    const cJSON *id = cJSON_GetObjectItem(params, "requestId"), *req = cJSON_GetObjectItem(params, "request");
    if (!cJSON_IsString(id)) browser_fail(b, "Fetch.requestPaused without a requestId");
    if (b->request) browser_fail(b, "the page sent a second chat request");
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
    b->continue_id = cdp_send(b, "Fetch.continueRequest", p, 1);
}

/* Events and replies that come while the test waits for something else. */
static void on_message(browser *b, const cJSON *m) {
    const cJSON *id = cJSON_GetObjectItem(m, "id"), *method = cJSON_GetObjectItem(m, "method");
    if (b->continue_id && cJSON_IsNumber(id) && id->valueint == b->continue_id) {
        char *err = cJSON_PrintUnformatted(cJSON_GetObjectItem(m, "error"));
        if (err) browser_fail(b, "Fetch.continueRequest: %s", err);
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
    if (cJSON_GetArraySize(xy) != 2) browser_fail(b, "#%s cannot be clicked: not on the screen, or covered", id);
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

static const char k_observer[] =
    "(() => {\n"
    "  window.qlmSeen = [];\n"
    "  window.qlmBatches = 0;\n"
    "  new MutationObserver((records) => {\n"
    "    const seen = window.qlmSeen, before = seen.length;\n"
    "    for (const r of records) {\n"
    "      if (r.type !== 'childList' || !r.target.classList.contains('assistant')) continue;\n"
    "      for (const n of r.addedNodes)\n"
    "        if (seen[seen.length - 1] !== n.textContent) seen.push(n.textContent);\n"
    "    }\n"
    "    if (seen.length === before) return;\n"
    "    window.qlmBatches++;\n"
    "    window.qlmLast = performance.now();\n"
    "    if (before === 0) window.qlmFirst = window.qlmLast;\n"
    "  }).observe(document.getElementById('history'), { childList: true, subtree: true });\n"
    "  return true;\n"
    "})()";

static const char *string_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItem(o, key);
    if (!cJSON_IsString(v)) fail_msg("no string '%s' in %s", key, cJSON_PrintUnformatted(o));
    return v->valuestring;
}

static void test_chat_page(void **state) {
    browser *b = *state;
    char model[512];
    test_asset(model, sizeof model, "tinystories-656K-hf");
    REQUIRE_ASSET(model);
    const char *env = getenv("QLM_CHROMIUM"), *chrome = env && *env ? env : "/usr/bin/chromium";
    if (access(chrome, X_OK) != 0) {
        const char *req = getenv("QLM_REQUIRE_ASSETS");
        if (req && !strcmp(req, "1")) fail_msg("%s is missing (scripts/setup.sh --test installs it)", chrome);
        print_message("%s is missing, skipping (scripts/setup.sh --test installs it)\n", chrome);
        skip();
    }
    double t0 = qlm_now_s();
    server_start(&b->srv, model, "--name tiny --quiet");
    browser_start(b, chrome);

    /* A tab of its own, its session flattened into the pipe; the page's chat request held. */
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
    wait_until(b, "document.readyState === 'complete' && document.querySelectorAll('#model option').length > 0", 20,
               "the model list");
    cJSON *v = eval(b, "document.getElementById('model').value");
    assert_string_equal(cJSON_GetStringValue(v), "tiny");
    cJSON_Delete(v);
    v = eval(b, k_observer);
    assert_true(cJSON_IsTrue(v));
    cJSON_Delete(v);

    /* A temperature out of range: the page says so in its status line and sends nothing, the
     * message kept in its box. */
    type_into(b, "message", k_message);
    type_into(b, "temperature", "5");
    click(b, "send");
    wait_until(b, "document.getElementById('status').textContent.startsWith('Temperature must be')", 10,
               "the refusal of temperature 5");
    cdp_pump(b, 0.2); /* time for a request the page would have started to come paused */
    if (b->request) browser_fail(b, "the page sent temperature 5: %s", cJSON_PrintUnformatted(b->request));
    char js[256];
    snprintf(js, sizeof js,
             "document.querySelectorAll('#history .msg').length === 0 &&"
             " document.getElementById('message').value === '%s'",
             k_message);
    v = eval(b, js);
    if (!cJSON_IsTrue(v)) browser_fail(b, "the refused message left the message box or reached the history");
    cJSON_Delete(v);

    /* The settings typed into their fields and the message sent with the button, as a user does. */
    type_into(b, "temperature", k_temperature);
    type_into(b, "max-tokens", k_max_tokens);
    click(b, "send");
    double t_sent = qlm_now_s();
    wait_until(b,
               "['done', 'error'].includes(document.getElementById('status').textContent) &&"
               " !document.getElementById('send').disabled",
               60, "the answer");
    double answer_s = qlm_now_s() - t_sent;
    cJSON *page = eval(b, "(() => { const last = (c) => [...document.querySelectorAll('.msg.' + c)].pop();"
                          " return { status: document.getElementById('status').textContent,"
                          " user: last('user').textContent, answer: last('assistant').textContent,"
                          " seen: window.qlmSeen, batches: window.qlmBatches,"
                          " ms: (window.qlmLast || 0) - (window.qlmFirst || 0) }; })()");
    const char *answer = string_of(page, "answer");
    if (strcmp(string_of(page, "status"), "done")) browser_fail(b, "the page shows an error: %s", answer);
    assert_string_equal(string_of(page, "user"), k_message);
    assert_true(strlen(answer) > 0);

    /* (a) The page's request carries the settings, and sent with curl without streaming gives the
     * text the page shows. */
    if (!b->request) browser_fail(b, "the page's chat request was never seen");
    cJSON *want = must(cJSON_CreateArray()), *msg = must(cJSON_CreateObject());
    must(cJSON_AddStringToObject(msg, "role", "user"));
    must(cJSON_AddStringToObject(msg, "content", k_message));
    if (!cJSON_AddItemToArray(want, msg)) fail_msg("out of memory building JSON");
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
    int status = http(&b->srv, "POST", "/v1/chat/completions", body, "--max-time 30", &resp);
    if (status != 200) fail_msg("curl %s -> %d %s", body, status, resp);
    cJSON *plain = parse(resp);
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(plain, "choices"), 0);
    const cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(choice, "message"), "content");
    if (!cJSON_IsString(content)) fail_msg("no message.content in %s", resp);
    assert_string_equal(answer, content->valuestring);
    cJSON_Delete(plain);
    free(resp);
    free(body);

    /* (b) The answer grew on the page: each text it showed extends the one before, and at least two
     * came before the final one. */
    const cJSON *seen = cJSON_GetObjectItem(page, "seen");
    int n_seen = cJSON_GetArraySize(seen);
    for (int i = 0; i < n_seen; i++) {
        const cJSON *s = cJSON_GetArrayItem(seen, i);
        const char *next = i + 1 < n_seen ? cJSON_GetArrayItem(seen, i + 1)->valuestring : answer;
        if (!cJSON_IsString(s) || strncmp(s->valuestring, next, strlen(s->valuestring)))
            fail_msg("text %d of the answer, '%s', does not grow into '%s'", i, cJSON_GetStringValue(s), next);
    }
    int batches = cJSON_GetObjectItem(page, "batches")->valueint;
    if (n_seen < 3 || batches < 2)
        fail_msg("the answer was shown as %d text(s) at %d time(s), not streamed: %s", n_seen, batches, answer);
    assert_string_equal(cJSON_GetArrayItem(seen, n_seen - 1)->valuestring, answer);

    /* (c) A PNG screenshot of the page with the conversation. */
    r = cdp_call(b, "Page.captureScreenshot", must(cJSON_Parse("{\"format\":\"png\"}")), 1, 20);
    size_t png_len;
    unsigned char *png = b64_decode(string_of(r, "data"), &png_len);
    cJSON_Delete(r);
    if (!png || png_len < 24 || memcmp(png, "\x89PNG\r\n\x1a\n", 8)) fail_msg("the screenshot is not a PNG");
    char shot[600];
    save_screenshot(png, png_len, shot, sizeof shot);
    unsigned w = (unsigned)png[16] << 24 | png[17] << 16 | png[18] << 8 | png[19];
    unsigned h = (unsigned)png[20] << 24 | png[21] << 16 | png[22] << 8 | png[23];
    free(png);
    print_message("chat page: %d texts in %d observer callbacks over %.0f ms, %zu chars, answered in %.2f s\n", n_seen,
                  batches, cJSON_GetObjectItem(page, "ms")->valuedouble, strlen(answer), answer_s);
    print_message("screenshot (%ux%u): %s\n", w, h, shot);
    cJSON_Delete(page);

    cdp_send(b, "Browser.close", NULL, 0);
    if (browser_reap(b, 10) != 0) browser_fail(b, "Chromium did not exit within 10 s of Browser.close");
    if (!WIFEXITED(b->chrome_status) || WEXITSTATUS(b->chrome_status) != 0)
        browser_fail(b, "Chromium ended with wait status %#x", b->chrome_status);
    free(server_stop(&b->srv));
    print_message("chat page: %.1f s in all\n", qlm_now_s() - t0);
    b->passed = 1;
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
