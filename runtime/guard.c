/* guard.c — start-up's guard (rt_priv.h): a bound on the waits that come
 * before any watchdog runs.
 *
 * MPI_Init and the first collectives wait on every other rank: the cpu
 * target's control plane (ctl_mpi.c: MPI_Init_thread, the agreement on the
 * executable, the watchdog's own set-up) and the cuda target's rendezvous
 * through MPI (rdv_mpi.c: MPI_Init, the broadcast of rank 0's address).  A rank
 * stopped or lost there kept the others waiting for ever (measured: rank 1
 * SIGSTOPped in its first 0.3 s left rank 0 in ompi_mpi_init, and mpirun waits
 * on rank 0).  The guard is a thread that sleeps FSDPC_START_TIMEOUT seconds
 * (default 600) unless stopped; past them it prints one line naming the phase
 * the caller is in and exits 1, on which the launcher ends the job (its
 * SIGKILL ends a stopped rank too).  It exits rather than calling MPI_Abort:
 * MPI may be inside its own start-up on the main thread.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt_priv.h"

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int on, done;
    long rank;                   /* the launcher's, read at the start (no getenv on the guard's thread) */
    double timeout;
    _Atomic(const char *) phase; /* a static string */
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* this rank's number as the launcher set it (MPI may not be up), -1 if none is a number */
static long launcher_rank(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *s = getenv(vars[i]);
        char *end;
        if (!s || !*s)
            continue;
        errno = 0;
        long r = strtol(s, &end, 10);
        if (!*end && !errno && r >= 0 && r < (1L << 30))
            return r;
    }
    return -1;
}

static void *guard(void *arg)
{
    (void)arg;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    double whole = (double)(int64_t)g.timeout; /* at most 1e9 (rt_env_seconds): fits */
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((g.timeout - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g.mu);
    int rc = 0;
    while (!g.done && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&g.cv, &g.mu, &until);
    int late = !g.done;
    pthread_mutex_unlock(&g.mu);
    if (!late)
        return NULL;
    rt_fatal_claim();
    char who[32] = "?";
    if (g.rank >= 0)
        snprintf(who, sizeof who, "%ld", g.rank);
    fflush(stdout);
    fprintf(stderr, "%s: error: rank %s: start-up: %s made no progress for %g s (FSDPC_START_TIMEOUT): another "
            "rank did not arrive (stopped, killed, or never started): check that every rank started, or raise "
            "FSDPC_START_TIMEOUT for a slow launch\n", rt_prog, who, atomic_load(&g.phase), g.timeout);
    fflush(stderr);
    _exit(1);
}

void rt_guard_start(const char *phase)
{
    if (g.on)
        return;
    char err[512];
    if (rt_start_timeout(&g.timeout, err, sizeof err) != 0)
        g.timeout = 600; /* the bad value is the caller's to report (ctl_mpi.c does, once MPI is up) */
    atomic_store(&g.phase, phase);
    g.rank = launcher_rank();
    g.done = 0;
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        return;
    int ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&g.cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok)
        return;
    int rc = pthread_create(&g.thread, NULL, guard, NULL);
    if (rc != 0) { /* unguarded, as before the guard: said, not fatal */
        fprintf(stderr, "%s: warning: cannot start start-up's guard thread: %s\n", rt_prog, strerror(rc));
        pthread_cond_destroy(&g.cv);
        return;
    }
    g.on = 1;
}

void rt_guard_phase(const char *phase) { atomic_store(&g.phase, phase); }

void rt_guard_stop(void)
{
    if (!g.on)
        return;
    pthread_mutex_lock(&g.mu);
    g.done = 1;
    pthread_cond_signal(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(g.thread, NULL);
    pthread_cond_destroy(&g.cv);
    g.on = 0;
}
