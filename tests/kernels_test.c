/* kernels_test.c — checks the core reference kernels of kernels/c (binary
 * ops, scale / fill, matmul, transpose, reductions and ReduceMax's backward),
 * f32 and f64, and the float32 GEMM's two libraries (OpenBLAS, oneDNN)
 * against each other.  kernels_train_test.c (losses, optimizers, loss
 * scaling, clipping), kernels_ew_test.c, kernels_nn_test.c and
 * kernels_attn_test.c cover the rest; the harness (buffers, checks, finite
 * differences) is ktest.h.
 *
 * Expected values come from naive loops written here (unravel every index,
 * no stride merging, no BLAS) or from constants worked out by hand in the
 * comments.
 */
#include <float.h>

#include "ktest.h"

#ifdef _OPENMP
#include <omp.h>
#endif

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

/* ---- k_scale, k_fill ---------------------------------------------------- */

static void test_scale_fill(int dt)
{
    const int64_t n = 1001;
    Buf x = buf_new(n), y = buf_new(n), want = buf_new(n);
    fill_rnd(&x, -6, 6);
    put(dt, &x);
    CTX("k_scale");
    for (int64_t i = 0; i < n; i++) want.d[i] = -0.3 * x.d[i];
    KCALL(k_scale, V(y), V(x), -0.3, n);
    get(dt, &y);
    check(dt, y.d, want.d, n, tol(dt));

    CTX("k_fill");
    fill_val(&want, 2.5);
    KCALL(k_fill, V(y), 2.5, n);
    get(dt, &y);
    check(dt, y.d, want.d, n, 0);
    buf_free(&x), buf_free(&y), buf_free(&want);
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

/* k_gemm_f32_on: OpenBLAS and oneDNN, the float32 GEMM's two libraries
 * (matmul.c), on the same operands, with leading dimensions wider than
 * the matrices: each element of C within float32 rounding of a double
 * reference (|error| <= 2 k eps (sum |a b| + |beta c|)) on both, so within
 * twice that of each other; C's padding columns untouched; beta 0 over NaN
 * and k 0 (C = beta C) on both.  Either library's result bit-equal to
 * k_gemm_f32's once k_gemm_use chose it. */
static void gemm_libs_case(int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    const int64_t pad = 3, lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    const int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
    float *a = xalloc((size_t)(na + nb + 4 * nc), sizeof(float)), *b = a + na, *c0 = b + nb;
    float *c[3] = {c0 + nc, c0 + 2 * nc, c0 + 3 * nc};
    for (int64_t i = 0; i < na + nb; i++)
        a[i] = (float)sin(0.37 * (double)i);
    for (int64_t i = 0; i < nc; i++)
        c0[i] = beta == 0 ? NAN : (float)cos(0.11 * (double)i);
    const int prev = k_gemm_lib();
    for (int lib = K_GEMM_OPENBLAS; lib <= K_GEMM_ONEDNN + 1; lib++) {
        memcpy(c[lib], c0, (size_t)nc * sizeof(float));
        if (lib <= K_GEMM_ONEDNN)
            k_gemm_f32_on(lib, c[lib], ldc, a, lda, b, ldb, m, n, k, ta, tb, alpha, beta);
    }
    int bad = 0;
    for (int lib = K_GEMM_OPENBLAS; lib <= K_GEMM_ONEDNN; lib++) {
        k_gemm_use(lib);
        memcpy(c[2], c0, (size_t)nc * sizeof(float));
        k_gemm_f32(c[2], ldc, a, lda, b, ldb, m, n, k, ta, tb, alpha, beta);
        bad |= memcmp(c[2], c[lib], (size_t)nc * sizeof(float)) != 0;
    }
    k_gemm_use(prev);
    checks++;
    if (bad) {
        printf("FAIL %s: k_gemm_f32 after k_gemm_use differs from k_gemm_f32_on's bits\n", what);
        failures++;
    }
    checks++;
    for (int64_t i = 0; i < m && !bad; i++)
        for (int64_t j = 0; j < ldc && !bad; j++) {
            double s = 0, mag = 0, cij = beta == 0 ? 0 : beta * (double)c0[i * ldc + j];
            for (int64_t p = 0; p < k && j < n; p++) {
                double x = ta ? a[p * lda + i] : a[i * lda + p], y = tb ? b[j * ldb + p] : b[p * ldb + j];
                s += x * y, mag += fabs(x * y);
            }
            const double want = j < n ? alpha * s + cij : c0[i * ldc + j];
            const double bound = j < n ? 2.0 * (double)(k + 2) * FLT_EPSILON * (fabs(alpha) * mag + fabs(cij)) : 0;
            for (int lib = K_GEMM_OPENBLAS; lib <= K_GEMM_ONEDNN && !bad; lib++) {
                const double got = c[lib][i * ldc + j];
                if (j < n ? !(fabs(got - want) <= bound) : memcmp(&c[lib][i * ldc + j], &c0[i * ldc + j], 4)) {
                    printf("FAIL %s: %s's C[%lld][%lld] = %.9g, expected %.9g within %.3g%s\n", what,
                           k_gemm_name(lib), (long long)i, (long long)j, got, want, bound,
                           j < n ? "" : " (a padding column: untouched)");
                    bad = 1;
                }
            }
        }
    failures += bad;
    free(a);
}

static void test_gemm_libs(int dt)
{
    if (dt != F32)
        return;
    static const int64_t sizes[][3] = {{300, 200, 257}, {64, 64, 64}, {1, 513, 7}, {37, 1, 600}, {5, 4, 0}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bz = 0; bz < 2; bz++) {
                    const double alpha = bz ? 0.5 : 1.0, beta = bz ? 0.75 : 0.0;
                    CTX("k_gemm_f32_on m=%lld n=%lld k=%lld ta=%d tb=%d alpha=%g beta=%g", (long long)sizes[s][0],
                        (long long)sizes[s][1], (long long)sizes[s][2], ta, tb, alpha, beta);
                    gemm_libs_case(sizes[s][0], sizes[s][1], sizes[s][2], ta, tb, alpha, beta);
                }
}

#ifdef _OPENMP
/* call on every thread of a team of 3 that shares (k_share), as the step runs a team kernel (codegen/team.c):
 * each thread its share, the region's end the barrier */
#define IN_TEAM(call)                                                                                          \
    do {                                                                                                       \
        _Pragma("omp parallel num_threads(3)")                                                                 \
        {                                                                                                      \
            k_share(1);                                                                                        \
            call;                                                                                              \
            k_share(0);                                                                                        \
        }                                                                                                      \
    } while (0)
#endif

/* k_matmul_bf16 / k_matmul_f16 (f16): 16-bit operands, float result; the
 * reference multiplies the rounded operands in double, so only float32
 * accumulation differs.  In a team that shares, the bits of the call on its
 * own: the widened tiles' arithmetic does not depend on the thread, and
 * oneDNN's bf16 GEMM gives a block of rows the bits of the whole */
static void matmul_16_case(const Gemm *g, int f16)
{
    int64_t na = (g->batch - 1) * g->sa + g->m * g->k;
    int64_t nb = (g->batch - 1) * g->sb + g->k * g->n;
    int64_t nc = g->batch * g->m * g->n;
    Buf a = buf_new(na), b = buf_new(nb), c = buf_new(nc), want = buf_new(nc);
    uint16_t *a16 = xalloc((size_t)na, 2), *b16 = xalloc((size_t)nb, 2);
    fill_rnd(&a, -1, 1);
    fill_rnd(&b, -1, 1);
    for (int64_t i = 0; i < na; i++)
        a.d[i] = f16 ? k_f16_to_f32(a16[i] = k_f16_from_f32((float)a.d[i]))
                     : k_bf16_to_f32(a16[i] = k_bf16_from_f32((float)a.d[i]));
    for (int64_t i = 0; i < nb; i++)
        b.d[i] = f16 ? k_f16_to_f32(b16[i] = k_f16_from_f32((float)b.d[i]))
                     : k_bf16_to_f32(b16[i] = k_bf16_from_f32((float)b.d[i]));
    if (g->beta == 0)
        fill_val(&c, NAN);
    else
        fill_rnd(&c, -1, 1);
    memcpy(want.d, c.d, (size_t)nc * sizeof(double));
    ref_matmul(want.d, a.d, b.d, g);
    put(F32, &c);
    float *c0 = xalloc((size_t)nc + 1, sizeof(float)), *ct = xalloc((size_t)nc + 1, sizeof(float));
    memcpy(c0, c.f, (size_t)nc * sizeof(float));
    memcpy(ct, c.f, (size_t)nc * sizeof(float));
    (f16 ? k_matmul_f16 : k_matmul_bf16)(c.f, a16, b16, g->batch, g->sa, g->sb, g->m, g->n, g->k, g->ta, g->tb,
                                         g->beta);
#ifdef _OPENMP
    IN_TEAM((f16 ? k_matmul_f16 : k_matmul_bf16)(ct, a16, b16, g->batch, g->sa, g->sb, g->m, g->n, g->k, g->ta,
                                                 g->tb, g->beta));
    check_bytes(F32, ct, c.f, (size_t)nc * sizeof(float)); /* a team's shares = the call's own bits */
    /* the widened path's tiles are the same at any thread count, and so are the bits: a team of 4 = 1 thread */
    const int before = omp_get_max_threads();
    ktest_team(before == 4 ? 1 : 4);
    (f16 ? k_matmul_f16 : k_matmul_bf16)(c0, a16, b16, g->batch, g->sa, g->sb, g->m, g->n, g->k, g->ta, g->tb,
                                         g->beta);
    ktest_team(before);
    check_bytes(F32, c0, c.f, (size_t)nc * sizeof(float)); /* 1 thread's bits = a team of 4's */
#endif
    free(c0), free(ct);
    get(F32, &c);
    check(F32, c.d, want.d, nc, 10 * tol(F32));
    free(a16), free(b16);
    buf_free(&a), buf_free(&b), buf_free(&c), buf_free(&want);
}

static void matmul_16(int f16)
{
    const char *name = f16 ? "k_matmul_f16" : "k_matmul_bf16";
    /* small; past the row, column and depth blocks of the widening (512, 512, 256) */
    static const int64_t sizes[][3] = {{5, 4, 3}, {513, 9, 257}, {7, 515, 260}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2], mk = m * k, kn = k * n;
        const int64_t modes[][3] = {{1, 0, 0}, {2, mk, kn}, {2, mk, 0}, {2, mk + 2, 0}, {2, 0, kn}};
        for (size_t md = 0; md < sizeof modes / sizeof modes[0]; md++)
            for (int t = 0; t < 4; t++) {
                Gemm g = {modes[md][0], modes[md][1], modes[md][2], m, n, k, t & 1, t >> 1, md == 1 ? 0.5 : 0.0};
                CTX("%s m=%lld n=%lld k=%lld batch=%lld sa=%lld sb=%lld ta=%d tb=%d beta=%g", name,
                    (long long)m, (long long)n, (long long)k, (long long)g.batch, (long long)g.sa,
                    (long long)g.sb, g.ta, g.tb, g.beta);
                matmul_16_case(&g, f16);
            }
    }
    Gemm g = {2, 0, 0, 3, 4, 0, 0, 0, 0.0};
    CTX("%s k=0", name);
    matmul_16_case(&g, f16);
}

