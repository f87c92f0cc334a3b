/* W8A8 panels kept on disk. Block weights that take 8-bit activations are repacked into panels
 * (quant/block_pack.h) at every load, so they cannot be read where the model file has them: for a
 * 1.1B model that costs half a second and a fresh copy of every weight. The first load of a large
 * model writes the panels to a cache file; later loads map it and read the panels in place, as
 * fast as a model with nothing to repack, and the weights are then file pages the kernel can
 * drop under memory pressure rather than anonymous memory.
 *
 * The file is safetensors (block types as qlm writes them, in the panel layout), its __metadata__
 * naming the source file, its size and modification time, the requested format and the panel
 * layout's version: a source that changed, or another format, makes the file stale, and the next
 * load writes it again. */
#ifndef QLM_PANEL_CACHE_H
#define QLM_PANEL_CACHE_H

#include <stddef.h>

#include "../core/tensor_store.h"

/* Path in cache_dir of the panel file for the weights of model_path (a weights file, or a folder
 * holding one model.safetensors) built as format (a short label, "as-stored", "q8_0/32"): 1 when
 * the model can have one, 0 when not (sharded folders, no such file), -1 when the path is too long. */
int qlm_panel_cache_path(const char *cache_dir, const char *model_path, const char *format, char *out, size_t cap);

/* The panels the file at path holds, when it is current for model_path and format: a store whose
 * entries point into its mapping (free it after the model). NULL when it is absent or stale, with
 * *why saying why it is stale (NULL when absent). */
qlm_tensor_store *qlm_panel_cache_open(const char *path, const char *model_path, const char *format,
                                       const char **why);

/* Writes panels (the W8A8 matrices of a model built from model_path as format, in the panel
 * layout) to path atomically. */
int qlm_panel_cache_save(const char *path, const char *model_path, const char *format,
                         const qlm_tensor_store *panels);

#endif
