/* rt_mpi.h — private to the cpu target's MPI files: the control plane
 * (ctl_mpi.c) and the step's collectives (comm.c).  The target-neutral core
 * never includes it. */
#ifndef FSDPC_RT_MPI_H
#define FSDPC_RT_MPI_H

#include <limits.h>
#include <stddef.h>
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

/* The watchdog (wd_mpi.c): a thread that reads the progress record
 * (rt_priv.h) every 100 ms.  When one wait makes no progress for
 * FSDPC_STEP_TIMEOUT seconds it asks every other rank for its record over a
 * UDP side channel, prints one line naming this rank, the step, the wait
 * and the ranks that did not arrive (no answer within 1.5 s: stopped, or
 * hung in a system call; or behind: their step and what they do), and
 * brings the job down (rt_fatal: MPI_Abort).  It answers the other ranks'
 * questions, and only its peers' (their address, port and the job's token).
 * ctl_mpi.c's rt_ctl_init calls rt_wd_open on every rank (world > 1: the
 * sockets, not yet bound; 0, or -1 with a one-line reason in err), then, once
 * every rank's succeeded, rt_wd_start (collective: host names, then the bound
 * addresses, by MPI_Allgather; then the thread; fatal on failure); rt_ctl_finalize calls
 * rt_wd_stop after a closing barrier.  rt_wd_stop also undoes a lone
 * rt_wd_open. */
int rt_wd_open(int rank, int world, double timeout_s, char *err, size_t errlen);
void rt_wd_start(void);
void rt_wd_stop(void);

#endif
