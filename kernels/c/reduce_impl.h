/* reduce_impl.h — typed bodies of reduce.c, included once per dtype with
 * T (element type), S (name suffix) and KM(f) (libm name of f for T: expf or
 * exp) defined.  With K_SUM16 defined (the 16-bit instances: T float, X
 * uint16_t, XW(v) its bits widened to float) only k_reduce_sum_to, of x's X
 * into y's T: each element widened as it is loaded, the folds those of T's
 * (the same bits as a Cast to float32 and k_reduce_sum_to_f32).  No include
 * guard on purpose. */
#ifdef K_SUM16
#define K_FILL k_fill_f32
#else
#define X T
#define XW(v) (v)
#define K_FILL KFN(k_fill)
#endif

/* ---- k_reduce, k_reduce_sum_to ------------------------------------------ */

/* Four independent chains: one chain of double adds is bound by the add
 * latency, not by memory. */
static double KFN(sum_row)(const X *x, int64_t n)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += XW(x[i]);
        s1 += XW(x[i + 1]);
        s2 += XW(x[i + 2]);
        s3 += XW(x[i + 3]);
    }
    for (; i < n; i++)
        s0 += XW(x[i]);
    return (s0 + s1) + (s2 + s3);
}

/* Folds one contiguous run of n into acc. */
static double KFN(fold_row)(int op, double acc, const X *x, int64_t n)
{
    switch (op) {
    case K_RMAX: for (int64_t i = 0; i < n; i++) acc = red_max(acc, XW(x[i])); return acc;
    case K_RMIN: for (int64_t i = 0; i < n; i++) acc = red_min(acc, XW(x[i])); return acc;
    case K_RPROD: for (int64_t i = 0; i < n; i++) acc *= XW(x[i]); return acc;
    default: return acc + KFN(sum_row)(x, n);
    }
}

/* One k_reduce call split into units for par_range: kept positions
 * (innermost dim reduced) or kept positions x column tiles (innermost dim
 * kept).  Each y element is folded in the same order whatever the split, so
 * the result does not depend on the thread count or on the tile width. */
typedef struct {
    int op;
    T *y;
    const X *x;
    Walk kept, red;
    int64_t n, tile, tiles;
    double scale;
} KFN(ReduceJob);

/* Innermost x dim is reduced: each y element of [lo, hi) folds contiguous
 * runs of n, one run per position of the outer reduced dims. */
static void KFN(reduce_inner)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(ReduceJob) *j = ctx;
    Walk kept = j->kept, red = j->red;
    walk_seek(&kept, lo);
    for (int64_t i = lo; i < hi; i++, walk_next(&kept)) {
        double acc = red_init(j->op);
        walk_seek(&red, 0);
        do
            acc = KFN(fold_row)(j->op, acc, j->x + kept.oa + red.oa, j->n);
        while (walk_next(&red));
        j->y[i] = (T)(acc * j->scale);
    }
}

/* Folds the row xs[0..t) into acc[0..t) column by column. */
static void KFN(fold_cols)(int op, double *acc, const X *xs, int64_t t)
{
    switch (op) {
    case K_RMAX: for (int64_t c = 0; c < t; c++) acc[c] = red_max(acc[c], XW(xs[c])); break;
    case K_RMIN: for (int64_t c = 0; c < t; c++) acc[c] = red_min(acc[c], XW(xs[c])); break;
    case K_RPROD: for (int64_t c = 0; c < t; c++) acc[c] *= XW(xs[c]); break;
    default: for (int64_t c = 0; c < t; c++) acc[c] += XW(xs[c]);
    }
}

/* Innermost x dim is kept: unit u is the column tile u % tiles of the y row
 * u / tiles, folded over the reduced dims, so x is read in contiguous runs
 * and the double accumulators fit on the stack. */
