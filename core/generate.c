#include "generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *qlm_stop_reason_name(qlm_stop_reason r) {
    static const char *names[] = {"eos", "stop", "length", "context", "caller"};
    return names[r];
}

int qlm_session_init(qlm_session *s, const qlm_model *m, const qlm_tokenizer *tok, int ctx, int max_batch) {
    memset(s, 0, sizeof *s);
    s->model = m;
    s->tok = tok;
    if (ctx > m->cfg.max_seq_len) ctx = m->cfg.max_seq_len;
    if (qlm_state_init(&s->state, m, ctx, max_batch) != 0) return -1;
    s->tokens = malloc((size_t)ctx * sizeof *s->tokens);
    s->logits = malloc((size_t)m->cfg.vocab_size * sizeof *s->logits);
    if (!s->tokens || !s->logits) {
        qlm_session_free(s);
        return qlm_errorf("out of memory");
    }
    return 0;
}

int qlm_session_init_t5(qlm_session *s, const qlm_t5_model *m, const qlm_tokenizer *tok, int max_input,
                        int max_output) {
    memset(s, 0, sizeof *s);
    s->t5 = m;
    s->tok = tok;
    if (qlm_t5_state_init(&s->t5_state, m, max_input, max_output, 1) != 0) return -1;
    s->tokens = malloc((size_t)max_output * sizeof *s->tokens);
    s->input = malloc((size_t)max_input * sizeof *s->input);
    s->logits = malloc((size_t)m->cfg.vocab_size * sizeof *s->logits);
    if (!s->tokens || !s->input || !s->logits) {
        qlm_session_free(s);
        return qlm_errorf("out of memory");
    }
    return 0;
}

void qlm_session_free(qlm_session *s) {
    if (s->model) qlm_state_free(&s->state, s->model);
    if (s->t5) qlm_t5_state_free(&s->t5_state, s->t5);
    free(s->tokens);
    free(s->input);
    free(s->logits);
    memset(s, 0, sizeof *s);
}

/* Tokens the cache holds at most (the decoder's output window for T5). */
static int capacity(const qlm_session *s) {
    return s->t5 ? s->t5_state.max_tgt : s->state.max_seq;
}

/* Appends ids to the cache and keeps the logits of the last one. */
static int eval_tokens(qlm_session *s, const int *ids, int n) {
    if (n == 0) return 0;
    if (s->n_tokens + n > capacity(s))
        return qlm_errorf("%d tokens do not fit the context window of %d", s->n_tokens + n, capacity(s));
    int *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) return qlm_errorf("out of memory");
    for (int i = 0; i < n; i++) pos[i] = s->n_tokens + i;
    int last = n - 1;
    int rc = s->t5 ? qlm_t5_decode(s->t5, &s->t5_state, ids, pos, NULL, n, &last, 1, s->logits)
                   : qlm_forward(s->model, &s->state, ids, pos, n, &last, 1, s->logits);
    free(pos);
    if (rc != 0) return -1;
    memcpy(s->tokens + s->n_tokens, ids, (size_t)n * sizeof *ids);
    s->n_tokens += n;
    s->have_logits = 1;
    return 0;
}

static int sync_t5(qlm_session *s, const int *ids, int n, qlm_gen_stats *stats) {
    double t0 = now_seconds();
    int same = n == s->n_input && memcmp(ids, s->input, (size_t)n * sizeof *ids) == 0;
    if (!same) {
        s->n_input = 0;
        if (qlm_t5_encode(s->t5, &s->t5_state, 0, ids, n) != 0) return -1;
        memcpy(s->input, ids, (size_t)n * sizeof *ids);
        s->n_input = n;
    }
    s->n_tokens = 0;
    s->have_logits = 0;
    int start = s->t5->cfg.decoder_start_id;
    int rc = eval_tokens(s, &start, 1);
    if (stats) {
        stats->n_prompt = same ? 0 : n;
        stats->prefill_seconds = now_seconds() - t0;
    }
    return rc;
}

int qlm_session_sync(qlm_session *s, const int *ids, int n, qlm_gen_stats *stats) {
    if (s->t5) return sync_t5(s, ids, n, stats);
    if (n > s->state.max_seq)
        return qlm_errorf("prompt of %d tokens does not fit the context window of %d", n, s->state.max_seq);
    int common = 0;
    while (common < n && common < s->n_tokens && s->tokens[common] == ids[common]) common++;
    /* The logits after the prefix must be recomputed, so re-evaluate at least one token. */
    if (common == n && n > 0 && (common < s->n_tokens || !s->have_logits)) common = n - 1;
    s->n_tokens = common;
    s->have_logits = 0;
    double t0 = now_seconds();
    int rc = eval_tokens(s, ids + common, n - common);
    if (stats) {
        stats->n_prompt = n - common;
        stats->prefill_seconds = now_seconds() - t0;
    }
    return rc;
}

