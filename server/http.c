/* The HTTP layer: libmicrohttpd's event loop (epoll) on a few threads, so that idle or slow
 * connections cost a socket and no thread; a request waiting for its generation suspends its
 * connection and the scheduler resumes it when text arrives. Body limits, the API-key check,
 * routing, and Server-Sent Events for streamed generations. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <sys/random.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/error.h"
#include "internal.h"

enum { MAX_BODY = 1 << 20, CONNECTION_TIMEOUT_S = 30, HTTP_THREADS = 4 };

/* Upper bounds (seconds) of the latency histograms' buckets; one more bucket holds the rest. */
enum { N_LATENCY_BUCKETS = 12 };
static const double k_latency_bounds[N_LATENCY_BUCKETS] = {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

typedef struct {
    long counts[N_LATENCY_BUCKETS + 1];
    double sum;
} latency_histogram;

struct qlm_server {
    qlm_server_config cfg;
    struct MHD_Daemon *daemon;
    job_queue queue;
    qlm_json_vocab *json_vocab; /* the tokenizer's tokens indexed for response_format's masks */
    watchdog watch;
    pthread_mutex_t mu;      /* guards the fields below */
    pthread_cond_t idle;     /* in_flight reached 0 */
    int in_flight, draining;
    long requests;
    long status_counts[6];   /* by status class: [2] 2xx, [4] 4xx, [5] 5xx */
    latency_histogram latency; /* finished generations, request to response end */
    latency_histogram ttft;    /* request to the first generated text */
};

typedef struct {
    qlm_server *srv;
    struct MHD_Connection *c;
    peer *peer;              /* the connection's entry in the watchdog */
    double t0;
    char method[8], path[128];
    char *body;
    size_t len, cap;
    int too_large;
    int status, tokens;
    job *job;                /* a generation, until the request completes */
    int chat;
    int counted;             /* a generation counted in in_flight */
    int cors;                /* from an origin --cors-origin allows: the answer says so */
    char id[48], model[128];
    long created;
    /* A stream's progress by choice: its text so far (for its log-probabilities' text offsets),
     * whether anything of it was sent, whether its end was; and of the whole stream. */
    struct {
        size_t lp_offset;
        int started, ended;
    } choice[JOB_MAX_CHOICES];
    int n_ended, ended;
    char *out;               /* SSE bytes not yet handed to MHD */
    size_t out_len, out_off;
} conn;


static void allow_origin(struct MHD_Response *r, const conn *cx) {
    if (!cx->cors) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", cx->srv->cfg.cors_origin);
    MHD_add_response_header(r, "Vary", "Origin");
}

/* Queues text as the response (takes ownership of text). */
static enum MHD_Result respond(struct MHD_Connection *c, conn *cx, int status, char *text, const char *type) {
    if (!text) {
        status = 500;
        text = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"code\":500}}");
        if (!text) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    allow_origin(r, cx);
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    cx->status = status;
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result respond_json(struct MHD_Connection *c, conn *cx, int status, char *json) {
    return respond(c, cx, status, json, "application/json");
}

static enum MHD_Result respond_error(struct MHD_Connection *c, conn *cx, int status, const char *type,
                                     const char *message) {
    api_error e = {.status = status, .type = type};
    snprintf(e.message, sizeof e.message, "%s", message);
    return respond_json(c, cx, status, openai_error_json(&e));
}

static enum MHD_Result respond_api_error(struct MHD_Connection *c, conn *cx, const api_error *e) {
    return respond_json(c, cx, e->status, openai_error_json(e));
}

/* Prometheus histogram lines of h under name (cumulative buckets, sum, count), appended to *text. */
static int histogram_text(char **text, const char *name, const latency_histogram *h) {
    char *t = *text, *add = NULL;
    long cumulative = 0;
    int rc = asprintf(&add, "# TYPE %s histogram\n", name);
    for (int i = 0; rc >= 0 && i <= N_LATENCY_BUCKETS; i++) {
        char *line = NULL, le[32];
        cumulative += h->counts[i];
        if (i < N_LATENCY_BUCKETS) snprintf(le, sizeof le, "%g", k_latency_bounds[i]);
        else snprintf(le, sizeof le, "+Inf");
        rc = asprintf(&line, "%s%s_bucket{le=\"%s\"} %ld\n", add, name, le, cumulative);
        free(add);
        add = line;
    }
    if (rc >= 0) {
        char *line = NULL;
        rc = asprintf(&line, "%s%s_sum %.6f\n%s_count %ld\n", add, name, h->sum, name, cumulative);
        free(add);
        add = line;
    }
    if (rc < 0) return -1;
    char *joined = NULL;
    rc = asprintf(&joined, "%s%s", t, add);
    free(add);
    if (rc < 0) return -1;
    free(t);
    *text = joined;
    return 0;
}

static void histogram_add(latency_histogram *h, double seconds) {
    int i = 0;
    while (i < N_LATENCY_BUCKETS && seconds > k_latency_bounds[i]) i++;
    h->counts[i]++;
    h->sum += seconds;
}

static char *metrics_text(qlm_server *s) {
    pthread_mutex_lock(&s->queue.mu);
    int queued = s->queue.queued, running = s->queue.running;
    long prompt = s->queue.prompt_tokens, cached = s->queue.cached_prompt_tokens, generated = s->queue.generated_tokens;
    pthread_mutex_unlock(&s->queue.mu);
    int open;
    long cut;
    watchdog_counts(&s->watch, &open, &cut);
    pthread_mutex_lock(&s->mu);
    char *text = NULL;
    int n = asprintf(&text,
                     "# TYPE qlm_requests_total counter\n"
                     "qlm_requests_total{class=\"2xx\"} %ld\nqlm_requests_total{class=\"4xx\"} %ld\n"
                     "qlm_requests_total{class=\"5xx\"} %ld\n"
                     "# TYPE qlm_prompt_tokens_total counter\nqlm_prompt_tokens_total %ld\n"
                     "# TYPE qlm_prompt_tokens_cached_total counter\nqlm_prompt_tokens_cached_total %ld\n"
                     "# TYPE qlm_generation_tokens_total counter\nqlm_generation_tokens_total %ld\n"
                     "# TYPE qlm_queue_depth gauge\nqlm_queue_depth %d\n"
                     "# TYPE qlm_running_sequences gauge\nqlm_running_sequences %d\n"
                     "# TYPE qlm_open_connections gauge\nqlm_open_connections %d\n"
                     "# TYPE qlm_connections_cut_total counter\nqlm_connections_cut_total %ld\n",
                     s->status_counts[2], s->status_counts[4], s->status_counts[5], prompt, cached, generated, queued,
                     running, open, cut);
    if (n >= 0 && (histogram_text(&text, "qlm_generation_seconds", &s->latency) != 0 ||
                   histogram_text(&text, "qlm_time_to_first_token_seconds", &s->ttft) != 0))
        n = -1;
    pthread_mutex_unlock(&s->mu);
    if (n < 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* Appends one "data: ...\n\n" event to cx->out (takes json). */
static int add_event(conn *cx, char *json) {
    if (!json) return -1;
    size_t n = strlen(json), need = cx->out_len + n + sizeof "data: \n\n";
    char *p = realloc(cx->out, need);
    if (!p) {
        free(json);
        return -1;
    }
    cx->out = p;
    cx->out_len += (size_t)sprintf(p + cx->out_len, "data: %s\n\n", json);
    free(json);
    return 0;
}

static openai_reply reply_of(const conn *cx) {
    return (openai_reply){.tok = cx->srv->cfg.tok, .chat = cx->chat, .id = cx->id, .model = cx->model,
                          .created = cx->created};
}

/* Appends choice i's new events to cx->out: its text with their log-probabilities, and once it has
 * finished its finish_reason. *moved is
 * set when an event was added. 0, or -1 when the stream must end with an error (out of memory, a
 * failed generation, a client that left). */
static int stream_choice(conn *cx, int i, int *moved) {
    job_choice *c = &cx->job->choices[i];
    openai_reply r = reply_of(cx);
    char *text;
    size_t len;
    job_logprob *lp;
    int n_lp, rc = 0;
    int finished = job_take(&cx->srv->queue, c, &text, &len, &lp, &n_lp);
    if (len || n_lp) {
        rc = add_event(cx, openai_chunk_json(&r, c, text, len, lp, n_lp, &cx->choice[i].lp_offset,
                                             cx->choice[i].started ? 0 : CHUNK_FIRST));
        cx->choice[i].started = *moved = 1;
    }
    free(text);
    free(lp);
    if (!finished || rc != 0) return rc;
    /* job_take saw it finished under the lock, so its results are final. */
    if (c->failed || job_cancelled(&cx->srv->queue, cx->job)) return -1;
    cx->choice[i].ended = *moved = 1;
    cx->n_ended++;
    return add_event(cx, openai_chunk_json(&r, c, "", 0, NULL, 0, &cx->choice[i].lp_offset,
                                           CHUNK_FINISH | (cx->choice[i].started ? 0 : CHUNK_FIRST)));
}

/* MHD pulls the stream from here: events are built from the choices' text as it arrives, then
 * [DONE] once every choice has ended. With nothing to send the job parks the connection and 0 is
 * returned; MHD calls again once the scheduler resumes it. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn *cx = cls;
    while (cx->out_off == cx->out_len) {
        if (cx->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        cx->out_len = cx->out_off = 0;
        int moved = 0, rc = 0;
        for (int i = 0; i < cx->job->n_choices && rc == 0; i++)
            if (!cx->choice[i].ended) rc = stream_choice(cx, i, &moved);
        if (rc == 0 && cx->n_ended == cx->job->n_choices) {
            openai_reply r = reply_of(cx);
            if (cx->job->include_usage) rc = add_event(cx, openai_usage_chunk_json(&r, cx->job));
            if (rc == 0) rc = add_event(cx, strdup("[DONE]"));
            cx->ended = 1;
        }
        if (rc != 0) {
            if (job_cancelled(&cx->srv->queue, cx->job)) cx->status = 499; /* its client left */
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (!moved && job_park(&cx->srv->queue, cx->job)) return 0; /* parked */
    }
    size_t n = cx->out_len - cx->out_off < max ? cx->out_len - cx->out_off : max;
    memcpy(buf, cx->out + cx->out_off, n);
    cx->out_off += n;
    return (ssize_t)n;
}

static void park_connection(void *user) {
    MHD_suspend_connection(((conn *)user)->c);
}

static void wake_connection(void *user) {
    MHD_resume_connection(((conn *)user)->c);
}

/* A non-streamed generation's answer once every choice finished; until then the connection stays
 * parked and MHD calls the handler again when it is resumed. */
static enum MHD_Result generation_reply(struct MHD_Connection *c, conn *cx) {
    job *j = cx->job;
    if (!job_wait(&cx->srv->queue, j)) return MHD_YES;
    if (job_cancelled(&cx->srv->queue, j)) { /* its client left: nobody to answer */
        cx->status = 499;
        return MHD_NO;
    }
    for (int i = 0; i < j->n_choices; i++)
        if (j->choices[i].failed) return respond_error(c, cx, 500, "server_error", "generation failed");
    openai_reply r = reply_of(cx);
    return respond_json(c, cx, 200, openai_result_json(&r, j));
}

static enum MHD_Result generate(struct MHD_Connection *c, conn *cx, int chat) {
    qlm_server *s = cx->srv;
    job *j = job_new();
    if (!j) return respond_error(c, cx, 500, "server_error", "out of memory");
    cx->job = j;
    api_error e;
    if (openai_parse_generation(&s->cfg, s->json_vocab, cx->body ? cx->body : "", cx->len, chat, j, cx->model,
                                sizeof cx->model, &e) != 0)
        return respond_api_error(c, cx, &e);
    /* Looked up and counted as a user under the lock that unloads take, so the adapter stays
     * resident until the job is freed. */
    const qlm_lora_adapter *a;
    pthread_mutex_lock(&s->queue.mu);
    int found = openai_find_adapter(&s->cfg, j, &a, &e) == 0;
    if (found) queue_acquire_adapter(&s->queue, j, a);
    pthread_mutex_unlock(&s->queue.mu);
    if (!found) return respond_api_error(c, cx, &e);
    /* Unguessable, so that an id says nothing about other requests. */
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) return respond_error(c, cx, 500, "server_error", "no random bytes");
    int at = snprintf(cx->id, sizeof cx->id, "%s-", chat ? "chatcmpl" : "cmpl");
    for (size_t i = 0; i < sizeof r; i++) at += snprintf(cx->id + at, sizeof cx->id - (size_t)at, "%02x", r[i]);
    cx->chat = chat;
    cx->created = (long)time(NULL);
    j->park = park_connection;
    j->wake = wake_connection;
    j->hook_user = cx;
    if (queue_push(&s->queue, j) != 0)
        return respond_error(c, cx, 429, "rate_limit_error", "too many requests are waiting; retry later");
    if (cx->peer) watchdog_watch_job(&s->watch, cx->peer, j);
    if (j->stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, cx, NULL);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        allow_origin(r, cx);
        cx->status = 200;
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        return ret;
    }
    return generation_reply(c, cx);
}

