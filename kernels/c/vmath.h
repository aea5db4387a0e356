/* vmath.h — exp, erf, tanh and log of a float, written as plain arithmetic
 * so that a loop GCC vectorises computes the same bits as the same loop run
 * scalar (fused.h's float rows use these, not libm's expf, erff, tanhf,
 * logf).
 *
 * Why.  A libm call stops a loop from vectorising, unless the vector math of
 * glibc (libmvec) is declared, and libmvec's results differ from scalar
 * libm's by a few ulp.  Which elements take a loop's vector body and which
 * its scalar tail depends on the loop (where it starts, how it is fused, how
 * the threads split it), so the same value computed by two loops came out
 * other bits: --recompute's bit-identity broke (CHANGELOG, precision.md).
 * Here every operation is an IEEE one (+ - * /, fused multiply-add,
 * conversions, integer bit operations), each correctly rounded alike in a
 * vector lane and a scalar register.  The build's -std=c11 (and the step's)
 * means -ffp-contract=off, so the compiler fuses no a*b+c on its own; the
 * polynomials' steps are KF_MAD_, an explicit fma() where the target has the
 * instruction (__FMA__: x86-64-v3 and up, as the kernels and a native step
 * are built here), else a multiply and an add.  So the bits depend on the
 * -march level (as the GEMMs' do: tests/py/threads.py compares levels
 * within 1e-4), never on whether a loop vectorised; the fused form halves
 * the polynomials' instructions (the demo GPT's erf loop, GELU's, was 6 % of
 * its 256/6/256/8 step on oneDNN).
 *
 * How.  exp, erf and tanh compute in float, a vector register holding 16
 * of them on AVX-512 (they widened to double before, 8 a register: the
 * Gelu node's loops, forward and gradient, went from 1.17 and 1.70 ns an
 * element to 0.42 and 0.65, its tanh form's forward from 0.91 to 0.45,
 * SiLU's from 0.52 to 0.24); log widens x to double, computes there with a
 * polynomial whose error is far below a float's ulp, and rounds to float
 * once, which also removes the float-range edge cases (denormals, overflow,
 * underflow come out of the rounding).  Measured over every float (the
 * test checks a sweep): exp within 0.98 ulp of the exact value (faithful),
 * with or without FMA; tanh within 1.04 ulp; erf within 1.09 ulp where the
 * target has FMA (x86-64-v3 and up), 2.07 without; log within 0.5.
 *   exp(x)  = 2^k p(r), k = round(x / ln 2), r = x - k ln 2 (Cody and
 *             Waite's two-part ln 2), p = 1 + r + r^2 q(r), q of degree 5;
 *             2^k as the product of two powers of two, so that denormal
 *             results round once.  |x| is clamped to 104, beyond which the
 *             float result is 0 or inf anyway.
 *   erf(x)  = a (c0 + z P(z)) for a = |x| < 0.921875, z = a^2, else
 *             1 - exp(S(a)) (S a fit of log(erfc(a)) on [0.921875, 4],
 *             weighted by erfc(a), whose absolute error is erf's);
 *             a clamped to 4, where erf rounds to 1.  The sign put back.
 *   tanh(x) = a + a^3 Q(a^2) for a < 0.875, else 1 - 2 / (exp(2a) + 1);
 *             a clamped to 10, where tanh rounds to 1.
 *   log(x)  = k ln 2 + 2 atanh(s), s = (m - 1) / (m + 1), x = m 2^k with m
 *             in [sqrt(1/2), sqrt(2)) (from the bits of x as a double, where
 *             a denormal float is normal), the atanh series to s^13.
 * Written for GCC's vectorizer: no libm call, no branch it cannot turn into
 * a select (kf_absmin_ and kf_pick_ say which forms it keeps as branches);
 * each function is forced inline.
 * The fits (q, P, S, Q) are weighted least squares on Chebyshev nodes refined
 * to near minimax (Lawson's reweighting), each coefficient rounded to float
 * in turn and the rest refitted, against the double libm (erf, erfc, exp, tanh);
 * tests/kernels_vmath_test.c checks every function against the double libm
 * over a sweep of the whole float range and
 * the edge cases (±0, denormals, ±inf, NaN, the overflow and underflow
 * thresholds), and that a vectorised loop gives the scalar bits.
 *
 * The cuda target does not use these (fused.h keeps CUDA's own math under
 * NVRTC); the float64 rows keep libm's, which no loop vectorises (fused.h
 * declares no libmvec for double), so they too compute alike everywhere.
 */
#ifndef FSDPC_VMATH_H
#define FSDPC_VMATH_H

#include <stdint.h>
#include <string.h>

