/* matmul_bf16.c — bfloat16 GEMMs (k_matmul_bf16, k_matmul_add_bf16) on
 * oneDNN.
 *
 * How it works.  oneDNN's dnnl_gemm_bf16bf16f32 is k_matmul's contract on
 * bfloat16 operands: row-major, op(A) m x k, op(B) k x n, float32 C =
 * alpha op(A) op(B) + beta C, accumulated in float32, on AVX512-BF16's
 * vdpbf16ps where the CPU has it.  Batches as k_matmul_f32: shared B with the
 * A batches back to back untransposed folds into one tall GEMM that oneDNN
 * splits over the OpenMP team; other batches are split across the team, a
 * whole GEMM per thread (inside the team oneDNN runs on the calling thread).
 * Debian's oneDNN is the OpenMP build, so it runs on the team the kernels and
 * OpenBLAS use.
 *
 * Measured (bench/bf16_gemm.py, the bf16 GPT steps' GEMMs, README
 * "Benchmarks") against the operands widened into float32 for cblas_sgemm
 * (matmul.c's k_matmul_widened_16), which remains the path where oneDNN has
 * no native bf16 GEMM: below AVX512-BF16 its bf16 GEMM is emulated and slower
 * than the widened one (and below AVX-512 it has none): 2.6-2.9x float32's
 * time on the GPT steps' GEMMs, and its matmul primitive runs the same
 * emulated gemm:jit there (bench/bf16_gemm.py, 2026-11-28).  With
 * AVX512-BF16 this GEMM runs those shapes at 91-92 % of its rate on a
 * 4096^3 one; oneDNN's brgemm matmul primitive (made once per shape) was
 * 3-4 % faster on them, too little for a cache of primitives and their
 * scratch.  The GEMM API creates no primitive and reorders nothing per call.  The choice is made
 * once, from oneDNN's effective ISA, so DNNL_MAX_CPU_ISA=AVX512_CORE forces
 * the widened path (k_bf16_gemm_native tells which: the executable says so at
 * start, runtime/rt.c).  k_gemm_bf16 is one such GEMM with leading dimensions,
 * for the fused attention's tiles (attn_bf16.c), which call it from every
 * thread of their team, each with its own widening scratch.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "kernels.h"

#if DNNL_CPU_RUNTIME != DNNL_RUNTIME_OMP
#error "fsdpc needs oneDNN's OpenMP build (Debian's libdnnl-dev): its GEMMs must run on the kernels' OpenMP team"
#endif

#if DNNL_VERSION_MAJOR < 3
/* exported by oneDNN 2.x, declared in its public header from 3.0 */
dnnl_status_t DNNL_API dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K,
                                             float alpha, const uint16_t *A, dnnl_dim_t lda, const uint16_t *B,
                                             dnnl_dim_t ldb, float beta, float *C, dnnl_dim_t ldc);
#endif

_Static_assert(K_DNNL_ISA_AVX512_CORE_BF16 == (unsigned)dnnl_cpu_isa_avx512_core_bf16,
               "kernels.h's K_DNNL_ISA_AVX512_CORE_BF16 is not oneDNN's dnnl_cpu_isa_avx512_core_bf16");

/* 1: oneDNN's bf16 GEMM runs natively here (AVX512-BF16 or above), 0: widen; -1 before the first call (atomic:
 * the fused attention asks from every thread of its team) */
static _Atomic int native = -1;

static int bf16_native(void)
{
    if (native < 0)
        native = k_bf16_isa_native((unsigned)dnnl_get_effective_cpu_isa());
    return native;
}

int k_bf16_gemm_native(void) { return bf16_native(); }

/* C (m x n, ldc) = alpha op(A) op(B) + beta C for one matrix pair (leading
 * dimensions lda, ldb, ldc); a failure is one line naming the call, then
 * abort (the shapes were checked long before, so it is an internal bug or
 * oneDNN out of memory) */
static void prim_gemm(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                      int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta);
static int use_prim(int64_t m, int64_t n, int64_t k);

