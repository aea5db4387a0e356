/* kernels_nn_test.c — checks the layer kernels of kernels/c (Softmax of
 * reduce.c, norm.c, conv.c, gather.c, random.c), f32 and f64: Softmax and
 * LogSoftmax, LayerNormalization, BatchNormalization (training, backward,
 * inference, the ONNX running variance), Conv2d (strides, pads, dilations,
 * groups, depthwise, the direct 1x1 path; oneDNN's primitives in both
 * layouts against the float64 im2col kernels), MaxPool / AveragePool /
 * GlobalAveragePool, Gather and its scatter-add backward, Dropout and its
 * Philox generator (fused attention: kernels_attn_test.c).
 *
 * Forwards are compared with naive loops written here (one output element
 * at a time, straight from the definitions); backwards with float64 central
 * finite differences of the kernel's float64 forward (ktest.h).
 */
#include "ktest.h"

/* ---- k_softmax, k_softmax_grad ------------------------------------------ */

static void ref_softmax(int lg, double *y, const double *x, int64_t outer, int64_t axis,
                        int64_t inner)
{
    for (int64_t o = 0; o < outer; o++)
        for (int64_t c = 0; c < inner; c++) {
            const double *xc = x + o * axis * inner + c;
            double mx = -INFINITY, s = 0;
            for (int64_t a = 0; a < axis; a++) mx = fmax(mx, xc[a * inner]);
            for (int64_t a = 0; a < axis; a++) s += exp(xc[a * inner] - mx);
            for (int64_t a = 0; a < axis; a++)
                y[o * axis * inner + c + a * inner] =
                    lg ? xc[a * inner] - mx - log(s) : exp(xc[a * inner] - mx) / s;
        }
}

typedef struct {
    int lg;
    int64_t outer, axis, inner;
} SmCtx;

static void softmax_fwd(void *ctx, double *const *in, double *y)
{
    const SmCtx *c = ctx;
    k_softmax_f64(c->lg, y, in[0], c->outer, c->axis, c->inner);
}

