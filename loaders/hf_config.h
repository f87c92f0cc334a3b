/* Hugging Face config.json: LlamaForCausalLM-style models (Llama, Mistral-like, Qwen2, SmolLM2) and T5. */
#ifndef QLM_HF_CONFIG_H
#define QLM_HF_CONFIG_H

#include "../models/config.h"
#include "../core/dtype.h"

/* How the weights beside a config.json are stored. */
typedef struct {
    qlm_dtype dtype;
    int per_channel; /* INT8: one scale per output row */
    int group;       /* block types: weights per block */
} qlm_hf_storage;

int qlm_hf_config_load(const char *path, qlm_llama_config *cfg);
/* 1 if config.json says model_type "t5", 0 if another model, -1 (with a message) if unreadable. */
int qlm_hf_config_is_t5(const char *path);
/* config.json of T5ForConditionalGeneration (T5, T5 v1.1, FLAN-T5). */
int qlm_hf_t5_config_load(const char *path, qlm_t5_config *cfg);
/* Writes cfg as a T5ForConditionalGeneration config.json (atomically); see qlm_hf_config_save. */
int qlm_hf_t5_config_save(const char *path, const qlm_t5_config *cfg, const qlm_hf_storage *st);
/* Writes cfg as a config.json that transformers loads (atomically), its torch_dtype the stored one
 * (st NULL: float32). INT8 and block-type folders get a quantization_config naming qlm's scheme,
 * which transformers refuses by name instead of reading the bytes and scales as weights. */
int qlm_hf_config_save(const char *path, const qlm_llama_config *cfg, const qlm_hf_storage *st);
/* The documents the two save functions write, for the caller to own (NULL with a message naming
 * source on a config that does not validate). */
struct cJSON *qlm_hf_config_json(const qlm_llama_config *cfg, const qlm_hf_storage *st, const char *source);
struct cJSON *qlm_hf_t5_config_json(const qlm_t5_config *cfg, const qlm_hf_storage *st, const char *source);

#endif
