/* attn_16.c — times the fused attention kernels of kernels/c: float32 (k_attention_f32) against the 16-bit
 * ones of --precision bf16 / fp16 (k_attention_bf16, k_attention_f16), forward and backward, on a causal GPT
 * attention (the bias 0 / -inf of [1, 1, T, T], as passes/attention.c makes it from the mask).
 *
 *   attn_16 B H T D [REPS]
 *
 * Built against the kernels of fsdpc's build (the x86-64-v4 ones, as a `--cpu native` executable links here):
 *   cc -O2 -fopenmp -Ikernels/c bench/attn_16.c build/libfsdpc_kernels_v4.a \
 *      -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp \
 *      -lopenblas -ldnnl -lm -o attn_16
 *   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ./attn_16 8 12 1024 64
 *   DNNL_MAX_CPU_ISA=AVX512_CORE_VNNI ...   (oneDNN without its native bf16 GEMM: the widened path, as on a CPU
 *                                            without AVX512-BF16, Intel Cascade Lake)
 * Each repetition runs every side (f32, bf16, f16; forward, then backward) once, the order rotating; times are
 * CPU seconds of the process (CLOCK_PROCESS_CPUTIME_ID: what load on a shared machine does not stretch at one
 * thread).  Prints per side the best and the median over REPS (default 5) and the bf16 / f16 times over f32's.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

enum { F32, BF16, F16, NSIDE };
static const char *const side_name[NSIDE] = {"f32", "bf16", "f16"};

typedef struct {
    int64_t batch, t, d;
    float *q, *kt, *v, *bias, *y, *lse, *dy, *dq, *dkt, *dv, *ws;
    uint16_t *q16[2], *kt16[2], *v16[2], *dy16[2]; /* [0] bfloat16, [1] float16 */
    uint16_t *y16, *dq16, *dkt16, *dv16;             /* the 16-bit sides' outputs */
} Bench;

static void *alloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    if (!p) {
        fprintf(stderr, "attn_16: out of memory\n");
        exit(1);
    }
    return p;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(float *x, uint16_t **h, int64_t n, unsigned *seed)
{
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        x[i] = (float)((*seed >> 8) * (1.0 / 16777216.0) * 2 - 1);
        h[0][i] = k_bf16_from_f32(x[i]);
        h[1][i] = k_f16_from_f32(x[i]);
    }
}

