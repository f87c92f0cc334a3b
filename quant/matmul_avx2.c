/* The AVX2 kernel table (with FMA and F16C): every x86-64 CPU qlm targets runs it. */
#define AVX2_TARGET "avx2,fma,f16c"
#define AVX2_TABLE qlm_kernels_avx2
#define AVX2_NAME "avx2"
#define AVX2_VNNI 0
#include "kernels_avx2.h"
