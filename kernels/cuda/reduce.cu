/* reduce.cu — reductions over axes, ReduceMax's and ReduceProd's backward, Softmax and
 * LogSoftmax with their backward, Range and Trilu: the twins of
 * kernels/c/reduce.c.
 *
 * A reduction arrives as two merged index spaces (launch.c): the kept dims
 * K (y is dense over them, in order) and the reduced dims R, each with its
 * strides in x.  Three kernels cover the layouts:
 *   rows  x's innermost dim is reduced: one block per output element (grid-
 *         stride over outputs), threads striding over the group, so reads
 *         are contiguous; block_reduce combines the threads.
 *   cols  x's innermost dim is kept (a bias gradient, a mean over the batch):
 *         a block takes 32 adjacent outputs, its warps split the group, and
 *         each column's per-warp partials are folded in warp order; when
 *         the columns alone would leave the device idle, the group splits
 *         into chunks of rows too, and k_cols_fold folds the chunks.
 *   all   every dim reduced into one value: all blocks stride over x and
 *         grid_combine folds their partials (common.cuh).
 * Sums and products accumulate in double, as kernels/c does; max / min
 * propagate NaN.  The _bf16 / _f16 instances of rows, cols and all read
 * 16-bit x (a bias gradient of a 16-bit dY) and widen each element as they
 * load it, float32 y.
 *
 * Softmax sees x as outer x axis x inner.  With inner == 1 each row is
 * contiguous and gets a block (max, then the sum of exp in double, then the
 * write); otherwise each (outer, inner) column is one thread's serial loop,
 * coalesced across the threads of a warp.  The exponentials and the double
 * sums follow kernels/c step for step.
 */

/* ---- k_reduce ------------------------------------------------------------ */
/* (rows, cols and all take x's element as KcIo's X: T, or a 16-bit tag, common.cuh) */

KC_DEV double red_identity(int op)
{
    return op == K_RMAX ? -KC_INF : op == K_RMIN ? KC_INF : op == K_RPROD ? 1.0 : 0.0;
}

KC_DEV double red_fold(int op, double acc, double v)
{
    return op == K_RMAX ? kc_nanmax(acc, v) : op == K_RMIN ? kc_nanmin(acc, v) : op == K_RPROD ? acc * v : acc + v;
}

/* the op-combination over the block (MEAN and SUM add) */
KC_DEV double red_block(int op, double v)
{
    if (op == K_RMAX)
        return block_reduce(v, -KC_INF, KcMax());
    if (op == K_RMIN)
        return block_reduce(v, KC_INF, KcMin());
    if (op == K_RPROD)
        return block_reduce(v, 1.0, KcProd());
    return block_sum(v);
}

/* Innermost dim reduced: output o = kept position (krank dims, strides kst
 * in x), its group the rrank reduced dims (strides rst), group elements
 * each.  y = fold * scale (scale 1/count for MEAN, else 1). */
template <typename T, typename X = T>
KC_DEV void k_reduce_rows(int op, T *y, const typename KcIo<X>::E *x, int64_t nout, int64_t group, int krank,
                          KDims kshape, KDims kst, int rrank, KDims rshape, KDims rst, double scale)
{
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        const typename KcIo<X>::E *xo = x + kc_offset1(o, krank, kshape, kst);
        double acc = red_identity(op);
        for (int64_t g = threadIdx.x; g < group; g += blockDim.x)
            acc = red_fold(op, acc, KcIo<X>::in(xo[kc_offset1(g, rrank, rshape, rst)]));
        acc = red_block(op, acc);
        if (threadIdx.x == 0)
            y[o] = (T)(acc * scale);
    }
}

/* Innermost dim kept: y is nko x nc (nc = that dim, stride 1 in x; ko runs
 * over the other kept dims).  The group splits into chunks of rows (ceil
 * group / chunks each); a block takes 32 columns of one ko and one chunk,
 * warp w folds the chunk's elements w, w + warps, ... for its lane's
 * column, and warp 0 folds the warps in order.  One chunk: y = that times
 * scale; more: the chunk's partial goes to kc_colpart (common.cuh) and
 * k_cols_fold finishes. */
