/* Shared by the lora/ sources: the base model's adaptable projections and the configuration
 * reader/matcher (lora_config.c). Not part of the public API. */
#ifndef QLM_LORA_INTERNAL_H
#define QLM_LORA_INTERNAL_H

#include "lora.h"

/* What the adapter is checked against: the base's projections, their module paths and shapes. */
typedef struct {
    int is_t5;     /* -1 while unknown (no base given and no tensor read yet) */
    int t5_gated;  /* -1 while unknown */
    int fused;     /* Llama-family: 1 qkv_proj/gate_up_proj (Phi-3), 0 separate projections, -1 unknown */
    int known;     /* from a base configuration; else inferred from the tensor names */
    int n_layers[QLM_LORA_MAX_STACKS];
    int in[QLM_LORA_N_TARGETS], out[QLM_LORA_N_TARGETS]; /* when known */
} lora_base;

void lora_base_llama(lora_base *b, const qlm_llama_config *c);
void lora_base_t5(lora_base *b, const qlm_t5_config *c);
/* 1 if the base has projection t in stack (arch and gating known). */
int lora_base_has(const lora_base *b, int stack, qlm_lora_target t);
/* "model.layers.3.self_attn.q_proj", "decoder.block.1.layer.1.EncDecAttention.k", ... */
void lora_module_path(const lora_base *b, int stack, int layer, qlm_lora_target t, char *buf, size_t cap);

/* adapter_config.json text into c; errors name file and field. On failure c holds nothing. */
int lora_config_parse(qlm_lora_config *c, const char *text, const char *file);
void lora_config_free(qlm_lora_config *c);

/* Which modules a configuration targets, and with which rank and alpha, as peft decides it. */
typedef struct lora_matcher lora_matcher;
/* fused: the base names its projections qkv_proj and gate_up_proj (peft has no default targets
 * for it: target_modules must be given). */
lora_matcher *lora_matcher_new(const qlm_lora_config *c, int is_t5, int fused, const char *file);
void lora_matcher_free(lora_matcher *m);
int lora_matcher_targets(lora_matcher *m, const char *module_path);
void lora_matcher_rank_alpha(lora_matcher *m, const char *module_path, int *r, double *alpha);

#endif
