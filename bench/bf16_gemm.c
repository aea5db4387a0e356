/* bf16_gemm.c — times the bfloat16 GEMMs of an fsdpc training step six ways
 * (bench/bf16_gemm.py drives it, one process per size and thread count).
 *
 *   bf16_gemm SHAPES REPS
 *
 * SHAPES has one line per distinct k_matmul_bf16 / k_matmul_add_bf16 call of
 * a step: "calls batch sa sb m n k ta tb alpha" (k_matmul's contract:
 * row-major C_i[m x n] = alpha op(A_i) op(B_i), A_i at a + i sa, B_i at
 * b + i sb; a MatMulAdd's epilogue, bias + addend into C before a beta-1
 * GEMM, is left out: it is the same code whichever GEMM follows).  The sides:
 *   widened  fsdpc's path before oneDNN (replicated here as it was in
 *            kernels/c/matmul.c: the operands widened block by block into
 *            float, 512 x 256 and 256 x 512 blocks, each pair one
 *            cblas_sgemm; batches one after another);
 *   onednn   dnnl_gemm_bf16bf16f32 (oneDNN's bf16 GEMM, float32
 *            accumulation), batched as fsdpc's kernels/c/matmul.c does:
 *            shared B folded into one tall GEMM, else the batch split
 *            across the OpenMP team;
 *   f32      k_matmul_f32 of the built kernels on float32 copies (what the
 *            same GEMM costs without mixed precision);
 *   team     k_matmul_widened_16 of the built kernels: fsdpc's widened path
 *            now (C's tiles split across the team, each thread widening its
 *            own), what a CPU without AVX512-BF16 runs;
 *   whole    each operand widened once, whole, into one scratch (the team
 *            widening it), then one k_gemm_f32 per matrix of the batch: the
 *            alternative to the tiles (fewer sgemm calls, more memory);
 *   matmul   oneDNN's matmul primitive on bf16 operands in their plain
 *            layouts (2-D, or 3-D with B broadcast), float32 C, made once
 *            per shape and only executed in the timed calls (what a cache
 *            of primitives costs per call); it prints which implementation
 *            oneDNN picked on stderr (AVX512-BF16: brg:avx512_core_bf16;
 *            DNNL_MAX_CPU_ISA=AVX512_CORE: gemm:jit, emulated bf16);
 * and fsdpc's own k_matmul_bf16 (the built kernels, whichever path they take)
 * is run once to check it against the other two.
 * Threads: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, set by the driver.
 * FSDPC_GEMM=onednn runs the kernels' float32 GEMMs (f32, team, whole) on
 * oneDNN's sgemm, as an executable does where start-up measures oneDNN
 * faster (runtime/dev_host.c); else OpenBLAS's.
 * BENCH_CLOCK=cpu times by the process's CPU time instead of the wall clock
 * (at 1 thread, what a machine shared with other work does not distort).
 * Each repetition runs every side on every shape, sides in rotating order;
 * a run is at least 20 ms of calls.  Prints per shape and side the time of
 * one call (all its batches) of every repetition, then the result check:
 *   "t SIDE calls batch sa sb m n k ta tb s1 s2 ..."
 *   "check calls batch m n k ta tb onednn-vs-widened fsdpc-vs-widened fsdpc-vs-onednn team-vs-widened
 *    whole-vs-widened matmul-vs-widened"
 * where a check is max |x - y| / max(sum_k |a||b|) over C (float32 rounding
 * of the sum order is ~1e-7 times k at worst).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include "kernels.h"

/* exported by libdnnl 2.6 but declared in its public header only from 3.x */
dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K,
                                    float alpha, const uint16_t *A, dnnl_dim_t lda, const uint16_t *B,
                                    dnnl_dim_t ldb, float beta, float *C, dnnl_dim_t ldc);

typedef struct {
    long calls, batch, sa, sb, m, n, k, ta, tb;
    double alpha;
} Shape;

/* ---- widened: kernels/c/matmul.c's gemm_16 as it was -------------------- */
enum { BM = 512, BN = 512, BK = 256 };
static float wide_a[BM * BK], wide_b[BK * BN];