static void test_matmul_bf16(int dt)
{
    if (dt == F32)
        matmul_16(0);
}

/* k_matmul_add (MatMulAdd: C = alpha op(A) op(B) + bias (each row) + add) for
 * dt's own kernel, and under F32 also the bfloat16 (k16 1) and float16
 * (k16 2) ones, against the reference on the rounded operands; add may be C
 * itself (the fuse pass's in-place accumulation) */
static void matmul_add_case(int dt, int k16, const Gemm *g, double alpha, int with_bias, int add_mode)
{
    int64_t na = (g->batch - 1) * g->sa + g->m * g->k, nb = (g->batch - 1) * g->sb + g->k * g->n;
    int64_t nc = g->batch * g->m * g->n;
    Buf a = buf_new(na), b = buf_new(nb), c = buf_new(nc), want = buf_new(nc), bias = buf_new(g->n),
        add = buf_new(nc);
    uint16_t *a16 = xalloc((size_t)na, 2), *b16 = xalloc((size_t)nb, 2);
    fill_rnd(&a, -1, 1), fill_rnd(&b, -1, 1), fill_rnd(&bias, -1, 1), fill_rnd(&add, -1, 1);
    for (int64_t i = 0; k16 && i < na; i++)
        a.d[i] = k16 == 2 ? k_f16_to_f32(a16[i] = k_f16_from_f32((float)a.d[i]))
                          : k_bf16_to_f32(a16[i] = k_bf16_from_f32((float)a.d[i]));
    for (int64_t i = 0; k16 && i < nb; i++)
        b.d[i] = k16 == 2 ? k_f16_to_f32(b16[i] = k_f16_from_f32((float)b.d[i]))
                          : k_bf16_to_f32(b16[i] = k_bf16_from_f32((float)b.d[i]));
    if (add_mode == 2)
        memcpy(c.d, add.d, (size_t)nc * sizeof(double)); /* add is C */
    else
        fill_val(&c, NAN); /* no bias, no add: C is not read */
    ref_matmul(want.d, a.d, b.d, g); /* g->beta 0 */
    for (int64_t i = 0; i < nc; i++)
        want.d[i] = alpha * want.d[i] + (with_bias ? bias.d[i % g->n] : 0) + (add_mode ? add.d[i] : 0);
    PUT(&a, &b, &c, &bias, &add);
    const int f = dt == F32;
    void *pc = vp(dt, &c), *pb = with_bias ? vp(dt, &bias) : NULL;
    void *pd = add_mode == 2 ? pc : add_mode ? vp(dt, &add) : NULL;
    float *ct = xalloc((size_t)nc + 1, sizeof(float)); /* C before the call, for the team's */
    memcpy(ct, c.f, (size_t)nc * sizeof(float));
    if (k16)
        (k16 == 2 ? k_matmul_add_f16 : k_matmul_add_bf16)(c.f, a16, b16, pb, pd, alpha, g->batch, g->sa, g->sb,
                                                           g->m, g->n, g->k, g->ta, g->tb);
    else if (f)
        k_matmul_add_f32(pc, a.f, b.f, pb, pd, alpha, g->batch, g->sa, g->sb, g->m, g->n, g->k, g->ta, g->tb);
    else
        k_matmul_add_f64(pc, a.d, b.d, pb, pd, alpha, g->batch, g->sa, g->sb, g->m, g->n, g->k, g->ta, g->tb);
#ifdef _OPENMP
    if (k16) { /* in a team that shares: each thread its rows' preset and GEMM (or its tiles), the call's own bits */
        const float *pt = add_mode == 2 ? ct : pd;
        IN_TEAM((k16 == 2 ? k_matmul_add_f16 : k_matmul_add_bf16)(ct, a16, b16, pb, pt, alpha, g->batch, g->sa,
                                                                   g->sb, g->m, g->n, g->k, g->ta, g->tb));
        check_bytes(F32, ct, c.f, (size_t)nc * sizeof(float));
    }
#endif
    free(ct);
    GET(&c);
    check(dt, c.d, want.d, nc, 10 * tol(dt));
    free(a16), free(b16);
    buf_free(&a), buf_free(&b), buf_free(&c), buf_free(&want), buf_free(&bias), buf_free(&add);
}

