/* kernels_ew_test.c — checks the elementwise and layout kernels of
 * kernels/c (ew.c, copy.c, Trilu and Range of reduce.c), f32 and f64: unary
 * ops and their gradients, Pow and its derivatives, comparisons, Where, Not,
 * Cast, strided copy and accumulate (Slice, Concat, Expand, Tile), Pad,
 * Trilu, Range.
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

/* ---- Cast --------------------------------------------------------------- */

/* One source value, held as what the source dtype stores. */
typedef struct {
    double f;
    int64_t i;
} Val;

static int64_t ref_f2i(double v, double lo, double hi)
{
    if (isnan(v)) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return hi > 9e18 ? INT64_MAX : (int64_t)hi;
    return (int64_t)trunc(v);
}

/* Writes element k of the expected `to` array for source value v. */
static void ref_cast(int to, int from_float, Val v, void *y, int k)
{
    double f = from_float ? v.f : (double)v.i;
    switch (to) {
    case K_DT_F32: ((float *)y)[k] = from_float ? (float)v.f : (float)v.i; break;
    case K_DT_F64: ((double *)y)[k] = f; break;
    case K_DT_I64:
        ((int64_t *)y)[k] = from_float ? ref_f2i(f, -9223372036854775808.0, 9.3e18) : v.i;
        break;
    case K_DT_I32:
        ((int32_t *)y)[k] = from_float ? (int32_t)ref_f2i(f, -2147483648.0, 2147483647.0)
                                       : (int32_t)(uint32_t)(uint64_t)v.i;
        break;
    case K_DT_U8:
        ((uint8_t *)y)[k] = from_float ? (uint8_t)ref_f2i(f, 0, 255) : (uint8_t)(uint64_t)v.i;
        break;
    default: ((uint8_t *)y)[k] = from_float ? f != 0 : v.i != 0;
    }
}

static void store(int dt, void *x, int k, Val v)
{
    switch (dt) {
    case K_DT_F32: ((float *)x)[k] = (float)v.f; break;
    case K_DT_F64: ((double *)x)[k] = v.f; break;
    case K_DT_I64: ((int64_t *)x)[k] = v.i; break;
    case K_DT_I32: ((int32_t *)x)[k] = (int32_t)v.i; break;
    default: ((uint8_t *)x)[k] = (uint8_t)v.i;
    }
}

static void test_cast(int dt)
{
    static const double fv[] = {0, 1.5, -1.5, 2.75, -2.75, 255.9, 256.5, -300, 3e9, -3e9,
                                1e20, -1e20, NAN, INFINITY, -INFINITY, 0.1};
    static const int64_t iv[] = {0, 1, -1, 127, 255, 256, -129, 2147483648LL, -2147483649LL,
                                 (1LL << 40) + 3, INT64_MIN, INT64_MAX, (1LL << 53) + 1};
    static const int size[] = {4, 8, 8, 4, 1, 1};
    enum { NV = 16 };
    if (dt == F32)
        return;  /* dtype-generic: run once */
    for (int from = K_DT_F32; from <= K_DT_BOOL; from++)
        for (int to = K_DT_F32; to <= K_DT_BOOL; to++) {
            int ff = from <= K_DT_F64, n = ff ? 16 : 13;
            uint64_t x[NV], y[NV], want[NV];
            memset(y, 0, sizeof y), memset(want, 0, sizeof want);
            for (int k = 0; k < n; k++) {
                Val v = {fv[k], iv[k % 13]};
                if (from == K_DT_I32) v.i = (int32_t)(uint32_t)(uint64_t)v.i;
                if (from == K_DT_U8) v.i = (uint8_t)v.i;
                if (from == K_DT_BOOL) v.i = v.i != 0;
                if (from == K_DT_F32) v.f = (float)v.f;
                store(from, x, k, v);
                ref_cast(to, ff, v, want, k);
            }
            CTX("k_cast %d -> %d", from, to);
            k_cast(to, y, from, x, n);
            check_bytes(dt, y, want, (size_t)(n * size[to]));
        }
    /* in place with equal sizes: f32 -> i32 */
    static const float xv[4] = {1.5f, -2.5f, NAN, 7.0f};
    static const int32_t wi[4] = {1, -2, 0, 7};
    void *xf = xalloc(4, sizeof(float));  /* allocated: no declared type to alias */
    memcpy(xf, xv, sizeof xv);
    CTX("k_cast in place f32 -> i32");
    k_cast(K_DT_I32, xf, K_DT_F32, xf, 4);
    check_bytes(dt, xf, wi, sizeof wi);
    free(xf);
}

