/* gemm_libs.c — times one GEMM library on a list of float32 GEMM shapes
 * (bench/gemm_libs.py drives it, one process per library and repetition).
 *
 *   gemm_libs LIBRARY.so cblas|dnnl SHAPES REPS
 *
 * LIBRARY is dlopen'ed; cblas: its cblas_sgemm (OpenBLAS, BLIS, MKL's
 * libmkl_rt); dnnl: oneDNN's dnnl_sgemm (row-major, the same contract).  The
 * thread count is the library's own setting from the environment
 * (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, BLIS_NUM_THREADS, MKL_NUM_THREADS),
 * which the driver sets.  SHAPES has one line per distinct GEMM of a training
 * step: "calls batch m n k ta tb" (row-major C[m x n] = op(A) op(B), A m x k
 * or k x m when ta; a batch is batch calls, one matrix each, as fsdpc's
 * k_matmul makes them).  For each shape: two warm-up calls, then REPS timed
 * runs of at least 20 ms each; prints "m n k batch ta tb best_seconds" per
 * shape (the best run's time for ONE call of the shape, all its batches).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                               float *, int);
typedef int (*dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                             int64_t, float, float *, int64_t);

static cblas_sgemm_fn cblas;
static dnnl_sgemm_fn dnnl;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void gemm(int m, int n, int k, int ta, int tb, const float *a, const float *b, float *c)
{
    const int lda = ta ? m : k, ldb = tb ? k : n;
    if (cblas)
        cblas(ROW_MAJOR, ta ? TRANS : NO_TRANS, tb ? TRANS : NO_TRANS, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
    else if (dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n))
        fprintf(stderr, "gemm_libs: dnnl_sgemm failed\n"), exit(1);
}

static float *fill(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (!p)
        fprintf(stderr, "gemm_libs: out of memory\n"), exit(1);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: gemm_libs LIBRARY.so cblas|dnnl SHAPES REPS\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "gemm_libs: %s\n", dlerror());
        return 1;
    }
    if (!strcmp(argv[2], "cblas"))
        cblas = (cblas_sgemm_fn)dlsym(lib, "cblas_sgemm");
    else
        dnnl = (dnnl_sgemm_fn)dlsym(lib, "dnnl_sgemm");
    if (!cblas && !dnnl) {
        fprintf(stderr, "gemm_libs: %s has no %s sgemm\n", argv[1], argv[2]);
        return 1;
    }
    FILE *f = fopen(argv[3], "r");
    if (!f) {
        perror(argv[3]);
        return 1;
    }
    const int reps = atoi(argv[4]) > 0 ? atoi(argv[4]) : 1;
    long calls, batch, m, n, k, ta, tb;
    while (fscanf(f, "%ld %ld %ld %ld %ld %ld %ld", &calls, &batch, &m, &n, &k, &ta, &tb) == 7) {
        float *a = fill((size_t)(batch * m * k)), *b = fill((size_t)(batch * k * n)), *c = fill((size_t)(batch * m * n));
        for (int w = 0; w < 2; w++)
            for (long i = 0; i < batch; i++)
                gemm((int)m, (int)n, (int)k, (int)ta, (int)tb, a + i * m * k, b + i * k * n, c + i * m * n);
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            long iters = 0;
            const double t0 = now();
            double t;
            do {
                for (long i = 0; i < batch; i++)
                    gemm((int)m, (int)n, (int)k, (int)ta, (int)tb, a + i * m * k, b + i * k * n, c + i * m * n);
                iters++;
                t = now() - t0;
            } while (t < 0.02);
            if (t / (double)iters < best)
                best = t / (double)iters;
        }
        printf("%ld %ld %ld %ld %ld %ld %ld %.9f\n", calls, batch, m, n, k, ta, tb, best);
        fflush(stdout);
        free(a), free(b), free(c);
    }
    fclose(f);
    return 0;
}
