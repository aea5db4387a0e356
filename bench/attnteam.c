/* attnteam.c — the fused attention alone, in its own parallel region or in the step's team (issue 32 item 2: is
 * the float32 attention any slower inside a team that shares, codegen/team.c, than forking its own region?).
 * Times k_attention_f32 then k_attention_grad_f32 on a causal GPT attention (flags 5: keys as rows, the causal
 * band, as the step's emitted C calls them) two ways, the rounds of each alternating:
 *   own     the two calls from serial code: each forks its own region of the kernels' team (the step before
 *           oneteam3);
 *   team    one region for all the rounds, k_share(1): each call takes its thread's units (walk.h's attn_share)
 *           and a barrier follows each (the run's barrier before the next node reads y or dq).
 * and checks that both give the same bits.
 *
 *   cc -O2 -fopenmp -Ikernels/c bench/attnteam.c build/libfsdpc_kernels_v3.a \
 *      -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp \
 *      -lopenblas -ldnnl -lm -o /tmp/attnteam
 *   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 taskset -c 0,1 /tmp/attnteam BH T D [ROUNDS] [REPS]
 * (FSDPC_GEMM=onednn: oneDNN's sgemm, else OpenBLAS's; BH: batch x heads, 16 for the 128/4/128/8 GPT's batch
 * 8, 32 for 256/6/256/8's).  Prints per way the median and best over REPS of the microseconds a forward +
 * backward pair takes (wall, and the process's CPU time).
 * Measured (2026-11-28, oneDNN, 2 threads on cores 0-1 of the shared 2-core machine, load 3.3-6.9, 9 repetitions,
 * GOMP_SPINCOUNT=1000 and passive): in a team / own region 0.81-1.07x wall (the load's noise), 0.94-1.00x CPU, at
 * 16 128 64 (1.2-1.5 ms) and 32 256 64 (8-9 ms of CPU): the team is not slower.
 */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

static double now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float *buf(int64_t n, unsigned seed)
{
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!p) {
        fprintf(stderr, "attnteam: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: attnteam BH T D [ROUNDS] [REPS]\n");
        return 2;
    }
    const int64_t bh = atoll(argv[1]), t = atoll(argv[2]), d = atoll(argv[3]);
    const int rounds = argc > 4 ? atoi(argv[4]) : 20, reps = argc > 5 ? atoi(argv[5]) : 7;
    if (bh < 1 || t < 1 || d < 1 || rounds < 1 || reps < 1 || reps > 99) {
        fprintf(stderr, "attnteam: BH, T, D, ROUNDS positive, REPS 1-99\n");
        return 2;
    }
    if (getenv("FSDPC_GEMM") && !strcmp(getenv("FSDPC_GEMM"), "onednn"))
        k_gemm_use(K_GEMM_ONEDNN); /* as the executables: OpenBLAS unless told */
    const int flags = 5; /* K_ATTN_KROW | K_ATTN_CAUSAL */
    const int64_t n = bh * t * d;
    float *q = buf(n, 1), *k = buf(n, 2), *v = buf(n, 3), *dy = buf(n, 4);
    float *y[2] = {buf(n, 0), buf(n, 0)}, *lse = buf(bh * t, 0), *dq[2] = {buf(n, 0), buf(n, 0)};
    float *dk = buf(n, 0), *dv = buf(n, 0), *ws = buf(k_attention_workspace(bh, t, t), 0);
    double wall[2][99], cpu[2][99];
    for (int r = 0; r < reps; r++)
        for (int w0 = 0; w0 < 2; w0++) {
            const int w = (w0 + r) % 2; /* the order alternates */
            const double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
            if (w == 0)
                for (int i = 0; i < rounds; i++) {
                    k_attention_f32(y[0], lse, q, k, flags, v, NULL, bh, t, t, d, d, 1, 1, 1, 0, 0.125, 0.0, 0, 0, 0, ws, NULL);
                    k_attention_grad_f32(dq[0], dk, dv, NULL, dy, q, k, flags, v, NULL, y[0], lse, bh, t, t, d, d, 1, 1,
                                         1, 0, 0.125, 0.0, 0, 0, 0, ws, NULL);
                }
            else {
#pragma omp parallel
                {
                    k_share(1);
                    for (int i = 0; i < rounds; i++) {
                        k_attention_f32(y[1], lse, q, k, flags, v, NULL, bh, t, t, d, d, 1, 1, 1, 0, 0.125,
                                        0.0, 0, 0, 0, ws, NULL);
#pragma omp barrier
                        k_attention_grad_f32(dq[1], dk, dv, NULL, dy, q, k, flags, v, NULL, y[1], lse, bh, t, t, d, d,
                                             1, 1, 1, 0, 0.125, 0.0, 0, 0, 0, ws, NULL);
#pragma omp barrier
                    }
                    k_share(0);
                }
            }
            wall[w][r] = (now(CLOCK_MONOTONIC) - t0) / rounds * 1e6;
            cpu[w][r] = (now(CLOCK_PROCESS_CPUTIME_ID) - c0) / rounds * 1e6;
        }
    const int same = !memcmp(y[0], y[1], sizeof(float) * (size_t)n) && !memcmp(dq[0], dq[1], sizeof(float) * (size_t)n);
    printf("BH %lld T %lld D %lld, %d threads, %d rounds x %d reps: y and dq %s\n", (long long)bh, (long long)t,
           (long long)d, omp_get_max_threads(), rounds, reps, same ? "bit-identical" : "DIFFER");
    static const char *const name[2] = {"own region", "in a team"};
    for (int w = 0; w < 2; w++) {
        qsort(wall[w], (size_t)reps, sizeof(double), cmp);
        qsort(cpu[w], (size_t)reps, sizeof(double), cmp);
        printf("  %-10s  us a forward+backward: wall median %8.1f best %8.1f   CPU median %8.1f best %8.1f\n", name[w],
               wall[w][reps / 2], wall[w][0], cpu[w][reps / 2], cpu[w][0]);
    }
    return !same;
}
