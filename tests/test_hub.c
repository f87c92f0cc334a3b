/* qlm pull and ORG/NAME models against a hub mirror served in-process with libmicrohttpd on a
 * loopback port: the model info API, resolve URLs (LFS files redirect to a blob URL), etags,
 * Range requests and injected failures (401, 404, 500 once, a dropped connection, a corrupt blob).
 * A thread per connection, so that slowed responses overlap and parallel GETs can be counted. */
#include <dirent.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "../core/error.h"
#include "../hub/hf_cache.h"
#include "../hub/hf_download.h"
#include "../hub/hf_hash.h"
#include "test_util.h"

#define REPO "qlm-test/tiny"
#define COMMIT "0123456789abcdef0123456789abcdef01234567"
#define MODEL_DIR "tinystories-656K-hf"

typedef struct {
    const char *name;
    char *data;
    size_t size;
    int lfs;
    char sha256[65], sha1[41];
} mirror_file;

static const char *k_names[] = {"config.json", "generation_config.json", "model.safetensors",
                                "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
                                "reference_greedy_from_bos_numpy_f64.txt"};
enum { N_FILES = sizeof k_names / sizeof k_names[0] };

static struct {
    struct MHD_Daemon *d;
    int port;
    mirror_file files[N_FILES];
    pthread_mutex_t mu;
    long requests, lfs_bytes;    /* counted by the server */
    int require_token, fail_500; /* injected failures */
    long drop_after;             /* >0: the next blob transfer stops after this many bytes */
    int corrupt;                 /* serve the LFS blob with one byte changed */
    int delay_us;                /* a pause before each chunk of a file's bytes */
    int drip_us;                 /* LFS bytes one at a time, this far apart */
    int understate;              /* the hub states an LFS size 100 bytes short of the blob's */
    atomic_int gets, max_gets;   /* file GETs in flight now, and the most at once */
    char home[512], snap[4200];
} M;

static mirror_file *find_file(const char *name) {
    for (int i = 0; i < N_FILES; i++)
        if (!strcmp(M.files[i].name, name)) return &M.files[i];
    return NULL;
}

typedef struct {
    const char *data;
    size_t start, len, pos;
    long drop;
    int corrupt, count, delay_us, drip_us, get;
} body;

/* A file GET ends (its response is freed) when its bytes are sent or the connection broke. */
static void free_body(void *cls) {
    body *b = cls;
    if (b->get) atomic_fetch_sub(&M.gets, 1);
    free(b);
}

static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max) {
    body *b = cls;
    (void)pos;
    if (b->drop > 0 && b->pos >= (size_t)b->drop) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t n = b->len - b->pos < max ? b->len - b->pos : max;
    if (b->drop > 0 && b->pos + n > (size_t)b->drop) n = (size_t)b->drop - b->pos;
    if (n == 0) return MHD_CONTENT_READER_END_OF_STREAM;
    if (b->delay_us) usleep((useconds_t)b->delay_us);
    if (b->drip_us) {
        usleep((useconds_t)b->drip_us);
        n = 1;
    }
    memcpy(buf, b->data + b->start + b->pos, n);
    /* The flipped byte sits in the middle of the file, wherever the transfer started. */
    size_t mid = b->len / 2;
    if (b->corrupt && b->start == 0 && mid >= b->pos && mid < b->pos + n) buf[mid - b->pos] ^= 0x55;
    b->pos += n;
    if (b->count) {
        pthread_mutex_lock(&M.mu);
        M.lfs_bytes += (long)n;
        pthread_mutex_unlock(&M.mu);
    }
    return (ssize_t)n;
}

