/* The command line's side of a job split over processes: the launch, the world communicator,
 * threads per rank, who prints, and ending every rank when one fails. */
#ifndef QLM_CLI_DIST_H
#define QLM_CLI_DIST_H

#include "../models/model.h"
#include "../dist/launch.h"
#include "../dist/shard.h"

typedef struct {
    qlm_launch launch;
    qlm_comm *world; /* a group of one when launched alone */
    int rank, size;
    /* Sharded inference: the model's units split over the world, gathered around their use. */
    qlm_layout layout;
    qlm_shard *shard;
    int *order, n_order; /* a forward pass's units in order, for draining */
} cli_dist;

/* Detects the launch and opens the world on the device's backend. *threads (0: not given) becomes
 * the count cli_threads_apply chooses (saying why unless quiet). timeout_s: each collective's
 * deadline (0: QLM_DIST_TIMEOUT or 300). */
int cli_dist_start(cli_dist *d, const char *device, double timeout_s, int *threads, int quiet);
/* Prints "qlm CMD: rank R: <error>" (no rank with one process); with several ranks ends the whole
 * job, since the others would wait for this one. Returns 1. */
int cli_dist_fail(cli_dist *d, const char *cmd);
/* Closes the world (the last call of a distributed command). */
void cli_dist_end(cli_dist *d);

/* Sharded inference (FSDP): each rank keeps 1/N of every unit of m and gathers a unit just before
 * the forward pass runs it, prefetching the next; the ranks run their passes in lockstep. A rank
 * whose work is done calls cli_dist_drain, which joins the others' passes until all are done.
 * unshard: before the model is freed. */
int cli_dist_shard(cli_dist *d, qlm_model *m, int prefetch);
int cli_dist_drain(cli_dist *d);
void cli_dist_unshard(cli_dist *d, qlm_model *m);

/* Resets this process's peak RSS (Linux VmHWM) to its current RSS, and reads it in MiB (-1 when
 * /proc cannot tell): the peak of a phase, such as the training steps after set-up. */
void cli_reset_peak_rss(void);
double cli_peak_rss_mib(void);

#endif
