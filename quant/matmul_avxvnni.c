/* The AVX2 kernel table for CPUs that also have AVX-VNNI (Alder Lake and later client CPUs,
 * without AVX-512): W8A8's byte products through VEX-encoded VPDPBUSD in ymm registers. */
#define AVX2_TARGET "avx2,fma,f16c,avxvnni"
#define AVX2_TABLE qlm_kernels_avxvnni
#define AVX2_NAME "avxvnni"
#define AVX2_VNNI 1
#include "kernels_avx2.h"
