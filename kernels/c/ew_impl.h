/* ew_impl.h — typed bodies of ew.c, included once per dtype with
 * T (element type), S (name suffix) and KM(f) (libm name of f for T: expf or
 * exp) defined.  No include guard on purpose. */

/* ---- k_binary ---------------------------------------------------------- */

/* a^b as torch computes it: exponents 2 and 3 by multiplication. */
static inline T KFN(pow_t)(T a, T b)
{
    if (b == 2)
        return a * a;
    if (b == 3)
        return a * a * a;
    return KM(pow)(a, b);
}

static inline T KFN(pow_da)(T a, T b)
{
    return b == 0 ? (T)0 : b * KFN(pow_t)(a, b - 1);
}

static inline T KFN(pow_db)(T a, T b)
{
    return a == 0 && b >= 0 ? (T)0 : KFN(pow_t)(a, b) * KM(log)(a);
}

static inline T KFN(add)(T a, T b) { return a + b; }
static inline T KFN(sub)(T a, T b) { return a - b; }
static inline T KFN(mul)(T a, T b) { return a * b; }
static inline T KFN(div)(T a, T b) { return a / b; }

/* One innermost row: y[i] = F(a[i*ia], b[i*ib]), with the contiguous and
 * broadcast stride patterns written out so the compiler vectorises them. */
#define K_ROW(F)                                                            \
    do {                                                                    \
        if (ia == 1 && ib == 1) {                                           \
            for (int64_t i = 0; i < n; i++) y[i] = F(a[i], b[i]);           \
        } else if (ia == 1 && ib == 0) {                                    \
            const T bv = b[0];                                              \
            for (int64_t i = 0; i < n; i++) y[i] = F(a[i], bv);             \
        } else if (ia == 0 && ib == 1) {                                    \
            const T av = a[0];                                              \
            for (int64_t i = 0; i < n; i++) y[i] = F(av, b[i]);             \
        } else {                                                            \
            for (int64_t i = 0; i < n; i++) y[i] = F(a[i * ia], b[i * ib]); \
        }                                                                   \
    } while (0)

static void KFN(binary_row)(int op, T *y, const T *a, const T *b, int64_t n,
                            int64_t ia, int64_t ib)
{
    switch (op) {
    case K_ADD: K_ROW(KFN(add)); break;
    case K_SUB: K_ROW(KFN(sub)); break;
    case K_MUL: K_ROW(KFN(mul)); break;
    case K_DIV: K_ROW(KFN(div)); break;
    case K_POW: K_ROW(KFN(pow_t)); break;
    case K_POW_DA: K_ROW(KFN(pow_da)); break;
    case K_POW_DB: K_ROW(KFN(pow_db)); break;
    default: die("k_binary: unknown op");
    }
}
#undef K_ROW

typedef struct {
    int op;
    T *y;
    const T *a, *b;
    Walk outer;           /* every dim but the innermost */
    int64_t n, ia, ib;    /* the innermost dim */
} KFN(BinaryJob);

/* Computes y[lo..hi) of the dense output. */
static void KFN(binary_range)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(BinaryJob) *j = ctx;
    Walk w = j->outer;
    int64_t col = lo % j->n;
    walk_seek(&w, lo / j->n);
    for (int64_t pos = lo; pos < hi; col = 0, walk_next(&w)) {
        int64_t len = min64(j->n - col, hi - pos);
        KFN(binary_row)(j->op, j->y + pos, j->a + w.oa + col * j->ia,
                        j->b + w.ob + col * j->ib, len, j->ia, j->ib);
        pos += len;
    }
}

void KFN(k_binary)(int op, T *y, const T *a, const T *b, int rank,
                   const int64_t *shape, const int64_t *sa, const int64_t *sb)
{
    KFN(BinaryJob) j = {.op = op, .y = y, .a = a, .b = b};
    int64_t total = numel(rank, shape);
    if (total == 0)
        return;
    for (int d = 0; d < rank; d++)
        walk_push(&j.outer, shape[d], sa[d], sb[d]);
    j.n = walk_pop(&j.outer, &j.ia, &j.ib);
    par_range(KFN(binary_range), &j, total, 1);
}

/* ---- k_unary ------------------------------------------------------------ */

/* torch.nn.functional.softplus: beta x > threshold ? x : log1p(exp(beta x)) / beta */
static void KFN(softplus)(T *y, const T *x, int64_t n, T beta, T thr)
{
    for (int64_t i = 0; i < n; i++) {
        T bx = x[i] * beta;
        y[i] = bx > thr ? x[i] : KM(log1p)(KM(exp)(bx)) / beta;
    }
}

