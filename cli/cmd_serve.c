/* qlm serve: the OpenAI-compatible HTTP server (server/) over one loaded model and its --lora
 * adapters. The main thread runs the scheduler; a watcher thread waits for SIGTERM/SIGINT and
 * drains: new generations get 503, in-flight ones finish, and the process exits 0. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/error.h"
#include "../server/server.h"
#include "commands.h"
#include "common.h"

static const char *k_usage =
    "usage: qlm serve -m MODEL [options]\n"
    "Serves the model over HTTP with OpenAI's API: GET /health, GET /v1/models, POST /v1/completions,\n"
    "POST /v1/chat/completions (stream: true for Server-Sent Events), POST /tokenize, POST /detokenize,\n"
    "GET /metrics. Requests are decoded together (continuous batching); \"model\" may name an adapter.\n\n" CLI_MODEL_HELP
    "      --lora NAME=PATH   load the PEFT LoRA adapter folder PATH as NAME (repeatable)\n"
    CLI_CHAT_TEMPLATE_HELP
    "      --host ADDR        address or name to bind, IPv4 or IPv6: 0.0.0.0, ::, localhost, ::1\n"
    "                         (default 127.0.0.1)\n"
    "      --port N           TCP port (default 8080; 0: any free port)\n"
    "      --api-key KEY      require \"Authorization: Bearer KEY\" (all routes but /health and the page /);\n"
    "                         QLM_API_KEY in the environment does the same without showing in ps\n"
    "      --metrics-public   GET /metrics answers without the key (for a scraper)\n"
    "      --adapter-dir DIR  POST /v1/adapters may load adapter folders inside DIR (default: off)\n"
    "      --cors-origin O    let pages of origin O (e.g. https://app.example; * for any) call the server\n"
    "                         (default: other sites' pages are refused)\n"
    "      --max-seqs N       sequences decoded together (default 8)\n"
    "      --max-queue N      requests waiting beyond those before 429 (default 64)\n"
    "      --max-output N     most tokens one request may generate (default: half the context, at most 1024)\n"
    "      --timeout S        a request must arrive whole within S seconds, and a connection idle\n"
    "                         for S seconds is closed (default 30)\n"
    "      --max-connections N     open connections at most (default 2048; raises ulimit -n to fit)\n"
    "      --max-connections-per-ip N  from one client address at most (default 1024; 0: no limit)\n"
    "      --name NAME        the base model's id in the API (default: the model path's last component)\n"
    "      --quiet            no load line or request log\n" CLI_DIST_HELP;

enum { OPT_HOST = 700, OPT_PORT, OPT_API_KEY, OPT_MAX_SEQS, OPT_MAX_QUEUE, OPT_MAX_OUTPUT, OPT_NAME, OPT_TIMEOUT,
       OPT_ADAPTER_DIR, OPT_CORS, OPT_MAX_CONN, OPT_MAX_CONN_IP, OPT_METRICS_PUBLIC };

/* Descriptors beyond the connections: model files, pipes, the event loop's own. */
enum { SPARE_FDS = 64 };

/* Raises the descriptor limit to fit max connections (up to the hard limit), or lowers max to
 * what the limit allows, saying so. -1 when not even one fits. */
static int fit_descriptors(int *max, int quiet) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
    rlim_t need = (rlim_t)*max + SPARE_FDS;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return 0;
    rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need ? rl.rlim_max : need;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 && getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
    if (rl.rlim_cur >= need) return 0;
    if (rl.rlim_cur <= SPARE_FDS) {
        fprintf(stderr, "qlm serve: the descriptor limit (ulimit -n) of %lu leaves no room for connections\n",
                (unsigned long)rl.rlim_cur);
        return -1;
    }
    *max = (int)(rl.rlim_cur - SPARE_FDS);
    if (!quiet)
        fprintf(stderr, "qlm serve: the descriptor limit (ulimit -n %lu) allows %d connections, not more\n",
                (unsigned long)rl.rlim_cur, *max);
    return 0;
}

static int g_signal_pipe[2];

static void on_signal(int sig) {
    unsigned char b = (unsigned char)sig;
    ssize_t n = write(g_signal_pipe[1], &b, 1);
    (void)n; /* nothing to do if the pipe is full: a byte is already waiting */
}

typedef struct {
    qlm_server *srv;
    int quiet;
} watcher;