/* POST /v1/adapters: loads the folder (outside the lock: it reads files) against the registry's
 * base, which never changes, then adds it under the queue's lock. */
static enum MHD_Result load_adapter(struct MHD_Connection *c, conn *cx) {
    qlm_server *s = cx->srv;
    qlm_lora_registry *r = s->cfg.lora;
    if (!r) return respond_error(c, cx, 400, "invalid_request_error", "this server takes no adapters");
    if (!s->cfg.adapter_dir)
        return respond_error(c, cx, 403, "permission_error",
                             "loading adapters over HTTP is off (start the server with --adapter-dir DIR)");
    char name[64], *asked, *path;
    api_error e;
    if (openai_parse_adapter_load(&s->cfg, cx->body ? cx->body : "", cx->len, name, sizeof name, &asked, &e) != 0)
        return respond_api_error(c, cx, &e);
    /* One answer for every path that is not a folder inside --adapter-dir, so that it tells nothing
     * about the rest of the machine. */
    int outside = guard_adapter_path(s->cfg.adapter_dir, asked, &path) != 0;
    free(asked);
    pthread_mutex_lock(&s->queue.mu);
    int dup = qlm_lora_registry_find(r, name) != NULL;
    pthread_mutex_unlock(&s->queue.mu);
    if (outside || dup) {
        free(path);
        return outside ? respond_error(c, cx, 404, "not_found_error", "'path' is not a folder inside the server's --adapter-dir")
                       : respond_error(c, cx, 409, "invalid_request_error", "an adapter with this 'name' is loaded");
    }
    qlm_lora_adapter a;
    int rc = qlm_lora_load(&a, path, name, r->is_t5 ? NULL : &r->llama, r->is_t5 ? &r->t5 : NULL, QLM_F32);
    free(path);
    if (rc != 0) {
        e = (api_error){.status = 422, .type = "invalid_request_error"};
        snprintf(e.message, sizeof e.message, "'path' is not an adapter for this model: %s", qlm_last_error());
        return respond_api_error(c, cx, &e);
    }
    /* Another request may have taken the name while this one loaded. */
    pthread_mutex_lock(&s->queue.mu);
    dup = qlm_lora_registry_find(r, name) != NULL;
    int full = !dup && r->n >= QLM_LORA_MAX_RESIDENT;
    rc = dup || full ? -1 : qlm_lora_registry_add(r, &a);
    pthread_mutex_unlock(&s->queue.mu);
    if (rc != 0) {
        qlm_lora_free(&a);
        return dup ? respond_error(c, cx, 409, "invalid_request_error", "an adapter with this 'name' is loaded")
               : full ? respond_error(c, cx, 409, "invalid_request_error", "the server holds as many adapters as it can")
                      : respond_error(c, cx, 500, "server_error", qlm_last_error());
    }
    char *json = NULL;
    if (asprintf(&json, "{\"id\":\"%s\",\"object\":\"model\",\"parent\":\"%s\"}", name, s->cfg.model_name) < 0) json = NULL;
    return respond_json(c, cx, 200, json);
}