static enum MHD_Result send_text(struct MHD_Connection *con, unsigned status, const char *text, const char *err) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (err) MHD_add_response_header(r, "X-Error-Message", err);
    enum MHD_Result ret = MHD_queue_response(con, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A file's bytes with Range support ("bytes=N-", what a resuming client sends). */
static enum MHD_Result send_file(struct MHD_Connection *con, const char *method, const mirror_file *f, int count) {
    const char *range = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Range");
    size_t start = 0;
    if (range && sscanf(range, "bytes=%zu-", &start) == 1 && start >= f->size)
        return send_text(con, 416, "", NULL);
    body *b = calloc(1, sizeof *b);
    b->data = f->data, b->start = start, b->len = f->size - start, b->count = count;
    pthread_mutex_lock(&M.mu);
    if (count && M.drop_after > 0) b->drop = M.drop_after, M.drop_after = 0;
    b->corrupt = count && M.corrupt;
    b->delay_us = M.delay_us;
    b->drip_us = count ? M.drip_us : 0;
    pthread_mutex_unlock(&M.mu);
    b->get = !strcmp(method, "GET");
    if (b->get) {
        int now = atomic_fetch_add(&M.gets, 1) + 1, max = atomic_load(&M.max_gets);
        while (now > max && !atomic_compare_exchange_weak(&M.max_gets, &max, now)) {}
    }
    struct MHD_Response *r = MHD_create_response_from_callback(b->len, 64 * 1024, read_body, b, free_body);
    char etag[80], cr[96];
    snprintf(etag, sizeof etag, "\"%s\"", f->lfs ? f->sha256 : f->sha1);
    MHD_add_response_header(r, "ETag", etag);
    if (range) {
        snprintf(cr, sizeof cr, "bytes %zu-%zu/%zu", start, f->size - 1, f->size);
        MHD_add_response_header(r, "Content-Range", cr);
    }
    enum MHD_Result ret = MHD_queue_response(con, range ? 206 : 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *con, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)cls, (void)version, (void)upload, (void)upload_size;
    if (!*state) { /* first call: headers only */
        *state = (void *)1;
        return MHD_YES;
    }
    pthread_mutex_lock(&M.mu);
    M.requests++;
    int fail = M.fail_500 > 0, need_token = M.require_token;
    if (fail) M.fail_500--;
    pthread_mutex_unlock(&M.mu);
    if (fail) return send_text(con, 500, "internal error", NULL);
    const char *auth = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Authorization");
    if (need_token && (!auth || strcmp(auth, "Bearer secret")))
        return send_text(con, 401, "unauthorized", "Invalid credentials in Authorization header");
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) return send_text(con, 405, "", NULL);
    if (!strcmp(url, "/api/models/" REPO "/revision/main") || !strcmp(url, "/api/models/" REPO "/revision/" COMMIT)) {
        char json[4096];
        int n = snprintf(json, sizeof json, "{\"id\":\"" REPO "\",\"sha\":\"" COMMIT "\",\"siblings\":[");
        for (int i = 0; i < N_FILES; i++)
            n += snprintf(json + n, sizeof json - (size_t)n, "{\"rfilename\":\"%s\"},", M.files[i].name);
        snprintf(json + n, sizeof json - (size_t)n, "{\"rfilename\":\"pytorch_model.bin\"},{\"rfilename\":\"ghost.json\"}]}");
        return send_text(con, 200, json, NULL);
    }
    if (!strcmp(url, "/api/models/evil/repo/revision/main"))
        return send_text(con, 200, "{\"sha\":\"" COMMIT "\",\"siblings\":[{\"rfilename\":\"../../../escape.json\"}]}", NULL);
    if (!strncmp(url, "/api/models/", 12)) return send_text(con, 404, "{}", "Repository not found");
    const char *prefix = "/" REPO "/resolve/" COMMIT "/";
    if (!strncmp(url, prefix, strlen(prefix))) {
        mirror_file *f = find_file(url + strlen(prefix));
        if (!f) return send_text(con, 404, "", "Entry not found");
        if (!f->lfs) return send_file(con, method, f, 0);
        /* LFS files: the hub answers with a redirect to storage and the linked etag and size. */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        char loc[128], etag[80], size[32];
        snprintf(loc, sizeof loc, "/lfs-storage/%s", f->sha256);
        snprintf(etag, sizeof etag, "\"%s\"", f->sha256);
        snprintf(size, sizeof size, "%zu", f->size - (M.understate ? 100 : 0));
        MHD_add_response_header(r, "Location", loc);
        MHD_add_response_header(r, "X-Linked-Etag", etag);
        MHD_add_response_header(r, "X-Linked-Size", size);
        MHD_add_response_header(r, "X-Repo-Commit", COMMIT);
        MHD_add_response_header(r, "ETag", "\"0000000000000000000000000000000000000000\"");
        enum MHD_Result ret = MHD_queue_response(con, 302, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (!strncmp(url, "/lfs-storage/", 13))
        for (int i = 0; i < N_FILES; i++)
            if (M.files[i].lfs && !strcmp(url + 13, M.files[i].sha256)) return send_file(con, method, &M.files[i], 1);
    return send_text(con, 404, "", NULL);
}

static void reset_faults(void) {
    pthread_mutex_lock(&M.mu);
    M.requests = M.lfs_bytes = 0;
    M.require_token = M.fail_500 = M.corrupt = M.delay_us = M.drip_us = M.understate = 0;
    M.drop_after = 0;
    atomic_store(&M.max_gets, 0);
    pthread_mutex_unlock(&M.mu);
    unsetenv("HF_TOKEN");
    unsetenv("HF_HUB_OFFLINE");
}

/* A fresh, empty HF_HOME for each test. */
static void remove_home(void) {
    if (!*M.home) return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", M.home);
    assert_int_equal(system(cmd), 0);
    *M.home = 0;
}

static void fresh_home(void) {
    char tmp[256];
    remove_home();
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(M.home, sizeof M.home, "%s", tmp);
    setenv("HF_HOME", M.home, 1);
    unsetenv("HF_HUB_CACHE");
    reset_faults();
}

static int setup(void **state) {
    (void)state;
    char dir[512], path[1024];
    test_asset(dir, sizeof dir, MODEL_DIR);
    if (!test_path_exists(dir)) return 0; /* each test skips through REQUIRE_ASSET */
    for (int i = 0; i < N_FILES; i++) {
        mirror_file *f = &M.files[i];
        f->name = k_names[i];
        snprintf(path, sizeof path, "%s/%s", dir, f->name);
        f->data = test_read_file(path, &f->size);
        if (!f->data || qlm_file_sha256(path, f->sha256) || qlm_file_git_sha1(path, f->sha1)) return -1;
        f->lfs = strstr(f->name, ".safetensors") != NULL;
    }
    pthread_mutex_init(&M.mu, NULL);
    M.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL, NULL, handle, NULL,
                           MHD_OPTION_SOCK_ADDR, NULL, MHD_OPTION_END);
    if (!M.d) return -1;
    M.port = MHD_get_daemon_info(M.d, MHD_DAEMON_INFO_BIND_PORT)->port;
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", M.port);
    setenv("HF_ENDPOINT", ep, 1);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove_home();
    if (M.d) MHD_stop_daemon(M.d);
    for (int i = 0; i < N_FILES; i++) free(M.files[i].data);
    return 0;
}

static int pull(const char *const *include, int n_include) {
    qlm_hf_pull_opts o = {.repo = REPO, .rev = "main", .include = include, .n_include = n_include};
    return qlm_hf_pull(&o, M.snap, sizeof M.snap);
}

static void cache_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/hub/models--qlm-test--tiny/%s", M.home, rel);
}