static void test_softmax(int dt)
{
    /* rows of 513 and 1500: K_SM_BLOCK blocks, a block's max above the earlier ones' (x[0] + 1000 is in the
     * first: see the ramp below) */
    static const int64_t shapes[][3] = {{3, 7, 1}, {2, 5, 3}, {2, 4, 300}, {1, 1, 1}, {1, 1, 5}, {1, 513, 1},
                                        {2, 1500, 1}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
        for (int lg = 0; lg < 2; lg++) {
            SmCtx c = {lg, shapes[k][0], shapes[k][1], shapes[k][2]};
            int64_t n = c.outer * c.axis * c.inner;
            Buf x = buf_new(n), y = buf_new(n), want = buf_new(n), w = buf_new(n), dx = buf_new(n);
            fill_rnd(&x, -4, 4), fill_rnd(&w, -1, 1);
            if (c.axis > 512) /* a ramp: each block's max above the last, the running sum rescaled */
                for (int64_t i = 0; i < n; i++)
                    x.d[i] += 0.01 * (double)(i % c.axis);
            x.d[0] += 1000;  /* needs the max shift */
            ref_softmax(lg, want.d, x.d, c.outer, c.axis, c.inner);
            PUT(&x, &w);
            CTX("k_softmax log %d %lldx%lldx%lld", lg, (long long)c.outer, (long long)c.axis,
                (long long)c.inner);
            KCALL(k_softmax, lg, V(y), V(x), c.outer, c.axis, c.inner);
            GET(&y);
            check(dt, y.d, want.d, n, tol(dt));
            x.d[0] -= 1000;  /* FD around moderate values */
            PUT(&x, &w);
            KCALL(k_softmax, lg, V(y), V(x), c.outer, c.axis, c.inner);
            KCALL(k_softmax_grad, lg, V(dx), V(w), V(y), c.outer, c.axis, c.inner);
            GET(&dx);
            double *in[1] = {x.d};
            CTX("k_softmax_grad log %d %lldx%lldx%lld vs finite differences", lg,
                (long long)c.outer, (long long)c.axis, (long long)c.inner);
            check_fd(dt, softmax_fwd, &c, in, 0, n, w.d, n, dx.d);
            CTX("k_softmax_grad log %d dx aliasing dy", lg);
            KCALL(k_softmax_grad, lg, V(w), V(w), V(y), c.outer, c.axis, c.inner);
            GET(&w);
            check(dt, w.d, dx.d, n, 0);
            CTX("k_softmax log %d in place", lg);
            ref_softmax(lg, want.d, x.d, c.outer, c.axis, c.inner);
            KCALL(k_softmax, lg, V(x), V(x), c.outer, c.axis, c.inner);
            GET(&x);
            check(dt, x.d, want.d, n, tol(dt));
            buf_free(&x), buf_free(&y), buf_free(&want), buf_free(&w), buf_free(&dx);
        }
    /* a row of 1100 whose first 600 are -inf (a whole block adds nothing); the same with a NaN among them (the
     * row is NaN); a row all -inf (NaN, as exp(-inf - -inf)) */
    {
        const int64_t m = 1100;
        Buf xl = buf_new(3 * m), yl = buf_new(3 * m), wl = buf_new(3 * m);
        fill_rnd(&xl, -4, 4);
        for (int64_t i = 0; i < 600; i++)
            xl.d[i] = xl.d[m + i] = -INFINITY;
        xl.d[m + 300] = NAN;
        for (int64_t i = 0; i < m; i++)
            xl.d[2 * m + i] = -INFINITY;
        for (int lg = 0; lg < 2; lg++) {
            ref_softmax(lg, wl.d, xl.d, 1, m, 1);
            for (int64_t i = m; i < 3 * m; i++)
                wl.d[i] = NAN;
            put(dt, &xl);
            CTX("k_softmax log %d, rows of -inf blocks and NaN", lg);
            KCALL(k_softmax, lg, V(yl), V(xl), 3, m, 1);
            GET(&yl);
            check(dt, yl.d, wl.d, 3 * m, tol(dt));
        }
        buf_free(&xl), buf_free(&yl), buf_free(&wl);
    }
    /* masked attention: -inf logits get exactly 0 (log: -inf) */
    static const double xv[6] = {0.5, -INFINITY, 1, -INFINITY, -INFINITY, 2};
    Buf x = buf_new(6), y = buf_new(6), want = buf_new(6);
    set(&x, xv), put(dt, &x);
    for (int lg = 0; lg < 2; lg++) {
        ref_softmax(lg, want.d, x.d, 2, 3, 1);
        CTX("k_softmax log %d with -inf", lg);
        KCALL(k_softmax, lg, V(y), V(x), 2, 3, 1);
        GET(&y);
        check(dt, y.d, want.d, 6, tol(dt));
    }
    buf_free(&x), buf_free(&y), buf_free(&want);
}

/* ---- LayerNormalization ------------------------------------------------- */

typedef struct {
    int64_t outer, inner;
    int affine;
} LnCtx;

static void ln_fwd(void *ctx, double *const *in, double *y)
{
    const LnCtx *c = ctx;
    k_layernorm_f64(y, NULL, NULL, in[0], c->affine ? in[1] : NULL, c->affine ? in[2] : NULL,
                    c->outer, c->inner, 1e-5);
}

static void layernorm_case(int dt, int64_t outer, int64_t inner, int affine, double offset)
{
    const int64_t n = outer * inner;
    Buf x = buf_new(n), s = buf_new(inner), b = buf_new(inner), y = buf_new(n), want = buf_new(n);
    Buf mu = buf_new(outer), is = buf_new(outer), wmu = buf_new(outer), wis = buf_new(outer);
    Buf w = buf_new(n), dx = buf_new(n), ds = buf_new(inner), db = buf_new(inner), dx2 = buf_new(n);
    fill_rnd(&x, -2, 3), fill_rnd(&s, 0.5, 1.5), fill_rnd(&b, -1, 1), fill_rnd(&w, -1, 1);
    for (int64_t i = 0; i < n; i++) /* rows far from 0: the reference from the values the kernel sees */
        x.d[i] = dt == F32 ? (double)(float)(x.d[i] + offset) : x.d[i] + offset;
    for (int64_t r = 0; r < outer; r++) {
        double m = 0, v = 0;
        for (int64_t i = 0; i < inner; i++) m += x.d[r * inner + i] / inner;
        double corr = 0; /* the mean's rounding, which a far offset makes larger than 1e-12 */
        for (int64_t i = 0; i < inner; i++) corr += (x.d[r * inner + i] - m) / inner;
        m += corr;
        for (int64_t i = 0; i < inner; i++) v += pow(x.d[r * inner + i] - m, 2) / inner;
        wmu.d[r] = m, wis.d[r] = 1 / sqrt(v + 1e-5);
        for (int64_t i = 0; i < inner; i++)
            want.d[r * inner + i] = (x.d[r * inner + i] - m) * wis.d[r] *
                                    (affine ? s.d[i] : 1) + (affine ? b.d[i] : 0);
    }
    PUT(&x, &s, &b, &w);
    CTX("k_layernorm %lldx%lld affine %d offset %g", (long long)outer, (long long)inner, affine, offset);
    KCALL(k_layernorm, V(y), V(mu), V(is), V(x), affine ? V(s) : NULL, affine ? V(b) : NULL,
          outer, inner, 1e-5);
    GET(&y, &mu, &is);
    check(dt, y.d, want.d, n, tol(dt));
    check(dt, mu.d, wmu.d, outer, tol(dt));
    check(dt, is.d, wis.d, outer, tol(dt));
    if (offset != 0) { /* the backward reads the mean rounded to T: checked near 0 only */
        buf_free(&x), buf_free(&s), buf_free(&b), buf_free(&y), buf_free(&want);
        buf_free(&mu), buf_free(&is), buf_free(&wmu), buf_free(&wis);
        buf_free(&w), buf_free(&dx), buf_free(&ds), buf_free(&db), buf_free(&dx2);
        return;
    }

    KCALL(k_layernorm_grad, V(dx), affine ? V(ds) : NULL, affine ? V(db) : NULL, V(w), V(x),
          V(mu), V(is), affine ? V(s) : NULL, outer, inner);
    GET(&dx, &ds, &db);
    LnCtx c = {outer, inner, affine};
    double *in[3] = {x.d, s.d, b.d};
    CTX("k_layernorm_grad dx %lldx%lld affine %d", (long long)outer, (long long)inner, affine);
    check_fd(dt, ln_fwd, &c, in, 0, n, w.d, n, dx.d);
    if (affine) {
        CTX("k_layernorm_grad dscale %lldx%lld", (long long)outer, (long long)inner);
        check_fd(dt, ln_fwd, &c, in, 1, inner, w.d, n, ds.d);
        CTX("k_layernorm_grad dbias %lldx%lld", (long long)outer, (long long)inner);
        check_fd(dt, ln_fwd, &c, in, 2, inner, w.d, n, db.d);
    }
    /* dx may alias dy */
    memcpy(dx2.d, w.d, (size_t)n * sizeof(double));
    put(dt, &dx2);
    CTX("k_layernorm_grad dx aliasing dy");
    KCALL(k_layernorm_grad, V(dx2), affine ? V(ds) : NULL, NULL, V(dx2), V(x), V(mu), V(is),
          affine ? V(s) : NULL, outer, inner);
    get(dt, &dx2);
    check(dt, dx2.d, dx.d, n, 0);
    buf_free(&x), buf_free(&s), buf_free(&b), buf_free(&y), buf_free(&want);
    buf_free(&mu), buf_free(&is), buf_free(&wmu), buf_free(&wis);
    buf_free(&w), buf_free(&dx), buf_free(&ds), buf_free(&db), buf_free(&dx2);
}

/* k_layernorm_bf16 / _f16 (16-bit x and y) = k_layernorm_f32 on x widened, y rounded: bit for bit, y, mean and
 * invstd; and k_layernorm_grad_bf16 / _f16 (16-bit x) = k_layernorm_grad_f32 on x widened: dx, dscale, dbias bit
 * for bit; on 1 thread and a team of 4 */
static void layernorm_16_case(int f16, int64_t outer, int64_t inner, int affine, double offset)
{
    const int64_t n = outer * inner;
    uint16_t *x16 = xalloc((size_t)n, 2), *y16 = xalloc((size_t)n, 2), *yw16 = xalloc((size_t)n, 2);
    float *xw = xalloc((size_t)n, 4), *yw = xalloc((size_t)n, 4), *s = xalloc((size_t)inner, 4);
    float *b = xalloc((size_t)inner, 4), *st = xalloc(4 * (size_t)outer, 4), *dy = xalloc((size_t)n, 4);
    float *g = xalloc((size_t)(n + 2 * inner), 4), *gw = xalloc((size_t)(n + 2 * inner), 4);
    for (int64_t i = 0; i < n; i++) {
        dy[i] = (float)rnd(-1, 1);
        const float v = (float)(rnd(-2, 3) + offset);
        x16[i] = f16 ? k_f16_from_f32(v) : k_bf16_from_f32(v);
        xw[i] = f16 ? k_f16_to_f32(x16[i]) : k_bf16_to_f32(x16[i]);
    }
    for (int64_t i = 0; i < inner; i++)
        s[i] = (float)rnd(0.5, 1.5), b[i] = (float)rnd(-1, 1);
    for (int team = 1; team <= 4; team += 3) {
#ifdef _OPENMP
        const int before = ktest_team(team);
#endif
        (f16 ? k_layernorm_f16 : k_layernorm_bf16)(y16, st, st + outer, x16, affine ? s : NULL, affine ? b : NULL,
                                                   outer, inner, 1e-5);
        k_layernorm_f32(yw, st + 2 * outer, st + 3 * outer, xw, affine ? s : NULL, affine ? b : NULL, outer, inner,
                        1e-5);
        (f16 ? k_layernorm_grad_f16 : k_layernorm_grad_bf16)(g, g + n, g + n + inner, dy, x16, st, st + outer,
                                                             affine ? s : NULL, outer, inner);
        k_layernorm_grad_f32(gw, gw + n, gw + n + inner, dy, xw, st, st + outer, affine ? s : NULL, outer, inner);
#ifdef _OPENMP
        ktest_team(before);
#endif
        for (int64_t i = 0; i < n; i++)
            yw16[i] = f16 ? k_f16_from_f32(yw[i]) : k_bf16_from_f32(yw[i]);
        CTX("k_layernorm_%s %lldx%lld affine %d offset %g on %d thread(s)", f16 ? "f16" : "bf16", (long long)outer,
            (long long)inner, affine, offset, team);
        check_bytes(F32, y16, yw16, 2 * (size_t)n);
        check_bytes(F32, st, st + 2 * outer, 8 * (size_t)outer); /* mean, invstd */
        CTX("k_layernorm_grad_%s %lldx%lld affine %d offset %g on %d thread(s)", f16 ? "f16" : "bf16",
            (long long)outer, (long long)inner, affine, offset, team);
        check_bytes(F32, g, gw, 4 * (size_t)(n + 2 * inner)); /* dx, dscale, dbias */
    }
    free(x16), free(y16), free(yw16), free(xw), free(yw), free(s), free(b), free(st), free(dy), free(g), free(gw);
}

static void test_layernorm(int dt)
{
    for (int f16 = 0; dt == F32 && f16 < 2; f16++) {
        layernorm_16_case(f16, 5, 7, 1, 0);
        layernorm_16_case(f16, 3, 16, 0, 0);
        layernorm_16_case(f16, 2, 771, 1, 0);
        layernorm_16_case(f16, 64, 1024, 1, 0); /* a team splits it (K_PAR_MIN elements) */
        layernorm_16_case(f16, 4, 768, 1, 100);
    }
    layernorm_case(dt, 5, 7, 1, 0);
    layernorm_case(dt, 3, 300, 1, 0);  /* dscale / dbias cross a K_TILE column tile */
    layernorm_case(dt, 4, 6, 0, 0);
    layernorm_case(dt, 3, 16, 1, 0);   /* rows of whole K_LANES blocks; then 16 k + a tail */
    layernorm_case(dt, 2, 771, 1, 0);
    layernorm_case(dt, 4, 768, 1, 1e4); /* far from 0: one pass without cancellation */
    layernorm_case(dt, 4, 37, 0, -3e3);
}

/* ---- BatchNormalization ------------------------------------------------- */

typedef struct {
    int64_t n, c, l;
} BnCtx;

static void bn_fwd(void *ctx, double *const *in, double *y)
{
    const BnCtx *b = ctx;
    k_batchnorm_train_f64(y, NULL, NULL, NULL, NULL, in[0], in[1], in[2], NULL, NULL, b->n,
                          b->c, b->l, 1e-5, 0.9);
}

static void batchnorm_case(int dt, int64_t n, int64_t c, int64_t l)
{
    const int64_t t = n * c * l;
    Buf x = buf_new(t), s = buf_new(c), b = buf_new(c), y = buf_new(t), want = buf_new(t);
    Buf mu = buf_new(c), is = buf_new(c), rm = buf_new(c), rv = buf_new(c);
    Buf wmu = buf_new(c), wis = buf_new(c), wrm = buf_new(c), wrv = buf_new(c);
    Buf wvar = buf_new(c), rv0 = buf_new(c), rv2 = buf_new(c);
    Buf w = buf_new(t), dx = buf_new(t), ds = buf_new(c), db = buf_new(c);
    fill_rnd(&x, -2, 3), fill_rnd(&s, 0.5, 1.5), fill_rnd(&b, -1, 1), fill_rnd(&w, -1, 1);
    fill_rnd(&rm, -0.5, 0.5), fill_rnd(&rv, 0.5, 2);
    for (int64_t ch = 0; ch < c; ch++) {
        double m = 0, v = 0;
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < l; i++) m += x.d[(k * c + ch) * l + i] / (n * l);
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < l; i++) v += pow(x.d[(k * c + ch) * l + i] - m, 2);
        wmu.d[ch] = m, wis.d[ch] = 1 / sqrt(v / (n * l) + 1e-5);
        /* torch momentum 0.1 = ONNX 0.9; running var unbiased */
        wrm.d[ch] = 0.9 * rm.d[ch] + 0.1 * m;
        wrv.d[ch] = 0.9 * rv.d[ch] + 0.1 * v / (n * l - 1);
        wvar.d[ch] = 0.9 * rv.d[ch] + 0.1 * v / (n * l);  /* ONNX spec: biased */
        for (int64_t k = 0; k < n; k++)
            for (int64_t i = 0; i < l; i++) {
                int64_t o = (k * c + ch) * l + i;
                want.d[o] = (x.d[o] - m) * wis.d[ch] * s.d[ch] + b.d[ch];
            }
    }
    memcpy(rv0.d, rv.d, (size_t)c * sizeof(double));
    PUT(&x, &s, &b, &w, &rm, &rv, &rv0);
    CTX("k_batchnorm_train n=%lld c=%lld l=%lld", (long long)n, (long long)c, (long long)l);
    KCALL(k_batchnorm_train, V(y), V(mu), V(is), V(rm), V(rv), V(x), V(s), V(b), V(rm), V(rv),
          n, c, l, 1e-5, 0.9);  /* running stats updated in place */
    GET(&y, &mu, &is, &rm, &rv);
    check(dt, y.d, want.d, t, tol(dt));
    check(dt, mu.d, wmu.d, c, tol(dt));
    check(dt, is.d, wis.d, c, tol(dt));
    CTX("k_batchnorm_train running stats (unbiased var) n=%lld l=%lld", (long long)n,
        (long long)l);
    check(dt, rm.d, wrm.d, c, tol(dt));
    check(dt, rv.d, wrv.d, c, tol(dt));
    CTX("k_bn_running_var (biased, from invstd) n=%lld l=%lld", (long long)n, (long long)l);
    KCALL(k_bn_running_var, V(rv2), V(rv0), V(is), c, 1e-5, 0.9);
    GET(&rv2);
    check(dt, rv2.d, wvar.d, c, tol(dt));
    CTX("k_bn_running_var in place");
    KCALL(k_bn_running_var, V(rv0), V(rv0), V(is), c, 1e-5, 0.9);
    GET(&rv0);
    check(dt, rv0.d, rv2.d, c, 0);

    KCALL(k_batchnorm_grad, V(dx), V(ds), V(db), V(w), V(x), V(mu), V(is), V(s), n, c, l);
    GET(&dx, &ds, &db);
    BnCtx bc = {n, c, l};
    double *in[3] = {x.d, s.d, b.d};
    CTX("k_batchnorm_grad dx n=%lld c=%lld l=%lld", (long long)n, (long long)c, (long long)l);
    check_fd(dt, bn_fwd, &bc, in, 0, t, w.d, t, dx.d);
    CTX("k_batchnorm_grad dscale");
    check_fd(dt, bn_fwd, &bc, in, 1, c, w.d, t, ds.d);
    CTX("k_batchnorm_grad dbias");
    check_fd(dt, bn_fwd, &bc, in, 2, c, w.d, t, db.d);

    /* inference with the running stats */
    for (int64_t k = 0; k < n; k++)
        for (int64_t ch = 0; ch < c; ch++)
            for (int64_t i = 0; i < l; i++) {
                int64_t o = (k * c + ch) * l + i;
                want.d[o] = (x.d[o] - rm.d[ch]) / sqrt(rv.d[ch] + 1e-5) * s.d[ch] + b.d[ch];
            }
    PUT(&rm, &rv);
    CTX("k_batchnorm_infer n=%lld c=%lld l=%lld", (long long)n, (long long)c, (long long)l);
    KCALL(k_batchnorm_infer, V(y), V(x), V(s), V(b), V(rm), V(rv), n, c, l, 1e-5);
    GET(&y);
    check(dt, y.d, want.d, t, tol(dt));
    buf_free(&x), buf_free(&s), buf_free(&b), buf_free(&y), buf_free(&want);
    buf_free(&mu), buf_free(&is), buf_free(&rm), buf_free(&rv);
    buf_free(&wmu), buf_free(&wis), buf_free(&wrm), buf_free(&wrv);
    buf_free(&wvar), buf_free(&rv0), buf_free(&rv2);
    buf_free(&w), buf_free(&dx), buf_free(&ds), buf_free(&db);
}

