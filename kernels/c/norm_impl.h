/* norm_impl.h — typed bodies of norm.c, included once per dtype with
 * T (element type) and S (name suffix) defined.  With K_LN16 defined (the
 * 16-bit instances: T float, X uint16_t, XW(v) its bits widened, XR(v) a float
 * rounded to them) only k_layernorm, reading x and writing y of X (mean,
 * invstd, scale, bias of T), and k_layernorm_grad, reading x of X (dy, dx and
 * the rest of T): x widened as loaded, y rounded once as stored, the same
 * arithmetic in T (the bits of Casts around k_layernorm_f32 and before
 * k_layernorm_grad_f32).  No include guard on purpose. */
#ifndef K_LN16
#define X T
#define XW(v) (v)
#define XR(v) (v)
#endif

/* Mean and biased variance of the row x[0..n) in one pass: K_LANES running
 * means and sums of squared deviations of x - x[0] (Welford's update, in T,
 * the lanes one vector register: the lane loop is an omp simd loop, which
 * the compiler would otherwise unroll into scalar code), combined in double
 * (every lane has the same count, so the combined mean is the lanes' mean
 * and the sum of squares gains count times the lane means' spread: Chan's
 * formula for equal counts, with no division), the last n % K_LANES
 * elements added one by one.  Shifting by the row's first element keeps the
 * running means small, so a row far from 0 keeps T's precision; and no
 * E[x^2] - E[x]^2 is formed.  *shifted: mean - x[0]. */
/* The lanes' combination and the tail of moments (row x, first element x0, blocks K_LANES-element blocks whose
 * lanes hold means m and sums q) */
static void KFN(moments_end)(const X *x, int64_t n, T x0, const T *m, const T *q, int64_t blocks, double *mean,
                             double *shifted, double *var)
{
    double cnt = 0, mu = 0, m2 = 0;
    if (blocks) { /* lane l: blocks elements, mean m[l], sum q[l] */
        for (int l = 0; l < K_LANES; l++)
            mu += (double)m[l];
        mu /= K_LANES;
        for (int l = 0; l < K_LANES; l++) {
            const double d = (double)m[l] - mu;
            m2 += (double)q[l] + d * d * (double)blocks;
        }
        cnt = (double)(blocks * K_LANES);
    }
    for (int64_t i = blocks * K_LANES; i < n; i++) {
        const double v = (double)XW(x[i]) - (double)x0, d = v - mu;
        cnt += 1;
        mu += d / cnt;
        m2 += d * (v - mu);
    }
    *shifted = mu;
    *mean = (double)x0 + mu;
    *var = m2 / (double)n;
}

/* one Welford step of the lanes (m, q) of a row shifted by x0, for the block xb, r = 1 / (its number + 1) */
#define K_WELFORD(xb, x0, m, q, r)                                  \
    _Pragma("omp simd") for (int l = 0; l < K_LANES; l++)            \
    {                                                                \
        const T v_ = XW((xb)[l]) - (x0), d_ = v_ - (m)[l];           \
        (m)[l] += d_ * (r);                                          \
        (q)[l] += d_ * (v_ - (m)[l]);                                \
    }

/* moments of two rows of n, xa and xb, their block loops together (each row's chain of updates is a latency
 * chain: two run at once in the core's pipelines); each row's arithmetic is moments', so the same bits */
static void KFN(moments2)(const X *xa, const X *xb, int64_t n, double *mean, double *shifted, double *var)
{
    const T a0 = XW(xa[0]), b0 = XW(xb[0]);
    T ma[K_LANES] = {0}, qa[K_LANES] = {0}, mb[K_LANES] = {0}, qb[K_LANES] = {0};
    const int64_t blocks = n / K_LANES;
    for (int64_t k = 0; k < blocks; k++) {
        const T r = (T)1 / (T)(k + 1);
        K_WELFORD(xa + k * K_LANES, a0, ma, qa, r)
        K_WELFORD(xb + k * K_LANES, b0, mb, qb, r)
    }
    KFN(moments_end)(xa, n, a0, ma, qa, blocks, mean, shifted, var);
    KFN(moments_end)(xb, n, b0, mb, qb, blocks, mean + 1, shifted + 1, var + 1);
}

static void KFN(moments)(const X *x, int64_t n, double *mean, double *shifted, double *var)
{
    const T x0 = XW(x[0]);
    T m[K_LANES] = {0}, q[K_LANES] = {0};
    const int64_t blocks = n / K_LANES;
    for (int64_t k = 0; k < blocks; k++) {
        const T r = (T)1 / (T)(k + 1);
        K_WELFORD(x + k * K_LANES, x0, m, q, r)
    }
    KFN(moments_end)(x, n, x0, m, q, blocks, mean, shifted, var);
}
#undef K_WELFORD

