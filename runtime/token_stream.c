#include "token_stream.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "../tokenizer/tokenizer_internal.h"
#include "json_constraint.h"

static int hold(qlm_token_stream *ts, const char *s, size_t n) {
    if (ts->len + n + 1 > ts->cap) {
        size_t cap = (ts->len + n + 1) * 2;
        char *b = realloc(ts->held, cap);
        if (!b) return qlm_errorf("out of memory");
        ts->held = b;
        ts->cap = cap;
    }
    memcpy(ts->held + ts->len, s, n);
    ts->len += n;
    ts->held[ts->len] = 0;
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

/* Passes n bytes to the callback as valid UTF-8: a byte that starts no valid sequence (a byte
 * token the model produced out of place) becomes U+FFFD, as decoders do. */
static int emit_utf8(qlm_token_stream *ts, const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    size_t run = 0, i = 0;
    while (i < n) {
        int len = s[i] < 0x80 ? 1 : tok_utf8_len(s + i, n - i);
        if (s[i] < 0x80 || len > 1) {
            i += (size_t)len;
            continue;
        }
        if ((i > run && ts->emit(ts->user, text + run, i - run) != 0) || ts->emit(ts->user, "\xEF\xBF\xBD", 3) != 0)
            return 1;
        run = ++i;
    }
    return i > run && ts->emit(ts->user, text + run, i - run) != 0;
}

/* Emits what is safe to emit; returns 1 when a stop string was found. */
static int flush(qlm_token_stream *ts, int final) {
    const qlm_gen_params *p = ts->p;
    size_t cut = ts->len;
    int found = 0;
    for (int i = 0; i < p->n_stop; i++) {
        if (!p->stop[i][0]) continue;
        char *hit = strstr(ts->held ? ts->held : "", p->stop[i]);
        if (hit && (size_t)(hit - ts->held) < cut) {
            cut = (size_t)(hit - ts->held);
            found = 1;
        }
    }
    size_t out = found || final ? cut : ts->len - held_suffix(ts->held, ts->len, p);
    /* A multi-byte character split across tokens waits for its last byte. */
    if (!found && !final) out -= tok_utf8_partial_tail((const unsigned char *)ts->held, out);
    if (out > 0 && ts->emit && emit_utf8(ts, ts->held, out) != 0) ts->caller_stop = 1;
    if (out > 0) memmove(ts->held, ts->held + out, ts->len - out);
    ts->len -= out;
    if (ts->held) ts->held[ts->len] = 0;
    return found;
}

static void release(qlm_token_stream *ts) {
    free(ts->held);
    free(ts->raw);
    qlm_json_matcher_free(ts->json);
    ts->held = NULL;
    ts->raw = NULL;
    ts->json = NULL;
}

int qlm_token_stream_init(qlm_token_stream *ts, const qlm_tokenizer *tok, const qlm_gen_params *p, int vocab, int prev,
                          qlm_emit_fn emit, void *user, qlm_gen_stats *stats) {
    memset(ts, 0, sizeof *ts);
    ts->tok = tok;
    ts->p = p;
    ts->emit = emit;
    ts->user = user;
    ts->stats = stats;
    ts->prev = prev;
    stats->n_generated = 0;
    stats->reason = QLM_STOP_LENGTH;
    stats->constraint_seconds = 0;
    ts->vocab = vocab;
    if (p->json && (!tok || !p->json_vocab)) return qlm_errorf("JSON output needs the tokenizer and its token index");
    if (p->on_logprob && !(ts->raw = malloc((size_t)vocab * sizeof *ts->raw))) return qlm_errorf("out of memory");
    if ((p->json && !(ts->json = qlm_json_matcher_new(p->json, p->json_vocab))) ||
        qlm_sampler_init(&ts->sampler, &p->sampling, vocab) != 0) {
        release(ts);
        return -1;
    }
    return 0;
}

int qlm_logprobs(const float *logits, int vocab, int id, int n_top, qlm_token_logprob *chosen, qlm_token_logprob *top) {
    const float *x = logits;
    int n = vocab, k = n_top < 0 ? 0 : n_top;
    if (k > QLM_MAX_TOP_LOGPROBS) k = QLM_MAX_TOP_LOGPROBS;
    if (k > n) k = n;
    float max = x[0];
    for (int i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - max);
    double lse = max + log(sum);
    /* The k largest by insertion into a sorted list (k <= 20); ties keep the lower id first. */
    int have = 0;
    for (int i = 0; i < n && k > 0; i++) {
        if (have == k && x[i] <= x[top[k - 1].id]) continue;
        int at = have < k ? have++ : k - 1;
        while (at > 0 && x[top[at - 1].id] < x[i]) {
            top[at] = top[at - 1];
            at--;
        }
        top[at].id = i;
    }
    for (int i = 0; i < have; i++) top[i].logprob = (float)(x[top[i].id] - lse);
    *chosen = (qlm_token_logprob){id, (float)(x[id] - lse)};
    return have;
}

/* The chosen token's log-probability and the most likely ones', from the raw logits. */
static void report_logprobs(const qlm_token_stream *ts, int id) {
    qlm_token_logprob chosen, top[QLM_MAX_TOP_LOGPROBS];
    int have = qlm_logprobs(ts->raw, ts->vocab, id, ts->p->top_logprobs, &chosen, top);
    ts->p->on_logprob(ts->p->logprob_user, chosen, top, have);
}

/* Masks the tokens that would leave the JSON value; after the raw copy, so that log-probabilities
 * stay the model's own. */
static int constrain(qlm_token_stream *ts, float *logits) {
    double t0 = qlm_now_s();
    int rc = qlm_json_matcher_mask(ts->json, logits, ts->vocab);
    ts->stats->constraint_seconds += qlm_now_s() - t0;
    return rc;
}

int qlm_token_stream_next(qlm_token_stream *ts, float *logits, const int *history, int n_history, int *id) {
    qlm_gen_stats *st = ts->stats;
    if (st->n_generated >= ts->p->max_new_tokens) return 1;
    if (ts->raw) memcpy(ts->raw, logits, (size_t)ts->vocab * sizeof *ts->raw);
    if (ts->json && constrain(ts, logits) != 0) return -1;
    *id = qlm_sampler_sample(&ts->sampler, logits, history, n_history, st->n_generated);
    if (ts->tok && qlm_tokenizer_is_eog(ts->tok, *id)) {
        st->reason = QLM_STOP_EOS;
        return 1;
    }
    if (ts->raw) report_logprobs(ts, *id);
    if (ts->p->out_ids) ts->p->out_ids[st->n_generated] = *id;
    st->n_generated++;
    if (ts->tok) {
        char piece[256];
        int len = qlm_tokenizer_piece(ts->tok, ts->prev, *id, piece, sizeof piece);
        /* The mask let only tokens through whose bytes continue the value (a first piece that
         * drops its leading space continues it too: whitespace may start the document). */
        if (ts->json && qlm_json_matcher_feed(ts->json, piece, len > 0 ? (size_t)len : 0) != 0)
            return qlm_errorf("JSON output: token %d does not continue the value", *id);
        if (len > 0 && hold(ts, piece, (size_t)len) != 0) return -1;
        if (flush(ts, 0)) {
            st->reason = QLM_STOP_STRING;
            return 1;
        }
    }
    if (ts->caller_stop) {
        st->reason = QLM_STOP_CALLER;
        return 1;
    }
    if (ts->json && qlm_json_matcher_done(ts->json)) {
        st->reason = QLM_STOP_COMPLETE;
        return 1;
    }
    ts->prev = *id;
    return st->n_generated >= ts->p->max_new_tokens ? 1 : 0;
}

void qlm_token_stream_finish(qlm_token_stream *ts) {
    if (ts->stats->reason != QLM_STOP_STRING) flush(ts, 1);
    release(ts);
    qlm_sampler_free(&ts->sampler);
}
