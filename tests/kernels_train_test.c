/* kernels_train_test.c — checks the kernels of training's end of the step in kernels/c: the losses (MSE,
 * cross-entropy and its 16-bit logits, negative log-likelihood), the optimizers (AdamW, SGD), loss scaling
 * (--precision fp16: the seed, the unscaled norm, skipped updates) and gradient clipping (k_sum_squares,
 * k_clip_coef, the updates' clip), f32 and f64.  The rest of kernels/c: kernels_test.c and the others; the
 * harness is ktest.h.
 *
 * Expected values come from naive loops written here or from constants worked out by hand in the comments.
 */
#include "ktest.h"

/* ---- losses ------------------------------------------------------------- */

static void test_mse(int dt)
{
    /* p = [1,2,3], t = [0,2,5]: ((1)^2 + 0^2 + (-2)^2) / 3 = 5/3;
     * grad with dloss 0.5: 0.5 * 2 (p - t) / 3 = [1/3, 0, -2/3] */
    static const double p3[] = {1, 2, 3}, t3[] = {0, 2, 5};
    const double want_loss = 5.0 / 3, want_grad[] = {1.0 / 3, 0, -2.0 / 3};
    Buf p = buf_new(3), t = buf_new(3), l = buf_new(1), dl = buf_new(1), dp = buf_new(3);
    set(&p, p3), set(&t, t3), dl.d[0] = 0.5;
    put(dt, &p), put(dt, &t), put(dt, &dl);
    CTX("k_mse hand example");
    if (dt == F32) k_mse_f32(l.f, p.f, t.f, 3);
    else k_mse_f64(l.d, p.d, t.d, 3);
    get(dt, &l);
    check(dt, l.d, &want_loss, 1, tol(dt));
    CTX("k_mse_grad hand example");
    if (dt == F32) k_mse_grad_f32(dp.f, dl.f, p.f, t.f, 3);
    else k_mse_grad_f64(dp.d, dl.d, p.d, t.d, 3);
    get(dt, &dp);
    check(dt, dp.d, want_grad, 3, tol(dt));
    buf_free(&p), buf_free(&t), buf_free(&l), buf_free(&dl), buf_free(&dp);

    /* random, against the definition */
    const int64_t n = 1000;
    p = buf_new(n), t = buf_new(n), dp = buf_new(n), l = buf_new(1), dl = buf_new(1);
    Buf want = buf_new(n);
    double s = 0, wl;
    fill_rnd(&p, -3, 3), fill_rnd(&t, -3, 3), dl.d[0] = rnd(0.5, 2);
    for (int64_t i = 0; i < n; i++) {
        s += (p.d[i] - t.d[i]) * (p.d[i] - t.d[i]);
        want.d[i] = dl.d[0] * 2 * (p.d[i] - t.d[i]) / n;
    }
    wl = s / n;
    put(dt, &p), put(dt, &t), put(dt, &dl);
    if (dt == F32) k_mse_f32(l.f, p.f, t.f, n), k_mse_grad_f32(dp.f, dl.f, p.f, t.f, n);
    else k_mse_f64(l.d, p.d, t.d, n), k_mse_grad_f64(dp.d, dl.d, p.d, t.d, n);
    get(dt, &l), get(dt, &dp);
    CTX("k_mse random n=1000");
    check(dt, l.d, &wl, 1, tol(dt));
    CTX("k_mse_grad random n=1000");
    check(dt, dp.d, want.d, n, tol(dt));
    buf_free(&p), buf_free(&t), buf_free(&l), buf_free(&dl), buf_free(&dp), buf_free(&want);
}

/* Runs forward and grad (dloss = dl) on x[rows][classes]; returns the
 * forward's return value, loss in *loss, grad in dx (rows*classes). */
static int64_t ce_run(int dt, const double *xv, const int64_t *labels, int64_t rows,
                      int64_t classes, double dl, double *loss, double *dx)
{
    Buf x = buf_new(rows * classes), l = buf_new(1), d = buf_new(1), g = buf_new(rows * classes);
    int64_t r;
    set(&x, xv), d.d[0] = dl, l.d[0] = 42;  /* 42: sentinel, stays if unwritten */
    put(dt, &x), put(dt, &d), put(dt, &l);
    if (dt == F32) {
        r = k_cross_entropy_f32(l.f, x.f, labels, rows, classes);
        if (r < 0) k_cross_entropy_grad_f32(g.f, d.f, x.f, labels, rows, classes);
    } else {
        r = k_cross_entropy_f64(l.d, x.d, labels, rows, classes);
        if (r < 0) k_cross_entropy_grad_f64(g.d, d.d, x.d, labels, rows, classes);
    }
    get(dt, &l), get(dt, &g);
    *loss = l.d[0];
    memcpy(dx, g.d, (size_t)(rows * classes) * sizeof(double));
    buf_free(&x), buf_free(&l), buf_free(&d), buf_free(&g);
    return r;
}

