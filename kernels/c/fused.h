/* fused.h — one element of an elementwise op, for the fused loops fsdpc
 * generates (passes/fuse.c, codegen/emit_fused.c).  The same text is
 * compiled into the cpu step (C11) and, embedded in fsdpc, into the cuda
 * kernels by NVRTC (-default-device makes these device functions), so the
 * two targets' fused code computes alike.
 *
 * It is also where the elementwise math is written, once (KF_BINARY,
 * KF_UNARY below): the cpu kernels and the cuda kernels compute each element
 * with the functions defined here, so every path computes alike.
 *
 * kf_binary_S(op, a, b), kf_unary_S(op, x, p0, p1) and
 * kf_unary_grad_S(op, dy, x, y, p0, p1) follow the contracts of k_binary,
 * k_unary and k_unary_grad in kernels.h element by element, with the same
 * op codes; S is f32 or f64.  Callers pass op as a constant where they can
 * (the generated code, the cpu kernels' loops), so each switch folds to one
 * expression.
 */
#ifndef FSDPC_FUSED_H
#define FSDPC_FUSED_H

#ifndef __CUDACC_RTC__
#include <math.h>
#include "vmath.h" /* the float rows' exp, erf, tanh and log: the same bits in a vectorised loop as scalar */
/* glibc's vector expf (libmvec, which -lm links as needed): declared here for GCC's vectorizer, so the loops of
 * the kernels that call expf themselves (softmax, attention) compute it for 4-16 elements at once (glibc's own
 * headers declare it only under -ffast-math, which fsdpc does not use: NaN and infinities must stay).  It is
 * within 4 ulp of the scalar expf, other bits, so the rows below do not use it: the float rows take vmath.h's
 * functions, the double rows libm's, which no loop vectorises (no libmvec declared for them; KF_SIMD declares
 * one in a kernel's file: loss.c's and reduce.c's double exp). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(_OPENMP) && !defined(__cplusplus) && \
    defined(__GLIBC__) && __GLIBC_PREREQ(2, 35)
#define KF_SIMD(t, f) _Pragma("omp declare simd notinbranch") t f(t);
KF_SIMD(float, expf)
#endif
#elif !defined(INFINITY) /* NVRTC has no <math.h>; Clip's absent bounds are spelled INFINITY */
#define INFINITY __int_as_float(0x7f800000)
#endif

/* ---- the elementwise math, once ----------------------------------------
 * Every elementwise op of the kernels is one row here; the cpu kernels
 * (kernels/c/ew_impl.h), the cuda kernels (kernels/cuda/ew.cu), the fused
 * loops (this file) and the op codes of kernels.h and common.cuh are all
 * generated from these rows.  A row's expressions are in element type T,
 * with M(f) the math function f for T (expf or exp) and INFINITY at hand.
 *
 * KF_BINARY(B): B(CODE, a OP b): y from a and b (k_binary).  CODE_DA and
 * CODE_DB rows are the local derivatives of a row (POW_DA, POW_DB: torch's
 * pow_backward_self and pow_backward_exponent), so a backward is
 * reduce(dy * CODE_DA(a, b)) — ops.def's EW2D rows name them.
 *
 * KF_UNARY(U): U(CODE, READS, y = f(x, p0, p1), dx = f'(dy, x, y, p0, p1)):
 * p0, p1 are the op's parameters (ir/ops.def says where each comes from);
 * READS is what the gradient reads besides dy, as PyTorch's
 * derivatives.yaml does: X (the input), Y (the output) or NONE.  The
 * compiler's autodiff hands UnaryGrad only that (kf_unary_reads). */
/* d/dx of GELU's tanh form, t = tanh(u) */
#define KF_GELU_TANH_D(x, t) ((T)0.5 * ((T)1 + (t)) + (T)0.5 * (x) * ((T)1 - (t) * (t)) *         \
                              (T)0.79788456080286535588 * ((T)1 + (T)0.134145 * (x) * (x)))
