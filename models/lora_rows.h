/* Unmerged LoRA inside a forward pass: which adapter each slot (sequence) uses, and the matmul
 * that adds each row's own adapter update, so one batch can mix adapters and switching a slot's
 * adapter is a pointer store. */
#ifndef QLM_LORA_ROWS_H
#define QLM_LORA_ROWS_H

#include "../core/backend.h"

struct qlm_lora_adapter;

typedef struct {
    const struct qlm_lora_adapter **slot; /* [n_slots]: the slot's adapter, NULL for none */
    const qlm_lora_ref **row;             /* [max_rows]: one call's pairs, scratch */
    int n_slots, max_rows;
    int active;                           /* slots with an adapter: 0 skips all LoRA work */
} qlm_lora_slots;

int qlm_lora_slots_init(qlm_lora_slots *l, int n_slots, int max_rows);
void qlm_lora_slots_free(qlm_lora_slots *l);
void qlm_lora_slots_set(qlm_lora_slots *l, int slot, const struct qlm_lora_adapter *a);

/* outs[p].y = x W_p^T (+ bias) for count projections of the same x and n <= max_rows rows (or +=
 * for a product that adds, outs[p].add), plus each row's adapter update for projection targets[p]
 * (stack, layer, targets: see lora/lora.h), through the backend's matmul_group; or with a step
 * (NULL: none) through its step_matmul_group, x then the step's, which the adapters read too; then
 * the kv step (NULL: none; outs are q, k and v), inside the products when no row has an adapter
 * whose update would come between. Row i belongs to slots[i], or to `slot` when slots is NULL.
 * Returns -1 only when the backend cannot get scratch memory. */
int qlm_matmul_lora_group(const qlm_backend *be, qlm_lora_slots *l, const qlm_matmul_out *outs, const int *targets,
                          int count, const float *x, const qlm_x_step *step, const qlm_kv_step *kv, int n,
                          const int *slots, int slot, int stack, int layer);

#endif
