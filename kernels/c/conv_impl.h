/* conv_impl.h — typed bodies of conv.c, included once per dtype with
 * T (element type) and S (name suffix) defined.  No include guard on purpose. */

/* ---- im2col / col2im ---------------------------------------------------- */

typedef struct {
    const KConv2d *p;
    T *col;        /* (cg kh kw) x (oh ow) */
    T *x;          /* one image-group: cg x h x w (read by im2col, += by col2im) */
} KFN(ColJob);

/* im2col for channels [lo, hi): row (ci, i, j) of col, one output row oy at
 * a time as [zeros | strided copy | zeros]. */
static void KFN(im2col_chans)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(ColJob) *jb = ctx;
    const KConv2d *p = jb->p;
    const int64_t nout = p->oh * p->ow;
    for (int64_t ci = lo; ci < hi; ci++)
        for (int64_t i = 0; i < p->kh; i++)
            for (int64_t j = 0; j < p->kw; j++) {
                T *cr = jb->col + ((ci * p->kh + i) * p->kw + j) * nout;
                const T *xc = jb->x + ci * p->h * p->w;
                int64_t a = p->pl - j * p->dw, xlo, xhi;
                tap_range(a, p->sw, p->w, p->ow, &xlo, &xhi);
                for (int64_t oy = 0; oy < p->oh; oy++) {
                    T *d = cr + oy * p->ow;
                    int64_t iy = oy * p->sh - p->pt + i * p->dh;
                    if (iy < 0 || iy >= p->h) {
                        memset(d, 0, (size_t)p->ow * sizeof(T));
                        continue;
                    }
                    const int64_t r0 = iy * p->w - a;  /* xc[r0 + ox sw] = tap */
                    memset(d, 0, (size_t)xlo * sizeof(T));
                    for (int64_t ox = xlo; ox < xhi; ox++)
                        d[ox] = xc[r0 + ox * p->sw];
                    memset(d + xhi, 0, (size_t)(p->ow - xhi) * sizeof(T));
                }
            }
}

/* col2im for channels [lo, hi): the inverse walk of im2col_chans with +=. */
static void KFN(col2im_chans)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(ColJob) *jb = ctx;
    const KConv2d *p = jb->p;
    const int64_t nout = p->oh * p->ow;
    for (int64_t ci = lo; ci < hi; ci++)
        for (int64_t i = 0; i < p->kh; i++)
            for (int64_t j = 0; j < p->kw; j++) {
                const T *cr = jb->col + ((ci * p->kh + i) * p->kw + j) * nout;
                T *xc = jb->x + ci * p->h * p->w;
                int64_t a = p->pl - j * p->dw, xlo, xhi;
                tap_range(a, p->sw, p->w, p->ow, &xlo, &xhi);
                for (int64_t oy = 0; oy < p->oh; oy++) {
                    int64_t iy = oy * p->sh - p->pt + i * p->dh;
                    if (iy < 0 || iy >= p->h)
                        continue;
                    const int64_t r0 = iy * p->w - a;
                    const T *s = cr + oy * p->ow;
                    for (int64_t ox = xlo; ox < xhi; ox++)
                        xc[r0 + ox * p->sw] += s[ox];
                }
            }
}

static void KFN(im2col)(const KConv2d *p, T *col, const T *x)
{
    KFN(ColJob) jb = {p, col, (T *)x};  /* im2col only reads x */
    par_range(KFN(im2col_chans), &jb, p->c / p->groups, p->kh * p->kw * p->oh * p->ow);
}

static void KFN(col2im)(const KConv2d *p, T *x, const T *col)
{
    KFN(ColJob) jb = {p, (T *)col, x};  /* col2im only reads col */
    par_range(KFN(col2im_chans), &jb, p->c / p->groups, p->kh * p->kw * p->oh * p->ow);
}

/* ---- convolution -------------------------------------------------------- */