static void test_batchnorm(int dt)
{
    batchnorm_case(dt, 3, 4, 5);  /* NCHW with h w = 5 */
    batchnorm_case(dt, 6, 3, 1);  /* N x C */
}

/* ---- Conv2d ------------------------------------------------------------- */

/* n c h w, m kh kw, sh sw dh dw, pt pl pb pr, groups (oh, ow derived) */
static const int64_t conv_cases[][16] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},   /* 3x3 same */
    {1, 2, 8, 7, 3, 3, 2, 2, 2, 2, 1, 1, 0, 2, 1, 1},   /* strides, dilation, asym pads */
    {2, 4, 6, 5, 6, 3, 3, 2, 1, 1, 1, 1, 1, 0, 1, 2},   /* 2 groups */
    {1, 3, 5, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 3},   /* depthwise */
    {2, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1},   /* 1x1: direct path */
    {1, 4, 5, 5, 2, 1, 1, 2, 2, 1, 1, 0, 0, 0, 0, 2},   /* 1x1 strided, grouped */
    {1, 2, 12, 11, 3, 7, 7, 2, 2, 1, 1, 3, 3, 3, 3, 1}, /* resnet stem shape */
};

static KConv2d conv_geom(const int64_t *v)
{
    KConv2d p = {.n = v[0], .c = v[1], .h = v[2], .w = v[3], .m = v[4], .kh = v[5], .kw = v[6],
                 .sh = v[7], .sw = v[8], .dh = v[9], .dw = v[10], .pt = v[11], .pl = v[12],
                 .pb = v[13], .pr = v[14], .groups = v[15]};
    p.oh = (p.h + p.pt + p.pb - p.dh * (p.kh - 1) - 1) / p.sh + 1;
    p.ow = (p.w + p.pl + p.pr - p.dw * (p.kw - 1) - 1) / p.sw + 1;
    return p;
}