static void KFN(reduce_outer)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(ReduceJob) *j = ctx;
    Walk kept = j->kept, red = j->red;
    double acc[K_TILE];
    for (int64_t u = lo; u < hi; u++) {
        const int64_t row = u / j->tiles, c0 = u % j->tiles * j->tile, t = min64(j->tile, j->n - c0);
        walk_seek(&kept, row);
        for (int64_t c = 0; c < t; c++) acc[c] = red_init(j->op);
        walk_seek(&red, 0);
        do
            KFN(fold_cols)(j->op, acc, j->x + kept.oa + red.oa + c0, t);
        while (walk_next(&red));
        for (int64_t c = 0; c < t; c++) j->y[row * j->n + c0 + c] = (T)(acc[c] * j->scale);
    }
}

#ifdef K_SUM16
static /* the 16-bit instance's only caller is its k_reduce_sum_to */
#endif
void KFN(k_reduce)(int op, T *y, const X *x, int rank, const int64_t *xshape,
                   const int64_t *yshape)
{
    KFN(ReduceJob) j = {.op = op, .y = y, .x = x, .scale = 1};
    int64_t count;
    if (op < K_RSUM || op > K_RPROD)
        die("k_reduce: unknown op");
    if (numel(rank, xshape) == 0) {  /* each group folds nothing */
        K_FILL(y, op == K_RMEAN ? NAN : red_init(op), numel(rank, yshape));
        return;
    }
    int inner_kept = reduce_split(rank, xshape, yshape, &j.kept, &j.red, &j.n, &count);
    if (op == K_RMEAN)
        j.scale = 1.0 / (double)count;
    const int64_t rows = numel(j.kept.rank, j.kept.shape);
    if (!inner_kept) {
        par_range(KFN(reduce_inner), &j, rows, count);
        return;
    }
    /* few rows (a bias gradient: one): narrower tiles give every thread some (of the kernels' team, or of a
     * team that shares: k_share); one thread takes the widest, which reads x in the longest runs (the tile
     * width changes no bit) */
#ifdef _OPENMP
    const int team = (k_sharing && omp_in_parallel() ? omp_get_num_threads() > 1
                                                     : omp_get_max_threads() > 1 && !omp_in_parallel()) &&
                     count * j.n >= K_PAR_MIN;
#else
    const int team = 0;
#endif
    j.tile = rows >= 8 || !team ? K_TILE : min64(K_TILE, max64(64, (j.n + 7) / 8));
    j.tiles = (j.n + j.tile - 1) / j.tile;
    par_range(KFN(reduce_outer), &j, rows * j.tiles, count * j.tile);
}

void KFN(k_reduce_sum_to)(T *y, const X *x, int rank, const int64_t *xshape,
                          const int64_t *yshape)
{
    KFN(k_reduce)(K_RSUM, y, x, rank, xshape, yshape);
}
#undef X
#undef XW
#undef K_FILL
#ifndef K_SUM16

/* ---- k_reduce_max_grad -------------------------------------------------- */

/* Per y element: count the x elements equal to it, then write
 * dx = (dy / count) * (x == y) — torch's amax backward, which also yields NaN
 * when nothing matches (a NaN max). */
void KFN(k_reduce_max_grad)(T *dx, const T *dy, const T *x, const T *y, int rank,
                            const int64_t *xshape, const int64_t *yshape)
{
    Walk kept = {0}, red = {0};
    int64_t i = 0;
    if (!group_walks(rank, xshape, yshape, &kept, &red))
        return;
    do {
        const T yv = y[i];
        int64_t ties = 0;
        walk_seek(&red, 0);
        do
            ties += x[kept.oa + red.oa] == yv;
        while (walk_next(&red));
        const T g = dy[i++] / (T)ties;
        walk_seek(&red, 0);
        do {
            int64_t o = kept.oa + red.oa;
            dx[o] = g * (T)(x[o] == yv);
        } while (walk_next(&red));
    } while (walk_next(&kept));
}

/* Per group: the zeros z among its x and the product p of the others (in
 * double), then dx = dy * (the product of the group's other x):
 * x != 0: z == 0 ? p / x : 0;  x == 0: z == 1 ? p : 0.  No division by
 * zero, unlike y / x. */
