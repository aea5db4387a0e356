/* gemmteam.c — could the step's GEMMs join a team? (issue 32 item 2: one team for the step).  Times the float32
 * GEMMs of the 128/4/128/8 GPT step (forward and dA: 1024 rows; dB: op(A) transposed, k 1024) three ways:
 *   openblas      one cblas_sgemm outside any region: OpenBLAS forks its own team (what the step does now);
 *   team rows     one parallel region, each thread a cblas_sgemm on its static share of C's rows (inside an active
 *                 region the OpenMP OpenBLAS runs on the calling thread alone);
 *   team thread0  one parallel region, its first thread the whole GEMM, the others wait at a barrier;
 * and says whether the team's rows give the same bits as OpenBLAS's own team and as one call on one thread.
 *
 *     gcc -O2 -fopenmp bench/gemmteam.c -o /tmp/gemmteam -I/usr/include/x86_64-linux-gnu/openblas-openmp \
 *         -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas
 *     OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 taskset -c 0,1 /tmp/gemmteam [ROUNDS]
 * With -DONEDNN (and -ldnnl) every GEMM is oneDNN's dnnl_sgemm instead ("openblas" in the output then names
 * oneDNN's own team), the float32 GEMM the executables choose where it measures faster; with -DBF16 (and -ldnnl)
 * oneDNN's dnnl_gemm_bf16bf16f32 on bfloat16 operands (float32 C), the --precision bf16 step's GEMM
 * (kernels/c/matmul_bf16.c) where the CPU has AVX512-BF16 (DNNL_MAX_CPU_ISA=AVX512_CORE makes it oneDNN's
 * emulation instead, which the step does not use).  The rows are split as the kernels split them (walk.h
 * team_share: multiples of 16).
 *
 * Prints microseconds per GEMM (wall, and the process's CPU time).  With OPENBLAS_CORETYPE=Haswell (this
 * project's machines) the rows split gives other bits than either: the sums depend on the M partition.
 * oneDNN's rows split gave the bits of its own team and of one thread at all nine shapes (2026-11-28, quiet
 * Zen 5, 2 threads): its wall time 0.97-1.03x oneDNN's own team's, 0.50x at 1024 x 384 x 128 (which oneDNN
 * ran on one thread), CPU time about the same.
 * -DBF16 (2026-11-28, Zen 5 with AVX512-BF16): the rows split gave the bits of oneDNN's own team and of one
 * thread at all twelve shapes (the nine, and three with B transposed as the step reads a weight), at 2 and at 3
 * threads; its CPU time 0.93-0.98x oneDNN's own team's at eleven (1.12x at 1024 x 128 x 128), its wall time
 * 0.84-1.18x (2 threads, GOMP_SPINCOUNT=1000, load 3.5-4.7 on the 2 cores: thread0's wall was about the team's,
 * so the wall figures say little). */
#include <cblas.h>
#include <omp.h>
#include <stdint.h>
#if defined ONEDNN || defined BF16
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef BF16
typedef uint16_t elem; /* bfloat16 operands */
#if DNNL_VERSION_MAJOR < 3
dnnl_status_t DNNL_API dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K,
                                             float alpha, const uint16_t *A, dnnl_dim_t lda, const uint16_t *B,
                                             dnnl_dim_t ldb, float beta, float *C, dnnl_dim_t ldc);
#endif
static elem from_float(float f) /* round to nearest even (the operands are finite) */
{
    union { float f; uint32_t u; } v = {f};
    return (elem)((v.u + 0x7fff + (v.u >> 16 & 1)) >> 16);
}
#else
typedef float elem;
static elem from_float(float f) { return f; }
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* C[lo..hi) rows = op(A)[lo..hi) B, op(A) m x k (stored k x m where ta), B k x n */
static void rows(float *c, const elem *a, const elem *b, int m, int n, int k, int ta, int tb, int lo, int hi)
{
    if (lo >= hi)
        return;
#ifdef BF16
    dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', hi - lo, n, k, 1, ta ? a + lo : a + (long)lo * k, ta ? m : k,
                          b, tb ? k : n, 0, c + (long)lo * n, n);
