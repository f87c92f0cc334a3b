/* Training data: JSONL lines to (ids, target mask) examples, the eval split, the seeded epoch order
 * with its cursor, and packing. See data.h for the formats and rules. */
#include "data.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/chat.h"
#include "../core/error.h"
#include "../tokenizer/tokenizer.h"
#include "../runtime/summary_prompt.h"
#include "../loaders/json_strict.h"

/* ---- PRNG: splitmix64 (pure 64-bit integer arithmetic, the same on every platform) ---- */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ULL;
    return mix64(*s);
}

/* Uniform in [0, bound) without modulo bias (rejection). */
static uint64_t rng_below(uint64_t *s, uint64_t bound) {
    uint64_t limit = (UINT64_MAX / bound) * bound, x;
    do x = rng_next(s);
    while (x >= limit);
    return x % bound;
}

void qlm_train_order(int n, uint64_t seed, int epoch, int *perm) {
    uint64_t s = mix64(seed) ^ mix64((uint64_t)(uint32_t)epoch + 0x632be59bd9b4e019ULL);
    for (int i = 0; i < n; i++) perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(&s, (uint64_t)i + 1);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

/* ---- input checks ---- */

/* ---- tokenization context ---- */

typedef struct {
    const qlm_tokenizer *tok;
    const qlm_train_data_options *o;
    const char *tmpl;          /* template mode: the prompt template */
    const qlm_jinja *chat_template; /* the tokenizer's template, parsed once (NULL: plain fallback) */
    const char *bos_s, *eos_s; /* BOS/EOS strings for the chat renderer */
    int bos, eos, add_bos;
    int space_prefix; /* SPM-style: encoding prepends "▁" to the text */
} ctx;

/* Text from the data: control tokens written in it stay text. */
static int encode(const ctx *c, const char *text, int **ids, int *n) {
    return qlm_tokenizer_encode(c->tok, text, strlen(text), 0, 0, ids, n);
}

/* One example under construction. */
typedef struct {
    int *ids;
    unsigned char *tg;
    int len, cap;
} buf;

static int buf_push(buf *b, const int *ids, int n, int target) {
    if (n == 0) return 0;
    if (b->len + n > b->cap) {
        int cap = (b->len + n) * 2 + 16;
        int *i = realloc(b->ids, (size_t)cap * sizeof *i);
        if (i) b->ids = i;
        unsigned char *t = realloc(b->tg, (size_t)cap);
        if (t) b->tg = t;
        if (!i || !t) return qlm_errorf("out of memory");
        b->cap = cap;
    }
    memcpy(b->ids + b->len, ids, (size_t)n * sizeof *ids);
    memset(b->tg + b->len, target ? 1 : 0, (size_t)n);
    b->len += n;
    return 0;
}

/* [BOS] + encode(prompt) + encode(completion) + [EOS]; targets: completion and EOS. */
static int prompt_completion(const ctx *c, const char *prompt, const char *completion, buf *b) {
    if (c->space_prefix && completion[0] == ' ') completion++; /* the "▁" prefix stands for it */
    int *p = NULL, *q = NULL, np = 0, nq = 0, rc = 0;
    if (c->add_bos && buf_push(b, &c->bos, 1, 0) != 0) return -1;
    if (encode(c, prompt, &p, &np) != 0 || encode(c, completion, &q, &nq) != 0) rc = -1;
    if (rc == 0) rc = buf_push(b, p, np, 0);
    if (rc == 0) rc = buf_push(b, q, nq, 1);
    if (rc == 0 && c->eos >= 0) rc = buf_push(b, &c->eos, 1, 1);
    free(p);
    free(q);
    return rc;
}

static int common_prefix(const int *a, int na, const int *b, int nb) {
    int k = 0;
    while (k < na && k < nb && a[k] == b[k]) k++;
    return k;
}

/* render(m[0..n), gen), checked to be a prefix of full; its tokens into *ids. */
static int render_prefix(const ctx *c, const qlm_chat_message *m, int n, int gen, const char *full, int **ids,
                         int *n_ids) {
    qlm_marked_text text;
    if (qlm_chat_render_parsed(c->chat_template, m, n, gen, c->bos_s, c->eos_s, NULL, &text) != 0) return -1;
    int rc = 0;
    if (strncmp(text.text, full, text.len) != 0)
        rc = qlm_errorf("the chat template does not render the conversation up to message %d as a prefix of "
                        "the whole conversation, so the assistant span cannot be found",
                        n);
    else rc = qlm_tokenizer_encode_marked(c->tok, &text, 0, ids, n_ids);
    qlm_marked_free(&text);
    return rc;
}

/* The conversation rendered and encoded (what the messages say is never read as control tokens);
 * targets as described in data.h. */
static int chat_example(const ctx *c, const qlm_chat_message *m, int n, buf *b) {
    qlm_marked_text full;
    int *f = NULL, nf = 0;
    if (qlm_chat_render_parsed(c->chat_template, m, n, 0, c->bos_s, c->eos_s, NULL, &full) != 0) return -1;
    int rc = qlm_tokenizer_encode_marked(c->tok, &full, 0, &f, &nf);
    if (rc == 0) rc = buf_push(b, f, nf, 0);
    for (int i = 0; i < n && rc == 0; i++) {
        if (strcmp(m[i].role, "assistant") != 0) continue;
        int *a = NULL, *e = NULL, na = 0, ne = 0;
        rc = render_prefix(c, m, i, 1, full.text, &a, &na);
        if (rc == 0) rc = render_prefix(c, m, i + 1, 0, full.text, &e, &ne);
        if (rc == 0) {
            int start = common_prefix(a, na, f, nf); /* < na: the straddling token is a target */
            int end = common_prefix(e, ne, f, nf);
            if (end < ne && end < nf) end++; /* the token that straddles the end of the turn */
            for (int t = start; t < end; t++) b->tg[t] = 1;
        }
        free(a);
        free(e);
    }
    qlm_marked_free(&full);
    free(f);
    return rc;
}

static int is_name_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

/* The template with each {name} replaced by rec's string field name. */
static char *fill_template(const char *tmpl, const cJSON *rec) {
    size_t cap = strlen(tmpl) + 64, len = 0;
    char *out = malloc(cap);
    if (!out) {
        qlm_errorf("out of memory");
        return NULL;
    }
    for (const char *p = tmpl; *p;) {
        const char *piece = p, *close = NULL;
        size_t n = 1;
        if (*p == '{') {
            const char *q = p + 1;
            while (is_name_char(*q)) q++;
            if (*q == '}' && q > p + 1) close = q;
        }
        if (close) {
            char name[128];
            size_t nl = (size_t)(close - p - 1);
            if (nl >= sizeof name) nl = sizeof name - 1;
            memcpy(name, p + 1, nl);
            name[nl] = 0;
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, name);
            if (!v || !cJSON_IsString(v)) {
                qlm_errorf(v ? "field \"%s\" (a prompt template placeholder) is not a string"
                             : "missing field \"%s\" (a prompt template placeholder)",
                           name);
                free(out);
                return NULL;
            }
            piece = v->valuestring;
            n = strlen(piece);
            p = close + 1;
        } else {
            p++;
        }
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *o = realloc(out, cap);
            if (!o) {
                free(out);
                qlm_errorf("out of memory");
                return NULL;
            }
            out = o;
        }
        memcpy(out + len, piece, n);
        len += n;
    }
    out[len] = 0;
    return out;
}

