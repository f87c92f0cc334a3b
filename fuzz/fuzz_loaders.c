/* libFuzzer over every reader of files and bodies from outside: model files (safetensors, GGUF,
 * llama2.c), tokenizers (tokenizer.json, SentencePiece, tokenizer.bin), config.json,
 * adapter_config.json, training data, strict JSON and chat templates (parsed and rendered). One binary; QLM_FUZZ_TARGET names the
 * reader. Each input is written to the file name that reader expects (some go by the suffix), read,
 * and whatever loads is used as qlm would use it (tensors checked, text encoded and decoded), so
 * that a bad input shows up as an error and never as a crash, a leak or undefined behaviour
 * (built with ASan and UBSan). `make fuzz` runs every target; see fuzz/README.md. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tokenizer/chat.h"
#include "../models/config.h"
#include "../tokenizer/tokenizer.h"
#include "../loaders/gguf.h"
#include "../loaders/hf_config.h"
#include "../loaders/json_strict.h"
#include "../loaders/llama2c.h"
#include "../loaders/model_source.h"
#include "../loaders/safetensors.h"
#include "../core/tensor_store.h"
#include "../lora/lora_internal.h"
#include "../train/data.h"

typedef struct {
    const char *name;
    const char *file; /* what the input is saved as */
    void (*run)(const char *path, const uint8_t *data, size_t size);
} target;

static char g_dir[200];
static const target *g_target;
static qlm_tokenizer *g_tok; /* for the training data: the llama2.c tokenizer.bin of the assets */

/* What every loaded tokenizer is put through: encode with and without special tokens, decode, and
 * stream the pieces. */
static void use_tokenizer(qlm_tokenizer *t) {
    static const char text[] = "Hello, world! <s></s><|im_start|> 12345 \xc3\xa9t\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80\n\t x";
    for (int special = 0; special < 2; special++) {
        int *ids = NULL, n = 0;
        if (qlm_tokenizer_encode(t, text, sizeof text - 1, special, special, &ids, &n) != 0) continue;
        char *out = NULL, piece[256];
        size_t len;
        if (qlm_tokenizer_decode(t, ids, n, special, &out, &len) == 0) free(out);
        for (int i = 0, prev = -1; i < n; prev = ids[i++]) qlm_tokenizer_piece(t, prev, ids[i], piece, sizeof piece);
        free(ids);
    }
    qlm_tokenizer_free(t);
}

static void run_safetensors(const char *path, const uint8_t *data, size_t size) {
    (void)data, (void)size;
    qlm_tensor_store *s = qlm_store_new();
    if (!s) return;
    if (qlm_safetensors_load(path, s) == 0) qlm_store_check_values(s);
    qlm_store_free(s);
}

static void run_gguf(const char *path, const uint8_t *data, size_t size) {
    (void)data, (void)size;
    qlm_gguf *g = qlm_gguf_open(path);
    if (!g) return;
    char value[512];
    const char *key, *name, *type;
    int ndim;
    long long dims[4];
    for (int i = 0; i < qlm_gguf_n_kv(g); i++) qlm_gguf_kv_describe(g, i, &key, value, sizeof value);
    for (int i = 0; i < qlm_gguf_n_tensors(g); i++) qlm_gguf_tensor_describe(g, i, &name, &type, &ndim, dims);
    qlm_llama_config cfg;
    qlm_tensor_store *s = qlm_store_new();
    if (s && qlm_gguf_llama_config(g, &cfg) == 0 && qlm_gguf_load_tensors(g, &cfg, s) == 0) qlm_store_check_values(s);
    qlm_store_free(s);
    qlm_tokenizer *t = qlm_gguf_tokenizer(g);
    if (t) use_tokenizer(t);
    qlm_gguf_close(g);
}

static void run_llama2c(const char *path, const uint8_t *data, size_t size) {
    (void)data, (void)size;
    qlm_llama_config cfg;
    qlm_tensor_store *s = qlm_store_new();
    if (s && qlm_llama2c_load(path, &cfg, s) == 0) qlm_store_check_values(s);
    qlm_store_free(s);
}

static void run_tokenizer(const char *path, const uint8_t *data, size_t size) {
    (void)data, (void)size;
    qlm_tokenizer *t = qlm_tokenizer_open(path, 0);
    if (t) use_tokenizer(t);
}

