#include "batch.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "token_stream.h"

typedef struct {
    int active;
    int pending; /* admitted, its prompt (T5: its start token) not yet evaluated */
    qlm_batch_request req;
    int *tokens; /* decoder-only: prompt + output; T5: decoder tokens from its start token */
    int n_tokens;
    /* Decoder-only: the leading tokens whose keys and values the slot's caches hold (kept after the
     * request ends, for a later prompt that starts the same way), the adapter they were computed
     * with, and the request's admission number. */
    int n_cached;
    const struct qlm_lora_adapter *cache_adapter;
    long admitted;
    qlm_token_stream ts;
    qlm_gen_stats stats;
    char *text;
    size_t len, cap;
} slot;

struct qlm_batch {
    qlm_batch_config cfg;
    qlm_kv_state kv;
    qlm_t5_state t5;
    slot *slots;
    int vocab, capacity;
    float *logits;      /* [n_slots][vocab]: each slot's next-token logits */
    float *row_logits;  /* [n_slots][vocab]: one decode step's output rows */
    int *ids, *pos, *slot_of, *rows;
    long admissions;
};

typedef struct qlm_batch batch;

static int collect_text(void *user, const char *text, size_t len) {
    slot *s = user;
    if (s->len + len + 1 > s->cap) {
        size_t cap = (s->len + len + 1) * 2;
        char *b = realloc(s->text, cap);
        if (!b) return 1;
        s->text = b;
        s->cap = cap;
    }
    memcpy(s->text + s->len, text, len);
    s->len += len;
    s->text[s->len] = 0;
    return s->req.emit ? s->req.emit(s->req.emit_user, text, len) : 0;
}

/* Evaluates rows (ids at pos in slots) and writes the logits of the listed rows to out. */
static int evaluate(batch *b, const int *ids, const int *pos, const int *slots, int n, const int *rows, int n_rows,
                    float *out) {
    const qlm_batch_config *c = &b->cfg;
    int rc = c->t5 ? qlm_t5_decode(c->t5, &b->t5, ids, pos, slots, n, rows, n_rows, out)
                   : qlm_forward_slots(c->model, &b->kv, ids, pos, slots, n, rows, n_rows, out);
    /* A failed pass may have written part of its slots' caches. */
    for (int r = 0; r < n; r++) {
        slot *s = &b->slots[slots[r]];
        if (rc != 0) s->n_cached = 0;
        else if (pos[r] + 1 > s->n_cached) s->n_cached = pos[r] + 1;
    }
    return rc != 0 ? -1 : 0;
}

/* Evaluates rows and keeps the logits of each listed row in its slot. */
static int forward(batch *b, const int *ids, const int *pos, const int *slots, int n, const int *rows, int n_rows) {
    if (evaluate(b, ids, pos, slots, n, rows, n_rows, b->row_logits) != 0) return -1;
    for (int r = 0; r < n_rows; r++)
        memcpy(b->logits + (size_t)slots[rows[r]] * b->vocab, b->row_logits + (size_t)r * b->vocab,
               (size_t)b->vocab * sizeof(float));
    return 0;
}

/* Rows one forward pass takes without splitting them into chunks; a split would change how a
 * prompt's attention is blocked, and so its rounding. */
static int step_rows(const batch *b) {
    return b->cfg.t5 ? b->t5.rows : b->kv.max_batch;
}

/* Shared prompt prefixes shorter than this are evaluated again rather than copied or waited for. */
#define PREFIX_MIN 16

static int common_prefix(const int *a, int na, const int *b, int nb) {
    int k = 0;
    while (k < na && k < nb && a[k] == b[k]) k++;
    return k;
}

/* The longest prefix of slot s's prompt, all but its last token at most (which is evaluated for the
 * first logits), whose keys and values some slot's caches hold for the same adapter, if it is worth
 * reusing (PREFIX_MIN), else 0; *from: that slot. */
static int cached_prefix(const batch *b, const slot *s, int *from) {
    int best = 0;
    *from = -1;
    if (b->cfg.t5 || b->cfg.no_prefix_reuse) return 0;
    for (int j = 0; j < b->cfg.n_slots; j++) {
        const slot *o = &b->slots[j];
        if (o->cache_adapter != s->req.adapter) continue;
        int k = common_prefix(s->tokens, s->n_tokens - 1, o->tokens, o->n_cached);
        k = qlm_state_resumable(b->cfg.model, &b->kv, o->n_cached, k);
        if (k > best) best = k, *from = j;
    }
    return best >= PREFIX_MIN ? best : 0;
}

/* Whether a prompt admitted before slot s's and not yet in its caches shares more of s's prompt
 * than any cache holds (have), so that s does better to wait a step and copy it. Only earlier
 * requests are awaited, so the earliest waiting prompt always goes ahead. */