/* ---- LayerNormalization ------------------------------------------------- */

typedef struct {
    X *y;
    T *mean, *invstd;
    const X *x;
    const T *scale, *bias;
    int64_t inner;
    double eps;
} KFN(LayerNormJob);

static void KFN(layernorm_rows)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(LayerNormJob) *j = ctx;
    const int64_t n = j->inner;
    double mus[2], shs[2], vars[2]; /* two rows' moments at a time (moments2), the second used next row */
    for (int64_t r = lo; r < hi; r++) {
        const X *x = j->x + r * n;
        X *y = j->y + r * n;
        if ((r - lo) % 2 == 0) {
            if (r + 1 < hi)
                KFN(moments2)(x, x + n, n, mus, shs, vars);
            else
                KFN(moments)(x, n, mus, shs, vars);
        }
        const double mu = mus[(r - lo) % 2], shifted = shs[(r - lo) % 2], var = vars[(r - lo) % 2];
        const double is = 1 / sqrt(var + j->eps);
        /* (x - x0) - (mean - x0): exact where x is near x0, however far both are from 0 */
        const T x0 = XW(x[0]), m = (T)shifted, a = (T)is, *sc = j->scale, *b = j->bias;
        if (sc && b) /* each case one loop in T, which vectorises */
            for (int64_t i = 0; i < n; i++) {
                const T v = (XW(x[i]) - x0 - m) * a * sc[i] + b[i];
                y[i] = XR(v);
            }
        else if (sc)
            for (int64_t i = 0; i < n; i++) {
                const T v = (XW(x[i]) - x0 - m) * a * sc[i];
                y[i] = XR(v);
            }
        else if (b)
            for (int64_t i = 0; i < n; i++) {
                const T v = (XW(x[i]) - x0 - m) * a + b[i];
                y[i] = XR(v);
            }
        else
            for (int64_t i = 0; i < n; i++) {
                const T v = (XW(x[i]) - x0 - m) * a;
                y[i] = XR(v);
            }
        if (j->mean)
            j->mean[r] = (T)mu;
        if (j->invstd)
            j->invstd[r] = (T)is;
    }
}

void KFN(k_layernorm)(X *y, T *mean, T *invstd, const X *x, const T *scale,
                      const T *bias, int64_t outer, int64_t inner, double eps)
{
    KFN(LayerNormJob) j = {y, mean, invstd, x, scale, bias, inner, eps};
    if (inner <= 0)
        return;
    par_range(KFN(layernorm_rows), &j, outer, inner);
}

/* dscale, dbias over columns [c0, c0 + t): sums down all rows. */
static void KFN(layernorm_grad_cols)(T *dscale, T *dbias, const T *dy, const X *x,
                                     const T *mean, const T *invstd, int64_t outer,
                                     int64_t inner, int64_t c0, int64_t t)
{
    double ds[K_TILE], db[K_TILE];
    for (int64_t c = 0; c < t; c++)
        ds[c] = db[c] = 0;
    for (int64_t r = 0; r < outer; r++) {
        const T *dyr = dy + r * inner + c0;
        const X *xr = x + r * inner + c0;
        const double mu = mean[r], is = invstd[r];
        for (int64_t c = 0; c < t; c++) {
            ds[c] += (double)dyr[c] * (((double)XW(xr[c]) - mu) * is);
            db[c] += dyr[c];
        }
    }
    for (int64_t c = 0; c < t; c++) {
        if (dscale)
            dscale[c0 + c] = (T)ds[c];
        if (dbias)
            dbias[c0 + c] = (T)db[c];
    }
}

/* dx of one row of n: the row's two sums in K_LANES lanes of T (an omp simd
 * loop, as moments'; combined in double), then dx in T. */
static void KFN(layernorm_grad_row)(T *dx, const T *dy, const X *x, double mu,
                                    double is, const T *scale, int64_t n)
{
    const T m = (T)mu, a = (T)is;
    T g1[K_LANES] = {0}, gx[K_LANES] = {0};
    int64_t i = 0;
    for (; i + K_LANES <= n; i += K_LANES)
#pragma omp simd
        for (int l = 0; l < K_LANES; l++) {
            const T g = scale ? dy[i + l] * scale[i + l] : dy[i + l];
            g1[l] += g;
            gx[l] += g * ((XW(x[i + l]) - m) * a);
        }
    double sg = 0, sgx = 0;
    for (int l = 0; l < K_LANES; l++)
        sg += g1[l], sgx += gx[l];
    for (; i < n; i++) {
        const double g = scale ? (double)dy[i] * scale[i] : (double)dy[i];
        sg += g;
        sgx += g * (((double)XW(x[i]) - mu) * is);
    }
    const T mg = (T)(sg / (double)n), mgx = (T)(sgx / (double)n);
    for (i = 0; i < n; i++) {
        const T g = scale ? dy[i] * scale[i] : dy[i], xh = (XW(x[i]) - m) * a;
        dx[i] = a * (g - mg - xh * mgx);
    }
}

