/* cuemu_nccl_test.c — the emulated NCCL (runtime/cuemu_nccl.c) between
 * separate processes (ctest cuemu_nccl).
 *
 * How it works.  The parent makes a ncclUniqueId and forks WORLD children
 * (before any CUDA call, so no thread is forked); each child is a rank with
 * its own emulated device.  Each rank checks, against values it computes
 * itself: all-reduce (sum and average; float32, float64, bfloat16), all-
 * gather and reduce-scatter (in place too), with buffers of several
 * staging chunks, enqueued on a non-blocking stream after the
 * non-blocking initialisation (polled as comm_nccl.c does; uploads go on
 * the same stream: a cudaMemcpy from pageable memory returns once the
 * bytes are staged, and the emulation, like a GPU, may write them after a
 * collective on another stream has read the buffer); a split into
 * even and odd ranks and an all-reduce over each half; two communicators
 * of the same ranks, each with a collective in flight on its own stream at
 * once, and a communicator refusing a second stream.  Then the last rank
 * exits without joining the next collective: the others must see an
 * asynchronous error (ncclRemoteError, and ncclGetLastError names the rank)
 * instead of hanging, and abort.  A child's exit status is its number of
 * failed checks; the parent fails if any child did, or was killed (it
 * reaps children in any order: an unreaped dead rank would look alive).
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

static int g_failed;
static int g_rank;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "cuemu_nccl_test.c:%d: rank %d: check failed: %s\n", __LINE__, g_rank, #cond); \
            g_failed++;                                                                            \
        }                                                                                          \
    } while (0)

enum { N = 300000 }; /* float32: more than one 1 MiB chunk, and not a multiple of one */

/* polls a communicator's state while it is `until` (at most 60 s) */
static ncclResult_t poll_while(ncclComm_t c, ncclResult_t until)
{
    ncclResult_t st = until;
    for (int i = 0; i < 600000 && st == until; i++) {
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess)
            return ncclInternalError;
        struct timespec nap = {0, 100 * 1000};
        nanosleep(&nap, NULL);
    }
    return st;
}

/* a non-blocking communicator out of ncclInProgress */
static ncclResult_t settle(ncclComm_t c) { return poll_while(c, ncclInProgress); }

static float value(int rank, size_t i) { return (float)(rank + 1) * 0.5f + (float)(i % 97); }

static void sync_stream(cudaStream_t s) { CHECK(cudaStreamSynchronize(s) == cudaSuccess); }

