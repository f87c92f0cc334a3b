/* The request queue and the scheduler loop, run by the one thread that touches the model (the
 * caller's: the main thread in `qlm serve`, so the CPU backend's per-thread scratch lives in the
 * OpenMP team every command uses). It sleeps until requests arrive, then drains them through one
 * qlm_batch made at start (no allocation per burst), which takes queued requests into free slots
 * between decode steps and returns once nothing is queued or running. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/error.h"
#include "internal.h"

job *job_new(void) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->refs = 1;
    j->params.stop = (const char *const *)j->stop;
    return j;
}

static void job_free(job *j) {
    free(j->ids);
    for (int i = 0; i < JOB_MAX_STOP; i++) free(j->stop[i]);
    for (int i = 0; i < j->n_choices; i++) {
        free(j->choices[i].pending);
        free(j->choices[i].text);
        free(j->choices[i].lp);
    }
    free(j->choices);
    free(j->echo);
    free(j->prompt_lp);
    free(j->logit_bias);
    qlm_json_grammar_free(j->json);
    free(j);
}

void queue_acquire_adapter(job_queue *q, job *j, const qlm_lora_adapter *a) {
    j->adapter = a;
    if (!a) return;
    int free_at = -1;
    for (int i = 0; i < QLM_LORA_MAX_RESIDENT; i++) {
        if (q->adapter_users[i].adapter == a) {
            q->adapter_users[i].users++;
            return;
        }
        if (free_at < 0 && !q->adapter_users[i].users) free_at = i;
    }
    /* At most QLM_LORA_MAX_RESIDENT adapters are resident, so a slot is free. */
    q->adapter_users[free_at].adapter = a;
    q->adapter_users[free_at].users = 1;
}

int queue_adapter_users(const job_queue *q, const qlm_lora_adapter *a) {
    for (int i = 0; i < QLM_LORA_MAX_RESIDENT; i++)
        if (q->adapter_users[i].users && q->adapter_users[i].adapter == a) return q->adapter_users[i].users;
    return 0;
}

/* With the mutex held. The adapter's use ends with the job's last reference. */
static void release_locked(job_queue *q, job *j) {
    if (--j->refs > 0) return;
    for (int i = 0; j->adapter && i < QLM_LORA_MAX_RESIDENT; i++)
        if (q->adapter_users[i].users && q->adapter_users[i].adapter == j->adapter) {
            if (--q->adapter_users[i].users == 0) q->adapter_users[i].adapter = NULL;
            break;
        }
    job_free(j);
}

void job_release(job_queue *q, job *j) {
    pthread_mutex_lock(&q->mu);
    release_locked(q, j);
    pthread_mutex_unlock(&q->mu);
}

int job_cancelled(job_queue *q, job *j) {
    pthread_mutex_lock(&q->mu);
    int c = j->cancelled;
    pthread_mutex_unlock(&q->mu);
    return c;
}

void job_cancel(job_queue *q, job *j) {
    pthread_mutex_lock(&q->mu);
    j->cancelled = 1;
    pthread_mutex_unlock(&q->mu);
}

/* With the mutex held. */
static void wake_locked(job *j) {
    if (!j->parked) return;
    j->parked = 0;
    j->wake(j->hook_user);
}

/* With the mutex held. */
static void park_locked(job *j) {
    j->parked = 1;
    j->park(j->hook_user);
}

static void add_logprob(job_logprob *e, qlm_token_logprob chosen, const qlm_token_logprob *top, int n_top) {
    e->chosen = chosen;
    e->n_top = n_top;
    memcpy(e->top, top, (size_t)n_top * sizeof *top);
}

static void collect_logprob(void *user, qlm_token_logprob chosen, const qlm_token_logprob *top, int n_top) {
    job_choice *c = user;
    pthread_mutex_lock(&c->job->queue->mu);
    if (c->n_lp == c->cap_lp) {
        int cap = c->cap_lp ? c->cap_lp * 2 : 64;
        job_logprob *p = realloc(c->lp, (size_t)cap * sizeof *p);
        if (p) {
            c->lp = p;
            c->cap_lp = cap;
        }
    }
    /* Out of memory drops the entry; the text is unaffected. */
    if (c->n_lp < c->cap_lp) add_logprob(&c->lp[c->n_lp++], chosen, top, n_top);
    pthread_mutex_unlock(&c->job->queue->mu);
}

