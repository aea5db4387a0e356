/* matmul_impl.h — typed body of matmul.c, included once per dtype with
 * T (element type), S (name suffix) and K_GEMM (k_gemm_f32 / blas_f64: one
 * GEMM with leading dimensions) defined.  No include guard on purpose. */

/* C (m x n, dense) = alpha op(A) op(B) + beta C for one matrix pair. */
static void KFN(gemm)(T *c, const T *a, const T *b, int64_t m, int64_t n,
                      int64_t k, int ta, int tb, double alpha, double beta)
{
    K_GEMM(c, n, a, ta ? m : k, b, tb ? k : n, m, n, k, ta, tb, alpha, beta);
}

/* C = beta C over len elements, beta == 0 writing exact zeros; by par_range (a team's share inside one) */
typedef struct {
    T *c;
    double beta;
} KFN(ScaleJob);

static void KFN(scale_range)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(ScaleJob) *j = ctx;
    const T s = (T)j->beta;
    for (int64_t i = lo; i < hi; i++)
        j->c[i] = j->beta == 0 ? (T)0 : s * j->c[i];
}

static void KFN(scale_c)(T *c, int64_t len, double beta)
{
    KFN(ScaleJob) j = {c, beta};
    par_range(KFN(scale_range), &j, len, 1);
}

/* C = bias (each row) + add over rows [lo, hi) of n columns: the C that k_matmul_add's GEMM adds its product to
 * (beta 1); add may be c itself */
static void KFN(epilogue_rows_of)(T *c, const T *bias, const T *add, int64_t n, int64_t lo, int64_t hi)
{
    for (int64_t r = lo; r < hi; r++)
        for (int64_t i = 0; i < n; i++) {
            T v = add ? add[r * n + i] : (T)0;
            c[r * n + i] = bias ? v + bias[i] : v;
        }
}

/* Inside a team that shares (k_share, codegen/team.c): this thread's part of the GEMM, with its preset of C
 * (bias, add: k_matmul_add's) on the same rows first, so no barrier between them: rows of one tall GEMM (op(A)'s
 * rows, in multiples of 16), or whole matrices of a batch.  Returns 0 outside such a team.  OpenBLAS and oneDNN
 * run on the calling thread inside a parallel region; oneDNN's sgemm gives a row block the bits of the whole
 * (bench/gemmteam.c: at every shape of the GPT step), OpenBLAS's Haswell kernels not always. */
static int KFN(matmul_share)(T *c, const T *a, const T *b, const T *bias, const T *add, int64_t batch, int64_t sa,
                             int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb, double alpha, double beta)
{
    int64_t lo, hi;
    const int tall = (batch == 1 || (sb == 0 && !ta && sa == m * k)) && batch * m <= INT_MAX; /* as below */
    if (!team_share(tall ? batch * m : batch, tall ? n * k : m * n * k, tall ? 16 : 1, &lo, &hi))
        return 0;
    if (lo >= hi)
        return 1;
    if (tall) {
        if (bias || add)
            KFN(epilogue_rows_of)(c, bias, add, n, lo, hi);
        K_GEMM(c + lo * n, n, ta ? a + lo : a + lo * k, ta ? m : k, b, tb ? k : n, hi - lo, n, k, ta, tb, alpha,
               beta);
        return 1;
    }
    for (int64_t i = lo; i < hi; i++) {
        if (bias || add)
            KFN(epilogue_rows_of)(c + i * m * n, bias, add ? add + i * m * n : NULL, n, 0, m);
        KFN(gemm)(c + i * m * n, a + i * sa, b + i * sb, m, n, k, ta, tb, alpha, beta);
    }
    return 1;
}

static void KFN(matmul)(T *c, const T *a, const T *b, int64_t batch, int64_t sa,
                        int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb,
                        double alpha, double beta)
{
    if (batch <= 0 || m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        KFN(scale_c)(c, batch * m * n, beta);
        return;
    }
    if (KFN(matmul_share)(c, a, b, NULL, NULL, batch, sa, sb, m, n, k, ta, tb, alpha, beta))
        return;
    /* shared B, A batches contiguous and untransposed: one tall GEMM */
    if ((batch == 1 || (sb == 0 && !ta && sa == m * k)) && batch * m <= INT_MAX) {
        KFN(gemm)(c, a, b, batch * m, n, k, ta, tb, alpha, beta);
        return;
    }
    /* the batch split across the team, a whole GEMM per thread (inside the team OpenBLAS runs on the calling
     * thread alone): small GEMMs (attention's heads) waste less on splitting each one; C is the same */
#pragma omp parallel for schedule(static) if (batch > 1)
    for (int64_t i = 0; i < batch; i++)
        KFN(gemm)(c + i * m * n, a + i * sa, b + i * sb, m, n, k, ta, tb, alpha, beta);
}

void KFN(k_matmul)(T *c, const T *a, const T *b, int64_t batch, int64_t sa,
                   int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb,
                   double beta)
{
    KFN(matmul)(c, a, b, batch, sa, sb, m, n, k, ta, tb, 1.0, beta);
}

/* C = bias (each row) + add over rows x n: the C that k_matmul_add's GEMM
 * adds its product to (beta 1); add may be c itself.  Rows split by
 * par_range (k_matmul_epilogue_f32: the native bf16 GEMM's preset) */
typedef struct {
    T *c;
    const T *bias, *add;
    int64_t n;
} KFN(EpilogueJob);

static void KFN(epilogue_rows)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(EpilogueJob) *j = ctx;
    KFN(epilogue_rows_of)(j->c, j->bias, j->add, j->n, lo, hi);
}

static void KFN(epilogue_c)(T *c, const T *bias, const T *add, int64_t rows, int64_t n)
{
    KFN(EpilogueJob) j = {c, bias, add, n};
    par_range(KFN(epilogue_rows), &j, rows, n);
}

void KFN(k_matmul_add)(T *c, const T *a, const T *b, const T *bias, const T *add, double alpha,
                       int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta,
                       int tb)
{
    if (batch > 0 && m > 0 && n > 0 && k > 0 &&
        KFN(matmul_share)(c, a, b, bias, add, batch, sa, sb, m, n, k, ta, tb, alpha, bias || add ? 1.0 : 0.0))
        return;
    if (bias || add)
        KFN(epilogue_c)(c, bias, add, batch * m, n);
    KFN(matmul)(c, a, b, batch, sa, sb, m, n, k, ta, tb, alpha, bias || add ? 1.0 : 0.0);
}