static void ref_conv(const KConv2d *p, double *y, const double *x, const double *w,
                     const double *b)
{
    const int64_t cg = p->c / p->groups, mg = p->m / p->groups;
    for (int64_t n = 0; n < p->n; n++)
        for (int64_t m = 0; m < p->m; m++)
            for (int64_t oy = 0; oy < p->oh; oy++)
                for (int64_t ox = 0; ox < p->ow; ox++) {
                    double s = b[m];
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t i = 0; i < p->kh; i++)
                            for (int64_t j = 0; j < p->kw; j++) {
                                int64_t iy = oy * p->sh - p->pt + i * p->dh;
                                int64_t ix = ox * p->sw - p->pl + j * p->dw;
                                int64_t c = m / mg * cg + ci;
                                if (iy >= 0 && iy < p->h && ix >= 0 && ix < p->w)
                                    s += x[((n * p->c + c) * p->h + iy) * p->w + ix] *
                                         w[((m * cg + ci) * p->kh + i) * p->kw + j];
                            }
                    y[((n * p->m + m) * p->oh + oy) * p->ow + ox] = s;
                }
}

typedef struct {
    KConv2d p;
    double *ws;
} ConvCtx;

static void conv_fwd(void *ctx, double *const *in, double *y)
{
    ConvCtx *c = ctx;
    k_conv2d_f64(&c->p, y, in[0], in[1], in[2], c->ws);
}

static void test_conv(int dt)
{
    for (size_t k = 0; k < sizeof conv_cases / sizeof conv_cases[0]; k++) {
        KConv2d p = conv_geom(conv_cases[k]);
        const int64_t nx = p.n * p.c * p.h * p.w, nw = p.m * (p.c / p.groups) * p.kh * p.kw;
        const int64_t ny = p.n * p.m * p.oh * p.ow, nws = k_conv2d_workspace(&p);
        Buf x = buf_new(nx), w = buf_new(nw), b = buf_new(p.m), y = buf_new(ny), want = buf_new(ny);
        Buf g = buf_new(ny), dx = buf_new(nx), dw = buf_new(nw), db = buf_new(p.m), ws = buf_new(nws);
        fill_rnd(&x, -1, 1), fill_rnd(&w, -1, 1), fill_rnd(&b, -1, 1), fill_rnd(&g, -1, 1);
        fill_val(&dx, NAN), fill_val(&dw, NAN);  /* both must be written, not added to */
        ref_conv(&p, want.d, x.d, w.d, b.d);
        PUT(&x, &w, &b, &g, &dx, &dw);
        CTX("k_conv2d case %zu", k);
        KCALL(k_conv2d, &p, V(y), V(x), V(w), V(b), nws ? V(ws) : NULL);
        GET(&y);
        check(dt, y.d, want.d, ny, 10 * tol(dt));

        KCALL(k_conv2d_grad_x, &p, V(dx), V(g), V(w), nws ? V(ws) : NULL);
        KCALL(k_conv2d_grad_w, &p, V(dw), V(g), V(x), nws ? V(ws) : NULL);
        KCALL(k_conv2d_grad_b, &p, V(db), V(g));
        GET(&dx, &dw, &db);
        ConvCtx c = {p, xalloc((size_t)nws, sizeof(double))};
        double *in[3] = {x.d, w.d, b.d};
        CTX("k_conv2d_grad_x case %zu vs finite differences", k);
        check_fd(dt, conv_fwd, &c, in, 0, nx, g.d, ny, dx.d);
        CTX("k_conv2d_grad_w case %zu vs finite differences", k);
        check_fd(dt, conv_fwd, &c, in, 1, nw, g.d, ny, dw.d);
        CTX("k_conv2d_grad_b case %zu vs finite differences", k);
        check_fd(dt, conv_fwd, &c, in, 2, p.m, g.d, ny, db.d);
        free(c.ws);
        buf_free(&x), buf_free(&w), buf_free(&b), buf_free(&y), buf_free(&want);
        buf_free(&g), buf_free(&dx), buf_free(&dw), buf_free(&db), buf_free(&ws);
    }
}

/* oneDNN's convolutions (conv_dnnl.c), float32 in both layouts and every
 * direction, against the float64 im2col kernels on the same (float32-rounded)
 * operands: equal within float32 rounding.  conv_cases plus shapes wide
 * enough for the blocked kernels (16 channels and more per group). */
static const int64_t conv_dnnl_cases[][16] = {
    {2, 32, 9, 8, 48, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},    /* 3x3 same */
    {2, 32, 9, 9, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1},    /* strided */
    {1, 32, 11, 10, 64, 3, 3, 1, 2, 2, 3, 2, 1, 0, 3, 2},  /* dilations, asym pads, 2 groups */
    {2, 32, 7, 7, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 32},   /* depthwise */
    {2, 32, 6, 6, 64, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1},    /* 1x1 */
    {2, 32, 7, 7, 48, 1, 1, 2, 2, 1, 1, 0, 0, 0, 0, 1},    /* 1x1 strided */
};

static void conv_dnnl_case(const KConv2d *p, int layout, const char *tag)
{
    const int64_t nx = p->n * p->c * p->h * p->w, nw = p->m * (p->c / p->groups) * p->kh * p->kw;
    const int64_t ny = p->n * p->m * p->oh * p->ow, nws = k_conv2d_workspace(p);
    Buf x = buf_new(nx), w = buf_new(nw), b = buf_new(p->m), g = buf_new(ny), ws = buf_new(nws);
    Buf y = buf_new(ny), dx = buf_new(nx), dw = buf_new(nw), db = buf_new(p->m);
    Buf y2 = buf_new(ny), dx2 = buf_new(nx), dw2 = buf_new(nw), db2 = buf_new(p->m);
    fill_rnd(&x, -1, 1), fill_rnd(&w, -1, 1), fill_rnd(&b, -1, 1), fill_rnd(&g, -1, 1);
    fill_val(&y, NAN), fill_val(&dx, NAN), fill_val(&dw, NAN), fill_val(&db, NAN); /* written, not added to */
    puts_(F32, &x, &w, &b, &g, &y, &dx, &dw, &db, (Buf *)NULL);
    gets_(F32, &x, &w, &b, &g, (Buf *)NULL); /* the reference sees the rounded operands */
    k_conv2d_f64(p, y2.d, x.d, w.d, b.d, ws.d);
    k_conv2d_grad_x_f64(p, dx2.d, g.d, w.d, ws.d);
    k_conv2d_grad_w_f64(p, dw2.d, g.d, x.d, ws.d);
    k_conv2d_grad_b_f64(p, db2.d, g.d);
    k_conv2d_dnnl_f32(p, K_CONV_FWD, layout, y.f, x.f, w.f, b.f, NULL);
    k_conv2d_dnnl_f32(p, K_CONV_BWD_X, layout, dx.f, g.f, w.f, NULL, NULL);
    k_conv2d_dnnl_f32(p, K_CONV_BWD_W, layout, dw.f, x.f, g.f, NULL, db.f);
    gets_(F32, &y, &dx, &dw, &db, (Buf *)NULL);
    CTX("oneDNN %s forward", tag);
    check(F32, y.d, y2.d, ny, 10 * tol(F32));
    CTX("oneDNN %s data gradient", tag);
    check(F32, dx.d, dx2.d, nx, 10 * tol(F32));
    CTX("oneDNN %s weight gradient", tag);
    check(F32, dw.d, dw2.d, nw, 10 * tol(F32));
    CTX("oneDNN %s bias gradient", tag);
    check(F32, db.d, db2.d, p->m, 10 * tol(F32));
    buf_free(&x), buf_free(&w), buf_free(&b), buf_free(&g), buf_free(&ws);
    buf_free(&y), buf_free(&dx), buf_free(&dw), buf_free(&db);
    buf_free(&y2), buf_free(&dx2), buf_free(&dw2), buf_free(&db2);
}

