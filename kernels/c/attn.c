/* attn.c — fused scaled-dot-product attention, forward and backward
 * (the FusedAttention op that passes/attention.c makes from the exported
 * MatMul, scale, mask, Softmax, MatMul chain).
 *
 * How it works.  Each of the batch problems (batch = the leading dims, B H
 * for a transformer) is Q (t x d), the keys transposed Kt (d x s, as the
 * exported graphs hold them), V (s x dv) and an optional additive bias
 * (t x s, broadcast over the batch: the causal mask is a bias of 0 and
 * -inf).  Queries are taken K_ATTN_ROWS rows at a time: the tile's scores
 * S = scale Q_tile Kt + bias (one GEMM, K_ATTN_ROWS x s) live only in the
 * thread's slot of the workspace, become P = softmax(S) in place (row max,
 * exp, sum in double) and Y_tile = P V (a second GEMM).  Columns past the
 * last finite bias entry of every row of the tile (the masked upper triangle
 * of a causal bias) are left out of both GEMMs; under K_ATTN_CAUSAL exp is
 * taken only up to each row's last visible key, rounded up to 16 (the rest
 * is P = 0 written, and the masked lanes before it take exp(0), zeroed
 * after: libmvec's vector expf is slow on lanes of -inf; the rounding keeps
 * the bias path's bits).  So no batch x t x s tensor
 * exists: the forward saves only each row's log-sum-exp, lse = max +
 * log(sum), and the backward recomputes the tile's P = exp(S - lse) from it
 * and forms dV += P^T dY, dP = dY V^T, dS = P (dP - rowsum(dY Y)), dQ =
 * scale dS Kt^T and dKt += scale Q^T dS, tile after tile.
 *
 * Attention dropout (drop > 0: the Dropout between Softmax and P V that
 * passes/attention.c fused, as GPT-2, BERT and T5 train): each element of
 * P is kept with the flag k_dropout would draw for it in the [batch, t, s]
 * tensor (philox.h: a pure function of seed, stream, step and the flat
 * index), so neither a mask nor P is stored; the backward draws the flags
 * again.  y = (P keep / (1 - drop)) V with lse the undropped softmax's.
 *
 * Threads.  The forward's (problem, tile) units and the backward's problems
 * are split across the OpenMP team, at most K_ATTN_SLOTS threads (one
 * workspace slot each): the kernel's own region, or inside the step's team
 * that shares (k_share, codegen/team.c) each thread's static share of the
 * units without a fork (walk.h's attn_share); the GEMMs run inside the team
 * on the calling thread.
 * A unit's arithmetic does not depend on which thread runs it, and the
 * backward accumulates dKt and dV of a problem tile after tile in order, so
 * results are the same for any thread count.  Grouped-query attention (kvrep
 * > 1: query problem b reads K/V problem b / kvrep, passes/attention.c) is
 * read in place: the backward's unit is then a K/V problem, running its
 * kvrep query problems in increasing order, so their dKt and dV sum in one
 * order.  With a bias gradient (dbias:
 * dS summed over the problems reading each bias slice; a learned bias) the
 * backward's units are the bias slices instead, each running its problems
 * in increasing order, so dbias too is the same for any thread count (one
 * unit for all where a K/V group spans bias slices).  A row
 * whose scores are all -inf gives NaN (as softmax does), or under
 * K_ATTN_ZERO y 0, lse -inf and no gradient (ONNX Attention's row that
 * attends nothing).  Typed bodies are in attn_impl.h.
 *
 * 16-bit operands (--precision fp16 here, bf16 in attn_bf16.c, whose GEMM
 * needs oneDNN).  q, kt and v are float16 and every GEMM takes 16-bit
 * operands with float32 accumulation, as flash attention does: the scores,
 * the softmax statistics, y, lse and the gradients stay float32, and the
 * tile's P (for P V), dY (for dV and dP) and dS (for dQ and dKt) are rounded
 * to 16 bits before their products, into the thread's slot.  The float16
 * GEMMs are k_gemm_widened_16's (OpenBLAS has none), each thread widening
 * into the rest of its slot (k_attention_slot_16).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "philox.h"
#include "walk.h"

/* the typed GEMMs of attn_impl.h: C (m x n, ldc) = alpha op(A) op(B) + beta C, row-major; w, wn: the widened
 * 16-bit GEMM's scratch (the f32 and f64 GEMMs need none) */
static void attn_gemm_f32(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const float *a, int64_t lda,
                          const float *b, int64_t ldb, double beta, float *c, int64_t ldc, float *w, int64_t wn)
{
    (void)w, (void)wn;
    k_gemm_f32(c, ldc, a, lda, b, ldb, m, n, k, ta, tb, alpha, beta); /* OpenBLAS or oneDNN: matmul.c */
}

static void attn_gemm_f64(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                          int64_t lda, const double *b, int64_t ldb, double beta, double *c, int64_t ldc, double *w,
                          int64_t wn)
{
    (void)w, (void)wn;
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* float16 operands: k_matmul_f16's GEMM, widened (OpenBLAS has no float16 GEMM) */
static void attn_gemm_f16(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const uint16_t *a,
                          int64_t lda, const uint16_t *b, int64_t ldb, double beta, float *c, int64_t ldc, float *w,
                          int64_t wn)
{
    k_gemm_widened_16(c, ldc, a, lda, b, ldb, m, n, k, ta, tb, alpha, beta, 1, w, wn);
}

#define K_SLOT(t, s, d, dv) k_attention_slot(t, s)

#define T float
#define O float
#define S f32
#define KM(fn) fn##f
#include "attn_impl.h"
#undef T
#undef O
#undef S
#undef KM

#define T double
#define O double
#define S f64
#define KM(fn) fn
#include "attn_impl.h"
#undef T
#undef O
#undef S
#undef KM
#undef K_SLOT

#define K_SLOT(t, s, d, dv) k_attention_slot_16(t, s, d, dv)
#define K_ROUND k_f16_from_f32
#define K_WIDEN k_f16_to_f32
#define T float
#define O uint16_t
#define S f16
#define KM(fn) fn##f
#include "attn_impl.h"
#undef T
#undef O
#undef S
#undef KM
#undef K_ROUND
#undef K_WIDEN
#undef K_SLOT
