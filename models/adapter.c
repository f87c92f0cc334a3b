#include "adapter.h"

const qlm_lora_module *qlm_lora_find(const qlm_lora_adapter *a, int stack, int layer, qlm_lora_target t) {
    if (stack < 0 || stack >= QLM_LORA_MAX_STACKS || layer < 0 || layer >= a->n_layers[stack] || t < 0 ||
        t >= QLM_LORA_N_TARGETS)
        return NULL;
    return a->index[((stack ? a->n_layers[0] : 0) + layer) * QLM_LORA_N_TARGETS + (int)t];
}
