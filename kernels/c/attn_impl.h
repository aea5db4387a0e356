/* attn_impl.h — typed bodies of attn.c, included once per dtype with T
 * (element type), S (name suffix) and K_GEMM (cblas_sgemm / cblas_dgemm)
 * defined.  No include guard on purpose. */

/* C (m x n, ldc) = alpha op(A) op(B) + beta C, row-major */
static void KFN(attn_gemm)(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const T *a, int64_t lda,
                           const T *b, int64_t ldb, double beta, T *c, int64_t ldc)
{
    K_GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k,
           (T)alpha, a, (int)lda, b, (int)ldb, (T)beta, c, (int)ldc);
}

/* the columns a tile of r rows needs: up to its rows' last finite bias
 * entry (all s without a bias, and all s when every entry is -inf, so that
 * such rows compute the NaN softmax gives) */
static int64_t KFN(attn_cols)(const T *bias, int64_t r, int64_t s)
{
    if (!bias)
        return s;
    int64_t n = 0;
    for (int64_t i = 0; i < r; i++) {
        int64_t j = s;
        while (j > n && bias[i * s + j - 1] == -(T)INFINITY)
            j--;
        n = j > n ? j : n;
    }
    return n ? n : s;
}

/* S (r x n) = scale Q K[:n]^T + bias: the tile's scores (K as kt, d x s, or krow: s x d) */
static void KFN(attn_scores)(T *sc, const T *q, const T *kt, int krow, const T *bias, int64_t r, int64_t n,
                             int64_t s, int64_t d, double scale)
{
    KFN(attn_gemm)(0, krow, r, n, d, scale, q, d, kt, krow ? d : s, 0.0, sc, n);
    if (bias)
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < n; j++)
                sc[i * n + j] += bias[i * s + j];
}

/* this thread's slot of the workspace: 2 R s elements (scores, then their gradient) */
static T *KFN(attn_slot)(T *ws, int64_t R, int64_t s)
{
#ifdef _OPENMP
    return ws + (int64_t)omp_get_thread_num() * 2 * R * s;
#else
    (void)R, (void)s;
    return ws;
#endif
}

void KFN(k_attention)(T *y, T *lse, const T *q, const T *kt, int flags, const T *v, const T *bias, int64_t batch,
                      int64_t t, int64_t s, int64_t d, int64_t dv, int64_t nbias, int64_t brep, double scale, T *ws)
{
    const int krow = flags & K_ATTN_KROW, zero = flags & K_ATTN_ZERO;
    if (batch <= 0 || t <= 0 || dv <= 0)
        return;
    const int64_t R = k_attention_rows(t), tiles = (t + R - 1) / R, units = batch * tiles;
    const int nt = attn_threads(units);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t u = 0; u < units; u++) {
        T *sc = KFN(attn_slot)(ws, R, s);
        const int64_t b = u / tiles, i0 = u % tiles * R;
        const int64_t r = t - i0 < R ? t - i0 : R;
        const T *bb = bias ? bias + (b / brep % nbias) * t * s + i0 * s : NULL;
        T *yt = y + (b * t + i0) * dv, *lt = lse + b * t + i0;
        if (s <= 0) { /* nothing to attend to: softmax of nothing */
            for (int64_t i = 0; i < r * dv; i++)
                yt[i] = (T)NAN;
            for (int64_t i = 0; i < r; i++)
                lt[i] = -(T)INFINITY;
            continue;
        }
        const int64_t n = KFN(attn_cols)(bb, r, s);
        KFN(attn_scores)(sc, q + (b * t + i0) * d, kt + b * d * s, krow, bb, r, n, s, d, scale);
        for (int64_t i = 0; i < r; i++) { /* each loop vectorised (omp simd: the sums in lanes of T) */
            T *row = sc + i * n, mx = -(T)INFINITY, sum = 0;
#pragma omp simd reduction(max : mx)
            for (int64_t j = 0; j < n; j++) /* a NaN passes by here and makes the sum NaN */
                mx = row[j] > mx ? row[j] : mx;
            if (zero && mx == -(T)INFINITY) { /* a row that sees nothing: y 0 (the GEMM's), lse -inf */
                memset(row, 0, sizeof(T) * (size_t)n);
                lt[i] = mx;
                continue;
            }
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < n; j++) {
                const T e = KM(exp)(row[j] - mx);
                row[j] = e;
                sum += e;
            }
            const T inv = (T)1 / sum;
            for (int64_t j = 0; j < n; j++)
                row[j] *= inv;
            lt[i] = (T)((double)mx + log((double)sum));
        }
        KFN(attn_gemm)(0, 0, r, dv, n, 1.0, sc, n, v + b * s * dv, dv, 0.0, yt, dv);
    }
}

/* problem b's gradients (dq, dkt, dval of b all written) in the slot sc; dbt: dbias of b's bias slice (t x s) to
 * add dS to, or NULL */
