/* matmul_impl.h — typed body of matmul.c, included once per dtype with
 * T (element type), S (name suffix) and K_GEMM (k_gemm_f32 / blas_f64: one
 * GEMM with leading dimensions) defined.  No include guard on purpose. */

/* C (m x n, dense) = alpha op(A) op(B) + beta C for one matrix pair. */
static void KFN(gemm)(T *c, const T *a, const T *b, int64_t m, int64_t n,
                      int64_t k, int ta, int tb, double alpha, double beta)
{
    K_GEMM(c, n, a, ta ? m : k, b, tb ? k : n, m, n, k, ta, tb, alpha, beta);
}

/* C = beta C over len elements, beta == 0 writing exact zeros. */
static void KFN(scale_c)(T *c, int64_t len, double beta)
{
    const T s = (T)beta;
#pragma omp parallel for schedule(static) if (len >= K_PAR_MIN)
    for (int64_t i = 0; i < len; i++)
        c[i] = beta == 0 ? (T)0 : s * c[i];
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
 * par_range, so that the generated step may preset C inside a team that
 * shares (k_matmul_epilogue_f32, codegen/team.c) */
typedef struct {
    T *c;
    const T *bias, *add;
    int64_t n;
} KFN(EpilogueJob);

static void KFN(epilogue_rows)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(EpilogueJob) *j = ctx;
    const int64_t n = j->n;
    for (int64_t r = lo; r < hi; r++)
        for (int64_t i = 0; i < n; i++) {
            T v = j->add ? j->add[r * n + i] : (T)0;
            j->c[r * n + i] = j->bias ? v + j->bias[i] : v;
        }
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
    if (bias || add)
        KFN(epilogue_c)(c, bias, add, batch * m, n);
    KFN(matmul)(c, a, b, batch, sa, sb, m, n, k, ta, tb, alpha, bias || add ? 1.0 : 0.0);
}
