/* optim.cu — optimizer updates on a (shard of a) flat parameter and the
 * squared gradient norm that clips them: the twins of kernels/c/optim.c,
 * one grid-stride pass each.
 *
 * The hyper-parameters and the step come from the device copy of the
 * step's KcStepParams (kc.h), not from kernel arguments, so a captured
 * CUDA Graph replays with the current learning rate and step.  Every thread
 * derives the same scalars of the element type T from them exactly as
 * kernels/c does (double arithmetic, one rounding to T), then applies
 * PyTorch's single-tensor update in T in the same operation order.  (The device
 * may contract a * b + c into one FMA, so results can differ from kernels/c
 * in the last bit.)
 *
 * Clipping (--clip-grad-norm) is torch.nn.utils.clip_grad_norm_: the step
 * sums every shard's squared gradient with k_sum_squares_f32, all-reduces
 * the sum into gsq[0], and the updates scale each gradient element by one
 * float coefficient before using it.  gsq is a device pointer, read only
 * when the step params ask for clipping.
 *
 * Gradient accumulation (--accum K): the step runs K times per optimizer
 * step with the same captured graph, so the micro-step is read from the
 * step params too.  k_grad_accum_f32 sums each micro-step's gradient shard
 * into the accumulated one, and the updates return at once except at the
 * last micro-step (micro == accum - 1; accum 1 is every step).
 */

/* clip_grad_norm_'s factor exactly as kernels.h k_clip_coef computes it
 * (double, clamped to 1, a NaN norm passes), rounded to float once; 1
 * without clipping, and g * 1.0f is g, so the unclipped update is unchanged.
 * Loss scaling (--precision fp16, loss_scale S > 0): times (float)(1/S), as
 * kernels/c's update_coef. */
template <typename T> KC_DEV T clip_coef(const T *gsq, const KcStepParams *sp)
{
    const double clip = sp->clip_norm;
    T coef = 1;
    if (clip > 0) {
        const double c = clip / (sqrt((double)gsq[0]) + 1e-6);
        coef = (T)(c > 1 ? 1 : c);
    }
    return sp->loss_scale > 0 ? coef * (T)(1.0 / sp->loss_scale) : coef;
}

/* the optimizers update only at the step's last micro-step, and only when
 * the gradient's norm is finite (a NaN or inf gradient, an fp16 overflow, a
 * non-finite loss skips the step on every rank: gsq is all-reduced) */
template <typename T> KC_DEV bool update_now(const T *gsq, const KcStepParams *sp)
{
    return sp->micro == sp->accum - 1 && (!gsq || kc_fabs(gsq[0]) <= KC_DBL_MAX);
}

/* torch.optim.AdamW (see kernels/c/optim_impl.h) */
template <typename T> KC_DEV void k_adamw(T *p, const T *g, T *m, T *v, int64_t n, int decay, double lr_mult,
                                          const T *gsq, const KcStepParams *sp)
{
    if (!update_now(gsq, sp))
        return;
    const T coef = clip_coef(gsq, sp);
    const double lr = sp->lr * lr_mult, beta1 = sp->beta1, beta2 = sp->beta2, step = (double)sp->opt_step;
    const double bc1 = 1 - pow(beta1, step), bc2 = 1 - pow(beta2, step);
    /* decay: 0 none (--no-decay), 1 decoupled (AdamW), 2 added to the gradient (Adam), as kernels/c */
    const T shrink = (T)(1 - lr * (decay == 1 ? sp->weight_decay : 0.0)), neg_step = (T)(-(lr / bc1));
    const T twd = (T)sp->weight_decay;
    const bool add_wd = decay == 2 && sp->weight_decay != 0;
    const T b1 = (T)beta1, c1 = (T)(1 - beta1), b2 = (T)beta2, c2 = (T)(1 - beta2);
    const T bc2_sqrt = (T)sqrt(bc2), eps = (T)sp->eps;
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>()) {
        const T gi = add_wd ? g[i] * coef + twd * p[i] : g[i] * coef;
        const T pi = add_wd ? p[i] : p[i] * shrink;
        const T mi = m[i] * b1 + c1 * gi;
        const T vi = v[i] * b2 + c2 * gi * gi;
        const T denom = kc_sqrt(vi) / bc2_sqrt + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + neg_step * mi / denom;
    }
}

/* torch.optim.SGD (dampening 0, nesterov off); buf untouched without
 * momentum (may be NULL then) */
template <typename T> KC_DEV void k_sgd(T *p, const T *g, T *buf, int64_t n, int decay, int nesterov, double lr_mult,
                                        const T *gsq, const KcStepParams *sp)
{
    if (!update_now(gsq, sp))
        return;
    const T coef = clip_coef(gsq, sp);
    const double wd = decay ? sp->weight_decay : 0.0, momentum = sp->momentum;
    const T twd = (T)wd, mom = (T)momentum, neg_lr = (T)(-(sp->lr * lr_mult));
    const bool first = sp->opt_step == 1;
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>()) {
        T d = g[i] * coef;
        if (wd != 0) /* skipped, not multiplied by 0: an inf p stays out of d */
            d = d + twd * p[i];
        if (momentum != 0) {
            const T b = first ? d : buf[i] * mom + d;
            buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        p[i] = p[i] + neg_lr * d;
    }
}

/* y[0] = the sum of x[i]^2 in double (plus y[0] when accumulate), reduced
 * like k_mse_f32: block sums, then the last block adds them in block order.
 * Every launch writes y, n == 0 included (the sum is then 0). */
template <typename T> KC_DEV void k_sum_squares(T *y, const T *x, int64_t n, int accumulate)
{
    double v[1] = {0};
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        v[0] += (double)x[i] * (double)x[i];
    v[0] = block_sum(v[0]);
    if (grid_combine(v, 0.0, KcSum()) && threadIdx.x == 0)
        y[0] = (T)(accumulate ? (double)y[0] + v[0] : v[0]);
}

/* gradient accumulation: y = x at micro-step 0, y + x after it (one float
 * add, bit for bit kernels/c's k_grad_accum) */
template <typename T> KC_DEV void k_grad_accum(T *y, const T *x, int64_t n, const KcStepParams *sp)
{
    const bool first = sp->micro == 0;
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        y[i] = first ? x[i] : y[i] + x[i];
}

/* loss scaling (--precision fp16): the backward's seed S / accum, and the
 * squared norm of S times the gradient divided by S^2 (in double, one
 * rounding), both reading S from the step params (kernels/c's
 * k_loss_seed_f32 / k_unscale_sq_f32) */
KC_GLOBAL void k_loss_seed_f32(float *y, int64_t n, const KcStepParams *sp)
{
    const float v = (float)(sp->loss_scale / (double)sp->accum);
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        y[i] = v;
}

KC_GLOBAL void k_unscale_sq_f32(float *y, const KcStepParams *sp)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        y[0] = (float)((double)y[0] / (sp->loss_scale * sp->loss_scale));
}

/* the gradient norm's guard (kernels/c's k_nan_unless_finite): y[0] = NaN
 * when the loss x[0] is not finite */
KC_GLOBAL void k_nan_unless_finite(int ydt, void *y, int xdt, const void *x)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    const double v = xdt == K_DT_F64 ? *(const double *)x : (double)*(const float *)x;
    if (fabs(v) < KC_INF)
        return;
    if (ydt == K_DT_F64)
        *(double *)y = __longlong_as_double(0x7ff8000000000000LL);
    else
        *(float *)y = KC_NANF;
}