static void test_cross_entropy(int dt)
{
    /* x = [[1,2,3],[1,1,1]], labels [2,0].
     * row 0: logsumexp = 3 + log(e^-2 + e^-1 + 1) = 3.4076059644443806,
     *        loss 0.4076059644443806; softmax = [0.09003057317038046,
     *        0.24472847105479764, 0.6652409557748218]
     * row 1: logsumexp = 1 + log 3, loss log 3 = 1.0986122886681098;
     *        softmax = [1/3, 1/3, 1/3]
     * mean = (0.4076059644443806 + 1.0986122886681098) / 2 = 0.7531091265562452
     * grad (dloss 1) = (softmax - onehot) / 2. */
    static const double x[] = {1, 2, 3, 1, 1, 1};
    static const int64_t lab[] = {2, 0};
    const double want_loss = 0.7531091265562452;
    const double want_dx[] = {0.09003057317038046 / 2, 0.24472847105479764 / 2,
                              (0.6652409557748218 - 1) / 2, (1.0 / 3 - 1) / 2,
                              1.0 / 6, 1.0 / 6};
    double loss, dx[9];
    CTX("k_cross_entropy hand 2x3");
    check_int(dt, ce_run(dt, x, lab, 2, 3, 1.0, &loss, dx), -1);
    check(dt, &loss, &want_loss, 1, tol(dt));
    CTX("k_cross_entropy_grad hand 2x3");
    check(dt, dx, want_dx, 6, tol(dt));

    /* stability: [1000,1001,1002] is row 0 shifted by 999, same loss and
     * grad; exp(1000) would overflow both dtypes without the max shift */
    static const double big[] = {1000, 1001, 1002};
    const double want_big = 0.4076059644443806;
    const double want_dbig[] = {0.09003057317038046 * 3, 0.24472847105479764 * 3,
                                (0.6652409557748218 - 1) * 3};
    CTX("k_cross_entropy large logits");
    check_int(dt, ce_run(dt, big, lab, 1, 3, 3.0, &loss, dx), -1);
    check(dt, &loss, &want_big, 1, tol(dt));
    CTX("k_cross_entropy_grad large logits (dloss 3)");
    check(dt, dx, want_dbig, 3, tol(dt));

    /* invalid labels: the first bad row comes back, the loss is unwritten */
    static const int64_t bad1[] = {0, 3}, bad0[] = {-1, 5}, bad2[] = {0, 1, -100};
    static const double x3[9] = {0};
    const double sentinel = 42;
    CTX("k_cross_entropy label == classes");
    check_int(dt, ce_run(dt, x, bad1, 2, 3, 1, &loss, dx), 1);
    check(dt, &loss, &sentinel, 1, 0);
    CTX("k_cross_entropy label -1");
    check_int(dt, ce_run(dt, x, bad0, 2, 3, 1, &loss, dx), 0);
    check(dt, &loss, &sentinel, 1, 0);
    CTX("k_cross_entropy label -100 (no ignore_index)");
    check_int(dt, ce_run(dt, x3, bad2, 3, 3, 1, &loss, dx), 2);
    check(dt, &loss, &sentinel, 1, 0);

    /* random 7x11 against log(sum(exp)) without the shift */
    enum { R = 7, C = 11 };
    double xr[R * C], want_g[R * C], dxr[R * C], s = 0, dl = 0.75;
    int64_t labr[R];
    for (int i = 0; i < R * C; i++) xr[i] = rnd(-4, 4);
    for (int r = 0; r < R; r++) {
        double z = 0;
        labr[r] = (r * 5) % C;
        for (int j = 0; j < C; j++) z += exp(xr[r * C + j]);
        s += log(z) - xr[r * C + labr[r]];
        for (int j = 0; j < C; j++)
            want_g[r * C + j] = dl * (exp(xr[r * C + j]) / z - (j == labr[r])) / R;
    }
    s /= R;
    CTX("k_cross_entropy random 7x11");
    check_int(dt, ce_run(dt, xr, labr, R, C, dl, &loss, dxr), -1);
    check(dt, &loss, &s, 1, tol(dt));
    CTX("k_cross_entropy_grad random 7x11");
    check(dt, dxr, want_g, R * C, tol(dt));
}

/* ---- k_nll_loss, k_nll_loss_grad ---------------------------------------- */

typedef struct {
    int64_t n, c, d;
    int red, has_ii;
    int64_t ii;
    const int64_t *lab;
    const double *wt;  /* NULL: no class weights */
} NllCtx;

/* the definition, position by position (ONNX NegativeLogLikelihoodLoss) */
static void ref_nll(const NllCtx *q, const double *lp, double *y)
{
    double s = 0, ws = 0;
    for (int64_t k = 0; k < q->n; k++)
        for (int64_t j = 0; j < q->d; j++) {
            int64_t i = k * q->d + j, l = q->lab[i];
            if (q->has_ii && l == q->ii) {
                if (q->red == K_LOSS_NONE) y[i] = 0;
                continue;
            }
            double w = q->wt ? q->wt[l] : 1, v = -w * lp[(k * q->c + l) * q->d + j];
            if (q->red == K_LOSS_NONE) y[i] = v;
            s += v, ws += w;
        }
    if (q->red != K_LOSS_NONE)
        y[0] = q->red == K_LOSS_SUM ? s : s / ws;
}