#define KF_POWT(a, b) ((b) == 2 ? (a) * (a) : (b) == 3 ? (a) * (a) * (a) : M(pow)(a, b)) /* as torch */

#define KF_BINARY(B)                                                                           \
    B(ADD, a + b)                                                                              \
    B(SUB, a - b)                                                                              \
    B(MUL, a * b)                                                                              \
    B(DIV, a / b)                                                                              \
    B(POW, KF_POWT(a, b))                                                                      \
    B(POW_DA, b == 0 ? (T)0 : b * KF_POWT(a, b - 1))                                           \
    B(POW_DB, a == 0 && b >= 0 ? (T)0 : KF_POWT(a, b) * M(log)(a))                           \
    /* NaN propagates, as torch.minimum / maximum; a tie splits the gradient in halves */     \
    B(MIN, a != a ? a : b != b ? b : a < b ? a : b)                                           \
    B(MAX, a != a ? a : b != b ? b : a > b ? a : b)                                           \
    B(MIN_DA, a < b ? (T)1 : a == b ? (T)0.5 : (T)0)                                          \
    B(MIN_DB, b < a ? (T)1 : a == b ? (T)0.5 : (T)0)                                          \
    B(MAX_DA, a > b ? (T)1 : a == b ? (T)0.5 : (T)0)                                          \
    B(MAX_DB, b > a ? (T)1 : a == b ? (T)0.5 : (T)0)                                          \
    /* ONNX Mod: fmod 0 takes the divisor's sign (torch.remainder), fmod 1 the dividend's      \
     * (C fmod, torch.fmod); d/db = -floor(a/b) and -trunc(a/b) */                            \
    B(MOD, M(fmod)(a, b) != 0 && (M(fmod)(a, b) < 0) != (b < 0) ? M(fmod)(a, b) + b : M(fmod)(a, b)) \
    B(FMOD, M(fmod)(a, b))                                                                     \
    B(MOD_DB, -M(floor)(a / b))                                                                \
    B(FMOD_DB, -M(trunc)(a / b))