/* DELETE /v1/adapters/{name}: refused while a queued or running request holds the adapter. */
static enum MHD_Result unload_adapter(struct MHD_Connection *c, conn *cx, const char *name) {
    qlm_server *s = cx->srv;
    pthread_mutex_lock(&s->queue.mu);
    const qlm_lora_adapter *a = s->cfg.lora ? qlm_lora_registry_find(s->cfg.lora, name) : NULL;
    int busy = a && queue_adapter_users(&s->queue, a) > 0;
    int rc = a && !busy ? qlm_lora_registry_remove(s->cfg.lora, name) : -1;
    pthread_mutex_unlock(&s->queue.mu);
    if (!a) return respond_error(c, cx, 404, "not_found_error", "no adapter has this name");
    if (busy) return respond_error(c, cx, 409, "invalid_request_error", "the adapter is in use by a request");
    if (rc != 0) return respond_error(c, cx, 500, "server_error", qlm_last_error());
    char *json = NULL;
    if (asprintf(&json, "{\"id\":\"%s\",\"object\":\"model\",\"deleted\":true}", name) < 0) json = NULL;
    return respond_json(c, cx, 200, json);
}

/* Digests compared with CRYPTO_memcmp so the time taken says nothing about the key's
 * length or how many of its leading bytes a guess got right. */
