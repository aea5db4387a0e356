/* copy.c — layout kernels: transpose, strided copy and accumulate, Pad.
 *
 * How it works.  k_copy_strided is the one data-movement primitive behind
 * Slice, Split, Concat, Expand and Tile: an index space `shape` with a
 * stride for the destination and one for the source.  It builds a Walk
 * (walk.h; a = x strides, b = y strides), which merges dims that are
 * contiguous in both, pops the innermost dim and copies it with memcpy when
 * both sides are contiguous there, else with a strided loop per element
 * size.  Because the destination positions are distinct, the index space can
 * be split across OpenMP threads by linear position.  k_accum_strided is the
 * same walk with += (serial, so repeated destinations sum in a fixed order).
 *
 * k_transpose walks y densely; y dim i steps x by x's stride along perm[i].
 * Dims that stay adjacent under perm merge, so e.g. [B,S,H,D] -> [B,H,S,D]
 * copies whole D-rows.  When y's innermost dim is strided in x, the y dim
 * that is contiguous in x is paired with it and copied in K_BLOCK squares,
 * so a 2-D transpose does not miss the cache on every element.
 *
 * k_pad works row by row over y (all dims but the last): each outer index
 * maps to a source index per mode (or to "constant"), and the last dim is
 * written as [left pad | copied run | right pad].  Its backward walks the
 * same map and adds dy into dx.  Typed bodies are in copy_impl.h.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "walk.h"

/* Side of the squares k_transpose copies when it cannot read x in rows. */
#define K_BLOCK 16

/* Dense stride of dim i of transpose(x, perm). */
static int64_t perm_stride(int rank, const int64_t *xshape, const int64_t *perm, int i)
{
    int64_t s = 1;
    for (int e = i + 1; e < rank; e++)
        s *= xshape[perm[e]];
    return s;
}

/* ---- sharing a team (walk.h's par_range) --------------------------------- */

_Thread_local int k_sharing;

void k_share(int on) { k_sharing = on; }

/* ---- k_copy_strided ----------------------------------------------------- */

#define K_COPY_ROW(U)                                                              \
    do {                                                                           \
        U *yy = y;                                                                 \
        const U *xx = x;                                                           \
        for (int64_t i = 0; i < n; i++)                                            \
            yy[i * iy] = xx[i * ix];                                               \
    } while (0)

static void copy_row(int esize, void *y, const void *x, int64_t n, int64_t iy, int64_t ix)
{
    if (iy == 1 && ix == 1) {
        memcpy(y, x, (size_t)n * (size_t)esize);
        return;
    }
    switch (esize) {
    case 1: K_COPY_ROW(uint8_t); break;
    case 2: K_COPY_ROW(uint16_t); break;
    case 4: K_COPY_ROW(uint32_t); break;
    case 8: K_COPY_ROW(uint64_t); break;
    default: die("k_copy_strided: esize not 1, 2, 4 or 8");
    }
}

typedef struct {
    int esize;
    char *y;
    const char *x;
    Walk outer;          /* sa = x strides, sb = y strides */
    int64_t n, ix, iy;   /* the innermost dim */
} CopyJob;

/* Copies linear positions [lo, hi) of the index space. */
static void copy_range(void *ctx, int64_t lo, int64_t hi)
{
    const CopyJob *j = ctx;
    const int64_t e = j->esize;
    Walk w = j->outer;
    int64_t col = lo % j->n;
    walk_seek(&w, lo / j->n);
    for (int64_t pos = lo; pos < hi; col = 0, walk_next(&w)) {
        int64_t len = min64(j->n - col, hi - pos);
        copy_row(j->esize, j->y + (w.ob + col * j->iy) * e, j->x + (w.oa + col * j->ix) * e,
                 len, j->iy, j->ix);
        pos += len;
    }
}

void k_copy_strided(int esize, int rank, const int64_t *shape, void *y, int64_t yoff,
                    const int64_t *ys, const void *x, int64_t xoff, const int64_t *xs)
{
    CopyJob j = {.esize = esize, .y = (char *)y + yoff * esize,
                 .x = (const char *)x + xoff * esize};
    int64_t total = numel(rank, shape);
    if (total == 0)
        return;
    for (int d = 0; d < rank; d++) {
        if (shape[d] > 1 && ys[d] == 0)
            die("k_copy_strided: y stride 0 on a dim of length > 1");
        walk_push(&j.outer, shape[d], xs[d], ys[d]);
    }
    j.n = walk_pop(&j.outer, &j.ix, &j.iy);
    par_range(copy_range, &j, total, 1);
}

/* ---- pad index maps ----------------------------------------------------- */

/* Source index along a dim of length n for padded position j (= output index
 * minus the begin pad), or -1 when a CONSTANT pad covers it. */
static int64_t pad_src(int mode, int64_t j, int64_t n)
{
    if (j >= 0 && j < n)
        return j;
    switch (mode) {
    case K_PAD_CONSTANT:
        return -1;
    case K_PAD_EDGE:
        return j < 0 ? 0 : n - 1;
    case K_PAD_REFLECT: {
        int64_t p = 2 * (n - 1);  /* the reflection pattern's period */
        if (p == 0)
            return 0;
        j %= p;
        if (j < 0)
            j += p;
        return j < n ? j : p - j;
    }
    default:
        die("k_pad: unknown mode");
        return -1;
    }
}

/* Output shape of Pad; checks the modes' requirements. */
static void pad_shapes(int mode, int rank, const int64_t *xshape, const int64_t *pads,
                       int64_t *yshape)
{
    if (rank > K_MAX_RANK)
        die("k_pad: rank above 16");
    for (int d = 0; d < rank; d++) {
        yshape[d] = xshape[d] + pads[d] + pads[rank + d];
        if (yshape[d] < 0)
            die("k_pad: negative output dim");
        if (mode != K_PAD_CONSTANT && xshape[d] == 0 && yshape[d] > 0)
            die("k_pad: edge / reflect padding of an empty dim");
    }
}

/* x offset of the row under y's outer index idx (dims 0..rank-2), or -1. */
static int64_t pad_row_src(int mode, int rank, const int64_t *xshape, const int64_t *pads,
                           const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < rank - 1; d++) {
        int64_t s = pad_src(mode, idx[d] - pads[d], xshape[d]);
        if (s < 0)
            return -1;
        off += s * dense_stride(rank, xshape, d);
    }
    return off;
}

/* Advances y's outer index (dims 0..rank-2) like an odometer. */
static void pad_next_row(int rank, const int64_t *yshape, int64_t *idx)
{
    for (int d = rank - 2; d >= 0; d--) {
        if (++idx[d] < yshape[d])
            return;
        idx[d] = 0;
    }
}

#define T float
#define S f32
#include "copy_impl.h"
#undef T
#undef S

#define T double
#define S f64
#include "copy_impl.h"
#undef T
#undef S
