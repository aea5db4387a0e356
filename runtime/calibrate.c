/* calibrate.c — fsdpc --calibrate: this machine's profile for the cost model (codegen/cost.c).
 *
 * The executable fsdpc --calibrate builds calls rt_calibrate; mpirun starts
 * it on N ranks (alone for N = 1).  Each rank sets up its threads as a
 * training executable does (rt_dev_init: the same cores, the same thread
 * counts, the communication thread's core set aside), then all ranks
 * measure at once, so that each sees what it gets beside the others:
 *   GEMMs          float32 at 2048^3 (the peak) and at a training shape
 *                  (m 2048, n k 768: gemm_efficiency is its share of the
 *                  peak); bfloat16 and float16 at 2048^3 (the step's own
 *                  k_matmul_bf16 / _f16: oneDNN's native bf16 GEMM where the
 *                  CPU has AVX512-BF16, else widened to float32), which a
 *                  --precision bf16 / fp16 plan needs; float64 at 1024^3
 *   memory         a STREAM-style triad (a = b + s c, 3 x 64 MiB) for the
 *                  bandwidth; fsdpc's own non-GEMM kernels (softmax forward
 *                  and backward, LayerNorm, a Transpose, Add on 8 Mi floats) for
 *                  mem_efficiency: the bytes they read and write per second
 *                  over that bandwidth, as the cost model counts bytes
 *   op_overhead    one small kernel call (16 floats)
 *   collectives    rt_allgather and rt_reduce_scatter_avg, the step's own
 *                  functions, over all ranks at 1, 4, 16 and 64 MiB; a
 *                  least-squares line t = a + b S gives the bus bandwidth
 *                  ((F-1)/F / b) and the latency per ring step (a / (F-1));
 *                  whether they overlap the step (the executable's own
 *                  decision: a communication thread where a core is left)
 * Each figure is the best of a few runs (measured again, up to RT_CAL_ROUNDS
 * rounds, while its runs differ by more than RT_CAL_SPREAD), then the slowest
 * rank's (the step waits for it).  Rank 0 writes the profile, atomically.  Figures it cannot
 * trust (cal_trust.h: GEMM and memory repeats that differ by more than 30 %,
 * a float64 GEMM not slower than the float32 one, a GEMM above the plausible
 * peak) are named in the profile ("# KEY untrusted: ...") and in one warning
 * line each on stderr; the profile is still written (a busy machine's is
 * better than none, and the warning says to measure again).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cal_trust.h"
#include "kernels.h"
#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_mpi.h"
#include "rt_priv.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *zalloc(size_t n)
{
    void *p = calloc(n, 1);
    if (!p)
        rt_fatal(1, "calibrate: cannot allocate %zu bytes", n);
    return p;
}

/* what a measured body needs */
typedef struct {
    float *a, *b, *c, *d, *e;
    double *da;
    uint16_t *h;          /* 2048^2 x 2 bfloat16, then as many float16 */
    int64_t m, n, k;
    RtCtx *ctx;
    double spread;        /* best's: (slowest - best) / best of its timed runs */
} Bufs;

/* the best time of reps runs of fn, every rank starting together (MPI is up only under a launcher); their
 * spread into x->spread */
static double best(void (*fn)(Bufs *), Bufs *x, int reps)
{
    double t = INFINITY, slow = 0;
    for (int r = 0; r < reps + 1; r++) {
        if (x->ctx->world > 1)
            RT_MPI(MPI_Barrier(MPI_COMM_WORLD));
        double t0 = now();
        fn(x);
        double dt = now() - t0;
        if (r > 0) { /* the first run warms up */
            t = dt < t ? dt : t;
            slow = dt > slow ? dt : slow;
        }
    }
    x->spread = t > 0 ? (slow - t) / t : 0;
    return t;
}

static void sgemm(Bufs *x) { k_matmul_f32(x->c, x->a, x->b, 1, 0, 0, x->m, x->n, x->k, 0, 0, 0.0); }
static void bgemm(Bufs *x) { k_matmul_bf16(x->c, x->h, x->h + x->m * x->m, 1, 0, 0, x->m, x->m, x->m, 0, 0, 0.0); }
static void hgemm(Bufs *x)
{
    const uint16_t *h = x->h + 2 * x->m * x->m;
    k_matmul_f16(x->c, h, h + x->m * x->m, 1, 0, 0, x->m, x->m, x->m, 0, 0, 0.0);
}
static void dgemm(Bufs *x)
{
    int64_t N = x->m;
    k_matmul_f64(x->da + 2 * N * N, x->da, x->da + N * N, 1, 0, 0, N, N, N, 0, 0, 0.0);
}

