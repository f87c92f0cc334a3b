/* llama2.c checkpoints: 7 x int32 header then F32 weights (legacy "v0" layout). */
#ifndef QLM_LLAMA2C_H
#define QLM_LLAMA2C_H

#include "../models/config.h"
#include "../core/tensor_store.h"

/* Reads header and weights (mmap'd) into store under HF names, Q/K rows permuted to HF's
 * rotate-half layout. Validates the file size against the header exactly. */
int qlm_llama2c_load(const char *path, qlm_llama_config *cfg, qlm_tensor_store *store);
/* True if the file looks like a llama2.c checkpoint (size consistent with its header). */
int qlm_llama2c_probe(const char *path);

#endif