/* the widest row layernorm_grad_sweep takes (its sums: 32 KiB of stack) */
#ifndef K_LN_SWEEP
#define K_LN_SWEEP 2048
#endif

/* One thread, dx and the column sums together: one sweep down the rows, each
 * row's dy and x read once (from memory: the row's second read, by dx, hits
 * the cache), the column sums on the stack.  The same sums in the same order
 * as the two sweeps of k_layernorm_grad, so the same bits.  Row r's dy is
 * read before its dx is written, so dx may alias dy here too. */
static void KFN(layernorm_grad_sweep)(T *dx, T *dscale, T *dbias, const T *dy, const X *x, const T *mean,
                                      const T *invstd, const T *scale, int64_t outer, int64_t inner)
{
    double ds[K_LN_SWEEP], db[K_LN_SWEEP];
    for (int64_t c = 0; c < inner; c++)
        ds[c] = db[c] = 0;
    for (int64_t r = 0; r < outer; r++) {
        const T *dyr = dy + r * inner;
        const X *xr = x + r * inner;
        const double mu = mean[r], is = invstd[r];
        for (int64_t c = 0; c < inner; c++) {
            ds[c] += (double)dyr[c] * (((double)XW(xr[c]) - mu) * is);
            db[c] += dyr[c];
        }
        KFN(layernorm_grad_row)(dx + r * inner, dyr, xr, mu, is, scale, inner);
    }
    for (int64_t c = 0; c < inner; c++) {
        if (dscale)
            dscale[c] = (T)ds[c];
        if (dbias)
            dbias[c] = (T)db[c];
    }
}

/* the two loops of k_layernorm_grad, each an `omp for` of the calling team: the column tiles (each column sums
 * its rows in order) and dx's rows write apart and read only inputs, so a thread done with its tiles goes on to
 * its rows (nowait) */
static void KFN(layernorm_grad_team)(T *dx, T *dscale, T *dbias, const T *dy, const X *x, const T *mean,
                                     const T *invstd, const T *scale, int64_t outer, int64_t inner)
{
    const int64_t tile = min64(K_TILE, max64(64, (inner + 7) / 8));
    const int64_t tiles = dscale || dbias ? (inner + tile - 1) / tile : 0;
    const int64_t rows = dx ? outer : 0;
#pragma omp for schedule(static) nowait
    for (int64_t k = 0; k < tiles; k++)
        KFN(layernorm_grad_cols)(dscale, dbias, dy, x, mean, invstd, outer, inner, k * tile,
                                 min64(tile, inner - k * tile));
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < rows; r++)
        KFN(layernorm_grad_row)(dx + r * inner, dy + r * inner, x + r * inner, mean[r], invstd[r], scale, inner);
}

void KFN(k_layernorm_grad)(T *dx, T *dscale, T *dbias, const T *dy, const X *x,
                           const T *mean, const T *invstd, const T *scale,
                           int64_t outer, int64_t inner)
{
    if (inner <= 0)
        return;
#ifdef _OPENMP
    /* inside a team that shares (k_share): its threads split the loops (the first takes a small one whole) */
    const int shared = k_sharing && omp_in_parallel(), big = outer * inner >= K_PAR_MIN;
    if (shared && big) {
        KFN(layernorm_grad_team)(dx, dscale, dbias, dy, x, mean, invstd, scale, outer, inner);
        return;
    }
    if (shared && omp_get_thread_num() > 0)
        return;
    const int alone = !big || omp_get_max_threads() == 1 || omp_in_parallel();
#else
    const int alone = 1;
#endif
    if (dx && (dscale || dbias) && inner <= K_LN_SWEEP && alone) {
        KFN(layernorm_grad_sweep)(dx, dscale, dbias, dy, x, mean, invstd, scale, outer, inner);
        return;
    }
    /* one team for both loops: one fork, one barrier */
#pragma omp parallel if (outer * inner >= K_PAR_MIN)
    KFN(layernorm_grad_team)(dx, dscale, dbias, dy, x, mean, invstd, scale, outer, inner);
}

#undef X
#undef XW
#undef XR
#ifndef K_LN16

/* ---- BatchNormalization ------------------------------------------------- */

