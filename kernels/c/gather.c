/* gather.c — Gather along one axis and its backward (scatter-add), the
 * embedding lookup of a language model.
 *
 * How it works.  x is viewed as outer x axis x inner, where axis is the
 * gathered dim: every index selects a contiguous row of `inner` elements, so
 * the forward is one memcpy per (outer position, index), for any dtype
 * (esize bytes per element), split across OpenMP threads by output row.  All
 * indices are validated before anything is written, so a bad token id
 * leaves y untouched and comes back as its position, like k_cross_entropy's
 * label check.
 *
 * The backward adds dy's rows into a zeroed dx at the selected rows.  Two
 * indices may select the same row (a repeated token), so rows cannot be
 * split across threads; instead the work unit is (outer position, block of
 * K_COLS columns), each unit running over all indices in ascending order.
 * Units touch disjoint dx elements and every element sums in index order,
 * so the result is deterministic whatever the thread count.
 *
 * GatherElements indexes element by element: idx has x's rank, and every
 * idx element replaces its own coordinate along the axis.  idx is viewed as
 * columns along the axis (a column: one position of idx's other dims); a
 * column's elements lie istep apart in idx (and y, dy), the x elements it
 * may read xstep apart.  Columns read and write disjoint x elements (their
 * other coordinates differ), so both directions split columns across
 * threads, and the backward sums every dx element in index order.  The
 * backward is also ScatterElements' scatter (passes/expand.c), whose indices
 * nothing checked before: it checks them as the forward does.
 *
 * GatherND and ScatterND index with tuples: k_nd_index turns each tuple
 * (checked, negatives wrapped) into a position in the indexed dims
 * flattened, so fold writes them as Gather / GatherGrad along one axis.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "walk.h"

/* Columns per work unit of the backward. */
#define K_COLS 1024

typedef struct {
    size_t row;          /* bytes per row = inner esize */
    char *y;
    const char *x;
    const int64_t *idx;
    int64_t axis, nidx;
} GatherJob;

/* Output rows [lo, hi); row u is (o, i) = (u / nidx, u % nidx). */
static void gather_rows(void *ctx, int64_t lo, int64_t hi)
{
    const GatherJob *j = ctx;
    for (int64_t u = lo; u < hi; u++) {
        int64_t o = u / j->nidx, k = j->idx[u % j->nidx];
        if (k < 0)
            k += j->axis;
        memcpy(j->y + (size_t)u * j->row, j->x + (size_t)(o * j->axis + k) * j->row, j->row);
    }
}

int64_t k_gather(int esize, void *y, const void *x, const int64_t *idx, int64_t outer,
                 int64_t axis, int64_t inner, int64_t nidx)
{
    GatherJob j = {(size_t)(inner * esize), y, x, idx, axis, nidx};
    for (int64_t i = 0; i < nidx; i++)
        if (idx[i] < -axis || idx[i] >= axis)
            return i;
    if (inner > 0)
        par_range(gather_rows, &j, outer * nidx, inner);
    return -1;
}

/* ---- GatherElements ------------------------------------------------------ */

typedef struct {
    int rank, axis;
    int64_t cols, len, istep, xstep, axdim;
    int64_t shape[K_MAX_RANK], is[K_MAX_RANK], xs[K_MAX_RANK]; /* idx's shape, idx and x strides */
} Columns;

static Columns columns(int rank, const int64_t *shape, const int64_t *xshape, int axis)
{
    Columns c = {rank, axis, 1, 0, 0, 0, 0, {0}, {0}, {0}};
    if (rank < 1 || rank > K_MAX_RANK || axis < 0 || axis >= rank)
        die("k_gather_elements: rank or axis out of range");
    int64_t si = 1, sx = 1;
    for (int d = rank - 1; d >= 0; d--) {
        if (d != axis && shape[d] > xshape[d])
            die("k_gather_elements: indices longer than x along a dim other than the axis");
        c.shape[d] = shape[d], c.is[d] = si, c.xs[d] = sx;
        si *= shape[d], sx *= xshape[d];
        if (d != axis)
            c.cols *= shape[d];
    }
    c.len = shape[axis], c.istep = c.is[axis], c.xstep = c.xs[axis], c.axdim = xshape[axis];
    return c;
}

/* column u's first element: its offsets in idx and in x */
static void column_at(const Columns *c, int64_t u, int64_t *oi, int64_t *ox)
{
    *oi = *ox = 0;
    for (int d = c->rank - 1; d >= 0; d--)
        if (d != c->axis) {
            int64_t m = u % c->shape[d];
            u /= c->shape[d];
            *oi += m * c->is[d], *ox += m * c->xs[d];
        }
}

typedef struct {
    const Columns *c;
    size_t es;
    char *y;
    const char *x;
    const int64_t *idx;
} ColumnJob;

static void gather_columns(void *ctx, int64_t lo, int64_t hi)
{
    const ColumnJob *j = ctx;
    const Columns *c = j->c;
    for (int64_t u = lo; u < hi; u++) {
        int64_t oi, ox;
        column_at(c, u, &oi, &ox);
        for (int64_t a = 0; a < c->len; a++, oi += c->istep) {
            int64_t k = j->idx[oi] < 0 ? j->idx[oi] + c->axdim : j->idx[oi];
            memcpy(j->y + (size_t)oi * j->es, j->x + (size_t)(ox + k * c->xstep) * j->es, j->es);
        }
    }
}

int64_t k_gather_elements(int esize, void *y, const void *x, const int64_t *idx, int rank,
                          const int64_t *shape, const int64_t *xshape, int axis)
{
    Columns c = columns(rank, shape, xshape, axis);
    ColumnJob j = {&c, (size_t)esize, y, x, idx};
    for (int64_t i = 0; i < c.cols * c.len; i++)
        if (idx[i] < -c.axdim || idx[i] >= c.axdim)
            return i;
    par_range(gather_columns, &j, c.cols, c.len);
    return -1;
}

/* ---- GatherND / ScatterND index tuples ------------------------------------- */

int64_t k_nd_index(int64_t *y, const int64_t *idx, int64_t batch, int64_t nq, int k, const int64_t *dims)
{
    int64_t span = 1;
    if (k < 1 || k > 8)
        die("k_nd_index: tuple length out of range");
    for (int i = 0; i < k; i++)
        span *= dims[i];
    for (int64_t i = 0; i < batch * nq * k; i++)
        if (idx[i] < -dims[i % k] || idx[i] >= dims[i % k])
            return i;
    for (int64_t t = 0; t < batch * nq; t++) {
        const int64_t *p = idx + t * k;
        int64_t off = 0;
        for (int i = 0; i < k; i++)
            off = off * dims[i] + (p[i] < 0 ? p[i] + dims[i] : p[i]);
        y[t] = t / nq * span + off;
    }
    return -1;
}

#define T float
#define S f32
#include "gather_impl.h"
#undef T
#undef S

#define T double
#define S f64
#include "gather_impl.h"
#undef T
#undef S
