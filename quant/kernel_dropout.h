/* Dropout for the SIMD kernel tables: core/train_formulas.h's draw (qlm_dropout_drops) for
 * DROPOUT_LANES elements at a time, in the compiler's generic vectors of 64-bit counters, which
 * the includer's target turns into its own instructions. The draws are integer arithmetic, so
 * every table drops the elements the scalar formula and the CUDA kernel drop. Included by
 * kernels_avx2.h (4 lanes) and kernels_avx512.h (8) after they define KERNEL_FN and
 * DROPOUT_LANES. */
#include "../core/train_formulas.h"

typedef uint64_t dropout_u64 __attribute__((vector_size(DROPOUT_LANES * 8)));
typedef int64_t dropout_i64 __attribute__((vector_size(DROPOUT_LANES * 8)));
typedef int32_t dropout_i32 __attribute__((vector_size(DROPOUT_LANES * 4)));
typedef float dropout_f32 __attribute__((vector_size(DROPOUT_LANES * 4)));

/* See qlm_kernel_table.dropout. */
KERNEL_FN void dropout(float *out, const float *x, long n, float keep_scale, uint64_t base, uint64_t threshold,
                       long first) {
    dropout_u64 counter;
    for (int l = 0; l < DROPOUT_LANES; l++) counter[l] = base + (uint64_t)(first + l) * QLM_DROPOUT_STEP;
    long i = 0;
    for (; i + DROPOUT_LANES <= n; i += DROPOUT_LANES, counter += (uint64_t)DROPOUT_LANES * QLM_DROPOUT_STEP) {
        dropout_u64 z = counter;
        QLM_MIX64_IN_PLACE(z);
        const dropout_i32 drop = __builtin_convertvector((dropout_i64)(z < threshold), dropout_i32);
        dropout_f32 v;
        memcpy(&v, x + i, sizeof v);
        v = (dropout_f32)((dropout_i32)(v * keep_scale) & ~drop);
        memcpy(out + i, &v, sizeof v);
    }
    for (; i < n; i++) out[i] = qlm_dropout_drops(base, first + i, threshold) ? 0.0f : x[i] * keep_scale;
}
