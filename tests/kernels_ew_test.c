/* kernels_ew_test.c — checks the elementwise and layout kernels of
 * kernels/c (ew.c, copy.c, Trilu and Range of reduce.c), f32 and f64: unary
 * ops and their gradients, Pow and its derivatives, comparisons, Where, Not,
 * strided copy and accumulate (Slice, Concat, Expand, Tile), Pad, Trilu,
 * Range.  Cast: kernels_cast_test.c.
 *
 * Forwards are compared with naive loops written here (libm in double,
 * unravel every index); backwards with float64 central finite differences
 * of the kernel's own float64 forward (ktest.h), on loss = sum(w y) for
 * random w, with inputs kept away from kinks.
 */
#include "ktest.h"

/* ---- k_unary, k_unary_grad ---------------------------------------------- */

typedef struct {
    int op;
    const char *name;
    double lo, hi, p0, p1;  /* input range, op parameters */
} UnaryCase;

static const UnaryCase unary_cases[] = {
    {K_RELU, "relu", -4, 4, 0, 0},
    {K_TANH, "tanh", -4, 4, 0, 0},
    {K_SIGMOID, "sigmoid", -6, 6, 0, 0},
    {K_SQRT, "sqrt", 0.1, 4, 0, 0},
    {K_RECIPROCAL, "reciprocal", 0.5, 3, 0, 0},
    {K_EXP, "exp", -3, 3, 0, 0},
    {K_LOG, "log", 0.1, 4, 0, 0},
    {K_NEG, "neg", -4, 4, 0, 0},
    {K_ABS, "abs", -4, 4, 0, 0},
    {K_ERF, "erf", -3, 3, 0, 0},
    {K_LEAKY_RELU, "leaky_relu", -4, 4, 0.1, 0},
    {K_ELU, "elu", -4, 4, 0.7, 0},
    {K_SELU, "selu", -4, 4, 1.6732632423543772, 1.0507009873554805},
    {K_CELU, "celu", -4, 4, 1.5, 0},
    {K_THRESHOLDED_RELU, "thresholded_relu", -4, 4, 0.5, 0},
    {K_SOFTSIGN, "softsign", -4, 4, 0, 0},
    {K_CLIP, "clip", -3, 3, -1, 1.5},
    {K_SOFTPLUS, "softplus", -4, 4, 1, 20},
    {K_SOFTPLUS, "softplus beta 2 thr 3", -4, 4, 2, 3},
    {K_COS, "cos", -4, 4, 0, 0},
    {K_SIN, "sin", -4, 4, 0, 0},
    {K_TAN, "tan", -1.3, 1.3, 0, 0},
    {K_ASIN, "asin", -0.9, 0.9, 0, 0},
    {K_ACOS, "acos", -0.9, 0.9, 0, 0},
    {K_ATAN, "atan", -4, 4, 0, 0},
    {K_SINH, "sinh", -3, 3, 0, 0},
    {K_COSH, "cosh", -3, 3, 0, 0},
    {K_ASINH, "asinh", -4, 4, 0, 0},
    {K_ACOSH, "acosh", 1.1, 4, 0, 0},
    {K_ATANH, "atanh", -0.9, 0.9, 0, 0},
    {K_FLOOR, "floor", -4, 4, 0, 0},
    {K_CEIL, "ceil", -4, 4, 0, 0},
    {K_ROUND, "round", -4, 4, 0, 0},
    {K_SIGN, "sign", -4, 4, 0, 0},
    {K_HARD_SIGMOID, "hard_sigmoid", -4, 4, 0.2, 0.5},
    {K_HARD_SIGMOID, "hard_sigmoid 1/6", -5, 5, 1.0 / 6, 0.5},
    {K_HARD_SWISH, "hard_swish", -5, 5, 0, 0},
    {K_GELU, "gelu", -5, 5, 0, 0},
    {K_GELU, "gelu tanh", -5, 5, 1, 0},
};

static double ref_unary(int op, double x, double a, double b)
{
    switch (op) {
    case K_RELU: return x < 0 ? 0 : x;
    case K_TANH: return tanh(x);
    case K_SIGMOID: return 1 / (1 + exp(-x));
    case K_SQRT: return sqrt(x);
    case K_RECIPROCAL: return 1 / x;
    case K_EXP: return exp(x);
    case K_LOG: return log(x);
    case K_NEG: return -x;
    case K_ABS: return fabs(x);
    case K_ERF: return erf(x);
    case K_LEAKY_RELU: return x > 0 ? x : a * x;
    case K_ELU: return x > 0 ? x : a * (exp(x) - 1);
    case K_SELU: return b * (x > 0 ? x : a * (exp(x) - 1));
    case K_CELU: return fmax(0, x) + fmin(0, a * (exp(x / a) - 1));
    case K_THRESHOLDED_RELU: return x > a ? x : 0;
    case K_SOFTSIGN: return x / (1 + fabs(x));
    case K_CLIP: return x != x ? x : fmin(fmax(x, a), b);
    case K_SOFTPLUS: return a * x > b ? x : log1p(exp(a * x)) / a;
    case K_COS: return cos(x);
    case K_SIN: return sin(x);
    case K_TAN: return tan(x);
    case K_ASIN: return asin(x);
    case K_ACOS: return acos(x);
    case K_ATAN: return atan(x);
    case K_SINH: return sinh(x);
    case K_COSH: return cosh(x);
    case K_ASINH: return asinh(x);
    case K_ACOSH: return acosh(x);
    case K_ATANH: return atanh(x);
    case K_FLOOR: return floor(x);
    case K_CEIL: return ceil(x);
    case K_ROUND: return x - floor(x) == 0.5 ? 2 * round(x / 2) : round(x); /* halves to even */
    case K_SIGN: return x > 0 ? 1 : x < 0 ? -1 : x;
    case K_HARD_SIGMOID: return fmin(fmax(a * x + b, 0), 1);
    case K_HARD_SWISH: return x * fmin(fmax(x + 3, 0), 6) / 6;
    case K_GELU: return a == 0 ? 0.5 * x * (1 + erf(x / sqrt(2)))
                               : 0.5 * x * (1 + tanh(0.79788456080286535588 /* sqrt(2/pi) */ * (x + 0.044715 * x * x * x)));
    default: return NAN;
    }
}

