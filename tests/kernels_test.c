/* kernels_test.c — checks the core reference kernels of kernels/c (binary
 * ops, scale / fill, matmul, transpose, reductions and ReduceMax's backward,
 * losses (MSE, cross-entropy, negative log-likelihood), optimizers), f32 and
 * f64, and the float32 GEMM's two libraries (OpenBLAS, oneDNN) against each
 * other.  kernels_ew_test.c, kernels_nn_test.c and kernels_attn_test.c cover
 * the rest; the harness (buffers, checks, finite differences) is ktest.h.
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

/* k_matmul_bf16 / k_matmul_f16 (f16): 16-bit operands, float result; the
 * reference multiplies the rounded operands in double, so only float32
 * accumulation differs */
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
    float *c0 = xalloc((size_t)nc + 1, sizeof(float));
    memcpy(c0, c.f, (size_t)nc * sizeof(float));
    (f16 ? k_matmul_f16 : k_matmul_bf16)(c.f, a16, b16, g->batch, g->sa, g->sb, g->m, g->n, g->k, g->ta, g->tb,
                                         g->beta);
#ifdef _OPENMP
    /* the widened path's tiles are the same at any thread count, and so are the bits: a team of 4 = 1 thread */
    const int before = omp_get_max_threads();
    ktest_team(before == 4 ? 1 : 4);
    (f16 ? k_matmul_f16 : k_matmul_bf16)(c0, a16, b16, g->batch, g->sa, g->sb, g->m, g->n, g->k, g->ta, g->tb,
                                         g->beta);
    ktest_team(before);
    check_bytes(F32, c0, c.f, (size_t)nc * sizeof(float)); /* 1 thread's bits = a team of 4's */
#endif
    free(c0);
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
    if (k16)
        (k16 == 2 ? k_matmul_add_f16 : k_matmul_add_bf16)(c.f, a16, b16, pb, pd, alpha, g->batch, g->sa, g->sb,
                                                           g->m, g->n, g->k, g->ta, g->tb);
    else if (f)
        k_matmul_add_f32(pc, a.f, b.f, pb, pd, alpha, g->batch, g->sa, g->sb, g->m, g->n, g->k, g->ta, g->tb);
    else
        k_matmul_add_f64(pc, a.d, b.d, pb, pd, alpha, g->batch, g->sa, g->sb, g->m, g->n, g->k, g->ta, g->tb);
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
        test_binary, test_scale_fill, test_matmul, test_matmul_bf16, test_transpose, test_reduce_sum_to,
        test_reduce, test_mse, test_cross_entropy, test_nll, test_adamw, test_sgd, test_clip,
        test_matmul_f16, test_loss_scale, test_matmul_add, test_matmul_add_rows, test_cross_entropy_16, test_gemm_libs,
    };
    return ktest_main("kernels_test", tests, sizeof tests / sizeof tests[0]);
}