static void triad(Bufs *x)
{
    float *a = x->a, *b = x->b, *c = x->c;
    int64_t n = x->n;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        a[i] = b[i] + 0.5f * c[i];
}

/* the kernel mix: the memory-bound kernels a step's non-GEMM time goes to; its bytes as cost.c counts them (each
 * input and output once).  No transcendental-bound kernel: a GELU's tanh runs at about 1 GB/s on one core here
 * (libm, not memory), and charging that rate to every Transpose and Add made the cost model's other kernels 4x
 * dearer than measured (a GPT at d 128: 57 ms predicted, 18 measured) */
static void kernels_mix(Bufs *x)
{
    int64_t n = x->n, rows = n / 1024;
    k_softmax_f32(0, x->b, x->a, rows, 1024, 1);              /* x, y */
    k_softmax_grad_f32(0, x->c, x->a, x->b, rows, 1024, 1);   /* dy, y, dx */
    k_layernorm_f32(x->c, x->d, x->e, x->a, x->d + rows, x->e + rows, rows, 1024, 1e-5); /* x, y */
    int64_t heads[4] = {n / (1024 * 1024), 1024, 16, 64}, perm[4] = {0, 2, 1, 3}; /* attention's head split */
    k_transpose_f32(x->b, x->a, 4, heads, perm);            /* x, y */
    int64_t shape[1] = {n}, st[1] = {1};
    k_binary_f32(K_ADD, x->c, x->a, x->b, 1, shape, st, st); /* a, b, y */
}
static double mix_bytes(int64_t n) { return 4.0 * (double)n * (2 + 3 + 2 + 2 + 3); }

static void small(Bufs *x)
{
    for (int i = 0; i < 1000; i++)
        k_unary_f32(K_GELU, x->b, x->a, 16, 0, 0);
}

static void gather(Bufs *x) { rt_allgather(x->ctx, x->a, x->b, x->n / x->ctx->world, RT_F32); }
static void rscatter(Bufs *x)
{
    int64_t len = x->n / x->ctx->world;
    rt_reduce_scatter_avg(x->ctx, x->b, x->a, x->n, len, RT_F32);
}

/* least squares t = a + b S over the sizes; bus bandwidth and latency per ring step */
static void fit(const double *S, const double *t, int k, int F, double *bw, double *lat)
{
    double ms = 0, mt = 0, sst = 0, sss = 0;
    for (int i = 0; i < k; i++)
        ms += S[i] / k, mt += t[i] / k;
    for (int i = 0; i < k; i++)
        sst += (S[i] - ms) * (t[i] - mt), sss += (S[i] - ms) * (S[i] - ms);
    double b = sst / sss, a = mt - b * ms;
    *bw = (F - 1.0) / F / b;
    *lat = a > 0 ? a / (F - 1) : 0;
}

/* the slowest rank's: the largest time, the smallest rate */
static double worst(double v, int rate, int world)
{
    if (world > 1)
        RT_MPI(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, rate ? MPI_MIN : MPI_MAX, MPI_COMM_WORLD));
    return v;
}

/* best() of fn for the profile key `key`, its spread (the widest rank's) kept in c for cal_trust.h's rule.  A
 * round whose repeats differ by more than RT_CAL_SPREAD on some rank (another program took the cores for a while)
 * is followed by another, up to RT_CAL_ROUNDS; the time is the best over all rounds, the spread the last round's,
 * so a figure is flagged only when the machine stayed busy through every round.  Every rank sees the same widest
 * spread, so all take the same number of rounds. */
static double timed(void (*fn)(Bufs *), Bufs *x, int reps, RtCalFigures *c, const char *key)
{
    double t = INFINITY, spread = 0;
    for (int round = 0; round < RT_CAL_ROUNDS; round++) {
        double tr = best(fn, x, reps);
        t = tr < t ? tr : t;
        spread = worst(x->spread, 0, x->ctx->world);
        if (!(spread > RT_CAL_SPREAD))
            break;
    }
    c->key[c->n] = key;
    c->spread[c->n++] = spread;
    return t;
}

/* the figures of c that cannot be trusted: a comment line each in the profile f, a warning line each on stderr */
static void flag_doubts(const RtCalFigures *c, FILE *f)
{
    char why[RT_CAL_MAX + 3][RT_CAL_WHY];
    int n = rt_cal_doubts(c, why, RT_CAL_MAX + 3);
    for (int i = 0; i < n; i++) {
        fprintf(f, "# %s\n", why[i]);
        fprintf(stderr, "calibrate: warning: %s; calibrate again on a quiet machine\n", why[i]);
    }
}