static void check_float32(ncclComm_t comm, int world, cudaStream_t s)
{
    float *h = malloc(N * world * sizeof *h), *d;
    CHECK(h && cudaMalloc((void **)&d, N * world * sizeof *d) == cudaSuccess);
    for (size_t i = 0; i < N; i++)
        h[i] = value(g_rank, i);
    CHECK(cudaMemcpyAsync(d, h, N * sizeof *h, cudaMemcpyHostToDevice, s) == cudaSuccess);
    CHECK(ncclAllReduce(d, d, N, ncclFloat32, ncclSum, comm, s) == ncclSuccess);
    sync_stream(s);
    CHECK(cudaMemcpy(h, d, N * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess);
    double sum0 = 0, sumN = 0;
    for (int r = 0; r < world; r++)
        sum0 += value(r, 0), sumN += value(r, N - 1);
    CHECK(h[0] == (float)sum0 && h[N - 1] == (float)sumN);
    /* all-gather in place: my piece at rank * N */
    for (size_t i = 0; i < N; i++)
        h[i] = value(g_rank, i);
    CHECK(cudaMemcpyAsync(d + (size_t)g_rank * N, h, N * sizeof *h, cudaMemcpyHostToDevice, s) == cudaSuccess);
    CHECK(ncclAllGather(d + (size_t)g_rank * N, d, N, ncclFloat32, comm, s) == ncclSuccess);
    sync_stream(s);
    CHECK(cudaMemcpy(h, d, N * world * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int r = 0; r < world; r++)
        CHECK(h[(size_t)r * N] == value(r, 0) && h[(size_t)r * N + N - 1] == value(r, N - 1));
    /* reduce-scatter average: piece q of every rank's buffer is value(rank, q * N + i) */
    for (size_t i = 0; i < (size_t)N * world; i++)
        h[i] = value(g_rank, i);
    CHECK(cudaMemcpyAsync(d, h, N * world * sizeof *h, cudaMemcpyHostToDevice, s) == cudaSuccess);
    CHECK(ncclReduceScatter(d, d + (size_t)g_rank * N, N, ncclFloat32, ncclAvg, comm, s) == ncclSuccess);
    sync_stream(s);
    CHECK(cudaMemcpy(h, d + (size_t)g_rank * N, N * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess);
    size_t at = (size_t)g_rank * N + 12345;
    double avg = 0;
    for (int r = 0; r < world; r++)
        avg += value(r, at);
    CHECK(h[12345] == (float)(avg / world));
    CHECK(cudaFree(d) == cudaSuccess);
    free(h);
}

static void check_float64_bf16(ncclComm_t comm, int world, cudaStream_t s)
{
    double hd[3] = {1.0 / 3, -2.5, 1e-300}, *dd;
    uint16_t hb[2] = {0x3f80 /* 1 */, 0x4040 /* 3 */}, *db;
    CHECK(cudaMalloc((void **)&dd, sizeof hd) == cudaSuccess && cudaMalloc((void **)&db, sizeof hb) == cudaSuccess);
    CHECK(cudaMemcpyAsync(dd, hd, sizeof hd, cudaMemcpyHostToDevice, s) == cudaSuccess);
    CHECK(cudaMemcpyAsync(db, hb, sizeof hb, cudaMemcpyHostToDevice, s) == cudaSuccess);
    CHECK(ncclAllReduce(dd, dd, 3, ncclFloat64, ncclAvg, comm, s) == ncclSuccess);
    CHECK(ncclAllReduce(db, db, 2, ncclBfloat16, ncclSum, comm, s) == ncclSuccess);
    sync_stream(s);
    double gd[3];
    uint16_t gb[2];
    CHECK(cudaMemcpy(gd, dd, sizeof gd, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(cudaMemcpy(gb, db, sizeof gb, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(fabs(gd[0] - 1.0 / 3) < 1e-16 && gd[1] == -2.5 && gd[2] == 1e-300);
    /* world 2: 2 and 6; world 3: 3 and 9, all exact in bfloat16 */
    uint16_t two = 0x4000, three = 0x4040, six = 0x40c0, nine = 0x4110;
    CHECK(gb[0] == (world == 2 ? two : three) && gb[1] == (world == 2 ? six : nine));
    CHECK(cudaFree(dd) == cudaSuccess && cudaFree(db) == cudaSuccess);
}

/* even and odd ranks: each half sums its ranks' numbers */
static void check_split(ncclComm_t comm, int world, cudaStream_t s)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t half = NULL;
    ncclResult_t r = ncclCommSplit(comm, g_rank % 2, g_rank, &half, &cfg);
    /* NCCL 2.28's rule: the parent and the child take no call before ncclCommGetAsyncError reads them settled,
     * even after a split that answered ncclSuccess (comm_nccl.c missed it; an H200 refused its reduce-scatter) */
    float *probe;
    CHECK(cudaMalloc((void **)&probe, sizeof *probe) == cudaSuccess);
    CHECK(ncclAllReduce(probe, probe, 1, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument);
    CHECK(strstr(ncclGetLastError(comm), "Attempt to use communicator before") != NULL);
    if (r == ncclSuccess || r == ncclInProgress)
        r = settle(half);
    if (r == ncclSuccess)
        r = settle(comm);
    CHECK(r == ncclSuccess && half != NULL);
    CHECK(cudaFree(probe) == cudaSuccess);
    float h = (float)g_rank, *d;
    CHECK(cudaMalloc((void **)&d, sizeof h) == cudaSuccess);
    CHECK(cudaMemcpyAsync(d, &h, sizeof h, cudaMemcpyHostToDevice, s) == cudaSuccess);
    CHECK(ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, half, s) == ncclSuccess);
    sync_stream(s);
    CHECK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess);
    float want = 0;
    for (int q = g_rank % 2; q < world; q += 2)
        want += (float)q;
    CHECK(h == want);
    CHECK(ncclCommFinalize(half) == ncclSuccess && ncclCommDestroy(half) == ncclSuccess);
    CHECK(cudaFree(d) == cudaSuccess);
}

/* Two communicators of the same ranks at once (the cuda target's gather and reduction lanes): a second one split
 * off with every rank, an all-gather on comm's stream s and an all-reduce on the twin's stream s2 both in flight,
 * several chunks each, both right; then the twin, fed from s2 so far, refuses a collective from s */
static void check_two_comms(ncclComm_t comm, int world, cudaStream_t s)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t twin = NULL;
    ncclResult_t r = ncclCommSplit(comm, 0, g_rank, &twin, &cfg);
    if (r == ncclSuccess || r == ncclInProgress) /* settled either way (NCCL 2.28: see check_split) */
        r = settle(twin);
    if (r == ncclSuccess)
        r = settle(comm);
    CHECK(r == ncclSuccess && twin != NULL);
    cudaStream_t s2;
    CHECK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, -5) == cudaSuccess);
    size_t n = (size_t)N * world;
    float *h = malloc(n * sizeof *h), *a, *b;
    CHECK(h && cudaMalloc((void **)&a, n * sizeof *a) == cudaSuccess && cudaMalloc((void **)&b, N * sizeof *b) ==
          cudaSuccess);
    for (size_t i = 0; i < N; i++)
        h[i] = value(g_rank, i);
    CHECK(cudaMemcpyAsync(a + (size_t)g_rank * N, h, N * sizeof *h, cudaMemcpyHostToDevice, s) == cudaSuccess);
    CHECK(cudaMemcpyAsync(b, h, N * sizeof *h, cudaMemcpyHostToDevice, s2) == cudaSuccess);
    CHECK(ncclAllGather(a + (size_t)g_rank * N, a, N, ncclFloat32, comm, s) == ncclSuccess);
    CHECK(ncclAllReduce(b, b, N, ncclFloat32, ncclSum, twin, s2) == ncclSuccess);
    sync_stream(s);
    sync_stream(s2);
    CHECK(cudaMemcpy(h, a, n * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (int q = 0; q < world; q++)
        CHECK(h[(size_t)q * N + 1] == value(q, 1) && h[(size_t)q * N + N - 1] == value(q, N - 1));
    CHECK(cudaMemcpy(h, b, N * sizeof *h, cudaMemcpyDeviceToHost) == cudaSuccess);
    double sum = 0;
    for (int q = 0; q < world; q++)
        sum += value(q, N - 2);
    CHECK(h[N - 2] == (float)sum);
    CHECK(ncclAllReduce(b, b, N, ncclFloat32, ncclSum, twin, s) == ncclInvalidUsage);
    CHECK(strstr(ncclGetLastError(twin), "another stream") != NULL);
    CHECK(ncclCommFinalize(twin) == ncclSuccess && ncclCommDestroy(twin) == ncclSuccess);
    CHECK(cudaFree(a) == cudaSuccess && cudaFree(b) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess);
    free(h);
}

/* the last rank leaves; the others' next collective fails, reported asynchronously */
static void check_dead_rank(ncclComm_t comm, int world, cudaStream_t s)
{
    if (g_rank == world - 1)
        _exit(g_failed); /* dies without a word */
    float *d;
    CHECK(cudaMalloc((void **)&d, 64) == cudaSuccess);
    CHECK(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, comm, s) == ncclSuccess);
    CHECK(poll_while(comm, ncclSuccess) == ncclRemoteError); /* within a minute, not a hang */
    CHECK(strstr(ncclGetLastError(comm), "is gone") || strstr(ncclGetLastError(comm), "aborted"));
    CHECK(ncclCommAbort(comm) == ncclSuccess);
    CHECK(strcmp(ncclGetErrorString(ncclRemoteError), "remote process exited or there was a network error") == 0);
    sync_stream(s); /* the stream gave up the collective */
}

static int child(ncclUniqueId id, int world)
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, -5) == cudaSuccess);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "test";
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, world, id, g_rank, &cfg);
    if (r == ncclSuccess || r == ncclInProgress) /* settled either way (NCCL 2.28: see check_split) */
        r = settle(comm);
    CHECK(r == ncclSuccess);
    if (r != ncclSuccess)
        return 1;
    check_float32(comm, world, s);
    check_float64_bf16(comm, world, s);
    check_split(comm, world, s);
    check_two_comms(comm, world, s);
    check_dead_rank(comm, world, s);
    return g_failed;
}

int main(void)
{
    int bad = 0;
    for (int world = 2; world <= 3; world++) {
        ncclUniqueId id;
        if (ncclGetUniqueId(&id) != ncclSuccess)
            return 1;
        pid_t pid[3];
        for (int r = 0; r < world; r++) {
            fflush(NULL);
            pid[r] = fork();
            if (pid[r] == 0) {
                g_rank = r;
                exit(child(id, world));
            }
            if (pid[r] < 0)
                return 1;
        }
        for (int done = 0; done < world; done++) { /* any order: a dead rank is reaped at once */
            int st = 0, r = 0;
            pid_t p = waitpid(-1, &st, 0);
            while (r < world && pid[r] != p)
                r++;
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "cuemu_nccl_test: world %d, rank %d: %s %d\n", world, r,
                        WIFEXITED(st) ? "failed checks:" : "killed by signal", WIFEXITED(st) ? WEXITSTATUS(st)
                                                                                             : WTERMSIG(st));
                bad = 1;
            }
        }
    }
    if (!bad)
        printf("cuemu_nccl_test: all checks passed at world 2 and 3\n");
    return bad;
}
