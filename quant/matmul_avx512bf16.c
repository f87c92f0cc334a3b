/* The AVX-512 kernel table for CPUs that also have AVX512_BF16 and AVX512_VNNI (every CPU with
 * the first has the second): BF16 weights and I8 weights (with x in 16-bit integers) through
 * their dot products, twice the multiply-adds per instruction of F32 FMA, and W is never
 * converted to F32; W8A8 through VPDPBUSD. */
#define AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,fma,f16c"
#define AVX512_TABLE qlm_kernels_avx512bf16
#define AVX512_NAME "avx512bf16"
#define AVX512_VNNI 1
#define AVX512_BF16DP 1
#include "kernels_avx512.h"
