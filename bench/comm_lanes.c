/* comm_lanes.c — should the cpu target's communication thread become two (a gathers' and a reductions', as the
 * cuda target's two streams)?  Times, between the ranks of one machine, an all-gather of N float32 then the
 * reduction comm.c runs for a reduce-scatter (MPI_Allreduce of the full buffer, Open MPI's faster one): one thread
 * issuing both in turn (today's communication thread), against two threads issuing one each at once on
 * communicators of their own (MPI_THREAD_MULTIPLE).
 *
 *   mpicc -O2 bench/comm_lanes.c -lpthread -o comm_lanes
 *   mpirun --bind-to none -np 2 ./comm_lanes 8388608
 *
 * Each of 12 repetitions runs both sides, in turn; the first two are warm-up; prints the best of the rest per
 * side (wall-clock between barriers).
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static MPI_Comm g_ag, g_rs;   /* one communicator per side of the pair */
static float *g_full, *g_shard, *g_grad;
static int g_n, g_world;      /* a shard's floats; ranks */

static void *gather(void *arg)
{
    (void)arg;
    MPI_Allgather(g_shard, g_n, MPI_FLOAT, g_full, g_n, MPI_FLOAT, g_ag);
    return NULL;
}

static void *reduce(void *arg)
{
    (void)arg;
    MPI_Allreduce(MPI_IN_PLACE, g_grad, g_n * g_world, MPI_FLOAT, MPI_SUM, g_rs);
    return NULL;
}

/* the pair's wall-clock seconds: in turn on this thread (two = 0), or at once on two threads */
static double pair(int two)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (!two) {
        gather(NULL);
        reduce(NULL);
    } else {
        pthread_t a, b;
        if (pthread_create(&a, NULL, gather, NULL) || pthread_create(&b, NULL, reduce, NULL))
            MPI_Abort(MPI_COMM_WORLD, 1);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return MPI_Wtime() - t0;
}

int main(int argc, char **argv)
{
    int provided, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    long total = argc > 1 ? atol(argv[1]) : 8388608;
    if (provided < MPI_THREAD_MULTIPLE || total < g_world || total / g_world > 1 << 28) {
        if (!rank)
            fprintf(stderr, "comm_lanes: needs MPI_THREAD_MULTIPLE and 1 <= N / ranks <= 2^28 floats\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    g_n = (int)(total / g_world);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_ag);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_rs);
    g_full = calloc((size_t)g_n * g_world, 4);
    g_shard = calloc((size_t)g_n, 4);
    g_grad = calloc((size_t)g_n * g_world, 4);
    if (!g_full || !g_shard || !g_grad)
        MPI_Abort(MPI_COMM_WORLD, 1);
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 12; rep++)
        for (int two = 0; two < 2; two++) {
            double t = pair(two);
            if (rep >= 2 && t < best[two])
                best[two] = t;
        }
    if (!rank)
        printf("%d ranks, %ld floats: one thread %.2f ms, two threads %.2f ms (%.2fx)\n", g_world,
               (long)g_n * g_world, best[0] * 1e3, best[1] * 1e3, best[1] / best[0]);
    MPI_Comm_free(&g_ag);
    MPI_Comm_free(&g_rs);
    MPI_Finalize();
    return 0;
}
