/* optim.cu — optimizer updates on a (shard of a) flat parameter: the twins
 * of kernels/c/optim.c, one grid-stride pass each.
 *
 * The hyper-parameters and the step come from the device copy of the
 * step's KcStepParams (kc.h), not from kernel arguments, so a captured
 * CUDA Graph replays with the current learning rate and step.  Every thread
 * derives the same float scalars from them exactly as kernels/c does
 * (double arithmetic, one rounding to float), then applies PyTorch's
 * single-tensor update in float in the same operation order.  (The device
 * may contract a * b + c into one FMA, so results can differ from kernels/c
 * in the last bit.)
 */

/* torch.optim.AdamW (see kernels/c/optim_impl.h) */
KC_GLOBAL void k_adamw_f32(float *p, const float *g, float *m, float *v, int64_t n,
                           const KcStepParams *sp)
{
    const double lr = sp->lr, beta1 = sp->beta1, beta2 = sp->beta2, step = (double)sp->step;
    const double bc1 = 1 - pow(beta1, step), bc2 = 1 - pow(beta2, step);
    const float decay = (float)(1 - lr * sp->weight_decay), neg_step = (float)(-(lr / bc1));
    const float b1 = (float)beta1, c1 = (float)(1 - beta1), b2 = (float)beta2, c2 = (float)(1 - beta2);
    const float bc2_sqrt = (float)sqrt(bc2), eps = (float)sp->eps;
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>()) {
        const float gi = g[i];
        const float pi = p[i] * decay;
        const float mi = m[i] * b1 + c1 * gi;
        const float vi = v[i] * b2 + c2 * gi * gi;
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi + neg_step * mi / denom;
    }
}

/* torch.optim.SGD (dampening 0, nesterov off); buf untouched without
 * momentum (may be NULL then) */
KC_GLOBAL void k_sgd_f32(float *p, const float *g, float *buf, int64_t n, const KcStepParams *sp)
{
    const double wd = sp->weight_decay, momentum = sp->momentum;
    const float twd = (float)wd, mom = (float)momentum, neg_lr = (float)(-sp->lr);
    const bool first = sp->step == 1;
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>()) {
        float d = g[i];
        if (wd != 0) /* skipped, not multiplied by 0: an inf p stays out of d */
            d = d + twd * p[i];
        if (momentum != 0) {
            d = first ? d : buf[i] * mom + d;
            buf[i] = d;
        }
        p[i] = p[i] + neg_lr * d;
    }
}