static void test_matmul_add(int dt)
{
    static const char *const kname[] = {"", "_bf16", "_f16"};
    static const int64_t sizes[][3] = {{5, 4, 3}, {37, 9, 260}}; /* the second past the widening's depth block */
    for (int k16 = 0; k16 < (dt == F32 ? 3 : 1); k16++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2], mk = m * k, kn = k * n;
            /* single; batched; shared B (folded when A is untransposed); shared B, padded A batches */
            const int64_t modes[][3] = {{1, 0, 0}, {2, mk, kn}, {2, mk, 0}, {2, mk + 2, 0}};
            for (size_t md = 0; md < sizeof modes / sizeof modes[0]; md++)
                for (int t = 0; t < 4; t++)
                    for (int v = 0; v < 12; v++) { /* bias or not x alpha x add: none, its own, C itself */
                        Gemm g = {modes[md][0], modes[md][1], modes[md][2], m, n, k, t & 1, t >> 1, 0.0};
                        double alpha = v & 2 ? 0.125 : 1.0;
                        CTX("k_matmul_add%s m=%lld n=%lld k=%lld batch=%lld sa=%lld sb=%lld ta=%d tb=%d alpha=%g "
                            "bias=%d add=%s", kname[k16], (long long)m, (long long)n, (long long)k,
                            (long long)g.batch, (long long)g.sa, (long long)g.sb, g.ta, g.tb, alpha, v & 1,
                            (const char *[]){"none", "own", "C"}[v >> 2]);
                        matmul_add_case(dt, k16, &g, alpha, v & 1, v >> 2);
                    }
        }
}

