/* Measures the machine's sustainable memory read bandwidth, the bound for memory-bound
 * kernels such as decode GEMV. */
#ifndef QLM_MEMBW_H
#define QLM_MEMBW_H

/* Best of several timed read passes over a buffer far larger than the caches, split over
 * omp_get_max_threads() threads. Returns GB/s (1e9 bytes per second), or -1 with an error
 * set when the buffer cannot be allocated. Takes about a quarter of a second. */
double qlm_measure_bandwidth_gbs(void);

#endif