/* The narrow integers (int8 .. uint64) a model's tensors may hold: to and
 * from every integer and float32 / float64.  Integer -> integer keeps the
 * low bits; float -> integer truncates and saturates to the target's range
 * (NaN 0); uint64 reads unsigned (2^64 - 1 -> float is 1.8e19, not -1). */
typedef struct {
    int dt, size, is_signed;
} NarrowDt;
static const NarrowDt narrow_dts[] = {
    {K_DT_I8, 1, 1}, {K_DT_U8, 1, 0}, {K_DT_I16, 2, 1}, {K_DT_U16, 2, 0}, {K_DT_I32, 4, 1},
    {K_DT_U32, 4, 0}, {K_DT_I64, 8, 1}, {K_DT_U64, 8, 0},
};

/* the value of the size-byte integer at p (little-endian bits, signed or not), as long double */
static long double narrow_value(const NarrowDt *d, const void *p)
{
    uint64_t u = 0;
    memcpy(&u, p, d->size < 8 ? (size_t)d->size : 8);
    int bits = d->size * 8;
    if (d->is_signed && bits < 64 && (u >> (bits - 1)) & 1)
        return (long double)(int64_t)(u | (~0ULL << bits));
    if (d->is_signed && bits == 64)
        return (long double)(int64_t)u;
    return (long double)u;
}

static void test_cast_narrow(int dt)
{
    static const double fv[] = {0, 1.7, -1.7, 127.5, -128.5, 255.9, 300, -40000, 70000, 5e9, -5e9, 1.9e19, -1e20,
                                NAN, INFINITY, -INFINITY};
    enum { NV = 16 };
    if (dt != F64)
        return;  /* dtype-generic: run once */
    uint64_t bits[NV];
    for (int k = 0; k < NV; k++) /* every byte pattern width: small, sign bits, wide */
        bits[k] = k < 8 ? (uint64_t)k * 0x9E3779B97F4A7C15ULL : (0x80ULL << (8 * (k % 8))) + (uint64_t)k;
    for (size_t a = 0; a < sizeof narrow_dts / sizeof *narrow_dts; a++) {
        const NarrowDt *from = &narrow_dts[a];
        uint8_t x[NV * 8];
        for (int k = 0; k < NV; k++)
            memcpy(x + k * from->size, &bits[k], (size_t)from->size);
        for (size_t b = 0; b < sizeof narrow_dts / sizeof *narrow_dts; b++) { /* integer -> integer: low bits */
            const NarrowDt *to = &narrow_dts[b];
            uint8_t y[NV * 8], want[NV * 8];
            for (int k = 0; k < NV; k++)
                memcpy(want + k * to->size, &bits[k], (size_t)to->size);
            if (from->size < to->size) /* widening extends the source's sign (or zero) */
                for (int k = 0; k < NV; k++) {
                    long double v = narrow_value(from, x + k * from->size);
                    int64_t w = v < 0 ? (int64_t)v : (int64_t)(uint64_t)v;
                    memcpy(want + k * to->size, &w, (size_t)to->size);
                }
            CTX("k_cast %d -> %d", from->dt, to->dt);
            k_cast(to->dt, y, from->dt, x, NV);
            check_bytes(dt, y, want, (size_t)(NV * to->size));
        }
        double yd[NV], wd[NV]; /* integer -> float64: exact below 2^53, uint64 unsigned */
        for (int k = 0; k < NV; k++)
            wd[k] = (double)narrow_value(from, x + k * from->size);
        CTX("k_cast %d -> f64", from->dt);
        k_cast(K_DT_F64, yd, from->dt, x, NV);
        check_bytes(dt, yd, wd, sizeof wd);
        uint8_t y[NV * 8], want[NV * 8]; /* float64 -> integer: truncated, saturated */
        for (int k = 0; k < NV; k++) {
            long double lo = narrow_value(from, &(uint64_t){from->is_signed ? 1ULL << (from->size * 8 - 1) : 0});
            long double hi = narrow_value(from, &(uint64_t){from->is_signed ? ~0ULL >> (65 - from->size * 8)
                                                                            : ~0ULL >> (64 - from->size * 8)});
            long double v = isnan(fv[k]) ? 0 : fv[k] < lo ? lo : fv[k] > hi ? hi : truncl(fv[k]);
            uint64_t w = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
            memcpy(want + k * from->size, &w, (size_t)from->size);
        }
        CTX("k_cast f64 -> %d", from->dt);
        k_cast(from->dt, y, K_DT_F64, fv, NV);
        check_bytes(dt, y, want, (size_t)(NV * from->size));
    }
}

/* bfloat16: rounding to nearest even on the bits, NaN, infinities, overflow,
 * subnormals, signed zero; and the other dtypes through float */
