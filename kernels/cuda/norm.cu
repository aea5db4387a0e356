/* norm.cu — LayerNormalization and BatchNormalization, forward and
 * backward, and the ONNX running variance: the twins of kernels/c/norm.c.
 *
 * Both take statistics of a group in double with two passes (mean, then
 * the mean of squared deviations), like kernels/c, then normalise:
 *   LayerNorm  one block per row (grid-stride over rows);
 *   BatchNorm  one block per channel, threads over its n l elements.
 * Each pass is a strided loop of the block's threads plus block_reduce, so
 * statistics are deterministic.  Outputs are written only after the last
 * read of the inputs they may alias (y and x, dx and dy), and that read is
 * by the same thread.
 *
 * LayerNorm's dscale / dbias sum down the columns, across rows: a second
 * kernel (k_layernorm_grad_cols_f32) gives each block 32 columns (and a
 * chunk of the rows, when the columns are too few to fill the device) and
 * splits the rows among its warps, folding the warps' partials in order
 * (and k_cols_fold the chunks'); the launcher runs it before the dx kernel,
 * since dx may alias dy.
 */

/* ---- LayerNormalization -------------------------------------------------- */

/* rows of inner elements: y = (x - mean) invstd scale + bias (scale, bias
 * NULL: 1, 0); mean, invstd (NULL to skip) saved in T.  X: x's and y's
 * element (KcIo: T, or the 16-bit instances' tags: x widened as loaded, y
 * rounded from T as stored) */
template <typename T, typename X = T>
KC_DEV void k_layernorm(typename KcIo<X>::E *y, T *mean, T *invstd, const typename KcIo<X>::E *x, const T *scale,
                        const T *bias, int64_t outer, int64_t inner, double eps)
{
    for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
        const typename KcIo<X>::E *xr = x + r * inner;
        typename KcIo<X>::E *yr = y + r * inner;
        double s = 0, q = 0;
        for (int64_t i = threadIdx.x; i < inner; i += blockDim.x)
            s += KcIo<X>::in(xr[i]);
        const double mu = block_sum(s) / (double)inner;
        for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) {
            const double d = (double)KcIo<X>::in(xr[i]) - mu;
            q += d * d;
        }
        const double is = 1 / sqrt(block_sum(q) / (double)inner + eps);
        for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) {
            double v = ((double)KcIo<X>::in(xr[i]) - mu) * is;
            if (scale)
                v *= scale[i];
            if (bias)
                v += bias[i];
            yr[i] = KcIo<X>::out((T)v);
        }
        if (threadIdx.x == 0 && mean)
            mean[r] = (T)mu;
        if (threadIdx.x == 0 && invstd)
            invstd[r] = (T)is;
    }
}

/* the 16-bit instances (kernels.def's KC rows): 16-bit x and y, float32 mean, invstd, scale, bias */
#define KC_LAYERNORM_LOW(S, L)                                                                                 \
    KC_GLOBAL void k_layernorm##S(uint16_t *y, float *mean, float *invstd, const uint16_t *x, const float *scale, \
                                  const float *bias, int64_t outer, int64_t inner, double eps)                 \
    {                                                                                                          \
        k_layernorm<float, L>(y, mean, invstd, x, scale, bias, outer, inner, eps);                             \
    }
KC_LAYERNORM_LOW(_bf16, KcIoBf16)
KC_LAYERNORM_LOW(_f16, KcIoF16)
#undef KC_LAYERNORM_LOW

/* dx of each row from the saved mean / invstd (scale NULL: 1):
 * dx = invstd (g - mean(g) - xhat mean(g xhat)), g = dy scale */
template <typename T> KC_DEV void k_layernorm_grad(T *dx, const T *dy, const T *x, const T *mean,
                                                   const T *invstd, const T *scale, int64_t outer,
                                                   int64_t inner)
{
    for (int64_t r = blockIdx.x; r < outer; r += gridDim.x) {
        const int64_t off = r * inner;
        const double mu = mean[r], is = invstd[r];
        double sg = 0, sgx = 0;
        for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) {
            const double g = scale ? (double)dy[off + i] * scale[i] : (double)dy[off + i];
            sg += g;
            sgx += g * (((double)x[off + i] - mu) * is);
        }
        sg = block_sum(sg) / (double)inner;
        sgx = block_sum(sgx) / (double)inner;
        for (int64_t i = threadIdx.x; i < inner; i += blockDim.x) {
            const double g = scale ? (double)dy[off + i] * scale[i] : (double)dy[off + i];
            dx[off + i] = (T)(is * (g - sg - ((double)x[off + i] - mu) * is * sgx));
        }
    }
}

