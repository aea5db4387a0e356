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
 * 3-4 % faster on them (in the GPT step 2.6 % of the Linears' GEMM time,
 * 1.1 % of the step: docs/benchmarks.md), too little for a table of
 * primitives and their scratch outside the arena.  The GEMM API creates no
 * primitive and reorders nothing per call.  The choice is made
 * once, from oneDNN's effective ISA, so DNNL_MAX_CPU_ISA=AVX512_CORE forces
 * the widened path (k_bf16_gemm_native tells which: the executable says so at
 * start, runtime/rt.c).  k_gemm_bf16 is one such GEMM with leading dimensions,
 * for the fused attention's tiles (attn_bf16.c), which call it from every
 * thread of their team, each with its own widening scratch.
 * k_matmul_add_rows_bf16 is a MatMulAdd stored in bfloat16 a block of its
 * float32 scratch's rows at a time: natively a GEMM into the scratch and a
 * k_cast per block; widened, matmul.c's k_matmul_add_rows_16 (one parallel
 * region, each tile rounded into place by the thread that computed it).
 * All three take their thread's share inside a team the step runs (k_share,
 * codegen/team.c): rows of C (or of each block's), or whole matrices of a
 * batch, natively; the widened path's tiles otherwise.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "kernels.h"
#include "walk.h"

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
static void gemm(float *c, int64_t ldc, const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, int64_t m,
                 int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    dnnl_status_t st = dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, (float)alpha, a, lda, b, ldb,
                                             (float)beta, c, ldc);
    if (st != dnnl_success) {
        fprintf(stderr, "fsdpc kernels/c: dnnl_gemm_bf16bf16f32(%c, %c, m %lld, n %lld, k %lld) failed: %s\n",
                ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k, dnnl_status2str(st));
        abort();
    }
}

/* one dense GEMM of a batch: op(A) m x k, op(B) k x n, C m x n, all without gaps */
static void dense(float *c, const uint16_t *a, const uint16_t *b, int64_t m, int64_t n, int64_t k, int ta, int tb,
                  double alpha, double beta)
{
    gemm(c, n, a, ta ? m : k, b, tb ? k : n, m, n, k, ta, tb, alpha, beta);
}

/* this thread alone, inside a team that shares or not: C = bias (each row) + add over rows x n (add may be C;
 * k_matmul_epilogue_f32 with the kernels' own split off, k_share(0), as in the step's `omp master` sections) */
static void preset(float *c, const float *bias, const float *add, int64_t rows, int64_t n)
{
    if (rows <= 0 || (!bias && !add))
        return;
    const int sharing = k_sharing;
    k_share(0);
    k_matmul_epilogue_f32(c, bias, add, rows, n);
    k_share(sharing);
}

/* Inside a team that shares (k_share, codegen/team.c): this thread's part of the GEMM, with its preset of C
 * (bias, add: k_matmul_add's) on the same rows first, so no barrier between them, as matmul_impl.h's
 * matmul_share: rows of one tall GEMM (in multiples of 16), or whole matrices of a batch.  Returns 0 outside
 * such a team.  oneDNN runs on the calling thread inside a parallel region, and its bf16 GEMM gives a block of
 * rows the bits of the whole call on any team (bench/gemmteam.c -DBF16: every shape of the GPT step's, 2 and 3
 * threads), so the team's share keeps the bits of the GEMM's own region. */
static int share(float *c, const uint16_t *a, const uint16_t *b, const float *bias, const float *add, int64_t batch,
                 int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    int64_t lo, hi;
    const int tall = batch == 1 || (sb == 0 && !ta && sa == m * k); /* as matmul's */
    if (!team_share(tall ? batch * m : batch, tall ? n * k : m * n * k, tall ? 16 : 1, &lo, &hi))
        return 0;
    if (lo >= hi)
        return 1;
    if (tall) {
        preset(c + lo * n, bias, add ? add + lo * n : NULL, hi - lo, n);
        gemm(c + lo * n, n, ta ? a + lo : a + lo * k, ta ? batch * m : k, b, tb ? k : n, hi - lo, n, k, ta, tb,
             alpha, beta);
        return 1;
    }
    for (int64_t i = lo; i < hi; i++) {
        preset(c + i * m * n, bias, add ? add + i * m * n : NULL, m, n);
        dense(c + i * m * n, a + i * sa, b + i * sb, m, n, k, ta, tb, alpha, beta);
    }
    return 1;
}

