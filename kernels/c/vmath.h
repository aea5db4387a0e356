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
 * How.  Each function widens x to double, computes there with a polynomial
 * whose error is far below a float's ulp (about 1e-11 relative and below),
 * and rounds to float once: the result is within 1 ulp of the exact value
 * (faithful; correctly rounded but where the exact value lies within about
 * 1e-11 relative of a midpoint between two floats).  Widening also removes
 * the float-range edge cases: denormal inputs and outputs, overflow to inf
 * and underflow to 0 come out of the final rounding.
 *   exp(x)  = 2^k p(r), k = round(x / ln 2), r = x - k ln 2 (Cody and
 *             Waite's two-part ln 2), p the Taylor polynomial of degree 9;
 *             2^k built from k's bits.  |x| is clamped to 104, beyond which
 *             the float result is 0 or inf anyway.
 *   erf(x)  = a P(a^2) for a = |x| < 0.921875, else 1 - exp(-a^2 + S(a))
 *             (S a fit of log(erfc(a)) + a^2 on [0.921875, 4], erfc's
 *             relative error is S's absolute one, 3e-9, erf's below 6e-10);
 *             a clamped to 4, where erf rounds to 1.  The sign put back.
 *   tanh(x) = a + a^3 Q(a^2) (Taylor) for a < 1/16, else
 *             1 - 2 / (exp(2a) + 1); a clamped to 10, where tanh rounds to 1.
 *   log(x)  = k ln 2 + 2 atanh(s), s = (m - 1) / (m + 1), x = m 2^k with m
 *             in [sqrt(1/2), sqrt(2)) (from the bits of x as a double, where
 *             a denormal float is normal), the atanh series to s^13.
 * Written for GCC's vectorizer: no libm call, no branch it cannot turn into
 * a select (kf_absmin_ and kf_pick_ say which forms it keeps as branches);
 * each function is forced inline.
 * The fits (P, S) are weighted least squares on Chebyshev nodes refined to
 * near minimax against mpmath; tests/kernels_vmath_test.c checks every
 * function against the double libm over a sweep of the whole float range and
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

/* a*b + c (doubles): one rounding where the target has a fused multiply-add (the essay above) */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define KF_MAD_(a, b, c) __builtin_fma((a), (b), (c))
#else
#define KF_MAD_(a, b, c) ((a) * (b) + (c))
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

/* exp(x) in double for |x| <= 700 (callers clamp; NaN gives NaN), relative error below 1e-11 */
KF_VINLINE double kf_exp_d_(double x)
{
    const double shift = 0x1.8p52; /* x / ln 2 + shift rounds to an integer k, k in its low bits */
    double kd = x * 0x1.71547652b82fep0 + shift;
    const uint64_t kb = kf_dbits_(kd);
    kd -= shift;
    /* ln 2 = 0x1.62e42feep-1 (its low bits zero: k times it is exact) + 0x1.a39ef35793c76p-33 */
    const double r = (x - kd * 0x1.62e42feep-1) - kd * 0x1.a39ef35793c76p-33;
    double p = KF_MAD_(r, 1.0 / 362880, 1.0 / 40320);
    p = KF_MAD_(p, r, 1.0 / 5040);
    p = KF_MAD_(p, r, 1.0 / 720);
    p = KF_MAD_(p, r, 1.0 / 120);
    p = KF_MAD_(p, r, 1.0 / 24);
    p = KF_MAD_(p, r, 1.0 / 6);
    p = KF_MAD_(p, r, 1.0 / 2);
    p = KF_MAD_(p, r, 1);
    p = KF_MAD_(p, r, 1);
    /* 2^k: k into the exponent field (kb << 52 keeps k's low 12 bits, two's complement) */
    return p * kf_bitsd_(0x3ff0000000000000u + (kb << 52));
}

/* |x| with its bits at most lim's, NaN a NaN.  Written as integer arithmetic, not as a select of a constant or a
 * final "x != x ? x : r": GCC would fold the rest of the function on the constant's path, or move r's computation
 * into the other branch, and the branch left stops the loop from vectorising. */
KF_VINLINE double kf_absmin_(float x, uint32_t lim)
{
    const uint32_t a = kf_fbits_(x) & 0x7fffffffu;
    return kf_bitsf_((a < lim ? a : lim) | (uint32_t)(a > 0x7f800000u) * 0x7fc00000u);
}

/* c ? p : q for finite p and q, as arithmetic (exact: 1 p + 0 q is p): a select would let GCC compute p and q
 * each in its branch, as kf_absmin_ says */
KF_VINLINE double kf_pick_(int c, double p, double q)
{
    const double w = c;
    return w * p + (1 - w) * q;
}

KF_VINLINE float kf_expf(float x)
{
    /* |x| at most 104: exp(-104) < 2^-150 rounds to 0, exp(104) > FLT_MAX to inf */
    const double d = kf_absmin_(x, 0x42d00000u /* 104 */);
    return (float)kf_exp_d_(kf_fbits_(x) >> 31 ? -d : d);
}

KF_VINLINE float kf_erff(float x)
{
    const double a = kf_absmin_(x, 0x40800000u /* 4: erf rounds to 1 from 3.92 */);
    const double z = a * a; /* exact: a has 24 significant bits */
    /* erf(a) / a as a polynomial of a^2 on [0, 0.921875] */
    double small = KF_MAD_(z, -0x1.594076ef2c000p-17, 0x1.e061b4e8ec800p-14);
    small = KF_MAD_(small, z, -0x1.bdf76388d1180p-11);
    small = KF_MAD_(small, z, 0x1.563fe370958a0p-8);
    small = KF_MAD_(small, z, -0x1.b82b610615f54p-6);
    small = KF_MAD_(small, z, 0x1.ce2f174fd45c4p-4);
    small = KF_MAD_(small, z, -0x1.8127469529422p-2);
    small = a * KF_MAD_(small, z, 0x1.20dd75041dfa7p+0);
    /* log(erfc(a)) + a^2 on [0.921875, 4], a polynomial of t = a - 2.4609375 */
    const double t = a - 2.4609375;
    double s = KF_MAD_(t, -0x1.d61392e000000p-25, -0x1.57c7468a00000p-25);
    s = KF_MAD_(s, t, 0x1.0400d0d540000p-19);
    s = KF_MAD_(s, t, -0x1.c856a3b79b000p-17);
    s = KF_MAD_(s, t, 0x1.515eb2890e000p-14);
    s = KF_MAD_(s, t, -0x1.cc6d29eea2480p-12);
    s = KF_MAD_(s, t, 0x1.26db6fe1ae400p-9);
    s = KF_MAD_(s, t, -0x1.6f1a36436334cp-7);
    s = KF_MAD_(s, t, 0x1.d635e864dbedcp-5);
    s = KF_MAD_(s, t, -0x1.6daf5c7eee572p-2);
    s = KF_MAD_(s, t, -0x1.8afeedf75b608p+0);
    const double big = 1 - kf_exp_d_(s - z);
    return kf_bitsf_(kf_fbits_((float)kf_pick_(a < 0.921875, small, big)) | (kf_fbits_(x) & 0x80000000u));
}

KF_VINLINE float kf_tanhf(float x)
{
    const double a = kf_absmin_(x, 0x41200000u /* 10: tanh rounds to 1 from 9.02 */);
    const double z = a * a;
    double q = KF_MAD_(z, 62.0 / 2835, -17.0 / 315);
    q = KF_MAD_(q, z, 2.0 / 15);
    q = KF_MAD_(q, z, -1.0 / 3);
    const double small = KF_MAD_(a * z, q, a);
    const double big = 1 - 2 / (kf_exp_d_(2 * a) + 1);
    return kf_bitsf_(kf_fbits_((float)kf_pick_(a < 0.0625, small, big)) | (kf_fbits_(x) & 0x80000000u));
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
#endif
