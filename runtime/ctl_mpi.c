/* ctl_mpi.c — the control plane of the cpu target (rt_ctl.h) over
 * MPI_COMM_WORLD: MPI_Init_thread and MPI_Finalize, the small collectives of
 * start-up and export, aborts (MPI_Abort), and the chunked gather that
 * comm.c's allgather shares (rt_mpi.h).  Its collectives, like the step's
 * (dev_host.c), write the progress record (rt_priv.h) that the watchdog
 * (wd_mpi.c) reads: started here once the ranks agree, stopped after a
 * closing barrier.  Before it runs, start-up's guard (guard.c) bounds MPI's
 * start-up and the ranks' first agreement, which wait on every rank too.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_ctl.h"
#include "rt_mpi.h"
#include "rt_priv.h"

static int g_rank, g_world = 1, g_local, g_nlocal = 1, g_up, g_serialized;
static int g_watched; /* the watchdog runs */
static pthread_t g_main_thread;

_Noreturn void rt_mpi_fail(const char *file, int line, const char *call, int rc)
{
    rt_fatal_claim();
    char es[MPI_MAX_ERROR_STRING + 1];
    int n = 0;
    if (MPI_Error_string(rc, es, &n) != MPI_SUCCESS)
        n = snprintf(es, sizeof es, "MPI error %d", rc);
    es[n < 0 ? 0 : n > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : n] = 0;
    rt_fatal(1, "rank %d: %s:%d: %s failed: %s", g_rank, file, line, call, es);
}

/* every rank runs the executable of rank 0 (its key) and has no local
 * start-up error (mine: "" or its message); else -1 with the message in err
 * on the lowest failing rank ("" on the others) */
static int agree(uint64_t key, const char *mine, char *err, size_t errlen)
{
    uint64_t key0 = key;
    RT_MPI(MPI_Bcast(&key0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD));
    int bad = key0 != key || mine[0] ? g_rank : g_world, low = g_world;
    RT_MPI(MPI_Allreduce(&bad, &low, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (low == g_world)
        return 0;
    err[0] = 0;
    if (g_rank == low && key0 != key)
        snprintf(err, errlen, "rank %d runs another executable (key %016" PRIx64 "; rank 0 runs %016" PRIx64
                 "): start every rank with the same one", low, key, key0);
    else if (g_rank == low)
        snprintf(err, errlen, "%s", mine);
    return -1;
}

/* Whether a launcher (mpirun, srun, MPICH's hydra) started this process.
 * One that none started is a world of one and never initializes MPI: Open
 * MPI 4's singleton start-up forks a daemon and builds a session directory
 * for a job that has no one to talk to, and under load it sometimes aborts
 * ("Local abort before MPI_INIT completed"). */
static int launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_FD", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

int rt_ctl_init(int *argc, char ***argv, const char *rendezvous, uint64_t key, int *rank, int *world,
                char *err, size_t errlen)
{
    (void)rendezvous; /* mpirun / srun did it */
    g_main_thread = pthread_self();
    if (!launched()) {
        char mine[512] = "";
        double timeout, start; /* checked as under a launcher: a bad value is an error alone too */
        if (rt_start_timeout(&start, mine, sizeof mine) != 0 || rt_step_timeout(&timeout, mine, sizeof mine) != 0) {
            snprintf(err, errlen, "%s", mine);
            return -1;
        }
        g_serialized = 1; /* no MPI: any thread may run the (empty) collectives */
        *rank = 0;
        *world = 1;
        return 0;
    }
    int provided = 0;
    rt_guard_start("MPI_Init"); /* until the watchdog runs (guard.c) */
    /* SERIALIZED: the step's collectives run on the communication thread
     * (dev_host.c), the rest of MPI on this one, never both at once */
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Init failed (error %d)", rc);
        return -1;
    }
    g_serialized = provided >= MPI_THREAD_SERIALIZED;
    g_up = 1;
    rt_guard_phase("the ranks' first agreement (the executable, the watchdog's addresses)");
    RT_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    RT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    RT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &g_world));
    MPI_Comm node;
    RT_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    RT_MPI(MPI_Comm_rank(node, &g_local));
    RT_MPI(MPI_Comm_size(node, &g_nlocal));
    RT_MPI(MPI_Comm_free(&node));
    /* the watchdog's timeout and side channel */
    char mine[512] = "";
    double timeout, start;
    if (rt_start_timeout(&start, mine, sizeof mine) == 0 && rt_step_timeout(&timeout, mine, sizeof mine) == 0)
        rt_wd_open(g_rank, g_world, timeout, mine, sizeof mine);
    /* on failure MPI stays up: the caller prints err, then calls
     * rt_ctl_finalize, whose barrier keeps rank 0 from exiting (and mpirun
     * from killing the job) before the rank with the message has written it */
    if (agree(key, mine, err, errlen) != 0) {
        rt_wd_stop();
        return -1;
    }
    rt_wd_start();
    rt_guard_stop(); /* the watchdog watches from here */
    g_watched = g_world > 1;
    *rank = g_rank;
    *world = g_world;
    return 0;
}

