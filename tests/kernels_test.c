/* kernels_test.c — checks every reference kernel of kernels/c, f32 and f64.
 *
 * How it works.  Each test is written once and run for both dtypes.  A Buf
 * holds a tensor as doubles (the f64 kernels work on them directly) plus a
 * float shadow for the f32 kernels; inputs are drawn as floats so both dtypes
 * see identical values.  Expected values come from naive loops written here
 * (unravel every index, no stride merging, no BLAS) or from constants worked
 * out by hand in the comments.  Every failing check prints what it was,
 * which element, expected and actual; main returns 1 if any check failed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

enum { F32, F64 };
static const char *const dtname[] = {"f32", "f64"};

static int checks, failures;
static char what[256];  /* names the check in progress, for failure lines */

#define CTX(...) snprintf(what, sizeof what, __VA_ARGS__)

/* got ~ want elementwise: |got - want| <= tol (1 + |want|); tol 0 = exact.
 * NaN only matches NaN. */
static void check(int dt, const double *got, const double *want, int64_t n, double tol)
{
    checks++;
    for (int64_t i = 0; i < n; i++) {
        int ok = isnan(want[i]) ? isnan(got[i])
                                : fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]));
        if (!ok) {
            printf("FAIL %s [%s] at %lld: expected %.17g, actual %.17g\n", what,
                   dtname[dt], (long long)i, want[i], got[i]);
            failures++;
            return;
        }
    }
}

static void check_int(int dt, int64_t got, int64_t want)
{
    checks++;
    if (got != want) {
        printf("FAIL %s [%s]: expected %lld, actual %lld\n", what, dtname[dt],
               (long long)want, (long long)got);
        failures++;
    }
}

/* default tolerance: a few roundings of the dtype */
static double tol(int dt) { return dt == F32 ? 1e-5 : 1e-12; }

/* ---- buffers ------------------------------------------------------------ */

typedef struct {
    int64_t n;
    double *d;  /* values; the f64 kernels' storage */
    float *f;   /* the f32 kernels' storage */
} Buf;

static Buf buf_new(int64_t n)
{
    Buf b = {n, calloc((size_t)n + 1, sizeof(double)), calloc((size_t)n + 1, sizeof(float))};
    if (!b.d || !b.f) {
        fprintf(stderr, "kernels_test: out of memory\n");
        exit(2);
    }
    return b;
}

static void buf_free(Buf *b)
{
    free(b->d);
    free(b->f);
}

/* before an f32 call: copy values into the float shadow */
static void put(int dt, Buf *b)
{
    if (dt == F32)
        for (int64_t i = 0; i < b->n; i++) b->f[i] = (float)b->d[i];
}

/* after an f32 call: read results back */
static void get(int dt, Buf *b)
{
    if (dt == F32)
        for (int64_t i = 0; i < b->n; i++) b->d[i] = b->f[i];
}

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

/* uniform in [lo, hi), rounded to float so both dtypes get the same input */
static double rnd(double lo, double hi)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    double u = (double)((rng_state * 0x2545F4914F6CDD1Du) >> 11) / 9007199254740992.0;
    return (float)(lo + (hi - lo) * u);
}

static void fill_rnd(Buf *b, double lo, double hi)
{
    for (int64_t i = 0; i < b->n; i++) b->d[i] = rnd(lo, hi);
}

static void fill_val(Buf *b, double v)
{
    for (int64_t i = 0; i < b->n; i++) b->d[i] = v;
}

static void set(Buf *b, const double *v)
{
    memcpy(b->d, v, (size_t)b->n * sizeof(double));
}

/* ---- index helpers for the naive loops ---------------------------------- */

static int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    return n;
}

/* idx = row-major unravel of lin over shape */
static void unravel(int64_t lin, int rank, const int64_t *shape, int64_t *idx)
{
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = lin % shape[d];
        lin /= shape[d];
    }
}

static int64_t dot(int rank, const int64_t *idx, const int64_t *st)
{
    int64_t o = 0;
    for (int d = 0; d < rank; d++) o += idx[d] * st[d];
    return o;
}

static void dense_strides(int rank, const int64_t *shape, int64_t *st)
{
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; d--) {
        st[d] = s;
        s *= shape[d];
    }
}