/* The prompt's, from the job's first choice (the others' prompts are the same). */
static void collect_prompt_logprob(void *user, qlm_token_logprob chosen, const qlm_token_logprob *top, int n_top) {
    job *j = ((job_choice *)user)->job;
    pthread_mutex_lock(&j->queue->mu);
    if (j->n_prompt_lp < j->n_ids - 1) add_logprob(&j->prompt_lp[j->n_prompt_lp++], chosen, top, n_top);
    pthread_mutex_unlock(&j->queue->mu);
}

int job_add_choices(job *j, int n) {
    /* The prompt's log-probabilities, one per token after the first (n_ids: never malloc(0)). */
    if (j->echo && j->logprobs && !(j->prompt_lp = malloc((size_t)j->n_ids * sizeof *j->prompt_lp))) return -1;
    if (!(j->choices = calloc((size_t)n, sizeof *j->choices))) return -1;
    j->n_choices = n;
    for (int i = 0; i < n; i++) {
        job_choice *c = &j->choices[i];
        c->job = j;
        c->index = i;
        c->params = j->params;
        if (j->logprobs) {
            c->params.on_logprob = collect_logprob;
            c->params.logprob_user = c;
        }
    }
    return 0;
}

int job_take(job_queue *q, job_choice *c, char **text, size_t *len, job_logprob **lp, int *n_lp) {
    pthread_mutex_lock(&q->mu);
    *text = NULL;
    *len = c->pending_len;
    if (c->pending_len) {
        *text = c->pending;
        c->pending = NULL;
        c->pending_len = c->pending_cap = 0;
    }
    int finished = c->finished;
    c->end_taken = finished;
    /* Log-probabilities go out with text (or at the end), never ahead of it. */
    if (lp) {
        *lp = NULL;
        *n_lp = 0;
        int n = c->n_lp - c->lp_taken;
        if (n > 0 && (*len || finished) && (*lp = malloc((size_t)n * sizeof **lp))) {
            memcpy(*lp, c->lp + c->lp_taken, (size_t)n * sizeof **lp);
            *n_lp = n;
            c->lp_taken = c->n_lp;
        }
    }
    pthread_mutex_unlock(&q->mu);
    return finished;
}

/* Both park under the mutex, so text or an end that arrives right after still finds j parked. */
int job_park(job_queue *q, job *j) {
    pthread_mutex_lock(&q->mu);
    int idle = 1;
    for (int i = 0; i < j->n_choices; i++)
        if (j->choices[i].pending_len || (j->choices[i].finished && !j->choices[i].end_taken)) idle = 0;
    if (idle) park_locked(j);
    pthread_mutex_unlock(&q->mu);
    return idle;
}

int job_wait(job_queue *q, job *j) {
    pthread_mutex_lock(&q->mu);
    int done = j->unfinished == 0;
    if (!done) park_locked(j);
    pthread_mutex_unlock(&q->mu);
    return done;
}

int job_generated(const job *j) {
    int n = 0;
    for (int i = 0; i < j->n_choices; i++) n += j->choices[i].stats.n_generated;
    return n;
}

/* Marks c finished (with the mutex held) and drops the scheduler's reference to its job. */
static void finish_locked(job_queue *q, job_choice *c, int failed) {
    job *j = c->job;
    c->finished = 1;
    c->failed = failed;
    for (int i = 0; i < q->cfg.n_slots; i++)
        if (q->active[i] == c) q->active[i] = NULL;
    q->running--;
    wake_locked(j);
    if (--j->unfinished == 0 && j->on_end) {
        j->on_end(j, j->end_user);
        j->on_end = NULL;
    }
    pthread_cond_broadcast(&q->cv);
    release_locked(q, j);
}

