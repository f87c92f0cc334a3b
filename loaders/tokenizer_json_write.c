/* Hugging Face tokenizer.json + tokenizer_config.json for any qlm tokenizer, in the pipelines
 * loaders/tokenizer_json.c reads back: SentencePiece-style BPE as the Llama tokenizers write it
 * (Prepend/Replace normalizer or Metaspace, byte fallback, ByteFallback/Fuse/Strip decoder),
 * byte-level BPE with its family's pre-tokenizer, and Unigram as the T5 files have it
 * (Precompiled charsmap + Replace(" {2,}") normalizer, Metaspace, </s> template). A Unigram
 * tokenizer read from a SentencePiece model gets the pipeline transformers' converter gives it,
 * so HF tokenizers keeps a trailing space as "▁" where sentencepiece drops it. Tokenizers that merge by score (llama2.c
 * tokenizer.bin, GGUF "llama") get a merge list derived from the scores the way HF's SentencePiece
 * converter does it: every split of a piece into two vocabulary pieces, ordered by the merged
 * piece's score, then by the ids of the left and right pieces. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../tokenizer/tokenizer_internal.h"
#include "../core/atomic_file.h"

#define SPM_SPACE "\xE2\x96\x81"

/* cJSON building: an allocation failure anywhere sets oom, checked once when the tree is done. */
typedef struct {
    const qlm_tokenizer *t;
    const char *dir;
    int oom;
} writer;

/* Adds item to obj under key (or appends it to the array obj when key is NULL). */
static cJSON *put(writer *w, cJSON *obj, const char *key, cJSON *item) {
    if (item && obj && (key ? cJSON_AddItemToObject(obj, key, item) : cJSON_AddItemToArray(obj, item))) return item;
    cJSON_Delete(item);
    w->oom = 1;
    return NULL;
}

static cJSON *put_str(writer *w, cJSON *obj, const char *key, const char *s) {
    return put(w, obj, key, s ? cJSON_CreateString(s) : cJSON_CreateNull());
}

static void put_bool(writer *w, cJSON *obj, const char *key, int v) { put(w, obj, key, cJSON_CreateBool(v != 0)); }

static void put_int(writer *w, cJSON *obj, const char *key, int v) { put(w, obj, key, cJSON_CreateNumber(v)); }

static cJSON *put_obj(writer *w, cJSON *obj, const char *key) { return put(w, obj, key, cJSON_CreateObject()); }

static cJSON *put_arr(writer *w, cJSON *obj, const char *key) { return put(w, obj, key, cJSON_CreateArray()); }

/* {"type": type} added to obj (appended when key is NULL). */
static cJSON *put_typed(writer *w, cJSON *obj, const char *key, const char *type) {
    cJSON *o = put_obj(w, obj, key);
    put_str(w, o, "type", type);
    return o;
}

static const char *token_or_null(const qlm_tokenizer *t, int id) { return id >= 0 ? tok_str(t, id) : NULL; }

/* encode(add_special) frames the text with BOS / EOS. */
static int adds_bos(const qlm_tokenizer *t) { return t->add_bos && t->bos >= 0; }
static int adds_eos(const qlm_tokenizer *t) { return t->add_eos && t->eos >= 0; }

/* ---- checks: tokenizer.json keys vocabulary strings, and HF reads only UTF-8 ---- */

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        int k = tok_utf8_len((const unsigned char *)s + i, n - i);
        if (k == 1 && (unsigned char)s[i] >= 0x80) return 0;
        i += (size_t)k;
    }
    return 1;
}

