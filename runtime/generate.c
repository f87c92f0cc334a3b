#include "generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/clock.h"
#include "../core/error.h"
#include "token_stream.h"


const char *qlm_stop_reason_name(qlm_stop_reason r) {
    static const char *names[] = {"eos", "stop", "length", "context", "caller", "complete"};
    return names[r];
}

int qlm_session_init(qlm_session *s, const qlm_model *m, const qlm_tokenizer *tok, int ctx, int max_batch) {
    memset(s, 0, sizeof *s);
    s->model = m;
    s->tok = tok;
    if (ctx > qlm_llama_positions(&m->cfg)) ctx = qlm_llama_positions(&m->cfg);
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

void qlm_session_set_adapter(qlm_session *s, const struct qlm_lora_adapter *a) {
    qlm_lora_slots *l = s->t5 ? &s->t5_state.lora : &s->state.lora;
    if (l->slot[0] == a) return;
    qlm_lora_slots_set(l, 0, a);
    s->n_tokens = 0;
    s->n_input = 0;
    s->have_logits = 0;
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
    double t0 = qlm_now_s();
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
        stats->prefill_seconds = qlm_now_s() - t0;
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
    common = qlm_state_resumable(s->model, &s->state, s->n_tokens, common);
    s->n_tokens = common;
    s->have_logits = 0;
    double t0 = qlm_now_s();
    int rc = eval_tokens(s, ids + common, n - common);
    if (stats) {
        stats->n_prompt = n - common;
        stats->prefill_seconds = qlm_now_s() - t0;
    }
    return rc;
}

int qlm_session_generate(qlm_session *s, const qlm_gen_params *p, qlm_emit_fn emit, void *user,
                         qlm_gen_stats *stats) {
    int vocab = s->t5 ? s->t5->cfg.vocab_size : s->model->cfg.vocab_size;
    qlm_gen_stats local = {0};
    if (!stats) stats = &local;
    if (!s->have_logits) return qlm_errorf("nothing to continue from: evaluate a prompt first");
    /* T5's decoder-start token is no text: the first piece starts the output, as after BOS. */
    int prev = s->n_tokens && !(s->t5 && s->n_tokens == 1) ? s->tokens[s->n_tokens - 1] : -1;
    qlm_token_stream ts;
    if (qlm_token_stream_init(&ts, s->tok, p, vocab, prev, emit, user, stats) != 0) return -1;
    int rc = 0, id;
    double t0 = qlm_now_s();
    while ((rc = qlm_token_stream_next(&ts, s->logits, s->tokens, s->n_tokens, &id)) == 0) {
        if (s->n_tokens >= capacity(s)) {
            stats->reason = QLM_STOP_CONTEXT;
            break;
        }
        if (eval_tokens(s, &id, 1) != 0) {
            rc = -1;
            break;
        }
    }
    qlm_token_stream_finish(&ts);
    stats->decode_seconds = qlm_now_s() - t0;
    return rc < 0 ? -1 : 0;
}
