/* loss_impl.h — typed bodies of loss.c, included once per dtype with
 * T (element type) and S (name suffix) defined.  No include guard on purpose. */

typedef struct {
    const T *p, *t;
} KFN(MseJob);

static double KFN(mse_sum)(const void *ctx, int64_t lo, int64_t hi)
{
    const KFN(MseJob) *j = ctx;
    double a = 0;
    for (int64_t i = lo; i < hi; i++) {
        double d = (double)j->p[i] - (double)j->t[i];
        a += d * d;
    }
    return a;
}

void KFN(k_mse)(T *loss, const T *p, const T *t, int64_t n)
{
    const double s = par_sum(KFN(mse_sum), &(KFN(MseJob)){p, t}, n, 1);
    loss[0] = n > 0 ? (T)(s / (double)n) : (T)NAN;  /* torch: mean of nothing */
}

/* PyTorch's mse_loss_backward: norm = 2/n rounded to T, norm (p - t) dloss. */
void KFN(k_mse_grad)(T *dp, const T *dloss, const T *p, const T *t, int64_t n)
{
    if (n <= 0)
        return;
    const T norm = (T)(2.0 / (double)n), g = dloss[0];
#pragma omp parallel for schedule(static) if (n >= K_PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        dp[i] = norm * (p[i] - t[i]) * g;
}

int64_t KFN(k_nll_loss)(T *loss, const T *lp, const int64_t *labels, const T *weights,
                        int64_t n, int64_t c, int64_t d, int reduction, int has_ignore,
                        int64_t ignore_index)
{
    const int64_t m = n * d;
    double s = 0, ws = 0;
    for (int64_t i = 0; i < m; i++)
        if (!nll_ignored(labels[i], has_ignore, ignore_index) && (labels[i] < 0 || labels[i] >= c))
            return i;
    for (int64_t i = 0; i < m; i++) {
        const int64_t l = labels[i];
        if (nll_ignored(l, has_ignore, ignore_index)) {
            if (reduction == K_LOSS_NONE)
                loss[i] = 0;
            continue;
        }
        const double w = weights ? (double)weights[l] : 1.0;
        const double v = -w * (double)lp[nll_at(i, l, c, d)];
        if (reduction == K_LOSS_NONE)
            loss[i] = (T)v;
        s += v;
        ws += w;
    }
    if (reduction == K_LOSS_SUM)
        loss[0] = (T)s;
    else if (reduction == K_LOSS_MEAN)
        loss[0] = (T)(s / ws);
    return -1;
}

void KFN(k_nll_loss_grad)(T *dx, const T *dx_in, const T *dloss, const int64_t *labels,
                          const T *weights, int64_t n, int64_t c, int64_t d, int reduction,
                          int has_ignore, int64_t ignore_index)
{
    const int64_t m = n * d;
    const size_t bytes = (size_t)(m * c) * sizeof(T);
    double ws = 1;
    if (!dx_in)
        memset(dx, 0, bytes);
    else if (dx != dx_in)
        memcpy(dx, dx_in, bytes);
    if (!dloss)
        return;
    if (reduction == K_LOSS_MEAN) {
        ws = 0;
        for (int64_t i = 0; i < m; i++) {
            const int64_t l = labels[i];
            if (!nll_ignored(l, has_ignore, ignore_index) && l >= 0 && l < c)
                ws += weights ? (double)weights[l] : 1.0;
        }
    }
    for (int64_t i = 0; i < m; i++) {
        const int64_t l = labels[i];
        if (nll_ignored(l, has_ignore, ignore_index) || l < 0 || l >= c)
            continue;
        const double w = weights ? (double)weights[l] : 1.0;
        const double g = (double)dloss[reduction == K_LOSS_NONE ? i : 0];
        dx[nll_at(i, l, c, d)] -= (T)(w * g / ws);
    }
}