static void nll_fwd(void *ctx, double *const *in, double *y)
{
    const NllCtx *q = ctx;
    k_nll_loss_f64(y, in[0], q->lab, q->wt, q->n, q->c, q->d, q->red, q->has_ii, q->ii);
}

/* forward against ref_nll, backward against finite differences (the loss is
 * linear in lp, so they are exact), with and without dx_in, in place, and
 * with no dloss */
static void nll_case(int dt, NllCtx q)
{
    const int64_t m = q.n * q.d, t = m * q.c, ny = q.red == K_LOSS_NONE ? m : 1;
    Buf lp = buf_new(t), y = buf_new(ny), want = buf_new(ny), wt = buf_new(q.c);
    Buf dl = buf_new(ny), dx = buf_new(t), extra = buf_new(t), sum = buf_new(t);
    fill_rnd(&lp, -5, 0), fill_rnd(&wt, 0.5, 2), fill_rnd(&dl, -1, 1), fill_rnd(&extra, -1, 1);
    const double *wv = q.wt ? wt.d : NULL;
    q.wt = wv;
    ref_nll(&q, lp.d, want.d);
    PUT(&lp, &wt, &dl, &extra);
    void *wp = q.wt ? V(wt) : NULL;
    CTX("k_nll_loss n=%lld c=%lld d=%lld red %d weights %d ignore %d", (long long)q.n,
        (long long)q.c, (long long)q.d, q.red, q.wt != NULL, q.has_ii);
    check_int(dt, KCALL(k_nll_loss, V(y), V(lp), q.lab, wp, q.n, q.c, q.d, q.red, q.has_ii, q.ii),
              -1);
    GET(&y);
    check(dt, y.d, want.d, ny, tol(dt));

    KCALL(k_nll_loss_grad, V(dx), NULL, V(dl), q.lab, wp, q.n, q.c, q.d, q.red, q.has_ii, q.ii);
    GET(&dx);
    double *in[1] = {lp.d};
    CTX("k_nll_loss_grad red %d weights %d ignore %d vs finite differences", q.red,
        q.wt != NULL, q.has_ii);
    check_fd(dt, nll_fwd, &q, in, 0, t, dl.d, ny, dx.d);
    for (int64_t i = 0; i < t; i++) sum.d[i] = (double)(dt == F32 ? (float)(extra.d[i] + dx.d[i])
                                                                  : extra.d[i] + dx.d[i]);
    CTX("k_nll_loss_grad red %d onto dx_in, in place", q.red);
    KCALL(k_nll_loss_grad, V(extra), V(extra), V(dl), q.lab, wp, q.n, q.c, q.d, q.red, q.has_ii,
          q.ii);
    GET(&extra);
    check(dt, extra.d, sum.d, t, tol(dt));
    CTX("k_nll_loss_grad without dloss copies dx_in");
    KCALL(k_nll_loss_grad, V(dx), V(extra), NULL, q.lab, wp, q.n, q.c, q.d, q.red, q.has_ii,
          q.ii);
    GET(&dx);
    check(dt, dx.d, extra.d, t, 0);
    buf_free(&lp), buf_free(&y), buf_free(&want), buf_free(&wt);
    buf_free(&dl), buf_free(&dx), buf_free(&extra), buf_free(&sum);
}