void KFN(k_unary)(int op, T *y, const T *x, int64_t n, double p0, double p1)
{
    const T a = (T)p0, b = (T)p1;
    switch (op) {
    case K_RELU:  /* written so NaN passes through, as torch.relu does */
        for (int64_t i = 0; i < n; i++) y[i] = x[i] < 0 ? (T)0 : x[i];
        break;
    case K_TANH:
        for (int64_t i = 0; i < n; i++) y[i] = KM(tanh)(x[i]);
        break;
    case K_SIGMOID:  /* exp(-x) overflows to inf for x << 0: 1/inf = 0, fine */
        for (int64_t i = 0; i < n; i++) y[i] = (T)1 / ((T)1 + KM(exp)(-x[i]));
        break;
    case K_SQRT: for (int64_t i = 0; i < n; i++) y[i] = KM(sqrt)(x[i]); break;
    case K_RECIPROCAL: for (int64_t i = 0; i < n; i++) y[i] = (T)1 / x[i]; break;
    case K_EXP: for (int64_t i = 0; i < n; i++) y[i] = KM(exp)(x[i]); break;
    case K_LOG: for (int64_t i = 0; i < n; i++) y[i] = KM(log)(x[i]); break;
    case K_NEG: for (int64_t i = 0; i < n; i++) y[i] = -x[i]; break;
    case K_ABS: for (int64_t i = 0; i < n; i++) y[i] = KM(fabs)(x[i]); break;
    case K_ERF: for (int64_t i = 0; i < n; i++) y[i] = KM(erf)(x[i]); break;
    case K_LEAKY_RELU:
        for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : x[i] * a;
        break;
    case K_CLIP:  /* comparisons with NaN are false: NaN stays */
        for (int64_t i = 0; i < n; i++) {
            T v = x[i] < a ? a : x[i];
            y[i] = v > b ? b : v;
        }
        break;
    case K_SOFTPLUS: KFN(softplus)(y, x, n, a, b); break;
    default: die("k_unary: unknown op");
    }
}

/* ---- k_unary_grad ------------------------------------------------------- */

/* The rules whose derivative is a function of the input x. */
static void KFN(unary_grad_x)(int op, T *dx, const T *dy, const T *x, int64_t n,
                              T a, T b)
{
    const T two_over_sqrt_pi = (T)1.1283791670955125739;
    switch (op) {
    case K_LOG: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] / x[i]; break;
    case K_ABS:
        for (int64_t i = 0; i < n; i++)
            dx[i] = x[i] > 0 ? dy[i] : x[i] < 0 ? -dy[i] : (T)0;
        break;
    case K_ERF:
        for (int64_t i = 0; i < n; i++)
            dx[i] = dy[i] * two_over_sqrt_pi * KM(exp)(-x[i] * x[i]);
        break;
    case K_LEAKY_RELU:
        for (int64_t i = 0; i < n; i++) dx[i] = x[i] > 0 ? dy[i] : dy[i] * a;
        break;
    case K_CLIP:
        for (int64_t i = 0; i < n; i++) dx[i] = x[i] >= a && x[i] <= b ? dy[i] : (T)0;
        break;
    case K_SOFTPLUS:
        for (int64_t i = 0; i < n; i++) {
            T bx = x[i] * a, z = KM(exp)(bx);
            dx[i] = bx > b ? dy[i] : dy[i] * z / (z + (T)1);
        }
        break;
    default: die("k_unary_grad: unknown op");
    }
}

/* Derivatives in PyTorch's operation order: threshold_backward (y <= 0 -> 0),
 * tanh_backward dy (1 - y y), sigmoid_backward dy (1 - y) y, sqrt dy / (2 y),
 * reciprocal -dy (y y), exp dy y; the rest read x (unary_grad_x). */
void KFN(k_unary_grad)(int op, T *dx, const T *dy, const T *x, const T *y,
                       int64_t n, double p0, double p1)
{
    switch (op) {
    case K_RELU:
        for (int64_t i = 0; i < n; i++) dx[i] = y[i] <= 0 ? (T)0 : dy[i];
        break;
    case K_TANH:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * ((T)1 - y[i] * y[i]);
        break;
    case K_SIGMOID:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * ((T)1 - y[i]) * y[i];
        break;
    case K_SQRT:
        for (int64_t i = 0; i < n; i++) dx[i] = dy[i] / ((T)2 * y[i]);
        break;
    case K_RECIPROCAL:
        for (int64_t i = 0; i < n; i++) dx[i] = -dy[i] * (y[i] * y[i]);
        break;
    case K_EXP: for (int64_t i = 0; i < n; i++) dx[i] = dy[i] * y[i]; break;
    case K_NEG: for (int64_t i = 0; i < n; i++) dx[i] = -dy[i]; break;
    default: KFN(unary_grad_x)(op, dx, dy, x, n, (T)p0, (T)p1);
    }
}

/* ---- k_scale, k_fill ---------------------------------------------------- */

/* alpha is rounded to T first, as a float tensor times a Python scalar is. */
void KFN(k_scale)(T *y, const T *x, double alpha, int64_t n)
{
    const T s = (T)alpha;
    for (int64_t i = 0; i < n; i++)
        y[i] = s * x[i];
}

void KFN(k_fill)(T *y, double v, int64_t n)
{
    const T t = (T)v;
    for (int64_t i = 0; i < n; i++)
        y[i] = t;
}

/* ---- k_where_grad ------------------------------------------------------- */

void KFN(k_where_grad)(T *da, T *db, const uint8_t *c, const T *dy, int rank,
                       const int64_t *shape, const int64_t *sc)
{
    Walk w = {0};
    int64_t ic, unused, n, pos = 0;
    if (numel(rank, shape) == 0)
        return;
    for (int d = 0; d < rank; d++)
        walk_push(&w, shape[d], sc[d], 0);
    n = walk_pop(&w, &ic, &unused);
    walk_seek(&w, 0);
    do {
        const uint8_t *cr = c + w.oa;
        for (int64_t i = 0; i < n; i++) {
            if (da)
                da[pos + i] = cr[i * ic] ? dy[pos + i] : (T)0;
            if (db)
                db[pos + i] = cr[i * ic] ? (T)0 : dy[pos + i];
        }
        pos += n;
    } while (walk_next(&w));
}
