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

/* the logits' storage X of a loss type T: X = T (float, double), or 16-bit bits (tag L of attn.cu, T float):
 * wide() an X as double, narrow() a double into X */
template <typename T> struct CeOf {
    typedef T X;
    KC_DEV double wide(X v) { return (double)v; }
    KC_DEV X narrow(double d) { return (T)d; }
};
template <typename L> struct CeLow {
    typedef uint16_t X;
    KC_DEV double wide(X v) { return (double)AttnBits<L>().wide(v); }
    KC_DEV X narrow(double d) { return AttnBits<L>().narrow((float)d); }
};

/* max and sum of exp(x - max) of one row, both block-reduced in double */
template <typename C> KC_DEV void row_lse_parts(const typename C::X *xr, int64_t classes, double *mx, double *sum)
{
    double m = -KC_INF, s = 0;
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
        m = kc_nanmax(m, C().wide(xr[j]));
    m = block_reduce(m, -KC_INF, KcMax());
    for (int64_t j = threadIdx.x; j < classes; j += blockDim.x)
        s += exp(C().wide(xr[j]) - m);
    *mx = m;
    *sum = block_sum(s);
}

/* loss[0] = mean over rows of logsumexp(x_r) - x_r[label_r] */
template <typename T, typename C> KC_DEV void ce_forward(T *loss, const typename C::X *x, const int64_t *labels,
                                                       int64_t rows, int64_t classes, int64_t *check)
{
    double v[1] = {0};
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t lab = labels[r];
        if (lab < 0 || lab >= classes) {
            if (threadIdx.x == 0)
                atomicMin((unsigned long long *)check, (unsigned long long)r);
            continue;
        }
        const typename C::X *xr = x + r * classes;
        double mx, s;
        row_lse_parts<C>(xr, classes, &mx, &s);
        v[0] += mx + log(s) - C().wide(xr[lab]);
    }
    if (grid_combine(v, 0.0, KcSum()) && threadIdx.x == 0)
        loss[0] = rows > 0 ? (T)(v[0] / (double)rows) : kc_nan<T>();
}

/* dx = dloss[0] (softmax(x_r) - onehot(label_r)) / rows, a block per row;
 * dx may alias x (each element is read, then written, by one thread) */
template <typename T, typename C> KC_DEV void ce_backward(typename C::X *dx, const T *dloss, const typename C::X *x,
                                                        const int64_t *labels, int64_t rows, int64_t classes)
{
    const double scale = (double)dloss[0] / (double)rows;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename C::X *xr = x + r * classes;
        typename C::X *dr = dx + r * classes;
        const int64_t lab = labels[r];
        double mx, s;
        row_lse_parts<C>(xr, classes, &mx, &s);
        for (int64_t j = threadIdx.x; j < classes; j += blockDim.x) {
            const T e = (T)exp(C().wide(xr[j]) - mx); /* kernels/c rounds it to T first */
            dr[j] = C().narrow(scale * ((double)e / s - (double)(j == lab)));
        }
    }
}

template <typename T> KC_DEV void k_cross_entropy(T *loss, const T *x, const int64_t *labels, int64_t rows,
                                                  int64_t classes, int64_t *check)
{
    ce_forward<T, CeOf<T> >(loss, x, labels, rows, classes, check);
}

template <typename T> KC_DEV void k_cross_entropy_grad(T *dx, const T *dloss, const T *x,
                                                       const int64_t *labels, int64_t rows, int64_t classes)
{
    ce_backward<T, CeOf<T> >(dx, dloss, x, labels, rows, classes);
}

/* the 16-bit logits of --precision bf16 / fp16 (kernels/c's k_cross_entropy_bf16, ...): loss float32 */
#define KC_CE_LOW(S, L)                                                                                        \
    KC_GLOBAL void k_cross_entropy##S(float *loss, const uint16_t *x, const int64_t *labels, int64_t rows,     \
                                      int64_t classes, int64_t *check)                                         \
    {                                                                                                          \
        ce_forward<float, CeLow<L> >(loss, x, labels, rows, classes, check);                                  \
    }                                                                                                          \
    KC_GLOBAL void k_cross_entropy_grad##S(uint16_t *dx, const float *dloss, const uint16_t *x,                \
                                           const int64_t *labels, int64_t rows, int64_t classes)               \
    {                                                                                                          \
        ce_backward<float, CeLow<L> >(dx, dloss, x, labels, rows, classes);                                   \
    }
KC_CE_LOW(_bf16, KcBf16)
KC_CE_LOW(_f16, KcF16)
#undef KC_CE_LOW

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