#define REQUIRE_MODEL()                                  \
    char asset_[512];                                    \
    REQUIRE_ASSET(test_asset(asset_, sizeof asset_, MODEL_DIR)); \
    assert_non_null(M.d);                                \
    fresh_home()

static void test_hashes_and_names(void **state) {
    (void)state;
    char tmp[256], path[512], hex[65];
    assert_non_null(test_tmpdir(tmp, sizeof tmp));
    snprintf(path, sizeof path, "%s/abc", tmp);
    assert_int_equal(test_write_file(path, "abc", 3), 0);
    assert_int_equal(qlm_file_sha256(path, hex), 0);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_int_equal(test_write_file(path, "hello world\n", 12), 0);
    assert_int_equal(qlm_file_git_sha1(path, hex), 0); /* `git hash-object` of the same bytes */
    assert_string_equal(hex, "3b18e512dba79e4c8300dd08aeb37f8e728b8dad");
    unlink(path);
    rmdir(tmp);

    char repo[QLM_HF_REPO_MAX], rev[QLM_HF_REV_MAX];
    assert_int_equal(qlm_hf_parse_repo("HuggingFaceTB/SmolLM2-135M@v1.0", repo, rev), 1);
    assert_string_equal(repo, "HuggingFaceTB/SmolLM2-135M");
    assert_string_equal(rev, "v1.0");
    assert_int_equal(qlm_hf_parse_repo("org/name", repo, rev), 1);
    assert_string_equal(rev, "main");
    const char *bad[] = {"model.gguf", "a/b/c", "../x", "org/..", "org/na me", "/abs", "org/", "org/x@..", "a--b/c"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) assert_int_equal(qlm_hf_parse_repo(bad[i], repo, rev), 0);
    assert_true(qlm_hf_valid_rfilename("sub/dir/model.safetensors"));
    const char *unsafe[] = {"../x", "a/../../x", "/etc/passwd", "a//b", "./x", "a\\b", ""};
    for (size_t i = 0; i < sizeof unsafe / sizeof unsafe[0]; i++) assert_false(qlm_hf_valid_rfilename(unsafe[i]));
    assert_true(qlm_hf_default_file("model-00001-of-00002.safetensors"));
    assert_true(qlm_hf_default_file("model.safetensors.index.json"));
    assert_false(qlm_hf_default_file("pytorch_model.bin"));
    assert_false(qlm_hf_default_file("onnx/model.safetensors"));
}

