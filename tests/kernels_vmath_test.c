/* kernels_vmath_test.c — kernels/c/vmath.h's exp, erf, tanh and log of a
 * float: against the double libm, and the same bits in a vectorised loop as
 * scalar.
 *
 * Inputs: every 2039th float bit pattern of both signs (about 2.1 million,
 * all binades, denormals included) and the edge cases (±0, the smallest
 * denormal, FLT_MIN, FLT_MAX, ±inf, NaN, the overflow and underflow
 * thresholds of exp and where erf and tanh round to 1).
 *
 * Checks, per function and input:
 * - accuracy: within 1 ulp of the double libm's value (faithful rounding;
 *   the ulp of a denormal result is 2^-149) for exp and log, tanh within
 *   1.1 ulp, erf within 1.1 ulp where built with FMA and 2.1 without (the
 *   largest errors over every float: vmath.h's essay); where that value
 *   rounds to ±inf, ±0 or NaN,
 *   the same (the sign of a zero included);
 * - scalar and vector alike: the result of a call kept out of any loop (a
 *   noinline function) has the same bits as the same function in a loop
 *   over an array compiled to vectorise (-O3), for the baseline x86-64 and,
 *   where the CPU has them, AVX2+FMA and AVX-512 (target attributes: the
 *   -march levels the kernels and the step are built for).  That the loops
 *   do vectorise was checked with -fopt-info-vec (DOC of the change); the
 *   test cannot see it.
 * Prints the largest error in ulps of each function.
 *
 * Built twice: as the baseline x86-64 (vmath.h's plain multiply and add),
 * and as kernels_vmath_fma with -mavx2 -mfma (its KF_MAD_ a fused
 * multiply-add, as the kernels and a step built for x86-64-v3 and up
 * compute), which exits 77 (ctest: skipped, with a line saying so) on a CPU
 * without FMA.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmath.h"

enum { F_EXP, F_ERF, F_TANH, F_LOG, NF };
static const char *const fname[NF] = {"exp", "erf", "tanh", "log"};
/* the largest error allowed, in ulps (the measured largest over every float: vmath.h's essay) */
#ifdef __FMA__
static const double bound[NF] = {1, 1.1, 1.1, 1};
#else
static const double bound[NF] = {1, 2.1, 1.1, 1};
#endif

/* one call, out of any loop */
static __attribute__((noinline)) float one(int f, float x)
{
    switch (f) {
    case F_EXP: return kf_expf(x);
    case F_ERF: return kf_erff(x);
    case F_TANH: return kf_tanhf(x);
    default: return kf_logf(x);
    }
}

/* a loop over n elements, each function's its own loop (as the kernels and the fused loops) */
#define VLOOP(name, attr)                                                                                          \
    static attr __attribute__((noinline)) void name(int f, const float *restrict x, float *restrict y, size_t n)   \
    {                                                                                                              \
        switch (f) {                                                                                               \
        case F_EXP: for (size_t i = 0; i < n; i++) y[i] = kf_expf(x[i]); break;                                    \
        case F_ERF: for (size_t i = 0; i < n; i++) y[i] = kf_erff(x[i]); break;                                    \
        case F_TANH: for (size_t i = 0; i < n; i++) y[i] = kf_tanhf(x[i]); break;                                  \
        default: for (size_t i = 0; i < n; i++) y[i] = kf_logf(x[i]); break;                                       \
        }                                                                                                          \
    }