/* k_matmul_add_rows_bf16 / _f16 (f16), a MatMulAdd stored in 16 bits a block of wrows rows at a time: y equal
 * bit for bit to k_matmul_add_X into the scratch and k_cast of it, block by block (what the step did before),
 * on 1 thread and a team of 4, and within float32 rounding of a double reference before the output's rounding */
static void matmul_add_rows_case(int f16, int64_t rows, int64_t n, int64_t k, int64_t wrows, int tb,
                                 int with_bias, int with_add, double alpha)
{
    const int64_t nc = rows * n;
    Buf a = buf_new(rows * k), b = buf_new(k * n), bias = buf_new(n), add = buf_new(nc), want = buf_new(nc),
        got = buf_new(nc);
    uint16_t *a16 = xalloc((size_t)(rows * k), 2), *b16 = xalloc((size_t)(k * n), 2), *y = xalloc((size_t)nc, 2),
             *y4 = xalloc((size_t)nc, 2), *ywant = xalloc((size_t)nc, 2);
    float *w = xalloc((size_t)(wrows * n), sizeof(float)), *fb = xalloc((size_t)n, sizeof(float)),
          *fa = xalloc((size_t)nc, sizeof(float));
    fill_rnd(&a, -1, 1), fill_rnd(&b, -1, 1), fill_rnd(&bias, -1, 1), fill_rnd(&add, -1, 1);
    for (int64_t i = 0; i < rows * k; i++)
        a.d[i] = f16 ? k_f16_to_f32(a16[i] = k_f16_from_f32((float)a.d[i]))
                     : k_bf16_to_f32(a16[i] = k_bf16_from_f32((float)a.d[i]));
    for (int64_t i = 0; i < k * n; i++)
        b.d[i] = f16 ? k_f16_to_f32(b16[i] = k_f16_from_f32((float)b.d[i]))
                     : k_bf16_to_f32(b16[i] = k_bf16_from_f32((float)b.d[i]));
    for (int64_t i = 0; i < n; i++)
        bias.d[i] = fb[i] = (float)bias.d[i];
    for (int64_t i = 0; i < nc; i++)
        add.d[i] = fa[i] = (float)add.d[i];
    const float *pb = with_bias ? fb : NULL, *pa = with_add ? fa : NULL;
    for (int64_t r0 = 0; r0 < rows; r0 += wrows) { /* the step's loop before k_matmul_add_rows */
        const int64_t part = rows - r0 < wrows ? rows - r0 : wrows;
        (f16 ? k_matmul_add_f16 : k_matmul_add_bf16)(w, a16 + r0 * k, b16, pb, pa ? pa + r0 * n : NULL, alpha, 1, 0,
                                                     0, part, n, k, 0, tb);
        k_cast(f16 ? K_DT_F16 : K_DT_BF16, ywant + r0 * n, K_DT_F32, w, part * n);
    }
    (f16 ? k_matmul_add_rows_f16 : k_matmul_add_rows_bf16)(y, w, wrows, a16, b16, pb, pa, alpha, rows, n, k, tb);
    check_bytes(F32, y, ywant, (size_t)nc * 2);
#ifdef _OPENMP
    const int before = omp_get_max_threads();
    ktest_team(before == 4 ? 1 : 4);
    (f16 ? k_matmul_add_rows_f16 : k_matmul_add_rows_bf16)(y4, w, wrows, a16, b16, pb, pa, alpha, rows, n, k, tb);
    ktest_team(before);
    check_bytes(F32, y4, y, (size_t)nc * 2); /* 1 thread's bits = a team of 4's */
    memset(y4, 0, (size_t)nc * 2);
    IN_TEAM((f16 ? k_matmul_add_rows_f16 : k_matmul_add_rows_bf16)(y4, w, wrows, a16, b16, pb, pa, alpha, rows, n, k,
                                                                    tb));
    check_bytes(F32, y4, y, (size_t)nc * 2); /* a team's shares of each block = the call's own bits */
#endif
    Gemm g = {1, 0, 0, rows, n, k, 0, tb, 0.0};
    ref_matmul(want.d, a.d, b.d, &g);
    for (int64_t i = 0; i < nc; i++) {
        want.d[i] = alpha * want.d[i] + (with_bias ? bias.d[i % n] : 0) + (with_add ? add.d[i] : 0);
        got.d[i] = f16 ? k_f16_to_f32(y[i]) : k_bf16_to_f32(y[i]);
    }
    check(F32, got.d, want.d, nc, f16 ? 1e-3 : 8e-3); /* the output's rounding (2^-11, 2^-8) */
    free(a16), free(b16), free(y), free(y4), free(ywant), free(w), free(fb), free(fa);
    buf_free(&a), buf_free(&b), buf_free(&bias), buf_free(&add), buf_free(&want), buf_free(&got);
}