/* numpy broadcasting: strides of x (rank rx, right-aligned) over y's dims */
static void bcast_strides(int ry, int rx, const int64_t *xshape, int64_t *st)
{
    int64_t dense[8];
    dense_strides(rx, xshape, dense);
    for (int d = 0; d < ry; d++) {
        int xd = d - (ry - rx);
        st[d] = xd < 0 || xshape[xd] == 1 ? 0 : dense[xd];
    }
}

/* ---- k_binary ----------------------------------------------------------- */

static double ref_op(int op, double a, double b)
{
    switch (op) {
    case K_ADD: return a + b;
    case K_SUB: return a - b;
    case K_MUL: return a * b;
    default: return a / b;
    }
}

/* Runs one k_binary call over y's shape with the given strides and compares
 * with an unravel-every-index loop. */
static void binary_case(int dt, int op, int rank, const int64_t *shape, Buf *a,
                        const int64_t *sa, Buf *b, const int64_t *sb)
{
    int64_t ny = numel(rank, shape), idx[8];
    Buf y = buf_new(ny), want = buf_new(ny);
    for (int64_t i = 0; i < ny; i++) {
        unravel(i, rank, shape, idx);
        want.d[i] = ref_op(op, a->d[dot(rank, idx, sa)], b->d[dot(rank, idx, sb)]);
    }
    put(dt, a);
    put(dt, b);
    if (dt == F32)
        k_binary_f32(op, y.f, a->f, b->f, rank, shape, sa, sb);
    else
        k_binary_f64(op, y.d, a->d, b->d, rank, shape, sa, sb);
    get(dt, &y);
    check(dt, y.d, want.d, ny, tol(dt));
    buf_free(&y);
    buf_free(&want);
}

typedef struct {
    int ry;
    int64_t y[4];
    int ra;
    int64_t a[4];
    int rb;
    int64_t b[4];
} BinaryShapes;

static void test_binary(int dt)
{
    static const BinaryShapes cases[] = {
        {3, {2, 3, 4}, 3, {2, 3, 4}, 3, {2, 3, 4}},  /* same shape: one flat run */
        {3, {2, 3, 4}, 3, {2, 3, 4}, 2, {3, 1}},     /* b broadcast, inner stride 0 */
        {3, {2, 3, 4}, 3, {2, 3, 4}, 1, {1}},        /* b a scalar */
        {3, {2, 3, 4}, 1, {4}, 3, {2, 3, 4}},        /* a broadcast */
        {2, {3, 4}, 2, {3, 1}, 2, {1, 4}},           /* both broadcast (outer product) */
        {0, {0}, 0, {0}, 0, {0}},                    /* rank 0 */
        {4, {2, 1, 3, 5}, 4, {2, 1, 3, 5}, 3, {1, 3, 1}},
        {2, {301, 257}, 2, {301, 257}, 1, {257}},    /* > 2^16: OpenMP splits mid-row */
        {2, {301, 257}, 2, {301, 1}, 2, {301, 257}},
        {2, {0, 3}, 2, {0, 3}, 1, {3}},              /* empty */
    };
    static const char *const opname[] = {"add", "sub", "mul", "div"};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const BinaryShapes *s = &cases[c];
        int64_t sa[4], sb[4];
        Buf a = buf_new(numel(s->ra, s->a)), b = buf_new(numel(s->rb, s->b));
        bcast_strides(s->ry, s->ra, s->a, sa);
        bcast_strides(s->ry, s->rb, s->b, sb);
        fill_rnd(&a, -2, 2);
        fill_rnd(&b, 0.5, 2);  /* away from 0 for div */
        for (int op = K_ADD; op <= K_DIV; op++) {
            CTX("k_binary %s case %zu", opname[op], c);
            binary_case(dt, op, s->ry, s->y, &a, sa, &b, sb);
        }
        buf_free(&a);
        buf_free(&b);
    }
    /* a general strided operand: a is a 4x3 buffer read as its 3x4 transpose */
    {
        int64_t shape[2] = {3, 4}, sa[2] = {1, 3}, sb[2] = {4, 1};
        Buf a = buf_new(12), b = buf_new(12);
        fill_rnd(&a, -2, 2);
        fill_rnd(&b, 0.5, 2);
        for (int op = K_ADD; op <= K_DIV; op++) {
            CTX("k_binary %s transposed view", opname[op]);
            binary_case(dt, op, 2, shape, &a, sa, &b, sb);
        }
        buf_free(&a);
        buf_free(&b);
    }
}

