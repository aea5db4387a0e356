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