typedef struct {
    const UnaryCase *c;
    int64_t n;
} UnaryCtx;

static void unary_fwd(void *ctx, double *const *in, double *y)
{
    const UnaryCtx *u = ctx;
    k_unary_f64(u->c->op, y, in[0], u->n, u->c->p0, u->c->p1);
}

static void test_unary(int dt)
{
    const int64_t n = 301;
    for (size_t k = 0; k < sizeof unary_cases / sizeof unary_cases[0]; k++) {
        const UnaryCase *c = &unary_cases[k];
        Buf x = buf_new(n), y = buf_new(n), w = buf_new(n), dx = buf_new(n), want = buf_new(n);
        fill_rnd(&x, c->lo, c->hi);
        fill_rnd(&w, -1, 1);
        for (int64_t i = 0; i < n; i++) {
            if (fabs(x.d[i]) < 1e-3 || fabs(x.d[i] - c->p0) < 1e-3 || fabs(x.d[i] - c->p1) < 1e-3)
                x.d[i] += 0.01;  /* off the kinks (0, clip bounds) */
            if (c->op == K_SOFTPLUS && fabs(c->p0 * x.d[i] - c->p1) < 1e-3)
                x.d[i] += 0.01;
            double frac = x.d[i] * 2 - floor(x.d[i] * 2); /* floor, ceil, round: off (half) integers */
            if ((c->op == K_FLOOR || c->op == K_CEIL || c->op == K_ROUND) && (frac < 0.02 || frac > 0.98))
                x.d[i] += 0.03;
            double v = c->p0 * x.d[i] + c->p1;
            if (c->op == K_HARD_SIGMOID && (fabs(v) < 1e-2 || fabs(v - 1) < 1e-2))
                x.d[i] += 0.1;
            if (c->op == K_HARD_SWISH && fabs(fabs(x.d[i]) - 3) < 1e-2)
                x.d[i] += 0.05;
            want.d[i] = ref_unary(c->op, x.d[i], dt == F32 ? (float)c->p0 : c->p0,
                                  dt == F32 ? (float)c->p1 : c->p1);  /* rounded as T */
        }
        PUT(&x, &w);
        CTX("k_unary %s", c->name);
        KCALL(k_unary, c->op, V(y), V(x), n, c->p0, c->p1);
        GET(&y);
        check(dt, y.d, want.d, n, tol(dt));

        CTX("k_unary_grad %s vs finite differences", c->name);
        put(dt, &y);
        KCALL(k_unary_grad, c->op, V(dx), V(w), V(x), V(y), n, c->p0, c->p1);
        GET(&dx);
        UnaryCtx u = {c, n};
        double *in[1] = {x.d};
        check_fd(dt, unary_fwd, &u, in, 0, n, w.d, n, dx.d);

        CTX("k_unary %s in place", c->name);
        KCALL(k_unary, c->op, V(x), V(x), n, c->p0, c->p1);
        GET(&x);
        check(dt, x.d, want.d, n, tol(dt));
        buf_free(&x), buf_free(&y), buf_free(&w), buf_free(&dx), buf_free(&want);
    }
}