/* ---- k_unary, k_unary_grad, k_scale, k_fill ----------------------------- */

static double ref_unary(int op, double x)
{
    switch (op) {
    case K_RELU: return x < 0 ? 0 : x;
    case K_TANH: return tanh(x);
    default: return 1 / (1 + exp(-x));
    }
}

/* derivative as a function of the forward output y */
static double ref_unary_grad(int op, double dy, double y)
{
    switch (op) {
    case K_RELU: return y > 0 ? dy : 0;
    case K_TANH: return dy * (1 - y * y);
    default: return dy * y * (1 - y);
    }
}

static void test_unary(int dt)
{
    static const char *const opname[] = {"relu", "tanh", "sigmoid"};
    const int64_t n = 1001;
    Buf x = buf_new(n), y = buf_new(n), dy = buf_new(n), dx = buf_new(n), want = buf_new(n);
    fill_rnd(&x, -6, 6);
    x.d[0] = 0;
    x.d[1] = -30;  /* sigmoid's exp(-x) well away from 0 */
    x.d[2] = 30;
    fill_rnd(&dy, -1, 1);
    put(dt, &x);
    put(dt, &dy);
    for (int op = K_RELU; op <= K_SIGMOID; op++) {
        CTX("k_unary %s", opname[op]);
        for (int64_t i = 0; i < n; i++) want.d[i] = ref_unary(op, x.d[i]);
        if (dt == F32) k_unary_f32(op, y.f, x.f, n);
        else k_unary_f64(op, y.d, x.d, n);
        get(dt, &y);
        check(dt, y.d, want.d, n, tol(dt));

        CTX("k_unary_grad %s", opname[op]);
        for (int64_t i = 0; i < n; i++) want.d[i] = ref_unary_grad(op, dy.d[i], y.d[i]);
        if (dt == F32) k_unary_grad_f32(op, dx.f, dy.f, y.f, n);
        else k_unary_grad_f64(op, dx.d, dy.d, y.d, n);
        get(dt, &dx);
        check(dt, dx.d, want.d, n, tol(dt));
    }
    CTX("k_scale");
    for (int64_t i = 0; i < n; i++) want.d[i] = -0.3 * x.d[i];
    if (dt == F32) k_scale_f32(y.f, x.f, -0.3, n);
    else k_scale_f64(y.d, x.d, -0.3, n);
    get(dt, &y);
    check(dt, y.d, want.d, n, tol(dt));

    CTX("k_fill");
    fill_val(&want, 2.5);
    if (dt == F32) k_fill_f32(y.f, 2.5, n);
    else k_fill_f64(y.d, 2.5, n);
    get(dt, &y);
    check(dt, y.d, want.d, n, 0);
    buf_free(&x), buf_free(&y), buf_free(&dy), buf_free(&dx), buf_free(&want);
}

/* ---- k_matmul ----------------------------------------------------------- */

typedef struct {
    int64_t batch, sa, sb, m, n, k;
    int ta, tb;
    double beta;
} Gemm;

/* c = op(A_i) op(B_i) + beta c, element by element */
static void ref_matmul(double *c, const double *a, const double *b, const Gemm *g)
{
    for (int64_t i = 0; i < g->batch; i++)
        for (int64_t r = 0; r < g->m; r++)
            for (int64_t col = 0; col < g->n; col++) {
                const double *ai = a + i * g->sa, *bi = b + i * g->sb;
                double *cij = c + i * g->m * g->n + r * g->n + col;
                double s = g->beta == 0 ? 0 : g->beta * *cij;
                for (int64_t p = 0; p < g->k; p++)
                    s += (g->ta ? ai[p * g->m + r] : ai[r * g->k + p]) *
                         (g->tb ? bi[col * g->k + p] : bi[p * g->n + col]);
                *cij = s;
            }
}