static void test_nll(int dt)
{
    static const int64_t lab_a[] = {3, 0, 1, 3, 2};                  /* n 5, c 4, d 1 */
    static const int64_t lab_b[] = {2, 4, -100, 0, 1, 2, -100, 3};  /* n 2, c 5, d 4 */
    static const int64_t lab_c[] = {2, 4, 2, 0, 1, 2, 3, 3};        /* n 4, c 5, d 2 */
    static const double on = 1;                                      /* any non-NULL */
    for (int red = K_LOSS_NONE; red <= K_LOSS_MEAN; red++) {
        nll_case(dt, (NllCtx){5, 4, 1, red, 0, 0, lab_a, NULL});
        nll_case(dt, (NllCtx){5, 4, 1, red, 0, 0, lab_a, &on});
        nll_case(dt, (NllCtx){2, 5, 4, red, 1, -100, lab_b, &on});
        nll_case(dt, (NllCtx){2, 5, 4, red, 1, -100, lab_b, NULL});
        nll_case(dt, (NllCtx){4, 5, 2, red, 1, 2, lab_c, &on});  /* ignores a real class */
    }
    /* hand example: lp = log [[0.5, 0.25, 0.25], [0.1, 0.6, 0.3]], labels [0, 1],
     * weights [2, 1, 1]: mean = (2 log 2 + log(1/0.6)) / 3 = 0.6323733282952938 */
    static const double lpv[] = {-0.6931471805599453, -1.3862943611198906, -1.3862943611198906,
                                 -2.3025850929940455, -0.5108256237659907, -1.2039728043259361};
    static const double wtv[] = {2, 1, 1};
    static const int64_t lab_h[] = {0, 1};
    const double want_h = 0.6323733282952938;
    Buf lp = buf_new(6), wt = buf_new(3), y = buf_new(2);
    set(&lp, lpv), set(&wt, wtv);
    PUT(&lp, &wt);
    CTX("k_nll_loss hand example, weighted mean");
    check_int(dt, KCALL(k_nll_loss, V(y), V(lp), lab_h, V(wt), 2, 3, 1, K_LOSS_MEAN, 0, 0), -1);
    GET(&y);
    check(dt, y.d, &want_h, 1, tol(dt));

    /* the first bad label that is not ignored comes back; loss unwritten */
    static const int64_t bad[] = {0, -100, 7, -1};
    const double sentinel = 42;
    y.d[0] = sentinel;
    PUT(&y);
    CTX("k_nll_loss bad label after an ignored one");
    check_int(dt, KCALL(k_nll_loss, V(y), V(lp), bad, NULL, 2, 3, 2, K_LOSS_SUM, 1, -100), 2);
    GET(&y);
    check(dt, y.d, &sentinel, 1, 0);
    CTX("k_nll_loss bad label -1 without ignore_index");
    check_int(dt, KCALL(k_nll_loss, V(y), V(lp), bad, NULL, 2, 3, 2, K_LOSS_SUM, 0, 0), 1);
    /* every position ignored: mean is 0 / 0 */
    static const int64_t all_ii[] = {1, 1};
    const double nan_ = NAN;
    CTX("k_nll_loss all ignored, mean");
    check_int(dt, KCALL(k_nll_loss, V(y), V(lp), all_ii, NULL, 2, 3, 1, K_LOSS_MEAN, 1, 1), -1);
    GET(&y);
    check(dt, y.d, &nan_, 1, 0);
    buf_free(&lp), buf_free(&wt), buf_free(&y);
}

/* ---- optimizers --------------------------------------------------------- */

static void adamw_run(int dt, Buf *p, Buf *g, Buf *m, Buf *v, double lr, double b1,
                      double b2, double eps, double wd, int l2, int64_t step)
{
    put(dt, g);
    if (dt == F32) k_adamw_f32(p->f, g->f, m->f, v->f, p->n, lr, b1, b2, eps, wd, l2, 1.0, step, NULL, 0, 0, 0, 1);
    else k_adamw_f64(p->d, g->d, m->d, v->d, p->n, lr, b1, b2, eps, wd, l2, 1.0, step, NULL, 0, 0, 0, 1);
    get(dt, p), get(dt, m), get(dt, v);
}

static void test_adamw(int dt)
{
    /* lr 0.1, betas (0.9, 0.999), eps 1e-8, wd 0.01; p = [1, -2], m = v = 0.
     * step 1, g = [0.5, -0.25]:
     *   p *= 1 - 0.1*0.01          -> [0.999, -1.998]
     *   m = 0.1 g                   -> [0.05, -0.025]
     *   v = 0.001 g^2               -> [0.00025, 0.0000625]
     *   bc1 = 0.1, bc2 = 0.001, step_size = 0.1/0.1 = 1
     *   denom = sqrt(v)/sqrt(0.001) + 1e-8 = |g| + 1e-8 -> [0.50000001, 0.25000001]
     *   p -= m/denom -> [0.999 - 0.0999999980, -1.998 + 0.0999999960]
     *                 = [0.899000002, -1.898000004]
     * step 2, g = [0.1, 0.3]:
     *   p *= 0.999                  -> [0.8981010019980, -1.896102003996]
     *   m = 0.9 m + 0.1 g           -> [0.055, 0.0075]
     *   v = 0.999 v + 0.001 g^2     -> [0.00025975, 0.0001524375]
     *   bc1 = 0.19, bc2 = 0.001999, step_size = 0.526315789473684,
     *   sqrt(bc2) = 0.044710177812216
     *   denom = [0.360471881281234, 0.276146490041337]
     *   p -= step_size m/denom -> [0.8177969063826517, -1.9103964765437471]
     * (torch.optim.AdamW in float64 gives the same to 1e-16.) */
    static const double p0[] = {1, -2}, g1[] = {0.5, -0.25}, g2[] = {0.1, 0.3};
    static const double want1[] = {0.899000002, -1.898000004};
    static const double want_m1[] = {0.05, -0.025}, want_v1[] = {0.00025, 0.0000625};
    static const double want2[] = {0.8177969063826517, -1.9103964765437471};
    Buf p = buf_new(2), g = buf_new(2), m = buf_new(2), v = buf_new(2);
    set(&p, p0);
    put(dt, &p), put(dt, &m), put(dt, &v);
    set(&g, g1);
    adamw_run(dt, &p, &g, &m, &v, 0.1, 0.9, 0.999, 1e-8, 0.01, 0, 1);
    CTX("k_adamw hand step 1 (p)");
    check(dt, p.d, want1, 2, tol(dt));
    CTX("k_adamw hand step 1 (m, v)");
    check(dt, m.d, want_m1, 2, tol(dt));
    check(dt, v.d, want_v1, 2, tol(dt));
    set(&g, g2);
    adamw_run(dt, &p, &g, &m, &v, 0.1, 0.9, 0.999, 1e-8, 0.01, 0, 2);
    CTX("k_adamw hand step 2");
    check(dt, p.d, want2, 2, tol(dt));
    buf_free(&p), buf_free(&g), buf_free(&m), buf_free(&v);

    /* three random steps against the formulas in double: AdamW (decoupled decay), then Adam (l2: the decay
     * added to the gradient, torch.optim.Adam) */
    const int64_t n = 100;
    const double lr = 1e-3, b1 = 0.8, b2 = 0.99, eps = 1e-6, wd = 0.1;
    for (int l2 = 0; l2 < 2; l2++) {
        Buf rp = buf_new(n), rg = buf_new(n), rm = buf_new(n), rv = buf_new(n);
        double wp[100], wm[100] = {0}, wv[100] = {0};
        fill_rnd(&rp, -1, 1);
        memcpy(wp, rp.d, sizeof wp);
        put(dt, &rp), put(dt, &rm), put(dt, &rv);
        for (int64_t step = 1; step <= 3; step++) {
            fill_rnd(&rg, -1, 1);
            for (int64_t i = 0; i < n; i++) {
                double bc1 = 1 - pow(b1, (double)step), bc2 = 1 - pow(b2, (double)step);
                double gi = l2 ? rg.d[i] + wd * wp[i] : rg.d[i];
                if (!l2)
                    wp[i] *= 1 - lr * wd;
                wm[i] = b1 * wm[i] + (1 - b1) * gi;
                wv[i] = b2 * wv[i] + (1 - b2) * gi * gi;
                wp[i] -= lr / bc1 * wm[i] / (sqrt(wv[i]) / sqrt(bc2) + eps);
            }
            adamw_run(dt, &rp, &rg, &rm, &rv, lr, b1, b2, eps, wd, l2, step);
            CTX("k_adamw%s random step %lld", l2 ? " (adam: l2)" : "", (long long)step);
            check(dt, rp.d, wp, n, tol(dt));
            check(dt, rm.d, wm, n, tol(dt));
            check(dt, rv.d, wv, n, tol(dt));
        }
        buf_free(&rp), buf_free(&rg), buf_free(&rm), buf_free(&rv);
    }
}

