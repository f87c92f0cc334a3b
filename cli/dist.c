/* Launch, world and failure handling for the distributed commands. */
#include "dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "threads.h"

int cli_dist_start(cli_dist *d, const char *device, double timeout_s, int *threads, int quiet) {
    memset(d, 0, sizeof *d);
    d->size = 1;
    if (qlm_launch_detect(&d->launch) != 0) return -1;
    *threads = cli_threads_apply(*threads, d->launch.local_size, quiet || d->launch.rank != 0);
    const qlm_backend *be = qlm_backend_by_name(device && *device ? device : "cpu");
    if (!be) return -1;
    d->world = qlm_dist_world(&d->launch, be, timeout_s > 0 ? timeout_s : qlm_dist_default_timeout());
    if (!d->world) return -1;
    d->rank = d->world->rank;
    d->size = d->world->size;
    return 0;
}

int cli_dist_fail(cli_dist *d, const char *cmd) {
    if (d->size > 1) {
        fprintf(stderr, "qlm %s: rank %d: %s\n", cmd, d->rank, qlm_last_error());
        qlm_comm_abort(d->world, 1);
    }
    fprintf(stderr, "qlm %s: %s\n", cmd, qlm_last_error());
    return 1;
}

void cli_dist_end(cli_dist *d) {
    qlm_comm_free(d->world);
    d->world = NULL;
}

int cli_dist_shard(cli_dist *d, qlm_model *m, int prefetch) {
    if (d->size == 1) return 0;
    qlm_param *p = NULL;
    qlm_unit *u = NULL;
    int n_params = 0, n_units = qlm_model_units(m, &p, &n_params, &u);
    if (n_units < 0) return -1;
    qlm_cut *cuts = malloc((size_t)n_units * (d->size + 1) * sizeof *cuts);
    d->order = malloc((size_t)(n_units + 1) * sizeof *d->order);
    if (!cuts || !d->order) {
        free(p), free(u), free(cuts);
        return qlm_errorf("out of memory");
    }
    for (int k = 0; k < n_units; k++) qlm_cuts_make(p + u[k].first, u[k].count, d->size, cuts + (size_t)k * (d->size + 1));
    /* A forward pass: the embedding (unit 0), every layer, the head (unit 0 again). */
    for (int k = 0; k < n_units; k++) d->order[k] = k;
    d->order[n_units] = 0;
    d->n_order = n_units + 1;
    int rc = qlm_layout_init(&d->layout, p, n_params, u, n_units, cuts, d->size, d->rank);
    free(cuts);
    if (rc != 0) return -1;
    d->shard = qlm_shard_new(d->world, m->be, &d->layout, 1, NULL, prefetch);
    if (!d->shard) return -1;
    qlm_shard_set_lockstep(d->shard);
    m->hooks = qlm_shard_hooks(d->shard);
    return 0;
}

int cli_dist_drain(cli_dist *d) { return d->shard ? qlm_shard_drain(d->shard, d->order, d->n_order) : 0; }

void cli_dist_unshard(cli_dist *d, qlm_model *m) {
    if (!d->shard && !d->order) return;
    m->hooks = NULL;
    qlm_shard_free(d->shard);
    qlm_layout_free(&d->layout);
    free(d->order);
    d->shard = NULL;
    d->order = NULL;
}

void cli_reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

double cli_peak_rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    double kib = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kib = strtod(line + 6, NULL);
    fclose(f);
    return kib < 0 ? -1 : kib / 1024.0;
}
