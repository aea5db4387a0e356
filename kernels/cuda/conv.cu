/* conv.cu — the device half of 2-D convolution (im2col, col2im, bias) and
 * 2-D pooling, forward and backward: the twins of kernels/c/conv.c.
 *
 * Convolution is im2col + GEMM per (image, group), as in kernels/c, with
 * the GEMMs issued by the launcher (kc_gemm_f32, cuBLASLt) and col in the
 * caller's workspace of k_conv2d_workspace elements.  k_im2col_f32 writes
 * one col element per thread (rows (ci, i, j) of the group's channels,
 * columns (oy, ox)).  k_col2im_f32 is its adjoint as a gather: each input
 * pixel sums the col entries of the taps that saw it, in tap order (i, j),
 * the order kernels/c adds them in; every (image, group) owns its pixels,
 * so dx is written, not accumulated, and needs no zeroing and no atomics.
 *
 * Pooling runs a thread per output (forward) or per input pixel (backward).
 * The backward gathers too: a pixel visits the outputs whose window can
 * hold it, in ascending output order, and adds the gradient of those that
 * chose it (max) or covered it (average): the same float additions in the
 * same order as kernels/c's scatter, without races.
 */

/* ---- convolution ----------------------------------------------------------- */

/* col (cg kh kw x oh ow) of one image-group x (cg x h x w) */
template <typename T> KC_DEV void k_im2col(KConv2d p, T *col, const T *x)
{
    const int64_t nout = p.oh * p.ow, n = p.c / p.groups * p.kh * p.kw * nout;
    for (int64_t t = kc_first<int64_t>(); t < n; t += kc_stride<int64_t>()) {
        const int64_t ox = t % p.ow, oy = t / p.ow % p.oh, row = t / nout;
        const int64_t j = row % p.kw, i = row / p.kw % p.kh, ci = row / (p.kw * p.kh);
        const int64_t iy = oy * p.sh - p.pt + i * p.dh, ix = ox * p.sw - p.pl + j * p.dw;
        col[t] = iy >= 0 && iy < p.h && ix >= 0 && ix < p.w ? x[(ci * p.h + iy) * p.w + ix] : (T)0;
    }
}

/* x (cg x h x w, written) = the sum of the col entries each pixel fed */
template <typename T> KC_DEV void k_col2im(KConv2d p, T *x, const T *col)
{
    const int64_t nout = p.oh * p.ow, hw = p.h * p.w, n = p.c / p.groups * hw;
    for (int64_t t = kc_first<int64_t>(); t < n; t += kc_stride<int64_t>()) {
        const int64_t ci = t / hw, iy = t % hw / p.w, ix = t % p.w;
        T acc = (T)0;
        for (int64_t i = 0; i < p.kh; i++) {
            const int64_t ny = iy + p.pt - i * p.dh; /* = oy sh */
            if (ny < 0 || ny % p.sh || ny / p.sh >= p.oh)
                continue;
            for (int64_t j = 0; j < p.kw; j++) {
                const int64_t nx = ix + p.pl - j * p.dw;
                if (nx < 0 || nx % p.sw || nx / p.sw >= p.ow)
                    continue;
                acc += col[((ci * p.kh + i) * p.kw + j) * nout + ny / p.sh * p.ow + nx / p.sw];
            }
        }
        x[t] = acc;
    }
}

/* y (n x m x nout) += b per channel */
template <typename T> KC_DEV void k_conv2d_bias(T *y, const T *b, int64_t n, int64_t m, int64_t nout)
{
    for (int64_t t = kc_first<int64_t>(); t < n * m * nout; t += kc_stride<int64_t>())
        y[t] += b[t / nout % m];
}

