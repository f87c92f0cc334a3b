#include "hf_download.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "hf_cache.h"
#include "hf_hash.h"

enum { MAX_ATTEMPTS = 5, API_MAX_BYTES = 32 << 20, ETAG_MAX = 128 };

/* The part of a file's default deadline that does not depend on its size. */
static const double k_base_deadline_s = 600;

typedef struct {
    char endpoint[1024];
    const char *repo;
    CURL *curl;
    struct curl_slist *headers;
    int progress;
    long min_rate, rate_window_s;
    double deadline_s;       /* 0: by size */
} client;

/* Headers of the hub's own answer to a resolve request (before any redirect). */
typedef struct {
    char etag[ETAG_MAX + 8], linked_etag[ETAG_MAX + 8], error_message[256];
    long long linked_size, content_length;
} resolve_headers;

/* Where one transfer's body goes: memory (the API) or the partial blob file. */
typedef struct {
    CURL *curl;
    char *mem;
    size_t len, cap;
    FILE *f;
    long long offset;  /* bytes already in f when this attempt began */
    long long limit;   /* the file's size (-1: unknown): a body running past it is cut */
    long long written; /* bytes written to f by this attempt */
    int too_long;      /* the body ran past limit */
    curl_off_t now;    /* bytes of this attempt's body so far (progress) */
    int write_errno;   /* set when a write to f failed (ENOSPC...) */
    int body_checked;  /* the status of the response was looked at */
    int discard;       /* an error body: not part of the file */
} sink;


static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int qlm_hf_default_file(const char *f) {
    static const char *const names[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json", "spiece.model",
                                        "*.safetensors", "*.safetensors.index.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (fnmatch(names[i], f, FNM_PATHNAME) == 0) return 1;
    return 0;
}

static int selected(const qlm_hf_pull_opts *o, const char *f) {
    int in = o->n_include ? 0 : qlm_hf_default_file(f);
    /* Without FNM_PATHNAME, as huggingface_hub's allow_patterns: "*" also crosses '/'. */
    for (int i = 0; i < o->n_include && !in; i++) in = fnmatch(o->include[i], f, 0) == 0;
    for (int i = 0; i < o->n_exclude && in; i++) in = fnmatch(o->exclude[i], f, 0) != 0;
    return in;
}

/* Percent-encodes s; '/' kept when keep_slash (file paths), encoded otherwise (revisions). */
static void url_escape(char *out, size_t cap, const char *s, int keep_slash) {
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && n + 4 < cap; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("-._~", *p) || (keep_slash && *p == '/'))
            out[n++] = (char)*p;
        else
            out[n++] = '%', out[n++] = hex[*p >> 4], out[n++] = hex[*p & 15];
    }
    out[n] = 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
    sink *s = user;
    size_t n = size * nmemb;
    if (!s->body_checked) {
        long status = 0;
        curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
        s->body_checked = 1;
        s->discard = status >= 300;
        /* A server that ignores Range sends the whole file again: start the partial over. */
        if (s->f && status == 200 && s->offset > 0) {
            if (ftruncate(fileno(s->f), 0) != 0 || fseek(s->f, 0, SEEK_SET) != 0) {
                s->write_errno = errno;
                return 0;
            }
            s->offset = 0;
        }
    }
    if (s->discard) return n;
    if (s->f) {
        if (s->limit >= 0 && s->offset + s->written + (long long)n > s->limit) {
            s->too_long = 1;
            return 0;
        }
        s->written += (long long)n;
        if (fwrite(data, 1, n, s->f) != n) {
            s->write_errno = errno ? errno : EIO;
            return 0;
        }
        return n;
    }
    if (s->len + n > API_MAX_BYTES) return 0;
    if (s->len + n + 1 > s->cap) {
        size_t cap = (s->len + n + 1) * 2;
        char *m = realloc(s->mem, cap);
        if (!m) return 0;
        s->mem = m, s->cap = cap;
    }
    memcpy(s->mem + s->len, data, n);
    s->len += n;
    s->mem[s->len] = 0;
    return n;
}

