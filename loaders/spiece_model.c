/* SentencePiece ModelProto files (T5's spiece.model), read without a protobuf library.
 *
 * Protobuf wire format: each field is a varint key (field number << 3 | wire type) followed by a
 * varint (type 0), 8 bytes (type 1), a varint length and that many bytes (type 2: strings, bytes,
 * sub-messages) or 4 bytes (type 5: float). Fields read here, by number (absent ones take the
 * proto2 defaults in parentheses):
 *   ModelProto      1 pieces (repeated), 2 trainer_spec, 3 normalizer_spec
 *   SentencePiece   1 piece, 2 score (float), 3 type (1 normal, 2 unknown, 3 control,
 *                   4 user-defined, 5 unused, 6 byte; default 1)
 *   TrainerSpec     3 model_type (1 Unigram), 24 treat_whitespace_as_suffix (false),
 *                   35 byte_fallback (false), 40 unk_id (0), 41 bos_id (1), 42 eos_id (2),
 *                   43 pad_id (-1); ids are int32, a negative one is a 10-byte varint
 *   NormalizerSpec  2 precompiled_charsmap, 3 add_dummy_prefix (true),
 *                   4 remove_extra_whitespaces (true), 5 escape_whitespaces (true)
 * Every other field is skipped. Every length is checked against what is left of its message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../tokenizer/tokenizer.h"
#include "../core/read_file.h"

#define MAX_MODEL (1u << 30)

typedef struct {
    const unsigned char *p, *end;
} pb_msg;

/* One field: its number, wire type, and value (varint or fixed) or payload (length-delimited). */
typedef struct {
    uint32_t number;
    int wire;
    uint64_t value;
    pb_msg sub;
} pb_field;

typedef struct {
    const char *path;
    const unsigned char *data;
    /* pieces, in id order */
    const unsigned char **piece;
    uint32_t *piece_len;
    float *score;
    int *type;
    int n, cap;
    /* trainer_spec and normalizer_spec */
    int model_type, whitespace_suffix, byte_fallback, unk_id, bos_id, eos_id, pad_id;
    int add_dummy_prefix, remove_extra, escape_whitespaces;
    const unsigned char *charsmap;
    size_t charsmap_len;
} spm_load;

static int pb_error(const spm_load *L, const unsigned char *at, const char *what) {
    return qlm_errorf("%s: %s at byte %ld", L->path, what, (long)(at - L->data));
}

static int read_varint(const spm_load *L, pb_msg *m, uint64_t *v) {
    const unsigned char *start = m->p;
    *v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (m->p >= m->end) return pb_error(L, start, "truncated varint");
        unsigned char b = *m->p++;
        if (shift == 63 && b > 1) break;
        *v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return 0;
    }
    return pb_error(L, start, "varint longer than 64 bits");
}

/* Reads the next field of m into f; returns 1 when m has no more fields, -1 on error. */
static int next_field(const spm_load *L, pb_msg *m, pb_field *f) {
    if (m->p >= m->end) return 1;
    const unsigned char *at = m->p;
    uint64_t key;
    if (read_varint(L, m, &key) != 0) return -1;
    f->number = (uint32_t)(key >> 3);
    f->wire = (int)(key & 7);
    if (f->number == 0 || key >> 32) return pb_error(L, at, "invalid field key");
    size_t left = (size_t)(m->end - m->p), size;
    switch (f->wire) {
    case 0: return read_varint(L, m, &f->value);
    case 1: size = 8; break;
    case 5: size = 4; break;
    case 2:
        if (read_varint(L, m, &f->value) != 0) return -1;
        left = (size_t)(m->end - m->p);
        if (f->value > left) return pb_error(L, at, "field length runs past the end of its message");
        f->sub = (pb_msg){m->p, m->p + f->value};
        m->p += f->value;
        return 0;
    default: return pb_error(L, at, "unsupported protobuf wire type");
    }
    if (size > left) return pb_error(L, at, "truncated fixed-size field");
    f->value = 0;
    for (size_t i = 0; i < size; i++) f->value |= (uint64_t)m->p[i] << (8 * i);
    m->p += size;
    return 0;
}

/* The field must have wire type `wire`; named in the error otherwise. */
static int want(const spm_load *L, const pb_field *f, int wire, const char *name) {
    if (f->wire == wire) return 0;
    return qlm_errorf("%s: %s has wire type %d, expected %d", L->path, name, f->wire, wire);
}