static void matmul_case(int dt, const Gemm *g)
{
    int64_t na = (g->batch - 1) * g->sa + g->m * g->k;
    int64_t nb = (g->batch - 1) * g->sb + g->k * g->n;
    int64_t nc = g->batch * g->m * g->n;
    Buf a = buf_new(na), b = buf_new(nb), c = buf_new(nc), want = buf_new(nc);
    fill_rnd(&a, -1, 1);
    fill_rnd(&b, -1, 1);
    if (g->beta == 0)
        fill_val(&c, NAN);  /* beta 0 must not read C */
    else
        fill_rnd(&c, -1, 1);
    memcpy(want.d, c.d, (size_t)nc * sizeof(double));
    ref_matmul(want.d, a.d, b.d, g);
    put(dt, &a), put(dt, &b), put(dt, &c);
    if (dt == F32)
        k_matmul_f32(c.f, a.f, b.f, g->batch, g->sa, g->sb, g->m, g->n, g->k,
                     g->ta, g->tb, g->beta);
    else
        k_matmul_f64(c.d, a.d, b.d, g->batch, g->sa, g->sb, g->m, g->n, g->k,
                     g->ta, g->tb, g->beta);
    get(dt, &c);
    check(dt, c.d, want.d, nc, 10 * tol(dt));
    buf_free(&a), buf_free(&b), buf_free(&c), buf_free(&want);
}

static void test_matmul(int dt)
{
    static const int64_t sizes[][3] = {{5, 4, 3}, {33, 17, 65}, {1, 7, 1}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2], mk = m * k, kn = k * n;
        /* batch, sa, sb: single; both batched; A shared; B shared (the folded
         * path when A is untransposed); B shared with padded A batches (must
         * not fold); both shared */
        const int64_t modes[][3] = {{1, 0, 0}, {3, mk, kn}, {3, 0, kn}, {3, mk, 0},
                                    {3, mk + 2, 0}, {2, 0, 0}};
        for (size_t md = 0; md < sizeof modes / sizeof modes[0]; md++)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (int bz = 0; bz < 2; bz++) {
                        Gemm g = {modes[md][0], modes[md][1], modes[md][2], m, n, k,
                                  ta, tb, bz ? 1.0 : 0.0};
                        CTX("k_matmul m=%lld n=%lld k=%lld batch=%lld sa=%lld sb=%lld "
                            "ta=%d tb=%d beta=%g", (long long)m, (long long)n,
                            (long long)k, (long long)g.batch, (long long)g.sa,
                            (long long)g.sb, ta, tb, g.beta);
                        matmul_case(dt, &g);
                    }
    }
    /* k == 0: C = beta C (zeros for beta 0, even over NaN) */
    for (int bz = 0; bz < 2; bz++) {
        Gemm g = {2, 0, 0, 3, 4, 0, 0, 0, bz ? 0.5 : 0.0};
        CTX("k_matmul k=0 beta=%g", g.beta);
        matmul_case(dt, &g);
    }
}

/* ---- k_transpose -------------------------------------------------------- */

static void transpose_case(int dt, int rank, const int64_t *xshape, const int64_t *perm)
{
    int64_t n = numel(rank, xshape), yshape[8], xst[8], yi[8], xi[8];
    Buf x = buf_new(n), y = buf_new(n), want = buf_new(n);
    for (int i = 0; i < rank; i++) yshape[i] = xshape[perm[i]];
    dense_strides(rank, xshape, xst);
    fill_rnd(&x, -2, 2);
    for (int64_t i = 0; i < n; i++) {
        unravel(i, rank, yshape, yi);
        for (int d = 0; d < rank; d++) xi[perm[d]] = yi[d];
        want.d[i] = x.d[dot(rank, xi, xst)];
    }
    put(dt, &x);
    if (dt == F32) k_transpose_f32(y.f, x.f, rank, xshape, perm);
    else k_transpose_f64(y.d, x.d, rank, xshape, perm);
    get(dt, &y);
    check(dt, y.d, want.d, n, 0);
    buf_free(&x), buf_free(&y), buf_free(&want);
}

