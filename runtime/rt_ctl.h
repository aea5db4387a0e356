/* rt_ctl.h — the control plane: ranks, and the small host-side collectives
 * the runtime needs outside the step (start-up agreement, broadcasts of
 * small values, gathering shards for export).  Private to runtime/.
 *
 * Two implementations, one per target:
 *   ctl_mpi.c  (cpu)  MPI_COMM_WORLD; the step's collectives are MPI too.
 *                     A watchdog thread (wd_mpi.c) ends a job whose
 *                     collective makes no progress for FSDPC_STEP_TIMEOUT
 *                     seconds, naming the ranks that did not arrive.
 *   ctl_tcp.c  (cuda) no MPI: rank and world from the environment
 *                     (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/
 *                     NTASKS, or RANK/WORLD_SIZE; the first found wins),
 *                     rendezvous by --rendezvous file:PATH or tcp:HOST:PORT,
 *                     MASTER_ADDR/MASTER_PORT, or (under mpirun) a file in
 *                     /tmp, then a star of TCP connections to rank 0.  World
 *                     1 needs nothing.  Every blocking call has a timeout
 *                     (FSDPC_CTL_TIMEOUT seconds, default 300; rendezvous
 *                     FSDPC_CTL_CONNECT_TIMEOUT, default 120), and a
 *                     watchdog thread notices a peer that exits or aborts
 *                     while this rank is elsewhere (in the step): a rank
 *                     that dies or disagrees brings the others down with a
 *                     message instead of a hang.
 * Collectives are called by the main thread only; every rank calls them in
 * the same order.  They are fatal on failure (a one-line message, then
 * every rank exits non-zero).
 */
#ifndef FSDPC_RT_CTL_H
#define FSDPC_RT_CTL_H

#include <stddef.h>
#include <stdint.h>

enum { RT_CTL_MIN, RT_CTL_MAX, RT_CTL_SUM };

/* Start the control plane.  rendezvous: the --rendezvous value or NULL
 * (ctl_mpi.c takes none).  key: the executable's identity (RtModel.id);
 * ranks with different keys are refused ("rank 3 runs another executable
 * ...").  Returns 0 with *rank, *world set, or -1 with a one-line reason in
 * err ("" when another rank prints it); the caller prints a non-empty err,
 * then calls rt_ctl_finalize (which may hold the ranks together until every
 * message is written) and exits 1.  A peer lost or
 * silent during start-up ends the process as in the collectives below. */
int rt_ctl_init(int *argc, char ***argv, const char *rendezvous, uint64_t key, int *rank, int *world,
                char *err, size_t errlen);
/* may the step's collectives be called from another thread than the one
 * that called rt_ctl_init (one at a time, never beside a control-plane call:
 * the communication thread)?  after init */
int rt_ctl_threads(void);
/* the ranks on this rank's node (0: unknown); after init */
int rt_ctl_local_size(void);
/* this rank's index among the ranks of its node (picks the GPU); after init */
int rt_ctl_local_rank(void);
/* collective: the end of a run that reached it on every rank */
void rt_ctl_finalize(void);
/* Bring every rank down with exit status code (after this rank's message;
 * any thread; stdio is flushed).  The other ranks exit non-zero within
 * seconds: MPI_Abort (ctl_mpi.c); told by rank 0, quietly with the same
 * code, or, where the message was lost, naming the rank that vanished
 * (ctl_tcp.c). */
_Noreturn void rt_ctl_abort(int code);
/* in place over all ranks, n int64 values */
void rt_ctl_allreduce_i64(int64_t *x, int n, int op);
/* root's bytes to every rank */
void rt_ctl_bcast(void *buf, int64_t bytes, int root);
/* every rank's `bytes` bytes into all (world * bytes, rank-major) on root
 * (all is only touched on root; any size: large shards are chunked) */
void rt_ctl_gather(const void *mine, int64_t bytes, void *all, int root);

#endif
