/* Launch detection and the world communicator. */
#include "launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

/* An integer variable: 1 when set (into *out), 0 when absent, -1 (message set) when malformed. */
static int env_int(const char *name, int lo, int hi, int *out) {
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) return qlm_errorf("%s=%s is not an integer in %d..%d", name, v, lo, hi);
    *out = (int)x;
    return 1;
}

/* The rank on this machine and the ranks there, where the variables are set. */
static int read_local(const char *lrank_var, const char *lsize_var, qlm_launch *l) {
    if (env_int(lrank_var, 0, 1 << 20, &l->local_rank) < 0 || env_int(lsize_var, 1, 1 << 20, &l->local_size) < 0)
        return -1;
    if (l->local_rank >= l->local_size) l->local_size = l->local_rank + 1;
    return 0;
}

/* Reads rank and size variables; *found 1 when the rank variable is set. */
static int read_pair(const char *rank_var, const char *size_var, const char *lrank_var, const char *lsize_var,
                     qlm_launch *l, int *found) {
    int r = env_int(rank_var, 0, 1 << 20, &l->rank);
    if (r <= 0) return *found = 0, r;
    *found = 1;
    int s = env_int(size_var, 1, 1 << 20, &l->size);
    if (s < 0) return -1;
    if (s == 0) return qlm_errorf("%s is set but %s is not", rank_var, size_var);
    if (l->rank >= l->size) return qlm_errorf("%s=%d is not below %s=%d", rank_var, l->rank, size_var, l->size);
    l->local_rank = 0, l->local_size = 1;
    return read_local(lrank_var, lsize_var, l);
}

int qlm_launch_detect(qlm_launch *l) {
    memset(l, 0, sizeof *l);
    l->size = l->local_size = 1;
    int found = 0;
    if (read_pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE", l, &found) != 0)
        return -1;
    if (!found) {
        if (read_pair("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", l, &found) != 0) return -1;
        /* Slurm's srun (PMI-2) sets PMI_RANK but not MPICH's local rank: without Slurm's own, every
         * rank of a machine would take its first GPU. */
        if (found && !getenv("MPI_LOCALRANKID") && read_local("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", l) != 0)
            return -1;
    }
    if (found) {
        l->kind = QLM_LAUNCH_MPI;
        return 0;
    }
    if (read_pair("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", l, &found) != 0) return -1;
    if (!found && getenv("MASTER_ADDR") &&
        read_pair("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", l, &found) != 0)
        return -1;
    if (!found) {
        memset(l, 0, sizeof *l);
        l->size = l->local_size = 1;
        return 0;
    }
    l->kind = QLM_LAUNCH_ENV;
    const char *addr = getenv("MASTER_ADDR");
    if (l->size > 1) {
        if (!addr || !*addr) return qlm_errorf("RANK/WORLD_SIZE are set but MASTER_ADDR is not (the rendezvous host)");
        if (strlen(addr) >= sizeof l->master_addr) return qlm_errorf("MASTER_ADDR is too long");
        int port = 0;
        int r = env_int("MASTER_PORT", 1, 65535, &port);
        if (r < 0) return -1;
        if (r == 0) return qlm_errorf("RANK/WORLD_SIZE are set but MASTER_PORT is not (the rendezvous port)");
        /* torchrun's agent keeps its own store listening at MASTER_PORT for the whole job, and says
         * so in its workers' TORCHELASTIC_USE_AGENT_STORE: the rendezvous takes the next port. */
        const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
        if (agent && strcmp(agent, "True") == 0) {
            if (port == 65535)
                return qlm_errorf("MASTER_PORT=65535 is torchrun's store: qlm's rendezvous needs the port after it");
            port++;
        }
        snprintf(l->master_addr, sizeof l->master_addr, "%s", addr);
        l->master_port = port;
    }
    return 0;
}

double qlm_dist_default_timeout(void) {
    const char *v = getenv("QLM_DIST_TIMEOUT");
    if (v && *v) {
        char *end;
        double t = strtod(v, &end);
        if (!*end && t > 0 && t < 1e7) return t;
        fprintf(stderr, "qlm: QLM_DIST_TIMEOUT=%s is not a positive number of seconds; using 600\n", v);
    }
    return 600;
}

qlm_comm *qlm_dist_world(const qlm_launch *l, const qlm_backend *be, double timeout_s) {
    qlm_transport *tp = NULL;
    if (l->size > 1) {
        int gpu = !be->host_memory;
        if (l->kind == QLM_LAUNCH_ENV && !gpu) {
            qlm_errorf("a launch by RANK/WORLD_SIZE variables runs on GPUs over NCCL; on CPUs start the ranks "
                       "with mpirun");
            return NULL;
        }
        qlm_transport *mpi = NULL;
        if (l->kind == QLM_LAUNCH_MPI) {
            mpi = qlm_transport_mpi_world();
            if (!mpi) return NULL;
            if (mpi->size != l->size || mpi->rank != l->rank) {
                qlm_errorf("MPI says rank %d of %d, the launcher's variables %d of %d", mpi->rank, mpi->size, l->rank,
                           l->size);
                mpi->close(mpi);
                return NULL;
            }
        }
        tp = gpu ? qlm_transport_nccl_world(l, mpi, timeout_s) : mpi;
        if (!tp) {
            if (gpu && mpi) mpi->close(mpi);
            return NULL;
        }
    }
    qlm_comm *c = qlm_comm_new(tp, be, timeout_s);
    if (!c && tp) tp->close(tp);
    return c;
}
