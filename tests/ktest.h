/* ktest.h — the harness shared by the kernels/c test programs
 * (kernels_test.c, kernels_ew_test.c, kernels_nn_test.c, kernels_attn_test.c).
 *
 * How it works.  Each test is written once and run for both dtypes.  A Buf
 * holds a tensor as doubles (the f64 kernels work on them directly) plus a
 * float shadow for the f32 kernels; inputs are drawn as floats so both dtypes
 * see identical values.  put() copies values into the shadow before an f32
 * call, get() reads results back after it.  KCALL(name, args) calls name_f32
 * or name_f64 by the dtype in scope, with V(buf) passing the matching
 * storage, so a test spells each kernel call once.
 *
 * Expected values come from naive loops in the tests (unravel every index,
 * no stride merging, no BLAS).  Gradients are checked against float64
 * central finite differences of the forward: loss = sum(w y) for random w,
 * d loss / d x[e] ~ (loss(x + h e) - loss(x - h e)) / 2h (fd_grad), with the
 * backward run on dy = w.  Every failing check prints what it was, which
 * element, expected and actual; ktest_main returns 1 if any check failed.
 * Everything is static inline so a program that skips a helper does not
 * warn.
 */
#ifndef FSDPC_KTEST_H
#define FSDPC_KTEST_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#ifdef _OPENMP
#include <cblas.h>
#include <omp.h>
/* The kernels' team of n, as an executable sets it (k_threads): OpenMP's count and OpenBLAS's together (in
 * OpenBLAS's OpenMP build openblas_set_num_threads sets OpenMP's too); the previous count.  Setting OpenMP's alone
 * left a 1-thread run's GEMMs on OpenBLAS's threads, which no executable does, and OpenBLAS's Haswell kernels
 * (OPENBLAS_CORETYPE=Haswell, as some machines of this project's kind set it) sum differently on more threads. */
static inline int ktest_team(int n)
{
    const int before = omp_get_max_threads();
    openblas_set_num_threads(n);
    omp_set_num_threads(n);
    return before;
}
#endif

enum { F32, F64 };
static const char *const dtname[] = {"f32", "f64"};

static int checks, failures;
static char what[256];  /* names the check in progress, for failure lines */

#define CTX(...) snprintf(what, sizeof what, __VA_ARGS__)

/* got ~ want elementwise: |got - want| <= tol (1 + |want|); tol 0 = exact.
 * NaN only matches NaN, an infinity only itself. */
static inline void check(int dt, const double *got, const double *want, int64_t n,
                         double tol)
{
    checks++;
    for (int64_t i = 0; i < n; i++) {
        int ok = isnan(want[i]) ? isnan(got[i])
                                : got[i] == want[i] ||  /* infinities */
                                      fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]));
        if (!ok) {
            printf("FAIL %s [%s] at %lld: expected %.17g, actual %.17g\n", what,
                   dtname[dt], (long long)i, want[i], got[i]);
            failures++;
            return;
        }
    }
}

static inline void check_int(int dt, int64_t got, int64_t want)
{
    checks++;
    if (got != want) {
        printf("FAIL %s [%s]: expected %lld, actual %lld\n", what, dtname[dt],
               (long long)want, (long long)got);
        failures++;
    }
}

/* n bytes equal */
static inline void check_bytes(int dt, const void *got, const void *want, size_t n)
{
    checks++;
    for (size_t i = 0; i < n; i++)
        if (((const uint8_t *)got)[i] != ((const uint8_t *)want)[i]) {
            printf("FAIL %s [%s] at byte %zu: expected %u, actual %u\n", what, dtname[dt],
                   i, ((const uint8_t *)want)[i], ((const uint8_t *)got)[i]);
            failures++;
            return;
        }
}

/* default tolerance: a few roundings of the dtype */
static inline double tol(int dt) { return dt == F32 ? 1e-5 : 1e-12; }
/* analytic gradient vs finite differences: f32 rounding, or the FD error */
static inline double gtol(int dt) { return dt == F32 ? 1e-4 : 1e-6; }

/* ---- buffers ------------------------------------------------------------ */

typedef struct {
    int64_t n;
    double *d;  /* values; the f64 kernels' storage */
    float *f;   /* the f32 kernels' storage */
} Buf;

static inline void *xalloc(size_t n, size_t size)
{
    void *p = calloc(n + 1, size);
    if (!p) {
        fprintf(stderr, "ktest: out of memory\n");
        exit(2);
    }
    return p;
}

static inline Buf buf_new(int64_t n)
{
    Buf b = {n, xalloc((size_t)n, sizeof(double)), xalloc((size_t)n, sizeof(float))};
    return b;
}

static inline void buf_free(Buf *b)
{
    free(b->d);
    free(b->f);
}

/* before an f32 call: copy values into the float shadow */
static inline void put(int dt, Buf *b)
{
    if (dt == F32)
        for (int64_t i = 0; i < b->n; i++) b->f[i] = (float)b->d[i];
}

/* after an f32 call: read results back */
static inline void get(int dt, Buf *b)
{
    if (dt == F32)
        for (int64_t i = 0; i < b->n; i++) b->d[i] = b->f[i];
}

/* put / get on a NULL-terminated list of buffers */
static inline void puts_(int dt, ...)
{
    va_list ap;
    va_start(ap, dt);
    for (Buf *b; (b = va_arg(ap, Buf *));) put(dt, b);
    va_end(ap);
}

