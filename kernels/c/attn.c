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
 * of a causal bias) are left out of both GEMMs.  So no batch x t x s tensor
 * exists: the forward saves only each row's log-sum-exp, lse = max +
 * log(sum), and the backward recomputes the tile's P = exp(S - lse) from it
 * and forms dV += P^T dY, dP = dY V^T, dS = P (dP - rowsum(dY Y)), dQ =
 * scale dS Kt^T and dKt += scale Q^T dS, tile after tile.
 *
 * Threads.  The forward's (problem, tile) units and the backward's problems
 * are split across the OpenMP team, at most K_ATTN_SLOTS threads (one
 * workspace slot each); the GEMMs run inside the team on the calling thread.
 * A unit's arithmetic does not depend on which thread runs it, and the
 * backward accumulates dKt and dV of a problem tile after tile in order, so
 * results are the same for any thread count.  With a bias gradient (dbias:
 * dS summed over the problems reading each bias slice; a learned bias) the
 * backward's units are the bias slices instead, each running its problems
 * in increasing order, so dbias too is the same for any thread count.  A row
 * whose scores are all -inf gives NaN (as softmax does), or under
 * K_ATTN_ZERO y 0, lse -inf and no gradient (ONNX Attention's row that
 * attends nothing).  Typed bodies are in attn_impl.h.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"
#include "walk.h"

/* the team's size for n units, at most K_ATTN_SLOTS */
static int attn_threads(int64_t n)
{
#ifdef _OPENMP
    int t = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (t > K_ATTN_SLOTS)
        t = K_ATTN_SLOTS;
    return n < t ? (int)(n < 1 ? 1 : n) : t;
#else
    (void)n;
    return 1;
#endif
}

#define T float
#define S f32
#define KM(fn) fn##f
#define K_GEMM cblas_sgemm
#include "attn_impl.h"
#undef T
#undef S
#undef K_GEMM
#undef KM

#define T double
#define S f64
#define KM(fn) fn
#define K_GEMM cblas_dgemm
#include "attn_impl.h"
#undef T
#undef S
#undef K_GEMM
#undef KM
