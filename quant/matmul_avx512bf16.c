/* The AVX-512 kernel table for CPUs that also have AVX512_BF16: BF16 weights through its dot
 * product (twice the multiply-adds per instruction of F32 FMA, and W is never converted). */
#define AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c"
#define AVX512_TABLE qlm_kernels_avx512bf16
#define AVX512_NAME "avx512bf16"
#define AVX512_DPBF16 1
#include "kernels_avx512.h"
