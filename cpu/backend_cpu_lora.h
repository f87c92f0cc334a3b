/* The CPU backend's lora op (core/backend.h): y += scale · B (A x) for each row's pair, all of a
 * call's pairs in one parallel region (backend_cpu_lora.c). */
#ifndef QLM_BACKEND_CPU_LORA_H
#define QLM_BACKEND_CPU_LORA_H

#include "../core/backend.h"

int qlm_cpu_lora(float *y, const float *x, int n, const qlm_lora_ref *const *per_row);

#endif