static void test_conv_dnnl(int dt)
{
    if (dt != F32)
        return; /* float64 convolutions never leave im2col */
    for (int set = 0; set < 2; set++) {
        const size_t nc = set ? sizeof conv_dnnl_cases / sizeof conv_dnnl_cases[0]
                              : sizeof conv_cases / sizeof conv_cases[0];
        for (size_t k = 0; k < nc; k++) {
            KConv2d p = conv_geom(set ? conv_dnnl_cases[k] : conv_cases[k]);
            char tag[64];
            snprintf(tag, sizeof tag, "plain, %s case %zu", set ? "wide" : "conv", k);
            conv_dnnl_case(&p, K_CONV_DNNL_PLAIN, tag);
            snprintf(tag, sizeof tag, "blocked, %s case %zu", set ? "wide" : "conv", k);
            conv_dnnl_case(&p, K_CONV_DNNL_BLOCKED, tag);
        }
    }
}

/* the 16-bit convolutions (k_conv2d_bf16 / _f16 and their gradients, on
 * oneDNN: natively in bfloat16 where the CPU has AVX512-BF16, else widened by
 * the reorders; kernels_nn_onednn runs this at AVX2) against the float64
 * kernels on the same 16-bit-rounded x, w, dy (the bias float32): equal
 * within float32 rounding, every product of two 16-bit values being exact in
 * float32.  x and dy go in as 16 bits, so the rounding is the test's. */
static void conv_16_case(const KConv2d *p, int f16, const char *tag)
{
    const int64_t nx = p->n * p->c * p->h * p->w, nw = p->m * (p->c / p->groups) * p->kh * p->kw;
    const int64_t ny = p->n * p->m * p->oh * p->ow, nws = k_conv2d_workspace(p);
    Buf x = buf_new(nx), w = buf_new(nw), b = buf_new(p->m), g = buf_new(ny), ws = buf_new(nws);
    Buf y = buf_new(ny), dx = buf_new(nx), dw = buf_new(nw), db = buf_new(p->m);
    Buf y2 = buf_new(ny), dx2 = buf_new(nx), dw2 = buf_new(nw), db2 = buf_new(p->m);
    uint16_t *x16 = xalloc((size_t)nx, 2), *w16 = xalloc((size_t)nw, 2), *g16 = xalloc((size_t)ny, 2);
    fill_rnd(&x, -1, 1), fill_rnd(&w, -1, 1), fill_rnd(&b, -1, 1), fill_rnd(&g, -1, 1);
    const struct { Buf *v; uint16_t *h; } ops[3] = {{&x, x16}, {&w, w16}, {&g, g16}};
    for (int k = 0; k < 3; k++) /* the 16-bit operands and their float64 values */
        for (int64_t i = 0; i < ops[k].v->n; i++) {
            ops[k].h[i] = f16 ? k_f16_from_f32((float)ops[k].v->d[i]) : k_bf16_from_f32((float)ops[k].v->d[i]);
            ops[k].v->d[i] = f16 ? k_f16_to_f32(ops[k].h[i]) : k_bf16_to_f32(ops[k].h[i]);
        }
    fill_val(&y, NAN), fill_val(&dx, NAN), fill_val(&dw, NAN), fill_val(&db, NAN); /* written, not added to */
    puts_(F32, &b, &y, &dx, &dw, &db, (Buf *)NULL);
    gets_(F32, &b, (Buf *)NULL);
    k_conv2d_f64(p, y2.d, x.d, w.d, b.d, ws.d);
    k_conv2d_grad_x_f64(p, dx2.d, g.d, w.d, ws.d);
    k_conv2d_grad_w_f64(p, dw2.d, g.d, x.d, ws.d);
    k_conv2d_grad_b_f64(p, db2.d, g.d);
    if (f16) {
        k_conv2d_f16(p, y.f, x16, w16, b.f, NULL);
        k_conv2d_grad_x_f16(p, dx.f, g16, w16, NULL);
        k_conv2d_grad_w_f16(p, dw.f, g16, x16, NULL);
        k_conv2d_grad_b_f16(p, db.f, g16);
    } else {
        k_conv2d_bf16(p, y.f, x16, w16, b.f, NULL);
        k_conv2d_grad_x_bf16(p, dx.f, g16, w16, NULL);
        k_conv2d_grad_w_bf16(p, dw.f, g16, x16, NULL);
        k_conv2d_grad_b_bf16(p, db.f, g16);
    }
    gets_(F32, &y, &dx, &dw, &db, (Buf *)NULL);
    CTX("%s forward", tag);
    check(F32, y.d, y2.d, ny, 10 * tol(F32));
    CTX("%s data gradient", tag);
    check(F32, dx.d, dx2.d, nx, 10 * tol(F32));
    CTX("%s weight gradient", tag);
    check(F32, dw.d, dw2.d, nw, 10 * tol(F32));
    CTX("%s bias gradient", tag);
    check(F32, db.d, db2.d, p->m, 10 * tol(F32));
    free(x16), free(w16), free(g16);
    buf_free(&x), buf_free(&w), buf_free(&b), buf_free(&g), buf_free(&ws);
    buf_free(&y), buf_free(&dx), buf_free(&dw), buf_free(&db);
    buf_free(&y2), buf_free(&dx2), buf_free(&dw2), buf_free(&db2);
}

static void test_conv_16(int dt)
{
    if (dt != F32)
        return; /* their results are float32 */
    for (int set = 0; set < 2; set++) {
        const size_t nc = set ? sizeof conv_dnnl_cases / sizeof conv_dnnl_cases[0]
                              : sizeof conv_cases / sizeof conv_cases[0];
        for (size_t k = 0; k < nc; k++) {
            KConv2d p = conv_geom(set ? conv_dnnl_cases[k] : conv_cases[k]);
            for (int f16 = 0; f16 < 2; f16++) {
                char tag[64];
                snprintf(tag, sizeof tag, "%s, %s case %zu", f16 ? "float16" : "bfloat16", set ? "wide" : "conv", k);
                conv_16_case(&p, f16, tag);
            }
        }
    }
}

/* ---- pooling ------------------------------------------------------------ */

/* n c h w, kh kw, sh sw dh dw, pt pl pb pr, ceil_mode, count_include_pad */
static const int64_t pool_cases[][16] = {
    {2, 3, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0},  /* resnet maxpool */
    {1, 2, 7, 7, 2, 2, 2, 2, 1, 1, 0, 0, 0, 0, 1, 0},  /* ceil_mode: last window clipped */
    {1, 2, 7, 9, 2, 3, 1, 2, 2, 1, 1, 0, 0, 2, 0, 1},  /* dilation, asym pads */
    {2, 2, 6, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1},  /* pads + ceil, include pad */
    {1, 1, 5, 5, 3, 2, 2, 3, 1, 1, 1, 0, 1, 1, 1, 0},
};

static KPool2d pool_geom(const int64_t *v)
{
    KPool2d p = {.n = v[0], .c = v[1], .h = v[2], .w = v[3], .kh = v[4], .kw = v[5],
                 .sh = v[6], .sw = v[7], .dh = v[8], .dw = v[9], .pt = v[10], .pl = v[11],
                 .pb = v[12], .pr = v[13], .count_include_pad = (int)v[15]};
    p.oh = k_pool_out_dim(p.h, p.kh, p.sh, p.pt, p.pb, p.dh, (int)v[14]);
    p.ow = k_pool_out_dim(p.w, p.kw, p.sw, p.pl, p.pr, p.dw, (int)v[14]);
    return p;
}

/* Naive pooling of output (pl, oy, ox): max (and its first index) or average. */
static double ref_pool(const KPool2d *p, const double *x, int64_t pl, int64_t oy, int64_t ox,
                       int avg, int64_t *arg)
{
    double best = -INFINITY, s = 0;
    int64_t cnt = 0, cpad = 0;
    *arg = -1;
    for (int64_t i = 0; i < p->kh; i++)
        for (int64_t j = 0; j < p->kw; j++) {
            int64_t iy = oy * p->sh - p->pt + i * p->dh, ix = ox * p->sw - p->pl + j * p->dw;
            cpad += iy < p->h + p->pb && ix < p->w + p->pr;  /* iy >= -pt always */
            if (iy < 0 || iy >= p->h || ix < 0 || ix >= p->w)
                continue;
            double v = x[pl * p->h * p->w + iy * p->w + ix];
            cnt++, s += v;
            if (*arg < 0 || v > best)
                best = v, *arg = iy * p->w + ix;
        }
    return avg ? s / (double)(p->count_include_pad ? cpad : cnt) : best;
}

