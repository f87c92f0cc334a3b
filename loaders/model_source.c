#include "model_source.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "fused_weights.h"
#include "gguf.h"
#include "hf_config.h"
#include "llama2c.h"
#include "../models/model.h"
#include "../models/t5.h"
#include "../hub/hf_cache.h"
#include "safetensors.h"

const char *qlm_format_name(qlm_format f) {
    static const char *names[] = {"safetensors", "gguf", "llama2.c"};
    return names[f];
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int file_magic_is_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char magic[4] = {0};
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

/* Directory part of path (without trailing slash) into buf. */
static void dir_of(const char *path, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash && slash != buf)
        *slash = 0;
    else
        snprintf(buf, cap, "%s", slash ? "/" : ".");
}

qlm_tokenizer *qlm_tokenizer_open(const char *path, int vocab_size) {
    char buf[4200];
    if (is_dir(path)) {
        snprintf(buf, sizeof buf, "%s/tokenizer.json", path);
        if (is_file(buf)) return qlm_tokenizer_load_json(buf, NULL);
        snprintf(buf, sizeof buf, "%s/spiece.model", path); /* T5's SentencePiece model */
        if (is_file(buf)) return qlm_tokenizer_load_spiece(buf);
        qlm_errorf("%s: no tokenizer.json or spiece.model in this folder", path);
        return NULL;
    }
    if (!is_file(path)) {
        if (access(path, F_OK) == 0) qlm_errorf("%s: not a regular file or a folder", path);
        else qlm_errorf("%s: no such tokenizer file", path);
        return NULL;
    }
    if (has_suffix(path, ".json")) return qlm_tokenizer_load_json(path, NULL);
    if (has_suffix(path, ".model")) return qlm_tokenizer_load_spiece(path);
    if (file_magic_is_gguf(path)) {
        qlm_gguf *g = qlm_gguf_open(path);
        if (!g) return NULL;
        qlm_tokenizer *t = qlm_gguf_tokenizer(g);
        qlm_gguf_close(g);
        return t;
    }
    qlm_tokenizer *t = qlm_tokenizer_load_llama2c(path, vocab_size);
    if (!t && !has_suffix(path, ".bin"))
        qlm_errorf("%s: not a tokenizer (tokenizer.json, a SentencePiece .model, a GGUF file or a llama2.c "
                   "tokenizer.bin)", path);
    return t;
}

/* The stored dtype of the first attention weight decides the default compute dtype. */
static void note_stored_dtype(qlm_source *src) {
    const char *first = src->is_t5 ? "encoder.block.0.layer.0.SelfAttention.q.weight" : "model.layers.0.self_attn.q_proj.weight";
    const qlm_tensor_entry *e = qlm_store_find(src->store, first);
    src->stored_dtype = e ? e->dtype : QLM_F32;
    src->stored_per_channel = e && e->row_scales != NULL;
}

static int open_safetensors(qlm_source *src, const char *dir, const char *file) {
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    int t5 = qlm_hf_config_is_t5(cfg_path);
    if (t5 < 0) return -1;
    src->is_t5 = t5;
    if ((t5 ? qlm_hf_t5_config_load(cfg_path, &src->t5) : qlm_hf_config_load(cfg_path, &src->cfg)) != 0) return -1;
    int rc = file ? qlm_safetensors_load(file, src->store) : qlm_safetensors_load_dir(dir, src->store);
    if (rc != 0 || (!t5 && qlm_store_unfuse(src->store, &src->cfg, file ? file : dir) != 0)) return -1;
    char tok_json[4200], spiece[4200];
    snprintf(tok_json, sizeof tok_json, "%s/tokenizer.json", dir);
    snprintf(spiece, sizeof spiece, "%s/spiece.model", dir);
    if (is_file(tok_json) || is_file(spiece)) {
        src->tok = qlm_tokenizer_open(dir, 0);
        if (!src->tok) return -1;
    }
    return 0;
}

static int open_gguf(qlm_source *src, const char *path) {
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) return -1;
    int rc = qlm_gguf_llama_config(g, &src->cfg);
    if (rc == 0) rc = qlm_gguf_load_tensors(g, &src->cfg, src->store);
    if (rc == 0) {
        src->tok = qlm_gguf_tokenizer(g);
        if (!src->tok) rc = -1;
    }
    qlm_gguf_close(g);
    return rc;
}

/* llama2.c ships tokenizers as tok<vocab>.bin or tokenizer.bin beside the checkpoint. */
static int open_llama2c(qlm_source *src, const char *path) {
    if (qlm_llama2c_load(path, &src->cfg, src->store) != 0) return -1;
    char dir[4096], cand[4200];
    dir_of(path, dir, sizeof dir);
    for (int i = 0; i < 2; i++) {
        if (i == 0)
            snprintf(cand, sizeof cand, "%s/tok%d.bin", dir, src->cfg.vocab_size);
        else
            snprintf(cand, sizeof cand, "%s/tokenizer.bin", dir);
        if (is_file(cand)) {
            src->tok = qlm_tokenizer_load_llama2c(cand, src->cfg.vocab_size);
            return src->tok ? 0 : -1;
        }
    }
    return 0;
}

/* A folder without config.json may still hold one GGUF file or one llama2.c checkpoint (as
 * llama2.c's own model folders do); its path goes to out. Returns 0 when exactly one is found. */