static int awaits_prefix(const batch *b, const slot *s, int have) {
    for (int j = 0; j < b->cfg.n_slots && !b->cfg.no_prefix_reuse; j++) {
        const slot *o = &b->slots[j];
        if (!o->active || o->admitted >= s->admitted || o->n_cached >= o->req.n_ids || o->req.adapter != s->req.adapter)
            continue;
        int k = common_prefix(s->tokens, s->n_tokens - 1, o->tokens, o->req.n_ids);
        if (k >= PREFIX_MIN && k > have) return 1;
    }
    return 0;
}

/* Gives pending slot i the first k positions of its prompt from slot `from`'s caches (cached_prefix;
 * nothing to do for k = 0 or i itself), so that evaluation starts at k. The skipped rows' keys and
 * values are what the prompt's own would be, up to the rounding of how its remaining rows are grouped. */
static int reuse_prefix(batch *b, int i, int from, int k, qlm_batch_stats *st) {
    slot *s = &b->slots[i];
    if (k == 0) return 0;
    if (qlm_state_copy_prefix(b->cfg.model, &b->kv, i, from, k) != 0) return -1;
    s->n_cached = k;
    s->stats.n_prompt = s->n_tokens - k;
    st->reused_tokens += k;
    return 0;
}

/* Evaluates slot i's whole prompt now, alone, keeping every row's logits: each token after the
 * first gets its log-probability given those before it (req.on_prompt_logprob), and the last row's
 * logits are the first generated token's. The chunks are the ones qlm_forward_slots splits a
 * prompt into, so the rows round as they do in one call. */
static int prefill_scored(batch *b, int i) {
    slot *s = &b->slots[i];
    const qlm_gen_params *p = s->req.params;
    int n = s->n_tokens, chunk = n < b->kv.max_batch ? n : b->kv.max_batch;
    /* A chunk's logits: chunk x vocab floats, freed once the prompt is scored. */
    float *logits = malloc((size_t)chunk * b->vocab * sizeof *logits);
    int *idx = malloc((size_t)chunk * 3 * sizeof *idx);
    int rc = logits && idx ? 0 : qlm_errorf("out of memory");
    for (int start = 0; rc == 0 && start < n; start += chunk) {
        int len = n - start < chunk ? n - start : chunk, *pos = idx, *slots = idx + chunk, *rows = idx + 2 * chunk;
        for (int k = 0; k < len; k++) {
            pos[k] = start + k;
            slots[k] = i;
            rows[k] = k;
        }
        rc = evaluate(b, s->tokens + start, pos, slots, len, rows, len, logits);
        for (int k = 0; rc == 0 && k < len && start + k + 1 < n; k++) {
            qlm_token_logprob chosen, top[QLM_MAX_TOP_LOGPROBS];
            int have = qlm_logprobs(logits + (size_t)k * b->vocab, b->vocab, s->tokens[start + k + 1], p->top_logprobs,
                                    &chosen, top);
            s->req.on_prompt_logprob(p->logprob_user, chosen, top, have);
        }
        if (rc == 0 && start + len == n)
            memcpy(b->logits + (size_t)i * b->vocab, logits + (size_t)(len - 1) * b->vocab,
                   (size_t)b->vocab * sizeof *logits);
    }
    free(logits);
    free(idx);
    s->pending = rc != 0;
    return rc;
}

/* Puts a new request into slot i. Its prompt (T5: the encoder runs now, and the decoder's start
 * token waits) is evaluated with the next decode step when it fits beside a full batch of decode
 * rows; a longer prompt, or one whose log-probabilities are asked for, is prefilled now, alone.
 * Either way its first token's logits are ready before it is first sampled. */
