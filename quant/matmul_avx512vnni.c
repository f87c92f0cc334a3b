/* The AVX-512 kernel table for CPUs with AVX512_VNNI but not AVX512_BF16 (Cascade Lake, Ice
 * Lake): I8 weights through VPDPWSSD, twice the multiply-adds per instruction of VPMADDWD and
 * VPADDD; BF16 weights as in the plain AVX-512 table. */
#define AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c"
#define AVX512_TABLE qlm_kernels_avx512vnni
#define AVX512_NAME "avx512vnni"
#define AVX512_VNNI 1
#define AVX512_BF16DP 0
#include "kernels_avx512.h"