/* dscale = sum over rows of dy xhat, dbias = sum of dy (each NULL to skip);
 * the rows split into chunks (ceil outer / chunks each); a block takes 32
 * columns of one chunk, warp w the chunk's rows w, w + warps, ...  More
 * than one chunk: the chunk's sums go to kc_colpart (dscale's as value 0,
 * dbias's as value 1) and k_cols_fold finishes. */
template <typename T> KC_DEV void k_layernorm_grad_cols(T *dscale, T *dbias, const T *dy, const T *x,
                                                        const T *mean, const T *invstd, int64_t outer,
                                                        int64_t inner, int64_t chunks)
{
    __shared__ double ps[32][33], pb[32][33];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int64_t ctiles = (inner + 31) / 32, rows = (outer + chunks - 1) / chunks;
    for (int64_t t = blockIdx.x; t < ctiles * chunks; t += gridDim.x) {
        const int64_t ch = t / ctiles, c = t % ctiles * 32 + lane;
        const int64_t r1 = outer < (ch + 1) * rows ? outer : (ch + 1) * rows;
        double ds = 0, db = 0;
        if (c < inner)
            for (int64_t r = ch * rows + warp; r < r1; r += warps) {
                const double d = dy[r * inner + c];
                ds += d * (((double)x[r * inner + c] - (double)mean[r]) * (double)invstd[r]);
                db += d;
            }
        ps[warp][lane] = ds;
        pb[warp][lane] = db;
        __syncthreads();
        if (warp == 0 && c < inner) {
            for (int w = 1; w < warps; w++) {
                ds += ps[w][lane];
                db += pb[w][lane];
            }
            if (chunks > 1) {
                kc_colpart[ch * inner + c] = ds;
                kc_colpart[(chunks + ch) * inner + c] = db;
            } else {
                if (dscale)
                    dscale[c] = (T)ds;
                if (dbias)
                    dbias[c] = (T)db;
            }
        }
        __syncthreads();
    }
}

/* ---- BatchNormalization -------------------------------------------------- */

/* offset of element k (of n l) of channel ch in an n x c x l tensor */
template <typename I> KC_DEV int64_t bn_at(I k, I l, int64_t c, int64_t ch)
{
    const I b = k / l;
    return ((int64_t)b * c + ch) * (int64_t)l + (int64_t)(k - b * l);
}

template <typename T, typename I>
KC_DEV void bn_train(T *y, T *mean, T *invstd, T *rm_out, T *rv_out, const T *x, const T *scale,
                     const T *bias, const T *rm_in, const T *rv_in, I m, I l, int64_t c, double eps, double momentum)
{
    for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
        double s = 0, q = 0;
        for (I k = threadIdx.x; k < m; k += blockDim.x)
            s += x[bn_at(k, l, c, ch)];
        const double mu = block_sum(s) / (double)m;
        for (I k = threadIdx.x; k < m; k += blockDim.x) {
            const double d = (double)x[bn_at(k, l, c, ch)] - mu;
            q += d * d;
        }
        q = block_sum(q);
        const double is = 1 / sqrt(q / (double)m + eps);
        const double a = is * (scale ? (double)scale[ch] : 1.0), b = bias ? (double)bias[ch] : 0.0;
        for (I k = threadIdx.x; k < m; k += blockDim.x) {
            const int64_t o = bn_at(k, l, c, ch);
            y[o] = (T)(((double)x[o] - mu) * a + b);
        }
        if (threadIdx.x == 0) {
            if (mean)
                mean[ch] = (T)mu;
            if (invstd)
                invstd[ch] = (T)is;
            if (rm_out)
                rm_out[ch] = (T)(momentum * (double)rm_in[ch] + (1 - momentum) * mu);
            if (rv_out)
                rv_out[ch] = (T)(momentum * (double)rv_in[ch] + (1 - momentum) * (q / ((double)m - 1)));
        }
    }
}

