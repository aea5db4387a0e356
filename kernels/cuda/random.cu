/* random.cu — Dropout and its backward: the twins of kernels/c/random.c.
 *
 * Element i keeps when word i % 4 of Philox-4x32-10 (common.cuh, the same
 * function as k_philox4x32_10) under key = seed and counter {i / 4 (64
 * bits), step, stream} is >= ratio 2^32, compared in double: the mask
 * depends only on (seed, stream, step, i), so it is kernels/c's mask bit
 * for bit, whatever the launch geometry.  One thread draws one counter's
 * four words and handles those four elements.  The step is the device copy
 * in KcStepParams (kc.h), so a replayed CUDA Graph draws a new mask each
 * step.
 */

/* y = x mask s, s = 1 / (T)(1 - ratio); ratio <= 0 copies x exactly
 * (s = 1, every word passes), ratio >= 1 drops all; mask NULL to skip */
template <typename T> KC_DEV void k_dropout(T *y, uint8_t *mask, const T *x, int64_t n, double ratio,
                                            uint64_t seed, uint32_t stream, const KcStepParams *sp)
{
    const uint32_t step = (uint32_t)sp->step, k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const double thr = ratio * 4294967296.0;
    const T s = ratio <= 0 ? (T)1 : ratio >= 1 ? (T)0 : (T)1 / (T)(1 - ratio);
    for (int64_t b = kc_first<int64_t>(); b < (n + 3) / 4; b += kc_stride<int64_t>()) {
        uint32_t w[4] = {(uint32_t)b, (uint32_t)((uint64_t)b >> 32), step, stream};
        kc_philox(w, k0, k1);
        for (int k = 0; k < 4 && b * 4 + k < n; k++) {
            const int64_t i = b * 4 + k;
            const bool keep = (double)w[k] >= thr;
            y[i] = keep ? x[i] * s : (T)0;
            if (mask)
                mask[i] = keep;
        }
    }
}

/* dx = dy mask s (ratio >= 1: 0); dx may alias dy */
template <typename T> KC_DEV void k_dropout_grad(T *dx, const T *dy, const uint8_t *mask, int64_t n,
                                                 double ratio)
{
    const T s = ratio >= 1 ? (T)0 : (T)1 / (T)(1 - ratio);
    for (int64_t i = kc_first<int64_t>(); i < n; i += kc_stride<int64_t>())
        dx[i] = mask[i] && ratio < 1 ? dy[i] * s : (T)0;
}