static void test_transpose(int dt)
{
    static const struct {
        int rank;
        int64_t shape[4], perm[4];
    } cases[] = {
        {0, {0}, {0}},
        {1, {5}, {0}},
        {2, {3, 5}, {1, 0}},
        {2, {301, 257}, {1, 0}},                 /* > 2^16: OpenMP splits mid-row */
        {3, {2, 3, 4}, {0, 1, 2}}, {3, {2, 3, 4}, {0, 2, 1}}, {3, {2, 3, 4}, {1, 0, 2}},
        {3, {2, 3, 4}, {1, 2, 0}}, {3, {2, 3, 4}, {2, 0, 1}}, {3, {2, 3, 4}, {2, 1, 0}},
        {4, {2, 3, 1, 4}, {0, 2, 1, 3}}, {4, {2, 3, 1, 4}, {3, 2, 1, 0}},
        {4, {2, 3, 1, 4}, {1, 3, 0, 2}}, {4, {2, 3, 1, 4}, {2, 0, 3, 1}},
        {4, {3, 4, 5, 6}, {0, 2, 1, 3}},         /* [B,S,H,D] -> [B,H,S,D] */
        {4, {3, 4, 5, 6}, {0, 1, 3, 2}},
        {4, {2, 3, 4, 5}, {3, 1, 2, 0}},         /* tiles with dims in between */
        {3, {3, 301, 257}, {0, 2, 1}},           /* OpenMP splits tiles mid-batch */
        {3, {2, 0, 3}, {2, 1, 0}},               /* empty */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CTX("k_transpose case %zu (rank %d)", c, cases[c].rank);
        transpose_case(dt, cases[c].rank, cases[c].shape, cases[c].perm);
    }
}

/* ---- k_reduce_sum_to ---------------------------------------------------- */

static void reduce_case(int dt, int rank, const int64_t *xshape, const int64_t *yshape)
{
    int64_t nx = numel(rank, xshape), ny = numel(rank, yshape), yst[8], xi[8];
    Buf x = buf_new(nx), y = buf_new(ny), want = buf_new(ny);
    dense_strides(rank, yshape, yst);
    for (int d = 0; d < rank; d++)
        if (yshape[d] == 1) yst[d] = 0;  /* every x index along d lands on y's 0 */
    fill_rnd(&x, -2, 2);
    for (int64_t i = 0; i < nx; i++) {
        unravel(i, rank, xshape, xi);
        want.d[dot(rank, xi, yst)] += x.d[i];
    }
    fill_val(&y, NAN);  /* every element must be written */
    put(dt, &x), put(dt, &y);
    if (dt == F32) k_reduce_sum_to_f32(y.f, x.f, rank, xshape, yshape);
    else k_reduce_sum_to_f64(y.d, x.d, rank, xshape, yshape);
    get(dt, &y);
    check(dt, y.d, want.d, ny, tol(dt));
    buf_free(&x), buf_free(&y), buf_free(&want);
}

static void test_reduce_sum_to(int dt)
{
    static const struct {
        int rank;
        int64_t x[3], y[3];
    } cases[] = {
        {0, {0}, {0}},
        {2, {7, 300}, {1, 300}},        /* bias grad; crosses a 256-column tile */
        {2, {300, 7}, {300, 1}},        /* row sums */
        {2, {300, 7}, {1, 1}},
        {3, {3, 600, 2}, {1, 600, 1}},  /* per-channel sums */
        {3, {5, 1, 3}, {1, 1, 3}},
        {3, {4, 1, 5}, {4, 1, 1}},
        {3, {2, 0, 3}, {1, 1, 3}},      /* sum over nothing = 0 */
    };
    /* [2,3,4] to every shape that keeps or drops each dim */
    const int64_t xs[3] = {2, 3, 4};
    for (int mask = 0; mask < 8; mask++) {
        int64_t ys[3];
        for (int d = 0; d < 3; d++) ys[d] = mask >> d & 1 ? xs[d] : 1;
        CTX("k_reduce_sum_to [2,3,4] -> [%lld,%lld,%lld]", (long long)ys[0],
            (long long)ys[1], (long long)ys[2]);
        reduce_case(dt, 3, xs, ys);
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CTX("k_reduce_sum_to case %zu", c);
        reduce_case(dt, cases[c].rank, cases[c].x, cases[c].y);
    }
}

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

/* ---- optimizers --------------------------------------------------------- */