/* An int32 varint (negative values are sign-extended to 64 bits). */
static int int32_field(const spm_load *L, const pb_field *f, const char *name, int *out) {
    if (want(L, f, 0, name) != 0) return -1;
    int64_t v = (int64_t)f->value;
    if (v < INT32_MIN || v > INT32_MAX) return qlm_errorf("%s: %s %lld is not an int32", L->path, name, (long long)v);
    *out = (int)v;
    return 0;
}

static int bool_field(const spm_load *L, const pb_field *f, const char *name, int *out) {
    if (want(L, f, 0, name) != 0) return -1;
    *out = f->value != 0;
    return 0;
}

static int read_piece(spm_load *L, pb_msg m) {
    if (L->n == L->cap) {
        int cap = L->cap ? L->cap * 2 : 1024;
        if (cap > (1 << 24)) return qlm_errorf("%s: more than %d pieces", L->path, 1 << 24);
        const unsigned char **piece = realloc(L->piece, sizeof(*piece) * (size_t)cap);
        if (piece) L->piece = piece;
        uint32_t *len = realloc(L->piece_len, sizeof(*len) * (size_t)cap);
        if (len) L->piece_len = len;
        float *score = realloc(L->score, sizeof(*score) * (size_t)cap);
        if (score) L->score = score;
        int *type = realloc(L->type, sizeof(*type) * (size_t)cap);
        if (type) L->type = type;
        if (!piece || !len || !score || !type) return qlm_errorf("%s: out of memory", L->path);
        L->cap = cap;
    }
    int i = L->n, rc;
    L->piece[i] = NULL, L->piece_len[i] = 0, L->score[i] = 0, L->type[i] = QLM_TOKEN_NORMAL;
    pb_field f;
    while ((rc = next_field(L, &m, &f)) == 0) {
        if (f.number == 1) {
            if (want(L, &f, 2, "piece") != 0) return -1;
            L->piece[i] = f.sub.p, L->piece_len[i] = (uint32_t)(f.sub.end - f.sub.p);
        } else if (f.number == 2) {
            if (want(L, &f, 5, "piece score") != 0) return -1;
            uint32_t bits = (uint32_t)f.value;
            memcpy(&L->score[i], &bits, sizeof(bits));
        } else if (f.number == 3 && int32_field(L, &f, "piece type", &L->type[i]) != 0) {
            return -1;
        }
    }
    if (rc < 0) return -1;
    if (!L->piece[i] || L->piece_len[i] == 0 || memchr(L->piece[i], 0, L->piece_len[i]))
        return qlm_errorf("%s: piece %d is empty or holds a NUL byte", L->path, i);
    if (L->type[i] < QLM_TOKEN_NORMAL || L->type[i] > QLM_TOKEN_BYTE)
        return qlm_errorf("%s: piece %d has unknown type %d", L->path, i, L->type[i]);
    L->n++;
    return 0;
}

static int read_trainer_spec(spm_load *L, pb_msg m) {
    pb_field f;
    int rc;
    while ((rc = next_field(L, &m, &f)) == 0) {
        switch (f.number) {
        case 3: rc = int32_field(L, &f, "trainer_spec.model_type", &L->model_type); break;
        case 24: rc = bool_field(L, &f, "trainer_spec.treat_whitespace_as_suffix", &L->whitespace_suffix); break;
        case 35: rc = bool_field(L, &f, "trainer_spec.byte_fallback", &L->byte_fallback); break;
        case 40: rc = int32_field(L, &f, "trainer_spec.unk_id", &L->unk_id); break;
        case 41: rc = int32_field(L, &f, "trainer_spec.bos_id", &L->bos_id); break;
        case 42: rc = int32_field(L, &f, "trainer_spec.eos_id", &L->eos_id); break;
        case 43: rc = int32_field(L, &f, "trainer_spec.pad_id", &L->pad_id); break;
        default: break;
        }
        if (rc != 0) return -1;
    }
    return rc < 0 ? -1 : 0;
}

static int read_normalizer_spec(spm_load *L, pb_msg m) {
    pb_field f;
    int rc;
    while ((rc = next_field(L, &m, &f)) == 0) {
        switch (f.number) {
        case 2:
            if ((rc = want(L, &f, 2, "normalizer_spec.precompiled_charsmap")) == 0)
                L->charsmap = f.sub.p, L->charsmap_len = (size_t)(f.sub.end - f.sub.p);
            break;
        case 3: rc = bool_field(L, &f, "normalizer_spec.add_dummy_prefix", &L->add_dummy_prefix); break;
        case 4: rc = bool_field(L, &f, "normalizer_spec.remove_extra_whitespaces", &L->remove_extra); break;
        case 5: rc = bool_field(L, &f, "normalizer_spec.escape_whitespaces", &L->escape_whitespaces); break;
        default: break;
        }
        if (rc != 0) return -1;
    }
    return rc < 0 ? -1 : 0;
}