/* db[mo] = sum of dy over images and positions: one block per channel */
template <typename T> KC_DEV void k_conv2d_grad_b(KConv2d p, T *db, const T *dy)
{
    const int64_t nout = p.oh * p.ow, cnt = p.n * nout;
    for (int64_t mo = blockIdx.x; mo < p.m; mo += gridDim.x) {
        double s = 0;
        for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x)
            s += dy[(k / nout * p.m + mo) * nout + k % nout];
        s = block_sum(s);
        if (threadIdx.x == 0)
            db[mo] = (T)s;
    }
}

/* ---- pooling ----------------------------------------------------------------- */

/* output rows [lo, hi) whose window (o s - pad + k d, k < kn) can hold
 * input row iy: lo = ceil((iy + pad - (kn - 1) d) / s), hi = floor((iy +
 * pad) / s) + 1, clipped to [0, on) */
KC_DEV void pool_range(int64_t iy, int64_t pad, int64_t kn, int64_t d, int64_t s, int64_t on,
                       int64_t *lo, int64_t *hi)
{
    const int64_t a = iy + pad - (kn - 1) * d, b = iy + pad;
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    *hi = kc_min64(b / s + 1, on);
}

/* MaxPool: y = max over the in-image taps (NaN wins, padding never);
 * arg = the plane index of the first maximum (-1: empty window) */
template <typename T> KC_DEV void k_maxpool2d(KPool2d p, T *y, int64_t *arg, const T *x)
{
    const int64_t nout = p.oh * p.ow, n = p.n * p.c * nout;
    for (int64_t t = kc_first<int64_t>(); t < n; t += kc_stride<int64_t>()) {
        const int64_t pl = t / nout, oy = t % nout / p.ow, ox = t % p.ow;
        const T *xp = x + pl * p.h * p.w;
        T best = -kc_inf<T>();
        int64_t bi = -1;
        for (int64_t i = 0; i < p.kh; i++) {
            const int64_t iy = oy * p.sh - p.pt + i * p.dh;
            if (iy < 0 || iy >= p.h)
                continue;
            for (int64_t j = 0; j < p.kw; j++) {
                const int64_t ix = ox * p.sw - p.pl + j * p.dw, k = iy * p.w + ix;
                if (ix < 0 || ix >= p.w)
                    continue;
                if (bi < 0)
                    bi = k; /* torch starts from the first tap, even at -inf */
                if (xp[k] > best || xp[k] != xp[k]) {
                    best = xp[k];
                    bi = k;
                }
            }
        }
        y[t] = best;
        arg[t] = bi;
    }
}

/* dx (written): each pixel sums dy of the outputs whose arg is that pixel;
 * those outputs' windows hold the pixel, so only they are visited */
template <typename T> KC_DEV void k_maxpool2d_grad(KPool2d p, T *dx, const T *dy, const int64_t *arg)
{
    const int64_t nout = p.oh * p.ow, hw = p.h * p.w, n = p.n * p.c * hw;
    for (int64_t t = kc_first<int64_t>(); t < n; t += kc_stride<int64_t>()) {
        const int64_t pl = t / hw, k = t % hw, iy = k / p.w, ix = k % p.w;
        int64_t y0, y1, x0, x1;
        pool_range(iy, p.pt, p.kh, p.dh, p.sh, p.oh, &y0, &y1);
        pool_range(ix, p.pl, p.kw, p.dw, p.sw, p.ow, &x0, &x1);
        T acc = (T)0;
        for (int64_t oy = y0; oy < y1; oy++)
            for (int64_t ox = x0; ox < x1; ox++) {
                const int64_t o = pl * nout + oy * p.ow + ox;
                if (arg[o] == k)
                    acc += dy[o];
            }
        dx[t] = acc;
    }
}

/* AveragePool's divisor at (oy, ox): taps inside the padded extent
 * (count_include_pad) or inside the image */
