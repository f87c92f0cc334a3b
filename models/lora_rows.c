#include "lora_rows.h"

#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "../core/error.h"

int qlm_lora_slots_init(qlm_lora_slots *l, int n_slots, int max_rows) {
    memset(l, 0, sizeof *l);
    l->slot = calloc((size_t)n_slots, sizeof *l->slot);
    l->row = calloc((size_t)max_rows, sizeof *l->row);
    if (!l->slot || !l->row) {
        qlm_lora_slots_free(l);
        return qlm_errorf("out of memory");
    }
    l->n_slots = n_slots;
    l->max_rows = max_rows;
    return 0;
}

void qlm_lora_slots_free(qlm_lora_slots *l) {
    free(l->slot);
    free(l->row);
    memset(l, 0, sizeof *l);
}

void qlm_lora_slots_set(qlm_lora_slots *l, int slot, const struct qlm_lora_adapter *a) {
    l->active += (a != NULL) - (l->slot[slot] != NULL);
    l->slot[slot] = a;
}

/* Adds each row's adapter update for one projection to y (its product already there). */
static int add_lora(const qlm_backend *be, qlm_lora_slots *l, float *y, const float *x, int n, const int *slots,
                    int slot, int stack, int layer, int target) {
    int any = 0;
    for (int i = 0; i < n; i++) {
        const qlm_lora_adapter *a = l->slot[slots ? slots[i] : slot];
        const qlm_lora_module *mod = a ? qlm_lora_find(a, stack, layer, (qlm_lora_target)target) : NULL;
        l->row[i] = mod ? &mod->ref : NULL;
        any |= mod != NULL;
    }
    return any ? be->lora(y, x, n, l->row) : 0;
}

/* Whether any of rows 0 .. n - 1 has an adapter with an update for one of the count targets. */
static int rows_adapted(const qlm_lora_slots *l, const int *targets, int count, int n, const int *slots, int slot,
                        int stack, int layer) {
    for (int i = 0; l->active && i < n; i++) {
        const qlm_lora_adapter *a = l->slot[slots ? slots[i] : slot];
        for (int p = 0; a && p < count; p++)
            if (qlm_lora_find(a, stack, layer, (qlm_lora_target)targets[p])) return 1;
    }
    return 0;
}

int qlm_matmul_lora_group(const qlm_backend *be, qlm_lora_slots *l, const qlm_matmul_out *outs, const int *targets,
                          int count, const float *x, const qlm_x_step *step, const qlm_kv_step *kv, int n,
                          const int *slots, int slot, int stack, int layer) {
    const int adapted = rows_adapted(l, targets, count, n, slots, slot, stack, layer);
    const qlm_kv_step *inside = step && !adapted ? kv : NULL;
    if ((step ? be->step_matmul_group(outs, count, step, inside, n) : be->matmul_group(outs, count, x, n)) != 0)
        return -1;
    if (step) x = step->x;
    for (int p = 0; adapted && p < count; p++)
        if (add_lora(be, l, outs[p].y, x, n, slots, slot, stack, layer, targets[p]) != 0) return -1;
    if (kv && !inside) be->rope_store(outs[0].y, outs[1].y, outs[2].y, n, kv);
    return 0;
}
