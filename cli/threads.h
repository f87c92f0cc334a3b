/* How many OpenMP threads a command runs. Threads that wait at a barrier for one the kernel has
 * descheduled spin for nothing, so on a machine other programs keep busy the default of one
 * thread per core is the slowest choice (a 2-core VM under load: 16x slower than one thread). */
#ifndef QLM_CLI_THREADS_H
#define QLM_CLI_THREADS_H

/* Sets and returns the thread count: requested (--threads) when > 0, else OMP_NUM_THREADS when
 * set, else the cores this process may run on divided among the local_ranks processes of the job
 * on this machine, less the cores other programs keep busy now (judged only when the process is
 * alone, since a job's own ranks are that load). Says on stderr when the load took threads away,
 * unless quiet. */
int cli_threads_apply(int requested, int local_ranks, int quiet);

#endif
