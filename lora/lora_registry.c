/* Resident adapters by name. Each lives in its own allocation, so its address (held by running
 * sequences) does not move when others are added or removed. */
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "lora.h"
#include "lora_internal.h"

int qlm_lora_registry_init(qlm_lora_registry *r, const qlm_llama_config *llama, const qlm_t5_config *t5,
                           const qlm_backend *be) {
    memset(r, 0, sizeof *r);
    r->be = be;
    if (!llama == !t5) return qlm_errorf("a LoRA registry needs exactly one base configuration (Llama or T5)");
    r->is_t5 = t5 != NULL;
    if (llama) r->llama = *llama;
    else r->t5 = *t5;
    return 0;
}

void qlm_lora_registry_free(qlm_lora_registry *r) {
    for (int i = 0; i < r->n; i++) {
        qlm_lora_free(r->adapters[i]);
        free(r->adapters[i]);
    }
    memset(r, 0, sizeof *r);
}

static int find_index(const qlm_lora_registry *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->adapters[i]->name, name) == 0) return i;
    return -1;
}

/* 1 if the adapter was checked against a base with this registry's projections and shapes. */
static int same_base(const qlm_lora_registry *r, const qlm_lora_adapter *a) {
    lora_base b;
    if (r->is_t5) lora_base_t5(&b, &r->t5);
    else lora_base_llama(&b, &r->llama);
    if (!a->has_base || a->is_t5 != r->is_t5 || (a->is_t5 && a->t5_gated != b.t5_gated) ||
        a->n_layers[0] != b.n_layers[0] || a->n_layers[1] != b.n_layers[1])
        return 0;
    for (int i = 0; i < a->n_modules; i++) {
        const qlm_lora_module *m = &a->modules[i];
        if (m->a.cols != b.in[m->target] || m->b.rows != b.out[m->target]) return 0;
    }
    return 1;
}

int qlm_lora_registry_add(qlm_lora_registry *r, qlm_lora_adapter *a) {
    if (find_index(r, a->name) >= 0) return qlm_errorf("an adapter named %s is already loaded", a->name);
    if (r->n == QLM_LORA_MAX_RESIDENT)
        return qlm_errorf("cannot load adapter %s: %d adapters are resident already", a->name, QLM_LORA_MAX_RESIDENT);
    if (!same_base(r, a)) return qlm_errorf("adapter %s was not loaded for this base model", a->name);
    qlm_lora_adapter *copy = malloc(sizeof *copy);
    if (!copy) return qlm_errorf("out of memory");
    if (r->be && qlm_lora_place(a, r->be) != 0) {
        free(copy);
        return -1;
    }
    *copy = *a;
    memset(a, 0, sizeof *a);
    r->adapters[r->n++] = copy;
    return 0;
}

int qlm_lora_registry_load(qlm_lora_registry *r, const char *name, const char *path, qlm_dtype ab_dtype) {
    if (!name) return qlm_errorf("%s: an adapter in the registry needs a name", path);
    /* Refused before the (possibly large) file is read. */
    if (find_index(r, name) >= 0) return qlm_errorf("an adapter named %s is already loaded", name);
    qlm_lora_adapter a;
    if (qlm_lora_load(&a, path, name, r->is_t5 ? NULL : &r->llama, r->is_t5 ? &r->t5 : NULL, ab_dtype) != 0) return -1;
    if (qlm_lora_registry_add(r, &a) != 0) {
        qlm_lora_free(&a);
        return -1;
    }
    return 0;
}

int qlm_lora_registry_remove(qlm_lora_registry *r, const char *name) {
    int i = find_index(r, name);
    if (i < 0) return qlm_errorf("no adapter named %s is loaded", name);
    if (r->def == r->adapters[i]) r->def = NULL;
    qlm_lora_free(r->adapters[i]);
    free(r->adapters[i]);
    memmove(&r->adapters[i], &r->adapters[i + 1], (size_t)(r->n - i - 1) * sizeof r->adapters[0]);
    r->n--;
    return 0;
}

const qlm_lora_adapter *qlm_lora_registry_find(const qlm_lora_registry *r, const char *name) {
    int i = find_index(r, name);
    return i < 0 ? NULL : r->adapters[i];
}

const qlm_lora_adapter *qlm_lora_registry_at(const qlm_lora_registry *r, int i) {
    return i >= 0 && i < r->n ? r->adapters[i] : NULL;
}

int qlm_lora_registry_set_default(qlm_lora_registry *r, const char *name) {
    if (!name || strcmp(name, "none") == 0) {
        r->def = NULL;
        return 0;
    }
    const qlm_lora_adapter *a = qlm_lora_registry_find(r, name);
    if (!a) return qlm_errorf("no adapter named %s is loaded", name);
    r->def = a;
    return 0;
}

const qlm_lora_adapter *qlm_lora_registry_default(const qlm_lora_registry *r) { return r->def; }