static void *watch_signals(void *arg) {
    watcher *w = arg;
    unsigned char sig = 0;
    while (read(g_signal_pipe[0], &sig, 1) != 1 && errno == EINTR) continue;
    if (!w->quiet) fprintf(stderr, "qlm serve: %s, draining\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    qlm_server_shutdown(w->srv);
    return NULL;
}

static void log_request(void *user, const char *method, const char *path, int status, int tokens, double ms) {
    (void)user;
    struct timespec ts;
    struct tm tm;
    char when[32];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "qlm serve: %s.%03ldZ %s %s %d %d tokens %.1f ms\n", when, ts.tv_nsec / 1000000, method, path, status,
            tokens, ms);
}

/* The last path component, without a trailing slash. */
static void base_name(const char *path, char *out, size_t cap) {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/') start--;
    snprintf(out, cap, "%.*s", (int)(len - start), path + start);
}

int cmd_serve(int argc, char **argv) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    const char *host = "127.0.0.1", *api_key = NULL, *name = NULL, *adapter_dir = NULL, *cors = NULL;
    int port = 8080, max_seqs = 8, max_queue = 64, max_output = 0, quiet = 0, timeout = 30;
    int max_conn = 2048, max_conn_ip = 1024, metrics_public = 0;
    static const struct option opts[] = {CLI_MODEL_OPTIONS, CLI_LORA_OPTIONS, CLI_DIST_OPTIONS, CLI_CHAT_TEMPLATE_OPTION,
                                         {"host", required_argument, 0, OPT_HOST},
                                         {"port", required_argument, 0, OPT_PORT},
                                         {"api-key", required_argument, 0, OPT_API_KEY},
                                         {"max-seqs", required_argument, 0, OPT_MAX_SEQS},
                                         {"max-queue", required_argument, 0, OPT_MAX_QUEUE},
                                         {"max-output", required_argument, 0, OPT_MAX_OUTPUT},
                                         {"name", required_argument, 0, OPT_NAME},
                                         {"timeout", required_argument, 0, OPT_TIMEOUT},
                                         {"adapter-dir", required_argument, 0, OPT_ADAPTER_DIR},
                                         {"cors-origin", required_argument, 0, OPT_CORS},
                                         {"max-connections", required_argument, 0, OPT_MAX_CONN},
                                         {"metrics-public", no_argument, 0, OPT_METRICS_PUBLIC},
                                         {"max-connections-per-ip", required_argument, 0, OPT_MAX_CONN_IP},
                                         {"quiet", no_argument, 0, OPT_QUIET},
                                         {0, 0, 0, 0}};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "m:t:c:h", opts, NULL)) != -1) {
        int r = cli_model_flag(&mo, c, optarg);
        if (r == 0) r = cli_lora_flag(&mo, c, optarg);
        if (r < 0) return 2;
        if (r > 0) continue;
        switch (c) {
        case OPT_HELP: fputs(k_usage, stdout); return 0;
        case OPT_HOST: host = optarg; break;
        case OPT_PORT: if (cli_int("--port", optarg, 0, 65535, &port) != 0) return 2; break;
        case OPT_API_KEY: api_key = optarg; break;
        case OPT_MAX_SEQS: if (cli_int("--max-seqs", optarg, 1, 256, &max_seqs) != 0) return 2; break;
        case OPT_MAX_QUEUE: if (cli_int("--max-queue", optarg, 1, 100000, &max_queue) != 0) return 2; break;
        case OPT_MAX_OUTPUT: if (cli_int("--max-output", optarg, 1, 1 << 20, &max_output) != 0) return 2; break;
        case OPT_TIMEOUT: if (cli_int("--timeout", optarg, 1, 86400, &timeout) != 0) return 2; break;
        case OPT_MAX_CONN: if (cli_int("--max-connections", optarg, 1, 1000000, &max_conn) != 0) return 2; break;
        case OPT_MAX_CONN_IP:
            if (cli_int("--max-connections-per-ip", optarg, 0, 1000000, &max_conn_ip) != 0) return 2;
            break;
        case OPT_NAME: name = optarg; break;
        case OPT_ADAPTER_DIR: adapter_dir = optarg; break;
        case OPT_CORS: cors = optarg; break;
        case OPT_QUIET: quiet = 1; break;
        case OPT_METRICS_PUBLIC: metrics_public = 1; break;
        default: return cli_usage_error("serve", k_usage);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "qlm serve: unexpected argument '%s'\n", argv[optind]);
        return cli_usage_error("serve", k_usage);
    }
    if (cli_default_model(&mo, "serve", quiet) != 0) return 2;
    if (!api_key) {
        api_key = getenv("QLM_API_KEY");
        if (api_key && !api_key[0]) {
            fprintf(stderr, "qlm serve: QLM_API_KEY is set but empty\n");
            return 2;
        }
    } else if (!api_key[0]) {
        fprintf(stderr, "qlm serve: --api-key needs a non-empty key\n");
        return 2;
    }
    struct stat st;
    if (adapter_dir && (stat(adapter_dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "qlm serve: --adapter-dir %s is not a folder\n", adapter_dir);
        return 2;
    }
    if (cors && (!cors[0] || strchr(cors, '\r') || strchr(cors, '\n') || strchr(cors, ','))) {
        fprintf(stderr, "qlm serve: --cors-origin takes one origin such as https://app.example, or *\n");
        return 2;
    }
    if (fit_descriptors(&max_conn, quiet) != 0) return 1;
    /* Found before the model loads, which can take minutes. */
    if (qlm_server_check_listen(host, port) != 0) return cli_fail("serve");
    cli_model cm;
    mo.distributed = 1;
    if (cli_load_model(&mo, &cm, 1, quiet) != 0) return cli_model_fail(&cm, "serve");
    /* Sharded: rank 0 serves; the others hold their parts of the weights for its passes until it
     * stops (signals go to rank 0, which ends them). */
    if (!cli_is_root(&cm)) {
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        int rc = cli_dist_drain(&cm.dist) == 0 ? 0 : cli_model_fail(&cm, "serve");
        cli_free_model(&cm);
        return rc;
    }
    if (cli_chat_template_ready(&mo, &cm, quiet) != 0) return cli_model_fail(&cm, "serve");
    /* A decoder's context holds prompt and output; T5 has separate input and output windows. */
    int ctx = cm.src.is_t5 ? (mo.ctx > 0 ? mo.ctx : 2048) : cli_context_size(&mo, &cm);
    int limit = cm.src.is_t5 ? 1024 : ctx / 2 < 1024 ? ctx / 2 : 1024;
    if (max_output == 0) max_output = limit > 0 ? limit : 1;
    int max_prompt = cm.src.is_t5 ? ctx : ctx - max_output;
    if (max_prompt < 1) {
        cli_free_model(&cm);
        fprintf(stderr, "qlm serve: --max-output %d leaves no room for a prompt in a context of %d\n", max_output, ctx);
        return 2;
    }
    char model_name[256];
    if (name) snprintf(model_name, sizeof model_name, "%s", name);
    else base_name(mo.model, model_name, sizeof model_name);
    qlm_server_config sc = {.host = host, .port = port, .api_key = api_key, .metrics_public = metrics_public,
                            .cors_origin = cors,
                            .adapter_dir = adapter_dir, .model_name = model_name,
                            .model = cm.src.is_t5 ? NULL : &cm.model, .t5 = cm.src.is_t5 ? &cm.t5 : NULL,
                            .tok = cm.src.tok, .lora = &cm.lora, .max_seqs = max_seqs, .max_prompt = max_prompt,
                            .max_output = max_output, .max_queue = max_queue, .timeout_s = timeout,
                            .max_connections = max_conn, .max_connections_per_ip = max_conn_ip,
                            .log = quiet ? NULL : log_request};
    /* Libraries start threads of their own (OpenBLAS before main), so a signal may land on any
     * thread: its handler only writes to a pipe that the main thread waits on. */
    if (pipe(g_signal_pipe) != 0) {
        cli_free_model(&cm);
        fprintf(stderr, "qlm serve: cannot create a pipe\n");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    qlm_server *srv;
    if (qlm_server_start(&sc, &srv) != 0) {
        cli_free_model(&cm);
        return cli_fail("serve");
    }
    int v6 = strchr(host, ':') != NULL;
    printf("qlm serve: listening on http://%s%s%s:%d (model %s, %d adapters, %d sequences, prompt <= %d, output <= %d)\n",
           v6 ? "[" : "", host, v6 ? "]" : "", qlm_server_port(srv), model_name, cm.lora.n, max_seqs, max_prompt, max_output);
    fflush(stdout);
    watcher w = {srv, quiet};
    pthread_t tid;
    if (pthread_create(&tid, NULL, watch_signals, &w) != 0) {
        qlm_server_free(srv);
        cli_free_model(&cm);
        fprintf(stderr, "qlm serve: cannot start a thread\n");
        return 1;
    }
    int rc = qlm_server_run(srv);
    pthread_join(tid, NULL);
    qlm_server_free(srv);
    if (rc == 0) rc = cli_dist_drain(&cm.dist);
    if (rc != 0) return cli_model_fail(&cm, "serve");
    cli_free_model(&cm);
    return 0;
}