/* NaN, bounds and saturation cases worked out by hand. */
static void test_unary_special(int dt)
{
    static const double xs[] = {NAN, -INFINITY, INFINITY, -1, 1.5, 0, 2};
    enum { N = 7 };
    Buf x = buf_new(N), y = buf_new(N), dy = buf_new(N), dx = buf_new(N);
    set(&x, xs);
    fill_val(&dy, 1);
    PUT(&x, &dy);
    {   /* clamp(x, -1, 1.5): NaN stays; the grad passes strictly inside the bounds (0 at x = -1 and
         * 1.5, as torch's relu6 / hardtanh and torch 2's clamp), 0 for NaN */
        const double want[N] = {NAN, -1, 1.5, -1, 1.5, 0, 1.5};
        const double wantg[N] = {0, 0, 0, 0, 0, 1, 0};
        CTX("k_unary clip special values");
        KCALL(k_unary, K_CLIP, V(y), V(x), N, -1, 1.5);
        GET(&y);
        check(dt, y.d, want, N, 0);
        CTX("k_unary_grad clip at the bounds");
        KCALL(k_unary_grad, K_CLIP, V(dx), V(dy), V(x), NULL, N, -1, 1.5);
        GET(&dx);
        check(dt, dx.d, wantg, N, 0);
    }
    {   /* clamp(x, min=0) (max absent: INFINITY): 0 at x = 0, +inf passes (torch.clamp_min) */
        const double wantg[N] = {0, 0, 1, 0, 1, 0, 1};
        CTX("k_unary_grad clip without a max");
        KCALL(k_unary_grad, K_CLIP, V(dx), V(dy), V(x), NULL, N, 0, INFINITY);
        GET(&dx);
        check(dt, dx.d, wantg, N, 0);
    }
    {   /* min > max gives max everywhere but NaN (torch.clamp) */
        const double want[N] = {NAN, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
        CTX("k_unary clip min > max");
        KCALL(k_unary, K_CLIP, V(y), V(x), N, 2, 0.5);
        GET(&y);
        check(dt, y.d, want, N, 0);
    }
    {   /* relu passes NaN; its grad reads y */
        const double want[N] = {NAN, 0, INFINITY, 0, 1.5, 0, 2};
        const double wantg[N] = {1, 0, 1, 0, 1, 0, 1};  /* NaN <= 0 is false: dy */
        CTX("k_unary relu special values");
        KCALL(k_unary, K_RELU, V(y), V(x), N, 0, 0);
        GET(&y);
        check(dt, y.d, want, N, 0);
        CTX("k_unary_grad relu from y");
        KCALL(k_unary_grad, K_RELU, V(dx), V(dy), NULL, V(y), N, 0, 0);
        GET(&dx);
        check(dt, dx.d, wantg, N, 0);
    }
    {   /* softplus: above the threshold x itself, exactly */
        const double big[3] = {25, 100, -100}, want[3] = {25, 100, 3.7200759760208356e-44};
        Buf b = buf_new(3), by = buf_new(3);
        set(&b, big);
        put(dt, &b);
        CTX("k_unary softplus past the threshold");
        KCALL(k_unary, K_SOFTPLUS, V(by), V(b), 3, 1, 20);
        get(dt, &by);
        check(dt, by.d, want, 3, tol(dt));
        buf_free(&b), buf_free(&by);
    }
    buf_free(&x), buf_free(&y), buf_free(&dy), buf_free(&dx);
}

/* ---- Pow and its derivatives -------------------------------------------- */

typedef struct {
    int rank;
    const int64_t *shape, *sa, *sb;
} BinCtx;

static void pow_fwd(void *ctx, double *const *in, double *y)
{
    const BinCtx *c = ctx;
    k_binary_f64(K_POW, y, in[0], in[1], c->rank, c->shape, c->sa, c->sb);
}

static void test_pow(int dt)
{
    /* forward: negative bases with integral exponents, as C pow */
    static const double av[] = {-2, -1.5, -0.5, 0, 0.5, 1.5, 2, 3};
    static const double bv[] = {2, 3, -1, 0, 4, -2, 0.5, 2.5};
    int64_t shape[2] = {8, 8}, sa[2] = {1, 0}, sb[2] = {0, 1};
    Buf a = buf_new(8), b = buf_new(8), y = buf_new(64), want = buf_new(64);
    set(&a, av), set(&b, bv);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) want.d[i * 8 + j] = pow(av[i], bv[j]);
    PUT(&a, &b);
    CTX("k_binary pow outer product (negative bases, 0^-1 = inf)");
    KCALL(k_binary, K_POW, V(y), V(a), V(b), 2, shape, sa, sb);
    GET(&y);
    check(dt, y.d, want.d, 64, tol(dt));

    /* POW_DA / POW_DB at their masked points: b == 0 and a == 0, b >= 0 */
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) {
            double A = av[i], B = bv[j];
            want.d[i * 8 + j] = B == 0 ? 0 : B * pow(A, B - 1);
        }
    CTX("k_binary pow_da special points");
    KCALL(k_binary, K_POW_DA, V(y), V(a), V(b), 2, shape, sa, sb);
    GET(&y);
    check(dt, y.d, want.d, 64, tol(dt));
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) {
            double A = av[i], B = bv[j];
            want.d[i * 8 + j] = A == 0 && B >= 0 ? 0 : pow(A, B) * log(A);
        }
    CTX("k_binary pow_db special points");
    KCALL(k_binary, K_POW_DB, V(y), V(a), V(b), 2, shape, sa, sb);
    GET(&y);
    check(dt, y.d, want.d, 64, tol(dt));
    buf_free(&a), buf_free(&b), buf_free(&y), buf_free(&want);

    /* backward recipe with broadcasting: a [5,6], b [6]:
     * da = w POW_DA, db = reduce_sum_to(w POW_DB) vs finite differences */
    int64_t ys[2] = {5, 6}, s_a[2] = {6, 1}, s_b[2] = {0, 1}, bs[2] = {1, 6};
    Buf A = buf_new(30), B = buf_new(6), w = buf_new(30), t = buf_new(30), da = buf_new(30),
        db = buf_new(6);
    fill_rnd(&A, 0.5, 2), fill_rnd(&B, -2, 3), fill_rnd(&w, -1, 1);
    PUT(&A, &B, &w);
    KCALL(k_binary, K_POW_DA, V(t), V(A), V(B), 2, ys, s_a, s_b);
    KCALL(k_binary, K_MUL, V(da), V(t), V(w), 2, ys, s_a, s_a);
    KCALL(k_binary, K_POW_DB, V(t), V(A), V(B), 2, ys, s_a, s_b);
    KCALL(k_binary, K_MUL, V(t), V(t), V(w), 2, ys, s_a, s_a);
    KCALL(k_reduce_sum_to, V(db), V(t), 2, ys, bs);
    GET(&da, &db);
    BinCtx c = {2, ys, s_a, s_b};
    double *in[2] = {A.d, B.d};
    CTX("pow backward da (broadcast) vs finite differences");
    check_fd(dt, pow_fwd, &c, in, 0, 30, w.d, 30, da.d);
    CTX("pow backward db (broadcast) vs finite differences");
    check_fd(dt, pow_fwd, &c, in, 1, 6, w.d, 30, db.d);
    buf_free(&A), buf_free(&B), buf_free(&w), buf_free(&t), buf_free(&da), buf_free(&db);
}