void KFN(k_reduce_prod_grad)(T *dx, const T *dy, const T *x, int rank, const int64_t *xshape,
                             const int64_t *yshape)
{
    Walk kept = {0}, red = {0};
    int64_t i = 0;
    if (!group_walks(rank, xshape, yshape, &kept, &red))
        return;
    do {
        int64_t zeros = 0;
        double p = 1;
        walk_seek(&red, 0);
        do {
            const T v = x[kept.oa + red.oa];
            if (v == 0)
                zeros++;
            else
                p *= v;
        } while (walk_next(&red));
        const double g = dy[i++];
        walk_seek(&red, 0);
        do {
            int64_t o = kept.oa + red.oa;
            double others = x[o] != 0 ? (zeros == 0 ? p / x[o] : 0) : (zeros == 1 ? p : 0);
            dx[o] = (T)(g * others);
        } while (walk_next(&red));
    } while (walk_next(&kept));
}

/* ---- k_softmax ---------------------------------------------------------- */

/* One contiguous row of n (inner == 1) in two passes over memory.  The
 * first finds the max m and the sum of exp(x - m) together, K_SM_BLOCK
 * elements at a time: the block's max (from cache), the running sum rescaled
 * by exp(m_old - m_new) when the max grows, then the block's exp(x - m)
 * summed.  The second writes exp(x - m) / sum (softmax) or x - m - log(sum)
 * (log-softmax).  exp(x - m) runs in T, as torch's does (m is one of the x,
 * so x - m is one rounding); a block's sum in T (vector lanes: `omp simd`),
 * the blocks' in double.  A NaN makes the row NaN; so does a row of -inf
 * (exp(-inf - -inf)); blocks of -inf before the first finite element add
 * nothing. */
static void KFN(softmax_row)(int lg, T *y, const T *x, int64_t n)
{
    T mx = (T)-INFINITY;
    double s = 0;
    for (int64_t b0 = 0; b0 < n; b0 += K_SM_BLOCK) {
        const T *xb = x + b0;
        const int64_t nb = min64(K_SM_BLOCK, n - b0);
        T bm = mx, acc = 0;
#pragma omp simd reduction(max : bm)
        for (int64_t j = 0; j < nb; j++) /* NaN passes by: exp(NaN - m) makes the sum NaN below */
            bm = xb[j] > bm ? xb[j] : bm;
        if (bm == (T)-INFINITY) { /* nothing finite yet: the block adds nothing, unless it holds a NaN */
            for (int64_t j = 0; j < nb; j++)
                if (xb[j] != xb[j])
                    s = NAN;
            continue;
        }
        if (bm > mx)
            s *= exp((double)mx - (double)bm), mx = bm;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < nb; j++)
            acc += KM(exp)(xb[j] - mx);
        s += acc;
    }
    if (s != s) /* a NaN in the row: the row is NaN */
        mx = (T)NAN;
    if (lg) {
        const T ls = (T)((double)mx + log(s));
        for (int64_t j = 0; j < n; j++)
            y[j] = x[j] - ls;
        return;
    }
    const T inv = (T)(1 / s);
    for (int64_t j = 0; j < n; j++)
        y[j] = KM(exp)(x[j] - mx) * inv;
}

/* Columns [0, t) of one outer block, x and y rows `inner` apart. */
static void KFN(softmax_tile)(int lg, T *y, const T *x, int64_t axis, int64_t inner,
                              int64_t t)
{
    double s[K_TILE];
    T mx[K_TILE];
    for (int64_t c = 0; c < t; c++)
        mx[c] = (T)-INFINITY, s[c] = 0;
    for (int64_t a = 0; a < axis; a++)
        for (int64_t c = 0; c < t; c++)
            mx[c] = (T)red_max(mx[c], x[a * inner + c]);
    for (int64_t a = 0; a < axis; a++)
        for (int64_t c = 0; c < t; c++) {
            T e = KM(exp)(x[a * inner + c] - mx[c]);
            if (!lg)
                y[a * inner + c] = e;
            s[c] += e;
        }
    for (int64_t c = 0; c < t; c++)
        s[c] = lg ? (double)mx[c] + log(s[c]) : 1 / s[c];
    for (int64_t a = 0; a < axis; a++)
        for (int64_t c = 0; c < t; c++) {
            T *yp = y + a * inner + c;
            *yp = lg ? (T)((double)x[a * inner + c] - s[c]) : (T)((double)*yp * s[c]);
        }
}