static int check_vocab(const writer *w) {
    const qlm_tokenizer *t = w->t;
    int empty = -1;
    for (int id = 0; id < t->n_vocab; id++) {
        if (!valid_utf8(tok_str(t, id), t->len[id]))
            return qlm_errorf("%s/tokenizer.json: token %d is not valid UTF-8, which tokenizer.json cannot hold", w->dir,
                              id);
        int first = empty < 0 ? id : empty;
        if (t->len[id]) first = tok_vocab_find(t, tok_str(t, id), t->len[id]);
        else if (empty < 0) empty = id;
        if (first != id)
            return qlm_errorf("%s/tokenizer.json: token %d \"%.60s\" repeats token %d; a vocabulary map cannot hold both",
                              w->dir, id, tok_str(t, id), first);
    }
    if (t->chat_template && !valid_utf8(t->chat_template, strlen(t->chat_template)))
        return qlm_errorf("%s/tokenizer_config.json: the chat template is not valid UTF-8", w->dir);
    return 0;
}

/* ---- merges ---- */

typedef struct {
    double key; /* merge rank, or minus the merged piece's score */
    int merged, a, b;
} merge_t;

typedef struct {
    merge_t *v;
    size_t n, cap;
} merge_list;

static int merge_push(merge_list *m, merge_t x) {
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 1024;
        merge_t *v = realloc(m->v, sizeof(merge_t) * cap);
        if (!v) return qlm_errorf("tokenizer.json: out of memory for the merges");
        m->v = v, m->cap = cap;
    }
    m->v[m->n++] = x;
    return 0;
}

static int merge_cmp(const void *x, const void *y) {
    const merge_t *p = x, *q = y;
    if (p->key != q->key) return p->key < q->key ? -1 : 1;
    if (p->merged != q->merged) return p->merged < q->merged ? -1 : 1;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return p->b < q->b ? -1 : p->b > q->b;
}

/* The merge table of a tokenizer that merges by rank, in rank order after sorting. */
static int ranked_merges(const qlm_tokenizer *t, merge_list *m) {
    const tok_pairmap *p = &t->merges;
    for (uint64_t h = 0; p->keys && h <= p->mask; h++) {
        if (!p->keys[h]) continue;
        uint64_t k = p->keys[h] - 1;
        merge_t x = {p->rank[h], p->merged[h], (int)(k >> 32), (int)(uint32_t)k};
        if (merge_push(m, x) != 0) return -1;
    }
    return 0;
}

/* The pieces the score-based merge loop may produce (it never merges into control, unknown or
 * byte pieces). */
static int score_mergeable(const qlm_tokenizer *t, int id) {
    int ty = t->types[id];
    return ty == QLM_TOKEN_NORMAL || ty == QLM_TOKEN_USER_DEFINED || ty == QLM_TOKEN_UNUSED;
}

/* Every split of a mergeable piece at a character boundary into two vocabulary pieces. Byte
 * pieces never take part: the score-based loop leaves byte-fallback symbols unmerged. NaN scores
 * sort last. */
static int score_merges(const qlm_tokenizer *t, merge_list *m) {
    for (int id = 0; id < t->n_vocab; id++) {
        if (!score_mergeable(t, id)) continue;
        const char *s = tok_str(t, id);
        size_t n = t->len[id];
        double key = isnan(t->scores[id]) ? INFINITY : -(double)t->scores[id];
        for (size_t k = (size_t)(n ? tok_utf8_len((const unsigned char *)s, n) : 0); k < n;
             k += (size_t)tok_utf8_len((const unsigned char *)s + k, n - k)) {
            int a = tok_vocab_find(t, s, k), b = tok_vocab_find(t, s + k, n - k);
            if (a < 0 || b < 0 || t->types[a] == QLM_TOKEN_BYTE || t->types[b] == QLM_TOKEN_BYTE) continue;
            if (merge_push(m, (merge_t){key, id, a, b}) != 0) return -1;
        }
    }
    return 0;
}

/* "left right" strings, or ["left", "right"] pairs when a piece holds a space (the string form
 * would be ambiguous). tokenizers requires one form for the whole list. */
