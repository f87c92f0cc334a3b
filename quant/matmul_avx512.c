/* The AVX-512 kernel table (F + BW + VL): BF16 weights through F32 conversion and FMA, I8 weights
 * through VPMADDWD. */
#define AVX512_TARGET "avx512f,avx512bw,avx512vl,fma,f16c"
#define AVX512_TABLE qlm_kernels_avx512
#define AVX512_NAME "avx512"
#define AVX512_VNNI 0
#define AVX512_BF16DP 0
#include "kernels_avx512.h"