#define KF_UNARY(U)                                                                            \
    /* NaN passes, as torch.relu */                                                            \
    U(RELU, Y, x < 0 ? (T)0 : x, y <= 0 ? (T)0 : dy)                                           \
    U(TANH, Y, M(tanh)(x), dy * ((T)1 - y * y))                                                \
    /* exp(-x) overflows to inf for x << 0: 1/inf = 0, fine */                                 \
    U(SIGMOID, Y, (T)1 / ((T)1 + M(exp)(-x)), dy * ((T)1 - y) * y)                             \
    U(SQRT, Y, M(sqrt)(x), dy / ((T)2 * y))                                                    \
    U(RECIPROCAL, Y, (T)1 / x, -dy * (y * y))                                                  \
    U(EXP, Y, M(exp)(x), dy * y)                                                               \
    U(LOG, X, M(log)(x), dy / x)                                                               \
    U(NEG, NONE, -x, -dy)                                                                      \
    /* the gradient's sign(0) is 0 */                                                          \
    U(ABS, X, M(fabs)(x), x > 0 ? dy : x < 0 ? -dy : (T)0)                                     \
    U(ERF, X, M(erf)(x), dy * (T)1.1283791670955125739 * M(exp)(-x * x))                      \
    /* p0 = alpha */                                                                           \
    U(LEAKY_RELU, X, x > 0 ? x : x * p0, x > 0 ? dy : dy * p0)                                 \
    /* p0 = alpha; the gradient at 0 is alpha's side, as torch's elu_backward */                \
    U(ELU, X, x > 0 ? x : p0 * M(expm1)(x), x > 0 ? dy : dy * p0 * M(exp)(x))                   \
    /* p0 = alpha, p1 = gamma: gamma elu(x, alpha) */                                          \
    U(SELU, X, x > 0 ? p1 * x : p1 * p0 * M(expm1)(x), x > 0 ? dy * p1 : dy * p1 * p0 * M(exp)(x)) \
    /* p0 = alpha: max(0, x) + min(0, alpha (exp(x / alpha) - 1)) */                          \
    U(CELU, X, x > 0 ? x : p0 * M(expm1)(x / p0), x > 0 ? dy : dy * M(exp)(x / p0))             \
    /* p0 = alpha: x where x > alpha, else 0 */                                                \
    U(THRESHOLDED_RELU, X, x > p0 ? x : (T)0, x > p0 ? dy : (T)0)                              \
    U(SOFTSIGN, X, x / ((T)1 + M(fabs)(x)), dy / (((T)1 + M(fabs)(x)) * ((T)1 + M(fabs)(x))))  \
    /* p0 = min, p1 = max (-INFINITY / INFINITY when absent), as torch.clamp:                  \
     * NaN stays NaN, min > max gives max.  The gradient passes strictly inside the bounds     \
     * (0 at x == min or max, as torch's relu6 / hardtanh and, from torch 2, clamp: an absent  \
     * bound is no bound, so clamp_min's x = +inf passes) */                                   \
    U(CLIP, X, (x < p0 ? p0 : x) > p1 ? p1 : (x < p0 ? p0 : x),                                \
      (x > p0 || p0 == -INFINITY) && (x < p1 || p1 == INFINITY) ? dy : (T)0)                   \
    /* p0 = beta, p1 = threshold (torch: 1, 20); ONNX Softplus is beta 1 without a             \
     * threshold, which 20 agrees with to float32 rounding */                                  \
    U(SOFTPLUS, X, x * p0 > p1 ? x : M(log1p)(M(exp)(x * p0)) / p0,                            \
      x * p0 > p1 ? dy : dy * M(exp)(x * p0) / (M(exp)(x * p0) + (T)1))                        \
    U(COS, X, M(cos)(x), dy * -M(sin)(x))                                                      \
    U(SIN, X, M(sin)(x), dy * M(cos)(x))                                                       \
    U(TAN, Y, M(tan)(x), dy * ((T)1 + y * y))                                                  \
    U(ASIN, X, M(asin)(x), dy / M(sqrt)((T)1 - x * x))                                         \
    U(ACOS, X, M(acos)(x), -dy / M(sqrt)((T)1 - x * x))                                        \
    U(ATAN, X, M(atan)(x), dy / ((T)1 + x * x))                                                \
    U(SINH, X, M(sinh)(x), dy * M(cosh)(x))                                                    \
    U(COSH, X, M(cosh)(x), dy * M(sinh)(x))                                                    \
    U(ASINH, X, M(asinh)(x), dy / M(sqrt)(x * x + (T)1))                                       \
    U(ACOSH, X, M(acosh)(x), dy / M(sqrt)(x * x - (T)1))                                       \
    U(ATANH, X, M(atanh)(x), dy / ((T)1 - x * x))                                              \
    /* piecewise constant: a zero gradient, as torch */                                        \
    U(FLOOR, NONE, M(floor)(x), (T)0)                                                          \
    U(CEIL, NONE, M(ceil)(x), (T)0)                                                            \
    /* halves to even (ONNX, torch.round) */                                                   \
    U(ROUND, NONE, M(rint)(x), (T)0)                                                           \
    /* NaN stays NaN */                                                                        \
    U(SIGN, NONE, x > 0 ? (T)1 : x < 0 ? (T)-1 : x, (T)0)                                      \
    /* p0 = alpha, p1 = beta: min(max(alpha x + beta, 0), 1); the gradient as torch's          \
     * hardsigmoid_backward (0 where clamped, the ends included) */                            \
    U(HARD_SIGMOID, X, p0 * x + p1 < 0 ? (T)0 : p0 * x + p1 > 1 ? (T)1 : p0 * x + p1,          \
      p0 * x + p1 > 0 && p0 * x + p1 < 1 ? dy * p0 : (T)0)                                     \
    /* x min(max(x + 3, 0), 6) / 6 and its gradient, as torch.nn.functional.hardswish */       \
    U(HARD_SWISH, X, x * (x + 3 < 0 ? (T)0 : x + 3 > 6 ? (T)6 : x + 3) / 6,                    \
      x < -3 ? (T)0 : x <= 3 ? dy * (x / 3 + (T)0.5) : dy)                                     \
    /* p0 = 0: x Phi(x), Phi the normal CDF; p0 = 1: the tanh approximation                    \
     * (u = sqrt(2/pi) (x + 0.044715 x^3)); both as torch.nn.functional.gelu */                \
    U(GELU, X, p0 == 0 ? x * (T)0.5 * ((T)1 + M(erf)(x * (T)0.70710678118654752440))          \
                       : x * (T)0.5 * ((T)1 + M(tanh)((T)0.79788456080286535588 *              \
                                                        (x + (T)0.044715 * x * x * x))),      \
      p0 == 0 ? dy * ((T)0.5 * ((T)1 + M(erf)(x * (T)0.70710678118654752440)) +                \
                      x * (T)0.39894228040143267794 * M(exp)((T)-0.5 * x * x))                 \
              : dy * KF_GELU_TANH_D(x, M(tanh)((T)0.79788456080286535588 *                     \
                                              (x + (T)0.044715 * x * x * x))))