/* ---- comparisons, Not --------------------------------------------------- */

static int ref_cmp(int op, double a, double b)
{
    switch (op) {
    case K_EQ: return a == b;
    case K_LT: return a < b;
    case K_GT: return a > b;
    case K_LE: return a <= b;
    default: return a >= b;
    }
}

static void test_compare(int dt)
{
    /* y [2,3,4] = a [2,3,4] OP b [3,1], values in {-1, 0, 1} so ties occur */
    int64_t shape[3] = {2, 3, 4}, bsh[2] = {3, 1}, sa[3] = {12, 4, 1}, sb[3];
    bcast_strides(3, 2, bsh, sb);
    Buf a = buf_new(24), b = buf_new(3);
    int64_t ai[24], bi[3], idx[3];
    uint8_t y[24], want[24];
    for (int i = 0; i < 24; i++) ai[i] = (int64_t)floor(rnd(-1, 2)), a.d[i] = (double)ai[i];
    for (int i = 0; i < 3; i++) bi[i] = (int64_t)floor(rnd(-1, 2)), b.d[i] = (double)bi[i];
    a.d[5] = NAN;  /* NaN compares false, even to itself */
    PUT(&a, &b);
    for (int op = K_EQ; op <= K_GE; op++) {
        for (int i = 0; i < 24; i++) {
            unravel(i, 3, shape, idx);
            want[i] = (uint8_t)ref_cmp(op, a.d[i], b.d[dot(3, idx, sb)]);
        }
        CTX("k_compare op %d float", op);
        KCALL(k_compare, op, y, V(a), V(b), 3, shape, sa, sb);
        check_bytes(dt, y, want, 24);
        if (dt == F64) {  /* the int64 version, once */
            for (int i = 0; i < 24; i++) {
                unravel(i, 3, shape, idx);
                want[i] = (uint8_t)ref_cmp(op, (double)ai[i], (double)bi[dot(3, idx, sb)]);
            }
            CTX("k_compare op %d int64", op);
            k_compare_i64(op, y, ai, bi, 3, shape, sa, sb);
            check_bytes(dt, y, want, 24);
        }
    }
    static const uint8_t nx[4] = {0, 1, 2, 255}, nwant[4] = {1, 0, 0, 0};
    uint8_t ny[4];
    CTX("k_not");
    k_not(ny, nx, 4);
    check_bytes(dt, ny, nwant, 4);
    buf_free(&a), buf_free(&b);
}

/* ---- int64 index arithmetic -------------------------------------------- */

/* the ops' definitions, written out independently of fused.h */
static int64_t ref_i64(int op, int64_t a, int64_t b)
{
    switch (op) {
    case K_ADD: return (int64_t)((uint64_t)a + (uint64_t)b);
    case K_SUB: return (int64_t)((uint64_t)a - (uint64_t)b);
    case K_MUL: return (int64_t)((uint64_t)a * (uint64_t)b);
    case K_MIN: return a < b ? a : b;
    case K_MAX: return a > b ? a : b;
    default: break;
    }
    if (b == 0)
        return 0;
    if (a == INT64_MIN && b == -1)
        return op == K_DIV ? INT64_MIN : 0;
    int64_t q = a / b, r = a - q * b; /* C: truncating */
    if (op == K_DIV)
        return q;
    if (op == K_FMOD)
        return r;
    return r != 0 && (r < 0) != (b < 0) ? r + b : r; /* Mod: the divisor's sign, as Python's % */
}

