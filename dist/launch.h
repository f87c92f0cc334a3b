/* How this process was started — alone, by mpirun, or by torchrun/SLURM-style variables — and
 * the job's world communicator over the transport that fits the device: MPI for the CPU, NCCL for
 * GPUs (its unique id broadcast over MPI under mpirun, else through a TCP rendezvous at
 * MASTER_ADDR:MASTER_PORT). */
#ifndef QLM_LAUNCH_H
#define QLM_LAUNCH_H

#include "comm.h"
#include "transport.h"

typedef enum { QLM_LAUNCH_SINGLE, QLM_LAUNCH_MPI, QLM_LAUNCH_ENV } qlm_launch_kind;

typedef struct {
    qlm_launch_kind kind;
    int rank, size;             /* in the job */
    int local_rank, local_size; /* on this machine */
    char master_addr[256];      /* QLM_LAUNCH_ENV: the rendezvous */
    int master_port;
} qlm_launch;

/* Reads the launcher's variables: Open MPI's OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE (MPICH, Slurm's
 * PMI), or RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE with MASTER_ADDR/MASTER_PORT (torchrun;
 * Slurm's SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID stand in for the first three). Inconsistent
 * values are an error naming the variable. */
int qlm_launch_detect(qlm_launch *l);

/* The deadline of every collective wait, in seconds: QLM_DIST_TIMEOUT, else 600 (PyTorch's NCCL
 * default: a rank writing a large checkpoint keeps the others waiting for minutes). */
double qlm_dist_default_timeout(void);

/* The world communicator for a job on backend be: a group of one when launched alone. */
qlm_comm *qlm_dist_world(const qlm_launch *l, const qlm_backend *be, double timeout_s);

/* Transports (dist/transport_mpi.c; cuda/transport_nccl.cu, or an error without CUDA). The NCCL
 * world takes its unique id from rank 0 over bootstrap (an MPI world, which it then owns and
 * closes) or, when bootstrap is NULL, through the TCP rendezvous of l. */
qlm_transport *qlm_transport_mpi_world(void);
qlm_transport *qlm_transport_nccl_world(const qlm_launch *l, qlm_transport *bootstrap, double timeout_s);

/* Rank 0 sends bytes to ranks 1..size-1 over TCP: rank 0 listens on addr:port, the others connect
 * (retrying until the deadline) and say their rank. For starting NCCL without MPI. */
int qlm_rendezvous_broadcast(const char *addr, int port, int rank, int size, void *bytes, size_t n, double timeout_s);

#endif