#elif defined ONEDNN
    dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', hi - lo, n, k, 1, ta ? a + lo : a + (long)lo * k, ta ? m : k, b,
               tb ? k : n, 0, c + (long)lo * n, n);
#else
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, hi - lo, n, k, 1,
                ta ? a + lo : a + (long)lo * k, ta ? m : k, b, tb ? k : n, 0, c + (long)lo * n, n);
#endif
}

int main(int argc, char **argv)
{
    /* m, n, k, ta, tb: the forward's and dA's (B transposed where the step reads a weight as stored), dB's */
    static const int shapes[][5] = {{1024, 384, 128, 0, 0}, {1024, 128, 128, 0, 0}, {1024, 512, 128, 0, 0},
                                    {1024, 128, 512, 0, 0}, {1024, 256, 128, 0, 0}, {128, 512, 1024, 1, 0},
                                    {512, 128, 1024, 1, 0}, {128, 128, 1024, 1, 0}, {384, 128, 1024, 1, 0},
                                    {1024, 384, 128, 0, 1}, {1024, 128, 512, 0, 1}, {1024, 512, 128, 0, 1}};
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], ta = shapes[s][3], tb = shapes[s][4];
        elem *a = malloc(sizeof(elem) * m * k), *b = malloc(sizeof(elem) * k * n);
        float *c[3];
        for (int v = 0; v < 3; v++)
            c[v] = malloc(sizeof(float) * m * n);
        if (!a || !b || !c[0] || !c[1] || !c[2])
            return 1;
        srand(1);
        for (int i = 0; i < m * k; i++)
            a[i] = from_float(rand() / (float)RAND_MAX - .5f);
        for (int i = 0; i < k * n; i++)
            b[i] = from_float(rand() / (float)RAND_MAX - .5f);
        double t[3] = {0}, u[3] = {0};
        for (int r = 0; r < reps; r++)
            for (int v = 0; v < 3; v++) { /* interleaved */
                const double t0 = now(CLOCK_MONOTONIC), u0 = now(CLOCK_PROCESS_CPUTIME_ID);
                if (v == 0)
                    rows(c[0], a, b, m, n, k, ta, tb, 0, m);
                else if (v == 1) {
#pragma omp parallel
                    {
                        const int nt = omp_get_num_threads(), th = omp_get_thread_num();
                        const int ch = ((m + nt - 1) / nt + 15) / 16 * 16; /* walk.h team_share's, align 16 */
                        rows(c[1], a, b, m, n, k, ta, tb, th * ch < m ? th * ch : m, th * ch + ch < m ? th * ch + ch : m);
                    }
                } else {
#pragma omp parallel
                    {
                        if (omp_get_thread_num() == 0)
                            rows(c[2], a, b, m, n, k, ta, tb, 0, m);
#pragma omp barrier
                    }
                }
                t[v] += now(CLOCK_MONOTONIC) - t0, u[v] += now(CLOCK_PROCESS_CPUTIME_ID) - u0;
            }
        printf("%4d x %4d x %4d%s%s  openblas %7.1f us (CPU %7.1f)  team rows %7.1f (%7.1f)  team thread0 %7.1f (%7.1f)  "
               "bits: rows = openblas %s, rows = one thread %s\n", m, n, k, ta ? "T" : " ", tb ? "T" : " ", 1e6 * t[0] / reps,
               1e6 * u[0] / reps, 1e6 * t[1] / reps, 1e6 * u[1] / reps, 1e6 * t[2] / reps, 1e6 * u[2] / reps,
               memcmp(c[0], c[1], sizeof(float) * m * n) ? "no" : "yes", memcmp(c[1], c[2], sizeof(float) * m * n) ? "no" : "yes");
        free(a), free(b), free(c[0]), free(c[1]), free(c[2]);
    }
    return 0;
}