static void put_merges(writer *w, cJSON *model, const merge_list *m) {
    const qlm_tokenizer *t = w->t;
    int pairs = 0;
    for (size_t i = 0; i < m->n && !pairs; i++)
        pairs = strchr(tok_str(t, m->v[i].a), ' ') || strchr(tok_str(t, m->v[i].b), ' ');
    cJSON *arr = put_arr(w, model, "merges");
    tok_buf buf = {0};
    for (size_t i = 0; i < m->n && !w->oom; i++) {
        const char *a = tok_str(t, m->v[i].a), *b = tok_str(t, m->v[i].b);
        if (pairs) {
            cJSON *pair = put_arr(w, arr, NULL);
            put_str(w, pair, NULL, a);
            put_str(w, pair, NULL, b);
            continue;
        }
        buf.n = 0;
        if (tok_buf_put(&buf, a, strlen(a)) != 0 || tok_buf_put(&buf, " ", 1) != 0 || tok_buf_put(&buf, b, strlen(b)) != 0)
            w->oom = 1;
        else
            put_str(w, arr, NULL, buf.p);
    }
    free(buf.p);
}

/* ---- tokenizer.json sections ---- */

static int is_added(const qlm_tokenizer *t, int id) {
    int ty = t->types[id];
    return t->len[id] > 0 && (ty == QLM_TOKEN_CONTROL || ty == QLM_TOKEN_USER_DEFINED || ty == QLM_TOKEN_UNKNOWN);
}

/* Control and user-defined tokens, and the unknown token, which HF's Llama conversion also lists
 * as a special added token (so "<unk>" in text becomes its id when special tokens are parsed). */
static void put_added_tokens(writer *w, cJSON *root) {
    const qlm_tokenizer *t = w->t;
    unsigned char *normalized = calloc((size_t)t->n_vocab, 1);
    if (!normalized) {
        w->oom = 1;
        return;
    }
    for (int i = 0; i < t->norm_added.n; i++) normalized[t->norm_added.items[i].id] = 1;
    cJSON *arr = put_arr(w, root, "added_tokens");
    for (int id = 0; id < t->n_vocab && !w->oom; id++) {
        if (!is_added(t, id)) continue;
        cJSON *a = put_obj(w, arr, NULL);
        put_int(w, a, "id", id);
        put_str(w, a, "content", tok_str(t, id));
        put_bool(w, a, "single_word", 0);
        put_bool(w, a, "lstrip", 0);
        put_bool(w, a, "rstrip", 0);
        put_bool(w, a, "normalized", normalized[id]);
        put_bool(w, a, "special", t->types[id] != QLM_TOKEN_USER_DEFINED);
    }
    free(normalized);
}

static void put_replace(writer *w, cJSON *parent, const char *from, const char *to) {
    cJSON *r = put_typed(w, parent, NULL, "Replace");
    put_str(w, put_obj(w, r, "pattern"), "String", from);
    put_str(w, r, "content", to);
}

static void put_metaspace(writer *w, cJSON *parent, const char *key, int split) {
    const qlm_tokenizer *t = w->t;
    cJSON *p = put_typed(w, parent, key, "Metaspace");
    put_str(w, p, "replacement", SPM_SPACE);
    put_str(w, p, "prepend_scheme", !t->add_space_prefix ? "never" : t->space_prefix_first ? "first" : "always");
    put_bool(w, p, "split", split);
}

/* The charsmap as padded base64. */
static char *base64(const unsigned char *b, size_t n) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        *o++ = digits[v >> 18];
        *o++ = digits[v >> 12 & 63];
        *o++ = i + 1 < n ? digits[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? digits[v & 63] : '=';
    }
    *o = 0;
    return out;
}

/* Unigram: Precompiled (the charsmap) and Replace(" {2,}", " ") normalizers, then Metaspace. A
 * SentencePiece model's removal of extra spaces becomes the Replace, and its single "▁" prefix
 * a split Metaspace. */
