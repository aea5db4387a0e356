/* rt_mpi.h — private to the cpu target's MPI files: the control plane
 * (ctl_mpi.c) and the step's collectives (comm.c).  The target-neutral core
 * never includes it. */
#ifndef FSDPC_RT_MPI_H
#define FSDPC_RT_MPI_H

#include <limits.h>
#include <mpi.h>
#include <stdint.h>

/* Largest element count of one MPI call; overridable for tests of the chunked paths. */
#ifndef RT_MPI_CHUNK
#define RT_MPI_CHUNK INT_MAX
#endif

/* Report a failed MPI call and bring every rank down (rt_fatal).  Used
 * through RT_MPI. */
_Noreturn void rt_mpi_fail(const char *file, int line, const char *call, int rc);

#define RT_MPI(call)                                              \
    do {                                                          \
        int rt_rc_ = (call);                                      \
        if (rt_rc_ != MPI_SUCCESS)                                \
            rt_mpi_fail(__FILE__, __LINE__, #call, rt_rc_);       \
    } while (0)

/* Every rank's n elements of type t (es bytes each) into full (size of
 * comm * n elements, rank-major) on root, or on every rank when root < 0
 * (allgather; then mine may be MPI_IN_PLACE).  Counts beyond RT_MPI_CHUNK
 * are cut into several calls.  full is only written where it is gathered. */
void rt_mpi_gather(MPI_Comm comm, void *full, const void *mine, int64_t n, MPI_Datatype t, int64_t es, int root);

#endif