/* s = sum of x, q = sum of (x - mu)^2 over channel ch of an n x c x l tensor. */
static void KFN(channel_sums)(const T *x, int64_t n, int64_t c, int64_t l, int64_t ch,
                              double mu, double *s, double *q)
{
    double a = 0, b = 0;
    for (int64_t k = 0; k < n; k++) {
        const T *xr = x + (k * c + ch) * l;
        for (int64_t i = 0; i < l; i++) {
            double d = (double)xr[i] - mu;
            a += xr[i];
            b += d * d;
        }
    }
    *s = a;
    *q = b;
}

void KFN(k_batchnorm_train)(T *y, T *mean, T *invstd, T *rm_out, T *rv_out,
                            const T *x, const T *scale, const T *bias, const T *rm_in,
                            const T *rv_in, int64_t n, int64_t c, int64_t l, double eps,
                            double momentum)
{
    const double m = (double)(n * l);
#pragma omp parallel for schedule(static) if (n * c * l >= K_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) {
        double s, q, mu, var;
        KFN(channel_sums)(x, n, c, l, ch, 0, &s, &q);
        mu = s / m;
        KFN(channel_sums)(x, n, c, l, ch, mu, &s, &q);
        var = q / m;
        const double is = 1 / sqrt(var + eps);
        const double a = is * (scale ? (double)scale[ch] : 1.0);
        const double b = bias ? (double)bias[ch] : 0.0;
        for (int64_t k = 0; k < n; k++) {
            const T *xr = x + (k * c + ch) * l;
            T *yr = y + (k * c + ch) * l;
            for (int64_t i = 0; i < l; i++)
                yr[i] = (T)(((double)xr[i] - mu) * a + b);
        }
        if (mean)
            mean[ch] = (T)mu;
        if (invstd)
            invstd[ch] = (T)is;
        if (rm_out)
            rm_out[ch] = (T)(momentum * (double)rm_in[ch] + (1 - momentum) * mu);
        if (rv_out)
            rv_out[ch] = (T)(momentum * (double)rv_in[ch] + (1 - momentum) * (q / (m - 1)));
    }
}

void KFN(k_batchnorm_grad)(T *dx, T *dscale, T *dbias, const T *dy, const T *x,
                           const T *mean, const T *invstd, const T *scale, int64_t n,
                           int64_t c, int64_t l)
{
    const double m = (double)(n * l);
#pragma omp parallel for schedule(static) if (n * c * l >= K_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) {
        const double mu = mean[ch], is = invstd[ch];
        double sdy = 0, dot = 0;
        for (int64_t k = 0; k < n; k++) {
            const T *xr = x + (k * c + ch) * l, *dyr = dy + (k * c + ch) * l;
            for (int64_t i = 0; i < l; i++) {
                sdy += dyr[i];
                dot += ((double)xr[i] - mu) * (double)dyr[i];
            }
        }
        if (dscale)
            dscale[ch] = (T)(dot * is);
        if (dbias)
            dbias[ch] = (T)sdy;
        if (!dx || m == 0)
            continue;
        const double w = scale ? (double)scale[ch] : 1.0;
        const double gm = sdy / m, proj = dot * is * is / m;
        for (int64_t k = 0; k < n; k++) {
            const T *xr = x + (k * c + ch) * l, *dyr = dy + (k * c + ch) * l;
            T *dxr = dx + (k * c + ch) * l;
            for (int64_t i = 0; i < l; i++)
                dxr[i] = (T)(((double)dyr[i] - gm - ((double)xr[i] - mu) * proj) * is * w);
        }
    }
}

void KFN(k_batchnorm_infer)(T *y, const T *x, const T *scale, const T *bias,
                            const T *mean, const T *var, int64_t n, int64_t c, int64_t l,
                            double eps)
{
#pragma omp parallel for schedule(static) if (n * c * l >= K_PAR_MIN)
    for (int64_t ch = 0; ch < c; ch++) {
        const double is = 1 / sqrt((double)var[ch] + eps), mu = mean[ch];
        const double a = is * (scale ? (double)scale[ch] : 1.0);
        const double b = bias ? (double)bias[ch] : 0.0;
        for (int64_t k = 0; k < n; k++) {
            const T *xr = x + (k * c + ch) * l;
            T *yr = y + (k * c + ch) * l;
            for (int64_t i = 0; i < l; i++)
                yr[i] = (T)(((double)xr[i] - mu) * a + b);
        }
    }
}

void KFN(k_bn_running_var)(T *rv_out, const T *rv_in, const T *invstd, int64_t c, double eps,
                           double momentum)
{
    for (int64_t k = 0; k < c; k++) {
        const double is = invstd[k];
        rv_out[k] = (T)(momentum * (double)rv_in[k] + (1 - momentum) * (1.0 / (is * is) - eps));
    }
}
#endif /* K_LN16 */