/* training mode, x n x c x l, one block per channel (see kernels.h) */
template <typename T> KC_DEV void k_batchnorm_train(T *y, T *mean, T *invstd, T *rm_out,
                                                    T *rv_out, const T *x, const T *scale,
                                                    const T *bias, const T *rm_in, const T *rv_in,
                                                    int64_t n, int64_t c, int64_t l, double eps, double momentum)
{
    if (n * l <= KC_INT32_LIMIT)
        bn_train<T, uint32_t>(y, mean, invstd, rm_out, rv_out, x, scale, bias, rm_in, rv_in,
                           (uint32_t)(n * l), (uint32_t)l, c, eps, momentum);
    else
        bn_train<T, int64_t>(y, mean, invstd, rm_out, rv_out, x, scale, bias, rm_in, rv_in, n * l, l, c,
                          eps, momentum);
}

template <typename T, typename I>
KC_DEV void bn_grad(T *dx, T *dscale, T *dbias, const T *dy, const T *x, const T *mean,
                    const T *invstd, const T *scale, I m, I l, int64_t c)
{
    for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const double mu = mean[ch], is = invstd[ch];
        double sdy = 0, dot = 0;
        for (I k = threadIdx.x; k < m; k += blockDim.x) {
            const int64_t o = bn_at(k, l, c, ch);
            sdy += dy[o];
            dot += ((double)x[o] - mu) * (double)dy[o];
        }
        sdy = block_sum(sdy);
        dot = block_sum(dot);
        if (threadIdx.x == 0 && dscale)
            dscale[ch] = (T)(dot * is);
        if (threadIdx.x == 0 && dbias)
            dbias[ch] = (T)sdy;
        if (!dx || m == 0)
            continue;
        const double w = scale ? (double)scale[ch] : 1.0;
        const double gm = sdy / (double)m, proj = dot * is * is / (double)m;
        for (I k = threadIdx.x; k < m; k += blockDim.x) {
            const int64_t o = bn_at(k, l, c, ch);
            dx[o] = (T)(((double)dy[o] - gm - ((double)x[o] - mu) * proj) * is * w);
        }
    }
}

/* training-mode backward, one block per channel; dx may alias dy */
template <typename T> KC_DEV void k_batchnorm_grad(T *dx, T *dscale, T *dbias, const T *dy,
                                                   const T *x, const T *mean, const T *invstd,
                                                   const T *scale, int64_t n, int64_t c, int64_t l)
{
    if (n * l <= KC_INT32_LIMIT)
        bn_grad<T, uint32_t>(dx, dscale, dbias, dy, x, mean, invstd, scale, (uint32_t)(n * l),
                          (uint32_t)l, c);
    else
        bn_grad<T, int64_t>(dx, dscale, dbias, dy, x, mean, invstd, scale, n * l, l, c);
}

/* inference: elementwise over n c l with the given statistics */
template <typename T> KC_DEV void k_batchnorm_infer(T *y, const T *x, const T *scale, const T *bias,
                                                    const T *mean, const T *var, int64_t n, int64_t c,
                                                    int64_t l, double eps)
{
    for (int64_t i = kc_first<int64_t>(); i < n * c * l; i += kc_stride<int64_t>()) {
        const int64_t ch = i / l % c;
        const double is = 1 / sqrt((double)var[ch] + eps), mu = mean[ch];
        const double a = is * (scale ? (double)scale[ch] : 1.0), b = bias ? (double)bias[ch] : 0.0;
        y[i] = (T)(((double)x[i] - mu) * a + b);
    }
}

/* ONNX running variance from the saved invstd; rv_out may alias rv_in */
template <typename T> KC_DEV void k_bn_running_var(T *rv_out, const T *rv_in, const T *invstd, int64_t c,
                                                   double eps, double momentum)
{
    for (int64_t k = kc_first<int64_t>(); k < c; k += kc_stride<int64_t>()) {
        const double is = invstd[k];
        rv_out[k] = (T)(momentum * (double)rv_in[k] + (1 - momentum) * (1.0 / (is * is) - eps));
    }
}