static int authorized(struct MHD_Connection *c, const qlm_server *s) {
    if (!s->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    unsigned char got[SHA256_DIGEST_LENGTH], want[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)h + 7, strlen(h + 7), got);
    SHA256((const unsigned char *)s->cfg.api_key, strlen(s->cfg.api_key), want);
    return CRYPTO_memcmp(got, want, sizeof got) == 0;
}

static enum MHD_Result route(struct MHD_Connection *c, conn *cx) {
    qlm_server *s = cx->srv;
    const char *m = cx->method, *p = cx->path;
    int get = !strcmp(m, "GET"), post = !strcmp(m, "POST");
    if (cx->too_large) return respond_error(c, cx, 413, "invalid_request_error", "the body is larger than 1 MiB");
    if (get && !strcmp(p, "/health")) return respond_json(c, cx, 200, strdup("{\"status\":\"ok\"}"));
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!guard_host_ok(&s->cfg, host))
        return respond_error(c, cx, 403, "permission_error",
                             "the Host header names another server (a name rebound to this loopback address)");
    int cors = guard_origin(&s->cfg, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"), host);
    if (cors < 0)
        return respond_error(c, cx, 403, "permission_error",
                             "cross-origin requests are refused (start the server with --cors-origin ORIGIN to allow a site)");
    cx->cors = cors;
    if (cors && !strcmp(m, "OPTIONS")) { /* a browser's preflight */
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        allow_origin(r, cx);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        cx->status = 204;
        enum MHD_Result ret = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        return ret;
    }
    /* The page itself is public; its requests carry the key the user types in. */
    if (get && !strcmp(p, "/")) return respond(c, cx, 200, strdup(qlm_chat_page), "text/html; charset=utf-8");
    int public_metrics = s->cfg.metrics_public && get && !strcmp(p, "/metrics");
    if (!public_metrics && !authorized(c, s))
        return respond_error(c, cx, 401, "authentication_error", "missing or wrong API key");
    /* A form or a "simple" cross-site request cannot send this type without a preflight. */
    if (post && !guard_json_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type")))
        return respond_error(c, cx, 415, "invalid_request_error", "the body must be sent as Content-Type: application/json");
    if (get && !strcmp(p, "/metrics")) return respond(c, cx, 200, metrics_text(s), "text/plain; version=0.0.4");
    if (get && (!strcmp(p, "/v1/models") || !strncmp(p, "/v1/models/", 11))) {
        int found;
        pthread_mutex_lock(&s->queue.mu); /* the registry may be changing */
        char *json = openai_models_json(&s->cfg, (long)time(NULL), p[10] ? p + 11 : NULL, &found);
        pthread_mutex_unlock(&s->queue.mu);
        return found ? respond_json(c, cx, 200, json) : respond_error(c, cx, 404, "not_found_error", "no model has this id");
    }
    if (post && !strcmp(p, "/v1/adapters")) return load_adapter(c, cx);
    if (!strcmp(m, "DELETE") && !strncmp(p, "/v1/adapters/", 13)) return unload_adapter(c, cx, p + 13);
    api_error e = {0};
    if (post && !strcmp(p, "/tokenize")) {
        char *out = openai_tokenize_json(&s->cfg, cx->body ? cx->body : "", cx->len, &e);
        return out ? respond_json(c, cx, 200, out) : respond_api_error(c, cx, &e);
    }
    if (post && !strcmp(p, "/detokenize")) {
        char *out = openai_detokenize_json(&s->cfg, cx->body ? cx->body : "", cx->len, &e);
        return out ? respond_json(c, cx, 200, out) : respond_api_error(c, cx, &e);
    }
    if (post && (!strcmp(p, "/v1/completions") || !strcmp(p, "/v1/chat/completions"))) {
        /* Counted before the draining check under one lock, so a drain never misses a generation. */
        pthread_mutex_lock(&s->mu);
        int draining = s->draining;
        if (!draining) s->in_flight++;
        cx->counted = !draining;
        pthread_mutex_unlock(&s->mu);
        if (draining) return respond_error(c, cx, 503, "server_error", "the server is shutting down");
        return generate(c, cx, !strcmp(p, "/v1/chat/completions"));
    }
    int known = !strcmp(p, "/health") || !strcmp(p, "/metrics") || !strncmp(p, "/v1/models", 10) || !strcmp(p, "/tokenize") ||
                !strcmp(p, "/v1/adapters") || !strncmp(p, "/v1/adapters/", 13) ||
                !strcmp(p, "/detokenize") || !strcmp(p, "/v1/completions") || !strcmp(p, "/v1/chat/completions");
    return known ? respond_error(c, cx, 405, "invalid_request_error", "method not allowed for this path")
                 : respond_error(c, cx, 404, "not_found_error", "no such route");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version;
    conn *cx = *state;
    if (!cx) {
        if (!(cx = calloc(1, sizeof *cx))) return MHD_NO;
        cx->srv = cls;
        cx->t0 = qlm_now_s();
        snprintf(cx->method, sizeof cx->method, "%s", method);
        snprintf(cx->path, sizeof cx->path, "%s", url);
        cx->c = c;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        cx->peer = ci ? ci->socket_context : NULL;
        *state = cx;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > MAX_BODY) cx->too_large = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        /* Over the limit the rest is read and dropped, then answered with 413. */
        if (!cx->too_large && cx->len + *upload_size > MAX_BODY) {
            cx->too_large = 1;
        } else if (!cx->too_large) {
            if (cx->len + *upload_size + 1 > cx->cap) {
                size_t cap = (cx->len + *upload_size + 1) * 2;
                char *b = realloc(cx->body, cap < MAX_BODY + 1 ? cap : MAX_BODY + 1);
                if (!b) return MHD_NO;
                cx->body = b;
                cx->cap = cap < MAX_BODY + 1 ? cap : MAX_BODY + 1;
            }
            memcpy(cx->body + cx->len, upload, *upload_size);
            cx->len += *upload_size;
            cx->body[cx->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    /* Called again when a parked generation is resumed. */
    if (cx->job && cx->job->queue && !cx->job->stream) return generation_reply(c, cx);
    if (cx->peer) watchdog_arrived(&cx->srv->watch, cx->peer);
    return route(c, cx);
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    qlm_server *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        /* Without an entry (out of memory) the connection only has MHD's idle timeout. */
        *socket_context = ci ? watchdog_add(&s->watch, ci->connect_fd) : NULL;
    } else if (*socket_context) {
        watchdog_remove(&s->watch, *socket_context);
        *socket_context = NULL;
    }
}

/* The log line of a request whose client left while its generation went on: written when the
 * generation ends, with the tokens it made, as 499 (nginx's "client closed request"). */
typedef struct {
    qlm_server *srv;
    char method[8], path[128];
    double t0;
} late_log;

static void log_when_done(job *j, void *user) {
    late_log *l = user;
    const qlm_server_config *cfg = &l->srv->cfg;
    cfg->log(cfg->log_user, l->method, l->path, 499, job_generated(j), (qlm_now_s() - l->t0) * 1e3);
    free(l);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode why) {
    (void)c;
    (void)why;
    qlm_server *s = cls;
    conn *cx = *state;
    if (!cx) return;
    *state = NULL;
    double ms = (qlm_now_s() - cx->t0) * 1e3;
    int generation = cx->job && cx->job->queue; /* it was queued */
    double first_text = 0;
    int log_later = 0;
    if (cx->peer) watchdog_answered(&s->watch, cx->peer);
    if (cx->job) {
        pthread_mutex_lock(&s->queue.mu);
        first_text = cx->job->first_text_s;
        if (generation && !cx->job->unfinished) cx->tokens = job_generated(cx->job);
        /* Cancelled means its client left, whether the job ended before MHD saw the hang-up (no
         * answer went out) or after (the stream was cut): the log says so either way. */
        if (generation && cx->job->cancelled) cx->status = 499;
        late_log *l = generation && cx->job->unfinished && s->cfg.log ? malloc(sizeof *l) : NULL;
        if (l) {
            *l = (late_log){.srv = s, .t0 = cx->t0};
            memcpy(l->method, cx->method, sizeof l->method);
            memcpy(l->path, cx->path, sizeof l->path);
            cx->job->on_end = log_when_done;
            cx->job->end_user = l;
            log_later = 1;
        }
        pthread_mutex_unlock(&s->queue.mu);
        /* A client that left mid-stream ends its sequence; the scheduler then frees the slot. */
        if (cx->job->queue) job_cancel(&s->queue, cx->job);
        job_release(&s->queue, cx->job);
    }
    if (s->cfg.log && !log_later) s->cfg.log(s->cfg.log_user, cx->method, cx->path, cx->status, cx->tokens, ms);
    pthread_mutex_lock(&s->mu);
    s->requests++;
    if (cx->status >= 200 && cx->status < 600) s->status_counts[cx->status / 100]++;
    if (generation) {
        histogram_add(&s->latency, ms / 1e3);
        if (first_text > 0) histogram_add(&s->ttft, first_text - cx->t0);
    }
    if (cx->counted && --s->in_flight == 0)
        pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    free(cx->body);
    free(cx->out);
    free(cx);
}

int qlm_server_start(const qlm_server_config *cfg, qlm_server **out) {
    *out = NULL;
    if (!cfg->tok || !cfg->model == !cfg->t5 || cfg->max_seqs < 1 || cfg->max_prompt < 1 || cfg->max_output < 1 ||
        cfg->max_queue < 1 || cfg->timeout_s < 0 || !cfg->model_name || cfg->port < 0 || cfg->port > 65535 ||
        cfg->max_connections < 1 || cfg->max_connections_per_ip < 0)
        return qlm_errorf("server: invalid configuration");
    struct sockaddr_storage addr;
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    if (qlm_server_resolve(host, cfg->port, &addr) != 0) return -1;
    qlm_server *s = calloc(1, sizeof *s);
    if (!s) return qlm_errorf("out of memory");
    s->cfg = *cfg;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    if (!(s->json_vocab = qlm_json_vocab_from_tokenizer(cfg->tok))) goto fail;
    qlm_batch_config bc = {.model = cfg->model, .t5 = cfg->t5, .tok = cfg->tok, .n_slots = cfg->max_seqs,
                           .max_prompt = cfg->max_prompt, .max_output = cfg->max_output};
    if (queue_start(&s->queue, &bc, cfg->max_queue) != 0) goto fail;
    int timeout = cfg->timeout_s > 0 ? cfg->timeout_s : CONNECTION_TIMEOUT_S;
    if (watchdog_start(&s->watch, &s->queue, timeout) != 0) {
        queue_free(&s->queue);
        goto fail;
    }
    s->daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME |
            (addr.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
        0, NULL, NULL, on_request, s,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HTTP_THREADS,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections_per_ip, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)timeout, MHD_OPTION_END);
    if (!s->daemon) {
        watchdog_stop(&s->watch);
        queue_free(&s->queue);
        qlm_errorf("server: cannot listen on %s:%d (in use, or not an address of this machine)", host, cfg->port);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    qlm_json_vocab_free(s->json_vocab);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return -1;
}

int qlm_server_resolve(const char *host, int port, struct sockaddr_storage *out) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) return qlm_errorf("server: cannot resolve --host %s: %s", host, gai_strerror(rc));
    /* An IPv4 address first when a name has both: "localhost" then takes 127.0.0.1, which every client tries. */
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *a = res; a; a = a->ai_next)
        if (!pick || (a->ai_family == AF_INET && pick->ai_family != AF_INET)) pick = a;
    memset(out, 0, sizeof *out);
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    freeaddrinfo(res);
    if (out->ss_family == AF_INET) ((struct sockaddr_in *)out)->sin_port = htons((uint16_t)port);
    else if (out->ss_family == AF_INET6) ((struct sockaddr_in6 *)out)->sin6_port = htons((uint16_t)port);
    else return qlm_errorf("server: --host %s is neither an IPv4 nor an IPv6 address", host);
    return 0;
}

int qlm_server_check_listen(const char *host, int port) {
    struct sockaddr_storage addr;
    if (qlm_server_resolve(host, port, &addr) != 0) return -1;
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) return qlm_errorf("server: cannot open a socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = addr.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    int rc = bind(fd, (struct sockaddr *)&addr, len);
    int err = errno;
    close(fd);
    if (rc != 0)
        return qlm_errorf("server: cannot listen on %s port %d: %s", host, port,
                          err == EADDRINUSE ? "the port is in use" : err == EADDRNOTAVAIL ? "not an address of this machine"
                                                                                            : strerror(err));
    return 0;
}

int qlm_server_port(const qlm_server *s) {
    const union MHD_DaemonInfo *i = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    return i ? i->port : -1;
}

int qlm_server_run(qlm_server *s) {
    return queue_run(&s->queue);
}

void qlm_server_shutdown(qlm_server *s) {
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    while (s->in_flight > 0) pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
    queue_stop(&s->queue);
}

void qlm_server_free(qlm_server *s) {
    MHD_stop_daemon(s->daemon);
    watchdog_stop(&s->watch);
    queue_free(&s->queue);
    qlm_json_vocab_free(s->json_vocab);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
