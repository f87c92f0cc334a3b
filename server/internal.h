/* Parts of the server shared between its files: the job a request becomes, the queue the
 * scheduler thread serves, and JSON request parsing / response building. */
#ifndef QLM_SERVER_INTERNAL_H
#define QLM_SERVER_INTERNAL_H

#include <poll.h>
#include <pthread.h>
#include <time.h>
#include <cjson/cJSON.h>

#include "../core/clock.h"
#include "../runtime/json_constraint.h"
#include "server.h"

/* Request policy (guard.c). The Host of a request to a loopback server must be the loopback
 * (a DNS name rebound to 127.0.0.1 is refused). */
int guard_host_ok(const qlm_server_config *cfg, const char *host);
/* 0: no Origin, or the server's own page; 1: an origin --cors-origin allows; -1: refused. */
int guard_origin(const qlm_server_config *cfg, const char *origin, const char *host);
/* Whether a Content-Type is application/json (parameters allowed). */
int guard_json_type(const char *content_type);
/* The real path of an adapter folder named by path (absolute, or relative to adapter_dir) when it
 * lies inside adapter_dir; -1 for everything else, missing or outside alike. */
int guard_adapter_path(const char *adapter_dir, const char *path, char **resolved);

/* JOB_MAX_CHOICES: the most choices ("n") one request may ask for. */
enum { JOB_MAX_STOP = 4, JOB_MAX_CHOICES = 8 };

/* One generated token's log-probability and its alternatives'. */
typedef struct {
    qlm_token_logprob chosen;
    int n_top;
    qlm_token_logprob top[QLM_MAX_TOP_LOGPROBS];
} job_logprob;

struct job;

/* One sequence of a job: choice `index` of its n, a request of its own to the scheduler. */
typedef struct {
    struct job *job;
    int index;
    qlm_gen_params params;   /* the job's, with this choice's seed and log-probability sink */
    /* Guarded by the queue's mutex. */
    job_logprob *lp;         /* every generated token's, in order */
    int n_lp, cap_lp, lp_taken; /* lp_taken: how many a stream has sent */
    char *pending;           /* streamed text not yet taken by the HTTP side */
    size_t pending_len, pending_cap;
    char *text;              /* the whole output, once finished */
    size_t text_len;
    qlm_gen_stats stats;
    int finished, failed;
    int end_taken;           /* job_take has handed over the end */
} job_choice;

/* A generation request: n choices of the same prompt and parameters, queued together. */
typedef struct job {
    /* Set by the HTTP thread before queueing, read-only afterwards. */
    int *ids;
    int n_ids;
    qlm_gen_params params;   /* what every choice starts from */
    char *stop[JOB_MAX_STOP];
    qlm_logit_bias *logit_bias; /* params.sampling.logit_bias points here */
    qlm_json_grammar *json;     /* response_format's grammar (params.json points here), or NULL */
    char adapter_name[128];  /* the adapter the request names ("" for the base), resolved by http.c */
    int adapter_via_model;   /* named through "model" rather than "adapter" (for the 404's wording) */
    const qlm_lora_adapter *adapter; /* set only by queue_acquire_adapter, which counts it as a user */
    int stream;
    int include_usage;       /* stream_options.include_usage: a last chunk carries the usage */
    int logprobs;            /* the response carries log-probabilities (params.top_logprobs alternatives) */
    char *echo;              /* completions' echo: the prompt, which every choice's text starts with (else NULL) */
    job_choice *choices;
    int n_choices;
    /* Guarded by the queue's mutex. */
    job_logprob *prompt_lp;  /* with echo and logprobs: the log-probabilities of prompt tokens 1.. */
    int n_prompt_lp;
    int started;             /* choices handed to the scheduler */
    int unfinished;          /* choices queued or running */
    double first_text_s;     /* qlm_now_s() when the first generated text arrived (0: none yet) */
    int cancelled;
    int refs;                /* the HTTP side's, and one per unfinished choice for the scheduler */
    /* The HTTP side's connection sleeps while no choice has anything for it: job_park suspends
     * it, and the next text or end calls wake(hook_user) once. */
    void (*park)(void *hook_user);
    void (*wake)(void *hook_user);
    void *hook_user;
    int parked;
    /* Set by the HTTP side when its request ended before the job did (the client left): called once,
     * under the mutex, when the last choice finishes with its final stats. */
    void (*on_end)(struct job *j, void *user);
    void *end_user;
    struct job *next;
    struct job_queue *queue;
} job;

