/* forkjoin.c — what a parallel region costs against a barrier inside one team (issue 32 item 2's question: would
 * one team per step, its kernels split inside it with barriers between, wait less than a region per kernel?).
 *
 *     gcc -O2 -fopenmp bench/forkjoin.c -o /tmp/forkjoin && OMP_NUM_THREADS=2 taskset -c 0,1 /tmp/forkjoin [N] [WORK]
 *
 * Times N rounds of WORK floats of elementwise work each (default 2000 rounds of 32768: about a small kernel of
 * the 128/4/128/8 GPT step, 211 regions a step), split across the team three ways: a parallel region a round
 * (`omp parallel for`: what the kernels do now), one region with an `omp for` a round (its implicit barrier: one
 * team for the step), and one region with each thread's static share and no barrier (the floor: no waiting at
 * all).  Prints the microseconds per round of each and the process's CPU time; run it under the waiting settings
 * to compare (OMP_WAIT_POLICY, GOMP_SPINCOUNT) and beside `taskset -c 0 sh -c 'while :; do :; done'`. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 2000, n = argc > 2 ? atoi(argv[2]) : 32768;
    float *x = calloc((size_t)n, sizeof *x);
    if (!x || rounds < 1 || n < 1)
        return 1;
    const char *name[3] = {"a region a round", "one team, omp for", "one team, no barrier"};
    for (int way = 0; way < 3; way++) {
        double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (way == 0) {
            for (int r = 0; r < rounds; r++) {
#pragma omp parallel for schedule(static)
                for (int i = 0; i < n; i++)
                    x[i] = x[i] * 0.999f + 1.0f;
            }
        } else if (way == 1) {
#pragma omp parallel
            for (int r = 0; r < rounds; r++) {
#pragma omp for schedule(static)
                for (int i = 0; i < n; i++)
                    x[i] = x[i] * 0.999f + 1.0f;
            }
        } else {
#pragma omp parallel
            {
                int nt = omp_get_num_threads(), t = omp_get_thread_num(), chunk = (n + nt - 1) / nt;
                int lo = t * chunk < n ? t * chunk : n, hi = lo + chunk < n ? lo + chunk : n;
                for (int r = 0; r < rounds; r++)
                    for (int i = lo; i < hi; i++)
                        x[i] = x[i] * 0.999f + 1.0f;
            }
        }
        double t = now(CLOCK_MONOTONIC) - t0, c = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
        printf("%-22s %8.2f us a round, CPU %8.2f us a round\n", name[way], t / rounds * 1e6, c / rounds * 1e6);
    }
    printf("(x[0] %g; %d threads)\n", x[0], omp_get_max_threads());
    return 0;
}
