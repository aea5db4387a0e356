/* copy_impl.h — typed bodies of copy.c, included once per dtype with
 * T (element type) and S (name suffix) defined.  No include guard on purpose. */

/* ---- k_transpose -------------------------------------------------------- */

typedef struct {
    T *y;
    const T *x;
    Walk outer;        /* y dims but the innermost; sa = x strides, sb = y strides */
    int64_t n, ix;     /* innermost y dim and its stride in x */
    int64_t nq, yq;    /* tiled path: the y dim contiguous in x, its y stride */
} KFN(TransposeJob);

/* Rows path: y[lo..hi) row by row, each row read from x with stride ix. */
static void KFN(transpose_rows)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(TransposeJob) *j = ctx;
    Walk w = j->outer;
    int64_t col = lo % j->n;
    walk_seek(&w, lo / j->n);
    for (int64_t pos = lo; pos < hi; col = 0, walk_next(&w)) {
        int64_t len = min64(j->n - col, hi - pos);
        const T *xs = j->x + w.oa + col * j->ix;
        T *ys = j->y + pos;
        if (j->ix == 1)
            memcpy(ys, xs, (size_t)len * sizeof(T));
        else
            for (int64_t i = 0; i < len; i++) ys[i] = xs[i * j->ix];
        pos += len;
    }
}

/* y[q][l] = x[q + l ix] for q in [q0, q1), all l < n, in K_BLOCK squares so
 * the x lines a square touches stay in cache while y is written in order. */
static void KFN(transpose_block)(T *y, const T *x, int64_t q0, int64_t q1,
                                 int64_t n, int64_t ix, int64_t yq)
{
    for (int64_t l0 = 0; l0 < n; l0 += K_BLOCK) {
        int64_t l1 = min64(l0 + K_BLOCK, n);
        for (int64_t q = q0; q < q1; q++)
            for (int64_t l = l0; l < l1; l++)
                y[q * yq + l] = x[q + l * ix];
    }
}

/* Tiled path: work unit u = (outer position, K_BLOCK-strip of the q dim). */
static void KFN(transpose_tiles)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(TransposeJob) *j = ctx;
    const int64_t strips = (j->nq + K_BLOCK - 1) / K_BLOCK;
    Walk w = j->outer;
    walk_seek(&w, lo / strips);
    for (int64_t u = lo; u < hi; u++) {
        int64_t q0 = u % strips * K_BLOCK;
        KFN(transpose_block)(j->y + w.ob, j->x + w.oa, q0, min64(q0 + K_BLOCK, j->nq),
                             j->n, j->ix, j->yq);
        if ((u + 1) % strips == 0)
            walk_next(&w);
    }
}

void KFN(k_transpose)(T *y, const T *x, int rank, const int64_t *xshape,
                      const int64_t *perm)
{
    KFN(TransposeJob) j = {.y = y, .x = x};
    int64_t total = numel(rank, xshape), unused;
    int q;
    if (total == 0)
        return;
    for (int i = 0; i < rank; i++)
        walk_push(&j.outer, xshape[perm[i]], dense_stride(rank, xshape, (int)perm[i]),
                  perm_stride(rank, xshape, perm, i));
    j.n = walk_pop(&j.outer, &j.ix, &unused);
    q = walk_find_a(&j.outer, 1);
    if (j.ix == 1 || q < 0) {
        par_range(KFN(transpose_rows), &j, total, 1);
        return;
    }
    j.nq = walk_remove(&j.outer, q, &unused, &j.yq);
    par_range(KFN(transpose_tiles), &j,
              total / (j.nq * j.n) * ((j.nq + K_BLOCK - 1) / K_BLOCK), K_BLOCK * j.n);
}

/* ---- k_accum_strided ---------------------------------------------------- */

void KFN(k_accum_strided)(int rank, const int64_t *shape, T *y, int64_t yoff,
                          const int64_t *ys, const T *x, int64_t xoff, const int64_t *xs)
{
    Walk w = {0};
    int64_t n, ix, iy;
    if (numel(rank, shape) == 0)
        return;
    for (int d = 0; d < rank; d++)
        walk_push(&w, shape[d], xs[d], ys[d]);
    n = walk_pop(&w, &ix, &iy);
    y += yoff;
    x += xoff;
    walk_seek(&w, 0);
    do {
        T *yr = y + w.ob;
        const T *xr = x + w.oa;
        if (ix == 1 && iy == 1)
            for (int64_t i = 0; i < n; i++) yr[i] += xr[i];
        else
            for (int64_t i = 0; i < n; i++) yr[i * iy] += xr[i * ix];
    } while (walk_next(&w));
}

/* ---- k_pad, k_pad_grad -------------------------------------------------- */

/* One y row of ny from x row xr (nx long, begin pad pb): the part inside x
 * is copied as a run, the rest follows the mode. */
static void KFN(pad_row)(int mode, T *y, const T *xr, int64_t ny, int64_t nx,
                         int64_t pb, T v)
{
    int64_t lo = max64(0, min64(ny, pb)), hi = max64(lo, min64(ny, pb + nx));
    for (int64_t i = 0; i < lo; i++) {
        int64_t s = pad_src(mode, i - pb, nx);
        y[i] = s < 0 ? v : xr[s];
    }
    if (hi > lo)
        memcpy(y + lo, xr + (lo - pb), (size_t)(hi - lo) * sizeof(T));
    for (int64_t i = hi; i < ny; i++) {
        int64_t s = pad_src(mode, i - pb, nx);
        y[i] = s < 0 ? v : xr[s];
    }
}

void KFN(k_pad)(int mode, T *y, const T *x, int rank, const int64_t *xshape,
                const int64_t *pads, double value)
{
    int64_t yshape[K_MAX_RANK] = {0}, idx[K_MAX_RANK] = {0}, rows, ny, nx;
    const T v = (T)value;
    if (rank == 0) {
        y[0] = x[0];
        return;
    }
    pad_shapes(mode, rank, xshape, pads, yshape);
    rows = numel(rank - 1, yshape);
    ny = yshape[rank - 1];
    nx = xshape[rank - 1];
    if (ny == 0)
        return;
    for (int64_t r = 0; r < rows; r++, pad_next_row(rank, yshape, idx)) {
        int64_t src = pad_row_src(mode, rank, xshape, pads, idx);
        if (src < 0)
            for (int64_t i = 0; i < ny; i++) y[r * ny + i] = v;
        else
            KFN(pad_row)(mode, y + r * ny, x + src, ny, nx, pads[rank - 1], v);
    }
}

void KFN(k_pad_grad)(int mode, T *dx, const T *dy, int rank, const int64_t *xshape,
                     const int64_t *pads)
{
    int64_t yshape[K_MAX_RANK] = {0}, idx[K_MAX_RANK] = {0}, rows, ny, nx, pb;
    if (rank == 0) {
        dx[0] = dy[0];
        return;
    }
    pad_shapes(mode, rank, xshape, pads, yshape);
    memset(dx, 0, (size_t)numel(rank, xshape) * sizeof(T));
    rows = numel(rank - 1, yshape);
    ny = yshape[rank - 1];
    nx = xshape[rank - 1];
    pb = pads[rank - 1];
    if (ny == 0)
        return;
    for (int64_t r = 0; r < rows; r++, pad_next_row(rank, yshape, idx)) {
        int64_t src = pad_row_src(mode, rank, xshape, pads, idx);
        if (src < 0)
            continue;
        for (int64_t i = 0; i < ny; i++) {
            int64_t s = pad_src(mode, i - pb, nx);
            if (s >= 0)
                dx[src + s] += dy[r * ny + i];
        }
    }
}