static void test_cast_bf16(int dt)
{
    static const uint32_t f32_bits[] = {
        0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x80000000, 0x7F800000, 0xFF800000,
        0x7FC00000, 0x7F800001, 0xFFC00001, 0x7F7FFFFF, 0x7F7F8000, 0x00000001, 0x00008000, 0x00018000,
        0xBF808000};
    static const uint16_t want16[] = {
        0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x8000, 0x7F80, 0xFF80,
        0x7FC0, 0x7FC0, 0xFFC0, 0x7F80, 0x7F80, 0x0000, 0x0000, 0x0002,
        0xBF80};
    enum { N = sizeof f32_bits / sizeof f32_bits[0] };
    if (dt == F32)
        return;  /* dtype-generic: run once */
    float *x = xalloc(N, sizeof(float));
    uint16_t *y = xalloc(N, 2);
    memcpy(x, f32_bits, sizeof f32_bits);
    CTX("k_cast f32 -> bf16");
    k_cast(K_DT_BF16, y, K_DT_F32, x, N);
    check_bytes(dt, y, want16, sizeof want16);
    /* back: exact, the bits in the top half */
    uint32_t back[N], wantb[N];
    for (int i = 0; i < N; i++)
        wantb[i] = (uint32_t)want16[i] << 16;
    CTX("k_cast bf16 -> f32");
    k_cast(K_DT_F32, back, K_DT_BF16, y, N);
    check_bytes(dt, back, wantb, sizeof wantb);
    /* k_bf16_round (the fused loops' rounding) = the cast there and back, bit for bit, and k_bf16_bits of it
     * (their store of a rounded value, their tables' index) = the cast: every high half with low halves at and
     * around the ties, the ends and one drawn per high half */
    CTX("k_bf16_round = k_bf16_to_f32(k_bf16_from_f32), k_bf16_bits(k_bf16_round) = k_bf16_from_f32");
    uint32_t seed = 1, bad = 0;
    for (uint32_t hi = 0; hi < 0x10000u; hi++) {
        seed = seed * 1664525u + 1013904223u;
        const uint32_t lows[] = {0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, seed >> 16};
        for (int k = 0; k < 7; k++) {
            union { uint32_t u; float f; } v = {hi << 16 | lows[k]}, r, w;
            r.f = k_bf16_round(v.f);
            w.f = k_bf16_to_f32(k_bf16_from_f32(v.f));
            bad += r.u != w.u || k_bf16_bits(r.f) != k_bf16_from_f32(v.f);
        }
    }
    check_bytes(dt, &bad, &(uint32_t){0}, sizeof bad);
    /* double goes through float: 1 + 2^-8 + 2^-30 is 1 + 2^-8 in float, a tie, so 1 */
    double d[3] = {1.0 + 0x1p-8 + 0x1p-30, -3.0, 1e300};
    uint16_t wd[3] = {0x3F80, 0xC040, 0x7F80}, yd[3];
    CTX("k_cast f64 -> bf16");
    k_cast(K_DT_BF16, yd, K_DT_F64, d, 3);
    check_bytes(dt, yd, wd, sizeof wd);
    /* integers through float; to integers truncating as from float */
    int64_t iv[3] = {257, -1, (1LL << 40) + 1}, back_i[3], want_i[3] = {256, -1, 1LL << 40};
    uint16_t yi[3];
    CTX("k_cast i64 -> bf16 -> i64");
    k_cast(K_DT_BF16, yi, K_DT_I64, iv, 3);
    k_cast(K_DT_I64, back_i, K_DT_BF16, yi, 3);
    check_bytes(dt, back_i, want_i, sizeof want_i);
    /* to bool: NaN and -0 */
    uint16_t bv[3] = {0x7FC0, 0x8000, 0x3F80};
    uint8_t yb[3], wb[3] = {1, 0, 1};
    CTX("k_cast bf16 -> bool");
    k_cast(K_DT_BOOL, yb, K_DT_BF16, bv, 3);
    check_bytes(dt, yb, wb, sizeof wb);
    free(x), free(y);
}

/* float16: round to nearest even on the bits (ties both ways), overflow to
 * infinity from 65520 on, the subnormal range (ties, the largest rounding up
 * to the smallest normal, 2^-25 to zero), signed zeros, NaNs; back to float
 * exactly for every one of the 65536 values; the other dtypes through float */