void KFN(k_conv2d)(const KConv2d *p, T *y, const T *x, const T *w, const T *b, T *ws)
{
    conv_check(p);
    const int64_t g = p->groups, cg = p->c / g, mg = p->m / g, hw = p->h * p->w;
    const int64_t kk = cg * p->kh * p->kw, nout = p->oh * p->ow;
    const int direct = k_conv2d_is_direct(p);
    if (KFN(on_dnnl)(p, K_CONV_FWD, y, x, w, b, NULL))
        return;
    for (int64_t nb = 0; nb < p->n; nb++)
        for (int64_t gi = 0; gi < g; gi++) {
            const T *xg = x + (nb * p->c + gi * cg) * hw, *col = xg;
            if (!direct) {
                KFN(im2col)(p, ws, xg);
                col = ws;
            }
            KFN(k_matmul)(y + (nb * p->m + gi * mg) * nout, w + gi * mg * kk, col, 1, 0, 0,
                          mg, nout, kk, 0, 0, 0.0);
        }
    if (b)
        for (int64_t nb = 0; nb < p->n; nb++)
            for (int64_t mo = 0; mo < p->m; mo++) {
                T *yp = y + (nb * p->m + mo) * nout;
                for (int64_t i = 0; i < nout; i++)
                    yp[i] += b[mo];
            }
}

void KFN(k_conv2d_grad_x)(const KConv2d *p, T *dx, const T *dy, const T *w, T *ws)
{
    conv_check(p);
    const int64_t g = p->groups, cg = p->c / g, mg = p->m / g, hw = p->h * p->w;
    const int64_t kk = cg * p->kh * p->kw, nout = p->oh * p->ow;
    const int direct = k_conv2d_is_direct(p);
    if (KFN(on_dnnl)(p, K_CONV_BWD_X, dx, dy, w, NULL, NULL))
        return;
    if (!direct)
        memset(dx, 0, (size_t)(p->n * p->c * hw) * sizeof(T));
    for (int64_t nb = 0; nb < p->n; nb++)
        for (int64_t gi = 0; gi < g; gi++) {
            T *dxg = dx + (nb * p->c + gi * cg) * hw;
            KFN(k_matmul)(direct ? dxg : ws, w + gi * mg * kk,
                          dy + (nb * p->m + gi * mg) * nout, 1, 0, 0, kk, nout, mg, 1, 0, 0.0);
            if (!direct)
                KFN(col2im)(p, dxg, ws);
        }
}

void KFN(k_conv2d_grad_w)(const KConv2d *p, T *dw, const T *dy, const T *x, T *ws)
{
    conv_check(p);
    const int64_t g = p->groups, cg = p->c / g, mg = p->m / g, hw = p->h * p->w;
    const int64_t kk = cg * p->kh * p->kw, nout = p->oh * p->ow;
    const int direct = k_conv2d_is_direct(p);
    if (KFN(on_dnnl)(p, K_CONV_BWD_W, dw, x, dy, NULL, NULL))
        return;
    if (p->n == 0)
        memset(dw, 0, (size_t)(p->m * kk) * sizeof(T));
    for (int64_t nb = 0; nb < p->n; nb++)
        for (int64_t gi = 0; gi < g; gi++) {
            const T *xg = x + (nb * p->c + gi * cg) * hw, *col = xg;
            if (!direct) {
                KFN(im2col)(p, ws, xg);
                col = ws;
            }
            KFN(k_matmul)(dw + gi * mg * kk, dy + (nb * p->m + gi * mg) * nout, col, 1, 0, 0,
                          mg, kk, nout, 0, 1, nb > 0 ? 1.0 : 0.0);
        }
}

void KFN(k_conv2d_grad_b)(const KConv2d *p, T *db, const T *dy)
{
    const int64_t nout = p->oh * p->ow;
    for (int64_t mo = 0; mo < p->m; mo++) {
        double s = 0;
        for (int64_t nb = 0; nb < p->n; nb++) {
            const T *d = dy + (nb * p->m + mo) * nout;
            for (int64_t i = 0; i < nout; i++)
                s += d[i];
        }
        db[mo] = (T)s;
    }
}

/* ---- pooling ------------------------------------------------------------ */

typedef struct {
    const KPool2d *p;
    T *y;            /* forward output, or dx in the backward */
    int64_t *arg;
    const T *x;      /* forward input, or dy in the backward */
    const int64_t *carg;
} KFN(PoolJob);

/* MaxPool of output (oy, ox) of plane xp, every tap checked: y and the first
 * maximal tap's index (NaN wins, -1: no tap in the image) */
static T KFN(maxpool_window)(const KPool2d *p, const T *xp, int64_t oy, int64_t ox, int64_t *arg)
{
    T best = (T)-INFINITY;
    int64_t bi = -1;
    for (int64_t i = 0; i < p->kh; i++) {
        int64_t iy = oy * p->sh - p->pt + i * p->dh;
        if (iy < 0 || iy >= p->h)
            continue;
        for (int64_t j = 0; j < p->kw; j++) {
            int64_t ix = ox * p->sw - p->pl + j * p->dw, k = iy * p->w + ix;
            if (ix < 0 || ix >= p->w)
                continue;
            if (bi < 0)
                bi = k;  /* torch starts from the first tap, even at -inf */
            if (xp[k] > best || xp[k] != xp[k]) {
                best = xp[k];
                bi = k;
            }
        }
    }
    *arg = bi;
    return best;
}