static int single_model_file_in(const char *dir, char *out, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return qlm_errorf("%s: cannot open folder", dir);
    int found = 0;
    char cand[4200];
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        int len = snprintf(cand, sizeof cand, "%s/%s", dir, e->d_name);
        if (len < 0 || (size_t)len >= cap || !is_file(cand)) continue;
        int model = file_magic_is_gguf(cand) || (has_suffix(e->d_name, ".bin") && strncmp(e->d_name, "tok", 3) != 0 &&
                                                 qlm_llama2c_probe(cand));
        if (model && found++ == 0) memcpy(out, cand, (size_t)len + 1);
    }
    closedir(d);
    if (found == 1) return 0;
    return qlm_errorf("%s: no config.json, and %s", dir,
                      found ? "more than one model file: name the one to load" : "no .gguf or llama2.c checkpoint in it");
}

int qlm_source_open(qlm_source *src, const char *model_path, const char *tokenizer_path) {
    char cfg_path[4200], inner[sizeof src->path], hub_dir[sizeof src->path];
    /* ORG/NAME[@REV] that is not a local path: the Hugging Face cache's snapshot, pulled if missing. */
    int hub = qlm_hf_resolve_model(model_path, hub_dir, sizeof hub_dir);
    if (hub < 0) {
        memset(src, 0, sizeof *src);
        return -1;
    }
    if (hub) model_path = hub_dir;
    if (strlen(model_path) >= sizeof src->path) {
        memset(src, 0, sizeof *src);
        return qlm_errorf("model path is longer than %zu bytes", sizeof src->path - 1);
    }
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model_path);
    if (is_dir(model_path) && !is_file(cfg_path)) {
        if (single_model_file_in(model_path, inner, sizeof inner) != 0) {
            memset(src, 0, sizeof *src);
            return -1;
        }
        model_path = inner;
    }
    memset(src, 0, sizeof *src);
    snprintf(src->path, sizeof src->path, "%s", model_path);
    src->store = qlm_store_new();
    if (!src->store) return -1;
    int rc;
    if (is_dir(model_path)) {
        src->format = QLM_FMT_SAFETENSORS;
        rc = open_safetensors(src, model_path, NULL);
    } else if (!is_file(model_path)) {
        rc = access(model_path, F_OK) == 0
                 ? qlm_errorf("%s: not a regular file or a folder (a device, FIFO or socket holds no model)", model_path)
                 : qlm_errorf("%s: no such file or folder", model_path);
    } else if (file_magic_is_gguf(model_path)) {
        src->format = QLM_FMT_GGUF;
        rc = open_gguf(src, model_path);
    } else if (has_suffix(model_path, ".safetensors")) {
        char dir[4096];
        dir_of(model_path, dir, sizeof dir);
        src->format = QLM_FMT_SAFETENSORS;
        rc = open_safetensors(src, dir, model_path);
    } else if (qlm_llama2c_probe(model_path)) {
        src->format = QLM_FMT_LLAMA2C;
        rc = open_llama2c(src, model_path);
    } else {
        rc = qlm_errorf("%s: not a model qlm can read (expected a model folder, .safetensors, .gguf or a "
                        "llama2.c checkpoint)", model_path);
    }
    if (rc == 0 && tokenizer_path) {
        if (src->tok) qlm_tokenizer_free(src->tok);
        src->tok = qlm_tokenizer_open(tokenizer_path, src->cfg.vocab_size);
        if (!src->tok) rc = -1;
    }
    int vocab = src->is_t5 ? src->t5.vocab_size : src->cfg.vocab_size;
    if (rc == 0 && src->tok && qlm_tokenizer_vocab_size(src->tok) > vocab)
        rc = qlm_errorf("tokenizer has %d tokens but the model only %d", qlm_tokenizer_vocab_size(src->tok), vocab);
    if (rc != 0) {
        if (!strstr(qlm_last_error(), model_path)) qlm_error_context("%s", model_path);
        qlm_source_close(src);
        return -1;
    }
    note_stored_dtype(src);
    return 0;
}

int qlm_source_open_random(qlm_source *src, const char *folder, const char *tokenizer_path, uint64_t seed) {
    memset(src, 0, sizeof *src);
    snprintf(src->path, sizeof src->path, "%s", folder);
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", folder);
    src->format = QLM_FMT_SAFETENSORS;
    src->store = qlm_store_new();
    int rc = src->store ? 0 : -1, t5 = rc == 0 ? qlm_hf_config_is_t5(cfg_path) : -1;
    if (t5 < 0) rc = -1;
    src->is_t5 = t5 > 0;
    if (rc == 0)
        rc = src->is_t5 ? qlm_hf_t5_config_load(cfg_path, &src->t5) : qlm_hf_config_load(cfg_path, &src->cfg);
    if (rc == 0)
        rc = src->is_t5 ? qlm_t5_random_store(&src->t5, seed, src->store)
                        : qlm_model_random_store(&src->cfg, seed, src->store);
    const char *tok = tokenizer_path ? tokenizer_path : folder;
    char json[4200], spiece[4200];
    snprintf(json, sizeof json, "%s/tokenizer.json", folder);
    snprintf(spiece, sizeof spiece, "%s/spiece.model", folder);
    if (rc == 0 && (tokenizer_path || is_file(json) || is_file(spiece))) {
        src->tok = qlm_tokenizer_open(tok, src->cfg.vocab_size);
        if (!src->tok) rc = -1;
    }
    if (rc != 0) {
        if (!strstr(qlm_last_error(), folder)) qlm_error_context("%s", folder);
        qlm_source_close(src);
        return -1;
    }
    src->stored_dtype = QLM_F32;
    return 0;
}

void qlm_source_close(qlm_source *src) {
    if (src->tok) qlm_tokenizer_free(src->tok);
    if (src->store) qlm_store_free(src->store);
    src->tok = NULL;
    src->store = NULL;
}
