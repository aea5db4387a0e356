/* ew.c — elementwise, layout and broadcast-reduction kernels.
 *
 * How it works.  Every strided kernel here (k_binary, k_transpose,
 * k_reduce_sum_to) first describes its index space as a Walk: a list of dims,
 * each with a length and the element stride of up to two operands along it.
 * Building the Walk drops size-1 dims and merges neighbours that are laid out
 * back to back in every operand, so [2,3,4] + [2,3,4] becomes one flat dim of
 * 24 and [2,3,4] + [4] becomes [6, 4] (b strides 0, 1): the common cases
 * collapse to a rank-1 or rank-2 walk.  The innermost dim is then run by
 * a tight loop specialised on its strides (contiguous / broadcast), and the
 * outer dims advance like an odometer.  A Walk can also be started at any
 * linear position, which is how k_binary and k_transpose split their output
 * across OpenMP threads when the build has -fopenmp.  k_transpose adds one
 * twist: when y's innermost dim is strided in x it copies in square tiles, so
 * a 2-D transpose does not miss the cache on every element.
 *
 * The typed bodies live in ew_impl.h, included once per dtype below.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Most dims a Walk holds after merging; ONNX models in practice stay <= 8. */
#define K_MAX_RANK 16
/* Below this many output elements a thread team costs more than it saves. */
#define K_PAR_MIN ((int64_t)1 << 16)
/* Columns summed at once by k_reduce_sum_to (double accumulators on stack). */
#define K_TILE 256
/* Side of the squares k_transpose copies when it cannot read x in rows. */
#define K_BLOCK 16

/* Internal bug (a caller broke a kernel's contract): say so and abort, also
 * in release builds, rather than write out of bounds. */
static void die(const char *msg)
{
    fprintf(stderr, "fsdpc kernels/c: %s\n", msg);
    abort();
}

typedef struct {
    int rank;
    int64_t shape[K_MAX_RANK];
    int64_t sa[K_MAX_RANK], sb[K_MAX_RANK];  /* element strides of operands a, b */
    int64_t idx[K_MAX_RANK];
    int64_t oa, ob;                          /* offsets of the current index */
} Walk;

/* Appends dim (n, sa, sb) as the new innermost dim, merging it into the
 * previous one when that one steps exactly over n of these in both operands. */
static void walk_push(Walk *w, int64_t n, int64_t sa, int64_t sb)
{
    int r = w->rank;
    if (n == 1)
        return;
    if (r > 0 && w->sa[r - 1] == sa * n && w->sb[r - 1] == sb * n) {
        w->shape[r - 1] *= n;
        w->sa[r - 1] = sa;
        w->sb[r - 1] = sb;
        return;
    }
    if (r == K_MAX_RANK)
        die("rank above 16 after merging dims");
    w->shape[r] = n;
    w->sa[r] = sa;
    w->sb[r] = sb;
    w->rank = r + 1;
}

/* Removes the innermost dim and returns its length and strides; an empty
 * walk yields a single element (length 1, strides 0). */
static int64_t walk_pop(Walk *w, int64_t *sa, int64_t *sb)
{
    if (w->rank == 0) {
        *sa = *sb = 0;
        return 1;
    }
    w->rank--;
    *sa = w->sa[w->rank];
    *sb = w->sb[w->rank];
    return w->shape[w->rank];
}

/* Removes dim d, returning its length and strides. */
static int64_t walk_remove(Walk *w, int d, int64_t *sa, int64_t *sb)
{
    int64_t n = w->shape[d];
    *sa = w->sa[d];
    *sb = w->sb[d];
    w->rank--;
    for (int e = d; e < w->rank; e++) {
        w->shape[e] = w->shape[e + 1];
        w->sa[e] = w->sa[e + 1];
        w->sb[e] = w->sb[e + 1];
    }
    return n;
}

/* The dim whose stride in operand a is sa, or -1. */
static int walk_find_a(const Walk *w, int64_t sa)
{
    for (int d = 0; d < w->rank; d++)
        if (w->sa[d] == sa)
            return d;
    return -1;
}

/* Positions the walk at linear (row-major) index pos. */
static void walk_seek(Walk *w, int64_t pos)
{
    w->oa = w->ob = 0;
    for (int d = w->rank - 1; d >= 0; d--) {
        w->idx[d] = pos % w->shape[d];
        pos /= w->shape[d];
        w->oa += w->idx[d] * w->sa[d];
        w->ob += w->idx[d] * w->sb[d];
    }
}

/* Advances one step; returns 0 when it wrapped back to the start. */
static int walk_next(Walk *w)
{
    for (int d = w->rank - 1; d >= 0; d--) {
        w->oa += w->sa[d];
        w->ob += w->sb[d];
        if (++w->idx[d] < w->shape[d])
            return 1;
        w->oa -= w->sa[d] * w->shape[d];
        w->ob -= w->sb[d] * w->shape[d];
        w->idx[d] = 0;
    }
    return 0;
}

static int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++)
        n *= shape[d];
    return n;
}

/* Dense row-major stride of dim d. */
static int64_t dense_stride(int rank, const int64_t *shape, int d)
{
    return numel(rank - d - 1, shape + d + 1);
}

/* Dense stride of dim i of transpose(x, perm). */
static int64_t perm_stride(int rank, const int64_t *xshape, const int64_t *perm, int i)
{
    int64_t s = 1;
    for (int e = i + 1; e < rank; e++)
        s *= xshape[perm[e]];
    return s;
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Runs f(ctx, lo, hi) over work units [0, total), split across threads when
 * the elements moved (unit_elems per unit) make a thread team pay. */
static void par_range(void (*f)(void *, int64_t, int64_t), void *ctx, int64_t total,
                      int64_t unit_elems)
{
#ifdef _OPENMP
    if (total * unit_elems >= K_PAR_MIN && total > 1 && omp_get_max_threads() > 1 &&
        !omp_in_parallel()) {
#pragma omp parallel
        {
            int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
            int64_t chunk = (total + nt - 1) / nt;
            int64_t lo = min64(t * chunk, total), hi = min64(lo + chunk, total);
            if (lo < hi)
                f(ctx, lo, hi);
        }
        return;
    }
#else
    (void)unit_elems;
#endif
    f(ctx, 0, total);
}

#define KCAT_(a, b) a##_##b
#define KCAT(a, b) KCAT_(a, b)
#define KFN(name) KCAT(name, S)

#define T float
#define S f32
#define KM_EXP expf
#define KM_TANH tanhf
#include "ew_impl.h"
#undef T
#undef S
#undef KM_EXP
#undef KM_TANH

#define T double
#define S f64
#define KM_EXP exp
#define KM_TANH tanh
#include "ew_impl.h"
#undef T
#undef S
#undef KM_EXP
#undef KM_TANH