static void test_binary_i64(int dt)
{
    if (dt != F64) /* once */
        return;
    /* y [2,3,4] = a [2,3,4] OP b [3,1]: negatives, zero divisors, INT64_MIN / -1, wrapping */
    int64_t shape[3] = {2, 3, 4}, bsh[2] = {3, 1}, sa[3] = {12, 4, 1}, sb[3], idx[3];
    bcast_strides(3, 2, bsh, sb);
    int64_t a[24], b[3] = {-3, 7, -1}, y[24], want[24];
    for (int i = 0; i < 24; i++)
        a[i] = (int64_t)floor(rnd(-20, 20));
    a[3] = INT64_MIN, a[7] = INT64_MAX, a[9] = -7, a[10] = 7;
    static const int ops[] = {K_ADD, K_SUB, K_MUL, K_DIV, K_MIN, K_MAX, K_MOD, K_FMOD};
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        for (int i = 0; i < 24; i++) {
            unravel(i, 3, shape, idx);
            want[i] = ref_i64(ops[k], a[i], b[dot(3, idx, sb)]);
        }
        CTX("k_binary_i64 op %d", ops[k]);
        check_int(dt, k_binary_i64(ops[k], y, a, b, 3, shape, sa, sb), -1);
        check_bytes(dt, y, want, sizeof want);
    }
    /* a zero divisor: the first position it reaches comes back (0 written there); Add does not care */
    b[1] = 0;
    CTX("k_binary_i64 Div by zero");
    check_int(dt, k_binary_i64(K_DIV, y, a, b, 3, shape, sa, sb), 4);
    check_int(dt, y[4] == 0 && y[0] == ref_i64(K_DIV, a[0], b[0]), 1);
    CTX("k_binary_i64 Mod by zero");
    check_int(dt, k_binary_i64(K_MOD, y, a, b, 3, shape, sa, sb), 4);
    CTX("k_binary_i64 Add of zero");
    check_int(dt, k_binary_i64(K_ADD, y, a, b, 3, shape, sa, sb), -1);
    check_int(dt, y[4] == a[4], 1);
}

/* ---- Where -------------------------------------------------------------- */

/* y [2,3,4] = where(c [2,1,4], a [3,1], b [4]) */
static const int64_t wshape[3] = {2, 3, 4}, wcs[3] = {2, 1, 4}, was[2] = {3, 1}, wbs[1] = {4};

static void where_strides(int64_t *sc, int64_t *sa, int64_t *sb)
{
    bcast_strides(3, 3, wcs, sc);
    bcast_strides(3, 2, was, sa);
    bcast_strides(3, 1, wbs, sb);
}

typedef struct {
    const uint8_t *c;
} WhereCtx;

static void where_fwd(void *ctx, double *const *in, double *y)
{
    int64_t sc[3], sa[3], sb[3];
    where_strides(sc, sa, sb);
    k_where(8, y, ((const WhereCtx *)ctx)->c, in[0], in[1], 3, wshape, sc, sa, sb);
}

static void test_where(int dt)
{
    int64_t sc[3], sa[3], sb[3], idx[3];
    uint8_t c[8];
    Buf a = buf_new(3), b = buf_new(4), y = buf_new(24), want = buf_new(24), w = buf_new(24);
    Buf ga = buf_new(24), gb = buf_new(24), ra = buf_new(3), rb = buf_new(4);
    where_strides(sc, sa, sb);
    for (int i = 0; i < 8; i++) c[i] = rnd(0, 1) < 0.5 ? 0 : (uint8_t)(1 + i);  /* any nonzero */
    fill_rnd(&a, -2, 2), fill_rnd(&b, -2, 2), fill_rnd(&w, -1, 1);
    for (int i = 0; i < 24; i++) {
        unravel(i, 3, wshape, idx);
        want.d[i] = c[dot(3, idx, sc)] ? a.d[dot(3, idx, sa)] : b.d[dot(3, idx, sb)];
    }
    PUT(&a, &b, &w);
    CTX("k_where 3-way broadcast");
    k_where(dt == F32 ? 4 : 8, V(y), c, V(a), V(b), 3, wshape, sc, sa, sb);
    GET(&y);
    check(dt, y.d, want.d, 24, 0);

    /* one- and two-byte elements take the same path */
    uint8_t a8[3] = {1, 2, 3}, b8[4] = {10, 20, 30, 40}, y8[24], w8[24];
    uint16_t a16[3] = {1000, 2000, 3000}, b16[4] = {1, 2, 3, 4}, y16[24], w16[24];
    for (int i = 0; i < 24; i++) {
        unravel(i, 3, wshape, idx);
        int t = c[dot(3, idx, sc)] != 0;
        w8[i] = t ? a8[dot(3, idx, sa)] : b8[dot(3, idx, sb)];
        w16[i] = t ? a16[dot(3, idx, sa)] : b16[dot(3, idx, sb)];
    }
    CTX("k_where esize 1, 2");
    k_where(1, y8, c, a8, b8, 3, wshape, sc, sa, sb);
    k_where(2, y16, c, a16, b16, 3, wshape, sc, sa, sb);
    check_bytes(dt, y8, w8, sizeof w8);
    check_bytes(dt, y16, w16, sizeof w16);

    /* backward: where_grad then reduce to each operand's shape */
    int64_t ash[3] = {1, 3, 1}, bsh[3] = {1, 1, 4};
    KCALL(k_where_grad, V(ga), V(gb), c, V(w), 3, wshape, sc);
    KCALL(k_reduce_sum_to, V(ra), V(ga), 3, wshape, ash);
    KCALL(k_reduce_sum_to, V(rb), V(gb), 3, wshape, bsh);
    GET(&ra, &rb);
    WhereCtx wc = {c};
    double *in[2] = {a.d, b.d};
    CTX("k_where_grad da vs finite differences");
    check_fd(dt, where_fwd, &wc, in, 0, 3, w.d, 24, ra.d);
    CTX("k_where_grad db vs finite differences");
    check_fd(dt, where_fwd, &wc, in, 1, 4, w.d, 24, rb.d);
    buf_free(&a), buf_free(&b), buf_free(&y), buf_free(&want), buf_free(&w);
    buf_free(&ga), buf_free(&gb), buf_free(&ra), buf_free(&rb);

    /* cond broadcast along the innermost dim: c [3,1] over [3,4] */
    int64_t sh2[2] = {3, 4}, sc2[2] = {1, 0};
    const uint8_t c2[3] = {1, 0, 1};
    Buf dy = buf_new(12), da = buf_new(12), db = buf_new(12), wa = buf_new(12), wb = buf_new(12);
    fill_rnd(&dy, -1, 1);
    for (int i = 0; i < 12; i++)
        wa.d[i] = c2[i / 4] ? dy.d[i] : 0, wb.d[i] = c2[i / 4] ? 0 : dy.d[i];
    put(dt, &dy);
    CTX("k_where_grad cond broadcast along the last dim");
    KCALL(k_where_grad, V(da), V(db), c2, V(dy), 2, sh2, sc2);
    GET(&da, &db);
    check(dt, da.d, wa.d, 12, 0);
    check(dt, db.d, wb.d, 12, 0);
    buf_free(&dy), buf_free(&da), buf_free(&db), buf_free(&wa), buf_free(&wb);
}