static void widen(float *w, const uint16_t *x, int64_t ld, int tr, int64_t r0, int64_t c0, int64_t rows,
                  int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            w[r * cols + c] = k_bf16_to_f32(tr ? x[(c0 + c) * ld + r0 + r] : x[(r0 + r) * ld + c0 + c]);
}

static void gemm_widened(float *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n, int64_t k, int ta,
                         int tb, double alpha, double beta)
{
    for (int64_t i0 = 0; i0 < m; i0 += BM) {
        int64_t bm = m - i0 < BM ? m - i0 : BM;
        for (int64_t k0 = 0; k0 < k; k0 += BK) {
            int64_t bk = k - k0 < BK ? k - k0 : BK;
            widen(wide_a, a, ta ? m : k, ta, i0, k0, bm, bk);
            for (int64_t j0 = 0; j0 < n; j0 += BN) {
                int64_t bn = n - j0 < BN ? n - j0 : BN;
                widen(wide_b, b, tb ? k : n, tb, k0, j0, bk, bn);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)bm, (int)bn, (int)bk, (float)alpha,
                            wide_a, (int)bk, wide_b, (int)bn, k0 ? 1.0f : (float)beta, c + i0 * n + j0, (int)n);
            }
        }
    }
}

static void run_widened(const Shape *s, float *c, const uint16_t *a, const uint16_t *b)
{
    if (s->sb == 0 && !s->ta && s->sa == s->m * s->k) {
        gemm_widened(c, a, b, s->batch * s->m, s->n, s->k, (int)s->ta, (int)s->tb, s->alpha, 0.0);
        return;
    }
    for (long i = 0; i < s->batch; i++)
        gemm_widened(c + i * s->m * s->n, a + i * s->sa, b + i * s->sb, s->m, s->n, s->k, (int)s->ta, (int)s->tb,
                     s->alpha, 0.0);
}

/* ---- onednn -------------------------------------------------------------- */
static void gemm_dnnl(float *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n, int64_t k, int ta,
                      int tb, double alpha, double beta)
{
    if (dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, (float)alpha, a, ta ? m : k, b, tb ? k : n,
                              (float)beta, c, n) != dnnl_success)
        fprintf(stderr, "bf16_gemm: dnnl_gemm_bf16bf16f32 failed\n"), exit(1);
}

static void run_dnnl(const Shape *s, float *c, const uint16_t *a, const uint16_t *b)
{
    if (s->batch == 1 || (s->sb == 0 && !s->ta && s->sa == s->m * s->k)) {
        gemm_dnnl(c, a, b, s->batch * s->m, s->n, s->k, (int)s->ta, (int)s->tb, s->alpha, 0.0);
        return;
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < s->batch; i++)
        gemm_dnnl(c + i * s->m * s->n, a + i * s->sa, b + i * s->sb, s->m, s->n, s->k, (int)s->ta, (int)s->tb,
                  s->alpha, 0.0);
}


static void *alloc(size_t bytes);

/* ---- whole: each operand widened once, whole, into a scratch, one sgemm (k_gemm_f32) ---------------------- */
static float *whole_w;
static size_t whole_cap;

static float *whole_scratch(size_t floats)
{
    if (floats > whole_cap) {
        free(whole_w);
        whole_w = malloc(floats * sizeof(float));
        if (!whole_w)
            fprintf(stderr, "bf16_gemm: out of memory\n"), exit(1);
        whole_cap = floats;
    }
    return whole_w;
}

static void widen_all(float *w, const uint16_t *x, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        w[i] = k_bf16_to_f32(x[i]);
}

static void run_whole(const Shape *s, float *c, const uint16_t *a, const uint16_t *b)
{
    const int fold = s->sb == 0 && !s->ta && s->sa == s->m * s->k;
    const long batch = fold ? 1 : s->batch, m = fold ? s->batch * s->m : s->m;
    const size_t na = (size_t)((batch - 1) * s->sa + m * s->k), nb = (size_t)((batch - 1) * s->sb + s->k * s->n);
    float *wa = whole_scratch(na + nb), *wb = wa + na;
    widen_all(wa, a, na);
    widen_all(wb, b, nb);
    for (long i = 0; i < batch; i++)
        k_gemm_f32(c + i * m * s->n, s->n, wa + i * s->sa, s->ta ? m : s->k, wb + i * s->sb, s->tb ? s->k : s->n, m,
                   s->n, s->k, (int)s->ta, (int)s->tb, s->alpha, 0.0);
}

