/* attn_bf16.c — fused attention with bfloat16 q, kt, v (k_attention_bf16,
 * k_attention_grad_bf16: --precision bf16's FusedAttention).
 *
 * attn.c's kernel (attn_impl.h's body) with 16-bit GEMM operands, as flash
 * attention computes: scores, softmax statistics and every sum in float32;
 * the tile's P rounded to bfloat16 for P V, and in the backward P and dS
 * rounded for their products.  y, dy, dq, dkt and dval are bfloat16 too
 * (computed in float32, rounded once as stored).  The GEMMs are k_gemm_bf16's: oneDNN's native
 * bf16 GEMM where the CPU has AVX512-BF16, else widened into the thread's
 * slot of the workspace.  Its own object (as matmul_bf16.c) so that only an
 * executable with a bfloat16 attention links libdnnl.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "philox.h"
#include "walk.h"

static void attn_gemm_bf16(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const uint16_t *a,
                           int64_t lda, const uint16_t *b, int64_t ldb, double beta, float *c, int64_t ldc, float *w,
                           int64_t wn)
{
    k_gemm_bf16(c, ldc, a, lda, b, ldb, m, n, k, ta, tb, alpha, beta, w, wn);
}

#define K_SLOT(t, s, d, dv) k_attention_slot_16(t, s, d, dv)
#define K_ROUND k_bf16_from_f32
#define K_WIDEN k_bf16_to_f32
#define T float
#define O uint16_t
#define S bf16
#define KM(fn) fn##f
#include "attn_impl.h"