static int admit(batch *b, int i, const qlm_batch_request *req, qlm_batch_stats *st) {
    const qlm_batch_config *c = &b->cfg;
    slot *s = &b->slots[i];
    if (req->n_ids <= 0 || req->n_ids > c->max_prompt)
        return qlm_errorf("a prompt of %d tokens does not fit the batch's limit of 1..%d", req->n_ids, c->max_prompt);
    s->req = *req;
    s->len = 0;
    qlm_lora_slots_set(c->t5 ? &b->t5.lora : &b->kv.lora, i, req->adapter);
    int prev = -1;
    if (c->t5) {
        if (qlm_t5_encode(c->t5, &b->t5, i, req->ids, req->n_ids) != 0) return -1;
        s->tokens[0] = c->t5->cfg.decoder_start_id;
        s->n_tokens = 1;
    } else {
        /* What the caches keep of the slot's last request, for the new prompt. */
        s->n_cached = s->cache_adapter == req->adapter
                          ? qlm_state_resumable(c->model, &b->kv, s->n_cached,
                                                common_prefix(req->ids, req->n_ids, s->tokens, s->n_cached))
                          : 0;
        s->cache_adapter = req->adapter;
        memcpy(s->tokens, req->ids, (size_t)req->n_ids * sizeof *req->ids);
        s->n_tokens = req->n_ids;
        prev = s->tokens[s->n_tokens - 1];
    }
    s->admitted = b->admissions++;
    if (qlm_token_stream_init(&s->ts, c->tok, req->params, b->vocab, prev, collect_text, s, &s->stats) != 0) return -1;
    s->stats.n_prompt = req->n_ids;
    s->active = 1;
    s->pending = 1;
    st->prompt_tokens += req->n_ids;
    if (req->on_prompt_logprob) {
        if (c->t5) return qlm_errorf("batch: a T5 prompt is the encoder's input and has no log-probabilities");
        return prefill_scored(b, i);
    }
    if (s->n_tokens <= step_rows(b) - c->n_slots) return 0;
    int from, start = cached_prefix(b, s, &from);
    if (reuse_prefix(b, i, from, start, st) != 0) return -1;
    int n = s->n_tokens - start, *pos = malloc((size_t)n * 2 * sizeof *pos);
    if (!pos) return qlm_errorf("out of memory");
    int *slots = pos + n, last = n - 1;
    for (int k = 0; k < n; k++) {
        pos[k] = start + k;
        slots[k] = i;
    }
    int rc = forward(b, s->tokens + start, pos, slots, n, &last, 1);
    free(pos);
    s->pending = rc != 0;
    return rc;
}

/* Reports a finished slot and frees it. */
static int retire(batch *b, int i, qlm_batch_done_fn done, void *ctx, qlm_batch_stats *st) {
    slot *s = &b->slots[i];
    qlm_token_stream_finish(&s->ts);
    s->active = 0;
    /* The adapter may be unloaded once its request is done: the free slot must not keep it, nor keys
     * and values computed with it (another adapter could take its address). */
    qlm_lora_slots_set(b->cfg.t5 ? &b->t5.lora : &b->kv.lora, i, NULL);
    if (s->cache_adapter) s->n_cached = 0, s->cache_adapter = NULL;
    st->requests++;
    st->generated_tokens += s->stats.n_generated;
    if (done(ctx, &s->req, s->text ? s->text : "", s->len, &s->stats) != 0)
        return qlm_errorf("batch: stopped by the caller");
    return 0;
}

static int alloc_batch(batch *b) {
    const qlm_batch_config *c = &b->cfg;
    int n = c->n_slots;
    b->vocab = c->t5 ? c->t5->cfg.vocab_size : c->model->cfg.vocab_size;
    if (c->t5) {
        b->capacity = c->max_output + 1;
        if (qlm_t5_state_init(&b->t5, c->t5, c->max_prompt, b->capacity, n) != 0) return -1;
    } else {
        b->capacity = c->max_prompt + c->max_output;
        if (b->capacity > qlm_llama_positions(&c->model->cfg))
            return qlm_errorf("prompt (%d) + output (%d) tokens exceed the model's %d positions", c->max_prompt,
                              c->max_output, qlm_llama_positions(&c->model->cfg));
        int rows = n > 256 ? n : 256;
        if (qlm_state_init_slots(&b->kv, c->model, b->capacity, n, rows) != 0) return -1;
    }
    b->slots = calloc((size_t)n, sizeof *b->slots);
    b->logits = malloc((size_t)n * b->vocab * sizeof *b->logits);
    b->row_logits = malloc((size_t)n * b->vocab * sizeof *b->row_logits);
    /* A step's rows: the decode rows and the prompts that join them, at most one chunk. */
    int rows = step_rows(b);
    b->ids = malloc((size_t)rows * 4 * sizeof *b->ids);
    if (!b->slots || !b->logits || !b->row_logits || !b->ids) return qlm_errorf("out of memory");
    b->pos = b->ids + rows;
    b->slot_of = b->pos + rows;
    b->rows = b->slot_of + rows;
    for (int i = 0; i < n; i++)
        if (!(b->slots[i].tokens = malloc((size_t)b->capacity * sizeof(int)))) return qlm_errorf("out of memory");
    return 0;
}

static void free_batch(batch *b) {
    const qlm_batch_config *c = &b->cfg;
    for (int i = 0; b->slots && i < c->n_slots; i++) {
        if (b->slots[i].active) qlm_token_stream_finish(&b->slots[i].ts);
        free(b->slots[i].tokens);
        free(b->slots[i].text);
    }
    if (c->t5 && b->t5.n_slots) qlm_t5_state_free(&b->t5, c->t5);
    if (!c->t5 && b->kv.n_slots) qlm_state_free(&b->kv, c->model);
    free(b->slots);
    free(b->logits);
    free(b->row_logits);
    free(b->ids);
}