/* ---- strided copy and accumulate ---------------------------------------- */

/* Expected y of a strided copy: y[yoff + i.ys] = x[xoff + i.xs]. */
static void ref_copy(int rank, const int64_t *shape, double *y, int64_t yoff,
                     const int64_t *ys, const double *x, int64_t xoff, const int64_t *xs)
{
    int64_t idx[8];
    for (int64_t i = 0; i < numel(rank, shape); i++) {
        unravel(i, rank, shape, idx);
        y[yoff + dot(rank, idx, ys)] = x[xoff + dot(rank, idx, xs)];
    }
}

typedef struct {
    int rank;
    int64_t shape[4], xoff, xs[4], ys[4], nx, ny;
    const char *name;
} CopyCase;

static const CopyCase copy_cases[] = {
    /* Slice x[1::2, 4:1:-1, ::3] of [4,5,6] */
    {3, {2, 3, 2}, 54, {60, -6, 3}, {6, 2, 1}, 120, 12, "slice, negative step"},
    /* Expand [3,1] -> [2,3,4] */
    {3, {2, 3, 4}, 0, {0, 1, 0}, {12, 4, 1}, 3, 24, "expand"},
    /* Tile [2,3] by [2,3] -> [4,9]: index space [rep0, x0, rep1, x1] */
    {4, {2, 2, 3, 3}, 0, {0, 3, 0, 1}, {18, 9, 3, 1}, 6, 36, "tile"},
    /* a transposed read big enough for OpenMP to split rows */
    {2, {301, 257}, 0, {1, 301}, {257, 1}, 301 * 257, 301 * 257, "transposed read"},
    {0, {0}, 3, {0}, {0}, 5, 1, "rank 0"},
};

static void copy_fwd(void *ctx, double *const *in, double *y)
{
    const CopyCase *c = ctx;
    memset(y, 0, (size_t)c->ny * sizeof(double));
    k_copy_strided(8, c->rank, c->shape, y, 0, c->ys, in[0], c->xoff, c->xs);
}