static void human(char *buf, size_t cap, double b) {
    const char *u[] = {"B", "kB", "MB", "GB", "TB"};
    int i = 0;
    while (b >= 1000 && i < 4) b /= 1000, i++;
    snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    (void)dltotal, (void)ultotal, (void)ulnow;
    sink *s = user;
    if (!s->discard) s->now = dlnow;
    return 0;
}

/* Copies a header value (trimmed, printable ASCII only) if line is "name: value". */
static void header_value(const char *line, size_t n, const char *name, char *out, size_t cap) {
    size_t k = strlen(name);
    if (n <= k + 1 || strncasecmp(line, name, k) != 0 || line[k] != ':') return;
    const char *v = line + k + 1, *e = line + n;
    while (v < e && (*v == ' ' || *v == '\t')) v++;
    while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ')) e--;
    size_t len = 0;
    for (; v < e && len + 1 < cap; v++)
        if (*v >= 0x20 && *v < 0x7f) out[len++] = *v;
    out[len] = 0;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *user) {
    resolve_headers *h = user;
    size_t n = size * nmemb;
    char num[32] = "";
    header_value(data, n, "ETag", h->etag, sizeof h->etag);
    header_value(data, n, "X-Linked-Etag", h->linked_etag, sizeof h->linked_etag);
    header_value(data, n, "X-Error-Message", h->error_message, sizeof h->error_message);
    header_value(data, n, "X-Linked-Size", num, sizeof num);
    if (*num) h->linked_size = strtoll(num, NULL, 10);
    *num = 0;
    header_value(data, n, "Content-Length", num, sizeof num);
    if (*num) h->content_length = strtoll(num, NULL, 10);
    return n;
}

static int transient_curl(CURLcode rc) {
    return rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR ||
           rc == CURLE_SEND_ERROR || rc == CURLE_GOT_NOTHING || rc == CURLE_SSL_CONNECT_ERROR;
}

static int transient_status(long st) { return st == 429 || st >= 500; }

/* The error for a failed request: what it means for the user, naming repo and file. */
static int request_error(client *c, const char *file, CURLcode rc, long status, const char *detail) {
    const char *what = file ? file : "model info";
    if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_PROXY)
        return qlm_errorf("%s: %s: cannot reach %s (%s): no network? Set HF_HUB_OFFLINE=1 to use only the cache",
                          c->repo, what, c->endpoint, curl_easy_strerror(rc));
    if (rc != CURLE_OK)
        return qlm_errorf("%s: %s: download failed: %s", c->repo, what, curl_easy_strerror(rc));
    const char *sep = detail && *detail ? "; server says: " : "";
    if (status == 401 || status == 403)
        return qlm_errorf("%s: %s: access denied (HTTP %ld): the repository is gated or private, or does not exist; "
                          "set HF_TOKEN to a token that has access%s%s",
                          c->repo, what, status, sep, detail ? detail : "");
    if (status == 404)
        return file ? qlm_errorf("%s: file %s not found (HTTP 404)%s%s", c->repo, file, sep, detail ? detail : "")
                    : qlm_errorf("%s: no such repository or revision on %s (HTTP 404)%s%s", c->repo, c->endpoint, sep,
                                 detail ? detail : "");
    return qlm_errorf("%s: %s: HTTP %ld from %s%s%s", c->repo, what, status, c->endpoint, sep, detail ? detail : "");
}

static void reset_handle(client *c, CURL *h) {
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "qlm");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    /* A transfer under the floor (a stall, or a server dripping bytes) counts as a timeout and is
     * retried; an idle-only check would let a few bytes a second hold it forever. */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, c->min_rate);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, c->rate_window_s);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
}

