/* The tokenizer embedded in GGUF metadata (tokenizer.ggml.*): "llama" is SentencePiece BPE
 * merged by score (or by rank when merges are stored), "gpt2" is byte-level BPE with the
 * pre-tokenizer named by tokenizer.ggml.pre. */
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "gguf.h"

typedef struct {
    const qlm_gguf *g;
    qlm_tokenizer_spec spec;
    float *scores;
    int *types;
} gguf_tok;

/* Optional integer key: *out keeps dflt when absent; an id outside the vocabulary is an error. */
static int get_id(gguf_tok *G, const char *key, int dflt, int *out) {
    long long v;
    *out = dflt < G->spec.n_vocab ? dflt : -1;
    if (qlm_gguf_get_int(G->g, key, &v) != 0) return 0;
    if (v < 0 || v >= G->spec.n_vocab)
        return qlm_errorf("GGUF %s: id %lld outside the vocabulary of %d", key, v, G->spec.n_vocab);
    *out = (int)v;
    return 0;
}

static int get_flag(const qlm_gguf *g, const char *key, int dflt) {
    int v;
    return qlm_gguf_get_bool(g, key, &v) == 0 ? (v != 0) : dflt;
}

static int load_pre(gguf_tok *G) {
    const char *pre = NULL;
    if (qlm_gguf_get_str(G->g, "tokenizer.ggml.pre", &pre) != 0 || strcmp(pre, "gpt2") == 0 || strcmp(pre, "gpt-2") == 0) {
        G->spec.pre = QLM_PRE_GPT2;
    } else if (strcmp(pre, "smollm") == 0) {
        G->spec.pre = QLM_PRE_SMOLLM;
    } else if (strcmp(pre, "llama-bpe") == 0 || strcmp(pre, "llama3") == 0 || strcmp(pre, "llama-v3") == 0) {
        G->spec.pre = QLM_PRE_LLAMA3;
        G->spec.ignore_merges = 1; /* as Llama 3's tokenizer.json */
    } else if (strcmp(pre, "qwen2") == 0) {
        G->spec.pre = QLM_PRE_QWEN2;
    } else {
        return qlm_errorf("GGUF tokenizer.ggml.pre \"%s\" is not supported (gpt2, smollm, llama-bpe, qwen2)", pre);
    }
    return 0;
}

static int load_arrays(gguf_tok *G) {
    int n;
    if (qlm_gguf_get_str_array(G->g, "tokenizer.ggml.tokens", &G->spec.tokens, &G->spec.n_vocab) != 0)
        return qlm_errorf("GGUF tokenizer.ggml.tokens is missing or not a string array");
    if (qlm_gguf_get_float_array(G->g, "tokenizer.ggml.scores", &G->scores, &n) == 0 && n != G->spec.n_vocab)
        return qlm_errorf("GGUF tokenizer.ggml.scores has %d entries for %d tokens", n, G->spec.n_vocab);
    if (qlm_gguf_get_int_array(G->g, "tokenizer.ggml.token_type", &G->types, &n) == 0 && n != G->spec.n_vocab)
        return qlm_errorf("GGUF tokenizer.ggml.token_type has %d entries for %d tokens", n, G->spec.n_vocab);
    if (qlm_gguf_get_str_array(G->g, "tokenizer.ggml.merges", &G->spec.merges, &G->spec.n_merges) != 0) {
        G->spec.merges = NULL;
        G->spec.n_merges = 0;
    }
    G->spec.scores = G->scores;
    G->spec.token_types = G->types;
    return 0;
}

static int load_model(gguf_tok *G) {
    const char *model;
    if (qlm_gguf_get_str(G->g, "tokenizer.ggml.model", &model) != 0)
        return qlm_errorf("GGUF tokenizer.ggml.model is missing");
    int spm = strcmp(model, "llama") == 0;
    if (!spm && strcmp(model, "gpt2") != 0)
        return qlm_errorf("GGUF tokenizer.ggml.model \"%s\" is not supported (llama, gpt2)", model);
    if (load_arrays(G) != 0) return -1;
    if (spm) {
        if (!G->scores && G->spec.n_merges == 0) return qlm_errorf("GGUF tokenizer.ggml.scores is missing");
        G->spec.type = QLM_TOK_SPM_BPE;
        G->spec.byte_fallback = 1;
        G->spec.fuse_unk = 1;
        G->spec.add_space_prefix = get_flag(G->g, "tokenizer.ggml.add_space_prefix", 1);
    } else {
        if (G->spec.n_merges == 0) return qlm_errorf("GGUF tokenizer.ggml.merges is missing");
        G->spec.type = QLM_TOK_BYTE_BPE;
        if (load_pre(G) != 0) return -1;
    }
    /* SentencePiece models conventionally use unk 0, bos 1, eos 2 when the keys are absent.
     * Byte-level BPE drops a byte missing from its alphabet, as HF does (no unk token): SmolLM2's
     * unknown_token_id names <|endoftext|>, which must not stand in for a byte. */
    G->spec.unk_id = -1;
    if (get_id(G, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, &G->spec.bos_id) != 0 ||
        get_id(G, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, &G->spec.eos_id) != 0 ||
        (spm && get_id(G, "tokenizer.ggml.unknown_token_id", 0, &G->spec.unk_id) != 0) ||
        get_id(G, "tokenizer.ggml.padding_token_id", -1, &G->spec.pad_id) != 0)
        return -1;
    G->spec.add_bos = get_flag(G->g, "tokenizer.ggml.add_bos_token", spm) && G->spec.bos_id >= 0;
    G->spec.add_eos = get_flag(G->g, "tokenizer.ggml.add_eos_token", 0) && G->spec.eos_id >= 0;
    if (qlm_gguf_get_str(G->g, "tokenizer.chat_template", &G->spec.chat_template) != 0) G->spec.chat_template = NULL;
    return 0;
}

qlm_tokenizer *qlm_gguf_tokenizer(const qlm_gguf *g) {
    if (!g) {
        qlm_errorf("GGUF tokenizer: no file");
        return NULL;
    }
    gguf_tok G = {.g = g};
    qlm_tokenizer *t = load_model(&G) == 0 ? qlm_tokenizer_build(&G.spec) : NULL;
    free(G.scores);
    free(G.types);
    return t;
}