static void maxpool_fwd(void *ctx, double *const *in, double *y)
{
    const KPool2d *p = ctx;
    int64_t *arg = xalloc((size_t)(p->n * p->c * p->oh * p->ow), sizeof(int64_t));
    k_maxpool2d_f64(p, y, arg, in[0]);
    free(arg);
}

static void avgpool_fwd(void *ctx, double *const *in, double *y)
{
    k_avgpool2d_f64(ctx, y, in[0]);
}

static void test_pool(int dt)
{
    for (size_t k = 0; k < sizeof pool_cases / sizeof pool_cases[0]; k++) {
        KPool2d p = pool_geom(pool_cases[k]);
        const int64_t nx = p.n * p.c * p.h * p.w, ny = p.n * p.c * p.oh * p.ow;
        Buf x = buf_new(nx), y = buf_new(ny), want = buf_new(ny), g = buf_new(ny), dx = buf_new(nx);
        int64_t *arg = xalloc((size_t)ny, sizeof(int64_t)), *warg = xalloc((size_t)ny, sizeof(int64_t));
        fill_rnd(&x, -2, 2), fill_rnd(&g, -1, 1), fill_val(&dx, NAN);
        for (int64_t o = 0; o < ny; o++)
            want.d[o] = ref_pool(&p, x.d, o / (p.oh * p.ow), o / p.ow % p.oh, o % p.ow, 0, &warg[o]);
        PUT(&x, &g, &dx);
        CTX("k_maxpool2d case %zu (%lldx%lld out)", k, (long long)p.oh, (long long)p.ow);
        KCALL(k_maxpool2d, &p, V(y), arg, V(x));
        GET(&y);
        check(dt, y.d, want.d, ny, 0);
        for (int64_t o = 0; o < ny; o++) check_int(dt, arg[o], warg[o]);
        CTX("k_maxpool2d_grad case %zu vs finite differences", k);
        KCALL(k_maxpool2d_grad, &p, V(dx), V(g), arg);
        GET(&dx);
        double *in[1] = {x.d};
        check_fd(dt, maxpool_fwd, &p, in, 0, nx, g.d, ny, dx.d);

        for (int inc = 0; inc < 2; inc++) {
            p.count_include_pad = inc;
            for (int64_t o = 0; o < ny; o++)
                want.d[o] = ref_pool(&p, x.d, o / (p.oh * p.ow), o / p.ow % p.oh, o % p.ow, 1,
                                     &warg[o]);
            CTX("k_avgpool2d case %zu count_include_pad %d", k, inc);
            KCALL(k_avgpool2d, &p, V(y), V(x));
            GET(&y);
            check(dt, y.d, want.d, ny, tol(dt));
            CTX("k_avgpool2d_grad case %zu count_include_pad %d vs finite differences", k, inc);
            fill_val(&dx, NAN), put(dt, &dx);
            KCALL(k_avgpool2d_grad, &p, V(dx), V(g));
            GET(&dx);
            check_fd(dt, avgpool_fwd, &p, in, 0, nx, g.d, ny, dx.d);
        }
        free(arg), free(warg);
        buf_free(&x), buf_free(&y), buf_free(&want), buf_free(&g), buf_free(&dx);
    }
    /* ties: the first maximal tap wins (torch's indices), so dy goes there */
    {
        KPool2d p = {.n = 1, .c = 1, .h = 2, .w = 3, .kh = 2, .kw = 2, .oh = 1, .ow = 2,
                     .sh = 1, .sw = 1, .dh = 1, .dw = 1};
        const double xv[6] = {1, 5, 5, 5, 0, 5};
        Buf x = buf_new(6), y = buf_new(2);
        int64_t arg[2];
        set(&x, xv), put(dt, &x);
        CTX("k_maxpool2d ties pick the first maximum");
        KCALL(k_maxpool2d, &p, V(y), arg, V(x));
        check_int(dt, arg[0], 1);
        check_int(dt, arg[1], 1);
        buf_free(&x), buf_free(&y);
    }
    /* NaN wins a max window, as in torch */
    {
        KPool2d p = {.n = 1, .c = 1, .h = 2, .w = 2, .kh = 2, .kw = 2, .oh = 1, .ow = 1,
                     .sh = 1, .sw = 1, .dh = 1, .dw = 1};
        const double xv[4] = {1, NAN, 3, 2}, want = NAN;
        Buf x = buf_new(4), y = buf_new(1);
        int64_t arg;
        set(&x, xv), put(dt, &x);
        CTX("k_maxpool2d NaN propagates");
        KCALL(k_maxpool2d, &p, V(y), &arg, V(x));
        GET(&y);
        check(dt, y.d, &want, 1, 0);
        check_int(dt, arg, 1);
        buf_free(&x), buf_free(&y);
    }
}

static void gap_fwd(void *ctx, double *const *in, double *y)
{
    (void)ctx;
    k_global_avgpool_f64(y, in[0], 6, 35);
}

static void test_global_avgpool(int dt)
{
    Buf x = buf_new(6 * 35), y = buf_new(6), want = buf_new(6), g = buf_new(6), dx = buf_new(6 * 35);
    fill_rnd(&x, -2, 2), fill_rnd(&g, -1, 1);
    for (int i = 0; i < 6 * 35; i++) want.d[i / 35] += x.d[i] / 35;
    PUT(&x, &g);
    CTX("k_global_avgpool");
    KCALL(k_global_avgpool, V(y), V(x), 6, 35);
    KCALL(k_global_avgpool_grad, V(dx), V(g), 6, 35);
    GET(&y, &dx);
    check(dt, y.d, want.d, 6, tol(dt));
    CTX("k_global_avgpool_grad vs finite differences");
    double *in[1] = {x.d};
    check_fd(dt, gap_fwd, NULL, in, 0, 6 * 35, g.d, 6, dx.d);
    buf_free(&x), buf_free(&y), buf_free(&want), buf_free(&g), buf_free(&dx);
}

/* ---- Gather ------------------------------------------------------------- */

typedef struct {
    int64_t outer, axis, inner, nidx;
    const int64_t *idx;
} GatherCtx;

static void gather_fwd(void *ctx, double *const *in, double *y)
{
    const GatherCtx *c = ctx;
    k_gather(8, y, in[0], c->idx, c->outer, c->axis, c->inner, c->nidx);
}

static void gather_case(int dt, int64_t outer, int64_t axis, int64_t inner,
                        const int64_t *idx, int64_t nidx)
{
    const int64_t nx = outer * axis * inner, ny = outer * nidx * inner;
    Buf x = buf_new(nx), y = buf_new(ny), want = buf_new(ny), g = buf_new(ny), dx = buf_new(nx);
    fill_rnd(&x, -2, 2), fill_rnd(&g, -1, 1), fill_val(&dx, NAN);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < nidx; i++)
            for (int64_t c = 0; c < inner; c++) {
                int64_t k = idx[i] < 0 ? idx[i] + axis : idx[i];
                want.d[(o * nidx + i) * inner + c] = x.d[(o * axis + k) * inner + c];
            }
    PUT(&x, &g, &dx);
    CTX("k_gather %lldx%lldx%lld, %lld indices", (long long)outer, (long long)axis,
        (long long)inner, (long long)nidx);
    check_int(dt, k_gather(dt == F32 ? 4 : 8, V(y), V(x), idx, outer, axis, inner, nidx), -1);
    GET(&y);
    check(dt, y.d, want.d, ny, 0);
    CTX("k_gather_grad %lldx%lldx%lld vs finite differences", (long long)outer,
        (long long)axis, (long long)inner);
    KCALL(k_gather_grad, V(dx), V(g), idx, outer, axis, inner, nidx);
    GET(&dx);
    GatherCtx c = {outer, axis, inner, nidx, idx};
    double *in[1] = {x.d};
    if (nx <= 2000)
        check_fd(dt, gather_fwd, &c, in, 0, nx, g.d, ny, dx.d);
    else {  /* the big case: the scatter-add by definition */
        for (int64_t i = 0; i < nx; i++) want.d[i] = 0;
        for (int64_t i = 0; i < nidx; i++)
            for (int64_t k = 0; k < inner; k++)
                want.d[(idx[i] < 0 ? idx[i] + axis : idx[i]) * inner + k] += g.d[i * inner + k];
        check(dt, dx.d, want.d, nx, tol(dt));
    }
    buf_free(&x), buf_free(&y), buf_free(&want), buf_free(&g), buf_free(&dx);
}

