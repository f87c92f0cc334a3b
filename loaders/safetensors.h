/* safetensors reader (single file or sharded through model.safetensors.index.json,
 * mmap'd) and writer (atomic: temp file, fsync, rename).
 * INT8 tensors carry their scale in a companion F32 tensor "<name>_scale": shape [1]
 * for a per-tensor scale, [rows] for per-row (per-output-channel) scales.
 * Tied models: HF files may hold only model.embed_tokens.weight or only lm_head.weight;
 * the loader lists what the file holds and the model builder does the tying. */
#ifndef QLM_SAFETENSORS_H
#define QLM_SAFETENSORS_H

#include "../core/tensor_store.h"

/* Reads one .safetensors file into store (entries point into a mapping the store keeps).
 * "<name>_scale" companions are attached to their I8 tensor and not listed separately. */
int qlm_safetensors_load(const char *path, qlm_tensor_store *store);
/* The __metadata__ value of key in the file at path, into out: 1 if found, 0 if absent, -1 (with
 * a message) if the file's header is unreadable. */
int qlm_safetensors_metadata(const char *path, const char *key, char *out, size_t cap);
/* Reads a model folder: model.safetensors, or the shards named by model.safetensors.index.json. */
int qlm_safetensors_load_dir(const char *dir, qlm_tensor_store *store);

/* Writes every entry of store (I8 entries with their "_scale" companion) to path atomically.
 * metadata: NULL-terminated key/value string pairs for "__metadata__", or NULL. */
int qlm_safetensors_save(const char *path, const qlm_tensor_store *store, const char *const *metadata);
/* The same file laid out for weights multiplied where a mapping holds them: the header padded so
 * that the data start on a 64-byte cache line, and the tensors a whole number of lines long first,
 * each on a line. Readers take it as any other safetensors file. */
int qlm_safetensors_save_on_lines(const char *path, const qlm_tensor_store *store, const char *const *metadata);

#endif