/* Streams text to the HTTP side; a cancelled job (its client left) ends here. */
static int emit_text(void *user, const char *text, size_t len) {
    job_choice *c = user;
    job *j = c->job;
    pthread_mutex_lock(&j->queue->mu);
    if (j->first_text_s == 0) j->first_text_s = qlm_now_s();
    int stop = j->cancelled;
    if (!stop && j->stream) {
        if (c->pending_len + len > c->pending_cap) {
            size_t cap = (c->pending_len + len) * 2 + 64;
            char *p = realloc(c->pending, cap);
            if (!p) stop = 1;
            else {
                c->pending = p;
                c->pending_cap = cap;
            }
        }
        if (!stop) {
            memcpy(c->pending + c->pending_len, text, len);
            c->pending_len += len;
            wake_locked(j);
        }
    }
    pthread_mutex_unlock(&j->queue->mu);
    return stop;
}

/* Hands out the head job's next choice; the job leaves the queue with its last one. */
static int next_job(void *ctx, qlm_batch_request *req) {
    job_queue *q = ctx;
    pthread_mutex_lock(&q->mu);
    job_choice *c = NULL;
    /* Choices whose client left while they waited never take a slot. */
    while (!c && q->head) {
        job *j = q->head;
        c = &j->choices[j->started++];
        if (j->started == j->n_choices) {
            q->head = j->next;
            if (!q->head) q->tail = NULL;
            q->queued--;
        }
        q->running++;
        if (j->cancelled) {
            c->stats.reason = QLM_STOP_CALLER;
            finish_locked(q, c, 0);
            c = NULL;
        }
    }
    if (c) {
        const job *j = c->job;
        for (int i = 0; i < q->cfg.n_slots; i++)
            if (!q->active[i]) {
                q->active[i] = c;
                break;
            }
        *req = (qlm_batch_request){.ids = j->ids, .n_ids = j->n_ids, .params = &c->params, .adapter = j->adapter,
                                   .emit = emit_text, .emit_user = c, .user = c,
                                   .on_prompt_logprob = c->index == 0 && j->prompt_lp ? collect_prompt_logprob : NULL};
    }
    pthread_mutex_unlock(&q->mu);
    return c != NULL;
}

static int done_job(void *ctx, const qlm_batch_request *req, const char *text, size_t len, const qlm_gen_stats *st) {
    job_queue *q = ctx;
    job_choice *c = req->user;
    char *copy = malloc(len + 1);
    pthread_mutex_lock(&q->mu);
    if (copy) {
        memcpy(copy, text, len);
        copy[len] = 0;
        c->text = copy;
        c->text_len = len;
    }
    c->stats = *st;
    q->generated_tokens += st->n_generated;
    q->prompt_tokens += req->n_ids;
    q->cached_prompt_tokens += req->n_ids - st->n_prompt;
    finish_locked(q, c, copy == NULL);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int queue_run(job_queue *q) {
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
        if (!q->head) break;
        pthread_mutex_unlock(&q->mu);
        int rc = qlm_batch_drain(q->batch, next_job, done_job, q, NULL);
        pthread_mutex_lock(&q->mu);
        if (rc != 0) {
            /* The run's slots are gone: every job it held ends as failed, and later ones retry. */
            q->failed = 1;
            for (int i = 0; i < q->cfg.n_slots; i++)
                if (q->active[i]) finish_locked(q, q->active[i], 1);
        }
    }
    int failed = q->failed;
    pthread_mutex_unlock(&q->mu);
    return failed ? -1 : 0;
}

int queue_start(job_queue *q, const qlm_batch_config *cfg, int max_queue) {
    memset(q, 0, sizeof *q);
    q->cfg = *cfg;
    q->max_queue = max_queue;
    if (!(q->active = calloc((size_t)cfg->n_slots, sizeof *q->active))) return qlm_errorf("out of memory");
    if (!(q->batch = qlm_batch_new(cfg))) {
        free(q->active);
        return -1;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    return 0;
}

void queue_stop(job_queue *q) {
    pthread_mutex_lock(&q->mu);
    q->stop = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void queue_free(job_queue *q) {
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    qlm_batch_free(q->batch);
    free(q->active);
}

int queue_push(job_queue *q, job *j) {
    pthread_mutex_lock(&q->mu);
    int full = q->queued >= q->max_queue;
    if (!full) {
        j->refs += j->n_choices;
        j->unfinished = j->n_choices;
        j->queue = q;
        j->next = NULL;
        if (q->tail) q->tail->next = j;
        else q->head = j;
        q->tail = j;
        q->queued++;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return full ? -1 : 0;
}