template <typename T, typename X = T>
KC_DEV void k_reduce_cols(int op, T *y, const typename KcIo<X>::E *x, int64_t nko, int64_t nc, int64_t group,
                          int64_t chunks, int krank, KDims kshape, KDims kst, int rrank, KDims rshape, KDims rst,
                          double scale)
{
    __shared__ double part[32][33];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int64_t ctiles = (nc + 31) / 32, tiles = nko * ctiles, rows = (group + chunks - 1) / chunks;
    for (int64_t t = blockIdx.x; t < tiles * chunks; t += gridDim.x) {
        const int64_t ch = t / tiles, ko = t % tiles / ctiles, c = t % ctiles * 32 + lane;
        const int64_t g1 = group < (ch + 1) * rows ? group : (ch + 1) * rows;
        double acc = red_identity(op);
        if (c < nc) {
            const typename KcIo<X>::E *xc = x + kc_offset1(ko, krank, kshape, kst) + c;
            for (int64_t g = ch * rows + warp; g < g1; g += warps)
                acc = red_fold(op, acc, KcIo<X>::in(xc[kc_offset1(g, rrank, rshape, rst)]));
        }
        part[warp][lane] = acc;
        __syncthreads();
        if (warp == 0 && c < nc) {
            for (int w = 1; w < warps; w++)
                acc = red_fold(op, acc, part[w][lane]);
            if (chunks == 1)
                y[ko * nc + c] = (T)(acc * scale);
            else
                kc_colpart[ch * nko * nc + ko * nc + c] = acc;
        }
        __syncthreads();
    }
}

/* A chunked column reduction's end (k_reduce_cols, k_layernorm_grad_cols):
 * y0[c] = the op-combination of value 0's chunk partials in chunk order,
 * times scale; y1 (NULL: none) the same of value 1.  A thread per column. */
template <typename T> KC_DEV void k_cols_fold(int op, T *y0, T *y1, int64_t n, int64_t chunks, double scale)
{
    for (int64_t c = kc_first<int64_t>(); c < n; c += kc_stride<int64_t>()) {
        T *ys[2] = {y0, y1};
        for (int v = 0; v < 2; v++) {
            if (!ys[v])
                continue;
            double acc = red_identity(op);
            for (int64_t ch = 0; ch < chunks; ch++)
                acc = red_fold(op, acc, kc_colpart[(v * chunks + ch) * n + c]);
            ys[v][c] = (T)(acc * scale);
        }
    }
}

/* Everything reduced: x is n dense elements, y one value. */
template <typename T, typename X = T>
KC_DEV void k_reduce_all(int op, T *y, const typename KcIo<X>::E *x, int64_t n, double scale)
{
    double v[1] = {red_identity(op)};
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        v[0] = red_fold(op, v[0], KcIo<X>::in(x[i]));
    v[0] = red_block(op, v[0]);
    const bool last = op == K_RMAX   ? grid_combine(v, -KC_INF, KcMax())
                      : op == K_RMIN ? grid_combine(v, KC_INF, KcMin())
                      : op == K_RPROD ? grid_combine(v, 1.0, KcProd())
                                     : grid_combine(v, 0.0, KcSum());
    if (last && threadIdx.x == 0)
        y[0] = (T)(v[0] * scale);
}

/* the sums of 16-bit x into float32 y (kc_reduce_sum_to_bf16 / _f16: kernels.def's KC rows) */
#define KC_REDUCE_LOW(S, L)                                                                                    \
    KC_GLOBAL void k_reduce_rows##S(int op, float *y, const uint16_t *x, int64_t nout, int64_t group, int krank, \
                                    KDims kshape, KDims kst, int rrank, KDims rshape, KDims rst, double scale)  \
    {                                                                                                          \
        k_reduce_rows<float, L>(op, y, x, nout, group, krank, kshape, kst, rrank, rshape, rst, scale);         \
    }                                                                                                          \
    KC_GLOBAL void k_reduce_cols##S(int op, float *y, const uint16_t *x, int64_t nko, int64_t nc, int64_t group, \
                                    int64_t chunks, int krank, KDims kshape, KDims kst, int rrank,             \
                                    KDims rshape, KDims rst, double scale)                                     \
    {                                                                                                          \
        k_reduce_cols<float, L>(op, y, x, nko, nc, group, chunks, krank, kshape, kst, rrank, rshape, rst,      \
                                scale);                                                                        \
    }                                                                                                          \
    KC_GLOBAL void k_reduce_all##S(int op, float *y, const uint16_t *x, int64_t n, double scale)               \
    {                                                                                                          \
        k_reduce_all<float, L>(op, y, x, n, scale);                                                            \
    }