/* a*b + c (doubles; KF_MADF_ floats): one rounding where the target has a fused multiply-add (the essay above) */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define KF_MAD_(a, b, c) __builtin_fma((a), (b), (c))
#define KF_MADF_(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define KF_MAD_(a, b, c) ((a) * (b) + (c))
#define KF_MADF_(a, b, c) ((a) * (b) + (c))
#endif

/* forced inline: a call left out of line stops its loop from vectorising */
#ifdef __GNUC__
#define KF_VINLINE static inline __attribute__((always_inline))
#else
#define KF_VINLINE static inline
#endif

KF_VINLINE uint32_t kf_fbits_(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
KF_VINLINE float kf_bitsf_(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
KF_VINLINE uint64_t kf_dbits_(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
KF_VINLINE double kf_bitsd_(uint64_t u)
{
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* |x| with its bits at most lim's, NaN a NaN.  Written as integer arithmetic, not as a select of a constant or a
 * final "x != x ? x : r": GCC would fold the rest of the function on the constant's path, or move r's computation
 * into the other branch, and the branch left stops the loop from vectorising. */
KF_VINLINE float kf_absmin_(float x, uint32_t lim)
{
    const uint32_t a = kf_fbits_(x) & 0x7fffffffu;
    return kf_bitsf_((a < lim ? a : lim) | (uint32_t)(a > 0x7f800000u) * 0x7fc00000u);
}

/* c ? p : q, with x's sign put on the result, as a mask of bits (for the same reason: GCC keeps it in the vector) */
KF_VINLINE float kf_pick_(int c, float p, float q, float x)
{
    const uint32_t m = (uint32_t)0 - (uint32_t)c;
    return kf_bitsf_((kf_fbits_(p) & m) | (kf_fbits_(q) & ~m) | (kf_fbits_(x) & 0x80000000u));
}

/* exp(x) = p 2^k for |x| <= 104 (callers clamp), in float: k = round(x / ln 2) by the shift trick (its bits,
 * no float-to-int conversion: NaN stays harmless), r = x - k ln 2 in two parts (ln 2's high part has 15
 * significant bits, so k times it is exact without a fused multiply-add), p = 1 + r + r^2 q(r) in
 * [sqrt(1/2), sqrt 2] (q a fit of degree 5, relative error 1e-10) */
KF_VINLINE float kf_expk_(float x, int32_t *k)
{
    const float shift = 0x1.8p23f; /* x / ln 2 + shift rounds to an integer k, k in its low bits */
    float kd = KF_MADF_(x, 0x1.715476p0f, shift);
    *k = (int32_t)(kf_fbits_(kd) - kf_fbits_(shift));
    kd -= shift;
    float r = KF_MADF_(kd, -0x1.62e400p-1f, x);
    r = KF_MADF_(kd, -0x1.7f7d1cp-20f, r);
    float q = KF_MADF_(r, 0x1.9dfb88p-13f, 0x1.6d4cb8p-10f);
    q = KF_MADF_(q, r, 0x1.11130ep-7f);
    q = KF_MADF_(q, r, 0x1.5554e8p-5f);
    q = KF_MADF_(q, r, 0x1.555554p-3f);
    q = KF_MADF_(q, r, 0x1p-1f);
    return 1.0f + KF_MADF_(r * r, q, r);
}

KF_VINLINE float kf_expf(float x)
{
    /* |x| at most 104 (its sign and NaN kept): exp(-104) < 2^-150 rounds to 0, exp(104) > FLT_MAX to inf */
    const float c = kf_bitsf_(kf_fbits_(kf_absmin_(x, 0x42d00000u /* 104 */)) | (kf_fbits_(x) & 0x80000000u));
    int32_t k;
    const float p = kf_expk_(c, &k);
    /* 2^k as two normal powers of two (k in [-150, 150]): p 2^k1 is exact, the second product rounds once, to a
     * denormal, to 0 or to inf where the result is one */
    const int32_t k1 = k / 2, k2 = k - k1;
    return p * kf_bitsf_((uint32_t)(k1 + 127) << 23) * kf_bitsf_((uint32_t)(k2 + 127) << 23);
}

KF_VINLINE float kf_erff(float x)
{
    /* a = |x| at most 4 (NaN kept): erf rounds to 1 from 3.92 */
    const float a = kf_absmin_(x, 0x40800000u /* 4 */);
    /* a < 0.921875: erf(a) = a (c0 + z P(z)), z = a^2; c0 = 2 / sqrt(pi) as a float plus the float of its remainder
     * (which the fit's constant term carries), the last step a fused multiply-add */
    const float z = a * a;
    float s = KF_MADF_(z, 0x1.5d47c6p-14f, -0x1.aa8302p-11f);
    s = KF_MADF_(s, z, 0x1.54d4a2p-8f);
    s = KF_MADF_(s, z, -0x1.b810a0p-6f);
    s = KF_MADF_(s, z, 0x1.ce2e30p-4f);
    s = KF_MADF_(s, z, -0x1.812744p-2f);
    s = KF_MADF_(s, z, -0x1.f7ac92p-25f);
    const float small = KF_MADF_(a, 0x1.20dd76p+0f, a * s);
    /* else erf(a) = 1 - exp(S(a)), S a fit of log(erfc(a)) on [0.921875, 4] in t = a - 1.5, weighted by erfc(a) (its
     * absolute error is erf's: 2.4e-9); exp's k here lies in [-26, -2] */
    const float t = a - 1.5f;
    float b = KF_MADF_(t, 0x1.ac2416p-13f, -0x1.4ff614p-10f);
    b = KF_MADF_(b, t, 0x1.89a6d4p-8f);
    b = KF_MADF_(b, t, -0x1.a6fd72p-6f);
    b = KF_MADF_(b, t, -0x1.c907ecp-1f);
    b = KF_MADF_(b, t, -0x1.c12064p+1f);
    b = KF_MADF_(b, t, -0x1.b1370ap+1f);
    int32_t k;
    const float p = kf_expk_(b, &k);
    const float big = 1.0f - p * kf_bitsf_((uint32_t)(k + 127) << 23);
    return kf_pick_(a < 0.921875f, small, big, x);
}

KF_VINLINE float kf_tanhf(float x)
{
    /* a = |x| at most 10 (NaN kept): tanh rounds to 1 from 9.02 */
    const float a = kf_absmin_(x, 0x41200000u /* 10 */);
    /* a < 0.875: tanh(a) = a + a z Q(z), z = a^2 (Q of degree 6, relative error 7e-10) */
    const float z = a * a;
    float q = KF_MADF_(z, -0x1.f9b7d6p-12f, 0x1.5b6d5ap-9f);
    q = KF_MADF_(q, z, -0x1.110230p-7f);
    q = KF_MADF_(q, z, 0x1.6376eep-6f);
    q = KF_MADF_(q, z, -0x1.b9da52p-5f);
    q = KF_MADF_(q, z, 0x1.110fa8p-3f);
    q = KF_MADF_(q, z, -0x1.555550p-2f);
    const float small = KF_MADF_(a * z, q, a);
    /* else 1 - 2 / (exp(2a) + 1), 2/(exp(2a) + 1) at most 0.296 there; exp's k lies in [2, 29] */
    int32_t k;
    const float p = kf_expk_(2 * a, &k);
    const float big = 1.0f - 2.0f / (p * kf_bitsf_((uint32_t)(k + 127) << 23) + 1.0f);
    return kf_pick_(a < 0.875f, small, big, x);
}

KF_VINLINE float kf_logf(float x)
{
    /* x = m 2^k, m in [sqrt(1/2), sqrt(2)): k from the distance of the double's high word to sqrt(1/2)'s (kept
     * unsigned: + 1024); a denormal float is a normal double */
    const double d = x;
    const uint32_t hi = (uint32_t)(kf_dbits_(d) >> 32) & 0x7fffffffu;
    const int32_t k = (int32_t)((hi - 0x3fe6a09eu + 0x40000000u) >> 20) - 1024;
    const double m = kf_bitsd_(kf_dbits_(d) - ((uint64_t)(int64_t)k << 52));
    const double s = (m - 1) / (m + 1), z = s * s;
    double q = KF_MAD_(z, 1.0 / 13, 1.0 / 11);
    q = KF_MAD_(q, z, 1.0 / 9);
    q = KF_MAD_(q, z, 1.0 / 7);
    q = KF_MAD_(q, z, 1.0 / 5);
    q = KF_MAD_(q, z, 1.0 / 3);
    const double lg = 2 * s * KF_MAD_(q, z, 1);
    const uint32_t r = kf_fbits_((float)KF_MAD_((double)k, 0x1.62e42fefa39efp-1, lg));
    /* 0: -inf; below 0 or NaN: NaN; inf: inf (an integer select of the bits, as kf_absmin_) */
    const uint32_t u = kf_fbits_(x), special = (uint32_t)0 - (uint32_t)((u & 0x7fffffffu) == 0 || u >= 0x7f800000u);
    const uint32_t sbits = u == 0 || u == 0x80000000u ? 0xff800000u : u == 0x7f800000u ? u : 0x7fc00000u;
    return kf_bitsf_((r & ~special) | (sbits & special));
}

#undef KF_VINLINE
#undef KF_MAD_
#undef KF_MADF_
#endif