/* Text held back because it might be the start of a stop string. */
typedef struct {
    char *buf;
    size_t len, cap;
} text_buf;

static int text_append(text_buf *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *b = realloc(t->buf, cap);
        if (!b) return qlm_errorf("out of memory");
        t->buf = b;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = 0;
    return 0;
}

/* Length of the longest suffix of text that is a proper prefix of some stop string. */
static size_t held_suffix(const char *text, size_t len, const qlm_gen_params *p) {
    size_t best = 0;
    for (int i = 0; i < p->n_stop; i++) {
        size_t sl = strlen(p->stop[i]);
        for (size_t k = sl > len ? len : sl - 1; k > best; k--)
            if (memcmp(text + len - k, p->stop[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

/* Emits what is safe to emit; returns 1 when a stop string was found. */
static int flush_text(text_buf *t, const qlm_gen_params *p, qlm_emit_fn emit, void *user, int final, int *caller_stop) {
    size_t cut = t->len;
    int found = 0;
    for (int i = 0; i < p->n_stop; i++) {
        if (!p->stop[i][0]) continue;
        char *hit = strstr(t->buf ? t->buf : "", p->stop[i]);
        if (hit && (size_t)(hit - t->buf) < cut) {
            cut = (size_t)(hit - t->buf);
            found = 1;
        }
    }
    size_t out = found || final ? cut : t->len - held_suffix(t->buf, t->len, p);
    if (out > 0 && emit && emit(user, t->buf, out) != 0) *caller_stop = 1;
    if (out > 0) memmove(t->buf, t->buf + out, t->len - out);
    t->len -= out;
    if (t->buf) t->buf[t->len] = 0;
    return found;
}

int qlm_session_generate(qlm_session *s, const qlm_gen_params *p, qlm_emit_fn emit, void *user,
                         qlm_gen_stats *stats) {
    int vocab = s->t5 ? s->t5->cfg.vocab_size : s->model->cfg.vocab_size;
    qlm_gen_stats local = {0};
    if (!stats) stats = &local;
    stats->n_generated = 0;
    stats->reason = QLM_STOP_LENGTH;
    if (!s->have_logits) return qlm_errorf("nothing to continue from: evaluate a prompt first");
    qlm_sampler sampler;
    if (qlm_sampler_init(&sampler, &p->sampling, vocab) != 0) return -1;
    text_buf text = {0};
    /* T5's decoder-start token is no text: the first piece starts the output, as after BOS. */
    int rc = 0, caller_stop = 0;
    int prev = s->n_tokens && !(s->t5 && s->n_tokens == 1) ? s->tokens[s->n_tokens - 1] : -1;
    double t0 = now_seconds();
    for (int i = 0; i < p->max_new_tokens; i++) {
        int id = qlm_sampler_sample(&sampler, s->logits, s->tokens, s->n_tokens);
        if (s->tok && qlm_tokenizer_is_eog(s->tok, id)) {
            stats->reason = QLM_STOP_EOS;
            break;
        }
        if (p->out_ids) p->out_ids[stats->n_generated] = id;
        stats->n_generated++;
        if (s->tok) {
            char piece[256];
            int len = qlm_tokenizer_piece(s->tok, prev, id, piece, sizeof piece);
            if (len > 0 && text_append(&text, piece, (size_t)len) != 0) {
                rc = -1;
                break;
            }
            if (flush_text(&text, p, emit, user, 0, &caller_stop)) {
                stats->reason = QLM_STOP_STRING;
                break;
            }
        }
        if (caller_stop) {
            stats->reason = QLM_STOP_CALLER;
            break;
        }
        prev = id;
        if (i + 1 == p->max_new_tokens) break;
        if (s->n_tokens >= capacity(s)) {
            stats->reason = QLM_STOP_CONTEXT;
            break;
        }
        if (eval_tokens(s, &id, 1) != 0) {
            rc = -1;
            break;
        }
    }
    if (rc == 0 && stats->reason != QLM_STOP_STRING) flush_text(&text, p, emit, user, 1, &caller_stop);
    stats->decode_seconds = now_seconds() - t0;
    free(text.buf);
    qlm_sampler_free(&sampler);
    return rc;
}