KC_REDUCE_LOW(_bf16, KcIoBf16)
KC_REDUCE_LOW(_f16, KcIoF16)
#undef KC_REDUCE_LOW

/* ReduceMax / Min backward, one block per output o (its group as in
 * k_reduce_rows): count the x equal to y[o], then dx = x == y ? dy / count
 * : 0 over the group (NaN when nothing matches, as torch). */
template <typename T> KC_DEV void k_reduce_max_grad(T *dx, const T *dy, const T *x, const T *y,
                                                    int64_t nout, int64_t group, int krank, KDims kshape,
                                                    KDims kst, int rrank, KDims rshape, KDims rst)
{
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        const int64_t base = kc_offset1(o, krank, kshape, kst);
        const T yv = y[o];
        double ties = 0;
        for (int64_t g = threadIdx.x; g < group; g += blockDim.x)
            ties += x[base + kc_offset1(g, rrank, rshape, rst)] == yv;
        ties = block_sum(ties);
        const T gv = dy[o] / (T)ties;
        for (int64_t g = threadIdx.x; g < group; g += blockDim.x) {
            const int64_t k = base + kc_offset1(g, rrank, rshape, rst);
            dx[k] = gv * (T)(x[k] == yv);
        }
    }
}

/* ReduceProd backward, one block per output o: the zeros of its group and
 * the product of the others (double), then dx = dy * the product of the
 * group's other x, as kernels/c (no division by zero). */
template <typename T> KC_DEV void k_reduce_prod_grad(T *dx, const T *dy, const T *x, int64_t nout, int64_t group,
                                                     int krank, KDims kshape, KDims kst, int rrank, KDims rshape, KDims rst)
{
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        const int64_t base = kc_offset1(o, krank, kshape, kst);
        double zeros = 0, p = 1;
        for (int64_t g = threadIdx.x; g < group; g += blockDim.x) {
            const T v = x[base + kc_offset1(g, rrank, rshape, rst)];
            if (v == 0)
                zeros += 1;
            else
                p *= v;
        }
        zeros = block_sum(zeros);
        p = block_reduce(p, 1.0, KcProd());
        const double gv = dy[o];
        for (int64_t g = threadIdx.x; g < group; g += blockDim.x) {
            const int64_t k = base + kc_offset1(g, rrank, rshape, rst);
            const double others = x[k] != 0 ? (zeros == 0 ? p / x[k] : 0) : (zeros == 1 ? p : 0);
            dx[k] = (T)(gv * others);
        }
    }
}

/* ---- softmax ------------------------------------------------------------- */

/* rows x len, contiguous rows, one block per row; y may alias x */
template <typename T> KC_DEV void k_softmax_rows(int lg, T *y, const T *x, int64_t rows, int64_t len)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * len;
        T *yr = y + r * len;
        T mx = -kc_inf<T>();
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
            mx = kc_nanmax(mx, xr[j]);
        mx = block_reduce(mx, -kc_inf<T>(), KcMax());
        double s = 0;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
            s += kc_exp(xr[j] - mx);
        s = block_sum(s);
        if (lg) {
            const double ls = (double)mx + log(s);
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                yr[j] = (T)((double)xr[j] - ls);
        } else {
            const double inv = 1 / s;
            for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
                yr[j] = (T)((double)kc_exp(xr[j] - mx) * inv);
        }
    }
}

