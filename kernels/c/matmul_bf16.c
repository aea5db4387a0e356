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
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
    if (!bf16_native()) { /* the preset in the GEMM's region, tile by tile */
        k_matmul_add_widened_16(c, a, b, bias, add, alpha, batch, sa, sb, m, n, k, ta, tb, 0);
        return;
    }
    if (bias || add)
        k_matmul_epilogue_f32(c, bias, add, batch * m, n);
    matmul(c, a, b, batch, sa, sb, m, n, k, ta, tb, alpha, bias || add ? 1.0 : 0.0);
}

void k_matmul_add_rows_bf16(uint16_t *y, float *w, int64_t wrows, const uint16_t *a, const uint16_t *b,
                            const float *bias, const float *add, double alpha, int64_t rows, int64_t n, int64_t k,
                            int tb)
{
    if (!bf16_native() || wrows <= 0) {
        k_matmul_add_rows_16(y, w, wrows, a, b, bias, add, alpha, rows, n, k, tb, 0);
        return;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += wrows) {
        const int64_t part = rows - r0 < wrows ? rows - r0 : wrows;
        k_matmul_add_bf16(w, a + r0 * k, b, bias, add ? add + r0 * n : NULL, alpha, 1, 0, 0, part, n, k, 0, tb);
        k_cast(K_DT_BF16, y + r0 * n, K_DT_F32, w, part * n);
    }
}