static void gemm(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, int64_t m,
                 int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    if (use_prim(m, n, k)) {
        prim_gemm(c, ldc, a, lda, b, ldb, m, n, k, ta, tb, alpha, beta);
        return;
    }
    dnnl_status_t st = dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, (float)alpha, a, lda, b, ldb,
                                             (float)beta, c, ldc);
    if (st != dnnl_success) {
        fprintf(stderr, "fsdpc kernels/c: dnnl_gemm_bf16bf16f32(%c, %c, m %lld, n %lld, k %lld) failed: %s\n",
                ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k, dnnl_status2str(st));
        abort();
    }
}

/* ---- oneDNN's matmul primitive for the step's Linears ----------------------
 *
 * A top-level GEMM (not inside a team) of the step's sizes runs on oneDNN's
 * bf16 matmul primitive (brgemm), made the first time its shape comes and
 * kept in a small table: on the GPT steps' GEMMs it took 0.96-0.97x the
 * GEMM API's time (bench/bf16_gemm.py's matmul side), the API packing both
 * operands inside every call.  alpha is the primitive's output scale, beta a
 * sum post-op.  Its scratch is oneDNN's (library mode), outside the arena.
 * Calls inside a team (the batch split below, the attention's tiles) and the
 * largest GEMMs (a 4096^3 one ran 14 % slower on it) keep the API. */
enum { PRIMS = 64 };
#define PRIM_MIN_MNK ((double)(1 << 21))
#define PRIM_MAX_MNK ((double)(1 << 30))
typedef struct {
    int64_t m, n, k, lda, ldb, ldc;
    int ta, tb;
    float alpha, beta;
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3]; /* A, B, C: their handles set per call */
} Prim;
static Prim prims[PRIMS];
static int nprims, next_evict;
static dnnl_engine_t engine;
static dnnl_stream_t stream;

static void dnnl_check(dnnl_status_t st, const char *what, int64_t m, int64_t n, int64_t k)
{
    if (st != dnnl_success) {
        fprintf(stderr, "fsdpc kernels/c: %s (bf16 matmul m %lld, n %lld, k %lld) failed: %s\n", what, (long long)m,
                (long long)n, (long long)k, dnnl_status2str(st));
        abort();
    }
}

static void prim_free(Prim *p)
{
    dnnl_primitive_destroy(p->prim);
    for (int q = 0; q < 3; q++)
        dnnl_memory_destroy(p->mem[q]);
}

static Prim *prim_get(int64_t ldc, int64_t lda, int64_t ldb, int64_t m, int64_t n, int64_t k, int ta, int tb,
                      float alpha, float beta)
{
    for (int i = 0; i < nprims; i++) {
        Prim *p = &prims[i];
        if (p->m == m && p->n == n && p->k == k && p->lda == lda && p->ldb == ldb && p->ldc == ldc && p->ta == ta &&
            p->tb == tb && p->alpha == alpha && p->beta == beta)
            return p;
    }
    if (!engine) {
        dnnl_check(dnnl_engine_create(&engine, dnnl_cpu, 0), "dnnl_engine_create", m, n, k);
        dnnl_check(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "dnnl_stream_create", m, n, k);
    }
    Prim *p = nprims < PRIMS ? &prims[nprims++] : &prims[next_evict++ % PRIMS];
    if (p->prim)
        prim_free(p);
    *p = (Prim){m, n, k, lda, ldb, ldc, ta, tb, alpha, beta, NULL, {NULL, NULL, NULL}};
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
    dnnl_dims_t as = {ta ? 1 : lda, ta ? lda : 1}, bs = {tb ? 1 : ldb, tb ? ldb : 1}, cs = {ldc, 1};
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_check(dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as), "A's memory desc", m, n, k);
    dnnl_check(dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs), "B's memory desc", m, n, k);
    dnnl_check(dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs), "C's memory desc", m, n, k);
    dnnl_matmul_desc_t md;
    dnnl_check(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd), "dnnl_matmul_desc_init", m, n, k);
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t ops;
    dnnl_check(dnnl_primitive_attr_create(&attr), "dnnl_primitive_attr_create", m, n, k);
    dnnl_check(dnnl_post_ops_create(&ops), "dnnl_post_ops_create", m, n, k);
    if (alpha != 1.0f)
        dnnl_check(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha), "output scales", m, n, k);
    if (beta != 0.0f)
        dnnl_check(dnnl_post_ops_append_sum(ops, beta), "sum post-op", m, n, k);
    dnnl_check(dnnl_primitive_attr_set_post_ops(attr, ops), "post-ops", m, n, k);
    dnnl_primitive_desc_t pd;
    dnnl_check(dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL), "dnnl_primitive_desc_create", m, n, k);
    dnnl_check(dnnl_primitive_create(&p->prim, pd), "dnnl_primitive_create", m, n, k);
    const dnnl_memory_desc_t *mds[3] = {&amd, &bmd, &cmd};
    for (int q = 0; q < 3; q++)
        dnnl_check(dnnl_memory_create(&p->mem[q], mds[q], engine, DNNL_MEMORY_NONE), "dnnl_memory_create", m, n, k);
    dnnl_primitive_desc_destroy(pd);
    dnnl_post_ops_destroy(ops);
    dnnl_primitive_attr_destroy(attr);
    return p;
}

