/* The AVX-512 kernel table for CPUs with AMX (Sapphire Rapids and later, which also have
 * AVX512_BF16): avx512bf16's kernels, with W8A8's Q8_0 calls of 16 rows of x or more through
 * AMX's integer tiles (kernel_w8a8_amx.h), whose sums, and so results, are VPDPBUSD's, BF16
 * weights through its BF16 tiles, which round their own way, and INT8 weights through its integer
 * tiles, whose sums are exact (kernel_amx.h). */
#define AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,fma,f16c,amx-tile,amx-int8,amx-bf16"
#define AVX512_TABLE qlm_kernels_amx
#define AVX512_NAME "amx"
#define AVX512_VNNI 1
#define AVX512_BF16DP 1
#define AVX512_AMX 1
#include "kernels_avx512.h"
