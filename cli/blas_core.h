/* OpenBLAS's kernel choice on CPUs newer than the library. */
#ifndef QLM_CLI_BLAS_CORE_H
#define QLM_CLI_BLAS_CORE_H

/* When OpenBLAS fell back to its generic kernels on a CPU with AVX2 or AVX-512, runs the program
 * (argv) again with OPENBLAS_CORETYPE naming the kernels the CPU's features allow; returns only
 * when it did not (nothing to do, OPENBLAS_CORETYPE already set, or exec failed). */
void cli_blas_core_check(char **argv);

#endif
