/* bench_serve URL [chat|completions]: load test of a running `qlm serve`. For C = 1, 4 and 16
 * concurrent clients, each sends streaming requests (greedy, max_tokens 64, a different prompt each)
 * one after another until the level's requests are done; prints aggregate generated tokens/s (from
 * the usage chunk stream_options.include_usage asks for), mean tokens per request and time-to-first-token percentiles as a
 * markdown table. The workload: "chat" (default) asks /v1/chat/completions for a story through the
 * model's chat template, so an instruction-tuned model answers at length (to max_tokens);
 * "completions" sends the same words as a raw /v1/completions prompt, which such a model mostly
 * ends after a few tokens, so that load is mostly prompts and request turnover. Request i asks
 * prompt i mod 16, so every level sends the same prompts. Raw sockets and
 * HTTP/1.0, so the stream arrives unchunked and the first "data:" event marks the first token. */
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../core/clock.h"

enum { MAX_TOKENS = 64, MAX_REQUESTS = 128 };

static const char *k_topics[] = {"a lighthouse keeper", "a lost robot",     "the first snow",   "a dragon who cannot fly",
                                 "a tiny village",      "an old clockmaker", "a journey by sea", "a talking cat"};

typedef struct {
    const struct addrinfo *addr;
    const char *host;
    int chat;                    /* the workload: chat completions, or raw completions */
    int n_requests, next;        /* the level's requests; the next one to send */
    pthread_mutex_t mu;
    double ttft[MAX_REQUESTS];   /* seconds */
    long tokens;
    int failed;
} level;


/* One streamed request: its TTFT and completion tokens, or -1. */
static int request(const level *lv, int i, double *ttft, long *tokens) {
    char text[128], body[512], req[1024];
    /* The same 16 prompts at every level (greedy answers do not depend on the batch), so rows
     * differ only in concurrency. */
    snprintf(text, sizeof text, "Request %d. Write a short story about %s.", i % 16,
             k_topics[i % (int)(sizeof k_topics / sizeof *k_topics)]);
    int bn = lv->chat ? snprintf(body, sizeof body,
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,"
                                 "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                                 text, MAX_TOKENS)
                      : snprintf(body, sizeof body,
                                 "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stream\":true,"
                                 "\"stream_options\":{\"include_usage\":true}}",
                                 text, MAX_TOKENS);
    int rn = snprintf(req, sizeof req,
                      "POST /v1/%s HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s",
                      lv->chat ? "chat/completions" : "completions", lv->host, bn, body);
    int fd = socket(lv->addr->ai_family, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    double t0 = qlm_now_s();
    if (connect(fd, lv->addr->ai_addr, lv->addr->ai_addrlen) != 0 || write(fd, req, (size_t)rn) != rn) {
        close(fd);
        return -1;
    }
    /* The whole response is kept: 64 tokens of SSE are a few tens of KiB. */
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    *ttft = -1;
    ssize_t n;
    while (buf && (n = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)n;
        buf[len] = 0;
        if (*ttft < 0 && strstr(buf, "data: ")) *ttft = qlm_now_s() - t0;
        if (len + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    close(fd);
    const char *usage = buf ? strstr(buf, "\"completion_tokens\":") : NULL;
    int ok = buf && strncmp(buf, "HTTP/1.", 7) == 0 && strncmp(buf + 8, " 200", 4) == 0 && strstr(buf, "data: [DONE]") && usage && *ttft >= 0;
    if (ok) *tokens = strtol(usage + strlen("\"completion_tokens\":"), NULL, 10);
    free(buf);
    return ok ? 0 : -1;
}

static void *client(void *arg) {
    level *lv = arg;
    for (;;) {
        pthread_mutex_lock(&lv->mu);
        int i = lv->next < lv->n_requests && !lv->failed ? lv->next++ : -1;
        pthread_mutex_unlock(&lv->mu);
        if (i < 0) return NULL;
        double ttft = 0;
        long tokens = 0;
        int rc = request(lv, i, &ttft, &tokens);
        pthread_mutex_lock(&lv->mu);
        if (rc != 0) lv->failed = 1;
        lv->ttft[i] = ttft;
        lv->tokens += tokens;
        pthread_mutex_unlock(&lv->mu);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v. */
static double percentile(const double *v, int n, double p) {
    int k = (int)(p / 100.0 * n + 0.999999) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

/* Runs the level with c clients; 0, or -1 when a request failed. */
static int run_level(level *lv, int c, double *tps, double *per_request, double *p50, double *p99) {
    pthread_t th[16];
    /* Eight requests per client, so that clients fall out of step and the level measures sustained
     * concurrency rather than one burst and its tail; at least 16 for a p99 with one client. */
    lv->n_requests = c * 8 > 16 ? c * 8 : 16;
    lv->next = 0;
    lv->tokens = 0;
    lv->failed = 0;
    double t0 = qlm_now_s();
    int started = 0;
    for (; started < c; started++)
        if (pthread_create(&th[started], NULL, client, lv) != 0) break;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    double secs = qlm_now_s() - t0;
    if (started < c || lv->failed) return -1;
    qsort(lv->ttft, (size_t)lv->n_requests, sizeof *lv->ttft, cmp_double);
    *tps = (double)lv->tokens / secs;
    *per_request = (double)lv->tokens / lv->n_requests;
    *p50 = percentile(lv->ttft, lv->n_requests, 50);
    *p99 = percentile(lv->ttft, lv->n_requests, 99);
    return 0;
}

int main(int argc, char **argv) {
    char host[256], port[16] = "80";
    if (argc < 2 || argc > 3 || sscanf(argv[1], "http://%255[^:/]:%15[0-9]", host, port) < 1 ||
        (argc == 3 && strcmp(argv[2], "chat") != 0 && strcmp(argv[2], "completions") != 0)) {
        fprintf(stderr, "usage: bench_serve http://HOST:PORT [chat|completions]\n");
        return 2;
    }
    const char *workload = argc == 3 ? argv[2] : "chat";
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *addr;
    int gai = getaddrinfo(host, port, &hints, &addr);
    if (gai != 0) {
        fprintf(stderr, "bench_serve: %s: %s\n", host, gai_strerror(gai));
        return 1;
    }
    level lv = {.addr = addr, .host = host, .chat = strcmp(workload, "chat") == 0};
    pthread_mutex_init(&lv.mu, NULL);
    /* A warm-up request first, so that page faults and thread start-up are not measured. */
    double ttft;
    long tokens;
    int rc = request(&lv, 0, &ttft, &tokens);
    static const int clients[] = {1, 4, 16};
    double tps[3], per_request[3], p50[3], p99[3];
    for (int i = 0; rc == 0 && i < 3; i++) {
        fprintf(stderr, "bench_serve: %s, %d clients ...\n", workload, clients[i]);
        rc = run_level(&lv, clients[i], &tps[i], &per_request[i], &p50[i], &p99[i]);
    }
    pthread_mutex_destroy(&lv.mu);
    freeaddrinfo(addr);
    if (rc != 0) {
        fprintf(stderr, "bench_serve: a request to %s failed\n", argv[1]);
        return 1;
    }
    printf("| workload | clients | aggregate tok/s | vs 1 client | tokens/request | TTFT p50 ms | TTFT p99 ms |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < 3; i++)
        printf("| %s | %d | %.1f | %.2fx | %.1f | %.0f | %.0f |\n", workload, clients[i], tps[i], tps[i] / tps[0],
               per_request[i], p50[i] * 1e3, p99[i] * 1e3);
    return 0;
}