/* the op codes (kernels.h's K_ADD, K_RELU, ... are these) */
#define KF_CODE_(code, ...) KF_##code,
enum { KF_BINARY(KF_CODE_) KF_BINARY_COUNT };
enum { KF_UNARY(KF_CODE_) KF_UNARY_COUNT };
#undef KF_CODE_

/* what a unary op's gradient reads besides dy (a KF_READS_ mask) */
enum { KF_READS_NONE = 0, KF_READS_X = 1, KF_READS_Y = 2 };
#define KF_READS_(code, reads, ...) case KF_##code: return KF_READS_##reads;
static inline int kf_unary_reads(int op)
{
    switch (op) {
    KF_UNARY(KF_READS_)
    default: return KF_READS_X | KF_READS_Y;
    }
}
#undef KF_READS_

/* kf_binary_S(op, a, b), kf_unary_S(op, x, p0, p1) and
 * kf_unary_grad_S(op, dy, x, y, p0, p1): one element of each op (the
 * gradient's x or y is ignored where kf_unary_reads says it is not read). */
#define KF_B_(code, e) case KF_##code: return e;
#define KF_U_(code, reads, f, df) case KF_##code: return f;
#define KF_DU_(code, reads, f, df) case KF_##code: return df;
/* T and M, which the rows use, are defined around each KF_DEFINE (a macro
 * argument would not reach the rows: they are expanded after it is bound) */
#if defined(T) || defined(M)
#error "fused.h: include it before defining T or M"
#endif
/* Always inlined: a caller passes op as a constant, so each call folds to its one expression, but GCC weighs the
 * whole switch (dozens of rows) when it decides, and in a large step it keeps an out-of-line clone instead; a call
 * it cannot see into stops the loop from vectorising (the demo GPT's step at batch 8: 2 of its 6 float32 fused
 * loops vectorised without this, 9 of its 13 bfloat16 ones; all with it).  A vectorised loop computes the same bits as scalar (vmath.h), so which elements take a loop's
 * vector body and which its tail (how a loop is fused, how threads split it) changes no bit: --recompute, which
 * computes some values again in loops fused otherwise, stays bit-identical. */