static void test_cast_f16(int dt)
{
    static const uint32_t f32_bits[] = {
        0x3F800000, 0x3F801000, 0x3F803000, 0x3F801001, 0x3F800FFF, /* 1; 1 + half an ulp: ties, near-ties */
        0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, /* -0, +-inf, +-NaN */
        0x7F7FFFFF, 0x477FE000, 0x477FEFFF, 0x477FF000, 0xC77FF000, /* float max; 65504; just below / at 65520 */
        0x38800000, 0x387FC000, 0x387FF000,                         /* 2^-14; the largest subnormal; rounds up */
        0x33800000, 0x33000000, 0x33000001, 0xB3400000, 0x33C00000, /* 2^-24; 2^-25 (tie to 0); subnormal ties */
        0x3A500000, 0x40490FDB};                                    /* 0.00079345703; pi */
    static const uint16_t want16[] = {
        0x3C00, 0x3C00, 0x3C02, 0x3C01, 0x3C00,
        0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00,
        0x7C00, 0x7BFF, 0x7BFF, 0x7C00, 0xFC00,
        0x0400, 0x03FF, 0x0400,
        0x0001, 0x0000, 0x0001, 0x8001, 0x0002,
        0x1280, 0x4248};
    enum { N = sizeof f32_bits / sizeof f32_bits[0] };
    if (dt == F32)
        return; /* dtype-generic: run once */
    float *x = xalloc(N, sizeof(float));
    uint16_t *y = xalloc(N, 2);
    memcpy(x, f32_bits, sizeof f32_bits);
    CTX("k_cast f32 -> f16");
    k_cast(K_DT_F16, y, K_DT_F32, x, N);
    check_bytes(dt, y, want16, sizeof want16);
    CTX("k_f16_from_f32 on the same values");
    for (int i = 0; i < N; i++)
        y[i] = k_f16_from_f32(x[i]);
    check_bytes(dt, y, want16, sizeof want16);
    /* every float16 back to float and again: the same bits (NaNs quieted, sign kept) */
    uint16_t *h = xalloc(65536, 2), *h2 = xalloc(65536, 2);
    float *w = xalloc(65536, sizeof(float));
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    k_cast(K_DT_F32, w, K_DT_F16, h, 65536);
    k_cast(K_DT_F16, h2, K_DT_F32, w, 65536);
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        int nan = (i & 0x7C00) == 0x7C00 && (i & 0x3FF);
        bad += nan ? h2[i] != (uint16_t)(i | 0x200) || !isnan(w[i]) : h2[i] != i;
    }
    CTX("every f16 -> f32 -> f16 gives it back");
    check_int(dt, bad, 0);
    CTX("f16 -> f32 on 1, 65504, 2^-24, -0, inf");
    float wv[5] = {w[0x3C00], w[0x7BFF], w[0x0001], w[0x8000], w[0x7C00]};
    check_int(dt, wv[0] == 1.0f && wv[1] == 65504.0f && wv[2] == 0x1p-24f && wv[3] == 0.0f && signbit(wv[3]) &&
                      isinf(wv[4]), 1);
    /* double goes through float: 1 + 2^-11 + 2^-40 is 1 + 2^-11 in float, a tie, so 1 */
    double d[3] = {1.0 + 0x1p-11 + 0x1p-40, -3.0, 1e300};
    uint16_t wd[3] = {0x3C00, 0xC200, 0x7C00}, yd[3];
    CTX("k_cast f64 -> f16");
    k_cast(K_DT_F16, yd, K_DT_F64, d, 3);
    check_bytes(dt, yd, wd, sizeof wd);
    /* integers through float; to integers truncating as from float; 2049 rounds to 2048 */
    int64_t iv[3] = {2049, -1, 100000}, back_i[3], want_i[3] = {2048, -1, INT64_MAX};
    uint16_t yi[3];
    CTX("k_cast i64 -> f16 -> i64 (100000 overflows to inf, saturating back)");
    k_cast(K_DT_F16, yi, K_DT_I64, iv, 3);
    k_cast(K_DT_I64, back_i, K_DT_F16, yi, 3);
    check_bytes(dt, back_i, want_i, sizeof want_i);
    uint16_t bv[3] = {0x7E00, 0x8000, 0x3C00};
    uint8_t yb[3], wb[3] = {1, 0, 1};
    CTX("k_cast f16 -> bool");
    k_cast(K_DT_BOOL, yb, K_DT_F16, bv, 3);
    check_bytes(dt, yb, wb, sizeof wb);
    free(x), free(y), free(h), free(h2), free(w);
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
        test_unary, test_unary_special, test_pow, test_compare, test_binary_i64, test_where, test_cast, test_cast_narrow, test_cast_bf16, test_cast_f16,
        test_copy, test_pad, test_trilu_range,
    };
    return ktest_main("kernels_ew_test", tests, sizeof tests / sizeof tests[0]);
}