static void sgd_run(int dt, Buf *p, const double *gv, Buf *buf, double lr,
                    double mom, double wd, int nesterov, int64_t step)
{
    Buf g = buf_new(p->n);
    set(&g, gv);
    put(dt, &g);
    if (dt == F32) k_sgd_f32(p->f, g.f, buf ? buf->f : NULL, p->n, lr, mom, wd, nesterov, 1.0, step, NULL, 0, 0, 0, 1);
    else k_sgd_f64(p->d, g.d, buf ? buf->d : NULL, p->n, lr, mom, wd, nesterov, 1.0, step, NULL, 0, 0, 0, 1);
    get(dt, p);
    if (buf) get(dt, buf);
    buf_free(&g);
}

static void test_sgd(int dt)
{
    /* lr 0.1, momentum 0.9, wd 0.01; p = [1, -2].
     * step 1, g = [0.5, -0.25]:
     *   g' = g + 0.01 p = [0.51, -0.27];  buf = g' (first step)
     *   p -= 0.1 buf    -> [0.949, -1.973]
     * step 2, g = [0.2, 0.1]:
     *   g' = g + 0.01 p = [0.20949, 0.08027]
     *   buf = 0.9 buf + g' = [0.459 + 0.20949, -0.243 + 0.08027] = [0.66849, -0.16273]
     *   p -= 0.1 buf    -> [0.882151, -1.956727] */
    static const double p0[] = {1, -2}, g1[] = {0.5, -0.25}, g2[] = {0.2, 0.1};
    static const double want1[] = {0.949, -1.973}, wbuf1[] = {0.51, -0.27};
    static const double want2[] = {0.882151, -1.956727}, wbuf2[] = {0.66849, -0.16273};
    Buf p = buf_new(2), buf = buf_new(2);
    set(&p, p0);
    fill_val(&buf, NAN);  /* step 1 writes buf without reading it */
    put(dt, &p), put(dt, &buf);
    sgd_run(dt, &p, g1, &buf, 0.1, 0.9, 0.01, 0, 1);
    CTX("k_sgd momentum step 1");
    check(dt, p.d, want1, 2, tol(dt));
    check(dt, buf.d, wbuf1, 2, tol(dt));
    sgd_run(dt, &p, g2, &buf, 0.1, 0.9, 0.01, 0, 2);
    CTX("k_sgd momentum step 2");
    check(dt, p.d, want2, 2, tol(dt));
    check(dt, buf.d, wbuf2, 2, tol(dt));

    /* momentum 0, no buffer: p -= lr (g + wd p), every step alike */
    static const double want_plain[] = {0.949, -1.973}, want_nowd[] = {0.95, -1.975};
    set(&p, p0), put(dt, &p);
    sgd_run(dt, &p, g1, NULL, 0.1, 0, 0.01, 0, 5);
    CTX("k_sgd momentum 0");
    check(dt, p.d, want_plain, 2, tol(dt));
    set(&p, p0), put(dt, &p);
    sgd_run(dt, &p, g1, NULL, 0.1, 0, 0, 0, 1);
    CTX("k_sgd momentum 0, wd 0");
    check(dt, p.d, want_nowd, 2, tol(dt));

    /* nesterov (torch.optim.SGD nesterov=True): d = g' + momentum buf after buf's update.
     * step 1: g' = [0.51, -0.27], buf = g', d = g' + 0.9 buf = [0.969, -0.513]
     *         p = [1 - 0.0969, -2 + 0.0513] = [0.9031, -1.9487]
     * step 2: g' = [0.2, 0.1] + 0.01 p = [0.209031, 0.080513]
     *         buf = 0.9 [0.51, -0.27] + g' = [0.668031, -0.162487]
     *         d = g' + 0.9 buf = [0.8102589, -0.0657253]
     *         p = [0.9031 - 0.08102589, -1.9487 + 0.00657253] = [0.82207411, -1.94212747] */
    static const double wn1[] = {0.9031, -1.9487}, wn2[] = {0.82207411, -1.94212747};
    static const double wnbuf2[] = {0.668031, -0.162487};
    set(&p, p0);
    fill_val(&buf, NAN);
    put(dt, &p), put(dt, &buf);
    sgd_run(dt, &p, g1, &buf, 0.1, 0.9, 0.01, 1, 1);
    CTX("k_sgd nesterov step 1");
    check(dt, p.d, wn1, 2, tol(dt));
    check(dt, buf.d, wbuf1, 2, tol(dt));
    sgd_run(dt, &p, g2, &buf, 0.1, 0.9, 0.01, 1, 2);
    CTX("k_sgd nesterov step 2");
    check(dt, p.d, wn2, 2, tol(dt));
    check(dt, buf.d, wnbuf2, 2, tol(dt));
    buf_free(&p), buf_free(&buf);
}

