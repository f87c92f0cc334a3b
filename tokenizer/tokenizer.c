/* Tokenizer construction from a qlm_tokenizer_spec, decoding, streaming pieces and lookups.
 * Encoding lives in tokenizer_encode.c, the merge loop in tokenizer_bpe.c, the Unigram model in
 * tokenizer_unigram.c and the pre-tokenizers in pretokenize.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "tokenizer_internal.h"

static int valid_id(const qlm_tokenizer_spec *spec, int id) { return id >= -1 && id < spec->n_vocab; }

static int check_spec(const qlm_tokenizer_spec *spec) {
    if (!spec) return qlm_errorf("tokenizer: no spec");
    if (spec->type != QLM_TOK_SPM_BPE && spec->type != QLM_TOK_BYTE_BPE && spec->type != QLM_TOK_UNIGRAM)
        return qlm_errorf("tokenizer: unknown tokenizer type %d", (int)spec->type);
    if ((int)spec->pre < QLM_PRE_GPT2 || spec->pre > QLM_PRE_QWEN2)
        return qlm_errorf("tokenizer: unknown pre-tokenizer %d", (int)spec->pre);
    if (spec->n_vocab <= 0 || spec->n_vocab > (1 << 24) || !spec->tokens)
        return qlm_errorf("tokenizer: vocabulary size %d is not in 1..16777216", spec->n_vocab);
    if (spec->n_merges < 0 || (spec->n_merges > 0 && !spec->merges))
        return qlm_errorf("tokenizer: %d merges but no merge list", spec->n_merges);
    if (spec->type == QLM_TOK_SPM_BPE && spec->n_merges == 0 && !spec->scores)
        return qlm_errorf("tokenizer: SentencePiece BPE needs merges or scores");
    if (spec->type == QLM_TOK_UNIGRAM && (!spec->piece_scores || spec->unk_id < 0))
        return qlm_errorf("tokenizer: Unigram needs piece scores and an unknown token");
    if (!valid_id(spec, spec->bos_id) || !valid_id(spec, spec->eos_id) || !valid_id(spec, spec->unk_id) ||
        !valid_id(spec, spec->pad_id))
        return qlm_errorf("tokenizer: bos/eos/unk/pad id (%d/%d/%d/%d) outside the vocabulary of %d", spec->bos_id,
                          spec->eos_id, spec->unk_id, spec->pad_id, spec->n_vocab);
    if (spec->n_extra_eos < 0 || (spec->n_extra_eos > 0 && !spec->extra_eos))
        return qlm_errorf("tokenizer: %d extra end-of-turn ids but no list", spec->n_extra_eos);
    for (int i = 0; i < spec->n_extra_eos; i++)
        if (spec->extra_eos[i] < 0 || spec->extra_eos[i] >= spec->n_vocab)
            return qlm_errorf("tokenizer: end-of-turn id %d outside the vocabulary", spec->extra_eos[i]);
    for (int i = 0; i < spec->n_vocab; i++) {
        if (!spec->tokens[i]) return qlm_errorf("tokenizer: token %d is missing", i);
        if (spec->token_types && (spec->token_types[i] < QLM_TOKEN_NORMAL || spec->token_types[i] > QLM_TOKEN_BYTE))
            return qlm_errorf("tokenizer: token %d has unknown type %d", i, spec->token_types[i]);
    }
    return 0;
}

static int copy_tokens(qlm_tokenizer *t, const qlm_tokenizer_spec *spec) {
    size_t total = 0;
    for (int i = 0; i < spec->n_vocab; i++) total += strlen(spec->tokens[i]) + 1;
    if (total > UINT32_MAX) return qlm_errorf("tokenizer: vocabulary text exceeds 4 GiB");
    size_t nv = (unsigned)spec->n_vocab; /* checked positive in check_spec */
    t->text = malloc(total);
    t->off = malloc(sizeof(uint32_t) * nv);
    t->len = malloc(sizeof(uint32_t) * nv);
    t->types = malloc(nv);
    if (!t->text || !t->off || !t->len || !t->types) return qlm_errorf("tokenizer: out of memory");
    size_t at = 0;
    for (int i = 0; i < spec->n_vocab; i++) {
        size_t n = strlen(spec->tokens[i]);
        memcpy(t->text + at, spec->tokens[i], n + 1);
        t->off[i] = (uint32_t)at, t->len[i] = (uint32_t)n;
        t->types[i] = (unsigned char)(spec->token_types ? spec->token_types[i] : QLM_TOKEN_NORMAL);
        at += n + 1;
    }
    return 0;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xNN>" -> NN, or -1. */
