/* loss.cu — mean-squared error, softmax cross-entropy and the negative
 * log-likelihood, forward and grad: the twins of kernels/c/loss.c.
 *
 * The scalar losses are sums over many elements, accumulated in double:
 * every block folds a fixed share (grid-stride), block_reduce combines its
 * threads, and grid_combine (common.cuh) lets the last block add the
 * blocks' partials in block order and write the loss, so one launch gives
 * a deterministic result.  Cross-entropy takes a row per block iteration:
 * the row's max and sum of exp are block reductions (in double, as
 * kernels/c's logsumexp), the row loss joins thread 0's running sum.
 *
 * Labels are checked on the device: a bad one records its row / position
 * in the check slot (atomicMin, see gather.cu) and is left out; the step
 * then fails, so the loss value does not matter.  The grads trust the
 * labels (out-of-range ones are skipped, never read or written).
 */

/* ---- MSE ----------------------------------------------------------------- */

template <typename T> KC_DEV void k_mse(T *loss, const T *p, const T *t, int64_t n)
{
    double v[1] = {0};
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>()) {
        const double d = (double)p[i] - (double)t[i];
        v[0] += d * d;
    }
    v[0] = block_sum(v[0]);
    if (grid_combine(v, 0.0, KcSum()) && threadIdx.x == 0)
        loss[0] = n > 0 ? (T)(v[0] / (double)n) : kc_nan<T>();
}

/* PyTorch's mse_loss_backward: (2/n rounded to T) (p - t) dloss */
template <typename T> KC_DEV void k_mse_grad(T *dp, const T *dloss, const T *p, const T *t, int64_t n)
{
    const T norm = (T)(2.0 / (double)n), g = dloss[0];
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        dp[i] = norm * (p[i] - t[i]) * g;
}

/* ---- softmax cross-entropy ------------------------------------------------ */

/* max and sum of exp(x - max) of one row, both block-reduced in double */
template <typename T> KC_DEV void row_lse_parts(const T *xr, int64_t classes, double *mx, double *sum)
{
    double m = -KC_INF, s = 0;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
        m = kc_nanmax(m, (double)xr[j]);
    m = block_reduce(m, -KC_INF, KcMax());
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
        s += exp((double)xr[j] - m);
    *mx = m;
    *sum = block_sum(s);
}

/* loss[0] = mean over rows of logsumexp(x_r) - x_r[label_r] */
template <typename T> KC_DEV void k_cross_entropy(T *loss, const T *x, const int64_t *labels, int64_t rows,
                                                  int64_t classes, int64_t *check)
{
    double v[1] = {0};
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t lab = labels[r];
        if (lab < 0 || lab >= classes) {
            if (threadIdx.x == 0)
                atomicMin((unsigned long long *)check, (unsigned long long)r);
            continue;
        }
        const T *xr = x + r * classes;
        double mx, s;
        row_lse_parts(xr, classes, &mx, &s);
        v[0] += mx + log(s) - (double)xr[lab];
    }
    if (grid_combine(v, 0.0, KcSum()) && threadIdx.x == 0)
        loss[0] = rows > 0 ? (T)(v[0] / (double)rows) : kc_nan<T>();
}

/* dx = dloss[0] (softmax(x_r) - onehot(label_r)) / rows, a block per row;
 * dx may alias x (each element is read, then written, by one thread) */
template <typename T> KC_DEV void k_cross_entropy_grad(T *dx, const T *dloss, const T *x,
                                                       const int64_t *labels, int64_t rows, int64_t classes)
{
    const double scale = (double)dloss[0] / (double)rows;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * classes;
        T *dr = dx + r * classes;
        const int64_t lab = labels[r];
        double mx, s;
        row_lse_parts(xr, classes, &mx, &s);
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
            const T e = (T)exp((double)xr[j] - mx); /* kernels/c stores it in T first */
            dr[j] = (T)(scale * ((double)e / s - (double)(j == lab)));
        }
    }
}

/* ---- negative log-likelihood ---------------------------------------------- */

/* position i's label if it counts (not ignored), else -1; sets *bad for a
 * label outside [0, c) */
KC_DEV int64_t nll_label(const int64_t *labels, int64_t i, int64_t c, int has_ignore,
                         int64_t ignore_index, bool *bad)
{
    const int64_t l = labels[i];
    *bad = false;
    if (has_ignore && l == ignore_index)
        return -1;
    if (l < 0 || l >= c) {
        *bad = true;
        return -1;
    }
    return l;
}

/* see kernels.h k_nll_loss; lp n x c x d, labels n x d */
template <typename T> KC_DEV void k_nll_loss(T *loss, const T *lp, const int64_t *labels, const T *weights,
                                             int64_t n, int64_t c, int64_t d, int reduction, int has_ignore,
                                             int64_t ignore_index, int64_t *check)
{
    double v[2] = {0, 0}; /* sum of -w lp, sum of w */
    for (int64_t i = kc_first<int64_t>(); i < n * d; i += kc_stride<int64_t>()) {
        bool bad;
        const int64_t l = nll_label(labels, i, c, has_ignore, ignore_index, &bad);
        if (bad)
            atomicMin((unsigned long long *)check, (unsigned long long)i);
        if (l < 0) {
            if (reduction == K_LOSS_NONE)
                loss[i] = (T)0;
            continue;
        }
        const double w = weights ? (double)weights[l] : 1.0;
        const double e = -w * (double)lp[(i / d * c + l) * d + i % d];
        if (reduction == K_LOSS_NONE)
            loss[i] = (T)e;
        v[0] += e;
        v[1] += w;
    }
    if (reduction == K_LOSS_NONE)
        return;
    v[0] = block_sum(v[0]);
    v[1] = block_sum(v[1]);
    if (grid_combine(v, 0.0, KcSum()) && threadIdx.x == 0)
        loss[0] = (T)(reduction == K_LOSS_SUM ? v[0] : v[0] / v[1]);
}

/* The scatter of k_nll_loss_grad onto dx (already dx_in or zeros): one
 * block, which first sums the counted weights (MEAN), then subtracts
 * w g / ws at each counted position (positions never share an element). */
template <typename T> KC_DEV void k_nll_loss_grad(T *dx, const T *dloss, const int64_t *labels,
                                                  const T *weights, int64_t n, int64_t c, int64_t d, int reduction,
                                                  int has_ignore, int64_t ignore_index)
{
    double ws = 0;
    bool bad;
    if (reduction == K_LOSS_MEAN) {
        for (int64_t i = threadIdx.x; i < n * d; i += blockDim.x) {
            const int64_t l = nll_label(labels, i, c, has_ignore, ignore_index, &bad);
            if (l >= 0)
                ws += weights ? (double)weights[l] : 1.0;
        }
        ws = block_sum(ws);
    } else {
        ws = 1;
    }
    for (int64_t i = threadIdx.x; i < n * d; i += blockDim.x) {
        const int64_t l = nll_label(labels, i, c, has_ignore, ignore_index, &bad);
        if (l < 0)
            continue;
        const double w = weights ? (double)weights[l] : 1.0;
        const double g = dloss[reduction == K_LOSS_NONE ? i : 0];
        T *e = dx + (i / d * c + l) * d + i % d;
        *e -= (T)(w * g / ws);
    }
}
