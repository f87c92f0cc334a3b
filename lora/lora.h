/* LoRA adapters in Hugging Face PEFT's format: adapter_config.json + adapter_model.safetensors with
 * tensors base_model.model.<module>.lora_A.weight [r, in] and .lora_B.weight [out, r]. A module's
 * output becomes W0 x + scale·B(A x), scale = lora_alpha / r (lora_alpha / sqrt(r) with rsLoRA).
 *
 * An adapter is validated against its base model's configuration when loaded and then holds, per
 * adapted projection, A and B as qlm_weight matrices (F32 or BF16) that the matmul kernels take
 * directly, found in O(1) by (stack, layer, target). A registry keeps several resident by name;
 * merge/unmerge fold one into the base weights in place. */
#ifndef QLM_LORA_H
#define QLM_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "../models/adapter.h"
#include "../models/config.h"
#include "../models/model.h"
#include "../models/t5.h"
#include "../core/weight.h"


/* Loads the adapter folder path (adapter_config.json + adapter_model.safetensors). Pass the base
 * model's configuration (llama or t5; both NULL: only the names and the adapter's own consistency
 * are checked, as `qlm lora info` does). Every tensor's module must be one the configuration
 * targets and the base has, every targeted module must have both tensors, ranks must match the
 * config, values must be finite. A and B are converted to ab_dtype (QLM_F32 or QLM_BF16).
 * name: 1-63 letters, digits, '_', '-', '.', not "none"; NULL takes the folder's name when it is
 * one, else "adapter". On failure *out is zeroed, nothing stays allocated, and the error names
 * the file and the field or tensor. */
int qlm_lora_load(qlm_lora_adapter *out, const char *path, const char *name, const qlm_llama_config *llama,
                  const qlm_t5_config *t5, qlm_dtype ab_dtype);
/* Moves the adapter's A and B into backend be's memory (be->upload), where its lora op reads them;
 * a no-op on the CPU. Merging, saving and inspecting need an adapter left in host memory. */
int qlm_lora_place(qlm_lora_adapter *a, const qlm_backend *be);
void qlm_lora_free(qlm_lora_adapter *a);
/* The adapter as one unit (core/units.h): every module's A then B, PEFT's tensor names. Returns 1
 * (the number of units); *params and *units (when not NULL) are malloc'd. */
int qlm_lora_units(qlm_lora_adapter *a, qlm_param **params, int *n_params, qlm_unit **units);
/* A new adapter for the base (llama or t5) as adapter_config.json text describes it (r,
 * lora_alpha, target_modules, use_rslora, patterns...), initialized as peft does: A
 * kaiming-uniform (deterministic in seed), B zero, so it starts as the identity. For training, or
 * to measure an adapter's cost. */
int qlm_lora_init(qlm_lora_adapter *out, const char *name, const qlm_llama_config *llama, const qlm_t5_config *t5,
                  const char *config_json, uint64_t seed, qlm_dtype dt);

/* Writes dir/adapter_config.json and dir/adapter_model.safetensors (each atomically; dir is
 * created if missing) in peft's format, A and B in the adapter's dtype. */
int qlm_lora_save(const qlm_lora_adapter *a, const char *dir);

/* The configuration as adapter_config.json text in peft's format (malloc'd), or NULL with an error. */
char *qlm_lora_config_json(const qlm_lora_config *c);



/* A target's module name as peft's target_modules spells it for this adapter's base ("q_proj",
 * "q", "EncDecAttention.q", "wi_0", or "wi" in an ungated T5). */
const char *qlm_lora_target_name(const qlm_lora_adapter *a, qlm_lora_target t);
/* "llama" or "t5", a name for the adapter's base architecture. */
const char *qlm_lora_arch_name(const qlm_lora_adapter *a);

/* W0 += sign·scale·B·A for every module (sign +1 merges, -1 unmerges), into a model on the CPU
 * backend with F32, BF16 or F16 weights: W0 + ΔW is computed in F32 (ΔW the same dot product
 * over the rank both ways) and stored in the weight's dtype. Every module is checked against the
 * model first, so a failure changes nothing. Unmerging what was merged restores each weight to
 * within one unit in the last place of its storage dtype at the larger of |W0| and |W0 + ΔW|
 * (tested: F32, BF16 and F16; about 3/4 of the weights come back exactly). */
int qlm_lora_merge(qlm_model *m, const qlm_lora_adapter *a, int sign);
int qlm_lora_merge_t5(qlm_t5_model *m, const qlm_lora_adapter *a, int sign);

/* Resident adapters by name, all validated against one base configuration. Adapter addresses stay
 * fixed while they are resident, so sequences can hold them; removing one that a running
 * sequence uses is the caller's error. */
enum { QLM_LORA_MAX_RESIDENT = 32 };

typedef struct {
    int is_t5;
    qlm_llama_config llama;
    qlm_t5_config t5;
    const qlm_backend *be; /* adapters are placed in its memory as they are added (NULL: left on the host) */
    qlm_lora_adapter *adapters[QLM_LORA_MAX_RESIDENT];
    int n;
    const qlm_lora_adapter *def; /* the default, or NULL */
} qlm_lora_registry;

/* A registry for adapters of this base (exactly one of llama, t5), run by backend be (NULL: kept
 * in host memory, as the CPU backend and the tools that read adapters want them). */
int qlm_lora_registry_init(qlm_lora_registry *r, const qlm_llama_config *llama, const qlm_t5_config *t5,
                           const qlm_backend *be);
void qlm_lora_registry_free(qlm_lora_registry *r);
/* Loads path as name (validated against the registry's base) and makes it resident; a duplicate
 * name, a full registry or a bad adapter leave the registry as it was. */
int qlm_lora_registry_load(qlm_lora_registry *r, const char *name, const char *path, qlm_dtype ab_dtype);
/* Takes over an adapter loaded against the same base (*a is zeroed on success, untouched on failure). */
int qlm_lora_registry_add(qlm_lora_registry *r, qlm_lora_adapter *a);
/* Frees the named adapter (the default becomes none if it was the default). */
int qlm_lora_registry_remove(qlm_lora_registry *r, const char *name);
/* NULL (no error set) when no adapter has this name. */
const qlm_lora_adapter *qlm_lora_registry_find(const qlm_lora_registry *r, const char *name);
/* Resident adapters in the order they were added: i in [0, r->n). */
const qlm_lora_adapter *qlm_lora_registry_at(const qlm_lora_registry *r, int i);
/* The default adapter by name; NULL or "none" means no adapter. Allocates nothing. */
int qlm_lora_registry_set_default(qlm_lora_registry *r, const char *name);
const qlm_lora_adapter *qlm_lora_registry_default(const qlm_lora_registry *r);

#endif