static void test_full_pull_then_generate(void **state) {
    (void)state;
    REQUIRE_MODEL();
    char *out = NULL, *ref = NULL, path[4400], link[256];
    assert_int_equal(test_run_qlm(&out, "pull -q " REPO), 0);
    cache_path(path, sizeof path, "snapshots/" COMMIT);
    assert_non_null(strstr(out, path));
    free(out);
    /* huggingface_hub's layout: refs/main holds the commit; snapshot entries link into blobs/. */
    cache_path(path, sizeof path, "refs/main");
    char *commit = test_read_file(path, NULL);
    assert_string_equal(commit, COMMIT);
    free(commit);
    const mirror_file *st = find_file("model.safetensors"), *tj = find_file("tokenizer.json");
    cache_path(path, sizeof path, "snapshots/" COMMIT "/model.safetensors");
    ssize_t n = readlink(path, link, sizeof link - 1);
    assert_true(n > 0);
    link[n] = 0;
    assert_string_equal(link + strlen("../../blobs/"), st->sha256);
    cache_path(path, sizeof path, "snapshots/" COMMIT "/tokenizer.json");
    n = readlink(path, link, sizeof link - 1);
    assert_true(n > 0);
    link[n] = 0;
    assert_non_null(strstr(link, tj->sha1));
    cache_path(path, sizeof path, "snapshots/" COMMIT "/reference_greedy_from_bos_numpy_f64.txt");
    assert_false(test_path_exists(path)); /* not in the default selection */
    cache_path(path, sizeof path, "snapshots/" COMMIT "/pytorch_model.bin");
    assert_false(test_path_exists(path));
    assert_int_equal(M.lfs_bytes, (long)st->size);

    assert_int_equal(test_run_qlm(&out, "generate -m " REPO " --temp 0 -n 8 -p 'Once upon a time' 2>/dev/null"), 0);
    char dir[512];
    assert_int_equal(test_run_qlm(&ref, "generate -m %s --temp 0 -n 8 -p 'Once upon a time' 2>/dev/null",
                                  test_asset(dir, sizeof dir, MODEL_DIR)), 0);
    assert_true(strlen(out) > strlen("Once upon a time"));
    assert_string_equal(out, ref);
    free(out);
    free(ref);
}

static void test_resume_after_drop(void **state) {
    (void)state;
    REQUIRE_MODEL();
    const mirror_file *st = find_file("model.safetensors");
    const char *inc[] = {"model.safetensors"};
    M.drop_after = 1000000; /* the first transfer breaks here; the retry asks for the rest */
    assert_int_equal(pull(inc, 1), 0);
    assert_int_equal(M.lfs_bytes, (long)st->size);
    char path[4400];
    cache_path(path, sizeof path, "snapshots/" COMMIT "/model.safetensors");
    size_t len = 0;
    char *got = test_read_file(path, &len);
    assert_int_equal(len, st->size);
    assert_memory_equal(got, st->data, len);
    free(got);

    /* A partial left by an earlier run (killed qlm) is resumed by the next pull. */
    fresh_home();
    char blobs[4400], partial[4500];
    cache_path(blobs, sizeof blobs, "blobs");
    assert_int_equal(qlm_hf_mkdirs(blobs), 0);
    snprintf(partial, sizeof partial, "%s/%s.incomplete", blobs, st->sha256);
    assert_int_equal(test_write_file(partial, st->data, 700000), 0);
    assert_int_equal(pull(inc, 1), 0);
    assert_int_equal(M.lfs_bytes, (long)st->size - 700000);
    assert_false(test_path_exists(partial));
}