static void run_hf_config(const char *path, const uint8_t *data, size_t size) {
    (void)data, (void)size;
    qlm_llama_config c;
    qlm_t5_config t5;
    if (qlm_hf_config_is_t5(path)) qlm_hf_t5_config_load(path, &t5);
    else qlm_hf_config_load(path, &c);
}

static void run_lora_config(const char *path, const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return;
    memcpy(text, data, size);
    text[size] = 0;
    qlm_lora_config c;
    if (lora_config_parse(&c, text, path) == 0) lora_config_free(&c);
    free(text);
}

static void run_json(const char *path, const uint8_t *data, size_t size) {
    (void)path;
    cJSON_Delete(qlm_json_parse_strict((const char *)data, size));
}

static void run_train_data(const char *path, const uint8_t *data, size_t size) {
    (void)data, (void)size;
    qlm_train_set train, eval;
    qlm_train_data_options o = {.seq_len = 64, .eval_fraction = 0.25, .seed = 1};
    if (size && data[0] & 1) o.target_field = "summary"; /* template mode too */
    if (qlm_train_data_load(&train, &eval, path, NULL, g_tok, &o) == 0) {
        qlm_train_set_free(&train);
        qlm_train_set_free(&eval);
    }
}

/* A model's chat template: parsed, then rendered over a conversation (with and without the
 * generation prompt) under small limits, so that a slow template shows as a limit reached. */
static void run_chat_template(const char *path, const uint8_t *data, size_t size) {
    (void)path;
    static const qlm_chat_message msgs[] = {{"system", "Be brief."}, {"user", "Hi <|im_end|> there"},
                                            {"assistant", "<think>x</think>Hello!"}, {"user", "  and you?\n"}};
    qlm_jinja *t;
    if (qlm_jinja_parse((const char *)data, size, &t) != 0) return;
    qlm_jinja_limits lim = qlm_jinja_default_limits();
    lim.max_output = 1 << 20;
    lim.max_memory = 64 << 20;
    lim.max_iterations = 100000;
    lim.max_steps = 2000000;
    for (int gen = 0; gen < 2; gen++) {
        qlm_marked_text out;
        if (qlm_chat_render_parsed(t, msgs, 4, gen, "<s>", "</s>", &lim, &out) == 0) qlm_marked_free(&out);
    }
    qlm_jinja_free(t);
}

static void remove_dir(void) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", g_dir, g_target->file);
    unlink(path);
    rmdir(g_dir);
}

static const target k_targets[] = {
    {"safetensors", "model.safetensors", run_safetensors},
    {"gguf", "model.gguf", run_gguf},
    {"llama2c", "model.bin", run_llama2c},
    {"tokenizer_json", "tokenizer.json", run_tokenizer},
    {"spiece", "spiece.model", run_tokenizer},
    {"tokenizer_bin", "tokenizer.bin", run_tokenizer},
    {"hf_config", "config.json", run_hf_config},
    {"lora_config", "adapter_config.json", run_lora_config},
    {"json", "body.json", run_json},
    {"train_data", "train.jsonl", run_train_data},
    {"chat_template", "template.jinja", run_chat_template},
};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *want = getenv("QLM_FUZZ_TARGET");
    for (size_t i = 0; want && i < sizeof k_targets / sizeof k_targets[0]; i++)
        if (!strcmp(k_targets[i].name, want)) g_target = &k_targets[i];
    if (!g_target) {
        fprintf(stderr, "QLM_FUZZ_TARGET must name one of:");
        for (size_t i = 0; i < sizeof k_targets / sizeof k_targets[0]; i++) fprintf(stderr, " %s", k_targets[i].name);
        fprintf(stderr, "\n");
        exit(2);
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/qlm-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        perror("qlm fuzz: mkdtemp");
        exit(1);
    }
    atexit(remove_dir);
    const char *tok = getenv("QLM_FUZZ_TOKENIZER");
    if (!strcmp(g_target->name, "train_data") && !(g_tok = qlm_tokenizer_open(tok ? tok : "", 0))) {
        fprintf(stderr, "qlm fuzz: train_data needs QLM_FUZZ_TOKENIZER, a tokenizer file\n");
        exit(2);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[300];
    snprintf(path, sizeof path, "%s/%s", g_dir, g_target->file);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t wrote = fwrite(data, 1, size, f);
    if (fclose(f) != 0 || wrote != size) return 0;
    g_target->run(path, data, size);
    return 0;
}
