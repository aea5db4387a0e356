/* attnheads.c — the fused attention's layouts (issue 32 item 3: does reading q, k, v and writing y, dq, dk, dv
 * in the projections' [B, T, H, d], rows H d apart, cost the kernels anything against the dense [B H, T, d] the
 * head Transposes made?  And, passes/pack.c: q, k, v read out of c_attn's packed [B, T, 3 H d] and dq, dk, dv
 * written into one, rows 3 H d apart: KAttnLd).  Times k_attention_S then k_attention_grad_S (S f32 or bf16) on a
 * causal GPT attention (flags 5: keys as rows, the causal band, as the step calls them), heads 0, heads H and
 * packed on the same values, the rounds of each alternating, and checks that all give the same bits (outputs
 * compared back in one layout).
 *
 *   cc -O2 -fopenmp -Ikernels/c bench/attnheads.c build/libfsdpc_kernels_v3.a \
 *      -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp \
 *      -lopenblas -ldnnl -lm -o /tmp/attnheads
 *   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /tmp/attnheads B H T D [f32|bf16] [ROUNDS] [REPS]
 * Prints per layout the median and best over REPS of the CPU milliseconds a forward + backward pair takes.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *xalloc(int64_t n, size_t es)
{
    void *p = calloc((size_t)(n > 0 ? n : 1), es);
    if (!p) {
        fprintf(stderr, "attnheads: out of memory\n");
        exit(1);
    }
    return p;
}

/* x dense [B H, T, D] (es-byte elements) into the heads layout [B, T, H, D] */
static void *to_heads(const void *x, size_t es, int64_t B, int64_t H, int64_t T, int64_t D)
{
    char *y = xalloc(B * H * T * D, es);
    for (int64_t p = 0; p < B * H; p++)
        for (int64_t i = 0; i < T; i++)
            memcpy(y + (size_t)(k_attention_at(p, T, H, D, H * D) + i * H * D) * es,
                   (const char *)x + (size_t)((p * T + i) * D) * es, (size_t)D * es);
    return y;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: attnheads B H T D [f32|bf16] [ROUNDS] [REPS]\n");
        return 2;
    }
    const int64_t B = atoll(argv[1]), H = atoll(argv[2]), T = atoll(argv[3]), D = atoll(argv[4]), P = B * H;
    const int low = argc > 5 && !strcmp(argv[5], "bf16");
    const int rounds = argc > 6 ? atoi(argv[6]) : 3, reps = argc > 7 ? atoi(argv[7]) : 9, flags = 5;
    const size_t es = low ? 2 : 4;
    const int64_t n = P * T * D, nws = low ? k_attention_workspace_16(P, T, T, D, D) : k_attention_workspace(P, T, T);
    void *in[4], *hin[4], *out[3][4];
    float *lse[3] = {xalloc(P * T, 4), xalloc(P * T, 4), xalloc(P * T, 4)}, *ws = xalloc(nws, 4);
    /* packed: q, k, v of each row side by side in pk (rows W = 3 H D apart), dq, dk, dv so in pg */
    const int64_t W = 3 * H * D, rowsz = H * D;
    char *pk = xalloc(B * T * W, es), *pg = xalloc(B * T * W, es);
    const KAttnLd ld = {W, W, W, 0, W, W, W};
    unsigned seed = 1;
    for (int a = 0; a < 4; a++) { /* q, k, v, dy */
        in[a] = xalloc(n, es);
        for (int64_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            const float f = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
            if (low)
                ((uint16_t *)in[a])[i] = k_bf16_from_f32(f);
            else
                ((float *)in[a])[i] = f;
        }
        hin[a] = to_heads(in[a], es, B, H, T, D);
        for (int64_t r = 0; a < 3 && r < B * T; r++)
            memcpy(pk + (size_t)(r * W + a * rowsz) * es, (char *)hin[a] + (size_t)(r * rowsz) * es, (size_t)rowsz * es);
    }
    for (int h = 0; h < 3; h++)
        for (int o = 0; o < 4; o++) /* y, dq, dk, dv */
            out[h][o] = xalloc(n, es);
    double *t[3] = {xalloc(reps, 8), xalloc(reps, 8), xalloc(reps, 8)};
    for (int r = 0; r < reps; r++)
        for (int h = 0; h < 3; h++) {
            void *px[4] = {pk, pk + (size_t)rowsz * es, pk + (size_t)(2 * rowsz) * es, hin[3]};
            void *py[4] = {out[2][0], pg, pg + (size_t)rowsz * es, pg + (size_t)(2 * rowsz) * es};
            void **x = h == 2 ? px : h ? hin : in, **y = h == 2 ? py : out[h];
            const KAttnLd *l = h == 2 ? &ld : NULL;
            const int64_t heads = h ? H : 0;
            const double c0 = cpu_s();
            for (int i = 0; i < rounds; i++) {
                if (low) {
                    k_attention_bf16(y[0], lse[h], x[0], x[1], flags, x[2], NULL, P, T, T, D, D, 1, 1, 1, heads,
                                     0.125, 0.0, 0, 0, 0, ws, l);
                    k_attention_grad_bf16(y[1], y[2], y[3], NULL, x[3], x[0], x[1], flags, x[2], NULL, y[0], lse[h],
                                          P, T, T, D, D, 1, 1, 1, heads, 0.125, 0.0, 0, 0, 0, ws, l);
                } else {
                    k_attention_f32(y[0], lse[h], x[0], x[1], flags, x[2], NULL, P, T, T, D, D, 1, 1, 1, heads,
                                    0.125, 0.0, 0, 0, 0, ws, l);
                    k_attention_grad_f32(y[1], y[2], y[3], NULL, x[3], x[0], x[1], flags, x[2], NULL, y[0], lse[h],
                                         P, T, T, D, D, 1, 1, 1, heads, 0.125, 0.0, 0, 0, 0, ws, l);
                }
            }
            t[h][r] = (cpu_s() - c0) / rounds * 1e3;
        }
    for (int o = 0; o < 4; o++) {
        void *back = to_heads(out[0][o], es, B, H, T, D);
        if (memcmp(back, out[1][o], (size_t)n * es)) {
            fprintf(stderr, "attnheads: output %d differs between the layouts\n", o);
            return 1;
        }
        free(back);
    }
    int packed_bad = memcmp(out[1][0], out[2][0], (size_t)n * es) != 0;
    for (int o = 1; o < 4; o++) /* dq, dk, dv: packed rows against the heads layout's */
        for (int64_t r = 0; r < B * T; r++)
            packed_bad |= memcmp(pg + (size_t)(r * W + (o - 1) * rowsz) * es,
                                 (char *)out[1][o] + (size_t)(r * rowsz) * es, (size_t)rowsz * es) != 0;
    if (packed_bad || memcmp(lse[0], lse[1], sizeof(float) * (size_t)(P * T)) ||
        memcmp(lse[0], lse[2], sizeof(float) * (size_t)(P * T))) {
        fprintf(stderr, "attnheads: lse or the packed outputs differ between the layouts\n");
        return 1;
    }
    for (int h = 0; h < 3; h++)
        qsort(t[h], (size_t)reps, sizeof(double), cmp);
    printf("%s B %lld H %lld T %lld D %lld, forward + backward, CPU ms: dense median %.3f best %.3f; heads median "
           "%.3f best %.3f; packed median %.3f best %.3f; heads / dense %.3f, packed / heads %.3f (median), %.3f "
           "(best) (same bits)\n", low ? "bf16" : "f32", (long long)B, (long long)H, (long long)T, (long long)D,
           t[0][reps / 2], t[0][0], t[1][reps / 2], t[1][0], t[2][reps / 2], t[2][0], t[1][reps / 2] / t[0][reps / 2],
           t[2][reps / 2] / t[1][reps / 2], t[2][0] / t[1][0]);
    return 0;
}