/* ---- loss scaling (--precision fp16): seed, unscaled norm, skipped updates -- */

static void test_loss_scale(int dt)
{
    if (dt != F32)
        return;
    float y[5] = {0};
    k_loss_seed_f32(y, 5, 65536, 4);
    float want_seed[5] = {16384, 16384, 16384, 16384, 16384};
    CTX("k_loss_seed_f32 S 65536 accum 4");
    check_int(dt, memcmp(y, want_seed, sizeof y) == 0, 1);
    float sq[1] = {3.0f * 65536.0f * 65536.0f};
    k_unscale_sq_f32(sq, 65536);
    CTX("k_unscale_sq_f32: S^2 3 -> 3");
    check_int(dt, sq[0] == 3.0f, 1);
#ifdef _OPENMP
    /* on every thread of a team of 3 that shares (the step's optimizer run, codegen/team.c): divided once */
    sq[0] = 3.0f * 65536.0f * 65536.0f;
#pragma omp parallel num_threads(3)
    {
        k_share(1);
        k_unscale_sq_f32(sq, 65536);
        k_share(0);
    }
    CTX("k_unscale_sq_f32 in a team of 3 that shares: S^2 3 -> 3 (its first thread alone writes)");
    check_int(dt, sq[0] == 3.0f, 1);
#endif
    sq[0] = INFINITY;
    k_unscale_sq_f32(sq, 1024);
    CTX("k_unscale_sq_f32: inf stays inf (an overflow)");
    check_int(dt, isinf(sq[0]) != 0, 1);
    /* an update with scale S on S*g (clipped or not) = the plain update of g (clipped), bit for bit; a
     * non-finite norm leaves p, m, v as they were */
    const int64_t n = 9;
    const double S = 1024;
    for (int opt = 0; opt < 2; opt++)
        for (int clip_on = 0; clip_on < 2; clip_on++) {
            float p1[9], p2[9], m1[9], m2[9], v1[9], v2[9], g[9], gS[9], gsq[1] = {0};
            for (int64_t i = 0; i < n; i++) {
                p1[i] = p2[i] = (float)(0.1 * (double)i - 0.4);
                m1[i] = m2[i] = (float)(0.01 * (double)i);
                v1[i] = v2[i] = (float)(0.001 * (double)i);
                g[i] = (float)(0.3 - 0.07 * (double)i);
                gS[i] = g[i] * (float)S;
                gsq[0] += g[i] * g[i];
            }
            double clip = clip_on ? 0.2 : 0;
            if (opt == 0) {
                k_adamw_f32(p1, gS, m1, v1, n, 1e-2, 0.9, 0.99, 1e-8, 0.1, 0, 1.0, 2, gsq, clip, S, 0, 1);
                k_adamw_f32(p2, g, m2, v2, n, 1e-2, 0.9, 0.99, 1e-8, 0.1, 0, 1.0, 2, gsq, clip, 0.0, 0, 1);
            } else {
                k_sgd_f32(p1, gS, m1, n, 1e-2, 0.9, 0.1, 0, 1.0, 2, gsq, clip, S, 0, 1);
                k_sgd_f32(p2, g, m2, n, 1e-2, 0.9, 0.1, 0, 1.0, 2, gsq, clip, 0.0, 0, 1);
            }
            CTX("%s with loss scale %g on the scaled gradient (clip %g) = the unscaled update",
                opt ? "k_sgd" : "k_adamw", S, clip);
            check_int(dt, !memcmp(p1, p2, sizeof p1) && !memcmp(m1, m2, sizeof m1) && !memcmp(v1, v2, sizeof v1), 1);
            CTX("%s moved p", opt ? "k_sgd" : "k_adamw");
            check_int(dt, p1[0] != (float)(-0.4), 1);
            for (int bad = 0; bad < 2; bad++) {
                memcpy(p2, p1, sizeof p1), memcpy(m2, m1, sizeof m1), memcpy(v2, v1, sizeof v1);
                gsq[0] = bad ? NAN : INFINITY;
                gS[0] = bad ? NAN : INFINITY;
                if (opt == 0)
                    k_adamw_f32(p1, gS, m1, v1, n, 1e-2, 0.9, 0.99, 1e-8, 0.1, 0, 1.0, 3, gsq, clip, S, 0, 1);
                else
                    k_sgd_f32(p1, gS, m1, n, 1e-2, 0.9, 0.1, 0, 1.0, 3, gsq, clip, S, 0, 1);
                CTX("%s skips a step whose norm is %s: nothing written", opt ? "k_sgd" : "k_adamw",
                    bad ? "NaN" : "inf");
                check_int(dt, !memcmp(p1, p2, sizeof p1) && !memcmp(m1, m2, sizeof m1) && !memcmp(v1, v2, sizeof v1),
                          1);
            }
        }
}