static void put_unigram_pipeline(writer *w, cJSON *root) {
    const tok_unigram *u = w->t->uni;
    int collapse = u->spm_normalizer ? u->remove_extra_spaces : u->collapse_spaces;
    if (!u->map.blob_len && !collapse) {
        put(w, root, "normalizer", cJSON_CreateNull());
    } else {
        cJSON *list = put_arr(w, put_typed(w, root, "normalizer", "Sequence"), "normalizers");
        if (u->map.blob_len) {
            char *b64 = base64(u->map.blob, u->map.blob_len);
            if (!b64) w->oom = 1;
            else put_str(w, put_typed(w, list, NULL, "Precompiled"), "precompiled_charsmap", b64);
            free(b64);
        }
        if (collapse) {
            cJSON *r = put_typed(w, list, NULL, "Replace");
            put_str(w, put_obj(w, r, "pattern"), "Regex", " {2,}");
            put_str(w, r, "content", " ");
        }
    }
    put_metaspace(w, root, "pre_tokenizer", u->spm_normalizer || w->t->split_words);
}

/* SentencePiece "▁" rules: a Prepend/Replace normalizer, or a Metaspace pre-tokenizer. */
static void put_spm_pipeline(writer *w, cJSON *root) {
    const qlm_tokenizer *t = w->t;
    if (t->spm_metaspace) {
        put(w, root, "normalizer", cJSON_CreateNull());
        put_metaspace(w, root, "pre_tokenizer", t->split_words);
        return;
    }
    cJSON *n = put_typed(w, root, "normalizer", "Sequence"), *list = put_arr(w, n, "normalizers");
    if (t->add_space_prefix) put_str(w, put_typed(w, list, NULL, "Prepend"), "prepend", SPM_SPACE);
    put_replace(w, list, " ", SPM_SPACE);
    put(w, root, "pre_tokenizer", cJSON_CreateNull());
}

static void put_byte_level(writer *w, cJSON *parent, const char *key, int use_regex, int trim_offsets) {
    cJSON *b = put_typed(w, parent, key, "ByteLevel");
    put_bool(w, b, "add_prefix_space", 0);
    put_bool(w, b, "trim_offsets", trim_offsets);
    put_bool(w, b, "use_regex", use_regex);
}

/* GPT-2: ByteLevel with its regex; SmolLM: individual digits first; Llama 3 / Qwen2: Split with
 * the family regex, then ByteLevel without one. Qwen2's NFC normalizer is left out because qlm
 * does not apply it. */
static void put_byte_pipeline(writer *w, cJSON *root) {
    const qlm_tokenizer *t = w->t;
    put(w, root, "normalizer", cJSON_CreateNull());
    if (t->pre == QLM_PRE_GPT2) {
        put_byte_level(w, root, "pre_tokenizer", 1, 1);
        return;
    }
    cJSON *seq = put_typed(w, root, "pre_tokenizer", "Sequence"), *list = put_arr(w, seq, "pretokenizers");
    if (t->pre == QLM_PRE_SMOLLM) {
        put_bool(w, put_typed(w, list, NULL, "Digits"), "individual_digits", 1);
        put_byte_level(w, list, NULL, 1, 1);
        return;
    }
    cJSON *split = put_typed(w, list, NULL, "Split");
    put_str(w, put_obj(w, split, "pattern"), "Regex", qlm_pretokenizer_regex(t->pre));
    put_str(w, split, "behavior", "Isolated");
    put_bool(w, split, "invert", 0);
    put_byte_level(w, list, NULL, 0, 1);
}

static void put_template_piece(writer *w, cJSON *list, const char *kind, const char *id, int type_id) {
    cJSON *p = put_obj(w, put_obj(w, list, NULL), kind);
    put_str(w, p, "id", id);
    put_int(w, p, "type_id", type_id);
}

/* [BOS] $A [EOS] as configured; a pair repeats the framing around $B with type id 1. */
static void put_template_seq(writer *w, cJSON *proc, const char *key, int pair) {
    const qlm_tokenizer *t = w->t;
    cJSON *list = put_arr(w, proc, key);
    for (int k = 0; k <= pair; k++) {
        if (adds_bos(t)) put_template_piece(w, list, "SpecialToken", tok_str(t, t->bos), k);
        put_template_piece(w, list, "Sequence", k ? "B" : "A", k);
        if (adds_eos(t)) put_template_piece(w, list, "SpecialToken", tok_str(t, t->eos), k);
    }
}

