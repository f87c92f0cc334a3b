/* Hugging Face config.json: LlamaForCausalLM-style models (Llama, Mistral-like, Qwen2, SmolLM2) and T5. */
#ifndef QLM_HF_CONFIG_H
#define QLM_HF_CONFIG_H

#include "../core/config.h"

int qlm_hf_config_load(const char *path, qlm_llama_config *cfg);
/* 1 if config.json says model_type "t5", 0 if another model, -1 (with a message) if unreadable. */
int qlm_hf_config_is_t5(const char *path);
/* config.json of T5ForConditionalGeneration (T5, T5 v1.1, FLAN-T5). */
int qlm_hf_t5_config_load(const char *path, qlm_t5_config *cfg);
/* Writes cfg as a T5ForConditionalGeneration config.json (atomically). */
int qlm_hf_t5_config_save(const char *path, const qlm_t5_config *cfg);
/* Writes cfg as a config.json that transformers loads (atomically). */
int qlm_hf_config_save(const char *path, const qlm_llama_config *cfg);

#endif