KC_DEV int64_t avg_divisor(const KPool2d &p, int64_t oy, int64_t ox)
{
    const int64_t lo_y = p.count_include_pad ? -p.pt : 0, hi_y = p.count_include_pad ? p.h + p.pb : p.h;
    const int64_t lo_x = p.count_include_pad ? -p.pl : 0, hi_x = p.count_include_pad ? p.w + p.pr : p.w;
    int64_t ny = 0, nx = 0;
    for (int64_t i = 0; i < p.kh; i++) {
        const int64_t iy = oy * p.sh - p.pt + i * p.dh;
        ny += iy >= lo_y && iy < hi_y;
    }
    for (int64_t j = 0; j < p.kw; j++) {
        const int64_t ix = ox * p.sw - p.pl + j * p.dw;
        nx += ix >= lo_x && ix < hi_x;
    }
    return ny * nx;
}

template <typename T> KC_DEV void k_avgpool2d(KPool2d p, T *y, const T *x)
{
    const int64_t nout = p.oh * p.ow, n = p.n * p.c * nout;
    for (int64_t t = kc_first<int64_t>(); t < n; t += kc_stride<int64_t>()) {
        const int64_t pl = t / nout, oy = t % nout / p.ow, ox = t % p.ow;
        const T *xp = x + pl * p.h * p.w;
        const int64_t div = avg_divisor(p, oy, ox);
        double s = 0;
        for (int64_t i = 0; i < p.kh; i++) {
            const int64_t iy = oy * p.sh - p.pt + i * p.dh;
            if (iy < 0 || iy >= p.h)
                continue;
            for (int64_t j = 0; j < p.kw; j++) {
                const int64_t ix = ox * p.sw - p.pl + j * p.dw;
                if (ix >= 0 && ix < p.w)
                    s += xp[iy * p.w + ix];
            }
        }
        y[t] = div ? (T)(s / (double)div) : (T)0;
    }
}

/* dx (written): each pixel sums dy / divisor of the outputs whose window
 * has it as a tap */
template <typename T> KC_DEV void k_avgpool2d_grad(KPool2d p, T *dx, const T *dy)
{
    const int64_t nout = p.oh * p.ow, hw = p.h * p.w, n = p.n * p.c * hw;
    for (int64_t t = kc_first<int64_t>(); t < n; t += kc_stride<int64_t>()) {
        const int64_t pl = t / hw, iy = t % hw / p.w, ix = t % p.w;
        int64_t y0, y1, x0, x1;
        pool_range(iy, p.pt, p.kh, p.dh, p.sh, p.oh, &y0, &y1);
        pool_range(ix, p.pl, p.kw, p.dw, p.sw, p.ow, &x0, &x1);
        T acc = (T)0;
        for (int64_t oy = y0; oy < y1; oy++) {
            const int64_t ty = iy + p.pt - oy * p.sh; /* = i dh for tap i */
            if (ty % p.dh || ty / p.dh >= p.kh)
                continue;
            for (int64_t ox = x0; ox < x1; ox++) {
                const int64_t tx = ix + p.pl - ox * p.sw, div = avg_divisor(p, oy, ox);
                if (tx % p.dw || tx / p.dw >= p.kw || !div)
                    continue;
                acc += dy[pl * nout + oy * p.ow + ox] / (T)div;
            }
        }
        dx[t] = acc;
    }
}

/* GlobalAveragePool: one block per (image, channel) row of hw */
template <typename T> KC_DEV void k_global_avgpool(T *y, const T *x, int64_t nc, int64_t hw)
{
    for (int64_t r = blockIdx.x; r < nc; r += gridDim.x) {
        double s = 0;
        for (int64_t k = threadIdx.x; k < hw; k += blockDim.x)
            s += x[r * hw + k];
        s = block_sum(s);
        if (threadIdx.x == 0)
            y[r] = (T)(s / (double)hw);
    }
}

template <typename T> KC_DEV void k_global_avgpool_grad(T *dx, const T *dy, int64_t nc, int64_t hw)
{
    for (int64_t t = kc_first<int64_t>(); t < nc * hw; t += kc_stride<int64_t>())
        dx[t] = (T)((double)dy[t / hw] / (double)hw);
}