/* ---- matmul: oneDNN's bf16 matmul primitive (bf16 src and weights in their plain layouts, f32 dst), made once
 * per shape (the bench's timing excludes its creation: what a cache of primitives would cost per call is the
 * execute alone) ----------------------------------------------------------------------------------------------- */
static dnnl_engine_t eng;
static dnnl_stream_t stm;
static dnnl_primitive_t mm_prim;
static dnnl_memory_t mm_mem[4];
static Shape mm_shape; /* the shape mm_prim was made for (calls 0: none) */
static void *mm_scratch;

#define DN(x)                                                                                                      \
    do {                                                                                                           \
        if ((x) != dnnl_success)                                                                                   \
            fprintf(stderr, "bf16_gemm: %s failed\n", #x), exit(1);                                                \
    } while (0)

static void mm_make(const Shape *s)
{
    if (!eng) {
        DN(dnnl_engine_create(&eng, dnnl_cpu, 0));
        DN(dnnl_stream_create(&stm, eng, dnnl_stream_default_flags));
    }
    const int fold = s->sb == 0 && !s->ta && s->sa == s->m * s->k;
    const long bt = fold ? 1 : s->batch, m = fold ? s->batch * s->m : s->m;
    /* 2-D where one matrix pair, else 3-D with B broadcast where it is shared */
    const int nd = bt == 1 ? 2 : 3, o = nd - 2;
    dnnl_dims_t ad = {bt, m, s->k}, bd = {s->sb == 0 ? 1 : bt, s->k, s->n}, cd = {bt, m, s->n};
    dnnl_dims_t as = {s->sa, s->ta ? 1 : s->k, s->ta ? m : 1}, bs = {s->sb ? s->sb : s->k * s->n, s->tb ? 1 : s->n,
                                                                      s->tb ? s->k : 1},
                cs = {m * s->n, s->n, 1};
    dnnl_memory_desc_t amd, bmd, cmd;
    DN(dnnl_memory_desc_init_by_strides(&amd, nd, ad + 1 - o, dnnl_bf16, as + 1 - o));
    DN(dnnl_memory_desc_init_by_strides(&bmd, nd, bd + 1 - o, dnnl_bf16, bs + 1 - o));
    DN(dnnl_memory_desc_init_by_strides(&cmd, nd, cd + 1 - o, dnnl_f32, cs + 1 - o));
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd));
    dnnl_primitive_attr_t attr;
    DN(dnnl_primitive_attr_create(&attr));
    DN(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (s->alpha != 1.0)
        DN(dnnl_primitive_attr_set_output_scales(attr, 1, 0, (const float[]){(float)s->alpha}));
    dnnl_primitive_desc_t pd;
    DN(dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL));
    const char *impl;
    DN(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t ss = dnnl_memory_desc_get_size(smd);
    fprintf(stderr, "matmul %ld %ld %ld %ld %ld %ld: %s, scratchpad %zu bytes\n", bt, m, s->n, s->k, s->ta, s->tb,
            impl, ss);
    if (mm_prim) {
        DN(dnnl_primitive_destroy(mm_prim));
        for (int q = 0; q < 4; q++)
            DN(dnnl_memory_destroy(mm_mem[q]));
    }
    DN(dnnl_primitive_create(&mm_prim, pd));
    free(mm_scratch);
    mm_scratch = alloc(ss);
    DN(dnnl_memory_create(&mm_mem[0], &amd, eng, DNNL_MEMORY_NONE));
    DN(dnnl_memory_create(&mm_mem[1], &bmd, eng, DNNL_MEMORY_NONE));
    DN(dnnl_memory_create(&mm_mem[2], &cmd, eng, DNNL_MEMORY_NONE));
    DN(dnnl_memory_create(&mm_mem[3], smd, eng, mm_scratch));
    DN(dnnl_primitive_desc_destroy(pd));
    DN(dnnl_primitive_attr_destroy(attr));
    mm_shape = *s;
}

