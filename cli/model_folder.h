/* Writing a loaded model as a Hugging Face style folder: model.safetensors in the model's storage
 * dtype (INT8 with its "_scale" tensors, __metadata__ "qlm.dtype"), config.json, and the tokenizer
 * (its side files copied from a safetensors folder, or written as tokenizer.json otherwise). */
#ifndef QLM_CLI_MODEL_FOLDER_H
#define QLM_CLI_MODEL_FOLDER_H

#include "common.h"

/* out_dir is created if missing; every file is written atomically. */
int cli_write_model_folder(cli_model *cm, const char *out_dir);

#endif