void KFN(k_softmax)(int lg, T *y, const T *x, int64_t outer, int64_t axis,
                    int64_t inner)
{
#pragma omp parallel for schedule(static) if (outer > 1 && outer * axis * inner >= K_PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        const int64_t off = o * axis * inner;
        if (inner == 1) {
            KFN(softmax_row)(lg, y + off, x + off, axis);
            continue;
        }
        for (int64_t c0 = 0; c0 < inner; c0 += K_TILE)
            KFN(softmax_tile)(lg, y + off + c0, x + off + c0, axis, inner,
                              min64(K_TILE, inner - c0));
    }
}

/* Columns [0, t) of one outer block: first the per-column sum (of dy y for
 * softmax, of dy for log-softmax), then dx. */
static void KFN(softmax_grad_tile)(int lg, T *dx, const T *dy, const T *y,
                                   int64_t axis, int64_t inner, int64_t t)
{
    double s[K_TILE];
    for (int64_t c = 0; c < t; c++)
        s[c] = 0;
    for (int64_t a = 0; a < axis; a++)
        for (int64_t c = 0; c < t; c++) {
            int64_t k = a * inner + c;
            s[c] += lg ? (double)dy[k] : (double)dy[k] * (double)y[k];
        }
    for (int64_t a = 0; a < axis; a++)
        for (int64_t c = 0; c < t; c++) {
            int64_t k = a * inner + c;
            dx[k] = lg ? (T)((double)dy[k] - exp((double)y[k]) * s[c])
                        : (T)((double)y[k] * ((double)dy[k] - s[c]));
        }
}

/* One contiguous row of n (inner == 1): the sum (K_LANES lanes of T,
 * combined in double), then dx in T (dx may alias dy). */
static void KFN(softmax_grad_row)(int lg, T *dx, const T *dy, const T *y, int64_t n)
{
    T acc[K_LANES] = {0};
    int64_t j = 0;
    for (; j + K_LANES <= n; j += K_LANES)
        for (int l = 0; l < K_LANES; l++)
            acc[l] += lg ? dy[j + l] : dy[j + l] * y[j + l];
    double sd = 0;
    for (; j < n; j++)
        sd += lg ? (double)dy[j] : (double)dy[j] * (double)y[j];
    for (int l = 0; l < K_LANES; l++)
        sd += acc[l];
    const T s = (T)sd;
    if (lg)
        for (j = 0; j < n; j++)
            dx[j] = dy[j] - KM(exp)(y[j]) * s;
    else
        for (j = 0; j < n; j++)
            dx[j] = y[j] * (dy[j] - s);
}

void KFN(k_softmax_grad)(int lg, T *dx, const T *dy, const T *y, int64_t outer,
                         int64_t axis, int64_t inner)
{
#pragma omp parallel for schedule(static) if (outer > 1 && outer * axis * inner >= K_PAR_MIN)
    for (int64_t o = 0; o < outer; o++) {
        const int64_t off = o * axis * inner;
        if (inner == 1) {
            KFN(softmax_grad_row)(lg, dx + off, dy + off, y + off, axis);
            continue;
        }
        for (int64_t c0 = 0; c0 < inner; c0 += K_TILE)
            KFN(softmax_grad_tile)(lg, dx + off + c0, dy + off + c0, y + off + c0, axis,
                                   inner, min64(K_TILE, inner - c0));
    }
}

/* ---- k_range ------------------------------------------------------------ */

void KFN(k_range)(T *y, double start, double delta, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = (T)(start + (double)i * delta);
}
#endif /* K_SUM16 */
