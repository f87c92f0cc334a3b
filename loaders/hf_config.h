/* Hugging Face config.json for LlamaForCausalLM-style models (Llama, Mistral-like, Qwen2, SmolLM2). */
#ifndef QLM_HF_CONFIG_H
#define QLM_HF_CONFIG_H

#include "../core/config.h"

int qlm_hf_config_load(const char *path, qlm_llama_config *cfg);
/* Writes cfg as a config.json that transformers loads (atomically). */
int qlm_hf_config_save(const char *path, const qlm_llama_config *cfg);

#endif