static void test_gather(int dt)
{
    static const int64_t idx[] = {0, -1, 4, 2, 2, -5};  /* repeats and negatives */
    static const int64_t tok[] = {3, 0, 3, 7, 1, 3, 6, 0, 2, 3, 5, 4};
    gather_case(dt, 2, 5, 3, idx, 6);
    gather_case(dt, 1, 5, 1, idx, 6);
    gather_case(dt, 3, 5, 1, idx, 4);
    gather_case(dt, 1, 8, 1100, tok, 12);  /* embedding: columns span two blocks */
    /* bad indices: reported, y untouched */
    static const int64_t bad1[] = {0, 5, -9}, bad0[] = {-6};
    double y[6] = {7, 7, 7, 7, 7, 7}, x[5] = {0};
    const double sev[6] = {7, 7, 7, 7, 7, 7};
    CTX("k_gather index == axis");
    check_int(dt, k_gather(8, y, x, bad1, 1, 5, 1, 3), 1);
    CTX("k_gather index < -axis");
    check_int(dt, k_gather(8, y, x, bad0, 1, 5, 1, 1), 0);
    check(dt, y, sev, 6, 0);
    /* int64 data (esize 8) */
    int64_t xi[10], yi[6], wi[6];
    for (int i = 0; i < 10; i++) xi[i] = 1000 + i;
    for (int i = 0; i < 6; i++) wi[i] = 1000 + (idx[i] < 0 ? idx[i] + 10 : idx[i]);
    CTX("k_gather int64 data");
    check_int(dt, k_gather(8, yi, xi, idx, 1, 10, 1, 6), -1);
    check_bytes(dt, yi, wi, sizeof wi);
}

/* ---- GatherElements ----------------------------------------------------- */

typedef struct {
    int rank, axis;
    const int64_t *sh, *xs, *idx;
} GeCtx;

static void ge_fwd(void *ctx, double *const *in, double *y)
{
    const GeCtx *c = ctx;
    k_gather_elements(8, y, in[0], c->idx, c->rank, c->sh, c->xs, c->axis);
}

/* idx (shape sh) random in [-xs[axis], xs[axis]): negatives and repeats */
static void ge_case(int dt, int rank, const int64_t *xs, const int64_t *sh, int axis)
{
    const int64_t nx = numel(rank, xs), ny = numel(rank, sh);
    int64_t *idx = xalloc((size_t)ny + 1, sizeof(int64_t)), m[8], xst[8];
    for (int64_t i = 0; i < ny; i++) { /* rnd rounds to float: it may reach the top */
        idx[i] = (int64_t)floor(rnd(-(double)xs[axis], (double)xs[axis]));
        idx[i] = idx[i] < xs[axis] ? idx[i] : xs[axis] - 1;
    }
    Buf x = buf_new(nx), y = buf_new(ny), want = buf_new(ny), g = buf_new(ny), dx = buf_new(nx);
    Buf wdx = buf_new(nx);
    fill_rnd(&x, -2, 2), fill_rnd(&g, -1, 1), fill_val(&dx, NAN), fill_val(&wdx, 0);
    dense_strides(rank, xs, xst);
    for (int64_t i = 0; i < ny; i++) { /* the definition, element by element */
        unravel(i, rank, sh, m);
        m[axis] = idx[i] < 0 ? idx[i] + xs[axis] : idx[i];
        want.d[i] = x.d[dot(rank, m, xst)];
        wdx.d[dot(rank, m, xst)] += g.d[i];
    }
    PUT(&x, &g, &dx);
    CTX("k_gather_elements rank %d axis %d, %lld of %lld elements", rank, axis, (long long)ny, (long long)nx);
    check_int(dt, k_gather_elements(dt == F32 ? 4 : 8, V(y), V(x), idx, rank, sh, xs, axis), -1);
    GET(&y);
    check(dt, y.d, want.d, ny, 0);
    CTX("k_gather_elements_grad rank %d axis %d: the scatter-add by definition", rank, axis);
    check_int(dt, KCALL(k_gather_elements_grad, V(dx), V(g), idx, rank, sh, xs, axis), -1);
    GET(&dx);
    check(dt, dx.d, wdx.d, nx, tol(dt));
    if (nx <= 400) {
        CTX("k_gather_elements_grad rank %d axis %d vs finite differences", rank, axis);
        GeCtx c = {rank, axis, sh, xs, idx};
        double *in[1] = {x.d};
        check_fd(dt, ge_fwd, &c, in, 0, nx, g.d, ny, dx.d);
    }
    buf_free(&x), buf_free(&y), buf_free(&want), buf_free(&g), buf_free(&dx), buf_free(&wdx);
    free(idx);
}

/* ---- NDIndex (GatherND, ScatterND) ----------------------------------------- */

static void test_nd_index(int dt)
{
    /* batch 2 x 3 tuples of 2 into dims {4, 5}: negatives wrap, the batch offset is 20 */
    static const int64_t dims[] = {4, 5}, idx[] = {0, 0, 3, 4, -1, -5, 1, 2, -4, 0, 2, -1};
    static const int64_t want[] = {0, 19, 15, 20 + 7, 20 + 0, 20 + 14};
    int64_t y[6] = {0}, keep[6];
    CTX("k_nd_index batch 2, 3 tuples of 2");
    check_int(dt, k_nd_index(y, idx, 2, 3, 2, dims), -1);
    check_bytes(dt, y, want, sizeof want);
    CTX("k_nd_index one dim, no batch");
    check_int(dt, k_nd_index(y, (const int64_t[]){2, -3}, 1, 2, 1, (const int64_t[]){3}), -1);
    check_bytes(dt, y, ((const int64_t[]){2, 0}), 2 * sizeof(int64_t));
    /* a component outside its own dim: the first bad position, y untouched */
    static const int64_t bad[] = {3, 4, 0, 5, 4, 0};
    memcpy(keep, y, sizeof keep);
    CTX("k_nd_index component == its dim");
    check_int(dt, k_nd_index(y, bad, 1, 3, 2, dims), 3);
    check_bytes(dt, y, keep, sizeof keep);
    CTX("k_nd_index component < -dim");
    check_int(dt, k_nd_index(y, (const int64_t[]){0, 0, -5, 0}, 1, 2, 2, dims), 2);
    CTX("k_nd_index no tuples");
    check_int(dt, k_nd_index(y, idx, 0, 3, 2, dims), -1);
}

