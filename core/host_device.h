/* QLM_HD marks an inline function that both compilers build: the C compiler for the CPU backend,
 * nvcc for the CUDA one (host and device), so that what the two backends compute is one definition. */
#ifndef QLM_HOST_DEVICE_H
#define QLM_HOST_DEVICE_H

#ifdef __CUDACC__
#define QLM_HD __host__ __device__
#else
#define QLM_HD
#endif

#endif
