/* reduce.c — reductions over axes, ReduceMax's and ReduceProd's backward, Softmax and
 * LogSoftmax over one axis with their backward, Trilu and Range.
 *
 * How it works.  A reduction splits x's dims into kept ones (yshape[d] ==
 * xshape[d]) and reduced ones (yshape[d] == 1), each a Walk (walk.h) with
 * its strides in x; y is dense over the kept dims in order, so its index is a
 * plain counter.  Two loop orders cover every case: when x's innermost dim
 * is reduced, each y element is a run of contiguous sums (four independent
 * double chains, so the add latency does not bind); when it is kept, rows of
 * y are accumulated K_TILE columns at a time in double accumulators on the
 * stack, so x is still read in contiguous runs.  Sums, means and products
 * accumulate in double; max / min are exact in any type and propagate NaN.
 *
 * Softmax sees x as outer x axis x inner.  With inner == 1 each row is
 * contiguous; otherwise K_TILE inner columns are handled together with per-
 * column maxima and sums on the stack.  Either way: subtract the max,
 * exponentiate in the dtype (as torch does), sum in double, normalise.  The
 * backward computes the per-column dot product (softmax) or sum
 * (log-softmax) first and writes dx after, which is what lets dx alias dy.
 * Typed bodies are in reduce_impl.h; k_reduce_sum_to_bf16 / _f16 (a bias
 * gradient of 16-bit dY under --precision) are its sums with x's elements
 * widened as they are loaded.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "walk.h"

/* Softmax's float64 rows and log-softmax's backward take exp in double: libmvec's vector exp for them (fused.h's
 * KF_SIMD), declared in this file only, so that no fused row's double exp is libmvec's (fused.h says why) */
#ifdef KF_SIMD
KF_SIMD(double, exp)
#endif

/* Identity of each reduction (the value over zero elements, MEAN aside). */
static double red_init(int op)
{
    return op == K_RMAX ? -INFINITY : op == K_RMIN ? INFINITY : op == K_RPROD ? 1 : 0;
}

/* Folds v into acc; a NaN, once in, stays (v > NaN and v < NaN are false). */
static inline double red_max(double acc, double v) { return v > acc || v != v ? v : acc; }
static inline double red_min(double acc, double v) { return v < acc || v != v ? v : acc; }

/* Splits x's dims into the kept and reduced walks (x strides in sa); returns
 * 1 when x's innermost non-1 dim is kept (or there is none) and pops that dim
 * into *n; *count = elements per reduced group. */
static int reduce_split(int rank, const int64_t *xshape, const int64_t *yshape,
                        Walk *kept, Walk *red, int64_t *n, int64_t *count)
{
    int inner_kept = 1;
    int64_t unused;
    *count = 1;
    for (int d = 0; d < rank; d++) {
        if (yshape[d] == 1)
            *count *= xshape[d];
        if (xshape[d] == 1)
            continue;
        inner_kept = yshape[d] != 1;
        if (inner_kept && yshape[d] != xshape[d])
            die("k_reduce: y dim neither 1 nor x's");
        walk_push(inner_kept ? kept : red, xshape[d], dense_stride(rank, xshape, d), 0);
    }
    /* the innermost non-1 dim has stride 1: only its length matters */
    *n = walk_pop(inner_kept ? kept : red, &unused, &unused);
    return inner_kept;
}

/* The walks of the backward kernels: kept and reduced dims of x, each with all of its dims (the innermost
 * back on its side), the kept one at its start; 0 when x is empty. */
static int group_walks(int rank, const int64_t *xshape, const int64_t *yshape, Walk *kept, Walk *red)
{
    int64_t n, count;
    if (numel(rank, xshape) == 0)
        return 0;
    int inner_kept = reduce_split(rank, xshape, yshape, kept, red, &n, &count);
    walk_push(inner_kept ? kept : red, n, 1, 0);
    walk_seek(kept, 0);
    return 1;
}

/* ---- k_trilu, k_range_i64 ----------------------------------------------- */

void k_trilu(int esize, int upper, void *y, const void *x, int64_t batch,
             int64_t rows, int64_t cols, int64_t k)
{
    const size_t e = (size_t)esize;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < rows; i++) {
            size_t off = (size_t)((b * rows + i) * cols) * e;
            char *yr = (char *)y + off;
            const char *xr = (const char *)x + off;
            /* kept columns [lo, hi) */
            int64_t lo = upper ? max64(0, min64(cols, i + k)) : 0;
            int64_t hi = upper ? cols : max64(0, min64(cols, i + k + 1));
            memset(yr, 0, (size_t)lo * e);
            if (yr != xr && hi > lo)
                memcpy(yr + (size_t)lo * e, xr + (size_t)lo * e, (size_t)(hi - lo) * e);
            memset(yr + (size_t)hi * e, 0, (size_t)(cols - hi) * e);
        }
}

void k_range_i64(int64_t *y, int64_t start, int64_t delta, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = start + i * delta;
}

#define T float
#define S f32
#define KM(fn) fn##f
#include "reduce_impl.h"
#undef T
#undef S
#undef KM

#define T double
#define S f64
#define KM(fn) fn
#include "reduce_impl.h"
#undef T
#undef S
#undef KM

/* k_reduce_sum_to of 16-bit x (a bias gradient of a bfloat16 / float16 dY), float32 y */
#define K_SUM16
#define T float
#define X uint16_t
#define S bf16
#define XW(v) k_bf16_to_f32(v)
#include "reduce_impl.h"
#undef S
#define X uint16_t
#define S f16
#define XW(v) k_f16_to_f32(v)
#include "reduce_impl.h"
#undef T
#undef S
#undef K_SUM16