static void KFN(attn_grad_problem)(int64_t b, T *dq, T *dkt, T *dval, T *dbt, const T *dy, const T *q, const T *kt,
                                   int flags, const T *v, const T *bias, const T *y, const T *lse, int64_t t, int64_t s,
                                   int64_t d, int64_t dv, int64_t nbias, int64_t brep, double scale, T *sc)
{
    const int krow = flags & K_ATTN_KROW, zero = flags & K_ATTN_ZERO;
    const int64_t R = k_attention_rows(t);
    T *dp = sc + R * s, *dktb = dkt + b * d * s, *dvb = dval + b * s * dv;
    const T *ktb = kt + b * d * s, *vb = v + b * s * dv;
    memset(dktb, 0, sizeof(T) * (size_t)(d * s));
    memset(dvb, 0, sizeof(T) * (size_t)(s * dv));
    for (int64_t i0 = 0; i0 < t; i0 += R) {
        const int64_t r = t - i0 < R ? t - i0 : R;
        const T *bb = bias ? bias + (b / brep % nbias) * t * s + i0 * s : NULL;
        const T *qt = q + (b * t + i0) * d, *dyt = dy + (b * t + i0) * dv, *yt = y + (b * t + i0) * dv;
        const T *lt = lse + b * t + i0;
        T *dqt = dq + (b * t + i0) * d;
        if (s <= 0 || d <= 0) {
            for (int64_t i = 0; i < r * d; i++)
                dqt[i] = 0;
            continue;
        }
        const int64_t n = KFN(attn_cols)(bb, r, s);
        KFN(attn_scores)(sc, qt, ktb, krow, bb, r, n, s, d, scale);
        for (int64_t i = 0; i < r; i++) { /* P from the saved row statistic (0 in a row that sees nothing) */
            T *row = sc + i * n;
            const T l = lt[i];
            if (zero && l == -(T)INFINITY)
                memset(row, 0, sizeof(T) * (size_t)n);
            else
                for (int64_t j = 0; j < n; j++)
                    row[j] = KM(exp)(row[j] - l);
        }
        if (dv > 0) {
            KFN(attn_gemm)(1, 0, n, dv, r, 1.0, sc, n, dyt, dv, 1.0, dvb, dv); /* dV += P^T dY */
            KFN(attn_gemm)(0, 1, r, n, dv, 1.0, dyt, dv, vb, dv, 0.0, dp, n); /* dP = dY V^T */
        } else {
            memset(dp, 0, sizeof(T) * (size_t)(r * n));
        }
        for (int64_t i = 0; i < r; i++) { /* dS = P (dP - rowsum(dY Y)) */
            T dd = 0;
#pragma omp simd reduction(+ : dd)
            for (int64_t c = 0; c < dv; c++)
                dd += dyt[i * dv + c] * yt[i * dv + c];
            for (int64_t j = 0; j < n; j++)
                dp[i * n + j] = sc[i * n + j] * (dp[i * n + j] - dd);
        }
        if (dbt) /* dbias += dS: the bias is added after the scaling; columns past n have P = 0 */
            for (int64_t i = 0; i < r; i++)
                for (int64_t j = 0; j < n; j++)
                    dbt[(i0 + i) * s + j] += dp[i * n + j];
        if (krow) {
            KFN(attn_gemm)(0, 0, r, d, n, scale, dp, n, ktb, d, 0.0, dqt, d);  /* dQ = scale dS K */
            KFN(attn_gemm)(1, 0, n, d, r, scale, dp, n, qt, d, 1.0, dktb, d);  /* dK += scale dS^T Q */
        } else {
            KFN(attn_gemm)(0, 1, r, d, n, scale, dp, n, ktb, s, 0.0, dqt, d);  /* dQ = scale dS Kt^T */
            KFN(attn_gemm)(1, 0, d, n, r, scale, qt, d, dp, n, 1.0, dktb, s); /* dKt += scale Q^T dS */
        }
    }
}

/* The work is split by problem; with dbias, by bias slice instead: slice c's problems (those with (b / brep) %
 * nbias == c) run in increasing b on one thread, each adding its dS to dbias[c] in that order, so dbias too is
 * the same for any thread count. */
void KFN(k_attention_grad)(T *dq, T *dkt, T *dval, T *dbias, const T *dy, const T *q, const T *kt, int flags,
                           const T *v, const T *bias, const T *y, const T *lse, int64_t batch, int64_t t, int64_t s,
                           int64_t d, int64_t dv, int64_t nbias, int64_t brep, double scale, T *ws)
{
    if (batch <= 0)
        return;
    const int64_t R = k_attention_rows(t), units = dbias ? nbias : batch;
    const int nt = attn_threads(units);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t u = 0; u < units; u++) {
        T *sc = KFN(attn_slot)(ws, R, s);
        if (!dbias) {
            KFN(attn_grad_problem)(u, dq, dkt, dval, NULL, dy, q, kt, flags, v, bias, y, lse, t, s, d, dv, nbias,
                                   brep, scale, sc);
            continue;
        }
        T *dbt = dbias + u * t * s;
        memset(dbt, 0, sizeof(T) * (size_t)(t * s));
        for (int64_t m = 0; m < batch / (nbias * brep); m++)
            for (int64_t rp = 0; rp < brep; rp++)
                KFN(attn_grad_problem)((m * nbias + u) * brep + rp, dq, dkt, dval, dbt, dy, q, kt, flags, v, bias, y,
                                       lse, t, s, d, dv, nbias, brep, scale, sc);
    }
}
