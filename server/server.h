/* An OpenAI-compatible HTTP server (libmicrohttpd) over the continuous-batching scheduler: HTTP
 * threads parse and validate requests and queue them; the thread in qlm_server_run owns the model
 * and runs qlm_batch_run over whatever is queued; text flows back through each request's emit. */
#ifndef QLM_SERVER_H
#define QLM_SERVER_H

#include "../runtime/batch.h"
#include "../lora/lora.h"

typedef struct {
    const char *host;        /* address or name to bind, IPv4 or IPv6 (default 127.0.0.1) */
    int port;                /* 0: any free port (see qlm_server_port) */
    const char *api_key;     /* NULL: no authentication; else "Authorization: Bearer KEY" is required */
    int metrics_public;      /* GET /metrics answers without the key */
    const char *cors_origin; /* an Origin whose pages may call the server ("*": any); NULL: none */
    const char *adapter_dir; /* POST /v1/adapters loads folders inside it only; NULL: loading is off */
    const char *model_name;  /* the base model's id in /v1/models */
    const qlm_model *model;  /* decoder-only, or */
    const qlm_t5_model *t5;  /* encoder-decoder */
    const qlm_tokenizer *tok;
    qlm_lora_registry *lora; /* adapters a request may name; POST/DELETE /v1/adapters change it */
    int max_seqs;            /* sequences decoded together */
    int max_prompt, max_output; /* per-sequence limits in tokens */
    int max_queue;           /* requests waiting beyond the running ones before 429 */
    int timeout_s;           /* a request must arrive whole within this, and an idle connection is
                              * closed after it (0: 30 s) */
    int max_connections;     /* open connections at most (the process needs as many descriptors) */
    int max_connections_per_ip; /* from one client address at most (0: no such limit) */
    /* One line per finished HTTP request, called from HTTP threads; a request whose client left
     * before its generation ended is logged when it ends, as status 499, with the tokens made. */
    void (*log)(void *user, const char *method, const char *path, int status, int tokens, double ms);
    void *log_user;
} qlm_server_config;

typedef struct qlm_server qlm_server;

struct sockaddr_storage;
/* host (a name, an IPv4 or an IPv6 address; a name's IPv4 address first) and port as a socket address. */
int qlm_server_resolve(const char *host, int port, struct sockaddr_storage *out);
/* Whether the server could listen there: resolves and binds a socket, then lets it go, so that a
 * wrong --host or a port in use is found before a model is loaded. */
int qlm_server_check_listen(const char *host, int port);

/* Starts listening. The config's pointers must outlive the server. */
int qlm_server_start(const qlm_server_config *cfg, qlm_server **out);
int qlm_server_port(const qlm_server *s);
/* Runs the scheduler in the calling thread (the only one that uses the model) until
 * qlm_server_shutdown; 0, or -1 when a batch run failed while serving. */
int qlm_server_run(qlm_server *s);
/* From another thread: refuses new generations (503), waits for the in-flight ones to finish,
 * then makes qlm_server_run return. */
void qlm_server_shutdown(qlm_server *s);
/* After qlm_server_run returned: stops listening and frees. */
void qlm_server_free(qlm_server *s);

#endif