qlm_batch *qlm_batch_new(const qlm_batch_config *cfg) {
    if (!cfg->model == !cfg->t5) {
        qlm_errorf("batch: give exactly one model");
        return NULL;
    }
    if (cfg->n_slots <= 0 || cfg->max_prompt <= 0 || cfg->max_output <= 0) {
        qlm_errorf("batch: slots, prompt and output sizes must be positive");
        return NULL;
    }
    batch *b = calloc(1, sizeof *b);
    if (!b) {
        qlm_errorf("out of memory");
        return NULL;
    }
    b->cfg = *cfg;
    if (alloc_batch(b) != 0) {
        qlm_batch_free(b);
        return NULL;
    }
    return b;
}

void qlm_batch_free(qlm_batch *b) {
    if (!b) return;
    free_batch(b);
    free(b);
}

int qlm_batch_drain(qlm_batch *b, qlm_batch_next_fn next, qlm_batch_done_fn done, void *ctx, qlm_batch_stats *stats) {
    const qlm_batch_config *cfg = &b->cfg;
    qlm_batch_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    double t0 = qlm_now_s();
    int rc = 0;
    while (rc == 0) {
        /* Free slots take what is waiting now; requests that arrive later join at a later step. */
        int more = 1;
        for (int i = 0; i < cfg->n_slots && more && rc == 0; i++) {
            if (b->slots[i].active) continue;
            qlm_batch_request req;
            int r = next(ctx, &req);
            if (r < 0) rc = -1;
            else if (r == 0) more = 0;
            else rc = admit(b, i, &req, stats);
        }
        if (rc != 0) break;
        /* Sample every evaluated slot; the ones that go on form this step's rows. */
        int n = 0;
        for (int i = 0; i < cfg->n_slots && rc == 0; i++) {
            slot *s = &b->slots[i];
            if (!s->active || s->pending) continue;
            int id, r = qlm_token_stream_next(&s->ts, b->logits + (size_t)i * b->vocab, s->tokens, s->n_tokens, &id);
            if (r == 0 && s->n_tokens >= b->capacity) {
                s->stats.reason = QLM_STOP_CONTEXT;
                r = 1;
            }
            if (r < 0) rc = -1;
            else if (r == 1) rc = retire(b, i, done, ctx, stats);
            else {
                b->ids[n] = id;
                b->pos[n] = s->n_tokens;
                b->slot_of[n] = i;
                b->rows[n] = n;
                s->tokens[s->n_tokens++] = id;
                n++;
            }
        }
        if (rc != 0) break;
        /* Admitted prompts join the step while the rows fit one chunk; the logits of each one's
         * last row are its first token's. Rows are independent in every op (matmul rows, a
         * prompt's own attention form), so each request still gets what it gets alone (a copied
         * prefix aside, see reuse_prefix). */
        int n_logits = n;
        for (int i = 0; i < cfg->n_slots && rc == 0; i++) {
            slot *s = &b->slots[i];
            if (!s->active || !s->pending) continue;
            int from, start = cached_prefix(b, s, &from);
            if (n + s->n_tokens - start > step_rows(b) || (!cfg->t5 && awaits_prefix(b, s, start))) continue;
            if (reuse_prefix(b, i, from, start, stats) != 0) {
                rc = -1;
                break;
            }
            for (int k = start; k < s->n_tokens; k++, n++) {
                b->ids[n] = s->tokens[k];
                b->pos[n] = k;
                b->slot_of[n] = i;
            }
            b->rows[n_logits++] = n - 1;
            s->pending = 0;
        }
        if (n == 0) {
            if (!more) break;
            continue;
        }
        rc = forward(b, b->ids, b->pos, b->slot_of, n, b->rows, n_logits);
        stats->steps++;
    }
    /* After an error the requests still in slots are dropped, so the batch can serve again. */
    for (int i = 0; i < cfg->n_slots; i++)
        if (b->slots[i].active) {
            qlm_token_stream_finish(&b->slots[i].ts);
            b->slots[i].active = 0;
        }
    stats->seconds = qlm_now_s() - t0;
    return rc;
}

int qlm_batch_run(const qlm_batch_config *cfg, qlm_batch_next_fn next, qlm_batch_done_fn done, void *ctx,
                  qlm_batch_stats *stats) {
    qlm_batch *b = qlm_batch_new(cfg);
    if (!b) return -1;
    int rc = qlm_batch_drain(b, next, done, ctx, stats);
    qlm_batch_free(b);
    return rc;
}
