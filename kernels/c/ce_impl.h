/* ce_impl.h — softmax cross-entropy of loss.c, included once per logits
 * dtype with T (the loss's and dloss's element type), X (the logits' and
 * dx's storage), XL(v) (an X as double), XS(d) (a double stored as X) and S
 * (the name suffix) defined: f32 and f64 (X = T), and bf16 / f16 (logits
 * and their gradient in 16 bits, the loss float32, every sum in double as
 * for the others).  No include guard on purpose. */

/* The row loops are omp simd reductions, so that they vectorise (libmvec's double exp, declared in loss.c): a
 * plain sum is an ordered one GCC keeps scalar without -ffast-math.  The lanes' partial sums are combined in an
 * order fixed by the code, so the result is the same on every run and thread count.  A NaN in a row makes its
 * sum NaN whichever way the max treats it. */
static double KFN(row_max)(const X *x, int64_t n)
{
    double mx = XL(x[0]);
#pragma omp simd reduction(max : mx)
    for (int64_t j = 1; j < n; j++)
        mx = XL(x[j]) > mx ? XL(x[j]) : mx;
    return mx;
}

static double KFN(logsumexp)(const X *x, int64_t n)
{
    double mx = KFN(row_max)(x, n), s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++)
        s += exp(XL(x[j]) - mx);
    return mx + log(s);
}

typedef struct {
    const X *x;
    const int64_t *labels;
    int64_t classes;
} KFN(CeJob);

static double KFN(ce_sum)(const void *ctx, int64_t lo, int64_t hi)
{
    const KFN(CeJob) *j = ctx;
    double a = 0;
    for (int64_t r = lo; r < hi; r++) {
        const X *xr = j->x + r * j->classes;
        a += KFN(logsumexp)(xr, j->classes) - XL(xr[j->labels[r]]);
    }
    return a;
}

int64_t KFN(k_cross_entropy)(T *loss, const X *x, const int64_t *labels,
                             int64_t rows, int64_t classes)
{
    for (int64_t r = 0; r < rows; r++)
        if (labels[r] < 0 || labels[r] >= classes)
            return r;
    const double s = par_sum(KFN(ce_sum), &(KFN(CeJob)){x, labels, classes}, rows, classes);
    if (team_writer())
        loss[0] = rows > 0 ? (T)(s / (double)rows) : (T)NAN;
    return -1;
}

/* Row by row (par_range: a team's share inside one), scale = dloss/rows: dx = scale (e / sum - onehot) with
 * e = exp(x - max) rounded to T.  Where X is T, dx holds e first (one
 * exponential per element); a 16-bit dx cannot, so e is kept in a T array
 * on the stack where the row fits (CE_ROW_KEEP classes: the language
 * models' vocabularies up to it), else computed again after the row's sum.
 * Either way x is not read after dx's row is written, so dx may alias x. */
#ifndef CE_ROW_KEEP
#define CE_ROW_KEEP 4096
#endif
typedef struct {
    X *dx;
    const X *x;
    const int64_t *labels;
    int64_t classes;
    double scale;
} KFN(CeGradJob);

/* rows [lo, hi) of dx: each row alike whichever thread takes it */
static void KFN(ce_grad_rows)(void *ctx, int64_t lo, int64_t hi)
{
    const KFN(CeGradJob) *jb = ctx;
    X *const dx = jb->dx;
    const X *const x = jb->x;
    const int64_t *const labels = jb->labels, classes = jb->classes;
    const double scale = jb->scale;
    for (int64_t r = lo; r < hi; r++) {
        const X *xr = x + r * classes;
        X *dr = dx + r * classes;
        double mx = KFN(row_max)(xr, classes), sum = 0;
#if CE_E_IN_DX
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < classes; j++) {
            double e = exp(XL(xr[j]) - mx);
            dr[j] = (T)e;
            sum += e;
        }
        for (int64_t j = 0; j < classes; j++)
            dr[j] = (T)(scale * ((double)dr[j] / sum - (j == labels[r])));
#else
        if (classes <= CE_ROW_KEEP) {
            T e[CE_ROW_KEEP];
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < classes; j++) {
                const double ej = exp(XL(xr[j]) - mx);
                e[j] = (T)ej;
                sum += ej;
            }
            for (int64_t j = 0; j < classes; j++)
                dr[j] = XS(scale * ((double)e[j] / sum - (j == labels[r])));
        } else {
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < classes; j++)
                sum += exp(XL(xr[j]) - mx);
            for (int64_t j = 0; j < classes; j++) {
                const T e = (T)exp(XL(xr[j]) - mx);
                dr[j] = XS(scale * ((double)e / sum - (j == labels[r])));
            }
        }
#endif
    }
}

void KFN(k_cross_entropy_grad)(X *dx, const T *dloss, const X *x,
                               const int64_t *labels, int64_t rows,
                               int64_t classes)
{
    if (rows <= 0 || classes <= 0)
        return;
    KFN(CeGradJob) j = {dx, x, labels, classes, (double)dloss[0] / (double)rows};
    par_range(KFN(ce_grad_rows), &j, rows, classes);
}