static void test_corrupt_blob_rejected(void **state) {
    (void)state;
    REQUIRE_MODEL();
    const mirror_file *st = find_file("model.safetensors");
    M.corrupt = 1;
    assert_int_equal(pull(NULL, 0), -1);
    assert_non_null(strstr(qlm_last_error(), "checksum mismatch"));
    assert_non_null(strstr(qlm_last_error(), "model.safetensors"));
    char path[4400];
    cache_path(path, sizeof path, "blobs/");
    strcat(path, st->sha256);
    assert_false(test_path_exists(path));
    strcat(path, ".incomplete");
    assert_false(test_path_exists(path));
    cache_path(path, sizeof path, "snapshots/" COMMIT "/model.safetensors");
    assert_false(test_path_exists(path));
    cache_path(path, sizeof path, "refs/main");
    assert_false(test_path_exists(path));
}

static void test_http_errors(void **state) {
    (void)state;
    REQUIRE_MODEL();
    const char *cfg[] = {"config.json"};
    M.require_token = 1;
    assert_int_equal(pull(cfg, 1), -1);
    assert_non_null(strstr(qlm_last_error(), "HF_TOKEN"));
    assert_non_null(strstr(qlm_last_error(), "401"));
    setenv("HF_TOKEN", "secret", 1);
    assert_int_equal(pull(cfg, 1), 0);
    reset_faults();

    qlm_hf_pull_opts o = {.repo = "qlm-test/missing"};
    assert_int_equal(qlm_hf_pull(&o, M.snap, sizeof M.snap), -1);
    assert_non_null(strstr(qlm_last_error(), "qlm-test/missing"));
    assert_non_null(strstr(qlm_last_error(), "no such repository"));
    const char *ghost[] = {"ghost.json"};
    assert_int_equal(pull(ghost, 1), -1);
    assert_non_null(strstr(qlm_last_error(), "file ghost.json not found"));
    char *out = NULL;
    assert_int_equal(test_run_qlm(&out, "pull -q qlm-test/missing 2>&1"), 1);
    assert_non_null(strstr(out, "no such repository"));
    free(out);

    /* Nothing listens on port 1: the "no network" message. */
    setenv("HF_ENDPOINT", "http://127.0.0.1:1", 1);
    assert_int_equal(pull(cfg, 1), -1);
    assert_non_null(strstr(qlm_last_error(), "cannot reach http://127.0.0.1:1"));
    char ep[64];
    snprintf(ep, sizeof ep, "http://127.0.0.1:%d", M.port);
    setenv("HF_ENDPOINT", ep, 1);

    o.repo = "evil/repo";
    assert_int_equal(qlm_hf_pull(&o, M.snap, sizeof M.snap), -1);
    assert_non_null(strstr(qlm_last_error(), "unsafe path"));
}

static void test_retry_after_500(void **state) {
    (void)state;
    REQUIRE_MODEL();
    const char *cfg[] = {"config.json"};
    M.fail_500 = 1;
    assert_int_equal(pull(cfg, 1), 0);
    assert_int_equal(M.fail_500, 0);
    assert_int_equal(M.requests, 4); /* 500, model info, HEAD, GET */
}

/* A mirror dripping bytes (20 a second) held qlm pull forever: the only check was 1 byte/s over
 * 60 s. Now a transfer under --min-rate over --rate-window is broken off and retried from what
 * arrived, and past --deadline the file is given up with an error naming it, the bytes kept; the
 * next pull from a healthy mirror resumes from them. */
static void test_slow_mirror(void **state) {
    (void)state;
    REQUIRE_MODEL();
    const mirror_file *st = find_file("model.safetensors");
    const char *inc[] = {"model.safetensors"};
    M.drip_us = 50000;
    qlm_hf_pull_opts o = {.repo = REPO, .rev = "main", .include = inc, .n_include = 1, .min_rate = 1024,
                          .rate_window_s = 1, .deadline_s = 5};
    double t0 = qlm_now_s();
    assert_int_equal(qlm_hf_pull(&o, M.snap, sizeof M.snap), -1);
    double took = qlm_now_s() - t0;
    const char *err = qlm_last_error();
    print_message("slow mirror: gave up after %.1f s, %ld requests: %s\n", took, M.requests, err);
    assert_non_null(strstr(err, "model.safetensors"));
    assert_non_null(strstr(err, "deadline"));
    assert_non_null(strstr(err, "kept"));
    assert_true(took > 4.5 && took < 9);
    assert_true(M.requests >= 6); /* info, HEAD, and at least two GETs (resolve + storage each) */
    char partial[4500];
    cache_path(partial, sizeof partial, "blobs/");
    strcat(partial, st->sha256);
    strcat(partial, ".incomplete");
    size_t kept = 0;
    free(test_read_file(partial, &kept));
    assert_true(kept > 0 && kept < st->size);

    reset_faults();
    assert_int_equal(pull(inc, 1), 0);
    assert_int_equal(M.lfs_bytes, (long)(st->size - kept));
}