static inline void gets_(int dt, ...)
{
    va_list ap;
    va_start(ap, dt);
    for (Buf *b; (b = va_arg(ap, Buf *));) get(dt, b);
    va_end(ap);
}

#define PUT(...) puts_(dt, __VA_ARGS__, (Buf *)NULL)
#define GET(...) gets_(dt, __VA_ARGS__, (Buf *)NULL)

/* the storage of b that the dtype dt's kernels use */
static inline void *vp(int dt, Buf *b) { return dt == F32 ? (void *)b->f : (void *)b->d; }

/* V(b): that storage for the dtype `dt` in scope; KCALL(k_x, ...) calls
 * k_x_f32 or k_x_f64 by it */
#define V(b) vp(dt, &(b))
#define KCALL(name, ...) ((dt) == F32 ? name##_f32(__VA_ARGS__) : name##_f64(__VA_ARGS__))

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

/* uniform in [lo, hi), rounded to float so both dtypes get the same input */
static inline double rnd(double lo, double hi)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    double u = (double)((rng_state * 0x2545F4914F6CDD1Du) >> 11) / 9007199254740992.0;
    /* volatile: GCC 12 -O3 vectorises fill_rnd and drops a (double)(float) round trip */
    volatile float f = (float)(lo + (hi - lo) * u);
    return f;
}

static inline void fill_rnd(Buf *b, double lo, double hi)
{
    for (int64_t i = 0; i < b->n; i++) b->d[i] = rnd(lo, hi);
}

static inline void fill_val(Buf *b, double v)
{
    for (int64_t i = 0; i < b->n; i++) b->d[i] = v;
}

static inline void set(Buf *b, const double *v)
{
    memcpy(b->d, v, (size_t)b->n * sizeof(double));
}

/* ---- index helpers for the naive loops ---------------------------------- */

static inline int64_t numel(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < rank; d++) n *= shape[d];
    return n;
}

/* idx = row-major unravel of lin over shape */
static inline void unravel(int64_t lin, int rank, const int64_t *shape, int64_t *idx)
{
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = lin % shape[d];
        lin /= shape[d];
    }
}

static inline int64_t dot(int rank, const int64_t *idx, const int64_t *st)
{
    int64_t o = 0;
    for (int d = 0; d < rank; d++) o += idx[d] * st[d];
    return o;
}

static inline void dense_strides(int rank, const int64_t *shape, int64_t *st)
{
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; d--) {
        st[d] = s;
        s *= shape[d];
    }
}

/* numpy broadcasting: strides of x (rank rx, right-aligned) over y's dims */
static inline void bcast_strides(int ry, int rx, const int64_t *xshape, int64_t *st)
{
    int64_t dense[8];
    dense_strides(rx, xshape, dense);
    for (int d = 0; d < ry; d++) {
        int xd = d - (ry - rx);
        st[d] = xd < 0 || xshape[xd] == 1 ? 0 : dense[xd];
    }
}

/* ---- finite differences ------------------------------------------------- */

/* A float64 forward: y (ny elements) from the inputs in[]. */
typedef void (*FwdFn)(void *ctx, double *const *in, double *y);

static inline double wsum(const double *w, const double *y, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += w[i] * y[i];
    return s;
}

/* g[e] = d sum(w y) / d in[k][e] by central differences with step h,
 * for the nk elements of input k (restored afterwards). */
static inline void fd_grad(FwdFn f, void *ctx, double *const *in, int k, int64_t nk,
                           const double *w, int64_t ny, double *g, double h)
{
    double *y = xalloc((size_t)ny, sizeof(double));
    for (int64_t e = 0; e < nk; e++) {
        const double save = in[k][e];
        in[k][e] = save + h;
        f(ctx, in, y);
        double lp = wsum(w, y, ny);
        in[k][e] = save - h;
        f(ctx, in, y);
        double lm = wsum(w, y, ny);
        in[k][e] = save;
        g[e] = (lp - lm) / (2 * h);
    }
    free(y);
}

/* Compares the analytic gradient `got` (nk elements, in dtype dt) with the
 * finite-difference gradient of input k. */
static inline void check_fd(int dt, FwdFn f, void *ctx, double *const *in, int k,
                            int64_t nk, const double *w, int64_t ny, const double *got)
{
    double *g = xalloc((size_t)nk, sizeof(double));
    fd_grad(f, ctx, in, k, nk, w, ny, g, 1e-5);
    check(dt, got, g, nk, gtol(dt));
    free(g);
}

/* Runs every test for both dtypes and prints the tally. */
/* Runs every test on F32 and F64.  FSDPC_GEMM=onednn (or openblas) puts the float32 GEMMs on that library, as
 * it does in an executable (runtime/dev_host.c): the kernels_*_onednn tests. */
static inline int ktest_main(const char *prog, void (*const *tests)(int), size_t ntests)
{
    const char *lib = getenv("FSDPC_GEMM");
    if (lib && *lib && strcmp(lib, "openblas") && strcmp(lib, "onednn")) {
        fprintf(stderr, "%s: FSDPC_GEMM=%s: expected openblas or onednn\n", prog, lib);
        return 2;
    }
    k_gemm_use(lib && !strcmp(lib, "onednn") ? K_GEMM_ONEDNN : K_GEMM_OPENBLAS);
    for (int dt = F32; dt <= F64; dt++)
        for (size_t t = 0; t < ntests; t++)
            tests[t](dt);
    printf("%s: %d checks, %d failed\n", prog, checks, failures);
    return failures ? 1 : 0;
}

#endif