/* MaxPool over planes [lo, hi).  A window inside the image's columns (ox in
 * [cx0, cx1)) with no NaN takes its maximum without branches (a random
 * plane's maximum moves unpredictably, and mispredicted branches were most of
 * the time), then the first tap equal to it, also by selects: the same tap
 * and value as maxpool_window's (ties and -0 vs +0 alike: the first one
 * wins).  ResNet-18's MaxPool (112^2, batch 8): 0.35x the branching loop's
 * samples under perf. */
static void KFN(maxpool_planes)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(PoolJob) *jb = ctx;
    const KPool2d *p = jb->p;
    const int64_t nout = p->oh * p->ow, span = (p->kw - 1) * p->dw;
    int64_t cx0, cx1; /* ox sw - pl >= 0 and ox sw - pl + span < w */
    tap_range(p->pl, p->sw, p->w - span, p->ow, &cx0, &cx1);
    for (int64_t pl = lo; pl < hi; pl++) {
        const T *xp = jb->x + pl * p->h * p->w;
        T *y = jb->y + pl * nout;
        int64_t *arg = jb->arg + pl * nout;
        for (int64_t oy = 0; oy < p->oh; oy++) {
            int64_t i0 = 0, i1 = p->kh; /* the rows of the window inside the image */
            while (i0 < i1 && oy * p->sh - p->pt + i0 * p->dh < 0)
                i0++;
            while (i1 > i0 && oy * p->sh - p->pt + (i1 - 1) * p->dh >= p->h)
                i1--;
            for (int64_t ox = 0; ox < p->ow; ox++) {
                const int64_t o = oy * p->ow + ox, k0 = (oy * p->sh - p->pt + i0 * p->dh) * p->w + ox * p->sw - p->pl;
                if (ox < cx0 || ox >= cx1 || i0 == i1) {
                    y[o] = KFN(maxpool_window)(p, xp, oy, ox, &arg[o]);
                    continue;
                }
                T best = xp[k0];
                int nan = 0;
                for (int64_t i = i0; i < i1; i++)
                    for (int64_t j = 0; j < p->kw; j++) {
                        const T v = xp[k0 + (i - i0) * p->dh * p->w + j * p->dw];
                        best = v > best ? v : best;
                        nan |= v != v;
                    }
                if (nan) {
                    y[o] = KFN(maxpool_window)(p, xp, oy, ox, &arg[o]);
                    continue;
                }
                int64_t bi = k0; /* the first tap equal to best: from the last to the first, by selects */
                for (int64_t i = i1 - 1; i >= i0; i--)
                    for (int64_t j = p->kw - 1; j >= 0; j--) {
                        const int64_t k = k0 + (i - i0) * p->dh * p->w + j * p->dw;
                        bi = xp[k] == best ? k : bi;
                    }
                y[o] = best;
                arg[o] = bi;
            }
        }
    }
}

void KFN(k_maxpool2d)(const KPool2d *p, T *y, int64_t *arg, const T *x)
{
    KFN(PoolJob) jb = {p, y, arg, x, NULL};
    pool_check(p);
    par_range(KFN(maxpool_planes), &jb, p->n * p->c, p->h * p->w);
}

static void KFN(maxpool_grad_planes)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(PoolJob) *jb = ctx;
    const KPool2d *p = jb->p;
    const int64_t nout = p->oh * p->ow, hw = p->h * p->w;
    for (int64_t pl = lo; pl < hi; pl++) {
        T *dxp = jb->y + pl * hw;
        memset(dxp, 0, (size_t)hw * sizeof(T));
        for (int64_t o = 0; o < nout; o++) {
            int64_t k = jb->carg[pl * nout + o];
            if (k >= 0 && k < hw)
                dxp[k] += jb->x[pl * nout + o];
        }
    }
}

void KFN(k_maxpool2d_grad)(const KPool2d *p, T *dx, const T *dy, const int64_t *arg)
{
    KFN(PoolJob) jb = {p, dx, NULL, dy, arg};
    pool_check(p);
    par_range(KFN(maxpool_grad_planes), &jb, p->n * p->c, p->h * p->w);
}