static void adamw_run(int dt, Buf *p, Buf *g, Buf *m, Buf *v, double lr, double b1,
                      double b2, double eps, double wd, int64_t step)
{
    put(dt, g);
    if (dt == F32) k_adamw_f32(p->f, g->f, m->f, v->f, p->n, lr, b1, b2, eps, wd, step);
    else k_adamw_f64(p->d, g->d, m->d, v->d, p->n, lr, b1, b2, eps, wd, step);
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
    adamw_run(dt, &p, &g, &m, &v, 0.1, 0.9, 0.999, 1e-8, 0.01, 1);
    CTX("k_adamw hand step 1 (p)");
    check(dt, p.d, want1, 2, tol(dt));
    CTX("k_adamw hand step 1 (m, v)");
    check(dt, m.d, want_m1, 2, tol(dt));
    check(dt, v.d, want_v1, 2, tol(dt));
    set(&g, g2);
    adamw_run(dt, &p, &g, &m, &v, 0.1, 0.9, 0.999, 1e-8, 0.01, 2);
    CTX("k_adamw hand step 2");
    check(dt, p.d, want2, 2, tol(dt));
    buf_free(&p), buf_free(&g), buf_free(&m), buf_free(&v);

    /* three random steps against the formulas in double */
    const int64_t n = 100;
    const double lr = 1e-3, b1 = 0.8, b2 = 0.99, eps = 1e-6, wd = 0.1;
    Buf rp = buf_new(n), rg = buf_new(n), rm = buf_new(n), rv = buf_new(n);
    double wp[100], wm[100] = {0}, wv[100] = {0};
    fill_rnd(&rp, -1, 1);
    memcpy(wp, rp.d, sizeof wp);
    put(dt, &rp), put(dt, &rm), put(dt, &rv);
    for (int64_t step = 1; step <= 3; step++) {
        fill_rnd(&rg, -1, 1);
        for (int64_t i = 0; i < n; i++) {
            double bc1 = 1 - pow(b1, (double)step), bc2 = 1 - pow(b2, (double)step);
            wp[i] *= 1 - lr * wd;
            wm[i] = b1 * wm[i] + (1 - b1) * rg.d[i];
            wv[i] = b2 * wv[i] + (1 - b2) * rg.d[i] * rg.d[i];
            wp[i] -= lr / bc1 * wm[i] / (sqrt(wv[i]) / sqrt(bc2) + eps);
        }
        adamw_run(dt, &rp, &rg, &rm, &rv, lr, b1, b2, eps, wd, step);
        CTX("k_adamw random step %lld", (long long)step);
        check(dt, rp.d, wp, n, tol(dt));
        check(dt, rm.d, wm, n, tol(dt));
        check(dt, rv.d, wv, n, tol(dt));
    }
    buf_free(&rp), buf_free(&rg), buf_free(&rm), buf_free(&rv);
}

static void sgd_run(int dt, Buf *p, const double *gv, Buf *buf, double lr,
                    double mom, double wd, int64_t step)
{
    Buf g = buf_new(p->n);
    set(&g, gv);
    put(dt, &g);
    if (dt == F32) k_sgd_f32(p->f, g.f, buf ? buf->f : NULL, p->n, lr, mom, wd, step);
    else k_sgd_f64(p->d, g.d, buf ? buf->d : NULL, p->n, lr, mom, wd, step);
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
    sgd_run(dt, &p, g1, &buf, 0.1, 0.9, 0.01, 1);
    CTX("k_sgd momentum step 1");
    check(dt, p.d, want1, 2, tol(dt));
    check(dt, buf.d, wbuf1, 2, tol(dt));
    sgd_run(dt, &p, g2, &buf, 0.1, 0.9, 0.01, 2);
    CTX("k_sgd momentum step 2");
    check(dt, p.d, want2, 2, tol(dt));
    check(dt, buf.d, wbuf2, 2, tol(dt));

    /* momentum 0, no buffer: p -= lr (g + wd p), every step alike */
    static const double want_plain[] = {0.949, -1.973}, want_nowd[] = {0.95, -1.975};
    set(&p, p0), put(dt, &p);
    sgd_run(dt, &p, g1, NULL, 0.1, 0, 0.01, 5);
    CTX("k_sgd momentum 0");
    check(dt, p.d, want_plain, 2, tol(dt));
    set(&p, p0), put(dt, &p);
    sgd_run(dt, &p, g1, NULL, 0.1, 0, 0, 1);
    CTX("k_sgd momentum 0, wd 0");
    check(dt, p.d, want_nowd, 2, tol(dt));
    buf_free(&p), buf_free(&buf);
}

int main(void)
{
    static void (*const tests[])(int) = {
        test_binary, test_unary, test_matmul, test_transpose, test_reduce_sum_to,
        test_mse, test_cross_entropy, test_adamw, test_sgd,
    };
    for (int dt = F32; dt <= F64; dt++)
        for (size_t t = 0; t < sizeof tests / sizeof tests[0]; t++)
            tests[t](dt);
    printf("kernels_test: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
