/* ew_impl.h — typed bodies of ew.c, included once per dtype with
 * T (element type), S (name suffix), KM_EXP and KM_TANH defined.
 * No include guard on purpose. */

/* ---- k_binary ---------------------------------------------------------- */

/* One innermost row: y[i] = a[i*ia] OP b[i*ib], with the contiguous and
 * broadcast stride patterns written out so the compiler vectorises them. */
#define K_ROW(OP)                                                           \
    do {                                                                    \
        if (ia == 1 && ib == 1) {                                           \
            for (int64_t i = 0; i < n; i++) y[i] = a[i] OP b[i];            \
        } else if (ia == 1 && ib == 0) {                                    \
            const T bv = b[0];                                              \
            for (int64_t i = 0; i < n; i++) y[i] = a[i] OP bv;              \
        } else if (ia == 0 && ib == 1) {                                    \
            const T av = a[0];                                              \
            for (int64_t i = 0; i < n; i++) y[i] = av OP b[i];              \
        } else {                                                            \
            for (int64_t i = 0; i < n; i++) y[i] = a[i * ia] OP b[i * ib];  \
        }                                                                   \
    } while (0)

static void KFN(binary_row)(int op, T *y, const T *a, const T *b, int64_t n,
                            int64_t ia, int64_t ib)
{
    switch (op) {
    case K_ADD: K_ROW(+); break;
    case K_SUB: K_ROW(-); break;
    case K_MUL: K_ROW(*); break;
    case K_DIV: K_ROW(/); break;
    default: die("k_binary: unknown op");
    }
}
#undef K_ROW

typedef struct {
    int op;
    T *y;
    const T *a, *b;
    Walk outer;           /* every dim but the innermost */
    int64_t n, ia, ib;    /* the innermost dim */
} KFN(BinaryJob);

/* Computes y[lo..hi) of the dense output. */
static void KFN(binary_range)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(BinaryJob) *j = ctx;
    Walk w = j->outer;
    int64_t col = lo % j->n;
    walk_seek(&w, lo / j->n);
    for (int64_t pos = lo; pos < hi; col = 0, walk_next(&w)) {
        int64_t len = min64(j->n - col, hi - pos);
        KFN(binary_row)(j->op, j->y + pos, j->a + w.oa + col * j->ia,
                        j->b + w.ob + col * j->ib, len, j->ia, j->ib);
        pos += len;
    }
}

void KFN(k_binary)(int op, T *y, const T *a, const T *b, int rank,
                   const int64_t *shape, const int64_t *sa, const int64_t *sb)
{
    KFN(BinaryJob) j = {.op = op, .y = y, .a = a, .b = b};
    int64_t total = numel(rank, shape);
    if (total == 0)
        return;
    for (int d = 0; d < rank; d++)
        walk_push(&j.outer, shape[d], sa[d], sb[d]);
    j.n = walk_pop(&j.outer, &j.ia, &j.ib);
    par_range(KFN(binary_range), &j, total, 1);
}

/* ---- k_unary, k_unary_grad, k_scale, k_fill ---------------------------- */

void KFN(k_unary)(int op, T *y, const T *x, int64_t n)
{
    switch (op) {
    case K_RELU:  /* written so NaN passes through, as torch.relu does */
        for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0 ? (T)0 : x[i];
        break;
    case K_TANH:
        for (int64_t i = 0; i < n; i++) y[i] = KM_TANH(x[i]);
        break;
    case K_SIGMOID:  /* exp(-x) overflows to inf for x << 0: 1/inf = 0, fine */
        for (int64_t i = 0; i < n; i++) y[i] = (T)1 / ((T)1 + KM_EXP(-x[i]));
        break;
    default: die("k_unary: unknown op");
    }
}

/* Derivatives from the output y, in PyTorch's operation order:
 * threshold_backward (y <= 0 -> 0), tanh_backward dy (1 - y y),
 * sigmoid_backward dy (1 - y) y. */
void KFN(k_unary_grad)(int op, T *dx, const T *dy, const T *y, int64_t n)
{
    switch (op) {
    case K_RELU:
        for (int64_t i = 0; i < n; i++) dx[i] = y[i] <= 0 ? (T)0 : dy[i];
        break;
    case K_TANH:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * ((T)1 - y[i] * y[i]);
        break;
    case K_SIGMOID:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * ((T)1 - y[i]) * y[i];
        break;
    default: die("k_unary_grad: unknown op");
    }
}

