/* optim_impl.h — typed bodies of optim.c, included once per dtype with
 * T (element type), S (name suffix) and KM_SQRT defined.  No include guard on
 * purpose. */

/* the one factor the updates multiply the gradient by: clip_grad_norm_'s
 * coefficient (1 without clipping) times the inverse loss scale (1/S in T,
 * as GradScaler.unscale_; a power of two S makes the product exact) */
static T KFN(update_coef)(const T *gsq, double clip, double scale)
{
    const T coef = clip > 0 ? (T)k_clip_coef((double)gsq[0], clip) : (T)1;
    return scale > 0 ? coef * (T)(1.0 / scale) : coef;
}

/* torch.optim.AdamW, _single_tensor_adamw (amsgrad off, maximize off):
 *   param.mul_(1 - lr*wd)
 *   exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
 *   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
 *   step_size = lr / (1 - beta1**step);  bc2_sqrt = sqrt(1 - beta2**step)
 *   denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-step_size)     # p + (v*m)/denom
 * l2: torch.optim.Adam instead, _single_tensor_adam: no param.mul_, and
 *   grad = grad.add(param, alpha=wd) (when wd != 0) before the moments. */
void KFN(k_adamw)(T *p, const T *g, T *m, T *v, int64_t n, double lr,
                  double beta1, double beta2, double eps, double wd, int l2, double lr_mult,
                  int64_t step, const T *gsq, double clip, double scale, int64_t micro, int64_t accum)
{
    if (micro != accum - 1 || (gsq && !isfinite((double)gsq[0])))
        return;
    lr *= lr_mult; /* this part's param group: lr times its factor */
    const int clipping = clip > 0 || scale > 0;
    const T coef = KFN(update_coef)(gsq, clip, scale);
    const double bc1 = 1 - pow(beta1, (double)step);
    const double bc2 = 1 - pow(beta2, (double)step);
    const T decay = (T)(1 - lr * (l2 ? 0 : wd)), neg_step = (T)(-(lr / bc1)), twd = (T)wd;
    const int add_wd = l2 && wd != 0; /* skipped, not multiplied by 0: an inf p stays out of the moments */
    const T b1 = (T)beta1, c1 = (T)(1 - beta1), b2 = (T)beta2, c2 = (T)(1 - beta2);
    const T bc2_sqrt = (T)sqrt(bc2), teps = (T)eps;
#pragma omp parallel for schedule(static) if (n >= K_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        T gi = clipping ? g[i] * coef : g[i];  /* grad.mul_(clip_coef) */
        if (add_wd)
            gi = gi + twd * p[i];
        else
            p[i] = p[i] * decay;
        m[i] = m[i] * b1 + c1 * gi;
        v[i] = v[i] * b2 + c2 * gi * gi;
        T denom = KM_SQRT(v[i]) / bc2_sqrt + teps;
        p[i] = p[i] + neg_step * m[i] / denom;
    }
}

/* torch.optim.SGD, _single_tensor_sgd (dampening 0):
 *   if wd != 0: d_p = d_p.add(param, alpha=wd)
 *   if momentum != 0: buf = clone(d_p) on the first step,
 *                     else buf.mul_(momentum).add_(d_p);
 *                     d_p = d_p.add(buf, alpha=momentum) if nesterov else buf
 *   param.add_(d_p, alpha=-lr)
 * The first step is step == 1 (buf is then written, never read). */
void KFN(k_sgd)(T *p, const T *g, T *buf, int64_t n, double lr,
                double momentum, double wd, int nesterov, double lr_mult, int64_t step, const T *gsq, double clip,
                double scale, int64_t micro, int64_t accum)
{
    if (micro != accum - 1 || (gsq && !isfinite((double)gsq[0])))
        return;
    lr *= lr_mult;
    const int clipping = clip > 0 || scale > 0;
    const T coef = KFN(update_coef)(gsq, clip, scale);
    const T twd = (T)wd, mom = (T)momentum, neg_lr = (T)(-lr);
#pragma omp parallel for schedule(static) if (n >= K_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        T d = clipping ? g[i] * coef : g[i];
        if (wd != 0)  /* skipped, not multiplied by 0: an inf p stays out of d */
            d = d + twd * p[i];
        if (momentum != 0) {
            buf[i] = step == 1 ? d : buf[i] * mom + d;
            d = nesterov ? d + mom * buf[i] : buf[i];
        }
        p[i] = p[i] + neg_lr * d;
    }
}

/* The squares of x[lo, hi) summed in K_SQ_LANES double lanes (an omp simd
 * loop: one chain of dependent adds would be bound by the add's latency, 4
 * cycles an element), the lanes added in order, then the tail: the same
 * bits at every vector width. */
#define K_SQ_LANES 8
static double KFN(sq_sum)(const void *ctx, int64_t lo, int64_t hi)
{
    const T *x = ctx;
    double lane[K_SQ_LANES] = {0}, a = 0;
    int64_t i = lo;
    for (; i + K_SQ_LANES <= hi; i += K_SQ_LANES)
#pragma omp simd
        for (int l = 0; l < K_SQ_LANES; l++)
            lane[l] += (double)x[i + l] * (double)x[i + l];
    for (int l = 0; l < K_SQ_LANES; l++)
        a += lane[l];
    for (; i < hi; i++)
        a += (double)x[i] * (double)x[i];
    return a;
}
#undef K_SQ_LANES

void KFN(k_sum_squares)(T *y, const T *x, int64_t n, int accumulate)
{
    const double s = par_sum(KFN(sq_sum), x, n, 1);
    if (team_writer())
        y[0] = (T)(accumulate ? (double)y[0] + s : s);
}

void KFN(k_grad_accum)(T *y, const T *x, int64_t n, int64_t micro)
{
    K_PAR_FOR(n, y[i] = micro == 0 ? x[i] : y[i] + x[i]); /* walk.h: its thread's part inside a team */
}
