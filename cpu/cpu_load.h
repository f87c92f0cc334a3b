/* How busy other programs keep the machine's cores, for choosing a thread count. */
#ifndef QLM_CPU_LOAD_H
#define QLM_CPU_LOAD_H

/* Runnable threads of other programs now: the fewest of 5 samples 2 ms apart (a moment's fork or
 * exit is not load) of the kernel's running count (/proc/loadavg) less this process's own runnable
 * threads (/proc/self/task), which include libraries' pools: OpenBLAS's spin for a while after it
 * loads. -1 when /proc cannot tell. Takes about 10 ms. */
int qlm_cpu_others_running(void);

#endif