static void put_special_entry(writer *w, cJSON *specials, int id) {
    const char *s = tok_str(w->t, id);
    if (cJSON_GetObjectItemCaseSensitive(specials, s)) return; /* BOS and EOS may be one token */
    cJSON *e = put_obj(w, specials, s);
    put_str(w, e, "id", s);
    put_int(w, put_arr(w, e, "ids"), NULL, id);
    put_str(w, put_arr(w, e, "tokens"), NULL, s);
}

static void put_template(writer *w, cJSON *parent, const char *key) {
    const qlm_tokenizer *t = w->t;
    cJSON *proc = put_typed(w, parent, key, "TemplateProcessing");
    put_template_seq(w, proc, "single", 0);
    put_template_seq(w, proc, "pair", 1);
    cJSON *specials = put_obj(w, proc, "special_tokens");
    if (adds_bos(t)) put_special_entry(w, specials, t->bos);
    if (adds_eos(t)) put_special_entry(w, specials, t->eos);
}

/* BOS/EOS framing for encode(add_special_tokens=True); byte-level adds HF's ByteLevel step,
 * which only adjusts offsets. */
static void put_post_processor(writer *w, cJSON *root) {
    const qlm_tokenizer *t = w->t;
    int framed = adds_bos(t) || adds_eos(t);
    if (t->type != QLM_TOK_BYTE_BPE) {
        if (framed) put_template(w, root, "post_processor");
        else put(w, root, "post_processor", cJSON_CreateNull());
        return;
    }
    cJSON *parent = root;
    const char *key = "post_processor";
    if (framed) {
        parent = put_arr(w, put_typed(w, root, key, "Sequence"), "processors");
        key = NULL;
    }
    put_byte_level(w, parent, key, 1, 0);
    if (framed) put_template(w, parent, NULL);
}

static void put_decoder(writer *w, cJSON *root) {
    const qlm_tokenizer *t = w->t;
    if (t->type == QLM_TOK_BYTE_BPE) {
        put_byte_level(w, root, "decoder", 1, 1);
        return;
    }
    if (t->type == QLM_TOK_UNIGRAM) {
        put_metaspace(w, root, "decoder", 1);
        return;
    }
    cJSON *list = put_arr(w, put_typed(w, root, "decoder", "Sequence"), "decoders");
    put_replace(w, list, SPM_SPACE, " ");
    if (t->byte_fallback) put_typed(w, list, NULL, "ByteFallback");
    put_typed(w, list, NULL, "Fuse");
    if (t->add_space_prefix) {
        cJSON *s = put_typed(w, list, NULL, "Strip");
        put_str(w, s, "content", " ");
        put_int(w, s, "start", 1);
        put_int(w, s, "stop", 0);
    }
}

/* Unigram: [piece, score] pairs in id order. */
static void put_unigram_model(writer *w, cJSON *root) {
    const qlm_tokenizer *t = w->t;
    cJSON *model = put_typed(w, root, "model", "Unigram");
    put_int(w, model, "unk_id", t->unk);
    cJSON *vocab = put_arr(w, model, "vocab");
    for (int id = 0; id < t->n_vocab && !w->oom; id++) {
        cJSON *pair = put_arr(w, vocab, NULL);
        put_str(w, pair, NULL, tok_str(t, id));
        put(w, pair, NULL, cJSON_CreateNumber(t->uni->scores[id]));
    }
    put_bool(w, model, "byte_fallback", t->byte_fallback);
}