/* Divisor of AveragePool's window at (oy, ox): taps inside the padded
 * extent (count_include_pad) or inside the image. */
static int64_t KFN(avg_divisor)(const KPool2d *p, int64_t oy, int64_t ox)
{
    int64_t ny = 0, nx = 0;
    const int64_t lo_y = p->count_include_pad ? -p->pt : 0;
    const int64_t hi_y = p->count_include_pad ? p->h + p->pb : p->h;
    const int64_t lo_x = p->count_include_pad ? -p->pl : 0;
    const int64_t hi_x = p->count_include_pad ? p->w + p->pr : p->w;
    for (int64_t i = 0; i < p->kh; i++) {
        int64_t iy = oy * p->sh - p->pt + i * p->dh;
        ny += iy >= lo_y && iy < hi_y;
    }
    for (int64_t j = 0; j < p->kw; j++) {
        int64_t ix = ox * p->sw - p->pl + j * p->dw;
        nx += ix >= lo_x && ix < hi_x;
    }
    return ny * nx;
}

/* AveragePool forward (jb->arg == NULL unused) over planes [lo, hi); with
 * bwd set, the backward: dx (jb->y) += dy / divisor on each in-image tap. */
static void KFN(avgpool_planes_dir)(const KFN(PoolJob) *jb, int64_t lo, int64_t hi, int bwd)
{
    const KPool2d *p = jb->p;
    const int64_t nout = p->oh * p->ow, hw = p->h * p->w;
    for (int64_t pl = lo; pl < hi; pl++) {
        if (bwd)
            memset(jb->y + pl * hw, 0, (size_t)hw * sizeof(T));
        for (int64_t oy = 0; oy < p->oh; oy++)
            for (int64_t ox = 0; ox < p->ow; ox++) {
                const int64_t div = KFN(avg_divisor)(p, oy, ox), o = pl * nout + oy * p->ow + ox;
                const T g = bwd && div ? jb->x[o] / (T)div : (T)0;
                double s = 0;
                for (int64_t i = 0; i < p->kh; i++) {
                    int64_t iy = oy * p->sh - p->pt + i * p->dh;
                    if (iy < 0 || iy >= p->h)
                        continue;
                    for (int64_t j = 0; j < p->kw; j++) {
                        int64_t ix = ox * p->sw - p->pl + j * p->dw;
                        if (ix < 0 || ix >= p->w)
                            continue;
                        if (bwd)
                            jb->y[pl * hw + iy * p->w + ix] += g;
                        else
                            s += jb->x[pl * hw + iy * p->w + ix];
                    }
                }
                if (!bwd)
                    jb->y[o] = div ? (T)(s / (double)div) : (T)0;
            }
    }
}

static void KFN(avgpool_planes)(void *ctx, int64_t lo, int64_t hi)
{
    KFN(avgpool_planes_dir)(ctx, lo, hi, 0);
}

static void KFN(avgpool_grad_planes)(void *ctx, int64_t lo, int64_t hi)
{
    KFN(avgpool_planes_dir)(ctx, lo, hi, 1);
}

void KFN(k_avgpool2d)(const KPool2d *p, T *y, const T *x)
{
    KFN(PoolJob) jb = {p, y, NULL, x, NULL};
    pool_check(p);
    par_range(KFN(avgpool_planes), &jb, p->n * p->c, p->h * p->w);
}

void KFN(k_avgpool2d_grad)(const KPool2d *p, T *dx, const T *dy)
{
    KFN(PoolJob) jb = {p, dx, NULL, dy, NULL};
    pool_check(p);
    par_range(KFN(avgpool_grad_planes), &jb, p->n * p->c, p->h * p->w);
}

void KFN(k_global_avgpool)(T *y, const T *x, int64_t nc, int64_t hw)
{
#pragma omp parallel for schedule(static) if (nc * hw >= K_PAR_MIN)
    for (int64_t i = 0; i < nc; i++) {
        double s = 0;
        for (int64_t k = 0; k < hw; k++)
            s += x[i * hw + k];
        y[i] = (T)(s / (double)hw);
    }
}

void KFN(k_global_avgpool_grad)(T *dx, const T *dy, int64_t nc, int64_t hw)
{
#pragma omp parallel for schedule(static) if (nc * hw >= K_PAR_MIN)
    for (int64_t i = 0; i < nc; i++) {
        const T g = (T)((double)dy[i] / (double)hw);
        for (int64_t k = 0; k < hw; k++)
            dx[i * hw + k] = g;
    }
}
