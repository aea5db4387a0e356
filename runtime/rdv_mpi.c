/* rdv_mpi.c — the cuda target's rendezvous through MPI, without linking MPI.
 *
 * Under mpirun or srun across nodes, the ranks of a cuda executable know
 * their rank from the launcher's environment but not where rank 0 listens.
 * MPI does: this file loads Open MPI's library at run time (dlopen; the
 * executable never links it, so it still starts where there is no MPI),
 * runs MPI_Init, broadcasts rank 0's "HOST PORT" line and finalizes, under
 * start-up's guard (guard.c: FSDPC_START_TIMEOUT).  The
 * TCP control plane (ctl_tcp.c) then connects as with a rendezvous file,
 * and the NCCL id travels over it.
 *
 * Only Open MPI's ABI is spoken (its handles are the addresses of the
 * exported objects ompi_mpi_comm_world and ompi_mpi_byte); the library is
 * $FSDPC_MPI_LIB if set ("none": never load one), else libmpi.so.40.
 */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_priv.h"

typedef int (*InitFn)(int *, char ***);
typedef int (*FinalizeFn)(void);
typedef int (*CommIntFn)(void *, int *);
typedef int (*BcastFn)(void *, int, void *, int, void *);

int rt_rdv_mpi(char *line, int cap, int rank, int world, char *err, size_t errlen)
{
    const char *lib = getenv("FSDPC_MPI_LIB");
    if (lib && strcmp(lib, "none") == 0)
        return 0;
    if (lib && strchr(lib, '/')) { /* a path: dlopen's open would wait on a FIFO */
        struct stat st;
        int fd = rt_open_regular(lib, &st);
        if (fd < 0) {
            snprintf(err, errlen, "rank %d: FSDPC_MPI_LIB=%.200s: %s", rank, lib, rt_open_why(fd));
            return -1;
        }
        close(fd);
    }
    void *h = dlopen(lib && *lib ? lib : "libmpi.so.40", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        if (!lib || !*lib)
            return 0; /* no MPI here: not an error, the caller has other ways */
        snprintf(err, errlen, "rank %d: FSDPC_MPI_LIB=%.200s: %.300s", rank, lib, dlerror());
        return -1;
    }
    /* POSIX lets a void * from dlsym become a function pointer */
    InitFn init;
    FinalizeFn fin;
    CommIntFn comm_rank, comm_size;
    BcastFn bcast;
    *(void **)&init = dlsym(h, "MPI_Init");
    *(void **)&fin = dlsym(h, "MPI_Finalize");
    *(void **)&comm_rank = dlsym(h, "MPI_Comm_rank");
    *(void **)&comm_size = dlsym(h, "MPI_Comm_size");
    *(void **)&bcast = dlsym(h, "MPI_Bcast");
    void *world_comm = dlsym(h, "ompi_mpi_comm_world"), *byte = dlsym(h, "ompi_mpi_byte");
    if (!init || !fin || !comm_rank || !comm_size || !bcast || !world_comm || !byte) {
        snprintf(err, errlen, "rank %d: %s is not Open MPI's library (only Open MPI is supported for the "
                 "rendezvous; pass --rendezvous file:PATH or tcp:HOST:PORT, or set MASTER_ADDR/MASTER_PORT)", rank,
                 lib && *lib ? lib : "libmpi.so.40");
        return -1;
    }
    int r = -1, n = -1;
    rt_guard_start("MPI_Init (the rendezvous through MPI)"); /* guard.c: a rank that never arrives */
    if (init(NULL, NULL) != 0 || comm_rank(world_comm, &r) != 0 || comm_size(world_comm, &n) != 0) {
        rt_guard_stop();
        snprintf(err, errlen, "rank %d: MPI_Init failed (rendezvous through MPI)", rank);
        return -1;
    }
    rt_guard_phase("the rendezvous's MPI_Bcast of rank 0's address");
    int rc = 0;
    if (r != rank || n != world) {
        snprintf(err, errlen, "rank %d of %d (from the environment): MPI says rank %d of %d; launch with mpirun or "
                 "srun, or pass --rendezvous", rank, world, r, n);
        rc = -1;
    } else if (bcast(line, cap, byte, 0, world_comm) != 0) {
        snprintf(err, errlen, "rank %d: MPI_Bcast of rank 0's address failed", rank);
        rc = -1;
    }
    line[cap - 1] = 0;
    fin();
    rt_guard_stop();
    /* never dlclose: Open MPI's library does not support being unloaded */
    return rc == 0 ? 1 : -1;
}