static int put_model(writer *w, cJSON *root) {
    const qlm_tokenizer *t = w->t;
    if (t->type == QLM_TOK_UNIGRAM) {
        put_unigram_model(w, root);
        return 0;
    }
    cJSON *model = put_typed(w, root, "model", "BPE");
    put(w, model, "dropout", cJSON_CreateNull());
    put_str(w, model, "unk_token", token_or_null(t, t->unk));
    put(w, model, "continuing_subword_prefix", cJSON_CreateNull());
    put(w, model, "end_of_word_suffix", cJSON_CreateNull());
    put_bool(w, model, "fuse_unk", t->fuse_unk);
    put_bool(w, model, "byte_fallback", t->type == QLM_TOK_SPM_BPE && t->byte_fallback);
    put_bool(w, model, "ignore_merges", t->ignore_merges);
    cJSON *vocab = put_obj(w, model, "vocab");
    for (int id = 0; id < t->n_vocab && !w->oom; id++) put_int(w, vocab, tok_str(t, id), id);
    merge_list m = {0};
    int rc = t->scores ? score_merges(t, &m) : ranked_merges(t, &m);
    if (rc == 0) {
        if (m.n > 0) qsort(m.v, m.n, sizeof(merge_t), merge_cmp);
        put_merges(w, model, &m);
    }
    free(m.v);
    return rc;
}

static cJSON *tokenizer_json(writer *w) {
    cJSON *root = cJSON_CreateObject();
    if (!root) w->oom = 1;
    put_str(w, root, "version", "1.0");
    put(w, root, "truncation", cJSON_CreateNull());
    put(w, root, "padding", cJSON_CreateNull());
    put_added_tokens(w, root);
    if (w->t->type == QLM_TOK_UNIGRAM) put_unigram_pipeline(w, root);
    else if (w->t->type == QLM_TOK_SPM_BPE) put_spm_pipeline(w, root);
    else put_byte_pipeline(w, root);
    put_post_processor(w, root);
    put_decoder(w, root);
    if (put_model(w, root) != 0) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* The backend class loads tokenizer.json as written in every transformers version; model classes
 * (LlamaTokenizer, GPT2Tokenizer) rebuild their own pre-tokenizer from the vocabulary in
 * transformers 5, which would not reproduce these pipelines. */
static cJSON *tokenizer_config(writer *w) {
    const qlm_tokenizer *t = w->t;
    cJSON *cfg = cJSON_CreateObject();
    if (!cfg) w->oom = 1;
    put_bool(w, cfg, "add_bos_token", adds_bos(t));
    put_bool(w, cfg, "add_eos_token", adds_eos(t));
    put_str(w, cfg, "bos_token", token_or_null(t, t->bos));
    put_str(w, cfg, "eos_token", token_or_null(t, t->eos));
    put_str(w, cfg, "unk_token", token_or_null(t, t->unk));
    if (t->pad >= 0) put_str(w, cfg, "pad_token", tok_str(t, t->pad));
    if (t->chat_template) put_str(w, cfg, "chat_template", t->chat_template);
    put_bool(w, cfg, "clean_up_tokenization_spaces", 0);
    put_str(w, cfg, "tokenizer_class", "PreTrainedTokenizerFast");
    return cfg;
}

/* Prints root and writes it to dir/name atomically. */
static int write_json(writer *w, cJSON *root, const char *name, int formatted) {
    char path[4096];
    int n = snprintf(path, sizeof(path), "%s/%s", w->dir, name);
    if (n < 0 || (size_t)n >= sizeof(path)) return qlm_errorf("%s/%s: path too long", w->dir, name);
    char *text = w->oom ? NULL : formatted ? cJSON_Print(root) : cJSON_PrintUnformatted(root);
    if (!text) return qlm_errorf("%s: out of memory building the JSON", path);
    int rc = qlm_atomic_write_text(path, text);
    free(text);
    return rc;
}

int qlm_tokenizer_save_json(const qlm_tokenizer *t, const char *dir) {
    if (!t || !dir) return qlm_errorf("tokenizer.json: no tokenizer or folder");
    writer w = {t, dir, 0};
    if (check_vocab(&w) != 0) return -1;
    cJSON *root = tokenizer_json(&w);
    if (!root) return -1;
    int rc = write_json(&w, root, "tokenizer.json", 0);
    cJSON_Delete(root);
    if (rc != 0) return -1;
    cJSON *cfg = tokenizer_config(&w);
    rc = write_json(&w, cfg, "tokenizer_config.json", 1);
    cJSON_Delete(cfg);
    return rc;
}