static void run_matmul(const Shape *s, float *c, const uint16_t *a, const uint16_t *b)
{
    if (memcmp(&mm_shape, s, sizeof *s))
        mm_make(s);
    DN(dnnl_memory_set_data_handle(mm_mem[0], (void *)a));
    DN(dnnl_memory_set_data_handle(mm_mem[1], (void *)b));
    DN(dnnl_memory_set_data_handle(mm_mem[2], c));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mm_mem[0]}, {DNNL_ARG_WEIGHTS, mm_mem[1]}, {DNNL_ARG_DST, mm_mem[2]},
                               {DNNL_ARG_SCRATCHPAD, mm_mem[3]}};
    DN(dnnl_primitive_execute(mm_prim, stm, 4, args));
}

/* ---- the driver ------------------------------------------------------------ */
static double now(void)
{
    static int cpu = -1;
    if (cpu < 0)
        cpu = getenv("BENCH_CLOCK") && !strcmp(getenv("BENCH_CLOCK"), "cpu");
    struct timespec t;
    clock_gettime(cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        fprintf(stderr, "bf16_gemm: out of memory\n"), exit(1);
    return p;
}

typedef struct {
    const Shape *s;
    uint16_t *a, *b;
    float *fa, *fb, *c, *c0;
    size_t na, nb, nc;
} Bufs;

/* one call of the shape (beta 0) by side 0 widened, 1 onednn, 2 f32, 3 team, 4 fsdpc's k_matmul_bf16, 5 whole,
 * 6 matmul */
static void call(const Bufs *u, int side)
{
    const Shape *s = u->s;
    if (side == 0)
        run_widened(s, u->c, u->a, u->b);
    else if (side == 1)
        run_dnnl(s, u->c, u->a, u->b);
    else if (side == 2)
        k_matmul_add_f32(u->c, u->fa, u->fb, NULL, NULL, s->alpha, s->batch, s->sa, s->sb, s->m, s->n, s->k,
                         (int)s->ta, (int)s->tb);
    else if (side == 5)
        run_whole(s, u->c, u->a, u->b);
    else if (side == 6)
        run_matmul(s, u->c, u->a, u->b);
    else if (side == 3)
        k_matmul_widened_16(u->c, u->a, u->b, s->batch, s->sa, s->sb, s->m, s->n, s->k, (int)s->ta, (int)s->tb,
                            s->alpha, 0.0, 0);
    else
        k_matmul_add_bf16(u->c, u->a, u->b, NULL, NULL, s->alpha, s->batch, s->sa, s->sb, s->m, s->n, s->k,
                          (int)s->ta, (int)s->tb);
}

static double time_side(const Bufs *u, int side)
{
    long iters = 0;
    const double t0 = now();
    double t;
    do {
        call(u, side);
        iters++;
        t = now() - t0;
    } while (t < 0.02);
    return t / (double)iters;
}

/* max |x - y| over C, relative to the largest sum_k |a||b| of the shape */
static double diff(const Bufs *u, const float *x, const float *y)
{
    const Shape *s = u->s;
    double scale = 0, d = 0;
    for (long i = 0; i < s->batch; i++)
        for (long r = 0; r < s->m; r++)
            for (long j = 0; j < s->n; j += 7) { /* a sample of the columns for the scale */
                double acc = 0;
                for (long q = 0; q < s->k; q++) {
                    float av = u->fa[i * s->sa + (s->ta ? q * s->m + r : r * s->k + q)];
                    float bv = u->fb[i * s->sb + (s->tb ? j * s->k + q : q * s->n + j)];
                    acc += fabs((double)av * bv);
                }
                scale = acc > scale ? acc : scale;
            }
    for (size_t i = 0; i < u->nc; i++)
        d = fabs((double)x[i] - y[i]) > d ? fabs((double)x[i] - y[i]) : d;
    return scale > 0 ? d / (fabs(s->alpha) * scale) : d;
}

static void check(const Bufs *u)
{
    float *out[6];
    const int sides[6] = {0, 1, 4, 3, 5, 6};
    for (int q = 0; q < 6; q++) {
        memset(u->c, 0, u->nc * sizeof *u->c);
        call(u, sides[q]);
        out[q] = alloc(u->nc * sizeof(float));
        memcpy(out[q], u->c, u->nc * sizeof(float));
    }
    const Shape *s = u->s;
    printf("check %ld %ld %ld %ld %ld %ld %ld %.3g %.3g %.3g %.3g %.3g %.3g\n", s->calls, s->batch, s->m, s->n, s->k,
           s->ta, s->tb, diff(u, out[1], out[0]), diff(u, out[2], out[0]), diff(u, out[2], out[1]),
           diff(u, out[3], out[0]), diff(u, out[4], out[0]), diff(u, out[5], out[0]));
    for (int q = 0; q < 6; q++)
        free(out[q]);
}

static void bench_shape(const Shape *s, int reps)
{
    enum { NS = 6 };
    static const char *names[7] = {"widened", "onednn", "f32", "team", "fsdpc", "whole", "matmul"};
    static const int ids[NS] = {1, 2, 3, 5, 6, 0};
    Bufs u = {.s = s};
    u.na = (size_t)((s->batch - 1) * s->sa + s->m * s->k);
    u.nb = (size_t)((s->batch - 1) * s->sb + s->k * s->n);
    u.nc = (size_t)(s->batch * s->m * s->n);
    u.a = alloc(u.na * 2), u.b = alloc(u.nb * 2);
    u.fa = alloc(u.na * 4), u.fb = alloc(u.nb * 4), u.c = alloc(u.nc * 4);
    for (size_t i = 0; i < u.na; i++) {
        u.a[i] = k_bf16_from_f32((float)((i * 2654435761u) % 1000) / 500.0f - 1.0f);
        u.fa[i] = k_bf16_to_f32(u.a[i]);
    }
    for (size_t i = 0; i < u.nb; i++) {
        u.b[i] = k_bf16_from_f32((float)((i * 40503u + 17) % 997) / 498.5f - 1.0f);
        u.fb[i] = k_bf16_to_f32(u.b[i]);
    }
    memset(u.c, 0, u.nc * 4);
    double t[NS][64];
    for (int q = 0; q < NS; q++) /* warm-up */
        call(&u, ids[q]), call(&u, ids[q]);
    for (int r = 0; r < reps; r++)
        for (int q = 0; q < NS; q++) {
            int side = (q + r) % NS;
            t[side][r] = time_side(&u, ids[side]);
        }
    for (int side = 0; side < NS; side++) {
        printf("t %s %ld %ld %ld %ld %ld %ld %ld %ld %ld", names[ids[side]], s->calls, s->batch, s->sa, s->sb, s->m, s->n,
               s->k, s->ta, s->tb);
        for (int r = 0; r < reps; r++)
            printf(" %.9f", t[side][r]);
        printf("\n");
    }
    check(&u);
    fflush(stdout);
    free(u.a), free(u.b), free(u.fa), free(u.fb), free(u.c);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: bf16_gemm SHAPES REPS\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    if (getenv("FSDPC_GEMM") && !strcmp(getenv("FSDPC_GEMM"), "onednn"))
        k_gemm_use(K_GEMM_ONEDNN); /* the float32 GEMMs (f32, team, whole, widened fsdpc) on oneDNN's sgemm */
    int reps = atoi(argv[2]);
    reps = reps < 1 ? 1 : reps > 64 ? 64 : reps;
    Shape s;
    while (fscanf(f, "%ld %ld %ld %ld %ld %ld %ld %ld %ld %lf", &s.calls, &s.batch, &s.sa, &s.sb, &s.m, &s.n, &s.k,
                  &s.ta, &s.tb, &s.alpha) == 10)
        bench_shape(&s, reps);
    fclose(f);
    return 0;
}