/* A body longer than the size the hub stated is cut where it passes it, and the partial deleted
 * (a mirror cannot fill the disk past the file's size). */
static void test_body_past_size(void **state) {
    (void)state;
    REQUIRE_MODEL();
    const char *inc[] = {"model.safetensors"};
    M.understate = 1;
    assert_int_equal(pull(inc, 1), -1);
    assert_non_null(strstr(qlm_last_error(), "more than the file's"));
}

static void test_offline(void **state) {
    (void)state;
    REQUIRE_MODEL();
    char out[4400], *txt = NULL;
    setenv("HF_HUB_OFFLINE", "1", 1);
    assert_int_equal(qlm_hf_resolve_model(REPO, out, sizeof out), -1);
    assert_non_null(strstr(qlm_last_error(), "qlm pull " REPO));
    assert_int_equal(test_run_qlm(&txt, "generate -m " REPO " -n 2 2>&1"), 1);
    assert_non_null(strstr(txt, "qlm pull " REPO));
    free(txt);
    assert_int_equal(pull(NULL, 0), -1);
    assert_int_equal(M.requests, 0);
    unsetenv("HF_HUB_OFFLINE");
    assert_int_equal(pull(NULL, 0), 0);
    setenv("HF_HUB_OFFLINE", "1", 1);
    M.requests = 0;
    assert_int_equal(qlm_hf_resolve_model(REPO, out, sizeof out), 1);
    assert_string_equal(out, M.snap);
    assert_int_equal(test_run_qlm(NULL, "generate -m " REPO " --temp 0 -n 4 >/dev/null 2>&1"), 0);
    assert_int_equal(M.requests, 0);
    unsetenv("HF_HUB_OFFLINE");
}

/* A cache as huggingface_hub writes it, made by hand: qlm uses it without asking the server. */
static void test_handmade_cache_used(void **state) {
    (void)state;
    REQUIRE_MODEL();
    char root[4400], path[4500], target[256];
    snprintf(root, sizeof root, "%s/hub/models--someone--handmade", M.home);
    snprintf(path, sizeof path, "%s/blobs", root);
    assert_int_equal(qlm_hf_mkdirs(path), 0);
    snprintf(path, sizeof path, "%s/snapshots/%s", root, COMMIT);
    assert_int_equal(qlm_hf_mkdirs(path), 0);
    snprintf(path, sizeof path, "%s/refs", root);
    assert_int_equal(qlm_hf_mkdirs(path), 0);
    snprintf(path, sizeof path, "%s/refs/main", root);
    assert_int_equal(test_write_file(path, COMMIT, 40), 0);
    for (int i = 0; i < N_FILES; i++) {
        const mirror_file *f = &M.files[i];
        const char *blob = f->lfs ? f->sha256 : f->sha1;
        snprintf(path, sizeof path, "%s/blobs/%s", root, blob);
        assert_int_equal(test_write_file(path, f->data, f->size), 0);
        snprintf(path, sizeof path, "%s/snapshots/%s/%s", root, COMMIT, f->name);
        snprintf(target, sizeof target, "../../blobs/%s", blob);
        assert_int_equal(symlink(target, path), 0);
    }
    char *out = NULL;
    assert_int_equal(test_run_qlm(&out, "generate -m someone/handmade --temp 0 -n 4 -p Hi 2>/dev/null"), 0);
    assert_true(strlen(out) > 2);
    free(out);
    assert_int_equal(M.requests, 0);
}

/* What a pull left: each snapshot entry's link (its content checked against the mirror) and the
 * names in blobs/, sorted. */