static const char *string_field(const cJSON *rec, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, name);
    if (!v) qlm_errorf("missing field \"%s\"", name);
    else if (!cJSON_IsString(v)) qlm_errorf("field \"%s\" is not a string", name);
    return v && cJSON_IsString(v) ? v->valuestring : NULL;
}

static int messages_record(const ctx *c, const cJSON *msgs, buf *b) {
    if (!cJSON_IsArray(msgs)) return qlm_errorf("field \"messages\" is not an array");
    int n = cJSON_GetArraySize(msgs), n_assistant = 0, i = 0;
    if (n == 0) return qlm_errorf("\"messages\" is empty");
    qlm_chat_message *m = calloc((size_t)n, sizeof *m);
    if (!m) return qlm_errorf("out of memory");
    const cJSON *it;
    int rc = 0;
    cJSON_ArrayForEach(it, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsObject(it)) rc = qlm_errorf("messages[%d] is not an object", i);
        else if (!role || !cJSON_IsString(role)) rc = qlm_errorf("messages[%d]: \"role\" is missing or not a string", i);
        else if (strcmp(role->valuestring, "system") != 0 && strcmp(role->valuestring, "user") != 0 &&
                 strcmp(role->valuestring, "assistant") != 0)
            rc = qlm_errorf("messages[%d]: role \"%.40s\" is not system, user or assistant", i, role->valuestring);
        else if (!content || !cJSON_IsString(content))
            rc = qlm_errorf("messages[%d]: \"content\" is missing or not a string", i);
        if (rc != 0) break;
        m[i].role = role->valuestring;
        m[i].content = content->valuestring;
        n_assistant += strcmp(m[i].role, "assistant") == 0;
        i++;
    }
    if (rc == 0 && n_assistant == 0) rc = qlm_errorf("\"messages\" has no assistant message");
    if (rc == 0) rc = chat_example(c, m, n, b);
    free(m);
    return rc;
}

