/* matmul.c — batched GEMM on top of CBLAS (OpenBLAS).
 *
 * How it works.  k_matmul is row-major throughout: op(A_i) is m x k, op(B_i)
 * is k x n, C_i is dense m x n.  A transposed operand is just a different
 * leading dimension handed to cblas_?gemm, so no data is moved.  Batches are
 * one GEMM call each, except when B is shared (sb == 0) and the A batches sit
 * back to back untransposed: then the batch folds into the rows and the whole
 * thing is a single (batch*m) x n GEMM, which lets OpenBLAS thread and block
 * across it (the Linear-layer-on-[B,S,D] case).
 *
 * BLAS corner cases are handled here rather than passed through: k == 0 is a
 * plain C = beta C (BLAS would reject a zero leading dimension), and beta == 0
 * never reads C, so an uninitialised arena slot cannot leak NaN in.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>

#include "kernels.h"

/* CBLAS takes int dims; fsdpc's shapes are checked long before this, so a
 * larger one is an internal bug: abort loudly, also in release builds. */
static void check_dims(int64_t m, int64_t n, int64_t k)
{
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
        fprintf(stderr, "fsdpc kernels/c: k_matmul dim above INT_MAX (%lld, %lld, %lld)\n",
                (long long)m, (long long)n, (long long)k);
        abort();
    }
}

#define KCAT_(a, b) a##_##b
#define KCAT(a, b) KCAT_(a, b)
#define KFN(name) KCAT(name, S)

#define T float
#define S f32
#define K_GEMM cblas_sgemm
#include "matmul_impl.h"
#undef T
#undef S
#undef K_GEMM

#define T double
#define S f64
#define K_GEMM cblas_dgemm
#include "matmul_impl.h"
#undef T
#undef S
#undef K_GEMM
