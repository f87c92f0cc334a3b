/* What one training pass takes, whatever the architecture: sequences laid out row after row
 * (no padding), each row's next-token target, and the adapter being trained. */
#ifndef QLM_TRAIN_BATCH_H
#define QLM_TRAIN_BATCH_H

#include <stdint.h>

struct qlm_lora_adapter;

/* Sequence b is rows start[b] .. start[b] + len[b] - 1, at positions 0 .. len[b] - 1 (for an
 * encoder-decoder, the decoder's rows). */
typedef struct {
    int n_seq;
    const int *start, *len;
    int n_rows;
    const int *ids;     /* [n_rows] input tokens */
    const int *pos;     /* [n_rows] position of each row in its sequence */
    const int *targets; /* [n_rows] the token row i must predict (the next one), or -1: no loss */
    /* Encoder-decoders: sequence b's input is rows src_start[b] .. + src_len[b] of src_ids. */
    int n_src_rows;
    const int *src_ids, *src_start, *src_len;
    /* Where these rows (and input rows) start in the step's whole micro-batch when several ranks
     * split it (0 for one process): dropout draws by the whole batch's row, so a rank's slice
     * drops what one process running the whole batch would. */
    long row0, src_row0;
    /* Distillation: another model's logits for the target rows, in row order ([targets][vocab]),
     * which become the targets (backend cross_entropy); NULL: the tokens are. writes_teacher: this
     * pass is that model's own: it fills teacher_logits and computes no loss. */
    float *teacher_logits;
    int writes_teacher;
} qlm_train_batch;

/* An adapter being trained: its A and B (F32) are the parameters; grad has the same layout as
 * adapter->buffer (A and B gradients at the same offsets). Dropout on each adapted module's
 * input, drawn from dropout_seed (the trainer changes it every pass). */
typedef struct {
    struct qlm_lora_adapter *adapter;
    float *grad;
    float dropout;
    uint64_t dropout_seed;
} qlm_lora_train;

/* The gradient of A (or B) of a module: same offset in grad as the weight in adapter->buffer. */
float *qlm_lora_train_grad(const qlm_lora_train *t, const void *weight_data);

#endif