/* One parsed line into b (ids and mask, before truncation). */
static int record_example(const ctx *c, const cJSON *rec, buf *b) {
    if (!cJSON_IsObject(rec)) return qlm_errorf("expected a JSON object");
    if (c->o->target_field) {
        const char *target = string_field(rec, c->o->target_field);
        if (!target) return -1;
        char *prompt = fill_template(c->tmpl, rec);
        if (!prompt) return -1;
        int rc;
        if (c->o->chat) {
            qlm_chat_message m[2] = {{"user", prompt}, {"assistant", target}};
            rc = chat_example(c, m, 2, b);
        } else {
            rc = prompt_completion(c, prompt, target, b);
        }
        free(prompt);
        return rc;
    }
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(rec, "messages");
    int has_pc = cJSON_GetObjectItemCaseSensitive(rec, "prompt") || cJSON_GetObjectItemCaseSensitive(rec, "completion");
    if (msgs && has_pc) return qlm_errorf("has both \"messages\" and \"prompt\"/\"completion\"");
    if (msgs) return messages_record(c, msgs, b);
    if (!has_pc) return qlm_errorf("expected \"prompt\" and \"completion\" fields, or \"messages\"");
    const char *prompt = string_field(rec, "prompt");
    const char *completion = prompt ? string_field(rec, "completion") : NULL;
    if (!completion) return -1;
    return prompt_completion(c, prompt, completion, b);
}

/* Fits the example into seq_len (data.h); returns 1 if it was truncated. */
static int truncate_example(buf *b, int seq_len, int bos) {
    if (b->len <= seq_len) return 0;
    int first = 1;
    while (first < b->len && !b->tg[first]) first++;
    int head = bos >= 0 && b->ids[0] == bos ? 1 : 0;
    int removable = first - 1, excess = b->len - seq_len;
    int r = excess < removable ? excess : removable;
    if (r > 0) {
        memmove(b->ids + head, b->ids + head + r, (size_t)(b->len - head - r) * sizeof *b->ids);
        memmove(b->tg + head, b->tg + head + r, (size_t)(b->len - head - r));
        b->len -= r;
    }
    if (b->len > seq_len) b->len = seq_len;
    return 1;
}

static void set_add_totals(qlm_train_set *s) {
    s->total_tokens = s->target_tokens = 0;
    s->n_truncated = 0;
    for (int i = 0; i < s->n; i++) {
        s->total_tokens += s->ex[i].len;
        s->target_tokens += s->ex[i].n_targets;
        s->n_truncated += s->ex[i].truncated;
    }
}

void qlm_train_set_free(qlm_train_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        free(s->ex[i].ids);
        free(s->ex[i].target);
    }
    free(s->ex);
    memset(s, 0, sizeof *s);
}

/* Adds the finished example in b to s (taking b's buffers) or counts it as skipped. */
static int set_take(qlm_train_set *s, int *cap, buf *b, int line, int seq_len, int bos) {
    if (b->len > 0) b->tg[0] = 0;
    int truncated = truncate_example(b, seq_len, bos), n_targets = 0;
    for (int t = 0; t < b->len; t++) n_targets += b->tg[t];
    if (n_targets == 0) {
        s->n_skipped++;
        b->len = 0;
        return 0;
    }
    if (s->n == *cap) {
        int nc = *cap ? *cap * 2 : 256;
        qlm_train_example *e = realloc(s->ex, (size_t)nc * sizeof *e);
        if (!e) return qlm_errorf("out of memory");
        s->ex = e;
        *cap = nc;
    }
    /* shrink to fit: the set may hold many examples */
    int *ids = realloc(b->ids, (size_t)b->len * sizeof *ids);
    unsigned char *tg = realloc(b->tg, (size_t)b->len);
    if (ids) b->ids = ids;
    if (tg) b->tg = tg;
    s->ex[s->n++] = (qlm_train_example){b->ids, b->tg, b->len, n_targets, line, truncated};
    memset(b, 0, sizeof *b);
    return 0;
}