static int byte_piece(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static void find_byte_ids(qlm_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        int n = t->type != QLM_TOK_BYTE_BPE ? snprintf(s, sizeof(s), "<0x%02X>", b)
                                           : tok_utf8_put(tok_byte_to_cp((unsigned char)b), s);
        t->byte_ids[b] = tok_vocab_find(t, s, (size_t)n);
        /* A byte piece that is an added token (<0x0A> marked special) is no fallback target. */
        if (t->type != QLM_TOK_BYTE_BPE && t->byte_ids[b] >= 0 && t->types[t->byte_ids[b]] == QLM_TOKEN_CONTROL)
            t->byte_ids[b] = -1;
    }
}

/* The bytes token id stands for in decoded text. */
static int decode_token(const qlm_tokenizer *t, int id, tok_buf *out) {
    const char *s = tok_str(t, id);
    size_t n = t->len[id];
    int ty = t->types[id];
    if (ty == QLM_TOKEN_CONTROL || ty == QLM_TOKEN_USER_DEFINED || ty == QLM_TOKEN_UNKNOWN)
        return tok_buf_put(out, s, n);
    if (t->type != QLM_TOK_BYTE_BPE) {
        int b = t->byte_fallback || ty == QLM_TOKEN_BYTE ? byte_piece(s, n) : -1;
        if (b >= 0) {
            char c = (char)b;
            return tok_buf_put(out, &c, 1);
        }
        for (size_t i = 0; i < n;) {
            int space = i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0;
            if (tok_buf_put(out, space ? " " : s + i, 1) != 0) return -1;
            i += space ? 3 : 1;
        }
        return 0;
    }
    for (size_t i = 0; i < n;) {
        int clen = tok_utf8_len((const unsigned char *)s + i, n - i);
        int b = clen > 1 || (unsigned char)s[i] < 0x80 ? tok_cp_to_byte(tok_utf8_cp((const unsigned char *)s + i, clen))
                                                       : -1;
        char c = (char)b;
        if (tok_buf_put(out, b >= 0 ? &c : s + i, b >= 0 ? 1 : (size_t)clen) != 0) return -1;
        i += (size_t)clen;
    }
    return 0;
}

static int build_decode_table(qlm_tokenizer *t) {
    tok_buf buf = {0};
    t->dec_off = malloc(sizeof(uint32_t) * (size_t)t->n_vocab);
    t->dec_len = malloc(sizeof(uint32_t) * (size_t)t->n_vocab);
    if (!t->dec_off || !t->dec_len) return qlm_errorf("tokenizer: out of memory");
    for (int id = 0; id < t->n_vocab; id++) {
        size_t start = buf.n;
        if (decode_token(t, id, &buf) != 0) {
            free(buf.p);
            return -1;
        }
        t->dec_off[id] = (uint32_t)start, t->dec_len[id] = (uint32_t)(buf.n - start);
    }
    t->dec = buf.p;
    return 0;
}

static int build_eog(qlm_tokenizer *t, const qlm_tokenizer_spec *spec) {
    static const char *const names[] = {"<|im_end|>",    "<|eot_id|>",      "<|eom_id|>",   "<|end|>",
                                        "<|endoftext|>", "<|end_of_text|>", "<end_of_turn>"};
    int cap = 1 + (spec->n_extra_eos > 0 ? spec->n_extra_eos : (int)(sizeof(names) / sizeof(names[0])));
    t->eog = malloc(sizeof(int) * (size_t)cap);
    if (!t->eog) return qlm_errorf("tokenizer: out of memory");
    if (t->eos >= 0) t->eog[t->n_eog++] = t->eos;
    for (int i = 0; i < spec->n_extra_eos; i++) t->eog[t->n_eog++] = spec->extra_eos[i];
    for (size_t i = 0; spec->n_extra_eos == 0 && i < sizeof(names) / sizeof(names[0]); i++) {
        int id = tok_vocab_find(t, names[i], strlen(names[i]));
        if (id >= 0 && id != t->eos && t->types[id] == QLM_TOKEN_CONTROL) t->eog[t->n_eog++] = id;
    }
    return 0;
}