static void test_matmul_add_rows(int dt)
{
    /* rows x n x k, the scratch's rows: blocks past the tiles' 256 and the widening's depth block, a last block
     * smaller, a scratch holding every row, k 0 */
    static const int64_t sizes[][4] = {{600, 300, 260, 250}, {37, 9, 3, 16}, {64, 40, 20, 64}, {10, 7, 0, 4}};
    if (dt != F32)
        return;
    for (int f16 = 0; f16 < 2; f16++)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            for (int v = 0; v < 16; v++) { /* tb x bias x add x alpha */
                CTX("k_matmul_add_rows_%s rows=%lld n=%lld k=%lld wrows=%lld tb=%d bias=%d add=%d alpha=%g",
                    f16 ? "f16" : "bf16", (long long)sizes[s][0], (long long)sizes[s][1], (long long)sizes[s][2],
                    (long long)sizes[s][3], v & 1, v >> 1 & 1, v >> 2 & 1, v & 8 ? 0.125 : 1.0);
                matmul_add_rows_case(f16, sizes[s][0], sizes[s][1], sizes[s][2], sizes[s][3], v & 1, v >> 1 & 1,
                                     v >> 2 & 1, v & 8 ? 0.125 : 1.0);
            }
}

/* float16 operands: the same GEMM with float16 rounding (10 mantissa bits),
 * so the result must also be closer to the exact product of the unrounded
 * operands than bfloat16's would be */