/* one forward (grad 0) or backward (grad 1) of side s: its CPU seconds */
static double run(Bench *b, int s, int grad)
{
    const int64_t t = b->t, d = b->d;
    const double scale = 1 / sqrt((double)d);
    const double t0 = cpu_s();
    if (s == F32 && !grad)
        k_attention_f32(b->y, b->lse, b->q, b->kt, 0, b->v, b->bias, b->batch, t, t, d, d, 1, b->batch, 1, 0, scale,
                        0.0, 0, 0, 0, b->ws, NULL);
    else if (s == F32)
        k_attention_grad_f32(b->dq, b->dkt, b->dv, NULL, b->dy, b->q, b->kt, 0, b->v, b->bias, b->y, b->lse, b->batch,
                             t, t, d, d, 1, b->batch, 1, 0, scale, 0.0, 0, 0, 0, b->ws, NULL);
    else if (!grad)
        (s == BF16 ? k_attention_bf16 : k_attention_f16)(b->y16, b->lse, b->q16[s - 1], b->kt16[s - 1], 0,
                                                         b->v16[s - 1], b->bias, b->batch, t, t, d, d, 1, b->batch, 1,
                                                         0, scale, 0.0, 0, 0, 0, b->ws, NULL);
    else
        (s == BF16 ? k_attention_grad_bf16 : k_attention_grad_f16)(
            b->dq16, b->dkt16, b->dv16, NULL, b->dy16[s - 1], b->q16[s - 1], b->kt16[s - 1], 0, b->v16[s - 1], b->bias,
            b->y16, b->lse,
            b->batch, t, t, d, d, 1, b->batch, 1, 0, scale, 0.0, 0, 0, 0, b->ws, NULL);
    return cpu_s() - t0;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: attn_16 B H T D [REPS]\n");
        return 2;
    }
    Bench b = {.batch = atoll(argv[1]) * atoll(argv[2]), .t = atoll(argv[3]), .d = atoll(argv[4])};
    const int reps = argc > 5 ? atoi(argv[5]) : 5;
    const int64_t n = b.batch * b.t * b.d, ws = k_attention_workspace_16(b.batch, b.t, b.t, b.d, b.d);
    const int64_t ws32 = k_attention_workspace(b.batch, b.t, b.t);
    if (b.batch < 1 || b.t < 1 || b.d < 1 || reps < 1 || reps > 100) {
        fprintf(stderr, "attn_16: B, H, T, D >= 1 and REPS in [1, 100]\n");
        return 2;
    }
    float **f[] = {&b.q, &b.kt, &b.v, &b.y, &b.dy, &b.dq, &b.dkt, &b.dv};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        *f[i] = alloc(sizeof(float) * (size_t)n);
    b.lse = alloc(sizeof(float) * (size_t)(b.batch * b.t));
    b.bias = alloc(sizeof(float) * (size_t)(b.t * b.t));
    b.ws = alloc(sizeof(float) * (size_t)(ws > ws32 ? ws : ws32));
    for (int k = 0; k < 2; k++)
        b.q16[k] = alloc(2 * (size_t)n), b.kt16[k] = alloc(2 * (size_t)n), b.v16[k] = alloc(2 * (size_t)n),
        b.dy16[k] = alloc(2 * (size_t)n);
    b.y16 = alloc(2 * (size_t)n), b.dq16 = alloc(2 * (size_t)n), b.dkt16 = alloc(2 * (size_t)n);
    b.dv16 = alloc(2 * (size_t)n);
    unsigned seed = 1;
    uint16_t *h[2];
    h[0] = b.q16[0], h[1] = b.q16[1], fill(b.q, h, n, &seed);
    h[0] = b.kt16[0], h[1] = b.kt16[1], fill(b.kt, h, n, &seed);
    h[0] = b.v16[0], h[1] = b.v16[1], fill(b.v, h, n, &seed);
    for (int64_t i = 0; i < n; i++) {
        b.dy[i] = (float)((i * 7919 % 2001) - 1000) * 1e-3f;
        b.dy16[0][i] = k_bf16_from_f32(b.dy[i]), b.dy16[1][i] = k_f16_from_f32(b.dy[i]);
    }
    for (int64_t i = 0; i < b.t; i++)
        for (int64_t j = 0; j < b.t; j++)
            b.bias[i * b.t + j] = j > i ? -INFINITY : 0;
    static double tm[NSIDE][2][100];
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < NSIDE; k++) {
            const int s = (r + k) % NSIDE;
            tm[s][0][r] = run(&b, s, 0);
            tm[s][1][r] = run(&b, s, 1);
        }
    printf("B*H %lld T %lld d %lld causal, %d reps, CPU s (best / median)\n", (long long)b.batch, (long long)b.t,
           (long long)b.d, reps);
    double best[NSIDE][2];
    for (int s = 0; s < NSIDE; s++) {
        for (int g = 0; g < 2; g++) {
            qsort(tm[s][g], (size_t)reps, sizeof(double), cmp);
            best[s][g] = tm[s][g][0];
        }
        printf("  %-4s forward %.4f / %.4f  backward %.4f / %.4f", side_name[s], tm[s][0][0], tm[s][0][reps / 2],
               tm[s][1][0], tm[s][1][reps / 2]);
        if (s != F32)
            printf("  (x f32: forward %.2f, backward %.2f)", best[s][0] / best[F32][0], best[s][1] / best[F32][1]);
        printf("\n");
    }
    return 0;
}