/* outer x axis x inner with inner > 1: thread per (outer, inner) column */
template <typename T> KC_DEV void k_softmax_cols(int lg, T *y, const T *x, int64_t outer, int64_t axis,
                                                 int64_t inner)
{
    for (int64_t t = kc_first<int64_t>(); t < outer * inner; t += kc_stride<int64_t>()) {
        const int64_t off = t / inner * axis * inner + t % inner;
        const T *xc = x + off;
        T *yc = y + off;
        T mx = -kc_inf<T>();
        double s = 0;
        for (int64_t a = 0; a < axis; a++)
            mx = kc_nanmax(mx, xc[a * inner]);
        for (int64_t a = 0; a < axis; a++)
            s += kc_exp(xc[a * inner] - mx);
        const double ls = (double)mx + log(s), inv = 1 / s;
        for (int64_t a = 0; a < axis; a++)
            yc[a * inner] = lg ? (T)((double)xc[a * inner] - ls)
                               : (T)((double)kc_exp(xc[a * inner] - mx) * inv);
    }
}

/* backward from y: softmax dx = y (dy - sum(dy y)), log-softmax
 * dx = dy - exp(y) sum(dy), in double; dx may alias dy */
template <typename T> KC_DEV T softmax_grad_one(int lg, T dy, T y, double s)
{
    return lg ? (T)((double)dy - exp((double)y) * s) : (T)((double)y * ((double)dy - s));
}

template <typename T> KC_DEV void k_softmax_grad_rows(int lg, T *dx, const T *dy, const T *y,
                                                      int64_t rows, int64_t len)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t off = r * len;
        double s = 0;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
            s += lg ? (double)dy[off + j] : (double)dy[off + j] * (double)y[off + j];
        s = block_sum(s);
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
            dx[off + j] = softmax_grad_one(lg, dy[off + j], y[off + j], s);
    }
}

template <typename T> KC_DEV void k_softmax_grad_cols(int lg, T *dx, const T *dy, const T *y,
                                                      int64_t outer, int64_t axis, int64_t inner)
{
    for (int64_t t = kc_first<int64_t>(); t < outer * inner; t += kc_stride<int64_t>()) {
        const int64_t off = t / inner * axis * inner + t % inner;
        double s = 0;
        for (int64_t a = 0; a < axis; a++) {
            const int64_t k = off + a * inner;
            s += lg ? (double)dy[k] : (double)dy[k] * (double)y[k];
        }
        for (int64_t a = 0; a < axis; a++) {
            const int64_t k = off + a * inner;
            dx[k] = softmax_grad_one(lg, dy[k], y[k], s);
        }
    }
}

/* ---- k_range, k_trilu ---------------------------------------------------- */

template <typename T> KC_DEV void k_range(T *y, double start, double delta, int64_t n)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        y[i] = (T)(start + (double)i * delta);
}

KC_GLOBAL void k_range_i64(int64_t *y, int64_t start, int64_t delta, int64_t n)
{
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        y[i] = start + i * delta;
}

template <typename U>
KC_DEV void trilu_loop(int upper, U *y, const U *x, int64_t n, int64_t rows, int64_t cols, int64_t k)
{
    for (int64_t t = kc_first<int64_t>(); t < n; t += kc_stride<int64_t>()) {
        const int64_t j = t % cols, i = t / cols % rows;
        const bool keep = upper ? j - i >= k : j - i <= k;
        y[t] = keep ? x[t] : (U)0;
    }
}

/* Trilu over n = batch rows cols esize-byte elements; y may alias x */
KC_GLOBAL void k_trilu(int esize, int upper, void *y, const void *x, int64_t n, int64_t rows,
                       int64_t cols, int64_t k)
{
    switch (esize) {
    case 1: trilu_loop(upper, (uint8_t *)y, (const uint8_t *)x, n, rows, cols, k); break;
    case 2: trilu_loop(upper, (uint16_t *)y, (const uint16_t *)x, n, rows, cols, k); break;
    case 4: trilu_loop(upper, (uint32_t *)y, (const uint32_t *)x, n, rows, cols, k); break;
    default: trilu_loop(upper, (uint64_t *)y, (const uint64_t *)x, n, rows, cols, k); break;
    }
}