static int read_model(spm_load *L, pb_msg m) {
    pb_field f;
    int rc;
    while ((rc = next_field(L, &m, &f)) == 0) {
        if (f.number < 1 || f.number > 3) continue;
        static const char *const names[] = {"", "pieces", "trainer_spec", "normalizer_spec"};
        if (want(L, &f, 2, names[f.number]) != 0) return -1;
        rc = f.number == 1 ? read_piece(L, f.sub) : f.number == 2 ? read_trainer_spec(L, f.sub)
                                                                   : read_normalizer_spec(L, f.sub);
        if (rc != 0) return -1;
    }
    return rc < 0 ? -1 : 0;
}

/* Settings qlm cannot honour, and ids outside the vocabulary. */
static int check_model(const spm_load *L) {
    if (L->n == 0) return qlm_errorf("%s: no pieces (not a SentencePiece model?)", L->path);
    if (L->model_type != 1)
        return qlm_errorf("%s: trainer_spec.model_type %d is not supported (only 1, Unigram)", L->path, L->model_type);
    if (L->whitespace_suffix || !L->escape_whitespaces)
        return qlm_errorf("%s: treat_whitespace_as_suffix / escape_whitespaces=false are not supported", L->path);
    const int *ids[] = {&L->unk_id, &L->bos_id, &L->eos_id, &L->pad_id};
    static const char *const names[] = {"unk_id", "bos_id", "eos_id", "pad_id"};
    for (int k = 0; k < 4; k++)
        if (*ids[k] < -1 || *ids[k] >= L->n)
            return qlm_errorf("%s: trainer_spec.%s %d is outside the %d pieces", L->path, names[k], *ids[k], L->n);
    if (L->unk_id < 0 || L->type[L->unk_id] != QLM_TOKEN_UNKNOWN)
        return qlm_errorf("%s: trainer_spec.unk_id %d is not the unknown piece", L->path, L->unk_id);
    return 0;
}

static qlm_tokenizer *build(spm_load *L) {
    size_t total = 0;
    for (int i = 0; i < L->n; i++) total += L->piece_len[i] + 1;
    char *arena = malloc(total);
    const char **tokens = malloc(sizeof(char *) * (size_t)L->n);
    double *scores = malloc(sizeof(double) * (size_t)L->n);
    qlm_tokenizer *t = NULL;
    if (!arena || !tokens || !scores) {
        qlm_errorf("%s: out of memory", L->path);
    } else {
        char *at = arena;
        for (int i = 0; i < L->n; i++) {
            memcpy(at, L->piece[i], L->piece_len[i]);
            at[L->piece_len[i]] = 0;
            tokens[i] = at;
            at += L->piece_len[i] + 1;
            scores[i] = L->score[i];
        }
        qlm_tokenizer_spec spec = {
            .type = QLM_TOK_UNIGRAM,
            .n_vocab = L->n,
            .tokens = tokens,
            .token_types = L->type,
            .piece_scores = scores,
            .bos_id = L->bos_id,
            .eos_id = L->eos_id,
            .unk_id = L->unk_id,
            .pad_id = L->pad_id,
            .add_eos = L->eos_id >= 0, /* T5 ends every input with </s> */
            .add_space_prefix = L->add_dummy_prefix,
            .byte_fallback = L->byte_fallback,
            .fuse_unk = 1,
            .charsmap = L->charsmap,
            .charsmap_len = L->charsmap_len,
            .spm_normalizer = 1,
            .remove_extra_spaces = L->remove_extra,
        };
        t = qlm_tokenizer_build(&spec);
        if (!t) qlm_error_context("%s", L->path);
    }
    free(arena);
    free(tokens);
    free(scores);
    return t;
}

qlm_tokenizer *qlm_tokenizer_load_spiece(const char *path) {
    if (!path) {
        qlm_errorf("spiece.model: no path");
        return NULL;
    }
    size_t size = 0;
    unsigned char *data = (unsigned char *)qlm_read_file(path, MAX_MODEL, &size);
    if (!data) return NULL;
    spm_load L = {.path = path, .data = data, .model_type = 1, .unk_id = 0, .bos_id = 1, .eos_id = 2, .pad_id = -1,
                  .add_dummy_prefix = 1, .remove_extra = 1, .escape_whitespaces = 1};
    qlm_tokenizer *t = NULL;
    if (read_model(&L, (pb_msg){data, data + size}) == 0 && check_model(&L) == 0) t = build(&L);
    free(L.piece);
    free(L.piece_len);
    free(L.score);
    free(L.type);
    free(data);
    return t;
}