static void test_matmul_f16(int dt)
{
    if (dt != F32)
        return;
    matmul_16(1);
    float a[4] = {0.1f, 0.2f, 0.3f, 0.4f}, b[4] = {0.7f, -0.9f, 1.1f, 1.3f}, c[4];
    uint16_t a16[4], b16[4];
    for (int i = 0; i < 4; i++)
        a16[i] = k_f16_from_f32(a[i]), b16[i] = k_f16_from_f32(b[i]);
    k_matmul_f16(c, a16, b16, 1, 0, 0, 2, 2, 2, 0, 0, 0.0);
    double exact = 0.1 * 0.7 + 0.2 * 1.1, half = (double)k_f16_to_f32(a16[0]) * k_f16_to_f32(b16[0]) +
                                                  (double)k_f16_to_f32(a16[1]) * k_f16_to_f32(b16[2]);
    CTX("k_matmul_f16 [0][0] = the float16-rounded operands' product, not the float32 one");
    check_int(dt, fabs(c[0] - half) <= 1e-7 && fabs(half - exact) > 1e-6 && fabs(c[0] - exact) < 2e-3, 1);
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
    /* 16-bit x (k_reduce_sum_to_bf16 / _f16): the bits of k_reduce_sum_to_f32 on x widened, at 1 thread and on a
     * team of 4 */
    for (int f16 = 0; dt == F32 && f16 < 2; f16++) {
        uint16_t *x16 = xalloc((size_t)nx + 1, 2);
        float *xw = xalloc((size_t)nx + 1, 4), *y16 = xalloc((size_t)ny + 1, 4), *yw = xalloc((size_t)ny + 1, 4);
        for (int64_t i = 0; i < nx; i++)
            xw[i] = f16 ? k_f16_to_f32(x16[i] = k_f16_from_f32((float)x.d[i]))
                        : k_bf16_to_f32(x16[i] = k_bf16_from_f32((float)x.d[i]));
        for (int team = 1; team <= 4; team += 3) {
#ifdef _OPENMP
            const int before = ktest_team(team);
#endif
            for (int64_t i = 0; i < ny; i++)
                y16[i] = NAN, yw[i] = 0;
            (f16 ? k_reduce_sum_to_f16 : k_reduce_sum_to_bf16)(y16, x16, rank, xshape, yshape);
            k_reduce_sum_to_f32(yw, xw, rank, xshape, yshape);
#ifdef _OPENMP
            ktest_team(before);
#endif
            check_bytes(F32, y16, yw, (size_t)ny * sizeof(float));
        }
        free(x16), free(xw), free(y16), free(yw);
    }
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
        {2, {600, 200}, {1, 200}},      /* a bias gradient a team splits (K_PAR_MIN elements) */
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

/* ---- k_reduce, k_reduce_max_grad ---------------------------------------- */

static double ref_fold(int op, double acc, double v)
{
    switch (op) {
    case K_RMAX: return isnan(v) || v > acc ? v : acc;
    case K_RMIN: return isnan(v) || v < acc ? v : acc;
    case K_RPROD: return acc * v;
    default: return acc + v;
    }
}

/* y = op over the dims where yshape is 1, naive; compared with k_reduce */
static void kreduce_case(int dt, int op, int rank, const int64_t *xshape,
                         const int64_t *yshape, Buf *x)
{
    static const double init[] = {0, 0, -INFINITY, INFINITY, 1};
    int64_t nx = numel(rank, xshape), ny = numel(rank, yshape), yst[8], xi[8], cnt = 1;
    Buf y = buf_new(ny), want = buf_new(ny);
    dense_strides(rank, yshape, yst);
    for (int d = 0; d < rank; d++)
        if (yshape[d] == 1) yst[d] = 0, cnt *= xshape[d];
    fill_val(&want, init[op]);
    for (int64_t i = 0; i < nx; i++) {
        unravel(i, rank, xshape, xi);
        want.d[dot(rank, xi, yst)] = ref_fold(op, want.d[dot(rank, xi, yst)], x->d[i]);
    }
    if (op == K_RMEAN)
        for (int64_t i = 0; i < ny; i++) want.d[i] /= (double)cnt;  /* 0/0 = NaN */
    fill_val(&y, 12345);  /* every element must be written */
    put(dt, x), put(dt, &y);
    KCALL(k_reduce, op, V(y), V(*x), rank, xshape, yshape);
    get(dt, &y);
    check(dt, y.d, want.d, ny, tol(dt));
    buf_free(&y), buf_free(&want);
}

typedef struct {
    int op, rank;
    const int64_t *xshape, *yshape;
} RedCtx;

static void reduce_fwd(void *ctx, double *const *in, double *y)
{
    const RedCtx *c = ctx;
    k_reduce_f64(c->op, y, in[0], c->rank, c->xshape, c->yshape);
}

static void test_reduce(int dt)
{
    static const char *const opname[] = {"sum", "mean", "max", "min", "prod"};
    static const struct {
        int rank;
        int64_t x[3], y[3];
    } cases[] = {
        {2, {7, 300}, {1, 300}}, {2, {300, 7}, {300, 1}}, {3, {3, 600, 2}, {1, 600, 1}},
        {3, {2, 0, 3}, {1, 1, 3}},  /* over nothing: 0, NaN, -inf, +inf */
        {0, {0}, {0}},
    };
    const int64_t xs[3] = {2, 3, 4};
    Buf x = buf_new(24), w = buf_new(24), dx = buf_new(24), y = buf_new(24);
    fill_rnd(&x, -2, 2);
    for (int op = K_RSUM; op <= K_RPROD; op++)
        for (int mask = 0; mask < 8; mask++) {
            int64_t ys[3];
            for (int d = 0; d < 3; d++) ys[d] = mask >> d & 1 ? xs[d] : 1;
            CTX("k_reduce %s [2,3,4] -> [%lld,%lld,%lld]", opname[op], (long long)ys[0],
                (long long)ys[1], (long long)ys[2]);
            kreduce_case(dt, op, 3, xs, ys, &x);
            if (op < K_RMAX)
                continue;
            /* backward of max / min (no ties in random data, so FD applies) and prod */
            int64_t ny = numel(3, ys);
            fill_rnd(&w, -1, 1);
            PUT(&x, &w);
            KCALL(k_reduce, op, V(y), V(x), 3, xs, ys);
            if (op == K_RPROD)
                KCALL(k_reduce_prod_grad, V(dx), V(w), V(x), 3, xs, ys);
            else
                KCALL(k_reduce_max_grad, V(dx), V(w), V(x), V(y), 3, xs, ys);
            GET(&dx);
            RedCtx c = {op, 3, xs, ys};
            double *in[1] = {x.d};
            CTX("k_reduce_%s_grad mask %d vs finite differences", op == K_RPROD ? "prod" : "max", mask);
            check_fd(dt, reduce_fwd, &c, in, 0, 24, w.d, ny, dx.d);
        }
    for (int op = K_RSUM; op <= K_RPROD; op++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            Buf xc = buf_new(numel(cases[k].rank, cases[k].x));
            fill_rnd(&xc, -2, 2);
            CTX("k_reduce %s case %zu", opname[op], k);
            kreduce_case(dt, op, cases[k].rank, cases[k].x, cases[k].y, &xc);
            buf_free(&xc);
        }
    /* NaN propagates through max and min (torch.amax) */
    {
        int64_t xsh[2] = {2, 5}, ysh[2] = {2, 1};
        Buf xn = buf_new(10);
        fill_rnd(&xn, -2, 2);
        xn.d[2] = NAN;
        for (int op = K_RSUM; op <= K_RPROD; op++) {
            CTX("k_reduce %s with a NaN", opname[op]);
            kreduce_case(dt, op, 2, xsh, ysh, &xn);
        }
        buf_free(&xn);
    }
    /* ties share the gradient evenly: rows {1,3,3,0} and {5,5,5,2}, dy {1,3} */
    {
        static const double xv[8] = {1, 3, 3, 0, 5, 5, 5, 2}, dyv[2] = {1, 3};
        static const double want[8] = {0, 0.5, 0.5, 0, 1, 1, 1, 0};
        int64_t xsh[2] = {2, 4}, ysh[2] = {2, 1};
        Buf xt = buf_new(8), yt = buf_new(2), dyt = buf_new(2), dxt = buf_new(8);
        set(&xt, xv), set(&dyt, dyv);
        PUT(&xt, &dyt);
        KCALL(k_reduce, K_RMAX, V(yt), V(xt), 2, xsh, ysh);
        KCALL(k_reduce_max_grad, V(dxt), V(dyt), V(xt), V(yt), 2, xsh, ysh);
        GET(&dxt);
        CTX("k_reduce_max_grad splits ties evenly");
        check(dt, dxt.d, want, 8, tol(dt));
        buf_free(&xt), buf_free(&yt), buf_free(&dyt), buf_free(&dxt);
    }
    /* prod's gradient is the product of the others, zeros included: rows {2,0,3,4} (one zero),
     * {0,5,0,2} (two), {1,2,3,4} (none), dy {1,2,3}; and the product itself */
    {
        static const double xv[12] = {2, 0, 3, 4, 0, 5, 0, 2, 1, 2, 3, 4}, dyv[3] = {1, 2, 3};
        static const double want[12] = {0, 24, 0, 0, 0, 0, 0, 0, 72, 36, 24, 18}, wanty[3] = {0, 0, 24};
        int64_t xsh[2] = {3, 4}, ysh[2] = {3, 1};
        Buf xt = buf_new(12), yt = buf_new(3), dyt = buf_new(3), dxt = buf_new(12);
        set(&xt, xv), set(&dyt, dyv);
        PUT(&xt, &dyt);
        KCALL(k_reduce, K_RPROD, V(yt), V(xt), 2, xsh, ysh);
        KCALL(k_reduce_prod_grad, V(dxt), V(dyt), V(xt), 2, xsh, ysh);
        GET(&dxt, &yt);
        CTX("k_reduce_prod_grad at zeros");
        check(dt, dxt.d, want, 12, tol(dt));
        check(dt, yt.d, wanty, 3, tol(dt));
        buf_free(&xt), buf_free(&yt), buf_free(&dyt), buf_free(&dxt);
    }
    buf_free(&x), buf_free(&w), buf_free(&dx), buf_free(&y);
}

int main(void)
{
    static void (*const tests[])(int) = {
        test_binary, test_scale_fill, test_matmul, test_matmul_bf16, test_transpose, test_reduce_sum_to,
        test_reduce, test_matmul_f16, test_matmul_add, test_matmul_add_rows, test_gemm_libs,
    };
    return ktest_main("kernels_test", tests, sizeof tests / sizeof tests[0]);
}