VLOOP(loop_base, )
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HAVE_LEVELS 1
VLOOP(loop_avx2, __attribute__((target("avx2,fma"))))
VLOOP(loop_avx512, __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma"))))
#endif

static double ref(int f, double x)
{
    switch (f) {
    case F_EXP: return exp(x);
    case F_ERF: return erf(x);
    case F_TANH: return tanh(x);
    default: return log(x);
    }
}

static uint32_t bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* error of y in ulps of the float nearest r (2^-149 for denormals); -1 where an exact case (inf, 0, NaN) fails */
static double ulps(float y, double r)
{
    const float rf = (float)r;
    if (isnan(r) || isinf(rf) || rf == 0)
        return isnan(r) ? (isnan(y) ? 0 : -1) : bits(y) == bits(rf) ? 0 : -1;
    if (!isfinite(y))
        return -1;
    int e;
    frexp(rf, &e); /* |rf| in [2^(e-1), 2^e) */
    const double ulp = ldexp(1, (e - 1 < FLT_MIN_EXP - 1 ? FLT_MIN_EXP - 1 : e - 1) - (FLT_MANT_DIG - 1));
    return fabs((double)y - r) / ulp;
}

int main(void)
{
#ifdef __FMA__
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("fma") || !__builtin_cpu_supports("avx2")) {
        printf("kernels_vmath_test built with FMA: this CPU has no FMA or AVX2, not run\n");
        return 77;
    }
    printf("built with FMA (KF_MAD_ a fused multiply-add)\n");
#endif
    static const float edge[] = {0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-140f, FLT_MIN, -FLT_MIN, 0x1.fffffcp-127f,
        FLT_MAX, -FLT_MAX, INFINITY, -INFINITY, NAN, -NAN, 1.0f, -1.0f, 0.5f, 2.0f, 88.72283f, 88.72284f, 88.7229f,
        89.0f, -87.33654f, -87.33655f, -103.27893f, -103.97208f, -103.972084f, -104.0f, -150.0f, 0.0625f, 0.06249999f,
        0.921875f, 0.92187494f, 3.9192059f, 3.92f, 4.0f, 9.010913f, 10.0f, 0x1p-12f, 0x1p-30f, 0.70710677f,
        0.7071068f, 1.4142135f, 1.0000001f, 0.99999994f};
    const size_t nedge = sizeof edge / sizeof edge[0], step = 2039;
    const size_t n = nedge + (((size_t)1 << 32) + step - 1) / step;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    if (!x || !y) {
        fprintf(stderr, "kernels_vmath_test: out of memory\n");
        return 1;
    }
    memcpy(x, edge, sizeof edge);
    size_t m = nedge;
    for (uint64_t u = 0; u < ((uint64_t)1 << 32); u += step) {
        const uint32_t b = (uint32_t)u;
        memcpy(&x[m++], &b, sizeof b);
    }
    int fails = 0;
    for (int f = 0; f < NF; f++) {
        double worst = 0;
        float worst_x = 0;
        int bad = 0;
        for (size_t i = 0; i < m; i++) {
            const float v = one(f, x[i]);
            const double e = ulps(v, ref(f, x[i]));
            if (e < 0 || e > bound[f]) {
                if (bad++ < 5)
                    fprintf(stderr, "FAIL %s(%a) = %a, the double libm's %a (%g ulp)\n", fname[f], (double)x[i],
                        (double)v, ref(f, x[i]), e);
            } else if (e > worst) {
                worst = e;
                worst_x = x[i];
            }
            y[i] = v;
        }
        /* the vectorised loops: the scalar bits (NaN's payload aside) */
        struct { const char *name; void (*fn)(int, const float *, float *, size_t); int have; } level[] = {
            {"baseline", loop_base, 1},
#ifdef HAVE_LEVELS
            {"avx2", loop_avx2, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
            {"avx512", loop_avx512, __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")},
#endif
        };
        float *z = malloc(m * sizeof *z);
        if (!z) {
            fprintf(stderr, "kernels_vmath_test: out of memory\n");
            return 1;
        }
        for (size_t l = 0; l < sizeof level / sizeof level[0]; l++) {
            if (!level[l].have)
                continue;
            int differ = 0;
            level[l].fn(f, x, z, m);
            for (size_t i = 0; i < m; i++)
                if (bits(z[i]) != bits(y[i]) && !(isnan(z[i]) && isnan(y[i])) && differ++ < 5)
                    fprintf(stderr, "FAIL %s(%a): %a in the %s loop, %a scalar\n", fname[f], (double)x[i],
                        (double)z[i], level[l].name, (double)y[i]);
            printf("%s: the %s loop %s\n", fname[f], level[l].name,
                differ ? "differs from the scalar bits: FAILED" : "gives the scalar bits");
            bad += differ;
        }
        free(z);
        printf("%s: %zu inputs, at most %.3f ulp from the double libm (at %a)%s\n", fname[f], m, worst,
            (double)worst_x, bad ? ": FAILED" : "");
        fails += bad != 0;
    }
    free(x);
    free(y);
    return fails != 0;
}