static void copy_options(qlm_tokenizer *t, const qlm_tokenizer_spec *spec) {
    t->type = spec->type;
    t->pre = spec->pre;
    t->n_vocab = spec->n_vocab;
    t->bos = spec->bos_id, t->eos = spec->eos_id, t->unk = spec->unk_id, t->pad = spec->pad_id;
    t->add_bos = spec->add_bos, t->add_eos = spec->add_eos;
    t->byte_fallback = spec->byte_fallback, t->fuse_unk = spec->fuse_unk, t->ignore_merges = spec->ignore_merges;
    if (spec->type != QLM_TOK_BYTE_BPE) {
        t->add_space_prefix = spec->add_space_prefix, t->spm_metaspace = spec->spm_metaspace;
        t->space_prefix_first = spec->space_prefix_first, t->split_words = spec->split_words;
    }
}

static int build(qlm_tokenizer *t, const qlm_tokenizer_spec *spec) {
    copy_options(t, spec);
    if (copy_tokens(t, spec) != 0 || tok_strmap_build(&t->vocab, t) != 0) return -1;
    if (spec->type == QLM_TOK_SPM_BPE && spec->n_merges == 0) {
        t->scores = malloc(sizeof(float) * (size_t)t->n_vocab);
        if (!t->scores) return qlm_errorf("tokenizer: out of memory");
        memcpy(t->scores, spec->scores, sizeof(float) * (size_t)t->n_vocab);
    } else if (spec->type != QLM_TOK_UNIGRAM && tok_merges_build(t, spec->merges, spec->n_merges) != 0) {
        return -1;
    }
    if (spec->type != QLM_TOK_BYTE_BPE && !spec->token_types && spec->byte_fallback)
        for (int id = 0; id < t->n_vocab; id++)
            if (byte_piece(tok_str(t, id), t->len[id]) >= 0) t->types[id] = QLM_TOKEN_BYTE;
    find_byte_ids(t);
    if (spec->type == QLM_TOK_UNIGRAM && tok_unigram_build(t, spec) != 0) return -1;
    if (build_decode_table(t) != 0 || tok_added_build(t, spec->token_flags) != 0 || build_eog(t, spec) != 0)
        return -1;
    if (spec->chat_template && qlm_tokenizer_set_chat_template(t, spec->chat_template) != 0) return -1;
    return tok_pre_init(t);
}

qlm_tokenizer *qlm_tokenizer_build(const qlm_tokenizer_spec *spec) {
    if (check_spec(spec) != 0) return NULL;
    qlm_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) {
        qlm_errorf("tokenizer: out of memory");
        return NULL;
    }
    if (build(t, spec) != 0) {
        qlm_tokenizer_free(t);
        return NULL;
    }
    return t;
}

void qlm_tokenizer_free(qlm_tokenizer *t) {
    if (!t) return;
    tok_pre_free(t);
    tok_unigram_free(t);
    tok_strmap_free(&t->vocab);
    tok_pairmap_free(&t->merges);
    tok_added_free(&t->raw_added);
    tok_added_free(&t->norm_added);
    free(t->text);
    free(t->off);
    free(t->len);
    free(t->dec);
    free(t->dec_off);
    free(t->dec_len);
    free(t->scores);
    free(t->types);
    free(t->eog);
    free(t->chat_template);
    free(t);
}

/* ---- decoding ---- */

static int skipped(const qlm_tokenizer *t, int id) {
    return t->types[id] == QLM_TOKEN_CONTROL || t->types[id] == QLM_TOKEN_UNKNOWN;
}

static int strips_prefix_space(const qlm_tokenizer *t) { return t->type != QLM_TOK_BYTE_BPE && t->add_space_prefix; }

/* sentencepiece's own decoder drops the leading space of every piece until one adds text. */
static int strips_until_text(const qlm_tokenizer *t) { return t->uni && t->uni->spm_normalizer; }