/* ---- clipping: k_sum_squares, k_clip_coef, the updates' clip ------------- */

static void test_clip(int dt)
{
    /* sum of squares, accumulated over calls: 3^2 + 4^2 = 25, + 12^2 = 169 */
    Buf x = buf_new(2), x2 = buf_new(1), y = buf_new(1);
    static const double xv[] = {3, 4}, x2v[] = {12}, w25[] = {25}, w169[] = {169};
    set(&x, xv), set(&x2, x2v), fill_val(&y, NAN);
    put(dt, &x), put(dt, &x2), put(dt, &y);
    KCALL(k_sum_squares, V(y), V(x), 2, 0);
    get(dt, &y);
    CTX("k_sum_squares");
    check(dt, y.d, w25, 1, 0);
    KCALL(k_sum_squares, V(y), V(x2), 1, 1);
    get(dt, &y);
    CTX("k_sum_squares accumulate");
    check(dt, y.d, w169, 1, 0);
    KCALL(k_sum_squares, V(y), V(x2), 0, 0);
    get(dt, &y);
    CTX("k_sum_squares n = 0");
    check(dt, y.d, (const double[]){0}, 1, 0);
    /* clip_grad_norm_'s factor: max / (norm + 1e-6), at most 1, NaN stays */
    CTX("k_clip_coef");
    double cc[4] = {k_clip_coef(25, 1), k_clip_coef(25, 10), k_clip_coef(25, 0), k_clip_coef(NAN, 1)};
    const double wcc[3] = {1 / (5 + 1e-6), 1, 1};
    check(dt, cc, wcc, 3, 0);
    check_int(dt, isnan(cc[3]) != 0, 1);
    /* an update with clip equals the plain update of g * (T)coef, bit for bit; a
     * clip above the norm changes nothing */
    const int64_t n = 7;
    for (int opt = 0; opt < 2; opt++)
        for (int active = 0; active < 2; active++) {
            Buf p1 = buf_new(n), p2 = buf_new(n), g = buf_new(n), gs = buf_new(n), gsq = buf_new(1);
            Buf m1 = buf_new(n), m2 = buf_new(n), v1 = buf_new(n), v2 = buf_new(n);
            fill_rnd(&p1, -1, 1), fill_rnd(&g, -2, 2), fill_rnd(&m1, -1, 1), fill_rnd(&v1, 0, 1);
            put(dt, &g);
            get(dt, &g); /* the values as the dtype holds them */
            double s = 0;
            for (int64_t i = 0; i < n; i++)
                s += g.d[i] * g.d[i];
            gsq.d[0] = s;
            put(dt, &gsq);
            get(dt, &gsq);
            double clip = active ? 0.5 : 1e6, coef = k_clip_coef(gsq.d[0], clip);
            for (int64_t i = 0; i < n; i++)
                gs.d[i] = dt == F32 ? (double)(g.f[i] * (float)coef) : g.d[i] * coef;
            memcpy(p2.d, p1.d, (size_t)n * 8), memcpy(m2.d, m1.d, (size_t)n * 8), memcpy(v2.d, v1.d, (size_t)n * 8);
            put(dt, &p1), put(dt, &p2), put(dt, &m1), put(dt, &m2), put(dt, &v1), put(dt, &v2), put(dt, &gs);
            if (opt == 0) {
                KCALL(k_adamw, V(p1), V(g), V(m1), V(v1), n, 1e-2, 0.9, 0.99, 1e-8, 0.1, 0, 1.0, 3, V(gsq), clip, 0.0, 0, 1);
                KCALL(k_adamw, V(p2), V(gs), V(m2), V(v2), n, 1e-2, 0.9, 0.99, 1e-8, 0.1, 0, 1.0, 3, V(gsq), 0.0, 0.0, 0, 1);
            } else {
                KCALL(k_sgd, V(p1), V(g), V(m1), n, 1e-2, 0.9, 0.1, 0, 1.0, 3, V(gsq), clip, 0.0, 0, 1);
                KCALL(k_sgd, V(p2), V(gs), V(m2), n, 1e-2, 0.9, 0.1, 0, 1.0, 3, V(gsq), 0.0, 0.0, 0, 1);
            }
            get(dt, &p1), get(dt, &p2), get(dt, &m1), get(dt, &m2);
            CTX("%s with clip %g (coefficient %.9g) = the update of the scaled gradient", opt ? "k_sgd" : "k_adamw",
                clip, coef);
            check(dt, p1.d, p2.d, n, 0);
            check(dt, m1.d, m2.d, n, 0);
            check_int(dt, active ? coef < 1 : coef == 1, 1);
            buf_free(&p1), buf_free(&p2), buf_free(&g), buf_free(&gs), buf_free(&gsq);
            buf_free(&m1), buf_free(&m2), buf_free(&v1), buf_free(&v2);
        }
    buf_free(&x), buf_free(&x2), buf_free(&y);
}