#ifdef __GNUC__
#define KF_INLINE static inline __attribute__((always_inline))
#else
#define KF_INLINE static inline
#endif
#define KF_DEFINE(S)                                                                        \
    KF_INLINE T kf_binary_##S(int op, T a, T b)                                                \
    {                                                                                          \
        switch (op) {                                                                          \
        KF_BINARY(KF_B_)                                                                       \
        default: return (T)0; /* no such op: callers check */                        \
        }                                                                                      \
    }                                                                                          \
    KF_INLINE T kf_unary_##S(int op, T x, T p0, T p1)                                          \
    {                                                                                          \
        (void)p0, (void)p1;                                                                    \
        switch (op) {                                                                          \
        KF_UNARY(KF_U_)                                                                        \
        default: return (T)0;                                                                 \
        }                                                                                      \
    }                                                                                          \
    KF_INLINE T kf_unary_grad_##S(int op, T dy, T x, T y, T p0, T p1)                        \
    {                                                                                          \
        (void)x, (void)y, (void)p0, (void)p1;                                                                    \
        switch (op) {                                                                          \
        KF_UNARY(KF_DU_)                                                                       \
        default: return (T)0;                                                               \
        }                                                                                      \
    }

/* float: M(f) is vmath.h's kf_##f##f where it has one (a KF_OWN_ row), else libm's f##f; NVRTC: CUDA's f##f.
 * KF_OWN_f expands to ", kf_ff", which moves it into KF_2ND_'s second argument. */
#define T float
#ifdef __CUDACC_RTC__
#define M(fn) fn##f
#else
#define KF_OWN_exp , kf_expf
#define KF_OWN_erf , kf_erff
#define KF_OWN_tanh , kf_tanhf
#define KF_OWN_log , kf_logf
#define KF_2ND_(a, b, ...) b
#define KF_2ND(...) KF_2ND_(__VA_ARGS__)
#define M(fn) KF_2ND(KF_OWN_##fn, fn##f, )
#endif
KF_DEFINE(f32)
#undef T
#undef M
#define T double
#define M(fn) fn
KF_DEFINE(f64)
#undef T
#undef M
#undef KF_DEFINE
#undef KF_INLINE

/* kf_binary_i64(op, a, b): the F_I64 rows of ops.def on int64 (index
 * arithmetic), as fsdpc folds constants: ADD, SUB, MUL wrap (as torch's
 * int64), DIV truncates (as ONNX's reference), MIN, MAX, MOD takes the
 * divisor's sign, FMOD the dividend's; INT64_MIN / -1 wraps.  A zero
 * divisor gives 0: k_binary_i64 reports it. */
static inline int64_t kf_binary_i64(int op, int64_t a, int64_t b)
{
    const uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
    int64_t m;
    switch (op) {
    case KF_ADD: return (int64_t)(ua + ub);
    case KF_SUB: return (int64_t)(ua - ub);
    case KF_MUL: return (int64_t)(ua * ub);
    case KF_MIN: return a < b ? a : b;
    case KF_MAX: return a > b ? a : b;
    default: break;
    }
    if (b == 0)
        return 0;
    if (b == -1)
        return op == KF_DIV ? (int64_t)(0 - ua) : 0;
    if (op == KF_DIV)
        return a / b;
    m = a % b;
    return op == KF_MOD && m != 0 && (m < 0) != (b < 0) ? m + b : m;
}
#undef KF_B_
#undef KF_U_
#undef KF_DU_

#ifdef __cplusplus
/* C++ (the cuda kernels, templates over the element type): the same
 * functions overloaded on it */
extern "C++" {
static inline float kf_binary(int op, float a, float b) { return kf_binary_f32(op, a, b); }
static inline double kf_binary(int op, double a, double b) { return kf_binary_f64(op, a, b); }
static inline float kf_unary(int op, float x, float p0, float p1) { return kf_unary_f32(op, x, p0, p1); }
static inline double kf_unary(int op, double x, double p0, double p1) { return kf_unary_f64(op, x, p0, p1); }
static inline float kf_unary_grad(int op, float dy, float x, float y, float p0, float p1)
{
    return kf_unary_grad_f32(op, dy, x, y, p0, p1);
}
static inline double kf_unary_grad(int op, double dy, double x, double y, double p0, double p1)
{
    return kf_unary_grad_f64(op, dy, x, y, p0, p1);
}
}
#endif

#endif
