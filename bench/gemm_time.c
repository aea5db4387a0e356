/* gemm_time.c — an LD_PRELOAD library that times every oneDNN GEMM a process
 * makes: the thread CPU time of each dnnl_gemm_bf16bf16f32, dnnl_sgemm and
 * dnnl_primitive_execute call, summed by kind and printed to stderr at exit.
 * It is how docs/benchmarks.md's "GEMMs inside the step" figures were taken:
 * the GEMMs as the step runs them (operands cold, between the other kernels),
 * not in a benchmark's loop.
 *
 *   cc -O2 -shared -fPIC -fopenmp -o gemm_time.so bench/gemm_time.c -ldl
 *   OMP_NUM_THREADS=1 LD_PRELOAD=$PWD/gemm_time.so ./train --steps 20 ...
 *
 * prints lines "gemm_time KIND CLASS calls N cpu S s R GFLOP/s U us/call",
 * KIND bf16 (the GEMM API's bfloat16 GEMM) or sgemm, CLASS small (m n k up to
 * 2^21: the fused attention's tiles) or large (the Linears), and one line
 * for all primitive executions (the convolutions, or any matmul primitive).
 * Every call is counted, the start-up's and the warm-up step's included.
 * At more than one thread a call's time is its calling thread's alone (the
 * GEMM's other threads are not counted): use it at 1 thread. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int64_t dim;

static double thread_cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *next(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        fprintf(stderr, "gemm_time: %s not found after this library (is the process linked with libdnnl?)\n", name);
        exit(1);
    }
    return f;
}

/* [kind: 0 bf16, 1 sgemm][class: 0 small, 1 large] */
static double secs[2][2], flops[2][2], prim_secs;
static long calls[2][2], prim_calls;

static void count(int kind, dim m, dim n, dim k, double s)
{
    const double f = 2.0 * (double)m * (double)n * (double)k;
    const int large = f > 2.0 * (double)(1 << 21);
#pragma omp atomic
    secs[kind][large] += s;
#pragma omp atomic
    flops[kind][large] += f;
#pragma omp atomic
    calls[kind][large] += 1;
}

int dnnl_gemm_bf16bf16f32(char ta, char tb, dim m, dim n, dim k, float alpha, const uint16_t *a, dim lda,
                          const uint16_t *b, dim ldb, float beta, float *c, dim ldc)
{
    static int (*f)(char, char, dim, dim, dim, float, const uint16_t *, dim, const uint16_t *, dim, float, float *,
                    dim);
    if (!f)
        *(void **)&f = next("dnnl_gemm_bf16bf16f32");
    const double t = thread_cpu();
    const int r = f(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    count(0, m, n, k, thread_cpu() - t);
    return r;
}

int dnnl_sgemm(char ta, char tb, dim m, dim n, dim k, float alpha, const float *a, dim lda, const float *b, dim ldb,
               float beta, float *c, dim ldc)
{
    static int (*f)(char, char, dim, dim, dim, float, const float *, dim, const float *, dim, float, float *, dim);
    if (!f)
        *(void **)&f = next("dnnl_sgemm");
    const double t = thread_cpu();
    const int r = f(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    count(1, m, n, k, thread_cpu() - t);
    return r;
}

int dnnl_primitive_execute(const void *prim, void *stream, int nargs, const void *args)
{
    static int (*f)(const void *, void *, int, const void *);
    if (!f)
        *(void **)&f = next("dnnl_primitive_execute");
    const double t = thread_cpu();
    const int r = f(prim, stream, nargs, args);
#pragma omp atomic
    prim_secs += thread_cpu() - t;
#pragma omp atomic
    prim_calls += 1;
    return r;
}

__attribute__((destructor)) static void report(void)
{
    static const char *kind[2] = {"bf16", "sgemm"}, *cls[2] = {"small", "large"};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (calls[i][j])
                fprintf(stderr, "gemm_time %s %s calls %ld cpu %.4f s %.1f GFLOP/s %.2f us/call\n", kind[i], cls[j],
                        calls[i][j], secs[i][j], flops[i][j] / secs[i][j] / 1e9, 1e6 * secs[i][j] / calls[i][j]);
    if (prim_calls)
        fprintf(stderr, "gemm_time primitives calls %ld cpu %.4f s\n", prim_calls, prim_secs);
}