typedef struct job_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* work arrived, or stop */
    job *head, *tail;
    int queued;              /* jobs with a choice not yet handed to the scheduler */
    int running;             /* choices handed to the scheduler and not finished */
    int max_queue, stop, failed;
    job_choice **active;     /* those choices, [cfg.n_slots] */
    qlm_batch_config cfg;
    qlm_batch *batch;        /* slots and caches, allocated once for every burst */
    /* Per sequence: a job of n choices counts its prompt n times, and the copies of it that its
     * choices after the first take from the first's caches as cached. */
    long generated_tokens, prompt_tokens, cached_prompt_tokens;
    /* Jobs holding each resident adapter, from parse until freed, so an unload can refuse while
     * one is in use. The mutex also guards the server's registry (load, unload, lookups). */
    struct {
        const qlm_lora_adapter *adapter;
        int users;
    } adapter_users[QLM_LORA_MAX_RESIDENT];
} job_queue;

int queue_start(job_queue *q, const qlm_batch_config *cfg, int max_queue);
/* The scheduler loop: serves queued jobs until queue_stop and then returns once nothing is queued
 * or running. -1 when a batch run failed (its choices ended as failed; later ones were still served). */
int queue_run(job_queue *q);
void queue_stop(job_queue *q);
void queue_free(job_queue *q);
/* Queues all of j's choices, or none: 0, or -1 when the queue is full (429). Takes a reference per
 * choice for the scheduler. */
int queue_push(job_queue *q, job *j);
job *job_new(void);
/* Gives j n choices, each starting from j->params, collecting its log-probabilities when j->logprobs
 * (and the prompt's with j->echo). 0, or -1 when out of memory. */
int job_add_choices(job *j, int n);
/* Drops one reference (the queue's mutex must not be held). */
void job_release(job_queue *q, job *j);
/* Moves c's streamed text into *text (malloc'd, or NULL) and *len, and (when lp is not NULL) a copy
 * of the log-probabilities generated since the last take into *lp (malloc'd, or NULL) and *n_lp.
 * Returns 1 when c is finished (its results are then final). */
int job_take(job_queue *q, job_choice *c, char **text, size_t *len, job_logprob **lp, int *n_lp);
/* Unless some choice of j has text or an end that job_take has not handed over, parks j (see
 * job.park) and returns 1; else 0. */
int job_park(job_queue *q, job *j);
/* 1 when every choice of j has finished (the results are then final); else parks j until the next
 * one does and returns 0. */
int job_wait(job_queue *q, job *j);
/* The tokens j's choices generated (with the mutex held, or once all finished). */
int job_generated(const job *j);
void job_cancel(job_queue *q, job *j);
/* Whether j was cancelled (its client left). */
int job_cancelled(job_queue *q, job *j);
/* With the mutex held: makes a the job's adapter and counts the job as its user until it is freed. */
void queue_acquire_adapter(job_queue *q, job *j, const qlm_lora_adapter *a);
/* With the mutex held: how many jobs hold a. */
int queue_adapter_users(const job_queue *q, const qlm_lora_adapter *a);

/* ---- watchdog.c ---- */

/* One open connection. */
typedef struct peer {
    int fd;
    int receiving;           /* a request is due: since + the deadline is when it must have arrived */
    double since;
    int cut;                 /* shut down for missing the deadline */
    job *job;                /* a waiting generation, cancelled if the client hangs up */
    struct peer *prev, *next;
} peer;

typedef struct {
    pthread_mutex_t mu;      /* guards the peers and counts */
    pthread_cond_t cv;
    pthread_t thread;
    peer *head;
    struct pollfd *pfd;      /* the tick's poll set, and the peer of each entry */
    struct peer **pmap;
    int cap;
    int open, stop;
    long cut;
    double deadline_s;
    job_queue *queue;
} watchdog;