static void test_copy(int dt)
{
    const int e = dt == F32 ? 4 : 8;
    for (size_t k = 0; k < sizeof copy_cases / sizeof copy_cases[0]; k++) {
        const CopyCase *c = &copy_cases[k];
        Buf x = buf_new(c->nx), y = buf_new(c->ny), want = buf_new(c->ny);
        Buf w = buf_new(c->ny), dx = buf_new(c->nx);
        fill_rnd(&x, -2, 2), fill_rnd(&w, -1, 1);
        ref_copy(c->rank, c->shape, want.d, 0, c->ys, x.d, c->xoff, c->xs);
        PUT(&x, &w);
        CTX("k_copy_strided %s", c->name);
        k_copy_strided(e, c->rank, c->shape, V(y), 0, c->ys, V(x), c->xoff, c->xs);
        GET(&y);
        check(dt, y.d, want.d, c->ny, 0);
        if (c->nx <= 200) {  /* backward: accumulate dy into a zeroed dx */
            CTX("k_accum_strided (backward of %s) vs finite differences", c->name);
            KCALL(k_fill, V(dx), 0, c->nx);
            KCALL(k_accum_strided, c->rank, c->shape, V(dx), c->xoff, c->xs, V(w), 0, c->ys);
            GET(&dx);
            double *in[1] = {x.d};
            check_fd(dt, copy_fwd, (void *)c, in, 0, c->nx, w.d, c->ny, dx.d);
        }
        buf_free(&x), buf_free(&y), buf_free(&want), buf_free(&w), buf_free(&dx);
    }
    /* Concat [2,3,4] and [2,2,4] along axis 1 into [2,5,4]: one call each */
    {
        int64_t s1[3] = {2, 3, 4}, s2[3] = {2, 2, 4}, ys[3] = {20, 4, 1};
        int64_t x1s[3] = {12, 4, 1}, x2s[3] = {8, 4, 1};
        Buf a = buf_new(24), b = buf_new(16), y = buf_new(40), want = buf_new(40);
        fill_rnd(&a, -2, 2), fill_rnd(&b, -2, 2);
        ref_copy(3, s1, want.d, 0, ys, a.d, 0, x1s);
        ref_copy(3, s2, want.d, 12, ys, b.d, 0, x2s);
        PUT(&a, &b);
        CTX("k_copy_strided concat");
        k_copy_strided(e, 3, s1, V(y), 0, ys, V(a), 0, x1s);
        k_copy_strided(e, 3, s2, V(y), 12, ys, V(b), 0, x2s);
        GET(&y);
        check(dt, y.d, want.d, 40, 0);
        buf_free(&a), buf_free(&b), buf_free(&y), buf_free(&want);
    }
    /* one-byte elements, reversed */
    {
        uint8_t x8[10], y8[5], w8[5];
        int64_t sh[1] = {5}, xs[1] = {-2}, ys[1] = {1};
        for (int i = 0; i < 10; i++) x8[i] = (uint8_t)(i * 7);
        for (int i = 0; i < 5; i++) w8[i] = x8[9 - 2 * i];
        CTX("k_copy_strided esize 1, step -2");
        k_copy_strided(1, 1, sh, y8, 0, ys, x8, 9, xs);
        check_bytes(dt, y8, w8, 5);
    }
    /* accumulate with a repeated destination (ys 0) sums: Expand backward */
    {
        int64_t sh[2] = {3, 4}, xs[2] = {4, 1}, ys[2] = {1, 0};
        Buf x = buf_new(12), y = buf_new(3), want = buf_new(3);
        fill_rnd(&x, -2, 2);
        for (int i = 0; i < 12; i++) want.d[i / 4] += x.d[i];
        for (int i = 0; i < 3; i++) y.d[i] = 1, want.d[i] += 1;  /* += onto 1 */
        PUT(&x, &y);
        CTX("k_accum_strided with stride 0 in y");
        KCALL(k_accum_strided, 2, sh, V(y), 0, ys, V(x), 0, xs);
        GET(&y);
        check(dt, y.d, want.d, 3, tol(dt));
        buf_free(&x), buf_free(&y), buf_free(&want);
    }
}

/* ---- Pad ---------------------------------------------------------------- */

/* Source index along a dim of n for padded position j, or -1 (constant). */
static int64_t ref_pad_src(int mode, int64_t j, int64_t n)
{
    if (mode == K_PAD_CONSTANT)
        return j >= 0 && j < n ? j : -1;
    if (mode == K_PAD_EDGE)
        return j < 0 ? 0 : j >= n ? n - 1 : j;
    while (n > 1 && (j < 0 || j >= n))  /* reflect, again and again */
        j = j < 0 ? -j : 2 * (n - 1) - j;
    return n > 1 ? j : 0;
}

typedef struct {
    int mode, rank;
    int64_t xshape[3], pads[6];
} PadCase;

static const PadCase pad_cases[] = {
    {K_PAD_CONSTANT, 2, {3, 4}, {1, 2, 2, 1}},
    {K_PAD_REFLECT, 2, {3, 4}, {1, 2, 2, 1}},
    {K_PAD_EDGE, 2, {3, 4}, {1, 2, 2, 1}},
    {K_PAD_CONSTANT, 2, {3, 4}, {-1, 1, 0, -2}},  /* negative = crop */
    {K_PAD_REFLECT, 2, {3, 4}, {-1, 1, 0, -2}},
    {K_PAD_EDGE, 2, {3, 4}, {0, -3, 1, 2}},
    {K_PAD_REFLECT, 2, {2, 4}, {3, 5, 2, 6}},      /* pads beyond the dim */
    {K_PAD_EDGE, 3, {2, 3, 2}, {1, 0, 2, 0, 2, 1}},
    {K_PAD_REFLECT, 3, {2, 3, 2}, {1, 2, 1, 1, 0, 1}},
    {K_PAD_CONSTANT, 1, {5}, {2, 3}},
    {K_PAD_CONSTANT, 2, {0, 3}, {1, 0, 1, 1}},     /* empty x: all constant */
};

static void pad_fwd(void *ctx, double *const *in, double *y)
{
    const PadCase *c = ctx;
    k_pad_f64(c->mode, y, in[0], c->rank, c->xshape, c->pads, 0.5);
}