static int load_file(qlm_train_set *s, const char *path, const ctx *c) {
    FILE *f = fopen(path, "rb");
    if (!f) return qlm_errorf("%s: cannot open", path);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    int rc = 0, cap = 0, lineno = 0, n_lines = 0;
    buf b = {0};
    while (rc == 0 && (got = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        size_t len = (size_t)got;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        line[len] = 0;
        const char *q = line;
        while (*q == ' ' || *q == '\t') q++;
        if (memchr(line, 0, len)) rc = qlm_errorf("line holds a NUL byte");
        else if (!*q) continue;
        n_lines++;
        if (rc == 0) {
            cJSON *rec = qlm_json_parse_strict(line, len);
            if (!rec) {
                rc = -1;
            } else {
                b.len = 0;
                rc = record_example(c, rec, &b);
                cJSON_Delete(rec);
                if (rc == 0) rc = set_take(s, &cap, &b, lineno, c->o->seq_len, c->bos);
            }
        }
        if (rc != 0) qlm_error_context("%s:%d", path, lineno);
    }
    if (rc == 0 && ferror(f)) rc = qlm_errorf("%s: read error", path);
    free(line);
    free(b.ids);
    free(b.tg);
    fclose(f);
    if (rc == 0 && n_lines == 0) rc = qlm_errorf("%s: no examples (the file is empty)", path);
    if (rc == 0 && s->n == 0)
        rc = qlm_errorf("%s: none of its %d examples has target tokens (all skipped)", path, s->n_skipped);
    if (rc == 0) set_add_totals(s);
    return rc;
}

/* Moves the examples marked in is_eval from train into eval, both keeping file order. */
static int split(qlm_train_set *train, qlm_train_set *eval, const unsigned char *is_eval, int n_eval) {
    int n = train->n;
    eval->ex = malloc((size_t)n_eval * sizeof *eval->ex);
    if (!eval->ex) return qlm_errorf("out of memory");
    int kt = 0;
    for (int i = 0; i < n; i++) {
        if (is_eval[i]) eval->ex[eval->n++] = train->ex[i];
        else train->ex[kt++] = train->ex[i];
    }
    train->n = kt;
    set_add_totals(train);
    set_add_totals(eval);
    return 0;
}

int qlm_train_data_load(qlm_train_set *train, qlm_train_set *eval, const char *path, const char *eval_path,
                        const qlm_tokenizer *tok, const qlm_train_data_options *o) {
    memset(train, 0, sizeof *train);
    if (eval) memset(eval, 0, sizeof *eval);
    if (!path || !tok || !o) return qlm_errorf("train data: invalid arguments");
    if (o->seq_len < 2) return qlm_errorf("train data: seq_len %d is below 2", o->seq_len);
    if (!(o->eval_fraction >= 0 && o->eval_fraction <= 0.5))
        return qlm_errorf("train data: eval fraction %g is outside 0..0.5", o->eval_fraction);
    ctx c = {.tok = tok, .o = o, .tmpl = o->prompt_template ? o->prompt_template : QLM_SUMMARY_TEMPLATE};
    c.bos = qlm_tokenizer_bos(tok);
    c.eos = qlm_tokenizer_eos(tok);
    c.bos_s = c.bos >= 0 ? qlm_tokenizer_token(tok, c.bos) : "";
    c.eos_s = c.eos >= 0 ? qlm_tokenizer_token(tok, c.eos) : "";
    /* Whether the tokenizer adds BOS: what encoding empty text with special tokens gives. */
    int *probe = NULL, n_probe = 0;
    if (qlm_tokenizer_encode(tok, "", 0, 1, 0, &probe, &n_probe) != 0) return -1;
    c.add_bos = c.bos >= 0 && n_probe > 0 && probe[0] == c.bos;
    free(probe);
    /* Whether encoding prepends "▁" (SentencePiece-style space prefix): how "a" encodes. */
    if (qlm_tokenizer_encode(tok, "a", 1, 0, 0, &probe, &n_probe) != 0) return -1;
    const char *first = n_probe > 0 ? qlm_tokenizer_token(tok, probe[0]) : NULL;
    c.space_prefix = first && strncmp(first, "\xe2\x96\x81", 3) == 0;
    free(probe);
    const char *tmpl = qlm_tokenizer_chat_template(tok);
    qlm_jinja *parsed = NULL;
    if (tmpl && qlm_jinja_parse(tmpl, strlen(tmpl), &parsed) != 0) return -1;
    c.chat_template = parsed;

    int rc = load_file(train, path, &c);
    if (rc == 0 && eval && eval_path) {
        rc = load_file(eval, eval_path, &c);
    } else if (rc == 0 && eval && o->eval_fraction > 0) {
        int n = train->n, n_eval = (int)llround(n * o->eval_fraction);
        if (n_eval < 1) n_eval = 1;
        if (n_eval >= n) {
            rc = qlm_errorf("%s: %d examples are too few to split off an eval fraction of %g", path, n,
                            o->eval_fraction);
        } else {
            int *perm = malloc((size_t)n * sizeof *perm);
            unsigned char *is_eval = calloc((size_t)n, 1);
            if (!perm || !is_eval) rc = qlm_errorf("out of memory");
            if (rc == 0) {
                qlm_train_order(n, o->seed, -1, perm);
                for (int k = n - n_eval; k < n; k++) is_eval[perm[k]] = 1;
                rc = split(train, eval, is_eval, n_eval);
            }
            free(perm);
            free(is_eval);
        }
    }
    qlm_jinja_free(parsed);
    if (rc != 0) {
        qlm_train_set_free(train);
        if (eval) qlm_train_set_free(eval);
    }
    return rc;
}

/* ---- order and cursor ---- */

static int cursor_check(qlm_train_cursor *c, int n) {
    if (n < 1) return qlm_errorf("train order: the set is empty");
    if (c->epoch < 0 || c->index < 0 || c->index > n)
        return qlm_errorf("train order: cursor (epoch %d, index %d) is invalid for %d examples", c->epoch, c->index, n);
    if (c->index == n) {
        c->epoch++;
        c->index = 0;
    }
    return 0;
}

int qlm_train_next_batch(qlm_train_cursor *c, int n, int B, int *idx) {
    if (B < 1) return qlm_errorf("train order: batch size %d is below 1", B);
    if (cursor_check(c, n) != 0) return -1;
    int *perm = malloc((size_t)n * sizeof *perm);
    if (!perm) return qlm_errorf("out of memory");
    qlm_train_order(n, c->seed, c->epoch, perm);
    for (int k = 0; k < B; k++) {
        if (c->index == n) {
            c->epoch++;
            c->index = 0;
            qlm_train_order(n, c->seed, c->epoch, perm);
        }
        idx[k] = perm[c->index++];
    }
    cursor_check(c, n);
    free(perm);
    return 0;
}

/* Packs from perm starting at *index (every example fits seq_len); returns the length. */
static int pack_one(const qlm_train_set *s, const int *perm, int *index, int seq_len, int *ids, unsigned char *target,
                    int *n_examples) {
    int len = 0, k = 0;
    while (*index < s->n) {
        const qlm_train_example *e = &s->ex[perm[*index]];
        if (len + e->len > seq_len) break;
        if (ids) memcpy(ids + len, e->ids, (size_t)e->len * sizeof *ids);
        if (target) memcpy(target + len, e->target, (size_t)e->len);
        len += e->len;
        k++;
        (*index)++;
    }
    if (n_examples) *n_examples = k;
    return len;
}

/* Every example must fit seq_len, so packing never stalls on one. */
static int pack_check(const qlm_train_set *s, int seq_len) {
    if (s->n < 1) return qlm_errorf("train packing: the set is empty");
    for (int i = 0; i < s->n; i++)
        if (s->ex[i].len > seq_len)
            return qlm_errorf("train packing: the example from line %d has %d tokens, more than seq_len %d",
                              s->ex[i].line, s->ex[i].len, seq_len);
    return 0;
}

int qlm_train_next_packed(qlm_train_cursor *c, const qlm_train_set *s, int seq_len, int *ids, unsigned char *target,
                          int *n_examples) {
    if (pack_check(s, seq_len) != 0 || cursor_check(c, s->n) != 0) return -1;
    int *perm = malloc((size_t)s->n * sizeof *perm);
    if (!perm) return qlm_errorf("out of memory");
    qlm_train_order(s->n, c->seed, c->epoch, perm);
    int index = c->index;
    int len = pack_one(s, perm, &index, seq_len, ids, target, n_examples);
    free(perm);
    c->index = index;
    cursor_check(c, s->n);
    return len;
}

int qlm_train_packed_count(const qlm_train_set *s, uint64_t seed, int epoch, int seq_len) {
    if (pack_check(s, seq_len) != 0) return -1;
    int *perm = malloc((size_t)s->n * sizeof *perm);
    if (!perm) return qlm_errorf("out of memory");
    qlm_train_order(s->n, seed, epoch, perm);
    int index = 0, count = 0;
    while (index < s->n) {
        pack_one(s, perm, &index, seq_len, NULL, NULL, NULL);
        count++;
    }
    free(perm);
    return count;
}