/* alpha is rounded to T first, as a float tensor times a Python scalar is. */
void KFN(k_scale)(T *y, const T *x, double alpha, int64_t n)
{
    const T s = (T)alpha;
    for (int64_t i = 0; i < n; i++)
        y[i] = s * x[i];
}

void KFN(k_fill)(T *y, double v, int64_t n)
{
    const T t = (T)v;
    for (int64_t i = 0; i < n; i++)
        y[i] = t;
}

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

/* Walks y densely; y dim i steps x by x's stride along perm[i].  Dims that
 * stay adjacent under perm merge, so e.g. [B,S,H,D] -> [B,H,S,D] copies
 * whole D-rows with memcpy.  When y's innermost dim is strided in x, the
 * y dim that is contiguous in x is paired with it and copied in tiles. */
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

/* ---- k_reduce_sum_to ---------------------------------------------------- */

/* Four independent chains: one chain of double adds is bound by the add
 * latency, not by memory. */
static double KFN(sum_row)(const T *x, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += x[i];
        s1 += x[i + 1];
        s2 += x[i + 2];
        s3 += x[i + 3];
    }
    for (; i < n; i++)
        s0 += x[i];
    return (s0 + s1) + (s2 + s3);
}

/* Innermost x dim is reduced: each y element is a sum of contiguous runs of
 * n, one run per position of the outer reduced dims. */
static void KFN(reduce_inner)(T *y, const T *x, Walk *kept, Walk *red, int64_t n)
{
    int64_t i = 0;
    walk_seek(kept, 0);
    do {
        double s = 0;
        walk_seek(red, 0);
        do
            s += KFN(sum_row)(x + kept->oa + red->oa, n);
        while (walk_next(red));
        y[i++] = (T)s;
    } while (walk_next(kept));
}

/* Innermost x dim is kept: y rows of n are summed over the reduced dims
 * K_TILE columns at a time, so x is read in contiguous runs and the double
 * accumulators fit on the stack. */
static void KFN(reduce_outer)(T *y, const T *x, Walk *kept, Walk *red, int64_t n)
{
    double acc[K_TILE];
    walk_seek(kept, 0);
    do {
        for (int64_t c0 = 0; c0 < n; c0 += K_TILE) {
            int64_t t = min64(K_TILE, n - c0);
            memset(acc, 0, sizeof acc);
            walk_seek(red, 0);
            do {
                const T *xs = x + kept->oa + red->oa + c0;
                for (int64_t c = 0; c < t; c++) acc[c] += xs[c];
            } while (walk_next(red));
            for (int64_t c = 0; c < t; c++) y[c0 + c] = (T)acc[c];
        }
        y += n;
    } while (walk_next(kept));
}

/* Splits x's dims into kept ones (yshape[d] == xshape[d]) and reduced ones
 * (yshape[d] == 1), each with its strides in x; y is dense over the kept
 * dims in order, so its index is a plain counter. */
void KFN(k_reduce_sum_to)(T *y, const T *x, int rank, const int64_t *xshape,
                          const int64_t *yshape)
{
    Walk kept = {0}, red = {0};
    int inner_kept = 1;  /* x's innermost non-1 dim is kept (or there is none) */
    int64_t n, unused;
    if (numel(rank, xshape) == 0) {  /* sums over nothing are 0 */
        KFN(k_fill)(y, 0, numel(rank, yshape));
        return;
    }
    for (int d = 0; d < rank; d++) {
        if (xshape[d] == 1)
            continue;
        inner_kept = yshape[d] != 1;
        if (inner_kept && yshape[d] != xshape[d])
            die("k_reduce_sum_to: y dim neither 1 nor x's");
        walk_push(inner_kept ? &kept : &red, xshape[d],
                  dense_stride(rank, xshape, d), 0);
    }
    /* the innermost non-1 dim has stride 1: only its length matters */
    n = walk_pop(inner_kept ? &kept : &red, &unused, &unused);
    if (inner_kept)
        KFN(reduce_outer)(y, x, &kept, &red, n);
    else
        KFN(reduce_inner)(y, x, &kept, &red, n);
}
