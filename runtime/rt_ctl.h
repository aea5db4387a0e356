/* rt_ctl.h — the control plane: ranks, and the small host-side collectives
 * the runtime needs outside the step (start-up agreement, broadcasts of
 * small values, gathering shards for export).  Private to runtime/.
 *
 * Two implementations, one per target:
 *   ctl_mpi.c  (cpu)  MPI_COMM_WORLD; the step's collectives are MPI too.
 *   ctl_tcp.c  (cuda) no MPI: rank and world from the environment
 *                     (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/
 *                     NTASKS, or RANK/WORLD_SIZE), rendezvous by
 *                     --rendezvous file:PATH or MASTER_ADDR/MASTER_PORT, then a
 *                     star of TCP connections to rank 0.  World 1 needs
 *                     nothing.  Every call has a timeout: a rank that dies or
 *                     disagrees brings the others down with a message instead
 *                     of a hang.
 * All functions are collective (every rank calls them in the same order)
 * and fatal on failure (message, then every rank exits non-zero).
 */
#ifndef FSDPC_RT_CTL_H
#define FSDPC_RT_CTL_H

#include <stddef.h>
#include <stdint.h>

enum { RT_CTL_MIN, RT_CTL_MAX, RT_CTL_SUM };

/* Start the control plane.  rendezvous: the --rendezvous value or NULL
 * (ignored by ctl_mpi.c).  Returns 0 with *rank, *world set, or -1 with a
 * one-line reason in err (the caller prints it and exits 1). */
int rt_ctl_init(int *argc, char ***argv, const char *rendezvous, int *rank, int *world, char *err,
                size_t errlen);
void rt_ctl_finalize(void);
/* bring every rank down with exit status code (after this rank's message) */
_Noreturn void rt_ctl_abort(int code);
/* in place over all ranks, n int64 values */
void rt_ctl_allreduce_i64(int64_t *x, int n, int op);
/* root's bytes to every rank */
void rt_ctl_bcast(void *buf, int64_t bytes, int root);
/* every rank's `bytes` bytes into all (world * bytes, rank-major) on root
 * (all is only touched on root; any size: large shards are chunked) */
void rt_ctl_gather(const void *mine, int64_t bytes, void *all, int root);

#endif