int qlm_tokenizer_decode(const qlm_tokenizer *t, const int *ids, int n_ids, int skip_special, char **out,
                         size_t *out_len) {
    if (!t || !out || n_ids < 0 || (n_ids > 0 && !ids)) return qlm_errorf("tokenizer decode: invalid arguments");
    tok_buf buf = {0};
    int rc = tok_buf_put(&buf, "", 0), strip = strips_prefix_space(t);
    for (int i = 0; rc == 0 && i < n_ids; i++) {
        int id = ids[i];
        if (id < 0 || id >= t->n_vocab) {
            rc = qlm_errorf("tokenizer decode: id %d at position %d outside the vocabulary of %d", id, i, t->n_vocab);
        } else if (!(skip_special && skipped(t, id))) {
            const char *s = t->dec + t->dec_off[id];
            uint32_t n = t->dec_len[id];
            /* The first bytes of the output lose one leading space (or, for sentencepiece, each
             * piece does until one adds text). */
            if (strip && buf.n == 0 && n > 0 && s[0] == ' ') s++, n--, strip = strips_until_text(t);
            rc = tok_buf_put(&buf, s, n);
        }
    }
    if (rc != 0) {
        free(buf.p);
        return -1;
    }
    *out = buf.p;
    if (out_len) *out_len = buf.n;
    return 0;
}

int qlm_tokenizer_piece(const qlm_tokenizer *t, int prev, int id, char *buf, int cap) {
    if (!t || id < 0 || id >= t->n_vocab || cap < 0 || (cap > 0 && !buf))
        return qlm_errorf("tokenizer piece: invalid token id %d", id);
    if (skipped(t, id)) return 0;
    const char *s = t->dec + t->dec_off[id];
    uint32_t n = t->dec_len[id];
    if (strips_prefix_space(t) && (prev < 0 || prev == t->bos) && n > 0 && s[0] == ' ') s++, n--;
    if (n > (uint32_t)cap) return qlm_errorf("tokenizer piece: %u bytes do not fit in %d", n, cap);
    memcpy(buf, s, n);
    return (int)n;
}

/* ---- lookups ---- */

const char *qlm_tokenizer_token(const qlm_tokenizer *t, int id) {
    return t && id >= 0 && id < t->n_vocab ? tok_str(t, id) : NULL;
}

int qlm_tokenizer_vocab_size(const qlm_tokenizer *t) { return t ? t->n_vocab : 0; }
int qlm_tokenizer_bos(const qlm_tokenizer *t) { return t ? t->bos : -1; }
int qlm_tokenizer_eos(const qlm_tokenizer *t) { return t ? t->eos : -1; }

int qlm_tokenizer_is_eog(const qlm_tokenizer *t, int id) {
    for (int i = 0; t && i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

int qlm_tokenizer_find(const qlm_tokenizer *t, const char *token) {
    return t && token ? tok_vocab_find(t, token, strlen(token)) : -1;
}

const char *qlm_tokenizer_chat_template(const qlm_tokenizer *t) { return t ? t->chat_template : NULL; }

int qlm_tokenizer_is_lossless(const qlm_tokenizer *t) {
    /* Unigram normalization folds characters and spaces. */
    if (!t || t->type == QLM_TOK_UNIGRAM || (t->type == QLM_TOK_SPM_BPE && !t->byte_fallback)) return 0;
    /* Metaspace adds no "▁" before a leading space, yet decoding drops one. */
    if (t->spm_metaspace && t->add_space_prefix) return 0;
    for (int b = 0; b < 256; b++) {
        int in_utf8 = b < 0xC0 || (b >= 0xC2 && b <= 0xF4); /* bytes valid UTF-8 can contain */
        if (in_utf8 && t->byte_ids[b] < 0) return 0;
    }
    return 1;
}

int qlm_tokenizer_set_chat_template(qlm_tokenizer *t, const char *tmpl) {
    if (!t) return qlm_errorf("tokenizer: no tokenizer");
    char *copy = NULL;
    if (tmpl && !(copy = strdup(tmpl))) return qlm_errorf("tokenizer: out of memory");
    free(t->chat_template);
    t->chat_template = copy;
    return 0;
}