/* k_cross_entropy_bf16 / _f16 (16-bit logits, float32 loss): on logits x16, the loss is k_cross_entropy_f32's on
 * x16 widened, bit for bit, and the gradient that one's rounded to 16 bits (both take e = exp(x - max) rounded
 * to float32 and sum in double), also with dx aliasing x; a bad label comes back as in float32 */
static void test_cross_entropy_16(int dt)
{
    if (dt != F32)
        return;
    /* rows of 257 classes (the 16-bit gradient keeps e on the stack) and of 5000 (above ce_impl.h's
     * CE_ROW_KEEP: e computed again) */
    enum { R = 33, CMAX = 5000 };
    static uint16_t x16[R * CMAX], dx16[R * CMAX];
    static float xf[R * CMAX], dxf[R * CMAX];
    int64_t lab[R];
    for (int c = 0; c < 4; c++) {
        const int f16 = c & 1, C = c < 2 ? 257 : CMAX;
        for (int i = 0; i < R * C; i++) {
            float v = (float)rnd(-6, 6) + (i == 5 ? 90.0f : 0.0f); /* one large logit: the max shift */
            x16[i] = f16 ? k_f16_from_f32(v) : k_bf16_from_f32(v);
            xf[i] = f16 ? k_f16_to_f32(x16[i]) : k_bf16_to_f32(x16[i]);
        }
        for (int r = 0; r < R; r++)
            lab[r] = (r * 7) % C;
        float l16 = 42, lf = 42, dl = 0.75f;
        CTX(f16 ? "k_cross_entropy_f16 = f32 on the widened logits" : "k_cross_entropy_bf16 = f32 on the widened logits");
        check_int(dt, (f16 ? k_cross_entropy_f16 : k_cross_entropy_bf16)(&l16, x16, lab, R, C), -1);
        check_int(dt, k_cross_entropy_f32(&lf, xf, lab, R, C), -1);
        check_int(dt, memcmp(&l16, &lf, sizeof lf), 0);
        (f16 ? k_cross_entropy_grad_f16 : k_cross_entropy_grad_bf16)(dx16, &dl, x16, lab, R, C);
        k_cross_entropy_grad_f32(dxf, &dl, xf, lab, R, C);
        int64_t differ = 0;
        for (int i = 0; i < R * C; i++)
            differ += dx16[i] != (f16 ? k_f16_from_f32(dxf[i]) : k_bf16_from_f32(dxf[i]));
        CTX(f16 ? "k_cross_entropy_grad_f16 = f32's rounded" : "k_cross_entropy_grad_bf16 = f32's rounded");
        check_int(dt, differ, 0);
        (f16 ? k_cross_entropy_grad_f16 : k_cross_entropy_grad_bf16)(x16, &dl, x16, lab, R, C);
        CTX(f16 ? "k_cross_entropy_grad_f16 in place" : "k_cross_entropy_grad_bf16 in place");
        check_int(dt, memcmp(x16, dx16, sizeof(uint16_t) * R * C), 0);
        lab[R - 1] = C;
        CTX("k_cross_entropy 16-bit: a bad label");
        check_int(dt, (f16 ? k_cross_entropy_f16 : k_cross_entropy_bf16)(&l16, dx16, lab, R, C), R - 1);
    }
}

int main(void)
{
    static void (*const tests[])(int) = {
        test_mse, test_cross_entropy, test_nll, test_adamw, test_sgd, test_clip, test_loss_scale,
        test_cross_entropy_16,
    };
    return ktest_main("kernels_train_test", tests, sizeof tests / sizeof tests[0]);
}