int rt_ctl_local_rank(void) { return g_local; }

int rt_ctl_threads(void) { return g_serialized; }

int rt_ctl_local_size(void) { return g_nlocal; }

void rt_ctl_finalize(void)
{
    if (g_watched) { /* every rank is here before the watchdog stops: MPI_Finalize then waits on no one */
        rt_progress_begin(RT_WAIT_BARRIER);
        RT_MPI(MPI_Barrier(MPI_COMM_WORLD));
        rt_progress_end();
        rt_wd_stop();
        g_watched = 0;
    }
    if (g_up)
        MPI_Finalize();
    g_up = 0;
    rt_guard_stop(); /* after a start-up error: MPI_Finalize waited on the others under it */
}

_Noreturn void rt_ctl_abort(int code)
{
    rt_fatal_claim();
    fflush(stdout);
    fflush(stderr);
    if (g_world > 1)
        MPI_Abort(MPI_COMM_WORLD, code);
    if (g_up && pthread_equal(pthread_self(), g_main_thread))
        MPI_Finalize();
    exit(code);
}

void rt_ctl_allreduce_i64(int64_t *x, int n, int op)
{
    MPI_Op mop = op == RT_CTL_MIN ? MPI_MIN : op == RT_CTL_MAX ? MPI_MAX : MPI_SUM;
    if (n <= 0 || g_world == 1)
        return;
    rt_progress_begin(RT_WAIT_ALLREDUCE);
    RT_MPI(MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_INT64_T, mop, MPI_COMM_WORLD));
    rt_progress_end();
}

void rt_ctl_bcast(void *buf, int64_t bytes, int root)
{
    if (g_world == 1 || bytes <= 0)
        return;
    rt_progress_begin(RT_WAIT_BCAST);
    for (int64_t off = 0; off < bytes; off += RT_MPI_CHUNK) {
        int k = (int)(bytes - off < RT_MPI_CHUNK ? bytes - off : RT_MPI_CHUNK);
        RT_MPI(MPI_Bcast((char *)buf + off, k, MPI_BYTE, root, MPI_COMM_WORLD));
    }
    rt_progress_end();
}

void rt_ctl_gather(const void *mine, int64_t bytes, void *all, int root)
{
    rt_progress_begin(RT_WAIT_GATHER);
    rt_mpi_gather(MPI_COMM_WORLD, all, mine, bytes, MPI_BYTE, 1, root);
    rt_progress_end();
}

void rt_mpi_gather(MPI_Comm comm, void *full, const void *mine, int64_t n, MPI_Datatype t, int64_t es, int root)
{
    int W = 1, me = 0; /* without MPI (a world of one) every communicator is this rank */
    if (g_up) {
        RT_MPI(MPI_Comm_size(comm, &W));
        RT_MPI(MPI_Comm_rank(comm, &me));
    }
    int have_full = root < 0 || me == root;
    char *f = full;
    const char *s = mine;
    if (n <= 0)
        return;
    if (W == 1) {
        if (have_full && mine != MPI_IN_PLACE)
            memmove(f, s, (size_t)(n * es));
        return;
    }
    int64_t cmax = RT_MPI_CHUNK / W;
    if (cmax < 1)
        cmax = 1;
    if (n <= cmax) {
        if (root < 0)
            RT_MPI(MPI_Allgather(s, (int)n, t, f, (int)n, t, comm));
        else
            RT_MPI(MPI_Gather(s, (int)n, t, have_full ? f : NULL, (int)n, t, root, comm));
        return;
    }
    /* chunked: piece [off, off+k) of every rank; the receive type spans k
     * elements but has the extent of a whole shard, so rank r's piece goes
     * to full + (r*n + off)*es */
    for (int64_t off = 0; off < n; off += cmax) {
        int k = (int)(n - off < cmax ? n - off : cmax);
        MPI_Datatype piece, rtype;
        RT_MPI(MPI_Type_contiguous(k, t, &piece));
        RT_MPI(MPI_Type_create_resized(piece, 0, (MPI_Aint)(n * es), &rtype));
        RT_MPI(MPI_Type_commit(&rtype));
        const void *sb = mine == MPI_IN_PLACE ? MPI_IN_PLACE : (const void *)(s + off * es);
        if (root < 0)
            RT_MPI(MPI_Allgather(sb, k, t, f + off * es, 1, rtype, comm));
        else
            RT_MPI(MPI_Gather(sb, k, t, have_full ? f + off * es : NULL, 1, rtype, root, comm));
        RT_MPI(MPI_Type_free(&rtype));
        RT_MPI(MPI_Type_free(&piece));
    }
}