int rt_calibrate(int argc, char **argv, const char *kernels)
{
    if (argc != 2 || !argv[1][0] || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s PROFILE.hw   (built and run by fsdpc --calibrate)\n", argv[0]);
        return 2;
    }
    const char *out = argv[1];
    int rank = 0, world = 1;
    char err[512] = "";
    if (rt_ctl_init(&argc, &argv, NULL, 0, &rank, &world, err, sizeof err) != 0)
        rt_fatal(1, "calibrate: %s", err);
    const RtModel m = {.cpu = "native", .cpu_kernels = kernels};
    if (rt_dev_init(&m, rank, world, 0, err, sizeof err) != 0)
        rt_fatal(1, "calibrate: %s", err);
    RtCtx ctx = {.m = &m, .rank = rank, .world = world, .sf = world, .srank = rank};
    rt_dev_agree(&ctx);
    Bufs x = {.ctx = &ctx};
    const int64_t N = 2048, n = 16 << 20; /* triad: 3 x 64 MiB */
    x.a = zalloc(sizeof(float) * (size_t)n), x.b = zalloc(sizeof(float) * (size_t)n);
    x.c = zalloc(sizeof(float) * (size_t)n), x.d = zalloc(sizeof(float) * (size_t)n);
    x.e = zalloc(sizeof(float) * (size_t)n);
    x.da = zalloc(sizeof(double) * 3 * 1024 * 1024);
    x.h = zalloc(sizeof(uint16_t) * 4 * (size_t)N * (size_t)N);
    for (int64_t i = 0; i < n; i++)
        x.a[i] = (float)(i % 13) * 0.0625f - 0.4f, x.b[i] = (float)(i % 7) * 0.125f, x.c[i] = 0.5f;
    for (int64_t i = 0; i < 3 * 1024 * 1024; i++)
        x.da[i] = (double)(i % 7) * 0.125;
    for (int64_t i = 0; i < 2 * N * N; i++) /* exact in both */
        x.h[i] = k_bf16_from_f32(x.b[i]), x.h[2 * N * N + i] = k_f16_from_f32(x.b[i]);

    RtCalFigures doubt = {.ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN)};
    x.m = x.n = x.k = N;
    double peak = worst(2.0 * N * N * N / timed(sgemm, &x, 3, &doubt, "peak_tflops_f32"), 1, world);
    double peak16 = worst(2.0 * N * N * N / timed(bgemm, &x, 3, &doubt, "peak_tflops_bf16"), 1, world);
    double peakh = worst(2.0 * N * N * N / timed(hgemm, &x, 3, &doubt, "peak_tflops_f16"), 1, world);
    x.m = 2048, x.n = x.k = 768;
    double shaped = worst(2.0 * 2048 * 768 * 768 / timed(sgemm, &x, 5, &doubt, "gemm_efficiency"), 1, world);
    x.m = 1024;
    double peak64 = worst(2.0 * 1024 * 1024 * 1024 / timed(dgemm, &x, 3, &doubt, "peak_tflops_f64"), 1, world);
    x.n = n;
    double bw = worst(12.0 * (double)n / timed(triad, &x, 5, &doubt, "mem_bw_gbs"), 1, world);
    x.n = 8 << 20;
    double kbw = worst(mix_bytes(x.n) / timed(kernels_mix, &x, 3, &doubt, "mem_efficiency"), 1, world);
    doubt.f32 = peak, doubt.f64 = peak64, doubt.bf16 = peak16, doubt.f16 = peakh;
    double overhead = worst(best(small, &x, 5) / 1000, 0, world);
    double gbw = kbw, glat = 0, rbw = kbw, rlat = 0;
    if (world > 1) {
        enum { K = 4 };
        double S[K], tg[K], tr[K];
        for (int i = 0; i < K; i++) {
            x.n = ((int64_t)1 << (18 + 2 * i)) / world * world; /* 1, 4, 16, 64 MiB of float32 */
            S[i] = 4.0 * (double)x.n;
            tg[i] = worst(best(gather, &x, 5), 0, world);
            tr[i] = worst(best(rscatter, &x, 5), 0, world);
        }
        fit(S, tg, K, world, &gbw, &glat);
        fit(S, tr, K, world, &rbw, &rlat);
    }
    if (rank == 0) {
        char host[256] = "?";
        gethostname(host, sizeof host - 1);
        for (char *h = host; *h; h++)
            if ((unsigned char)*h < 0x20 || (unsigned char)*h > 0x7e || *h == '#')
                *h = '?';
        RtAFile af;
        FILE *f = rt_afile_fopen(&af, out, 0666);
        if (!f)
            rt_fatal(1, "calibrate: cannot create a temporary beside %s: %s", out, strerror(errno));
        fprintf(f, "# measured by fsdpc --calibrate on %s: %d rank%s, each with:\n", host, world,
                world > 1 ? "s" : "");
        /* the threads line a clause per comment line (cost.c reads lines of up to 511 characters) */
        for (const char *t = rt_dev_threads(), *e; *t; t = *e ? e + 2 : e) {
            e = strstr(t, "; ");
            e = e ? e : t + strlen(t);
            fprintf(f, "#   %.*s\n", (int)(e - t < 400 ? e - t : 400), t);
        }
        flag_doubts(&doubt, f);
        fprintf(f, "description %d rank%s on %s, measured\ndevices_per_node %d\n", world, world > 1 ? "s" : "",
                host, world);
        fprintf(f, "peak_tflops_f32 %.6g          # float32 GEMM 2048^3\n", peak / 1e12);
        fprintf(f, "peak_tflops_f64 %.6g          # float64 GEMM 1024^3\n", peak64 / 1e12);
        fprintf(f, "peak_tflops_bf16 %.6g         # bfloat16 GEMM 2048^3 (%s)\n", peak16 / 1e12,
                k_bf16_gemm_native() ? "oneDNN's native bf16" : "widened to float32: no AVX512-BF16 here");
        fprintf(f, "peak_tflops_f16 %.6g          # float16 GEMM 2048^3 (widened to float32)\n", peakh / 1e12);
        fprintf(f, "gemm_efficiency %.4f          # float32 GEMM 2048 x 768 x 768 over the peak\n",
                shaped / peak < 1 ? shaped / peak : 1.0);
        fprintf(f, "mem_bw_gbs %.6g               # triad a = b + s c, 3 x 64 MiB\n", bw / 1e9);
        fprintf(f, "mem_efficiency %.4f           # softmax, its gradient, LayerNorm, Transpose, Add: %.3g GB/s\n",
                kbw / bw < 1 ? kbw / bw : 1.0, kbw / 1e9);
        fprintf(f, "op_overhead_us %.4g           # a 16-element kernel call\n", overhead * 1e6);
        if (world > 1) {
            fprintf(f, "intra_busbw_gbs %.6g          # rt_allgather, 1-64 MiB over %d ranks\n", gbw / 1e9, world);
            fprintf(f, "intra_latency_us %.4g\n", glat * 1e6);
            fprintf(f, "intra_rs_busbw_gbs %.6g       # rt_reduce_scatter_avg (an all-reduce on MPI)\n", rbw / 1e9);
            fprintf(f, "intra_rs_latency_us %.4g\n", rlat * 1e6);
        } else {
            fprintf(f, "intra_busbw_gbs %.6g          # one rank: no collective measured (the kernels' rate)\n",
                    gbw / 1e9);
            fprintf(f, "intra_latency_us 0\n");
        }
        fprintf(f, "comm_overlap %d                # %s\n", world > 1 && rt_dev_comm_thread(world),
                world > 1 && rt_dev_comm_thread(world) ? "collectives on the communication thread, beside the step"
                                                       : "collectives inside the step (no core for the thread)");
        fprintf(f, "inter_busbw_gbs %.6g          # one machine: no inter-node link measured (as intra)\n"
                "inter_latency_us %.4g\n", gbw / 1e9, glat * 1e6);
        if (rt_afile_commit(&af) != 0)
            rt_fatal(1, "calibrate: cannot write %s: %s", out, strerror(errno));
        printf("calibrate: %s: float32 GEMM %.4g TFLOPS (%.0f %% at 2048x768x768), bfloat16 %.4g, float16 %.4g, "
               "float64 %.4g; memory %.4g GB/s (kernels %.4g); per kernel %.3g us", out, peak / 1e12,
               100 * shaped / peak, peak16 / 1e12, peakh / 1e12, peak64 / 1e12, bw / 1e9, kbw / 1e9, overhead * 1e6);
        if (world > 1)
            printf("; %d ranks: all-gather %.4g GB/s + %.3g us per step, reduce-scatter %.4g GB/s + %.3g us", world,
                   gbw / 1e9, glat * 1e6, rbw / 1e9, rlat * 1e6);
        printf("\n");
    }
    free(x.a), free(x.b), free(x.c), free(x.d), free(x.e), free(x.da), free(x.h);
    rt_ctl_finalize();
    return 0;
}