/* Seconds to wait before retry number attempt + 1: 1, 2, 4, 8. */
static double backoff_s(int attempt) { return (double)(1 << attempt); }

/* GET url into memory, with retries. *out is malloc'd (NUL-terminated). */
static int get_json(client *c, const char *url, cJSON **out) {
    for (int attempt = 0;; attempt++) {
        sink s = {.curl = c->curl};
        resolve_headers h = {0};
        reset_handle(c, c->curl);
        curl_easy_setopt(c->curl, CURLOPT_URL, url);
        curl_easy_setopt(c->curl, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &s);
        curl_easy_setopt(c->curl, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c->curl, CURLOPT_HEADERDATA, &h);
        curl_easy_setopt(c->curl, CURLOPT_TIMEOUT, 120L);
        CURLcode rc = curl_easy_perform(c->curl);
        long status = 0;
        curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
        if (rc == CURLE_OK && status == 200) {
            *out = s.mem ? cJSON_Parse(s.mem) : NULL;
            free(s.mem);
            return *out ? 0 : qlm_errorf("%s: the model info from %s is not JSON", c->repo, c->endpoint);
        }
        free(s.mem);
        if (attempt + 1 < MAX_ATTEMPTS && (transient_curl(rc) || (rc == CURLE_OK && transient_status(status)))) {
            sleep_s(backoff_s(attempt));
            continue;
        }
        return request_error(c, NULL, rc, status, h.error_message);
    }
}

/* An etag as a blob file name: quotes and the weak "W/" prefix dropped, then [A-Za-z0-9_-] only. */
static int normalize_etag(const char *raw, char *out, size_t cap) {
    const char *p = raw;
    if (!strncmp(p, "W/", 2)) p += 2;
    size_t n = strlen(p);
    if (n >= 2 && p[0] == '"' && p[n - 1] == '"') p++, n -= 2;
    if (n == 0 || n >= cap || n > ETAG_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= '0' && p[i] <= '9') ||
              p[i] == '-' || p[i] == '_'))
            return 0;
    memcpy(out, p, n);
    out[n] = 0;
    return 1;
}