/* 1 where gemm() runs on the matmul primitive: outside a team, of the step's sizes */
static int use_prim(int64_t m, int64_t n, int64_t k)
{
    const double mnk = (double)m * (double)n * (double)k;
#ifdef _OPENMP
    if (omp_in_parallel())
        return 0;
#endif
    return mnk > PRIM_MIN_MNK && mnk <= PRIM_MAX_MNK;
}

static void prim_gemm(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                      int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    Prim *p = prim_get(ldc, lda, ldb, m, n, k, ta, tb, (float)alpha, (float)beta);
    dnnl_check(dnnl_memory_set_data_handle(p->mem[0], (void *)a), "A's handle", m, n, k);
    dnnl_check(dnnl_memory_set_data_handle(p->mem[1], (void *)b), "B's handle", m, n, k);
    dnnl_check(dnnl_memory_set_data_handle(p->mem[2], c), "C's handle", m, n, k);
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->mem[0]}, {DNNL_ARG_WEIGHTS, p->mem[1]}, {DNNL_ARG_DST, p->mem[2]}};
    dnnl_check(dnnl_primitive_execute(p->prim, stream, 3, args), "dnnl_primitive_execute", m, n, k);
    dnnl_check(dnnl_stream_wait(stream), "dnnl_stream_wait", m, n, k);
}

/* one dense GEMM of a batch: op(A) m x k, op(B) k x n, C m x n, all without gaps */
static void dense(float *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n, int64_t k, int ta, int tb,
                  double alpha, double beta)
{
    gemm(c, n, a, ta ? m : k, b, tb ? k : n, m, n, k, ta, tb, alpha, beta);
}

static void matmul(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                   int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    if (batch <= 0 || m <= 0 || n <= 0 || k <= 0 || !bf16_native()) { /* k 0: C = beta C, never reading A, B */
        k_matmul_widened_16(c, a, b, batch, sa, sb, m, n, k, ta, tb, alpha, beta, 0);
        return;
    }
    if (batch == 1 || (sb == 0 && !ta && sa == m * k)) {
        dense(c, a, b, batch * m, n, k, ta, tb, alpha, beta);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < batch; i++)
        dense(c + i * m * n, a + i * sa, b + i * sb, m, n, k, ta, tb, alpha, beta);
}

void k_gemm_bf16(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, int64_t m,
                 int64_t n, int64_t k, int ta, int tb, double alpha, double beta, float *w, int64_t wn)
{
    if (m <= 0 || n <= 0 || k <= 0 || !bf16_native())
        k_gemm_widened_16(c, ldc, a, lda, b, ldb, m, n, k, ta, tb, alpha, beta, 0, w, wn);
    else
        gemm(c, ldc, a, lda, b, ldb, m, n, k, ta, tb, alpha, beta);
}

void k_matmul_bf16(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                   int64_t m, int64_t n, int64_t k, int ta, int tb, double beta)
{
    matmul(c, a, b, batch, sa, sb, m, n, k, ta, tb, 1.0, beta);
}

void k_matmul_add_bf16(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add,
                       double alpha, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                       int tb)
{
    if (bias || add)
        k_matmul_epilogue_f32(c, bias, add, batch * m, n);
    matmul(c, a, b, batch, sa, sb, m, n, k, ta, tb, alpha, bias || add ? 1.0 : 0.0);
}
