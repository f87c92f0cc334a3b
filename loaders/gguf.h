/* GGUF v2/v3 reader: metadata, tensors (F32, F16, BF16, Q8_0, Q4_0, Q4_1 dequantized
 * on load), the embedded tokenizer, and the mapping of llama.cpp tensor names to
 * Hugging Face names and layouts. */
#ifndef QLM_GGUF_H
#define QLM_GGUF_H

#include "../models/config.h"
#include "../tokenizer/tokenizer.h"
#include "../core/tensor_store.h"

typedef struct qlm_gguf qlm_gguf;

/* Maps and validates the whole file (header, metadata, tensor infos, data ranges). */
qlm_gguf *qlm_gguf_open(const char *path);
void qlm_gguf_close(qlm_gguf *g);

/* Metadata lookups; return -1 if the key is absent or of another type. */
int qlm_gguf_get_str(const qlm_gguf *g, const char *key, const char **out);
int qlm_gguf_get_int(const qlm_gguf *g, const char *key, long long *out);   /* any integer type */
int qlm_gguf_get_float(const qlm_gguf *g, const char *key, double *out);    /* f32/f64 (or integer) */
int qlm_gguf_get_bool(const qlm_gguf *g, const char *key, int *out);
/* Array of strings: *items points to n pointers owned by g. */
int qlm_gguf_get_str_array(const qlm_gguf *g, const char *key, const char *const **items, int *n);
/* Array of numbers converted to float / int; *out malloc'd. */
int qlm_gguf_get_float_array(const qlm_gguf *g, const char *key, float **out, int *n);
int qlm_gguf_get_int_array(const qlm_gguf *g, const char *key, int **out, int *n);

int qlm_gguf_n_kv(const qlm_gguf *g);
/* Key name and a printable value (arrays summarized) for `qlm info`. */
int qlm_gguf_kv_describe(const qlm_gguf *g, int i, const char **key, char *value, size_t cap);
int qlm_gguf_n_tensors(const qlm_gguf *g);
/* Name, GGML type name ("Q4_1"), and dims of tensor i, for `qlm info`. */
int qlm_gguf_tensor_describe(const qlm_gguf *g, int i, const char **name, const char **type_name,
                             int *ndim, long long dims[4]);

/* Llama-family config from general.architecture + "<arch>.*" keys (llama, qwen2, ...). */
int qlm_gguf_llama_config(const qlm_gguf *g, qlm_llama_config *cfg);
/* All tensors under HF names, Q/K rows un-permuted to HF's rotate-half layout where the
 * architecture needs it: matrices in Q8_0, Q4_0 or Q4_1 (as qlm's block types of the same names,
 * group 32), F16 or BF16 read in place from a mapping of the file the store keeps (Q/K: copied);
 * matrices in the other quantized types converted to Q8_0, the rest to F32. */
int qlm_gguf_load_tensors(const qlm_gguf *g, const qlm_llama_config *cfg, qlm_tensor_store *store);
/* The embedded tokenizer (tokenizer.ggml.*). */
qlm_tokenizer *qlm_gguf_tokenizer(const qlm_gguf *g);

#endif
