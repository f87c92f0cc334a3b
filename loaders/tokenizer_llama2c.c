/* llama2.c tokenizer.bin: i32 max_token_length, then per token f32 score, i32 length, bytes.
 * Pieces store "▁" as a plain space, and ids 1/2 are "\n<s>\n" / "\n</s>\n"; both are put back
 * into SentencePiece form so the SPM tokenizer (merges by score, byte fallback, dummy prefix
 * space) treats them like a tokenizer.model. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/read_file.h"
#include "../tokenizer/tokenizer.h"

#define MAX_FILE (256u << 20)

static int32_t rd_i32(const unsigned char *p) {
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t r;
    memcpy(&r, &v, 4);
    return r;
}

static int is_byte_piece(const unsigned char *s, int32_t n) {
    return n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>';
}

/* Piece in SentencePiece form: spaces as "▁" (NUL-terminated, malloc'd). */
static char *spm_piece(const unsigned char *s, int32_t n) {
    size_t spaces = 0;
    for (int32_t i = 0; i < n; i++) spaces += s[i] == ' ';
    char *out = malloc((size_t)n + 2 * spaces + 1), *o = out;
    if (!out) return NULL;
    for (int32_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(o, "\xE2\x96\x81", 3);
            o += 3;
        } else {
            *o++ = (char)s[i];
        }
    }
    *o = 0;
    return out;
}

typedef struct {
    char **tokens;
    float *scores;
    int *types;
} l2c_vocab;

static int parse_vocab(const char *path, const unsigned char *buf, size_t size, int vocab_size, l2c_vocab *v) {
    if (size < 4) return qlm_errorf("%s: file too short for the max_token_length header", path);
    int32_t max_len = rd_i32(buf);
    if (max_len <= 0 || max_len > 65536) return qlm_errorf("%s: max_token_length %d is not in 1..65536", path, max_len);
    size_t off = 4;
    for (int i = 0; i < vocab_size; i++) {
        if (size - off < 8) return qlm_errorf("%s: token %d: file ends before its score and length", path, i);
        float score;
        memcpy(&score, buf + off, 4); /* llama2.c files are little-endian, as are the hosts qlm runs on */
        int32_t n = rd_i32(buf + off + 4);
        off += 8;
        if (n < 0 || n > max_len) return qlm_errorf("%s: token %d: length %d not in 0..%d", path, i, n, max_len);
        if ((size_t)n > size - off) return qlm_errorf("%s: token %d: %d bytes run past the end of the file", path, i, n);
        if (memchr(buf + off, 0, (size_t)n)) return qlm_errorf("%s: token %d: contains a NUL byte", path, i);
        const char *fixed = i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : NULL;
        v->tokens[i] = fixed ? strdup(fixed) : spm_piece(buf + off, n);
        if (!v->tokens[i]) return qlm_errorf("%s: out of memory", path);
        v->scores[i] = score;
        v->types[i] = is_byte_piece(buf + off, n) ? QLM_TOKEN_BYTE : QLM_TOKEN_NORMAL;
        if (fixed) v->types[i] = i == 0 ? QLM_TOKEN_UNKNOWN : QLM_TOKEN_CONTROL;
        off += (size_t)n;
    }
    return 0;
}

/* The number of token records, which must end exactly at the end of the file: the vocabulary size
 * when no model says it. */
static int count_records(const char *path, const unsigned char *buf, size_t size) {
    if (size < 4) return qlm_errorf("%s: file too short for the max_token_length header", path);
    int n = 0;
    for (size_t off = 4; off < size; n++) {
        int32_t len = size - off >= 8 ? rd_i32(buf + off + 4) : -1;
        if (len < 0 || (size_t)len > size - off - 8 || n == (1 << 24))
            return qlm_errorf("%s: not a llama2.c tokenizer (token %d's record runs past the end of the file)", path, n);
        off += 8 + (size_t)len;
    }
    return n;
}

qlm_tokenizer *qlm_tokenizer_load_llama2c(const char *path, int vocab_size) {
    if (!path || vocab_size < 0 || vocab_size > (1 << 24)) {
        qlm_errorf("%s: vocab_size %d is not in 3..16777216", path ? path : "llama2.c tokenizer", vocab_size);
        return NULL;
    }
    size_t size = 0;
    unsigned char *buf = (unsigned char *)qlm_read_file(path, MAX_FILE, &size);
    if (!buf) return NULL;
    if (vocab_size == 0) vocab_size = count_records(path, buf, size);
    if (vocab_size < 3) {
        if (vocab_size >= 0) qlm_errorf("%s: %d tokens; a llama2.c tokenizer has at least <unk>, <s> and </s>", path, vocab_size);
        free(buf);
        return NULL;
    }
    l2c_vocab v = {calloc((size_t)vocab_size, sizeof(char *)), malloc(sizeof(float) * (size_t)vocab_size),
                   malloc(sizeof(int) * (size_t)vocab_size)};
    qlm_tokenizer *t = NULL;
    if (!v.tokens || !v.scores || !v.types) {
        qlm_errorf("%s: out of memory", path);
    } else if (parse_vocab(path, buf, size, vocab_size, &v) == 0) {
        qlm_tokenizer_spec spec = {
            .type = QLM_TOK_SPM_BPE,
            .n_vocab = vocab_size,
            .tokens = (const char *const *)v.tokens,
            .scores = v.scores,
            .token_types = v.types,
            .bos_id = 1,
            .eos_id = 2,
            .unk_id = 0,
            .pad_id = -1,
            .add_bos = 1,
            .add_space_prefix = 1,
            .byte_fallback = 1,
        };
        t = qlm_tokenizer_build(&spec);
        if (!t) qlm_error_context("%s", path);
    }
    for (int i = 0; v.tokens && i < vocab_size; i++) free(v.tokens[i]);
    free(v.tokens);
    free(v.scores);
    free(v.types);
    free(buf);
    return t;
}