/* a GEMM with no element to compute, or without a native bf16 GEMM: the widened path (k 0: C = beta C, never
 * reading A, B) */
static int widen(int64_t batch, int64_t m, int64_t n, int64_t k)
{
    return batch <= 0 || m <= 0 || n <= 0 || k <= 0 || !bf16_native();
}

static void matmul(float *c, const uint16_t *a, const uint16_t *b, int64_t batch, int64_t sa, int64_t sb,
                   int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    if (widen(batch, m, n, k)) {
        k_matmul_widened_16(c, a, b, batch, sa, sb, m, n, k, ta, tb, alpha, beta, 0);
        return;
    }
    if (share(c, a, b, NULL, NULL, batch, sa, sb, m, n, k, ta, tb, alpha, beta))
        return;
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
    if (widen(batch, m, n, k)) { /* the preset in the GEMM's region, tile by tile */
        k_matmul_add_widened_16(c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb, 0);
        return;
    }
    if (share(c, a, b, bias, add, batch, sa, sb, m, n, k, ta, tb, alpha, bias || add ? 1.0 : 0.0))
        return;
    if (bias || add)
        k_matmul_epilogue_f32(c, bias, add, batch * m, n);
    matmul(c, a, b, batch, sa, sb, m, n, k, ta, tb, alpha, bias || add ? 1.0 : 0.0);
}

/* Natively, a block of rows at a time: the preset, the GEMM into w and the rounding into y.  Inside a team that
 * shares, each thread its rows of every block (team_share: multiples of 16), preset, GEMM and rounding on the
 * calling thread: blocks of the same rows split alike, so a thread reads and writes only its own rows of w and
 * the blocks need no barrier between them; a shorter last block, split otherwise (all on one thread would leave
 * the other idle), waits for the one before it.  The bits of the GEMM's own region (a block of rows keeps the
 * bits of the whole call: share above). */
void k_matmul_add_rows_bf16(uint16_t *y, float *w, int64_t wrows, const uint16_t *a, const uint16_t *b,
                            const float *bias, const float *add, double alpha, int64_t rows, int64_t n, int64_t k,
                            int tb)
{
    if (wrows <= 0 || widen(1, rows, n, k)) {
        k_matmul_add_rows_16(y, w, wrows, a, b, bias, add, alpha, rows, n, k, tb, 0);
        return;
    }
    const int sharing = k_sharing;
    int64_t last = 0; /* the rows of the block before */
    for (int64_t r0 = 0; r0 < rows; r0 += wrows) {
        const int64_t part = rows - r0 < wrows ? rows - r0 : wrows;
        int64_t lo, hi;
        if (!team_share(part, n * k, 16, &lo, &hi)) {
            k_matmul_add_bf16(w, a + r0 * k, b, bias, add ? add + r0 * n : NULL, alpha, 1, 0, 0, part, n, k, 0, tb);
            k_cast(K_DT_BF16, y + r0 * n, K_DT_F32, w, part * n);
            continue;
        }
        if (last && last != part) {
#pragma omp barrier
        }
        last = part;
        if (lo >= hi)
            continue;
        preset(w + lo * n, bias, add ? add + (r0 + lo) * n : NULL, hi - lo, n);
        gemm(w + lo * n, n, a + (r0 + lo) * k, k, b, tb ? k : n, hi - lo, n, k, 0, tb, alpha,
             bias || add ? 1.0 : 0.0);
        k_share(0); /* this thread's rows alone */
        k_cast(K_DT_BF16, y + (r0 + lo) * n, K_DT_F32, w + lo * n, (hi - lo) * n);
        k_share(sharing);
    }
}