static void test_gather_elements(int dt)
{
    static const int64_t x1[] = {7}, i1[] = {12};
    static const int64_t x2[] = {3, 4}, i2a[] = {5, 4}, i2b[] = {2, 6};
    static const int64_t x3[] = {4, 5, 6}, i3[] = {3, 2, 6}, x4[] = {2, 3, 4, 5}, i4[] = {2, 1, 6, 5};
    static const int64_t xb[] = {64, 300}, ib[] = {50, 300};
    ge_case(dt, 1, x1, i1, 0);
    ge_case(dt, 2, x2, i2a, 0);
    ge_case(dt, 2, x2, i2b, 1);
    for (int ax = 0; ax < 3; ax++) /* indices shorter than x off the axis */
        ge_case(dt, 3, x3, i3, ax);
    ge_case(dt, 4, x4, i4, 2);
    ge_case(dt, 2, xb, ib, 0);  /* enough columns to split across threads */
    ge_case(dt, 2, xb, ib, 1);
    /* bad indices: the first reported, y untouched */
    static const int64_t sh[] = {2, 2}, xs[] = {2, 3}, bad[] = {0, 1, 3, -4};
    double y[4] = {7, 7, 7, 7}, x[6] = {0};
    const double sev[4] = {7, 7, 7, 7};
    CTX("k_gather_elements index == axis length");
    check_int(dt, k_gather_elements(8, y, x, bad, 2, sh, xs, 1), 2);
    check(dt, y, sev, 4, 0);
    CTX("k_gather_elements index < -axis length");
    check_int(dt, k_gather_elements(8, y, x, bad + 1, 1, (const int64_t[]){3}, (const int64_t[]){3}, 0), 1);
    /* the backward is ScatterElements' scatter: it checks too, dx untouched */
    double dy[4] = {1, 1, 1, 1}, dxs[6] = {7, 7, 7, 7, 7, 7};
    const double sev6[6] = {7, 7, 7, 7, 7, 7};
    float dyf[4] = {1, 1, 1, 1}, dxf[6] = {7, 7, 7, 7, 7, 7}, sevf[6] = {7, 7, 7, 7, 7, 7};
    CTX("k_gather_elements_grad index == axis length");
    check_int(dt, k_gather_elements_grad_f64(dxs, dy, bad, 2, sh, xs, 1), 2);
    check(dt, dxs, sev6, 6, 0);
    CTX("k_gather_elements_grad_f32 index < -axis length");
    check_int(dt, k_gather_elements_grad_f32(dxf, dyf, bad + 1, 1, (const int64_t[]){3}, (const int64_t[]){3}, 0), 1);
    check_bytes(dt, dxf, sevf, sizeof sevf);
    /* int64 data (esize 8), as BERT's token type ids */
    static const int64_t ti[] = {0, 2, 1, 1, 2, 0};
    int64_t xi[6] = {10, 11, 12, 20, 21, 22}, yi[6], wi[6] = {10, 12, 11, 21, 22, 20};
    CTX("k_gather_elements int64 data");
    check_int(dt, k_gather_elements(8, yi, xi, ti, 2, (const int64_t[]){2, 3}, (const int64_t[]){2, 3}, 1), -1);
    check_bytes(dt, yi, wi, sizeof wi);
}

/* ---- Dropout ------------------------------------------------------------ */

static void test_philox(int dt)
{
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                                       {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}};
    static const uint32_t key[3][2] = {{0, 0}, {0xffffffff, 0xffffffff},
                                       {0xa4093822, 0x299f31d0}};
    static const uint32_t want[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                                        {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                                        {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
    if (dt == F32)
        return;
    for (int k = 0; k < 3; k++) {
        uint32_t out[4];
        CTX("k_philox4x32_10 Random123 known answer %d", k);
        k_philox4x32_10(out, ctr[k], key[k]);
        check_bytes(dt, out, want[k], sizeof out);
    }
}

typedef struct {
    int64_t n;
} DropCtx;

static void drop_fwd(void *ctx, double *const *in, double *y)
{
    k_dropout_f64(y, NULL, in[0], ((DropCtx *)ctx)->n, 0.3, 42, 7, 3);
}

static void test_dropout(int dt)
{
    const int64_t n = 100003;
    const uint64_t seed = 0x123456789abcdefULL;
    Buf x = buf_new(n), y = buf_new(n), y2 = buf_new(n), g = buf_new(n), dx = buf_new(n);
    uint8_t *m = xalloc((size_t)n, 1), *m2 = xalloc((size_t)n, 1), *wm = xalloc((size_t)n, 1);
    fill_rnd(&x, -2, 2), fill_rnd(&g, -1, 1);
    PUT(&x, &g);

    /* the mask by definition, from Philox directly */
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t out[4], ctr[4] = {(uint32_t)(i / 4), 0, 11, 5};
        k_philox4x32_10(out, ctr, key);
        wm[i] = out[i % 4] >= 0.3 * 4294967296.0;
        kept += wm[i];
    }
    CTX("k_dropout mask = Philox(seed, stream, step, i) >= ratio");
    KCALL(k_dropout, V(y), m, V(x), n, 0.3, seed, 5, 11);
    GET(&y);
    check_bytes(dt, m, wm, (size_t)n);
    CTX("k_dropout keeps about 1 - ratio (%lld of %lld)", (long long)kept, (long long)n);
    checks++;
    if (fabs((double)kept / n - 0.7) > 0.01) failures++, printf("FAIL %s\n", what);
    for (int64_t i = 0; i < n; i++) {
        float sf = 1.0f / (float)(1 - 0.3);
        y2.d[i] = !wm[i] ? 0 : dt == F32 ? (double)((float)x.d[i] * sf) : x.d[i] * (1 / (1 - 0.3));
    }
    CTX("k_dropout y = x mask / (1 - ratio)");
    check(dt, y.d, y2.d, n, 0);

    /* a prefix draws the same mask (independent of n and of the chunking),
     * another step a different one, a NULL mask the same y */
    CTX("k_dropout prefix of 1000 draws the same mask");
    KCALL(k_dropout, V(y2), m2, V(x), 1000, 0.3, seed, 5, 11);
    check_bytes(dt, m2, wm, 1000);
    KCALL(k_dropout, V(y2), m2, V(x), n, 0.3, seed, 5, 12);
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++) same += m2[i] == wm[i];
    CTX("k_dropout step 12 differs from step 11 (%lld of %lld equal)", (long long)same,
        (long long)n);
    checks++;
    if (same > n * 0.62) failures++, printf("FAIL %s\n", what);  /* 0.58 expected */
    KCALL(k_dropout, V(y2), NULL, V(x), n, 0.3, seed, 5, 11);
    GET(&y2);
    CTX("k_dropout without a mask output");
    check(dt, y2.d, y.d, n, 0);

    /* backward: dx = dy mask / (1 - ratio), vs finite differences on a prefix */
    KCALL(k_dropout_grad, V(dx), V(g), m, n, 0.3);
    GET(&dx);
    for (int64_t i = 0; i < n; i++) {
        float sf = 1.0f / (float)(1 - 0.3);
        y2.d[i] = !wm[i] ? 0 : dt == F32 ? (double)((float)g.d[i] * sf) : g.d[i] * (1 / (1 - 0.3));
    }
    CTX("k_dropout_grad");
    check(dt, dx.d, y2.d, n, 0);
    {
        DropCtx c = {300};
        uint8_t pm[300];
        KCALL(k_dropout, V(y2), pm, V(x), 300, 0.3, 42, 7, 3);
        KCALL(k_dropout_grad, V(dx), V(g), pm, 300, 0.3);
        GET(&dx);
        double *in[1] = {x.d};
        CTX("k_dropout_grad vs finite differences");
        check_fd(dt, drop_fwd, &c, in, 0, 300, g.d, 300, dx.d);
    }
    /* ratio 0: an exact copy with an all-ones mask; ratio 1: zeros */
    KCALL(k_dropout, V(y), m, V(x), n, 0, seed, 5, 11);
    GET(&y);
    memset(wm, 1, (size_t)n);
    CTX("k_dropout ratio 0 is an exact copy");
    check(dt, y.d, x.d, n, 0);
    check_bytes(dt, m, wm, (size_t)n);
    KCALL(k_dropout, V(y), m, V(x), n, 1, seed, 5, 11);
    GET(&y);
    memset(wm, 0, (size_t)n);
    fill_val(&y2, 0);
    CTX("k_dropout ratio 1 drops everything");
    check(dt, y.d, y2.d, n, 0);
    check_bytes(dt, m, wm, (size_t)n);
    free(m), free(m2), free(wm);
    buf_free(&x), buf_free(&y), buf_free(&y2), buf_free(&g), buf_free(&dx);
}

int main(void)
{
    static void (*const tests[])(int) = {
        test_softmax, test_layernorm, test_batchnorm, test_conv, test_conv_dnnl, test_conv_16, test_pool,
        test_global_avgpool, test_gather, test_gather_elements, test_nd_index, test_philox, test_dropout,
    };
    return ktest_main("kernels_nn_test", tests, sizeof tests / sizeof tests[0]);
}