static int all_hex(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

static long long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* Checks a complete partial against its etag: sha256 for LFS files, the git blob sha1 for the
 * others; any other etag form (a mirror's own) can only be checked by size. */
static int verify(client *c, const char *file, const char *partial, const char *etag, long long size) {
    char got[65];
    const char *kind = NULL;
    long long have = file_size(partial);
    if (size >= 0 && have != size) {
        unlink(partial);
        return qlm_errorf("%s: %s: got %lld bytes, expected %lld; the partial download was deleted", c->repo, file,
                          have, size);
    }
    if (all_hex(etag, 64)) {
        kind = "sha256";
        if (qlm_file_sha256(partial, got) != 0) return -1;
    } else if (all_hex(etag, 40)) {
        kind = "git sha1";
        if (qlm_file_git_sha1(partial, got) != 0) return -1;
    }
    if (kind && strcmp(got, etag) != 0) {
        unlink(partial);
        return qlm_errorf("%s: %s: checksum mismatch (%s expected %s, got %s): the download is corrupt and was "
                          "deleted",
                          c->repo, file, kind, etag, got);
    }
    return 0;
}

enum { ST_QUEUED, ST_HEAD, ST_READY, ST_GET, ST_DONE };

/* One selected file: HEAD for its etag and size, then GETs resuming the partial until it is
 * complete, each request retried after a pause during which the other files go on. */
typedef struct {
    const char *file;
    char url[6200], etag[ETAG_MAX + 1], blob[4400], partial[4500];
    long long size;      /* -1: unknown */
    int state, attempt;  /* attempt counts the tries of the current request */
    double wake;         /* a paused retry starts no earlier than this */
    double start;        /* the current GET began */
    double first;        /* the file's first request began (0: not yet) */
    double deadline;     /* when the file must be done */
    CURL *easy;
    sink s;
    resolve_headers h;
} job;

/* The files of one pull, at most max_active requests in flight on one multi handle. */
typedef struct {
    client *c;
    const char *repo_dir, *commit;
    CURLM *multi;
    job *jobs;
    int n, max_active, active;
    int tty, drawn;   /* progress lines currently on the terminal below the finished ones */
    double last_draw;
} pool;

static void job_line(const job *j, int final, char *buf, size_t cap) {
    double el = qlm_now_s() - j->start, got = (double)j->s.now, done = (double)j->s.offset + got;
    double speed = j->start > 0 && el > 0 ? got / el : 0, total = (double)j->size;
    if (final) done = total >= 0 ? total : done;
    char d[32], tot[32], sp[32], eta[32] = "";
    human(d, sizeof d, done);
    human(tot, sizeof tot, total);
    human(sp, sizeof sp, speed);
    if (!final && total > done && speed > 0) snprintf(eta, sizeof eta, "  ETA %.0fs", (total - done) / speed);
    snprintf(buf, cap, "  %-32s %9s / %-9s %9s/s%s", j->file, d, total >= 0 ? tot : "?", sp,
             final ? "  done" : eta);
}

static void erase_progress(pool *p) {
    if (p->drawn) fprintf(stderr, "\033[%dA\r\033[J", p->drawn);
    p->drawn = 0;
}

/* On a terminal: one line per running GET, redrawn in place (at most twice a second unless forced). */
static void draw_progress(pool *p, int force) {
    double t = qlm_now_s();
    if (!p->c->progress || !p->tty || (!force && t - p->last_draw < 0.5)) return;
    p->last_draw = t;
    erase_progress(p);
    /* Lines cut to the terminal's width: a wrapped line would break moving back up over them. */
    struct winsize ws;
    int width = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col - 1 : 79;
    char line[512];
    for (int i = 0; i < p->n; i++)
        if (p->jobs[i].state == ST_GET) {
            job_line(&p->jobs[i], 0, line, sizeof line);
            fprintf(stderr, "%.*s\033[K\n", width, line);
            p->drawn++;
        }
    fflush(stderr);
}

/* A finished file gets a line of its own, above the running ones on a terminal. */
static void report_done(pool *p, const job *j) {
    if (!p->c->progress) return;
    char line[512];
    job_line(j, 1, line, sizeof line);
    if (p->tty) erase_progress(p);
    fprintf(stderr, "%s\n", line);
    p->last_draw = 0;
}

static int finish(pool *p, job *j) {
    j->state = ST_DONE;
    if (j->easy) curl_easy_cleanup(j->easy);
    j->easy = NULL;
    return qlm_hf_link_snapshot(p->repo_dir, p->commit, j->file, j->etag);
}

/* The partial is complete: verified, renamed into blobs/ and linked from the snapshot. */
static int complete(pool *p, job *j) {
    client *c = p->c;
    if (verify(c, j->file, j->partial, j->etag, j->size) != 0) return -1;
    if (rename(j->partial, j->blob) != 0)
        return qlm_errorf("%s: %s: cannot rename %s into place: %s", c->repo, j->file, j->partial, strerror(errno));
    report_done(p, j);
    return finish(p, j);
}

static int submit(pool *p, job *j, int state) {
    curl_easy_setopt(j->easy, CURLOPT_PRIVATE, (void *)j);
    CURLMcode mc = curl_multi_add_handle(p->multi, j->easy);
    if (mc != CURLM_OK) return qlm_errorf("%s: %s: libcurl: %s", p->c->repo, j->file, curl_multi_strerror(mc));
    j->state = state;
    p->active++;
    return 0;
}

static int prepare(pool *p, job *j) {
    if (!j->easy && !(j->easy = curl_easy_init())) return qlm_errorf("libcurl failed to initialize");
    reset_handle(p->c, j->easy);
    curl_easy_setopt(j->easy, CURLOPT_URL, j->url);
    curl_easy_setopt(j->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(j->easy, CURLOPT_HEADERDATA, &j->h);
    memset(&j->h, 0, sizeof j->h);
    j->h.linked_size = j->h.content_length = -1;
    return 0;
}

/* Seconds j may still take, tries and pauses included; the error once none are left. */
static int time_left(pool *p, job *j, double *left) {
    double t = qlm_now_s();
    if (j->first == 0) {
        j->first = t;
        j->deadline = t + (p->c->deadline_s > 0 ? p->c->deadline_s : k_base_deadline_s);
    }
    *left = j->deadline - t;
    if (*left > 0) return 0;
    long long have = file_size(j->partial);
    return qlm_errorf("%s: %s: not downloaded within %.0f s, the deadline per file (--deadline)%s", p->c->repo, j->file,
                      j->deadline - j->first,
                      have > 0 ? "; the bytes that arrived are kept: pull again to resume" : "");
}

/* Limits the request about to start to the file's deadline. */
static int set_deadline(pool *p, job *j) {
    double left;
    if (time_left(p, j, &left) != 0) return -1;
    curl_easy_setopt(j->easy, CURLOPT_TIMEOUT_MS, (long)(left * 1000) + 1);
    return 0;
}

/* HEAD on the resolve URL without following redirects: the hub's own answer carries the etag
 * (X-Linked-Etag for LFS files, whose redirect target is a CDN) and the size. */
static int start_head(pool *p, job *j) {
    if (prepare(p, j) != 0) return -1;
    curl_easy_setopt(j->easy, CURLOPT_NOBODY, 1L);
    if (set_deadline(p, j) != 0) return -1;
    return submit(p, j, ST_HEAD);
}

/* A GET bringing the partial up to the size, resuming where it stops; nothing to fetch when the
 * blob is there already or the partial is complete. */
static int start_get(pool *p, job *j) {
    client *c = p->c;
    if (file_size(j->blob) >= 0) return finish(p, j);
    long long have = file_size(j->partial);
    if (j->size >= 0 && have == j->size) return complete(p, j);
    if (j->size >= 0 && have > j->size) { /* longer than the file: not a prefix of it */
        unlink(j->partial);
        have = -1;
    }
    if (prepare(p, j) != 0 || set_deadline(p, j) != 0) return -1;
    FILE *f = fopen(j->partial, "ab");
    if (!f) return qlm_errorf("%s: %s: cannot write %s: %s", c->repo, j->file, j->partial, strerror(errno));
    j->s = (sink){.curl = j->easy, .f = f, .offset = have > 0 ? have : 0, .limit = j->size};
    j->start = qlm_now_s();
    curl_easy_setopt(j->easy, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(j->easy, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(j->easy, CURLOPT_WRITEDATA, &j->s);
    curl_easy_setopt(j->easy, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(j->easy, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(j->easy, CURLOPT_XFERINFODATA, &j->s);
    if (j->s.offset > 0) curl_easy_setopt(j->easy, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)j->s.offset);
    return submit(p, j, ST_GET);
}

/* After a HEAD: the blob name and size. */
static int head_done(pool *p, job *j) {
    client *c = p->c;
    const char *raw = *j->h.linked_etag ? j->h.linked_etag : j->h.etag;
    if (!*raw) return qlm_errorf("%s: %s: the server sent no ETag, so the file cannot be verified", c->repo, j->file);
    if (!normalize_etag(raw, j->etag, sizeof j->etag))
        return qlm_errorf("%s: %s: unusable ETag from the server: %s", c->repo, j->file, raw);
    j->size = j->h.linked_size >= 0 ? j->h.linked_size : j->h.content_length;
    if (p->c->deadline_s <= 0 && j->size > 0) j->deadline += (double)j->size / (double)p->c->min_rate;
    snprintf(j->blob, sizeof j->blob, "%s/blobs/%s", p->repo_dir, j->etag);
    snprintf(j->partial, sizeof j->partial, "%s.incomplete", j->blob);
    j->state = ST_READY;
    j->attempt = 0;
    j->wake = 0;
    return 0;
}

/* A request of j ended with rc: the next step, a retry after a pause, or the error. */
static int transfer_done(pool *p, job *j, CURLcode rc) {
    long status = 0;
    curl_easy_getinfo(j->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_multi_remove_handle(p->multi, j->easy);
    p->active--;
    int was = j->state;
    j->state = was == ST_GET ? ST_READY : ST_QUEUED; /* what a retry starts again */
    if (was == ST_GET) {
        int werr = j->s.write_errno;
        if (fclose(j->s.f) != 0 && !werr) werr = errno;
        j->s.f = NULL;
        if (werr)
            return qlm_errorf("%s: %s: writing %s failed: %s%s", p->c->repo, j->file, j->partial, strerror(werr),
                              werr == ENOSPC ? " (disk full: free space under HF_HOME and pull again to resume)"
                                             : "");
        if (j->s.too_long) {
            unlink(j->partial);
            return qlm_errorf("%s: %s: the server sent more than the file's %lld bytes; the partial was deleted",
                              p->c->repo, j->file, j->size);
        }
        if (rc == CURLE_OK && (status == 200 || status == 206)) return complete(p, j);
    } else if (rc == CURLE_OK && status >= 200 && status < 400) {
        return head_done(p, j);
    }
    if (was == ST_GET && status == 416) { /* our offset is past what the server has: start over */
        unlink(j->partial);
        if (++j->attempt < MAX_ATTEMPTS) return 0;
    }
    double left;
    if (rc == CURLE_OPERATION_TIMEDOUT && time_left(p, j, &left) != 0) return -1;
    if (j->attempt + 1 < MAX_ATTEMPTS && (transient_curl(rc) || (rc == CURLE_OK && transient_status(status)))) {
        j->wake = qlm_now_s() + backoff_s(j->attempt++);
        return 0;
    }
    if (rc == CURLE_OPERATION_TIMEDOUT)
        return qlm_errorf("%s: %s: %d tries each slower than %ld bytes/s over %ld s (--min-rate, --rate-window)%s",
                          p->c->repo, j->file, MAX_ATTEMPTS, p->c->min_rate, p->c->rate_window_s,
                          file_size(j->partial) > 0 ? "; the bytes that arrived are kept: pull again to resume" : "");
    return request_error(p->c, j->file, rc, status, j->h.error_message);
}

/* Another running GET writes the same partial (two paths with the same content). */
static int blob_busy(const pool *p, const job *j) {
    for (int i = 0; i < p->n; i++)
        if (&p->jobs[i] != j && p->jobs[i].state == ST_GET && !strcmp(p->jobs[i].etag, j->etag)) return 1;
    return 0;
}

/* Fills the free slots: files whose HEAD is done first, so that started files finish first and
 * one slot means one file after another. Returns 1 when every file is done. */
static int schedule(pool *p) {
    double t = qlm_now_s();
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < p->n && p->active < p->max_active; i++) {
            job *j = &p->jobs[i];
            if (j->wake > t) continue;
            if (pass == 0 && j->state == ST_READY && !blob_busy(p, j) && start_get(p, j) != 0) return -1;
            if (pass == 1 && j->state == ST_QUEUED && start_head(p, j) != 0) return -1;
        }
    for (int i = 0; i < p->n; i++)
        if (p->jobs[i].state != ST_DONE) return 0;
    return 1;
}

/* Milliseconds until the next paused retry may start, at most 100 (the progress refresh). Files
 * waiting for a slot need no timer: a finished transfer wakes the poll. */
static int poll_ms(const pool *p) {
    double t = qlm_now_s(), wait = 0.1;
    for (int i = 0; i < p->n; i++) {
        const job *j = &p->jobs[i];
        if ((j->state == ST_QUEUED || j->state == ST_READY) && j->wake > t && j->wake - t < wait) wait = j->wake - t;
    }
    return (int)(wait * 1000) + 1;
}

static int run_pool(pool *p) {
    for (;;) {
        int r = schedule(p);
        if (r != 0) return r < 0 ? -1 : 0;
        int running;
        CURLMcode mc = curl_multi_poll(p->multi, NULL, 0, poll_ms(p), NULL);
        if (mc == CURLM_OK) mc = curl_multi_perform(p->multi, &running);
        if (mc != CURLM_OK) return qlm_errorf("%s: libcurl: %s", p->c->repo, curl_multi_strerror(mc));
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(p->multi, &left)))
            if (m->msg == CURLMSG_DONE) {
                job *j = NULL;
                curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&j);
                /* The first fatal error stops the pull; the partials stay for the next one. */
                if (transfer_done(p, j, m->data.result) != 0) return -1;
            }
        draw_progress(p, 0);
    }
}

/* Downloads the files, max_active at a time; the transfers still running when one fails are
 * dropped, their partial files kept for a resume. */
static int pull_files(client *c, const char *repo_dir, const char *commit, const char **files, int n, int max_active) {
    pool p = {.c = c, .repo_dir = repo_dir, .commit = commit, .n = n, .max_active = max_active,
              .tty = isatty(STDERR_FILENO)};
    p.jobs = calloc((size_t)n, sizeof *p.jobs);
    p.multi = curl_multi_init();
    int rc = -1;
    if (!p.jobs || !p.multi) {
        qlm_errorf(p.jobs ? "libcurl failed to initialize" : "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        job *j = &p.jobs[i];
        char path[4400], esc[3200];
        struct stat st;
        j->file = files[i];
        snprintf(path, sizeof path, "%s/snapshots/%s/%s", repo_dir, commit, j->file);
        j->state = stat(path, &st) == 0 && S_ISREG(st.st_mode) ? ST_DONE : ST_QUEUED; /* already in this snapshot */
        url_escape(esc, sizeof esc, j->file, 1);
        snprintf(j->url, sizeof j->url, "%s/%s/resolve/%s/%s", c->endpoint, c->repo, commit, esc);
    }
    rc = run_pool(&p);
out:
    if (p.tty && c->progress) erase_progress(&p);
    for (int i = 0; p.jobs && i < n; i++) {
        job *j = &p.jobs[i];
        if (j->state == ST_HEAD || j->state == ST_GET) curl_multi_remove_handle(p.multi, j->easy);
        if (j->s.f) fclose(j->s.f);
        if (j->easy) curl_easy_cleanup(j->easy);
    }
    if (p.multi) curl_multi_cleanup(p.multi);
    free(p.jobs);
    return rc;
}

/* The commit and the selected paths from the model info, every path checked before use. */
static int read_model_info(client *c, const cJSON *info, const qlm_hf_pull_opts *o, char commit[41],
                           const char ***files, int *n_files) {
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(info, "sha");
    const cJSON *sib = cJSON_GetObjectItemCaseSensitive(info, "siblings");
    if (!cJSON_IsString(sha) || !qlm_hf_is_commit(sha->valuestring))
        return qlm_errorf("%s: the model info has no commit hash (\"sha\")", c->repo);
    if (!cJSON_IsArray(sib)) return qlm_errorf("%s: the model info has no file list (\"siblings\")", c->repo);
    memcpy(commit, sha->valuestring, 41);
    int n = cJSON_GetArraySize(sib);
    *files = calloc((size_t)(n ? n : 1), sizeof **files);
    if (!*files) return qlm_errorf("out of memory");
    *n_files = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, sib) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "rfilename");
        if (!cJSON_IsString(name)) return qlm_errorf("%s: a file entry in the model info has no rfilename", c->repo);
        if (!qlm_hf_valid_rfilename(name->valuestring))
            return qlm_errorf("%s: the model info lists an unsafe path \"%s\"; refusing it", c->repo,
                              name->valuestring);
        if (selected(o, name->valuestring)) (*files)[(*n_files)++] = name->valuestring;
    }
    if (*n_files == 0) return qlm_errorf("%s: none of its %d files match the selection", c->repo, n);
    return 0;
}

int qlm_hf_pull(const qlm_hf_pull_opts *o, char *snapshot, size_t cap) {
    const char *rev = o->rev ? o->rev : "main";
    char repo_dir[4096], url[2400], esc_rev[800], commit[41], blobs[4200];
    char repo_check[QLM_HF_REPO_MAX], rev_check[QLM_HF_REV_MAX];
    if (!qlm_hf_parse_repo(o->repo, repo_check, rev_check) || strchr(o->repo, '@'))
        return qlm_errorf("%s: not a repository id ORG/NAME", o->repo);
    if (!qlm_hf_valid_rev(rev)) return qlm_errorf("%s: invalid revision \"%s\"", o->repo, rev);
    if (qlm_hf_offline()) return qlm_errorf("%s: HF_HUB_OFFLINE is set, so nothing can be downloaded", o->repo);
    if (qlm_hf_repo_dir(o->repo, repo_dir, sizeof repo_dir) != 0) return -1;
    snprintf(blobs, sizeof blobs, "%s/blobs", repo_dir);
    if (qlm_hf_mkdirs(blobs) != 0) return -1;

    client c = {.repo = o->repo, .progress = o->progress, .deadline_s = o->deadline_s,
                .min_rate = o->min_rate > 0 ? o->min_rate : QLM_HF_DEFAULT_MIN_RATE,
                .rate_window_s = o->rate_window_s > 0 ? o->rate_window_s : QLM_HF_DEFAULT_RATE_WINDOW};
    const char *ep = getenv("HF_ENDPOINT"), *token = getenv("HF_TOKEN");
    snprintf(c.endpoint, sizeof c.endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
    for (size_t n = strlen(c.endpoint); n && c.endpoint[n - 1] == '/';) c.endpoint[--n] = 0;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) return qlm_errorf("libcurl failed to initialize");
    c.curl = curl_easy_init();
    int rc = -1;
    cJSON *info = NULL;
    const char **files = NULL;
    int n_files = 0;
    if (!c.curl) {
        qlm_errorf("libcurl failed to initialize");
        goto out;
    }
    if (token && *token) {
        char auth[4200];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        c.headers = curl_slist_append(NULL, auth);
        if (!c.headers) {
            qlm_errorf("out of memory");
            goto out;
        }
    }
    url_escape(esc_rev, sizeof esc_rev, rev, 0);
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s", c.endpoint, o->repo, esc_rev);
    if (get_json(&c, url, &info) != 0 || read_model_info(&c, info, o, commit, &files, &n_files) != 0) goto out;
    if (o->progress) fprintf(stderr, "%s@%s: commit %s, %d files\n", o->repo, rev, commit, n_files);
    if (pull_files(&c, repo_dir, commit, files, n_files, o->jobs > 0 ? o->jobs : QLM_HF_DEFAULT_JOBS) != 0) goto out;
    /* The ref moves only once the snapshot is complete, so a cached ref means usable files. */
    if (qlm_hf_write_ref(repo_dir, rev, commit) != 0) goto out;
    int n = snprintf(snapshot, cap, "%s/snapshots/%s", repo_dir, commit);
    rc = n < 0 || (size_t)n >= cap ? qlm_errorf("%s: snapshot path too long", o->repo) : 0;
out:
    free(files);
    cJSON_Delete(info);
    curl_slist_free_all(c.headers);
    if (c.curl) curl_easy_cleanup(c.curl);
    curl_global_cleanup();
    return rc;
}
