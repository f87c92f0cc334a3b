/* OpenBLAS's settings that only the environment carries. */
#ifndef QLM_CLI_BLAS_CORE_H
#define QLM_CLI_BLAS_CORE_H

/* When OpenBLAS fell back to its generic kernels on a CPU with AVX2 or AVX-512, or started a
 * thread pool, runs the program (argv) again with OPENBLAS_CORETYPE naming the kernels the CPU's
 * features allow and OPENBLAS_NUM_THREADS=1; returns only when it did not (nothing to do, the
 * variables already set, or exec failed). */
void cli_blas_core_check(char **argv);

#endif
