/* Opens whatever a user points -m at: a Hugging Face model folder (config.json +
 * safetensors + tokenizer.json or spiece.model; Llama family or T5), a single .safetensors file beside its config.json, a
 * GGUF file, or a llama2.c checkpoint (tokenizer.bin beside it or given with -t). */
#ifndef QLM_MODEL_SOURCE_H
#define QLM_MODEL_SOURCE_H

#include <stdint.h>

#include "../models/config.h"
#include "../core/dtype.h"
#include "../tokenizer/tokenizer.h"
#include "../core/tensor_store.h"

typedef enum { QLM_FMT_SAFETENSORS, QLM_FMT_GGUF, QLM_FMT_LLAMA2C } qlm_format;

typedef struct {
    qlm_format format;
    int is_t5;              /* an encoder-decoder: t5 holds its config, cfg is unused */
    qlm_llama_config cfg;
    qlm_t5_config t5;
    qlm_tensor_store *store;
    qlm_tokenizer *tok;     /* NULL when no tokenizer was found (ids-only use) */
    qlm_dtype stored_dtype; /* dtype of the stored linear weights (F32 for dequantized GGUF) */
    int stored_per_channel; /* INT8 files: per-row scales */
    char path[4096];
} qlm_source;

/* tokenizer_path may be NULL (found beside the model). Fails if the model cannot be read;
 * a missing tokenizer is not an error here (src->tok stays NULL). */
int qlm_source_open(qlm_source *src, const char *model_path, const char *tokenizer_path);
/* A model folder's config.json (and tokenizer) with random weights of its shape instead of its
 * files' (see qlm_params_add_random): for measuring speed when only the config is at hand. */
int qlm_source_open_random(qlm_source *src, const char *folder, const char *tokenizer_path, uint64_t seed);
void qlm_source_close(qlm_source *src);
/* Loads a tokenizer from a tokenizer.json, a tokenizer.bin (vocab_size needed), a .gguf or a folder. */
qlm_tokenizer *qlm_tokenizer_open(const char *path, int vocab_size);
const char *qlm_format_name(qlm_format f);

#endif