static void describe_cache(char *out, size_t cap) {
    char path[4400], link[256];
    size_t n = 0;
    for (int i = 0; i < N_FILES; i++) {
        cache_path(path, sizeof path, "snapshots/" COMMIT "/");
        strcat(path, M.files[i].name);
        ssize_t k = readlink(path, link, sizeof link - 1);
        link[k > 0 ? k : 0] = 0;
        if (k > 0) {
            size_t len = 0;
            char *got = test_read_file(path, &len);
            assert_non_null(got);
            assert_int_equal(len, M.files[i].size);
            assert_memory_equal(got, M.files[i].data, len);
            free(got);
        }
        n += (size_t)snprintf(out + n, cap - n, "%s -> %s\n", M.files[i].name, link);
    }
    struct dirent **names;
    cache_path(path, sizeof path, "blobs");
    int k = scandir(path, &names, NULL, alphasort);
    assert_true(k > 0);
    for (int i = 0; i < k; i++) {
        n += (size_t)snprintf(out + n, cap - n, "blob %s\n", names[i]->d_name);
        free(names[i]);
    }
    free(names);
    assert_true(n < cap);
    cache_path(path, sizeof path, "refs/main");
    char *commit = test_read_file(path, NULL);
    assert_string_equal(commit, COMMIT);
    free(commit);
}

static void test_parallel_pull_matches_sequential(void **state) {
    (void)state;
    REQUIRE_MODEL();
    char seq[4096], par[4096], *out = NULL;
    qlm_hf_pull_opts o = {.repo = REPO, .rev = "main", .jobs = 1};
    assert_int_equal(qlm_hf_pull(&o, M.snap, sizeof M.snap), 0);
    describe_cache(seq, sizeof seq);
    assert_non_null(strstr(seq, "model.safetensors -> ../../blobs/"));

    /* Slowed chunks keep every GET open long enough for the next ones to start beside it. */
    fresh_home();
    M.delay_us = 20000;
    assert_int_equal(test_run_qlm(&out, "pull --jobs 4 " REPO " 2>&1"), 0);
    assert_true(atomic_load(&M.max_gets) > 1);
    assert_true(atomic_load(&M.max_gets) <= 4);
    describe_cache(par, sizeof par);
    assert_string_equal(par, seq);
    /* stderr is not a terminal: a line per finished file, no cursor movement. */
    assert_non_null(strstr(out, "model.safetensors"));
    assert_non_null(strstr(out, "tokenizer.json"));
    assert_non_null(strstr(out, "done"));
    assert_null(strchr(out, '\033'));
    free(out);
    assert_int_equal(test_run_qlm(&out, "pull --jobs 0 " REPO " 2>&1"), 2);
    assert_non_null(strstr(out, "--jobs"));
    free(out);
}

/* The LFS transfer breaks mid-way while the other files download; its retry resumes it. */
static void test_parallel_resume(void **state) {
    (void)state;
    REQUIRE_MODEL();
    const mirror_file *st = find_file("model.safetensors");
    char got[4096];
    M.drop_after = 1000000;
    M.delay_us = 5000;
    qlm_hf_pull_opts o = {.repo = REPO, .rev = "main", .jobs = 4};
    assert_int_equal(qlm_hf_pull(&o, M.snap, sizeof M.snap), 0);
    assert_true(atomic_load(&M.max_gets) > 1);
    assert_int_equal(M.lfs_bytes, (long)st->size); /* the retry asked only for the rest */
    describe_cache(got, sizeof got);
    for (int i = 0; i < N_FILES; i++) {
        char line[256];
        snprintf(line, sizeof line, "%s -> ../../blobs/", M.files[i].name);
        assert_int_equal(strstr(got, line) != NULL, qlm_hf_default_file(M.files[i].name));
    }
    assert_null(strstr(got, ".incomplete"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hashes_and_names),   cmocka_unit_test(test_full_pull_then_generate),
        cmocka_unit_test(test_resume_after_drop),  cmocka_unit_test(test_corrupt_blob_rejected),
        cmocka_unit_test(test_http_errors),        cmocka_unit_test(test_retry_after_500),
        cmocka_unit_test(test_offline),            cmocka_unit_test(test_handmade_cache_used),
        cmocka_unit_test(test_slow_mirror),        cmocka_unit_test(test_body_past_size),
        cmocka_unit_test(test_parallel_pull_matches_sequential), cmocka_unit_test(test_parallel_resume),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