int watchdog_start(watchdog *w, job_queue *q, double deadline_s);
/* After MHD stopped: ends the thread. */
void watchdog_stop(watchdog *w);
/* From MHD's connection notices: a new connection (NULL when out of memory), and its close. */
peer *watchdog_add(watchdog *w, int fd);
void watchdog_remove(watchdog *w, peer *p);
/* The request arrived whole: no deadline until it is answered. */
void watchdog_arrived(watchdog *w, peer *p);
/* j's client is watched for hanging up until watchdog_answered. */
void watchdog_watch_job(watchdog *w, peer *p, job *j);
/* The request was answered: the next one on the connection is due within the deadline. */
void watchdog_answered(watchdog *w, peer *p);
void watchdog_counts(watchdog *w, int *open, long *cut);

/* ---- openai.c ---- */

typedef struct {
    int status;          /* HTTP status of the error */
    const char *type;    /* "invalid_request_error", ... */
    char message[256];
} api_error;

/* Parses a /v1/completions (chat = 0) or /v1/chat/completions body into j (ids, params and choices,
 * adapter_name, stream, a response_format's grammar over json_vocab, the tokenizer's index) and
 * the model id to echo. Returns 0, or -1 with *e filled. */
int openai_parse_generation(const qlm_server_config *cfg, const qlm_json_vocab *json_vocab, const char *body,
                            size_t len, int chat, job *j, char *model_id, size_t model_cap, api_error *e);
char *openai_error_json(const api_error *e);

/* What every part of one generation's answer repeats. */
typedef struct {
    const qlm_tokenizer *tok; /* spells the log-probabilities' tokens */
    int chat;
    const char *id, *model;
    long created;
} openai_reply;

/* The final non-streamed response, once every choice has finished. */
char *openai_result_json(const openai_reply *r, const job *j);
/* Parts of a streamed chunk: the choice's first (chat: its role; an echo: the prompt before the
 * text, with its log-probabilities), its finish_reason. */
enum { CHUNK_FIRST = 1, CHUNK_FINISH = 2 };
/* One streamed chunk of choice c: text (may be empty) with the log-probabilities of its tokens (lp,
 * n_lp; *lp_offset, the choice's text before them, is advanced past them), and the parts flags asks
 * for; "usage": null when the job asked for the usage (which comes in openai_usage_chunk_json). */
char *openai_chunk_json(const openai_reply *r, const job_choice *c, const char *text, size_t len,
                        const job_logprob *lp, int n_lp, size_t *lp_offset, int flags);
/* The chunk after every choice has ended, for stream_options.include_usage: "choices": [] and the usage. */
char *openai_usage_chunk_json(const openai_reply *r, const job *j);
/* Resolves j->adapter_name in the registry (the caller holds the lock guarding it): the adapter,
 * or NULL for the base; -1 with a 404 in *e when no adapter has that name. */
int openai_find_adapter(const qlm_server_config *cfg, const job *j, const qlm_lora_adapter **out, api_error *e);
/* A POST /v1/adapters body: {"name": ..., "path": ...}, the name checked against the rules of
 * qlm_lora_load and the base's id. 0, or -1 with a 400 naming the field in *e. */
int openai_parse_adapter_load(const qlm_server_config *cfg, const char *body, size_t len, char *name, size_t name_cap,
                              char **path, api_error *e);
/* GET /v1/models (id NULL), or the model of that id (*found 0 when none has it). */
char *openai_models_json(const qlm_server_config *cfg, long created, const char *id, int *found);
char *openai_tokenize_json(const qlm_server_config *cfg, const char *body, size_t len, api_error *e);
char *openai_detokenize_json(const qlm_server_config *cfg, const char *body, size_t len, api_error *e);
const char *openai_finish_reason(qlm_stop_reason r);

/* ---- chat_page.c ---- */

/* The HTML of the chat page served at GET /. */
extern const char qlm_chat_page[];

#endif