static void test_pad(int dt)
{
    for (size_t k = 0; k < sizeof pad_cases / sizeof pad_cases[0]; k++) {
        const PadCase *c = &pad_cases[k];
        int64_t ysh[3], yi[3], xst[3], nx = numel(c->rank, c->xshape);
        for (int d = 0; d < c->rank; d++)
            ysh[d] = c->xshape[d] + c->pads[d] + c->pads[c->rank + d];
        int64_t ny = numel(c->rank, ysh);
        dense_strides(c->rank, c->xshape, xst);
        Buf x = buf_new(nx), y = buf_new(ny), want = buf_new(ny), w = buf_new(ny), dx = buf_new(nx);
        fill_rnd(&x, -2, 2), fill_rnd(&w, -1, 1);
        for (int64_t i = 0; i < ny; i++) {
            int64_t off = 0;
            unravel(i, c->rank, ysh, yi);
            for (int d = 0; d < c->rank && off >= 0; d++) {
                int64_t s = ref_pad_src(c->mode, yi[d] - c->pads[d], c->xshape[d]);
                off = s < 0 ? -1 : off + s * xst[d];
            }
            want.d[i] = off < 0 ? 0.5 : x.d[off];
        }
        PUT(&x, &w);
        CTX("k_pad case %zu (mode %d)", k, c->mode);
        KCALL(k_pad, c->mode, V(y), V(x), c->rank, c->xshape, c->pads, 0.5);
        GET(&y);
        check(dt, y.d, want.d, ny, 0);
        CTX("k_pad_grad case %zu (mode %d) vs finite differences", k, c->mode);
        KCALL(k_pad_grad, c->mode, V(dx), V(w), c->rank, c->xshape, c->pads);
        GET(&dx);
        double *in[1] = {x.d};
        check_fd(dt, pad_fwd, (void *)c, in, 0, nx, w.d, ny, dx.d);
        buf_free(&x), buf_free(&y), buf_free(&want), buf_free(&w), buf_free(&dx);
    }
}

/* ---- k_trilu, k_range ----------------------------------------------------- */

static void trilu_fwd(void *ctx, double *const *in, double *y)
{
    k_trilu(8, 0, y, in[0], 2, 3, 4, *(const int64_t *)ctx);
}

static void test_trilu_range(int dt)
{
    static const int64_t ks[] = {-5, -1, 0, 2, 5};
    const int e = dt == F32 ? 4 : 8;
    Buf x = buf_new(24), y = buf_new(24), want = buf_new(24);
    fill_rnd(&x, -2, 2);
    for (int upper = 0; upper < 2; upper++)
        for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
            for (int i = 0; i < 24; i++) {
                int64_t r = i / 4 % 3, c = i % 4;
                int keep = upper ? c - r >= ks[k] : c - r <= ks[k];
                want.d[i] = keep ? x.d[i] : 0;
            }
            put(dt, &x);
            CTX("k_trilu upper %d k %lld", upper, (long long)ks[k]);
            k_trilu(e, upper, V(y), V(x), 2, 3, 4, ks[k]);
            GET(&y);
            check(dt, y.d, want.d, 24, 0);
            CTX("k_trilu upper %d k %lld in place", upper, (long long)ks[k]);
            k_trilu(e, upper, V(x), V(x), 2, 3, 4, ks[k]);
            GET(&x);
            check(dt, x.d, want.d, 24, 0);
            fill_rnd(&x, -2, 2);
        }
    /* Trilu is its own backward */
    {
        const int64_t k = 1;
        Buf w = buf_new(24), dx = buf_new(24);
        fill_rnd(&w, -1, 1), put(dt, &w);
        k_trilu(e, 0, V(dx), V(w), 2, 3, 4, k);
        GET(&dx);
        double *in[1] = {x.d};
        CTX("k_trilu as its own backward vs finite differences");
        check_fd(dt, trilu_fwd, (void *)&k, in, 0, 24, w.d, 24, dx.d);
        buf_free(&w), buf_free(&dx);
    }
    uint8_t ones[9], tri[9], wt[9] = {1, 0, 0, 1, 1, 0, 1, 1, 1};
    memset(ones, 1, 9);
    CTX("k_trilu bool causal mask");
    k_trilu(1, 0, tri, ones, 1, 3, 3, 0);
    check_bytes(dt, tri, wt, 9);

    Buf r = buf_new(7), rw = buf_new(7);
    for (int i = 0; i < 7; i++) rw.d[i] = dt == F32 ? (float)(1.5 - 0.25 * i) : 1.5 - 0.25 * i;
    CTX("k_range");
    KCALL(k_range, V(r), 1.5, -0.25, 7);
    GET(&r);
    check(dt, r.d, rw.d, 7, 0);
    int64_t ri[5], rwi[5] = {-3, 1, 5, 9, 13};
    CTX("k_range_i64");
    k_range_i64(ri, -3, 4, 5);
    check_bytes(dt, ri, rwi, sizeof ri);
    buf_free(&x), buf_free(&y), buf_free(&want), buf_free(&r), buf_free(&rw);
}

int main(void)
{
    static void (*const tests[])(int) = {
        test_unary, test_unary_special, test_pow, test_compare, test_binary_i64, test_where,
        test_copy, test_pad, test_trilu_range,
    };
    return ktest_main("kernels_ew_test", tests, sizeof tests / sizeof tests[0]);
}
